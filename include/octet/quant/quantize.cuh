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
//
// This header holds the stream options and the scratch query. The code is in octet/quant/detail/,
// one kernel family per file: tile.cuh (quantize_tile_kernel, the one-pass path), global_mode.cuh
// (block_amax_kernel, block_scales_from_amax_kernel), dequantize.cuh (dequantize_matrix_kernel);
// kernel_common.cuh holds what the quantize kernels share, and stream.cuh the stream backend
// (quant_backend<stream_executor>) that launches them; this header includes it at its end.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "octet/cuda/executor.cuh"
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

/// Bytes of device scratch quantize<Recipe>(ex, x, rowwise, columnwise, opt) requests from the
/// executor's allocator (one request, rounded up to 256; 0 for the one-pass recipes whose blocks
/// tile 128 x 128, e.g. 1x128, 128x128, MX, NVFP4 with opt.device_tensor_amax): 4 * (1 + 2 * the
/// scale-grid elements of each copy whose blocks do not tile 128 x 128) when such a copy exists or
/// the per-tensor / two-level amax must be measured. Same arguments as quantize (not checked here).
template <class Recipe, class T>
std::size_t quantize_scratch_bytes(matrix_ref<T> x, quantized_ref<Recipe> rowwise,
                                   quantized_ref<Recipe> columnwise = {}, const device_quantize_options& opt = {});

}  // namespace octet

#include "octet/quant/detail/stream.cuh"  // IWYU pragma: export
