// octet/gemm/cublaslt.cuh: the cuBLASLt backend of octet::scaled_gemm (gemm_backend::cublaslt).
//
// Include this header instead of (or before) octet/gemm/scaled_gemm.cuh and link CUDA::cublasLt;
// it then takes part in automatic selection (after octet's own kernels) and can be requested by name.
//
// How octet's recipes map onto cuBLASLt's FP8 scale modes (CUDA 12.9+, Hopper):
//   tensor x tensor  -> SCALAR_32F on both            (the one float octet stores)
//   row x row        -> OUTER_VEC_32F on both         (octet's per-row scale column, used in place)
//   1x128            -> VEC128_32F                    (scales [K/128][roundup(rows, 4)], rows contiguous:
//                                                      octet's padded layout already is this, except
//                                                      for a single row or an unpadded grid, which are
//                                                      copied into that layout first)
//   128x128          -> BLK128x128_32F                (scales [rows/128][roundup(K/128, 4)], K blocks
//                                                      contiguous: octet stores the transpose, so the
//                                                      grid is transposed into a scratch buffer)
//   pairs cuBLASLt accepts: tensor x tensor, row x row, 1x128 x 1x128, 1x128 x 128x128, 128x128 x 1x128
//   (not 128x128 x 128x128, not E5M2 x E5M2). Fast accumulation is off: cuBLASLt promotes its
//   accumulator itself (its interval is not documented; octet's promotion_interval does not apply).
//   MX (VEC32_UE8M0) and NVFP4 (VEC16_UE4M3) modes are Blackwell-only in cuBLASLt and their scales
//   use a swizzled 128x4 layout; octet does not map them. NVFP4 x NVFP4 instead takes a
//   dequantizing path (Hopper has no FP4 tensor cores): both operands are expanded to BF16 as
//   code x E4M3 block scale (exact: at most 2 + 4 significant bits), multiplied by cuBLASLt's BF16
//   GEMM, and the two per-tensor scales are folded into alpha on the device.
// Layout in cuBLASLt's column-major terms: FP8 needs "TN", so a row-major D (M x N) is computed as
// D^T = B A^T with cuBLASLt's A = octet's B; a column-major D as D = A B^T. The bias epilogue adds
// along cuBLASLt's rows, so a bias needs a row-major D; C must have D's type and layout; the bias is
// rounded to the type cuBLASLt requires (bf16 for float/bf16 D, fp16 for fp16 D; float for the BF16
// path with float D), which the error bound does not cover (see the tests).
#pragma once

#if defined(OCTET_GEMM_SCALED_GEMM_CUH_INCLUDED) && !defined(OCTET_GEMM_WITH_CUBLASLT)
#error "octet: include octet/gemm/cublaslt.cuh before octet/gemm/scaled_gemm.cuh (or only cublaslt.cuh)"
#endif
#define OCTET_GEMM_WITH_CUBLASLT 1

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "octet/gemm/detail/device_common.cuh"

namespace octet {
namespace detail {

inline void cublas_check(cublasStatus_t s, const char* what) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    throw error(message("octet::scaled_gemm (cublaslt): ", what, " failed: ", cublasLtGetStatusName(s), " (", cublasLtGetStatusString(s), ")"));
}

/// One cuBLASLt handle and a 32 MiB workspace per device, created on first use and kept for the
/// life of the process (destroying them at exit could run after the CUDA context is gone).
struct cublaslt_context {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
    std::size_t workspace_bytes = std::size_t{32} << 20;
};
inline cublaslt_context& cublaslt_ctx() {
    int device = 0;
    OCTET_CUDA_CHECK(cudaGetDevice(&device));
    static cublaslt_context ctx[64];
    OCTET_REQUIRE(device < 64, "octet::scaled_gemm", "device", "index is 64 or more");
    cublaslt_context& c = ctx[device];
    if (!c.handle) {
        cublas_check(cublasLtCreate(&c.handle), "cublasLtCreate");
        OCTET_CUDA_CHECK(cudaMalloc(&c.workspace, c.workspace_bytes));
    }
    return c;
}

struct lt_matmul_desc {
    cublasLtMatmulDesc_t d = nullptr;
    lt_matmul_desc(cublasComputeType_t c, cudaDataType_t s) { cublas_check(cublasLtMatmulDescCreate(&d, c, s), "cublasLtMatmulDescCreate"); }
    ~lt_matmul_desc() { cublasLtMatmulDescDestroy(d); }
    template <class T>
    void set(cublasLtMatmulDescAttributes_t a, const T& v) {
        cublas_check(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(T)), "cublasLtMatmulDescSetAttribute");
    }
};
struct lt_layout {
    cublasLtMatrixLayout_t d = nullptr;
    lt_layout(cudaDataType_t t, std::uint64_t rows, std::uint64_t cols, std::int64_t ld) {
        cublas_check(cublasLtMatrixLayoutCreate(&d, t, rows, cols, ld), "cublasLtMatrixLayoutCreate");
    }
    ~lt_layout() { cublasLtMatrixLayoutDestroy(d); }
};
struct lt_preference {
    cublasLtMatmulPreference_t d = nullptr;
    explicit lt_preference(std::size_t ws) {
        cublas_check(cublasLtMatmulPreferenceCreate(&d), "cublasLtMatmulPreferenceCreate");
        cublas_check(cublasLtMatmulPreferenceSetAttribute(d, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
                     "cublasLtMatmulPreferenceSetAttribute");
    }
    ~lt_preference() { cublasLtMatmulPreferenceDestroy(d); }
};

/// Device scratch freed on the stream when it goes out of scope.
struct stream_scratch {
    void* p = nullptr;
    cudaStream_t s = nullptr;
    stream_scratch(std::size_t bytes, cudaStream_t stream) : s(stream) {
        if (bytes) OCTET_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream));
    }
    ~stream_scratch() {
        if (p) cudaFreeAsync(p, s);
    }
    stream_scratch(const stream_scratch&) = delete;
    stream_scratch& operator=(const stream_scratch&) = delete;
};

template <class T>
cudaDataType_t cuda_type() {
    if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
    else if constexpr (std::is_same_v<T, bf16>) return CUDA_R_16BF;
    else if constexpr (std::is_same_v<T, fp16>) return CUDA_R_16F;
    else if constexpr (std::is_same_v<T, e4m3>) return CUDA_R_8F_E4M3;
    else return CUDA_R_8F_E5M2;
}

/// VEC128_32F layout: dst[kb * dst_ld + r] = src[kb * src_ld + r]; rows past `rows` are zero.
__global__ void lt_relayout_vec128(const float* src, std::size_t src_ld, float* dst, std::size_t dst_ld, std::uint32_t rows, std::uint32_t kblocks) {
    const std::size_t n = static_cast<std::size_t>(kblocks) * dst_ld;
    for (std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < n; t += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t kb = t / dst_ld, r = t % dst_ld;
        dst[t] = r < rows ? src[kb * src_ld + r] : 0.0f;
    }
}
/// BLK128x128_32F layout: dst[rb * dst_ld + kb] = src[kb * src_ld + rb]; K blocks past kblocks are zero.
__global__ void lt_relayout_blk128(const float* src, std::size_t src_ld, float* dst, std::size_t dst_ld, std::uint32_t rblocks, std::uint32_t kblocks) {
    const std::size_t n = static_cast<std::size_t>(rblocks) * dst_ld;
    for (std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < n; t += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t rb = t / dst_ld, kb = t % dst_ld;
        dst[t] = kb < kblocks ? src[kb * src_ld + rb] : 0.0f;
    }
}
template <class T>
__global__ void lt_convert_bias(const float* in, T* out, std::uint32_t n) {
    for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = store_from_float<T>(in[i]);
}
/// NVFP4 operand -> BF16 values code x E4M3 block scale (exact), rows of `ld` bf16, zero-padded.
template <class Recipe>
__global__ void lt_expand_fp4(quantized_cref<Recipe> q, bf16* out, std::size_t ld) {
    using Fmt = typename Recipe::format;
    const std::size_t rows = q.rows(), cols = q.cols();
    for (std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < rows * ld;
         t += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t i = t / ld, k = t % ld;
        float v = 0.0f;
        if (k < cols) {
            const float s = stored_scale_value<Recipe>(q.stored_scale(i / q.layout.block_rows, k / q.layout.block_cols), 1.0f);
            v = decode<Fmt>(load_code<Fmt>(q.data + i * q.layout.row_bytes, k)) * s;
        }
        out[t] = to_bf16(v);
    }
}
/// alpha_beta[0] = alpha * tsA * tsB, alpha_beta[1] = beta (device pointer mode).
__global__ void lt_fold_tensor_scales(const float* tsa, const float* tsb, float alpha, float beta, float* alpha_beta) {
    alpha_beta[0] = alpha * (*tsa * *tsb);
    alpha_beta[1] = beta;
}

template <class RA, class RB, class CT, class DT>
void run_cublaslt_impl(cudaStream_t stream, const quantized_cref<RA>& A, const quantized_cref<RB>& B, const matrix_ref<const CT>* C, const matrix_ref<DT>& D,
                  const gemm_options& opt) {
    constexpr const char* fn = "octet::scaled_gemm";
    using TA = gemm_operand_traits<RA>;
    using TB = gemm_operand_traits<RB>;
    constexpr bool fp4_path = TA::nvfp4_like && TB::nvfp4_like;
    const std::size_t M = A.rows(), N = B.rows(), K = A.cols();
    if (M == 0 || N == 0) return;
    OCTET_REQUIRE(K > 0, fn, "A", "has K = 0; the cublaslt backend needs K > 0 (use sm89_mma or the host)");
    OCTET_REQUIRE(!C || (std::is_same_v<CT, DT>), fn, "C", "must have D's type for the cublaslt backend");
    OCTET_REQUIRE(!C || C->order == D.order, fn, "C", "must have D's layout for the cublaslt backend");
    OCTET_REQUIRE(opt.bias.empty() || D.order == layout::row_major, fn, "options.bias",
                  "needs a row-major D with the cublaslt backend (its bias epilogue runs along the other dimension)");
    if constexpr (fp4_path)
        OCTET_REQUIRE((!std::is_same_v<DT, fp16>), fn, "D", "must be float or bf16 for the cublaslt NVFP4 path (a BF16 GEMM)");

    cublaslt_context& ctx = cublaslt_ctx();
    const bool d_row = D.order == layout::row_major;
    // cuBLASLt computes X (m x n, column-major) = op(P) op(Q) with P = first, Q = second operand.
    const std::size_t m = d_row ? N : M, n = d_row ? M : N;
    const float alpha = opt.alpha, beta = C ? opt.beta : 0.0f;

    lt_matmul_desc desc(CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    desc.set(CUBLASLT_MATMUL_DESC_TRANSA, op_t);
    desc.set(CUBLASLT_MATMUL_DESC_TRANSB, op_n);

    // Scratch: re-laid scales, bias in cuBLASLt's type, expanded FP4 operands, device alpha/beta.
    std::unique_ptr<stream_scratch> sa_buf, sb_buf, bias_buf, pa_buf, pb_buf, ab_buf;
    const void* p_first = nullptr;
    const void* p_second = nullptr;
    std::size_t ld_first = 0, ld_second = 0;
    cudaDataType_t t_first, t_second;
    const unsigned blocks = 256;

    if constexpr (fp4_path) {
        const std::size_t ldk = (K + 7) / 8 * 8;  // 16-byte rows of bf16
        pa_buf = std::make_unique<stream_scratch>(M * ldk * sizeof(bf16), stream);
        pb_buf = std::make_unique<stream_scratch>(N * ldk * sizeof(bf16), stream);
        lt_expand_fp4<RA><<<cuda::grid_stride_blocks(M * ldk, blocks), blocks, 0, stream>>>(A, static_cast<bf16*>(pa_buf->p), ldk);
        OCTET_CUDA_CHECK_LAUNCH();
        lt_expand_fp4<RB><<<cuda::grid_stride_blocks(N * ldk, blocks), blocks, 0, stream>>>(B, static_cast<bf16*>(pb_buf->p), ldk);
        OCTET_CUDA_CHECK_LAUNCH();
        ab_buf = std::make_unique<stream_scratch>(2 * sizeof(float), stream);
        lt_fold_tensor_scales<<<1, 1, 0, stream>>>(A.tensor_scale, B.tensor_scale, alpha, beta, static_cast<float*>(ab_buf->p));
        OCTET_CUDA_CHECK_LAUNCH();
        const cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
        desc.set(CUBLASLT_MATMUL_DESC_POINTER_MODE, pm);
        p_first = d_row ? pb_buf->p : pa_buf->p;
        p_second = d_row ? pa_buf->p : pb_buf->p;
        ld_first = ld_second = ldk;
        t_first = t_second = CUDA_R_16BF;
    } else {
        // Scale pointers and modes of one octet operand (rows x K).
        auto scales_of = [&](auto q, std::unique_ptr<stream_scratch>& buf, std::int32_t& mode) -> const void* {
            using T = gemm_operand_traits<typename decltype(q)::recipe_type>;
            const std::size_t rows = q.rows(), kblocks = (K + 127) / 128;
            const float* s = reinterpret_cast<const float*>(q.scales);
            if constexpr (T::per_tensor) {
                mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
                return s;
            } else if constexpr (T::per_row) {
                mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
                return s;
            } else if constexpr (T::vec128) {
                mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
                const std::size_t want_ld = (rows + 3) / 4 * 4;
                if (q.layout.scale_ld == want_ld) return s;
                buf = std::make_unique<stream_scratch>(kblocks * want_ld * sizeof(float), stream);
                lt_relayout_vec128<<<cuda::grid_stride_blocks(kblocks * want_ld, blocks), blocks, 0, stream>>>(
                    s, q.layout.scale_ld, static_cast<float*>(buf->p), want_ld, static_cast<std::uint32_t>(rows), static_cast<std::uint32_t>(kblocks));
                OCTET_CUDA_CHECK_LAUNCH();
                return buf->p;
            } else {
                mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
                const std::size_t rblocks = (rows + 127) / 128, want_ld = (kblocks + 3) / 4 * 4;
                buf = std::make_unique<stream_scratch>(rblocks * want_ld * sizeof(float), stream);
                lt_relayout_blk128<<<cuda::grid_stride_blocks(rblocks * want_ld, blocks), blocks, 0, stream>>>(
                    s, q.layout.scale_ld, static_cast<float*>(buf->p), want_ld, static_cast<std::uint32_t>(rblocks), static_cast<std::uint32_t>(kblocks));
                OCTET_CUDA_CHECK_LAUNCH();
                return buf->p;
            }
        };
        std::int32_t mode_a = 0, mode_b = 0;
        const void* scale_a = scales_of(A, sa_buf, mode_a);
        const void* scale_b = scales_of(B, sb_buf, mode_b);
        const void* scale_first = d_row ? scale_b : scale_a;
        const void* scale_second = d_row ? scale_a : scale_b;
        desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, scale_first);
        desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scale_second);
        desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, d_row ? mode_b : mode_a);
        desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, d_row ? mode_a : mode_b);
        const std::int8_t fast_accum = 0;
        desc.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum);
        p_first = d_row ? B.data : A.data;
        p_second = d_row ? A.data : B.data;
        ld_first = d_row ? B.layout.row_bytes : A.layout.row_bytes;
        ld_second = d_row ? A.layout.row_bytes : B.layout.row_bytes;
        t_first = d_row ? cuda_type<typename RB::format>() : cuda_type<typename RA::format>();
        t_second = d_row ? cuda_type<typename RA::format>() : cuda_type<typename RB::format>();
    }

    if (!opt.bias.empty()) {
        // cuBLASLt's bias type: FP8 inputs take bf16 (float or bf16 D) or fp16 (fp16 D); BF16 inputs take D's type.
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
        const void* bias_ptr = nullptr;
        std::int32_t bias_type;
        const std::uint32_t nb = static_cast<std::uint32_t>(N);
        if (fp4_path && std::is_same_v<DT, float>) {
            bias_ptr = opt.bias.data();
            bias_type = CUDA_R_32F;
        } else if (std::is_same_v<DT, fp16>) {
            bias_buf = std::make_unique<stream_scratch>(N * sizeof(fp16), stream);
            lt_convert_bias<fp16><<<cuda::grid_stride_blocks(N, blocks), blocks, 0, stream>>>(opt.bias.data(), static_cast<fp16*>(bias_buf->p), nb);
            bias_ptr = bias_buf->p;
            bias_type = CUDA_R_16F;
        } else {
            bias_buf = std::make_unique<stream_scratch>(N * sizeof(bf16), stream);
            lt_convert_bias<bf16><<<cuda::grid_stride_blocks(N, blocks), blocks, 0, stream>>>(opt.bias.data(), static_cast<bf16*>(bias_buf->p), nb);
            bias_ptr = bias_buf->p;
            bias_type = CUDA_R_16BF;
        }
        OCTET_CUDA_CHECK_LAUNCH();
        desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_ptr);
        desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
    }

    const lt_layout la(t_first, K, m, static_cast<std::int64_t>(ld_first));
    const lt_layout lb(t_second, K, n, static_cast<std::int64_t>(ld_second));
    const lt_layout ld(cuda_type<DT>(), m, n, static_cast<std::int64_t>(D.ld));
    const lt_layout lc(cuda_type<DT>(), m, n, static_cast<std::int64_t>(C ? C->ld : D.ld));
    const lt_preference pref(ctx.workspace_bytes);
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(ctx.handle, desc.d, la.d, lb.d, lc.d, ld.d, pref.d, 1, &heuristic, &found);
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0)
        throw error(message("octet::scaled_gemm (cublaslt): cuBLASLt has no algorithm for ", recipe_description<RA>(), " x ",
                            recipe_description<RB>(), ", M=", M, " N=", N, " K=", K, " on this GPU (", cublasLtGetStatusName(hs),
                            "); use gemm_backend::sm90_wgmma, sm89_mma or host"));
    const void* c_ptr = C ? static_cast<const void*>(C->data) : static_cast<const void*>(D.data);
    if constexpr (fp4_path) {
        const float* ab = static_cast<const float*>(ab_buf->p);
        cublas_check(cublasLtMatmul(ctx.handle, desc.d, ab, p_first, la.d, p_second, lb.d, ab + 1, c_ptr, lc.d, D.data, ld.d, &heuristic.algo,
                                    ctx.workspace, ctx.workspace_bytes, stream),
                     "cublasLtMatmul");
    } else {
        cublas_check(cublasLtMatmul(ctx.handle, desc.d, &alpha, p_first, la.d, p_second, lb.d, &beta, c_ptr, lc.d, D.data, ld.d, &heuristic.algo,
                                    ctx.workspace, ctx.workspace_bytes, stream),
                     "cublasLtMatmul");
    }
}

/// Recipe pairs the backend maps (gemm_backend_support has the rules and the messages).
template <class RA, class RB>
inline constexpr bool cublaslt_maps_pair_v =
    (gemm_operand_traits<RA>::nvfp4_like && gemm_operand_traits<RB>::nvfp4_like) ||
    (gemm_operand_traits<RA>::tensor_core_fp8 && gemm_operand_traits<RB>::tensor_core_fp8 && gemm_operand_traits<RA>::f32_scales &&
     gemm_operand_traits<RB>::f32_scales &&
     ((gemm_operand_traits<RA>::per_tensor && gemm_operand_traits<RB>::per_tensor) ||
      (gemm_operand_traits<RA>::per_row && gemm_operand_traits<RB>::per_row) ||
      ((gemm_operand_traits<RA>::vec128 || gemm_operand_traits<RA>::blk128) && (gemm_operand_traits<RB>::vec128 || gemm_operand_traits<RB>::blk128))));

template <class RA, class RB, class CT, class DT>
void run_cublaslt(cudaStream_t stream, const quantized_cref<RA>& A, const quantized_cref<RB>& B, const matrix_ref<const CT>* C, const matrix_ref<DT>& D,
                  const gemm_options& opt) {
    if constexpr (cublaslt_maps_pair_v<RA, RB>) run_cublaslt_impl<RA, RB, CT, DT>(stream, A, B, C, D, opt);
    else throw error("octet::scaled_gemm: the cublaslt backend does not map " + recipe_description<RA>() + " x " + recipe_description<RB>());
}

}  // namespace detail
}  // namespace octet

#include "octet/gemm/scaled_gemm.cuh"
