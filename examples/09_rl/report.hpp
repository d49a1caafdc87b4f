// examples/09_rl/report.hpp: the RL program's outputs, written from an rl::sweep_result:
// report.md (findings first), report.json (schema in report_schema.md, checked by check_report.py)
// and four SVG plots (reward, entropy, clipping, training-inference mismatch). The generic text,
// statistics and SVG helpers are the examples' report kit (examples/common/report_text.hpp and
// report_svg.hpp). Every number written is taken or derived from the sweep_result passed in.
#pragma once

#include "common/report_svg.hpp"
#include "common/report_text.hpp"
#include "records.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace rl {
namespace report_detail {

namespace tr = common::report_kit;
using tr::axes, tr::band, tr::band_d, tr::band_of, tr::cell, tr::code_block, tr::colour, tr::dash;
using tr::duration_str, tr::jnum, tr::jstr, tr::legend, tr::mean_finite, tr::moving_average, tr::na_or, tr::num;
using tr::panel, tr::path_d, tr::pick, tr::plain_tick, tr::printf_str, tr::smoothing_window, tr::stats, tr::stats_of;
using tr::svg_open, tr::thin, tr::write_file, tr::xml;

inline const char* schema_version = "octet-rl-report/1";

// ---- runs grouped by variant, in order of first appearance ---------------------------------------

struct group {
    std::string variant;
    std::vector<const run_result*> runs;
};
inline std::vector<group> groups_of(const sweep_result& s) {
    std::vector<group> out;
    for (const auto& r : s.runs) {
        auto it = std::find_if(out.begin(), out.end(), [&](const group& g) { return g.variant == r.variant; });
        if (it == out.end()) it = out.insert(out.end(), group{r.variant, {}});
        it->runs.push_back(&r);
    }
    return out;
}

/// The summary's columns: name (as in report.json), header, printf format, how read from a run.
struct metric {
    const char* name;
    const char* header;
    const char* fmt;
    double (*of)(const run_result&);
};
inline const std::vector<metric>& metrics() {
    static const std::vector<metric> m = {
        {"final_reward", "final reward", "%.3f", [](const run_result& r) { return r.final_reward; }},
        {"final_solved_fraction", "final solved", "%.3f", [](const run_result& r) { return r.final_solved_fraction; }},
        {"final_entropy", "final entropy (nats)", "%.3f", [](const run_result& r) { return r.final_entropy; }},
        {"mean_abs_log_ratio", "mean abs log-ratio", "%.3g", [](const run_result& r) { return r.mean_abs_log_ratio; }},
        {"clip_fraction_negative", "clipped A<0", "%.3g", [](const run_result& r) { return r.clip_fraction_negative; }},
        {"clip_fraction_positive", "clipped A>0", "%.3g", [](const run_result& r) { return r.clip_fraction_positive; }},
        {"crossings_negative_pushed_below", "A<0 pushed below (total)", "%.4g",
         [](const run_result& r) { return double(r.crossings_negative_pushed_below); }},
        {"rollout_tokens_per_second", "rollout tokens/s", "%.0f",
         [](const run_result& r) { return r.rollout_tokens_per_second; }},
        {"update_tokens_per_second", "update tokens/s", "%.0f",
         [](const run_result& r) { return r.update_tokens_per_second; }},
        {"calibration_seconds", "calibration (s)", "%.3g", [](const run_result& r) { return r.calibration_seconds; }},
        {"restarts", "restarts", "%.3g", [](const run_result& r) { return double(r.restarts); }},
    };
    return m;
}
/// "mean (min..max)" over the finite values; one value: the value.
inline std::string mean_range(const std::vector<double>& v, const char* fmt) {
    const stats st = stats_of(v);
    if (st.n == 0) return "n/a";
    if (st.n == 1) return printf_str(fmt, st.mean);
    return printf_str(fmt, st.mean) + " (" + printf_str(fmt, st.min) + ".." + printf_str(fmt, st.max) + ")";
}

// ---- report.json ----------------------------------------------------------------------------------

/// The shortest text that reads back as the same float; null where JSON has no number.
inline std::string jfloat(float v) {
    if (!std::isfinite(v)) return "null";
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
}
/// The per-step fields, by type (report_schema.md lists the same names).
inline const std::vector<std::pair<const char*, double step_record::*>>& step_numbers() {
    static const std::vector<std::pair<const char*, double step_record::*>> f = {
        {"reward_mean", &step_record::reward_mean},
        {"solved_fraction", &step_record::solved_fraction},
        {"entropy_rollout", &step_record::entropy_rollout},
        {"entropy_trainer", &step_record::entropy_trainer},
        {"log_ratio_mean", &step_record::log_ratio_mean},
        {"log_ratio_std", &step_record::log_ratio_std},
        {"log_ratio_abs_max", &step_record::log_ratio_abs_max},
        {"log_ratio_q01", &step_record::log_ratio_q01},
        {"log_ratio_q10", &step_record::log_ratio_q10},
        {"log_ratio_q50", &step_record::log_ratio_q50},
        {"log_ratio_q90", &step_record::log_ratio_q90},
        {"log_ratio_q99", &step_record::log_ratio_q99},
        {"clip_fraction_negative", &step_record::clip_fraction_negative},
        {"clip_fraction_positive", &step_record::clip_fraction_positive},
        {"clip_fraction_negative_high", &step_record::clip_fraction_negative_high},
        {"clip_fraction_positive_high", &step_record::clip_fraction_positive_high},
        {"tis_truncated_fraction", &step_record::tis_truncated_fraction},
        {"rollout_seconds", &step_record::rollout_seconds},
        {"update_seconds", &step_record::update_seconds},
        {"calibration_seconds", &step_record::calibration_seconds},
        {"monitor_seconds", &step_record::monitor_seconds},
        {"rollout_tokens_per_second", &step_record::rollout_tokens_per_second},
        {"update_tokens_per_second", &step_record::update_tokens_per_second},
        {"grad_norm", &step_record::grad_norm},
        {"lr", &step_record::lr}};
    return f;
}
inline const std::vector<std::pair<const char*, std::uint64_t step_record::*>>& step_counts() {
    static const std::vector<std::pair<const char*, std::uint64_t step_record::*>> f = {
        {"tokens", &step_record::tokens},
        {"crossings_negative_pushed_below", &step_record::crossings_negative_pushed_below},
        {"crossings_negative_pushed_out", &step_record::crossings_negative_pushed_out},
        {"crossings_positive_pushed_above", &step_record::crossings_positive_pushed_above},
        {"crossings_region_changed", &step_record::crossings_region_changed},
        {"crossings_branch_changed", &step_record::crossings_branch_changed},
        {"tokens_negative", &step_record::tokens_negative},
        {"tokens_positive", &step_record::tokens_positive}};
    return f;
}
template <class F>
std::string jarray(const std::vector<step_record>& steps, F text) {
    std::string out = "[";
    for (std::size_t i = 0; i < steps.size(); ++i) out += (i ? ", " : "") + text(steps[i]);
    return out + "]";
}

// ---- SVG --------------------------------------------------------------------------------------------

inline constexpr std::size_t svg_points = 400;

/// The step numbers of a group's longest run (the x of its curves).
inline std::vector<double> steps_of(const group& g) {
    const run_result* longest = nullptr;
    for (const auto* r : g.runs)
        if (!longest || r->steps.size() > longest->steps.size()) longest = r;
    std::vector<double> xs;
    if (longest)
        for (const auto& st : longest->steps) xs.push_back(st.step);
    return xs;
}
/// Per step over the group's seeds: min, mean, max of `f` (each seed's curve smoothed first if asked).
inline band seeds_band(const group& g, double step_record::*f, bool smooth) {
    std::vector<std::vector<double>> curves;
    for (const auto* r : g.runs) {
        std::vector<double> v;
        for (const auto& st : r->steps) v.push_back(st.*f);
        curves.push_back(smooth ? moving_average(v, smoothing_window(v.size())) : v);
    }
    return band_of(curves);
}
inline std::size_t longest_run(const sweep_result& s) {
    std::size_t n = 0;
    for (const auto& r : s.runs) n = std::max(n, r.steps.size());
    return n;
}
/// x over every group's steps, y fitted (linear) to `ys`; a degenerate range is widened.
inline void fit(panel& p, const std::vector<group>& gs, const std::vector<double>& ys) {
    std::vector<double> xs;
    for (const auto& g : gs)
        for (double x : steps_of(g)) xs.push_back(x);
    const stats sx = stats_of(xs);
    p.x0 = sx.n ? sx.min : 0, p.x1 = sx.n && sx.max > sx.min ? sx.max : p.x0 + 1;
    p.fit_y(ys, 0);
    if (!(p.y1 - p.y0 > 1e-9)) p.y0 -= 1e-3, p.y1 += 1e-3;
}
inline std::string open_series(const std::string& cls, const std::string& name, const panel& p) {
    return "<g class=\"" + cls + "\" data-name=\"" + xml(name) + "\" clip-path=\"url(#clip" + std::to_string(p.id) +
           ")\">\n";
}
inline void empty_note(std::ostream& o, const panel& p, const std::vector<group>& gs) {
    if (gs.empty())
        o << "<text x=\"" << num(p.x + p.w / 2) << "\" y=\"" << num(p.y + p.h / 2)
          << "\" text-anchor=\"middle\" fill=\"#888\">no runs</text>\n";
}
/// One panel: per variant, the seed mean (line) and min..max over seeds (band) of `f` per step;
/// `high`, if given, as a dashed seed-mean line of variant `high_group`.
inline void curves_panel(std::ostream& o, panel p, const std::vector<group>& gs, double step_record::*f, bool smooth,
                         const std::string& title, const std::string& ylabel, double step_record::*high = nullptr,
                         std::size_t high_group = 0) {
    std::vector<band> bs;
    std::vector<double> all, high_mean;
    for (const auto& g : gs) {
        bs.push_back(seeds_band(g, f, smooth));
        all.insert(all.end(), bs.back().lo.begin(), bs.back().lo.end());
        all.insert(all.end(), bs.back().hi.begin(), bs.back().hi.end());
    }
    if (high && high_group < gs.size()) {
        high_mean = seeds_band(gs[high_group], high, smooth).mean;
        all.insert(all.end(), high_mean.begin(), high_mean.end());
    }
    fit(p, gs, all);
    axes(o, p, title, "step", ylabel, plain_tick);
    empty_note(o, p, gs);
    for (std::size_t i = 0; i < gs.size(); ++i) {
        const auto xs = steps_of(gs[i]);
        const auto idx = thin(xs.size(), svg_points);
        const auto x = pick(xs, idx);
        o << open_series("series", gs[i].variant, p) << "<path d=\""
          << band_d(p, x, pick(bs[i].lo, idx), pick(bs[i].hi, idx)) << "\" fill=\"" << colour(i)
          << "\" fill-opacity=\"0.2\" stroke=\"none\"/>\n<path d=\"" << path_d(p, x, pick(bs[i].mean, idx))
          << "\" fill=\"none\" stroke=\"" << colour(i) << "\" stroke-width=\"1.5\"/>\n</g>\n";
        if (i == high_group && !high_mean.empty())
            o << open_series("reference", gs[i].variant + " (no mismatch)", p) << "<path d=\""
              << path_d(p, x, pick(high_mean, idx)) << "\" fill=\"none\" stroke=\"" << colour(i)
              << "\" stroke-dasharray=\"" << dash(1) << "\" stroke-width=\"1.2\"/>\n</g>\n";
    }
}
/// The document: title, a note line, the panels' body, the variants' legend below `bottom`.
inline std::string document(const std::string& title, const std::string& note, const std::string& body, double width,
                            double bottom, const std::vector<group>& gs) {
    std::vector<std::string> names, cs;
    for (std::size_t i = 0; i < gs.size(); ++i) names.push_back(gs[i].variant), cs.push_back(colour(i));
    std::ostringstream o;
    o << svg_open(width, bottom + 30 + 16 * double(gs.size() / 4))
      << "<text x=\"10\" y=\"20\" font-size=\"13\" font-weight=\"bold\">" << xml(title) << "</text>\n<text x=\"10\" "
      << "y=\"38\">" << xml(note) << "</text>\n"
      << body;
    legend(o, 80, bottom + 10, width - 100, names, cs);
    o << "</svg>\n";
    return o.str();
}
inline constexpr double pw = 440, ph = 240;
inline panel at(int id, int col, int row) {
    panel p;
    p.id = id, p.x = 80 + col * (pw + 90), p.y = 70 + row * (ph + 80), p.w = pw, p.h = ph;
    return p;
}
inline std::string smoothing_note(const sweep_result& s) {
    return "mean over seeds (line), min..max over seeds (band); moving average over " +
           std::to_string(smoothing_window(longest_run(s))) + " steps";
}

}  // namespace report_detail

inline std::string reward_svg(const sweep_result& s) {
    using namespace report_detail;
    const auto gs = groups_of(s);
    std::ostringstream o;
    curves_panel(o, at(0, 0, 0), gs, &step_record::reward_mean, true, "reward (mean over completions)", "reward");
    curves_panel(o, at(1, 1, 0), gs, &step_record::solved_fraction, true, "solved fraction", "fraction");
    return document("Reward per step", smoothing_note(s), o.str(), 80 + 2 * (pw + 90), 70 + ph + 50, gs);
}

inline std::string entropy_svg(const sweep_result& s) {
    using namespace report_detail;
    const auto gs = groups_of(s);
    std::ostringstream o;
    curves_panel(o, at(0, 0, 0), gs, &step_record::entropy_trainer, true,
                 "entropy of the trainer's distributions on the completion tokens", "entropy (nats/token)");
    return document("Policy entropy per step", smoothing_note(s), o.str(), 80 + pw + 60, 70 + ph + 50, gs);
}

inline std::string clipping_svg(const sweep_result& s) {
    using namespace report_detail;
    const auto gs = groups_of(s);
    std::size_t ref = gs.size();
    for (std::size_t i = 0; i < gs.size() && ref == gs.size(); ++i)
        if (gs[i].variant != "float_rollout") ref = i;
    std::ostringstream o;
    curves_panel(o, at(0, 0, 0), gs, &step_record::clip_fraction_negative, true, "A<0 tokens clipped below",
                 "fraction of A<0 tokens", &step_record::clip_fraction_negative_high, ref);
    curves_panel(o, at(1, 1, 0), gs, &step_record::clip_fraction_positive, true, "A>0 tokens clipped above",
                 "fraction of A>0 tokens", &step_record::clip_fraction_positive_high, ref);
    const std::string note = smoothing_note(s) + (ref < gs.size() ? "; dashed: " + gs[ref].variant +
                                                                        " had the ratios used the trainer's "
                                                                        "log-probabilities (no mismatch)"
                                                                  : std::string());
    return document("Clipping in the update, by the advantage's sign", note, o.str(), 80 + 2 * (pw + 90), 70 + ph + 50,
                    gs);
}

inline std::string mismatch_svg(const sweep_result& s) {
    using namespace report_detail;
    const auto gs = groups_of(s);
    double step_record::*const q[] = {&step_record::log_ratio_q01, &step_record::log_ratio_q10,
                                      &step_record::log_ratio_q50, &step_record::log_ratio_q90,
                                      &step_record::log_ratio_q99};
    std::vector<std::vector<std::vector<double>>> qs;  // [group][quantile][step], means over seeds
    std::vector<double> all;
    for (const auto& g : gs) {
        qs.emplace_back();
        for (auto f : q) {
            qs.back().push_back(seeds_band(g, f, false).mean);
            all.insert(all.end(), qs.back().back().begin(), qs.back().back().end());
        }
    }
    std::ostringstream o;
    const std::size_t panels = std::max<std::size_t>(1, gs.size());
    for (std::size_t i = 0; i < panels; ++i) {
        panel p = at(int(i), int(i % 2), int(i / 2));
        fit(p, gs, all);
        axes(o, p, i < gs.size() ? gs[i].variant : std::string("mismatch"), "step", "logp_trainer - logp_rollout",
             plain_tick);
        empty_note(o, p, gs);
        if (p.y0 < 0 && p.y1 > 0)
            o << "<line x1=\"" << num(p.x) << "\" y1=\"" << num(p.py(0)) << "\" x2=\"" << num(p.x + p.w) << "\" y2=\""
              << num(p.py(0)) << "\" stroke=\"#888\" stroke-dasharray=\"2,2\"/>\n";
        if (i >= gs.size()) continue;
        const auto xs = steps_of(gs[i]);
        const auto idx = thin(xs.size(), svg_points);
        const auto x = pick(xs, idx);
        const auto& v = qs[i];
        o << open_series("series", gs[i].variant, p) << "<path d=\"" << band_d(p, x, pick(v[0], idx), pick(v[4], idx))
          << "\" fill=\"" << colour(i) << "\" fill-opacity=\"0.15\" stroke=\"none\"/>\n<path d=\""
          << band_d(p, x, pick(v[1], idx), pick(v[3], idx)) << "\" fill=\"" << colour(i)
          << "\" fill-opacity=\"0.35\" stroke=\"none\"/>\n<path d=\"" << path_d(p, x, pick(v[2], idx))
          << "\" fill=\"none\" stroke=\"" << colour(i) << "\" stroke-width=\"1.5\"/>\n</g>\n";
    }
    const double rows = double((panels + 1) / 2);
    return document("Training-inference mismatch on the completion tokens, per step",
                    "light band q01..q99, dark band q10..q90, line q50; each the mean over seeds", o.str(),
                    80 + 2 * (pw + 90), 70 + rows * (ph + 80) - 30, gs);
}

inline std::string json(const sweep_result& s) {
    using namespace report_detail;
    std::ostringstream o;
    o << "{\n  \"schema\": " << jstr(schema_version) << ",\n  \"command\": " << jstr(s.command)
      << ",\n  \"machine\": " << jstr(s.machine) << ",\n  \"task\": " << jstr(s.task)
      << ",\n  \"prompt_chars\": " << s.prompt_chars << ", \"completion_chars\": " << s.completion_chars
      << ", \"prompts_per_step\": " << s.prompts_per_step << ", \"group_size\": " << s.group_size
      << ", \"epochs\": " << s.epochs << ", \"steps\": " << s.steps
      << ",\n  \"clip_eps_low\": " << jfloat(s.clip_eps_low) << ", \"clip_eps_high\": " << jfloat(s.clip_eps_high)
      << ", \"tis_cap\": " << jfloat(s.tis_cap) << ",\n  \"rollout_recipe\": " << jstr(s.rollout_recipe)
      << ", \"trainer_recipe\": " << jstr(s.trainer_recipe) << ",\n  \"pretrain_source\": " << jstr(s.pretrain_source)
      << ", \"pretrain_seconds\": " << jnum(s.pretrain_seconds)
      << ", \"pretrain_heldout_loss\": " << jnum(s.pretrain_heldout_loss)
      << ",\n  \"parameters\": " << jnum(s.parameters) << ", \"wall_seconds\": " << jnum(s.wall_seconds)
      << ",\n  \"findings\": [";
    for (std::size_t i = 0; i < s.findings.size(); ++i) o << (i ? ", " : "") << jstr(s.findings[i]);
    o << "],\n  \"runs\": [";
    for (std::size_t i = 0; i < s.runs.size(); ++i) {
        const auto& r = s.runs[i];
        o << (i ? "," : "") << "\n    {\"variant\": " << jstr(r.variant) << ", \"seed\": " << r.seed
          << ", \"steps\": " << r.steps.size() << ",\n     \"final_reward\": " << jnum(r.final_reward)
          << ", \"final_solved_fraction\": " << jnum(r.final_solved_fraction)
          << ", \"final_entropy\": " << jnum(r.final_entropy)
          << ", \"mean_abs_log_ratio\": " << jnum(r.mean_abs_log_ratio)
          << ",\n     \"clip_fraction_negative\": " << jnum(r.clip_fraction_negative)
          << ", \"clip_fraction_positive\": " << jnum(r.clip_fraction_positive)
          << ", \"crossings_negative_pushed_below\": " << r.crossings_negative_pushed_below
          << ", \"crossings_branch_changed\": " << r.crossings_branch_changed
          << ",\n     \"rollout_tokens_per_second\": " << jnum(r.rollout_tokens_per_second)
          << ", \"update_tokens_per_second\": " << jnum(r.update_tokens_per_second)
          << ", \"wall_seconds\": " << jnum(r.wall_seconds)
          << ",\n     \"calibration_updates\": " << r.calibration_updates
          << ", \"calibration_references\": " << r.calibration_references
          << ", \"calibration_seconds\": " << jnum(r.calibration_seconds)
          << ", \"calibration_forward_seconds\": " << jnum(r.calibration_forward_seconds)
          << ",\n     \"monitor_seconds\": " << jnum(r.monitor_seconds) << ", \"restarts\": " << r.restarts
          << ", \"sample\": " << jstr(r.sample) << ",\n     \"recoveries\": [";
        for (std::size_t k = 0; k < r.recoveries.size(); ++k) {
            const auto& e = r.recoveries[k];
            o << (k ? ", " : "") << "{\"step\": " << e.step << ", \"action\": " << jstr(e.action)
              << ", \"reason\": " << jstr(e.reason) << ", \"seconds\": " << jnum(e.seconds)
              << ", \"replayed_steps\": " << e.replayed_steps << "}";
        }
        o << "],\n     \"per_step\": {\n      \"step\": "
          << jarray(r.steps, [](const step_record& t) { return std::to_string(t.step); });
        for (const auto& [name, f] : step_numbers())
            o << ",\n      \"" << name
              << "\": " << jarray(r.steps, [f = f](const step_record& t) { return jnum(t.*f); });
        for (const auto& [name, f] : step_counts())
            o << ",\n      \"" << name
              << "\": " << jarray(r.steps, [f = f](const step_record& t) { return std::to_string(t.*f); });
        o << ",\n      \"clip_lower\": " << jarray(r.steps, [](const step_record& t) { return jfloat(t.clip_lower); })
          << ",\n      \"clip_upper\": " << jarray(r.steps, [](const step_record& t) { return jfloat(t.clip_upper); })
          << ",\n      \"monitor\": " << jarray(r.steps, [](const step_record& t) { return jstr(t.monitor); }) << "}}";
    }
    o << "\n  ]\n}\n";
    return o.str();
}

inline std::string markdown(const sweep_result& s) {
    using namespace report_detail;
    const auto gs = groups_of(s);
    std::ostringstream o;
    o << "# GRPO with FP8 rollouts: report\n\n## Findings\n\n";
    for (const auto& f : s.findings) o << "- " << cell(f) << "\n";
    if (s.findings.empty()) o << "None recorded.\n";
    o << "\n## Setup\n\n- Task: " << cell(s.task) << "\n- Prompts of " << s.prompt_chars
      << " characters, completions of " << s.completion_chars << "; " << s.prompts_per_step << " prompts per step x "
      << s.group_size << " completions each (group size), " << s.epochs << " epochs per batch, " << s.steps
      << " steps\n- Clip bounds [" << printf_str("%g", 1.0f - s.clip_eps_low) << ", "
      << printf_str("%g", 1.0f + s.clip_eps_high) << "] (eps_low " << printf_str("%g", s.clip_eps_low) << ", eps_high "
      << printf_str("%g", s.clip_eps_high) << "); truncated importance sampling cap " << printf_str("%g", s.tis_cap)
      << "\n- Rollout recipe: `" << cell(s.rollout_recipe) << "`; trainer recipe: `" << cell(s.trainer_recipe)
      << "`\n- Starting policy: " << cell(s.pretrain_source) << " (" << duration_str(s.pretrain_seconds)
      << ", held-out loss " << na_or(s.pretrain_heldout_loss, "%.4f") << " nats/char); "
      << printf_str("%.0f", s.parameters) << " parameters\n- Command: `" << cell(s.command)
      << "`\n- Machine: " << cell(s.machine) << "\n- Wall time: " << duration_str(s.wall_seconds) << ", "
      << s.runs.size() << " runs\n";
    std::string head, rule;
    for (const auto& m : metrics()) head += std::string(" ") + m.header + " |", rule += "---|";
    o << "\n## Summary over seeds\n\nEach cell: mean over seeds (min..max). Outcomes are means over the last quarter "
         "of the steps; clip fractions are means over steps; crossings are totals over steps.\n\n| variant | seeds |"
      << head << "\n|---|---|" << rule << "\n";
    for (const auto& g : gs) {
        o << "| " << cell(g.variant) << " | " << g.runs.size() << " |";
        for (const auto& m : metrics()) {
            std::vector<double> v;
            for (const auto* r : g.runs) v.push_back(m.of(*r));
            o << " " << mean_range(v, m.fmt) << " |";
        }
        o << "\n";
    }
    o << "\n## Per seed\n\n| variant | seed | steps |" << head << "\n|---|---|---|" << rule << "\n";
    for (const auto& g : gs)
        for (const auto* r : g.runs) {
            o << "| " << cell(g.variant) << " | " << r->seed << " | " << r->steps.size() << " |";
            for (const auto& m : metrics()) o << " " << na_or(m.of(*r), m.fmt) << " |";
            o << "\n";
        }
    o << "\n## Recoveries\n\n";
    std::size_t events = 0;
    for (const auto& r : s.runs) events += r.recoveries.size();
    if (events == 0) o << "None: no run needed a recovery.\n";
    if (events > 0)
        o << "| variant | seed | step | action | reason | seconds | replayed steps |\n|---|---|---|---|---|---|---|\n";
    for (const auto& g : gs)
        for (const auto* r : g.runs)
            for (const auto& e : r->recoveries)
                o << "| " << cell(g.variant) << " | " << r->seed << " | " << e.step << " | " << cell(e.action) << " | "
                  << cell(e.reason) << " | " << na_or(e.seconds, "%.3g") << " | " << e.replayed_steps << " |\n";
    o << "\n## Plots\n\n![reward per step](reward.svg)\n\n![entropy per step](entropy.svg)\n\n![clipping by the "
         "advantage's sign](clipping.svg)\n\n![training-inference mismatch](mismatch.svg)\n\n## Samples\n\nOne per "
         "variant, from its first run, after training.\n";
    for (const auto& g : gs)
        o << "\n### " << cell(g.variant) << " (seed " << g.runs.front()->seed << ")\n\n"
          << code_block(g.runs.front()->sample);
    return o.str();
}

/// Writes report.md, report.json, reward.svg, entropy.svg, clipping.svg and mismatch.svg into
/// `folder` (created if needed).
inline void write_report(const sweep_result& s, const std::string& folder) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(folder, ec);
    OCTET_REQUIRE(!ec && fs::is_directory(folder), "rl::write_report", "folder",
                  "'" + folder + "' could not be created (" + ec.message() + "); pass a writable folder");
    const fs::path d(folder);
    report_detail::write_file(d / "report.json", json(s));
    report_detail::write_file(d / "report.md", markdown(s));
    report_detail::write_file(d / "reward.svg", reward_svg(s));
    report_detail::write_file(d / "entropy.svg", entropy_svg(s));
    report_detail::write_file(d / "clipping.svg", clipping_svg(s));
    report_detail::write_file(d / "mismatch.svg", mismatch_svg(s));
}

}  // namespace rl
