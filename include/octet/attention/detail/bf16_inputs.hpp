// octet/attention/detail/bf16_inputs.hpp: the implementation of octet/attention/bf16_inputs.hpp
// (which includes it at its end): the head-dim dispatch, the FP8 copies carved from one scratch
// block, and the definitions of the entries declared there.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "octet/attention/attention.hpp"
#include "octet/attention/bf16_inputs.hpp"

namespace octet {

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

template <class In>
void require_row_major(const matrix_ref<const In>& x, const char* fn, const char* arg) {
    OCTET_REQUIRE(x.order == storage_order::row_major, fn, arg, "must be row-major [tokens, heads * head_dim]");
}

/// A quantized copy of a rows x cols operand carved from a scratch block (quantized_tensor's layout).
template <class Recipe>
quantized_ref<Recipe> carve_quantized(scratch_carver& c, std::size_t rows, std::size_t cols) {
    const quant_layout l = quant_layout_of<Recipe>::make(rows, cols);
    std::uint8_t* const data = c.take<std::uint8_t>(l.data_bytes);
    std::uint8_t* const scales = c.take<std::uint8_t>(l.scale_bytes);
    float* const tensor_scale = c.take<float>(1);
    return quantized_ref<Recipe>(data, scales, l, tensor_scale);
}

/// The FP8 copies the bf16 entries quantize Q, K, V (and dO, when `dout` is given) into: the
/// entries' own scratch block, described once for the ..._scratch_bytes queries and the entries.
template <int D>
struct attention_input_copies {
    using recipes = attention_input_recipes<D>;
    quantized_ref<typename recipes::qk> q, k;
    quantized_ref<typename recipes::v> v;
    quantized_ref<typename recipes::dout> dout;  ///< absent ({}) in the forward
    template <class In>
    attention_input_copies(scratch_carver& c, const matrix_ref<const In>& q_, const matrix_ref<const In>& k_,
                           const matrix_ref<const In>& v_, const matrix_ref<const In>* dout_) {
        q = carve_quantized<typename recipes::qk>(c, q_.rows, q_.cols);
        k = carve_quantized<typename recipes::qk>(c, k_.rows, k_.cols);
        v = carve_quantized<typename recipes::v>(c, v_.rows, v_.cols);
        if (dout_) dout = carve_quantized<typename recipes::dout>(c, dout_->rows, dout_->cols);
    }
    /// Sets the tensor scales (unused by these one-level recipes) as quantized_tensor does.
    void init() const {
        float* const scales[] = {q.tensor_scale, k.tensor_scale, v.tensor_scale, dout.tensor_scale};
        for (float* ts : scales)
            if (ts) *ts = 1.0f;
    }
};

/// The host memory a bf16 entry takes at its peak: its block of FP8 copies, and beside it the
/// largest of the blocks the quantize calls and the FP8 entry (`fp8_bytes`) take in turn.
template <int D, class In>
std::size_t attention_input_scratch_bytes(const host_executor& ex, const matrix_ref<const In>& q,
                                          const matrix_ref<const In>& k, const matrix_ref<const In>& v,
                                          const matrix_ref<const In>* dout, std::size_t fp8_bytes) {
    scratch_carver c;
    const attention_input_copies<D> x(c, q, k, v, dout);
    std::size_t inner = std::max(fp8_bytes, quantize_scratch_bytes(ex, q, x.q));
    inner = std::max(inner, quantize_scratch_bytes(ex, k, x.k));
    inner = std::max(inner, quantize_scratch_bytes(ex, v, x.v));
    if (dout) inner = std::max(inner, quantize_scratch_bytes(ex, *dout, x.dout));
    return c.bytes() + inner;
}

}  // namespace detail

// ---- the entries, declared and documented in octet/attention/bf16_inputs.hpp ----------------------

template <class In, class OT>
void attention_forward(host_executor ex, const attention_shape& shape, matrix_ref<const In> q, matrix_ref<const In> k,
                       matrix_ref<const In> v, matrix_ref<OT> o, span<float> lse, const attention_options& opt) {
    static_assert(detail::is_attention_input_v<In>,
                  "octet::attention_forward: inputs must be octet::bf16, octet::fp16 or float");
    constexpr const char* fn = "octet::attention_forward";
    detail::with_head_dim(shape.head_dim, fn, [&](auto d) {
        using copies = detail::attention_input_copies<decltype(d)::value>;
        using R = typename copies::recipes;
        detail::require_row_major(q, fn, "q");
        detail::require_row_major(k, fn, "k");
        detail::require_row_major(v, fn, "v");
        const matrix_ref<const In>* const no_dout = nullptr;
        const detail::host_scratch block(ex, detail::scratch_bytes_of<copies>(q, k, v, no_dout), fn);
        detail::scratch_carver c = block.carver();
        const copies x(c, q, k, v, no_dout);
        x.init();
        quantize<typename R::qk>(ex, q, x.q);
        quantize<typename R::qk>(ex, k, x.k);
        quantize<typename R::v>(ex, v, x.v);
        attention_forward(ex, shape, quantized_cref<typename R::qk>(x.q), quantized_cref<typename R::qk>(x.k),
                          quantized_cref<typename R::v>(x.v), o, lse, opt);
    });
}

template <class In, class OT, class GT>
attention_stats attention_backward(host_executor ex, const attention_shape& shape, matrix_ref<const In> q,
                                   matrix_ref<const In> k, matrix_ref<const In> v, matrix_ref<OT> o,
                                   span<const float> lse, matrix_ref<const In> dout, matrix_ref<GT> dq,
                                   matrix_ref<GT> dk, matrix_ref<GT> dv, const attention_backward_options& opt,
                                   attention_row_telemetry* rows) {
    static_assert(detail::is_attention_input_v<In>,
                  "octet::attention_backward: inputs must be octet::bf16, octet::fp16 or float");
    constexpr const char* fn = "octet::attention_backward";
    return detail::with_head_dim(shape.head_dim, fn, [&](auto d) {
        using copies = detail::attention_input_copies<decltype(d)::value>;
        using R = typename copies::recipes;
        detail::require_row_major(q, fn, "q");
        detail::require_row_major(k, fn, "k");
        detail::require_row_major(v, fn, "v");
        detail::require_row_major(dout, fn, "dout");
        const detail::host_scratch block(ex, detail::scratch_bytes_of<copies>(q, k, v, &dout), fn);
        detail::scratch_carver c = block.carver();
        const copies x(c, q, k, v, &dout);
        x.init();
        quantize<typename R::qk>(ex, q, x.q);
        quantize<typename R::qk>(ex, k, x.k);
        quantize<typename R::v>(ex, v, x.v);
        quantize<typename R::dout>(ex, dout, x.dout);
        return attention_backward(ex, shape, quantized_cref<typename R::qk>(x.q), quantized_cref<typename R::qk>(x.k),
                                  quantized_cref<typename R::v>(x.v), o, lse, quantized_cref<typename R::dout>(x.dout),
                                  dq, dk, dv, opt, rows);
    });
}

template <class In>
std::size_t attention_forward_scratch_bytes(const host_executor& ex, const attention_shape& shape,
                                            matrix_ref<const In> q, matrix_ref<const In> k, matrix_ref<const In> v,
                                            const attention_options& opt) {
    return detail::with_head_dim(shape.head_dim, "octet::attention_forward_scratch_bytes", [&](auto d) {
        return detail::attention_input_scratch_bytes<decltype(d)::value, In>(
            ex, q, k, v, nullptr, attention_forward_scratch_bytes(ex, shape, opt));
    });
}

template <class In>
std::size_t attention_backward_scratch_bytes(const host_executor& ex, const attention_shape& shape,
                                             matrix_ref<const In> q, matrix_ref<const In> k, matrix_ref<const In> v,
                                             matrix_ref<const In> dout, const attention_backward_options& opt) {
    return detail::with_head_dim(shape.head_dim, "octet::attention_backward_scratch_bytes", [&](auto d) {
        return detail::attention_input_scratch_bytes<decltype(d)::value, In>(
            ex, q, k, v, &dout, attention_backward_scratch_bytes(ex, shape, opt));
    });
}

}  // namespace octet
