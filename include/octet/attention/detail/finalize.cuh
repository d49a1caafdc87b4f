// octet/attention/detail/finalize.cuh: the backward's last kernels: dq_convert_kernel (the float dQ
// accumulator to the output type) and stats_kernel (attention_stats from the row arrays).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "octet/attention/attention.hpp"
#include "octet/attention/detail/tiles.cuh"
#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/tensor_map.cuh"

namespace octet {
namespace detail {
namespace attention {

template <class GT>
OCTET_KERNEL void dq_convert_kernel(const float* acc, GT* dq, std::size_t dq_ld, std::size_t rows, std::size_t cols) {
    const std::size_t n = rows * cols, stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        dq[(i / cols) * dq_ld + i % cols] = detail::attention_store<GT>(acc[i]);
}

/// attention_stats over the row arrays (rows whose L is finite), into a zeroed struct.
OCTET_KERNEL void __launch_bounds__(256)
    stats_kernel(const float* rows_base, std::size_t rows, const float* lse, bool have_o, attention_stats* st) {
    OCTET_SHARED(float[8][8], red);
    OCTET_SHARED(unsigned[8], cnt);
    const float* res = rows_base + row_residual * rows;
    const float* abs_ds = rows_base + row_abs_ds * rows;
    const float* pdp = rows_base + row_p_dp * rows;
    const float* pabs = rows_base + row_p_abs_dp * rows;
    const float* dout = rows_base + row_delta_from_output * rows;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    unsigned count = 0;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t r = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += stride) {
        if (!(lse[r] < attention::pos_inf())) continue;
        float tm[8];
        detail::row_stats_terms(res[r], abs_ds[r], have_o ? attention::sub(dout[r], pdp[r]) : 0.0f, pabs[r], tm);
        for (int k = 0; k < 4; ++k) acc[k] = fmaxf(acc[k], tm[k]);
        for (int k = 4; k < 8; ++k) acc[k] += tm[k];
        ++count;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int off = 16; off > 0; off >>= 1) {
        for (int k = 0; k < 4; ++k) acc[k] = fmaxf(acc[k], shfl_xor(acc[k], off));
        for (int k = 4; k < 8; ++k) acc[k] += shfl_xor(acc[k], off);
        count += __shfl_xor_sync(0xFFFFFFFFu, count, off);
    }
    if (lane == 0) {
        for (int k = 0; k < 8; ++k) red[warp][k] = acc[k];
        cnt[warp] = count;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
            for (int k = 0; k < 4; ++k) acc[k] = fmaxf(acc[k], red[w][k]);
            for (int k = 4; k < 8; ++k) acc[k] += red[w][k];
            count += cnt[w];
        }
        if (count == 0) return;
        atomicAdd(&st->rows, count);
        // non-negative floats order like their bit patterns
        atomicMax(reinterpret_cast<int*>(&st->residual_max), __float_as_int(acc[0]));
        atomicMax(reinterpret_cast<int*>(&st->residual_rel_max), __float_as_int(acc[1]));
        atomicMax(reinterpret_cast<int*>(&st->gap_max), __float_as_int(acc[2]));
        atomicMax(reinterpret_cast<int*>(&st->gap_rel_max), __float_as_int(acc[3]));
        atomicAdd(&st->residual_sumsq, acc[4]);
        atomicAdd(&st->abs_ds_sumsq, acc[5]);
        atomicAdd(&st->gap_sumsq, acc[6]);
        atomicAdd(&st->p_abs_dp_sumsq, acc[7]);
    }
}

}  // namespace attention
}  // namespace detail
}  // namespace octet
