// octet/format/encode.hpp: the conversion core, one OCTET_HD definition for host and device.
//
//   std::uint8_t octet::encode<Fmt, Round = round::nearest_even, Overflow = overflow::saturate>(float x)
//   std::uint8_t octet::encode<Fmt, round::stochastic, Overflow>(float x, std::uint32_t random_bits)
//   float        octet::decode<Fmt>(std::uint8_t code)
//
// Inputs may also be octet::bf16 or octet::fp16 bit patterns; they widen to float exactly, so
// the result is rounded once.
//
// Numerics contract (tested exhaustively against CUDA's cuda_fp8.h / cuda_fp6.h / cuda_fp4.h
// where the toolkit offers the mode, and against a float64 brute-force reference elsewhere):
//   * Zero: +0 -> +0 and -0 -> -0 where the format has -0; fnuz formats have no -0, so -0 and
//     negative values that round to zero give +0 (the negative-zero code is their NaN).
//   * Subnormals: the format's subnormals are produced with the same rounding as normals; float
//     subnormal inputs are honoured (they are values, not zero).
//   * Ties: nearest_even picks the neighbour whose code is even (IEEE roundTiesToEven).
//   * Largest finite: rounding decides first, then overflow: a value is overflowed when its
//     rounded magnitude (exponent range unbounded) exceeds max_finite. Under nearest_even,
//     E4M3's max 448 holds values up to and including 464 (the tie goes to the even 448), while
//     E5M2's 57344 overflows from 61440 on (the tie goes to the even, larger, 65536).
//   * Overflow: overflow::saturate clamps to +-max_finite, Inf inputs included (this is CUDA's
//     __NV_SATFINITE). overflow::to_nonfinite gives +-Inf where the format has Inf; E4M3 (nan_only)
//     gives the NaN code with the input's sign (0x7F / 0xFF, as CUDA's __NV_NOSAT); fnuz gives its
//     single NaN 0x80. Under toward_zero, and under up/down on the side that moves toward zero,
//     finite inputs give +-max_finite instead (IEEE 754 7.4). Inf inputs give +-Inf / NaN.
//     A format with neither Inf nor NaN (FP6, FP4) only accepts overflow::saturate.
//   * NaN: any NaN input encodes to the canonical positive NaN code (E4M3 0x7F, E5M2 0x7F, fnuz
//     0x80, ue8m0 0xFF). Formats without NaN (FP6/FP4) give +max_finite, as CUDA does.
//     decode() of any NaN code returns the canonical float NaN 0x7FFFFFFF.
//   * Unsigned formats (ue8m0) encode the magnitude: the sign of the input is ignored, as in
//     CUDA's __nv_cvt_float_to_e8m0. ue8m0 has no zero: 0 and every value below 2^-127 encode to
//     code 0 (2^-127) under every rounding; rounding up moves (2^-127, 2^-126] to code 1.
//     Above 2^127 (under toward_zero: never for a finite float), saturate gives 0xFE (2^127) and
//     to_nonfinite gives 0xFF (NaN). nearest_even for ue8m0 is nearest in linear space with
//     ties (1.5 * 2^e) going to the even code.
//   * Stochastic rounding rounds the magnitude away from zero with probability frac, where frac
//     is the distance to the smaller neighbour in units of the gap, truncated to 32 bits:
//     away iff random_bits + floor(frac * 2^32) >= 2^32. Exact and unbiased for every input at
//     most 8 binades below the format's smallest subnormal.
#pragma once

#include <cstdint>
#include <type_traits>

#include "octet/config.hpp"
#include "octet/core/bits.hpp"
#include "octet/format/float_format.hpp"
#include "octet/format/rounding.hpp"

namespace octet {
namespace detail {

/// Branch-free select: cond ? if_true : if_false. Written with masks so that GCC's if-conversion
/// does not turn a chain of selects back into a many-way branch (which stops vectorization).
OCTET_HD std::uint32_t select_if(bool cond, std::uint32_t if_true, std::uint32_t if_false) {
    return if_false ^ ((if_true ^ if_false) & (0u - static_cast<std::uint32_t>(cond)));
}

/// Whether to add one to the truncated magnitude. `q` is the truncated magnitude code, `frac`
/// the dropped part in units of 2^-32 of the gap, `inexact` whether anything was dropped.
template <class Round>
OCTET_HD bool round_increment(std::uint32_t q, std::uint32_t frac, bool inexact, bool negative,
                              std::uint32_t random_bits) {
    if constexpr (std::is_same_v<Round, round::nearest_even>) {
        (void)inexact, (void)negative, (void)random_bits;
        return (frac > 0x80000000u) | ((frac == 0x80000000u) & ((q & 1u) != 0u));
    } else if constexpr (std::is_same_v<Round, round::toward_zero>) {
        (void)q, (void)frac, (void)inexact, (void)negative, (void)random_bits;
        return false;
    } else if constexpr (std::is_same_v<Round, round::up>) {
        (void)q, (void)frac, (void)random_bits;
        return inexact & !negative;
    } else if constexpr (std::is_same_v<Round, round::down>) {
        (void)q, (void)frac, (void)random_bits;
        return inexact & negative;
    } else {
        static_assert(std::is_same_v<Round, round::stochastic>, "octet: unknown rounding policy");
        (void)q, (void)inexact, (void)negative;
        return random_bits > ~frac;  // random_bits + frac >= 2^32
    }
}

/// The code of an overflowed Inf-or-NaN result for the format (sign already in `sign`).
template <class Fmt>
OCTET_HD std::uint32_t nonfinite_code(std::uint32_t sign) {
    if constexpr (Fmt::has_inf)
        return sign | Fmt::inf_code;
    else if constexpr (Fmt::special_codes == specials::fnuz)
        return Fmt::nan_code;
    else
        return sign | Fmt::nan_code;
}

template <class Fmt, class Overflow>
OCTET_HD constexpr void check_policies() {
    static_assert(is_float_format_v<Fmt>, "octet::encode: Fmt must be an octet::float_format<...>");
    static_assert(is_overflow_v<Overflow>,
                  "octet::encode: Overflow must be overflow::saturate or overflow::to_nonfinite");
    static_assert(Fmt::has_nan || Fmt::has_inf || std::is_same_v<Overflow, overflow::saturate>,
                  "octet::encode: this format has neither Inf nor NaN (FP6/FP4), so overflow::to_nonfinite has "
                  "nothing to produce; use overflow::saturate");
}

/// The code for a finite input whose rounded magnitude exceeds max_finite.
template <class Fmt, class Round, class Overflow>
OCTET_HD std::uint32_t overflow_code(std::uint32_t sign, bool negative) {
    if constexpr (std::is_same_v<Overflow, overflow::saturate>) {
        (void)negative;
        return sign | Fmt::max_code;
    } else if constexpr (std::is_same_v<Round, round::toward_zero>) {
        (void)negative;
        return sign | Fmt::max_code;
    } else if constexpr (std::is_same_v<Round, round::up>) {
        return negative ? (sign | Fmt::max_code) : nonfinite_code<Fmt>(sign);
    } else if constexpr (std::is_same_v<Round, round::down>) {
        return negative ? nonfinite_code<Fmt>(sign) : (sign | Fmt::max_code);
    } else {
        (void)negative;
        return nonfinite_code<Fmt>(sign);
    }
}

template <class Fmt, class Overflow>
OCTET_HD std::uint32_t inf_input_code(std::uint32_t sign) {
    if constexpr (std::is_same_v<Overflow, overflow::saturate>)
        return sign | Fmt::max_code;
    else
        return nonfinite_code<Fmt>(sign);
}

template <class Fmt>
OCTET_HD std::uint32_t nan_input_code() {
    if constexpr (Fmt::has_nan)
        return Fmt::nan_code;
    else
        return Fmt::max_code;  // FP6/FP4: NaN saturates to +max, as CUDA does
}

/// General path: every format except exponent_only, every rounding. 32-bit integer arithmetic
/// with selects only, so that loops over it vectorize.
template <class Fmt, class Round, class Overflow>
OCTET_HD std::uint32_t encode_bits_general(std::uint32_t u, std::uint32_t random_bits) {
    constexpr int M = Fmt::mantissa_bits;
    constexpr int emin = Fmt::emin;
    const std::uint32_t a = u & 0x7FFFFFFFu;
    const bool negative = Fmt::is_signed && (u >> 31) != 0u;
    const std::uint32_t sign = negative ? Fmt::sign_mask : 0u;

    // |x| = sig * 2^(e - 23) with sig < 2^24; the target's quantum at |x| is 2^(te - M).
    const std::uint32_t fe = a >> 23;
    const int e = (fe != 0u ? static_cast<int>(fe) : 1) - 127;
    const std::uint32_t sig = (a & 0x007FFFFFu) | (fe != 0u ? 0x00800000u : 0u);
    const int te = e > emin ? e : emin;
    const int s = te - e + 23 - M;  // |x| / quantum = sig / 2^s, s >= 16
    const std::uint32_t q = s < 32 ? sig >> s : 0u;
    const std::uint32_t frac = s <= 32 ? sig << (32 - s) : (s < 64 ? sig >> (s - 32) : 0u);
    const bool inexact = s < 32 ? (sig & ((1u << s) - 1u)) != 0u : sig != 0u;
    const std::uint32_t mag = (static_cast<std::uint32_t>(te - emin) << M) + q +
                              (round_increment<Round>(q, frac, inexact, negative, random_bits) ? 1u : 0u);

    std::uint32_t code = sign | mag;
    if constexpr (Fmt::special_codes == specials::fnuz) code = select_if(mag == 0u, 0u, code);
    code = select_if(mag > Fmt::max_code, overflow_code<Fmt, Round, Overflow>(sign, negative), code);
    code = select_if(a == 0x7F800000u, inf_input_code<Fmt, Overflow>(sign), code);
    code = select_if(a > 0x7F800000u, nan_input_code<Fmt>(), code);
    return code;
}

/// Nearest-even fast path for formats whose quantum is at least 2^-125 (every float subnormal
/// then rounds to zero, so flush-to-zero modes cannot change a result): the normal range is
/// rebiased and rounded with one integer add, the subnormal range with one float add.
template <class Fmt>
inline constexpr bool has_fast_nearest_even = Fmt::special_codes != specials::exponent_only &&
                                              (Fmt::emin - Fmt::mantissa_bits) >= -125;

template <class Fmt, class Overflow>
OCTET_HD std::uint32_t encode_bits_nearest_fast(std::uint32_t u) {
    constexpr int M = Fmt::mantissa_bits;
    constexpr std::uint32_t min_normal_bits = static_cast<std::uint32_t>(Fmt::emin + 127) << 23;
    constexpr std::uint32_t magic_bits = static_cast<std::uint32_t>(Fmt::emin - M + 23 + 127) << 23;  // ulp = quantum
    constexpr std::uint32_t rebias = static_cast<std::uint32_t>(Fmt::bias - 127) << 23;
    constexpr std::uint32_t half_minus_one = (1u << (22 - M)) - 1u;

    const std::uint32_t a = u & 0x7FFFFFFFu;
    const bool negative = Fmt::is_signed && (u >> 31) != 0u;
    const std::uint32_t sign = negative ? Fmt::sign_mask : 0u;
    const std::uint32_t sub = float_to_bits(bits_to_float(a) + bits_to_float(magic_bits)) - magic_bits;
    const std::uint32_t nrm = (a + rebias + half_minus_one + ((a >> (23 - M)) & 1u)) >> (23 - M);
    const std::uint32_t mag = select_if(a < min_normal_bits, sub, nrm);

    std::uint32_t code = sign | mag;
    if constexpr (Fmt::special_codes == specials::fnuz) code = select_if(mag == 0u, 0u, code);
    code = select_if(mag > Fmt::max_code, overflow_code<Fmt, round::nearest_even, Overflow>(sign, negative), code);
    code = select_if(a == 0x7F800000u, inf_input_code<Fmt, Overflow>(sign), code);
    code = select_if(a > 0x7F800000u, nan_input_code<Fmt>(), code);
    return code;
}

/// exponent_only formats (ue8m0): the code is the rounded binary exponent plus the bias.
template <class Fmt, class Round, class Overflow>
OCTET_HD std::uint32_t encode_bits_exponent_only(std::uint32_t u, std::uint32_t random_bits) {
    const std::uint32_t a = u & 0x7FFFFFFFu;  // unsigned format: the magnitude is encoded
    const std::uint32_t fe = a >> 23;
    if constexpr ((std::is_same_v<Round, round::toward_zero> || std::is_same_v<Round, round::down>)&&Fmt::bias <= 127) {
        // Truncation keeps the float's exponent: float subnormals give bias - 127 <= 0, i.e. code 0.
        (void)random_bits;
        // For ue8m0 (bias 127, codes 0..254) the code is the float's exponent field itself.
        const std::int32_t code = static_cast<std::int32_t>(fe) - 127 + Fmt::bias;
        std::uint32_t out = static_cast<std::uint32_t>(code);
        if constexpr (Fmt::bias < 127) out = select_if(code < 0, 0u, out);
        if constexpr (254 - 127 + Fmt::bias > static_cast<int>(Fmt::max_code))
            out = select_if(code > static_cast<std::int32_t>(Fmt::max_code) && fe != 255u,
                            overflow_code<Fmt, Round, Overflow>(0u, false), out);
        out = select_if(a == 0x7F800000u, inf_input_code<Fmt, Overflow>(0u), out);
        return select_if(a > 0x7F800000u, Fmt::nan_code, out);
    }
    // |x| = 2^e * (1 + frac / 2^32)
    int e;
    std::uint32_t frac;
    bool below_smallest;  // |x| <= 2^-bias: code 0 under every rounding (there is no zero)
    if constexpr (Fmt::bias <= 127) {
        // A float subnormal lies below 2^-126. Where code 0 is 2^-127 (bias 127) it rounds to code
        // 0 or 1 with frac measured from 2^-127; for a smaller bias it is below code 0. Selects
        // only, so loops vectorize.
        const bool subnormal = fe == 0u;
        e = subnormal ? -127 : static_cast<int>(fe) - 127;
        frac = subnormal ? a << 10 : a << 9;
        below_smallest = subnormal ? (Fmt::bias < 127 || a <= 0x00400000u) : false;
    } else {
        if (fe != 0u) {
            e = static_cast<int>(fe) - 127;
            frac = a << 9;
        } else {
            const int lz = count_leading_zeros(a | 1u);
            e = (31 - lz) - 149;
            frac = (a << lz) << 1;
        }
        below_smallest = e < -Fmt::bias || (e == -Fmt::bias && frac == 0u);
    }
    const std::int32_t truncated = e + Fmt::bias;
    const std::int32_t code =
        truncated + static_cast<std::int32_t>(round_increment<Round>(static_cast<std::uint32_t>(truncated), frac,
                                                                     frac != 0u, false, random_bits));
    std::uint32_t out = select_if(code < 0, 0u, static_cast<std::uint32_t>(code));
    out =
        select_if(code > static_cast<std::int32_t>(Fmt::max_code), overflow_code<Fmt, Round, Overflow>(0u, false), out);
    out = select_if(below_smallest, 0u, out);
    out = select_if(a == 0x7F800000u, inf_input_code<Fmt, Overflow>(0u), out);
    out = select_if(a > 0x7F800000u, Fmt::nan_code, out);
    return out;
}

template <class Fmt, class Round, class Overflow>
OCTET_HD std::uint32_t encode_bits(std::uint32_t u, std::uint32_t random_bits) {
    check_policies<Fmt, Overflow>();
    static_assert(is_rounding_v<Round>,
                  "octet::encode: Round must be one of round::nearest_even, toward_zero, up, down, stochastic");
    if constexpr (Fmt::special_codes == specials::exponent_only) {
        return encode_bits_exponent_only<Fmt, Round, Overflow>(u, random_bits);
    } else if constexpr (std::is_same_v<Round, round::nearest_even> && has_fast_nearest_even<Fmt>) {
        (void)random_bits;
        return encode_bits_nearest_fast<Fmt, Overflow>(u);
    } else {
        return encode_bits_general<Fmt, Round, Overflow>(u, random_bits);
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
// Hardware conversion (sm_89+): cvt.rn.satfinite to E4M3/E5M2 gives the same bits as the
// software path for nearest_even + saturate; a gpu test checks every float input.
template <class Fmt>
inline constexpr bool has_hardware_cvt = std::is_same_v<Fmt, e4m3> || std::is_same_v<Fmt, e5m2>;

template <class Fmt>
__device__ __forceinline__ std::uint16_t hardware_cvt_x2(float lo, float hi) {
    std::uint16_t out;
    if constexpr (std::is_same_v<Fmt, e4m3>) {
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(out) : "f"(lo), "f"(hi));
    } else {
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %2, %1;" : "=h"(out) : "f"(lo), "f"(hi));
    }
    return out;
}
#endif

template <class Fmt, class Round, class Overflow>
inline constexpr bool uses_hardware_cvt =
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    has_hardware_cvt<Fmt>&& std::is_same_v<Round, round::nearest_even>&& std::is_same_v<Overflow, overflow::saturate>;
#else
    false;
#endif

}  // namespace detail

/// Encode a float into `Fmt` with the given rounding and overflow policies.
template <class Fmt, class Round = round::nearest_even, class Overflow = overflow::saturate>
OCTET_HD std::uint8_t encode(float x) {
    static_assert(!std::is_same_v<Round, round::stochastic>,
                  "octet::encode: round::stochastic takes 32 random bits: encode<Fmt, round::stochastic>(x, bits)");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if constexpr (detail::uses_hardware_cvt<Fmt, Round, Overflow>)
        return static_cast<std::uint8_t>(detail::hardware_cvt_x2<Fmt>(x, 0.0f) & 0xFFu);
    else
#endif
        return static_cast<std::uint8_t>(detail::encode_bits<Fmt, Round, Overflow>(float_to_bits(x), 0u));
}

/// Encode with stochastic rounding; `random_bits` must be uniform over 32 bits (see philox.hpp).
template <class Fmt, class Round, class Overflow = overflow::saturate>
OCTET_HD std::uint8_t encode(float x, std::uint32_t random_bits) {
    static_assert(std::is_same_v<Round, round::stochastic>,
                  "octet::encode: only round::stochastic takes random bits; drop the second argument");
    return static_cast<std::uint8_t>(detail::encode_bits<Fmt, Round, Overflow>(float_to_bits(x), random_bits));
}

template <class Fmt, class Round = round::nearest_even, class Overflow = overflow::saturate>
OCTET_HD std::uint8_t encode(bf16 x) {
    return encode<Fmt, Round, Overflow>(to_float(x));
}
template <class Fmt, class Round = round::nearest_even, class Overflow = overflow::saturate>
OCTET_HD std::uint8_t encode(fp16 x) {
    return encode<Fmt, Round, Overflow>(to_float(x));
}
template <class Fmt, class Round, class Overflow = overflow::saturate>
OCTET_HD std::uint8_t encode(bf16 x, std::uint32_t random_bits) {
    return encode<Fmt, Round, Overflow>(to_float(x), random_bits);
}
template <class Fmt, class Round, class Overflow = overflow::saturate>
OCTET_HD std::uint8_t encode(fp16 x, std::uint32_t random_bits) {
    return encode<Fmt, Round, Overflow>(to_float(x), random_bits);
}

/// Decode a code of `Fmt` into float (exact: every octet format value is a float).
template <class Fmt>
OCTET_HD float decode(std::uint8_t code) {
    static_assert(is_float_format_v<Fmt>, "octet::decode: Fmt must be an octet::float_format<...>");
    constexpr int M = Fmt::mantissa_bits;
    const std::uint32_t c = code & Fmt::code_mask;
    if constexpr (Fmt::special_codes == specials::exponent_only) {
        const int e = static_cast<int>(c) - Fmt::bias;
        return c == Fmt::nan_code ? canonical_nan() : exp2i(e);
    } else {
        const std::uint32_t sign_bit = (c & Fmt::sign_mask) != 0u ? 0x80000000u : 0u;
        const std::uint32_t mag = c & Fmt::magnitude_mask;
        const std::uint32_t expf = mag >> M;
        const std::uint32_t man = mag & ((1u << M) - 1u);
        const std::uint32_t normal_bits =
            (static_cast<std::uint32_t>(static_cast<int>(expf) - Fmt::bias + 127) << 23) | (man << (23 - M));
        // subnormal: man * 2^(emin - M), built in integers: (float)man is exact, then the power of
        // two is added to its exponent field (no float multiply, so flush-to-zero cannot touch it)
        std::uint32_t sub_bits;
        if constexpr (Fmt::emin - M >= -126) {
            const std::uint32_t man_as_float = float_to_bits(static_cast<float>(static_cast<int>(man)));
            sub_bits =
                detail::select_if(man == 0u, 0u, man_as_float + (static_cast<std::uint32_t>(Fmt::emin - M) << 23));
        } else {
            const int lead = man != 0u ? 31 - count_leading_zeros(man) : 0;
            const int ex = Fmt::emin - M + lead;
            sub_bits = man == 0u    ? 0u
                       : ex >= -126 ? (static_cast<std::uint32_t>(ex + 127) << 23) | ((man << (23 - lead)) & 0x7FFFFFu)
                                    : man << ((Fmt::emin - M + 149) & 31);
        }
        std::uint32_t bits = sign_bit | detail::select_if(expf != 0u, normal_bits, sub_bits);
        if constexpr (Fmt::has_inf) {
            bits = detail::select_if(mag == Fmt::inf_code, sign_bit | 0x7F800000u, bits);
            bits = detail::select_if(mag > Fmt::inf_code, 0x7FFFFFFFu, bits);
        } else if constexpr (Fmt::special_codes == specials::nan_only) {
            bits = detail::select_if(mag == Fmt::nan_code, 0x7FFFFFFFu, bits);
        } else if constexpr (Fmt::special_codes == specials::fnuz) {
            bits = detail::select_if(c == Fmt::nan_code, 0x7FFFFFFFu, bits);
        }
        const float value = bits_to_float(bits);
        return value;
    }
}

/// True if `code` is a NaN of `Fmt`.
template <class Fmt>
OCTET_HD bool is_nan_code(std::uint8_t code) {
    const std::uint32_t c = code & Fmt::code_mask;
    if constexpr (!Fmt::has_nan)
        return false;
    else if constexpr (Fmt::special_codes == specials::fnuz)
        return c == Fmt::nan_code;
    else if constexpr (Fmt::has_inf)
        return (c & Fmt::magnitude_mask) > Fmt::inf_code;
    else
        return (c & Fmt::magnitude_mask) == Fmt::nan_code;
}

/// True if `code` is +-Inf of `Fmt`.
template <class Fmt>
OCTET_HD bool is_inf_code(std::uint8_t code) {
    if constexpr (!Fmt::has_inf)
        return false;
    else
        return (code & Fmt::magnitude_mask) == Fmt::inf_code;
}

}  // namespace octet
