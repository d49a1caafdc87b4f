// examples/09_rl/records.hpp: what the RL program measures, per step and per run, and what its
// report (report.hpp: report.md, report.json, SVG plots) is written from. Every field is filled
// from the run that reports it.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace rl {

inline constexpr double not_measured = std::numeric_limits<double>::quiet_NaN();

/// The variants compared side by side (one run per variant and seed).
///   float_rollout    rollouts from a float32 copy of the policy (float KV cache): no mismatch
///                    beyond the order of float operations
///   fp8_nominal      rollouts from an FP8 copy (linears in an FP8 recipe, Q/K/V and the KV
///                    cache in E4M3 with one scale per token and head), nominal clip bounds
///   fp8_calibrated   the same rollouts, clip bounds from octet::calibrated_clipping
///   fp8_tis          the same rollouts, PPO ratio against the trainer's own log-probabilities
///                    and the mismatch corrected by truncated importance weights
///                    min(pi_trainer / pi_rollout, C) (what RL pipelines use today)
inline const char* const variant_names[] = {"float_rollout", "fp8_nominal", "fp8_calibrated", "fp8_tis"};

/// One RL step (one batch of rollouts and its updates).
struct step_record {
    int step = 0;
    // the task
    double reward_mean = 0;      ///< mean reward over the step's completions
    double solved_fraction = 0;  ///< completions that satisfy the rule exactly
    // the policy
    double entropy_rollout = 0;  ///< mean per-token entropy of the rollout policy's distributions, nats
    double entropy_trainer = 0;  ///< the same tokens under the trainer's distributions (before the update), nats
    // training-inference mismatch on the completion tokens, d = logp_trainer - logp_rollout, both
    // at the policy that generated the batch (before the update)
    double log_ratio_mean = 0, log_ratio_std = 0, log_ratio_abs_max = 0;
    double log_ratio_q01 = 0, log_ratio_q10 = 0, log_ratio_q50 = 0, log_ratio_q90 = 0, log_ratio_q99 = 0;
    // clipping in the update (every epoch's tokens), by the advantage's sign
    std::uint64_t tokens = 0;                ///< completion tokens in the batch (per epoch)
    double clip_fraction_negative = 0;       ///< A < 0 tokens below the lower bound (penalty gradient cut)
    double clip_fraction_positive = 0;       ///< A > 0 tokens above the upper bound (reward gradient cut)
    double clip_fraction_negative_high = 0;  ///< the same, had the ratios been computed against the
    double clip_fraction_positive_high = 0;  ///< trainer's log-probabilities (no mismatch)
    float clip_lower = 0, clip_upper = 0;    ///< the bounds the last epoch used (nominal or calibrated)
    // rounding-caused threshold crossings, summed over the step's epochs
    // (octet::threshold_crossings_from_ratios: low = the ratio the update used, against its bounds;
    // high = exp(logp_new - logp_trainer), the ratio without the mismatch, against the nominal bounds)
    std::uint64_t crossings_negative_pushed_below = 0;       ///< A < 0, inside without mismatch, below with it
    std::uint64_t crossings_negative_pushed_out = 0;         ///< A < 0, inside without mismatch, outside with it
    std::uint64_t crossings_positive_pushed_above = 0;       ///< A > 0, inside without mismatch, above with it
    std::uint64_t crossings_region_changed = 0;              ///< any sign: region differs
    std::uint64_t crossings_branch_changed = 0;              ///< any sign: the surrogate's branch differs
    std::uint64_t tokens_negative = 0, tokens_positive = 0;  ///< finite tokens of each sign (per epoch)
    // truncated importance sampling (fp8_tis only)
    double tis_truncated_fraction = 0;  ///< tokens whose importance weight hit the cap
    // time, this step only (recoveries are booked in run_result)
    double rollout_seconds = 0;            ///< generating the completions (prefill included)
    double update_seconds = 0;             ///< scoring, surrogate, backward and optimizer, every epoch
    double calibration_seconds = 0;        ///< octet::calibrated_clipping's own time this step (fp8_calibrated)
    double monitor_seconds = 0;            ///< the checks
    double rollout_tokens_per_second = 0;  ///< completion tokens generated / rollout_seconds
    double update_tokens_per_second = 0;   ///< sequence tokens scored and trained on (all epochs) / update_seconds
    double grad_norm = 0;                  ///< of the last epoch's gradient
    double lr = 0;                         ///< learning rate used (after any recovery's reduction)
    std::string monitor;                   ///< "ok", or the checks that tripped
};

/// One recovery intervention (octet::recovery_log entry, as the report shows it).
struct recovery_record {
    std::int64_t step = 0;
    std::string action;  ///< octet::recovery_action_name
    std::string reason;  ///< the checks, their values and limits
    double seconds = 0;  ///< its cost: the callback plus the replayed steps
    int replayed_steps = 0;
};

/// One run: one variant, one seed.
struct run_result {
    std::string variant;
    int seed = 0;
    std::vector<step_record> steps;
    // summaries over the run (means over the last quarter of the steps for the outcomes)
    double final_reward = not_measured;
    double final_solved_fraction = not_measured;
    double final_entropy = not_measured;
    double mean_abs_log_ratio = not_measured;  ///< over every step's completion tokens
    double clip_fraction_negative = not_measured, clip_fraction_positive = not_measured;  ///< means over steps
    std::uint64_t crossings_negative_pushed_below = 0, crossings_branch_changed = 0;      ///< totals over steps
    double rollout_tokens_per_second = 0;  ///< over the whole run's rollouts
    double update_tokens_per_second = 0;   ///< over the whole run's updates
    double wall_seconds = 0;               ///< the run's steps, recoveries and replays included
    // calibration (fp8_calibrated): octet::calibration_cost
    std::uint64_t calibration_updates = 0, calibration_references = 0;
    double calibration_seconds = 0;          ///< quantile matching + reference measurement
    double calibration_forward_seconds = 0;  ///< the high-precision forwards the references needed
    // monitors and recovery
    double monitor_seconds = 0;
    int restarts = 0;  ///< checkpoint reloads
    std::vector<recovery_record> recoveries;
    std::string sample;  ///< one prompt and the policy's completion after the run
};

/// The whole comparison.
struct sweep_result {
    std::string command, machine;
    // the task and the setup, as the report states them
    std::string task;  ///< one line: the rule and the reward
    int prompt_chars = 0, completion_chars = 0, prompts_per_step = 0, group_size = 0, epochs = 0, steps = 0;
    float clip_eps_low = 0, clip_eps_high = 0, tis_cap = 0;
    std::string rollout_recipe;  ///< the FP8 rollout copy's linear recipe, e.g. "fp8_blockwise"
    std::string trainer_recipe;  ///< "fp32"
    // the pretrained starting policy
    std::string pretrain_source;  ///< "pretrained here: N steps" or the checkpoint file read
    double pretrain_seconds = 0, pretrain_heldout_loss = not_measured;
    double parameters = 0;
    std::vector<run_result> runs;
    std::vector<std::string> findings;  ///< one line each: what differs between the variants, measured
    double wall_seconds = 0;
};

}  // namespace rl
