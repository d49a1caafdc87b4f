// octet-bench: libs=cublasLt,cublas
//
// GPU benchmark: scaled FP8 GEMM throughput (TFLOPS = 2 M N K / time) on Hopper, in one run, for
//   octet sm90_wgmma   1x128 (A) x 128x128 (B) E4M3, bf16 D, promotion every 128 (DeepSeek-V3)
//   cuBLASLt           the same operands and scaling (VEC128_32F x BLK128x128_32F), called directly
//                      with its heuristic's algorithm chosen once and scales laid out beforehand
//   cuBLAS BF16        cublasGemmEx on bf16 operands of the same shape (the non-FP8 baseline)
// for 4096^3, 8192^3, DeepSeek-V3-like shapes (M = 4096 with the (N, K) of its dense layers) and
// decode-like M in {64, 128} with N = K = 7168; octet sm89_mma (the mma.sync fallback) at 4096^3.
// Every variant is captured in a CUDA graph of 10 calls, so host overhead is excluded for all of them
// alike; the median of 10 graph launches is reported. Each shape also reports octet's largest
// difference from cuBLASLt relative to cuBLASLt's largest |D| (a sanity check: the tests check
// correctness). Goal (issue 4): octet >= 0.9x cuBLASLt on the large shapes.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu_bench.cuh"
#include "octet/gemm/cublaslt.cuh"

namespace {

using RA = octet::recipes::blockwise_1x128;
using RB = octet::recipes::blockwise_128x128;

__device__ __forceinline__ std::uint32_t hash32(std::uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}
__global__ void fill_codes(std::uint8_t* p, std::size_t n, std::uint32_t seed) {
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        std::uint8_t c = static_cast<std::uint8_t>(hash32(static_cast<std::uint32_t>(i) ^ seed));
        if ((c & 0x7F) == 0x7F) c ^= 1;  // no NaN codes
        p[i] = c;
    }
}
__global__ void fill_scales(float* p, std::size_t n, std::uint32_t seed) {
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
        p[i] =
            0.25f + static_cast<float>(hash32(static_cast<std::uint32_t>(i) * 2654435761U ^ seed) & 0xFFFF) / 65536.0f;
}
__global__ void fill_bf16(octet::bf16* p, std::size_t n, std::uint32_t seed) {
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
        p[i] = octet::to_bf16(
            static_cast<float>(static_cast<int>(hash32(static_cast<std::uint32_t>(i) ^ seed) & 0xFFFF) - 32768) /
            32768.0f);
}
/// out[0] = max |x - y|, out[1] = max |y| (bits of non-negative floats compare as integers).
__global__ void max_diff(const octet::bf16* x, const octet::bf16* y, std::size_t n, unsigned* out) {
    float d = 0, m = 0;
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const float a = octet::to_float(x[i]), b = octet::to_float(y[i]);
        d = fmaxf(d, fabsf(a - b));
        if (a != a) d = INFINITY;
        m = fmaxf(m, fabsf(b));
    }
    atomicMax(out, __float_as_uint(d));
    atomicMax(out + 1, __float_as_uint(m));
}
/// BLK128x128_32F layout for cuBLASLt from octet's column-major 128x128 grid.
__global__ void to_blk128(const float* src, std::size_t src_ld, float* dst, std::size_t dst_ld, std::size_t rblocks,
                          std::size_t kblocks) {
    for (std::size_t t = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; t < rblocks * dst_ld;
         t += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t rb = t / dst_ld, kb = t % dst_ld;
        dst[t] = kb < kblocks ? src[kb * src_ld + rb] : 0.0f;
    }
}

/// Milliseconds per call: `inner` calls captured in one CUDA graph, median of 10 launches.
double time_graph(cudaStream_t s, const std::function<void(cudaStream_t)>& fn, int inner = 10) {
    fn(s);
    fn(s);
    OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    OCTET_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    try {
        for (int i = 0; i < inner; ++i) fn(s);
    } catch (...) {
        cudaStreamEndCapture(s, &graph);  // leave the stream usable for the next variant
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

struct problem {
    std::size_t M, N, K;
    std::string name;
};

void run(const problem& pr, cudaStream_t s, cublasHandle_t blas, bool with_sm89) {
    using namespace octet;
    const std::size_t M = pr.M, N = pr.N, K = pr.K;
    const double flops = 2.0 * static_cast<double>(M) * N * K;
    const std::string bench = "gemm_" + pr.name;
    auto tflops = [&](double ms) { return flops / (ms * 1e9); };

    const quant_layout la = quant_layout_of<RA>::make(M, K), lb = quant_layout_of<RB>::make(N, K);
    cuda::device_buffer<std::uint8_t> a(la.data_bytes), b(lb.data_bytes);
    cuda::device_buffer<float> sa(la.scale_bytes / 4), sb(lb.scale_bytes / 4);
    fill_codes<<<1024, 256>>>(a.data(), a.size(), 1);
    fill_codes<<<1024, 256>>>(b.data(), b.size(), 2);
    fill_scales<<<256, 256>>>(sa.data(), sa.size(), 3);
    fill_scales<<<256, 256>>>(sb.data(), sb.size(), 4);
    OCTET_CUDA_CHECK(cudaGetLastError());
    const quantized_cref<RA> A(a.data(), reinterpret_cast<const std::uint8_t*>(sa.data()), la);
    const quantized_cref<RB> B(b.data(), reinterpret_cast<const std::uint8_t*>(sb.data()), lb);
    cuda::device_buffer<bf16> d_octet(M * N), d_lt(M * N);
    d_octet.fill_bytes(0xFF);
    d_lt.fill_bytes(0xFF);

    // octet sm90_wgmma (automatic plan: tile and split-K), and beside it for the small-M shapes the
    // plan's tile unsplit and the other tile with its best split; for the others the other large tile.
    double ms_octet = 0;
    try {
        auto describe = [&](const gemm_options& o) {
            const detail::sm90_plan plan = detail::sm90_choose_plan<RB>(M, N, K, o);
            return std::string("tile ") + tile_name(plan.tile) + ", split-K " + std::to_string(plan.splits) +
                   (plan.cluster > 1 ? ", pairs (B multicast)" : ", single CTAs");
        };
        auto time_with = [&](const gemm_options& o) {
            return time_graph(s, [&](cudaStream_t st) {
                scaled_gemm(on_stream(st), A, B, matrix_ref<bf16>(d_octet.data(), M, N), o);
            });
        };
        gemm_options o;
        o.backend = gemm_backend::sm90_wgmma;
        ms_octet = time_with(o);
        octet_bench::result(bench, "octet_sm90_tflops", tflops(ms_octet), "TFLOPS", describe(o));
        if (M <= 128) {
            const detail::sm90_plan plan = detail::sm90_choose_plan<RB>(M, N, K, o);
            gemm_options unsplit = o;
            unsplit.tile = plan.tile;
            unsplit.split_k = 1;
            octet_bench::result(bench, "octet_sm90_unsplit_tflops", tflops(time_with(unsplit)), "TFLOPS",
                                describe(unsplit));
            gemm_options other = o;
            other.tile = plan.tile == gemm_tile::m64n64 ? gemm_tile::m128n128 : gemm_tile::m64n64;
            octet_bench::result(bench, "octet_sm90_other_tile_tflops", tflops(time_with(other)), "TFLOPS",
                                describe(other));
            scaled_gemm(on_stream(s), A, B, matrix_ref<bf16>(d_octet.data(), M, N), o);
        } else {
            // the plan's large tile against the other one (128 x 128 and 128 x 192: the wave model's pick)
            const detail::sm90_plan plan = detail::sm90_choose_plan<RB>(M, N, K, o);
            gemm_options other = o;
            other.tile = plan.tile == gemm_tile::m128n192 ? gemm_tile::m128n128 : gemm_tile::m128n192;
            octet_bench::result(bench, "octet_sm90_other_tile_tflops", tflops(time_with(other)), "TFLOPS",
                                describe(other));
            // the plan's tile with the other cluster choice (pairs multicasting B, or single CTAs)
            gemm_options other_cluster = o;
            other_cluster.tile = plan.tile;
            other_cluster.cluster = plan.cluster > 1 ? 1 : 2;
            octet_bench::result(bench, "octet_sm90_other_cluster_tflops", tflops(time_with(other_cluster)), "TFLOPS",
                                describe(other_cluster));
            scaled_gemm(on_stream(s), A, B, matrix_ref<bf16>(d_octet.data(), M, N), o);
        }
    } catch (const std::exception& e) {
        std::printf("octet sm90_wgmma failed on %s: %s\n", pr.name.c_str(), e.what());
        octet_bench::result(bench, "octet_sm90_tflops", 0, "TFLOPS", "FAILED");
        cudaGetLastError();
    }
    if (with_sm89) {
        try {
            gemm_options o;
            o.backend = gemm_backend::sm89_mma;
            cuda::device_buffer<bf16> d89(M * N);
            const double ms = time_graph(
                s, [&](cudaStream_t st) { scaled_gemm(on_stream(st), A, B, matrix_ref<bf16>(d89.data(), M, N), o); });
            octet_bench::result(bench, "octet_sm89_mma_tflops", tflops(ms), "TFLOPS",
                                "mma.sync fallback (FP16 HMMA on sm_90)");
        } catch (const std::exception& e) {
            std::printf("octet sm89_mma failed on %s: %s\n", pr.name.c_str(), e.what());
            cudaGetLastError();
        }
    }

    // cuBLASLt, same operands and scaling: cuBLASLt's A = octet's B (N x K, op T), B = octet's A.
    double ms_lt = 0;
    try {
        cuda::cublaslt_context ctx;  // the handle and workspace octet::with_cublaslt would lend
        const std::size_t kb = (K + 127) / 128, rb = (N + 127) / 128, ld_blk = (kb + 3) / 4 * 4;
        cuda::device_buffer<float> sb_blk(rb * ld_blk);
        to_blk128<<<256, 256>>>(sb.data(), lb.scale_ld, sb_blk.data(), ld_blk, rb, kb);
        OCTET_CUDA_CHECK(cudaGetLastError());
        detail::lt_matmul_desc desc(CUBLAS_COMPUTE_32F, CUDA_R_32F);
        desc.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
        desc.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
        const void* pa = sb_blk.data();
        const void* pb = sa.data();
        desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, pa);
        desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, pb);
        desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                 static_cast<std::int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F));
        desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, static_cast<std::int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F));
        const detail::lt_layout l1(CUDA_R_8F_E4M3, K, N, static_cast<std::int64_t>(lb.row_bytes));
        const detail::lt_layout l2(CUDA_R_8F_E4M3, K, M, static_cast<std::int64_t>(la.row_bytes));
        const detail::lt_layout ld(CUDA_R_16BF, N, M, static_cast<std::int64_t>(N));
        const detail::lt_preference pref(ctx.workspace_bytes());
        cublasLtMatmulHeuristicResult_t h{};
        int found = 0;
        detail::cublas_check(
            cublasLtMatmulAlgoGetHeuristic(ctx.handle(), desc.d, l1.d, l2.d, ld.d, ld.d, pref.d, 1, &h, &found),
            "heuristic");
        if (found == 0) throw octet::error("cuBLASLt has no algorithm");
        const float alpha = 1.0f, beta = 0.0f;
        ms_lt = time_graph(s, [&](cudaStream_t st) {
            detail::cublas_check(
                cublasLtMatmul(ctx.handle(), desc.d, &alpha, b.data(), l1.d, a.data(), l2.d, &beta, d_lt.data(), ld.d,
                               d_lt.data(), ld.d, &h.algo, ctx.workspace(), ctx.workspace_bytes(), st),
                "cublasLtMatmul");
        });
        octet_bench::result(bench, "cublaslt_fp8_blockwise_tflops", tflops(ms_lt), "TFLOPS",
                            "VEC128_32F x BLK128x128_32F");
    } catch (const std::exception& e) {
        std::printf("cuBLASLt failed on %s: %s\n", pr.name.c_str(), e.what());
        octet_bench::result(bench, "cublaslt_fp8_blockwise_tflops", 0, "TFLOPS", "FAILED");
        cudaGetLastError();
    }
    if (ms_octet > 0 && ms_lt > 0) {
        octet_bench::result(bench, "octet_over_cublaslt", ms_lt / ms_octet, "x", "goal >= 0.9 on large shapes");
        cuda::device_buffer<unsigned> mx(2);
        mx.fill_bytes(0);
        max_diff<<<512, 256>>>(d_octet.data(), d_lt.data(), M * N, mx.data());
        const auto v = mx.download();
        float diff, ref;
        std::memcpy(&diff, &v[0], 4);
        std::memcpy(&ref, &v[1], 4);
        octet_bench::result(bench, "octet_vs_cublaslt_max_diff", ref > 0 ? diff / ref : diff, "of max|D|",
                            "sanity: bf16 rounding is 0.004");
    }

    // cuBLAS BF16 on bf16 operands of the same shape.
    try {
        cuda::device_buffer<bf16> ab(M * K), bb(N * K), db(M * N);
        fill_bf16<<<1024, 256>>>(ab.data(), ab.size(), 5);
        fill_bf16<<<1024, 256>>>(bb.data(), bb.size(), 6);
        OCTET_CUDA_CHECK(cudaGetLastError());
        const float alpha = 1.0f, beta = 0.0f;
        const double ms = time_graph(s, [&](cudaStream_t st) {
            cublasSetStream(blas, st);
            const cublasStatus_t r = cublasGemmEx(
                blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha,
                bb.data(), CUDA_R_16BF, static_cast<int>(K), ab.data(), CUDA_R_16BF, static_cast<int>(K), &beta,
                db.data(), CUDA_R_16BF, static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            if (r != CUBLAS_STATUS_SUCCESS) throw octet::error("cublasGemmEx failed");
        });
        octet_bench::result(bench, "cublas_bf16_tflops", tflops(ms), "TFLOPS", "");
    } catch (const std::exception& e) {
        std::printf("cuBLAS BF16 failed on %s: %s\n", pr.name.c_str(), e.what());
        cudaGetLastError();
    }
}

}  // namespace

int main() {
    using blockwise_a = octet::recipes::blockwise_1x128;
    using blockwise_b = octet::recipes::blockwise_128x128;
    if (!octet::scaled_gemm_support<blockwise_a, blockwise_b>(octet::on_stream(nullptr),
                                                              octet::gemm_backend::sm90_wgmma, 4096)
             .empty()) {
        std::printf("gemm_tflops: needs an sm_90 GPU and a build for sm_90a; nothing to measure here\n");
        return 0;
    }
    octet_bench::print_device();
    cudaStream_t s;
    OCTET_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) throw octet::error("cublasCreate failed");
    octet::cuda::device_buffer<std::uint8_t> blas_ws(std::size_t{32} << 20);
    cublasSetWorkspace(blas, blas_ws.data(), blas_ws.size());

    const std::vector<problem> problems = {
        {4096, 4096, 4096, "4096^3"},
        {8192, 8192, 8192, "8192^3"},
        {4096, 2112, 7168, "dsv3_m4096_n2112_k7168"},
        {4096, 24576, 1536, "dsv3_m4096_n24576_k1536"},
        {4096, 32768, 512, "dsv3_m4096_n32768_k512"},
        {4096, 7168, 16384, "dsv3_m4096_n7168_k16384"},
        {4096, 4096, 7168, "dsv3_m4096_n4096_k7168"},
        {4096, 7168, 2048, "dsv3_m4096_n7168_k2048"},
        {64, 7168, 7168, "m64_n7168_k7168"},
        {128, 7168, 7168, "m128_n7168_k7168"},
    };
    for (const problem& p : problems) run(p, s, blas, p.M == 4096 && p.N == 4096 && p.K == 4096);
    cublasDestroy(blas);
    cudaStreamDestroy(s);
    return 0;
}
