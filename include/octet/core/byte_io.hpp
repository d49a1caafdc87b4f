// octet/core/byte_io.hpp: little-endian byte I/O and sub-byte code packing, written once.
//
// Wire messages, checkpoints, residual buffers and packed FP4/FP6 rows all store multi-byte values
// little-endian at byte addresses that need not be aligned; these helpers read and write them
// byte by byte, so the result is the same on any host byte order and on the device (compilers turn
// them into single loads and stores where the target allows).
//
//   load_le16/24/32/64, store_le16/24/32/64   unaligned little-endian integers
//   pack_fp4x2 / unpack_fp4                   two 4-bit codes in one byte, element 0 in the low
//                                             nibble (CUDA's __nv_fp4x2 order, the OCP MX spec's)
//   pack_fp6x4 / unpack_fp6                   four 6-bit codes in three bytes: element k occupies
//                                             bits [6k, 6k + 6) of the little-endian 24-bit word
#pragma once

#include <cstdint>

#include "octet/config.hpp"

namespace octet {

OCTET_HD std::uint32_t load_le16(const std::uint8_t* p) {
    return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8);
}
OCTET_HD std::uint32_t load_le24(const std::uint8_t* p) {
    return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
           (static_cast<std::uint32_t>(p[2]) << 16);
}
OCTET_HD std::uint32_t load_le32(const std::uint8_t* p) {
    return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
           (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}
OCTET_HD std::uint64_t load_le64(const std::uint8_t* p) {
    return static_cast<std::uint64_t>(load_le32(p)) | (static_cast<std::uint64_t>(load_le32(p + 4)) << 32);
}

/// Stores the low 16 / 24 bits of v.
OCTET_HD void store_le16(std::uint8_t* p, std::uint32_t v) {
    p[0] = static_cast<std::uint8_t>(v);
    p[1] = static_cast<std::uint8_t>(v >> 8);
}
OCTET_HD void store_le24(std::uint8_t* p, std::uint32_t v) {
    p[0] = static_cast<std::uint8_t>(v);
    p[1] = static_cast<std::uint8_t>(v >> 8);
    p[2] = static_cast<std::uint8_t>(v >> 16);
}
OCTET_HD void store_le32(std::uint8_t* p, std::uint32_t v) {
    OCTET_UNROLL
    for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
OCTET_HD void store_le64(std::uint8_t* p, std::uint64_t v) {
    OCTET_UNROLL
    for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

// ---- sub-byte codes ----------------------------------------------------------------------------

/// Two codes of a format of at most 4 bits in one byte, c0 in the low nibble.
OCTET_HD std::uint8_t pack_fp4x2(std::uint8_t c0, std::uint8_t c1) {
    return static_cast<std::uint8_t>((c0 & 0x0Fu) | ((c1 & 0x0Fu) << 4));
}
/// Code `which` (0: low nibble, 1: high nibble) of a byte.
OCTET_HD std::uint8_t unpack_fp4(std::uint8_t byte, int which) {
    return static_cast<std::uint8_t>((byte >> (4 * which)) & 0x0Fu);
}

/// Four codes of a format of at most 6 bits in three bytes (little-endian 24-bit word).
OCTET_HD void pack_fp6x4(const std::uint8_t c[4], std::uint8_t out[3]) {
    store_le24(out, (c[0] & 0x3Fu) | ((c[1] & 0x3Fu) << 6) | ((c[2] & 0x3Fu) << 12) | ((c[3] & 0x3Fu) << 18));
}
/// Code `which` (0..3) of a three-byte group of 6-bit codes.
OCTET_HD std::uint8_t unpack_fp6(const std::uint8_t group[3], int which) {
    return static_cast<std::uint8_t>((load_le24(group) >> (6 * which)) & 0x3Fu);
}

}  // namespace octet
