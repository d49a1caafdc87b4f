// The attention ops' CUDA backward for octet::bf16 inputs (attention_device.hpp).
#include "attention_device.cuh"

OCTET_TORCH_DEVICE_ATTENTION_BACKWARD(octet::bf16)
