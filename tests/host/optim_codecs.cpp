// The optimizer-state codecs against float64: log2/exp2 helpers, the dynamic map (every entry
// and the nearest-entry choice against a brute-force search), the zero and second-moment
// guarantees, and each codec's error on realistic moments (heavy-tailed first moments, second
// moments spanning many decades) with per-element bounds derived from each format.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "octet/optim/moments.hpp"
#include "octet/optim/state_codec.hpp"
#include "support/random.hpp"

using namespace octet;
namespace od = octet::optim_detail;

namespace {

/// Adam moments of simulated gradients, in float64: 64 "tensors" of 2048 elements, tensor scales
/// 10^U(-6,-1), per-element scales lognormal (sigma 1), 2% nearly dead elements (1e-4 of the
/// tensor scale), gradient noise Student-t with 3 degrees of freedom; 64 steps of the EMAs.
struct moments {
    std::vector<double> m, v;
};
moments realistic_moments(std::uint64_t salt, std::size_t tensors = 64, std::size_t per = 2048) {
    auto g = octet_test::rng(salt);
    std::uniform_real_distribution<double> decade(-6.0, -1.0), u01(0.0, 1.0);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::student_t_distribution<double> t3(3.0);
    const std::size_t n = tensors * per;
    std::vector<double> scale(n);
    for (std::size_t t = 0; t < tensors; ++t) {
        const double ts = std::pow(10.0, decade(g));
        for (std::size_t i = 0; i < per; ++i) scale[t * per + i] = ts * (u01(g) < 0.02 ? 1e-4 : std::exp(normal(g)));
    }
    moments mo{std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
    for (int step = 0; step < 64; ++step)
        for (std::size_t i = 0; i < n; ++i) {
            const double gi = scale[i] * t3(g);
            mo.m[i] = 0.9 * mo.m[i] + 0.1 * gi;
            mo.v[i] = 0.999 * mo.v[i] + 0.001 * gi * gi;
        }
    return mo;
}

std::vector<float> to_float_vec(const std::vector<double>& x) {
    return std::vector<float>(x.begin(), x.end());
}
std::vector<float> sqrt_of(const std::vector<float>& x) {
    std::vector<float> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = static_cast<float>(std::sqrt(static_cast<double>(x[i])));
    return y;
}

template <class Codec, moment K>
std::vector<float> round_trip(const std::vector<float>& x, std::vector<typename Codec::meta_type>* meta_out = nullptr,
                              const philox_stream& rng = {}) {
    std::vector<typename Codec::code_type> codes(x.size());
    std::vector<typename Codec::meta_type> meta(state_meta_count<Codec>(x.size()));
    encode_moments<Codec, K>(on_host(), as_cspan(x), as_span(codes), as_span(meta), rng);
    std::vector<float> y(x.size());
    decode_moments<Codec, K>(on_host(), as_cspan(codes), as_cspan(meta), as_span(y));
    if (meta_out) *meta_out = meta;
    return y;
}

struct error_stats {
    double rel_rms = 0, median_rel = 0, p99_rel = 0, max_rel = 0;
};
error_stats measure(const std::vector<double>& exact, const std::vector<float>& got) {
    double num = 0, den = 0;
    std::vector<double> rel;
    for (std::size_t i = 0; i < exact.size(); ++i) {
        const double e = static_cast<double>(got[i]) - exact[i];
        num += e * e;
        den += exact[i] * exact[i];
        if (exact[i] != 0) rel.push_back(std::abs(e) / std::abs(exact[i]));
    }
    std::sort(rel.begin(), rel.end());
    error_stats s;
    s.rel_rms = std::sqrt(num / den);
    s.median_rel = rel[rel.size() / 2];
    s.p99_rel = rel[rel.size() * 99 / 100];
    s.max_rel = rel.back();
    return s;
}

/// Largest per-element excess of |decoded - exact| over a bound (<= 0: every element within).
template <class Bound>
double worst_excess(const std::vector<double>& exact, const std::vector<float>& got, Bound bound) {
    double worst = -1e300;
    for (std::size_t i = 0; i < exact.size(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(got[i]) - exact[i]) - bound(i));
    return worst;
}

// E4M3 facts used by the bounds (read from the format's traits).
const double e4m3_max = e4m3::max_finite_d;            // 448
const double e4m3_half_ulp_rel = std::ldexp(1.0, -4);  // 3 mantissa bits: half an ulp <= 2^-4 |x| in the normal range
const double e4m3_min_sub = e4m3::min_subnormal_d;     // 2^-9
const double float_slack = 4 * std::ldexp(1.0, -24);   // scale multiply, its reciprocal, the decode multiply

}  // namespace

TEST_CASE("log2_rn and exp2_rn against float64 (all binades, subnormals included)") {
    auto g = octet_test::rng(1);
    double worst_log = -1, worst_exp = 0, worst_sub = 0;
    for (int i = 0; i < 2000000; ++i) {
        const std::uint32_t u = static_cast<std::uint32_t>(g()) & 0x7FFFFFFFu;
        if (u == 0 || u >= 0x7F800000u) continue;
        const float a = bits_to_float(u);
        const double r = std::log2(static_cast<double>(a));
        const double ulp = r == 0 ? 0 : std::ldexp(1.0, std::ilogb(r) - 23);
        // contract: error <= 2 ulps of the result + 5e-8
        worst_log = std::max(worst_log, std::abs(od::log2_rn(a) - r) - (2 * ulp + 5e-8));
    }
    std::uniform_real_distribution<float> ys(-151.0f, 128.0f);
    for (int i = 0; i < 2000000; ++i) {
        const float y = ys(g);
        const double r = std::exp2(static_cast<double>(y));
        const double p = od::exp2_rn(y);
        if (r >= std::ldexp(1.0, -126))
            worst_exp = std::max(worst_exp, std::abs(p - r) / r);
        else
            worst_sub = std::max(worst_sub, std::abs(p - r) / std::ldexp(1.0, -149));
    }
    MESSAGE("log2_rn worst excess over (2 ulp + 5e-8): " << worst_log << "; exp2_rn worst relative error " << worst_exp
                                                         << "; subnormal results within " << worst_sub << " x 2^-149");
    CHECK(worst_log <= 0);
    CHECK(worst_exp <= 2e-7);
    CHECK(worst_sub <= 1.0);
    CHECK(od::exp2_rn(128.0f) == INFINITY);
    CHECK(od::exp2_rn(-200.0f) == 0.0f);
    CHECK(od::log2_rn(1.0f) == 0.0f);
    CHECK(od::log2_rn(0.5f) == -1.0f);
    CHECK(od::exp2_rn(0.0f) == 1.0f);
    CHECK(od::exp2_rn(-3.0f) == 0.125f);
}

TEST_CASE("dynamic map: every entry against an independent float64 formula") {
    for (int bits : {7, 8}) {
        const float* vals = bits == 7 ? od::dynamic_map_signed.values : od::dynamic_map_unsigned.values;
        const float* thr = bits == 7 ? od::dynamic_map_signed.thresholds : od::dynamic_map_unsigned.thresholds;
        const int size = 1 << bits;
        CHECK(vals[0] == 0.0f);
        CHECK(vals[size - 1] == 1.0f);
        int bad = 0;
        for (int i = 1; i < size; ++i) {
            const int r = static_cast<int>(std::floor(std::log2(static_cast<double>(i))));
            const int z = bits - 1 - r;
            const int f = i - (1 << r);
            const double expect = std::pow(10.0, -z) * (0.1 + 0.9 * (f + 1) / std::ldexp(1.0, r));
            // pow and the exact rational differ by at most a float ulp after rounding
            bad += std::abs(vals[i] - expect) > std::ldexp(std::abs(expect), -23);
            bad += !(vals[i] > vals[i - 1]);
            bad += !(thr[i - 1] > vals[i - 1] && thr[i - 1] < vals[i]);
        }
        CHECK(bad == 0);
        CHECK(thr[size - 1] == INFINITY);
        // smallest non-zero entry: 10^-(bits-1)
        CHECK(vals[1] == doctest::Approx(std::pow(10.0, -(bits - 1))).epsilon(1e-6));
    }
}

TEST_CASE("dynamic8 encodes to the nearest entry (brute force over the table)") {
    auto g = octet_test::rng(2);
    std::uniform_real_distribution<double> expo(-9.0, 0.1);
    std::uniform_real_distribution<float> absmax_d(1e-3f, 1e3f);
    const codec_context ctx = host_codec_context();
    std::size_t bad = 0, checked = 0;
    for (int trial = 0; trial < 200000; ++trial) {
        const float absmax = absmax_d(g);
        const state_codec::dynamic8::meta_type meta{absmax};
        const auto enc = state_codec::dynamic8::prepare_encode(meta);
        const float x = static_cast<float>(std::pow(10.0, expo(g)) * absmax * ((trial & 1) ? -1 : 1));
        const float a = std::abs(x) * enc.inv_absmax;  // the normalized magnitude the codec sees
        for (int second = 0; second < 2; ++second) {
            const float* vals = second ? od::dynamic_map_unsigned.values : od::dynamic_map_signed.values;
            const int size = second ? 256 : 128;
            int best = 0;
            for (int j = 1; j < size; ++j)
                if (std::abs(static_cast<double>(vals[j]) - a) < std::abs(static_cast<double>(vals[best]) - a))
                    best = j;
            // skip inputs within a float ulp of a midpoint (the rounded midpoint decides those)
            const double lo = best > 0 ? (static_cast<double>(vals[best - 1]) + vals[best]) / 2 : -1;
            const double hi = best + 1 < size ? (static_cast<double>(vals[best]) + vals[best + 1]) / 2 : 1e30;
            if (std::abs(a - lo) <= std::ldexp(lo, -23) || std::abs(a - hi) <= std::ldexp(hi, -23)) continue;
            if (second) {
                if (x < 0) continue;                               // second moments are non-negative
                const int want = (best == 0 && x > 0) ? 1 : best;  // the floor: non-zero never encodes to 0
                bad += state_codec::dynamic8::encode<moment::second>(x, enc, ctx) != want;
            } else {
                const std::uint8_t c = state_codec::dynamic8::encode<moment::first>(x, enc, ctx);
                bad += (c & 0x7F) != best;
                bad += best != 0 && ((c & 0x80) != 0) != (x < 0);
            }
            ++checked;
        }
    }
    CHECK(checked > 250000);
    CHECK(bad == 0);
}

TEST_CASE_TEMPLATE("zero is exact and a zeroed buffer is the zero state", Codec, state_codec::fp32, state_codec::bf16,
                   state_codec::bf16_stochastic, state_codec::e4m3_scaled, state_codec::e4m3_expanded,
                   state_codec::dynamic8) {
    const std::size_t n = 1000;  // ragged: not a multiple of any group
    std::vector<float> zeros(n, 0.0f);
    for (float x : round_trip<Codec, moment::first>(zeros)) CHECK(x == 0.0f);
    for (float x : round_trip<Codec, moment::second>(zeros)) CHECK(x == 0.0f);
    // memset-zero codes and meta decode to +0
    std::vector<typename Codec::code_type> codes(n);
    std::vector<typename Codec::meta_type> meta(state_meta_count<Codec>(n));
    std::vector<float> out(n, 1.0f);
    decode_moments<Codec, moment::first>(on_host(), as_cspan(codes), as_cspan(meta), as_span(out));
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 0.0f && !std::signbit(x); }));
    decode_moments<Codec, moment::second>(on_host(), as_cspan(codes), as_cspan(meta), as_span(out));
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 0.0f; }));
}

TEST_CASE_TEMPLATE("second moments: never negative, non-zero never decodes to zero", Codec, state_codec::fp32,
                   state_codec::bf16, state_codec::bf16_stochastic, state_codec::e4m3_scaled,
                   state_codec::e4m3_expanded, state_codec::dynamic8) {
    // Groups whose magnitudes span 2^-140 .. 2^60 (far beyond every 8-bit codec's range), exact
    // zeros, and float subnormals.
    auto g = octet_test::rng(3);
    std::uniform_real_distribution<float> e(-140.0f, 60.0f);
    std::uniform_int_distribution<int> pick(0, 19);
    std::vector<float> v(4099);
    for (auto& x : v) {
        const int p = pick(g);
        x = p == 0 ? 0.0f : p == 1 ? 1e-42f : std::exp2(e(g));
    }
    const auto y = round_trip<Codec, moment::second>(v);
    std::size_t negative = 0, lost = 0, invented = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
        negative += std::signbit(y[i]) || !(y[i] >= 0);
        lost += v[i] > 0 && !(y[i] > 0);
        invented += v[i] == 0 && y[i] != 0;
    }
    CHECK(negative == 0);
    CHECK(lost == 0);
    CHECK(invented == 0);
    // decoding never gives a negative value even from codes with a sign bit set
    std::vector<typename Codec::code_type> codes(256);
    std::vector<typename Codec::meta_type> meta(state_meta_count<Codec>(256));
    std::vector<float> x(256);
    for (std::size_t i = 0; i < 256; ++i) x[i] = static_cast<float>(i) - 128.0f;
    encode_moments<Codec, moment::first>(on_host(), as_cspan(x), as_span(codes), as_span(meta));  // signed codes
    decode_moments<Codec, moment::second>(on_host(), as_cspan(codes), as_cspan(meta), as_span(x));
    CHECK(std::none_of(x.begin(), x.end(), [](float f) { return std::signbit(f); }));
}

TEST_CASE("codec error on realistic moments against float64, with per-element bounds") {
    const moments mo = realistic_moments(4);
    const auto m = to_float_vec(mo.m), v = to_float_vec(mo.v);
    const std::size_t n = m.size();
    std::vector<double> sqrt_v(n), dir(n);
    const double eps = 1e-8;
    for (std::size_t i = 0; i < n; ++i) {
        sqrt_v[i] = std::sqrt(mo.v[i]);
        dir[i] = mo.m[i] / (sqrt_v[i] + eps);
    }
    auto report = [&](const std::string& name, const std::vector<float>& mh, const std::vector<float>& vh) {
        std::vector<float> sh(n), dh(n);
        for (std::size_t i = 0; i < n; ++i) {
            sh[i] = std::sqrt(vh[i]);
            dh[i] = static_cast<float>(mh[i] / (std::sqrt(static_cast<double>(vh[i])) + eps));
        }
        const error_stats em = measure(mo.m, mh), ev = measure(mo.v, vh), es = measure(sqrt_v, sh),
                          ed = measure(dir, dh);
        MESSAGE(name << ": m rel-RMS " << em.rel_rms << " median " << em.median_rel << " p99 " << em.p99_rel
                     << " | v rel-RMS " << ev.rel_rms << " median " << ev.median_rel << " p99 " << ev.p99_rel
                     << " | sqrt(v) p99 " << es.p99_rel << " | update m/(sqrt v+eps) rel-RMS " << ed.rel_rms
                     << " median " << ed.median_rel);
        return std::make_pair(em, ed);
    };

    SUBCASE("fp32: exact") {
        const auto mh = round_trip<state_codec::fp32, moment::first>(m),
                   vh = round_trip<state_codec::fp32, moment::second>(v);
        CHECK(mh == m);
        CHECK(vh == v);
    }
    SUBCASE("bf16: |err| <= 2^-8 |x| (nearest-even, 8 significant bits)") {
        const auto mh = round_trip<state_codec::bf16, moment::first>(m),
                   vh = round_trip<state_codec::bf16, moment::second>(v);
        report("bf16", mh, vh);
        // unit roundoff 2^-8, plus the float rounding of the input (2^-24)
        CHECK(worst_excess(mo.m, mh, [&](std::size_t i) { return std::ldexp(std::abs(mo.m[i]), -8) * (1 + 1e-6); }) <=
              0);
        CHECK(worst_excess(mo.v, vh, [&](std::size_t i) { return std::ldexp(std::abs(mo.v[i]), -8) * (1 + 1e-6); }) <=
              0);
    }
    SUBCASE("bf16_stochastic: |err| < 2^-7 |x| (one ulp), unbiased over draws") {
        using C = state_codec::bf16_stochastic;
        const auto mh = round_trip<C, moment::first>(m, nullptr, philox_stream{7, 1}),
                   vh = round_trip<C, moment::second>(v, nullptr, philox_stream{7, 1});
        report("bf16_stochastic", mh, vh);
        CHECK(worst_excess(mo.m, mh, [&](std::size_t i) { return std::ldexp(std::abs(mo.m[i]), -7) * (1 + 1e-6); }) <=
              0);
        CHECK(worst_excess(mo.v, vh, [&](std::size_t i) { return std::ldexp(std::abs(mo.v[i]), -7) * (1 + 1e-6); }) <=
              0);
        // each code is one of the two bf16 neighbours of the float input
        std::size_t elsewhere = 0;
        for (std::size_t i = 0; i < n; ++i) {
            const float lo = to_float(bf16{static_cast<std::uint16_t>(float_to_bits(m[i]) >> 16)});  // toward zero
            const float hi = to_float(bf16{static_cast<std::uint16_t>((float_to_bits(m[i]) >> 16) + 1)});
            elsewhere += !(mh[i] == lo || (mh[i] == hi && lo != m[i]));
        }
        CHECK(elsewhere == 0);
        // unbiased: the mean over 400 streams of the decoded value of x lands on x (float64 oracle)
        // to within 4 standard errors of a Bernoulli draw of one ulp
        std::vector<float> probe(256);
        auto g = octet_test::rng(44);
        std::uniform_real_distribution<float> mant(1.0f, 2.0f);
        for (auto& x : probe) x = mant(g);
        std::vector<double> mean(probe.size(), 0.0);
        const int draws = 400;
        for (int d = 0; d < draws; ++d) {
            const auto y =
                round_trip<C, moment::second>(probe, nullptr, philox_stream{11, static_cast<std::uint64_t>(d)});
            for (std::size_t i = 0; i < probe.size(); ++i) mean[i] += y[i] / static_cast<double>(draws);
        }
        double worst_z = 0;
        for (std::size_t i = 0; i < probe.size(); ++i) {
            const double ulp = std::ldexp(1.0, -7), p = std::fmod(static_cast<double>(probe[i]) - 1.0, ulp) / ulp;
            const double se = ulp * std::sqrt(std::max(p * (1 - p), 1e-12) / draws);
            if (p > 0.05 && p < 0.95) worst_z = std::max(worst_z, std::abs(mean[i] - probe[i]) / se);
        }
        MESSAGE("bf16_stochastic: largest |mean - x| over 256 inputs, 400 draws: " << worst_z << " standard errors");
        CHECK(worst_z < 4.5);
    }
    SUBCASE("e4m3_scaled: |err| <= 2^-4 |x| + half a subnormal step of the group (a full one for the v floor)") {
        using C = state_codec::e4m3_scaled;
        std::vector<C::meta_type> mm, vm;
        const auto mh = round_trip<C, moment::first>(m, &mm), vh = round_trip<C, moment::second>(v, &vm);
        report("e4m3_scaled", mh, vh);
        CHECK(worst_excess(mo.m, mh, [&](std::size_t i) {
                  return (e4m3_half_ulp_rel * std::abs(mo.m[i]) + e4m3_min_sub / 2 * mm[i / 128].scale) *
                         (1 + float_slack);
              }) <= 0);
        // the second moment is coded as sqrt(v): the bound holds for sqrt(v), with a full subnormal
        // step for the floor; 2^-24 more for the float rounding of sqrt(v) and of the square
        const auto sh = sqrt_of(vh);
        CHECK(worst_excess(sqrt_v, sh, [&](std::size_t i) {
                  return (e4m3_half_ulp_rel * sqrt_v[i] + e4m3_min_sub * vm[i / 128].scale) * (1 + float_slack) +
                         std::ldexp(sqrt_v[i], -23);
              }) <= 0);
        // the group scale maps the group's absmax to 448
        float absmax0 = 0;
        for (std::size_t i = 0; i < 128; ++i) absmax0 = std::max(absmax0, std::abs(m[i]));
        CHECK(mm[0].scale == absmax0 / 448.0f);
    }
    SUBCASE("e4m3_expanded: relative error <= 2^(log2(1 + 2^-4) / k) - 1, and never worse than e4m3_scaled") {
        using C = state_codec::e4m3_expanded;
        std::vector<C::meta_type> mm, vm;
        const auto mh = round_trip<C, moment::first>(m, &mm), vh = round_trip<C, moment::second>(v, &vm);
        const auto [em, ed] = report("e4m3_expanded", mh, vh);
        // k > 1: every magnitude lands in E4M3's normal range, so the relative error is E4M3's
        // half ulp shrunk by the k-th root; 1e-5 covers log2_rn/exp2_rn (a few 1e-7) and float
        // rounding of the exponent arithmetic (ulps of |log2 x| <= 130, times k / k). k = 1 is
        // the scaled codec with scale 2^(c - s): add its subnormal term.
        auto bound = [&](const std::vector<C::meta_type>& meta, const std::vector<double>& x, std::size_t i,
                         bool second) {
            const C::meta_type& mt = meta[i / 128];
            double b = (std::pow(2.0, std::log2(1.0 + e4m3_half_ulp_rel) / mt.k) - 1.0 + 1e-5) * std::abs(x[i]);
            if (mt.k == 1.0f)
                b += (second ? 1.0 : 0.5) * e4m3_min_sub * std::exp2(mt.centre_log2 - mt.scale_log2) * (1 + 1e-5);
            return b;
        };
        CHECK(worst_excess(mo.m, mh, [&](std::size_t i) { return bound(mm, mo.m, i, false); }) <= 0);
        const auto sh = sqrt_of(vh);
        CHECK(worst_excess(sqrt_v, sh, [&](std::size_t i) {
                  return bound(vm, sqrt_v, i, true) + std::ldexp(sqrt_v[i], -23);
              }) <= 0);
        std::size_t expanded_m = 0, expanded_v = 0, out_of_range = 0;
        for (const auto& mt : mm) {
            out_of_range += !(mt.k >= 1.0f && mt.k <= 256.0f);
            expanded_m += mt.k > 1.0f;
        }
        for (const auto& mt : vm) {
            out_of_range += !(mt.k >= 1.0f && mt.k <= 256.0f);
            expanded_v += mt.k > 1.0f;
        }
        CHECK(out_of_range == 0);
        MESSAGE("e4m3_expanded: k > 1 in " << expanded_m << " of " << mm.size() << " first-moment groups and "
                                           << expanded_v << " of " << vm.size() << " second-moment groups");
        (void)em;
    }
    SUBCASE("dynamic8: |err| <= half the gap between the neighbouring map entries, times the block absmax") {
        // + 1e-6 |x|: the codec normalizes float(x) (or sqrt of float(v)) with a float reciprocal,
        // so near a midpoint it may pick the farther entry by a few float roundings of |x|
        using C = state_codec::dynamic8;
        std::vector<C::meta_type> mm, vm;
        const auto mh = round_trip<C, moment::first>(m, &mm), vh = round_trip<C, moment::second>(v, &vm);
        report("dynamic8", mh, vh);
        auto gap_bound = [](const float* vals, int size, double a) {  // half the gap of the interval holding a
            int j = 1;
            while (j < size - 1 && vals[j] < a) ++j;
            return (static_cast<double>(vals[j]) - vals[j - 1]) / 2;
        };
        CHECK(worst_excess(mo.m, mh, [&](std::size_t i) {
                  const double am = mm[i / 256].absmax;
                  return gap_bound(od::dynamic_map_signed.values, 128, std::abs(mo.m[i]) / am) * am *
                             (1 + float_slack) +
                         1e-6 * std::abs(mo.m[i]);
              }) <= 0);
        const auto sh = sqrt_of(vh);  // coded as sqrt(v)
        CHECK(worst_excess(sqrt_v, sh, [&](std::size_t i) {
                  const double am = vm[i / 256].absmax;
                  const double a = sqrt_v[i] / am;  // below the smallest entry the floor rounds up: a full entry
                  const double b = a < od::dynamic_map_unsigned.values[1]
                                       ? od::dynamic_map_unsigned.values[1]
                                       : gap_bound(od::dynamic_map_unsigned.values, 256, a);
                  return b * am * (1 + float_slack) + 1e-6 * sqrt_v[i];
              }) <= 0);
    }
}

TEST_CASE("dynamic range expansion pays where groups are narrow") {
    // Groups whose magnitudes are lognormal (sigma 0.5, random signs): each spans about 3-4
    // binades, a quarter of E4M3's normal range, so k is about 4 and the relative error should
    // fall by about that factor against the per-group scale. Checked: at most half.
    auto g = octet_test::rng(6);
    std::normal_distribution<double> normal(0.0, 1.0);
    const std::size_t n = 128 * 256;
    std::vector<double> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = (g() & 1 ? 1 : -1) * 1e-3 * std::exp(0.5 * normal(g));
    const auto xf = to_float_vec(x);
    std::vector<state_codec::e4m3_expanded::meta_type> meta;
    const auto ex = round_trip<state_codec::e4m3_expanded, moment::first>(xf, &meta);
    const auto sc = round_trip<state_codec::e4m3_scaled, moment::first>(xf);
    double k_mean = 0;
    for (const auto& mt : meta) k_mean += mt.k / meta.size();
    const error_stats e = measure(x, ex), s = measure(x, sc);
    MESSAGE("narrow groups (mean k " << k_mean << "): relative RMS " << e.rel_rms << " expanded vs " << s.rel_rms
                                     << " scaled; median " << e.median_rel << " vs " << s.median_rel);
    CHECK(k_mean > 2.0);
    CHECK(e.rel_rms <= 0.5 * s.rel_rms);
    CHECK(e.median_rel <= 0.5 * s.median_rel);
}

TEST_CASE_TEMPLATE("ragged tails and thread counts do not change codes", Codec, state_codec::e4m3_scaled,
                   state_codec::e4m3_expanded, state_codec::dynamic8) {
    const moments mo = realistic_moments(5, 4, 1000);
    const auto x = to_float_vec(mo.m);  // 4000 elements: ragged for groups of 128 and 256
    std::vector<typename Codec::code_type> a(x.size()), b(x.size());
    std::vector<typename Codec::meta_type> ma(state_meta_count<Codec>(x.size())), mb(ma.size());
    encode_moments<Codec, moment::first>(on_host(1), as_cspan(x), as_span(a), as_span(ma));
    encode_moments<Codec, moment::first>(on_host(3), as_cspan(x), as_span(b), as_span(mb));
    CHECK(std::equal(a.begin(), a.end(), b.begin()));
    // padding with zeros does not change any group's meta (zeros are not part of the statistics)
    std::vector<float> padded(x);
    padded.resize(4096, 0.0f);
    std::vector<typename Codec::code_type> c(padded.size());
    std::vector<typename Codec::meta_type> mc(state_meta_count<Codec>(padded.size()));
    encode_moments<Codec, moment::first>(on_host(), as_cspan(padded), as_span(c), as_span(mc));
    CHECK(std::equal(a.begin(), a.end(), c.begin()));
}

TEST_CASE("moment codecs reject bad views") {
    std::vector<float> x(300);
    std::vector<std::uint8_t> codes(300), short_codes(299);
    std::vector<state_codec::dynamic8::meta_type> meta(2), short_meta(1);
    CHECK_THROWS_WITH_AS((encode_moments<state_codec::dynamic8, moment::first>(on_host(), as_cspan(x),
                                                                               as_span(short_codes), as_span(meta))),
                         doctest::Contains("argument 'codes'"), octet::error);
    CHECK_THROWS_WITH_AS((encode_moments<state_codec::dynamic8, moment::first>(on_host(), as_cspan(x), as_span(codes),
                                                                               as_span(short_meta))),
                         doctest::Contains("argument 'meta'"), octet::error);
    CHECK_THROWS_AS((decode_moments<state_codec::dynamic8, moment::first>(
                        on_host(), span<const std::uint8_t>(nullptr, 300), as_cspan(meta), as_span(x))),
                    octet::error);
    CHECK(state_meta_count<state_codec::dynamic8>(257) == 2);
    CHECK(state_meta_count<state_codec::e4m3_scaled>(257) == 3);
    CHECK(state_meta_count<state_codec::bf16>(257) == 0);
}
