// octet/comm/nccl_sharded.cuh: the building blocks of sharded training (comm/sharded.hpp) over NCCL,
// on device buffers and a CUDA stream: the same contracts, the same agreement and the same bits as
// compressed_reduce_scatter_host and quantized_allgather_host.
//
// UNVERIFIED ON HARDWARE: written and compiled (nvcc, sm_90a), registered in the device suite
// (tests/mpi/comm_nccl_sharded.cu, a gpu test that compares every rank's result with the host
// version bit for bit), but not yet run on a GPU, nor with two or more GPUs.
//
//   octet::nccl_communicator comm(nccl_comm, stream);                      // comm/nccl.cuh
//   const octet::stream_executor ex = octet::on_stream(stream);            // or with_allocator(...)
//   // Gradients: out_shard (device) <- the sum over ranks of this rank's shard of grad (device).
//   octet::compressed_reduce_scatter(comm, ex, cfg, grad, out_shard);
//   // Weights: out (device) <- the quantized copy of the whole matrix, from every rank's rows.
//   octet::quantized_allgather<octet::recipes::mxfp8_e4m3>(comm, ex, my_rows, out);
//
// compressed_reduce_scatter: steps 0-4 of comm/nccl.cuh's all-reduce, then the inverse transform:
// the ranks all-gather a descriptor (ncclAllGather) and compare it on the host (every rank throws
// octet::error together on bad or mismatched arguments, before any data moves); each rank encodes
// its P shard messages (codec.cuh kernels, optional stage-1 feedback), exchanges them with grouped
// ncclSend/ncclRecv, validates the P messages of its shard on the device and all-reduces an error
// flag (ncclMax; every rank throws together on an invalid message), and one decode kernel sums
// them in rotated coordinates in rank order and transforms the sum back into out_shard. Results,
// bytes and the error bound are compressed_reduce_scatter_host's (reduce_scatter_error_bound).
// Synchronizes the stream three times (the descriptors, the error flag, the timings at the end).
//
// quantized_allgather<R>: every rank's rows (device memory, float/bf16/fp16, either layout) are a
// contiguous block of the matrix in rank order; out (device memory) is the whole matrix. A kernel
// measures this rank's finite amax (per-tensor and two-level recipes) and whether it holds a NaN or
// Inf (per-tensor under nan_policy::propagate) into its descriptor, which is all-gathered and
// compared on the host (every rank throws together); each rank quantizes its rows on the device
// (quantize.cuh, with the whole matrix's amax) straight into its rows of out.data; the codes and the
// scale grids go to every rank with grouped ncclBroadcast (one per rank that holds rows), and the
// scales are placed in out.scales with one cudaMemcpy2DAsync per rank. The same recipes, shard
// rules and errors as quantized_allgather_host; the result is bit for bit quantize<R> of the whole
// matrix. Synchronizes the stream twice (the descriptors, the timings at the end). With out_t the
// same gather also gives the column-wise copy (W^T), bit for bit quantized_allgather_host's.
//
// Device scratch: both take every temporary from ex's allocator (with_allocator), else
// cudaMallocAsync, stream-ordered: the descriptors (one small request, before the agreement; a rank
// that cannot take it leaves the others waiting, as comm/nccl.cuh's all-reduce does), one
// block for the rest (taken inside the local checks: a rank that cannot take it stops every rank),
// and quantized_allgather's quantize call its own (quantize_scratch_bytes). The *_scratch_bytes
// queries below give the sum of those requests, each rounded up to 256 bytes. NCCL needs one GPU
// per rank; the communicator's stream is not used (everything is enqueued on ex.stream).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <type_traits>

#include "octet/comm/nccl.cuh"
#include "octet/comm/sharded.hpp"
#include "octet/cuda/executor.cuh"
#include "octet/quant/quantize.cuh"

namespace octet {

/// Bytes of device scratch compressed_reduce_scatter(comm, ex, cfg, grad, out_shard, opt) requests
/// from ex's allocator on rank `rank` of `world` for an n-element gradient: the descriptors
/// (80 (P + 1)), and one block of the P messages this rank sends, the P it receives, their expected
/// headers and the validation flags. The same for every rank but for the rounding of the shards.
inline std::size_t compressed_reduce_scatter_scratch_bytes(const stream_executor& ex, const codec_config& cfg,
                                                           std::size_t n, int world, int rank,
                                                           const reduce_scatter_options& opt = {});

/// The compressed reduce-scatter over NCCL (see the header comment): out_shard (device memory,
/// allreduce_shard(cfg, grad.size(), P, rank).count floats) <- the sum over ranks of that shard of
/// grad (device memory), bit for bit compressed_reduce_scatter_host's result for the same inputs.
/// options.feedback: device memory; options.executor is not used (the work runs on ex); options.tamper
/// sees each message in device memory. A template (Comm is always nccl_communicator, deduced) so
/// that only callers compile the codec's kernels.
template <class Comm, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int> = 0>
reduce_scatter_report compressed_reduce_scatter(Comm& comm, const stream_executor& ex, const codec_config& cfg,
                                                span<const float> grad, span<float> out_shard,
                                                const reduce_scatter_options& opt = {});

/// Bytes of device scratch quantized_allgather<Recipe>(comm, ex, my_rows, out) requests from ex's
/// allocator on a communicator of `world` ranks: the descriptors (104 (P + 1)), one block (this
/// rank's scale grid, every rank's, the local tensor scales and the global amax), and the quantize
/// call's own request (quantize_scratch_bytes with the amax given on the device).
template <class Recipe, class T>
std::size_t quantized_allgather_scratch_bytes(const stream_executor& ex, matrix_ref<T> my_rows,
                                              quantized_ref<Recipe> out, int world);

/// The same for the call with out_t (either copy may be absent, {}): the block also holds every
/// rank's column-wise codes and scale grid.
template <class Recipe, class T>
std::size_t quantized_allgather_scratch_bytes(const stream_executor& ex, matrix_ref<T> my_rows,
                                              quantized_ref<Recipe> out, quantized_ref<Recipe> out_t, int world);

/// The quantized all-gather over NCCL (see the header comment): out (device memory) <- the
/// quantized copy of the whole matrix (every rank's my_rows, device memory, in rank order), bit for
/// bit quantized_allgather_host's (and quantize<Recipe>'s of the whole matrix on one process).
template <class Recipe, class Comm, class T, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int> = 0>
quantized_allgather_report quantized_allgather(Comm& comm, const stream_executor& ex, matrix_ref<T> my_rows,
                                               quantized_ref<Recipe> out, const quantized_allgather_options& opt = {});

/// The same with the column-wise copy (comm/sharded.hpp's quantized_allgather_host with out_t):
/// out_t (device memory, cols x the whole matrix's rows) <- quantize<Recipe>'s columnwise copy of
/// the whole matrix, from the same gather; either copy may be absent ({}). Each rank quantizes its
/// rows both ways in one quantize call (its x^T codes and scales into its place in the block), the
/// pieces travel in the same group of broadcasts, and two cudaMemcpy2DAsync per rank place them.
template <class Recipe, class Comm, class T, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int> = 0>
quantized_allgather_report quantized_allgather(Comm& comm, const stream_executor& ex, matrix_ref<T> my_rows,
                                               quantized_ref<Recipe> out, quantized_ref<Recipe> out_t,
                                               const quantized_allgather_options& opt = {});

}  // namespace octet

#include "octet/comm/detail/nccl_sharded.cuh"  // IWYU pragma: export
