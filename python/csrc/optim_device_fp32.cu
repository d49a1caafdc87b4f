// The fused AdamW step's CUDA instantiations with master::fp32, every state codec, float32 and
// bfloat16 gradients (optim_device.hpp).
#include "optim_device.cuh"

#define OCTET_TORCH_DEVICE_ADAMW_FP32(codec) \
    OCTET_TORCH_DEVICE_ADAMW(codec, fp32, float) OCTET_TORCH_DEVICE_ADAMW(codec, fp32, octet::bf16)
OCTET_TORCH_CODECS(OCTET_TORCH_DEVICE_ADAMW_FP32)

template void octet_torch::device::count_nonfinite<float>(const octet::stream_executor&, octet::span<const float>,
                                                          octet::adamw_report*);
template void octet_torch::device::count_nonfinite<octet::bf16>(const octet::stream_executor&,
                                                                octet::span<const octet::bf16>, octet::adamw_report*);
