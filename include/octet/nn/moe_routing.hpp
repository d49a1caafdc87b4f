// octet/nn/moe_routing.hpp: the router of a mixture-of-experts layer and FP8 token dispatch and
// combine around the grouped GEMM (octet/gemm/grouped_gemm.hpp). Host executor.
//
//   octet::route(ex, logits, {k, octet::gate_mode::softmax_topk_renormalized}, idx, w, counts);
//   octet::dispatch_plan plan(tokens, k, experts);
//   octet::plan_dispatch(idx, {}, plan.ref());                   // expert-sorted order, group sizes
//   octet::quantize<R>(ex, x, xq.ref());                         // X once, a row-local recipe
//   octet::grouped_quantized_tensor<R> xs(octet::grouped_rows(plan.ref().group_sizes, d));
//   octet::permute_quantized(ex, xq.cref(), plan.ref(), xs.ref());   // codes and scales, no dequantize
//   octet::grouped_scaled_gemm(ex, xs.cref(), weights, y);       // y in expert order
//   octet::combine(ex, y, w, plan.ref(), out);                   // out_t = sum_j w_tj y[row of (t, j)]
//
// Router. logits is tokens x experts (float). p = softmax over all experts of a token's logits
// (float: p_e = exp(l_e - max) / sum, the sum in expert order). A token selects k experts, best
// first, ties to the lower expert index: by its logits, or with a selection bias (DeepSeek-V3's
// auxiliary-loss-free balancing) by p_e + bias_e; the bias only selects, the weights come from the
// unbiased scores (gate_mode). Returned: the per-expert counts of assignments and the Switch /
// GShard load-balancing loss  L_aux = E sum_e f_e P_e  (f_e = counts_e / (tokens k), P_e = mean over
// tokens of p_e; 1 when perfectly balanced, f treated as a constant in the gradient). route_backward
// gives dL/dlogits exactly through the softmax, the renormalization and (optionally) L_aux.
//
// Non-finite logits are data, not errors: a token whose logits hold a NaN or a +Inf, or are all
// -Inf, still selects k distinct experts (NaN ranks below every number, ties to the lower index), but
// its weights are NaN, and so is every output it reaches: L_aux, its combine, its gradients. route
// counts such tokens (router_result::nonfinite_tokens). -Inf alone is a masked expert (p = 0).
//
// Dispatch. plan_dispatch sorts the tokens x k assignments by expert, stably (within an expert by
// token, then by slot): expert e's group holds group_sizes[e] rows starting at group_offsets[e], the
// m-grouped layout of grouped_quantize and grouped_scaled_gemm. With a capacity per expert, the
// assignments past it (in that order) are dropped (counted and reported; capacity_policy::error
// throws instead); a dropped assignment has no row and contributes 0 to the combine.
//
// FP8 permute. permute_quantized moves X's quantized copy (codes and scales, X quantized once) into
// expert order without dequantizing: a token routed to k experts appears k times. For a recipe
// whose blocks are one row tall (per_row, block<1, C>: 1x128, MXFP8, NVFP4) every row of the result
// is, bit for bit, the copy that quantize gives of that token's float row; per tensor (and NVFP4's
// tensor scale) X's scale carries over to every group. So the result equals quantize of the
// permuted float rows group by group (with opt.tensor_amax = X's amax for recipes with a tensor
// scale) and, for row-local recipes without a tensor scale, grouped_quantize of permute_rows' output,
// bit for bit, except under round::stochastic (each copy of a token keeps X's draws). Recipes whose
// blocks span rows (128x128, per column) are refused: a block would mix tokens of different experts.
//
// Combine. out_t = sum over t's kept slots j (in slot order, in float) of w_tj Y[row of (t, j)],
// stored as float or rounded to bf16 (round to nearest even; DeepSeek-V3's combine is bf16). Its
// backward: dY[row of (t, j)] = w_tj dout_t, dw_tj = <dout_t, Y[row]> (double, rounded once; 0 for a
// dropped slot), which feeds route_backward.
//
// This header holds the types, the options and the entries; their implementation is in
// octet/nn/detail/moe_routing.hpp, which it includes at its end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "octet/config.hpp"
#include "octet/core/bits.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/matrix.hpp"
#include "octet/core/span.hpp"
#include "octet/gemm/grouped_gemm.hpp"
#include "octet/quant/quantize.hpp"
#include "octet/quant/tensor.hpp"

namespace octet {

// ---- router -----------------------------------------------------------------------------------------

/// How a token's k weights come from its logits l (p = softmax(l) over all experts, S the selected set).
enum class gate_mode {
    softmax_topk,               ///< w_j = p_{S_j} (Switch, GShard): the weights sum to at most 1
    softmax_topk_renormalized,  ///< w_j = p_{S_j} / sum_{i in S} p_i (DeepSeek-V3, Qwen-MoE): sum to 1
    topk_softmax,               ///< w = softmax of the k selected logits (Mixtral): sum to 1
};

struct router_options {
    std::size_t k = 1;  ///< experts per token, 1 <= k <= experts
    gate_mode gate = gate_mode::softmax_topk;
    /// DeepSeek-V3's auxiliary-loss-free balancing: one bias per expert, added to p for selection only
    /// (select by p_e + bias_e; the weights ignore it). Empty: select by the logits. See update_expert_bias.
    span<const float> selection_bias{};
};

struct router_result {
    double aux_loss = 0.0;             ///< E sum_e f_e P_e (0 without tokens; NaN if a token's logits are)
    std::size_t nonfinite_tokens = 0;  ///< tokens whose logits hold a NaN or +Inf, or are all -Inf
};

/// Bytes of host scratch route takes from ex's allocator (the per-expert sums of p over blocks of 256
/// tokens, summed in a fixed order so that every thread count gives the same bits).
std::size_t route_scratch_bytes(std::size_t tokens, std::size_t experts);

/// Selects opt.k experts per token (best first) and their weights: indices and weights are tokens x k,
/// counts (experts entries) receives each expert's number of assignments (grouped_gemm's group sizes
/// when nothing is dropped). Returns L_aux and the count of non-finite tokens.
router_result route(const host_executor& ex, matrix_ref<const float> logits, const router_options& opt,
                    matrix_ref<std::int32_t> indices, matrix_ref<float> weights, span<std::size_t> counts);

/// dL/dlogits (tokens x experts) from dL/dweights (tokens x k), for the selection `indices` route made
/// from these logits under the same options: exact through the softmax and the gate_mode (experts not
/// selected get the softmax's share, or 0 under topk_softmax). With aux_loss_grad = dL/dL_aux != 0,
/// also adds aux_loss_grad * dL_aux/dlogits, E / tokens * p_e (f_e - sum_i f_i p_i) per token, where
/// f comes from `counts` (route's, required then).
void route_backward(const host_executor& ex, matrix_ref<const float> logits, matrix_ref<const std::int32_t> indices,
                    matrix_ref<const float> dweights, const router_options& opt, matrix_ref<float> dlogits,
                    float aux_loss_grad = 0.0f, span<const std::size_t> counts = {});

/// Bytes of host scratch route_backward takes from ex's allocator (a row of doubles and one of floats
/// per chunk of tokens).
std::size_t route_backward_scratch_bytes(const host_executor& ex, std::size_t tokens, std::size_t experts);

/// DeepSeek-V3's bias update after a step: bias_e += gamma * sign(mean load - counts_e) (sign 0 = 0), so
/// an overloaded expert is selected less on the next step.
void update_expert_bias(span<float> bias, span<const std::size_t> counts, float gamma);

// ---- dispatch plan ------------------------------------------------------------------------------------

/// What plan_dispatch does with the assignments past an expert's capacity.
enum class capacity_policy {
    drop,   ///< drop them (later tokens first, GShard's rule); counted in dispatch_result
    error,  ///< throw octet::error naming the expert
};

struct dispatch_options {
    std::size_t capacity = std::numeric_limits<std::size_t>::max();  ///< rows per expert; max: no limit
    capacity_policy overflow = capacity_policy::drop;
};

/// A dispatch plan in caller buffers: assignment a = t k + j is token t's slot j.
struct dispatch_plan_ref {
    std::size_t tokens = 0, k = 0, experts = 0;
    span<std::size_t> group_sizes;    ///< [experts] rows of each expert (after capacity)
    span<std::size_t> group_offsets;  ///< [experts + 1] first row of each expert; [experts] = rows()
    span<std::int32_t> order;         ///< [tokens k] order[r] = the assignment in row r (r < rows(); rest -1)
    span<std::int32_t> row_of;        ///< [tokens k] the row of assignment a, -1 if it was dropped

    std::size_t assignments() const { return tokens * k; }
    /// Rows in expert order (kept assignments).
    std::size_t rows() const { return group_offsets.empty() ? 0 : group_offsets[experts]; }
    /// The token row r holds a copy of.
    std::size_t token_of_row(std::size_t r) const { return static_cast<std::size_t>(order[r]) / k; }
};

/// A dispatch plan that owns its buffers (tests, examples, CPU users).
class dispatch_plan {
public:
    dispatch_plan() = default;
    dispatch_plan(std::size_t tokens, std::size_t k, std::size_t experts)
        : tokens_(tokens),
          k_(k),
          experts_(experts),
          sizes_(experts),
          offsets_(experts + 1),
          order_(tokens * k),
          row_of_(tokens * k) {}
    dispatch_plan_ref ref() {
        return {tokens_, k_, experts_, as_span(sizes_), as_span(offsets_), as_span(order_), as_span(row_of_)};
    }

private:
    std::size_t tokens_ = 0, k_ = 0, experts_ = 0;
    std::vector<std::size_t> sizes_, offsets_;
    std::vector<std::int32_t> order_, row_of_;
};

struct dispatch_result {
    std::size_t rows = 0;     ///< assignments kept
    std::size_t dropped = 0;  ///< assignments past a capacity
};

/// Builds the expert-sorted order of the assignments in `indices` (tokens x k, each in [0, plan.experts);
/// an expert may appear twice in a token's slots) into plan's buffers: one thread, O(tokens k + experts).
dispatch_result plan_dispatch(matrix_ref<const std::int32_t> indices, const dispatch_options& opt,
                              const dispatch_plan_ref& plan);

// ---- permute ------------------------------------------------------------------------------------------

/// Row r of out = row token_of_row(r) of x (tokens x d, float or bf16 to float or bf16): the float path
/// (permute, then grouped_quantize per expert).
template <class T, class U>
void permute_rows(const host_executor& ex, matrix_ref<T> x, const dispatch_plan_ref& plan, matrix_ref<U> out);

/// Bytes a permute moves for `rows` rows of `cols` elements: FP8 codes and their scales, against the
/// bf16 rows the unquantized path moves.
struct permute_bytes {
    std::size_t codes = 0, scales = 0, bf16 = 0;
};
template <class Recipe>
permute_bytes permute_traffic(std::size_t rows, std::size_t cols);

/// Moves X's quantized copy (x: tokens x d, from quantize<Recipe>) into expert order: group e of out
/// (layout make_grouped_layout<Recipe>(grouped_rows(plan.group_sizes, d))) gets the codes and scales of
/// the tokens of e's rows; the padding of each row and scale column is written as 0. Two-level recipes:
/// every group's tensor scale is x's. Recipes whose blocks span rows throw. Returns the bytes moved.
template <class Recipe, class Byte>
permute_bytes permute_quantized(const host_executor& ex, quantized_ref<Recipe, Byte> x, const dispatch_plan_ref& plan,
                                grouped_quantized_ref<Recipe> out);

// ---- combine ------------------------------------------------------------------------------------------

/// out_t = sum_j w_tj y[row_of(t, j)] over t's kept slots (y: rows() x d in expert order, float or
/// bf16; weights tokens x k; out tokens x d, float or bf16). A token with every slot dropped gets 0.
template <class Y, class Out>
void combine(const host_executor& ex, matrix_ref<Y> y, matrix_ref<const float> weights, const dispatch_plan_ref& plan,
             matrix_ref<Out> out);

/// The backward of combine: dy[row_of(t, j)] = w_tj dout_t (rows() x d, float or bf16), and dweights_tj =
/// <dout_t, y[row_of(t, j)]> (tokens x k; 0 for a dropped slot), what route_backward takes.
template <class G, class Y, class DY>
void combine_backward(const host_executor& ex, matrix_ref<G> dout, matrix_ref<Y> y, matrix_ref<const float> weights,
                      const dispatch_plan_ref& plan, matrix_ref<DY> dy, matrix_ref<float> dweights);

}  // namespace octet

#include "octet/nn/detail/moe_routing.hpp"  // IWYU pragma: export
