// Example 05: compressed optimizer states and master weights.
//
// Trains one small generated problem (least squares, 256 weights, 512 samples; feature scales
// spanning two decades; every update smaller than half a bf16 ulp of its weight) with AdamW under
// every state codec and master-weight policy, and prints the final loss, the share of float
// AdamW's loss reduction each one keeps, the bytes per parameter (total: with bf16 gradients),
// and the memory ledger of a 7B-parameter model trained two ways. Then it saves a checkpoint and
// resumes from it.
//
//   cmake --build build/default --target example_05_optimizer_states
//   build/default/examples/example_05_optimizer_states
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "octet/optim/memory.hpp"
#include "octet/optim/optimizer.hpp"

namespace {

constexpr std::size_t kDim = 256, kSamples = 512;
constexpr int kSteps = 300;

struct problem {
    std::vector<float> x, y, w0;
};

problem make_problem(unsigned seed) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> mag(1.0f, 2.0f), decade(-1.0f, 1.0f);
    problem p;
    std::vector<float> col(kDim), wstar(kDim);
    for (auto& c : col) c = std::pow(10.0f, decade(g));
    for (auto& w : wstar) w = (g() & 1 ? 1.0f : -1.0f) * mag(g);
    p.x.resize(kSamples * kDim);
    p.y.resize(kSamples);
    for (std::size_t s = 0; s < kSamples; ++s) {
        double t = 0;
        for (std::size_t j = 0; j < kDim; ++j) {
            p.x[s * kDim + j] = normal(g) * col[j];
            t += static_cast<double>(p.x[s * kDim + j]) * wstar[j];
        }
        p.y[s] = static_cast<float>(t) + 0.1f * normal(g);
    }
    for (std::size_t j = 0; j < kDim; ++j) p.w0.push_back(wstar[j] + 0.05f * normal(g));
    return p;
}

double loss_and_grad(const problem& p, const std::vector<float>& w, std::vector<float>* grad) {
    std::vector<float> r(kSamples);
    double loss = 0;
    for (std::size_t s = 0; s < kSamples; ++s) {
        float t = 0;
        for (std::size_t j = 0; j < kDim; ++j) t += p.x[s * kDim + j] * w[j];
        r[s] = t - p.y[s];
        loss += 0.5 * static_cast<double>(r[s]) * r[s];
    }
    if (grad) {
        grad->assign(kDim, 0.0f);
        for (std::size_t s = 0; s < kSamples; ++s)
            for (std::size_t j = 0; j < kDim; ++j) (*grad)[j] += r[s] / kSamples * p.x[s * kDim + j];
    }
    return loss / kSamples;
}

template <class Opt>
std::vector<float> forward_weights(const Opt& opt) {  // what a forward pass reads: floats or the bf16 values
    std::vector<float> w(kDim);
    for (std::size_t j = 0; j < kDim; ++j) {
        if constexpr (std::is_same_v<typename Opt::state_type::weight_type, float>)
            w[j] = opt.state.params[j];
        else
            w[j] = octet::to_float(opt.state.params[j]);
    }
    return w;
}

template <class Opt>
void train(Opt& opt, const problem& p, int from, int to) {
    std::vector<float> grad;
    for (int t = from; t < to; ++t) {
        loss_and_grad(p, forward_weights(opt), &grad);
        const double lr =
            std::ldexp(1.0, -10) * 0.5 * (1 + std::cos(3.14159265358979 * t / kSteps));  // cosine schedule
        opt.step(octet::on_host(), octet::as_cspan(grad), static_cast<float>(lr));
    }
}

template <class Codec, class Master>
double run(const problem& p, const char* codec, const char* master, double l0, double lf) {
    octet::adamw_hyper h;
    h.weight_decay = 0.0f;
    h.seed = 1;
    octet::adamw_optimizer<Codec, Codec, Master> opt(kDim, h);
    opt.state.set_params(octet::as_cspan(p.w0));
    train(opt, p, 0, kSteps);
    const double loss = loss_and_grad(p, forward_weights(opt), nullptr);
    const auto bpp = octet::bytes_per_parameter(octet::memory_config_for<Codec, Codec, Master>(1, 2));
    std::string note;
    if constexpr (std::is_same_v<Master, octet::master::bf16_nearest>) {
        int moved = 0;
        for (std::size_t j = 0; j < kDim; ++j) moved += opt.state.params[j].bits != octet::to_bf16(p.w0[j]).bits;
        note = std::to_string(moved) + " of " + std::to_string(kDim) + " weights moved";
    }
    std::printf("| %-13s | %-15s | %9.5f | %7.1f%% | %6.3f | %6.3f | %s |\n", codec, master, loss,
                lf > 0 ? 100 * (l0 - loss) / (l0 - lf) : 100.0, bpp.optimizer_state, bpp.total(), note.c_str());
    return loss;
}

template <class Codec>
void run_codec(const problem& p, const char* name, double l0, double lf) {
    run<Codec, octet::master::fp32>(p, name, "fp32", l0, lf);
    run<Codec, octet::master::bf16_stochastic>(p, name, "bf16 stochastic", l0, lf);
    run<Codec, octet::master::bf16_kahan>(p, name, "bf16 Kahan", l0, lf);
    run<Codec, octet::master::bf16_nearest>(p, name, "bf16 nearest", l0, lf);
}

}  // namespace

int main() {
    namespace sc = octet::state_codec;
    const problem p = make_problem(2026);
    const double l0 = loss_and_grad(p, p.w0, nullptr);
    std::printf("least squares, %zu weights, %zu samples, %d AdamW steps (lr 2^-10, cosine); start loss %.5f\n\n", kDim,
                kSamples, kSteps, l0);
    std::printf("| moments       | master weights  | final loss | kept     | state B/param | total B/param | note |\n");
    std::printf("|---------------|-----------------|-----------|----------|--------|--------|------|\n");
    const double lf = run<sc::fp32, octet::master::fp32>(p, "fp32", "fp32", l0, 0.0);
    run<sc::fp32, octet::master::bf16_stochastic>(p, "fp32", "bf16 stochastic", l0, lf);
    run<sc::fp32, octet::master::bf16_kahan>(p, "fp32", "bf16 Kahan", l0, lf);
    run<sc::fp32, octet::master::bf16_nearest>(p, "fp32", "bf16 nearest", l0, lf);
    run_codec<sc::bf16>(p, "bf16", l0, lf);
    run_codec<sc::e4m3_scaled>(p, "e4m3_scaled", l0, lf);
    run_codec<sc::e4m3_expanded>(p, "e4m3_expanded", l0, lf);
    run_codec<sc::dynamic8>(p, "dynamic8", l0, lf);
    std::printf(
        "\n'kept': share of float AdamW's loss reduction (bf16 nearest's few percent are only the rounding of\n"
        "the start to bf16: no weight moves, because every update is below half an ulp of its weight and is\n"
        "rounded away; stochastic rounding and the Kahan buffer keep those updates).\n\n");

    // The ledger of a 7B-parameter model (bf16 gradients, 40 GB of activations, 8 GB of temporaries).
    auto ledger_for = [](octet::state_codec_id moments, octet::master_weights_id master, bool bf16_copy) {
        octet::optimizer_memory_config c;
        c.parameters = 7e9;
        c.first_moment = c.second_moment = moments;
        c.master = master;
        c.bf16_weight_copy = bf16_copy;
        c.activation_bytes = 40e9;
        c.temporary_bytes = 8e9;
        return octet::optimizer_memory_ledger(c);
    };
    const auto base = ledger_for(octet::state_codec_id::fp32, octet::master_weights_id::fp32, true);
    const auto lean = ledger_for(octet::state_codec_id::dynamic8, octet::master_weights_id::bf16_kahan, false);
    std::printf("7B parameters, fp32 master + bf16 copy, fp32 moments (GB):\n%s\n",
                base.to_markdown(1e9, "GB").c_str());
    std::printf("7B parameters, bf16 + Kahan master, dynamic8 moments (GB):\n%s\n",
                lean.to_markdown(1e9, "GB").c_str());
    std::printf("total %.1f GB -> %.1f GB (%.0f%% less)\n\n", base.total() / 1e9, lean.total() / 1e9,
                100 * (1 - lean.total() / base.total()));

    // Checkpoint: train half, save, resume in a fresh optimizer, finish; same bits as straight through.
    using opt_t = octet::adamw_optimizer<sc::dynamic8, sc::dynamic8, octet::master::bf16_kahan>;
    octet::adamw_hyper h;
    h.weight_decay = 0.0f;
    opt_t straight(kDim, h), first(kDim, h), resumed(kDim);
    straight.state.set_params(octet::as_cspan(p.w0));
    first.state.set_params(octet::as_cspan(p.w0));
    train(straight, p, 0, kSteps);
    train(first, p, 0, kSteps / 2);
    const std::string path = "example_05_optimizer_states.ckpt";
    first.save(path);
    resumed.load(path);
    train(resumed, p, kSteps / 2, kSteps);
    bool same = true;
    for (std::size_t j = 0; j < kDim; ++j)
        same = same && resumed.state.params[j].bits == straight.state.params[j].bits &&
               resumed.state.compensation[j].bits == straight.state.compensation[j].bits;
    std::printf("checkpoint at step %d (%s), resumed to step %d: %s\n", kSteps / 2, path.c_str(), kSteps,
                same ? "bit-identical to the uninterrupted run" : "DIFFERENT from the uninterrupted run");
    std::remove(path.c_str());
    return same ? 0 : 1;
}
