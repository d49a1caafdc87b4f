// octet-bench: libs=cublasLt
// examples/03_scaled_gemm: quantize an activation and a weight matrix under several recipes,
// multiply them with octet::scaled_gemm, and compare with float64.
//
// Run:  build/default/examples/example_03_scaled_gemm        (built when CUDA is found; the GPU is optional)
//
// The activation (M x K) has a heavy tail and a few outlier channels, as LLM activations do; the
// weight is N x K (the column-wise copy of a K x N weight). For each recipe pair the table shows
//   * quantization + GEMM error: relative Frobenius error of D against the float64 product of the
//     unquantized matrices (what the recipe costs), and
//   * GEMM arithmetic error: the largest |D - exact| / T against the float64 product of the
//     dequantized operands, with T = sum_k |a_ik b_jk| (what octet's accumulation costs; the
//     documented bound for the host is gamma_(L+S), about 1e-5 here).
// On a GPU (sm_89+), the same product runs on the CUDA backend octet picks, is compared with the
// host result, and is timed. The stream executor carries a cuBLASLt (octet::with_cublaslt), so NVFP4,
// which has no tensor-core kernel of octet's own on Hopper or Ada, runs there too.
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <vector>

#include "octet/cuda/buffer.cuh"
#include "octet/gemm/cublaslt.cuh"
#include "octet/reference/gemm.hpp"

namespace {

constexpr std::size_t M = 256, N = 512, K = 2048;

template <class R>
octet::quantized_tensor<R> quantized(const std::vector<float>& x, std::size_t rows, std::size_t cols) {
    octet::quantized_tensor<R> q(rows, cols);
    octet::quantize<R>(octet::on_host(), octet::matrix_ref<const float>(x.data(), rows, cols), q.ref());
    return q;
}

template <class R>
struct device_copy {
    octet::quant_layout layout;
    octet::cuda::device_buffer<std::uint8_t> data, scales;
    octet::cuda::device_buffer<float> ts;
    explicit device_copy(octet::quantized_tensor<R>& h)
        : layout(h.layout()), data(h.data()), scales(h.scales()), ts(std::vector<float>{h.tensor_scale()}) {}
    octet::quantized_cref<R> cref() const {
        return octet::quantized_cref<R>(data.data(), scales.data(), layout, ts.data());
    }
};

bool gpu_present() {
    return octet::cuda::compute_capability() >= 89;
}  // 0 without a device

template <class RA, class RB>
void run(const char* name, const std::vector<float>& a, const std::vector<float>& w, const std::vector<double>& exact,
         const octet::stream_executor& ex) {
    using namespace octet;
    auto qa = quantized<RA>(a, M, K);
    auto qw = quantized<RB>(w, N, K);
    std::vector<float> d(M * N);
    const auto t0 = std::chrono::steady_clock::now();
    scaled_gemm(on_host(), qa.cref(), qw.cref(), matrix_ref<float>(d.data(), M, N));
    const double host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    double num = 0, den = 0;
    for (std::size_t i = 0; i < M * N; ++i) {
        num += (d[i] - exact[i]) * (d[i] - exact[i]);
        den += exact[i] * exact[i];
    }
    const auto ref = reference::gemm(qa.cref(), qw.cref());
    double arith = 0;
    for (std::size_t i = 0; i < M * N; ++i)
        if (ref.abs_products[i] > 0) arith = std::max(arith, std::fabs(d[i] - ref.product[i]) / ref.abs_products[i]);
    std::printf("  %-34s %12.3e %14.3e %10.1f ms", name, std::sqrt(num / den), arith, host_ms);

    if (gpu_present()) {
        try {
            const device_copy<RA> da(qa);
            const device_copy<RB> dw(qw);
            cuda::device_buffer<float> dd(M * N);
            const gemm_result r = scaled_gemm(ex, da.cref(), dw.cref(), matrix_ref<float>(dd.data(), M, N));
            OCTET_CUDA_CHECK(cudaDeviceSynchronize());
            const auto g = dd.download();
            double diff = 0;
            for (std::size_t i = 0; i < M * N; ++i)
                diff = std::max(diff, std::fabs(static_cast<double>(g[i]) - d[i]) / ref.abs_products[i]);
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            cudaEventRecord(e0);
            for (int i = 0; i < 20; ++i) scaled_gemm(ex, da.cref(), dw.cref(), matrix_ref<float>(dd.data(), M, N));
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            std::printf("   %-10s |GPU-host|/T %.1e  %.1f us (%.1f TFLOPS)", backend_name(r.backend), diff,
                        1000.0 * ms / 20, 2.0 * M * N * K / (ms / 20 * 1e9));
        } catch (const octet::error& e) {
            std::printf("   GPU: %s", e.what());
        }
    }
    std::printf("\n");
}

}  // namespace

int main() {
    // Activation: Student-t (3 degrees of freedom) with 4 outlier channels 50x larger.
    std::mt19937_64 g(2026);
    std::student_t_distribution<float> heavy(3.0f);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    std::vector<float> a(M * K), w(N * K);
    for (auto& v : a) v = heavy(g);
    for (std::size_t i = 0; i < M; ++i)
        for (std::size_t k : {7u, 300u, 1200u, 2000u}) a[i * K + k] *= 50.0f;
    for (auto& v : w) v = normal(g);

    std::vector<double> exact(M * N, 0.0);
    for (std::size_t i = 0; i < M; ++i)
        for (std::size_t j = 0; j < N; ++j) {
            double s = 0;
            for (std::size_t k = 0; k < K; ++k) s += static_cast<double>(a[i * K + k]) * w[j * K + k];
            exact[i * N + j] = s;
        }

    std::printf("D = A W^T with A %zu x %zu (heavy tail, outlier channels), W %zu x %zu%s\n", M, K, N, K,
                gpu_present() ? "" : "  (no sm_89+ GPU: host only)");
    std::printf("  %-34s %12s %14s %13s\n", "recipes (A x W)", "quant+GEMM", "GEMM arith/T", "host time");
    // The GPU runs borrow a cuBLASLt handle and workspace for the pairs octet's kernels do not serve.
    std::optional<octet::cuda::cublaslt_context> lt;
    octet::stream_executor ex = octet::on_stream();
    if (gpu_present()) {
        lt.emplace();
        ex = octet::with_cublaslt(ex, *lt);
    }
    using namespace octet::recipes;
    run<tensorwise_e4m3, tensorwise_e4m3>("per-tensor E4M3 x per-tensor E4M3", a, w, exact, ex);
    run<blockwise_1x128, blockwise_128x128>("1x128 E4M3 x 128x128 E4M3", a, w, exact, ex);
    run<mxfp8_e4m3, mxfp8_e4m3>("MXFP8 x MXFP8", a, w, exact, ex);
    run<nvfp4, nvfp4>("NVFP4 x NVFP4", a, w, exact, ex);
    std::printf(
        "The first column is what each recipe's rounding costs on this data; the second is octet's own\n"
        "arithmetic, which the contract bounds by gamma_(L+S) * T on the host (about 1e-5 here) and by\n"
        "ceil(L/32) * 2^-12 * T on tensor cores (promotion every L = 128 keeps that near 1e-3).\n");
    return 0;
}
