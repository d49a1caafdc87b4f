// octet/attention/detail/stream.cuh: the stream backend of octet::attention_forward / attention_backward
// (attention_backend<stream_executor>): the device's own checks, then the forward, delta,
// gradient, dQ conversion and stats kernels enqueued on the executor's stream.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "octet/attention/attention.hpp"
#include "octet/attention/detail/delta.cuh"
#include "octet/attention/detail/finalize.cuh"
#include "octet/attention/detail/forward.cuh"
#include "octet/attention/detail/grad.cuh"
#include "octet/attention/detail/launch.cuh"
#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/tensor_map.cuh"

namespace octet {
namespace detail {

/// The forward on a stream (the entry, octet::attention_forward, checked the shared arguments into
/// `dims`): the device's own checks, then the forward kernel enqueued on ex.stream.
template <class QR, class QB, class KR, class KB, class VR, class VB, class OT>
void stream_attention_forward(const stream_executor& ex, const attention_dims& dims, const attention_shape& shape,
                              const quantized_ref<QR, QB>& q, const quantized_ref<KR, KB>& k,
                              const quantized_ref<VR, VB>& v, matrix_ref<OT> o, span<float> lse,
                              const attention_options& opt) {
    constexpr const char* fn = "octet::attention_forward";
    attention::check_device_shape(shape, fn);
    const int Hq = dims.heads_q, Hk = dims.heads_kv, d = dims.head_dim, Tq = dims.total_q;
    const int max_q = shape.max_seqlen_q();
    if (max_q == 0) return;
    attention::require_fp8_device(fn);
    attention::check_device_operand(q, fn, "q");
    attention::check_device_operand(k, fn, "k");
    attention::check_device_operand(v, fn, "v");
    cuda::require_device_accessible(o.data, fn, "o");
    cuda::require_device_accessible(lse.data(), fn, "lse");

    attention::fwd_params<QR, KR, VR, OT> p{
        q,
        k,
        v,
        o.data,
        o.ld,
        lse.data(),
        shape.device_cu_seqlens_q,
        shape.device_cu_seqlens_k ? shape.device_cu_seqlens_k : shape.device_cu_seqlens_q,
        Hq,
        Hq / Hk,
        Tq,
        attention::mul(dims.scale, attention::log2e),
        opt.mask == attention_mask::causal,
        opt.key_order};
    const dim3 grid((max_q + attention::kTile - 1) / attention::kTile, Hq, shape.batch());
    auto launch = [&](auto dim) {
        constexpr int D = decltype(dim)::value;
        auto kernel = attention::forward_kernel<D, QR, KR, VR, OT>;
        constexpr int smem = attention::fwd_smem_bytes<D>();
        attention::set_smem(kernel, smem);
        cuda::launch("attention::forward_kernel", kernel, grid, attention::kThreads, smem, ex.stream, p);
        OCTET_CUDA_CHECK_LAUNCH();
    };
    auto launch_wgmma = [&](auto dim) {
        constexpr int D = decltype(dim)::value;
        auto kernel = attention::forward_wgmma_kernel<D, QR, KR, VR, OT>;
        constexpr int smem = attention::fwd_wgmma_smem_bytes<D>();
        attention::set_smem(kernel, smem);
        cuda::require_register_split(
            kernel, attention::kWarpSpecializedThreads,
            (attention::kForwardProducerRegs + attention::kConsumerGroups * attention::kForwardConsumerRegs) * 128, fn,
            "options.kernel", "use attention_kernel::mma_sync");
        const CUtensorMap mq = attention::tile_map<D>(q, fn), mk = attention::tile_map<D>(k, fn),
                          mv = attention::tile_map<D>(v, fn);
        const dim3 blocks((max_q + attention::kBlockRows - 1) / attention::kBlockRows, Hq, shape.batch());
        cuda::launch("attention::forward_wgmma_kernel", kernel, blocks, attention::kWarpSpecializedThreads, smem,
                     ex.stream, mq, mk, mv, p);
        OCTET_CUDA_CHECK_LAUNCH();
    };
    const bool wgmma = attention::uses_wgmma(opt.kernel, fn);
    if (d == 64 && wgmma)
        launch_wgmma(std::integral_constant<int, 64>{});
    else if (d == 64)
        launch(std::integral_constant<int, 64>{});
    else if (wgmma)
        launch_wgmma(std::integral_constant<int, 128>{});
    else
        launch(std::integral_constant<int, 128>{});
}

/// The backward on a stream (the entry, octet::attention_backward, checked the shared arguments
/// into `dims`): the workspace and the device's own checks, then memsets of device_stats and the
/// workspace and the delta, gradient, dQ conversion and stats kernels enqueued on ex.stream.
template <class QR, class QB, class KR, class KB, class VR, class VB, class OT, class DR, class DB, class GT>
void stream_attention_backward(const stream_executor& ex, const attention_dims& dims, const attention_shape& shape,
                               const quantized_ref<QR, QB>& q, const quantized_ref<KR, KB>& k,
                               const quantized_ref<VR, VB>& v, matrix_ref<OT> o, span<const float> lse,
                               const quantized_ref<DR, DB>& dout, matrix_ref<GT> dq, matrix_ref<GT> dk,
                               matrix_ref<GT> dv, const attention_backward_options& opt, span<float> workspace,
                               attention_stats* device_stats) {
    using O = std::remove_const_t<OT>;
    constexpr const char* fn = "octet::attention_backward";
    attention::check_device_shape(shape, fn);
    const int Hq = dims.heads_q, Hk = dims.heads_kv, d = dims.head_dim, Tq = dims.total_q, Tk = dims.total_k;
    const bool have_o = !o.empty();
    const attention_backward_workspace ws = attention_backward_workspace_for(shape);
    OCTET_REQUIRE(workspace.size() >= ws.floats, fn, "workspace",
                  detail::message("has ", workspace.size(),
                                  " floats but needs attention_backward_workspace_for(shape).floats = ", ws.floats));
    const float scale = dims.scale;
    const bool tele = opt.telemetry;
    if (device_stats) {
        cuda::require_device_accessible(device_stats, fn, "device_stats");
        OCTET_CUDA_CHECK(cudaMemsetAsync(device_stats, 0, sizeof(attention_stats), ex.stream));
    }
    if (Tq == 0 && Tk == 0) return;
    attention::require_fp8_device(fn);
    attention::check_device_operand(q, fn, "q");
    attention::check_device_operand(k, fn, "k");
    attention::check_device_operand(v, fn, "v");
    attention::check_device_operand(dout, fn, "dout");
    cuda::require_device_accessible(workspace.data(), fn, "workspace");
    if (Tq > 0) cuda::require_device_accessible(lse.data(), fn, "lse");
    const bool wgmma = attention::uses_wgmma(opt.kernel, fn);

    float* wsp = workspace.data();
    float* delta = wsp + ws.row_array(row_delta);
    float* delta_out = wsp + ws.row_array(row_delta_from_output);
    float* acc = wsp + ws.dq_accum;
    const std::size_t dq_floats = static_cast<std::size_t>(Tq) * Hq * d;
    OCTET_CUDA_CHECK(cudaMemsetAsync(wsp, 0, (ws.dq_accum + dq_floats) * sizeof(float), ex.stream));

    attention::bwd_inputs<QR, KR, VR, DR> in{
        q,
        k,
        v,
        dout,
        lse.data(),
        shape.device_cu_seqlens_q,
        shape.device_cu_seqlens_k ? shape.device_cu_seqlens_k : shape.device_cu_seqlens_q,
        Hq,
        Hq / Hk,
        Tq,
        scale,
        attention::mul(scale, attention::log2e),
        opt.mask == attention_mask::causal};
    attention::bwd_outputs<GT> out{
        delta, acc, dk.data, dv.data, dk.ld, dv.ld, tele ? wsp + ws.row_array(row_residual) : nullptr, ws.rows};
    const int max_q = shape.max_seqlen_q(), max_k = shape.max_seqlen_k();
    // the matched delta kernel and the gradient kernel form P and dP with the same products
    auto launch = [&](auto dim, auto wgmma) {
        constexpr int D = decltype(dim)::value;
        constexpr bool W = decltype(wgmma)::value;
        using namespace attention;
        // D: rowsum(dO * O) when it is the delta, or for the telemetry's gap; sum_j P dP when matched
        if (have_o && Tq > 0 && (opt.delta == delta_mode::from_output || tele)) {
            const int rows = Tq * Hq, per_block = kThreads / 32;
            cuda::launch("attention::delta_output_kernel", delta_output_kernel<D, DR, O>,
                         (rows + per_block - 1) / per_block, kThreads, 0, ex.stream, dout, o.data, o.ld, Hq, Tq,
                         delta_out, opt.delta == delta_mode::from_output ? delta : nullptr);
            OCTET_CUDA_CHECK_LAUNCH();
        }
        bwd_maps maps{};
        if constexpr (W) maps = {tile_map<D>(q, fn), tile_map<D>(k, fn), tile_map<D>(v, fn), tile_map<D>(dout, fn)};
        if (opt.delta == delta_mode::matched && max_q > 0) {
            auto kernel = delta_matched_kernel<D, W, QR, KR, VR, DR>;
            constexpr int smem = delta_smem_bytes<D, W>();
            set_smem(kernel, smem);
            cuda::launch("attention::delta_matched_kernel", kernel,
                         dim3((max_q + kTile - 1) / kTile, Hq, shape.batch()), kThreads, smem, ex.stream, maps, in,
                         delta);
            OCTET_CUDA_CHECK_LAUNCH();
        }
        if (max_k > 0 && W) {
            auto kernel =
                tele ? grad_wgmma_kernel<D, true, QR, KR, VR, DR, GT> : grad_wgmma_kernel<D, false, QR, KR, VR, DR, GT>;
            constexpr int smem = grad_wgmma_smem_bytes<D>();
            set_smem(kernel, smem);
            cuda::launch("attention::grad_wgmma_kernel", kernel,
                         dim3((max_k + kBlockRows - 1) / kBlockRows, Hk, shape.batch()), kWarpSpecializedThreads, smem,
                         ex.stream, maps, in, out);
            OCTET_CUDA_CHECK_LAUNCH();
        } else if (max_k > 0) {
            auto kernel = tele ? grad_kernel<D, true, QR, KR, VR, DR, GT> : grad_kernel<D, false, QR, KR, VR, DR, GT>;
            constexpr int smem = grad_smem_bytes<D>();
            set_smem(kernel, smem);
            cuda::launch("attention::grad_kernel", kernel, dim3((max_k + kTile - 1) / kTile, Hk, shape.batch()),
                         kThreads, smem, ex.stream, in, out);
            OCTET_CUDA_CHECK_LAUNCH();
        }
        if (dq_floats > 0) {
            cuda::launch("attention::dq_convert_kernel", dq_convert_kernel<GT>,
                         cuda::grid_stride_blocks(dq_floats, 256), 256, 0, ex.stream, acc, dq.data, dq.ld, Tq,
                         static_cast<std::size_t>(Hq) * d);
            OCTET_CUDA_CHECK_LAUNCH();
        }
        if (tele && device_stats && ws.rows > 0) {
            cuda::launch("attention::stats_kernel", stats_kernel, cuda::grid_stride_blocks(ws.rows, 256, 2), 256, 0,
                         ex.stream, wsp, ws.rows, lse.data(), have_o, device_stats);
            OCTET_CUDA_CHECK_LAUNCH();
        }
    };
    if (d == 64 && wgmma)
        launch(std::integral_constant<int, 64>{}, std::true_type{});
    else if (d == 64)
        launch(std::integral_constant<int, 64>{}, std::false_type{});
    else if (wgmma)
        launch(std::integral_constant<int, 128>{}, std::true_type{});
    else
        launch(std::integral_constant<int, 128>{}, std::false_type{});
}

/// octet::attention_forward / attention_backward on a stream (the entries are in attention.hpp).
template <>
struct attention_backend<stream_executor> {
    /// options.fold_dq_residual is host-only: refused before any other argument is read.
    static void require_supported(const attention_backward_options& opt) {
        OCTET_REQUIRE(!opt.fold_dq_residual, "octet::attention_backward", "options.fold_dq_residual",
                      "is set, but folding the dQ residual is host-only (octet::on_host()); the stream overload does "
                      "not implement it: clear it, or run the backward on the host");
    }

    template <class... Args>
    static void forward(const stream_executor& ex, const Args&... args) {
        stream_attention_forward(ex, args...);
    }

    /// extra: the workspace and device_stats of the stream form of octet::attention_backward.
    template <class... Args>
    static void backward(const stream_executor& ex, const Args&... args) {
        stream_attention_backward(ex, args...);
    }
};

}  // namespace detail
}  // namespace octet
