// octet/quant/detail/stream.cuh: the stream backend of quantize and dequantize,
// quant_backend<stream_executor> (the entries are quant/quantize.hpp's): the choice of the one-pass or
// the global mode, the scratch it requests, the device checks and the launches of the kernels of
// tile.cuh, global_mode.cuh and dequantize.cuh; and the definition of quantize_scratch_bytes, declared
// in octet/quant/quantize.cuh (which includes this file at its end).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/shared_memory.cuh"
#include "octet/quant/detail/dequantize.cuh"
#include "octet/quant/detail/global_mode.cuh"
#include "octet/quant/detail/kernel_common.cuh"
#include "octet/quant/detail/tile.cuh"
#include "octet/quant/quantize.cuh"
#include "octet/quant/quantize.hpp"

namespace octet {

namespace detail {

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

// ---- declared and documented in octet/quant/quantize.cuh ----------------------------------------

template <class Recipe, class T>
std::size_t quantize_scratch_bytes(matrix_ref<T> x, quantized_ref<Recipe> rowwise, quantized_ref<Recipe> columnwise,
                                   const device_quantize_options& opt) {
    if (x.empty()) return 0;
    std::size_t grid_elems[2] = {0, 0};
    return detail::scratch_round(detail::quantize_scratch_floats<Recipe>(rowwise, columnwise, opt, grid_elems) *
                                 sizeof(float));
}

}  // namespace octet
