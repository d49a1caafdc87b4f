// gemm_device.cuh: the definition behind device_ops.hpp's scaled_gemm, for the gemm_device_*.cu
// files to instantiate (nvcc only; no torch).
#pragma once

#include "device_ops.hpp"
#include "gemm_pairs.hpp"
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
