// The host kernels compiled for each instruction set (core/isa_dispatch.hpp) against the scalar
// rules, bit for bit: every variant this CPU can run (portable, AVX2, AVX-512), forced one at a
// time. Encode under every deterministic rounding and overflow policy on every bf16 and fp16
// value, the edges of every rounding interval, specials and fresh random floats; decode of every
// code; bf16/fp16 inputs; odd lengths and offsets (the chunk tails). The scalar rules themselves
// are checked against the float64 oracle in format_core.cpp; the public encode_array is checked
// against that oracle here too, so the dispatch cannot hide behind a shared mistake.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "octet/format/convert.hpp"
#include "octet/format/encode.hpp"
#include "support/format_reference.hpp"
#include "support/isa.hpp"
#include "support/random.hpp"

namespace format_dispatch_test {
using namespace octet;
using detail::simd_isa;

using octet_test::hex;
using octet_test::isa_name;
using octet_test::runnable_isas;

/// The edges of every rounding interval of Fmt (both ends, the midpoint, their float
/// neighbours), the region past the largest finite value, specials, float subnormals, every bf16
/// and fp16 value, and fresh random bit patterns; both signs.
template <class Fmt>
std::vector<float> probe_inputs(std::mt19937_64& g) {
    std::vector<double> vals = octet_test::reference_table<Fmt>::get().values;
    const double mx = vals.back();
    vals.push_back(mx + std::ldexp(1.0, std::ilogb(mx) - Fmt::mantissa_bits));  // the virtual next value
    vals.push_back(2 * vals.back());
    std::vector<float> pts;
    for (std::size_t i = 0; i + 1 < vals.size(); ++i) {
        const float lo = static_cast<float>(vals[i]), hi = static_cast<float>(vals[i + 1]);
        const float mid = static_cast<float>((vals[i] + vals[i + 1]) / 2);
        for (float p : {lo, hi, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY),
                        std::nextafter(lo, INFINITY), std::nextafter(hi, 0.0f)})
            pts.push_back(p);
    }
    for (float p :
         {0.0f, FLT_MIN, FLT_TRUE_MIN, 3 * FLT_TRUE_MIN, FLT_MIN / 3, std::nextafter(FLT_MIN, 0.0f), FLT_MAX, 3e38f,
          INFINITY, std::ldexp(1.0f, -127), std::ldexp(1.5f, -127), std::ldexp(1.0f, 127), std::ldexp(1.75f, 127)})
        pts.push_back(p);
    const std::size_t n = pts.size();
    for (std::size_t i = 0; i < n; ++i) pts.push_back(-pts[i]);
    for (std::uint32_t nan_bits : {0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu, 0xFFC00000u, 0xFF800001u, 0xFFFFFFFFu})
        pts.push_back(bits_to_float(nan_bits));
    for (std::uint32_t b = 0; b < 65536; ++b) {
        pts.push_back(to_float(bf16{static_cast<std::uint16_t>(b)}));
        pts.push_back(to_float(fp16{static_cast<std::uint16_t>(b)}));
    }
    std::uniform_int_distribution<std::uint32_t> bits;
    for (int k = 0; k < (1 << 18); ++k) pts.push_back(bits_to_float(bits(g)));
    for (int k = 0; k < 4096; ++k) pts.push_back(bits_to_float(bits(g) & 0x807FFFFFu));  // float subnormals
    std::shuffle(pts.begin(), pts.end(), g);  // specials land in every lane and in the tails
    return pts;
}

/// Runs the encode kernel compiled for `isa` on [offset, offset + n) and compares with encode().
template <class Fmt, class Round, class Overflow, class In>
std::size_t check_encode_kernel(simd_isa isa, const std::vector<In>& in, std::size_t offset, std::size_t n) {
    std::vector<std::uint8_t> got(in.size(), 0xEE);
    detail::run_kernel<detail::encode_kernel<Fmt, Round, Overflow, In>>(isa, in.data() + offset, got.data() + offset,
                                                                        n);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
        const bool inside = i >= offset && i < offset + n;
        const std::uint8_t want =
            inside ? encode<Fmt, Round, Overflow>(in[i]) : std::uint8_t{0xEE};  // nothing outside written
        if (got[i] != want && bad++ < 3) {
            std::uint32_t x_bits;
            if constexpr (std::is_same_v<In, float>)
                x_bits = float_to_bits(in[i]);
            else
                x_bits = in[i].bits;
            FAIL_CHECK((std::string(format_name<Fmt>()) + " " + rounding_name<Round>() + " " + isa_name(isa) +
                        " element " + std::to_string(i) + ": input bits " + hex(x_bits) + " got " + hex(got[i]) +
                        " expected " + hex(want)));
        }
    }
    return bad;
}

template <class Fmt, class Round, class Overflow>
void check_mode(const std::vector<float>& in) {
    for (simd_isa isa : runnable_isas()) {
        INFO((std::string(format_name<Fmt>()) + " " + rounding_name<Round>() + " " + isa_name(isa)));
        CHECK(check_encode_kernel<Fmt, Round, Overflow>(isa, in, 0, in.size()) == 0);
        for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{255}, std::size_t{257}, std::size_t{1000}})
            CHECK(check_encode_kernel<Fmt, Round, Overflow>(isa, in, 3, n) == 0);
    }
}

template <class Fmt, class Overflow>
void check_roundings(const std::vector<float>& in) {
    check_mode<Fmt, round::nearest_even, Overflow>(in);
    check_mode<Fmt, round::toward_zero, Overflow>(in);
    check_mode<Fmt, round::up, Overflow>(in);
    check_mode<Fmt, round::down, Overflow>(in);
}

}  // namespace format_dispatch_test

using namespace format_dispatch_test;

#define OCTET_DISPATCH_FORMATS e4m3, e5m2, e4m3fnuz, e5m2fnuz, e2m1, e2m3, e3m2, ue8m0

TEST_CASE("the dispatch picks a variant this CPU runs") {
    const auto isas = runnable_isas();
    MESSAGE("variants run here: " << [&] {
        std::string s;
        for (simd_isa isa : isas) s += std::string(isa_name(isa)) + " ";
        return s;
    }());
    CHECK(detail::isa_supported(detail::best_isa()));
    CHECK(isas.front() == simd_isa::portable);
    CHECK(detail::best_isa() == isas.back());
}

TEST_CASE_TEMPLATE("every encode variant gives the scalar bits, every deterministic mode", Fmt,
                   OCTET_DISPATCH_FORMATS) {
    auto g = octet_test::rng(0xD15Bu + Fmt::bits * 31u + Fmt::mantissa_bits);
    const auto in = probe_inputs<Fmt>(g);
    check_roundings<Fmt, overflow::saturate>(in);
    if constexpr (Fmt::has_nan || Fmt::has_inf) check_roundings<Fmt, overflow::to_nonfinite>(in);
}

TEST_CASE_TEMPLATE("every encode variant gives the scalar bits on bf16 and fp16 inputs", Fmt, e4m3, e5m2, e2m1, ue8m0) {
    auto g = octet_test::rng(0xB16u + Fmt::mantissa_bits);
    std::vector<bf16> b(65536 + 4099);
    std::vector<fp16> h(b.size());
    for (std::size_t i = 0; i < b.size(); ++i) {
        const auto bits = static_cast<std::uint16_t>(i < 65536 ? i : g());
        b[i] = bf16{bits};
        h[i] = fp16{bits};
    }
    using Round = std::conditional_t<std::is_same_v<Fmt, ue8m0>, round::up, round::nearest_even>;
    for (simd_isa isa : runnable_isas()) {
        INFO((std::string(format_name<Fmt>()) + " " + isa_name(isa)));
        CHECK(check_encode_kernel<Fmt, Round, overflow::saturate>(isa, b, 0, b.size()) == 0);
        CHECK(check_encode_kernel<Fmt, Round, overflow::saturate>(isa, h, 0, h.size()) == 0);
        CHECK(check_encode_kernel<Fmt, Round, overflow::saturate>(isa, b, 5, 1001) == 0);
    }
}

TEST_CASE_TEMPLATE("every decode variant gives the scalar bits for every code", Fmt, OCTET_DISPATCH_FORMATS) {
    auto g = octet_test::rng(0xDEC0u + Fmt::bits);
    std::vector<std::uint8_t> codes(256 * 5 + 77);
    for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint8_t>(i < 256 ? i : g());
    for (simd_isa isa : runnable_isas()) {
        for (std::size_t offset : {std::size_t{0}, std::size_t{9}}) {
            const std::size_t n = codes.size() - offset - (offset ? 13 : 0);
            std::vector<float> got(codes.size(), -7.0f);
            detail::run_kernel<detail::decode_kernel<Fmt>>(isa, codes.data() + offset, got.data() + offset, n);
            std::size_t bad = 0;
            for (std::size_t i = 0; i < codes.size(); ++i) {
                const bool inside = i >= offset && i < offset + n;
                const std::uint32_t want = float_to_bits(inside ? decode<Fmt>(codes[i]) : -7.0f);
                if (float_to_bits(got[i]) != want && bad++ < 3)
                    FAIL_CHECK((std::string(format_name<Fmt>()) + " " + isa_name(isa) + " code " + hex(codes[i]) +
                                " got bits " + hex(float_to_bits(got[i])) + " expected " + hex(want)));
            }
            CHECK_MESSAGE(bad == 0, (std::string(format_name<Fmt>()) + " " + isa_name(isa)));
        }
    }
}

TEST_CASE_TEMPLATE("encode_array and decode_array (the dispatched front doors) against the float64 oracle", Fmt,
                   OCTET_DISPATCH_FORMATS) {
    auto g = octet_test::rng(0x0AC1Eu + Fmt::bits * 7u + Fmt::mantissa_bits);
    auto in = octet_test::with_edge_cases(g, 20011, static_cast<float>(Fmt::max_finite) / 4, true);
    std::uniform_int_distribution<std::uint32_t> bits;
    for (int k = 0; k < 5000; ++k) in.push_back(bits_to_float(bits(g)));
    using Round = std::conditional_t<std::is_same_v<Fmt, ue8m0>, round::up, round::nearest_even>;
    std::vector<std::uint8_t> codes(in.size());
    encode_array<Fmt, Round>(on_host(2), as_cspan(in), as_span(codes));
    std::size_t bad = 0;
    for (std::size_t i = 0; i < in.size(); ++i)
        if (codes[i] != octet_test::reference_encode<Fmt, Round, overflow::saturate>(in[i]) && bad++ < 3)
            FAIL_CHECK(
                (std::string(format_name<Fmt>()) + " x bits " + hex(float_to_bits(in[i])) + " got " + hex(codes[i])));
    CHECK(bad == 0);

    std::vector<std::uint8_t> all(256);
    for (unsigned c = 0; c < 256; ++c) all[c] = static_cast<std::uint8_t>(c);
    std::vector<float> back(all.size());
    decode_array<Fmt>(on_host(1), as_cspan(all), as_span(back));
    for (unsigned c = 0; c < 256; ++c) {
        const auto r = octet_test::reference_decode<Fmt>(c & Fmt::code_mask);
        if (r.kind == octet_test::ref_kind::nan)
            CHECK(float_to_bits(back[c]) == 0x7FFFFFFFu);
        else if (r.kind == octet_test::ref_kind::pos_inf)
            CHECK(back[c] == INFINITY);
        else if (r.kind == octet_test::ref_kind::neg_inf)
            CHECK(back[c] == -INFINITY);
        else
            CHECK_MESSAGE(static_cast<double>(back[c]) == r.value,
                          (std::string(format_name<Fmt>()) + " code " + hex(c)));
    }
}
