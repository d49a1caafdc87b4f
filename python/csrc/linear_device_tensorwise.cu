// The linear ops' CUDA half for octet::linear_recipes::tensorwise (linear_device.hpp).
#include "linear_device.cuh"

OCTET_TORCH_DEVICE_LINEAR(tensorwise)
