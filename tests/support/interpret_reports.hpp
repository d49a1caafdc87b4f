// tests/support/interpret_reports.hpp: reading the interpreter's reports in tests: a launch that
// collects every report instead of throwing the first, whether a run reported a kind, the first report
// of a kind, and all messages (for a failing check's context).
#pragma once

#include <doctest/doctest.h>

#include <string>

#include "octet/interpret/interpret.hpp"

namespace octet_test {

inline octet::interpret::options collect() {
    octet::interpret::options o;
    o.mode = octet::interpret::on_report::collect;
    return o;
}
inline bool has(const octet::interpret::run_result& r, octet::interpret::check k) {
    for (const auto& x : r.reports)
        if (x.kind == k) return true;
    return false;
}
inline const octet::interpret::report& first(const octet::interpret::run_result& r, octet::interpret::check k) {
    for (const auto& x : r.reports)
        if (x.kind == k) return x;
    FAIL("no report of kind " << octet::interpret::to_string(k));
    return r.reports.front();
}
inline std::string all_messages(const octet::interpret::run_result& r) {
    std::string s;
    for (const auto& x : r.reports) s += x.message() + "\n";
    return s;
}

}  // namespace octet_test
