// octet/core/rounded.hpp: IEEE float operations that give the same bits on host and device.
//
// Two things break host/device bit-identity in ordinary code: compilers fuse a*b+c into one fma on
// one side and not on the other (nvcc by default, g++ under -ffp-contract=fast with an FMA target),
// and flags such as --use_fast_math, -prec-div=false or -fmad change device arithmetic. Code that
// promises identical bits writes its arithmetic with these: on the device they are the _rn
// intrinsics (IEEE round-to-nearest whatever the flags say); on the host, the plain operators and
// std::fma / std::sqrt, which are IEEE. Every multiply-add is an explicit rn::fma, so nothing is
// left for a compiler to contract. Not supported: host builds with -ffast-math (or -Ofast).
#pragma once

#include <cmath>

#include "octet/config.hpp"
#include "octet/core/bits.hpp"

/// OCTET_HD, plus always-inline on host compilers: callers put exp2 in loops that must vectorize.
#if defined(__CUDACC__)
#define OCTET_RN_INLINE OCTET_HD
#elif defined(__GNUC__) || defined(__clang__)
#define OCTET_RN_INLINE inline __attribute__((always_inline))
#else
#define OCTET_RN_INLINE inline
#endif

namespace octet {
namespace rn {

OCTET_HD float mul(float a, float b) {
#if OCTET_DEVICE_PASS
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
OCTET_HD float add(float a, float b) {
#if OCTET_DEVICE_PASS
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
OCTET_HD float sub(float a, float b) {
#if OCTET_DEVICE_PASS
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
OCTET_HD float div(float a, float b) {
#if OCTET_DEVICE_PASS
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}
OCTET_HD float sqrt(float a) {
#if OCTET_DEVICE_PASS
    return __fsqrt_rn(a);
#else
    return std::sqrt(a);
#endif
}
OCTET_HD float fma(float a, float b, float c) {
#if OCTET_DEVICE_PASS
    return __fmaf_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
}
OCTET_HD float floor(float a) {
#if OCTET_DEVICE_PASS
    return floorf(a);
#else
    return std::floor(a);
#endif
}

/// 2^f for |f| <= 1/2: e^(f ln 2) by its Taylor series to degree 7 (truncation below 6e-9), as a
/// chain of fmas. The one copy of this polynomial; the same bits on host and device.
OCTET_RN_INLINE float exp2_reduced(float f) {
    float p = 1.5252734e-05f;       // ln2^7 / 7!
    p = fma(p, f, 1.5403530e-04f);  // ln2^6 / 6!
    p = fma(p, f, 1.3333558e-03f);  // ln2^5 / 5!
    p = fma(p, f, 9.6181291e-03f);  // ln2^4 / 4!
    p = fma(p, f, 5.5504109e-02f);  // ln2^3 / 3!
    p = fma(p, f, 2.4022651e-01f);  // ln2^2 / 2!
    p = fma(p, f, 6.9314718e-01f);  // ln2
    return fma(p, f, 1.0f);
}

/// 2^y for any float y, the same bits on host and device: relative error below 2e-7 in the normal
/// range (measured 7e-8); y >= 128 gives +Inf; results below 2^-126 are subnormals within one
/// subnormal step (0 below 2^-150); NaN gives 2^-151 = 0 (callers pass finite values).
OCTET_RN_INLINE float exp2(float y) {
    // Clamping to [-151, 128] keeps every input on one branch-free path: 2^-151 rounds to 0, 2^128
    // overflows to +Inf.
    y = y > -151.0f ? y : -151.0f;
    y = y < 128.0f ? y : 128.0f;
    const float n = sub(add(y, 12582912.0f), 12582912.0f);  // nearest integer, ties to even (1.5 * 2^23 trick)
    const float p = exp2_reduced(sub(y, n));                // y - n is exact, in [-0.5, 0.5]
    // scale by 2^n in two exact halves so that subnormal results round once, at the end
    const int ni = static_cast<int>(n);
    const int n1 = ni / 2;
    return mul(mul(p, exp2i_normal(n1)), exp2i_normal(ni - n1));
}

}  // namespace rn
}  // namespace octet
