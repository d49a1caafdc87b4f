// octet's run report (octet/monitor/run_report.hpp) as a torch class, so that a training loop in
// Python gets the same report, JSON and Markdown as a C++ one:
//   torch.classes.octet.RunReport(): a check_registry, a memory_ledger and a run_report, with
//     record_step(step, loss, tokens, seconds), set_wall_seconds(seconds),
//     add_check(name, kind, operation, warn, trip, side, patience) -> id (warn and trip both None:
//       the kind's default threshold), record(name, step, value, seconds) -> "ok" | "warn" | "trip",
//     record_quant_stats(prefix, step, stats) (a row of octet.torch quantize's statistics:
//       <prefix>.saturation_rate, <prefix>.underflow_rate, <prefix>.non_finite, each added with its
//       kind's default threshold on first use unless already added),
//     tripped(step) / warned(step) -> names, memory(category, "set" | "allocate" | "release", bytes),
//     to_json(), to_markdown().
// Its recovery log is empty: recoveries are taken by octet::recovery_policy through C++ callbacks,
// which a Python loop does not run. An octet::error reaches Python as ValueError.
#include <torch/custom_class.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "octet/monitor/run_report.hpp"
#include "octet_torch.hpp"

namespace octet_torch {
namespace {

constexpr const char* op = "RunReport";

octet::check_kind kind_of(const std::string& name) {
    for (int i = 0; i < octet::check_kind_count; ++i)
        if (name == octet::check_kind_name(static_cast<octet::check_kind>(i))) return static_cast<octet::check_kind>(i);
    TORCH_CHECK_VALUE(false, where(op, "kind"), "is '", name,
                      "'; pass one of softmax_row_sum, stored_o_vs_pv, saturation_rate, underflow_rate, amax_drift, "
                      "non_finite, optimizer_decode_error, clip_crossings, custom");
    return octet::check_kind::custom;  // not reached
}

octet::memory_category category_of(const std::string& name) {
    for (int i = 0; i < octet::memory_category_count; ++i)
        if (name == octet::memory_category_name(static_cast<octet::memory_category>(i)))
            return static_cast<octet::memory_category>(i);
    TORCH_CHECK_VALUE(false, where(op, "category"), "is '", name,
                      "'; pass weights, gradients, optimizer_state, activations or temporaries");
    return octet::memory_category::temporaries;  // not reached
}

/// The inverse of put_quant_stats (octet_torch.hpp): a row of 8 doubles as quant_stats.
octet::quant_stats quant_stats_of(const at::Tensor& row) {
    check_tensor(row, op, "stats", {at::kDouble});
    TORCH_CHECK_VALUE(row.numel() == 8 && row.is_contiguous(), where(op, "stats"), "has shape ", row.sizes(),
                      "; pass one contiguous row of 8 statistics as octet.torch.quantize returns it");
    const double* v = row.data_ptr<double>();
    octet::quant_stats s;
    s.amax = static_cast<float>(v[0]);
    s.elements = static_cast<unsigned long long>(v[1]);
    s.saturated = static_cast<unsigned long long>(v[2]);
    s.flushed_to_zero = static_cast<unsigned long long>(v[3]);
    s.non_finite = static_cast<unsigned long long>(v[4]);
    s.lost_to_nan = static_cast<unsigned long long>(v[5]);
    s.signal_energy = v[6];
    s.noise_energy = v[7];
    return s;
}

struct RunReport : torch::CustomClassHolder {
    octet::check_registry checks;
    octet::memory_ledger ledger;
    octet::recovery_log log;
    octet::run_report report;

    void record_step(int64_t step, double loss, double tokens, double seconds) {
        guarded([&] { report.record_step(step, loss, tokens, seconds); });
    }
    void set_wall_seconds(double seconds) {
        guarded([&] { report.set_wall_seconds(seconds); });
    }
    int64_t add_check(const std::string& name, const std::string& kind, const std::string& operation,
                      std::optional<double> warn, std::optional<double> trip, const std::string& side,
                      int64_t patience) {
        const octet::check_kind k = kind_of(kind);
        TORCH_CHECK_VALUE(side == "above" || side == "below", where(op, "side"), "is '", side,
                          "'; pass above (larger values are worse) or below");
        TORCH_CHECK_VALUE(warn.has_value() == trip.has_value(), where(op, "warn/trip"),
                          "give one limit; pass both (or neither, for the kind's default threshold)");
        return guarded([&] {
            octet::threshold t = octet::default_threshold(k);
            if (warn) {
                const int p = static_cast<int>(patience);
                t = side == "above" ? octet::threshold::above(*warn, *trip, p)
                                    : octet::threshold::below(*warn, *trip, p);
            } else {
                TORCH_CHECK_VALUE(patience == 1 && side == "above", where(op, "patience/side"),
                                  "are set without limits; pass warn and trip with them");
            }
            return static_cast<int64_t>(checks.add(name, k, t, operation));
        });
    }
    bool has_check(const std::string& name) { return checks.contains(name); }
    std::string record(const std::string& name, int64_t step, double value, double seconds) {
        return guarded([&] {
            return std::string(octet::check_status_name(checks.record(checks.find(name), step, value, seconds)));
        });
    }
    void record_quant_stats(const std::string& prefix, int64_t step, const at::Tensor& row) {
        const octet::quant_stats s = quant_stats_of(row);
        guarded([&] {
            const auto put = [&](const char* what, octet::check_kind kind, double value) {
                const std::string name = prefix + "." + what;
                if (!checks.contains(name)) checks.add(name, kind, prefix);
                checks.record(checks.find(name), step, value);
            };
            put("saturation_rate", octet::check_kind::saturation_rate, s.saturated_fraction());
            put("underflow_rate", octet::check_kind::underflow_rate, s.flushed_fraction());
            put("non_finite", octet::check_kind::non_finite, static_cast<double>(s.non_finite));
        });
    }
    std::vector<std::string> names(const std::vector<octet::check_registry::check_id>& ids) const {
        std::vector<std::string> out;
        for (auto id : ids) out.push_back(checks.spec(id).name);
        return out;
    }
    std::vector<std::string> tripped(int64_t step) { return names(checks.tripped(step)); }
    std::vector<std::string> warned(int64_t step) { return names(checks.warned(step)); }
    void memory(const std::string& category, const std::string& action, double bytes) {
        const octet::memory_category c = category_of(category);
        TORCH_CHECK_VALUE(action == "set" || action == "allocate" || action == "release", where(op, "action"), "is '",
                          action, "'; pass set, allocate or release");
        guarded([&] {
            if (action == "set")
                ledger.set(c, bytes);
            else if (action == "allocate")
                ledger.allocate(c, bytes);
            else
                ledger.release(c, bytes);
        });
    }
    std::string to_json() { return report.to_json(checks, log, ledger); }
    std::string to_markdown() { return report.to_markdown(checks, log, ledger); }
};

}  // namespace
}  // namespace octet_torch

TORCH_LIBRARY_FRAGMENT(octet, m) {
    using octet_torch::RunReport;
    m.class_<RunReport>("RunReport")
        .def(torch::init<>())
        .def("record_step", &RunReport::record_step)
        .def("set_wall_seconds", &RunReport::set_wall_seconds)
        .def("add_check", &RunReport::add_check)
        .def("has_check", &RunReport::has_check)
        .def("record", &RunReport::record)
        .def("record_quant_stats", &RunReport::record_quant_stats)
        .def("tripped", &RunReport::tripped)
        .def("warned", &RunReport::warned)
        .def("memory", &RunReport::memory)
        .def("to_json", &RunReport::to_json)
        .def("to_markdown", &RunReport::to_markdown);
}
