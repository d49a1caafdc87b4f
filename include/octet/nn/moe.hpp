// octet/nn/moe.hpp: an FP8 mixture-of-experts MLP block (router, top-k dispatch, per-expert
// up / gate / down projections, weighted combine), forward and backward, on the host. Built from
// octet/nn/moe_routing.hpp and octet/gemm/grouped_gemm.hpp, as nn/linear.hpp is built from
// quantize and scaled_gemm.
//
//   using LR = octet::linear_recipes::blockwise;          // 1x128 activations, 128x128 weights (DeepSeek-V3)
//   octet::moe_config cfg{/*max_tokens=*/512, /*d_model=*/256, /*d_ff=*/512, /*experts=*/8};
//   cfg.router.k = 2;  cfg.router.gate = octet::gate_mode::softmax_topk_renormalized;
//   octet::moe_context<LR> ctx(cfg);                       // every buffer, once, at its largest shape
//   auto r = octet::moe_forward(octet::on_host(), ctx, x, {w_router, w_up, w_gate, w_down}, y);
//   loss += cfg.aux_loss_coef * r.router.aux_loss;        // the load-balancing term, when used
//   octet::moe_backward(octet::on_host(), ctx, dy, dx, {dw_router, dw_up, dw_gate, dw_down});
//   ctx.memory().saved_for_backward;                       // bytes a training program's ledger books
//
// Shapes (all float, either storage order). X: tokens x d (d = d_model), W_r: experts x d, and
// the experts' weights stacked by expert: W_up and W_gate (experts ff) x d (rows [e ff, (e + 1) ff)
// are expert e's ff x d matrix, ff = d_ff), W_down (experts d) x ff. Y: tokens x d, float or bf16.
//
// Forward, in this order (each step is the named library function; the layer adds no rounding of
// its own beyond the ones listed):
//   1. logits = X W_r^T: each logit summed in double over d and rounded once to float (the router
//      runs in float: it decides which experts a token reaches, and is small).
//   2. route (config.router: k, gate_mode, selection bias) -> indices, weights, counts, L_aux;
//      plan_dispatch (config.dispatch: capacity, drop or error) -> the expert-sorted order.
//   3. X is quantized ONCE with LR's x_recipe (quantize, row-wise) and moved into expert order
//      without dequantizing (permute_quantized): the up and gate GEMMs' A operand.
//   4. Each expert's weights are quantized as matrices of their own (grouped_quantize with LR's
//      w_recipe over the experts' ff x d or d x ff blocks, row-wise for the forward and column-wise
//      for the data gradient, in one pass).
//   5. U = X_e W_up,e^T and (SwiGLU) G = X_e W_gate,e^T: grouped_scaled_gemm, float results.
//   6. H = moe_swiglu(G, U) = silu(G) * U or H = moe_gelu(U), in float (the formulas below).
//   7. H is quantized per expert with x_recipe (grouped_quantize: row-wise, and column-wise for
//      dW_down), then Y_e = H_e W_down,e^T (grouped_scaled_gemm, float).
//   8. out_t = sum_j w_tj Y[row of (t, j)] (combine: float accumulation in slot order; out is float,
//      or bf16 rounded once to nearest even).
//
// Backward, given dout (tokens x d, float):
//   combine_backward -> dY per kept assignment (float) and dweights (tokens x k). dY is quantized
//   per expert with LR's gradient recipe (row-wise and column-wise); dH = dY_e W_down,e (B = the
//   column-wise copy of W_down,e kept by the forward), dW_down,e = dY_e^T H_e (grouped_scaled_gemm_k
//   on the column-wise copies of dY and of H). The activation's backward runs in float at the saved
//   U and G (dequantized, see "Saved" below): SwiGLU dU = dH silu(G), dG = dH U s (1 + G (1 - s)),
//   s = sigmoid(G); GELU dU = dH (Phi(U) + U phi(U)). dU and dG are quantized as dY was, then
//   dX_e = dU_e W_up,e + dG_e W_gate,e and dW_up,e = dU_e^T X_e, dW_gate,e = dG_e^T X_e (X_e's
//   column-wise copy made in the forward). dX_t = the sum over t's kept slots (float, slot order:
//   acc += dX_up[row]; acc += dX_gate[row]) plus the router's term: route_backward gives dlogits
//   (with aux_loss_coef * dL_aux/dlogits when aux_loss_coef != 0, f from the forward's counts),
//   then dX_t += sum_e dlogits_te W_r[e] and dW_r = dlogits^T X^ (both summed in double, rounded
//   once), X^ the dequantized row-wise copy of X (the layer keeps no float X). A dropped assignment
//   contributes nothing; an expert without tokens gets dW = 0 exactly.
//
// Saved for the backward (moe_context::memory().saved_for_backward), FP8 unless noted: X's
// row-wise copy (tokens x d), X's and H's per-expert column-wise copies, the experts' weights'
// column-wise copies, U and G in FP8 with SR (a saved-activation recipe, nn/saved_activation.hpp:
// E4M3 with a float scale per 32 elements of a row by default; SwiGLU keeps both, GELU only U),
// the expert outputs Y in bf16 (for dweights), and in float / int: the logits, route's indices,
// weights and counts, the dispatch plan and a copy of W_r (experts x d floats).
//
// Recipes. LR is a linear_recipe (linear_recipes::blockwise, linear_recipes::mxfp8, or one of
// your own) whose activation and gradient recipes are row-local (per row or block<1, C>, one
// level of scales): a token's codes and scales are its own, so X can be quantized once and
// permuted, and no scale block mixes two experts' tokens. Current scaling, deterministic rounding,
// no Hadamard rotation. The weight recipe may be any one-level recipe (128x128 blocks, per tensor:
// each expert is quantized as a matrix of its own). moe_context's constructor throws octet::error
// for any other recipe (moe_recipe_support says why).
//
// Numerical contract (tested in tests/host/nn_moe.cpp against a float64 MoE that makes the same
// routing decisions from the same float logits and computes everything else in double on the
// unquantized inputs). Let u_X, u_W, u_G, u_S be the unit roundoffs of the x, w, gradient and saved
// formats (2^-(mantissa bits + 1): E4M3 2^-4, E5M2 2^-3). For finite inputs whose scaled values
// stay in the formats' normal range (the row-local scales make this the usual case):
//   forward   ||out - out_ref||_F <= kappa_fwd ||out_ref||_F,   kappa_fwd = 2 (u_X + u_W)
//             (+ 2^-8 for bf16 out): the quantized operands on the path are X, W_up / W_gate, H, W_down
//   backward  ||g - g_ref||_F <= kappa_bwd ||g_ref||_F,   kappa_bwd = u_X + 2 u_W + 2 u_G + u_S,
//             for g = dX, each expert's dW_up,e, dW_gate,e, dW_down,e (an expert with tokens), and
//             dW_r: the longest path (dW_up) rounds dY, W_down, the saved U / G, dU and X.
// (moe_forward_error_bound, moe_backward_error_bound.) blockwise: kappa_fwd = 1/4, kappa_bwd = 3/8;
// mxfp8 (E5M2 gradients): 1/4 and 1/2. This is a norm-wise contract, not a worst-case elementwise
// one: each rounding has a relative error of at most u per element (RMS about u / sqrt(3)) and the
// errors of the roundings on a path add up at most linearly in norm for the well-conditioned
// products of training, so the contract sums the u's of a path; the test measures 3 to 7 times
// less. The elementwise worst case (scaled_gemm.hpp's (u_A + u_B) sum_k |a_k||b_k| per GEMM) is
// about sqrt(K) times larger than the typical error and would let a wrong expert pass; this bound
// does not (the test shows routing through another expert's weights exceeds it 3 times over).
// Results are those of the library functions composed by hand in the order above, bit for bit,
// for any thread count. Non-finite inputs are data (quantize's and route's contracts).
//
// Memory: the context owns every buffer at its largest shape (max_tokens, the assignments
// max_tokens k, capped by experts x capacity), allocated once in the constructor; a step allocates
// nothing itself. quantize, the GEMMs, route and route_backward take their scratch from the
// executor's allocator (with_allocator), as they document.
//
// This header holds the types, the options and the entries; their implementation is in
// octet/nn/detail/moe.hpp, which it includes at its end.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "octet/core/executor.hpp"
#include "octet/core/matrix.hpp"
#include "octet/core/span.hpp"
#include "octet/gemm/grouped_gemm.hpp"
#include "octet/nn/linear.hpp"
#include "octet/nn/moe_routing.hpp"
#include "octet/nn/saved_activation.hpp"

namespace octet {

/// The experts' activation.
enum class moe_activation {
    swiglu,  ///< H = silu(X W_gate^T) * (X W_up^T) (DeepSeek-V3, Mixtral, Qwen-MoE)
    gelu,    ///< H = gelu(X W_up^T) (Switch, GShard); no gate weights
};

/// SwiGLU in float, as the layer computes it: (g / (1 + exp(-g))) * u.
inline float moe_swiglu(float g, float u) {
    return g / (1.0f + std::exp(-g)) * u;
}
/// GELU (the erf form) in float, as the layer computes it: 0.5 u (1 + erf(u / sqrt(2))).
inline float moe_gelu(float u) {
    return 0.5f * u * (1.0f + std::erf(u * 0.70710678118654752f));
}

/// What a moe_context is built for.
struct moe_config {
    std::size_t max_tokens = 0;  ///< the largest token count (rows of X) a call may pass
    std::size_t d_model = 0;     ///< d: columns of X, W_r, W_up, W_gate; rows of each expert's W_down
    std::size_t d_ff = 0;        ///< ff: each expert's hidden width
    std::size_t experts = 0;     ///< E
    /// k, the gate mode and DeepSeek-V3's selection bias (a span the caller owns; read at each
    /// forward, so update_expert_bias between steps takes effect).
    router_options router{};
    moe_activation activation = moe_activation::swiglu;
    /// Capacity per expert (rows) and what happens past it (drop, or octet::error).
    dispatch_options dispatch{};
    /// The weight of L_aux in the loss: the backward adds aux_loss_coef dL_aux/dlogits when != 0.
    float aux_loss_coef = 0.0f;
};

/// The layer's parameters (float, the caller's). gate is {} for GELU.
struct moe_weights {
    matrix_ref<const float> router;  ///< W_r, experts x d
    matrix_ref<const float> up;      ///< W_up, (experts ff) x d
    matrix_ref<const float> gate;    ///< W_gate, (experts ff) x d (SwiGLU), or {}
    matrix_ref<const float> down;    ///< W_down, (experts d) x ff
};

/// Where the backward writes the parameters' gradients (overwritten, not accumulated).
struct moe_gradients {
    matrix_ref<float> router;  ///< dW_r, experts x d
    matrix_ref<float> up;      ///< dW_up, (experts ff) x d
    matrix_ref<float> gate;    ///< dW_gate, (experts ff) x d (SwiGLU), or {}
    matrix_ref<float> down;    ///< dW_down, (experts d) x ff
};

/// Bytes a moe_context owns, by what they are for (a memory ledger books them).
struct moe_memory {
    std::size_t saved_for_backward = 0;  ///< what the backward reads (the list at the top of this file)
    std::size_t workspace = 0;           ///< transient copies and float buffers of one step
    std::size_t total() const { return saved_for_backward + workspace; }
};

/// What a forward reports: the router's (L_aux, non-finite tokens) and the dispatch's (kept and
/// dropped assignments).
struct moe_forward_result {
    router_result router;
    dispatch_result dispatch;
};

/// Why moe_context refuses the recipe pair (LR, SR), or "" when it takes it.
template <class LR, class SR>
const char* moe_recipe_support();

/// The forward's norm-wise relative bound kappa_fwd = 2 (u_X + u_W) (+ 2^-8 when out is bf16).
template <class LR>
double moe_forward_error_bound(bool bf16_out = false);
/// The backward's norm-wise relative bound kappa_bwd = u_X + 2 u_W + 2 u_G + u_S.
template <class LR, class SR = activation_recipes::e4m3_1x32>
double moe_backward_error_bound();

namespace detail {
/// Per-expert quantized copies whose group sizes change every step (tokens per expert), in storage
/// sized once for the largest step (implementation: detail/moe.hpp).
template <class R>
class moe_grouped_store;
}  // namespace detail

/// One MoE layer's saved copies, workspace and router state. LR: the layer's linear_recipe; SR: the
/// recipe U and G are saved with. Copyable (a copy is a snapshot); not thread-safe.
template <class LR, class SR = activation_recipes::e4m3_1x32>
class moe_context {
    static_assert(is_linear_recipe_v<LR>,
                  "octet::moe_context: LR must be an octet::linear_recipe<...> (linear_recipes::blockwise or mxfp8)");
    static_assert(is_recipe_v<SR>, "octet::moe_context: SR must be an octet::recipe<...> (see activation_recipes)");

public:
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    using GR = typename LR::g_quantize_recipe;

    /// Allocates every buffer at its largest shape. Throws octet::error for a config or recipe the
    /// layer does not take (naming the field and the fix).
    explicit moe_context(const moe_config& c);

    /// The bytes a context built for c owns, without building it.
    static moe_memory memory_for(const moe_config& c);
    /// The bytes this context owns.
    moe_memory memory() const;
    const moe_config& config() const { return config_; }

    /// out = the layer applied to x (tokens x d, tokens <= max_tokens); out is float or bf16. Keeps
    /// what the backward reads.
    template <class Out>
    moe_forward_result forward(const host_executor& ex, matrix_ref<const float> x, const moe_weights& w,
                               matrix_ref<Out> out);
    /// dX (tokens x d) and the parameters' gradients from dout (tokens x d), for the forward before
    /// it. One backward per forward.
    void backward(const host_executor& ex, matrix_ref<const float> dout, matrix_ref<float> dx, const moe_gradients& g);

    /// Whether a forward's state is held (a backward may follow), and its token count.
    bool has_saved_forward() const { return saved_; }
    std::size_t saved_tokens() const { return tokens_; }
    /// The last forward's router logits (tokens x experts, float), selection (tokens x k), weights
    /// (tokens x k), counts (experts) and plan: for monitors, and for references that must route alike.
    matrix_ref<const float> logits() const { return {logits_.data(), tokens_, config_.experts}; }
    matrix_ref<const std::int32_t> indices() const { return {indices_.data(), tokens_, config_.router.k}; }
    matrix_ref<const float> router_weights() const { return {router_weights_.data(), tokens_, config_.router.k}; }
    span<const std::size_t> counts() const { return {counts_.data(), counts_.size()}; }
    dispatch_plan_ref plan() { return plan_ref(tokens_); }
    /// Rows (kept assignments) the context holds room for: min(max_tokens k, experts capacity).
    std::size_t max_rows() const { return max_rows_; }

private:
    dispatch_plan_ref plan_ref(std::size_t tokens);
    bool swiglu() const { return config_.activation == moe_activation::swiglu; }

    moe_config config_;
    std::size_t max_rows_ = 0, tokens_ = 0;
    bool saved_ = false;
    // saved for the backward
    detail::quant_buffer<XR> x_row_;               // X's row-wise copy, tokens x d
    detail::moe_grouped_store<XR> x_col_, h_col_;  // X_e^T and H_e^T per expert (d x n_e, ff x n_e)
    grouped_quantized_tensor<WR> up_col_, gate_col_, down_col_;
    detail::quant_buffer<SR> u_saved_, g_saved_;
    std::vector<bf16> y_saved_;
    std::vector<float> logits_, router_weights_, w_router_;
    std::vector<std::int32_t> indices_, order_, row_of_;
    std::vector<std::size_t> counts_, group_sizes_, group_offsets_;
    // workspace
    detail::moe_grouped_store<XR> xh_row_;         // X_e, then H_e, row-wise per expert
    detail::moe_grouped_store<GR> g_row_, g_col_;  // dY_e, then dU_e, then dG_e: both copies
    grouped_quantized_tensor<WR> up_row_, gate_row_, down_row_;
    std::vector<quantized_cref<WR>> b_refs_;  // one expert's copy each, bound per GEMM
    std::vector<std::size_t> ff_sizes_, d_sizes_;
    std::vector<float> md_[3], mf_[3];  // M x d and M x ff float buffers
    std::vector<float> dlogits_, dweights_;
};

/// The forward of ctx's layer (moe_context::forward).
template <class LR, class SR, class Out>
moe_forward_result moe_forward(const host_executor& ex, moe_context<LR, SR>& ctx, matrix_ref<const float> x,
                               const moe_weights& w, matrix_ref<Out> out) {
    return ctx.forward(ex, x, w, out);
}

/// The backward of ctx's layer (moe_context::backward).
template <class LR, class SR>
void moe_backward(const host_executor& ex, moe_context<LR, SR>& ctx, matrix_ref<const float> dout, matrix_ref<float> dx,
                  const moe_gradients& g) {
    ctx.backward(ex, dout, dx, g);
}

}  // namespace octet

#include "octet/nn/detail/moe.hpp"  // IWYU pragma: export
