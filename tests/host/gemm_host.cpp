// The host scaled GEMM against the float64 reference GEMM on dequantized operands
// (octet/reference/gemm.hpp): for every scaling pair of training (tensor x tensor, row x row,
// 1x128 x 128x128, 1x128 x 1x128, MX x MX, NVFP4 x NVFP4, mixed E4M3 x E5M2) and the sub-byte
// MX formats, over fresh random shapes including ragged M, N, K and M = 1, every element is within
// the documented bound (gemm_error_bound, derived in scaled_gemm.hpp; the tolerance is that bound,
// nothing tuned). Also: exact inputs give exact results; thread counts give the same bits; NaN
// propagates to its row only; the epilogue (alpha, beta C, bias, bf16/fp16/column-major D); a
// quantized output; the promotion interval; a software model of a truncating 13-bit tensor-core
// accumulator stays inside the tensor-core bound and shows why promotion matters; bad arguments.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "octet/gemm/scaled_gemm.hpp"
#include "octet/reference/gemm.hpp"
#include "support/random.hpp"

namespace gemm_host_test {
using namespace octet;

using e5m2_1x128 = recipe<e5m2, block<1, 128>, scale::amax_ratio<0>>;
using e5m2_rowwise = recipe<e5m2, per_row, scale::amax_ratio<0>>;

template <class R>
quantized_tensor<R> quantized(const std::vector<float>& x, std::size_t rows, std::size_t cols, bool pad = true) {
    quantized_tensor<R> q(rows, cols, pad);
    quantize<R>(on_host(), matrix_ref<const float>(x.data(), rows, cols), q.ref());
    return q;
}

template <class T>
double as_double(T v) {
    if constexpr (std::is_same_v<T, float>)
        return v;
    else
        return to_float(v);
}

struct worst_ratio {
    double ratio = 0.0;  // largest |error| / bound seen
    double rel = 0.0;    // largest |error| / T seen
};

/// Runs the host backend on fresh random operands and checks every element against the reference.
template <class RA, class RB, class DT = float>
void check_pair(std::size_t M, std::size_t N, std::size_t K, std::uint64_t salt, worst_ratio& worst,
                gemm_options opt = {}, bool with_c = false, storage_order d_layout = storage_order::row_major,
                int threads = 0) {
    INFO("A: " << recipe_description<RA>() << ", B: " << recipe_description<RB>() << ", M=" << M << " N=" << N
               << " K=" << K << " P=" << opt.promotion_interval << " seed=" << octet_test::run_seed());
    auto g = octet_test::rng(salt);
    const auto xa = octet_test::with_edge_cases(g, M * K, 2.0f);
    const auto xb = octet_test::with_edge_cases(g, N * K, 0.5f);
    const auto qa = quantized<RA>(xa, M, K);
    const auto qb = quantized<RB>(xb, N, K);

    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> c(M * N), bias(N);
    for (auto& v : c) v = nd(g);
    for (auto& v : bias) v = nd(g);
    if (with_c) opt.beta = 0.75f;
    if (with_c) opt.bias = as_cspan(bias);

    std::vector<DT> d(M * N);
    for (auto& v : d) v = detail::store_from_float<DT>(NAN);  // poison: every element must be written
    const matrix_ref<DT> D = d_layout == storage_order::row_major
                                 ? matrix_ref<DT>(d.data(), M, N, N)
                                 : matrix_ref<DT>(d.data(), M, N, M, storage_order::col_major);
    gemm_result r;
    if (with_c)
        r = scaled_gemm(on_host(threads), qa.cref(), qb.cref(), matrix_ref<const float>(c.data(), M, N), D, opt);
    else
        r = scaled_gemm(on_host(threads), qa.cref(), qb.cref(), D, opt);
    CHECK(r.backend == gemm_backend::host);

    const auto ref = reference::gemm(qa.cref(), qb.cref());
    const gemm_numerics nm = gemm_numerics_of<RA, RB, DT>(gemm_backend::host, K, opt);
    int bad = 0;
    for (std::size_t i = 0; i < M; ++i)
        for (std::size_t j = 0; j < N; ++j) {
            const double bc = with_c ? static_cast<double>(opt.beta) * c[i * N + j] : 0.0;
            const double bb = with_c ? static_cast<double>(bias[j]) : 0.0;
            const double exact = static_cast<double>(opt.alpha) * ref.product[i * N + j] + bc + bb;
            const double T = ref.abs_products[i * N + j];
            const double bound = gemm_error_bound(nm, opt.alpha, T, std::fabs(bc), std::fabs(bb), std::fabs(exact));
            const double got = as_double(D(i, j));
            if (std::fabs(exact) - bound > std::ldexp(1.0, 16) - std::ldexp(1.0, 4) && std::is_same_v<DT, fp16>) {
                // beyond fp16's rounding threshold 65520: the contract says Inf of the same sign
                CHECK((std::isinf(got) && (got > 0) == (exact > 0)));
                continue;
            }
            const double err = std::fabs(got - exact);
            if (!(err <= bound) && bad++ < 3)
                FAIL_CHECK("D(" << i << "," << j << ") = " << got << ", exact " << exact << ", error " << err
                                << " > bound " << bound);
            if (bound > 0) worst.ratio = std::max(worst.ratio, err / bound);
            if (T > 0)
                worst.rel = std::max(
                    worst.rel, std::fabs(got - exact) / (std::fabs(opt.alpha) * T + std::fabs(bc) + std::fabs(bb)));
        }
}

struct shape {
    std::size_t M, N, K;
};
// Ragged everything, M = 1 (decode), K = 1, K below one block, K not a multiple of 16, and square.
const shape kShapes[] = {{1, 67, 300}, {37, 129, 1000}, {128, 128, 256}, {5, 3, 16},
                         {1, 1, 1},    {64, 41, 385},   {17, 200, 130},  {3, 7, 1}};

template <class RA, class RB>
void all_shapes(const char* name, std::uint64_t salt) {
    worst_ratio w;
    for (const shape& s : kShapes) check_pair<RA, RB>(s.M, s.N, s.K, salt++, w);
    MESSAGE(std::string(name) << ": worst |error| / bound = " << w.ratio << ", worst |error| / T = " << w.rel);
}

TEST_CASE("every scaling pair against the float64 reference, within the documented bound") {
    all_shapes<recipes::tensorwise_e4m3, recipes::tensorwise_e4m3>("tensor x tensor", 100);
    all_shapes<recipes::rowwise_e4m3, recipes::rowwise_e4m3>("row x row", 200);
    all_shapes<recipes::blockwise_1x128, recipes::blockwise_128x128>("1x128 x 128x128", 300);
    all_shapes<recipes::blockwise_1x128, recipes::blockwise_1x128>("1x128 x 1x128", 400);
    all_shapes<recipes::mxfp8_e4m3, recipes::mxfp8_e4m3>("MXFP8 x MXFP8", 500);
    all_shapes<recipes::nvfp4, recipes::nvfp4>("NVFP4 x NVFP4", 600);
    all_shapes<recipes::tensorwise_e4m3, recipes::tensorwise_e5m2>("E4M3 x E5M2 tensor", 700);
    all_shapes<e5m2_1x128, recipes::blockwise_128x128>("E5M2 1x128 x E4M3 128x128 (data gradient)", 800);
    all_shapes<recipes::mxfp8_e4m3, recipes::mxfp8_e5m2>("MXFP8 E4M3 x E5M2", 900);
    all_shapes<recipes::rowwise_e4m3, e5m2_rowwise>("row E4M3 x row E5M2", 1000);
    all_shapes<recipes::blockwise_128x128, recipes::blockwise_128x128>("128x128 x 128x128", 1100);
    all_shapes<recipes::mxfp4, recipes::mxfp4>("MXFP4 x MXFP4", 1200);
    all_shapes<recipes::mxfp6_e2m3, recipes::mxfp6_e3m2>("MXFP6 E2M3 x E3M2", 1300);
    all_shapes<recipes::blockwise_1x128, recipes::tensorwise_e4m3>("1x128 x tensor", 1400);
}

TEST_CASE("the epilogue: alpha, beta C, bias; bf16, fp16 and column-major D; thread counts") {
    worst_ratio w;
    gemm_options opt;
    opt.alpha = -1.5f;
    check_pair<recipes::blockwise_1x128, recipes::blockwise_128x128, float>(33, 70, 260, 1, w, opt, true);
    check_pair<recipes::blockwise_1x128, recipes::blockwise_128x128, bf16>(33, 70, 260, 2, w, opt, true);
    check_pair<recipes::blockwise_1x128, recipes::blockwise_128x128, fp16>(33, 70, 260, 3, w, opt, true);
    check_pair<recipes::mxfp8_e4m3, recipes::mxfp8_e4m3, bf16>(19, 9, 100, 4, w, opt, true, storage_order::col_major);
    check_pair<recipes::rowwise_e4m3, recipes::rowwise_e4m3, float>(65, 66, 67, 5, w, opt, false,
                                                                    storage_order::row_major, 1);
    check_pair<recipes::rowwise_e4m3, recipes::rowwise_e4m3, float>(65, 66, 67, 5, w, opt, false,
                                                                    storage_order::row_major, 3);
    MESSAGE("epilogue cases: worst |error| / bound = " << w.ratio);

    // The same problem on 1, 2 and 5 threads gives the same bits (each element has one fixed order).
    auto g = octet_test::rng(6);
    const std::size_t M = 70, N = 90, K = 500;
    const auto qa = quantized<recipes::blockwise_1x128>(octet_test::with_edge_cases(g, M * K), M, K);
    const auto qb = quantized<recipes::blockwise_128x128>(octet_test::with_edge_cases(g, N * K), N, K);
    std::vector<float> d1(M * N), d2(M * N), d5(M * N);
    scaled_gemm(on_host(1), qa.cref(), qb.cref(), matrix_ref<float>(d1.data(), M, N));
    scaled_gemm(on_host(2), qa.cref(), qb.cref(), matrix_ref<float>(d2.data(), M, N));
    scaled_gemm(on_host(5), qa.cref(), qb.cref(), matrix_ref<float>(d5.data(), M, N));
    CHECK(std::memcmp(d1.data(), d2.data(), d1.size() * 4) == 0);
    CHECK(std::memcmp(d1.data(), d5.data(), d1.size() * 4) == 0);

    // C may be D itself (in-place accumulation).
    std::vector<float> acc = d1, expect(M * N);
    gemm_options o2;
    o2.beta = 1.0f;
    scaled_gemm(on_host(), qa.cref(), qb.cref(), matrix_ref<const float>(acc.data(), M, N),
                matrix_ref<float>(acc.data(), M, N), o2);
    for (std::size_t i = 0; i < M * N; ++i) expect[i] = d1[i] + d1[i];
    CHECK(std::memcmp(acc.data(), expect.data(), acc.size() * 4) == 0);
}

TEST_CASE("exact inputs give exact results") {
    // Small integers times 32 are exact E4M3 codes under the MX floor rule when every block's amax
    // is 8 (scale 2^-5); products and sums of such codes are integers far below 2^24, so every
    // float operation is exact and D must equal the float64 product bit for bit.
    auto g = octet_test::rng(7);
    std::uniform_int_distribution<int> small(-8, 8);
    const std::size_t M = 45, N = 37, K = 320;
    auto make = [&](std::size_t rows) {
        std::vector<float> x(rows * K);
        for (auto& v : x) v = static_cast<float>(small(g));
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t k = 0; k < K; k += 32) x[i * K + k] = 8.0f;  // every MX block's amax is 8
        return x;
    };
    const auto qa = quantized<recipes::mxfp8_e4m3>(make(M), M, K);
    const auto qb = quantized<recipes::mxfp8_e4m3>(make(N), N, K);
    std::vector<float> d(M * N);
    for (int P : {32, 128, 4096}) {
        gemm_options opt;
        opt.promotion_interval = P;
        scaled_gemm(on_host(), qa.cref(), qb.cref(), matrix_ref<float>(d.data(), M, N), opt);
        const auto ref = reference::gemm(qa.cref(), qb.cref());
        int bad = 0;
        for (std::size_t i = 0; i < M * N; ++i)
            if (static_cast<double>(d[i]) != ref.product[i] && bad++ < 3)
                FAIL_CHECK("element " << i << ": " << d[i] << " vs " << ref.product[i]);
        CHECK(bad == 0);
    }
}

TEST_CASE("non-finite inputs reach their row or column of D, and under propagate never come out finite") {
    auto g = octet_test::rng(8);
    const std::size_t M = 9, N = 11, K = 256;
    auto xa = octet_test::with_edge_cases(g, M * K);
    auto xb = octet_test::with_edge_cases(g, N * K);
    xa[4 * K + 17] = NAN;        // row 4 of A
    xb[6 * K + 200] = NAN;       // row 6 of B = column 6 of D
    xa[2 * K + 3] = -INFINITY;   // row 2 of A
    xb[8 * K + 130] = INFINITY;  // row 8 of B
    std::vector<float> d(M * N);
    SUBCASE("per_element: a NaN code reaches its row or column; an Inf saturates") {
        using A = with_nan_policy<recipes::blockwise_1x128, nan_policy::per_element>;
        using B = with_nan_policy<recipes::blockwise_128x128, nan_policy::per_element>;
        const auto qa = quantized<A>(xa, M, K);
        const auto qb = quantized<B>(xb, N, K);
        scaled_gemm(on_host(), qa.cref(), qb.cref(), matrix_ref<float>(d.data(), M, N));
        for (std::size_t i = 0; i < M; ++i)
            for (std::size_t j = 0; j < N; ++j) CHECK(std::isnan(d[i * N + j]) == (i == 4 || j == 6));
    }
    SUBCASE("propagate (the default): the NaN scale of a NaN or Inf block reaches every output that reads it") {
        const auto qa = quantized<recipes::blockwise_1x128>(xa, M, K);
        const auto qb = quantized<recipes::blockwise_1x128>(xb, N, K);
        scaled_gemm(on_host(), qa.cref(), qb.cref(), matrix_ref<float>(d.data(), M, N));
        for (std::size_t i = 0; i < M; ++i)
            for (std::size_t j = 0; j < N; ++j)
                CHECK(std::isnan(d[i * N + j]) == (i == 4 || i == 2 || j == 6 || j == 8));
        // a 128 x 128 block of B holds all 11 rows: every column of D
        const auto qw = quantized<recipes::blockwise_128x128>(xb, N, K);
        scaled_gemm(on_host(), qa.cref(), qw.cref(), matrix_ref<float>(d.data(), M, N));
        for (float v : d) CHECK(std::isnan(v));
    }
}

TEST_CASE("quantized output: the float result quantized with the output recipe, and its amax") {
    auto g = octet_test::rng(9);
    const std::size_t M = 40, N = 300, K = 200;
    const auto qa = quantized<recipes::blockwise_1x128>(octet_test::with_edge_cases(g, M * K), M, K);
    const auto qb = quantized<recipes::blockwise_128x128>(octet_test::with_edge_cases(g, N * K), N, K);
    gemm_options opt;
    std::vector<float> bias(N, 0.25f);
    opt.bias = as_cspan(bias);
    std::vector<float> d(M * N);
    scaled_gemm(on_host(), qa.cref(), qb.cref(), matrix_ref<float>(d.data(), M, N), opt);
    quantized_tensor<recipes::blockwise_1x128> qd(M, N), expect(M, N);
    const gemm_result r = scaled_gemm(on_host(), qa.cref(), qb.cref(), qd.ref(), opt);
    const quantize_result qr =
        quantize<recipes::blockwise_1x128>(on_host(), matrix_ref<const float>(d.data(), M, N), expect.ref());
    CHECK(qd.data() == expect.data());
    CHECK(qd.scales() == expect.scales());
    float amax = 0;
    for (float v : d) amax = std::max(amax, std::fabs(v));
    CHECK(r.amax == amax);
    CHECK(r.amax == qr.amax);
}

TEST_CASE("the promotion interval: any value on the host, every result within its bound") {
    worst_ratio w;
    for (int P : {1, 16, 32, 48, 64, 128, 256, 100000}) {
        gemm_options opt;
        opt.promotion_interval = P;
        check_pair<recipes::tensorwise_e4m3, recipes::tensorwise_e4m3>(21, 23, 777, 10 + P, w, opt);
        check_pair<recipes::blockwise_1x128, recipes::blockwise_128x128>(21, 23, 777, 20 + P, w, opt);
    }
    MESSAGE("promotion intervals: worst |error| / bound = " << w.ratio);
    CHECK(detail::gemm_segment(128, 128, 128, 1000) == 128);
    CHECK(detail::gemm_segment(128, 32, 32, 1000) == 32);
    CHECK(detail::gemm_segment(128, 1000, 1000, 1000) == 128);  // per-tensor: blocks span K
    CHECK(detail::gemm_segment(100000, 1000, 1000, 1000) == 1000);
    CHECK(detail::gemm_segment(48, 128, 128, 1000) == 16);
}

// A software model of the accumulator the tensor-core bound assumes: each step of 32 products is
// added to the running value exactly and the result truncated toward zero to 13 fraction bits
// (e8m13). Promotion every L elements then adds the partial into a float accumulator.
double truncate13(double v) {
    if (v == 0) return 0;
    int e;
    std::frexp(v, &e);  // v = f * 2^e, 0.5 <= |f| < 1: 14 significant bits = 13 fraction bits
    const double q = std::ldexp(1.0, e - 14);
    return std::trunc(v / q) * q;
}

TEST_CASE("a truncating 13-bit accumulator model stays within the tensor-core bound; promotion bounds its error") {
    auto g = octet_test::rng(11);
    const std::size_t M = 24, N = 24, K = 4096;
    const auto qa = quantized<recipes::blockwise_1x128>(octet_test::with_edge_cases(g, M * K), M, K);
    const auto qb = quantized<recipes::blockwise_128x128>(octet_test::with_edge_cases(g, N * K), N, K);
    const auto ref = reference::gemm(qa.cref(), qb.cref());
    const auto ca = qa.cref();
    const auto cb = qb.cref();
    double mean_err[2] = {0, 0};
    const std::size_t Ls[2] = {128, K};
    for (int v = 0; v < 2; ++v) {
        const std::size_t L = Ls[v];
        gemm_options opt;
        opt.promotion_interval = static_cast<int>(L);
        // The L = K model keeps the 1x128 scales (it models "scale inside the MMA"): products use
        // dequantized values directly so that only the accumulator differs between the two runs.
        gemm_numerics nm =
            gemm_numerics_of<recipes::tensorwise_e4m3, recipes::tensorwise_e4m3>(gemm_backend::sm89_mma, K, opt);
        for (std::size_t i = 0; i < M; ++i)
            for (std::size_t j = 0; j < N; ++j) {
                float acc = 0.0f;
                for (std::size_t k0 = 0; k0 < K; k0 += L) {
                    double part = 0.0;
                    for (std::size_t s = k0; s < std::min(K, k0 + L); s += 32) {
                        double step = part;
                        for (std::size_t k = s; k < std::min(K, s + 32); ++k)
                            step += static_cast<double>(ca.value(i, k)) * cb.value(j, k);
                        part = truncate13(step);
                    }
                    acc += static_cast<float>(part);
                }
                const double T = ref.abs_products[i * N + j];
                const double err = std::fabs(acc - ref.product[i * N + j]);
                CHECK(err <= nm.accumulation * T + std::ldexp(T, -22));
                mean_err[v] += err / T;
            }
        mean_err[v] /= static_cast<double>(M * N);
    }
    MESSAGE("13-bit truncating accumulator model, K = 4096: mean |error| / T = "
            << mean_err[0] << " promoting every 128, " << mean_err[1] << " without promotion");
    CHECK(mean_err[1] > 2 * mean_err[0]);
}

TEST_CASE("backend support is stated, with the backends that would serve a pair") {
    using R1 = recipes::blockwise_1x128;
    using R2 = recipes::blockwise_128x128;
    CHECK(gemm_backend_support<R1, R2>(gemm_backend::sm90_wgmma, 7168).empty());
    CHECK(gemm_backend_support<R1, R2>(gemm_backend::cublaslt, 7168).empty());
    CHECK(gemm_backend_support<R1, R2>(gemm_backend::sm89_mma, 7168).empty());
    CHECK(gemm_backend_support<recipes::mxfp8_e4m3, recipes::mxfp8_e4m3>(gemm_backend::sm90_wgmma, 4096)
              .find("float scales") != std::string::npos);
    CHECK(gemm_backend_support<recipes::mxfp8_e4m3, recipes::mxfp8_e4m3>(gemm_backend::sm89_mma, 4096).empty());
    CHECK(gemm_backend_support<recipes::nvfp4, recipes::nvfp4>(gemm_backend::sm90_wgmma, 4096).find("E4M3/E5M2") !=
          std::string::npos);
    CHECK(gemm_backend_support<recipes::nvfp4, recipes::nvfp4>(gemm_backend::cublaslt, 4096).empty());
    CHECK(gemm_backend_support<R2, R2>(gemm_backend::cublaslt, 4096).find("1x128 x 128x128") != std::string::npos);
    CHECK(gemm_backend_support<recipes::tensorwise_e5m2, recipes::tensorwise_e5m2>(gemm_backend::cublaslt, 4096)
              .find("E5M2 x E5M2") != std::string::npos);
    gemm_options p64;
    p64.promotion_interval = 64;
    CHECK(gemm_backend_support<R1, R2>(gemm_backend::sm90_wgmma, 4096, p64).find("multiple of 128") !=
          std::string::npos);
    CHECK(gemm_backend_support<R1, R2>(gemm_backend::sm89_mma, 4096, p64).empty());
    CHECK(gemm_backends_serving<recipes::mxfp8_e4m3, recipes::mxfp8_e4m3>(4096, {}) == "host, sm89_mma");
    CHECK(gemm_backends_serving<R1, R2>(4096, {}) == "host, sm89_mma, sm90_wgmma, cublaslt");
    CHECK(gemm_backends_serving<recipes::mxfp4, recipes::mxfp4>(4096, {}) == "host");
    CHECK(recipe_description<R1>() == "e4m3, 1x128 blocks, f32 scales");
    CHECK(recipe_description<recipes::mxfp8_e5m2>() == "e5m2, 1x32 blocks, ue8m0 scales");
}

TEST_CASE("bad arguments raise octet::error naming the argument") {
    using R = recipes::blockwise_1x128;
    quantized_tensor<R> a(8, 256), b(16, 256), b_short(16, 128);
    std::vector<float> d(8 * 16), c(8 * 16), bias(15);
    const matrix_ref<float> D(d.data(), 8, 16);
    CHECK_THROWS_WITH_AS(scaled_gemm(on_host(), a.cref(), b_short.cref(), D),
                         doctest::Contains("argument 'B' has K = 128"), octet::error);
    CHECK_THROWS_WITH_AS(scaled_gemm(on_host(), a.cref(), b.cref(), matrix_ref<float>(d.data(), 16, 8)),
                         doctest::Contains("argument 'D'"), octet::error);
    gemm_options opt;
    opt.bias = as_cspan(bias);
    CHECK_THROWS_WITH_AS(scaled_gemm(on_host(), a.cref(), b.cref(), D, opt),
                         doctest::Contains("argument 'options.bias'"), octet::error);
    opt = {};
    opt.beta = 1.0f;
    CHECK_THROWS_WITH_AS(scaled_gemm(on_host(), a.cref(), b.cref(), D, opt),
                         doctest::Contains("argument 'options.beta'"), octet::error);
    opt = {};
    opt.promotion_interval = 0;
    CHECK_THROWS_WITH_AS(scaled_gemm(on_host(), a.cref(), b.cref(), D, opt),
                         doctest::Contains("argument 'options.promotion_interval'"), octet::error);
    opt = {};
    opt.backend = gemm_backend::sm90_wgmma;
    CHECK_THROWS_WITH_AS(scaled_gemm(on_host(), a.cref(), b.cref(), D, opt), doctest::Contains("on_stream"),
                         octet::error);
    CHECK_THROWS_WITH_AS(scaled_gemm(on_host(), a.cref(), b.cref(), matrix_ref<const float>(c.data(), 8, 8), D),
                         doctest::Contains("argument 'C'"), octet::error);
    CHECK_THROWS_WITH_AS(scaled_gemm(on_host(), a.cref(), b.cref(), matrix_ref<float>(d.data(), 8, 16, 4)),
                         doctest::Contains("has ld 4"), octet::error);

    // A scale layout that does not fit the recipe: a 1x128 view whose grid claims 128-row blocks.
    quant_layout wrong = a.layout();
    wrong.block_rows = 128;
    wrong.scale_rows = 1;
    const quantized_cref<R> bad_a(a.cref().data, a.cref().scales, wrong);
    CHECK_THROWS_WITH_AS(scaled_gemm(on_host(), bad_a, b.cref(), D),
                         doctest::Contains("argument 'A' has a scale grid that does not fit"), octet::error);
    // A view with a null scale pointer.
    const quantized_cref<R> null_b(b.cref().data, nullptr, b.layout());
    CHECK_THROWS_WITH_AS(scaled_gemm(on_host(), a.cref(), null_b, D),
                         doctest::Contains("argument 'B' has a null scales pointer"), octet::error);

    // A quantized D is checked with everything else, before the GEMM runs: under octet::scaled_gemm,
    // not octet::quantize (which used to see it only after the product was computed).
    quantized_tensor<R> d_wrong(16, 8), d_ok(8, 16);
    CHECK_THROWS_WITH_AS(scaled_gemm(on_host(), a.cref(), b.cref(), d_wrong.ref()),
                         doctest::Contains("octet::scaled_gemm: argument 'D' has shape 16 x 8 but must be 8 x 16"),
                         octet::error);
    CHECK_THROWS_WITH_AS(scaled_gemm(on_host(), a.cref(), b.cref(), quantized_ref<R>{}),
                         doctest::Contains("octet::scaled_gemm: argument 'D' is absent"), octet::error);
    auto d_null = d_ok.ref();
    d_null.data = nullptr;
    CHECK_THROWS_WITH_AS(scaled_gemm(on_host(), a.cref(), b.cref(), d_null),
                         doctest::Contains("octet::scaled_gemm: argument 'D' has a null data"), octet::error);
    // and before D: A and B, the options and the backend
    CHECK_THROWS_WITH_AS(scaled_gemm(on_host(), a.cref(), b_short.cref(), d_wrong.ref()),
                         doctest::Contains("argument 'B' has K = 128"), octet::error);
    opt = {};
    opt.backend = gemm_backend::sm89_mma;
    CHECK_THROWS_WITH_AS(scaled_gemm(on_host(), a.cref(), b.cref(), d_ok.ref(), opt), doctest::Contains("on_stream"),
                         octet::error);
    opt = {};
    opt.beta = 0.5f;
    CHECK_THROWS_WITH_AS(scaled_gemm(on_host(), a.cref(), b.cref(), d_ok.ref(), opt),
                         doctest::Contains("argument 'options.beta'"), octet::error);
    CHECK_NOTHROW(scaled_gemm(on_host(), a.cref(), b.cref(), d_ok.ref()));

    // Empty problems are fine: M = 0 writes nothing, K = 0 gives beta C + bias.
    quantized_tensor<R> a0(0, 256), ak0(8, 0), bk0(16, 0);
    CHECK_NOTHROW(scaled_gemm(on_host(), a0.cref(), b.cref(), matrix_ref<float>(nullptr, 0, 16)));
    std::vector<float> bias16(16, 2.0f);
    opt = {};
    opt.bias = as_cspan(bias16);
    scaled_gemm(on_host(), ak0.cref(), bk0.cref(), D, opt);
    for (float v : d) CHECK(v == 2.0f);
}

}  // namespace gemm_host_test
