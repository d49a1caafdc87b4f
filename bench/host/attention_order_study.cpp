// Key tile order and P underflow (issue 14): octet's host FP8 attention forward with its key tiles
// visited front to back and back to front, on inputs with an attention sink, against float64 on the
// same FP8 operands.
//
//   ./bench_attention_order_study [--seed S] [--max-len L]
//
// Inputs: one sequence per length (1024 and 4096 tokens), 2 heads of 64, Q, K and V in E4M3 with one
// scale per token and head (V's scale is folded into P, as in training). Every query has 1 on
// channel 0 and N(0, 1) on the others; key 0 of each head (the sink) has 8 * gap on channel 0, the
// other keys 0 there; keys are N(0, 1) on channels 1..63 and V is N(0, 1), each token scaled by its
// own magnitude in [0.5, 2). With the softmax scale 1/8 the sink's score is `gap` nats above a key
// of the same other channels: gap 0 is no sink; the sink's share of each row's mass ("sink") is
// measured (float64 P, mean over rows).
//
// Per order: the P census of the forward (attention_p_census: the share of the P V product's
// positive P that rounds to an E4M3 zero, or to a subnormal), O's relative L2 error against
// float64, and the error relative to the part of O that the other keys carry,
// ||O - Oref|| / ||Oref - P_sink V_sink||: what a row loses of everything but the sink.
// Everything runs on one thread.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "octet/attention/attention.hpp"
#include "octet/quant/quantize.hpp"
#include "octet/reference/attention.hpp"

namespace {
using namespace octet;

constexpr int head_dim = 64, heads = 2;
using per_token = recipe<e4m3, block<1, head_dim>, scale::amax_ratio<0>>;
using per_head = recipe<e4m3, block<full, head_dim>, scale::amax_ratio<0>>;

template <class R>
struct operand {
    quantized_tensor<R> q;
    std::vector<double> values;  // dequantized, for the float64 reference
};

template <class R>
operand<R> quantize_operand(const std::vector<float>& x, std::size_t rows) {
    const std::size_t cols = static_cast<std::size_t>(heads) * head_dim;
    operand<R> t{quantized_tensor<R>(rows, cols), {}};
    quantize<R>(on_host(), matrix_ref<const float>(x.data(), rows, cols), t.q.ref());
    std::vector<float> y(x.size());
    dequantize(on_host(), t.q.cref(), matrix_ref<float>(y.data(), rows, cols));
    t.values.assign(y.begin(), y.end());
    return t;
}

template <class VR>
struct sink_inputs {
    operand<per_token> q, k;
    operand<VR> v;
};

template <class VR>
sink_inputs<VR> make_inputs(int len, double gap, std::uint64_t seed) {
    std::mt19937_64 g(seed * 1000003u + static_cast<std::uint64_t>(len));
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::uniform_real_distribution<float> mag(0.5f, 2.0f);
    const std::size_t cols = static_cast<std::size_t>(heads) * head_dim, size = static_cast<std::size_t>(len) * cols;
    std::vector<float> q(size), k(size), v(size);
    for (int t = 0; t < len; ++t)
        for (int h = 0; h < heads; ++h) {
            const float ak = mag(g), av = mag(g);
            for (int e = 0; e < head_dim; ++e) {
                const std::size_t i = t * cols + static_cast<std::size_t>(h) * head_dim + e;
                q[i] = e == 0 ? 1.0f : n(g);
                k[i] = e == 0 ? (t == 0 ? static_cast<float>(8 * gap) : 0.0f) : ak * n(g);
                v[i] = av * n(g);
            }
        }
    return {quantize_operand<per_token>(q, len), quantize_operand<per_token>(k, len), quantize_operand<VR>(v, len)};
}

struct order_result {
    attention_p_census census;
    double o_err = 0, rest_err = 0, seconds = 0;
};

/// One row pair of the table: the float64 reference, then the forward in both orders.
template <class VR>
void study(host_executor ex, int len, bool causal, double gap, std::uint64_t seed, const char* v_scale) {
    const sink_inputs<VR> in = make_inputs<VR>(len, gap, seed);
    const std::vector<std::int32_t> cu{0, len};
    attention_shape shape;
    shape.cu_seqlens_q = span<const std::int32_t>(cu.data(), cu.size());
    shape.heads_q = shape.heads_kv = heads;
    shape.head_dim = head_dim;
    reference::attention_problem pr;
    pr.cu_q = {0, len};
    pr.heads_q = pr.heads_kv = heads;
    pr.head_dim = head_dim;
    pr.causal = causal;
    const auto ref = reference::attention(pr, in.q.values, in.k.values, in.v.values);
    const std::size_t cols = static_cast<std::size_t>(heads) * head_dim;

    // the sink's share of each row and the part of O the other keys carry
    double sink_mass = 0, rest2 = 0;
    for (int t = 0; t < len; ++t)
        for (int h = 0; h < heads; ++h) {
            double s = 0;
            const std::size_t row = t * cols + static_cast<std::size_t>(h) * head_dim;
            for (int e = 0; e < head_dim; ++e) s += in.q.values[row + e] * in.k.values[h * head_dim + e];
            const double p0 = std::exp(s / 8 - ref.lse[static_cast<std::size_t>(h) * len + t]);
            sink_mass += p0;
            for (int e = 0; e < head_dim; ++e) {
                const double rest = ref.o[row + e] - p0 * in.v.values[h * head_dim + e];
                rest2 += rest * rest;
            }
        }
    sink_mass /= static_cast<double>(len) * heads;

    for (key_tile_order order : {key_tile_order::front_to_back, key_tile_order::back_to_front}) {
        attention_options ao;
        ao.mask = causal ? attention_mask::causal : attention_mask::full;
        ao.key_order = order;
        std::vector<float> o(static_cast<std::size_t>(len) * cols), lse(static_cast<std::size_t>(heads) * len);
        order_result r;
        const auto t0 = std::chrono::steady_clock::now();
        attention_forward(ex, shape, in.q.q.cref(), in.k.q.cref(), in.v.q.cref(),
                          matrix_ref<float>(o.data(), len, cols), span<float>(lse.data(), lse.size()), ao, r.census);
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        double err2 = 0, ref2 = 0;
        for (std::size_t i = 0; i < o.size(); ++i) {
            err2 += (o[i] - ref.o[i]) * (o[i] - ref.o[i]);
            ref2 += ref.o[i] * ref.o[i];
        }
        r.o_err = std::sqrt(err2 / ref2);
        r.rest_err = std::sqrt(err2 / rest2);
        std::printf("| %s | %d | %s | %4.1f | %.3f | %s | %.4f | %.4f | %.4f | %.4f | %.2f |\n",
                    causal ? "causal" : "full", len, v_scale, gap, sink_mass,
                    order == key_tile_order::front_to_back ? "front to back" : "back to front",
                    r.census.flushed_share(), r.census.subnormal_share(), r.o_err, r.rest_err, r.seconds);
        std::fflush(stdout);
    }
}

struct options {
    std::uint64_t seed = 2026;
    int max_len = 4096;
};

int usage(const char* argv0) {
    std::fprintf(stderr, "usage: %s [--seed S] [--max-len L]\n", argv0);
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    options opt;
    for (int a = 1; a < argc; ++a) {
        const bool has_value = a + 1 < argc;
        if (!std::strcmp(argv[a], "--seed") && has_value)
            opt.seed = std::strtoull(argv[++a], nullptr, 10);
        else if (!std::strcmp(argv[a], "--max-len") && has_value)
            opt.max_len = std::atoi(argv[++a]);
        else
            return usage(argv[0]);
    }
    if (opt.max_len < 1) return usage(argv[0]);

    const host_executor ex = on_host(1);
    std::printf("seed %llu; E4M3 Q, K, V per token and head; P at the fixed scale 2^-8\n\n",
                static_cast<unsigned long long>(opt.seed));
    std::printf(
        "| mask | len | V scale | gap (nats) | sink | order | P flushed | P subnormal | O err | err of the rest | "
        "seconds |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int len : {1024, 4096}) {
        if (len > opt.max_len) continue;
        for (bool causal : {false, true})
            for (double gap : {0.0, 4.0, 7.0, 10.0, 13.0}) {
                study<per_token>(ex, len, causal, gap, opt.seed, "per token");
                study<per_head>(ex, len, causal, gap, opt.seed, "per head");
            }
    }
    return 0;
}
