// octet/quant/delayed.cuh: delayed scaling with its state in device memory.
//
//   octet::cuda::delayed_scaling ds({16, 0, octet::amax_reduction::max});
//   ds.quantize<Recipe>(octet::on_stream(s), x, rowwise, columnwise);   // scale from the history,
//                                                                        // records this step's amax
//   ds.update(octet::on_stream(s));                                      // end of step
//
// One pass over x per step: the quantizer reads the scale amax from the device state and records
// the step's amax with an atomic max in the same kernel; update() is a one-thread kernel running
// the same OCTET_HD update() as the host class (quant/delayed.hpp), so the two agree bit for bit.
// The first step, before any history exists, measures the amax (current scaling).
#pragma once

#include <cuda_runtime.h>

#include "octet/cuda/buffer.cuh"
#include "octet/quant/delayed.hpp"
#include "octet/quant/quantize.cuh"

namespace octet {
namespace detail {
OCTET_KERNEL void delayed_update_kernel(float* history, delayed_scaling_state* state, delayed_scaling_config config) {
    if (threadIdx.x == 0 && blockIdx.x == 0) update(history, *state, config);
}
}  // namespace detail

namespace cuda {

class delayed_scaling {
public:
    explicit delayed_scaling(delayed_scaling_config c = {})
        : host_(c), history_(static_cast<std::size_t>(c.history_length)), state_(1) {
        history_.fill_bytes(0);
        const delayed_scaling_state init{};
        OCTET_CUDA_CHECK(cudaMemcpy(state_.data(), &init, sizeof init, cudaMemcpyHostToDevice));
    }

    /// Quantize with the scale from the history and record this step's amax.
    template <class Recipe, class T>
    void quantize(stream_executor ex, matrix_ref<T> x, quantized_ref<Recipe> rowwise,
                  quantized_ref<Recipe> columnwise = {}, device_quantize_options opt = {}) {
        static_assert(Recipe::is_per_tensor, "octet::cuda::delayed_scaling: delayed scaling is for per-tensor recipes");
        opt.device_tensor_amax = steps_with_history_ > 0 ? &state_.data()->scale_amax : nullptr;
        opt.device_record = &state_.data()->step_amax;
        opt.device_record_flag = &state_.data()->quantized;
        octet::quantize<Recipe>(ex, x, rowwise, columnwise, opt);
        quantized_this_step_ = true;
    }

    /// End of step: push the step's amax (if the tensor was quantized) and reduce the window.
    void update(stream_executor ex) {
        detail::delayed_update_kernel<<<1, 1, 0, ex.stream>>>(history_.data(), state_.data(), host_.config());
        OCTET_CUDA_CHECK_LAUNCH();
        if (quantized_this_step_) ++steps_with_history_;
        quantized_this_step_ = false;
    }

    /// The device state (copy back for inspection; synchronizes).
    delayed_scaling_state state() const {
        delayed_scaling_state s;
        OCTET_CUDA_CHECK(cudaMemcpy(&s, state_.data(), sizeof s, cudaMemcpyDeviceToHost));
        return s;
    }
    std::vector<float> history() const { return history_.download(); }

private:
    octet::delayed_scaling host_;  // validates the configuration and holds it
    device_buffer<float> history_;
    device_buffer<delayed_scaling_state> state_;
    long long steps_with_history_ = 0;
    bool quantized_this_step_ = false;
};

}  // namespace cuda
}  // namespace octet
