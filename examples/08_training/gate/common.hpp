// examples/08_training/gate/common.hpp: what every part of the gate shares: a check from its measurement,
// the unit roundoffs, norms and distances in double.
#pragma once

#include <octet/octet.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../train.hpp"

namespace train {
namespace gate {

inline constexpr double float_u = 0x1p-24;  ///< float's unit roundoff
inline constexpr double e4m3_u = 0x1p-4;    ///< E4M3's unit roundoff (3 mantissa bits)

/// A check from its measurement: passed when both numbers are finite and value <= limit.
inline gate_check make_check(std::string name, double value, double limit, std::string detail) {
    gate_check c;
    c.name = std::move(name);
    c.value = value;
    c.limit = limit;
    c.passed = std::isfinite(value) && std::isfinite(limit) && value <= limit;
    c.detail = std::move(detail);
    return c;
}

/// A number for a detail line (3 significant digits).
inline std::string num(double v) {
    std::ostringstream s;
    s.precision(3);
    s << v;
    return s.str();
}

/// err / bound, 0 when both are 0 (an exact result needs no slack).
inline double ratio(double err, double bound) {
    return err == 0.0 ? 0.0 : err / bound;
}

inline double norm2(const std::vector<double>& x) {
    double s = 0;
    for (double v : x) s += v * v;
    return std::sqrt(s);
}
inline double norm2(const std::vector<float>& x) {
    double s = 0;
    for (float v : x) s += static_cast<double>(v) * v;
    return std::sqrt(s);
}
/// ||a - b|| with a and b widened to double.
template <class A, class B>
double dist2(const std::vector<A>& a, const std::vector<B>& b) {
    double s = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
        s += d * d;
    }
    return std::sqrt(s);
}

namespace detail {
/// x (rows x cols) quantized with recipe R into `out`, and its dequantized values in double (the
/// float64 references' operands).
template <class R>
std::vector<double> quantize_operand(octet::host_executor ex, const std::vector<float>& x, std::size_t rows,
                                     std::size_t cols, octet::quantized_tensor<R>& out) {
    out = octet::quantized_tensor<R>(rows, cols);
    octet::quantize<R>(ex, octet::matrix_ref<const float>(x.data(), rows, cols), out.ref());
    std::vector<float> y(rows * cols);
    octet::dequantize(ex, out.cref(), octet::matrix_ref<float>(y.data(), rows, cols));
    return std::vector<double>(y.begin(), y.end());
}
}  // namespace detail

}  // namespace gate
}  // namespace train
