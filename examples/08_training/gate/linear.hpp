// examples/08_training/gate/linear.hpp: the linear layer's check: one FP8 forward (blockwise recipe, bias)
// against float64 on the dequantized copies.
#pragma once

#include <octet/nn/linear.hpp>
#include <octet/octet.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"

namespace train {
namespace gate {

/// The linear layer's forward Y = X W^T + b (linear_recipes::blockwise: X in 1x128 tiles, W in
/// 128x128 blocks) against float64 on the same dequantized copies, each element within
/// octet::gemm_error_bound for the host backend (scaled_gemm.hpp: gamma_(L + S) on
/// sum_k |X_ik| |W_jk|, the epilogue's roundings with the bias, the output rounding); value: the
/// worst error over its bound. The copies are made here with the layer's recipes (quantization is
/// deterministic, so they are the layer's own).
inline gate_check check_linear_forward(octet::host_executor ex, const std::vector<float>& x,
                                       const std::vector<float>& w, const std::vector<float>& bias,
                                       const std::vector<float>& y, std::size_t tokens, std::size_t in,
                                       std::size_t out) {
    using LR = octet::linear_recipes::blockwise;
    using XR = LR::x_recipe;
    using WR = LR::w_recipe;
    octet::quantized_tensor<XR> qx;
    octet::quantized_tensor<WR> qw;
    const auto xd = detail::quantize_operand(ex, x, tokens, in, qx);
    const auto wd = detail::quantize_operand(ex, w, out, in, qw);
    const octet::gemm_numerics gn = octet::gemm_numerics_of<XR, WR, float>(octet::gemm_backend::host, in);
    double worst = 0, err_sq = 0, ref_sq = 0;
    for (std::size_t i = 0; i < tokens; ++i)
        for (std::size_t j = 0; j < out; ++j) {
            double exact = bias[j], abs_products = 0, raw = bias[j];
            for (std::size_t k = 0; k < in; ++k) {
                exact += xd[i * in + k] * wd[j * in + k];
                abs_products += std::fabs(xd[i * in + k] * wd[j * in + k]);
                raw += static_cast<double>(x[i * in + k]) * w[j * in + k];
            }
            const double bound =
                octet::gemm_error_bound(gn, 1.0, abs_products, 0.0, std::fabs(bias[j]), std::fabs(exact));
            worst = std::max(worst, ratio(std::fabs(y[i * out + j] - exact), bound));
            err_sq += (y[i * out + j] - raw) * (y[i * out + j] - raw);
            ref_sq += raw * raw;
        }
    return make_check("linear.forward_vs_float64", worst, 1.0,
                      "octet::linear_forward (linear_recipes::blockwise, " + std::to_string(tokens) + " tokens, " +
                          std::to_string(in) + " -> " + std::to_string(out) +
                          ", bias) against float64 on the dequantized copies: worst |error| over "
                          "octet::gemm_error_bound (host backend); relL2 against float64 on the unquantized X, W: " +
                          num(ref_sq > 0 ? std::sqrt(err_sq / ref_sq) : 0.0) + " (E4M3's rounding of the inputs)");
}

inline std::vector<gate_check> linear_checks(octet::host_executor ex, std::uint64_t seed) {
    const std::size_t tokens = 96, in = 256, out = 192;  // out: one full 128-block of W and a ragged one
    std::mt19937_64 g(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(tokens * in), w(out * in), bias(out), y(tokens * out);
    for (auto& v : x) v = nd(g);
    for (auto& v : w) v = 0.0625f * nd(g);
    for (auto& v : bias) v = 0.1f * nd(g);
    octet::linear_context<octet::linear_recipes::blockwise> ctx({tokens, in, out});
    octet::linear_forward(ex, ctx, octet::matrix_ref<const float>(x.data(), tokens, in),
                          octet::matrix_ref<const float>(w.data(), out, in), octet::as_cspan(bias),
                          octet::matrix_ref<float>(y.data(), tokens, out), octet::linear_pass::inference);
    return {check_linear_forward(ex, x, w, bias, y, tokens, in, out)};
}

}  // namespace gate
}  // namespace train
