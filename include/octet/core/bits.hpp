// octet/core/bits.hpp: bit-level views of float, small exact float rules (is-finite, abs, 2^e),
// and the two 16-bit storage types.
//
// `octet::bf16` and `octet::fp16` are plain 16-bit storage (the raw bits), layout-compatible
// with CUDA's __nv_bfloat16 and __half, so that host code needs no CUDA header. Conversion
// to float is exact; conversion from float rounds to nearest-even and keeps NaN a NaN.
#pragma once

#include <cstdint>
#include <cstring>

#include "octet/config.hpp"

namespace octet {

struct bf16 {
    std::uint16_t bits;
};
struct fp16 {
    std::uint16_t bits;
};

OCTET_HD std::uint32_t float_to_bits(float x) {
#if OCTET_DEVICE_PASS
    return __float_as_uint(x);
#else
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
#endif
}

OCTET_HD float bits_to_float(std::uint32_t u) {
#if OCTET_DEVICE_PASS
    return __uint_as_float(u);
#else
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
#endif
}

/// Number of leading zero bits of a non-zero 32-bit value.
OCTET_HD int count_leading_zeros(std::uint32_t v) {
#if OCTET_DEVICE_PASS
    return __clz(static_cast<int>(v));
#elif defined(__GNUC__) || defined(__clang__)
    return __builtin_clz(v);
#else
    int n = 0;
    while (!(v & 0x80000000u)) {
        v <<= 1;
        ++n;
    }
    return n;
#endif
}

/// The canonical NaN octet returns from decodes (CUDA's canonical quiet NaN).
OCTET_HD float canonical_nan() {
    return bits_to_float(0x7FFFFFFFu);
}

OCTET_HD bool is_nan_bits(std::uint32_t u) {
    return (u & 0x7FFFFFFFu) > 0x7F800000u;
}

// ---- small float rules, written once (bit operations: the same result on every compiler and
// under every flag, and they vectorize) ---------------------------------------------------------

/// True for finite x (not NaN, not +-Inf).
OCTET_HD bool is_finite_float(float x) {
    return (float_to_bits(x) & 0x7F800000u) != 0x7F800000u;
}

/// |x| by clearing the sign bit (NaN stays NaN with its payload; -0 gives +0).
OCTET_HD float abs_float(float x) {
    return bits_to_float(float_to_bits(x) & 0x7FFFFFFFu);
}

/// 2^e for an integer e in [-126, 127] (the normal range), exact: one shift, no branch.
OCTET_HD float exp2i_normal(int e) {
    return bits_to_float(static_cast<std::uint32_t>(e + 127) << 23);
}

/// 2^e for an integer e in [-149, 127], exact (subnormal below -126).
OCTET_HD float exp2i(int e) {
    return bits_to_float(e >= -126 ? static_cast<std::uint32_t>(e + 127) << 23 : 1u << ((e + 149) & 31));
}

// ---- bf16 -------------------------------------------------------------------------------

OCTET_HD float to_float(bf16 h) {
    return bits_to_float(static_cast<std::uint32_t>(h.bits) << 16);
}

/// float -> bf16, round to nearest even; NaN stays NaN (quiet, sign kept); overflow gives Inf.
OCTET_HD bf16 to_bf16(float x) {
    std::uint32_t u = float_to_bits(x);
    if (is_nan_bits(u)) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
    u += 0x7FFFu + ((u >> 16) & 1u);
    return bf16{static_cast<std::uint16_t>(u >> 16)};
}

/// float -> bf16 with stochastic rounding: rounds away from zero with probability equal to the
/// dropped fraction of a bf16 ulp, decided by the low 16 of `random_bits` (unbiased; NaN stays
/// NaN; a value within one ulp of the largest bf16 may round to Inf, as IEEE overflow does).
OCTET_HD bf16 to_bf16_stochastic(float x, std::uint32_t random_bits) {
    const std::uint32_t u = float_to_bits(x);
    if (is_nan_bits(u)) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
    if ((u & 0x7FFFFFFFu) == 0x7F800000u) return bf16{static_cast<std::uint16_t>(u >> 16)};
    return bf16{static_cast<std::uint16_t>((u + (random_bits & 0xFFFFu)) >> 16)};
}

// ---- fp16 (IEEE binary16) -----------------------------------------------------------------

/// fp16 -> float, exact (subnormals included).
OCTET_HD float to_float(fp16 h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
    const std::uint32_t exp = (h.bits >> 10) & 0x1Fu;
    const std::uint32_t man = h.bits & 0x3FFu;
    if (exp == 0x1Fu) return bits_to_float(sign | 0x7F800000u | (man << 13));  // Inf / NaN
    if (exp != 0) return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
    // subnormal or zero: man * 2^-24, exact in float
    const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
    return bits_to_float(sign | float_to_bits(mag));
}

/// float -> fp16, round to nearest even; NaN stays NaN; overflow gives Inf.
OCTET_HD fp16 to_fp16(float x) {
    const std::uint32_t u = float_to_bits(x);
    const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    const std::uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return fp16{static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu))};
    if (a >= 0x477FF000u) return fp16{static_cast<std::uint16_t>(sign | 0x7C00u)};  // >= 65520: Inf
    if (a < 0x38800000u) {
        // result is fp16-subnormal (or zero): add a magic number whose ulp is 2^-24
        const float f = bits_to_float(a) + 0.5f;  // 0.5 has ulp 2^-24
        return fp16{static_cast<std::uint16_t>(sign | (float_to_bits(f) - 0x3F000000u))};
    }
    std::uint32_t r = a + 0xC8000FFFu + ((a >> 13) & 1u);  // rebias 127 -> 15, round half even
    return fp16{static_cast<std::uint16_t>(sign | (r >> 13))};
}

}  // namespace octet
