// examples/08_training/report/plots.hpp: the three SVG plots: loss curves with seed bands, memory by category
// beside the ledger, and the saturation, underflow and attention-residual telemetry.
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

}  // namespace report_detail
}  // namespace train
