// Interpret mode's costs, measured with a steady clock: per launch (empty kernel), per block, per
// barrier (a context switch per thread), per checked shared access, per warp collective. Not a test:
// target bench_interpret_speed (bench/CMakeLists.txt), or by hand:
//   g++ -std=c++17 -O2 -DOCTET_INTERPRET -I interpret/include -isystem /usr/local/cuda/include
//       bench/interpret_speed.cpp   (one command line)
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "octet/interpret/cuda.hpp"

namespace {
namespace oi = octet::interpret;

void empty_kernel() {}

void barrier_kernel(int k) {
    for (int i = 0; i < k; ++i) __syncthreads();
}

// Each thread stores to and loads its own float (no race, no sharing): the checked access path.
void own_access_kernel(int k, float* out) {
    OCTET_INTERPRET_SHARED(float[1024], s);
    const unsigned t = threadIdx.x;
    s[t] = 1.0f;
    float acc = 0.0f;
    for (int i = 0; i < k; ++i) {
        acc += s[t];
        s[t] = acc;
    }
    out[t] = acc;
}

// Every thread reads the same floats after a barrier (read-shared bytes: concurrent readers).
void broadcast_kernel(int k, float* out) {
    OCTET_INTERPRET_SHARED(float[64], s);
    const unsigned t = threadIdx.x;
    if (t < 64) s[t] = static_cast<float>(t);
    __syncthreads();
    float acc = 0.0f;
    for (int i = 0; i < k; ++i) acc += s[i % 64];
    out[t] = acc;
}

void shfl_kernel(int k, float* out) {
    float v = static_cast<float>(threadIdx.x);
    for (int i = 0; i < k; ++i) v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
    out[threadIdx.x] = v;
}

// The best of 7 runs (the machine is shared: the minimum is the least disturbed).
template <class F>
double seconds(F f) {
    double best = 1e30;
    for (int i = 0; i < 7; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
}

}  // namespace

int main() {
    static float out[1024];
    for (unsigned threads : {32u, 128u, 256u}) {
        const int n = 10;
        const double t = seconds([&] {
            for (int i = 0; i < n; ++i) oi::launch("empty", {1, threads}, empty_kernel);
        });
        std::printf("launch, 1 block of %3u threads (empty kernel): %8.3f ms\n", threads, 1e3 * t / n);
    }
    {
        const int blocks = 256;
        const double t1 = seconds([&] { oi::launch("empty", {1, 128}, empty_kernel); });
        const double tn = seconds([&] { oi::launch("empty", {blocks, 128}, empty_kernel); });
        std::printf("per block of 128 threads (empty kernel):        %8.3f us\n", 1e6 * (tn - t1) / (blocks - 1));
    }
    {
        const int k = 200;
        const double t0 = seconds([&] { oi::launch("barrier", {1, 128}, barrier_kernel, 0); });
        const double t = seconds([&] { oi::launch("barrier", {1, 128}, barrier_kernel, k); });
        std::printf("__syncthreads, 128 threads: %8.3f us per barrier, %6.1f ns per thread (switch)\n",
                    1e6 * (t - t0) / k, 1e9 * (t - t0) / k / 128);
    }
    {
        const int k = 2000;
        const double t0 = seconds([&] { oi::launch("access", {1, 128}, own_access_kernel, 0, out); });
        const double t = seconds([&] { oi::launch("access", {1, 128}, own_access_kernel, k, out); });
        std::printf("checked 4-byte shared access (own bytes):       %8.1f ns\n", 1e9 * (t - t0) / (2.0 * k * 128));
    }
    {
        const int k = 2000;
        const double t0 = seconds([&] { oi::launch("broadcast", {1, 128}, broadcast_kernel, 0, out); });
        const double t = seconds([&] { oi::launch("broadcast", {1, 128}, broadcast_kernel, k, out); });
        std::printf("checked 4-byte shared read (128 readers):       %8.1f ns\n", 1e9 * (t - t0) / (1.0 * k * 128));
    }
    {
        const int k = 500;
        const double t0 = seconds([&] { oi::launch("shfl", {1, 128}, shfl_kernel, 0, out); });
        const double t = seconds([&] { oi::launch("shfl", {1, 128}, shfl_kernel, k, out); });
        std::printf("__shfl_xor_sync, 4 warps: %8.3f us per warp collective, %6.1f ns per lane\n",
                    1e6 * (t - t0) / (4.0 * k), 1e9 * (t - t0) / (128.0 * k));
    }
    return 0;
}
