// octet/rl/crossings.hpp: threshold-crossing diagnostics. Given low-precision and high-precision
// log-probabilities of the same tokens (and the shared behaviour log-probabilities), count the
// tokens whose clip region or clip branch differs between the two, split by the advantage's sign.
// The host forms return the report; the stream forms (octet/rl/crossings.cuh) write it to device
// memory; both run the same checks (check_crossing_args).
//
//   octet::crossing_report c = octet::threshold_crossings(octet::on_host(), logp_low, logp_high,
//                                                         logp_old, advantages, range);
//   c.negative_pushed_out_fraction();   // A < 0 tokens inside the region at high precision, outside at low
//   c.negative_pushed_below_fraction(); // ... pushed below the lower bound: their penalty gradient is lost
//   c[octet::advantage_sign::negative].branch_changed;
//   octet::threshold_crossings_scratch_bytes(ex, n);   // host scratch (from ex.allocator when lent)
//
// Definitions, per finite token, with h = region of the high-precision ratio under `range`,
// l = region of the low-precision ratio under `low_range` (default: the same range; pass the
// calibrated range to see what calibration changed), both decided on float ratios as in clip.hpp:
//   below_high / below_low / above_high / above_low   h or l below / above
//   region_changed    h != l
//   branch_changed    is_clipped differs (the surrogate takes a different branch: gradient r A vs 0)
//   pushed_out_low    h != below and l == below      pushed_out_high   h != above and l == above
//   pulled_in         h != inside and l == inside
// The smallest case: ratios 0.799 (low) and 0.801 (high) at lower bound 0.8 with A < 0 are one
// region change, one branch change and one negative pushed_out_low.
// Tokens with any non-finite input (either log-probability, the old one, or the advantage) are
// not classified; they are counted in crossing_report::non_finite. Counting is exact (integers),
// so host, device and any thread count give the same report.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/span.hpp"
#include "octet/rl/clip.hpp"
#include "octet/rl/surrogate.hpp"

namespace octet {

/// Counters for the tokens of one advantage sign (see the header comment for the definitions).
struct crossing_counts {
    std::uint64_t tokens = 0;
    std::uint64_t below_high = 0, below_low = 0, above_high = 0, above_low = 0;
    std::uint64_t region_changed = 0, branch_changed = 0;
    std::uint64_t pushed_out_low = 0, pushed_out_high = 0, pulled_in = 0;

    static constexpr int count = 10;
    /// Counter k in declaration order (lets kernels keep them in registers and add them in a loop).
    OCTET_HD std::uint64_t& at(int k) {
        switch (k) {
            case 0:
                return tokens;
            case 1:
                return below_high;
            case 2:
                return below_low;
            case 3:
                return above_high;
            case 4:
                return above_low;
            case 5:
                return region_changed;
            case 6:
                return branch_changed;
            case 7:
                return pushed_out_low;
            case 8:
                return pushed_out_high;
            default:
                return pulled_in;
        }
    }
    OCTET_HD std::uint64_t at(int k) const { return const_cast<crossing_counts*>(this)->at(k); }
};

struct crossing_report {
    crossing_counts by_sign[3];    ///< indexed by advantage_sign: negative, zero, positive
    std::uint64_t non_finite = 0;  ///< tokens not classified (a non-finite input)

    const crossing_counts& operator[](advantage_sign s) const { return by_sign[static_cast<int>(s)]; }
    std::uint64_t tokens() const { return by_sign[0].tokens + by_sign[1].tokens + by_sign[2].tokens; }
    std::uint64_t region_changed() const {
        return by_sign[0].region_changed + by_sign[1].region_changed + by_sign[2].region_changed;
    }
    std::uint64_t branch_changed() const {
        return by_sign[0].branch_changed + by_sign[1].branch_changed + by_sign[2].branch_changed;
    }

    /// Fraction of finite negative-advantage tokens inside the region at high precision and outside
    /// it at low precision (either side).
    double negative_pushed_out_fraction() const {
        const auto& c = by_sign[0];
        return c.tokens ? static_cast<double>(c.pushed_out_low + c.pushed_out_high) / static_cast<double>(c.tokens)
                        : 0.0;
    }
    /// Fraction of finite negative-advantage tokens that only the low-precision ratio puts below the
    /// lower bound: their penalty gradient is cut. (Equals the negative branch changes toward clipped.)
    double negative_pushed_below_fraction() const {
        const auto& c = by_sign[0];
        return c.tokens ? static_cast<double>(c.pushed_out_low) / static_cast<double>(c.tokens) : 0.0;
    }
    /// Lower-bound clip fraction of negative-advantage tokens: high precision, low precision.
    double negative_clip_fraction_high() const { return frac(by_sign[0].below_high, by_sign[0].tokens); }
    double negative_clip_fraction_low() const { return frac(by_sign[0].below_low, by_sign[0].tokens); }
    /// Upper-bound clip fraction of positive-advantage tokens: high precision, low precision.
    double positive_clip_fraction_high() const { return frac(by_sign[2].above_high, by_sign[2].tokens); }
    double positive_clip_fraction_low() const { return frac(by_sign[2].above_low, by_sign[2].tokens); }

    /// A Markdown table, one row per advantage sign.
    std::string to_markdown() const {
        std::ostringstream os;
        os << "| advantage | tokens | below hi/lo | above hi/lo | region changed | branch changed | pushed out low | "
              "pushed out high "
              "| pulled in |\n|---|---|---|---|---|---|---|---|---|\n";
        for (int s = 0; s < 3; ++s) {
            const auto& c = by_sign[s];
            os << "| " << advantage_sign_name(static_cast<advantage_sign>(s)) << " | " << c.tokens << " | "
               << c.below_high << " / " << c.below_low << " | " << c.above_high << " / " << c.above_low << " | "
               << c.region_changed << " | " << c.branch_changed << " | " << c.pushed_out_low << " | "
               << c.pushed_out_high << " | " << c.pulled_in << " |\n";
        }
        os << "\nnon-finite tokens: " << non_finite << "\n";
        return os.str();
    }

private:
    static double frac(std::uint64_t a, std::uint64_t b) {
        return b ? static_cast<double>(a) / static_cast<double>(b) : 0.0;
    }
};

namespace detail {

/// Bit k set: counter k of the token's advantage sign is incremented (bit 0, tokens, always).
OCTET_HD unsigned crossing_flags(clip_region h, clip_region l, advantage_sign s) {
    const bool neg = s == advantage_sign::negative, pos = s == advantage_sign::positive;
    const bool clipped_h = (neg && h == clip_region::below) || (pos && h == clip_region::above);
    const bool clipped_l = (neg && l == clip_region::below) || (pos && l == clip_region::above);
    unsigned f = 1u;
    f |= static_cast<unsigned>(h == clip_region::below) << 1;
    f |= static_cast<unsigned>(l == clip_region::below) << 2;
    f |= static_cast<unsigned>(h == clip_region::above) << 3;
    f |= static_cast<unsigned>(l == clip_region::above) << 4;
    f |= static_cast<unsigned>(h != l) << 5;
    f |= static_cast<unsigned>(clipped_h != clipped_l) << 6;
    f |= static_cast<unsigned>(h != clip_region::below && l == clip_region::below) << 7;
    f |= static_cast<unsigned>(h != clip_region::above && l == clip_region::above) << 8;
    f |= static_cast<unsigned>(h != clip_region::inside && l == clip_region::inside) << 9;
    return f;
}

/// Classifies one token from its two ratios. Returns false (not classified) for a non-finite token.
OCTET_HD bool crossing_token(float ratio_low, float ratio_high, float advantage, clip_range low_range, clip_range range,
                             unsigned& flags, advantage_sign& sign) {
    if (!(is_finite_float(ratio_low) && is_finite_float(ratio_high) && is_finite_float(advantage))) return false;
    flags = crossing_flags(region_of(ratio_high, range), region_of(ratio_low, low_range), sign_of(advantage));
    sign = sign_of(advantage);
    return true;
}

/// Every executor-independent check of threshold_crossings (from_logp: `low`, `high` are
/// log-probabilities with `logp_old` and the log-ratio limit) and threshold_crossings_from_ratios
/// (ratios; logp_old and the limit unused): one entry per token in each input, valid ranges.
inline void check_crossing_args(bool from_logp, span<const float> low, span<const float> high,
                                span<const float> logp_old, span<const float> advantages, clip_range range,
                                clip_range low_range, float log_ratio_limit, const char* fn) {
    const char* low_arg = from_logp ? "logp_low" : "ratio_low";
    const std::size_t n = low.size();
    require_same_length(n, high.size(), fn, from_logp ? "logp_high" : "ratio_high", low_arg);
    if (from_logp) require_same_length(n, logp_old.size(), fn, "logp_old", low_arg);
    require_same_length(n, advantages.size(), fn, "advantages", low_arg);
    require_range(range, fn, "range");
    require_range(low_range, fn, "low_range");
    if (from_logp) require_log_ratio_limit(log_ratio_limit, fn, "log_ratio_limit");
}

/// The (sign, high region, low region) cells of the host count, and the non-finite cell after them.
inline constexpr int crossing_cells = 27;

/// The host scratch of threshold_crossings over n tokens: per chunk of reduction blocks
/// (parallel_for_chunks), the counts of the 28 cells (exact integers: any split gives the same sums).
inline std::uint64_t* carve_crossings(scratch_carver& c, const host_executor& ex, std::size_t n) {
    const std::size_t blocks = (n + kRlReduceBlock - 1) / kRlReduceBlock;
    return c.take<std::uint64_t>(parallel_chunks(ex, blocks, 4) * (crossing_cells + 1));
}

/// Host loop shared by both entry points: ratio_of(i) gives (ratio_low, ratio_high). Each token
/// falls into one of 27 (sign, high region, low region) cells or the non-finite cell; the counters
/// follow from the cell counts through crossing_flags (the same rule the kernel applies per token).
/// Four interleaved histograms keep consecutive increments of the common cell independent.
template <class RatioOf>
crossing_report crossings_host(host_executor ex, std::size_t n, span<const float> advantages, clip_range range,
                               clip_range low_range, const char* fn, RatioOf&& ratio_of) {
    constexpr int cells = crossing_cells;
    const std::size_t blocks = (n + kRlReduceBlock - 1) / kRlReduceBlock;
    scratch_carver size;
    carve_crossings(size, ex, n);
    const host_scratch scratch(ex, size.bytes(), fn);
    scratch_carver carver = scratch.carver();
    std::uint64_t* const partial = carve_crossings(carver, ex, n);  // chunk w: partial[w * (cells + 1) + cell]
    const std::size_t chunks = parallel_chunks(ex, blocks, 4);
    std::fill(partial, partial + chunks * (cells + 1), std::uint64_t{0});
    parallel_for_chunks(ex, blocks, 4, [&](std::size_t chunk, std::size_t bb, std::size_t be) {
        std::uint64_t* const counts = partial + chunk * (cells + 1);
        for (std::size_t blk = bb; blk < be; ++blk) {
            const std::size_t b = blk * kRlReduceBlock, e = std::min(n, b + kRlReduceBlock);
            std::uint32_t hist[4][cells + 1] = {};
            for (std::size_t i = b; i < e; ++i) {
                const auto [lo, hi] = ratio_of(i);
                const float a = advantages[i];
                const bool finite = is_finite_float(lo) && is_finite_float(hi) && is_finite_float(a);
                const int cell = 9 * static_cast<int>(sign_of(a)) + 3 * static_cast<int>(region_of(hi, range)) +
                                 static_cast<int>(region_of(lo, low_range));
                ++hist[i & 3][finite ? cell : cells];
            }
            for (int c = 0; c <= cells; ++c)
                counts[c] += std::uint64_t{hist[0][c]} + hist[1][c] + hist[2][c] + hist[3][c];
        }
    });
    std::array<std::uint64_t, cells + 1> total{};
    for (std::size_t w = 0; w < chunks; ++w)
        for (int c = 0; c <= cells; ++c) total[c] += partial[w * (cells + 1) + c];
    crossing_report r;
    for (int c = 0; c < cells; ++c) {
        const int s = c / 9, h = (c / 3) % 3, l = c % 3;
        const unsigned flags =
            crossing_flags(static_cast<clip_region>(h), static_cast<clip_region>(l), static_cast<advantage_sign>(s));
        for (int k = 0; k < crossing_counts::count; ++k)
            if ((flags >> k) & 1u) r.by_sign[s].at(k) += total[c];
    }
    r.non_finite = total[cells];
    return r;
}

}  // namespace detail

/// Bytes of host scratch that threshold_crossings and threshold_crossings_from_ratios take for n
/// tokens on `ex` (28 counters per thread; from ex.allocator when one is lent, see
/// octet::with_allocator).
inline std::size_t threshold_crossings_scratch_bytes(const host_executor& ex, std::size_t n) {
    detail::scratch_carver c;
    detail::carve_crossings(c, ex, n);
    return c.bytes();
}

/// Crossings from log-probabilities: ratio_low = exp(logp_low - logp_old), ratio_high =
/// exp(logp_high - logp_old) (clip.hpp's rule, with the same log-ratio limit). `range` classifies
/// the high-precision ratios, `low_range` the low-precision ones.
inline crossing_report threshold_crossings(host_executor ex, span<const float> logp_low, span<const float> logp_high,
                                           span<const float> logp_old, span<const float> advantages, clip_range range,
                                           clip_range low_range, float log_ratio_limit = default_log_ratio_limit) {
    constexpr const char* fn = "octet::threshold_crossings";
    detail::check_crossing_args(true, logp_low, logp_high, logp_old, advantages, range, low_range, log_ratio_limit, fn);
    return detail::crossings_host(ex, logp_low.size(), advantages, range, low_range, fn, [&](std::size_t i) {
        return std::pair<float, float>{importance_ratio(logp_low[i], logp_old[i], log_ratio_limit),
                                       importance_ratio(logp_high[i], logp_old[i], log_ratio_limit)};
    });
}

inline crossing_report threshold_crossings(host_executor ex, span<const float> logp_low, span<const float> logp_high,
                                           span<const float> logp_old, span<const float> advantages, clip_range range) {
    return threshold_crossings(ex, logp_low, logp_high, logp_old, advantages, range, range);
}

/// Crossings from ratios computed elsewhere (same definitions; NaN or Inf ratios are non-finite).
inline crossing_report threshold_crossings_from_ratios(host_executor ex, span<const float> ratio_low,
                                                       span<const float> ratio_high, span<const float> advantages,
                                                       clip_range range, clip_range low_range) {
    constexpr const char* fn = "octet::threshold_crossings_from_ratios";
    detail::check_crossing_args(false, ratio_low, ratio_high, {}, advantages, range, low_range, default_log_ratio_limit,
                                fn);
    return detail::crossings_host(ex, ratio_low.size(), advantages, range, low_range, fn, [&](std::size_t i) {
        return std::pair<float, float>{ratio_low[i], ratio_high[i]};
    });
}

inline crossing_report threshold_crossings_from_ratios(host_executor ex, span<const float> ratio_low,
                                                       span<const float> ratio_high, span<const float> advantages,
                                                       clip_range range) {
    return threshold_crossings_from_ratios(ex, ratio_low, ratio_high, advantages, range, range);
}

}  // namespace octet
