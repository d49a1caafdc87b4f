// quant_quantize_instances.hpp: the quantizer instantiations behind the quantize op, spread over
// translation units that compile in parallel: quant_quantize.cpp declares every one extern (so it
// instantiates none) and each quant_quantize_<rounding>_<input>.cpp defines those of one rounding
// and input type, for every named recipe, without parsing torch's headers.
#pragma once

#include "octet/quant/quantize.hpp"
#include "recipe_list.hpp"

// Each OCTET_TORCH_QUANTIZE_<ROUNDING>_<INPUT>(name) is one instantiation for octet::recipes::name,
// for OCTET_TORCH_RECIPES to expand: an explicit instantiation declaration where the includer
// defines OCTET_TORCH_EXTERN as `extern`, its definition where it defines it empty.
#define OCTET_TORCH_QUANTIZE_INSTANCE(extern_, Round, In, name)                           \
    extern_ template octet::quantize_result                                               \
    octet::quantize<octet_torch::with_rounding_t<octet::recipes::name, Round>, const In>( \
        const octet::host_executor&, octet::matrix_ref<const In>,                         \
        octet::quantized_ref<octet_torch::with_rounding_t<octet::recipes::name, Round>>,  \
        octet::quantized_ref<octet_torch::with_rounding_t<octet::recipes::name, Round>>,  \
        const octet::quantize_options&);

#define OCTET_TORCH_QUANTIZE_NEAREST_F32(name) \
    OCTET_TORCH_QUANTIZE_INSTANCE(OCTET_TORCH_EXTERN, octet::round::nearest_even, float, name)
#define OCTET_TORCH_QUANTIZE_NEAREST_BF16(name) \
    OCTET_TORCH_QUANTIZE_INSTANCE(OCTET_TORCH_EXTERN, octet::round::nearest_even, octet::bf16, name)
#define OCTET_TORCH_QUANTIZE_NEAREST_F16(name) \
    OCTET_TORCH_QUANTIZE_INSTANCE(OCTET_TORCH_EXTERN, octet::round::nearest_even, octet::fp16, name)
// Stochastic rounding is what gradients get; they come as float32 or bf16 (the op refuses fp16).
#define OCTET_TORCH_QUANTIZE_STOCHASTIC_F32(name) \
    OCTET_TORCH_QUANTIZE_INSTANCE(OCTET_TORCH_EXTERN, octet::round::stochastic, float, name)
#define OCTET_TORCH_QUANTIZE_STOCHASTIC_BF16(name) \
    OCTET_TORCH_QUANTIZE_INSTANCE(OCTET_TORCH_EXTERN, octet::round::stochastic, octet::bf16, name)
