// The scaled GEMM's MX and NVFP4 pairs (see gemm_common.hpp).
#include "gemm_common.hpp"

namespace octet_torch {

at::Tensor serve_narrow_pairs(std::string_view a, std::string_view b, const mm_args& m) {
    namespace r = octet::recipes;
#define OCTET_TORCH_PAIR(ra, rb) \
    if (a == #ra && b == #rb) return run_pair<r::ra, r::rb>(m);
    OCTET_TORCH_GEMM_PAIRS_NARROW(OCTET_TORCH_PAIR)
#undef OCTET_TORCH_PAIR
    return {};
}

}  // namespace octet_torch
