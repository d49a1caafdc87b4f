// examples/08_training/report.hpp: the training program's outputs, written from a sweep_result:
// report.md (verdict first), report.json (schema in report_schema.md, checked by check_report.py)
// and three SVG plots (loss curves with seed bands, memory by category beside the ledger,
// saturation/underflow and attention residual telemetry), drawn with the examples' report kit
// (examples/common/report_text.hpp, report_svg.hpp). Every number written is taken or derived from
// the sweep_result passed in. The progress bar is examples/common/progress.hpp.
#pragma once

#include "common/progress.hpp"
#include "common/report_svg.hpp"
#include "common/report_text.hpp"
#include "train.hpp"

#include <octet/octet.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
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

// ---- the three plots ------------------------------------------------------------------------------

/// One row per (size, length): the whole run, and its second half with y fitted to it (where the
/// recipes' gaps, small beside the early drop, show).
inline std::string loss_svg(const sweep_result& s) {
    const auto gs = groups_of(s);
    const auto labels = labels_of(gs);
    const auto panels = panels_of(gs);
    const double pw = 440, ph = 250;
    std::ostringstream o;
    for (std::size_t k = 0; k < panels.size(); ++k) {
        struct drawn {
            std::string label;
            band b;
            std::vector<double> hx, hy;
        };
        std::vector<drawn> ds;
        int window = 1;
        std::size_t n = 2;
        for (const auto& g : gs) {
            if (g.size != panels[k].first || g.steps != panels[k].second) continue;
            drawn d{g.label(), {}, {}, {}};
            std::vector<std::vector<double>> curves;
            std::vector<std::pair<int, std::vector<double>>> held;
            for (const auto* r : g.runs) {
                window = smoothing_window(r->train_loss.size());
                curves.push_back(moving_average(r->train_loss, window));
                for (const auto& h : r->heldout) {  // (step, loss) pairs, gathered by step over the seeds
                    auto it = std::find_if(held.begin(), held.end(), [&](const auto& e) { return e.first == h.first; });
                    if (it == held.end()) it = held.insert(held.end(), {h.first, {}});
                    it->second.push_back(h.second);
                }
            }
            d.b = band_of(curves);
            for (const auto& [step, losses] : held) d.hx.push_back(step), d.hy.push_back(mean_finite(losses));
            n = std::max(n, d.b.mean.size());
            ds.push_back(std::move(d));
        }
        for (int zoom = 0; zoom < 2; ++zoom) {
            panel p;
            p.id = int(2 * k) + zoom, p.x = 80 + zoom * (pw + 90), p.y = 50 + double(k) * (ph + 80), p.w = pw, p.h = ph;
            p.x0 = zoom ? double(n / 2) : 0, p.x1 = std::max(p.x0 + 1, double(n - 1));
            std::vector<double> all;
            for (const auto& d : ds) {
                for (std::size_t i = std::size_t(p.x0); i < d.b.mean.size(); ++i)
                    all.insert(all.end(), {d.b.lo[i], d.b.hi[i]});
                for (std::size_t i = 0; i < d.hx.size(); ++i)
                    if (d.hx[i] >= p.x0) all.push_back(d.hy[i]), p.x1 = std::max(p.x1, d.hx[i]);
            }
            p.fit_y(all, 8.0);
            axes(o, p,
                 panels[k].first + ", " + std::to_string(panels[k].second) + " steps" + (zoom ? ": second half" : "") +
                     " (moving average over " + std::to_string(window) + " steps)",
                 "step", "loss (nats/char)", plain_tick);
            for (const auto& d : ds) {
                const char* c = colour(index_of(labels, d.label));
                std::vector<std::size_t> idx;
                for (std::size_t i :
                     thin(d.b.mean.size() - std::min(d.b.mean.size(), std::size_t(p.x0)), svg_curve_points))
                    idx.push_back(i + std::size_t(p.x0));
                const auto xs = as_steps(idx);
                o << "<g class=\"series\" data-name=\"" << xml(d.label) << "\" clip-path=\"url(#clip" << p.id
                  << ")\">\n"
                  << "<path d=\"" << band_d(p, xs, pick(d.b.lo, idx), pick(d.b.hi, idx)) << "\" fill=\"" << c
                  << "\" fill-opacity=\"0.2\" stroke=\"none\"/>\n<path d=\"" << path_d(p, xs, pick(d.b.mean, idx))
                  << "\" fill=\"none\" stroke=\"" << c << "\" stroke-width=\"1.5\"/>\n";
                for (std::size_t i = 0; i < d.hx.size(); ++i)
                    if (p.drawable(d.hy[i]) && d.hx[i] >= p.x0)
                        o << "<circle class=\"heldout\" cx=\"" << num(p.px(d.hx[i])) << "\" cy=\"" << num(p.py(d.hy[i]))
                          << "\" r=\"3.5\" fill=\"white\" stroke=\"" << c << "\" stroke-width=\"1.5\"/>\n";
                o << "</g>\n";
            }
        }
    }
    std::vector<std::string> cs;
    for (std::size_t i = 0; i < labels.size(); ++i) cs.push_back(colour(i));
    const double W = 80 + 2 * (pw + 90), top = 50 + double(panels.size()) * (ph + 80);
    std::ostringstream doc;
    doc << svg_open(W, top + 20 + 16 * double(1 + labels.size() / 5)) << "<text x=\"10\" y=\"20\" font-size=\"13\" "
        << "font-weight=\"bold\">Training loss: mean over seeds (line), min..max over seeds (band), held-out loss "
           "(circles)</text>\n"
        << o.str();
    legend(doc, 80, top, W - 100, labels, cs);
    doc << "</svg>\n";
    return doc.str();
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

inline std::string memory_svg(const sweep_result& s) {
    const auto cats = categories_of(s);
    std::vector<std::string> sizes;
    for (const auto& r : s.runs)
        if (std::find(sizes.begin(), sizes.end(), r.size) == sizes.end()) sizes.push_back(r.size);
    std::ostringstream o;
    double y = 80, W = 640;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
        std::vector<std::pair<std::string, std::vector<const run_result*>>> bars;  // by recipe label
        for (const auto& r : s.runs) {
            if (r.size != sizes[k]) continue;
            const std::string label = r.recipe + (r.recovery ? "" : " (no recovery)");
            auto it = std::find_if(bars.begin(), bars.end(), [&](const auto& b) { return b.first == label; });
            if (it == bars.end()) it = bars.insert(bars.end(), {label, {}});
            it->second.push_back(&r);
        }
        auto cat_peak = [](const run_result& r, const std::string& c) {
            auto it = r.peak_bytes_by_category.find(c);
            return it == r.peak_bytes_by_category.end() ? 0.0 : it->second;
        };
        auto cat_ledger = [](const run_result& r, const std::string& c) {
            auto it = r.ledger_bytes.find(c);
            return it == r.ledger_bytes.end() ? 0.0 : it->second;
        };
        auto peak = [](const run_result& r, const std::string&) { return r.peak_bytes_measured; };
        auto ledger_total = [](const run_result& r, const std::string&) { return r.ledger_peak_bytes; };
        std::vector<double> tops;
        for (const auto& b : bars) {
            double m = 0, l = 0;
            for (const auto& c : cats) m += mean_of(b.second, cat_peak, c), l += mean_of(b.second, cat_ledger, c);
            tops.insert(tops.end(), {m, l, mean_of(b.second, peak, ""), mean_of(b.second, ledger_total, "")});
        }
        tops.push_back(0);
        panel p;
        p.id = int(k), p.x = 90, p.y = y, p.w = std::max(300.0, 70.0 * double(bars.size())), p.h = 240, p.x0 = 0,
        p.x1 = double(bars.size());
        p.fit_y(tops, 0);
        p.y0 = 0;
        p.y_unit = p.y1 >= 1073741824.0 ? 1073741824.0 : p.y1 >= 1048576.0 ? 1048576.0 : 1024.0;
        W = std::max(W, p.x + p.w + 40);
        axes(o, p, "size " + sizes[k] + ": measured (left) and ledger (right)", "", "bytes", bytes_tick);
        for (std::size_t i = 0; i < bars.size(); ++i) {
            const double bw = 0.3 * p.w / double(bars.size());
            for (int side = 0; side < 2; ++side) {
                const double bx = p.px(double(i) + 0.5) + (side ? 2 : -bw - 2);
                double base = 0;
                o << "<g class=\"bar\" data-name=\"" << xml(bars[i].first) << "\" data-side=\""
                  << (side ? "ledger" : "measured") << "\">\n";
                for (std::size_t c = 0; c < cats.size(); ++c) {
                    const double v = mean_of(bars[i].second, side ? +cat_ledger : +cat_peak, cats[c]);
                    if (!(v > 0)) continue;
                    o << "<rect x=\"" << num(bx) << "\" y=\"" << num(p.py(base + v)) << "\" width=\"" << num(bw)
                      << "\" height=\"" << num(p.py(base) - p.py(base + v)) << "\" fill=\"" << colour(c) << "\""
                      << (side ? " fill-opacity=\"0.45\"" : "") << "><title>" << xml(cats[c] + ": " + bytes_str(v))
                      << "</title></rect>\n";
                    base += v;
                }
                const double total = mean_of(bars[i].second, side ? +ledger_total : +peak, "");
                if (std::isfinite(total))
                    o << "<line x1=\"" << num(bx - 3) << "\" y1=\"" << num(p.py(total)) << "\" x2=\""
                      << num(bx + bw + 3) << "\" y2=\"" << num(p.py(total))
                      << "\" stroke=\"black\" stroke-width=\"2\"><title>"
                      << xml((side ? "ledger total " : "measured peak ") + bytes_str(total)) << "</title></line>\n";
                o << "</g>\n";
            }
            o << "<text transform=\"translate(" << num(p.px(double(i) + 0.5)) << "," << num(p.y + p.h + 14)
              << ") rotate(25)\">" << xml(bars[i].first) << "</text>\n";
        }
        y += p.h + 150;
    }
    std::vector<std::string> cs;
    for (std::size_t i = 0; i < cats.size(); ++i) cs.push_back(colour(i));
    std::ostringstream doc;
    doc << svg_open(W, y + 40)
        << "<text x=\"10\" y=\"16\" font-size=\"13\" font-weight=\"bold\">Peak memory by category, "
        << "mean over runs</text>\n<text x=\"10\" y=\"32\">bars: per-category peaks, stacked (they can sum above the "
           "total, "
        << "as</text>\n<text x=\"10\" y=\"46\">categories peak at different moments); black tick: peak total</text>\n"
        << o.str();
    legend(doc, 90, y - 40, W - 100, cats, cs);
    doc << "</svg>\n";
    return doc.str();
}

inline std::string telemetry_svg(const sweep_result& s) {
    const auto gs = groups_of(s);
    const auto labels = labels_of(gs);
    const auto panels = panels_of(gs);
    const char* titles[] = {"saturation rate", "underflow rate", "attention row-sum residual (dS)",
                            "attention row-sum residual (quantized dS)"};
    const double pw = 330, ph = 200;
    std::ostringstream o;
    for (std::size_t k = 0; k < panels.size(); ++k)
        for (int col = 0; col < 4; ++col) {
            panel p;
            p.id = int(4 * k) + col, p.x = 80 + col * (pw + 80), p.y = 50 + double(k) * (ph + 80), p.w = pw, p.h = ph;
            struct drawn {
                std::string label;
                std::size_t layer;
                std::vector<double> v;
            };
            std::vector<drawn> ds;
            std::vector<double> all;
            for (const auto& g : gs) {
                if (g.size != panels[k].first || g.steps != panels[k].second) continue;
                std::size_t layers = 1;
                if (col >= 2)
                    for (const auto* r : g.runs)
                        layers = std::max(
                            layers, per_layer_max(col == 2 ? r->attention_residual : r->attention_residual_q).size());
                for (std::size_t l = 0; l < layers; ++l) {
                    std::vector<std::vector<double>> curves;
                    for (const auto* r : g.runs) {
                        const auto v =
                            col == 0   ? r->saturation_rate
                            : col == 1 ? r->underflow_rate
                                       : layer_series(col == 2 ? r->attention_residual : r->attention_residual_q, l);
                        curves.push_back(moving_average(v, smoothing_window(v.size())));
                    }
                    drawn d{g.label(), l, band_of(curves).mean};
                    if (!(max_finite(d.v) > 0)) continue;  // zero throughout (or absent): nothing on a log axis
                    all.insert(all.end(), d.v.begin(), d.v.end());
                    p.x1 = std::max(p.x1, double(std::max<std::size_t>(d.v.size(), 2) - 1));
                    ds.push_back(std::move(d));
                }
            }
            p.fit_y(all, -1);
            axes(o, p, panels[k].first + ", " + std::to_string(panels[k].second) + " steps: " + titles[col], "step",
                 col < 2 ? "fraction" : "relative residual", sci_tick);
            if (ds.empty())
                o << "<text x=\"" << num(p.x + p.w / 2) << "\" y=\"" << num(p.y + p.h / 2)
                  << "\" text-anchor=\"middle\" fill=\"#888\">"
                  << "zero or not measured in every recipe</text>\n";
            for (const auto& d : ds) {
                const auto idx = thin(d.v.size(), svg_curve_points);
                o << "<g class=\"series\" data-name=\"" << xml(d.label) << "\" data-layer=\"" << d.layer
                  << "\" clip-path=\"url(#clip" << p.id << ")\"><path d=\"" << path_d(p, as_steps(idx), pick(d.v, idx))
                  << "\" fill=\"none\" stroke=\"" << colour(index_of(labels, d.label)) << "\" stroke-dasharray=\""
                  << dash(d.layer) << "\" stroke-width=\"1.3\"/></g>\n";
            }
        }
    std::vector<std::string> cs;
    for (std::size_t i = 0; i < labels.size(); ++i) cs.push_back(colour(i));
    const double W = 80 + 4 * (pw + 80), top = 50 + double(panels.size()) * (ph + 80);
    std::ostringstream doc;
    doc << svg_open(W, top + 60)
        << "<text x=\"10\" y=\"20\" font-size=\"13\" font-weight=\"bold\">Telemetry over steps, "
        << "mean over seeds, moving average over 1/40 of the run; residual panels: one line per layer "
        << "(solid, dashed, dotted, dash-dot = layer 0, 1, 2, 3)</text>\n"
        << o.str();
    legend(doc, 80, top, W - 100, labels, cs);
    doc << "</svg>\n";
    return doc.str();
}

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
          << ",\n     \"attention_residual_q\": " << rows(r.attention_residual_q) << "}";
    }
    o << "\n  ]\n}\n";
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

/// Writes report.md, report.json, loss_curves.svg, memory.svg and telemetry.svg into `folder`
/// (created if needed).
inline void write_report(const sweep_result& s, const std::string& folder) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(folder, ec);
    OCTET_REQUIRE(!ec && fs::is_directory(folder), "train::write_report", "folder",
                  "'" + folder + "' could not be created (" + ec.message() + "); pass a writable folder");
    using namespace report_detail;
    write_file(fs::path(folder) / "report.json", json(s));
    write_file(fs::path(folder) / "report.md", markdown(s));
    write_file(fs::path(folder) / "loss_curves.svg", loss_svg(s));
    write_file(fs::path(folder) / "memory.svg", memory_svg(s));
    write_file(fs::path(folder) / "telemetry.svg", telemetry_svg(s));
}

}  // namespace train
