// Fresh random inputs for tests: every run draws a new seed (printed by the test main) unless
// OCTET_TEST_SEED is set, so repeated runs explore new inputs and a failure can be replayed.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

namespace octet_test {

inline std::uint64_t run_seed() {
    static const std::uint64_t seed = [] {
        if (const char* s = std::getenv("OCTET_TEST_SEED"))
            return static_cast<std::uint64_t>(std::strtoull(s, nullptr, 10));
        std::random_device rd;
        return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    }();
    return seed;
}

/// A generator for one test, derived from the run seed and a per-test salt.
inline std::mt19937_64 rng(std::uint64_t salt) {
    return std::mt19937_64(run_seed() ^ (salt * 0x9E3779B97F4A7C15ull));
}

/// Values spanning many binades with random signs: |x| = 2^U(lo, hi) * U(1, 2).
inline std::vector<float> log_uniform(std::mt19937_64& g, std::size_t n, float lo_exp, float hi_exp) {
    std::uniform_real_distribution<float> e(lo_exp, hi_exp), m(1.0f, 2.0f);
    std::bernoulli_distribution s(0.5);
    std::vector<float> v(n);
    for (auto& x : v) x = (s(g) ? -1.0f : 1.0f) * std::ldexp(m(g), static_cast<int>(std::floor(e(g))));
    return v;
}

/// Normal bulk (standard deviation `scale`) with about 0.5% each of +0, -0, float subnormals and
/// 1000x outliers; with `non_finite`, also about 0.5% each of +-Inf and NaN.
inline std::vector<float> with_edge_cases(std::mt19937_64& g, std::size_t n, float scale = 1.0f,
                                          bool non_finite = false) {
    std::normal_distribution<float> normal(0.0f, scale);
    std::uniform_int_distribution<int> pick(0, 199);
    std::vector<float> v(n);
    for (auto& x : v) {
        const int p = pick(g);
        if (p == 0)
            x = 0.0f;
        else if (p == 1)
            x = -0.0f;
        else if (p == 2)
            x = normal(g) * 1e-40f;  // float subnormal
        else if (p == 3)
            x = normal(g) * 1000.0f;  // outlier
        else if (non_finite && p == 4)
            x = (pick(g) & 1) ? INFINITY : -INFINITY;
        else if (non_finite && p == 5)
            x = NAN;
        else
            x = normal(g);
    }
    return v;
}

}  // namespace octet_test
