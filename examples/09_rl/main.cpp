// examples/09_rl: FP8 reinforcement learning end to end. The small transformer the training
// program (examples/08_training) trains, the examples' shared model (examples/common/model.hpp),
// is pretrained on the shipped corpus, then trained by GRPO on a task with a checkable reward (a
// lipogram: continue a prompt without the letter e), with rollouts from a low-precision copy of
// the policy, as full-pipeline FP8 RL does. Variants, side by side, several seeds each (grpo.hpp):
//   float_rollout   rollouts from a float32 copy: the mismatch-free baseline
//   fp8_nominal     FP8 rollouts (FP8 linears, E4M3 Q/K/V and KV cache), nominal clip bounds
//   fp8_calibrated  FP8 rollouts, clip bounds from octet::calibrated_clipping
//   fp8_tis         FP8 rollouts, ratio against the trainer's log-probabilities, mismatch
//                   corrected by truncated importance weights
// Reported per step and run: reward, entropy, the rollout/trainer log-ratio distribution, clip
// fractions by advantage sign (with and without the mismatch), rounding-caused threshold
// crossings, rollout and update tokens/s, calibration cost, monitor trips and recoveries with
// their cost. Outputs: report.md, report.json (report_schema.md), SVG plots; a progress bar.
//
// Run:  example_09_rl                       (the default: a few minutes on 2 cores)
//       example_09_rl --help
// Exit status: 0 on a completed comparison; 1 on an error; 2 on bad flags.
#include "common/corpus.hpp"
#include "common/model.hpp"
#include "common/model_file.hpp"
#include "common/progress.hpp"
#include "common/report_text.hpp"
#include "grpo.hpp"
#include "records.hpp"
#include "report.hpp"

#include <octet/octet.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifndef OCTET_TRAINING_CORPUS
#define OCTET_TRAINING_CORPUS "data/kjv_genesis_exodus.txt"
#endif

namespace rl {
namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct flags {
    std::vector<std::string> variants{"float_rollout", "fp8_nominal", "fp8_calibrated", "fp8_tis"};
    std::vector<int> seeds{0, 1, 2};
    int steps = 30, pretrain_steps = 300, threads = 0, prompts = 8, group = 8, completion = 24, epochs = 2;
    float lr = 2e-4f, clip_eps = 0.2f, clip_eps_high = 0.28f;
    std::string rollout_linear = "fp8_blockwise", trainer_linear = "fp32", out = "rl_report",
                corpus = OCTET_TRAINING_CORPUS, init;
    std::string save_state, resume;  // test hooks: save after --steps, or resume from a state file
    bool faults = true, help = false;
};

const char* usage =
    "usage: example_09_rl [--variants a,b,...] [--seeds 0,1,2] [--steps N] [--pretrain-steps N]\n"
    "                     [--prompts B] [--group G] [--completion C] [--epochs E] [--lr X]\n"
    "                     [--clip-eps X] [--clip-eps-high X] [--rollout-linear RECIPE]\n"
    "                     [--trainer-linear RECIPE] [--threads N]\n"
    "                     [--no-faults] [--init FILE] [--out FOLDER] [--corpus FILE]\n"
    "  --variants        any of: float_rollout fp8_nominal fp8_calibrated fp8_tis (default: all)\n"
    "  --steps           GRPO steps per run (default 30)\n"
    "  --pretrain-steps  float32 pretraining steps of the starting policy (default 300); it is\n"
    "                    written to FOLDER/policy_init.bin\n"
    "  --init FILE       start from a model file instead: FOLDER/policy_init.bin of an earlier run, or\n"
    "                    the main job's weights (example_08_training --sizes tiny --save-models writes\n"
    "                    FOLDER/models/tiny_RECIPE_STEPS_seedN.bin)\n"
    "  --rollout-linear  the FP8 copy's linear recipe: fp8_tensorwise fp8_blockwise (default) mxfp8\n"
    "                    nvfp4 (FP4 rollouts)\n"
    "  --trainer-linear  the trainer's linears: fp32 (default) bf16 fp8_delayed fp8_tensorwise\n"
    "                    fp8_blockwise mxfp8 nvfp4\n"
    "  --no-faults       no scripted bad update (by default one run per variant, seed 0, gets one)\n"
    "  --save-state F / --resume F   write the run's state after --steps / continue from it (one\n"
    "                    variant and seed; used by the tests)\n";

int to_int(const std::string& flag, const std::string& v) {
    char* end = nullptr;
    const long x = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end || x < 0 || x > 1000000) throw std::invalid_argument(flag + ": '" + v + "' is not a count");
    return static_cast<int>(x);
}
float to_float(const std::string& flag, const std::string& v) {
    char* end = nullptr;
    const float x = std::strtof(v.c_str(), &end);
    if (v.empty() || *end || !(x > 0) || !std::isfinite(x))
        throw std::invalid_argument(flag + ": '" + v + "' is not a positive number");
    return x;
}

/// The linear recipes by the training program's recipe names.
const std::pair<const char*, common::linear_mode> linear_names[] = {
    {"fp32", common::linear_mode::float32},
    {"bf16", common::linear_mode::bf16},
    {"fp8_delayed", common::linear_mode::tensorwise_delayed},
    {"fp8_tensorwise", common::linear_mode::tensorwise},
    {"fp8_blockwise", common::linear_mode::blockwise},
    {"mxfp8", common::linear_mode::mxfp8},
    {"nvfp4", common::linear_mode::nvfp4}};
bool linear_named(const std::string& name) {
    for (const auto& [n, m] : linear_names)
        if (name == n) return true;
    return false;
}
common::linear_mode linear_of(const std::string& name) {
    for (const auto& [n, m] : linear_names)
        if (name == n) return m;
    return common::linear_mode::float32;
}

flags parse(int argc, char** argv) {
    flags f;
    auto need = [&](int& i) -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(std::string(argv[i]) + " needs a value");
        return argv[++i];
    };
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            f.help = true;
        } else if (a == "--variants") {
            f.variants = common::split(need(i));
            for (const auto& v : f.variants)
                if (!is_variant(v)) throw std::invalid_argument("--variants: unknown variant '" + v + "'");
            if (f.variants.empty()) throw std::invalid_argument("--variants: name at least one");
        } else if (a == "--seeds") {
            f.seeds.clear();
            for (const auto& s : common::split(need(i))) f.seeds.push_back(to_int(a, s));
            if (f.seeds.empty()) throw std::invalid_argument("--seeds: name at least one");
        } else if (a == "--steps") {
            f.steps = to_int(a, need(i));
        } else if (a == "--pretrain-steps") {
            f.pretrain_steps = to_int(a, need(i));
        } else if (a == "--prompts") {
            f.prompts = to_int(a, need(i));
        } else if (a == "--group") {
            f.group = to_int(a, need(i));
        } else if (a == "--completion") {
            f.completion = to_int(a, need(i));
        } else if (a == "--epochs") {
            f.epochs = to_int(a, need(i));
        } else if (a == "--threads") {
            f.threads = to_int(a, need(i));
        } else if (a == "--lr") {
            f.lr = to_float(a, need(i));
        } else if (a == "--clip-eps") {
            f.clip_eps = to_float(a, need(i));
        } else if (a == "--clip-eps-high") {
            f.clip_eps_high = to_float(a, need(i));
        } else if (a == "--rollout-linear") {
            f.rollout_linear = need(i);
            // fp8_delayed is not offered: an inference copy pushes no amaxes, so its history stays
            // empty and it would quantize exactly as fp8_tensorwise
            if (!linear_named(f.rollout_linear) || f.rollout_linear == "fp32" || f.rollout_linear == "bf16" ||
                f.rollout_linear == "fp8_delayed")
                throw std::invalid_argument("--rollout-linear: '" + f.rollout_linear +
                                            "' (use fp8_tensorwise, fp8_blockwise, mxfp8 or nvfp4)");
        } else if (a == "--trainer-linear") {
            f.trainer_linear = need(i);
            if (!linear_named(f.trainer_linear))
                throw std::invalid_argument("--trainer-linear: '" + f.trainer_linear +
                                            "' (use fp32, bf16, fp8_delayed, fp8_tensorwise, fp8_blockwise, mxfp8 "
                                            "or nvfp4)");
        } else if (a == "--no-faults") {
            f.faults = false;
        } else if (a == "--init") {
            f.init = need(i);
        } else if (a == "--out") {
            f.out = need(i);
        } else if (a == "--corpus") {
            f.corpus = need(i);
        } else if (a == "--save-state") {
            f.save_state = need(i);
        } else if (a == "--resume") {
            f.resume = need(i);
        } else {
            throw std::invalid_argument("unknown flag " + a);
        }
    }
    if (f.steps < 1) throw std::invalid_argument("--steps must be at least 1");
    if (f.prompts < 1 || f.group < 2) throw std::invalid_argument("--prompts must be >= 1 and --group >= 2");
    if (f.epochs < 1) throw std::invalid_argument("--epochs must be at least 1");
    if (f.clip_eps >= 1) throw std::invalid_argument("--clip-eps must be below 1");
    if ((!f.save_state.empty() || !f.resume.empty()) && (f.variants.size() != 1 || f.seeds.size() != 1))
        throw std::invalid_argument("--save-state and --resume take one variant and one seed");
    return f;
}

/// The policy: the shared model's "tiny" size (examples/common/config.hpp).
common::model_config policy_config(int vocab) {
    common::model_config m = common::size_config("tiny");
    m.vocab = vocab;
    return m;
}

// ---- the starting policy -----------------------------------------------------------------------

struct pretrained {
    std::vector<float> params;
    double seconds = 0, heldout_loss = not_measured;
    std::string source;
};

double heldout_loss(common::transformer& m, const common::corpus& data, octet::span<const float> p, int seq_len) {
    const int batch = 16;
    std::vector<std::int32_t> toks(static_cast<std::size_t>(batch) * (seq_len + 1));
    common::sample_batch(data.heldout, seq_len, batch, 77, 0, 0, toks.data());
    return m.evaluate(p, toks.data(), batch);
}

/// Float32 next-character training of the policy (AdamW, warmup and cosine decay).
pretrained pretrain(const common::model_config& mc, const common::corpus& data, int steps, octet::host_executor ex,
                    const std::function<void(int)>& advanced) {
    pretrained out;
    const auto t0 = clock_type::now();
    common::memory_meter meter;
    common::recipe_config r;
    r.name = "fp32";
    const int batch = 16;
    common::transformer m(mc, r, meter, ex, batch, 0);
    out.params.resize(common::transformer::parameter_count(mc));
    common::transformer::init_parameters(mc, 0, octet::span<float>(out.params));
    octet::adamw_hyper h;
    h.weight_decay = 0.01f;
    octet::adamw_optimizer<octet::state_codec::fp32> opt(out.params.size(), h);
    opt.state.set_params(octet::span<const float>(out.params));
    std::vector<float> grads(out.params.size());
    std::vector<std::int32_t> toks(static_cast<std::size_t>(batch) * (mc.seq_len + 1));
    for (int s = 0; s < steps; ++s) {
        common::sample_batch(data.train, mc.seq_len, batch, 31, s, 0, toks.data());
        m.forward_backward(octet::span<const float>(opt.state.params), toks.data(), batch, octet::span<float>(grads));
        double g2 = 0;
        for (float g : grads) g2 += static_cast<double>(g) * g;
        const double norm = std::sqrt(g2);
        if (norm > 1.0)
            for (auto& g : grads) g *= static_cast<float>(1.0 / norm);
        const double warm = std::min(1.0, (s + 1) / 30.0);
        const double lr = 3e-3 * warm * (0.1 + 0.45 * (1.0 + std::cos(3.141592653589793 * s / steps)));
        opt.step(ex, octet::span<const float>(grads), static_cast<float>(lr));
        if (advanced) advanced(s);
    }
    out.params.assign(opt.state.params.begin(), opt.state.params.end());
    out.seconds = seconds_since(t0);
    out.heldout_loss = heldout_loss(m, data, octet::span<const float>(out.params), mc.seq_len);
    out.source = "pretrained here: " + std::to_string(steps) + " float32 steps of 16 x " + std::to_string(mc.seq_len) +
                 " characters";
    return out;
}

// ---- findings ------------------------------------------------------------------------------------

struct variant_mean {
    double reward = 0, reward_lo = INFINITY, reward_hi = -INFINITY, absd = 0, clip_neg = 0, clip_pos = 0;
    double crossings = 0, cal_seconds = 0, cal_forward = 0, clip_neg_high = 0, clip_pos_high = 0;
    int runs = 0;
};

std::map<std::string, variant_mean> by_variant(const sweep_result& s) {
    std::map<std::string, variant_mean> m;
    for (const auto& r : s.runs) {
        auto& v = m[r.variant];
        v.reward += r.final_reward, v.absd += r.mean_abs_log_ratio;
        v.reward_lo = std::min(v.reward_lo, r.final_reward), v.reward_hi = std::max(v.reward_hi, r.final_reward);
        v.clip_neg += r.clip_fraction_negative, v.clip_pos += r.clip_fraction_positive;
        v.crossings += static_cast<double>(r.crossings_negative_pushed_below);
        v.cal_seconds += r.calibration_seconds, v.cal_forward += r.calibration_forward_seconds;
        double hn = 0, hp = 0;
        for (const auto& st : r.steps) hn += st.clip_fraction_negative_high, hp += st.clip_fraction_positive_high;
        if (!r.steps.empty()) {
            v.clip_neg_high += hn / static_cast<double>(r.steps.size());
            v.clip_pos_high += hp / static_cast<double>(r.steps.size());
        }
        v.runs += 1;
    }
    for (auto& [name, v] : m) {
        const double n = v.runs;
        v.reward /= n, v.absd /= n, v.clip_neg /= n, v.clip_pos /= n, v.crossings /= n, v.cal_seconds /= n;
        v.cal_forward /= n, v.clip_neg_high /= n, v.clip_pos_high /= n;
    }
    return m;
}

std::string fmt(const char* f, double v) {
    char b[64];
    std::snprintf(b, sizeof b, f, v);
    return b;
}

/// What differs between the variants, each line computed from the runs.
std::vector<std::string> findings(const sweep_result& s) {
    std::vector<std::string> out;
    const auto m = by_variant(s);
    auto has = [&](const char* v) { return m.count(v) != 0; };
    if (has("float_rollout") && has("fp8_nominal")) {
        const auto &f = m.at("float_rollout"), &q = m.at("fp8_nominal");
        out.push_back("Mismatch: mean |logp_trainer - logp_rollout| per completion token is " + fmt("%.3g", q.absd) +
                      " nats with FP8 rollouts against " + fmt("%.3g", f.absd) + " with float32 rollouts.");
        out.push_back(
            "Clipping under the nominal bounds: negative-advantage tokens clipped below " + fmt("%.4f", q.clip_neg) +
            " with FP8 rollouts (" + fmt("%.4f", q.clip_neg_high) +
            " of the same tokens with the mismatch-free ratio; float_rollout " + fmt("%.4f", f.clip_neg) +
            "); positive-advantage tokens clipped above " + fmt("%.4f", q.clip_pos) + " (" +
            fmt("%.4f", q.clip_pos_high) + "; float_rollout " + fmt("%.4f", f.clip_pos) + "). Rounding " + "pushed " +
            fmt("%.1f", q.crossings) + " negative-advantage tokens per run below the lower " +
            "bound that the mismatch-free ratio kept inside, cutting their penalty gradient (float_rollout: " +
            fmt("%.1f", f.crossings) + ").");
    }
    if (has("fp8_calibrated")) {
        const auto& c = m.at("fp8_calibrated");
        out.push_back("Calibrated clipping: clipped below " + fmt("%.4f", c.clip_neg) + " (mismatch-free " +
                      fmt("%.4f", c.clip_neg_high) + "), above " + fmt("%.4f", c.clip_pos) + " (" +
                      fmt("%.4f", c.clip_pos_high) +
                      "): it moves the fractions toward the mismatch-free ones, but "
                      "it matches how many tokens are clipped, not which: " +
                      fmt("%.1f", c.crossings) +
                      " negative-advantage tokens per run are still below its bound and inside without the "
                      "mismatch. Its cost: " +
                      fmt("%.4f", c.cal_seconds) + " s per run in the calibrator, plus " + fmt("%.2f", c.cal_forward) +
                      " s of reference forwards (the trainer's first-epoch scoring, "
                      "which every variant runs).");
    }
    if (has("fp8_tis")) {
        const auto& t = m.at("fp8_tis");
        out.push_back(
            "Truncated importance sampling (ratio against the trainer's log-probabilities, the mismatch "
            "as a capped weight): clipped below " +
            fmt("%.4f", t.clip_neg) + ", above " + fmt("%.4f", t.clip_pos) + ", " + fmt("%.1f", t.crossings) +
            " tokens pushed below per run: the mismatch no longer reaches the "
            "clip.");
    }
    // the outcome: do the final rewards separate beyond the spread over seeds?
    std::string line = "Outcome (final reward, mean over the last quarter of the steps; mean and min..max over seeds):";
    for (const auto& [name, v] : m)
        line += " " + name + " " + fmt("%.2f", v.reward) + " [" + fmt("%.2f", v.reward_lo) + ", " +
                fmt("%.2f", v.reward_hi) + "];";
    out.push_back(line);
    if (has("float_rollout")) {
        const auto& f = m.at("float_rollout");
        bool separated = false;
        for (const auto& [name, v] : m)
            if (name != "float_rollout" && (v.reward_hi < f.reward_lo || v.reward_lo > f.reward_hi)) separated = true;
        out.push_back(separated ? "At least one FP8 variant's final reward lies outside float_rollout's seed range."
                                : "The training outcome does not separate at this scale: every FP8 variant's final "
                                  "reward range overlaps float_rollout's. What differs is the mismatch and the "
                                  "clipping above.");
    }
    return out;
}

int program(int argc, char** argv) {
    flags f;
    try {
        f = parse(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "example_09_rl: %s\n%s", e.what(), usage);
        return 2;
    }
    if (f.help) {
        std::printf("%s", usage);
        return 0;
    }
    const auto t_all = clock_type::now();
    const int threads = f.threads > 0 ? f.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const octet::host_executor ex = octet::on_host(threads);
    const common::corpus data = common::load_corpus(f.corpus);
    const common::model_config mc = policy_config(static_cast<int>(data.alphabet.size()));
    if (f.completion >= mc.seq_len) throw std::invalid_argument("--completion must be below seq_len = 64");
    std::filesystem::create_directories(f.out);

    sweep_result sweep;
    for (int i = 0; i < argc; ++i) sweep.command += (i ? " " : "") + std::string(argv[i]);
    sweep.machine = common::report_kit::machine_description(threads);
    sweep.task = lipogram_task::description(f.completion);
    sweep.prompt_chars = mc.seq_len + 1 - f.completion, sweep.completion_chars = f.completion;
    sweep.prompts_per_step = f.prompts, sweep.group_size = f.group, sweep.epochs = f.epochs, sweep.steps = f.steps;
    sweep.clip_eps_low = f.clip_eps, sweep.clip_eps_high = f.clip_eps_high;
    sweep.rollout_recipe = f.rollout_linear + " linears, E4M3 Q/K/V and KV cache (per token and head)";
    sweep.trainer_recipe = f.trainer_linear + " linears, float32 attention and the rest";
    sweep.parameters = static_cast<double>(common::transformer::parameter_count(mc));

    const double pre_units = f.init.empty() ? 0.25 * f.pretrain_steps : 0.0;
    const double per_run = f.steps;
    common::progress bar(pre_units + per_run * static_cast<double>(f.variants.size() * f.seeds.size()) + 1e-9, stderr);
    pretrained init;
    if (f.init.empty()) {
        init = pretrain(mc, data, f.pretrain_steps, ex, [&](int s) {
            bar.advance(0.25, "pretraining: step " + std::to_string(s + 1) + "/" + std::to_string(f.pretrain_steps));
        });
        common::write_model_file(f.out + "/policy_init.bin", mc, init.params);
    } else {
        init.params = common::read_model_file(f.init, mc);
        init.source = "read from " + f.init;
        common::memory_meter meter;
        common::recipe_config r;
        common::transformer m(mc, r, meter, ex, 16, 0);
        init.heldout_loss = heldout_loss(m, data, octet::span<const float>(init.params), mc.seq_len);
    }
    std::printf("starting policy: %s (held-out loss %.4f nats/char)\n", init.source.c_str(), init.heldout_loss);
    sweep.pretrain_source = init.source, sweep.pretrain_seconds = init.seconds;
    sweep.pretrain_heldout_loss = init.heldout_loss;
    sweep.tis_cap = grpo_config{}.tis_cap;

    for (const auto& variant : f.variants)
        for (int seed : f.seeds) {
            grpo_config c;
            c.variant = variant, c.seed = seed, c.steps = f.steps, c.prompts = f.prompts, c.group = f.group;
            c.completion = f.completion, c.epochs = f.epochs, c.lr = f.lr;
            c.clip_eps_low = f.clip_eps, c.clip_eps_high = f.clip_eps_high;
            c.rollout_linear = linear_of(f.rollout_linear), c.trainer_linear = linear_of(f.trainer_linear);
            c.threads = threads;
            c.fault_step = f.faults && seed == f.seeds.front() ? f.steps / 2 : -1;
            grpo_run run(c, mc, data, octet::span<const float>(init.params));
            if (!f.resume.empty()) run.load(f.resume);
            const int until = f.resume.empty() ? f.steps : run.next_step() + f.steps;
            run.run(until, [&](const step_record& r) {
                bar.advance(1.0, variant + " seed " + std::to_string(seed) + ": step " + std::to_string(r.step + 1) +
                                     ", reward " + fmt("%.2f", r.reward_mean));
            });
            if (!f.save_state.empty()) run.save(f.save_state);
            run.summarize();
            run_result res = run.result();
            res.sample = run.sample(1000 + 97 * seed);
            sweep.runs.push_back(std::move(res));
        }
    bar.finish();
    sweep.findings = findings(sweep);
    sweep.wall_seconds = seconds_since(t_all);
    write_report(sweep, f.out);
    std::printf("\n");
    for (const auto& l : sweep.findings) std::printf("- %s\n", l.c_str());
    std::printf("\nreport: %s/report.md (and report.json, reward.svg, entropy.svg, clipping.svg, mismatch.svg)\n",
                f.out.c_str());
    std::printf("wall time: %.1f s\n", sweep.wall_seconds);
    return 0;
}

}  // namespace
}  // namespace rl

int main(int argc, char** argv) {
    try {
        return rl::program(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "example_09_rl: %s\n", e.what());
        return 1;
    }
}
