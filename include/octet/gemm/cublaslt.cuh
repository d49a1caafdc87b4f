// octet/gemm/cublaslt.cuh: the cuBLASLt backend of octet::scaled_gemm (gemm_backend::cublaslt).
//
//   octet::cuda::cublaslt_context lt;                       // or the program's own handle and workspace
//   auto ex = octet::with_cublaslt(octet::on_stream(s), lt);  // ... (on_stream(s), handle, workspace, bytes)
//   octet::scaled_gemm(ex, A, B, D, opt);
//
// Link CUDA::cublasLt. A stream executor that carries cuBLASLt takes part in automatic selection
// (after octet's own kernels) and can request gemm_backend::cublaslt by name; any other executor
// never touches cuBLASLt, whatever the translation unit includes.
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

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/gemm/detail/cublaslt_args.cuh"
#include "octet/gemm/scaled_gemm.cuh"

namespace octet {
namespace detail {

inline void cublas_check(cublasStatus_t s, const char* what) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    throw error(message("octet::scaled_gemm (cublaslt): ", what, " failed: ", cublasLtGetStatusName(s), " (",
                        cublasLtGetStatusString(s), ")"));
}

struct lt_matmul_desc {
    cublasLtMatmulDesc_t d = nullptr;
    lt_matmul_desc(cublasComputeType_t c, cudaDataType_t s) {
        cublas_check(cublasLtMatmulDescCreate(&d, c, s), "cublasLtMatmulDescCreate");
    }
    ~lt_matmul_desc() { cublasLtMatmulDescDestroy(d); }
    lt_matmul_desc(const lt_matmul_desc&) = delete;
    lt_matmul_desc& operator=(const lt_matmul_desc&) = delete;
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
    lt_layout(const lt_layout&) = delete;
    lt_layout& operator=(const lt_layout&) = delete;
};
struct lt_preference {
    cublasLtMatmulPreference_t d = nullptr;
    explicit lt_preference(std::size_t ws) {
        cublas_check(cublasLtMatmulPreferenceCreate(&d), "cublasLtMatmulPreferenceCreate");
        cublas_check(cublasLtMatmulPreferenceSetAttribute(d, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
                     "cublasLtMatmulPreferenceSetAttribute");
    }
    ~lt_preference() { cublasLtMatmulPreferenceDestroy(d); }
    lt_preference(const lt_preference&) = delete;
    lt_preference& operator=(const lt_preference&) = delete;
};

inline cublasLtMatmulMatrixScale_t lt_scale(lt_scale_mode m) {
    switch (m) {
        case lt_scale_mode::outer_vec_32f:
            return CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        case lt_scale_mode::vec128_32f:
            return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        case lt_scale_mode::blk128x128_32f:
            return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        default:
            return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    }
}

/// cublaslt_ref::matmul: one cublasLtMatmul with the lent handle and workspace (enqueued on `stream`).
inline void cublaslt_matmul(const cublaslt_ref& lt, cudaStream_t stream, const cublaslt_matmul_args& a) {
#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    // cuBLASLt is a closed library with no host model (nor is it linked): gemm_device_support refuses
    // the backend in interpret mode before this is reached.
    (void)lt;
    (void)stream;
    throw error(message("octet::scaled_gemm (cublaslt): cannot run ", a.problem,
                        ": cuBLASLt is unavailable in interpret mode (OCTET_INTERPRET)"));
#else
    const auto handle = static_cast<cublasLtHandle_t>(lt.handle);
    lt_matmul_desc desc(CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    desc.set(CUBLASLT_MATMUL_DESC_TRANSA, op_t);
    desc.set(CUBLASLT_MATMUL_DESC_TRANSB, op_n);
    if (a.device_alpha_beta) {
        const cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
        desc.set(CUBLASLT_MATMUL_DESC_POINTER_MODE, pm);
    }
    if (a.mode_first != lt_scale_mode::none) {
        desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a.scale_first);
        desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a.scale_second);
        desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, static_cast<std::int32_t>(lt_scale(a.mode_first)));
        desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, static_cast<std::int32_t>(lt_scale(a.mode_second)));
        const std::int8_t fast_accum = 0;
        desc.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum);
    }
    if (a.bias) {
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
        desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, a.bias);
        desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(a.bias_type));
    }
    const lt_layout la(a.type_first, a.k, a.m, static_cast<std::int64_t>(a.ld_first));
    const lt_layout lb(a.type_second, a.k, a.n, static_cast<std::int64_t>(a.ld_second));
    const lt_layout ld(a.type_d, a.m, a.n, static_cast<std::int64_t>(a.ldd));
    const lt_layout lc(a.type_d, a.m, a.n, static_cast<std::int64_t>(a.ldc));
    const std::size_t ws_bytes = lt.workspace ? lt.workspace_bytes : 0;
    const lt_preference pref(ws_bytes);
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    const cublasStatus_t hs =
        cublasLtMatmulAlgoGetHeuristic(handle, desc.d, la.d, lb.d, lc.d, ld.d, pref.d, 1, &heuristic, &found);
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0)
        throw error(message("octet::scaled_gemm (cublaslt): cuBLASLt has no algorithm for ", a.problem,
                            " on this GPU with a ", ws_bytes, "-byte workspace (", cublasLtGetStatusName(hs),
                            "); use gemm_backend::sm90_wgmma, sm89_mma or host"));
    const float* alpha = a.device_alpha_beta ? a.device_alpha_beta : &a.alpha;
    const float* beta = a.device_alpha_beta ? a.device_alpha_beta + 1 : &a.beta;
    cublas_check(cublasLtMatmul(handle, desc.d, alpha, a.first, la.d, a.second, lb.d, beta, a.c, lc.d, a.d, ld.d,
                                &heuristic.algo, lt.workspace, ws_bytes, stream),
                 "cublasLtMatmul");
#endif
}

}  // namespace detail

/// `ex` with cuBLASLt lent: octet::scaled_gemm may then use its cublaslt backend, with `handle` and
/// the device `workspace` of `workspace_bytes` (32 MiB is plenty; null/0 limits cuBLASLt to
/// algorithms that need none). The caller owns both and keeps them alive while work enqueued with
/// the returned executor runs; the workspace must not be in use on another stream meanwhile.
inline stream_executor with_cublaslt(stream_executor ex, cublasLtHandle_t handle, void* workspace,
                                     std::size_t workspace_bytes) {
    OCTET_REQUIRE(handle != nullptr, "octet::with_cublaslt", "handle",
                  "is null; create one with cublasLtCreate (or use octet::cuda::cublaslt_context)");
    OCTET_REQUIRE(workspace != nullptr || workspace_bytes == 0, "octet::with_cublaslt", "workspace",
                  "is null with a non-zero size");
    ex.cublaslt.handle = handle;
    ex.cublaslt.workspace = workspace;
    ex.cublaslt.workspace_bytes = workspace_bytes;
    ex.cublaslt.matmul = &detail::cublaslt_matmul;
    return ex;
}

namespace cuda {

/// An owned cuBLASLt handle and device workspace (RAII), for programs that have none of their own
/// (tests, examples). Create it after the CUDA device is chosen; it frees both when destroyed.
class cublaslt_context {
public:
    explicit cublaslt_context(std::size_t workspace_bytes = std::size_t{32} << 20) {
#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
        (void)workspace_bytes;  // cuBLASLt is a closed library with no host model, and is not linked
        throw error("octet::cuda::cublaslt_context: cuBLASLt is unavailable in interpret mode (OCTET_INTERPRET)");
#else
        detail::cublas_check(cublasLtCreate(&handle_), "cublasLtCreate");
        if (workspace_bytes > 0) {
            const cudaError_t err = cudaMalloc(&workspace_, workspace_bytes);
            if (err != cudaSuccess) {
                cublasLtDestroy(handle_);
                check(err, "cudaMalloc(cuBLASLt workspace)", __FILE__, __LINE__);
            }
            workspace_bytes_ = workspace_bytes;
        }
#endif
    }
    ~cublaslt_context() {
#if !(defined(OCTET_INTERPRET) && !defined(__CUDACC__))
        if (workspace_) cudaFree(workspace_);
        if (handle_) cublasLtDestroy(handle_);
#endif
    }
    cublaslt_context(const cublaslt_context&) = delete;
    cublaslt_context& operator=(const cublaslt_context&) = delete;

    cublasLtHandle_t handle() const {
        return handle_;
    }
    void* workspace() const {
        return workspace_;
    }
    std::size_t workspace_bytes() const {
        return workspace_bytes_;
    }

private:
    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    std::size_t workspace_bytes_ = 0;
};

}  // namespace cuda

/// `ex` with the handle and workspace of `lt` lent (see the overload above).
inline stream_executor with_cublaslt(stream_executor ex, const cuda::cublaslt_context& lt) {
    return with_cublaslt(ex, lt.handle(), lt.workspace(), lt.workspace_bytes());
}

}  // namespace octet
