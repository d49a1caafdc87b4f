// octet/attention/bf16_inputs.hpp: attention on bf16 (or fp16, float) Q, K, V and dO.
//
//   octet::attention_forward(octet::on_host(), shape, q_bf16, k_bf16, v_bf16, o, lse, opt);
//   octet::attention_backward(octet::on_host(), shape, q_bf16, k_bf16, v_bf16, o, lse, dout_bf16, dq, dk, dv, bo);
//
// The operands are quantized with octet::quantize at the points the FP8 path documents, with the
// recipes the accuracy measurements favour (docs/attention.md), then the FP8 path runs:
//   Q, K, dO   E4M3, one float scale per token and head (block<1, D>): fine-grained scales give
//              gradients the range E5M2 would otherwise buy with a mantissa bit
//   V          E4M3, one float scale per head over all tokens (block<full, D>): the largest P of a
//              tile then maps exactly to the top of P's range, which makes O about 3x more
//              accurate than per-token V scales
// The backward re-quantizes Q, K and V; quantization is deterministic, so it sees exactly the
// operands the forward saw. head_dim must be 64, 128 or 256 (the recipes' block width is a
// compile-time constant); other head dims raise octet::error: quantize them yourself with any
// recipe whose blocks keep a head whole and call the FP8 overloads in attention.hpp.
//
// Memory: the FP8 copies are carved from one block of host scratch (from the executor's allocator
// when one is lent, octet::with_allocator); the quantize calls and the FP8 operation then take
// their own blocks in turn. attention_forward_scratch_bytes(ex, shape, q, k, v, opt) and
// attention_backward_scratch_bytes(ex, shape, q, k, v, dout, opt) give the peak.
//
// This header holds the recipes and the entries; their implementation is in
// octet/attention/detail/bf16_inputs.hpp, which it includes at its end.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "octet/attention/attention.hpp"

namespace octet {

template <int D>
struct attention_input_recipes {
    using qk = recipe<e4m3, block<1, D>, scale::amax_ratio<0>>;
    using v = recipe<e4m3, block<full, D>, scale::amax_ratio<0>>;
    using dout = recipe<e4m3, block<1, D>, scale::amax_ratio<0>>;
};

// ---- the entries ----------------------------------------------------------------------------------

/// Forward on bf16 / fp16 / float operands (quantized as the header comment says). The FP8
/// copies live in one host_scratch block (from ex's allocator when one is lent); the quantize calls
/// and the FP8 forward then take their own blocks, from the same source, in turn: at most
/// attention_forward_scratch_bytes(ex, shape, q, k, v, opt) bytes at once, nothing else allocated.
template <class In, class OT>
void attention_forward(host_executor ex, const attention_shape& shape, matrix_ref<const In> q, matrix_ref<const In> k,
                       matrix_ref<const In> v, matrix_ref<OT> o, span<float> lse, const attention_options& opt = {});

/// Backward on bf16 / fp16 / float operands; returns the telemetry summary. The FP8 copies live
/// in one host_scratch block (from ex's allocator when one is lent); the quantize calls and the FP8
/// backward then take their own blocks, from the same source, in turn: at most
/// attention_backward_scratch_bytes(ex, shape, q, k, v, dout, opt) bytes at once; `rows`' vectors
/// are the only other allocations (attention_row_telemetry).
template <class In, class OT, class GT>
attention_stats attention_backward(host_executor ex, const attention_shape& shape, matrix_ref<const In> q,
                                   matrix_ref<const In> k, matrix_ref<const In> v, matrix_ref<OT> o,
                                   span<const float> lse, matrix_ref<const In> dout, matrix_ref<GT> dq,
                                   matrix_ref<GT> dk, matrix_ref<GT> dv, const attention_backward_options& opt = {},
                                   attention_row_telemetry* rows = nullptr);

/// Bytes of host memory attention_forward(ex, shape, q, k, v, o, lse, opt) on bf16 / fp16 / float
/// operands takes from ex's allocator at its peak (the FP8 copies, plus the largest of the quantize
/// calls' and the FP8 forward's scratch). Depends on ex's thread count, the shape and the operands'
/// sizes; the arguments are not checked here, except head_dim (64, 128 or 256, as the entry).
template <class In>
std::size_t attention_forward_scratch_bytes(const host_executor& ex, const attention_shape& shape,
                                            matrix_ref<const In> q, matrix_ref<const In> k, matrix_ref<const In> v,
                                            const attention_options& opt = {});

/// Bytes of host memory attention_backward(ex, shape, q, k, v, o, lse, dout, dq, dk, dv, opt[, rows])
/// on bf16 / fp16 / float operands takes from ex's allocator at its peak (the FP8 copies, plus the
/// largest of the quantize calls' and the FP8 backward's scratch; not `rows`' vectors). Depends on
/// ex's thread count, the shape, the operands' sizes and options.telemetry / fold_dq_residual; the
/// arguments are not checked here, except head_dim (64, 128 or 256, as the entry).
template <class In>
std::size_t attention_backward_scratch_bytes(const host_executor& ex, const attention_shape& shape,
                                             matrix_ref<const In> q, matrix_ref<const In> k, matrix_ref<const In> v,
                                             matrix_ref<const In> dout, const attention_backward_options& opt = {});

}  // namespace octet

#include "octet/attention/detail/bf16_inputs.hpp"  // IWYU pragma: export
