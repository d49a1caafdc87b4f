// quant_quantize_instances.hpp: the quantizer instantiations behind the quantize op, spread over
// translation units that compile in parallel: quant_quantize.cpp declares every one extern (so it
// instantiates none) and each shard quant_quantize_<shard>.cpp, generated from registry.hpp's
// OCTET_TORCH_QUANTIZE_SHARDS, defines those of one rounding and input type for every named
// recipe, without parsing torch's headers.
#pragma once

#include "octet/quant/quantize.hpp"
#include "registry.hpp"

/// One instantiation, octet::recipes::name with octet::round::rounding on In: an explicit
/// instantiation declaration where extern_ is `extern`, its definition where it is empty.
#define OCTET_TORCH_QUANTIZE_INSTANCE(extern_, rounding, In, name)                                         \
    extern_ template octet::quantize_result                                                                \
    octet::quantize<octet_torch::with_rounding_t<octet::recipes::name, octet::round::rounding>, const In>( \
        const octet::host_executor&, octet::matrix_ref<const In>,                                          \
        octet::quantized_ref<octet_torch::with_rounding_t<octet::recipes::name, octet::round::rounding>>,  \
        octet::quantized_ref<octet_torch::with_rounding_t<octet::recipes::name, octet::round::rounding>>,  \
        const octet::quantize_options&);
#define OCTET_TORCH_QUANTIZE_INSTANCE_OF(name, data) OCTET_TORCH_APPLY(OCTET_TORCH_QUANTIZE_INSTANCE, data, name)

/// The shard X(shard, rounding, In) of OCTET_TORCH_QUANTIZE_SHARDS, every named recipe: defined
/// (the generated quant_quantize_<shard>.cpp) or declared extern (quant_quantize.cpp).
#define OCTET_TORCH_QUANTIZE_SHARD(shard, rounding, In) \
    OCTET_TORCH_RECIPES_WITH(OCTET_TORCH_QUANTIZE_INSTANCE_OF, (, rounding, In))
#define OCTET_TORCH_QUANTIZE_EXTERN_SHARD(shard, rounding, In) \
    OCTET_TORCH_RECIPES_WITH(OCTET_TORCH_QUANTIZE_INSTANCE_OF, (extern, rounding, In))
