// The m-grouped pairs of scaled_grouped_mm and scaled_grouped_mm_quantized (grouped_common.hpp).
#include "grouped_common.hpp"

namespace octet_torch::grouped {

at::Tensor serve_mm(std::string_view a, std::string_view b, const mm_args& m) {
    namespace r = octet::recipes;
#define OCTET_TORCH_PAIR(ra, rb) \
    if (a == #ra && b == #rb) return run_mm<r::ra, r::rb>(m);
    OCTET_TORCH_GROUPED_MM_PAIRS(OCTET_TORCH_PAIR)
#undef OCTET_TORCH_PAIR
    return {};
}

at::Tensor serve_mm_quantized(std::string_view a, std::string_view b, const mm_args& m) {
    namespace r = octet::recipes;
#define OCTET_TORCH_PAIR(ra, rb) \
    if (a == #ra && b == #rb) return run_mm_quantized<r::ra, r::rb>(m);
    OCTET_TORCH_GROUPED_ROW_RECIPES(OCTET_TORCH_PAIR)
#undef OCTET_TORCH_PAIR
    return {};
}

}  // namespace octet_torch::grouped
