// examples/08_training/gate.hpp: the validation gate the training run passes before it trains.
//
//   std::vector<train::gate_check> gate = train::run_gate(octet::on_host(), seed);
//   if (!train::gate_passed(gate)) return 1;  // the run refuses to train
//
// Invariants on small controlled cases, each a measured value against a limit that comes from
// octet's documented bounds or from an error analysis written beside it (and in the check's
// detail): the attention backward's row-sum residual and forward output against float64, the
// Hadamard transform and the gradient codecs with error feedback, one AdamW step against float64,
// E4M3 / E5M2 conversion and blockwise quantization against the float64 references, and one FP8
// linear-layer forward against float64. A check passes when its value is finite and at most its
// limit. Every measuring function takes the results it judges as arguments (gate_test.cpp feeds it
// corrupted ones and sees it fail). About 0.3 s on one core.
#pragma once

#include <octet/nn/linear.hpp>
#include <octet/octet.hpp>
#include <octet/reference/adamw.hpp>
#include <octet/reference/attention.hpp>
#include <octet/reference/codec.hpp>
#include <octet/reference/format.hpp>
#include <octet/reference/quantize.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "train.hpp"

namespace train {
namespace gate {

inline constexpr double float_u = 0x1p-24;  ///< float's unit roundoff
inline constexpr double e4m3_u = 0x1p-4;    ///< E4M3's unit roundoff (3 mantissa bits)

/// A check from its measurement: passed when both numbers are finite and value <= limit.
inline gate_check make_check(std::string name, double value, double limit, std::string detail) {
    gate_check c;
    c.name = std::move(name);
    c.value = value;
    c.limit = limit;
    c.passed = std::isfinite(value) && std::isfinite(limit) && value <= limit;
    c.detail = std::move(detail);
    return c;
}

/// A number for a detail line (3 significant digits).
inline std::string num(double v) {
    std::ostringstream s;
    s.precision(3);
    s << v;
    return s.str();
}

/// err / bound, 0 when both are 0 (an exact result needs no slack).
inline double ratio(double err, double bound) {
    return err == 0.0 ? 0.0 : err / bound;
}

inline double norm2(const std::vector<double>& x) {
    double s = 0;
    for (double v : x) s += v * v;
    return std::sqrt(s);
}
inline double norm2(const std::vector<float>& x) {
    double s = 0;
    for (float v : x) s += static_cast<double>(v) * v;
    return std::sqrt(s);
}
/// ||a - b|| with a and b widened to double.
template <class A, class B>
double dist2(const std::vector<A>& a, const std::vector<B>& b) {
    double s = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
        s += d * d;
    }
    return std::sqrt(s);
}

// =================================================================================================
// Attention
// =================================================================================================

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

namespace detail {
template <class R>
std::vector<double> quantize_operand(octet::host_executor ex, const std::vector<float>& x, std::size_t rows,
                                     std::size_t cols, octet::quantized_tensor<R>& out) {
    out = octet::quantized_tensor<R>(rows, cols);
    octet::quantize<R>(ex, octet::matrix_ref<const float>(x.data(), rows, cols), out.ref());
    std::vector<float> y(rows * cols);
    octet::dequantize(ex, out.cref(), octet::matrix_ref<float>(y.data(), rows, cols));
    return std::vector<double>(y.begin(), y.end());
}
}  // namespace detail

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

// =================================================================================================
// Gradient codec
// =================================================================================================

/// Gradient-like values: normal, per-element scales over four decades, a few large outliers.
inline std::vector<float> gradient_like(std::mt19937_64& g, std::size_t n) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> e(-3.0f, 1.0f), p(0.0f, 1.0f);
    std::vector<float> x(n);
    for (auto& v : x) v = nd(g) * std::pow(10.0f, e(g)) * (p(g) < 0.002f ? 100.0f : 1.0f);
    return x;
}

/// The rounding bound of one transform of a Hadamard block B = 2^k (codec/hadamard.hpp): each of
/// the k butterfly stages rounds every element once (a stage is sqrt 2 times an orthogonal map, so
/// its rounding adds at most u ||x|| after normalization), plus the multiply by c and c's own
/// rounding: (k + 2) u ||x|| (the header quotes (k / 2 + 1) u as typical).
inline double transform_rounding(std::uint32_t block) {
    return (octet::log2_exact(block) + 2) * float_u;
}

/// Forward transform y of x against the float64 transform from the matrix definition, and
/// ||y|| against ||x|| (an isometry up to the same rounding).
inline std::vector<gate_check> check_hadamard(const std::vector<float>& x, const std::vector<float>& y,
                                              std::uint32_t block, std::uint64_t seed) {
    const std::vector<double> x64(x.begin(), x.end());
    const auto y64 = octet::reference::transform_forward_f64(octet::transform_kind::hadamard, x64, block, seed);
    const double nx = norm2(x), lim = transform_rounding(block);
    const std::string on = "randomized Hadamard, block " + std::to_string(block) + ", " + std::to_string(x.size()) +
                           " elements (ragged tail)";
    return {make_check("codec.hadamard_vs_float64",
                       y.size() == y64.size() ? dist2(y, y64) / nx : std::numeric_limits<double>::infinity(), lim,
                       "||T x - T64 x|| / ||x||, " + on +
                           "; limit (log2 B + 2) u, a stage's rounding per butterfly "
                           "stage, the scale c and its rounding"),
            make_check("codec.hadamard_norm", std::fabs(norm2(y) - nx) / nx, lim,
                       "| ||T x|| - ||x|| | / ||x|| (orthogonality), " + on +
                           "; limit (log2 B + 2) u (T64 is an isometry, then the triangle inequality)")};
}

/// Inverse after forward: x_back against x, within twice one transform's rounding.
inline gate_check check_hadamard_roundtrip(const std::vector<float>& x, const std::vector<float>& x_back,
                                           std::uint32_t block) {
    return make_check("codec.hadamard_roundtrip", dist2(x_back, x) / norm2(x), 2.0 * transform_rounding(block),
                      "||T^-1 T x - x|| / ||x||, block " + std::to_string(block) +
                          "; limit 2 (log2 B + 2) u (two transforms, each within its rounding bound)");
}

inline std::string codec_name(const octet::codec_config& cfg) {
    return std::string(octet::wire_format_name(cfg.format)) + (cfg.stochastic ? "_stochastic" : "");
}

/// One encode/decode of x: ||x_hat - x|| / ||x|| within octet::error_bound (codec.hpp's worst case).
inline gate_check check_codec_error(const octet::codec_config& cfg, const std::vector<float>& x,
                                    const std::vector<float>& x_hat) {
    const double nx = norm2(x);
    const octet::codec_bound b = octet::error_bound(cfg, x.size());
    return make_check("codec." + codec_name(cfg) + ".error", dist2(x_hat, x) / nx, b.of(nx) / nx,
                      "encode/decode of " + std::to_string(x.size()) + " gradient-like elements (" +
                          octet::transform_name(cfg.transform) + " " + std::to_string(cfg.block) +
                          "): ||x_hat - x|| / ||x|| against octet::error_bound, the codec's documented worst case "
                          "beta ||x|| + eta sqrt(L)");
}

/// Error feedback: after encoding x_in = g + e_prev, the carried residual e must be x_in - x_hat
/// (x_hat the decoded message). It is T^-1 (y - deq) while x_hat is T^-1 deq and y = T x_in, so
/// they differ by three transforms' rounding, (k + 2) u (||e|| + ||x_hat|| + ||x_in||), plus the
/// subtraction y - deq (u ||e||), plus the residual's storage (bf16: 2^-8 ||e||, feedback.hpp).
inline gate_check check_feedback_residual(const octet::codec_config& cfg, octet::residual_storage storage,
                                          const std::vector<float>& x_in, const std::vector<float>& x_hat,
                                          const std::vector<float>& residual) {
    std::vector<double> expect(x_in.size());
    for (std::size_t i = 0; i < x_in.size(); ++i)
        expect[i] = static_cast<double>(x_in[i]) - static_cast<double>(x_hat[i]);
    const double nx = norm2(x_in), ne = norm2(residual) * (1.0 + 0x1p-7), nh = norm2(x_hat);
    const double k2 = cfg.transform == octet::transform_kind::hadamard ? transform_rounding(cfg.block) : 0.0;
    const double store = storage == octet::residual_storage::bf16 ? 0x1p-8 : 0.0;
    const double limit = (k2 * (ne + nh + nx) + float_u * ne + store * ne) / nx;
    return make_check(std::string("codec.feedback_") + octet::residual_storage_name(storage),
                      dist2(residual, expect) / nx, limit,
                      "error feedback (" + codec_name(cfg) + ", residual in " + octet::residual_storage_name(storage) +
                          "), second step: ||e - (g + e_prev - x_hat)|| / ||g + e_prev||; limit: three transforms' "
                          "rounding (log2 B + 2) u on ||e||, ||x_hat||, ||x_in||, the subtraction, and the storage's "
                          "rounding");
}

inline std::vector<gate_check> codec_checks(octet::host_executor ex, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::vector<gate_check> out;
    const std::size_t n = 2500;  // two full 1024-blocks and a ragged one
    const std::uint32_t block = 1024;
    const auto x = gradient_like(g, n);
    std::vector<float> y(octet::transform_length(octet::transform_kind::hadamard, n, block)), back(n);
    octet::transform_forward(ex, octet::transform_kind::hadamard, octet::as_cspan(x), octet::as_span(y), block, seed);
    octet::transform_inverse(ex, octet::transform_kind::hadamard, octet::as_cspan(y), octet::as_span(back), block,
                             seed);
    for (auto& c : check_hadamard(x, y, block, seed)) out.push_back(std::move(c));
    out.push_back(check_hadamard_roundtrip(x, back, block));

    const std::size_t m = 5000;
    const auto grad = gradient_like(g, m);
    const octet::wire_format formats[] = {octet::wire_format::e4m3, octet::wire_format::e5m2, octet::wire_format::mxfp8,
                                          octet::wire_format::nvfp4};
    auto round_trip = [&](const octet::codec_config& cfg, const std::vector<float>& in, octet::encode_options opt) {
        std::vector<std::uint8_t> msg(octet::encoded_size(cfg, in.size()));
        octet::encode_gradient(ex, cfg, octet::as_cspan(in), octet::as_span(msg), opt);
        std::vector<float> x_hat(in.size());
        octet::decode_gradient(ex, octet::as_cspan(msg), octet::as_span(x_hat));
        return x_hat;
    };
    for (int s = 0; s < 2; ++s)
        for (auto f : formats) {
            if (s == 1 && f != octet::wire_format::e4m3) continue;  // stochastic rounding: one format
            const octet::codec_config cfg{f, octet::transform_kind::hadamard, block, 0, seed + 1, s == 1};
            out.push_back(check_codec_error(cfg, grad, round_trip(cfg, grad, {})));
        }
    const auto grad2 = gradient_like(g, m);
    for (auto storage : {octet::residual_storage::f32, octet::residual_storage::bf16}) {
        const octet::codec_config cfg{
            octet::wire_format::e4m3, octet::transform_kind::hadamard, block, 0, seed + 2, false};
        octet::error_feedback fb(m, storage);
        octet::encode_options opt;
        opt.feedback = fb.view();
        round_trip(cfg, grad, opt);
        const auto e1 = fb.values();
        std::vector<float> x_in(m);
        for (std::size_t i = 0; i < m; ++i) x_in[i] = grad2[i] + e1[i];  // what the codec adds, in float
        const auto x_hat = round_trip(cfg, grad2, opt);
        out.push_back(check_feedback_residual(cfg, storage, x_in, x_hat, fb.values()));
    }
    return out;
}

// =================================================================================================
// Optimizer
// =================================================================================================

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

// =================================================================================================
// Conversion
// =================================================================================================

/// Edge values of a format: zeros, the smallest subnormal and ties around it, the smallest
/// normal, the largest finite value, the overflow threshold and values just around it, Inf, NaN,
/// float subnormals, and every finite value with the midpoints (ties) between neighbours, each
/// also nudged one float ulp either way.
template <class Fmt>
std::vector<float> format_edge_values() {
    const float sub = Fmt::min_subnormal, mx = Fmt::max_finite;
    const float thr = static_cast<float>(Fmt::overflow_threshold_d);
    std::vector<float> v = {0.0f,
                            -0.0f,
                            sub,
                            -sub,
                            0.5f * sub,
                            0.75f * sub,
                            1.5f * sub,
                            Fmt::min_normal,
                            mx,
                            -mx,
                            thr,
                            -thr,
                            std::nextafter(thr, 0.0f),
                            std::nextafter(thr, 2.0f * thr),
                            2.0f * mx,
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            1e-40f,
                            -1e-45f};
    const auto& t = octet::reference::format_table<Fmt>::get();
    for (std::size_t i = 0; i < t.values.size(); ++i) {
        const float a = static_cast<float>(t.values[i]);
        v.push_back(a);
        v.push_back(-a);
        if (i + 1 < t.values.size()) {
            const float mid = static_cast<float>((t.values[i] + t.values[i + 1]) / 2);  // exact in float
            for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
                v.push_back(x);
                v.push_back(-x);
            }
        }
    }
    return v;
}

/// Encodes under nearest-even with both overflow policies and decodes every code, against the
/// float64 brute-force reference (reference/format.hpp); value: the number of disagreements.
template <class Fmt>
gate_check check_format(const char* name) {
    std::size_t bad = 0, n = 0;
    for (float x : format_edge_values<Fmt>()) {
        bad += octet::encode<Fmt, octet::round::nearest_even, octet::overflow::saturate>(x) !=
               octet::reference::encode_code<Fmt, octet::round::nearest_even, octet::overflow::saturate>(x);
        bad += octet::encode<Fmt, octet::round::nearest_even, octet::overflow::to_nonfinite>(x) !=
               octet::reference::encode_code<Fmt, octet::round::nearest_even, octet::overflow::to_nonfinite>(x);
        n += 2;
    }
    for (std::uint32_t code = 0; code < 256; ++code) {
        const float got = octet::decode<Fmt>(static_cast<std::uint8_t>(code));
        const auto want = octet::reference::decode_code<Fmt>(code);
        bool ok;
        switch (want.kind) {
            case octet::reference::code_kind::nan:
                ok = std::isnan(got);
                break;
            case octet::reference::code_kind::pos_inf:
                ok = got == std::numeric_limits<float>::infinity();
                break;
            case octet::reference::code_kind::neg_inf:
                ok = got == -std::numeric_limits<float>::infinity();
                break;
            default:
                ok = static_cast<double>(got) == want.value && std::signbit(got) == std::signbit(want.value);
        }
        bad += !ok;
        ++n;
    }
    return make_check(std::string("format.") + name + ".conversion", static_cast<double>(bad), 0.0,
                      std::to_string(n) +
                          " conversions (encode nearest-even, saturate and to_nonfinite, on zeros, "
                          "subnormals, every value and tie, the overflow threshold, Inf, NaN; "
                          "decode of all 256 codes) against reference/format.hpp: disagreements");
}

/// A random rows x cols matrix whose rows span six decades, with 1% outliers 100x (so that blocks
/// hold E4M3 subnormals).
inline std::vector<float> quantize_test_matrix(std::uint64_t seed, std::size_t rows, std::size_t cols) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> e(-3.0f, 3.0f), p(0.0f, 1.0f);
    std::vector<float> x(rows * cols);
    for (std::size_t i = 0; i < rows; ++i) {
        const float s = std::pow(10.0f, e(g));
        for (std::size_t j = 0; j < cols; ++j) x[i * cols + j] = s * nd(g) * (p(g) < 0.01f ? 100.0f : 1.0f);
    }
    return x;
}

/// blockwise_1x128 quantization of x: codes and scales against reference/quantize.hpp (value: the
/// number that differ), and the round trip per element within E4M3's rounding: x / S rounds with
/// relative error 2^-4 where it is normal (3 mantissa bits: half a step of 2^(e-3) in the binade
/// [2^e, 2^(e+1)) is at most 2^-4 of the value), with absolute error 2^-10 S below 2^-6 (half the
/// subnormal step 2^-9), never saturates (S = amax / 448 puts the block amax on 448), and the
/// division and the decode's product round once each in float: (2^-4 + 2u) |x| + 2^-10 S.
inline std::vector<gate_check> check_blockwise(const std::vector<float>& x, std::size_t rows, std::size_t cols,
                                               const octet::quantized_tensor<octet::recipes::blockwise_1x128>& q,
                                               const std::vector<float>& y) {
    using R = octet::recipes::blockwise_1x128;
    const auto ref = octet::reference::quantize<R>(x, rows, cols, -1.0, [](std::size_t, std::size_t) { return 0u; });
    const auto c = q.cref();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) bad += c.code(i, j) != ref.codes[i * cols + j];
    for (std::size_t bi = 0; bi < ref.scale_rows; ++bi)
        for (std::size_t bj = 0; bj < ref.scale_cols; ++bj)
            bad += c.stored_scale(bi, bj) != ref.stored_scale[bi * ref.scale_cols + bj];
    double worst = 0;
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) {
            const double xv = x[i * cols + j], S = c.scale(i / c.layout.block_rows, j / c.layout.block_cols);
            const double bound = (e4m3_u + 2 * float_u) * std::fabs(xv) + 0x1p-10 * S;
            worst = std::max(worst, ratio(std::fabs(y[i * cols + j] - xv), bound));
        }
    const std::string on = "recipes::blockwise_1x128 on a random " + std::to_string(rows) + "x" + std::to_string(cols) +
                           " matrix (rows over six decades, 1% outliers)";
    return {make_check("quant.blockwise_1x128.vs_float64", static_cast<double>(bad), 0.0,
                       on + ": codes and scales differing from reference/quantize.hpp"),
            make_check("quant.blockwise_1x128.roundtrip", worst, 1.0,
                       on + ": worst |dequantize(quantize(x)) - x| over (2^-4 + 2u) |x| + 2^-10 S, E4M3's unit "
                            "roundoff in the normal range and half its subnormal step below (a value at a tie "
                            "reaches 1 / (1 + 2^-4) = 0.94)")};
}

inline std::vector<gate_check> conversion_checks(octet::host_executor ex, std::uint64_t seed) {
    std::vector<gate_check> out;
    out.push_back(check_format<octet::e4m3>("e4m3"));
    out.push_back(check_format<octet::e5m2>("e5m2"));
    const std::size_t rows = 128, cols = 256;
    const auto x = quantize_test_matrix(seed, rows, cols);
    octet::quantized_tensor<octet::recipes::blockwise_1x128> q(rows, cols);
    octet::quantize<octet::recipes::blockwise_1x128>(ex, octet::matrix_ref<const float>(x.data(), rows, cols), q.ref());
    std::vector<float> y(rows * cols);
    octet::dequantize(ex, q.cref(), octet::matrix_ref<float>(y.data(), rows, cols));
    for (auto& c : check_blockwise(x, rows, cols, q, y)) out.push_back(std::move(c));
    return out;
}

// =================================================================================================
// Linear layer
// =================================================================================================

/// The linear layer's forward Y = X W^T + b (linear_recipes::blockwise: X in 1x128 tiles, W in
/// 128x128 blocks) against float64 on the same dequantized copies, each element within
/// octet::gemm_error_bound for the host backend (scaled_gemm.hpp: gamma_(L + S) on
/// sum_k |X_ik| |W_jk|, the epilogue's roundings with the bias, the output rounding); value: the
/// worst error over its bound. The copies are made here with the layer's recipes (quantization is
/// deterministic, so they are the layer's own).
inline gate_check check_linear_forward(octet::host_executor ex, const std::vector<float>& x,
                                       const std::vector<float>& w, const std::vector<float>& bias,
                                       const std::vector<float>& y, std::size_t tokens, std::size_t in,
                                       std::size_t out) {
    using LR = octet::linear_recipes::blockwise;
    using XR = LR::x_recipe;
    using WR = LR::w_recipe;
    octet::quantized_tensor<XR> qx;
    octet::quantized_tensor<WR> qw;
    const auto xd = detail::quantize_operand(ex, x, tokens, in, qx);
    const auto wd = detail::quantize_operand(ex, w, out, in, qw);
    const octet::gemm_numerics gn = octet::gemm_numerics_of<XR, WR, float>(octet::gemm_backend::host, in);
    double worst = 0, err_sq = 0, ref_sq = 0;
    for (std::size_t i = 0; i < tokens; ++i)
        for (std::size_t j = 0; j < out; ++j) {
            double exact = bias[j], abs_products = 0, raw = bias[j];
            for (std::size_t k = 0; k < in; ++k) {
                exact += xd[i * in + k] * wd[j * in + k];
                abs_products += std::fabs(xd[i * in + k] * wd[j * in + k]);
                raw += static_cast<double>(x[i * in + k]) * w[j * in + k];
            }
            const double bound =
                octet::gemm_error_bound(gn, 1.0, abs_products, 0.0, std::fabs(bias[j]), std::fabs(exact));
            worst = std::max(worst, ratio(std::fabs(y[i * out + j] - exact), bound));
            err_sq += (y[i * out + j] - raw) * (y[i * out + j] - raw);
            ref_sq += raw * raw;
        }
    return make_check("linear.forward_vs_float64", worst, 1.0,
                      "octet::linear_forward (linear_recipes::blockwise, " + std::to_string(tokens) + " tokens, " +
                          std::to_string(in) + " -> " + std::to_string(out) +
                          ", bias) against float64 on the dequantized copies: worst |error| over "
                          "octet::gemm_error_bound (host backend); relL2 against float64 on the unquantized X, W: " +
                          num(ref_sq > 0 ? std::sqrt(err_sq / ref_sq) : 0.0) + " (E4M3's rounding of the inputs)");
}

inline std::vector<gate_check> linear_checks(octet::host_executor ex, std::uint64_t seed) {
    const std::size_t tokens = 96, in = 256, out = 192;  // out: one full 128-block of W and a ragged one
    std::mt19937_64 g(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(tokens * in), w(out * in), bias(out), y(tokens * out);
    for (auto& v : x) v = nd(g);
    for (auto& v : w) v = 0.0625f * nd(g);
    for (auto& v : bias) v = 0.1f * nd(g);
    octet::linear_context<octet::linear_recipes::blockwise> ctx({tokens, in, out});
    octet::linear_forward(ex, ctx, octet::matrix_ref<const float>(x.data(), tokens, in),
                          octet::matrix_ref<const float>(w.data(), out, in), octet::as_cspan(bias),
                          octet::matrix_ref<float>(y.data(), tokens, out), octet::linear_pass::inference);
    return {check_linear_forward(ex, x, w, bias, y, tokens, in, out)};
}

}  // namespace gate

/// Every check of the gate on fresh inputs drawn from `seed`.
inline std::vector<gate_check> run_gate(octet::host_executor ex, std::uint64_t seed) {
    std::vector<gate_check> out;
    auto add = [&out](std::vector<gate_check> v) {
        for (auto& c : v) out.push_back(std::move(c));
    };
    auto salt = [seed](std::uint64_t k) { return seed ^ (k * 0x9E3779B97F4A7C15ull); };
    add(gate::attention_checks(ex, salt(1)));
    add(gate::codec_checks(ex, salt(2)));
    add(gate::optim_checks(ex, salt(3)));
    add(gate::conversion_checks(ex, salt(4)));
    add(gate::linear_checks(ex, salt(5)));
    return out;
}

/// True when every check passed (and there is at least one).
inline bool gate_passed(const std::vector<gate_check>& checks) {
    return !checks.empty() && std::all_of(checks.begin(), checks.end(), [](const gate_check& c) { return c.passed; });
}

}  // namespace train
