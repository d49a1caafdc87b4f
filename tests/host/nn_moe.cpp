// The FP8 mixture-of-experts layer (octet/nn/moe.hpp), on the host. Oracles: a float64 MoE written
// here (the same routing decisions from the layer's float logits: top-k, weights in every gate mode,
// capacity; the experts' MLPs, the combine and every gradient in double on the unquantized inputs,
// the router's backward as the softmax's Jacobian), checked against the header's norm-wise bounds,
// and the bounds shown to catch a wrong expert; bit for bit, the layer against the library's own
// pieces composed by hand; edge cases (an expert with 0 tokens and one with 1, zero rows, 1e-6
// inputs, capacity), the auxiliary loss's gradient as the difference of two backwards, the memory
// query, no allocation behind the caller, and bad arguments.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "octet/nn/moe.hpp"
#include "support/counting_allocator.hpp"
#include "support/random.hpp"

namespace nn_moe_test {
using namespace octet;

std::vector<float> normal(std::mt19937_64& g, std::size_t n, float scale) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

/// A layer's shape, options and parameters (float), and an output gradient.
struct problem {
    std::size_t T = 0, d = 0, ff = 0, E = 0;
    moe_config cfg;
    std::vector<float> x, wr, wu, wg, wd, dout;

    problem(std::uint64_t salt, std::size_t T_, std::size_t d_, std::size_t ff_, std::size_t E_, std::size_t k,
            gate_mode gate, moe_activation act)
        : T(T_), d(d_), ff(ff_), E(E_) {
        cfg.max_tokens = T;
        cfg.d_model = d;
        cfg.d_ff = ff;
        cfg.experts = E;
        cfg.router.k = k;
        cfg.router.gate = gate;
        cfg.activation = act;
        auto g = octet_test::rng(salt);
        x = normal(g, T * d, 1.0f);
        wr = normal(g, E * d, 1.0f / std::sqrt(static_cast<float>(d)));
        wu = normal(g, E * ff * d, 1.0f / std::sqrt(static_cast<float>(d)));
        wg = normal(g, E * ff * d, 1.0f / std::sqrt(static_cast<float>(d)));
        wd = normal(g, E * d * ff, 1.0f / std::sqrt(static_cast<float>(ff)));
        dout = normal(g, T * d, 1.0f);
    }
    bool glu() const { return cfg.activation == moe_activation::swiglu; }
    moe_weights weights() const {
        return {{wr.data(), E, d},
                {wu.data(), E * ff, d},
                glu() ? matrix_ref<const float>(wg.data(), E * ff, d) : matrix_ref<const float>{},
                {wd.data(), E * d, ff}};
    }
};

/// What the layer gives: the forward's output and every gradient.
struct layer_out {
    std::vector<float> out, dx, dwr, dwu, dwg, dwd;
    moe_forward_result fwd;
};

template <class LR>
layer_out run_layer(const host_executor& ex, moe_context<LR>& ctx, const problem& p, bool backward = true) {
    layer_out o;
    o.out.assign(p.T * p.d, NAN);  // poisoned: every element must be written
    o.fwd = moe_forward(ex, ctx, matrix_ref<const float>(p.x.data(), p.T, p.d), p.weights(),
                        matrix_ref<float>(o.out.data(), p.T, p.d));
    if (!backward) return o;
    o.dx.assign(p.T * p.d, NAN);
    o.dwr.assign(p.E * p.d, NAN);
    o.dwu.assign(p.E * p.ff * p.d, NAN);
    o.dwg.assign(p.glu() ? p.E * p.ff * p.d : 0, NAN);
    o.dwd.assign(p.E * p.d * p.ff, NAN);
    moe_gradients g{{o.dwr.data(), p.E, p.d},
                    {o.dwu.data(), p.E * p.ff, p.d},
                    p.glu() ? matrix_ref<float>(o.dwg.data(), p.E * p.ff, p.d) : matrix_ref<float>{},
                    {o.dwd.data(), p.E * p.d, p.ff}};
    moe_backward(ex, ctx, matrix_ref<const float>(p.dout.data(), p.T, p.d), matrix_ref<float>(o.dx.data(), p.T, p.d),
                 g);
    return o;
}

// ---- the float64 reference ----------------------------------------------------------------------

struct reference {
    std::vector<std::int32_t> idx;  // tokens x k, its own top-k
    std::vector<double> out, dx, dwr, dwu, dwg, dwd;
};

double silu64(double g) {
    return g / (1.0 + std::exp(-g));
}
double gelu64(double u) {
    return 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0)));
}

/// The MoE in double on the unquantized inputs; routes from `logits` (the layer's floats) by the same
/// rules (top-k by the logit, or by p + bias, the lower index on ties; capacity in (token, slot) order).
/// `expert_shift` uses expert (e + shift) mod E's weights for expert e: a deliberately wrong layer.
reference run_reference(const problem& p, const float* logits, float aux_coef = 0.0f, std::size_t expert_shift = 0) {
    const std::size_t T = p.T, d = p.d, ff = p.ff, E = p.E, k = p.cfg.router.k;
    const gate_mode gate = p.cfg.router.gate;
    const bool glu = p.glu();
    reference r;
    r.idx.assign(T * k, -1);
    r.out.assign(T * d, 0.0);
    r.dx.assign(T * d, 0.0);
    r.dwr.assign(E * d, 0.0);
    r.dwu.assign(E * ff * d, 0.0);
    r.dwg.assign(glu ? E * ff * d : 0, 0.0);
    r.dwd.assign(E * d * ff, 0.0);
    std::vector<std::size_t> counts(E, 0), kept(E, 0);
    std::vector<std::vector<double>> P(T, std::vector<double>(E)), W(T, std::vector<double>(k));
    std::vector<std::vector<bool>> keep(T, std::vector<bool>(k));
    for (std::size_t t = 0; t < T; ++t) {
        const float* l = logits + t * E;
        double m = -INFINITY, z = 0.0;
        for (std::size_t e = 0; e < E; ++e) m = std::max<double>(m, l[e]);
        for (std::size_t e = 0; e < E; ++e) z += P[t][e] = std::exp(static_cast<double>(l[e]) - m);
        for (auto& v : P[t]) v /= z;
        std::vector<double> score(E);
        for (std::size_t e = 0; e < E; ++e)
            score[e] = p.cfg.router.selection_bias.empty() ? l[e] : P[t][e] + p.cfg.router.selection_bias[e];
        std::vector<std::size_t> id(E);
        std::iota(id.begin(), id.end(), std::size_t{0});
        std::stable_sort(id.begin(), id.end(), [&](std::size_t a, std::size_t b) { return score[a] > score[b]; });
        double zs = 0.0, ms = -INFINITY, zt = 0.0;
        for (std::size_t j = 0; j < k; ++j) {
            r.idx[t * k + j] = static_cast<std::int32_t>(id[j]);
            ++counts[id[j]];
            zs += P[t][id[j]];
            ms = std::max<double>(ms, l[id[j]]);
        }
        for (std::size_t j = 0; j < k; ++j) zt += std::exp(static_cast<double>(l[id[j]]) - ms);
        for (std::size_t j = 0; j < k; ++j)
            W[t][j] = gate == gate_mode::softmax_topk ? P[t][id[j]]
                      : gate == gate_mode::softmax_topk_renormalized
                          ? P[t][id[j]] / zs
                          : std::exp(static_cast<double>(l[id[j]]) - ms) / zt;
    }
    for (std::size_t t = 0; t < T; ++t)
        for (std::size_t j = 0; j < k; ++j) {
            const auto e = static_cast<std::size_t>(r.idx[t * k + j]);
            keep[t][j] = kept[e] < p.cfg.dispatch.capacity;
            kept[e] += keep[t][j];
        }

    std::vector<double> u(ff), gv(ff), h(ff), y(d), dh(ff), du(ff), dg(ff);
    std::vector<std::vector<double>> dweights(T, std::vector<double>(k, 0.0));
    for (std::size_t t = 0; t < T; ++t) {
        const float* xt = p.x.data() + t * d;
        const float* dot = p.dout.data() + t * d;
        for (std::size_t j = 0; j < k; ++j) {
            if (!keep[t][j]) continue;
            const auto e = static_cast<std::size_t>(r.idx[t * k + j]);
            const std::size_t we = (e + expert_shift) % E;  // whose weights
            const float* Wu = p.wu.data() + we * ff * d;
            const float* Wg = p.wg.data() + we * ff * d;
            const float* Wd = p.wd.data() + we * d * ff;
            for (std::size_t i = 0; i < ff; ++i) {
                double su = 0.0, sg = 0.0;
                for (std::size_t c = 0; c < d; ++c) {
                    su += static_cast<double>(Wu[i * d + c]) * xt[c];
                    if (glu) sg += static_cast<double>(Wg[i * d + c]) * xt[c];
                }
                u[i] = su;
                gv[i] = sg;
                h[i] = glu ? silu64(sg) * su : gelu64(su);
            }
            double dw = 0.0;
            for (std::size_t c = 0; c < d; ++c) {
                double s = 0.0;
                for (std::size_t i = 0; i < ff; ++i) s += static_cast<double>(Wd[c * ff + i]) * h[i];
                y[c] = s;
                r.out[t * d + c] += W[t][j] * s;
                dw += static_cast<double>(dot[c]) * s;
            }
            dweights[t][j] = dw;
            // experts' backward, dY = w dout
            std::fill(dh.begin(), dh.end(), 0.0);
            for (std::size_t c = 0; c < d; ++c) {
                const double dyc = W[t][j] * dot[c];
                for (std::size_t i = 0; i < ff; ++i) {
                    dh[i] += dyc * Wd[c * ff + i];
                    r.dwd[e * d * ff + c * ff + i] += dyc * h[i];
                }
            }
            for (std::size_t i = 0; i < ff; ++i) {
                if (glu) {
                    const double s = 1.0 / (1.0 + std::exp(-gv[i]));
                    du[i] = dh[i] * silu64(gv[i]);
                    dg[i] = dh[i] * u[i] * s * (1.0 + gv[i] * (1.0 - s));
                } else {
                    const double pdf = std::exp(-0.5 * u[i] * u[i]) / std::sqrt(2.0 * M_PI);
                    du[i] = dh[i] * (0.5 * (1.0 + std::erf(u[i] / std::sqrt(2.0))) + u[i] * pdf);
                }
                for (std::size_t c = 0; c < d; ++c) {
                    r.dwu[e * ff * d + i * d + c] += du[i] * xt[c];
                    r.dx[t * d + c] += du[i] * Wu[i * d + c];
                    if (glu) {
                        r.dwg[e * ff * d + i * d + c] += dg[i] * xt[c];
                        r.dx[t * d + c] += dg[i] * Wg[i * d + c];
                    }
                }
            }
        }
    }
    // the router: dL/dp (or dL/dl) from the weights' gradients, then the softmax's Jacobian
    for (std::size_t t = 0; t < T; ++t) {
        const float* xt = p.x.data() + t * d;
        std::vector<double> dl(E, 0.0), dp(E, 0.0);
        double wg_sum = 0.0;
        for (std::size_t j = 0; j < k; ++j) wg_sum += dweights[t][j] * W[t][j];
        if (gate == gate_mode::topk_softmax) {
            for (std::size_t j = 0; j < k; ++j) dl[r.idx[t * k + j]] += W[t][j] * (dweights[t][j] - wg_sum);
        } else {
            double zs = 0.0;
            for (std::size_t j = 0; j < k; ++j) zs += P[t][r.idx[t * k + j]];
            for (std::size_t j = 0; j < k; ++j)
                dp[r.idx[t * k + j]] +=
                    gate == gate_mode::softmax_topk ? dweights[t][j] : (dweights[t][j] - wg_sum) / zs;
            double dot = 0.0;
            for (std::size_t e = 0; e < E; ++e) dot += dp[e] * P[t][e];
            for (std::size_t e = 0; e < E; ++e) dl[e] = P[t][e] * (dp[e] - dot);
        }
        if (aux_coef != 0.0f) {  // L_aux = E sum_e f_e P_e, f constant
            const double tk = static_cast<double>(T * k);
            double fp = 0.0;
            for (std::size_t e = 0; e < E; ++e) fp += static_cast<double>(counts[e]) / tk * P[t][e];
            for (std::size_t e = 0; e < E; ++e)
                dl[e] += aux_coef * static_cast<double>(E) / static_cast<double>(T) * P[t][e] *
                         (static_cast<double>(counts[e]) / tk - fp);
        }
        for (std::size_t e = 0; e < E; ++e)
            for (std::size_t c = 0; c < d; ++c) {
                const double v = dl[e] * p.wr[e * d + c];
                r.dx[t * d + c] += v;
                r.dwr[e * d + c] += dl[e] * xt[c];
            }
    }
    return r;
}

/// ||a - ref||_F / ||ref||_F over [begin, begin + n).
template <class A, class B>
double rel_fro(const A& a, const B& ref, std::size_t begin = 0, std::size_t n = static_cast<std::size_t>(-1)) {
    n = std::min(n, ref.size() - begin);
    double num = 0.0, den = 0.0;
    for (std::size_t i = begin; i < begin + n; ++i) {
        const double e = static_cast<double>(a[i]) - static_cast<double>(ref[i]);
        num += e * e;
        den += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
    }
    return den == 0.0 ? (num == 0.0 ? 0.0 : INFINITY) : std::sqrt(num / den);
}

template <class V>
double fro(const V& v) {
    double s = 0.0;
    for (const auto& x : v) s += static_cast<double>(x) * static_cast<double>(x);
    return std::sqrt(s);
}

template <class V>
bool all_finite(const V& v) {
    return std::all_of(v.begin(), v.end(), [](auto x) { return std::isfinite(static_cast<double>(x)); });
}

/// The layer against float64 on problem p, every output within the header's bounds, and the bounds
/// shown to catch a wrong expert.
template <class LR>
void check_against_reference(problem& p, const char* name) {
    INFO(std::string(name) << ": T=" << p.T << " d=" << p.d << " ff=" << p.ff << " E=" << p.E << " k=" << p.cfg.router.k
                           << " gate=" << static_cast<int>(p.cfg.router.gate)
                           << " act=" << static_cast<int>(p.cfg.activation) << " seed=" << octet_test::run_seed());
    moe_context<LR> ctx(p.cfg);
    const layer_out o = run_layer(on_host(3), ctx, p);
    REQUIRE(all_finite(o.out));
    REQUIRE(all_finite(o.dx));
    REQUIRE(all_finite(o.dwr));
    REQUIRE(all_finite(o.dwu));
    REQUIRE(all_finite(o.dwg));
    REQUIRE(all_finite(o.dwd));
    const reference r = run_reference(p, ctx.logits().data);
    // the same routing decisions
    for (std::size_t i = 0; i < r.idx.size(); ++i) REQUIRE(ctx.indices().data[i] == r.idx[i]);

    const double kf = moe_forward_error_bound<LR>(), kb = moe_backward_error_bound<LR>();
    const double ef = rel_fro(o.out, r.out);
    MESSAGE(std::string(name) << ": forward rel. error " << ef << " (bound " << kf << ")");
    CHECK(ef <= kf);
    // a layer that sends tokens to the wrong experts' weights fails the bound by far
    const reference wrong = run_reference(p, ctx.logits().data, 0.0f, 1);
    MESSAGE(std::string(name) << ": a wrong expert's forward error " << rel_fro(wrong.out, r.out) << ", dX "
                              << rel_fro(wrong.dx, r.dx));
    CHECK(rel_fro(wrong.out, r.out) > 2 * kf);

    const double edx = rel_fro(o.dx, r.dx), edwr = rel_fro(o.dwr, r.dwr);
    MESSAGE(std::string(name) << ": dX " << edx << ", dW_r " << edwr << " (bound " << kb << ")");
    CHECK(edx <= kb);
    CHECK(edwr <= kb);
    CHECK(rel_fro(wrong.dx, r.dx) > kb);
    double worst = 0.0;
    std::size_t compared = 0;
    for (std::size_t e = 0; e < p.E; ++e) {
        if (ctx.counts()[e] == 0) continue;  // exactly 0: the edge-case test
        const double eu = rel_fro(o.dwu, r.dwu, e * p.ff * p.d, p.ff * p.d);
        const double ed = rel_fro(o.dwd, r.dwd, e * p.d * p.ff, p.d * p.ff);
        const double eg = p.glu() ? rel_fro(o.dwg, r.dwg, e * p.ff * p.d, p.ff * p.d) : 0.0;
        INFO("expert " << e << " (" << ctx.counts()[e] << " tokens)");
        CHECK(eu <= kb);
        CHECK(ed <= kb);
        CHECK(eg <= kb);
        worst = std::max({worst, eu, ed, eg});
        ++compared;
        // another expert's gradient in this expert's place fails the bound
        const std::size_t o2 = (e + 1) % p.E;
        if (o2 != e && ctx.counts()[o2] != 0) {
            CHECK(rel_fro(std::vector<double>(r.dwd.begin() + o2 * p.d * p.ff, r.dwd.begin() + (o2 + 1) * p.d * p.ff),
                          std::vector<double>(r.dwd.begin() + e * p.d * p.ff, r.dwd.begin() + (e + 1) * p.d * p.ff)) >
                  kb);
        }
    }
    MESSAGE(std::string(name) << ": worst expert weight gradient " << worst << " over " << compared << " experts");
    CHECK(compared >= 2);
}

TEST_CASE("forward and backward against float64 within the header's bounds, which catch a wrong expert") {
    {
        problem p(11, 192, 160, 96, 6, 2, gate_mode::softmax_topk_renormalized, moe_activation::swiglu);
        check_against_reference<linear_recipes::blockwise>(p, "blockwise SwiGLU k=2 renormalized");
    }
    {
        problem p(12, 160, 96, 128, 5, 1, gate_mode::softmax_topk, moe_activation::gelu);
        check_against_reference<linear_recipes::mxfp8>(p, "mxfp8 GELU k=1 softmax_topk");
    }
    {
        problem p(13, 128, 64, 64, 4, 2, gate_mode::topk_softmax, moe_activation::swiglu);
        check_against_reference<linear_recipes::mxfp8>(p, "mxfp8 SwiGLU k=2 topk_softmax");
    }
}

// ---- bit for bit: the layer is the library's pieces composed by hand --------------------------------

template <class V>
bool same_bits(const V& a, const V& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
}

/// The forward (out) and dW_down, dW_up, dW_gate composed from route, plan_dispatch, quantize,
/// permute_quantized, grouped_quantize, the grouped GEMMs, moe_swiglu, combine and combine_backward.
template <class LR, class Out>
void check_composed(const problem& p, const host_executor& ex) {
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    using GR = typename LR::g_quantize_recipe;
    using SR = activation_recipes::e4m3_1x32;
    const std::size_t T = p.T, d = p.d, ff = p.ff, E = p.E, k = p.cfg.router.k;
    const matrix_ref<const float> X(p.x.data(), T, d);
    // the layer
    moe_context<LR> ctx(p.cfg);
    std::vector<Out> out(T * d);
    moe_forward(ex, ctx, X, p.weights(), matrix_ref<Out>(out.data(), T, d));
    std::vector<float> dx(T * d), dwr(E * d), dwu(E * ff * d), dwg(E * ff * d), dwd(E * d * ff);
    moe_backward(ex, ctx, matrix_ref<const float>(p.dout.data(), T, d), matrix_ref<float>(dx.data(), T, d),
                 {{dwr.data(), E, d}, {dwu.data(), E * ff, d}, {dwg.data(), E * ff, d}, {dwd.data(), E * d, ff}});

    // by hand: logits as the header defines them (double sums, one rounding)
    std::vector<float> logits(T * E);
    for (std::size_t t = 0; t < T; ++t)
        for (std::size_t e = 0; e < E; ++e) {
            double s = 0.0;
            for (std::size_t c = 0; c < d; ++c) s += static_cast<double>(p.x[t * d + c]) * p.wr[e * d + c];
            logits[t * E + e] = static_cast<float>(s);
        }
    CHECK(std::memcmp(logits.data(), ctx.logits().data, logits.size() * sizeof(float)) == 0);
    std::vector<std::int32_t> idx(T * k);
    std::vector<float> w(T * k);
    std::vector<std::size_t> counts(E);
    const host_executor one = on_host(1);  // any thread count gives the same bits
    route(one, matrix_ref<const float>(logits.data(), T, E), p.cfg.router, matrix_ref<std::int32_t>(idx.data(), T, k),
          matrix_ref<float>(w.data(), T, k), as_span(counts));
    dispatch_plan plan(T, k, E);
    plan_dispatch(matrix_ref<const std::int32_t>(idx.data(), T, k), p.cfg.dispatch, plan.ref());
    const std::size_t M = plan.ref().rows();
    const span<const std::size_t> sizes(plan.ref().group_sizes.data(), E);
    quantized_tensor<XR> xq(T, d);
    quantize<XR>(one, X, xq.ref());
    grouped_quantized_tensor<XR> xs(grouped_rows(sizes, d));
    permute_quantized(one, xq.cref(), plan.ref(), xs.ref());
    const std::vector<std::size_t> ffs(E, ff), ds(E, d);
    grouped_quantized_tensor<WR> up(grouped_rows(as_cspan(ffs), d)), gate(grouped_rows(as_cspan(ffs), d)),
        down(grouped_rows(as_cspan(ds), ff)), down_t(grouped_cols(ff, as_cspan(ds)));
    grouped_quantize<WR>(one, matrix_ref<const float>(p.wu.data(), E * ff, d), as_cspan(ffs), up.ref());
    grouped_quantize<WR>(one, matrix_ref<const float>(p.wg.data(), E * ff, d), as_cspan(ffs), gate.ref());
    grouped_quantize<WR>(one, matrix_ref<const float>(p.wd.data(), E * d, ff), as_cspan(ds), down.ref(), down_t.ref());
    const auto refs = [&](const grouped_quantized_tensor<WR>& t) {
        std::vector<quantized_cref<WR>> v;
        for (std::size_t e = 0; e < E; ++e) v.push_back(t.cref().group(e));
        return v;
    };
    const auto up_refs = refs(up), gate_refs = refs(gate), down_refs = refs(down), down_t_refs = refs(down_t);
    std::vector<float> U(M * ff), G(M * ff), H(M * ff), Y(M * d);
    grouped_scaled_gemm(one, xs.cref(), as_cspan(up_refs), matrix_ref<float>(U.data(), M, ff));
    grouped_scaled_gemm(one, xs.cref(), as_cspan(gate_refs), matrix_ref<float>(G.data(), M, ff));
    for (std::size_t i = 0; i < M * ff; ++i) H[i] = moe_swiglu(G[i], U[i]);
    grouped_quantized_tensor<XR> hq(grouped_rows(sizes, ff)), hq_t(grouped_cols(ff, sizes));
    grouped_quantize<XR>(one, matrix_ref<const float>(H.data(), M, ff), sizes, hq.ref(), hq_t.ref());
    grouped_scaled_gemm(one, hq.cref(), as_cspan(down_refs), matrix_ref<float>(Y.data(), M, d));
    std::vector<Out> out2(T * d);
    combine(one, matrix_ref<const float>(Y.data(), M, d), matrix_ref<const float>(w.data(), T, k), plan.ref(),
            matrix_ref<Out>(out2.data(), T, d));
    CHECK(same_bits(out, out2));

    // the backward's expert path: dY from combine_backward on bf16 Y, then down, SwiGLU at the saved
    // U and G, then up and gate
    std::vector<bf16> Yb(M * d);
    for (std::size_t i = 0; i < M * d; ++i) Yb[i] = to_bf16(Y[i]);
    std::vector<float> dY(M * d), dwts(T * k), dH(M * ff), dwd2(E * d * ff), dwu2(E * ff * d), dwg2(E * ff * d);
    combine_backward(one, matrix_ref<const float>(p.dout.data(), T, d), matrix_ref<const bf16>(Yb.data(), M, d),
                     matrix_ref<const float>(w.data(), T, k), plan.ref(), matrix_ref<float>(dY.data(), M, d),
                     matrix_ref<float>(dwts.data(), T, k));
    grouped_quantized_tensor<GR> dyq(grouped_rows(sizes, d)), dyq_t(grouped_cols(d, sizes));
    grouped_quantize<GR>(one, matrix_ref<const float>(dY.data(), M, d), sizes, dyq.ref(), dyq_t.ref());
    grouped_scaled_gemm(one, dyq.cref(), as_cspan(down_t_refs), matrix_ref<float>(dH.data(), M, ff));
    grouped_scaled_gemm_k(one, dyq_t.cref(), hq_t.cref(), matrix_ref<float>(dwd2.data(), E * d, ff));
    CHECK(same_bits(dwd, dwd2));
    quantized_tensor<SR> us(M, ff), gs(M, ff);
    quantize<SR>(one, matrix_ref<const float>(U.data(), M, ff), us.ref());
    quantize<SR>(one, matrix_ref<const float>(G.data(), M, ff), gs.ref());
    std::vector<float> Uh(M * ff), Gh(M * ff), dU(M * ff), dG(M * ff);
    dequantize(one, us.cref(), matrix_ref<float>(Uh.data(), M, ff));
    dequantize(one, gs.cref(), matrix_ref<float>(Gh.data(), M, ff));
    for (std::size_t i = 0; i < M * ff; ++i) {
        const float s = 1.0f / (1.0f + std::exp(-Gh[i]));
        dU[i] = dH[i] * (Gh[i] * s);
        dG[i] = dH[i] * Uh[i] * (s * (1.0f + Gh[i] * (1.0f - s)));
    }
    std::vector<float> xp(M * d);
    permute_rows(one, X, plan.ref(), matrix_ref<float>(xp.data(), M, d));
    grouped_quantized_tensor<XR> xq_t(grouped_cols(d, sizes));
    grouped_quantize<XR>(one, matrix_ref<const float>(xp.data(), M, d), sizes, {}, xq_t.ref());
    grouped_quantized_tensor<GR> duq_t(grouped_cols(ff, sizes)), dgq_t(grouped_cols(ff, sizes));
    grouped_quantize<GR>(one, matrix_ref<const float>(dU.data(), M, ff), sizes, {}, duq_t.ref());
    grouped_quantize<GR>(one, matrix_ref<const float>(dG.data(), M, ff), sizes, {}, dgq_t.ref());
    grouped_scaled_gemm_k(one, duq_t.cref(), xq_t.cref(), matrix_ref<float>(dwu2.data(), E * ff, d));
    grouped_scaled_gemm_k(one, dgq_t.cref(), xq_t.cref(), matrix_ref<float>(dwg2.data(), E * ff, d));
    CHECK(same_bits(dwu, dwu2));
    CHECK(same_bits(dwg, dwg2));
}

TEST_CASE("bit for bit: the layer equals route, plan, quantize, permute_quantized, grouped GEMMs and combine") {
    INFO("seed=" << octet_test::run_seed());
    problem p(21, 150, 160, 96, 5, 2, gate_mode::softmax_topk_renormalized, moe_activation::swiglu);
    check_composed<linear_recipes::blockwise, float>(p, on_host(3));
    check_composed<linear_recipes::blockwise, bf16>(p, on_host(2));
    problem q(22, 70, 64, 96, 4, 2, gate_mode::softmax_topk, moe_activation::swiglu);
    q.cfg.dispatch.capacity = 30;  // some assignments dropped
    check_composed<linear_recipes::mxfp8, float>(q, on_host(3));
}

// ---- edge cases -----------------------------------------------------------------------------------

TEST_CASE("an expert with 0 tokens, one with 1, zero rows, k = 1 and 2, 1e-6 inputs") {
    for (std::size_t k : {1, 2}) {
        INFO("k=" << k << " seed=" << octet_test::run_seed());
        // (k = 1 with renormalized weights would give w = 1 and no router gradient: softmax_topk there)
        problem p(31 + k, 96, 64, 64, 5, k, k == 1 ? gate_mode::softmax_topk : gate_mode::softmax_topk_renormalized,
                  moe_activation::swiglu);
        const std::size_t T = p.T, d = p.d, E = p.E, ff = p.ff;
        // W_r reads column e of X for expert e (plus noise), so X's first columns steer the routing:
        // every token avoids expert 2; only token 0 prefers expert 3; rows 5 and 9 are zero (padding)
        for (std::size_t e = 0; e < E; ++e) p.wr[e * d + e] += 4.0f;
        for (std::size_t t = 0; t < T; ++t) {
            p.x[t * d + 2] = -6.0f;
            p.x[t * d + 3] = t == 0 ? 6.0f : -6.0f;
        }
        for (std::size_t t : {5, 9})
            for (std::size_t c = 0; c < d; ++c) p.x[t * d + c] = 0.0f;
        moe_context<linear_recipes::blockwise> ctx(p.cfg);
        const layer_out o = run_layer(on_host(3), ctx, p);
        REQUIRE(ctx.counts()[2] == 0);
        REQUIRE(ctx.counts()[3] == 1);
        // an expert without tokens: its weight gradients are exactly 0
        for (std::size_t i = 0; i < ff * d; ++i) {
            REQUIRE(o.dwu[2 * ff * d + i] == 0.0f);
            REQUIRE(o.dwg[2 * ff * d + i] == 0.0f);
            REQUIRE(o.dwd[2 * d * ff + i] == 0.0f);
        }
        // zero rows: output exactly 0 (U = G = H = 0), and without the auxiliary loss dX exactly 0
        // (dweights = <dout, 0> = 0 gives dlogits = 0; SwiGLU's dU = dH silu(0) = 0, dG = dH 0 = 0)
        for (std::size_t t : {5, 9})
            for (std::size_t c = 0; c < d; ++c) {
                REQUIRE(o.out[t * d + c] == 0.0f);
                REQUIRE(o.dx[t * d + c] == 0.0f);
            }
        const reference r = run_reference(p, ctx.logits().data);
        const double kf = moe_forward_error_bound<linear_recipes::blockwise>(),
                     kb = moe_backward_error_bound<linear_recipes::blockwise>();
        CHECK(rel_fro(o.out, r.out) <= kf);
        CHECK(rel_fro(o.dx, r.dx) <= kb);
        CHECK(rel_fro(o.dwr, r.dwr) <= kb);
        // the expert of one token
        CHECK(rel_fro(o.dwu, r.dwu, 3 * ff * d, ff * d) <= kb);
        CHECK(rel_fro(o.dwd, r.dwd, 3 * d * ff, d * ff) <= kb);

        // the same problem at 1e-6: the row-local scales follow, the relative errors stay
        problem tiny = p;
        for (auto& v : tiny.x) v *= 1e-6f;
        for (auto& v : tiny.dout) v *= 1e-6f;
        moe_context<linear_recipes::blockwise> tctx(tiny.cfg);
        const layer_out to = run_layer(on_host(2), tctx, tiny);
        const reference tr = run_reference(tiny, tctx.logits().data);
        for (std::size_t i = 0; i < tr.idx.size(); ++i) REQUIRE(tctx.indices().data[i] == tr.idx[i]);
        CHECK(rel_fro(to.out, tr.out) <= kf);
        CHECK(rel_fro(to.dx, tr.dx) <= kb);
        CHECK(rel_fro(to.dwu, tr.dwu) <= kb);
        CHECK(rel_fro(to.dwd, tr.dwd) <= kb);
        CHECK(rel_fro(to.dwr, tr.dwr) <= kb);
    }
}

TEST_CASE("capacity: dropped assignments contribute 0 (a token with every slot dropped gets 0); error mode throws") {
    INFO("seed=" << octet_test::run_seed());
    problem p(51, 80, 64, 64, 4, 2, gate_mode::softmax_topk_renormalized, moe_activation::gelu);
    p.cfg.dispatch.capacity = 12;
    moe_context<linear_recipes::mxfp8> ctx(p.cfg);
    CHECK(ctx.max_rows() == 48);
    const layer_out o = run_layer(on_host(3), ctx, p);
    CHECK(o.fwd.dispatch.dropped == p.T * 2 - o.fwd.dispatch.rows);
    CHECK(o.fwd.dispatch.dropped > 0);
    const reference r = run_reference(p, ctx.logits().data);
    CHECK(rel_fro(o.out, r.out) <= moe_forward_error_bound<linear_recipes::mxfp8>());
    CHECK(rel_fro(o.dx, r.dx) <= moe_backward_error_bound<linear_recipes::mxfp8>());
    CHECK(rel_fro(o.dwu, r.dwu) <= moe_backward_error_bound<linear_recipes::mxfp8>());
    std::size_t empty_tokens = 0;
    for (std::size_t t = 0; t < p.T; ++t) {
        const auto row_of = ctx.plan().row_of;
        if (row_of[t * 2] >= 0 || row_of[t * 2 + 1] >= 0) continue;
        ++empty_tokens;
        for (std::size_t c = 0; c < p.d; ++c) REQUIRE(o.out[t * p.d + c] == 0.0f);
    }
    CHECK(empty_tokens > 0);
    // capacity 0: everything dropped, the output is 0 and only the router's softmax moves
    problem z = p;
    z.cfg.dispatch.capacity = 0;
    moe_context<linear_recipes::mxfp8> zctx(z.cfg);
    const layer_out zo = run_layer(on_host(), zctx, z);
    CHECK(std::all_of(zo.out.begin(), zo.out.end(), [](float v) { return v == 0.0f; }));
    CHECK(std::all_of(zo.dwu.begin(), zo.dwu.end(), [](float v) { return v == 0.0f; }));
    CHECK(std::all_of(zo.dx.begin(), zo.dx.end(), [](float v) { return v == 0.0f; }));

    p.cfg.dispatch.overflow = capacity_policy::error;
    moe_context<linear_recipes::mxfp8> ectx(p.cfg);
    CHECK_THROWS_WITH_AS(run_layer(on_host(), ectx, p, false), doctest::Contains("'opt.capacity'"), error);
    CHECK_FALSE(ectx.has_saved_forward());
}

TEST_CASE("the auxiliary loss's gradient: two backwards differ by exactly the router path of aux dlogits") {
    INFO("seed=" << octet_test::run_seed());
    problem p(61, 128, 64, 64, 6, 2, gate_mode::softmax_topk, moe_activation::swiglu);
    const float coef = 100.0f;  // large, so that the term stands out of dX (it scales with 1 / tokens)
    moe_context<linear_recipes::blockwise> ctx(p.cfg);
    const layer_out a = run_layer(on_host(3), ctx, p);
    problem q = p;
    q.cfg.aux_loss_coef = coef;
    moe_context<linear_recipes::blockwise> qctx(q.cfg);
    const layer_out b = run_layer(on_host(3), qctx, q);
    CHECK(same_bits(a.out, b.out));
    CHECK(a.fwd.router.aux_loss == b.fwd.router.aux_loss);
    {  // L_aux = E sum_e f_e P_e in float64 from the layer's logits and counts
        double aux = 0.0;
        for (std::size_t e = 0; e < p.E; ++e) {
            double P = 0.0;
            for (std::size_t t = 0; t < p.T; ++t) {
                const float* l = ctx.logits().data + t * p.E;
                double m = -INFINITY, z = 0.0;
                for (std::size_t i = 0; i < p.E; ++i) m = std::max<double>(m, l[i]);
                for (std::size_t i = 0; i < p.E; ++i) z += std::exp(l[i] - m);
                P += std::exp(l[e] - m) / z / static_cast<double>(p.T);
            }
            aux += static_cast<double>(ctx.counts()[e]) / static_cast<double>(p.T * 2) * P;
        }
        CHECK(std::fabs(a.fwd.router.aux_loss - static_cast<double>(p.E) * aux) <= 1e-5);
    }
    CHECK(same_bits(a.dwu, b.dwu));  // the experts do not see L_aux
    CHECK(same_bits(a.dwd, b.dwd));
    // the difference is coef dL_aux/dlogits through W_r (dX) and X (dW_r): in float64 on the same logits
    const reference r0 = run_reference(p, ctx.logits().data), r1 = run_reference(q, ctx.logits().data, coef);
    std::vector<double> ddx(p.T * p.d), ddwr(p.E * p.d), lx(p.T * p.d), lwr(p.E * p.d);
    for (std::size_t i = 0; i < ddx.size(); ++i) {
        ddx[i] = r1.dx[i] - r0.dx[i];
        lx[i] = static_cast<double>(b.dx[i]) - a.dx[i];
    }
    for (std::size_t i = 0; i < ddwr.size(); ++i) {
        ddwr[i] = r1.dwr[i] - r0.dwr[i];
        lwr[i] = static_cast<double>(b.dwr[i]) - a.dwr[i];
    }
    // dX: the experts' sum is the same bits in both, so the difference is the aux term up to the
    // float roundings of dlogits and of the final add (a few ulps of dX); dW_r reads X^ (u_X)
    const double dx_norm = fro(b.dx), aux_norm = fro(ddx);
    MESSAGE("aux term " << aux_norm / dx_norm << " of dX; difference error " << rel_fro(lx, ddx) * aux_norm / dx_norm
                        << " of dX");
    CHECK(aux_norm > 1e-3 * dx_norm);
    CHECK(rel_fro(lx, ddx) * aux_norm <= std::ldexp(1.0, -20) * dx_norm);
    CHECK(rel_fro(lwr, ddwr) <= moe_forward_error_bound<linear_recipes::blockwise>() / 4);
    CHECK(fro(lwr) > 0.0);
}

// ---- memory -------------------------------------------------------------------------------------------

TEST_CASE("memory: memory_for(config) is what a context owns; a step allocates nothing behind the caller") {
    INFO("seed=" << octet_test::run_seed());
    problem p(71, 64, 96, 128, 4, 2, gate_mode::softmax_topk_renormalized, moe_activation::swiglu);
    p.cfg.max_tokens = 100;  // a call may pass fewer tokens
    moe_context<linear_recipes::blockwise> ctx(p.cfg);
    const moe_memory m = ctx.memory(), f = moe_context<linear_recipes::blockwise>::memory_for(p.cfg);
    CHECK(m.saved_for_backward == f.saved_for_backward);
    CHECK(m.workspace == f.workspace);
    // the FP8 copies dominate what is saved: less than the float X and U, G alone would take
    const std::size_t M = 200;
    CHECK(m.saved_for_backward < (100 * 96 + 2 * M * 128) * sizeof(float) + 2 * 4 * 96 * 128 * 4);
    problem gelu = p;
    gelu.cfg.activation = moe_activation::gelu;
    moe_context<linear_recipes::mxfp8> gctx(gelu.cfg);
    CHECK(gctx.memory().total() == moe_context<linear_recipes::mxfp8>::memory_for(gelu.cfg).total());
    CHECK(gctx.memory().saved_for_backward < moe_context<linear_recipes::mxfp8>::memory_for(p.cfg).saved_for_backward);

    thread_pool pool(3);
    octet_test::lent_allocator lent;
    const host_executor ex = with_allocator(on_host(pool), lent.ref());
    const layer_out first = run_layer(ex, ctx, p);  // warm
    layer_out o;
    o.out.resize(p.T * p.d);
    o.dx.resize(p.T * p.d);
    o.dwr.resize(p.E * p.d);
    o.dwu.resize(p.E * p.ff * p.d);
    o.dwg.resize(p.E * p.ff * p.d);
    o.dwd.resize(p.E * p.d * p.ff);
    {
        octet_test::global_allocations counted;
        moe_forward(ex, ctx, matrix_ref<const float>(p.x.data(), p.T, p.d), p.weights(),
                    matrix_ref<float>(o.out.data(), p.T, p.d));
        moe_backward(ex, ctx, matrix_ref<const float>(p.dout.data(), p.T, p.d),
                     matrix_ref<float>(o.dx.data(), p.T, p.d),
                     {{o.dwr.data(), p.E, p.d},
                      {o.dwu.data(), p.E * p.ff, p.d},
                      {o.dwg.data(), p.E * p.ff, p.d},
                      {o.dwd.data(), p.E * p.d, p.ff}});
        CHECK(counted.count() == 0);
    }
    CHECK(lent.allocations > 0);
    CHECK(lent.balanced());
    // the same bits as the first step (no state leaks from one step into the next)
    CHECK(same_bits(first.out, o.out));
    CHECK(same_bits(first.dx, o.dx));
    CHECK(same_bits(first.dwu, o.dwu));
    CHECK(same_bits(first.dwr, o.dwr));
}

// ---- bad arguments --------------------------------------------------------------------------------------

TEST_CASE("bad arguments are refused by name") {
    using LR = linear_recipes::blockwise;
    problem p(81, 16, 32, 32, 3, 2, gate_mode::softmax_topk_renormalized, moe_activation::swiglu);
    // config
    moe_config c = p.cfg;
    c.router.k = 4;
    CHECK_THROWS_WITH_AS(moe_context<LR>{c}, doctest::Contains("'config.router.k'"), error);
    c = p.cfg;
    c.experts = 0;
    CHECK_THROWS_WITH_AS(moe_context<LR>{c}, doctest::Contains("'config.experts'"), error);
    c = p.cfg;
    c.d_ff = 0;
    CHECK_THROWS_WITH_AS(moe_context<LR>{c}, doctest::Contains("'config.d_ff'"), error);
    c = p.cfg;
    const std::vector<float> bias(4, 0.0f);
    c.router.selection_bias = as_cspan(bias);
    CHECK_THROWS_WITH_AS(moe_context<LR>{c}, doctest::Contains("'config.router.selection_bias'"), error);
    // recipes the layer does not take
    CHECK_THROWS_WITH_AS(moe_context<linear_recipes::tensorwise>{p.cfg}, doctest::Contains("row-local"), error);
    CHECK_THROWS_WITH_AS(moe_context<linear_recipes::tensorwise_delayed>{p.cfg}, doctest::Contains("delayed"), error);
    CHECK_THROWS_WITH_AS(moe_context<linear_recipes::nvfp4>{p.cfg}, doctest::Contains("'LR'"), error);
    using blocks_x = linear_recipe<recipes::blockwise_128x128, recipes::blockwise_128x128, recipes::blockwise_1x128>;
    CHECK_THROWS_WITH_AS(moe_context<blocks_x>{p.cfg}, doctest::Contains("row-local"), error);
    CHECK(std::string(moe_recipe_support<LR, activation_recipes::e4m3_1x32>()).empty());

    moe_context<LR> ctx(p.cfg);
    const std::size_t T = p.T, d = p.d, ff = p.ff, E = p.E;
    std::vector<float> out(T * d), big(40 * d, 1.0f);
    const matrix_ref<const float> X(p.x.data(), T, d);
    const matrix_ref<float> Y(out.data(), T, d);
    // backward before any forward
    std::vector<float> dx(T * d), dwr(E * d), dwu(E * ff * d), dwg(E * ff * d), dwd(E * d * ff);
    const moe_gradients grads{
        {dwr.data(), E, d}, {dwu.data(), E * ff, d}, {dwg.data(), E * ff, d}, {dwd.data(), E * d, ff}};
    const matrix_ref<const float> dY(p.dout.data(), T, d);
    CHECK_THROWS_WITH_AS(moe_backward(on_host(), ctx, dY, matrix_ref<float>(dx.data(), T, d), grads),
                         doctest::Contains("'ctx'"), error);
    // tokens above max_tokens; x of other width
    CHECK_THROWS_WITH_AS(moe_forward(on_host(), ctx, matrix_ref<const float>(big.data(), 40, d), p.weights(),
                                     matrix_ref<float>(big.data(), 40, d)),
                         doctest::Contains("max_tokens"), error);
    CHECK_THROWS_WITH_AS(moe_forward(on_host(), ctx, matrix_ref<const float>(p.x.data(), T, d - 1), p.weights(), Y),
                         doctest::Contains("'x'"), error);
    // weights of the wrong shape: experts' counts that disagree, W_r of another d, missing gate
    moe_weights w = p.weights();
    w.up = matrix_ref<const float>(p.wu.data(), (E - 1) * ff, d);
    CHECK_THROWS_WITH_AS(moe_forward(on_host(), ctx, X, w, Y), doctest::Contains("'w.up'"), error);
    w = p.weights();
    w.down = matrix_ref<const float>(p.wd.data(), E * d, ff / 2);
    CHECK_THROWS_WITH_AS(moe_forward(on_host(), ctx, X, w, Y), doctest::Contains("'w.down'"), error);
    w = p.weights();
    w.router = matrix_ref<const float>(p.wr.data(), E + 1, d - 3);
    CHECK_THROWS_WITH_AS(moe_forward(on_host(), ctx, X, w, Y), doctest::Contains("'w.router'"), error);
    w = p.weights();
    w.gate = {};
    CHECK_THROWS_WITH_AS(moe_forward(on_host(), ctx, X, w, Y), doctest::Contains("'w.gate'"), error);
    CHECK_THROWS_WITH_AS(moe_forward(on_host(), ctx, X, p.weights(), matrix_ref<float>(out.data(), T - 1, d)),
                         doctest::Contains("'out'"), error);
    // a good forward, then backward arguments of the wrong shape
    moe_forward(on_host(), ctx, X, p.weights(), Y);
    CHECK(ctx.has_saved_forward());
    CHECK_THROWS_WITH_AS(moe_backward(on_host(), ctx, matrix_ref<const float>(p.dout.data(), T - 1, d),
                                      matrix_ref<float>(dx.data(), T, d), grads),
                         doctest::Contains("'dout'"), error);
    moe_gradients bad = grads;
    bad.down = matrix_ref<float>(dwd.data(), E * d, ff - 1);
    CHECK_THROWS_WITH_AS(moe_backward(on_host(), ctx, dY, matrix_ref<float>(dx.data(), T, d), bad),
                         doctest::Contains("'g.down'"), error);
    bad = grads;
    bad.router = matrix_ref<float>(dwr.data(), E - 1, d);
    CHECK_THROWS_WITH_AS(moe_backward(on_host(), ctx, dY, matrix_ref<float>(dx.data(), T, d), bad),
                         doctest::Contains("'g.router'"), error);
    moe_backward(on_host(), ctx, dY, matrix_ref<float>(dx.data(), T, d), grads);
    CHECK_FALSE(ctx.has_saved_forward());  // one backward per forward
    CHECK_THROWS_WITH_AS(moe_backward(on_host(), ctx, dY, matrix_ref<float>(dx.data(), T, d), grads),
                         doctest::Contains("'ctx'"), error);
}

}  // namespace nn_moe_test
