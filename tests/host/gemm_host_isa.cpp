// The host scaled GEMM's instruction-set variants (portable, AVX2+FMA, AVX-512; those this CPU
// runs) against the contract's own sequence of float operations, written out as scalar code here:
// each segment's code products summed in k order, then acc += p * (sA * sB) rounded twice, then
// D = alpha * acc (+ beta * C, + bias), each operation rounded. Every variant must give exactly
// those bits (so also the same bits as each other) on 1 and 3 threads, on ragged shapes that leave
// partial register tiles, partial tasks and a short last segment, for several scaling pairs and
// promotion intervals (1, 16, 48, 128, and one above K), and K = 0; with K decoded whole and in
// blocks (long K).
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "octet/gemm/scaled_gemm.hpp"
#include "support/isa.hpp"
#include "support/random.hpp"

namespace gemm_host_isa_test {
using namespace octet;

template <class R>
quantized_tensor<R> quantized(const std::vector<float>& x, std::size_t rows, std::size_t cols) {
    quantized_tensor<R> q(rows, cols);
    quantize<R>(on_host(), matrix_ref<const float>(x.data(), rows, cols), q.ref());
    return q;
}

/// The contract's accumulation, one element at a time in scalar float.
template <class RA, class RB>
std::vector<float> contract_model(const quantized_cref<RA>& A, const quantized_cref<RB>& B, const float* C,
                                  const gemm_options& opt) {
    const std::size_t M = A.rows(), N = B.rows(), K = A.cols();
    const std::size_t g = detail::gemm_segment(static_cast<std::size_t>(opt.promotion_interval), A.layout.block_cols,
                                               B.layout.block_cols, K);
    std::vector<float> d(M * N);
    for (std::size_t i = 0; i < M; ++i)
        for (std::size_t j = 0; j < N; ++j) {
            float acc = 0.0f;
            for (std::size_t k0 = 0; k0 < K; k0 += g) {
                float p = 0.0f;
                for (std::size_t k = k0; k < std::min(K, k0 + g); ++k)
                    p += decode<typename RA::format>(A.code(i, k)) * decode<typename RB::format>(B.code(j, k));
                const float scale = A.scale(i / A.layout.block_rows, k0 / A.layout.block_cols) *
                                    B.scale(j / B.layout.block_rows, k0 / B.layout.block_cols);
                volatile float t = p * scale;  // rounded on its own, as the contract says
                acc += t;
            }
            volatile float v = opt.alpha * acc;
            if (C) {
                volatile float t = opt.beta * C[i * N + j];
                v = v + t;
            }
            if (!opt.bias.empty()) v = v + opt.bias[j];
            d[i * N + j] = v;
        }
    return d;
}

template <class RA, class RB>
void check_variants(std::size_t M, std::size_t N, std::size_t K, int promotion, std::uint64_t salt,
                    bool with_c_and_bias = false) {
    INFO("A: " << recipe_description<RA>() << ", B: " << recipe_description<RB>() << ", M=" << M << " N=" << N
               << " K=" << K << " P=" << promotion << " seed=" << octet_test::run_seed());
    auto g = octet_test::rng(salt);
    const auto qa = quantized<RA>(octet_test::with_edge_cases(g, M * K, 2.0f), M, K);
    const auto qb = quantized<RB>(octet_test::with_edge_cases(g, N * K, 0.5f), N, K);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> c(M * N), bias(N);
    for (auto& v : c) v = nd(g);
    for (auto& v : bias) v = nd(g);
    gemm_options opt;
    opt.promotion_interval = promotion;
    opt.alpha = -0.75f;
    if (with_c_and_bias) {
        opt.beta = 1.25f;
        opt.bias = as_cspan(bias);
    }
    const matrix_ref<const float> C(c.data(), M, N);
    const std::vector<float> expect = contract_model(qa.cref(), qb.cref(), with_c_and_bias ? c.data() : nullptr, opt);
    for (detail::simd_isa isa : octet_test::runnable_isas()) {
        if (!detail::host_gemm_isa_supported(isa)) continue;
        INFO("variant " << std::string(octet_test::isa_name(isa)));
        for (int threads : {1, 3})
            for (auto blocks : {detail::host_gemm_k_blocks::smaller, detail::host_gemm_k_blocks::whole,
                                detail::host_gemm_k_blocks::blocks}) {
                std::vector<float> d(M * N, NAN);  // poison: every element must be written
                const matrix_ref<float> D(d.data(), M, N);
                detail::host_scaled_gemm<RA, RB, float, float>(on_host(threads), qa.cref(), qb.cref(),
                                                               with_c_and_bias ? &C : nullptr, D, opt, isa, blocks);
                std::size_t differ = 0, first = 0;
                for (std::size_t e = 0; e < d.size(); ++e)
                    if (std::memcmp(&d[e], &expect[e], sizeof(float)) != 0 && differ++ == 0) first = e;
                CHECK_MESSAGE(differ == 0, threads << " threads, K blocks " << static_cast<int>(blocks) << ": "
                                                   << differ << " of " << d.size() << " elements differ, first D("
                                                   << first / N << "," << first % N << ") = " << d[first]
                                                   << ", contract " << expect[first]);
            }
    }
}

TEST_CASE("every instruction-set variant gives the contract's bits, on every thread count") {
    std::string ran;
    for (detail::simd_isa isa : octet_test::runnable_isas())
        if (detail::host_gemm_isa_supported(isa)) ran += std::string(" ") + octet_test::isa_name(isa);
    MESSAGE("variants run on this CPU:" << ran << " (the library's choice: "
                                        << std::string(octet_test::isa_name(detail::host_gemm_isa())) << ")");
    std::uint64_t salt = 1;
    // Ragged against MR = 6, NR = 8/16/32 and 96 x 128 tasks; K with a short last segment.
    for (int P : {128, 16, 48}) {
        check_variants<recipes::blockwise_1x128, recipes::blockwise_128x128>(103, 77, 300, P, salt++);
        check_variants<recipes::tensorwise_e4m3, recipes::tensorwise_e5m2>(5, 150, 129, P, salt++);
    }
    check_variants<recipes::rowwise_e4m3, recipes::rowwise_e4m3>(97, 33, 40, 1, salt++);
    check_variants<recipes::tensorwise_e4m3, recipes::tensorwise_e4m3>(64, 200, 513, 4096, salt++);  // one segment
    check_variants<recipes::mxfp8_e4m3, recipes::mxfp8_e4m3>(13, 40, 96, 128, salt++);
    check_variants<recipes::nvfp4, recipes::nvfp4>(20, 35, 160, 128, salt++);
    check_variants<recipes::mxfp6_e2m3, recipes::mxfp6_e3m2>(7, 9, 64, 128, salt++);
    check_variants<recipes::blockwise_1x128, recipes::blockwise_128x128>(1, 1, 1, 128, salt++);
    check_variants<recipes::blockwise_1x128, recipes::blockwise_128x128>(50, 70, 260, 128, salt++, true);
    check_variants<recipes::blockwise_1x128, recipes::blockwise_128x128>(3, 5, 0, 128, salt++);  // K = 0
    // Long K (a weight gradient's tokens), decoded in blocks of 128 k: several blocks, a short last
    // block and segment, segments of 16 and 48 that do not divide 128.
    check_variants<recipes::blockwise_1x128, recipes::blockwise_128x128>(40, 70, 1500, 128, salt++, true);
    check_variants<recipes::mxfp8_e4m3, recipes::mxfp8_e4m3>(33, 17, 1100, 16, salt++);
    check_variants<recipes::tensorwise_e4m3, recipes::tensorwise_e5m2>(9, 130, 1201, 48, salt++);
}

TEST_CASE("a long K is decoded in blocks: scratch near M x N floats, not (M + N) x K") {
    using R = recipes::mxfp8_e4m3;
    const std::size_t M = 256, N = 128, K = 8192;  // a weight gradient over 8192 tokens
    const std::size_t whole = (M + N) * K * sizeof(float);
    const std::size_t query = detail::host_gemm_scratch_bytes(on_host(2), M, N, K, 32, 32, 128);
    MESSAGE("scratch for " << M << " x " << N << " x " << K << ": " << query << " bytes (the whole K decoded: " << whole
                           << ")");
    CHECK(query < whole / 4);
    quantized_tensor<R> a(M, K), b(N, K);
    std::vector<float> d(M * N);
    CHECK(query == scaled_gemm_scratch_bytes(on_host(2), a.ref(), b.ref(), matrix_ref<float>(d.data(), M, N)));
}

}  // namespace gemm_host_isa_test
