// examples/common/model/attention_f32.hpp: the transformer's float32 attention (../model.hpp): causal,
// grouped-query heads, forward and FlashAttention-style backward.
#pragma once

#include "base.hpp"
#include "kernels.hpp"

namespace common {

// =================================================================================================
// float32 attention (causal, grouped-query heads)
// =================================================================================================

/// Where a batch's attention operands live: qkv rows are [Q heads | K heads | V heads] (qkv_ld
/// floats per token), O and dO rows are [heads_q * head_dim]; lse is [heads_q][tokens].
struct attention_dims {
    std::size_t batch = 0, len = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
    std::size_t qkv_ld() const { return (heads_q + 2 * heads_kv) * head_dim; }
    std::size_t o_ld() const { return heads_q * head_dim; }
    std::size_t tokens() const { return batch * len; }
};

/// Runs body(unit, scratch) for units [0, count) on ex's threads, each thread with its own scratch
/// of `per_worker` floats from `scratch` (which holds `workers` of them).
template <class Body>
void for_units(octet::host_executor ex, std::size_t count, float* scratch, std::size_t workers, std::size_t per_worker,
               Body&& body) {
    const std::size_t W = std::min(workers, count);
    octet::parallel_for(ex, W, 1, [&](std::size_t w0, std::size_t w1) {
        for (std::size_t w = w0; w < w1; ++w)
            for (std::size_t u = w * count / W; u < (w + 1) * count / W; ++u) body(u, scratch + w * per_worker);
    });
}

/// Query rows per block of the float32 attention's products (blocks stop at the causal diagonal).
inline constexpr std::size_t kAttentionRows = 32;

/// Floats of scratch one worker of the float32 attention needs for sequences of `len` tokens.
inline std::size_t attention_scratch_floats(std::size_t len, std::size_t head_dim) {
    return 3 * len * len + 2 * head_dim * len;
}

namespace detail {
/// Serial GEMM inside one attention work unit (the units are what runs in parallel).
inline void unit_gemm(const float* A, std::size_t lda, const float* B, std::size_t ldb, float* C, std::size_t ldc,
                      std::size_t M, std::size_t N, std::size_t K, bool accumulate = false) {
    gemm(octet::on_host(1), A, lda, B, ldb, C, ldc, M, N, K, accumulate);
}
/// dst (cols x rows, row-major) = src (rows x cols, leading dimension ld)^T.
inline void unit_transpose(const float* src, std::size_t ld, std::size_t rows, std::size_t cols, float* dst) {
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) dst[j * rows + i] = src[i * ld + j];
}
}  // namespace detail

/// O = softmax(Q K^T / sqrt(head_dim)) V per sequence and head with a causal mask, and
/// L = logsumexp of each row's scaled scores (natural log). Per (sequence, head): S = Q K^T by the
/// GEMM above in blocks of 32 query rows, each up to its diagonal (the masked corner of a block is
/// computed and ignored), the softmax row by row in float, O = P V. scratch: workers *
/// attention_scratch_floats(len, head_dim).
inline void attention_forward_f32(octet::host_executor ex, const attention_dims& a, const float* qkv, float* O,
                                  float* lse, float* scratch, std::size_t workers) {
    const std::size_t Hq = a.heads_q, Hk = a.heads_kv, hd = a.head_dim, W = a.qkv_ld(), A = a.o_ld();
    const std::size_t G = Hq / Hk, N = a.tokens(), len = a.len;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for_units(ex, a.batch * Hq, scratch, workers, attention_scratch_floats(len, hd), [&](std::size_t unit, float* s) {
        const std::size_t b = unit / Hq, h = unit % Hq, hk = h / G;
        const float* Q = qkv + b * len * W + h * hd;
        const float* K = qkv + b * len * W + (Hq + hk) * hd;
        const float* V = qkv + b * len * W + (Hq + Hk + hk) * hd;
        float* P = s;               // (len, len)
        float* Kt = s + len * len;  // (hd, len)
        detail::unit_transpose(K, W, len, hd, Kt);
        for (std::size_t i0 = 0; i0 < len; i0 += kAttentionRows) {  // S, up to each row block's diagonal
            const std::size_t i1 = std::min(len, i0 + kAttentionRows);
            detail::unit_gemm(Q + i0 * W, W, Kt, len, P + i0 * len, len, i1 - i0, i1, hd);
        }
        for (std::size_t i = 0; i < len; ++i) {
            float* p = P + i * len;
            float m = -INFINITY;
            for (std::size_t j = 0; j <= i; ++j) m = std::max(m, p[j] *= scale);
            float l = 0;
            for (std::size_t j = 0; j <= i; ++j) l += p[j] = std::exp(p[j] - m);
            const float inv = 1.0f / l;
            for (std::size_t j = 0; j <= i; ++j) p[j] *= inv;
            std::fill(p + i + 1, p + len, 0.0f);
            lse[h * N + b * len + i] = m + std::log(l);
        }
        for (std::size_t i0 = 0; i0 < len; i0 += kAttentionRows) {
            const std::size_t i1 = std::min(len, i0 + kAttentionRows);
            detail::unit_gemm(P + i0 * len, len, V, W, O + (b * len + i0) * A + h * hd, A, i1 - i0, hd, i1);
        }
    });
}

/// FlashAttention's backward in float32: P = exp(scale Q K^T - L) (masked), D = rowsum(dO * O),
/// dV = P^T dO, dS = P (dO V^T - D), dQ = scale dS K, dK = scale dS^T Q. dqkv is laid out like
/// qkv (overwritten). One unit per (sequence, kv head): it owns dK and dV of that head (summed over
/// its query heads in head order) and dQ of its query heads.
inline void attention_backward_f32(octet::host_executor ex, const attention_dims& a, const float* qkv, const float* O,
                                   const float* lse, const float* dO, float* dqkv, float* scratch,
                                   std::size_t workers) {
    const std::size_t Hq = a.heads_q, Hk = a.heads_kv, hd = a.head_dim, W = a.qkv_ld(), A = a.o_ld();
    const std::size_t G = Hq / Hk, N = a.tokens(), len = a.len;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for_units(ex, a.batch * Hk, scratch, workers, attention_scratch_floats(len, hd), [&](std::size_t unit, float* s) {
        const std::size_t b = unit / Hk, hk = unit % Hk;
        const std::size_t row0 = b * len;
        const float* K = qkv + row0 * W + (Hq + hk) * hd;
        const float* V = qkv + row0 * W + (Hq + Hk + hk) * hd;
        float* dK = dqkv + row0 * W + (Hq + hk) * hd;
        float* dV = dqkv + row0 * W + (Hq + Hk + hk) * hd;
        float* P = s;               // (len, len)
        float* dS = P + len * len;  // (len, len)
        float* T = dS + len * len;  // (len, len): a transpose
        float* Kt = T + len * len;  // (hd, len)
        float* Vt = Kt + hd * len;  // (hd, len)
        detail::unit_transpose(K, W, len, hd, Kt);
        detail::unit_transpose(V, W, len, hd, Vt);
        for (std::size_t h = hk * G; h < (hk + 1) * G; ++h) {
            const float* Q = qkv + row0 * W + h * hd;
            const float* gO = dO + row0 * A + h * hd;
            const float* Oh = O + row0 * A + h * hd;
            for (std::size_t i0 = 0; i0 < len; i0 += kAttentionRows) {  // S and dP, up to the diagonal
                const std::size_t i1 = std::min(len, i0 + kAttentionRows);
                detail::unit_gemm(Q + i0 * W, W, Kt, len, P + i0 * len, len, i1 - i0, i1, hd);
                detail::unit_gemm(gO + i0 * A, A, Vt, len, dS + i0 * len, len, i1 - i0, i1, hd);
            }
            for (std::size_t i = 0; i < len; ++i) {
                const float L = lse[h * N + row0 + i];
                float D = 0;
                for (std::size_t c = 0; c < hd; ++c) D += gO[i * A + c] * Oh[i * A + c];
                float* p = P + i * len;
                float* ds = dS + i * len;
                for (std::size_t j = 0; j <= i; ++j) {
                    p[j] = std::exp(p[j] * scale - L);
                    ds[j] = p[j] * (ds[j] - D) * scale;
                }
                std::fill(p + i + 1, p + len, 0.0f);
                std::fill(ds + i + 1, ds + len, 0.0f);
            }
            const bool first = h == hk * G;
            float* dQ = dqkv + row0 * W + h * hd;
            for (std::size_t i0 = 0; i0 < len; i0 += kAttentionRows) {  // dQ = scale dS K (scale is in dS)
                const std::size_t i1 = std::min(len, i0 + kAttentionRows);
                detail::unit_gemm(dS + i0 * len, len, K, W, dQ + i0 * W, W, i1 - i0, hd, i1);
            }
            // dK = scale dS^T Q and dV = P^T dO: key rows j0..j1 see query rows from j0 on
            detail::unit_transpose(dS, len, len, len, T);
            for (std::size_t j0 = 0; j0 < len; j0 += kAttentionRows) {
                const std::size_t j1 = std::min(len, j0 + kAttentionRows);
                detail::unit_gemm(T + j0 * len + j0, len, Q + j0 * W, W, dK + j0 * W, W, j1 - j0, hd, len - j0, !first);
            }
            detail::unit_transpose(P, len, len, len, T);
            for (std::size_t j0 = 0; j0 < len; j0 += kAttentionRows) {
                const std::size_t j1 = std::min(len, j0 + kAttentionRows);
                detail::unit_gemm(T + j0 * len + j0, len, gO + j0 * A, A, dV + j0 * W, W, j1 - j0, hd, len - j0,
                                  !first);
            }
        }
    });
}

}  // namespace common
