// octet/gemm/detail/cublaslt_args.cuh: the recipe-dependent half of the cuBLASLt backend.
//
// scaled_gemm.cuh turns a problem into cublaslt_matmul_args here (octet's own kernels re-lay scales,
// convert the bias and expand NVFP4 operands) and hands them to the function the executor carries
// (stream_executor::cublaslt, set by octet::with_cublaslt in octet/gemm/cublaslt.cuh), which makes
// the cuBLASLt calls. So whether cuBLASLt is used is a property of the executor a call receives,
// the same in every translation unit, and only programs that include cublaslt.cuh reference
// cuBLASLt's symbols. The mapping of recipes onto cuBLASLt's modes is described in cublaslt.cuh.
#pragma once

#include <cuda_runtime.h>
#include <library_types.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "octet/cuda/executor.cuh"
#include "octet/gemm/detail/device_common.cuh"

namespace octet {
namespace detail {

/// cuBLASLt's scale modes octet uses (cublasLtMatmulMatrixScale_t; none: no scale pointer).
enum class lt_scale_mode : int { none, scalar_32f, outer_vec_32f, vec128_32f, blk128x128_32f };

/// One cuBLASLt matmul in cuBLASLt's column-major terms: X (m x n) = op(first)^T op(second), K deep
/// ("TN"), X = alpha * X + beta * C (+ bias along m). Pointers are device memory.
struct cublaslt_matmul_args {
    std::size_t m = 0, n = 0, k = 0;
    const void* first = nullptr;
    const void* second = nullptr;
    std::size_t ld_first = 0, ld_second = 0;
    cudaDataType_t type_first = CUDA_R_8F_E4M3, type_second = CUDA_R_8F_E4M3;
    const void* scale_first = nullptr;  ///< FP8 only
    const void* scale_second = nullptr;
    lt_scale_mode mode_first = lt_scale_mode::none, mode_second = lt_scale_mode::none;
    float alpha = 1.0f, beta = 0.0f;
    const float* device_alpha_beta = nullptr;  ///< set: alpha and beta are read from the device (2 floats)
    const void* bias = nullptr;                ///< null: no bias epilogue
    cudaDataType_t bias_type = CUDA_R_32F;
    const void* c = nullptr;  ///< D when there is no C (beta is then 0)
    std::size_t ldc = 0;
    void* d = nullptr;
    std::size_t ldd = 0;
    cudaDataType_t type_d = CUDA_R_32F;
    std::string problem;  ///< "A x B, M=.. N=.. K=..", for error messages
};

/// The temporaries of one cublaslt-backend call (bytes; 0: none), in the order they are requested:
/// expanded NVFP4 operands and the device alpha/beta (NVFP4 path), re-laid scale grids (VEC128 when
/// octet's grid is not already cuBLASLt's, BLK128x128 always), the bias in cuBLASLt's type.
struct lt_scratch_plan {
    std::size_t expand_a = 0, expand_b = 0, alpha_beta = 0, scales_a = 0, scales_b = 0, bias = 0;
    std::size_t total() const {
        return scratch_round(expand_a) + scratch_round(expand_b) + scratch_round(alpha_beta) + scratch_round(scales_a) +
               scratch_round(scales_b) + scratch_round(bias);
    }
};

/// Scale-grid bytes cuBLASLt needs re-laid for one operand (rows x K), 0 when used in place.
template <class Recipe>
std::size_t lt_relayout_bytes(const quantized_cref<Recipe>& q, std::size_t K) {
    using T = gemm_operand_traits<Recipe>;
    const std::size_t rows = q.rows(), kblocks = (K + 127) / 128;
    if constexpr (T::per_tensor || T::per_row || T::nvfp4_like) {
        return 0;
    } else if constexpr (T::vec128) {
        const std::size_t want_ld = (rows + 3) / 4 * 4;
        return q.layout.scale_ld == want_ld ? 0 : kblocks * want_ld * sizeof(float);
    } else if constexpr (T::blk128) {
        return (rows + 127) / 128 * ((kblocks + 3) / 4 * 4) * sizeof(float);
    } else {
        return 0;  // a recipe the backend does not map
    }
}

template <class RA, class RB, class DT>
lt_scratch_plan lt_scratch_for(const quantized_cref<RA>& A, const quantized_cref<RB>& B, const gemm_options& opt) {
    constexpr bool fp4_path = gemm_operand_traits<RA>::nvfp4_like && gemm_operand_traits<RB>::nvfp4_like;
    const std::size_t M = A.rows(), N = B.rows(), K = A.cols();
    lt_scratch_plan p;
    if (M == 0 || N == 0 || K == 0) return p;
    if constexpr (fp4_path) {
        const std::size_t ldk = (K + 7) / 8 * 8;
        p.expand_a = M * ldk * sizeof(bf16);
        p.expand_b = N * ldk * sizeof(bf16);
        p.alpha_beta = 2 * sizeof(float);
    } else {
        p.scales_a = lt_relayout_bytes(A, K);
        p.scales_b = lt_relayout_bytes(B, K);
    }
    if (!opt.bias.empty() && !(fp4_path && std::is_same_v<DT, float>))
        p.bias = N * (std::is_same_v<DT, fp16> ? sizeof(fp16) : sizeof(bf16));
    return p;
}

template <class T>
cudaDataType_t cuda_type() {
    if constexpr (std::is_same_v<T, float>)
        return CUDA_R_32F;
    else if constexpr (std::is_same_v<T, bf16>)
        return CUDA_R_16BF;
    else if constexpr (std::is_same_v<T, fp16>)
        return CUDA_R_16F;
    else if constexpr (std::is_same_v<T, e4m3>)
        return CUDA_R_8F_E4M3;
    else
        return CUDA_R_8F_E5M2;
}

/// VEC128_32F layout: dst[kb * dst_ld + r] = src[kb * src_ld + r]; rows past `rows` are zero.
OCTET_KERNEL void lt_relayout_vec128(const float* src, std::size_t src_ld, float* dst, std::size_t dst_ld,
                                     std::uint32_t rows, std::uint32_t kblocks) {
    const std::size_t n = static_cast<std::size_t>(kblocks) * dst_ld;
    for (std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < n;
         t += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t kb = t / dst_ld, r = t % dst_ld;
        dst[t] = r < rows ? src[kb * src_ld + r] : 0.0f;
    }
}
/// BLK128x128_32F layout: dst[rb * dst_ld + kb] = src[kb * src_ld + rb]; K blocks past kblocks are zero.
OCTET_KERNEL void lt_relayout_blk128(const float* src, std::size_t src_ld, float* dst, std::size_t dst_ld,
                                     std::uint32_t rblocks, std::uint32_t kblocks) {
    const std::size_t n = static_cast<std::size_t>(rblocks) * dst_ld;
    for (std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < n;
         t += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t rb = t / dst_ld, kb = t % dst_ld;
        dst[t] = kb < kblocks ? src[kb * src_ld + rb] : 0.0f;
    }
}
template <class T>
OCTET_KERNEL void lt_convert_bias(const float* in, T* out, std::uint32_t n) {
    for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = store_from_float<T>(in[i]);
}
/// NVFP4 operand -> BF16 values code x E4M3 block scale (exact), rows of `ld` bf16, zero-padded.
template <class Recipe>
OCTET_KERNEL void lt_expand_fp4(quantized_cref<Recipe> q, bf16* out, std::size_t ld) {
    using Fmt = typename Recipe::format;
    const std::size_t rows = q.rows(), cols = q.cols();
    for (std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < rows * ld;
         t += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t i = t / ld, k = t % ld;
        float v = 0.0f;
        if (k < cols) {
            const float s =
                stored_scale_value<Recipe>(q.stored_scale(i / q.layout.block_rows, k / q.layout.block_cols), 1.0f);
            v = decode<Fmt>(load_code<Fmt>(q.data + i * q.layout.row_bytes, k)) * s;
        }
        out[t] = to_bf16(v);
    }
}
/// alpha_beta[0] = alpha * tsA * tsB, alpha_beta[1] = beta (device pointer mode).
OCTET_KERNEL void lt_fold_tensor_scales(const float* tsa, const float* tsb, float alpha, float beta,
                                        float* alpha_beta) {
    alpha_beta[0] = alpha * (*tsa * *tsb);
    alpha_beta[1] = beta;
}

template <class RA, class RB, class CT, class DT>
void run_cublaslt_impl(const stream_executor& ex, const quantized_cref<RA>& A, const quantized_cref<RB>& B,
                       const matrix_ref<const CT>* C, const matrix_ref<DT>& D, const gemm_options& opt) {
    constexpr const char* fn = "octet::scaled_gemm";
    using TA = gemm_operand_traits<RA>;
    using TB = gemm_operand_traits<RB>;
    constexpr bool fp4_path = TA::nvfp4_like && TB::nvfp4_like;
    const std::size_t M = A.rows(), N = B.rows(), K = A.cols();
    if (M == 0 || N == 0) return;
    OCTET_REQUIRE(K > 0, fn, "A", "has K = 0; the cublaslt backend needs K > 0 (use sm89_mma or the host)");
    OCTET_REQUIRE(!C || (std::is_same_v<CT, DT>), fn, "C", "must have D's type for the cublaslt backend");
    OCTET_REQUIRE(!C || C->order == D.order, fn, "C", "must have D's layout for the cublaslt backend");
    OCTET_REQUIRE(opt.bias.empty() || D.order == storage_order::row_major, fn, "options.bias",
                  "needs a row-major D with the cublaslt backend (its bias epilogue runs along the other dimension)");
    if constexpr (fp4_path)
        OCTET_REQUIRE((!std::is_same_v<DT, fp16>), fn, "D",
                      "must be float or bf16 for the cublaslt NVFP4 path (a BF16 GEMM)");

    const bool d_row = D.order == storage_order::row_major;
    cublaslt_matmul_args args;
    // cuBLASLt computes X (m x n, column-major) = op(P) op(Q) with P = first, Q = second operand.
    args.m = d_row ? N : M;
    args.n = d_row ? M : N;
    args.k = K;
    args.alpha = opt.alpha;
    args.beta = C ? opt.beta : 0.0f;
    args.c = C ? static_cast<const void*>(C->data) : static_cast<const void*>(D.data);
    args.ldc = C ? C->ld : D.ld;
    args.d = D.data;
    args.ldd = D.ld;
    args.type_d = cuda_type<DT>();
    args.problem = message(recipe_description<RA>(), " x ", recipe_description<RB>(), ", M=", M, " N=", N, " K=", K);

    // Scratch from the executor's allocator (lt_scratch_for: one home for the sizes).
    const cudaStream_t stream = ex.stream;
    const lt_scratch_plan plan = lt_scratch_for<RA, RB, DT>(A, B, opt);
    stream_scratch sa_buf, sb_buf, bias_buf, pa_buf, pb_buf, ab_buf;
    const unsigned blocks = 256;

    if constexpr (fp4_path) {
        const std::size_t ldk = (K + 7) / 8 * 8;  // 16-byte rows of bf16
        pa_buf = stream_scratch(ex, plan.expand_a);
        pb_buf = stream_scratch(ex, plan.expand_b);
        cuda::launch("lt_expand_fp4", lt_expand_fp4<RA>, cuda::grid_stride_blocks(M * ldk, blocks), blocks, 0, stream,
                     A, pa_buf.as<bf16>(), ldk);
        OCTET_CUDA_CHECK_LAUNCH();
        cuda::launch("lt_expand_fp4", lt_expand_fp4<RB>, cuda::grid_stride_blocks(N * ldk, blocks), blocks, 0, stream,
                     B, pb_buf.as<bf16>(), ldk);
        OCTET_CUDA_CHECK_LAUNCH();
        ab_buf = stream_scratch(ex, plan.alpha_beta);
        cuda::launch("lt_fold_tensor_scales", lt_fold_tensor_scales, 1, 1, 0, stream, A.tensor_scale, B.tensor_scale,
                     args.alpha, args.beta, static_cast<float*>(ab_buf.get()));
        OCTET_CUDA_CHECK_LAUNCH();
        args.device_alpha_beta = static_cast<const float*>(ab_buf.get());
        args.first = d_row ? pb_buf.get() : pa_buf.get();
        args.second = d_row ? pa_buf.get() : pb_buf.get();
        args.ld_first = args.ld_second = ldk;
        args.type_first = args.type_second = CUDA_R_16BF;
    } else {
        // Scale pointers and modes of one octet operand (rows x K).
        auto scales_of = [&](auto q, stream_scratch& buf, std::size_t bytes, lt_scale_mode& mode) -> const void* {
            using T = gemm_operand_traits<typename decltype(q)::recipe_type>;
            const std::size_t rows = q.rows(), kblocks = (K + 127) / 128;
            const float* s = reinterpret_cast<const float*>(q.scales);
            if constexpr (T::per_tensor) {
                mode = lt_scale_mode::scalar_32f;
                return s;
            } else if constexpr (T::per_row) {
                mode = lt_scale_mode::outer_vec_32f;
                return s;
            } else if constexpr (T::vec128) {
                mode = lt_scale_mode::vec128_32f;
                const std::size_t want_ld = (rows + 3) / 4 * 4;
                if (bytes == 0) return s;  // octet's grid already is cuBLASLt's
                buf = stream_scratch(ex, bytes);
                cuda::launch("lt_relayout_vec128", lt_relayout_vec128,
                             cuda::grid_stride_blocks(kblocks * want_ld, blocks), blocks, 0, stream, s,
                             q.layout.scale_ld, buf.as<float>(), want_ld, static_cast<std::uint32_t>(rows),
                             static_cast<std::uint32_t>(kblocks));
                OCTET_CUDA_CHECK_LAUNCH();
                return buf.get();
            } else {
                mode = lt_scale_mode::blk128x128_32f;
                const std::size_t rblocks = (rows + 127) / 128, want_ld = (kblocks + 3) / 4 * 4;
                buf = stream_scratch(ex, bytes);
                cuda::launch("lt_relayout_blk128", lt_relayout_blk128,
                             cuda::grid_stride_blocks(rblocks * want_ld, blocks), blocks, 0, stream, s,
                             q.layout.scale_ld, buf.as<float>(), want_ld, static_cast<std::uint32_t>(rblocks),
                             static_cast<std::uint32_t>(kblocks));
                OCTET_CUDA_CHECK_LAUNCH();
                return buf.get();
            }
        };
        lt_scale_mode mode_a = lt_scale_mode::none, mode_b = lt_scale_mode::none;
        const void* scale_a = scales_of(A, sa_buf, plan.scales_a, mode_a);
        const void* scale_b = scales_of(B, sb_buf, plan.scales_b, mode_b);
        args.scale_first = d_row ? scale_b : scale_a;
        args.scale_second = d_row ? scale_a : scale_b;
        args.mode_first = d_row ? mode_b : mode_a;
        args.mode_second = d_row ? mode_a : mode_b;
        args.first = d_row ? static_cast<const void*>(B.data) : static_cast<const void*>(A.data);
        args.second = d_row ? static_cast<const void*>(A.data) : static_cast<const void*>(B.data);
        args.ld_first = d_row ? B.layout.row_bytes : A.layout.row_bytes;
        args.ld_second = d_row ? A.layout.row_bytes : B.layout.row_bytes;
        args.type_first = d_row ? cuda_type<typename RB::format>() : cuda_type<typename RA::format>();
        args.type_second = d_row ? cuda_type<typename RA::format>() : cuda_type<typename RB::format>();
    }

    if (!opt.bias.empty()) {
        // cuBLASLt's bias type: FP8 inputs take bf16 (float or bf16 D) or fp16 (fp16 D); BF16 inputs take D's type.
        const std::uint32_t nb = static_cast<std::uint32_t>(N);
        if (fp4_path && std::is_same_v<DT, float>) {
            args.bias = opt.bias.data();
            args.bias_type = CUDA_R_32F;
        } else if (std::is_same_v<DT, fp16>) {
            bias_buf = stream_scratch(ex, plan.bias);
            cuda::launch("lt_convert_bias", lt_convert_bias<fp16>, cuda::grid_stride_blocks(N, blocks), blocks, 0,
                         stream, opt.bias.data(), static_cast<fp16*>(bias_buf.get()), nb);
            args.bias = bias_buf.get();
            args.bias_type = CUDA_R_16F;
        } else {
            bias_buf = stream_scratch(ex, plan.bias);
            cuda::launch("lt_convert_bias", lt_convert_bias<bf16>, cuda::grid_stride_blocks(N, blocks), blocks, 0,
                         stream, opt.bias.data(), static_cast<bf16*>(bias_buf.get()), nb);
            args.bias = bias_buf.get();
            args.bias_type = CUDA_R_16BF;
        }
        OCTET_CUDA_CHECK_LAUNCH();
    }
    ex.cublaslt.matmul(ex.cublaslt, stream, args);
}

/// Recipe pairs the backend maps (gemm_backend_support has the rules and the messages).
template <class RA, class RB>
inline constexpr bool cublaslt_maps_pair_v =
    (gemm_operand_traits<RA>::nvfp4_like && gemm_operand_traits<RB>::nvfp4_like) ||
    (gemm_operand_traits<RA>::tensor_core_fp8 && gemm_operand_traits<RB>::tensor_core_fp8 &&
     gemm_operand_traits<RA>::f32_scales && gemm_operand_traits<RB>::f32_scales &&
     ((gemm_operand_traits<RA>::per_tensor && gemm_operand_traits<RB>::per_tensor) ||
      (gemm_operand_traits<RA>::per_row && gemm_operand_traits<RB>::per_row) ||
      ((gemm_operand_traits<RA>::vec128 || gemm_operand_traits<RA>::blk128) &&
       (gemm_operand_traits<RB>::vec128 || gemm_operand_traits<RB>::blk128))));

/// The cublaslt backend: octet's preparation kernels (scratch from ex's allocator), then the lent
/// cuBLASLt (ex.cublaslt.matmul).
template <class RA, class RB, class CT, class DT>
void run_cublaslt(const stream_executor& ex, const quantized_cref<RA>& A, const quantized_cref<RB>& B,
                  const matrix_ref<const CT>* C, const matrix_ref<DT>& D, const gemm_options& opt) {
    if constexpr (cublaslt_maps_pair_v<RA, RB>)
        run_cublaslt_impl<RA, RB, CT, DT>(ex, A, B, C, D, opt);
    else
        throw error("octet::scaled_gemm: the cublaslt backend does not map " + recipe_description<RA>() + " x " +
                    recipe_description<RB>());
}

}  // namespace detail
}  // namespace octet
