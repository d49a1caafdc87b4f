// examples/09_rl/report_test.cpp: the RL program's report, written from a synthetic sweep (values
// from a seeded generator, NaN where a measurement can be missing), read back here, and checked by
// check_report.py when python3 is known (OCTET_PYTHON3 and OCTET_RL_DIR).
#include <doctest/doctest.h>

#include "report.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {
namespace fs = std::filesystem;

rl::sweep_result synthetic_sweep() {
    std::mt19937 gen(20240611);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    rl::sweep_result s;
    s.command = "example_09_rl --steps 5 --seeds 0,1";
    s.machine = "synthetic";
    s.task = "reverse the prompt; reward = fraction of characters in place";
    s.prompt_chars = 8, s.completion_chars = 8, s.prompts_per_step = 4, s.group_size = 4, s.epochs = 2, s.steps = 5;
    s.clip_eps_low = 0.2f, s.clip_eps_high = 0.28f, s.tis_cap = 2.0f;
    s.rollout_recipe = "fp8_blockwise", s.trainer_recipe = "fp32";
    s.pretrain_source = "pretrained here: 100 steps", s.pretrain_seconds = 10 * u(gen);
    s.pretrain_heldout_loss = 1 + u(gen), s.parameters = 12345;
    s.findings = {"fp8_nominal clips more A<0 tokens than float_rollout", "a | pipe in a finding"};
    s.wall_seconds = 100 * u(gen);
    for (const char* variant : {"float_rollout", "fp8_nominal"})
        for (int seed = 0; seed < 2; ++seed) {
            rl::run_result r;
            r.variant = variant, r.seed = seed;
            for (int k = 0; k < 5; ++k) {
                rl::step_record t;
                t.step = k + 1;
                t.reward_mean = u(gen), t.solved_fraction = u(gen);
                t.entropy_rollout = 2 * u(gen), t.entropy_trainer = 2 * u(gen);
                t.log_ratio_q50 = 0.02 * (u(gen) - 0.5), t.log_ratio_q10 = t.log_ratio_q50 - 0.05 * u(gen);
                t.log_ratio_q01 = t.log_ratio_q10 - 0.05 * u(gen), t.log_ratio_q90 = t.log_ratio_q50 + 0.05 * u(gen);
                t.log_ratio_q99 = t.log_ratio_q90 + 0.05 * u(gen), t.log_ratio_mean = t.log_ratio_q50;
                t.log_ratio_std = 0.03 * u(gen), t.log_ratio_abs_max = 0.3 * u(gen);
                t.tokens = 128, t.tokens_negative = 60, t.tokens_positive = 64;
                t.clip_fraction_negative = 0.1 * u(gen), t.clip_fraction_positive = 0.1 * u(gen);
                t.clip_fraction_negative_high = 0.1 * u(gen), t.clip_fraction_positive_high = 0.1 * u(gen);
                t.clip_lower = 0.8f, t.clip_upper = 1.28f;
                t.crossings_negative_pushed_below = gen() % 7, t.crossings_branch_changed = gen() % 9;
                t.rollout_seconds = u(gen), t.update_seconds = u(gen), t.rollout_tokens_per_second = 1e4 * u(gen);
                t.update_tokens_per_second = 1e4 * u(gen), t.grad_norm = u(gen), t.lr = 1e-4;
                t.monitor = "ok";
                r.steps.push_back(t);
            }
            r.final_reward = u(gen), r.final_solved_fraction = u(gen), r.final_entropy = 2 * u(gen);
            r.mean_abs_log_ratio = 0.01 * u(gen), r.clip_fraction_negative = 0.1 * u(gen);
            r.clip_fraction_positive = 0.1 * u(gen), r.crossings_negative_pushed_below = gen() % 30;
            r.rollout_tokens_per_second = 1e4 * u(gen), r.update_tokens_per_second = 1e4 * u(gen);
            r.wall_seconds = 10 * u(gen), r.restarts = int(gen() % 2);
            r.sample = "abcdefgh -> hgfedcba";
            s.runs.push_back(r);
        }
    s.runs[1].steps[2].entropy_trainer = rl::not_measured;  // a NaN in a curve and in a summary
    s.runs[1].steps[3].log_ratio_q50 = rl::not_measured;
    s.runs[2].mean_abs_log_ratio = rl::not_measured;
    s.runs[3].recoveries.push_back({3, "skip_step", "grad_norm 1e9 > 1e3", 0.25, 1});
    return s;
}

fs::path temp_folder(const char* tag) {
    return fs::temp_directory_path() /
           ("octet_rl_report_" + std::string(tag) + "_" + std::to_string(std::random_device{}()));
}
std::string read(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream o;
    o << f.rdbuf();
    return o.str();
}
std::size_t count(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
}
/// The SVG with its XML declaration (if any) skipped.
std::string svg_root(const std::string& text) {
    if (text.rfind("<?xml", 0) != 0) return text;
    const std::size_t end = text.find("?>");
    return end == std::string::npos ? "" : text.substr(text.find_first_not_of(" \r\n", end + 2));
}
void python_check(const fs::path& folder, int want) {
#if defined(OCTET_PYTHON3) && defined(OCTET_RL_DIR)
    const std::string cmd = "\"" OCTET_PYTHON3 "\" \"" OCTET_RL_DIR "/check_report.py\" \"" + folder.string() + "\"" +
                            (want ? " > /dev/null 2>&1" : "");
    const int rc = std::system(cmd.c_str());
    CHECK_MESSAGE((rc == 0) == (want == 0), cmd, " returned ", rc);
#else
    (void)folder, (void)want;
#endif
}

}  // namespace

TEST_CASE("rl report: written from a synthetic sweep, read back") {
    const rl::sweep_result s = synthetic_sweep();
    const fs::path dir = temp_folder("full");
    rl::write_report(s, dir.string());

    const std::string json = read(dir / "report.json");
    CHECK(json.find("\"schema\": \"octet-rl-report/1\"") != std::string::npos);
    for (const auto& r : s.runs) {
        char buf[32];
        const auto end = std::to_chars(buf, buf + sizeof buf, r.final_reward).ptr;
        const std::string key = "\"final_reward\": " + std::string(buf, end);
        const std::size_t at = json.find(key);
        REQUIRE_MESSAGE(at != std::string::npos, key);
        CHECK(std::strtod(json.c_str() + at + 16, nullptr) == r.final_reward);  // reads back bit for bit
    }
    CHECK(json.find("NaN") == std::string::npos);
    CHECK(json.find("nan") == std::string::npos);

    const std::string md = read(dir / "report.md");
    const std::size_t summary = md.find("## Summary over seeds");
    REQUIRE(summary != std::string::npos);
    CHECK(md.find("- fp8_nominal clips more A<0 tokens") < summary);  // findings near the top
    for (const char* variant : {"float_rollout", "fp8_nominal"}) {
        std::vector<double> rewards;
        for (const auto& r : s.runs)
            if (r.variant == variant) rewards.push_back(r.final_reward);
        char mean[32];
        std::snprintf(mean, sizeof mean, "%.3f", (rewards[0] + rewards[1]) / 2);
        const std::size_t row = md.find(std::string("\n| ") + variant + " | 2 | ", summary);
        REQUIRE(row != std::string::npos);
        const std::string line = md.substr(row + 1, md.find('\n', row + 1) - row - 1);
        CHECK_MESSAGE(line.find(std::string(" ") + mean + " (") != std::string::npos, line, " lacks ", mean);
    }
    CHECK(md.find("| fp8_nominal | 1 | 3 | skip_step |") != std::string::npos);
    for (const char* f : {"reward.svg", "entropy.svg", "clipping.svg", "mismatch.svg"})
        CHECK(md.find(std::string("](") + f + ")") != std::string::npos);

    const std::vector<std::pair<const char*, std::size_t>> svgs = {
        {"reward.svg", 2}, {"entropy.svg", 1}, {"clipping.svg", 2}, {"mismatch.svg", 1}};  // panels per variant
    for (const auto& entry : svgs) {
        const std::string name = entry.first;
        const std::size_t panels = entry.second;
        const std::string svg = read(dir / name);
        REQUIRE(!svg.empty());
        CHECK(svg_root(svg).rfind("<svg", 0) == 0);
        CHECK(count(svg, "class=\"series\"") == 2 * panels);
        for (const char* variant : {"float_rollout", "fp8_nominal"})
            CHECK_MESSAGE(count(svg, std::string("class=\"series\" data-name=\"") + variant + "\"") == panels, name);
        CHECK(svg.find("nan") == std::string::npos);
    }
    python_check(dir, 0);

    rl::sweep_result bad = s;  // the checker rejects a fraction out of range
    bad.runs[0].steps[1].solved_fraction = 1.5;
    rl::write_report(bad, dir.string());
    python_check(dir, 1);
    fs::remove_all(dir);
}

TEST_CASE("rl report: an empty sweep and a run without steps write without throwing") {
    const fs::path dir = temp_folder("empty");
    rl::sweep_result s;
    CHECK_NOTHROW(rl::write_report(s, dir.string()));
    CHECK(read(dir / "report.md").find("None: no run needed a recovery.") != std::string::npos);
    for (const char* f : {"reward.svg", "entropy.svg", "clipping.svg", "mismatch.svg"})
        CHECK(svg_root(read(dir / f)).rfind("<svg", 0) == 0);
    python_check(dir, 0);

    s.runs.emplace_back();
    s.runs.back().variant = "fp8_tis";  // no steps, every summary NaN
    s.pretrain_heldout_loss = rl::not_measured;
    CHECK_NOTHROW(rl::write_report(s, dir.string()));
    CHECK(read(dir / "report.json").find("\"final_reward\": null") != std::string::npos);
    CHECK(read(dir / "report.md").find("| fp8_tis | 1 | n/a |") != std::string::npos);
    python_check(dir, 0);
    fs::remove_all(dir);
}
