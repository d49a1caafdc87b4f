// octet/nn/detail/moe.hpp: the implementation of octet/nn/moe.hpp (included at its end): the
// recipe rules, the per-expert storage whose group sizes change every step, and the steps of the
// layer's forward and backward.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "octet/core/check.hpp"
#include "octet/nn/moe.hpp"

namespace octet {

template <class LR, class SR>
const char* moe_recipe_support() {
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    using GR = typename LR::g_recipe;
    if (LR::scaling != linear_scaling::current)
        return "delayed scaling is not supported by the MoE layer (each expert's group has its own amax); use "
               "linear_scaling::current (linear_recipes::blockwise or linear_recipes::mxfp8)";
    if (LR::stochastic_gradients || LR::hadamard_wgrad)
        return "stochastic gradients and the Hadamard weight-gradient rotation are not supported by the MoE layer; "
               "use linear_recipes::blockwise or linear_recipes::mxfp8";
    if (XR::granularity::rows != 1 || XR::two_level)
        return "the activation recipe must be row-local with one level of scales (per row or block<1, C>: 1x128, "
               "MXFP8) so that X is quantized once and permuted by token; use linear_recipes::blockwise or "
               "linear_recipes::mxfp8";
    if (GR::granularity::rows != 1 || GR::two_level)
        return "the gradient recipe must be row-local with one level of scales (per row or block<1, C>), so that "
               "no scale block mixes two experts' tokens; use linear_recipes::blockwise or linear_recipes::mxfp8";
    if (WR::two_level) return "the weight recipe must have one level of scales (128x128, per tensor, MXFP8)";
    if (SR::granularity::rows != 1 || SR::two_level || detail::is_stochastic_recipe_v<SR>)
        return "the saved-activation recipe SR must scale groups of a row with deterministic rounding (see "
               "octet::activation_recipes)";
    return "";
}

namespace detail {
template <class F>
double moe_unit_roundoff() {
    return std::ldexp(1.0, -(F::mantissa_bits + 1));
}
}  // namespace detail

template <class LR>
double moe_forward_error_bound(bool bf16_out) {
    return 2 * (detail::moe_unit_roundoff<typename LR::x_recipe::format>() +
                detail::moe_unit_roundoff<typename LR::w_recipe::format>()) +
           (bf16_out ? std::ldexp(1.0, -8) : 0.0);
}

template <class LR, class SR>
double moe_backward_error_bound() {
    return detail::moe_unit_roundoff<typename LR::x_recipe::format>() +
           2 * detail::moe_unit_roundoff<typename LR::w_recipe::format>() +
           2 * detail::moe_unit_roundoff<typename LR::g_recipe::format>() +
           detail::moe_unit_roundoff<typename SR::format>();
}

namespace detail {

inline std::size_t moe_up16(std::size_t n) {
    return (n + 15) / 16 * 16;
}

/// Data and scale bytes of one group as make_grouped_layout lays it out (padded to 16 bytes each).
template <class R>
quant_layout moe_group_layout(std::size_t rows, std::size_t cols) {
    return rows && cols ? quant_layout_of<R>::make(rows, cols) : quant_layout{rows, cols};
}

struct moe_store_bytes {
    std::size_t data = 0, scales = 0;
};

/// Storage that holds E groups whose token counts sum to at most max_rows, each group tokens x width
/// (tokens_are_rows) or width x tokens. A group's bytes f(n) are at most a n + b with b <= f(256) + 16
/// (the padding of its rows, of its scale rows or columns, and to 16 bytes), and f(M) >= a M, so
/// f(M) + E (f(256) + 16) covers any split of M tokens into E groups.
template <class R>
moe_store_bytes moe_store_capacity(std::size_t experts, std::size_t max_rows, std::size_t width, bool tokens_are_rows) {
    const auto f = [&](std::size_t n) {
        const quant_layout l = tokens_are_rows ? moe_group_layout<R>(n, width) : moe_group_layout<R>(width, n);
        return moe_store_bytes{moe_up16(l.data_bytes), moe_up16(l.scale_bytes)};
    };
    const moe_store_bytes all = f(max_rows), pad = f(256);
    return {all.data + experts * (pad.data + 16), all.scales + experts * (pad.scales + 16)};
}

template <class R>
class moe_grouped_store {
public:
    moe_grouped_store() = default;
    moe_grouped_store(std::size_t experts, std::size_t max_rows, std::size_t width, bool tokens_are_rows) {
        const moe_store_bytes cap = moe_store_capacity<R>(experts, max_rows, width, tokens_are_rows);
        data_.resize(cap.data);
        scales_.resize(cap.scales);
        layout_.groups.resize(experts);
        layout_.data_offset.resize(experts);
        layout_.scale_offset.resize(experts);
    }

    /// Lays out sizes.size() groups, sizes[g] x width (tokens_are_rows) or width x sizes[g], exactly as
    /// make_grouped_layout does, in place (no allocation), and returns the writable view.
    grouped_quantized_ref<R> ref(span<const std::size_t> sizes, std::size_t width, bool tokens_are_rows) {
        grouped_layout& l = layout_;
        l.data_bytes = l.scale_bytes = 0;
        for (std::size_t g = 0; g < sizes.size(); ++g) {
            const quant_layout q =
                tokens_are_rows ? moe_group_layout<R>(sizes[g], width) : moe_group_layout<R>(width, sizes[g]);
            l.groups[g] = q;
            l.data_offset[g] = l.data_bytes;
            l.scale_offset[g] = l.scale_bytes;
            l.data_bytes += moe_up16(q.data_bytes);
            l.scale_bytes += moe_up16(q.scale_bytes);
        }
        OCTET_REQUIRE(l.data_bytes <= data_.size() && l.scale_bytes <= scales_.size(), "octet::moe_context", "shape",
                      message("of a grouped copy (", l.data_bytes, " + ", l.scale_bytes,
                              " bytes) exceeds the storage the context holds (internal)"));
        return {data_.data(), scales_.data(), nullptr, layout_};
    }
    grouped_quantized_cref<R> cref() const { return {data_.data(), scales_.data(), nullptr, layout_}; }
    std::size_t bytes() const { return data_.size() + scales_.size(); }
    static std::size_t bytes_for(std::size_t experts, std::size_t max_rows, std::size_t width, bool tokens_are_rows) {
        const moe_store_bytes cap = moe_store_capacity<R>(experts, max_rows, width, tokens_are_rows);
        return cap.data + cap.scales;
    }

private:
    std::vector<std::uint8_t> data_, scales_;
    grouped_layout layout_{};
};

template <class R>
std::size_t moe_grouped_tensor_bytes(const grouped_quantized_tensor<R>& t) {
    return t.layout().data_bytes + t.layout().scale_bytes + t.layout().size() * sizeof(float);
}

/// Rows in expert order a context must hold room for: max_tokens k, or experts capacity when smaller.
inline std::size_t moe_max_rows(const moe_config& c) {
    const std::size_t assignments = c.max_tokens * c.router.k;
    const std::size_t cap = c.dispatch.capacity;
    if (c.experts != 0 && cap <= assignments / c.experts) return c.experts * cap;
    return assignments;
}

template <class LR, class SR>
const moe_config& checked_moe_config(const moe_config& c) {
    constexpr const char* fn = "octet::moe_context";
    OCTET_REQUIRE(c.max_tokens > 0, fn, "config.max_tokens", "is 0; pass the largest token count a call may pass");
    OCTET_REQUIRE(c.d_model > 0, fn, "config.d_model", "is 0; pass the columns of X (>= 1)");
    OCTET_REQUIRE(c.d_ff > 0, fn, "config.d_ff", "is 0; pass each expert's hidden width (>= 1)");
    OCTET_REQUIRE(c.experts > 0, fn, "config.experts", "is 0; pass the number of experts (>= 1)");
    OCTET_REQUIRE(c.experts <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()), fn, "config.experts",
                  message("is ", c.experts, "; route's indices are int32"));
    OCTET_REQUIRE(c.router.k >= 1 && c.router.k <= c.experts, fn, "config.router.k",
                  message("is ", c.router.k, " with ", c.experts, " experts; choose 1 <= k <= experts"));
    OCTET_REQUIRE(
        c.router.selection_bias.empty() || c.router.selection_bias.size() == c.experts, fn,
        "config.router.selection_bias",
        message("has ", c.router.selection_bias.size(), " entries; pass one per expert (", c.experts, ") or none"));
    const char* why = moe_recipe_support<LR, SR>();
    OCTET_REQUIRE(why[0] == '\0', fn, "LR",
                  message("(", recipe_description<typename LR::x_recipe>(), " x ",
                          recipe_description<typename LR::w_recipe>(), ") is refused: ", why));
    return c;
}

template <class T>
void require_moe_matrix(const matrix_ref<T>& m, std::size_t rows, std::size_t cols, const char* fn, const char* arg,
                        const char* what) {
    OCTET_REQUIRE(m.rows == rows && m.cols == cols, fn, arg,
                  message("has shape ", m.rows, " x ", m.cols, " but must be ", rows, " x ", cols, " (", what, ")"));
    OCTET_REQUIRE(m.empty() || m.data != nullptr, fn, arg, "is null with a non-zero shape");
    const std::size_t minor = m.order == storage_order::row_major ? m.cols : m.rows;
    OCTET_REQUIRE(m.empty() || m.ld >= minor, fn, arg, message("has ld ", m.ld, " smaller than ", minor));
}

}  // namespace detail

// ---- the context ----------------------------------------------------------------------------------

template <class LR, class SR>
moe_context<LR, SR>::moe_context(const moe_config& c)
    : config_(detail::checked_moe_config<LR, SR>(c)), max_rows_(detail::moe_max_rows(c)) {
    const std::size_t T = c.max_tokens, d = c.d_model, ff = c.d_ff, E = c.experts, k = c.router.k, M = max_rows_;
    ff_sizes_.assign(E, ff);
    d_sizes_.assign(E, d);
    x_row_ = detail::quant_buffer<XR>(T, d);
    x_col_ = detail::moe_grouped_store<XR>(E, M, d, false);
    h_col_ = detail::moe_grouped_store<XR>(E, M, ff, false);
    up_col_ = grouped_quantized_tensor<WR>(grouped_cols(d, as_cspan(ff_sizes_)));
    down_col_ = grouped_quantized_tensor<WR>(grouped_cols(ff, as_cspan(d_sizes_)));
    up_row_ = grouped_quantized_tensor<WR>(grouped_rows(as_cspan(ff_sizes_), d));
    down_row_ = grouped_quantized_tensor<WR>(grouped_rows(as_cspan(d_sizes_), ff));
    if (swiglu()) {
        gate_col_ = grouped_quantized_tensor<WR>(grouped_cols(d, as_cspan(ff_sizes_)));
        gate_row_ = grouped_quantized_tensor<WR>(grouped_rows(as_cspan(ff_sizes_), d));
        g_saved_ = detail::quant_buffer<SR>(M, ff);
    }
    u_saved_ = detail::quant_buffer<SR>(M, ff);
    y_saved_.resize(M * d);
    logits_.resize(T * E);
    router_weights_.resize(T * k);
    w_router_.resize(E * d);
    indices_.resize(T * k);
    order_.resize(T * k);
    row_of_.resize(T * k);
    counts_.resize(E);
    group_sizes_.resize(E);
    group_offsets_.resize(E + 1);
    xh_row_ = detail::moe_grouped_store<XR>(E, M, std::max(d, ff), true);
    g_row_ = detail::moe_grouped_store<GR>(E, M, std::max(d, ff), true);
    g_col_ = detail::moe_grouped_store<GR>(E, M, std::max(d, ff), false);
    b_refs_.resize(E);
    md_[0].resize(std::max(M, T) * d);  // also X^ (tokens x d) in the backward
    md_[1].resize(M * d);
    md_[2].resize(swiglu() ? M * d : 0);
    for (auto& b : mf_) b.resize(M * ff);
    if (!swiglu()) mf_[1].clear();
    dlogits_.resize(T * E);
    dweights_.resize(T * k);
}

template <class LR, class SR>
moe_memory moe_context<LR, SR>::memory_for(const moe_config& c0) {
    const moe_config& c = detail::checked_moe_config<LR, SR>(c0);
    const std::size_t T = c.max_tokens, d = c.d_model, ff = c.d_ff, E = c.experts, k = c.router.k,
                      M = detail::moe_max_rows(c), wide = std::max(d, ff);
    const bool glu = c.activation == moe_activation::swiglu;
    const auto wbytes = [&](std::size_t rows, std::size_t cols) {
        const quant_layout l = quant_layout_of<WR>::make(rows, cols);
        return E * (detail::moe_up16(l.data_bytes) + detail::moe_up16(l.scale_bytes) + sizeof(float));
    };
    moe_memory m;
    m.saved_for_backward =
        detail::quant_buffer_bytes<XR>(T, d) + detail::moe_grouped_store<XR>::bytes_for(E, M, d, false) +
        detail::moe_grouped_store<XR>::bytes_for(E, M, ff, false) + (glu ? 2 : 1) * wbytes(d, ff) + wbytes(ff, d) +
        (glu ? 2 : 1) * detail::quant_buffer_bytes<SR>(M, ff) + M * d * sizeof(bf16) +
        (T * E + T * k + E * d) * sizeof(float) + 3 * T * k * sizeof(std::int32_t) + (3 * E + 1) * sizeof(std::size_t);
    m.workspace = (glu ? 2 : 1) * wbytes(ff, d) + wbytes(d, ff) +
                  detail::moe_grouped_store<XR>::bytes_for(E, M, wide, true) +
                  detail::moe_grouped_store<GR>::bytes_for(E, M, wide, true) +
                  detail::moe_grouped_store<GR>::bytes_for(E, M, wide, false) + E * sizeof(quantized_cref<WR>) +
                  2 * E * sizeof(std::size_t) +
                  ((std::max(M, T) + M + (glu ? M : 0)) * d + (glu ? 3 : 2) * M * ff + T * E + T * k) * sizeof(float);
    return m;
}

template <class LR, class SR>
moe_memory moe_context<LR, SR>::memory() const {
    const auto vbytes = [](const auto& v) { return v.size() * sizeof(v[0]); };
    const std::size_t M = max_rows_, ff = config_.d_ff, d = config_.d_model;
    moe_memory m;
    m.saved_for_backward = detail::quant_buffer_bytes<XR>(config_.max_tokens, d) + x_col_.bytes() + h_col_.bytes() +
                           detail::moe_grouped_tensor_bytes(up_col_) + detail::moe_grouped_tensor_bytes(down_col_) +
                           (swiglu() ? detail::moe_grouped_tensor_bytes(gate_col_) : 0) +
                           (swiglu() ? 2 : 1) * detail::quant_buffer_bytes<SR>(M, ff) + vbytes(y_saved_) +
                           vbytes(logits_) + vbytes(router_weights_) + vbytes(w_router_) + vbytes(indices_) +
                           vbytes(order_) + vbytes(row_of_) + vbytes(counts_) + vbytes(group_sizes_) +
                           vbytes(group_offsets_);
    m.workspace = detail::moe_grouped_tensor_bytes(up_row_) + detail::moe_grouped_tensor_bytes(down_row_) +
                  (swiglu() ? detail::moe_grouped_tensor_bytes(gate_row_) : 0) + xh_row_.bytes() + g_row_.bytes() +
                  g_col_.bytes() + vbytes(b_refs_) + vbytes(ff_sizes_) + vbytes(d_sizes_) + vbytes(dlogits_) +
                  vbytes(dweights_);
    for (const auto& b : md_) m.workspace += vbytes(b);
    for (const auto& b : mf_) m.workspace += vbytes(b);
    return m;
}

template <class LR, class SR>
dispatch_plan_ref moe_context<LR, SR>::plan_ref(std::size_t tokens) {
    const std::size_t k = config_.router.k;
    return {tokens,
            k,
            config_.experts,
            as_span(group_sizes_),
            as_span(group_offsets_),
            span<std::int32_t>(order_.data(), tokens * k),
            span<std::int32_t>(row_of_.data(), tokens * k)};
}

template <class LR, class SR>
template <class Out>
moe_forward_result moe_context<LR, SR>::forward(const host_executor& ex, matrix_ref<const float> x,
                                                const moe_weights& w, matrix_ref<Out> out) {
    static_assert(std::is_same_v<Out, float> || std::is_same_v<Out, bf16>,
                  "octet::moe_forward: out holds float or octet::bf16");
    constexpr const char* fn = "octet::moe_forward";
    const moe_config& c = config_;
    const std::size_t d = c.d_model, ff = c.d_ff, E = c.experts, k = c.router.k;
    OCTET_REQUIRE(
        x.cols == d, fn, "x",
        detail::message("has ", x.cols, " columns but the layer has d_model = ", d, "; pass X as tokens x ", d));
    OCTET_REQUIRE(x.rows <= c.max_tokens, fn, "x",
                  detail::message("has ", x.rows, " rows (tokens) but the context was built for max_tokens = ",
                                  c.max_tokens, "; build the moe_context with a larger max_tokens"));
    detail::require_moe_matrix(x, x.rows, d, fn, "x", "tokens x d_model");
    detail::require_moe_matrix(w.router, E, d, fn, "w.router", "experts x d_model");
    detail::require_moe_matrix(w.up, E * ff, d, fn, "w.up",
                               "(experts d_ff) x d_model: the experts' d_ff x d_model matrices stacked by expert");
    if (swiglu())
        detail::require_moe_matrix(w.gate, E * ff, d, fn, "w.gate",
                                   "(experts d_ff) x d_model, the experts' gate matrices stacked; SwiGLU needs them");
    detail::require_moe_matrix(w.down, E * d, ff, fn, "w.down",
                               "(experts d_model) x d_ff: the experts' d_model x d_ff matrices stacked by expert");
    detail::require_moe_matrix(out, x.rows, d, fn, "out", "tokens x d_model");
    OCTET_REQUIRE(c.router.selection_bias.empty() || c.router.selection_bias.size() == E, fn,
                  "config.router.selection_bias",
                  detail::message("has ", c.router.selection_bias.size(), " entries; pass one per expert (", E, ")"));

    saved_ = false;  // until the new state is complete
    const std::size_t T = x.rows;
    tokens_ = T;
    moe_forward_result result;

    // 1. logits = X W_r^T (double sums, one rounding), and a copy of W_r for the backward
    parallel_for(ex, T, 16, [&](std::size_t t0, std::size_t t1) {
        for (std::size_t t = t0; t < t1; ++t)
            for (std::size_t e = 0; e < E; ++e) {
                double s = 0.0;
                for (std::size_t j = 0; j < d; ++j) s += static_cast<double>(x(t, j)) * w.router(e, j);
                logits_[t * E + e] = static_cast<float>(s);
            }
    });
    for (std::size_t e = 0; e < E; ++e)
        for (std::size_t j = 0; j < d; ++j) w_router_[e * d + j] = w.router(e, j);

    // 2. route and plan
    const matrix_ref<std::int32_t> idx(indices_.data(), T, k);
    const matrix_ref<float> rw(router_weights_.data(), T, k);
    result.router = route(ex, matrix_ref<const float>(logits_.data(), T, E), c.router, idx, rw, as_span(counts_));
    const dispatch_plan_ref plan = plan_ref(T);
    result.dispatch = plan_dispatch(matrix_ref<const std::int32_t>(idx), c.dispatch, plan);
    const std::size_t M = plan.rows();
    const span<const std::size_t> sizes(group_sizes_.data(), E);

    // 3. X once, row-wise, then into expert order; X_e^T per expert for the weight gradients
    quantize<XR>(ex, x, x_row_.ref(T, d));
    permute_quantized(ex, x_row_.cref(), plan, xh_row_.ref(sizes, d, true));
    const matrix_ref<float> xperm(md_[0].data(), M, d);
    permute_rows(ex, x, plan, xperm);
    grouped_quantize<XR>(ex, matrix_ref<const float>(xperm), sizes, grouped_quantized_ref<XR>{},
                         x_col_.ref(sizes, d, false));

    // 4. the experts' weights, each a matrix of its own: row-wise (forward) and column-wise (backward)
    grouped_quantize<WR>(ex, w.up, as_cspan(ff_sizes_), up_row_.ref(), up_col_.ref());
    if (swiglu()) grouped_quantize<WR>(ex, w.gate, as_cspan(ff_sizes_), gate_row_.ref(), gate_col_.ref());
    grouped_quantize<WR>(ex, w.down, as_cspan(d_sizes_), down_row_.ref(), down_col_.ref());
    const auto bind = [&](const grouped_quantized_tensor<WR>& t) {
        for (std::size_t e = 0; e < E; ++e) b_refs_[e] = t.cref().group(e);
        return span<const quantized_cref<WR>>(b_refs_.data(), E);
    };

    // 5. U and G
    const matrix_ref<float> U(mf_[0].data(), M, ff), G(swiglu() ? mf_[1].data() : nullptr, swiglu() ? M : 0, ff),
        H(mf_[2].data(), M, ff);
    grouped_scaled_gemm(ex, xh_row_.cref(), bind(up_row_), U);
    if (swiglu()) grouped_scaled_gemm(ex, xh_row_.cref(), bind(gate_row_), G);

    // 6. H, and U (and G) saved in FP8
    const bool glu = swiglu();
    parallel_for(ex, M, 16, [&](std::size_t r0, std::size_t r1) {
        for (std::size_t r = r0; r < r1; ++r)
            for (std::size_t j = 0; j < ff; ++j) H(r, j) = glu ? moe_swiglu(G(r, j), U(r, j)) : moe_gelu(U(r, j));
    });
    quantize<SR>(ex, matrix_ref<const float>(U), u_saved_.ref(M, ff));
    if (glu) quantize<SR>(ex, matrix_ref<const float>(G), g_saved_.ref(M, ff));

    // 7. H per expert (row-wise for the down GEMM, column-wise for dW_down), Y = H_e W_down,e^T
    grouped_quantize<XR>(ex, matrix_ref<const float>(H), sizes, xh_row_.ref(sizes, ff, true),
                         h_col_.ref(sizes, ff, false));
    const matrix_ref<float> Y(md_[1].data(), M, d);
    grouped_scaled_gemm(ex, xh_row_.cref(), bind(down_row_), Y);
    for (std::size_t i = 0; i < M * d; ++i) y_saved_[i] = to_bf16(md_[1][i]);

    // 8. combine
    combine(ex, matrix_ref<const float>(Y), matrix_ref<const float>(rw), plan, out);
    saved_ = true;
    return result;
}

template <class LR, class SR>
void moe_context<LR, SR>::backward(const host_executor& ex, matrix_ref<const float> dout, matrix_ref<float> dx,
                                   const moe_gradients& g) {
    constexpr const char* fn = "octet::moe_backward";
    const moe_config& c = config_;
    const std::size_t d = c.d_model, ff = c.d_ff, E = c.experts, k = c.router.k, T = tokens_;
    OCTET_REQUIRE(saved_, fn, "ctx",
                  "holds no forward to differentiate; call moe_forward before each moe_backward (one backward per "
                  "forward)");
    detail::require_moe_matrix(dout, T, d, fn, "dout", "the forward's tokens x d_model");
    detail::require_moe_matrix(dx, T, d, fn, "dx", "the forward's tokens x d_model");
    detail::require_moe_matrix(g.router, E, d, fn, "g.router", "experts x d_model");
    detail::require_moe_matrix(g.up, E * ff, d, fn, "g.up", "(experts d_ff) x d_model");
    if (swiglu()) detail::require_moe_matrix(g.gate, E * ff, d, fn, "g.gate", "(experts d_ff) x d_model (SwiGLU)");
    detail::require_moe_matrix(g.down, E * d, ff, fn, "g.down", "(experts d_model) x d_ff");

    const dispatch_plan_ref plan = plan_ref(T);
    const std::size_t M = plan.rows();
    const span<const std::size_t> sizes(group_sizes_.data(), E);
    const matrix_ref<const float> rw(router_weights_.data(), T, k);
    const auto bind = [&](const grouped_quantized_tensor<WR>& t) {
        for (std::size_t e = 0; e < E; ++e) b_refs_[e] = t.cref().group(e);
        return span<const quantized_cref<WR>>(b_refs_.data(), E);
    };
    const bool glu = swiglu();

    // combine: dY per kept assignment, dweights for the router
    const matrix_ref<float> dY(md_[0].data(), M, d), dweights(dweights_.data(), T, k);
    combine_backward(ex, dout, matrix_ref<const bf16>(y_saved_.data(), M, d), rw, plan, dY, dweights);

    // down: dH = dY_e W_down,e, dW_down,e = dY_e^T H_e
    const matrix_ref<float> U(mf_[0].data(), M, ff), G(glu ? mf_[1].data() : nullptr, glu ? M : 0, ff),
        dH(mf_[2].data(), M, ff);
    grouped_quantize<GR>(ex, matrix_ref<const float>(dY), sizes, g_row_.ref(sizes, d, true),
                         g_col_.ref(sizes, d, false));
    grouped_scaled_gemm(ex, g_row_.cref(), bind(down_col_), dH);
    grouped_scaled_gemm_k(ex, g_col_.cref(), h_col_.cref(), g.down);

    // the activation's backward at the saved U and G: dU into U, dG into G
    dequantize(ex, u_saved_.cref(), U);
    if (glu) dequantize(ex, g_saved_.cref(), G);
    parallel_for(ex, M, 16, [&](std::size_t r0, std::size_t r1) {
        for (std::size_t r = r0; r < r1; ++r)
            for (std::size_t j = 0; j < ff; ++j) {
                const float u = U(r, j), h = dH(r, j);
                if (glu) {
                    const float gv = G(r, j), s = 1.0f / (1.0f + std::exp(-gv));
                    U(r, j) = h * (gv * s);
                    G(r, j) = h * u * (s * (1.0f + gv * (1.0f - s)));
                } else {
                    const float cdf = 0.5f * (1.0f + std::erf(u * 0.70710678118654752f));
                    const float pdf = 0.39894228040143268f * std::exp(-0.5f * u * u);
                    U(r, j) = h * (cdf + u * pdf);
                }
            }
    });

    // up and gate: dX_e = dU_e W_up,e (+ dG_e W_gate,e), dW_up,e = dU_e^T X_e, dW_gate,e = dG_e^T X_e
    const matrix_ref<float> dXu(md_[1].data(), M, d), dXg(glu ? md_[2].data() : nullptr, glu ? M : 0, d);
    grouped_quantize<GR>(ex, matrix_ref<const float>(U), sizes, g_row_.ref(sizes, ff, true),
                         g_col_.ref(sizes, ff, false));
    grouped_scaled_gemm(ex, g_row_.cref(), bind(up_col_), dXu);
    grouped_scaled_gemm_k(ex, g_col_.cref(), x_col_.cref(), g.up);
    if (glu) {
        grouped_quantize<GR>(ex, matrix_ref<const float>(G), sizes, g_row_.ref(sizes, ff, true),
                             g_col_.ref(sizes, ff, false));
        grouped_scaled_gemm(ex, g_row_.cref(), bind(gate_col_), dXg);
        grouped_scaled_gemm_k(ex, g_col_.cref(), x_col_.cref(), g.gate);
    }

    // the router: dlogits, then dX += dlogits W_r and dW_r = dlogits^T X^
    const matrix_ref<float> dlogits(dlogits_.data(), T, E);
    route_backward(ex, matrix_ref<const float>(logits_.data(), T, E),
                   matrix_ref<const std::int32_t>(indices_.data(), T, k), matrix_ref<const float>(dweights), c.router,
                   dlogits, c.aux_loss_coef, as_cspan(counts_));
    const matrix_ref<float> xhat(md_[0].data(), T, d);
    dequantize(ex, x_row_.cref(), xhat);
    parallel_for(ex, E, 1, [&](std::size_t e0, std::size_t e1) {
        for (std::size_t e = e0; e < e1; ++e)
            for (std::size_t j = 0; j < d; ++j) {
                double s = 0.0;
                for (std::size_t t = 0; t < T; ++t) s += static_cast<double>(dlogits(t, e)) * xhat(t, j);
                g.router(e, j) = static_cast<float>(s);
            }
    });
    parallel_for(ex, T, 16, [&](std::size_t t0, std::size_t t1) {
        for (std::size_t t = t0; t < t1; ++t)
            for (std::size_t j = 0; j < d; ++j) {
                float acc = 0.0f;
                for (std::size_t s = 0; s < k; ++s) {
                    const std::int32_t r = row_of_[t * k + s];
                    if (r < 0) continue;
                    acc += dXu(static_cast<std::size_t>(r), j);
                    if (glu) acc += dXg(static_cast<std::size_t>(r), j);
                }
                double router = 0.0;
                for (std::size_t e = 0; e < E; ++e)
                    router += static_cast<double>(dlogits(t, e)) * static_cast<double>(w_router_[e * d + j]);
                dx(t, j) = acc + static_cast<float>(router);
            }
    });
    saved_ = false;
}

}  // namespace octet
