// Interpret mode end to end, on small kernels written here: CUDA source compiled as C++ with
// OCTET_INTERPRET (octet/interpret/cuda.hpp), device memory from the host runtime
// (interpret/runtime.hpp), launches through octet::cuda::launch. Each check is one a user's kernel
// gets: results equal a host loop, memory errors in device allocations and shared memory are reported
// naming the kernel, the shared-memory opt-in is honoured as on the device, and stream capture follows
// CUDA's rules (work is recorded, not run; calls that could synchronize fail and invalidate the capture;
// the graph runs the work at each launch), as the CUDA runtime API documentation states them.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "octet/cuda/buffer.cuh"
#include "octet/cuda/check.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/shared_memory.cuh"

namespace interpret_runtime_test {
namespace oi = octet::interpret;
using octet::cuda::launch;

OCTET_KERNEL void saxpy_kernel(float a, const float* x, float* y, std::size_t n) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

/// Off by one: the bound is <= n, so the last thread writes one element past the allocation.
OCTET_KERNEL void fill_past_end_kernel(float* y, std::size_t n) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i <= n) y[i] = 1.0f;
}

/// Reverses each block's 256 values through shared memory; `with_barrier` false drops the barrier
/// between the writes and the reads of other threads' values.
OCTET_KERNEL void reverse_kernel(const int* in, int* out, bool with_barrier) {
    OCTET_SHARED(int[256], tile);
    const unsigned t = threadIdx.x, base = blockIdx.x * 256;
    tile[t] = in[base + t];
    if (with_barrier) __syncthreads();
    out[base + t] = tile[255 - t];
}

/// Touches every byte of its dynamic shared memory.
OCTET_KERNEL void dynamic_shared_kernel(std::size_t bytes, unsigned* out) {
    OCTET_DYNAMIC_SHARED(unsigned char, smem);
    for (std::size_t i = threadIdx.x; i < bytes; i += blockDim.x) smem[i] = static_cast<unsigned char>(i);
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned s = 0;
        for (std::size_t i = 0; i < bytes; ++i) s += smem[i];
        *out = s;
    }
}

TEST_CASE("a kernel on device allocations equals the host loop; host pointers are not device memory") {
    const std::size_t n = 1000;
    std::vector<float> x(n), y(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = 0.5f * static_cast<float>(i), y[i] = 3.0f - static_cast<float>(i);
    octet::cuda::device_buffer<float> dx(x), dy(y);
    launch("saxpy_kernel", saxpy_kernel, static_cast<unsigned>((n + 127) / 128), 128, 0, nullptr, 2.0f, dx.data(),
           dy.data(), n);
    OCTET_CUDA_CHECK_LAUNCH();
    const auto got = dy.download();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += got[i] != 2.0f * x[i] + y[i];
    CHECK(bad == 0);

    CHECK_NOTHROW(octet::cuda::require_device_accessible(dx.data() + 7, "f", "x"));
    CHECK_THROWS_WITH_AS(octet::cuda::require_device_accessible(x.data(), "f", "x"), doctest::Contains("host memory"),
                         octet::error);
}

TEST_CASE("a write past the end of a device allocation is reported with the kernel and the offset") {
    const std::size_t n = 64;  // 256 bytes: the allocation ends exactly at its guard page
    octet::cuda::device_buffer<float> y(n);
    try {
        launch("fill_past_end_kernel", fill_past_end_kernel, 1, 128, 0, nullptr, y.data(), n);
        FAIL("no report");
    } catch (const oi::failure& f) {
        CHECK(f.which().kind == oi::check::out_of_bounds);
        CHECK(f.which().kernel == "fill_past_end_kernel");
        CHECK(f.which().thread.x == n);
        CHECK(std::string(f.what()).find("device allocation") != std::string::npos);
    }
}

TEST_CASE("a missing barrier before reading other threads' shared values is reported") {
    std::vector<int> in(512);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int>(i * 3 + 1);
    octet::cuda::device_buffer<int> din(in), dout(in.size());
    launch("reverse_kernel", reverse_kernel, 2, 256, 0, nullptr, din.data(), dout.data(), true);
    const auto got = dout.download();
    std::size_t bad = 0;
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t t = 0; t < 256; ++t) bad += got[b * 256 + t] != in[b * 256 + 255 - t];
    CHECK(bad == 0);
    try {
        launch("reverse_kernel", reverse_kernel, 2, 256, 0, nullptr, din.data(), dout.data(), false);
        FAIL("no report");
    } catch (const oi::failure& f) {
        // Without a barrier thread 0 runs to its end first (fibers yield only at synchronization), so
        // its read of tile[255] comes before thread 255's write: an uninitialized read. (Had thread 255
        // written first, the unordered pair would be a race: either way the report names the tile.)
        CHECK(f.which().kind == oi::check::uninitialized_read);
        CHECK(f.which().thread.x == 0);
        CHECK(f.which().address.find("tile") != std::string::npos);
    }
}

TEST_CASE("dynamic shared memory over 48 KiB needs the opt-in, as on the device") {
    const std::size_t bytes = 64 * 1024;
    octet::cuda::device_buffer<unsigned> out(1);
    CHECK_THROWS_AS(launch("dynamic_shared_kernel", dynamic_shared_kernel, 1, 256, bytes, nullptr, bytes, out.data()),
                    oi::failure);
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)));
    launch("dynamic_shared_kernel", dynamic_shared_kernel, 1, 256, bytes, nullptr, bytes, out.data());
    unsigned want = 0;
    for (std::size_t i = 0; i < bytes; ++i) want += static_cast<unsigned char>(i);
    CHECK(out.download()[0] == want);
    // more than the device has, even opted in
    CHECK(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 300 * 1024) ==
          cudaErrorInvalidValue);
}

/// A non-blocking stream, destroyed at scope end.
struct test_stream {
    cudaStream_t s = nullptr;
    test_stream() { OCTET_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
    ~test_stream() { cudaStreamDestroy(s); }
    test_stream(const test_stream&) = delete;
    test_stream& operator=(const test_stream&) = delete;
};

cudaStreamCaptureStatus capture_status(cudaStream_t s) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    OCTET_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
    return st;
}

TEST_CASE("a captured stream records its work; each graph launch runs it, reading memory as it is then") {
    const std::size_t n = 300;
    std::vector<float> x(n), y(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i) - 7.0f, y[i] = 0.25f * static_cast<float>(i);
    octet::cuda::device_buffer<float> dx(x), dy(y), dz(n), w(n);
    dz.fill_bytes(0xFF);
    w.fill_bytes(0);
    test_stream ts, other;
    CHECK(ts.s != other.s);
    CHECK(capture_status(ts.s) == cudaStreamCaptureStatusNone);
    OCTET_CUDA_CHECK(cudaStreamBeginCapture(ts.s, cudaStreamCaptureModeGlobal));
    CHECK(capture_status(ts.s) == cudaStreamCaptureStatusActive);
    CHECK(capture_status(other.s) == cudaStreamCaptureStatusNone);
    OCTET_CUDA_CHECK(cudaMemcpyAsync(dz.data(), dy.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, ts.s));
    launch("saxpy_kernel", saxpy_kernel, 3, 128, 0, ts.s, 2.0f, dx.data(), dz.data(), n);
    OCTET_CUDA_CHECK(cudaMemsetAsync(dz.data(), 0, sizeof(float), ts.s));  // z[0] = +0
    // Another stream runs its work at once, capture or not.
    launch("saxpy_kernel", saxpy_kernel, 3, 128, 0, other.s, 1.0f, dx.data(), w.data(), n);
    cudaGraph_t graph = nullptr;
    OCTET_CUDA_CHECK(cudaStreamEndCapture(ts.s, &graph));
    REQUIRE(graph != nullptr);
    CHECK(capture_status(ts.s) == cudaStreamCaptureStatusNone);
    CHECK(w.download() == x);
    // Nothing of the captured work ran.
    std::size_t untouched = 0;
    for (float v : dz.download()) untouched += std::isnan(v);
    CHECK(untouched == n);
    cudaGraphExec_t exec = nullptr;
    OCTET_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    OCTET_CUDA_CHECK(cudaGraphDestroy(graph));  // the instance keeps the work
    for (float a : {1.0f, -3.5f}) {
        CAPTURE(a);
        for (std::size_t i = 0; i < n; ++i) x[i] = a * static_cast<float>(i % 17) + 1.0f;
        dx.upload(x);
        OCTET_CUDA_CHECK(cudaGraphLaunch(exec, ts.s));
        OCTET_CUDA_CHECK(cudaStreamSynchronize(ts.s));
        const auto z = dz.download();
        std::size_t bad = z[0] != 0.0f || std::signbit(z[0]);
        for (std::size_t i = 1; i < n; ++i) bad += z[i] != 2.0f * x[i] + y[i];
        CHECK(bad == 0);
    }
    OCTET_CUDA_CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphExecDestroy(exec) == cudaErrorInvalidValue);
    CHECK(cudaGraphLaunch(exec, ts.s) == cudaErrorInvalidValue);
    CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaErrorInvalidValue);  // destroyed above
}

TEST_CASE("during a global capture, calls that could synchronize fail and invalidate the capture") {
    octet::cuda::device_buffer<float> a(64), b(64);
    test_stream ts, other;
    enum class call { malloc, free, memcpy, memset, sync_captured, sync_other, device_sync, from_other_thread };
    for (call c : {call::malloc, call::free, call::memcpy, call::memset, call::sync_captured, call::sync_other,
                   call::device_sync, call::from_other_thread}) {
        CAPTURE(static_cast<int>(c));
        void* extra = nullptr;
        OCTET_CUDA_CHECK(cudaMalloc(&extra, 16));
        OCTET_CUDA_CHECK(cudaStreamBeginCapture(ts.s, cudaStreamCaptureModeGlobal));
        OCTET_CUDA_CHECK(cudaMemsetAsync(a.data(), 0, 64 * sizeof(float), ts.s));
        cudaError_t e = cudaSuccess;
        void* p = nullptr;
        switch (c) {
            case call::malloc:
                e = cudaMalloc(&p, 16);
                break;
            case call::free:
                e = cudaFree(extra);
                break;
            case call::memcpy:
                e = cudaMemcpy(b.data(), a.data(), 16, cudaMemcpyDeviceToDevice);
                break;
            case call::memset:
                e = cudaMemset(b.data(), 0, 16);
                break;
            case call::sync_captured:
                e = cudaStreamSynchronize(ts.s);
                break;
            case call::sync_other:
                e = cudaStreamSynchronize(other.s);
                break;
            case call::device_sync:
                e = cudaDeviceSynchronize();
                break;
            case call::from_other_thread:
                std::thread([&] { e = cudaMalloc(&p, 16); }).join();
                break;
        }
        CHECK(e == cudaErrorStreamCaptureUnsupported);
        CHECK(p == nullptr);
        CHECK(capture_status(ts.s) == cudaStreamCaptureStatusInvalidated);
        CHECK(cudaMemsetAsync(a.data(), 0, 4, ts.s) == cudaErrorStreamCaptureInvalidated);
        cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(&e);
        CHECK(cudaStreamEndCapture(ts.s, &graph) == cudaErrorStreamCaptureInvalidated);
        CHECK(graph == nullptr);
        CHECK(capture_status(ts.s) == cudaStreamCaptureStatusNone);
        // The refused free did not happen; afterwards the call is allowed again.
        OCTET_CUDA_CHECK(cudaFree(extra));
    }
    // An octet stream function that synchronized inside a capture would throw from OCTET_CUDA_CHECK.
    OCTET_CUDA_CHECK(cudaStreamBeginCapture(ts.s, cudaStreamCaptureModeGlobal));
    CHECK_THROWS_WITH_AS(OCTET_CUDA_CHECK(cudaStreamSynchronize(ts.s)),
                         doctest::Contains("cudaErrorStreamCaptureUnsupported"), octet::error);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(ts.s, &graph) == cudaErrorStreamCaptureInvalidated);
}

TEST_CASE("thread-local captures forbid the capturing thread only; relaxed ones permit cudaMalloc") {
    test_stream ts;
    void* p = nullptr;
    OCTET_CUDA_CHECK(cudaStreamBeginCapture(ts.s, cudaStreamCaptureModeThreadLocal));
    cudaError_t other_thread = cudaErrorUnknown;
    std::thread([&] {
        other_thread = cudaMalloc(&p, 16);
        if (other_thread == cudaSuccess) other_thread = cudaFree(p);
    }).join();
    CHECK(other_thread == cudaSuccess);
    CHECK(capture_status(ts.s) == cudaStreamCaptureStatusActive);
    CHECK(cudaMalloc(&p, 16) == cudaErrorStreamCaptureUnsupported);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(ts.s, &graph) == cudaErrorStreamCaptureInvalidated);

    OCTET_CUDA_CHECK(cudaStreamBeginCapture(ts.s, cudaStreamCaptureModeRelaxed));
    OCTET_CUDA_CHECK(cudaMalloc(&p, 16));
    OCTET_CUDA_CHECK(cudaFree(p));
    CHECK(capture_status(ts.s) == cudaStreamCaptureStatusActive);
    CHECK(cudaStreamSynchronize(ts.s) == cudaErrorStreamCaptureUnsupported);  // never the captured stream
    CHECK(cudaStreamEndCapture(ts.s, &graph) == cudaErrorStreamCaptureInvalidated);
}

TEST_CASE("capture misuse gets CUDA's errors") {
    test_stream ts;
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaStreamEndCapture(ts.s, &graph) == cudaErrorIllegalState);  // not capturing
    OCTET_CUDA_CHECK(cudaStreamBeginCapture(ts.s, cudaStreamCaptureModeGlobal));
    CHECK(cudaStreamBeginCapture(ts.s, cudaStreamCaptureModeGlobal) == cudaErrorIllegalState);
    cudaError_t wrong_thread = cudaSuccess;
    std::thread([&] { wrong_thread = cudaStreamEndCapture(ts.s, &graph); }).join();
    CHECK(wrong_thread == cudaErrorStreamCaptureWrongThread);
    CHECK(cudaStreamEndCapture(ts.s, nullptr) == cudaErrorInvalidValue);
    OCTET_CUDA_CHECK(cudaStreamEndCapture(ts.s, &graph));
    REQUIRE(graph != nullptr);  // an empty graph
    cudaGraphExec_t exec = nullptr;
    OCTET_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    OCTET_CUDA_CHECK(cudaGraphLaunch(exec, ts.s));
    OCTET_CUDA_CHECK(cudaGraphExecDestroy(exec));
    OCTET_CUDA_CHECK(cudaGraphDestroy(graph));
    CHECK(cudaGraphDestroy(graph) == cudaErrorInvalidValue);
}

TEST_CASE("cudaMallocAsync in a capture is the graph's memory; a free node of earlier memory runs once") {
    const std::size_t n = 256;
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i) * 0.5f;
    octet::cuda::device_buffer<float> dx(x), out(n);
    test_stream ts;
    void* earlier = nullptr;
    OCTET_CUDA_CHECK(cudaMalloc(&earlier, 64));
    OCTET_CUDA_CHECK(cudaStreamBeginCapture(ts.s, cudaStreamCaptureModeGlobal));
    float* tmp = nullptr;
    OCTET_CUDA_CHECK(cudaMallocAsync(&tmp, n * sizeof(float), ts.s));
    REQUIRE(tmp != nullptr);
    CHECK_NOTHROW(octet::cuda::require_device_accessible(tmp, "f", "tmp"));
    OCTET_CUDA_CHECK(cudaMemsetAsync(tmp, 0, n * sizeof(float), ts.s));
    launch("saxpy_kernel", saxpy_kernel, 2, 128, 0, ts.s, 3.0f, dx.data(), tmp, n);
    OCTET_CUDA_CHECK(cudaMemcpyAsync(out.data(), tmp, n * sizeof(float), cudaMemcpyDeviceToDevice, ts.s));
    OCTET_CUDA_CHECK(cudaFreeAsync(tmp, ts.s));
    OCTET_CUDA_CHECK(cudaFreeAsync(earlier, ts.s));
    cudaGraph_t graph = nullptr;
    OCTET_CUDA_CHECK(cudaStreamEndCapture(ts.s, &graph));
    CHECK_NOTHROW(octet::cuda::require_device_accessible(earlier, "f", "earlier"));  // freed only at a launch
    cudaGraphExec_t exec = nullptr;
    OCTET_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    OCTET_CUDA_CHECK(cudaGraphDestroy(graph));
    out.fill_bytes(0xFF);
    OCTET_CUDA_CHECK(cudaGraphLaunch(exec, ts.s));
    std::size_t bad = 0;
    const auto got = out.download();
    for (std::size_t i = 0; i < n; ++i) bad += got[i] != 3.0f * x[i];
    CHECK(bad == 0);
    CHECK_THROWS_AS(octet::cuda::require_device_accessible(earlier, "f", "earlier"), octet::error);
    // The second launch's free node finds nothing to free: the launch fails, as on the device.
    CHECK(cudaGraphLaunch(exec, ts.s) == cudaErrorInvalidValue);
    CHECK_NOTHROW(octet::cuda::require_device_accessible(tmp, "f", "tmp"));  // the instance still holds it
    OCTET_CUDA_CHECK(cudaGraphExecDestroy(exec));
    CHECK_THROWS_AS(octet::cuda::require_device_accessible(tmp, "f", "tmp"), octet::error);
}

TEST_CASE("an interpreter report from a captured kernel is thrown by the graph launch") {
    const std::size_t n = 64;
    octet::cuda::device_buffer<float> y(n);
    test_stream ts;
    OCTET_CUDA_CHECK(cudaStreamBeginCapture(ts.s, cudaStreamCaptureModeGlobal));
    launch("fill_past_end_kernel", fill_past_end_kernel, 1, 128, 0, ts.s, y.data(), n);  // recorded, not run
    cudaGraph_t graph = nullptr;
    OCTET_CUDA_CHECK(cudaStreamEndCapture(ts.s, &graph));
    cudaGraphExec_t exec = nullptr;
    OCTET_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    OCTET_CUDA_CHECK(cudaGraphDestroy(graph));
    try {
        cudaGraphLaunch(exec, ts.s);
        FAIL("no report");
    } catch (const oi::failure& f) {
        CHECK(f.which().kind == oi::check::out_of_bounds);
        CHECK(f.which().kernel == "fill_past_end_kernel");
    }
    OCTET_CUDA_CHECK(cudaGraphExecDestroy(exec));
}

}  // namespace interpret_runtime_test
