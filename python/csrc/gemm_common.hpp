// gemm_common.hpp: what the scaled GEMM op's translation units share (gemm_op.cpp registers the op
// and checks its arguments; the shards gemm_<shard>.cpp, generated from registry.hpp's
// OCTET_TORCH_GEMM_SHARDS, instantiate the served recipe pairs so that they compile in parallel).
//
// The GEMM reads only an operand's format, granularity and scale storage (dequant = decode(code) *
// stored scale value), so a recipe that differs from a served one only in its scale rule
// (mxfp8_e4m3_ceil) is served through it: its copies multiply exactly as the served recipe's do.
// A block scale that is NaN (a block that held a NaN or an Inf) makes every output it reaches NaN.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <optional>

#include <string>
#include <string_view>

#include "octet/gemm/scaled_gemm.hpp"
#include "octet_torch.hpp"
#ifdef OCTET_TORCH_CUDA
#include "device_ops.hpp"
#include "octet_torch_cuda.hpp"
#endif

namespace octet_torch {

/// The arguments of octet::scaled_mm after the checks that need no recipe (gemm_op.cpp).
struct mm_args {
    const at::Tensor& a_codes;
    const at::Tensor& a_scales;
    const at::Tensor& a_tensor_scale;
    const at::Tensor& b_codes;
    const at::Tensor& b_scales;
    const at::Tensor& b_tensor_scale;
    int64_t k;
    const at::Tensor* bias;  ///< float32 [N], or null
    const at::Tensor* c;     ///< M x N of out_dtype, or null
    double alpha, beta;
    at::ScalarType out_dtype;
    int64_t promotion_interval;
    c10::DeviceType device;  ///< where the kernel runs (a_codes' device; every tensor is checked to be there)
};

/// The served pairs ("A's recipe x B's recipe"), in registry.hpp's order, for messages; mxfp8_e4m3_ceil
/// counts as mxfp8_e4m3.
#define OCTET_TORCH_GEMM_PAIR_NAME(ra, rb) #ra " x " #rb,
#define OCTET_TORCH_GEMM_SHARD_PAIR_NAMES(shard, pairs) pairs(OCTET_TORCH_GEMM_PAIR_NAME)
inline constexpr std::string_view served_pairs[] = {OCTET_TORCH_GEMM_SHARDS(OCTET_TORCH_GEMM_SHARD_PAIR_NAMES)};
#undef OCTET_TORCH_GEMM_SHARD_PAIR_NAMES
#undef OCTET_TORCH_GEMM_PAIR_NAME

/// D = alpha * A B^T (+ beta C) + bias for one recipe pair, D of args.out_dtype.
template <class RA, class RB>
at::Tensor run_pair(const mm_args& m) {
    constexpr const char* op = "scaled_mm";
    const auto A = as_quantized<RA>(m.a_codes, m.a_scales, m.a_tensor_scale, m.k, op, "a", m.device);
    const auto B = as_quantized<RB>(m.b_codes, m.b_scales, m.b_tensor_scale, m.k, op, "b", m.device);
    octet::gemm_options opt;
    opt.alpha = static_cast<float>(m.alpha);
    opt.beta = static_cast<float>(m.beta);
    opt.promotion_interval = static_cast<int>(m.promotion_interval);
    if (m.bias)
        opt.bias = octet::span<const float>(m.bias->data_ptr<float>(), static_cast<std::size_t>(m.bias->numel()));
    at::Tensor d = at::empty({m.a_codes.size(0), m.b_codes.size(0)}, m.a_codes.options().dtype(m.out_dtype));
    auto run = [&](auto out) {
        using DT = typename decltype(out)::type;
        const auto D = as_matrix<DT>(d, op, "out");
        std::optional<octet::matrix_ref<const DT>> C;
        if (m.c) C = as_matrix<const DT>(*m.c, op, "c");
        if (m.device == c10::DeviceType::CUDA) {
#ifdef OCTET_TORCH_CUDA
            const c10::cuda::CUDAGuard guard(m.a_codes.device());
            guarded([&] { device::scaled_gemm<RA, RB, DT>(device_executor(d), A, B, C ? &*C : nullptr, D, opt); });
#endif
        } else {
            guarded([&] {
                if (C)
                    octet::scaled_gemm(host(), A, B, *C, D, opt);
                else
                    octet::scaled_gemm(host(), A, B, D, opt);
            });
        }
    };
    if (m.out_dtype == at::kBFloat16)
        run(type_tag<octet::bf16>{});
    else if (m.out_dtype == at::kHalf)
        run(type_tag<octet::fp16>{});
    else
        run(type_tag<float>{});
    return d;
}

/// serve_<shard>_pairs(a_recipe, b_recipe, m): D for the pairs of one shard of OCTET_TORCH_GEMM_SHARDS,
/// or an undefined tensor; declared for every shard here, defined in the shard gemm_<shard>.cpp.
#define OCTET_TORCH_GEMM_SERVE(shard, pairs) \
    at::Tensor serve_##shard##_pairs(std::string_view a_recipe, std::string_view b_recipe, const mm_args& m);
OCTET_TORCH_GEMM_SHARDS(OCTET_TORCH_GEMM_SERVE)
#undef OCTET_TORCH_GEMM_SERVE

}  // namespace octet_torch

/// The shard X(shard, pairs) of OCTET_TORCH_GEMM_SHARDS: the pair list `pairs` (the generated
/// gemm_<shard>.cpp).
#define OCTET_TORCH_GEMM_SERVE_PAIR(ra, rb) \
    if (a_recipe == #ra && b_recipe == #rb) return run_pair<octet::recipes::ra, octet::recipes::rb>(m);
#define OCTET_TORCH_GEMM_SHARD(shard, pairs)                                                            \
    at::Tensor octet_torch::serve_##shard##_pairs(std::string_view a_recipe, std::string_view b_recipe, \
                                                  const mm_args& m) {                                   \
        pairs(OCTET_TORCH_GEMM_SERVE_PAIR) return {};                                                   \
    }
