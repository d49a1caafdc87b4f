// octet/format/convert.hpp: whole-array conversions on the host (multi-threaded).
//
//   octet::encode_array<Fmt, Round, Overflow>(octet::on_host(), in, out [, rng])
//   octet::decode_array<Fmt>(octet::on_host(), codes, out)
//
// `in` is float, octet::bf16 or octet::fp16; `out` holds one code per byte (sub-byte formats
// are packed by the quantizers, see quant/). Stochastic rounding draws element i's bits from
// rng.bits(i), so the result does not depend on the thread count or on host versus device.
// The stream overloads are in octet/format/convert.cuh.
#pragma once

#include <cstdint>
#include <type_traits>

#include "octet/core/bits.hpp"
#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/philox.hpp"
#include "octet/core/span.hpp"
#include "octet/format/encode.hpp"

namespace octet {

namespace detail {
template <class In>
inline constexpr bool is_encode_input_v =
    std::is_same_v<In, float> || std::is_same_v<In, bf16> || std::is_same_v<In, fp16>;

template <class Fmt, class Round, class Overflow, class In>
OCTET_HD std::uint8_t encode_element(In x, const philox_stream& rng, std::uint64_t index) {
    if constexpr (std::is_same_v<Round, round::stochastic>) return encode<Fmt, Round, Overflow>(x, rng.bits(index));
    else {
        (void)rng, (void)index;
        return encode<Fmt, Round, Overflow>(x);
    }
}
/// The argument checks of encode_array and decode_array (host and stream overloads).
inline void check_encode_views(std::size_t n_in, const void* in, std::size_t n_out, const void* out) {
    OCTET_REQUIRE(n_out == n_in, "octet::encode_array", "out",
                  message("has ", n_out, " elements but 'in' has ", n_in, "; pass one code per input"));
    OCTET_REQUIRE(n_in == 0 || in != nullptr, "octet::encode_array", "in", "is null with a non-zero size");
    OCTET_REQUIRE(n_in == 0 || out != nullptr, "octet::encode_array", "out", "is null with a non-zero size");
}
inline void check_decode_views(std::size_t n_codes, const void* codes, std::size_t n_out, const void* out) {
    OCTET_REQUIRE(n_out == n_codes, "octet::decode_array", "out",
                  message("has ", n_out, " elements but 'codes' has ", n_codes, "; pass one float per code"));
    OCTET_REQUIRE(n_codes == 0 || codes != nullptr, "octet::decode_array", "codes", "is null with a non-zero size");
    OCTET_REQUIRE(n_codes == 0 || out != nullptr, "octet::decode_array", "out", "is null with a non-zero size");
}

}  // namespace detail

template <class Fmt, class Round = round::nearest_even, class Overflow = overflow::saturate, class In>
void encode_array(host_executor ex, span<const In> in, span<std::uint8_t> out, philox_stream rng = {}) {
    static_assert(detail::is_encode_input_v<In>, "octet::encode_array: input must be float, octet::bf16 or octet::fp16");
    detail::check_encode_views(in.size(), in.data(), out.size(), out.data());
    parallel_for(ex, in.size(), std::size_t{1} << 16, [&](std::size_t b, std::size_t e) {
        const In* __restrict src = in.data();
        std::uint8_t* __restrict dst = out.data();
        for (std::size_t i = b; i < e; ++i) dst[i] = detail::encode_element<Fmt, Round, Overflow>(src[i], rng, i);
    });
}

template <class Fmt>
void decode_array(host_executor ex, span<const std::uint8_t> codes, span<float> out) {
    detail::check_decode_views(codes.size(), codes.data(), out.size(), out.data());
    parallel_for(ex, codes.size(), std::size_t{1} << 16, [&](std::size_t b, std::size_t e) {
        const std::uint8_t* __restrict src = codes.data();
        float* __restrict dst = out.data();
        for (std::size_t i = b; i < e; ++i) dst[i] = decode<Fmt>(src[i]);
    });
}

}  // namespace octet
