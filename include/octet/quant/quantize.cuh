// octet/quant/quantize.cuh: quantize and dequantize on a CUDA stream.
//
//   octet::quantize<Recipe>(octet::on_stream(s), x, rowwise, columnwise, options);
//   octet::dequantize(octet::on_stream(s), q, y);
//
// The entries are quantize.hpp's (one per operation for every executor, which check the arguments
// that do not depend on it); this header adds the stream's half, detail::quant_backend<stream_executor>.
// Same contract and the same bits as on the host: every kernel calls the
// OCTET_HD rules of scale.hpp. All pointers are device memory; options.device_stats (if set)
// points at two quant_stats in device memory (row-wise, column-wise) that quantize zeroes and
// fills; options.device_tensor_amax (if set) is the amax the per-tensor / two-level scale comes
// from (delayed scaling), read on the device; options.device_record (if set) receives the
// input's amax with an atomic max (delayed scaling's record step, see delayed.cuh).
//
// How the work is laid out. A CTA of 256 threads loads one 128 x 128 tile of x into shared memory
// (16-byte loads when rows are aligned) and produces, from that single read, the row-wise tile and
// the column-wise (transposed) tile. A warp takes one row of a copy at a time, four consecutive
// elements per lane; the amax of each block is reduced with warp shuffles and, for blocks taller
// than one row, through shared memory; codes are packed (four FP8 codes = one 32-bit store per
// lane, coalesced per warp). Granularities whose blocks tile 128 x 128 (1x16, 1x32, 1x128,
// 16x16, 128x128, ...) take this one-pass path. Blocks larger than a tile (per row, per column,
// per tensor) or of other shapes first reduce a grid of block amaxes (shared-memory atomics, then
// one global atomic max per block per CTA), compute the scales in a small kernel, then encode.
// Two-level recipes (NVFP4) need the tensor amax first: an amax pass, unless it is given.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/warp.cuh"
#include "octet/format/convert.cuh"
#include "octet/interpret/cuda_names.hpp"
#include "octet/quant/quantize.hpp"

namespace octet {

struct device_quantize_options {
    /// Device memory for two quant_stats (row-wise, column-wise), or null. Zeroed, then filled.
    quant_stats* device_stats = nullptr;
    /// Device memory: the amax (>= 0) the per-tensor / two-level scale is derived from (e.g. a
    /// delayed scaling state's scale amax, see delayed.cuh), or null to measure it in an extra pass.
    /// As on the host, it must not be 0 while x holds non-zero values; the host overload refuses
    /// that, but this value lives on the device and is not checked (it would take a sync): the
    /// scale is then 1 and what it clamps is counted in device_stats' saturated.
    const float* device_tensor_amax = nullptr;
    /// Device memory: receives the input's finite amax with an atomic max on its bits (must hold a
    /// non-negative float), and *device_record_flag = 1; null to skip.
    float* device_record = nullptr;
    int* device_record_flag = nullptr;
    philox_stream rng{};
};

namespace detail {

constexpr int kQuantTile = 128;
constexpr int kQuantThreads = 256;
constexpr int kQuantWarps = kQuantThreads / 32;

/// Shared-memory row pitch of a tile, in elements: an odd number of 4-byte words.
template <class In>
inline constexpr int smem_pitch = kQuantTile + static_cast<int>(4 / sizeof(In));

/// The tile element of copy element (cr, cc): tile[cr][cc] for the row-wise copy (Copy == 0),
/// tile[cc][cr] for the column-wise copy.
template <int Copy, class In>
OCTET_HD constexpr int tile_index(int cr, int cc) {
    return Copy == 0 ? cr * smem_pitch<In> + cc : cc * smem_pitch<In> + cr;
}

/// A lane encodes the four elements 4 lane + j (j = 0..3) of a copy row; at step k it reads
/// j = tile_read_order(lane, k). Read in order (j = k), lanes L, L + 8, L + 16 and L + 24 hit one
/// bank in both copies (4-byte inputs: (4 L + k) pitch = 4 L + k mod 32 words). Rotated by L / 8,
/// the 32 lanes of a step read 32 different banks, for both copies and for 4- and 2-byte inputs
/// (checked over every row by tests/cuda/quant_device.cu).
OCTET_HD constexpr int tile_read_order(int lane, int k) {
    return (k + (lane >> 3)) & 3;
}

OCTET_DEVICE void atomic_max_nonneg(float* addr, float v) {
    atomicMax(reinterpret_cast<unsigned int*>(addr), __float_as_uint(v));
}
/// The same on shared memory: under the interpreter a shared pointer is a checked type of its own
/// (octet::shared_ptr_t); under nvcc it is float* and the overload above serves it.
template <class SharedFloatPtr, std::enable_if_t<!std::is_pointer_v<SharedFloatPtr>, int> = 0>
OCTET_DEVICE void atomic_max_nonneg(SharedFloatPtr addr, float v) {
    atomicMax(shared_cast<unsigned int>(addr), __float_as_uint(v));
}

/// Warp max of block_abs values that keeps a NaN (nan_policy::propagate).
OCTET_DEVICE float warp_amax_max(float v, unsigned width) {
    for (unsigned off = width / 2; off > 0; off /= 2) v = amax_max(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
    return v;
}

template <class Recipe>
struct quant_copy_args {
    std::uint8_t* data = nullptr;  ///< null: this copy is not produced
    bool aligned_rows = false;     ///< every row start allows the packed 16/32-bit code stores
    std::uint8_t* scales = nullptr;
    float* tensor_scale_out = nullptr;
    quant_layout layout{};
    const float* scale_values = nullptr;  ///< global mode: effective scale per block (row-major grid)
    philox_stream rng{};
    quant_stats* stats = nullptr;
};

template <class Recipe, class In>
struct quant_kernel_args {
    const In* x;
    std::size_t rows, cols, ld;
    bool vector_loads;
    quant_copy_args<Recipe> copy[2];  ///< [0] row-wise (of x), [1] column-wise (of x^T)
    const float* tensor_amax;         ///< two-level: device tensor amax (never null for two-level)
    float* record;
    int* record_flag;
};

/// Loads the 128 x 128 tile at (r0, c0) into shared memory (zeros outside x) and returns this
/// thread's largest finite |x|.
template <class In>
OCTET_DEVICE float load_tile(const In* __restrict__ x, std::size_t rows, std::size_t cols, std::size_t ld,
                             bool vector_loads, std::size_t r0, std::size_t c0, shared_ptr_t<In> tile) {
    constexpr int pitch = smem_pitch<In>;
    constexpr int V = 16 / static_cast<int>(sizeof(In));  // elements per 16-byte vector
    constexpr int vectors_per_row = kQuantTile / V;
    float amax = 0.0f;
    for (int idx = threadIdx.x; idx < kQuantTile * vectors_per_row; idx += kQuantThreads) {
        const int r = idx / vectors_per_row, cv = (idx % vectors_per_row) * V;
        const std::size_t gr = r0 + r, gc = c0 + cv;
        alignas(16) In v[V];
        if (gr < rows && gc + V <= cols && vector_loads) {
            // memcpy into v (not a store through uint4*): no type punning for a host compiler (interpret
            // mode); nvcc makes the same register moves of it.
            const uint4 w = *reinterpret_cast<const uint4*>(x + gr * ld + gc);
            std::memcpy(v, &w, sizeof w);
        } else {
            OCTET_UNROLL
            for (int k = 0; k < V; ++k) v[k] = (gr < rows && gc + k < cols) ? x[gr * ld + gc + k] : In{};
        }
        OCTET_UNROLL
        for (int k = 0; k < V; ++k) {
            tile[r * pitch + cv + k] = v[k];
            amax = fmaxf(amax, finite_abs(as_float(v[k])));
        }
    }
    return amax;
}

/// Writes four codes of lane-consecutive elements starting at copy column gc (a multiple of 4,
/// below the row's ld), with one 16- or 32-bit store when rows are aligned for it, else byte by
/// byte and only the codes below ld: in an unpadded layout ld need not be a multiple of 4, and a
/// code past it would land in the next row's first byte (or past the end of the data).
template <class Fmt>
OCTET_DEVICE void store_codes4(std::uint8_t* row, std::size_t gc, std::size_t ld, const std::uint8_t (&c)[4],
                               bool aligned) {
    if (!aligned) {
        OCTET_UNROLL
        for (int k = 0; k < 4; ++k)
            if (gc + k < ld) store_code<Fmt>(row, gc + k, c[k]);
        return;
    }
    if constexpr (Fmt::bits <= 4) {
        const std::uint16_t w = static_cast<std::uint16_t>((c[0] & 0xFu) | ((c[1] & 0xFu) << 4) | ((c[2] & 0xFu) << 8) |
                                                           ((c[3] & 0xFu) << 12));
        *reinterpret_cast<std::uint16_t*>(row + gc / 2) = w;
    } else if constexpr (Fmt::bits <= 6) {
        pack_fp6x4(c, row + (gc / 4) * 3);
    } else {
        *reinterpret_cast<std::uint32_t*>(row + gc) = load_le32(c);
    }
}

/// Per-thread statistics, reduced over the warp and added to global memory once per warp.
struct stats_accumulator {
    unsigned long long elements = 0, saturated = 0, flushed = 0, non_finite = 0, lost_to_nan = 0;
    double signal = 0.0, noise = 0.0;
    float amax = 0.0f;

    template <class Fmt>
    OCTET_DEVICE void add(float v, float S, std::uint8_t code) {
        ++elements;
        const std::uint32_t a = __float_as_uint(v) & 0x7FFFFFFFu;
        if (a >= 0x7F800000u) {
            ++non_finite;
            return;
        }
        amax = fmaxf(amax, fabsf(v));
        if (S != S) {  // a NaN block (nan_policy::propagate)
            ++lost_to_nan;
            return;
        }
        const float back = decode<Fmt>(code) * S;
        saturated += (S != 0.0f && beyond_max_finite<Fmt>(v / S)) ? 1u : 0u;
        flushed += (a != 0u && back == 0.0f) ? 1u : 0u;
        signal += static_cast<double>(v) * v;
        const double err = static_cast<double>(v) - back;
        noise += err * err;
    }
    OCTET_DEVICE void flush(quant_stats* out) {
        for (int off = 16; off > 0; off /= 2) {
            elements += __shfl_xor_sync(0xFFFFFFFFu, elements, off);
            saturated += __shfl_xor_sync(0xFFFFFFFFu, saturated, off);
            flushed += __shfl_xor_sync(0xFFFFFFFFu, flushed, off);
            non_finite += __shfl_xor_sync(0xFFFFFFFFu, non_finite, off);
            lost_to_nan += __shfl_xor_sync(0xFFFFFFFFu, lost_to_nan, off);
            signal += __shfl_xor_sync(0xFFFFFFFFu, signal, off);
            noise += __shfl_xor_sync(0xFFFFFFFFu, noise, off);
            amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
        }
        if ((threadIdx.x & 31) == 0 && elements) {
            atomic_max_nonneg(&out->amax, amax);
            atomicAdd(&out->elements, elements);
            atomicAdd(&out->saturated, saturated);
            atomicAdd(&out->flushed_to_zero, flushed);
            atomicAdd(&out->non_finite, non_finite);
            atomicAdd(&out->lost_to_nan, lost_to_nan);
            atomicAdd(&out->signal_energy, signal);
            atomicAdd(&out->noise_energy, noise);
        }
    }
};

/// Produces one copy's tile. Copy coordinates: copy row cr, copy column cc; for the row-wise copy
/// (Copy == 0) element (cr, cc) is tile[cr][cc], for the column-wise copy tile[cc][cr].
/// Local mode (scale_values == null): blocks are R x C with R, C dividing 128 and C % 4 == 0.
template <class Recipe, class In, int Copy>
OCTET_DEVICE void quantize_tile_copy(const quant_copy_args<Recipe>& a, shared_ptr_t<const In> tile, std::size_t copy_r0,
                                     std::size_t copy_c0, std::size_t copy_rows, std::size_t copy_cols,
                                     float tensor_scale, shared_ptr_t<float> seg_amax, shared_ptr_t<float> block_S) {
    using Fmt = typename Recipe::format;
    const quant_layout& L = a.layout;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const bool local = a.scale_values == nullptr;
    const int R = static_cast<int>(L.block_rows), C = static_cast<int>(L.block_cols);
    const int segs = local ? kQuantTile / C : 0;  // blocks per tile row
    // v[j] = copy element (cr, 4 lane + j), read in tile_read_order and put back in place with
    // selects (a register index known at compile time: no local memory)
    auto load4 = [&](int cr, float(&v)[4]) {
        const int g = (lane >> 3) & 3;
        float r[4];
        OCTET_UNROLL
        for (int k = 0; k < 4; ++k)
            r[k] = as_float<In>(tile[tile_index<Copy, In>(cr, 4 * lane + tile_read_order(lane, k))]);
        OCTET_UNROLL
        for (int j = 0; j < 4; ++j)  // element j was read at step (j - g) & 3
            v[j] = g == 0 ? r[j] : g == 1 ? r[(j + 3) & 3] : g == 2 ? r[(j + 2) & 3] : r[(j + 1) & 3];
    };

    if (local) {
        // Phase A: amax of each row segment of C elements (C / 4 lanes).
        for (int cr = warp; cr < kQuantTile; cr += kQuantWarps) {
            float m = 0.0f, v[4];
            load4(cr, v);
            OCTET_UNROLL
            for (int k = 0; k < 4; ++k) m = amax_max(m, block_abs<Recipe>(v[k]));
            m = Recipe::propagates_nan ? warp_amax_max(m, static_cast<unsigned>(C / 4))
                                       : cuda::warp_max(m, static_cast<unsigned>(C / 4));
            if ((lane % (C / 4)) == 0) seg_amax[cr * 32 + lane / (C / 4)] = m;
        }
        __syncthreads();
        // Phase B: block amax over R rows, scale, stored scale.
        const int blocks = (kQuantTile / R) * segs;
        for (int b = threadIdx.x; b < blocks; b += kQuantThreads) {
            const int bi = b / segs, bj = b % segs;
            float m = 0.0f;
            for (int q = 0; q < R; ++q) m = amax_max(m, seg_amax[(bi * R + q) * 32 + bj]);
            const block_scale s = make_block_scale<Recipe>(m, tensor_scale);
            block_S[bi * 32 + bj] = s.value;
            const std::size_t gbi = copy_r0 / R + bi, gbj = copy_c0 / C + bj;
            if (gbi < L.scale_rows && gbj < L.scale_cols) {
                const std::size_t k = gbj * L.scale_ld + gbi;
                if constexpr (Recipe::scale_bytes == 4)
                    reinterpret_cast<std::uint32_t*>(a.scales)[k] = s.stored;
                else
                    a.scales[k] = static_cast<std::uint8_t>(s.stored);
            }
        }
        __syncthreads();
    }

    // Phase C: codes.
    stats_accumulator acc;
    for (int cr = warp; cr < kQuantTile; cr += kQuantWarps) {
        const std::size_t gr = copy_r0 + cr;
        const std::size_t gc = copy_c0 + 4 * lane;
        if (gr >= copy_rows || gc >= L.ld) continue;
        std::uint8_t codes[4];
        float vals[4];
        load4(cr, vals);
        OCTET_UNROLL
        for (int k = 0; k < 4; ++k) {
            const float v = vals[k];
            const std::size_t c = gc + k;
            float S;
            if (local)
                S = block_S[(cr / R) * 32 + (4 * lane + k) / C];
            else
                S = c < copy_cols ? a.scale_values[(gr / L.block_rows) * L.scale_cols + c / L.block_cols] : 1.0f;
            std::uint32_t bits = 0;
            if constexpr (std::is_same_v<typename Recipe::rounding, round::stochastic>)
                bits = a.rng.bits(stochastic_index(gr, c));
            codes[k] = c < copy_cols ? encode_scaled<Recipe>(v, S, bits) : std::uint8_t{0};
            if (a.stats && c < copy_cols) acc.add<Fmt>(v, S, codes[k]);
        }
        store_codes4<Fmt>(a.data + gr * L.row_bytes, gc, L.ld, codes, a.aligned_rows);
    }
    if (a.stats) acc.flush(a.stats);
    __syncthreads();
}

template <class Recipe, class In>
OCTET_KERNEL void __launch_bounds__(kQuantThreads) quantize_tile_kernel(quant_kernel_args<Recipe, In> p) {
    OCTET_DYNAMIC_SHARED_ALIGNED(unsigned char, smem_raw, 16);
    const shared_ptr_t<In> tile = shared_cast<In>(smem_raw);
    const shared_ptr_t<float> seg_amax =
        shared_cast<float>(smem_raw + kQuantTile * smem_pitch<In> * sizeof(In));  // [128][32]
    const shared_ptr_t<float> block_S = seg_amax + kQuantTile * 32;               // [128][32]
    OCTET_SHARED(float, cta_amax);

    const std::size_t r0 = static_cast<std::size_t>(blockIdx.y) * kQuantTile,
                      c0 = static_cast<std::size_t>(blockIdx.x) * kQuantTile;
    if (threadIdx.x == 0) cta_amax = 0.0f;
    __syncthreads();
    const float my_amax = load_tile(p.x, p.rows, p.cols, p.ld, p.vector_loads, r0, c0, tile);
    if (p.record) {
        const float m = cuda::warp_max(my_amax, 32);
        if ((threadIdx.x & 31) == 0) atomic_max_nonneg(&cta_amax, m);
    }
    __syncthreads();
    if (p.record && threadIdx.x == 0) {
        atomic_max_nonneg(p.record, cta_amax);
        if (p.record_flag) *p.record_flag = 1;
    }

    float tensor_scale = 1.0f;
    if constexpr (Recipe::two_level) tensor_scale = make_tensor_scale<Recipe>(*p.tensor_amax);
    if (p.copy[0].data) {
        if (Recipe::two_level && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
            *p.copy[0].tensor_scale_out = tensor_scale;
        quantize_tile_copy<Recipe, In, 0>(p.copy[0], tile, r0, c0, p.rows, p.cols, tensor_scale, seg_amax, block_S);
    }
    if (p.copy[1].data) {
        if (Recipe::two_level && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
            *p.copy[1].tensor_scale_out = tensor_scale;
        quantize_tile_copy<Recipe, In, 1>(p.copy[1], tile, c0, r0, p.cols, p.rows, tensor_scale, seg_amax, block_S);
    }
}

/// Global mode, pass 1: block amaxes of both copies into grids (row-major, zeroed beforehand), and
/// the tensor amax. Shared-memory atomics per tile, then one global atomic per touched block.
/// PropagateNan: a NaN or an Inf enters its block's amax as 0x7FFFFFFF, above every other value's bits.
template <class In, bool PropagateNan>
OCTET_KERNEL void __launch_bounds__(kQuantThreads)
    block_amax_kernel(const In* __restrict__ x, std::size_t rows, std::size_t cols, std::size_t ld, bool vector_loads,
                      float* grid0, std::size_t R0, std::size_t C0, std::size_t sc0, float* grid1, std::size_t R1,
                      std::size_t C1, std::size_t sc1, float* tensor_amax) {
    OCTET_DYNAMIC_SHARED_ALIGNED(unsigned char, smem_raw, 16);
    const shared_ptr_t<In> tile = shared_cast<In>(smem_raw);
    constexpr int kLocal = 4096;
    OCTET_SHARED(float[kLocal], local);
    constexpr int pitch = smem_pitch<In>;
    const std::size_t r0 = static_cast<std::size_t>(blockIdx.y) * kQuantTile,
                      c0 = static_cast<std::size_t>(blockIdx.x) * kQuantTile;
    const float my_amax = load_tile(x, rows, cols, ld, vector_loads, r0, c0, tile);
    if (tensor_amax) {
        const float m = cuda::warp_max(my_amax, 32);
        if ((threadIdx.x & 31) == 0) atomic_max_nonneg(tensor_amax, m);
    }
    const std::size_t r_end = rows < r0 + kQuantTile ? rows : r0 + kQuantTile;
    const std::size_t c_end = cols < c0 + kQuantTile ? cols : c0 + kQuantTile;
    for (int copy = 0; copy < 2; ++copy) {
        float* grid = copy == 0 ? grid0 : grid1;
        if (!grid) continue;
        // copy coordinates: row-wise copy (i, j) = x(i, j); column-wise copy (j, i) = x(i, j)
        const std::size_t R = copy == 0 ? R0 : R1, C = copy == 0 ? C0 : C1, sc = copy == 0 ? sc0 : sc1;
        const std::size_t cr0 = copy == 0 ? r0 : c0, cc0 = copy == 0 ? c0 : r0;
        const std::size_t cr1 = copy == 0 ? r_end : c_end, cc1 = copy == 0 ? c_end : r_end;
        const std::size_t b_r0 = cr0 / R, b_c0 = cc0 / C;
        const std::size_t nbr = (cr1 - 1) / R - b_r0 + 1, nbc = (cc1 - 1) / C - b_c0 + 1;
        const bool in_smem = nbr * nbc <= static_cast<std::size_t>(kLocal);
        __syncthreads();
        if (in_smem)
            for (std::size_t k = threadIdx.x; k < nbr * nbc; k += kQuantThreads) local[k] = 0.0f;
        __syncthreads();
        for (int idx = threadIdx.x; idx < kQuantTile * kQuantTile; idx += kQuantThreads) {
            const int tr = idx / kQuantTile, tc = idx % kQuantTile;
            const std::size_t gi = r0 + tr, gj = c0 + tc;
            if (gi >= rows || gj >= cols) continue;
            const float x = as_float<In>(tile[tr * pitch + tc]);
            const float v = PropagateNan ? propagating_abs(x) : finite_abs(x);
            if (v == 0.0f) continue;
            const std::size_t ci = copy == 0 ? gi : gj, cj = copy == 0 ? gj : gi;
            const std::size_t bi = ci / R, bj = cj / C;
            if (in_smem)
                atomic_max_nonneg(&local[(bi - b_r0) * nbc + (bj - b_c0)], v);
            else
                atomic_max_nonneg(&grid[bi * sc + bj], v);
        }
        __syncthreads();
        if (in_smem)
            for (std::size_t k = threadIdx.x; k < nbr * nbc; k += kQuantThreads)
                if (local[k] != 0.0f) atomic_max_nonneg(&grid[(b_r0 + k / nbc) * sc + b_c0 + k % nbc], local[k]);
    }
}

/// Global mode, pass 2: scales from the amax grid (or the tensor amax override for per-tensor).
template <class Recipe>
OCTET_KERNEL void block_scales_from_amax_kernel(const float* amax_grid, const float* tensor_amax,
                                                bool per_tensor_override, quant_layout L, std::uint8_t* scales,
                                                float* scale_values, float* tensor_scale_out) {
    const std::size_t n = L.scale_rows * L.scale_cols;
    float tensor_scale = 1.0f;
    if constexpr (Recipe::two_level) tensor_scale = make_tensor_scale<Recipe>(*tensor_amax);
    for (std::size_t k = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
         k += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t bi = k / L.scale_cols, bj = k % L.scale_cols;
        float amax = per_tensor_override ? *tensor_amax : amax_grid[k];
        if (Recipe::propagates_nan && amax_grid && amax_grid[k] != amax_grid[k])
            amax = amax_grid[k];  // keeps its NaN scale
        const block_scale s = make_block_scale<Recipe>(amax, tensor_scale);
        scale_values[k] = s.value;
        const std::size_t idx = bj * L.scale_ld + bi;
        if constexpr (Recipe::scale_bytes == 4)
            reinterpret_cast<std::uint32_t*>(scales)[idx] = s.stored;
        else
            scales[idx] = static_cast<std::uint8_t>(s.stored);
        if (Recipe::two_level && k == 0) *tensor_scale_out = tensor_scale;
    }
}

/// Local mode applies when every block tiles the 128 x 128 tile and spans whole 4-element lanes
/// (per-tensor recipes always take the global path, so that a given tensor amax applies).
template <class Recipe>
bool local_blocks(const quant_layout& L) {
    if (Recipe::is_per_tensor) return false;
    auto divides = [](std::size_t b) {
        return b >= 1 && b <= static_cast<std::size_t>(kQuantTile) && kQuantTile % b == 0;
    };
    return divides(L.block_rows) && divides(L.block_cols) && L.block_cols % 4 == 0 && L.block_cols / 4 <= 32;
}

/// Floats of scratch one quantize_device call takes (one request; 0: none): the tensor amax and,
/// for outputs whose blocks do not tile 128 x 128 (global mode), an amax grid and a scale-value grid.
template <class Recipe>
std::size_t quantize_scratch_floats(const quantized_ref<Recipe>& row_out, const quantized_ref<Recipe>& col_out,
                                    const device_quantize_options& opt, std::size_t grid_elems[2]) {
    const quantized_ref<Recipe>* outs[2] = {&row_out, &col_out};
    for (int c = 0; c < 2; ++c)
        grid_elems[c] = !outs[c]->empty() && !local_blocks<Recipe>(outs[c]->layout)
                            ? outs[c]->layout.scale_rows * outs[c]->layout.scale_cols
                            : 0;
    const bool need_tensor_amax = Recipe::two_level || Recipe::is_per_tensor;
    const bool measure_tensor = need_tensor_amax && opt.device_tensor_amax == nullptr;
    return (measure_tensor || grid_elems[0] || grid_elems[1]) ? 1 + 2 * (grid_elems[0] + grid_elems[1]) : 0;
}

template <class Recipe, class Byte>
void require_device_copy(const quantized_ref<Recipe, Byte>& q, const char* fn, const char* arg) {
    OCTET_REQUIRE(Recipe::scale_bytes != 4 || is_aligned(q.scales, 4), fn, arg,
                  "has float scales that are not 4-byte aligned");
    cuda::require_device_accessible(q.data, fn, arg);
    cuda::require_device_accessible(q.scales, fn, arg);
    if constexpr (Recipe::two_level) cuda::require_device_accessible(q.tensor_scale, fn, arg);
}

template <class Recipe, class In>
void quantize_device(const stream_executor& ex, matrix_ref<const In> x, const quantized_ref<Recipe>& row_out,
                     const quantized_ref<Recipe>& col_out, const device_quantize_options& opt,
                     const philox_stream& rng_row, const philox_stream& rng_col, quant_stats* stats_row,
                     quant_stats* stats_col) {
    // x is row-major here (the caller has swapped the roles for a column-major input).
    const cudaStream_t stream = ex.stream;
    const std::size_t rows = x.rows, cols = x.cols;
    const dim3 grid(static_cast<unsigned>((cols + kQuantTile - 1) / kQuantTile),
                    static_cast<unsigned>((rows + kQuantTile - 1) / kQuantTile));
    OCTET_REQUIRE(grid.y <= 65535u, "octet::quantize", "x", "has more than 8 million rows; split it");
    const bool vector_loads = is_aligned(x.data, 16) && (x.ld * sizeof(In)) % 16 == 0;
    const quantized_ref<Recipe>* outs[2] = {&row_out, &col_out};

    // Scratch (tensor amax, amax and scale-value grids) only where a pass needs it: the common
    // one-pass recipes (1x128, MX, 128x128) request nothing per call.
    const bool need_tensor_amax = Recipe::two_level || Recipe::is_per_tensor;
    const bool measure_tensor = need_tensor_amax && opt.device_tensor_amax == nullptr;
    std::size_t grid_elems[2] = {0, 0};
    const std::size_t scratch_floats = quantize_scratch_floats<Recipe>(row_out, col_out, opt, grid_elems);
    const stream_scratch scratch_buf(ex, scratch_floats * sizeof(float));
    float* scratch = scratch_buf.as<float>();
    if (scratch) OCTET_CUDA_CHECK(cudaMemsetAsync(scratch, 0, scratch_floats * sizeof(float), stream));
    float* measured_tensor_amax = scratch;
    // Per-tensor recipes take their one scale from the tensor amax; their amax grid only tells
    // whether the tensor holds a NaN (nan_policy::propagate).
    constexpr bool use_grid = !Recipe::is_per_tensor || Recipe::propagates_nan;
    float* amax_grid[2] = {grid_elems[0] && use_grid ? scratch + 1 : nullptr,
                           grid_elems[1] && use_grid ? scratch + 1 + grid_elems[0] : nullptr};
    float* value_grid[2] = {grid_elems[0] ? scratch + 1 + grid_elems[0] + grid_elems[1] : nullptr,
                            grid_elems[1] ? scratch + 1 + 2 * grid_elems[0] + grid_elems[1] : nullptr};

    const std::size_t tile_bytes = static_cast<std::size_t>(kQuantTile) * smem_pitch<In> * sizeof(In);
    // The tensor amax (two-level or per-tensor without an override) or the block amax grids.
    if (measure_tensor || amax_grid[0] || amax_grid[1]) {
        auto kernel = block_amax_kernel<In, Recipe::propagates_nan>;
        OCTET_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(tile_bytes)));
        const quant_layout& L0 = row_out.layout;
        const quant_layout& L1 = col_out.layout;
        cuda::launch("block_amax_kernel", kernel, grid, kQuantThreads, tile_bytes, stream, x.data, rows, cols, x.ld,
                     vector_loads, amax_grid[0], L0.block_rows, L0.block_cols, L0.scale_cols, amax_grid[1],
                     L1.block_rows, L1.block_cols, L1.scale_cols, measure_tensor ? measured_tensor_amax : nullptr);
        OCTET_CUDA_CHECK_LAUNCH();
    }
    const float* tensor_amax = measured_tensor_amax;
    if (need_tensor_amax && opt.device_tensor_amax) tensor_amax = opt.device_tensor_amax;
    for (int c = 0; c < 2; ++c) {
        if (!grid_elems[c]) continue;
        const quantized_ref<Recipe>& q = *outs[c];
        OCTET_CUDA_CHECK(cudaMemsetAsync(q.scales, 0, q.layout.scale_bytes, stream));
        cuda::launch("block_scales_from_amax_kernel", block_scales_from_amax_kernel<Recipe>,
                     cuda::grid_stride_blocks(grid_elems[c], 256), 256, 0, stream, amax_grid[c], tensor_amax,
                     Recipe::is_per_tensor, q.layout, q.scales, value_grid[c], q.tensor_scale);
        OCTET_CUDA_CHECK_LAUNCH();
    }

    quant_kernel_args<Recipe, In> p{};
    p.x = x.data;
    p.rows = rows;
    p.cols = cols;
    p.ld = x.ld;
    p.vector_loads = vector_loads;
    p.tensor_amax = tensor_amax;
    p.record = opt.device_record;
    p.record_flag = opt.device_record_flag;
    quant_stats* stats[2] = {stats_row, stats_col};
    const philox_stream rngs[2] = {rng_row, rng_col};
    for (int c = 0; c < 2; ++c) {
        const quantized_ref<Recipe>& q = *outs[c];
        if (q.empty()) continue;
        p.copy[c].data = q.data;
        p.copy[c].aligned_rows = is_aligned(q.data, 4) && q.layout.row_bytes % 4 == 0;
        p.copy[c].scales = q.scales;
        p.copy[c].tensor_scale_out = q.tensor_scale;
        p.copy[c].layout = q.layout;
        p.copy[c].scale_values = value_grid[c];
        p.copy[c].rng = rngs[c];
        p.copy[c].stats = stats[c];
        if (!grid_elems[c]) OCTET_CUDA_CHECK(cudaMemsetAsync(q.scales, 0, q.layout.scale_bytes, stream));  // padding
    }
    const std::size_t smem = tile_bytes + 2 * kQuantTile * 32 * sizeof(float);
    auto kernel = quantize_tile_kernel<Recipe, In>;
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    cuda::launch("quantize_tile_kernel", kernel, grid, kQuantThreads, smem, stream, p);
    OCTET_CUDA_CHECK_LAUNCH();
}

template <class Recipe, class Out>
OCTET_KERNEL void dequantize_matrix_kernel(quantized_cref<Recipe> q, Out* out, std::size_t ld, bool col_major) {
    const std::size_t rows = q.rows(), cols = q.cols();
    const std::size_t groups = (cols + 3) / 4;
    for (std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < rows * groups;
         t += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t i = t / groups, j0 = (t % groups) * 4;
        OCTET_UNROLL
        for (int k = 0; k < 4; ++k) {
            const std::size_t j = j0 + k;
            if (j >= cols) break;
            const float v = q.value(i, j);
            Out o;
            if constexpr (std::is_same_v<Out, float>)
                o = v;
            else if constexpr (std::is_same_v<Out, bf16>)
                o = to_bf16(v);
            else
                o = to_fp16(v);
            out[col_major ? j * ld + i : i * ld + j] = o;
        }
    }
}

}  // namespace detail

/// Bytes of device scratch quantize<Recipe>(ex, x, rowwise, columnwise, opt) requests from the
/// executor's allocator (one request, rounded up to 256; 0 for the one-pass recipes whose blocks
/// tile 128 x 128, e.g. 1x128, 128x128, MX, NVFP4 with opt.device_tensor_amax): 4 * (1 + 2 * the
/// scale-grid elements of each copy whose blocks do not tile 128 x 128) when such a copy exists or
/// the per-tensor / two-level amax must be measured. Same arguments as quantize (not checked here).
template <class Recipe, class T>
std::size_t quantize_scratch_bytes(matrix_ref<T> x, quantized_ref<Recipe> rowwise,
                                   quantized_ref<Recipe> columnwise = {}, const device_quantize_options& opt = {}) {
    if (x.empty()) return 0;
    std::size_t grid_elems[2] = {0, 0};
    return detail::scratch_round(detail::quantize_scratch_floats<Recipe>(rowwise, columnwise, opt, grid_elems) *
                                 sizeof(float));
}

namespace detail {

/// quantize and dequantize on a stream (the entries, octet::quantize / octet::dequantize, are in
/// quantize.hpp and check the executor-independent arguments first).
template <>
struct quant_backend<stream_executor> {
    using options = device_quantize_options;
    using result = void;
    /// CUDA's __nv_bfloat16 / __half arguments are octet::bf16 / octet::fp16 to the kernels.
    template <class T>
    using element = storage_of_t<T>;

    /// Enqueues on ex.stream: memsets of the scale grids (and of device_stats), then one kernel (one-
    /// pass recipes) or an amax kernel, a scale kernel per global-mode copy and the encode kernel; takes
    /// quantize_scratch_bytes(...) of scratch from ex's allocator, returned on the stream. No host sync.
    template <class Recipe, class In>
    static void run_quantize(const stream_executor& ex, matrix_ref<const In> x, const quantized_ref<Recipe>& rowwise,
                             const quantized_ref<Recipe>& columnwise, const options& opt) {
        constexpr const char* fn = "octet::quantize";
        const bool want_row = !rowwise.absent(), want_col = !columnwise.absent();
        if (opt.device_stats)
            OCTET_CUDA_CHECK(cudaMemsetAsync(opt.device_stats, 0, 2 * sizeof(quant_stats), ex.stream));
        if (x.empty()) return;
        cuda::require_device_accessible(x.data, fn, "x");
        if (want_row) require_device_copy(rowwise, fn, "rowwise");
        if (want_col) require_device_copy(columnwise, fn, "columnwise");
        OCTET_REQUIRE(!opt.device_record_flag || opt.device_record, fn, "options.device_record_flag",
                      "is set without device_record");

        quant_stats* s_row = opt.device_stats;
        quant_stats* s_col = opt.device_stats ? opt.device_stats + 1 : nullptr;
        const philox_stream rng_row = opt.rng, rng_col{opt.rng.seed, opt.rng.offset + 1};
        if (x.order == storage_order::row_major) {
            quantize_device<Recipe, In>(ex, x, rowwise, columnwise, opt, rng_row, rng_col, s_row, s_col);
        } else {
            // A column-major x is a row-major x^T: its row-wise copy is x^T's column-wise copy.
            quantize_device<Recipe, In>(ex, x.transposed(), columnwise, rowwise, opt, rng_col, rng_row, s_col, s_row);
        }
    }

    /// Enqueues one kernel on ex.stream; no scratch, no host sync.
    template <class Recipe, class Out>
    static void run_dequantize(const stream_executor& ex, const quantized_cref<Recipe>& q, matrix_ref<Out> out) {
        constexpr const char* fn = "octet::dequantize";
        cuda::require_device_accessible(out.data, fn, "out");
        require_device_copy(q, fn, "q");
        const std::size_t work = q.rows() * ((q.cols() + 3) / 4);
        cuda::launch("dequantize_matrix_kernel", dequantize_matrix_kernel<Recipe, Out>,
                     cuda::grid_stride_blocks(work, 256), 256, 0, ex.stream, q, out.data, out.ld,
                     out.order == storage_order::col_major);
        OCTET_CUDA_CHECK_LAUNCH();
    }
};

}  // namespace detail

}  // namespace octet
