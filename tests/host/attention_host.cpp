// FP8 attention on the host: the float64 reference against finite differences and its own
// identities; the host path (which quantizes at the kernels' points) against float64 across masks,
// grouped-query attention, ragged batches with empty sequences, cross lengths, head dims 64 and
// 128 and several recipes; edge cases (rows that see no key, NaN inputs); the exp2 rule; and the
// argument checks.
//
// Two float64 baselines: the reference on the DEQUANTIZED operands isolates what the attention adds
// (the E4M3 rounding of P and dS), and the reference on the ORIGINAL float data gives the end-to-end
// error including the FP8 rounding of Q, K, V, dO themselves. Tolerances are stated per check with
// the measured values they cover (3 seeds x 8 configurations, tests/host numbers in docs/attention.md).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "host/attention_common.hpp"

namespace attention_host_test {
using namespace octet;
using namespace attention_test;

template <std::size_t D>
using per_token = recipe<e4m3, block<1, D>, scale::amax_ratio<0>>;
template <std::size_t D>
using per_head = recipe<e4m3, block<full, D>, scale::amax_ratio<0>>;
template <std::size_t D>
using per_token_pow2 = recipe<e4m3, block<1, D>, scale::pow2_ceil, scale_storage::ue8m0>;

// ---- exp2 ------------------------------------------------------------------------------------

TEST_CASE("attention exp2 rule: within 2 float ulps of 2^y, exact at 0, edges") {
    auto g = octet_test::rng(11);
    std::uniform_real_distribution<float> u(-126.0f, 0.0f), small(-1.0f, 1.0f);
    double worst = 0;
    for (int i = 0; i < 200000; ++i) {
        const float y = (i & 1) ? u(g) : small(g);
        const double want = std::exp2(static_cast<double>(y));
        const double got = detail::attention::exp2(y);
        const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
        worst = std::max(worst, std::fabs(got - want) / ulp);
    }
    MESSAGE("exp2: worst error " << worst << " ulp");
    CHECK(worst <= 2.0);
    CHECK(detail::attention::exp2(0.0f) == 1.0f);
    CHECK(detail::attention::exp2(-INFINITY) == 0.0f);
    CHECK(detail::attention::exp2(-127.0f) == 0.0f);
    CHECK(std::isnan(detail::attention::exp2(NAN)));
    CHECK(detail::attention::exp2(3.0f) == 8.0f);
    // P scale: 1 maps to 256, exact; 2^-18 is the smallest P that survives (half the smallest subnormal rounds to even
    // 0)
    CHECK(decode<e4m3>(detail::attention::encode_p(1.0f)) == 256.0f);
    CHECK(decode<e4m3>(detail::attention::encode_p(std::ldexp(1.0f, -17))) == std::ldexp(1.0f, -9));
    CHECK(decode<e4m3>(detail::attention::encode_p(std::ldexp(1.0f, -18))) == 0.0f);
}

TEST_CASE(
    "attention P encoding equals encode_scaled bit for bit; dS encoding by a reciprocal differs from it by at most one "
    "code, rarely") {
    auto g = octet_test::rng(12);
    const auto x = octet_test::with_edge_cases(g, 100000, 3.0f, true);
    const auto amaxes = octet_test::log_uniform(g, 100000, -140.0f, 120.0f);
    std::size_t bad_p = 0, bad_ds = 0, far_ds = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const float u = std::fabs(x[i]) * 0.4f;  // P-like values, with subnormals, Inf and NaN
        bad_p +=
            detail::attention::encode_p(u) != encode_scaled<detail::attention::p_recipe>(u, detail::attention::p_scale);
        float amax = std::fabs(amaxes[i]);
        if (i % 1000 == 0) amax = 0.0f;
        const float s = detail::attention::ds_scale(amax);
        const float y = std::fabs(x[i]) <= amax || !std::isfinite(x[i])
                            ? x[i]
                            : std::copysign(amax, x[i]);  // |y| <= amax, as in a tile
        const std::uint8_t a = detail::attention::encode_ds(y, detail::attention::ds_inverse(s)),
                           b = encode_scaled<detail::attention::ds_recipe>(y, s);
        bad_ds += a != b;
        // one code apart: adjacent magnitudes with the same sign (E4M3 codes are monotone in magnitude)
        far_ds += a != b && ((a ^ b) & 0x80u ? true : (a > b ? a - b : b - a) > 1);
    }
    MESSAGE("dS codes by reciprocal vs by division: " << bad_ds << " of " << x.size() << " differ (by one code)");
    CHECK(bad_p == 0);
    CHECK(far_ds == 0);
    CHECK(bad_ds <= x.size() / 1000);  // measured ~1e-4: only where the two roundings straddle a code boundary
}

// ---- the reference ----------------------------------------------------------------------------

TEST_CASE("float64 reference: gradients equal central finite differences, D equals rowsum(dO * O)") {
    for (bool causal : {false, true}) {
        INFO((causal ? std::string("causal") : std::string("full")));
        config c;
        c.lens_q = {3, 5};
        c.lens_k = {4, 5};
        c.hq = 2;
        c.hkv = 1;
        c.d = 4;
        c.causal = causal;
        c.salt = 21 + causal;
        const problem p = make_problem(c);
        const auto pr = p.reference_problem();
        auto q = widen(p.q), k = widen(p.k), v = widen(p.v), w = widen(p.dout);
        const auto r = reference::attention(pr, q, k, v, w);
        auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk, const std::vector<double>& vv) {
            const auto f = reference::attention(pr, qq, kk, vv);
            double s = 0;
            for (std::size_t i = 0; i < f.o.size(); ++i) s += f.o[i] * w[i];
            return s;
        };
        const double h = 1e-6;
        double worst = 0, scale = 0;
        auto check_grad = [&](std::vector<double>& x, const std::vector<double>& grad) {
            for (std::size_t i = 0; i < x.size(); ++i) {
                const double keep = x[i];
                x[i] = keep + h;
                const double up = loss(q, k, v);
                x[i] = keep - h;
                const double dn = loss(q, k, v);
                x[i] = keep;
                const double fd = (up - dn) / (2 * h);
                worst = std::max(worst, std::fabs(fd - grad[i]));
                scale = std::max(scale, std::fabs(grad[i]));
            }
        };
        check_grad(q, r.dq);
        check_grad(k, r.dk);
        check_grad(v, r.dv);
        MESSAGE("reference vs finite differences (" << (causal ? std::string("causal") : std::string("full"))
                                                    << "): max error " << worst << " of max |grad| " << scale);
        CHECK(worst <= 1e-7 * scale);  // central differences with h = 1e-6: truncation ~1e-12, cancellation ~1e-10
        // D_i = sum_j P_ij dP_ij equals rowsum(dO_i * O_i) in exact arithmetic
        const int tq = p.tq, H = c.hq, d = c.d;
        for (int t = 0; t < tq; ++t)
            for (int hh = 0; hh < H; ++hh) {
                double s = 0;
                for (int e = 0; e < d; ++e)
                    s += w[(static_cast<std::size_t>(t) * H + hh) * d + e] *
                         r.o[(static_cast<std::size_t>(t) * H + hh) * d + e];
                CHECK(r.delta[static_cast<std::size_t>(hh) * tq + t] == doctest::Approx(s).epsilon(1e-12).scale(1.0));
            }
    }
}

TEST_CASE("float64 reference: a query that sees no key has O = 0, L = +Inf and no gradient") {
    config c;
    c.lens_q = {4};
    c.lens_k = {2};  // causal: query i sees keys j <= i - 2, so queries 0 and 1 see nothing
    c.hq = 1;
    c.hkv = 1;
    c.d = 4;
    c.causal = true;
    const problem p = make_problem(c);
    const auto r = reference::attention(p.reference_problem(), widen(p.q), widen(p.k), widen(p.v), widen(p.dout));
    CHECK(std::isinf(r.lse[0]));
    CHECK(std::isinf(r.lse[1]));
    CHECK(std::isfinite(r.lse[2]));
    for (int e = 0; e < 8; ++e) {
        CHECK(r.o[e] == 0.0);
        CHECK(r.dq[e] == 0.0);
    }
}

// ---- the host path against float64 -------------------------------------------------------------

struct tolerances {
    double o, dq, dk, dv;  // against float64 on the dequantized operands (matched delta)
};

template <class QR, class KR = QR, class VR = QR, class DR = QR, class OT = float, class GT = float>
void check_against_reference(const config& c, const tolerances& tol, const char* name_c) {
    const std::string name(name_c);
    INFO("case " << name);
    const problem p = make_problem(c);
    quantized<QR, KR, VR, DR> qz(p);
    const auto shape = p.shape();
    const std::size_t cq = static_cast<std::size_t>(c.hq) * c.d, ck = static_cast<std::size_t>(c.hkv) * c.d,
                      R = static_cast<std::size_t>(c.hq) * p.tq;
    const auto mask = c.causal ? attention_mask::causal : attention_mask::full;
    std::vector<OT> o(p.tq * cq);
    std::vector<float> lse(R);
    attention_forward(on_host(), shape, qz.q.cref(), qz.k.cref(), qz.v.cref(), matrix_ref<OT>(o.data(), p.tq, cq),
                      span<float>(lse.data(), R), c.forward_options());
    const auto pr = p.reference_problem();
    const auto rq = reference::attention(pr, qz.qd, qz.kd, qz.vd, qz.dd);
    const auto r0 = reference::attention(pr, widen(p.q), widen(p.k), widen(p.v), widen(p.dout));
    const double eo = rel_l2(widen(o), rq.o), eo0 = rel_l2(widen(o), r0.o);
    // End to end (against float64 on the original data) the error is mostly what quantizing the
    // inputs does to the exact function, e_base = relL2(exact(quantized inputs), exact(originals)),
    // which depends on the recipe and the data, not on this code. The path's own error must not
    // add more than twice its internal tolerance on top of it.
    const double eo_base = rel_l2(rq.o, r0.o);
    bool inf_agree = false;
    const double el = max_abs_finite(widen(lse), rq.lse, inf_agree);
    CHECK(inf_agree);
    CHECK(el <= 1e-5);  // L comes from float scores and float sums, not from FP8 P: float level
    CHECK(eo <= tol.o);
    CHECK(eo0 <= eo_base + 2 * tol.o);
    for (delta_mode mode : {delta_mode::matched, delta_mode::from_output}) {
        const bool matched = mode == delta_mode::matched;
        attention_backward_options bo;
        bo.mask = mask;
        bo.delta = mode;
        std::vector<GT> dq(p.tq * cq), dk(p.tk * ck), dv(p.tk * ck);
        attention_backward(on_host(), shape, qz.q.cref(), qz.k.cref(), qz.v.cref(),
                           matrix_ref<const OT>(o.data(), p.tq, cq), span<const float>(lse.data(), R), qz.dout.cref(),
                           matrix_ref<GT>(dq.data(), p.tq, cq), matrix_ref<GT>(dk.data(), p.tk, ck),
                           matrix_ref<GT>(dv.data(), p.tk, ck), bo);
        const double e[3] = {rel_l2(widen(dq), rq.dq), rel_l2(widen(dk), rq.dk), rel_l2(widen(dv), rq.dv)};
        const double e0[3] = {rel_l2(widen(dq), r0.dq), rel_l2(widen(dk), r0.dk), rel_l2(widen(dv), r0.dv)};
        const double base[3] = {rel_l2(rq.dq, r0.dq), rel_l2(rq.dk, r0.dk), rel_l2(rq.dv, r0.dv)};
        MESSAGE(name << (matched ? std::string(" matched    ") : std::string(" from_output"))
                     << ": relL2 vs float64 (dequantized | original) O " << eo << " | " << eo0 << ", dQ " << e[0]
                     << " | " << e0[0] << ", dK " << e[1] << " | " << e0[1] << ", dV " << e[2] << " | " << e0[2]);
        INFO((matched ? std::string("matched") : std::string("from_output"))
             << ": dQ " << e[0] << " dK " << e[1] << " dV " << e[2]);
        if (matched) {
            CHECK(e[0] <= tol.dq);
            CHECK(e[1] <= tol.dk);
            CHECK(e0[0] <= base[0] + 2 * tol.dq);
            CHECK(e0[1] <= base[1] + 2 * tol.dk);
        } else {
            // the stale delta: dQ and dK are worse than matched's, bounded by 5x matched's tolerance
            CHECK(e[0] <= 5 * tol.dq);
            CHECK(e[1] <= 5 * tol.dk);
        }
        CHECK(e[2] <= tol.dv);  // dV does not involve D
        CHECK(e0[2] <= base[2] + 2 * tol.dv);
    }
}

// Measured maxima over 3 seeds (docs/attention.md): per-token V scales: O 0.028, dQ 0.022, dK 0.015, dV 0.028
// (the fold of s_v into P costs the tile maximum its exactness); per-head V: O 0.009. End to end
// the errors are 0.07-0.13, mostly E4M3's 3 mantissa bits on every input amplified by the softmax
// (measured against the float64 function of the quantized inputs, see check_against_reference).
const tolerances kPerTokenV{0.04, 0.03, 0.025, 0.04};
const tolerances kPerHeadV{0.015, 0.03, 0.025, 0.04};

TEST_CASE("host path vs float64: head dim 64, full and causal, GQA 4:2, ragged batch with an empty sequence") {
    config c;
    c.lens_q = {37, 130, 0, 64, 1};
    c.hq = 4;
    c.hkv = 2;
    c.d = 64;
    c.salt = 31;
    check_against_reference<per_token<64>>(c, kPerTokenV, "d64 full per-token");
    c.causal = true;
    check_against_reference<per_token<64>>(c, kPerTokenV, "d64 causal per-token");
}

TEST_CASE(
    "host path vs float64: key tiles visited front to back, the other order (full and causal, ragged, several tiles)") {
    config c;
    c.lens_q = {37, 200, 0, 64, 130};
    c.hq = 4;
    c.hkv = 2;
    c.d = 64;
    c.salt = 37;
    c.key_order = key_tile_order::front_to_back;
    check_against_reference<per_token<64>>(c, kPerTokenV, "d64 full per-token front to back");
    c.causal = true;
    check_against_reference<per_token<64>>(c, kPerTokenV, "d64 causal per-token front to back");
    c.lens_k = {50, 190, 7, 64, 129};  // causal with Lk != Lq: the last tile is partial and the first may be skipped
    check_against_reference<per_token<64>>(c, kPerTokenV, "d64 causal Lk != Lq front to back");
}

// An attention sink, built so that the census has an exact answer: one sequence of 192 tokens
// (three key tiles), one head; key 0 is 256 along channel 0 and zero elsewhere, every other key is
// N(0, 1) on channels 1..63 and zero on channel 0; every query is 1 on channel 0 plus N(0, 0.25) on
// the rest. With the softmax scale 1/8 the sink's score is 32 nats above the others (46 binades),
// whose own scores spread by about 0.5 nats. Front to back, the sink sets the running maximum first
// and every other key's P is 2^-46 relative to it: below E4M3's smallest subnormal at the 2^-8 scale
// (2^-17), so all 191 round to zero in every row. Back to front, tiles 2 and 1 are taken against
// their own maximum (within a few binades: normal codes); only the 63 other keys of the sink's own
// tile round to zero. Either way P is positive in float for every pair.
TEST_CASE("P census: with an attention sink front to back flushes every other key, back to front only its tile") {
    constexpr int n = 192, d = 64;
    auto g = octet_test::rng(41);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> q(n * d), k(n * d, 0.0f), v(n * d);
    for (int t = 0; t < n; ++t) {
        q[t * d] = 1.0f;
        for (int e = 1; e < d; ++e) q[t * d + e] = 0.5f * normal(g);
        if (t == 0)
            k[0] = 256.0f;
        else
            for (int e = 1; e < d; ++e) k[t * d + e] = normal(g);
        for (int e = 0; e < d; ++e) v[t * d + e] = normal(g);
    }
    using R = per_token<64>;
    using RV = per_head<64>;  // one V scale: P is encoded unscaled, so the sink's P of 1 is exact
    quantized_tensor<R> qq(n, d), kq(n, d);
    quantized_tensor<RV> vq(n, d);
    quantize<R>(on_host(), matrix_ref<const float>(q.data(), n, d), qq.ref());
    quantize<R>(on_host(), matrix_ref<const float>(k.data(), n, d), kq.ref());
    quantize<RV>(on_host(), matrix_ref<const float>(v.data(), n, d), vq.ref());
    const std::vector<std::int32_t> cu{0, n};
    attention_shape shape;
    shape.cu_seqlens_q = span<const std::int32_t>(cu.data(), cu.size());
    shape.heads_q = shape.heads_kv = 1;
    shape.head_dim = d;
    std::vector<float> o(n * d), lse(n);
    attention_options opt;  // full mask, scale 1/8
    attention_p_census front, back;
    opt.key_order = key_tile_order::front_to_back;
    attention_forward(on_host(), shape, qq.cref(), kq.cref(), vq.cref(), matrix_ref<float>(o.data(), n, d),
                      span<float>(lse.data(), n), opt, front);
    const std::vector<float> o_front = o;
    opt.key_order = key_tile_order::back_to_front;
    attention_forward(on_host(), shape, qq.cref(), kq.cref(), vq.cref(), matrix_ref<float>(o.data(), n, d),
                      span<float>(lse.data(), n), opt, back);
    MESSAGE("sink census: front to back " << front.flushed << " of " << front.pairs << " flushed, " << front.subnormal
                                          << " subnormal; back to front " << back.flushed << " of " << back.pairs
                                          << " flushed, " << back.subnormal << " subnormal");
    CHECK(front.pairs == std::uint64_t{n} * n);
    CHECK(back.pairs == std::uint64_t{n} * n);
    CHECK(front.flushed == std::uint64_t{n} * (n - 1));
    CHECK(back.flushed == std::uint64_t{n} * 63);
    CHECK(back.subnormal == 0);
    CHECK(front.flushed_share() == doctest::Approx(191.0 / 192.0));
    // the sink holds all but 2^-46 of each row's mass: both orders give O = V_0 to float level
    for (int t = 0; t < n; ++t)
        for (int e = 0; e < d; ++e) {
            const double v0 = decode<e4m3>(vq.cref().code(0, e)) * static_cast<double>(vq.cref().scale(0, 0));
            CHECK(std::fabs(o_front[t * d + e] - v0) <= 1e-6 * (1 + std::fabs(v0)));
            CHECK(std::fabs(o[t * d + e] - v0) <= 1e-6 * (1 + std::fabs(v0)));
        }
}

TEST_CASE("host path vs float64: head dim 128, causal, GQA 4:1, bf16 outputs") {
    config c;
    c.lens_q = {100, 3, 64};
    c.hq = 4;
    c.hkv = 1;
    c.d = 128;
    c.causal = true;
    c.salt = 32;
    check_against_reference<per_token<128>, per_token<128>, per_token<128>, per_token<128>, bf16, bf16>(
        c, kPerTokenV, "d128 causal bf16");
}

TEST_CASE("host path vs float64: recipes (per head, E5M2 dO per tensor, UE8M0 powers of two, per tensor)") {
    config c;
    c.lens_q = {37, 70};
    c.hq = 2;
    c.hkv = 2;
    c.d = 128;
    c.salt = 33;
    check_against_reference<per_head<128>>(c, kPerHeadV, "d128 per-head");
    check_against_reference<per_head<128>, per_head<128>, per_head<128>, recipes::tensorwise_e5m2>(
        c, kPerHeadV, "d128 per-head, dO E5M2");
    check_against_reference<per_token_pow2<128>>(c, kPerTokenV, "d128 per-token UE8M0");
    check_against_reference<recipes::tensorwise_e4m3>(c, kPerHeadV, "d128 per-tensor");
}

TEST_CASE(
    "host path vs float64: causal with fewer keys than queries (rows that see no key) and a sequence without keys") {
    config c;
    c.lens_q = {50, 100, 7};
    c.lens_k = {120, 60, 0};
    c.hq = 2;
    c.hkv = 1;
    c.d = 64;
    c.causal = true;
    c.salt = 34;
    check_against_reference<per_token<64>>(c, kPerTokenV, "d64 cross-length causal");
    // and the convention itself: O = 0, L = +Inf, dQ = 0 on rows that see nothing
    const problem p = make_problem(c);
    quantized<per_token<64>> qz(p);
    const std::size_t cq = 2 * 64, R = 2 * static_cast<std::size_t>(p.tq);
    std::vector<float> o(p.tq * cq, 1.0f), lse(R), dq(p.tq * cq, 1.0f), dk(p.tk * 64), dv(p.tk * 64);
    attention_forward(on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(),
                      matrix_ref<float>(o.data(), p.tq, cq), span<float>(lse.data(), R), {attention_mask::causal});
    attention_backward_options bo;
    bo.mask = attention_mask::causal;
    attention_backward(on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(),
                       matrix_ref<const float>(o.data(), p.tq, cq), span<const float>(lse.data(), R), qz.dout.cref(),
                       matrix_ref<float>(dq.data(), p.tq, cq), matrix_ref<float>(dk.data(), p.tk, 64),
                       matrix_ref<float>(dv.data(), p.tk, 64), bo);
    int empty_rows = 0;
    for (int t = 0; t < p.tq; ++t) {
        // sequence 1 (tokens 50..149): the first 40 queries see no key; sequence 2 (150..156) has none
        const bool sees_nothing = (t >= 50 && t < 90) || t >= 150;
        for (int h = 0; h < 2; ++h) {
            if (!sees_nothing) continue;
            ++empty_rows;
            CHECK(std::isinf(lse[static_cast<std::size_t>(h) * p.tq + t]));
            for (int e = 0; e < 64; ++e) {
                CHECK(o[static_cast<std::size_t>(t) * cq + h * 64 + e] == 0.0f);
                CHECK(dq[static_cast<std::size_t>(t) * cq + h * 64 + e] == 0.0f);
            }
        }
    }
    CHECK(empty_rows == 2 * 47);
}

TEST_CASE("host path: a NaN code in a key row makes the rows that see it NaN, and only those") {
    config c;
    c.lens_q = {20, 20};
    c.hq = 1;
    c.hkv = 1;
    c.d = 64;
    c.causal = true;
    c.salt = 35;
    const problem p = make_problem(c);
    quantized<per_token<64>> qz(p);
    qz.k.data()[static_cast<std::size_t>(25) * qz.k.layout().row_bytes + 3] = 0x7F;  // key 5 of sequence 1
    std::vector<float> o(p.tq * 64), lse(p.tq);
    attention_forward(on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(),
                      matrix_ref<float>(o.data(), p.tq, 64), span<float>(lse.data(), p.tq), {attention_mask::causal});
    for (int t = 0; t < p.tq; ++t) {
        const bool sees = t >= 25;  // sequence 1, queries 5..19
        INFO("token " << t);
        CHECK(std::isnan(o[static_cast<std::size_t>(t) * 64]) == sees);
    }
}

// ---- argument checks ------------------------------------------------------------------------------

TEST_CASE("attention arguments: bad shapes, heads, offsets and scale grids throw octet::error naming the argument") {
    config c;
    c.lens_q = {10, 6};
    c.hq = 4;
    c.hkv = 2;
    c.d = 64;
    const problem p = make_problem(c);
    quantized<per_token<64>> qz(p);
    const std::size_t cq = 4 * 64;
    std::vector<float> o(p.tq * cq), lse(4 * p.tq), dq(p.tq * cq), dk(p.tk * 128), dv(p.tk * 128);
    auto fwd = [&](const attention_shape& s) {
        attention_forward(on_host(), s, qz.q.cref(), qz.k.cref(), qz.v.cref(), matrix_ref<float>(o.data(), p.tq, cq),
                          span<float>(lse.data(), lse.size()));
    };
    CHECK_NOTHROW(fwd(p.shape()));

    attention_shape s = p.shape();
    s.head_dim = 128;  // head dims disagree with the tensors
    CHECK_THROWS_WITH_AS(fwd(s), doctest::Contains("argument 'q'"), octet::error);
    s = p.shape();
    s.heads_kv = 3;  // does not divide 4
    CHECK_THROWS_WITH_AS(fwd(s), doctest::Contains("argument 'shape.heads_kv'"), octet::error);
    s.heads_kv = 0;
    CHECK_THROWS_WITH_AS(fwd(s), doctest::Contains("argument 'shape.heads_kv'"), octet::error);

    const std::vector<std::int32_t> unordered{0, 12, 10, 16};
    s = p.shape();
    s.cu_seqlens_q = span<const std::int32_t>(unordered.data(), unordered.size());
    s.cu_seqlens_k = {};
    CHECK_THROWS_WITH_AS(fwd(s), doctest::Contains("out of order"), octet::error);
    const std::vector<std::int32_t> not_zero{2, 10, 16}, short_total{0, 10, 15};
    s.cu_seqlens_q = span<const std::int32_t>(not_zero.data(), not_zero.size());
    CHECK_THROWS_WITH_AS(fwd(s), doctest::Contains("argument 'shape.cu_seqlens_q'"), octet::error);
    s.cu_seqlens_q = span<const std::int32_t>(short_total.data(), short_total.size());
    CHECK_THROWS_WITH_AS(fwd(s), doctest::Contains("argument 'shape.cu_seqlens_q'"), octet::error);
    const std::vector<std::int32_t> k_batch{0, 16};
    s = p.shape();
    s.cu_seqlens_k = span<const std::int32_t>(k_batch.data(), k_batch.size());
    CHECK_THROWS_WITH_AS(fwd(s), doctest::Contains("argument 'shape.cu_seqlens_k'"), octet::error);

    // a scale grid too small for its data
    auto small = qz.k.cref();
    small.layout.scale_bytes = 4;
    CHECK_THROWS_WITH_AS(attention_forward(on_host(), p.shape(), qz.q.cref(), small, qz.v.cref(),
                                           matrix_ref<float>(o.data(), p.tq, cq), span<float>(lse.data(), lse.size())),
                         doctest::Contains("argument 'k'"), octet::error);
    // scale blocks that split a head (MX's 1 x 32)
    quantized<recipes::mxfp8_e4m3> mx(p);
    CHECK_THROWS_WITH_AS(attention_forward(on_host(), p.shape(), mx.q.cref(), mx.k.cref(), mx.v.cref(),
                                           matrix_ref<float>(o.data(), p.tq, cq), span<float>(lse.data(), lse.size())),
                         doctest::Contains("split a head"), octet::error);
    // outputs
    CHECK_THROWS_WITH_AS(
        attention_forward(on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(),
                          matrix_ref<float>(o.data(), p.tq, cq), span<float>(lse.data(), lse.size() - 1)),
        doctest::Contains("argument 'lse'"), octet::error);
    CHECK_THROWS_WITH_AS(
        attention_forward(on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(),
                          matrix_ref<float>(o.data(), p.tq, cq - 64), span<float>(lse.data(), lse.size())),
        doctest::Contains("argument 'o'"), octet::error);
    attention_options bad_scale;
    bad_scale.softmax_scale = INFINITY;
    CHECK_THROWS_WITH_AS(
        attention_forward(on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(),
                          matrix_ref<float>(o.data(), p.tq, cq), span<float>(lse.data(), lse.size()), bad_scale),
        doctest::Contains("argument 'options.softmax_scale'"), octet::error);
    attention_options bad_order;
    bad_order.key_order = static_cast<key_tile_order>(2);
    CHECK_THROWS_WITH_AS(
        attention_forward(on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(),
                          matrix_ref<float>(o.data(), p.tq, cq), span<float>(lse.data(), lse.size()), bad_order),
        doctest::Contains("argument 'options.key_order'"), octet::error);
    attention_options bad_kernel;
    bad_kernel.kernel = static_cast<attention_kernel>(7);
    CHECK_THROWS_WITH_AS(
        attention_forward(on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(),
                          matrix_ref<float>(o.data(), p.tq, cq), span<float>(lse.data(), lse.size()), bad_kernel),
        doctest::Contains("argument 'options.kernel'"), octet::error);

    // backward: from_output needs O; dK shape must follow heads_kv
    attention_backward_options bo;
    bo.delta = delta_mode::from_output;
    CHECK_THROWS_WITH_AS(
        attention_backward(on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(), matrix_ref<const float>{},
                           span<const float>(lse.data(), lse.size()), qz.dout.cref(),
                           matrix_ref<float>(dq.data(), p.tq, cq), matrix_ref<float>(dk.data(), p.tk, 128),
                           matrix_ref<float>(dv.data(), p.tk, 128), bo),
        doctest::Contains("argument 'o'"), octet::error);
    bo.delta = delta_mode::matched;
    CHECK_NOTHROW(attention_backward(
        on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(), matrix_ref<const float>{},
        span<const float>(lse.data(), lse.size()), qz.dout.cref(), matrix_ref<float>(dq.data(), p.tq, cq),
        matrix_ref<float>(dk.data(), p.tk, 128), matrix_ref<float>(dv.data(), p.tk, 128), bo));
    CHECK_THROWS_WITH_AS(
        attention_backward(on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(), matrix_ref<const float>{},
                           span<const float>(lse.data(), lse.size()), qz.dout.cref(),
                           matrix_ref<float>(dq.data(), p.tq, cq), matrix_ref<float>(dk.data(), p.tk, cq),
                           matrix_ref<float>(dv.data(), p.tk, 128), bo),
        doctest::Contains("argument 'dk'"), octet::error);
    quantized<per_token<64>> other(make_problem(config{{10, 7}, {}, 4, 2, 64}));
    CHECK_THROWS_WITH_AS(
        attention_backward(on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(), matrix_ref<const float>{},
                           span<const float>(lse.data(), lse.size()), other.dout.cref(),
                           matrix_ref<float>(dq.data(), p.tq, cq), matrix_ref<float>(dk.data(), p.tk, 128),
                           matrix_ref<float>(dv.data(), p.tk, 128), bo),
        doctest::Contains("argument 'dout'"), octet::error);
    attention_backward_options bad_backward_kernel;
    bad_backward_kernel.kernel = static_cast<attention_kernel>(7);
    CHECK_THROWS_WITH_AS(
        attention_backward(on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(), matrix_ref<const float>{},
                           span<const float>(lse.data(), lse.size()), qz.dout.cref(),
                           matrix_ref<float>(dq.data(), p.tq, cq), matrix_ref<float>(dk.data(), p.tk, 128),
                           matrix_ref<float>(dv.data(), p.tk, 128), bad_backward_kernel),
        doctest::Contains("argument 'options.kernel' is 7"), octet::error);

    // null outputs are named as null, before any ld is looked at
    CHECK_THROWS_WITH_AS(attention_forward(on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(),
                                           matrix_ref<float>(nullptr, p.tq, cq), span<float>(lse.data(), lse.size())),
                         doctest::Contains("argument 'o' is null"), octet::error);
    CHECK_THROWS_WITH_AS(attention_forward(on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(),
                                           matrix_ref<float>(o.data(), p.tq, cq), span<float>(nullptr, lse.size())),
                         doctest::Contains("argument 'lse' is null"), octet::error);
    auto bwd = [&](matrix_ref<const float> o_in, span<const float> l, float* dq_p, float* dk_p, float* dv_p) {
        attention_backward(on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(), o_in, l, qz.dout.cref(),
                           matrix_ref<float>(dq_p, p.tq, cq), matrix_ref<float>(dk_p, p.tk, 128),
                           matrix_ref<float>(dv_p, p.tk, 128), bo);
    };
    const span<const float> L(lse.data(), lse.size());
    CHECK_THROWS_WITH_AS(bwd({}, L, nullptr, dk.data(), dv.data()), doctest::Contains("argument 'dq' is null"),
                         octet::error);
    CHECK_THROWS_WITH_AS(bwd({}, L, dq.data(), nullptr, dv.data()), doctest::Contains("argument 'dk' is null"),
                         octet::error);
    CHECK_THROWS_WITH_AS(bwd({}, L, dq.data(), dk.data(), nullptr), doctest::Contains("argument 'dv' is null"),
                         octet::error);
    CHECK_THROWS_WITH_AS(bwd({}, span<const float>(nullptr, lse.size()), dq.data(), dk.data(), dv.data()),
                         doctest::Contains("argument 'lse' is null"), octet::error);
    CHECK_THROWS_WITH_AS(bwd(matrix_ref<const float>(nullptr, p.tq, cq), L, dq.data(), dk.data(), dv.data()),
                         doctest::Contains("argument 'o' is null"), octet::error);
    // a real ld problem still says ld
    CHECK_THROWS_WITH_AS(
        attention_forward(on_host(), p.shape(), qz.q.cref(), qz.k.cref(), qz.v.cref(),
                          matrix_ref<float>(o.data(), p.tq, cq, 64), span<float>(lse.data(), lse.size())),
        doctest::Contains("argument 'o' has ld 64 below its 256 columns"), octet::error);
}

}  // namespace attention_host_test
