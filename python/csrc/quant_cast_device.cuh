// quant_cast_device.cuh: the definitions behind quant_cast_device.hpp, for the
// quant_device_cast_*.cu files to instantiate (nvcc only; no torch).
#pragma once

#include "format_list.hpp"
#include "octet/core/check.hpp"
#include "octet/format/convert.cuh"
#include "quant_cast_device.hpp"

namespace octet_torch::device {
namespace cast_detail {

template <class T>
struct tag {
    using type = T;
};

/// f(tag<octet::name>{}) for a format name of OCTET_TORCH_FORMATS (the op has checked it).
template <class F>
void with_format(std::string_view name, F&& f) {
#define OCTET_TORCH_FORMAT(n) \
    if (name == #n) return f(tag<octet::n>{});
    OCTET_TORCH_FORMATS(OCTET_TORCH_FORMAT)
#undef OCTET_TORCH_FORMAT
    OCTET_REQUIRE(false, "octet_torch::device::cast", "format", "is not one of OCTET_TORCH_FORMATS (internal)");
}

template <class F>
void with_rounding(std::string_view name, F&& f) {
#define OCTET_TORCH_ROUNDING(n) \
    if (name == #n) return f(tag<octet::round::n>{});
    OCTET_TORCH_ROUNDINGS(OCTET_TORCH_ROUNDING)
#undef OCTET_TORCH_ROUNDING
    OCTET_REQUIRE(false, "octet_torch::device::cast", "rounding", "is not one of OCTET_TORCH_ROUNDINGS (internal)");
}

template <class F>
void with_overflow(std::string_view name, F&& f) {
#define OCTET_TORCH_OVERFLOW(n) \
    if (name == #n) return f(tag<octet::overflow::n>{});
    OCTET_TORCH_OVERFLOWS(OCTET_TORCH_OVERFLOW)
#undef OCTET_TORCH_OVERFLOW
    OCTET_REQUIRE(false, "octet_torch::device::cast", "overflow", "is not one of OCTET_TORCH_OVERFLOWS (internal)");
}

}  // namespace cast_detail

template <class In>
void cast(const octet::stream_executor& ex, std::string_view format, std::string_view rounding,
          std::string_view overflow, octet::span<const In> in, octet::span<std::uint8_t> out,
          octet::philox_stream rng) {
    cast_detail::with_format(format, [&](auto f) {
        cast_detail::with_rounding(rounding, [&](auto r) {
            cast_detail::with_overflow(overflow, [&](auto o) {
                using Fmt = typename decltype(f)::type;
                using Round = typename decltype(r)::type;
                using Overflow = typename decltype(o)::type;
                if constexpr (cast_serves<Fmt, Round, Overflow>)
                    octet::encode_array<Fmt, Round, Overflow>(ex, in, out, rng);
                else
                    OCTET_REQUIRE(false, "octet_torch::device::cast", "rounding/overflow",
                                  "is a combination cast refuses (internal: the op checks it first)");
            });
        });
    });
}

}  // namespace octet_torch::device
