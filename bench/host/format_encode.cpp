// Host encode throughput: octet::encode against the CUDA toolkit's host conversions in the same
// binary (same compiler, flags and data). Inputs are fresh normal values scaled to the format's
// range, with a few outliers, resident in L1/L2 so that the conversion, not memory, is timed.
// The peer/ benchmarks are octet's side of bench/host/mldtypes_peer.py (ml_dtypes, 64M floats).
//
//   ./bench_format_encode --benchmark_filter=encode
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#if OCTET_BENCH_HAS_TOOLKIT
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#endif

#include "octet/core/philox.hpp"
#include "octet/format/convert.hpp"
#include "octet/format/encode.hpp"

namespace {

constexpr std::size_t kElements = 1 << 14;

std::vector<float> inputs(float scale) {
    std::mt19937_64 g(std::random_device{}());
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(kElements);
    for (auto& x : v) x = d(g);
    for (std::size_t i = 0; i < v.size(); i += 97) v[i] *= 100.0f;  // outliers that saturate
    return v;
}

template <class Fmt, class Round>
void octet_encode(benchmark::State& state) {
    const auto in = inputs(Fmt::max_finite / 8);
    std::vector<std::uint8_t> out(in.size());
    for (auto _ : state) {
        const float* __restrict src = in.data();
        std::uint8_t* __restrict dst = out.data();
        for (std::size_t i = 0; i < kElements; ++i) dst[i] = octet::encode<Fmt, Round>(src[i]);
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kElements));
}

void octet_encode_e4m3_stochastic(benchmark::State& state) {
    const auto in = inputs(octet::e4m3::max_finite / 8);
    std::vector<std::uint8_t> out(in.size());
    const octet::philox_stream rng{1234, 0};
    for (auto _ : state) {
        for (std::size_t i = 0; i < kElements; i += 4) {
            const octet::philox4 r = rng.block(i / 4);
            for (int k = 0; k < 4; ++k)
                out[i + k] = octet::encode<octet::e4m3, octet::round::stochastic>(in[i + k], r.v[k]);
        }
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kElements));
}

template <class Fmt>
void octet_decode(benchmark::State& state) {
    std::vector<std::uint8_t> in(kElements);
    std::mt19937 g(7);
    for (auto& c : in) c = static_cast<std::uint8_t>(g() & Fmt::code_mask);
    std::vector<float> out(kElements);
    for (auto _ : state) {
        for (std::size_t i = 0; i < kElements; ++i) out[i] = octet::decode<Fmt>(in[i]);
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kElements));
}

// encode_array / decode_array on one thread with the data in cache: the dispatched kernels'
// own speed (the 64M peer benchmarks below are bound by memory bandwidth).
template <class Fmt>
void octet_encode_array_cached(benchmark::State& state) {
    const auto in = inputs(Fmt::max_finite / 8);
    std::vector<std::uint8_t> out(in.size());
    for (auto _ : state) {
        octet::encode_array<Fmt>(octet::on_host(1), octet::as_cspan(in), octet::as_span(out));
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kElements));
}

template <class Fmt>
void octet_decode_array_cached(benchmark::State& state) {
    std::vector<std::uint8_t> in(kElements);
    std::mt19937 g(7);
    for (auto& c : in) c = static_cast<std::uint8_t>(g() & Fmt::code_mask);
    std::vector<float> out(kElements);
    for (auto _ : state) {
        octet::decode_array<Fmt>(octet::on_host(1), octet::as_cspan(in), octet::as_span(out));
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kElements));
}

void octet_encode_array_threads(benchmark::State& state) {
    std::vector<float> in(std::size_t{1} << 24);
    std::mt19937_64 g(1);
    std::normal_distribution<float> d(0.0f, 50.0f);
    for (auto& x : in) x = d(g);
    std::vector<std::uint8_t> out(in.size());
    for (auto _ : state)
        octet::encode_array<octet::e4m3>(octet::on_host(static_cast<int>(state.range(0))), octet::as_cspan(in),
                                         octet::as_span(out));
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * in.size()));
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * in.size() * 5));
}

// The ml_dtypes peer (bench/host/mldtypes_peer.py runs it with this binary built both ways):
// 2^26 float32 values that the script builds from the same integer hash, log-uniform in
// [2^lo, 2^hi) with random signs and mantissas. The ranges stay below the format's max_finite,
// where ml_dtypes (which gives NaN above 464 for E4M3) and octet's saturate agree; the checksums
// let the script check that the codes agree too.
constexpr std::size_t kPeerElements = std::size_t{1} << 26;

std::uint64_t splitmix64(std::uint64_t i) {
    std::uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

std::vector<float> peer_inputs(int lo, int hi) {
    std::vector<float> v(kPeerElements);
    for (std::size_t i = 0; i < v.size(); ++i) {
        const std::uint64_t h = splitmix64(i);
        const auto exponent =
            static_cast<std::uint32_t>(127 + lo + static_cast<int>((h >> 40) % static_cast<std::uint64_t>(hi - lo)));
        v[i] = octet::bits_to_float(static_cast<std::uint32_t>(h >> 63) << 31 | exponent << 23 |
                                    static_cast<std::uint32_t>(h & 0x7FFFFFu));
    }
    return v;
}

void peer_checksums(benchmark::State& state, const std::vector<std::uint8_t>& codes) {
    double sum = 0.0, weighted = 0.0;  // exact: both stay below 2^53
    for (std::size_t i = 0; i < codes.size(); ++i) {
        sum += codes[i];
        weighted += static_cast<double>(codes[i]) * static_cast<double>(i & 0xFFFFu);
    }
    state.counters["code_sum"] = sum;
    state.counters["code_wsum"] = weighted;
}

template <class Fmt>
const std::vector<float>& peer_array() {
    static const std::vector<float> v = std::is_same_v<Fmt, octet::e4m3> ? peer_inputs(-12, 8) : peer_inputs(-4, 2);
    return v;
}

template <class Fmt>
void peer_encode(benchmark::State& state) {
    const auto& in = peer_array<Fmt>();
    std::vector<std::uint8_t> out(in.size(), 0xEE);
    for (auto _ : state) {
        octet::encode_array<Fmt>(octet::on_host(1), octet::as_cspan(in), octet::as_span(out));
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * in.size()));
    peer_checksums(state, out);
}

template <class Fmt>
void peer_decode(benchmark::State& state) {
    const auto& in = peer_array<Fmt>();
    std::vector<std::uint8_t> codes(in.size());
    octet::encode_array<Fmt>(octet::on_host(1), octet::as_cspan(in), octet::as_span(codes));
    std::vector<float> out(in.size());
    for (auto _ : state) {
        octet::decode_array<Fmt>(octet::on_host(1), octet::as_cspan(codes), octet::as_span(out));
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * in.size()));
}

#if OCTET_BENCH_HAS_TOOLKIT
template <class Convert>
void toolkit_encode(benchmark::State& state, float scale, Convert convert) {
    const auto in = inputs(scale);
    std::vector<std::uint8_t> out(in.size());
    for (auto _ : state) {
        for (std::size_t i = 0; i < kElements; ++i) out[i] = convert(in[i]);
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kElements));
}
#endif

}  // namespace

BENCHMARK_TEMPLATE(octet_encode, octet::e4m3, octet::round::nearest_even)->Name("encode/e4m3/octet");
BENCHMARK_TEMPLATE(octet_encode, octet::e2m1, octet::round::nearest_even)->Name("encode/e2m1/octet");
BENCHMARK_TEMPLATE(octet_encode, octet::ue8m0, octet::round::up)->Name("encode/ue8m0_up/octet");
BENCHMARK_TEMPLATE(octet_encode, octet::ue8m0, octet::round::toward_zero)->Name("encode/ue8m0_rz/octet");
#if OCTET_BENCH_HAS_TOOLKIT
BENCHMARK_CAPTURE(toolkit_encode, e4m3, octet::e4m3::max_finite / 8, [](float x) {
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
})->Name("encode/e4m3/toolkit");
BENCHMARK_CAPTURE(toolkit_encode, e2m1, octet::e2m1::max_finite / 8, [](float x) {
    return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
})->Name("encode/e2m1/toolkit");
BENCHMARK_CAPTURE(toolkit_encode, ue8m0_up, octet::ue8m0::max_finite / 8, [](float x) {
    return __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf);
})->Name("encode/ue8m0_up/toolkit");
BENCHMARK_CAPTURE(toolkit_encode, ue8m0_rz, octet::ue8m0::max_finite / 8, [](float x) {
    return __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundZero);
})->Name("encode/ue8m0_rz/toolkit");
#endif
BENCHMARK_TEMPLATE(octet_encode, octet::e4m3, octet::round::toward_zero)->Name("encode/e4m3_toward_zero/octet");
BENCHMARK(octet_encode_e4m3_stochastic)->Name("encode/e4m3_stochastic_philox/octet");
BENCHMARK_TEMPLATE(octet_decode, octet::e4m3)->Name("decode/e4m3/octet");
BENCHMARK_TEMPLATE(octet_decode, octet::e2m1)->Name("decode/e2m1/octet");
BENCHMARK_TEMPLATE(octet_encode_array_cached, octet::e4m3)->Name("encode_array/e4m3/16K");
BENCHMARK_TEMPLATE(octet_encode_array_cached, octet::e2m1)->Name("encode_array/e2m1/16K");
BENCHMARK_TEMPLATE(octet_decode_array_cached, octet::e4m3)->Name("decode_array/e4m3/16K");
BENCHMARK(octet_encode_array_threads)->Name("encode_array/e4m3/16M")->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_TEMPLATE(peer_encode, octet::e4m3)
    ->Name("peer/encode_e4m3/64M")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_TEMPLATE(peer_encode, octet::e2m1)
    ->Name("peer/encode_e2m1/64M")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_TEMPLATE(peer_decode, octet::e4m3)
    ->Name("peer/decode_e4m3/64M")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_TEMPLATE(peer_decode, octet::e2m1)
    ->Name("peer/decode_e2m1/64M")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
