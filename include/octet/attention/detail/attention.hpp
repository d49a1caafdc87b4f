// octet/attention/detail/attention.hpp: the implementation of octet/attention/attention.hpp
// (which includes it at its end): the argument checks every executor shares, the host backend
// (its SIMD inner loops, scratch layouts, forward and backward), the executor backends' entry, and
// the definitions of the entries declared there. The stream backend is in detail/stream.cuh.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "octet/attention/attention.hpp"
#include "octet/attention/rules.hpp"
#include "octet/core/bits.hpp"
#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/isa_dispatch.hpp"
#include "octet/core/matrix.hpp"
#include "octet/core/span.hpp"
#include "octet/quant/quantize.hpp"
#include "octet/quant/tensor.hpp"

namespace octet {

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

/// The sizes of one attention call and its softmax scale, once the checks every executor shares
/// have passed (check_forward_args, check_backward_args).
struct attention_dims {
    int heads_q = 0, heads_kv = 0, head_dim = 0, total_q = 0, total_k = 0;
    float scale = 0.0f;  ///< options.softmax_scale, or 1 / sqrt(head_dim) for 0
    std::size_t q_cols() const { return static_cast<std::size_t>(heads_q) * head_dim; }
    std::size_t k_cols() const { return static_cast<std::size_t>(heads_kv) * head_dim; }
};

/// The checks of the forward and the backward alike: the shape, Q, K, V, L and the softmax scale.
template <class QR, class QB, class KR, class KB, class VR, class VB, class L>
attention_dims check_attention_inputs(const attention_shape& shape, const quantized_ref<QR, QB>& q,
                                      const quantized_ref<KR, KB>& k, const quantized_ref<VR, VB>& v, span<L> lse,
                                      float softmax_scale, const char* fn) {
    check_shape(shape, q.layout.rows, k.layout.rows, fn);
    attention_dims dims;
    dims.heads_q = shape.heads_q;
    dims.heads_kv = shape.heads_kv;
    dims.head_dim = shape.head_dim;
    dims.total_q = shape.total_q();
    dims.total_k = shape.total_k();
    check_operand(q, dims.total_q, dims.heads_q, dims.head_dim, fn, "q");
    check_operand(k, dims.total_k, dims.heads_kv, dims.head_dim, fn, "k");
    check_operand(v, dims.total_k, dims.heads_kv, dims.head_dim, fn, "v");
    check_lse(lse, static_cast<std::size_t>(dims.heads_q) * dims.total_q, fn);
    dims.scale = resolve_scale(softmax_scale, dims.head_dim, fn);
    return dims;
}

/// options.kernel names one of attention_kernel's values.
inline void check_kernel_choice(attention_kernel kernel, const char* fn) {
    OCTET_REQUIRE(kernel == attention_kernel::automatic || kernel == attention_kernel::mma_sync ||
                      kernel == attention_kernel::wgmma,
                  fn, "options.kernel",
                  message("is ", static_cast<int>(kernel), "; pass attention_kernel::automatic, mma_sync or wgmma"));
}

/// Every executor-independent check of octet::attention_forward.
template <class QR, class QB, class KR, class KB, class VR, class VB, class OT>
attention_dims check_forward_args(const attention_shape& shape, const quantized_ref<QR, QB>& q,
                                  const quantized_ref<KR, KB>& k, const quantized_ref<VR, VB>& v,
                                  const matrix_ref<OT>& o, span<float> lse, const attention_options& opt) {
    static_assert(is_attention_output_v<OT>, "octet::attention_forward: O must be float or octet::bf16");
    constexpr const char* fn = "octet::attention_forward";
    const attention_dims dims = check_attention_inputs(shape, q, k, v, lse, opt.softmax_scale, fn);
    check_matrix(o, dims.total_q, dims.q_cols(), fn, "o");
    OCTET_REQUIRE(opt.key_order == key_tile_order::front_to_back || opt.key_order == key_tile_order::back_to_front, fn,
                  "options.key_order",
                  message("is ", static_cast<int>(opt.key_order),
                          "; pass key_tile_order::front_to_back or key_tile_order::back_to_front"));
    check_kernel_choice(opt.kernel, fn);
    return dims;
}

/// Every executor-independent check of octet::attention_backward. `o` may be empty only with
/// delta_mode::matched (or no query tokens).
template <class QR, class QB, class KR, class KB, class VR, class VB, class OT, class DR, class DB, class GT>
attention_dims check_backward_args(const attention_shape& shape, const quantized_ref<QR, QB>& q,
                                   const quantized_ref<KR, KB>& k, const quantized_ref<VR, VB>& v,
                                   const matrix_ref<OT>& o, span<const float> lse, const quantized_ref<DR, DB>& dout,
                                   const matrix_ref<GT>& dq, const matrix_ref<GT>& dk, const matrix_ref<GT>& dv,
                                   const attention_backward_options& opt) {
    static_assert(is_attention_output_v<std::remove_const_t<OT>>,
                  "octet::attention_backward: O must be float or octet::bf16");
    static_assert(is_attention_output_v<GT>, "octet::attention_backward: dQ, dK, dV must be float or octet::bf16");
    constexpr const char* fn = "octet::attention_backward";
    const attention_dims dims = check_attention_inputs(shape, q, k, v, lse, opt.softmax_scale, fn);
    check_operand(dout, dims.total_q, dims.heads_q, dims.head_dim, fn, "dout");
    OCTET_REQUIRE(!o.empty() || opt.delta == delta_mode::matched || dims.total_q == 0, fn, "o",
                  "is empty; delta_mode::from_output computes D = rowsum(dO * O) and needs the forward's output");
    if (!o.empty()) check_matrix(o, dims.total_q, dims.q_cols(), fn, "o");
    check_matrix(dq, dims.total_q, dims.q_cols(), fn, "dq");
    check_matrix(dk, dims.total_k, dims.k_cols(), fn, "dk");
    check_matrix(dv, dims.total_k, dims.k_cols(), fn, "dv");
    check_kernel_choice(opt.kernel, fn);
    return dims;
}

/// Decoded codes [tokens][dim] and scales [tokens] of one head of a run of an operand's tokens
/// (host), in a chunk's slot of the operation's scratch block (decode_rows fills it).
struct attention_rows {
    float* code = nullptr;
    float* scale = nullptr;
    int dim = 0;
    attention_rows() = default;
    attention_rows(scratch_carver& c, int tokens, int dim_) : dim(dim_) {
        code = c.take<float>(static_cast<std::size_t>(tokens) * dim);
        scale = c.take<float>(static_cast<std::size_t>(tokens));
    }
    const float* row(int t) const { return code + static_cast<std::size_t>(t) * dim; }
    float s(int t) const { return scale[t]; }
};

/// Fills rows [0, n) of p with tokens [t0, t0 + n) of head `head` of x: the decoded codes and
/// their scales (exact: decoding rounds nothing, so when it happens changes no result).
template <class R>
void decode_rows(const quantized_cref<R>& x, int t0, int n, int head, attention_rows& p) {
    const int dim = p.dim;
    const std::size_t col0 = static_cast<std::size_t>(head) * dim;
    for (int t = 0; t < n; ++t) {
        const std::size_t tok = static_cast<std::size_t>(t0) + static_cast<std::size_t>(t);
        p.scale[t] = x.scale(tok / x.layout.block_rows, col0 / x.layout.block_cols);
        float* dst = p.code + static_cast<std::size_t>(t) * dim;
        for (int k = 0; k < dim; ++k) dst[k] = decode<typename R::format>(x.code(tok, col0 + k));
    }
}

/// panel[c * 64 + j] = the decoded code of channel c of token t0 + j, head `head`, of x, and s[j]
/// its scale, for j < n (the panel zero for j >= n): decode_rows straight into the transposed
/// 64-token panel the row dots read (transposed_panel).
template <class R>
void decode_panel(const quantized_cref<R>& x, int t0, int n, int head, int dim, float* panel, float* s) {
    constexpr int T = attention::tile_size;
    std::fill(panel, panel + static_cast<std::size_t>(dim) * T, 0.0f);
    const std::size_t col0 = static_cast<std::size_t>(head) * dim;
    for (int j = 0; j < n; ++j) {
        const std::size_t tok = static_cast<std::size_t>(t0) + static_cast<std::size_t>(j);
        s[j] = x.scale(tok / x.layout.block_rows, col0 / x.layout.block_cols);
        for (int c = 0; c < dim; ++c)
            panel[static_cast<std::size_t>(c) * T + j] = decode<typename R::format>(x.code(tok, col0 + c));
    }
}

/// The largest difference of consecutive offsets (0 for fewer than two): the longest sequence.
inline int longest_sequence(span<const std::int32_t> cu) {
    int m = 0;
    for (std::size_t b = 1; b < cu.size(); ++b) m = std::max(m, cu[b] - cu[b - 1]);
    return m;
}

/// The bytes of the scratch that Scratch(carver, args...) describes.
template <class Scratch, class... Args>
std::size_t scratch_bytes_of(const Args&... args) {
    scratch_carver c;
    (void)Scratch(c, args...);
    return c.bytes();
}

/// `chunks` slots of per-chunk scratch (parallel_for_chunks' slot `chunk`), each laid out by
/// Slot(carver, args...) and rounded up to 64 bytes, taken from the operation's carver.
/// at(chunk, args...) carves slot `chunk`, zero-filled (as the std::vector<float>(n) they replace).
template <class Slot>
struct chunk_slots {
    unsigned char* base = nullptr;
    std::size_t stride = 0;
    chunk_slots() = default;
    template <class... Args>
    chunk_slots(scratch_carver& c, std::size_t chunks, const Args&... args) {
        scratch_carver one;
        (void)Slot(one, args...);
        stride = (one.bytes() + 63) & ~std::size_t{63};
        base = c.take<unsigned char>(chunks * stride);
    }
    template <class... Args>
    Slot at(std::size_t chunk, const Args&... args) const {
        unsigned char* const at = base + chunk * stride;
        std::fill(at, at + stride, static_cast<unsigned char>(0));
        scratch_carver c(at);
        return Slot(c, args...);
    }
};

// The host path's inner loops, as kernels that run compiled for the CPU's instruction set
// (core/isa_dispatch.hpp). Each works on one 64-wide row of a tile and keeps the order of every
// float sum of the element-wise definition (sum over channels in channel order, over keys or
// queries in their order), vectorizing across independent outputs instead, so its results are
// the same bits on every instruction set and thread count. The only products they sum are of two
// FP8 values (exact in float), so a compiler fusing them into an fma changes nothing.

/// out[j] = sum_c a[c] * panel[c * 64 + j] for j < 64, c < n: one row of a Q K^T or dO V^T tile
/// against a transposed 64-key panel (sum in channel order from +0, as the kernels' definition).
struct tile_row_dots_kernel {
    OCTET_KERNEL_INLINE static void run(const float* __restrict a, const float* __restrict panel, int n,
                                        float* __restrict out) {
        constexpr int T = attention::tile_size;
        float acc[T];
        for (int j = 0; j < T; ++j) acc[j] = 0.0f;
        for (int c = 0; c < n; ++c) {
            const float x = a[c];
            const float* col = panel + static_cast<std::size_t>(c) * T;
            for (int j = 0; j < T; ++j) acc[j] = attention::add(acc[j], attention::mul(x, col[j]));
        }
        for (int j = 0; j < T; ++j) out[j] = acc[j];
    }
};

/// out[e] = sum_a w[a] * rows[a * stride + e] for e < d, a < n (in a's order, from +0): a tile's
/// contribution to one row of O, dV, dK or dQ from FP8-valued weights w and decoded code rows.
/// D > 0: d == D known at compile time, so the sums stay in registers across the rows.
template <int D>
struct weighted_rows_kernel {
    OCTET_KERNEL_INLINE static void run(const float* __restrict w, int n, const float* __restrict rows,
                                        std::size_t stride, int d, float* __restrict out) {
        if constexpr (D > 0) {
            (void)d;
            float acc[D];
            for (int e = 0; e < D; ++e) acc[e] = 0.0f;
            for (int a = 0; a < n; ++a) {
                const float x = w[a];
                const float* r = rows + static_cast<std::size_t>(a) * stride;
                for (int e = 0; e < D; ++e) acc[e] = attention::add(acc[e], attention::mul(x, r[e]));
            }
            for (int e = 0; e < D; ++e) out[e] = acc[e];
        } else {
            for (int e = 0; e < d; ++e) out[e] = 0.0f;
            for (int a = 0; a < n; ++a) {
                const float x = w[a];
                const float* r = rows + static_cast<std::size_t>(a) * stride;
                for (int e = 0; e < d; ++e) out[e] = attention::add(out[e], attention::mul(x, r[e]));
            }
        }
    }
};
inline void weighted_rows(simd_isa isa, const float* w, int n, const float* rows, std::size_t stride, int d,
                          float* out) {
    switch (d) {
        case 32:
            return run_kernel<weighted_rows_kernel<32>>(isa, w, n, rows, stride, d, out);
        case 64:
            return run_kernel<weighted_rows_kernel<64>>(isa, w, n, rows, stride, d, out);
        case 128:
            return run_kernel<weighted_rows_kernel<128>>(isa, w, n, rows, stride, d, out);
        default:
            return run_kernel<weighted_rows_kernel<0>>(isa, w, n, rows, stride, d, out);
    }
}

/// dst[e] = fma(f, x[e], dst[e]) for e < d (dV and dK take a tile's partial sum times its scale).
struct fma_accumulate_kernel {
    OCTET_KERNEL_INLINE static void run(float f, const float* __restrict x, int d, float* __restrict dst) {
        for (int e = 0; e < d; ++e) dst[e] = attention::fma(f, x[e], dst[e]);
    }
};

/// acc[e] = fma(acc[e], alpha, c * x[e]) for e < d: the forward's rescaled running P V sum.
struct rescale_accumulate_kernel {
    OCTET_KERNEL_INLINE static void run(float alpha, float c, const float* __restrict x, int d, float* __restrict acc) {
        for (int e = 0; e < d; ++e) acc[e] = attention::fma(acc[e], alpha, attention::mul(c, x[e]));
    }
};

/// p[j] = exp2(x[j] - m) for j < 64 (attention::exp2, whose polynomial is a chain of explicit fmas).
struct exp2_row_kernel {
    OCTET_KERNEL_INLINE static void run(const float* __restrict x, float m, float* __restrict p) {
        for (int j = 0; j < attention::tile_size; ++j) p[j] = attention::exp2(attention::sub(x[j], m));
    }
};

/// out[j] = decode<e4m3>(encode<e4m3>(x[j] * f)) for j < 64: the values of a P or dS tile row's
/// E4M3 codes (attention::encode_p is f = 256, attention::encode_ds is f = the reciprocal of the tile scale).
struct e4m3_row_kernel {
    OCTET_KERNEL_INLINE static void run(const float* __restrict x, float f, float* __restrict out) {
        for (int j = 0; j < attention::tile_size; ++j) out[j] = decode<e4m3>(encode<e4m3>(attention::mul(x[j], f)));
    }
};

/// panel[c * 64 + j] = row t0 + j of p, channel c, for j < n (zero for j >= n): the transposed
/// 64-token panel the row dots read.
inline void transposed_panel(const attention_rows& p, int t0, int n, float* panel) {
    constexpr int T = attention::tile_size;
    std::fill(panel, panel + static_cast<std::size_t>(p.dim) * T, 0.0f);
    for (int j = 0; j < n; ++j) {
        const float* r = p.row(t0 + j);
        for (int c = 0; c < p.dim; ++c) panel[static_cast<std::size_t>(c) * T + j] = r[c];
    }
}

/// attention_stats from one row's sums (host; the device's finalize kernel applies the same rule).
OCTET_HD void row_stats_terms(float residual, float abs_ds, float gap, float p_abs_dp, float (&t)[8]) {
    const float r = abs_float(residual), g = abs_float(gap);
    t[0] = r;
    t[1] = abs_ds > 0.0f ? attention::div(r, abs_ds) : 0.0f;
    t[2] = g;
    t[3] = p_abs_dp > 0.0f ? attention::div(g, p_abs_dp) : 0.0f;
    t[4] = attention::mul(r, r);
    t[5] = attention::mul(abs_ds, abs_ds);
    t[6] = attention::mul(g, g);
    t[7] = attention::mul(p_abs_dp, p_abs_dp);
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
    st.residual_dq_sumsq += attention::mul(q, q);
    st.residual_dk_sumsq += attention::mul(k, k);
}
/// One element of dS as a product used it: S * decode(code) / s, where the operand was dS * s
/// quantized with the tile scale S. A key (or query) whose own scale s is 0 or NaN adds nothing
/// to its product, so its dS counts unrounded.
inline float dequantized_ds(float y, float tile_scale, float s, float ds) {
    // a bit mask rather than a float select, so that a loop of these vectorizes (same values)
    const std::uint32_t use = 0u - static_cast<std::uint32_t>(s > 0.0f);
    const float q = attention::mul(tile_scale, attention::div(y, s));
    return bits_to_float((float_to_bits(q) & use) | (float_to_bits(ds) & ~use));
}

// =================================================================================================
// Forward
// =================================================================================================

/// The host forward's work units, (sequence, head, 64-query tile) in that order: their count.
inline std::size_t attention_forward_unit_count(const attention_shape& shape) {
    const auto cuq = shape.cu_seqlens_q;
    std::size_t n = 0;
    for (int b = 0; b < shape.batch(); ++b)
        for (int qt = 0; qt * attention::tile_size < cuq[b + 1] - cuq[b]; ++qt)
            n += static_cast<std::size_t>(std::max(shape.heads_q, 0));
    return n;
}

/// The arrays one chunk of the host forward works in (one slot per chunk of its units): K and V
/// of the (sequence, key/value head) the chunk is at, decoded when it gets there (K as one
/// transposed d x 64 panel and 64 scales per 64-key tile, what the row dots read; V as rows), the
/// unit's decoded Q rows (at most 64), the rows of one query row against a key tile, and the
/// running state of the unit's query rows. Sized by the longest key sequence, not the batch:
/// decoding is exact, so when and how often it happens changes no result.
struct attention_forward_chunk {
    float *kpanel, *kscale;
    attention_rows V, Q;
    float *tmp, *x, *p, *u, *pq, *ratio;
    float *m_row, *l_row, *acc_rows;  ///< the running state of a unit's query rows (at most 64)
    attention_forward_chunk(scratch_carver& c, int d, int lk) {
        constexpr std::size_t T = attention::tile_size;
        const std::size_t D = static_cast<std::size_t>(d);
        const std::size_t key_tiles = (static_cast<std::size_t>(lk) + T - 1) / T;
        kpanel = c.take<float>(key_tiles * D * T);
        kscale = c.take<float>(key_tiles * T);
        V = attention_rows(c, lk, d);
        Q = attention_rows(c, static_cast<int>(T), d);
        tmp = c.take<float>(D);
        x = c.take<float>(T);
        p = c.take<float>(T);
        u = c.take<float>(T);
        pq = c.take<float>(T);
        ratio = c.take<float>(T);
        m_row = c.take<float>(T);
        l_row = c.take<float>(T);
        acc_rows = c.take<float>(T * D);
    }
};

/// The host forward's scratch, described once for attention_forward_scratch_bytes and the
/// forward: one attention_forward_chunk per chunk of the work units, nothing else.
struct attention_forward_scratch {
    std::size_t unit_count = 0;
    int longest_k = 0;
    chunk_slots<attention_forward_chunk> chunks;
    attention_forward_scratch(scratch_carver& c, const host_executor& ex, const attention_shape& shape) {
        unit_count = attention_forward_unit_count(shape);
        longest_k = longest_sequence(shape.keys());
        chunks = chunk_slots<attention_forward_chunk>(c, parallel_chunks(ex, unit_count, 1),
                                                      std::max(shape.head_dim, 0), longest_k);
    }
};

/// The forward on the host (the entry, octet::attention_forward, checked the arguments into `dims`).
/// Every temporary comes from one host_scratch block of attention_forward_scratch_bytes(ex, shape).
template <class QR, class QB, class KR, class KB, class VR, class VB, class OT>
void host_attention_forward(host_executor ex, const attention_dims& dims, const attention_shape& shape,
                            const quantized_ref<QR, QB>& q, const quantized_ref<KR, KB>& k,
                            const quantized_ref<VR, VB>& v, matrix_ref<OT> o, span<float> lse,
                            const attention_options& opt, attention_p_census* census = nullptr) {
    const int Hq = dims.heads_q, Hk = dims.heads_kv, d = dims.head_dim, Tq = dims.total_q;
    const float scale = dims.scale;
    const float scale_log2 = attention::mul(scale, attention::log2e);
    const bool causal = opt.mask == attention_mask::causal;

    const host_scratch block(ex, scratch_bytes_of<attention_forward_scratch>(ex, shape), "octet::attention_forward");
    scratch_carver carve = block.carver();
    const attention_forward_scratch work(carve, ex, shape);

    const quantized_cref<QR> qc = q;
    const quantized_cref<KR> kc = k;
    const quantized_cref<VR> vc = v;
    const auto cuq = shape.cu_seqlens_q;
    const auto cuk = shape.keys();
    const int G = Hq / Hk, B = shape.batch();
    const std::size_t n_units = work.unit_count;

    const detail::simd_isa isa = detail::best_isa();
    std::mutex census_mutex;
    if (census) *census = {};
    parallel_for_chunks(ex, n_units, 1, [&](std::size_t chunk, std::size_t ub, std::size_t ue) {
        constexpr int T = attention::tile_size;
        attention_forward_chunk w = work.chunks.at(chunk, d, work.longest_k);
        attention_rows &Q = w.Q, &V = w.V;
        float *const tmp = w.tmp, *const x = w.x, *const p = w.p, *const u = w.u, *const pq = w.pq,
                     *const ratio = w.ratio;
        int kv_b = -1, kv_h = -1;  // the (sequence, key/value head) whose K and V w holds
        attention_p_census mine;
        // Work units: (sequence, head, 64-query tile), in that order; find the chunk's first.
        const auto q_tiles = [&](int sb) { return (cuq[sb + 1] - cuq[sb] + T - 1) / T; };
        int b = 0, h = 0, qt = 0;
        for (std::size_t skip = ub;; ++b) {
            const std::size_t nb = static_cast<std::size_t>(q_tiles(b)) * Hq;
            if (skip < nb) {
                h = static_cast<int>(skip / q_tiles(b));
                qt = static_cast<int>(skip % q_tiles(b));
                break;
            }
            skip -= nb;
        }
        for (std::size_t un = ub; un < ue; ++un) {
            const int hk = h / G;
            const int q0 = cuq[b], lq = cuq[b + 1] - q0, k0 = cuk[b], lk = cuk[b + 1] - k0;
            const int ntiles = attention::key_tiles_for(qt, lq, lk, causal);
            const int i0 = qt * T, i1 = std::min(lq, i0 + T);
            if (b != kv_b || hk != kv_h) {
                for (int j0 = 0; j0 < lk; j0 += T)
                    detail::decode_panel(kc, k0 + j0, std::min(T, lk - j0), hk, d,
                                         w.kpanel + static_cast<std::size_t>(j0) * d, w.kscale + j0);
                detail::decode_rows(vc, k0, lk, hk, V);
                kv_b = b;
                kv_h = hk;
            }
            detail::decode_rows(qc, q0 + i0, i1 - i0, h, Q);
            // Row i's running state across key tiles, for the tile's rows at once.
            float *const m_row = w.m_row, *const l_row = w.l_row, *const acc_rows = w.acc_rows;
            std::fill(m_row, m_row + (i1 - i0), attention::neg_inf());
            std::fill(l_row, l_row + (i1 - i0), 0.0f);
            std::fill(acc_rows, acc_rows + static_cast<std::size_t>(i1 - i0) * d, 0.0f);
            for (int step = 0; step < ntiles; ++step) {
                const int jt = attention::key_tile_at(step, ntiles, opt.key_order);
                const int j0 = jt * T, j1 = std::min(lk, j0 + T), n = j1 - j0;
                const float *const kt = w.kpanel + static_cast<std::size_t>(j0) * d, *const ks = w.kscale + j0;
                float mv = 0.0f;
                for (int j = 0; j < n; ++j) mv = attention::fmax(mv, V.s(j0 + j));
                for (int j = 0; j < n; ++j) ratio[j] = attention::scale_ratio(V.s(j0 + j), mv);
                const float cv = attention::mul(mv, attention::p_scale);
                for (int i = i0; i < i1; ++i) {
                    const float qf = attention::query_factor(Q.s(i - i0), scale_log2);
                    detail::run_kernel<detail::tile_row_dots_kernel>(isa, Q.row(i - i0), kt, d, x);
                    float mt = attention::neg_inf();
                    for (int j = 0; j < n; ++j) {
                        x[j] = attention::visible(i, j0 + j, lq, lk, causal) ? attention::score(x[j], qf, ks[j])
                                                                             : attention::neg_inf();
                        mt = attention::fmax(mt, x[j]);
                    }
                    float& m = m_row[i - i0];
                    const float m_new = attention::fmax(m, mt), mu = attention::usable_max(m_new);
                    const float alpha = attention::exp2(attention::sub(m, mu));
                    detail::run_kernel<detail::exp2_row_kernel>(isa, x, mu, p);
                    float rowsum = 0.0f;
                    for (int j = 0; j < n; ++j) {
                        rowsum = attention::add(rowsum, p[j]);
                        u[j] = attention::mul(p[j], ratio[j]);
                    }
                    detail::run_kernel<detail::e4m3_row_kernel>(isa, u, 256.0f, pq);
                    if (census)
                        for (int j = 0; j < n; ++j) {
                            if (!(u[j] > 0.0f)) continue;
                            mine.pairs += 1;
                            mine.flushed += pq[j] == 0.0f;
                            mine.subnormal += pq[j] != 0.0f && pq[j] < 0.015625f;  // 2^-6, E4M3's smallest normal
                        }
                    l_row[i - i0] = attention::fma(l_row[i - i0], alpha, rowsum);
                    detail::weighted_rows(isa, pq, n, V.row(j0), static_cast<std::size_t>(d), d, tmp);
                    detail::run_kernel<detail::rescale_accumulate_kernel>(
                        isa, alpha, cv, tmp, d, acc_rows + static_cast<std::size_t>(i - i0) * d);
                    m = m_new;
                }
            }
            for (int i = i0; i < i1; ++i) {
                const float l = l_row[i - i0];
                const float* ar = acc_rows + static_cast<std::size_t>(i - i0) * d;
                const float inv = l > 0.0f ? attention::div(1.0f, l) : 0.0f;
                OT* orow = o.data + static_cast<std::size_t>(q0 + i) * o.ld + static_cast<std::size_t>(h) * d;
                for (int c = 0; c < d; ++c) orow[c] = detail::attention_store<OT>(attention::mul(ar[c], inv));
                lse[static_cast<std::size_t>(h) * Tq + q0 + i] = attention::log_sum_exp(m_row[i - i0], l_row[i - i0]);
            }
            // the next unit
            if (++qt == q_tiles(b)) {
                qt = 0;
                if (++h == Hq) {
                    h = 0;
                    do ++b;
                    while (b < B && q_tiles(b) == 0);
                }
            }
        }
        if (census) {
            const std::lock_guard<std::mutex> lock(census_mutex);
            census->pairs += mine.pairs;
            census->flushed += mine.flushed;
            census->subnormal += mine.subnormal;
        }
    });
}

// =================================================================================================
// Backward
// =================================================================================================

/// The arrays one chunk of the host backward works in (one slot per chunk of its units, a unit
/// being one (sequence, key/value head)): the decoded K and V of the unit (the longest key
/// sequence), the decoded Q and dO of the query head it is at (the longest query sequence), the
/// float dK and dV accumulators of the unit and the dQ accumulator of the query head (with Kbar
/// for fold_dq_residual), that head's D per row (and rowsum(dO * O), rq: in the whole-tensor
/// arrays with options.telemetry), the panels of one 64-key tile (K and V transposed, their
/// scales) and the 64 x 64 tiles and rows of the gradients (D's rows use P, dP and x of them).
struct attention_backward_chunk {
    attention_rows K, V, Q, DO;
    float *dk = nullptr, *dv = nullptr, *dq = nullptr, *kbar = nullptr;
    float *delta = nullptr, *delta_out = nullptr, *rq = nullptr;
    float *kt, *vt, *ks, *vs;
    float *P, *dS, *dP, *RQ, *PQt, *x, *codes, *y, *sq, *tmp, *kb;
    attention_backward_chunk(scratch_carver& c, int d, int lq, int lk, bool fold, bool tele) {
        constexpr std::size_t T = attention::tile_size;
        const std::size_t D = static_cast<std::size_t>(d), Lq = static_cast<std::size_t>(lq),
                          Lk = static_cast<std::size_t>(lk);
        K = attention_rows(c, lk, d);
        V = attention_rows(c, lk, d);
        Q = attention_rows(c, lq, d);
        DO = attention_rows(c, lq, d);
        dk = c.take<float>(Lk * D);
        dv = c.take<float>(Lk * D);
        dq = c.take<float>(Lq * D);
        if (fold) kbar = c.take<float>(Lq * D);
        delta = c.take<float>(Lq);
        if (!tele) delta_out = c.take<float>(Lq);
        if (fold && !tele) rq = c.take<float>(Lq);
        kt = c.take<float>(D * T);
        vt = c.take<float>(D * T);
        ks = c.take<float>(T);
        vs = c.take<float>(T);
        P = c.take<float>(T * T);
        dS = c.take<float>(T * T);
        dP = c.take<float>(T * T);
        RQ = c.take<float>(T * T);
        PQt = c.take<float>(T * T);
        x = c.take<float>(T);
        codes = c.take<float>(T);
        y = c.take<float>(T);
        sq = c.take<float>(T);
        tmp = c.take<float>(D);
        kb = c.take<float>(D);
    }
};

/// The host backward's scratch, described once for attention_backward_scratch_bytes and the
/// backward: with options.telemetry seven [heads_q][total_q] row arrays (rowsum(dO * O), the dS
/// row sums as formed, as the dK and the dQ products used it, |dS|, P dP, P |dP|), and one
/// attention_backward_chunk per chunk of the (sequence, key/value head) units. The telemetry's
/// arrays are the one part that grows with the whole batch (a float per query token and head, no
/// head_dim factor): attention_stats sums its squares over all rows in [head][token] order, which
/// interleaves the units, so every row's terms are kept until the end (and they are what `rows`
/// receives). Nothing else is whole-tensor: a unit owns every dK, dV row of its key/value head in
/// its sequence (grouped-query attention's sum over the query heads that share it stays inside the
/// unit) and every dQ row of those query heads there, so it writes them out itself.
struct attention_backward_scratch {
    float *delta_out = nullptr, *row_res_dq = nullptr;
    float *row_res = nullptr, *row_res_dk = nullptr, *row_abs = nullptr, *row_pdp = nullptr, *row_pabs = nullptr;
    int longest_q = 0, longest_k = 0;
    chunk_slots<attention_backward_chunk> chunks;
    attention_backward_scratch(scratch_carver& c, const host_executor& ex, const attention_shape& shape,
                               const attention_backward_options& opt) {
        const int Hq = std::max(shape.heads_q, 0), Hk = std::max(shape.heads_kv, 0), d = std::max(shape.head_dim, 0);
        const int Tq = std::max(shape.total_q(), 0);
        const std::size_t R = static_cast<std::size_t>(Hq) * Tq;
        const std::size_t B = static_cast<std::size_t>(shape.batch());
        if (opt.telemetry) {
            delta_out = c.take<float>(R);
            row_res_dq = c.take<float>(R);
            row_res = c.take<float>(R);
            row_res_dk = c.take<float>(R);
            row_abs = c.take<float>(R);
            row_pdp = c.take<float>(R);
            row_pabs = c.take<float>(R);
        }
        longest_q = longest_sequence(shape.cu_seqlens_q);
        longest_k = longest_sequence(shape.keys());
        chunks = chunk_slots<attention_backward_chunk>(c, parallel_chunks(ex, B * Hk, 1), d, longest_q, longest_k,
                                                       opt.fold_dq_residual, opt.telemetry);
    }
};

/// The backward on the host (the entry, octet::attention_backward, checked the arguments into
/// `dims`); `rows`, when given, receives the per-row arrays. Every temporary comes from one
/// host_scratch block of attention_backward_scratch_bytes(ex, shape, opt); only `rows`' vectors
/// are allocated (std::vector's assign: not when they already hold the capacity).
///
/// Work units are (sequence, key/value head); a unit runs its query heads one after the other:
/// D of every row of the head (rowsum(dO * O), or with delta_mode::matched sum_j P_ij dP_ij over
/// the key tiles in order), then its key tiles in order, each against the query tiles that see it,
/// adding into the head's dQ rows and the unit's dK, dV rows. Every float sum thus runs over the
/// same terms in the same order as in a loop of key tiles outside query heads (a dK or dV row:
/// query heads, then query tiles; a dQ row: key tiles), and the unit writes dQ when a head is
/// done and dK, dV when the unit is.
template <class QR, class QB, class KR, class KB, class VR, class VB, class OT, class DR, class DB, class GT>
attention_stats host_attention_backward(host_executor ex, const attention_dims& dims, const attention_shape& shape,
                                        const quantized_ref<QR, QB>& q, const quantized_ref<KR, KB>& k,
                                        const quantized_ref<VR, VB>& v, matrix_ref<OT> o, span<const float> lse,
                                        const quantized_ref<DR, DB>& dout, matrix_ref<GT> dq, matrix_ref<GT> dk,
                                        matrix_ref<GT> dv, const attention_backward_options& opt,
                                        attention_row_telemetry* rows) {
    using O = std::remove_const_t<OT>;
    const int Hq = dims.heads_q, Hk = dims.heads_kv, d = dims.head_dim, Tq = dims.total_q;
    const float scale = dims.scale;
    const bool have_o = !o.empty();
    const float scale_log2 = attention::mul(scale, attention::log2e);
    const bool causal = opt.mask == attention_mask::causal;
    const bool tele = opt.telemetry;

    const host_scratch block(ex, scratch_bytes_of<attention_backward_scratch>(ex, shape, opt),
                             "octet::attention_backward");
    scratch_carver carve = block.carver();
    const attention_backward_scratch work(carve, ex, shape, opt);
    const quantized_cref<QR> qc = q;
    const quantized_cref<KR> kc = k;
    const quantized_cref<VR> vc = v;
    const quantized_cref<DR> dc = dout;
    const auto cuq = shape.cu_seqlens_q;
    const auto cuk = shape.keys();
    const int G = Hq / Hk, B = shape.batch();
    const std::size_t R = static_cast<std::size_t>(Hq) * Tq;

    const bool fold = opt.fold_dq_residual, track_rq = tele || fold;
    // With telemetry, the row arrays of every (head, token) (attention_backward_scratch)
    float *const all_delta_out = work.delta_out, *const row_res = work.row_res, *const row_abs = work.row_abs,
                 *const row_pdp = work.row_pdp, *const row_pabs = work.row_pabs, *const row_res_dq = work.row_res_dq,
                 *const row_res_dk = work.row_res_dk;
    if (tele) {
        std::fill(all_delta_out, all_delta_out + R, 0.0f);
        std::fill(row_res_dq, row_res_dq + R, 0.0f);
        std::fill(row_res, row_res + R, 0.0f);
        std::fill(row_res_dk, row_res_dk + R, 0.0f);
        std::fill(row_abs, row_abs + R, 0.0f);
        std::fill(row_pdp, row_pdp + R, 0.0f);
        std::fill(row_pabs, row_pabs + R, 0.0f);
    }
    if (rows) {  // every row's D is written by the unit that forms it
        rows->delta.assign(R, 0.0f);
        rows->delta_from_output.assign(R, 0.0f);
    }

    constexpr int T = attention::tile_size;
    const detail::simd_isa isa = detail::best_isa();
    const std::size_t ds = static_cast<std::size_t>(d);

    // The panels of one 64-key tile of one key/value head: K and V transposed, and their scales.
    struct key_tile {
        float *kt, *vt, *ks, *vs;  // d * 64, d * 64, 64, 64 (a chunk's attention_backward_chunk)
        int j0 = 0, n = 0;
        void load(const detail::attention_rows& Kp, const detail::attention_rows& Vp, int j0_, int lk) {
            j0 = j0_;
            n = std::min(lk, j0 + T) - j0;
            detail::transposed_panel(Kp, j0, n, kt);
            detail::transposed_panel(Vp, j0, n, vt);
            for (int j = 0; j < n; ++j) {
                ks[j] = Kp.s(j0 + j);
                vs[j] = Vp.s(j0 + j);
            }
        }
    };
    // P_ij and dP_ij of query row i of a sequence (lq queries, lk keys; Qp and DOp its decoded
    // rows of the head, lse_row its L) against one key tile, j < kt.n, exactly as the kernels form
    // them (x is scratch).
    auto p_dp_row = [&](const detail::attention_rows& Qp, const detail::attention_rows& DOp, const float* lse_row,
                        int lq, int lk, int i, const key_tile& kt, float* p, float* dp, float* x) {
        detail::run_kernel<detail::tile_row_dots_kernel>(isa, Qp.row(i), kt.kt, d, x);
        detail::run_kernel<detail::tile_row_dots_kernel>(isa, DOp.row(i), kt.vt, d, dp);
        const float qf = attention::query_factor(Qp.s(i), scale_log2), sdo = DOp.s(i);
        for (int j = 0; j < kt.n; ++j) {
            x[j] = attention::score(x[j], qf, kt.ks[j]);
            dp[j] = attention::dprob(dp[j], sdo, kt.vs[j]);
        }
        detail::run_kernel<detail::exp2_row_kernel>(isa, x, attention::mul(lse_row[i], attention::log2e), p);
        // attention::visible(i, kt.j0 + j, lq, lk, causal) is j < seen (i < lq, kt.j0 + j < lk always hold here)
        const int seen = causal ? std::max(0, std::min(kt.n, i + (lk - lq) - kt.j0 + 1)) : kt.n;
        for (int j = seen; j < kt.n; ++j) p[j] = 0.0f;
    };

    const std::size_t kv_units = static_cast<std::size_t>(B) * Hk;  // (sequence, key/value head)
    parallel_for_chunks(ex, kv_units, 1, [&](std::size_t chunk, std::size_t ub, std::size_t ue) {
        attention_backward_chunk w = work.chunks.at(chunk, d, work.longest_q, work.longest_k, fold, tele);
        const attention_rows &K = w.K, &V = w.V, &Q = w.Q, &DO = w.DO;
        key_tile kt{w.kt, w.vt, w.ks, w.vs};
        float *const P = w.P, *const dS = w.dS, *const dP = w.dP, *const RQ = w.RQ, *const PQt = w.PQt, *const x = w.x,
                     *const codes = w.codes, *const y = w.y, *const sq = w.sq, *const tmp = w.tmp, *const kb = w.kb;
        float *const dk_acc = w.dk, *const dv_acc = w.dv, *const dq_acc = w.dq, *const kbar = w.kbar,
                     *const delta = w.delta;
        for (std::size_t u = ub; u < ue; ++u) {
            const int b = static_cast<int>(u / Hk), hk = static_cast<int>(u % Hk);
            const int q0 = cuq[b], lq = cuq[b + 1] - q0, k0 = cuk[b], lk = cuk[b + 1] - k0;
            detail::decode_rows(kc, k0, lk, hk, w.K);
            detail::decode_rows(vc, k0, lk, hk, w.V);
            std::fill(dk_acc, dk_acc + static_cast<std::size_t>(lk) * ds, 0.0f);
            std::fill(dv_acc, dv_acc + static_cast<std::size_t>(lk) * ds, 0.0f);
            for (int h = hk * G; h < (hk + 1) * G; ++h) {
                detail::decode_rows(qc, q0, lq, h, w.Q);
                detail::decode_rows(dc, q0, lq, h, w.DO);
                // this head's rows of the [heads_q][total_q] arrays start at rb
                const std::size_t rb = static_cast<std::size_t>(h) * Tq + q0;
                const float* const lse_row = lse.data() + rb;
                float* const delta_out = tele ? all_delta_out + rb : w.delta_out;
                float* const rq = tele ? row_res_dq + rb : w.rq;  // null without telemetry and the fold
                float *const res = tele ? row_res + rb : nullptr, *const res_abs = tele ? row_abs + rb : nullptr,
                             *const pdp = tele ? row_pdp + rb : nullptr, *const pabs = tele ? row_pabs + rb : nullptr,
                             *const rdk = tele ? row_res_dk + rb : nullptr;

                // ---- D per row ---------------------------------------------------------------
                std::fill(delta_out, delta_out + lq, 0.0f);
                for (int i = 0; i < lq; ++i) {
                    if (!have_o) break;
                    float s = 0.0f;
                    const float* dorow = DO.row(i);
                    const float sd = DO.s(i);
                    const O* orow = o.data + static_cast<std::size_t>(q0 + i) * o.ld + static_cast<std::size_t>(h) * d;
                    for (int c = 0; c < d; ++c)
                        s = attention::add(
                            s, attention::mul(attention::mul(dorow[c], sd), detail::attention_load(orow[c])));
                    delta_out[i] = s;
                }
                if (opt.delta != delta_mode::matched) {
                    std::copy(delta_out, delta_out + lq, delta);
                } else {
                    // D_i = sum_j P_ij dP_ij over the key tiles row i's query tile visits, in key order.
                    std::fill(delta, delta + lq, 0.0f);
                    for (int qt = 0; qt * T < lq; ++qt) {
                        const int i0 = qt * T, i1 = std::min(lq, i0 + T);
                        const int nt = attention::key_tiles_for(qt, lq, lk, causal);
                        for (int jt = 0; jt < nt; ++jt) {
                            kt.load(K, V, jt * T, lk);
                            for (int i = i0; i < i1; ++i) {
                                p_dp_row(Q, DO, lse_row, lq, lk, i, kt, P, dP, x);
                                float s = delta[i];
                                for (int j = 0; j < kt.n; ++j) s = attention::add(s, attention::mul(P[j], dP[j]));
                                delta[i] = s;
                            }
                        }
                    }
                }

                // ---- gradients: the head's key tiles in order ------------------------------------
                std::fill(dq_acc, dq_acc + static_cast<std::size_t>(lq) * ds, 0.0f);
                if (fold) std::fill(kbar, kbar + static_cast<std::size_t>(lq) * ds, 0.0f);
                if (fold && !tele) std::fill(rq, rq + lq, 0.0f);
                for (int jt = 0; jt * T < lk; ++jt) {
                    kt.load(K, V, jt * T, lk);
                    const int j0 = kt.j0, nj = kt.n;
                    for (int qt = attention::first_query_tile_for(jt, lq, lk, causal); qt * T < lq; ++qt) {
                        const int i0 = qt * T, ni = std::min(lq, i0 + T) - i0;
                        // P, dP, dS of the tile
                        for (int a = 0; a < ni; ++a) {
                            float* pr = P + a * T;
                            float* dpr = dP + a * T;
                            float* dsr = dS + a * T;
                            p_dp_row(Q, DO, lse_row, lq, lk, i0 + a, kt, pr, dpr, x);
                            for (int c = 0; c < nj; ++c) dsr[c] = attention::dscore(pr[c], dpr[c], delta[i0 + a]);
                        }
                        // Row sums key by key, the tile's rows side by side: each row's sum keeps
                        // key order, and the rows' independent chains overlap.
                        if (tele)
                            for (int c = 0; c < nj; ++c)
                                for (int a = 0; a < ni; ++a) {
                                    const float dsv = dS[a * T + c], pv = P[a * T + c], dpv = dP[a * T + c];
                                    const int i = i0 + a;
                                    res[i] = attention::add(res[i], dsv);
                                    res_abs[i] = attention::add(res_abs[i], abs_float(dsv));
                                    pdp[i] = attention::add(pdp[i], attention::mul(pv, dpv));
                                    pabs[i] = attention::add(pabs[i], attention::mul(pv, abs_float(dpv)));
                                }
                        // dV += P^T dO with s_do folded into P over the query tile
                        float mdo = 0.0f;
                        for (int a = 0; a < ni; ++a) mdo = attention::fmax(mdo, DO.s(i0 + a));
                        const float cdo = attention::mul(mdo, attention::p_scale);
                        for (int a = 0; a < ni; ++a) {
                            const float rd = attention::scale_ratio(DO.s(i0 + a), mdo);
                            for (int c = 0; c < nj; ++c) codes[c] = attention::mul(P[a * T + c], rd);
                            detail::run_kernel<detail::e4m3_row_kernel>(isa, codes, 256.0f, y);
                            for (int c = 0; c < nj; ++c) PQt[c * T + a] = y[c];
                        }
                        for (int c = 0; c < nj; ++c) {
                            detail::weighted_rows(isa, PQt + c * T, ni, DO.row(i0), ds, d, tmp);
                            detail::run_kernel<detail::fma_accumulate_kernel>(
                                isa, cdo, tmp, d, dv_acc + static_cast<std::size_t>(j0 + c) * ds);
                        }
                        // dK += (dS s_q)^T Q, one dS scale per key row of the tile
                        for (int a = 0; a < ni; ++a) sq[a] = Q.s(i0 + a);
                        for (int c = 0; c < nj; ++c) {
                            float amax = 0.0f;
                            for (int a = 0; a < ni; ++a) {
                                codes[a] = attention::mul(dS[a * T + c], sq[a]);
                                amax = attention::fmax(amax, finite_abs(codes[a]));
                            }
                            const float sc = attention::ds_scale(amax), inv = attention::ds_inverse(sc);
                            detail::run_kernel<detail::e4m3_row_kernel>(isa, codes, inv, y);
                            detail::weighted_rows(isa, y, ni, Q.row(i0), ds, d, tmp);
                            if (tele)
                                for (int a = 0; a < ni; ++a)
                                    rdk[i0 + a] = attention::add(
                                        rdk[i0 + a], detail::dequantized_ds(y[a], sc, sq[a], dS[a * T + c]));
                            detail::run_kernel<detail::fma_accumulate_kernel>(
                                isa, sc, tmp, d, dk_acc + static_cast<std::size_t>(j0 + c) * ds);
                        }
                        // dQ += scale * (dS s_k) K, one dS scale per query row of the tile
                        for (int a = 0; a < ni; ++a) {
                            float amax = 0.0f;
                            for (int c = 0; c < nj; ++c) {
                                codes[c] = attention::mul(dS[a * T + c], kt.ks[c]);
                                amax = attention::fmax(amax, finite_abs(codes[c]));
                            }
                            const float ds_sc = attention::ds_scale(amax), inv = attention::ds_inverse(ds_sc);
                            const float sc = attention::mul(scale, ds_sc);
                            detail::run_kernel<detail::e4m3_row_kernel>(isa, codes, inv, y);
                            detail::weighted_rows(isa, y, nj, K.row(j0), ds, d, tmp);
                            if (track_rq)  // summed into rq after the tile's rows, below
                                for (int c = 0; c < nj; ++c)
                                    RQ[a * T + c] = detail::dequantized_ds(y[c], ds_sc, kt.ks[c], dS[a * T + c]);
                            if (fold) {  // Kbar_i += P_ij K_j, K_j = s_k(j) * codes
                                std::fill(kb, kb + d, 0.0f);
                                for (int c = 0; c < nj; ++c) {
                                    const float pk = attention::mul(P[a * T + c], kt.ks[c]);
                                    const float* krow = K.row(j0 + c);
                                    for (int e = 0; e < d; ++e)
                                        kb[e] = attention::add(kb[e], attention::mul(pk, krow[e]));
                                }
                            }
                            const std::size_t at = static_cast<std::size_t>(i0 + a) * ds;
                            float* dst = dq_acc + at;
                            for (int e = 0; e < d; ++e) dst[e] = attention::add(dst[e], attention::mul(sc, tmp[e]));
                            if (fold)
                                for (int e = 0; e < d; ++e) kbar[at + e] = attention::add(kbar[at + e], kb[e]);
                        }
                        if (track_rq)
                            for (int c = 0; c < nj; ++c)
                                for (int a = 0; a < ni; ++a) rq[i0 + a] = attention::add(rq[i0 + a], RQ[a * T + c]);
                    }
                }

                // ---- the head's dQ: the fold, dQ_i -= scale * rq_i * Kbar_i, then out -------------
                if (fold)
                    for (int i = 0; i < lq; ++i) {
                        const float f = attention::mul(scale, rq[i]);
                        const std::size_t at = static_cast<std::size_t>(i) * ds;
                        for (int e = 0; e < d; ++e)
                            dq_acc[at + e] = attention::sub(dq_acc[at + e], attention::mul(f, kbar[at + e]));
                    }
                for (int i = 0; i < lq; ++i) {
                    GT* dst = dq.data + static_cast<std::size_t>(q0 + i) * dq.ld + static_cast<std::size_t>(h) * d;
                    const float* src = dq_acc + static_cast<std::size_t>(i) * ds;
                    for (int e = 0; e < d; ++e) dst[e] = detail::attention_store<GT>(src[e]);
                }
                if (rows) {
                    std::copy(delta, delta + lq, rows->delta.data() + rb);
                    std::copy(delta_out, delta_out + lq, rows->delta_from_output.data() + rb);
                }
            }

            // ---- the unit's dK, dV ---------------------------------------------------------------
            for (int j = 0; j < lk; ++j) {
                const std::size_t off = static_cast<std::size_t>(hk) * d;
                GT* dkr = dk.data + static_cast<std::size_t>(k0 + j) * dk.ld + off;
                GT* dvr = dv.data + static_cast<std::size_t>(k0 + j) * dv.ld + off;
                const float *ka = dk_acc + static_cast<std::size_t>(j) * ds,
                            *va = dv_acc + static_cast<std::size_t>(j) * ds;
                for (int e = 0; e < d; ++e) {
                    dkr[e] = detail::attention_store<GT>(attention::mul(ka[e], scale));
                    dvr[e] = detail::attention_store<GT>(va[e]);
                }
            }
        }
    });

    attention_stats st;
    if (tele) {
        for (std::size_t r = 0; r < R; ++r)
            if (lse[r] < attention::pos_inf()) {
                detail::accumulate_row_stats(st, row_res[r], row_abs[r],
                                             have_o ? attention::sub(all_delta_out[r], row_pdp[r]) : 0.0f, row_pabs[r]);
                detail::accumulate_quantized_row_stats(st, row_res_dq[r], row_res_dk[r]);
            }
        if (rows) {
            rows->residual.assign(row_res, row_res + R);
            rows->abs_ds.assign(row_abs, row_abs + R);
            rows->p_dp.assign(row_pdp, row_pdp + R);
            rows->p_abs_dp.assign(row_pabs, row_pabs + R);
            rows->residual_dq.assign(row_res_dq, row_res_dq + R);
            rows->residual_dk.assign(row_res_dk, row_res_dk + R);
        }
    }
    return st;
}

// =================================================================================================
// The executor backends and the entries
// =================================================================================================

/// The executor half of octet::attention_forward / attention_backward, specialized per executor:
/// require_supported(opt) refuses backward options the executor does not implement (before any
/// other argument is read); forward(ex, dims, shape, q, k, v, o, lse, opt) and backward(ex, dims,
/// shape, q, k, v, o, lse, dout, dq, dk, dv, opt, extra...) run with the arguments the entry checked.
/// The host's is here, the stream's in detail/stream.cuh.
template <class Executor>
struct attention_backend;

template <>
struct attention_backend<host_executor> {
    static void require_supported(const attention_backward_options&) {}

    template <class... Args>
    static void forward(host_executor ex, const Args&... args) {
        host_attention_forward(ex, args...);
    }

    /// extra: the attention_row_telemetry* that receives the per-row arrays (null to skip).
    template <class... Args>
    static attention_stats backward(host_executor ex, const Args&... args) {
        return host_attention_backward(ex, args...);
    }
};

/// The backward's entry for every executor: the executor's supported options, the checks every
/// executor shares (check_backward_args), then the executor's backend with its own `extra` arguments.
template <class Executor, class QR, class QB, class KR, class KB, class VR, class VB, class OT, class DR, class DB,
          class GT, class... Extra>
decltype(auto) attention_backward_entry(const Executor& ex, const attention_shape& shape,
                                        const quantized_ref<QR, QB>& q, const quantized_ref<KR, KB>& k,
                                        const quantized_ref<VR, VB>& v, matrix_ref<OT> o, span<const float> lse,
                                        const quantized_ref<DR, DB>& dout, matrix_ref<GT> dq, matrix_ref<GT> dk,
                                        matrix_ref<GT> dv, const attention_backward_options& opt, Extra... extra) {
    using backend = attention_backend<Executor>;
    backend::require_supported(opt);
    const attention_dims dims = check_backward_args(shape, q, k, v, o, lse, dout, dq, dk, dv, opt);
    return backend::backward(ex, dims, shape, q, k, v, o, lse, dout, dq, dk, dv, opt, extra...);
}

}  // namespace detail

// ---- the entries, declared and documented in octet/attention/attention.hpp ------------------------

template <class QR, class QB, class KR, class KB, class VR, class VB, class OT, class Executor>
void attention_forward(const Executor& ex, const attention_shape& shape, const quantized_ref<QR, QB>& q,
                       const quantized_ref<KR, KB>& k, const quantized_ref<VR, VB>& v, matrix_ref<OT> o,
                       span<float> lse, const attention_options& opt) {
    const detail::attention_dims dims = detail::check_forward_args(shape, q, k, v, o, lse, opt);
    detail::attention_backend<Executor>::forward(ex, dims, shape, q, k, v, o, lse, opt);
}

template <class QR, class QB, class KR, class KB, class VR, class VB, class OT>
void attention_forward(host_executor ex, const attention_shape& shape, const quantized_ref<QR, QB>& q,
                       const quantized_ref<KR, KB>& k, const quantized_ref<VR, VB>& v, matrix_ref<OT> o,
                       span<float> lse, const attention_options& opt, attention_p_census& census) {
    const detail::attention_dims dims = detail::check_forward_args(shape, q, k, v, o, lse, opt);
    detail::host_attention_forward(ex, dims, shape, q, k, v, o, lse, opt, &census);
}

template <class QR, class QB, class KR, class KB, class VR, class VB, class OT, class DR, class DB, class GT>
attention_stats attention_backward(host_executor ex, const attention_shape& shape, const quantized_ref<QR, QB>& q,
                                   const quantized_ref<KR, KB>& k, const quantized_ref<VR, VB>& v, matrix_ref<OT> o,
                                   span<const float> lse, const quantized_ref<DR, DB>& dout, matrix_ref<GT> dq,
                                   matrix_ref<GT> dk, matrix_ref<GT> dv, const attention_backward_options& opt,
                                   attention_row_telemetry* rows) {
    return detail::attention_backward_entry(ex, shape, q, k, v, o, lse, dout, dq, dk, dv, opt, rows);
}

inline std::size_t attention_forward_scratch_bytes(const host_executor& ex, const attention_shape& shape,
                                                   const attention_options& opt) {
    (void)opt;
    return detail::scratch_bytes_of<detail::attention_forward_scratch>(ex, shape);
}

inline std::size_t attention_backward_scratch_bytes(const host_executor& ex, const attention_shape& shape,
                                                    const attention_backward_options& opt) {
    return detail::scratch_bytes_of<detail::attention_backward_scratch>(ex, shape, opt);
}

}  // namespace octet
