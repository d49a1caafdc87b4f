// The grouped scaled GEMM ops (grouped_common.hpp): argument checks that need no recipe, the
// recipe-pair dispatch and the registration. The pairs are instantiated in grouped_mm.cpp and
// grouped_k.cpp; the expert-parallel exchange's in-process reference op is in grouped_exchange.cpp.
#include <limits>

#include "grouped_common.hpp"

namespace octet_torch::grouped {

std::vector<std::size_t> group_sizes_of(const at::Tensor& group_sizes, int64_t groups, int64_t rows, const char* op,
                                        const char* rows_arg) {
    check_tensor(group_sizes, op, "group_sizes", {at::kLong, at::kInt});
    TORCH_CHECK_VALUE(group_sizes.dim() == 1, where(op, "group_sizes"), "has shape ", group_sizes.sizes(),
                      "; pass a 1-D tensor of one row count per group (torch.bincount of the expert indices)");
    TORCH_CHECK_VALUE(groups < 0 || group_sizes.size(0) == groups, where(op, "group_sizes"), "has ",
                      group_sizes.size(0), " entries but b holds ", groups,
                      " experts; pass one size per expert (an expert without tokens has size 0)");
    const at::Tensor s = group_sizes.to(at::kLong).contiguous();
    const int64_t* v = s.data_ptr<int64_t>();
    std::vector<std::size_t> out(static_cast<std::size_t>(s.numel()));
    int64_t sum = 0;
    for (int64_t g = 0; g < s.numel(); ++g) {
        TORCH_CHECK_VALUE(v[g] >= 0, where(op, "group_sizes"), "[", g, "] is ", v[g],
                          "; a group holds a non-negative number of rows");
        TORCH_CHECK_VALUE(v[g] <= std::numeric_limits<int64_t>::max() - sum, where(op, "group_sizes"),
                          "overflows int64 when summed");
        sum += v[g];
        out[static_cast<std::size_t>(g)] = static_cast<std::size_t>(v[g]);
    }
    TORCH_CHECK_VALUE(sum == rows, where(op, "group_sizes"), "sum to ", sum, " but ", rows_arg, " has ", rows,
                      " rows; pass each group's row count, in the order ", rows_arg,
                      " holds the groups (the sizes must sum to its rows)");
    return out;
}

namespace {

void check_recipe_name(std::string_view name, const char* op, const char* arg) {
    for (std::string_view k : {"tensorwise_e4m3", "tensorwise_e5m2", "rowwise_e4m3", "columnwise_e4m3",
                               "blockwise_1x128", "blockwise_128x128", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp8_e4m3_ceil",
                               "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "nvfp4"})
        if (name == k) return;
    TORCH_CHECK_VALUE(false, where(op, arg), "is '", std::string(name), "'; pass one of ", joined(recipe_names));
}

void check_out_dtype(at::ScalarType out_dtype, const char* op) {
    TORCH_CHECK_TYPE(out_dtype == at::kFloat || out_dtype == at::kBFloat16, where(op, "out_dtype"), "is ", out_dtype,
                     "; pass torch.float32 or torch.bfloat16");
}

/// b: G x N x K of a's dtype, each b[g] with rows or columns contiguous.
void check_experts(const at::Tensor& b, int64_t k, at::ScalarType dtype, const char* op, const char* k_arg) {
    check_tensor(b, op, "b", {at::kFloat, at::kBFloat16});
    TORCH_CHECK_TYPE(b.scalar_type() == dtype, where(op, "b"), "has dtype ", b.scalar_type(), " but a has ", dtype,
                     "; pass both as float32 or both as bfloat16");
    TORCH_CHECK_VALUE(b.dim() == 3, where(op, "b"), "has shape ", b.sizes(),
                      "; pass the experts' weights stacked as G x N x K (one N x K matrix per group)");
    TORCH_CHECK_VALUE(b.size(2) == k, where(op, "b"), "has shape ", b.sizes(), " but ", k_arg, " is ", k,
                      "; each expert's matrix is N x K with K = a's columns (pass a K x N weight as its transpose, "
                      "w.transpose(1, 2))");
}

void check_cpu(const at::Tensor& t, const char* op, const char* arg) {
    TORCH_CHECK_VALUE(t.is_cpu(), where(op, arg), "is on ", t.device(), "; the grouped GEMM ops run on the CPU ",
                      "(octet's host path; the device kernels are not bound yet): move the tensors there");
}

at::Tensor scaled_grouped_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_sizes,
                             c10::string_view a_recipe, c10::string_view b_recipe, at::ScalarType out_dtype) {
    constexpr const char* op = "scaled_grouped_mm";
    check_cpu(a, op, "a");
    check_cpu(b, op, "b");
    check_recipe_name(a_recipe, op, "a_recipe");
    check_recipe_name(b_recipe, op, "b_recipe");
    check_tensor(a, op, "a", {at::kFloat, at::kBFloat16});
    TORCH_CHECK_VALUE(a.dim() == 2, where(op, "a"), "has shape ", a.sizes(),
                      "; pass the tokens as one 2-D M x K tensor, sorted by group");
    check_experts(b, a.size(1), a.scalar_type(), op, "a's K");
    check_out_dtype(out_dtype, op);
    const auto sizes = group_sizes_of(group_sizes, b.size(0), a.size(0), op, "a");
    const mm_args m{a, nullptr, a.size(1), b, sizes, out_dtype};
    at::Tensor d = serve_mm(a_recipe, b_recipe, m);
    TORCH_CHECK_VALUE(d.defined(), where(op, "a_recipe/b_recipe"), "are ", std::string(a_recipe), " x ",
                      std::string(b_recipe), ", a pair this op does not serve; it serves ", mm_pairs);
    return d;
}

at::Tensor scaled_grouped_mm_quantized(const at::Tensor& a_codes, const at::Tensor& a_scales, c10::string_view a_recipe,
                                       int64_t k, const at::Tensor& group_sizes, const at::Tensor& b,
                                       c10::string_view b_recipe, at::ScalarType out_dtype) {
    constexpr const char* op = "scaled_grouped_mm_quantized";
    check_cpu(a_codes, op, "a_codes");
    check_cpu(b, op, "b");
    check_recipe_name(a_recipe, op, "a_recipe");
    check_recipe_name(b_recipe, op, "b_recipe");
    TORCH_CHECK_VALUE(a_codes.dim() == 2, where(op, "a_codes"), "has shape ", a_codes.sizes(),
                      "; pass the 2-D codes of one row-wise copy");
    TORCH_CHECK_VALUE(k >= 0, where(op, "k"), "is ", k, "; pass the copy's logical column count K");
    check_tensor(b, op, "b", {at::kFloat, at::kBFloat16});
    check_experts(b, k, b.scalar_type(), op, "k");
    check_out_dtype(out_dtype, op);
    const auto sizes = group_sizes_of(group_sizes, b.size(0), a_codes.size(0), op, "a_codes");
    const mm_args m{a_codes, &a_scales, k, b, sizes, out_dtype};
    at::Tensor d = serve_mm_quantized(a_recipe, b_recipe, m);
    TORCH_CHECK_VALUE(d.defined(), where(op, "a_recipe/b_recipe"), "are ", std::string(a_recipe), " x ",
                      std::string(b_recipe), ", a pair this op does not serve; it serves ", quantized_pairs,
                      " (A row-local, so that each group's rows of the copy are that group's copy)");
    return d;
}

at::Tensor scaled_grouped_mm_k(const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_sizes,
                               c10::string_view a_recipe, c10::string_view b_recipe) {
    constexpr const char* op = "scaled_grouped_mm_k";
    check_cpu(a, op, "a");
    check_cpu(b, op, "b");
    check_recipe_name(a_recipe, op, "a_recipe");
    check_recipe_name(b_recipe, op, "b_recipe");
    check_tensor(a, op, "a", {at::kFloat, at::kBFloat16});
    check_tensor(b, op, "b", {at::kFloat, at::kBFloat16});
    TORCH_CHECK_VALUE(a.dim() == 2 && b.dim() == 2, where(op, "a/b"), "have shapes ", a.sizes(), " and ", b.sizes(),
                      "; pass two 2-D tensors of the same grouped rows (dY: M x N and X: M x K)");
    TORCH_CHECK_VALUE(a.size(0) == b.size(0), where(op, "b"), "has ", b.size(0), " rows but a has ", a.size(0),
                      "; both hold the same tokens, grouped alike");
    const auto sizes = group_sizes_of(group_sizes, -1, a.size(0), op, "a");
    const k_args m{a, b, sizes};
    at::Tensor d = serve_k(a_recipe, b_recipe, m);
    TORCH_CHECK_VALUE(d.defined(), where(op, "a_recipe/b_recipe"), "are ", std::string(a_recipe), " x ",
                      std::string(b_recipe), ", a pair this op does not serve; it serves ", k_pairs);
    return d;
}

}  // namespace
}  // namespace octet_torch::grouped

TORCH_LIBRARY_FRAGMENT(octet, m) {
    m.def(
        "scaled_grouped_mm(Tensor a, Tensor b, Tensor group_sizes, str a_recipe, str b_recipe, ScalarType "
        "out_dtype=float) -> Tensor");
    m.def(
        "scaled_grouped_mm_quantized(Tensor a_codes, Tensor a_scales, str a_recipe, int k, Tensor group_sizes, "
        "Tensor b, str b_recipe, ScalarType out_dtype=float) -> Tensor");
    m.def("scaled_grouped_mm_k(Tensor a, Tensor b, Tensor group_sizes, str a_recipe, str b_recipe) -> Tensor");
}

TORCH_LIBRARY_IMPL(octet, CPU, m) {
    m.impl("scaled_grouped_mm", &octet_torch::grouped::scaled_grouped_mm);
    m.impl("scaled_grouped_mm_quantized", &octet_torch::grouped::scaled_grouped_mm_quantized);
    m.impl("scaled_grouped_mm_k", &octet_torch::grouped::scaled_grouped_mm_k);
}

// CUDA tensors get an error that says where these ops run.
TORCH_LIBRARY_IMPL(octet, CUDA, m) {
    m.impl("scaled_grouped_mm", &octet_torch::grouped::scaled_grouped_mm);
    m.impl("scaled_grouped_mm_quantized", &octet_torch::grouped::scaled_grouped_mm_quantized);
    m.impl("scaled_grouped_mm_k", &octet_torch::grouped::scaled_grouped_mm_k);
}
