// The scaled GEMM's MX and NVFP4 pairs (see gemm_common.hpp).
#include "gemm_common.hpp"

namespace octet_torch {

at::Tensor serve_narrow_pairs(std::string_view a, std::string_view b, const mm_args& m) {
    namespace r = octet::recipes;
#define OCTET_TORCH_PAIR(ra, rb) \
    if (a == #ra && b == #rb) return run_pair<r::ra, r::rb>(m);
    OCTET_TORCH_PAIR(mxfp8_e4m3, mxfp8_e4m3)
    OCTET_TORCH_PAIR(mxfp8_e4m3, mxfp8_e5m2)
    OCTET_TORCH_PAIR(mxfp8_e5m2, mxfp8_e4m3)
    OCTET_TORCH_PAIR(mxfp8_e5m2, mxfp8_e5m2)
    OCTET_TORCH_PAIR(mxfp6_e2m3, mxfp6_e2m3)
    OCTET_TORCH_PAIR(mxfp6_e3m2, mxfp6_e3m2)
    OCTET_TORCH_PAIR(mxfp4, mxfp4)
    OCTET_TORCH_PAIR(nvfp4, nvfp4)
#undef OCTET_TORCH_PAIR
    return {};
}

}  // namespace octet_torch
