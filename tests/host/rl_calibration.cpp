// Calibrated clipping: bounds chosen by quantile matching reproduce the high-precision clip
// fractions within sampling error on fresh data (while the nominal bounds miss them by many
// standard errors); the quantile rule, the smoothing, the refresh schedule, the cost accounting,
// non-finite ratios and argument errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "octet/core/bits.hpp"
#include "octet/rl/calibration.hpp"
#include "octet/rl/surrogate.hpp"
#include "support/random.hpp"

using namespace octet;

namespace {

double normal_cdf(double x) {
    return 0.5 * std::erfc(-x / std::sqrt(2.0));
}

/// One batch: log-ratio d ~ N(0, sigma) exactly at high precision; the low-precision new
/// log-probabilities are the high-precision ones stored in bf16. Log-probabilities lie in
/// [-64, -32), where bf16's spacing is 0.25: rounding noise of standard deviation 0.072.
struct ratios {
    std::vector<float> high, low;
};
ratios draw(std::mt19937_64& g, std::size_t n, double sigma) {
    std::uniform_real_distribution<double> lp(-63.0, -33.0);
    std::normal_distribution<double> d(0.0, sigma);
    std::vector<float> old(n), hi(n), lo(n);
    for (std::size_t i = 0; i < n; ++i) {
        const double o = lp(g);
        old[i] = static_cast<float>(o);
        hi[i] = static_cast<float>(static_cast<double>(old[i]) + d(g));
        lo[i] = to_float(to_bf16(hi[i]));
    }
    ratios r{std::vector<float>(n), std::vector<float>(n)};
    importance_ratios(on_host(), hi, old, r.high);
    importance_ratios(on_host(), lo, old, r.low);
    return r;
}

double fraction_below(const std::vector<float>& r, float b) {
    return static_cast<double>(std::count_if(r.begin(), r.end(), [&](float x) { return x < b; })) /
           static_cast<double>(r.size());
}
double fraction_above(const std::vector<float>& r, float b) {
    return static_cast<double>(std::count_if(r.begin(), r.end(), [&](float x) { return x > b; })) /
           static_cast<double>(r.size());
}

}  // namespace

TEST_CASE("calibrated bounds reproduce the reference clip fractions within sampling error") {
    auto g = octet_test::rng(301);
    const double sigma = 0.12;
    const clip_range nominal = clip_range::asymmetric(0.2f, 0.28f);
    // The high-precision log-ratio is exactly N(0, sigma) (up to float rounding of the log-probs,
    // < 1e-5), so the reference fractions are known analytically.
    const double p_below = normal_cdf(std::log(static_cast<double>(nominal.lower)) / sigma);
    const double p_above = 1.0 - normal_cdf(std::log(static_cast<double>(nominal.upper)) / sigma);

    const std::size_t n = 50000, n_eval = 200000;
    const int steps = 20;
    calibrated_clipping cal({nominal, /*refresh_every=*/10, /*smoothing=*/0.8});
    int references = 0;
    for (int step = 0; step < steps; ++step) {
        const ratios r = draw(g, n, sigma);
        if (cal.reference_due(step)) {
            cal.set_reference(step, r.high, 0.001);
            ++references;
        }
        cal.update(step, r.low);
    }
    CHECK(references == 2);
    const clip_range b = cal.bounds();
    CHECK(b.lower < nominal.lower);  // bf16 noise widens the ratios: the bounds move out
    CHECK(b.upper > nominal.upper);

    // Fresh data. Standard error of the calibrated fraction around the true one: the reference's
    // estimate (n), the quantile taken on n low-precision ratios (the smoothing only reduces this
    // term; not counted), and the evaluation sample (n_eval): sqrt(p (1-p) (1/n + 1/n + 1/n_eval)).
    const ratios eval = draw(g, n_eval, sigma);
    const double se_lo = std::sqrt(p_below * (1 - p_below) * (2.0 / n + 1.0 / n_eval));
    const double se_hi = std::sqrt(p_above * (1 - p_above) * (2.0 / n + 1.0 / n_eval));
    const double cal_lo = fraction_below(eval.low, b.lower), cal_hi = fraction_above(eval.low, b.upper);
    const double nom_lo = fraction_below(eval.low, nominal.lower), nom_hi = fraction_above(eval.low, nominal.upper);
    const double hp_lo = fraction_below(eval.high, nominal.lower), hp_hi = fraction_above(eval.high, nominal.upper);
    MESSAGE("lower: true ", p_below, ", high precision ", hp_lo, ", low precision nominal ", nom_lo, ", calibrated ",
            cal_lo, " (bound ", b.lower, "), SE ", se_lo);
    MESSAGE("upper: true ", p_above, ", high precision ", hp_hi, ", low precision nominal ", nom_hi, ", calibrated ",
            cal_hi, " (bound ", b.upper, "), SE ", se_hi);
    // The sanity of the setup: the high-precision fractions are the analytic ones (evaluation SE
    // only). "Within" checks use 5 SE: a false alarm about once in 1.7 million checks, so that CI,
    // which draws a fresh seed every run, does not flake (4 SE failed once in about 50 runs).
    CHECK(std::fabs(hp_lo - p_below) < 5 * binomial_standard_error(p_below, n_eval));
    CHECK(std::fabs(hp_hi - p_above) < 5 * binomial_standard_error(p_above, n_eval));
    // The diagnosis: the nominal bounds on low-precision ratios clip too much, by many SE.
    CHECK(nom_lo - p_below > 4 * se_lo);
    CHECK(nom_hi - p_above > 4 * se_hi);
    // The fix: within 5 standard errors.
    CHECK(std::fabs(cal_lo - p_below) < 5 * se_lo);
    CHECK(std::fabs(cal_hi - p_above) < 5 * se_hi);
}

TEST_CASE("quantile rule: exactly round(p m) ratios fall outside each raw bound") {
    auto g = octet_test::rng(302);
    // reference: 100 distinct ratios, 10 below 0.8 and 5 above 1.2
    std::vector<float> ref;
    for (int i = 0; i < 10; ++i) ref.push_back(0.5f + 0.01f * i);
    for (int i = 0; i < 85; ++i) ref.push_back(0.9f + 0.001f * i);
    for (int i = 0; i < 5; ++i) ref.push_back(1.5f + 0.1f * i);
    calibrated_clipping cal({clip_range::symmetric(0.2f), 5, 0.0});
    const calibration_targets t = cal.set_reference(0, ref);
    CHECK(t.below == 0.1);
    CHECK(t.above == 0.05);
    CHECK(t.tokens == 100);
    for (std::size_t m : {1000, 1001, 3333}) {
        CAPTURE(m);
        std::vector<float> low(m);
        std::uniform_real_distribution<float> u(0.3f, 2.0f);
        for (auto& x : low) x = u(g);
        std::sort(low.begin(), low.end());
        low.erase(std::unique(low.begin(), low.end()), low.end());  // distinct values: the rule is exact
        std::shuffle(low.begin(), low.end(), g);
        const clip_range b = cal.update(1, low);  // smoothing 0: the raw bounds
        const std::size_t k_lo = static_cast<std::size_t>(std::llround(0.1 * static_cast<double>(low.size())));
        const std::size_t k_hi = static_cast<std::size_t>(std::llround(0.05 * static_cast<double>(low.size())));
        CHECK(static_cast<std::size_t>(std::count_if(low.begin(), low.end(), [&](float x) { return x < b.lower; })) ==
              k_lo);
        CHECK(static_cast<std::size_t>(std::count_if(low.begin(), low.end(), [&](float x) { return x > b.upper; })) ==
              k_hi);
        CHECK(cal.last_step().raw.lower == b.lower);
    }
    // the raw bound is the one nearest the nominal bound among those that match: unchanged when
    // the nominal bound already matches, else the extreme ratio for a target of 0
    std::vector<float> none_below{0.9f, 1.0f, 1.1f}, all_below{0.1f, 0.2f, 0.3f};
    calibrated_clipping zero({clip_range::symmetric(0.2f), 5, 0.0});
    zero.set_reference(0, none_below);
    const std::vector<float> low{0.5f, 0.7f, 1.0f, 1.4f}, inside{0.9f, 1.0f, 1.1f};
    CHECK(zero.update(0, low).lower == 0.5f);
    CHECK(zero.update(0, low).upper == 1.4f);
    CHECK(zero.update(0, inside).lower == 0.8f);  // nothing below 0.8 already: the nominal bound stays
    CHECK(zero.update(0, inside).upper == 1.2f);
    calibrated_clipping one({clip_range::symmetric(0.2f), 5, 0.0});
    one.set_reference(0, all_below);
    const clip_range b1 = one.update(0, low);
    CHECK(b1.lower <= b1.upper);  // lower would pass the largest ratio; the two meet
    CHECK(b1.lower > 1.0f);
}

TEST_CASE("smoothing is an exponential average of the raw bounds") {
    std::vector<float> ref{0.5f, 1.0f, 1.0f, 1.5f};  // 1/4 below 0.8, 1/4 above 1.2
    calibrated_clipping cal({clip_range::symmetric(0.2f), 100, 0.75});
    cal.set_reference(0, ref);
    const std::vector<float> a{0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};  // k = 2: lower 0.3, upper 0.6
    const std::vector<float> b{1.1f, 1.2f, 1.3f, 1.4f, 1.5f, 1.6f, 1.7f, 1.8f};  // lower 1.3, upper 1.6
    const clip_range first = cal.update(0, a);
    // the first update takes the raw bounds; of the bounds that leave exactly 2 ratios outside,
    // the nearest to the nominal ones: lower in (0.2, 0.3] -> 0.3, upper in [0.6, 0.7) -> just below 0.7
    CHECK(first.lower == 0.3f);
    CHECK(first.upper == std::nextafter(0.7f, 0.0f));
    const clip_range second = cal.update(1, b);
    // raw: lower in (1.2, 1.3] -> just above 1.2 (nearest 0.8); upper in [1.6, 1.7) -> 1.6 (nearest 1.2)
    CHECK(cal.last_step().raw.lower == std::nextafter(1.2f, 2.0f));
    CHECK(cal.last_step().raw.upper == 1.6f);
    CHECK(second.lower == static_cast<float>(0.75 * static_cast<double>(first.lower) +
                                             0.25 * static_cast<double>(cal.last_step().raw.lower)));
    CHECK(second.upper ==
          static_cast<float>(0.75 * static_cast<double>(first.upper) + 0.25 * static_cast<double>(1.6f)));
    CHECK(cal.last_step().below_nominal == 0.0);  // b has nothing below the nominal 0.8
    CHECK(cal.last_step().above_nominal == 6.0 / 8.0);
}

TEST_CASE("the reference is refreshed every N steps and the cost is accounted") {
    auto g = octet_test::rng(303);
    calibrated_clipping cal({clip_range::symmetric(0.2f), 4, 0.5});
    CHECK(cal.reference_due(0));
    double forward = 0;
    std::vector<std::int64_t> refreshed;
    for (std::int64_t step = 0; step < 13; ++step) {
        const ratios r = draw(g, 2000, 0.1);
        if (cal.reference_due(step)) {
            cal.set_reference(step, r.high, 0.01 * static_cast<double>(step + 1));
            forward += 0.01 * static_cast<double>(step + 1);
            refreshed.push_back(step);
            CHECK(cal.targets().step == step);
        }
        cal.update(step, r.low);
    }
    CHECK(refreshed == std::vector<std::int64_t>{0, 4, 8, 12});
    const calibration_cost& c = cal.cost();
    CHECK(c.references == 4);
    CHECK(c.updates == 13);
    CHECK(c.skipped_updates == 0);
    CHECK(c.reference_forward_seconds == doctest::Approx(forward));
    CHECK(c.update_seconds > 0);  // measured (it did sort 2000 values 13 times)
    CHECK(c.total_seconds() == doctest::Approx(c.update_seconds + c.reference_seconds + forward));
    CHECK(c.seconds_per_update() == doctest::Approx(c.update_seconds / 13));
    CHECK(cal.reference_due(3));  // a step before the reference (after a reload) needs a new one
}

TEST_CASE("calibration: non-finite ratios are skipped; argument errors") {
    std::vector<float> ref{0.5f, 1.0f, 1.0f, 1.5f};
    calibrated_clipping cal({clip_range::symmetric(0.2f), 10, 0.0});
    const std::vector<float> low{0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
    CHECK_THROWS_WITH_AS(cal.update(0, low), doctest::Contains("call set_reference first"), octet::error);
    const std::vector<float> nans(4, NAN);
    CHECK_THROWS_WITH_AS(cal.set_reference(0, nans), doctest::Contains("argument 'ratio_high' has no finite ratio"),
                         octet::error);
    std::vector<float> ref_nan = ref;
    ref_nan.push_back(NAN);
    ref_nan.push_back(INFINITY);
    CHECK(cal.set_reference(0, ref_nan).tokens == 4);  // NaN and Inf left out of the fractions
    CHECK(cal.targets().below == 0.25);
    const clip_range clean = cal.update(0, low);
    std::vector<float> low_nan = low;
    low_nan.insert(low_nan.begin() + 3, NAN);
    low_nan.push_back(-INFINITY);
    const clip_range dirty = cal.update(1, low_nan);
    CHECK(clean.lower == dirty.lower);
    CHECK(clean.upper == dirty.upper);
    const clip_range kept = cal.update(2, nans);  // nothing finite: bounds kept, counted
    CHECK(kept.lower == dirty.lower);
    CHECK(cal.cost().skipped_updates == 1);
    CHECK_THROWS_WITH_AS(calibrated_clipping({clip_range::symmetric(0.2f), 0, 0.5}),
                         doctest::Contains("argument 'cfg.refresh_every'"), octet::error);
    CHECK_THROWS_WITH_AS(calibrated_clipping({clip_range::symmetric(0.2f), 5, 1.0}),
                         doctest::Contains("argument 'cfg.smoothing'"), octet::error);
    CHECK_THROWS_WITH_AS(calibrated_clipping({clip_range{1.2f, 0.8f}, 5, 0.5}),
                         doctest::Contains("argument 'cfg.nominal'"), octet::error);
    CHECK_THROWS_WITH_AS(cal.set_reference(3, ref, -1.0), doctest::Contains("argument 'forward_seconds'"),
                         octet::error);
    CHECK(binomial_standard_error(0.25, 10000) == doctest::Approx(std::sqrt(0.25 * 0.75 / 10000)));
}

TEST_CASE("drift: the reference is refreshed early when the low-precision nominal fractions move") {
    auto g = octet_test::rng(304);
    calibration_config cfg{clip_range::symmetric(0.2f), 100, 0.5, /*drift_tolerance=*/0.25};
    calibrated_clipping cal(cfg);
    // stationary: sigma 0.1 for 30 steps; no early refresh (3 SE of slack keeps noise from triggering)
    std::int64_t step = 0;
    for (; step < 30; ++step) {
        const ratios r = draw(g, 20000, 0.1);
        if (cal.reference_due(step)) cal.set_reference(step, r.high);
        cal.update(step, r.low);
    }
    CHECK(cal.cost().references == 1);
    CHECK(cal.drift_refreshes() == 0);
    CHECK_FALSE(cal.reference_due(step));
    // the policy starts moving twice as fast: the nominal fractions jump, the targets are stale
    const ratios r = draw(g, 20000, 0.2);
    cal.update(step, r.low);
    CHECK(cal.reference_due(step + 1));
    cal.set_reference(step + 1, r.high);
    CHECK(cal.drift_refreshes() == 1);
    CHECK(cal.cost().references == 2);
    cal.update(step + 1, r.low);
    CHECK_FALSE(cal.reference_due(step + 2));  // fresh targets, fresh reference fractions
    // off by default
    calibrated_clipping plain({clip_range::symmetric(0.2f), 100, 0.5});
    plain.set_reference(0, r.high);
    const ratios calm = draw(g, 20000, 0.05);
    plain.update(0, calm.low);
    plain.update(1, r.low);
    CHECK_FALSE(plain.reference_due(2));
    CHECK_THROWS_WITH_AS(calibrated_clipping({clip_range::symmetric(0.2f), 5, 0.5, -1.0}),
                         doctest::Contains("argument 'cfg.drift_tolerance'"), octet::error);
}

TEST_CASE("state() and restore(): a resumed calibrator continues bit for bit") {
    auto g = octet_test::rng(307);
    std::lognormal_distribution<float> spread(0.0f, 0.15f);
    auto batch = [&](std::size_t n) {
        std::vector<float> v(n);
        for (auto& x : v) x = spread(g);
        return v;
    };
    std::vector<std::vector<float>> refs, lows;
    for (int s = 0; s < 12; ++s) refs.push_back(batch(500)), lows.push_back(batch(700 + 13 * s));
    calibration_config cfg{clip_range::asymmetric(0.2f, 0.28f), 4, 0.7, 0.5};
    auto run = [&](calibrated_clipping& c, int from, int to, std::vector<clip_range>& out) {
        for (int s = from; s < to; ++s) {
            if (c.reference_due(s)) c.set_reference(s, refs[static_cast<std::size_t>(s)]);
            out.push_back(c.update(s, lows[static_cast<std::size_t>(s)]));
        }
    };
    calibrated_clipping whole(cfg), first(cfg), resumed(cfg);
    std::vector<clip_range> a, b;
    run(whole, 0, 12, a);
    run(first, 0, 5, b);
    const calibration_state saved = first.state();
    CHECK(saved.cost.updates == 5);
    resumed.restore(saved);
    CHECK(resumed.bounds().lower == first.bounds().lower);
    run(resumed, 5, 12, b);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
        CAPTURE(i);
        CHECK(a[i].lower == b[i].lower);
        CHECK(a[i].upper == b[i].upper);
    }
    CHECK(resumed.cost().updates == whole.cost().updates);
    CHECK(resumed.cost().references == whole.cost().references);
    CHECK(resumed.targets().step == whole.targets().step);
    calibration_state bad = saved;
    bad.lower = std::nan("");
    CHECK_THROWS_AS(resumed.restore(bad), octet::error);
}
