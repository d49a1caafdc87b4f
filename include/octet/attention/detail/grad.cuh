// octet/attention/detail/grad.cuh: the backward's gradient kernels: grad_kernel (FP8 mma.sync, sm_89+)
// and the warp-specialized grad_wgmma_kernel (sm_90a), both running grad_step on each (key tile,
// query tile) pair.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "octet/attention/attention.hpp"
#include "octet/attention/detail/backward_tiles.cuh"
#include "octet/attention/detail/grad_step.cuh"
#include "octet/attention/detail/kernel_common.cuh"
#include "octet/attention/detail/tiles.cuh"
#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/tensor_map.cuh"

namespace octet {
namespace detail {
namespace attention {

/// Dynamic shared memory of grad_kernel: K, V, K^T; Q x2, dO x2; Q^T, dO^T; dS (64 x 64); 5 row
/// vectors; (4, 64) reduction; (4, 4, 64) telemetry.
template <int D>
constexpr int grad_smem_bytes() {
    return kTile * D * 9 + kTile * kTile + (5 + 4 + 16) * kTile * 4;
}

/// The gradient on FP8 mma.sync (sm_89; forward_wgmma_kernel's counterpart is grad_wgmma_kernel):
/// block = (64-key tile, key/value head, sequence), 4 warps; K and V loaded once, each step's Q and
/// dO with cp.async into two stages (rows past the sequence zero-filled), transposed by all threads.
template <int D, bool Tele, class QR, class KR, class VR, class DR, class GT>
OCTET_KERNEL void __launch_bounds__(kThreads, 1)
    grad_kernel(const bwd_inputs<QR, KR, VR, DR> p, const bwd_outputs<GT> out) {
    OCTET_DYNAMIC_SHARED_ALIGNED(std::uint8_t, smem, 128);
    shared_ptr_t<std::uint8_t> sK = smem;                  // (64, D)
    shared_ptr_t<std::uint8_t> sV = sK + kTile * D;        // (64, D)
    shared_ptr_t<std::uint8_t> sKt = sV + kTile * D;       // (D, 64) keys permuted
    shared_ptr_t<std::uint8_t> sQ = sKt + kTile * D;       // 2 x (64, D)
    shared_ptr_t<std::uint8_t> sdO = sQ + 2 * kTile * D;   // 2 x (64, D)
    shared_ptr_t<std::uint8_t> sQt = sdO + 2 * kTile * D;  // (D, 64) queries permuted
    shared_ptr_t<std::uint8_t> sdOt = sQt + kTile * D;     // (D, 64) queries permuted
    shared_ptr_t<std::uint8_t> sDS = sdOt + kTile * D;     // (64 queries, 64 keys permuted)
    shared_ptr_t<float> sLc = OCTET_SHARED_CAST(float, sDS + kTile * kTile);
    shared_ptr_t<float> sDelta = sLc + kTile;
    shared_ptr_t<float> sQs = sDelta + kTile;
    shared_ptr_t<float> sQf = sQs + kTile;
    shared_ptr_t<float> sDOs = sQf + kTile;
    shared_ptr_t<float> sRed = sDOs + kTile;       // (4, 64)
    shared_ptr_t<float> sTele = sRed + 4 * kTile;  // (4, 4, 64)
    constexpr int T = kTile * D;                   // bytes of a tile

    const int b = blockIdx.z, hk = blockIdx.y, kt = blockIdx.x;
    const int q0 = p.cu_q[b], lq = p.cu_q[b + 1] - q0, k0 = p.cu_k[b], lk = p.cu_k[b + 1] - k0;
    if (kt * kTile >= lk) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int nqt = (lq + kTile - 1) / kTile;
    const int qt_first = attention::first_query_tile_for(kt, lq, lk, p.causal);
    const int per_head = nqt > qt_first ? nqt - qt_first : 0;
    const int n_iter = per_head * p.group;

    load_tile_async<D>(sK, p.k.data, p.k.layout.row_bytes, k0 + kt * kTile, k0 + lk, hk * D);
    load_tile_async<D>(sV, p.v.data, p.v.layout.row_bytes, k0 + kt * kTile, k0 + lk, hk * D);
    // Starts the loads of step it's Q and dO tiles into `stage`; returns its row vectors.
    auto issue_q = [&](int it, int stage) {
        const int h = hk * p.group + it / per_head, qt = qt_first + it % per_head;
        load_tile_async<D>(sQ + stage * T, p.q.data, p.q.layout.row_bytes, q0 + qt * kTile, q0 + lq, h * D);
        load_tile_async<D>(sdO + stage * T, p.dout.data, p.dout.layout.row_bytes, q0 + qt * kTile, q0 + lq, h * D);
        return fetch_qrow<D>(p, out.delta, q0, lq, h, qt, tid);
    };
    qrow_values next{};
    if (n_iter > 0) next = issue_q(0, 0);
    ptx::cp_async_commit_group();

    float sk[2], sv[2];
    key_scales<D>(p, k0, lk, hk, kt, warp, lane, sk, sv);
    float dk[D / 8][4], dv[D / 8][4];
    OCTET_UNROLL
    for (int n = 0; n < D / 8; ++n) OCTET_UNROLL
    for (int x = 0; x < 4; ++x) dk[n][x] = dv[n][x] = 0.0f;

    for (int it = 0; it < n_iter; ++it) {
        const int st = it & 1;
        const int h = hk * p.group + it / per_head, qt = qt_first + it % per_head;
        ptx::cp_async_wait_group<0>();
        if (tid < 64) {
            sLc[tid] = next.a;
            sDelta[tid] = next.b;
        } else {
            sQs[tid - 64] = next.a;
            sQf[tid - 64] = attention::query_factor(next.a, p.scale_log2);
            sDOs[tid - 64] = next.b;
        }
        __syncthreads();  // S1: tiles and row vectors of this step visible; the previous step done
        if (it == 0) transpose_tile<D, kThreads>(sK, sKt, tid, kTile);
        if (it + 1 < n_iter) next = issue_q(it + 1, st ^ 1);
        ptx::cp_async_commit_group();
        transpose_tile<D, kThreads>(sQ + st * T, sQt, tid, kTile);
        transpose_tile<D, kThreads>(sdO + st * T, sdOt, tid, kTile);
        const grad_step_smem sm{sK,     sV,  sKt, sQ + st * T, sdO + st * T, sQt,  sdOt, sLc,
                                sDelta, sQs, sQf, sDOs,        sDS,          sRed, sTele};
        grad_step<D, false, Tele>(p, out, sm, sk, sv, dk, dv, h, qt, kt, q0, lq, lk, tid, [] { __syncthreads(); });
    }
    ptx::cp_async_wait_group<0>();
    store_dk_dv<D>(p, out, k0, lk, hk, kt, warp, lane, dk, dv);
}

// ---- the sm_90a gradient: warp-specialized -----------------------------------------------------

/// Stages of grad_wgmma_kernel's ring (each: one query tile's Q, dO, Q^T, dO^T and row vectors).
constexpr int kGradStages = 2;
/// Its registers per thread after setmaxnreg: one CTA of 384 threads per SM launches with 168 each
/// (64512), which the producer gives away (24) and the consumers take (240), as in FlashAttention-3.
constexpr int kGradProducerRegs = 24, kGradConsumerRegs = 240;

/// Dynamic shared memory of grad_wgmma_kernel: the slack that aligns the tiles to 1024 bytes; per
/// consumer K, V, K^T and the dS codes; per stage Q, dO, Q^T and dO^T; per stage 5 row vectors; per
/// consumer the (4, 64) reduction and the (4, 4, 64) telemetry; the mbarriers.
template <int D>
constexpr int grad_wgmma_smem_bytes() {
    return 1024 + kConsumerGroups * (3 * kTile * D + kTile * kTile) + kGradStages * 4 * kTile * D +
           (kGradStages * 5 + kConsumerGroups * 20) * kTile * 4 + (kConsumerGroups + 3 * kGradStages) * 8;
}

/// The gradient on sm_90a (an empty kernel elsewhere, never launched there), warp-specialized:
/// block = (128 keys, key/value head, sequence); consumer warpgroup c owns key tile 2 kb + c.
///
/// Warpgroup 2 produces: for each step (a query tile of a query head of the group, the steps of key
/// tile 2 kb, which sees every query tile that 2 kb + 1 sees) one thread loads Q and dO with TMA
/// into a ring of kGradStages stages; the 128 threads fetch the step's row vectors, wait for the
/// loads, zero the rows past the sequence (TMA fills zeros only past the whole tensor), transpose Q
/// and dO into Q^T and dO^T, make them visible to the async proxy and arrive on the stage's `full`
/// barrier. So Q and dO are loaded and transposed once per 128 keys.
///
/// Each consumer warpgroup loads its K and V with TMA, transposes K once, and runs grad_step on every
/// stage whose query tile its keys see (named barrier 1 + c for its own syncs), then releases the
/// stage (`empty`, one arrival per warp of both warpgroups); a stage it does not need (a causal mask
/// hides that query tile from its keys, or it has no keys) it releases unread.
template <int D, bool Tele, class QR, class KR, class VR, class DR, class GT>
OCTET_KERNEL void __launch_bounds__(kWarpSpecializedThreads, 1)
    grad_wgmma_kernel(const __grid_constant__ bwd_maps maps, const bwd_inputs<QR, KR, VR, DR> p,
                      const bwd_outputs<GT> out) {
#if OCTET_ARCH_SM90A
    constexpr int S = kGradStages, T = kTile * D;     // stages; bytes of a tile
    constexpr int own_bytes = 3 * T + kTile * kTile;  // a consumer's K, V, K^T and dS codes
    OCTET_DYNAMIC_SHARED(std::uint8_t, grad_smem);
    // the padding is added to the shared array itself, so that the pointers stay in the shared address space
    const shared_ptr_t<std::uint8_t> sOwn = grad_smem + wgmma_tile_padding(grad_smem);  // consumers' tiles
    const shared_ptr_t<std::uint8_t> sStage = sOwn + kConsumerGroups * own_bytes;       // S x (Q, dO, Q^T, dO^T)
    const shared_ptr_t<float> sRows = OCTET_SHARED_CAST(float, sStage + S * 4 * T);     // S x 5 x 64
    const shared_ptr_t<float> sOwnF = sRows + S * 5 * kTile;  // consumers' (4, 64) and (4, 4, 64)
    const shared_ptr_t<std::uint64_t> kv_loaded =
        OCTET_SHARED_CAST(std::uint64_t, sOwnF + kConsumerGroups * 20 * kTile);
    const shared_ptr_t<std::uint64_t> q_loaded = kv_loaded + kConsumerGroups;  // S: the stage's Q and dO have landed
    const shared_ptr_t<std::uint64_t> full = q_loaded + S;                     // S: the stage is ready
    const shared_ptr_t<std::uint64_t> empty = full + S;                        // S: the consumers are done with it
    auto bar = [](shared_ptr_t<std::uint64_t> b) { return ptx::shared_address(b); };
    auto stage_tile = [&](int st, int i) { return sStage + (4 * st + i) * T; };     // i: Q, dO, Q^T, dO^T
    auto stage_rows = [&](int st, int i) { return sRows + (5 * st + i) * kTile; };  // i: L, D, s_q, qf, s_dO

    const int b = blockIdx.z, hk = blockIdx.y, kb = blockIdx.x;
    const int q0 = p.cu_q[b], lq = p.cu_q[b + 1] - q0, k0 = p.cu_k[b], lk = p.cu_k[b + 1] - k0;
    if (kb * kBlockRows >= lk) return;
    const int tid = threadIdx.x;
    const int nqt = (lq + kTile - 1) / kTile;
    // the steps: query tiles qt_first .. nqt - 1 of each query head of the group (key tile 2 kb's)
    const int qt_first = attention::first_query_tile_for(2 * kb, lq, lk, p.causal);
    const int per_head = nqt > qt_first ? nqt - qt_first : 0;
    const int n_iter = per_head * p.group;
    if (tid == 0) {
        for (int c = 0; c < kConsumerGroups; ++c) ptx::mbarrier_init(bar(kv_loaded + c), 1);
        init_ring(q_loaded, full, empty, S);
        ptx::fence_mbarrier_init();
    }
    __syncthreads();

    if (tid >= kConsumerGroups * 128) {
        // ---- producer warpgroup ----
        ptx::setmaxnreg_dec<kGradProducerRegs>();
        const int ptid = tid - kConsumerGroups * 128;
        for (int it = 0; it < n_iter; ++it) {
            const int st = it % S, h = hk * p.group + it / per_head, qt = qt_first + it % per_head;
            const std::uint32_t phase = static_cast<std::uint32_t>(it / S) & 1u;
            ptx::mbarrier_wait(bar(empty + st), phase ^ 1u);  // passes at once on the ring's first round
            if (ptid == 0)
                load_tile_pair<D>(q_loaded + st, maps.q, maps.dout, stage_tile(st, 0), stage_tile(st, 1), h * D,
                                  q0 + qt * kTile);
            const qrow_values v = fetch_qrow<D>(p, out.delta, q0, lq, h, qt, ptid);
            if (ptid < 64) {
                stage_rows(st, 0)[ptid] = v.a;
                stage_rows(st, 1)[ptid] = v.b;
            } else {
                stage_rows(st, 2)[ptid - 64] = v.a;
                stage_rows(st, 3)[ptid - 64] = attention::query_factor(v.a, p.scale_log2);
                stage_rows(st, 4)[ptid - 64] = v.b;
            }
            const int valid = lq - qt * kTile;
            wait_tile_pair<D>(q_loaded + st, phase, stage_tile(st, 0), stage_tile(st, 1), valid, ptid);
            // the transposes write zeros from `valid` on themselves: the zeroing above is other threads'
            // (transpose_tile_sm90 would read those rows, and needs more than the producer's 24 registers)
            transpose_tile<D, 128>(stage_tile(st, 0), stage_tile(st, 2), ptid, valid);
            transpose_tile<D, 128>(stage_tile(st, 1), stage_tile(st, 3), ptid, valid);
            ptx::fence_proxy_async_shared();  // the zeros and the transposes, for wgmma's reads
            ptx::mbarrier_arrive(bar(full + st));
        }
        return;
    }

    // ---- consumer warpgroups ----
    ptx::setmaxnreg_inc<kGradConsumerRegs>();
    const int c = tid >> 7, ctid = tid & 127, warp = ctid >> 5, lane = ctid & 31;
    const int kt = 2 * kb + c;
    // the first query tile this warpgroup's keys see (none: nqt)
    const int first = kt * kTile < lk ? attention::first_query_tile_for(kt, lq, lk, p.causal) : nqt;
    const shared_ptr_t<std::uint8_t> sK = sOwn + c * own_bytes, sV = sK + T, sKt = sV + T, sDS = sKt + T;
    const shared_ptr_t<float> sRed = sOwnF + c * 20 * kTile, sTele = sRed + 4 * kTile;
    if (ctid == 0 && first < nqt)  // nothing is loaded that no step waits for
        load_tile_pair<D>(kv_loaded + c, maps.k, maps.v, sK, sV, hk * D, k0 + kt * kTile);
    float sk[2], sv[2];
    key_scales<D>(p, k0, lk, hk, kt, warp, lane, sk, sv);
    float dk[D / 8][4], dv[D / 8][4];
    OCTET_UNROLL
    for (int n = 0; n < D / 8; ++n) OCTET_UNROLL
    for (int x = 0; x < 4; ++x) dk[n][x] = dv[n][x] = 0.0f;

    if (first < nqt) {
        wait_tile_pair<D>(kv_loaded + c, 0, sK, sV, lk - kt * kTile, ctid);
        // the transpose writes zeros from lk - kt * kTile on itself: the zeroing above is other threads'
        transpose_tile<D, 128>(sK, sKt, ctid, lk - kt * kTile);
        ptx::fence_proxy_async_shared();  // the zeros and K^T, for wgmma's reads
    }
    for (int it = 0; it < n_iter; ++it) {
        const int st = it % S, h = hk * p.group + it / per_head, qt = qt_first + it % per_head;
        ptx::mbarrier_wait(bar(full + st), static_cast<std::uint32_t>(it / S) & 1u);
        if (qt >= first) {
            ptx::bar_sync(1 + c, 128);  // S1: K, V and K^T visible; the previous step done
            const shared_ptr_t<std::uint8_t> tq = stage_tile(st, 0);
            const shared_ptr_t<float> rq = stage_rows(st, 0);
            const grad_step_smem sm{sK,
                                    sV,
                                    sKt,
                                    tq,
                                    tq + T,
                                    tq + 2 * T,
                                    tq + 3 * T,
                                    rq,
                                    rq + kTile,
                                    rq + 2 * kTile,
                                    rq + 3 * kTile,
                                    rq + 4 * kTile,
                                    sDS,
                                    sRed,
                                    sTele};
            grad_step<D, true, Tele>(p, out, sm, sk, sv, dk, dv, h, qt, kt, q0, lq, lk, ctid,
                                     [c] { ptx::bar_sync(1 + c, 128); });
        }
        __syncwarp();
        if (lane == 0) ptx::mbarrier_arrive(bar(empty + st));  // this warp is done with the stage
    }
    if (kt * kTile < lk) store_dk_dv<D>(p, out, k0, lk, hk, kt, warp, lane, dk, dv);
#else
    (void)maps, (void)p, (void)out;
#endif
}

}  // namespace attention
}  // namespace detail
}  // namespace octet
