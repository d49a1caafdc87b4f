// Host benchmarks of the gradient codecs (Google Benchmark): the randomized Hadamard transform
// against a plain copy of the same bytes, and encode / decode throughput of every format with the
// identity and Hadamard transforms. One thread (on_host(1)) unless the name says otherwise.
// bytes_per_second counts the float gradient (4 bytes per element) once.
//
//   build/default/bench/bench_codec_throughput --benchmark_min_time=0.3
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "octet/codec/codec.hpp"

namespace {

constexpr std::size_t kN = std::size_t{1} << 20;  // 4 MiB of float: the size of one layer's gradient shard

const std::vector<float>& gradient() {
    static const std::vector<float> g = [] {
        std::mt19937_64 r(7);
        std::student_t_distribution<float> t(3.0f);
        std::vector<float> v(kN);
        for (auto& x : v) x = 1e-3f * t(r);
        return v;
    }();
    return g;
}

void BM_copy(benchmark::State& state) {
    const auto& x = gradient();
    std::vector<float> y(kN);
    for (auto _ : state) {
        std::memcpy(y.data(), x.data(), kN * sizeof(float));
        benchmark::DoNotOptimize(y.data());
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * sizeof(float)));
}
BENCHMARK(BM_copy);

void BM_hadamard(benchmark::State& state) {
    const auto& x = gradient();
    const std::uint32_t B = static_cast<std::uint32_t>(state.range(0));
    std::vector<float> y(kN);
    for (auto _ : state) {
        octet::transform_forward(octet::on_host(1), octet::transform_kind::hadamard, x, y, B, 1, 0);
        benchmark::DoNotOptimize(y.data());
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * sizeof(float)));
}
BENCHMARK(BM_hadamard)->Arg(256)->Arg(1024)->Arg(4096)->Arg(32768);

void encode_bench(benchmark::State& state, octet::wire_format f, octet::transform_kind t, int threads) {
    const auto& x = gradient();
    const octet::codec_config cfg{f, t, 1024, 0, 3};
    std::vector<std::uint8_t> m(octet::encoded_size(cfg, kN));
    for (auto _ : state) {
        octet::encode_gradient(octet::on_host(threads), cfg, x, m);
        benchmark::DoNotOptimize(m.data());
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * sizeof(float)));
    state.counters["wire_bytes_per_element"] = static_cast<double>(m.size()) / kN;
}
void decode_bench(benchmark::State& state, octet::wire_format f, octet::transform_kind t, int threads) {
    const auto& x = gradient();
    const octet::codec_config cfg{f, t, 1024, 0, 3};
    std::vector<std::uint8_t> m(octet::encoded_size(cfg, kN));
    octet::encode_gradient(octet::on_host(), cfg, x, m);
    std::vector<float> y(kN);
    for (auto _ : state) {
        octet::decode_gradient(octet::on_host(threads), m, y);
        benchmark::DoNotOptimize(y.data());
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * sizeof(float)));
}

#define OCTET_CODEC_BENCH(fmt, tr)                                                                      \
    BENCHMARK_CAPTURE(encode_bench, fmt##_##tr, octet::wire_format::fmt, octet::transform_kind::tr, 1); \
    BENCHMARK_CAPTURE(decode_bench, fmt##_##tr, octet::wire_format::fmt, octet::transform_kind::tr, 1);
OCTET_CODEC_BENCH(e4m3, identity)
OCTET_CODEC_BENCH(e4m3, hadamard)
OCTET_CODEC_BENCH(e5m2, hadamard)
OCTET_CODEC_BENCH(mxfp8, identity)
OCTET_CODEC_BENCH(mxfp8, hadamard)
OCTET_CODEC_BENCH(nvfp4, identity)
OCTET_CODEC_BENCH(nvfp4, hadamard)
BENCHMARK_CAPTURE(encode_bench, e4m3_hadamard_all_threads, octet::wire_format::e4m3, octet::transform_kind::hadamard,
                  0);
BENCHMARK_CAPTURE(decode_bench, e4m3_hadamard_all_threads, octet::wire_format::e4m3, octet::transform_kind::hadamard,
                  0);

}  // namespace

BENCHMARK_MAIN();
