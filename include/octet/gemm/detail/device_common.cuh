// octet/gemm/detail/device_common.cuh: what every CUDA GEMM backend shares: the device view of an
// operand's scales, the epilogue (alpha, beta C, bias, conversion, either layout), argument checks
// that need the CUDA runtime, the device's architecture, and small PTX wrappers.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "octet/cuda/check.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/ptx.cuh"
#include "octet/format/convert.cuh"
#include "octet/gemm/scaled_gemm.hpp"

namespace octet {
namespace detail {

/// Effective scale of block (bi, bj) of an operand, read on the device (the quantized_ref contract:
/// column-major grid, element bj * ld + bi; two-level recipes multiply the per-tensor float).
template <class Recipe>
struct device_scales {
    const std::uint8_t* scales = nullptr;
    std::uint32_t ld = 0;
    std::uint32_t block_rows = 1, block_cols = 1;
    const float* tensor_scale = nullptr;  ///< two-level only; read once per thread

    OCTET_DEVICE float value(std::uint32_t bi, std::uint32_t bj, float ts) const {
        const std::size_t k = static_cast<std::size_t>(bj) * ld + bi;
        if constexpr (Recipe::scale_bytes == 4)
            return __ldg(reinterpret_cast<const float*>(scales) + k);
        else
            return stored_scale_value<Recipe>(__ldg(scales + k), ts);
    }
    OCTET_DEVICE float load_tensor_scale() const {
        return Recipe::two_level && tensor_scale ? __ldg(tensor_scale) : 1.0f;
    }
};

template <class Recipe>
device_scales<Recipe> make_device_scales(const quantized_cref<Recipe>& q) {
    device_scales<Recipe> s;
    s.scales = q.scales;
    s.ld = static_cast<std::uint32_t>(q.layout.scale_ld);
    s.block_rows = static_cast<std::uint32_t>(q.layout.block_rows);
    s.block_cols = static_cast<std::uint32_t>(q.layout.block_cols);
    s.tensor_scale = q.tensor_scale;
    return s;
}

OCTET_DEVICE float load_float(float v) {
    return v;
}
OCTET_DEVICE float load_float(bf16 v) {
    return to_float(v);
}
OCTET_DEVICE float load_float(fp16 v) {
    return to_float(v);
}

/// D(i, j) = alpha * acc + beta * C(i, j) + bias[j], rounded once to D's type.
template <class CT, class DT>
struct device_epilogue {
    DT* d = nullptr;
    std::size_t d_ld = 0;
    bool d_col_major = false;
    const CT* c = nullptr;  ///< null: no C
    std::size_t c_ld = 0;
    bool c_col_major = false;
    const float* bias = nullptr;
    float alpha = 1.0f, beta = 0.0f;
    std::uint32_t M = 0, N = 0;

    bool pairs = false;  ///< row-major D with even ld and an aligned base: (j, j + 1) can go in one store

    OCTET_DEVICE float value(std::uint32_t i, std::uint32_t j, float acc) const {
        float v = alpha * acc;
        if (c)
            v += beta *
                 load_float(
                     c[c_col_major ? static_cast<std::size_t>(j) * c_ld + i : static_cast<std::size_t>(i) * c_ld + j]);
        if (bias) v += __ldg(bias + j);
        return v;
    }
    OCTET_DEVICE void store(std::uint32_t i, std::uint32_t j, float acc) const {
        if (i >= M || j >= N) return;
        d[d_col_major ? static_cast<std::size_t>(j) * d_ld + i : static_cast<std::size_t>(i) * d_ld + j] =
            store_from_float<DT>(value(i, j, acc));
    }
    /// Elements (i, j) and (i, j + 1), j even: one 2-element store when the layout allows.
    OCTET_DEVICE void store2(std::uint32_t i, std::uint32_t j, float acc0, float acc1) const {
        if (pairs && i < M && j + 1 < N) {
            struct alignas(2 * sizeof(DT)) two {
                DT x, y;
            };
            *reinterpret_cast<two*>(d + static_cast<std::size_t>(i) * d_ld + j) =
                two{store_from_float<DT>(value(i, j, acc0)), store_from_float<DT>(value(i, j + 1, acc1))};
        } else {
            store(i, j, acc0);
            store(i, j + 1, acc1);
        }
    }
};

template <class CT, class DT>
device_epilogue<CT, DT> make_device_epilogue(const matrix_ref<const CT>* C, const matrix_ref<DT>& D,
                                             const gemm_options& opt) {
    device_epilogue<CT, DT> e;
    e.d = D.data;
    e.d_ld = D.ld;
    e.d_col_major = D.order == storage_order::col_major;
    if (C) {
        e.c = C->data;
        e.c_ld = C->ld;
        e.c_col_major = C->order == storage_order::col_major;
    }
    e.bias = opt.bias.empty() ? nullptr : opt.bias.data();
    e.alpha = opt.alpha;
    e.beta = C ? opt.beta : 0.0f;
    e.M = static_cast<std::uint32_t>(D.rows);
    e.N = static_cast<std::uint32_t>(D.cols);
    e.pairs = !e.d_col_major && D.ld % 2 == 0 && is_aligned(D.data, 2 * sizeof(DT));
    return e;
}

using cuda::image_has_marker;  // octet/cuda/launch.cuh

/// Checks that the operand is device memory with the alignment a kernel's 16-byte loads need.
template <class Recipe>
void require_device_operand(const quantized_cref<Recipe>& q, const char* fn, const char* arg, const char* backend) {
    if (q.rows() == 0 || q.cols() == 0) return;
    cuda::require_device_accessible(q.data, fn, arg);
    cuda::require_device_accessible(q.scales, fn, arg);
    if constexpr (Recipe::two_level) cuda::require_device_accessible(q.tensor_scale, fn, arg);
    OCTET_REQUIRE(
        is_aligned(q.data, 16) && q.layout.row_bytes % 16 == 0, fn, arg,
        message("needs 16-byte aligned rows for the ", backend, " backend (data ", q.data, ", row_bytes ",
                q.layout.row_bytes, "); build it with quant_layout_of<Recipe>::make(rows, cols) (pad = true)"));
    OCTET_REQUIRE(is_aligned(q.scales, Recipe::scale_bytes), fn, arg,
                  message("has scales that are not ", Recipe::scale_bytes, "-byte aligned"));
}

template <class T>
void require_device_matrix(const matrix_ref<T>& m, const char* fn, const char* arg) {
    if (m.empty()) return;
    cuda::require_device_accessible(m.data, fn, arg);
}

}  // namespace detail
}  // namespace octet
