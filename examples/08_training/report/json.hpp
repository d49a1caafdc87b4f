// examples/08_training/report/json.hpp: report.json (schema in ../report_schema.md, checked by
// ../check_report.py).
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

// ---- report.json --------------------------------------------------------------------------------

inline std::string jarray(const std::vector<double>& v) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + jnum(v[i]);
    return out + "]";
}
inline std::string jmap(const std::map<std::string, double>& m) {
    std::string out = "{";
    for (const auto& [k, v] : m) out += (out.size() > 1 ? ", " : "") + jstr(k) + ": " + jnum(v);
    return out + "}";
}

inline std::string json(const sweep_result& s) {
    std::ostringstream o;
    o << "{\n  \"schema\": " << jstr(schema_version) << ",\n  \"command\": " << jstr(s.command)
      << ",\n  \"machine\": " << jstr(s.machine) << ",\n  \"passed\": " << (s.passed ? "true" : "false")
      << ",\n  \"wall_seconds\": " << jnum(s.wall_seconds) << ",\n  \"tolerance_nats\": " << jnum(s.tolerance_nats)
      << ",\n  \"tolerance_reason\": " << jstr(s.tolerance_reason)
      << ",\n  \"reference_recipe\": " << jstr(s.reference_recipe) << ",\n  \"verdicts\": [";
    for (std::size_t i = 0; i < s.verdicts.size(); ++i) o << (i ? ", " : "") << jstr(s.verdicts[i]);
    o << "],\n  \"gate\": [";
    for (std::size_t i = 0; i < s.gate.size(); ++i) {
        const auto& g = s.gate[i];
        o << (i ? "," : "") << "\n    {\"name\": " << jstr(g.name) << ", \"value\": " << jnum(g.value)
          << ", \"limit\": " << jnum(g.limit) << ", \"passed\": " << (g.passed ? "true" : "false")
          << ", \"detail\": " << jstr(g.detail) << "}";
    }
    o << "\n  ],\n  \"summary\": [";
    const auto gs = groups_of(s);
    for (std::size_t i = 0; i < gs.size(); ++i) {
        const auto& g = gs[i];
        o << (i ? "," : "") << "\n    {\"recipe\": " << jstr(g.recipe) << ", \"size\": " << jstr(g.size)
          << ", \"steps\": " << g.steps << ", \"recovery\": " << (g.recovery ? "true" : "false") << ", \"seeds\": [";
        for (std::size_t k = 0; k < g.runs.size(); ++k) o << (k ? ", " : "") << g.runs[k]->seed;
        o << "], \"metrics\": [";
        for (std::size_t k = 0; k < metrics().size(); ++k) {
            const auto& m = metrics()[k];
            const stats st = group_stats(g, m, s);
            o << (k ? "," : "") << "\n      {\"name\": " << jstr(m.name) << ", \"unit\": " << jstr(m.unit)
              << ", \"n\": " << st.n << ", \"mean\": " << jnum(st.mean) << ", \"std\": " << jnum(st.std)
              << ", \"min\": " << jnum(st.min) << ", \"max\": " << jnum(st.max) << "}";
        }
        o << "]}";
    }
    o << "\n  ],\n  \"runs\": [";
    for (std::size_t i = 0; i < s.runs.size(); ++i) {
        const auto& r = s.runs[i];
        const std::size_t st = curve_stride(r);
        auto rows = [&](const std::vector<std::vector<double>>& m) {
            std::vector<std::vector<double>> by_layer;
            for (std::size_t l = 0; l < per_layer_max(m).size(); ++l)
                by_layer.push_back(window_means(layer_series(m, l), st));
            std::string out = "[";
            for (std::size_t t = 0; !by_layer.empty() && t < by_layer[0].size(); ++t) {
                std::vector<double> row;
                for (const auto& l : by_layer) row.push_back(l[t]);
                out += (t ? ", " : "") + jarray(row);
            }
            return out + "]";
        };
        o << (i ? "," : "") << "\n    {\"recipe\": " << jstr(r.recipe) << ", \"size\": " << jstr(r.size)
          << ", \"seed\": " << r.seed << ", \"steps\": " << r.steps << ", \"ranks\": " << r.ranks
          << ", \"parameters\": " << jnum(r.parameters) << ", \"recovery\": " << (r.recovery ? "true" : "false")
          << ",\n     \"final_train_loss\": " << jnum(r.final_train_loss)
          << ", \"final_heldout_loss\": " << jnum(r.final_heldout_loss) << ", \"heldout_bpc\": " << jnum(r.heldout_bpc)
          << ",\n     \"tokens_per_second\": " << jnum(r.tokens_per_second)
          << ", \"wall_seconds\": " << jnum(r.wall_seconds) << ", \"op_seconds\": " << jmap(r.op_seconds)
          << ",\n     \"peak_bytes_measured\": " << jnum(r.peak_bytes_measured)
          << ", \"peak_bytes_by_category\": " << jmap(r.peak_bytes_by_category)
          << ",\n     \"ledger_peak_bytes\": " << jnum(r.ledger_peak_bytes)
          << ", \"ledger_bytes\": " << jmap(r.ledger_bytes) << ",\n     \"restarts\": " << r.restarts
          << ", \"recoveries\": [";
        for (std::size_t k = 0; k < r.recoveries.size(); ++k) {
            const auto& e = r.recoveries[k];
            o << (k ? ", " : "") << "{\"step\": " << e.step << ", \"action\": " << jstr(e.action)
              << ", \"reason\": " << jstr(e.reason) << ", \"seconds\": " << jnum(e.seconds) << "}";
        }
        o << "],\n     \"monitor_seconds\": " << jnum(r.monitor_seconds)
          << ", \"monitor_overhead\": " << jnum(r.monitor_overhead) << ", \"clip_crossings\": " << r.clip_crossings
          << ", \"sample\": " << jstr(r.sample) << ",\n     \"heldout\": [";
        for (std::size_t k = 0; k < r.heldout.size(); ++k)
            o << (k ? ", " : "") << "{\"step\": " << r.heldout[k].first << ", \"loss\": " << jnum(r.heldout[k].second)
              << "}";
        o << "],\n     \"curve_stride\": " << st << ",\n     \"train_loss\": " << jarray(window_means(r.train_loss, st))
          << ",\n     \"saturation_rate\": " << jarray(window_means(r.saturation_rate, st))
          << ",\n     \"underflow_rate\": " << jarray(window_means(r.underflow_rate, st))
          << ",\n     \"attention_residual\": " << rows(r.attention_residual)
          << ",\n     \"attention_residual_q\": " << rows(r.attention_residual_q) << ",\n     \"moe\": ";
        if (r.moe_blocks == 0) {
            o << "null}";
            continue;
        }
        o << "{\"blocks\": " << r.moe_blocks << ", \"experts\": " << r.experts << ", \"top_k\": " << r.top_k
          << ", \"expert_tokens\": [";
        for (std::size_t b = 0; b < r.expert_tokens.size(); ++b) o << (b ? ", " : "") << jarray(r.expert_tokens[b]);
        o << "], \"imbalance\": " << jnum(r.expert_imbalance) << ", \"imbalance_max\": " << jnum(r.expert_imbalance_max)
          << ", \"dropped\": " << jnum(r.moe_dropped) << ", \"aux_loss\": " << jnum(r.moe_aux_loss)
          << ", \"dispatch_fp8_bytes\": " << jnum(r.dispatch_fp8_bytes)
          << ", \"dispatch_bf16_bytes\": " << jnum(r.dispatch_bf16_bytes) << "}}";
    }
    o << "\n  ]\n}\n";
    return o.str();
}

}  // namespace report_detail
}  // namespace train
