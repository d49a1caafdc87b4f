// The scaled GEMM's per-tensor, per-row and DeepSeek-V3 block pairs (see gemm_common.hpp).
#include "gemm_common.hpp"

namespace octet_torch {

at::Tensor serve_fp8_pairs(std::string_view a, std::string_view b, const mm_args& m) {
    namespace r = octet::recipes;
#define OCTET_TORCH_PAIR(ra, rb) \
    if (a == #ra && b == #rb) return run_pair<r::ra, r::rb>(m);
    OCTET_TORCH_PAIR(tensorwise_e4m3, tensorwise_e4m3)
    OCTET_TORCH_PAIR(tensorwise_e4m3, tensorwise_e5m2)
    OCTET_TORCH_PAIR(tensorwise_e5m2, tensorwise_e4m3)
    OCTET_TORCH_PAIR(tensorwise_e5m2, tensorwise_e5m2)
    OCTET_TORCH_PAIR(rowwise_e4m3, rowwise_e4m3)
    OCTET_TORCH_PAIR(blockwise_1x128, blockwise_128x128)
    OCTET_TORCH_PAIR(blockwise_1x128, blockwise_1x128)
#undef OCTET_TORCH_PAIR
    return {};
}

}  // namespace octet_torch
