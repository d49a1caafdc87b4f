// GPU benchmark: the fused AdamW step (octet/optim/adamw.cuh) per state codec and master-weight
// policy. For each configuration it reports the step time, the bytes the step moves per second
// (weights read+write, gradients read, both moments' codes and meta read+write, the Kahan buffer
// read+write) against the device's copy bandwidth, parameters per second, and bytes per
// parameter (optimizer state alone, and weights + gradients + state).
//
// Peers run from bench/gpu/optim_peers.py (PyTorch fused AdamW, bitsandbytes 8-bit AdamW, torchao
// FP8 AdamW), which also calls this program for its ratios:
//   gpubench_optim_adamw [name-filter]        OCTET_OPTIM_BENCH_N=<parameters> (default 2^28)
// Goal (issue 6): faster per step than bitsandbytes' 8-bit AdamW at equal or smaller memory per
// parameter (compare "optim_adamw_dynamic8_fp32master_f32grad" with "bnb_adamw8bit").
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gpu_bench.cuh"
#include "octet/core/philox.hpp"
#include "octet/optim/adamw.cuh"
#include "octet/optim/memory.hpp"

namespace optim_bench {
using namespace octet;

/// Normal values scale * N(0, 1) from Philox (Box-Muller), written as T (float or bf16).
template <class T>
__global__ void fill_normal(T* x, std::size_t n, float scale, std::uint64_t seed) {
    const philox_stream rng{seed, 0};
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float u1 = fmaxf(rng.uniform(2 * i), 1e-7f), u2 = rng.uniform(2 * i + 1);
        const float z = scale * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
        if constexpr (std::is_same_v<T, float>)
            x[i] = z;
        else
            x[i] = to_bf16(z);
    }
}

template <class T>
void fill(cuda::device_buffer<T>& b, float scale, std::uint64_t seed) {
    fill_normal<<<cuda::grid_stride_blocks(b.size(), 256), 256>>>(b.data(), b.size(), scale, seed);
    OCTET_CUDA_CHECK_LAUNCH();
}

template <class MC, class VC, class M, class G>
void run(const std::string& name, std::size_t n, double copy_gbs, grad_nonfinite_policy policy,
         const std::string& filter) {
    if (!filter.empty() && name.find(filter) == std::string::npos) return;
    using W = typename M::weight_type;
    cuda::device_buffer<W> params(n);
    cuda::device_buffer<typename M::comp_type> comp(M::has_compensation ? n : 0);
    cuda::device_buffer<typename MC::code_type> mc(n);
    cuda::device_buffer<typename MC::meta_type> mm(state_meta_count<MC>(n));
    cuda::device_buffer<typename VC::code_type> vc(n);
    cuda::device_buffer<typename VC::meta_type> vm(state_meta_count<VC>(n));
    cuda::device_buffer<G> grads(n);
    cuda::device_buffer<adamw_report> report(1);
    fill(params, 1.0f, 1);
    fill(grads, 1e-3f, 2);
    comp.fill_bytes(0);
    mc.fill_bytes(0);
    mm.fill_bytes(0);
    vc.fill_bytes(0);
    vm.fill_bytes(0);
    const adamw_state_ref<MC, VC, M> ref{params.view(), comp.view(), mc.view(), mm.view(), vc.view(), vm.view(), 0};
    adamw_hyper h;
    h.on_nonfinite = policy;
    h.seed = 5;
    std::uint64_t step = 1;
    auto one_step = [&] { adamw_step(on_stream(), ref, grads.cview(), h, step++, 1e-4f, report.data()); };
    for (int i = 0; i < 3; ++i) one_step();  // non-trivial moments before timing
    const double ms = octet_bench::median_ms(one_step, 20, 2);

    const double meta_bytes = static_cast<double>(mm.size() * sizeof(typename MC::meta_type) * (MC::has_meta ? 1 : 0) +
                                                  vm.size() * sizeof(typename VC::meta_type) * (VC::has_meta ? 1 : 0));
    double bytes = static_cast<double>(n) * (2.0 * sizeof(W) + sizeof(G) + 2.0 * sizeof(typename MC::code_type) +
                                             2.0 * sizeof(typename VC::code_type) + (M::has_compensation ? 4.0 : 0.0)) +
                   2.0 * meta_bytes;
    if (policy == grad_nonfinite_policy::skip_step) bytes += static_cast<double>(n) * sizeof(G);  // the counting pass
    const double gbs = bytes / (ms * 1e6);
    const auto cfg = memory_config_for<MC, VC, M>(static_cast<double>(n), static_cast<double>(sizeof(G)));
    const parameter_bytes bpp = bytes_per_parameter(cfg);
    const std::string bench = "optim_adamw_" + name;
    octet_bench::result(bench, "step_time", ms, "ms", std::to_string(n) + " parameters");
    octet_bench::result(bench, "bandwidth", gbs, "GB/s", "bytes moved by the step (read + write)");
    octet_bench::result(bench, "fraction_of_copy", gbs / copy_gbs, "x", "of cudaMemcpy D2D bandwidth");
    octet_bench::result(bench, "parameters_per_s", static_cast<double>(n) / (ms * 1e6), "G/s", "");
    octet_bench::result(bench, "state_bytes_per_param", bpp.optimizer_state, "B",
                        "both moments + meta (+ Kahan buffer)");
    octet_bench::result(bench, "total_bytes_per_param", bpp.total(), "B", "weights + gradients + optimizer state");
}

}  // namespace optim_bench

int main(int argc, char** argv) {
    using namespace octet;
    using optim_bench::run;
    const std::string filter = argc > 1 ? argv[1] : "";
    std::size_t n = std::size_t{1} << 28;
    if (const char* s = std::getenv("OCTET_OPTIM_BENCH_N")) n = static_cast<std::size_t>(std::strtoull(s, nullptr, 10));
    octet_bench::print_device();
    const double copy = octet_bench::copy_bandwidth_gbs();
    octet_bench::result("copy", "bandwidth", copy, "GB/s", "cudaMemcpy D2D, read+write");
    namespace sc = state_codec;
    const auto zb = grad_nonfinite_policy::zero_block;
    run<sc::fp32, sc::fp32, master::fp32, float>("fp32_fp32master_f32grad", n, copy, zb, filter);
    run<sc::bf16, sc::bf16, master::fp32, float>("bf16_fp32master_f32grad", n, copy, zb, filter);
    run<sc::dynamic8, sc::dynamic8, master::fp32, float>("dynamic8_fp32master_f32grad", n, copy, zb, filter);
    run<sc::dynamic8, sc::dynamic8, master::fp32, float>("dynamic8_fp32master_f32grad_skipstep", n, copy,
                                                         grad_nonfinite_policy::skip_step, filter);
    run<sc::e4m3_scaled, sc::e4m3_scaled, master::fp32, float>("e4m3_scaled_fp32master_f32grad", n, copy, zb, filter);
    run<sc::e4m3_expanded, sc::e4m3_expanded, master::fp32, float>("e4m3_expanded_fp32master_f32grad", n, copy, zb,
                                                                   filter);
    run<sc::dynamic8, sc::dynamic8, master::bf16_stochastic, bf16>("dynamic8_bf16srmaster_bf16grad", n, copy, zb,
                                                                   filter);
    run<sc::e4m3_expanded, sc::e4m3_expanded, master::bf16_kahan, bf16>("e4m3_expanded_kahanmaster_bf16grad", n, copy,
                                                                        zb, filter);
    return 0;
}
