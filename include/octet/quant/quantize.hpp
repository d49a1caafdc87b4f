// octet/quant/quantize.hpp: quantize and dequantize on the host (multi-threaded).
//
//   octet::quantized_tensor<R> q(rows, cols), qt(cols, rows);
//   auto result = octet::quantize<R>(octet::on_host(), x, q.ref(), qt.ref(), {/*collect_stats=*/true});
//   octet::dequantize(octet::on_host(), q.cref(), y);
//
// `x` is a matrix_ref of float, octet::bf16 or octet::fp16 in either layout. The row-wise output
// is the quantized copy of x, the column-wise output the quantized copy of x^T (the transpose the
// backward pass needs); pass a default ref ({}) to skip either. A ref that is only partly set (a
// null data pointer beside valid scales, say) is an error, not a skipped copy. Per element:
// code = encode<Format, Round, Overflow>(x / S) with S the effective scale of its block (see
// scale.hpp for the edge contract). Each operation has one entry for every executor: on a stream
// (octet::on_stream, with octet/quant/quantize.cuh included) the same call gives the same bits. On the host the two
// copies are produced by separate passes over x; the device quantizer produces both from one read.
//
// Stochastic rounding draws element (r, c) of a copy from rng.bits(stochastic_index(r, c)) (scale.hpp),
// with the row-wise copy on rng.offset and the column-wise copy on rng.offset + 1.
//
// This header holds the options, the result and the entries; their implementation (the argument
// checks, the host backend quant_backend<host_executor> and its SIMD loops) is in
// octet/quant/detail/quantize.hpp, which it includes at its end.
#pragma once

#include <cstddef>

#include "octet/core/executor.hpp"
#include "octet/core/matrix.hpp"
#include "octet/core/philox.hpp"
#include "octet/quant/recipe.hpp"
#include "octet/quant/stats.hpp"
#include "octet/quant/tensor.hpp"

namespace octet {

struct quantize_options {
    /// Gather quant_stats for each copy in the same pass.
    bool collect_stats = false;
    /// Per-tensor and two-level (NVFP4) recipes: the amax the tensor scale is derived from, when
    /// the caller has it (delayed scaling passes its history's reduced amax; a previous amax pass
    /// can pass its result). Negative: measure it from x (current scaling). 0 is accepted only when
    /// x holds no non-zero finite value (a zero amax leaves no scale for them). A stale amax smaller
    /// than x's is legitimate under delayed scaling: what lies above it saturates (scale rules and
    /// E4M3 block scales clamp) and is counted in quant_stats::saturated, which is how a caller sees
    /// that the history lags.
    float tensor_amax = -1.0f;
    /// Random bits for round::stochastic.
    philox_stream rng{};
};

struct quantize_result {
    float amax = 0.0f;  ///< the largest finite |x| of the input (what delayed scaling records)
    quant_stats rowwise;
    quant_stats columnwise;
};

namespace detail {
/// Where quantize and dequantize run: the executor's half of each operation (detail/quantize.hpp).
template <class Executor>
struct quant_backend;
}  // namespace detail

// ---- the entries ----------------------------------------------------------------------------------

/// Quantize x into a row-wise copy and/or a column-wise (transposed) copy, on the executor: the host
/// (returns the amax and, with options.collect_stats, the statistics of each copy) or a CUDA stream
/// (octet/quant/quantize.cuh: device_quantize_options; enqueues, returns nothing; same bits).
template <class Recipe, class T, class Executor>
typename detail::quant_backend<Executor>::result quantize(
    const Executor& ex, matrix_ref<T> x_in, quantized_ref<Recipe> rowwise, quantized_ref<Recipe> columnwise = {},
    const typename detail::quant_backend<Executor>::options& opt = {});

/// Bytes of host scratch quantize<Recipe>(ex, x, rowwise, columnwise, opt) takes from ex's allocator
/// (one block; 0 for an empty x): the row-major transpose of x for a copy that reads x down its
/// columns ((rows x cols) elements of x's type), the block grid's amax and scales, and a few rows of
/// floats per thread. Same arguments as quantize (not checked here). dequantize takes none.
template <class Recipe, class T>
std::size_t quantize_scratch_bytes(const host_executor& ex, matrix_ref<T> x, quantized_ref<Recipe> rowwise,
                                   quantized_ref<Recipe> columnwise = {});

/// Dequantize a copy into a float, bf16 or fp16 matrix of the same shape, decode(code) * S, on the
/// executor (host, or a stream with octet/quant/quantize.cuh: one kernel, no scratch, no host sync).
template <class Recipe, class Byte, class Out, class Executor>
void dequantize(const Executor& ex, quantized_ref<Recipe, Byte> q_in, matrix_ref<Out> out_in);

}  // namespace octet

#include "octet/quant/detail/quantize.hpp"  // IWYU pragma: export
