// octet/quant/detail/dequantize.cuh: the dequantize kernel, dequantize_matrix_kernel (four elements
// of a row per thread, grid-stride, into a float, bf16 or fp16 matrix of either layout).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

#include "octet/cuda/shared_memory.cuh"
#include "octet/format/convert.cuh"
#include "octet/quant/quantize.hpp"

namespace octet {

namespace detail {

template <class Recipe, class Out>
OCTET_KERNEL void dequantize_matrix_kernel(quantized_cref<Recipe> q, Out* out, std::size_t ld, bool col_major) {
    const std::size_t rows = q.rows(), cols = q.cols();
    const std::size_t groups = (cols + 3) / 4;
    for (std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < rows * groups;
         t += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t i = t / groups, j0 = (t % groups) * 4;
        OCTET_UNROLL
        for (int k = 0; k < 4; ++k) {
            const std::size_t j = j0 + k;
            if (j >= cols) break;
            const float v = q.value(i, j);
            Out o;
            if constexpr (std::is_same_v<Out, float>)
                o = v;
            else if constexpr (std::is_same_v<Out, bf16>)
                o = to_bf16(v);
            else
                o = to_fp16(v);
            out[col_major ? j * ld + i : i * ld + j] = o;
        }
    }
}

}  // namespace detail

}  // namespace octet
