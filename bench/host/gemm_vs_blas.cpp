// octet's host scaled GEMM (FP8 E4M3 operands, float D) against OpenBLAS's float32 sgemm on the
// same numbers, shapes and thread count, in one binary (issue 12, "Speed of the CPU path").
//
//   ./bench_gemm_vs_blas --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// Each iteration times a batch of octet calls and then a batch of sgemm calls (alternating, so a
// loaded machine slows both alike); the reported time is octet's per call. Counters: GFLOP/s
// (2 M N K per call) of octet and of OpenBLAS, and vs_OpenBLAS = OpenBLAS time / octet time (above
// 1: octet is faster). sgemm multiplies the dequantized operands as float32 (row-major A M x K,
// B N x K, D = A B^T); octet decodes the codes itself, which its time includes. Threads: octet
// runs on a caller-owned octet::thread_pool of that size (on_host(1) for one), OpenBLAS with
// openblas_set_num_threads. Before timing, both results are checked against each other.
// Built also as bench_gemm_vs_blas_default_flags (no -march=native: octet's runtime ISA dispatch);
// the *_variant rows force each instruction-set variant (isa: 0 portable, 1 AVX2+FMA, 2 AVX-512).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "octet/gemm/scaled_gemm.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

template <class R>
octet::quantized_tensor<R> random_operand(std::size_t rows, std::size_t cols, unsigned seed) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> x(rows * cols);
    for (auto& v : x) v = d(g);
    octet::quantized_tensor<R> q(rows, cols);
    octet::quantize<R>(octet::on_host(), octet::matrix_ref<const float>(x.data(), rows, cols), q.ref());
    return q;
}

template <class R>
std::vector<float> dequantized(const octet::quantized_tensor<R>& q) {
    const std::size_t rows = q.layout().rows, cols = q.layout().cols;
    std::vector<float> x(rows * cols);
    octet::dequantize(octet::on_host(), q.cref(), octet::matrix_ref<float>(x.data(), rows, cols));
    return x;
}

double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// args: M, N, K, threads. `variant`: octet's instruction-set variant to force (0 portable,
/// 1 AVX2+FMA, 2 AVX-512), or -1 for scaled_gemm itself (the variant the library picks).
template <class RA, class RB>
void run_vs_blas(benchmark::State& state, int variant) {
    const std::size_t M = static_cast<std::size_t>(state.range(0)), N = static_cast<std::size_t>(state.range(1)),
                      K = static_cast<std::size_t>(state.range(2));
    const int threads = static_cast<int>(state.range(3));
    using octet::detail::simd_isa;
    const simd_isa isa = variant >= 0 ? static_cast<simd_isa>(variant) : octet::detail::host_gemm_isa();
    if (!octet::detail::host_gemm_isa_supported(isa)) {
        state.SkipWithError("this CPU (or build) lacks that instruction-set variant");
        return;
    }
    const auto qa = random_operand<RA>(M, K, 1);
    const auto qb = random_operand<RB>(N, K, 2);
    const std::vector<float> a = dequantized(qa), b = dequantized(qb);
    std::vector<float> d(M * N, NAN), d_blas(M * N, NAN);

    std::unique_ptr<octet::thread_pool> pool;
    if (threads > 1) pool = std::make_unique<octet::thread_pool>(threads);
    const octet::host_executor ex = pool ? octet::on_host(*pool) : octet::on_host(1);
    openblas_set_num_threads(threads);
    const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
    auto run_octet = [&] {
        if (variant >= 0)  // the same call as scaled_gemm's, with the variant chosen
            octet::detail::host_scaled_gemm<RA, RB, float, float>(ex, qa.cref(), qb.cref(), nullptr,
                                                                  octet::matrix_ref<float>(d.data(), M, N), {}, isa);
        else
            octet::scaled_gemm(ex, qa.cref(), qb.cref(), octet::matrix_ref<float>(d.data(), M, N));
    };
    auto run_blas = [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f,
                    d_blas.data(), n);
    };

    // Both must compute the same product: within octet's bound plus float32 summation's K u.
    run_octet();
    run_blas();
    const double c = octet::gemm_numerics_of<RA, RB>(octet::gemm_backend::host, K).accumulation +
                     2.0 * static_cast<double>(K) * std::ldexp(1.0, -24);
    for (std::size_t i = 0; i < M; ++i)
        for (std::size_t j = 0; j < N; ++j) {
            double T = 0.0;
            for (std::size_t kk = 0; kk < K; ++kk) T += std::fabs(static_cast<double>(a[i * K + kk]) * b[j * K + kk]);
            if (!(std::fabs(static_cast<double>(d[i * N + j]) - d_blas[i * N + j]) <= c * T)) {
                state.SkipWithError(
                    ("octet and sgemm disagree at D(" + std::to_string(i) + "," + std::to_string(j) + ")").c_str());
                return;
            }
        }

    // A batch of calls of about 100 MFLOP, so that each timed span is a few milliseconds.
    const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
    const int batch = std::max(1, static_cast<int>(1e8 / flops));
    double t_octet = 0.0, t_blas = 0.0;
    for (auto _ : state) {
        auto t0 = clock_type::now();
        for (int r = 0; r < batch; ++r) run_octet();
        const double s_octet = seconds_since(t0);
        t0 = clock_type::now();
        for (int r = 0; r < batch; ++r) run_blas();
        const double s_blas = seconds_since(t0);
        benchmark::DoNotOptimize(d.data());
        benchmark::DoNotOptimize(d_blas.data());
        state.SetIterationTime(s_octet / batch);
        t_octet += s_octet;
        t_blas += s_blas;
    }
    const double calls = static_cast<double>(state.iterations()) * batch;
    state.counters["GFLOP/s"] = flops * calls / t_octet * 1e-9;
    state.counters["OpenBLAS_GFLOP/s"] = flops * calls / t_blas * 1e-9;
    state.counters["vs_OpenBLAS"] = t_blas / t_octet;
    state.counters["OpenBLAS_ms"] = t_blas / calls * 1e3;
}

template <class RA, class RB>
void gemm_vs_blas(benchmark::State& state) {
    run_vs_blas<RA, RB>(state, -1);
}
/// args: M, N, K, threads, variant.
template <class RA, class RB>
void gemm_vs_blas_variant(benchmark::State& state) {
    run_vs_blas<RA, RB>(state, static_cast<int>(state.range(4)));
}

/// 512^3 and 1024^3, and the GEMMs of a small transformer's training step (d_model 128 and 256,
/// 1024 tokens, MLP 4 d): forward Q/K/V (N = 3 d), attention output (d x d), MLP up (4 d x d)
/// and down (d x 4 d, also the up layer's data gradient), and a weight gradient (M = 4 d
/// outputs, K = 1024 tokens). Each on 1 and 2 threads.
void shapes(benchmark::internal::Benchmark* b) {
    const long cases[][3] = {{512, 512, 512},   {1024, 1024, 1024}, {1024, 384, 128}, {1024, 128, 128},
                             {1024, 512, 128},  {1024, 128, 512},   {512, 128, 1024}, {1024, 768, 256},
                             {1024, 1024, 256}, {1024, 256, 1024}};
    for (const auto& c : cases)
        for (long threads : {1, 2}) b->Args({c[0], c[1], c[2], threads});
    b->ArgNames({"M", "N", "K", "threads"})->UseManualTime()->Unit(benchmark::kMillisecond);
}

/// Each instruction-set variant of octet's GEMM on one thread.
void variants(benchmark::internal::Benchmark* b) {
    for (long isa : {0, 1, 2}) {
        b->Args({512, 512, 512, 1, isa});
        b->Args({1024, 384, 128, 1, isa});
    }
    b->ArgNames({"M", "N", "K", "threads", "isa"})->UseManualTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

using namespace octet::recipes;
BENCHMARK_TEMPLATE(gemm_vs_blas, tensorwise_e4m3, tensorwise_e4m3)->Name("e4m3_tensor_x_tensor")->Apply(shapes);
BENCHMARK_TEMPLATE(gemm_vs_blas, blockwise_1x128, blockwise_128x128)->Name("e4m3_1x128_x_128x128")->Apply(shapes);
BENCHMARK_TEMPLATE(gemm_vs_blas_variant, blockwise_1x128, blockwise_128x128)
    ->Name("e4m3_1x128_x_128x128_variant")
    ->Apply(variants);

BENCHMARK_MAIN();
