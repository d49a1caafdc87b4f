// octet/nn/linear.cuh: the quantized linear layer on a CUDA stream (the buffer form of
// octet/nn/linear.hpp; its entries, octet::linear_forward / linear_backward, are the same templates
// for every executor, and this header adds the stream's half, detail::linear_backend<stream_executor>).
//
//   octet::device_linear_step_options o;            // device amaxes of delayed scaling, seed, step
//   octet::device_linear_forward_stats* fs = ...;   // device memory, or null
//   octet::linear_forward<LR>(octet::on_stream(s), x, w, bias, y, buffers, o, fs);
//   octet::linear_backward<LR>(octet::on_stream(s), dy, dx, dw, db, buffers, o, bs);
//
// or, with the buffers and the step state owned by a context in device memory (the stream's
// octet::linear_context, below):
//
//   octet::cuda::linear_context<LR> ctx(octet::on_stream(s), {max_tokens, in, out});
//   octet::linear_forward(octet::on_stream(s), ctx, x, w, bias, y);
//   octet::linear_backward(octet::on_stream(s), ctx, dy, dx, dw, db);
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
#include "octet/quant/delayed.hpp"
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

/// The device state of a stream linear context: the delayed-scaling state of X, W and dY, and the
/// statistics of the last forward and backward.
struct linear_device_state {
    delayed_scaling_state delayed[3];
    device_linear_forward_stats forward;
    device_linear_backward_stats backward;
};

static_assert(sizeof(linear_device_state) < 1024, "octet::cuda::linear_context: memory() says under 1 KiB of state");

OCTET_KERNEL void linear_state_init_kernel(float* history, int floats, linear_device_state* s) {
    for (int i = threadIdx.x; i < floats; i += blockDim.x) history[i] = 0.0f;
    if (threadIdx.x == 0) {
        for (int k = 0; k < 3; ++k) s->delayed[k] = delayed_scaling_state{};
        s->forward = device_linear_forward_stats{};
        s->backward = device_linear_backward_stats{};
    }
}

/// Delayed scaling's record and update (quant/delayed.hpp's OCTET_HD rules, as the host context
/// applies them) for `count` consecutive operands from `first`: amax[k] is the step's amax of
/// operand first + k (the statistics' x_amax, w_amax or dy_amax).
OCTET_KERNEL void linear_delayed_push_kernel(float* history, linear_device_state* s, int first, int count,
                                             const float* amax, delayed_scaling_config c) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    for (int k = first; k < first + count; ++k) {
        record(s->delayed[k], amax[k - first]);
        update(history + static_cast<std::size_t>(k) * static_cast<std::size_t>(c.history_length), s->delayed[k], c);
    }
}

/// One quantized copy's storage in device memory at its largest shape (the host quant_buffer's
/// layouts, so the same bytes), from the executor's allocator.
template <class R>
class device_quant_buffer {
public:
    device_quant_buffer(const stream_executor& ex, std::size_t max_rows, std::size_t max_cols)
        : max_(quant_layout_of<R>::make(max_rows, max_cols)),
          storage_(ex, scratch_round(max_.data_bytes) + scratch_round(max_.scale_bytes) +
                           (R::two_level ? sizeof(float) : 0)) {}
    quantized_ref<R> ref(std::size_t rows, std::size_t cols) {
        layout_ = quant_layout_of<R>::make(rows, cols);
        OCTET_REQUIRE(layout_.data_bytes <= max_.data_bytes && layout_.scale_bytes <= max_.scale_bytes,
                      "octet::cuda::linear_context", "shape",
                      message("of a ", rows, " x ", cols, " copy exceeds the storage the context holds (internal)"));
        return quantized_ref<R>(data(), scales(), layout_, tensor_scale());
    }
    quantized_cref<R> cref() const { return quantized_cref<R>(data(), scales(), layout_, tensor_scale()); }

private:
    std::uint8_t* data() const { return storage_.as<std::uint8_t>(); }
    std::uint8_t* scales() const { return data() + scratch_round(max_.data_bytes); }
    float* tensor_scale() const {
        return R::two_level ? reinterpret_cast<float*>(scales() + scratch_round(max_.scale_bytes)) : nullptr;
    }
    quant_layout max_, layout_{};
    stream_scratch storage_;
};

}  // namespace detail

namespace cuda {

/// octet::linear_context on a CUDA stream: one layer's quantized copies, Hadamard buffer,
/// delayed-scaling state (history, scale amax) and last statistics, all in device memory from the
/// allocator of the executor it is built with (returned on that stream when destroyed), with the
/// host context's rules: the same config checks, shapes, saved-forward rule, stochastic-rounding
/// step and delayed-scaling record and update, so that the copies equal the host context's bit for
/// bit on the same inputs (Y, dX and dW are then scaled_gemm's stream results on them). The update
/// runs on the device (a one-thread kernel after each training forward and backward, as
/// octet::cuda::delayed_scaling's), so nothing here synchronizes the host: calls enqueue on their
/// executor's stream, and a call on another stream than the context's is the caller's to order.
/// One difference, quantize's on a stream: a history whose amaxes are all 0 gives scale 1 where
/// the host measures (device_quantize_options::device_tensor_amax).
template <class LR>
class linear_context {
    static_assert(is_linear_recipe_v<LR>,
                  "octet::cuda::linear_context: LR must be an octet::linear_recipe<...> (see octet::linear_recipes)");

public:
    using recipe_type = LR;
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    using GR = typename LR::g_quantize_recipe;

    /// Allocates the buffers from ex's allocator and enqueues the state's initialization on ex.stream.
    linear_context(stream_executor ex, const linear_config& c)
        : config_(detail::checked_linear_config<LR>(c, "octet::cuda::linear_context", /*on_stream=*/true)),
          copies_(c, ex),
          rotated_(ex, rotated_floats() * sizeof(float)),
          history_(ex, history_floats() * sizeof(float)),
          state_(ex, sizeof(detail::linear_device_state)) {
        cuda::launch("linear_state_init_kernel", detail::linear_state_init_kernel, 1, 128, 0, ex.stream,
                     history_.as<float>(), static_cast<int>(history_floats()), state());
        OCTET_CUDA_CHECK_LAUNCH();
    }

    const linear_config& config() const { return config_; }
    void set_collect_stats(bool on) { config_.collect_stats = on; }
    /// The device bytes by role, as the host context's memory(): the buffers are those sizes, each
    /// allocation rounded up to 256 bytes, plus one block of under 1 KiB for the delayed-scaling
    /// states and the statistics.
    linear_memory memory() const { return detail::linear_context_memory<LR>(config_); }
    std::size_t bytes() const { return memory().total(); }

    std::uint64_t step() const { return step_; }
    void set_step(std::uint64_t s) { step_ = s; }
    bool has_saved_forward() const { return saved_; }
    std::size_t saved_tokens() const { return tokens_; }
    static std::size_t wgrad_tokens(std::size_t tokens) { return linear_wgrad_tokens<LR>(tokens); }

    /// Device memory, written by the last forward / backward (zeros before the first): each copy's
    /// statistics (when config().collect_stats) and the finite amaxes. Copy them with
    /// cudaMemcpyAsync on the context's stream to read them.
    const device_linear_forward_stats* forward_stats() const { return &state()->forward; }
    const device_linear_backward_stats* backward_stats() const { return &state()->backward; }
    /// Device memory: the delayed-scaling state of X (0), W (1) and dY (2), and its history of
    /// config().delayed.history_length floats (unused under current scaling).
    const delayed_scaling_state* delayed_state(int operand) const {
        return &state()->delayed[checked_operand(operand, "operand")];
    }
    const float* delayed_history(int operand) const {
        return history_.as<float>() +
               static_cast<std::size_t>(checked_operand(operand, "operand")) * config_.delayed.history_length;
    }

    /// Y = X W^T + bias (device memory) on quantized copies of X and W; a training pass keeps the
    /// column-wise copies for backward() and pushes X's and W's amaxes into their histories.
    void forward(const stream_executor& ex, matrix_ref<const float> x, matrix_ref<const float> w,
                 span<const float> bias, matrix_ref<float> y, linear_pass pass = linear_pass::training) {
        detail::require_context_forward(config_, x, w);
        const bool training = pass == linear_pass::training;
        if (training) saved_ = false;  // until the new copies are complete
        octet::linear_forward<LR>(ex, x, w, bias, y, copies_.forward(config_, x.rows, training, rotated()), options(),
                                  &state()->forward);
        if (training) {
            if constexpr (LR::scaling == linear_scaling::delayed) push(ex, 0, 2, &state()->forward.x_amax);
            tokens_ = x.rows;
            saved_ = true;
        }
    }

    /// dX, dW and db (device memory; each skipped when passed empty) from the copies of the
    /// training forward before it. One backward per training forward.
    void backward(const stream_executor& ex, matrix_ref<const float> dy, matrix_ref<float> dx, matrix_ref<float> dw,
                  span<float> db) {
        detail::require_context_backward(config_, saved_, tokens_, dy, dx, dw);
        const bool want_dx = !detail::matrix_absent(dx), want_dw = !detail::matrix_absent(dw);
        octet::linear_backward<LR>(ex, dy, dx, dw, db, copies_.backward(config_, tokens_, want_dx, want_dw, rotated()),
                                   options(), &state()->backward);
        if constexpr (LR::scaling == linear_scaling::delayed) {
            if (detail::linear_backward_quantizes_dy<LR>(want_dx, want_dw)) push(ex, 2, 1, &state()->backward.dy_amax);
        }
        ++step_;
        saved_ = false;
    }

private:
    std::size_t rotated_floats() const { return detail::linear_rotated_floats<LR>(config_); }
    std::size_t history_floats() const {
        return LR::scaling == linear_scaling::delayed ? 3 * static_cast<std::size_t>(config_.delayed.history_length)
                                                      : 0;
    }
    static int checked_operand(int operand, const char* arg) {
        OCTET_REQUIRE(operand >= 0 && operand < 3, "octet::cuda::linear_context", arg,
                      detail::message("is ", operand, "; pass 0 (X), 1 (W) or 2 (dY)"));
        return operand;
    }
    span<float> rotated() const { return span<float>(rotated_.as<float>(), rotated_floats()); }
    detail::linear_device_state* state() const { return state_.as<detail::linear_device_state>(); }

    void push(const stream_executor& ex, int first, int count, const float* amax) {
        cuda::launch("linear_delayed_push_kernel", detail::linear_delayed_push_kernel, 1, 1, 0, ex.stream,
                     history_.as<float>(), state(), first, count, amax, config_.delayed);
        OCTET_CUDA_CHECK_LAUNCH();
        for (int k = first; k < first + count; ++k) ++pushes_[k];
    }

    /// As the host context's: the scale amaxes of delayed scaling (null, so measured, until an
    /// operand's first push), the seed and the backward count.
    device_linear_step_options options() const {
        device_linear_step_options o;
        if constexpr (LR::scaling == linear_scaling::delayed) {
            o.x_scale_amax = pushes_[0] ? &state()->delayed[0].scale_amax : nullptr;
            o.w_scale_amax = pushes_[1] ? &state()->delayed[1].scale_amax : nullptr;
            o.g_scale_amax = pushes_[2] ? &state()->delayed[2].scale_amax : nullptr;
        }
        o.seed = config_.seed;
        o.step = step_;
        o.collect_stats = config_.collect_stats;
        return o;
    }

    linear_config config_;
    detail::linear_copies<LR, detail::device_quant_buffer> copies_;
    detail::stream_scratch rotated_, history_, state_;
    std::uint64_t step_ = 0, pushes_[3] = {0, 0, 0};
    std::size_t tokens_ = 0;
    bool saved_ = false;
};

}  // namespace cuda

/// The stream context's forward and backward under the host context's names.
template <class LR>
void linear_forward(const stream_executor& ex, cuda::linear_context<LR>& ctx, matrix_ref<const float> x,
                    matrix_ref<const float> w, span<const float> bias, matrix_ref<float> y,
                    linear_pass pass = linear_pass::training) {
    ctx.forward(ex, x, w, bias, y, pass);
}
template <class LR>
void linear_backward(const stream_executor& ex, cuda::linear_context<LR>& ctx, matrix_ref<const float> dy,
                     matrix_ref<float> dx, matrix_ref<float> dw, span<float> db) {
    ctx.backward(ex, dy, dx, dw, db);
}

}  // namespace octet
