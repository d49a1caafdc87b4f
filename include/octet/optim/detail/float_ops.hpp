// octet/optim/detail/float_ops.hpp: IEEE float operations that give the same bits on host and
// device, and a log2/exp2 pair built only from them.
//
// The optimizer's promise is that the host path and the CUDA kernel produce the same bits. Two
// things break that in ordinary code: the compilers fuse a*b+c into one fma on one side and not
// on the other (nvcc by default, g++ under -ffp-contract=fast with an FMA target), and the math
// libraries' log2f/exp2f/powf differ between glibc and CUDA. So the optimizer's numerics are
// written with these helpers only:
//   * every multiply-add is an explicit fma_rn; no product is ever added to anything otherwise,
//     so there is nothing left for a compiler to contract;
//   * on the device the helpers are the _rn intrinsics (IEEE round-to-nearest whatever
//     -use_fast_math, -prec-div or -fmad say); on the host they are the plain operators and
//     std::fma / std::sqrt, which are IEEE;
//   * log2_rn / exp2_rn are short polynomials over these operations (about 1e-7 relative), so
//     they are bit-identical on host and device (exp2's lives in core/rounded.hpp, rn::exp2).
// Not supported: host builds with -ffast-math (or -Ofast), and device builds with -ftz=true,
// which flush the subnormal moments the host keeps.
#pragma once

#include <cmath>
#include <cstdint>

#include "octet/config.hpp"
#include "octet/core/bits.hpp"
#include "octet/core/rounded.hpp"

/// OCTET_HD, plus always-inline on host compilers: the optimizer's per-element rules must inline
/// into their loops (which then vectorize) even in translation units where the inliner's budget
/// runs out. Under nvcc OCTET_OPTIM_HD already means __forceinline__.
#if defined(__CUDACC__)
#define OCTET_OPTIM_HD OCTET_HD
#elif defined(__GNUC__) || defined(__clang__)
#define OCTET_OPTIM_HD inline __attribute__((always_inline))
#else
#define OCTET_OPTIM_HD inline
#endif

/// Unroll the per-lane loops of the device pass (8 elements); on the host the same loops run over
/// whole blocks and are left to the vectorizer.
#if defined(__CUDA_ARCH__)
#define OCTET_OPTIM_UNROLL _Pragma("unroll")
#else
#define OCTET_OPTIM_UNROLL
#endif

namespace octet {
namespace optim_detail {

// The IEEE operations themselves live in octet/core/rounded.hpp; the optimizer's names for them:
OCTET_OPTIM_HD float mul_rn(float a, float b) {
    return rn::mul(a, b);
}
OCTET_OPTIM_HD float add_rn(float a, float b) {
    return rn::add(a, b);
}
OCTET_OPTIM_HD float sub_rn(float a, float b) {
    return rn::sub(a, b);
}
OCTET_OPTIM_HD float div_rn(float a, float b) {
    return rn::div(a, b);
}
OCTET_OPTIM_HD float sqrt_rn(float a) {
    return rn::sqrt(a);
}
OCTET_OPTIM_HD float fma_rn(float a, float b, float c) {
    return rn::fma(a, b, c);
}
OCTET_OPTIM_HD float floor_rn(float a) {
    return rn::floor(a);
}
OCTET_OPTIM_HD float abs_rn(float a) {
    return abs_float(a);
}
OCTET_OPTIM_HD float max_rn(float a, float b) {
    return a > b ? a : b;
}
OCTET_OPTIM_HD float min_rn(float a, float b) {
    return a < b ? a : b;
}

/// r * r for r >= 0, except that a positive r never gives 0 (the smallest subnormal instead):
/// how the 8-bit codecs turn their square-root domain back into a second moment.
OCTET_OPTIM_HD float square_floor(float r) {
    const float s = mul_rn(r, r);
    return bits_to_float(float_to_bits(s) | static_cast<std::uint32_t>((r > 0.0f) & (s == 0.0f)));
}

/// log2(a) for finite a > 0 (subnormals included): error at most two float ulps of the result plus
/// 5e-8 (measured: 2 ulps + 3e-8 on 2e7 random floats). a <= 0 or non-finite inputs are outside
/// the contract (callers test for zero first).
OCTET_OPTIM_HD float log2_rn(float a) {
    // selects rather than branches, so that host loops vectorize
    const bool subnormal = (float_to_bits(a) & 0x7F800000u) == 0u;  // scale by 2^24 (exact) first
    const std::uint32_t u = float_to_bits(subnormal ? mul_rn(a, 16777216.0f) : a);
    int e = static_cast<int>(u >> 23) - (subnormal ? 127 + 24 : 127);
    // mantissa m in [sqrt(1/2), sqrt(2)): a = m * 2^e
    std::uint32_t mb = (u & 0x007FFFFFu) | 0x3F800000u;
    const bool high = mb > 0x3FB504F3u;  // m > sqrt(2): halve it
    mb -= high ? 0x00800000u : 0u;
    e += high ? 1 : 0;
    const float m = bits_to_float(mb);
    // log(m) = 2 atanh(t), t = (m - 1) / (m + 1), |t| < 0.1716: odd series to t^9 (error < 1e-9)
    const float t = div_rn(sub_rn(m, 1.0f), add_rn(m, 1.0f));
    const float s = mul_rn(t, t);
    // coefficients 2 / (k ln 2) for k = 1, 3, 5, 7, 9
    float p = 0.32059889f;          // 2/(9 ln2)
    p = fma_rn(p, s, 0.41219858f);  // 2/(7 ln2)
    p = fma_rn(p, s, 0.57707801f);  // 2/(5 ln2)
    p = fma_rn(p, s, 0.96179669f);  // 2/(3 ln2)
    p = fma_rn(p, s, 2.88539008f);  // 2/ln2
    return fma_rn(t, p, static_cast<float>(e));
}

/// 2^y for any float y: rn::exp2 (core/rounded.hpp), the one copy of the polynomial.
OCTET_OPTIM_HD float exp2_rn(float y) {
    return rn::exp2(y);
}

}  // namespace optim_detail
}  // namespace octet
