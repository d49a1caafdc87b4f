// examples/08_training/report/markdown.hpp: report.md: the verdict first, then the gate, the summaries over seeds,
// every run, the memory section, the recovery events, the step time per operation and the samples.
#pragma once

#include "common.hpp"

#include <octet/octet.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace train {
namespace report_detail {

/// The "## Memory" section: each recipe's measured peak by category (its first run: memory does not
/// depend on the seed), the ratio of its peak to float32's and to bf16 mixed precision's (bf16_mixed)
/// at the same size (n/a where the sweep has no such run), the training state one rank holds per
/// parameter (weights, optimizer state and one rank's gradients with its residuals: the in-process
/// ranks share the weights and optimizer, each has its own gradient, as each process of an mpirun
/// holds all three), and the ledger's largest miss in any category.
inline std::string memory_section(const sweep_result& s) {
    const auto gs = groups_of(s);
    const auto cats = categories_of(s);
    auto at = [](const std::map<std::string, double>& m, const std::string& c) {
        auto it = m.find(c);
        return it == m.end() ? 0.0 : it->second;
    };
    std::ostringstream o;
    o << "\n## Memory\n\nPeak bytes by category as the meter counted them (every buffer of the run, octet's "
         "scratch included), the peak against float32's and bf16 mixed precision's at the same size, the "
         "training state one rank holds per parameter (weights, optimizer state, and its gradients with "
         "their residuals: the in-process ranks share weights and optimizer), and the ledger's largest "
         "miss in any category (|measured - predicted| / predicted).\n\n| recipe | size |";
    for (const auto& c : cats) o << " " << cell(c) << " |";
    o << " peak | x fp32 | x bf16_mixed | state bytes/param/rank | ledger miss |\n|---|---|";
    for (std::size_t i = 0; i < cats.size() + 5; ++i) o << "---|";
    o << "\n";
    std::vector<std::string> done;
    for (const auto& g : gs) {
        const std::string key = g.label() + "|" + g.size;
        if (std::find(done.begin(), done.end(), key) != done.end()) continue;
        done.push_back(key);
        const run_result& r = *g.runs.front();
        const run_result *f32 = nullptr, *mixed = nullptr;
        for (const auto& q : s.runs) {
            if (q.recipe == "fp32" && q.size == r.size && !f32) f32 = &q;
            if (q.recipe == "bf16_mixed" && q.size == r.size && !mixed) mixed = &q;
        }
        auto against = [&](const run_result* base) {
            return base && base->peak_bytes_measured > 0
                       ? printf_str("%.3f", r.peak_bytes_measured / base->peak_bytes_measured)
                       : std::string("n/a");
        };
        double miss = 0;
        for (const auto& c : cats) {
            const double m = at(r.peak_bytes_by_category, c), l = at(r.ledger_bytes, c);
            if (l > 0) miss = std::max(miss, std::fabs(m - l) / l);
        }
        const double state = at(r.peak_bytes_by_category, "weights") +
                             at(r.peak_bytes_by_category, "gradients") / std::max(1, r.local_ranks) +
                             at(r.peak_bytes_by_category, "optimizer_state");
        o << "| " << cell(g.label()) << " | " << cell(r.size) << " |";
        for (const auto& c : cats) o << " " << bytes_str(at(r.peak_bytes_by_category, c)) << " |";
        o << " " << bytes_str(r.peak_bytes_measured) << " | " << against(f32) << " | " << against(mixed) << " | "
          << (r.parameters > 0 ? printf_str("%.2f", state / r.parameters) : std::string("n/a")) << " | "
          << printf_str("%.2f%%", 100 * miss) << " |\n";
    }
    return o.str();
}

/// The "## Mixture of experts" section (only when the sweep has MoE runs): per recipe and MoE size,
/// the held-out gap to the reference recipe, the experts' load (the busiest expert over the mean,
/// averaged over steps and blocks, and its largest value), the dropped assignments, L_aux, and the
/// bytes that dispatching the routed rows moves per step as FP8 codes and scales against bf16;
/// then each run's tokens per expert.
inline std::string moe_section(const sweep_result& s) {
    const auto gs = groups_of(s);
    if (std::none_of(s.runs.begin(), s.runs.end(), [](const run_result& r) { return r.moe_blocks > 0; })) return "";
    std::ostringstream o;
    o << "\n## Mixture of experts\n\nMean ± sample standard deviation over the seeds. Load imbalance: the busiest "
         "expert's assignments over the mean per step and MoE block (1 = even), averaged, and its largest value. "
         "Dispatch bytes per step (all ranks): the routed rows as FP8 codes and scales (the recipe's activation "
         "copy; blockwise's 1x128 E4M3 under float32, what octet would send) against the same rows in bf16; "
         "across expert-parallel ranks these are the bytes on the wire for the rows whose expert lives on "
         "another rank (the combine's return trip, bf16 rows in octet's exchange, is not counted).\n\n"
         "| recipe | size | steps | seeds | held-out gap | imbalance | imbalance max | dropped | L_aux | dispatch "
         "FP8 | dispatch bf16 | FP8 / bf16 |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    auto cell_of = [&](const group& g, const char* metric) {
        const stats st = group_stats(g, metric_named(metric), s);
        return st.n ? show(st.mean, metric_named(metric).as) +
                          (st.n > 1 ? " ± " + show(st.std, metric_named(metric).as) : "")
                    : std::string("n/a");
    };
    for (const auto& g : gs) {
        const run_result& r = *g.runs.front();
        if (r.moe_blocks == 0) continue;
        std::vector<double> imax, dropped, aux;
        for (const auto* q : g.runs)
            imax.push_back(q->expert_imbalance_max), dropped.push_back(q->moe_dropped), aux.push_back(q->moe_aux_loss);
        const double fp8 = mean_finite([&] {
            std::vector<double> v;
            for (const auto* q : g.runs) v.push_back(q->dispatch_fp8_bytes);
            return v;
        }()),
                     bf16 = mean_finite([&] {
                         std::vector<double> v;
                         for (const auto* q : g.runs) v.push_back(q->dispatch_bf16_bytes);
                         return v;
                     }());
        o << "| " << cell(g.label()) << " | " << cell(g.size) << " | " << g.steps << " | " << g.runs.size() << " | "
          << cell_of(g, "heldout_gap") << " | " << cell_of(g, "expert_imbalance") << " | "
          << na_or(max_finite(imax), "%.3f") << " | " << na_or(mean_finite(dropped), "%.0f") << " | "
          << na_or(mean_finite(aux), "%.4f") << " | " << bytes_str(fp8) << " | " << bytes_str(bf16) << " | "
          << (bf16 > 0 ? printf_str("%.3f", fp8 / bf16) : std::string("n/a")) << " |\n";
    }
    o << "\nTokens routed to each expert over the run (all steps and ranks), per MoE block, lowest seed:\n\n";
    for (const auto& g : gs) {
        const run_result& r = *g.runs.front();
        if (r.moe_blocks == 0) continue;
        for (std::size_t b = 0; b < r.expert_tokens.size(); ++b) {
            o << "- " << cell(g.label()) << ", " << cell(r.size) << ", " << r.steps << " steps, seed " << r.seed
              << ", block " << b << ":";
            for (double v : r.expert_tokens[b]) o << " " << printf_str("%.0f", v);
            o << "\n";
        }
    }
    return o.str();
}

// ---- report.md ----------------------------------------------------------------------------------

inline std::string layers_str(const std::vector<double>& v) {
    std::string out;
    for (std::size_t l = 0; l < v.size(); ++l)
        out += (l ? ", " : "") + std::string("L") + std::to_string(l) + " " + show(v[l], shown::residual);
    return out.empty() ? "n/a" : out;
}

inline std::string markdown(const sweep_result& s) {
    const auto gs = groups_of(s);
    std::size_t gate_ok = 0;
    for (const auto& g : s.gate) gate_ok += g.passed;
    std::ostringstream o;
    o << "# FP8 training report\n\n**Verdict: " << (s.passed ? "PASSED" : "FAILED") << "** — gate " << gate_ok << "/"
      << s.gate.size() << " checks passed" << (gate_ok == s.gate.size() ? "" : " (the gate failed)") << "; tolerance "
      << printf_str("%.4g", s.tolerance_nats) << " nats/char of held-out loss against `" << cell(s.reference_recipe)
      << "`: " << cell(s.tolerance_reason) << "\n\n";
    for (const auto& v : s.verdicts) o << "- " << cell(v) << "\n";
    o << "\nHeld-out gap to `" << cell(s.reference_recipe) << "` (paired by seed, nats/char), beside the tolerance ("
      << printf_str("%.4g", s.tolerance_nats)
      << "):\n\n| recipe | size | steps | mean gap | largest gap | seeds |\n|---|---|---|---|---|---|\n";
    for (const auto& g : gs) {
        if (g.recipe == s.reference_recipe) continue;
        const stats st = group_stats(g, metric_named("heldout_gap"), s);
        o << "| " << cell(g.label()) << " | " << cell(g.size) << " | " << g.steps << " | " << show(st.mean, shown::loss)
          << " | " << show(st.max, shown::loss) << " | " << st.n << " |\n";
    }
    o << "\nCommand: `" << cell(s.command) << "`  \nMachine: " << cell(s.machine)
      << "  \nWall time of the sweep: " << show(s.wall_seconds, shown::seconds) << ", " << s.runs.size()
      << " runs.\n\n## Gate\n\n| check | value | limit | passed | detail |\n|---|---|---|---|---|\n";
    for (const auto& g : s.gate)
        o << "| " << cell(g.name) << " | " << na_or(g.value, "%.3g") << " | " << na_or(g.limit, "%.3g") << " | "
          << (g.passed ? "yes" : "**no**") << " | " << cell(g.detail) << " |\n";
    const std::vector<std::pair<const char*, std::vector<const char*>>> tables = {
        {"Quality", {"final_train_loss", "final_heldout_loss", "heldout_bpc", "heldout_gap"}},
        {"Cost",
         {"tokens_per_second", "wall_seconds", "peak_bytes_measured", "ledger_peak_bytes", "peak_ratio", "restarts",
          "recoveries", "recovery_seconds", "monitor_overhead"}},
        {"Telemetry",
         {"saturation_rate", "underflow_rate", "clip_crossings", "attention_residual_max",
          "attention_residual_q_max"}}};
    o << "\n## Summary over seeds\n\nEach cell is mean ± sample standard deviation over the seeds (n-1); the per-seed "
         "table below has every value. Losses are the mean of the last 10% of steps (training) and the final "
         "evaluation (held-out); `peak_ratio` is measured peak / ledger (check_report.py checks it against the "
         "margin report_schema.md states); rates are means over steps; residuals are the largest over steps and "
         "layers.\n";
    for (const auto& [title, names] : tables) {
        o << "\n### " << title << "\n\n| recipe | size | steps | seeds |";
        for (const char* n : names) o << " " << n << " (" << metric_named(n).unit << ") |";
        o << "\n|---|---|---|---|";
        for (std::size_t i = 0; i < names.size(); ++i) o << "---|";
        o << "\n";
        for (const auto& g : gs) {
            o << "| " << cell(g.label()) << " | " << cell(g.size) << " | " << g.steps << " | " << g.runs.size() << " |";
            for (const char* n : names)
                o << " " << show_stats(group_stats(g, metric_named(n), s), metric_named(n).as) << " |";
            o << "\n";
        }
    }
    o << "\n## Per seed\n\n| recipe | size | steps | seed | ranks | parameters | train loss | held-out loss | "
         "bits/char | "
         "gap | tokens/s | wall | peak measured | ledger | restarts | recoveries | monitor overhead | saturation | "
         "underflow | clip crossings | residual per layer (max) | quantized-dS residual per layer (max) |\n"
      << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (const auto& r : s.runs) {
        auto m = [&](const char* n) { return show(metric_named(n).of(r, s), metric_named(n).as); };
        o << "| " << cell(r.recipe + (r.recovery ? "" : " (no recovery)")) << " | " << cell(r.size) << " | " << r.steps
          << " | " << r.seed << " | " << r.ranks << " | " << printf_str("%.0f", r.parameters) << " | "
          << m("final_train_loss") << " | " << m("final_heldout_loss") << " | " << m("heldout_bpc") << " | "
          << m("heldout_gap") << " | " << m("tokens_per_second") << " | " << m("wall_seconds") << " | "
          << m("peak_bytes_measured") << " | " << m("ledger_peak_bytes") << " | " << r.restarts << " | "
          << r.recoveries.size() << " | " << m("monitor_overhead") << " | " << m("saturation_rate") << " | "
          << m("underflow_rate") << " | " << r.clip_crossings << " | "
          << layers_str(per_layer_max(r.attention_residual)) << " | "
          << layers_str(per_layer_max(r.attention_residual_q)) << " |\n";
    }
    o << memory_section(s);
    o << "\n## Recovery events\n\nEach event's cost is included in its run's wall time and tokens/s.\n\n";
    std::size_t events = 0;
    for (const auto& r : s.runs) events += r.recoveries.size();
    if (events == 0)
        o << "None.\n";
    else {
        o << "| recipe | size | steps | seed | step | action | reason | cost |\n|---|---|---|---|---|---|---|---|\n";
        for (const auto& r : s.runs)
            for (const auto& e : r.recoveries)
                o << "| " << cell(r.recipe + (r.recovery ? "" : " (no recovery)")) << " | " << cell(r.size) << " | "
                  << r.steps << " | " << r.seed << " | " << e.step << " | " << cell(e.action) << " | " << cell(e.reason)
                  << " | " << show(e.seconds, shown::seconds) << " |\n";
    }
    o << moe_section(s);
    std::vector<std::string> ops;
    for (const auto& r : s.runs)
        for (const auto& kv : r.op_seconds)
            if (std::find(ops.begin(), ops.end(), kv.first) == ops.end()) ops.push_back(kv.first);
    o << "\n## Step time per operation\n\nMilliseconds per step, mean over seeds (each run's time for the operation / "
         "its steps).\n\n"
      << "| recipe | size | steps |";
    for (const auto& op : ops) o << " " << cell(op) << " |";
    o << " sum |\n|---|---|---|";
    for (std::size_t i = 0; i <= ops.size(); ++i) o << "---|";
    o << "\n";
    for (const auto& g : gs) {
        o << "| " << cell(g.label()) << " | " << cell(g.size) << " | " << g.steps << " |";
        double sum = 0;
        for (const auto& op : ops) {
            std::vector<double> v;
            for (const auto* r : g.runs) {
                auto it = r->op_seconds.find(op);
                v.push_back(it != r->op_seconds.end() && r->steps > 0 ? 1e3 * it->second / r->steps : not_measured);
            }
            const double ms = mean_finite(v);
            sum += std::isfinite(ms) ? ms : 0;
            o << " " << na_or(ms, "%.3g") << " |";
        }
        o << " " << printf_str("%.3g", sum) << " |\n";
    }
    o << "\n## Generated samples\n\nOne per recipe, from its largest and longest run (lowest seed).\n";
    std::vector<std::string> done;
    for (const auto& g : gs) {
        if (std::find(done.begin(), done.end(), g.label()) != done.end()) continue;
        done.push_back(g.label());
        const run_result* best = nullptr;
        for (const auto& r : s.runs)
            if (r.recipe == g.recipe && r.recovery == g.recovery &&
                (!best || std::make_tuple(r.parameters, r.steps, -r.seed) >
                              std::make_tuple(best->parameters, best->steps, -best->seed)))
                best = &r;
        o << "\n### " << cell(g.label()) << " (" << cell(best->size) << ", " << best->steps << " steps, seed "
          << best->seed << ")\n\n"
          << code_block(best->sample);
    }
    o << "\n## Plots\n\n![loss curves](loss_curves.svg)\n\n![memory by "
         "category](memory.svg)\n\n![telemetry](telemetry.svg)\n";
    return o.str();
}

}  // namespace report_detail
}  // namespace train
