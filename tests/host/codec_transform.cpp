// The orthogonal transforms of the gradient codecs (codec/hadamard.hpp), against float64:
//   * the float transform equals the matrix definition (reference/codec.hpp, O(B^2) per block, no
//     shared code) within the rounding bound (log2 B + 2) 2^-24 ||x||, and the inverse recovers x
//     within twice that; ||T x|| = ||x|| within the same bound (an isometry);
//   * the transform matrix, built column by column from basis vectors, is orthogonal in float64:
//     M^T M = I within 2^-22 (its entries are +-c exactly, c = float(1/sqrt B));
//   * ragged lengths: L = ceil(n / B_eff) B_eff coordinates, B_eff the effective block; the
//     zero-padded tail is transformed as the definition says and the inverse writes only n values;
//   * the host's fused butterflies round exactly as one stage per pass (the device's order);
//   * shards transform exactly as the whole vector (signs depend on the global index only), and
//     the result does not depend on the thread count;
//   * non-finite inputs poison exactly their own block; bad blocks raise octet::error.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "octet/codec/hadamard.hpp"
#include "octet/reference/codec.hpp"
#include "support/random.hpp"

namespace {
using namespace octet;
constexpr double u = 0x1p-24;

double norm64(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x * x;
    return std::sqrt(s);
}
double dist(const std::vector<float>& a, const std::vector<double>& b) {
    double s = 0;
    for (std::size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
    return std::sqrt(s);
}
std::vector<float> normal(std::mt19937_64& g, std::size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

}  // namespace

TEST_CASE("hadamard: equals the float64 matrix definition; the inverse recovers x") {
    auto g = octet_test::rng(1);
    for (const std::uint32_t B : {16u, 32u, 128u, 256u, 1024u}) {
        for (const std::size_t n : {std::size_t{B} * 3, std::size_t{B} * 2 + 5, std::size_t{7}, std::size_t{B} - 1}) {
            const std::uint64_t seed = g(), first = g() % 1000;
            std::vector<float> x = normal(g, n);
            x[0] = 1e6f;  // an outlier: the bound is relative to ||x||, whatever the spread
            const std::size_t L = transform_length(transform_kind::hadamard, n, B);
            const std::uint32_t Be = hadamard_effective_block(n, B);
            CHECK(L % Be == 0);
            CHECK(L >= n);
            CHECK(L - n < Be);
            std::vector<float> y(L, std::numeric_limits<float>::quiet_NaN());
            transform_forward(on_host(), transform_kind::hadamard, x, y, B, seed, first);
            const std::vector<double> x64(x.begin(), x.end());
            const std::vector<double> y64 =
                reference::transform_forward_f64(transform_kind::hadamard, x64, B, seed, first);
            const int k = log2_exact(Be);
            const double nx = norm64(x64);
            CAPTURE(B);
            CAPTURE(n);
            // Each of the k butterfly stages rounds once per value (u relative; later stages keep the
            // error's size relative to ||x||), c is rounded once and the final product once: (k + 2) u.
            CHECK(dist(y, y64) <= (k + 2) * u * nx * 1.01);
            double ny = 0;
            for (float v : y) ny += static_cast<double>(v) * v;
            CHECK(std::fabs(std::sqrt(ny) - nx) <= (k + 2) * u * nx * 1.01);

            std::vector<float> back(n, std::numeric_limits<float>::quiet_NaN());
            transform_inverse(on_host(), transform_kind::hadamard, y, back, B, seed, first);
            CHECK(dist(back, x64) <= 2 * (k + 2) * u * nx * 1.02);
            // The float64 inverse of the float64 forward is the identity (the definition is consistent).
            const std::vector<double> back64 =
                reference::transform_inverse_f64(transform_kind::hadamard, y64, n, B, seed, first);
            double e = 0;
            for (std::size_t i = 0; i < n; ++i) e += (back64[i] - x64[i]) * (back64[i] - x64[i]);
            CHECK(std::sqrt(e) <= 1e-12 * nx);
        }
    }
}

TEST_CASE("hadamard: the host butterflies are the plain stage order, bit for bit") {
    // The device runs one stage per index bit in increasing order; the host fuses stages for speed.
    // Both must round identically, so compare with the textbook loop on random floats.
    auto g = octet_test::rng(5);
    for (std::size_t m = 8; m <= 32768; m *= 2) {
        std::vector<float> a = normal(g, m), b = a;
        for (std::size_t h = 1; h < m; h <<= 1)
            for (std::size_t i = 0; i < m; i += 2 * h)
                for (std::size_t j = i; j < i + h; ++j) {
                    const float p = a[j], q = a[j + h];
                    a[j] = p + q;
                    a[j + h] = p - q;
                }
        detail::fwht_inplace(b.data(), m);
        CAPTURE(m);
        CHECK(std::memcmp(a.data(), b.data(), m * sizeof(float)) == 0);
    }
}

TEST_CASE("hadamard: the transform matrix is orthogonal (checked in float64)") {
    auto g = octet_test::rng(2);
    for (const std::uint32_t B : {16u, 32u, 64u, 128u, 256u, 512u}) {
        const std::uint64_t seed = g();
        std::vector<std::vector<double>> col(B);
        for (std::uint32_t i = 0; i < B; ++i) {
            std::vector<float> e(B, 0.0f), y(B);
            e[i] = 1.0f;
            transform_forward(on_host(1), transform_kind::hadamard, e, y, B, seed, 0);
            col[i].assign(y.begin(), y.end());
            // Entry (j, i) is c * H[j][i] * d_i exactly (the sums of one +-1 are exact).
            const double c = static_cast<double>(hadamard_norm(log2_exact(B)));
            for (std::uint32_t j = 0; j < B; ++j)
                CHECK(col[i][j] == c * reference::hadamard_entry(j, i) * reference::hadamard_sign(seed, i));
        }
        double worst = 0;
        for (std::uint32_t i = 0; i < B; ++i)
            for (std::uint32_t j = i; j < B; ++j) {
                double d = 0;
                for (std::uint32_t r = 0; r < B; ++r) d += col[i][r] * col[j][r];
                worst = std::max(worst, std::fabs(d - (i == j ? 1.0 : 0.0)));
            }
        CAPTURE(B);
        // M^T M = c^2 B I with c = float(1/sqrt B): |c^2 B - 1| <= 2u (+u^2); off-diagonals are exactly 0.
        CHECK(worst <= 2.0 * u + u * u);
    }
}

TEST_CASE("hadamard: large blocks against a float64 reference, ragged tails, identity") {
    auto g = octet_test::rng(3);
    for (const std::uint32_t B : {4096u, 32768u}) {
        const std::size_t n = B + B / 2 + 3;  // one full block, one zero-padded tail block
        std::vector<float> x = normal(g, n);
        std::vector<float> y(transform_length(transform_kind::hadamard, n, B));
        CHECK(y.size() == 2 * std::size_t{B});
        transform_forward(on_host(), transform_kind::hadamard, x, y, B, 7, 0);
        // Spot-check 64 coordinates of each block against the definition (O(B) each).
        const double c = 1.0 / std::sqrt(static_cast<double>(B));
        double worst = 0;
        const double nx = norm64(std::vector<double>(x.begin(), x.end()));
        for (int probe = 0; probe < 128; ++probe) {
            const std::size_t i = g() % y.size(), base = i / B * B;
            double s = 0;
            for (std::size_t j = 0; j < B && base + j < n; ++j)
                s += reference::hadamard_entry(i - base, j) * reference::hadamard_sign(7, base + j) * x[base + j];
            worst = std::max(worst, std::fabs(y[i] - c * s));
        }
        // A single coordinate errs by at most the whole vector's bound.
        CHECK(worst <= (log2_exact(B) + 2) * u * nx * 1.01);
        std::vector<float> back(n);
        transform_inverse(on_host(), transform_kind::hadamard, y, back, B, 7, 0);
        double e = 0;
        for (std::size_t i = 0; i < n; ++i)
            e += (back[i] - static_cast<double>(x[i])) * (back[i] - static_cast<double>(x[i]));
        CHECK(std::sqrt(e) <= 2 * (log2_exact(B) + 2) * u * nx * 1.02);
    }
    // Short messages use a short block: 40 elements with B = 4096 transform in a block of 64.
    CHECK(transform_length(transform_kind::hadamard, 40, 4096) == 64);
    CHECK(transform_length(transform_kind::hadamard, 3, 4096) == 16);
    CHECK(transform_length(transform_kind::hadamard, 0, 4096) == 0);
    CHECK(transform_length(transform_kind::identity, 40, 4096) == 40);
    // Identity is a copy.
    std::vector<float> x = normal(g, 37), y(37);
    transform_forward(on_host(), transform_kind::identity, x, y, 0, 1, 0);
    CHECK(x == y);
}

TEST_CASE("hadamard: shards transform as the whole vector; thread count does not matter") {
    auto g = octet_test::rng(4);
    const std::uint32_t B = 256;
    const std::size_t n = 10 * B + 77;
    const std::vector<float> x = normal(g, n);
    std::vector<float> whole(transform_length(transform_kind::hadamard, n, B)), one(whole.size());
    transform_forward(on_host(), transform_kind::hadamard, x, whole, B, 99, 1000);
    transform_forward(on_host(1), transform_kind::hadamard, x, one, B, 99, 1000);
    CHECK(whole == one);
    // Shard [3B, 7B) with first_index = 1000 + 3B gives the same coordinates bit for bit.
    std::vector<float> part(4 * B);
    transform_forward(on_host(), transform_kind::hadamard, span<const float>(x.data() + 3 * B, 4 * B), part, B, 99,
                      1000 + 3 * B);
    CHECK(std::equal(part.begin(), part.end(), whole.begin() + 3 * B));
    // A different seed is a different rotation.
    std::vector<float> other(whole.size());
    transform_forward(on_host(), transform_kind::hadamard, x, other, B, 100, 1000);
    CHECK(other != whole);
}

TEST_CASE("hadamard: non-finite inputs poison their own block only; bad arguments") {
    const std::uint32_t B = 64;
    std::vector<float> x(3 * B, 1.0f), y(3 * B);
    x[B + 5] = std::numeric_limits<float>::quiet_NaN();
    x[2 * B + 1] = std::numeric_limits<float>::infinity();
    transform_forward(on_host(), transform_kind::hadamard, x, y, B, 3, 0);
    for (std::size_t i = 0; i < B; ++i) CHECK(std::isfinite(y[i]));
    for (std::size_t i = B; i < 3 * B; ++i) CHECK_FALSE(std::isfinite(y[i]));

    std::vector<float> z(100);
    CHECK_THROWS_WITH_AS(transform_forward(on_host(), transform_kind::hadamard, x, z, 1000, 0, 0),
                         doctest::Contains("argument 'block'"), octet::error);
    CHECK_THROWS_WITH_AS(transform_forward(on_host(), transform_kind::hadamard, x, z, 8, 0, 0),
                         doctest::Contains("argument 'block'"), octet::error);
    CHECK_THROWS_WITH_AS(transform_forward(on_host(), transform_kind::hadamard, x, z, 65536, 0, 0),
                         doctest::Contains("argument 'block'"), octet::error);
    CHECK_THROWS_WITH_AS(transform_forward(on_host(), transform_kind::hadamard, x, z, 64, 0, 0),
                         doctest::Contains("argument 'y'"), octet::error);
    CHECK_THROWS_WITH_AS(transform_inverse(on_host(), transform_kind::hadamard, z, x, 64, 0, 0),
                         doctest::Contains("argument 'y'"), octet::error);
    CHECK_THROWS_WITH_AS(transform_forward(on_host(), static_cast<transform_kind>(7), x, z, 64, 0, 0),
                         doctest::Contains("argument 'kind'"), octet::error);
}
