// examples/08_training/gate/conversion.hpp: the conversion checks: E4M3 / E5M2 against the float64 reference
// conversion, and blockwise quantization against the float64 quantizer.
#pragma once

#include <octet/octet.hpp>
#include <octet/reference/format.hpp>
#include <octet/reference/quantize.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"

namespace train {
namespace gate {

/// Edge values of a format: zeros, the smallest subnormal and ties around it, the smallest
/// normal, the largest finite value, the overflow threshold and values just around it, Inf, NaN,
/// float subnormals, and every finite value with the midpoints (ties) between neighbours, each
/// also nudged one float ulp either way.
template <class Fmt>
std::vector<float> format_edge_values() {
    const float sub = Fmt::min_subnormal, mx = Fmt::max_finite;
    const float thr = static_cast<float>(Fmt::overflow_threshold_d);
    std::vector<float> v = {0.0f,
                            -0.0f,
                            sub,
                            -sub,
                            0.5f * sub,
                            0.75f * sub,
                            1.5f * sub,
                            Fmt::min_normal,
                            mx,
                            -mx,
                            thr,
                            -thr,
                            std::nextafter(thr, 0.0f),
                            std::nextafter(thr, 2.0f * thr),
                            2.0f * mx,
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            1e-40f,
                            -1e-45f};
    const auto& t = octet::reference::format_table<Fmt>::get();
    for (std::size_t i = 0; i < t.values.size(); ++i) {
        const float a = static_cast<float>(t.values[i]);
        v.push_back(a);
        v.push_back(-a);
        if (i + 1 < t.values.size()) {
            const float mid = static_cast<float>((t.values[i] + t.values[i + 1]) / 2);  // exact in float
            for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
                v.push_back(x);
                v.push_back(-x);
            }
        }
    }
    return v;
}

/// Encodes under nearest-even with both overflow policies and decodes every code, against the
/// float64 brute-force reference (reference/format.hpp); value: the number of disagreements.
template <class Fmt>
gate_check check_format(const char* name) {
    std::size_t bad = 0, n = 0;
    for (float x : format_edge_values<Fmt>()) {
        bad += octet::encode<Fmt, octet::round::nearest_even, octet::overflow::saturate>(x) !=
               octet::reference::encode_code<Fmt, octet::round::nearest_even, octet::overflow::saturate>(x);
        bad += octet::encode<Fmt, octet::round::nearest_even, octet::overflow::to_nonfinite>(x) !=
               octet::reference::encode_code<Fmt, octet::round::nearest_even, octet::overflow::to_nonfinite>(x);
        n += 2;
    }
    for (std::uint32_t code = 0; code < 256; ++code) {
        const float got = octet::decode<Fmt>(static_cast<std::uint8_t>(code));
        const auto want = octet::reference::decode_code<Fmt>(code);
        bool ok;
        switch (want.kind) {
            case octet::reference::code_kind::nan:
                ok = std::isnan(got);
                break;
            case octet::reference::code_kind::pos_inf:
                ok = got == std::numeric_limits<float>::infinity();
                break;
            case octet::reference::code_kind::neg_inf:
                ok = got == -std::numeric_limits<float>::infinity();
                break;
            default:
                ok = static_cast<double>(got) == want.value && std::signbit(got) == std::signbit(want.value);
        }
        bad += !ok;
        ++n;
    }
    return make_check(std::string("format.") + name + ".conversion", static_cast<double>(bad), 0.0,
                      std::to_string(n) +
                          " conversions (encode nearest-even, saturate and to_nonfinite, on zeros, "
                          "subnormals, every value and tie, the overflow threshold, Inf, NaN; "
                          "decode of all 256 codes) against reference/format.hpp: disagreements");
}

/// A random rows x cols matrix whose rows span six decades, with 1% outliers 100x (so that blocks
/// hold E4M3 subnormals).
inline std::vector<float> quantize_test_matrix(std::uint64_t seed, std::size_t rows, std::size_t cols) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> e(-3.0f, 3.0f), p(0.0f, 1.0f);
    std::vector<float> x(rows * cols);
    for (std::size_t i = 0; i < rows; ++i) {
        const float s = std::pow(10.0f, e(g));
        for (std::size_t j = 0; j < cols; ++j) x[i * cols + j] = s * nd(g) * (p(g) < 0.01f ? 100.0f : 1.0f);
    }
    return x;
}

/// blockwise_1x128 quantization of x: codes and scales against reference/quantize.hpp (value: the
/// number that differ), and the round trip per element within E4M3's rounding: x / S rounds with
/// relative error 2^-4 where it is normal (3 mantissa bits: half a step of 2^(e-3) in the binade
/// [2^e, 2^(e+1)) is at most 2^-4 of the value), with absolute error 2^-10 S below 2^-6 (half the
/// subnormal step 2^-9), never saturates (S = amax / 448 puts the block amax on 448), and the
/// division and the decode's product round once each in float: (2^-4 + 2u) |x| + 2^-10 S.
inline std::vector<gate_check> check_blockwise(const std::vector<float>& x, std::size_t rows, std::size_t cols,
                                               const octet::quantized_tensor<octet::recipes::blockwise_1x128>& q,
                                               const std::vector<float>& y) {
    using R = octet::recipes::blockwise_1x128;
    const auto ref = octet::reference::quantize<R>(x, rows, cols, -1.0, [](std::size_t, std::size_t) { return 0u; });
    const auto c = q.cref();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) bad += c.code(i, j) != ref.codes[i * cols + j];
    for (std::size_t bi = 0; bi < ref.scale_rows; ++bi)
        for (std::size_t bj = 0; bj < ref.scale_cols; ++bj)
            bad += c.stored_scale(bi, bj) != ref.stored_scale[bi * ref.scale_cols + bj];
    double worst = 0;
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) {
            const double xv = x[i * cols + j], S = c.scale(i / c.layout.block_rows, j / c.layout.block_cols);
            const double bound = (e4m3_u + 2 * float_u) * std::fabs(xv) + 0x1p-10 * S;
            worst = std::max(worst, ratio(std::fabs(y[i * cols + j] - xv), bound));
        }
    const std::string on = "recipes::blockwise_1x128 on a random " + std::to_string(rows) + "x" + std::to_string(cols) +
                           " matrix (rows over six decades, 1% outliers)";
    return {make_check("quant.blockwise_1x128.vs_float64", static_cast<double>(bad), 0.0,
                       on + ": codes and scales differing from reference/quantize.hpp"),
            make_check("quant.blockwise_1x128.roundtrip", worst, 1.0,
                       on + ": worst |dequantize(quantize(x)) - x| over (2^-4 + 2u) |x| + 2^-10 S, E4M3's unit "
                            "roundoff in the normal range and half its subnormal step below (a value at a tie "
                            "reaches 1 / (1 + 2^-4) = 0.94)")};
}

inline std::vector<gate_check> conversion_checks(octet::host_executor ex, std::uint64_t seed) {
    std::vector<gate_check> out;
    out.push_back(check_format<octet::e4m3>("e4m3"));
    out.push_back(check_format<octet::e5m2>("e5m2"));
    const std::size_t rows = 128, cols = 256;
    const auto x = quantize_test_matrix(seed, rows, cols);
    octet::quantized_tensor<octet::recipes::blockwise_1x128> q(rows, cols);
    octet::quantize<octet::recipes::blockwise_1x128>(ex, octet::matrix_ref<const float>(x.data(), rows, cols), q.ref());
    std::vector<float> y(rows * cols);
    octet::dequantize(ex, q.cref(), octet::matrix_ref<float>(y.data(), rows, cols));
    for (auto& c : check_blockwise(x, rows, cols, q, y)) out.push_back(std::move(c));
    return out;
}

}  // namespace gate
}  // namespace train
