// The attention ops' CUDA backward for float inputs (attention_device.hpp).
#include "attention_device.cuh"

OCTET_TORCH_DEVICE_ATTENTION_BACKWARD(float)
