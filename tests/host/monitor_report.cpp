// The run report on its own: an empty run, non-finite losses (null in JSON), the caller's wall
// time, the ledger's peak, and argument errors. (The accounting of a run with recoveries is
// checked against exact numbers in monitor_recovery.cpp.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "octet/monitor/run_report.hpp"

using namespace octet;

TEST_CASE("run report: empty run, NaN loss, caller's wall time, ledger peak") {
    check_registry reg;
    recovery_log log;
    memory_ledger ledger;
    run_report empty;
    const run_summary e = empty.summarize(reg, log, ledger);
    CHECK(e.executed_steps == 0);
    CHECK(std::isnan(e.final_loss));
    CHECK(e.throughput == 0.0);
    const std::string ej = empty.to_json(reg, log, ledger);
    CHECK(ej.find("\"final\": null") != std::string::npos);
    CHECK(ej.find("nan") == std::string::npos);

    run_report r;
    const auto id = reg.add("loss.finite", check_kind::non_finite);
    ledger.allocate(memory_category::activations, 3 << 20);
    ledger.allocate(memory_category::weights, 1 << 20);
    ledger.release(memory_category::activations, 3 << 20);
    r.record_step(0, 2.5, 512, 0.5);
    reg.record(id, 0, 0, 0.05);
    r.record_step(1, NAN, 512, 0.5);
    reg.record(id, 1, 1, 0.05);
    r.record_step(2, 1.5, 512, 0.5);
    r.set_wall_seconds(2.0);
    const run_summary s = r.summarize(reg, log, ledger);
    CHECK(s.wall_seconds == 2.0);
    CHECK(s.throughput == 768.0);
    CHECK(s.first_loss == 2.5);
    CHECK(s.final_loss == 1.5);
    CHECK(s.min_loss == 1.5);  // the NaN step is not a minimum
    CHECK(s.peak_memory_bytes == 4 << 20);
    CHECK(s.monitor_overhead == doctest::Approx(0.05));
    const std::string js = r.to_json(reg, log, ledger);
    CHECK(js.find("\"octet_version\": \"" OCTET_VERSION_STRING "\"") != std::string::npos);
    CHECK(js.find("\"overhead_fraction\": 0.05") != std::string::npos);
    CHECK(std::count(js.begin(), js.end(), '{') == std::count(js.begin(), js.end(), '}'));
    const std::string md = r.to_markdown(reg, log, ledger);
    CHECK(md.find("| peak memory (MiB) | 4 |") != std::string::npos);
    CHECK(md.find("| monitor time (s) / overhead | 0.1 / 5% |") != std::string::npos);
    CHECK_THROWS_WITH_AS(r.record_step(3, 1.0, -1, 0.1), doctest::Contains("argument 'tokens'"), octet::error);
    CHECK_THROWS_WITH_AS(r.record_step(3, 1.0, 1, -0.1), doctest::Contains("argument 'seconds'"), octet::error);
    CHECK_THROWS_WITH_AS(r.set_wall_seconds(-1), doctest::Contains("argument 'seconds'"), octet::error);
}

TEST_CASE("JSON strings are escaped") {
    check_registry reg;
    reg.add("quote\"back\\slash\nnewline|pipe", check_kind::custom);
    const std::string js = reg.to_json();
    CHECK(js.find("quote\\\"back\\\\slash\\nnewline|pipe") != std::string::npos);
    CHECK(reg.to_markdown().find("newline\\|pipe") != std::string::npos);
}
