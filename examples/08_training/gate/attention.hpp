// examples/08_training/gate/attention.hpp: the attention checks: the FP8 forward against float64, the backward's
// row-sum residual under matched delta (whole and per row), and the stale-delta failure case against it.
#pragma once

#include <octet/octet.hpp>
#include <octet/reference/attention.hpp>

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

inline constexpr int attention_head_dim = 32;
/// The recipes octet's bf16 entry points use (attention/bf16_inputs.hpp), at head_dim 32: Q, K,
/// dO one scale per token and head, V one scale per head; a per-token V uses the Q/K recipe.
using attention_recipes = octet::attention_input_recipes<attention_head_dim>;

/// A small controlled attention problem: a causal GQA batch of ragged sequences (one crossing two
/// 64-token tiles), its FP8 operands, and their dequantized values for the float64 reference.
struct attention_case {
    std::vector<std::int32_t> cu;  ///< sequence offsets (keys share them)
    int heads_q = 4, heads_kv = 2, head_dim = attention_head_dim;
    octet::quantized_tensor<attention_recipes::qk> q, k, v_token;
    octet::quantized_tensor<attention_recipes::v> v_head;
    octet::quantized_tensor<attention_recipes::dout> dout;
    std::vector<double> qd, kd, v_head_d, v_token_d, dd;

    int tokens() const { return cu.back(); }
    std::size_t q_cols() const { return static_cast<std::size_t>(heads_q) * head_dim; }
    std::size_t kv_cols() const { return static_cast<std::size_t>(heads_kv) * head_dim; }
    octet::attention_shape shape() const {
        octet::attention_shape s;
        s.cu_seqlens_q = octet::span<const std::int32_t>(cu.data(), cu.size());
        s.heads_q = heads_q;
        s.heads_kv = heads_kv;
        s.head_dim = head_dim;
        return s;
    }
    octet::reference::attention_problem reference_problem() const {
        octet::reference::attention_problem p;
        p.cu_q.assign(cu.begin(), cu.end());
        p.heads_q = heads_q;
        p.heads_kv = heads_kv;
        p.head_dim = head_dim;
        p.causal = true;
        return p;
    }
    const std::vector<double>& v_dequantized(v_scale_mode vs) const {
        return vs == v_scale_mode::per_head ? v_head_d : v_token_d;
    }
};

/// Queries sharper or flatter per token, keys sharing a mean direction per head (as real keys do),
/// magnitudes varying over two binades per token: the shapes of tests/host/attention_common.hpp.
inline attention_case make_attention_case(octet::host_executor ex, std::uint64_t seed) {
    attention_case c;
    c.cu = {0, 130, 194, 231};  // lengths 130 (three 64-tiles), 64, 37
    std::mt19937_64 g(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::uniform_real_distribution<float> mag(0.5f, 2.0f);
    const int T = c.tokens(), d = c.head_dim;
    std::vector<float> q(T * c.q_cols()), dout(q.size()), k(T * c.kv_cols()), v(k.size());
    std::vector<float> mu(c.kv_cols());
    for (auto& x : mu) x = n(g);
    for (int t = 0; t < T; ++t) {
        for (int h = 0; h < c.heads_q; ++h) {
            const float a = mag(g), b = mag(g);
            for (int e = 0; e < d; ++e) {
                const std::size_t i = static_cast<std::size_t>(t) * c.q_cols() + h * d + e;
                q[i] = 1.5f * a * n(g);
                dout[i] = b * n(g);
            }
        }
        for (int h = 0; h < c.heads_kv; ++h) {
            const float a = mag(g), b = mag(g);
            for (int e = 0; e < d; ++e) {
                const std::size_t i = static_cast<std::size_t>(t) * c.kv_cols() + h * d + e;
                k[i] = a * (n(g) + mu[h * d + e]);
                v[i] = b * n(g);
            }
        }
    }
    c.qd = detail::quantize_operand(ex, q, T, c.q_cols(), c.q);
    c.kd = detail::quantize_operand(ex, k, T, c.kv_cols(), c.k);
    c.v_head_d = detail::quantize_operand(ex, v, T, c.kv_cols(), c.v_head);
    c.v_token_d = detail::quantize_operand(ex, v, T, c.kv_cols(), c.v_token);
    c.dd = detail::quantize_operand(ex, dout, T, c.q_cols(), c.dout);
    return c;
}

struct attention_forward_out {
    std::vector<float> o, lse;  ///< [tokens][heads_q * head_dim], [heads_q][tokens]
};

inline attention_forward_out run_attention_forward(octet::host_executor ex, const attention_case& c, v_scale_mode vs) {
    attention_forward_out f;
    const std::size_t T = static_cast<std::size_t>(c.tokens());
    f.o.assign(T * c.q_cols(), 0.0f);
    f.lse.assign(static_cast<std::size_t>(c.heads_q) * T, 0.0f);
    const octet::attention_options opt{octet::attention_mask::causal};
    const octet::matrix_ref<float> o(f.o.data(), T, c.q_cols());
    const octet::span<float> lse(f.lse.data(), f.lse.size());
    if (vs == v_scale_mode::per_head)
        octet::attention_forward(ex, c.shape(), c.q.cref(), c.k.cref(), c.v_head.cref(), o, lse, opt);
    else
        octet::attention_forward(ex, c.shape(), c.q.cref(), c.k.cref(), c.v_token.cref(), o, lse, opt);
    return f;
}

/// Keys that query i of a causal sequence sees (its keys share the query offsets).
inline int visible_keys(int i) {
    return i + 1;
}

/// The largest float rounding of one row's softmax, relative: u (4 n + 4 |L log2 e| + 32) for a
/// row that sees n keys with log-sum-exp L. Counted from attention.hpp / rules.hpp, each term
/// rounded up: n for a float dot product over the keys (D, or P V), n for the row sum of dS, about
/// 1.5 n for how far sum_j P_j is from 1 (the forward's float row sum l and its per-tile rescaling,
/// which the backward inherits through L; the subtraction in exp2(x - L log2 e) adds u |x - L log2 e|
/// relative per key, weighted by P = 2^(x - L log2 e) <= 1/(e ln 2) per key), 3.5 |L log2 e| for
/// the roundings of L and L log2 e (absolute, in log2 units), and 32 for exp2's 2 ulps, the
/// per-element products and the log2 of the row sum.
inline double softmax_row_rounding(int keys, double lse) {
    return float_u * (4.0 * keys + 4.0 * std::fabs(lse * 1.4426950408889634) + 32.0);
}

/// The forward output O against float64 attention on the same dequantized operands. Inside the
/// forward only P is quantized again (E4M3 with the fixed scale 2^-8, rules.hpp): relative error
/// 2^-4 where P * 256 is normal, at most 2^-18 absolute below, and (V's per-head scale) nothing
/// else. So |O_ic - O64_ic| <= (2^-4 + f_i) (P|V|)_ic + 2^-18 sum_j |V_jc|, with f_i the float
/// rounding of the row's softmax (softmax_row_rounding) plus the float scores' own error,
/// 2 (d + 2) u max_j scale log2(e) sum_c |q_c k_c| (in log2 units, times 2 because a score error
/// moves P_j and the normalization). The value is the worst element's error over this bound.
inline gate_check check_attention_forward(const attention_case& c, const attention_forward_out& f,
                                          v_scale_mode vs = v_scale_mode::per_head) {
    const auto pr = c.reference_problem();
    const auto& vd = c.v_dequantized(vs);
    const auto ref = octet::reference::attention(pr, c.qd, c.kd, vd);
    std::vector<double> vabs(vd.size());
    for (std::size_t i = 0; i < vd.size(); ++i) vabs[i] = std::fabs(vd[i]);
    const auto p_absv = octet::reference::attention(pr, c.qd, c.kd, vabs).o;  // (P |V|)_ic
    const int d = c.head_dim, G = c.heads_q / c.heads_kv, T = c.tokens();
    // the largest scale log2(e) ||q|| ||k|| (Cauchy-Schwarz bounds sum_c |q_c k_c|)
    auto row_norm = [d](const std::vector<double>& x, std::size_t off) {
        double s = 0;
        for (int e = 0; e < d; ++e) s += x[off + e] * x[off + e];
        return std::sqrt(s);
    };
    double qmax = 0, kmax = 0;
    for (int t = 0; t < T; ++t) {
        for (int h = 0; h < c.heads_q; ++h) qmax = std::max(qmax, row_norm(c.qd, t * c.q_cols() + h * d));
        for (int h = 0; h < c.heads_kv; ++h) kmax = std::max(kmax, row_norm(c.kd, t * c.kv_cols() + h * d));
    }
    const double score_abs = qmax * kmax * pr.softmax_scale() * 1.4426950408889634;
    const double score_rounding = 2.0 * (d + 2) * float_u * score_abs;
    double worst = 0, err_sq = 0, ref_sq = 0;
    for (std::size_t b = 0; b + 1 < c.cu.size(); ++b) {
        const int t0 = c.cu[b], len = c.cu[b + 1] - t0;
        std::vector<double> vsum(c.kv_cols(), 0.0);  // sum over visible keys of |V_jc| (prefix)
        for (int i = 0; i < len; ++i) {
            for (std::size_t e = 0; e < c.kv_cols(); ++e) vsum[e] += vabs[(t0 + i) * c.kv_cols() + e];
            for (int h = 0; h < c.heads_q; ++h) {
                const double lse = ref.lse[static_cast<std::size_t>(h) * T + t0 + i];
                const double rel = e4m3_u + softmax_row_rounding(visible_keys(i), lse) + score_rounding;
                for (int e = 0; e < d; ++e) {
                    const std::size_t k = (t0 + i) * c.q_cols() + h * d + e;
                    const double err = std::fabs(static_cast<double>(f.o[k]) - ref.o[k]);
                    const double bound = rel * p_absv[k] + 0x1p-18 * vsum[(h / G) * d + e];
                    worst = std::max(worst, ratio(err, bound));
                    err_sq += err * err;
                    ref_sq += ref.o[k] * ref.o[k];
                }
            }
        }
    }
    return make_check(
        "attention.forward_vs_float64", worst, 1.0,
        "FP8 attention forward O (causal, GQA 4:2, head_dim 32, sequences 130/64/37, V " +
            std::string(vs == v_scale_mode::per_head ? "per head" : "per token") +
            ") against float64 on the same dequantized operands: worst |error| over the element bound "
            "(2^-4 + float) (P|V|) + 2^-18 sum|V| (E4M3's unit roundoff on P, the only rounding inside the "
            "forward); relL2 " +
            num(ref_sq > 0 ? std::sqrt(err_sq / ref_sq) : 0.0));
}

/// The backward's row-sum residual on one forward's output.
struct residual_measure {
    octet::attention_stats stats;
    double rel = 0;          ///< attention_stats::residual_rel(): ||r|| / ||a|| over rows
    double rel_limit = 0;    ///< C_max (1 + ||b|| / ||a||)
    double row_worst = 0;    ///< max_i |r_i| / (C_i (a_i + b_i)): <= 1 when every row is at rounding level
    double row_rel_max = 0;  ///< attention_stats::residual_rel_max (max_i |r_i| / a_i), for the record
    double b_over_a = 0;     ///< ||b|| / ||a||
};

/// Runs the backward (delta mode `mode`, telemetry on) on `fwd` and bounds each row's residual
/// r_i = sum_j dS_ij. With D_i = sum_j P_ij dP_ij formed in float from the same P and dP,
///   |r_i| <= C_i (a_i + b_i),  a_i = sum_j |dS_ij|,  b_i = sum_j P_ij |dP_ij|,
/// C_i = softmax_row_rounding: D's float dot product errs by n u b_i, dS's two roundings and the
/// row sum by (n + 1) u a_i, and D (|D| <= b_i) times sum_j P_ij - 1 (P sums to 1 only up to the
/// softmax's rounding) by the rest. Over rows, ||r|| <= C_max (||a|| + ||b||), which bounds
/// residual_rel() = ||r|| / ||a||. residual_rel_max (|r_i| / a_i) has no such bound: a row with
/// near one-hot attention has a_i itself at rounding level (attention.hpp), so the per-row check
/// divides by a_i + b_i instead.
inline residual_measure measure_attention_residual(octet::host_executor ex, const attention_case& c, v_scale_mode vs,
                                                   octet::delta_mode mode, const attention_forward_out& fwd) {
    const std::size_t T = static_cast<std::size_t>(c.tokens());
    std::vector<float> dq(T * c.q_cols()), dk(T * c.kv_cols()), dv(dk.size());
    octet::attention_backward_options bo;
    bo.mask = octet::attention_mask::causal;
    bo.delta = mode;
    bo.telemetry = true;
    octet::attention_row_telemetry rows;
    const octet::matrix_ref<const float> o(fwd.o.data(), T, c.q_cols());
    const octet::span<const float> lse(fwd.lse.data(), fwd.lse.size());
    const octet::matrix_ref<float> dqm(dq.data(), T, c.q_cols()), dkm(dk.data(), T, c.kv_cols()),
        dvm(dv.data(), T, c.kv_cols());
    residual_measure m;
    if (vs == v_scale_mode::per_head)
        m.stats = octet::attention_backward(ex, c.shape(), c.q.cref(), c.k.cref(), c.v_head.cref(), o, lse,
                                            c.dout.cref(), dqm, dkm, dvm, bo, &rows);
    else
        m.stats = octet::attention_backward(ex, c.shape(), c.q.cref(), c.k.cref(), c.v_token.cref(), o, lse,
                                            c.dout.cref(), dqm, dkm, dvm, bo, &rows);
    m.rel = m.stats.residual_rel();
    m.row_rel_max = m.stats.residual_rel_max;
    double aa = 0, bb = 0, c_max = 0;
    for (std::size_t b = 0; b + 1 < c.cu.size(); ++b) {
        const int t0 = c.cu[b], len = c.cu[b + 1] - t0;
        for (int h = 0; h < c.heads_q; ++h)
            for (int i = 0; i < len; ++i) {
                const std::size_t r = static_cast<std::size_t>(h) * T + t0 + i;
                if (!(fwd.lse[r] < std::numeric_limits<float>::infinity())) continue;  // sees no key
                const double C = softmax_row_rounding(visible_keys(i), fwd.lse[r]);
                const double a = rows.abs_ds[r], pb = rows.p_abs_dp[r];
                c_max = std::max(c_max, C);
                aa += a * a;
                bb += pb * pb;
                m.row_worst = std::max(m.row_worst, ratio(std::fabs(rows.residual[r]), C * (a + pb)));
            }
    }
    m.b_over_a = aa > 0 ? std::sqrt(bb / aa) : 0.0;
    m.rel_limit = c_max * (1.0 + m.b_over_a);
    return m;
}

inline const char* delta_name(octet::delta_mode m) {
    return m == octet::delta_mode::matched ? "matched" : "from_output";
}

/// The two row-sum checks of one backward.
inline std::vector<gate_check> residual_checks(const residual_measure& m, octet::delta_mode mode, v_scale_mode vs) {
    const std::string on = std::string("delta_mode::") + delta_name(mode) + ", V " +
                           (vs == v_scale_mode::per_head ? "per head" : "per token");
    return {
        make_check("attention.row_sum_residual", m.rel, m.rel_limit,
                   "attention_stats::residual_rel() = ||sum_j dS_ij|| / ||sum_j |dS_ij|||, " + on +
                       ": float rounding only, limit C_max (1 + ||b||/||a||) with C_i = u (4 n_i + 4 |L_i log2 e| + "
                       "32) the row's float roundings (n_i keys) and ||b||/||a|| = " +
                       num(m.b_over_a) + " (b_i = sum_j P_ij |dP_ij|)"),
        make_check("attention.row_sum_residual_per_row", m.row_worst, 1.0,
                   "max_i |sum_j dS_ij| / (C_i (sum_j |dS_ij| + sum_j P_ij |dP_ij|)), " + on +
                       ": every row at float-rounding level; (residual_rel_max = max_i |r_i| / a_i = " +
                       num(m.row_rel_max) + " is not gated: a near one-hot row has a_i at rounding level)")};
}

/// The stale-delta failure case (delta_mode::from_output with a per-token V scale) against matched
/// on the same operands: the gate asserts only that from_output's residual is the larger one
/// (value = matched / from_output < 1); the ratio itself is recorded.
inline gate_check stale_delta_check(const residual_measure& matched, const residual_measure& from_output) {
    const double value = from_output.rel > 0 ? matched.rel / from_output.rel : std::numeric_limits<double>::infinity();
    return make_check("attention.stale_delta", value, 1.0,
                      "residual_rel() with V per token: matched " + num(matched.rel) + " / from_output " +
                          num(from_output.rel) +
                          " (from_output's D = rowsum(dO * O) is stale: the stored O is not the P V the backward "
                          "sees, so its rows of dS do not sum to zero; it must be the larger)");
}

inline std::vector<gate_check> attention_checks(octet::host_executor ex, std::uint64_t seed) {
    const attention_case c = make_attention_case(ex, seed);
    std::vector<gate_check> out;
    const auto fwd_head = run_attention_forward(ex, c, v_scale_mode::per_head);
    out.push_back(check_attention_forward(c, fwd_head, v_scale_mode::per_head));
    for (auto& ch : residual_checks(
             measure_attention_residual(ex, c, v_scale_mode::per_head, octet::delta_mode::matched, fwd_head),
             octet::delta_mode::matched, v_scale_mode::per_head))
        out.push_back(std::move(ch));
    const auto fwd_token = run_attention_forward(ex, c, v_scale_mode::per_token);
    const auto matched =
        measure_attention_residual(ex, c, v_scale_mode::per_token, octet::delta_mode::matched, fwd_token);
    const auto stale =
        measure_attention_residual(ex, c, v_scale_mode::per_token, octet::delta_mode::from_output, fwd_token);
    out.push_back(stale_delta_check(matched, stale));
    return out;
}

}  // namespace gate
}  // namespace train
