// octet/format/packed.hpp: packed helpers and sub-byte storage.
//
//   encode_x2 / encode_x4   two or four 8-bit codes in a 16- or 32-bit word, element 0 in the
//                           lowest byte (the order of CUDA's __nv_fp8x2/x4 storage)
//   encode_fp4x2            two 4-bit codes in one byte, element 0 in the low nibble (the order
//                           of CUDA's __nv_fp4x2 storage and of the OCP MX spec)
//   pack_fp6x4 / unpack     four 6-bit codes in three bytes, a little-endian bit stream:
//                           element k occupies bits [6k, 6k+6) of the 24-bit word
//
// On sm_89+ the FP8 x2/x4 helpers with nearest_even + saturate compile to one cvt per pair.
#pragma once

#include <cstdint>

#include "octet/format/encode.hpp"

namespace octet {

template <class Fmt, class Round = round::nearest_even, class Overflow = overflow::saturate>
OCTET_HD std::uint16_t encode_x2(float e0, float e1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if constexpr (detail::uses_hardware_cvt<Fmt, Round, Overflow>)
        return detail::hardware_cvt_x2<Fmt>(e0, e1);
    else
#endif
        return static_cast<std::uint16_t>(encode<Fmt, Round, Overflow>(e0) | (encode<Fmt, Round, Overflow>(e1) << 8));
}

template <class Fmt, class Round = round::nearest_even, class Overflow = overflow::saturate>
OCTET_HD std::uint32_t encode_x4(float e0, float e1, float e2, float e3) {
    return static_cast<std::uint32_t>(encode_x2<Fmt, Round, Overflow>(e0, e1)) |
           (static_cast<std::uint32_t>(encode_x2<Fmt, Round, Overflow>(e2, e3)) << 16);
}

template <class Fmt>
OCTET_HD void decode_x4(std::uint32_t codes, float out[4]) {
    OCTET_UNROLL
    for (int k = 0; k < 4; ++k) out[k] = decode<Fmt>(static_cast<std::uint8_t>(codes >> (8 * k)));
}

/// Two codes of a format of at most 4 bits in one byte, e0 in the low nibble.
OCTET_HD std::uint8_t pack_fp4x2(std::uint8_t c0, std::uint8_t c1) {
    return static_cast<std::uint8_t>((c0 & 0x0Fu) | ((c1 & 0x0Fu) << 4));
}
OCTET_HD std::uint8_t unpack_fp4(std::uint8_t byte, int which) {
    return static_cast<std::uint8_t>((byte >> (4 * which)) & 0x0Fu);
}

template <class Fmt, class Round = round::nearest_even, class Overflow = overflow::saturate>
OCTET_HD std::uint8_t encode_fp4x2(float e0, float e1) {
    static_assert(Fmt::bits <= 4, "octet::encode_fp4x2: the format must be at most 4 bits wide (e2m1)");
    return pack_fp4x2(encode<Fmt, Round, Overflow>(e0), encode<Fmt, Round, Overflow>(e1));
}

/// Four codes of a format of at most 6 bits in three bytes (little-endian 24-bit word).
OCTET_HD void pack_fp6x4(const std::uint8_t c[4], std::uint8_t out[3]) {
    const std::uint32_t w = (c[0] & 0x3Fu) | ((c[1] & 0x3Fu) << 6) | ((c[2] & 0x3Fu) << 12) | ((c[3] & 0x3Fu) << 18);
    out[0] = static_cast<std::uint8_t>(w);
    out[1] = static_cast<std::uint8_t>(w >> 8);
    out[2] = static_cast<std::uint8_t>(w >> 16);
}
OCTET_HD void unpack_fp6x4(const std::uint8_t in[3], std::uint8_t c[4]) {
    const std::uint32_t w = in[0] | (static_cast<std::uint32_t>(in[1]) << 8) | (static_cast<std::uint32_t>(in[2]) << 16);
    OCTET_UNROLL
    for (int k = 0; k < 4; ++k) c[k] = static_cast<std::uint8_t>((w >> (6 * k)) & 0x3Fu);
}

/// Bytes needed to store n codes of Fmt packed (4-bit: two per byte; 6-bit: four per three bytes).
template <class Fmt>
constexpr std::size_t packed_bytes(std::size_t n) {
    if constexpr (Fmt::bits <= 4) return (n + 1) / 2;
    else if constexpr (Fmt::bits <= 6) return (n + 3) / 4 * 3;
    else return n;
}

}  // namespace octet
