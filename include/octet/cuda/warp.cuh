// octet/cuda/warp.cuh: warp-level reductions shared by the kernels.
#pragma once

#include <cmath>

#include "octet/config.hpp"

namespace octet {
namespace cuda {

#if defined(__CUDACC__) || defined(OCTET_INTERPRET)  // device code, or host code under the interpreter
/// The maximum of `v` over aligned groups of `lanes` lanes (a power of two, at most 32), returned
/// to every lane of the group; the whole warp must take part. fmaxf's rule applies: a NaN loses
/// to any number, so callers that must see NaN test for it themselves.
OCTET_DEVICE float warp_max(float v, unsigned lanes) {
    for (unsigned offset = lanes / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
    return v;
}
#endif

}  // namespace cuda
}  // namespace octet
