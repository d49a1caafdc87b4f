// registry.hpp: the one list of what the torch ops serve by name (recipes, linear recipes, scaled
// GEMM pairs, AdamW codecs and master policies) and of how their instantiations are split over
// translation units, as X-macro lists. Adding a recipe or a pair is one line here:
//   * the ops' name dispatch and their messages expand these lists;
//   * python/CMakeLists.txt reads the lists marked "shards" below and generates one translation
//     unit per entry, <file prefix>_<first argument>.cpp (or .cu for the CUDA half), which
//     expands the shard macro named there with the entry's arguments; the op's own .cpp declares
//     the same instantiations extern through the same list;
//   * Python asks the ops for the names (octet.torch's RECIPES, LINEAR_RECIPES, SCALED_MM_PAIRS,
//     AdamW's CODECS and MASTERS) instead of restating them.
// CMake reads a list as `#define <LIST>(X)` followed by one X(...) per line; an entry's arguments
// are identifiers or types without commas or parentheses. Free of torch's headers, so that a
// translation unit that only instantiates octet's kernels does not parse them.
#pragma once

#include "octet/quant/recipe.hpp"

/// X(name) for every recipe octet::recipes::name that Python can pass.
#define OCTET_TORCH_RECIPES(X) OCTET_TORCH_RECIPES_WITH(OCTET_TORCH_CALL_WITH_NAME, X)
/// The same list as X(name, data): for a callback that needs more than the name (a shard's
/// rounding and input, passed as one parenthesized data argument).
#define OCTET_TORCH_RECIPES_WITH(X, data) \
    X(tensorwise_e4m3, data)              \
    X(tensorwise_e5m2, data)              \
    X(rowwise_e4m3, data)                 \
    X(columnwise_e4m3, data)              \
    X(blockwise_1x128, data)              \
    X(blockwise_128x128, data)            \
    X(mxfp8_e4m3, data)                   \
    X(mxfp8_e5m2, data)                   \
    X(mxfp8_e4m3_ceil, data)              \
    X(mxfp6_e2m3, data)                   \
    X(mxfp6_e3m2, data)                   \
    X(mxfp4, data)                        \
    X(nvfp4, data)

/// Shards of the quantize op (quant_quantize_instances.hpp): X(shard, rounding, input) instantiates
/// every named recipe with octet::round::rounding on input elements, in quant_quantize_<shard>.cpp
/// (OCTET_TORCH_QUANTIZE_SHARD) and quant_device_<shard>.cu (OCTET_TORCH_DEVICE_QUANTIZE_SHARD).
/// Stochastic rounding is what gradients get; they come as float32 or bf16 (the op refuses fp16).
#define OCTET_TORCH_QUANTIZE_SHARDS(X)         \
    X(nearest_f32, nearest_even, float)        \
    X(nearest_bf16, nearest_even, octet::bf16) \
    X(nearest_f16, nearest_even, octet::fp16)  \
    X(stochastic_f32, stochastic, float)       \
    X(stochastic_bf16, stochastic, octet::bf16)

/// Shards of the linear ops (linear_common.hpp): X(name, on_cuda) for every linear recipe
/// octet::linear_recipes::name that Python can pass, in linear_<name>.cpp (OCTET_TORCH_LINEAR_SHARD)
/// and, where on_cuda is true, linear_device_<name>.cu (OCTET_TORCH_DEVICE_LINEAR_SHARD). on_cuda:
/// whether its ops have CUDA kernels (NVFP4's FP4 GEMMs need cuBLASLt, which the ops do not lend:
/// its layer runs on the CPU).
#define OCTET_TORCH_LINEAR_RECIPES(X) \
    X(tensorwise, true)               \
    X(tensorwise_delayed, true)       \
    X(blockwise, true)                \
    X(mxfp8, true)                    \
    X(nvfp4, false)

/// X(ra, rb) for the scaled GEMM's per-tensor, per-row and DeepSeek-V3 block pairs (A's recipe, B's).
#define OCTET_TORCH_GEMM_PAIRS_FP8(X)     \
    X(tensorwise_e4m3, tensorwise_e4m3)   \
    X(tensorwise_e4m3, tensorwise_e5m2)   \
    X(tensorwise_e5m2, tensorwise_e4m3)   \
    X(tensorwise_e5m2, tensorwise_e5m2)   \
    X(rowwise_e4m3, rowwise_e4m3)         \
    X(blockwise_1x128, blockwise_128x128) \
    X(blockwise_1x128, blockwise_1x128)

/// X(ra, rb) for the scaled GEMM's MX and NVFP4 pairs (A's recipe, B's).
#define OCTET_TORCH_GEMM_PAIRS_NARROW(X) \
    X(mxfp8_e4m3, mxfp8_e4m3)            \
    X(mxfp8_e4m3, mxfp8_e5m2)            \
    X(mxfp8_e5m2, mxfp8_e4m3)            \
    X(mxfp8_e5m2, mxfp8_e5m2)            \
    X(mxfp6_e2m3, mxfp6_e2m3)            \
    X(mxfp6_e3m2, mxfp6_e3m2)            \
    X(mxfp4, mxfp4)                      \
    X(nvfp4, nvfp4)

/// Shards of the scaled GEMM (gemm_common.hpp): X(shard, pairs) instantiates the pair list `pairs`
/// in gemm_<shard>.cpp (OCTET_TORCH_GEMM_SHARD) and gemm_device_<shard>.cu
/// (OCTET_TORCH_DEVICE_GEMM_SHARD); every pair of the op is in one of them.
#define OCTET_TORCH_GEMM_SHARDS(X)     \
    X(fp8, OCTET_TORCH_GEMM_PAIRS_FP8) \
    X(narrow, OCTET_TORCH_GEMM_PAIRS_NARROW)

/// X(codec) for every AdamW state codec octet::state_codec::codec that Python can pass
/// (OCTET_TORCH_ADAMW_CODECS_WITH: X(codec, data), as OCTET_TORCH_RECIPES_WITH).
#define OCTET_TORCH_ADAMW_CODECS(X) OCTET_TORCH_ADAMW_CODECS_WITH(OCTET_TORCH_CALL_WITH_NAME, X)
#define OCTET_TORCH_ADAMW_CODECS_WITH(X, data) \
    X(fp32, data)                              \
    X(bf16, data)                              \
    X(bf16_stochastic, data)                   \
    X(e4m3_scaled, data)                       \
    X(e4m3_expanded, data)                     \
    X(dynamic8, data)

/// Shards of the AdamW step (optim_adamw.hpp): X(policy) for every master-weight policy
/// octet::master::policy that Python can pass, each instantiated for every codec in
/// optim_step_<policy>.cpp (OCTET_TORCH_ADAMW_SHARD) and optim_device_<policy>.cu
/// (OCTET_TORCH_DEVICE_ADAMW_SHARD).
#define OCTET_TORCH_ADAMW_MASTERS(X) \
    X(fp32)                          \
    X(bf16_nearest)                  \
    X(bf16_stochastic)               \
    X(bf16_kahan)

/// Shards of the attention ops (attention_ops.hpp): X(shard, input) for every operand type, each
/// in attention_forward_<shard>.cpp and attention_backward_<shard>.cpp
/// (OCTET_TORCH_ATTENTION_FORWARD_SHARD, _BACKWARD_SHARD) and attention_device_forward_<shard>.cu
/// and attention_device_backward_<shard>.cu (OCTET_TORCH_DEVICE_ATTENTION_FORWARD_SHARD, _BACKWARD_SHARD).
#define OCTET_TORCH_ATTENTION_INPUTS(X) \
    X(f32, float)                       \
    X(bf16, octet::bf16)

// The helpers of the _WITH lists: OCTET_TORCH_CALL_WITH_NAME(name, X) is X(name);
// OCTET_TORCH_APPLY(macro, (a, b), c) is macro(a, b, c), a parenthesized data argument unpacked.
#define OCTET_TORCH_CALL_WITH_NAME(name, X) X(name)
#define OCTET_TORCH_UNPARENTHESIZE(...) __VA_ARGS__
#define OCTET_TORCH_APPLY(macro, data, ...) \
    OCTET_TORCH_APPLY_ARGS(macro, (OCTET_TORCH_UNPARENTHESIZE data, __VA_ARGS__))
#define OCTET_TORCH_APPLY_ARGS(macro, args) macro args

namespace octet_torch {

/// The recipe with its rounding replaced (stochastic rounding is a per-call choice in Python).
template <class R, class Round>
using with_rounding_t =
    octet::recipe<typename R::format, typename R::granularity, typename R::scale_rule, typename R::scale_storage_type,
                  Round, typename R::overflow_policy, typename R::nan_handling>;

}  // namespace octet_torch
