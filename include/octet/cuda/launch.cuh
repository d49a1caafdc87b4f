// octet/cuda/launch.cuh: kernel launches (on the device, or under the interpreter) and launch-shape helpers.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <tuple>
#include <utility>

#include "octet/cuda/check.cuh"
#include "octet/cuda/interpret_seam.hpp"  // interpret::launch and the runtime, in interpret mode only

namespace octet {
namespace cuda {

/// Compute capability of the current device (major * 10 + minor), cached per device; 0 when there
/// is no usable CUDA device.
inline int compute_capability() {
    int device = 0, count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDevice(&device) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    // Idempotent values, so racing first calls are harmless; atomics make them data-race free.
    static std::atomic<int> cached[64] = {};
    if (device < 64 && cached[device].load(std::memory_order_relaxed))
        return cached[device].load(std::memory_order_relaxed);
    int major = 0, minor = 0;
    OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    const int arch = major * 10 + minor;
    if (device < 64) cached[device].store(arch, std::memory_order_relaxed);
    return arch;
}

/// A warp-specialized kernel moves registers between its warpgroups with setmaxnreg inside the CTA's
/// allocation, which must hold the `needed` registers its warpgroups ask for in all. That holds
/// unless the compiler gave the kernel fewer registers per thread than its launch bounds allow (the
/// kernel would then hang): an error naming argument `arg` of `fn`, with `fix`.
template <class Kernel>
void require_register_split(Kernel kernel, int threads, int needed, const char* fn, const char* arg, const char* fix) {
    cudaFuncAttributes attr{};
    OCTET_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    OCTET_REQUIRE(attr.numRegs * threads >= needed, fn, arg,
                  detail::message("the kernel was compiled with ", attr.numRegs,
                                  " registers per thread, too few for its register split; ", fix));
}

/// Multiprocessor count of the current device (queried once per device).
inline int multiprocessor_count() {
    int device = 0;
    OCTET_CUDA_CHECK(cudaGetDevice(&device));
    static std::atomic<int> cached[64] = {};  // idempotent values: racing first calls agree
    if (device < 64 && cached[device].load(std::memory_order_relaxed))
        return cached[device].load(std::memory_order_relaxed);
    int count = 0;
    OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    if (device < 64) cached[device].store(count, std::memory_order_relaxed);
    return count;
}

// (not `detail`: inside octet::cuda that name would hide octet::detail)
namespace launch_detail {
#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
/// Runs `kernel` under the interpreter with launch shape `cfg` now, or at each launch of the graph
/// when `stream` is being captured (interpret/runtime.hpp); the arguments are copied here, as a launch
/// copies them, and the kernel gets the dynamic shared memory opt-in cudaFuncSetAttribute gave it.
template <class... Params, class... Args>
void interpret_launch(const char* name, void (*kernel)(Params...), const interpret::launch_config& cfg,
                      cudaStream_t stream, Args&&... args) {
    interpret::options opt;
    opt.max_dynamic_shared = interpret::runtime::max_dynamic_shared(reinterpret_cast<const void*>(kernel));
    OCTET_CUDA_CHECK(interpret::runtime::enqueue(
        stream, [name, kernel, cfg, opt, params = std::make_tuple(std::forward<Args>(args)...)] {
            std::apply([&](const auto&... a) { interpret::launch(name, cfg, opt, kernel, a...); }, params);
            return cudaSuccess;
        }));
}
#else
/// cudaLaunchKernelEx's configuration for thread block clusters of `cluster` blocks (the attribute
/// lives in `attr`, which must outlive the configuration's use).
inline cudaLaunchConfig_t cluster_launch_config(dim3 grid, dim3 block, dim3 cluster, std::size_t shared_bytes,
                                                cudaStream_t stream, cudaLaunchAttribute& attr) {
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = cluster.x;
    attr.val.clusterDim.y = cluster.y;
    attr.val.clusterDim.z = cluster.z;
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    config.attrs = &attr;
    config.numAttrs = 1;
    return config;
}
#endif
}  // namespace launch_detail

/// Launches kernel<<<grid, block, shared_bytes, stream>>>(args...); in interpret mode
/// (OCTET_INTERPRET, the octet::interpret target) runs it under the interpreter instead, on the calling
/// thread (or records it, when `stream` is being captured into a graph), with the dynamic shared memory opt-in
/// cudaFuncSetAttribute gave the kernel; its reports are thrown as interpret::failure (a std::runtime_error,
/// not an octet::error: they are the checking tool's findings, not the library's) naming `name`.
/// Check the launch with OCTET_CUDA_CHECK_LAUNCH() as after <<<...>>>.
template <class... Params, class... Args>
void launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
            cudaStream_t stream, Args&&... args) {
#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    const interpret::launch_config cfg{{grid.x, grid.y, grid.z}, {block.x, block.y, block.z}, shared_bytes};
    launch_detail::interpret_launch(name, kernel, cfg, stream, std::forward<Args>(args)...);
#else
    (void)name;
    // clang-format 14 splits this `>>>` into `> > >` (template closers), which nvcc rejects.
    // clang-format off
    kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
    // clang-format on
#endif
}

/// launch() with thread block clusters of `cluster` blocks (cudaLaunchKernelEx with
/// cudaLaunchAttributeClusterDimension; the grid a whole number of clusters); under the interpreter,
/// interpret::launch_config::cluster.
template <class... Params, class... Args>
void launch_cluster(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, dim3 cluster,
                    std::size_t shared_bytes, cudaStream_t stream, Args&&... args) {
#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    interpret::launch_config cfg{{grid.x, grid.y, grid.z}, {block.x, block.y, block.z}, shared_bytes};
    cfg.cluster = {cluster.x, cluster.y, cluster.z};
    launch_detail::interpret_launch(name, kernel, cfg, stream, std::forward<Args>(args)...);
#else
    (void)name;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config =
        launch_detail::cluster_launch_config(grid, block, cluster, shared_bytes, stream, attr);
    // an error is left for OCTET_CUDA_CHECK_LAUNCH, as after <<<...>>>
    (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
#endif
}

/// How many clusters of `cluster_size` blocks (along x) of `kernel` can run at once on the current
/// device (cudaOccupancyMaxActiveClusters: clusters are placed within GPCs, so this may be below
/// multiprocessors / cluster_size), at least 1; the interpreter answers multiprocessors /
/// cluster_size. The kernel's dynamic shared memory attribute must be set first.
template <class... Params>
int max_active_clusters(void (*kernel)(Params...), dim3 block, std::size_t shared_bytes, unsigned cluster_size) {
#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    (void)kernel, (void)block, (void)shared_bytes;
    return std::max(1, multiprocessor_count() / static_cast<int>(cluster_size));
#else
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = launch_detail::cluster_launch_config(
        dim3(cluster_size), block, dim3(cluster_size), shared_bytes, nullptr, attr);
    int clusters = 0;
    OCTET_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    return std::max(clusters, 1);
#endif
}

/// Blocks for a grid-stride loop over `work_items` with `threads` per block: enough to fill the
/// device several times over, no more.
inline unsigned grid_stride_blocks(std::size_t work_items, int threads, int blocks_per_sm = 8) {
    const std::size_t needed = (work_items + threads - 1) / threads;
    const std::size_t cap = static_cast<std::size_t>(multiprocessor_count()) * blocks_per_sm;
    return static_cast<unsigned>(std::max<std::size_t>(1, std::min(needed, cap)));
}

/// A probe kernel marks the code path it guards with probe_marker() (a 16-byte static shared
/// array); image_has_marker tells whether the image the runtime loaded for the current device holds
/// that path, from cudaFuncGetAttributes alone: no allocation, no launch, no synchronization (so it
/// is safe during stream capture). No compatible image at all also answers false. Cached per device.
/// In interpret mode the probe's body is host code compiled under the guards of the modelled sm_90a
/// device (OCTET_ARCH_AT_LEAST, OCTET_ARCH_SM90A): the marker sets a flag, and image_has_marker
/// calls the probe as a plain function (it touches nothing else) and answers whether it was set, so
/// a path is available exactly when its guard admits interpret mode.
#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
inline bool& probe_marker_seen() {
    static thread_local bool seen = false;
    return seen;
}
#define OCTET_PROBE_MARKER() (::octet::cuda::probe_marker_seen() = true)
#else
#define OCTET_PROBE_MARKER()                         \
    do {                                             \
        __shared__ volatile int octet_probe_mark[4]; \
        octet_probe_mark[threadIdx.x & 3] = 1;       \
    } while (0)
#endif

template <class Kernel>
bool image_has_marker(Kernel kernel, std::atomic<int> (&cache)[64]) {
#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    (void)cache;
    bool& seen = probe_marker_seen();
    seen = false;
    kernel();
    return seen;
#else
    int device = 0;
    OCTET_CUDA_CHECK(cudaGetDevice(&device));
    if (device < 64 && cache[device].load(std::memory_order_relaxed))  // 0 unknown, 1 no, 2 yes
        return cache[device].load(std::memory_order_relaxed) == 2;
    cudaFuncAttributes attr{};
    const cudaError_t err = cudaFuncGetAttributes(&attr, kernel);
    if (err != cudaSuccess) cudaGetLastError();  // no image for this device: not sticky, clear it
    const bool yes = err == cudaSuccess && attr.sharedSizeBytes >= 4 * sizeof(int);
    if (device < 64) cache[device].store(yes ? 2 : 1, std::memory_order_relaxed);
    return yes;
#endif
}

}  // namespace cuda
}  // namespace octet
