// The scaled GEMM (octet/gemm/scaled_gemm.hpp) as a torch op:
//   octet::scaled_mm(a_codes, a_scales, a_tensor_scale, a_recipe, b_codes, b_scales, b_tensor_scale,
//                    b_recipe, k, bias, c, alpha, beta, out_dtype, promotion_interval) -> D (M x N)
// D = alpha * dequant(A) dequant(B)^T (+ beta C) + bias, with A the M x K and B the N x K quantized
// copies (both K-major: pass a K x N weight's column-wise copy as B). Serves the named training
// pairs (registry.hpp's OCTET_TORCH_GEMM_PAIRS_*); they are instantiated in the shards
// gemm_<shard>.cpp generated from OCTET_TORCH_GEMM_SHARDS.
//   octet::scaled_mm_pairs() -> str[]: the served pairs' recipes, A's and B's of each pair in turn
//       (Python's SCALED_MM_PAIRS).
#include <cmath>
#include <limits>

#include "gemm_common.hpp"

namespace octet_torch {
namespace {

/// The recipe a copy multiplies as (gemm_common.hpp): mxfp8_e4m3_ceil maps to mxfp8_e4m3; an
/// unknown name raises ValueError naming the argument.
std::string_view gemm_recipe(std::string_view name, const char* arg) {
    static constexpr std::string_view known[] = {
        "tensorwise_e4m3", "tensorwise_e5m2", "rowwise_e4m3", "columnwise_e4m3", "blockwise_1x128", "blockwise_128x128",
        "mxfp8_e4m3",      "mxfp8_e5m2",      "mxfp6_e2m3",   "mxfp6_e3m2",      "mxfp4",           "nvfp4"};
    std::string_view base = name;
    if (base == "mxfp8_e4m3_ceil") base = "mxfp8_e4m3";
    for (std::string_view k : known)
        if (base == k) return base;
    TORCH_CHECK_VALUE(false, where("scaled_mm", arg), "is '", std::string(name), "'; pass one of ",
                      joined(recipe_names));
}

at::Tensor scaled_mm(const at::Tensor& a_codes, const at::Tensor& a_scales, const at::Tensor& a_tensor_scale,
                     c10::string_view a_recipe, const at::Tensor& b_codes, const at::Tensor& b_scales,
                     const at::Tensor& b_tensor_scale, c10::string_view b_recipe, int64_t k,
                     const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& c, double alpha,
                     double beta, at::ScalarType out_dtype, int64_t promotion_interval) {
    constexpr const char* op = "scaled_mm";
    const c10::DeviceType device = kernel_device(a_codes, op, "a_codes");
    const std::string_view ra = gemm_recipe(a_recipe, "a_recipe"), rb = gemm_recipe(b_recipe, "b_recipe");
    TORCH_CHECK_TYPE(out_dtype == at::kFloat || out_dtype == at::kBFloat16 || out_dtype == at::kHalf,
                     where(op, "out_dtype"), "is ", out_dtype, "; pass torch.float32, torch.bfloat16 or torch.float16");
    TORCH_CHECK_VALUE(k >= 0, where(op, "k"), "is ", k, "; pass the common column count K of both copies");
    TORCH_CHECK_VALUE(promotion_interval >= 1 && promotion_interval <= std::numeric_limits<int>::max(),
                      where(op, "promotion_interval"), "is ", promotion_interval,
                      "; pass a positive number of K elements (128 is DeepSeek-V3's)");
    TORCH_CHECK_VALUE(std::isfinite(alpha) && std::isfinite(beta), where(op, "alpha/beta"), "are ", alpha, " and ",
                      beta, "; pass finite values");
    TORCH_CHECK_VALUE(a_codes.dim() == 2 && b_codes.dim() == 2, where(op, "a_codes/b_codes"),
                      "must be 2-D tensors of codes as octet.quantize returns them");
    if (bias) {
        check_tensor(*bias, op, "bias", {at::kFloat}, device);
        TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == b_codes.size(0) && bias->is_contiguous(),
                          where(op, "bias"), "has shape ", bias->sizes(),
                          "; pass a contiguous float32 vector of N = ", b_codes.size(0),
                          " entries (one per output column)");
    }
    if (c) check_tensor(*c, op, "c", {out_dtype}, device);
    const mm_args m{a_codes,
                    a_scales,
                    a_tensor_scale,
                    b_codes,
                    b_scales,
                    b_tensor_scale,
                    k,
                    bias ? &*bias : nullptr,
                    c ? &*c : nullptr,
                    alpha,
                    beta,
                    out_dtype,
                    promotion_interval,
                    device};
    at::Tensor d;
#define OCTET_TORCH_GEMM_SERVE(shard, pairs) \
    if (!d.defined()) d = serve_##shard##_pairs(ra, rb, m);
    OCTET_TORCH_GEMM_SHARDS(OCTET_TORCH_GEMM_SERVE)
#undef OCTET_TORCH_GEMM_SERVE
    TORCH_CHECK_VALUE(d.defined(), where(op, "a_recipe/b_recipe"), "are ", std::string(a_recipe), " x ",
                      std::string(b_recipe), ", a pair this op does not serve; it serves ", joined(served_pairs),
                      " (mxfp8_e4m3_ceil counts as mxfp8_e4m3)");
    return d;
}

std::vector<std::string> scaled_mm_pairs() {
    std::vector<std::string> names;
#define OCTET_TORCH_GEMM_PAIR(ra, rb) names.insert(names.end(), {#ra, #rb});
#define OCTET_TORCH_GEMM_SHARD_PAIRS(shard, pairs) pairs(OCTET_TORCH_GEMM_PAIR)
    OCTET_TORCH_GEMM_SHARDS(OCTET_TORCH_GEMM_SHARD_PAIRS)
#undef OCTET_TORCH_GEMM_SHARD_PAIRS
#undef OCTET_TORCH_GEMM_PAIR
    return names;
}

}  // namespace
}  // namespace octet_torch

TORCH_LIBRARY_FRAGMENT(octet, m) {
    m.def(
        "scaled_mm(Tensor a_codes, Tensor a_scales, Tensor a_tensor_scale, str a_recipe, Tensor b_codes, Tensor "
        "b_scales, Tensor b_tensor_scale, str b_recipe, int k, Tensor? bias=None, Tensor? c=None, float alpha=1.0, "
        "float beta=0.0, ScalarType out_dtype=float, int promotion_interval=128) -> Tensor");
    m.def("scaled_mm_pairs() -> str[]");
}

TORCH_LIBRARY_IMPL(octet, CompositeExplicitAutograd, m) {
    m.impl("scaled_mm_pairs", &octet_torch::scaled_mm_pairs);
}

TORCH_LIBRARY_IMPL(octet, CPU, m) {
    m.impl("scaled_mm", &octet_torch::scaled_mm);
}

// Without CUDA kernels the same function answers a CUDA tensor with an error that says so.
TORCH_LIBRARY_IMPL(octet, CUDA, m) {
    m.impl("scaled_mm", &octet_torch::scaled_mm);
}
