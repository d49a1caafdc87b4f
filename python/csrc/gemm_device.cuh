// gemm_device.cuh: the definition behind device_ops.hpp's scaled_gemm, for the shards
// gemm_device_<shard>.cu (generated from registry.hpp's OCTET_TORCH_GEMM_SHARDS) to instantiate
// (nvcc only; no torch).
#pragma once

#include "device_ops.hpp"
#include "octet/gemm/scaled_gemm.cuh"

namespace octet_torch::device {

template <class RA, class RB, class Out>
void scaled_gemm(const octet::stream_executor& ex, octet::quantized_cref<RA> A, octet::quantized_cref<RB> B,
                 const octet::matrix_ref<const Out>* C, octet::matrix_ref<Out> D, const octet::gemm_options& opt) {
    if (C)
        octet::scaled_gemm(ex, A, B, *C, D, opt);
    else
        octet::scaled_gemm(ex, A, B, D, opt);
}

}  // namespace octet_torch::device

/// The shard X(shard, pairs) of OCTET_TORCH_GEMM_SHARDS on CUDA: the pair list `pairs`, float32,
/// bfloat16 and float16 output. Only the MXFP8 pairs have kernels on Ada and Hopper among the MX
/// and NVFP4 ones; the others are refused at run time with octet's message (they run on the CPU).
#define OCTET_TORCH_DEVICE_GEMM_SHARD(shard, pairs) pairs(OCTET_TORCH_DEVICE_GEMM_ALL)
