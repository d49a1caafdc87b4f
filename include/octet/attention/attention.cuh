// octet/attention/attention.cuh: FP8 attention forward and backward on a CUDA stream (sm_89+:
// FP8 mma.sync; the forward also on FP8 wgmma for sm_90a; built for sm_90a and sm_89).
//
//   octet::attention_forward(octet::on_stream(s), shape, q, k, v, o, lse, opt);
//   octet::attention_backward(octet::on_stream(s), shape, q, k, v, o, lse, dout, dq, dk, dv, workspace, bopt,
//   device_stats);
//
// The backend of the entries in attention.hpp (attention_backend<stream_executor>), which check the
// arguments every executor shares once; the stream backward's own form, with its workspace, is
// below. Same arguments, layout and numerics as the host forms (attention.hpp, which see), with
// device memory everywhere, plus: `shape.device_cu_seqlens_q/_k` (device copies of the offsets),
// and for the backward a float workspace of attention_backward_workspace_for(shape).floats
// (row arrays and the float dQ accumulator; its row arrays hold the per-row telemetry afterwards,
// see attention_row_array) and, optionally, `device_stats`: one attention_stats in device memory
// that receives the telemetry summary (with options.telemetry). Nothing is synchronized and nothing
// is allocated. options.fold_dq_residual is host-only: the stream backward rejects it.
//
// Kernels (64-row tiles, 16 rows per warp; options.kernel chooses mma.sync or wgmma, automatic takes
// wgmma where it can run):
//   forward:  loops over 64-key tiles in options.key_order, S = Q K^T and O += P V on FP8 tensor
//             cores, online softmax in registers (the same forward_softmax_tile in both kernels).
//             - forward_kernel (FlashAttention-2's structure; block = (64-query tile, head,
//               sequence), 4 warps): double-buffered cp.async, FP8 mma.sync with P passed in
//               registers (sm_89; on Hopper it compiles to FP16 HMMA with conversions).
//             - forward_wgmma_kernel (sm_90a, FlashAttention-3's structure; block = 128 queries):
//               a producer warpgroup loads Q, K and V with TMA into a 4-stage mbarrier ring and
//               transposes V there; two consumer warpgroups (64 queries each) issue wgmma m64n64k32
//               for S and m64nDk32 for P V with P from registers (QGMMA), in turns (ping-pong), each
//               overlapping the next tile's S and softmax with the running P V.
//   delta:    from_output: one warp per query row (rowsum(dO * O)); matched: block = (query tile,
//             head, sequence) recomputing S^T and dP^T tile by tile with the very code the
//             gradient kernels use (tile_p_dp), so D_i = sum_j P_ij dP_ij is formed from the same
//             bits as the dS it enters.
//   gradient: each 64-key tile loops over the query heads of its group and their 64-query tiles
//             (grad_step, shared by both kernels); dK and dV stay in registers, dQ goes to a float
//             accumulator with atomics (converted to the output type at the end).
//             - grad_kernel (block = (64-key tile, key/value head, sequence), 4 warps): cp.async
//               into two stages, FP8 mma.sync (sm_89).
//             - grad_wgmma_kernel (sm_90a; block = 128 keys): a producer warpgroup loads Q and dO
//               with TMA into a 2-stage ring and transposes them there; two consumer warpgroups
//               (64 keys each) form every product with QGMMA: S^T and dP^T (tile_p_dp) and dQ from
//               shared memory, dV and dK with their A operands (P'^T, dS^T) from registers.
// Head dims 64 and 128. P and dS reach the next product through registers (see detail/tiles.cuh).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "octet/attention/attention.hpp"
#include "octet/attention/detail/tiles.cuh"
#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/tensor_map.cuh"

namespace octet {
namespace attn_kernel {

// ================================================================================================
// Forward
// ================================================================================================

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

/// wgmma's descriptor of a K-major tile of `RowBytes`-byte rows (64 or 128), swizzled as swz does
/// (which is TMA's and wgmma's 64- and 128-byte swizzle for tiles aligned to 1024 bytes), from the
/// shared address of its first byte plus 32 k bytes for k-step k.
template <int RowBytes>
__device__ __forceinline__ std::uint64_t tile_descriptor(std::uint32_t address) {
    static_assert(RowBytes == 64 || RowBytes == 128, "attention tiles have rows of 64 or 128 bytes");
    ptx::wgmma_descriptor d;
    d.start = address;
    d.stride = 8 * RowBytes;  // 8-row swizzle atoms
    d.swizzle = RowBytes == 128 ? ptx::wgmma_swizzle::b128 : ptx::wgmma_swizzle::b64;
    return d.encode();
}

/// Bytes from the start of dynamic shared memory `smem` to its first 1024-byte boundary, where the
/// wgmma kernels start their tiles (the swizzle atoms' alignment; their *_smem_bytes hold the slack).
/// Added to the shared array itself, so that the tile pointers stay in the shared address space.
template <class SharedBytes>
__device__ __forceinline__ std::uint32_t wgmma_tile_padding(SharedBytes smem) {
    return (1024u - (ptx::shared_address(smem) & 1023u)) & 1023u;
}

/// The scale of token `tok`, head `h` (channels h*D .. h*D + D-1) of an FP8 operand.
template <class R>
__device__ __forceinline__ float token_scale(const quantized_cref<R>& x, std::size_t tok, int h, int D) {
    return x.scale(tok / x.layout.block_rows, static_cast<std::size_t>(h) * D / x.layout.block_cols);
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
    float mt[2] = {attn::neg_inf(), attn::neg_inf()};
    OCTET_UNROLL
    for (int n = 0; n < 8; ++n) OCTET_UNROLL
    for (int e = 0; e < 2; ++e) {
        const int col = attn_frag::c_col(lane, n, e), j = j0 + col;
        OCTET_UNROLL
        for (int r = 0; r < 2; ++r) {
            const float x = whole || attn::visible(row[r], j, lq, lk, causal)
                                ? attn::score(at(n, 2 * r + e), qf[r], ksc[col])
                                : attn::neg_inf();
            at(n, 2 * r + e) = x;
            mt[r] = attn::fmax(mt[r], x);
        }
    }
    float mv = attn::fmax(vsc[lane], vsc[lane + 32]);
    OCTET_UNROLL
    for (int off = 16; off > 0; off >>= 1) mv = attn::fmax(mv, shfl_xor(mv, off));
    OCTET_UNROLL
    for (int r = 0; r < 2; ++r) {
        mt[r] = attn::fmax(mt[r], shfl_xor(mt[r], 1));
        mt[r] = attn::fmax(mt[r], shfl_xor(mt[r], 2));
        const float m_new = attn::fmax(m[r], mt[r]);
        const float mu = attn::usable_max(m_new);
        alpha[r] = attn::exp2(attn::sub(m[r], mu));
        float rs = 0.0f;
        OCTET_UNROLL
        for (int n = 0; n < 8; ++n) OCTET_UNROLL
        for (int e = 0; e < 2; ++e) {
            const float pv = attn::exp2(attn::sub(at(n, 2 * r + e), mu));
            rs = attn::add(rs, pv);
            at(n, 2 * r + e) = attn::mul(pv, attn::scale_ratio(vsc[attn_frag::c_col(lane, n, e)], mv));
        }
        l[r] = attn::fma(l[r], alpha[r], rs);
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
        row[r] = qt * kTile + warp * 16 + attn_frag::c_row(lane, 2 * r);
        qf[r] = row[r] < lq
                    ? attn::query_factor(token_scale(p.q, static_cast<std::size_t>(q0 + row[r]), h, D), p.scale_log2)
                    : 0.0f;
    }
}

/// The E4M3 codes of P (the values forward_softmax_tile left in s) as the A fragments of the P V
/// product (attn_frag::a_source): mma.sync's, which are also wgmma's register operand.
__device__ __forceinline__ void p_fragments(const float (&s)[8][4], std::uint32_t (&pa)[2][4]) {
    OCTET_UNROLL
    for (int ks = 0; ks < 2; ++ks) OCTET_UNROLL
    for (int reg = 0; reg < 4; ++reg) {
        std::uint32_t c[4];
        OCTET_UNROLL
        for (int b = 0; b < 4; ++b) {
            const attn_frag::n_x src = attn_frag::a_source(ks, reg, b);
            c[b] = attn::encode_p(s[src.n][src.x]);
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
        l[r] = attn::add(l[r], shfl_xor(l[r], 1));
        l[r] = attn::add(l[r], shfl_xor(l[r], 2));
        if (row[r] >= lq) continue;
        const float inv = l[r] > 0.0f ? attn::div(1.0f, l[r]) : 0.0f;
        OT* orow = o_base + static_cast<std::size_t>(q0 + row[r]) * o_ld + static_cast<std::size_t>(h) * D;
        OCTET_UNROLL
        for (int nd = 0; nd < D / 8; ++nd) OCTET_UNROLL
        for (int e = 0; e < 2; ++e)
            orow[attn_frag::c_col(lane, nd, e)] = detail::attention_store<OT>(attn::mul(o[nd][2 * r + e], inv));
        if ((lane & 3) == 0) lse[static_cast<std::size_t>(h) * total_q + q0 + row[r]] = attn::log_sum_exp(m[r], l[r]);
    }
}

/// acc = A B^T for one warp with mma.sync: A (16 x 64 E4M3 codes) as two k-steps of A fragments,
/// B rows n0 .. n0 + 7 (64 codes of FB each) of a transposed 64-wide tile (load_bt).
template <class FB>
__device__ __forceinline__ void mma_k64(float (&acc)[4], const std::uint32_t (&a)[2][4],
                                        shared_ptr_t<const std::uint8_t> bt_tile, int n0, int lane) {
    std::uint32_t b[2][2];
    load_bt(b, bt_tile, n0, lane);
    acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
    ptx::mma_m16n8k32_acc<e4m3, FB>(acc, a[0], b[0]);
    ptx::mma_m16n8k32_acc<e4m3, FB>(acc, a[1], b[1]);
}

/// Issues acc = A B^T for the warpgroup as one committed wgmma-group, without waiting for it: A (64 x
/// 64 E4M3 codes) from registers, each warp's 16 rows as two k-steps of mma.sync A fragments (wgmma's
/// register layout), B (N rows x 64 codes of FB) rows of a swizzled 64-byte-row tile from shared
/// address b_addr. acc and a belong to the tensor cores until a wgmma_wait_group completes the group;
/// then fence both (ptx::fence_operand), so that the compiler keeps a's registers until then.
template <int N, class FB>
__device__ __forceinline__ void wgmma_rs_k64_async(float (&acc)[N / 2], const std::uint32_t (&a)[2][4],
                                                   std::uint32_t b_addr) {
    OCTET_UNROLL
    for (int i = 0; i < N / 2; ++i) ptx::fence_operand(acc[i]);  // the first k-step ignores acc (scale-d 0)
    ptx::wgmma_fence();
    OCTET_UNROLL
    for (int ks = 0; ks < 2; ++ks)
        ptx::wgmma_m64nNk32<N, e4m3, FB>(acc, a[ks], tile_descriptor<64>(b_addr + 32 * ks), ks > 0 ? 1u : 0u);
    ptx::wgmma_commit_group();
}

/// wgmma_rs_k64_async, complete on return.
template <int N, class FB>
__device__ __forceinline__ void wgmma_rs_k64(float (&acc)[N / 2], std::uint32_t (&a)[2][4], std::uint32_t b_addr) {
    OCTET_UNROLL
    for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
    wgmma_rs_k64_async<N, FB>(acc, a, b_addr);
    ptx::wgmma_wait_group<0>();
    OCTET_UNROLL
    for (int i = 0; i < N / 2; ++i) ptx::fence_operand(acc[i]);
    OCTET_UNROLL
    for (int i = 0; i < 8; ++i) ptx::fence_operand(a[i / 4][i % 4]);
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
    const int ntiles = attn::key_tiles_for(qt, lq, lk, p.causal);

    // step s of the loop below visits key tile tile_at(s)
    auto tile_at = [&](int step) { return attn::key_tile_at(step, ntiles, p.key_order); };

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
    float m[2] = {attn::neg_inf(), attn::neg_inf()}, l[2] = {0.0f, 0.0f};
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
        const bool whole = attn::tile_all_visible(qt * kTile, jt * kTile, lq, lk, p.causal);  // no mask test inside
        float alpha[2];
        const float mv = forward_softmax_tile([&](int n, int x) -> float& { return s[n][x]; }, lane, row, qf, jt* kTile,
                                              whole, lq, lk, p.causal, sKs + st * kTile, sVs + st * kTile, m, l, alpha);
        const float cv = attn::mul(mv, attn::p_scale);
        std::uint32_t pa[2][4];
        p_fragments(s, pa);
        __syncthreads();  // V^T ready
        OCTET_UNROLL
        for (int nd = 0; nd < D / 8; ++nd) {
            float acc[4];
            mma_k64<VF>(acc, pa, sVt, 8 * nd, lane);
            OCTET_UNROLL
            for (int x = 0; x < 4; ++x) o[nd][x] = attn::fma(o[nd][x], alpha[x >> 1], attn::mul(cv, acc[x]));
        }
    }

    ptx::cp_async_wait_group<0>();  // nothing may be in flight at exit (ntiles == 0 leaves Q's copy)
    forward_store_rows<D>(p.o, p.o_ld, p.lse, p.total_q, h, q0, lq, lane, row, o, m, l);
}

// ---- the sm_90a forward: FlashAttention-3's structure --------------------------------------------

/// The block of the warp-specialized kernels (forward_wgmma_kernel, grad_wgmma_kernel): warpgroups
/// 0 and 1 consume, one 64-row tile each (queries in the forward, keys in the gradient), and
/// warpgroup 2 produces.
constexpr int kConsumerGroups = 2;
constexpr int kWarpSpecializedThreads = (kConsumerGroups + 1) * 128;
constexpr int kBlockRows = kConsumerGroups * kTile;
/// Initializes the mbarriers of a warp-specialized kernel's ring of `stages` stages (one thread,
/// before the block's first barrier): per stage `loaded` (the producer's TMA thread, with its
/// transaction bytes), `full` (every producer thread) and `empty` (every consumer warp).
__device__ __forceinline__ void init_ring(shared_ptr_t<std::uint64_t> loaded, shared_ptr_t<std::uint64_t> full,
                                          shared_ptr_t<std::uint64_t> empty, int stages) {
    for (int st = 0; st < stages; ++st) {
        ptx::mbarrier_init(ptx::shared_address(loaded + st), 1);
        ptx::mbarrier_init(ptx::shared_address(full + st), 128);
        ptx::mbarrier_init(ptx::shared_address(empty + st), 4 * kConsumerGroups);
    }
}
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
    const int tiles0 = attn::key_tiles_for(2 * qb, lq, lk, p.causal);
    const int tiles1 = rows1 ? attn::key_tiles_for(2 * qb + 1, lq, lk, p.causal) : 0;
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
            const int st = step % S, jt = attn::key_tile_at(step, ntiles, p.key_order);
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
    float m[2] = {attn::neg_inf(), attn::neg_inf()}, l[2] = {0.0f, 0.0f};

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
        const int st = step % S, jt = attn::key_tile_at(step, ntiles, p.key_order);
        const bool whole = attn::tile_all_visible(qt * kTile, jt * kTile, lq, lk, p.causal);  // no mask test inside
        const float mv = forward_softmax_tile([&](int n, int x) -> float& { return u[n][x]; }, lane, row, qf, jt* kTile,
                                              whole, lq, lk, p.causal, sKs + st * kTile, sVs + st * kTile, m, l, alpha);
        cv = attn::mul(mv, attn::p_scale);
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
        for (int x = 0; x < 4; ++x) o[nd][x] = attn::fma(o[nd][x], alpha[x >> 1], attn::mul(cv, pv[nd][x]));
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

// ================================================================================================
// Backward: the shared tile of P and dP
// ================================================================================================

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
    const bool whole = attn::tile_all_visible(qrow0, krow0, lq, lk, causal);  // no mask test inside
    OCTET_UNROLL
    for (int n = 0; n < 8; ++n) OCTET_UNROLL
    for (int e = 0; e < 2; ++e) {
        const int col = attn_frag::c_col(lane, n, e);
        OCTET_UNROLL
        for (int r = 0; r < 2; ++r) {
            const int j = krow0 + 16 * warp + attn_frag::c_row(lane, 2 * r);
            const float x = attn::score(pp[n][2 * r + e], sQf[col], sk[r]);
            pp[n][2 * r + e] =
                whole || attn::visible(qrow0 + col, j, lq, lk, causal) ? attn::exp2(attn::sub(x, sLc[col])) : 0.0f;
            dp[n][2 * r + e] = attn::dprob(dp[n][2 * r + e], sDOs[col], sv[r]);
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
        v.a = i < lq ? attn::mul(p.lse[r], attn::log2e) : attn::pos_inf();
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
        const int j = kt * kTile + 16 * warp + attn_frag::c_row(lane, 2 * r);
        sk[r] = j < lk ? token_scale(p.k, static_cast<std::size_t>(k0 + j), hk, D) : 0.0f;
        sv[r] = j < lk ? token_scale(p.v, static_cast<std::size_t>(k0 + j), hk, D) : 0.0f;
    }
}

// ================================================================================================
// Backward: D
// ================================================================================================

/// With wgmma, 1024 bytes of slack align the tiles to their swizzle atoms, and 3 mbarriers follow.
template <int D, bool Wgmma>
constexpr int delta_smem_bytes() {
    // Q, dO, K x2, V x2; 3 row vectors, 4 x 64 reduction
    return kTile * D * 6 + (3 + 4 * 4) * kTile * 4 + (Wgmma ? 1024 + 3 * 8 : 0);
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
        const int ntiles = attn::key_tiles_for(qt, lq, lk, p.causal);

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
                sQf[tid - 64] = attn::query_factor(v.a, p.scale_log2);
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
                float v = attn::add(attn::mul(pp[n][e], dp[n][e]), attn::mul(pp[n][2 + e], dp[n][2 + e]));
                v = attn::add(v, shfl_xor(v, 4));
                v = attn::add(v, shfl_xor(v, 8));
                v = attn::add(v, shfl_xor(v, 16));
                dacc[n][e] = attn::add(dacc[n][e], v);
            }
        }
        ptx::cp_async_wait_group<0>();
        if (g == 0) OCTET_UNROLL
        for (int n = 0; n < 8; ++n) OCTET_UNROLL
        for (int e = 0; e < 2; ++e) sRed[warp * kTile + attn_frag::c_col(lane, n, e)] = dacc[n][e];
        __syncthreads();
        if (tid < 64 && qt * kTile + tid < lq) {
            const float s = attn::add(attn::add(attn::add(sRed[tid], sRed[kTile + tid]), sRed[2 * kTile + tid]),
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
            attn::mul(decode<typename DR::format>(dout.code(tok, static_cast<std::size_t>(h) * D + c)), sd);
        s = attn::add(
            s, attn::mul(dv, detail::attention_load(
                                 o[static_cast<std::size_t>(tok) * o_ld + static_cast<std::size_t>(h) * D + c])));
    }
    OCTET_UNROLL
    for (int off = 16; off > 0; off >>= 1) s = attn::add(s, shfl_xor(s, off));
    if (lane == 0) {
        out[static_cast<std::size_t>(h) * total_q + tok] = s;
        if (copy) copy[static_cast<std::size_t>(h) * total_q + tok] = s;
    }
}

// ================================================================================================
// Backward: gradients
// ================================================================================================

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
        const int j = kt * kTile + 16 * warp + attn_frag::c_row(lane, 2 * r);
        if (j >= lk) continue;
        GT* dkr = out.dk + static_cast<std::size_t>(k0 + j) * out.dk_ld + static_cast<std::size_t>(hk) * D;
        GT* dvr = out.dv + static_cast<std::size_t>(k0 + j) * out.dv_ld + static_cast<std::size_t>(hk) * D;
        OCTET_UNROLL
        for (int nd = 0; nd < D / 8; ++nd) OCTET_UNROLL
        for (int e = 0; e < 2; ++e) {
            dkr[attn_frag::c_col(lane, nd, e)] = detail::attention_store<GT>(attn::mul(dk[nd][2 * r + e], p.scale));
            dvr[attn_frag::c_col(lane, nd, e)] = detail::attention_store<GT>(dv[nd][2 * r + e]);
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
    float mdo = attn::fmax(sDOs[lane], sDOs[lane + 32]);
    OCTET_UNROLL
    for (int off = 16; off > 0; off >>= 1) mdo = attn::fmax(mdo, shfl_xor(mdo, off));

    float pp[8][4], ds[8][4];
    tile_p_dp<D, Wgmma, QF, KF, typename VR::format, DF>(sK, sV, sQ, sdO, sQf, sLc, sDOs, sk, sv, warp, lane,
                                                         qt * kTile, kt * kTile, lq, lk, p.causal, pp, ds);
    // dS in place of dP (telemetry first: it needs dP)
    OCTET_UNROLL
    for (int n = 0; n < 8; ++n) OCTET_UNROLL
    for (int e = 0; e < 2; ++e) {
        const int col = attn_frag::c_col(lane, n, e);
        const float dlt = sDelta[col];
        if constexpr (tele) {
            float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            OCTET_UNROLL
            for (int r = 0; r < 2; ++r) {
                const float pr = pp[n][2 * r + e], dpr = ds[n][2 * r + e];
                const float dsr = attn::dscore(pr, dpr, dlt);
                v[0] = attn::add(v[0], dsr);
                v[1] = attn::add(v[1], abs_float(dsr));
                v[2] = attn::add(v[2], attn::mul(pr, dpr));
                v[3] = attn::add(v[3], attn::mul(pr, abs_float(dpr)));
            }
            OCTET_UNROLL
            for (int k = 0; k < 4; ++k) {
                v[k] = attn::add(v[k], shfl_xor(v[k], 4));
                v[k] = attn::add(v[k], shfl_xor(v[k], 8));
                v[k] = attn::add(v[k], shfl_xor(v[k], 16));
                if (g == 0) sTele[(warp * 4 + k) * kTile + col] = v[k];
            }
        }
        OCTET_UNROLL
        for (int r = 0; r < 2; ++r) ds[n][2 * r + e] = attn::dscore(pp[n][2 * r + e], ds[n][2 * r + e], dlt);
    }
    // A fragments of P' (for dV, s_dO folded) and of dS s_q (for dK, one scale per key row)
    std::uint32_t pa[2][4], da[2][4];
    float dks[2], dki[2];
    {
        float amax[2] = {0.0f, 0.0f};
        OCTET_UNROLL
        for (int n = 0; n < 8; ++n) OCTET_UNROLL
        for (int e = 0; e < 2; ++e) {
            const float sq = sQs[attn_frag::c_col(lane, n, e)];
            OCTET_UNROLL
            for (int r = 0; r < 2; ++r) amax[r] = attn::fmax(amax[r], finite_abs(attn::mul(ds[n][2 * r + e], sq)));
        }
        OCTET_UNROLL
        for (int r = 0; r < 2; ++r) {
            amax[r] = attn::fmax(amax[r], shfl_xor(amax[r], 1));
            amax[r] = attn::fmax(amax[r], shfl_xor(amax[r], 2));
            dks[r] = attn::ds_scale(amax[r]);
            dki[r] = attn::ds_inverse(dks[r]);
        }
        OCTET_UNROLL
        for (int ks2 = 0; ks2 < 2; ++ks2) OCTET_UNROLL
        for (int reg = 0; reg < 4; ++reg) {
            std::uint32_t cp[4], cd[4];
            OCTET_UNROLL
            for (int b = 0; b < 4; ++b) {
                const attn_frag::n_x src = attn_frag::a_source(ks2, reg, b);
                const int col = attn_frag::c_col(lane, src.n, src.x);
                cp[b] = attn::encode_p(attn::mul(pp[src.n][src.x], attn::scale_ratio(sDOs[col], mdo)));
                cd[b] = attn::encode_ds(attn::mul(ds[src.n][src.x], sQs[col]), dki[src.x >> 1]);
            }
            pa[ks2][reg] = pack4(cp[0], cp[1], cp[2], cp[3]);
            da[ks2][reg] = pack4(cd[0], cd[1], cd[2], cd[3]);
        }
    }
    // dQ operand dS s_k: per-warp column amax
    OCTET_UNROLL
    for (int n = 0; n < 8; ++n) OCTET_UNROLL
    for (int e = 0; e < 2; ++e) {
        float a = attn::fmax(finite_abs(attn::mul(ds[n][e], sk[0])), finite_abs(attn::mul(ds[n][2 + e], sk[1])));
        a = attn::fmax(a, shfl_xor(a, 4));
        a = attn::fmax(a, shfl_xor(a, 8));
        a = attn::fmax(a, shfl_xor(a, 16));
        if (g == 0) sRed[warp * kTile + attn_frag::c_col(lane, n, e)] = a;
    }
    sync();  // S2: column amax and telemetry partials visible (and grad_kernel's transposes)

    if constexpr (tele) {
        for (int idx = thread; idx < 4 * kTile; idx += 128) {
            const int k = idx / kTile, col = idx % kTile, i = qt * kTile + col;
            if (i >= lq) continue;
            const float v = attn::add(attn::add(attn::add(sTele[k * kTile + col], sTele[(4 + k) * kTile + col]),
                                                sTele[(8 + k) * kTile + col]),
                                      sTele[(12 + k) * kTile + col]);
            atomicAdd(out.tele + k * out.rows + static_cast<std::size_t>(h) * p.total_q + q0 + i, v);
        }
    }
    // dS codes for dQ into sDS (queries as rows, keys permuted like K^T)
    OCTET_UNROLL
    for (int n = 0; n < 8; ++n) OCTET_UNROLL
    for (int e = 0; e < 2; ++e) {
        const int col = attn_frag::c_col(lane, n, e);
        const float a = attn::fmax(attn::fmax(attn::fmax(sRed[col], sRed[kTile + col]), sRed[2 * kTile + col]),
                                   sRed[3 * kTile + col]);
        const float inv = attn::ds_inverse(attn::ds_scale(a));
        OCTET_UNROLL
        for (int r = 0; r < 2; ++r)
            sDS[attn_frag::ds_offset(col, warp, attn_frag::c_row(lane, 2 * r))] =
                attn::encode_ds(attn::mul(ds[n][2 * r + e], sk[r]), inv);
    }
    // dV += P'^T dO and dK += (dS s_q)^T Q
    const float cdo = attn::mul(mdo, attn::p_scale);
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
            for (int x = 0; x < 4; ++x) dv[NC / 8 * c + n][x] = attn::fma(cdo, acc[4 * n + x], dv[NC / 8 * c + n][x]);
            wgmma_rs_k64<NC, QF>(acc, da, qt_addr + c * NC * 64);
            OCTET_UNROLL
            for (int n = 0; n < NC / 8; ++n) OCTET_UNROLL
            for (int x = 0; x < 4; ++x)
                dk[NC / 8 * c + n][x] = attn::fma(dks[x >> 1], acc[4 * n + x], dk[NC / 8 * c + n][x]);
        }
    } else {
        OCTET_UNROLL
        for (int nd = 0; nd < D / 8; ++nd) {
            float acc[4];
            mma_k64<DF>(acc, pa, sdOt, 8 * nd, lane);
            OCTET_UNROLL
            for (int x = 0; x < 4; ++x) dv[nd][x] = attn::fma(cdo, acc[x], dv[nd][x]);
            mma_k64<QF>(acc, da, sQt, 8 * nd, lane);
            OCTET_UNROLL
            for (int x = 0; x < 4; ++x) dk[nd][x] = attn::fma(dks[x >> 1], acc[x], dk[nd][x]);
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
            const int col = 16 * warp + attn_frag::c_row(lane, 2 * r);
            const float a = attn::fmax(attn::fmax(attn::fmax(sRed[col], sRed[kTile + col]), sRed[2 * kTile + col]),
                                       sRed[3 * kTile + col]);
            scq[r] = attn::mul(p.scale, attn::ds_scale(a));
            rowi[r] = qt * kTile + col;
        }
        float* dqh = out.dq_accum + static_cast<std::size_t>(h) * D;
        const std::size_t ldq = static_cast<std::size_t>(p.hq) * D;
        // acc: the (16 queries, 8 channels) block of channels 8 nd .. 8 nd + 7, mma.sync's layout
        auto add_dq = [&](int nd, const float* acc) {
            OCTET_UNROLL
            for (int r = 0; r < 2; ++r) {
                if (rowi[r] >= lq) continue;
                float* dst = dqh + static_cast<std::size_t>(q0 + rowi[r]) * ldq + attn_frag::c_col(lane, nd, 0);
                atomicAdd(dst, attn::mul(scq[r], acc[2 * r]));
                atomicAdd(dst + 1, attn::mul(scq[r], acc[2 * r + 1]));
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
    const int qt_first = attn::first_query_tile_for(kt, lq, lk, p.causal);
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
            sQf[tid - 64] = attn::query_factor(next.a, p.scale_log2);
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
    const int qt_first = attn::first_query_tile_for(2 * kb, lq, lk, p.causal);
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
                stage_rows(st, 3)[ptid - 64] = attn::query_factor(v.a, p.scale_log2);
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
    const int first = kt * kTile < lk ? attn::first_query_tile_for(kt, lq, lk, p.causal) : nqt;
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

template <class GT>
OCTET_KERNEL void dq_convert_kernel(const float* acc, GT* dq, std::size_t dq_ld, std::size_t rows, std::size_t cols) {
    const std::size_t n = rows * cols, stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        dq[(i / cols) * dq_ld + i % cols] = detail::attention_store<GT>(acc[i]);
}

/// attention_stats over the row arrays (rows whose L is finite), into a zeroed struct.
OCTET_KERNEL void __launch_bounds__(256)
    stats_kernel(const float* rows_base, std::size_t rows, const float* lse, bool have_o, attention_stats* st) {
    OCTET_SHARED(float[8][8], red);
    OCTET_SHARED(unsigned[8], cnt);
    const float* res = rows_base + row_residual * rows;
    const float* abs_ds = rows_base + row_abs_ds * rows;
    const float* pdp = rows_base + row_p_dp * rows;
    const float* pabs = rows_base + row_p_abs_dp * rows;
    const float* dout = rows_base + row_delta_from_output * rows;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    unsigned count = 0;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t r = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += stride) {
        if (!(lse[r] < attn::pos_inf())) continue;
        float tm[8];
        detail::row_stats_terms(res[r], abs_ds[r], have_o ? attn::sub(dout[r], pdp[r]) : 0.0f, pabs[r], tm);
        for (int k = 0; k < 4; ++k) acc[k] = fmaxf(acc[k], tm[k]);
        for (int k = 4; k < 8; ++k) acc[k] += tm[k];
        ++count;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int off = 16; off > 0; off >>= 1) {
        for (int k = 0; k < 4; ++k) acc[k] = fmaxf(acc[k], shfl_xor(acc[k], off));
        for (int k = 4; k < 8; ++k) acc[k] += shfl_xor(acc[k], off);
        count += __shfl_xor_sync(0xFFFFFFFFu, count, off);
    }
    if (lane == 0) {
        for (int k = 0; k < 8; ++k) red[warp][k] = acc[k];
        cnt[warp] = count;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
            for (int k = 0; k < 4; ++k) acc[k] = fmaxf(acc[k], red[w][k]);
            for (int k = 4; k < 8; ++k) acc[k] += red[w][k];
            count += cnt[w];
        }
        if (count == 0) return;
        atomicAdd(&st->rows, count);
        // non-negative floats order like their bit patterns
        atomicMax(reinterpret_cast<int*>(&st->residual_max), __float_as_int(acc[0]));
        atomicMax(reinterpret_cast<int*>(&st->residual_rel_max), __float_as_int(acc[1]));
        atomicMax(reinterpret_cast<int*>(&st->gap_max), __float_as_int(acc[2]));
        atomicMax(reinterpret_cast<int*>(&st->gap_rel_max), __float_as_int(acc[3]));
        atomicAdd(&st->residual_sumsq, acc[4]);
        atomicAdd(&st->abs_ds_sumsq, acc[5]);
        atomicAdd(&st->gap_sumsq, acc[6]);
        atomicAdd(&st->p_abs_dp_sumsq, acc[7]);
    }
}

// ================================================================================================
// Launch helpers
// ================================================================================================

/// Its sm_90a image carries the probe marker (cuda/launch.cuh): never launched.
OCTET_KERNEL void sm90a_probe_kernel() {
#if OCTET_ARCH_SM90A
    OCTET_PROBE_MARKER();
#endif
}

/// Whether the stream forward or backward runs its wgmma kernels: `requested` as asked, on this
/// device and binary (no allocation, launch or synchronization). Asking for wgmma where it cannot
/// run is an error.
inline bool uses_wgmma(attention_kernel requested, const char* fn) {
    if (requested == attention_kernel::mma_sync) return false;
    static std::atomic<int> cache[64] = {};
    const bool available = cuda::compute_capability() == 90 && cuda::image_has_marker(sm90a_probe_kernel, cache);
    OCTET_REQUIRE(available || requested == attention_kernel::automatic, fn, "options.kernel",
                  detail::message("is wgmma, which needs an sm_90 GPU (this one is sm_", cuda::compute_capability(),
                                  ") and a binary built for sm_90a; use automatic or mma_sync"));
    return available;
}

inline void require_fp8_device(const char* fn) {
    int dev = 0, major = 0, minor = 0;
    OCTET_CUDA_CHECK(cudaGetDevice(&dev));
    OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    OCTET_REQUIRE(
        major * 10 + minor >= 89, fn, "executor",
        detail::message("runs on a device of compute capability ", major, ".", minor,
                        "; FP8 attention needs FP8 tensor cores (sm_89 or newer); use the on_host() overload"));
}

template <class Kernel>
void set_smem(Kernel kernel, int bytes) {
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <class R, class B>
void check_device_operand(const quantized_ref<R, B>& x, const char* fn, const char* arg) {
    if (x.layout.rows == 0) return;
    cuda::require_device_accessible(x.data, fn, arg);
    cuda::require_device_accessible(x.scales, fn, arg);
    OCTET_REQUIRE(reinterpret_cast<std::uintptr_t>(x.data) % 16 == 0 && x.layout.row_bytes % 16 == 0, fn, arg,
                  detail::message("must have 16-byte aligned data and rows (row_bytes ", x.layout.row_bytes,
                                  "); use the padded layout of quant_layout_of<Recipe>::make"));
}

/// The TMA map the wgmma kernels (forward_wgmma_kernel, delta_matched_kernel, grad_wgmma_kernel) load
/// x's tiles with: x's codes as a byte matrix, boxes of 64 rows x D bytes swizzled as swz<D> (128-byte
/// rows: the 128-byte swizzle, 64-byte rows: the 64-byte one). An operand with no rows gets an empty map (never read:
/// no tile has rows).
template <int D, class R, class B>
CUtensorMap tile_map(const quantized_ref<R, B>& x, const char* fn) {
    if (x.layout.rows == 0) return CUtensorMap{};
    return cuda::byte_matrix_map(reinterpret_cast<const std::uint8_t*>(x.data), x.layout.rows, x.layout.cols,
                                 x.layout.row_bytes, D, kTile,
                                 D == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B, fn);
}

inline void check_device_shape(const attention_shape& s, const char* fn) {
    OCTET_REQUIRE(s.head_dim == 64 || s.head_dim == 128, fn, "shape.head_dim",
                  detail::message("is ", s.head_dim,
                                  "; the CUDA kernels support head dims 64 and 128 (the host path takes any)"));
    OCTET_REQUIRE(s.device_cu_seqlens_q != nullptr, fn, "shape.device_cu_seqlens_q",
                  "is null; the stream overloads need device copies of the sequence offsets");
    cuda::require_device_accessible(s.device_cu_seqlens_q, fn, "shape.device_cu_seqlens_q");
    if (s.device_cu_seqlens_k) cuda::require_device_accessible(s.device_cu_seqlens_k, fn, "shape.device_cu_seqlens_k");
    OCTET_REQUIRE(
        s.device_cu_seqlens_k != nullptr || s.cu_seqlens_k.empty() || s.cu_seqlens_k.data() == s.cu_seqlens_q.data(),
        fn, "shape.device_cu_seqlens_k", "is null but cu_seqlens_k differs from cu_seqlens_q; pass its device copy");
}

}  // namespace attn_kernel

// =================================================================================================
// The stream backend
// =================================================================================================

namespace detail {

/// The forward on a stream (the entry, octet::attention_forward, checked the shared arguments into
/// `dims`): the device's own checks, then the forward kernel enqueued on ex.stream.
template <class QR, class QB, class KR, class KB, class VR, class VB, class OT>
void stream_attention_forward(const stream_executor& ex, const attention_dims& dims, const attention_shape& shape,
                              const quantized_ref<QR, QB>& q, const quantized_ref<KR, KB>& k,
                              const quantized_ref<VR, VB>& v, matrix_ref<OT> o, span<float> lse,
                              const attention_options& opt) {
    constexpr const char* fn = "octet::attention_forward";
    attn_kernel::check_device_shape(shape, fn);
    const int Hq = dims.heads_q, Hk = dims.heads_kv, d = dims.head_dim, Tq = dims.total_q;
    const int max_q = shape.max_seqlen_q();
    if (max_q == 0) return;
    attn_kernel::require_fp8_device(fn);
    attn_kernel::check_device_operand(q, fn, "q");
    attn_kernel::check_device_operand(k, fn, "k");
    attn_kernel::check_device_operand(v, fn, "v");
    cuda::require_device_accessible(o.data, fn, "o");
    cuda::require_device_accessible(lse.data(), fn, "lse");

    attn_kernel::fwd_params<QR, KR, VR, OT> p{
        q,
        k,
        v,
        o.data,
        o.ld,
        lse.data(),
        shape.device_cu_seqlens_q,
        shape.device_cu_seqlens_k ? shape.device_cu_seqlens_k : shape.device_cu_seqlens_q,
        Hq,
        Hq / Hk,
        Tq,
        attn::mul(dims.scale, attn::log2e),
        opt.mask == attention_mask::causal,
        opt.key_order};
    const dim3 grid((max_q + attn_kernel::kTile - 1) / attn_kernel::kTile, Hq, shape.batch());
    auto launch = [&](auto dim) {
        constexpr int D = decltype(dim)::value;
        auto kernel = attn_kernel::forward_kernel<D, QR, KR, VR, OT>;
        constexpr int smem = attn_kernel::fwd_smem_bytes<D>();
        attn_kernel::set_smem(kernel, smem);
        cuda::launch("attn_kernel::forward_kernel", kernel, grid, attn_kernel::kThreads, smem, ex.stream, p);
        OCTET_CUDA_CHECK_LAUNCH();
    };
    auto launch_wgmma = [&](auto dim) {
        constexpr int D = decltype(dim)::value;
        auto kernel = attn_kernel::forward_wgmma_kernel<D, QR, KR, VR, OT>;
        constexpr int smem = attn_kernel::fwd_wgmma_smem_bytes<D>();
        attn_kernel::set_smem(kernel, smem);
        cuda::require_register_split(
            kernel, attn_kernel::kWarpSpecializedThreads,
            (attn_kernel::kForwardProducerRegs + attn_kernel::kConsumerGroups * attn_kernel::kForwardConsumerRegs) *
                128,
            fn, "options.kernel", "use attention_kernel::mma_sync");
        const CUtensorMap mq = attn_kernel::tile_map<D>(q, fn), mk = attn_kernel::tile_map<D>(k, fn),
                          mv = attn_kernel::tile_map<D>(v, fn);
        const dim3 blocks((max_q + attn_kernel::kBlockRows - 1) / attn_kernel::kBlockRows, Hq, shape.batch());
        cuda::launch("attn_kernel::forward_wgmma_kernel", kernel, blocks, attn_kernel::kWarpSpecializedThreads, smem,
                     ex.stream, mq, mk, mv, p);
        OCTET_CUDA_CHECK_LAUNCH();
    };
    const bool wgmma = attn_kernel::uses_wgmma(opt.kernel, fn);
    if (d == 64 && wgmma)
        launch_wgmma(std::integral_constant<int, 64>{});
    else if (d == 64)
        launch(std::integral_constant<int, 64>{});
    else if (wgmma)
        launch_wgmma(std::integral_constant<int, 128>{});
    else
        launch(std::integral_constant<int, 128>{});
}

/// The backward on a stream (the entry, octet::attention_backward, checked the shared arguments
/// into `dims`): the workspace and the device's own checks, then memsets of device_stats and the
/// workspace and the delta, gradient, dQ conversion and stats kernels enqueued on ex.stream.
template <class QR, class QB, class KR, class KB, class VR, class VB, class OT, class DR, class DB, class GT>
void stream_attention_backward(const stream_executor& ex, const attention_dims& dims, const attention_shape& shape,
                               const quantized_ref<QR, QB>& q, const quantized_ref<KR, KB>& k,
                               const quantized_ref<VR, VB>& v, matrix_ref<OT> o, span<const float> lse,
                               const quantized_ref<DR, DB>& dout, matrix_ref<GT> dq, matrix_ref<GT> dk,
                               matrix_ref<GT> dv, const attention_backward_options& opt, span<float> workspace,
                               attention_stats* device_stats) {
    using O = std::remove_const_t<OT>;
    constexpr const char* fn = "octet::attention_backward";
    attn_kernel::check_device_shape(shape, fn);
    const int Hq = dims.heads_q, Hk = dims.heads_kv, d = dims.head_dim, Tq = dims.total_q, Tk = dims.total_k;
    const bool have_o = !o.empty();
    const attention_backward_workspace ws = attention_backward_workspace_for(shape);
    OCTET_REQUIRE(workspace.size() >= ws.floats, fn, "workspace",
                  detail::message("has ", workspace.size(),
                                  " floats but needs attention_backward_workspace_for(shape).floats = ", ws.floats));
    const float scale = dims.scale;
    const bool tele = opt.telemetry;
    if (device_stats) {
        cuda::require_device_accessible(device_stats, fn, "device_stats");
        OCTET_CUDA_CHECK(cudaMemsetAsync(device_stats, 0, sizeof(attention_stats), ex.stream));
    }
    if (Tq == 0 && Tk == 0) return;
    attn_kernel::require_fp8_device(fn);
    attn_kernel::check_device_operand(q, fn, "q");
    attn_kernel::check_device_operand(k, fn, "k");
    attn_kernel::check_device_operand(v, fn, "v");
    attn_kernel::check_device_operand(dout, fn, "dout");
    cuda::require_device_accessible(workspace.data(), fn, "workspace");
    if (Tq > 0) cuda::require_device_accessible(lse.data(), fn, "lse");
    const bool wgmma = attn_kernel::uses_wgmma(opt.kernel, fn);

    float* wsp = workspace.data();
    float* delta = wsp + ws.row_array(row_delta);
    float* delta_out = wsp + ws.row_array(row_delta_from_output);
    float* acc = wsp + ws.dq_accum;
    const std::size_t dq_floats = static_cast<std::size_t>(Tq) * Hq * d;
    OCTET_CUDA_CHECK(cudaMemsetAsync(wsp, 0, (ws.dq_accum + dq_floats) * sizeof(float), ex.stream));

    attn_kernel::bwd_inputs<QR, KR, VR, DR> in{
        q,
        k,
        v,
        dout,
        lse.data(),
        shape.device_cu_seqlens_q,
        shape.device_cu_seqlens_k ? shape.device_cu_seqlens_k : shape.device_cu_seqlens_q,
        Hq,
        Hq / Hk,
        Tq,
        scale,
        attn::mul(scale, attn::log2e),
        opt.mask == attention_mask::causal};
    attn_kernel::bwd_outputs<GT> out{
        delta, acc, dk.data, dv.data, dk.ld, dv.ld, tele ? wsp + ws.row_array(row_residual) : nullptr, ws.rows};
    const int max_q = shape.max_seqlen_q(), max_k = shape.max_seqlen_k();
    // the matched delta kernel and the gradient kernel form P and dP with the same products
    auto launch = [&](auto dim, auto wgmma) {
        constexpr int D = decltype(dim)::value;
        constexpr bool W = decltype(wgmma)::value;
        using namespace attn_kernel;
        // D: rowsum(dO * O) when it is the delta, or for the telemetry's gap; sum_j P dP when matched
        if (have_o && Tq > 0 && (opt.delta == delta_mode::from_output || tele)) {
            const int rows = Tq * Hq, per_block = kThreads / 32;
            cuda::launch("attn_kernel::delta_output_kernel", delta_output_kernel<D, DR, O>,
                         (rows + per_block - 1) / per_block, kThreads, 0, ex.stream, dout, o.data, o.ld, Hq, Tq,
                         delta_out, opt.delta == delta_mode::from_output ? delta : nullptr);
            OCTET_CUDA_CHECK_LAUNCH();
        }
        bwd_maps maps{};
        if constexpr (W) maps = {tile_map<D>(q, fn), tile_map<D>(k, fn), tile_map<D>(v, fn), tile_map<D>(dout, fn)};
        if (opt.delta == delta_mode::matched && max_q > 0) {
            auto kernel = delta_matched_kernel<D, W, QR, KR, VR, DR>;
            constexpr int smem = delta_smem_bytes<D, W>();
            set_smem(kernel, smem);
            cuda::launch("attn_kernel::delta_matched_kernel", kernel,
                         dim3((max_q + kTile - 1) / kTile, Hq, shape.batch()), kThreads, smem, ex.stream, maps, in,
                         delta);
            OCTET_CUDA_CHECK_LAUNCH();
        }
        if (max_k > 0 && W) {
            auto kernel =
                tele ? grad_wgmma_kernel<D, true, QR, KR, VR, DR, GT> : grad_wgmma_kernel<D, false, QR, KR, VR, DR, GT>;
            constexpr int smem = grad_wgmma_smem_bytes<D>();
            set_smem(kernel, smem);
            cuda::launch("attn_kernel::grad_wgmma_kernel", kernel,
                         dim3((max_k + kBlockRows - 1) / kBlockRows, Hk, shape.batch()), kWarpSpecializedThreads, smem,
                         ex.stream, maps, in, out);
            OCTET_CUDA_CHECK_LAUNCH();
        } else if (max_k > 0) {
            auto kernel = tele ? grad_kernel<D, true, QR, KR, VR, DR, GT> : grad_kernel<D, false, QR, KR, VR, DR, GT>;
            constexpr int smem = grad_smem_bytes<D>();
            set_smem(kernel, smem);
            cuda::launch("attn_kernel::grad_kernel", kernel, dim3((max_k + kTile - 1) / kTile, Hk, shape.batch()),
                         kThreads, smem, ex.stream, in, out);
            OCTET_CUDA_CHECK_LAUNCH();
        }
        if (dq_floats > 0) {
            cuda::launch("attn_kernel::dq_convert_kernel", dq_convert_kernel<GT>,
                         cuda::grid_stride_blocks(dq_floats, 256), 256, 0, ex.stream, acc, dq.data, dq.ld, Tq,
                         static_cast<std::size_t>(Hq) * d);
            OCTET_CUDA_CHECK_LAUNCH();
        }
        if (tele && device_stats && ws.rows > 0) {
            cuda::launch("attn_kernel::stats_kernel", stats_kernel, cuda::grid_stride_blocks(ws.rows, 256, 2), 256, 0,
                         ex.stream, wsp, ws.rows, lse.data(), have_o, device_stats);
            OCTET_CUDA_CHECK_LAUNCH();
        }
    };
    if (d == 64 && wgmma)
        launch(std::integral_constant<int, 64>{}, std::true_type{});
    else if (d == 64)
        launch(std::integral_constant<int, 64>{}, std::false_type{});
    else if (wgmma)
        launch(std::integral_constant<int, 128>{}, std::true_type{});
    else
        launch(std::integral_constant<int, 128>{}, std::false_type{});
}

/// octet::attention_forward / attention_backward on a stream (the entries are in attention.hpp).
template <>
struct attention_backend<stream_executor> {
    /// options.fold_dq_residual is host-only: refused before any other argument is read.
    static void require_supported(const attention_backward_options& opt) {
        OCTET_REQUIRE(!opt.fold_dq_residual, "octet::attention_backward", "options.fold_dq_residual",
                      "is set, but folding the dQ residual is host-only (octet::on_host()); the stream overload does "
                      "not implement it: clear it, or run the backward on the host");
    }

    template <class... Args>
    static void forward(const stream_executor& ex, const Args&... args) {
        stream_attention_forward(ex, args...);
    }

    /// extra: the workspace and device_stats of the stream form of octet::attention_backward.
    template <class... Args>
    static void backward(const stream_executor& ex, const Args&... args) {
        stream_attention_backward(ex, args...);
    }
};

}  // namespace detail

/// The backward on a CUDA stream: the host form's arguments (attention.hpp; device memory, see the
/// header comment) plus `workspace`, at least attention_backward_workspace_for(shape).floats floats
/// of device memory, and `device_stats` (device memory for one attention_stats, or null), which
/// replace the host's returned summary and `rows`. Goes through the same entry as the host form
/// (attention_backward_entry: the shared checks once), then enqueues on ex.stream memsets of
/// device_stats and the workspace and the delta, gradient, dQ conversion and (with telemetry and
/// device_stats) stats kernels. Allocates nothing and never synchronizes.
template <class QR, class QB, class KR, class KB, class VR, class VB, class OT, class DR, class DB, class GT>
void attention_backward(const stream_executor& ex, const attention_shape& shape, const quantized_ref<QR, QB>& q,
                        const quantized_ref<KR, KB>& k, const quantized_ref<VR, VB>& v, matrix_ref<OT> o,
                        span<const float> lse, const quantized_ref<DR, DB>& dout, matrix_ref<GT> dq, matrix_ref<GT> dk,
                        matrix_ref<GT> dv, span<float> workspace, const attention_backward_options& opt = {},
                        attention_stats* device_stats = nullptr) {
    detail::attention_backward_entry(ex, shape, q, k, v, o, lse, dout, dq, dk, dv, opt, workspace, device_stats);
}

}  // namespace octet
