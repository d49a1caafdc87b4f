// attention_device.hpp: the CUDA half of the attention ops (attention_ops.hpp), declared free of
// torch's headers and of device code (as device_ops.hpp does for the quantizer): the op's .cpp
// calls these with the tensors' device pointers, the offsets' device copies in `shape`, and the
// executor of torch's current stream; the shards attention_device_{forward,backward}_<dtype>.cu
// (nvcc, no torch; generated from registry.hpp's OCTET_TORCH_ATTENTION_INPUTS) define them through
// octet/attention/attention.cuh. Head dims 64 and 128 (the stream kernels'). Compiled only when
// the op libraries are built with CUDA (OCTET_TORCH_CUDA).
#pragma once

#include "octet/attention/attention.hpp"
#include "octet/core/matrix.hpp"
#include "octet/core/span.hpp"
#include "octet/cuda/executor.cuh"
#include "octet/quant/stats.hpp"

namespace octet_torch::device {

/// Q, K and V quantized with the op's recipes (attention_rules.hpp) into scratch from ex's
/// allocator, then octet::attention_forward on ex's stream. `stats`: device memory for six
/// quant_stats (Q's row-wise and unused column-wise slot, then K's, then V's), or null.
/// Enqueues; never synchronizes.
template <class In>
void attention_forward(const octet::stream_executor& ex, const octet::attention_shape& shape, bool per_token_v,
                       octet::matrix_ref<const In> q, octet::matrix_ref<const In> k, octet::matrix_ref<const In> v,
                       octet::matrix_ref<In> o, octet::span<float> lse, const octet::attention_options& opt,
                       octet::quant_stats* stats);

/// Q, K, V and dO quantized as the forward did (deterministic: the same codes), then
/// octet::attention_backward on ex's stream with `workspace` and `device_stats` (device memory for
/// one attention_stats); with opt.telemetry, `telemetry` (device memory, backward_telemetry_size
/// doubles) receives the telemetry vector and `dout_stats` (two quant_stats, or null) dO's
/// statistics. Enqueues; never synchronizes.
template <class In>
void attention_backward(const octet::stream_executor& ex, const octet::attention_shape& shape, bool per_token_v,
                        octet::matrix_ref<const In> q, octet::matrix_ref<const In> k, octet::matrix_ref<const In> v,
                        octet::matrix_ref<const In> o, octet::span<const float> lse, octet::matrix_ref<const In> dout,
                        octet::matrix_ref<In> dq, octet::matrix_ref<In> dk, octet::matrix_ref<In> dv,
                        octet::span<float> workspace, const octet::attention_backward_options& opt,
                        octet::attention_stats* device_stats, double* telemetry, octet::quant_stats* dout_stats);

}  // namespace octet_torch::device

// The explicit instantiations of the shards X(shard, In) of OCTET_TORCH_ATTENTION_INPUTS on CUDA (the
// generated attention_device_forward_<shard>.cu and attention_device_backward_<shard>.cu).
#define OCTET_TORCH_DEVICE_ATTENTION_FORWARD_SHARD(shard, In) OCTET_TORCH_DEVICE_ATTENTION_FORWARD(In)
#define OCTET_TORCH_DEVICE_ATTENTION_BACKWARD_SHARD(shard, In) OCTET_TORCH_DEVICE_ATTENTION_BACKWARD(In)
#define OCTET_TORCH_DEVICE_ATTENTION_FORWARD(In)                                                             \
    template void octet_torch::device::attention_forward<In>(                                                \
        const octet::stream_executor&, const octet::attention_shape&, bool, octet::matrix_ref<const In>,     \
        octet::matrix_ref<const In>, octet::matrix_ref<const In>, octet::matrix_ref<In>, octet::span<float>, \
        const octet::attention_options&, octet::quant_stats*);
#define OCTET_TORCH_DEVICE_ATTENTION_BACKWARD(In)                                                                     \
    template void octet_torch::device::attention_backward<In>(                                                        \
        const octet::stream_executor&, const octet::attention_shape&, bool, octet::matrix_ref<const In>,              \
        octet::matrix_ref<const In>, octet::matrix_ref<const In>, octet::matrix_ref<const In>,                        \
        octet::span<const float>, octet::matrix_ref<const In>, octet::matrix_ref<In>, octet::matrix_ref<In>,          \
        octet::matrix_ref<In>, octet::span<float>, const octet::attention_backward_options&, octet::attention_stats*, \
        double*, octet::quant_stats*);
