// octet/attention/detail/delta.cuh: the backward's row term D: delta_output_kernel (rowsum(dO * O), one
// warp per query row) and delta_matched_kernel (sum_j P_ij dP_ij from tile_p_dp, on mma.sync or
// wgmma).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "octet/attention/attention.hpp"
#include "octet/attention/detail/backward_tiles.cuh"
#include "octet/attention/detail/kernel_common.cuh"
#include "octet/attention/detail/tiles.cuh"
#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/tensor_map.cuh"

namespace octet {
namespace detail {
namespace attention {

/// With wgmma, 1024 bytes of slack align the tiles to their swizzle atoms, and 3 mbarriers follow.
template <int D, bool Wgmma>
constexpr int delta_smem_bytes() {
    // Q, dO, K x2, V x2; 3 row vectors, 4 x 64 reduction
    return kTile * D * 6 + (3 + 4 * 4) * kTile * 4 + (Wgmma ? 1024 + 3 * 8 : 0);
}

/// Wgmma (sm_90a; an empty kernel elsewhere, never launched there): tile_p_dp on wgmma, and the tiles
/// loaded with TMA (maps) by one thread on mbarriers (Q and dO once, K and V into two stages); else
/// mma.sync, and cp.async by every thread. Rows past the sequences that TMA brings (the next
/// sequence's: TMA fills zeros only past the whole tensor) are zeroed (zero_rows_from), so that both
/// paths compute on the same tiles.
template <int D, bool Wgmma, class QR, class KR, class VR, class DR>
OCTET_KERNEL void __launch_bounds__(kThreads)
    delta_matched_kernel(const __grid_constant__ bwd_maps maps, const bwd_inputs<QR, KR, VR, DR> p, float* delta) {
    if constexpr (!Wgmma || OCTET_ARCH_SM90A) {
        OCTET_DYNAMIC_SHARED_ALIGNED(std::uint8_t, smem, 128);
        shared_ptr_t<std::uint8_t> sQ = Wgmma ? smem + wgmma_tile_padding(smem) : smem;
        shared_ptr_t<std::uint8_t> sdO = sQ + kTile * D;
        shared_ptr_t<std::uint8_t> sK = sdO + kTile * D;     // 2 stages
        shared_ptr_t<std::uint8_t> sV = sK + 2 * kTile * D;  // 2 stages
        shared_ptr_t<float> sQf = OCTET_SHARED_CAST(float, sV + 2 * kTile * D);
        shared_ptr_t<float> sLc = sQf + kTile;
        shared_ptr_t<float> sDOs = sLc + kTile;
        shared_ptr_t<float> sRed = sDOs + kTile;  // (4, 64)
        // Wgmma: Q and dO loaded; K and V of stage 0, 1 loaded
        shared_ptr_t<std::uint64_t> q_loaded = OCTET_SHARED_CAST(std::uint64_t, sRed + 4 * kTile);
        shared_ptr_t<std::uint64_t> kv_loaded = q_loaded + 1;
        constexpr std::uint32_t T = kTile * D;  // bytes of a tile

        const int b = blockIdx.z, h = blockIdx.y, qt = gridDim.x - 1 - blockIdx.x;
        const int q0 = p.cu_q[b], lq = p.cu_q[b + 1] - q0, k0 = p.cu_k[b], lk = p.cu_k[b + 1] - k0;
        if (qt * kTile >= lq) return;
        const int hk = h / p.group;
        const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2;
        const int ntiles = attention::key_tiles_for(qt, lq, lk, p.causal);

        // Starts the loads of key tile jt's K and V into `stage`.
        auto issue_kv = [&](int jt, int stage) {
            if constexpr (Wgmma) {
                if (tid == 0)
                    load_tile_pair<D>(kv_loaded + stage, maps.k, maps.v, sK + stage * T, sV + stage * T, hk * D,
                                      k0 + jt * kTile);
            } else {
                load_tile_async<D>(sK + stage * T, p.k.data, p.k.layout.row_bytes, k0 + jt * kTile, k0 + lk, hk * D);
                load_tile_async<D>(sV + stage * T, p.v.data, p.v.layout.row_bytes, k0 + jt * kTile, k0 + lk, hk * D);
            }
        };
        if constexpr (Wgmma) {
            if (tid == 0) {
                ptx::mbarrier_init(ptx::shared_address(q_loaded), 1);
                ptx::mbarrier_init(ptx::shared_address(kv_loaded), 1);
                ptx::mbarrier_init(ptx::shared_address(kv_loaded + 1), 1);
                ptx::fence_mbarrier_init();
                // nothing is loaded that no iteration waits for
                if (ntiles > 0) load_tile_pair<D>(q_loaded, maps.q, maps.dout, sQ, sdO, h * D, q0 + qt * kTile);
            }
            if (ntiles > 0) issue_kv(0, 0);
            __syncthreads();  // the mbarriers initialized, for every thread's waits
        } else {
            (void)maps;
            load_tile_async<D>(sQ, p.q.data, p.q.layout.row_bytes, q0 + qt * kTile, q0 + lq, h * D);
            load_tile_async<D>(sdO, p.dout.data, p.dout.layout.row_bytes, q0 + qt * kTile, q0 + lq, h * D);
            if (ntiles > 0) issue_kv(0, 0);
            ptx::cp_async_commit_group();
        }
        {
            const qrow_values v = fetch_qrow<D>(p, nullptr, q0, lq, h, qt, tid);
            if (tid < 64)
                sLc[tid] = v.a;
            else {
                sQf[tid - 64] = attention::query_factor(v.a, p.scale_log2);
                sDOs[tid - 64] = v.b;
            }
        }
        float sk_next[2] = {0.0f, 0.0f}, sv_next[2] = {0.0f, 0.0f};
        if (ntiles > 0) key_scales<D>(p, k0, lk, hk, 0, warp, lane, sk_next, sv_next);

        float dacc[8][2];
        OCTET_UNROLL
        for (int n = 0; n < 8; ++n) dacc[n][0] = dacc[n][1] = 0.0f;
        for (int jt = 0; jt < ntiles; ++jt) {
            const int st = jt & 1;
            if constexpr (Wgmma) {  // the tiles' rows past the sequences zeroed, as cp.async leaves them
                if (jt == 0) wait_tile_pair<D>(q_loaded, 0, sQ, sdO, lq - qt * kTile, tid);
                wait_tile_pair<D>(kv_loaded + st, static_cast<std::uint32_t>(jt >> 1) & 1u, sK + st * T, sV + st * T,
                                  lk - jt * kTile, tid);
                ptx::fence_proxy_async_shared();  // the zeros, for wgmma's reads
            } else {
                ptx::cp_async_wait_group<0>();
            }
            __syncthreads();  // every thread is done with the other stage (the previous tile)
            const float sk[2] = {sk_next[0], sk_next[1]}, sv[2] = {sv_next[0], sv_next[1]};
            if (jt + 1 < ntiles) {
                issue_kv(jt + 1, st ^ 1);
                key_scales<D>(p, k0, lk, hk, jt + 1, warp, lane, sk_next, sv_next);
            }
            if constexpr (!Wgmma) ptx::cp_async_commit_group();
            float pp[8][4], dp[8][4];
            tile_p_dp<D, Wgmma, typename QR::format, typename KR::format, typename VR::format, typename DR::format>(
                sK + st * T, sV + st * T, sQ, sdO, sQf, sLc, sDOs, sk, sv, warp, lane, qt * kTile, jt * kTile, lq, lk,
                p.causal, pp, dp);
            OCTET_UNROLL
            for (int n = 0; n < 8; ++n) OCTET_UNROLL
            for (int e = 0; e < 2; ++e) {
                float v =
                    attention::add(attention::mul(pp[n][e], dp[n][e]), attention::mul(pp[n][2 + e], dp[n][2 + e]));
                v = attention::add(v, shfl_xor(v, 4));
                v = attention::add(v, shfl_xor(v, 8));
                v = attention::add(v, shfl_xor(v, 16));
                dacc[n][e] = attention::add(dacc[n][e], v);
            }
        }
        ptx::cp_async_wait_group<0>();
        if (g == 0) OCTET_UNROLL
        for (int n = 0; n < 8; ++n) OCTET_UNROLL
        for (int e = 0; e < 2; ++e) sRed[warp * kTile + attention::c_col(lane, n, e)] = dacc[n][e];
        __syncthreads();
        if (tid < 64 && qt * kTile + tid < lq) {
            const float s =
                attention::add(attention::add(attention::add(sRed[tid], sRed[kTile + tid]), sRed[2 * kTile + tid]),
                               sRed[3 * kTile + tid]);
            delta[static_cast<std::size_t>(h) * p.total_q + q0 + qt * kTile + tid] = s;
        }
    }
}

/// rowsum(dO * O) per (token, head), one warp per row; writes `out` and, when non-null, `copy`.
template <int D, class DR, class OT>
OCTET_KERNEL void __launch_bounds__(kThreads)
    delta_output_kernel(const quantized_cref<DR> dout, const OT* o, std::size_t o_ld, int hq, int total_q, float* out,
                        float* copy) {
    const int row = blockIdx.x * (kThreads / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= total_q * hq) return;
    const int tok = row / hq, h = row % hq;
    const float sd = token_scale(dout, static_cast<std::size_t>(tok), h, D);
    float s = 0.0f;
    for (int c = lane; c < D; c += 32) {
        const float dv =
            attention::mul(decode<typename DR::format>(dout.code(tok, static_cast<std::size_t>(h) * D + c)), sd);
        s = attention::add(
            s, attention::mul(dv, detail::attention_load(
                                      o[static_cast<std::size_t>(tok) * o_ld + static_cast<std::size_t>(h) * D + c])));
    }
    OCTET_UNROLL
    for (int off = 16; off > 0; off >>= 1) s = attention::add(s, shfl_xor(s, off));
    if (lane == 0) {
        out[static_cast<std::size_t>(h) * total_q + tok] = s;
        if (copy) copy[static_cast<std::size_t>(h) * total_q + tok] = s;
    }
}

}  // namespace attention
}  // namespace detail
}  // namespace octet
