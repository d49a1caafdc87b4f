// The fused AdamW step on the host: against the float64 reference (with an error bound carried
// step by step from the float operations), the codecs composed with it, thread-count and shard
// invariance, the non-finite policies, the zero-second-moment guarantee, master weights that keep
// updates smaller than half a bf16 ulp, and the bytes-per-parameter / memory-ledger arithmetic.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "octet/optim/adamw.hpp"
#include "octet/optim/memory.hpp"
#include "octet/optim/moments.hpp"
#include "octet/reference/adamw.hpp"
#include "support/random.hpp"

using namespace octet;

namespace {

const double u = std::ldexp(1.0, -24);  // float unit roundoff

reference::adamw_hyper widen(const adamw_hyper& h) {
    return {h.beta1, h.beta2, h.eps, h.weight_decay};
}

std::vector<float> normal_vec(std::mt19937_64& g, std::size_t n, float sd = 1.0f) {
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

/// Per-element gradient scales spanning 1e-4 .. 1e1, with 3% of elements always zero.
std::vector<float> gradient_scales(std::mt19937_64& g, std::size_t n) {
    std::uniform_real_distribution<float> e(-4.0f, 1.0f), p(0.0f, 1.0f);
    std::vector<float> s(n);
    for (auto& x : s) x = p(g) < 0.03f ? 0.0f : std::pow(10.0f, e(g));
    return s;
}

template <class State>
bool same_bits(const State& a, const State& b) {
    auto eq = [](const auto& x, const auto& y) {
        return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0);
    };
    return eq(a.params, b.params) && eq(a.compensation, b.compensation) && eq(a.m_codes, b.m_codes) &&
           eq(a.m_meta, b.m_meta) && eq(a.v_codes, b.v_codes) && eq(a.v_meta, b.v_meta);
}

}  // namespace

TEST_CASE("float step against the float64 reference, with a bound carried through every operation") {
    auto g = octet_test::rng(10);
    const std::size_t n = 1000;  // ragged: 3 full blocks and a partial one
    adamw_hyper h;
    h.weight_decay = 0.1f;
    const auto w0 = normal_vec(g, n);
    const auto scale = gradient_scales(g, n);
    adamw_state<state_codec::fp32> st(n);
    st.set_params(as_cspan(w0));
    reference::adamw_state ref(std::vector<double>(w0.begin(), w0.end()));
    // the bound: errors of m and v (tracked per element), then of the weight
    std::vector<double> mabs(n, 0), dm(n, 0), dv(n, 0), bound(n, 0);
    const double b1 = h.beta1, b2 = h.beta2;
    double worst_ratio = 0, worst_ulps = 0;
    for (std::uint64_t t = 1; t <= 60; ++t) {
        const float lr = 1e-2f * static_cast<float>(1 + t % 3) / 3.0f;  // per-step learning rate
        auto gr = normal_vec(g, n);
        for (std::size_t i = 0; i < n; ++i) gr[i] *= scale[i];
        const std::vector<double> gd(gr.begin(), gr.end());
        adamw_step(on_host(), st.ref(), as_cspan(gr), h, t, lr);
        ref.step(as_cspan(gd), widen(h), lr);
        const double bc1 = 1 - std::pow(b1, static_cast<double>(t)), bc2 = 1 - std::pow(b2, static_cast<double>(t));
        for (std::size_t i = 0; i < n; ++i) {
            // m = fma(b1, m, c1 g): the product and the fma round (2u of the larger of |m| and c1|g|,
            // both <= mabs); v = fma(b2, v, c2 (g g)): three roundings of positive terms
            mabs[i] = b1 * mabs[i] + (1 - b1) * std::abs(gd[i]);
            dm[i] = b1 * dm[i] + 2 * u * mabs[i];
            dv[i] = b2 * dv[i] + 3 * u * ref.v[i];
            const double d = std::sqrt(ref.v[i] / bc2) + h.eps;
            const double dir = (ref.m[i] / bc1) / d;
            // d = fma(sqrt(v), 1/sqrt(bc2), eps): sqrt, the rounded constant, the fma: 3u plus dv/2v
            const double dd = (ref.v[i] > 0 ? dv[i] / (2 * ref.v[i]) : 0) + 3 * u;
            const double ddir = (dm[i] / bc1) / d + std::abs(dir) * (dd + u);
            // w' = fma(-lr/bc1, dir, w decay): step size and decay constants, the product, the fma
            bound[i] =
                bound[i] * (1 - lr * h.weight_decay) + lr * (ddir + 2 * u * std::abs(dir)) + 3 * u * std::abs(ref.w[i]);
        }
        for (std::size_t i = 0; i < n; ++i) {
            const double e = std::abs(static_cast<double>(st.params[i]) - ref.w[i]);
            worst_ratio = std::max(worst_ratio, e / (2 * bound[i] + 1e-300));
            worst_ulps = std::max(worst_ulps, e / std::ldexp(1.0, std::ilogb(ref.w[i]) - 23));
            CHECK(std::abs(st.m_codes[i] - ref.m[i]) <= 2 * dm[i] + 1e-300);
            CHECK(std::abs(st.v_codes[i] - ref.v[i]) <= 2 * dv[i] + 1e-300);
        }
    }
    MESSAGE("fp32 step vs float64 after 60 steps: worst error / (2 x carried bound) = "
            << worst_ratio << ", worst " << worst_ulps << " float ulps of the weight");
    CHECK(worst_ratio <= 1.0);
    // elements that never had a gradient only decay: w = w0 (1 - lr wd)^t, m = v = 0
    for (std::size_t i = 0; i < n; ++i)
        if (scale[i] == 0) {
            CHECK(st.m_codes[i] == 0.0f);
            CHECK(st.v_codes[i] == 0.0f);
        }
}

TEST_CASE("bf16 gradients: the step reads them exactly") {
    auto g = octet_test::rng(11);
    const std::size_t n = 700;
    adamw_hyper h;
    const auto w0 = normal_vec(g, n);
    adamw_state<state_codec::fp32> a(n), b(n);
    a.set_params(as_cspan(w0));
    b.set_params(as_cspan(w0));
    for (std::uint64_t t = 1; t <= 5; ++t) {
        const auto gf = normal_vec(g, n);
        std::vector<bf16> gb(n);
        std::vector<float> gw(n);
        for (std::size_t i = 0; i < n; ++i) gw[i] = to_float(gb[i] = to_bf16(gf[i]));
        adamw_step(on_host(), a.ref(), as_cspan(gb), h, t, 1e-3f);
        adamw_step(on_host(), b.ref(), as_cspan(gw), h, t, 1e-3f);
    }
    CHECK(same_bits(a, b));
}

TEST_CASE("grad_scale: the step reads g * scale, as from gradients scaled beforehand, bf16 without a second rounding") {
    auto g = octet_test::rng(17);
    const std::size_t n = 1000;
    const auto w0 = normal_vec(g, n);
    adamw_state<state_codec::dynamic8, state_codec::dynamic8, master::bf16_stochastic> a(n), b(n), c(n), d(n);
    for (auto* s : {&a, &b, &c, &d}) s->set_params(as_cspan(w0));
    adamw_hyper plain, scaled;
    plain.seed = scaled.seed = 5;
    for (std::uint64_t t = 1; t <= 6; ++t) {
        const float scale = t == 1 ? 1.0f : 1.0f / static_cast<float>(t * t + 0.37);  // a clipping coefficient
        scaled.grad_scale = scale;
        auto gf = normal_vec(g, n);
        gf[t] = 0.0f, gf[t + 1] = 1e-30f;  // zero and (scaled) subnormal gradients
        std::vector<float> pre(n), pre_b(n);
        std::vector<bf16> gb(n);
        for (std::size_t i = 0; i < n; ++i) {
            pre[i] = gf[i] * scale;
            gb[i] = to_bf16(gf[i]);
            pre_b[i] = to_float(gb[i]) * scale;
        }
        adamw_step(on_host(), a.ref(), as_cspan(gf), scaled, t, 1e-3f);
        adamw_step(on_host(), b.ref(), as_cspan(pre), plain, t, 1e-3f);
        adamw_step(on_host(), c.ref(), as_cspan(gb), scaled, t, 1e-3f);
        adamw_step(on_host(), d.ref(), as_cspan(pre_b), plain, t, 1e-3f);
    }
    CHECK(same_bits(a, b));
    CHECK(same_bits(c, d));
    CHECK_FALSE(same_bits(a, c));  // bf16 gradients did change something
}

TEST_CASE_TEMPLATE("the fused step is decode -> AdamW -> encode (float64 in the middle)", Codec, state_codec::bf16,
                   state_codec::bf16_stochastic, state_codec::e4m3_scaled, state_codec::e4m3_expanded,
                   state_codec::dynamic8) {
    auto g = octet_test::rng(12);
    const std::size_t n = 5000;
    const adamw_hyper h;
    // a non-trivial starting state: moments of 20 steps of gradients with per-element scales
    const auto scale = gradient_scales(g, n);
    std::vector<float> m(n, 0), v(n, 0);
    for (int t = 0; t < 20; ++t) {
        const auto gr = normal_vec(g, n);
        for (std::size_t i = 0; i < n; ++i) {
            m[i] = 0.9f * m[i] + 0.1f * gr[i] * scale[i];
            v[i] = 0.999f * v[i] + 0.001f * gr[i] * gr[i] * scale[i] * scale[i];
        }
    }
    adamw_state<Codec> st(n);
    st.set_params(as_cspan(normal_vec(g, n)));
    encode_moments<Codec, moment::first>(on_host(), as_cspan(m), as_span(st.m_codes), as_span(st.m_meta));
    encode_moments<Codec, moment::second>(on_host(), as_cspan(v), as_span(st.v_codes), as_span(st.v_meta));
    // reference: decode, step in float64
    std::vector<float> md(n), vd(n);
    decode_moments<Codec, moment::first>(on_host(), as_cspan(st.m_codes), as_cspan(st.m_meta), as_span(md));
    decode_moments<Codec, moment::second>(on_host(), as_cspan(st.v_codes), as_cspan(st.v_meta), as_span(vd));
    reference::adamw_state ref(std::vector<double>(st.params.begin(), st.params.end()));
    ref.m.assign(md.begin(), md.end());
    ref.v.assign(vd.begin(), vd.end());
    ref.t = 20;
    auto gr = normal_vec(g, n);
    for (std::size_t i = 0; i < n; ++i) gr[i] *= scale[i];
    adamw_step(on_host(), st.ref(), as_cspan(gr), h, 21, 1e-3f);
    ref.step(as_cspan(std::vector<double>(gr.begin(), gr.end())), widen(h), 1e-3);
    // weights: a one-step float bound (see the test above) with 4x slack for the decoded inputs
    double worst = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const double d = std::sqrt(ref.v[i] / (1 - std::pow(0.999, 21.0))) + h.eps;
        const double dir = std::abs(ref.m[i] / (1 - std::pow(0.9, 21.0)) / d);
        const double b = 1e-3 * 16 * u * (dir + std::abs(ref.m[i]) / d) + 4 * u * std::abs(ref.w[i]);
        worst = std::max(worst, std::abs(st.params[i] - ref.w[i]) / b);
    }
    CHECK(worst <= 1.0);
    // moments: the new codes are the codec's encoding of the float64 moments, except where float
    // and float64 land on opposite sides of a rounding boundary (then one code apart)
    std::vector<float> mr(ref.m.begin(), ref.m.end()), vr(ref.v.begin(), ref.v.end());
    adamw_state<Codec> enc(n);
    const philox_stream step_bits{h.seed, 21};  // a stochastic codec's bits: the step's stream (state_codec.hpp)
    encode_moments<Codec, moment::first>(on_host(), as_cspan(mr), as_span(enc.m_codes), as_span(enc.m_meta), step_bits);
    encode_moments<Codec, moment::second>(on_host(), as_cspan(vr), as_span(enc.v_codes), as_span(enc.v_meta),
                                          step_bits);
    auto code_int = [](auto c) -> int {
        if constexpr (std::is_same_v<decltype(c), bf16>)
            return static_cast<std::int16_t>(c.bits);
        else
            return static_cast<int>(c & 0x7F) * ((c & 0x80) ? -1 : 1);
    };
    // bf16 codes are fine enough that float's own rounding of a moment that cancels (b m + (1-b) g
    // with terms much larger than the sum) can move it by more than a code's spacing: allow the
    // codes that float error spans (a bound of 4u on the terms' magnitude).
    auto slack = [&](int k, std::size_t i) -> int {
        if constexpr (!std::is_same_v<typename Codec::code_type, bf16>) {
            return 0;
        } else {
            const double g2 = static_cast<double>(gr[i]) * gr[i];
            const double terms = k ? 0.999 * vd[i] + 0.001 * g2 : 0.9 * std::abs(md[i]) + 0.1 * std::abs(gr[i]);
            const double r = k ? ref.v[i] : ref.m[i];
            if (r == 0.0) return 0;
            const double spacing = std::ldexp(1.0, std::ilogb(r) - 7);
            return static_cast<int>(std::ceil(4 * u * terms / spacing));
        }
    };
    std::size_t differ = 0, far = 0;
    for (std::size_t i = 0; i < n; ++i) {
        for (int k = 0; k < 2; ++k) {
            const int a = code_int(k ? st.v_codes[i] : st.m_codes[i]),
                      b = code_int(k ? enc.v_codes[i] : enc.m_codes[i]);
            differ += a != b;
            far += std::abs(a - b) > 1 + slack(k, i) && !((a == 0) != (b == 0) && std::abs(a) + std::abs(b) == 1);
        }
    }
    MESSAGE("codes that differ from encode(float64 step): " << differ << " of " << 2 * n);
    CHECK(far == 0);
    CHECK(differ <= 2 * n / 200);  // float vs float64 moments differ by ulps: rare boundary cases only
}

TEST_CASE("results do not depend on the thread count") {
    auto g = octet_test::rng(13);
    const std::size_t n = 100000 + 77;
    adamw_hyper h;
    h.seed = 99;
    using St = adamw_state<state_codec::dynamic8, state_codec::e4m3_expanded, master::bf16_stochastic>;
    St a(n), b(n);
    const auto w0 = normal_vec(g, n);
    a.set_params(as_cspan(w0));
    b.set_params(as_cspan(w0));
    for (std::uint64_t t = 1; t <= 3; ++t) {
        const auto gr = normal_vec(g, n, 0.01f);
        adamw_step(on_host(1), a.ref(), as_cspan(gr), h, t, 1e-3f);
        adamw_step(on_host(4), b.ref(), as_cspan(gr), h, t, 1e-3f);
    }
    CHECK(same_bits(a, b));
}

/// The host step compiled for one instruction set (core/isa_dispatch.hpp's run_fma_kernel).
template <class St, class G>
void step_with_isa(detail::simd_isa isa, St& s, const std::vector<G>& gr, const adamw_hyper& h, std::uint64_t t) {
    optim_detail::step_backend<host_executor>::run(on_host(1), s.ref(), as_cspan(gr), h, t, 1e-3f, nullptr, isa);
}

template <class MC, class M, class G = float>
void check_isa_variants(std::uint64_t salt) {
    auto g = octet_test::rng(salt);
    const std::size_t n = 3 * optim_block + 77;
    adamw_hyper h;
    h.seed = 5;
    using St = adamw_state<MC, MC, M>;
    const auto w0 = normal_vec(g, n);
    St portable(n);
    portable.set_params(as_cspan(w0));
    std::vector<std::vector<float>> grads;
    for (int t = 0; t < 3; ++t) {
        auto gr = normal_vec(g, n, 0.01f);
        for (std::size_t i = 0; i < n; i += 97) gr[i] *= 1e-6f;  // tiny gradients: subnormal-range moments
        grads.push_back(gr);
    }
    auto as_g = [](const std::vector<float>& x) {
        std::vector<G> y(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) {
            if constexpr (std::is_same_v<G, bf16>)
                y[i] = to_bf16(x[i]);
            else
                y[i] = x[i];
        }
        return y;
    };
    for (int t = 0; t < 3; ++t) step_with_isa(detail::simd_isa::portable, portable, as_g(grads[t]), h, t + 1);
    for (const auto isa : {detail::simd_isa::avx2, detail::simd_isa::avx512}) {
        if (!detail::fma_kernel_supported(isa)) continue;
        INFO("isa " << static_cast<int>(isa));
        St s(n);
        s.set_params(as_cspan(w0));
        for (int t = 0; t < 3; ++t) step_with_isa(isa, s, as_g(grads[t]), h, t + 1);
        CHECK(same_bits(s, portable));
    }
}

TEST_CASE("every instruction-set variant of the host step gives the portable variant's bits") {
    MESSAGE("best variant on this CPU: " << static_cast<int>(detail::best_fma_isa()));
    check_isa_variants<state_codec::fp32, master::fp32>(71);
    check_isa_variants<state_codec::bf16, master::fp32, bf16>(72);
    check_isa_variants<state_codec::bf16_stochastic, master::bf16_stochastic>(73);
    check_isa_variants<state_codec::e4m3_scaled, master::bf16_nearest>(74);
    check_isa_variants<state_codec::e4m3_expanded, master::fp32>(75);
    check_isa_variants<state_codec::e4m3_expanded, master::bf16_kahan, bf16>(76);
    check_isa_variants<state_codec::dynamic8, master::bf16_stochastic>(77);
}

TEST_CASE_TEMPLATE("a flat split on block boundaries gives the same bits as unsharded", Master, master::fp32,
                   master::bf16_stochastic, master::bf16_kahan) {
    auto g = octet_test::rng(14);
    const std::size_t n = 256 * 37 + 100;  // ragged last shard
    adamw_hyper h;
    h.seed = 5;
    h.on_nonfinite = grad_nonfinite_policy::zero_block;
    using St = adamw_state<state_codec::e4m3_scaled, state_codec::dynamic8, Master>;
    St whole(n), parts(n);
    const auto w0 = normal_vec(g, n);
    whole.set_params(as_cspan(w0));
    parts.set_params(as_cspan(w0));
    std::uniform_int_distribution<std::size_t> cut(1, 36);
    std::size_t c1 = cut(g), c2 = cut(g);
    if (c1 > c2) std::swap(c1, c2);
    if (c1 == c2) ++c2;
    const std::size_t bounds[4] = {0, c1 * 256, c2 * 256, n};
    for (std::uint64_t t = 1; t <= 4; ++t) {
        auto gr = normal_vec(g, n, 0.1f);
        if (t == 2) gr[c1 * 256 + 3] = NAN;  // a zeroed block inside a shard
        const auto rw = adamw_step(on_host(), whole.ref(), as_cspan(gr), h, t, 1e-3f);
        std::uint64_t zeroed = 0;
        for (int s = 0; s < 3; ++s) {
            const auto shard = parts.ref().shard(bounds[s], bounds[s + 1] - bounds[s]);
            const auto rs = adamw_step(
                on_host(), shard, span<const float>(gr.data() + bounds[s], bounds[s + 1] - bounds[s]), h, t, 1e-3f);
            zeroed += rs.blocks_zeroed;
        }
        CHECK(zeroed == rw.blocks_zeroed);
    }
    CHECK(same_bits(whole, parts));
    CHECK_THROWS_WITH_AS(parts.ref().shard(100, 256), doctest::Contains("argument 'begin'"), octet::error);
}

TEST_CASE(
    "bf16_stochastic moments: shards and thread counts give the same bits; m, v and the weights draw different bits") {
    auto g = octet_test::rng(18);
    const std::size_t n = 256 * 9 + 40;
    adamw_hyper h;
    h.seed = 77;
    using St = adamw_state<state_codec::bf16_stochastic, state_codec::bf16_stochastic, master::bf16_stochastic>;
    St whole(n), parts(n), threads(n);
    const auto w0 = normal_vec(g, n);
    for (St* s : {&whole, &parts, &threads}) s->set_params(as_cspan(w0));
    for (std::uint64_t t = 1; t <= 3; ++t) {
        const auto gr = normal_vec(g, n, 0.1f);
        adamw_step(on_host(1), whole.ref(), as_cspan(gr), h, t, 1e-3f);
        adamw_step(on_host(3), threads.ref(), as_cspan(gr), h, t, 1e-3f);
        const std::size_t cut = 256 * 4;
        adamw_step(on_host(), parts.ref().shard(0, cut), span<const float>(gr.data(), cut), h, t, 1e-3f);
        adamw_step(on_host(), parts.ref().shard(cut, n - cut), span<const float>(gr.data() + cut, n - cut), h, t,
                   1e-3f);
    }
    CHECK(same_bits(whole, parts));
    CHECK(same_bits(whole, threads));
    // the three streams are disjoint: the words for element i differ between m, v and the weights
    const philox_stream rng{h.seed, 3};
    std::size_t same = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
        const std::uint32_t wm = rng.block(moment_random_block<moment::first>(i)).v[i & 3];
        const std::uint32_t wv = rng.block(moment_random_block<moment::second>(i)).v[i & 3];
        same += (wm == wv) + (wm == rng.bits(i)) + (wv == rng.bits(i));
    }
    CHECK(same == 0);
}

TEST_CASE("non-finite gradients: skip the step, or zero the offending block's moments") {
    auto g = octet_test::rng(15);
    const std::size_t n = 256 * 6;
    using St = adamw_state<state_codec::dynamic8, state_codec::dynamic8, master::bf16_kahan>;
    St base(n);
    base.set_params(as_cspan(normal_vec(g, n)));
    adamw_hyper h;
    for (std::uint64_t t = 1; t <= 3; ++t) adamw_step(on_host(), base.ref(), as_cspan(normal_vec(g, n)), h, t, 1e-3f);
    auto gr = normal_vec(g, n);
    gr[5] = NAN;                  // block 0
    gr[256 * 3 + 7] = -INFINITY;  // block 3
    gr[256 * 3 + 8] = 1e19f;      // block 3: |g| >= 2^63 (its square would overflow)
    gr[256 * 4] = 9e18f;          // block 4: below 2^63, an ordinary (large) gradient

    SUBCASE("skip_step: nothing is written") {
        St st = base;
        h.on_nonfinite = grad_nonfinite_policy::skip_step;
        const auto r = adamw_step(on_host(), st.ref(), as_cspan(gr), h, 4, 1e-3f);
        CHECK(r.skipped == 1);
        CHECK(r.nonfinite_gradients == 3);
        CHECK(r.blocks_zeroed == 0);
        CHECK(same_bits(st, base));
        CHECK(count_nonfinite(on_host(), as_cspan(gr)) == 3);
    }
    SUBCASE("zero_block: offending blocks keep their weights and restart their moments") {
        St st = base, clean = base;
        h.on_nonfinite = grad_nonfinite_policy::zero_block;
        const auto r = adamw_step(on_host(), st.ref(), as_cspan(gr), h, 4, 1e-3f);
        CHECK(r.skipped == 0);
        CHECK(r.nonfinite_gradients == 3);
        CHECK(r.blocks_zeroed == 2);
        auto fixed = gr;  // the same gradients with the offending ones replaced
        fixed[5] = fixed[256 * 3 + 7] = fixed[256 * 3 + 8] = 0.5f;
        adamw_step(on_host(), clean.ref(), as_cspan(fixed), h, 4, 1e-3f);
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t blk = i / 256;
            if (blk == 0 || blk == 3) {
                CHECK(st.params[i].bits == base.params[i].bits);
                CHECK(st.compensation[i].bits == base.compensation[i].bits);
                CHECK(st.m_codes[i] == 0);
                CHECK(st.v_codes[i] == 0);
            } else {
                CHECK(st.params[i].bits == clean.params[i].bits);
                CHECK(st.m_codes[i] == clean.m_codes[i]);
                CHECK(st.v_codes[i] == clean.v_codes[i]);
            }
        }
        CHECK(st.m_meta[0].absmax == 0.0f);
        CHECK(st.v_meta[3].absmax == 0.0f);
        CHECK(st.m_meta[4].absmax == clean.m_meta[4].absmax);
        // the next step with clean gradients restarts those blocks from zero moments: finite
        adamw_step(on_host(), st.ref(), as_cspan(fixed), h, 5, 1e-3f);
        for (std::size_t i = 0; i < n; ++i) CHECK(std::isfinite(to_float(st.params[i])));
    }
}

TEST_CASE_TEMPLATE("zero and tiny second moments do not blow up the update", Codec, state_codec::fp32,
                   state_codec::bf16, state_codec::bf16_stochastic, state_codec::e4m3_scaled,
                   state_codec::e4m3_expanded, state_codec::dynamic8) {
    // Every group mixes elements with no gradient, gradients of 1e-30 and of 1e3, and elements
    // whose gradient arrives only late. Exact Adam bounds the direction:
    //   |m_hat| / sqrt(v_hat) <= C_t = (1-b1)/sqrt(1-b2) sqrt(sum_j<t (b1^2/b2)^j) sqrt(1-b2^t)/(1-b1^t)
    // (Cauchy-Schwarz on the two EMAs). The codecs may misstate a small moment next to a large
    // one by a few tens of percent, so the check allows 3 C_t.
    auto g = octet_test::rng(16);
    const std::size_t n = 1024;
    adamw_hyper h;
    h.weight_decay = 0.0f;
    adamw_state<Codec> st(n);
    const auto w0 = normal_vec(g, n);
    st.set_params(as_cspan(w0));
    std::vector<int> kind(n);
    std::uniform_int_distribution<int> pick(0, 3);
    for (auto& k : kind) k = pick(g);
    const double b1 = h.beta1, b2 = h.beta2;
    double sum = 0, worst = 0;
    const float lr = 1e-3f;
    for (std::uint64_t t = 1; t <= 40; ++t) {
        std::vector<float> gr(n, 0.0f);
        for (std::size_t i = 0; i < n; ++i) {
            const float s = g() & 1 ? 1.0f : -1.0f;
            gr[i] = kind[i] == 0 ? 0.0f : kind[i] == 1 ? s * 1e-30f : kind[i] == 2 ? s * 1e3f : (t > 30 ? s : 0.0f);
        }
        const auto before = st.params;
        adamw_step(on_host(), st.ref(), as_cspan(gr), h, t, lr);
        sum += std::pow(b1 * b1 / b2, static_cast<double>(t - 1));
        const double ct =
            (1 - b1) / std::sqrt(1 - b2) * std::sqrt(sum) * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
        for (std::size_t i = 0; i < n; ++i) {
            const double step = std::abs(static_cast<double>(st.params[i]) - before[i]);
            CHECK(std::isfinite(st.params[i]));
            worst = std::max(worst, step / (lr * ct));
            if (kind[i] == 0) CHECK(st.params[i] == before[i]);  // m = v = 0: the update is exactly 0
        }
    }
    MESSAGE("largest step / (lr C_t) = " << worst);
    CHECK(worst <= 3.0);
}

TEST_CASE("master weights: updates below half a bf16 ulp survive with stochastic rounding and Kahan") {
    // Weights in [1, 2) have a bf16 ulp of 2^-7; each update is 2^-10 (an eighth of an ulp).
    const std::size_t n = 4096;
    const int steps = 200;
    const float delta = std::ldexp(1.0f, -10);
    const double expect = 1.0 + steps * static_cast<double>(delta);  // 1.1953125
    auto run = [&](auto policy) {
        using M = decltype(policy);
        std::vector<typename M::weight_type> w(n);
        std::vector<bf16> c(n, bf16{0});
        for (auto& x : w) {
            if constexpr (std::is_same_v<typename M::weight_type, float>)
                x = 1.0f;
            else
                x = to_bf16(1.0f);
        }
        const philox_stream rng{7, 0};
        for (int s = 0; s < steps; ++s)
            for (std::size_t i = 0; i < n; ++i) {
                no_compensation none;
                auto& comp = [&]() -> auto& {
                    if constexpr (M::has_compensation)
                        return c[i];
                    else
                        return none;
                }
                ();
                const float target = M::load(w[i], comp) + delta;
                M::store(target, w[i], comp, rng.bits(static_cast<std::uint64_t>(s) * n + i));
            }
        double mean = 0, mean_hi = 0;
        for (std::size_t i = 0; i < n; ++i) {
            no_compensation none;
            if constexpr (M::has_compensation)
                mean += M::load(w[i], c[i]);
            else
                mean += M::load(w[i], none);
            if constexpr (std::is_same_v<typename M::weight_type, float>)
                mean_hi += w[i];
            else
                mean_hi += to_float(w[i]);
        }
        return std::make_pair(mean / n, mean_hi / n);
    };
    const auto [f32, f32_hi] = run(master::fp32{});
    const auto [rn, rn_hi] = run(master::bf16_nearest{});
    const auto [sr, sr_hi] = run(master::bf16_stochastic{});
    const auto [kh, kh_hi] = run(master::bf16_kahan{});
    MESSAGE("after 200 updates of 2^-10 from 1.0 (exact " << expect << "): fp32 " << f32 << ", bf16 nearest " << rn
                                                          << ", bf16 stochastic (mean of 4096) " << sr
                                                          << ", bf16 Kahan " << kh << " (bf16 part " << kh_hi << ")");
    CHECK(f32 == doctest::Approx(expect).epsilon(1e-6));
    CHECK(rn == 1.0);  // every update lost
    // SR: each rounding has variance <= ulp^2 / 4; the mean of 4096 independent runs of 200
    // steps has standard deviation <= 2^-7 / 2 * sqrt(200 / 4096) = 8.6e-4: allow 5 of them.
    CHECK(std::abs(sr - expect) <= 5 * 8.6e-4);
    // Kahan: w + c carries the sum; c's own bf16 rounding loses at most half its ulp per step
    // (c < 2^-8, so 2^-17 per step): 200 * 2^-17 = 1.5e-3 at the very worst
    CHECK(std::abs(kh - expect) <= 200 * std::ldexp(1.0, -17));
    CHECK(std::abs(kh_hi - expect) <= std::ldexp(1.0, -8));  // and the bf16 part is the nearest bf16
}

TEST_CASE_TEMPLATE("small learning rates: bf16 nearest stalls inside the fused step, SR and Kahan follow fp32", Master,
                   master::bf16_nearest, master::bf16_stochastic, master::bf16_kahan) {
    // Constant gradient 1: Adam's direction is ~1, so each step moves the weight by ~lr = 2^-10,
    // below half the bf16 ulp (2^-8) of weights in [1, 2).
    const std::size_t n = 2048;
    adamw_hyper h;
    h.weight_decay = 0.0f;
    h.seed = 3;
    std::vector<float> w0(n, 1.5f);
    adamw_state<state_codec::fp32, state_codec::fp32, master::fp32> ref(n);
    adamw_state<state_codec::fp32, state_codec::fp32, Master> st(n);
    ref.set_params(as_cspan(w0));
    st.set_params(as_cspan(w0));
    const std::vector<float> ones(n, 1.0f);
    for (std::uint64_t t = 1; t <= 100; ++t) {
        adamw_step(on_host(), ref.ref(), as_cspan(ones), h, t, std::ldexp(1.0f, -10));
        adamw_step(on_host(), st.ref(), as_cspan(ones), h, t, std::ldexp(1.0f, -10));
    }
    const auto a = ref.params_as_float(), b = st.params_as_float();
    double mean_ref = 0, mean = 0;
    for (std::size_t i = 0; i < n; ++i) {
        mean_ref += a[i];
        mean += b[i];
    }
    mean_ref /= n;
    mean /= n;
    const double moved_ref = 1.5 - mean_ref, moved = 1.5 - mean;
    MESSAGE("moved " << moved << " (fp32 master: " << moved_ref << ")");
    if (std::is_same_v<Master, master::bf16_nearest>)
        CHECK(moved == 0.0);
    else
        CHECK(moved == doctest::Approx(moved_ref).epsilon(0.02));  // 2%: SR noise of the mean is ~0.1%
}

TEST_CASE("stochastic rounding is reproducible from (seed, step, element) and changes with the seed") {
    auto g = octet_test::rng(17);
    const std::size_t n = 3000;
    adamw_hyper h;
    using St = adamw_state<state_codec::bf16, state_codec::bf16, master::bf16_stochastic>;
    St a(n), b(n), c(n);
    const auto w0 = normal_vec(g, n);
    a.set_params(as_cspan(w0));
    b.set_params(as_cspan(w0));
    c.set_params(as_cspan(w0));
    const auto gr = normal_vec(g, n);
    h.seed = 1;
    adamw_step(on_host(), a.ref(), as_cspan(gr), h, 1, 1e-3f);
    adamw_step(on_host(2), b.ref(), as_cspan(gr), h, 1, 1e-3f);
    h.seed = 2;
    adamw_step(on_host(), c.ref(), as_cspan(gr), h, 1, 1e-3f);
    CHECK(same_bits(a, b));
    std::size_t diff = 0;
    for (std::size_t i = 0; i < n; ++i) diff += a.params[i].bits != c.params[i].bits;
    CHECK(diff > n / 20);
}

TEST_CASE("bytes per parameter and the memory ledger") {
    CHECK(state_bytes_per_element<state_codec::fp32>() == 4.0);
    CHECK(state_bytes_per_element<state_codec::bf16>() == 2.0);
    CHECK(state_bytes_per_element<state_codec::e4m3_scaled>() == 1.0 + 4.0 / 128);
    CHECK(state_bytes_per_element<state_codec::e4m3_expanded>() == 1.0 + 12.0 / 128);
    CHECK(state_bytes_per_element<state_codec::dynamic8>() == 1.0 + 4.0 / 256);
    auto cfg = memory_config_for<state_codec::dynamic8, state_codec::dynamic8, master::bf16_kahan>(1e9);
    const parameter_bytes b = bytes_per_parameter(cfg);
    CHECK(b.weights == 2.0);
    CHECK(b.gradients == 2.0);
    CHECK(b.optimizer_state == 2.0 * (1.0 + 4.0 / 256) + 2.0);  // two moments + the Kahan buffer
    const memory_ledger l = optimizer_memory_ledger(cfg);
    CHECK(l.bytes(memory_category::optimizer_state) == doctest::Approx(b.optimizer_state * 1e9));
    CHECK(l.total() == doctest::Approx(b.total() * 1e9));

    // The essay's arithmetic from an optimizer configuration: 5 parameters with fp32 master weights
    // (20 B) and fp32 moments (40 B), no gradients, 30 B of activations, 10 B of temporaries.
    optimizer_memory_config c;
    c.parameters = 5;
    c.gradient_bytes = 0;
    c.activation_bytes = 30;
    c.temporary_bytes = 10;
    const memory_ledger setup = optimizer_memory_ledger(c);
    CHECK(setup.total() == 100);
    // halving the weights = bf16 master weights; halving the state = bf16 moments
    c.master = master_weights_id::bf16_stochastic;
    CHECK(optimizer_memory_ledger(c).total() == 90);
    c.first_moment = c.second_moment = state_codec_id::bf16;
    c.activation_bytes = 15;
    CHECK(optimizer_memory_ledger(c).total() == 55);
    CHECK(setup.scaled({{memory_category::weights, 0.5}}).total() == 90);
    CHECK_THROWS_AS(bytes_per_parameter(optimizer_memory_config{1, state_codec_id::fp32, state_codec_id::fp32,
                                                                master_weights_id::fp32, -1}),
                    octet::error);
}

TEST_CASE("the step rejects bad arguments") {
    adamw_state<state_codec::dynamic8> st(1000);
    std::vector<float> gr(1000), short_g(999);
    adamw_hyper h;
    CHECK_THROWS_WITH_AS(adamw_step(on_host(), st.ref(), as_cspan(short_g), h, 1, 1e-3f),
                         doctest::Contains("argument 'grads'"), octet::error);
    CHECK_THROWS_WITH_AS(adamw_step(on_host(), st.ref(), as_cspan(gr), h, 0, 1e-3f),
                         doctest::Contains("argument 'step'"), octet::error);
    CHECK_THROWS_WITH_AS(adamw_step(on_host(), st.ref(), as_cspan(gr), h, 1, -1.0f), doctest::Contains("argument 'lr'"),
                         octet::error);
    CHECK_THROWS_WITH_AS(adamw_step(on_host(), st.ref(), as_cspan(gr), h, 1, NAN), doctest::Contains("argument 'lr'"),
                         octet::error);
    h.eps = 0;
    CHECK_THROWS_WITH_AS(adamw_step(on_host(), st.ref(), as_cspan(gr), h, 1, 1e-3f),
                         doctest::Contains("argument 'hyper.eps'"), octet::error);
    h = {};
    h.beta2 = 1.0f;
    CHECK_THROWS_WITH_AS(adamw_step(on_host(), st.ref(), as_cspan(gr), h, 1, 1e-3f),
                         doctest::Contains("argument 'hyper.beta2'"), octet::error);
    for (float bad : {0.0f, -0.5f, 1.5f, NAN}) {
        h = {};
        h.grad_scale = bad;
        CHECK_THROWS_WITH_AS(adamw_step(on_host(), st.ref(), as_cspan(gr), h, 1, 1e-3f),
                             doctest::Contains("argument 'hyper.grad_scale'"), octet::error);
    }
    h = {};
    auto r = st.ref();
    r.m_meta = r.m_meta.subspan(0, 3);
    CHECK_THROWS_WITH_AS(adamw_step(on_host(), r, as_cspan(gr), h, 1, 1e-3f),
                         doctest::Contains("argument 'state.m_meta'"), octet::error);
    r = st.ref();
    r.element_offset = 128;
    CHECK_THROWS_WITH_AS(adamw_step(on_host(), r, as_cspan(gr), h, 1, 1e-3f),
                         doctest::Contains("argument 'state.element_offset'"), octet::error);
    // an empty state is fine
    adamw_state<state_codec::dynamic8> empty(0);
    CHECK(adamw_step(on_host(), empty.ref(), span<const float>(), h, 1, 1e-3f).nonfinite_gradients == 0);
}
