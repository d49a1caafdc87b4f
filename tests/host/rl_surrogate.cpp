// Importance ratios, the clipped surrogate (PPO / GRPO, asymmetric clip ranges) and its per-token
// gradient against the float64 reference (octet/reference/rl.hpp), on fresh random batches with
// edge cases; aggregation modes; GRPO advantages; non-finite inputs; argument errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "octet/reference/rl.hpp"
#include "octet/rl/surrogate.hpp"
#include "support/random.hpp"

using namespace octet;

namespace {

/// Half a float ulp of x's binade: the largest error of one correct rounding to float.
double half_ulp(double x) {
    return std::ldexp(0.5, std::ilogb(x) - 23);
}

struct batch {
    std::vector<float> logp_new, logp_old, adv;
};

/// Log-probabilities of sampled tokens (-U(0, 12)), a policy change of N(0, 0.25) in log space
/// with 1% large jumps (beyond the log-ratio limit), advantages N(0, 1) with 5% exact zeros.
batch random_batch(std::mt19937_64& g, std::size_t n) {
    std::uniform_real_distribution<float> lp(-12.0f, 0.0f), u(0.0f, 1.0f);
    std::normal_distribution<float> step(0.0f, 0.25f), a(0.0f, 1.0f);
    batch b;
    for (std::size_t i = 0; i < n; ++i) {
        const float old = lp(g);
        float d = step(g);
        const float p = u(g);
        if (p < 0.005f)
            d = 25.0f + 10.0f * u(g);
        else if (p < 0.01f)
            d = -25.0f - 10.0f * u(g);
        b.logp_old.push_back(old);
        b.logp_new.push_back(old + d);
        b.adv.push_back(u(g) < 0.05f ? 0.0f : a(g));
    }
    return b;
}

}  // namespace

TEST_CASE("importance ratios are the float64 ratio rounded once to float") {
    auto g = octet_test::rng(101);
    const batch b = random_batch(g, 50000);
    std::vector<float> r(b.logp_new.size());
    importance_ratios(on_host(), b.logp_new, b.logp_old, r);
    std::size_t limited = 0;
    for (std::size_t i = 0; i < r.size(); ++i) {
        const double ref = reference::importance_ratio(b.logp_new[i], b.logp_old[i]);
        // one rounding of exp(d) to float: within half an ulp (plus glibc exp's < 1 double ulp)
        REQUIRE(std::fabs(static_cast<double>(r[i]) - ref) <= half_ulp(ref) * (1 + 1e-12));
        limited += std::fabs(static_cast<double>(b.logp_new[i]) - b.logp_old[i]) > 20.0;
    }
    CHECK(limited > 0);  // the limit was exercised
    // exact values and the limit
    CHECK(importance_ratio(-3.5f, -3.5f) == 1.0f);
    CHECK(importance_ratio(0.0f, -0.0f) == 1.0f);
    CHECK(importance_ratio(-1e-40f, 0.0f) == 1.0f);  // float subnormal difference
    CHECK(importance_ratio(0.0f, -100.0f) == static_cast<float>(std::exp(20.0)));
    CHECK(importance_ratio(-100.0f, 0.0f) == static_cast<float>(std::exp(-20.0)));
    CHECK(importance_ratio(0.0f, -100.0f, INFINITY) ==
          static_cast<float>(std::exp(100.0)));  // limit disabled: overflows to Inf in float
    CHECK(std::isinf(importance_ratio(0.0f, -100.0f, INFINITY)));
    // non-finite log-probabilities give NaN, never a number
    CHECK(std::isnan(importance_ratio(NAN, -1.0f)));
    CHECK(std::isnan(importance_ratio(-1.0f, -INFINITY)));
    CHECK(std::isnan(importance_ratio(INFINITY, INFINITY)));
    CHECK_FALSE(importance_ratio_of(-INFINITY, -1.0f).finite);
    CHECK(importance_ratio_of(10.0f, -15.0f).limited);
    CHECK_FALSE(importance_ratio_of(10.0f, -9.0f).limited);
}

TEST_CASE("per-token rule: branches, bounds, clip-higher, the smallest crossing") {
    const clip_range sym = clip_range::symmetric(0.2f);
    CHECK(sym.lower == 1.0f - 0.2f);
    CHECK(sym.upper == 1.0f + 0.2f);
    // a ratio exactly on a bound is inside: unclipped, gradient r A
    for (float a : {-1.5f, 2.0f}) {
        for (float r : {sym.lower, sym.upper}) {
            const token_surrogate t = surrogate_token(r, a, sym);
            CHECK_FALSE(t.clipped);
            CHECK(t.objective == r * a);
            CHECK(t.gradient == r * a);
        }
    }
    // 0.799 against 0.801 at bound 0.8: a negative-advantage token's penalty is cut by 0.002
    const token_surrogate lo = surrogate_token(0.799f, -1.0f, sym), hi = surrogate_token(0.801f, -1.0f, sym);
    CHECK(lo.clipped);
    CHECK(lo.gradient == 0.0f);
    CHECK(lo.objective == -sym.lower);  // A * max(r, lower)
    CHECK_FALSE(hi.clipped);
    CHECK(hi.gradient == doctest::Approx(-0.801));
    // the lower bound never clips a positive advantage, the upper never a negative one
    CHECK_FALSE(surrogate_token(0.5f, 1.0f, sym).clipped);
    CHECK(surrogate_token(0.5f, 1.0f, sym).gradient == 0.5f);
    CHECK_FALSE(surrogate_token(1.5f, -1.0f, sym).clipped);
    CHECK(surrogate_token(1.5f, -1.0f, sym).objective == -1.5f);
    CHECK(surrogate_token(1.5f, 1.0f, sym).clipped);
    CHECK(surrogate_token(1.5f, 1.0f, sym).objective == sym.upper);
    // clip-higher: [0.8, 1.28] leaves 1.25 unclipped for a positive advantage
    const clip_range dapo = clip_range::asymmetric(0.2f, 0.28f);
    CHECK(surrogate_token(1.25f, 1.0f, sym).clipped);
    CHECK_FALSE(surrogate_token(1.25f, 1.0f, dapo).clipped);
    CHECK(surrogate_token(1.25f, 1.0f, dapo).gradient == 1.25f);
    // zero advantage: objective and gradient 0 whatever the ratio
    CHECK(surrogate_token(3.0f, 0.0f, sym).objective == 0.0f);
    CHECK(surrogate_token(3.0f, 0.0f, sym).gradient == 0.0f);
    // a limited log-ratio passes no gradient but keeps its objective
    const token_surrogate lim = surrogate_token(0.9f, -1.0f, sym, /*limited=*/true);
    CHECK(lim.gradient == 0.0f);
    CHECK(lim.objective == -0.9f);
    // non-finite ratio or advantage: masked
    for (auto [r, a] : {std::pair<float, float>{NAN, 1.0f}, {INFINITY, 1.0f}, {1.0f, NAN}, {1.0f, -INFINITY}}) {
        const token_surrogate t = surrogate_token(r, a, sym);
        CHECK_FALSE(t.finite);
        CHECK(t.objective == 0.0f);
        CHECK(t.gradient == 0.0f);
    }
}

TEST_CASE("clipped surrogate against the float64 reference on random batches, every aggregation") {
    auto g = octet_test::rng(102);
    const std::size_t n = 40000 + std::uniform_int_distribution<std::size_t>(0, 999)(g);  // ragged
    const batch b = random_batch(g, n);
    // ragged sequences for GRPO, some empty
    std::vector<std::int64_t> offsets{0};
    while (offsets.back() < static_cast<std::int64_t>(n))
        offsets.push_back(std::min<std::int64_t>(static_cast<std::int64_t>(n),
                                                 offsets.back() + std::uniform_int_distribution<int>(0, 300)(g)));

    for (const clip_range range : {clip_range::symmetric(0.2f), clip_range::asymmetric(0.2f, 0.28f)}) {
        for (loss_aggregation agg :
             {loss_aggregation::token_mean, loss_aggregation::sequence_mean, loss_aggregation::sum}) {
            CAPTURE(range.upper);
            CAPTURE(static_cast<int>(agg));
            surrogate_config cfg;
            cfg.range = range;
            cfg.aggregation = agg;
            std::vector<float> ratio(n), obj(n), grad(n, NAN);
            const bool by_seq = agg == loss_aggregation::sequence_mean;
            const surrogate_stats s =
                clipped_surrogate(on_host(), b.logp_new, b.logp_old, b.adv, cfg, {ratio, obj, grad},
                                  by_seq ? span<const std::int64_t>(offsets) : span<const std::int64_t>());
            // per-token reference; weights w_t exact in double
            std::vector<double> ref_obj(n), w(n, agg == loss_aggregation::sum ? 1.0 : 1.0 / static_cast<double>(n));
            if (by_seq)
                for (std::size_t q = 0; q + 1 < offsets.size(); ++q)
                    for (std::int64_t t = offsets[q]; t < offsets[q + 1]; ++t)
                        w[static_cast<std::size_t>(t)] = 1.0 / (static_cast<double>(offsets.size() - 1) *
                                                                static_cast<double>(offsets[q + 1] - offsets[q]));
            std::uint64_t clipped_low = 0, clipped_high = 0, limited = 0, below = 0, above = 0;
            double abs_weighted = 0;
            for (std::size_t i = 0; i < n; ++i) {
                const double r = reference::importance_ratio(b.logp_new[i], b.logp_old[i]);
                const bool lim = std::fabs(static_cast<double>(b.logp_new[i]) - b.logp_old[i]) > 20.0;
                // objective: with the exact double ratio; |error| <= 2^-23 |J| (ratio rounding + product rounding)
                const auto exact = reference::surrogate_token(r, b.adv[i], range.lower, range.upper, lim);
                ref_obj[i] = exact.objective;
                REQUIRE(std::fabs(obj[i] - exact.objective) <=
                        std::ldexp(std::fabs(exact.objective), -23) * 1.0001 + 1e-45);
                // branch and gradient: the contract decides on the float ratio, so the reference does too
                const double rf = static_cast<float>(r);
                REQUIRE(ratio[i] == static_cast<float>(rf));
                const auto branch = reference::surrogate_token(rf, b.adv[i], range.lower, range.upper, lim);
                // grad = -(float(w) g), g = fl(r A): two roundings in float, one for w -> 2^-22 relative
                const double want = -w[i] * branch.gradient;
                REQUIRE(std::fabs(grad[i] - want) <= std::ldexp(std::fabs(want), -22) * 1.0001 + 1e-45);
                clipped_low += branch.clipped && b.adv[i] < 0;
                clipped_high += branch.clipped && b.adv[i] > 0;
                below += rf < range.lower;
                above += rf > range.upper;
                limited += lim;
                abs_weighted += w[i] * std::fabs(exact.objective);
            }
            CHECK(s.tokens == n);
            CHECK(s.non_finite == 0);
            CHECK(s.clipped_low == clipped_low);
            CHECK(s.clipped_high == clipped_high);
            CHECK(s.below == below);
            CHECK(s.above == above);
            CHECK(s.limited == limited);
            CHECK(clipped_low > 0);
            CHECK(clipped_high > 0);
            // aggregated objective: per-token relative error 2^-23, summed in double
            const double ref = reference::aggregated_objective(ref_obj, by_seq ? offsets : std::vector<std::int64_t>{},
                                                               agg != loss_aggregation::sum);
            CHECK(std::fabs(s.objective - ref) <= std::ldexp(abs_weighted, -23) * 1.0001 + 1e-12);
            CHECK(s.loss() == -s.objective);
        }
    }
}

TEST_CASE("results do not depend on the thread count") {
    auto g = octet_test::rng(103);
    const batch b = random_batch(g, 100000);
    surrogate_config cfg;
    std::vector<float> g1(b.adv.size()), g4(b.adv.size());
    const surrogate_stats s1 = clipped_surrogate(on_host(1), b.logp_new, b.logp_old, b.adv, cfg, {{}, {}, g1});
    const surrogate_stats s4 = clipped_surrogate(on_host(4), b.logp_new, b.logp_old, b.adv, cfg, {{}, {}, g4});
    CHECK(s1.objective == s4.objective);  // fixed reduction blocks: bitwise equal
    CHECK(s1.ratio_sum == s4.ratio_sum);
    CHECK(s1.clipped_low == s4.clipped_low);
    CHECK(g1 == g4);
}

TEST_CASE("non-finite log-probabilities and advantages: counted and masked, or octet::error") {
    auto g = octet_test::rng(104);
    batch b = random_batch(g, 3000);
    b.logp_new[7] = NAN;
    b.logp_old[100] = -INFINITY;
    b.logp_new[2000] = INFINITY;
    b.adv[2999] = NAN;
    surrogate_config cfg;
    cfg.aggregation = loss_aggregation::sum;
    std::vector<float> ratio(3000), obj(3000), grad(3000);
    const surrogate_stats s = clipped_surrogate(on_host(), b.logp_new, b.logp_old, b.adv, cfg, {ratio, obj, grad});
    CHECK(s.non_finite == 4);
    CHECK(s.finite_tokens() == 2996);
    for (std::size_t i : {7, 100, 2000, 2999}) {
        CHECK(obj[i] == 0.0f);
        CHECK(grad[i] == 0.0f);
    }
    CHECK(std::isnan(ratio[7]));
    CHECK(std::isfinite(ratio[2999]));  // the ratio is fine; the advantage is not
    CHECK(std::isfinite(s.objective));
    // the same batch without those tokens gives the same sums (masked, not mixed in)
    batch c = b;
    for (std::size_t i : {7, 100, 2000, 2999}) c.adv[i] = 0.0f, c.logp_new[i] = c.logp_old[i] = -1.0f;
    const surrogate_stats sc = clipped_surrogate(on_host(), c.logp_new, c.logp_old, c.adv, cfg);
    CHECK(sc.objective == s.objective);

    cfg.on_nonfinite = token_nonfinite_policy::raise;
    CHECK_THROWS_WITH_AS(clipped_surrogate(on_host(), b.logp_new, b.logp_old, b.adv, cfg),
                         doctest::Contains("argument 'logp_new' has the non-finite value nan at index 7"),
                         octet::error);
    b.logp_new[7] = b.logp_new[2000] = -1.0f;
    CHECK_THROWS_WITH_AS(clipped_surrogate(on_host(), b.logp_new, b.logp_old, b.adv, cfg),
                         doctest::Contains("argument 'logp_old' has the non-finite value -inf at index 100"),
                         octet::error);
    b.logp_old[100] = -1.0f;
    CHECK_THROWS_WITH_AS(clipped_surrogate(on_host(), b.logp_new, b.logp_old, b.adv, cfg),
                         doctest::Contains("argument 'advantages'"), octet::error);
}

TEST_CASE("argument errors name the argument") {
    std::vector<float> a(10, -1.0f), b9(9, -1.0f), adv(10, 1.0f);
    surrogate_config cfg;
    CHECK_THROWS_WITH_AS(clipped_surrogate(on_host(), a, b9, adv, cfg),
                         doctest::Contains("argument 'logp_old' has 9 elements"), octet::error);
    CHECK_THROWS_WITH_AS(clipped_surrogate(on_host(), a, a, b9, cfg), doctest::Contains("argument 'advantages'"),
                         octet::error);
    std::vector<float> out9(9);
    CHECK_THROWS_WITH_AS(clipped_surrogate(on_host(), a, a, adv, cfg, {{}, {}, out9}),
                         doctest::Contains("argument 'out.grad'"), octet::error);
    CHECK_THROWS_WITH_AS(importance_ratios(on_host(), a, a, out9), doctest::Contains("argument 'ratios'"),
                         octet::error);
    std::vector<float> out10(10);
    CHECK_THROWS_WITH_AS(importance_ratios(on_host(), a, a, out10, -1.0f),
                         doctest::Contains("argument 'log_ratio_limit'"), octet::error);
    cfg.range = clip_range{1.2f, 0.8f};
    CHECK_THROWS_WITH_AS(clipped_surrogate(on_host(), a, a, adv, cfg), doctest::Contains("argument 'cfg.range'"),
                         octet::error);
    cfg.range = clip_range{};
    cfg.log_ratio_limit = 0.0f;
    CHECK_THROWS_WITH_AS(clipped_surrogate(on_host(), a, a, adv, cfg),
                         doctest::Contains("argument 'cfg.log_ratio_limit'"), octet::error);
    cfg.log_ratio_limit = NAN;
    CHECK_THROWS_AS(clipped_surrogate(on_host(), a, a, adv, cfg), octet::error);
    cfg.log_ratio_limit = 20.0f;
    // sequence offsets
    cfg.aggregation = loss_aggregation::sequence_mean;
    CHECK_THROWS_WITH_AS(clipped_surrogate(on_host(), a, a, adv, cfg), doctest::Contains("argument 'sequence_offsets'"),
                         octet::error);
    for (std::vector<std::int64_t> bad : {std::vector<std::int64_t>{1, 10}, {0, 9}, {0, 6, 4, 10}, {0}}) {
        CHECK_THROWS_WITH_AS(clipped_surrogate(on_host(), a, a, adv, cfg, {}, bad),
                             doctest::Contains("argument 'sequence_offsets'"), octet::error);
        CHECK_THROWS_AS(validate_sequence_offsets(bad, 10), octet::error);
    }
    const std::vector<std::int64_t> good{0, 4, 4, 10};
    CHECK_NOTHROW(validate_sequence_offsets(good, 10));
    CHECK_NOTHROW(clipped_surrogate(on_host(), a, a, adv, cfg, {}, good));
    cfg.aggregation = loss_aggregation::token_mean;
    CHECK_THROWS_WITH_AS(clipped_surrogate(on_host(), a, a, adv, cfg, {}, good),
                         doctest::Contains("only used by loss_aggregation::sequence_mean"), octet::error);
    // empty batch: nothing to do, zero statistics
    const std::vector<float> none;
    const surrogate_stats s = clipped_surrogate(on_host(), none, none, none, cfg);
    CHECK(s.tokens == 0);
    CHECK(s.objective == 0.0);
    CHECK(s.clip_fraction() == 0.0);
}

TEST_CASE("GRPO group advantages against the float64 reference") {
    auto g = octet_test::rng(105);
    for (std::size_t group : {1, 2, 8, 16}) {
        CAPTURE(group);
        std::normal_distribution<double> d(0.5, 2.0);
        std::vector<float> rewards(group * 300);
        for (auto& r : rewards) r = static_cast<float>(d(g));
        for (std::size_t k = 0; k < group; ++k) rewards[k] = 3.0f;  // one all-equal group
        for (bool scale : {true, false}) {
            group_advantage_config cfg;
            cfg.scale_by_std = scale;
            std::vector<float> adv(rewards.size());
            group_advantages(on_host(), rewards, group, adv, cfg);
            const std::vector<double> ref =
                reference::group_advantages(std::vector<double>(rewards.begin(), rewards.end()), group, cfg.eps, scale);
            for (std::size_t i = 0; i < adv.size(); ++i)  // one rounding of a double result: half an ulp
                REQUIRE(std::fabs(adv[i] - ref[i]) <= (ref[i] == 0 ? 0.0 : half_ulp(std::fabs(ref[i])) * 1.0001));
            for (std::size_t k = 0; k < group; ++k) CHECK(adv[k] == 0.0f);
        }
    }
    // eps = 0 with equal rewards gives 0, not 0/0
    std::vector<float> same(4, 2.0f), adv(4);
    group_advantages(on_host(), same, 4, adv, group_advantage_config{true, 0.0f});
    for (float a : adv) CHECK(a == 0.0f);
    // a non-finite reward poisons its group only (counted downstream as non-finite tokens)
    std::vector<float> r{1, 2, NAN, 4, 1, 2, 3, 4}, out(8);
    group_advantages(on_host(), r, 4, out);
    for (int i = 0; i < 4; ++i) CHECK(std::isnan(out[i]));
    for (int i = 4; i < 8; ++i) CHECK(std::isfinite(out[i]));
    CHECK_THROWS_WITH_AS(group_advantages(on_host(), r, 3, out), doctest::Contains("not a multiple of group_size 3"),
                         octet::error);
    CHECK_THROWS_WITH_AS(group_advantages(on_host(), r, 0, out), doctest::Contains("argument 'group_size'"),
                         octet::error);
    std::vector<float> out7(7);
    CHECK_THROWS_WITH_AS(group_advantages(on_host(), r, 4, out7), doctest::Contains("argument 'advantages'"),
                         octet::error);
}
