// The memory ledger: accounting, peaks, and the what-if arithmetic of the design essay.
#include <doctest/doctest.h>

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
    CHECK(setup.scaled({{memory_category::weights, 0.5}, {memory_category::optimizer_state, 0.5}, {memory_category::activations, 0.5}})
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
    CHECK_THROWS_WITH_AS(l.release(memory_category::weights, 2000), doctest::Contains("argument 'bytes'"), octet::error);
    CHECK_THROWS_AS(l.set(memory_category::gradients, -1), octet::error);
    CHECK(l.to_json().find("\"peak_total\": 1800") != std::string::npos);
    CHECK(l.to_markdown().find("| total | 1700 |") != std::string::npos);
}
