// octet/quant/detail/kernel_common.cuh: what the quantize kernels share (quant/quantize.cuh's header
// comment describes how they lay out the work): the 128 x 128 tile and its shared-memory pitch, the
// bank-conflict-free read order, atomic and warp amax helpers, the kernels' arguments, the tile load
// (load_tile), the packed code stores (store_codes4) and the per-warp statistics (stats_accumulator).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "octet/cuda/shared_memory.cuh"
#include "octet/cuda/warp.cuh"
#include "octet/format/convert.cuh"
#include "octet/quant/quantize.hpp"

namespace octet {

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

}  // namespace detail

}  // namespace octet
