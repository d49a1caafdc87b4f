// examples/09_rl/grpo.hpp: one GRPO run of the RL program. Rollouts come from a copy of the
// policy (rollout.hpp: float32, or FP8 with an E4M3 KV cache); the trainer (common::transformer,
// float32 by default, or its linears in bf16 or an FP8 recipe) scores them, and the update uses octet's RL pieces:
// group advantages, the clipped surrogate and its per-token gradient, threshold crossings, calibrated clipping; AdamW
// through octet::adamw_optimizer; monitors through octet::check_registry and octet::recovery_policy.
//
// A step: B prompts from the corpus, G completions of C characters each from the rollout copy
// (its log-probabilities logp_rollout), rewards, advantages A_i = (R_i - mean) / (std + eps) per
// prompt. Then `epochs` updates over the whole batch: the trainer scores the sequences (logp_new;
// the first epoch's scores, at the weights that generated the batch, are logp_trainer), the ratio
// r = exp(logp_new - logp_old) is clipped, and the surrogate's gradient d loss / d logp_new goes
// through the trainer's backward (sequence-mean aggregation: GRPO). logp_old is logp_rollout in
// every variant but fp8_tis, which takes logp_trainer and multiplies each token's gradient by
// min(exp(logp_trainer - logp_rollout), cap).
//
// Calibrated clipping keeps one octet::calibrated_clipping per epoch index: in the first epoch the
// mismatch-free ratios are exactly 1 (logp_new == logp_trainer), in later ones they carry the
// policy's movement, so their clip fractions differ by construction. A reference is the epoch's
// mismatch-free ratios exp(logp_new - logp_trainer); its forward is the first epoch's scoring,
// which every variant runs anyway (reported as calibration_forward_seconds).
//
// Monitors, checked after the rollouts and before any update of the step: the rollout entropy
// against the mean of the previous steps' (a surge, or a collapse), and non-finite
// log-probabilities. A trip reloads the last checkpoint (kept in memory every `checkpoint_every`
// steps) and halves the learning rate for the rest of the run; the steps since are replayed. A
// scripted fault (fault_step) multiplies one update's learning rate by fault_lr_scale, once (a
// replay does not repeat it): a bad update that the next step's rollouts show.
#pragma once

#include "common/corpus.hpp"
#include "common/model.hpp"
#include "records.hpp"
#include "rollout.hpp"

#include <octet/octet.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace rl {

/// The task: continue the prompt with C characters that do not contain the letter e (either
/// case), a lipogram. Reward: minus the number of e's; solved: none.
class lipogram_task {
public:
    explicit lipogram_task(const common::corpus& c) {
        for (std::size_t i = 0; i < c.alphabet.size(); ++i)
            if (c.alphabet[i] == 'e' || c.alphabet[i] == 'E') banned_.push_back(static_cast<std::int32_t>(i));
        OCTET_REQUIRE(!banned_.empty(), "rl::lipogram_task", "corpus", "has no letter e; pass an English corpus");
    }
    int count(const std::int32_t* completion, int C) const {
        int n = 0;
        for (int i = 0; i < C; ++i) n += std::count(banned_.begin(), banned_.end(), completion[i]) > 0;
        return n;
    }
    float reward(const std::int32_t* completion, int C) const { return -static_cast<float>(count(completion, C)); }
    static std::string description(int C) {
        return "continue the prompt with " + std::to_string(C) +
               " characters without the letter e (either case); reward = -(number of e's), solved = none";
    }

private:
    std::vector<std::int32_t> banned_;
};

struct grpo_config {
    std::string variant = "fp8_nominal";  ///< one of variant_names
    int seed = 0, steps = 40;
    int prompts = 8, group = 8;  ///< B prompts, G completions each
    int completion = 24;         ///< C characters; the prompt is seq_len + 1 - C
    int epochs = 2;              ///< updates per batch
    float lr = 3e-4f;
    float clip_eps_low = 0.2f, clip_eps_high = 0.28f;
    float tis_cap = 2.0f;
    float grad_clip = 1.0f;
    common::linear_mode rollout_linear = common::linear_mode::blockwise;
    common::linear_mode trainer_linear = common::linear_mode::float32;  ///< the trainer's linears
    int calibration_refresh = 8;                                        ///< steps between references (per epoch index)
    double calibration_smoothing = 0.5;
    double entropy_surge = 1.25;  ///< trip when the rollout entropy exceeds this times the recent mean,
                                  ///< or falls below the mean divided by it (a collapse)
    int entropy_window = 5;       ///< steps in that mean
    int checkpoint_every = 5;
    int fault_step = -1;  ///< scripted bad update at this step (-1: none)
    float fault_lr_scale = 100.0f;
    int threads = 1;
};

inline bool is_variant(const std::string& v) {
    for (const char* n : variant_names)
        if (v == n) return true;
    return false;
}

/// Mean, standard deviation, |max| and quantiles of the log-ratios.
inline void log_ratio_stats(std::vector<float> d, step_record& r) {
    if (d.empty()) return;
    double s = 0, s2 = 0, amax = 0;
    for (float x : d)
        s += x, s2 += static_cast<double>(x) * x, amax = std::max(amax, std::fabs(static_cast<double>(x)));
    const double n = static_cast<double>(d.size());
    r.log_ratio_mean = s / n;
    r.log_ratio_std = std::sqrt(std::max(0.0, s2 / n - r.log_ratio_mean * r.log_ratio_mean));
    r.log_ratio_abs_max = amax;
    std::sort(d.begin(), d.end());
    auto q = [&](double p) { return static_cast<double>(d[static_cast<std::size_t>(p * (n - 1) + 0.5)]); };
    r.log_ratio_q01 = q(0.01), r.log_ratio_q10 = q(0.10), r.log_ratio_q50 = q(0.5);
    r.log_ratio_q90 = q(0.90), r.log_ratio_q99 = q(0.99);
}

/// A GRPO run: the policy, the optimizer, the calibrators and the step loop.
class grpo_run {
public:
    using optimizer = octet::adamw_optimizer<octet::state_codec::fp32, octet::state_codec::fp32, octet::master::fp32>;

    grpo_run(const grpo_config& cfg, const common::model_config& mc, const common::corpus& data,
             octet::span<const float> init)
        : cfg_(checked(cfg, mc)),
          mc_(mc),
          data_(data),
          task_(data),
          ex_(octet::on_host(cfg.threads)),
          n_(static_cast<std::size_t>(cfg.prompts) * cfg.group),
          P_(mc.seq_len + 1 - cfg.completion),
          C_(cfg.completion),
          T_(static_cast<std::size_t>(mc.seq_len)),
          trainer_(mc, trainer_recipe(cfg), meter_, ex_, static_cast<int>(n_), 0),
          engine_(mc,
                  rollout_config{cfg.variant == "float_rollout" ? rollout_precision::float32 : rollout_precision::fp8,
                                 cfg.rollout_linear},
                  static_cast<int>(n_), ex_),
          opt_(init.size(), hyper(cfg)) {
        OCTET_REQUIRE(init.size() == common::transformer::parameter_count(mc), "rl::grpo_run", "init",
                      "must hold parameter_count(config) floats");
        opt_.state.set_params(init);
        for (int e = 0; e < cfg.epochs; ++e)
            cal_.emplace_back(octet::calibration_config{range(), cfg.calibration_refresh, cfg.calibration_smoothing});
        result_.variant = cfg.variant;
        result_.seed = cfg.seed;
        const std::size_t L = static_cast<std::size_t>(P_ + C_);
        seqs_.resize(n_ * L), logp_roll_.resize(n_ * C_), ent_roll_.resize(n_ * C_);
        rewards_.resize(n_), adv_seq_.resize(n_), adv_.resize(n_ * C_);
        logp_full_.resize(n_ * T_), ent_full_.resize(n_ * T_), dlogp_full_.resize(n_ * T_);
        logp_new_.resize(n_ * C_), logp_trainer_.resize(n_ * C_), logp_old_.resize(n_ * C_), grad_.resize(n_ * C_);
        ratio_low_.resize(n_ * C_), ratio_high_.resize(n_ * C_), grads_.resize(init.size());
        offsets_.resize(n_ + 1);
        trace_.resize(static_cast<std::size_t>(cfg.epochs));
        for (std::size_t s = 0; s <= n_; ++s) offsets_[s] = static_cast<std::int64_t>(s * C_);
        surge_check_ = checks_.add("policy.entropy_surge", octet::check_kind::custom,
                                   octet::threshold::above(0.5 * (1.0 + cfg.entropy_surge), cfg.entropy_surge));
        collapse_check_ =
            checks_.add("policy.entropy_collapse", octet::check_kind::custom,
                        octet::threshold::below(0.5 * (1.0 + 1.0 / cfg.entropy_surge), 1.0 / cfg.entropy_surge));
        nonfinite_check_ = checks_.add("rollout.non_finite", octet::check_kind::non_finite);
    }

    octet::clip_range range() const { return octet::clip_range::asymmetric(cfg_.clip_eps_low, cfg_.clip_eps_high); }
    const run_result& result() const { return result_; }
    octet::span<const float> params() const { return octet::span<const float>(opt_.state.params); }
    int next_step() const { return next_step_; }

    /// The last executed step's per-token data (completion tokens, sequence-major), for tests:
    /// sequences (prompt + completion), the rollout's and the trainer's log-probabilities, the
    /// log-probabilities the ratio was taken against, the advantages, per epoch the trainer's
    /// log-probabilities and the clip range used, and the weights that generated the batch.
    struct epoch_trace {
        std::vector<float> logp_new;
        octet::clip_range used;
    };
    const std::vector<std::int32_t>& last_sequences() const { return seqs_; }
    const std::vector<float>& last_rollout_weights() const { return rollout_weights_; }
    const std::vector<float>& last_logp_rollout() const { return logp_roll_; }
    const std::vector<float>& last_logp_trainer() const { return logp_trainer_; }
    const std::vector<float>& last_logp_old() const { return logp_old_; }
    const std::vector<float>& last_advantages() const { return adv_; }
    const std::vector<epoch_trace>& last_epochs() const { return trace_; }

    /// Runs steps next_step() .. until_step - 1 (a reload replays; `advanced` gets each executed step).
    void run(int until_step, const std::function<void(const step_record&)>& advanced = {}) {
        octet::recovery_config rc;
        rc.ladder = {octet::recovery_action::reload_checkpoint};
        rc.non_finite_ladder = {octet::recovery_action::reload_checkpoint};
        rc.max_reloads = 3;
        octet::recovery_callbacks cb;
        cb.reload_checkpoint = [&] {
            restore(*checkpoint_);
            lr_scale_ *= 0.5f;  // the replay must not take the same path
            result_.restarts += 1;
            return octet::reload_result{checkpoint_->step, static_cast<double>(checkpoint_->bytes())};
        };
        octet::recovery_policy policy(rc, cb);
        if (!checkpoint_) checkpoint_ = snapshot(next_step_ - 1);
        const auto t_run = clock::now();
        std::int64_t step = next_step_;
        std::size_t logged = 0;
        const std::size_t first_recovery = result_.recoveries.size();
        while (step < until_step) {
            const auto t0 = clock::now();
            step_record rec;
            rollouts(static_cast<int>(step), rec);
            const auto o = policy.after_step(step, checks_, seconds_since(t0));
            if (o.stop) break;
            if (o.action == octet::recovery_action::reload_checkpoint) {
                // nothing of this step was applied; the policy reloaded and says where to go on
                for (; logged < policy.log().entries().size(); ++logged) {
                    const auto& e = policy.log().entries()[logged];
                    result_.recoveries.push_back(
                        recovery_record{e.step, octet::recovery_action_name(e.action), e.reason, e.seconds, e.steps});
                }
                drop_records_after(o.next_step - 1);
                step = o.next_step;
                next_step_ = static_cast<int>(step);
                continue;
            }
            update(static_cast<int>(step), rec);
            result_.steps.push_back(rec);
            if (advanced) advanced(rec);
            if ((step + 1) % cfg_.checkpoint_every == 0) checkpoint_ = snapshot(step);
            step = o.next_step;
            next_step_ = static_cast<int>(step);
        }
        // a recovery's cost: the policy adds the replayed steps' time to its log entries
        for (std::size_t i = 0; i < policy.log().entries().size(); ++i)
            result_.recoveries[first_recovery + i].seconds = policy.log().entries()[i].seconds;
        result_.wall_seconds += seconds_since(t_run);
    }

    /// Fills the run's summaries from its step records.
    void summarize() {
        auto& r = result_;
        const auto& S = r.steps;
        if (S.empty()) return;
        const std::size_t from = S.size() - std::max<std::size_t>(1, S.size() / 4);
        double rew = 0, sol = 0, ent = 0, absd = 0, cn = 0, cp = 0, rt = 0, rs = 0, ut = 0, us = 0;
        for (std::size_t i = 0; i < S.size(); ++i) {
            if (i >= from) rew += S[i].reward_mean, sol += S[i].solved_fraction, ent += S[i].entropy_trainer;
            absd += mean_abs_[i];
            cn += S[i].clip_fraction_negative, cp += S[i].clip_fraction_positive;
            rt += S[i].rollout_tokens_per_second * S[i].rollout_seconds, rs += S[i].rollout_seconds;
            ut += S[i].update_tokens_per_second * S[i].update_seconds, us += S[i].update_seconds;
            r.crossings_negative_pushed_below += S[i].crossings_negative_pushed_below;
            r.crossings_branch_changed += S[i].crossings_branch_changed;
            r.monitor_seconds += S[i].monitor_seconds;
        }
        const double k = static_cast<double>(S.size() - from), n = static_cast<double>(S.size());
        r.final_reward = rew / k, r.final_solved_fraction = sol / k, r.final_entropy = ent / k;
        r.mean_abs_log_ratio = absd / n;
        r.clip_fraction_negative = cn / n, r.clip_fraction_positive = cp / n;
        r.rollout_tokens_per_second = rs > 0 ? rt / rs : 0;
        r.update_tokens_per_second = us > 0 ? ut / us : 0;
        std::uint64_t upd = 0, refs = 0;
        double secs = 0, fwd = 0;
        for (const auto& c : cal_) {
            upd += c.cost().updates, refs += c.cost().references;
            secs += c.cost().update_seconds + c.cost().reference_seconds;
            fwd += c.cost().reference_forward_seconds;
        }
        r.calibration_updates = upd, r.calibration_references = refs;
        r.calibration_seconds = secs, r.calibration_forward_seconds = fwd;
    }

    /// One completion of the held-out prompt at `prompt_offset` by the current weights (float32
    /// engine), as "prompt | completion".
    std::string sample(int prompt_offset) {
        rollout_engine eng(mc_, rollout_config{}, 1, ex_);
        std::vector<std::int32_t> prompt(data_.heldout.begin() + prompt_offset,
                                         data_.heldout.begin() + prompt_offset + P_);
        std::vector<std::int32_t> seq(static_cast<std::size_t>(P_ + C_));
        std::vector<float> lp(static_cast<std::size_t>(C_)), en(static_cast<std::size_t>(C_));
        eng.generate(params(), prompt.data(), 1, P_, 1, C_, 4242, 0, seq.data(), lp.data(), en.data());
        return data_.text(std::vector<std::int32_t>(seq.begin(), seq.begin() + P_)) + " | " +
               data_.text(std::vector<std::int32_t>(seq.begin() + P_, seq.end()));
    }

    // ---- checkpoints -------------------------------------------------------------------------
    /// Everything the run continues from: the optimizer (weights, moments, step counter), the
    /// calibrators, the learning-rate scale and the entropy history.
    struct state {
        std::int64_t step = -1;  ///< the last completed step
        optimizer opt{0};
        std::vector<octet::calibration_state> cal;
        float lr_scale = 1;
        std::vector<double> entropy_history;
        std::size_t bytes() const {
            return opt.state.params.size() * 3 * sizeof(float) + entropy_history.size() * sizeof(double) +
                   cal.size() * sizeof(octet::calibration_state);
        }
    };

    /// Writes the state after the last completed step to `path` (the optimizer's octet checkpoint
    /// at path + ".adamw", the rest in path).
    void save(const std::string& path) {
        opt_.save(path + ".adamw");
        std::ofstream f(path, std::ios::binary);
        OCTET_REQUIRE(static_cast<bool>(f), "rl::grpo_run::save", "path", "cannot be written: " + path);
        const std::int64_t head[4] = {0x6f63746574726c31, next_step_, static_cast<std::int64_t>(cal_.size()),
                                      static_cast<std::int64_t>(entropy_history_.size())};
        f.write(reinterpret_cast<const char*>(head), sizeof head);
        f.write(reinterpret_cast<const char*>(&lr_scale_), sizeof lr_scale_);
        for (const auto& c : cal_) {
            const octet::calibration_state s = c.state();
            f.write(reinterpret_cast<const char*>(&s), sizeof s);
        }
        f.write(reinterpret_cast<const char*>(entropy_history_.data()),
                static_cast<std::streamsize>(entropy_history_.size() * sizeof(double)));
        OCTET_REQUIRE(static_cast<bool>(f), "rl::grpo_run::save", "path", "write failed: " + path);
    }
    /// Reads what save() wrote; the run continues with the step after the saved one.
    void load(const std::string& path) {
        constexpr const char* fn = "rl::grpo_run::load";
        std::ifstream f(path, std::ios::binary);
        OCTET_REQUIRE(static_cast<bool>(f), fn, "path", "cannot be read: " + path);
        std::int64_t head[4] = {};
        f.read(reinterpret_cast<char*>(head), sizeof head);
        OCTET_REQUIRE(f && head[0] == 0x6f63746574726c31, fn, "path", "is not an RL state file: " + path);
        OCTET_REQUIRE(head[2] == static_cast<std::int64_t>(cal_.size()) && head[3] >= 0 && head[3] < (1 << 20), fn,
                      "path", "was written by a run with a different number of epochs");
        f.read(reinterpret_cast<char*>(&lr_scale_), sizeof lr_scale_);
        for (auto& c : cal_) {
            octet::calibration_state s;
            f.read(reinterpret_cast<char*>(&s), sizeof s);
            c.restore(s);
        }
        entropy_history_.resize(static_cast<std::size_t>(head[3]));
        f.read(reinterpret_cast<char*>(entropy_history_.data()),
               static_cast<std::streamsize>(entropy_history_.size() * sizeof(double)));
        OCTET_REQUIRE(static_cast<bool>(f), fn, "path", "is truncated: " + path);
        opt_.load(path + ".adamw");
        next_step_ = static_cast<int>(head[1]);
        checkpoint_.reset();
    }

private:
    using clock = std::chrono::steady_clock;
    static double seconds_since(clock::time_point t0) {
        return std::chrono::duration<double>(clock::now() - t0).count();
    }
    static common::recipe_config trainer_recipe(const grpo_config& c) {
        common::recipe_config r;
        r.name = "trainer";
        r.linear = c.trainer_linear;
        return r;
    }
    static octet::adamw_hyper hyper(const grpo_config& c) {
        octet::adamw_hyper h;
        h.weight_decay = 0.0f;
        h.seed = 7000u + static_cast<std::uint64_t>(c.seed);
        return h;
    }
    static const grpo_config& checked(const grpo_config& c, const common::model_config& mc) {
        constexpr const char* fn = "rl::grpo_run";
        OCTET_REQUIRE(is_variant(c.variant), fn, "cfg.variant",
                      "'" + c.variant + "' is not float_rollout, fp8_nominal, fp8_calibrated or fp8_tis");
        OCTET_REQUIRE(c.prompts > 0 && c.group > 1, fn, "cfg.group", "needs prompts >= 1 and group >= 2");
        OCTET_REQUIRE(c.completion > 0 && c.completion < mc.seq_len, fn, "cfg.completion",
                      octet::detail::message("is ", c.completion, "; pass 1 to seq_len - 1 = ", mc.seq_len - 1));
        OCTET_REQUIRE(c.epochs >= 1, fn, "cfg.epochs", "must be at least 1");
        OCTET_REQUIRE(c.checkpoint_every >= 1 && c.entropy_window >= 1, fn, "cfg.checkpoint_every",
                      "and cfg.entropy_window must be at least 1");
        OCTET_REQUIRE(c.lr > 0 && std::isfinite(c.lr), fn, "cfg.lr", "must be a positive number");
        OCTET_REQUIRE(c.tis_cap >= 1, fn, "cfg.tis_cap", "must be at least 1");
        return c;
    }

    state snapshot(std::int64_t step) const {
        state s;
        s.step = step;
        s.opt = opt_;
        for (const auto& c : cal_) s.cal.push_back(c.state());
        s.lr_scale = lr_scale_;
        s.entropy_history = entropy_history_;
        return s;
    }
    void restore(const state& s) {
        opt_ = s.opt;
        for (std::size_t e = 0; e < cal_.size(); ++e) cal_[e].restore(s.cal[e]);
        lr_scale_ = s.lr_scale;
        entropy_history_ = s.entropy_history;
    }
    void drop_records_after(std::int64_t step) {
        while (!result_.steps.empty() && result_.steps.back().step > step) {
            result_.steps.pop_back();
            mean_abs_.pop_back();
        }
    }

    /// Prompts, rollouts, rewards, advantages and the monitors (their samples go to checks_).
    void rollouts(int step, step_record& rec) {
        rec.step = step;
        const int B = cfg_.prompts, G = cfg_.group;
        const std::size_t L = static_cast<std::size_t>(P_ + C_);
        std::vector<std::int32_t> prompts(static_cast<std::size_t>(B) * P_);
        common::sample_batch(data_.train, P_ - 1, B, 9000u + static_cast<std::uint64_t>(cfg_.seed), step, 0,
                             prompts.data());
        rollout_weights_.assign(opt_.state.params.begin(), opt_.state.params.end());
        const auto t0 = clock::now();
        engine_.generate(params(), prompts.data(), B, P_, G, C_, 5000u + static_cast<std::uint64_t>(cfg_.seed),
                         static_cast<std::uint64_t>(step), seqs_.data(), logp_roll_.data(), ent_roll_.data());
        rec.rollout_seconds = seconds_since(t0);
        rec.rollout_tokens_per_second = static_cast<double>(n_ * C_) / rec.rollout_seconds;
        double reward = 0, solved = 0;
        for (std::size_t s = 0; s < n_; ++s) {
            rewards_[s] = task_.reward(seqs_.data() + s * L + P_, C_);
            reward += rewards_[s], solved += rewards_[s] == 0.0f;
        }
        rec.reward_mean = reward / static_cast<double>(n_);
        rec.solved_fraction = solved / static_cast<double>(n_);
        octet::group_advantages(ex_, octet::span<const float>(rewards_), static_cast<std::size_t>(G),
                                octet::span<float>(adv_seq_));
        for (std::size_t s = 0; s < n_; ++s) std::fill_n(adv_.data() + s * C_, C_, adv_seq_[s]);
        double ent = 0;
        for (float e : ent_roll_) ent += e;
        rec.entropy_rollout = ent / static_cast<double>(ent_roll_.size());
        // monitors (before any update of this step)
        const auto tm = clock::now();
        const std::size_t w = static_cast<std::size_t>(cfg_.entropy_window);
        double base = 0;
        const std::size_t have = std::min(w, entropy_history_.size());
        for (std::size_t i = entropy_history_.size() - have; i < entropy_history_.size(); ++i)
            base += entropy_history_[i];
        const double change = have == w ? rec.entropy_rollout / (base / static_cast<double>(have)) : 1.0;
        std::uint64_t bad = 0;
        for (float x : logp_roll_) bad += !std::isfinite(x);
        checks_.record(surge_check_, step, change);
        checks_.record(collapse_check_, step, change);
        checks_.record(nonfinite_check_, step, static_cast<double>(bad));
        rec.monitor_seconds = seconds_since(tm);
        rec.monitor.clear();  // a step whose checks trip is discarded: a kept step is ok or warns
        for (auto id : {surge_check_, collapse_check_, nonfinite_check_}) {
            const octet::check_status st = checks_.history(id).back().status;
            if (st != octet::check_status::ok)
                rec.monitor += (rec.monitor.empty() ? "" : ", ") + std::string(octet::check_status_name(st)) + " " +
                               checks_.spec(id).name;
        }
        if (rec.monitor.empty()) rec.monitor = "ok";
    }

    /// The step's epochs of updates (after rollouts() passed the checks).
    void update(int step, step_record& rec) {
        const auto t0 = clock::now();
        const std::size_t nc = n_ * C_;
        const bool tis = cfg_.variant == "fp8_tis", calibrated = cfg_.variant == "fp8_calibrated";
        std::uint64_t neg = 0, pos = 0, clip_neg = 0, clip_pos = 0, clip_neg_hi = 0, clip_pos_hi = 0, truncated = 0;
        double update_forward_seconds = 0, cal_seconds = 0;
        float lr = cfg_.lr * lr_scale_;
        if (step == cfg_.fault_step && !fault_fired_) lr *= cfg_.fault_lr_scale, fault_fired_ = true;
        rec.lr = lr;
        for (int e = 0; e < cfg_.epochs; ++e) {
            const auto tf = clock::now();
            common::step_telemetry t = trainer_.score(params(), seqs_.data(), static_cast<int>(n_),
                                                      octet::span<float>(logp_full_), octet::span<float>(ent_full_));
            const double forward_seconds = seconds_since(tf);
            double ent = 0;
            for (std::size_t s = 0; s < n_; ++s)
                for (int c = 0; c < C_; ++c) {
                    const std::size_t r = s * T_ + static_cast<std::size_t>(P_ - 1 + c);
                    logp_new_[s * C_ + c] = logp_full_[r];
                    ent += ent_full_[r];
                }
            if (e == 0) {
                update_forward_seconds = forward_seconds;
                logp_trainer_ = logp_new_;
                rec.entropy_trainer = ent / static_cast<double>(nc);
                std::vector<float> d(nc);
                double absd = 0;
                for (std::size_t i = 0; i < nc; ++i) {
                    d[i] = logp_trainer_[i] - logp_roll_[i];
                    absd += std::fabs(static_cast<double>(d[i]));
                }
                mean_abs_.push_back(absd / static_cast<double>(nc));
                log_ratio_stats(std::move(d), rec);
                if (tis)
                    for (std::size_t i = 0; i < nc; ++i) logp_old_[i] = logp_trainer_[i];
                else
                    logp_old_ = logp_roll_;
            }
            // ratios with and without the mismatch
            octet::importance_ratios(ex_, octet::span<const float>(logp_new_), octet::span<const float>(logp_old_),
                                     octet::span<float>(ratio_low_));
            octet::importance_ratios(ex_, octet::span<const float>(logp_new_), octet::span<const float>(logp_trainer_),
                                     octet::span<float>(ratio_high_));
            octet::clip_range used = range();
            if (calibrated) {
                const auto tc = clock::now();
                auto& cal = cal_[static_cast<std::size_t>(e)];
                if (cal.reference_due(step)) cal.set_reference(step, ratio_high_, update_forward_seconds);
                used = cal.update(step, ratio_low_);
                cal_seconds += seconds_since(tc);
            }
            const octet::crossing_report cr = octet::threshold_crossings_from_ratios(
                ex_, octet::span<const float>(ratio_low_), octet::span<const float>(ratio_high_),
                octet::span<const float>(adv_), range(), used);
            const auto& cneg = cr[octet::advantage_sign::negative];
            const auto& cpos = cr[octet::advantage_sign::positive];
            rec.crossings_negative_pushed_below += cneg.pushed_out_low;
            rec.crossings_negative_pushed_out += cneg.pushed_out_low + cneg.pushed_out_high;
            rec.crossings_positive_pushed_above += cpos.pushed_out_high;
            rec.crossings_region_changed += cr.region_changed();
            rec.crossings_branch_changed += cr.branch_changed();
            clip_neg_hi += cneg.below_high, clip_pos_hi += cpos.above_high;
            octet::surrogate_config sc;
            sc.range = used;
            sc.aggregation = octet::loss_aggregation::sequence_mean;
            const octet::surrogate_stats st =
                octet::clipped_surrogate(ex_, octet::span<const float>(logp_new_), octet::span<const float>(logp_old_),
                                         octet::span<const float>(adv_), sc, {{}, {}, octet::span<float>(grad_)},
                                         octet::span<const std::int64_t>(offsets_));
            neg += st.negative, pos += st.positive, clip_neg += st.clipped_low, clip_pos += st.clipped_high;
            if (tis)
                for (std::size_t i = 0; i < nc; ++i) {
                    const float w = octet::importance_ratio(logp_trainer_[i], logp_roll_[i]);
                    truncated += w > cfg_.tis_cap;
                    grad_[i] *= std::min(w, cfg_.tis_cap);
                }
            std::fill(dlogp_full_.begin(), dlogp_full_.end(), 0.0f);
            for (std::size_t s = 0; s < n_; ++s)
                for (int c = 0; c < C_; ++c)
                    dlogp_full_[s * T_ + static_cast<std::size_t>(P_ - 1 + c)] = grad_[s * C_ + c];
            trainer_.policy_backward(params(), seqs_.data(), static_cast<int>(n_),
                                     octet::span<const float>(dlogp_full_), octet::span<float>(grads_), t);
            double g2 = 0;
            for (float g : grads_) g2 += static_cast<double>(g) * g;
            const double norm = std::sqrt(g2);
            if (norm > cfg_.grad_clip)
                for (auto& g : grads_) g *= static_cast<float>(cfg_.grad_clip / norm);
            rec.grad_norm = norm;
            opt_.step(ex_, octet::span<const float>(grads_), lr);
            rec.clip_lower = used.lower, rec.clip_upper = used.upper;
            trace_[static_cast<std::size_t>(e)] = epoch_trace{logp_new_, used};
        }
        rec.tokens = nc;
        rec.tokens_negative = neg / static_cast<std::uint64_t>(cfg_.epochs);
        rec.tokens_positive = pos / static_cast<std::uint64_t>(cfg_.epochs);
        auto frac = [](std::uint64_t a, std::uint64_t b) { return b ? static_cast<double>(a) / b : 0.0; };
        rec.clip_fraction_negative = frac(clip_neg, neg), rec.clip_fraction_positive = frac(clip_pos, pos);
        rec.clip_fraction_negative_high = frac(clip_neg_hi, neg),
        rec.clip_fraction_positive_high = frac(clip_pos_hi, pos);
        rec.tis_truncated_fraction = tis ? frac(truncated, nc * static_cast<std::uint64_t>(cfg_.epochs)) : 0.0;
        rec.calibration_seconds = cal_seconds;
        rec.update_seconds = seconds_since(t0);
        rec.update_tokens_per_second =
            static_cast<double>(n_ * T_ * static_cast<std::size_t>(cfg_.epochs)) / rec.update_seconds;
        entropy_history_.push_back(rec.entropy_rollout);
    }

    grpo_config cfg_;
    common::model_config mc_;
    const common::corpus& data_;
    lipogram_task task_;
    octet::host_executor ex_;
    std::size_t n_;
    int P_, C_;
    std::size_t T_;
    common::memory_meter meter_;
    common::transformer trainer_;
    rollout_engine engine_;
    optimizer opt_;
    std::vector<octet::calibrated_clipping> cal_;
    float lr_scale_ = 1.0f;
    std::vector<double> entropy_history_;
    std::optional<state> checkpoint_;
    octet::check_registry checks_;
    octet::check_registry::check_id surge_check_ = 0, collapse_check_ = 0, nonfinite_check_ = 0;
    bool fault_fired_ = false;  // the scripted fault happens once (a replay does not repeat it)
    int next_step_ = 0;
    run_result result_;
    std::vector<double> mean_abs_;  // per recorded step: mean |log-ratio|
    std::vector<std::int32_t> seqs_;
    std::vector<float> logp_roll_, ent_roll_, rewards_, adv_seq_, adv_, logp_full_, ent_full_, dlogp_full_;
    std::vector<float> logp_new_, logp_trainer_, logp_old_, grad_, ratio_low_, ratio_high_, grads_;
    std::vector<std::int64_t> offsets_;
    std::vector<epoch_trace> trace_;
    std::vector<float> rollout_weights_;  // the weights that generated the last batch (for tests)
};

}  // namespace rl
