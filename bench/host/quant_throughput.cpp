// Host quantizer and dequantizer throughput (elements per second) for the main recipes on a
// 2048 x 2048 bf16 tensor, one thread and two.
//
//   ./bench_quant_throughput
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "octet/quant/quantize.hpp"

namespace {

const std::vector<octet::bf16>& input() {
    static const std::vector<octet::bf16> x = [] {
        std::mt19937_64 g(1);
        std::normal_distribution<float> d(0.0f, 3.0f);
        std::vector<octet::bf16> v(std::size_t{2048} * 2048);
        for (auto& e : v) e = octet::to_bf16(d(g));
        return v;
    }();
    return x;
}

template <class Recipe>
void quantize_rowwise(benchmark::State& state) {
    const auto& x = input();
    octet::quantized_tensor<Recipe> q(2048, 2048);
    const int threads = static_cast<int>(state.range(0));
    for (auto _ : state) {
        octet::quantize<Recipe>(octet::on_host(threads), octet::matrix_ref<const octet::bf16>(x.data(), 2048, 2048),
                                q.ref());
        benchmark::DoNotOptimize(q.data().data());
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * x.size()));
}

template <class Recipe>
void dequantize_rowwise(benchmark::State& state) {
    const auto& x = input();
    octet::quantized_tensor<Recipe> q(2048, 2048);
    octet::quantize<Recipe>(octet::on_host(), octet::matrix_ref<const octet::bf16>(x.data(), 2048, 2048), q.ref());
    std::vector<octet::bf16> y(x.size());
    const int threads = static_cast<int>(state.range(0));
    for (auto _ : state) {
        octet::dequantize(octet::on_host(threads), q.cref(), octet::matrix_ref<octet::bf16>(y.data(), 2048, 2048));
        benchmark::DoNotOptimize(y.data());
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * x.size()));
}

}  // namespace

BENCHMARK_TEMPLATE(quantize_rowwise, octet::recipes::blockwise_1x128)
    ->Name("quantize/1x128")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime();
BENCHMARK_TEMPLATE(quantize_rowwise, octet::recipes::mxfp8_e4m3)->Name("quantize/mxfp8")->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_TEMPLATE(quantize_rowwise, octet::recipes::nvfp4)->Name("quantize/nvfp4")->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_TEMPLATE(quantize_rowwise, octet::recipes::blockwise_128x128)
    ->Name("quantize/128x128")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime();

BENCHMARK_TEMPLATE(dequantize_rowwise, octet::recipes::blockwise_1x128)
    ->Name("dequantize_bf16/1x128")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime();
BENCHMARK_TEMPLATE(dequantize_rowwise, octet::recipes::mxfp8_e4m3)
    ->Name("dequantize_bf16/mxfp8")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime();
BENCHMARK_TEMPLATE(dequantize_rowwise, octet::recipes::nvfp4)
    ->Name("dequantize_bf16/nvfp4")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime();

BENCHMARK_MAIN();
