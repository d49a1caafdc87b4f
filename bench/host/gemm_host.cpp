// Host scaled GEMM throughput (GFLOP/s = 2 M N K / time) of octet's host backend, the exact check
// of the GPU backends and the path for CPU users: DeepSeek-V3's 1x128 x 128x128 E4M3 and NVFP4 at
// 512^3 and 1024^3 on one thread and on all threads.
//
//   ./bench_gemm_host
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "octet/gemm/scaled_gemm.hpp"

namespace {

template <class R>
octet::quantized_tensor<R> random_operand(std::size_t rows, std::size_t cols, unsigned seed) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> x(rows * cols);
    for (auto& v : x) v = d(g);
    octet::quantized_tensor<R> q(rows, cols);
    octet::quantize<R>(octet::on_host(), octet::matrix_ref<const float>(x.data(), rows, cols), q.ref());
    return q;
}

template <class RA, class RB>
void host_gemm(benchmark::State& state) {
    const std::size_t n = static_cast<std::size_t>(state.range(0));
    const int threads = static_cast<int>(state.range(1));
    const auto a = random_operand<RA>(n, n, 1);
    const auto b = random_operand<RB>(n, n, 2);
    std::vector<octet::bf16> d(n * n);
    for (auto _ : state) {
        octet::scaled_gemm(octet::on_host(threads), a.cref(), b.cref(), octet::matrix_ref<octet::bf16>(d.data(), n, n));
        benchmark::DoNotOptimize(d.data());
    }
    state.counters["GFLOP/s"] =
        benchmark::Counter(2.0 * static_cast<double>(n) * n * n * static_cast<double>(state.iterations()) * 1e-9,
                           benchmark::Counter::kIsRate);
}

}  // namespace

using namespace octet::recipes;
BENCHMARK_TEMPLATE(host_gemm, blockwise_1x128, blockwise_128x128)
    ->Name("scaled_gemm_host/1x128x128x128")
    ->Args({512, 1})
    ->Args({512, 0})
    ->Args({1024, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_TEMPLATE(host_gemm, nvfp4, nvfp4)
    ->Name("scaled_gemm_host/nvfp4")
    ->Args({512, 1})
    ->Args({512, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
