// optim_device.hpp: the CUDA half of the AdamW ops, declared free of torch's headers and of device
// code (as device_ops.hpp does for quantize and scaled_mm): optim_adamw.hpp calls these under
// OCTET_TORCH_CUDA; the shards optim_device_<master>.cu (generated from registry.hpp's
// OCTET_TORCH_ADAMW_MASTERS) and optim_device_count.cu define and instantiate them.
#pragma once

#include "octet/cuda/executor.cuh"
#include "octet/optim/adamw.hpp"
#include "registry.hpp"

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

// One explicit instantiation of the step (OCTET_TORCH_DEVICE_ADAMW_OF: for
// OCTET_TORCH_ADAMW_CODECS_WITH to expand with (policy, Grad) as its data).
#define OCTET_TORCH_DEVICE_ADAMW(policy, Grad, codec)                                                               \
    template void octet_torch::device::adamw_step<octet::state_codec::codec, octet::master::policy, Grad>(          \
        const octet::stream_executor&,                                                                              \
        const octet::adamw_state_ref<octet::state_codec::codec, octet::state_codec::codec, octet::master::policy>&, \
        octet::span<const Grad>, const octet::adamw_hyper&, std::uint64_t, float, octet::adamw_report*);
#define OCTET_TORCH_DEVICE_ADAMW_OF(codec, data) OCTET_TORCH_APPLY(OCTET_TORCH_DEVICE_ADAMW, data, codec)

/// The shard X(policy) of OCTET_TORCH_ADAMW_MASTERS on CUDA: every codec, float32 and bfloat16
/// gradients (the generated optim_device_<policy>.cu).
#define OCTET_TORCH_DEVICE_ADAMW_SHARD(policy)                                  \
    OCTET_TORCH_ADAMW_CODECS_WITH(OCTET_TORCH_DEVICE_ADAMW_OF, (policy, float)) \
    OCTET_TORCH_ADAMW_CODECS_WITH(OCTET_TORCH_DEVICE_ADAMW_OF, (policy, octet::bf16))
