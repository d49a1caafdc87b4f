// octet_torch_cuda.hpp: what the ops' CUDA kernels share (built with OCTET_TORCH_CUDA): the octet
// executor of torch's current stream on a tensor's device, with torch's caching allocator lent for
// octet's scratch, so that octet's stream functions take no memory of their own and never
// synchronize the host; and the device guard every CUDA kernel of an op holds.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstddef>

#include "octet/cuda/executor.cuh"

namespace octet_torch {

inline void* torch_device_allocate(void*, std::size_t bytes, cudaStream_t stream) {
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, stream);
}

/// The caching allocator keeps the block for the stream it was allocated on: later work on that
/// stream may reuse it, work enqueued before still owns it (octet's device_allocator contract).
inline void torch_device_deallocate(void*, void* p, std::size_t, cudaStream_t) {
    c10::cuda::CUDACachingAllocator::raw_delete(p);
}

/// Enqueues on torch's current stream of t's device (call it under a guard of that device).
inline octet::stream_executor device_executor(const at::Tensor& t) {
    const c10::cuda::CUDAStream s = c10::cuda::getCurrentCUDAStream(t.device().index());
    return octet::with_allocator(octet::on_stream(s.stream()),
                                 octet::device_allocator{nullptr, &torch_device_allocate, &torch_device_deallocate});
}

}  // namespace octet_torch
