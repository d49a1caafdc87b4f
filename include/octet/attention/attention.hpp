// octet/attention/attention.hpp: FP8 attention, forward and backward, with a choice of how the
// backward's row term D is formed (delta matching) and row-sum telemetry. The entries (one per
// operation, for every executor); the host backend is in detail/attention.hpp, the stream backend
// in attention.cuh (and its detail/ files).
//
//   octet::attention_shape shape{cu_q, cu_k, heads_q, heads_kv, head_dim};
//   octet::attention_forward(octet::on_host(), shape, q, k, v, o, lse, {octet::attention_mask::causal});
//   octet::attention_backward_options bo;  bo.mask = octet::attention_mask::causal;
//   bo.delta = octet::delta_mode::matched;  bo.telemetry = true;  bo.fold_dq_residual = true;  // host only
//   octet::attention_stats st = octet::attention_backward(octet::on_host(), shape, q, k, v, o, lse, dout, dq, dk, dv,
//   bo);
//
// Layout (FlashAttention's varlen convention): a batch of sequences packed along tokens. Q, dO, O,
// dQ are [total_q, heads_q * head_dim] matrices (token t, head h, channel c at column h * head_dim + c),
// K, V, dK, dV are [total_k, heads_kv * head_dim]; sequence b owns query tokens
// [cu_q[b], cu_q[b+1]) and key tokens [cu_k[b], cu_k[b+1]). Query head h reads key/value head
// h / (heads_q / heads_kv) (grouped-query attention; heads_kv must divide heads_q). lse (the
// log-sum-exp L, natural log, of the scaled scores) is [heads_q][total_q].
//
// Operands: Q, K, V and dO are FP8 (E4M3 or E5M2) copies made by octet::quantize with any recipe
// whose scale blocks do not split a head: the block width must be a multiple of head_dim (block<1, D>
// gives one scale per token and head, block<R, D> per R tokens and head, block<full, D> per head,
// per_row / per_tensor span all heads). Scale storage may be f32, ue8m0 or e4m3 (two-level).
// Outputs O, dQ, dK, dV are float or octet::bf16; L is float.
//
// What is quantized where, and the rules (P's fixed 2^-8 scale, dS's dynamic scales, the two delta
// modes), is written once in octet/attention/rules.hpp. This host path quantizes at exactly the
// same points as the CUDA kernels (attention.cuh), walking the same 64 x 64 tiles, so the two agree
// up to the order of float summation inside the products.
//
// Host memory: every temporary of a host call (decoded operands, accumulators, per-thread tiles)
// comes from one block, taken from the executor's allocator when one is lent (octet::with_allocator)
// and else from ::operator new; attention_forward_scratch_bytes / attention_backward_scratch_bytes
// give its size. It grows with the thread count and the longest sequence, not with the batch: a
// thread decodes the operands of the one sequence and head it works on, and the backward writes a
// sequence's gradients out as they complete (only the backward's telemetry keeps a float per query
// token and head of the batch). Only the backward's attention_row_telemetry, when asked for,
// allocates besides.
//
// Edge cases: a sequence may be empty; a query row that sees no key (an empty key sequence, or a
// causal mask with Lk < Lq) gets O = 0, L = +Inf and dQ = 0. Non-finite inputs are data: a NaN code
// in a row of Q or K makes that row's scores NaN, and NaN propagates to what it touches.
// Bad arguments (shapes that disagree, heads_kv not dividing heads_q, sequence offsets out of
// order, scale grids too small for their data, scale blocks splitting a head) throw octet::error.
//
// This header holds the types, the options and the entries; their implementation (the argument
// checks every executor shares, the host backend and its scratch layouts) is in
// octet/attention/detail/attention.hpp, which it includes at its end.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "octet/attention/rules.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/matrix.hpp"
#include "octet/core/span.hpp"
#include "octet/quant/tensor.hpp"

namespace octet {

/// Sizes and sequence offsets of one attention call.
struct attention_shape {
    span<const std::int32_t> cu_seqlens_q;  ///< host: batch + 1 offsets, 0 first, non-decreasing, last = total_q
    span<const std::int32_t> cu_seqlens_k;  ///< host: same for keys; empty means "same as cu_seqlens_q"
    int heads_q = 0;
    int heads_kv = 0;
    int head_dim = 0;
    /// Stream overloads only: device copies of the offsets (the same values as the host spans,
    /// which are used for checking and launch sizes). k null: the q array.
    const std::int32_t* device_cu_seqlens_q = nullptr;
    const std::int32_t* device_cu_seqlens_k = nullptr;

    span<const std::int32_t> keys() const { return cu_seqlens_k.empty() ? cu_seqlens_q : cu_seqlens_k; }
    int batch() const { return cu_seqlens_q.size() > 0 ? static_cast<int>(cu_seqlens_q.size()) - 1 : 0; }
    int total_q() const { return cu_seqlens_q.empty() ? 0 : cu_seqlens_q[cu_seqlens_q.size() - 1]; }
    int total_k() const { return keys().empty() ? 0 : keys()[keys().size() - 1]; }
    int max_seqlen_q() const {
        int m = 0;
        for (int b = 0; b < batch(); ++b) m = std::max(m, cu_seqlens_q[b + 1] - cu_seqlens_q[b]);
        return m;
    }
    int max_seqlen_k() const {
        int m = 0;
        const auto k = keys();
        for (int b = 0; b < batch(); ++b) m = std::max(m, k[b + 1] - k[b]);
        return m;
    }
};

/// Which kernels a stream forward or backward runs (the host path has one). automatic: wgmma on
/// an sm_90 GPU whose binary holds sm_90a code, else mma_sync. In the backward it chooses the
/// products that form P and dP (S^T = K Q^T and dP^T = V dO^T), in the matched delta kernel and
/// the gradient kernel alike, so that the two still form the same bits, and the gradient kernel's
/// dQ product; dV and dK are mma.sync in both.
enum class attention_kernel {
    automatic,
    mma_sync,  ///< FP8 mma.sync, sm_89+ (on Hopper it runs as FP16 HMMA with conversions)
    wgmma,     ///< FP8 wgmma (QGMMA), sm_90 with a binary built for sm_90a
};

struct attention_options {
    attention_mask mask = attention_mask::full;
    float softmax_scale = 0.0f;  ///< 0: 1 / sqrt(head_dim)
    /// The order of the forward's key tiles (rules.hpp, key_tile_order); the backward recomputes P
    /// from L and has no such choice. Back to front by default: on inputs with an attention sink it
    /// rounds 8-60x fewer P to zero and leaves the part of O the other keys carry with 1.2-2.9x
    /// less error (per-head V); without a sink the orders measure alike (bench/RESULTS.md, "Key
    /// tile order and P underflow").
    key_tile_order key_order = key_tile_order::back_to_front;
    attention_kernel kernel = attention_kernel::automatic;  ///< stream forward only
};

/// How the forward's P codes fared, over the (query, key) pairs of the P V product whose P (taken
/// against the running maximum, times the V scale ratio: the value that is encoded) is above 0 in
/// float. Host path only: pass one to the host overload of attention_forward.
struct attention_p_census {
    std::uint64_t pairs = 0;      ///< visible pairs with P > 0 before rounding
    std::uint64_t flushed = 0;    ///< of those, E4M3 code 0: the key adds nothing to O
    std::uint64_t subnormal = 0;  ///< of those, a subnormal code (P * 256 below 2^-6): under 3 mantissa bits
    double flushed_share() const { return pairs ? static_cast<double>(flushed) / static_cast<double>(pairs) : 0.0; }
    double subnormal_share() const { return pairs ? static_cast<double>(subnormal) / static_cast<double>(pairs) : 0.0; }
};

struct attention_backward_options {
    attention_mask mask = attention_mask::full;
    float softmax_scale = 0.0f;  ///< 0: 1 / sqrt(head_dim); must be the forward's
    delta_mode delta = delta_mode::matched;
    /// Per-row residuals and the stale-delta gap (see attention_stats). Cheap: four more row
    /// sums per tile of the backward and one atomic per row and tile on the device.
    bool telemetry = false;
    /// Host path only (the CUDA path does not read it): fold the row residual of dS as the dQ
    /// product used it back into dQ, dQ_i -= scale * rq_i * Kbar_i with rq_i = sum_j dSq_ij and
    /// Kbar_i = sum_j P_ij K_j (attention_stats), so that dQ is formed from dSq_ij - rq_i P_ij, whose
    /// rows sum to zero up to float rounding: E4M3 rounding of dS (and, with from_output, the stale
    /// delta) then leaves nothing along Kbar_i. dK and dV are unchanged (with from_output dK keeps
    /// the stale delta). Costs one more head_dim-long product per (query, key) pair, not vectorized
    /// by instruction set like the others: +23-45% backward time at 2048 tokens (of 0.10-0.13 s;
    /// it was +2.4-3.7% of the element-wise path's 0.49-0.83 s); dQ's error along Kbar drops
    /// 2.6-4.8x with matched, 4.5-48x with from_output (bench/RESULTS.md, attention_delta_study).
    bool fold_dq_residual = false;
    attention_kernel kernel = attention_kernel::automatic;  ///< stream backward only
};

/// Summary of the backward's row telemetry over the query rows (all heads) that see a key.
///   residual r_i = sum_j dS_ij, with dS in float as formed, before its FP8 rounding for dQ/dK.
///     Zero in exact arithmetic; at float-rounding level with delta_mode::matched; with
///     from_output under FP8 it carries the stale delta. Its scale is a_i = sum_j |dS_ij|:
///     residual_rel() = ||r|| / ||a|| over rows (robust), residual_rel_max = max_i |r_i| / a_i
///     (noisy: a row with near one-hot attention has a_i itself at rounding level).
///   gap g_i = rowsum(dO_i * O_i) - sum_j P_ij dP_ij: how far the stored O is from the P V the
///     backward sees, projected on dO (needs O; 0 when O was not given). Its scale is
///     b_i = sum_j P_ij |dP_ij|: gap_rel() = ||g|| / ||b||. With from_output, r_i = -g_i up to rounding.
///   Host path only (the device path leaves them 0): the row sums of dS as the products use it,
///   dequantized from its E4M3 codes and scales. For dQ, rq_i = sum_j dSq_ij with
///   dSq_ij = S_row * decode(code_ij) / s_k(j) (so dQ_i = scale * sum_j dSq_ij K_j exactly as formed);
///   for dK, rk_i = sum_j S_col * decode(code'_ij) / s_q(i). Even with matched they are not at float
///   level: each code carries E4M3 rounding (relative RMS u = 2^-4 / sqrt(8 ln 2) = 0.0265 for
///   mantissas spread over binades), so rq_i is about u sqrt(sum_j dS_ij^2) (measured 0.91-1.05x
///   that, tests/host/attention_delta.cpp). scale * rq_i * Kbar_i (Kbar_i = sum_j P_ij K_j) is what
///   it adds to dQ_i; scale * sum_i rk_i Q_i is what it adds to sum_j dK_j (zero in exact
///   arithmetic). residual_dq_rel() = ||rq|| / ||a||, residual_dk_rel() = ||rk|| / ||a||.
struct attention_stats {
    unsigned rows = 0;
    float residual_max = 0.0f, residual_rel_max = 0.0f, gap_max = 0.0f, gap_rel_max = 0.0f;
    float residual_sumsq = 0.0f, abs_ds_sumsq = 0.0f, gap_sumsq = 0.0f, p_abs_dp_sumsq = 0.0f;
    float residual_dq_max = 0.0f, residual_dq_sumsq = 0.0f, residual_dk_max = 0.0f, residual_dk_sumsq = 0.0f;

    OCTET_HD double residual_rms() const { return rows ? std::sqrt(static_cast<double>(residual_sumsq) / rows) : 0.0; }
    OCTET_HD double gap_rms() const { return rows ? std::sqrt(static_cast<double>(gap_sumsq) / rows) : 0.0; }
    OCTET_HD double residual_rel() const {
        return abs_ds_sumsq > 0 ? std::sqrt(static_cast<double>(residual_sumsq) / abs_ds_sumsq) : 0.0;
    }
    OCTET_HD double gap_rel() const {
        return p_abs_dp_sumsq > 0 ? std::sqrt(static_cast<double>(gap_sumsq) / p_abs_dp_sumsq) : 0.0;
    }
    OCTET_HD double residual_dq_rel() const {
        return abs_ds_sumsq > 0 ? std::sqrt(static_cast<double>(residual_dq_sumsq) / abs_ds_sumsq) : 0.0;
    }
    OCTET_HD double residual_dk_rel() const {
        return abs_ds_sumsq > 0 ? std::sqrt(static_cast<double>(residual_dk_sumsq) / abs_ds_sumsq) : 0.0;
    }
};

/// Per-row telemetry arrays, each [heads_q][total_q] (the device keeps the same six arrays in its
/// workspace, in this order; see attention_backward_workspace).
enum attention_row_array : int {
    row_delta = 0,
    row_delta_from_output,
    row_residual,
    row_abs_ds,
    row_p_dp,
    row_p_abs_dp,
    row_array_count
};

/// The backward's per-row arrays, each [heads_q][total_q], for the caller that asks for them
/// (attention_backward's `rows`; the device path keeps them in its workspace instead). Host path:
/// filled only when the caller passes one, and then the only memory the host backward allocates
/// outside its scratch block (with std::vector's allocator, not the executor's; by assign, so a
/// struct reused from an earlier call of the same sizes allocates nothing). Without `rows` the
/// backward allocates nothing beyond attention_backward_scratch_bytes. Without options.telemetry
/// only delta and delta_from_output are written (the others are left as they were).
struct attention_row_telemetry {
    std::vector<float> delta;              ///< D_i the backward used
    std::vector<float> delta_from_output;  ///< rowsum(dO_i * O_i) (0 without O)
    std::vector<float> residual;           ///< sum_j dS_ij
    std::vector<float> abs_ds;             ///< sum_j |dS_ij|
    std::vector<float> p_dp;               ///< sum_j P_ij dP_ij
    std::vector<float> p_abs_dp;           ///< sum_j P_ij |dP_ij|
    std::vector<float> residual_dq;        ///< sum_j dSq_ij as the dQ product used it (host path only)
    std::vector<float> residual_dk;        ///< sum_j of dS as the dK product used it (host path only)
};

/// Float offsets into the device backward's workspace: six [heads_q][total_q] row arrays (in
/// attention_row_array order), then the float dQ accumulator [total_q][heads_q * head_dim].
struct attention_backward_workspace {
    std::size_t rows = 0;      ///< heads_q * total_q
    std::size_t dq_accum = 0;  ///< offset of the dQ accumulator
    std::size_t floats = 0;    ///< total size
    std::size_t row_array(int which) const { return static_cast<std::size_t>(which) * rows; }
};
inline attention_backward_workspace attention_backward_workspace_for(const attention_shape& s) {
    attention_backward_workspace w;
    w.rows = static_cast<std::size_t>(std::max(s.heads_q, 0)) * static_cast<std::size_t>(std::max(s.total_q(), 0));
    w.dq_accum = row_array_count * w.rows;
    w.floats = w.dq_accum +
               static_cast<std::size_t>(std::max(s.total_q(), 0)) * std::max(s.heads_q, 0) * std::max(s.head_dim, 0);
    return w;
}

// ---- the entries ----------------------------------------------------------------------------------

/// O = softmax(scale * Q K^T) V with FP8 Q, K, V and P, and the log-sum-exp L, on the executor: the
/// host (host memory; any head_dim) or a CUDA stream (octet/attention/attention.cuh: device memory
/// and shape.device_cu_seqlens_q/_k, head dims 64 and 128, sm_89+; enqueues the forward kernel on
/// ex.stream, allocates nothing and never synchronizes). The arguments every executor shares are
/// checked here, once, before the executor's backend runs. On the host every temporary (per thread:
/// the decoded K and V of a sequence and head, a tile of Q, the tiles it works in) comes from one
/// block of attention_forward_scratch_bytes(ex, shape) bytes, taken from ex's allocator
/// (octet::with_allocator) or else ::operator new.
template <class QR, class QB, class KR, class KB, class VR, class VB, class OT, class Executor>
void attention_forward(const Executor& ex, const attention_shape& shape, const quantized_ref<QR, QB>& q,
                       const quantized_ref<KR, KB>& k, const quantized_ref<VR, VB>& v, matrix_ref<OT> o,
                       span<float> lse, const attention_options& opt = {});

/// attention_forward on the host that also counts how the P codes of the P V product fared
/// (attention_p_census: how many rounded to zero or to a subnormal), for choosing a key_order.
template <class QR, class QB, class KR, class KB, class VR, class VB, class OT>
void attention_forward(host_executor ex, const attention_shape& shape, const quantized_ref<QR, QB>& q,
                       const quantized_ref<KR, KB>& k, const quantized_ref<VR, VB>& v, matrix_ref<OT> o,
                       span<float> lse, const attention_options& opt, attention_p_census& census);

/// dQ, dK, dV of attention_forward on the host. `o` is the forward's output: needed for
/// delta_mode::from_output and for the telemetry's gap; with matched and no telemetry it may be
/// empty ({}). Returns the telemetry summary (zeros unless options.telemetry); `rows`, when given,
/// receives the per-row arrays. The stream form, with a workspace and device_stats instead of
/// `rows`, is in attention.cuh; both go through the one entry (attention_backward_entry). Every
/// temporary (per thread: the decoded operands and the float dQ/dK/dV accumulators of a sequence
/// and head, the tiles it works in; the telemetry's row arrays) comes from one block of
/// attention_backward_scratch_bytes(ex, shape, options) bytes, taken from ex's allocator (octet::with_allocator) or
/// else ::operator new; `rows`' vectors are the only other allocations (attention_row_telemetry).
template <class QR, class QB, class KR, class KB, class VR, class VB, class OT, class DR, class DB, class GT>
attention_stats attention_backward(host_executor ex, const attention_shape& shape, const quantized_ref<QR, QB>& q,
                                   const quantized_ref<KR, KB>& k, const quantized_ref<VR, VB>& v, matrix_ref<OT> o,
                                   span<const float> lse, const quantized_ref<DR, DB>& dout, matrix_ref<GT> dq,
                                   matrix_ref<GT> dk, matrix_ref<GT> dv, const attention_backward_options& opt = {},
                                   attention_row_telemetry* rows = nullptr);

/// Bytes of host scratch attention_forward(ex, shape, q, k, v, o, lse, opt[, census]) on FP8
/// operands takes (one block, from ex's allocator when one is lent): per chunk of work (at most ex's
/// thread count, and at most one per (sequence, query head, 64-query tile)) about
/// 4 * ((Lk64 + Lk) * (head_dim + 1) + 129 * head_dim + 512) bytes, with Lk the longest key
/// sequence and Lk64 that rounded up to a multiple of 64 (the decoded K and V of one sequence and
/// key/value head, a 64-query tile of Q, the tiles of the work), each array rounded up to 64 bytes.
/// Nothing grows with the batch. Depends on ex's thread count, the offsets and head_dim (not on
/// the options or the recipes); the arguments are not checked here.
inline std::size_t attention_forward_scratch_bytes(const host_executor& ex, const attention_shape& shape,
                                                   const attention_options& opt = {});

/// Bytes of host scratch attention_backward(ex, shape, q, k, v, o, lse, dout, dq, dk, dv, opt[, rows])
/// on FP8 operands takes (one block, from ex's allocator when one is lent): per chunk of work (at
/// most ex's thread count, and at most batch * heads_kv) about
/// 4 * ((4 * head_dim + 2) * Lk + (3 * head_dim + 4) * Lq + 130 * head_dim + 20864) bytes, with Lq,
/// Lk the longest query and key sequences (the decoded K, V of one sequence and key/value head and
/// Q, dO of one query head, their float dK, dV and dQ accumulators, D per row, the tiles of the
/// work), Lq * (head_dim + 1) floats more with fold_dq_residual (Kbar); and with telemetry seven
/// [heads_q][total_q] float row arrays, the only part that grows with the batch. Depends on ex's
/// thread count, the offsets, heads, head_dim and options.telemetry / fold_dq_residual; the
/// arguments are not checked here. `rows`' vectors are not part of it.
inline std::size_t attention_backward_scratch_bytes(const host_executor& ex, const attention_shape& shape,
                                                    const attention_backward_options& opt = {});

}  // namespace octet

#include "octet/attention/detail/attention.hpp"  // IWYU pragma: export
