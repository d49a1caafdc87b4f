// The dequantize op's CUDA instantiations: every named recipe, float32, bfloat16 and float16 output
// (device_ops.hpp).
#include "quant_device.cuh"

#define OCTET_TORCH_DEVICE_DEQUANTIZE_ALL(name)      \
    OCTET_TORCH_DEVICE_DEQUANTIZE(float, name)       \
    OCTET_TORCH_DEVICE_DEQUANTIZE(octet::bf16, name) \
    OCTET_TORCH_DEVICE_DEQUANTIZE(octet::fp16, name)
OCTET_TORCH_RECIPES(OCTET_TORCH_DEVICE_DEQUANTIZE_ALL)
