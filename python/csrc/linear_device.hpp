// linear_device.hpp: the CUDA half of the linear ops (linear_common.hpp), declared free of torch's
// headers and of device code, as device_ops.hpp does for the quantizer and the GEMM: the op's
// .cpp calls these with the tensors' device pointers and the executor of torch's current stream;
// shards linear_device_<recipe>.cu (nvcc, no torch; generated from registry.hpp's
// OCTET_TORCH_LINEAR_RECIPES for the recipes whose on_cuda is true) define them through
// octet/nn/linear.cuh. Compiled only when the op libraries are built with CUDA (OCTET_TORCH_CUDA).
#pragma once

#include "octet/core/matrix.hpp"
#include "octet/core/span.hpp"
#include "octet/cuda/executor.cuh"
#include "octet/nn/linear.hpp"

namespace octet_torch::device {

/// octet::linear_forward<LR> on ex's stream (enqueues; never synchronizes).
template <class LR>
void linear_forward(const octet::stream_executor& ex, octet::matrix_ref<const float> x,
                    octet::matrix_ref<const float> w, octet::span<const float> bias, octet::matrix_ref<float> y,
                    const octet::linear_forward_buffers<LR>& buf, const octet::device_linear_step_options& o,
                    octet::device_linear_forward_stats* stats);

/// octet::linear_backward<LR> on ex's stream (enqueues; never synchronizes).
template <class LR>
void linear_backward(const octet::stream_executor& ex, octet::matrix_ref<const float> dy, octet::matrix_ref<float> dx,
                     octet::matrix_ref<float> dw, octet::span<float> db, const octet::linear_backward_buffers<LR>& buf,
                     const octet::device_linear_step_options& o, octet::device_linear_backward_stats* stats);

}  // namespace octet_torch::device

/// The shard X(name, on_cuda) of OCTET_TORCH_LINEAR_RECIPES on CUDA: the explicit instantiations
/// for octet::linear_recipes::name (the generated linear_device_<name>.cu).
#define OCTET_TORCH_DEVICE_LINEAR_SHARD(name, on_cuda)                                                                \
    template void octet_torch::device::linear_forward<octet::linear_recipes::name>(                                   \
        const octet::stream_executor&, octet::matrix_ref<const float>, octet::matrix_ref<const float>,                \
        octet::span<const float>, octet::matrix_ref<float>,                                                           \
        const octet::linear_forward_buffers<octet::linear_recipes::name>&, const octet::device_linear_step_options&,  \
        octet::device_linear_forward_stats*);                                                                         \
    template void octet_torch::device::linear_backward<octet::linear_recipes::name>(                                  \
        const octet::stream_executor&, octet::matrix_ref<const float>, octet::matrix_ref<float>,                      \
        octet::matrix_ref<float>, octet::span<float>,                                                                 \
        const octet::linear_backward_buffers<octet::linear_recipes::name>&, const octet::device_linear_step_options&, \
        octet::device_linear_backward_stats*);
