// The k-grouped pairs of scaled_grouped_mm_k (grouped_common.hpp): the weight gradient.
#include "grouped_common.hpp"

namespace octet_torch::grouped {

at::Tensor serve_k(std::string_view a, std::string_view b, const k_args& m) {
    namespace r = octet::recipes;
#define OCTET_TORCH_PAIR(ra, rb) \
    if (a == #ra && b == #rb) return run_k<r::ra, r::rb>(m);
    OCTET_TORCH_GROUPED_K_PAIRS(OCTET_TORCH_PAIR)
#undef OCTET_TORCH_PAIR
    return {};
}

}  // namespace octet_torch::grouped
