// octet/cuda/executor.cuh: the CUDA stream executor, octet::on_stream(stream).
//
// An executor is a small value: the stream, and what the caller lends octet's stream functions.
// Today that is an optional cuBLASLt (octet::with_cublaslt in octet/gemm/cublaslt.cuh): with it,
// octet::scaled_gemm may use its cublaslt backend; without it, only octet's own kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

#include "octet/core/executor.hpp"

namespace octet {

namespace detail {
struct cublaslt_matmul_args;  // octet/gemm/detail/cublaslt_args.cuh
}

/// A cuBLASLt lent to octet by the caller, who owns the handle and the workspace and keeps them
/// alive (and the workspace unused by other streams) while work enqueued with them runs. All null:
/// nothing lent.
struct cublaslt_ref {
    void* handle = nullptr;     ///< a cublasLtHandle_t
    void* workspace = nullptr;  ///< device memory for cuBLASLt's kernels; may be null (then 0 bytes)
    std::size_t workspace_bytes = 0;
    /// The function that makes the cuBLASLt calls. It lives in octet/gemm/cublaslt.cuh and is set by
    /// with_cublaslt, so that only programs that include that header reference cuBLASLt's symbols.
    void (*matmul)(const cublaslt_ref& self, cudaStream_t stream, const detail::cublaslt_matmul_args& args) = nullptr;
};

struct stream_executor {
    cudaStream_t stream = nullptr;
    cublaslt_ref cublaslt{};  ///< optional (octet::with_cublaslt)
};

inline stream_executor on_stream(cudaStream_t stream = nullptr) {
    stream_executor ex;
    ex.stream = stream;
    return ex;
}

namespace detail {
/// Stream entry points whose kernels take long to compile are templates on the executor type (always
/// stream_executor, deduced: callers write the same call), so that a translation unit compiles those
/// kernels only if it calls the function, not because it includes the header.
template <class Ex>
using if_stream_executor = std::enable_if_t<std::is_same_v<Ex, stream_executor>, int>;
}  // namespace detail

}  // namespace octet
