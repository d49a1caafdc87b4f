// octet/format/packed.hpp: packed helpers and sub-byte storage.
//
//   encode_x2 / encode_x4   two or four 8-bit codes in a 16- or 32-bit word, element 0 in the
//                           lowest byte (the order of CUDA's __nv_fp8x2/x4 storage)
//   encode_fp4x2            two 4-bit codes in one byte, element 0 in the low nibble (the order
//                           of CUDA's __nv_fp4x2 storage and of the OCP MX spec)
// The packing rules themselves (pack_fp4x2 / unpack_fp4, pack_fp6x4 / unpack_fp6: four 6-bit codes
// in a little-endian 24-bit word) live in octet/core/byte_io.hpp.
//
// On sm_89+ the FP8 x2/x4 helpers with nearest_even + saturate compile to one cvt per pair.
#pragma once

#include <cstdint>

#include "octet/core/byte_io.hpp"
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

template <class Fmt, class Round = round::nearest_even, class Overflow = overflow::saturate>
OCTET_HD std::uint8_t encode_fp4x2(float e0, float e1) {
    static_assert(Fmt::bits <= 4, "octet::encode_fp4x2: the format must be at most 4 bits wide (e2m1)");
    return pack_fp4x2(encode<Fmt, Round, Overflow>(e0), encode<Fmt, Round, Overflow>(e1));
}

}  // namespace octet
