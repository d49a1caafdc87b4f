// Example 07: RL clipping under quantization noise, calibrated clipping, and the recovery log.
//
// A small but real GRPO run: a linear "LM head" (vocabulary 32, hidden 64) learns to pick the
// token a fixed teacher prefers; each step samples 8 completions for each of 1024 prompts from
// the behaviour policy (the weights one update behind, as in asynchronous RL), computes group
// advantages, and takes one clipped-surrogate step (clip-higher range [0.8, 1.28]).
//
// The trainer's log-probabilities come from a low-precision LM head: weights in E4M3 with a
// scale per row (octet::encode / octet::decode), activations in bf16, log-probabilities stored in
// bf16. The same tokens are also scored in high precision (double), so every step shows:
//   * threshold crossings: tokens whose clip branch differs between the two, by advantage sign,
//     and the fraction of negative-advantage tokens pushed outside the region;
//   * the lower-bound clip fraction of negative-advantage tokens at high precision (the
//     reference), at low precision under the nominal bounds, and under calibrated bounds
//     (quantile matching against a high-precision reference refreshed every 10 steps).
// Part 3 runs the same loop with monitors and the recovery policy, and a scripted failure:
// a transient NaN (repeat the step), an activation outlier (raise the LM head's precision for
// 3 steps), and a corrupted optimizer state that survives a repeat (reload the last checkpoint).
// It prints the recovery log and the run report.
//
// Build and run: cmake --build build/default --target example_07_rl_clipping &&
//                build/default/examples/example_07_rl_clipping
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "octet/monitor/checks.hpp"
#include "octet/monitor/memory_ledger.hpp"
#include "octet/monitor/recovery.hpp"
#include "octet/monitor/run_report.hpp"
#include "octet/monitor/signals.hpp"
#include "octet/octet.hpp"
#include "octet/rl/calibration.hpp"
#include "octet/rl/crossings.hpp"
#include "octet/rl/surrogate.hpp"

namespace {

constexpr int V = 32, H = 64, P = 1024, G = 8, N = P * G;  // vocabulary, hidden, prompts, group, tokens
constexpr float lr = 1.0f, momentum = 0.9f;
const octet::clip_range nominal = octet::clip_range::asymmetric(0.2f, 0.28f);

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Normal variates from Philox (Box-Muller): reproducible from (seed, offset, index).
float philox_normal(const octet::philox_stream& r, std::uint64_t i) {
    const float u1 = r.uniform(2 * i) + 1.0f / 16777216.0f, u2 = r.uniform(2 * i + 1);
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
}

struct model {
    std::vector<float> w, w_behaviour, m;  // (V, H) row-major each
    std::int64_t completed = -1;
};

struct batch {
    std::vector<float> h;            // (P, H) prompt hidden states
    std::vector<int> y;              // (N) sampled tokens, completion g of prompt p at p * G + g
    std::vector<float> reward, adv;  // (N)
    std::vector<float> logp_old;     // (N) behaviour policy, high precision
};

/// log-softmax of W h for every prompt, in double ("high precision"), as (P, V) floats.
std::vector<float> log_softmax_high(const std::vector<float>& w, const std::vector<float>& h) {
    std::vector<float> out(static_cast<std::size_t>(P) * V);
    for (int p = 0; p < P; ++p) {
        double logits[V], mx = -1e300, z = 0;
        for (int v = 0; v < V; ++v) {
            double s = 0;
            for (int k = 0; k < H; ++k) s += static_cast<double>(w[v * H + k]) * h[p * H + k];
            logits[v] = s;
            mx = std::max(mx, s);
        }
        for (int v = 0; v < V; ++v) z += std::exp(logits[v] - mx);
        for (int v = 0; v < V; ++v) out[p * V + v] = static_cast<float>(logits[v] - mx - std::log(z));
    }
    return out;
}

/// The low-precision LM head: weights E4M3 with one scale per row (amax -> 448), activations
/// bf16, float accumulation and log-softmax, log-probabilities stored in bf16.
std::vector<float> log_softmax_low(const std::vector<float>& w, const std::vector<float>& h) {
    std::vector<float> wq(w.size());
    for (int v = 0; v < V; ++v) {
        float amax = 0;
        for (int k = 0; k < H; ++k) amax = std::max(amax, std::fabs(w[v * H + k]));
        float scale = amax > 0 ? octet::e4m3::max_finite / amax : 1.0f;
        for (int k = 0; k < H; ++k)
            wq[v * H + k] = octet::decode<octet::e4m3>(octet::encode<octet::e4m3>(w[v * H + k] * scale)) / scale;
    }
    std::vector<float> out(static_cast<std::size_t>(P) * V);
    for (int p = 0; p < P; ++p) {
        float logits[V], mx = -INFINITY, z = 0;
        for (int v = 0; v < V; ++v) {
            float s = 0;
            for (int k = 0; k < H; ++k) s += wq[v * H + k] * octet::to_float(octet::to_bf16(h[p * H + k]));
            logits[v] = s;
            mx = std::max(mx, s);
        }
        for (int v = 0; v < V; ++v) z += std::exp(logits[v] - mx);
        const float lz = std::log(z);
        for (int v = 0; v < V; ++v) out[p * V + v] = octet::to_float(octet::to_bf16(logits[v] - mx - lz));
    }
    return out;
}

std::vector<float> gather(const std::vector<float>& logp, const std::vector<int>& y) {
    std::vector<float> out(N);
    for (int t = 0; t < N; ++t) out[t] = logp[(t / G) * V + y[t]];
    return out;
}

/// The task: the teacher's preferred token for a prompt.
struct teacher {
    std::vector<float> t;  // (V, H)
    explicit teacher(std::uint64_t seed) : t(V * H) {
        const octet::philox_stream r{seed, 999};
        for (int i = 0; i < V * H; ++i) t[i] = philox_normal(r, static_cast<std::uint64_t>(i));
    }
    int target(const float* h) const {
        int best = 0;
        double bv = -1e300;
        for (int v = 0; v < V; ++v) {
            double s = 0;
            for (int k = 0; k < H; ++k) s += static_cast<double>(t[v * H + k]) * h[k];
            if (s > bv) bv = s, best = v;
        }
        return best;
    }
};

/// Samples step `step`'s batch from the behaviour policy: a pure function of (seed, step), so a
/// repeated or replayed step sees the same data. `outlier` scales the prompts (a scripted fault).
batch rollout(const model& m, const teacher& tch, std::uint64_t seed, std::int64_t step, float outlier = 1.0f) {
    batch b;
    const octet::philox_stream r{seed, static_cast<std::uint64_t>(step)};
    b.h.resize(static_cast<std::size_t>(P) * H);
    for (int i = 0; i < P * H; ++i) b.h[i] = outlier * philox_normal(r, static_cast<std::uint64_t>(i));
    const std::vector<float> lp = log_softmax_high(m.w_behaviour, b.h);
    b.y.resize(N);
    b.reward.resize(N);
    for (int t = 0; t < N; ++t) {
        const int p = t / G;
        float u = r.uniform(static_cast<std::uint64_t>(P) * H * 2 + t), c = 0;
        int y = V - 1;
        for (int v = 0; v < V; ++v)
            if ((c += std::exp(lp[p * V + v])) > u) {
                y = v;
                break;
            }
        b.y[t] = y;
        b.reward[t] = y == tch.target(&b.h[p * H]) ? 1.0f : 0.0f;
    }
    b.adv.resize(N);
    octet::group_advantages(octet::on_host(), b.reward, G, b.adv);
    b.logp_old = gather(lp, b.y);
    return b;
}

/// One update from per-token loss gradients d loss / d logp: backward through the log-softmax in
/// float (grad of logp_y wrt logits is onehot(y) - softmax), momentum SGD; the behaviour policy
/// moves to the weights before the update.
void update(model& m, const batch& b, const std::vector<float>& logp_all_high, const std::vector<float>& dlogp) {
    std::vector<float> g(V * H, 0.0f);
    for (int t = 0; t < N; ++t) {
        if (dlogp[t] == 0.0f) continue;
        const int p = t / G;
        for (int v = 0; v < V; ++v) {
            const float dlogit = dlogp[t] * ((v == b.y[t] ? 1.0f : 0.0f) - std::exp(logp_all_high[p * V + v]));
            for (int k = 0; k < H; ++k) g[v * H + k] += dlogit * b.h[p * H + k];
        }
    }
    m.w_behaviour = m.w;
    for (int i = 0; i < V * H; ++i) {
        m.m[i] = momentum * m.m[i] + g[i];
        m.w[i] -= lr * m.m[i];
    }
}

model initial_model(const teacher& tch, std::uint64_t seed) {
    model m;
    m.w.resize(V * H);
    m.m.assign(V * H, 0.0f);
    const octet::philox_stream r{seed, 777};
    for (int i = 0; i < V * H; ++i) m.w[i] = 0.03f * tch.t[i] + 0.05f * philox_normal(r, static_cast<std::uint64_t>(i));
    m.w_behaviour = m.w;
    return m;
}

double mean(const std::vector<float>& x) {
    double s = 0;
    for (float v : x) s += v;
    return x.empty() ? 0.0 : s / static_cast<double>(x.size());
}

void smallest_case() {
    const std::vector<float> low{0.799f}, high{0.801f}, adv{-1.0f};
    const octet::clip_range r = octet::clip_range::symmetric(0.2f);
    const octet::crossing_report c = octet::threshold_crossings_from_ratios(octet::on_host(), low, high, adv, r);
    const octet::token_surrogate tl = octet::surrogate_token(0.799f, -1.0f, r),
                                 th = octet::surrogate_token(0.801f, -1.0f, r);
    std::printf("1. The smallest case: ratio 0.799 (low precision) against 0.801 (high) at lower bound 0.8, A = -1\n");
    std::printf(
        "   high: gradient %.3f (penalised)   low: gradient %.3f (clipped)   branch changes: %llu, negative pushed "
        "out: %.0f%%\n\n",
        th.gradient, tl.gradient, static_cast<unsigned long long>(c.branch_changed()),
        100 * c.negative_pushed_out_fraction());
}

}  // namespace

int main() {
    const std::uint64_t seed = 2026;
    const teacher tch(seed);
    smallest_case();

    // ---- 2. diagnostics and calibrated clipping over a run -----------------------------------
    std::printf(
        "2. GRPO run, %d tokens per step; trainer log-probs from an E4M3 LM head (bf16 activations and log-probs)\n",
        N);
    std::printf("   clip range [%.2f, %.2f]; lower-bound clip fraction of negative-advantage tokens:\n\n",
                nominal.lower, nominal.upper);
    std::printf(
        "| step | reward | high (reference) | low, nominal | low, calibrated | calibrated bounds | neg. pushed out "
        "nominal / calibrated | branch changes |\n");
    std::printf("|---|---|---|---|---|---|---|---|\n");
    model m = initial_model(tch, seed);
    // references every 10 steps, or earlier when the low-precision nominal fractions drift by more
    // than 25% (+3 SE) from their values at the reference; light smoothing
    const octet::calibration_config cal_cfg{nominal, /*refresh_every=*/10, /*smoothing=*/0.5, /*drift_tolerance=*/0.25};
    octet::calibrated_clipping cal(cal_cfg);
    const int steps = 40, warmup = 5;
    std::uint64_t neg = 0, below_hi = 0, below_lo = 0, below_cal = 0, pushed_nom = 0, pushed_cal = 0;
    octet::crossing_report last_nom, last_cal;
    octet::clip_range last_bounds;
    double diag_seconds = 0, step_seconds = 0;
    for (int step = 0; step < steps; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        const batch b = rollout(m, tch, seed, step);
        const auto th = std::chrono::steady_clock::now();
        const std::vector<float> all_high = log_softmax_high(m.w, b.h);
        const double high_seconds = seconds_since(th);
        const std::vector<float> logp_high = gather(all_high, b.y), logp_low = gather(log_softmax_low(m.w, b.h), b.y);

        const auto td = std::chrono::steady_clock::now();
        std::vector<float> r_high(N), r_low(N);
        octet::importance_ratios(octet::on_host(), logp_high, b.logp_old, r_high);
        octet::importance_ratios(octet::on_host(), logp_low, b.logp_old, r_low);
        const bool refresh = cal.reference_due(step);
        if (refresh) cal.set_reference(step, r_high, high_seconds);
        const octet::clip_range bounds = cal.update(step, r_low);
        const octet::crossing_report c_nom =
            octet::threshold_crossings(octet::on_host(), logp_low, logp_high, b.logp_old, b.adv, nominal);
        const octet::crossing_report c_cal =
            octet::threshold_crossings(octet::on_host(), logp_low, logp_high, b.logp_old, b.adv, nominal, bounds);
        diag_seconds += seconds_since(td);

        // the update: low-precision log-probabilities, calibrated bounds
        octet::surrogate_config cfg;
        cfg.range = bounds;
        std::vector<float> dlogp(N);
        octet::clipped_surrogate(octet::on_host(), logp_low, b.logp_old, b.adv, cfg, {{}, {}, dlogp});
        update(m, b, all_high, dlogp);
        step_seconds += seconds_since(t0);

        last_nom = c_nom, last_cal = c_cal, last_bounds = bounds;
        const auto& n = c_nom[octet::advantage_sign::negative];
        if (step >= warmup) {
            neg += n.tokens;
            below_hi += n.below_high;
            below_lo += n.below_low;
            below_cal += c_cal[octet::advantage_sign::negative].below_low;
            pushed_nom += n.pushed_out_low + n.pushed_out_high;
            pushed_cal += c_cal[octet::advantage_sign::negative].pushed_out_low +
                          c_cal[octet::advantage_sign::negative].pushed_out_high;
        }
        if (step % 4 == 3 || step == 0)
            std::printf("| %d%s | %.3f | %.4f | %.4f | %.4f | [%.4f, %.4f] | %.4f / %.4f | %llu |\n", step,
                        refresh ? " (ref)" : "", mean(b.reward), c_nom.negative_clip_fraction_high(),
                        c_nom.negative_clip_fraction_low(), c_cal.negative_clip_fraction_low(), bounds.lower,
                        bounds.upper, c_nom.negative_pushed_out_fraction(), c_cal.negative_pushed_out_fraction(),
                        static_cast<unsigned long long>(c_nom.branch_changed()));
    }
    const double p_hi = static_cast<double>(below_hi) / neg, p_lo = static_cast<double>(below_lo) / neg,
                 p_cal = static_cast<double>(below_cal) / neg;
    const double se = octet::binomial_standard_error(p_hi, static_cast<double>(neg));
    std::printf("\n   steps %d..%d, %llu negative-advantage tokens: lower-bound clip fraction\n", warmup, steps - 1,
                static_cast<unsigned long long>(neg));
    std::printf("     high precision (reference)  %.5f\n", p_hi);
    std::printf("     low precision, nominal      %.5f  (%+.1f binomial SE of %.5f)\n", p_lo, (p_lo - p_hi) / se, se);
    std::printf("     low precision, calibrated   %.5f  (%+.1f SE)\n", p_cal, (p_cal - p_hi) / se);
    std::printf("   negative-advantage tokens pushed outside the region: nominal %.4f, calibrated %.4f\n",
                static_cast<double>(pushed_nom) / neg, static_cast<double>(pushed_cal) / neg);
    std::printf("   (calibration restores the fraction, not each token: the remaining crossings go both ways)\n\n");
    std::printf("   Crossings at step %d, low precision against high, nominal bounds for both:\n\n%s\n", steps - 1,
                last_nom.to_markdown().c_str());
    std::printf("   The same tokens with the calibrated bounds [%.4f, %.4f] for the low-precision ratios:\n\n%s\n",
                last_bounds.lower, last_bounds.upper, last_cal.to_markdown().c_str());
    const octet::calibration_cost& cc = cal.cost();
    std::printf(
        "   calibration cost: %llu updates, %.3f ms each; %llu references (%llu early, on drift): %.1f ms of "
        "high-precision\n"
        "   forwards, %.3f ms to measure\n",
        static_cast<unsigned long long>(cc.updates), 1e3 * cc.seconds_per_update(),
        static_cast<unsigned long long>(cc.references), static_cast<unsigned long long>(cal.drift_refreshes()),
        1e3 * cc.reference_forward_seconds, 1e3 * cc.reference_seconds);
    std::printf("   = %.2f%% of the run's step time (diagnostics, both crossing reports: %.2f%%)\n\n",
                100 * cc.total_seconds() / step_seconds, 100 * diag_seconds / step_seconds);

    // ---- 3. monitors, a scripted failure, the recovery log and the run report ----------------
    std::printf(
        "3. The same run with monitors and a scripted failure (transient NaN at step 7, activation outlier at 12,\n");
    std::printf("   corrupted optimizer state at 16 that a repeat does not fix; checkpoints every 5 steps)\n\n");
    model state = initial_model(tch, seed), before, checkpoint = state;
    octet::calibrated_clipping cal2(cal_cfg);
    octet::check_registry reg;
    // bf16 log-probabilities put row sums of exp(logp) within about 0.4% of 1: warn at 0.5%, trip at 2%
    const auto c_rowsum = reg.add("lm_head.softmax_row_sum", octet::check_kind::softmax_row_sum,
                                  octet::threshold::above(5e-3, 2e-2), "lm_head");
    const auto c_drift = reg.add("lm_head.activation_amax_drift", octet::check_kind::amax_drift, "lm_head");
    const auto c_nonfinite = reg.add("rl.non_finite_tokens", octet::check_kind::non_finite, "rl.loss");
    const auto c_cross =
        reg.add("rl.clip_crossings", octet::check_kind::clip_crossings, octet::threshold::above(0.02, 0.1), "lm_head");
    const auto c_state = reg.add("optimizer.state_norm", octet::check_kind::custom, octet::threshold::above(1e2, 1e3));
    octet::memory_ledger ledger;
    ledger.set(octet::memory_category::weights, 2.0 * V * H * sizeof(float));  // weights + behaviour copy
    ledger.set(octet::memory_category::optimizer_state, 1.0 * V * H * sizeof(float));
    ledger.set(octet::memory_category::activations, (P * H + 3.0 * P * V + 6.0 * N) * sizeof(float));
    octet::run_report report;
    bool high_precision_head = false;
    std::vector<float> amax_history;
    std::map<std::int64_t, int> attempts;

    auto run_step = [&](std::int64_t step) {
        const auto t0 = std::chrono::steady_clock::now();
        const int attempt = ++attempts[step];
        const float outlier =
            step == 12 && attempt == 1 ? 8.0f : 1.0f;  // scripted: one batch of activations 8x too large
        const batch b = rollout(state, tch, seed, step, outlier);
        const std::vector<float> all_high = log_softmax_high(state.w, b.h);
        std::vector<float> all_low = high_precision_head ? all_high : log_softmax_low(state.w, b.h);
        std::vector<float> logp = gather(all_low, b.y), logp_high = gather(all_high, b.y);
        if (step == 7 && attempt == 1) logp[123] = NAN;  // scripted transient fault
        // monitors
        reg.measure(c_rowsum, step, [&] {
            std::vector<float> pr(64 * V);
            for (int i = 0; i < 64 * V; ++i) pr[i] = std::exp(all_low[i]);
            return octet::softmax_row_sum_residual(pr, 64, V);
        });
        float amax = 0;
        for (float x : b.h) amax = std::max(amax, std::fabs(x));
        if (!amax_history.empty())
            reg.measure(c_drift, step, [&] { return octet::amax_drift(amax, amax_history); });
        else
            reg.record(c_drift, step, 1.0);
        std::vector<float> r_high(N), r_low(N);
        octet::importance_ratios(octet::on_host(), logp_high, b.logp_old, r_high);
        octet::importance_ratios(octet::on_host(), logp, b.logp_old, r_low);
        if (cal2.reference_due(step)) cal2.set_reference(step, r_high);
        const octet::clip_range bounds = high_precision_head ? nominal : cal2.update(step, r_low);
        reg.measure(c_cross, step, [&] {
            return octet::threshold_crossings(octet::on_host(), logp, logp_high, b.logp_old, b.adv, nominal, bounds)
                .negative_pushed_out_fraction();
        });
        octet::surrogate_config cfg;
        cfg.range = bounds;
        std::vector<float> dlogp(N);
        const octet::surrogate_stats s =
            octet::clipped_surrogate(octet::on_host(), logp, b.logp_old, b.adv, cfg, {{}, {}, dlogp});
        reg.record(c_nonfinite, step, static_cast<double>(s.non_finite));
        update(state, b, all_high, dlogp);
        if (step == 16 && attempt <= 2)
            state.m[5] = 1e6f;  // scripted: a corrupted optimizer state (persists over one repeat)
        reg.measure(c_state, step, [&] {
            double ss = 0;
            for (float x : state.m) ss += static_cast<double>(x) * x;
            return std::sqrt(ss);
        });
        state.completed = step;
        if (reg.latest(c_drift, step)->status ==
            octet::check_status::ok) {  // the delayed-scaling history takes healthy steps only
            amax_history.push_back(amax);
            if (amax_history.size() > 16) amax_history.erase(amax_history.begin());
        }
        report.record_step(step, s.loss(), N, seconds_since(t0));
    };

    octet::recovery_callbacks cb;
    cb.raise_precision = [&](const std::string&, int) {
        high_precision_head = true;
        ledger.allocate(octet::memory_category::temporaries,
                        2.0 * V * H * sizeof(double));  // the double-precision head
        return 2.0 * V * H * sizeof(double);
    };
    cb.restore_precision = [&](const std::string&) {
        high_precision_head = false;
        ledger.release(octet::memory_category::temporaries, 2.0 * V * H * sizeof(double));
    };
    cb.repeat_step = [&](std::int64_t step) {
        state = before;
        run_step(step);
        return 3.0 * V * H * sizeof(float);  // the pre-step snapshot
    };
    cb.reload_checkpoint = [&] {
        state = checkpoint;
        return octet::reload_result{checkpoint.completed, 3.0 * V * H * sizeof(float)};
    };
    octet::recovery_config rcfg;
    rcfg.raise_steps = 3;
    octet::recovery_policy policy(rcfg, cb);

    const auto run_start = std::chrono::steady_clock::now();
    for (std::int64_t step = 0; step < 25;) {
        before = state;
        const auto t0 = std::chrono::steady_clock::now();
        run_step(step);
        const octet::step_outcome o = policy.after_step(step, reg, seconds_since(t0));
        if (o.stop) break;
        if (o.next_step == step + 1 && step % 5 == 4) checkpoint = state;
        step = o.next_step;
    }
    report.set_wall_seconds(seconds_since(run_start));
    std::printf("%s\n", report.to_markdown(reg, policy.log(), ledger).c_str());
    std::printf(
        "(The raised LM head costs no extra time here: on a CPU the simulated E4M3 path is the slower one.)\n\n");
    std::printf("### Run report (JSON)\n\n%s", report.to_json(reg, policy.log(), ledger).c_str());
    return policy.log().gave_up() ? 1 : 0;
}
