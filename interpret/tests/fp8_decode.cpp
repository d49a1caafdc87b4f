// The interpreter's FP8 decoding (octet/interpret/fp8.hpp, written from the PTX ISA's "Alternate
// Floating-Point Data Formats"), checked code by code against an oracle that is neither the
// interpreter's nor octet's: the CUDA toolkit's host conversions of <cuda_fp8.h>
// (__nv_cvt_fp8_to_halfraw, every FP8 value is exact in half precision), for all 256 codes of .e4m3
// and .e5m2, plus the ISA's landmarks (largest magnitudes, smallest subnormals, the special codes).
#include <doctest/doctest.h>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ios>
#include <string>

#include "octet/interpret/fp8.hpp"

namespace {

namespace ip = octet::interpret::ptx;

/// The toolkit's value of `code`, through its half-precision bits (decoded here by the IEEE binary16
/// rule, so that no conversion of the interpreter's or octet's stands in the oracle's path).
float toolkit_value(std::uint8_t code, __nv_fp8_interpretation_t kind) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), kind);
    const unsigned bits = h.x, sign = bits >> 15, e = (bits >> 10) & 0x1Fu, m = bits & 0x3FFu;
    float v;
    if (e == 0x1F)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = std::ldexp(static_cast<float>(m), -24);
    else
        v = std::ldexp(static_cast<float>(m + 1024), static_cast<int>(e) - 25);
    return sign ? -v : v;
}

std::uint32_t bits_of(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

template <class F>
void check_all_codes(__nv_fp8_interpretation_t kind) {
    int nans = 0, infinities = 0;
    for (unsigned c = 0; c < 256; ++c) {
        const auto code = static_cast<std::uint8_t>(c);
        const float mine = ip::decode<F>(code), oracle = toolkit_value(code, kind);
        INFO(F::name << " code 0x" << std::hex << c << std::dec << ": interpreter " << mine << ", toolkit " << oracle);
        if (std::isnan(oracle)) {
            CHECK(std::isnan(mine));
            CHECK(bits_of(mine) == bits_of(octet::interpret::canonical_nan()));  // the models' one NaN
            ++nans;
        } else {
            CHECK(bits_of(mine) == bits_of(oracle));  // the same value, zero's sign included
            infinities += std::isinf(mine) ? 1 : 0;
        }
    }
    // .e4m3: S.1111.111 only; .e5m2: S.11111.{01,10,11} and the two infinities S.11111.00
    CHECK(nans == (F::has_infinity ? 6 : 2));
    CHECK(infinities == (F::has_infinity ? 2 : 0));
}

}  // namespace

TEST_CASE("the interpreter's .e4m3 decoding agrees with the toolkit's on all 256 codes") {
    check_all_codes<ip::e4m3>(__NV_E4M3);
    CHECK(ip::decode<ip::e4m3>(0x7E) == 448.0f);  // S.1111.110: the largest
    CHECK(ip::decode<ip::e4m3>(0xFE) == -448.0f);
    CHECK(ip::decode<ip::e4m3>(0x78) == 256.0f);                // S.1111.000 is a number
    CHECK(ip::decode<ip::e4m3>(0x01) == std::ldexp(1.0f, -9));  // smallest subnormal 2^-6 * 1/8
    CHECK(ip::decode<ip::e4m3>(0x08) == std::ldexp(1.0f, -6));  // smallest normal, 2^(1 - 7)
    CHECK(ip::decode<ip::e4m3>(0x38) == 1.0f);                  // E = bias
    CHECK(std::signbit(ip::decode<ip::e4m3>(0x80)));            // -0
    CHECK(std::isnan(ip::decode<ip::e4m3>(0x7F)));
    CHECK(std::isnan(ip::decode<ip::e4m3>(0xFF)));
}

TEST_CASE("the interpreter's .e5m2 decoding agrees with the toolkit's on all 256 codes") {
    check_all_codes<ip::e5m2>(__NV_E5M2);
    CHECK(ip::decode<ip::e5m2>(0x7B) == 57344.0f);  // S.11110.11: the largest finite
    CHECK(ip::decode<ip::e5m2>(0x7C) == INFINITY);  // S.11111.00
    CHECK(ip::decode<ip::e5m2>(0xFC) == -INFINITY);
    CHECK(ip::decode<ip::e5m2>(0x01) == std::ldexp(1.0f, -16));  // smallest subnormal 2^-14 * 1/4
    CHECK(ip::decode<ip::e5m2>(0x04) == std::ldexp(1.0f, -14));  // smallest normal, 2^(1 - 15)
    CHECK(ip::decode<ip::e5m2>(0x3C) == 1.0f);
    for (unsigned c : {0x7Du, 0x7Eu, 0x7Fu, 0xFDu, 0xFEu, 0xFFu})
        CHECK(std::isnan(ip::decode<ip::e5m2>(static_cast<std::uint8_t>(c))));
}
