// octet/monitor/signals.hpp: the values behind the named checks (checks.hpp), computed from plain
// host arrays. Layers that have the number already (a fused kernel's row-sum telemetry, a
// quantizer's statistics) pass it to check_registry::record directly; these helpers are for
// everything else, and they define what each check's value means.
//
//   softmax_row_sum_residual(P, rows, cols)   max_r |sum_j P[r][j] - 1|           (double sums)
//   relative_mismatch(stored, recomputed)      ||stored - recomputed||_2 / ||recomputed||_2
//   saturation_rate<Fmt>(x)                    #(|x| > Fmt::max_finite or x = +-Inf) / #(non-NaN x)
//   underflow_rate<Fmt, Round>(x)              #(x != 0 finite, encode<Fmt, Round>(x) decodes to 0) / #(x != 0 finite)
//   amax_drift(amax_now, history)              amax_now / max(history)
//   count_non_finite(x)                        #(NaN or +-Inf)
//   relative_rms_error(original, decoded)      sqrt(sum (o - d)^2 / sum o^2)
//
// Edge cases, all documented outcomes rather than errors: a NaN anywhere in the data of the
// residual, mismatch and error helpers gives NaN (which trips any check); a zero denominator
// gives 0 when the numerator is 0 and +Inf otherwise; empty inputs give 0. saturation_rate counts
// magnitudes beyond max finite even where nearest rounding would still return max finite (E4M3:
// (448, 464]), because such values already sit at the edge of the format. Lengths that disagree
// throw octet::error.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>

#include "octet/core/check.hpp"
#include "octet/core/span.hpp"
#include "octet/format/encode.hpp"
#include "octet/format/rounding.hpp"

namespace octet {

namespace detail {
inline double safe_ratio(double num, double den) {
    if (std::isnan(num) || std::isnan(den)) return std::numeric_limits<double>::quiet_NaN();
    if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
    return num / den;
}
}  // namespace detail

/// Largest |row sum - 1| over the rows of a row-major rows x cols probability matrix.
inline double softmax_row_sum_residual(span<const float> probs, std::size_t rows, std::size_t cols) {
    OCTET_REQUIRE(
        probs.size() == rows * cols, "octet::softmax_row_sum_residual", "probs",
        detail::message("has ", probs.size(), " elements for ", rows, " x ", cols, "; pass rows * cols values"));
    double worst = 0;
    for (std::size_t r = 0; r < rows; ++r) {
        double s = 0;
        for (std::size_t c = 0; c < cols; ++c) s += probs[r * cols + c];
        const double res = std::fabs(s - 1.0);
        if (std::isnan(res)) return res;
        worst = res > worst ? res : worst;
    }
    return worst;
}

/// ||stored - recomputed||_2 / ||recomputed||_2, e.g. the attention output O stored by the
/// forward pass against P V recomputed in the backward pass.
inline double relative_mismatch(span<const float> stored, span<const float> recomputed) {
    OCTET_REQUIRE(stored.size() == recomputed.size(), "octet::relative_mismatch", "stored",
                  detail::message("has ", stored.size(), " elements but 'recomputed' has ", recomputed.size()));
    double num = 0, den = 0;
    for (std::size_t i = 0; i < stored.size(); ++i) {
        const double d = static_cast<double>(stored[i]) - static_cast<double>(recomputed[i]);
        num += d * d;
        den += static_cast<double>(recomputed[i]) * recomputed[i];
    }
    return std::sqrt(detail::safe_ratio(num, den));
}

/// Fraction of (non-NaN) inputs whose magnitude lies beyond Fmt's largest finite value.
template <class Fmt>
double saturation_rate(span<const float> x) {
    std::size_t counted = 0, saturated = 0;
    for (float v : x) {
        if (std::isnan(v)) continue;
        ++counted;
        saturated += std::fabs(v) > static_cast<float>(Fmt::max_finite);
    }
    return counted ? static_cast<double>(saturated) / static_cast<double>(counted) : 0.0;
}

/// Fraction of non-zero finite inputs that encode<Fmt, Round> turns into a zero.
template <class Fmt, class Round = round::nearest_even>
double underflow_rate(span<const float> x) {
    std::size_t nonzero = 0, lost = 0;
    for (float v : x) {
        if (!std::isfinite(v) || v == 0.0f) continue;
        ++nonzero;
        lost += decode<Fmt>(encode<Fmt, Round>(v)) == 0.0f;
    }
    return nonzero ? static_cast<double>(lost) / static_cast<double>(nonzero) : 0.0;
}

/// amax now against the largest amax of the delayed-scaling history the current scale came
/// from: > 1 means values exceed what the scale was sized for. History must not be empty.
inline double amax_drift(double amax_now, span<const float> history) {
    OCTET_REQUIRE(!history.empty(), "octet::amax_drift", "history",
                  "is empty; pass the amax history the current scale was computed from");
    double m = 0;
    for (float h : history) {
        if (std::isnan(h)) return std::numeric_limits<double>::quiet_NaN();
        m = std::fabs(h) > m ? std::fabs(h) : m;
    }
    return detail::safe_ratio(std::fabs(amax_now), m);
}

/// Number of NaN and infinite values.
inline double count_non_finite(span<const float> x) {
    std::size_t n = 0;
    for (float v : x) n += !std::isfinite(v);
    return static_cast<double>(n);
}

/// Relative RMS error sqrt(sum (o - d)^2 / sum o^2), e.g. an optimizer state against its
/// compressed-and-decoded copy.
inline double relative_rms_error(span<const float> original, span<const float> decoded) {
    OCTET_REQUIRE(original.size() == decoded.size(), "octet::relative_rms_error", "decoded",
                  detail::message("has ", decoded.size(), " elements but 'original' has ", original.size()));
    double num = 0, den = 0;
    for (std::size_t i = 0; i < original.size(); ++i) {
        const double d = static_cast<double>(original[i]) - static_cast<double>(decoded[i]);
        num += d * d;
        den += static_cast<double>(original[i]) * original[i];
    }
    return std::sqrt(detail::safe_ratio(num, den));
}

}  // namespace octet
