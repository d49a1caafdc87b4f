// octet/attention/attention.cuh: FP8 attention forward and backward on a CUDA stream (sm_89+:
// FP8 mma.sync; the forward also on FP8 wgmma for sm_90a; built for sm_90a and sm_89).
//
//   octet::attention_forward(octet::on_stream(s), shape, q, k, v, o, lse, opt);
//   octet::attention_backward(octet::on_stream(s), shape, q, k, v, o, lse, dout, dq, dk, dv, workspace, bopt,
//   device_stats);
//
// The backend of the entries in attention.hpp (attention_backend<stream_executor>), which check the
// arguments every executor shares once; the stream backward's own form, with its workspace, is
// below. Same arguments, layout and numerics as the host forms (attention.hpp, which see), with
// device memory everywhere, plus: `shape.device_cu_seqlens_q/_k` (device copies of the offsets),
// and for the backward a float workspace of attention_backward_workspace_for(shape).floats
// (row arrays and the float dQ accumulator; its row arrays hold the per-row telemetry afterwards,
// see attention_row_array) and, optionally, `device_stats`: one attention_stats in device memory
// that receives the telemetry summary (with options.telemetry). Nothing is synchronized and nothing
// is allocated. options.fold_dq_residual is host-only: the stream backward rejects it.
//
// Kernels (64-row tiles, 16 rows per warp; options.kernel chooses mma.sync or wgmma, automatic takes
// wgmma where it can run):
//   forward:  loops over 64-key tiles in options.key_order, S = Q K^T and O += P V on FP8 tensor
//             cores, online softmax in registers (the same forward_softmax_tile in both kernels).
//             - forward_kernel (FlashAttention-2's structure; block = (64-query tile, head,
//               sequence), 4 warps): double-buffered cp.async, FP8 mma.sync with P passed in
//               registers (sm_89; on Hopper it compiles to FP16 HMMA with conversions).
//             - forward_wgmma_kernel (sm_90a, FlashAttention-3's structure; block = 128 queries):
//               a producer warpgroup loads Q, K and V with TMA into a 4-stage mbarrier ring and
//               transposes V there; two consumer warpgroups (64 queries each) issue wgmma m64n64k32
//               for S and m64nDk32 for P V with P from registers (QGMMA), in turns (ping-pong), each
//               overlapping the next tile's S and softmax with the running P V.
//   delta:    from_output: one warp per query row (rowsum(dO * O)); matched: block = (query tile,
//             head, sequence) recomputing S^T and dP^T tile by tile with the very code the
//             gradient kernels use (tile_p_dp), so D_i = sum_j P_ij dP_ij is formed from the same
//             bits as the dS it enters.
//   gradient: each 64-key tile loops over the query heads of its group and their 64-query tiles
//             (grad_step, shared by both kernels); dK and dV stay in registers, dQ goes to a float
//             accumulator with atomics (converted to the output type at the end).
//             - grad_kernel (block = (64-key tile, key/value head, sequence), 4 warps): cp.async
//               into two stages, FP8 mma.sync (sm_89).
//             - grad_wgmma_kernel (sm_90a; block = 128 keys): a producer warpgroup loads Q and dO
//               with TMA into a 2-stage ring and transposes them there; two consumer warpgroups
//               (64 keys each) form every product with QGMMA: S^T and dP^T (tile_p_dp) and dQ from
//               shared memory, dV and dK with their A operands (P'^T, dS^T) from registers.
// Head dims 64 and 128. P and dS reach the next product through registers (see detail/tiles.cuh).
//
// This header holds the stream form of the backward; the forward's entry, the types and the
// options are attention.hpp's. The code is in detail/, one kernel family per file: forward.cuh
// (forward_kernel, forward_wgmma_kernel), delta.cuh (delta_output_kernel, delta_matched_kernel),
// grad.cuh (grad_kernel, grad_wgmma_kernel) with grad_step.cuh (the step both run), finalize.cuh
// (dq_convert_kernel, stats_kernel); backward_tiles.cuh and kernel_common.cuh hold what several
// families share, tiles.cuh and fragments.hpp the tile machinery, launch.cuh the launch helpers and
// stream.cuh the stream backend (attention_backend<stream_executor>) that enqueues them.
#pragma once

#include <cuda_runtime.h>

#include "octet/attention/attention.hpp"
#include "octet/attention/detail/stream.cuh"
#include "octet/cuda/executor.cuh"

namespace octet {

/// The backward on a CUDA stream: the host form's arguments (attention.hpp; device memory, see the
/// header comment) plus `workspace`, at least attention_backward_workspace_for(shape).floats floats
/// of device memory, and `device_stats` (device memory for one attention_stats, or null), which
/// replace the host's returned summary and `rows`. Goes through the same entry as the host form
/// (attention_backward_entry: the shared checks once), then enqueues on ex.stream memsets of
/// device_stats and the workspace and the delta, gradient, dQ conversion and (with telemetry and
/// device_stats) stats kernels. Allocates nothing and never synchronizes.
template <class QR, class QB, class KR, class KB, class VR, class VB, class OT, class DR, class DB, class GT>
void attention_backward(const stream_executor& ex, const attention_shape& shape, const quantized_ref<QR, QB>& q,
                        const quantized_ref<KR, KB>& k, const quantized_ref<VR, VB>& v, matrix_ref<OT> o,
                        span<const float> lse, const quantized_ref<DR, DB>& dout, matrix_ref<GT> dq, matrix_ref<GT> dk,
                        matrix_ref<GT> dv, span<float> workspace, const attention_backward_options& opt = {},
                        attention_stats* device_stats = nullptr) {
    detail::attention_backward_entry(ex, shape, q, k, v, o, lse, dout, dq, dk, dv, opt, workspace, device_stats);
}

}  // namespace octet
