// format_list.hpp: the element formats, roundings and overflow policies Python passes by name, as
// lists that the name dispatch (octet_torch.hpp) and the cast op's CUDA half (quant_device_cast_*.cu)
// both expand. Free of torch's headers.
#pragma once

#include <type_traits>

#include "octet/format/float_format.hpp"
#include "octet/format/rounding.hpp"

/// X(name) for every format octet::name that Python can pass, in recipe_info's id order.
#define OCTET_TORCH_FORMATS(X) \
    X(e4m3)                    \
    X(e5m2)                    \
    X(e4m3fnuz)                \
    X(e5m2fnuz)                \
    X(e2m3)                    \
    X(e3m2)                    \
    X(e2m1)                    \
    X(ue8m0)

/// X(name) for every rounding octet::round::name that Python can pass.
#define OCTET_TORCH_ROUNDINGS(X) \
    X(nearest_even)              \
    X(stochastic)                \
    X(toward_zero)               \
    X(up)                        \
    X(down)

/// X(name) for every overflow policy octet::overflow::name that Python can pass.
#define OCTET_TORCH_OVERFLOWS(X) \
    X(saturate)                  \
    X(to_nonfinite)

namespace octet_torch {

/// Whether cast serves the combination: a format without Inf and NaN cannot overflow to them, and
/// ue8m0 (a power-of-two scale format) has no stochastic rounding.
template <class Fmt, class Round, class Overflow>
inline constexpr bool cast_serves =
    !(!Fmt::has_nan && !Fmt::has_inf && std::is_same_v<Overflow, octet::overflow::to_nonfinite>)&&!(
        Fmt::special_codes == octet::specials::exponent_only && std::is_same_v<Round, octet::round::stochastic>);

}  // namespace octet_torch
