// Small-tensor calls of octet's host operations, called directly from C++: the baseline that
// bench/python/op_overhead.py subtracts from the same calls made through torch.ops.octet, to
// measure what the PyTorch embedding adds per call. Same shapes, inputs and executor kind (a
// caller-owned thread_pool) as the op libraries use.
#include <benchmark/benchmark.h>

#include <thread>
#include <vector>

#include "octet/octet.hpp"

namespace {

constexpr std::size_t rows = 16, cols = 64;

std::vector<float> input() {
    std::vector<float> x(rows * cols);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) * 0.25f - 2.0f;
    return x;
}

octet::thread_pool& pool() {
    static octet::thread_pool p(static_cast<int>(std::thread::hardware_concurrency()));
    return p;
}

void quantize_mxfp8(benchmark::State& state) {
    using R = octet::recipes::mxfp8_e4m3;
    const std::vector<float> x = input();
    for (auto _ : state) {
        octet::quantized_tensor<R> q(rows, cols);  // the op allocates its outputs too
        auto res =
            octet::quantize<R>(octet::on_host(pool()), octet::matrix_ref<const float>(x.data(), rows, cols), q.ref());
        benchmark::DoNotOptimize(res);
        benchmark::DoNotOptimize(q.data().data());
    }
}
BENCHMARK(quantize_mxfp8)->Name("quantize/mxfp8_e4m3/16x64");

void dequantize_mxfp8(benchmark::State& state) {
    using R = octet::recipes::mxfp8_e4m3;
    const std::vector<float> x = input();
    octet::quantized_tensor<R> q(rows, cols);
    octet::quantize<R>(octet::on_host(pool()), octet::matrix_ref<const float>(x.data(), rows, cols), q.ref());
    for (auto _ : state) {
        std::vector<float> out(rows * cols);
        octet::dequantize(octet::on_host(pool()), q.cref(), octet::matrix_ref<float>(out.data(), rows, cols));
        benchmark::DoNotOptimize(out.data());
    }
}
BENCHMARK(dequantize_mxfp8)->Name("dequantize/mxfp8_e4m3/16x64");

void cast_e4m3(benchmark::State& state) {
    const std::vector<float> x = input();
    for (auto _ : state) {
        std::vector<std::uint8_t> out(x.size());
        octet::encode_array<octet::e4m3>(octet::on_host(pool()), octet::as_cspan(x), octet::as_span(out));
        benchmark::DoNotOptimize(out.data());
    }
}
BENCHMARK(cast_e4m3)->Name("cast/e4m3/1024");

}  // namespace

BENCHMARK_MAIN();
