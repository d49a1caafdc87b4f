// octet/format/rounding.hpp: rounding and overflow policies, chosen independently.
//
// Rounding (what happens between two representable neighbours):
//   round::nearest_even  nearest; ties to the neighbour with an even code
//   round::toward_zero   the neighbour of smaller magnitude
//   round::up            the neighbour toward +Inf
//   round::down          the neighbour toward -Inf
//   round::stochastic    the larger-magnitude neighbour with probability equal to the distance
//                        from the smaller one in units of their gap, decided by 32 caller-supplied
//                        random bits (see encode()); unbiased in expectation
//
// Overflow (what happens when the rounded magnitude exceeds the largest finite value):
//   overflow::saturate     clamp to +-max_finite; Inf inputs also clamp (as CUDA's satfinite)
//   overflow::to_nonfinite IEEE behaviour: +-Inf where the format has Inf, else NaN; rounding
//                          toward zero (and up/down on the side that moves toward zero) still
//                          gives +-max_finite for finite inputs, as IEEE 754 prescribes
#pragma once

#include <type_traits>

namespace octet {
namespace round {
struct nearest_even {};
struct toward_zero {};
struct up {};
struct down {};
struct stochastic {};
}  // namespace round

namespace overflow {
struct saturate {};
struct to_nonfinite {};
}  // namespace overflow

template <class R>
inline constexpr bool is_rounding_v =
    std::is_same_v<R, round::nearest_even> || std::is_same_v<R, round::toward_zero> || std::is_same_v<R, round::up> ||
    std::is_same_v<R, round::down> || std::is_same_v<R, round::stochastic>;

template <class O>
inline constexpr bool is_overflow_v =
    std::is_same_v<O, overflow::saturate> || std::is_same_v<O, overflow::to_nonfinite>;

template <class R>
constexpr const char* rounding_name() {
    if constexpr (std::is_same_v<R, round::nearest_even>)
        return "nearest_even";
    else if constexpr (std::is_same_v<R, round::toward_zero>)
        return "toward_zero";
    else if constexpr (std::is_same_v<R, round::up>)
        return "up";
    else if constexpr (std::is_same_v<R, round::down>)
        return "down";
    else
        return "stochastic";
}

}  // namespace octet
