// octet/codec/wire.hpp: codec configuration and the wire format of an encoded gradient message.
//
//   octet::codec_config cfg{octet::wire_format::e4m3, octet::transform_kind::hadamard, /*block=*/1024};
//   std::size_t bytes = octet::encoded_size(cfg, n);
//   octet::wire_header h = octet::read_wire_header(message);   // validates everything, or throws
//
// Formats (each element format with its own per-block scale, using the quantizer recipes' rules
// in quant/scale.hpp, so codec codes equal octet::quantize's codes for the same values):
//   e4m3    OCP E4M3, one float scale per scale_block (default 128) = amax / 448     1 + 4/Bs bytes
//   e5m2    OCP E5M2, one float scale per scale_block (default 128) = amax / 57344   1 + 4/Bs bytes
//   mxfp8   E4M3 in blocks of 32 with a UE8M0 power-of-two scale (recipes::mxfp8_e4m3_ceil: the
//           smallest power of two that does not saturate, rather than the OCP floor rule whose
//           top binade clamps)                                                       1 + 1/32 bytes
//   nvfp4   E2M1 in blocks of 16 with an E4M3 scale on top of one float tensor scale
//           (recipes::nvfp4), codes packed two per byte, element 0 in the low nibble 0.5 + 1/16 bytes
//
// Message layout (little-endian; every section starts on a 16-byte boundary):
//   offset  size  field
//        0     4  magic 'O' 'C' 'G' 'W'
//        4     2  version (1)
//        6     2  header bytes (64)
//        8     1  format (1 e4m3, 2 e5m2, 3 mxfp8, 4 nvfp4)
//        9     1  transform (0 identity, 1 hadamard)
//       10     1  log2 of the effective Hadamard block (4..15), 0 for identity
//       11     1  log2 of the scale block (4..15; 5 for mxfp8, 4 for nvfp4)
//       12     4  flags (bit 0: coordinates rounded stochastically; other bits 0)
//       16     8  seed
//       24     8  first index (global index of element 0: the sign pattern's position; + L <= 2^62)
//       32     8  element count n (at most 2^40)
//       40     4  tensor scale (float; NVFP4's second-level scale, exactly 1.0 otherwise)
//       44     4  reserved (0)
//       48     8  total bytes of the message
//       56     8  checksum
//       64        scales: ceil(L / Bs) of them (float, or one byte: UE8M0 / E4M3 code), zero-padded to 16 bytes
//                 payload: L codes (one byte each, or two per byte for NVFP4), zero-padded to 16 bytes
//   with L = transform_length(transform, n, block) (see hadamard.hpp: n for identity, n rounded up to
//   the effective block for Hadamard).
//
// Checksum: the sum mod 2^64 over the message's 8-byte little-endian words w_k (the checksum field
// read as zero) of mix64(w_k ^ (k + 1) * 0x9E3779B97F4A7C15), mix64 being SplitMix64's finalizer (a
// bijection). Any change of a single word changes the sum; it is order-free, so a kernel can add
// the terms in any order. It detects accidents (truncation, bit flips, misrouted buffers), not
// forgery.
//
// Decoding (read_wire_header, decode_gradient) checks, in this order, and throws octet::error naming
// `message` on the first failure: at least 64 bytes; magic; version; header size; format;
// transform; block fields valid for the format and for n (the effective block of n); flags and
// reserved zero; n <= 2^40; first index + L <= 2^62; tensor scale (NVFP4: finite and > 0; else 1.0); total bytes equal
// to the layout's and to the buffer's size (so a truncated or overlong buffer is rejected before any section is read);
// the checksum; every scale valid (float: finite and > 0; UE8M0: not 0xFF; E4M3 scale: not NaN, not negative); padding
// bytes zero. Sizes are computed in 64-bit integers from bounded fields, so no check can overflow, and nothing outside
// the buffer is ever read.
//
// Non-finite payload codes are counted, not rejected: a message with valid checksums may carry
// NaN codes (E4M3 / MXFP8 0x7F, 0xFF; E5M2 0x7D..0x7F, 0xFD..0xFF) or E5M2 infinities (0x7C,
// 0xFC). The encoder writes a non-finite code for a NaN or Inf input (encode_wire_code, codec.hpp),
// so refusing them would turn one bad gradient element into an undecodable message. Instead
// validation counts them in wire_header::non_finite_codes (read_wire_header and both
// decode_gradient overloads, host and device), and decoding writes NaN / Inf there (under
// Hadamard, into the whole block). A caller that must not see non-finite gradients checks the
// count (or lets the optimizer's grad_nonfinite_policy act on the decoded values). NVFP4 (E2M1)
// has no non-finite codes. The collectives (comm/) validate without counting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "octet/codec/hadamard.hpp"
#include "octet/config.hpp"
#include "octet/core/bits.hpp"
#include "octet/core/byte_io.hpp"
#include "octet/core/check.hpp"
#include "octet/core/span.hpp"
#include "octet/format/encode.hpp"
#include "octet/quant/recipe.hpp"
#include "octet/quant/scale.hpp"

namespace octet {

enum class wire_format : std::uint8_t { e4m3 = 1, e5m2 = 2, mxfp8 = 3, nvfp4 = 4 };

inline const char* wire_format_name(wire_format f) {
    switch (f) {
        case wire_format::e4m3:
            return "e4m3";
        case wire_format::e5m2:
            return "e5m2";
        case wire_format::mxfp8:
            return "mxfp8";
        case wire_format::nvfp4:
            return "nvfp4";
    }
    return "unknown";
}

struct codec_config {
    wire_format format = wire_format::e4m3;
    transform_kind transform = transform_kind::hadamard;
    std::uint32_t block = 1024;     ///< Hadamard block: a power of two in [16, 32768] (ignored by identity)
    std::uint32_t scale_block = 0;  ///< elements per scale; 0: the format's (e4m3/e5m2 128, mxfp8 32, nvfp4 16)
    std::uint64_t seed = 0;         ///< sign seed, shared by every rank (may change per step)
    /// Round coordinates stochastically (unbiased: E[decode] = the coordinate) instead of to
    /// nearest-even. The random bits of coordinate j are philox_stream{seed, codec_rounding_stream
    /// + options.random_stream}.bits(first_index + j); scales are computed as for nearest.
    bool stochastic = false;
};

/// Philox stream offset of stochastic-rounding bits ("RNDBITS0"); encode_options::random_stream is added.
inline constexpr std::uint64_t codec_rounding_stream = 0x524E444249545330ull;

/// Compile-time facts of each wire format: the recipe whose rules make scales and codes. Its
/// non-finite policy is per_element: a non-finite gradient element is data on the wire (encoded
/// by its own code, every scale valid), not a poisoned block.
template <wire_format F>
struct wire_traits;
template <>
struct wire_traits<wire_format::e4m3> {
    template <class Round>
    using recipe_with = octet::recipe<e4m3, block<1, 128>, scale::amax_ratio<0>, scale_storage::f32, Round,
                                      overflow::saturate, nan_policy::per_element>;
    using recipe = recipe_with<round::nearest_even>;
    static constexpr std::uint32_t fixed_scale_block = 0, default_scale_block = 128, scale_bytes = 4;
};
template <>
struct wire_traits<wire_format::e5m2> {
    template <class Round>
    using recipe_with = octet::recipe<e5m2, block<1, 128>, scale::amax_ratio<0>, scale_storage::f32, Round,
                                      overflow::saturate, nan_policy::per_element>;
    using recipe = recipe_with<round::nearest_even>;
    static constexpr std::uint32_t fixed_scale_block = 0, default_scale_block = 128, scale_bytes = 4;
};
template <>
struct wire_traits<wire_format::mxfp8> {
    template <class Round>
    using recipe_with = octet::recipe<e4m3, block<1, 32>, scale::pow2_ceil, scale_storage::ue8m0, Round,
                                      overflow::saturate, nan_policy::per_element>;
    using recipe = recipe_with<round::nearest_even>;  // = recipes::mxfp8_e4m3_ceil, per_element
    static constexpr std::uint32_t fixed_scale_block = 32, default_scale_block = 32, scale_bytes = 1;
};
template <>
struct wire_traits<wire_format::nvfp4> {
    template <class Round>
    using recipe_with = octet::recipe<e2m1, block<1, 16>, scale::amax_ratio<0>, scale_storage::e4m3, Round,
                                      overflow::saturate, nan_policy::per_element>;
    using recipe = recipe_with<round::nearest_even>;  // = recipes::nvfp4, per_element
    static constexpr std::uint32_t fixed_scale_block = 16, default_scale_block = 16, scale_bytes = 1;
};

/// The payload code of one transformed coordinate x at the block scale S: the recipe's element
/// rule, except that a non-finite x takes a non-finite code where the format has one (E4M3 and
/// MXFP8: the NaN code; E5M2: +-Inf, or the NaN code), so that it decodes non-finite and is counted
/// in wire_header::non_finite_codes rather than arriving as a large finite gradient. E2M1 (NVFP4)
/// has no such code: there an Inf saturates to +-6 S and a NaN gives +6 S, as in encode.
template <class R>
OCTET_HD std::uint8_t encode_wire_code(float x, float S, std::uint32_t random_bits = 0) {
    using Fmt = typename R::format;
    if constexpr (Fmt::has_nan || Fmt::has_inf) {
        if (!is_finite_float(x)) return encode<Fmt, round::nearest_even, overflow::to_nonfinite>(x);
    }
    return encode_scaled<R>(x, S, random_bits);
}

/// Calls fn(wire_traits<F>{}) for the runtime format f (which must be valid).
template <class Fn>
decltype(auto) dispatch_wire_format(wire_format f, Fn&& fn) {
    switch (f) {
        case wire_format::e5m2:
            return fn(wire_traits<wire_format::e5m2>{});
        case wire_format::mxfp8:
            return fn(wire_traits<wire_format::mxfp8>{});
        case wire_format::nvfp4:
            return fn(wire_traits<wire_format::nvfp4>{});
        default:
            return fn(wire_traits<wire_format::e4m3>{});
    }
}

inline constexpr std::uint32_t wire_magic = 0x5747434Fu;  // "OCGW" little-endian
inline constexpr std::uint16_t wire_version = 1;
inline constexpr std::size_t wire_header_bytes = 64;
inline constexpr std::uint64_t wire_max_elements = std::uint64_t{1} << 40;
/// first_index + L (the global index after a message's last coordinate) is at most 2^62, so global
/// indices never wrap.
inline constexpr std::uint64_t wire_max_index = std::uint64_t{1} << 62;
inline constexpr std::size_t wire_checksum_offset = 56;

/// Where each section of an n-element message lies.
struct wire_layout {
    std::uint64_t count = 0;  ///< n
    std::uint64_t coded = 0;  ///< L: coordinates carried (n, or n rounded up to the block)
    std::uint32_t block = 0;  ///< effective Hadamard block (0 for identity)
    std::uint32_t scale_block = 0;
    std::uint32_t scale_bytes = 0;  ///< bytes per scale (4 or 1)
    std::uint32_t code_bits = 0;    ///< 8 or 4
    std::uint64_t scale_count = 0;
    std::uint64_t scales_offset = wire_header_bytes;
    std::uint64_t scales_bytes = 0;  ///< padded to 16
    std::uint64_t payload_offset = 0;
    std::uint64_t payload_bytes = 0;  ///< padded to 16
    std::uint64_t total_bytes = 0;
};

/// The parsed header of a message.
struct wire_header {
    std::uint16_t version = wire_version;
    wire_format format = wire_format::e4m3;
    transform_kind transform = transform_kind::identity;
    std::uint32_t block = 0;  ///< effective Hadamard block (0 for identity)
    std::uint32_t scale_block = 0;
    std::uint64_t seed = 0;
    std::uint64_t first_index = 0;
    std::uint64_t count = 0;
    float tensor_scale = 1.0f;
    std::uint64_t total_bytes = 0;
    std::uint64_t checksum = 0;
    bool stochastic = false;             ///< flag bit 0 (informational: decoding is the same)
    std::uint64_t non_finite_codes = 0;  ///< payload codes that decode to NaN or +-Inf (see the header comment)
};

namespace detail {

OCTET_HD std::uint64_t mix64(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/// Checksum term of the 8-byte word k of a message.
OCTET_HD std::uint64_t checksum_term(std::uint64_t word, std::uint64_t k) {
    return mix64(word ^ ((k + 1) * 0x9E3779B97F4A7C15ull));
}

// load_le32/64 and store_le32/64 live in octet/core/byte_io.hpp.
OCTET_HD std::uint64_t round_up16(std::uint64_t v) {
    return (v + 15) & ~std::uint64_t{15};
}

/// True when an 8-bit payload code of format f decodes to NaN or +-Inf (NVFP4 has none).
OCTET_HD bool non_finite_code(wire_format f, std::uint8_t c) {
    const std::uint32_t mag = c & 0x7Fu;
    if (f == wire_format::e4m3 || f == wire_format::mxfp8) return mag == 0x7Fu;
    if (f == wire_format::e5m2) return mag >= 0x7Cu;
    return false;
}

inline std::uint32_t scale_block_of(const codec_config& c) {
    return dispatch_wire_format(c.format, [&](auto tr) -> std::uint32_t {
        using Tr = decltype(tr);
        return c.scale_block == 0 ? Tr::default_scale_block : c.scale_block;
    });
}

/// The layout from validated fields (format, transform, effective block, scale block, n).
inline wire_layout make_layout(wire_format f, transform_kind t, std::uint32_t block_eff, std::uint32_t scale_block,
                               std::uint64_t n) {
    wire_layout l;
    l.count = n;
    l.block = t == transform_kind::hadamard ? block_eff : 0;
    l.coded = t == transform_kind::hadamard ? (n + block_eff - 1) / block_eff * block_eff : n;
    l.scale_block = scale_block;
    dispatch_wire_format(f, [&](auto tr) {
        using Tr = decltype(tr);
        l.scale_bytes = Tr::scale_bytes;
        l.code_bits = Tr::recipe::format::bits <= 4 ? 4 : 8;
    });
    l.scale_count = (l.coded + scale_block - 1) / scale_block;
    l.scales_bytes = round_up16(l.scale_count * l.scale_bytes);
    l.payload_offset = l.scales_offset + l.scales_bytes;
    l.payload_bytes = round_up16(l.code_bits == 4 ? (l.coded + 1) / 2 : l.coded);
    l.total_bytes = l.payload_offset + l.payload_bytes;
    return l;
}

inline void validate_config(const codec_config& c, const char* fn) {
    OCTET_REQUIRE(c.format == wire_format::e4m3 || c.format == wire_format::e5m2 || c.format == wire_format::mxfp8 ||
                      c.format == wire_format::nvfp4,
                  fn, "config.format", "is not a known wire format; use e4m3, e5m2, mxfp8 or nvfp4");
    check_transform_args(c.transform, c.block, fn, "config.transform", "config.block");
    const std::uint32_t sb = scale_block_of(c);
    dispatch_wire_format(c.format, [&](auto tr) {
        using Tr = decltype(tr);
        if (Tr::fixed_scale_block != 0)
            OCTET_REQUIRE(sb == Tr::fixed_scale_block, fn, "config.scale_block",
                          message("is ", sb, " but ", wire_format_name(c.format), " scales blocks of exactly ",
                                  Tr::fixed_scale_block, " elements; pass 0 (the format's own)"));
    });
    OCTET_REQUIRE(is_power_of_two(sb) && sb >= 16 && sb <= 32768, fn, "config.scale_block",
                  message("is ", sb, "; use a power of two in [16, 32768] (or 0 for the format's default)"));
}

}  // namespace detail

/// The layout of the message that encodes n elements under cfg.
inline wire_layout wire_layout_of(const codec_config& cfg, std::uint64_t n) {
    detail::validate_config(cfg, "octet::wire_layout_of");
    OCTET_REQUIRE(n <= wire_max_elements, "octet::wire_layout_of", "n",
                  detail::message("is ", n, "; a message holds at most 2^40 elements"));
    const std::uint32_t b = cfg.transform == transform_kind::hadamard ? hadamard_effective_block(n, cfg.block) : 0;
    return detail::make_layout(cfg.format, cfg.transform, b, detail::scale_block_of(cfg), n);
}

/// Bytes of the message that encodes n elements under cfg.
inline std::size_t encoded_size(const codec_config& cfg, std::size_t n) {
    return static_cast<std::size_t>(wire_layout_of(cfg, n).total_bytes);
}

/// The checksum of a message (the checksum field read as zero). `bytes.size()` must be a multiple of 8.
inline std::uint64_t wire_checksum(span<const std::uint8_t> bytes) {
    OCTET_REQUIRE(bytes.size() % 8 == 0 && bytes.size() >= wire_header_bytes, "octet::wire_checksum", "bytes",
                  detail::message("has ", bytes.size(), " bytes; a message is at least 64 bytes and a multiple of 16"));
    std::uint64_t sum = 0;
    const std::size_t words = bytes.size() / 8;
    for (std::size_t k = 0; k < words; ++k) {
        const std::uint64_t w = k == wire_checksum_offset / 8 ? 0 : load_le64(bytes.data() + 8 * k);
        sum += detail::checksum_term(w, k);
    }
    return sum;
}

namespace detail {

/// Writes the header fields of `h` (checksum field zero) into the first 64 bytes of p.
OCTET_HD void write_header_fields(std::uint8_t* p, wire_format f, transform_kind t, std::uint32_t block_eff,
                                  std::uint32_t scale_block, std::uint64_t seed, std::uint64_t first_index,
                                  std::uint64_t count, float tensor_scale, std::uint64_t total, bool stochastic) {
    store_le32(p + 0, wire_magic);
    store_le16(p + 4, wire_version);
    store_le16(p + 6, static_cast<std::uint32_t>(wire_header_bytes));
    p[8] = static_cast<std::uint8_t>(f);
    p[9] = static_cast<std::uint8_t>(t);
    p[10] = static_cast<std::uint8_t>(t == transform_kind::hadamard ? log2_exact(block_eff) : 0);
    p[11] = static_cast<std::uint8_t>(log2_exact(scale_block));
    store_le32(p + 12, stochastic ? 1u : 0u);
    store_le64(p + 16, seed);
    store_le64(p + 24, first_index);
    store_le64(p + 32, count);
    store_le32(p + 40, float_to_bits(tensor_scale));
    store_le32(p + 44, 0);
    store_le64(p + 48, total);
    store_le64(p + 56, 0);
}

[[noreturn]] inline void bad_message(const char* fn, const std::string& what) {
    throw_argument_error(fn, "message", what);
}

/// Parses and checks the header fields of a message against its size (no checksum, no sections).
inline wire_header parse_header(span<const std::uint8_t> m, wire_layout& layout, const char* fn) {
    if (m.size() < wire_header_bytes)
        bad_message(fn, message("is truncated: ", m.size(), " bytes, but a message has a 64-byte header"));
    if (m.data() == nullptr) bad_message(fn, "is null");
    const std::uint8_t* p = m.data();
    if (load_le32(p) != wire_magic)
        bad_message(fn, "does not start with the magic 'OCGW'; it is not an octet gradient message");
    wire_header h;
    h.version = static_cast<std::uint16_t>(load_le16(p + 4));
    if (h.version != wire_version)
        bad_message(fn, message("has version ", h.version, "; this build reads version ", wire_version));
    if (load_le16(p + 6) != wire_header_bytes) bad_message(fn, "has a header size other than 64 bytes");
    if (p[8] < 1 || p[8] > 4) bad_message(fn, message("has an unknown format id ", int{p[8]}));
    if (p[9] > 1) bad_message(fn, message("has an unknown transform id ", int{p[9]}));
    h.format = static_cast<wire_format>(p[8]);
    h.transform = static_cast<transform_kind>(p[9]);
    h.seed = load_le64(p + 16);
    h.first_index = load_le64(p + 24);
    h.count = load_le64(p + 32);
    if ((load_le32(p + 12) & ~1u) != 0 || load_le32(p + 44) != 0)
        bad_message(fn, "has unknown flag bits or a non-zero reserved field");
    h.stochastic = (p[12] & 1u) != 0;
    if (h.count > wire_max_elements)
        bad_message(fn, message("claims ", h.count, " elements; a message holds at most 2^40"));
    const int lb = p[10], ls = p[11];
    if (h.transform == transform_kind::hadamard) {
        if (lb < hadamard_min_log2 || lb > hadamard_max_log2)
            bad_message(fn, message("has a Hadamard block of 2^", lb, "; valid: 2^4 .. 2^15"));
        h.block = 1u << lb;
        if (hadamard_effective_block(h.count, h.block) != h.block)
            bad_message(fn, message("has a Hadamard block of ", h.block, " for ", h.count, " elements (expected ",
                                    hadamard_effective_block(h.count, h.block), ")"));
    } else if (lb != 0) {
        bad_message(fn, "has a block size with the identity transform");
    }
    if (ls < 4 || ls > 15) bad_message(fn, message("has a scale block of 2^", ls, "; valid: 2^4 .. 2^15"));
    h.scale_block = 1u << ls;
    dispatch_wire_format(h.format, [&](auto tr) {
        using Tr = decltype(tr);
        if (Tr::fixed_scale_block != 0 && h.scale_block != Tr::fixed_scale_block)
            bad_message(fn, message("has a scale block of ", h.scale_block, " for ", wire_format_name(h.format),
                                    " (must be ", Tr::fixed_scale_block, ")"));
    });
    h.tensor_scale = bits_to_float(load_le32(p + 40));
    if (h.format == wire_format::nvfp4) {
        if (!(h.tensor_scale > 0.0f) || !(h.tensor_scale <= 3.40282347e38f))
            bad_message(fn, "has an NVFP4 tensor scale that is not finite and positive");
    } else if (float_to_bits(h.tensor_scale) != float_to_bits(1.0f)) {
        bad_message(fn, "has a tensor scale other than 1 for a one-level format");
    }
    h.total_bytes = load_le64(p + 48);
    h.checksum = load_le64(p + 56);
    layout = make_layout(h.format, h.transform, h.block, h.scale_block, h.count);
    if (h.first_index > wire_max_index - layout.coded)
        bad_message(
            fn, message("has a first index of ", h.first_index, "; first index + coordinates must stay below 2^62"));
    if (h.total_bytes != layout.total_bytes)
        bad_message(fn, message("has a total size field of ", h.total_bytes, " bytes, but its header describes ",
                                layout.total_bytes));
    if (m.size() != layout.total_bytes)
        bad_message(fn, message(m.size() < layout.total_bytes ? "is truncated: " : "has trailing bytes: ", m.size(),
                                " bytes, but its header describes ", layout.total_bytes));
    return h;
}

/// Checks scales and padding; returns the number of non-finite payload codes.
template <class Tr>
std::uint64_t check_sections(span<const std::uint8_t> m, wire_format f, const wire_layout& l, const char* fn) {
    const std::uint8_t* s = m.data() + l.scales_offset;
    for (std::uint64_t k = 0; k < l.scale_count; ++k) {
        if constexpr (Tr::scale_bytes == 4) {
            const float v = bits_to_float(load_le32(s + 4 * k));
            if (!(v > 0.0f) || !(v <= 3.40282347e38f))
                bad_message(fn, message("has scale ", k, " = ", v, "; scales are finite and positive"));
        } else if constexpr (std::is_same_v<typename Tr::recipe::scale_storage_type, scale_storage::ue8m0>) {
            if (s[k] == 0xFF) bad_message(fn, message("has scale ", k, " = the UE8M0 NaN code"));
        } else {
            if (s[k] >= 0x7F)
                bad_message(fn, message("has scale ", k, " = E4M3 code ", int{s[k]},
                                        "; block scales are finite and not negative"));
        }
    }
    for (std::uint64_t b = l.scale_count * l.scale_bytes; b < l.scales_bytes; ++b)
        if (s[b] != 0) bad_message(fn, "has non-zero padding after its scales");
    const std::uint8_t* q = m.data() + l.payload_offset;
    const std::uint64_t used = l.code_bits == 4 ? (l.coded + 1) / 2 : l.coded;
    if (l.code_bits == 4 && (l.coded & 1u) && (q[used - 1] >> 4) != 0) bad_message(fn, "has a non-zero padding nibble");
    for (std::uint64_t b = used; b < l.payload_bytes; ++b)
        if (q[b] != 0) bad_message(fn, "has non-zero padding after its payload");
    std::uint64_t non_finite = 0;
    if (l.code_bits == 8)
        for (std::uint64_t j = 0; j < used; ++j) non_finite += non_finite_code(f, q[j]) ? 1 : 0;
    return non_finite;
}

}  // namespace detail

/// Validates a whole message (header, size, checksum, scales, padding) and returns its header,
/// with the count of non-finite payload codes (accepted; see the header comment).
inline wire_header read_wire_header(span<const std::uint8_t> message, wire_layout* layout_out = nullptr,
                                    const char* fn = "octet::read_wire_header") {
    wire_layout l;
    wire_header h = detail::parse_header(message, l, fn);
    if (wire_checksum(message) != h.checksum)
        detail::bad_message(fn, "fails its checksum: it was corrupted or truncated in transit");
    dispatch_wire_format(h.format, [&](auto tr) {
        h.non_finite_codes = detail::check_sections<decltype(tr)>(message, h.format, l, fn);
    });
    if (layout_out) *layout_out = l;
    return h;
}

/// Recomputes and stores the checksum of a message whose fields were written (tests, tools).
inline void seal_wire_message(span<std::uint8_t> message) {
    OCTET_REQUIRE(message.size() >= wire_header_bytes && message.size() % 8 == 0, "octet::seal_wire_message", "message",
                  "is shorter than a header or not a multiple of 8 bytes");
    store_le64(message.data() + wire_checksum_offset, 0);
    store_le64(message.data() + wire_checksum_offset, wire_checksum(message));
}

}  // namespace octet
