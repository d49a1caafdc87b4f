// octet/monitor/checks.hpp: a registry of named numerical checks with thresholds.
//
// The layers of a training step (attention, quantizers, optimizer codecs, RL clipping) report
// plain numbers; the registry classifies each against the check's thresholds, keeps its value
// per step and its own cost (time), and tells the recovery policy (recovery.hpp) what tripped.
//
//   octet::check_registry reg;
//   auto rowsum = reg.add("attn.l3.row_sum", octet::check_kind::softmax_row_sum, "attention.l3");
//   auto nf     = reg.add("grad.non_finite", octet::check_kind::non_finite, "backward");
//   reg.measure(rowsum, step, [&] { return octet::softmax_row_sum_residual(p, rows, cols); });  // timed
//   reg.record(nf, step, octet::count_non_finite(grads), seconds_spent);                        // plain value
//   for (auto id : reg.tripped(step)) ...
//
// Threshold logic: a threshold says which side is bad (above: larger values are worse; below:
// smaller ones are) and two limits. For `above`: value > trip is a trip, else value > warn a
// warning, else ok (`below` mirrors it). A NaN value is always a trip: a monitor that cannot
// produce a number has found a problem. `patience` asks for that many consecutive steps whose
// samples trip before a trip counts (earlier ones report warn); a repeat of the same step (a new
// attempt) replaces that step's sample in the count instead of adding one, so repeating a step
// cannot turn a warning into a trip. Every named kind measures something that is never negative
// (a rate, a count, a norm, a ratio), so add() rejects a negative warn or trip limit for them
// (with side `above` a value of 0 would trip); `custom` accepts any limits.
//
// Named kinds and their default thresholds (starting points; pass your own to add()):
//   kind                     value (helpers in monitor/signals.hpp)                       warn    trip
//   softmax_row_sum          max over rows |sum_j P_ij - 1|                               1e-3    1e-2
//   stored_o_vs_pv           ||O_stored - P V||_2 / ||P V||_2                             2e-2    1e-1
//   saturation_rate          fraction of inputs beyond the format's max finite            1e-4    1e-3
//   underflow_rate           fraction of non-zero inputs that encode to zero              1e-2    1e-1
//   amax_drift               amax now / max(delayed-scaling amax history)                 1.0     2.0
//   non_finite               count of NaN/Inf values                                      0       0   (any > 0 trips)
//   optimizer_decode_error   relative RMS error of decoded optimizer state                1e-2    5e-2
//   clip_crossings           negative-advantage tokens pushed out of the clip region
//                            (crossing_report::negative_pushed_out_fraction)              1e-3    1e-2
//   custom                   anything; the default never trips: pass a threshold
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "octet/config.hpp"
#include "octet/core/check.hpp"

namespace octet {

enum class check_kind : int {
    softmax_row_sum = 0,
    stored_o_vs_pv,
    saturation_rate,
    underflow_rate,
    amax_drift,
    non_finite,
    optimizer_decode_error,
    clip_crossings,
    custom
};
inline constexpr int check_kind_count = 9;

inline const char* check_kind_name(check_kind k) {
    switch (k) {
        case check_kind::softmax_row_sum:
            return "softmax_row_sum";
        case check_kind::stored_o_vs_pv:
            return "stored_o_vs_pv";
        case check_kind::saturation_rate:
            return "saturation_rate";
        case check_kind::underflow_rate:
            return "underflow_rate";
        case check_kind::amax_drift:
            return "amax_drift";
        case check_kind::non_finite:
            return "non_finite";
        case check_kind::optimizer_decode_error:
            return "optimizer_decode_error";
        case check_kind::clip_crossings:
            return "clip_crossings";
        case check_kind::custom:
            return "custom";
    }
    return "unknown";
}

enum class check_status : int { ok = 0, warn = 1, trip = 2 };

inline const char* check_status_name(check_status s) {
    return s == check_status::ok ? "ok" : s == check_status::warn ? "warn" : "trip";
}

struct threshold {
    enum class side : int { above = 0, below = 1 };
    side bad = side::above;
    double warn = std::numeric_limits<double>::infinity();
    double trip = std::numeric_limits<double>::infinity();
    int patience = 1;

    /// Larger values are worse: warn when value > warn, trip when value > trip.
    static threshold above(double warn, double trip, int patience = 1) {
        return make(side::above, warn, trip, patience);
    }
    /// Smaller values are worse: warn when value < warn, trip when value < trip.
    static threshold below(double warn, double trip, int patience = 1) {
        return make(side::below, warn, trip, patience);
    }

    /// The status of one value, before patience is applied.
    check_status classify(double value) const {
        if (std::isnan(value)) return check_status::trip;
        if (bad == side::above)
            return value > trip ? check_status::trip : (value > warn ? check_status::warn : check_status::ok);
        return value < trip ? check_status::trip : (value < warn ? check_status::warn : check_status::ok);
    }
    /// The limit the value was compared with, as text: "> 0.01" or "< 0.5".
    std::string describe(check_status s) const {
        std::ostringstream os;
        os << (bad == side::above ? "> " : "< ") << (s == check_status::trip ? trip : warn);
        return os.str();
    }

private:
    static threshold make(side s, double warn, double trip, int patience) {
        OCTET_REQUIRE(!std::isnan(warn) && !std::isnan(trip), "octet::threshold", "warn/trip", "must not be NaN");
        OCTET_REQUIRE(
            s == side::above ? warn <= trip : warn >= trip, "octet::threshold", "warn",
            detail::message("is ", warn, " but trip is ", trip, "; the warning limit must come before the trip limit"));
        OCTET_REQUIRE(patience >= 1, "octet::threshold", "patience",
                      detail::message("is ", patience, "; pass 1 or more samples"));
        threshold t;
        t.bad = s;
        t.warn = warn;
        t.trip = trip;
        t.patience = patience;
        return t;
    }
};

/// The default thresholds of each kind (the table in the header comment).
inline threshold default_threshold(check_kind k) {
    switch (k) {
        case check_kind::softmax_row_sum:
            return threshold::above(1e-3, 1e-2);
        case check_kind::stored_o_vs_pv:
            return threshold::above(2e-2, 1e-1);
        case check_kind::saturation_rate:
            return threshold::above(1e-4, 1e-3);
        case check_kind::underflow_rate:
            return threshold::above(1e-2, 1e-1);
        case check_kind::amax_drift:
            return threshold::above(1.0, 2.0);
        case check_kind::non_finite:
            return threshold::above(0.0, 0.0);
        case check_kind::optimizer_decode_error:
            return threshold::above(1e-2, 5e-2);
        case check_kind::clip_crossings:
            return threshold::above(1e-3, 1e-2);
        case check_kind::custom:
            return threshold{};
    }
    return threshold{};
}

struct check_spec {
    std::string name;
    check_kind kind = check_kind::custom;
    threshold limits{};
    std::string operation;  ///< what a recovery raises the precision of ("" for none)
};

struct check_sample {
    std::int64_t step = 0;
    int attempt = 1;  ///< 1 for the first sample at this step, 2 after a repeat or replay, ...
    double value = 0;
    check_status status = check_status::ok;  ///< after patience
    double seconds = 0;                      ///< the check's own cost for this sample
};

/// Per-check totals for reports.
struct check_summary {
    std::uint64_t samples = 0, warns = 0, trips = 0;
    double last = 0, worst = 0;  ///< worst: largest (side above) or smallest (side below) value, NaN if any NaN
    double seconds = 0;
};

namespace detail {
/// JSON string literal with escapes.
inline std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\t':
                out += "\\t";
                break;
            case '\r':
                out += "\\r";
                break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
                    out += buf;
                } else {
                    out += c;
                }
        }
    }
    return out + "\"";
}
/// JSON number (NaN and infinities, which JSON lacks, become null).
inline std::string json_number(double v) {
    if (!std::isfinite(v)) return "null";
    std::ostringstream os;
    os.precision(10);
    os << v;
    return os.str();
}
/// Markdown table cell: '|' escaped.
inline std::string md_cell(const std::string& s) {
    std::string out;
    for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
    return out;
}
}  // namespace detail

class check_registry {
public:
    using check_id = std::size_t;

    /// Adds a check with the kind's default threshold. Names are unique.
    check_id add(std::string name, check_kind kind, std::string operation = {}) {
        return add(std::move(name), kind, default_threshold(kind), std::move(operation));
    }
    check_id add(std::string name, check_kind kind, threshold limits, std::string operation = {}) {
        OCTET_REQUIRE(!name.empty(), "octet::check_registry::add", "name", "is empty; give each check a name");
        OCTET_REQUIRE(
            kind == check_kind::custom || (limits.warn >= 0 && limits.trip >= 0), "octet::check_registry::add",
            "limits",
            detail::message(
                "are warn ", limits.warn, ", trip ", limits.trip, " for '", name, "', but a ", check_kind_name(kind),
                " value is never negative (a negative limit trips or warns on every sample); pass limits >= 0"));
        OCTET_REQUIRE(index_.find(name) == index_.end(), "octet::check_registry::add", "name",
                      detail::message("'", name, "' is already registered; names must be unique"));
        const check_id id = checks_.size();
        index_.emplace(name, id);
        checks_.push_back(
            entry{check_spec{std::move(name), kind, limits, std::move(operation)}, {}, {}, 0, 0, 0, false, {}});
        return id;
    }

    std::size_t size() const { return checks_.size(); }
    bool contains(const std::string& name) const { return index_.count(name) != 0; }
    check_id find(const std::string& name) const {
        const auto it = index_.find(name);
        OCTET_REQUIRE(it != index_.end(), "octet::check_registry::find", "name",
                      detail::message("'", name, "' is not a registered check"));
        return it->second;
    }
    const check_spec& spec(check_id id) const { return at(id, "octet::check_registry::spec").spec; }
    const std::vector<check_sample>& history(check_id id) const {
        return at(id, "octet::check_registry::history").samples;
    }

    /// Records a value for `step`, with the check's own cost in seconds; returns its status
    /// (patience applied). Recording the same step again (a repeat or a replay) adds a new attempt.
    check_status record(check_id id, std::int64_t step, double value, double cost_seconds = 0) {
        entry& e = at(id, "octet::check_registry::record");
        OCTET_REQUIRE(cost_seconds >= 0, "octet::check_registry::record", "cost_seconds", "must be non-negative");
        check_status s = e.spec.limits.classify(value);
        const int attempt = ++e.attempts[step];
        // a new attempt at the step just recorded replaces its sample in the run of trips
        if (!(attempt > 1 && e.has_last && step == e.last_step)) e.trips_before_step = e.consecutive_trips;
        e.last_step = step;
        e.has_last = true;
        if (s == check_status::trip) {
            e.consecutive_trips = e.trips_before_step + 1;
            if (e.consecutive_trips < e.spec.limits.patience) s = check_status::warn;
        } else {
            e.consecutive_trips = 0;
        }
        e.samples.push_back(check_sample{step, attempt, value, s, cost_seconds});
        e.summary.samples += 1;
        e.summary.warns += s == check_status::warn;
        e.summary.trips += s == check_status::trip;
        e.summary.last = value;
        const bool worse =
            e.spec.limits.bad == threshold::side::above ? value > e.summary.worst : value < e.summary.worst;
        if (e.summary.samples == 1)
            e.summary.worst = value;
        else if (!std::isnan(e.summary.worst) && (std::isnan(value) || worse))
            e.summary.worst = value;  // NaN sticks
        e.summary.seconds += cost_seconds;
        total_seconds_ += cost_seconds;
        return s;
    }

    /// Runs compute() (which returns the value), timing it as the check's cost, and records it.
    template <class Compute>
    check_status measure(check_id id, std::int64_t step, Compute&& compute) {
        const auto t0 = std::chrono::steady_clock::now();
        const double value = static_cast<double>(compute());
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return record(id, step, value, seconds);
    }

    /// The checks whose latest sample at `step` is a trip (in registration order).
    std::vector<check_id> tripped(std::int64_t step) const { return with_status(step, check_status::trip); }
    /// The checks whose latest sample at `step` is a warning.
    std::vector<check_id> warned(std::int64_t step) const { return with_status(step, check_status::warn); }
    /// The latest sample of a check at `step`, or nullptr if it has none.
    const check_sample* latest(check_id id, std::int64_t step) const {
        const auto& s = at(id, "octet::check_registry::latest").samples;
        for (auto it = s.rbegin(); it != s.rend(); ++it)
            if (it->step == step) return &*it;
        return nullptr;
    }

    const check_summary& summary(check_id id) const { return at(id, "octet::check_registry::summary").summary; }
    /// Time spent in all checks (their recorded costs).
    double cost_seconds() const { return total_seconds_; }

    /// "check 'name' (kind) = value > trip" for a sample, for logs.
    std::string describe(check_id id, const check_sample& s) const {
        const entry& e = at(id, "octet::check_registry::describe");
        std::ostringstream os;
        os << "check '" << e.spec.name << "' (" << check_kind_name(e.spec.kind) << ") = " << s.value << " "
           << e.spec.limits.describe(s.status == check_status::ok ? check_status::warn : s.status);
        return os.str();
    }

    std::string to_markdown() const {
        std::ostringstream os;
        os << "| check | kind | operation | samples | warn | trip | last | worst | cost (ms) "
              "|\n|---|---|---|---|---|---|---|---|---|\n";
        for (const auto& e : checks_)
            os << "| " << detail::md_cell(e.spec.name) << " | " << check_kind_name(e.spec.kind) << " | "
               << detail::md_cell(e.spec.operation) << " | " << e.summary.samples << " | " << e.summary.warns << " | "
               << e.summary.trips << " | " << e.summary.last << " | " << e.summary.worst << " | "
               << 1e3 * e.summary.seconds << " |\n";
        return os.str();
    }
    std::string to_json() const {
        std::ostringstream os;
        os << "[";
        for (std::size_t i = 0; i < checks_.size(); ++i) {
            const auto& e = checks_[i];
            os << (i ? ", " : "") << "{\"name\": " << detail::json_string(e.spec.name) << ", \"kind\": \""
               << check_kind_name(e.spec.kind) << "\", \"operation\": " << detail::json_string(e.spec.operation)
               << ", \"warn\": " << detail::json_number(e.spec.limits.warn)
               << ", \"trip\": " << detail::json_number(e.spec.limits.trip) << ", \"samples\": " << e.summary.samples
               << ", \"warns\": " << e.summary.warns << ", \"trips\": " << e.summary.trips
               << ", \"last\": " << detail::json_number(e.summary.last)
               << ", \"worst\": " << detail::json_number(e.summary.worst)
               << ", \"seconds\": " << detail::json_number(e.summary.seconds) << "}";
        }
        os << "]";
        return os.str();
    }

private:
    struct entry {
        check_spec spec;
        std::vector<check_sample> samples;
        std::unordered_map<std::int64_t, int> attempts;
        int consecutive_trips = 0;  ///< consecutive tripping steps up to the latest sample
        int trips_before_step = 0;  ///< the same, before the latest step's first attempt
        std::int64_t last_step = 0;
        bool has_last = false;
        check_summary summary;
    };

    const entry& at(check_id id, const char* fn) const {
        OCTET_REQUIRE(id < checks_.size(), fn, "id",
                      detail::message("is ", id, " but ", checks_.size(), " checks are registered"));
        return checks_[id];
    }
    entry& at(check_id id, const char* fn) {
        return const_cast<entry&>(static_cast<const check_registry&>(*this).at(id, fn));
    }

    std::vector<check_id> with_status(std::int64_t step, check_status want) const {
        std::vector<check_id> out;
        for (check_id id = 0; id < checks_.size(); ++id) {
            const check_sample* s = latest(id, step);
            if (s && s->status == want) out.push_back(id);
        }
        return out;
    }

    std::vector<entry> checks_;
    std::unordered_map<std::string, check_id> index_;
    double total_seconds_ = 0;
};

}  // namespace octet
