// octet/cuda/executor.cuh: the CUDA stream executor, octet::on_stream(stream).
//
// An executor is a small value: the stream, and what the caller lends octet's stream functions:
//   - a device allocator (octet::with_allocator, below): every temporary a stream function needs
//     comes from it. Without one, octet uses its default: cudaMallocAsync / cudaFreeAsync on the
//     executor's stream (stream-ordered, no host synchronization, capturable into a CUDA graph,
//     served from the device's default memory pool). This is the one place that default is stated;
//     each entry point documents the bytes it requests and what it enqueues.
//   - a cuBLASLt (octet::with_cublaslt in octet/gemm/cublaslt.cuh): with it, octet::scaled_gemm may
//     use its cublaslt backend; without it, only octet's own kernels.
// No stream function synchronizes the host unless its name says so (..._synchronizing).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

#include "octet/core/check.hpp"
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

/// A device allocator lent to octet by the caller (a framework's caching allocator, an arena).
/// Stream-ordered semantics, as cudaMallocAsync / cudaFreeAsync:
///   allocate(context, bytes, stream): device memory that work enqueued on `stream` after the call
///     may use, at least 256-byte aligned; bytes > 0. Returns null (or throws) when it cannot.
///   deallocate(context, p, bytes, stream): `p` (from allocate, same bytes) may be reused by work
///     enqueued on `stream` after the call; work enqueued before it still reads and writes it.
/// octet calls both from the thread that calls the stream function, never from a kernel or a
/// callback, and only with the executor's stream. Both null: nothing lent (octet's default).
struct device_allocator {
    void* context = nullptr;
    void* (*allocate)(void* context, std::size_t bytes, cudaStream_t stream) = nullptr;
    void (*deallocate)(void* context, void* p, std::size_t bytes, cudaStream_t stream) = nullptr;
};

struct stream_executor {
    cudaStream_t stream = nullptr;
    cublaslt_ref cublaslt{};       ///< optional (octet::with_cublaslt)
    device_allocator allocator{};  ///< optional (octet::with_allocator); default: cudaMallocAsync on `stream`
};

inline stream_executor on_stream(cudaStream_t stream = nullptr) {
    stream_executor ex;
    ex.stream = stream;
    return ex;
}

/// `ex` with the caller's device allocator lent: every temporary of a stream function called with
/// the returned executor comes from `a` (see device_allocator for the contract).
inline stream_executor with_allocator(stream_executor ex, device_allocator a) {
    OCTET_REQUIRE(a.allocate != nullptr && a.deallocate != nullptr, "octet::with_allocator", "allocator",
                  "needs both allocate and deallocate (leave both null for octet's default, cudaMallocAsync)");
    ex.allocator = a;
    return ex;
}

namespace detail {
/// Stream entry points whose kernels take long to compile are templates on the executor type (always
/// stream_executor, deduced: callers write the same call), so that a translation unit compiles those
/// kernels only if it calls the function, not because it includes the header.
template <class Ex>
using if_stream_executor = std::enable_if_t<std::is_same_v<Ex, stream_executor>, int>;

/// Bytes an allocation of `bytes` takes in a scratch total (each request rounded up to 256 bytes,
/// so that a caller's arena sized by a ..._scratch_bytes query holds every request at its alignment).
constexpr std::size_t scratch_round(std::size_t bytes) {
    return (bytes + 255) / 256 * 256;
}

/// Device memory from the executor's allocator (or the default), returned to it on the executor's
/// stream when this goes out of scope: the temporaries of one stream function call.
class stream_scratch {
public:
    stream_scratch() = default;
    stream_scratch(const stream_executor& ex, std::size_t bytes) : ex_(ex), bytes_(bytes) {
        if (bytes == 0) return;
        if (ex.allocator.allocate) {
            p_ = ex.allocator.allocate(ex.allocator.context, bytes, ex.stream);
            OCTET_REQUIRE(p_ != nullptr, "octet::stream_scratch", "executor.allocator",
                          message("returned null for ", bytes, " bytes of device scratch"));
        } else {
            const cudaError_t err = cudaMallocAsync(&p_, bytes, ex.stream);
            if (err != cudaSuccess) {
                cudaGetLastError();
                throw error(message("cudaMallocAsync of ", bytes, " bytes of stream scratch failed: ",
                                    cudaGetErrorName(err), " (lend an allocator with octet::with_allocator)"));
            }
        }
    }
    ~stream_scratch() { release(); }
    stream_scratch(const stream_scratch&) = delete;
    stream_scratch& operator=(const stream_scratch&) = delete;
    stream_scratch(stream_scratch&& o) noexcept : ex_(o.ex_), p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
    stream_scratch& operator=(stream_scratch&& o) noexcept {
        if (this != &o) {
            release();
            ex_ = o.ex_;
            p_ = o.p_;
            bytes_ = o.bytes_;
            o.p_ = nullptr;
        }
        return *this;
    }

    void* get() const { return p_; }
    template <class T>
    T* as() const {
        return static_cast<T*>(p_);
    }

private:
    void release() noexcept {
        if (!p_) return;
        if (ex_.allocator.deallocate)
            ex_.allocator.deallocate(ex_.allocator.context, p_, bytes_, ex_.stream);
        else
            cudaFreeAsync(p_, ex_.stream);
        p_ = nullptr;
    }
    stream_executor ex_{};
    void* p_ = nullptr;
    std::size_t bytes_ = 0;
};
}  // namespace detail

}  // namespace octet
