// examples/08_training/gate/optimizer.hpp: the optimizer's checks: one fused AdamW step (float32, and 8-bit moments
// over bf16 masters) against the float64 reference.
#pragma once

#include <octet/octet.hpp>
#include <octet/reference/adamw.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"

namespace train {
namespace gate {

/// One AdamW step's inputs: a realistic state (moments of 20 steps of gradients whose scales span
/// five decades, 3% of elements never given a gradient) and the next gradient.
struct adamw_case {
    std::vector<float> w, m, v, g;
    octet::adamw_hyper hyper;
    std::uint64_t step = 21;
    float lr = 1e-3f;
};

inline adamw_case make_adamw_case(std::uint64_t seed, std::size_t n = 5000) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> e(-4.0f, 1.0f), p(0.0f, 1.0f);
    adamw_case c;
    c.hyper.weight_decay = 0.1f;
    c.hyper.seed = seed;
    std::vector<float> scale(n);
    for (auto& s : scale) s = p(gen) < 0.03f ? 0.0f : std::pow(10.0f, e(gen));
    c.w.resize(n);
    for (auto& x : c.w) x = nd(gen);
    c.m.assign(n, 0.0f);
    c.v.assign(n, 0.0f);
    for (std::uint64_t t = 1; t < c.step; ++t)
        for (std::size_t i = 0; i < n; ++i) {
            const float gi = nd(gen) * scale[i];
            c.m[i] = 0.9f * c.m[i] + 0.1f * gi;
            c.v[i] = 0.999f * c.v[i] + 0.001f * gi * gi;
        }
    c.g.resize(n);
    for (std::size_t i = 0; i < n; ++i) c.g[i] = nd(gen) * scale[i];
    return c;
}

/// The float64 step from the state the optimizer actually started from (w0, m0, v0: the decoded
/// values), and per-element first-order bounds on the float step's rounding, carried through
/// optim/adamw.hpp's operations in their order: dm = 3u (b1|m| + (1-b1)|g|) (the constant 1 - b1,
/// the product, the fma); dv = 4u v' (g g, the constant, the product, the fma; all terms >= 0);
/// the denominator sqrt(v') / sqrt(bc2) + eps relatively dv / 2v' + 3u; the direction m'/d adds
/// dm / d and one rounding; the weight fma(-lr/bc1, dir, w (1 - lr wd)) adds the rounded step size,
/// 2u |w| for the decay and u |w'|.
struct adamw_reference {
    std::vector<double> w, m, v;     ///< after the step
    std::vector<double> dw, dm, dv;  ///< bounds on the float step's error
};

inline adamw_reference adamw_reference_step(const adamw_case& c, const std::vector<float>& w0,
                                            const std::vector<float>& m0, const std::vector<float>& v0) {
    const std::size_t n = w0.size();
    adamw_reference r;
    r.w.assign(w0.begin(), w0.end());
    r.m.assign(m0.begin(), m0.end());
    r.v.assign(v0.begin(), v0.end());
    const std::vector<double> g(c.g.begin(), c.g.end());
    const octet::reference::adamw_hyper h{c.hyper.beta1, c.hyper.beta2, c.hyper.eps, c.hyper.weight_decay};
    octet::reference::adamw_step(octet::as_span(r.w), octet::as_span(r.m), octet::as_span(r.v), octet::as_cspan(g), h,
                                 c.step, c.lr);
    const double b1 = h.beta1, b2 = h.beta2, u = float_u, lr = c.lr;
    const double bc1 = 1 - std::pow(b1, static_cast<double>(c.step)),
                 bc2 = 1 - std::pow(b2, static_cast<double>(c.step));
    r.dw.resize(n);
    r.dm.resize(n);
    r.dv.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        r.dm[i] = 3 * u * (b1 * std::fabs(m0[i]) + (1 - b1) * std::fabs(g[i]));
        r.dv[i] = 4 * u * r.v[i];
        const double d = std::sqrt(r.v[i] / bc2) + h.eps;
        const double dir = std::fabs(r.m[i]) / d;
        const double dd = (r.v[i] > 0 ? r.dv[i] / (2 * r.v[i]) : 0.0) + 3 * u;
        const double ddir = r.dm[i] / d + dir * (dd + u);
        r.dw[i] = (lr / bc1) * (ddir + u * dir) + 2 * u * std::fabs(w0[i]) + u * std::fabs(r.w[i]);
        r.dw[i] *= 1.01;  // second-order terms
    }
    return r;
}

/// fp32 moments and fp32 master weights: w, m, v after the step against float64, each within its
/// carried bound (value: the worst error / bound over all three).
inline gate_check check_adamw_fp32(const adamw_case& c, const std::vector<float>& w, const std::vector<float>& m,
                                   const std::vector<float>& v) {
    const adamw_reference r = adamw_reference_step(c, c.w, c.m, c.v);
    double worst = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
        worst = std::max(worst, ratio(std::fabs(w[i] - r.w[i]), r.dw[i]));
        worst = std::max(worst, ratio(std::fabs(m[i] - r.m[i]), r.dm[i] * 1.01));
        worst = std::max(worst, ratio(std::fabs(v[i] - r.v[i]), r.dv[i] * 1.01));
    }
    return make_check("optim.adamw_fp32", worst, 1.0,
                      "one octet::adamw_step (fp32 moments, fp32 master, " + std::to_string(w.size()) +
                          " parameters, step 21) against reference::adamw_step in float64: worst error / the "
                          "first-order bound of the step's float operations (adamw.hpp's order), over w, m, v");
}

/// Half the larger gap around a (>= 0) in an ascending map (values[0] = 0): the nearest-entry
/// rounding error of a value near a, allowing for a float error that moves it into a neighbour.
inline double dynamic_map_half_gap(const float* values, int size, double a) {
    int j = 1;
    while (j < size - 1 && values[j] < a) ++j;
    double gap = static_cast<double>(values[j]) - values[j - 1];
    if (j + 1 < size) gap = std::max(gap, static_cast<double>(values[j + 1]) - values[j]);
    if (j - 1 > 0) gap = std::max(gap, static_cast<double>(values[j - 1]) - values[j - 2]);
    return gap / 2;
}

/// dynamic8 moments and bf16 master weights with stochastic rounding, from the state as decoded:
/// the weight within the float bound plus one bf16 ulp (stochastic rounding errs by less than one
/// ulp, 2^-7 relative); the new moments (decoded) within state_codec.hpp's dynamic8 bound, half
/// the gap between neighbouring map entries times the block absmax (for v: on sqrt(v), which the
/// codec stores; below the first entry the floor rounds up by a whole entry), plus the float
/// step's own error and 1e-6 relative for the codec's normalization (tests/host/optim_codecs.cpp).
inline gate_check check_adamw_dynamic8(const adamw_case& c, const std::vector<float>& w0, const std::vector<float>& m0,
                                       const std::vector<float>& v0, const std::vector<float>& w,
                                       const std::vector<float>& m, const std::vector<float>& v,
                                       const std::vector<float>& m_absmax, const std::vector<float>& sqrt_v_absmax) {
    const adamw_reference r = adamw_reference_step(c, w0, m0, v0);
    const octet::codec_context tables = octet::host_codec_context();
    double worst = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
        const double bw = r.dw[i] + 0x1p-7 * (std::fabs(r.w[i]) + r.dw[i]);
        worst = std::max(worst, ratio(std::fabs(w[i] - r.w[i]), bw));
        const double am = m_absmax[i / octet::optim_block];
        const double bm =
            (am > 0 ? dynamic_map_half_gap(tables.signed_values, 128, std::fabs(r.m[i]) / am) * am : 0.0) + r.dm[i] +
            1e-6 * std::fabs(r.m[i]);
        worst = std::max(worst, ratio(std::fabs(m[i] - r.m[i]), bm));
        const double av = sqrt_v_absmax[i / octet::optim_block], sv = std::sqrt(r.v[i]);
        const double a = av > 0 ? sv / av : 0.0;
        const double gap = a < tables.unsigned_values[1] ? tables.unsigned_values[1]
                                                         : dynamic_map_half_gap(tables.unsigned_values, 256, a);
        const double bv = gap * av + (sv > 0 ? r.dv[i] / (2 * sv) : 0.0) + 1e-6 * sv;
        worst = std::max(worst, ratio(std::fabs(std::sqrt(static_cast<double>(v[i])) - sv), bv));
    }
    return make_check("optim.adamw_dynamic8_bf16_stochastic", worst, 1.0,
                      "one octet::adamw_step (dynamic8 moments, bf16 master with stochastic rounding) against "
                      "float64 from the decoded state: worst error / bound, the bound being the float step's plus "
                      "one bf16 ulp on w and the dynamic8 codec's half map gap times the block absmax on m and "
                      "sqrt(v) (state_codec.hpp); values near 1 are expected: a moment at a midpoint between map "
                      "entries rounds by exactly half a gap");
}

inline std::vector<gate_check> optim_checks(octet::host_executor ex, std::uint64_t seed) {
    const adamw_case c = make_adamw_case(seed);
    const std::size_t n = c.w.size();
    std::vector<gate_check> out;
    {
        octet::adamw_state<octet::state_codec::fp32> st(n);
        st.set_params(octet::as_cspan(c.w));
        st.m_codes = c.m;  // fp32 codes are the moments themselves
        st.v_codes = c.v;
        octet::adamw_step(ex, st.ref(), octet::as_cspan(c.g), c.hyper, c.step, c.lr);
        out.push_back(check_adamw_fp32(c, st.params, st.m_codes, st.v_codes));
    }
    {
        using C = octet::state_codec::dynamic8;
        octet::adamw_state<C, C, octet::master::bf16_stochastic> st(n);
        st.set_params(octet::as_cspan(c.w));
        octet::encode_moments<C, octet::moment::first>(ex, octet::as_cspan(c.m), octet::as_span(st.m_codes),
                                                       octet::as_span(st.m_meta));
        octet::encode_moments<C, octet::moment::second>(ex, octet::as_cspan(c.v), octet::as_span(st.v_codes),
                                                        octet::as_span(st.v_meta));
        std::vector<float> m0(n), v0(n), m1(n), v1(n);
        octet::decode_moments<C, octet::moment::first>(ex, octet::as_cspan(st.m_codes), octet::as_cspan(st.m_meta),
                                                       octet::as_span(m0));
        octet::decode_moments<C, octet::moment::second>(ex, octet::as_cspan(st.v_codes), octet::as_cspan(st.v_meta),
                                                        octet::as_span(v0));
        const std::vector<float> w0 = st.params_as_float();
        octet::adamw_step(ex, st.ref(), octet::as_cspan(c.g), c.hyper, c.step, c.lr);
        octet::decode_moments<C, octet::moment::first>(ex, octet::as_cspan(st.m_codes), octet::as_cspan(st.m_meta),
                                                       octet::as_span(m1));
        octet::decode_moments<C, octet::moment::second>(ex, octet::as_cspan(st.v_codes), octet::as_cspan(st.v_meta),
                                                        octet::as_span(v1));
        std::vector<float> am, av;
        for (const auto& x : st.m_meta) am.push_back(x.absmax);
        for (const auto& x : st.v_meta) av.push_back(x.absmax);
        out.push_back(check_adamw_dynamic8(c, w0, m0, v0, st.params_as_float(), m1, v1, am, av));
    }
    return out;
}

}  // namespace gate
}  // namespace train
