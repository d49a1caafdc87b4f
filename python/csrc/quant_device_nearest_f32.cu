// The quantize op's CUDA instantiations: nearest_even rounding, float32 input, every named recipe
// (device_ops.hpp).
#include "quant_device.cuh"

#define OCTET_TORCH_DEVICE_QUANTIZE_NEAREST_F32(name) \
    OCTET_TORCH_DEVICE_QUANTIZE(octet::round::nearest_even, float, name)
OCTET_TORCH_RECIPES(OCTET_TORCH_DEVICE_QUANTIZE_NEAREST_F32)
