// octet/interpret/fp8.hpp: the interpreter's own FP8 element types and their decoding, written from the
// PTX ISA's description of the formats (chapter "Instruction Operands" / "Types", section "Alternate
// Floating-Point Data Formats", 5.2.3 in PTX ISA 8.x), not from octet's format rules: the interpreter
// is a model of the hardware, and the library it checks must not share its numerics.
//
// The ISA's words, as used here: an 8-bit floating-point value is a sign bit S, an exponent field E and
// a mantissa field M; a value with E != 0 is normal, (-1)^S * 2^(E - bias) * 1.M, and one with E == 0
// subnormal, (-1)^S * 2^(1 - bias) * 0.M.
//   .e4m3: 4 exponent bits, 3 mantissa bits, bias 7. No infinities: only S.1111.111 is NaN, and
//          S.1111.000 .. S.1111.110 are normal numbers, so the largest magnitude is 1.75 * 2^8 = 448.
//   .e5m2: 5 exponent bits, 2 mantissa bits, bias 15, special values as in IEEE 754: S.11111.00 is
//          an infinity, S.11111.01 .. S.11111.11 are NaNs; the largest finite magnitude is 57344.
// Each FP8 value is exact in float (and in double). A NaN code decodes to the models' canonical NaN
// (below), whatever its sign: the ISA leaves a NaN operand's payload unobserved (the results are NaN).
//
// The element types are tags for the models' templates (mma.sync and wgmma's .e4m3 / .e5m2 operands,
// ptx_models.hpp); octet's seam (octet/cuda/interpret_seam.hpp) maps its own format types onto them.
// This header depends on the standard library only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace octet {
namespace interpret {

/// The NaN the models return for a NaN result (the PTX ISA: "canonical NaN", bits 0x7FFFFFFF for
/// .f32 results of the floating-point instructions).
inline float canonical_nan() {
    static_assert(std::numeric_limits<float>::is_iec559, "the models need IEEE 754 binary32 floats");
    const std::uint32_t bits = 0x7FFFFFFFu;
    float f;
    static_assert(sizeof f == sizeof bits, "float is 32 bits");
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

namespace ptx {

/// The PTX element type .e4m3 (a tag: the bits travel as std::uint8_t).
struct e4m3 {
    static constexpr const char* name = "e4m3";
    static constexpr int exponent_bits = 4, mantissa_bits = 3, bias = 7;
    static constexpr bool has_infinity = false;
};
/// The PTX element type .e5m2.
struct e5m2 {
    static constexpr const char* name = "e5m2";
    static constexpr int exponent_bits = 5, mantissa_bits = 2, bias = 15;
    static constexpr bool has_infinity = true;
};

/// The value of code `c` of element type F, as the ISA's section above defines it.
template <class F>
inline float decode(std::uint8_t c) {
    constexpr unsigned e_max = (1u << F::exponent_bits) - 1u, m_max = (1u << F::mantissa_bits) - 1u;
    const bool negative = (c & 0x80u) != 0;
    const unsigned e = (c >> F::mantissa_bits) & e_max, m = c & m_max;
    float magnitude;
    if (F::has_infinity && e == e_max) {  // IEEE-like: all-ones exponent is Inf (M = 0) or NaN
        if (m != 0) return canonical_nan();
        magnitude = std::numeric_limits<float>::infinity();
    } else if (!F::has_infinity && e == e_max && m == m_max) {  // e4m3: S.1111.111 is the one NaN
        return canonical_nan();
    } else if (e == 0) {  // subnormal: 2^(1 - bias) * M / 2^mantissa_bits
        magnitude = std::ldexp(static_cast<float>(m), 1 - F::bias - F::mantissa_bits);
    } else {  // normal: 2^(E - bias) * (2^mantissa_bits + M) / 2^mantissa_bits
        magnitude = std::ldexp(static_cast<float>((1u << F::mantissa_bits) + m),
                               static_cast<int>(e) - F::bias - F::mantissa_bits);
    }
    return negative ? -magnitude : magnitude;
}

}  // namespace ptx

}  // namespace interpret
}  // namespace octet
