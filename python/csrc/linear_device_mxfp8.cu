// The linear ops' CUDA half for octet::linear_recipes::mxfp8 (linear_device.hpp).
#include "linear_device.cuh"

OCTET_TORCH_DEVICE_LINEAR(mxfp8)
