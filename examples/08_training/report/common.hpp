// examples/08_training/report/common.hpp: what the report's parts share: the schema version, the metrics the
// summaries show and how, the groups of runs (one recipe, size and length over seeds), the
// reference run of each, and the memory categories.
#pragma once

#include "../train.hpp"
#include "common/report_svg.hpp"
#include "common/report_text.hpp"

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

using namespace common::report_kit;

inline const char* schema_version = "octet-training-report/1";
inline constexpr std::size_t json_curve_points = 2000;  // per-step arrays longer than this are window means
inline constexpr std::size_t svg_curve_points = 400;

/// The reference recipe's run on the same size, length and seed, or null.
inline const run_result* reference_of(const run_result& r, const sweep_result& s) {
    for (const auto& q : s.runs)
        if (q.recipe == s.reference_recipe && q.size == r.size && q.steps == r.steps && q.seed == r.seed) return &q;
    return nullptr;
}
inline double recovery_seconds(const run_result& r) {
    double t = 0;
    for (const auto& e : r.recoveries) t += e.seconds;
    return t;
}

/// The summary's quantities: one home for their names, units and how each is read from a run.
enum class shown { loss, bits, rate, seconds, bytes, ratio, count, percent, residual };
struct metric {
    const char* name;
    const char* unit;
    shown as;
    double (*of)(const run_result&, const sweep_result&);
};
inline const std::vector<metric>& metrics() {
    static const std::vector<metric> m = {
        {"final_train_loss", "nats/char", shown::loss,
         [](const run_result& r, const sweep_result&) { return r.final_train_loss; }},
        {"final_heldout_loss", "nats/char", shown::loss,
         [](const run_result& r, const sweep_result&) { return r.final_heldout_loss; }},
        {"heldout_bpc", "bits/char", shown::bits,
         [](const run_result& r, const sweep_result&) { return r.heldout_bpc; }},
        {"heldout_gap", "nats/char", shown::loss,
         [](const run_result& r, const sweep_result& s) {
             const run_result* ref = reference_of(r, s);
             return ref ? r.final_heldout_loss - ref->final_heldout_loss : not_measured;
         }},
        {"tokens_per_second", "tokens/s", shown::rate,
         [](const run_result& r, const sweep_result&) { return r.tokens_per_second; }},
        {"wall_seconds", "s", shown::seconds, [](const run_result& r, const sweep_result&) { return r.wall_seconds; }},
        {"peak_bytes_measured", "bytes", shown::bytes,
         [](const run_result& r, const sweep_result&) { return r.peak_bytes_measured; }},
        {"ledger_peak_bytes", "bytes", shown::bytes,
         [](const run_result& r, const sweep_result&) { return r.ledger_peak_bytes; }},
        {"peak_ratio", "measured/ledger", shown::ratio,
         [](const run_result& r, const sweep_result&) {
             return r.ledger_peak_bytes > 0 ? r.peak_bytes_measured / r.ledger_peak_bytes : not_measured;
         }},
        {"restarts", "count", shown::count,
         [](const run_result& r, const sweep_result&) { return double(r.restarts); }},
        {"recoveries", "count", shown::count,
         [](const run_result& r, const sweep_result&) { return double(r.recoveries.size()); }},
        {"recovery_seconds", "s", shown::seconds,
         [](const run_result& r, const sweep_result&) { return recovery_seconds(r); }},
        {"monitor_overhead", "fraction", shown::percent,
         [](const run_result& r, const sweep_result&) { return r.monitor_overhead; }},
        {"saturation_rate", "fraction", shown::percent,
         [](const run_result& r, const sweep_result&) { return mean_finite(r.saturation_rate); }},
        {"underflow_rate", "fraction", shown::percent,
         [](const run_result& r, const sweep_result&) { return mean_finite(r.underflow_rate); }},
        {"clip_crossings", "count", shown::count,
         [](const run_result& r, const sweep_result&) { return double(r.clip_crossings); }},
        {"attention_residual_max", "relative", shown::residual,
         [](const run_result& r, const sweep_result&) { return max_finite(per_layer_max(r.attention_residual)); }},
        {"attention_residual_q_max", "relative", shown::residual,
         [](const run_result& r, const sweep_result&) { return max_finite(per_layer_max(r.attention_residual_q)); }},
        {"expert_imbalance", "ratio", shown::ratio,
         [](const run_result& r, const sweep_result&) { return r.moe_blocks ? r.expert_imbalance : not_measured; }},
        {"dispatch_fp8_bytes", "bytes", shown::bytes,
         [](const run_result& r, const sweep_result&) { return r.moe_blocks ? r.dispatch_fp8_bytes : not_measured; }},
        {"dispatch_bf16_bytes", "bytes", shown::bytes,
         [](const run_result& r, const sweep_result&) { return r.moe_blocks ? r.dispatch_bf16_bytes : not_measured; }},
    };
    return m;
}
inline const metric& metric_named(const std::string& name) {
    for (const auto& m : metrics())
        if (name == m.name) return m;
    throw octet::error("train::report: no metric named " + name);
}
inline std::string show(double v, shown as) {
    switch (as) {
        case shown::loss:
            return na_or(v, "%.4f");
        case shown::bits:
            return na_or(v, "%.4f");
        case shown::rate:
            return na_or(v, "%.0f");
        case shown::seconds:
            return na_or(v, "%.3g s");
        case shown::bytes:
            return bytes_str(v);
        case shown::ratio:
            return na_or(v, "%.3f");
        case shown::count:
            return na_or(v, "%.3g");
        case shown::percent:
            return std::isfinite(v) ? printf_str("%.3g%%", 100.0 * v) : "n/a";
        case shown::residual:
            return na_or(v, "%.2e");
    }
    return "n/a";
}
/// "mean ± std" over seeds (one value: the value).
inline std::string show_stats(const stats& s, shown as) {
    if (s.n == 0) return "n/a";
    if (s.n == 1) return show(s.mean, as);
    const double sd = s.std <= 1e-12 * std::fabs(s.mean) ? 0.0 : s.std;  // rounding noise of equal values
    return show(s.mean, as) + " ± " + (as == shown::bytes ? bytes_str(sd) : show(sd, as));
}

// ---- groups: runs of one recipe, size and length, over seeds ------------------------------------

struct group {
    std::string recipe, size;
    int steps = 0;
    bool recovery = true;
    std::vector<const run_result*> runs;
    std::string label() const { return recipe + (recovery ? "" : " (no recovery)"); }
};
inline std::vector<group> groups_of(const sweep_result& s) {
    std::vector<group> out;
    for (const auto& r : s.runs) {
        auto it = std::find_if(out.begin(), out.end(), [&](const group& g) {
            return g.recipe == r.recipe && g.size == r.size && g.steps == r.steps && g.recovery == r.recovery;
        });
        if (it == out.end()) it = out.insert(out.end(), group{r.recipe, r.size, r.steps, r.recovery, {}});
        it->runs.push_back(&r);
    }
    return out;
}
inline stats group_stats(const group& g, const metric& m, const sweep_result& s) {
    std::vector<double> v;
    for (const auto* r : g.runs) v.push_back(m.of(*r, s));
    return stats_of(v);
}
/// Labels in order of first appearance (a recipe keeps its colour in every plot).
inline std::vector<std::string> labels_of(const std::vector<group>& gs) {
    std::vector<std::string> out;
    for (const auto& g : gs)
        if (std::find(out.begin(), out.end(), g.label()) == out.end()) out.push_back(g.label());
    return out;
}
inline std::size_t index_of(const std::vector<std::string>& v, const std::string& x) {
    return static_cast<std::size_t>(std::find(v.begin(), v.end(), x) - v.begin());
}
/// (size, steps) panels in order of first appearance.
inline std::vector<std::pair<std::string, int>> panels_of(const std::vector<group>& gs) {
    std::vector<std::pair<std::string, int>> out;
    for (const auto& g : gs)
        if (std::find(out.begin(), out.end(), std::make_pair(g.size, g.steps)) == out.end())
            out.emplace_back(g.size, g.steps);
    return out;
}

inline std::size_t curve_stride(const run_result& r) {
    std::size_t n = std::max({r.train_loss.size(), r.saturation_rate.size(), r.underflow_rate.size(),
                              r.attention_residual.size(), r.attention_residual_q.size()});
    return std::max<std::size_t>(1, (n + json_curve_points - 1) / json_curve_points);
}

inline std::vector<std::string> categories_of(const sweep_result& s) {
    std::vector<std::string> out;
    for (int i = 0; i < octet::memory_category_count; ++i)
        out.push_back(octet::memory_category_name(static_cast<octet::memory_category>(i)));
    for (const auto& r : s.runs)
        for (const auto* m : {&r.peak_bytes_by_category, &r.ledger_bytes})
            for (const auto& kv : *m)
                if (std::find(out.begin(), out.end(), kv.first) == out.end()) out.push_back(kv.first);
    return out;
}
inline double mean_of(const std::vector<const run_result*>& rs, double (*f)(const run_result&, const std::string&),
                      const std::string& key) {
    std::vector<double> v;
    for (const auto* r : rs) v.push_back(f(*r, key));
    return mean_finite(v);
}

}  // namespace report_detail
}  // namespace train
