// optim_device.hpp: the CUDA half of the AdamW ops, declared free of torch's headers and of device
// code (as device_ops.hpp does for quantize and scaled_mm): optim_adamw.hpp calls these under
// OCTET_TORCH_CUDA; optim_device_<master>.cu define and instantiate them.
#pragma once

#include "octet/cuda/executor.cuh"
#include "octet/optim/adamw.hpp"

namespace octet_torch::device {

/// octet::adamw_step on ex's stream: `report` is device memory for one octet::adamw_report, zeroed
/// and filled on the stream.
template <class Codec, class Master, class Grad>
void adamw_step(const octet::stream_executor& ex, const octet::adamw_state_ref<Codec, Codec, Master>& state,
                octet::span<const Grad> grads, const octet::adamw_hyper& hyper, std::uint64_t step, float lr,
                octet::adamw_report* report);

/// octet::count_nonfinite on ex's stream into report->nonfinite_gradients (device memory, added to:
/// zero it first).
template <class Grad>
void count_nonfinite(const octet::stream_executor& ex, octet::span<const Grad> grads, octet::adamw_report* report);

}  // namespace octet_torch::device

// The explicit instantiations optim_device_<master>.cu make, one codec at a time (OCTET_TORCH_CODECS).
#define OCTET_TORCH_DEVICE_ADAMW(codec, policy, Grad)                                                               \
    template void octet_torch::device::adamw_step<octet::state_codec::codec, octet::master::policy, Grad>(          \
        const octet::stream_executor&,                                                                              \
        const octet::adamw_state_ref<octet::state_codec::codec, octet::state_codec::codec, octet::master::policy>&, \
        octet::span<const Grad>, const octet::adamw_hyper&, std::uint64_t, float, octet::adamw_report*);
/// X(codec) for every state codec the op serves (optim_adamw.hpp's with_codec).
#define OCTET_TORCH_CODECS(X) X(fp32) X(bf16) X(bf16_stochastic) X(e4m3_scaled) X(e4m3_expanded) X(dynamic8)
