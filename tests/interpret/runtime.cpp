// Interpret mode end to end, on small kernels written here: CUDA source compiled as C++ with
// OCTET_INTERPRET (octet/interpret/cuda.hpp), device memory from the host runtime
// (interpret/runtime.hpp), launches through octet::cuda::launch. Each check is one a user's kernel
// gets: results equal a host loop, memory errors in device allocations and shared memory are reported
// naming the kernel, and the shared-memory opt-in is honoured as on the device.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "octet/cuda/buffer.cuh"
#include "octet/cuda/check.cuh"
#include "octet/cuda/launch.cuh"

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

}  // namespace interpret_runtime_test
