// octet/rl/surrogate.cuh: importance ratios and the clipped surrogate on a CUDA stream.
//
//   octet::importance_ratios(octet::on_stream(s), logp_new, logp_old, ratios);
//   octet::clipped_surrogate(octet::on_stream(s), logp_new, logp_old, adv, cfg, outputs, stats);
//
// The stream backend of the importance_ratios entry in surrogate.hpp, and the stream's
// clipped_surrogate, which shares the host form's checks (check_surrogate_args).
// Same rules and contract as the host forms in surrogate.hpp (the kernels call the same
// OCTET_HD functions of clip.hpp). All spans are device memory; `stats` is one surrogate_stats in
// device memory, zeroed and filled by the call (read it back with cudaMemcpy after the stream).
// Differences from the host overloads, all documented and tested:
//   * non-finite tokens are always counted (device code never throws; token_nonfinite_policy::raise
//     is rejected with octet::error);
//   * the aggregated objective and ratio sum are summed with double atomics, so their last bits
//     depend on the schedule (counts are exact);
//   * sequence offsets are trusted (validate_sequence_offsets on the host if they are untrusted).
#pragma once

#include <cuda_runtime.h>

#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/shared_memory.cuh"  // OCTET_SHARED, octet::shared_ptr_t
#include "octet/rl/surrogate.hpp"

namespace octet {
namespace detail {

constexpr int kRlThreads = 256;
constexpr int kRlWarps = kRlThreads / 32;

/// The fields of surrogate_stats a block sums, as plain data (a __shared__ array needs a trivial
/// constructor, which surrogate_stats's member initializers rule out). `tokens` is not among them:
/// the kernel adds n once.
struct stats_partial {
    std::uint64_t count[8];  // non_finite, negative, positive, below, above, clipped_low, clipped_high, limited
    double objective, ratio_sum;
};

OCTET_DEVICE stats_partial partial_of(const surrogate_stats& s) {
    return {{s.non_finite, s.negative, s.positive, s.below, s.above, s.clipped_low, s.clipped_high, s.limited},
            s.objective,
            s.ratio_sum};
}

OCTET_DEVICE void add_partial(stats_partial& into, const stats_partial& p) {
    OCTET_UNROLL
    for (int k = 0; k < 8; ++k) into.count[k] += p.count[k];
    into.objective += p.objective;
    into.ratio_sum += p.ratio_sum;
}

/// The sum of `mine` over the kRlThreads threads of the block, in thread 0 (the others get partial
/// sums); every thread of the block must call it, with `warp_partials` the same kRlWarps-element
/// shared array. The doubles are summed in the order of the cub::BlockReduce (warp reductions) this
/// replaces, so the device's bits do not change: within a warp, shuffles down by 1, 2, 4, 8, 16 (lane
/// l adds lane l + offset's partial to its own: neighbours first, a balanced tree), then thread 0
/// adds the warps' sums to warp 0's in warp order 1, ..., 7. Lanes whose source is past lane 31 get
/// their own value back and hold sums no one reads (cub skips those adds; lane 0 never has one).
OCTET_DEVICE stats_partial block_sum(stats_partial mine, shared_ptr_t<stats_partial> warp_partials) {
    OCTET_UNROLL
    for (unsigned offset = 1; offset < 32; offset *= 2) {
        stats_partial other;
        OCTET_UNROLL
        for (int k = 0; k < 8; ++k) other.count[k] = __shfl_down_sync(0xFFFFFFFFu, mine.count[k], offset);
        other.objective = __shfl_down_sync(0xFFFFFFFFu, mine.objective, offset);
        other.ratio_sum = __shfl_down_sync(0xFFFFFFFFu, mine.ratio_sum, offset);
        add_partial(mine, other);
    }
    if ((threadIdx.x & 31) == 0) warp_partials[threadIdx.x / 32] = mine;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < kRlWarps; ++w) add_partial(mine, warp_partials[w]);
    return mine;
}

OCTET_KERNEL void importance_ratio_kernel(const float* __restrict__ logp_new, const float* __restrict__ logp_old,
                                          float* __restrict__ ratios, std::size_t n, float limit) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        ratios[i] = importance_ratio(logp_new[i], logp_old[i], limit);
}

template <bool BySequence>
OCTET_KERNEL void __launch_bounds__(kRlThreads)
    clipped_surrogate_kernel(const float* __restrict__ logp_new, const float* __restrict__ logp_old,
                             const float* __restrict__ advantages, std::size_t n, clip_range range, float limit,
                             loss_aggregation aggregation, const std::int64_t* __restrict__ offsets,
                             std::int64_t sequences, float* __restrict__ ratio_out, float* __restrict__ objective_out,
                             float* __restrict__ grad_out, surrogate_stats* stats) {
    OCTET_SHARED(stats_partial[kRlWarps], warp_partials);

    surrogate_stats local;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    double w = token_weight(aggregation, n, 0, sequences);  // constant unless by sequence
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        if constexpr (BySequence) {
            const std::int64_t s = sequence_of(offsets, sequences, static_cast<std::int64_t>(i));
            w = token_weight(aggregation, n, offsets[s + 1] - offsets[s], sequences);
        }
        const float a = advantages[i];
        const token_ratio tr = importance_ratio_of(logp_new[i], logp_old[i], limit);
        const token_surrogate t = surrogate_token(tr.ratio, a, range, tr.limited);
        tally(local, tr, a, t, range, w);
        if (ratio_out) ratio_out[i] = tr.ratio;
        if (objective_out) objective_out[i] = t.objective;
        if (grad_out) grad_out[i] = -(static_cast<float>(w) * t.gradient);
    }
    const stats_partial block = block_sum(partial_of(local), warp_partials);
    if (threadIdx.x == 0) {
        auto add = [](std::uint64_t* p, std::uint64_t v) {
            if (v) atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
        };
        add(&stats->non_finite, block.count[0]);
        add(&stats->negative, block.count[1]);
        add(&stats->positive, block.count[2]);
        add(&stats->below, block.count[3]);
        add(&stats->above, block.count[4]);
        add(&stats->clipped_low, block.count[5]);
        add(&stats->clipped_high, block.count[6]);
        add(&stats->limited, block.count[7]);
        atomicAdd(&stats->objective, block.objective);
        atomicAdd(&stats->ratio_sum, block.ratio_sum);
        if (blockIdx.x == 0) add(&stats->tokens, n);
    }
}

inline void require_device_input(span<const float> x, const char* fn, const char* arg) {
    OCTET_REQUIRE(x.empty() || x.data() != nullptr, fn, arg, "is null with a non-zero size");
    cuda::require_device_accessible(x.data(), fn, arg);
}
inline void require_device_output(span<float> x, std::size_t n, const char* fn, const char* arg) {
    require_output(x, n, fn, arg);
    cuda::require_device_accessible(x.data(), fn, arg);
}

/// octet::importance_ratios on a stream (the entry, in surrogate.hpp, checked the arguments every
/// executor shares): one kernel enqueued on ex.stream, no host sync.
template <>
struct ratio_backend<stream_executor> {
    static void ratios(const stream_executor& ex, span<const float> logp_new, span<const float> logp_old,
                       span<float> ratios, float log_ratio_limit) {
        constexpr const char* fn = "octet::importance_ratios";
        if (logp_new.empty()) return;
        require_device_input(logp_new, fn, "logp_new");
        require_device_input(logp_old, fn, "logp_old");
        require_device_output(ratios, logp_new.size(), fn, "ratios");
        const unsigned blocks = cuda::grid_stride_blocks(logp_new.size(), kRlThreads);
        cuda::launch("importance_ratio_kernel", importance_ratio_kernel, blocks, kRlThreads, 0, ex.stream,
                     logp_new.data(), logp_old.data(), ratios.data(), logp_new.size(), log_ratio_limit);
        OCTET_CUDA_CHECK_LAUNCH();
    }
};

}  // namespace detail

/// The clipped surrogate on the stream: the host form's checks (check_surrogate_args; the
/// sequence offsets' values are trusted), then a memset of `stats` (one surrogate_stats in device
/// memory) and the surrogate kernel enqueued on ex.stream. No scratch, never synchronizes.
inline void clipped_surrogate(stream_executor ex, span<const float> logp_new, span<const float> logp_old,
                              span<const float> advantages, const surrogate_config& cfg, surrogate_outputs out,
                              span<surrogate_stats> stats, span<const std::int64_t> sequence_offsets = {}) {
    constexpr const char* fn = "octet::clipped_surrogate";
    const std::size_t n = logp_new.size();
    OCTET_REQUIRE(stats.size() == 1 && stats.data() != nullptr, fn, "stats",
                  detail::message("has ", stats.size(), " elements; pass one surrogate_stats in device memory"));
    OCTET_REQUIRE(cfg.on_nonfinite == token_nonfinite_policy::count, fn, "cfg.on_nonfinite",
                  "is token_nonfinite_policy::raise, which device code cannot do; use token_nonfinite_policy::count "
                  "and check stats.non_finite");
    // sizes first: no device call for a wrong shape
    const bool by_sequence =
        detail::check_surrogate_args(logp_new, logp_old, advantages, cfg, out, sequence_offsets, fn);
    cuda::require_device_accessible(stats.data(), fn, "stats");
    if (by_sequence) cuda::require_device_accessible(sequence_offsets.data(), fn, "sequence_offsets");
    OCTET_CUDA_CHECK(cudaMemsetAsync(stats.data(), 0, sizeof(surrogate_stats), ex.stream));
    if (n == 0) return;  // all-zero stats are the empty batch's
    detail::require_device_input(logp_new, fn, "logp_new");
    detail::require_device_input(logp_old, fn, "logp_old");
    detail::require_device_input(advantages, fn, "advantages");
    detail::require_device_output(out.ratio, n, fn, "out.ratio");
    detail::require_device_output(out.objective, n, fn, "out.objective");
    detail::require_device_output(out.grad, n, fn, "out.grad");
    const std::int64_t sequences = by_sequence ? static_cast<std::int64_t>(sequence_offsets.size()) - 1 : 0;
    const unsigned blocks = cuda::grid_stride_blocks(n, detail::kRlThreads);
    auto opt = [](span<float> s) { return s.empty() ? nullptr : s.data(); };
    if (by_sequence)
        cuda::launch("clipped_surrogate_kernel", detail::clipped_surrogate_kernel<true>, blocks, detail::kRlThreads, 0,
                     ex.stream, logp_new.data(), logp_old.data(), advantages.data(), n, cfg.range, cfg.log_ratio_limit,
                     cfg.aggregation, sequence_offsets.data(), sequences, opt(out.ratio), opt(out.objective),
                     opt(out.grad), stats.data());
    else
        cuda::launch("clipped_surrogate_kernel", detail::clipped_surrogate_kernel<false>, blocks, detail::kRlThreads, 0,
                     ex.stream, logp_new.data(), logp_old.data(), advantages.data(), n, cfg.range, cfg.log_ratio_limit,
                     cfg.aggregation, static_cast<const std::int64_t*>(nullptr), std::int64_t{0}, opt(out.ratio),
                     opt(out.objective), opt(out.grad), stats.data());
    OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace octet
