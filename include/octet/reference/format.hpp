// octet/reference/format.hpp: a float64 brute-force reference for every octet format, written from
// the format definitions alone (it shares no code with octet/format/encode.hpp). It enumerates
// every code, decodes it in float64 from the bit-field definition, and picks the right neighbour
// in float64 under the contract of encode.hpp. Slow (a binary search per value) and simple: it is
// the oracle tests, benchmarks and users check the fast paths against.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "octet/format/float_format.hpp"
#include "octet/format/rounding.hpp"

namespace octet {
namespace reference {

enum class code_kind { finite, pos_inf, neg_inf, nan };

struct code_value {
    code_kind kind;
    double value;  // for finite codes (may be -0.0)
};

/// Decodes `code` from the field definitions of the format (float64, no octet code used).
template <class Fmt>
code_value decode_code(std::uint32_t code) {
    const int E = Fmt::exponent_bits, M = Fmt::mantissa_bits;
    const bool neg = Fmt::is_signed && ((code >> (E + M)) & 1u);
    const std::uint32_t expf = (code >> M) & ((1u << E) - 1u);
    const std::uint32_t man = code & ((1u << M) - 1u);
    const bool all_ones_exp = expf == (1u << E) - 1u;
    switch (Fmt::special_codes) {
        case octet::specials::ieee:
            if (all_ones_exp)
                return man == 0 ? code_value{neg ? code_kind::neg_inf : code_kind::pos_inf, 0}
                                : code_value{code_kind::nan, 0};
            break;
        case octet::specials::nan_only:
            if (all_ones_exp && man == (1u << M) - 1u) return {code_kind::nan, 0};
            break;
        case octet::specials::fnuz:
            if (neg && expf == 0 && man == 0) return {code_kind::nan, 0};
            break;
        case octet::specials::exponent_only:
            if (all_ones_exp) return {code_kind::nan, 0};
            return {code_kind::finite, std::ldexp(1.0, static_cast<int>(expf) - Fmt::bias)};
        case octet::specials::finite:
            break;
    }
    double mag = expf == 0
                     ? std::ldexp(static_cast<double>(man), 1 - Fmt::bias - M)
                     : std::ldexp(1.0 + std::ldexp(static_cast<double>(man), -M), static_cast<int>(expf) - Fmt::bias);
    return {code_kind::finite, neg ? -mag : mag};
}

/// The non-negative finite values of a format with their codes, sorted by value.
template <class Fmt>
struct format_table {
    std::vector<double> values;
    std::vector<std::uint32_t> codes;
    format_table() {
        for (std::uint32_t c = 0; c < (1u << Fmt::bits); ++c) {
            const code_value r = decode_code<Fmt>(c);
            if (r.kind != code_kind::finite || std::signbit(r.value)) continue;
            values.push_back(r.value);
            codes.push_back(c);
        }
        std::vector<std::size_t> order(values.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return values[a] < values[b]; });
        std::vector<double> v;
        std::vector<std::uint32_t> c;
        for (auto i : order) v.push_back(values[i]), c.push_back(codes[i]);
        values = v;
        codes = c;
    }
    static const format_table& get() {
        static const format_table t;
        return t;
    }
};

/// The neighbours of a non-negative magnitude in a format: lo <= m <= hi. Beyond the largest
/// finite value, hi is the "virtual" next value of an unbounded exponent range (index == size).
struct neighbour_pair {
    std::size_t lo, hi;  // indices into the table; hi may be table size (virtual)
    double lo_value, hi_value;
    bool exact;
};

template <class Fmt>
neighbour_pair neighbours(double m) {
    const auto& t = format_table<Fmt>::get();
    const std::size_t n = t.values.size();
    auto it = std::upper_bound(t.values.begin(), t.values.end(), m);
    std::size_t hi = static_cast<std::size_t>(it - t.values.begin());  // first > m
    if (hi > 0 && t.values[hi - 1] == m) return {hi - 1, hi - 1, m, m, true};
    const std::size_t lo = hi - 1;  // requires m >= smallest value
    double hi_value;
    if (hi < n) {
        hi_value = t.values[hi];
    } else {
        // virtual neighbour: the max value's ulp continued (exponent range unbounded)
        const double mx = t.values[n - 1];
        const int e = std::ilogb(mx);
        hi_value = mx + std::ldexp(1.0, e - Fmt::mantissa_bits);
    }
    return {lo, hi, t.values[lo], hi_value, false};
}

/// What octet::encode must return for float input x, per the contract in encode.hpp.
/// `random_bits` is only used by round::stochastic.
template <class Fmt, class Round, class Overflow>
std::uint32_t encode_code(float xf, std::uint32_t random_bits = 0) {
    using namespace octet;
    const auto& t = format_table<Fmt>::get();
    const std::size_t n = t.values.size();
    const std::uint32_t max_code = t.codes[n - 1];
    const double x = static_cast<double>(xf);
    const bool neg = Fmt::is_signed && std::signbit(x);
    const std::uint32_t sign = neg ? (1u << (Fmt::exponent_bits + Fmt::mantissa_bits)) : 0u;
    constexpr bool saturate = std::is_same_v<Overflow, overflow::saturate>;
    constexpr specials S = Fmt::special_codes;
    constexpr std::uint32_t mag_ones = (1u << (Fmt::exponent_bits + Fmt::mantissa_bits)) - 1u;
    const std::uint32_t canonical_nan =
        S == specials::fnuz ? (1u << (Fmt::exponent_bits + Fmt::mantissa_bits)) : mag_ones;

    auto nonfinite = [&]() -> std::uint32_t {
        if (S == specials::ieee) return sign | (((1u << Fmt::exponent_bits) - 1u) << Fmt::mantissa_bits);
        if (S == specials::fnuz) return canonical_nan;
        return sign | mag_ones;  // nan_only keeps the sign; exponent_only is unsigned (sign == 0)
    };
    if (std::isnan(x)) return S == specials::finite ? max_code : canonical_nan;
    if (std::isinf(x)) return saturate ? (sign | max_code) : nonfinite();

    const double m = std::fabs(x);
    if (S == specials::exponent_only && m < t.values[0]) return t.codes[0];  // no zero

    const neighbour_pair nb = neighbours<Fmt>(m);
    std::size_t pick;
    if (nb.exact) {
        pick = nb.lo;
    } else {
        const double frac = (m - nb.lo_value) / (nb.hi_value - nb.lo_value);  // exact: power-of-two gap
        const bool hi_is_even = ((nb.hi < n ? t.codes[nb.hi] : max_code + 1u) & 1u) == 0u;
        bool away;
        if constexpr (std::is_same_v<Round, round::nearest_even>)
            away = frac > 0.5 || (frac == 0.5 && hi_is_even);
        else if constexpr (std::is_same_v<Round, round::toward_zero>)
            away = false;
        else if constexpr (std::is_same_v<Round, round::up>)
            away = !neg;
        else if constexpr (std::is_same_v<Round, round::down>)
            away = neg;
        else
            away = static_cast<double>(random_bits) + std::floor(std::ldexp(frac, 32)) >= std::ldexp(1.0, 32);
        pick = away ? nb.hi : nb.lo;
    }
    if (pick >= n) {  // rounded beyond max_finite
        if (saturate) return sign | max_code;
        const bool to_max = std::is_same_v<Round, round::toward_zero> || (std::is_same_v<Round, round::up> && neg) ||
                            (std::is_same_v<Round, round::down> && !neg);
        return to_max ? (sign | max_code) : nonfinite();
    }
    const std::uint32_t mag = t.codes[pick];
    if (S == specials::fnuz && t.values[pick] == 0.0) return 0u;
    return sign | mag;
}

}  // namespace reference
}  // namespace octet
