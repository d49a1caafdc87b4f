// octet/comm/sharded.hpp: the building blocks of sharded (FSDP / ZeRO) training without torch, over
// the transport interface of comm/allreduce.hpp (an in-process world in the tests, MPI through
// comm/mpi.hpp). This header needs neither MPI nor CUDA.
//
//   // Gradients: each rank ends with the sum over ranks of its own shard, compressed on the wire.
//   std::vector<float> mine(octet::allreduce_shard(cfg, grad.size(), comm.size(), comm.rank()).count);
//   octet::compressed_reduce_scatter_host(comm, cfg, octet::as_cspan(grad), octet::as_span(mine));
//
//   // Weights: each rank holds a block of rows; every rank gets the whole matrix's quantized copy,
//   // bit for bit the copy quantize<R> makes of the whole matrix on one process.
//   octet::quantized_tensor<octet::recipes::mxfp8_e4m3> w(total_rows, cols);
//   octet::quantized_allgather_host(comm, octet::on_host(), my_rows, w.ref());
//   // ... and W^T's copy (the backward's) from the same gather:
//   octet::quantized_tensor<octet::recipes::mxfp8_e4m3> wt(cols, total_rows);
//   octet::quantized_allgather_host(comm, octet::on_host(), my_rows, w.ref(), wt.ref());
//
// compressed_reduce_scatter_host(comm, cfg, grad, out_shard, options): steps 0-4 of the compressed
// all-reduce (comm/allreduce.hpp: agree on a descriptor, every rank throws together on bad input;
// shards on allreduce_shard's granule; each rank encodes every shard of its gradient, with optional
// stage-1 error feedback; all-to-all; each rank validates the P messages of its shard and sums them
// in rotated coordinates, in rank order 0..P-1), then the inverse transform of that sum into
// out_shard (allreduce_shard(cfg, n, P, rank).count floats; the shard's global indices keep the
// transform consistent). No second encode: one codec rounding per sender and the float sum
// (reduce_scatter_error_bound). Bytes sent per rank: (P-1)/P * encoded bytes of the gradient.
// Host scratch: one block, from options.executor's allocator when one is lent (with_allocator),
// else ::operator new, taken before the first collective (compressed_reduce_scatter_scratch_bytes).
//
// quantized_allgather_host<R>(comm, ex, my_rows, out, options): every rank holds a contiguous
// block of rows of a matrix (rank r's rows follow rank r-1's; counts may differ, including 0); all
// pass the same cols, recipe and out (total rows x cols, the same ld). One descriptor all-gather
// checks that (every rank throws octet::error together on a mismatch) and carries each rank's row
// count and, for per-tensor and two-level (NVFP4) recipes, its amax, so the global amax sizes the
// tensor scale on every rank. Each rank quantizes its rows (with that amax) and the codes (straight
// into out) and the scale rows are all-gathered (two allgatherv). Supported granularities: per
// tensor (also with nan_policy::propagate: a NaN or Inf on any rank makes the whole copy NaN on
// every rank, as one process would), row-local blocks (per_row, block<1, C>: 1x128, MXFP8, NVFP4),
// and blocks of R > 1 rows (128x128) when every rank's rows start on a multiple of R and end on one
// (the last rank with rows may end at the matrix's end); else octet::error. Blocks spanning all rows
// with C != full (per_column) and stochastic rounding fail to compile (static_assert). With out_t
// the same gather also gives the column-wise copy (W^T, what the data gradient multiplies), bit for
// bit quantize()'s: each rank quantizes its rows' transpose, its codes land in out_t's rows at the
// rank's column offset; every rank's rows must then start on a multiple of the recipe's C (x^T's
// blocks run along the matrix's rows); per_row recipes are refused at compile time.
// Host scratch: one block from ex's allocator (quantized_allgather_scratch_bytes), the quantizer's
// own scratch among it.
//
// On NCCL over device buffers: comm/nccl_sharded.cuh (the same contracts; unverified on hardware).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "octet/codec/codec.hpp"
#include "octet/codec/feedback.hpp"
#include "octet/comm/allreduce.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/matrix.hpp"
#include "octet/core/span.hpp"
#include "octet/quant/quantize.hpp"
#include "octet/quant/tensor.hpp"

namespace octet {

// ---- compressed reduce-scatter -------------------------------------------------------------------

struct reduce_scatter_options {
    /// Throw unless the communicator has this many ranks (0: any).
    int expected_ranks = 0;
    /// Error feedback: a residual of the whole gradient (n elements), original coordinates (the
    /// all-reduce's stage-1 residual: the same octet::error_feedback type and rule).
    residual_view feedback{};
    /// Host threads for encoding and decoding, and the allocator of the scratch block.
    host_executor executor = on_host();
    /// Test hook: called with each message (destination rank, bytes) before it is sent.
    std::function<void(int, span<std::uint8_t>)> tamper{};
};

struct reduce_scatter_report {
    int world = 0;
    shard_range shard{};             ///< the elements of the gradient this rank's output holds
    std::size_t bytes_sent = 0;      ///< bytes this rank sent to other ranks
    std::size_t bytes_received = 0;  ///< bytes this rank received from other ranks
    std::size_t float_bytes = 0;     ///< what a float reduce-scatter would send: 4 n (P-1)/P, this rank's part
    double agree_s = 0, encode_s = 0, exchange_s = 0, reduce_s = 0;
    double total_s() const { return agree_s + encode_s + exchange_s + reduce_s; }
};

/// Worst-case ||result - sum_r g_r|| of compressed_reduce_scatter_host without feedback, over the
/// whole gradient (every rank's out_shard one after another), given sum_of_norms = sum_r ||g_r||
/// and norm_of_sum = ||sum_r g_r||: the rounding of every sender's messages, the float sum of P
/// dequantized shards, and the inverse transform of the sum (derived as allreduce_error_bound,
/// without its stage 2).
inline double reduce_scatter_error_bound(const codec_config& cfg, std::size_t n, int world, double sum_of_norms,
                                         double norm_of_sum);

/// Bytes of host scratch compressed_reduce_scatter_host takes on rank `rank` of `world` for an
/// n-element gradient on the host executor ex (only whether options.feedback is empty is read):
/// one block, the P messages this rank sends and the P it receives, per-rank arrays, and the
/// largest scratch of one codec call inside (an encode of a shard; the sum and inverse transform
/// of this rank's shard, a span of floats per thread and a transform block).
inline std::size_t compressed_reduce_scatter_scratch_bytes(const host_executor& ex, const codec_config& cfg,
                                                           std::size_t n, int world, int rank,
                                                           const reduce_scatter_options& opt = {});

/// The compressed reduce-scatter over any transport (see the header comment): out_shard <- the sum
/// over ranks of grad's elements allreduce_shard(cfg, grad.size(), P, rank). Every rank ends with
/// its own shard; bad arguments on any rank make every rank throw octet::error.
template <class Transport>
reduce_scatter_report compressed_reduce_scatter_host(Transport& comm, const codec_config& cfg, span<const float> grad,
                                                     span<float> out_shard, const reduce_scatter_options& opt = {},
                                                     const char* fn = "octet::compressed_reduce_scatter");

// ---- quantized all-gather ---------------------------------------------------------------------

struct quantized_allgather_options {
    /// Throw unless the communicator has this many ranks (0: any).
    int expected_ranks = 0;
};

struct quantized_allgather_report {
    int world = 0;
    std::size_t row_offset = 0;      ///< this rank's first row in the whole matrix
    std::size_t rows = 0;            ///< the whole matrix's rows (the sum of every rank's)
    float amax = 0.0f;               ///< per-tensor and two-level recipes: the whole matrix's finite amax
    std::size_t bytes_sent = 0;      ///< codes and scales this rank sent to other ranks
    std::size_t bytes_received = 0;  ///< codes and scales this rank received from other ranks
    std::size_t float_bytes_sent = 0, bf16_bytes_sent = 0;  ///< what gathering its rows as float / bf16 sends
    double agree_s = 0, quantize_s = 0, gather_s = 0;
    double total_s() const { return agree_s + quantize_s + gather_s; }
};

/// Bytes of host scratch quantized_allgather_host<Recipe>(comm, ex, my_rows, out) takes on a
/// communicator of `world` ranks (one block from ex's allocator): the descriptors and per-rank
/// counts, this rank's codes and scales, every rank's scales, and quantize's own scratch.
template <class Recipe, class T>
std::size_t quantized_allgather_scratch_bytes(const host_executor& ex, matrix_ref<T> my_rows, quantized_ref<Recipe> out,
                                              int world);

/// The same for the call with out_t (either copy may be absent, {}): also this rank's column-wise
/// codes and scales and every rank's.
template <class Recipe, class T>
std::size_t quantized_allgather_scratch_bytes(const host_executor& ex, matrix_ref<T> my_rows, quantized_ref<Recipe> out,
                                              quantized_ref<Recipe> out_t, int world);

/// The quantized all-gather over any transport (see the header comment): out <- the quantized
/// copy of the whole matrix (every rank's my_rows, in rank order), bit for bit quantize<Recipe> of
/// the whole matrix on one process. my_rows: float, bf16 or fp16, either layout.
template <class Recipe, class Transport, class T>
quantized_allgather_report quantized_allgather_host(Transport& comm, const host_executor& ex, matrix_ref<T> my_rows,
                                                    quantized_ref<Recipe> out,
                                                    const quantized_allgather_options& opt = {},
                                                    const char* fn = "octet::quantized_allgather");

/// The same with the column-wise copy: out_t <- the quantized copy of the whole matrix's transpose
/// (cols x the sum of every rank's rows), bit for bit what quantize<Recipe>(ex, whole, out, out_t)
/// writes into its columnwise output on one process, from the same gather (one agreement, one
/// amax; each rank quantizes its rows both ways). Either copy may be absent ({}): a backward that
/// needs W^T alone gathers out_t alone. x^T's blocks run C along the matrix's rows, so with out_t
/// every rank's rows must start on a multiple of C (block<R, C>; the packing group, 2 codes for FP4
/// and 4 for FP6, for per-tensor recipes) and end on one, but for the last rows; else every rank
/// throws octet::error. per_row recipes (x^T's blocks would span every rank) fail to compile.
template <class Recipe, class Transport, class T>
quantized_allgather_report quantized_allgather_host(Transport& comm, const host_executor& ex, matrix_ref<T> my_rows,
                                                    quantized_ref<Recipe> out, quantized_ref<Recipe> out_t,
                                                    const quantized_allgather_options& opt = {},
                                                    const char* fn = "octet::quantized_allgather");

}  // namespace octet

#include "octet/comm/detail/sharded.hpp"  // IWYU pragma: export
