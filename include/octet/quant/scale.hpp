// octet/quant/scale.hpp: the rules that turn a block's amax into its scale, and the per-element
// step, as OCTET_HD functions shared by the host path and every kernel.
//
// Edge contract (tested in tests/host/quant_*.cpp):
//   * nan_policy::propagate (recipe.hpp, the default): a block holding a NaN or an Inf takes the
//     NaN scale (ue8m0: code 0xFF; e4m3: code 0x7F; f32: the NaN 0x7FFFFFFF) and zero codes, so
//     every element of it dequantizes to NaN and every product that reads it is NaN (a NaN-loss
//     check fires, as with torchao's float8, where an Inf amax gives scale 0 and Inf * 0 = NaN);
//     its finite elements are counted in quant_stats::lost_to_nan, the non-finite ones in
//     quant_stats::non_finite. A stored scale that is NaN (ue8m0 0xFF included) always decodes to NaN.
//   * nan_policy::per_element: amax is the largest |x| over the block's FINITE values; Inf and NaN
//     do not take part, so one bad value does not wipe out its block. They are encoded by the
//     format's contract (Inf: +-max_finite under saturate, Inf/NaN under to_nonfinite; NaN: the
//     NaN code, +max_finite in FP6/FP4) and counted in quant_stats::non_finite. The codecs' wire
//     formats use it (a non-finite gradient element is data there, codec/codec.hpp).
//   * amax == 0 (an all-zero block, or one holding only non-finite values): the scale is the
//     smallest the rule gives (f32: 2^-126; ue8m0: 2^-127, code 0; e4m3 storage: code 0, the
//     value 0) and every finite element encodes to zero. Never NaN. The scale of a block with no
//     magnitude carries no information, and the smallest one keeps it out of every maximum taken
//     over scales: a consumer that folds per-row scales into a product by their largest (FP8
//     attention's V and dO tiles, the dS scales of dQ and dK) is then unchanged by zero rows
//     (padding, masked labels). A scale of 1 there made every other row of a 1e-3 gradient
//     underflow in E4M3 (tests/host/attention_padding.cpp).
//   * a tiny (even subnormal) amax: float scales are clamped to at least 2^-126 and power-of-two
//     scales to at least 2^-126 (f32) or 2^-127 (ue8m0), so x / s is always finite; elements too
//     small for that scale flush to zero and are counted. Scales are at most 2^127.
//   * two-level (E4M3) scales: the block scale s / tensor_scale is encoded to E4M3 (nearest-even,
//     saturate); a block whose E4M3 scale underflows to 0 stores zero codes (counted as flushed).
//   * element: code = encode<Format, Round, Overflow>(x / S), where S is the decoded (effective)
//     scale, with an IEEE float division (host and device give the same bits; do not build
//     kernels with --use_fast_math, which replaces it).
#pragma once

#include <cstdint>
#include <type_traits>

#include "octet/config.hpp"
#include "octet/core/bits.hpp"
#include "octet/format/encode.hpp"
#include "octet/quant/recipe.hpp"

namespace octet {

/// A block's scale: how it is stored (`stored`: float bits for f32, the code for ue8m0/e4m3) and
/// the effective value S that elements are divided by and multiplied with.
struct block_scale {
    std::uint32_t stored;
    float value;
};

namespace detail {

/// floor(log2(a)) and the 24-bit significand of a finite a > 0 (a = sig * 2^(e - 23)).
OCTET_HD void log2_parts(float a, int& e, std::uint32_t& sig) {
    const std::uint32_t u = float_to_bits(a) & 0x7FFFFFFFu;
    const std::uint32_t fe = u >> 23;
    if (fe != 0u) {
        e = static_cast<int>(fe) - 127;
        sig = (u & 0x7FFFFFu) | 0x800000u;
    } else {
        const int lz = count_leading_zeros(u | 1u);
        e = (31 - lz) - 149;
        sig = u << (lz - 8);  // leading one to bit 23
    }
}

/// Exponent of the power-of-two scale for a finite amax > 0 under a pow2 rule.
template <class Fmt, class Rule>
OCTET_HD int pow2_scale_exponent(float amax) {
    int L;
    std::uint32_t sig;
    log2_parts(amax, L, sig);
    constexpr int M = Fmt::mantissa_bits;
    // max_finite = 2^emax * max_sig / 2^23 with max_sig a 24-bit significand
    constexpr std::uint32_t max_sig = 0x800000u | ((Fmt::max_code & ((1u << M) - 1u)) << (23 - M));
    if constexpr (std::is_same_v<Rule, scale::pow2_floor>) {
        (void)sig;
        return L - Fmt::emax;
    } else if constexpr (std::is_same_v<Rule, scale::pow2_ceil>) {
        return L - Fmt::emax + (sig > max_sig ? 1 : 0);
    } else {
        // round(log2(amax / max_finite)) = L - emax + round(log2(sig / max_sig)); sig/max_sig is in
        // (1/2, 2). Up when (sig/max_sig)^2 >= 2, down when < 1/2; exact in 64-bit integers, and
        // the boundary sqrt(2) is irrational, so there are no ties.
        const std::uint64_t s2 = static_cast<std::uint64_t>(sig) * sig;
        const std::uint64_t m2 = static_cast<std::uint64_t>(max_sig) * max_sig;
        const int adjust = s2 >= 2 * m2 ? 1 : (2 * s2 < m2 ? -1 : 0);
        return L - Fmt::emax + adjust;
    }
}

}  // namespace detail

/// The scale of one block whose largest finite magnitude is `amax` (>= 0; NaN when the block holds
/// a NaN under nan_policy::propagate, see block_abs). `tensor_scale` is the per-tensor float scale
/// of two-level recipes (ignored otherwise).
template <class Recipe>
OCTET_HD block_scale make_block_scale(float amax, float tensor_scale = 1.0f) {
    using Fmt = typename Recipe::format;
    using Rule = typename Recipe::scale_rule;
    using Storage = typename Recipe::scale_storage_type;
    if constexpr (Recipe::propagates_nan) {
        if (amax != amax) {  // the block holds a NaN: the format's NaN scale
            const float nan = bits_to_float(0x7FFFFFFFu);
            if constexpr (std::is_same_v<Storage, scale_storage::ue8m0>)
                return block_scale{0xFFu, nan};
            else if constexpr (std::is_same_v<Storage, scale_storage::e4m3>)
                return block_scale{e4m3::nan_code, nan};
            else
                return block_scale{0x7FFFFFFFu, nan};
        }
    }
    const bool zero = !(amax > 0.0f);  // also catches a NaN amax defensively
    if constexpr (is_pow2_rule_v<Rule>) {
        constexpr int lo = std::is_same_v<Storage, scale_storage::ue8m0> ? -127 : -126;
        int e = zero ? lo : detail::pow2_scale_exponent<Fmt, Rule>(amax);
        e = e < lo ? lo : (e > 127 ? 127 : e);
        const float value = exp2i(e);
        if constexpr (std::is_same_v<Storage, scale_storage::ue8m0>)
            return block_scale{static_cast<std::uint32_t>(e + 127), value};
        else
            return block_scale{float_to_bits(value), value};
    } else {
        float s = amax / Fmt::max_finite;
        if constexpr (Rule::margin > 0) s = s * exp2i(Rule::margin);
        s = s < 1.17549435e-38f ? 1.17549435e-38f : s;  // 2^-126: x / s stays finite
        s = s > 1.70141183e38f ? 1.70141183e38f : s;    // 2^127
        s = zero ? 1.17549435e-38f : s;                 // the smallest scale (a NaN amax included)
        if constexpr (std::is_same_v<Storage, scale_storage::e4m3>) {
            const std::uint8_t code = zero ? std::uint8_t{0} : encode<e4m3>(s / tensor_scale);
            return block_scale{code, decode<e4m3>(code) * tensor_scale};
        } else {
            return block_scale{float_to_bits(s), s};
        }
    }
}

/// The effective scale of a stored scale (what make_block_scale returned as .value).
template <class Recipe>
OCTET_HD float stored_scale_value(std::uint32_t stored, float tensor_scale = 1.0f) {
    using Storage = typename Recipe::scale_storage_type;
    if constexpr (std::is_same_v<Storage, scale_storage::ue8m0>)
        return (stored & 0xFFu) == 0xFFu ? bits_to_float(0x7FFFFFFFu) : exp2i(static_cast<int>(stored & 0xFFu) - 127);
    else if constexpr (std::is_same_v<Storage, scale_storage::e4m3>)
        return decode<e4m3>(static_cast<std::uint8_t>(stored)) * tensor_scale;
    else
        return bits_to_float(stored);
}

/// The per-tensor float scale of a two-level recipe: tensor amax / (max_finite * 448), so that
/// block scales fit E4M3. 1 when the tensor amax is 0 (or not finite).
template <class Recipe>
OCTET_HD float make_tensor_scale(float tensor_amax) {
    using Fmt = typename Recipe::format;
    if (!(tensor_amax > 0.0f) || !(tensor_amax <= 3.40282347e38f)) return 1.0f;
    float s = tensor_amax / (Fmt::max_finite * e4m3::max_finite);
    return s < 1.17549435e-38f ? 1.17549435e-38f : s;
}

/// One element: the code of x in a block of effective scale S. A zero S (an E4M3 block scale
/// that underflowed) and a NaN S (nan_policy::propagate) give a zero code.
template <class Recipe>
OCTET_HD std::uint8_t encode_scaled(float x, float scale_value, std::uint32_t random_bits = 0) {
    using Fmt = typename Recipe::format;
    using Round = typename Recipe::rounding;
    using Overflow = typename Recipe::overflow_policy;
    const float v = x / scale_value;
    std::uint8_t code;
    if constexpr (std::is_same_v<Round, round::stochastic>)
        code = encode<Fmt, Round, Overflow>(v, random_bits);
    else {
        (void)random_bits;
        code = encode<Fmt, Round, Overflow>(v);
    }
    return scale_value == 0.0f || scale_value != scale_value ? std::uint8_t{0} : code;
}

/// The index of element (r, c) of a copy in its stochastic-rounding stream: r in the high 32 bits,
/// c (< 2^32) in the low, so that a copy's draws do not depend on its row length: zero columns
/// appended to a copy (padding tokens in a transposed gradient) leave the other elements' bits,
/// and so their codes, unchanged.
OCTET_HD std::uint64_t stochastic_index(std::uint64_t r, std::uint64_t c) {
    return (r << 32) | c;
}

/// True when |v| lies beyond max_finite by at least half a unit in the last place of max_finite
/// (so that no rounding can bring it to a finite value honestly: it was clamped). Ties follow
/// nearest-even. NaN is not saturated (it is counted as non-finite).
template <class Fmt>
OCTET_HD bool beyond_max_finite(float v) {
    constexpr float threshold = static_cast<float>(Fmt::overflow_threshold_d);  // exact: one more bit
    constexpr bool tie_goes_up = (Fmt::max_code & 1u) != 0u;
    const float a = v < 0 ? -v : v;
    return tie_goes_up ? a >= threshold : a > threshold;
}

/// |x| if x is finite, else 0 (the amax of a block ignores Inf and NaN).
OCTET_HD float finite_abs(float x) {
    return is_finite_float(x) ? abs_float(x) : 0.0f;
}

/// |x| if x is finite, else NaN (0x7FFFFFFF): what an element contributes to its block's amax
/// under nan_policy::propagate (amax_max keeps the NaN).
OCTET_HD float propagating_abs(float x) {
    const std::uint32_t a = float_to_bits(x) & 0x7FFFFFFFu;
    return a >= 0x7F800000u ? bits_to_float(0x7FFFFFFFu) : bits_to_float(a);
}

/// What an element contributes to its block's amax: propagating_abs under nan_policy::propagate,
/// finite_abs under per_element.
template <class Recipe>
OCTET_HD float block_abs(float x) {
    if constexpr (Recipe::propagates_nan)
        return propagating_abs(x);
    else
        return finite_abs(x);
}

/// max of two block_abs values that keeps a NaN (their bit patterns order as the values do, and
/// the NaN 0x7FFFFFFF above every one of them); fmaxf and std::max would drop it.
OCTET_HD float amax_max(float a, float b) {
    return float_to_bits(a) >= float_to_bits(b) ? a : b;
}

}  // namespace octet
