// octet-bench: libs=cublasLt
//
// GPU benchmark: the m-grouped scaled FP8 GEMM of a mixture-of-experts layer (TFLOPS = 2 sum(M_g) N K /
// time) on Hopper, 1x128 (tokens) x 128x128 (experts' weights) E4M3, bf16 D, for DeepGEMM's MoE shapes:
// m-grouped contiguous, 4 and 8 experts of ~8192 tokens each, (N, K) = (4096, 7168) and (7168, 2048);
// each with equal groups (8192 tokens) and with ragged ones (sizes around 8192, not multiples of 128).
//   octet grouped         grouped_scaled_gemm(on_stream): one persistent sm90_wgmma kernel over all groups
//   octet dense loop      scaled_gemm(on_stream) once per expert (sm90_wgmma, its automatic plan)
//   cuBLASLt dense loop   scaled_gemm through octet's cublaslt backend once per expert (cuBLASLt's
//                         VEC128_32F x BLK128x128_32F matmul, plus octet's re-layout of the 128x128 scale
//                         grid per call): CUDA 13's cuBLASLt has no grouped FP8 GEMM (cublasLt.h declares
//                         no grouped matmul; cuBLAS's cublasGemmGroupedBatchedEx takes no FP8 scales)
// And the k-grouped GEMM (the experts' weight gradients, 1x128 x 1x128 column-wise copies, float dW,
// N = 4096, K = 7168, ~8192 ragged tokens per expert) against a loop of dense launches.
// Every variant is captured in a CUDA graph of 5 calls (host overhead excluded alike; the median of 10
// launches). Each shape also reports the largest difference between the grouped and the dense loop's D
// (a sanity check: the tests check correctness; both run the same mainloop, so 0 is expected).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu_bench.cuh"
#include "octet/gemm/cublaslt.cuh"
#include "octet/gemm/grouped_gemm.cuh"

namespace {

using RA = octet::recipes::blockwise_1x128;
using RB = octet::recipes::blockwise_128x128;

__device__ __forceinline__ std::uint32_t mix32(std::uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}
/// Random E4M3 codes (no NaN) and positive scales in [0.25, 1.25).
__global__ void random_codes(std::uint8_t* p, std::size_t n, std::uint32_t seed) {
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        std::uint8_t c = static_cast<std::uint8_t>(mix32(static_cast<std::uint32_t>(i) ^ seed));
        if ((c & 0x7F) == 0x7F) c ^= 1;
        p[i] = c;
    }
}
__global__ void random_scales(float* p, std::size_t n, std::uint32_t seed) {
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
        p[i] =
            0.25f + static_cast<float>(mix32(static_cast<std::uint32_t>(i) * 2654435761U ^ seed) & 0xFFFF) / 65536.0f;
}
/// out[0] = max |x - y| (infinity where either is NaN), as float bits.
__global__ void max_abs_diff(const octet::bf16* x, const octet::bf16* y, std::size_t n, unsigned* out) {
    float d = 0;
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const float a = octet::to_float(x[i]), b = octet::to_float(y[i]);
        const float e = fabsf(a - b);
        d = e == e ? fmaxf(d, e) : INFINITY;
    }
    atomicMax(out, __float_as_uint(d));
}

/// Milliseconds per call: `inner` calls captured in one CUDA graph, median of 10 launches.
double time_graph(cudaStream_t s, const std::function<void(cudaStream_t)>& fn, int inner = 5) {
    fn(s);
    OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    OCTET_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    try {
        for (int i = 0; i < inner; ++i) fn(s);
    } catch (...) {
        cudaStreamEndCapture(s, &graph);
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        throw;
    }
    OCTET_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    OCTET_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    OCTET_CUDA_CHECK(cudaGraphLaunch(exec, s));
    OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaEvent_t a, b;
    OCTET_CUDA_CHECK(cudaEventCreate(&a));
    OCTET_CUDA_CHECK(cudaEventCreate(&b));
    std::vector<float> times;
    for (int r = 0; r < 10; ++r) {
        OCTET_CUDA_CHECK(cudaEventRecord(a, s));
        OCTET_CUDA_CHECK(cudaGraphLaunch(exec, s));
        OCTET_CUDA_CHECK(cudaEventRecord(b, s));
        OCTET_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        OCTET_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        times.push_back(ms / inner);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

void run(std::size_t groups, std::size_t N, std::size_t K, bool ragged, cudaStream_t s) {
    using namespace octet;
    std::vector<std::size_t> sizes(groups, 8192);
    if (ragged)  // the same total, split unevenly and off the 128-row grid (a router's counts)
        for (std::size_t g = 0; g + 1 < groups; g += 2) {
            const std::size_t d = 1000 + 517 * g;
            sizes[g] += d;
            sizes[g + 1] -= d;
        }
    std::size_t M = 0;
    for (std::size_t v : sizes) M += v;
    const std::string bench = "grouped_gemm_g" + std::to_string(groups) + "_n" + std::to_string(N) + "_k" +
                              std::to_string(K) + (ragged ? "_ragged" : "");
    const double flops = 2.0 * static_cast<double>(M) * N * K;
    auto tflops = [&](double ms) { return flops / (ms * 1e9); };

    const grouped_layout la = make_grouped_layout<RA>(grouped_rows(span<const std::size_t>(sizes.data(), groups), K));
    const quant_layout lb = quant_layout_of<RB>::make(N, K);
    cuda::device_buffer<std::uint8_t> a(la.data_bytes), b(groups * lb.data_bytes);
    cuda::device_buffer<float> sa(la.scale_bytes / 4), sb(groups * lb.scale_bytes / 4);
    random_codes<<<1024, 256>>>(a.data(), a.size(), 1);
    random_codes<<<1024, 256>>>(b.data(), b.size(), 2);
    random_scales<<<256, 256>>>(sa.data(), sa.size(), 3);
    random_scales<<<256, 256>>>(sb.data(), sb.size(), 4);
    OCTET_CUDA_CHECK(cudaGetLastError());
    const grouped_quantized_cref<RA> A(a.data(), reinterpret_cast<const std::uint8_t*>(sa.data()), nullptr, la);
    std::vector<quantized_cref<RB>> B;
    for (std::size_t g = 0; g < groups; ++g)
        B.emplace_back(b.data() + g * lb.data_bytes,
                       reinterpret_cast<const std::uint8_t*>(sb.data()) + g * lb.scale_bytes, lb);
    const span<const quantized_cref<RB>> Bs(B.data(), B.size());
    cuda::device_buffer<bf16> d_grouped(M * N), d_loop(M * N);
    d_grouped.fill_bytes(0xFF);
    d_loop.fill_bytes(0xFF);
    const matrix_ref<bf16> Dg(d_grouped.data(), M, N), Dl(d_loop.data(), M, N);
    auto loop = [&](const stream_executor& ex, const gemm_options& o, const matrix_ref<bf16>& D) {
        std::size_t begin = 0;
        for (std::size_t g = 0; g < groups; ++g) {
            if (sizes[g]) scaled_gemm(ex, A.group(g), B[g], matrix_ref<bf16>(D.data + begin * N, sizes[g], N), o);
            begin += sizes[g];
        }
    };
    const std::string shape = std::to_string(groups) + " groups, M " + std::to_string(M);

    double ms_grouped = 0, ms_loop = 0;
    try {
        gemm_options o;
        o.backend = gemm_backend::sm90_wgmma;
        ms_grouped = time_graph(s, [&](cudaStream_t st) { grouped_scaled_gemm(on_stream(st), A, Bs, Dg, o); });
        octet_bench::result(bench, "octet_grouped_tflops", tflops(ms_grouped), "TFLOPS",
                            shape + ", one persistent sm90 kernel");
    } catch (const std::exception& e) {
        std::printf("octet grouped failed on %s: %s\n", bench.c_str(), e.what());
        octet_bench::result(bench, "octet_grouped_tflops", 0, "TFLOPS", "FAILED");
        cudaGetLastError();
    }
    try {
        gemm_options o;
        o.backend = gemm_backend::sm90_wgmma;
        ms_loop = time_graph(s, [&](cudaStream_t st) { loop(on_stream(st), o, Dl); });
        octet_bench::result(bench, "octet_dense_loop_tflops", tflops(ms_loop), "TFLOPS",
                            shape + ", one sm90 launch per expert (automatic plan)");
    } catch (const std::exception& e) {
        std::printf("octet dense loop failed on %s: %s\n", bench.c_str(), e.what());
        cudaGetLastError();
    }
    if (ms_grouped > 0 && ms_loop > 0) {
        octet_bench::result(bench, "grouped_vs_dense_loop", ms_loop / ms_grouped, "x", "speedup of one kernel");
        cuda::device_buffer<unsigned> diff(1);
        diff.fill_bytes(0);
        max_abs_diff<<<264, 256>>>(d_grouped.data(), d_loop.data(), M * N, diff.data());
        OCTET_CUDA_CHECK(cudaGetLastError());
        const unsigned bits = diff.download()[0];
        float v = 0;
        std::memcpy(&v, &bits, 4);
        octet_bench::result(bench, "grouped_vs_loop_max_abs_diff", v, "", "0 expected (same mainloop)");
    }
    try {
        cuda::cublaslt_context ctx;
        gemm_options o;
        o.backend = gemm_backend::cublaslt;
        cuda::device_buffer<bf16> d_lt(M * N);
        const double ms = time_graph(s, [&](cudaStream_t st) {
            loop(with_cublaslt(on_stream(st), ctx), o, matrix_ref<bf16>(d_lt.data(), M, N));
        });
        octet_bench::result(bench, "cublaslt_dense_loop_tflops", tflops(ms), "TFLOPS",
                            shape + ", cuBLASLt FP8 per expert (no grouped FP8 in CUDA 13's cuBLASLt)");
        if (ms_grouped > 0) octet_bench::result(bench, "grouped_vs_cublaslt_loop", ms / ms_grouped, "x", "");
    } catch (const std::exception& e) {
        std::printf("cuBLASLt loop failed on %s: %s\n", bench.c_str(), e.what());
        octet_bench::result(bench, "cublaslt_dense_loop_tflops", 0, "TFLOPS", "FAILED");
        cudaGetLastError();
    }
}

/// The k-grouped GEMM (weight gradients dW_e = dY_e^T X_e, float dW, 1x128 x 1x128 column-wise copies)
/// against a loop of dense launches: TFLOPS = 2 N K sum(k_g).
void run_k(std::size_t groups, std::size_t N, std::size_t K, cudaStream_t s) {
    using namespace octet;
    std::vector<std::size_t> sizes(groups, 8192);
    for (std::size_t g = 0; g + 1 < groups; g += 2) {  // ragged token counts, the same total
        const std::size_t d = 1000 + 517 * g;
        sizes[g] += d;
        sizes[g + 1] -= d;
    }
    std::size_t M = 0;
    for (std::size_t v : sizes) M += v;
    const std::string bench =
        "grouped_gemm_k_g" + std::to_string(groups) + "_n" + std::to_string(N) + "_k" + std::to_string(K) + "_ragged";
    const double flops = 2.0 * static_cast<double>(M) * N * K;
    auto tflops = [&](double ms) { return flops / (ms * 1e9); };
    const span<const std::size_t> sz(sizes.data(), groups);
    const grouped_layout la = make_grouped_layout<RA>(grouped_cols(N, sz)),
                         lb = make_grouped_layout<RA>(grouped_cols(K, sz));
    cuda::device_buffer<std::uint8_t> a(la.data_bytes), b(lb.data_bytes);
    cuda::device_buffer<float> sa(la.scale_bytes / 4), sb(lb.scale_bytes / 4);
    random_codes<<<1024, 256>>>(a.data(), a.size(), 5);
    random_codes<<<1024, 256>>>(b.data(), b.size(), 6);
    random_scales<<<256, 256>>>(sa.data(), sa.size(), 7);
    random_scales<<<256, 256>>>(sb.data(), sb.size(), 8);
    OCTET_CUDA_CHECK(cudaGetLastError());
    const grouped_quantized_cref<RA> A(a.data(), reinterpret_cast<const std::uint8_t*>(sa.data()), nullptr, la),
        B(b.data(), reinterpret_cast<const std::uint8_t*>(sb.data()), nullptr, lb);
    cuda::device_buffer<float> dw(groups * N * K);
    const std::string shape = std::to_string(groups) + " experts, " + std::to_string(M) + " tokens";
    gemm_options o;
    o.backend = gemm_backend::sm90_wgmma;
    double ms_grouped = 0;
    try {
        ms_grouped = time_graph(s, [&](cudaStream_t st) {
            grouped_scaled_gemm_k(on_stream(st), A, B, matrix_ref<float>(dw.data(), groups * N, K), o);
        });
        octet_bench::result(bench, "octet_grouped_tflops", tflops(ms_grouped), "TFLOPS",
                            shape + ", one persistent sm90 kernel (A's TMA map per expert)");
    } catch (const std::exception& e) {
        std::printf("octet k-grouped failed on %s: %s\n", bench.c_str(), e.what());
        octet_bench::result(bench, "octet_grouped_tflops", 0, "TFLOPS", "FAILED");
        cudaGetLastError();
    }
    try {
        const double ms = time_graph(s, [&](cudaStream_t st) {
            for (std::size_t g = 0; g < groups; ++g)
                scaled_gemm(on_stream(st), A.group(g), B.group(g), matrix_ref<float>(dw.data() + g * N * K, N, K), o);
        });
        octet_bench::result(bench, "octet_dense_loop_tflops", tflops(ms), "TFLOPS",
                            shape + ", one sm90 launch per expert (automatic plan)");
        if (ms_grouped > 0) octet_bench::result(bench, "grouped_vs_dense_loop", ms / ms_grouped, "x", "");
    } catch (const std::exception& e) {
        std::printf("octet dense loop failed on %s: %s\n", bench.c_str(), e.what());
        cudaGetLastError();
    }
}

}  // namespace

int main() {
    if (!octet::grouped_scaled_gemm_support<RA, RB>(octet::on_stream(nullptr), octet::gemm_backend::sm90_wgmma, 7168)
             .empty()) {
        std::printf("grouped_gemm: needs an sm_90 GPU and a build for sm_90a; nothing to measure here\n");
        return 0;
    }
    octet_bench::print_device();
    cudaStream_t s;
    OCTET_CUDA_CHECK(cudaStreamCreate(&s));
    for (std::size_t groups : {4, 8})
        for (const auto& nk : {std::pair<std::size_t, std::size_t>{4096, 7168}, {7168, 2048}})
            for (bool ragged : {false, true}) run(groups, nk.first, nk.second, ragged, s);
    for (std::size_t groups : {4, 8}) run_k(groups, 4096, 7168, s);
    cudaStreamDestroy(s);
    return 0;
}
