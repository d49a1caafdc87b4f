// octet/attention/detail/forward.cuh: the forward kernels of FP8 attention (attention.cuh's header comment
// describes them): their parameters, the online softmax both share (forward_softmax_tile), the
// mma.sync forward_kernel (sm_89+) and the warp-specialized forward_wgmma_kernel (sm_90a).
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

template <class QR, class KR, class VR, class OT>
struct fwd_params {
    quantized_cref<QR> q;
    quantized_cref<KR> k;
    quantized_cref<VR> v;
    OT* o;
    std::size_t o_ld;
    float* lse;
    const std::int32_t* cu_q;
    const std::int32_t* cu_k;
    int hq, group, total_q;
    float scale_log2;
    bool causal;
    key_tile_order key_order;
};

/// Dynamic shared memory of the mma.sync forward: Q, K x2, V x2, V^T; the key and value scales x2.
template <int D>
constexpr int fwd_smem_bytes() {
    return kTile * D * 6 + 4 * kTile * 4;
}

/// One key tile of the forward's online softmax, for the 16 query rows of this warp: turns the
/// tile's FP8 products S (at(n, x): element x of the n-th 8-key column block, in the mma.sync /
/// wgmma accumulator layout: row row[x / 2], key j0 + c_col(lane, n, x % 2)) into u = P * s_v / m_v,
/// the values whose E4M3 codes form the P V product, and updates the running max m and sum l.
/// Returns the tile's largest V scale m_v; alpha receives each row's rescaling of O. Both forward
/// kernels call it, so they share every element rule (rules.hpp) and its order.
template <class At>
__device__ __forceinline__ float forward_softmax_tile(At&& at, int lane, const int (&row)[2], const float (&qf)[2],
                                                      int j0, bool whole, int lq, int lk, bool causal,
                                                      shared_ptr_t<const float> ksc, shared_ptr_t<const float> vsc,
                                                      float (&m)[2], float (&l)[2], float (&alpha)[2]) {
    float mt[2] = {attention::neg_inf(), attention::neg_inf()};
    OCTET_UNROLL
    for (int n = 0; n < 8; ++n) OCTET_UNROLL
    for (int e = 0; e < 2; ++e) {
        const int col = attention::c_col(lane, n, e), j = j0 + col;
        OCTET_UNROLL
        for (int r = 0; r < 2; ++r) {
            const float x = whole || attention::visible(row[r], j, lq, lk, causal)
                                ? attention::score(at(n, 2 * r + e), qf[r], ksc[col])
                                : attention::neg_inf();
            at(n, 2 * r + e) = x;
            mt[r] = attention::fmax(mt[r], x);
        }
    }
    float mv = attention::fmax(vsc[lane], vsc[lane + 32]);
    OCTET_UNROLL
    for (int off = 16; off > 0; off >>= 1) mv = attention::fmax(mv, shfl_xor(mv, off));
    OCTET_UNROLL
    for (int r = 0; r < 2; ++r) {
        mt[r] = attention::fmax(mt[r], shfl_xor(mt[r], 1));
        mt[r] = attention::fmax(mt[r], shfl_xor(mt[r], 2));
        const float m_new = attention::fmax(m[r], mt[r]);
        const float mu = attention::usable_max(m_new);
        alpha[r] = attention::exp2(attention::sub(m[r], mu));
        float rs = 0.0f;
        OCTET_UNROLL
        for (int n = 0; n < 8; ++n) OCTET_UNROLL
        for (int e = 0; e < 2; ++e) {
            const float pv = attention::exp2(attention::sub(at(n, 2 * r + e), mu));
            rs = attention::add(rs, pv);
            at(n, 2 * r + e) = attention::mul(pv, attention::scale_ratio(vsc[attention::c_col(lane, n, e)], mv));
        }
        l[r] = attention::fma(l[r], alpha[r], rs);
        m[r] = m_new;
    }
    return mv;
}

/// The forward's share of key tile jt's scales for thread t of a 128-thread group: t < 64 takes the
/// key scale of key t of the tile, t >= 64 the value scale of key t - 64 (0 past the sequence's lk keys).
template <int D, class QR, class KR, class VR, class OT>
__device__ __forceinline__ float tile_scale(const fwd_params<QR, KR, VR, OT>& p, int k0, int lk, int hk, int jt,
                                            int t) {
    const int j = jt * kTile + (t & 63);
    if (j >= lk) return 0.0f;
    return t < 64 ? token_scale(p.k, static_cast<std::size_t>(k0 + j), hk, D)
                  : token_scale(p.v, static_cast<std::size_t>(k0 + j), hk, D);
}

/// This lane's two query rows (in the sequence) of query tile qt, row[r] holding accumulator
/// elements 2r and 2r + 1, and their query factors (0 past the sequence's end).
template <int D, class QR, class KR, class VR, class OT>
__device__ __forceinline__ void forward_rows(const fwd_params<QR, KR, VR, OT>& p, int qt, int warp, int lane, int q0,
                                             int lq, int h, int (&row)[2], float (&qf)[2]) {
    OCTET_UNROLL
    for (int r = 0; r < 2; ++r) {
        row[r] = qt * kTile + warp * 16 + attention::c_row(lane, 2 * r);
        qf[r] = row[r] < lq ? attention::query_factor(token_scale(p.q, static_cast<std::size_t>(q0 + row[r]), h, D),
                                                      p.scale_log2)
                            : 0.0f;
    }
}

/// The E4M3 codes of P (the values forward_softmax_tile left in s) as the A fragments of the P V
/// product (attention::a_source): mma.sync's, which are also wgmma's register operand.
__device__ __forceinline__ void p_fragments(const float (&s)[8][4], std::uint32_t (&pa)[2][4]) {
    OCTET_UNROLL
    for (int ks = 0; ks < 2; ++ks) OCTET_UNROLL
    for (int reg = 0; reg < 4; ++reg) {
        std::uint32_t c[4];
        OCTET_UNROLL
        for (int b = 0; b < 4; ++b) {
            const attention::n_x src = attention::a_source(ks, reg, b);
            c[b] = attention::encode_p(s[src.n][src.x]);
        }
        pa[ks][reg] = pack4(c[0], c[1], c[2], c[3]);
    }
}

/// The forward's end for the 16 rows of this warp: O = acc / l (acc in the accumulator layout,
/// o[nd][x]: row row[x / 2], channel c_col(lane, nd, x % 2)) and L.
template <int D, class OT>
__device__ __forceinline__ void forward_store_rows(OT* o_base, std::size_t o_ld, float* lse, int total_q, int h, int q0,
                                                   int lq, int lane, const int (&row)[2], const float (&o)[D / 8][4],
                                                   const float (&m)[2], float (&l)[2]) {
    OCTET_UNROLL
    for (int r = 0; r < 2; ++r) {
        l[r] = attention::add(l[r], shfl_xor(l[r], 1));
        l[r] = attention::add(l[r], shfl_xor(l[r], 2));
        if (row[r] >= lq) continue;
        const float inv = l[r] > 0.0f ? attention::div(1.0f, l[r]) : 0.0f;
        OT* orow = o_base + static_cast<std::size_t>(q0 + row[r]) * o_ld + static_cast<std::size_t>(h) * D;
        OCTET_UNROLL
        for (int nd = 0; nd < D / 8; ++nd) OCTET_UNROLL
        for (int e = 0; e < 2; ++e)
            orow[attention::c_col(lane, nd, e)] = detail::attention_store<OT>(attention::mul(o[nd][2 * r + e], inv));
        if ((lane & 3) == 0)
            lse[static_cast<std::size_t>(h) * total_q + q0 + row[r]] = attention::log_sum_exp(m[r], l[r]);
    }
}

/// The mma.sync forward (sm_89+; on Hopper forward_wgmma_kernel is the fast one): FP8 mma.sync, P
/// from registers. It and forward_wgmma_kernel read the same swizzled tiles (swz is wgmma's and
/// TMA's swizzle) and share the softmax, so their results differ only by the order of the tensor
/// cores' sums.
template <int D, class QR, class KR, class VR, class OT>
OCTET_KERNEL void __launch_bounds__(kThreads, 3) forward_kernel(const fwd_params<QR, KR, VR, OT> p) {
    using QF = typename QR::format;
    using KF = typename KR::format;
    using VF = typename VR::format;
    OCTET_DYNAMIC_SHARED(std::uint8_t, fwd_smem);
    shared_ptr_t<std::uint8_t> sQ = fwd_smem;                             // (64, D)
    shared_ptr_t<std::uint8_t> sK = sQ + kTile * D;                       // 2 x (64, D)
    shared_ptr_t<std::uint8_t> sV = sK + 2 * kTile * D;                   // 2 x (64, D)
    shared_ptr_t<std::uint8_t> sVt = sV + 2 * kTile * D;                  // (D, 64), keys permuted
    shared_ptr_t<float> sKs = OCTET_SHARED_CAST(float, sVt + kTile * D);  // 2 x 64 key scales
    shared_ptr_t<float> sVs = sKs + 2 * kTile;                            // 2 x 64 value scales

    const int b = blockIdx.z, h = blockIdx.y, qt = gridDim.x - 1 - blockIdx.x;  // long causal tiles first
    const int q0 = p.cu_q[b], lq = p.cu_q[b + 1] - q0, k0 = p.cu_k[b], lk = p.cu_k[b + 1] - k0;
    if (qt * kTile >= lq) return;
    const int hk = h / p.group;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int ntiles = attention::key_tiles_for(qt, lq, lk, p.causal);

    // step s of the loop below visits key tile tile_at(s)
    auto tile_at = [&](int step) { return attention::key_tile_at(step, ntiles, p.key_order); };

    load_tile_async<D>(sQ, p.q.data, p.q.layout.row_bytes, q0 + qt * kTile, q0 + lq, h * D);
    if (ntiles > 0) {
        const int first = k0 + tile_at(0) * kTile;
        load_tile_async<D>(sK, p.k.data, p.k.layout.row_bytes, first, k0 + lk, hk * D);
        load_tile_async<D>(sV, p.v.data, p.v.layout.row_bytes, first, k0 + lk, hk * D);
    }
    ptx::cp_async_commit_group();
    auto fetch_scale = [&](int jt) { return tile_scale<D>(p, k0, lk, hk, jt, tid); };
    float scale_next = ntiles > 0 ? fetch_scale(tile_at(0)) : 0.0f;

    int row[2];
    float qf[2];
    forward_rows<D>(p, qt, warp, lane, q0, lq, h, row, qf);

    float o[D / 8][4];
    OCTET_UNROLL
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {attention::neg_inf(), attention::neg_inf()}, l[2] = {0.0f, 0.0f};
    std::uint32_t qa[D / 32][4];

    for (int step = 0; step < ntiles; ++step) {
        const int st = step & 1, jt = tile_at(step);
        ptx::cp_async_wait_group<0>();
        (tid < 64 ? sKs : sVs)[st * kTile + (tid & 63)] = scale_next;
        __syncthreads();  // tile jt (K, V, scales) visible; every warp is done with the previous step's
        if (step == 0) {
            OCTET_UNROLL
            for (int ks = 0; ks < D / 32; ++ks) load_a<D>(qa[ks], sQ, warp * 16, ks, lane);
        }
        if (step + 1 < ntiles) {
            const int next = tile_at(step + 1);
            load_tile_async<D>(sK + (st ^ 1) * kTile * D, p.k.data, p.k.layout.row_bytes, k0 + next * kTile, k0 + lk,
                               hk * D);
            load_tile_async<D>(sV + (st ^ 1) * kTile * D, p.v.data, p.v.layout.row_bytes, k0 + next * kTile, k0 + lk,
                               hk * D);
            scale_next = fetch_scale(next);
        }
        ptx::cp_async_commit_group();
        transpose_tile<D, kThreads>(sV + st * kTile * D, sVt, tid, kTile);

        // S = Q K^T: (16, 64) per warp
        float s[8][4];
        OCTET_UNROLL
        for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        OCTET_UNROLL
        for (int ks = 0; ks < D / 32; ++ks) {
            OCTET_UNROLL
            for (int np = 0; np < 4; ++np) {
                std::uint32_t bk[2][2];
                load_b2<D>(bk, sK + st * kTile * D, 16 * np, ks, lane);
                ptx::mma_m16n8k32_acc<QF, KF>(s[2 * np], qa[ks], bk[0]);
                ptx::mma_m16n8k32_acc<QF, KF>(s[2 * np + 1], qa[ks], bk[1]);
            }
        }
        const bool whole =
            attention::tile_all_visible(qt * kTile, jt * kTile, lq, lk, p.causal);  // no mask test inside
        float alpha[2];
        const float mv = forward_softmax_tile([&](int n, int x) -> float& { return s[n][x]; }, lane, row, qf, jt* kTile,
                                              whole, lq, lk, p.causal, sKs + st * kTile, sVs + st * kTile, m, l, alpha);
        const float cv = attention::mul(mv, attention::p_scale);
        std::uint32_t pa[2][4];
        p_fragments(s, pa);
        __syncthreads();  // V^T ready
        OCTET_UNROLL
        for (int nd = 0; nd < D / 8; ++nd) {
            float acc[4];
            mma_k64<VF>(acc, pa, sVt, 8 * nd, lane);
            OCTET_UNROLL
            for (int x = 0; x < 4; ++x) o[nd][x] = attention::fma(o[nd][x], alpha[x >> 1], attention::mul(cv, acc[x]));
        }
    }

    ptx::cp_async_wait_group<0>();  // nothing may be in flight at exit (ntiles == 0 leaves Q's copy)
    forward_store_rows<D>(p.o, p.o_ld, p.lse, p.total_q, h, q0, lq, lane, row, o, m, l);
}

// ---- the sm_90a forward: FlashAttention-3's structure --------------------------------------------

/// Stages of forward_wgmma_kernel's ring (each: K, V, V^T and the key and value scales of one key tile).
constexpr int kForwardStages = 4;
/// Its registers per thread after setmaxnreg. One CTA of 384 threads per SM launches with 168 each
/// (64512 of the SM's 65536), which the producer gives away and the consumers take.
constexpr int kForwardProducerRegs = 48, kForwardConsumerRegs = 224;

/// Dynamic shared memory of forward_wgmma_kernel: the slack that aligns the tiles to 1024 bytes (their
/// swizzle atoms), the two Q tiles, then per stage K, V, V^T and the key and value scales, then the
/// mbarriers.
template <int D>
constexpr int fwd_wgmma_smem_bytes() {
    return 1024 + kConsumerGroups * kTile * D + kForwardStages * (3 * kTile * D + 2 * kTile * 4) +
           (1 + 3 * kForwardStages) * 8;
}

/// The forward on sm_90a (an empty kernel elsewhere, never launched there), warp-specialized as in
/// FlashAttention-3, for a block of 128 query rows: consumer warpgroup w owns query tile 2 qb + w.
///
/// Warpgroup 2 produces: one thread loads the two Q tiles and then each key tile's K and V with TMA
/// (map_q/k/v: the codes of q, k and v as byte matrices, boxes of 64 rows x D bytes with the swizzle
/// of swz) into a ring of kForwardStages stages; the 128 threads fetch the tile's key and value
/// scales, wait for the loads, transpose V into V^T (keys past the sequence zeroed: TMA fills only
/// rows past the whole tensor), make V^T visible to the async proxy and arrive on the stage's `full`
/// barrier. Both consumers read every stage, so K and V are loaded and V transposed once per 128
/// queries.
///
/// Each consumer warpgroup: S = Q K^T as wgmma m64n64k32 from its Q tile and the stage's K, the
/// softmax (forward_softmax_tile, as forward_kernel), O += P V as wgmma m64nDk32 with P's codes from
/// registers and V^T from the stage, then releases the stage (its `empty` barrier, one arrival per
/// warp of both warpgroups). Within a warpgroup the next tile's S and softmax overlap the running
/// P V (intra-warpgroup pipelining, see the loop); between the two, named barriers 1 and 2 hand the
/// tensor cores back and forth (ping-pong), so that one warpgroup's softmax runs while the other's
/// products do. Under a causal mask the later rows of warpgroup 1 can see a key tile more than
/// warpgroup 0: warpgroup 0 releases that stage unread, with the same turns on the named barriers.
template <int D, class QR, class KR, class VR, class OT>
OCTET_KERNEL void __launch_bounds__(kWarpSpecializedThreads, 1)
    forward_wgmma_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                         const __grid_constant__ CUtensorMap map_v,
                         const __grid_constant__ fwd_params<QR, KR, VR, OT> p) {
#if OCTET_ARCH_SM90A
    using QF = typename QR::format;
    using KF = typename KR::format;
    using VF = typename VR::format;
    constexpr int S = kForwardStages, T = kTile * D;  // stages; bytes of a tile
    OCTET_DYNAMIC_SHARED(std::uint8_t, fwd_smem);
    // the padding is added to the shared array itself, so that the pointers stay in the shared address space
    const shared_ptr_t<std::uint8_t> sQ = fwd_smem + wgmma_tile_padding(fwd_smem);  // 2 x (64, D)
    const shared_ptr_t<std::uint8_t> sK = sQ + kConsumerGroups * T;                 // S x (64, D)
    const shared_ptr_t<std::uint8_t> sV = sK + S * T;                               // S x (64, D)
    const shared_ptr_t<std::uint8_t> sVt = sV + S * T;                              // S x (D, 64), keys permuted
    const shared_ptr_t<float> sKs = OCTET_SHARED_CAST(float, sVt + S * T);          // S x 64 key scales
    const shared_ptr_t<float> sVs = sKs + S * kTile;                                // S x 64 value scales
    const shared_ptr_t<std::uint64_t> q_loaded = OCTET_SHARED_CAST(std::uint64_t, sVs + S * kTile);
    const shared_ptr_t<std::uint64_t> kv_loaded = q_loaded + 1;  // S: the stage's K and V have landed
    const shared_ptr_t<std::uint64_t> full = kv_loaded + S;      // S: the stage is ready (scales, V^T)
    const shared_ptr_t<std::uint64_t> empty = full + S;          // S: the consumers are done with it
    auto bar = [](shared_ptr_t<std::uint64_t> b) { return ptx::shared_address(b); };

    const int b = blockIdx.z, h = blockIdx.y, qb = gridDim.x - 1 - blockIdx.x;  // long causal blocks first
    const int q0 = p.cu_q[b], lq = p.cu_q[b + 1] - q0, k0 = p.cu_k[b], lk = p.cu_k[b + 1] - k0;
    if (qb * kBlockRows >= lq) return;
    const int hk = h / p.group, tid = threadIdx.x;
    // key tiles of each consumer's query tile (none for a tile past the sequence), and of the block
    const bool rows1 = (2 * qb + 1) * kTile < lq;
    const int tiles0 = attention::key_tiles_for(2 * qb, lq, lk, p.causal);
    const int tiles1 = rows1 ? attention::key_tiles_for(2 * qb + 1, lq, lk, p.causal) : 0;
    const int ntiles = tiles0 > tiles1 ? tiles0 : tiles1;
    if (tid == 0) {
        ptx::mbarrier_init(bar(q_loaded), 1);
        init_ring(kv_loaded, full, empty, S);
        ptx::fence_mbarrier_init();
    }
    __syncthreads();

    if (tid >= kConsumerGroups * 128) {
        // ---- producer warpgroup ----
        ptx::setmaxnreg_dec<kForwardProducerRegs>();
        const int ptid = tid - kConsumerGroups * 128;
        if (ptid == 0 && ntiles > 0) {
            ptx::mbarrier_arrive_expect_tx(bar(q_loaded), rows1 ? 2 * T : T);
            ptx::tma_load_2d(ptx::shared_address(sQ), &map_q, h * D, q0 + qb * kBlockRows, bar(q_loaded));
            if (rows1)
                ptx::tma_load_2d(ptx::shared_address(sQ + T), &map_q, h * D, q0 + qb * kBlockRows + kTile,
                                 bar(q_loaded));
        }
        for (int step = 0; step < ntiles; ++step) {
            const int st = step % S, jt = attention::key_tile_at(step, ntiles, p.key_order);
            const std::uint32_t phase = static_cast<std::uint32_t>(step / S) & 1u;
            ptx::mbarrier_wait(bar(empty + st), phase ^ 1u);  // passes at once on the ring's first round
            if (ptid == 0) {
                ptx::mbarrier_arrive_expect_tx(bar(kv_loaded + st), 2 * T);
                ptx::tma_load_2d(ptx::shared_address(sK + st * T), &map_k, hk * D, k0 + jt * kTile,
                                 bar(kv_loaded + st));
                ptx::tma_load_2d(ptx::shared_address(sV + st * T), &map_v, hk * D, k0 + jt * kTile,
                                 bar(kv_loaded + st));
            }
            (ptid < 64 ? sKs : sVs)[st * kTile + (ptid & 63)] = tile_scale<D>(p, k0, lk, hk, jt, ptid);
            ptx::mbarrier_wait(bar(kv_loaded + st), phase);
            transpose_tile_sm90<D, 128>(sV + st * T, sVt + st * T, ptid, lk - jt * kTile);
            ptx::fence_proxy_async_shared();  // V^T, written by threads, for wgmma's reads
            ptx::mbarrier_arrive(bar(full + st));
        }
        return;
    }

    // ---- consumer warpgroups ----
    ptx::setmaxnreg_inc<kForwardConsumerRegs>();
    const int cw = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int qt = 2 * qb + cw, nt = cw == 0 ? tiles0 : tiles1;
    // This warpgroup's steps of the block's ntiles are [first, first + nt): the key tiles it sees, in
    // the block's order (back to front, the other warpgroup's extra tiles come first).
    const int first = p.key_order == key_tile_order::back_to_front ? ntiles - nt : 0;
    const shared_ptr_t<std::uint8_t> sQw = sQ + cw * T;
    int row[2];
    float qf[2];
    forward_rows<D>(p, qt, warp, lane, q0, lq, h, row, qf);
    float o[D / 8][4];
    OCTET_UNROLL
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {attention::neg_inf(), attention::neg_inf()}, l[2] = {0.0f, 0.0f};

    auto wait_full = [&](int step) {
        ptx::mbarrier_wait(bar(full + step % S), static_cast<std::uint32_t>(step / S) & 1u);
    };
    auto release = [&](int step) {
        __syncwarp();
        if (lane == 0) ptx::mbarrier_arrive(bar(empty + step % S));  // this warp is done with the stage
    };
    // The ping-pong: warpgroup w issues its products in turn `round` after bar.sync on barrier 1 + w,
    // then hands the turn to the other (bar.arrive on its barrier). Both warpgroups take ntiles + 1
    // turns (one per issue of the pipelined loop, an empty one per stage released unread), warpgroup 1
    // hands warpgroup 0 its first turn, and warpgroup 1's last turn hands over nothing, so that every
    // arrival meets a sync.
    const int rounds = ntiles > 0 ? ntiles + 1 : 0;
    int round = 0;
    auto turn = [&](auto&& issue) {
        ptx::bar_sync(1 + cw, 2 * 128);
        issue();
        if (cw == 0 || round + 1 < rounds) ptx::bar_arrive(2 - cw, 2 * 128);
        ++round;
    };
    auto no_issue = [] {};
    // A stage this warpgroup does not read: waited for (so that the arrival counts toward its phase)
    // and released.
    auto skip = [&](int step) {
        wait_full(step);
        release(step);
        turn(no_issue);
    };

    // Issues S = Q K^T of the key tile of `step` into s ((64, 64) for the warpgroup, (16, 64) per warp;
    // register 4n + x is s[n][x]) as one wgmma-group; the stage is full.
    float s[8][4];
    auto issue_s = [&](int step) {
        float(&acc)[32] = reinterpret_cast<float(&)[32]>(s);
        const std::uint32_t qa_addr = ptx::shared_address(sQw), kb_addr = ptx::shared_address(sK + (step % S) * T);
        OCTET_UNROLL
        for (int i = 0; i < 32; ++i) ptx::fence_operand(acc[i]);
        ptx::wgmma_fence();
        OCTET_UNROLL
        for (int ks = 0; ks < D / 32; ++ks)
            ptx::wgmma_m64nNk32<64, QF, KF>(acc, tile_descriptor<D>(qa_addr + 32 * ks),
                                            tile_descriptor<D>(kb_addr + 32 * ks), ks > 0 ? 1u : 0u);
        ptx::wgmma_commit_group();
    };
    // The softmax of the tile of `step` (its S in s, complete): P (scaled as forward_softmax_tile says)
    // into u, the rescaling of O into alpha, the factor of the tile's P V product into cv. s is left
    // as the wgmma wrote it.
    auto softmax = [&](int step, float(&u)[8][4], float(&alpha)[2], float& cv) {
        OCTET_UNROLL
        for (int i = 0; i < 32; ++i) {
            ptx::fence_operand(s[i / 4][i % 4]);
            u[i / 4][i % 4] = s[i / 4][i % 4];
        }
        const int st = step % S, jt = attention::key_tile_at(step, ntiles, p.key_order);
        const bool whole =
            attention::tile_all_visible(qt * kTile, jt * kTile, lq, lk, p.causal);  // no mask test inside
        const float mv = forward_softmax_tile([&](int n, int x) -> float& { return u[n][x]; }, lane, row, qf, jt* kTile,
                                              whole, lq, lk, p.causal, sKs + st * kTile, sVs + st * kTile, m, l, alpha);
        cv = attention::mul(mv, attention::p_scale);
    };

    // P V of tile `step` from pa (its P's codes, the A operand), issued; then, once its wgmma-group is
    // complete, O updated with the tile's alpha and cv, and the stage released.
    std::uint32_t pa[2][4];
    float alpha[2], cv;
    float pv[D / 8][4];  // register 4 nd + x is pv[nd][x]
    auto issue_pv = [&](int step) {
        wgmma_rs_k64_async<D, VF>(reinterpret_cast<float(&)[D / 2]>(pv), pa, ptx::shared_address(sVt + (step % S) * T));
    };
    auto finish_pv = [&](int step) {
        OCTET_UNROLL
        for (int i = 0; i < D / 2; ++i) ptx::fence_operand(reinterpret_cast<float(&)[D / 2]>(pv)[i]);
        OCTET_UNROLL
        for (int i = 0; i < 8; ++i) ptx::fence_operand(pa[i / 4][i % 4]);
        release(step);
        OCTET_UNROLL
        for (int nd = 0; nd < D / 8; ++nd) OCTET_UNROLL
        for (int x = 0; x < 4; ++x) o[nd][x] = attention::fma(o[nd][x], alpha[x >> 1], attention::mul(cv, pv[nd][x]));
    };

    if (cw == 1 && rounds > 0) ptx::bar_arrive(1, 2 * 128);  // warpgroup 0 takes the first turn
    for (int step = 0; step < first; ++step) skip(step);
    // The products of two tiles overlap the softmax (FlashAttention-3's intra-warpgroup pipelining):
    // S of tile step + 1 and P V of tile step are issued together, and the softmax of tile step + 1
    // runs while the tensor cores finish P V. Its P becomes codes in pa only after P V has completed
    // (the wgmma reads pa until then, and ptxas serializes wgmmas whose inputs other instructions
    // define while a wgmma-group is in flight).
    if (nt > 0) {
        ptx::mbarrier_wait(bar(q_loaded), 0);
        wait_full(first);
        turn([&] { issue_s(first); });
        ptx::wgmma_wait_group<0>();
        float u[8][4];
        softmax(first, u, alpha, cv);
        p_fragments(u, pa);
    } else if (rounds > 0) {
        turn(no_issue);  // the turn of the first S that this warpgroup does not have
    }
    for (int step = first; step + 1 < first + nt; ++step) {
        wait_full(step + 1);
        turn([&] {
            issue_s(step + 1);
            issue_pv(step);
        });
        float u[8][4], alpha_next[2], cv_next;
        ptx::wgmma_wait_group<1>();  // S of tile step + 1 (the older group) is complete
        softmax(step + 1, u, alpha_next, cv_next);
        ptx::wgmma_wait_group<0>();
        finish_pv(step);
        p_fragments(u, pa);
        alpha[0] = alpha_next[0];
        alpha[1] = alpha_next[1];
        cv = cv_next;
    }
    if (nt > 0) {
        turn([&] { issue_pv(first + nt - 1); });
        ptx::wgmma_wait_group<0>();
        finish_pv(first + nt - 1);
    }
    for (int step = first + nt; step < ntiles; ++step) skip(step);
    forward_store_rows<D>(p.o, p.o_ld, p.lse, p.total_q, h, q0, lq, lane, row, o, m, l);
#else
    (void)map_q, (void)map_k, (void)map_v, (void)p;
#endif
}

}  // namespace attention
}  // namespace detail
}  // namespace octet
