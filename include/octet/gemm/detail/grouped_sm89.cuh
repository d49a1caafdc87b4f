// octet/gemm/detail/grouped_sm89.cuh: the grouped scaled GEMMs on sm_89 and later (mma.sync): one launch
// over the tiles of all groups, each CTA running the dense kernel's tile (sm89_mma.cuh, sm89_gemm_tile)
// on its group's operands, so that each group's result is the dense kernel's on that group.
//
// Grid: x the n tiles, y the m tiles of all groups of the launch (grouped_common.cuh: blockIdx.y ->
// group through the prefix sum of the groups' m tiles). Each group's A, B and scales are its own
// pointers (in the kernel's parameters); the tile's loads are zero-filled past the group's rows (the
// dense kernel's bounds, with M = the group's rows), and rows past the group are not stored.
// Each group has its own K, row bytes and promotion segment (the k-grouped GEMM's groups differ in K).
// Also the sm90 entry's K = 0 case (nothing to multiply: D = bias), as for the dense GEMM.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "octet/gemm/detail/device_common.cuh"
#include "octet/gemm/detail/grouped_common.cuh"
#include "octet/gemm/sm89_mma.cuh"

namespace octet {
namespace detail {

template <class RA, class RB, class CT, class DT>
struct sm89_grouped_params {
    sm89_params<RA, RB, CT, DT> base;                  ///< N and the epilogue over all of D
    std::uint32_t tile_m0[grouped_launch_groups + 1];  ///< group g owns m tiles [tile_m0[g], tile_m0[g + 1])
    std::uint32_t rows[grouped_launch_groups], d_row[grouped_launch_groups];
    std::uint32_t K[grouped_launch_groups], segment[grouped_launch_groups];  ///< group g's K and promotion
    std::uint32_t a_row_bytes[grouped_launch_groups], b_row_bytes[grouped_launch_groups];
    const std::uint8_t* a[grouped_launch_groups];
    const std::uint8_t* b[grouped_launch_groups];
    device_scales<RA> sa[grouped_launch_groups];
    device_scales<RB> sb[grouped_launch_groups];
};

template <class RA, class RB, class CT, class DT>
OCTET_KERNEL void __launch_bounds__(kSm89Threads)
    sm89_grouped_gemm_kernel(const __grid_constant__ sm89_grouped_params<RA, RB, CT, DT> p) {
#if OCTET_ARCH_AT_LEAST(890)
    OCTET_DYNAMIC_SHARED_ALIGNED(std::uint8_t, grouped89_smem, 16);
    const std::uint32_t mt = blockIdx.y, g = grouped_group_of(p.tile_m0, mt);
    sm89_params<RA, RB, CT, DT> q = p.base;  // group g's operands
    q.a = p.a[g];
    q.b = p.b[g];
    q.M = p.rows[g];
    q.K = p.K[g];
    q.segment = p.segment[g];
    q.a_row_bytes = p.a_row_bytes[g];
    q.b_row_bytes = p.b_row_bytes[g];
    q.sa = p.sa[g];
    q.sb = p.sb[g];
    sm89_gemm_tile<true>(q, grouped89_smem, (mt - p.tile_m0[g]) * kSm89BM, blockIdx.x * kSm89BN, p.d_row[g]);
#endif
}

/// Launches the grouped kernel over `count` groups (operands checked by the entry; each group's K is its
/// a's columns), one launch per grouped_launch_groups groups; `promotion`: options.promotion_interval
/// (each group promotes every gemm_segment of it, its blocks and its K).
template <class RA, class RB, class CT, class DT>
void launch_grouped_sm89(cudaStream_t stream, const grouped_device_group<RA, RB>* groups, std::size_t count,
                         std::size_t N, const device_epilogue<CT, DT>& epi, std::size_t promotion) {
    constexpr const char* fn = "octet::grouped_scaled_gemm";
    OCTET_REQUIRE(N < (1u << 31) && epi.M < (1u << 31), fn, "A/B", "has a dimension of 2^31 or more");
    auto kernel = sm89_grouped_gemm_kernel<RA, RB, CT, DT>;
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSm89SmemBytes));
    for (std::size_t first = 0; first < count; first += grouped_launch_groups) {
        const std::size_t G = std::min<std::size_t>(count - first, grouped_launch_groups);
        sm89_grouped_params<RA, RB, CT, DT> p{};
        p.base.N = static_cast<std::uint32_t>(N);
        p.base.epi = epi;
        p.tile_m0[0] = 0;
        for (std::size_t i = 0; i < G; ++i) {
            const grouped_device_group<RA, RB>& gr = groups[first + i];
            const std::size_t rows = gr.a.rows();
            p.tile_m0[i + 1] = p.tile_m0[i] + grouped_tiles(rows, kSm89BM);
            p.rows[i] = static_cast<std::uint32_t>(rows);
            p.d_row[i] = static_cast<std::uint32_t>(gr.d_row);
            if (rows == 0) continue;
            const std::size_t K = gr.a.cols();
            OCTET_REQUIRE(K < (1u << 31) && rows < (1u << 31), fn, "A/B", "has a dimension of 2^31 or more");
            p.K[i] = static_cast<std::uint32_t>(K);
            p.segment[i] = static_cast<std::uint32_t>(
                std::min<std::size_t>(gemm_segment(promotion, std::max<std::size_t>(gr.a.layout.block_cols, 1),
                                                   std::max<std::size_t>(gr.b.layout.block_cols, 1), K),
                                      1u << 30));
            p.a_row_bytes[i] = static_cast<std::uint32_t>(gr.a.layout.row_bytes);
            p.b_row_bytes[i] = static_cast<std::uint32_t>(gr.b.layout.row_bytes);
            p.a[i] = gr.a.data;
            p.b[i] = gr.b.data;
            p.sa[i] = make_device_scales(gr.a);
            p.sb[i] = make_device_scales(gr.b);
            // a group of K = 0 columns has an empty layout (make_grouped_layout): no block to divide by
            p.sa[i].block_rows = std::max<std::uint32_t>(p.sa[i].block_rows, 1u);
            p.sb[i].block_rows = std::max<std::uint32_t>(p.sb[i].block_rows, 1u);
        }
        const std::uint32_t tiles_m = p.tile_m0[G];
        if (tiles_m == 0) continue;
        OCTET_REQUIRE(tiles_m <= 65535u, fn, "A", "has more than 8 million rows in 32 groups; split the call");
        const dim3 grid(grouped_tiles(N, kSm89BN), tiles_m);
        cuda::launch("sm89_grouped_gemm_kernel", kernel, grid, dim3(kSm89Threads), kSm89SmemBytes, stream, p);
        OCTET_CUDA_CHECK_LAUNCH();
    }
}

}  // namespace detail
}  // namespace octet
