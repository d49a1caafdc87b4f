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
// and the interpreter's reports are thrown (interpret::failure, an interpret::error), not left for
// cudaGetLastError. cudaPointerGetAttributes says "device" exactly for the allocations made here.
// cudaGetDriverEntryPoint[ByVersion] finds one driver function, the model's cuTensorMapEncodeTiled
// (interpret/ptx_models.hpp).
//
// Stream capture and graphs: between cudaStreamBeginCapture and cudaStreamEndCapture a stream records
// its work (kernel launches, async copies and sets, async frees) instead of running it; the graph's
// instance runs it, in order, at each cudaGraphLaunch (an interpreter report is thrown from there).
// cudaMallocAsync on a capturing stream is an allocation node: its address is fixed at capture and
// stays valid while the graph or an instance of it lives (CUDA maps it only while the graph runs; an
// access outside a launch of the graph is not caught here). The capture rules are CUDA's: in global
// mode any thread, in thread-local mode the capturing thread, may not make a call that can
// synchronize or is not stream-ordered (cudaMalloc, cudaFree, cudaMemcpy, cudaMemset,
// cudaStreamSynchronize, cudaDeviceSynchronize): the call fails with cudaErrorStreamCaptureUnsupported
// and invalidates the capture, whose cudaStreamEndCapture then fails with
// cudaErrorStreamCaptureInvalidated; relaxed mode permits them (synchronizing the capturing stream
// itself never is). Not modelled: a capture that spans streams through events, the legacy default
// stream's implicit synchronization with a capturing stream, graph editing and updates, events'
// timing, peer access and the rest of the driver API (calling them does not compile or does not link
// in interpret mode). Without OCTET_INTERPRET (or under nvcc) this header is empty.
#pragma once

#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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
struct graph_body;
/// A capture under way on one stream.
struct capture {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::thread::id thread;
    std::shared_ptr<graph_body> graph;
    cudaError_t invalidated = cudaSuccess;  ///< the error of the call that invalidated it
};
/// What a graph handle (cudaGraph_t) and an instance (cudaGraphExec_t) point to.
struct graph_handle {
    std::shared_ptr<graph_body> body;
};
struct state {
    std::mutex mutex;
    std::map<const void*, std::unique_ptr<guarded_buffer<unsigned char>>> allocations;
    std::map<const void*, std::size_t> max_dynamic_shared;  // per kernel, from cudaFuncSetAttribute
    std::map<const void*, std::unique_ptr<char>> streams;   // created streams (a handle is the char's address)
    std::map<cudaStream_t, capture> captures;
    std::map<const void*, std::unique_ptr<graph_handle>> graphs, instances;
    unsigned long long next_id = 0;
};
/// The runtime's state, like libcudart's own: one per process.
inline state& global() {
    static state s;
    return s;
}
/// A captured stream's work in stream order; each step returns the error its call would have. The
/// memory of the allocation nodes is the graph's while the graph or an instance of it lives.
struct graph_body {
    std::vector<std::function<cudaError_t()>> steps;
    std::vector<const void*> reserved;
    graph_body() = default;
    graph_body(const graph_body&) = delete;
    graph_body& operator=(const graph_body&) = delete;
    ~graph_body() {
        state& s = global();
        std::lock_guard<std::mutex> lock(s.mutex);
        for (const void* p : reserved) s.allocations.erase(p);
    }
};

/// Whether this thread may make a call CUDA forbids during a capture (one that can synchronize or is
/// not stream-ordered): not while this thread captures in global or thread-local mode, nor while any
/// thread captures in global mode. A forbidden call invalidates those captures. Caller holds the lock.
inline cudaError_t check_capture_unsafe_call(state& s) {
    cudaError_t e = cudaSuccess;
    const std::thread::id me = std::this_thread::get_id();
    for (auto& c : s.captures) {
        const capture& k = c.second;
        if (k.mode == cudaStreamCaptureModeGlobal || (k.mode == cudaStreamCaptureModeThreadLocal && k.thread == me)) {
            c.second.invalidated = e = cudaErrorStreamCaptureUnsupported;
        }
    }
    return e;
}
inline cudaError_t check_capture_unsafe_call() {
    state& s = global();
    std::lock_guard<std::mutex> lock(s.mutex);
    return check_capture_unsafe_call(s);
}
/// The capture under way on `stream`, or null. Caller holds the lock.
inline capture* capturing(state& s, cudaStream_t stream) {
    auto it = s.captures.find(stream);
    return it == s.captures.end() ? nullptr : &it->second;
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

/// Runs `work` (a callable returning cudaError_t) now, or, when `stream` is being captured, records it
/// for the graph and returns cudaSuccess (cudaErrorStreamCaptureInvalidated once the capture is).
template <class F>
cudaError_t enqueue(cudaStream_t stream, F&& work) {
    {
        detail::state& s = detail::global();
        std::lock_guard<std::mutex> lock(s.mutex);
        if (detail::capture* c = detail::capturing(s, stream)) {
            if (c->invalidated != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
            c->graph->steps.emplace_back(std::forward<F>(work));
            return cudaSuccess;
        }
    }
    return work();
}

namespace detail {
inline void* allocate(state& s, std::size_t bytes) {
    auto buffer = std::make_unique<guarded_buffer<unsigned char>>(
        bytes, "device allocation #" + std::to_string(++s.next_id) + " (" + std::to_string(bytes) + " bytes)");
    void* p = buffer->data();
    s.allocations[p] = std::move(buffer);
    return p;
}
inline cudaError_t release(void* p) {
    if (p == nullptr) return cudaSuccess;
    state& s = global();
    std::lock_guard<std::mutex> lock(s.mutex);
    return s.allocations.erase(p) ? cudaSuccess : cudaErrorInvalidValue;
}
}  // namespace detail

inline cudaError_t cuda_malloc(void** p, std::size_t bytes) {
    if (p == nullptr) return cudaErrorInvalidValue;
    detail::state& s = detail::global();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (const cudaError_t e = detail::check_capture_unsafe_call(s)) return e;
    *p = detail::allocate(s, bytes);
    return cudaSuccess;
}
template <class T>
cudaError_t cuda_malloc(T** p, std::size_t bytes) {
    return cuda_malloc(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cuda_free(void* p) {
    if (const cudaError_t e = detail::check_capture_unsafe_call()) return e;
    return detail::release(p);
}
/// On a capturing stream: an allocation node (the address is the graph's, see the header's comment).
inline cudaError_t cuda_malloc_async(void** p, std::size_t bytes, cudaStream_t stream) {
    if (p == nullptr) return cudaErrorInvalidValue;
    detail::state& s = detail::global();
    std::lock_guard<std::mutex> lock(s.mutex);
    detail::capture* c = detail::capturing(s, stream);
    if (c && c->invalidated != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
    *p = detail::allocate(s, bytes);
    if (c) c->graph->reserved.push_back(*p);
    return cudaSuccess;
}
template <class T>
cudaError_t cuda_malloc_async(T** p, std::size_t bytes, cudaStream_t stream) {
    return cuda_malloc_async(reinterpret_cast<void**>(p), bytes, stream);
}
/// On a capturing stream: a free node (of the graph's own allocation: nothing to do until the graph
/// dies; of an earlier allocation: freed when the graph runs, an error at a second launch).
inline cudaError_t cuda_free_async(void* p, cudaStream_t stream) {
    {
        detail::state& s = detail::global();
        std::lock_guard<std::mutex> lock(s.mutex);
        if (detail::capture* c = detail::capturing(s, stream)) {
            const auto& r = c->graph->reserved;
            if (p == nullptr || std::find(r.begin(), r.end(), p) != r.end())
                return c->invalidated != cudaSuccess ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
        }
    }
    return enqueue(stream, [p] { return detail::release(p); });
}

inline cudaError_t cuda_memcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind = cudaMemcpyDefault) {
    if (const cudaError_t e = detail::check_capture_unsafe_call()) return e;
    if (bytes) std::memmove(dst, src, bytes);
    return cudaSuccess;
}
inline cudaError_t cuda_memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind,
                                     cudaStream_t stream = nullptr) {
    return enqueue(stream, [=] {
        if (bytes) std::memmove(dst, src, bytes);
        return cudaSuccess;
    });
}
inline cudaError_t cuda_memset(void* dst, int value, std::size_t bytes) {
    if (const cudaError_t e = detail::check_capture_unsafe_call()) return e;
    if (bytes) std::memset(dst, value, bytes);
    return cudaSuccess;
}
inline cudaError_t cuda_memset_async(void* dst, int value, std::size_t bytes, cudaStream_t stream = nullptr) {
    return enqueue(stream, [=] {
        if (bytes) std::memset(dst, value, bytes);
        return cudaSuccess;
    });
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

// Work runs when it is enqueued (or is recorded by a capture): nothing is ever pending.
inline cudaError_t cuda_stream_synchronize(cudaStream_t stream) {
    detail::state& s = detail::global();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (detail::capture* c = detail::capturing(s, stream)) {
        c->invalidated = cudaErrorStreamCaptureUnsupported;
        return cudaErrorStreamCaptureUnsupported;
    }
    return detail::check_capture_unsafe_call(s);
}
inline cudaError_t cuda_device_synchronize() {
    return detail::check_capture_unsafe_call();
}
inline cudaError_t cuda_get_last_error() {
    return cudaSuccess;
}
inline cudaError_t cuda_stream_create_with_flags(cudaStream_t* stream, unsigned) {
    if (stream == nullptr) return cudaErrorInvalidValue;
    detail::state& s = detail::global();
    std::lock_guard<std::mutex> lock(s.mutex);
    auto handle = std::make_unique<char>();
    *stream = reinterpret_cast<cudaStream_t>(handle.get());
    s.streams[handle.get()] = std::move(handle);
    return cudaSuccess;
}
inline cudaError_t cuda_stream_create(cudaStream_t* s) {
    return cuda_stream_create_with_flags(s, 0);
}
inline cudaError_t cuda_stream_destroy(cudaStream_t stream) {
    std::shared_ptr<detail::graph_body> dropped;  // released after the lock (its destructor takes it)
    detail::state& s = detail::global();
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.streams.find(reinterpret_cast<const void*>(stream));
    if (it == s.streams.end()) return cudaErrorInvalidResourceHandle;
    if (detail::capture* c = detail::capturing(s, stream)) {
        dropped = std::move(c->graph);
        s.captures.erase(stream);
    }
    s.streams.erase(it);
    return cudaSuccess;
}

/// cudaStreamBeginCapture: from here `stream` records its work (see the header's comment). The legacy
/// default stream cannot be captured.
inline cudaError_t cuda_stream_begin_capture(cudaStream_t stream, cudaStreamCaptureMode mode) {
    if (stream == nullptr || stream == cudaStreamLegacy) return cudaErrorStreamCaptureUnsupported;
    detail::state& s = detail::global();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (detail::capturing(s, stream)) return cudaErrorIllegalState;
    detail::capture c;
    c.mode = mode;
    c.thread = std::this_thread::get_id();
    c.graph = std::make_shared<detail::graph_body>();
    s.captures.emplace(stream, std::move(c));
    return cudaSuccess;
}
/// cudaStreamEndCapture: the recorded work as a graph, or null and cudaErrorStreamCaptureInvalidated
/// when a forbidden call invalidated the capture.
inline cudaError_t cuda_stream_end_capture(cudaStream_t stream, cudaGraph_t* graph) {
    if (graph == nullptr) return cudaErrorInvalidValue;
    std::shared_ptr<detail::graph_body> body;  // released after the lock (its destructor takes it)
    detail::state& s = detail::global();
    std::lock_guard<std::mutex> lock(s.mutex);
    detail::capture* c = detail::capturing(s, stream);
    if (!c) return cudaErrorIllegalState;
    if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
        return cudaErrorStreamCaptureWrongThread;
    const cudaError_t invalidated = c->invalidated;
    body = std::move(c->graph);
    s.captures.erase(stream);
    if (invalidated != cudaSuccess) {
        *graph = nullptr;
        return cudaErrorStreamCaptureInvalidated;
    }
    auto handle = std::make_unique<detail::graph_handle>();
    handle->body = std::move(body);
    *graph = reinterpret_cast<cudaGraph_t>(handle.get());
    s.graphs[handle.get()] = std::move(handle);
    return cudaSuccess;
}
inline cudaError_t cuda_stream_is_capturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
    if (status == nullptr) return cudaErrorInvalidValue;
    detail::state& s = detail::global();
    std::lock_guard<std::mutex> lock(s.mutex);
    const detail::capture* c = detail::capturing(s, stream);
    *status = !c                              ? cudaStreamCaptureStatusNone
              : c->invalidated != cudaSuccess ? cudaStreamCaptureStatusInvalidated
                                              : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

namespace detail {
/// Removes a graph or an instance handle; its body dies after the lock is released.
inline cudaError_t destroy_handle(std::map<const void*, std::unique_ptr<graph_handle>> state::*which,
                                  const void* handle) {
    std::unique_ptr<graph_handle> dropped;
    state& s = global();
    std::lock_guard<std::mutex> lock(s.mutex);
    auto& handles = s.*which;
    auto it = handles.find(handle);
    if (it == handles.end()) return cudaErrorInvalidValue;
    dropped = std::move(it->second);
    handles.erase(it);
    return cudaSuccess;
}
}  // namespace detail

/// cudaGraphInstantiate: an instance runs the graph's work as captured (graphs are not edited here).
inline cudaError_t cuda_graph_instantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long = 0) {
    if (exec == nullptr) return cudaErrorInvalidValue;
    detail::state& s = detail::global();
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.graphs.find(reinterpret_cast<const void*>(graph));
    if (it == s.graphs.end()) return cudaErrorInvalidValue;
    auto handle = std::make_unique<detail::graph_handle>();
    handle->body = it->second->body;
    *exec = reinterpret_cast<cudaGraphExec_t>(handle.get());
    s.instances[handle.get()] = std::move(handle);
    return cudaSuccess;
}
/// cudaGraphLaunch: runs the instance's work in order on `stream` (recorded, if `stream` is capturing);
/// the first failing step's error is returned, an interpreter report is thrown.
inline cudaError_t cuda_graph_launch(cudaGraphExec_t exec, cudaStream_t stream) {
    std::shared_ptr<detail::graph_body> body;
    {
        detail::state& s = detail::global();
        std::lock_guard<std::mutex> lock(s.mutex);
        auto it = s.instances.find(reinterpret_cast<const void*>(exec));
        if (it == s.instances.end()) return cudaErrorInvalidValue;
        body = it->second->body;
    }
    return enqueue(stream, [body] {
        for (const auto& step : body->steps)
            if (const cudaError_t e = step()) return e;
        return cudaSuccess;
    });
}
inline cudaError_t cuda_graph_destroy(cudaGraph_t graph) {
    return detail::destroy_handle(&detail::state::graphs, reinterpret_cast<const void*>(graph));
}
inline cudaError_t cuda_graph_exec_destroy(cudaGraphExec_t exec) {
    return detail::destroy_handle(&detail::state::instances, reinterpret_cast<const void*>(exec));
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
#pragma push_macro("warpSize")  // the field, not cuda_builtins.hpp's kernel-side constant
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
        case cudaErrorInvalidResourceHandle:
            return "cudaErrorInvalidResourceHandle";
        case cudaErrorIllegalState:
            return "cudaErrorIllegalState";
        case cudaErrorStreamCaptureUnsupported:
            return "cudaErrorStreamCaptureUnsupported";
        case cudaErrorStreamCaptureInvalidated:
            return "cudaErrorStreamCaptureInvalidated";
        case cudaErrorStreamCaptureWrongThread:
            return "cudaErrorStreamCaptureWrongThread";
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
        case cudaErrorInvalidResourceHandle:
            return "invalid resource handle";
        case cudaErrorIllegalState:
            return "the resource is not in a valid state to perform the requested operation";
        case cudaErrorStreamCaptureUnsupported:
            return "operation not permitted when stream is capturing";
        case cudaErrorStreamCaptureInvalidated:
            return "operation failed due to a previous error during capture";
        case cudaErrorStreamCaptureWrongThread:
            return "attempt to terminate a thread-local capture sequence from another thread";
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
#undef cudaStreamBeginCapture
#define cudaStreamBeginCapture ::octet::interpret::runtime::cuda_stream_begin_capture
#undef cudaStreamEndCapture
#define cudaStreamEndCapture ::octet::interpret::runtime::cuda_stream_end_capture
#undef cudaStreamIsCapturing
#define cudaStreamIsCapturing ::octet::interpret::runtime::cuda_stream_is_capturing
#undef cudaGraphInstantiate
#define cudaGraphInstantiate ::octet::interpret::runtime::cuda_graph_instantiate
#undef cudaGraphLaunch
#define cudaGraphLaunch ::octet::interpret::runtime::cuda_graph_launch
#undef cudaGraphDestroy
#define cudaGraphDestroy ::octet::interpret::runtime::cuda_graph_destroy
#undef cudaGraphExecDestroy
#define cudaGraphExecDestroy ::octet::interpret::runtime::cuda_graph_exec_destroy
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
