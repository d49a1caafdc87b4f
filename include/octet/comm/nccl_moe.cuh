// octet/comm/nccl_moe.cuh: the expert-parallel token exchange of nn/moe_exchange.hpp (dispatch and
// combine) over NCCL, the rows in device memory, on a CUDA stream: the same contracts, the same
// agreement and the same bits as moe_dispatch_plan_host, moe_dispatch_host, moe_dispatch_rows_host
// and moe_combine_host.
//
// UNVERIFIED ON HARDWARE: written and compiled (nvcc), registered in the device suite
// (tests/mpi/nn_moe_nccl.cu, a gpu test that compares every rank's result with the host exchange
// over the in-process transport bit for bit, one rank per GPU), but not yet run on a GPU, nor with
// two or more GPUs.
//
//   octet::nccl_communicator comm(nccl_comm, stream);                          // comm/nccl.cuh
//   const octet::stream_executor ex = octet::on_stream(stream);
//   octet::moe_exchange xch(comm.size(), comm.rank(), experts);
//   octet::dispatch_plan plan(tokens, k, experts);
//   octet::moe_dispatch_plan(comm, ex, indices, {}, plan.ref(), xch.ref());  // indices, plan, xch: host
//   octet::moe_dispatch(comm, ex, xq, plan.ref(), xch.ref(), xe);             // xq, xe: device
//   // ... this rank's experts on xe (grouped_scaled_gemm on the stream) ...
//   octet::moe_combine(comm, ex, y, weights, plan.ref(), xch.ref(), out);     // y, weights, out: device
//
// What is where. The routing (indices), the dispatch plan and the exchange record stay on the host,
// as the host exchange keeps them: they size the transfers, which NCCL needs on the host anyway.
// The rows move in device memory: X's quantized rows (codes and scales), the grouped copy the
// owner receives, the experts' outputs y, the weights and the combined out.
//
// Agreement. Each entry runs the host exchange's step 0 unchanged (its local checks, then the
// failure flag, the descriptors and every rank's per-expert counts, compared on the host: a bad
// argument or a mismatch on any rank makes every rank throw octet::error before any row moves),
// its all-gathers carried by ncclAllGather through a small device buffer (one stream
// synchronization each: three per call). moe_dispatch_plan is moe_dispatch_plan_host over that
// transport (its errors name moe_dispatch_plan_host).
//
// Rows. moe_dispatch: a kernel packs the plan's rows (each its codes, then its scales, as the host
// packs them) into a send buffer, one group of ncclSend / ncclRecv moves every rank's rows to their
// owners (a rank's own rows too), and a kernel places them in out's grouped layout (out is zeroed
// first, so its padding bytes and padding scale rows are 0, as the host writes them). The per-row
// source and destination offsets are computed on the host, exactly as the host exchange computes
// them, and uploaded with the call. moe_combine: a kernel rounds the experts' outputs to bf16 (or
// copies them as float: moe_combine_wire::f32) into the send buffer in the dispatch's receive order,
// the same send / receive group moves them back, and a kernel forms out_t = sum_j w_tj y[row of
// (t, j)] in slot order in float (separate multiply and add, rounded each: what the host's combine
// computes) and options.returned. The E4M3 combine wire (moe_combine_wire::e4m3_1x128) is not
// offered here yet: every rank throws octet::error naming it.
//
// Scratch and synchronization: every device temporary (the agreement's buffers, one block for the
// send and receive rows and the row tables) comes from ex's allocator (with_allocator) or
// cudaMallocAsync, stream-ordered; the host metadata from options.executor's allocator, as the host
// exchange takes it. Each entry synchronizes the stream for its agreement (three times) and once
// at its end (the report's timings); options.executor's threads are not used for rows. NCCL needs one
// GPU per rank; the communicator's stream is not used (everything is enqueued on ex.stream).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "octet/comm/nccl.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/nn/moe_exchange.hpp"

namespace octet {

/// moe_dispatch_plan_host over NCCL: plan_dispatch on this rank's indices (host), then the counts'
/// exchange through ncclAllGather; fills xch (host). Collective.
template <class Comm, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int> = 0>
moe_exchange_report moe_dispatch_plan(Comm& comm, const stream_executor& ex, matrix_ref<const std::int32_t> indices,
                                      const dispatch_options& dopt, const dispatch_plan_ref& plan,
                                      const moe_exchange_ref& xch, const moe_exchange_options& opt = {});

/// moe_dispatch_host over NCCL: x (device memory, tokens x d, a row-local recipe with one level of
/// scales) sent in plan's order to the experts' owners; out (device memory, layout
/// make_grouped_layout<Recipe>(grouped_rows(xch.expert_rows, d)) on the host) receives this rank's
/// experts' rows, bit for bit what moe_dispatch_host writes. Collective.
template <class Recipe, class Comm, class Byte, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int> = 0>
moe_exchange_report moe_dispatch(Comm& comm, const stream_executor& ex, quantized_ref<Recipe, Byte> x,
                                 const dispatch_plan_ref& plan, const moe_exchange_ref& xch,
                                 grouped_quantized_ref<Recipe> out, const moe_exchange_options& opt = {});

/// moe_dispatch_rows_host over NCCL (the backward's dY): rows (device memory) holds plan.rows()
/// rows in plan order.
template <class Recipe, class Comm, class Byte, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int> = 0>
moe_exchange_report moe_dispatch_rows(Comm& comm, const stream_executor& ex, quantized_ref<Recipe, Byte> rows,
                                      const dispatch_plan_ref& plan, const moe_exchange_ref& xch,
                                      grouped_quantized_ref<Recipe> out, const moe_exchange_options& opt = {});

/// moe_combine_host over NCCL: y (device memory, xch.rows() x d, float or bf16, in the received
/// order) back to each row's source rank (bf16 or f32 wire), out (device memory, tokens x d) <- the
/// weighted sum with weights (device memory, tokens x k), bit for bit moe_combine_host's; with
/// options.returned (device memory, plan.rows() x d float) the rows as they came back. Collective.
template <class Comm, class Y, class Out, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int> = 0>
moe_exchange_report moe_combine(Comm& comm, const stream_executor& ex, matrix_ref<Y> y, matrix_ref<const float> weights,
                                const dispatch_plan_ref& plan, const moe_exchange_ref& xch, matrix_ref<Out> out,
                                const moe_exchange_options& opt = {});

}  // namespace octet

#include "octet/comm/detail/nccl_moe.cuh"  // IWYU pragma: export
