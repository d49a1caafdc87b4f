// Shared helpers for the GPU benchmarks run by bench/device_suite.sh: event timing (median of
// repeats after warm-up), the device's measured copy bandwidth, and result lines that the suite
// collects into one table:
//   OCTET_RESULT|<benchmark>|<metric>|<value>|<unit>|<reference or note>
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "octet/cuda/buffer.cuh"
#include "octet/cuda/check.cuh"

namespace octet_bench {

/// Median time in milliseconds of `repeats` runs of fn (each timed with events), after warm-up.
inline double median_ms(const std::function<void()>& fn, int repeats = 20, int warmup = 3) {
    for (int i = 0; i < warmup; ++i) fn();
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    cudaEvent_t a, b;
    OCTET_CUDA_CHECK(cudaEventCreate(&a));
    OCTET_CUDA_CHECK(cudaEventCreate(&b));
    std::vector<float> times;
    for (int i = 0; i < repeats; ++i) {
        OCTET_CUDA_CHECK(cudaEventRecord(a));
        fn();
        OCTET_CUDA_CHECK(cudaEventRecord(b));
        OCTET_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        OCTET_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        times.push_back(ms);
    }
    OCTET_CUDA_CHECK(cudaGetLastError());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

/// Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written.
inline double copy_bandwidth_gbs(std::size_t bytes = std::size_t{1} << 30) {
    octet::cuda::device_buffer<unsigned char> src(bytes), dst(bytes);
    src.fill_bytes(0x5A);
    const double ms =
        median_ms([&] { OCTET_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice)); });
    return 2.0 * static_cast<double>(bytes) / (ms * 1e6);
}

inline void result(const std::string& bench, const std::string& metric, double value, const std::string& unit,
                   const std::string& note = "") {
    std::printf("OCTET_RESULT|%s|%s|%.4g|%s|%s\n", bench.c_str(), metric.c_str(), value, unit.c_str(), note.c_str());
    std::fflush(stdout);
}

inline void print_device() {
    cudaDeviceProp p{};
    OCTET_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    std::printf("device: %s, sm_%d%d, %d SMs, %.1f GiB\n", p.name, p.major, p.minor, p.multiProcessorCount,
                static_cast<double>(p.totalGlobalMem) / (1 << 30));
}

/// Fresh random floats (normal, scaled) generated on the host and uploaded.
inline std::vector<float> random_floats(std::size_t n, float scale, unsigned seed) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

}  // namespace octet_bench
