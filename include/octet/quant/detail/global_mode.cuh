// octet/quant/detail/global_mode.cuh: the kernels of the global mode, for blocks that do not tile
// 128 x 128 (per row, per column, per tensor, other shapes) and for the tensor amax of two-level
// recipes: block_amax_kernel (pass 1: the block amax grids and the tensor amax) and
// block_scales_from_amax_kernel (pass 2: the scales). tile.cuh's kernel then encodes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "octet/cuda/launch.cuh"
#include "octet/cuda/shared_memory.cuh"
#include "octet/cuda/warp.cuh"
#include "octet/format/convert.cuh"
#include "octet/quant/detail/kernel_common.cuh"
#include "octet/quant/quantize.hpp"

namespace octet {

namespace detail {

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

}  // namespace detail

}  // namespace octet
