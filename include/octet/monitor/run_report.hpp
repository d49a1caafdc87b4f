// octet/monitor/run_report.hpp: one report of a training run that puts together what a final
// loss alone hides: loss, throughput, peak memory (from the memory ledger), restarts and
// recoveries with their cost (from the recovery log), and the monitors' own overhead.
//
//   octet::run_report report;
//   report.record_step(step, loss, tokens, seconds);   // every executed step, replays included
//   report.set_wall_seconds(total);                     // optional (default: steps + recovery time)
//   std::string json = report.to_json(registry, policy.log(), ledger);
//   std::string md   = report.to_markdown(registry, policy.log(), ledger);
//
// Definitions: record every execution of a step, including the one a repeat_step callback runs
// and the replays after a reload. A step executed more than once counts once in
// `distinct_steps`, with the loss of its last execution; `tokens_processed` counts every
// execution, `tokens_kept` the last execution of each distinct step. Throughput is
// tokens_processed / wall seconds; goodput is tokens_kept / wall seconds. Wall seconds default
// to the recorded step times plus the raise and reload callbacks' own time (set_wall_seconds
// overrides). Monitor overhead is the checks' recorded cost over the wall seconds. Non-finite
// numbers are written as null in JSON.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <sstream>
#include <string>

#include "octet/config.hpp"
#include "octet/core/check.hpp"
#include "octet/monitor/checks.hpp"
#include "octet/monitor/memory_ledger.hpp"
#include "octet/monitor/recovery.hpp"

namespace octet {

struct run_summary {
    std::uint64_t executed_steps = 0, distinct_steps = 0;
    double first_loss = 0, final_loss = 0, min_loss = 0;
    double tokens_processed = 0, tokens_kept = 0;
    double step_seconds = 0, wall_seconds = 0;
    double throughput = 0, goodput = 0;  ///< tokens per second
    double peak_memory_bytes = 0;
    std::size_t restarts = 0, recoveries = 0;
    std::size_t raises = 0, repeats = 0;
    bool gave_up = false;
    double recovery_seconds = 0, recovery_max_bytes = 0;
    double monitor_seconds = 0, monitor_overhead = 0;  ///< overhead: fraction of wall time
};

class run_report {
public:
    /// Records one executed step (its loss, tokens and wall time).
    void record_step(std::int64_t step, double loss, double tokens, double seconds) {
        OCTET_REQUIRE(tokens >= 0, "octet::run_report::record_step", "tokens", "must be non-negative");
        OCTET_REQUIRE(seconds >= 0, "octet::run_report::record_step", "seconds", "must be non-negative");
        if (executed_ == 0) first_loss_ = loss;
        ++executed_;
        tokens_processed_ += tokens;
        step_seconds_ += seconds;
        last_[step] = step_record{loss, tokens};
    }
    /// The run's wall time, when the caller measured it (else steps plus recovery time are used).
    void set_wall_seconds(double seconds) {
        OCTET_REQUIRE(seconds >= 0, "octet::run_report::set_wall_seconds", "seconds", "must be non-negative");
        wall_seconds_ = seconds;
    }

    run_summary summarize(const check_registry& reg, const recovery_log& log, const memory_ledger& ledger) const {
        run_summary s;
        s.executed_steps = executed_;
        s.distinct_steps = last_.size();
        s.first_loss = executed_ ? first_loss_ : std::numeric_limits<double>::quiet_NaN();
        s.final_loss = last_.empty() ? std::numeric_limits<double>::quiet_NaN() : last_.rbegin()->second.loss;
        s.min_loss = std::numeric_limits<double>::quiet_NaN();
        for (const auto& [step, r] : last_) {
            s.tokens_kept += r.tokens;
            if (std::isfinite(r.loss) && !(r.loss >= s.min_loss)) s.min_loss = r.loss;
        }
        s.tokens_processed = tokens_processed_;
        s.step_seconds = step_seconds_;
        s.recovery_seconds = log.seconds();
        s.recovery_max_bytes = log.max_bytes();
        // Default wall time: recorded steps (replays and repeats included) plus the raise and
        // reload callbacks (a repeat callback's time is the repeated step, recorded already).
        double callbacks = 0;
        for (const auto& e : log.entries())
            if (e.action != recovery_action::repeat_step) callbacks += e.callback_seconds;
        s.wall_seconds = wall_seconds_ >= 0 ? wall_seconds_ : step_seconds_ + callbacks;
        s.throughput = s.wall_seconds > 0 ? s.tokens_processed / s.wall_seconds : 0.0;
        s.goodput = s.wall_seconds > 0 ? s.tokens_kept / s.wall_seconds : 0.0;
        s.peak_memory_bytes = ledger.peak_total();
        s.restarts = log.restarts();
        s.recoveries = log.recoveries();
        s.raises = log.count(recovery_action::raise_precision);
        s.repeats = log.count(recovery_action::repeat_step);
        s.gave_up = log.gave_up();
        s.monitor_seconds = reg.cost_seconds();
        s.monitor_overhead = s.wall_seconds > 0 ? s.monitor_seconds / s.wall_seconds : 0.0;
        return s;
    }

    std::string to_json(const check_registry& reg, const recovery_log& log, const memory_ledger& ledger) const {
        const run_summary s = summarize(reg, log, ledger);
        using detail::json_number;
        std::ostringstream os;
        os << "{\"octet_version\": \"" << OCTET_VERSION_STRING << "\",\n"
           << " \"steps\": {\"executed\": " << s.executed_steps << ", \"distinct\": " << s.distinct_steps << "},\n"
           << " \"loss\": {\"first\": " << json_number(s.first_loss) << ", \"final\": " << json_number(s.final_loss)
           << ", \"min\": " << json_number(s.min_loss) << "},\n"
           << " \"throughput\": {\"tokens_processed\": " << json_number(s.tokens_processed)
           << ", \"tokens_kept\": " << json_number(s.tokens_kept)
           << ", \"wall_seconds\": " << json_number(s.wall_seconds)
           << ", \"tokens_per_second\": " << json_number(s.throughput)
           << ", \"kept_tokens_per_second\": " << json_number(s.goodput) << "},\n"
           << " \"memory\": {\"peak_bytes\": " << json_number(s.peak_memory_bytes)
           << ", \"ledger\": " << ledger.to_json() << "},\n"
           << " \"recovery\": {\"restarts\": " << s.restarts << ", \"recoveries\": " << s.recoveries
           << ", \"raise_precision\": " << s.raises << ", \"repeat_step\": " << s.repeats
           << ", \"gave_up\": " << (s.gave_up ? "true" : "false")
           << ", \"extra_seconds\": " << json_number(s.recovery_seconds)
           << ", \"max_extra_bytes\": " << json_number(s.recovery_max_bytes) << ", \"log\": " << log.to_json() << "},\n"
           << " \"monitors\": {\"seconds\": " << json_number(s.monitor_seconds)
           << ", \"overhead_fraction\": " << json_number(s.monitor_overhead) << ", \"checks\": " << reg.to_json()
           << "}}\n";
        return os.str();
    }

    std::string to_markdown(const check_registry& reg, const recovery_log& log, const memory_ledger& ledger) const {
        const run_summary s = summarize(reg, log, ledger);
        std::ostringstream os;
        os << "## Run report\n\n| quantity | value |\n|---|---|\n"
           << "| steps executed / distinct | " << s.executed_steps << " / " << s.distinct_steps << " |\n"
           << "| loss first / final / min | " << s.first_loss << " / " << s.final_loss << " / " << s.min_loss << " |\n"
           << "| wall time (s) | " << s.wall_seconds << " |\n"
           << "| throughput (tokens/s) | " << s.throughput << " |\n"
           << "| goodput (kept tokens/s) | " << s.goodput << " |\n"
           << "| peak memory (MiB) | " << s.peak_memory_bytes / 1048576.0 << " |\n"
           << "| restarts (checkpoint reloads) | " << s.restarts << " |\n"
           << "| recoveries (raise / repeat / reload) | " << s.recoveries << " (" << s.raises << " / " << s.repeats
           << " / " << s.restarts << ")" << (s.gave_up ? ", gave up" : "") << " |\n"
           << "| recovery extra time (s) / max extra memory (MiB) | " << s.recovery_seconds << " / "
           << s.recovery_max_bytes / 1048576.0 << " |\n"
           << "| monitor time (s) / overhead | " << s.monitor_seconds << " / " << 100.0 * s.monitor_overhead << "% |\n"
           << "\n### Recovery log\n\n"
           << log.to_markdown() << "\n### Monitors\n\n"
           << reg.to_markdown() << "\n### Memory (MiB)\n\n"
           << ledger.to_markdown(1048576.0, "MiB");
        return os.str();
    }

private:
    struct step_record {
        double loss;
        double tokens;
    };

    std::uint64_t executed_ = 0;
    double first_loss_ = 0;
    double tokens_processed_ = 0;
    double step_seconds_ = 0;
    double wall_seconds_ = -1;
    std::map<std::int64_t, step_record> last_;
};

}  // namespace octet
