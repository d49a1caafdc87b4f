// octet/reference/quantize.hpp: a float64 reference quantizer, written from the recipe definitions
// in quant/recipe.hpp and quant/scale.hpp without their code: block amax in double, scale rules in
// exact arithmetic (powers of two found by search, the nearest rule decided by comparing squares),
// elements through the brute-force format reference. The result is unpacked (one code per element)
// with the scale grid row-major. nan_policy::propagate: a block holding a NaN or an Inf stores the
// NaN of its scale format (UE8M0 0xFF, E4M3 0x7F, float 0x7FFFFFFF), effective scale NaN, and zero
// codes; per_element: amax over the finite values, each element encoded alone.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "octet/quant/recipe.hpp"
#include "octet/reference/format.hpp"

namespace octet {
namespace reference {

struct quantized_matrix {
    std::size_t rows = 0, cols = 0, block_rows = 0, block_cols = 0, scale_rows = 0, scale_cols = 0;
    std::vector<std::uint32_t> stored_scale;  ///< row-major scale grid: float bits (f32) or code
    std::vector<double> scale_value;          ///< effective scale S of each block
    std::vector<std::uint8_t> codes;          ///< rows x cols, row-major
    double tensor_scale = 1.0;
    double amax = 0.0;

    double scale_of(std::size_t i, std::size_t j) const {
        return scale_value[(i / block_rows) * scale_cols + j / block_cols];
    }
};

namespace detail {
inline float to_float_rn(double v) {
    return static_cast<float>(v);
}  // double -> float rounds to nearest even

/// Smallest e with amax <= max_finite * 2^e (exact: a search over exponents).
inline int ceil_exponent(double amax, double max_finite) {
    int e = std::ilogb(amax) - std::ilogb(max_finite) - 2;
    while (amax > std::ldexp(max_finite, e)) ++e;
    return e;
}
/// Largest e with max_finite * 2^e <= amax.
inline int floor_exponent(double amax, double max_finite) {
    int e = ceil_exponent(amax, max_finite);
    while (std::ldexp(max_finite, e) > amax) --e;
    return e;
}
}  // namespace detail

/// The scale rule applied to one amax, in float64 / exact arithmetic. Returns the stored value
/// (float bits or code) and the effective scale.
template <class Recipe>
std::pair<std::uint32_t, double> block_scale_f64(double amax, double tensor_scale) {
    using Fmt = typename Recipe::format;
    using Rule = typename Recipe::scale_rule;
    using Storage = typename Recipe::scale_storage_type;
    const double maxf = Fmt::max_finite_d;
    if constexpr (is_pow2_rule_v<Rule>) {
        int e = -1000;  // a zero amax: the smallest scale (clamped below)
        if (amax > 0) {
            if constexpr (std::is_same_v<Rule, scale::pow2_floor>) {
                e = std::ilogb(amax) - Fmt::emax;  // OCP MX: floor(log2 amax) - emax
            } else if constexpr (std::is_same_v<Rule, scale::pow2_ceil>) {
                e = detail::ceil_exponent(amax, maxf);
            } else {
                const int lo = detail::floor_exponent(amax, maxf);
                const double base = std::ldexp(maxf, lo);
                e = amax * amax >= 2.0 * base * base ? lo + 1 : lo;  // log-space rounding, compared exactly
            }
        }
        const int lo = std::is_same_v<Storage, scale_storage::ue8m0> ? -127 : -126;
        e = std::max(lo, std::min(127, e));
        const double v = std::ldexp(1.0, e);
        if constexpr (std::is_same_v<Storage, scale_storage::ue8m0>)
            return {static_cast<std::uint32_t>(e + 127), v};
        else {
            const float f = static_cast<float>(v);
            std::uint32_t bits;
            std::memcpy(&bits, &f, 4);
            return {bits, v};
        }
    } else {
        float s = detail::to_float_rn(amax / maxf);
        if (Rule::margin > 0) s = static_cast<float>(static_cast<double>(s) * std::ldexp(1.0, Rule::margin));
        s = std::max(s, std::ldexp(1.0f, -126));
        s = std::min(s, std::ldexp(1.0f, 127));
        if (!(amax > 0)) s = std::ldexp(1.0f, -126);  // a zero amax: the smallest scale
        if constexpr (std::is_same_v<Storage, scale_storage::e4m3>) {
            if (!(amax > 0)) return {0u, 0.0};  // ... stored as E4M3 code 0
            const float ratio = detail::to_float_rn(static_cast<double>(s) / tensor_scale);
            const std::uint32_t code = encode_code<e4m3, round::nearest_even, overflow::saturate>(ratio);
            const double dec = decode_code<e4m3>(code).value;
            return {code, static_cast<double>(detail::to_float_rn(dec * tensor_scale))};
        } else {
            std::uint32_t bits;
            std::memcpy(&bits, &s, 4);
            return {bits, static_cast<double>(s)};
        }
    }
}

/// Quantize a rows x cols row-major float matrix under Recipe. `tensor_amax` < 0: measured.
/// `random_bits(r, c)` supplies stochastic-rounding bits (ignored by other roundings).
template <class Recipe, class Bits>
quantized_matrix quantize(const std::vector<float>& x, std::size_t rows, std::size_t cols, double tensor_amax,
                          Bits random_bits) {
    using Fmt = typename Recipe::format;
    using G = typename Recipe::granularity;
    quantized_matrix q;
    q.rows = rows;
    q.cols = cols;
    q.block_rows = G::rows == full ? std::max<std::size_t>(rows, 1) : G::rows;
    q.block_cols = G::cols == full ? std::max<std::size_t>(cols, 1) : G::cols;
    q.scale_rows = rows == 0 ? 0 : (rows + q.block_rows - 1) / q.block_rows;
    q.scale_cols = cols == 0 ? 0 : (cols + q.block_cols - 1) / q.block_cols;
    std::vector<double> amax(q.scale_rows * q.scale_cols, 0.0);
    std::vector<bool> non_finite(amax.size(), false);
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) {
            const double v = x[i * cols + j];
            if (!std::isfinite(v)) {
                non_finite[(i / q.block_rows) * q.scale_cols + j / q.block_cols] = true;
                continue;
            }
            double& a = amax[(i / q.block_rows) * q.scale_cols + j / q.block_cols];
            a = std::max(a, std::fabs(v));
            q.amax = std::max(q.amax, std::fabs(v));
        }
    if (tensor_amax < 0) tensor_amax = q.amax;
    if (Recipe::two_level)
        q.tensor_scale =
            tensor_amax > 0
                ? std::max(static_cast<double>(detail::to_float_rn(tensor_amax / (Fmt::max_finite_d * 448.0))),
                           std::ldexp(1.0, -126))
                : 1.0;
    for (std::size_t k = 0; k < amax.size(); ++k) {
        if (Recipe::propagates_nan && non_finite[k]) {
            using Storage = typename Recipe::scale_storage_type;
            const std::uint32_t nan_code = std::is_same_v<Storage, scale_storage::ue8m0>  ? 0xFFu
                                           : std::is_same_v<Storage, scale_storage::e4m3> ? 0x7Fu
                                                                                          : 0x7FFFFFFFu;
            q.stored_scale.push_back(nan_code);
            q.scale_value.push_back(std::nan(""));
            continue;
        }
        const double a = Recipe::is_per_tensor ? tensor_amax : amax[k];
        const auto s = block_scale_f64<Recipe>(a, q.tensor_scale);
        q.stored_scale.push_back(s.first);
        q.scale_value.push_back(s.second);
    }
    q.codes.resize(rows * cols);
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) {
            const double S = q.scale_of(i, j);
            const float v = detail::to_float_rn(static_cast<double>(x[i * cols + j]) / S);
            q.codes[i * cols + j] =
                S == 0.0 || std::isnan(S)
                    ? 0
                    : static_cast<std::uint8_t>(
                          encode_code<Fmt, typename Recipe::rounding, typename Recipe::overflow_policy>(
                              v, random_bits(i, j)));
        }
    return q;
}

}  // namespace reference
}  // namespace octet
