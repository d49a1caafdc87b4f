// The quantize op's CUDA instantiations: nearest_even rounding, bf16 input, every named recipe
// (device_ops.hpp).
#include "quant_device.cuh"

#define OCTET_TORCH_DEVICE_QUANTIZE_NEAREST_BF16(name) \
    OCTET_TORCH_DEVICE_QUANTIZE(octet::round::nearest_even, octet::bf16, name)
OCTET_TORCH_RECIPES(OCTET_TORCH_DEVICE_QUANTIZE_NEAREST_BF16)
