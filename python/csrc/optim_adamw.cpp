// The fused AdamW step on compressed moments (octet/optim/adamw.hpp) as torch ops:
//   octet::adamw_step(params!, compensation!, m_codes!, m_meta!, v_codes!, v_meta!, grads, m_codec,
//                     v_codec, master, lr, beta1, beta2, eps, weight_decay, step, seed, on_nonfinite,
//                     element_offset) -> report
//       updates the six state tensors in place; report is int64 [3]: non-finite gradient elements,
//       blocks zeroed (zero_block), skipped (1 when skip_step found one).
//   octet::adamw_state_sizes(m_codec, v_codec, master, n) -> [m code bytes, m meta bytes, v code bytes,
//       v meta bytes, compensation elements, param bytes]: what Python allocates (zeros are the valid
//       initial state). Code bytes 4, 2, 1 mean float32, bfloat16, uint8 codes, one per element; the
//       codec's meta structs (octet::state_codec::*::meta_type, floats) travel as raw uint8 bytes.
//   octet::adamw_count_nonfinite(grads) -> int64 scalar: gradient elements that are NaN, +-Inf or
//       >= 2^63 in magnitude (the step's definition), for a skip decision over many parameters.
//   octet::adamw_encode_moment(x, codec, moment, seed, step) -> [codes, meta]: float32 moments (moment
//       1 or 2) as the codec stores them (octet::encode_moments; a stochastic codec draws from
//       philox_stream{seed, step}), to import another optimizer's state. CPU.
//   octet::adamw_decode_moment(codes, meta, codec, moment) -> float32: the moments the step uses
//       (octet::decode_moments), to export the state. CPU.
//   octet::adamw_codec_names(), octet::adamw_master_names() -> str[]: the codecs and master policies
//       the step takes (registry.hpp's lists), for Python's CODECS and MASTERS.
#include "optim_adamw.hpp"
#include "octet/optim/moments.hpp"

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <vector>

namespace octet_torch {
namespace optim {
namespace {

constexpr const char* step_op = "adamw_step";

/// The sizes a codec's tensors have for n elements.
struct codec_layout {
    at::ScalarType code_dtype;
    int64_t code_bytes;
    int64_t meta_bytes;
    std::size_t meta_align;
};

codec_layout layout_of(std::string_view codec, const char* op, const char* arg, std::size_t n) {
    return with_codec(codec, op, arg, [&](auto c) {
        using C = typename decltype(c)::type;
        using Code = typename C::code_type;
        return codec_layout{dtype_of<Code>(), static_cast<int64_t>(sizeof(Code)),
                            static_cast<int64_t>(octet::state_meta_count<C>(n) * sizeof(typename C::meta_type)),
                            alignof(typename C::meta_type)};
    });
}

struct master_layout {
    at::ScalarType weight_dtype;
    bool has_compensation;
};

master_layout master_of(std::string_view master, const char* op) {
    return with_master(master, op, [&](auto m) {
        using M = typename decltype(m)::type;
        return master_layout{dtype_of<typename M::weight_type>(), M::has_compensation};
    });
}

void check_state_tensor(const at::Tensor& t, const char* arg, at::ScalarType dtype, int64_t numel,
                        c10::DeviceType device) {
    check_tensor(t, step_op, arg, {dtype}, device);
    check_vector(t, step_op, arg);
    TORCH_CHECK_VALUE(t.numel() == numel, where(step_op, arg), "has ", t.numel(), " elements; ", numel,
                      " expected (allocate it with the sizes octet::adamw_state_sizes gives)");
}

void check_meta(const at::Tensor& t, const char* arg, const codec_layout& l, c10::DeviceType device) {
    check_state_tensor(t, arg, at::kByte, l.meta_bytes, device);
    TORCH_CHECK_VALUE(l.meta_bytes == 0 || reinterpret_cast<std::uintptr_t>(t.data_ptr()) % l.meta_align == 0,
                      where(step_op, arg), "is not aligned to ", l.meta_align,
                      " bytes (the codec's meta are floats); pass a tensor of its own, not an offset view");
}

octet::grad_nonfinite_policy parse_policy(std::string_view name) {
    if (name == "skip_step") return octet::grad_nonfinite_policy::skip_step;
    if (name == "zero_block") return octet::grad_nonfinite_policy::zero_block;
    TORCH_CHECK_VALUE(false, where(step_op, "on_nonfinite"), "is '", std::string(name),
                      "'; pass skip_step or zero_block");
}

at::Tensor adamw_step(const at::Tensor& params, const at::Tensor& compensation, const at::Tensor& m_codes,
                      const at::Tensor& m_meta, const at::Tensor& v_codes, const at::Tensor& v_meta,
                      const at::Tensor& grads, c10::string_view m_codec, c10::string_view v_codec,
                      c10::string_view master, double lr, double beta1, double beta2, double eps, double weight_decay,
                      int64_t step, int64_t seed, c10::string_view on_nonfinite, int64_t element_offset) {
    const master_layout ml = master_of(master, step_op);
    const c10::DeviceType device = kernel_device(params, step_op, "params");
    check_tensor(params, step_op, "params", {ml.weight_dtype}, device);
    check_vector(params, step_op, "params");
    const auto n = static_cast<std::size_t>(params.numel());
    const codec_layout mc = layout_of(m_codec, step_op, "m_codec", n);
    const codec_layout vc = layout_of(v_codec, step_op, "v_codec", n);
    TORCH_CHECK_VALUE(m_codec == v_codec, where(step_op, "v_codec"), "is '", std::string(v_codec), "' and m_codec '",
                      std::string(m_codec), "'; this build instantiates the step with the same codec for both moments");
    check_tensor(grads, step_op, "grads", {at::kFloat, at::kBFloat16}, device);
    check_vector(grads, step_op, "grads");
    TORCH_CHECK_VALUE(grads.sizes() == params.sizes(), where(step_op, "grads"), "has shape ", grads.sizes(),
                      "; params has ", params.sizes(), " (one gradient per parameter)");
    if (ml.has_compensation) {
        check_state_tensor(compensation, "compensation", at::kBFloat16, params.numel(), device);
    } else {
        TORCH_CHECK_VALUE(compensation.defined() && compensation.numel() == 0, where(step_op, "compensation"), "has ",
                          compensation.defined() ? compensation.numel() : 0, " elements; master '", std::string(master),
                          "' keeps none (pass an empty tensor)");
        check_tensor(compensation, step_op, "compensation", {at::kBFloat16, at::kFloat, at::kByte}, device);
    }
    check_state_tensor(m_codes, "m_codes", mc.code_dtype, params.numel(), device);
    check_state_tensor(v_codes, "v_codes", vc.code_dtype, params.numel(), device);
    check_meta(m_meta, "m_meta", mc, device);
    check_meta(v_meta, "v_meta", vc, device);
    // the step reads and writes every one of these in one pass: no two may share memory
    const std::pair<const at::Tensor*, const char*> all[] = {{&params, "params"},   {&compensation, "compensation"},
                                                             {&m_codes, "m_codes"}, {&m_meta, "m_meta"},
                                                             {&v_codes, "v_codes"}, {&v_meta, "v_meta"},
                                                             {&grads, "grads"}};
    for (std::size_t i = 0; i < std::size(all); ++i)
        for (std::size_t j = i + 1; j < std::size(all); ++j)
            TORCH_CHECK_VALUE(at::get_overlap_status(*all[i].first, *all[j].first) == at::MemOverlapStatus::No,
                              where(step_op, all[j].second), "shares memory with '", all[i].second,
                              "'; every state tensor and the gradients need memory of their own");
    TORCH_CHECK_VALUE(step >= 1, where(step_op, "step"), "is ", step, "; steps count from 1");
    TORCH_CHECK_VALUE(seed >= 0, where(step_op, "seed"), "is ", seed, "; pass a seed >= 0");
    TORCH_CHECK_VALUE(element_offset >= 0, where(step_op, "element_offset"), "is ", element_offset,
                      "; pass a multiple of 256 >= 0");
    // torch passes double; the step's hyperparameters are float (octet::adamw_hyper)
    octet::adamw_hyper h;
    h.beta1 = static_cast<float>(beta1);
    h.beta2 = static_cast<float>(beta2);
    h.eps = static_cast<float>(eps);
    h.weight_decay = static_cast<float>(weight_decay);
    h.on_nonfinite = parse_policy(on_nonfinite);
    h.seed = static_cast<std::uint64_t>(seed);
    step_args a{params,
                compensation,
                m_codes,
                m_meta,
                v_codes,
                v_meta,
                grads,
                h,
                static_cast<std::uint64_t>(step),
                static_cast<float>(lr),
                static_cast<std::uint64_t>(element_offset)};
    // The report: three int64 counts, filled by the host step or, on CUDA, by the kernels on the
    // stream (octet::adamw_report is three uint64, so the tensor is its device memory).
    static_assert(sizeof(octet::adamw_report) == 3 * sizeof(int64_t), "adamw_report is three uint64 counts");
    at::Tensor report = at::empty({3}, params.options().dtype(at::kLong));
    a.device_report = device == c10::DeviceType::CUDA ? static_cast<octet::adamw_report*>(report.data_ptr()) : nullptr;
    octet::adamw_report r;
#define OCTET_TORCH_ADAMW_STEP(n) \
    if (master == #n) r = step_master_##n(m_codec, a);
    OCTET_TORCH_ADAMW_MASTERS(OCTET_TORCH_ADAMW_STEP)
#undef OCTET_TORCH_ADAMW_STEP
    if (device == c10::DeviceType::CPU) {
        auto* out = report.data_ptr<int64_t>();
        out[0] = static_cast<int64_t>(r.nonfinite_gradients);
        out[1] = static_cast<int64_t>(r.blocks_zeroed);
        out[2] = static_cast<int64_t>(r.skipped);
    }
    return report;
}

std::vector<int64_t> adamw_state_sizes(c10::string_view m_codec, c10::string_view v_codec, c10::string_view master,
                                       int64_t n) {
    constexpr const char* op = "adamw_state_sizes";
    TORCH_CHECK_VALUE(n >= 0, where(op, "n"), "is ", n, "; pass the parameter's element count");
    const auto count = static_cast<std::size_t>(n);
    const codec_layout mc = layout_of(m_codec, op, "m_codec", count);
    const codec_layout vc = layout_of(v_codec, op, "v_codec", count);
    const master_layout ml = master_of(master, op);
    return {mc.code_bytes,
            mc.meta_bytes,
            vc.code_bytes,
            vc.meta_bytes,
            ml.has_compensation ? n : 0,
            ml.weight_dtype == at::kFloat ? 4 : 2};
}

at::Tensor adamw_count_nonfinite(const at::Tensor& grads) {
    constexpr const char* op = "adamw_count_nonfinite";
    const c10::DeviceType device = kernel_device(grads, op, "grads");
    check_tensor(grads, op, "grads", {at::kFloat, at::kBFloat16}, device);
    check_vector(grads, op, "grads");
    const auto n = static_cast<std::size_t>(grads.numel());
    if (device == c10::DeviceType::CUDA) {
#ifdef OCTET_TORCH_CUDA
        const c10::cuda::CUDAGuard guard(grads.device());
        at::Tensor report = at::zeros({3}, grads.options().dtype(at::kLong));  // an octet::adamw_report
        auto* r = static_cast<octet::adamw_report*>(report.data_ptr());
        guarded([&] {
            if (grads.scalar_type() == at::kBFloat16)
                device::count_nonfinite(device_executor(grads), span_of<const octet::bf16>(grads, n), r);
            else
                device::count_nonfinite(device_executor(grads), span_of<const float>(grads, n), r);
        });
        return report[0];
#endif
    }
    const std::uint64_t count = guarded([&] {
        if (grads.scalar_type() == at::kBFloat16)
            return octet::count_nonfinite(host(), span_of<const octet::bf16>(grads, n));
        return octet::count_nonfinite(host(), span_of<const float>(grads, n));
    });
    at::Tensor out = at::empty({}, grads.options().dtype(at::kLong));
    *out.data_ptr<int64_t>() = static_cast<int64_t>(count);
    return out;
}

/// Calls f(std::integral_constant<octet::moment, K>) for moment 1 or 2.
template <class F>
decltype(auto) with_moment(int64_t moment, const char* op, F&& f) {
    TORCH_CHECK_VALUE(moment == 1 || moment == 2, where(op, "moment"), "is ", moment,
                      "; pass 1 (the first moment, m) or 2 (the second, v)");
    if (moment == 1) return f(std::integral_constant<octet::moment, octet::moment::first>{});
    return f(std::integral_constant<octet::moment, octet::moment::second>{});
}

std::vector<at::Tensor> adamw_encode_moment(const at::Tensor& x, c10::string_view codec, int64_t moment, int64_t seed,
                                            int64_t step) {
    constexpr const char* op = "adamw_encode_moment";
    check_tensor(x, op, "x", {at::kFloat}, c10::DeviceType::CPU);
    check_vector(x, op, "x");
    TORCH_CHECK_VALUE(seed >= 0 && step >= 0, where(op, "seed/step"), "are ", seed, ", ", step, "; pass values >= 0");
    const auto n = static_cast<std::size_t>(x.numel());
    const codec_layout l = layout_of(codec, op, "codec", n);
    at::Tensor codes = at::zeros({x.numel()}, x.options().dtype(l.code_dtype));
    at::Tensor meta = at::zeros({l.meta_bytes}, x.options().dtype(at::kByte));
    with_codec(codec, op, "codec", [&](auto c) {
        using C = typename decltype(c)::type;
        with_moment(moment, op, [&](auto k) {
            guarded([&] {
                octet::encode_moments<C, decltype(k)::value>(
                    host(), span_of<const float>(x, n), span_of<typename C::code_type>(codes, n),
                    span_of<typename C::meta_type>(meta, octet::state_meta_count<C>(n)),
                    octet::philox_stream{static_cast<std::uint64_t>(seed), static_cast<std::uint64_t>(step)});
            });
        });
    });
    return {codes, meta};
}

at::Tensor adamw_decode_moment(const at::Tensor& codes, const at::Tensor& meta, c10::string_view codec,
                               int64_t moment) {
    constexpr const char* op = "adamw_decode_moment";
    check_vector(codes, op, "codes");
    const auto n = static_cast<std::size_t>(codes.numel());
    const codec_layout l = layout_of(codec, op, "codec", n);
    check_tensor(codes, op, "codes", {l.code_dtype}, c10::DeviceType::CPU);
    check_tensor(meta, op, "meta", {at::kByte}, c10::DeviceType::CPU);
    check_vector(meta, op, "meta");
    TORCH_CHECK_VALUE(meta.numel() == l.meta_bytes, where(op, "meta"), "has ", meta.numel(), " bytes; ", n,
                      " moments of codec '", std::string(codec), "' have ", l.meta_bytes);
    at::Tensor x = at::empty({codes.numel()}, codes.options().dtype(at::kFloat));
    with_codec(codec, op, "codec", [&](auto c) {
        using C = typename decltype(c)::type;
        with_moment(moment, op, [&](auto k) {
            guarded([&] {
                octet::decode_moments<C, decltype(k)::value>(
                    host(), span_of<const typename C::code_type>(codes, n),
                    span_of<const typename C::meta_type>(meta, octet::state_meta_count<C>(n)), span_of<float>(x, n));
            });
        });
    });
    return x;
}

std::vector<std::string> adamw_codec_names() {
    return name_list(codec_names);
}
std::vector<std::string> adamw_master_names() {
    return name_list(master_names);
}

}  // namespace
}  // namespace optim
}  // namespace octet_torch

TORCH_LIBRARY_FRAGMENT(octet, m) {
    m.def("adamw_encode_moment(Tensor x, str codec, int moment, int seed=0, int step=0) -> Tensor[]");
    m.def("adamw_decode_moment(Tensor codes, Tensor meta, str codec, int moment) -> Tensor");
    m.def(
        "adamw_step(Tensor(a!) params, Tensor(b!) compensation, Tensor(c!) m_codes, Tensor(d!) m_meta, Tensor(e!) "
        "v_codes, Tensor(f!) v_meta, Tensor grads, str m_codec, str v_codec, str master, float lr, float beta1, "
        "float beta2, float eps, float weight_decay, int step, int seed, str on_nonfinite, int element_offset) -> "
        "Tensor report");
    m.def("adamw_state_sizes(str m_codec, str v_codec, str master, int n) -> int[]");
    m.def("adamw_count_nonfinite(Tensor grads) -> Tensor");
    m.def("adamw_codec_names() -> str[]");
    m.def("adamw_master_names() -> str[]");
}

TORCH_LIBRARY_IMPL(octet, CPU, m) {
    m.impl("adamw_step", &octet_torch::optim::adamw_step);
    m.impl("adamw_count_nonfinite", &octet_torch::optim::adamw_count_nonfinite);
    m.impl("adamw_encode_moment", &octet_torch::optim::adamw_encode_moment);
    m.impl("adamw_decode_moment", &octet_torch::optim::adamw_decode_moment);
}

// Without CUDA kernels the same functions answer a CUDA tensor with an error that says so.
TORCH_LIBRARY_IMPL(octet, CUDA, m) {
    m.impl("adamw_step", &octet_torch::optim::adamw_step);
    m.impl("adamw_count_nonfinite", &octet_torch::optim::adamw_count_nonfinite);
}

TORCH_LIBRARY_IMPL(octet, CompositeExplicitAutograd, m) {
    m.impl("adamw_state_sizes", &octet_torch::optim::adamw_state_sizes);
    m.impl("adamw_codec_names", &octet_torch::optim::adamw_codec_names);
    m.impl("adamw_master_names", &octet_torch::optim::adamw_master_names);
}
