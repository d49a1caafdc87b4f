// octet/nn/linear.cuh: the quantized linear layer on a CUDA stream (the buffer form of
// octet/nn/linear.hpp; its entries, octet::linear_forward / linear_backward, are the same templates
// for every executor, and this header adds the stream's half, detail::linear_backend<stream_executor>).
//
//   octet::device_linear_step_options o;            // device amaxes of delayed scaling, seed, step
//   octet::device_linear_forward_stats* fs = ...;   // device memory, or null
//   octet::linear_forward<LR>(octet::on_stream(s), x, w, bias, y, buffers, o, fs);
//   octet::linear_backward<LR>(octet::on_stream(s), dy, dx, dw, db, buffers, o, bs);
//
// Same contract and same bits as on the host: the quantized copies, Y, dX and dW are quantize's and
// scaled_gemm's stream results on the same copies (bit for bit with the host where scaled_gemm's
// stream backend is, see gemm/scaled_gemm.cuh); the Hadamard rotation of HadamardWgrad runs the
// host's butterfly in the same order (exact sign flips, then float adds and one exact scaling by
// 1/4), and db sums dY's columns in double in token order, rounded once, as the host does.
//
// Every matrix, buffer, bias and db is device memory. The statistics go to device memory: the
// forward zeroes *stats (a device_linear_forward_stats) on the stream, then fills the copies' quant
// statistics (when options.collect_stats) and X's and W's finite amaxes (always: delayed scaling
// pushes them); the backward does the same with a device_linear_backward_stats. A null stats
// pointer gathers nothing. Enqueued: quantize's kernels per operand, the rotation kernel (under
// HadamardWgrad), the GEMMs, the column-sum kernel (db); scratch comes from the executor's
// allocator (quantize's and the GEMM's own). Nothing synchronizes the host.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "octet/codec/hadamard.hpp"
#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/gemm/scaled_gemm.cuh"
#include "octet/nn/linear.hpp"
#include "octet/quant/quantize.cuh"

namespace octet {

namespace detail {

/// out (rows rounded up to 16) x cols, row-major: hadamard_tokens' transform, one thread per
/// (16-token group, column), the butterfly in the host's order.
OCTET_KERNEL void linear_hadamard_tokens_kernel(matrix_ref<const float> x, std::uint64_t seed, float* out) {
    constexpr std::size_t B = 16;
    const std::size_t tokens = x.rows, cols = x.cols, groups = (tokens + B - 1) / B;
    const float c = hadamard_norm(4);
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < groups * cols;
         i += stride) {
        const std::size_t g = i / cols, j = i % cols, t0 = g * B;
        // 16 tokens from a multiple of 16 share one 32-bit sign word.
        const std::uint32_t word = hadamard_sign_word(seed, t0 >> 5);
        float v[B];
        OCTET_UNROLL
        for (std::size_t r = 0; r < B; ++r) {
            const std::size_t t = t0 + r;
            v[r] = t < tokens ? flip_sign_if(x(t, j), (word >> (t & 31u)) & 1u) : 0.0f;
        }
        OCTET_UNROLL
        for (std::size_t h = 1; h < B; h <<= 1) {
            OCTET_UNROLL
            for (std::size_t r = 0; r < B; ++r) {
                if (r & h) continue;
                const float p = v[r], q = v[r + h];
                v[r] = p + q;
                v[r + h] = p - q;
            }
        }
        OCTET_UNROLL
        for (std::size_t r = 0; r < B; ++r) out[(t0 + r) * cols + j] = v[r] * c;
    }
}

/// db[j] = the sum of column j of dy, in double, in token order, rounded once (one thread per column).
OCTET_KERNEL void linear_column_sums_kernel(matrix_ref<const float> dy, float* db) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < dy.cols; j += stride) {
        double sum = 0.0;
        for (std::size_t t = 0; t < dy.rows; ++t) sum += static_cast<double>(dy(t, j));
        db[j] = static_cast<float>(sum);
    }
}

/// linear_forward / linear_backward on a stream (the entries are in nn/linear.hpp).
template <>
struct linear_backend<stream_executor> {
    using options = device_linear_step_options;
    using forward_stats = device_linear_forward_stats*;
    using backward_stats = device_linear_backward_stats*;

    static void begin_forward(const stream_executor& ex, device_linear_forward_stats* st) {
        if (st) OCTET_CUDA_CHECK(cudaMemsetAsync(st, 0, sizeof *st, ex.stream));
    }
    static void begin_backward(const stream_executor& ex, device_linear_backward_stats* st) {
        if (st) OCTET_CUDA_CHECK(cudaMemsetAsync(st, 0, sizeof *st, ex.stream));
    }

    /// The statistics slot and amax record of an operand (null where the call gathers none).
    static quant_stats* slot(device_linear_forward_stats* st, linear_operand which) {
        return which == linear_operand::x ? st->x : which == linear_operand::w ? st->w : st->x_hadamard;
    }
    static quant_stats* slot(device_linear_backward_stats* st, linear_operand which) {
        return which == linear_operand::dy ? st->dy : st->dy_hadamard;
    }
    static float* amax_record(device_linear_forward_stats* st, linear_operand which) {
        return which == linear_operand::x ? &st->x_amax : which == linear_operand::w ? &st->w_amax : nullptr;
    }
    static float* amax_record(device_linear_backward_stats* st, linear_operand which) {
        return which == linear_operand::dy ? &st->dy_amax : nullptr;
    }

    template <class R, class Stats>
    static void quantize_operand(const stream_executor& ex, linear_operand which, matrix_ref<const float> x,
                                 const quantized_ref<R>& rowwise, const quantized_ref<R>& columnwise, const options& o,
                                 philox_stream rng, Stats* st) {
        device_quantize_options q;
        q.rng = rng;
        q.device_tensor_amax = which == linear_operand::x    ? o.x_scale_amax
                               : which == linear_operand::w  ? o.w_scale_amax
                               : which == linear_operand::dy ? o.g_scale_amax
                                                             : nullptr;  // a rotated copy: its own amax
        if (st) {
            if (o.collect_stats) q.device_stats = slot(st, which);
            q.device_record = amax_record(st, which);
        }
        quantize<R>(ex, x, rowwise, columnwise, q);
    }

    static void hadamard_tokens(const stream_executor& ex, matrix_ref<const float> x, std::uint64_t seed,
                                span<float> out, const char* fn) {
        const std::size_t work = (x.rows + 15) / 16 * x.cols;
        if (work == 0) return;
        cuda::require_device_accessible(out.data(), fn, "buffers.rotated");
        cuda::launch("linear_hadamard_tokens_kernel", linear_hadamard_tokens_kernel,
                     cuda::grid_stride_blocks(work, 256), 256, 0, ex.stream, x, seed, out.data());
        OCTET_CUDA_CHECK_LAUNCH();
    }

    static void column_sums(const stream_executor& ex, matrix_ref<const float> dy, span<float> db) {
        cuda::require_device_accessible(db.data(), "octet::linear_backward", "db");
        cuda::launch("linear_column_sums_kernel", linear_column_sums_kernel, cuda::grid_stride_blocks(dy.cols, 128),
                     128, 0, ex.stream, dy, db.data());
        OCTET_CUDA_CHECK_LAUNCH();
    }
};

}  // namespace detail
}  // namespace octet
