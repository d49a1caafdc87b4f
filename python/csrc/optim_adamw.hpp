// optim_adamw.hpp: what the optim family's translation units share (the fused AdamW step of
// octet/optim/adamw.hpp as a torch op). optim_adamw.cpp holds the schemas, the argument checks and
// the dispatch on the master-weight policy; the shards optim_step_<master>.cpp, generated from
// registry.hpp's OCTET_TORCH_ADAMW_MASTERS, instantiate the step for one policy each (6 codecs x 2
// gradient types), so that they compile side by side.
//
// Instantiated: m_codec == v_codec (the same codec for both moments, as COAT, bitsandbytes and
// torchao do), every codec x every master policy x float32/bfloat16 gradients (48 steps). A pair
// of different codecs is refused with a ValueError that says so.
#pragma once

#include <string>
#include <string_view>

#include "octet/optim/adamw.hpp"
#include "octet_torch.hpp"
#ifdef OCTET_TORCH_CUDA
#include "octet_torch_cuda.hpp"
#include "optim_device.hpp"
#endif

namespace octet_torch {
namespace optim {

/// The codec and master-policy names Python passes, in registry.hpp's order.
#define OCTET_TORCH_ADAMW_NAME(n) #n,
inline constexpr std::string_view codec_names[] = {OCTET_TORCH_ADAMW_CODECS(OCTET_TORCH_ADAMW_NAME)};
inline constexpr std::string_view master_names[] = {OCTET_TORCH_ADAMW_MASTERS(OCTET_TORCH_ADAMW_NAME)};
#undef OCTET_TORCH_ADAMW_NAME

/// Calls f(type_tag<Codec>{}) for a state codec name; arg names the argument in the error.
template <class F>
decltype(auto) with_codec(std::string_view name, const char* op, const char* arg, F&& f) {
#define OCTET_TORCH_ADAMW_CODEC(n) \
    if (name == #n) return f(type_tag<octet::state_codec::n>{});
    OCTET_TORCH_ADAMW_CODECS(OCTET_TORCH_ADAMW_CODEC)
#undef OCTET_TORCH_ADAMW_CODEC
    TORCH_CHECK_VALUE(false, where(op, arg), "is '", std::string(name), "'; pass one of ", joined(codec_names));
}

/// Calls f(type_tag<Master>{}) for a master-weight policy name.
template <class F>
decltype(auto) with_master(std::string_view name, const char* op, F&& f) {
#define OCTET_TORCH_ADAMW_MASTER(n) \
    if (name == #n) return f(type_tag<octet::master::n>{});
    OCTET_TORCH_ADAMW_MASTERS(OCTET_TORCH_ADAMW_MASTER)
#undef OCTET_TORCH_ADAMW_MASTER
    TORCH_CHECK_VALUE(false, where(op, "master"), "is '", std::string(name), "'; pass one of ", joined(master_names));
}

/// The torch dtype of a code or weight type (octet::bf16 is torch's bfloat16 bit for bit).
template <class T>
at::ScalarType dtype_of() {
    if constexpr (std::is_same_v<T, float>)
        return at::kFloat;
    else if constexpr (std::is_same_v<T, octet::bf16>)
        return at::kBFloat16;
    else
        return at::kByte;
}

/// The step's tensors, checked by optim_adamw.cpp against the codec and policy before the call.
struct step_args {
    const at::Tensor& params;
    const at::Tensor& compensation;
    const at::Tensor& m_codes;
    const at::Tensor& m_meta;
    const at::Tensor& v_codes;
    const at::Tensor& v_meta;
    const at::Tensor& grads;
    octet::adamw_hyper hyper;
    std::uint64_t step;
    float lr;
    std::uint64_t element_offset;
    /// On CUDA: the report's device memory (the step fills it on the stream; the host report
    /// run_step returns is then empty).
    octet::adamw_report* device_report = nullptr;
};

template <class T>
octet::span<T> span_of(const at::Tensor& t, std::size_t n) {
    return octet::span<T>(n == 0 ? nullptr : static_cast<T*>(t.data_ptr()), n);
}

/// One step with Codec for both moments and Master (the tensors' dtypes and sizes are checked).
template <class Codec, class Master>
octet::adamw_report run_step(const step_args& a) {
    using ref_type = octet::adamw_state_ref<Codec, Codec, Master>;
    const auto n = static_cast<std::size_t>(a.params.numel());
    ref_type ref;
    ref.params = span_of<typename Master::weight_type>(a.params, n);
    if constexpr (Master::has_compensation) ref.compensation = span_of<typename Master::comp_type>(a.compensation, n);
    ref.m_codes = span_of<typename Codec::code_type>(a.m_codes, n);
    ref.v_codes = span_of<typename Codec::code_type>(a.v_codes, n);
    ref.m_meta = span_of<typename Codec::meta_type>(a.m_meta, octet::state_meta_count<Codec>(n));
    ref.v_meta = span_of<typename Codec::meta_type>(a.v_meta, octet::state_meta_count<Codec>(n));
    ref.element_offset = a.element_offset;
    if (a.device_report) {
#ifdef OCTET_TORCH_CUDA
        const c10::cuda::CUDAGuard guard(a.params.device());
        const octet::stream_executor ex = device_executor(a.params);
        guarded([&] {
            if (a.grads.scalar_type() == at::kBFloat16)
                device::adamw_step(ex, ref, span_of<const octet::bf16>(a.grads, n), a.hyper, a.step, a.lr,
                                   a.device_report);
            else
                device::adamw_step(ex, ref, span_of<const float>(a.grads, n), a.hyper, a.step, a.lr, a.device_report);
        });
#endif
        return {};
    }
    return guarded([&] {
        if (a.grads.scalar_type() == at::kBFloat16)
            return octet::adamw_step(host(), ref, span_of<const octet::bf16>(a.grads, n), a.hyper, a.step, a.lr);
        return octet::adamw_step(host(), ref, span_of<const float>(a.grads, n), a.hyper, a.step, a.lr);
    });
}

/// step_master_<policy>(codec, a): the step for one master policy, every codec; declared for every
/// policy here, defined in the shard optim_step_<policy>.cpp (OCTET_TORCH_ADAMW_SHARD).
#define OCTET_TORCH_ADAMW_STEP_MASTER(policy) \
    octet::adamw_report step_master_##policy(std::string_view codec, const step_args& a);
OCTET_TORCH_ADAMW_MASTERS(OCTET_TORCH_ADAMW_STEP_MASTER)
#undef OCTET_TORCH_ADAMW_STEP_MASTER

}  // namespace optim
}  // namespace octet_torch

/// The shard X(policy) of OCTET_TORCH_ADAMW_MASTERS (the generated optim_step_<policy>.cpp).
#define OCTET_TORCH_ADAMW_SHARD(policy)                                                                            \
    octet::adamw_report octet_torch::optim::step_master_##policy(std::string_view codec, const step_args& a) {     \
        return with_codec(codec, "adamw_step", "m_codec",                                                          \
                          [&](auto c) { return run_step<typename decltype(c)::type, octet::master::policy>(a); }); \
    }
