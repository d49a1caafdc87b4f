// octet/gemm/sm90_wgmma.cuh: the fast FP8 GEMM for Hopper (sm_90a): wgmma (QGMMA in SASS) on operands
// that TMA brings into a multi-stage shared-memory ring, warp-specialized, with DeepSeek-V3's
// promotion of the tensor-core accumulator into float registers every 128 K elements.
//
// Serves E4M3/E5M2 operands (any mix) whose float scales change along K only at multiples of 128
// (per-tensor, per-row, 1x128, 128x128, and any block whose K extent is a multiple of 128), with
// promotion every 128. Requires 16-byte aligned operand rows (the padded layout of
// quant_layout_of<R>::make); M, N and K are otherwise free: TMA zero-fills the ragged edges, so a
// decode-like M = 1 reads no padding. Tiles (sm90_plan): 128 x 128; 128 x 192 (fewer tiles, for a last
// wave that 128 x 128 leaves mostly idle); 64 x 64 for small M.
//
// Structure of one CTA (persistent: one CTA per SM walks the output tiles in groups of 8 tile-rows,
// so that concurrently running tiles share A and B in L2):
//   * warpgroup C (the last 128 threads) produces: it waits until a stage is free (empty mbarrier),
//     one thread issues two TMA tile loads (A: BM x 128 bytes, B: BN x 128 bytes, 128-byte swizzle)
//     that complete on the stage's full mbarrier, and the stage's scales arrive: A's (one per row) and
//     B's (sm90_b_scales: one per column; one per tile when B's scale blocks cover the whole tile, as
//     128x128 and per-tensor do at BN 128; or the two blocks a 192-wide tile spans of 128x128).
//     Scales with one value per row, in 16-byte aligned columns (the 1x128 and per-row layouts of
//     quant_layout_of), come by TMA too, on the same mbarrier; the others the producer's threads
//     write, each having fetched its scale of the stage a stage ahead (right after arriving on the
//     previous one, so that the L2 round trip overlaps the wait for the free stage). Then the 128
//     threads arrive on the full mbarrier. It gives away registers (setmaxnreg.dec 40).
//   * warpgroups 0..C-1 consume (setmaxnreg.inc 232): each owns 64 rows of the tile, waits for a
//     stage, reads its scales, issues 4 wgmma m64nBNk32 (K = 128) into the tensor-core accumulator
//     `frag` (the first with scale-d = 0, which restarts it), waits for them, releases the stage
//     (one arrival per warp), then promotes: acc += frag * (sA[row] * sB[col]) (with two B blocks,
//     each 8-column group of frag takes the scale of the block it lies in).
//   * the epilogue forms alpha * acc + beta C + bias, rounded to D's type, while the producer already
//     loads the next tile's first stages. For a row-major D with 16-byte aligned rows (and no split)
//     each warpgroup stages its rows in shared memory, 128 bytes of columns at a time, and one thread
//     stores them with TMA, whose writes proceed while the warpgroup moves on to the next tile;
//     otherwise each thread stores its elements straight from registers.
// A debug build can give every mbarrier wait a watchdog (OCTET_MBARRIER_WATCHDOG, ptx::mbarrier_wait:
// a wait that lasts about 17 s of clock traps the kernel instead of hanging the GPU); by default a
// wait spins until its phase completes, as a legitimate wait on a busy GPU may take long.
//
// Clusters (sm90_plan::cluster 2): the CTAs run in pairs (a thread block cluster) that take the two
// vertically adjacent tiles of one tile column together. Each CTA's producer loads A for its own tile
// and half of their common B tile, which TMA multicasts into both CTAs' stages (each full mbarrier
// expects all of B's bytes); a consumer warp releases a stage on the empty mbarriers of both CTAs (a
// remote arrival through mapa), since the stage of either is written by both producers. So each B
// tile crosses from L2 once per pair instead of once per tile. A cluster barrier orders the mbarrier
// initialisation before the first remote signal, and the last signals before either CTA exits.
//
// Split-K (sm90_plan): the CTAs walk work units, one output tile over one range of whole K blocks;
// with more than one range, each unit writes its float acc to scratch instead of D, and
// sm90_split_k_sum_kernel adds the ranges in order and applies the epilogue. Deterministic: no
// atomics, the same sum order on every run.
#pragma once

#include "octet/cuda/ptx.cuh"
#include "octet/cuda/shared_memory.cuh"  // OCTET_DYNAMIC_SHARED, octet::shared_ptr_t, shared_cast
#include "octet/cuda/tensor_map.cuh"
#include "octet/gemm/detail/device_common.cuh"

namespace octet {
namespace detail {

// ---- PTX wrappers (sm_90a) -------------------------------------------------------------------------

// The mbarrier, TMA and setmaxnreg instructions are octet::ptx's (octet/cuda/ptx.cuh); these names
// keep the kernel's spelling, and emit nothing outside the sm_90a device pass.
OCTET_DEVICE void mbar_init(std::uint32_t bar, std::uint32_t count) {
#if OCTET_ARCH_SM90A
    ptx::mbarrier_init(bar, count);
#endif
}
OCTET_DEVICE void mbar_fence_init() {
#if OCTET_ARCH_SM90A
    ptx::fence_mbarrier_init();
#endif
}
OCTET_DEVICE void mbar_arrive(std::uint32_t bar) {
#if OCTET_ARCH_SM90A
    ptx::mbarrier_arrive(bar);
#endif
}
OCTET_DEVICE void mbar_arrive_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
#if OCTET_ARCH_SM90A
    ptx::mbarrier_arrive_expect_tx(bar, bytes);
#endif
}
/// ptx::mbarrier_wait (the watchdog option is there).
OCTET_DEVICE void mbar_wait(std::uint32_t bar, std::uint32_t parity) {
#if OCTET_ARCH_SM90A
    ptx::mbarrier_wait(bar, parity);
#endif
}
OCTET_DEVICE void tma_load_2d(std::uint32_t dst, const CUtensorMap* map, std::int32_t inner, std::int32_t outer,
                              std::uint32_t bar) {
#if OCTET_ARCH_SM90A
    ptx::tma_load_2d(dst, map, inner, outer, bar);
#endif
}
OCTET_DEVICE void tma_prefetch_map(const CUtensorMap* map) {
#if OCTET_ARCH_SM90A
    ptx::prefetch_tensormap(map);
#endif
}
template <int N>
OCTET_DEVICE void setmaxnreg_inc() {
#if OCTET_ARCH_SM90A
    ptx::setmaxnreg_inc<N>();
#endif
}
template <int N>
OCTET_DEVICE void setmaxnreg_dec() {
#if OCTET_ARCH_SM90A
    ptx::setmaxnreg_dec<N>();
#endif
}
/// Shared-memory matrix descriptor of a K-major tile whose rows are 128 bytes, 128-byte swizzled
/// (what TMA's SWIZZLE_128B writes): 8-row groups 1024 bytes apart (SBO), no leading offset.
OCTET_DEVICE std::uint64_t sm90_smem_desc(std::uint32_t smem_addr) {
    ptx::wgmma_descriptor d;
    d.start = smem_addr;
    d.stride = 1024;
    d.swizzle = ptx::wgmma_swizzle::b128;
    return d.encode();
}

// ---- the kernel -------------------------------------------------------------------------------------

template <int BM_, int BN_, int Stages_>
struct sm90_config {
    static constexpr int BM = BM_, BN = BN_, BK = 128, stages = Stages_;
    static constexpr int consumers = BM / 64;  ///< math warpgroups, 64 rows each
    static constexpr int threads = (consumers + 1) * 128;
    static constexpr int a_stage_bytes = BM * BK, b_stage_bytes = BN * BK;
    static constexpr int ring_bytes =
        stages * (a_stage_bytes + b_stage_bytes) + stages * (BM + BN) * 4 + 2 * stages * 8;
    /// The TMA-store epilogue's staging: per consumer warpgroup 64 rows of 128 bytes (a chunk of its
    /// tile's columns), after the ring at the next 1024-byte boundary (the 128-byte swizzle's atom).
    static constexpr int out_stage_bytes = 64 * 128, out_offset = (ring_bytes + 1023) / 1024 * 1024;
    static constexpr int smem_bytes = 1024 /* alignment slack */ + out_offset + consumers * out_stage_bytes;
    static_assert(smem_bytes <= 227 * 1024, "fits an sm_90 SM's shared memory");
    static constexpr bool reconfigure_registers = consumers == 2;
    static constexpr int producer_regs = 40, consumer_regs = 232;
};
using sm90_large = sm90_config<128, 128, 6>;          // 6 x 32 KB stages
using sm90_wide = sm90_config<128, sm90_wide_bn, 5>;  // 5 x 40 KB stages, for a last wave 128 x 128 leaves idle
using sm90_small = sm90_config<64, 64, 8>;            // 8 x 16 KB stages, for small M and few tiles

template <class CT, class DT>
struct sm90_params {
    std::uint32_t M, N, K, num_kb, tiles_m, tiles_n;
    const float* sa;  ///< A's scales: value(row, kb) = sa[(kb * 128 / sa_bc) * sa_ld + row / sa_br]
    std::uint32_t sa_ld, sa_br, sa_bc;
    const float* sb;  ///< B's scales, the same with B's rows (= columns of D)
    std::uint32_t sb_ld, sb_br, sb_bc;
    device_epilogue<CT, DT> epi;
    /// Split-K: work unit u is output tile u % tiles over K blocks [r * kb_per_split, ...) of range
    /// r = u / tiles; with splits > 1 its acc goes to partial + r * M * N (row-major, ld N), not to epi.
    /// The defaults are one range over all of K.
    std::uint32_t splits = 1, kb_per_split = ~0u;
    float* partial = nullptr;
    /// The epilogue stores through shared memory with TMA (the kernel's tma_d); only with one range.
    bool tma_store = false;
    /// A's (B's) scales of a stage come by TMA (the kernel's tma_sa, tma_sb: the scale matrix as
    /// floats, boxes of BM (BN) rows x one K block); only for one scale per row (sa_br == 1). B's
    /// scales of a per_tile or two_blocks instantiation (sm90_b_scales) are always loaded by threads.
    bool tma_scale_a = false, tma_scale_b = false;
    /// CTAs per thread block cluster (1, or 2 with a cluster launch): a cluster's CTAs compute the
    /// vertically adjacent tiles (tile rows cluster * g + rank) of one tile column, and each loads
    /// BN / cluster rows of their common B tile (tma_b's box) and multicasts them to all.
    std::uint32_t cluster = 1;
};

/// The K blocks [first, end) of split-K range r.
struct sm90_k_range {
    std::uint32_t first, end;
};
template <class CT, class DT>
OCTET_DEVICE sm90_k_range sm90_range(const sm90_params<CT, DT>& p, std::uint32_t r) {
    const std::uint32_t first = r * p.kb_per_split;
    return {first, min(p.num_kb, first + p.kb_per_split)};
}

/// two_blocks (sm90_b_scales): the tile column at which a tile starting at column n0 enters B's next
/// scale block of `rows` rows (BN or more when it does not).
OCTET_HD std::uint32_t sm90_b_split(std::uint32_t n0, std::uint32_t rows) {
    return rows - n0 % rows;
}

/// Tile t of a grouped raster: groups of 8 tile-rows, M fastest within a group's column sweep.
OCTET_DEVICE void sm90_tile_coords(std::uint32_t t, std::uint32_t tiles_m, std::uint32_t tiles_n, std::uint32_t& mb,
                                   std::uint32_t& nb) {
    constexpr std::uint32_t G = 8;
    const std::uint32_t group = t / (G * tiles_n);
    const std::uint32_t first = group * G;
    const std::uint32_t gm = min(G, tiles_m - first);
    const std::uint32_t in = t - group * G * tiles_n;
    mb = first + in % gm;
    nb = in / gm;
}

/// The TMA-store epilogue of one warpgroup's 64 x BN tile (rows m0.., columns n0..; acc in the wgmma
/// accumulator layout: this thread's rows row_in_wg and + 8, columns col_in_8 and + 1 of each 8-column
/// group), through `stage` (64 rows of 128 bytes, 128-byte swizzled as tma_d's box), one 128-byte column
/// chunk at a time: the elements rounded as device_epilogue::value says (zero outside D: the TMA store
/// clips them), made visible to the async proxy, then stored by the warpgroup's `leader` thread, which
/// first waits until its previous store has read the staging. Named barrier 1 + wg orders the warpgroup.
template <int BN, class CT, class DT>
OCTET_DEVICE void sm90_store_tile_tma(const CUtensorMap& tma_d, const device_epilogue<CT, DT>& epi,
                                      shared_ptr_t<std::uint8_t> stage, const float (&acc)[BN / 2], std::uint32_t m0,
                                      std::uint32_t n0, std::uint32_t row_in_wg, std::uint32_t col_in_8,
                                      std::uint32_t wg, bool leader) {
#if OCTET_ARCH_SM90A
    constexpr int EC = 128 / static_cast<int>(sizeof(DT));  // columns per chunk
    static_assert(BN % EC == 0, "whole chunks per tile");
    const std::uint32_t stage_addr = ptx::shared_address(stage);
    OCTET_UNROLL
    for (int c = 0; c < BN / EC; ++c) {
        if (leader) ptx::bulk_wait_group_read<0>();  // the previous chunk's store has read the staging
        ptx::bar_sync(1 + wg, 128);
        OCTET_UNROLL
        for (int q = 0; q < EC / 8; ++q) {
            const int j = c * (EC / 8) + q;  // 8-column group of the tile
            OCTET_UNROLL
            for (int h = 0; h < 2; ++h) {  // rows row_in_wg and row_in_wg + 8
                const std::uint32_t row = row_in_wg + 8u * h, i = m0 + row;
                const std::uint32_t col = static_cast<std::uint32_t>(q * 8) + col_in_8;  // in the chunk
                const std::uint32_t n = n0 + static_cast<std::uint32_t>(c * EC) + col;
                const bool in_rows = i < epi.M;
                const DT v0 = in_rows && n < epi.N ? store_from_float<DT>(epi.value(i, n, acc[4 * j + 2 * h])) : DT{};
                const DT v1 =
                    in_rows && n + 1 < epi.N ? store_from_float<DT>(epi.value(i, n + 1, acc[4 * j + 2 * h + 1])) : DT{};
                const std::uint32_t byte = col * static_cast<std::uint32_t>(sizeof(DT));
                const std::uint32_t off = row * 128u + (((byte / 16u) ^ (row % 8u)) * 16u) + byte % 16u;
                *OCTET_SHARED_CAST(DT, stage + off) = v0;
                *OCTET_SHARED_CAST(DT, stage + off + sizeof(DT)) = v1;
            }
        }
        ptx::fence_proxy_async_shared();  // the staging, for the TMA store's reads
        ptx::bar_sync(1 + wg, 128);
        if (leader) {
            ptx::tma_store_2d(&tma_d, static_cast<std::int32_t>((n0 + static_cast<std::uint32_t>(c * EC)) * sizeof(DT)),
                              static_cast<std::int32_t>(m0), stage_addr);
            ptx::bulk_commit_group();
        }
    }
#else
    (void)tma_d, (void)epi, (void)stage, (void)acc, (void)m0, (void)n0, (void)row_in_wg, (void)col_in_8, (void)wg,
        (void)leader;
#endif
}

/// One K block of a consumer warpgroup (the mainloop step the dense and the grouped kernels share,
/// detail/grouped_sm90.cuh): waits for stage `stage` (its full mbarrier at parity `phase`), reads the
/// stage's scales of this thread's rows and columns, issues 4 wgmma m64nBNk32 (K = 128) into the
/// tensor-core accumulator `frag` (the first with scale-d = 0, which restarts it), waits for them,
/// releases the stage (one arrival per warp, on the empty mbarriers of all `cl` CTAs of the cluster),
/// then promotes: acc += frag * (sA[row] * sB[col]) (two_blocks: 8-column groups from `split_group` on
/// take B's second block). The carving of shared memory is the kernel's (sA, sB, sSA, sSB, full, empty).
template <class Cfg, sm90_b_scales kB, class FA, class FB>
OCTET_DEVICE void sm90_consume_stage(float (&acc)[Cfg::BN / 2], float (&frag)[Cfg::BN / 2],
                                     shared_ptr_t<std::uint8_t> sA, shared_ptr_t<std::uint8_t> sB,
                                     shared_ptr_t<float> sSA, shared_ptr_t<float> sSB, shared_ptr_t<std::uint64_t> full,
                                     shared_ptr_t<std::uint64_t> empty, std::uint32_t stage, std::uint32_t phase,
                                     std::uint32_t wg, std::uint32_t row_in_wg, std::uint32_t col_in_8,
                                     std::uint32_t lane, std::uint32_t split_group, std::uint32_t cl) {
#if OCTET_ARCH_SM90A
    constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK;
    mbar_wait(ptx::shared_address(full + stage), phase);
    const float sa0 = sSA[stage * BM + wg * 64 + row_in_wg];
    const float sa1 = sSA[stage * BM + wg * 64 + row_in_wg + 8];
    float sb[kB == sm90_b_scales::per_tile ? 1 : kB == sm90_b_scales::two_blocks ? 2 : BN / 4];
    if constexpr (kB == sm90_b_scales::per_tile) {
        sb[0] = sSB[stage * BN];
    } else if constexpr (kB == sm90_b_scales::two_blocks) {
        const float2 v = *shared_cast<const float2>(sSB + stage * BN);
        sb[0] = v.x;
        sb[1] = v.y;
    } else {
        OCTET_UNROLL
        for (int j = 0; j < BN / 8; ++j) {
            const float2 v = *shared_cast<const float2>(sSB + stage * BN + j * 8 + col_in_8);
            sb[2 * j] = v.x;
            sb[2 * j + 1] = v.y;
        }
    }
    const std::uint64_t da = sm90_smem_desc(ptx::shared_address(sA + stage * Cfg::a_stage_bytes + wg * 64 * BK));
    const std::uint64_t db = sm90_smem_desc(ptx::shared_address(sB + stage * Cfg::b_stage_bytes));
    OCTET_UNROLL
    for (int i = 0; i < BN / 2; ++i) ptx::fence_operand(frag[i]);
    ptx::wgmma_fence();
    OCTET_UNROLL
    for (int k = 0; k < BK / 32; ++k)  // 32 K-bytes per wgmma: +2 in the descriptor's address field
        ptx::wgmma_m64nNk32<BN, FA, FB>(frag, da + 2u * k, db + 2u * k, k > 0 ? 1u : 0u);
    ptx::wgmma_commit_group();
    OCTET_UNROLL
    for (int i = 0; i < BN / 2; ++i) ptx::fence_operand(frag[i]);
    ptx::wgmma_wait_group<0>();
    OCTET_UNROLL
    for (int i = 0; i < BN / 2; ++i) ptx::fence_operand(frag[i]);
    __syncwarp();
    if (lane == 0) {  // this warp is done with the stage, in every CTA of the cluster
        const std::uint32_t e = ptx::shared_address(empty + stage);
        if (cl > 1) {
            for (std::uint32_t r = 0; r < cl; ++r) ptx::mbarrier_arrive_cluster(ptx::mapa_shared(e, r));
        } else {
            mbar_arrive(e);
        }
    }
    // promotion: acc += frag * (sA * sB)
    if constexpr (kB == sm90_b_scales::per_tile) {
        const float s0 = sa0 * sb[0], s1 = sa1 * sb[0];
        OCTET_UNROLL
        for (int j = 0; j < BN / 8; ++j) {
            acc[4 * j + 0] += frag[4 * j + 0] * s0;
            acc[4 * j + 1] += frag[4 * j + 1] * s0;
            acc[4 * j + 2] += frag[4 * j + 2] * s1;
            acc[4 * j + 3] += frag[4 * j + 3] * s1;
        }
    } else if constexpr (kB == sm90_b_scales::two_blocks) {
        const float s00 = sa0 * sb[0], s10 = sa1 * sb[0], s01 = sa0 * sb[1], s11 = sa1 * sb[1];
        OCTET_UNROLL
        for (int j = 0; j < BN / 8; ++j) {
            const bool first = static_cast<std::uint32_t>(j) < split_group;
            const float s0 = first ? s00 : s01, s1 = first ? s10 : s11;
            acc[4 * j + 0] += frag[4 * j + 0] * s0;
            acc[4 * j + 1] += frag[4 * j + 1] * s0;
            acc[4 * j + 2] += frag[4 * j + 2] * s1;
            acc[4 * j + 3] += frag[4 * j + 3] * s1;
        }
    } else {
        OCTET_UNROLL
        for (int j = 0; j < BN / 8; ++j) {
            acc[4 * j + 0] += frag[4 * j + 0] * (sa0 * sb[2 * j]);
            acc[4 * j + 1] += frag[4 * j + 1] * (sa0 * sb[2 * j + 1]);
            acc[4 * j + 2] += frag[4 * j + 2] * (sa1 * sb[2 * j]);
            acc[4 * j + 3] += frag[4 * j + 3] * (sa1 * sb[2 * j + 1]);
        }
    }
#else
    (void)acc, (void)frag, (void)sA, (void)sB, (void)sSA, (void)sSB, (void)full, (void)empty, (void)stage, (void)phase,
        (void)wg, (void)row_in_wg, (void)col_in_8, (void)lane, (void)split_group, (void)cl;
#endif
}

/// With p.tma_store the epilogue stages each warpgroup's tile through shared memory, 128-byte column
/// chunks at a time, and stores them with TMA (tma_d: D as a byte matrix, boxes of 64 rows x 128
/// bytes, 128-byte swizzle; sm90_store_tile_tma); otherwise each thread stores its elements from
/// registers (device_epilogue::store2). A runtime choice, so that both epilogues share one
/// instantiation (and one compile).
template <class FA, class FB, class Cfg, sm90_b_scales kB, class CT, class DT>
OCTET_KERNEL void __launch_bounds__(Cfg::threads, 1)
    sm90_gemm_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                     const __grid_constant__ CUtensorMap tma_sa, const __grid_constant__ CUtensorMap tma_sb,
                     const __grid_constant__ CUtensorMap tma_d, const __grid_constant__ sm90_params<CT, DT> p) {
#if OCTET_ARCH_SM90A
    constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, S = Cfg::stages;
    OCTET_DYNAMIC_SHARED(std::uint8_t, gemm90_smem);
    // The same carving of the dynamic shared memory twice: under nvcc with reinterpret_cast, as before
    // (shared_cast there, an inline function, changes the sm_90a schedule though not the result).
    // The stages start at the first 1024-byte boundary of dynamic shared memory (the 128-byte swizzle's
    // atom; the launcher reserves the slack). The padding is added to the shared array itself, so that
    // nvcc keeps every pointer below in the shared address space: rebuilt from an integer, the pointer
    // made the scale reads generic loads. (The interpreter's window is aligned already: no padding.)
    const shared_ptr_t<std::uint8_t> smem =
        gemm90_smem + ((1024u - (ptx::shared_address(gemm90_smem) & 1023u)) & 1023u);
    const shared_ptr_t<std::uint8_t> sA = smem;                                               // (S, BM, 128) swizzled
    const shared_ptr_t<std::uint8_t> sB = smem + S * Cfg::a_stage_bytes;                      // (S, BN, 128) swizzled
    const shared_ptr_t<float> sSA = OCTET_SHARED_CAST(float, sB + S * Cfg::b_stage_bytes);    // (S, BM)
    const shared_ptr_t<float> sSB = sSA + S * BM;                                             // (S, BN)
    const shared_ptr_t<std::uint64_t> full = OCTET_SHARED_CAST(std::uint64_t, sSB + S * BN);  // (S)
    const shared_ptr_t<std::uint64_t> empty = full + S;                                       // (S)
    const shared_ptr_t<std::uint8_t> sOut = smem + Cfg::out_offset;  // (consumers, 64, 128) swizzled, p.tma_store

    const std::uint32_t tid = threadIdx.x;
    const std::uint32_t wg = tid / 128;
    // With a cluster of cl CTAs each stage's B tile is filled by all of them (multicast), so a stage
    // is free only when the consumers of every CTA of the cluster have released it.
    const std::uint32_t cl = p.cluster, rank = cl > 1 ? ptx::cluster_ctarank() : 0u;
    if (tid == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(ptx::shared_address(full + s), 128);                       // every producer thread arrives
            mbar_init(ptx::shared_address(empty + s), Cfg::consumers * 4 * cl);  // one per consumer warp
        }
        mbar_fence_init();
    }
    if (tid == Cfg::consumers * 128) {
        tma_prefetch_map(&tma_a);
        tma_prefetch_map(&tma_b);
        if (p.tma_scale_a) tma_prefetch_map(&tma_sa);
        if (kB == sm90_b_scales::per_column && p.tma_scale_b) tma_prefetch_map(&tma_sb);
        if (p.tma_store) tma_prefetch_map(&tma_d);
    }
    __syncthreads();
    if (cl > 1) {  // the cluster's mbarriers are initialised before any CTA signals another's
        ptx::barrier_cluster_arrive();
        ptx::barrier_cluster_wait();
    }

    // Work unit u: tile group u % tiles (cl tile rows of one tile column) over split-K range u / tiles.
    // A cluster walks its units together, from its index on, by the number of clusters.
    const std::uint32_t groups_m = (p.tiles_m + cl - 1) / cl, tiles = groups_m * p.tiles_n, units = tiles * p.splits;
    const std::uint32_t first_unit = blockIdx.x / cl, unit_stride = gridDim.x / cl;
    // This CTA's tile of unit u (tile rows from p.tiles_m on, in a ragged last group, lie below M: TMA
    // zero-fills their A, and their results are not stored).
    auto tile_of = [&](std::uint32_t u, std::uint32_t& mb, std::uint32_t& nb) {
        sm90_tile_coords(u % tiles, groups_m, p.tiles_n, mb, nb);
        mb = mb * cl + rank;
    };
    if (wg == Cfg::consumers) {
        // ---- producer warpgroup ----
        if constexpr (Cfg::reconfigure_registers) setmaxnreg_dec<Cfg::producer_regs>();
        const std::uint32_t ptid = tid - Cfg::consumers * 128;
        static_assert(BM <= 128 && (kB != sm90_b_scales::per_column || BN <= 128),
                      "one A row and one B column of scales per producer thread");
        // This thread's A scale (row ptid) and B scale (column ptid; or the tile's one, thread 0; or
        // the tile's two blocks, threads 0 and 1) of one stage, where they do not come by TMA, fetched
        // from global memory a stage ahead of their use, so that the L2 round trips overlap the wait
        // for the next free stage instead of delaying the stage's arrival.
        const bool tma_sb_used = kB == sm90_b_scales::per_column && p.tma_scale_b;
        const std::uint32_t stage_tx =
            Cfg::a_stage_bytes + Cfg::b_stage_bytes + (p.tma_scale_a ? BM * 4u : 0u) + (tma_sb_used ? BN * 4u : 0u);
        struct stage_scales {
            float a = 0.0f, b = 0.0f;
        };
        auto fetch = [&](std::uint32_t u, std::uint32_t kb) {
            std::uint32_t mb, nb;
            tile_of(u, mb, nb);
            const std::uint32_t row = mb * BM + ptid, n0 = nb * BN, n = n0 + ptid;
            const std::size_t a_col = static_cast<std::size_t>(kb * BK / p.sa_bc) * p.sa_ld;
            const std::size_t b_col = static_cast<std::size_t>(kb * BK / p.sb_bc) * p.sb_ld;
            stage_scales s;
            if (!p.tma_scale_a && ptid < static_cast<std::uint32_t>(BM) && row < p.M)
                s.a = __ldg(p.sa + a_col + row / p.sa_br);
            if constexpr (kB == sm90_b_scales::per_tile) {
                if (ptid == 0) s.b = __ldg(p.sb + b_col + n0 / p.sb_br);
            } else if constexpr (kB == sm90_b_scales::two_blocks) {
                // thread 1: the block after the split, where the tile reaches it within N
                const std::uint32_t at = ptid == 0 ? n0 : n0 + sm90_b_split(n0, p.sb_br);
                if (ptid < 2u && (ptid == 0 || (at < n0 + BN && at < p.N))) s.b = __ldg(p.sb + b_col + at / p.sb_br);
            } else {
                if (!tma_sb_used && ptid < static_cast<std::uint32_t>(BN) && n < p.N)
                    s.b = __ldg(p.sb + b_col + n / p.sb_br);
            }
            return s;
        };
        std::uint32_t stage = 0, phase = 0;
        std::uint32_t u = first_unit;
        sm90_k_range range = sm90_range(p, u / tiles);
        std::uint32_t kb = range.first;
        stage_scales next = u < units ? fetch(u, kb) : stage_scales{};
        while (u < units) {
            std::uint32_t mb, nb;
            tile_of(u, mb, nb);
            const std::uint32_t m0 = mb * BM, n0 = nb * BN;
            const stage_scales now = next;
            mbar_wait(ptx::shared_address(empty + stage), phase ^ 1u);
            const std::uint32_t bar = ptx::shared_address(full + stage);
            if (ptid == 0) {
                tma_load_2d(ptx::shared_address(sA + stage * Cfg::a_stage_bytes), &tma_a,
                            static_cast<std::int32_t>(kb * BK), static_cast<std::int32_t>(m0), bar);
                if (cl > 1) {  // this CTA's share of the B tile, into every CTA of the cluster
                    const std::uint32_t rows = BN / cl;
                    ptx::tma_load_2d_multicast(ptx::shared_address(sB + stage * Cfg::b_stage_bytes + rank * rows * BK),
                                               &tma_b, static_cast<std::int32_t>(kb * BK),
                                               static_cast<std::int32_t>(n0 + rank * rows), bar,
                                               static_cast<std::uint16_t>((1u << cl) - 1u));
                } else {
                    tma_load_2d(ptx::shared_address(sB + stage * Cfg::b_stage_bytes), &tma_b,
                                static_cast<std::int32_t>(kb * BK), static_cast<std::int32_t>(n0), bar);
                }
                // the scale columns of K block kb: rows m0.. (n0..), zero past M (N)
                if (p.tma_scale_a)
                    tma_load_2d(ptx::shared_address(sSA + stage * BM), &tma_sa, static_cast<std::int32_t>(m0),
                                static_cast<std::int32_t>(kb * BK / p.sa_bc), bar);
                if (tma_sb_used)
                    tma_load_2d(ptx::shared_address(sSB + stage * BN), &tma_sb, static_cast<std::int32_t>(n0),
                                static_cast<std::int32_t>(kb * BK / p.sb_bc), bar);
            }
            if (!p.tma_scale_a && ptid < static_cast<std::uint32_t>(BM)) sSA[stage * BM + ptid] = now.a;
            if constexpr (kB == sm90_b_scales::per_tile) {
                if (ptid == 0) sSB[stage * BN] = now.b;
            } else if constexpr (kB == sm90_b_scales::two_blocks) {
                if (ptid < 2u) sSB[stage * BN + ptid] = now.b;
            } else {
                if (!tma_sb_used && ptid < static_cast<std::uint32_t>(BN)) sSB[stage * BN + ptid] = now.b;
            }
            if (ptid == 0)
                mbar_arrive_expect_tx(bar, stage_tx);
            else
                mbar_arrive(bar);
            if (++kb >= range.end) {
                u += unit_stride;
                range = sm90_range(p, u / tiles);
                kb = range.first;
            }
            if (u < units) next = fetch(u, kb);
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
        for (std::uint32_t u = first_unit; u < units; u += unit_stride) {
            std::uint32_t mb, nb;
            tile_of(u, mb, nb);
            const sm90_k_range range = sm90_range(p, u / tiles);
            // two_blocks: the first 8-column group of the tile in B's second scale block
            const std::uint32_t split_group =
                kB == sm90_b_scales::two_blocks ? sm90_b_split(nb * BN, p.sb_br) / 8u : 0u;
            OCTET_UNROLL
            for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
            for (std::uint32_t kb = range.first; kb < range.end; ++kb) {
                sm90_consume_stage<Cfg, kB, FA, FB>(acc, frag, sA, sB, sSA, sSB, full, empty, stage, phase, wg,
                                                    row_in_wg, col_in_8, lane, split_group, cl);
                if (++stage == static_cast<std::uint32_t>(S)) {
                    stage = 0;
                    phase ^= 1u;
                }
            }
            const std::uint32_t r0 = mb * BM + wg * 64 + row_in_wg;
            if (p.splits > 1) {  // this range's acc, for sm90_split_k_sum_kernel
                float* const part = p.partial + static_cast<std::size_t>(u / tiles) * p.M * p.N;
                auto put = [&](std::uint32_t r, std::uint32_t n, float v0, float v1) {
                    if (r >= p.M) return;
                    float* const at = part + static_cast<std::size_t>(r) * p.N + n;
                    if (n + 1 < p.N && p.N % 2 == 0) {
                        *reinterpret_cast<float2*>(at) = make_float2(v0, v1);
                    } else {
                        if (n < p.N) at[0] = v0;
                        if (n + 1 < p.N) at[1] = v1;
                    }
                };
                OCTET_UNROLL
                for (int j = 0; j < BN / 8; ++j) {
                    const std::uint32_t n = nb * BN + j * 8 + col_in_8;
                    put(r0, n, acc[4 * j + 0], acc[4 * j + 1]);
                    put(r0 + 8, n, acc[4 * j + 2], acc[4 * j + 3]);
                }
                continue;
            }
            if (p.tma_store) {
                sm90_store_tile_tma<BN>(tma_d, p.epi, sOut + wg * Cfg::out_stage_bytes, acc, mb * BM + wg * 64, nb * BN,
                                        row_in_wg, col_in_8, wg, tid % 128 == 0);
            } else {
                OCTET_UNROLL
                for (int j = 0; j < BN / 8; ++j) {
                    const std::uint32_t n = nb * BN + j * 8 + col_in_8;
                    p.epi.store2(r0, n, acc[4 * j + 0], acc[4 * j + 1]);
                    p.epi.store2(r0 + 8, n, acc[4 * j + 2], acc[4 * j + 3]);
                }
            }
        }
        // the last tile's stores must have read their staging before the CTA's shared memory goes
        if (p.tma_store && tid % 128 == 0) ptx::bulk_wait_group_read<0>();
    }
    if (cl > 1) {  // no CTA leaves while another may still signal its mbarriers
        ptx::barrier_cluster_arrive();
        ptx::barrier_cluster_wait();
    }
#endif
}

/// Split-K's second kernel: D = epilogue(sum of the ranges' accs, added in range order from 0, the
/// first exactly), one element per thread of a grid-stride loop, coalesced along D's rows.
template <class CT, class DT>
OCTET_KERNEL void sm90_split_k_sum_kernel(const float* __restrict__ partial, std::uint32_t splits,
                                          const __grid_constant__ device_epilogue<CT, DT> epi) {
    const std::size_t count = static_cast<std::size_t>(epi.M) * epi.N;
    for (std::size_t e = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
         e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        float acc = 0.0f;
        for (std::uint32_t r = 0; r < splits; ++r) acc += partial[r * count + e];
        epi.store(static_cast<std::uint32_t>(e / epi.N), static_cast<std::uint32_t>(e % epi.N), acc);
    }
}

/// Its sm_90a image carries the probe marker (device_common.cuh): never launched, only inspected.
OCTET_KERNEL void sm90a_probe_kernel() {
#if OCTET_ARCH_SM90A
    OCTET_PROBE_MARKER();
#endif
}

/// Whether this binary holds sm_90a code (wgmma, setmaxnreg) for the running device (no
/// allocation, no launch, no synchronization).
inline bool sm90a_available() {
    if (cuda::compute_capability() != 90) return false;
    static std::atomic<int> cache[64] = {};
    return image_has_marker(sm90a_probe_kernel, cache);
}

// ---- host side: tensor maps and launch --------------------------------------------------------------

/// A TMA map over an operand's codes: rows x K bytes, rows `row_bytes` apart, boxes of box_rows x 128
/// bytes with the 128-byte swizzle the kernel's wgmma descriptors assume (zero fill outside the matrix;
/// another swizzle only for tests of a mismatched layout).
inline CUtensorMap sm90_operand_map(const std::uint8_t* data, std::size_t rows, std::size_t K, std::size_t row_bytes,
                                    std::uint32_t box_rows, CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
    return cuda::byte_matrix_map(data, rows, K, row_bytes, 128u, box_rows, swizzle, "octet::scaled_gemm");
}

/// Whether an operand's scales can come by TMA: one float per row (block_rows 1: 1x128 or per-row), the
/// scale columns (scale_ld floats apart) and the data 16-byte aligned, as TMA asks.
inline bool sm90_scales_by_tma(const void* scales, const quant_layout& l) {
    return l.block_rows == 1 && (l.scale_ld * sizeof(float)) % 16 == 0 && is_aligned(scales, 16);
}

/// A TMA map over an operand's scales (sm90_scales_by_tma): scale_rows x scale_cols floats, column kb
/// of the scale blocks contiguous (scale_ld apart), boxes of `box_rows` rows of one column.
inline CUtensorMap sm90_scale_map(const void* scales, const quant_layout& l, std::uint32_t box_rows) {
    return cuda::float_matrix_map(static_cast<const float*>(scales), l.scale_cols, l.scale_rows,
                                  l.scale_ld * sizeof(float), box_rows, 1u, "octet::scaled_gemm");
}

/// The sm90 kernel's tile, cluster and split-K ranges for an M x N x K problem.
struct sm90_plan {
    gemm_tile tile = gemm_tile::m128n128;
    std::uint32_t cluster = 1;       ///< CTAs per cluster: 2 multicasts each B tile to a pair of tiles
    std::uint32_t splits = 1;        ///< K ranges (1: no split-K)
    std::uint32_t kb_per_split = 0;  ///< 128-element K blocks per range (the last may have fewer)
    /// Device scratch the split needs: the ranges' float accs (0 without a split).
    std::size_t scratch_bytes(std::size_t M, std::size_t N) const {
        return splits > 1 ? static_cast<std::size_t>(splits) * M * N * sizeof(float) : 0;
    }
};

/// The plan for the requested tile, cluster and split (options.tile, options.cluster, options.split_k;
/// 0 and automatic are chosen here) on a GPU with `sms` multiprocessors; `wide_serves`: whether the
/// 128 x 192 tile serves B's scales (sm90_wide_serves), else an automatic choice leaves it out. Automatic
/// choices minimize a model, not a measurement: time ~ waves of work units x the work of one unit,
/// where a 128 x 192 tile does 1.5 times a 128 x 128 tile's work at the same efficiency, a 64 x 64 tile
/// a quarter of it at about 70% (less reuse of each byte loaded), a range does 1 / splits of its
/// tile's, and a split costs 10% more for writing and summing the partial accs. So the wide tile is
/// taken where the last wave of 128 x 128 tiles would leave SMs idle that fewer, larger tiles fill
/// (8192^3 on 132 SMs: 32 waves of 4096 tiles, against 21 of 2752 at 1.5 times the work; the model's
/// ties keep 128 x 128). An automatic split is only for outputs whose tiles leave SMs idle: it makes at
/// most one wave of work units (a finer split would fill later waves better in the model, but every
/// range adds M x N floats of partial sums to write and read), and keeps at least 4 K blocks per range,
/// so that the 5-8 stage ring still fills. Pairs of CTAs (cluster 2) run one unit of two tiles per
/// pair, sms / 2 at a time; the model counts no gain for them (half of B's loads from L2: the data is
/// reused, the time to move it is not modelled), so an automatic choice takes them where they cost no
/// more waves and the output has at least two tile rows to pair.
inline sm90_plan sm90_choose_plan(std::size_t M, std::size_t N, std::size_t K, gemm_tile tile, int split_k, int sms,
                                  bool wide_serves, int cluster = 1) {
    const std::size_t num_kb = std::max<std::size_t>((K + 127) / 128, 1);
    const std::size_t gpu = static_cast<std::size_t>(std::max(sms, 1));
    sm90_plan plan;
    double best = -1.0;
    for (gemm_tile t : {gemm_tile::m128n128, gemm_tile::m128n192, gemm_tile::m64n64}) {
        if (tile != gemm_tile::automatic && t != tile) continue;
        if (tile == gemm_tile::automatic && t == gemm_tile::m128n192 && !wide_serves) continue;
        const bool small = t == gemm_tile::m64n64, wide = t == gemm_tile::m128n192;
        const std::size_t bm = small ? 64 : 128, bn = small ? 64 : wide ? sm90_wide_bn : 128;
        const std::size_t tiles_m = (M + bm - 1) / bm, tiles = tiles_m * ((N + bn - 1) / bn);
        const double work = small ? 1.0 / 0.7 : wide ? 6.0 : 4.0;  // in 64 x 64 tiles at full efficiency
        // An explicit split_k is taken as asked (at most one range per K block).
        const std::size_t most = split_k > 0
                                     ? std::min<std::size_t>(static_cast<std::size_t>(split_k), num_kb)
                                     : std::max<std::size_t>(std::min({num_kb / 4, std::size_t{16}, gpu / tiles}), 1);
        for (std::size_t s = split_k > 0 ? most : 1; s <= most; ++s)
            for (std::size_t cl : {2, 1}) {  // pairs first: they win ties
                if (cluster > 0 ? cl != static_cast<std::size_t>(cluster) : cl == 2 && (tiles_m < 2 || gpu < 2))
                    continue;
                const std::size_t units = (tiles_m + cl - 1) / cl * (tiles / tiles_m) * s;
                const double waves =
                    std::ceil(static_cast<double>(units) / static_cast<double>(std::max<std::size_t>(gpu / cl, 1)));
                const double c = waves * work / static_cast<double>(s) * (s > 1 ? 1.1 : 1.0);
                if (best < 0 || c < best) {
                    best = c;
                    plan.tile = t;
                    plan.cluster = static_cast<std::uint32_t>(cl);
                    plan.splits = static_cast<std::uint32_t>(s);
                }
            }
    }
    // Whole blocks per range, and no empty range: ceil(num_kb / ceil(num_kb / splits)) ranges.
    plan.kb_per_split = static_cast<std::uint32_t>((num_kb + plan.splits - 1) / plan.splits);
    plan.splits = static_cast<std::uint32_t>((num_kb + plan.kb_per_split - 1) / plan.kb_per_split);
    return plan;
}

/// options' plan on the current GPU for a B of recipe RB.
template <class RB>
sm90_plan sm90_choose_plan(std::size_t M, std::size_t N, std::size_t K, const gemm_options& opt) {
    return sm90_choose_plan(M, N, K, opt.tile, opt.split_k, cuda::multiprocessor_count(), sm90_wide_serves<RB>(),
                            opt.cluster);
}

/// The kernel's parameters for D = epilogue(A B^T) on tile configuration Cfg: shape, tile counts, scale
/// layouts and the epilogue; one K range, the register-stored epilogue and the scales loaded by
/// threads (the launcher then sets the plan's split and the TMA choices).
template <class Cfg, class RA, class RB, class CT, class DT>
sm90_params<CT, DT> sm90_problem_params(const quantized_cref<RA>& A, const quantized_cref<RB>& B,
                                        const device_epilogue<CT, DT>& epi) {
    const std::size_t M = A.rows(), N = B.rows(), K = A.cols();
    sm90_params<CT, DT> p{};
    p.M = static_cast<std::uint32_t>(M);
    p.N = static_cast<std::uint32_t>(N);
    p.K = static_cast<std::uint32_t>(K);
    p.num_kb = static_cast<std::uint32_t>((K + Cfg::BK - 1) / Cfg::BK);
    p.tiles_m = static_cast<std::uint32_t>((M + Cfg::BM - 1) / Cfg::BM);
    p.tiles_n = static_cast<std::uint32_t>((N + Cfg::BN - 1) / Cfg::BN);
    p.sa = reinterpret_cast<const float*>(A.scales);
    p.sa_ld = static_cast<std::uint32_t>(A.layout.scale_ld);
    p.sa_br = static_cast<std::uint32_t>(A.layout.block_rows);
    p.sa_bc = static_cast<std::uint32_t>(A.layout.block_cols);
    p.sb = reinterpret_cast<const float*>(B.scales);
    p.sb_ld = static_cast<std::uint32_t>(B.layout.scale_ld);
    p.sb_br = static_cast<std::uint32_t>(B.layout.block_rows);
    p.sb_bc = static_cast<std::uint32_t>(B.layout.block_cols);
    p.epi = epi;
    return p;
}

template <class RA, class RB, class Cfg, class CT, class DT>
void launch_sm90_config(cudaStream_t stream, const quantized_cref<RA>& A, const quantized_cref<RB>& B,
                        const device_epilogue<CT, DT>& epi, const sm90_plan& plan, float* partial) {
    using FA = typename RA::format;
    using FB = typename RB::format;
    // How B's scales vary across a tile of this configuration (per tile, two blocks or per column).
    constexpr sm90_b_scales b_scales = sm90_b_scales_of<RB::granularity::rows, Cfg::BN>();
    const std::size_t M = A.rows(), N = B.rows(), K = A.cols();
    sm90_params<CT, DT> p = sm90_problem_params<Cfg>(A, B, epi);
    p.splits = plan.splits;
    p.kb_per_split = plan.kb_per_split;
    p.partial = partial;
    p.cluster = plan.cluster;
    OCTET_REQUIRE(p.cluster == 1 || p.cluster == 2, "octet::scaled_gemm", "plan.cluster",
                  message("is ", p.cluster, "; pass 1 or 2"));
    const CUtensorMap ma = sm90_operand_map(A.data, M, K, A.layout.row_bytes, Cfg::BM);
    // with a cluster, each CTA loads (and multicasts) its share of the B tile's rows
    const CUtensorMap mb = sm90_operand_map(B.data, N, K, B.layout.row_bytes, Cfg::BN / p.cluster);
    p.tma_scale_a = sm90_scales_by_tma(A.scales, A.layout);
    p.tma_scale_b = b_scales == sm90_b_scales::per_column && sm90_scales_by_tma(B.scales, B.layout);
    const CUtensorMap msa = p.tma_scale_a ? sm90_scale_map(A.scales, A.layout, Cfg::BM) : CUtensorMap{};
    const CUtensorMap msb = p.tma_scale_b ? sm90_scale_map(B.scales, B.layout, Cfg::BN) : CUtensorMap{};

    // The TMA-store epilogue where D allows it: row-major, rows 16-byte aligned, and no split (with a
    // split the kernel writes float partial sums, which the sum kernel stores).
    p.tma_store = plan.splits == 1 && !epi.d_col_major && (epi.d_ld * sizeof(DT)) % 16 == 0 && is_aligned(epi.d, 16);
    const CUtensorMap md = p.tma_store ? cuda::byte_matrix_map(reinterpret_cast<const std::uint8_t*>(epi.d), M,
                                                               N * sizeof(DT), epi.d_ld * sizeof(DT), 128u, 64u,
                                                               CU_TENSOR_MAP_SWIZZLE_128B, "octet::scaled_gemm")
                                       : CUtensorMap{};

    auto kernel = sm90_gemm_kernel<FA, FB, Cfg, b_scales, CT, DT>;
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::smem_bytes));
    if constexpr (Cfg::reconfigure_registers)
        cuda::require_register_split(kernel, Cfg::threads,
                                     Cfg::producer_regs * 128 + Cfg::consumer_regs * 128 * Cfg::consumers,
                                     "octet::scaled_gemm", "options.backend", "use gemm_backend::sm89_mma");
    // persistent: as many CTAs (clusters) as run at once, or as there are work units
    const std::size_t units = static_cast<std::size_t>((p.tiles_m + p.cluster - 1) / p.cluster) * p.tiles_n * p.splits;
    if (p.cluster > 1) {
        // the clusters that fit at once (GPCs may leave SMs unpaired), queried once per device
        static std::atomic<int> slots_cache[64] = {};
        int device = 0;
        OCTET_CUDA_CHECK(cudaGetDevice(&device));
        int slots = device < 64 ? slots_cache[device].load(std::memory_order_relaxed) : 0;
        if (slots == 0) {
            slots = cuda::max_active_clusters(kernel, dim3(Cfg::threads), Cfg::smem_bytes, p.cluster);
            if (device < 64) slots_cache[device].store(slots, std::memory_order_relaxed);
        }
        const unsigned grid =
            static_cast<unsigned>(std::min<std::size_t>(units, static_cast<std::size_t>(slots)) * p.cluster);
        cuda::launch_cluster("sm90_gemm_kernel", kernel, dim3(grid), dim3(Cfg::threads), dim3(p.cluster),
                             Cfg::smem_bytes, stream, ma, mb, msa, msb, md, p);
    } else {
        const unsigned grid =
            static_cast<unsigned>(std::min<std::size_t>(units, static_cast<std::size_t>(cuda::multiprocessor_count())));
        cuda::launch("sm90_gemm_kernel", kernel, dim3(grid), dim3(Cfg::threads), Cfg::smem_bytes, stream, ma, mb, msa,
                     msb, md, p);
    }
    OCTET_CUDA_CHECK_LAUNCH();
    if (p.splits > 1) {
        constexpr unsigned threads = 256;
        const unsigned sum_grid = static_cast<unsigned>(std::min<std::size_t>(
            (M * N + threads - 1) / threads, static_cast<std::size_t>(cuda::multiprocessor_count()) * 8));
        cuda::launch("sm90_split_k_sum_kernel", sm90_split_k_sum_kernel<CT, DT>, dim3(sum_grid), dim3(threads), 0,
                     stream, static_cast<const float*>(partial), p.splits, epi);
        OCTET_CUDA_CHECK_LAUNCH();
    }
}

template <class RA, class RB, class CT, class DT>
void launch_sm90(cudaStream_t stream, const quantized_cref<RA>& A, const quantized_cref<RB>& B,
                 const device_epilogue<CT, DT>& epi, const sm90_plan& plan, float* partial) {
    const std::size_t M = A.rows(), N = B.rows(), K = A.cols();
    if (M == 0 || N == 0) return;
    OCTET_REQUIRE(M < (1u << 31) && N < (1u << 31) && K < (1u << 31), "octet::scaled_gemm", "A/B",
                  "has a dimension of 2^31 or more");
    OCTET_REQUIRE(plan.splits == 1 || partial != nullptr, "octet::scaled_gemm", "partial",
                  "is null but the plan splits K (pass plan.scratch_bytes(M, N) of device memory)");
    if (plan.tile == gemm_tile::m64n64) {
        launch_sm90_config<RA, RB, sm90_small>(stream, A, B, epi, plan, partial);
    } else if (plan.tile == gemm_tile::m128n192) {
        // scaled_gemm_device has refused the wide tile for B's per-column scales already; this guards
        // direct callers of the launcher
        if constexpr (sm90_wide_serves<RB>())
            launch_sm90_config<RA, RB, sm90_wide>(stream, A, B, epi, plan, partial);
        else
            OCTET_REQUIRE(false, "octet::scaled_gemm", "options.tile", message("is m128n192", sm90_wide_refusal));
    } else {
        launch_sm90_config<RA, RB, sm90_large>(stream, A, B, epi, plan, partial);
    }
}

}  // namespace detail
}  // namespace octet
