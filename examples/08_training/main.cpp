// examples/08_training: the main job. A small decoder-only transformer learns to write like the
// King James Genesis and Exodus (data/kjv_genesis_exodus.txt, characters as tokens), trained in
// several recipes side by side, every step built from octet: FP8 linear layers
// (octet/nn/linear.hpp: forward, data and weight gradient from the recipe's row- and column-wise
// copies), FP8 attention forward and backward with a delta mode, AdamW with 8-bit moments over
// bf16 master weights, the gradient codec with error feedback across data-parallel ranks
// (octet::compressed_allreduce; ranks are threads of one process, or processes under mpirun),
// monitors that check every step BEFORE its update is
// applied, and a recovery policy. It validates in the order the background essay asks:
//   1. a gate of invariants on small controlled cases (gate.hpp); the run refuses to train if it fails;
//   2. curves at the lengths and sizes asked for;  3. every recipe over several seeds;
//   4. held-out loss in bits per character and a generated sample per recipe.
// and writes report.md, report.json (schema: report_schema.md) and SVG plots to the output folder.
//
// Run:  cmake --workflow --preset demo        (the quick default; build/demo/examples/example_08_training)
//       example_08_training --preset full     (every recipe, 3 seeds, 2 lengths, 2 sizes)
//       example_08_training --preset memory   (each memory mechanism alone and all, size medium, batch 32)
//       example_08_training --help
//       mpiexec -n 2 example_08_training ...   (built with MPI: each process is one rank; rank 0
//                                               prints and writes the report)
// Exit status: 0 when the gate passes and every FP8 recipe ends within the stated tolerance of
// float32 on the same seeds; 1 otherwise; 2 on bad flags.
#include <octet/octet.hpp>

#include "common/corpus.hpp"
#include "common/model.hpp"
#include "common/model_file.hpp"
#include "gate.hpp"
#if TRAIN_HAS_CUDA_LINEARS
#include "cuda_linear.hpp"
#endif
#include "ranks.hpp"
#ifdef OCTET_TRAINING_MPI
#include "mpi_ranks.hpp"
#endif
#include "report.hpp"
#include "train.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifndef OCTET_TRAINING_CORPUS
#define OCTET_TRAINING_CORPUS "data/kjv_genesis_exodus.txt"
#endif

namespace train {
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// ------------------------------------------------------------------------------------------------
// Recipes

std::vector<recipe_config> all_recipes() {
    std::vector<recipe_config> r;
    auto add = [&](recipe_config c) { r.push_back(std::move(c)); };
    recipe_config fp32;
    fp32.name = "fp32";
    add(fp32);
    // Linear layers alone, one recipe each (attention, optimizer and gradients stay float32).
    const std::pair<const char*, linear_mode> linears[] = {{"bf16", linear_mode::bf16},
                                                           {"fp8_delayed", linear_mode::tensorwise_delayed},
                                                           {"fp8_tensorwise", linear_mode::tensorwise},
                                                           {"fp8_blockwise", linear_mode::blockwise},
                                                           {"mxfp8", linear_mode::mxfp8},
                                                           {"nvfp4", linear_mode::nvfp4}};
    for (const auto& [name, mode] : linears) {
        recipe_config c = fp32;
        c.name = name;
        c.linear = mode;
        add(c);
    }
    // Attention alone: the delta modes under a per-token V scale (the stale-delta failure case),
    // and matched under the per-head V scale octet recommends.
    recipe_config attn = fp32;
    attn.attention = attention_mode::fp8;
    attn.name = "attn_fp8";
    add(attn);
    attn.v_scale = v_scale_mode::per_token;
    attn.name = "attn_matched_per_token_v";
    add(attn);
    attn.delta = octet::delta_mode::from_output;
    attn.name = "attn_from_output_per_token_v";
    add(attn);
    // Optimizer state alone, gradient codec alone.
    recipe_config opt8 = fp32;
    opt8.name = "optim_8bit";
    opt8.moments = moment_mode::dynamic8;
    opt8.master = master_mode::bf16_stochastic;
    add(opt8);
    recipe_config codec = fp32;
    codec.name = "grad_codec";
    codec.gradient_codec = true;
    add(codec);
    // The non-linear layers' saved inputs in FP8, alone.
    recipe_config act = fp32;
    act.name = "act_fp8";
    act.compress_activations = true;
    add(act);
    // All together, and the same without recovery.
    recipe_config all = fp32;
    all.name = "octet";
    all.linear = linear_mode::blockwise;
    all.attention = attention_mode::fp8;
    all.moments = moment_mode::dynamic8;
    all.master = master_mode::bf16_stochastic;
    all.gradient_codec = true;
    all.residuals = octet::residual_storage::e4m3;
    all.compress_activations = true;
    add(all);
    all.name = "octet_no_recovery";
    all.recovery = false;
    add(all);
    recipe_config fp32_nr = fp32;
    fp32_nr.name = "fp32_no_recovery";
    fp32_nr.recovery = false;
    add(fp32_nr);
    return r;
}

bool is_low_precision(const recipe_config& r) {
    return r.linear != linear_mode::float32 || r.attention != attention_mode::float32 ||
           r.moments != moment_mode::float32 || r.master != master_mode::float32 || r.gradient_codec ||
           r.compress_activations;
}

// ------------------------------------------------------------------------------------------------
// The optimizer: octet::adamw_optimizer with the recipe's moment codec and master weights, behind
// one interface so that the training loop is written once.

class optimizer {
public:
    virtual ~optimizer() = default;
    virtual octet::adamw_report step(octet::host_executor ex, octet::span<const float> g, float lr) = 0;
    virtual void weights(octet::span<float> out) const = 0;  // master weights as float, for compute
    virtual void save(const std::string& path) = 0;
    virtual void load(const std::string& path) = 0;
    virtual double weight_bytes() const = 0;  // master weights (and compensation)
    virtual double state_bytes() const = 0;   // moments and their metadata
};

template <class MCodec, class Master>
class adamw_with : public optimizer {
public:
    adamw_with(octet::span<const float> init, const octet::adamw_hyper& h) : opt_(init.size(), h) {
        opt_.state.set_params(init);
    }
    octet::adamw_report step(octet::host_executor ex, octet::span<const float> g, float lr) override {
        return opt_.step(ex, g, lr);
    }
    void weights(octet::span<float> out) const override {
        const auto& s = opt_.state;
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = Master::load(s.params[i], comp(i));
    }
    void save(const std::string& path) override { opt_.save(path); }
    void load(const std::string& path) override { opt_.load(path); }
    double weight_bytes() const override {
        const auto& s = opt_.state;
        return static_cast<double>(s.params.size() * sizeof(s.params[0]) +
                                   s.compensation.size() * sizeof(typename Master::comp_type));
    }
    double state_bytes() const override {
        const auto& s = opt_.state;
        return static_cast<double>(s.m_codes.size() * sizeof(s.m_codes[0]) + s.m_meta.size() * sizeof(s.m_meta[0]) +
                                   s.v_codes.size() * sizeof(s.v_codes[0]) + s.v_meta.size() * sizeof(s.v_meta[0]));
    }

private:
    typename Master::comp_type comp(std::size_t i) const {
        if constexpr (std::is_same_v<typename Master::comp_type, octet::no_compensation>) {
            (void)i;
            return {};
        } else {
            return opt_.state.compensation[i];
        }
    }
    octet::adamw_optimizer<MCodec, MCodec, Master> opt_;
};

std::unique_ptr<optimizer> make_optimizer(const recipe_config& r, octet::span<const float> init,
                                          const octet::adamw_hyper& h) {
    namespace sc = octet::state_codec;
    namespace ms = octet::master;
    const bool m8 = r.moments == moment_mode::dynamic8, bf = r.master == master_mode::bf16_stochastic;
    if (m8 && bf) return std::make_unique<adamw_with<sc::dynamic8, ms::bf16_stochastic>>(init, h);
    if (m8) return std::make_unique<adamw_with<sc::dynamic8, ms::fp32>>(init, h);
    if (bf) return std::make_unique<adamw_with<sc::fp32, ms::bf16_stochastic>>(init, h);
    return std::make_unique<adamw_with<sc::fp32, ms::fp32>>(init, h);
}

octet::optimizer_memory_config optimizer_ledger_config(const recipe_config& r, double parameters) {
    octet::optimizer_memory_config c;
    c.parameters = parameters;
    c.first_moment = c.second_moment =
        r.moments == moment_mode::dynamic8 ? octet::state_codec_id::dynamic8 : octet::state_codec_id::fp32;
    c.master = r.master == master_mode::bf16_stochastic ? octet::master_weights_id::bf16_stochastic
                                                        : octet::master_weights_id::fp32;
    return c;
}

// ------------------------------------------------------------------------------------------------
// One run.

struct run_options {
    model_config size;
    recipe_config recipe;
    int seed = 0, steps = 200, ranks = 2, batch = 16;  // batch: sequences per step over all ranks
    float lr = 3e-3f;
    int warmup = 30;
    int eval_points = 5;      // held-out evaluations over the run (the last at the end)
    int eval_sequences = 32;  // held-out windows per evaluation
    int threads = 1;          // threads of the executor (the model's attention scratch is per thread)
    bool faults = true;       // a corrupted gradient and a crash, each once
    float clip = 1.0f;        // gradient-norm clipping threshold
    octet::host_executor ex = octet::on_host();
    std::string scratch;     // folder for the checkpoint file
    std::string save_model;  // where to write the final weights (model_file.hpp); empty: nowhere
    // The ranks of other processes (mpirun: this process is rank procs->rank() of `ranks`);
    // nullptr: all `ranks` ranks are threads of this process.
    process_ranks* procs = nullptr;
    int fail_rank = -1;  // the test hook OCTET_TRAINING_FAIL_RANK: this rank throws at step 1
};

float learning_rate(const run_options& o, std::int64_t step) {
    const double warm = std::min(1.0, static_cast<double>(step + 1) / o.warmup);
    const double progress = static_cast<double>(step) / std::max(1, o.steps);
    return static_cast<float>(o.lr * warm * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(3.141592653589793 * progress))));
}

double median_of(std::vector<double> v) {
    if (v.empty()) return 0;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
}

/// The optimizer's checkpoint file in `folder`: one per process under mpirun.
std::string checkpoint_path(const std::string& folder, const process_ranks* procs) {
    return folder + "/checkpoint" + (procs ? ".rank" + std::to_string(procs->rank()) : std::string()) + ".bin";
}

/// Each key's value summed over the processes (the keys are the same on every rank: one model).
std::map<std::string, double> sum_over_ranks(const std::map<std::string, double>& mine, process_ranks* procs) {
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

run_result run_one(const run_options& o, const corpus& data, const std::function<void(double)>& advanced) {
    const model_config& mc = o.size;
    const recipe_config& rc = o.recipe;
    const int P = o.ranks, per_rank = o.batch / o.ranks;
    // This process's ranks: all P in-process, or one under mpirun. `first` is the global rank of
    // local rank 0; global rank 0 evaluates, samples and injects the faults.
    const int L = o.procs ? 1 : P, first = o.procs ? o.procs->rank() : 0;
    const bool lead = first == 0;
    run_result res;
    res.recipe = rc.name, res.size = mc.name, res.seed = o.seed, res.steps = o.steps, res.ranks = P;
    res.recovery = rc.recovery;

    memory_meter meter;
    using octet::memory_category;
    const std::size_t n = transformer::parameter_count(mc);
    res.parameters = static_cast<double>(n);

    // Parameters: the optimizer owns the master copy; compute reads a float copy.
    auto init = make_metered<float>(meter, memory_category::temporaries, n);
    transformer::init_parameters(mc, static_cast<std::uint64_t>(o.seed), octet::span<float>(init.data(), n));
    octet::adamw_hyper hyper;
    hyper.weight_decay = 0.01f;
    hyper.seed = 1000u + static_cast<std::uint64_t>(o.seed);
    auto opt = make_optimizer(rc, octet::span<const float>(init.data(), n), hyper);
    meter.allocate(memory_category::weights, opt->weight_bytes());
    meter.allocate(memory_category::optimizer_state, opt->state_bytes());
    init = metered_vector<float>(init.get_allocator());  // frees the initial copy
    auto params = make_metered<float>(meter, memory_category::weights, n);
    opt->weights(octet::span<float>(params.data(), n));

    // The ranks: a model replica, a gradient buffer and a token batch each.
    std::vector<std::unique_ptr<transformer>> models;
    std::vector<metered_vector<float>> grads;
    std::vector<metered_vector<std::int32_t>> tokens;
    // The in-process ranks step one after another: one set of step buffers serves them all.
    const auto step_buffers = std::make_shared<train::step_buffers>(meter);
    for (int l = 0; l < L; ++l) {
        models.push_back(std::make_unique<transformer>(
            mc, rc, meter, o.ex, per_rank, static_cast<std::uint64_t>(o.seed) * 131u + first + l, step_buffers));
        grads.push_back(make_metered<float>(meter, memory_category::gradients, n));
        tokens.push_back(make_metered<std::int32_t>(meter, memory_category::temporaries,
                                                    static_cast<std::size_t>(per_rank) * (mc.seq_len + 1)));
    }
    // The gradient codec: E4M3 on a 1024-point Hadamard rotation, error feedback (recipe.residuals:
    // bf16, or E4M3 in octet) at both stages (each rank's whole gradient, and the shard it reduces).
    octet::codec_config codec;
    codec.format = octet::wire_format::e4m3;
    codec.transform = octet::transform_kind::hadamard;
    codec.block = 1024;
    std::vector<octet::error_feedback> feedback, reduced_feedback;
    std::vector<octet::host_arena> allreduce_arenas;
    // The bytes compressed_allreduce takes on rank r (with both residuals; one thread each).
    auto allreduce_scratch = [&](int r) {
        octet::allreduce_options probe;
        probe.feedback = feedback.front().view();
        probe.reduced_feedback = reduced_feedback.front().view();
        return octet::compressed_allreduce_scratch_bytes(octet::on_host(1), codec, n, P, r, probe);
    };
    in_process_world world(L);
    if (rc.gradient_codec) {
        for (int l = 0; l < L; ++l) {
            feedback.emplace_back(n, rc.residuals);
            reduced_feedback.emplace_back(octet::allreduce_shard(codec, n, P, first + l).count, rc.residuals);
            const double residual_bytes =
                static_cast<double>(feedback.back().bytes() + reduced_feedback.back().bytes());
            meter.allocate(memory_category::gradients, residual_bytes);  // (the checkpoint keeps them in its file)
        }
        // compressed_allreduce's buffers (each rank: its stage-1 messages, those it receives, the
        // reduced shard and the gathered messages, and the codec's scratch): one arena per rank of
        // exactly its query, lent to the call, booked as it is allocated.
        for (int l = 0; l < L; ++l) {
            allreduce_arenas.emplace_back(allreduce_scratch(first + l));
            meter.allocate(memory_category::temporaries, static_cast<double>(allreduce_arenas.back().capacity()));
        }
    }
    // Without the codec, processes sum their gradients from an all-gather in rank order (the order
    // the in-process ranks sum in), not with MPI_Allreduce, whose order MPI does not fix: both
    // modes then produce the same bits.
    auto gathered = make_metered<float>(meter, memory_category::gradients, o.procs && !rc.gradient_codec ? P * n : 0);

    // Held-out windows: fixed for every run, so that recipes and seeds are compared on the same text.
    const int eval_batch = std::min(o.eval_sequences, per_rank);
    auto eval_tokens = make_metered<std::int32_t>(meter, memory_category::temporaries,
                                                  static_cast<std::size_t>(o.eval_sequences) * (mc.seq_len + 1));
    sample_batch(data.heldout, mc.seq_len, o.eval_sequences, 777, 0, 0, eval_tokens.data());
    auto evaluate = [&] {
        double sum = 0;
        int seen = 0;
        for (int b = 0; b < o.eval_sequences; b += eval_batch) {
            const int nb = std::min(eval_batch, o.eval_sequences - b);
            sum += models[0]->evaluate(octet::span<const float>(params.data(), n),
                                       eval_tokens.data() + static_cast<std::size_t>(b) * (mc.seq_len + 1), nb) *
                   nb;
            seen += nb;
        }
        return sum / seen;
    };

    // Monitors, measured on each step's gradients BEFORE the update is applied.
    octet::check_registry checks;
    const auto c_nonfinite = checks.add("gradients.non_finite", octet::check_kind::non_finite, "backward");
    // A gradient norm 20x the median of the last 20 applied steps is a fault, not training dynamics
    // (the injected corruption measures about 2e4x; the recovery log prints each trip's value);
    // warn at 5x.
    const auto c_spike =
        checks.add("gradients.norm_spike", octet::check_kind::custom, octet::threshold::above(5.0, 20.0), "backward");
    // Saturation of the FP8 linears' quantizers: delayed scaling clamps when a tensor outgrows its
    // amax history; 1% of a step's elements clamped trips.
    const auto c_saturation = checks.add("linear.saturation_rate", octet::check_kind::saturation_rate,
                                         octet::threshold::above(1e-3, 1e-2), "linear");
    // The attention row-sum residual is watched, not acted on: the ablation runs from_output on
    // purpose to show what a stale delta does.
    const auto c_residual =
        checks.add("attention.row_sum_residual", octet::check_kind::custom,
                   octet::threshold::above(1e-3, std::numeric_limits<double>::infinity()), "attention");
    std::vector<double> clean_norms;

    // One step's gradients (all ranks), reduced; returns the mean loss and fills the telemetry.
    const std::int64_t fault_step = o.faults ? o.steps * 3 / 5 : -1;
    const std::int64_t checkpoint_every = std::max(1, o.steps / 10);
    // The crash falls between two checkpoints, so that the restart replays steps.
    const std::int64_t crash_step = o.faults ? o.steps * 4 / 5 + checkpoint_every / 2 : -1;
    bool fault_done = false, crash_done = false;
    std::map<std::string, double> op_seconds;     // the loop's own (all-reduce, optimizer): this process's
    std::map<std::string, double> model_seconds;  // the models' operations: summed over every rank
    struct step_numbers {
        double loss = 0, norm = 0;
        std::uint64_t quantized = 0, saturated = 0, underflow = 0;
        std::vector<double> residual, residual_q;
    };
    auto compute = [&](std::int64_t step, bool raised) {
        step_numbers s;
        s.residual.assign(static_cast<std::size_t>(mc.layers), 0.0);
        if (rc.attention == attention_mode::fp8) s.residual_q.assign(static_cast<std::size_t>(mc.layers), 0.0);
        // Each rank's share of the step's numbers: [loss, residual per layer, residual_q per layer]
        // over P, and [quantized, saturated, underflow]; summed over the ranks in rank order.
        const std::size_t nl = s.residual.size(), nq = s.residual_q.size(), nd = 1 + nl + nq;
        std::vector<double> shares(static_cast<std::size_t>(P) * nd, 0.0);
        std::vector<std::uint64_t> counts(static_cast<std::size_t>(P) * 3, 0);
        for (int l = 0; l < L; ++l) {
            sample_batch(data.train, mc.seq_len, per_rank, static_cast<std::uint64_t>(o.seed), step, first + l,
                         tokens[l].data());
            if (raised) models[l]->set_high_precision(true);  // one rank at a time holds the float copies
            const step_telemetry t =
                models[l]->forward_backward(octet::span<const float>(params.data(), n), tokens[l].data(), per_rank,
                                            octet::span<float>(grads[l].data(), n));
            if (raised) models[l]->set_high_precision(false);
            double* d = shares.data() + static_cast<std::size_t>(first + l) * nd;
            d[0] = t.loss / P;
            for (std::size_t k = 0; k < t.attention_residual.size() && k < nl; ++k)
                d[1 + k] = t.attention_residual[k] / P;
            for (std::size_t k = 0; k < t.attention_residual_q.size() && k < nq; ++k)
                d[1 + nl + k] = t.attention_residual_q[k] / P;
            std::uint64_t* c = counts.data() + static_cast<std::size_t>(first + l) * 3;
            c[0] = t.quantized, c[1] = t.saturated, c[2] = t.underflow;
            for (const auto& [k, v] : t.op_seconds) model_seconds[k] += v;
        }
        if (o.procs) {
            const std::vector<double> mine(shares.begin() + first * nd, shares.begin() + (first + 1) * nd);
            const std::vector<std::uint64_t> my_counts(counts.begin() + first * 3, counts.begin() + first * 3 + 3);
            o.procs->allgather(mine.data(), nd * sizeof(double), shares.data());
            o.procs->allgather(my_counts.data(), 3 * sizeof(std::uint64_t), counts.data());
        }
        for (int r = 0; r < P; ++r) {
            const double* d = shares.data() + static_cast<std::size_t>(r) * nd;
            s.loss += d[0];
            for (std::size_t k = 0; k < nl; ++k) s.residual[k] += d[1 + k];
            for (std::size_t k = 0; k < nq; ++k) s.residual_q[k] += d[1 + nl + k];
            const std::uint64_t* c = counts.data() + static_cast<std::size_t>(r) * 3;
            s.quantized += c[0], s.saturated += c[1], s.underflow += c[2];
        }
        if (lead && step == fault_step && !fault_done) {
            // A silent data corruption on rank 0: 256 gradient entries with their exponent bumped
            // by 20 (a bit flip in the exponent field). Only the first attempt of the step sees it.
            fault_done = true;
            for (std::size_t i = 0; i < 256 && i < n; ++i) grads[0][(i * 7919) % n] *= 1048576.0f;
        }
        const auto t0 = clock_type::now();
        if (rc.gradient_codec) {
            auto options = [&](int l) {
                octet::allreduce_options ao;
                ao.expected_ranks = P;
                ao.feedback = feedback[l].view();
                ao.reduced_feedback = reduced_feedback[l].view();
                ao.executor = octet::with_allocator(octet::on_host(1), allreduce_arenas[l].allocator());
                return ao;
            };
            if (o.procs) {
                o.procs->compressed_allreduce(codec, octet::span<float>(grads[0].data(), n), options(0));
            } else {
                on_every_rank(P, [&](int r) {
                    in_process_transport t(world, r);
                    octet::compressed_allreduce_host(t, codec, octet::span<float>(grads[r].data(), n), options(r));
                });
            }
        } else if (o.procs) {
            o.procs->allgather(grads[0].data(), n * sizeof(float), gathered.data());
            std::copy_n(gathered.begin(), n, grads[0].begin());
            for (int r = 1; r < P; ++r)
                for (std::size_t i = 0; i < n; ++i) grads[0][i] += gathered[static_cast<std::size_t>(r) * n + i];
        } else {
            for (int r = 1; r < P; ++r)
                for (std::size_t i = 0; i < n; ++i) grads[0][i] += grads[r][i];
        }
        double sq = 0;
        const float inv = 1.0f / static_cast<float>(P);
        for (std::size_t i = 0; i < n; ++i) {
            grads[0][i] *= inv;
            sq += static_cast<double>(grads[0][i]) * grads[0][i];
        }
        s.norm = std::sqrt(sq);
        op_seconds["allreduce"] += seconds_since(t0);
        return s;
    };
    auto measure = [&](std::int64_t step, const step_numbers& s) {
        checks.measure(c_nonfinite, step, [&] {
            std::size_t bad = 0;
            for (std::size_t i = 0; i < n; ++i) bad += !std::isfinite(grads[0][i]);
            return static_cast<double>(bad);
        });
        checks.measure(c_spike, step, [&] {
            if (clean_norms.size() < 20) return 1.0;
            const std::vector<double> last(clean_norms.end() - 20, clean_norms.end());
            return s.norm / std::max(median_of(last), 1e-30);
        });
        checks.measure(c_saturation, step, [&] {
            return s.quantized ? static_cast<double>(s.saturated) / static_cast<double>(s.quantized) : 0.0;
        });
        checks.measure(c_residual, step, [&] {
            double m = 0;
            for (double v : s.residual) m = std::max(m, v);
            return m;
        });
    };

    // What a repeated step must restore besides the weights (which no attempt has changed yet):
    // the codec's error-feedback residuals, which every attempt's encode updates. Without this a
    // corrupted first attempt would live on in the residuals and poison the repeat.
    std::vector<metered_vector<std::uint8_t>> pre_step_feedback;
    auto residual_views = [&] {
        std::vector<octet::residual_view> v;
        for (auto* set : {&feedback, &reduced_feedback})
            for (auto& fb : *set) v.push_back(fb.view());
        return v;
    };
    for (const auto& v : residual_views())
        pre_step_feedback.push_back(make_metered<std::uint8_t>(meter, memory_category::temporaries, v.bytes()));
    auto keep_feedback = [&] {
        const auto views = residual_views();
        for (std::size_t i = 0; i < views.size(); ++i)
            std::copy(views[i].data, views[i].data + views[i].bytes(), pre_step_feedback[i].data());
    };
    auto restore_feedback = [&] {
        const auto views = residual_views();
        for (std::size_t i = 0; i < views.size(); ++i)
            std::copy(pre_step_feedback[i].begin(), pre_step_feedback[i].end(), views[i].data);
    };

    // Checkpoints: the optimizer (octet's checkpoint format, a file) and the codec's residuals (a
    // second file beside it, their bytes as they are: nothing of the checkpoint stays in memory).
    const std::string ckpt_path = checkpoint_path(o.scratch, o.procs);
    const std::string feedback_path = ckpt_path + ".feedback";
    std::int64_t ckpt_step = -1;
    auto save_checkpoint = [&](std::int64_t step) {
        opt->save(ckpt_path);
        if (rc.gradient_codec) {
            std::FILE* f = std::fopen(feedback_path.c_str(), "wb");
            OCTET_REQUIRE(f != nullptr, "example_08_training", "--out",
                          "names a folder where the checkpoint's residual file cannot be written: " + feedback_path);
            bool ok = true;
            for (const auto& v : residual_views()) ok = ok && std::fwrite(v.data, 1, v.bytes(), f) == v.bytes();
            ok = std::fclose(f) == 0 && ok;
            OCTET_REQUIRE(ok, "example_08_training", "--out", "could not write " + feedback_path);
        }
        ckpt_step = step;
    };
    auto load_checkpoint = [&] {
        opt->load(ckpt_path);
        opt->weights(octet::span<float>(params.data(), n));
        if (rc.gradient_codec) {
            std::FILE* f = std::fopen(feedback_path.c_str(), "rb");
            OCTET_REQUIRE(f != nullptr, "example_08_training", "checkpoint", "has no residual file " + feedback_path);
            bool ok = true;
            for (const auto& v : residual_views()) ok = ok && std::fread(v.data, 1, v.bytes(), f) == v.bytes();
            std::fclose(f);
            OCTET_REQUIRE(ok, "example_08_training", "checkpoint", "has a short residual file " + feedback_path);
        }
        return ckpt_step;
    };

    // Recovery: a tripped check repeats the step at higher precision (every linear and attention
    // in float32) before anything is applied; a step that still trips reloads the last checkpoint.
    step_numbers current;
    octet::recovery_callbacks cb;
    int raised_steps = 0;  // steps repeated at float32 (their float copies are in the peak)
    cb.repeat_step = [&](std::int64_t step) {
        ++raised_steps;
        restore_feedback();
        current = compute(step, true);
        measure(step, current);
        return 0.0;
    };
    cb.reload_checkpoint = [&] {
        const std::int64_t c = load_checkpoint();
        return octet::reload_result{c, static_cast<double>(n) * 4.0};
    };
    octet::recovery_config rcfg;
    rcfg.ladder = {octet::recovery_action::repeat_step, octet::recovery_action::reload_checkpoint};
    rcfg.non_finite_ladder = rcfg.ladder;
    octet::recovery_policy policy(rcfg, cb);

    // The loop.
    const int eval_every = std::max(1, o.steps / std::max(1, o.eval_points));
    const double tokens_per_step = static_cast<double>(o.batch) * mc.seq_len;
    res.train_loss.assign(static_cast<std::size_t>(o.steps), not_measured);
    res.saturation_rate.assign(static_cast<std::size_t>(o.steps), 0.0);
    res.underflow_rate.assign(static_cast<std::size_t>(o.steps), 0.0);
    res.attention_residual.assign(static_cast<std::size_t>(o.steps), {});
    res.attention_residual_q.assign(static_cast<std::size_t>(o.steps), {});
    double wall = 0, executed_tokens = 0, crash_seconds = 0;
    std::int64_t replay_until = -1;
    save_checkpoint(-1);
    for (std::int64_t step = 0; step < o.steps;) {
        const auto t0 = clock_type::now();
        if (step == crash_step && !crash_done) {
            // The scripted crash: the process state is lost; the run restarts from the last checkpoint
            // (the optimizer and the codec's residuals). The models' own state (delayed-scaling
            // histories, stochastic-rounding step counters) is not checkpointed: the replay goes on
            // with it as it stands, so a replayed step is not bit-identical to its first run.
            crash_done = true;
            const std::int64_t c = load_checkpoint();
            ++res.restarts;
            replay_until = step - 1;
            crash_seconds += seconds_since(t0);
            res.recoveries.push_back({step, "reload_checkpoint",
                                      "scripted crash at step " + std::to_string(step) +
                                          ": restart from the checkpoint of step " + std::to_string(c),
                                      0.0});
            wall += seconds_since(t0);
            step = c + 1;
            continue;
        }
        if (step == 1 && o.fail_rank >= first && o.fail_rank < first + L)
            throw std::runtime_error("the failure OCTET_TRAINING_FAIL_RANK=" + std::to_string(o.fail_rank) +
                                     " asked for, at step 1");
        keep_feedback();
        current = compute(step, false);
        measure(step, current);
        const double step_secs = seconds_since(t0);
        bool apply = true;
        std::int64_t next = step + 1;
        if (rc.recovery) {
            const auto outcome = policy.after_step(step, checks, step_secs);
            if (outcome.stop) {
                wall += seconds_since(t0);
                break;
            }
            if (outcome.action == octet::recovery_action::reload_checkpoint) apply = false;
            next = outcome.next_step;
        }
        if (apply) {
            const auto tu = clock_type::now();
            double scale = 1.0;
            if (current.norm > o.clip) {
                ++res.clip_crossings;
                scale = o.clip / current.norm;
            }
            if (scale != 1.0)
                for (std::size_t i = 0; i < n; ++i) grads[0][i] *= static_cast<float>(scale);
            opt->step(o.ex, octet::span<const float>(grads[0].data(), n), learning_rate(o, step));
            opt->weights(octet::span<float>(params.data(), n));
            op_seconds["optimizer"] += seconds_since(tu);
            if (std::isfinite(current.norm)) clean_norms.push_back(current.norm);
            const auto si = static_cast<std::size_t>(step);
            res.train_loss[si] = current.loss;
            const double q = std::max<double>(1.0, static_cast<double>(current.quantized));
            res.saturation_rate[si] = static_cast<double>(current.saturated) / q;
            res.underflow_rate[si] = static_cast<double>(current.underflow) / q;
            res.attention_residual[si] = current.residual;
            res.attention_residual_q[si] = current.residual_q;
            if ((step + 1) % checkpoint_every == 0) save_checkpoint(step);
        }
        const double secs = seconds_since(t0);
        wall += secs;
        if (step <= replay_until) crash_seconds += secs;
        executed_tokens += tokens_per_step;
        advanced(1.0);
        step = next;
        if (lead && apply && ((step % eval_every) == 0 || step == o.steps)) {
            res.heldout.emplace_back(static_cast<int>(step), evaluate());
        }
    }
    if (!res.recoveries.empty() && res.recoveries.front().action == "reload_checkpoint")
        res.recoveries.front().seconds = crash_seconds;
    for (const auto& e : policy.log().entries())
        res.recoveries.push_back({e.step, octet::recovery_action_name(e.action), e.reason, e.seconds});
    res.restarts += static_cast<int>(policy.log().restarts());

    res.wall_seconds = wall;
    res.tokens_per_second = wall > 0 ? executed_tokens / wall : 0;
    res.op_seconds = op_seconds;
    for (const auto& [k, v] : sum_over_ranks(model_seconds, o.procs)) res.op_seconds[k] += v;
    res.monitor_seconds = checks.cost_seconds();
    res.monitor_overhead = wall > 0 ? res.monitor_seconds / wall : 0;
    // Final training loss: mean of the last 10% of the steps applied.
    {
        double s = 0;
        int k = 0;
        for (int i = o.steps - std::max(1, o.steps / 10); i < o.steps; ++i)
            if (std::isfinite(res.train_loss[static_cast<std::size_t>(i)]))
                s += res.train_loss[static_cast<std::size_t>(i)], ++k;
        res.final_train_loss = k ? s / k : not_measured;
    }
    res.final_heldout_loss = res.heldout.empty() ? not_measured : res.heldout.back().second;
    res.heldout_bpc = res.final_heldout_loss / std::log(2.0);
    if (lead && !o.save_model.empty())
        write_model_file(o.save_model, mc, std::vector<float>(params.begin(), params.begin() + n));
    if (lead) {
        std::vector<std::int32_t> prompt;
        for (char c : std::string("And God said, ")) prompt.push_back(data.id(c));
        res.sample = data.text(models[0]->generate(octet::span<const float>(params.data(), n), prompt, 160,
                                                   static_cast<std::uint64_t>(o.seed), 0.8f));
    }

    // Memory: the meter's peaks, and the ledger's prediction for the same configuration.
    const auto& led = meter.ledger();
    res.peak_bytes_measured = led.peak_total();
    for (int c = 0; c < octet::memory_category_count; ++c) {
        const auto cat = static_cast<memory_category>(c);
        res.peak_bytes_by_category[octet::memory_category_name(cat)] = led.peak(cat);
    }
    // The prediction is written from the configuration (octet's bytes per parameter, the model's
    // buffer plan, the codec's encoded size), not from the meter.
    // Under mpirun both count this process (rank `first`) alone.
    const double tokens_bytes = 4.0 * (static_cast<double>(L) * per_rank + o.eval_sequences) * (mc.seq_len + 1);
    double codec_bytes = 0, residual_bytes = 0;
    if (rc.gradient_codec) {
        for (int r = first; r < first + L; ++r) codec_bytes += static_cast<double>(allreduce_scratch(r));
        for (int r = first; r < first + L; ++r)
            residual_bytes +=
                static_cast<double>(octet::residual_bytes(rc.residuals, n) +
                                    octet::residual_bytes(rc.residuals, octet::allreduce_shard(codec, n, P, r).count));
    }
    octet::optimizer_memory_config lc = optimizer_ledger_config(rc, static_cast<double>(n));
    // A float gradient per rank here, the residuals, and under mpirun without the codec the
    // all-gathered gradients of every rank.
    lc.gradient_bytes =
        4.0 * L + residual_bytes / static_cast<double>(n) + (o.procs && !rc.gradient_codec ? 4.0 * P : 0.0);
    // Every rank's model; where the recovery log has a repeated step, one of them at a time ran it
    // raised to float32 with the float copies that needs (an event of the run, not of its
    // configuration: a check trips or not; sampling the generated text keeps nothing per layer).
    lc.activation_bytes = L * transformer::activation_bytes(mc, rc, per_rank, o.threads) +
                          (raised_steps > 0 ? transformer::raise_precision_bytes(mc, rc, per_rank) : 0.0);
    // Temporaries: the models' own and their one set of step buffers, the token batches, the codec's
    // messages, and the copy of the residuals a repeated step restores (the checkpoint's is in its file).
    lc.temporary_bytes = L * transformer::temporary_bytes(mc, rc, per_rank, o.threads) -
                         (L - 1) * transformer::step_buffer_bytes(mc, rc, per_rank, o.threads) + tokens_bytes +
                         codec_bytes + residual_bytes;
    octet::memory_ledger predicted = octet::optimizer_memory_ledger(lc);
    predicted.set(memory_category::weights, predicted.bytes(memory_category::weights) + 4.0 * n);  // the float copy
    for (int c = 0; c < octet::memory_category_count; ++c) {
        const auto cat = static_cast<memory_category>(c);
        res.ledger_bytes[octet::memory_category_name(cat)] = predicted.bytes(cat);
    }
    res.ledger_peak_bytes = predicted.total();
    return res;
}

// ------------------------------------------------------------------------------------------------
// Flags and the sweep.

struct flags {
    std::string preset = "quick";
    std::vector<std::string> recipes, sizes;
    std::vector<int> seeds, steps;
    int ranks = 2, threads = 0, batch = 16, comparison_seeds = 1;
    float lr = 3e-3f, tolerance = 0.05f;
    bool faults = true, help = false, save_models = false;
    std::string out = "training_report", corpus = OCTET_TRAINING_CORPUS;
    std::string linears = "host";
};

const char* usage =
    "usage: example_08_training [--preset quick|full|memory] [--recipes a,b,...] [--seeds 0,1,2] [--steps 200,400]\n"
    "                           [--sizes tiny,small] [--ranks N] [--batch N] [--threads N] [--lr X]\n"
    "                           [--tolerance NATS] [--no-faults] [--out FOLDER] [--corpus FILE]\n"
    "                           [--linears host|cuda]\n"
    "  --preset quick  (default) recipes fp32,octet,octet_no_recovery; seeds 0,1,2; 150 steps; size tiny\n"
    "  --preset full   every recipe; seeds 0,1,2; 150 and 300 steps; sizes tiny and small (about 2 h 10 min on 2 "
    "cores)\n"
    "  --preset memory recipes fp32,fp8_blockwise,attn_fp8,act_fp8,optim_8bit,grad_codec,octet; seeds 0,1,2;\n"
    "                  150 steps; size medium; batch 32; no injected faults (each memory mechanism alone, then all)\n"
    "  --recipes       any of: fp32 bf16 fp8_delayed fp8_tensorwise fp8_blockwise mxfp8 nvfp4 attn_fp8\n"
    "                  attn_matched_per_token_v attn_from_output_per_token_v optim_8bit grad_codec act_fp8 octet\n"
    "                  octet_no_recovery fp32_no_recovery\n"
    "  --ranks         data-parallel ranks (the batch is split over them; default 2): threads of this\n"
    "                  process, or under mpirun (when built with MPI) its processes, one rank each;\n"
    "                  there --ranks may be left out, or must equal the number of processes\n"
    "  --tolerance     largest accepted held-out loss gap to fp32, nats per character (default 0.05)\n"
    "  --comparison-seeds N  runs without recovery (the *_no_recovery recipes) on the first N seeds only\n"
    "                  (default 1: they show what recovery prevents, not a recipe to judge)\n"
    "  --no-faults     no injected gradient corruption and no scripted crash\n"
    "  --save-models   write each run's final weights to FOLDER/models/SIZE_RECIPE_STEPS_seedN.bin\n"
    "                  (model_file.hpp; examples/09_rl starts from one with --init)\n"
    "  --out           output folder for report.md, report.json and the SVG plots (default training_report)\n"
    "  --linears cuda  the FP8 linear layers on the CUDA GPU (a build with CUDA; every other part of the\n"
    "                  step stays on the host; not nvfp4): X, W and dY go to the device, Y, dX, dW come back\n";

/// `processes`: the size of the MPI world this process is a rank of (0: not started by mpirun).
flags parse_flags(int argc, char** argv, int processes = 0) {
    flags f;
    bool ranks_given = false, batch_given = false;
    auto need = [&](int& i) -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(std::string(argv[i]) + " needs a value");
        return argv[++i];
    };
    auto ints = [](const std::string& flag, const std::string& v) {
        std::vector<int> out;
        for (const auto& s : split(v)) {
            char* end = nullptr;
            const long x = std::strtol(s.c_str(), &end, 10);
            if (*end || x < 0) throw std::invalid_argument(flag + ": '" + s + "' is not a non-negative integer");
            out.push_back(static_cast<int>(x));
        }
        return out;
    };
    std::vector<std::string> recipes, sizes;
    std::vector<int> seeds, steps;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            f.help = true;
            return f;
        } else if (a == "--preset") {
            f.preset = need(i);
            if (f.preset != "quick" && f.preset != "full" && f.preset != "memory")
                throw std::invalid_argument("--preset: '" + f.preset + "' (use quick, full or memory)");
        } else if (a == "--recipes") {
            recipes = split(need(i));
        } else if (a == "--sizes") {
            sizes = split(need(i));
        } else if (a == "--seeds") {
            seeds = ints(a, need(i));
        } else if (a == "--steps") {
            steps = ints(a, need(i));
        } else if (a == "--ranks") {
            f.ranks = ints(a, need(i)).at(0);
            ranks_given = true;
        } else if (a == "--batch") {
            f.batch = ints(a, need(i)).at(0);
            batch_given = true;
        } else if (a == "--threads") {
            f.threads = ints(a, need(i)).at(0);
        } else if (a == "--lr") {
            f.lr = std::strtof(need(i).c_str(), nullptr);
        } else if (a == "--comparison-seeds") {
            f.comparison_seeds = ints(a, need(i)).at(0);
        } else if (a == "--tolerance") {
            f.tolerance = std::strtof(need(i).c_str(), nullptr);
        } else if (a == "--save-models") {
            f.save_models = true;
        } else if (a == "--no-faults") {
            f.faults = false;
        } else if (a == "--out") {
            f.out = need(i);
        } else if (a == "--corpus") {
            f.corpus = need(i);
        } else if (a == "--linears") {
            f.linears = need(i);
            if (f.linears != "host" && f.linears != "cuda")
                throw std::invalid_argument("--linears: '" + f.linears + "' (use host or cuda)");
        } else {
            throw std::invalid_argument("unknown flag " + a);
        }
    }
    if (f.preset == "quick") {
        f.recipes = {"fp32", "octet", "octet_no_recovery"};
        f.sizes = {"tiny"};
        f.seeds = {0, 1, 2};
        f.steps = {150};
    } else if (f.preset == "memory") {
        // Proportions nearer real training: the largest size at twice the default batch, so that
        // weights and optimizer state weigh beside the activations; each memory mechanism alone,
        // then all of octet; the quick default's length, so each has its loss cost beside it.
        f.recipes = {"fp32", "fp8_blockwise", "attn_fp8", "act_fp8", "optim_8bit", "grad_codec", "octet"};
        f.sizes = {"medium"};
        f.seeds = {0, 1, 2};
        f.steps = {150};
        if (!batch_given) f.batch = 32;
        // A training step's memory: no injected faults, so no repeated step raised to float32
        // (its float copies, the recovery's cost, are the quick default's to show).
        f.faults = false;
    } else {
        for (const auto& r : all_recipes()) f.recipes.push_back(r.name);
        f.sizes = {"tiny", "small"};
        f.seeds = {0, 1, 2};
        f.steps = {150, 300};
    }
    if (!recipes.empty()) f.recipes = recipes;
    if (!sizes.empty()) f.sizes = sizes;
    if (!seeds.empty()) f.seeds = seeds;
    if (!steps.empty()) f.steps = steps;
    if (processes > 0) {
        if (ranks_given && f.ranks != processes)
            throw std::invalid_argument(
                "--ranks " + std::to_string(f.ranks) + " under mpirun with " + std::to_string(processes) +
                " processes: each process is one rank; pass --ranks " + std::to_string(processes) + " or leave it out");
        f.ranks = processes;
    }
    if (f.ranks < 1) throw std::invalid_argument("--ranks must be at least 1");
    if (f.batch < f.ranks || f.batch % f.ranks)
        throw std::invalid_argument(
            "--batch must be a positive multiple of --ranks (each rank gets batch / ranks sequences)");
    for (int s : f.steps)
        if (s < 10) throw std::invalid_argument("--steps: each length must be at least 10");
    if (f.lr <= 0 || !std::isfinite(f.lr)) throw std::invalid_argument("--lr must be a positive number");
    if (!(f.tolerance > 0) || !std::isfinite(f.tolerance))
        throw std::invalid_argument("--tolerance must be a positive number");
    return f;
}

/// The program. `procs`: the processes' ranks under mpirun (nullptr: the ranks are threads of this
/// process). Rank 0 alone prints and writes the report; every rank returns the same exit status.
int run_program(int argc, char** argv, process_ranks* procs) {
    const int rank = procs ? procs->rank() : 0;
    const bool lead = rank == 0;
    flags f;
    try {
        f = parse_flags(argc, argv, procs ? procs->size() : 0);
    } catch (const std::exception& e) {
        // Every rank parses the same flags and fails alike; rank 0 says why.
        if (lead) std::fprintf(stderr, "example_08_training: %s\n%s", e.what(), usage);
        return 2;
    }
    if (f.help) {
        if (lead) std::fputs(usage, stdout);
        return 0;
    }
    const auto wall0 = clock_type::now();
    // Processes of one mpirun on one machine share its cores.
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int threads = f.threads > 0 ? f.threads : std::max(1, cores / (procs ? procs->processes_here() : 1));
    octet::thread_pool pool(static_cast<std::size_t>(threads));
    const octet::host_executor ex = octet::on_host(pool);

    sweep_result sweep;
    for (int i = 0; i < argc; ++i) sweep.command += (i ? " " : "") + std::string(argv[i]);
    sweep.machine = report_detail::machine_description(threads);
    if (procs)
        sweep.machine += " per process; " + std::to_string(procs->size()) +
                         " MPI processes, one rank each (times and memory: rank 0's process)";

    // 1. The gate, on every rank: each process checks the numerics it will train with (the ranks
    // of one mpirun may run on different machines); one failure stops every rank.
    if (lead) std::printf("octet %s training demo: gate ...\n", OCTET_VERSION_STRING);
    sweep.gate = run_gate(ex, 20261202u);
    const bool gate_ok = gate_passed(sweep.gate);
    for (const auto& g : sweep.gate) {
        if (lead)
            std::printf("  %-4s %-44s %.3g (limit %.3g)\n", g.passed ? "ok" : "FAIL", g.name.c_str(), g.value, g.limit);
        else if (!g.passed)
            std::fprintf(stderr, "example_08_training: rank %d: gate FAIL %s %.3g (limit %.3g)\n", rank, g.name.c_str(),
                         g.value, g.limit);
    }
    const int failed_rank = procs ? procs->allreduce_max(gate_ok ? -1 : rank) : (gate_ok ? -1 : 0);
    if (failed_rank >= 0) {
        sweep.passed = false;
        sweep.verdicts.push_back(procs ? "the gate failed on rank " + std::to_string(failed_rank) +
                                             " (the highest failing rank): no training was run"
                                       : "the gate failed: no training was run");
        if (lead) {
            write_report(sweep, f.out);
            std::printf("The gate failed; the run refuses to train. Report: %s/report.md\n", f.out.c_str());
        }
        return 1;
    }

    // The corpus and the output folder are each process's own (one machine may lack the file):
    // the ranks agree before any of them starts training.
    corpus data;
    std::vector<recipe_config> recipes;
    std::string problem;
    try {
        data = load_corpus(f.corpus);
        const auto known = all_recipes();
        for (const auto& name : f.recipes) {
            auto it = std::find_if(known.begin(), known.end(), [&](const recipe_config& r) { return r.name == name; });
            if (it == known.end()) throw std::invalid_argument("--recipes: unknown recipe '" + name + "'");
            recipes.push_back(*it);
        }
        for (const auto& s : f.sizes) size_config(s);
        if (f.linears == "cuda") {
#if TRAIN_HAS_CUDA_LINEARS
            std::string why;
            const std::string gpu = train::cuda_linear_device(&why);
            if (gpu.empty()) throw std::invalid_argument("--linears cuda: " + why);
            for (auto& r : recipes) {
                const std::string refusal = train::cuda_linear_refusal(r.linear);
                if (!refusal.empty()) throw std::invalid_argument("--linears cuda: recipe " + r.name + ": " + refusal);
                r.make_linear = &train::make_cuda_linear_layer;
            }
            sweep.machine += "; FP8 linears on CUDA (" + gpu + ")";
#else
            throw std::invalid_argument(
                "--linears cuda: this build has no CUDA (configure with -DOCTET_ENABLE_CUDA=ON)");
#endif
        }
        std::filesystem::create_directories(f.out);
    } catch (const std::exception& e) {
        problem = e.what();
    }
    const int failed = procs ? procs->allreduce_max(!problem.empty()) : !problem.empty();
    if (failed) {
        if (!problem.empty())
            std::fprintf(stderr, "example_08_training: %s%s\n%s",
                         procs ? ("rank " + std::to_string(rank) + ": ").c_str() : "", problem.c_str(),
                         lead ? usage : "");
        else if (lead)
            std::fprintf(stderr, "example_08_training: another rank could not start (its message says why)\n");
        return 2;
    }

    // 2.-4. Every (size, length, recipe, seed).
    double total_steps = 0;
    for (std::size_t s = 0; s < f.sizes.size(); ++s)
        for (int st : f.steps)
            for (const auto& rc : recipes)
                total_steps +=
                    static_cast<double>(st) *
                    (rc.recovery ? f.seeds.size()
                                 : std::min<std::size_t>(f.seeds.size(), static_cast<std::size_t>(f.comparison_seeds)));
    if (lead)
        std::printf(
            "training: %zu recipes x %zu seeds x %zu lengths x %zu sizes on %s (%zu characters, %zu held out)\n",
            recipes.size(), f.seeds.size(), f.steps.size(), f.sizes.size(), sweep.machine.c_str(),
            data.train.size() + data.heldout.size(), data.heldout.size());
    // A test hook: this rank throws at step 1 of its first run (the test that an error on one rank
    // ends every rank with its message, instead of leaving the others blocked in a collective).
    const char* fail_env = std::getenv("OCTET_TRAINING_FAIL_RANK");
    const int fail_rank = fail_env ? std::atoi(fail_env) : -1;
    progress bar(total_steps, lead ? stdout : nullptr, /*plain=*/procs != nullptr);
    for (const auto& size_name : f.sizes) {
        model_config mc = size_config(size_name);
        mc.vocab = static_cast<int>(data.alphabet.size());
        for (int steps : f.steps)
            for (const auto& rc : recipes)
                for (std::size_t si = 0; si < f.seeds.size(); ++si) {
                    const int seed = f.seeds[si];
                    if (!rc.recovery && static_cast<int>(si) >= f.comparison_seeds) continue;
                    run_options o;
                    o.size = mc, o.recipe = rc, o.seed = seed, o.steps = steps, o.ranks = f.ranks;
                    o.batch = f.batch, o.lr = f.lr, o.faults = f.faults, o.ex = ex, o.threads = threads;
                    o.scratch = f.out, o.procs = procs, o.fail_rank = fail_rank;
                    if (f.save_models) {
                        std::filesystem::create_directories(f.out + "/models");
                        o.save_model = f.out + "/models/" + size_name + "_" + rc.name + "_" + std::to_string(steps) +
                                       "_seed" + std::to_string(seed) + ".bin";
                    }
                    const std::string label =
                        size_name + " " + std::to_string(steps) + " steps " + rc.name + " seed " + std::to_string(seed);
                    run_result r = run_one(o, data, [&](double units) { bar.advance(units, label); });
                    sweep.runs.push_back(std::move(r));
                }
    }
    bar.finish();
    std::filesystem::remove(checkpoint_path(f.out, procs));
    if (!lead) return procs->allreduce_max(0);  // rank 0's exit status

    // Verdicts: each low-precision recipe against fp32 on the same seeds, size and length.
    // Tolerance: the held-out loss gap, mean over seeds, paired by seed (see docs/training-report.md: it is the
    // seed-to-seed spread of float32 itself at these lengths that sets what "the same" can mean).
    sweep.tolerance_nats = f.tolerance;
    {
        // float32's own seed-to-seed spread in this sweep: what "the same" can mean at these lengths.
        std::map<std::string, std::pair<double, double>> spread;  // size|steps -> (min, max) held-out loss
        for (const auto& r : sweep.runs)
            if (r.recipe == "fp32" && std::isfinite(r.final_heldout_loss)) {
                auto key = r.size + " " + std::to_string(r.steps) + " steps";
                auto it = spread.emplace(key, std::make_pair(r.final_heldout_loss, r.final_heldout_loss)).first;
                it->second.first = std::min(it->second.first, r.final_heldout_loss);
                it->second.second = std::max(it->second.second, r.final_heldout_loss);
            }
        std::ostringstream why;
        why << "mean over seeds of (held-out loss of the recipe - held-out loss of fp32 on the same seed), nats per "
               "character, must not exceed "
            << f.tolerance << "; for scale, float32's own held-out loss spans";
        for (const auto& [key, mm] : spread) why << " " << (mm.second - mm.first) << " over seeds (" << key << ");";
        why << " a gap below the tolerance but above that spread is a measured cost, not noise";
        sweep.tolerance_reason = why.str();
    }
    std::map<std::string, std::pair<double, int>> gaps;  // key: recipe|size|steps
    for (const auto& r : sweep.runs) {
        if (r.recipe == "fp32") continue;
        for (const auto& b : sweep.runs)
            if (b.recipe == "fp32" && b.size == r.size && b.steps == r.steps && b.seed == r.seed) {
                auto& g = gaps[r.recipe + "|" + r.size + "|" + std::to_string(r.steps)];
                g.first += r.final_heldout_loss - b.final_heldout_loss;
                g.second += 1;
            }
    }
    for (const auto& [key, g] : gaps) {
        const double mean = g.first / g.second;
        const std::string recipe = key.substr(0, key.find('|'));
        const bool within = std::isfinite(mean) && mean <= sweep.tolerance_nats;
        const auto rc =
            std::find_if(recipes.begin(), recipes.end(), [&](const recipe_config& c) { return c.name == recipe; });
        const bool judged = rc != recipes.end() && is_low_precision(*rc) && rc->recovery;
        char line[256];
        std::snprintf(line, sizeof line, "%s (%s): held-out gap to fp32 %+.4f nats/char over %d seeds: %s",
                      recipe.c_str(), key.substr(key.find('|') + 1).c_str(), mean, g.second,
                      !judged  ? "not judged (a comparison run)"
                      : within ? "within tolerance"
                               : "BEYOND tolerance");
        sweep.verdicts.push_back(line);
        if (judged && !within) sweep.passed = false;
    }
    sweep.wall_seconds = seconds_since(wall0);
    write_report(sweep, f.out);

    std::printf("\n");
    for (const auto& v : sweep.verdicts) std::printf("  %s\n", v.c_str());
    std::printf("\nreport: %s/report.md, %s/report.json, plots %s/*.svg (%.0f s)\n", f.out.c_str(), f.out.c_str(),
                f.out.c_str(), sweep.wall_seconds);
    const int status = sweep.passed ? 0 : 1;
    return procs ? procs->allreduce_max(status) : status;
}

}  // namespace train

int main(int argc, char** argv) {
#ifdef OCTET_TRAINING_MPI
    // Under mpirun (with more than one process) each process is one rank; otherwise the ranks are
    // threads of this process and MPI is never initialized.
    std::unique_ptr<train::mpi_session> session;
    std::unique_ptr<train::mpi_ranks> procs;
    try {
        if (train::started_by_mpi_launcher()) {
            session = std::make_unique<train::mpi_session>(argc, argv);
            procs = std::make_unique<train::mpi_ranks>();
            if (procs->size() == 1) procs.reset();  // mpirun -n 1: in-process ranks
        }
        return train::run_program(argc, argv, procs.get());
    } catch (const std::exception& e) {
        if (!procs) {
            std::fprintf(stderr, "example_08_training: %s\n", e.what());
            return 1;
        }
        // The other ranks may wait in a collective for this one: end them all.
        std::fprintf(stderr, "example_08_training: rank %d of %d: %s; ending every rank\n", procs->rank(),
                     procs->size(), e.what());
        std::fflush(stderr);
        train::abort_all_ranks(1);
    }
#else
    try {
        return train::run_program(argc, argv, nullptr);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "example_08_training: %s\n", e.what());
        return 1;
    }
#endif
}
