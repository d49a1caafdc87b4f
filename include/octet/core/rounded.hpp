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

}  // namespace rn
}  // namespace octet
