// quant_recipes_check.hpp: the check of a host quantizer instantiation against the float64
// reference quantizer (octet/reference/quantize.hpp), shared by the test files that run it over
// many recipes (tests/host/quant_recipes*.cpp: each file is one translation unit, and the
// instantiations are what takes the time to compile). check_recipe quantizes fresh random data
// with outliers, zeros, float subnormals, Inf and NaN into both copies and compares every stored
// scale, code, padding byte and statistic, the dequantized values, and the error bound (half a
// unit of the format, one for directed and stochastic rounding); check_all_shapes runs it over
// ragged shapes (1 x N, M x 1, 0 x N, non-multiples of every block).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "octet/quant/quantize.hpp"
#include "octet/reference/quantize.hpp"
#include "support/random.hpp"
#include "support/storage.hpp"

namespace quant_recipes_test {
using namespace octet;

struct shape {
    std::size_t rows, cols;
};
inline const shape kShapes[] = {{1, 300}, {300, 1}, {129, 257}, {257, 33},  {64, 128},
                                {3, 5},   {0, 7},   {5, 0},     {130, 130}, {300, 700}};

using octet_test::to_storage;
using octet_test::widen;
/// The reference's value of a code, with Inf and NaN.
template <class Fmt>
double ref_value(std::uint32_t code) {
    const auto r = reference::decode_code<Fmt>(code);
    switch (r.kind) {
        case reference::code_kind::nan:
            return std::nan("");
        case reference::code_kind::pos_inf:
            return INFINITY;
        case reference::code_kind::neg_inf:
            return -INFINITY;
        default:
            return r.value;
    }
}

inline std::vector<float> transpose(const std::vector<float>& x, std::size_t rows, std::size_t cols) {
    std::vector<float> t(x.size());
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) t[j * rows + i] = x[i * cols + j];
    return t;
}

/// Compares one quantized copy with the reference; returns the number of mismatches.
template <class Recipe>
std::size_t compare_copy(const quantized_tensor<Recipe>& q, const reference::quantized_matrix& ref,
                         const std::vector<float>& x, const quant_stats& stats, bool check_stats, const char* what) {
    using Fmt = typename Recipe::format;
    const auto c = q.cref();
    const quant_layout& L = q.layout();
    std::size_t bad = 0;
    INFO(what << " " << L.rows << "x" << L.cols);
    REQUIRE(L.scale_rows == ref.scale_rows);
    REQUIRE(L.scale_cols == ref.scale_cols);
    for (std::size_t bi = 0; bi < L.scale_rows; ++bi)
        for (std::size_t bj = 0; bj < L.scale_cols; ++bj) {
            const std::size_t k = bi * ref.scale_cols + bj;
            const double got = c.scale(bi, bj);
            const bool same_value = got == ref.scale_value[k] || (std::isnan(got) && std::isnan(ref.scale_value[k]));
            if (c.stored_scale(bi, bj) != ref.stored_scale[k] || !same_value) {
                if (bad++ < 3)
                    FAIL_CHECK("scale (" << bi << "," << bj << "): stored 0x" << std::hex << c.stored_scale(bi, bj)
                                         << " expected 0x" << ref.stored_scale[k] << std::dec << " value "
                                         << c.scale(bi, bj) << " vs " << ref.scale_value[k]);
            }
        }
    quant_stats expect;
    const bool directed = !std::is_same_v<typename Recipe::rounding, round::nearest_even>;
    for (std::size_t i = 0; i < L.rows; ++i) {
        for (std::size_t j = 0; j < L.cols; ++j) {
            const std::uint8_t code = c.code(i, j);
            const std::uint8_t want = ref.codes[i * L.cols + j];
            const float xv = x[i * L.cols + j];
            if (code != want && bad++ < 3)
                FAIL_CHECK("code (" << i << "," << j << ") x=" << xv << ": got 0x" << std::hex << +code
                                    << " expected 0x" << +want);
            // statistics and error bound from the reference's view of the element
            const double S = ref.scale_of(i, j);
            ++expect.elements;
            if (!std::isfinite(xv)) {
                ++expect.non_finite;
                continue;
            }
            expect.amax = std::max(expect.amax, std::fabs(xv));
            if (std::isnan(S)) {  // a NaN block (nan_policy::propagate)
                ++expect.lost_to_nan;
                continue;
            }
            const double dec = ref_value<Fmt>(want) * S;
            const double back = static_cast<double>(static_cast<float>(dec));
            const double v = S == 0 ? 0 : static_cast<double>(static_cast<float>(xv / S));
            const bool sat = S != 0 && (std::fabs(v) > Fmt::overflow_threshold_d ||
                                        (std::fabs(v) == Fmt::overflow_threshold_d && (Fmt::max_code & 1u)));
            expect.saturated += sat;
            expect.flushed_to_zero += (xv != 0.0f && back == 0.0);
            expect.signal_energy += static_cast<double>(xv) * xv;
            expect.noise_energy += (xv - back) * (xv - back);
            if (!sat && S != 0 && std::fabs(v) >= Fmt::min_subnormal_d / 2) {
                const auto nb = reference::neighbours<Fmt>(std::fabs(v));
                const double gap = nb.exact ? 0 : nb.hi_value - nb.lo_value;
                const double bound = (directed ? 1.0 : 0.5) * gap * S + std::ldexp(std::fabs(xv), -22);
                if (std::fabs(xv - back) > bound && bad++ < 3)
                    FAIL_CHECK("error bound at (" << i << "," << j << ") x=" << xv);
            }
        }
        for (std::size_t j = L.cols; j < L.ld; ++j)
            if (c.code(i, j) != 0 && bad++ < 3) FAIL_CHECK("padding code at (" << i << "," << j << ") not zero");
    }
    if (check_stats) {
        CHECK(stats.elements == expect.elements);
        CHECK(stats.non_finite == expect.non_finite);
        CHECK(stats.lost_to_nan == expect.lost_to_nan);
        CHECK(stats.saturated == expect.saturated);
        CHECK(stats.flushed_to_zero == expect.flushed_to_zero);
        CHECK(static_cast<double>(stats.amax) == expect.amax);
        CHECK(stats.signal_energy == doctest::Approx(expect.signal_energy).epsilon(1e-12));
        CHECK(stats.noise_energy == doctest::Approx(expect.noise_energy).epsilon(1e-9));
    }
    return bad;
}

template <class Recipe, class In = float>
void check_recipe(std::size_t rows, std::size_t cols, std::uint64_t salt, float scale = 10.0f) {
    auto g = octet_test::rng(salt);
    const auto stored = to_storage<In>(octet_test::with_edge_cases(g, rows * cols, scale, true));
    const auto x = widen(stored);  // the exact values the quantizer sees
    quantized_tensor<Recipe> q(rows, cols), qt(cols, rows);
    const philox_stream rng{octet_test::run_seed(), salt};
    quantize_options opt;
    opt.collect_stats = true;
    opt.rng = rng;
    const auto result =
        quantize<Recipe>(on_host(), matrix_ref<const In>(stored.data(), rows, cols), q.ref(), qt.ref(), opt);
    const auto ref = reference::quantize<Recipe>(
        x, rows, cols, -1.0, [&](std::size_t i, std::size_t j) { return rng.bits(octet::stochastic_index(i, j)); });
    const philox_stream rng_t{rng.seed, rng.offset + 1};
    const auto ref_t = reference::quantize<Recipe>(
        transpose(x, rows, cols), cols, rows, -1.0,
        [&](std::size_t i, std::size_t j) { return rng_t.bits(octet::stochastic_index(i, j)); });
    INFO(std::string(format_name<typename Recipe::format>()) << " rows=" << rows << " cols=" << cols);
    CHECK(static_cast<double>(result.amax) == ref.amax);
    if (Recipe::two_level) {
        CHECK(static_cast<double>(q.tensor_scale()) == ref.tensor_scale);
        CHECK(static_cast<double>(qt.tensor_scale()) == ref.tensor_scale);
    }
    CHECK(compare_copy(q, ref, x, result.rowwise, true, "rowwise") == 0);
    CHECK(compare_copy(qt, ref_t, transpose(x, rows, cols), result.columnwise, true, "columnwise") == 0);

    // dequantize gives decode(code) * S
    std::vector<float> y(rows * cols);
    dequantize(on_host(), q.cref(), matrix_ref<float>(y.data(), rows, cols));
    std::size_t bad = 0;
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) {
            const double want = ref_value<typename Recipe::format>(ref.codes[i * cols + j]) * ref.scale_of(i, j);
            const float w = static_cast<float>(want);
            const bool same = y[i * cols + j] == w || (std::isnan(y[i * cols + j]) && std::isnan(w));
            if (!same && bad++ < 3)
                FAIL_CHECK("dequantize (" << i << "," << j << "): " << y[i * cols + j] << " expected " << w);
        }
    CHECK(bad == 0);
}

template <class Recipe>
void check_all_shapes(std::uint64_t salt) {
    for (const auto& s : kShapes) check_recipe<Recipe>(s.rows, s.cols, salt++);
}

}  // namespace quant_recipes_test
