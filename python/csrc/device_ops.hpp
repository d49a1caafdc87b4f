// device_ops.hpp: the CUDA halves of the torch ops, declared free of torch's headers and of device
// code: an op's .cpp (the host compiler, torch's headers) calls these with the tensors' device
// pointers and the executor of torch's current stream (octet_torch_cuda.hpp); the quant_device_*.cu
// files (nvcc, no torch) define them and instantiate them for every named recipe. Compiled only
// when the op libraries are built with CUDA (OCTET_TORCH_CUDA).
#pragma once

#include "octet/core/matrix.hpp"
#include "octet/core/philox.hpp"
#include "octet/cuda/executor.cuh"
#include "octet/gemm/scaled_gemm.hpp"
#include "octet/quant/stats.hpp"
#include "octet/quant/tensor.hpp"
#include "registry.hpp"

namespace octet_torch::device {

/// What octet::quantize takes on a stream besides x and the copies. Device pointers; null where
/// not asked.
struct quantize_args {
    octet::quant_stats* stats = nullptr;  ///< two (row-wise, column-wise): zeroed, then filled
    const float* tensor_amax = nullptr;   ///< the amax per-tensor and two-level scales come from; null: measure
    float* amax = nullptr;                ///< receives x's finite amax by atomic max (zero it first)
    octet::philox_stream rng{};
};

/// octet::quantize<Recipe> on ex's stream (enqueues; never synchronizes).
template <class Recipe, class In>
void quantize(const octet::stream_executor& ex, octet::matrix_ref<const In> x, octet::quantized_ref<Recipe> rowwise,
              octet::quantized_ref<Recipe> columnwise, const quantize_args& args);

/// octet::dequantize on ex's stream (one kernel).
template <class Recipe, class Out>
void dequantize(const octet::stream_executor& ex, octet::quantized_cref<Recipe> q, octet::matrix_ref<Out> out);

/// octet::scaled_gemm on ex's stream: D = alpha * A B^T (+ beta * C when C is not null) + bias
/// (octet's own kernels: no cuBLASLt is lent).
template <class RA, class RB, class Out>
void scaled_gemm(const octet::stream_executor& ex, octet::quantized_cref<RA> A, octet::quantized_cref<RB> B,
                 const octet::matrix_ref<const Out>* C, octet::matrix_ref<Out> D, const octet::gemm_options& opt);

}  // namespace octet_torch::device

// The explicit instantiations the quant_device_*.cu files make (the op's .cpp sees only the
// declarations above, so its calls link to these): one per octet::recipes::name, for
// OCTET_TORCH_RECIPES to expand.
#define OCTET_TORCH_DEVICE_QUANTIZE(Round, In, name)                                                            \
    template void octet_torch::device::quantize<octet_torch::with_rounding_t<octet::recipes::name, Round>, In>( \
        const octet::stream_executor&, octet::matrix_ref<const In>,                                             \
        octet::quantized_ref<octet_torch::with_rounding_t<octet::recipes::name, Round>>,                        \
        octet::quantized_ref<octet_torch::with_rounding_t<octet::recipes::name, Round>>,                        \
        const octet_torch::device::quantize_args&);
#define OCTET_TORCH_DEVICE_DEQUANTIZE(Out, name)                              \
    template void octet_torch::device::dequantize<octet::recipes::name, Out>( \
        const octet::stream_executor&, octet::quantized_cref<octet::recipes::name>, octet::matrix_ref<Out>);
#define OCTET_TORCH_DEVICE_GEMM(Out, ra, rb)                                                                    \
    template void octet_torch::device::scaled_gemm<octet::recipes::ra, octet::recipes::rb, Out>(                \
        const octet::stream_executor&, octet::quantized_cref<octet::recipes::ra>,                               \
        octet::quantized_cref<octet::recipes::rb>, const octet::matrix_ref<const Out>*, octet::matrix_ref<Out>, \
        const octet::gemm_options&);
#define OCTET_TORCH_DEVICE_GEMM_ALL(ra, rb)      \
    OCTET_TORCH_DEVICE_GEMM(float, ra, rb)       \
    OCTET_TORCH_DEVICE_GEMM(octet::bf16, ra, rb) \
    OCTET_TORCH_DEVICE_GEMM(octet::fp16, ra, rb)
