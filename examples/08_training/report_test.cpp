// examples/08_training/report_test.cpp: the training program's report, written from a sweep built
// by hand with fresh random values (and NaN, Inf, quotes, control characters and broken UTF-8 where
// they can occur), read back by an independent strict JSON parser and XML checker written here, and
// by check_report.py (when python3 is present) against report_schema.md.
#include <doctest/doctest.h>

#include "report.hpp"
#include "support/random.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef _WIN32
#include <fcntl.h>
#include <termios.h>
#include <unistd.h>
#endif

#ifndef OCTET_TRAINING_DIR
#define OCTET_TRAINING_DIR "examples/08_training"
#endif

namespace {
namespace fs = std::filesystem;

// ---- a strict JSON reader (RFC 8259: no NaN, no trailing commas, no raw control characters) ----
struct jvalue {
    enum kind_t { null, boolean, number, string, array, object } kind = null;
    bool b = false;
    double n = 0;
    std::string s;
    std::vector<jvalue> a;
    std::vector<std::pair<std::string, jvalue>> o;
    const jvalue& operator[](const std::string& k) const {
        for (const auto& kv : o)
            if (kv.first == k) return kv.second;
        throw std::runtime_error("no field " + k);
    }
    const jvalue& operator[](std::size_t i) const { return a.at(i); }
    bool has(const std::string& k) const {
        for (const auto& kv : o)
            if (kv.first == k) return true;
        return false;
    }
};

class json_reader {
public:
    explicit json_reader(const std::string& text) : t_(text) {}
    jvalue parse() {
        jvalue v = value();
        ws();
        if (i_ != t_.size()) fail("text after the value");
        return v;
    }

private:
    [[noreturn]] void fail(const std::string& what) const {
        throw std::runtime_error("JSON: " + what + " at byte " + std::to_string(i_));
    }
    void ws() {
        while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\r' || t_[i_] == '\t')) ++i_;
    }
    bool eat(const char* word) {
        const std::string w(word);
        if (t_.compare(i_, w.size(), w) != 0) return false;
        i_ += w.size();
        return true;
    }
    void expect(char c) {
        ws();
        if (i_ >= t_.size() || t_[i_] != c) fail(std::string("expected '") + c + "'");
        ++i_;
    }
    jvalue value() {
        ws();
        if (i_ >= t_.size()) fail("unexpected end");
        jvalue v;
        const char c = t_[i_];
        if (c == '{') {
            v.kind = jvalue::object;
            ++i_;
            ws();
            if (i_ < t_.size() && t_[i_] == '}') return ++i_, v;
            for (;;) {
                ws();
                std::string k = string();
                expect(':');
                v.o.emplace_back(k, value());
                ws();
                if (i_ < t_.size() && t_[i_] == ',') {
                    ++i_;
                    continue;
                }
                expect('}');
                return v;
            }
        }
        if (c == '[') {
            v.kind = jvalue::array;
            ++i_;
            ws();
            if (i_ < t_.size() && t_[i_] == ']') return ++i_, v;
            for (;;) {
                v.a.push_back(value());
                ws();
                if (i_ < t_.size() && t_[i_] == ',') {
                    ++i_;
                    continue;
                }
                expect(']');
                return v;
            }
        }
        if (c == '"') return v.kind = jvalue::string, v.s = string(), v;
        if (eat("true")) return v.kind = jvalue::boolean, v.b = true, v;
        if (eat("false")) return v.kind = jvalue::boolean, v;
        if (eat("null")) return v;
        return v.kind = jvalue::number, v.n = number(), v;
    }
    double number() {
        const std::size_t start = i_;
        auto digits = [&] {
            const std::size_t d = i_;
            while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') ++i_;
            if (i_ == d) fail("expected a digit");
            return i_ - d;
        };
        if (t_[i_] == '-') ++i_;
        if (i_ < t_.size() && t_[i_] == '0')
            ++i_;
        else
            digits();
        if (i_ < t_.size() && t_[i_] == '.') ++i_, digits();
        if (i_ < t_.size() && (t_[i_] == 'e' || t_[i_] == 'E')) {
            ++i_;
            if (i_ < t_.size() && (t_[i_] == '+' || t_[i_] == '-')) ++i_;
            digits();
        }
        return std::strtod(t_.substr(start, i_ - start).c_str(), nullptr);
    }
    static void put_utf8(std::string& out, unsigned cp) {
        if (cp < 0x80)
            out += char(cp);
        else if (cp < 0x800)
            out += char(0xC0 | (cp >> 6)), out += char(0x80 | (cp & 0x3F));
        else if (cp < 0x10000)
            out += char(0xE0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
        else
            out += char(0xF0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3F)),
                out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
    }
    unsigned hex4() {
        if (i_ + 4 > t_.size()) fail("short \\u escape");
        unsigned v = 0;
        for (int k = 0; k < 4; ++k) {
            const char h = t_[i_++];
            v = v * 16 + unsigned(h >= '0' && h <= '9'   ? h - '0'
                                  : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                  : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                         : (fail("bad hex digit"), 0));
        }
        return v;
    }
    std::string string() {
        if (i_ >= t_.size() || t_[i_] != '"') fail("expected a string");
        ++i_;
        std::string out;
        for (;;) {
            if (i_ >= t_.size()) fail("unterminated string");
            const auto c = static_cast<unsigned char>(t_[i_]);
            if (c == '"') return ++i_, out;
            if (c < 0x20) fail("raw control character in a string");
            if (c == '\\') {
                ++i_;
                if (i_ >= t_.size()) fail("unterminated escape");
                const char e = t_[i_++];
                const std::string simple = "\"\\/bfnrt", meant = "\"\\/\b\f\n\r\t";
                if (simple.find(e) != std::string::npos)
                    out += meant[simple.find(e)];
                else if (e == 'u') {
                    unsigned cp = hex4();
                    if (cp >= 0xD800 && cp < 0xDC00) {
                        if (!eat("\\u")) fail("lone surrogate");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4() - 0xDC00);
                    }
                    put_utf8(out, cp);
                } else
                    fail("bad escape");
                continue;
            }
            // a raw byte: must start a valid UTF-8 sequence
            const std::size_t n = c < 0x80                       ? 1
                                  : (c >> 5) == 0x6 && c >= 0xC2 ? 2
                                  : (c >> 4) == 0xE              ? 3
                                  : (c >> 3) == 0x1E             ? 4
                                                                 : 0;
            if (n == 0 || i_ + n > t_.size()) fail("invalid UTF-8");
            for (std::size_t k = 1; k < n; ++k)
                if ((static_cast<unsigned char>(t_[i_ + k]) >> 6) != 0x2) fail("invalid UTF-8");
            out.append(t_, i_, n);
            i_ += n;
        }
    }
    const std::string& t_;
    std::size_t i_ = 0;
};

// ---- an XML well-formedness check (enough for hand-written SVG) ----
std::string xml_problem(const std::string& t) {
    std::vector<std::string> open;
    int roots = 0;
    auto name_char = [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ':' || c == '.';
    };
    auto entity_ok = [&](std::size_t at) {
        const std::size_t semi = t.find(';', at);
        if (semi == std::string::npos) return false;
        const std::string e = t.substr(at + 1, semi - at - 1);
        return e == "amp" || e == "lt" || e == "gt" || e == "quot" || e == "apos" || (e.size() > 1 && e[0] == '#');
    };
    for (std::size_t i = 0; i < t.size();) {
        if (t[i] == '&' && !entity_ok(i)) return "bare '&' at " + std::to_string(i);
        if (t[i] != '<') {
            ++i;
            continue;
        }
        if (t.compare(i, 2, "<?") == 0) {
            i = t.find("?>", i) + 2;
            continue;
        }
        if (t.compare(i, 4, "<!--") == 0) {
            i = t.find("-->", i) + 3;
            continue;
        }
        const bool closing = t.compare(i, 2, "</") == 0;
        std::size_t j = i + (closing ? 2 : 1);
        const std::size_t n0 = j;
        while (j < t.size() && name_char(t[j])) ++j;
        const std::string name = t.substr(n0, j - n0);
        if (name.empty()) return "tag without a name at " + std::to_string(i);
        if (closing) {
            if (open.empty() || open.back() != name)
                return "</" + name + "> closes " + (open.empty() ? "nothing" : open.back());
            open.pop_back();
            if (j >= t.size() || t[j] != '>') return "bad closing tag " + name;
            i = j + 1;
            continue;
        }
        for (;;) {  // attributes
            while (j < t.size() && std::isspace(static_cast<unsigned char>(t[j]))) ++j;
            if (j >= t.size()) return "unterminated tag " + name;
            if (t.compare(j, 2, "/>") == 0) {
                j += 2;
                break;
            }
            if (t[j] == '>') {
                open.push_back(name);
                ++j;
                break;
            }
            const std::size_t a0 = j;
            while (j < t.size() && name_char(t[j])) ++j;
            if (j == a0 || j + 1 >= t.size() || t[j] != '=' || t[j + 1] != '"') return "bad attribute in " + name;
            const std::size_t end = t.find('"', j + 2);
            const std::string value = t.substr(j + 2, end - j - 2);
            if (end == std::string::npos || value.find('<') != std::string::npos)
                return "bad attribute value in " + name;
            j = end + 1;
        }
        if (open.size() == 1 && open.back() == name) ++roots;
        i = j;
    }
    if (!open.empty()) return "unclosed <" + open.back() + ">";
    return roots == 1 ? "" : "expected one root element, found " + std::to_string(roots);
}

std::string read(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
}
std::size_t count(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
}
fs::path fresh_folder(const char* tag) {
    const fs::path p =
        fs::temp_directory_path() / ("octet_report_" + std::string(tag) + "_" + std::to_string(octet_test::rng(7)()));
    fs::remove_all(p);
    return p;
}
#ifndef OCTET_PYTHON3
#define OCTET_PYTHON3 "python3"
#endif
bool have_python() {
    return std::system("\"" OCTET_PYTHON3 "\" -c \"import json\" > /dev/null 2>&1") == 0;
}
/// Runs check_report.py; returns 0 when it passes, else what it printed on stderr (non-empty).
std::string check_report(const fs::path& json, const std::string& options = "") {
    const fs::path err = json.string() + ".err";
    const std::string cmd = "\"" OCTET_PYTHON3 "\" \"" OCTET_TRAINING_DIR "/check_report.py\" \"" + json.string() +
                            "\" " + options + " 2> \"" + err.string() + "\"";
    const int rc = std::system(cmd.c_str());
    const std::string said = read(err);
    return rc == 0 ? std::string() : said.empty() ? "exit status " + std::to_string(rc) : said;
}

const std::string odd_recipe = "fp8 <1x128> & \"quoted\"";
// quotes, a backslash, control characters, a code fence, and bytes that are not UTF-8 (a stray
// byte, an encoded surrogate, an overlong form) beside valid 2-, 3- and 4-byte characters
const std::string odd_sample =
    "He said \"hi\\there\"\n\tand ``` left\x01 a byte \xff, \xed\xa0\x80, \xe0\x80\x80 "
    "(\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80)";

/// A sweep of 3 recipes x 2 sizes x 2 lengths x 3 seeds with random values. Only the FP8 recipes
/// have nonzero saturation and underflow; only `odd_recipe` has attention residuals (2 layers).
train::sweep_result make_sweep(std::mt19937_64& g, std::size_t long_steps) {
    std::uniform_real_distribution<double> u(0, 1);
    train::sweep_result s;
    s.command = "example_08_training --seeds 3 --out \"my dir\"";
    s.machine = "test machine | 2 threads";
    s.tolerance_nats = 0.01 + 0.1 * u(g);
    s.tolerance_reason = "seed spread of float32";
    s.gate = {{"attention.row_sum_residual", 1e-7 * u(g), 1e-5, true, "residual | on 4 heads"},
              {"codec.error_bound", train::not_measured, 0.5, false, "did not run"}};
    s.passed = false;
    s.verdicts = {"fp8: within", "mxfp8: beyond by 0.2"};
    s.wall_seconds = 100 * u(g);
    const std::vector<std::string> recipes = {s.reference_recipe, odd_recipe, "mxfp8"};
    const std::vector<std::pair<std::string, std::size_t>> lengths = {
        {"tiny", 37}, {"tiny", long_steps}, {"small", 37}, {"small", long_steps}};
    for (const auto& [size, steps] : lengths)
        for (const auto& recipe : recipes)
            for (int seed = 1; seed <= 3; ++seed) {
                train::run_result r;
                r.recipe = recipe, r.size = size, r.seed = seed, r.steps = int(steps);
                r.parameters = size == "tiny" ? 2e5 : 2e6;
                for (std::size_t i = 0; i < steps; ++i) {
                    r.train_loss.push_back(4.5 * std::exp(-double(i) / double(steps)) + 0.1 * u(g));
                    r.saturation_rate.push_back(recipe == s.reference_recipe ? 0.0 : 1e-4 * u(g));
                    r.underflow_rate.push_back(recipe == s.reference_recipe ? 0.0 : 1e-2 * u(g));
                    if (recipe == odd_recipe) {
                        r.attention_residual.push_back({1e-7 * u(g), 1e-6 * u(g)});
                        r.attention_residual_q.push_back({1e-3 * u(g), 1e-2 * u(g)});
                    } else {
                        r.attention_residual.push_back({0.0, 0.0});
                    }
                }
                r.heldout = {{0, 4.6}, {int(steps) / 2, 3 + u(g)}, {int(steps), 2 + u(g)}};
                r.final_train_loss = 2 + u(g);
                r.final_heldout_loss = r.heldout.back().second;
                r.heldout_bpc = r.final_heldout_loss / std::log(2.0);
                r.tokens_per_second = 1000 + 9000 * u(g);
                r.wall_seconds = 10 * u(g);
                r.op_seconds = {{"linear", 5 * u(g)}, {"attention", 2 * u(g)}};
                r.peak_bytes_by_category = {
                    {"weights", 4 * r.parameters}, {"gradients", 4 * r.parameters}, {"activations", 1e6 * u(g)}};
                r.peak_bytes_measured = 8 * r.parameters + 5e5;
                r.ledger_bytes = r.peak_bytes_by_category;
                r.ledger_peak_bytes = r.peak_bytes_measured * (1 + 0.01 * (u(g) - 0.5));  // 0.5% at most apart
                r.restarts = seed == 1;
                if (seed == 1)
                    r.recoveries.push_back({int(steps) / 3, "reload_checkpoint", "scripted | reload", 0.1 * u(g)});
                r.monitor_seconds = 0.1 * u(g);
                r.monitor_overhead = r.monitor_seconds / r.wall_seconds;
                r.clip_crossings = int(10 * u(g));
                r.sample = recipe == odd_recipe ? odd_sample : "the quick brown fox";
                if (size == "small") {  // a mixture of experts in 2 blocks of 4 experts, top 2
                    r.moe_blocks = 2, r.experts = 4, r.top_k = 2;
                    r.expert_tokens.assign(2, std::vector<double>(4));
                    for (auto& b : r.expert_tokens)
                        for (auto& v : b) v = std::floor(1e4 * u(g));
                    r.expert_imbalance = 1 + u(g), r.expert_imbalance_max = 2 + u(g);
                    r.moe_aux_loss = recipe == odd_recipe ? train::not_measured : 1 + 0.1 * u(g);
                    r.dispatch_fp8_bytes = 1e5 * (1 + u(g)), r.dispatch_bf16_bytes = 2 * r.dispatch_fp8_bytes;
                }
                s.runs.push_back(r);
            }
    s.runs[1].final_heldout_loss = train::not_measured;  // NaN and Inf become null
    s.runs[1].train_loss[3] = INFINITY;
    return s;
}

}  // namespace

TEST_CASE("report: every output is written, well-formed, and carries the sweep's numbers") {
    auto g = octet_test::rng(1201);
    const std::size_t long_steps = 2001 + g() % 1000;  // over 2000: the JSON curves become window means
    const train::sweep_result s = make_sweep(g, long_steps);
    const fs::path dir = fresh_folder("full") / "nested";
    train::write_report(s, dir.string());
    for (const char* f : {"report.json", "report.md", "loss_curves.svg", "memory.svg", "telemetry.svg"}) {
        INFO(f);
        REQUIRE(fs::exists(dir / f));
        CHECK(fs::file_size(dir / f) > 100);
    }

    SUBCASE("JSON: strict syntax, NaN/Inf as null, escaped strings, curves, summary") {
        const std::string text = read(dir / "report.json");
        jvalue j;
        REQUIRE_NOTHROW(j = json_reader(text).parse());
        CHECK(j["command"].s == s.command);
        CHECK(j["passed"].kind == jvalue::boolean);
        CHECK(!j["passed"].b);
        CHECK(j["gate"][1]["value"].kind == jvalue::null);
        REQUIRE(j["runs"].a.size() == s.runs.size());
        CHECK(j["runs"][1]["final_heldout_loss"].kind == jvalue::null);
        CHECK(j["runs"][1]["train_loss"][3].kind == jvalue::null);
        for (std::size_t i = 0; i < s.runs.size(); ++i) {
            const auto& r = s.runs[i];
            const jvalue& jr = j["runs"][i];
            CHECK(jr["recipe"].s == r.recipe);
            CHECK(jr["tokens_per_second"].n == doctest::Approx(r.tokens_per_second).epsilon(1e-9));
            if (r.moe_blocks == 0) {
                CHECK(jr["moe"].kind == jvalue::null);
            } else {
                const jvalue& m = jr["moe"];
                CHECK(m["blocks"].n == r.moe_blocks);
                CHECK(m["expert_tokens"][1][3].n == r.expert_tokens[1][3]);
                CHECK(m["imbalance"].n == r.expert_imbalance);
                CHECK(m["dispatch_bf16_bytes"].n == r.dispatch_bf16_bytes);
                if (std::isfinite(r.moe_aux_loss))
                    CHECK(m["aux_loss"].n == r.moe_aux_loss);
                else
                    CHECK(m["aux_loss"].kind == jvalue::null);
            }
            const std::size_t stride = std::size_t(jr["curve_stride"].n);
            CHECK(stride == (r.train_loss.size() > 2000 ? (r.train_loss.size() + 1999) / 2000 : 1u));
            REQUIRE(jr["train_loss"].a.size() == (r.train_loss.size() + stride - 1) / stride);
            CHECK(jr["train_loss"].a.size() <= 2000);
            for (std::size_t k = 0; k < jr["train_loss"].a.size(); ++k) {  // a window mean, recomputed in float64
                double sum = 0;
                const std::size_t e = std::min(r.train_loss.size(), (k + 1) * stride);
                for (std::size_t t = k * stride; t < e; ++t) sum += r.train_loss[t];
                if (!std::isfinite(sum))
                    CHECK(jr["train_loss"][k].kind == jvalue::null);
                else
                    CHECK(jr["train_loss"][k].n == doctest::Approx(sum / double(e - k * stride)).epsilon(1e-8));
            }
            CHECK(jr["attention_residual"].a.size() == jr["train_loss"].a.size());
            CHECK(jr["attention_residual"][0].a.size() == 2);
        }
        // the odd strings come back byte for byte (the broken UTF-8 byte as U+FFFD)
        std::string want = odd_sample;
        for (const std::string bad : {"\xff", "\xed\xa0\x80", "\xe0\x80\x80"}) {  // each byte becomes U+FFFD
            std::string fffd;
            for (std::size_t k = 0; k < bad.size(); ++k) fffd += "\xEF\xBF\xBD";
            want.replace(want.find(bad), bad.size(), fffd);
        }
        CHECK(j["runs"][3]["sample"].s == want);
        CHECK(j["runs"][3]["recipe"].s == odd_recipe);
        // summary means, recomputed from the runs
        for (const auto& entry : j["summary"].a)
            for (const auto& m : entry["metrics"].a) {
                if (m["name"].s != "tokens_per_second") continue;
                double sum = 0;
                int n = 0;
                for (const auto& r : s.runs)
                    if (r.recipe == entry["recipe"].s && r.size == entry["size"].s && r.steps == int(entry["steps"].n))
                        sum += r.tokens_per_second, ++n;
                CHECK(n == 3);
                CHECK(m["mean"].n == doctest::Approx(sum / n).epsilon(1e-9));
            }
    }

    SUBCASE("markdown: verdict first, per-seed table, samples fenced, plots linked") {
        const std::string md = read(dir / "report.md");
        CHECK(md.find("**Verdict: FAILED**") < md.find("## Gate"));
        const std::size_t per_seed = md.find("## Per seed");
        REQUIRE(per_seed != std::string::npos);
        const std::size_t memory = md.find("## Memory");
        REQUIRE(memory != std::string::npos);
        CHECK(per_seed < memory);
        CHECK(memory < md.find("## Recovery events"));
        std::istringstream lines(md.substr(per_seed, memory - per_seed));
        std::size_t rows = 0;
        for (std::string line; std::getline(lines, line);) rows += line.rfind("| ", 0) == 0;
        CHECK(rows == s.runs.size() + 1);  // + the header row
        // The Memory section: one row per recipe (label) and size, each with its ratio to fp32.
        std::istringstream memory_lines(md.substr(memory, md.find("## Recovery events") - memory));
        std::set<std::string> groups;
        for (const auto& r : s.runs) groups.insert(r.recipe + (r.recovery ? "" : " (no recovery)") + "|" + r.size);
        std::size_t memory_rows = 0;
        for (std::string line; std::getline(memory_lines, line);) memory_rows += line.rfind("| ", 0) == 0;
        CHECK(memory_rows == groups.size() + 1);
        const std::string tps = train::report_detail::printf_str("%.0f", s.runs[5].tokens_per_second);
        CHECK(md.find("| " + tps + " |") != std::string::npos);
        CHECK(md.find("test machine \\| 2 threads") != std::string::npos);  // '|' escaped in cells
        CHECK(md.find("````text\nHe said") != std::string::npos);           // fence longer than the sample's ```
        CHECK(md.find("scripted \\| reload") != std::string::npos);
        for (const char* svg : {"(loss_curves.svg)", "(memory.svg)", "(telemetry.svg)"})
            CHECK(md.find(svg) != std::string::npos);
        // The mixture-of-experts section: one row per recipe and length of the MoE size, then each
        // group's tokens per expert and block
        const std::size_t moe = md.find("## Mixture of experts");
        REQUIRE(moe != std::string::npos);
        const std::size_t moe_end = md.find("## Step time");
        CHECK(md.find("## Recovery events") < moe);
        std::istringstream moe_lines(md.substr(moe, moe_end - moe));
        std::size_t moe_rows = 0, token_lines = 0;
        for (std::string line; std::getline(moe_lines, line);) {
            moe_rows += line.rfind("| ", 0) == 0;
            token_lines += line.rfind("- ", 0) == 0;
            CHECK(line.find("| tiny |") == std::string::npos);
        }
        CHECK(moe_rows == 3 * 2 + 1);
        CHECK(token_lines == 3 * 2 * 2);
    }

    SUBCASE("SVG: well-formed, escaped, one series per drawable curve") {
        const std::string loss = read(dir / "loss_curves.svg"), mem = read(dir / "memory.svg"),
                          tel = read(dir / "telemetry.svg");
        for (const std::string* t : {&loss, &mem, &tel}) {
            CHECK(xml_problem(*t) == "");
            CHECK(t->find("nan") == std::string::npos);  // non-finite values break lines, never reach coordinates
            CHECK(t->find("inf") == std::string::npos);
            CHECK(t->find("<1x128>") == std::string::npos);
            CHECK(t->find("&lt;1x128&gt; &amp; &quot;quoted&quot;") != std::string::npos);
        }
        // recipes x (size, length) groups x (whole run, second half); held-out points at steps
        // 0, n/2 and n, of which the second-half panel shows two
        CHECK(count(loss, "class=\"series\"") == 3 * 4 * 2);
        CHECK(count(loss, "class=\"heldout\"") == 3 * 4 * (3 + 2));
        CHECK(count(mem, "class=\"bar\"") == 2 * 3 * 2);  // measured and ledger x recipes x sizes
        // saturation and underflow: the two FP8 recipes in 4 panels each; residuals (dS and
        // quantized dS): odd_recipe's two layers in 4 panels each (zeros are not drawn on log axes)
        CHECK(count(tel, "class=\"series\"") == 2 * 2 * 4 + 2 * 2 * 4);
        CHECK(loss.size() < 400000);
        CHECK(tel.size() < 400000);
    }

    SUBCASE("check_report.py: passes the report, fails a renamed field and a NaN") {
        if (have_python()) {
            CHECK(check_report(dir / "report.json") == "");
            const std::string text = read(dir / "report.json");
            std::string renamed = text;
            renamed.replace(renamed.find("\"clip_crossings\":"), 16, "\"clip_crossingz\"");
            { std::ofstream(dir / "renamed.json") << renamed; }
            const std::string said = check_report(dir / "renamed.json");
            CHECK(said.find("clip_crossings: missing") != std::string::npos);
            CHECK(said.find("clip_crossingz: not in the schema") != std::string::npos);
            std::string nan_text = text;
            nan_text.replace(nan_text.find("\"wall_seconds\": ") + 16, 1, "NaN, \"x\": 1");
            { std::ofstream(dir / "nan.json") << nan_text; }
            CHECK(check_report(dir / "nan.json").find("NaN is not JSON") != std::string::npos);
        } else {
            MESSAGE("python3 not found: check_report.py not run");
        }
    }
    fs::remove_all(dir.parent_path());
}

TEST_CASE("report: check_report.py holds measured peak memory to the ledger within the margin") {
    if (!have_python()) {
        MESSAGE("python3 not found: skipped");
        return;
    }
    auto g = octet_test::rng(1202);
    train::sweep_result s = make_sweep(g, 40);
    const fs::path dir = fresh_folder("margin");
    train::write_report(s, dir.string());
    CHECK(check_report(dir / "report.json") == "");
    CHECK(check_report(dir / "report.json", "--margin 0.001").find("beyond the 0.1% margin") !=
          std::string::npos);  // runs are up to 0.5% apart
    const std::size_t bad = g() % s.runs.size();
    s.runs[bad].peak_bytes_measured *= 1.5;
    train::write_report(s, dir.string());
    const std::string said = check_report(dir / "report.json");
    CHECK(said.find("report.runs[" + std::to_string(bad) + "]") != std::string::npos);
    CHECK(said.find("beyond the 10% margin") != std::string::npos);  // the margin report_schema.md states
    CHECK(count(said, "beyond") == 1);
    CHECK(check_report(dir / "report.json", "--margin 0.6") == "");
    fs::remove_all(dir);
}

TEST_CASE("report: empty sweeps and runs without curves still write valid outputs; a bad folder throws") {
    const fs::path dir = fresh_folder("empty");
    train::sweep_result s;
    for (int with_run = 0; with_run < 2; ++with_run) {
        if (with_run) s.runs.push_back(train::run_result{});  // a run that never stepped: no curves, NaN losses
        train::write_report(s, dir.string());
        REQUIRE_NOTHROW(json_reader(read(dir / "report.json")).parse());
        for (const char* f : {"loss_curves.svg", "memory.svg", "telemetry.svg"}) {
            const std::string svg = read(dir / f);
            CHECK(xml_problem(svg) == "");
            CHECK(svg.find("nan") == std::string::npos);
        }
        if (have_python()) CHECK(check_report(dir / "report.json") == "");
    }
    { std::ofstream(dir / "a_file") << "x"; }
    CHECK_THROWS_AS(train::write_report(s, (dir / "a_file" / "sub").string()), octet::error);
    fs::remove_all(dir);
}

TEST_CASE("progress: plain lines off a terminal, throttled, with percent, ETA and label") {
    std::FILE* f = std::tmpfile();
    REQUIRE(f);
    {
        train::progress p(200, f);  // 5 s between plain lines: only the first advance and finish print
        for (int i = 0; i < 100; ++i) p.advance(1, "run " + std::to_string(i));
        p.finish();
    }
    {
        train::progress p(4, f, false, 0.0);  // no throttle: one line per advance, then finish
        for (int i = 0; i < 4; ++i) p.advance(1, "step");
        p.finish();
    }
    std::rewind(f);
    std::vector<std::string> lines;
    char buf[512];
    while (std::fgets(buf, sizeof buf, f)) lines.emplace_back(buf);
    std::fclose(f);
    REQUIRE(lines.size() == 2 + 5);
    CHECK(lines[0].find("  0.5%") != std::string::npos);
    CHECK(lines[0].find("run 0") != std::string::npos);
    CHECK(lines[1].find(" 50.0%") != std::string::npos);
    CHECK(lines[1].find("run 99") != std::string::npos);
    CHECK(lines[3].find(" 50.0%") != std::string::npos);
    CHECK(lines[6].find("100.0%") != std::string::npos);
    for (const auto& l : lines) {
        CHECK(l.find('\r') == std::string::npos);
        CHECK(l.find("ETA") != std::string::npos);
        CHECK(l.find("elapsed") != std::string::npos);
    }
    CHECK_THROWS_AS(train::progress(0, stdout), octet::error);
}

#ifndef _WIN32
/// What a progress bar writes to a pseudo-terminal (raw mode: the line discipline adds no \r).
/// (Empty when this machine offers no pseudo-terminal.)
std::optional<std::string> progress_on_a_terminal(bool plain) {
    const int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0) return std::nullopt;
    REQUIRE(grantpt(master) == 0);
    REQUIRE(unlockpt(master) == 0);
    const int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
    REQUIRE(slave >= 0);
    termios t{};
    REQUIRE(tcgetattr(slave, &t) == 0);
    cfmakeraw(&t);
    REQUIRE(tcsetattr(slave, TCSANOW, &t) == 0);
    std::FILE* f = fdopen(slave, "w");
    REQUIRE(f);
    REQUIRE(isatty(fileno(f)));
    {
        train::progress p(3, f, plain, 0.0);
        for (int i = 0; i < 3; ++i) p.advance(1, "step");
    }
    std::fclose(f);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = read(master, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
    close(master);
    return out;
}

TEST_CASE("progress: a terminal gets one line redrawn in place, unless plain lines are asked for (mpirun)") {
    const auto redrawn_out = progress_on_a_terminal(false), plain_out = progress_on_a_terminal(true);
    if (!redrawn_out || !plain_out) {
        MESSAGE("posix_openpt failed: no pseudo-terminal on this machine, the terminal case is not checked");
        return;
    }
    const std::string &redrawn = *redrawn_out, &plain = *plain_out;
    CHECK(redrawn.find('\r') != std::string::npos);
    CHECK(std::count(redrawn.begin(), redrawn.end(), '\n') == 1);  // only finish() ends the line
    CHECK(plain.find('\r') == std::string::npos);
    CHECK(std::count(plain.begin(), plain.end(), '\n') == 3 + 1);  // each advance (no throttle), finish()
    CHECK(plain.find("100.0%") != std::string::npos);
}
#endif
