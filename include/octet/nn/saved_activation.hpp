// octet/nn/saved_activation.hpp: what a non-linear layer's backward reads, kept in FP8.
//
//   octet::saved_activation<octet::activation_recipes::e4m3_1x32> saved(max_tokens, features);
//   saved.store(ex, x);        // forward: x's FP8 copy with one scale per 32 elements of a row
//   ...                        // (x itself may be freed or overwritten now)
//   saved.load(ex, x_hat);     // backward: the dequantized x it differentiates at
//
// The inputs of RMSNorm / LayerNorm, GELU / SiLU / SwiGLU and the residual stream are what a
// transformer's backward reads besides the linears' inputs; COAT keeps them in FP8 with a scale per
// small group of a row (1x16, 1x32, 1x128: a group holds its own outliers, so one large value does
// not flush its neighbours), which cuts their bytes about 4x against float32. The linears' inputs
// are kept by the linear layer itself (nn/linear.hpp: only their FP8 copies).
//
// The numerical contract (tested against float64 in tests/host/nn_saved_activation.cpp): every
// finite element of a block whose elements are all finite comes back with
//   |x_hat - x| <= saved_activation_error_bound<R>(|x|, S)
//               = (u + 2^-22) |x| + h S
// where S is the block's decoded scale (saved_activation::scale), u the format's unit roundoff
// (E4M3 2^-4, E5M2 2^-3) and h half its smallest subnormal step (E4M3 2^-10, E5M2 2^-17); 2^-22
// covers the float roundings of x / S and code * S. Scales are amax / max_finite (amax_ratio),
// so nothing saturates. A block holding a NaN or an Inf comes back all NaN (nan_policy::propagate):
// a bad activation poisons the gradient it feeds instead of vanishing from it.
// A backward fed x_hat computes its float gradient at x_hat; how far that is from the gradient at x
// is the backward's own Lipschitz constant times the bound above (elementwise for GELU and SiLU:
// max |f''|; per row for RMSNorm), which the same test checks for GELU, SiLU and RMSNorm.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/matrix.hpp"
#include "octet/quant/quantize.hpp"
#include "octet/quant/recipe.hpp"
#include "octet/quant/tensor.hpp"

namespace octet {

/// Recipes for saved activations: E4M3 with a float scale per group of a row (amax / 448), or
/// MXFP8's power-of-two scale per 32. Choose the group per tensor: 1x16 for tensors with many
/// outliers (pre-norm residuals), 1x32 as a default, 1x128 for the fewest scale bytes.
namespace activation_recipes {
using e4m3_1x16 = recipe<e4m3, block<1, 16>, scale::amax_ratio<0>>;
using e4m3_1x32 = recipe<e4m3, block<1, 32>, scale::amax_ratio<0>>;
using e4m3_1x128 = recipe<e4m3, block<1, 128>, scale::amax_ratio<0>>;
/// Power-of-two scales rounded up (no value saturates; the bound's u then holds as well).
using mxfp8 = recipe<e4m3, block<1, 32>, scale::pow2_ceil, scale_storage::ue8m0>;
}  // namespace activation_recipes

/// Bytes the copy of a rows x cols activation takes (codes and scales).
template <class R>
std::size_t saved_activation_bytes(std::size_t rows, std::size_t cols) {
    const quant_layout l = quant_layout_of<R>::make(rows, cols);
    return l.data_bytes + l.scale_bytes;
}

/// The largest |x_hat - x| for a finite element of magnitude x_abs in a finite block of decoded
/// scale S (the header's contract).
template <class R>
double saved_activation_error_bound(double x_abs, double S) {
    using F = typename R::format;
    const double u = std::ldexp(1.0, -(F::mantissa_bits + 1));
    const double h = std::ldexp(1.0, F::emin - F::mantissa_bits - 1);
    return (u + std::ldexp(1.0, -22)) * x_abs + h * S;
}

/// One activation's FP8 copy for a backward, in storage it owns for up to max_rows x cols.
template <class R>
class saved_activation {
    static_assert(is_recipe_v<R>, "octet::saved_activation: R must be an octet::recipe<...> (see activation_recipes)");
    static_assert(!R::is_per_tensor && !R::two_level && R::granularity::rows == 1,
                  "octet::saved_activation: R must scale groups of a row (block<1, G>), as activation_recipes do");
    static_assert(!std::is_same_v<typename R::rounding, round::stochastic>,
                  "octet::saved_activation: stochastic rounding needs a random stream per store; use nearest");

public:
    saved_activation() = default;
    saved_activation(std::size_t max_rows, std::size_t cols)
        : max_rows_(max_rows), cols_(cols), storage_(saved_activation_bytes<R>(max_rows, cols)) {}

    /// Keeps x (rows x cols, rows <= max_rows) as its FP8 copy; returns quantize's result (the amax,
    /// and with collect_stats the saturation and underflow counts of the copy).
    quantize_result store(const host_executor& ex, matrix_ref<const float> x, bool collect_stats = false) {
        constexpr const char* fn = "octet::saved_activation::store";
        OCTET_REQUIRE(x.cols == cols_, fn, "x",
                      detail::message("has ", x.cols, " columns; the saved activation holds ", cols_,
                                      " (build it with the activation's columns)"));
        OCTET_REQUIRE(x.rows <= max_rows_, fn, "x",
                      detail::message("has ", x.rows, " rows; the saved activation holds at most ", max_rows_,
                                      " (build it with a larger max_rows)"));
        rows_ = x.rows;
        quantize_options opt;
        opt.collect_stats = collect_stats;
        return quantize<R>(ex, x, ref(), {}, opt);
    }

    /// Writes the dequantized copy of the last store into out (its rows x cols).
    void load(const host_executor& ex, matrix_ref<float> out) const {
        OCTET_REQUIRE(out.rows == rows_ && out.cols == cols_, "octet::saved_activation::load", "out",
                      detail::message("has shape ", out.rows, " x ", out.cols, "; the stored activation is ", rows_,
                                      " x ", cols_));
        dequantize(ex, copy(), out);
    }

    /// The FP8 copy of the last store (rows() x cols()).
    quantized_cref<R> copy() const {
        const quant_layout l = quant_layout_of<R>::make(rows_, cols_);
        return quantized_cref<R>(storage_.data(), storage_.data() + l.data_bytes, l);
    }
    /// The decoded scale of element (i, j)'s block in the last store.
    float scale(std::size_t i, std::size_t j) const { return copy().scale(i, j / copy().layout.block_cols); }

    std::size_t rows() const { return rows_; }
    std::size_t cols() const { return cols_; }
    std::size_t max_rows() const { return max_rows_; }
    /// Bytes owned (codes and scales at max_rows x cols).
    std::size_t bytes() const { return storage_.size(); }

private:
    quantized_ref<R> ref() {
        const quant_layout l = quant_layout_of<R>::make(rows_, cols_);
        return quantized_ref<R>(storage_.data(), storage_.data() + l.data_bytes, l);
    }

    std::size_t max_rows_ = 0, cols_ = 0, rows_ = 0;
    // codes, then scales, of the current shape: a copy of fewer rows needs fewer of both
    std::vector<std::uint8_t> storage_;
};

}  // namespace octet
