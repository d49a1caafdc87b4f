// octet_torch_cuda.hpp: what the ops' CUDA kernels share (built with OCTET_TORCH_CUDA): the octet
// executor of torch's current stream on a tensor's device, with torch's caching allocator lent for
// octet's scratch, so that octet's stream functions take no memory of their own and never
// synchronize the host; and the device guard every CUDA kernel of an op holds.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstddef>

#include "octet/cuda/executor.cuh"
#include "octet/quant/stats.hpp"

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

/// n quant_stats written by the device (raw bytes, [n, 64]) as float64 [n, 8] in the order of
/// octet.torch.STATS_FIELDS (put_quant_stats' on the host), by reinterpreting views on the device:
/// no kernel of its own, no synchronization.
inline at::Tensor stats_from_device(const at::Tensor& raw) {
    using S = octet::quant_stats;
    static_assert(sizeof(S) == 64 && offsetof(S, elements) == 8 && offsetof(S, lost_to_nan) == 40 &&
                      offsetof(S, signal_energy) == 48 && offsetof(S, noise_energy) == 56,
                  "quant_stats' layout changed: update stats_from_device");
    return at::cat({raw.view(at::kFloat).slice(1, 0, 1).to(at::kDouble),
                    raw.view(at::kLong).slice(1, 1, 6).to(at::kDouble), raw.view(at::kDouble).slice(1, 6, 8)},
                   1);
}

/// The float at byte `offset` of a 1-D byte tensor the device wrote, as a 0-d float32 tensor of
/// its own (a copy on the stream, no synchronization).
inline at::Tensor float_from_device(const at::Tensor& raw, std::size_t offset) {
    return raw.narrow(0, static_cast<int64_t>(offset), 4).view(at::kFloat).reshape({}).clone();
}

/// `count` consecutive quant_stats at byte `offset` of a 1-D byte tensor the device wrote, as
/// float64 [count, 8].
inline at::Tensor stats_from_device(const at::Tensor& raw, std::size_t offset, std::size_t count) {
    const auto n = static_cast<int64_t>(count), bytes = static_cast<int64_t>(sizeof(octet::quant_stats));
    return stats_from_device(raw.narrow(0, static_cast<int64_t>(offset), n * bytes).view({n, bytes}));
}

}  // namespace octet_torch
