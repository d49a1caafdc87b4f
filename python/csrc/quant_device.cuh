// quant_device.cuh: the definitions behind device_ops.hpp's quantize and dequantize, for the
// quant_device_*.cu files to instantiate (nvcc only; no torch): quant_device_dequantize.cu and the
// shards quant_device_<shard>.cu generated from registry.hpp's OCTET_TORCH_QUANTIZE_SHARDS.
#pragma once

#include "device_ops.hpp"
#include "octet/quant/quantize.cuh"

namespace octet_torch::device {

template <class Recipe, class In>
void quantize(const octet::stream_executor& ex, octet::matrix_ref<const In> x, octet::quantized_ref<Recipe> rowwise,
              octet::quantized_ref<Recipe> columnwise, const quantize_args& args) {
    octet::device_quantize_options opt;
    opt.device_stats = args.stats;
    opt.device_tensor_amax = args.tensor_amax;
    opt.device_record = args.amax;
    opt.rng = args.rng;
    octet::quantize<Recipe>(ex, x, rowwise, columnwise, opt);
}

template <class Recipe, class Out>
void dequantize(const octet::stream_executor& ex, octet::quantized_cref<Recipe> q, octet::matrix_ref<Out> out) {
    octet::dequantize(ex, q, out);
}

}  // namespace octet_torch::device

#define OCTET_TORCH_DEVICE_QUANTIZE_OF(name, data) OCTET_TORCH_APPLY(OCTET_TORCH_DEVICE_QUANTIZE, data, name)

/// The shard X(shard, rounding, In) of OCTET_TORCH_QUANTIZE_SHARDS on CUDA: every named recipe
/// (the generated quant_device_<shard>.cu).
#define OCTET_TORCH_DEVICE_QUANTIZE_SHARD(shard, rounding, In) \
    OCTET_TORCH_RECIPES_WITH(OCTET_TORCH_DEVICE_QUANTIZE_OF, (octet::round::rounding, In))
