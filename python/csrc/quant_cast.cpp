// Element-wise conversions (octet/format/convert.hpp; on CUDA tensors convert.cuh through
// quant_cast_device.hpp) as torch ops:
//   octet::cast(x, format, rounding, overflow, seed, offset) -> codes, one per element
//   octet::decode(codes, format) -> float32
#include "octet/format/convert.hpp"
#include "octet_torch.hpp"
#ifdef OCTET_TORCH_CUDA
#include "octet_torch_cuda.hpp"
#include "quant_cast_device.hpp"
#endif

namespace octet_torch {
namespace {

using octet::span;

at::Tensor cast(const at::Tensor& x, c10::string_view format, c10::string_view rounding, c10::string_view overflow,
                int64_t seed, int64_t offset) {
    check_tensor(x, "cast", "x", float_inputs, kernel_device(x, "cast", "x"));
    check_vector(x, "cast", "x");
    return with_format(format, "cast", [&](auto fmt) {
        using Fmt = typename decltype(fmt)::type;
        TORCH_CHECK_VALUE(Fmt::special_codes != octet::specials::exponent_only || rounding != "stochastic",
                          where("cast", "rounding"),
                          "is stochastic; ue8m0 has no stochastic rounding, use a directed one");
        at::Tensor out = at::empty(x.sizes(), x.options().dtype(code_dtype<Fmt>()));
        const auto n = static_cast<std::size_t>(x.numel());
        auto* dst = static_cast<std::uint8_t*>(out.data_ptr());
        const octet::philox_stream rng{static_cast<std::uint64_t>(seed), static_cast<std::uint64_t>(offset)};
        with_rounding(rounding, "cast", [&](auto rd) {
            using Round = typename decltype(rd)::type;
            with_overflow(overflow, "cast", [&](auto ov) {
                using Overflow = typename decltype(ov)::type;
                if constexpr (!Fmt::has_nan && !Fmt::has_inf &&
                              std::is_same_v<Overflow, octet::overflow::to_nonfinite>) {
                    TORCH_CHECK_VALUE(false, where("cast", "overflow"), "is to_nonfinite, but ",
                                      octet::format_name<Fmt>(), " has neither Inf nor NaN; pass saturate");
                } else if constexpr (cast_serves<Fmt, Round, Overflow>) {  // ue8m0 + stochastic refused above
                    with_input(x, [&](auto in) {
                        using In = typename decltype(in)::type;
                        const span<const In> xs(static_cast<const In*>(x.data_ptr()), n);
                        const span<std::uint8_t> os(dst, n);
                        if (x.is_cuda()) {
#ifdef OCTET_TORCH_CUDA
                            const c10::cuda::CUDAGuard guard(x.device());
                            guarded(
                                [&] { device::cast<In>(device_executor(x), format, rounding, overflow, xs, os, rng); });
#endif
                        } else {
                            guarded([&] { octet::encode_array<Fmt, Round, Overflow>(host(), xs, os, rng); });
                        }
                    });
                }
            });
        });
        return out;
    });
}

at::Tensor decode(const at::Tensor& codes, c10::string_view format) {
    return with_format(format, "decode", [&](auto fmt) {
        using Fmt = typename decltype(fmt)::type;
        check_tensor(codes, "decode", "codes", {code_dtype<Fmt>(), at::kByte}, kernel_device(codes, "decode", "codes"));
        check_vector(codes, "decode", "codes");
        at::Tensor out = at::empty(codes.sizes(), codes.options().dtype(at::kFloat));
        const auto n = static_cast<std::size_t>(codes.numel());
        const span<const std::uint8_t> cs(static_cast<const std::uint8_t*>(codes.data_ptr()), n);
        const span<float> os(out.data_ptr<float>(), n);
        if (codes.is_cuda()) {
#ifdef OCTET_TORCH_CUDA
            const c10::cuda::CUDAGuard guard(codes.device());
            guarded([&] { device::decode(device_executor(codes), format, cs, os); });
#endif
        } else {
            guarded([&] { octet::decode_array<Fmt>(host(), cs, os); });
        }
        return out;
    });
}

}  // namespace
}  // namespace octet_torch

TORCH_LIBRARY_FRAGMENT(octet, m) {
    m.def(
        "cast(Tensor x, str format, str rounding=\"nearest_even\", str overflow=\"saturate\", int seed=0, int "
        "offset=0) -> Tensor");
    m.def("decode(Tensor codes, str format) -> Tensor");
}

TORCH_LIBRARY_IMPL(octet, CPU, m) {
    m.impl("cast", &octet_torch::cast);
    m.impl("decode", &octet_torch::decode);
}

// Without CUDA kernels the same functions answer a CUDA tensor with an error that says so.
TORCH_LIBRARY_IMPL(octet, CUDA, m) {
    m.impl("cast", &octet_torch::cast);
    m.impl("decode", &octet_torch::decode);
}
