// Saved activations (octet/nn/saved_activation.hpp) against float64: for every activation recipe,
// over fresh random shapes (ragged columns, one row) and inputs (normal bulk with zeros, float
// subnormals and 1000x outliers, all-zero padding rows, rows at 1e-6), every element comes back
// within saved_activation_error_bound of x; a block holding NaN or Inf comes back NaN and no other
// block changes; and the backwards it feeds (GELU, SiLU, RMSNorm), computed in float64 at x_hat,
// stay within their Lipschitz bound (derived below) of the float64 backward at x. Bytes: about a
// quarter of float32's. Bad arguments give octet::error.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <typeinfo>
#include <vector>

#include "octet/nn/saved_activation.hpp"
#include "support/random.hpp"

namespace nn_saved_activation_test {
using namespace octet;

constexpr double kSqrt2OverPi = 0.7978845608028654;

double gelu_grad(double x) {  // d/dx of 0.5 x (1 + tanh(k (x + 0.044715 x^3)))
    const double u = kSqrt2OverPi * (x + 0.044715 * x * x * x), t = std::tanh(u);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kSqrt2OverPi * (1 + 3 * 0.044715 * x * x);
}
double silu_grad(double x) {  // d/dx of x sigmoid(x)
    const double s = 1 / (1 + std::exp(-x));
    return s * (1 + x * (1 - s));
}
/// max |f''| of a derivative f' over a fine grid of [-20, 20] (both tend to constants outside),
/// by central differences, with 1% added: the Lipschitz constant of the elementwise backward.
template <class Grad>
double lipschitz(Grad grad) {
    double most = 0;
    const double h = 1e-4;
    for (double x = -20; x <= 20; x += 1e-3) most = std::max(most, std::fabs(grad(x + h) - grad(x - h)) / (2 * h));
    return most * 1.01;
}

/// Inputs of one trial: octet_test's mix, then a zero row and a row at 1e-6 where there is room.
std::vector<float> inputs(std::mt19937_64& g, std::size_t rows, std::size_t cols) {
    std::vector<float> x = octet_test::with_edge_cases(g, rows * cols, 1.0f);
    if (rows >= 3) {
        std::fill(x.begin(), x.begin() + cols, 0.0f);  // padding
        std::normal_distribution<float> tiny(0.0f, 1e-6f);
        for (std::size_t j = 0; j < cols; ++j) x[cols + j] = tiny(g);
    }
    return x;
}

template <class R>
void check_recipe(std::uint64_t salt) {
    auto g = octet_test::rng(salt);
    std::uniform_int_distribution<std::size_t> dim(1, 200);
    const double L_gelu = lipschitz(gelu_grad), L_silu = lipschitz(silu_grad);
    thread_pool pool(2);
    for (int trial = 0; trial < 4; ++trial) {
        const std::size_t rows = trial == 0 ? 1 : dim(g), cols = trial == 1 ? 128 : dim(g) + 1;
        INFO("recipe " << typeid(R).name() << " rows=" << rows << " cols=" << cols
                       << " seed=" << octet_test::run_seed());
        const std::vector<float> x = inputs(g, rows, cols);
        saved_activation<R> saved(rows + 5, cols);
        CHECK(saved.bytes() == saved_activation_bytes<R>(rows + 5, cols));
        if (cols == 128) {  // no column padding: codes plus one float scale per group, under 0.32x the
            // bytes of float32 rows (the layout pads the rows, 21 to 24 say: count float32's rows alike)
            const std::size_t padded_rows = (rows + 5 + 7) / 8 * 8;
            CHECK(static_cast<double>(saved.bytes()) <= 0.32 * static_cast<double>(padded_rows * cols * sizeof(float)));
        }
        saved.store(on_host(pool), matrix_ref<const float>(x.data(), rows, cols));
        std::vector<float> xh(rows * cols);
        saved.load(on_host(pool), matrix_ref<float>(xh.data(), rows, cols));

        // The element bound, in float64.
        double worst = 0;
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t j = 0; j < cols; ++j) {
                const double e = std::fabs(static_cast<double>(xh[i * cols + j]) - x[i * cols + j]);
                const double b = saved_activation_error_bound<R>(std::fabs(x[i * cols + j]), saved.scale(i, j));
                worst = std::max(worst, b > 0 ? e / b : (e > 0 ? 1e9 : 0.0));
            }
        CHECK(worst <= 1.0);
        if (rows >= 3)
            for (std::size_t j = 0; j < cols; ++j) CHECK(xh[j] == 0.0f);  // a padding row stays exactly zero

        // The backwards it feeds: float64 at x_hat against float64 at x.
        std::normal_distribution<double> nd(0.0, 1.0);
        std::vector<double> dy(rows * cols), gain(cols);
        for (auto& v : dy) v = nd(g);
        for (auto& v : gain) v = 1.0 + 0.1 * nd(g);
        double worst_gelu = 0, worst_silu = 0, worst_norm = 0;
        for (std::size_t i = 0; i < rows; ++i) {
            for (std::size_t j = 0; j < cols; ++j) {
                const std::size_t k = i * cols + j;
                const double delta = std::fabs(static_cast<double>(xh[k]) - x[k]);
                const double bg = std::fabs(dy[k]) * L_gelu * delta, bs = std::fabs(dy[k]) * L_silu * delta;
                const double eg = std::fabs(dy[k] * (gelu_grad(xh[k]) - gelu_grad(x[k])));
                const double es = std::fabs(dy[k] * (silu_grad(xh[k]) - silu_grad(x[k])));
                worst_gelu = std::max(worst_gelu, bg > 0 ? eg / bg : (eg > 0 ? 1e9 : 0.0));
                worst_silu = std::max(worst_silu, bs > 0 ? es / bs : (es > 0 ? 1e9 : 0.0));
            }
            // RMSNorm y = x r g, r = (mean(x^2) + eps)^-1/2: dx = r a - r^3 c x with a = g * dy,
            // c = (a . x) / n. To first order in delta = x_hat - x, ||d(dx)|| <= 6 r^3 ||x|| ||a||
            // ||delta|| / n (each of dr, d(r a), d(r^3 c x) bounded by Cauchy-Schwarz, r^2 ||x||^2 / n
            // <= 1); twice that covers the second-order terms, which are below 3 ||delta|| / ||x||
            // <= 3 * 2^-3 of the first here.
            const double eps = 1e-5, n = static_cast<double>(cols);
            auto row_grad = [&](auto value, std::vector<double>& out) {
                double ss = 0, ax = 0;
                for (std::size_t j = 0; j < cols; ++j) ss += value(j) * value(j);
                const double r = 1 / std::sqrt(ss / n + eps);
                for (std::size_t j = 0; j < cols; ++j) ax += gain[j] * dy[i * cols + j] * value(j);
                out.resize(cols);
                for (std::size_t j = 0; j < cols; ++j)
                    out[j] = r * gain[j] * dy[i * cols + j] - r * r * r * (ax / n) * value(j);
                return r;
            };
            std::vector<double> g_true, g_hat;
            const double r = row_grad([&](std::size_t j) { return static_cast<double>(x[i * cols + j]); }, g_true);
            row_grad([&](std::size_t j) { return static_cast<double>(xh[i * cols + j]); }, g_hat);
            double nx = 0, na = 0, nd2 = 0, ne = 0;
            for (std::size_t j = 0; j < cols; ++j) {
                const double xv = x[i * cols + j], a = gain[j] * dy[i * cols + j], d = xh[i * cols + j] - xv;
                nx += xv * xv, na += a * a, nd2 += d * d, ne += (g_hat[j] - g_true[j]) * (g_hat[j] - g_true[j]);
            }
            const double bound = 12 * r * r * r * std::sqrt(nx) * std::sqrt(na) * std::sqrt(nd2) / n;
            const double e = std::sqrt(ne);
            worst_norm = std::max(worst_norm, bound > 0 ? e / bound : (e > 1e-300 ? 1e9 : 0.0));
        }
        CHECK(worst_gelu <= 1.0);
        CHECK(worst_silu <= 1.0);
        CHECK(worst_norm <= 1.0);
    }
}

TEST_CASE("saved activations come back within the bound, and the backwards they feed within theirs") {
    check_recipe<activation_recipes::e4m3_1x16>(1);
    check_recipe<activation_recipes::e4m3_1x32>(2);
    check_recipe<activation_recipes::e4m3_1x128>(3);
    check_recipe<activation_recipes::mxfp8>(4);
}

TEST_CASE("a NaN or Inf poisons its own block only") {
    using R = activation_recipes::e4m3_1x32;
    auto g = octet_test::rng(5);
    const std::size_t rows = 4, cols = 96;
    std::vector<float> x = octet_test::with_edge_cases(g, rows * cols, 1.0f);
    x[1 * cols + 40] = std::numeric_limits<float>::quiet_NaN();  // row 1, block 1
    x[3 * cols + 5] = -std::numeric_limits<float>::infinity();   // row 3, block 0
    saved_activation<R> saved(rows, cols);
    const quantize_result r = saved.store(on_host(1), matrix_ref<const float>(x.data(), rows, cols), true);
    CHECK(r.rowwise.non_finite == 2);
    std::vector<float> xh(rows * cols);
    saved.load(on_host(1), matrix_ref<float>(xh.data(), rows, cols));
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) {
            const bool poisoned = (i == 1 && j / 32 == 1) || (i == 3 && j / 32 == 0);
            INFO("i=" << i << " j=" << j);
            CHECK(std::isnan(xh[i * cols + j]) == poisoned);
        }
}

TEST_CASE("saved activations: bad arguments") {
    saved_activation<activation_recipes::e4m3_1x32> saved(8, 64);
    std::vector<float> x(16 * 64, 1.0f), out(8 * 64);
    CHECK_THROWS_AS(saved.store(on_host(1), matrix_ref<const float>(x.data(), 16, 64)), octet::error);
    CHECK_THROWS_AS(saved.store(on_host(1), matrix_ref<const float>(x.data(), 8, 32)), octet::error);
    saved.store(on_host(1), matrix_ref<const float>(x.data(), 4, 64));
    CHECK_THROWS_AS(saved.load(on_host(1), matrix_ref<float>(out.data(), 8, 64)), octet::error);
    saved.load(on_host(1), matrix_ref<float>(out.data(), 4, 64));
    for (std::size_t k = 0; k < 4 * 64; ++k) CHECK(out[k] == 1.0f);
}

}  // namespace nn_saved_activation_test
