// examples/08_training/train.hpp: the training program's namespace and the records its report is
// written from (one run, the gate's checks, the whole sweep). The model, its sizes and recipes, the
// memory meter, the corpus and the report kit are the examples' shared library (examples/common,
// namespace common), whose names the program uses as its own.
#pragma once

#include "common/config.hpp"
#include "common/meter.hpp"
#include "common/report_text.hpp"

#include <octet/octet.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace train {

using namespace common;

/// One recovery intervention, as the report shows it.
struct recovery_event {
    std::int64_t step = 0;
    std::string action;  ///< recovery_action_name
    std::string reason;
    double seconds = 0;  ///< its cost, included in the run's time
};

/// Everything reported about one training run (one recipe, one seed, one size, one length).
struct run_result {
    std::string recipe, size;
    int seed = 0, steps = 0, ranks = 1;
    int local_ranks = 1;  ///< of them in this process (each with its own gradient; one set of weights)
    double parameters = 0;
    bool recovery = true;
    std::vector<double> train_loss;               ///< per step, nats per character
    std::vector<std::pair<int, double>> heldout;  ///< (step, held-out loss, nats per character)
    double final_train_loss = not_measured;       ///< mean of the last 10% of steps
    double final_heldout_loss = not_measured;     ///< nats per character
    double heldout_bpc = not_measured;            ///< bits per character
    double tokens_per_second = 0;                 ///< tokens of this run's own steps / their wall time
    double wall_seconds = 0;                      ///< this run's steps, recoveries included, evaluation excluded
    std::map<std::string, double> op_seconds;     ///< per operation, summed over the run's steps
    double peak_bytes_measured = 0;               ///< metered peak over the run
    std::map<std::string, double> peak_bytes_by_category;  ///< metered peak per ledger category
    std::map<std::string, double> ledger_bytes;            ///< the ledger's prediction per category
    double ledger_peak_bytes = 0;                          ///< the ledger's predicted total
    int restarts = 0;
    std::vector<recovery_event> recoveries;
    double monitor_seconds = 0, monitor_overhead = 0;     ///< checks' time, and its fraction of wall_seconds
    std::vector<double> saturation_rate, underflow_rate;  ///< per step: saturated / quantized, underflow / quantized
    int clip_crossings = 0;                               ///< steps whose gradient norm crossed the clipping threshold
    std::vector<std::vector<double>> attention_residual;  ///< [step][layer]
    std::vector<std::vector<double>> attention_residual_q;  ///< [step][layer]
    std::string sample;                                     ///< generated text after training
    // Mixture of experts (moe_blocks 0 and the rest empty for a dense model), over the applied steps
    int moe_blocks = 0, experts = 0, top_k = 0;
    std::vector<std::vector<double>> expert_tokens;  ///< [MoE block][expert]: assignments, all ranks, all steps
    double expert_imbalance = not_measured;      ///< mean over steps and blocks of max_e load / mean_e load (1: even)
    double expert_imbalance_max = not_measured;  ///< its largest value over steps and blocks
    double moe_dropped = 0;                      ///< assignments dropped (past an expert's capacity)
    double moe_aux_loss = not_measured;          ///< mean over steps of L_aux per block (1 when balanced)
    double dispatch_fp8_bytes = 0;               ///< per step, all ranks: the rows as FP8 codes and scales
    double dispatch_bf16_bytes = 0;              ///< per step, all ranks: the rows as bf16
};

/// One check of the validation gate.
struct gate_check {
    std::string name;  ///< e.g. "attention.row_sum_residual"
    double value = 0;  ///< what was measured
    double limit = 0;  ///< the largest acceptable value
    bool passed = false;
    std::string detail;  ///< what was measured, on what, and why the limit
};

/// The whole sweep, as report.md and report.json show it.
struct sweep_result {
    std::string command;  ///< the command line
    std::string machine;  ///< CPU model, threads
    std::vector<gate_check> gate;
    std::vector<run_result> runs;
    double tolerance_nats = 0;              ///< FP8 vs float32 held-out loss tolerance
    std::string reference_recipe = "fp32";  ///< the recipe the report measures each recipe's held-out gap against
    std::string tolerance_reason;
    std::vector<std::string> verdicts;  ///< one line per FP8 recipe: within tolerance or not, and by how much
    bool passed = true;                 ///< gate passed and every FP8 recipe within tolerance
    double wall_seconds = 0;
};

}  // namespace train
