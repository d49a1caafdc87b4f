// octet/gemm/detail/grouped_gemm.hpp: the implementation of octet/gemm/grouped_gemm.hpp (included
// at its end): the grouped layout, the argument checks and the host loops over the groups.
#pragma once

#include <cstddef>
#include <string>

#include "octet/core/check.hpp"
#include "octet/gemm/grouped_gemm.hpp"

namespace octet {

inline group_shapes grouped_rows(span<const std::size_t> sizes, std::size_t cols) {
    group_shapes s;
    s.rows.assign(sizes.begin(), sizes.end());
    s.cols.assign(sizes.size(), cols);
    return s;
}

inline group_shapes grouped_cols(std::size_t rows, span<const std::size_t> sizes) {
    group_shapes s;
    s.rows.assign(sizes.size(), rows);
    s.cols.assign(sizes.begin(), sizes.end());
    return s;
}

template <class Recipe>
grouped_layout make_grouped_layout(const group_shapes& shapes) {
    OCTET_REQUIRE(shapes.rows.size() == shapes.cols.size(), "octet::make_grouped_layout", "shapes",
                  detail::message("has ", shapes.rows.size(), " row counts and ", shapes.cols.size(),
                                  " column counts; pass one of each per group (grouped_rows, grouped_cols)"));
    const auto up16 = [](std::size_t n) { return (n + 15) / 16 * 16; };
    grouped_layout l;
    for (std::size_t g = 0; g < shapes.rows.size(); ++g) {
        const quant_layout q = shapes.rows[g] && shapes.cols[g]
                                   ? quant_layout_of<Recipe>::make(shapes.rows[g], shapes.cols[g])
                                   : quant_layout{shapes.rows[g], shapes.cols[g]};
        l.groups.push_back(q);
        l.data_offset.push_back(l.data_bytes);
        l.scale_offset.push_back(l.scale_bytes);
        l.data_bytes += up16(q.data_bytes);
        l.scale_bytes += up16(q.scale_bytes);
    }
    return l;
}

template <class Recipe, class Byte>
quantized_ref<Recipe, Byte> grouped_quantized_ref<Recipe, Byte>::group(std::size_t g) const {
    OCTET_REQUIRE(layout != nullptr && g < layout->size(), "octet::grouped_quantized_ref::group", "g",
                  detail::message("is ", g, " of ", groups(), " groups"));
    const quant_layout& q = layout->groups[g];
    return quantized_ref<Recipe, Byte>(data + layout->data_offset[g], scales + layout->scale_offset[g], q,
                                       tensor_scales ? tensor_scales + g : nullptr);
}

namespace detail {

/// Rows [begin, begin + count) of a matrix (no copy).
template <class T>
matrix_ref<T> row_range(matrix_ref<T> m, std::size_t begin, std::size_t count) {
    if (count == 0 || m.cols == 0) return matrix_ref<T>(m.data, count, m.cols, m.ld, m.order);
    return matrix_ref<T>(&m(begin, 0), count, m.cols, m.ld, m.order);
}

/// The first `rows` rows of a copy whose blocks are one row tall (rows are quantized independently,
/// so a prefix of the copy is the copy of the prefix): same pointers, the same ld and scale_ld.
template <class Recipe, class Byte>
quantized_ref<Recipe, Byte> row_prefix(quantized_ref<Recipe, Byte> q, std::size_t rows) {
    static_assert(Recipe::granularity::rows == 1, "row_prefix: the recipe's blocks must be one row tall");
    q.layout.rows = rows;
    q.layout.scale_rows = rows;
    return q;
}

template <class DT>
void zero_rows(matrix_ref<DT> D) {
    for (std::size_t i = 0; i < D.rows; ++i)
        for (std::size_t j = 0; j < D.cols; ++j) D(i, j) = store_from_float<DT>(0.0f);
}

inline std::size_t sum_of(span<const std::size_t> sizes) {
    std::size_t n = 0;
    for (std::size_t s : sizes) n += s;
    return n;
}

/// Every group of `ref` has the shape sizes[g] x cols (tokens_are_rows: grouped_rows) or cols x
/// sizes[g] (grouped_cols), and a layout Recipe makes. Checked without building the shapes: a
/// grouped quantize allocates nothing beyond quantize's scratch.
template <class Recipe, class Byte>
void validate_grouped(const grouped_quantized_ref<Recipe, Byte>& ref, span<const std::size_t> sizes, std::size_t cols,
                      bool tokens_are_rows, const char* fn, const char* arg) {
    OCTET_REQUIRE(ref.layout != nullptr, fn, arg, "is absent; pass a grouped_quantized_tensor's ref()");
    OCTET_REQUIRE(ref.groups() == sizes.size(), fn, arg,
                  message("has ", ref.groups(), " groups; the sizes name ", sizes.size()));
    const grouped_layout& l = *ref.layout;
    for (std::size_t g = 0; g < l.size(); ++g) {
        const quant_layout& q = l.groups[g];
        const std::size_t rows = tokens_are_rows ? sizes[g] : cols, cs = tokens_are_rows ? cols : sizes[g];
        OCTET_REQUIRE(q.rows == rows && q.cols == cs, fn, arg,
                      message("group ", g, " is ", q.rows, " x ", q.cols, " but must be ", rows, " x ", cs,
                              "; lay it out with make_grouped_layout(grouped_rows(...) or "
                              "grouped_cols(...))"));
    }
    OCTET_REQUIRE(ref.data != nullptr && ref.scales != nullptr, fn, arg,
                  "has a null data or scales pointer; pass a grouped_quantized_tensor's ref()");
    OCTET_REQUIRE(!Recipe::two_level || ref.tensor_scales != nullptr, fn, arg,
                  "is a two-level (NVFP4) copy without tensor scales; point tensor_scales at one float per group");
}

template <class RB, class BB>
std::size_t common_rows(span<const quantized_ref<RB, BB>> B, std::size_t K, const char* fn) {
    const std::size_t N = B.size() ? B[0].rows() : 0;
    for (std::size_t g = 0; g < B.size(); ++g) {
        OCTET_REQUIRE(B[g].rows() == N && B[g].cols() == K, fn, "B",
                      message("[", g, "] is ", B[g].rows(), " x ", B[g].cols(), "; every expert's copy must be ", N,
                              " x ", K, " (N x K, K = A's columns)"));
    }
    return N;
}

template <class RA, class BA>
std::size_t common_cols(const grouped_quantized_ref<RA, BA>& A, const char* fn) {
    OCTET_REQUIRE(A.layout != nullptr, fn, "A", "is absent; pass a grouped_quantized_tensor's cref()");
    const std::size_t K = A.groups() ? A.layout->groups[0].cols : 0;
    for (std::size_t g = 0; g < A.groups(); ++g)
        OCTET_REQUIRE(A.layout->groups[g].cols == K, fn, "A",
                      message("group ", g, " has ", A.layout->groups[g].cols, " columns, group 0 has ", K,
                              "; m-grouped copies share K (lay them out with grouped_rows)"));
    return K;
}

}  // namespace detail

template <class Recipe, class T>
void grouped_quantize(const host_executor& ex, matrix_ref<T> x, span<const std::size_t> sizes,
                      grouped_quantized_ref<Recipe> rowwise, grouped_quantized_ref<Recipe> columnwise,
                      const quantize_options& opt, span<quantize_result> results) {
    constexpr const char* fn = "octet::grouped_quantize";
    OCTET_REQUIRE(detail::sum_of(sizes) == x.rows, fn, "sizes",
                  detail::message("sum to ", detail::sum_of(sizes), " but x has ", x.rows,
                                  " rows; pass each group's row count, in the order x holds the groups"));
    OCTET_REQUIRE(opt.tensor_amax < 0, fn, "opt.tensor_amax",
                  detail::message("is ", opt.tensor_amax,
                                  "; each group is scaled by its own amax here (current scaling): pass -1"));
    OCTET_REQUIRE(results.empty() || results.size() == sizes.size(), fn, "results",
                  detail::message("has ", results.size(), " entries; pass one per group (", sizes.size(), ") or none"));
    if (!rowwise.absent()) detail::validate_grouped(rowwise, sizes, x.cols, true, fn, "rowwise");
    if (!columnwise.absent()) detail::validate_grouped(columnwise, sizes, x.cols, false, fn, "columnwise");
    std::size_t begin = 0;
    for (std::size_t g = 0; g < sizes.size(); ++g) {
        const matrix_ref<T> xg = detail::row_range(x, begin, sizes[g]);
        begin += sizes[g];
        if (sizes[g] == 0 || x.cols == 0) continue;
        quantize_options o = opt;
        o.rng.offset += 2 * g;
        const quantize_result r =
            quantize<Recipe>(ex, xg, rowwise.absent() ? quantized_ref<Recipe>{} : rowwise.group(g),
                             columnwise.absent() ? quantized_ref<Recipe>{} : columnwise.group(g), o);
        if (!results.empty()) results[g] = r;
    }
}

template <class RA, class BA, class RB, class BB, class DT>
void grouped_scaled_gemm(const host_executor& ex, grouped_quantized_ref<RA, BA> A, span<const quantized_ref<RB, BB>> B,
                         matrix_ref<DT> D, const gemm_options& opt) {
    constexpr const char* fn = "octet::grouped_scaled_gemm";
    const std::size_t K = detail::common_cols(A, fn);
    OCTET_REQUIRE(
        B.size() == A.groups(), fn, "B",
        detail::message("holds ", B.size(), " experts' copies, A ", A.groups(), " groups; pass one per group"));
    const std::size_t N = detail::common_rows(B, K, fn);
    std::size_t M = 0;
    for (std::size_t g = 0; g < A.groups(); ++g) M += A.layout->groups[g].rows;
    OCTET_REQUIRE(D.rows == M && (D.cols == N || M == 0), fn, "D",
                  detail::message("is ", D.rows, " x ", D.cols, "; it must be ", M, " x ", N,
                                  " (A's rows over all groups x the experts' N)"));
    OCTET_REQUIRE(opt.beta == 0.0f, fn, "opt.beta", "must be 0: a grouped GEMM takes no C");
    std::size_t begin = 0;
    for (std::size_t g = 0; g < A.groups(); ++g) {
        const std::size_t rows = A.layout->groups[g].rows;
        if (rows) scaled_gemm(ex, A.group(g), B[g], detail::row_range(D, begin, rows), opt);
        begin += rows;
    }
}

template <class RA, class BA, class RB, class BB, class DT>
void grouped_scaled_gemm_masked(const host_executor& ex, grouped_quantized_ref<RA, BA> A,
                                span<const quantized_ref<RB, BB>> B, span<const std::size_t> valid, matrix_ref<DT> D,
                                const gemm_options& opt) {
    static_assert(RA::granularity::rows == 1,
                  "octet::grouped_scaled_gemm_masked: A's recipe must scale rows independently (per row or 1 x C "
                  "blocks), so that the padding rows of a group do not change its tokens' codes");
    constexpr const char* fn = "octet::grouped_scaled_gemm_masked";
    const std::size_t K = detail::common_cols(A, fn);
    OCTET_REQUIRE(B.size() == A.groups() && valid.size() == A.groups(), fn, "B/valid",
                  detail::message("hold ", B.size(), " and ", valid.size(), " entries, A ", A.groups(),
                                  " groups; pass one per group"));
    const std::size_t N = detail::common_rows(B, K, fn);
    const std::size_t capacity = A.groups() ? A.layout->groups[0].rows : 0;
    for (std::size_t g = 0; g < A.groups(); ++g) {
        OCTET_REQUIRE(A.layout->groups[g].rows == capacity, fn, "A",
                      detail::message("group ", g, " has ", A.layout->groups[g].rows, " rows, group 0 ", capacity,
                                      "; every group of a masked GEMM holds the same capacity"));
        OCTET_REQUIRE(valid[g] <= capacity, fn, "valid",
                      detail::message("[", g, "] is ", valid[g], ", more than the capacity ", capacity));
    }
    OCTET_REQUIRE(D.rows == A.groups() * capacity && (D.cols == N || D.rows == 0), fn, "D",
                  detail::message("is ", D.rows, " x ", D.cols, "; it must be ", A.groups() * capacity, " x ", N,
                                  " (groups x capacity, x the experts' N)"));
    OCTET_REQUIRE(opt.beta == 0.0f, fn, "opt.beta", "must be 0: a grouped GEMM takes no C");
    for (std::size_t g = 0; g < A.groups(); ++g) {
        const matrix_ref<DT> Dg = detail::row_range(D, g * capacity, capacity);
        if (valid[g])
            scaled_gemm(ex, detail::row_prefix(A.group(g), valid[g]), B[g], detail::row_range(Dg, 0, valid[g]), opt);
        detail::zero_rows(detail::row_range(Dg, valid[g], capacity - valid[g]));
    }
}

template <class RA, class BA, class RB, class BB, class DT>
void grouped_scaled_gemm_k(const host_executor& ex, grouped_quantized_ref<RA, BA> A, grouped_quantized_ref<RB, BB> B,
                           matrix_ref<DT> D, const gemm_options& opt) {
    constexpr const char* fn = "octet::grouped_scaled_gemm_k";
    OCTET_REQUIRE(A.layout != nullptr && B.layout != nullptr, fn, "A/B",
                  "is absent; pass grouped_quantized_tensor crefs (the column-wise copies of dY and X)");
    OCTET_REQUIRE(A.groups() == B.groups(), fn, "B",
                  detail::message("has ", B.groups(), " groups, A ", A.groups(), "; pass the same experts"));
    const std::size_t G = A.groups();
    const std::size_t N = G ? A.layout->groups[0].rows : 0, K = G ? B.layout->groups[0].rows : 0;
    for (std::size_t g = 0; g < G; ++g) {
        const quant_layout &a = A.layout->groups[g], &b = B.layout->groups[g];
        OCTET_REQUIRE(a.rows == N && b.rows == K && a.cols == b.cols, fn, "A/B",
                      detail::message("group ", g, ": A is ", a.rows, " x ", a.cols, " and B ", b.rows, " x ", b.cols,
                                      "; A's groups must be N x k_g and B's K x k_g (N = ", N, ", K = ", K,
                                      "): the column-wise copies of dY's and X's groups"));
    }
    OCTET_REQUIRE(D.rows == G * N && (D.cols == K || D.rows == 0), fn, "D",
                  detail::message("is ", D.rows, " x ", D.cols, "; it must be ", G * N, " x ", K,
                                  " (the experts' N x K results stacked)"));
    OCTET_REQUIRE(opt.beta == 0.0f && opt.bias.empty(), fn, "opt",
                  "has beta or a bias; a weight gradient takes neither");
    for (std::size_t g = 0; g < G; ++g) {
        const matrix_ref<DT> Dg = detail::row_range(D, g * N, N);
        if (A.layout->groups[g].cols == 0)
            detail::zero_rows(Dg);
        else
            scaled_gemm(ex, A.group(g), B.group(g), Dg, opt);
    }
}

}  // namespace octet
