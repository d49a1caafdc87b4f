// octet/rl/calibration.hpp: calibrated clipping. Low-precision ratios are noisier than the
// high-precision ones, so under the nominal bounds more tokens fall outside the region. The
// calibrator measures the clip fractions of a high-precision reference batch under the nominal
// bounds, then picks bounds for each step's low-precision ratios by quantile matching, so that the
// same fractions fall below the lower and above the upper bound; the bounds are smoothed across
// steps, and the reference is refreshed every N steps.
//
//   octet::calibrated_clipping cal({/*nominal*/ octet::clip_range::asymmetric(0.2f, 0.28f),
//                                   /*refresh_every*/ 50, /*smoothing*/ 0.8});
//   for (step ...) {
//       if (cal.reference_due(step))                            // high-precision forward on this batch
//           cal.set_reference(step, ratio_high, forward_seconds);
//       octet::clip_range bounds = cal.update(step, ratio_low);   // use these for the low-precision ratios
//   }
//   cal.cost();   // updates, references, seconds in each, the caller's high-precision forwards
//   octet::calibration_state saved = cal.state();   // checkpoint; cal.restore(saved) resumes bit for bit
//
// Rules (host; O(n) per step with std::nth_element on a scratch copy):
//   * Targets: p_below = #(r_high < nominal.lower) / n_f, p_above = #(r_high > nominal.upper) / n_f
//     over the reference's n_f finite ratios.
//   * Raw bounds for a step's m finite low-precision ratios x_(1) <= ... <= x_(m): with
//     k_lo = round(p_below m), every lower bound in (x_(k_lo), x_(k_lo + 1)] leaves exactly k_lo
//     ratios below it; with k_hi = round(p_above m), every upper bound in [x_(m - k_hi),
//     x_(m - k_hi + 1)) leaves exactly k_hi above it (x_(0) = -inf, x_(m + 1) = +inf). Of each
//     interval the calibrator takes the point nearest the nominal bound: the smallest change that
//     matches the fractions (the nominal bound itself when it already does; with ties, where no
//     bound matches exactly, the interval's upper end). If lower > upper the two meet at their
//     midpoint.
//   * Smoothing: bounds_t = s bounds_{t-1} + (1 - s) raw_t (exponential, in double; the first
//     update takes raw_1). A refresh changes the targets, not the smoothed state.
//   * Staleness: the targets are the reference step's fractions. When the true fractions drift
//     between references (a policy that moves faster or slower), the calibrated fractions follow
//     the stale targets; refresh more often, or set drift_tolerance to refresh when the
//     low-precision nominal fractions (free to observe) move away from their reference values.
//   * Non-finite ratios (NaN, Inf) are left out of every count and quantile; a step with no finite
//     low-precision ratio keeps the previous bounds and is counted in cost().skipped_updates.
//   * Sampling error: the calibrated fraction on fresh data scatters around the target with the
//     binomial standard error sqrt(p (1 - p) (1/n_ref + 1/m)) (binomial_standard_error below);
//     tests check it within a few of those.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "octet/core/check.hpp"
#include "octet/core/span.hpp"
#include "octet/rl/clip.hpp"

namespace octet {

/// Standard error of a fraction p measured on n independent tokens: sqrt(p (1 - p) / n).
inline double binomial_standard_error(double p, double n) {
    return n > 0 ? std::sqrt(p * (1.0 - p) / n) : 0.0;
}

struct calibration_config {
    clip_range nominal{};    ///< the bounds the reference's clip fractions are measured under
    int refresh_every = 50;  ///< steps between high-precision references (N >= 1)
    double smoothing = 0.8;  ///< weight of the previous bounds in the exponential average, in [0, 1)
    /// Refresh early when the low-precision ratios' own nominal clip fraction (either side) has
    /// moved since the reference step by more than drift_tolerance times its value there plus
    /// three binomial standard errors: the targets are then stale. 0 turns this off.
    double drift_tolerance = 0.0;
};

/// Clip fractions of the reference batch under the nominal bounds.
struct calibration_targets {
    double below = 0;          ///< p_below
    double above = 0;          ///< p_above
    std::uint64_t tokens = 0;  ///< finite reference ratios
    std::int64_t step = -1;    ///< step of the reference (-1: none yet)
};

/// What calibration cost: time in this class, plus the high-precision forwards the caller reports.
struct calibration_cost {
    std::uint64_t updates = 0;
    std::uint64_t skipped_updates = 0;
    std::uint64_t references = 0;
    double update_seconds = 0;             ///< quantile matching and smoothing
    double reference_seconds = 0;          ///< measuring the reference's fractions
    double reference_forward_seconds = 0;  ///< the caller's high-precision forwards (set_reference's argument)

    double total_seconds() const { return update_seconds + reference_seconds + reference_forward_seconds; }
    double seconds_per_update() const { return updates ? update_seconds / static_cast<double>(updates) : 0.0; }
};

/// One update's details, for logs: the raw (unsmoothed) bounds and the low-precision fractions
/// under the nominal bounds (what the step would have clipped without calibration).
struct calibration_step {
    std::int64_t step = -1;
    clip_range raw{};
    clip_range smoothed{};
    double below_nominal = 0;
    double above_nominal = 0;
    std::uint64_t tokens = 0;
};

/// Everything reference_due() and update() depend on besides the config: what a checkpoint keeps
/// so that a resumed run calibrates bit for bit as the uninterrupted one (state(), restore()).
/// Plain data.
struct calibration_state {
    double lower = 0, upper = 0;  ///< the smoothed bounds
    calibration_targets targets{};
    calibration_cost cost{};
    calibration_step last{}, at_reference{};
    std::uint64_t drift_refreshes = 0;
};

class calibrated_clipping {
public:
    explicit calibrated_clipping(calibration_config cfg)
        : cfg_(cfg), bounds_lo_(cfg.nominal.lower), bounds_hi_(cfg.nominal.upper) {
        constexpr const char* fn = "octet::calibrated_clipping";
        OCTET_REQUIRE(cfg.nominal.lower <= cfg.nominal.upper && is_finite_float(cfg.nominal.lower) &&
                          is_finite_float(cfg.nominal.upper),
                      fn, "cfg.nominal",
                      detail::message("is [", cfg.nominal.lower, ", ", cfg.nominal.upper,
                                      "]; pass finite bounds with lower <= upper"));
        OCTET_REQUIRE(cfg.refresh_every >= 1, fn, "cfg.refresh_every",
                      detail::message("is ", cfg.refresh_every, "; pass N >= 1 steps"));
        OCTET_REQUIRE(cfg.smoothing >= 0.0 && cfg.smoothing < 1.0, fn, "cfg.smoothing",
                      detail::message("is ", cfg.smoothing, "; pass a weight in [0, 1) (0: no smoothing)"));
        OCTET_REQUIRE(cfg.drift_tolerance >= 0.0, fn, "cfg.drift_tolerance",
                      detail::message("is ", cfg.drift_tolerance, "; pass a relative tolerance >= 0 (0: off)"));
    }

    const calibration_config& config() const { return cfg_; }

    /// True when step needs a high-precision reference: none yet, N steps since the last one, a
    /// step before it (after a reload), or (drift_tolerance > 0) the nominal fractions drifted.
    bool reference_due(std::int64_t step) const {
        if (targets_.step < 0 || step - targets_.step >= cfg_.refresh_every || step < targets_.step) return true;
        return cfg_.drift_tolerance > 0 && drifted();
    }
    /// Early refreshes the drift rule asked for (included in cost().references).
    std::uint64_t drift_refreshes() const { return drift_refreshes_; }

    /// Measures the target fractions from the high-precision ratios of a reference batch.
    /// `forward_seconds` is what the caller spent computing them (reported in cost()).
    calibration_targets set_reference(std::int64_t step, span<const float> ratio_high, double forward_seconds = 0) {
        constexpr const char* fn = "octet::calibrated_clipping::set_reference";
        OCTET_REQUIRE(forward_seconds >= 0, fn, "forward_seconds", "must be non-negative");
        const auto t0 = std::chrono::steady_clock::now();
        std::uint64_t below = 0, above = 0, finite = 0;
        for (float r : ratio_high) {
            if (!is_finite_float(r)) continue;
            ++finite;
            below += r < cfg_.nominal.lower;
            above += r > cfg_.nominal.upper;
        }
        OCTET_REQUIRE(finite > 0, fn, "ratio_high",
                      detail::message("has no finite ratio among ", ratio_high.size(),
                                      " entries; a reference needs at least one"));
        const bool early = targets_.step >= 0 && step > targets_.step && step - targets_.step < cfg_.refresh_every;
        drift_refreshes_ += early && cfg_.drift_tolerance > 0 && drifted();
        targets_ = calibration_targets{static_cast<double>(below) / static_cast<double>(finite),
                                       static_cast<double>(above) / static_cast<double>(finite), finite, step};
        at_reference_ = calibration_step{};  // filled by the next update
        cost_.references += 1;
        cost_.reference_forward_seconds += forward_seconds;
        cost_.reference_seconds += seconds_since(t0);
        return targets_;
    }

    /// Quantile-matches this step's low-precision ratios to the targets, smooths, and returns the
    /// bounds to use for them. Requires a reference (set_reference) first.
    clip_range update(std::int64_t step, span<const float> ratio_low) {
        constexpr const char* fn = "octet::calibrated_clipping::update";
        OCTET_REQUIRE(targets_.step >= 0, fn, "step",
                      "has no reference yet; call set_reference first (reference_due(step) says when)");
        const auto t0 = std::chrono::steady_clock::now();
        scratch_.clear();
        scratch_.reserve(ratio_low.size());
        std::uint64_t below = 0, above = 0;
        for (float r : ratio_low) {
            if (!is_finite_float(r)) continue;
            scratch_.push_back(r);
            below += r < cfg_.nominal.lower;
            above += r > cfg_.nominal.upper;
        }
        const std::size_t m = scratch_.size();
        if (m == 0) {
            cost_.skipped_updates += 1;
            cost_.update_seconds += seconds_since(t0);
            return bounds();
        }
        const std::size_t k_lo =
            std::min(m, static_cast<std::size_t>(std::llround(targets_.below * static_cast<double>(m))));
        const std::size_t k_hi =
            std::min(m, static_cast<std::size_t>(std::llround(targets_.above * static_cast<double>(m))));
        constexpr float inf = std::numeric_limits<float>::infinity();
        // lower: every bound in (x_(k_lo), x_(k_lo + 1)] leaves exactly k_lo ratios below; take the
        // one nearest the nominal bound.
        const auto [below_k, above_k] = neighbours(k_lo);  // x_(k_lo), x_(k_lo + 1)
        float lo = nearest_in(cfg_.nominal.lower, std::nextafter(below_k, inf), above_k);
        // upper: every bound in [x_(m - k_hi), x_(m - k_hi + 1)) leaves exactly k_hi ratios above.
        const auto [u_lo, u_hi] = neighbours(m - k_hi);
        float hi = nearest_in(cfg_.nominal.upper, u_lo, std::nextafter(u_hi, -inf));
        if (lo > hi) lo = hi = static_cast<float>(0.5 * (static_cast<double>(lo) + static_cast<double>(hi)));
        if (cost_.updates == 0) {
            bounds_lo_ = lo;
            bounds_hi_ = hi;
        } else {
            bounds_lo_ = cfg_.smoothing * bounds_lo_ + (1.0 - cfg_.smoothing) * lo;
            bounds_hi_ = cfg_.smoothing * bounds_hi_ + (1.0 - cfg_.smoothing) * hi;
        }
        cost_.updates += 1;
        last_ = calibration_step{step,
                                 clip_range{lo, hi},
                                 bounds(),
                                 static_cast<double>(below) / static_cast<double>(m),
                                 static_cast<double>(above) / static_cast<double>(m),
                                 m};
        if (at_reference_.step < 0) at_reference_ = last_;  // the low-precision fractions next to the reference
        cost_.update_seconds += seconds_since(t0);
        return bounds();
    }

    /// The current smoothed bounds (the nominal bounds before the first update).
    clip_range bounds() const {
        const float lo = static_cast<float>(bounds_lo_), hi = static_cast<float>(bounds_hi_);
        return clip_range{lo, hi < lo ? lo : hi};
    }
    const calibration_targets& targets() const { return targets_; }
    const calibration_cost& cost() const { return cost_; }

    /// The state a checkpoint keeps; restore() puts it back (on a calibrator of the same config).
    calibration_state state() const {
        return calibration_state{bounds_lo_, bounds_hi_, targets_, cost_, last_, at_reference_, drift_refreshes_};
    }
    void restore(const calibration_state& s) {
        OCTET_REQUIRE(std::isfinite(s.lower) && std::isfinite(s.upper), "octet::calibrated_clipping::restore", "s",
                      detail::message("holds bounds [", s.lower, ", ", s.upper, "]; pass a state from state()"));
        bounds_lo_ = s.lower, bounds_hi_ = s.upper;
        targets_ = s.targets, cost_ = s.cost, last_ = s.last, at_reference_ = s.at_reference;
        drift_refreshes_ = s.drift_refreshes;
    }
    const calibration_step& last_step() const { return last_; }

private:
    /// (x_(k), x_(k + 1)) of the m finite ratios in scratch_ (1-based order statistics, x_(0) =
    /// -inf, x_(m + 1) = +inf): one nth_element and a scan of the k smaller values. Reorders scratch_.
    std::pair<float, float> neighbours(std::size_t k) {
        constexpr float inf = std::numeric_limits<float>::infinity();
        const std::size_t m = scratch_.size();
        if (k == 0) return {-inf, *std::min_element(scratch_.begin(), scratch_.end())};
        if (k >= m) return {*std::max_element(scratch_.begin(), scratch_.end()), inf};
        std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(k), scratch_.end());
        return {*std::max_element(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(k)), scratch_[k]};
    }
    bool drifted() const {
        if (at_reference_.step < 0 || last_.step <= at_reference_.step) return false;
        auto moved = [&](double now, double then) {
            const double se = binomial_standard_error(then, static_cast<double>(at_reference_.tokens)) +
                              binomial_standard_error(now, static_cast<double>(last_.tokens));
            return std::fabs(now - then) > cfg_.drift_tolerance * then + 3.0 * se;
        };
        return moved(last_.below_nominal, at_reference_.below_nominal) ||
               moved(last_.above_nominal, at_reference_.above_nominal);
    }

    /// The point of [lo, hi] nearest x; hi when the interval is empty (ties in the data).
    static float nearest_in(float x, float lo, float hi) {
        if (lo > hi) return hi;
        return x < lo ? lo : (x > hi ? hi : x);
    }

    static double seconds_since(std::chrono::steady_clock::time_point t0) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }

    calibration_config cfg_;
    double bounds_lo_, bounds_hi_;
    calibration_targets targets_{};
    calibration_cost cost_{};
    calibration_step last_{};
    calibration_step at_reference_{};  ///< the first update at or after the reference step
    std::uint64_t drift_refreshes_ = 0;
    std::vector<float> scratch_;
};

}  // namespace octet
