// octet/rl/crossings.cuh: threshold-crossing diagnostics on a CUDA stream.
//
//   octet::threshold_crossings(octet::on_stream(s), logp_low, logp_high, logp_old, adv, range, low_range, report);
//   octet::threshold_crossings_from_ratios(octet::on_stream(s), ratio_low, ratio_high, adv, range, low_range, report);
//
// Same definitions and the same (exact, integer) counts as the host overloads in crossings.hpp:
// the kernel classifies each token with the same OCTET_HD rules. `report` is one crossing_report
// in device memory, zeroed and filled by the call. Each thread keeps its 31 counters in
// registers over a grid-stride loop; warps reduce with shuffles, blocks in shared memory, and one
// 64-bit atomic per counter per block goes to global memory.
#pragma once

#include <cuda_runtime.h>

#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/shared_memory.cuh"  // OCTET_SHARED, octet::shared_ptr_t
#include "octet/rl/crossings.hpp"
#include "octet/rl/surrogate.cuh"

namespace octet {
namespace detail {

constexpr int kCrossingCounters = 3 * crossing_counts::count + 1;  // + non_finite

template <bool FromLogp>
OCTET_KERNEL void __launch_bounds__(kRlThreads)
    threshold_crossings_kernel(const float* __restrict__ a_in, const float* __restrict__ b_in,
                               const float* __restrict__ logp_old, const float* __restrict__ advantages, std::size_t n,
                               clip_range range, clip_range low_range, float limit, crossing_report* report) {
    OCTET_SHARED(unsigned long long[kCrossingCounters], block_counts);
    for (int k = threadIdx.x; k < kCrossingCounters; k += blockDim.x) block_counts[k] = 0;
    __syncthreads();

    unsigned local[kCrossingCounters];
    OCTET_UNROLL
    for (int k = 0; k < kCrossingCounters; ++k) local[k] = 0;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        float lo, hi;
        if constexpr (FromLogp) {
            const float old = logp_old[i];
            lo = importance_ratio(a_in[i], old, limit);
            hi = importance_ratio(b_in[i], old, limit);
        } else {
            lo = a_in[i];
            hi = b_in[i];
        }
        unsigned flags = 0;
        advantage_sign sign = advantage_sign::zero;
        if (!crossing_token(lo, hi, advantages[i], low_range, range, flags, sign)) {
            ++local[kCrossingCounters - 1];
            continue;
        }
        const int s = static_cast<int>(sign);
        // Compile-time indices only, so that the counters stay in registers.
        OCTET_UNROLL
        for (int q = 0; q < 3; ++q) {
            const unsigned m = s == q ? flags : 0u;
            OCTET_UNROLL
            for (int k = 0; k < crossing_counts::count; ++k) local[q * crossing_counts::count + k] += (m >> k) & 1u;
        }
    }
    OCTET_UNROLL
    for (int k = 0; k < kCrossingCounters; ++k) {
        unsigned v = local[k];
        OCTET_UNROLL
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, off);
        if ((threadIdx.x & 31) == 0 && v) atomicAdd(&block_counts[k], static_cast<unsigned long long>(v));
    }
    __syncthreads();
    for (int k = threadIdx.x; k < kCrossingCounters; k += blockDim.x) {
        const unsigned long long v = block_counts[k];
        if (!v) continue;
        unsigned long long* dst =
            k == kCrossingCounters - 1
                ? reinterpret_cast<unsigned long long*>(&report->non_finite)
                : reinterpret_cast<unsigned long long*>(
                      &report->by_sign[k / crossing_counts::count].at(k % crossing_counts::count));
        atomicAdd(dst, v);
    }
}

inline void require_report(span<crossing_report> report, const char* fn) {
    OCTET_REQUIRE(report.size() == 1 && report.data() != nullptr, fn, "report",
                  message("has ", report.size(), " elements; pass one crossing_report in device memory"));
}

inline void launch_crossings(stream_executor ex, bool from_logp, const float* a, const float* b, const float* old,
                             const float* adv, std::size_t n, clip_range range, clip_range low_range, float limit,
                             span<crossing_report> report, const char* fn) {
    cuda::require_device_accessible(report.data(), fn, "report");
    OCTET_CUDA_CHECK(cudaMemsetAsync(report.data(), 0, sizeof(crossing_report), ex.stream));
    if (n == 0) return;
    const unsigned blocks = cuda::grid_stride_blocks(n, kRlThreads);
    if (from_logp)
        cuda::launch("threshold_crossings_kernel", threshold_crossings_kernel<true>, blocks, kRlThreads, 0, ex.stream,
                     a, b, old, adv, n, range, low_range, limit, report.data());
    else
        cuda::launch("threshold_crossings_kernel", threshold_crossings_kernel<false>, blocks, kRlThreads, 0, ex.stream,
                     a, b, static_cast<const float*>(nullptr), adv, n, range, low_range, limit, report.data());
    OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace detail

/// Crossings from log-probabilities on the stream (device memory): the host form's checks
/// (check_crossing_args), then a memset of `report` (one crossing_report in device memory) and the
/// counting kernel enqueued on ex.stream; never synchronizes.
inline void threshold_crossings(stream_executor ex, span<const float> logp_low, span<const float> logp_high,
                                span<const float> logp_old, span<const float> advantages, clip_range range,
                                clip_range low_range, span<crossing_report> report,
                                float log_ratio_limit = default_log_ratio_limit) {
    constexpr const char* fn = "octet::threshold_crossings";
    const std::size_t n = logp_low.size();
    detail::check_crossing_args(true, logp_low, logp_high, logp_old, advantages, range, low_range, log_ratio_limit, fn);
    detail::require_report(report, fn);
    if (n > 0) {
        detail::require_device_input(logp_low, fn, "logp_low");
        detail::require_device_input(logp_high, fn, "logp_high");
        detail::require_device_input(logp_old, fn, "logp_old");
        detail::require_device_input(advantages, fn, "advantages");
    }
    detail::launch_crossings(ex, true, logp_low.data(), logp_high.data(), logp_old.data(), advantages.data(), n, range,
                             low_range, log_ratio_limit, report, fn);
}

/// Crossings from ratios on the stream (device memory): the host form's checks, then a memset of
/// `report` and the counting kernel enqueued on ex.stream; never synchronizes.
inline void threshold_crossings_from_ratios(stream_executor ex, span<const float> ratio_low,
                                            span<const float> ratio_high, span<const float> advantages,
                                            clip_range range, clip_range low_range, span<crossing_report> report) {
    constexpr const char* fn = "octet::threshold_crossings_from_ratios";
    const std::size_t n = ratio_low.size();
    detail::check_crossing_args(false, ratio_low, ratio_high, {}, advantages, range, low_range, default_log_ratio_limit,
                                fn);
    detail::require_report(report, fn);
    if (n > 0) {
        detail::require_device_input(ratio_low, fn, "ratio_low");
        detail::require_device_input(ratio_high, fn, "ratio_high");
        detail::require_device_input(advantages, fn, "advantages");
    }
    detail::launch_crossings(ex, false, ratio_low.data(), ratio_high.data(), nullptr, advantages.data(), n, range,
                             low_range, default_log_ratio_limit, report, fn);
}

}  // namespace octet
