// octet/reference/gemm.hpp: a float64 GEMM on dequantized operands, the oracle for scaled_gemm.
//
//   auto ref = octet::reference::gemm(A, B);     // A: M x K, B: N x K quantized copies
//   ref.product[i * N + j]                       // sum_k dequant(A)_ik dequant(B)_jk, in double
//   ref.abs_products[i * N + j]                  // sum_k |dequant(A)_ik| |dequant(B)_jk| (the bound's T)
//
// Written from the layout contract of quant/tensor.hpp, not from the GEMM's code: every element is
// decode(code) (exact) times its block's effective scale S (the float the quantizer divided by),
// multiplied in double, which is exact (at most 8 + 24 significant bits). Products of two such
// values carry at most 64 significant bits, so the double sum has a relative error of at most
// K * 2^-53 of the sum of magnitudes, far below any float backend's error.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "octet/core/matrix.hpp"
#include "octet/format/encode.hpp"
#include "octet/quant/tensor.hpp"

namespace octet {
namespace reference {

struct gemm_result {
    std::size_t rows = 0, cols = 0;
    std::vector<double> product;       ///< rows x cols, row-major
    std::vector<double> abs_products;  ///< rows x cols, row-major
};

/// The dequantized matrix of a quantized copy, in double (exact).
template <class Recipe, class Byte>
std::vector<double> dequantized(const quantized_ref<Recipe, Byte>& q) {
    using Fmt = typename Recipe::format;
    const std::size_t R = q.rows(), C = q.cols();
    std::vector<double> out(R * C);
    const float ts = Recipe::two_level && q.tensor_scale ? *q.tensor_scale : 1.0f;
    for (std::size_t i = 0; i < R; ++i)
        for (std::size_t j = 0; j < C; ++j) {
            const std::size_t bi = i / q.layout.block_rows, bj = j / q.layout.block_cols;
            const double S = stored_scale_value<Recipe>(q.stored_scale(bi, bj), ts);
            const std::uint8_t code = octet::detail::load_code<Fmt>(q.data + i * q.layout.row_bytes, j);
            out[i * C + j] = static_cast<double>(decode<Fmt>(code)) * S;
        }
    return out;
}

/// product = dequant(A) * dequant(B)^T and the sums of magnitudes, in double.
template <class RA, class BA, class RB, class BB>
gemm_result gemm(const quantized_ref<RA, BA>& A, const quantized_ref<RB, BB>& B) {
    const std::size_t M = A.rows(), N = B.rows(), K = A.cols();
    const std::vector<double> a = dequantized(A), b = dequantized(B);
    gemm_result r;
    r.rows = M;
    r.cols = N;
    r.product.assign(M * N, 0.0);
    r.abs_products.assign(M * N, 0.0);
    for (std::size_t i = 0; i < M; ++i)
        for (std::size_t j = 0; j < N; ++j) {
            double s = 0.0, t = 0.0;
            const double* x = a.data() + i * K;
            const double* y = b.data() + j * K;
            for (std::size_t k = 0; k < K; ++k) {
                s += x[k] * y[k];
                t += std::fabs(x[k] * y[k]);
            }
            r.product[i * N + j] = s;
            r.abs_products[i * N + j] = t;
        }
    return r;
}

}  // namespace reference
}  // namespace octet
