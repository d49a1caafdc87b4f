// examples/08_training/report.hpp: the training program's outputs, written from a sweep_result:
// report.md (verdict first), report.json (schema in report_schema.md, checked by check_report.py)
// and three SVG plots (loss curves with seed bands, memory by category beside the ledger,
// saturation/underflow and attention residual telemetry), drawn with the examples' report kit
// (examples/common/report_text.hpp, report_svg.hpp). Every number written is taken or derived from
// the sweep_result passed in. The progress bar is examples/common/progress.hpp.
//
// The parts live in report/: common.hpp (what they share), markdown.hpp, json.hpp, plots.hpp;
// here: write_report, which writes them all.
#pragma once

#include "common/progress.hpp"
#include "report/json.hpp"
#include "report/markdown.hpp"
#include "report/plots.hpp"
#include "train.hpp"

#include <octet/octet.hpp>

#include <filesystem>
#include <string>

namespace train {

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
