// octet/gemm/detail/grouped_sm90.cuh: the grouped scaled GEMMs on Hopper (sm_90a): one persistent
// kernel over the output tiles of all groups of a launch, on the dense kernel's mainloop
// (sm90_wgmma.cuh: its shared-memory ring, mbarriers, and its consumer step sm90_consume_stage: wait,
// 4 wgmma, release, promotion every 128 K elements, so that each group's result is the dense kernel's
// on that group, bit for bit where the dense one equals the host).
//
// Scheduling: the CTAs (one per SM) walk work units u = blockIdx.x, + gridDim.x, ...; unit u is the tile
// (mt, nb) of sm90_tile_coords over the m tiles of all groups (grouped_common.cuh: mt -> group g through
// the prefix sum of the groups' m tiles), so that the tiles of small groups fill the waves that those of
// large groups leave ragged, and concurrently running tiles share B[g] in L2 as the dense raster does.
//
// Where each group's operands are (the choice of this kernel, no device-side tensor-map updates):
//   * A (m-grouped, contiguous and masked): one TMA map over A's whole block of codes, as one matrix of
//     A's row_bytes rows (the grouped layout stacks the groups' rows: group g starts at row
//     data_offset[g] / row_bytes). A tile that reaches past its group's rows reads the next group's rows
//     (or a masked group's padding, or TMA's zero fill past the block); those rows of the tile are never
//     stored, and each output row depends only on its own A row.
//   * A (k-grouped, PerGroupA): one TMA map per group (each group's rows are its own k_g codes long), in
//     the parameters beside B's; each group has its own number of K blocks (num_kb), and TMA zero-fills
//     its ragged last block.
//   * B: one TMA map per group (B[g] may lie anywhere), in the kernel's parameters
//     (sm90_grouped_maps, grouped_launch_groups of them; larger calls launch once per 32 groups).
//   * scales: read by the producer's threads from each group's own scale grid (pointer, ld and block
//     rows in the parameters), a stage ahead as the dense kernel does where its scales do not come by TMA.
//   * D: the epilogue stores a warpgroup's 64 rows with the dense kernel's TMA store (one map over D)
//     when they all lie in the group, and from registers, row by row up to the group's end, otherwise.
// Tiles are 128 x 128, single CTAs, no split-K (MoE groups are tall: per-group M in the thousands).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "octet/cuda/ptx.cuh"
#include "octet/cuda/shared_memory.cuh"
#include "octet/cuda/tensor_map.cuh"
#include "octet/gemm/detail/device_common.cuh"
#include "octet/gemm/detail/grouped_common.cuh"
#include "octet/gemm/sm90_wgmma.cuh"

namespace octet {
namespace detail {

/// The per-group facts of one launch (G <= grouped_launch_groups groups).
template <class CT, class DT>
struct sm90_grouped_params {
    std::uint32_t groups = 0, N = 0;                   ///< N: D's columns (rows of every B[g])
    std::uint32_t tiles_m = 0, tiles_n = 0;            ///< m tiles over all groups; n tiles
    std::uint32_t tile_m0[grouped_launch_groups + 1];  ///< group g owns m tiles [tile_m0[g], tile_m0[g + 1])
    std::uint32_t rows[grouped_launch_groups];         ///< group g's rows
    std::uint32_t a_row[grouped_launch_groups];        ///< its first row in tma_a's matrix
    std::uint32_t d_row[grouped_launch_groups];        ///< its first row of D
    std::uint32_t num_kb[grouped_launch_groups];       ///< its 128-wide K blocks (>= 1 for a group with tiles)
    /// Group g's scales: value(row, kb) = sa[g][(kb * 128 / sa_bc) * sa_ld[g] + row / sa_br[g]] (rows of
    /// the group), and the same for B[g] with its rows (= columns of D).
    const float* sa[grouped_launch_groups];
    const float* sb[grouped_launch_groups];
    std::uint32_t sa_ld[grouped_launch_groups], sa_br[grouped_launch_groups];
    std::uint32_t sb_ld[grouped_launch_groups], sb_br[grouped_launch_groups];
    std::uint32_t sa_bc[grouped_launch_groups], sb_bc[grouped_launch_groups];
    device_epilogue<CT, DT> epi;  ///< over all of D
    bool tma_store = false;       ///< the TMA-store epilogue for warpgroup tiles inside their group (tma_d)
};

/// One TMA map of B per group (128 x 128-byte boxes, 128-byte swizzle), and with PerGroupA one of A per
/// group (the k-grouped GEMM, whose groups' rows have different lengths) instead of the kernel's tma_a.
template <bool PerGroupA>
struct sm90_grouped_maps {
    CUtensorMap b[grouped_launch_groups];
    CUtensorMap a[PerGroupA ? grouped_launch_groups : 1];
};

/// Where unit u's tile lies: its group, its first row within the group, its first column.
struct sm90_grouped_tile {
    std::uint32_t g = 0, m0 = 0, n0 = 0;
};

template <int BM, int BN, class P>
OCTET_DEVICE sm90_grouped_tile sm90_grouped_tile_of(const P& p, std::uint32_t u) {
    std::uint32_t mt, nb;
    sm90_tile_coords(u, p.tiles_m, p.tiles_n, mt, nb);
    sm90_grouped_tile t;
    t.g = grouped_group_of(p.tile_m0, mt);
    t.m0 = (mt - p.tile_m0[t.g]) * BM;
    t.n0 = nb * BN;
    return t;
}

template <class FA, class FB, class Cfg, sm90_b_scales kB, bool PerGroupA, class CT, class DT>
OCTET_KERNEL void __launch_bounds__(Cfg::threads, 1)
    sm90_grouped_gemm_kernel(const __grid_constant__ CUtensorMap tma_a,
                             const __grid_constant__ sm90_grouped_maps<PerGroupA> maps,
                             const __grid_constant__ CUtensorMap tma_d,
                             const __grid_constant__ sm90_grouped_params<CT, DT> p) {
#if OCTET_ARCH_SM90A
    constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, S = Cfg::stages;
    static_assert(kB != sm90_b_scales::per_column || BN <= 128, "one B column of scales per producer thread");
    OCTET_DYNAMIC_SHARED(std::uint8_t, grouped90_smem);
    // The dense kernel's carving (sm90_gemm_kernel): stages from the first 1024-byte boundary.
    const shared_ptr_t<std::uint8_t> smem =
        grouped90_smem + ((1024u - (ptx::shared_address(grouped90_smem) & 1023u)) & 1023u);
    const shared_ptr_t<std::uint8_t> sA = smem;                                               // (S, BM, 128) swizzled
    const shared_ptr_t<std::uint8_t> sB = smem + S * Cfg::a_stage_bytes;                      // (S, BN, 128) swizzled
    const shared_ptr_t<float> sSA = OCTET_SHARED_CAST(float, sB + S * Cfg::b_stage_bytes);    // (S, BM)
    const shared_ptr_t<float> sSB = sSA + S * BM;                                             // (S, BN)
    const shared_ptr_t<std::uint64_t> full = OCTET_SHARED_CAST(std::uint64_t, sSB + S * BN);  // (S)
    const shared_ptr_t<std::uint64_t> empty = full + S;                                       // (S)
    const shared_ptr_t<std::uint8_t> sOut = smem + Cfg::out_offset;  // (consumers, 64, 128) swizzled

    const std::uint32_t tid = threadIdx.x;
    const std::uint32_t wg = tid / 128;
    if (tid == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(ptx::shared_address(full + s), 128);                  // every producer thread arrives
            mbar_init(ptx::shared_address(empty + s), Cfg::consumers * 4);  // one per consumer warp
        }
        mbar_fence_init();
    }
    if (tid == Cfg::consumers * 128) {
        if (!PerGroupA) tma_prefetch_map(&tma_a);
        for (std::uint32_t g = 0; g < p.groups; ++g)
            if (p.tile_m0[g + 1] > p.tile_m0[g]) {
                tma_prefetch_map(&maps.b[g]);
                if (PerGroupA) tma_prefetch_map(&maps.a[g]);
            }
        if (p.tma_store) tma_prefetch_map(&tma_d);
    }
    __syncthreads();

    const std::uint32_t units = p.tiles_m * p.tiles_n;
    if (wg == Cfg::consumers) {
        // ---- producer warpgroup ----
        if constexpr (Cfg::reconfigure_registers) setmaxnreg_dec<Cfg::producer_regs>();
        const std::uint32_t ptid = tid - Cfg::consumers * 128;
        struct stage_scales {
            float a = 0.0f, b = 0.0f;
        };
        // This thread's A scale (row ptid of the tile) and B scale (column ptid; or the tile's one, thread
        // 0; or the tile's two blocks, threads 0 and 1) of K block kb of tile t, from its group's grids.
        auto fetch = [&](const sm90_grouped_tile& t, std::uint32_t kb) {
            const std::uint32_t g = t.g, row = t.m0 + ptid, n = t.n0 + ptid;
            const std::size_t a_col = static_cast<std::size_t>(kb * BK / p.sa_bc[g]) * p.sa_ld[g];
            const std::size_t b_col = static_cast<std::size_t>(kb * BK / p.sb_bc[g]) * p.sb_ld[g];
            stage_scales s;
            if (ptid < static_cast<std::uint32_t>(BM) && row < p.rows[g])
                s.a = __ldg(p.sa[g] + a_col + row / p.sa_br[g]);
            if constexpr (kB == sm90_b_scales::per_tile) {
                if (ptid == 0) s.b = __ldg(p.sb[g] + b_col + t.n0 / p.sb_br[g]);
            } else if constexpr (kB == sm90_b_scales::two_blocks) {
                const std::uint32_t at = ptid == 0 ? t.n0 : t.n0 + sm90_b_split(t.n0, p.sb_br[g]);
                if (ptid < 2u && (ptid == 0 || (at < t.n0 + BN && at < p.N)))
                    s.b = __ldg(p.sb[g] + b_col + at / p.sb_br[g]);
            } else {
                if (ptid < static_cast<std::uint32_t>(BN) && n < p.N) s.b = __ldg(p.sb[g] + b_col + n / p.sb_br[g]);
            }
            return s;
        };
        constexpr std::uint32_t stage_tx = Cfg::a_stage_bytes + Cfg::b_stage_bytes;
        std::uint32_t stage = 0, phase = 0, kb = 0, u = blockIdx.x;
        sm90_grouped_tile t = u < units ? sm90_grouped_tile_of<BM, BN>(p, u) : sm90_grouped_tile{};
        stage_scales next = u < units ? fetch(t, 0) : stage_scales{};
        while (u < units) {
            const stage_scales now = next;
            mbar_wait(ptx::shared_address(empty + stage), phase ^ 1u);
            const std::uint32_t bar = ptx::shared_address(full + stage);
            if (ptid == 0) {
                if constexpr (PerGroupA)
                    tma_load_2d(ptx::shared_address(sA + stage * Cfg::a_stage_bytes), &maps.a[t.g],
                                static_cast<std::int32_t>(kb * BK), static_cast<std::int32_t>(t.m0), bar);
                else
                    tma_load_2d(ptx::shared_address(sA + stage * Cfg::a_stage_bytes), &tma_a,
                                static_cast<std::int32_t>(kb * BK), static_cast<std::int32_t>(p.a_row[t.g] + t.m0),
                                bar);
                tma_load_2d(ptx::shared_address(sB + stage * Cfg::b_stage_bytes), &maps.b[t.g],
                            static_cast<std::int32_t>(kb * BK), static_cast<std::int32_t>(t.n0), bar);
            }
            if (ptid < static_cast<std::uint32_t>(BM)) sSA[stage * BM + ptid] = now.a;
            if constexpr (kB == sm90_b_scales::per_tile) {
                if (ptid == 0) sSB[stage * BN] = now.b;
            } else if constexpr (kB == sm90_b_scales::two_blocks) {
                if (ptid < 2u) sSB[stage * BN + ptid] = now.b;
            } else {
                if (ptid < static_cast<std::uint32_t>(BN)) sSB[stage * BN + ptid] = now.b;
            }
            if (ptid == 0)
                mbar_arrive_expect_tx(bar, stage_tx);
            else
                mbar_arrive(bar);
            if (++kb >= p.num_kb[t.g]) {
                kb = 0;
                u += gridDim.x;
                if (u < units) t = sm90_grouped_tile_of<BM, BN>(p, u);
            }
            if (u < units) next = fetch(t, kb);
            if (++stage == static_cast<std::uint32_t>(S)) {
                stage = 0;
                phase ^= 1u;
            }
        }
    } else {
        // ---- consumer (math) warpgroups ----
        if constexpr (Cfg::reconfigure_registers) setmaxnreg_inc<Cfg::consumer_regs>();
        const std::uint32_t lane = tid % 32, warp = (tid / 32) % 4;
        const std::uint32_t row_in_wg = warp * 16 + lane / 4;  // and row_in_wg + 8
        const std::uint32_t col_in_8 = (lane % 4) * 2;         // and + 1, in each 8-column chunk
        float acc[BN / 2], frag[BN / 2];
        OCTET_UNROLL
        for (int i = 0; i < BN / 2; ++i) frag[i] = 0.0f;
        std::uint32_t stage = 0, phase = 0;
        for (std::uint32_t u = blockIdx.x; u < units; u += gridDim.x) {
            const sm90_grouped_tile t = sm90_grouped_tile_of<BM, BN>(p, u);
            const std::uint32_t split_group =
                kB == sm90_b_scales::two_blocks ? sm90_b_split(t.n0, p.sb_br[t.g]) / 8u : 0u;
            OCTET_UNROLL
            for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
            for (std::uint32_t kb = 0, kbs = p.num_kb[t.g]; kb < kbs; ++kb) {
                sm90_consume_stage<Cfg, kB, FA, FB>(acc, frag, sA, sB, sSA, sSB, full, empty, stage, phase, wg,
                                                    row_in_wg, col_in_8, lane, split_group, 1u);
                if (++stage == static_cast<std::uint32_t>(S)) {
                    stage = 0;
                    phase ^= 1u;
                }
            }
            // This warpgroup's rows [m0w, m0w + 64) of the group: stored up to the group's end only.
            const std::uint32_t rows = p.rows[t.g], m0w = t.m0 + wg * 64, d0 = p.d_row[t.g];
            if (p.tma_store && m0w + 64 <= rows) {
                sm90_store_tile_tma<BN>(tma_d, p.epi, sOut + wg * Cfg::out_stage_bytes, acc, d0 + m0w, t.n0, row_in_wg,
                                        col_in_8, wg, tid % 128 == 0);
            } else {
                const std::uint32_t r0 = m0w + row_in_wg;
                OCTET_UNROLL
                for (int j = 0; j < BN / 8; ++j) {
                    const std::uint32_t n = t.n0 + j * 8 + col_in_8;
                    if (r0 < rows) p.epi.store2(d0 + r0, n, acc[4 * j + 0], acc[4 * j + 1]);
                    if (r0 + 8 < rows) p.epi.store2(d0 + r0 + 8, n, acc[4 * j + 2], acc[4 * j + 3]);
                }
            }
        }
        // the last tile's stores must have read their staging before the CTA's shared memory goes
        if (p.tma_store && tid % 128 == 0) ptx::bulk_wait_group_read<0>();
    }
#endif
}

// ---- host side ----------------------------------------------------------------------------------------

/// A's block seen as one matrix (the m-grouped GEMMs: every group's rows of row_bytes bytes, K codes,
/// group g from row a_row of grouped_device_group on).
struct sm90_flat_a {
    const std::uint8_t* data = nullptr;
    std::size_t rows = 0, row_bytes = 0, K = 0;
};

/// Launches the grouped kernel over `count` <= grouped_launch_groups groups (each group's a and b checked
/// by the entry: device memory, 16-byte aligned rows), D's columns N (every b's rows). !PerGroupA: every
/// group's a lies in `flat` at its a_row; PerGroupA (k-grouped): each group's a and b have their own K (>
/// 0 for a group with rows) and A gets a TMA map per group.
template <bool PerGroupA, class RA, class RB, class CT, class DT>
void launch_grouped_sm90(cudaStream_t stream, const sm90_flat_a& flat, const grouped_device_group<RA, RB>* groups,
                         std::size_t count, std::size_t N, const device_epilogue<CT, DT>& epi) {
    using Cfg = sm90_large;
    using FA = typename RA::format;
    using FB = typename RB::format;
    constexpr sm90_b_scales b_scales = sm90_b_scales_of<RB::granularity::rows, Cfg::BN>();
    constexpr const char* fn = PerGroupA ? "octet::grouped_scaled_gemm_k" : "octet::grouped_scaled_gemm";
    OCTET_REQUIRE(count <= grouped_launch_groups && N < (1u << 31) && flat.rows < (1u << 31) && epi.M < (1u << 31), fn,
                  "A/B", "has a dimension of 2^31 or more");
    const CUtensorMap ma = PerGroupA ? CUtensorMap{}
                                     : cuda::byte_matrix_map(flat.data, flat.rows, flat.K, flat.row_bytes, 128u,
                                                             Cfg::BM, CU_TENSOR_MAP_SWIZZLE_128B, fn);
    const bool tma_store = !epi.d_col_major && (epi.d_ld * sizeof(DT)) % 16 == 0 && is_aligned(epi.d, 16);
    const CUtensorMap md =
        tma_store ? cuda::byte_matrix_map(reinterpret_cast<const std::uint8_t*>(epi.d), epi.M, N * sizeof(DT),
                                          epi.d_ld * sizeof(DT), 128u, 64u, CU_TENSOR_MAP_SWIZZLE_128B, fn)
                  : CUtensorMap{};
    auto kernel = sm90_grouped_gemm_kernel<FA, FB, Cfg, b_scales, PerGroupA, CT, DT>;
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::smem_bytes));
    if constexpr (Cfg::reconfigure_registers)
        cuda::require_register_split(kernel, Cfg::threads,
                                     Cfg::producer_regs * 128 + Cfg::consumer_regs * 128 * Cfg::consumers, fn,
                                     "options.backend", "use gemm_backend::sm89_mma");
    sm90_grouped_params<CT, DT> p{};
    sm90_grouped_maps<PerGroupA> maps{};
    p.groups = static_cast<std::uint32_t>(count);
    p.N = static_cast<std::uint32_t>(N);
    p.tiles_n = grouped_tiles(N, Cfg::BN);
    p.epi = epi;
    p.tma_store = tma_store;
    p.tile_m0[0] = 0;
    for (std::size_t i = 0; i < count; ++i) {
        const grouped_device_group<RA, RB>& gr = groups[i];
        const std::size_t rows = gr.a.rows(), K = gr.a.cols();
        OCTET_REQUIRE(rows == 0 || (K > 0 && K < (1u << 31) && rows < (1u << 31)), fn, "A",
                      message("group ", i, " is ", rows, " x ", K, "; the sm90 kernel takes 0 < K < 2^31"));
        p.tile_m0[i + 1] = p.tile_m0[i] + grouped_tiles(rows, Cfg::BM);
        p.rows[i] = static_cast<std::uint32_t>(rows);
        p.a_row[i] = static_cast<std::uint32_t>(gr.a_row);
        p.d_row[i] = static_cast<std::uint32_t>(gr.d_row);
        p.num_kb[i] = grouped_tiles(K, Cfg::BK);
        p.sa[i] = reinterpret_cast<const float*>(gr.a.scales);
        p.sa_ld[i] = static_cast<std::uint32_t>(gr.a.layout.scale_ld);
        p.sa_br[i] = static_cast<std::uint32_t>(std::max<std::size_t>(gr.a.layout.block_rows, 1));
        p.sa_bc[i] = static_cast<std::uint32_t>(std::max<std::size_t>(gr.a.layout.block_cols, 1));
        p.sb[i] = reinterpret_cast<const float*>(gr.b.scales);
        p.sb_ld[i] = static_cast<std::uint32_t>(gr.b.layout.scale_ld);
        p.sb_br[i] = static_cast<std::uint32_t>(std::max<std::size_t>(gr.b.layout.block_rows, 1));
        p.sb_bc[i] = static_cast<std::uint32_t>(std::max<std::size_t>(gr.b.layout.block_cols, 1));
        if (rows == 0) continue;
        maps.b[i] = sm90_operand_map(gr.b.data, N, K, gr.b.layout.row_bytes, Cfg::BN);
        if constexpr (PerGroupA) maps.a[i] = sm90_operand_map(gr.a.data, rows, K, gr.a.layout.row_bytes, Cfg::BM);
    }
    p.tiles_m = p.tile_m0[count];
    const std::size_t units = static_cast<std::size_t>(p.tiles_m) * p.tiles_n;
    if (units == 0) return;
    const unsigned grid =
        static_cast<unsigned>(std::min<std::size_t>(units, static_cast<std::size_t>(cuda::multiprocessor_count())));
    cuda::launch("sm90_grouped_gemm_kernel", kernel, dim3(grid), dim3(Cfg::threads), Cfg::smem_bytes, stream, ma, maps,
                 md, p);
    OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace detail
}  // namespace octet
