// octet/gemm/detail/stream.cuh: the implementation of octet/gemm/scaled_gemm.cuh (which
// includes it at its end): the device support rules and the backend choice, the launches of the
// chosen backend (sm89_mma.cuh, sm90_wgmma.cuh, cuBLASLt), gemm_executor_backend<stream_executor>,
// and the definitions of the stream queries declared there.
#pragma once

#include <cuda_runtime.h>

#include "octet/cuda/executor.cuh"
#include "octet/gemm/detail/cublaslt_args.cuh"
#include "octet/gemm/detail/device_common.cuh"
#include "octet/gemm/scaled_gemm.cuh"
#include "octet/gemm/scaled_gemm.hpp"
#include "octet/gemm/sm89_mma.cuh"
#include "octet/gemm/sm90_wgmma.cuh"
#include "octet/quant/quantize.cuh"

namespace octet {

namespace detail {

/// Why `backend` cannot run this problem on the current GPU with executor `ex` (empty when it can).
template <class RA, class RB>
std::string gemm_device_support(const stream_executor& ex, gemm_backend backend, std::size_t K,
                                const gemm_options& opt) {
    std::string why = gemm_backend_support<RA, RB>(backend, K, opt);
    if (!why.empty()) return why;
    if (backend == gemm_backend::cublaslt && ex.cublaslt.matmul == nullptr)
        return "the executor carries no cuBLASLt (pass octet::with_cublaslt(octet::on_stream(s), handle, workspace, "
               "bytes) from "
               "octet/gemm/cublaslt.cuh, and link CUDA::cublasLt)";
#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    if (backend == gemm_backend::cublaslt)  // a closed library: nothing to run under the interpreter
        return "cuBLASLt has no host model, so the cublaslt backend is unavailable in interpret mode (OCTET_INTERPRET)";
#endif
    if (cuda::compute_capability() == 0) return "there is no CUDA device";
    switch (backend) {
        case gemm_backend::sm90_wgmma:
            if (cuda::compute_capability() != 90)
                return message("it needs an sm_90 GPU (this one is sm_", cuda::compute_capability(), ")");
            if (!sm90a_available())
                return "this binary has no sm_90a code (build with CMAKE_CUDA_ARCHITECTURES including 90a)";
            return "";
        case gemm_backend::sm89_mma:
            if (cuda::compute_capability() < 89)
                return message("it needs an sm_89 or later GPU (this one is sm_", cuda::compute_capability(), ")");
            if (!sm89_available()) return "this binary has no sm_89+ code for this GPU";
            return "";
        case gemm_backend::cublaslt:
            if (!(gemm_operand_traits<RA>::nvfp4_like && gemm_operand_traits<RB>::nvfp4_like) &&
                cuda::compute_capability() < 89)
                return "cuBLASLt's FP8 GEMM needs an sm_89 or later GPU";
            if (!(gemm_operand_traits<RA>::nvfp4_like && gemm_operand_traits<RB>::nvfp4_like) &&
                !gemm_operand_traits<RA>::per_tensor && cuda::compute_capability() != 90)
                return "cuBLASLt's outer-vector and 128-block FP8 scale modes are Hopper (sm_90) modes";
            return "";
        default:
            return "";
    }
}

template <class RA, class RB>
std::string gemm_device_backends_serving(const stream_executor& ex, std::size_t K, const gemm_options& opt) {
    std::string s = "host (octet::on_host())";
    for (gemm_backend b : {gemm_backend::sm90_wgmma, gemm_backend::sm89_mma, gemm_backend::cublaslt})
        if (gemm_device_support<RA, RB>(ex, b, K, opt).empty()) s += std::string(", ") + backend_name(b);
    return s;
}

/// The backend scaled_gemm uses for (RA x RB) with inner dimension K on this GPU and executor;
/// throws octet::error (naming the backends that would serve) when none does.
template <class RA, class RB>
gemm_backend choose_device_backend(const stream_executor& ex, std::size_t K, const gemm_options& opt) {
    constexpr const char* fn = "octet::scaled_gemm";
    gemm_backend backend = opt.backend;
    if (backend == gemm_backend::automatic) {
        for (gemm_backend b : {gemm_backend::sm90_wgmma, gemm_backend::sm89_mma, gemm_backend::cublaslt})
            if (gemm_device_support<RA, RB>(ex, b, K, opt).empty()) {
                backend = b;
                break;
            }
        const bool lt_would_serve =
            ex.cublaslt.matmul == nullptr && gemm_backend_support<RA, RB>(gemm_backend::cublaslt, K, opt).empty();
        OCTET_REQUIRE(backend != gemm_backend::automatic, fn, "A/B",
                      message("(", recipe_description<RA>(), " x ", recipe_description<RB>(),
                              ") has no CUDA backend on this GPU (sm_", cuda::compute_capability(),
                              "); backends that serve it: ", gemm_device_backends_serving<RA, RB>(ex, K, opt),
                              lt_would_serve ? "; cublaslt may, if the executor carries a cuBLASLt "
                                               "(octet::with_cublaslt, octet/gemm/cublaslt.cuh)"
                                             : ""));
    } else {
        const std::string why = gemm_device_support<RA, RB>(ex, backend, K, opt);
        OCTET_REQUIRE(why.empty(), fn, "options.backend",
                      message("is ", backend_name(backend), ", which cannot run ", recipe_description<RA>(), " x ",
                              recipe_description<RB>(), ": ", why,
                              ". Backends that serve it here: ", gemm_device_backends_serving<RA, RB>(ex, K, opt)));
    }
    return backend;
}

template <class RA, class RB, class CT, class DT>
gemm_result scaled_gemm_device(const stream_executor& ex, const quantized_cref<RA>& A, const quantized_cref<RB>& B,
                               const matrix_ref<const CT>* C, const matrix_ref<DT>& D, const gemm_options& opt) {
    constexpr const char* fn = "octet::scaled_gemm";
    const cudaStream_t stream = ex.stream;  // the arguments were checked by the entry (scaled_gemm.hpp)
    const std::size_t M = A.rows(), N = B.rows(), K = A.cols();
    gemm_result result;
    OCTET_REQUIRE(opt.backend != gemm_backend::host, fn, "options.backend",
                  "is host but the executor is a stream; call scaled_gemm with octet::on_host() and host memory");

    // before the backend is chosen: `automatic` would otherwise pass the tile over for another backend
    OCTET_REQUIRE(opt.tile != gemm_tile::m128n192 || sm90_wide_serves<RB>(), fn, "options.tile",
                  message("is m128n192", sm90_wide_refusal));
    const gemm_backend backend = choose_device_backend<RA, RB>(ex, K, opt);
    result.backend = backend;
    if (M == 0 || N == 0) return result;

    // Device memory and alignment.
    require_device_matrix(D, fn, "D");
    if (C) require_device_matrix(*C, fn, "C");
    if (!opt.bias.empty()) cuda::require_device_accessible(opt.bias.data(), fn, "options.bias");
    if (K > 0) {
        require_device_operand(A, fn, "A", backend_name(backend));
        require_device_operand(B, fn, "B", backend_name(backend));
    }

    if (backend == gemm_backend::cublaslt) {
        run_cublaslt<RA, RB, CT, DT>(ex, A, B, C, D, opt);
        return result;
    }
    // Kernels are instantiated only for pairs they can serve (gemm_kernel_pair); the checks above
    // have already refused the others at run time.
    const device_epilogue<CT, DT> epi = make_device_epilogue<CT, DT>(C, D, opt);
    if constexpr (gemm_kernel_pair<RA, RB>::sm90) {
        if (backend == gemm_backend::sm90_wgmma && K > 0) {
            const sm90_plan plan = sm90_choose_plan<RB>(M, N, K, opt);
            const stream_scratch partial(ex, plan.scratch_bytes(M, N));
            launch_sm90<RA, RB, CT, DT>(stream, A, B, epi, plan, partial.as<float>());
            return result;
        }
    }
    if constexpr (gemm_kernel_pair<RA, RB>::sm89) {
        // sm89_mma, and sm90_wgmma's K = 0 case (nothing to load: D = beta C + bias)
        const std::size_t g =
            gemm_segment(static_cast<std::size_t>(opt.promotion_interval), A.layout.block_cols, B.layout.block_cols, K);
        launch_sm89<RA, RB, CT, DT>(stream, A, B, epi, g);
    }
    return result;
}

/// scaled_gemm on a stream (the entries, octet::scaled_gemm, are in scaled_gemm.hpp and check the
/// executor-independent arguments first).
template <>
struct gemm_executor_backend<stream_executor> {
    /// CUDA's __nv_bfloat16 / __half outputs are octet::bf16 / octet::fp16 to the kernels.
    template <class T>
    using element = storage_of_t<T>;

    /// Enqueued on ex.stream: the chosen backend's kernel (or cuBLASLt's preparation and matmul).
    template <class RA, class RB, class CT, class DT>
    static gemm_result run(const stream_executor& ex, const quantized_cref<RA>& A, const quantized_cref<RB>& B,
                           const matrix_ref<const CT>* C, const matrix_ref<DT>& D, const gemm_options& opt) {
        return scaled_gemm_device<RA, RB, CT, DT>(ex, A, B, C, D, opt);
    }

    /// The float result in M * N floats of scratch from ex's allocator, then quantized with RD on the
    /// stream; device_amax (if set) receives the result's finite amax. No host sync.
    template <class RA, class RB, class RD>
    static gemm_result run_quantized(const stream_executor& ex, const quantized_cref<RA>& A,
                                     const quantized_cref<RB>& B, const quantized_ref<RD>& D, const gemm_options& opt,
                                     float* device_amax) {
        const std::size_t M = A.rows(), N = B.rows();
        const stream_scratch tmp_buf(ex, M > 0 && N > 0 ? M * N * sizeof(float) : 0);
        float* tmp = tmp_buf.as<float>();
        const gemm_result r = run<RA, RB, float, float>(ex, A, B, nullptr, matrix_ref<float>(tmp, M, N), opt);
        device_quantize_options qo;
        if (device_amax) {
            OCTET_CUDA_CHECK(cudaMemsetAsync(device_amax, 0, sizeof(float), ex.stream));
            qo.device_record = device_amax;
        }
        quantize<RD>(ex, matrix_ref<const float>(tmp, M, N), D, {}, qo);
        return r;
    }
};

}  // namespace detail

// ---- declared and documented in octet/gemm/scaled_gemm.cuh --------------------------------------

template <class RA, class RB>
std::string scaled_gemm_support(const stream_executor& ex, gemm_backend backend, std::size_t K,
                                const gemm_options& opt) {
    if (backend == gemm_backend::host) return "the host backend runs with octet::on_host(), not on a stream";
    if (backend != gemm_backend::automatic) return detail::gemm_device_support<RA, RB>(ex, backend, K, opt);
    for (gemm_backend b : {gemm_backend::sm90_wgmma, gemm_backend::sm89_mma, gemm_backend::cublaslt})
        if (detail::gemm_device_support<RA, RB>(ex, b, K, opt).empty()) return "";
    return detail::message("no CUDA backend serves it here; backends that do: ",
                           detail::gemm_device_backends_serving<RA, RB>(ex, K, opt));
}

template <class RA, class BA, class RB, class BB, class DT>
std::size_t scaled_gemm_scratch_bytes(const stream_executor& ex, quantized_ref<RA, BA> A, quantized_ref<RB, BB> B,
                                      matrix_ref<DT> D, const gemm_options& opt) {
    using D0 = detail::storage_of_t<std::remove_const_t<DT>>;
    (void)D;
    const quantized_cref<RA> a = A;
    const quantized_cref<RB> b = B;
    if (a.rows() == 0 || b.rows() == 0) return 0;
    const gemm_backend backend = detail::choose_device_backend<RA, RB>(ex, a.cols(), opt);
    if (backend == gemm_backend::sm90_wgmma && a.cols() > 0)
        return detail::scratch_round(
            detail::sm90_choose_plan<RB>(a.rows(), b.rows(), a.cols(), opt).scratch_bytes(a.rows(), b.rows()));
    if (backend != gemm_backend::cublaslt) return 0;
    if constexpr (detail::cublaslt_maps_pair_v<RA, RB>)
        return detail::lt_scratch_for<RA, RB, D0>(a, b, opt).total();
    else
        return 0;
}

template <class RA, class BA, class RB, class BB, class RD>
std::size_t scaled_gemm_scratch_bytes(const stream_executor& ex, quantized_ref<RA, BA> A, quantized_ref<RB, BB> B,
                                      quantized_ref<RD> D, const gemm_options& opt) {
    const std::size_t M = A.rows(), N = B.rows();
    if (M == 0 || N == 0) return 0;
    const matrix_ref<float> tmp(nullptr, M, N);
    return detail::scratch_round(M * N * sizeof(float)) + scaled_gemm_scratch_bytes(ex, A, B, tmp, opt) +
           quantize_scratch_bytes<RD>(matrix_ref<const float>(nullptr, M, N), D);
}

}  // namespace octet
