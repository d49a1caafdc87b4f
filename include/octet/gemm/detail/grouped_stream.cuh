// octet/gemm/detail/grouped_stream.cuh: the implementation of octet/gemm/grouped_gemm.cuh (which
// includes it at its end): the grouped backends' support rules and choice, the device checks of the
// operands, and the launches of detail/grouped_sm90.cuh and detail/grouped_sm89.cuh.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "octet/cuda/executor.cuh"
#include "octet/gemm/detail/device_common.cuh"
#include "octet/gemm/detail/grouped_common.cuh"
#include "octet/gemm/detail/grouped_sm89.cuh"
#include "octet/gemm/detail/grouped_sm90.cuh"
#include "octet/gemm/grouped_gemm.cuh"
#include "octet/gemm/grouped_gemm.hpp"
#include "octet/gemm/scaled_gemm.cuh"
#include "octet/quant/quantize.cuh"

namespace octet {
namespace detail {

/// Why the grouped GEMM cannot run on `backend` (empty when it can): the dense backend's device rules
/// (gemm_device_support), less what the grouped kernels do not have.
template <class RA, class RB>
std::string grouped_device_support(const stream_executor& ex, gemm_backend backend, std::size_t K,
                                   const gemm_options& opt) {
    if (backend == gemm_backend::host) return "the host backend runs with octet::on_host(), not on a stream";
    if (backend == gemm_backend::cublaslt)
        return "there is no grouped cuBLASLt path (use automatic, sm90_wgmma or sm89_mma)";
    if (backend == gemm_backend::sm90_wgmma) {
        if (!gemm_kernel_pair<RA, RB>::sm90) return gemm_backend_support<RA, RB>(backend, K, opt);
        if (opt.tile != gemm_tile::automatic && opt.tile != gemm_tile::m128n128)
            return message("the grouped kernel's tiles are 128 x 128 (options.tile is ", tile_name(opt.tile), ")");
        if (opt.split_k > 1) return "the grouped kernel does not split K (options.split_k must be 0 or 1)";
        if (opt.cluster > 1) return "the grouped kernel runs single CTAs (options.cluster must be 0 or 1)";
    }
    if (backend == gemm_backend::sm89_mma && !gemm_kernel_pair<RA, RB>::sm89)
        return gemm_backend_support<RA, RB>(backend, K, opt);
    return gemm_device_support<RA, RB>(ex, backend, K, opt);
}

template <class RA, class RB>
gemm_backend choose_grouped_backend(const stream_executor& ex, std::size_t K, const gemm_options& opt) {
    constexpr const char* fn = "octet::grouped_scaled_gemm";
    if (opt.backend != gemm_backend::automatic) {
        const std::string why = grouped_device_support<RA, RB>(ex, opt.backend, K, opt);
        OCTET_REQUIRE(why.empty(), fn, "options.backend",
                      message("is ", backend_name(opt.backend), ", which cannot run ", recipe_description<RA>(), " x ",
                              recipe_description<RB>(), ": ", why));
        return opt.backend;
    }
    std::string whys;
    for (gemm_backend b : {gemm_backend::sm90_wgmma, gemm_backend::sm89_mma}) {
        const std::string why = grouped_device_support<RA, RB>(ex, b, K, opt);
        if (why.empty()) return b;
        whys += message("; ", backend_name(b), ": ", why);
    }
    OCTET_REQUIRE(
        false, fn, "A/B",
        message("(", recipe_description<RA>(), " x ", recipe_description<RB>(), ") has no grouped CUDA backend here",
                whys, "; the host overload (octet::on_host()) serves it"));
    return gemm_backend::host;
}

/// Sets rows [(first + i) capacity + valid[i], (first + i + 1) capacity) of D to 0 for i < count (<=
/// grouped_launch_groups): one launch of grouped_zero_rows_kernel, none when there is nothing to set.
template <class DT>
void launch_grouped_zero_rows(cudaStream_t stream, const matrix_ref<DT>& D, std::size_t capacity, std::size_t first,
                              const std::uint32_t* valid, std::size_t count) {
    grouped_zero_params<DT> z{};
    z.d = D.data;
    z.ld = D.ld;
    z.col_major = D.order == storage_order::col_major;
    z.N = static_cast<std::uint32_t>(D.cols);
    z.capacity = static_cast<std::uint32_t>(capacity);
    z.first_group = static_cast<std::uint32_t>(first);
    std::size_t most = 0;
    for (std::size_t i = 0; i < count; ++i) {
        z.valid[i] = valid[i];
        most = std::max<std::size_t>(most, capacity - valid[i]);
    }
    if (most == 0 || D.cols == 0) return;
    constexpr unsigned threads = 256;
    const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>(
        (most * D.cols + threads - 1) / threads, static_cast<std::size_t>(cuda::multiprocessor_count()) * 4));
    cuda::launch("grouped_zero_rows_kernel", grouped_zero_rows_kernel<DT>, dim3(blocks, static_cast<unsigned>(count)),
                 dim3(threads), 0, stream, z);
    OCTET_CUDA_CHECK_LAUNCH();
}

/// Group g's copy as the kernels multiply it: the whole group, or (masked) its first valid[g] rows.
template <bool Masked, class RA>
quantized_cref<RA> grouped_operand(const grouped_quantized_cref<RA>& A, std::size_t g, const std::size_t* valid) {
    if constexpr (Masked)
        return row_prefix(A.group(g), valid[g]);
    else
        return A.group(g);
}

/// The stream entries after the element types: the checks, the backend, then one launch per
/// grouped_launch_groups groups (their descriptions on the stack: no allocation). Masked: `valid`
/// (host, one per group) rows of each group's `capacity` are multiplied into rows g capacity.. of D,
/// and the group's other rows of D are set to 0 (grouped_zero_rows_kernel).
template <bool Masked, class RA, class RB, class BB, class DT>
gemm_result grouped_scaled_gemm_device(const stream_executor& ex, const grouped_quantized_cref<RA>& A,
                                       span<const quantized_ref<RB, BB>> B, const std::size_t* valid,
                                       const matrix_ref<DT>& D, const gemm_options& opt) {
    constexpr const char* fn = Masked ? "octet::grouped_scaled_gemm_masked" : "octet::grouped_scaled_gemm";
    const std::size_t K = detail::common_cols(A, fn), G = A.groups();
    OCTET_REQUIRE(B.size() == G, fn, "B",
                  message("holds ", B.size(), " experts' copies, A ", G, " groups; pass one per group"));
    const std::size_t N = detail::common_rows(B, K, fn);
    const grouped_layout& L = *A.layout;
    const std::size_t capacity = G ? L.groups[0].rows : 0;
    std::size_t M = 0;
    for (std::size_t g = 0; g < G; ++g) {
        M += L.groups[g].rows;
        if constexpr (Masked) {
            OCTET_REQUIRE(L.groups[g].rows == capacity, fn, "A",
                          message("group ", g, " has ", L.groups[g].rows, " rows, group 0 ", capacity,
                                  "; every group of a masked GEMM holds the same capacity"));
            OCTET_REQUIRE(valid[g] <= capacity, fn, "valid",
                          message("[", g, "] is ", valid[g], ", more than the capacity ", capacity));
        }
    }
    OCTET_REQUIRE(
        D.rows == M && (D.cols == N || M == 0), fn, "D",
        message("is ", D.rows, " x ", D.cols, "; it must be ", M, " x ", N,
                Masked ? " (groups x capacity, x the experts' N)" : " (A's rows over all groups x the experts' N)"));
    require_matrix(D, fn, "D");
    OCTET_REQUIRE(opt.beta == 0.0f, fn, "opt.beta", "must be 0: a grouped GEMM takes no C");
    OCTET_REQUIRE(opt.bias.empty() || opt.bias.size() == N, fn, "options.bias",
                  message("has ", opt.bias.size(), " entries; pass N = ", N, " (one per column of D) or none"));
    const gemm_backend backend = choose_grouped_backend<RA, RB>(ex, K, opt);
    gemm_result result;
    result.backend = backend;
    if (M == 0 || N == 0) return result;

    // Device memory and alignment, and the one-matrix view of A's block that the sm90 kernel's TMA map
    // takes: every group's rows of the same bytes, starting at a whole row of the block.
    require_device_matrix(D, fn, "D");
    if (!opt.bias.empty()) cuda::require_device_accessible(opt.bias.data(), fn, "options.bias");
    std::size_t row_bytes = 0;
    for (std::size_t g = 0; g < G; ++g) {
        if (L.groups[g].rows == 0 || K == 0) continue;
        const quantized_cref<RA> a = A.group(g);
        const quantized_cref<RB> b = B[g];
        require_device_operand(a, fn, "A", backend_name(backend));
        require_device_operand(b, fn, "B", backend_name(backend));
        if (row_bytes == 0) row_bytes = a.layout.row_bytes;
        OCTET_REQUIRE(a.layout.row_bytes == row_bytes && L.data_offset[g] % row_bytes == 0, fn, "A",
                      message("group ", g, " has rows of ", a.layout.row_bytes, " bytes at offset ", L.data_offset[g],
                              "; every group's rows must be ", row_bytes,
                              " bytes and start at a whole row of the block (make_grouped_layout's layout)"));
    }

    const device_epilogue<float, DT> epi = make_device_epilogue<float, DT>(nullptr, D, opt);
    const bool sm90 = backend == gemm_backend::sm90_wgmma && K > 0;  // else sm89 (and sm90's K = 0: D = bias)
    sm90_flat_a flat;
    flat.data = A.data;
    flat.rows = row_bytes ? L.data_bytes / row_bytes : 0;
    flat.row_bytes = row_bytes;
    flat.K = K;
    grouped_device_group<RA, RB> chunk[grouped_launch_groups];
    std::size_t d_row = 0;
    for (std::size_t first = 0; first < G; first += grouped_launch_groups) {
        const std::size_t count = std::min<std::size_t>(G - first, grouped_launch_groups);
        for (std::size_t i = 0; i < count; ++i) {
            grouped_device_group<RA, RB>& gr = chunk[i];
            gr.a = grouped_operand<Masked>(A, first + i, valid);
            gr.b = B[first + i];
            gr.d_row = d_row;
            gr.a_row = row_bytes ? L.data_offset[first + i] / row_bytes : 0;
            d_row += L.groups[first + i].rows;
        }
        bool launched = false;
        if constexpr (gemm_kernel_pair<RA, RB>::sm90) {
            if (sm90) {
                launch_grouped_sm90<false, RA, RB, float, DT>(ex.stream, flat, chunk, count, N, epi);
                launched = true;
            }
        }
        if constexpr (gemm_kernel_pair<RA, RB>::sm89) {
            if (!launched)
                launch_grouped_sm89<RA, RB, float, DT>(ex.stream, chunk, count, N, epi,
                                                       static_cast<std::size_t>(opt.promotion_interval));
        }
        if constexpr (Masked) {
            std::uint32_t v[grouped_launch_groups];
            for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<std::uint32_t>(valid[first + i]);
            launch_grouped_zero_rows(ex.stream, D, capacity, first, v, count);
        }
    }
    return result;
}

/// The k-grouped stream entry after the element types: group g is the dense GEMM of A_g (N x k_g) and
/// B_g (K x k_g) into rows [g N, (g + 1) N) of D (its own K: per-group TMA maps of A on sm90); groups
/// with k_g = 0 get no tiles, and their rows are set to 0.
template <class RA, class RB, class DT>
gemm_result grouped_scaled_gemm_k_device(const stream_executor& ex, const grouped_quantized_cref<RA>& A,
                                         const grouped_quantized_cref<RB>& B, const matrix_ref<DT>& D,
                                         const gemm_options& opt) {
    constexpr const char* fn = "octet::grouped_scaled_gemm_k";
    OCTET_REQUIRE(A.layout != nullptr && B.layout != nullptr, fn, "A/B",
                  "is absent; pass grouped_quantized_tensor crefs (the column-wise copies of dY and X)");
    OCTET_REQUIRE(A.groups() == B.groups(), fn, "B",
                  message("has ", B.groups(), " groups, A ", A.groups(), "; pass the same experts"));
    const std::size_t G = A.groups();
    const std::size_t N = G ? A.layout->groups[0].rows : 0, K = G ? B.layout->groups[0].rows : 0;
    std::size_t most_k = 0;
    for (std::size_t g = 0; g < G; ++g) {
        const quant_layout &a = A.layout->groups[g], &b = B.layout->groups[g];
        OCTET_REQUIRE(a.rows == N && b.rows == K && a.cols == b.cols, fn, "A/B",
                      message("group ", g, ": A is ", a.rows, " x ", a.cols, " and B ", b.rows, " x ", b.cols,
                              "; A's groups must be N x k_g and B's K x k_g (N = ", N, ", K = ", K,
                              "): the column-wise copies of dY's and X's groups"));
        most_k = std::max(most_k, a.cols);
    }
    OCTET_REQUIRE(D.rows == G * N && (D.cols == K || D.rows == 0), fn, "D",
                  message("is ", D.rows, " x ", D.cols, "; it must be ", G * N, " x ", K,
                          " (the experts' N x K results stacked)"));
    require_matrix(D, fn, "D");
    OCTET_REQUIRE(opt.beta == 0.0f && opt.bias.empty(), fn, "opt",
                  "has beta or a bias; a weight gradient takes neither");
    const gemm_backend backend = choose_grouped_backend<RA, RB>(ex, most_k, opt);
    gemm_result result;
    result.backend = backend;
    if (G * N == 0 || K == 0) return result;
    require_device_matrix(D, fn, "D");
    for (std::size_t g = 0; g < G; ++g) {
        if (A.layout->groups[g].cols == 0) continue;
        require_device_operand(A.group(g), fn, "A", backend_name(backend));
        require_device_operand(B.group(g), fn, "B", backend_name(backend));
    }
    const device_epilogue<float, DT> epi = make_device_epilogue<float, DT>(nullptr, D, opt);
    grouped_device_group<RA, RB> chunk[grouped_launch_groups];
    for (std::size_t first = 0; first < G; first += grouped_launch_groups) {
        const std::size_t count = std::min<std::size_t>(G - first, grouped_launch_groups);
        std::uint32_t v[grouped_launch_groups];  // rows of each group's N computed: N, or 0 (k_g = 0: zeroed)
        for (std::size_t i = 0; i < count; ++i) {
            grouped_device_group<RA, RB>& gr = chunk[i];
            gr.a = A.group(first + i);
            gr.b = B.group(first + i);
            if (gr.a.cols() == 0) gr.a.layout.rows = 0;  // no tiles: its rows of D are zeroed below
            gr.d_row = (first + i) * N;
            v[i] = static_cast<std::uint32_t>(gr.a.rows());
        }
        bool launched = false;
        if constexpr (gemm_kernel_pair<RA, RB>::sm90) {
            if (backend == gemm_backend::sm90_wgmma) {
                launch_grouped_sm90<true, RA, RB, float, DT>(ex.stream, sm90_flat_a{}, chunk, count, K, epi);
                launched = true;
            }
        }
        if constexpr (gemm_kernel_pair<RA, RB>::sm89) {
            if (!launched)
                launch_grouped_sm89<RA, RB, float, DT>(ex.stream, chunk, count, K, epi,
                                                       static_cast<std::size_t>(opt.promotion_interval));
        }
        launch_grouped_zero_rows(ex.stream, D, N, first, v, count);
    }
    return result;
}

}  // namespace detail

// ---- declared and documented in octet/gemm/grouped_gemm.cuh ---------------------------------------

template <class Recipe, class T>
void grouped_quantize(const stream_executor& ex, matrix_ref<T> x, span<const std::size_t> sizes,
                      grouped_quantized_ref<Recipe> rowwise, grouped_quantized_ref<Recipe> columnwise,
                      const device_quantize_options& opt) {
    constexpr const char* fn = "octet::grouped_quantize";
    OCTET_REQUIRE(detail::sum_of(sizes) == x.rows, fn, "sizes",
                  detail::message("sum to ", detail::sum_of(sizes), " but x has ", x.rows,
                                  " rows; pass each group's row count, in the order x holds the groups"));
    OCTET_REQUIRE(opt.device_tensor_amax == nullptr, fn, "opt.device_tensor_amax",
                  "is set; each group is scaled by its own amax here (current scaling): pass null");
    OCTET_REQUIRE(opt.device_stats == nullptr, fn, "opt.device_stats",
                  "is set; one pair of statistics cannot say which group they describe: pass null");
    if (!rowwise.absent()) detail::validate_grouped(rowwise, sizes, x.cols, true, fn, "rowwise");
    if (!columnwise.absent()) detail::validate_grouped(columnwise, sizes, x.cols, false, fn, "columnwise");
    std::size_t begin = 0;
    for (std::size_t g = 0; g < sizes.size(); ++g) {
        const matrix_ref<T> xg = detail::row_range(x, begin, sizes[g]);
        begin += sizes[g];
        if (sizes[g] == 0 || x.cols == 0) continue;
        device_quantize_options o = opt;
        o.rng.offset += 2 * g;
        quantize<Recipe>(ex, xg, rowwise.absent() ? quantized_ref<Recipe>{} : rowwise.group(g),
                         columnwise.absent() ? quantized_ref<Recipe>{} : columnwise.group(g), o);
    }
}

template <class Recipe, class T>
std::size_t grouped_quantize_scratch_bytes(matrix_ref<T> x, span<const std::size_t> sizes,
                                           grouped_quantized_ref<Recipe> rowwise,
                                           grouped_quantized_ref<Recipe> columnwise,
                                           const device_quantize_options& opt) {
    std::size_t bytes = 0, begin = 0;
    for (std::size_t g = 0; g < sizes.size(); ++g) {
        const matrix_ref<T> xg = detail::row_range(x, begin, sizes[g]);
        begin += sizes[g];
        if (sizes[g] == 0 || x.cols == 0) continue;
        bytes +=
            quantize_scratch_bytes<Recipe>(xg, rowwise.absent() ? quantized_ref<Recipe>{} : rowwise.group(g),
                                           columnwise.absent() ? quantized_ref<Recipe>{} : columnwise.group(g), opt);
    }
    return bytes;
}

template <class RA, class BA, class RB, class BB, class DT>
gemm_result grouped_scaled_gemm(const stream_executor& ex, grouped_quantized_ref<RA, BA> A,
                                span<const quantized_ref<RB, BB>> B, matrix_ref<DT> D, const gemm_options& opt) {
    using D0 = detail::storage_of_t<std::remove_const_t<DT>>;
    static_assert(
        detail::is_gemm_output_v<D0>,
        "octet::grouped_scaled_gemm: D must be float, octet::bf16 or octet::fp16 (or __nv_bfloat16 / __half)");
    const matrix_ref<D0> d(reinterpret_cast<D0*>(D.data), D.rows, D.cols, D.ld, D.order);
    return detail::grouped_scaled_gemm_device<false, RA, RB, BB, D0>(ex, grouped_quantized_cref<RA>(A), B, nullptr, d,
                                                                     opt);
}

template <class RA, class BA, class RB, class BB, class DT>
gemm_result grouped_scaled_gemm_masked(const stream_executor& ex, grouped_quantized_ref<RA, BA> A,
                                       span<const quantized_ref<RB, BB>> B, span<const std::size_t> valid,
                                       matrix_ref<DT> D, const gemm_options& opt) {
    static_assert(RA::granularity::rows == 1,
                  "octet::grouped_scaled_gemm_masked: A's recipe must scale rows independently (per row or 1 x C "
                  "blocks), so that the padding rows of a group do not change its tokens' codes");
    using D0 = detail::storage_of_t<std::remove_const_t<DT>>;
    static_assert(detail::is_gemm_output_v<D0>,
                  "octet::grouped_scaled_gemm_masked: D must be float, octet::bf16 or "
                  "octet::fp16 (or __nv_bfloat16 / __half)");
    OCTET_REQUIRE(valid.size() == A.groups(), "octet::grouped_scaled_gemm_masked", "valid",
                  detail::message("holds ", valid.size(), " counts, A ", A.groups(), " groups; pass one per group"));
    const matrix_ref<D0> d(reinterpret_cast<D0*>(D.data), D.rows, D.cols, D.ld, D.order);
    return detail::grouped_scaled_gemm_device<true, RA, RB, BB, D0>(ex, grouped_quantized_cref<RA>(A), B, valid.data(),
                                                                    d, opt);
}

template <class RA, class BA, class RB, class BB, class DT>
gemm_result grouped_scaled_gemm_k(const stream_executor& ex, grouped_quantized_ref<RA, BA> A,
                                  grouped_quantized_ref<RB, BB> B, matrix_ref<DT> D, const gemm_options& opt) {
    using D0 = detail::storage_of_t<std::remove_const_t<DT>>;
    static_assert(detail::is_gemm_output_v<D0>,
                  "octet::grouped_scaled_gemm_k: D must be float, octet::bf16 or "
                  "octet::fp16 (or __nv_bfloat16 / __half)");
    const matrix_ref<D0> d(reinterpret_cast<D0*>(D.data), D.rows, D.cols, D.ld, D.order);
    return detail::grouped_scaled_gemm_k_device<RA, RB, D0>(ex, grouped_quantized_cref<RA>(A),
                                                            grouped_quantized_cref<RB>(B), d, opt);
}

template <class RA, class RB>
std::string grouped_scaled_gemm_support(const stream_executor& ex, gemm_backend backend, std::size_t K,
                                        const gemm_options& opt) {
    if (backend != gemm_backend::automatic) return detail::grouped_device_support<RA, RB>(ex, backend, K, opt);
    std::string whys;
    for (gemm_backend b : {gemm_backend::sm90_wgmma, gemm_backend::sm89_mma}) {
        const std::string why = detail::grouped_device_support<RA, RB>(ex, b, K, opt);
        if (why.empty()) return "";
        whys += detail::message(whys.empty() ? "" : "; ", backend_name(b), ": ", why);
    }
    return whys;
}

}  // namespace octet
