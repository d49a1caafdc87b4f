// octet/nn/moe_exchange.hpp: expert parallelism for the FP8 mixture-of-experts layer: the token
// exchange between ranks (dispatch and combine) over the transport interface of comm/allreduce.hpp
// (in-process ranks, comm/in_process.hpp; MPI, comm/mpi.hpp). Host executor; needs neither MPI nor CUDA.
//
//   octet::moe_exchange xch(comm.size(), comm.rank(), experts);    // rank r owns experts [r E/P, (r+1) E/P)
//   octet::dispatch_plan plan(tokens, k, experts);
//   octet::moe_dispatch_plan_host(comm, indices, {}, plan.ref(), xch.ref());    // local plan, counts exchanged
//   octet::grouped_quantized_tensor<R> xe(octet::grouped_rows(xch.ref().expert_rows, d));
//   octet::moe_dispatch_host(comm, xq.cref(), plan.ref(), xch.ref(), xe.ref());  // FP8 rows to their experts
//   octet::grouped_scaled_gemm(ex, xe.cref(), my_experts_weights, y);           // this rank's experts
//   octet::moe_combine_host(comm, y, weights, plan.ref(), xch.ref(), out);       // back, weighted sum
//
// Ownership. With P ranks and E experts (E a multiple of P), rank r owns the L = E / P experts
// [r L, (r + 1) L). Every rank routes its own tokens over all E experts (route), and plans their
// dispatch locally (plan_dispatch's expert-sorted order, its capacity per expert applied to this
// rank's assignments): the rows of expert e's group go to e's owner. The experts of one owner are
// contiguous, so the rows a rank sends to owner q are the plan's rows [group_offsets[q L],
// group_offsets[(q + 1) L]), in plan order, and the rows that come back from q land in the same place.
//
// moe_dispatch_plan_host: plan_dispatch on this rank's indices, then an all-gather of each rank's
// descriptor and one of its per-expert row counts, from which each rank fills its exchange record
// (moe_exchange_ref): recv_counts[q L + e] rows of its local expert e come from rank q, and
// expert_rows[e] = their sum (grouped_rows' sizes for the received copy).
//
// moe_dispatch_host: each rank sends the quantized rows (codes and scales, X quantized once with a
// row-local recipe: per_row or block<1, C> such as 1x128 or MXFP8, one level of scales) of the tokens
// routed to each expert to the expert's owner (one alltoallv); the owner receives its experts' rows
// in the m-grouped contiguous layout of grouped_scaled_gemm (group e: make_grouped_layout of
// grouped_rows(expert_rows, d)), within a group in a fixed order: by source rank, then in the source's
// plan order. Row i of the received copy comes from moe_exchange_ref::source_of(i). The result is,
// bit for bit, groups [r L, (r + 1) L) of what permute_quantized gives on one process for the tokens
// of all ranks stacked in rank order (with the same kept assignments), padding included.
// Bytes per row on the wire: the row's codes and its scales (1x128 E4M3: d + 4 ceil(d / 128), against
// 2 d for bf16 rows).
//
// moe_combine_host: the reverse. The owner's expert outputs y (expert_rows' rows in the received
// order, float or bf16) go back to each row's source rank, rounded to bf16 (round to nearest even,
// the default) or quantized to E4M3 with a float scale per 1 x 128 block (recipes::blockwise_1x128,
// moe_combine_wire::e4m3_1x128: about half the bytes, one more rounding of relative size 2^-4), or
// sent as float (moe_combine_wire::f32, twice bf16's bytes); each rank then forms out_t = sum_j w_tj
// y[row of (t, j)] with octet::combine, in slot order in float. So out is bit for bit combine(ex, Y',
// weights, plan, out) on this rank alone, Y' the expert outputs of its rows in plan order rounded to
// bf16 (or quantized to 1x128 E4M3 and dequantized to float, or as they were), however the ranks are
// run: the same bits in-process and over MPI.
//
// Agreement and errors. Each entry first validates its arguments on every rank (shapes, the plan's
// counts that must sum to its rows, expert indices in range, the record's world, rank and expert
// count, under 2 GiB to send and to receive: transports count bytes in int), takes its one block
// of scratch, and exchanges a failure flag (allreduce_max): a rank that fails stops every rank with
// octet::error. Then one all-gather of a descriptor (world, experts, d, recipe, combine wire,
// expected ranks) and one of each rank's per-expert counts; a mismatch (another world size or
// expert count on one rank, or an exchange record that does not match the counts the other ranks
// send) makes every rank throw octet::error, the same decision everywhere, before any payload
// moves: none is left waiting.
//
// Scratch: every temporary (the gathered descriptors and counts, the per-rank counts and offsets,
// the send and receive buffers, and for the FP8 combine the quantized rows, their quantizer's scratch
// and the dequantized rows) is ONE block from options.executor's allocator when one is lent
// (with_allocator), else ::operator new, taken before the first collective
// (moe_dispatch_plan_scratch_bytes, moe_dispatch_scratch_bytes, moe_combine_scratch_bytes). The
// transport's own buffers are the transport's. Each call reports the rows and bytes it sent to and
// received from other ranks (a rank's rows for its own experts are copied, not counted).
//
// Backward: the same exchanges the other way round. With options.returned set in the forward's
// combine (the rows as they came back, float), each rank forms dY and dweights locally, sends dY's
// quantized rows to the experts' owners, and gets dX's rows back summed per token:
//
//   octet::combine_backward(ex, dout, returned, weights, plan.ref(), dy, dweights);  // dweights -> route_backward
//   octet::quantize<GR>(ex, dy, dyq.ref());                     // plan.rows() x d, a row-local gradient recipe
//   octet::moe_dispatch_rows_host(comm, dyq.cref(), plan.ref(), xch.ref(), dye.ref());   // dY_e at the owner
//   // ... the experts' backward: dX_e rows in the received order ...
//   octet::moe_combine_host(comm, dx_e, ones, plan.ref(), xch.ref(), dx);   // weights of 1: dX_t = sum of t's rows
//
// The same exchange over NCCL on a stream (rows in device memory): octet/comm/nccl_moe.cuh; from
// Python over torch.distributed: octet.torch.moe (expert_parallel_dispatch / _combine).
//
// This header holds the types, the options and the entries; their implementation is in
// octet/nn/detail/moe_exchange.hpp, which it includes at its end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "octet/core/executor.hpp"
#include "octet/core/matrix.hpp"
#include "octet/core/span.hpp"
#include "octet/gemm/grouped_gemm.hpp"
#include "octet/nn/moe_routing.hpp"
#include "octet/quant/tensor.hpp"

namespace octet {

/// How moe_combine_host sends the experts' outputs back.
enum class moe_combine_wire {
    bf16,        ///< bf16 rows, round to nearest even (DeepSeek-V3's combine): 2 d bytes a row
    e4m3_1x128,  ///< E4M3 codes with a float scale per 1 x 128 block (recipes::blockwise_1x128)
    f32,         ///< float rows, not rounded: 4 d bytes a row (a backward's dX that must stay exact)
};

struct moe_exchange_options {
    /// Throw unless the communicator has this many ranks (0: any).
    int expected_ranks = 0;
    /// Host threads for packing and unpacking, and the allocator of the scratch block.
    host_executor executor = on_host();
    /// moe_combine_host's wire format (every rank must pass the same).
    moe_combine_wire combine_wire = moe_combine_wire::bf16;
    /// moe_combine_host: where to keep the rows as they came back (plan.rows() x d, float, in plan
    /// order: the bf16 values, the E4M3 rows dequantized, or the float rows), which combine_backward
    /// reads for the backward's dweights; {} keeps none.
    matrix_ref<float> returned{};
};

/// Where a row an owner received came from: the index-th row of `expert`'s group in rank `rank`'s
/// dispatch plan (its rows of that expert, in its plan order).
struct moe_row_source {
    int rank = 0;
    std::size_t expert = 0;  ///< the global expert index
    std::size_t index = 0;
};

/// One rank's exchange record, in caller buffers (moe_exchange owns them): filled by
/// moe_dispatch_plan_host, read by moe_dispatch_host, moe_dispatch_rows_host and moe_combine_host.
struct moe_exchange_ref {
    int world = 0;                  ///< P
    int rank = 0;                   ///< this rank
    std::size_t experts = 0;        ///< E, over all ranks (a multiple of P)
    span<std::size_t> recv_counts;  ///< [P L]: rows of local expert e from rank q at [q L + e]
    span<std::size_t> expert_rows;  ///< [L]: rows of each local expert (the sum over q)

    /// L = E / P, the experts this rank owns.
    std::size_t local_experts() const { return world > 0 ? experts / static_cast<std::size_t>(world) : 0; }
    /// The first expert this rank owns (r L).
    std::size_t first_expert() const { return static_cast<std::size_t>(rank) * local_experts(); }
    /// Rows this rank receives (the sum of expert_rows).
    std::size_t rows() const;
    /// Where received row i (0 <= i < rows(), in the grouped order) came from.
    moe_row_source source_of(std::size_t i) const;
};

/// An exchange record that owns its buffers.
class moe_exchange {
public:
    moe_exchange() = default;
    moe_exchange(int world, int rank, std::size_t experts)
        : world_(world),
          rank_(rank),
          experts_(experts),
          recv_counts_(world > 0 ? experts / static_cast<std::size_t>(world) * static_cast<std::size_t>(world) : 0),
          expert_rows_(world > 0 ? experts / static_cast<std::size_t>(world) : 0) {}
    moe_exchange_ref ref() { return {world_, rank_, experts_, as_span(recv_counts_), as_span(expert_rows_)}; }

private:
    int world_ = 0, rank_ = 0;
    std::size_t experts_ = 0;
    std::vector<std::size_t> recv_counts_, expert_rows_;
};

/// What an exchange reports. Rows and bytes to and from OTHER ranks.
struct moe_exchange_report {
    int world = 0;
    std::size_t rows_sent = 0, rows_received = 0;
    std::size_t bytes_sent = 0, bytes_received = 0;  ///< the payload (codes and scales, or bf16 or float rows)
    std::size_t bf16_bytes_sent = 0;                 ///< what sending the same rows as bf16 would send (2 d a row)
    std::size_t agreement_bytes = 0;  ///< this rank's part of the agreement's all-gathers (descriptor, counts)
    dispatch_result dispatch{};       ///< moe_dispatch_plan_host: this rank's kept and dropped assignments
    double agree_s = 0, pack_s = 0, exchange_s = 0, unpack_s = 0;
    double total_s() const { return agree_s + pack_s + exchange_s + unpack_s; }
};

// ---- plan ------------------------------------------------------------------------------------------

/// Bytes of host scratch moe_dispatch_plan_host takes (one block): every rank's descriptor and counts.
std::size_t moe_dispatch_plan_scratch_bytes(const moe_exchange_ref& xch);

/// plan_dispatch(indices, dopt, plan) on this rank (indices: tokens x k, each in [0, E); the capacity
/// applies to this rank's assignments), then the counts' exchange: fills xch (built for this
/// communicator's world and rank and plan.experts). Collective; bad input on any rank (an expert out of
/// range, shapes, a record for another world, rank or expert count) makes every rank throw.
template <class Transport>
moe_exchange_report moe_dispatch_plan_host(Transport& comm, matrix_ref<const std::int32_t> indices,
                                           const dispatch_options& dopt, const dispatch_plan_ref& plan,
                                           const moe_exchange_ref& xch, const moe_exchange_options& opt = {});

// ---- dispatch --------------------------------------------------------------------------------------

/// Bytes of host scratch moe_dispatch_host(comm, x, plan, xch, out) takes (one block): the gathered
/// descriptors and counts, the per-rank arrays, the rows this rank sends (plan.rows()) and receives
/// (xch.rows()), each its codes and scales.
template <class Recipe, class Byte>
std::size_t moe_dispatch_scratch_bytes(quantized_ref<Recipe, Byte> x, const dispatch_plan_ref& plan,
                                       const moe_exchange_ref& xch);

/// Sends the quantized rows of x (tokens x d, quantize<Recipe>'s row-wise copy; Recipe row-local with
/// one level of scales) in plan's order to their experts' owners; out (layout
/// make_grouped_layout<Recipe>(grouped_rows(xch.expert_rows, d))) receives this rank's experts' rows.
/// xch: moe_dispatch_plan_host's record for this plan. Collective.
template <class Recipe, class Transport, class Byte>
moe_exchange_report moe_dispatch_host(Transport& comm, quantized_ref<Recipe, Byte> x, const dispatch_plan_ref& plan,
                                      const moe_exchange_ref& xch, grouped_quantized_ref<Recipe> out,
                                      const moe_exchange_options& opt = {});

/// The backward's dispatch: rows (plan.rows() x d, one quantized row per row of the plan, in plan
/// order: dY = combine_backward's dy quantized with the layer's gradient recipe) go to their experts'
/// owners as moe_dispatch_host sends X's rows (the same layout, order and checks);
/// moe_dispatch_scratch_bytes(rows, plan, xch) gives its scratch. Collective.
template <class Recipe, class Transport, class Byte>
moe_exchange_report moe_dispatch_rows_host(Transport& comm, quantized_ref<Recipe, Byte> rows,
                                           const dispatch_plan_ref& plan, const moe_exchange_ref& xch,
                                           grouped_quantized_ref<Recipe> out, const moe_exchange_options& opt = {});

// ---- combine ---------------------------------------------------------------------------------------

/// Bytes of host scratch moe_combine_host(comm, y, weights, plan, xch, out, opt) takes (one block) on
/// opt.executor under opt.combine_wire: the gathered descriptors and counts, the per-rank arrays, the
/// rows sent (xch.rows()) and received (plan.rows()); for e4m3_1x128 also y's quantized copy and the
/// quantizer's scratch, and the received rows' copy and their dequantized floats (those go to
/// options.returned instead when it is given).
template <class Y>
std::size_t moe_combine_scratch_bytes(matrix_ref<Y> y, const dispatch_plan_ref& plan, const moe_exchange_ref& xch,
                                      const moe_exchange_options& opt = {});

/// y (xch.rows() x d, float or bf16): the outputs of this rank's experts for the rows it received,
/// in the received order. Sends each row back to its source (opt.combine_wire), then out_t = sum_j
/// w_tj y[row of (t, j)] over this rank's tokens (weights tokens x k, route's; out tokens x d, float
/// or bf16) as octet::combine forms it. Collective.
template <class Transport, class Y, class Out>
moe_exchange_report moe_combine_host(Transport& comm, matrix_ref<Y> y, matrix_ref<const float> weights,
                                     const dispatch_plan_ref& plan, const moe_exchange_ref& xch, matrix_ref<Out> out,
                                     const moe_exchange_options& opt = {});

/// Payload bytes of one row on the wire: the dispatch of a d-wide row quantized with Recipe (its
/// codes and its scales), and the combine's under `wire`.
template <class Recipe>
std::size_t moe_dispatch_row_bytes(std::size_t d);
std::size_t moe_combine_row_bytes(std::size_t d, moe_combine_wire wire);

}  // namespace octet

#include "octet/nn/detail/moe_exchange.hpp"  // IWYU pragma: export
