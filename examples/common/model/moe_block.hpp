// examples/common/model/moe_block.hpp: the transformer's mixture-of-experts MLP (../model.hpp):
// a router, each token's top-k experts, GELU experts, the weighted combine; forward and backward.
//
//   out = sum_j w_tj down_e(gelu(up_e(x_t)))   over token t's k selected experts e = S_tj
//
// Two placements of the same layer, chosen by the recipe's linear mode:
//   float32           octet's routing functions (route, plan_dispatch, permute_rows, combine and
//                     their backwards: octet/nn/moe_routing.hpp) around the model's float32 GEMM,
//                     one product per expert;
//   blockwise, mxfp8  octet::moe_context<LR> (octet/nn/moe.hpp): X quantized once and dispatched as
//                     codes and scales, the experts' grouped FP8 GEMMs, the router in float.
// Both compute the router's logits summed in double and rounded once, route with the same options
// (k = 1: Switch's softmax_topk; k > 1: softmax_topk_renormalized, as DeepSeek-V3 and Qwen-MoE),
// add the Switch / GShard load-balancing loss (config.moe_aux_loss L_aux, through route_backward)
// and use GELU's erf form (octet::moe_gelu). No capacity: no token is dropped (the dropped count is
// measured and reported all the same). Raising precision (recovery) does not change the experts'
// placement: an FP8 block stays FP8 in a raised step.
//
// Memory: what a block keeps for its backward (activations) and its own work buffers
// (temporaries) are listed once, in memory_of, which the allocation and the ledger both read; the
// float32 placement's transient rows live in one moe_scratch per model, shared by its blocks. The
// octet operations take their scratch from the model's arena (the executor's allocator), sized
// with scratch_bytes.
#pragma once

#include "base.hpp"
#include "kernels.hpp"
#include "linear_layers.hpp"

#include <octet/nn/moe.hpp>
#include <octet/nn/moe_routing.hpp>

namespace common {

/// A mixture-of-experts MLP's shape: tokens, d_model, each expert's hidden width, experts, top-k.
struct moe_shape {
    std::size_t max_tokens = 0, d = 0, ff = 0, experts = 0, k = 0;
    float aux_loss = 0.0f;                                   ///< the load-balancing loss's weight
    std::size_t max_rows() const { return max_tokens * k; }  ///< assignments (no capacity: every one kept)
    std::size_t params() const { return experts * d + 2 * experts * ff * d; }
};

/// The routing options both placements use.
inline octet::router_options moe_router(std::size_t k) {
    octet::router_options r;
    r.k = k;
    r.gate = k == 1 ? octet::gate_mode::softmax_topk : octet::gate_mode::softmax_topk_renormalized;
    return r;
}

/// The octet::moe_config of a shape (GELU experts, no capacity).
inline octet::moe_config moe_config_of(const moe_shape& s) {
    octet::moe_config c;
    c.max_tokens = s.max_tokens, c.d_model = s.d, c.d_ff = s.ff, c.experts = s.experts;
    c.router = moe_router(s.k);
    c.activation = octet::moe_activation::gelu;
    c.aux_loss_coef = s.aux_loss;
    return c;
}

/// Whether the mixture of experts runs in `mode` (the recipe's linear mode), and if not, why.
inline const char* moe_mode_refusal(linear_mode mode) {
    if (mode == linear_mode::float32 || mode == linear_mode::blockwise || mode == linear_mode::mxfp8) return "";
    return "the mixture of experts runs in float32, blockwise (1x128 activations, 128x128 weights) or mxfp8; "
           "use a recipe with one of these linear modes";
}

/// Bytes a block of `mode` and shape keeps for the backward and works in (its own), and the floats
/// of the per-model moe_scratch its placement needs.
struct moe_block_memory {
    double activations = 0, temporaries = 0;
    std::size_t scratch_floats = 0;
};

/// The float32 placement's transient rows (experts' order), shared by a model's blocks: the
/// permuted X, H, dY, dH, dX per row, a transpose, dweights and dlogits.
struct moe_scratch {
    static std::size_t floats(const moe_shape& s) {
        const std::size_t R = s.max_rows(), d = s.d, F = s.ff;
        return 3 * R * d + 2 * R * F + std::max(R * std::max(d, F), F * d) + s.max_tokens * (s.k + s.experts);
    }
    metered_vector<float> v;
    float *xs = nullptr, *h = nullptr, *dy = nullptr, *dh = nullptr, *dxs = nullptr, *tr = nullptr, *dweights = nullptr,
          *dlogits = nullptr;
    moe_scratch(memory_meter& m, const moe_shape& s)
        : v(make_metered<float>(m, octet::memory_category::temporaries, floats(s))) {
        const std::size_t R = s.max_rows(), d = s.d, F = s.ff;
        float* at = v.data();
        auto take = [&](std::size_t n) {
            float* p = at;
            at += n;
            return p;
        };
        xs = take(R * d), h = take(R * F), dy = take(R * d), dh = take(R * F), dxs = take(R * d);
        tr = take(std::max(R * std::max(d, F), F * d));
        dweights = take(s.max_tokens * s.k), dlogits = take(s.max_tokens * s.experts);
    }
};

/// What a mixture-of-experts block reports about a forward.
struct moe_forward_stats {
    std::vector<std::size_t> counts;  ///< assignments per expert
    std::size_t rows = 0, dropped = 0;
    double aux_loss = 0;
    octet::permute_bytes dispatch;  ///< the rows' FP8 codes and scales (the recipe's, else blockwise's) and bf16
};

class moe_block {
public:
    virtual ~moe_block() = default;
    /// out (n x d) = the layer at x (n x d); w: router, up, down (parameter_layout's, contiguous).
    virtual moe_forward_stats forward(octet::host_executor ex, const float* x, std::size_t n, const float* w,
                                      float* out) = 0;
    /// dx (n x d, overwritten) and dw (router, up, down, overwritten) from dout, for the last forward.
    virtual void backward(octet::host_executor ex, const float* dout, std::size_t n, const float* w, float* dx,
                          float* dw) = 0;

protected:
    struct weights {
        const float *router, *up, *down;
    };
    static weights split(const moe_shape& s, const float* w) {
        return {w, w + s.experts * s.d, w + s.experts * s.d + s.experts * s.ff * s.d};
    }
    static octet::matrix_ref<const float> cm(const float* p, std::size_t r, std::size_t c) { return {p, r, c}; }
    static octet::matrix_ref<float> mm(float* p, std::size_t r, std::size_t c) { return {p, r, c}; }
    /// logits (n x E) = x W_r^T, each summed in double and rounded once.
    static void router_logits(octet::host_executor ex, const moe_shape& s, const float* x, std::size_t n,
                              const float* wr, float* logits) {
        octet::parallel_for(ex, n, 16, [&](std::size_t b, std::size_t e) {
            for (std::size_t t = b; t < e; ++t)
                for (std::size_t x_e = 0; x_e < s.experts; ++x_e) {
                    double acc = 0;
                    for (std::size_t c = 0; c < s.d; ++c)
                        acc += static_cast<double>(x[t * s.d + c]) * wr[x_e * s.d + c];
                    logits[t * s.experts + x_e] = static_cast<float>(acc);
                }
        });
    }
};

/// The float32 placement.
class float32_moe final : public moe_block {
public:
    static moe_block_memory memory_of(const moe_shape& s) {
        const double N = static_cast<double>(s.max_tokens), R = static_cast<double>(s.max_rows());
        const double E = static_cast<double>(s.experts), k = static_cast<double>(s.k);
        moe_block_memory m;
        // x, logits, weights, U, Y (float); indices, order, row_of (int32); counts, sizes, offsets
        m.activations = 4.0 * (N * static_cast<double>(s.d) + N * E + N * k + R * static_cast<double>(s.ff) +
                               R * static_cast<double>(s.d)) +
                        4.0 * 3 * N * k + static_cast<double>(sizeof(std::size_t)) * (3 * E + 1);
        m.scratch_floats = moe_scratch::floats(s);
        return m;
    }

    float32_moe(memory_meter& m, const moe_shape& s, moe_scratch& scratch)
        : s_(s),
          w_(&scratch),
          x_(act<float>(m, s.max_tokens * s.d)),
          logits_(act<float>(m, s.max_tokens * s.experts)),
          weights_(act<float>(m, s.max_tokens * s.k)),
          u_(act<float>(m, s.max_rows() * s.ff)),
          y_(act<float>(m, s.max_rows() * s.d)),
          indices_(act<std::int32_t>(m, s.max_tokens * s.k)),
          order_(act<std::int32_t>(m, s.max_tokens * s.k)),
          row_of_(act<std::int32_t>(m, s.max_tokens * s.k)),
          counts_(act<std::size_t>(m, s.experts)),
          sizes_(act<std::size_t>(m, s.experts)),
          offsets_(act<std::size_t>(m, s.experts + 1)) {}

    moe_forward_stats forward(octet::host_executor ex, const float* x, std::size_t n, const float* w,
                              float* out) override {
        const std::size_t d = s_.d, F = s_.ff, E = s_.experts, k = s_.k;
        const weights W = split(s_, w);
        n_ = n;
        std::copy(x, x + n * d, x_.data());
        router_logits(ex, s_, x, n, W.router, logits_.data());
        moe_forward_stats st;
        st.aux_loss = octet::route(ex, cm(logits_.data(), n, E), moe_router(k),
                                   octet::matrix_ref<std::int32_t>(indices_.data(), n, k), mm(weights_.data(), n, k),
                                   octet::span<std::size_t>(counts_.data(), E))
                          .aux_loss;
        const auto plan = plan_ref();
        const auto dr = octet::plan_dispatch(octet::matrix_ref<const std::int32_t>(indices_.data(), n, k), {}, plan);
        const std::size_t R = plan.rows();
        octet::permute_rows(ex, cm(x, n, d), plan, mm(w_->xs, R, d));
        for (std::size_t e = 0; e < E; ++e) {  // U_e = X_e W_up,e^T, H = gelu(U), Y_e = H_e W_down,e^T
            const std::size_t r0 = offsets_[e], ne = sizes_[e];
            if (ne == 0) continue;
            transpose(ex, W.up + e * F * d, F, d, w_->tr);
            gemm(ex, w_->xs + r0 * d, d, w_->tr, F, u_.data() + r0 * F, F, ne, F, d);
        }
        gelu(ex, u_.data(), w_->h, R * F);
        for (std::size_t e = 0; e < E; ++e) {
            const std::size_t r0 = offsets_[e], ne = sizes_[e];
            if (ne == 0) continue;
            transpose(ex, W.down + e * d * F, d, F, w_->tr);
            gemm(ex, w_->h + r0 * F, F, w_->tr, d, y_.data() + r0 * d, d, ne, d, F);
        }
        octet::combine(ex, cm(y_.data(), R, d), cm(weights_.data(), n, k), plan, mm(out, n, d));
        st.counts.assign(counts_.begin(), counts_.end());
        st.rows = dr.rows, st.dropped = dr.dropped;
        st.dispatch = octet::permute_traffic<octet::linear_recipes::blockwise::x_recipe>(R, d);
        return st;
    }

    void backward(octet::host_executor ex, const float* dout, std::size_t n, const float* w, float* dx,
                  float* dw) override {
        OCTET_REQUIRE(n == n_, "common::float32_moe::backward", "n",
                      octet::detail::message("is ", n, " but the last forward had ", n_, " tokens"));
        const std::size_t d = s_.d, F = s_.ff, E = s_.experts, k = s_.k;
        const weights W = split(s_, w);
        float* dwr = dw;
        float* dwu = dw + E * d;
        float* dwd = dwu + E * F * d;
        const auto plan = plan_ref();
        const std::size_t R = plan.rows();
        octet::combine_backward(ex, cm(dout, n, d), cm(y_.data(), R, d), cm(weights_.data(), n, k), plan,
                                mm(w_->dy, R, d), mm(w_->dweights, n, k));
        gelu(ex, u_.data(), w_->h, R * F);     // H again, from the saved U
        for (std::size_t e = 0; e < E; ++e) {  // dH_e = dY_e W_down,e;  dW_down,e = dY_e^T H_e
            const std::size_t r0 = offsets_[e], ne = sizes_[e];
            float* dwd_e = dwd + e * d * F;
            if (ne == 0) {
                std::fill(dwd_e, dwd_e + d * F, 0.0f);
                continue;
            }
            gemm(ex, w_->dy + r0 * d, d, W.down + e * d * F, F, w_->dh + r0 * F, F, ne, F, d);
            transpose(ex, w_->dy + r0 * d, ne, d, w_->tr);
            gemm(ex, w_->tr, ne, w_->h + r0 * F, F, dwd_e, F, d, F, ne);
        }
        gelu_grad(ex, u_.data(), w_->dh, R * F);  // dU = dH gelu'(U), in place
        octet::permute_rows(ex, cm(x_.data(), n, d), plan, mm(w_->xs, R, d));
        for (std::size_t e = 0; e < E; ++e) {  // dX_e = dU_e W_up,e;  dW_up,e = dU_e^T X_e
            const std::size_t r0 = offsets_[e], ne = sizes_[e];
            float* dwu_e = dwu + e * F * d;
            if (ne == 0) {
                std::fill(dwu_e, dwu_e + F * d, 0.0f);
                continue;
            }
            gemm(ex, w_->dh + r0 * F, F, W.up + e * F * d, d, w_->dxs + r0 * d, d, ne, d, F);
            transpose(ex, w_->dh + r0 * F, ne, F, w_->tr);
            gemm(ex, w_->tr, ne, w_->xs + r0 * d, d, dwu_e, d, F, d, ne);
        }
        // the router: dlogits from dweights (and L_aux), then dX += dlogits W_r, dW_r = dlogits^T X
        octet::route_backward(ex, cm(logits_.data(), n, E),
                              octet::matrix_ref<const std::int32_t>(indices_.data(), n, k), cm(w_->dweights, n, k),
                              moe_router(k), mm(w_->dlogits, n, E), s_.aux_loss,
                              octet::span<const std::size_t>(counts_.data(), E));
        octet::parallel_for(ex, n, 16, [&](std::size_t b, std::size_t e_end) {
            for (std::size_t t = b; t < e_end; ++t) {
                float* o = dx + t * d;
                std::fill(o, o + d, 0.0f);
                for (std::size_t j = 0; j < k; ++j) {  // each kept slot's dX row, in slot order
                    const std::int32_t r = row_of_[t * k + j];
                    if (r < 0) continue;
                    const float* src = w_->dxs + static_cast<std::size_t>(r) * d;
                    for (std::size_t c = 0; c < d; ++c) o[c] += src[c];
                }
                const float* g = w_->dlogits + t * E;
                for (std::size_t c = 0; c < d; ++c) {
                    double acc = 0;
                    for (std::size_t x_e = 0; x_e < E; ++x_e)
                        acc += static_cast<double>(g[x_e]) * W.router[x_e * d + c];
                    o[c] = static_cast<float>(o[c] + acc);
                }
            }
        });
        octet::parallel_for(ex, E, 1, [&](std::size_t b, std::size_t e_end) {
            for (std::size_t x_e = b; x_e < e_end; ++x_e)
                for (std::size_t c = 0; c < d; ++c) {
                    double acc = 0;
                    for (std::size_t t = 0; t < n; ++t)
                        acc += static_cast<double>(w_->dlogits[t * E + x_e]) * x_[t * d + c];
                    dwr[x_e * d + c] = static_cast<float>(acc);
                }
        });
    }

private:
    template <class T>
    static metered_vector<T> act(memory_meter& m, std::size_t n) {
        return make_metered<T>(m, octet::memory_category::activations, n);
    }
    octet::dispatch_plan_ref plan_ref() {
        const std::size_t nk = n_ * s_.k;
        return {n_,
                s_.k,
                s_.experts,
                octet::span<std::size_t>(sizes_.data(), s_.experts),
                octet::span<std::size_t>(offsets_.data(), s_.experts + 1),
                octet::span<std::int32_t>(order_.data(), nk),
                octet::span<std::int32_t>(row_of_.data(), nk)};
    }
    static void gelu(octet::host_executor ex, const float* u, float* h, std::size_t count) {
        octet::parallel_for(ex, count, 1 << 14, [&](std::size_t b, std::size_t e) {
            for (std::size_t i = b; i < e; ++i) h[i] = octet::moe_gelu(u[i]);
        });
    }
    /// dh *= gelu'(u) = Phi(u) + u phi(u) (the erf form's derivative), in place.
    static void gelu_grad(octet::host_executor ex, const float* u, float* dh, std::size_t count) {
        octet::parallel_for(ex, count, 1 << 14, [&](std::size_t b, std::size_t e) {
            for (std::size_t i = b; i < e; ++i) {
                const float v = u[i];
                const float cdf = 0.5f * (1.0f + std::erf(v * 0.70710678118654752f));
                const float pdf = 0.39894228040143268f * std::exp(-0.5f * v * v);
                dh[i] *= cdf + v * pdf;
            }
        });
    }

    moe_shape s_;
    moe_scratch* w_;
    std::size_t n_ = 0;
    metered_vector<float> x_, logits_, weights_, u_, y_;
    metered_vector<std::int32_t> indices_, order_, row_of_;
    metered_vector<std::size_t> counts_, sizes_, offsets_;
};

/// The FP8 placement: octet::moe_context<LR>, its buffers booked (saved for the backward:
/// activations; its workspace: temporaries).
template <class LR>
class fp8_moe final : public moe_block {
public:
    static moe_block_memory memory_of(const moe_shape& s) {
        const octet::moe_memory m = octet::moe_context<LR>::memory_for(moe_config_of(s));
        return {static_cast<double>(m.saved_for_backward), static_cast<double>(m.workspace), 0};
    }
    /// The largest scratch block one of the layer's octet operations takes from the executor's
    /// allocator on `ex` (quantize's, the GEMMs', route's and route_backward's queries at the largest shapes).
    static std::size_t scratch_bytes(const octet::host_executor& ex, const moe_shape& s) {
        using XR = typename LR::x_recipe;
        using WR = typename LR::w_recipe;
        using GR = typename LR::g_quantize_recipe;
        using quant = octet::detail::quant_backend<octet::host_executor>;
        const std::size_t T = s.max_tokens, M = s.max_rows(), d = s.d, F = s.ff, wide = std::max(d, F);
        const auto rows = [](std::size_t r, std::size_t c) { return octet::matrix_ref<const float>(nullptr, r, c); };
        const auto gemm_bytes = [&](std::size_t m, std::size_t n, std::size_t kk, std::size_t a_cols,
                                    std::size_t b_cols) {
            return octet::detail::host_gemm_scratch_bytes(ex, m, n, kk, a_cols, b_cols,
                                                          octet::gemm_options{}.promotion_interval);
        };
        const auto cols = [](auto tag, std::size_t r, std::size_t c) {
            return octet::quant_layout_of<decltype(tag)>::make(r, c).block_cols;
        };
        return std::max({quant::scratch_bytes<XR, float>(ex, rows(T, d), true, false),
                         quant::scratch_bytes<XR, float>(ex, rows(M, wide), true, true),
                         quant::scratch_bytes<GR, float>(ex, rows(M, wide), true, true),
                         quant::scratch_bytes<WR, float>(ex, rows(F, d), true, true),
                         quant::scratch_bytes<WR, float>(ex, rows(d, F), true, true),
                         quant::scratch_bytes<octet::activation_recipes::e4m3_1x32, float>(ex, rows(M, F), true, false),
                         gemm_bytes(M, F, d, cols(XR{}, M, d), cols(WR{}, F, d)),  // U, and dX (GR: as wide)
                         gemm_bytes(M, d, F, cols(XR{}, M, F), cols(WR{}, d, F)),  // Y, and dH
                         gemm_bytes(M, F, d, cols(GR{}, M, d), cols(WR{}, F, d)),
                         gemm_bytes(M, d, F, cols(GR{}, M, F), cols(WR{}, d, F)),
                         gemm_bytes(d, F, M, cols(GR{}, d, M), cols(XR{}, F, M)),  // dW_down
                         gemm_bytes(F, d, M, cols(GR{}, F, M), cols(XR{}, d, M)),  // dW_up
                         octet::route_scratch_bytes(T, s.experts),
                         octet::route_backward_scratch_bytes(ex, T, s.experts)});
    }

    fp8_moe(memory_meter& m, const moe_shape& s)
        : s_(s),
          ctx_(moe_config_of(s)),
          saved_(m, octet::memory_category::activations, static_cast<double>(ctx_.memory().saved_for_backward)),
          work_(m, octet::memory_category::temporaries, static_cast<double>(ctx_.memory().workspace)) {}

    moe_forward_stats forward(octet::host_executor ex, const float* x, std::size_t n, const float* w,
                              float* out) override {
        const std::size_t d = s_.d, F = s_.ff, E = s_.experts;
        const weights W = split(s_, w);
        const octet::moe_weights mw{cm(W.router, E, d), cm(W.up, E * F, d), {}, cm(W.down, E * d, F)};
        const auto r = octet::moe_forward(ex, ctx_, cm(x, n, d), mw, mm(out, n, d));
        moe_forward_stats st;
        st.counts.assign(ctx_.counts().begin(), ctx_.counts().end());
        st.rows = r.dispatch.rows, st.dropped = r.dispatch.dropped, st.aux_loss = r.router.aux_loss;
        st.dispatch = octet::permute_traffic<typename LR::x_recipe>(r.dispatch.rows, d);
        return st;
    }
    void backward(octet::host_executor ex, const float* dout, std::size_t n, const float*, float* dx,
                  float* dw) override {
        const std::size_t d = s_.d, F = s_.ff, E = s_.experts;
        const octet::moe_gradients g{mm(dw, E, d), mm(dw + E * d, E * F, d), {}, mm(dw + E * d + E * F * d, E * d, F)};
        octet::moe_backward(ex, ctx_, cm(dout, n, d), mm(dx, n, d), g);
    }

private:
    moe_shape s_;
    octet::moe_context<LR> ctx_;
    meter_booking saved_, work_;
};

/// Calls f(tag) with the moe_context recipe of an FP8 mode (blockwise, mxfp8); false for float32.
template <class F>
bool with_moe_recipe(linear_mode mode, F&& f) {
    if (mode == linear_mode::blockwise) {
        f(linear_recipe_tag<octet::linear_recipes::blockwise>{});
        return true;
    }
    if (mode == linear_mode::mxfp8) {
        f(linear_recipe_tag<octet::linear_recipes::mxfp8>{});
        return true;
    }
    return false;
}

/// The memory a block of `mode` books (moe_block_memory).
inline moe_block_memory moe_memory_of(linear_mode mode, const moe_shape& s) {
    moe_block_memory m = float32_moe::memory_of(s);
    with_moe_recipe(mode, [&](auto tag) { m = fp8_moe<typename decltype(tag)::type>::memory_of(s); });
    return m;
}

/// The largest scratch block a block of `mode` takes from the executor's allocator.
inline std::size_t moe_scratch_bytes(linear_mode mode, const octet::host_executor& ex, const moe_shape& s) {
    std::size_t b = std::max(octet::route_scratch_bytes(s.max_tokens, s.experts),
                             octet::route_backward_scratch_bytes(ex, s.max_tokens, s.experts));
    with_moe_recipe(mode, [&](auto tag) { b = fp8_moe<typename decltype(tag)::type>::scratch_bytes(ex, s); });
    return b;
}

/// A block of `mode` (moe_mode_refusal must be "" for it); `scratch` serves the float32 placement.
inline std::unique_ptr<moe_block> make_moe_block(memory_meter& m, linear_mode mode, const moe_shape& s,
                                                 moe_scratch* scratch) {
    std::unique_ptr<moe_block> b;
    if (with_moe_recipe(mode, [&](auto tag) { b = std::make_unique<fp8_moe<typename decltype(tag)::type>>(m, s); }))
        return b;
    OCTET_REQUIRE(mode == linear_mode::float32 && scratch != nullptr, "common::make_moe_block", "mode",
                  moe_mode_refusal(mode));
    return std::make_unique<float32_moe>(m, s, *scratch);
}

}  // namespace common
