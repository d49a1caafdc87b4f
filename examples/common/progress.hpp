// examples/common/progress.hpp: the programs' terminal progress bar (elapsed time, an ETA from
// the measured rate). Shared by the training program (examples/08_training) and the RL program
// (examples/09_rl).
#pragma once

#include "report_text.hpp"

#include <octet/octet.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#ifdef _WIN32
#include <io.h>
#define OCTET_TRAIN_ISATTY(f) _isatty(_fileno(f))
#else
#include <unistd.h>
#define OCTET_TRAIN_ISATTY(f) isatty(fileno(f))
#endif

namespace common {

/// A one-line progress bar with elapsed time and an ETA from the measured rate. On a terminal it
/// redraws in place (at most 10 times a second); elsewhere (CI logs), or with plain = true, it
/// prints a plain line at most every `plain_every_seconds`, and always at the start and at
/// finish(). (plain: under mpirun, whose launcher gives each rank a pseudo-terminal even when its
/// own output goes to a file, where in-place redraws would add ten lines a second.)
class progress {
public:
    progress(double total_units, std::FILE* out, bool plain = false, double plain_every_seconds = 5.0)
        : total_(total_units), out_(out), tty_(out && !plain && OCTET_TRAIN_ISATTY(out)), every_(plain_every_seconds) {
        OCTET_REQUIRE(std::isfinite(total_units) && total_units > 0, "common::progress", "total_units",
                      "must be a finite positive amount of work; pass e.g. the total steps of the sweep");
    }
    void advance(double units, const std::string& label) {
        done_ = std::min(total_, done_ + std::max(0.0, units));
        label_ = label;
        const double now = seconds();
        if (drawn_ && now - last_ < (tty_ ? 0.1 : every_)) return;
        draw(now, false);
    }
    void finish() {
        if (!finished_) draw(seconds(), true);
        finished_ = true;
    }
    ~progress() { finish(); }
    double elapsed() const { return seconds(); }

private:
    double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
    void draw(double now, bool final) {
        if (!out_) return;
        const double f = done_ / total_;
        const int width = 30, fill = static_cast<int>(f * width);
        const double eta = done_ > 0 ? now * (total_ - done_) / done_ : not_measured;
        std::string line = "[" + std::string(std::size_t(fill), '#') + std::string(std::size_t(width - fill), '.') +
                           "] " + report_kit::printf_str("%5.1f%%", 100 * f) + "  elapsed " +
                           report_kit::duration_str(now) + "  ETA " +
                           (final ? std::string("0.0s") : report_kit::duration_str(eta)) + "  " + label_;
        if (tty_) {
            if (line.size() > 110) line.resize(110);  // a line wider than the terminal would wrap and break the redraw
            const std::size_t len = line.size();
            if (line.size() < width_) line += std::string(width_ - line.size(), ' ');  // clear the longer line before
            width_ = len;
            std::fprintf(out_, "\r%s%s", line.c_str(), final ? "\n" : "");
        } else {
            std::fprintf(out_, "%s\n", line.c_str());
        }
        std::fflush(out_);
        drawn_ = true, last_ = now;
    }

    double total_, done_ = 0;
    std::FILE* out_;
    bool tty_;
    double every_, last_ = 0;
    bool drawn_ = false, finished_ = false;
    std::size_t width_ = 0;
    std::string label_;
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace common
