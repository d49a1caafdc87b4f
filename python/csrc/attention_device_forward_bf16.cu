// The attention ops' CUDA forward for octet::bf16 inputs (attention_device.hpp).
#include "attention_device.cuh"

OCTET_TORCH_DEVICE_ATTENTION_FORWARD(octet::bf16)
