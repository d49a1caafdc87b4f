// grouped_common.hpp: what the grouped scaled GEMM ops' translation units share (grouped_ops.cpp
// registers the ops and checks what needs no recipe; grouped_mm.cpp and grouped_k.cpp instantiate
// the served recipe pairs; grouped_exchange.cpp runs the expert-parallel token exchange in-process).
//
//   octet::scaled_grouped_mm(a, b, group_sizes, a_recipe, b_recipe, out_dtype) -> D (M x N)
//       m-grouped contiguous (octet/gemm/grouped_gemm.hpp): a (M x K, float32 or bf16) holds the
//       tokens of G groups in order, group_sizes[g] rows each; b (G x N x K, the same dtype; each
//       b[g] may be a transposed view) the experts' weights. Octet quantizes a group by group
//       (grouped_quantize with a_recipe: each group scaled as a matrix of its own) and each b[g] as
//       a matrix of its own (b_recipe), then D rows of g = A_g B_g^T (grouped_scaled_gemm).
//   octet::scaled_grouped_mm_k(a, b, group_sizes, a_recipe, b_recipe) -> D (G x N x K, float32)
//       k-grouped (the weight gradient): a (M x N, dY) and b (M x K, X) hold the same G groups of
//       rows; D[g] = A_g^T B_g from the column-wise copies of each group (grouped_quantize,
//       columnwise; grouped_scaled_gemm_k). A group of 0 rows gives D[g] = 0.
//   octet::scaled_grouped_mm_quantized(a_codes, a_scales, a_recipe, k, group_sizes, b, b_recipe,
//                                      out_dtype) -> D
//       m-grouped on tokens that are already quantized (one row-wise copy of M rows of a row-local
//       recipe, as octet.quantize returns it or as an expert-parallel dispatch delivers it): each
//       group's rows of that copy are its A_g (rows are quantized independently, so a row range of
//       the copy is the copy of those rows).
// group_sizes: a 1-D int64 or int32 CPU tensor of G non-negative sizes summing to M.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "octet/gemm/grouped_gemm.hpp"
#include "octet_torch.hpp"

/// X(ra, rb) for the m-grouped pairs: the forward (x, w) and the data gradient (g, w) of the
/// tensorwise, blockwise and mxfp8 linear recipes.
#define OCTET_TORCH_GROUPED_MM_PAIRS(X)   \
    X(tensorwise_e4m3, tensorwise_e4m3)   \
    X(tensorwise_e5m2, tensorwise_e4m3)   \
    X(blockwise_1x128, blockwise_128x128) \
    X(mxfp8_e4m3, mxfp8_e4m3)             \
    X(mxfp8_e5m2, mxfp8_e4m3)

/// X(ra, rb) for the k-grouped pairs: the weight gradient (g, x) of those recipes.
#define OCTET_TORCH_GROUPED_K_PAIRS(X)  \
    X(tensorwise_e5m2, tensorwise_e4m3) \
    X(blockwise_1x128, blockwise_1x128) \
    X(mxfp8_e5m2, mxfp8_e4m3)

/// X(r) for the row-local recipes scaled_grouped_mm_quantized takes as A (and the exchange sends).
#define OCTET_TORCH_GROUPED_ROW_RECIPES(X) \
    X(blockwise_1x128, blockwise_128x128)  \
    X(mxfp8_e4m3, mxfp8_e4m3)

namespace octet_torch::grouped {

inline constexpr const char* mm_pairs =
    "tensorwise_e4m3 x tensorwise_e4m3, tensorwise_e5m2 x tensorwise_e4m3, blockwise_1x128 x blockwise_128x128, "
    "mxfp8_e4m3 x mxfp8_e4m3, mxfp8_e5m2 x mxfp8_e4m3";
inline constexpr const char* k_pairs =
    "tensorwise_e5m2 x tensorwise_e4m3, blockwise_1x128 x blockwise_1x128, mxfp8_e5m2 x mxfp8_e4m3";
inline constexpr const char* quantized_pairs = "blockwise_1x128 x blockwise_128x128, mxfp8_e4m3 x mxfp8_e4m3";

/// The arguments of an m-grouped op after the checks that need no recipe (grouped_ops.cpp).
struct mm_args {
    const at::Tensor& a;         ///< M x K float32/bf16 (scaled_grouped_mm), or the codes (quantized)
    const at::Tensor* a_scales;  ///< the quantized op's scales, else null
    int64_t k;                   ///< the quantized op's K
    const at::Tensor& b;         ///< G x N x K float32/bf16
    const std::vector<std::size_t>& sizes;
    at::ScalarType out_dtype;
};

/// The arguments of the k-grouped op.
struct k_args {
    const at::Tensor& a;  ///< M x N
    const at::Tensor& b;  ///< M x K
    const std::vector<std::size_t>& sizes;
};

/// group_sizes as sizes, checked: a 1-D int64/int32 CPU tensor of `groups` entries (groups < 0:
/// any count), each >= 0, summing to `rows`. Raises ValueError naming the argument.
std::vector<std::size_t> group_sizes_of(const at::Tensor& group_sizes, int64_t groups, int64_t rows, const char* op,
                                        const char* rows_arg);

/// b[g] as an N x K matrix (rows or columns contiguous; a transposed view is read in place).
template <class T>
octet::matrix_ref<const T> expert_matrix(const at::Tensor& b, int64_t g, const char* op) {
    return as_matrix<const T>(b.select(0, g), op, "b");
}

/// Each expert's N x K matrix b[g] quantized as a matrix of its own into one grouped copy (what
/// grouped_quantize gives for groups that are stacked rows).
template <class R, class T>
octet::grouped_quantized_tensor<R> quantize_experts(const at::Tensor& b, const char* op) {
    const std::size_t G = static_cast<std::size_t>(b.size(0)), N = static_cast<std::size_t>(b.size(1)),
                      K = static_cast<std::size_t>(b.size(2));
    std::vector<std::size_t> rows(G, N);
    octet::grouped_quantized_tensor<R> q(octet::grouped_rows(octet::span<const std::size_t>(rows.data(), G), K));
    for (std::size_t g = 0; g < G; ++g)
        if (N && K)
            guarded([&] {
                octet::quantize<R>(host(), expert_matrix<T>(b, static_cast<int64_t>(g), op), q.ref().group(g));
            });
    return q;
}

/// Calls f(type_tag<float | octet::bf16>{}) for a float32 or bf16 tensor's dtype.
template <class F>
decltype(auto) with_float_or_bf16(const at::Tensor& t, F&& f) {
    if (t.scalar_type() == at::kBFloat16) return f(type_tag<octet::bf16>{});
    return f(type_tag<float>{});
}

/// D rows of group g = A_g B_g^T, A quantized group by group inside (scaled_grouped_mm).
template <class RA, class RB>
at::Tensor run_mm(const mm_args& m) {
    constexpr const char* op = "scaled_grouped_mm";
    const std::size_t M = static_cast<std::size_t>(m.a.size(0)), K = static_cast<std::size_t>(m.a.size(1)),
                      N = static_cast<std::size_t>(m.b.size(1));
    const octet::span<const std::size_t> sizes(m.sizes.data(), m.sizes.size());
    // No tokens or K = 0: the products are empty sums (an empty grouped copy holds no memory to quantize into).
    if (M == 0 || K == 0 || N == 0)
        return at::zeros({static_cast<int64_t>(M), static_cast<int64_t>(N)}, m.a.options().dtype(m.out_dtype));
    octet::grouped_quantized_tensor<RA> aq(octet::grouped_rows(sizes, K));
    const auto bq =
        with_float_or_bf16(m.b, [&](auto t) { return quantize_experts<RB, typename decltype(t)::type>(m.b, op); });
    with_float_or_bf16(m.a, [&](auto t) {
        using T = typename decltype(t)::type;
        guarded([&] { octet::grouped_quantize<RA>(host(), as_matrix<const T>(m.a, op, "a"), sizes, aq.ref()); });
    });
    std::vector<octet::quantized_cref<RB>> b_refs;
    for (std::size_t g = 0; g < sizes.size(); ++g) b_refs.push_back(bq.cref().group(g));
    at::Tensor d = at::empty({static_cast<int64_t>(M), static_cast<int64_t>(N)}, m.a.options().dtype(m.out_dtype));
    auto run = [&](auto out) {
        using DT = typename decltype(out)::type;
        guarded([&] {
            octet::grouped_scaled_gemm(host(), aq.cref(),
                                       octet::span<const octet::quantized_cref<RB>>(b_refs.data(), b_refs.size()),
                                       as_matrix<DT>(d, op, "out"));
        });
    };
    if (m.out_dtype == at::kBFloat16)
        run(type_tag<octet::bf16>{});
    else
        run(type_tag<float>{});
    return d;
}

/// D rows of group g = A_g B_g^T with A one row-wise copy of M rows (scaled_grouped_mm_quantized).
template <class RA, class RB>
at::Tensor run_mm_quantized(const mm_args& m) {
    static_assert(RA::granularity::rows == 1 && !RA::two_level, "A's recipe must be row-local with one level");
    constexpr const char* op = "scaled_grouped_mm_quantized";
    const auto A = as_quantized<RA>(m.a, *m.a_scales, at::Tensor(), m.k, op, "a");
    const std::size_t N = static_cast<std::size_t>(m.b.size(1));
    const auto bq =
        with_float_or_bf16(m.b, [&](auto t) { return quantize_experts<RB, typename decltype(t)::type>(m.b, op); });
    at::Tensor d = at::empty({m.a.size(0), static_cast<int64_t>(N)}, m.a.options().dtype(m.out_dtype));
    auto run = [&](auto out) {
        using DT = typename decltype(out)::type;
        const auto D = as_matrix<DT>(d, op, "out");
        std::size_t begin = 0;
        for (std::size_t g = 0; g < m.sizes.size(); ++g) {
            const std::size_t n = m.sizes[g];
            if (n == 0) continue;
            // Rows [begin, begin + n) of the copy: the same ld and scale grid stride, offset pointers.
            octet::quant_layout l = A.layout;
            l.rows = n;
            l.scale_rows = n;
            l.data_bytes = n * l.row_bytes;
            const octet::quantized_cref<RA> Ag(A.data + begin * l.row_bytes, A.scales + begin * RA::scale_bytes, l);
            const octet::matrix_ref<DT> Dg(&D(begin, 0), n, D.cols, D.ld);
            guarded([&] { octet::scaled_gemm(host(), Ag, bq.cref().group(g), Dg); });
            begin += n;
        }
    };
    if (N == 0 || m.a.size(0) == 0 || m.k == 0) return d.zero_();
    if (m.out_dtype == at::kBFloat16)
        run(type_tag<octet::bf16>{});
    else
        run(type_tag<float>{});
    return d;
}

/// D[g] = A_g^T B_g (float32, G x N x K) from the column-wise copies of each group.
template <class RA, class RB>
at::Tensor run_k(const k_args& m) {
    constexpr const char* op = "scaled_grouped_mm_k";
    const std::size_t N = static_cast<std::size_t>(m.a.size(1)), K = static_cast<std::size_t>(m.b.size(1));
    const std::size_t G = m.sizes.size();
    const octet::span<const std::size_t> sizes(m.sizes.data(), G);
    // No tokens: every expert's dW is an empty sum, 0 (as grouped_scaled_gemm_k gives a group of 0 rows).
    if (m.a.size(0) == 0 || G * N * K == 0)
        return at::zeros({static_cast<int64_t>(G), static_cast<int64_t>(N), static_cast<int64_t>(K)},
                         m.a.options().dtype(at::kFloat));
    octet::grouped_quantized_tensor<RA> aq(octet::grouped_cols(N, sizes));
    octet::grouped_quantized_tensor<RB> bq(octet::grouped_cols(K, sizes));
    with_float_or_bf16(m.a, [&](auto t) {
        using T = typename decltype(t)::type;
        guarded([&] { octet::grouped_quantize<RA>(host(), as_matrix<const T>(m.a, op, "a"), sizes, {}, aq.ref()); });
    });
    with_float_or_bf16(m.b, [&](auto t) {
        using T = typename decltype(t)::type;
        guarded([&] { octet::grouped_quantize<RB>(host(), as_matrix<const T>(m.b, op, "b"), sizes, {}, bq.ref()); });
    });
    at::Tensor d = at::empty({static_cast<int64_t>(G), static_cast<int64_t>(N), static_cast<int64_t>(K)},
                             m.a.options().dtype(at::kFloat));
    const octet::matrix_ref<float> D(d.data_ptr<float>(), G * N, K);
    guarded([&] { octet::grouped_scaled_gemm_k(host(), aq.cref(), bq.cref(), D); });
    return d;
}

/// Each returns D for the pairs its translation unit serves, or an undefined tensor.
at::Tensor serve_mm(std::string_view ra, std::string_view rb, const mm_args& m);
at::Tensor serve_mm_quantized(std::string_view ra, std::string_view rb, const mm_args& m);
at::Tensor serve_k(std::string_view ra, std::string_view rb, const k_args& m);

}  // namespace octet_torch::grouped
