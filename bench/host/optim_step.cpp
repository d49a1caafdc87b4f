// Host throughput of the fused AdamW step (octet/optim/adamw.hpp) per state codec and master
// policy, against two float AdamW loops written the plain way in the same binary:
//   * plain_fused_f32: one loop over float weights, gradients and moments (the textbook fused step)
//   * plain_multipass_f32: the step as separate passes (m, v, denominator, update), as an unfused
//     "foreach" optimizer runs it
// and against octet's own codecs used unfused (decode both moments, a float step, encode both).
// 1M parameters (16+ MB of state: DRAM-bound, like a real step); one thread unless the name says.
//
//   ./bench_optim_step --benchmark_min_time=0.3
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "octet/optim/adamw.hpp"
#include "octet/optim/moments.hpp"

namespace {

using namespace octet;
constexpr std::size_t kN = std::size_t{1} << 20;

std::vector<float> normal_vec(std::size_t n, float sd, unsigned seed) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

template <class MC, class VC, class M>
double step_bytes(std::size_t grad_bytes) {
    return 2.0 * sizeof(typename M::weight_type) + static_cast<double>(grad_bytes) +
           2.0 * state_bytes_per_element<MC>() + 2.0 * state_bytes_per_element<VC>() +
           (M::has_compensation ? 4.0 : 0.0);
}

template <class MC, class VC, class M, class G>
void octet_step(benchmark::State& state) {
    const int threads = static_cast<int>(state.range(0));
    adamw_state<MC, VC, M> st(kN);
    st.set_params(as_cspan(normal_vec(kN, 1.0f, 1)));
    const auto gf = normal_vec(kN, 1e-3f, 2);
    std::vector<G> g(kN);
    for (std::size_t i = 0; i < kN; ++i) {
        if constexpr (std::is_same_v<G, float>)
            g[i] = gf[i];
        else
            g[i] = to_bf16(gf[i]);
    }
    adamw_hyper h;
    h.on_nonfinite = grad_nonfinite_policy::zero_block;
    std::uint64_t t = 1;
    for (auto _ : state) {
        adamw_step(on_host(threads), st.ref(), as_cspan(g), h, t++, 1e-4f);
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kN));
    state.SetBytesProcessed(
        static_cast<std::int64_t>(static_cast<double>(state.iterations()) * kN * step_bytes<MC, VC, M>(sizeof(G))));
}

/// The textbook fused float AdamW loop (same formula, plain C++ operators).
void plain_fused_f32(benchmark::State& state) {
    auto w = normal_vec(kN, 1.0f, 1);
    const auto g = normal_vec(kN, 1e-3f, 2);
    std::vector<float> m(kN, 0.0f), v(kN, 0.0f);
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, lr = 1e-4f, wd = 0.01f;
    int t = 1;
    for (auto _ : state) {
        const float bc1 = 1.0f - std::pow(b1, static_cast<float>(t)), bc2 = 1.0f - std::pow(b2, static_cast<float>(t));
        const float step = lr / bc1, isb = 1.0f / std::sqrt(bc2), decay = 1.0f - lr * wd;
        float* __restrict pw = w.data();
        float* __restrict pm = m.data();
        float* __restrict pv = v.data();
        const float* __restrict pg = g.data();
        for (std::size_t i = 0; i < kN; ++i) {
            pm[i] = b1 * pm[i] + (1.0f - b1) * pg[i];
            pv[i] = b2 * pv[i] + (1.0f - b2) * pg[i] * pg[i];
            pw[i] = pw[i] * decay - step * pm[i] / (std::sqrt(pv[i]) * isb + eps);
        }
        ++t;
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kN));
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * 28));
}

/// The same step as separate passes over memory (an unfused "foreach" optimizer).
void plain_multipass_f32(benchmark::State& state) {
    auto w = normal_vec(kN, 1.0f, 1);
    const auto g = normal_vec(kN, 1e-3f, 2);
    std::vector<float> m(kN, 0.0f), v(kN, 0.0f), d(kN);
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, lr = 1e-4f, wd = 0.01f;
    int t = 1;
    for (auto _ : state) {
        const float bc1 = 1.0f - std::pow(b1, static_cast<float>(t)), bc2 = 1.0f - std::pow(b2, static_cast<float>(t));
        const float step = lr / bc1, isb = 1.0f / std::sqrt(bc2), decay = 1.0f - lr * wd;
        for (std::size_t i = 0; i < kN; ++i) w[i] *= decay;
        for (std::size_t i = 0; i < kN; ++i) m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        for (std::size_t i = 0; i < kN; ++i) v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        for (std::size_t i = 0; i < kN; ++i) d[i] = std::sqrt(v[i]) * isb + eps;
        for (std::size_t i = 0; i < kN; ++i) w[i] -= step * m[i] / d[i];
        ++t;
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kN));
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * 28));  // the fused step's traffic
}

/// octet's codecs used unfused: decode both moments, the float step, encode both.
template <class Codec>
void unfused_codec_step(benchmark::State& state) {
    auto w = normal_vec(kN, 1.0f, 1);
    const auto g = normal_vec(kN, 1e-3f, 2);
    std::vector<float> m(kN, 0.0f), v(kN, 0.0f);
    std::vector<typename Codec::code_type> mc(kN), vc(kN);
    std::vector<typename Codec::meta_type> mm(state_meta_count<Codec>(kN)), vm(state_meta_count<Codec>(kN));
    adamw_hyper h;
    std::uint64_t t = 1;
    for (auto _ : state) {
        decode_moments<Codec, moment::first>(on_host(1), as_cspan(mc), as_cspan(mm), as_span(m));
        decode_moments<Codec, moment::second>(on_host(1), as_cspan(vc), as_cspan(vm), as_span(v));
        const adamw_coeffs c = make_adamw_coeffs(h, t++, 1e-4f);
        for (std::size_t i = 0; i < kN; ++i) {
            const float u = optim_detail::adamw_direction(g[i], m[i], v[i], c);
            w[i] = optim_detail::adamw_target(w[i], u, c);
        }
        encode_moments<Codec, moment::first>(on_host(1), as_cspan(m), as_span(mc), as_span(mm));
        encode_moments<Codec, moment::second>(on_host(1), as_cspan(v), as_span(vc), as_span(vm));
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kN));
}

template <class Codec, moment K>
void codec_encode(benchmark::State& state) {
    auto x = normal_vec(kN, 1e-3f, 3);
    if (K == moment::second)
        for (auto& e : x) e *= e;
    std::vector<typename Codec::code_type> c(kN);
    std::vector<typename Codec::meta_type> m(state_meta_count<Codec>(kN));
    for (auto _ : state) {
        encode_moments<Codec, K>(on_host(1), as_cspan(x), as_span(c), as_span(m));
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kN));
}

template <class Codec, moment K>
void codec_decode(benchmark::State& state) {
    auto x = normal_vec(kN, 1e-3f, 3);
    if (K == moment::second)
        for (auto& e : x) e *= e;
    std::vector<typename Codec::code_type> c(kN);
    std::vector<typename Codec::meta_type> m(state_meta_count<Codec>(kN));
    encode_moments<Codec, K>(on_host(1), as_cspan(x), as_span(c), as_span(m));
    for (auto _ : state) {
        decode_moments<Codec, K>(on_host(1), as_cspan(c), as_cspan(m), as_span(x));
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kN));
}

namespace sc = octet::state_codec;

}  // namespace

BENCHMARK(plain_fused_f32)->Unit(benchmark::kMillisecond);
BENCHMARK(plain_multipass_f32)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(octet_step, sc::fp32, sc::fp32, master::fp32, float)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(octet_step, sc::bf16, sc::bf16, master::fp32, float)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(octet_step, sc::e4m3_scaled, sc::e4m3_scaled, master::fp32, float)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(octet_step, sc::e4m3_expanded, sc::e4m3_expanded, master::fp32, float)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(octet_step, sc::dynamic8, sc::dynamic8, master::fp32, float)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(octet_step, sc::dynamic8, sc::dynamic8, master::bf16_stochastic, bf16)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(octet_step, sc::e4m3_expanded, sc::e4m3_expanded, master::bf16_kahan, bf16)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(unfused_codec_step, sc::dynamic8)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(unfused_codec_step, sc::e4m3_scaled)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(codec_encode, sc::e4m3_scaled, moment::first)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(codec_encode, sc::e4m3_expanded, moment::first)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(codec_encode, sc::dynamic8, moment::first)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(codec_encode, sc::dynamic8, moment::second)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(codec_decode, sc::e4m3_scaled, moment::first)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(codec_decode, sc::e4m3_expanded, moment::first)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(codec_decode, sc::dynamic8, moment::second)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
