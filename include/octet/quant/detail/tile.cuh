// octet/quant/detail/tile.cuh: the one-pass quantize kernel, quantize_tile_kernel: one CTA loads a
// 128 x 128 tile of x once and produces from it the row-wise and the column-wise tile
// (quantize_tile_copy), with the block scales computed in the tile (local mode) or read from the
// scale grid of the global mode (global_mode.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "octet/cuda/launch.cuh"
#include "octet/cuda/shared_memory.cuh"
#include "octet/cuda/warp.cuh"
#include "octet/format/convert.cuh"
#include "octet/quant/detail/kernel_common.cuh"
#include "octet/quant/quantize.hpp"

namespace octet {

namespace detail {

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

}  // namespace detail

}  // namespace octet
