// examples/08_training: the demo. One small training job, run twice from the same start on the
// same embedded data: in float32 (the reference) and the octet way, with every rounding placed on
// purpose. It is what `cmake --workflow --preset demo` runs.
//
// Run:  cmake --workflow --preset demo          (or build/default/examples/example_08_training)
//
// The job: a 2-layer MLP classifier (128 -> 256 -> 16, ReLU) learns labels made by a random
// teacher network from heavy-tailed inputs with four outlier channels (as activations have). The
// octet run does every matrix product in FP8 on the CPU with octet's scaled GEMM:
//   forward   X (1x128 E4M3) x W (128x128 E4M3)          the DeepSeek-V3 layout
//   backward  dY (1x128 E5M2) x W's column-wise copy      (dgrad)
//             dY^T x X^T, both 1x128 along the batch      (wgrad, from the quantizers' column-wise copies)
// and keeps its optimizer state 8-bit (AdamW, dynamic8 moments) over bf16 master weights with
// stochastic rounding. A monitor watches the underflow rate of the first layer's input; at step
// 180 the demo injects one bad batch (one input channel x 10^4, as a corrupt sample or an exploding
// feature would); the check trips and the recovery policy raises that layer to float32 for 5
// steps. Printed: both loss curves, the memory ledger of each configuration, and the run report
// with the recovery log and the monitors' own cost.
#include <octet/octet.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace demo {
using namespace octet;

constexpr std::size_t kIn = 128, kHidden = 256, kClasses = 16, kBatch = 256, kTrain = 16384, kSteps = 300;
constexpr std::int64_t kInjectStep = 180;
constexpr float kLr = 3e-3f;

using act_recipe = recipes::blockwise_1x128;                            // activations, E4M3 1x128
using weight_recipe = recipes::blockwise_128x128;                       // weights, E4M3 128x128
using grad_recipe = recipe<e5m2, block<1, 128>, scale::amax_ratio<0>>;  // gradients, E5M2 1x128

struct dataset {
    std::vector<float> x;  // kTrain x kIn
    std::vector<int> y;
};

/// Heavy-tailed inputs with four outlier channels, labelled by a random teacher MLP.
dataset make_data() {
    std::mt19937_64 g(20261130);
    std::student_t_distribution<float> t(3.0f);
    std::normal_distribution<float> n(0.0f, 1.0f);
    dataset d;
    d.x.resize(kTrain * kIn);
    for (std::size_t i = 0; i < kTrain; ++i)
        for (std::size_t j = 0; j < kIn; ++j) d.x[i * kIn + j] = t(g) * ((j % 32 == 7) ? 20.0f : 1.0f);
    const std::size_t th = 64;
    std::vector<float> w1(th * kIn), w2(kClasses * th);
    for (auto& w : w1) w = n(g) / std::sqrt(static_cast<float>(kIn));
    for (auto& w : w2) w = n(g) / std::sqrt(static_cast<float>(th));
    d.y.resize(kTrain);
    for (std::size_t i = 0; i < kTrain; ++i) {
        std::vector<float> h(th);
        for (std::size_t k = 0; k < th; ++k) {
            float s = 0;
            for (std::size_t j = 0; j < kIn; ++j) s += w1[k * kIn + j] * std::tanh(d.x[i * kIn + j]);
            h[k] = std::max(s, 0.0f);
        }
        int best = 0;
        float bv = -1e30f;
        for (std::size_t c = 0; c < kClasses; ++c) {
            float s = 0;
            for (std::size_t k = 0; k < th; ++k) s += w2[c * th + k] * h[k];
            if (s > bv) bv = s, best = static_cast<int>(c);
        }
        d.y[i] = best;
    }
    return d;
}

/// Parameters in one flat vector (what the optimizer sees): W1 | b1 | W2 | b2.
struct param_layout {
    static constexpr std::size_t w1 = 0, b1 = w1 + kHidden * kIn, w2 = b1 + kHidden, b2 = w2 + kClasses * kHidden,
                                 size = b2 + kClasses;
};

std::vector<float> initial_params() {
    std::mt19937_64 g(7);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> p(param_layout::size, 0.0f);
    for (std::size_t i = 0; i < kHidden * kIn; ++i) p[param_layout::w1 + i] = n(g) * std::sqrt(2.0f / kIn) * 0.5f;
    for (std::size_t i = 0; i < kClasses * kHidden; ++i) p[param_layout::w2 + i] = n(g) * std::sqrt(1.0f / kHidden);
    return p;
}

/// D (M x N) = A (M x K) * B (N x K)^T in float32 (the reference run's products).
void matmul_nt(const float* a, const float* b, float* d, std::size_t M, std::size_t N, std::size_t K) {
    parallel_for(on_host(), M, 8, [&](std::size_t r0, std::size_t r1) {
        for (std::size_t i = r0; i < r1; ++i)
            for (std::size_t j = 0; j < N; ++j) {
                float s = 0;
                for (std::size_t k = 0; k < K; ++k) s += a[i * K + k] * b[j * K + k];
                d[i * N + j] = s;
            }
    });
}
std::vector<float> transpose(const float* a, std::size_t rows, std::size_t cols) {
    std::vector<float> t(rows * cols);
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
    return t;
}

/// One linear product D = A B^T, in FP8 through octet (A and B already quantized) or in float.
template <class RA, class RB>
void fp8_product(const quantized_tensor<RA>& a, const quantized_tensor<RB>& b, float* d, std::size_t M, std::size_t N) {
    scaled_gemm(on_host(), a.cref(), b.cref(), matrix_ref<float>(d, M, N));
}

struct step_result {
    double loss = 0;
    double accuracy = 0;
    quant_stats x_stats;  // layer 1 input quantization
};

/// Forward, loss and backward for one batch; writes the gradient of every parameter.
/// fp8: the octet path; layer1_fp32: layer 1 raised to float32 (the recovery action).
step_result train_step(const std::vector<float>& params, const float* x, const int* y, std::vector<float>& grad,
                       bool fp8, bool layer1_fp32) {
    const float* W1 = params.data() + param_layout::w1;
    const float* b1 = params.data() + param_layout::b1;
    const float* W2 = params.data() + param_layout::w2;
    const float* b2 = params.data() + param_layout::b2;
    std::vector<float> h_pre(kBatch * kHidden), h(kBatch * kHidden), logits(kBatch * kClasses);
    step_result r;

    // ---- forward ----
    quantized_tensor<act_recipe> xq(kBatch, kIn), xq_t(kIn, kBatch), hq(kBatch, kHidden), hq_t(kHidden, kBatch);
    quantized_tensor<weight_recipe> w1q(kHidden, kIn), w2q(kClasses, kHidden), w2q_t(kHidden, kClasses);
    if (fp8) {
        quantize_options o;
        o.collect_stats = true;
        r.x_stats =
            quantize<act_recipe>(on_host(), matrix_ref<const float>(x, kBatch, kIn), xq.ref(), xq_t.ref(), o).rowwise;
    }
    if (fp8 && !layer1_fp32) {
        quantize<weight_recipe>(on_host(), matrix_ref<const float>(W1, kHidden, kIn), w1q.ref());
        fp8_product(xq, w1q, h_pre.data(), kBatch, kHidden);
    } else {
        matmul_nt(x, W1, h_pre.data(), kBatch, kHidden, kIn);
    }
    for (std::size_t i = 0; i < kBatch; ++i)
        for (std::size_t j = 0; j < kHidden; ++j) {
            h_pre[i * kHidden + j] += b1[j];
            h[i * kHidden + j] = std::max(h_pre[i * kHidden + j], 0.0f);
        }
    if (fp8) {
        quantize<act_recipe>(on_host(), matrix_ref<const float>(h.data(), kBatch, kHidden), hq.ref(), hq_t.ref());
        quantize<weight_recipe>(on_host(), matrix_ref<const float>(W2, kClasses, kHidden), w2q.ref(), w2q_t.ref());
        fp8_product(hq, w2q, logits.data(), kBatch, kClasses);
    } else {
        matmul_nt(h.data(), W2, logits.data(), kBatch, kClasses, kHidden);
    }

    // ---- softmax cross-entropy ----
    std::vector<float> dlogits(kBatch * kClasses);
    for (std::size_t i = 0; i < kBatch; ++i) {
        float* z = logits.data() + i * kClasses;
        float m = -INFINITY;
        for (std::size_t c = 0; c < kClasses; ++c) m = std::max(m, z[c] + b2[c]);
        double sum = 0;
        for (std::size_t c = 0; c < kClasses; ++c) sum += std::exp(static_cast<double>(z[c] + b2[c] - m));
        std::size_t arg = 0;
        for (std::size_t c = 0; c < kClasses; ++c) {
            const double p = std::exp(static_cast<double>(z[c] + b2[c] - m)) / sum;
            dlogits[i * kClasses + c] = static_cast<float>((p - (static_cast<int>(c) == y[i] ? 1.0 : 0.0)) / kBatch);
            if (z[c] + b2[c] > z[arg] + b2[arg]) arg = c;
        }
        r.loss += -(static_cast<double>(z[y[i]] + b2[y[i]] - m) - std::log(sum)) / kBatch;
        r.accuracy += (static_cast<int>(arg) == y[i]) / static_cast<double>(kBatch);
    }

    // ---- backward ----
    std::fill(grad.begin(), grad.end(), 0.0f);
    std::vector<float> dh(kBatch * kHidden);
    float* dW1 = grad.data() + param_layout::w1;
    float* db1 = grad.data() + param_layout::b1;
    float* dW2 = grad.data() + param_layout::w2;
    float* db2 = grad.data() + param_layout::b2;
    for (std::size_t i = 0; i < kBatch; ++i)
        for (std::size_t c = 0; c < kClasses; ++c) db2[c] += dlogits[i * kClasses + c];
    if (fp8) {
        quantized_tensor<grad_recipe> dyq(kBatch, kClasses), dyq_t(kClasses, kBatch);
        quantize<grad_recipe>(on_host(), matrix_ref<const float>(dlogits.data(), kBatch, kClasses), dyq.ref(),
                              dyq_t.ref());
        fp8_product(dyq_t, hq_t, dW2, kClasses, kHidden);     // wgrad: dY^T H, K = batch
        fp8_product(dyq, w2q_t, dh.data(), kBatch, kHidden);  // dgrad: dY W2, W2's column-wise copy
    } else {
        const auto dyt = transpose(dlogits.data(), kBatch, kClasses);
        const auto ht = transpose(h.data(), kBatch, kHidden);
        matmul_nt(dyt.data(), ht.data(), dW2, kClasses, kHidden, kBatch);
        const auto w2t = transpose(W2, kClasses, kHidden);
        matmul_nt(dlogits.data(), w2t.data(), dh.data(), kBatch, kHidden, kClasses);
    }
    for (std::size_t i = 0; i < kBatch * kHidden; ++i) dh[i] = h_pre[i] > 0.0f ? dh[i] : 0.0f;
    for (std::size_t i = 0; i < kBatch; ++i)
        for (std::size_t j = 0; j < kHidden; ++j) db1[j] += dh[i * kHidden + j];
    if (fp8 && !layer1_fp32) {
        quantized_tensor<grad_recipe> dhq_t(kHidden, kBatch);
        quantize<grad_recipe>(on_host(), matrix_ref<const float>(dh.data(), kBatch, kHidden),
                              quantized_ref<grad_recipe>{}, dhq_t.ref());
        fp8_product(dhq_t, xq_t, dW1, kHidden, kIn);  // wgrad: dH^T X, K = batch
    } else {
        const auto dht = transpose(dh.data(), kBatch, kHidden);
        const auto xt = transpose(x, kBatch, kIn);
        matmul_nt(dht.data(), xt.data(), dW1, kHidden, kIn, kBatch);
    }
    return r;
}

/// Accuracy of the current parameters on a fixed evaluation slice, in float32.
double evaluate(const std::vector<float>& params, const dataset& d) {
    std::vector<float> grad(param_layout::size);
    double acc = 0;
    const std::size_t batches = 8;
    for (std::size_t b = 0; b < batches; ++b) {
        const std::size_t off = kTrain - (b + 1) * kBatch;
        acc += train_step(params, d.x.data() + off * kIn, d.y.data() + off, grad, false, false).accuracy / batches;
    }
    return acc;
}

}  // namespace demo

int main() {
    using namespace demo;
    using clock = std::chrono::steady_clock;
    const dataset data = make_data();
    const std::size_t train_rows = kTrain - 8 * kBatch;  // the last 8 batches are held out
    std::printf(
        "octet %s demo: a 128-256-16 MLP, %zu training samples (heavy-tailed inputs, 4 outlier channels),\n"
        "batch %zu, %zu steps of AdamW (lr %.0e), trained twice from the same start:\n"
        "  float32: float products, float AdamW state, float master weights\n"
        "  octet:   FP8 products (E4M3 1x128 activations, E4M3 128x128 weights, E5M2 1x128 gradients),\n"
        "           8-bit AdamW state (dynamic8), bf16 master weights with stochastic rounding\n\n",
        OCTET_VERSION_STRING, train_rows, kBatch, kSteps, static_cast<double>(kLr));

    const auto init = initial_params();
    adamw_hyper hyper;
    hyper.weight_decay = 0.0f;
    hyper.seed = 2026;
    adamw_optimizer<state_codec::fp32, state_codec::fp32, master::fp32> ref_opt(param_layout::size, hyper);
    adamw_optimizer<state_codec::dynamic8, state_codec::dynamic8, master::bf16_stochastic> fp8_opt(param_layout::size,
                                                                                                   hyper);
    ref_opt.state.set_params(as_cspan(init));
    fp8_opt.state.set_params(as_cspan(init));
    std::vector<float> ref_params = init, fp8_params = init, grad(param_layout::size);

    // Monitors and the recovery policy of the octet run.
    check_registry checks;
    // Normal batches flush about 1e-4 of fc1's inputs to zero: warn at 2e-3, trip at 1e-2.
    const auto underflow =
        checks.add("fc1.input.underflow", check_kind::underflow_rate, threshold::above(2e-3, 1e-2), "fc1");
    const auto non_finite = checks.add("gradients.non_finite", check_kind::non_finite, "backward");
    bool fc1_raised = false;
    recovery_callbacks cb;
    cb.raise_precision = [&](const std::string&, int) {
        fc1_raised = true;
        return static_cast<double>(kBatch * kIn + kHidden * kIn) * 4.0;  // float copies of X and W1
    };
    cb.restore_precision = [&](const std::string&) { fc1_raised = false; };
    recovery_config rc;
    rc.raise_steps = 5;
    rc.ladder = {recovery_action::raise_precision};  // this demo only raises precision
    rc.non_finite_ladder = {recovery_action::raise_precision};
    recovery_policy policy(rc, cb);
    run_report report;

    std::printf("  %5s %12s %12s %14s %14s\n", "step", "loss fp32", "loss octet", "held-out fp32", "held-out octet");
    const auto wall0 = clock::now();
    for (std::int64_t step = 0; step < static_cast<std::int64_t>(kSteps);) {
        const std::size_t off = (static_cast<std::size_t>(step) * kBatch) % (train_rows - kBatch + 1);
        const float* x = data.x.data() + off * kIn;
        std::vector<float> bad;
        if (step == kInjectStep) {  // the injected bad batch: one input channel x 10^4
            bad.assign(x, x + kBatch * kIn);
            for (std::size_t i = 0; i < kBatch; ++i) bad[i * kIn + 3] *= 1e4f;
            x = bad.data();
        }
        const int* y = data.y.data() + off;

        const auto r_ref = train_step(ref_params, x, y, grad, false, false);
        ref_opt.step(on_host(), as_cspan(grad), kLr);
        ref_params = ref_opt.state.params_as_float();

        const auto t0 = clock::now();
        const auto r = train_step(fp8_params, x, y, grad, true, fc1_raised);
        checks.measure(underflow, step, [&] { return r.x_stats.flushed_fraction(); });
        checks.measure(non_finite, step, [&] {
            std::size_t bad_grads = 0;
            for (float gv : grad) bad_grads += !std::isfinite(gv);
            return static_cast<double>(bad_grads);
        });
        fp8_opt.step(on_host(), as_cspan(grad), kLr);
        fp8_params = fp8_opt.state.params_as_float();
        const double secs = std::chrono::duration<double>(clock::now() - t0).count();
        report.record_step(step, r.loss, static_cast<double>(kBatch), secs);

        if (step % 30 == 0 || step == static_cast<std::int64_t>(kSteps) - 1 || step == kInjectStep)
            std::printf(
                "  %5lld %12.4f %12.4f %14.3f %14.3f%s\n", static_cast<long long>(step), r_ref.loss, r.loss,
                evaluate(ref_params, data), evaluate(fp8_params, data),
                step == kInjectStep ? "   <- injected bad batch" : (fc1_raised ? "   (fc1 raised to fp32)" : ""));
        const auto outcome = policy.after_step(step, checks, secs);
        if (outcome.stop) break;
        step = outcome.next_step;
    }
    report.set_wall_seconds(std::chrono::duration<double>(clock::now() - wall0).count());

    // Memory: what each configuration holds for this model (activations: X and H of one batch,
    // float32 against FP8 codes plus their scales; temporaries: one gradient-sized buffer).
    const double n = static_cast<double>(param_layout::size);
    const double act_fp32 = 4.0 * kBatch * (kIn + kHidden);
    const double act_fp8 = 1.0 * kBatch * (kIn + kHidden) + 4.0 * kBatch * (kIn + kHidden) / 128.0;
    optimizer_memory_config ref_cfg;
    ref_cfg.parameters = n;
    ref_cfg.gradient_bytes = 4;
    ref_cfg.activation_bytes = act_fp32;
    ref_cfg.temporary_bytes = 4 * n;
    optimizer_memory_config fp8_cfg = ref_cfg;
    fp8_cfg.first_moment = fp8_cfg.second_moment = state_codec_id::dynamic8;
    fp8_cfg.master = master_weights_id::bf16_stochastic;
    fp8_cfg.gradient_bytes = 2;
    fp8_cfg.activation_bytes = act_fp8;
    const memory_ledger ref_ledger = optimizer_memory_ledger(ref_cfg), fp8_ledger = optimizer_memory_ledger(fp8_cfg);
    std::printf("\nMemory of this model (%.0f parameters), KiB: float32 run %.1f, octet run %.1f (%.0f%%)\n", n,
                ref_ledger.total() / 1024, fp8_ledger.total() / 1024, 100.0 * fp8_ledger.total() / ref_ledger.total());
    std::printf("%s", fp8_ledger.to_markdown(1024.0, "KiB").c_str());
    std::printf("\nThe octet run's report (the float32 run is not monitored):\n\n%s",
                report.to_markdown(checks, policy.log(), fp8_ledger).c_str());
    return 0;
}
