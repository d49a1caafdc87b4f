// octet/format/float_format.hpp: the format type, its constexpr traits, and the named formats.
//
// A format is a type: `float_format<ExpBits, ManBits, Bias, Specials, Signed>`. Everything a
// kernel or a test needs to know about it is a constexpr member, so that a wrong combination
// fails at compile time with a message that says what to do.
//
//   using e3m4     = octet::float_format<3, 4>;                             // IEEE-like, bias 3
//   using e4m3_b11 = octet::float_format<4, 3, 11, octet::specials::nan_only>;
//
// Codes are at most 8 bits wide and live in the low bits of a std::uint8_t: sign (when the
// format is signed) at bit ExpBits+ManBits, then the exponent field, then the mantissa.
#pragma once

#include <cstdint>
#include <type_traits>

#include "octet/config.hpp"

namespace octet {

/// How a format spends its special codes.
enum class specials {
    /// IEEE 754 style: the all-ones exponent holds Inf (mantissa 0) and NaN (mantissa != 0).
    /// OCP E5M2 is this kind.
    ieee,
    /// No Inf; the single NaN magnitude is all exponent and mantissa bits set, and the rest of
    /// the top binade holds finite values. OCP E4M3 ("E4M3FN") is this kind.
    nan_only,
    /// No Inf and no negative zero: the one NaN is the negative-zero code (sign bit alone).
    /// The E4M3FNUZ / E5M2FNUZ formats of AMD MI300 and Graphcore are this kind.
    fnuz,
    /// Every code is a finite number: no Inf, no NaN. OCP MX FP6 (E2M3, E3M2) and FP4 (E2M1).
    finite,
    /// Unsigned powers of two with no mantissa and no zero; the all-ones code is NaN.
    /// OCP MX E8M0 (the shared scale) is this kind.
    exponent_only,
};

namespace detail {
constexpr double pow2(int e) {
    double r = 1.0;
    for (; e > 0; --e) r *= 2.0;
    for (; e < 0; ++e) r *= 0.5;
    return r;
}
}  // namespace detail

/// A floating-point format of at most 8 bits. `Bias` defaults to the IEEE bias 2^(E-1) - 1.
template <int ExpBits, int ManBits, int Bias = (1 << (ExpBits - 1)) - 1, specials Specials = specials::ieee,
          bool Signed = true>
struct float_format {
    static_assert(ExpBits >= 1 && ExpBits <= 8, "float_format: ExpBits must be in [1, 8]");
    static_assert(ManBits >= 0 && ManBits <= 7, "float_format: ManBits must be in [0, 7]");
    static_assert(ExpBits + ManBits + (Signed ? 1 : 0) <= 8,
                  "float_format: octet formats are at most 8 bits wide (sign + exponent + mantissa); "
                  "use bf16 or fp16 for wider storage");
    static_assert(Specials != specials::exponent_only || (ManBits == 0 && !Signed),
                  "float_format: specials::exponent_only formats are unsigned with ManBits == 0 (like ue8m0)");
    static_assert(Specials == specials::exponent_only || ManBits >= 1 || Specials == specials::finite,
                  "float_format: a format with Inf or NaN codes needs ManBits >= 1; use specials::finite "
                  "or specials::exponent_only for mantissa-free formats");
    static_assert(Specials != specials::ieee || ExpBits >= 2,
                  "float_format: specials::ieee needs ExpBits >= 2 (the top exponent is reserved for Inf/NaN)");
    static_assert(Specials != specials::fnuz || Signed,
                  "float_format: specials::fnuz reuses the negative-zero code as NaN, so it must be signed");

    static constexpr int exponent_bits = ExpBits;
    static constexpr int mantissa_bits = ManBits;
    static constexpr int bias = Bias;
    static constexpr specials special_codes = Specials;
    static constexpr bool is_signed = Signed;
    static constexpr int bits = ExpBits + ManBits + (Signed ? 1 : 0);

    static constexpr bool has_inf = Specials == specials::ieee;
    static constexpr bool has_nan = Specials != specials::finite;
    static constexpr bool has_zero = Specials != specials::exponent_only;
    static constexpr bool has_negative_zero = Signed && Specials != specials::fnuz;
    static constexpr bool has_subnormals = Specials != specials::exponent_only;

    /// Code of the sign bit (0 for unsigned formats), and the mask of the magnitude bits.
    static constexpr std::uint32_t sign_mask = Signed ? (1u << (ExpBits + ManBits)) : 0u;
    static constexpr std::uint32_t magnitude_mask = (1u << (ExpBits + ManBits)) - 1u;
    static constexpr std::uint32_t code_mask = (1u << bits) - 1u;

    /// Magnitude code of the largest finite value.
    static constexpr std::uint32_t max_code = Specials == specials::ieee
                                                  ? ((((1u << ExpBits) - 2u) << ManBits) | ((1u << ManBits) - 1u))
                                              : Specials == specials::nan_only      ? (magnitude_mask - 1u)
                                              : Specials == specials::exponent_only ? (magnitude_mask - 1u)
                                                                                    : magnitude_mask;
    /// Canonical NaN code (positive where the format has a sign); 0 when the format has no NaN.
    static constexpr std::uint32_t nan_code = Specials == specials::ieee            ? magnitude_mask
                                              : Specials == specials::nan_only      ? magnitude_mask
                                              : Specials == specials::fnuz          ? sign_mask
                                              : Specials == specials::exponent_only ? magnitude_mask
                                                                                    : 0u;
    /// Code of +Inf; 0 when the format has no Inf.
    static constexpr std::uint32_t inf_code = has_inf ? (((1u << ExpBits) - 1u) << ManBits) : 0u;

    /// Unbiased exponent of the smallest normal binade (for exponent_only, of code 0), and of
    /// the largest finite value.
    static constexpr int emin = Specials == specials::exponent_only ? -Bias : 1 - Bias;
    static constexpr int emax = static_cast<int>(max_code >> ManBits) - Bias;

    static constexpr double max_finite_d =
        detail::pow2(emax) * (1.0 + static_cast<double>(max_code & ((1u << ManBits) - 1u)) / (1u << ManBits));
    static constexpr double min_normal_d = detail::pow2(emin);
    static constexpr double min_subnormal_d = has_subnormals ? detail::pow2(emin - ManBits) : detail::pow2(emin);

    /// max_finite plus half its ulp: magnitudes beyond it round past max_finite (ties: see max_code's parity).
    static constexpr double overflow_threshold_d = max_finite_d + detail::pow2(emax - ManBits - 1);

    static constexpr float max_finite = static_cast<float>(max_finite_d);
    static constexpr float min_normal = static_cast<float>(min_normal_d);
    /// Smallest positive value (for exponent_only formats, which have no subnormals, = min_normal).
    static constexpr float min_subnormal = static_cast<float>(min_subnormal_d);

    static_assert(emax <= 127, "float_format: the largest finite value must be a finite float (emax <= 127)");
    static_assert(Specials == specials::exponent_only ? emin >= -149 : emin >= -126,
                  "float_format: the smallest normal value must be a normal float (bias too large)");
};

/// OCP FP8 E4M3 (a.k.a. E4M3FN): bias 7, no Inf, NaN = S.1111.111, max 448.
using e4m3 = float_format<4, 3, 7, specials::nan_only>;
/// OCP FP8 E5M2: bias 15, IEEE Inf/NaN, max 57344.
using e5m2 = float_format<5, 2, 15, specials::ieee>;
/// E4M3FNUZ: bias 8, no Inf, no -0, NaN = 0x80, max 240.
using e4m3fnuz = float_format<4, 3, 8, specials::fnuz>;
/// E5M2FNUZ: bias 16, no Inf, no -0, NaN = 0x80, max 57344.
using e5m2fnuz = float_format<5, 2, 16, specials::fnuz>;
/// OCP MX FP4 E2M1: bias 1, all codes finite, max 6.
using e2m1 = float_format<2, 1, 1, specials::finite>;
/// OCP MX FP6 E2M3: bias 1, all codes finite, max 7.5.
using e2m3 = float_format<2, 3, 1, specials::finite>;
/// OCP MX FP6 E3M2: bias 3, all codes finite, max 28.
using e3m2 = float_format<3, 2, 3, specials::finite>;
/// OCP MX E8M0 scale: unsigned, 2^(code - 127) for codes 0..254 (2^-127 .. 2^127), 0xFF = NaN, no zero.
using ue8m0 = float_format<8, 0, 127, specials::exponent_only, false>;

/// Trait: is T an octet::float_format?
template <class T>
struct is_float_format : std::false_type {};
template <int E, int M, int B, specials S, bool Sg>
struct is_float_format<float_format<E, M, B, S, Sg>> : std::true_type {};
template <class T>
inline constexpr bool is_float_format_v = is_float_format<T>::value;

/// Human-readable name of a named format (or "custom").
template <class Fmt>
constexpr const char* format_name() {
    if constexpr (std::is_same_v<Fmt, e4m3>)
        return "e4m3";
    else if constexpr (std::is_same_v<Fmt, e5m2>)
        return "e5m2";
    else if constexpr (std::is_same_v<Fmt, e4m3fnuz>)
        return "e4m3fnuz";
    else if constexpr (std::is_same_v<Fmt, e5m2fnuz>)
        return "e5m2fnuz";
    else if constexpr (std::is_same_v<Fmt, e2m1>)
        return "e2m1";
    else if constexpr (std::is_same_v<Fmt, e2m3>)
        return "e2m3";
    else if constexpr (std::is_same_v<Fmt, e3m2>)
        return "e3m2";
    else if constexpr (std::is_same_v<Fmt, ue8m0>)
        return "ue8m0";
    else
        return "custom";
}

}  // namespace octet
