// octet/interpret/runtime.hpp: the part of the CUDA runtime API that octet's stream functions and its
// tests call, served on the host for a program built in interpret mode (OCTET_INTERPRET, a compiler
// other than nvcc; octet/interpret/cuda.hpp includes this after the toolkit's headers and maps each
// cudaXxx name onto the function here, so the same source calls these instead of libcudart).
//
// The model: one device (ordinal 0) with the limits of interpret::device_model (sm_90 by default);
// device memory is host memory from guarded buffers (an access past an allocation's end inside a launch
// is an out-of-bounds report; allocations start 16-byte aligned, not 256 as cudaMalloc's do); every
// stream, including the default one, runs its work when it is enqueued (a kernel runs under the
// interpreter inside octet::cuda::launch), so a copy or a synchronization never waits. Launch failures
// and the interpreter's reports are thrown (interpret::failure, an octet::error), not left for
// cudaGetLastError. cudaPointerGetAttributes says "device" exactly for the allocations made here.
// cudaGetDriverEntryPoint[ByVersion] finds one driver function, the model's cuTensorMapEncodeTiled
// (interpret/ptx_models.hpp). Graphs, events' timing, peer access and the rest of the driver API are not modelled:
// calling them does not compile or does not link in interpret mode. Without OCTET_INTERPRET (or under nvcc) this header
// is empty.
#pragma once

#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "octet/interpret/interpret.hpp"
#include "octet/interpret/tensor_map.hpp"

namespace octet {
namespace interpret {
namespace runtime {

/// The device the runtime reports (name, compute capability, multiprocessors). Launches check
/// shared-memory sizes against interpret::device_model{} (sm_90); the multiprocessor count is small so
/// that grid-stride launches sized to the device stay small on the CPU.
inline constexpr int kComputeMajor = 9, kComputeMinor = 0, kMultiprocessors = 2;

namespace detail {
struct state {
    std::mutex mutex;
    std::map<const void*, std::unique_ptr<guarded_buffer<unsigned char>>> allocations;
    std::map<const void*, std::size_t> max_dynamic_shared;  // per kernel, from cudaFuncSetAttribute
    unsigned long long next_id = 0;
};
/// The runtime's state, like libcudart's own: one per process.
inline state& global() {
    static state s;
    return s;
}
inline bool is_allocation(const void* p) {
    state& s = global();
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.allocations.upper_bound(p);
    if (it == s.allocations.begin()) return false;
    --it;
    const auto* base = static_cast<const unsigned char*>(it->first);
    const auto* q = static_cast<const unsigned char*>(p);
    return q >= base && q < base + std::max<std::size_t>(1, it->second->size());
}
}  // namespace detail

inline cudaError_t cuda_malloc(void** p, std::size_t bytes) {
    if (p == nullptr) return cudaErrorInvalidValue;
    detail::state& s = detail::global();
    std::lock_guard<std::mutex> lock(s.mutex);
    auto buffer = std::make_unique<guarded_buffer<unsigned char>>(
        bytes, "device allocation #" + std::to_string(++s.next_id) + " (" + std::to_string(bytes) + " bytes)");
    *p = buffer->data();
    s.allocations[*p] = std::move(buffer);
    return cudaSuccess;
}
template <class T>
cudaError_t cuda_malloc(T** p, std::size_t bytes) {
    return cuda_malloc(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cuda_free(void* p) {
    if (p == nullptr) return cudaSuccess;
    detail::state& s = detail::global();
    std::lock_guard<std::mutex> lock(s.mutex);
    return s.allocations.erase(p) ? cudaSuccess : cudaErrorInvalidValue;
}
template <class T>
cudaError_t cuda_malloc_async(T** p, std::size_t bytes, cudaStream_t) {
    return cuda_malloc(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cuda_free_async(void* p, cudaStream_t) {
    return cuda_free(p);
}

inline cudaError_t cuda_memcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind = cudaMemcpyDefault) {
    if (bytes) std::memmove(dst, src, bytes);
    return cudaSuccess;
}
inline cudaError_t cuda_memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                                     cudaStream_t = nullptr) {
    return cuda_memcpy(dst, src, bytes, kind);
}
inline cudaError_t cuda_memset(void* dst, int value, std::size_t bytes) {
    if (bytes) std::memset(dst, value, bytes);
    return cudaSuccess;
}
inline cudaError_t cuda_memset_async(void* dst, int value, std::size_t bytes, cudaStream_t = nullptr) {
    return cuda_memset(dst, value, bytes);
}

inline cudaError_t cuda_pointer_get_attributes(cudaPointerAttributes* attr, const void* p) {
    if (attr == nullptr) return cudaErrorInvalidValue;
    *attr = cudaPointerAttributes{};
    if (detail::is_allocation(p)) {
        attr->type = cudaMemoryTypeDevice;
        attr->device = 0;
        attr->devicePointer = const_cast<void*>(p);
    } else {
        attr->type = cudaMemoryTypeUnregistered;
    }
    return cudaSuccess;
}

// Work runs when it is enqueued: nothing is ever pending.
inline cudaError_t cuda_stream_synchronize(cudaStream_t) {
    return cudaSuccess;
}
inline cudaError_t cuda_device_synchronize() {
    return cudaSuccess;
}
inline cudaError_t cuda_get_last_error() {
    return cudaSuccess;
}
inline cudaError_t cuda_stream_create_with_flags(cudaStream_t* s, unsigned) {
    static char handles;  // any non-null, distinct-from-default value will do
    *s = reinterpret_cast<cudaStream_t>(&handles);
    return cudaSuccess;
}
inline cudaError_t cuda_stream_create(cudaStream_t* s) {
    return cuda_stream_create_with_flags(s, 0);
}
inline cudaError_t cuda_stream_destroy(cudaStream_t) {
    return cudaSuccess;
}

inline cudaError_t cuda_get_device_count(int* n) {
    *n = 1;
    return cudaSuccess;
}
inline cudaError_t cuda_get_device(int* d) {
    *d = 0;
    return cudaSuccess;
}
inline cudaError_t cuda_set_device(int d) {
    return d == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}
inline cudaError_t cuda_device_get_attribute(int* value, cudaDeviceAttr attr, int device) {
    if (device != 0) return cudaErrorInvalidDevice;
    const device_model m{};
    switch (attr) {
        case cudaDevAttrComputeCapabilityMajor:
            *value = kComputeMajor;
            return cudaSuccess;
        case cudaDevAttrComputeCapabilityMinor:
            *value = kComputeMinor;
            return cudaSuccess;
        case cudaDevAttrMultiProcessorCount:
            *value = kMultiprocessors;
            return cudaSuccess;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin:
            *value = static_cast<int>(m.shared_per_block_optin);
            return cudaSuccess;
        case cudaDevAttrMaxSharedMemoryPerBlock:
            *value = static_cast<int>(m.shared_per_block);
            return cudaSuccess;
        case cudaDevAttrMaxThreadsPerBlock:
            *value = static_cast<int>(m.max_threads_per_block);
            return cudaSuccess;
        case cudaDevAttrWarpSize:
            *value = 32;
            return cudaSuccess;
        default:
            return cudaErrorInvalidValue;
    }
}
inline cudaError_t cuda_get_device_properties(cudaDeviceProp* p, int device) {
    if (device != 0) return cudaErrorInvalidDevice;
    *p = cudaDeviceProp{};
    std::strncpy(p->name, "octet interpreter (CPU)", sizeof(p->name) - 1);
    p->major = kComputeMajor;
    p->minor = kComputeMinor;
    p->multiProcessorCount = kMultiprocessors;
#pragma push_macro("warpSize")  // the field, not cuda_names.hpp's kernel-side constant
#undef warpSize
    p->warpSize = 32;
#pragma pop_macro("warpSize")
    const device_model m{};
    p->sharedMemPerBlock = m.shared_per_block;
    p->sharedMemPerBlockOptin = m.shared_per_block_optin;
    p->maxThreadsPerBlock = static_cast<int>(m.max_threads_per_block);
    return cudaSuccess;
}

/// The opt-in a launch of `kernel` gets (cudaFuncAttributeMaxDynamicSharedMemorySize).
inline std::size_t max_dynamic_shared(const void* kernel) {
    detail::state& s = detail::global();
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.max_dynamic_shared.find(kernel);
    return it == s.max_dynamic_shared.end() ? 0 : it->second;
}
template <class F>
cudaError_t cuda_func_set_attribute(F* kernel, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;  // carveout etc.: no effect here
    if (value < 0 || static_cast<std::size_t>(value) > device_model{}.shared_per_block_optin)
        return cudaErrorInvalidValue;
    detail::state& s = detail::global();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.max_dynamic_shared[reinterpret_cast<const void*>(kernel)] = static_cast<std::size_t>(value);
    return cudaSuccess;
}

/// cudaFuncGetAttributes: the kernel's limits as the model sees them. Not exact: static shared memory
/// is known only at a launch (0 here), and registers are not modelled (numRegs is 255, the most a
/// thread may have, so that a kernel's own register-budget checks pass).
template <class F>
cudaError_t cuda_func_get_attributes(cudaFuncAttributes* attr, F* kernel) {
    if (!attr || !kernel) return cudaErrorInvalidValue;
    const device_model m{};
    *attr = cudaFuncAttributes{};
    attr->maxThreadsPerBlock = static_cast<int>(m.max_threads_per_block);
    attr->maxDynamicSharedSizeBytes = static_cast<int>(max_dynamic_shared(reinterpret_cast<const void*>(kernel)));
    attr->numRegs = 255;
    attr->ptxVersion = attr->binaryVersion = kComputeMajor * 10 + kComputeMinor;
    return cudaSuccess;
}

/// The driver entry points a program may look up: cuTensorMapEncodeTiled (the model's, which stores its
/// own description in the map for the TMA model). Any other symbol is not found.
inline cudaError_t cuda_get_driver_entry_point_by_version(const char* symbol, void** fn, unsigned /*version*/,
                                                          unsigned long long /*flags*/,
                                                          cudaDriverEntryPointQueryResult* status = nullptr) {
    if (!symbol || !fn) return cudaErrorInvalidValue;
    const bool known = std::strcmp(symbol, "cuTensorMapEncodeTiled") == 0;
    *fn = known ? reinterpret_cast<void*>(&model::tensor_map_encode_tiled) : nullptr;
    if (status) *status = known ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}
inline cudaError_t cuda_get_driver_entry_point(const char* symbol, void** fn, unsigned long long flags,
                                               cudaDriverEntryPointQueryResult* status = nullptr) {
    return cuda_get_driver_entry_point_by_version(symbol, fn, 12000, flags, status);
}

inline const char* cuda_get_error_name(cudaError_t e) {
    switch (e) {
        case cudaSuccess:
            return "cudaSuccess";
        case cudaErrorInvalidValue:
            return "cudaErrorInvalidValue";
        case cudaErrorInvalidDevice:
            return "cudaErrorInvalidDevice";
        default:
            return "cudaError (interpret mode)";
    }
}
inline const char* cuda_get_error_string(cudaError_t e) {
    switch (e) {
        case cudaSuccess:
            return "no error";
        case cudaErrorInvalidValue:
            return "invalid argument";
        case cudaErrorInvalidDevice:
            return "invalid device ordinal";
        default:
            return "an error the interpret-mode runtime does not describe";
    }
}

}  // namespace runtime
}  // namespace interpret
}  // namespace octet

// Each name as libcudart spells it, onto the functions above (after the toolkit's declarations, which
// <cuda_runtime.h> above made; object-like macros, so templates and overloads work; #undef first, as
// the toolkit itself maps some names, e.g. cudaGetDeviceProperties onto a versioned symbol).
#undef cudaMalloc
#define cudaMalloc ::octet::interpret::runtime::cuda_malloc
#undef cudaFree
#define cudaFree ::octet::interpret::runtime::cuda_free
#undef cudaMallocAsync
#define cudaMallocAsync ::octet::interpret::runtime::cuda_malloc_async
#undef cudaFreeAsync
#define cudaFreeAsync ::octet::interpret::runtime::cuda_free_async
#undef cudaMemcpy
#define cudaMemcpy ::octet::interpret::runtime::cuda_memcpy
#undef cudaMemcpyAsync
#define cudaMemcpyAsync ::octet::interpret::runtime::cuda_memcpy_async
#undef cudaMemset
#define cudaMemset ::octet::interpret::runtime::cuda_memset
#undef cudaMemsetAsync
#define cudaMemsetAsync ::octet::interpret::runtime::cuda_memset_async
#undef cudaPointerGetAttributes
#define cudaPointerGetAttributes ::octet::interpret::runtime::cuda_pointer_get_attributes
#undef cudaStreamSynchronize
#define cudaStreamSynchronize ::octet::interpret::runtime::cuda_stream_synchronize
#undef cudaDeviceSynchronize
#define cudaDeviceSynchronize ::octet::interpret::runtime::cuda_device_synchronize
#undef cudaGetLastError
#define cudaGetLastError ::octet::interpret::runtime::cuda_get_last_error
#undef cudaPeekAtLastError
#define cudaPeekAtLastError ::octet::interpret::runtime::cuda_get_last_error
#undef cudaStreamCreateWithFlags
#define cudaStreamCreateWithFlags ::octet::interpret::runtime::cuda_stream_create_with_flags
#undef cudaStreamCreate
#define cudaStreamCreate ::octet::interpret::runtime::cuda_stream_create
#undef cudaStreamDestroy
#define cudaStreamDestroy ::octet::interpret::runtime::cuda_stream_destroy
#undef cudaGetDeviceCount
#define cudaGetDeviceCount ::octet::interpret::runtime::cuda_get_device_count
#undef cudaGetDevice
#define cudaGetDevice ::octet::interpret::runtime::cuda_get_device
#undef cudaSetDevice
#define cudaSetDevice ::octet::interpret::runtime::cuda_set_device
#undef cudaDeviceGetAttribute
#define cudaDeviceGetAttribute ::octet::interpret::runtime::cuda_device_get_attribute
#undef cudaGetDeviceProperties
#define cudaGetDeviceProperties ::octet::interpret::runtime::cuda_get_device_properties
#undef cudaFuncSetAttribute
#define cudaFuncSetAttribute ::octet::interpret::runtime::cuda_func_set_attribute
#undef cudaFuncGetAttributes
#define cudaFuncGetAttributes ::octet::interpret::runtime::cuda_func_get_attributes
#undef cudaGetErrorName
#define cudaGetErrorName ::octet::interpret::runtime::cuda_get_error_name
#undef cudaGetErrorString
#define cudaGetErrorString ::octet::interpret::runtime::cuda_get_error_string
#undef cudaGetDriverEntryPointByVersion
#define cudaGetDriverEntryPointByVersion ::octet::interpret::runtime::cuda_get_driver_entry_point_by_version
#undef cudaGetDriverEntryPoint
#define cudaGetDriverEntryPoint ::octet::interpret::runtime::cuda_get_driver_entry_point
#endif  // OCTET_INTERPRET
