// Example 04: one FP8 attention layer, forward and backward, with both delta modes.
//
// The backward of attention forms dS = P * (dP - D) with a row term D_i. In exact arithmetic
// D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij and every row of dS sums to zero (the softmax does
// not change when a constant is added to a row of scores, so its gradient has no component along
// that direction). Under FP8 the O the forward stored is not the P V the backward sees, so the
// usual D is stale: rows of dS no longer sum to zero and dQ picks up a bias along the
// attention-weighted mean key. delta_mode::matched computes D from the very P and dP that form dS.
//
// This program quantizes Q, K, dO to E4M3 (one scale per token and head) and V twice: per token
// and head, then per head (one scale over all tokens, the bf16 entry points' default). For each, it
// runs octet's host path (the same quantization points as the CUDA kernels) and prints the row-sum
// residuals, the gradient errors against float64 on the same FP8 inputs, and how much larger dQ's
// error along the attention-weighted mean key is with the stale delta.
//
// Build and run: cmake --build build --target example_04_attention_delta && build/examples/example_04_attention_delta
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "octet/attention/attention.hpp"
#include "octet/quant/quantize.hpp"
#include "octet/reference/attention.hpp"

namespace example {
using namespace octet;
using per_token = recipe<e4m3, block<1, 64>, scale::amax_ratio<0>>;    // one scale per token and head of 64
using per_head = recipe<e4m3, block<full, 64>, scale::amax_ratio<0>>;  // one scale per head over all tokens

template <class R>
struct fp8 {
    quantized_tensor<R> q;
    std::vector<double> values;  // dequantized, for the float64 reference
};

template <class R>
fp8<R> quantize_tensor(const std::vector<float>& x, std::size_t rows, std::size_t cols) {
    fp8<R> t{quantized_tensor<R>(rows, cols), {}};
    quantize<R>(on_host(), matrix_ref<const float>(x.data(), rows, cols), t.q.ref());
    std::vector<float> y(x.size());
    dequantize(on_host(), t.q.cref(), matrix_ref<float>(y.data(), rows, cols));
    t.values.assign(y.begin(), y.end());
    return t;
}

double rel_l2(const std::vector<float>& a, const std::vector<double>& b) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return std::sqrt(num / den);
}

struct layer {
    std::vector<std::int32_t> cu{0, 256, 448};  // two sequences: 256 and 192 tokens
    int hq = 4, hkv = 2, d = 64;
    int tokens() const { return cu.back(); }
    std::size_t cq() const { return static_cast<std::size_t>(hq) * d; }
    std::size_t ck() const { return static_cast<std::size_t>(hkv) * d; }
};

/// Forward and both backwards with V quantized under VR; prints one block of the table.
template <class VR>
void run_layer(const layer& L, const char* v_label, const fp8<per_token>& Q, const fp8<per_token>& K,
               const std::vector<float>& v, const fp8<per_token>& dO) {
    const int hq = L.hq, d = L.d, tokens = L.tokens();
    const std::size_t cq = L.cq(), ck = L.ck();
    const fp8<VR> V = quantize_tensor<VR>(v, tokens, ck);

    attention_shape shape;
    shape.cu_seqlens_q = span<const std::int32_t>(L.cu.data(), L.cu.size());
    shape.heads_q = hq;
    shape.heads_kv = L.hkv;
    shape.head_dim = d;

    std::vector<float> o(tokens * cq), lse(static_cast<std::size_t>(hq) * tokens);
    attention_forward(on_host(), shape, Q.q.cref(), K.q.cref(), V.q.cref(), matrix_ref<float>(o.data(), tokens, cq),
                      span<float>(lse.data(), lse.size()), {attention_mask::causal});

    reference::attention_problem pr;
    pr.cu_q.assign(L.cu.begin(), L.cu.end());
    pr.heads_q = hq;
    pr.heads_kv = L.hkv;
    pr.head_dim = d;
    pr.causal = true;
    const auto ref = reference::attention(pr, Q.values, K.values, V.values, dO.values);

    std::printf("V scale %s: forward O relative L2 error %.4f (E4M3 P in the P V product)\n", v_label,
                rel_l2(o, ref.o));
    std::printf("%-12s | %-24s %-10s | %-8s %-8s %-8s | %s\n", "delta mode", "row-sum residual ||r||/||a||",
                "max |r_i|", "dQ err", "dK err", "dV err", "D err vs exact D");

    std::vector<float> dq[2];
    attention_stats st[2];
    for (int m = 0; m < 2; ++m) {
        attention_backward_options bo;
        bo.mask = attention_mask::causal;
        bo.delta = m == 0 ? delta_mode::from_output : delta_mode::matched;
        bo.telemetry = true;
        dq[m].resize(tokens * cq);
        std::vector<float> dk(tokens * ck), dv(tokens * ck);
        attention_row_telemetry rows;
        st[m] = attention_backward(
            on_host(), shape, Q.q.cref(), K.q.cref(), V.q.cref(), matrix_ref<const float>(o.data(), tokens, cq),
            span<const float>(lse.data(), lse.size()), dO.q.cref(), matrix_ref<float>(dq[m].data(), tokens, cq),
            matrix_ref<float>(dk.data(), tokens, ck), matrix_ref<float>(dv.data(), tokens, ck), bo, &rows);
        std::printf("%-12s | %-24.3g %-10.3g | %-8.4f %-8.4f %-8.4f | %.3g\n", m == 0 ? "from_output" : "matched",
                    st[m].residual_rel(), st[m].residual_max, rel_l2(dq[m], ref.dq), rel_l2(dk, ref.dk),
                    rel_l2(dv, ref.dv), rel_l2(rows.delta, ref.delta));
    }

    // where the stale delta goes: the difference of the two dQ lies along the attention-weighted
    // mean key, and so does the extra error from_output carries
    double along = 0, total = 0, err_along[2] = {0, 0};
    for (std::size_t r = 0; r < static_cast<std::size_t>(tokens) * hq; ++r) {
        double kk = 0, dd = 0, dk = 0, e[2] = {0, 0};
        for (int x = 0; x < d; ++x) {
            const std::size_t i = r * d + x;
            const double diff = static_cast<double>(dq[0][i]) - dq[1][i];
            kk += ref.kbar[i] * ref.kbar[i];
            dd += diff * diff;
            dk += diff * ref.kbar[i];
            for (int m = 0; m < 2; ++m) e[m] += (dq[m][i] - ref.dq[i]) * ref.kbar[i];
        }
        if (kk > 0) {
            along += dk * dk / kk;
            total += dd;
            for (int m = 0; m < 2; ++m) err_along[m] += e[m] * e[m] / kk;
        }
    }
    std::printf("stale delta as the backward sees it: ||rowsum(dO*O) - sum_j P dP|| / ||sum_j P |dP||| = %.3g\n",
                st[0].gap_rel());
    std::printf(
        "dQ(from_output) - dQ(matched): %.1f%% of its energy lies along the attention-weighted mean key sum_j P_ij "
        "K_j\n",
        100.0 * along / total);
    std::printf("dQ error along that key (vs float64): from_output / matched = %.2fx\n\n",
                std::sqrt(err_along[0] / err_along[1]));
}

int run() {
    const layer L;
    const int tokens = L.tokens();
    const std::size_t cq = L.cq(), ck = L.ck();

    // Activations: queries fairly sharp, keys sharing a mean direction (as trained keys do).
    std::mt19937 g(2026);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> q(tokens * cq), k(tokens * ck), v(tokens * ck), dout(tokens * cq), mean(ck);
    for (auto& x : mean) x = n(g);
    for (auto& x : q) x = 1.5f * n(g);
    for (std::size_t i = 0; i < k.size(); ++i) k[i] = n(g) + mean[i % ck];
    for (auto& x : v) x = n(g);
    for (auto& x : dout) x = n(g);
    const auto Q = quantize_tensor<per_token>(q, tokens, cq), K = quantize_tensor<per_token>(k, tokens, ck),
               dO = quantize_tensor<per_token>(dout, tokens, cq);

    std::printf(
        "FP8 attention layer: sequences of 256 and 192 tokens, %d query heads sharing %d key/value heads of %d, "
        "causal;\n",
        L.hq, L.hkv, L.d);
    std::printf(
        "Q, K, dO in E4M3 with one scale per token and head. Errors are against float64 on the same FP8 inputs.\n\n");
    run_layer<per_token>(L, "per token and head", Q, K, v, dO);
    run_layer<per_head>(L, "per head (all tokens)", Q, K, v, dO);
    return 0;
}

}  // namespace example

int main() {
    return example::run();
}
