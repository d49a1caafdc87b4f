// The scaled_mm op's CUDA instantiations: the MX and NVFP4 pairs, float32, bfloat16 and float16
// output (device_ops.hpp). Only the MXFP8 pairs have kernels on Ada and Hopper; the others are
// refused at run time with octet's message (they run on the CPU).
#include "gemm_device.cuh"

OCTET_TORCH_GEMM_PAIRS_NARROW(OCTET_TORCH_DEVICE_GEMM_ALL)
