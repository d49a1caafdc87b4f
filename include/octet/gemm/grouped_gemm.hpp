// octet/gemm/grouped_gemm.hpp: grouped scaled GEMM for mixture-of-experts layers, one call over all
// experts (groups), and the grouped quantizer that feeds it. Host executor here; the same entries on
// a CUDA stream (sm_90a wgmma + TMA, one persistent kernel over all groups, and sm_89 mma.sync) are in
// octet/gemm/grouped_gemm.cuh.
//
//   // the tokens of all experts in one matrix, sorted by expert; sizes[e] of them are expert e's
//   octet::grouped_quantized_tensor<R> xq(octet::grouped_rows(sizes, K));        // each group sizes[e] x K
//   octet::grouped_quantize<R>(octet::on_host(), x, sizes, xq.ref());
//   octet::grouped_scaled_gemm(octet::on_host(), xq.cref(), weights, y);     // y rows of e = X_e W_e^T
//
// Groups. A grouped operand holds G quantized copies in one block of memory (grouped_layout): group
// g is the quantized copy of its own matrix, laid out as quantized_tensor lays one out. Each group is
// quantized as a matrix of its own: a per-tensor recipe scales each group by that group's amax, and
// no scale block straddles two groups, whatever the sizes (any value, zero included: octet pads
// inside each group's layout, never the caller). A group of zero rows holds no bytes.
//
// The three shapes of an expert layer (DeepGEMM's names):
//   * m-grouped contiguous (grouped_scaled_gemm): A's groups are the tokens of each expert (sizes[g]
//     x K, stacked in D's rows in group order), B the experts' weights (one N x K copy each): the
//     forward Y = X W_e^T and the data gradient dX = dY W_e (B = W_e^T's copy).
//   * m-grouped masked (grouped_scaled_gemm_masked): every group holds `capacity` rows (a shape
//     that does not depend on the routing, as CUDA graphs need), of which valid[g] are tokens; D's
//     other rows of the group are set to 0.
//   * k-grouped (grouped_scaled_gemm_k): the weight gradient dW_e = dY_e^T X_e, whose K is expert
//     e's token count: A's group g is the copy of dY_g^T (N x sizes[g]) and B's the copy of X_g^T
//     (K x sizes[g]), grouped_quantize's column-wise copies; D holds the G results stacked (G N x K).
//     An expert without tokens gets dW_e = 0.
//
// Numerics. Each group's result is scaled_gemm's on that group's copies, bit for bit (its contract
// and error bound, scaled_gemm.hpp), and each group's copies are quantize's of that group's matrix.
//
// This header holds the layout, the views, the container and the entries; their implementation is in
// octet/gemm/detail/grouped_gemm.hpp, which it includes at its end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "octet/config.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/matrix.hpp"
#include "octet/core/span.hpp"
#include "octet/gemm/scaled_gemm.hpp"
#include "octet/quant/quantize.hpp"
#include "octet/quant/tensor.hpp"

namespace octet {

/// Where G quantized copies lie in one block of memory: group g is the quantized copy of a
/// groups[g].rows x groups[g].cols matrix, its codes at data_offset[g] of the data block and its
/// scales at scale_offset[g] of the scale block (each a multiple of 16 bytes).
struct grouped_layout {
    std::vector<quant_layout> groups;
    std::vector<std::size_t> data_offset, scale_offset;
    std::size_t data_bytes = 0, scale_bytes = 0;
    std::size_t size() const { return groups.size(); }
};

/// The shape of each group, before a recipe lays it out.
struct group_shapes {
    std::vector<std::size_t> rows, cols;
};

/// G groups of sizes[g] x cols: the row-wise copies of m-grouped tokens (and of the weights of G
/// experts, all N x K: pass N G times).
group_shapes grouped_rows(span<const std::size_t> sizes, std::size_t cols);
/// G groups of rows x sizes[g]: the column-wise copies of m-grouped tokens (X_g^T, dY_g^T), what the
/// k-grouped GEMM multiplies.
group_shapes grouped_cols(std::size_t rows, span<const std::size_t> sizes);

/// The layout Recipe gives those groups (quant_layout_of<Recipe>::make for each, padded).
template <class Recipe>
grouped_layout make_grouped_layout(const group_shapes& shapes);

/// A view of G quantized copies in one block (data, scales and, for two-level recipes, one tensor
/// scale per group). `Byte` is std::uint8_t (writable) or const std::uint8_t.
template <class Recipe, class Byte = std::uint8_t>
struct grouped_quantized_ref {
    using float_ptr = std::conditional_t<std::is_const_v<Byte>, const float*, float*>;
    Byte* data = nullptr;
    Byte* scales = nullptr;
    float_ptr tensor_scales = nullptr;  ///< two-level recipes: one float per group
    const grouped_layout* layout = nullptr;

    constexpr grouped_quantized_ref() = default;
    grouped_quantized_ref(Byte* d, Byte* s, float_ptr ts, const grouped_layout& l)
        : data(d), scales(s), tensor_scales(ts), layout(&l) {}
    template <class B, class = std::enable_if_t<std::is_same_v<const B, Byte>>>
    grouped_quantized_ref(const grouped_quantized_ref<Recipe, B>& o)
        : data(o.data), scales(o.scales), tensor_scales(o.tensor_scales), layout(o.layout) {}

    bool absent() const { return layout == nullptr; }
    std::size_t groups() const { return layout ? layout->size() : 0; }
    /// Group g's copy (a quantized_ref like any other).
    quantized_ref<Recipe, Byte> group(std::size_t g) const;
};

template <class Recipe>
using grouped_quantized_cref = grouped_quantized_ref<Recipe, const std::uint8_t>;

/// G owning quantized copies in host memory, one block of codes and one of scales.
template <class Recipe>
class grouped_quantized_tensor {
public:
    grouped_quantized_tensor() = default;
    explicit grouped_quantized_tensor(const group_shapes& shapes)
        : layout_(make_grouped_layout<Recipe>(shapes)),
          data_(layout_.data_bytes),
          scales_(layout_.scale_bytes),
          tensor_scales_(layout_.size(), 1.0f) {}

    grouped_quantized_ref<Recipe> ref() { return {data_.data(), scales_.data(), tensor_scales_.data(), layout_}; }
    grouped_quantized_cref<Recipe> cref() const {
        return {data_.data(), scales_.data(), tensor_scales_.data(), layout_};
    }
    const grouped_layout& layout() const { return layout_; }

private:
    grouped_layout layout_{};
    std::vector<std::uint8_t> data_, scales_;
    std::vector<float> tensor_scales_;
};

// ---- the entries ----------------------------------------------------------------------------------

/// Quantizes the rows of x group by group: rows [o_g, o_g + sizes[g]) of x (o_g = sizes[0] + ... +
/// sizes[g - 1]; the sizes sum to x.rows) are group g, quantized as a matrix of its own into group g of
/// `rowwise` (layout of grouped_rows(sizes, x.cols)) and/or of `columnwise` (its transpose: layout of
/// grouped_cols(x.cols, sizes)); pass {} to skip either. Current scaling only (opt.tensor_amax < 0):
/// each group's amax is its own. Stochastic rounding: group g draws as quantize does with
/// opt.rng.offset + 2 g (so groups never share bits). `results` (empty, or one per group) receives
/// each group's quantize_result. Allocates nothing beyond quantize's scratch from ex's allocator.
template <class Recipe, class T>
void grouped_quantize(const host_executor& ex, matrix_ref<T> x, span<const std::size_t> sizes,
                      grouped_quantized_ref<Recipe> rowwise, grouped_quantized_ref<Recipe> columnwise = {},
                      const quantize_options& opt = {}, span<quantize_result> results = {});

/// m-grouped contiguous: for each group g, rows [o_g, o_g + rows of A's group g) of D = alpha *
/// A_g B[g]^T + bias (scaled_gemm on those copies). Every B[g] is N x K and every A group has K
/// columns; D is (sum of A's group rows) x N. opt.beta must be 0.
template <class RA, class BA, class RB, class BB, class DT>
void grouped_scaled_gemm(const host_executor& ex, grouped_quantized_ref<RA, BA> A, span<const quantized_ref<RB, BB>> B,
                         matrix_ref<DT> D, const gemm_options& opt = {});

/// m-grouped masked: every A group has the same `capacity` rows, of which the first valid[g] are
/// tokens; rows [g capacity, g capacity + valid[g]) of D = alpha * A_g B[g]^T + bias over those
/// rows, the rest of group g's rows of D are 0. D is (G capacity) x N.
template <class RA, class BA, class RB, class BB, class DT>
void grouped_scaled_gemm_masked(const host_executor& ex, grouped_quantized_ref<RA, BA> A,
                                span<const quantized_ref<RB, BB>> B, span<const std::size_t> valid, matrix_ref<DT> D,
                                const gemm_options& opt = {});

/// k-grouped: rows [g N, (g + 1) N) of D = alpha * A_g B_g^T, A_g N x k_g and B_g K x k_g (the
/// column-wise copies of dY's and X's groups; k_g may be 0, which gives 0). D is (G N) x K.
/// opt.beta must be 0 and opt.bias empty.
template <class RA, class BA, class RB, class BB, class DT>
void grouped_scaled_gemm_k(const host_executor& ex, grouped_quantized_ref<RA, BA> A, grouped_quantized_ref<RB, BB> B,
                           matrix_ref<DT> D, const gemm_options& opt = {});

}  // namespace octet

#include "octet/gemm/detail/grouped_gemm.hpp"  // IWYU pragma: export
