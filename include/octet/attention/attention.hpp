// octet/attention/attention.hpp: FP8 attention, forward and backward, with a choice of how the
// backward's row term D is formed (delta matching) and row-sum telemetry. Host path.
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
// Edge cases: a sequence may be empty; a query row that sees no key (an empty key sequence, or a
// causal mask with Lk < Lq) gets O = 0, L = +Inf and dQ = 0. Non-finite inputs are data: a NaN code
// in a row of Q or K makes that row's scores NaN, and NaN propagates to what it touches.
// Bad arguments (shapes that disagree, heads_kv not dividing heads_q, sequence offsets out of
// order, scale grids too small for their data, scale blocks splitting a head) throw octet::error.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "octet/attention/rules.hpp"
#include "octet/core/bits.hpp"
#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/matrix.hpp"
#include "octet/core/span.hpp"
#include "octet/quant/quantize.hpp"
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

struct attention_options {
    attention_mask mask = attention_mask::full;
    float softmax_scale = 0.0f;  ///< 0: 1 / sqrt(head_dim)
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
    /// the stale delta). Costs one more head_dim-long product per (query, key) pair: +2.4%
    /// (from_output) and +3.7% (matched) backward time at 2048 tokens; dQ's error along Kbar drops
    /// 2.6-4.8x with matched, 4.5-48x with from_output (bench/RESULTS.md, attention_delta_study).
    bool fold_dq_residual = false;
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

    double residual_rms() const { return rows ? std::sqrt(static_cast<double>(residual_sumsq) / rows) : 0.0; }
    double gap_rms() const { return rows ? std::sqrt(static_cast<double>(gap_sumsq) / rows) : 0.0; }
    double residual_rel() const {
        return abs_ds_sumsq > 0 ? std::sqrt(static_cast<double>(residual_sumsq) / abs_ds_sumsq) : 0.0;
    }
    double gap_rel() const {
        return p_abs_dp_sumsq > 0 ? std::sqrt(static_cast<double>(gap_sumsq) / p_abs_dp_sumsq) : 0.0;
    }
    double residual_dq_rel() const {
        return abs_ds_sumsq > 0 ? std::sqrt(static_cast<double>(residual_dq_sumsq) / abs_ds_sumsq) : 0.0;
    }
    double residual_dk_rel() const {
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

namespace detail {

template <class Fmt>
inline constexpr bool is_attention_format_v = std::is_same_v<Fmt, e4m3> || std::is_same_v<Fmt, e5m2>;

template <class T>
inline constexpr bool is_attention_output_v = std::is_same_v<T, float> || std::is_same_v<T, bf16>;

template <class T>
OCTET_HD T attention_store(float v) {
    if constexpr (std::is_same_v<T, float>)
        return v;
    else
        return to_bf16(v);
}
template <class T>
OCTET_HD float attention_load(T v) {
    if constexpr (std::is_same_v<T, float>)
        return v;
    else
        return to_float(v);
}

inline void check_offsets(span<const std::int32_t> cu, std::int64_t total, const char* fn, const char* arg,
                          const char* tensor) {
    OCTET_REQUIRE(cu.size() >= 2, fn, arg,
                  message("has ", cu.size(), " entries; pass batch + 1 >= 2 cumulative sequence offsets"));
    OCTET_REQUIRE(cu[0] == 0, fn, arg, message("starts at ", cu[0], "; cumulative sequence offsets start at 0"));
    for (std::size_t b = 1; b < cu.size(); ++b)
        OCTET_REQUIRE(cu[b] >= cu[b - 1], fn, arg,
                      message("is out of order: entry ", b, " (", cu[b], ") is below entry ", b - 1, " (", cu[b - 1],
                              "); offsets must be non-decreasing"));
    OCTET_REQUIRE(cu[cu.size() - 1] == total, fn, arg,
                  message("ends at ", cu[cu.size() - 1], " but ", tensor, " has ", total,
                          " tokens; the last offset is the token count"));
}

inline void check_shape(const attention_shape& s, std::size_t q_rows, std::size_t k_rows, const char* fn) {
    OCTET_REQUIRE(s.head_dim > 0, fn, "shape.head_dim", message("is ", s.head_dim, "; it must be positive"));
    OCTET_REQUIRE(s.heads_q > 0, fn, "shape.heads_q", message("is ", s.heads_q, "; it must be positive"));
    OCTET_REQUIRE(
        s.heads_kv > 0 && s.heads_q % s.heads_kv == 0, fn, "shape.heads_kv",
        message("is ", s.heads_kv, " but must divide heads_q = ", s.heads_q,
                " (grouped-query attention shares each key/value head among heads_q / heads_kv query heads)"));
    check_offsets(s.cu_seqlens_q, static_cast<std::int64_t>(q_rows), fn, "shape.cu_seqlens_q", "q");
    if (!s.cu_seqlens_k.empty()) {
        OCTET_REQUIRE(s.cu_seqlens_k.size() == s.cu_seqlens_q.size(), fn, "shape.cu_seqlens_k",
                      message("has ", s.cu_seqlens_k.size(), " entries but cu_seqlens_q has ", s.cu_seqlens_q.size(),
                              "; both hold batch + 1 offsets"));
        check_offsets(s.cu_seqlens_k, static_cast<std::int64_t>(k_rows), fn, "shape.cu_seqlens_k", "k");
    } else {
        OCTET_REQUIRE(k_rows == q_rows, fn, "shape.cu_seqlens_k",
                      message("is empty (keys share the query offsets) but k has ", k_rows, " tokens and q has ",
                              q_rows, "; pass cu_seqlens_k"));
    }
}

inline float resolve_scale(float scale, int head_dim, const char* fn) {
    OCTET_REQUIRE(std::isfinite(scale), fn, "options.softmax_scale",
                  "is not finite; pass a finite scale (0 for 1/sqrt(head_dim))");
    return scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

/// Checks one FP8 operand: [tokens, heads * head_dim], scale blocks that keep a head whole.
template <class R, class B>
void check_operand(const quantized_ref<R, B>& x, std::size_t tokens, int heads, int head_dim, const char* fn,
                   const char* arg) {
    static_assert(is_attention_format_v<typename R::format>,
                  "octet::attention: Q, K, V and dO must be FP8 (a recipe with element format e4m3 or e5m2)");
    const std::size_t cols = static_cast<std::size_t>(heads) * head_dim;
    OCTET_REQUIRE(x.layout.cols == cols, fn, arg,
                  message("has ", x.layout.cols, " columns but heads * head_dim = ", heads, " * ", head_dim, " = ",
                          cols, "; it must be [tokens, heads * head_dim] (do the head dims disagree?)"));
    OCTET_REQUIRE(x.layout.rows == tokens, fn, arg,
                  message("has ", x.layout.rows, " rows but the sequence offsets end at ", tokens));
    validate_output(x, tokens, cols, fn, arg);
    if (tokens == 0) return;
    OCTET_REQUIRE(x.layout.block_cols % static_cast<std::size_t>(head_dim) == 0, fn, arg,
                  message("has scale blocks ", x.layout.block_cols, " columns wide, which split a head of ", head_dim,
                          " channels; use a recipe whose blocks span whole heads (block<1, ", head_dim, ">, block<R, ",
                          head_dim, ">, per_row, per_tensor)"));
}

/// L: heads_q * total_q floats, [heads][tokens].
template <class T>
void check_lse(span<T> lse, std::size_t needed, const char* fn) {
    OCTET_REQUIRE(lse.size() >= needed, fn, "lse",
                  message("has ", lse.size(), " floats but needs heads_q * total_q = ", needed));
    OCTET_REQUIRE(needed == 0 || lse.data() != nullptr, fn, "lse",
                  message("is null; pass heads_q * total_q = ", needed, " floats"));
}

template <class T>
void check_matrix(const matrix_ref<T>& m, std::size_t rows, std::size_t cols, const char* fn, const char* arg) {
    OCTET_REQUIRE(m.rows == rows && m.cols == cols, fn, arg,
                  message("has shape ", m.rows, " x ", m.cols, " but must be ", rows, " x ", cols,
                          " ([tokens, heads * head_dim])"));
    OCTET_REQUIRE(m.order == storage_order::row_major, fn, arg, "must be row-major");
    // a null pointer first: its ld says nothing about it
    OCTET_REQUIRE(rows == 0 || cols == 0 || m.data != nullptr, fn, arg,
                  message("is null with shape ", rows, " x ", cols, "; pass ", rows, " x ", cols,
                          " writable floats (row-major)"));
    OCTET_REQUIRE(rows == 0 || cols == 0 || m.ld >= cols, fn, arg,
                  message("has ld ", m.ld, " below its ", cols, " columns"));
}

/// Decoded codes [tokens][heads][head_dim] and scales [tokens][heads] of an operand (host).
struct attention_plane {
    std::vector<float> code, scale;
    int heads = 0, dim = 0;
    const float* row(int t, int h) const { return code.data() + (static_cast<std::size_t>(t) * heads + h) * dim; }
    float s(int t, int h) const { return scale[static_cast<std::size_t>(t) * heads + h]; }
};

template <class R, class B>
attention_plane decode_plane(host_executor ex, const quantized_ref<R, B>& x, int tokens, int heads, int dim) {
    attention_plane p;
    p.heads = heads;
    p.dim = dim;
    p.code.resize(static_cast<std::size_t>(tokens) * heads * dim);
    p.scale.resize(static_cast<std::size_t>(tokens) * heads);
    const quantized_cref<R> c = x;
    parallel_for(ex, static_cast<std::size_t>(tokens), 64, [&](std::size_t b, std::size_t e) {
        for (std::size_t t = b; t < e; ++t)
            for (int h = 0; h < heads; ++h) {
                const std::size_t col0 = static_cast<std::size_t>(h) * dim;
                p.scale[t * heads + h] = c.scale(t / c.layout.block_rows, col0 / c.layout.block_cols);
                float* dst = p.code.data() + (t * heads + h) * dim;
                for (int k = 0; k < dim; ++k) dst[k] = decode<typename R::format>(c.code(t, col0 + k));
            }
    });
    return p;
}

inline float dot_codes(const float* a, const float* b, int n) {
    float acc = 0.0f;  // exact products, float sum
    for (int k = 0; k < n; ++k) acc = attn::add(acc, attn::mul(a[k], b[k]));
    return acc;
}

/// attention_stats from one row's sums (host; the device's finalize kernel applies the same rule).
OCTET_HD void row_stats_terms(float residual, float abs_ds, float gap, float p_abs_dp, float (&t)[8]) {
    const float r = abs_float(residual), g = abs_float(gap);
    t[0] = r;
    t[1] = abs_ds > 0.0f ? attn::div(r, abs_ds) : 0.0f;
    t[2] = g;
    t[3] = p_abs_dp > 0.0f ? attn::div(g, p_abs_dp) : 0.0f;
    t[4] = attn::mul(r, r);
    t[5] = attn::mul(abs_ds, abs_ds);
    t[6] = attn::mul(g, g);
    t[7] = attn::mul(p_abs_dp, p_abs_dp);
}
inline void accumulate_row_stats(attention_stats& st, float residual, float abs_ds, float gap, float p_abs_dp) {
    float t[8];
    row_stats_terms(residual, abs_ds, gap, p_abs_dp, t);
    st.rows += 1;
    st.residual_max = std::max(st.residual_max, t[0]);
    st.residual_rel_max = std::max(st.residual_rel_max, t[1]);
    st.gap_max = std::max(st.gap_max, t[2]);
    st.gap_rel_max = std::max(st.gap_rel_max, t[3]);
    st.residual_sumsq += t[4];
    st.abs_ds_sumsq += t[5];
    st.gap_sumsq += t[6];
    st.p_abs_dp_sumsq += t[7];
}
/// The host-only terms: row sums of dS as the dQ and dK products used it.
inline void accumulate_quantized_row_stats(attention_stats& st, float residual_dq, float residual_dk) {
    const float q = abs_float(residual_dq), k = abs_float(residual_dk);
    st.residual_dq_max = std::max(st.residual_dq_max, q);
    st.residual_dk_max = std::max(st.residual_dk_max, k);
    st.residual_dq_sumsq += attn::mul(q, q);
    st.residual_dk_sumsq += attn::mul(k, k);
}
/// One element of dS as a product used it: S * decode(code) / s, where the operand was dS * s
/// quantized with the tile scale S. A key (or query) whose own scale s is 0 or NaN adds nothing
/// to its product, so its dS counts unrounded.
inline float dequantized_ds(float y, float tile_scale, float s, float ds) {
    return s > 0.0f ? attn::mul(tile_scale, attn::div(y, s)) : ds;
}

}  // namespace detail

// =================================================================================================
// Forward
// =================================================================================================

/// O = softmax(scale * Q K^T) V with FP8 Q, K, V and P, and the log-sum-exp L (host path).
template <class QR, class QB, class KR, class KB, class VR, class VB, class OT>
void attention_forward(host_executor ex, const attention_shape& shape, const quantized_ref<QR, QB>& q,
                       const quantized_ref<KR, KB>& k, const quantized_ref<VR, VB>& v, matrix_ref<OT> o,
                       span<float> lse, const attention_options& opt = {}) {
    static_assert(detail::is_attention_output_v<OT>, "octet::attention_forward: O must be float or octet::bf16");
    constexpr const char* fn = "octet::attention_forward";
    detail::check_shape(shape, q.layout.rows, k.layout.rows, fn);
    const int Hq = shape.heads_q, Hk = shape.heads_kv, d = shape.head_dim, Tq = shape.total_q(), Tk = shape.total_k();
    detail::check_operand(q, Tq, Hq, d, fn, "q");
    detail::check_operand(k, Tk, Hk, d, fn, "k");
    detail::check_operand(v, Tk, Hk, d, fn, "v");
    detail::check_matrix(o, Tq, static_cast<std::size_t>(Hq) * d, fn, "o");
    detail::check_lse(lse, static_cast<std::size_t>(Hq) * Tq, fn);
    const float scale = detail::resolve_scale(opt.softmax_scale, d, fn);
    const float scale_log2 = attn::mul(scale, attn::log2e);
    const bool causal = opt.mask == attention_mask::causal;

    const auto Q = detail::decode_plane(ex, q, Tq, Hq, d);
    const auto K = detail::decode_plane(ex, k, Tk, Hk, d);
    const auto V = detail::decode_plane(ex, v, Tk, Hk, d);
    const auto cuq = shape.cu_seqlens_q;
    const auto cuk = shape.keys();
    const int G = Hq / Hk, B = shape.batch();

    // Work units: (sequence, head, 64-query tile).
    struct unit {
        int b, h, qt;
    };
    std::vector<unit> units;
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < Hq; ++h)
            for (int qt = 0; qt * attn::tile_size < cuq[b + 1] - cuq[b]; ++qt) units.push_back({b, h, qt});

    parallel_for(ex, units.size(), 1, [&](std::size_t ub, std::size_t ue) {
        std::vector<float> acc(d), tmp(d), x(attn::tile_size), pq(attn::tile_size), ratio(attn::tile_size);
        for (std::size_t u = ub; u < ue; ++u) {
            const int b = units[u].b, h = units[u].h, qt = units[u].qt, hk = h / G;
            const int q0 = cuq[b], lq = cuq[b + 1] - q0, k0 = cuk[b], lk = cuk[b + 1] - k0;
            const int ntiles = attn::key_tiles_for(qt, lq, lk, causal);
            for (int i = qt * attn::tile_size; i < std::min(lq, (qt + 1) * attn::tile_size); ++i) {
                const float* qrow = Q.row(q0 + i, h);
                const float qf = attn::query_factor(Q.s(q0 + i, h), scale_log2);
                float m = attn::neg_inf(), l = 0.0f;
                std::fill(acc.begin(), acc.end(), 0.0f);
                for (int jt = 0; jt < ntiles; ++jt) {
                    const int j0 = jt * attn::tile_size, j1 = std::min(lk, j0 + attn::tile_size), n = j1 - j0;
                    float mv = 0.0f, mt = attn::neg_inf();
                    for (int j = j0; j < j1; ++j) mv = attn::fmax(mv, V.s(k0 + j, hk));
                    for (int j = j0; j < j1; ++j) {
                        x[j - j0] =
                            attn::visible(i, j, lq, lk, causal)
                                ? attn::score(detail::dot_codes(qrow, K.row(k0 + j, hk), d), qf, K.s(k0 + j, hk))
                                : attn::neg_inf();
                        mt = attn::fmax(mt, x[j - j0]);
                    }
                    const float m_new = attn::fmax(m, mt), mu = attn::usable_max(m_new);
                    const float alpha = attn::exp2(attn::sub(m, mu));
                    float rowsum = 0.0f;
                    for (int j = 0; j < n; ++j) {
                        const float p = attn::exp2(attn::sub(x[j], mu));
                        rowsum = attn::add(rowsum, p);
                        ratio[j] = attn::scale_ratio(V.s(k0 + j0 + j, hk), mv);
                        pq[j] = decode<e4m3>(attn::encode_p(attn::mul(p, ratio[j])));
                    }
                    l = attn::fma(l, alpha, rowsum);
                    std::fill(tmp.begin(), tmp.end(), 0.0f);
                    for (int j = 0; j < n; ++j) {
                        const float* vrow = V.row(k0 + j0 + j, hk);
                        for (int c = 0; c < d; ++c) tmp[c] = attn::add(tmp[c], attn::mul(pq[j], vrow[c]));
                    }
                    const float cv = attn::mul(mv, attn::p_scale);
                    for (int c = 0; c < d; ++c) acc[c] = attn::fma(acc[c], alpha, attn::mul(cv, tmp[c]));
                    m = m_new;
                }
                const float inv = l > 0.0f ? attn::div(1.0f, l) : 0.0f;
                OT* orow = o.data + static_cast<std::size_t>(q0 + i) * o.ld + static_cast<std::size_t>(h) * d;
                for (int c = 0; c < d; ++c) orow[c] = detail::attention_store<OT>(attn::mul(acc[c], inv));
                lse[static_cast<std::size_t>(h) * Tq + q0 + i] = attn::log_sum_exp(m, l);
            }
        }
    });
}

// =================================================================================================
// Backward
// =================================================================================================

/// dQ, dK, dV of attention_forward (host path). `o` is the forward's output: needed for
/// delta_mode::from_output and for the telemetry's gap; with matched and no telemetry it may be
/// empty ({}). Returns the telemetry summary (zeros unless options.telemetry); `rows`, when given,
/// receives the per-row arrays.
template <class QR, class QB, class KR, class KB, class VR, class VB, class OT, class DR, class DB, class GT>
attention_stats attention_backward(host_executor ex, const attention_shape& shape, const quantized_ref<QR, QB>& q,
                                   const quantized_ref<KR, KB>& k, const quantized_ref<VR, VB>& v, matrix_ref<OT> o,
                                   span<const float> lse, const quantized_ref<DR, DB>& dout, matrix_ref<GT> dq,
                                   matrix_ref<GT> dk, matrix_ref<GT> dv, const attention_backward_options& opt = {},
                                   attention_row_telemetry* rows = nullptr) {
    using O = std::remove_const_t<OT>;
    static_assert(detail::is_attention_output_v<O>, "octet::attention_backward: O must be float or octet::bf16");
    static_assert(detail::is_attention_output_v<GT>,
                  "octet::attention_backward: dQ, dK, dV must be float or octet::bf16");
    constexpr const char* fn = "octet::attention_backward";
    detail::check_shape(shape, q.layout.rows, k.layout.rows, fn);
    const int Hq = shape.heads_q, Hk = shape.heads_kv, d = shape.head_dim, Tq = shape.total_q(), Tk = shape.total_k();
    detail::check_operand(q, Tq, Hq, d, fn, "q");
    detail::check_operand(k, Tk, Hk, d, fn, "k");
    detail::check_operand(v, Tk, Hk, d, fn, "v");
    detail::check_operand(dout, Tq, Hq, d, fn, "dout");
    const bool have_o = !o.empty() || Tq == 0;
    OCTET_REQUIRE(have_o || opt.delta == delta_mode::matched, fn, "o",
                  "is empty; delta_mode::from_output computes D = rowsum(dO * O) and needs the forward's output");
    if (!o.empty()) detail::check_matrix(o, Tq, static_cast<std::size_t>(Hq) * d, fn, "o");
    detail::check_lse(lse, static_cast<std::size_t>(Hq) * Tq, fn);
    detail::check_matrix(dq, Tq, static_cast<std::size_t>(Hq) * d, fn, "dq");
    detail::check_matrix(dk, Tk, static_cast<std::size_t>(Hk) * d, fn, "dk");
    detail::check_matrix(dv, Tk, static_cast<std::size_t>(Hk) * d, fn, "dv");
    const float scale = detail::resolve_scale(opt.softmax_scale, d, fn);
    const float scale_log2 = attn::mul(scale, attn::log2e);
    const bool causal = opt.mask == attention_mask::causal;
    const bool tele = opt.telemetry;

    const auto Q = detail::decode_plane(ex, q, Tq, Hq, d);
    const auto K = detail::decode_plane(ex, k, Tk, Hk, d);
    const auto V = detail::decode_plane(ex, v, Tk, Hk, d);
    const auto DO = detail::decode_plane(ex, dout, Tq, Hq, d);
    const auto cuq = shape.cu_seqlens_q;
    const auto cuk = shape.keys();
    const int G = Hq / Hk, B = shape.batch();
    const std::size_t R = static_cast<std::size_t>(Hq) * Tq;

    std::vector<float> delta(R, 0.0f), delta_out(R, 0.0f), lc(R);
    for (std::size_t r = 0; r < R; ++r) lc[r] = attn::mul(lse[r], attn::log2e);
    const bool fold = opt.fold_dq_residual, track_rq = tele || fold;
    std::vector<float> row_res, row_abs, row_pdp, row_pabs, row_res_dq, row_res_dk, kbar;
    if (track_rq) row_res_dq.assign(R, 0.0f);
    if (fold) kbar.assign(R * static_cast<std::size_t>(d), 0.0f);  // like dq_acc: [token][head][d]
    if (tele) {
        row_res.assign(R, 0.0f);
        row_res_dk.assign(R, 0.0f);
        row_abs.assign(R, 0.0f);
        row_pdp.assign(R, 0.0f);
        row_pabs.assign(R, 0.0f);
    }

    // P_ij and dP_ij of one (row, key) pair, exactly as the kernels form them.
    auto p_dp = [&](int b, int h, int i, int j, float& p, float& dp) {
        const int hk = h / G, q0 = cuq[b], k0 = cuk[b], lq = cuq[b + 1] - q0, lk = cuk[b + 1] - k0;
        const std::size_t r = static_cast<std::size_t>(h) * Tq + q0 + i;
        const float x = attn::score(detail::dot_codes(Q.row(q0 + i, h), K.row(k0 + j, hk), d),
                                    attn::query_factor(Q.s(q0 + i, h), scale_log2), K.s(k0 + j, hk));
        p = attn::visible(i, j, lq, lk, causal) ? attn::exp2(attn::sub(x, lc[r])) : 0.0f;
        dp = attn::dprob(detail::dot_codes(DO.row(q0 + i, h), V.row(k0 + j, hk), d), DO.s(q0 + i, h), V.s(k0 + j, hk));
    };

    // ---- pass 1: D per row ------------------------------------------------------------------
    parallel_for(ex, static_cast<std::size_t>(B) * Hq, 1, [&](std::size_t ub, std::size_t ue) {
        for (std::size_t u = ub; u < ue; ++u) {
            const int b = static_cast<int>(u / Hq), h = static_cast<int>(u % Hq);
            const int q0 = cuq[b], lq = cuq[b + 1] - q0, lk = cuk[b + 1] - cuk[b];
            for (int i = 0; i < lq; ++i) {
                const std::size_t r = static_cast<std::size_t>(h) * Tq + q0 + i;
                if (have_o && !o.empty()) {
                    float s = 0.0f;
                    const float* dorow = DO.row(q0 + i, h);
                    const float sd = DO.s(q0 + i, h);
                    const O* orow = o.data + static_cast<std::size_t>(q0 + i) * o.ld + static_cast<std::size_t>(h) * d;
                    for (int c = 0; c < d; ++c)
                        s = attn::add(s, attn::mul(attn::mul(dorow[c], sd), detail::attention_load(orow[c])));
                    delta_out[r] = s;
                }
                if (opt.delta == delta_mode::matched) {
                    float s = 0.0f;
                    const int nt = attn::key_tiles_for(i / attn::tile_size, lq, lk, causal);
                    for (int j = 0; j < std::min(lk, nt * attn::tile_size); ++j) {
                        float p, dp;
                        p_dp(b, h, i, j, p, dp);
                        s = attn::add(s, attn::mul(p, dp));
                    }
                    delta[r] = s;
                } else {
                    delta[r] = delta_out[r];
                }
            }
        }
    });

    // ---- pass 2: gradients, per (sequence, key/value head) ------------------------------------
    std::vector<float> dq_acc(static_cast<std::size_t>(Tq) * Hq * d, 0.0f),
        dk_acc(static_cast<std::size_t>(Tk) * Hk * d, 0.0f), dv_acc(dk_acc.size(), 0.0f);
    parallel_for(ex, static_cast<std::size_t>(B) * Hk, 1, [&](std::size_t ub, std::size_t ue) {
        constexpr int T = attn::tile_size;
        std::vector<float> P(T * T), dS(T * T), codes(T * T), tmp(d), kb(d);
        for (std::size_t u = ub; u < ue; ++u) {
            const int b = static_cast<int>(u / Hk), hk = static_cast<int>(u % Hk);
            const int q0 = cuq[b], lq = cuq[b + 1] - q0, k0 = cuk[b], lk = cuk[b + 1] - k0;
            for (int kt = 0; kt * T < lk; ++kt) {
                const int j0 = kt * T, nj = std::min(lk, j0 + T) - j0;
                for (int h = hk * G; h < (hk + 1) * G; ++h) {
                    for (int qt = attn::first_query_tile_for(kt, lq, lk, causal); qt * T < lq; ++qt) {
                        const int i0 = qt * T, ni = std::min(lq, i0 + T) - i0;
                        // P, dP, dS of the tile
                        for (int a = 0; a < ni; ++a)
                            for (int c = 0; c < nj; ++c) {
                                float p, dp;
                                p_dp(b, h, i0 + a, j0 + c, p, dp);
                                const std::size_t r = static_cast<std::size_t>(h) * Tq + q0 + i0 + a;
                                const float ds = attn::dscore(p, dp, delta[r]);
                                P[a * T + c] = p;
                                dS[a * T + c] = ds;
                                if (tele) {
                                    row_res[r] = attn::add(row_res[r], ds);
                                    row_abs[r] = attn::add(row_abs[r], abs_float(ds));
                                    row_pdp[r] = attn::add(row_pdp[r], attn::mul(p, dp));
                                    row_pabs[r] = attn::add(row_pabs[r], attn::mul(p, abs_float(dp)));
                                }
                            }
                        // dV += P^T dO with s_do folded into P over the query tile
                        float mdo = 0.0f;
                        for (int a = 0; a < ni; ++a) mdo = attn::fmax(mdo, DO.s(q0 + i0 + a, h));
                        const float cdo = attn::mul(mdo, attn::p_scale);
                        for (int c = 0; c < nj; ++c) {
                            std::fill(tmp.begin(), tmp.end(), 0.0f);
                            for (int a = 0; a < ni; ++a) {
                                const float pq = decode<e4m3>(attn::encode_p(
                                    attn::mul(P[a * T + c], attn::scale_ratio(DO.s(q0 + i0 + a, h), mdo))));
                                const float* dorow = DO.row(q0 + i0 + a, h);
                                for (int e = 0; e < d; ++e) tmp[e] = attn::add(tmp[e], attn::mul(pq, dorow[e]));
                            }
                            float* dst = dv_acc.data() + (static_cast<std::size_t>(k0 + j0 + c) * Hk + hk) * d;
                            for (int e = 0; e < d; ++e) dst[e] = attn::fma(cdo, tmp[e], dst[e]);
                        }
                        // dK += (dS s_q)^T Q, one dS scale per key row of the tile
                        for (int c = 0; c < nj; ++c) {
                            float amax = 0.0f;
                            for (int a = 0; a < ni; ++a) {
                                codes[a] = attn::mul(dS[a * T + c], Q.s(q0 + i0 + a, h));
                                amax = attn::fmax(amax, finite_abs(codes[a]));
                            }
                            const float sc = attn::ds_scale(amax), inv = attn::ds_inverse(sc);
                            std::fill(tmp.begin(), tmp.end(), 0.0f);
                            for (int a = 0; a < ni; ++a) {
                                const float y = decode<e4m3>(attn::encode_ds(codes[a], inv));
                                const float* qrow = Q.row(q0 + i0 + a, h);
                                for (int e = 0; e < d; ++e) tmp[e] = attn::add(tmp[e], attn::mul(y, qrow[e]));
                                if (tele) {
                                    const std::size_t r = static_cast<std::size_t>(h) * Tq + q0 + i0 + a;
                                    row_res_dk[r] =
                                        attn::add(row_res_dk[r],
                                                  detail::dequantized_ds(y, sc, Q.s(q0 + i0 + a, h), dS[a * T + c]));
                                }
                            }
                            float* dst = dk_acc.data() + (static_cast<std::size_t>(k0 + j0 + c) * Hk + hk) * d;
                            for (int e = 0; e < d; ++e) dst[e] = attn::fma(sc, tmp[e], dst[e]);
                        }
                        // dQ += scale * (dS s_k) K, one dS scale per query row of the tile
                        for (int a = 0; a < ni; ++a) {
                            float amax = 0.0f;
                            for (int c = 0; c < nj; ++c) {
                                codes[c] = attn::mul(dS[a * T + c], K.s(k0 + j0 + c, hk));
                                amax = attn::fmax(amax, finite_abs(codes[c]));
                            }
                            const float ds_sc = attn::ds_scale(amax), inv = attn::ds_inverse(ds_sc);
                            const float sc = attn::mul(scale, ds_sc);
                            std::fill(tmp.begin(), tmp.end(), 0.0f);
                            if (fold) std::fill(kb.begin(), kb.end(), 0.0f);
                            const std::size_t r = static_cast<std::size_t>(h) * Tq + q0 + i0 + a;
                            for (int c = 0; c < nj; ++c) {
                                const float y = decode<e4m3>(attn::encode_ds(codes[c], inv));
                                const float* krow = K.row(k0 + j0 + c, hk);
                                const float sk = K.s(k0 + j0 + c, hk);
                                for (int e = 0; e < d; ++e) tmp[e] = attn::add(tmp[e], attn::mul(y, krow[e]));
                                if (track_rq)
                                    row_res_dq[r] =
                                        attn::add(row_res_dq[r], detail::dequantized_ds(y, ds_sc, sk, dS[a * T + c]));
                                if (fold) {  // Kbar_i += P_ij K_j, K_j = s_k(j) * codes
                                    const float pk = attn::mul(P[a * T + c], sk);
                                    for (int e = 0; e < d; ++e) kb[e] = attn::add(kb[e], attn::mul(pk, krow[e]));
                                }
                            }
                            const std::size_t at = (static_cast<std::size_t>(q0 + i0 + a) * Hq + h) * d;
                            float* dst = dq_acc.data() + at;
                            for (int e = 0; e < d; ++e) dst[e] = attn::add(dst[e], attn::mul(sc, tmp[e]));
                            if (fold)
                                for (int e = 0; e < d; ++e) kbar[at + e] = attn::add(kbar[at + e], kb[e]);
                        }
                    }
                }
            }
        }
    });

    // ---- the fold: dQ_i -= scale * rq_i * Kbar_i ------------------------------------------------
    if (fold)
        for (int t = 0; t < Tq; ++t)
            for (int h = 0; h < Hq; ++h) {
                const float f = attn::mul(scale, row_res_dq[static_cast<std::size_t>(h) * Tq + t]);
                const std::size_t at = (static_cast<std::size_t>(t) * Hq + h) * d;
                for (int e = 0; e < d; ++e) dq_acc[at + e] = attn::sub(dq_acc[at + e], attn::mul(f, kbar[at + e]));
            }

    // ---- outputs ------------------------------------------------------------------------------
    for (int t = 0; t < Tq; ++t)
        for (int h = 0; h < Hq; ++h)
            for (int e = 0; e < d; ++e)
                dq.data[static_cast<std::size_t>(t) * dq.ld + static_cast<std::size_t>(h) * d + e] =
                    detail::attention_store<GT>(dq_acc[(static_cast<std::size_t>(t) * Hq + h) * d + e]);
    for (int t = 0; t < Tk; ++t)
        for (int h = 0; h < Hk; ++h)
            for (int e = 0; e < d; ++e) {
                const std::size_t src = (static_cast<std::size_t>(t) * Hk + h) * d + e;
                const std::size_t off = static_cast<std::size_t>(h) * d + e;
                dk.data[static_cast<std::size_t>(t) * dk.ld + off] =
                    detail::attention_store<GT>(attn::mul(dk_acc[src], scale));
                dv.data[static_cast<std::size_t>(t) * dv.ld + off] = detail::attention_store<GT>(dv_acc[src]);
            }

    attention_stats st;
    if (tele) {
        for (std::size_t r = 0; r < R; ++r)
            if (lse[r] < attn::pos_inf()) {
                detail::accumulate_row_stats(st, row_res[r], row_abs[r],
                                             have_o && !o.empty() ? attn::sub(delta_out[r], row_pdp[r]) : 0.0f,
                                             row_pabs[r]);
                detail::accumulate_quantized_row_stats(st, row_res_dq[r], row_res_dk[r]);
            }
        if (rows) {
            rows->delta = delta;
            rows->delta_from_output = delta_out;
            rows->residual = std::move(row_res);
            rows->abs_ds = std::move(row_abs);
            rows->p_dp = std::move(row_pdp);
            rows->p_abs_dp = std::move(row_pabs);
            rows->residual_dq = std::move(row_res_dq);
            rows->residual_dk = std::move(row_res_dk);
        }
    } else if (rows) {
        rows->delta = delta;
        rows->delta_from_output = delta_out;
    }
    return st;
}

}  // namespace octet
