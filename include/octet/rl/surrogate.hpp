// octet/rl/surrogate.hpp: importance ratios, the PPO/GRPO clipped surrogate and its per-token
// gradient, and GRPO group advantages: the entries and the host backend. The stream backend and
// the stream's clipped_surrogate (statistics in device memory): octet/rl/surrogate.cuh.
//
//   octet::importance_ratios(octet::on_host(), logp_new, logp_old, ratios);
//   octet::surrogate_config cfg;                              // [0.8, 1.2], token mean
//   cfg.range = octet::clip_range::asymmetric(0.2f, 0.28f);   // clip-higher
//   std::vector<float> grad(n);
//   octet::surrogate_stats s = octet::clipped_surrogate(octet::on_host(), logp_new, logp_old, adv, cfg,
//                                                       {/*ratio*/ {}, /*objective*/ {}, grad});
//   // s.loss() = -(aggregated J); grad[t] = d loss / d logp_new[t]; s.clip_fraction(), ...
//
//   octet::group_advantages(octet::on_host(), rewards, group_size, advantages);   // GRPO
//
// Host scratch: clipped_surrogate takes clipped_surrogate_scratch_bytes(ex, n) (from the executor's
// allocator when one is lent, octet::with_allocator); importance_ratios and group_advantages none.
//
// Loss aggregation (the weight w_t of each token's objective; loss = -sum_t w_t J_t):
//   * token_mean:    w_t = 1 / n over all n tokens (PPO; DAPO's token-level loss).
//   * sequence_mean: w_t = 1 / (S * L_s) for token t in sequence s of length L_s, S sequences given
//                    by `sequence_offsets` (S + 1 entries, 0 = o_0 <= o_1 <= ... <= o_S = n): GRPO.
//   * sum:           w_t = 1 (grad is then -dJ_t/dlogp_new_t, the plain per-token gradient).
// Non-finite tokens stay in the denominators (like a masked token under a fixed normalizer) and
// contribute zero objective and zero gradient; they are counted in surrogate_stats::non_finite.
// grad[t] = -((float)w_t * g_t) with g_t = token_surrogate::gradient; the aggregated objective is
// summed in double with the exact weights, in fixed blocks, so the result does not depend on the
// thread count. The per-token rules and their numerics contract are in octet/rl/clip.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <vector>

#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/span.hpp"
#include "octet/rl/clip.hpp"

namespace octet {

enum class loss_aggregation : int { token_mean = 0, sequence_mean = 1, sum = 2 };

/// What the host APIs do with a non-finite log-probability or advantage: count it (default; the
/// token is masked and counted) or throw octet::error naming the argument and the first index.
/// The stream APIs always count (device code never throws).
enum class token_nonfinite_policy : int { count = 0, raise = 1 };

struct surrogate_config {
    clip_range range{};
    float log_ratio_limit = default_log_ratio_limit;
    loss_aggregation aggregation = loss_aggregation::token_mean;
    token_nonfinite_policy on_nonfinite = token_nonfinite_policy::count;
};

/// Optional per-token outputs; an empty span is not written, a non-empty one must have n entries.
struct surrogate_outputs {
    span<float> ratio;      ///< importance ratios (NaN for non-finite tokens)
    span<float> objective;  ///< J_t, unweighted (0 for non-finite tokens)
    span<float> grad;       ///< d loss / d logp_new_t = -(w_t g_t)
};

/// Statistics of one surrogate evaluation. Plain data (also filled by the stream overload).
struct surrogate_stats {
    std::uint64_t tokens = 0;        ///< all tokens
    std::uint64_t non_finite = 0;    ///< tokens with a non-finite log-probability or advantage
    std::uint64_t negative = 0;      ///< finite tokens with A < 0
    std::uint64_t positive = 0;      ///< finite tokens with A > 0
    std::uint64_t below = 0;         ///< finite tokens with r < lower (any advantage)
    std::uint64_t above = 0;         ///< finite tokens with r > upper (any advantage)
    std::uint64_t clipped_low = 0;   ///< A < 0 and r < lower: penalty gradient cut
    std::uint64_t clipped_high = 0;  ///< A > 0 and r > upper: reward gradient cut
    std::uint64_t limited = 0;       ///< |log-ratio| hit the limit
    double objective = 0;            ///< sum_t w_t J_t (double, exact weights)
    double ratio_sum = 0;            ///< sum of finite ratios

    std::uint64_t finite_tokens() const { return tokens - non_finite; }
    double loss() const { return -objective; }
    double mean_ratio() const { return finite_tokens() ? ratio_sum / static_cast<double>(finite_tokens()) : 0.0; }
    /// Fraction of finite tokens whose gradient the clip cut (either bound).
    double clip_fraction() const {
        return finite_tokens() ? static_cast<double>(clipped_low + clipped_high) / static_cast<double>(finite_tokens())
                               : 0.0;
    }
    /// Fraction of negative-advantage tokens below the lower bound (their penalty is cut).
    double lower_clip_fraction() const {
        return negative ? static_cast<double>(clipped_low) / static_cast<double>(negative) : 0.0;
    }
    /// Fraction of positive-advantage tokens above the upper bound.
    double upper_clip_fraction() const {
        return positive ? static_cast<double>(clipped_high) / static_cast<double>(positive) : 0.0;
    }
};

static_assert(std::is_trivially_copyable_v<surrogate_stats> && std::is_trivially_destructible_v<surrogate_stats>,
              "octet: clipped_surrogate keeps its partial statistics in raw scratch");

namespace detail {

/// Exact weight of a token (double): the aggregated objective uses it; the gradient uses it rounded
/// to float. `sequence_length`/`sequences` are ignored unless aggregation is sequence_mean.
OCTET_HD double token_weight(loss_aggregation a, std::uint64_t tokens, std::int64_t sequence_length,
                             std::int64_t sequences) {
    if (a == loss_aggregation::token_mean) return 1.0 / static_cast<double>(tokens);
    if (a == loss_aggregation::sequence_mean)
        return 1.0 / (static_cast<double>(sequences) * static_cast<double>(sequence_length));
    return 1.0;
}

/// Index s of the sequence holding token i: offsets[s] <= i < offsets[s + 1] (offsets validated).
OCTET_HD std::int64_t sequence_of(const std::int64_t* offsets, std::int64_t sequences, std::int64_t i) {
    std::int64_t lo = 0, hi = sequences;  // invariant: offsets[lo] <= i < offsets[hi]
    while (hi - lo > 1) {
        const std::int64_t mid = lo + (hi - lo) / 2;
        if (offsets[mid] <= i)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/// Adds one token to the statistics (same rule on host and device). Branch-free: a non-finite
/// token adds only to non_finite (its objective is 0, its ratio is not summed).
OCTET_HD void tally(surrogate_stats& s, const token_ratio& tr, float advantage, const token_surrogate& t,
                    clip_range range, double weight) {
    const std::uint64_t f = t.finite ? 1u : 0u;
    const clip_region reg = region_of(tr.ratio, range);
    s.non_finite += 1u - f;
    s.negative += f & static_cast<std::uint64_t>(advantage < 0.0f);
    s.positive += f & static_cast<std::uint64_t>(advantage > 0.0f);
    s.below += f & static_cast<std::uint64_t>(reg == clip_region::below);
    s.above += f & static_cast<std::uint64_t>(reg == clip_region::above);
    s.clipped_low += static_cast<std::uint64_t>(t.clipped & (advantage < 0.0f));
    s.clipped_high += static_cast<std::uint64_t>(t.clipped & (advantage > 0.0f));
    s.limited += f & static_cast<std::uint64_t>(tr.limited);
    s.objective += weight * static_cast<double>(t.objective);
    s.ratio_sum += t.finite ? static_cast<double>(tr.ratio) : 0.0;
}

OCTET_HD void merge(surrogate_stats& into, const surrogate_stats& s) {
    into.non_finite += s.non_finite;
    into.negative += s.negative;
    into.positive += s.positive;
    into.below += s.below;
    into.above += s.above;
    into.clipped_low += s.clipped_low;
    into.clipped_high += s.clipped_high;
    into.limited += s.limited;
    into.objective += s.objective;
    into.ratio_sum += s.ratio_sum;
}

inline void require_same_length(std::size_t n, std::size_t m, const char* function, const char* argument,
                                const char* other) {
    OCTET_REQUIRE(m == n, function, argument,
                  message("has ", m, " elements but '", other, "' has ", n, "; pass one entry per token"));
}

inline void require_output(span<float> out, std::size_t n, const char* function, const char* argument) {
    OCTET_REQUIRE(
        out.empty() || out.size() == n, function, argument,
        message("has ", out.size(), " elements for ", n, " tokens; pass one per token, or an empty span to skip it"));
    OCTET_REQUIRE(out.empty() || out.data() != nullptr, function, argument, "is null with a non-zero size");
}

/// Throws naming the first non-finite entry of `x` (token_nonfinite_policy::raise).
inline void require_all_finite(span<const float> x, const char* function, const char* argument) {
    for (std::size_t i = 0; i < x.size(); ++i)
        OCTET_REQUIRE(
            is_finite_float(x[i]), function, argument,
            message("has the non-finite value ", x[i], " at index ", i,
                    "; fix the producer, or use token_nonfinite_policy::count to mask and count such tokens"));
}

/// GRPO sequence offsets are there: S + 1 >= 2 entries (what every executor can check; a stream's
/// offsets are device memory, whose values it trusts).
inline void require_offsets_given(span<const std::int64_t> offsets, const char* function) {
    OCTET_REQUIRE(offsets.empty() || offsets.data() != nullptr, function, "sequence_offsets",
                  "is null with a non-zero size");
    OCTET_REQUIRE(offsets.size() >= 2, function, "sequence_offsets",
                  message("has ", offsets.size(),
                          " entries; sequence_mean needs S + 1 offsets (0, ..., n) for S >= 1 sequences"));
}

/// Validates GRPO sequence offsets in host memory: S + 1 entries, 0 first, n last, non-decreasing.
inline void require_offsets(span<const std::int64_t> offsets, std::size_t n, const char* function) {
    require_offsets_given(offsets, function);
    OCTET_REQUIRE(offsets[0] == 0 && offsets[offsets.size() - 1] == static_cast<std::int64_t>(n), function,
                  "sequence_offsets",
                  message("must start at 0 and end at the token count ", n, " (got ", offsets[0], " ... ",
                          offsets[offsets.size() - 1], ")"));
    for (std::size_t s = 1; s < offsets.size(); ++s)
        OCTET_REQUIRE(offsets[s] >= offsets[s - 1], function, "sequence_offsets",
                      message("decreases at entry ", s, " (", offsets[s - 1], " then ", offsets[s],
                              "); offsets must be non-decreasing"));
}

inline void require_log_ratio_limit(float limit, const char* function, const char* argument) {
    OCTET_REQUIRE(limit > 0.0f, function, argument,
                  message("is ", limit, "; pass a positive limit (or INFINITY for none)"));
}

inline void require_range(clip_range r, const char* function, const char* argument) {
    OCTET_REQUIRE(r.lower <= r.upper && is_finite_float(r.lower) && is_finite_float(r.upper), function, argument,
                  message("is [", r.lower, ", ", r.upper, "]; pass finite bounds with lower <= upper"));
}

/// Every executor-independent check of octet::clipped_surrogate: one entry per token in each input
/// and each non-empty output, cfg's range and log-ratio limit, and sequence_offsets given exactly
/// when cfg.aggregation is sequence_mean (their values are checked where they can be read: on the
/// host). Returns whether the loss is aggregated by sequence.
inline bool check_surrogate_args(span<const float> logp_new, span<const float> logp_old, span<const float> advantages,
                                 const surrogate_config& cfg, const surrogate_outputs& out,
                                 span<const std::int64_t> sequence_offsets, const char* fn) {
    const std::size_t n = logp_new.size();
    require_same_length(n, logp_old.size(), fn, "logp_old", "logp_new");
    require_same_length(n, advantages.size(), fn, "advantages", "logp_new");
    require_output(out.ratio, n, fn, "out.ratio");
    require_output(out.objective, n, fn, "out.objective");
    require_output(out.grad, n, fn, "out.grad");
    require_range(cfg.range, fn, "cfg.range");
    require_log_ratio_limit(cfg.log_ratio_limit, fn, "cfg.log_ratio_limit");
    const bool by_sequence = cfg.aggregation == loss_aggregation::sequence_mean;
    if (by_sequence)
        require_offsets_given(sequence_offsets, fn);
    else
        OCTET_REQUIRE(sequence_offsets.empty(), fn, "sequence_offsets",
                      "is only used by loss_aggregation::sequence_mean; pass an empty span or set cfg.aggregation");
    return by_sequence;
}

}  // namespace detail

/// Throws octet::error unless `offsets` (host memory) are valid GRPO sequence offsets for n tokens:
/// S + 1 >= 2 entries, 0 first, n last, non-decreasing. The host overloads call it; the stream
/// overloads cannot read device memory without a synchronization, so they trust their offsets
/// (validate once with this function where offsets come from untrusted input).
inline void validate_sequence_offsets(span<const std::int64_t> offsets, std::size_t n) {
    detail::require_offsets(offsets, n, "octet::validate_sequence_offsets");
}

namespace detail {

/// Fixed reduction blocks: partial sums per block, then summed in block order (thread-count independent).
inline constexpr std::size_t kRlReduceBlock = 4096;

/// The host scratch of clipped_surrogate over n tokens: one surrogate_stats per reduction block
/// (summed in block order afterwards, so that the result does not depend on the split).
inline surrogate_stats* carve_surrogate(scratch_carver& c, std::size_t n) {
    return c.take<surrogate_stats>((n + kRlReduceBlock - 1) / kRlReduceBlock);
}

/// The executor half of octet::importance_ratios, specialized per executor: ratios(ex, logp_new,
/// logp_old, ratios, log_ratio_limit) with the arguments the entry checked. The host's is here, the
/// stream's in surrogate.cuh.
template <class Executor>
struct ratio_backend;

template <>
struct ratio_backend<host_executor> {
    static void ratios(host_executor ex, span<const float> logp_new, span<const float> logp_old, span<float> ratios,
                       float log_ratio_limit) {
        parallel_for(ex, logp_new.size(), std::size_t{1} << 15, [&](std::size_t b, std::size_t e) {
            for (std::size_t i = b; i < e; ++i) ratios[i] = importance_ratio(logp_new[i], logp_old[i], log_ratio_limit);
        });
    }
};

}  // namespace detail

/// ratios[t] = importance_ratio(logp_new[t], logp_old[t], log_ratio_limit) (NaN for non-finite), on
/// the executor: the host, or a CUDA stream (octet/rl/surrogate.cuh: device memory; enqueues one
/// kernel, never synchronizes). The arguments every executor shares are checked here, once.
template <class Executor>
void importance_ratios(const Executor& ex, span<const float> logp_new, span<const float> logp_old, span<float> ratios,
                       float log_ratio_limit = default_log_ratio_limit) {
    constexpr const char* fn = "octet::importance_ratios";
    detail::require_same_length(logp_new.size(), logp_old.size(), fn, "logp_old", "logp_new");
    detail::require_same_length(logp_new.size(), ratios.size(), fn, "ratios", "logp_new");
    detail::require_log_ratio_limit(log_ratio_limit, fn, "log_ratio_limit");
    detail::ratio_backend<Executor>::ratios(ex, logp_new, logp_old, ratios, log_ratio_limit);
}

/// Bytes of host scratch that clipped_surrogate(ex, ...) takes for n tokens (one partial statistic
/// per 4096 tokens; from ex.allocator when one is lent, see octet::with_allocator). The other host
/// operations of this header (importance_ratios, group_advantages) take none.
inline std::size_t clipped_surrogate_scratch_bytes(const host_executor& ex, std::size_t n) {
    (void)ex;
    detail::scratch_carver c;
    detail::carve_surrogate(c, n);
    return c.bytes();
}

/// The clipped surrogate over n tokens on the host: statistics (with the aggregated objective) and
/// the optional per-token outputs. See the header comment for the aggregation and the contract.
/// The stream form (surrogate.cuh) writes the statistics to device memory instead of returning
/// them; both run the same checks (check_surrogate_args). Host scratch: clipped_surrogate_scratch_bytes.
inline surrogate_stats clipped_surrogate(host_executor ex, span<const float> logp_new, span<const float> logp_old,
                                         span<const float> advantages, const surrogate_config& cfg,
                                         surrogate_outputs out = {}, span<const std::int64_t> sequence_offsets = {}) {
    constexpr const char* fn = "octet::clipped_surrogate";
    const std::size_t n = logp_new.size();
    const bool by_sequence =
        detail::check_surrogate_args(logp_new, logp_old, advantages, cfg, out, sequence_offsets, fn);
    if (by_sequence) detail::require_offsets(sequence_offsets, n, fn);  // host memory: the values too
    if (cfg.on_nonfinite == token_nonfinite_policy::raise) {
        detail::require_all_finite(logp_new, fn, "logp_new");
        detail::require_all_finite(logp_old, fn, "logp_old");
        detail::require_all_finite(advantages, fn, "advantages");
    }

    surrogate_stats total;
    total.tokens = n;
    if (n == 0) return total;
    const std::size_t blocks = (n + detail::kRlReduceBlock - 1) / detail::kRlReduceBlock;
    detail::scratch_carver size;
    detail::carve_surrogate(size, n);
    const detail::host_scratch scratch(ex, size.bytes(), fn);
    detail::scratch_carver carver = scratch.carver();
    surrogate_stats* const partial = detail::carve_surrogate(carver, n);
    const std::int64_t sequences = by_sequence ? static_cast<std::int64_t>(sequence_offsets.size()) - 1 : 0;
    parallel_for(ex, blocks, 4, [&](std::size_t bb, std::size_t be) {
        for (std::size_t blk = bb; blk < be; ++blk) {
            const std::size_t b = blk * detail::kRlReduceBlock, e = std::min(n, b + detail::kRlReduceBlock);
            surrogate_stats s;
            std::int64_t seq =
                by_sequence ? detail::sequence_of(sequence_offsets.data(), sequences, static_cast<std::int64_t>(b)) : 0;
            double w = detail::token_weight(cfg.aggregation, n, 0, sequences);  // constant unless by sequence
            float* const ratio_out = out.ratio.empty() ? nullptr : out.ratio.data();
            float* const objective_out = out.objective.empty() ? nullptr : out.objective.data();
            float* const grad_out = out.grad.empty() ? nullptr : out.grad.data();
            const clip_range range = cfg.range;  // locals: the output stores cannot alias them
            const float limit = cfg.log_ratio_limit;
            for (std::size_t i = b; i < e; ++i) {
                if (by_sequence) {
                    while (sequence_offsets[seq + 1] <= static_cast<std::int64_t>(i)) ++seq;
                    w = detail::token_weight(cfg.aggregation, n, sequence_offsets[seq + 1] - sequence_offsets[seq],
                                             sequences);
                }
                const float a = advantages[i];
                const token_ratio tr = importance_ratio_of(logp_new[i], logp_old[i], limit);
                const token_surrogate t = surrogate_token(tr.ratio, a, range, tr.limited);
                detail::tally(s, tr, a, t, range, w);
                if (ratio_out) ratio_out[i] = tr.ratio;
                if (objective_out) objective_out[i] = t.objective;
                if (grad_out) grad_out[i] = -(static_cast<float>(w) * t.gradient);
            }
            ::new (static_cast<void*>(partial + blk)) surrogate_stats(s);  // trivially destructible
        }
    });
    for (std::size_t blk = 0; blk < blocks; ++blk) detail::merge(total, partial[blk]);
    return total;
}

struct group_advantage_config {
    bool scale_by_std = true;  ///< divide by the group's standard deviation (GRPO); false: Dr. GRPO
    float eps = 1e-4f;         ///< added to the standard deviation
};

/// GRPO advantages: rewards come in consecutive groups of `group_size` completions of one prompt;
/// A_i = (R_i - mean_g) / (std_g + eps), with the unbiased (n - 1) standard deviation in double
/// (0 for a group of one; with eps == 0 a group of equal rewards gets 0, not 0/0). A group holding a non-finite reward
/// gets NaN advantages for all its members (the surrogate then counts those tokens as non-finite).
inline void group_advantages(host_executor ex, span<const float> rewards, std::size_t group_size,
                             span<float> advantages, group_advantage_config cfg = {}) {
    constexpr const char* fn = "octet::group_advantages";
    OCTET_REQUIRE(group_size > 0, fn, "group_size", "is 0; pass the number of completions per prompt");
    OCTET_REQUIRE(rewards.size() % group_size == 0, fn, "rewards",
                  detail::message("has ", rewards.size(), " entries, not a multiple of group_size ", group_size));
    detail::require_same_length(rewards.size(), advantages.size(), fn, "advantages", "rewards");
    OCTET_REQUIRE(cfg.eps >= 0.0f, fn, "cfg.eps", "must be non-negative");
    const std::size_t groups = rewards.size() / group_size;
    parallel_for(ex, groups, 64, [&](std::size_t gb, std::size_t ge) {
        for (std::size_t g = gb; g < ge; ++g) {
            const float* r = rewards.data() + g * group_size;
            double mean = 0;
            bool finite = true;
            for (std::size_t i = 0; i < group_size; ++i) {
                finite = finite && is_finite_float(r[i]);
                mean += r[i];
            }
            mean /= static_cast<double>(group_size);
            double var = 0;
            for (std::size_t i = 0; i < group_size; ++i) var += (r[i] - mean) * (r[i] - mean);
            const double sd = group_size > 1 ? std::sqrt(var / static_cast<double>(group_size - 1)) : 0.0;
            const double denom = cfg.scale_by_std ? sd + static_cast<double>(cfg.eps) : 1.0;
            for (std::size_t i = 0; i < group_size; ++i) {
                // denom == 0 only when eps == 0 and the group's rewards are all equal: advantage 0
                const double a = denom > 0.0 ? (r[i] - mean) / denom : 0.0;
                advantages[g * group_size + i] = finite ? static_cast<float>(a) : canonical_nan();
            }
        }
    });
}

}  // namespace octet
