// octet/rl/clip.hpp: the per-token rules of PPO/GRPO clipping, one OCTET_HD definition each,
// shared by the host path (rl/surrogate.hpp, rl/crossings.hpp) and the kernels (rl/*.cuh).
//
//   octet::clip_range r = octet::clip_range::asymmetric(0.2f, 0.28f);   // [0.8, 1.28], clip-higher
//   float ratio = octet::importance_ratio(logp_new, logp_old);          // exp(logp_new - logp_old)
//   octet::token_surrogate t = octet::surrogate_token(ratio, advantage, r);
//   // t.objective = min(r A, clamp(r, lower, upper) A), t.gradient = dJ/dlogp_new
//
// Numerics contract (tested against the float64 reference in octet/reference/rl.hpp):
//   * Ratio: d = (double)logp_new - (double)logp_old, limited to [-log_ratio_limit, +log_ratio_limit]
//     (default 20, as common RL trainers do; pass INFINITY to disable), r = (float)exp(d). The
//     difference and the exponential are taken in double and rounded once, so r is the float64
//     ratio correctly rounded to float up to the last bit of the double exp (host: glibc, device:
//     CUDA; both < 1 double ulp). Host and device ratios therefore agree bit for bit except in
//     about one token in 2^28 (a double result within one double ulp of a float rounding midpoint),
//     where they differ by one float ulp; the gpu test counts these.
//   * Non-finite: a NaN or infinite log-probability gives ratio NaN and marks the token
//     non-finite; so does a NaN or infinite advantage in the surrogate, and a ratio that
//     overflows float (possible only with the limit disabled: d > 88.7). Non-finite tokens
//     contribute zero objective and zero gradient and are counted (never silently mixed in).
//     The host APIs can throw octet::error instead (token_nonfinite_policy::raise).
//   * Bounds are floats (`lower`, `upper`) compared against the float ratio: a token is below
//     when r < lower, above when r > upper, inside otherwise; r == bound is inside.
//   * Objective: J = A * min(r, upper) for A > 0, A * max(r, lower) for A < 0, +-0 for A == +-0
//     (identical to min(r A, clamp(r, lower, upper) A) and continuous in r).
//   * Gradient dJ/dlogp_new = r * A when the token is not clipped, 0 when it is (A > 0 and above,
//     or A < 0 and below), and 0 when the log-ratio hit the limit (the limit is a clamp).
//   * Which tokens a bound clips depends on the advantage's sign: the lower bound clips only
//     negative-advantage tokens, the upper bound only positive ones. A negative-advantage token
//     that rounding pushes below `lower` loses its penalty gradient entirely.
#pragma once

#include <cmath>
#include <cstdint>

#include "octet/config.hpp"
#include "octet/core/bits.hpp"

namespace octet {

/// The clip region [lower, upper] of the importance ratio. Asymmetric ranges (clip-higher, as in
/// DAPO) raise `upper` to leave positive-advantage tokens more room.
struct clip_range {
    float lower = 0.8f;
    float upper = 1.2f;

    /// [1 - eps, 1 + eps], computed in float.
    static constexpr clip_range symmetric(float eps) { return clip_range{1.0f - eps, 1.0f + eps}; }
    /// [1 - eps_low, 1 + eps_high], computed in float (clip-higher: eps_high > eps_low).
    static constexpr clip_range asymmetric(float eps_low, float eps_high) {
        return clip_range{1.0f - eps_low, 1.0f + eps_high};
    }
};

/// Default limit on |logp_new - logp_old| before exponentiation (exp(20) = 4.85e8).
inline constexpr float default_log_ratio_limit = 20.0f;

enum class clip_region : int { below = 0, inside = 1, above = 2 };
enum class advantage_sign : int { negative = 0, zero = 1, positive = 2 };

inline const char* clip_region_name(clip_region r) {
    return r == clip_region::below ? "below" : r == clip_region::inside ? "inside" : "above";
}
inline const char* advantage_sign_name(advantage_sign s) {
    return s == advantage_sign::negative ? "negative" : s == advantage_sign::zero ? "zero" : "positive";
}

// is_finite_float (a bit test, unaffected by fast-math flags) lives in core/bits.hpp.

/// The ratio of one token and whether its log-ratio hit the limit.
struct token_ratio {
    float ratio;   ///< NaN when a log-probability is non-finite
    bool finite;   ///< both log-probabilities finite
    bool limited;  ///< |logp_new - logp_old| exceeded the limit (gradient is zero)
};

OCTET_HD double exp_double(double d) {
#if OCTET_DEVICE_PASS
    return ::exp(d);
#else
    return std::exp(d);
#endif
}

/// r = exp(logp_new - logp_old), difference and exponential in double, rounded once to float.
OCTET_HD token_ratio importance_ratio_of(float logp_new, float logp_old,
                                         float log_ratio_limit = default_log_ratio_limit) {
    const bool finite = is_finite_float(logp_new) && is_finite_float(logp_old);
    double d = static_cast<double>(logp_new) - static_cast<double>(logp_old);
    const double limit = static_cast<double>(log_ratio_limit);
    const bool limited = finite & ((d > limit) | (d < -limit));
    d = d > limit ? limit : (d < -limit ? -limit : d);
    const float r = finite ? static_cast<float>(exp_double(d)) : canonical_nan();
    return token_ratio{r, finite, limited};
}

/// r = exp(logp_new - logp_old) (see importance_ratio_of); NaN when a log-probability is non-finite.
OCTET_HD float importance_ratio(float logp_new, float logp_old, float log_ratio_limit = default_log_ratio_limit) {
    return importance_ratio_of(logp_new, logp_old, log_ratio_limit).ratio;
}

/// Where a (finite) ratio lies relative to the clip range (lower <= upper): below when
/// r < lower, above when r > upper, inside otherwise; r == bound is inside. Branch-free.
OCTET_HD clip_region region_of(float ratio, clip_range range) {
    return static_cast<clip_region>(static_cast<int>(ratio >= range.lower) + static_cast<int>(ratio > range.upper));
}

/// The sign of a (finite) advantage; -0 and +0 are zero. Branch-free.
OCTET_HD advantage_sign sign_of(float advantage) {
    return static_cast<advantage_sign>(static_cast<int>(advantage >= 0.0f) + static_cast<int>(advantage > 0.0f));
}

/// True when the clipped surrogate takes its constant branch for this token (zero gradient):
/// A > 0 and r > upper, or A < 0 and r < lower.
OCTET_HD bool is_clipped(float ratio, float advantage, clip_range range) {
    return ((advantage > 0.0f) & (ratio > range.upper)) | ((advantage < 0.0f) & (ratio < range.lower));
}

/// One token's clipped surrogate objective and its derivative with respect to logp_new.
struct token_surrogate {
    float objective;  ///< J = min(r A, clamp(r, lower, upper) A); 0 for a non-finite token
    float gradient;   ///< dJ/dlogp_new = r A when not clipped and not limited, else 0
    bool clipped;     ///< the constant branch was taken
    bool finite;      ///< ratio and advantage finite
};

/// The surrogate of one token from its ratio (see importance_ratio_of) and advantage.
/// `limited` is token_ratio::limited (a limited log-ratio passes no gradient).
OCTET_HD token_surrogate surrogate_token(float ratio, float advantage, clip_range range, bool limited = false) {
    // Selects, not branches: the advantage's sign is a coin flip per token.
    // && on pure inline calls still compiles to selects (and keeps clang's -Wbitwise-instead-of-logical quiet).
    const bool finite = is_finite_float(ratio) && is_finite_float(advantage);
    const bool clipped = finite && is_clipped(ratio, advantage, range);
    const float capped = ratio < range.upper ? ratio : range.upper;             // min(r, upper)
    const float floored = ratio > range.lower ? ratio : range.lower;            // max(r, lower)
    const float objective = advantage * (advantage > 0.0f ? capped : floored);  // A == 0: +-0
    const float gradient = (clipped | limited) ? 0.0f : ratio * advantage;
    return token_surrogate{finite ? objective : 0.0f, finite ? gradient : 0.0f, clipped, finite};
}

}  // namespace octet
