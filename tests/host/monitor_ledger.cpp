// The memory ledger: accounting, peaks, and the what-if arithmetic of the design essay.
#include <doctest/doctest.h>

#include <cctype>
#include <limits>
#include <string>

#include "octet/monitor/memory_ledger.hpp"

using octet::memory_category;
using octet::memory_ledger;

TEST_CASE("what-if: 20 weights, 40 optimizer state, 30 activations, 10 temporaries") {
    const memory_ledger setup{{memory_category::weights, 20},
                              {memory_category::optimizer_state, 40},
                              {memory_category::activations, 30},
                              {memory_category::temporaries, 10}};
    CHECK(setup.total() == 100);
    CHECK(setup.scaled({{memory_category::weights, 0.5}}).total() == 90);
    CHECK(setup
              .scaled({{memory_category::weights, 0.5},
                       {memory_category::optimizer_state, 0.5},
                       {memory_category::activations, 0.5}})
              .total() == 55);
    CHECK(setup.share(memory_category::optimizer_state) == doctest::Approx(0.4));
}

TEST_CASE("allocations, frees and peaks") {
    memory_ledger l;
    l.allocate(memory_category::weights, 1000);
    l.allocate(memory_category::activations, 500);
    l.allocate(memory_category::temporaries, 300);
    CHECK(l.peak_total() == 1800);
    l.release(memory_category::temporaries, 300);
    l.allocate(memory_category::activations, 200);
    CHECK(l.total() == 1700);
    CHECK(l.peak_total() == 1800);  // the largest moment, not a sum of category peaks
    CHECK(l.peak(memory_category::activations) == 700);
    CHECK_THROWS_WITH_AS(l.release(memory_category::weights, 2000), doctest::Contains("argument 'bytes'"),
                         octet::error);
    CHECK_THROWS_AS(l.set(memory_category::gradients, -1), octet::error);
    CHECK(l.to_json().find("\"peak_total\": 1800") != std::string::npos);
    CHECK(l.to_markdown().find("| total | 1700 |") != std::string::npos);
}

namespace {

/// A strict JSON (RFC 8259) validity check: true when `s` is exactly one JSON value. Independent of
/// the ledger's writer; it rejects what JSON lacks (inf, nan, trailing commas, bare words).
struct json_checker {
    const std::string& s;
    std::size_t i = 0;
    void ws() {
        while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
    }
    bool lit(const char* w) {
        const std::string word(w);
        if (s.compare(i, word.size(), word) != 0) return false;
        i += word.size();
        return true;
    }
    bool digits() {
        const std::size_t b = i;
        while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
        return i > b;
    }
    bool number() {
        if (i < s.size() && s[i] == '-') ++i;
        if (i < s.size() && s[i] == '0')
            ++i;
        else if (!digits())
            return false;
        if (i < s.size() && s[i] == '.') {
            ++i;
            if (!digits()) return false;
        }
        if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
            ++i;
            if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
            if (!digits()) return false;
        }
        return true;
    }
    bool string() {
        if (i >= s.size() || s[i] != '"') return false;
        for (++i; i < s.size(); ++i) {
            const unsigned char c = static_cast<unsigned char>(s[i]);
            if (c == '"') return ++i, true;
            if (c < 0x20) return false;
            if (c == '\\') {
                if (++i >= s.size()) return false;
                if (s[i] == 'u') {
                    for (int k = 0; k < 4; ++k)
                        if (++i >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
                } else if (std::string("\"\\/bfnrt").find(s[i]) == std::string::npos) {
                    return false;
                }
            }
        }
        return false;
    }
    bool value() {
        ws();
        if (i >= s.size()) return false;
        bool ok;
        if (s[i] == '{')
            ok = members('}', true);
        else if (s[i] == '[')
            ok = members(']', false);
        else if (s[i] == '"')
            ok = string();
        else if (s[i] == 't')
            ok = lit("true");
        else if (s[i] == 'f')
            ok = lit("false");
        else if (s[i] == 'n')
            ok = lit("null");
        else
            ok = number();
        ws();
        return ok;
    }
    bool members(char close, bool object) {
        ++i;
        ws();
        if (i < s.size() && s[i] == close) return ++i, true;
        for (;;) {
            if (object) {
                ws();
                if (!string()) return false;
                ws();
                if (i >= s.size() || s[i++] != ':') return false;
            }
            if (!value()) return false;
            if (i < s.size() && s[i] == ',') {
                ++i;
                continue;
            }
            if (i < s.size() && s[i] == close) return ++i, true;
            return false;
        }
    }
};
bool valid_json(const std::string& s) {
    json_checker c{s};
    return c.value() && c.i == s.size();
}

}  // namespace

TEST_CASE("the JSON checker itself: accepts JSON, rejects what JSON lacks") {
    CHECK(valid_json("{\"a\": [1, -2.5e-3, 0, true, null, \"x\\u00e9\\n\"], \"b\": {}}"));
    CHECK(valid_json("[]"));
    CHECK_FALSE(valid_json("{\"a\": inf}"));
    CHECK_FALSE(valid_json("{\"a\": nan}"));
    CHECK_FALSE(valid_json("{\"a\": -inf}"));
    CHECK_FALSE(valid_json("[1, 2,]"));
    CHECK_FALSE(valid_json("{\"a\": 1} x"));
    CHECK_FALSE(valid_json("{\"a\": 01}"));
    CHECK_FALSE(valid_json("{a: 1}"));
}

TEST_CASE("non-finite and negative sizes are rejected, so the JSON always holds numbers") {
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    memory_ledger l{{memory_category::weights, 1e9}, {memory_category::activations, 3.5e8}};
    for (double bad : {inf, -inf, nan, -1.0}) {
        CHECK_THROWS_WITH_AS(l.set(memory_category::gradients, bad), doctest::Contains("argument 'bytes'"),
                             octet::error);
        CHECK_THROWS_WITH_AS(l.allocate(memory_category::temporaries, bad), doctest::Contains("argument 'bytes'"),
                             octet::error);
        CHECK_THROWS_WITH_AS(l.release(memory_category::weights, bad), doctest::Contains("argument 'bytes'"),
                             octet::error);
        CHECK_THROWS_WITH_AS(l.scaled({{memory_category::weights, bad}}), doctest::Contains("argument 'factor'"),
                             octet::error);
    }
    CHECK_THROWS_WITH_AS(memory_ledger({{memory_category::weights, inf}}), doctest::Contains("finite"), octet::error);
    // finite values whose total overflows are refused too, and leave the ledger as it was
    memory_ledger big{{memory_category::weights, 1e308}};
    CHECK_THROWS_WITH_AS(big.set(memory_category::gradients, 1e308), doctest::Contains("overflow"), octet::error);
    CHECK_THROWS_WITH_AS(big.allocate(memory_category::weights, 1e308), doctest::Contains("overflow"), octet::error);
    CHECK_THROWS_WITH_AS(big.scaled({{memory_category::weights, 10.0}}), doctest::Contains("overflow"), octet::error);
    CHECK(big.total() == 1e308);
    CHECK(big.bytes(memory_category::gradients) == 0);
    // the errors left the books unchanged, and the JSON parses
    CHECK(l.total() == 1e9 + 3.5e8);
    CHECK(l.peak_total() == 1e9 + 3.5e8);
    CHECK(valid_json(l.to_json()));
    CHECK(valid_json(big.to_json()));
    CHECK(valid_json(memory_ledger{}.to_json()));
    l.allocate(memory_category::temporaries, 0.25);
    CHECK(valid_json(l.scaled({{memory_category::weights, 0.5}}).to_json()));
}

TEST_CASE("scaled() refuses a category named twice (its factors would multiply)") {
    const memory_ledger l{{memory_category::weights, 100}, {memory_category::optimizer_state, 200}};
    CHECK_THROWS_WITH_AS(l.scaled({{memory_category::weights, 0.5},
                                   {memory_category::optimizer_state, 0.25},
                                   {memory_category::weights, 0.5}}),
                         doctest::Contains("weights twice"), octet::error);
    // each category once: exactly the product of its own factor
    const memory_ledger s = l.scaled({{memory_category::weights, 0.5}, {memory_category::optimizer_state, 0.25}});
    CHECK(s.bytes(memory_category::weights) == 50);
    CHECK(s.bytes(memory_category::optimizer_state) == 50);
    CHECK(s.peak_total() == 100);
}
