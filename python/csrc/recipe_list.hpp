// recipe_list.hpp: the named recipes that Python passes by name (octet::recipes::<name>), as one
// list that the name dispatch (octet_torch.hpp) and the quantizer's explicit instantiations
// (quant_quantize_instances.hpp) both expand. Free of torch's headers, so that a translation unit
// that only instantiates octet's kernels does not parse them.
#pragma once

#include "octet/quant/recipe.hpp"

/// X(name) for every recipe octet::recipes::name that Python can pass.
#define OCTET_TORCH_RECIPES(X) \
    X(tensorwise_e4m3)         \
    X(tensorwise_e5m2)         \
    X(rowwise_e4m3)            \
    X(columnwise_e4m3)         \
    X(blockwise_1x128)         \
    X(blockwise_128x128)       \
    X(mxfp8_e4m3)              \
    X(mxfp8_e5m2)              \
    X(mxfp8_e4m3_ceil)         \
    X(mxfp6_e2m3)              \
    X(mxfp6_e3m2)              \
    X(mxfp4)                   \
    X(nvfp4)

namespace octet_torch {

/// The recipe with its rounding replaced (stochastic rounding is a per-call choice in Python).
template <class R, class Round>
using with_rounding_t =
    octet::recipe<typename R::format, typename R::granularity, typename R::scale_rule, typename R::scale_storage_type,
                  Round, typename R::overflow_policy, typename R::nan_handling>;

}  // namespace octet_torch
