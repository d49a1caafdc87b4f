// The attention ops' CUDA forward for float inputs (attention_device.hpp).
#include "attention_device.cuh"

OCTET_TORCH_DEVICE_ATTENTION_FORWARD(float)
