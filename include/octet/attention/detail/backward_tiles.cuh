// octet/attention/detail/backward_tiles.cuh: what the backward's delta and gradient kernels share: the tile of P^T
// and dP^T they both form (tile_p_dp, so that D and dS come from the same bits), their inputs,
// the per-query-row and per-key values they read, and the wgmma kernels' TMA loads of tile pairs.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "octet/attention/attention.hpp"
#include "octet/attention/detail/kernel_common.cuh"
#include "octet/attention/detail/tiles.cuh"
#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/tensor_map.cuh"

namespace octet {
namespace detail {
namespace attention {

/// P^T and dP^T of one (64-key, 64-query) tile for this warp's 16 keys, exactly as both the matched
/// delta kernel and the gradient kernel form them. Element [n][2r + e] is key row g + 8r of the
/// warp, query column 8n + 2t + e of the tile. Wgmma: the warpgroup forms both products with wgmma
/// m64n64k32 from the swizzled tiles in shared memory (aligned to 1024 bytes, made visible to the
/// async proxy), whose accumulators have mma.sync's layout per warp; else each warp with mma.sync.
template <int D, bool Wgmma, class QF, class KF, class VF, class DF>
__device__ __forceinline__ void tile_p_dp(shared_ptr_t<const std::uint8_t> sK, shared_ptr_t<const std::uint8_t> sV,
                                          shared_ptr_t<const std::uint8_t> sQ, shared_ptr_t<const std::uint8_t> sdO,
                                          shared_ptr_t<const float> sQf, shared_ptr_t<const float> sLc,
                                          shared_ptr_t<const float> sDOs, const float (&sk)[2], const float (&sv)[2],
                                          int warp, int lane, int qrow0, int krow0, int lq, int lk, bool causal,
                                          float (&pp)[8][4], float (&dp)[8][4]) {
    OCTET_UNROLL
    for (int n = 0; n < 8; ++n) OCTET_UNROLL
    for (int x = 0; x < 4; ++x) pp[n][x] = dp[n][x] = 0.0f;
    if constexpr (Wgmma) {
        float(&pacc)[32] = reinterpret_cast<float(&)[32]>(pp);  // register 4n + x is pp[n][x]
        float(&dacc)[32] = reinterpret_cast<float(&)[32]>(dp);
        const std::uint32_t k_addr = ptx::shared_address(sK), v_addr = ptx::shared_address(sV),
                            q_addr = ptx::shared_address(sQ), do_addr = ptx::shared_address(sdO);
        OCTET_UNROLL
        for (int i = 0; i < 32; ++i) {
            ptx::fence_operand(pacc[i]);
            ptx::fence_operand(dacc[i]);
        }
        ptx::wgmma_fence();
        OCTET_UNROLL
        for (int ks = 0; ks < D / 32; ++ks)
            ptx::wgmma_m64nNk32<64, KF, QF>(pacc, tile_descriptor<D>(k_addr + 32 * ks),
                                            tile_descriptor<D>(q_addr + 32 * ks), ks > 0 ? 1u : 0u);
        OCTET_UNROLL
        for (int ks = 0; ks < D / 32; ++ks)
            ptx::wgmma_m64nNk32<64, VF, DF>(dacc, tile_descriptor<D>(v_addr + 32 * ks),
                                            tile_descriptor<D>(do_addr + 32 * ks), ks > 0 ? 1u : 0u);
        ptx::wgmma_commit_group();
        ptx::wgmma_wait_group<0>();
        OCTET_UNROLL
        for (int i = 0; i < 32; ++i) {
            ptx::fence_operand(pacc[i]);
            ptx::fence_operand(dacc[i]);
        }
    } else {
        OCTET_UNROLL
        for (int ks = 0; ks < D / 32; ++ks) {
            std::uint32_t ak[4], av[4];
            load_a<D>(ak, sK, 16 * warp, ks, lane);
            load_a<D>(av, sV, 16 * warp, ks, lane);
            OCTET_UNROLL
            for (int np = 0; np < 4; ++np) {
                std::uint32_t bq[2][2], bd[2][2];
                load_b2<D>(bq, sQ, 16 * np, ks, lane);
                ptx::mma_m16n8k32_acc<KF, QF>(pp[2 * np], ak, bq[0]);
                ptx::mma_m16n8k32_acc<KF, QF>(pp[2 * np + 1], ak, bq[1]);
                load_b2<D>(bd, sdO, 16 * np, ks, lane);
                ptx::mma_m16n8k32_acc<VF, DF>(dp[2 * np], av, bd[0]);
                ptx::mma_m16n8k32_acc<VF, DF>(dp[2 * np + 1], av, bd[1]);
            }
        }
    }
    const bool whole = attention::tile_all_visible(qrow0, krow0, lq, lk, causal);  // no mask test inside
    OCTET_UNROLL
    for (int n = 0; n < 8; ++n) OCTET_UNROLL
    for (int e = 0; e < 2; ++e) {
        const int col = attention::c_col(lane, n, e);
        OCTET_UNROLL
        for (int r = 0; r < 2; ++r) {
            const int j = krow0 + 16 * warp + attention::c_row(lane, 2 * r);
            const float x = attention::score(pp[n][2 * r + e], sQf[col], sk[r]);
            pp[n][2 * r + e] = whole || attention::visible(qrow0 + col, j, lq, lk, causal)
                                   ? attention::exp2(attention::sub(x, sLc[col]))
                                   : 0.0f;
            dp[n][2 * r + e] = attention::dprob(dp[n][2 * r + e], sDOs[col], sv[r]);
        }
    }
}

template <class QR, class KR, class VR, class DR>
struct bwd_inputs {
    quantized_cref<QR> q;
    quantized_cref<KR> k;
    quantized_cref<VR> v;
    quantized_cref<DR> dout;
    const float* lse;
    const std::int32_t* cu_q;
    const std::int32_t* cu_k;
    int hq, group, total_q;
    float scale, scale_log2;
    bool causal;
};

/// Per-query row vectors of a query tile: the share of thread `t` of a group of 128 (t & 63 is the
/// row; t < 64 loads L log2 e and D, t >= 64 the q and dO scales).
struct qrow_values {
    float a = 0.0f, b = 0.0f;
};
template <int D, class QR, class KR, class VR, class DR>
__device__ __forceinline__ qrow_values fetch_qrow(const bwd_inputs<QR, KR, VR, DR>& p, const float* delta, int q0,
                                                  int lq, int h, int qt, int t) {
    qrow_values v;
    const int tid = t, i = qt * kTile + (tid & 63);
    const std::size_t r = static_cast<std::size_t>(h) * p.total_q + q0 + i;
    if (tid < 64) {
        v.a = i < lq ? attention::mul(p.lse[r], attention::log2e) : attention::pos_inf();
        v.b = (i < lq && delta) ? delta[r] : 0.0f;
    } else if (i < lq) {
        v.a = token_scale(p.q, static_cast<std::size_t>(q0 + i), h, D);
        v.b = token_scale(p.dout, static_cast<std::size_t>(q0 + i), h, D);
    }
    return v;
}

/// This lane's key and value scales for its two rows (of its warp's 16) of key tile kt; 0 past the
/// sequence's lk keys.
template <int D, class QR, class KR, class VR, class DR>
__device__ __forceinline__ void key_scales(const bwd_inputs<QR, KR, VR, DR>& p, int k0, int lk, int hk, int kt,
                                           int warp, int lane, float (&sk)[2], float (&sv)[2]) {
    OCTET_UNROLL
    for (int r = 0; r < 2; ++r) {
        const int j = kt * kTile + 16 * warp + attention::c_row(lane, 2 * r);
        sk[r] = j < lk ? token_scale(p.k, static_cast<std::size_t>(k0 + j), hk, D) : 0.0f;
        sv[r] = j < lk ? token_scale(p.v, static_cast<std::size_t>(k0 + j), hk, D) : 0.0f;
    }
}

/// TMA maps over the backward's operands (tile_map), for the wgmma instantiations' loads.
struct bwd_maps {
    CUtensorMap q, k, v, dout;
};

/// TMA loads of two 64-row tiles, rows row0.. and columns col0.. of the operands behind maps a and
/// b, into ta and tb, completing on mbarrier `bar`; issued by one thread.
template <int D>
__device__ __forceinline__ void load_tile_pair(shared_ptr_t<std::uint64_t> bar, const CUtensorMap& a,
                                               const CUtensorMap& b, shared_ptr_t<std::uint8_t> ta,
                                               shared_ptr_t<std::uint8_t> tb, int col0, int row0) {
    const std::uint32_t addr = ptx::shared_address(bar);
    ptx::mbarrier_arrive_expect_tx(addr, 2 * kTile * D);
    ptx::tma_load_2d(ptx::shared_address(ta), &a, col0, row0, addr);
    ptx::tma_load_2d(ptx::shared_address(tb), &b, col0, row0, addr);
}

/// Waits for load_tile_pair's loads (phase `parity` of `bar`), then zeroes the tiles' rows from
/// `valid` on: rows past the sequence, which TMA brings (it fills zeros only past the whole
/// tensor), so that the tiles hold what load_tile_async's zero fill leaves. Thread `t` of a group
/// of 128 that waits and zeroes together.
template <int D>
__device__ __forceinline__ void wait_tile_pair(shared_ptr_t<std::uint64_t> bar, std::uint32_t parity,
                                               shared_ptr_t<std::uint8_t> ta, shared_ptr_t<std::uint8_t> tb, int valid,
                                               int t) {
    ptx::mbarrier_wait(ptx::shared_address(bar), parity);
    zero_rows_from<D, 128>(ta, valid, t);
    zero_rows_from<D, 128>(tb, valid, t);
}

}  // namespace attention
}  // namespace detail
}  // namespace octet
