// The check registry: threshold logic (both sides, NaN, patience), the named kinds and their
// defaults, per-step values with attempts and costs, and the value helpers of signals.hpp
// against analytic values.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "octet/format/encode.hpp"
#include "octet/monitor/checks.hpp"
#include "octet/monitor/signals.hpp"
#include "support/random.hpp"

using namespace octet;

TEST_CASE("threshold logic: above, below, NaN, patience") {
    const threshold up = threshold::above(1.0, 2.0);
    CHECK(up.classify(0.5) == check_status::ok);
    CHECK(up.classify(1.0) == check_status::ok);  // limits are strict
    CHECK(up.classify(1.5) == check_status::warn);
    CHECK(up.classify(2.0) == check_status::warn);
    CHECK(up.classify(2.0000001) == check_status::trip);
    CHECK(up.classify(INFINITY) == check_status::trip);
    CHECK(up.classify(NAN) == check_status::trip);  // a monitor that cannot give a number has found a problem
    const threshold down = threshold::below(0.5, 0.1);
    CHECK(down.classify(0.9) == check_status::ok);
    CHECK(down.classify(0.3) == check_status::warn);
    CHECK(down.classify(0.05) == check_status::trip);
    CHECK(down.classify(-INFINITY) == check_status::trip);
    CHECK(down.classify(NAN) == check_status::trip);
    CHECK(up.describe(check_status::trip) == "> 2");
    CHECK(down.describe(check_status::warn) == "< 0.5");
    CHECK_THROWS_WITH_AS(threshold::above(2.0, 1.0), doctest::Contains("argument 'warn'"), octet::error);
    CHECK_THROWS_WITH_AS(threshold::below(0.1, 0.5), doctest::Contains("argument 'warn'"), octet::error);
    CHECK_THROWS_WITH_AS(threshold::above(1.0, 2.0, 0), doctest::Contains("argument 'patience'"), octet::error);
    CHECK_THROWS_AS(threshold::above(NAN, 2.0), octet::error);

    check_registry reg;
    const auto id = reg.add("noisy", check_kind::custom, threshold::above(1.0, 2.0, /*patience=*/3));
    CHECK(reg.record(id, 0, 5.0) == check_status::warn);  // 1st consecutive trip: not yet
    CHECK(reg.record(id, 1, 5.0) == check_status::warn);
    CHECK(reg.record(id, 2, 5.0) == check_status::trip);  // 3rd
    CHECK(reg.record(id, 3, 5.0) == check_status::trip);
    CHECK(reg.record(id, 4, 0.0) == check_status::ok);  // resets
    CHECK(reg.record(id, 5, 5.0) == check_status::warn);
}

TEST_CASE("patience counts steps: repeating a step does not add to the run of trips") {
    check_registry reg;
    const auto id = reg.add("noisy", check_kind::custom, threshold::above(1.0, 2.0, /*patience=*/2));
    CHECK(reg.record(id, 10, 5.0) == check_status::warn);  // 1st tripping step
    CHECK(reg.record(id, 10, 5.0) == check_status::warn);  // the same step again (a repeat): still the 1st
    CHECK(reg.record(id, 10, 5.0) == check_status::warn);
    CHECK(reg.record(id, 11, 5.0) == check_status::trip);  // 2nd tripping step
    CHECK(reg.record(id, 11, 5.0) == check_status::trip);  // repeating it keeps it the 2nd
    CHECK(reg.record(id, 11, 0.0) == check_status::ok);    // a clean repeat replaces the trip ...
    CHECK(reg.record(id, 12, 5.0) == check_status::warn);  // ... so the run starts again
    // a repeat that trips after a clean first attempt counts as that step's trip (once)
    CHECK(reg.record(id, 13, 0.0) == check_status::ok);
    CHECK(reg.record(id, 13, 5.0) == check_status::trip);  // steps 12 and 13 trip
    CHECK(reg.history(id).size() == 9);
    // random interleavings: the status after each sample equals the count over steps (oracle:
    // the latest value of every step so far, counted back from the newest step)
    auto rng = octet_test::rng(402);
    for (int trial = 0; trial < 20; ++trial) {
        check_registry r;
        const int patience = 1 + static_cast<int>(rng() % 4);
        const auto c = r.add("c", check_kind::custom, threshold::above(1.0, 2.0, patience));
        std::vector<bool> trips_of_step;  // the latest sample of each step
        for (int k = 0; k < 60; ++k) {
            const bool repeat = !trips_of_step.empty() && rng() % 3 == 0;
            const bool trip = rng() % 4 != 0;
            if (repeat)
                trips_of_step.back() = trip;
            else
                trips_of_step.push_back(trip);
            const auto step = static_cast<std::int64_t>(trips_of_step.size()) - 1;
            int run = 0;
            for (auto it = trips_of_step.rbegin(); it != trips_of_step.rend() && *it; ++it) ++run;
            const check_status want = !trip             ? check_status::ok
                                      : run >= patience ? check_status::trip
                                                        : check_status::warn;
            CHECK(r.record(c, step, trip ? 5.0 : 0.0) == want);
        }
    }
}

TEST_CASE("named kinds measure non-negative values: negative limits are rejected") {
    check_registry reg;
    for (check_kind k : {check_kind::saturation_rate, check_kind::underflow_rate, check_kind::clip_crossings,
                         check_kind::non_finite, check_kind::softmax_row_sum, check_kind::optimizer_decode_error}) {
        CHECK_THROWS_WITH_AS(reg.add(std::string("neg.") + check_kind_name(k), k, threshold::above(-0.5, -0.1)),
                             doctest::Contains("argument 'limits'"), octet::error);
        CHECK_THROWS_WITH_AS(reg.add(std::string("negtrip.") + check_kind_name(k), k, threshold::above(-1.0, 0.5)),
                             doctest::Contains("never negative"), octet::error);
    }
    CHECK(reg.size() == 0);
    // zero limits are fine (non_finite's default), and a value of 0 does not trip them
    const auto sat = reg.add("sat", check_kind::saturation_rate, threshold::above(0.0, 0.0));
    CHECK(reg.record(sat, 0, 0.0) == check_status::ok);
    CHECK(reg.record(sat, 1, 1e-6) == check_status::trip);
    // custom checks may measure anything
    const auto logit = reg.add("logit.min", check_kind::custom, threshold::below(-5.0, -10.0));
    CHECK(reg.record(logit, 0, -7.0) == check_status::warn);
}

TEST_CASE("every named kind has a name and a default threshold") {
    const check_kind kinds[] = {
        check_kind::softmax_row_sum,        check_kind::stored_o_vs_pv, check_kind::saturation_rate,
        check_kind::underflow_rate,         check_kind::amax_drift,     check_kind::non_finite,
        check_kind::optimizer_decode_error, check_kind::clip_crossings, check_kind::custom};
    CHECK(sizeof kinds / sizeof kinds[0] == check_kind_count);
    for (check_kind k : kinds) CHECK(std::string(check_kind_name(k)) != "unknown");
    CHECK(default_threshold(check_kind::non_finite).classify(0) == check_status::ok);
    CHECK(default_threshold(check_kind::non_finite).classify(1) == check_status::trip);
    CHECK(default_threshold(check_kind::softmax_row_sum).classify(5e-3) == check_status::warn);
    CHECK(default_threshold(check_kind::softmax_row_sum).classify(2e-2) == check_status::trip);
    CHECK(default_threshold(check_kind::amax_drift).classify(1.0) == check_status::ok);
    CHECK(default_threshold(check_kind::amax_drift).classify(1.5) == check_status::warn);
    CHECK(default_threshold(check_kind::amax_drift).classify(4.0) == check_status::trip);
    CHECK(default_threshold(check_kind::clip_crossings).classify(0.02) == check_status::trip);
    CHECK(default_threshold(check_kind::custom).classify(1e300) == check_status::ok);  // custom never trips by default
    CHECK(default_threshold(check_kind::custom).classify(NAN) == check_status::trip);
}

TEST_CASE("registry: names, per-step values, attempts, latest sample, costs") {
    check_registry reg;
    const auto rs = reg.add("attn.l0.row_sum", check_kind::softmax_row_sum, "attention.l0");
    const auto nf = reg.add("grad.non_finite", check_kind::non_finite, "backward");
    CHECK(reg.size() == 2);
    CHECK(reg.find("grad.non_finite") == nf);
    CHECK(reg.contains("attn.l0.row_sum"));
    CHECK(reg.spec(rs).operation == "attention.l0");
    CHECK_THROWS_WITH_AS(reg.add("grad.non_finite", check_kind::custom), doctest::Contains("already registered"),
                         octet::error);
    CHECK_THROWS_WITH_AS(reg.add("", check_kind::custom), doctest::Contains("argument 'name'"), octet::error);
    CHECK_THROWS_WITH_AS(reg.find("nope"), doctest::Contains("'nope' is not a registered check"), octet::error);
    CHECK_THROWS_WITH_AS(reg.record(7, 0, 1.0), doctest::Contains("argument 'id' is 7 but 2 checks"), octet::error);
    CHECK_THROWS_WITH_AS(reg.record(rs, 0, 1.0, -1.0), doctest::Contains("argument 'cost_seconds'"), octet::error);

    CHECK(reg.record(rs, 0, 1e-5, 0.001) == check_status::ok);
    CHECK(reg.record(nf, 0, 0.0, 0.002) == check_status::ok);
    CHECK(reg.tripped(0).empty());
    CHECK(reg.record(nf, 1, 3.0, 0.002) == check_status::trip);
    CHECK(reg.record(rs, 1, 5e-3) == check_status::warn);
    CHECK(reg.tripped(1) == std::vector<check_registry::check_id>{nf});
    CHECK(reg.warned(1) == std::vector<check_registry::check_id>{rs});
    // a repeat of step 1 is a new attempt; the latest attempt decides
    CHECK(reg.record(nf, 1, 0.0, 0.002) == check_status::ok);
    CHECK(reg.latest(nf, 1)->attempt == 2);
    CHECK(reg.tripped(1).empty());
    CHECK(reg.latest(nf, 99) == nullptr);
    CHECK(reg.history(nf).size() == 3);
    CHECK(reg.history(nf)[1].value == 3.0);
    const check_summary& s = reg.summary(nf);
    CHECK(s.samples == 3);
    CHECK(s.trips == 1);
    CHECK(s.worst == 3.0);
    CHECK(s.last == 0.0);
    CHECK(s.seconds == doctest::Approx(0.006));
    CHECK(reg.cost_seconds() == doctest::Approx(0.007));
    // measure() times the computation as the check's cost
    const auto st = reg.measure(rs, 2, [] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        return 2e-2;
    });
    CHECK(st == check_status::trip);
    CHECK(reg.history(rs).back().seconds >= 0.002);
    CHECK(reg.describe(rs, reg.history(rs).back()).find("check 'attn.l0.row_sum' (softmax_row_sum) = 0.02 > 0.01") !=
          std::string::npos);
    // NaN values stick as the worst
    reg.record(rs, 3, NAN);
    reg.record(rs, 4, 1e-6);
    CHECK(std::isnan(reg.summary(rs).worst));
    // reports: every check appears; JSON writes NaN as null
    const std::string md = reg.to_markdown(), js = reg.to_json();
    CHECK(md.find("| attn.l0.row_sum | softmax_row_sum | attention.l0 | 5 |") != std::string::npos);
    CHECK(js.find("\"name\": \"grad.non_finite\"") != std::string::npos);
    CHECK(js.find("\"worst\": null") != std::string::npos);
    CHECK(js.find("nan") == std::string::npos);
    CHECK(std::count(js.begin(), js.end(), '{') == std::count(js.begin(), js.end(), '}'));
}

TEST_CASE("signals: softmax row-sum residual and stored-O mismatch against analytic values") {
    auto g = octet_test::rng(401);
    const std::size_t rows = 64, cols = 257;
    std::normal_distribution<double> d(0.0, 3.0);
    std::vector<float> p(rows * cols);
    for (std::size_t r = 0; r < rows; ++r) {
        std::vector<double> s(cols);
        double m = -1e300, z = 0;
        for (auto& x : s) m = std::max(m, x = d(g));
        for (auto& x : s) z += std::exp(x - m);
        for (std::size_t c = 0; c < cols; ++c) p[r * cols + c] = static_cast<float>(std::exp(s[c] - m) / z);
    }
    // exact softmax rounded to float: each entry off by <= half an ulp, the row sum by <= cols * 2^-25
    const double clean = softmax_row_sum_residual(p, rows, cols);
    CHECK(clean <= cols * std::ldexp(1.0, -25));
    p[5 * cols + 7] += 0.03f;  // one row off by about 0.03
    CHECK(softmax_row_sum_residual(p, rows, cols) == doctest::Approx(0.03).epsilon(1e-3));
    p[9 * cols] = NAN;
    CHECK(std::isnan(softmax_row_sum_residual(p, rows, cols)));
    CHECK_THROWS_WITH_AS(softmax_row_sum_residual(p, rows, cols + 1), doctest::Contains("argument 'probs'"),
                         octet::error);
    CHECK(softmax_row_sum_residual(span<const float>(), 0, 5) == 0.0);

    const std::vector<float> pv{3.0f, 4.0f, 0.0f}, o{3.0f, 4.0f, 0.5f};
    CHECK(relative_mismatch(o, pv) == doctest::Approx(0.1));  // 0.5 / 5
    CHECK(relative_mismatch(pv, pv) == 0.0);
    const std::vector<float> zero(3, 0.0f);
    CHECK(relative_mismatch(zero, zero) == 0.0);
    CHECK(std::isinf(relative_mismatch(o, zero)));
    const std::vector<float> two(2, 1.0f);
    CHECK_THROWS_WITH_AS(relative_mismatch(o, two), doctest::Contains("argument 'stored'"), octet::error);
}

TEST_CASE("signals: saturation, underflow, amax drift, non-finite, decode error") {
    // E4M3: max finite 448, smallest subnormal 2^-9 (values below 2^-10 round to zero, 2^-10 ties to even 0)
    const std::vector<float> x{1.0f,
                               -500.0f,
                               448.0f,
                               460.0f,
                               INFINITY,
                               NAN,
                               0.0f,
                               std::ldexp(1.0f, -11),
                               -std::ldexp(1.0f, -12),
                               std::ldexp(1.0f, -9),
                               std::ldexp(1.0f, -10)};
    // saturation: |x| > 448 among 10 non-NaN values: -500, 460, Inf
    CHECK(saturation_rate<e4m3>(x) == doctest::Approx(3.0 / 10.0));
    // underflow: non-zero finite values = 1, -500, 448, 460, 2^-11, -2^-12, 2^-9, 2^-10 (8); lost: 2^-11, -2^-12, 2^-10
    CHECK(underflow_rate<e4m3>(x) == doctest::Approx(3.0 / 8.0));
    CHECK(underflow_rate<e4m3, round::up>(x) == doctest::Approx(1.0 / 8.0));  // rounding up keeps the positive ones
    CHECK(decode<e4m3>(encode<e4m3>(std::ldexp(1.0f, -10))) == 0.0f);         // the tie goes to the even code 0
    CHECK(saturation_rate<e4m3>(span<const float>()) == 0.0);

    const std::vector<float> hist{1.0f, 4.0f, -8.0f, 2.0f};
    CHECK(amax_drift(8.0, hist) == 1.0);
    CHECK(amax_drift(-20.0, hist) == 2.5);
    const std::vector<float> zeros(3, 0.0f), nan_hist{1.0f, NAN};
    CHECK(amax_drift(0.0, zeros) == 0.0);
    CHECK(std::isinf(amax_drift(1.0, zeros)));
    CHECK(std::isnan(amax_drift(1.0, nan_hist)));
    CHECK_THROWS_WITH_AS(amax_drift(1.0, span<const float>()), doctest::Contains("argument 'history' is empty"),
                         octet::error);

    CHECK(count_non_finite(x) == 2.0);
    const std::vector<float> orig{3.0f, 4.0f}, dec{3.0f, 4.5f};
    CHECK(relative_rms_error(orig, dec) == doctest::Approx(0.1));
    CHECK(relative_rms_error(orig, orig) == 0.0);
    CHECK_THROWS_WITH_AS(relative_rms_error(orig, x), doctest::Contains("argument 'decoded'"), octet::error);
}
