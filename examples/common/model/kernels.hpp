// examples/common/model/kernels.hpp: the float32 GEMM, transpose and the vectorizable exp, tanh,
// softmax and GELU the transformer (../model.hpp) computes with.
#pragma once

#include "base.hpp"

namespace common {

// =================================================================================================
// float32 GEMM: C (M x N) = A (M x K) B (K x N) [+ C], all row-major with leading dimensions.
// =================================================================================================

namespace detail {

/// One band of rows of C, in MR x NR register tiles over K blocks of KC. Every element of C sums
/// its K products in order k = 0, 1, ... (the blocking only splits the sum, never reorders it), so
/// results do not depend on the blocking or on how rows are split among threads.
template <std::size_t MR, std::size_t NR>
struct gemm_band_kernel {
    static constexpr std::size_t KC = 256;

    template <std::size_t R>
    OCTET_KERNEL_INLINE static void tile(const float* A, std::size_t lda, const float* B, std::size_t ldb, float* C,
                                         std::size_t ldc, std::size_t kc, bool load) {
        float acc[R][NR];
        for (std::size_t r = 0; r < R; ++r)
            for (std::size_t j = 0; j < NR; ++j) acc[r][j] = load ? C[r * ldc + j] : 0.0f;
        for (std::size_t k = 0; k < kc; ++k) {
            const float* b = B + k * ldb;
            for (std::size_t r = 0; r < R; ++r) {
                const float a = A[r * lda + k];
                for (std::size_t j = 0; j < NR; ++j) acc[r][j] += a * b[j];
            }
        }
        for (std::size_t r = 0; r < R; ++r)
            for (std::size_t j = 0; j < NR; ++j) C[r * ldc + j] = acc[r][j];
    }

    OCTET_KERNEL_INLINE static void run(const float* A, std::size_t lda, const float* B, std::size_t ldb, float* C,
                                        std::size_t ldc, std::size_t m, std::size_t N, std::size_t K, bool accumulate) {
        const std::size_t n_full = N / NR * NR;
        if (K == 0 && !accumulate)
            for (std::size_t i = 0; i < m; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
        for (std::size_t k0 = 0; k0 < K; k0 += KC) {
            const std::size_t kc = std::min(KC, K - k0);
            const bool load = accumulate || k0 > 0;
            for (std::size_t j0 = 0; j0 < n_full; j0 += NR) {
                std::size_t i = 0;
                for (; i + MR <= m; i += MR)
                    tile<MR>(A + i * lda + k0, lda, B + k0 * ldb + j0, ldb, C + i * ldc + j0, ldc, kc, load);
                for (; i < m; ++i)
                    tile<1>(A + i * lda + k0, lda, B + k0 * ldb + j0, ldb, C + i * ldc + j0, ldc, kc, load);
            }
            for (std::size_t i = 0; i < m && n_full < N; ++i) {  // the last N % NR columns
                float* c = C + i * ldc;
                if (!load)
                    for (std::size_t j = n_full; j < N; ++j) c[j] = 0.0f;
                for (std::size_t k = 0; k < kc; ++k) {
                    const float a = A[i * lda + k0 + k];
                    const float* b = B + (k0 + k) * ldb;
                    for (std::size_t j = n_full; j < N; ++j) c[j] += a * b[j];
                }
            }
        }
    }
};

/// Register tiles per instruction set: 4 x 64 (16 of AVX-512's 32 registers), else 4 x 16.
inline void gemm_band(octet::detail::simd_isa isa, const float* A, std::size_t lda, const float* B, std::size_t ldb,
                      float* C, std::size_t ldc, std::size_t m, std::size_t N, std::size_t K, bool accumulate) {
    if (isa == octet::detail::simd_isa::avx512)
        octet::detail::run_kernel<gemm_band_kernel<4, 64>>(isa, A, lda, B, ldb, C, ldc, m, N, K, accumulate);
    else
        octet::detail::run_kernel<gemm_band_kernel<4, 16>>(isa, A, lda, B, ldb, C, ldc, m, N, K, accumulate);
}

}  // namespace detail

/// C = A B (accumulate: C += A B) in float32, parallel over bands of C's rows. The kernel is
/// compiled for the CPU's best instruction set (octet's isa dispatch); with AVX-512 the compiler
/// fuses the multiply-adds, so bits can differ between machines but never between runs or thread
/// counts on one machine. Measured on the model's shapes (2048 x 384 x 128 to 512^3) on an AVX-512
/// EPYC core: about 70-105 GFLOP/s of CPU time per thread.
inline void gemm(octet::host_executor ex, const float* A, std::size_t lda, const float* B, std::size_t ldb, float* C,
                 std::size_t ldc, std::size_t M, std::size_t N, std::size_t K, bool accumulate = false) {
    if (M == 0 || N == 0) return;
    const octet::detail::simd_isa isa = octet::detail::best_isa();
    // Bands of 4 rows; at least ~1 MFLOP per thread's share so small products stay on one thread.
    constexpr std::size_t band = 4;
    const std::size_t work_per_row = std::max<std::size_t>(1, N * std::max<std::size_t>(K, 1));
    const std::size_t min_rows = std::max<std::size_t>(band, (std::size_t{1} << 19) / work_per_row);
    const std::size_t bands = (M + band - 1) / band;
    octet::parallel_for(ex, bands, std::max<std::size_t>(1, min_rows / band), [&](std::size_t b0, std::size_t b1) {
        const std::size_t r0 = b0 * band, r1 = std::min(M, b1 * band);
        detail::gemm_band(isa, A + r0 * lda, lda, B, ldb, C + r0 * ldc, ldc, r1 - r0, N, K, accumulate);
    });
}

/// dst (cols x rows) = src (rows x cols)^T, row-major both, in 32 x 32 blocks.
inline void transpose(octet::host_executor ex, const float* src, std::size_t rows, std::size_t cols, float* dst) {
    constexpr std::size_t T = 32;
    octet::parallel_for(ex, (rows + T - 1) / T, 8, [&](std::size_t b0, std::size_t b1) {
        for (std::size_t i0 = b0 * T; i0 < std::min(rows, b1 * T); i0 += T)
            for (std::size_t j0 = 0; j0 < cols; j0 += T)
                for (std::size_t i = i0; i < std::min(rows, i0 + T); ++i)
                    for (std::size_t j = j0; j < std::min(cols, j0 + T); ++j) dst[j * rows + i] = src[i * cols + j];
    });
}

/// e^x in float for x in [-87, 88] (clamped; NaN stays NaN), within a few ulp: 2^n e^r with n = round(x log2 e),
/// r = x - n ln 2 (two-part ln 2), e^r by its degree-6 Taylor polynomial (|r| <= 0.35: truncation
/// below 1.3e-7 relative). Branch-free (selects, not branches), so loops calling it vectorize.
inline float exp_approx(float x_in) {
    float x = x_in > -87.0f ? x_in : -87.0f;  // NaN becomes -87 here (no undefined int conversion) ...
    x = x < 88.0f ? x : 88.0f;
    const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  // round to nearest (|n| < 2^22)
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;    // ln 2 = 0.693359375 - 2.12194440e-4
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const float y = p * octet::bits_to_float(static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23);
    return x_in == x_in ? y : x_in;  // ... and comes back out as NaN
}

/// tanh(z) = (e^2z - 1) / (e^2z + 1), |z| clamped to 9 (where tanh rounds to +-1 in float); its
/// absolute error is a few 1e-8 (near 0 the relative error grows, which GELU's 1 + tanh ignores).
inline float tanh_approx(float z) {
    z = z < -9.0f ? -9.0f : (z > 9.0f ? 9.0f : z);
    const float e = exp_approx(2.0f * z);
    return (e - 1.0f) / (e + 1.0f);
}

/// A row of logits' softmax in double: its max m, sum_v e^(z_v - m), log-sum-exp and entropy
/// -sum_v p_v log p_v.
struct softmax_row {
    double max = 0, sum = 0, lse = 0, entropy = 0;
    double logp(float z) const { return static_cast<double>(z) - lse; }
};
inline softmax_row softmax_of(const float* z, std::size_t V) {
    softmax_row r;
    r.max = *std::max_element(z, z + V);
    double zs = 0;
    for (std::size_t v = 0; v < V; ++v) {
        const double d = static_cast<double>(z[v]) - r.max, e = std::exp(d);
        r.sum += e;
        zs += e * d;
    }
    r.lse = r.max + std::log(r.sum);
    r.entropy = std::log(r.sum) - zs / r.sum;  // lse - E[z] = -sum p log p
    return r;
}

namespace detail {
inline constexpr float gelu_c = 0.7978845608028654f;  // sqrt(2 / pi)

/// GELU, tanh approximation: a = u (1 + tanh(c (u + 0.044715 u^3))) / 2. Dispatched per ISA
/// (std::tanh does not vectorize and cost a third of a float32 step).
struct gelu_forward_kernel {
    OCTET_KERNEL_INLINE static void run(const float* u, float* a, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) {
            const float v = u[i];
            a[i] = 0.5f * v * (1.0f + tanh_approx(gelu_c * (v + 0.044715f * v * v * v)));
        }
    }
};
/// da *= gelu'(u) = (1 + t) / 2 + u (1 - t^2) c (1 + 3 * 0.044715 u^2) / 2, t = tanh(c (u + 0.044715 u^3)).
struct gelu_backward_kernel {
    OCTET_KERNEL_INLINE static void run(const float* u, float* da, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) {
            const float v = u[i];
            const float t = tanh_approx(gelu_c * (v + 0.044715f * v * v * v));
            da[i] *= 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * gelu_c * (1.0f + 3.0f * 0.044715f * v * v);
        }
    }
};
}  // namespace detail

}  // namespace common
