// octet/attention/bf16_inputs.hpp: attention on bf16 (or fp16, float) Q, K, V and dO.
//
//   octet::attention_forward(octet::on_host(), shape, q_bf16, k_bf16, v_bf16, o, lse, opt);
//   octet::attention_backward(octet::on_host(), shape, q_bf16, k_bf16, v_bf16, o, lse, dout_bf16, dq, dk, dv, bo);
//
// The operands are quantized with octet::quantize at the points the FP8 path documents, with the
// recipes the accuracy measurements favour (README, "FP8 attention"), then the FP8 path runs:
//   Q, K, dO   E4M3, one float scale per token and head (block<1, D>): fine-grained scales give
//              gradients the range E5M2 would otherwise buy with a mantissa bit
//   V          E4M3, one float scale per head over all tokens (block<full, D>): the largest P of a
//              tile then maps exactly to the top of P's range, which makes O about 3x more
//              accurate than per-token V scales
// The backward re-quantizes Q, K and V; quantization is deterministic, so it sees exactly the
// operands the forward saw. head_dim must be 64, 128 or 256 (the recipes' block width is a
// compile-time constant); other head dims raise octet::error: quantize them yourself with any
// recipe whose blocks keep a head whole and call the FP8 overloads in attention.hpp.
#pragma once

#include <type_traits>

#include "octet/attention/attention.hpp"

namespace octet {

template <int D>
struct attention_input_recipes {
    using qk = recipe<e4m3, block<1, D>, scale::amax_ratio<0>>;
    using v = recipe<e4m3, block<full, D>, scale::amax_ratio<0>>;
    using dout = recipe<e4m3, block<1, D>, scale::amax_ratio<0>>;
};

namespace detail {

template <class In>
inline constexpr bool is_attention_input_v =
    std::is_same_v<In, bf16> || std::is_same_v<In, fp16> || std::is_same_v<In, float>;

/// Calls f(std::integral_constant<int, D>{}) for the shape's head dim, or throws.
template <class F>
decltype(auto) with_head_dim(int head_dim, const char* fn, F&& f) {
    switch (head_dim) {
        case 64:
            return f(std::integral_constant<int, 64>{});
        case 128:
            return f(std::integral_constant<int, 128>{});
        case 256:
            return f(std::integral_constant<int, 256>{});
        default:
            throw_argument_error(
                fn, "shape.head_dim",
                message("is ", head_dim, "; the bf16 entry points serve head dims 64, 128 and 256: quantize other ",
                        "head dims with octet::quantize and call the FP8 overloads"));
    }
}

template <class Recipe, class In>
quantized_tensor<Recipe> quantize_operand(host_executor ex, matrix_ref<const In> x, const char* fn, const char* arg) {
    OCTET_REQUIRE(x.order == storage_order::row_major, fn, arg, "must be row-major [tokens, heads * head_dim]");
    quantized_tensor<Recipe> q(x.rows, x.cols);
    quantize<Recipe>(ex, x, q.ref());
    return q;
}

}  // namespace detail

/// Forward on bf16 / fp16 / float operands (quantized as the header comment says).
template <class In, class OT>
void attention_forward(host_executor ex, const attention_shape& shape, matrix_ref<const In> q, matrix_ref<const In> k,
                       matrix_ref<const In> v, matrix_ref<OT> o, span<float> lse, const attention_options& opt = {}) {
    static_assert(detail::is_attention_input_v<In>,
                  "octet::attention_forward: inputs must be octet::bf16, octet::fp16 or float");
    constexpr const char* fn = "octet::attention_forward";
    detail::with_head_dim(shape.head_dim, fn, [&](auto d) {
        using R = attention_input_recipes<decltype(d)::value>;
        const auto qq = detail::quantize_operand<typename R::qk>(ex, q, fn, "q");
        const auto kq = detail::quantize_operand<typename R::qk>(ex, k, fn, "k");
        const auto vq = detail::quantize_operand<typename R::v>(ex, v, fn, "v");
        attention_forward(ex, shape, qq.cref(), kq.cref(), vq.cref(), o, lse, opt);
    });
}

/// Backward on bf16 / fp16 / float operands; returns the telemetry summary.
template <class In, class OT, class GT>
attention_stats attention_backward(host_executor ex, const attention_shape& shape, matrix_ref<const In> q,
                                   matrix_ref<const In> k, matrix_ref<const In> v, matrix_ref<OT> o,
                                   span<const float> lse, matrix_ref<const In> dout, matrix_ref<GT> dq,
                                   matrix_ref<GT> dk, matrix_ref<GT> dv, const attention_backward_options& opt = {},
                                   attention_row_telemetry* rows = nullptr) {
    static_assert(detail::is_attention_input_v<In>,
                  "octet::attention_backward: inputs must be octet::bf16, octet::fp16 or float");
    constexpr const char* fn = "octet::attention_backward";
    return detail::with_head_dim(shape.head_dim, fn, [&](auto d) {
        using R = attention_input_recipes<decltype(d)::value>;
        const auto qq = detail::quantize_operand<typename R::qk>(ex, q, fn, "q");
        const auto kq = detail::quantize_operand<typename R::qk>(ex, k, fn, "k");
        const auto vq = detail::quantize_operand<typename R::v>(ex, v, fn, "v");
        const auto dq_in = detail::quantize_operand<typename R::dout>(ex, dout, fn, "dout");
        return attention_backward(ex, shape, qq.cref(), kq.cref(), vq.cref(), o, lse, dq_in.cref(), dq, dk, dv, opt,
                                  rows);
    });
}

}  // namespace octet
