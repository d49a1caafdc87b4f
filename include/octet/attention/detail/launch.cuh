// octet/attention/detail/launch.cuh: host helpers of the stream backend's launches: the sm_90a probe, the
// choice of mma.sync or wgmma kernels, the device checks, dynamic shared memory and the TMA maps.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "octet/attention/attention.hpp"
#include "octet/attention/detail/tiles.cuh"
#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/tensor_map.cuh"

namespace octet {
namespace detail {
namespace attention {

/// Its sm_90a image carries the probe marker (cuda/launch.cuh): never launched.
OCTET_KERNEL void sm90a_probe_kernel() {
#if OCTET_ARCH_SM90A
    OCTET_PROBE_MARKER();
#endif
}

/// Whether the stream forward or backward runs its wgmma kernels: `requested` as asked, on this
/// device and binary (no allocation, launch or synchronization). Asking for wgmma where it cannot
/// run is an error.
inline bool uses_wgmma(attention_kernel requested, const char* fn) {
    if (requested == attention_kernel::mma_sync) return false;
    static std::atomic<int> cache[64] = {};
    const bool available = cuda::compute_capability() == 90 && cuda::image_has_marker(sm90a_probe_kernel, cache);
    OCTET_REQUIRE(available || requested == attention_kernel::automatic, fn, "options.kernel",
                  detail::message("is wgmma, which needs an sm_90 GPU (this one is sm_", cuda::compute_capability(),
                                  ") and a binary built for sm_90a; use automatic or mma_sync"));
    return available;
}

inline void require_fp8_device(const char* fn) {
    int dev = 0, major = 0, minor = 0;
    OCTET_CUDA_CHECK(cudaGetDevice(&dev));
    OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    OCTET_REQUIRE(
        major * 10 + minor >= 89, fn, "executor",
        detail::message("runs on a device of compute capability ", major, ".", minor,
                        "; FP8 attention needs FP8 tensor cores (sm_89 or newer); use the on_host() overload"));
}

template <class Kernel>
void set_smem(Kernel kernel, int bytes) {
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <class R, class B>
void check_device_operand(const quantized_ref<R, B>& x, const char* fn, const char* arg) {
    if (x.layout.rows == 0) return;
    cuda::require_device_accessible(x.data, fn, arg);
    cuda::require_device_accessible(x.scales, fn, arg);
    OCTET_REQUIRE(reinterpret_cast<std::uintptr_t>(x.data) % 16 == 0 && x.layout.row_bytes % 16 == 0, fn, arg,
                  detail::message("must have 16-byte aligned data and rows (row_bytes ", x.layout.row_bytes,
                                  "); use the padded layout of quant_layout_of<Recipe>::make"));
}

/// The TMA map the wgmma kernels (forward_wgmma_kernel, delta_matched_kernel, grad_wgmma_kernel) load
/// x's tiles with: x's codes as a byte matrix, boxes of 64 rows x D bytes swizzled as swz<D> (128-byte
/// rows: the 128-byte swizzle, 64-byte rows: the 64-byte one). An operand with no rows gets an empty map (never read:
/// no tile has rows).
template <int D, class R, class B>
CUtensorMap tile_map(const quantized_ref<R, B>& x, const char* fn) {
    if (x.layout.rows == 0) return CUtensorMap{};
    return cuda::byte_matrix_map(reinterpret_cast<const std::uint8_t*>(x.data), x.layout.rows, x.layout.cols,
                                 x.layout.row_bytes, D, kTile,
                                 D == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B, fn);
}

inline void check_device_shape(const attention_shape& s, const char* fn) {
    OCTET_REQUIRE(s.head_dim == 64 || s.head_dim == 128, fn, "shape.head_dim",
                  detail::message("is ", s.head_dim,
                                  "; the CUDA kernels support head dims 64 and 128 (the host path takes any)"));
    OCTET_REQUIRE(s.device_cu_seqlens_q != nullptr, fn, "shape.device_cu_seqlens_q",
                  "is null; the stream overloads need device copies of the sequence offsets");
    cuda::require_device_accessible(s.device_cu_seqlens_q, fn, "shape.device_cu_seqlens_q");
    if (s.device_cu_seqlens_k) cuda::require_device_accessible(s.device_cu_seqlens_k, fn, "shape.device_cu_seqlens_k");
    OCTET_REQUIRE(
        s.device_cu_seqlens_k != nullptr || s.cu_seqlens_k.empty() || s.cu_seqlens_k.data() == s.cu_seqlens_q.data(),
        fn, "shape.device_cu_seqlens_k", "is null but cu_seqlens_k differs from cu_seqlens_q; pass its device copy");
}

}  // namespace attention
}  // namespace detail
}  // namespace octet
