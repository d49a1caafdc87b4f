// linear_device.cuh: the definitions behind linear_device.hpp, for the linear_device_*.cu files to
// instantiate (nvcc only; no torch).
#pragma once

#include "linear_device.hpp"
#include "octet/nn/linear.cuh"

namespace octet_torch::device {

template <class LR>
void linear_forward(const octet::stream_executor& ex, octet::matrix_ref<const float> x,
                    octet::matrix_ref<const float> w, octet::span<const float> bias, octet::matrix_ref<float> y,
                    const octet::linear_forward_buffers<LR>& buf, const octet::device_linear_step_options& o,
                    octet::device_linear_forward_stats* stats) {
    octet::linear_forward<LR>(ex, x, w, bias, y, buf, o, stats);
}

template <class LR>
void linear_backward(const octet::stream_executor& ex, octet::matrix_ref<const float> dy, octet::matrix_ref<float> dx,
                     octet::matrix_ref<float> dw, octet::span<float> db, const octet::linear_backward_buffers<LR>& buf,
                     const octet::device_linear_step_options& o, octet::device_linear_backward_stats* stats) {
    octet::linear_backward<LR>(ex, dy, dx, dw, db, buf, o, stats);
}

}  // namespace octet_torch::device
