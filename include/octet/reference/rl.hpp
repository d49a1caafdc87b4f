// octet/reference/rl.hpp: float64 references for the RL clipping layer (tests, benchmarks, users).
//
// Written from the definitions, sharing no code with octet/rl/: plain loops, double arithmetic,
// explicit branches. Bounds are the float bounds of octet::clip_range widened to double (the
// library compares float ratios against float bounds; see octet/rl/clip.hpp).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "octet/rl/clip.hpp"

namespace octet {
namespace reference {

/// exp(logp_new - logp_old) in double with the log-ratio limited to [-limit, limit]; NaN when a
/// log-probability is not finite.
inline double importance_ratio(double logp_new, double logp_old, double limit = default_log_ratio_limit) {
    if (!std::isfinite(logp_new) || !std::isfinite(logp_old)) return std::nan("");
    double d = logp_new - logp_old;
    if (d > limit) d = limit;
    if (d < -limit) d = -limit;
    return std::exp(d);
}

struct surrogate_token_ref {
    double objective = 0;
    double gradient = 0;  ///< dJ / dlogp_new
    bool clipped = false;
    bool finite = true;
};

/// min(r A, clamp(r, lower, upper) A) and its derivative in logp_new (r A, or 0 on the clipped
/// branch or when the log-ratio is limited), written as the textbook min of two terms.
inline surrogate_token_ref surrogate_token(double r, double a, double lower, double upper, bool limited = false) {
    surrogate_token_ref t;
    if (!std::isfinite(r) || !std::isfinite(a)) {
        t.finite = false;
        return t;
    }
    const double clamped = r < lower ? lower : (r > upper ? upper : r);
    const double unclipped_term = r * a, clipped_term = clamped * a;
    // The clipped branch is taken when it is strictly smaller (ties: the unclipped branch, r inside).
    t.clipped = clipped_term < unclipped_term;
    t.objective = t.clipped ? clipped_term : unclipped_term;
    t.gradient = (t.clipped || limited) ? 0.0 : r * a;
    return t;
}

/// The aggregated objective sum_t w_t J_t in double: token mean (offsets empty, mean = true),
/// sum (offsets empty, mean = false), or GRPO sequence mean (offsets given). Non-finite tokens
/// contribute 0 and stay in the denominators.
inline double aggregated_objective(const std::vector<double>& objective, const std::vector<std::int64_t>& offsets,
                                   bool mean = true) {
    const std::size_t n = objective.size();
    if (offsets.empty()) {
        double s = 0;
        for (double j : objective) s += j;
        return mean && n ? s / static_cast<double>(n) : s;
    }
    const std::size_t sequences = offsets.size() - 1;
    double total = 0;
    for (std::size_t q = 0; q < sequences; ++q) {
        double s = 0;
        for (std::int64_t t = offsets[q]; t < offsets[q + 1]; ++t) s += objective[static_cast<std::size_t>(t)];
        const std::int64_t len = offsets[q + 1] - offsets[q];
        if (len > 0) total += s / static_cast<double>(len);
    }
    return total / static_cast<double>(sequences);
}

/// GRPO advantages in double: (R - mean) / (unbiased std + eps) per consecutive group.
inline std::vector<double> group_advantages(const std::vector<double>& rewards, std::size_t group_size, double eps,
                                            bool scale_by_std = true) {
    std::vector<double> out(rewards.size());
    for (std::size_t g = 0; g * group_size < rewards.size(); ++g) {
        double mean = 0;
        for (std::size_t i = 0; i < group_size; ++i) mean += rewards[g * group_size + i];
        mean /= static_cast<double>(group_size);
        double ss = 0;
        for (std::size_t i = 0; i < group_size; ++i) ss += std::pow(rewards[g * group_size + i] - mean, 2);
        const double sd = group_size > 1 ? std::sqrt(ss / static_cast<double>(group_size - 1)) : 0.0;
        for (std::size_t i = 0; i < group_size; ++i) {
            const double c = rewards[g * group_size + i] - mean;
            out[g * group_size + i] = scale_by_std ? (sd + eps > 0 ? c / (sd + eps) : 0.0) : c;
        }
    }
    return out;
}

/// Brute-force crossing counts for one token list: ratios given as doubles are rounded to float
/// (the contract decides regions on float ratios) and classified with explicit branches.
struct crossing_ref {
    // [sign: 0 negative, 1 zero, 2 positive]
    std::uint64_t tokens[3] = {}, below_high[3] = {}, below_low[3] = {}, above_high[3] = {}, above_low[3] = {};
    std::uint64_t region_changed[3] = {}, branch_changed[3] = {}, pushed_out_low[3] = {}, pushed_out_high[3] = {},
                  pulled_in[3] = {};
    std::uint64_t non_finite = 0;
};

inline crossing_ref brute_force_crossings(const std::vector<double>& ratio_low, const std::vector<double>& ratio_high,
                                          const std::vector<double>& advantages, double lower, double upper,
                                          double low_lower, double low_upper) {
    crossing_ref c;
    for (std::size_t i = 0; i < ratio_low.size(); ++i) {
        const double a = advantages[i];
        if (!std::isfinite(ratio_low[i]) || !std::isfinite(ratio_high[i]) || !std::isfinite(a)) {
            ++c.non_finite;
            continue;
        }
        const double rl = static_cast<double>(static_cast<float>(ratio_low[i]));
        const double rh = static_cast<double>(static_cast<float>(ratio_high[i]));
        const int s = a < 0 ? 0 : (a == 0 ? 1 : 2);
        // regions: -1 below, 0 inside, +1 above
        const int h = rh < lower ? -1 : (rh > upper ? 1 : 0);
        const int l = rl < low_lower ? -1 : (rl > low_upper ? 1 : 0);
        bool clipped_h = false, clipped_l = false;
        if (s == 0) {
            clipped_h = h == -1;
            clipped_l = l == -1;
        } else if (s == 2) {
            clipped_h = h == 1;
            clipped_l = l == 1;
        }
        ++c.tokens[s];
        if (h == -1) ++c.below_high[s];
        if (l == -1) ++c.below_low[s];
        if (h == 1) ++c.above_high[s];
        if (l == 1) ++c.above_low[s];
        if (h != l) ++c.region_changed[s];
        if (clipped_h != clipped_l) ++c.branch_changed[s];
        if (h != -1 && l == -1) ++c.pushed_out_low[s];
        if (h != 1 && l == 1) ++c.pushed_out_high[s];
        if (h != 0 && l == 0) ++c.pulled_in[s];
    }
    return c;
}

}  // namespace reference
}  // namespace octet
