// octet/optim/adamw.cuh: the fused AdamW step on a CUDA stream.
//
//   octet::adamw_step(octet::on_stream(s), state_ref, grads, hyper, step, lr, report_device);
//   (the entry is adamw.hpp's, one for every executor; this header adds the stream's half,
//   optim_detail::step_backend<stream_executor>)
//
// Same contract and same bits as the host overload in optim/adamw.hpp: each warp runs the shared
// OCTET_HD adamw_block on one block of 256 elements (8 per lane; group statistics by warp
// shuffles, which are max/min and so order-free), and stochastic rounding draws element i's bits
// from Philox at the element's global index, so results do not depend on the launch shape.
// Every view must be device memory; `grads` may be float, octet::bf16 or __nv_bfloat16.
// `report` is device memory for one octet::adamw_report; the call zeroes it on the stream and the
// kernels fill it, so reading it needs a synchronization (nothing here synchronizes).
//
// Launches: with grad_nonfinite_policy::skip_step, a counting kernel first (one read of the
// gradients), then the step kernel, which reads the count from `report` and exits at once when
// it is non-zero (no host round trip). With zero_block, the step kernel alone.
// Bytes moved per element by the step kernel: weights read+write, gradient read, both moment
// codes read+write, meta read+write (bench/gpu/optim_adamw.cu reports it against copy bandwidth).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/optim/adamw.hpp"
#include "octet/optim/detail/warp_team.cuh"

namespace octet {
namespace optim_detail {

template <class T>
struct grad_storage {
    using type = T;
};
template <>
struct grad_storage<__nv_bfloat16> {
    using type = ::octet::bf16;
};
template <class T>
using grad_storage_t = typename grad_storage<std::remove_cv_t<T>>::type;

constexpr int kStepThreads = 256;  // 8 warps: 8 blocks of 256 elements per CTA per iteration

template <class Grad>
OCTET_KERNEL void count_nonfinite_kernel(const Grad* __restrict__ g, std::size_t n, adamw_report* report) {
    std::uint32_t local = 0;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        local += offending(to_f(g[i])) ? 1u : 0u;
    OCTET_UNROLL
    for (int offset = 16; offset >= 1; offset >>= 1) local += __shfl_xor_sync(0xFFFFFFFFu, local, offset);
    if ((threadIdx.x & 31u) == 0u && local != 0u)
        atomicAdd(reinterpret_cast<unsigned long long*>(&report->nonfinite_gradients),
                  static_cast<unsigned long long>(local));
}

template <class MCodec, class VCodec, class Master, class Grad>
OCTET_KERNEL void __launch_bounds__(kStepThreads)
    adamw_step_kernel(adamw_block_args<MCodec, VCodec, Master, Grad> a, adamw_report* report, bool skip_if_counted) {
    codec_context ctx{};
    if constexpr (MCodec::needs_tables || VCodec::needs_tables) {
        OCTET_SHARED(float[codec_table_floats], tables);
        ctx = load_codec_tables(tables);
    }
    if (skip_if_counted && *(volatile std::uint64_t*)&report->nonfinite_gradients != 0) {
        if (blockIdx.x == 0 && threadIdx.x == 0) report->skipped = 1;
        return;
    }
    const warp_team team;
    const std::size_t blocks = (a.n + optim_block - 1) / optim_block;
    std::uint32_t bad = 0, zeroed = 0;
    for (std::size_t blk = global_warp(); blk < blocks; blk += warp_count()) {
        const block_result r = adamw_block(team, a, ctx, blk);
        bad += r.nonfinite;
        zeroed += r.zeroed;
    }
    bad = static_cast<std::uint32_t>(team.sum(static_cast<int>(bad)));
    if (team.rank() == 0) {
        if (bad)
            atomicAdd(reinterpret_cast<unsigned long long*>(&report->nonfinite_gradients),
                      static_cast<unsigned long long>(bad));
        if (zeroed)
            atomicAdd(reinterpret_cast<unsigned long long*>(&report->blocks_zeroed),
                      static_cast<unsigned long long>(zeroed));
    }
}

template <class T>
void require_device_view(span<T> s, const char* fn, const char* name) {
    if (!s.empty()) cuda::require_device_accessible(s.data(), fn, name);
}

}  // namespace optim_detail

/// Number of offending gradient elements, added to report->nonfinite_gradients (device memory;
/// the caller zeroes it). For sharded skip decisions: run on each shard, all-reduce, then skip.
template <class Grad>
void count_nonfinite(stream_executor ex, span<const Grad> grads, adamw_report* report) {
    using G = optim_detail::grad_storage_t<Grad>;
    static_assert(optim_detail::is_grad_type_v<G>,
                  "octet::count_nonfinite: gradients must be float, octet::bf16 or __nv_bfloat16");
    OCTET_REQUIRE(report != nullptr, "octet::count_nonfinite", "report",
                  "is null; pass device memory for one octet::adamw_report");
    cuda::require_device_accessible(report, "octet::count_nonfinite", "report");
    if (grads.empty()) return;
    OCTET_REQUIRE(grads.data() != nullptr, "octet::count_nonfinite", "grads", "is null with a non-zero size");
    cuda::require_device_accessible(grads.data(), "octet::count_nonfinite", "grads");
    const unsigned blocks = cuda::grid_stride_blocks(grads.size(), 256, 4);
    cuda::launch("count_nonfinite_kernel", optim_detail::count_nonfinite_kernel<G>, blocks, 256, 0, ex.stream,
                 reinterpret_cast<const G*>(grads.data()), grads.size(), report);
    OCTET_CUDA_CHECK_LAUNCH();
}

namespace optim_detail {

/// adamw_step on a stream (the entry, octet::adamw_step, is in adamw.hpp and checks the
/// executor-independent arguments first).
template <>
struct step_backend<stream_executor> {
    template <class Grad>
    using element = grad_storage_t<Grad>;
    using report_out = adamw_report*;
    using result = void;

    /// Enqueued on ex.stream: a memset of the report, with skip_step a counting kernel, then the
    /// step kernel (see the header comment). No scratch, no host sync.
    template <class MCodec, class VCodec, class Master, class G>
    static void run(const stream_executor& ex, const adamw_state_ref<MCodec, VCodec, Master>& state,
                    span<const G> grads, const adamw_hyper& hyper, std::uint64_t step, float lr, adamw_report* report) {
        constexpr const char* fn = "octet::adamw_step";
        OCTET_REQUIRE(report != nullptr, fn, "report", "is null; pass device memory for one octet::adamw_report");
        cuda::require_device_accessible(report, fn, "report");
        require_device_view(state.params, fn, "state.params");
        require_device_view(state.compensation, fn, "state.compensation");
        require_device_view(state.m_codes, fn, "state.m_codes");
        require_device_view(state.m_meta, fn, "state.m_meta");
        require_device_view(state.v_codes, fn, "state.v_codes");
        require_device_view(state.v_meta, fn, "state.v_meta");
        require_device_view(grads, fn, "grads");

        OCTET_CUDA_CHECK(cudaMemsetAsync(report, 0, sizeof(adamw_report), ex.stream));
        if (state.size() == 0) return;
        const bool skip = hyper.on_nonfinite == grad_nonfinite_policy::skip_step;
        if (skip) count_nonfinite(ex, grads, report);

        const bool vectorized = detail::is_aligned(state.params.data(), 16) &&
                                detail::is_aligned(state.m_codes.data(), 16) &&
                                detail::is_aligned(state.v_codes.data(), 16) && detail::is_aligned(grads.data(), 16) &&
                                (!Master::has_compensation || detail::is_aligned(state.compensation.data(), 16));
        const auto args = block_args_of(state, grads, hyper, step, lr, vectorized);
        const std::size_t blocks = (state.size() + optim_block - 1) / optim_block;
        const unsigned ctas = cuda::grid_stride_blocks(blocks * 32, kStepThreads, 8);
        cuda::launch("adamw_step_kernel", adamw_step_kernel<MCodec, VCodec, Master, G>, ctas, kStepThreads, 0,
                     ex.stream, args, report, skip);
        OCTET_CUDA_CHECK_LAUNCH();
    }
};

}  // namespace optim_detail

}  // namespace octet
