// Threshold-crossing diagnostics: the smallest case (0.799 against 0.801 at bound 0.8), and the
// counts against an independent brute-force count (octet/reference/rl.hpp) on fresh random
// batches crowded around the bounds, from ratios and from log-probabilities, with a separate
// (calibrated) range for the low-precision side, non-finite tokens, and argument errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "octet/core/bits.hpp"
#include "octet/reference/rl.hpp"
#include "octet/rl/crossings.hpp"
#include "support/random.hpp"

using namespace octet;

namespace {

void check_equal(const crossing_report& got, const reference::crossing_ref& want) {
    for (int s = 0; s < 3; ++s) {
        CAPTURE(s);
        const crossing_counts& c = got.by_sign[s];
        CHECK(c.tokens == want.tokens[s]);
        CHECK(c.below_high == want.below_high[s]);
        CHECK(c.below_low == want.below_low[s]);
        CHECK(c.above_high == want.above_high[s]);
        CHECK(c.above_low == want.above_low[s]);
        CHECK(c.region_changed == want.region_changed[s]);
        CHECK(c.branch_changed == want.branch_changed[s]);
        CHECK(c.pushed_out_low == want.pushed_out_low[s]);
        CHECK(c.pushed_out_high == want.pushed_out_high[s]);
        CHECK(c.pulled_in == want.pulled_in[s]);
    }
    CHECK(got.non_finite == want.non_finite);
}

/// High-precision ratios crowded around both bounds (and exactly on them), low-precision ones a
/// bf16 rounding of them or a relative perturbation; advantages with exact zeros; 1% non-finite.
struct ratio_batch {
    std::vector<float> low, high, adv;
};
ratio_batch crowded_batch(std::mt19937_64& g, std::size_t n, clip_range r) {
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    std::normal_distribution<float> rel(0.0f, 0.01f), a(0.0f, 1.0f);
    ratio_batch b;
    for (std::size_t i = 0; i < n; ++i) {
        const float p = u(g);
        float hi = p < 0.4f ? r.lower * (1 + rel(g)) : p < 0.8f ? r.upper * (1 + rel(g)) : 0.5f + 1.5f * u(g);
        if (u(g) < 0.02f) hi = u(g) < 0.5f ? r.lower : r.upper;  // exactly on a bound: inside
        float lo = u(g) < 0.5f ? to_float(to_bf16(hi)) : hi * (1 + 0.5f * rel(g));
        float ad = u(g) < 0.05f ? 0.0f : a(g);
        const float q = u(g);
        if (q < 0.0025f)
            lo = NAN;
        else if (q < 0.005f)
            hi = INFINITY;
        else if (q < 0.0075f)
            ad = NAN;
        else if (q < 0.01f)
            ad = -INFINITY;
        b.low.push_back(lo);
        b.high.push_back(hi);
        b.adv.push_back(ad);
    }
    return b;
}

std::vector<double> widen(const std::vector<float>& v) {
    return std::vector<double>(v.begin(), v.end());
}

}  // namespace

TEST_CASE("the smallest case: 0.799 against 0.801 at a lower bound of 0.8") {
    const clip_range range = clip_range::symmetric(0.2f);
    REQUIRE(0.799f < range.lower);
    REQUIRE(0.801f > range.lower);
    const std::vector<float> low{0.799f}, high{0.801f}, neg{-1.0f}, pos{2.0f}, half_neg{-0.5f};
    {  // negative advantage: the low-precision ratio cuts its penalty
        const crossing_report c = threshold_crossings_from_ratios(on_host(), low, high, neg, range);
        const crossing_counts& n = c[advantage_sign::negative];
        CHECK(n.tokens == 1);
        CHECK(n.region_changed == 1);
        CHECK(n.branch_changed == 1);
        CHECK(n.pushed_out_low == 1);
        CHECK(n.pulled_in == 0);
        CHECK(n.below_low == 1);
        CHECK(n.below_high == 0);
        CHECK(c.negative_pushed_out_fraction() == 1.0);
        CHECK(c.negative_pushed_below_fraction() == 1.0);
        CHECK(c.region_changed() == 1);
        CHECK(c.branch_changed() == 1);
    }
    {  // positive advantage: the region changes but not the branch (the lower bound clips only A < 0)
        const crossing_report c = threshold_crossings_from_ratios(on_host(), low, high, pos, range);
        const crossing_counts& p = c[advantage_sign::positive];
        CHECK(p.region_changed == 1);
        CHECK(p.branch_changed == 0);
        CHECK(p.pushed_out_low == 1);
        CHECK(c.negative_pushed_out_fraction() == 0.0);  // no negative tokens
    }
    {  // the other way round: the low-precision ratio pulls the token back in
        const crossing_report c = threshold_crossings_from_ratios(on_host(), high, low, neg, range);
        CHECK(c[advantage_sign::negative].pulled_in == 1);
        CHECK(c[advantage_sign::negative].pushed_out_low == 0);
        CHECK(c[advantage_sign::negative].branch_changed == 1);
    }
    {  // from log-probabilities: logp_old = 0, so the ratios are exp(logp)
        const std::vector<float> lp_low{std::log(0.799f)}, lp_high{std::log(0.801f)}, old{0.0f};
        const crossing_report c = threshold_crossings(on_host(), lp_low, lp_high, old, half_neg, range);
        CHECK(c[advantage_sign::negative].pushed_out_low == 1);
        CHECK(c[advantage_sign::negative].branch_changed == 1);
    }
    {  // a calibrated (lower) bound for the low-precision side keeps 0.799 inside
        const crossing_report c =
            threshold_crossings_from_ratios(on_host(), low, high, neg, range, clip_range{0.79f, 1.2f});
        CHECK(c[advantage_sign::negative].region_changed == 0);
        CHECK(c.negative_pushed_out_fraction() == 0.0);
    }
}

TEST_CASE("crossing counts equal a brute-force count on random batches") {
    auto g = octet_test::rng(201);
    for (const clip_range range : {clip_range::symmetric(0.2f), clip_range::asymmetric(0.2f, 0.28f)}) {
        const std::size_t n = 60000 + std::uniform_int_distribution<std::size_t>(0, 4095)(g);
        const ratio_batch b = crowded_batch(g, n, range);
        for (const clip_range low_range : {range, clip_range{range.lower * 0.99f, range.upper * 1.01f}}) {
            const crossing_report c =
                threshold_crossings_from_ratios(on_host(), b.low, b.high, b.adv, range, low_range);
            const auto want = reference::brute_force_crossings(widen(b.low), widen(b.high), widen(b.adv), range.lower,
                                                               range.upper, low_range.lower, low_range.upper);
            check_equal(c, want);
            CHECK(c.region_changed() > 100);  // the batch really crowds the bounds
            CHECK(c.non_finite > 0);
            // single-threaded gives the same exact counts
            const crossing_report c1 =
                threshold_crossings_from_ratios(on_host(1), b.low, b.high, b.adv, range, low_range);
            check_equal(c1, want);
        }
    }
}

TEST_CASE("crossing counts from log-probabilities equal a brute-force count (bf16 log-probabilities)") {
    auto g = octet_test::rng(202);
    std::uniform_real_distribution<float> lp(-20.0f, -0.5f), u(0.0f, 1.0f);
    std::normal_distribution<float> d(0.0f, 0.2f), a(0.0f, 1.0f);
    const std::size_t n = 80000;
    std::vector<float> old(n), high(n), low(n), adv(n);
    for (std::size_t i = 0; i < n; ++i) {
        old[i] = lp(g);
        high[i] = old[i] + d(g);
        low[i] = to_float(to_bf16(high[i]));  // the low-precision copy: bf16 log-probabilities
        adv[i] = a(g);
    }
    low[5] = NAN;
    old[6] = -INFINITY;
    const clip_range range = clip_range::asymmetric(0.2f, 0.28f);
    const crossing_report c = threshold_crossings(on_host(), low, high, old, adv, range);
    std::vector<double> rl(n), rh(n);
    for (std::size_t i = 0; i < n; ++i) {
        rl[i] = reference::importance_ratio(low[i], old[i]);
        rh[i] = reference::importance_ratio(high[i], old[i]);
    }
    check_equal(
        c, reference::brute_force_crossings(rl, rh, widen(adv), range.lower, range.upper, range.lower, range.upper));
    CHECK(c.non_finite == 2);
    CHECK(c[advantage_sign::negative].pushed_out_low > 0);  // bf16 rounding does push tokens across
    CHECK(c.negative_pushed_below_fraction() <= c.negative_pushed_out_fraction());
    CHECK(c.to_markdown().find("| negative |") != std::string::npos);
}

TEST_CASE("crossings: empty batches, non-finite inputs and argument errors") {
    const std::vector<float> none;
    const crossing_report e = threshold_crossings(on_host(), none, none, none, none, clip_range{});
    CHECK(e.tokens() == 0);
    CHECK(e.negative_pushed_out_fraction() == 0.0);
    const std::vector<float> a(5, -1.0f), b4(4, -1.0f), adv(5, 1.0f);
    CHECK_THROWS_WITH_AS(threshold_crossings(on_host(), a, b4, a, adv, clip_range{}),
                         doctest::Contains("argument 'logp_high' has 4 elements"), octet::error);
    CHECK_THROWS_WITH_AS(threshold_crossings(on_host(), a, a, b4, adv, clip_range{}),
                         doctest::Contains("argument 'logp_old'"), octet::error);
    CHECK_THROWS_WITH_AS(threshold_crossings(on_host(), a, a, a, b4, clip_range{}),
                         doctest::Contains("argument 'advantages'"), octet::error);
    CHECK_THROWS_WITH_AS(threshold_crossings(on_host(), a, a, a, adv, clip_range{1.5f, 0.5f}),
                         doctest::Contains("argument 'range'"), octet::error);
    CHECK_THROWS_WITH_AS(threshold_crossings(on_host(), a, a, a, adv, clip_range{}, clip_range{NAN, 1.2f}),
                         doctest::Contains("argument 'low_range'"), octet::error);
    CHECK_THROWS_WITH_AS(threshold_crossings_from_ratios(on_host(), a, b4, adv, clip_range{}),
                         doctest::Contains("argument 'ratio_high'"), octet::error);
    // all-non-finite: nothing classified, everything counted
    const std::vector<float> nan5(5, NAN);
    const crossing_report c = threshold_crossings(on_host(), nan5, a, a, adv, clip_range{});
    CHECK(c.non_finite == 5);
    CHECK(c.tokens() == 0);
}
