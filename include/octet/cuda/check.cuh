// octet/cuda/check.cuh: CUDA error checks that throw octet::error, and pointer checks.
#pragma once

#include <cuda_runtime.h>

#include <sstream>

#include "octet/config.hpp"
#include "octet/core/check.hpp"

namespace octet {
namespace cuda {

inline void check(cudaError_t err, const char* what, const char* file, int line) {
    if (err == cudaSuccess) return;
    std::ostringstream os;
    os << "CUDA error in " << what << " (" << file << ":" << line << "): " << cudaGetErrorName(err) << ": "
       << cudaGetErrorString(err);
    throw octet::error(os.str());
}

/// Throws octet::error unless `p` is memory a kernel can read (device, managed, or mapped host).
inline void require_device_accessible(const void* p, const char* function, const char* argument) {
    if (p == nullptr) return;  // null with size 0 is fine; callers check null-with-size separately
    cudaPointerAttributes attr{};
    const cudaError_t err = cudaPointerGetAttributes(&attr, p);
    if (err != cudaSuccess) {
        cudaGetLastError();  // clear the sticky-free error state of the query
        detail::throw_argument_error(
            function, argument,
            "is not a pointer the CUDA runtime knows; pass device memory (cudaMalloc) to stream functions");
    }
    if (attr.type == cudaMemoryTypeUnregistered || (attr.type == cudaMemoryTypeHost && attr.devicePointer == nullptr))
        detail::throw_argument_error(
            function, argument,
            "points to host memory; pass device memory to the on_stream() overload, or call the on_host() overload");
}

}  // namespace cuda
}  // namespace octet

#define OCTET_CUDA_CHECK(expr) ::octet::cuda::check((expr), #expr, __FILE__, __LINE__)
/// Checks the launch that just happened (configuration errors are reported at launch).
#define OCTET_CUDA_CHECK_LAUNCH() ::octet::cuda::check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
