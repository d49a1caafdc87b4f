// GPU benchmark: per-token RL diagnostics throughput (tokens/s) and the fraction of the device's
// copy bandwidth they reach (bytes read + written per token): importance ratios (8 + 4 bytes),
// the clipped surrogate with its gradient (12 + 4) and without outputs (12), threshold
// crossings from log-probabilities (16) and from ratios (12). 2^26 tokens whose ratios crowd the
// clip bounds; a 2^20-token random batch repeated.
#include <cstdio>
#include <random>
#include <vector>

#include "gpu_bench.cuh"
#include "octet/core/bits.hpp"
#include "octet/rl/crossings.cuh"
#include "octet/rl/surrogate.cuh"

int main() {
    using octet::cuda::device_buffer;
    octet_bench::print_device();
    const double copy = octet_bench::copy_bandwidth_gbs();
    octet_bench::result("copy", "bandwidth", copy, "GB/s", "cudaMemcpy D2D, read+write");

    const std::size_t n = std::size_t{1} << 26, chunk = std::size_t{1} << 20;
    std::vector<float> lo(chunk), hi(chunk), old(chunk), adv(chunk);
    std::mt19937 g(12345);
    std::uniform_real_distribution<float> lp(-20.0f, 0.0f);
    std::normal_distribution<float> d(0.0f, 0.2f), a(0.0f, 1.0f);
    for (std::size_t i = 0; i < chunk; ++i) {
        old[i] = lp(g);
        hi[i] = old[i] + d(g);
        lo[i] = octet::to_float(octet::to_bf16(hi[i]));
        adv[i] = a(g);
    }
    device_buffer<float> d_lo(n), d_hi(n), d_old(n), d_adv(n), d_out(n), d_r1(n), d_r2(n);
    for (std::size_t off = 0; off < n; off += chunk) {
        OCTET_CUDA_CHECK(cudaMemcpy(d_lo.data() + off, lo.data(), chunk * sizeof(float), cudaMemcpyHostToDevice));
        OCTET_CUDA_CHECK(cudaMemcpy(d_hi.data() + off, hi.data(), chunk * sizeof(float), cudaMemcpyHostToDevice));
        OCTET_CUDA_CHECK(cudaMemcpy(d_old.data() + off, old.data(), chunk * sizeof(float), cudaMemcpyHostToDevice));
        OCTET_CUDA_CHECK(cudaMemcpy(d_adv.data() + off, adv.data(), chunk * sizeof(float), cudaMemcpyHostToDevice));
    }
    device_buffer<octet::surrogate_stats> stats(1);
    device_buffer<octet::crossing_report> report(1);
    const auto range = octet::clip_range::asymmetric(0.2f, 0.28f);
    octet::surrogate_config cfg;
    cfg.range = range;

    auto report_line = [&](const char* name, double ms, double bytes_per_token) {
        const double tokens_per_s = static_cast<double>(n) / (ms * 1e-3);
        octet_bench::result(name, "throughput", tokens_per_s / 1e9, "Gtokens/s", "");
        octet_bench::result(name, "fraction_of_copy", tokens_per_s * bytes_per_token / 1e9 / copy, "x",
                            "bytes read+written per token");
    };
    double ms = octet_bench::median_ms(
        [&] { octet::importance_ratios(octet::on_stream(), d_hi.cview(), d_old.cview(), d_r1.view()); });
    report_line("rl_importance_ratios", ms, 12);
    octet::importance_ratios(octet::on_stream(), d_lo.cview(), d_old.cview(), d_r2.view());
    ms = octet_bench::median_ms([&] {
        octet::clipped_surrogate(octet::on_stream(), d_hi.cview(), d_old.cview(), d_adv.cview(), cfg,
                                 {{}, {}, d_out.view()}, stats.view());
    });
    report_line("rl_clipped_surrogate_grad", ms, 16);
    ms = octet_bench::median_ms([&] {
        octet::clipped_surrogate(octet::on_stream(), d_hi.cview(), d_old.cview(), d_adv.cview(), cfg, {}, stats.view());
    });
    report_line("rl_clipped_surrogate_stats_only", ms, 12);
    ms = octet_bench::median_ms([&] {
        octet::threshold_crossings(octet::on_stream(), d_lo.cview(), d_hi.cview(), d_old.cview(), d_adv.cview(), range,
                                   range, report.view());
    });
    report_line("rl_crossings_from_logp", ms, 16);
    ms = octet_bench::median_ms([&] {
        octet::threshold_crossings_from_ratios(octet::on_stream(), d_r2.cview(), d_r1.cview(), d_adv.cview(), range,
                                               range, report.view());
    });
    report_line("rl_crossings_from_ratios", ms, 12);
    const octet::crossing_report c = report.download()[0];
    std::printf("check: %llu tokens classified, %llu negative pushed below\n",
                static_cast<unsigned long long>(c.tokens()),
                static_cast<unsigned long long>(c.by_sign[0].pushed_out_low));
    return 0;
}
