// examples/08_training/trainer.hpp: one training run (a recipe, a seed, a size, a length), in named
// parts:
//   setup        the optimizer (owns the master weights, which compute reads in place), this process's
//                ranks (a model replica, a gradient and a token batch each), the gradient exchange,
//                the evaluator, the monitors, the checkpointer and the recovery policy, every buffer
//                booked in the run's memory meter;
//   step()       one step: every rank's forward and backward, the fault hook, the reduction, the
//                checks BEFORE the update, the recovery policy's decision, then the update (clipped),
//                the step's records and, when due, a checkpoint;
//   checkpointer checkpointer.hpp;  evaluator  evaluator.hpp (held-out loss, at eval_points steps);
//   recovery     a tripped check repeats the step at higher precision (every linear and attention
//                in float32) before anything is applied, from the codec residuals it started with;
//                a step that still trips reloads the last checkpoint; a crash (simulated_crash from
//                the fault hook) restarts from it;
//   faults       a fault_hook (faults.hpp), called at fixed points; the trainer has no faults of
//                its own;
//   run()        the loop, then the run's result (final losses, a generated sample, timings, the
//                meter's peaks beside the ledger's prediction, ledger.hpp).
#pragma once

#include "checkpointer.hpp"
#include "common/corpus.hpp"
#include "common/model.hpp"
#include "common/model_file.hpp"
#include "evaluator.hpp"
#include "faults.hpp"
#include "gradient_exchange.hpp"
#include "gradients.hpp"
#include "ledger.hpp"
#include "optimizer.hpp"
#include "ranks.hpp"
#include "step_checks.hpp"
#include "train.hpp"

#include <octet/octet.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace train {

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct run_options {
    model_config size;
    recipe_config recipe;
    int seed = 0, steps = 200, ranks = 2, batch = 16;  // batch: sequences per step over all ranks
    float lr = 3e-3f;
    int warmup = 30;
    int eval_points = 5;      // held-out evaluations over the run (the last at the end)
    int eval_sequences = 32;  // held-out windows per evaluation
    int threads = 1;          // threads of the executor (the model's attention scratch is per thread)
    float clip = 1.0f;        // gradient-norm clipping threshold
    octet::host_executor ex = octet::on_host();
    std::string scratch;     // folder for the checkpoint file
    std::string save_model;  // where to write the final weights (model_file.hpp); empty: nowhere
    // The ranks of other processes (mpirun: this process is rank procs->rank() of `ranks`);
    // nullptr: all `ranks` ranks are threads of this process.
    process_ranks* procs = nullptr;
};

/// Warmup over o.warmup steps, then a cosine from o.lr down to a tenth of it.
inline float learning_rate(const run_options& o, std::int64_t step) {
    const double warm = std::min(1.0, static_cast<double>(step + 1) / o.warmup);
    const double progress = static_cast<double>(step) / std::max(1, o.steps);
    return static_cast<float>(o.lr * warm * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(3.141592653589793 * progress))));
}

/// Each key's value summed over the processes (the keys are the same on every rank: one model).
inline std::map<std::string, double> sum_over_ranks(const std::map<std::string, double>& mine, process_ranks* procs) {
    if (!procs) return mine;
    const int P = procs->size();
    std::vector<double> values;
    for (const auto& kv : mine) values.push_back(kv.second);
    OCTET_REQUIRE(procs->allreduce_max(static_cast<int>(values.size())) == static_cast<int>(values.size()),
                  "train::sum_over_ranks", "mine", "must have the same keys on every rank");
    std::vector<double> all(values.size() * static_cast<std::size_t>(P));
    procs->allgather(values.data(), values.size() * sizeof(double), all.data());
    std::map<std::string, double> out;
    std::size_t i = 0;
    for (const auto& kv : mine) {
        double s = 0;
        for (int r = 0; r < P; ++r) s += all[static_cast<std::size_t>(r) * values.size() + i];
        out[kv.first] = s, ++i;
    }
    return out;
}

/// This process's ranks: all P in-process, or one under mpirun; a model replica, a gradient buffer
/// (recipe.gradients: float32 or bf16) and a token batch each. The in-process ranks step one after another: one set of
/// step buffers serves them all. The step buffers lend the gradient exchange its scratch between steps (lend_parts:
/// each local rank's).
struct local_ranks {
    int count = 1, first = 0;  ///< L ranks, global ranks first .. first + L - 1
    std::shared_ptr<step_buffers> buffers;
    std::vector<std::unique_ptr<transformer>> models;
    std::vector<gradient_buffer> grads;
    std::vector<metered_vector<std::int32_t>> tokens;

    /// This process's ranks under o: L and the first.
    static int count_of(const run_options& o) { return o.procs ? 1 : o.ranks; }
    static int first_of(const run_options& o) { return o.procs ? o.procs->rank() : 0; }

    local_ranks(memory_meter& meter, const run_options& o, std::size_t n, int per_rank,
                const std::vector<std::size_t>& lend_parts)
        : count(count_of(o)),
          first(first_of(o)),
          buffers(std::make_shared<step_buffers>(meter, step_buffers::lend_bytes(lend_parts))) {
        const model_config& mc = o.size;
        for (int l = 0; l < count; ++l) {
            models.push_back(std::make_unique<transformer>(
                mc, o.recipe, meter, o.ex, per_rank, static_cast<std::uint64_t>(o.seed) * 131u + first + l, buffers));
            grads.emplace_back(meter, o.recipe.gradients, n);
            tokens.push_back(make_metered<std::int32_t>(meter, octet::memory_category::temporaries,
                                                        static_cast<std::size_t>(per_rank) * (mc.seq_len + 1)));
        }
    }
};

class trainer {
public:
    /// Setup. `faults`: where the run's faults enter (no_faults for none).
    trainer(const run_options& o, const corpus& data, fault_hook& faults)
        : o_(o),
          data_(data),
          faults_(faults),
          P_(o.ranks),
          per_rank_(o.batch / o.ranks),
          n_(transformer::parameter_count(o.size)),
          opt_(make_optimizer_booked()),
          exchange_(meter_, o.recipe, n_, P_, local_ranks::count_of(o), local_ranks::first_of(o), o.procs),
          restore_(exchange_),
          lend_parts_(between_steps(exchange_, restore_)),
          ranks_(meter_, o, n_, per_rank_, lend_parts_),
          evaluate_(meter_, data, o.size, o.eval_sequences, per_rank_),
          checkpoints_(o.scratch, o.procs, o.steps, *opt_, exchange_),
          policy_(recovery_ladder(), recovery_wiring()) {
        res_.recipe = o.recipe.name, res_.size = o.size.name, res_.seed = o.seed, res_.steps = o.steps;
        res_.ranks = P_, res_.local_ranks = ranks_.count, res_.recovery = o.recipe.recovery;
        res_.parameters = static_cast<double>(n_);
        res_.moe_blocks = o.size.moe_blocks(), res_.experts = o.size.moe_experts, res_.top_k = o.size.moe_top_k;
    }
    trainer(const trainer&) = delete;  // the recovery callbacks hold `this`
    trainer& operator=(const trainer&) = delete;

    /// What step() decided: where the run goes next, whether the update was applied, whether the
    /// recovery policy gave up.
    struct step_result {
        std::int64_t next = 0;
        bool applied = true, stop = false;
    };

    /// One step (started at t0, for its time). The checks see the reduced gradient before the
    /// update; with recovery on, the policy decides whether it is applied.
    step_result step(std::int64_t step, clock_type::time_point t0) {
        current_ = gradients(step, false);
        measure_checks(step);
        step_result r;
        r.next = step + 1;
        if (o_.recipe.recovery) {
            const auto outcome = policy_.after_step(step, checks_.registry(), seconds_since(t0));
            if (outcome.stop) {
                r.stop = true;
                return r;
            }
            if (outcome.action == octet::recovery_action::reload_checkpoint) r.applied = false;
            r.next = outcome.next_step;
        }
        if (r.applied) {
            update(step);
            record(step);
            if (checkpoints_.due_after(step)) checkpoints_.save(step);
        }
        return r;
    }

    /// The run: steps until o.steps have been applied (or the recovery policy gives up), held-out
    /// evaluations on the lead rank, then the result. `advanced(1)` after every executed step.
    run_result run(const std::function<void(double)>& advanced) {
        const int eval_every = std::max(1, o_.steps / std::max(1, o_.eval_points));
        const double tokens_per_step = static_cast<double>(o_.batch) * o_.size.seq_len;
        const auto steps = static_cast<std::size_t>(o_.steps);
        res_.train_loss.assign(steps, not_measured);
        res_.saturation_rate.assign(steps, 0.0);
        res_.underflow_rate.assign(steps, 0.0);
        res_.attention_residual.assign(steps, {});
        res_.attention_residual_q.assign(steps, {});
        checkpoints_.save(-1);
        for (std::int64_t step = 0; step < o_.steps;) {
            const auto t0 = clock_type::now();
            try {
                faults_.step_starts(step, ranks_.first, ranks_.count);
            } catch (const simulated_crash& crash) {
                step = restart(step, crash.what(), t0);
                continue;
            }
            const step_result r = this->step(step, t0);
            if (r.stop) {
                wall_ += seconds_since(t0);
                break;
            }
            const double secs = seconds_since(t0);
            wall_ += secs;
            if (step <= replay_until_) crash_seconds_ += secs;
            executed_tokens_ += tokens_per_step;
            advanced(1.0);
            step = r.next;
            if (lead() && r.applied && ((step % eval_every) == 0 || step == o_.steps))
                res_.heldout.emplace_back(static_cast<int>(step), evaluate_(*ranks_.models[0], params()));
        }
        return finish();
    }

private:
    bool lead() const { return ranks_.first == 0; }      // global rank 0 evaluates, samples and writes the model
    weights_ref params() const { return opt_->view(); }  // the master weights, read in place
    gradient_buffer& grad() { return ranks_.grads[0]; }  // the reduced gradient (after gradients())
    void measure_checks(std::int64_t step) {
        grad().visit([&](auto g) { checks_.measure(step, current_, g); });
    }

    /// What the step buffers lend between steps: the all-reduce's scratch of each local rank, then
    /// the copies of the residuals (none without the codec).
    static std::vector<std::size_t> between_steps(const gradient_exchange& exchange, const restore_point& restore) {
        std::vector<std::size_t> parts = exchange.lend_parts();
        parts.insert(parts.end(), restore.lend_parts().begin(), restore.lend_parts().end());
        return parts;
    }

    /// The optimizer over freshly initialized parameters, its weights and state booked; the
    /// initial copy is booked while it lives.
    std::unique_ptr<optimizer> make_optimizer_booked() {
        auto init = make_metered<float>(meter_, octet::memory_category::temporaries, n_);
        transformer::init_parameters(o_.size, static_cast<std::uint64_t>(o_.seed), octet::span<float>(init.data(), n_));
        octet::adamw_hyper hyper;
        hyper.weight_decay = 0.01f;
        hyper.seed = 1000u + static_cast<std::uint64_t>(o_.seed);
        auto opt = make_optimizer(o_.recipe, octet::span<const float>(init.data(), n_), hyper);
        meter_.allocate(octet::memory_category::weights, opt->weight_bytes());
        meter_.allocate(octet::memory_category::optimizer_state, opt->state_bytes());
        return opt;  // frees the initial copy
    }

    /// Every rank's forward and backward on the step's batch (raised: in float32), the fault hook
    /// on each gradient, then the reduction. The step's numbers, summed over the ranks in rank order.
    step_numbers gradients(std::int64_t step, bool raised) {
        const model_config& mc = o_.size;
        const int P = P_, L = ranks_.count, first = ranks_.first;
        step_numbers s;
        s.residual.assign(static_cast<std::size_t>(mc.layers), 0.0);
        if (o_.recipe.attention == attention_mode::fp8) s.residual_q.assign(static_cast<std::size_t>(mc.layers), 0.0);
        // Each rank's share of the step's numbers: [loss, residual per layer, residual_q per layer]
        // over P, the mixture of experts' [tokens per block and expert, dropped, L_aux over P, FP8
        // and bf16 dispatch bytes], and [quantized, saturated, underflow]; summed over the ranks in
        // rank order.
        const std::size_t nl = s.residual.size(), nq = s.residual_q.size();
        const std::size_t ne = static_cast<std::size_t>(mc.moe_blocks()) * static_cast<std::size_t>(mc.moe_experts);
        const std::size_t nm = mc.moe() ? ne + 4 : 0, nd = 1 + nl + nq + nm;
        s.expert_tokens.assign(ne, 0.0);
        std::vector<double> shares(static_cast<std::size_t>(P) * nd, 0.0);
        std::vector<std::uint64_t> counts(static_cast<std::size_t>(P) * 3, 0);
        for (int l = 0; l < L; ++l) {
            transformer& model = *ranks_.models[l];
            sample_batch(data_.train, mc.seq_len, per_rank_, static_cast<std::uint64_t>(o_.seed), step, first + l,
                         ranks_.tokens[l].data());
            if (raised) model.set_high_precision(true);  // one rank at a time holds the float copies
            const step_telemetry t = ranks_.grads[l].visit(
                [&](auto g) { return model.forward_backward(params(), ranks_.tokens[l].data(), per_rank_, g); });
            if (raised) model.set_high_precision(false);
            double* d = shares.data() + static_cast<std::size_t>(first + l) * nd;
            d[0] = t.loss / P;
            for (std::size_t k = 0; k < t.attention_residual.size() && k < nl; ++k)
                d[1 + k] = t.attention_residual[k] / P;
            for (std::size_t k = 0; k < t.attention_residual_q.size() && k < nq; ++k)
                d[1 + nl + k] = t.attention_residual_q[k] / P;
            if (nm > 0) {
                double* m = d + 1 + nl + nq;
                std::size_t at = 0;
                for (const auto& block : t.expert_tokens)
                    for (double v : block)
                        if (at < ne) m[at++] = v;
                m[ne] = static_cast<double>(t.moe_dropped), m[ne + 1] = t.moe_aux_loss / P;
                m[ne + 2] = t.dispatch_fp8_bytes, m[ne + 3] = t.dispatch_bf16_bytes;
            }
            std::uint64_t* c = counts.data() + static_cast<std::size_t>(first + l) * 3;
            c[0] = t.quantized, c[1] = t.saturated, c[2] = t.underflow;
            for (const auto& [k, v] : t.op_seconds) model_seconds_[k] += v;
        }
        if (o_.procs) {
            const std::vector<double> mine(shares.begin() + first * nd, shares.begin() + (first + 1) * nd);
            const std::vector<std::uint64_t> my_counts(counts.begin() + first * 3, counts.begin() + first * 3 + 3);
            o_.procs->allgather(mine.data(), nd * sizeof(double), shares.data());
            o_.procs->allgather(my_counts.data(), 3 * sizeof(std::uint64_t), counts.data());
        }
        for (int r = 0; r < P; ++r) {
            const double* d = shares.data() + static_cast<std::size_t>(r) * nd;
            s.loss += d[0];
            for (std::size_t k = 0; k < nl; ++k) s.residual[k] += d[1 + k];
            for (std::size_t k = 0; k < nq; ++k) s.residual_q[k] += d[1 + nl + k];
            if (nm > 0) {
                const double* m = d + 1 + nl + nq;
                for (std::size_t k = 0; k < ne; ++k) s.expert_tokens[k] += m[k];
                s.moe_dropped += m[ne], s.moe_aux_loss += m[ne + 1];
                s.dispatch_fp8_bytes += m[ne + 2], s.dispatch_bf16_bytes += m[ne + 3];
            }
            const std::uint64_t* c = counts.data() + static_cast<std::size_t>(r) * 3;
            s.quantized += c[0], s.saturated += c[1], s.underflow += c[2];
        }
        for (int l = 0; l < L; ++l)
            ranks_.grads[l].visit([&](auto g) { faults_.gradients_computed(step, first + l, g); });
        // The step buffers are idle until the next forward: they hold the all-reduce's scratch
        // and the copy of the residuals it is about to update.
        const auto lent = ranks_.buffers->lend(lend_parts_);
        const auto split = lent.begin() + static_cast<std::ptrdiff_t>(exchange_.lend_parts().size());
        restore_.keep(std::vector<octet::span<unsigned char>>(split, lent.end()));
        const auto t0 = clock_type::now();
        s.norm = exchange_.reduce(ranks_.grads, std::vector<octet::span<unsigned char>>(lent.begin(), split));
        op_seconds_["allreduce"] += seconds_since(t0);
        return s;
    }

    /// The update: the reduced gradient clipped to norm o.clip, the optimizer's step (which applies
    /// the clipping coefficient, and for bf16 gradients the mean's 1 / P, as it reads each gradient).
    void update(std::int64_t step) {
        const auto t0 = clock_type::now();
        double scale = 1.0;
        if (current_.norm > o_.clip) {
            ++res_.clip_crossings;
            scale = o_.clip / current_.norm;
        }
        float grad_scale = static_cast<float>(scale);
        if (exchange_.mean_scale() != 1.0f) grad_scale = static_cast<float>(scale * exchange_.mean_scale());
        const float lr = learning_rate(o_, step);
        std::as_const(grad()).visit([&](auto g) { opt_->step(o_.ex, g, lr, grad_scale); });
        op_seconds_["optimizer"] += seconds_since(t0);
        checks_.applied(current_.norm);
    }

    /// An applied step's numbers in the result.
    void record(std::int64_t step) {
        const auto si = static_cast<std::size_t>(step);
        res_.train_loss[si] = current_.loss;
        const double q = std::max<double>(1.0, static_cast<double>(current_.quantized));
        res_.saturation_rate[si] = static_cast<double>(current_.saturated) / q;
        res_.underflow_rate[si] = static_cast<double>(current_.underflow) / q;
        res_.attention_residual[si] = current_.residual;
        res_.attention_residual_q[si] = current_.residual_q;
        if (res_.moe_blocks > 0) record_moe();
    }

    /// An applied step's mixture-of-experts numbers, added to the run's (finish() takes the means).
    void record_moe() {
        const std::size_t B = static_cast<std::size_t>(res_.moe_blocks), E = static_cast<std::size_t>(res_.experts);
        if (res_.expert_tokens.empty()) res_.expert_tokens.assign(B, std::vector<double>(E, 0.0));
        for (std::size_t b = 0; b < B; ++b) {
            const double* load = current_.expert_tokens.data() + b * E;
            double total = 0, most = 0;
            for (std::size_t e = 0; e < E; ++e) {
                res_.expert_tokens[b][e] += load[e];
                total += load[e];
                most = std::max(most, load[e]);
            }
            const double imbalance = total > 0 ? most / (total / static_cast<double>(E)) : 1.0;
            imbalance_sum_ += imbalance;
            res_.expert_imbalance_max =
                std::isfinite(res_.expert_imbalance_max) ? std::max(res_.expert_imbalance_max, imbalance) : imbalance;
        }
        res_.moe_dropped += current_.moe_dropped;
        aux_sum_ += current_.moe_aux_loss / static_cast<double>(B);
        fp8_bytes_sum_ += current_.dispatch_fp8_bytes;
        bf16_bytes_sum_ += current_.dispatch_bf16_bytes;
        ++moe_steps_;
    }

    // ---- recovery wiring -------------------------------------------------------------------------

    static octet::recovery_config recovery_ladder() {
        octet::recovery_config c;
        c.ladder = {octet::recovery_action::repeat_step, octet::recovery_action::reload_checkpoint};
        c.non_finite_ladder = c.ladder;
        return c;
    }
    octet::recovery_callbacks recovery_wiring() {
        octet::recovery_callbacks cb;
        cb.repeat_step = [this](std::int64_t step) {
            ++raised_steps_;
            restore_.restore();
            current_ = gradients(step, true);
            measure_checks(step);
            return 0.0;
        };
        cb.reload_checkpoint = [this] {
            const std::int64_t c = checkpoints_.load();
            return octet::reload_result{c, static_cast<double>(n_) * 4.0};
        };
        return cb;
    }
    /// After a crash at `step`'s start: the run restarts from the last checkpoint (the optimizer
    /// and the codec's residuals; the models' own state goes on as it stands, so a replayed step is
    /// not bit-identical to its first run). Returns the step to go on from.
    std::int64_t restart(std::int64_t step, const std::string& what, clock_type::time_point t0) {
        const std::int64_t c = checkpoints_.load();
        ++res_.restarts;
        replay_until_ = step - 1;
        crash_seconds_ += seconds_since(t0);
        res_.recoveries.push_back(
            {step, "reload_checkpoint", what + ": restart from the checkpoint of step " + std::to_string(c), 0.0});
        wall_ += seconds_since(t0);
        return c + 1;
    }

    // ---- the result ------------------------------------------------------------------------------

    run_result finish() {
        if (!res_.recoveries.empty() && res_.recoveries.front().action == "reload_checkpoint")
            res_.recoveries.front().seconds = crash_seconds_;
        for (const auto& e : policy_.log().entries())
            res_.recoveries.push_back({e.step, octet::recovery_action_name(e.action), e.reason, e.seconds});
        res_.restarts += static_cast<int>(policy_.log().restarts());

        res_.wall_seconds = wall_;
        res_.tokens_per_second = wall_ > 0 ? executed_tokens_ / wall_ : 0;
        res_.op_seconds = op_seconds_;
        for (const auto& [k, v] : sum_over_ranks(model_seconds_, o_.procs)) res_.op_seconds[k] += v;
        res_.monitor_seconds = checks_.cost_seconds();
        res_.monitor_overhead = wall_ > 0 ? res_.monitor_seconds / wall_ : 0;
        // Final training loss: mean of the last 10% of the steps applied.
        {
            double s = 0;
            int k = 0;
            for (int i = o_.steps - std::max(1, o_.steps / 10); i < o_.steps; ++i)
                if (std::isfinite(res_.train_loss[static_cast<std::size_t>(i)]))
                    s += res_.train_loss[static_cast<std::size_t>(i)], ++k;
            res_.final_train_loss = k ? s / k : not_measured;
        }
        res_.final_heldout_loss = res_.heldout.empty() ? not_measured : res_.heldout.back().second;
        if (moe_steps_ > 0) {
            const double steps = static_cast<double>(moe_steps_);
            res_.expert_imbalance = imbalance_sum_ / (steps * res_.moe_blocks);
            res_.moe_aux_loss = aux_sum_ / steps;
            res_.dispatch_fp8_bytes = fp8_bytes_sum_ / steps;
            res_.dispatch_bf16_bytes = bf16_bytes_sum_ / steps;
        }
        res_.heldout_bpc = res_.final_heldout_loss / std::log(2.0);
        if (lead() && !o_.save_model.empty()) {
            std::vector<float> weights(n_);  // the file holds float32 (after the run: not booked)
            opt_->weights(octet::span<float>(weights.data(), n_));
            write_model_file(o_.save_model, o_.size, weights);
        }
        if (lead()) {
            std::vector<std::int32_t> prompt;
            for (char c : std::string("And God said, ")) prompt.push_back(data_.id(c));
            res_.sample = data_.text(
                ranks_.models[0]->generate(params(), prompt, 160, static_cast<std::uint64_t>(o_.seed), 0.8f));
        }

        // Memory: the meter's peaks, and the ledger's prediction for the same configuration.
        const auto& led = meter_.ledger();
        res_.peak_bytes_measured = led.peak_total();
        for (int c = 0; c < octet::memory_category_count; ++c) {
            const auto cat = static_cast<octet::memory_category>(c);
            res_.peak_bytes_by_category[octet::memory_category_name(cat)] = led.peak(cat);
        }
        ledger_shape shape;
        shape.size = o_.size, shape.recipe = o_.recipe, shape.parameters = n_, shape.ranks = P_;
        shape.local_ranks = ranks_.count, shape.first = ranks_.first, shape.per_rank = per_rank_;
        shape.eval_sequences = o_.eval_sequences, shape.threads = o_.threads,
        shape.other_processes = o_.procs != nullptr;
        const octet::memory_ledger predicted = predicted_ledger(shape, exchange_, raised_steps_ > 0);
        for (int c = 0; c < octet::memory_category_count; ++c) {
            const auto cat = static_cast<octet::memory_category>(c);
            res_.ledger_bytes[octet::memory_category_name(cat)] = predicted.bytes(cat);
        }
        res_.ledger_peak_bytes = predicted.total();
        return res_;
    }

    // Setup (in this order: the meter books every buffer as it is allocated).
    const run_options& o_;
    const corpus& data_;
    fault_hook& faults_;
    const int P_, per_rank_;  // ranks in all; sequences per rank and step
    const std::size_t n_;     // parameters
    memory_meter meter_;
    std::unique_ptr<optimizer> opt_;       // owns the master weights (compute reads them in place)
    gradient_exchange exchange_;           // (before ranks_: their step buffers lend it its scratch)
    restore_point restore_;                // the codec residuals a repeated step starts from
    std::vector<std::size_t> lend_parts_;  // lent between steps: exchange_'s scratch, then restore_'s copies
    local_ranks ranks_;
    evaluator evaluate_;
    step_checks checks_;
    checkpointer checkpoints_;
    octet::recovery_policy policy_;

    // The run's state.
    step_numbers current_;  // the step's numbers (its last attempt)
    run_result res_;
    int raised_steps_ = 0;  // steps repeated at float32 (their float copies are in the peak)
    double wall_ = 0, executed_tokens_ = 0, crash_seconds_ = 0;
    // the mixture of experts' sums over the applied steps (record_moe)
    double imbalance_sum_ = 0, aux_sum_ = 0, fp8_bytes_sum_ = 0, bf16_bytes_sum_ = 0;
    int moe_steps_ = 0;
    std::int64_t replay_until_ = -1;
    std::map<std::string, double> op_seconds_;     // the trainer's own (all-reduce, optimizer): this process's
    std::map<std::string, double> model_seconds_;  // the models' operations: summed over every rank
};

}  // namespace train
