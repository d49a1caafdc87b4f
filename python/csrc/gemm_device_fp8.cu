// The scaled_mm op's CUDA instantiations: the per-tensor, per-row and block pairs, float32,
// bfloat16 and float16 output (device_ops.hpp).
#include "gemm_device.cuh"

OCTET_TORCH_GEMM_PAIRS_FP8(OCTET_TORCH_DEVICE_GEMM_ALL)
