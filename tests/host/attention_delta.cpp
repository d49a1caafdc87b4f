// Delta matching on the host path: the softmax-gradient invariant (every row of dS sums to zero).
//
//   * matched: D_i = sum_j P_ij dP_ij from the very P and dP that form dS, so the row sums of dS are
//     at float-rounding level: ||r|| / ||sum_j |dS_ij| || <= 1e-5 (measured ~4e-7; the bound is
//     about 170 float ulps, what sums of a few hundred terms can lose), and D itself equals the
//     float64 D of the same FP8 operands to float precision (relL2 <= 1e-5, measured ~5e-7).
//   * from_output: D_i = rowsum(dO_i * O_i) with the O the forward stored (its P V used E4M3 P, and
//     O may be bf16): the row sums are measurably non-zero, ||r|| / ||a|| >= 1e-3 (measured ~2e-2)
//     and at least 1000x matched's; the telemetry's r_i equals -(gap_i) up to rounding.
//   * the bias: dQ(from_output) - dQ(matched) = scale * sum_j P_ij (D_m - D_o)_i K_j before dS is
//     rounded, i.e. it lies along the attention-weighted mean key Kbar_i. After the FP8 rounding of
//     dS the energy fraction of that difference along Kbar is >= 0.8 (measured 0.93-0.97), and the
//     component of dQ's error (vs float64) along Kbar is at least 2x larger with from_output than
//     with matched (measured ~4.5x).
//   * V with one scale per head (block<full, D>, the bf16 entry points' default) keeps P's tile
//     maximum exact, so O is closer to P V and the stale delta is several times smaller: the same
//     checks hold with from_output's residual >= 1e-3, the energy fraction along Kbar >= 0.6
//     (0.25 for keys without a shared mean) and the error ratio along Kbar >= 1.2 (README: the measured ranges of both
//     V granularities).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "host/attention_common.hpp"

namespace attention_delta_test {
using namespace octet;
using namespace attention_test;

template <std::size_t D>
using per_token = recipe<e4m3, block<1, D>, scale::amax_ratio<0>>;
template <std::size_t D>
using per_head = recipe<e4m3, block<full, D>, scale::amax_ratio<0>>;

struct run_result {
    std::vector<float> dq;
    attention_stats st;
    attention_row_telemetry rows;
};

template <class OT, class VR = per_token<64>>
void check_invariant(const config& c, const char* name_c) {
    constexpr bool v_per_head = std::is_same_v<VR, per_head<64>>;
    const std::string name = std::string(name_c) + (v_per_head ? ", V per head" : ", V per token");
    INFO("case " << name);
    using R = per_token<64>;
    const problem p = make_problem(c);
    quantized<R, R, VR, R> qz(p);
    const auto shape = p.shape();
    const std::size_t cq = static_cast<std::size_t>(c.hq) * c.d, ck = static_cast<std::size_t>(c.hkv) * c.d,
                      Rn = static_cast<std::size_t>(c.hq) * p.tq;
    const auto mask = c.causal ? attention_mask::causal : attention_mask::full;
    std::vector<OT> o(p.tq * cq);
    std::vector<float> lse(Rn);
    attention_forward(on_host(), shape, qz.q.cref(), qz.k.cref(), qz.v.cref(), matrix_ref<OT>(o.data(), p.tq, cq),
                      span<float>(lse.data(), Rn), {mask});
    const auto ref = reference::attention(p.reference_problem(), qz.qd, qz.kd, qz.vd, qz.dd);

    run_result res[2];  // 0: from_output, 1: matched
    for (int m = 0; m < 2; ++m) {
        attention_backward_options bo;
        bo.mask = mask;
        bo.delta = m ? delta_mode::matched : delta_mode::from_output;
        bo.telemetry = true;
        res[m].dq.resize(p.tq * cq);
        std::vector<float> dk(p.tk * ck), dv(p.tk * ck);
        res[m].st = attention_backward(
            on_host(), shape, qz.q.cref(), qz.k.cref(), qz.v.cref(), matrix_ref<const OT>(o.data(), p.tq, cq),
            span<const float>(lse.data(), Rn), qz.dout.cref(), matrix_ref<float>(res[m].dq.data(), p.tq, cq),
            matrix_ref<float>(dk.data(), p.tk, ck), matrix_ref<float>(dv.data(), p.tk, ck), bo, &res[m].rows);
    }
    const attention_stats &so = res[0].st, &sm = res[1].st;
    MESSAGE(name << ": residual ||r||/||a||: matched " << sm.residual_rel() << ", from_output " << so.residual_rel()
                 << " (max |r_i|: " << sm.residual_max << " vs " << so.residual_max << "); gap ||g||/||b|| "
                 << so.gap_rel());
    CHECK(sm.rows == so.rows);
    CHECK(sm.rows > 0);
    CHECK(sm.residual_rel() <= 1e-5);
    CHECK(so.residual_rel() >= 1e-3);
    CHECK(so.residual_rel() >= 1000 * sm.residual_rel());
    // the gap is the same measurement in both modes (it does not depend on the D used)
    CHECK(so.gap_rel() == doctest::Approx(sm.gap_rel()).epsilon(1e-6));
    // from_output: r_i = sum_j P dP - D_o sum_j P = -(gap_i) + D_o (1 - sum_j P): equal to float level
    {
        double num = 0, den = 0;
        for (std::size_t i = 0; i < Rn; ++i) {
            if (!std::isfinite(lse[i])) continue;
            const double gap = static_cast<double>(res[0].rows.delta_from_output[i]) - res[0].rows.p_dp[i];
            const double e = res[0].rows.residual[i] + gap;
            num += e * e;
            den += gap * gap;
        }
        CHECK(std::sqrt(num / den) <= 1e-3);
    }
    // matched D is the exact D of the FP8 operands (float64 reference) to float precision
    const double d_err = rel_l2(widen(res[1].rows.delta), ref.delta),
                 d_err_out = rel_l2(widen(res[0].rows.delta), ref.delta);
    MESSAGE(name << ": D relL2 vs float64 exact D: matched " << d_err << ", from_output " << d_err_out);
    CHECK(d_err <= 1e-5);
    CHECK(d_err_out >= 100 * d_err);

    // the bias along Kbar
    double along = 0, total = 0, err_along[2] = {0, 0};
    for (int t = 0; t < p.tq; ++t)
        for (int h = 0; h < c.hq; ++h) {
            if (!std::isfinite(ref.lse[static_cast<std::size_t>(h) * p.tq + t])) continue;
            double kk = 0, dd = 0, dk = 0, e[2] = {0, 0};
            for (int x = 0; x < c.d; ++x) {
                const std::size_t i = (static_cast<std::size_t>(t) * c.hq + h) * c.d + x;
                const double kb = ref.kbar[i], diff = static_cast<double>(res[0].dq[i]) - res[1].dq[i];
                kk += kb * kb;
                dd += diff * diff;
                dk += diff * kb;
                for (int m = 0; m < 2; ++m) e[m] += (res[m].dq[i] - ref.dq[i]) * kb;
            }
            if (kk == 0) continue;
            along += dk * dk / kk;
            total += dd;
            for (int m = 0; m < 2; ++m) err_along[m] += e[m] * e[m] / kk;
        }
    const double fraction = along / total, ratio = std::sqrt(err_along[0] / err_along[1]);
    MESSAGE(name << ": dQ relL2 vs float64: matched " << rel_l2(widen(res[1].dq), ref.dq) << ", from_output "
                 << rel_l2(widen(res[0].dq), ref.dq));
    MESSAGE(name << ": dQ(from_output) - dQ(matched): energy fraction along Kbar " << fraction
                 << "; dQ error along Kbar, from_output / matched = " << ratio);
    // with per-head V and keys sharing no mean direction the stale delta is small beside dS's own
    // rounding noise (measured 0.38-0.63 over 8 seeds): the fraction is then only required to be a clear share
    CHECK(fraction >= (!v_per_head ? 0.8 : (c.k_mean == 0.0f ? 0.25 : 0.6)));
    CHECK(ratio >= (v_per_head ? 1.2 : 2.0));
}

TEST_CASE(
    "delta matching: row sums of dS vanish with matched, carry the stale delta with from_output, and its bias follows "
    "Kbar") {
    config c;
    c.lens_q = {37, 130, 64, 1};
    c.hq = 4;
    c.hkv = 2;
    c.d = 64;
    c.salt = 41;
    check_invariant<float>(c, "full, O float");
    c.causal = true;
    c.salt = 42;
    check_invariant<bf16>(c, "causal, O bf16");
    c.k_mean = 0.0f;  // keys without a shared mean direction: Kbar is then small and noisy
    c.salt = 43;
    check_invariant<float>(c, "causal, keys without a mean");
}

TEST_CASE("delta matching with one V scale per head: the stale delta is smaller, the invariant the same") {
    config c;
    c.lens_q = {37, 130, 64, 1};
    c.hq = 4;
    c.hkv = 2;
    c.d = 64;
    c.salt = 41;
    check_invariant<float, per_head<64>>(c, "full, O float");
    c.causal = true;
    c.salt = 42;
    check_invariant<bf16, per_head<64>>(c, "causal, O bf16");
    c.k_mean = 0.0f;
    c.salt = 43;
    check_invariant<float, per_head<64>>(c, "causal, keys without a mean");
}

}  // namespace attention_delta_test
