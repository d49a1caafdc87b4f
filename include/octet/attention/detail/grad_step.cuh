// octet/attention/detail/grad_step.cuh: one step of the backward's gradient, shared by grad_kernel and
// grad_wgmma_kernel: one 64-key tile against one 64-query tile (grad_step), its shared memory,
// the outputs, and the store of a key tile's dK and dV.
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

template <class GT>
struct bwd_outputs {
    const float* delta;  ///< [hq][total_q]
    float* dq_accum;     ///< [total_q][hq * D]
    GT* dk;
    GT* dv;
    std::size_t dk_ld, dv_ld;
    float* tele;  ///< residual, abs_ds, p_dp, p_abs_dp row arrays (each `rows` long), or null
    std::size_t rows;
};

/// Stores this lane's rows of key tile kt's dK (times the softmax scale) and dV, from the
/// accumulator layout (dk[nd][x]: row c_row(lane, x), channel c_col(lane, nd, x % 2) of the warp's 16).
template <int D, class QR, class KR, class VR, class DR, class GT>
__device__ __forceinline__ void store_dk_dv(const bwd_inputs<QR, KR, VR, DR>& p, const bwd_outputs<GT>& out, int k0,
                                            int lk, int hk, int kt, int warp, int lane, const float (&dk)[D / 8][4],
                                            const float (&dv)[D / 8][4]) {
    OCTET_UNROLL
    for (int r = 0; r < 2; ++r) {
        const int j = kt * kTile + 16 * warp + attention::c_row(lane, 2 * r);
        if (j >= lk) continue;
        GT* dkr = out.dk + static_cast<std::size_t>(k0 + j) * out.dk_ld + static_cast<std::size_t>(hk) * D;
        GT* dvr = out.dv + static_cast<std::size_t>(k0 + j) * out.dv_ld + static_cast<std::size_t>(hk) * D;
        OCTET_UNROLL
        for (int nd = 0; nd < D / 8; ++nd) OCTET_UNROLL
        for (int e = 0; e < 2; ++e) {
            dkr[attention::c_col(lane, nd, e)] =
                detail::attention_store<GT>(attention::mul(dk[nd][2 * r + e], p.scale));
            dvr[attention::c_col(lane, nd, e)] = detail::attention_store<GT>(dv[nd][2 * r + e]);
        }
    }
}

/// What one step of the gradient (one 64-key tile against one 64-query tile) reads and writes in
/// shared memory: the key tile's K, V and K^T, the query tile's Q, dO, Q^T, dO^T and row vectors,
/// and the step's own scratch. Transposed tiles have their 16-token groups permuted (perm_pos).
struct grad_step_smem {
    shared_ptr_t<std::uint8_t> k, v, kt;          ///< K, V (64, D); K^T (D, 64)
    shared_ptr_t<std::uint8_t> q, dout, qt, dot;  ///< Q, dO (64, D); Q^T, dO^T (D, 64)
    shared_ptr_t<float> lc, delta, qs, qf, dos;   ///< per query: L log2 e, D, q scale, query factor, dO scale
    shared_ptr_t<std::uint8_t> ds;                ///< (64 queries, 64 keys permuted): dS codes for dQ
    shared_ptr_t<float> red;                      ///< (4, 64): per-warp column amax of dS s_k
    shared_ptr_t<float> tele;                     ///< (4 warps, 4 sums, 64): telemetry partials
};

/// One step of the gradient for a group of 128 threads (`thread`: this one's index; 16 keys per
/// warp), the tiles and row vectors in place and visible: P and dP (tile_p_dp), dS, dV += P'^T dO and
/// dK += (dS s_q)^T Q into dv and dk (in registers), dQ += s_dS dS K into out.dq_accum with atomics,
/// and with Tele the step's telemetry. `sync()` is the group's barrier, called twice. Both gradient
/// kernels run it, so that their numerics are one.
template <int D, bool Wgmma, bool Tele, class QR, class KR, class VR, class DR, class GT, class Sync>
__device__ __forceinline__ void grad_step(const bwd_inputs<QR, KR, VR, DR>& p, const bwd_outputs<GT>& out,
                                          const grad_step_smem& sm, const float (&sk)[2], const float (&sv)[2],
                                          float (&dk)[D / 8][4], float (&dv)[D / 8][4], int h, int qt, int kt, int q0,
                                          int lq, int lk, int thread, Sync&& sync) {
    using QF = typename QR::format;
    using KF = typename KR::format;
    using DF = typename DR::format;
    const int warp = thread >> 5, lane = thread & 31, g = lane >> 2;
    const shared_ptr_t<std::uint8_t> sK = sm.k, sV = sm.v, sKt = sm.kt, sQ = sm.q, sdO = sm.dout, sQt = sm.qt,
                                     sdOt = sm.dot, sDS = sm.ds;
    const shared_ptr_t<float> sLc = sm.lc, sDelta = sm.delta, sQs = sm.qs, sQf = sm.qf, sDOs = sm.dos, sRed = sm.red,
                              sTele = sm.tele;
    constexpr bool tele = Tele;  // a template parameter: the telemetry's registers would spill the rest
    float mdo = attention::fmax(sDOs[lane], sDOs[lane + 32]);
    OCTET_UNROLL
    for (int off = 16; off > 0; off >>= 1) mdo = attention::fmax(mdo, shfl_xor(mdo, off));

    float pp[8][4], ds[8][4];
    tile_p_dp<D, Wgmma, QF, KF, typename VR::format, DF>(sK, sV, sQ, sdO, sQf, sLc, sDOs, sk, sv, warp, lane,
                                                         qt * kTile, kt * kTile, lq, lk, p.causal, pp, ds);
    // dS in place of dP (telemetry first: it needs dP)
    OCTET_UNROLL
    for (int n = 0; n < 8; ++n) OCTET_UNROLL
    for (int e = 0; e < 2; ++e) {
        const int col = attention::c_col(lane, n, e);
        const float dlt = sDelta[col];
        if constexpr (tele) {
            float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            OCTET_UNROLL
            for (int r = 0; r < 2; ++r) {
                const float pr = pp[n][2 * r + e], dpr = ds[n][2 * r + e];
                const float dsr = attention::dscore(pr, dpr, dlt);
                v[0] = attention::add(v[0], dsr);
                v[1] = attention::add(v[1], abs_float(dsr));
                v[2] = attention::add(v[2], attention::mul(pr, dpr));
                v[3] = attention::add(v[3], attention::mul(pr, abs_float(dpr)));
            }
            OCTET_UNROLL
            for (int k = 0; k < 4; ++k) {
                v[k] = attention::add(v[k], shfl_xor(v[k], 4));
                v[k] = attention::add(v[k], shfl_xor(v[k], 8));
                v[k] = attention::add(v[k], shfl_xor(v[k], 16));
                if (g == 0) sTele[(warp * 4 + k) * kTile + col] = v[k];
            }
        }
        OCTET_UNROLL
        for (int r = 0; r < 2; ++r) ds[n][2 * r + e] = attention::dscore(pp[n][2 * r + e], ds[n][2 * r + e], dlt);
    }
    // A fragments of P' (for dV, s_dO folded) and of dS s_q (for dK, one scale per key row)
    std::uint32_t pa[2][4], da[2][4];
    float dks[2], dki[2];
    {
        float amax[2] = {0.0f, 0.0f};
        OCTET_UNROLL
        for (int n = 0; n < 8; ++n) OCTET_UNROLL
        for (int e = 0; e < 2; ++e) {
            const float sq = sQs[attention::c_col(lane, n, e)];
            OCTET_UNROLL
            for (int r = 0; r < 2; ++r)
                amax[r] = attention::fmax(amax[r], finite_abs(attention::mul(ds[n][2 * r + e], sq)));
        }
        OCTET_UNROLL
        for (int r = 0; r < 2; ++r) {
            amax[r] = attention::fmax(amax[r], shfl_xor(amax[r], 1));
            amax[r] = attention::fmax(amax[r], shfl_xor(amax[r], 2));
            dks[r] = attention::ds_scale(amax[r]);
            dki[r] = attention::ds_inverse(dks[r]);
        }
        OCTET_UNROLL
        for (int ks2 = 0; ks2 < 2; ++ks2) OCTET_UNROLL
        for (int reg = 0; reg < 4; ++reg) {
            std::uint32_t cp[4], cd[4];
            OCTET_UNROLL
            for (int b = 0; b < 4; ++b) {
                const attention::n_x src = attention::a_source(ks2, reg, b);
                const int col = attention::c_col(lane, src.n, src.x);
                cp[b] = attention::encode_p(attention::mul(pp[src.n][src.x], attention::scale_ratio(sDOs[col], mdo)));
                cd[b] = attention::encode_ds(attention::mul(ds[src.n][src.x], sQs[col]), dki[src.x >> 1]);
            }
            pa[ks2][reg] = pack4(cp[0], cp[1], cp[2], cp[3]);
            da[ks2][reg] = pack4(cd[0], cd[1], cd[2], cd[3]);
        }
    }
    // dQ operand dS s_k: per-warp column amax
    OCTET_UNROLL
    for (int n = 0; n < 8; ++n) OCTET_UNROLL
    for (int e = 0; e < 2; ++e) {
        float a = attention::fmax(finite_abs(attention::mul(ds[n][e], sk[0])),
                                  finite_abs(attention::mul(ds[n][2 + e], sk[1])));
        a = attention::fmax(a, shfl_xor(a, 4));
        a = attention::fmax(a, shfl_xor(a, 8));
        a = attention::fmax(a, shfl_xor(a, 16));
        if (g == 0) sRed[warp * kTile + attention::c_col(lane, n, e)] = a;
    }
    sync();  // S2: column amax and telemetry partials visible (and grad_kernel's transposes)

    if constexpr (tele) {
        for (int idx = thread; idx < 4 * kTile; idx += 128) {
            const int k = idx / kTile, col = idx % kTile, i = qt * kTile + col;
            if (i >= lq) continue;
            const float v =
                attention::add(attention::add(attention::add(sTele[k * kTile + col], sTele[(4 + k) * kTile + col]),
                                              sTele[(8 + k) * kTile + col]),
                               sTele[(12 + k) * kTile + col]);
            atomicAdd(out.tele + k * out.rows + static_cast<std::size_t>(h) * p.total_q + q0 + i, v);
        }
    }
    // dS codes for dQ into sDS (queries as rows, keys permuted like K^T)
    OCTET_UNROLL
    for (int n = 0; n < 8; ++n) OCTET_UNROLL
    for (int e = 0; e < 2; ++e) {
        const int col = attention::c_col(lane, n, e);
        const float a =
            attention::fmax(attention::fmax(attention::fmax(sRed[col], sRed[kTile + col]), sRed[2 * kTile + col]),
                            sRed[3 * kTile + col]);
        const float inv = attention::ds_inverse(attention::ds_scale(a));
        OCTET_UNROLL
        for (int r = 0; r < 2; ++r)
            sDS[attention::ds_offset(col, warp, attention::c_row(lane, 2 * r))] =
                attention::encode_ds(attention::mul(ds[n][2 * r + e], sk[r]), inv);
    }
    // dV += P'^T dO and dK += (dS s_q)^T Q
    const float cdo = attention::mul(mdo, attention::p_scale);
    if constexpr (Wgmma) {
        // the warpgroup's 64 keys x 64 channels at a time: A = the P' and dS s_q codes in registers
        // (mma.sync's A fragments are wgmma's), B = dO^T's and Q^T's 64 channel rows (queries
        // permuted alike), K-major; one product in flight at a time (two would spill at D = 128)
        const std::uint32_t dot_addr = ptx::shared_address(sdOt), qt_addr = ptx::shared_address(sQt);
        constexpr int NC = 32;  // channels per product
        OCTET_UNROLL
        for (int c = 0; c < D / NC; ++c) {
            float acc[NC / 2];
            wgmma_rs_k64<NC, DF>(acc, pa, dot_addr + c * NC * 64);
            OCTET_UNROLL
            for (int n = 0; n < NC / 8; ++n) OCTET_UNROLL
            for (int x = 0; x < 4; ++x)
                dv[NC / 8 * c + n][x] = attention::fma(cdo, acc[4 * n + x], dv[NC / 8 * c + n][x]);
            wgmma_rs_k64<NC, QF>(acc, da, qt_addr + c * NC * 64);
            OCTET_UNROLL
            for (int n = 0; n < NC / 8; ++n) OCTET_UNROLL
            for (int x = 0; x < 4; ++x)
                dk[NC / 8 * c + n][x] = attention::fma(dks[x >> 1], acc[4 * n + x], dk[NC / 8 * c + n][x]);
        }
    } else {
        OCTET_UNROLL
        for (int nd = 0; nd < D / 8; ++nd) {
            float acc[4];
            mma_k64<DF>(acc, pa, sdOt, 8 * nd, lane);
            OCTET_UNROLL
            for (int x = 0; x < 4; ++x) dv[nd][x] = attention::fma(cdo, acc[x], dv[nd][x]);
            mma_k64<QF>(acc, da, sQt, 8 * nd, lane);
            OCTET_UNROLL
            for (int x = 0; x < 4; ++x) dk[nd][x] = attention::fma(dks[x >> 1], acc[x], dk[nd][x]);
        }
    }
    if constexpr (Wgmma) ptx::fence_proxy_async_shared();  // dS codes, for wgmma's reads
    sync();                                                // S3: dS codes visible

    // dQ += scale * s_dS * (dS codes) K for this warp's 16 queries
    {
        float scq[2];
        int rowi[2];
        OCTET_UNROLL
        for (int r = 0; r < 2; ++r) {
            const int col = 16 * warp + attention::c_row(lane, 2 * r);
            const float a =
                attention::fmax(attention::fmax(attention::fmax(sRed[col], sRed[kTile + col]), sRed[2 * kTile + col]),
                                sRed[3 * kTile + col]);
            scq[r] = attention::mul(p.scale, attention::ds_scale(a));
            rowi[r] = qt * kTile + col;
        }
        float* dqh = out.dq_accum + static_cast<std::size_t>(h) * D;
        const std::size_t ldq = static_cast<std::size_t>(p.hq) * D;
        // acc: the (16 queries, 8 channels) block of channels 8 nd .. 8 nd + 7, mma.sync's layout
        auto add_dq = [&](int nd, const float* acc) {
            OCTET_UNROLL
            for (int r = 0; r < 2; ++r) {
                if (rowi[r] >= lq) continue;
                float* dst = dqh + static_cast<std::size_t>(q0 + rowi[r]) * ldq + attention::c_col(lane, nd, 0);
                atomicAdd(dst, attention::mul(scq[r], acc[2 * r]));
                atomicAdd(dst + 1, attention::mul(scq[r], acc[2 * r + 1]));
            }
        };
        if constexpr (Wgmma) {
            // the warpgroup's 64 queries x 64 channels at a time: A = the dS codes (queries x keys,
            // keys permuted), B = K^T's 64 channel rows (keys permuted alike), both K-major
            const std::uint32_t ds_addr = ptx::shared_address(sDS), kt_addr = ptx::shared_address(sKt);
            OCTET_UNROLL
            for (int half = 0; half < D / 64; ++half) {
                float acc[32];
                OCTET_UNROLL
                for (int i = 0; i < 32; ++i) {
                    acc[i] = 0.0f;
                    ptx::fence_operand(acc[i]);
                }
                ptx::wgmma_fence();
                OCTET_UNROLL
                for (int ks = 0; ks < 2; ++ks)
                    ptx::wgmma_m64nNk32<64, e4m3, KF>(acc, tile_descriptor<64>(ds_addr + 32 * ks),
                                                      tile_descriptor<64>(kt_addr + half * 64 * 64 + 32 * ks),
                                                      ks > 0 ? 1u : 0u);
                ptx::wgmma_commit_group();
                ptx::wgmma_wait_group<0>();
                OCTET_UNROLL
                for (int i = 0; i < 32; ++i) ptx::fence_operand(acc[i]);
                OCTET_UNROLL
                for (int n = 0; n < 8; ++n) add_dq(8 * half + n, acc + 4 * n);
            }
        } else {
            std::uint32_t qa[2][4];
            load_a<64>(qa[0], sDS, 16 * warp, 0, lane);
            load_a<64>(qa[1], sDS, 16 * warp, 1, lane);
            OCTET_UNROLL
            for (int nd = 0; nd < D / 8; ++nd) {
                float acc[4];
                mma_k64<KF>(acc, qa, sKt, 8 * nd, lane);
                add_dq(nd, acc);
            }
        }
    }
}

}  // namespace attention
}  // namespace detail
}  // namespace octet
