// octet/quant/delayed.cuh: delayed scaling with its state in device memory.
//
//   octet::cuda::delayed_scaling ds(octet::on_stream(s), {16, 0, octet::amax_reduction::max});
//   ds.quantize<Recipe>(octet::on_stream(s), x, rowwise, columnwise);   // scale from the history,
//                                                                        // records this step's amax
//   ds.update(octet::on_stream(s));                                      // end of step
//
// One pass over x per step: the quantizer reads the scale amax from the device state and records
// the step's amax with an atomic max in the same kernel; update() is a one-thread kernel running
// the same OCTET_HD update() as the host class (quant/delayed.hpp), so the two agree bit for bit.
// The first step, before any history exists, measures the amax (current scaling). The state comes
// from the allocator of the executor it is constructed with; construction, quantize and update
// enqueue work and never synchronize.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/quant/delayed.hpp"
#include "octet/quant/quantize.cuh"

namespace octet {
namespace detail {
OCTET_KERNEL void delayed_update_kernel(float* history, delayed_scaling_state* state, delayed_scaling_config config) {
    if (threadIdx.x == 0 && blockIdx.x == 0) update(history, *state, config);
}
OCTET_KERNEL void delayed_init_kernel(float* history, int length, delayed_scaling_state* state) {
    for (int i = threadIdx.x; i < length; i += blockDim.x) history[i] = 0.0f;
    if (threadIdx.x == 0) *state = delayed_scaling_state{};
}
}  // namespace detail

namespace cuda {

/// Delayed scaling with its state (history and delayed_scaling_state) in device memory from the
/// executor's allocator (returned on its stream when destroyed). Nothing here synchronizes except
/// the two inspectors whose names say so.
class delayed_scaling {
public:
    /// Allocates the state from ex's allocator and enqueues its initialization on ex.stream (one
    /// small kernel).
    delayed_scaling(stream_executor ex, delayed_scaling_config c)
        : host_(c),
          history_(ex, static_cast<std::size_t>(c.history_length) * sizeof(float)),
          state_(ex, sizeof(delayed_scaling_state)) {
        cuda::launch("delayed_init_kernel", detail::delayed_init_kernel, 1, 128, 0, ex.stream, history_.as<float>(),
                     c.history_length, state());
        OCTET_CUDA_CHECK_LAUNCH();
    }
    /// The state on the default stream with octet's default allocator.
    explicit delayed_scaling(delayed_scaling_config c = {}) : delayed_scaling(on_stream(), c) {}

    /// Quantize with the scale from the history and record this step's amax.
    template <class Recipe, class T>
    void quantize(stream_executor ex, matrix_ref<T> x, quantized_ref<Recipe> rowwise,
                  quantized_ref<Recipe> columnwise = {}, device_quantize_options opt = {}) {
        static_assert(Recipe::is_per_tensor, "octet::cuda::delayed_scaling: delayed scaling is for per-tensor recipes");
        opt.device_tensor_amax = steps_with_history_ > 0 ? &state()->scale_amax : nullptr;
        opt.device_record = &state()->step_amax;
        opt.device_record_flag = &state()->quantized;
        octet::quantize<Recipe>(ex, x, rowwise, columnwise, opt);
        quantized_this_step_ = true;
    }

    /// End of step: push the step's amax (if the tensor was quantized) and reduce the window.
    void update(stream_executor ex) {
        cuda::launch("delayed_update_kernel", detail::delayed_update_kernel, 1, 1, 0, ex.stream, history_.as<float>(),
                     state(), host_.config());
        OCTET_CUDA_CHECK_LAUNCH();
        if (quantized_this_step_) ++steps_with_history_;
        quantized_this_step_ = false;
    }

    /// The device state and history (device memory; copy them with cudaMemcpyAsync to inspect).
    delayed_scaling_state* state() const { return state_.as<delayed_scaling_state>(); }
    float* history_data() const { return history_.as<float>(); }
    int history_length() const { return host_.config().history_length; }

    /// Copies of the device state and history: SYNCHRONIZE the device (cudaMemcpy), for tests.
    delayed_scaling_state state_synchronizing() const {
        delayed_scaling_state s;
        OCTET_CUDA_CHECK(cudaMemcpy(&s, state(), sizeof s, cudaMemcpyDeviceToHost));
        return s;
    }
    std::vector<float> history_synchronizing() const {
        std::vector<float> h(static_cast<std::size_t>(history_length()));
        if (!h.empty())
            OCTET_CUDA_CHECK(cudaMemcpy(h.data(), history_data(), h.size() * sizeof(float), cudaMemcpyDeviceToHost));
        return h;
    }

private:
    octet::delayed_scaling host_;  // validates the configuration and holds it
    detail::stream_scratch history_;
    detail::stream_scratch state_;
    long long steps_with_history_ = 0;
    bool quantized_this_step_ = false;
};

}  // namespace cuda
}  // namespace octet
