// Convergence on a generated problem: every state codec with every usable master-weight policy
// reaches float AdamW's final loss within a stated margin, over several seeds; bf16 master weights
// with plain rounding stall where stochastic rounding and Kahan compensation do not.
//
// The problem: least squares, 256 parameters, 512 samples. Feature columns are scaled by
// 10^U(-1, 1) (gradient magnitudes, and so second moments, span four decades); the true weights
// have magnitudes in [1, 2) with random signs and the start is w* + N(0, 0.05^2), so every weight
// sits where a bf16 ulp is 2^-8 or 2^-7. Targets carry N(0, 0.1^2) noise. AdamW (betas 0.9, 0.999,
// no weight decay) runs 300 steps with a cosine schedule from lr 2^-10, so every single update is
// smaller than half a bf16 ulp of the weight it changes. The forward pass (the gradient and the
// loss) reads the weights as the model would: floats for fp32 masters, the bf16 values otherwise.
//
// Margins. With fp32 or Kahan master weights a configuration must achieve at least 95% of float
// AdamW's loss reduction on every seed: L_cfg - L_float <= 0.05 (L_0 - L_float). Stochastic
// rounding gets 90%: its final weights sit up to a whole bf16 ulp from where the optimizer put
// them (nearest rounding: half), and the largest feature scales multiply that error by up to 100
// in the loss; over 23 fresh problems it kept 95.7% to 99.8% of the reduction (fp32 codec or
// 8-bit states alike), while every fp32/Kahan configuration kept more than 99%. bf16 with plain
// rounding must be shown to stall: it keeps less than half of float's reduction (measured: none).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "octet/optim/moments.hpp"
#include "octet/optim/optimizer.hpp"
#include "support/random.hpp"

using namespace octet;

namespace {

constexpr std::size_t kDim = 256, kSamples = 512;
constexpr int kSteps = 300;

struct problem {
    std::vector<float> x;  // (kSamples, kDim) row-major
    std::vector<float> y;
    std::vector<float> w0;
};

problem make_problem(std::uint64_t salt) {
    auto g = octet_test::rng(salt);
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
    p.w0.resize(kDim);
    for (std::size_t j = 0; j < kDim; ++j) p.w0[j] = wstar[j] + 0.05f * normal(g);
    return p;
}

/// Loss 0.5 mean (x.w - y)^2 in double, and its gradient in float.
double loss_and_grad(const problem& p, const std::vector<float>& w, std::vector<float>* grad) {
    std::vector<float> r(kSamples);
    double loss = 0;
    for (std::size_t s = 0; s < kSamples; ++s) {
        float t = 0;
        const float* row = &p.x[s * kDim];
        for (std::size_t j = 0; j < kDim; ++j) t += row[j] * w[j];
        r[s] = t - p.y[s];
        loss += 0.5 * static_cast<double>(r[s]) * r[s];
    }
    if (grad) {
        grad->assign(kDim, 0.0f);
        for (std::size_t s = 0; s < kSamples; ++s) {
            const float* row = &p.x[s * kDim];
            const float rs = r[s] / kSamples;
            for (std::size_t j = 0; j < kDim; ++j) (*grad)[j] += rs * row[j];
        }
    }
    return loss / kSamples;
}

/// The weights the forward pass reads.
template <class Opt>
std::vector<float> forward_weights(const Opt& opt) {
    std::vector<float> w(kDim);
    for (std::size_t j = 0; j < kDim; ++j) {
        if constexpr (std::is_same_v<typename Opt::state_type::weight_type, float>)
            w[j] = opt.state.params[j];
        else
            w[j] = to_float(opt.state.params[j]);
    }
    return w;
}

template <class Codec, class Master>
double train(const problem& p, std::uint64_t seed) {
    adamw_hyper h;
    h.weight_decay = 0.0f;
    h.seed = seed;
    adamw_optimizer<Codec, Codec, Master> opt(kDim, h);
    opt.state.set_params(as_cspan(p.w0));
    std::vector<float> grad;
    const double lr0 = std::ldexp(1.0, -10);
    for (int t = 0; t < kSteps; ++t) {
        loss_and_grad(p, forward_weights(opt), &grad);
        const float lr = static_cast<float>(lr0 * 0.5 * (1 + std::cos(3.14159265358979 * t / kSteps)));
        opt.step(on_host(1), as_cspan(grad), lr);
    }
    return loss_and_grad(p, forward_weights(opt), nullptr);
}

struct outcome {
    std::string name;
    double loss;
    double margin;  ///< fraction of float's loss reduction that may be missing
};

template <class Codec>
void run_codec(const problem& p, std::uint64_t seed, const char* name, std::vector<outcome>& out) {
    out.push_back({std::string(name) + " + fp32", train<Codec, master::fp32>(p, seed), 0.05});
    out.push_back({std::string(name) + " + bf16 stochastic", train<Codec, master::bf16_stochastic>(p, seed), 0.10});
    out.push_back({std::string(name) + " + bf16 Kahan", train<Codec, master::bf16_kahan>(p, seed), 0.05});
}

}  // namespace

TEST_CASE("every codec and master-weight choice reaches float AdamW's loss within its margin; bf16 nearest stalls") {
    for (std::uint64_t seed : {101, 202, 303}) {
        const problem p = make_problem(seed);
        const double l0 = loss_and_grad(p, p.w0, nullptr);
        const double lf = train<state_codec::fp32, master::fp32>(p, seed);
        std::vector<outcome> results;
        run_codec<state_codec::bf16>(p, seed, "bf16", results);
        run_codec<state_codec::e4m3_scaled>(p, seed, "e4m3_scaled", results);
        run_codec<state_codec::e4m3_expanded>(p, seed, "e4m3_expanded", results);
        run_codec<state_codec::dynamic8>(p, seed, "dynamic8", results);
        results.push_back({"fp32 + bf16 stochastic", train<state_codec::fp32, master::bf16_stochastic>(p, seed), 0.10});
        results.push_back({"fp32 + bf16 Kahan", train<state_codec::fp32, master::bf16_kahan>(p, seed), 0.05});
        const double l_rn = train<state_codec::fp32, master::bf16_nearest>(p, seed);
        const double l_rn8 = train<state_codec::dynamic8, master::bf16_nearest>(p, seed);

        std::string line =
            "seed " + std::to_string(seed) + ": L0 " + std::to_string(l0) + ", float AdamW " + std::to_string(lf);
        for (const auto& r : results) {
            const double kept = (l0 - r.loss) / (l0 - lf);  // fraction of float's reduction achieved
            line += "; " + r.name + " " + std::to_string(r.loss) + " (" + std::to_string(100 * kept) + "%)";
            INFO("seed " << seed << ", " << r.name << ": loss " << r.loss << ", float " << lf << ", start " << l0);
            CHECK(r.loss - lf <= r.margin * (l0 - lf));
        }
        line += "; bf16 nearest " + std::to_string(l_rn) + " (" + std::to_string(100 * (l0 - l_rn) / (l0 - lf)) + "%)";
        line += "; dynamic8 + bf16 nearest " + std::to_string(l_rn8);
        MESSAGE(line);
        CHECK(lf < 0.05 * l0);               // the problem is solved by float AdamW
        CHECK(l0 - l_rn < 0.5 * (l0 - lf));  // plain rounding stalls
        CHECK(l0 - l_rn8 < 0.5 * (l0 - lf));
    }
}

namespace {

/// The second moment's drift: every element starts at v = 1 and sees g^2 = 1.5 for `steps` steps
/// (beta2 0.999, lr 0, first moment in float). Returns the mean of decoded v over the elements.
template <class VCodec>
double drifted_v(std::size_t n, int steps, std::uint64_t seed) {
    adamw_hyper h;
    h.seed = seed;
    adamw_state<state_codec::fp32, VCodec, master::fp32> st(n);
    encode_moments<VCodec, moment::second>(on_host(), as_cspan(std::vector<float>(n, 1.0f)), as_span(st.v_codes),
                                           as_span(st.v_meta));
    const std::vector<float> g(n, std::sqrt(1.5f));
    for (int t = 1; t <= steps; ++t)
        adamw_step(on_host(), st.ref(), as_cspan(g), h, static_cast<std::uint64_t>(t), 0.0f);
    std::vector<float> v(n);
    decode_moments<VCodec, moment::second>(on_host(), as_cspan(st.v_codes), as_cspan(st.v_meta), as_span(v));
    double sum = 0;
    for (float x : v) sum += x;
    return sum / static_cast<double>(n);
}

/// Least squares from w = 0 with a constant learning rate for `steps` steps; float moments except
/// the second moment's codec; returns the final loss. Gradients shrink as the fit converges, so v
/// must decay by 0.1% a step: less than half a bf16 ulp.
template <class VCodec>
double train_v(const problem& p, std::uint64_t seed, int steps, float lr) {
    adamw_hyper h;
    h.weight_decay = 0.0f;
    h.seed = seed;
    adamw_optimizer<state_codec::fp32, VCodec, master::fp32> opt(kDim, h);
    opt.state.set_params(as_cspan(std::vector<float>(kDim, 0.0f)));
    std::vector<float> grad;
    for (int t = 0; t < steps; ++t) {
        loss_and_grad(p, forward_weights(opt), &grad);
        opt.step(on_host(1), as_cspan(grad), lr);
    }
    return loss_and_grad(p, forward_weights(opt), nullptr);
}

}  // namespace

TEST_CASE("bf16 second moments: nearest rounding stalls a slow drift of v, stochastic rounding follows it") {
    const std::size_t n = 4096;
    const int steps = 3000;
    const double v_float = 1.5 - 0.5 * std::pow(0.999, steps);  // the float64 EMA
    const std::uint64_t seed = octet_test::rng(0xD41F7)();
    const double nearest = drifted_v<state_codec::bf16>(n, steps, seed);
    const double stochastic = drifted_v<state_codec::bf16_stochastic>(n, steps, seed);
    const double fp32 = drifted_v<state_codec::fp32>(n, steps, seed);
    const double f_nearest = (nearest - 1.0) / (v_float - 1.0), f_stochastic = (stochastic - 1.0) / (v_float - 1.0);
    MESSAGE("v from 1.0 toward 1.5, beta2 0.999, "
            << steps << " steps: float64 " << v_float << ", fp32 " << fp32 << ", bf16 nearest " << nearest << " ("
            << 100 * f_nearest << "% realised), bf16_stochastic " << stochastic << " (" << 100 * f_stochastic
            << "% realised)");
    CHECK(std::abs(fp32 - v_float) < 1e-4);
    CHECK(f_nearest < 0.01);                     // the drift is lost: every update is below half an ulp
    CHECK(std::abs(f_stochastic - 1.0) < 0.02);  // unbiased: realised in expectation (mean of 4096 elements)
}

TEST_CASE("bf16 second moments on a convex problem: final loss against float") {
    const int steps = 2000;
    const float lr = 1.0f / 256;
    double worst_nearest = 1e300, worst_stochastic = 0;
    for (std::uint64_t salt : {404, 505, 606}) {
        const problem p = make_problem(salt);
        const std::uint64_t seed = octet_test::rng(salt + 1)();
        const double lf = train_v<state_codec::fp32>(p, seed, steps, lr);
        const double ln = train_v<state_codec::bf16>(p, seed, steps, lr);
        const double ls = train_v<state_codec::bf16_stochastic>(p, seed, steps, lr);
        MESSAGE("problem " << salt << ", " << steps << " steps at lr 2^-8 from w = 0: float v " << lf
                           << ", bf16 nearest v " << ln << " (" << ln / lf << "x), bf16_stochastic v " << ls << " ("
                           << ls / lf << "x)");
        worst_nearest = std::min(worst_nearest, ln / lf);
        worst_stochastic = std::max(worst_stochastic, ls / lf);
    }
    CHECK(worst_nearest > 1.1);      // nearest pays on every problem
    CHECK(worst_stochastic < 1.05);  // stochastic stays within 5% of float on every problem
}
