// The grouped scaled GEMM (octet/gemm/grouped_gemm.hpp) for mixture-of-experts layers, on the host:
// m-grouped contiguous, m-grouped masked and k-grouped, for the per-tensor, 1x128 x 128x128 and MXFP8
// pairs, with ragged group sizes (0, 1, sizes that are no multiple of any block) and outlier groups.
// Oracles: each group against quantize + scaled_gemm on that group's slice alone (bit for bit: a
// group is quantized as a matrix of its own, so an outlier group cannot change another group's
// scale); each expert's product in float64 on the dequantized copies of its own slice (within float
// rounding of sum |a| |b|); zeros where a group has no tokens; bad arguments.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "octet/gemm/grouped_gemm.hpp"
#include "support/random.hpp"

namespace gemm_grouped_test {
using namespace octet;
using recipes::blockwise_128x128;
using recipes::blockwise_1x128;
using recipes::mxfp8_e4m3;
using recipes::tensorwise_e4m3;

const std::vector<std::size_t> kSizes{0, 5, 130, 1, 37, 0, 64};

/// Tokens of all groups (sum of sizes x cols); group 2 is 1000x larger than the others.
std::vector<float> tokens(std::mt19937_64& g, const std::vector<std::size_t>& sizes, std::size_t cols) {
    std::vector<float> x;
    for (std::size_t e = 0; e < sizes.size(); ++e) {
        auto part = octet_test::with_edge_cases(g, sizes[e] * cols, e == 2 ? 1000.0f : 1.0f);
        x.insert(x.end(), part.begin(), part.end());
    }
    return x;
}

template <class R>
quantized_tensor<R> quantized(const float* x, std::size_t rows, std::size_t cols) {
    quantized_tensor<R> q(rows, cols);
    quantize<R>(on_host(), matrix_ref<const float>(x, rows, cols), q.ref());
    return q;
}

template <class R>
quantized_tensor<R> quantized_t(const float* x, std::size_t rows, std::size_t cols) {  // the copy of x^T
    quantized_tensor<R> q(cols, rows);
    quantize<R>(on_host(), matrix_ref<const float>(x, rows, cols), quantized_ref<R>{}, q.ref());
    return q;
}

/// ||D - A B^T|| / ||T|| with A B^T in float64 on the dequantized copies and T_ij = sum_k |a_ik b_jk|
/// (the scale of a float GEMM's rounding): a check of the result that does not go through scaled_gemm.
template <class RA, class RB>
double float64_gap(quantized_cref<RA> a, quantized_cref<RB> b, const float* d, std::size_t ld) {
    double err = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < a.rows(); ++i)
        for (std::size_t j = 0; j < b.rows(); ++j) {
            double exact = 0.0, t = 0.0;
            for (std::size_t k = 0; k < a.cols(); ++k) {
                const double p = static_cast<double>(a.value(i, k)) * b.value(j, k);
                exact += p;
                t += std::fabs(p);
            }
            err += (d[i * ld + j] - exact) * (d[i * ld + j] - exact);
            scale += t * t;
        }
    return scale > 0 ? std::sqrt(err / scale) : std::sqrt(err);
}

template <class RA, class RB>
void check_m_grouped(std::uint64_t salt) {
    INFO("A: " << recipe_description<RA>() << ", B: " << recipe_description<RB>()
               << " seed=" << octet_test::run_seed());
    auto g = octet_test::rng(salt);
    const std::size_t K = 200, N = 96, G = kSizes.size();
    const auto x = tokens(g, kSizes, K);
    const std::size_t M = x.size() / K;
    std::vector<quantized_tensor<RB>> w;
    for (std::size_t e = 0; e < G; ++e) {
        const auto wf = octet_test::with_edge_cases(g, N * K, 0.05f);
        w.push_back(quantized<RB>(wf.data(), N, K));
    }
    std::vector<quantized_cref<RB>> wref;
    for (auto& t : w) wref.push_back(t.cref());

    grouped_quantized_tensor<RA> xq(grouped_rows(as_cspan(kSizes), K));
    std::vector<quantize_result> results(G);
    grouped_quantize<RA>(on_host(), matrix_ref<const float>(x.data(), M, K), as_cspan(kSizes), xq.ref(), {}, {},
                         as_span(results));
    std::vector<float> y(M * N, -7.0f);
    grouped_scaled_gemm(on_host(), xq.cref(), as_cspan(wref), matrix_ref<float>(y.data(), M, N));

    std::size_t begin = 0;
    for (std::size_t e = 0; e < G; ++e) {
        INFO("group " << e << " of " << kSizes[e] << " rows");
        const std::size_t rows = kSizes[e];
        if (rows) {
            const auto alone = quantized<RA>(x.data() + begin * K, rows, K);
            std::vector<float> ref(rows * N);
            scaled_gemm(on_host(), alone.cref(), w[e].cref(), matrix_ref<float>(ref.data(), rows, N));
            CHECK(std::memcmp(ref.data(), y.data() + begin * N, ref.size() * sizeof(float)) == 0);
            CHECK(results[e].amax > 0.0f);
            // the expert's product in float64 on the dequantized copies of its own slice and weight
            CHECK(float64_gap(alone.cref(), w[e].cref(), y.data() + begin * N, N) < 1e-5);
        }
        begin += rows;
    }
}

TEST_CASE("m-grouped contiguous: each expert's rows are scaled_gemm on that expert's tokens alone") {
    check_m_grouped<tensorwise_e4m3, tensorwise_e4m3>(1);
    check_m_grouped<blockwise_1x128, blockwise_128x128>(2);
    check_m_grouped<mxfp8_e4m3, mxfp8_e4m3>(3);
}

/// A NaN in one expert's tokens and an Inf in another's: each expert's rows are still the dense
/// scaled_gemm of its slice alone, bit for bit (non-finite values propagate as the dense GEMM
/// propagates them), and the experts without any are bit for bit the run without them.
template <class RA, class RB>
void check_non_finite(std::uint64_t salt) {
    INFO("A: " << recipe_description<RA>() << ", B: " << recipe_description<RB>()
               << " seed=" << octet_test::run_seed());
    auto g = octet_test::rng(salt);
    const std::size_t K = 160, N = 48, G = kSizes.size();
    const auto clean = tokens(g, kSizes, K);
    const std::size_t M = clean.size() / K;
    auto dirty = clean;
    dirty[(5 + 3) * K + 7] = std::numeric_limits<float>::quiet_NaN();          // expert 2 (rows 5..134), row 3
    dirty[(5 + 130 + 1) * K + 100] = -std::numeric_limits<float>::infinity();  // expert 4 (rows 136..172)
    std::vector<quantized_tensor<RB>> w;
    std::vector<quantized_cref<RB>> wref;
    for (std::size_t e = 0; e < G; ++e) {
        const auto wf = octet_test::with_edge_cases(g, N * K, 0.05f);
        w.push_back(quantized<RB>(wf.data(), N, K));
    }
    for (auto& t : w) wref.push_back(t.cref());
    auto run = [&](const std::vector<float>& x) {
        grouped_quantized_tensor<RA> xq(grouped_rows(as_cspan(kSizes), K));
        grouped_quantize<RA>(on_host(), matrix_ref<const float>(x.data(), M, K), as_cspan(kSizes), xq.ref());
        std::vector<float> y(M * N, -7.0f);
        grouped_scaled_gemm(on_host(), xq.cref(), as_cspan(wref), matrix_ref<float>(y.data(), M, N));
        return y;
    };
    const auto y_clean = run(clean), y = run(dirty);
    std::size_t begin = 0, non_finite = 0;
    for (std::size_t e = 0; e < G; ++e) {
        INFO("group " << e << " of " << kSizes[e] << " rows");
        const std::size_t rows = kSizes[e], bytes = rows * N * sizeof(float);
        if (rows) {
            const auto alone = quantized<RA>(dirty.data() + begin * K, rows, K);
            std::vector<float> ref(rows * N);
            scaled_gemm(on_host(), alone.cref(), w[e].cref(), matrix_ref<float>(ref.data(), rows, N));
            CHECK(std::memcmp(ref.data(), y.data() + begin * N, bytes) == 0);
            if (e != 2 && e != 4) CHECK(std::memcmp(y_clean.data() + begin * N, y.data() + begin * N, bytes) == 0);
            for (std::size_t i = 0; i < rows * N; ++i) non_finite += !std::isfinite(y[begin * N + i]);
        }
        begin += rows;
    }
    CHECK(non_finite > 0);  // the NaN and the Inf reached the outputs of their experts
}

TEST_CASE("m-grouped contiguous: a NaN or an Inf in one expert's tokens stays in that expert") {
    check_non_finite<tensorwise_e4m3, tensorwise_e4m3>(11);
    check_non_finite<blockwise_1x128, blockwise_128x128>(12);
    check_non_finite<mxfp8_e4m3, mxfp8_e4m3>(13);
}

TEST_CASE("m-grouped masked: valid rows as contiguous, padding rows (garbage) zero in D") {
    auto g = octet_test::rng(4);
    const std::size_t K = 256, N = 64, capacity = 40;
    const std::vector<std::size_t> valid{0, 40, 17, 3};
    const std::size_t G = valid.size();
    auto x = octet_test::with_edge_cases(g, G * capacity * K);
    for (std::size_t e = 0; e < G; ++e)  // padding rows hold garbage: per-row scales must not see it
        for (std::size_t i = valid[e]; i < capacity; ++i)
            for (std::size_t k = 0; k < K; ++k) x[(e * capacity + i) * K + k] = 1e30f;
    std::vector<quantized_tensor<blockwise_128x128>> w;
    std::vector<quantized_cref<blockwise_128x128>> wref;
    for (std::size_t e = 0; e < G; ++e) {
        const auto wf = octet_test::with_edge_cases(g, N * K, 0.05f);
        w.push_back(quantized<blockwise_128x128>(wf.data(), N, K));
    }
    for (auto& t : w) wref.push_back(t.cref());
    const std::vector<std::size_t> caps(G, capacity);
    grouped_quantized_tensor<blockwise_1x128> xq(grouped_rows(as_cspan(caps), K));
    grouped_quantize<blockwise_1x128>(on_host(), matrix_ref<const float>(x.data(), G * capacity, K), as_cspan(caps),
                                      xq.ref());
    std::vector<float> y(G * capacity * N, -7.0f);
    grouped_scaled_gemm_masked(on_host(), xq.cref(), as_cspan(wref), as_cspan(valid),
                               matrix_ref<float>(y.data(), G * capacity, N));
    for (std::size_t e = 0; e < G; ++e) {
        INFO("group " << e << ", " << valid[e] << " valid rows");
        if (valid[e]) {
            const auto alone = quantized<blockwise_1x128>(x.data() + e * capacity * K, valid[e], K);
            std::vector<float> ref(valid[e] * N);
            scaled_gemm(on_host(), alone.cref(), w[e].cref(), matrix_ref<float>(ref.data(), valid[e], N));
            CHECK(std::memcmp(ref.data(), y.data() + e * capacity * N, ref.size() * sizeof(float)) == 0);
        }
        for (std::size_t i = valid[e]; i < capacity; ++i)
            for (std::size_t j = 0; j < N; ++j) CHECK(y[(e * capacity + i) * N + j] == 0.0f);
    }
}

template <class R>
void check_k_grouped(std::uint64_t salt) {
    INFO("recipe " << recipe_description<R>() << " seed=" << octet_test::run_seed());
    auto g = octet_test::rng(salt);
    const std::size_t N = 48, K = 72, G = kSizes.size();
    const auto dy = tokens(g, kSizes, N);
    const auto x = tokens(g, kSizes, K);
    const std::size_t M = x.size() / K;
    grouped_quantized_tensor<R> dyt(grouped_cols(N, as_cspan(kSizes))), xt(grouped_cols(K, as_cspan(kSizes)));
    grouped_quantize<R>(on_host(), matrix_ref<const float>(dy.data(), M, N), as_cspan(kSizes), {}, dyt.ref());
    grouped_quantize<R>(on_host(), matrix_ref<const float>(x.data(), M, K), as_cspan(kSizes), {}, xt.ref());
    std::vector<float> dw(G * N * K, -7.0f);
    grouped_scaled_gemm_k(on_host(), dyt.cref(), xt.cref(), matrix_ref<float>(dw.data(), G * N, K));
    std::size_t begin = 0;
    for (std::size_t e = 0; e < G; ++e) {
        INFO("group " << e << " of " << kSizes[e] << " tokens");
        const std::size_t t = kSizes[e];
        const float* got = dw.data() + e * N * K;
        if (t == 0) {
            for (std::size_t i = 0; i < N * K; ++i) CHECK(got[i] == 0.0f);
        } else {
            const auto a = quantized_t<R>(dy.data() + begin * N, t, N);
            const auto b = quantized_t<R>(x.data() + begin * K, t, K);
            std::vector<float> ref(N * K);
            scaled_gemm(on_host(), a.cref(), b.cref(), matrix_ref<float>(ref.data(), N, K));
            CHECK(std::memcmp(ref.data(), got, ref.size() * sizeof(float)) == 0);
            CHECK(float64_gap(a.cref(), b.cref(), got, K) < 1e-5);
        }
        begin += t;
    }
}

TEST_CASE("k-grouped: each expert's weight gradient over its own tokens, zero for an expert without any") {
    check_k_grouped<blockwise_1x128>(5);
    check_k_grouped<tensorwise_e4m3>(6);
    check_k_grouped<mxfp8_e4m3>(7);
}

TEST_CASE("bad arguments are refused by name") {
    const std::vector<std::size_t> sizes{2, 3};
    std::vector<float> x(5 * 32, 1.0f), y(5 * 16);
    grouped_quantized_tensor<tensorwise_e4m3> xq(grouped_rows(as_cspan(sizes), 32));
    const std::vector<std::size_t> wrong{2, 2};
    CHECK_THROWS_WITH_AS(grouped_quantize<tensorwise_e4m3>(on_host(), matrix_ref<const float>(x.data(), 5, 32),
                                                           as_cspan(wrong), xq.ref()),
                         doctest::Contains("'sizes'"), error);
    quantize_options delayed;
    delayed.tensor_amax = 3.0f;
    CHECK_THROWS_WITH_AS(grouped_quantize<tensorwise_e4m3>(on_host(), matrix_ref<const float>(x.data(), 5, 32),
                                                           as_cspan(sizes), xq.ref(), {}, delayed),
                         doctest::Contains("tensor_amax"), error);
    grouped_quantize<tensorwise_e4m3>(on_host(), matrix_ref<const float>(x.data(), 5, 32), as_cspan(sizes), xq.ref());
    quantized_tensor<tensorwise_e4m3> w(16, 32), w_bad(16, 24);
    std::vector<quantized_cref<tensorwise_e4m3>> one{w.cref()}, mixed{w.cref(), w_bad.cref()}, two{w.cref(), w.cref()};
    CHECK_THROWS_WITH_AS(grouped_scaled_gemm(on_host(), xq.cref(), as_cspan(one), matrix_ref<float>(y.data(), 5, 16)),
                         doctest::Contains("'B'"), error);
    CHECK_THROWS_WITH_AS(grouped_scaled_gemm(on_host(), xq.cref(), as_cspan(mixed), matrix_ref<float>(y.data(), 5, 16)),
                         doctest::Contains("'B'"), error);
    CHECK_THROWS_WITH_AS(grouped_scaled_gemm(on_host(), xq.cref(), as_cspan(two), matrix_ref<float>(y.data(), 4, 16)),
                         doctest::Contains("'D'"), error);
    grouped_quantized_tensor<blockwise_1x128> xm(grouped_rows(as_cspan(sizes), 32));
    quantized_tensor<blockwise_1x128> wm(16, 32);
    std::vector<quantized_cref<blockwise_1x128>> wms{wm.cref(), wm.cref()};
    const std::vector<std::size_t> too_many{2, 4};
    CHECK_THROWS_WITH_AS(grouped_scaled_gemm_masked(on_host(), xm.cref(), as_cspan(wms), as_cspan(too_many),
                                                    matrix_ref<float>(y.data(), 5, 16)),
                         doctest::Contains("every group of a masked GEMM"), error);
}

}  // namespace gemm_grouped_test
