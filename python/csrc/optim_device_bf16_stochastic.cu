// The fused AdamW step's CUDA instantiations with master::bf16_stochastic, every state codec, float32 and
// bfloat16 gradients (optim_device.hpp).
#include "optim_device.cuh"

#define OCTET_TORCH_DEVICE_ADAMW_BF16_STOCHASTIC(codec)     \
    OCTET_TORCH_DEVICE_ADAMW(codec, bf16_stochastic, float) \
    OCTET_TORCH_DEVICE_ADAMW(codec, bf16_stochastic, octet::bf16)
OCTET_TORCH_CODECS(OCTET_TORCH_DEVICE_ADAMW_BF16_STOCHASTIC)
