// The training program's FP8 operations beside their float32 peers, on the `tiny` model's shapes as
// the quick default runs them (examples/08_training: d_model 128, 4 query and 2 key/value heads of
// 32 channels, sequences of 64 tokens, 16 sequences per step over 2 ranks, so 8 per call), built
// from the program's own classes (examples/common/model.hpp), so that each pair is what the
// program times as "attention" and "linear":
//   attention/{fp8,f32}: forward + backward of one layer's attention; fp8 includes quantizing Q,
//     K, V and dO (E4M3, one scale per token and head; V per head), delta_mode::matched, telemetry on.
//   linear/{fp8,f32}: forward + backward (dX and dW) of one block's four linears (QKV 128 -> 256,
//     output 128 -> 128, MLP 128 -> 512 and 512 -> 128); fp8 is linear_recipes::blockwise.
// The argument is the thread count (a caller-owned thread_pool, as the program uses).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "../../examples/common/model.hpp"

namespace {

constexpr int kHeadDim = 32, kHeadsQ = 4, kHeadsKv = 2, kLen = 64, kBatch = 8, kModel = 128, kFf = 512;
constexpr std::size_t kTokens = static_cast<std::size_t>(kBatch) * kLen;

std::vector<float> random_vector(std::size_t n, float scale, std::uint32_t seed) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(g);
    return v;
}

common::attention_dims dims() {
    common::attention_dims a;
    a.batch = kBatch;
    a.len = kLen;
    a.heads_q = kHeadsQ;
    a.heads_kv = kHeadsKv;
    a.head_dim = kHeadDim;
    return a;
}

struct attention_inputs {
    common::attention_dims a = dims();
    std::vector<float> qkv = random_vector(kTokens * a.qkv_ld(), 1.0f, 1);
    std::vector<float> dout = random_vector(kTokens * a.o_ld(), 1e-3f, 2);
    std::vector<float> o = std::vector<float>(kTokens * a.o_ld()), lse = std::vector<float>(kTokens * kHeadsQ),
                       dqkv = std::vector<float>(qkv.size());
    std::vector<std::int32_t> cu;
    attention_inputs() {
        for (int b = 0; b <= kBatch; ++b) cu.push_back(b * kLen);
    }
};

void attention_fp8(benchmark::State& state) {
    octet::thread_pool pool(static_cast<int>(state.range(0)));
    const octet::host_executor ex = octet::on_host(pool);
    attention_inputs in;
    common::memory_meter meter;
    auto attn =
        common::make_fp8_attention<kHeadDim>(meter, common::v_scale_mode::per_head, 1, kTokens, kHeadsQ, kHeadsKv);
    double residual = 0.0;
    for (auto _ : state) {
        attn->forward(ex, 0, in.a, in.qkv.data(), in.o.data(), in.lse.data(), in.cu.data(), nullptr);
        residual = attn->backward(ex, 0, in.a, in.o.data(), in.lse.data(), in.dout.data(), in.dqkv.data(), in.cu.data(),
                                  octet::delta_mode::matched, nullptr);
        benchmark::DoNotOptimize(in.dqkv.data());
    }
    state.counters["residual_rel"] = residual;
}

void attention_f32(benchmark::State& state) {
    const std::size_t threads = static_cast<std::size_t>(state.range(0));
    octet::thread_pool pool(static_cast<int>(threads));
    const octet::host_executor ex = octet::on_host(pool);
    attention_inputs in;
    std::vector<float> scratch(threads * common::attention_scratch_floats(kLen, kHeadDim));
    for (auto _ : state) {
        common::attention_forward_f32(ex, in.a, in.qkv.data(), in.o.data(), in.lse.data(), scratch.data(), threads);
        common::attention_backward_f32(ex, in.a, in.qkv.data(), in.o.data(), in.lse.data(), in.dout.data(),
                                       in.dqkv.data(), scratch.data(), threads);
        benchmark::DoNotOptimize(in.dqkv.data());
    }
}

struct linear_shape {
    int in, out;
};
constexpr linear_shape kLinears[] = {
    {kModel, (kHeadsQ + 2 * kHeadsKv) * kHeadDim}, {kModel, kModel}, {kModel, kFf}, {kFf, kModel}};

template <bool Fp8>
void linears(benchmark::State& state) {
    octet::thread_pool pool(static_cast<int>(state.range(0)));
    const octet::host_executor ex = octet::on_host(pool);
    common::memory_meter meter;
    std::vector<std::unique_ptr<common::linear_layer>> layers;
    std::vector<std::vector<float>> x, w, y, dy, dx, dw;
    std::uint32_t seed = 10;
    for (const linear_shape& s : kLinears) {
        const std::size_t I = static_cast<std::size_t>(s.in), O = static_cast<std::size_t>(s.out);
        if (Fp8)
            layers.push_back(
                std::make_unique<common::fp8_linear<octet::linear_recipes::blockwise>>(meter, kTokens, s.in, s.out, 7));
        else
            layers.push_back(std::make_unique<common::float32_linear>());
        layers.back()->in = s.in;
        layers.back()->out = s.out;
        x.push_back(random_vector(kTokens * I, 1.0f, seed++));
        w.push_back(random_vector(O * I, 0.05f, seed++));
        dy.push_back(random_vector(kTokens * O, 1e-3f, seed++));
        y.emplace_back(kTokens * O);
        dx.emplace_back(kTokens * I);
        dw.emplace_back(O * I);
    }
    std::vector<float> wt(kFf * kModel), yt(kFf * kTokens);
    const common::linear_layer::scratch s{wt.data(), yt.data(), nullptr, nullptr};
    for (auto _ : state) {
        for (std::size_t l = 0; l < layers.size(); ++l) {
            layers[l]->forward(ex, x[l].data(), kTokens, w[l].data(), y[l].data(), false, true, s, nullptr);
            layers[l]->backward(ex, dy[l].data(), kTokens, w[l].data(), dx[l].data(), dw[l].data(), s, nullptr);
            benchmark::DoNotOptimize(dw[l].data());
        }
    }
}

}  // namespace

BENCHMARK(attention_fp8)->Name("attention/fp8")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(attention_f32)->Name("attention/f32")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(linears<true>)->Name("linear/fp8")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(linears<false>)->Name("linear/f32")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
