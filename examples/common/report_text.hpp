// examples/common/report_text.hpp: what the programs' reports are written with, apart from the
// plots (report_svg.hpp): the machine's description, numbers and text for markdown, XML and JSON
// (jnum: the shortest text that reads back as the same double), statistics over seeds, the
// curves' smoothing, and writing a file. Shared by the training program (examples/08_training)
// and the RL program (examples/09_rl); each writes its own report from these.
#pragma once

#include <octet/octet.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace common {

/// A value not measured (a run that stopped early, a recipe without the quantity): NaN, written as
/// null in JSON and n/a in markdown.
inline constexpr double not_measured = std::numeric_limits<double>::quiet_NaN();

namespace report_kit {

// ---- text -----------------------------------------------------------------------------------

/// The CPU model (from /proc/cpuinfo, where there is one) and the thread count, for a report.
inline std::string machine_description(int threads) {
    std::string model = "unknown CPU";
    std::ifstream cpu("/proc/cpuinfo");
    for (std::string line; std::getline(cpu, line);)
        if (line.rfind("model name", 0) == 0) {
            model = line.substr(line.find(':') + 2);
            break;
        }
    return model + ", " + std::to_string(threads) + " threads";
}

inline std::string printf_str(const char* f, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}
inline std::string na_or(double v, const char* f) {
    return std::isfinite(v) ? printf_str(f, v) : "n/a";
}
inline std::string bytes_str(double b) {
    if (!std::isfinite(b)) return "n/a";
    const double a = std::fabs(b);
    if (a >= 1073741824.0) return printf_str("%.2f GiB", b / 1073741824.0);
    if (a >= 1048576.0) return printf_str("%.2f MiB", b / 1048576.0);
    return printf_str("%.1f KiB", b / 1024.0);
}
inline std::string duration_str(double s) {
    if (!std::isfinite(s) || s < 0) return "--";
    char buf[32];
    const long t = std::lround(s);
    if (s < 60)
        std::snprintf(buf, sizeof buf, "%.1fs", s);
    else if (t < 3600)
        std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
    else
        std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    return buf;
}

/// Replaces bytes that are not valid UTF-8 with U+FFFD, so JSON, XML and markdown readers accept
/// any text (a character model can emit half of a multi-byte character).
inline std::string utf8(const std::string& s) {
    std::string out;
    for (std::size_t i = 0; i < s.size();) {
        const auto c = static_cast<unsigned char>(s[i]);
        std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
        bool ok = n > 0 && i + n <= s.size() && !(n == 2 && c < 0xC2) && c < 0xF5;
        for (std::size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
        if (ok && n > 2) {  // no overlong forms, UTF-16 surrogates, or code points past U+10FFFF
            const auto c1 = static_cast<unsigned char>(s[i + 1]);
            ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 > 0x9F) && !(c == 0xF0 && c1 < 0x90) &&
                 !(c == 0xF4 && c1 > 0x8F);
        }
        if (ok)
            out.append(s, i, n);
        else
            out += "\xEF\xBF\xBD";
        i += ok ? n : 1;
    }
    return out;
}
inline std::string xml(const std::string& s) {
    std::string out;
    for (char c : utf8(s)) {
        if (c == '&')
            out += "&amp;";
        else if (c == '<')
            out += "&lt;";
        else if (c == '>')
            out += "&gt;";
        else if (c == '"')
            out += "&quot;";
        else if (static_cast<unsigned char>(c) < 0x20)
            out += ' ';  // XML 1.0 forbids most controls
        else
            out += c;
    }
    return out;
}
/// A markdown table cell: one line, '|' escaped.
inline std::string cell(const std::string& s) {
    std::string one = utf8(s);
    for (char& c : one)
        if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    return octet::detail::md_cell(one);
}
inline std::string jstr(const std::string& s) {
    return octet::detail::json_string(utf8(s));
}
/// A fenced markdown code block holding `text` as it is (control characters shown as '?').
inline std::string code_block(const std::string& text) {
    std::string clean;
    for (char c : utf8(text)) clean += (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') ? '?' : c;
    std::size_t run = 0, longest = 0;
    for (char c : clean) run = c == '`' ? run + 1 : 0, longest = std::max(longest, run);
    const std::string fence(std::max<std::size_t>(3, longest + 1), '`');  // longer than any backtick run inside
    return fence + "text\n" + clean + "\n" + fence + "\n";
}
/// The shortest text that reads back as the same double (so that two runs' reports compare bit
/// for bit); null where JSON has no number.
inline std::string jnum(double v) {
    if (!std::isfinite(v)) return "null";
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
}

// ---- statistics over seeds ---------------------------------------------------------------------

/// Over the finite values: count, mean, sample standard deviation (n-1; 0 for one value), min, max.
struct stats {
    int n = 0;
    double mean = not_measured, std = not_measured, min = not_measured, max = not_measured;
};
inline stats stats_of(const std::vector<double>& v) {
    stats s;
    double sum = 0;
    for (double x : v)
        if (std::isfinite(x)) {
            sum += x;
            s.min = s.n ? std::min(s.min, x) : x;
            s.max = s.n ? std::max(s.max, x) : x;
            ++s.n;
        }
    if (s.n == 0) return s;
    s.mean = sum / s.n;
    double ss = 0;
    for (double x : v)
        if (std::isfinite(x)) ss += (x - s.mean) * (x - s.mean);
    s.std = s.n > 1 ? std::sqrt(ss / (s.n - 1)) : 0.0;
    return s;
}
inline double mean_finite(const std::vector<double>& v) {
    return stats_of(v).mean;
}
inline double max_finite(const std::vector<double>& v) {
    return stats_of(v).max;
}

/// Per layer, the largest finite value over steps of a [step][layer] series.
inline std::vector<double> per_layer_max(const std::vector<std::vector<double>>& steps) {
    std::vector<double> out;
    for (const auto& row : steps)
        for (std::size_t l = 0; l < row.size(); ++l) {
            if (out.size() <= l) out.push_back(not_measured);
            if (std::isfinite(row[l]) && !(row[l] <= out[l])) out[l] = row[l];
        }
    return out;
}
inline std::vector<double> layer_series(const std::vector<std::vector<double>>& steps, std::size_t layer) {
    std::vector<double> out;
    for (const auto& row : steps) out.push_back(layer < row.size() ? row[layer] : not_measured);
    return out;
}

// ---- curves -------------------------------------------------------------------------------------

/// The plots' smoothing: a centred moving average over about 1/40 of the run.
inline int smoothing_window(std::size_t n) {
    return std::max(1, static_cast<int>(n / 40));
}
inline std::vector<double> moving_average(const std::vector<double>& v, int window) {
    std::vector<double> out(v.size());
    const long half = window / 2, n = static_cast<long>(v.size());
    for (long i = 0; i < n; ++i) {
        double sum = 0;
        long k = 0;
        for (long j = std::max(0L, i - half); j <= std::min(n - 1, i + half); ++j, ++k) sum += v[j];
        out[i] = sum / k;  // a non-finite value spreads over its window: divergence stays visible
    }
    return out;
}
/// Means over consecutive windows of `stride` values (the last window may be shorter).
inline std::vector<double> window_means(const std::vector<double>& v, std::size_t stride) {
    if (stride <= 1) return v;
    std::vector<double> out;
    for (std::size_t i = 0; i < v.size(); i += stride) {
        const std::size_t e = std::min(v.size(), i + stride);
        double sum = 0;
        for (std::size_t j = i; j < e; ++j) sum += v[j];
        out.push_back(sum / double(e - i));
    }
    return out;
}
/// Per step over the seeds' curves: min, mean and max; NaN (a gap in the plot) where a seed's value
/// is not finite, so that one diverged seed is not hidden behind the others' mean.
struct band {
    std::vector<double> lo, mean, hi;
};
inline band band_of(const std::vector<std::vector<double>>& curves) {
    band b;
    std::size_t n = 0;
    for (const auto& c : curves) n = std::max(n, c.size());
    for (std::size_t i = 0; i < n; ++i) {
        std::vector<double> at;
        bool finite = true;
        for (const auto& c : curves)
            if (i < c.size()) at.push_back(c[i]), finite = finite && std::isfinite(c[i]);
        const stats s = finite ? stats_of(at) : stats{};
        b.lo.push_back(s.min), b.mean.push_back(s.mean), b.hi.push_back(s.max);
    }
    return b;
}

// ---- files --------------------------------------------------------------------------------------

inline void write_file(const std::filesystem::path& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary);
    f << text;
    f.close();
    OCTET_REQUIRE(f.good(), "common::report_kit::write_file", "folder",
                  "could not be written (" + path.string() + "); pass a writable folder");
}

}  // namespace report_kit
}  // namespace common
