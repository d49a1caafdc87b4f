// GPU benchmark: octet FP8 attention, forward and forward + backward, in TFLOPS, at sequence
// lengths 2k to 16k (a batch of equal sequences, 16384 tokens in all), 16 heads of 128, causal and
// full. Peer: PyTorch's scaled_dot_product_attention in bf16 on the same shapes
// (bench/gpu/attention_peers.py). Goal (issue 5): forward + backward in FP8 with matched delta no
// slower than the bf16 baseline.
//
// FLOPs are counted as FlashAttention does: forward 4 * tokens * L * heads * head_dim (halved for
// causal), forward + backward 3.5x that (the backward's five products). The matched delta's extra
// pass (two more products) is work octet does on top and is not counted. Also reported: the
// backward alone in both delta modes, and the cost of the row telemetry. On an sm_90 GPU the forward
// runs on wgmma (the automatic choice) and is timed again on the sm_89 mma.sync kernel.
//
// Operands: Q, K, dO E4M3 with one scale per token and head (1 x 128), V E4M3 per head (the
// choice that keeps P's tile maximum exact, see docs/attention.md); O and gradients bf16.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu_bench.cuh"
#include "octet/attention/attention.cuh"
#include "octet/quant/quantize.cuh"

namespace attention_bench {

using namespace octet;
using qk_recipe = recipe<e4m3, block<1, 128>, scale::amax_ratio<0>>;
using v_recipe = recipe<e4m3, block<full, 128>, scale::amax_ratio<0>>;

__global__ void fill_normal(float* x, std::size_t n, std::uint64_t seed, float scale) {
    const philox_stream rng{seed, 0};
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        // sum of four uniforms, centred and scaled to unit variance: close enough to normal here
        float s = rng.uniform(4 * i) + rng.uniform(4 * i + 1) + rng.uniform(4 * i + 2) + rng.uniform(4 * i + 3) - 2.0f;
        x[i] = s * 1.7320508f * scale;
    }
}

template <class Recipe>
struct dcopy {
    quant_layout layout;
    cuda::device_buffer<std::uint8_t> data, scales;
    cuda::device_buffer<float> ts;
    dcopy(std::size_t r, std::size_t c)
        : layout(quant_layout_of<Recipe>::make(r, c)), data(layout.data_bytes), scales(layout.scale_bytes), ts(1) {}
    quantized_ref<Recipe> ref() { return quantized_ref<Recipe>(data.data(), scales.data(), layout, ts.data()); }
};

/// Median of a few timed runs; fewer when one run is long, so the whole program stays short.
double time_ms(const std::function<void()>& fn) {
    fn();
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    const double once = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const int repeats = once > 200 ? 3 : (once > 50 ? 5 : 10);
    return octet_bench::median_ms(fn, repeats, 1);
}

}  // namespace attention_bench

int main() {
    using namespace attention_bench;
    using namespace octet;
    octet_bench::print_device();
    const int total = 16384, H = 16, D = 128;
    const std::size_t cols = static_cast<std::size_t>(H) * D, n = static_cast<std::size_t>(total) * cols;
    cuda::device_buffer<float> x(n);
    dcopy<qk_recipe> q(total, cols), k(total, cols), dout(total, cols);
    dcopy<v_recipe> v(total, cols);
    {
        const matrix_ref<const float> xm(x.data(), total, cols);
        std::uint64_t seed = 1;
        auto make = [&](auto& copy, float scale) {
            fill_normal<<<1024, 256>>>(x.data(), n, seed++, scale);
            using R = typename std::remove_reference_t<decltype(copy.ref())>::recipe_type;
            quantize<R>(on_stream(), xm, copy.ref());
        };
        make(q, 1.5f);
        make(k, 1.0f);
        make(v, 1.0f);
        make(dout, 1.0f);
        OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    }
    cuda::device_buffer<bf16> o(n), dq(n), dk(n), dv(n);
    cuda::device_buffer<float> lse(static_cast<std::size_t>(H) * total);
    cuda::device_buffer<attention_stats> stats(1);

    const bool wgmma = detail::attention::uses_wgmma(attention_kernel::automatic, "attention_fp8");
    const auto start = std::chrono::steady_clock::now();
    auto elapsed_s = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    for (int L : {2048, 4096, 8192, 16384}) {
        std::vector<std::int32_t> cu(total / L + 1);
        for (std::size_t b = 0; b < cu.size(); ++b) cu[b] = static_cast<std::int32_t>(b * L);
        cuda::device_buffer<std::int32_t> dcu(cu);
        attention_shape shape;
        shape.cu_seqlens_q = span<const std::int32_t>(cu.data(), cu.size());
        shape.heads_q = H;
        shape.heads_kv = H;
        shape.head_dim = D;
        shape.device_cu_seqlens_q = dcu.data();
        const auto ws = attention_backward_workspace_for(shape);
        cuda::device_buffer<float> workspace(ws.floats);
        for (bool causal : {false, true}) {
            if (elapsed_s() > 70.0) {  // keep the device suite short even if the kernels are slow
                std::printf("attention_fp8: time budget reached before L=%d %s; stopping\n", L,
                            causal ? "causal" : "full");
                return 0;
            }
            const attention_mask mask = causal ? attention_mask::causal : attention_mask::full;
            const std::string tag = "L" + std::to_string(L) + (causal ? "_causal" : "_full");
            const double fwd_flops = 4.0 * total * L * H * D * (causal ? 0.5 : 1.0);
            auto fwd_with = [&](attention_kernel kernel) {
                attention_options fo;
                fo.mask = mask;
                fo.kernel = kernel;
                attention_forward(on_stream(), shape, q.ref(), k.ref(), v.ref(),
                                  matrix_ref<bf16>(o.data(), total, cols), span<float>(lse.data(), lse.size()), fo);
            };
            auto fwd = [&] { fwd_with(attention_kernel::automatic); };
            auto bwd = [&](delta_mode mode, bool tele, attention_kernel kernel = attention_kernel::automatic) {
                attention_backward_options bo;
                bo.mask = mask;
                bo.delta = mode;
                bo.telemetry = tele;
                bo.kernel = kernel;
                attention_backward(
                    on_stream(), shape, q.ref(), k.ref(), v.ref(), matrix_ref<const bf16>(o.data(), total, cols),
                    span<const float>(lse.data(), lse.size()), dout.ref(), matrix_ref<bf16>(dq.data(), total, cols),
                    matrix_ref<bf16>(dk.data(), total, cols), matrix_ref<bf16>(dv.data(), total, cols),
                    span<float>(workspace.data(), ws.floats), bo, tele ? stats.data() : nullptr);
            };
            const double t_fwd = time_ms(fwd);
            octet_bench::result("attention_fp8_fwd_" + tag, "tflops", fwd_flops / (t_fwd * 1e9), "TFLOPS",
                                std::string("16384 tokens, 16 heads x 128, E4M3 (Q,K,dO 1x128, V per head); kernel ") +
                                    (wgmma ? "wgmma" : "mma_sync"));
            if (wgmma) {  // the sm_89 kernel on the same GPU, for comparison
                const double t_mma = time_ms([&] { fwd_with(attention_kernel::mma_sync); });
                octet_bench::result("attention_fp8_fwd_mma_sync_" + tag, "tflops", fwd_flops / (t_mma * 1e9), "TFLOPS",
                                    "wgmma/mma_sync = " + std::to_string(t_mma / t_fwd));
            }
            const double t_fb = time_ms([&] {
                fwd();
                bwd(delta_mode::matched, false);
            });
            octet_bench::result("attention_fp8_fwdbwd_matched_" + tag, "tflops", 3.5 * fwd_flops / (t_fb * 1e9),
                                "TFLOPS", "goal: >= SDPA bf16 fwd+bwd (attention_peers.py)");
            const double t_bm = time_ms([&] { bwd(delta_mode::matched, false); });
            const double t_bo = time_ms([&] { bwd(delta_mode::from_output, false); });
            const double t_bt = time_ms([&] { bwd(delta_mode::matched, true); });
            octet_bench::result("attention_fp8_bwd_matched_" + tag, "time", t_bm, "ms",
                                std::string("P and dP on ") + (wgmma ? "wgmma" : "mma_sync"));
            if (wgmma) {
                const double t_bmma = time_ms([&] { bwd(delta_mode::matched, false, attention_kernel::mma_sync); });
                octet_bench::result("attention_fp8_bwd_matched_mma_sync_" + tag, "time", t_bmma, "ms",
                                    "mma_sync/wgmma = " + std::to_string(t_bmma / t_bm));
            }
            octet_bench::result("attention_fp8_bwd_from_output_" + tag, "time", t_bo, "ms",
                                "matched/from_output = " + std::to_string(t_bm / t_bo));
            octet_bench::result("attention_fp8_telemetry_" + tag, "overhead", t_bt / t_bm - 1.0, "x",
                                "backward with telemetry / without - 1");
        }
    }
    return 0;
}
