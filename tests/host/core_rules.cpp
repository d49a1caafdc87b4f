// The small shared rules of core/ against independent oracles: the C library (std::isfinite,
// std::fabs, std::ldexp, std::exp2 in double) for bits.hpp and rounded.hpp's exp2, and a
// bit-by-bit model of little-endian storage for byte_io.hpp's loads, stores and sub-byte packing.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "octet/core/bits.hpp"
#include "octet/core/byte_io.hpp"
#include "octet/core/rounded.hpp"
#include "support/random.hpp"

using namespace octet;

namespace {

/// Bit b of a little-endian byte string (byte b / 8, bit b % 8): the storage model the oracle
/// reads, independent of the shifts and masks the code under test uses.
int bit_of(const std::uint8_t* bytes, int b) {
    return (bytes[b / 8] >> (b % 8)) & 1;
}

std::uint64_t value_of_bits(const std::uint8_t* bytes, int first_bit, int width) {
    std::uint64_t v = 0, weight = 1;
    for (int k = 0; k < width; ++k, weight *= 2) v += weight * static_cast<std::uint64_t>(bit_of(bytes, first_bit + k));
    return v;
}

}  // namespace

TEST_CASE("is_finite_float and abs_float agree with the C library on a sweep of all bit patterns") {
    std::uint64_t checked = 0;
    for (std::uint64_t u = 0; u <= 0xFFFFFFFFull; u += 251) {  // a prime stride visits every exponent and sign
        const float x = bits_to_float(static_cast<std::uint32_t>(u));
        REQUIRE(is_finite_float(x) == std::isfinite(x));
        const float a = abs_float(x);
        REQUIRE(float_to_bits(a) == float_to_bits(std::fabs(x)));
        ++checked;
    }
    for (std::uint32_t u :
         {0x00000000u, 0x80000000u, 0x00000001u, 0x7F7FFFFFu, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFFFFFFFu}) {
        const float x = bits_to_float(u);
        CHECK(is_finite_float(x) == std::isfinite(x));
        CHECK(float_to_bits(abs_float(x)) == float_to_bits(std::fabs(x)));
    }
    CHECK(checked > 17000000u);
}

TEST_CASE("exp2i and exp2i_normal are exact powers of two") {
    for (int e = -149; e <= 127; ++e) REQUIRE(exp2i(e) == std::ldexp(1.0f, e));
    for (int e = -126; e <= 127; ++e) REQUIRE(exp2i_normal(e) == std::ldexp(1.0f, e));
}

TEST_CASE("rn::exp2 against exp2 in double") {
    auto g = octet_test::rng(1701);
    std::uniform_real_distribution<float> normal_range(-126.0f, 127.9f), subnormal_range(-150.5f, -126.0f),
        reduced(-0.5f, 0.5f);
    double worst = 0.0;
    for (int t = 0; t < 2000000; ++t) {
        const float y = normal_range(g);
        const double exact = std::exp2(static_cast<double>(y));
        const double rel = std::fabs(static_cast<double>(rn::exp2(y)) - exact) / exact;
        worst = rel > worst ? rel : worst;
    }
    CHECK(worst < 2e-7);  // the documented bound
    for (int t = 0; t < 200000; ++t) {
        const float y = subnormal_range(g);
        const double err = std::fabs(static_cast<double>(rn::exp2(y)) - std::exp2(static_cast<double>(y)));
        REQUIRE(err <= std::ldexp(1.0, -149));  // within one subnormal step
    }
    for (int t = 0; t < 200000; ++t) {
        const float f = reduced(g);
        const double exact = std::exp2(static_cast<double>(f));
        REQUIRE(std::fabs(static_cast<double>(rn::exp2_reduced(f)) - exact) / exact < 1.2e-7);
    }
    for (int k = -126; k <= 127; ++k)
        REQUIRE(rn::exp2(static_cast<float>(k)) == std::ldexp(1.0f, k));  // integers exact
    CHECK(rn::exp2(128.0f) == INFINITY);
    CHECK(rn::exp2(1e30f) == INFINITY);
    CHECK(rn::exp2(-151.0f) == 0.0f);
    CHECK(rn::exp2(-INFINITY) == 0.0f);
}

TEST_CASE("little-endian loads and stores match the bit model and touch only their bytes") {
    auto g = octet_test::rng(1702);
    for (int t = 0; t < 20000; ++t) {
        std::uint8_t b[8];
        for (auto& c : b) c = static_cast<std::uint8_t>(g());
        REQUIRE(load_le16(b) == value_of_bits(b, 0, 16));
        REQUIRE(load_le24(b) == value_of_bits(b, 0, 24));
        REQUIRE(load_le32(b) == value_of_bits(b, 0, 32));
        REQUIRE(load_le64(b) == value_of_bits(b, 0, 64));

        const std::uint64_t v = g();
        for (int width : {16, 24, 32, 64}) {
            std::uint8_t out[10];
            std::memset(out, 0xA5, sizeof out);  // poison: bytes outside the value must stay
            std::uint8_t* p = out + 1;
            if (width == 16) store_le16(p, static_cast<std::uint32_t>(v));
            if (width == 24) store_le24(p, static_cast<std::uint32_t>(v));
            if (width == 32) store_le32(p, static_cast<std::uint32_t>(v));
            if (width == 64) store_le64(p, v);
            const std::uint64_t mask = width == 64 ? ~0ull : (1ull << width) - 1;
            REQUIRE(value_of_bits(p, 0, width) == (v & mask));
            CHECK(out[0] == 0xA5);
            for (int k = 1 + width / 8; k < 10; ++k) REQUIRE(out[k] == 0xA5);
        }
    }
}

TEST_CASE("FP4 and FP6 packing put code k at bits [w k, w k + w) and ignore high input bits") {
    auto g = octet_test::rng(1703);
    for (int t = 0; t < 20000; ++t) {
        const std::uint8_t c0 = static_cast<std::uint8_t>(g()), c1 = static_cast<std::uint8_t>(g());
        const std::uint8_t byte = pack_fp4x2(c0, c1);
        REQUIRE(value_of_bits(&byte, 0, 4) == (c0 & 15u));
        REQUIRE(value_of_bits(&byte, 4, 4) == (c1 & 15u));
        REQUIRE(static_cast<unsigned>(unpack_fp4(byte, 0)) == (c0 & 15u));
        REQUIRE(static_cast<unsigned>(unpack_fp4(byte, 1)) == (c1 & 15u));

        std::uint8_t c[4], group[3];
        for (auto& x : c) x = static_cast<std::uint8_t>(g());
        pack_fp6x4(c, group);
        for (int k = 0; k < 4; ++k) {
            REQUIRE(value_of_bits(group, 6 * k, 6) == (c[k] & 63u));
            REQUIRE(static_cast<unsigned>(unpack_fp6(group, k)) == (c[k] & 63u));
        }
    }
}
