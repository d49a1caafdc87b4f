// examples/common/report_svg.hpp: SVG plots drawn by hand for the programs' reports: a panel
// mapping data ranges to pixels (linear or logarithmic y), axes with ticks, paths broken where a
// value is not drawable, seed bands, legends. Shared by the training program (examples/08_training)
// and the RL program (examples/09_rl).
#pragma once

#include "report_text.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace common {
namespace report_kit {

inline const char* colour(std::size_t i) {
    static const char* p[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                              "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    return p[i % 10];
}
inline const char* dash(std::size_t i) {
    static const char* p[] = {"none", "6,3", "2,2", "8,3,2,3"};
    return p[i % 4];
}

/// A plot area: data ranges mapped to SVG pixels, linear or logarithmic in y.
struct panel {
    double x = 0, y = 0, w = 0, h = 0;
    double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
    bool log_y = false;
    double y_unit = 1;  ///< linear ticks fall on round multiples of this (e.g. 1 MiB on a bytes axis)
    int id = 0;
    double px(double v) const { return x + (v - x0) / (x1 - x0) * w; }
    double py(double v) const {
        const double t =
            log_y ? (std::log10(v) - std::log10(y0)) / (std::log10(y1) - std::log10(y0)) : (v - y0) / (y1 - y0);
        return y + h - t * h;
    }
    bool drawable(double v) const { return std::isfinite(v) && (!log_y || v > 0); }
    /// Fits the y range to the finite (and, in log, positive) values, padded; log when they span
    /// more than `log_ratio` (0: never, negative: always).
    void fit_y(const std::vector<double>& v, double log_ratio) {
        double lo = INFINITY, hi = -INFINITY, lo_pos = INFINITY;
        for (double a : v)
            if (std::isfinite(a))
                lo = std::min(lo, a), hi = std::max(hi, a), lo_pos = a > 0 ? std::min(lo_pos, a) : lo_pos;
        log_y = log_ratio < 0 || (log_ratio > 0 && std::isfinite(lo_pos) && lo > 0 && hi / lo > log_ratio);
        if (log_y) {
            if (!std::isfinite(lo_pos)) lo_pos = 1e-8, hi = 1;  // nothing positive: an empty log panel
            y0 = lo_pos / 1.3, y1 = std::max(hi, lo_pos * 10) * 1.3;
        } else {
            if (!std::isfinite(lo)) lo = 0, hi = 1;
            const double pad = hi > lo ? 0.05 * (hi - lo) : std::max(1e-12, 0.05 * std::fabs(hi));
            y0 = lo - pad, y1 = hi + pad;
        }
    }
};
inline std::string num(double v) {
    return printf_str("%.1f", v);
}

inline std::vector<double> linear_ticks(double lo, double hi) {
    if (!(hi > lo) || !std::isfinite(hi - lo)) return {};
    const double raw = (hi - lo) / 5, mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag;
    for (double m : {1.0, 2.0, 5.0, 10.0})
        if (m * mag >= raw) {
            step = m * mag;
            break;
        }
    std::vector<double> t;
    for (double v = std::ceil(lo / step) * step; v <= hi + 1e-9 * step && t.size() < 50; v += step)
        t.push_back(std::fabs(v) < 1e-12 * step ? 0.0 : v);
    return t;
}
inline std::vector<double> log_ticks(double lo, double hi) {
    const int k0 = static_cast<int>(std::floor(std::log10(lo))), k1 = static_cast<int>(std::ceil(std::log10(hi)));
    for (const std::vector<double>& ms : {std::vector<double>{1}, {1, 2, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9}}) {
        std::vector<double> t;
        const int every = ms.size() == 1 ? std::max(1, (k1 - k0) / 8) : 1;
        for (int k = k0; k <= k1; ++k)
            for (double m : ms)
                if (m * std::pow(10.0, k) >= lo && m * std::pow(10.0, k) <= hi && (k - k0) % every == 0)
                    t.push_back(m * std::pow(10.0, k));
        if (t.size() >= 3) return t;
    }
    return linear_ticks(lo, hi);  // less than a decade: plain ticks, placed logarithmically
}

/// Frame, ticks, labels, title, and a clip path for the panel's series.
inline void axes(std::ostream& o, const panel& p, const std::string& title, const std::string& xlabel,
                 const std::string& ylabel, std::string (*ylab)(double)) {
    o << "<clipPath id=\"clip" << p.id << "\"><rect x=\"" << num(p.x) << "\" y=\"" << num(p.y) << "\" width=\""
      << num(p.w) << "\" height=\"" << num(p.h) << "\"/></clipPath>\n"
      << "<rect x=\"" << num(p.x) << "\" y=\"" << num(p.y) << "\" width=\"" << num(p.w) << "\" height=\"" << num(p.h)
      << "\" fill=\"none\" stroke=\"#444\"/>\n"
      << "<text x=\"" << num(p.x + p.w / 2) << "\" y=\"" << num(p.y - 8)
      << "\" text-anchor=\"middle\" font-weight=\"bold\">" << xml(title) << "</text>\n";
    if (!xlabel.empty()) {
        for (double t : linear_ticks(p.x0, p.x1))
            o << "<line x1=\"" << num(p.px(t)) << "\" y1=\"" << num(p.y + p.h) << "\" x2=\"" << num(p.px(t))
              << "\" y2=\"" << num(p.y + p.h + 4) << "\" stroke=\"#444\"/><text x=\"" << num(p.px(t)) << "\" y=\""
              << num(p.y + p.h + 16) << "\" text-anchor=\"middle\">" << printf_str("%g", t) << "</text>\n";
        o << "<text x=\"" << num(p.x + p.w / 2) << "\" y=\"" << num(p.y + p.h + 32) << "\" text-anchor=\"middle\">"
          << xml(xlabel) << "</text>\n";
    }
    std::vector<double> yt = p.log_y ? log_ticks(p.y0, p.y1) : linear_ticks(p.y0 / p.y_unit, p.y1 / p.y_unit);
    if (!p.log_y)
        for (double& t : yt) t *= p.y_unit;
    for (double t : yt)
        o << "<line x1=\"" << num(p.x - 4) << "\" y1=\"" << num(p.py(t)) << "\" x2=\"" << num(p.x + p.w) << "\" y2=\""
          << num(p.py(t)) << "\" stroke=\"#ddd\"/><text x=\"" << num(p.x - 6) << "\" y=\"" << num(p.py(t) + 4)
          << "\" text-anchor=\"end\">" << xml(ylab(t)) << "</text>\n";
    o << "<text transform=\"translate(" << num(p.x - 64) << "," << num(p.y + p.h / 2)
      << ") rotate(-90)\" text-anchor=\"middle\">" << xml(ylabel) << (p.log_y ? " (log)" : "") << "</text>\n";
}
/// Path data through the drawable points, broken where a value is not drawable.
inline std::string path_d(const panel& p, const std::vector<double>& xs, const std::vector<double>& ys) {
    std::string d;
    bool pen = false;
    for (std::size_t i = 0; i < xs.size() && i < ys.size(); ++i) {
        if (!p.drawable(ys[i])) {
            pen = false;
            continue;
        }
        d += (pen ? "L" : "M") + num(p.px(xs[i])) + " " + num(p.py(ys[i])) + " ";
        pen = true;
    }
    return d;
}
/// Filled band between lo and hi, one polygon per stretch where both are drawable.
inline std::string band_d(const panel& p, const std::vector<double>& xs, const std::vector<double>& lo,
                          const std::vector<double>& hi) {
    std::string d;
    for (std::size_t i = 0; i < xs.size();) {
        std::size_t e = i;
        while (e < xs.size() && p.drawable(lo[e]) && p.drawable(hi[e])) ++e;
        if (e > i + 1) {
            for (std::size_t k = i; k < e; ++k)
                d += (k == i ? "M" : "L") + num(p.px(xs[k])) + " " + num(p.py(hi[k])) + " ";
            for (std::size_t k = e; k-- > i;) d += "L" + num(p.px(xs[k])) + " " + num(p.py(lo[k])) + " ";
            d += "Z ";
        }
        i = e + 1;
    }
    return d;
}
/// Indices of at most `points` evenly spaced entries (first and last kept).
inline std::vector<std::size_t> thin(std::size_t n, std::size_t points) {
    std::vector<std::size_t> out;
    if (n <= points) {
        for (std::size_t i = 0; i < n; ++i) out.push_back(i);
    } else {
        for (std::size_t k = 0; k < points; ++k) out.push_back((k * (n - 1) + (points - 1) / 2) / (points - 1));
    }
    return out;
}
inline std::vector<double> pick(const std::vector<double>& v, const std::vector<std::size_t>& idx) {
    std::vector<double> out;
    for (std::size_t i : idx) out.push_back(i < v.size() ? v[i] : not_measured);
    return out;
}
inline std::vector<double> as_steps(const std::vector<std::size_t>& idx) {
    return std::vector<double>(idx.begin(), idx.end());
}

inline std::string svg_open(double w, double h) {
    return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(w) +
           "\" height=\"" + num(h) + "\" viewBox=\"0 0 " + num(w) + " " + num(h) +
           "\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
}
/// A legend row of coloured swatches from (x, y), wrapping at `width`.
inline double legend(std::ostream& o, double x, double y, double width, const std::vector<std::string>& names,
                     const std::vector<std::string>& colours) {
    double cx = x;
    for (std::size_t i = 0; i < names.size(); ++i) {
        const double w = 32 + 7 * static_cast<double>(utf8(names[i]).size());
        if (cx + w > x + width && cx > x) cx = x, y += 16;
        o << "<rect x=\"" << num(cx) << "\" y=\"" << num(y - 9) << "\" width=\"16\" height=\"10\" fill=\"" << colours[i]
          << "\"/><text x=\"" << num(cx + 20) << "\" y=\"" << num(y) << "\">" << xml(names[i]) << "</text>\n";
        cx += w;
    }
    return y + 16;
}
inline std::string plain_tick(double v) {
    return printf_str("%g", v);
}
inline std::string bytes_tick(double v) {
    const double a = std::fabs(v);
    return a == 0              ? "0"
           : a >= 1073741824.0 ? printf_str("%g GiB", v / 1073741824.0)
           : a >= 1048576.0    ? printf_str("%g MiB", v / 1048576.0)
                               : printf_str("%g KiB", v / 1024.0);
}
inline std::string sci_tick(double v) {
    return printf_str("%.0e", v);
}
}  // namespace report_kit
}  // namespace common
