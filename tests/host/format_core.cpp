// The format core against the independent float64 brute-force oracle (support/format_reference.hpp):
// traits, decode of every code, encode under every rounding and overflow policy on dense points
// (every rounding interval with its edges, midpoints and random interior points), on every
// bf16 and fp16 bit pattern, and on fresh random floats. The CUDA toolkit comparison lives in
// tests/toolkit/format_conformance.cpp.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <ios>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "octet/core/philox.hpp"
#include "octet/format/convert.hpp"
#include "octet/format/encode.hpp"
#include "support/format_reference.hpp"
#include "support/random.hpp"

using namespace octet;
using octet_test::ref_kind;

namespace {

using e3m4 = float_format<3, 4>;                                 // custom IEEE-like, bias 3, with Inf
using e4m3_b11 = float_format<4, 3, 11, specials::nan_only>;     // E4M3 with bias 11
using ue4m4 = float_format<4, 4, 7, specials::nan_only, false>;  // custom unsigned 8-bit
using e3m0 = float_format<3, 0, 3, specials::finite>;            // custom mantissa-free, all finite

/// Inputs that probe every rounding interval of Fmt: both neighbours, the midpoint and its float
/// neighbours, one float ulp inside each end, random interior points; then the regions below
/// the smallest subnormal and beyond the largest finite value, float subnormals, and specials.
template <class Fmt>
std::vector<float> dense_points(std::mt19937_64& g) {
    const auto& t = octet_test::reference_table<Fmt>::get();
    std::vector<double> vals = t.values;
    const double mx = vals.back();
    vals.push_back(mx + std::ldexp(1.0, std::ilogb(mx) - Fmt::mantissa_bits));  // virtual next
    vals.push_back(2 * vals.back());
    std::vector<float> pts;
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (std::size_t i = 0; i + 1 < vals.size(); ++i) {
        const float lo = static_cast<float>(vals[i]), hi = static_cast<float>(vals[i + 1]);
        const float mid = static_cast<float>((vals[i] + vals[i + 1]) / 2);
        for (float p : {lo, hi, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY),
                        std::nextafter(lo, INFINITY), std::nextafter(hi, 0.0f)})
            pts.push_back(p);
        for (int k = 0; k < 6; ++k) pts.push_back(static_cast<float>(vals[i] + u(g) * (vals[i + 1] - vals[i])));
    }
    const double smallest = vals[0] > 0 ? vals[0] : vals[1];
    for (double f : {0.5, 0.25, 0.75, 0.125, 1e-3, 1e-6}) {
        const float p = static_cast<float>(smallest * f);
        pts.push_back(p);
        pts.push_back(std::nextafter(p, 0.0f));
        pts.push_back(std::nextafter(p, INFINITY));
    }
    for (float p : {0.0f, FLT_MIN, FLT_TRUE_MIN, 3 * FLT_TRUE_MIN, FLT_MIN / 3, FLT_MAX, 1e30f, 3e38f, INFINITY,
                    std::ldexp(1.0f, -127), std::ldexp(1.5f, -127), std::ldexp(1.0f, 127), std::ldexp(1.75f, 127)})
        pts.push_back(p);
    std::uniform_int_distribution<std::uint32_t> bits;
    for (int k = 0; k < 64; ++k) pts.push_back(bits_to_float(bits(g) & 0x007FFFFFu));  // float subnormals
    const std::size_t n = pts.size();
    for (std::size_t i = 0; i < n; ++i) pts.push_back(-pts[i]);
    for (std::uint32_t nan_bits : {0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu, 0xFFC00000u, 0xFF800001u})
        pts.push_back(bits_to_float(nan_bits));
    return pts;
}

template <class Fmt, class Round, class Overflow>
void check_encode_against_reference(const std::vector<float>& inputs, const char* what) {
    std::size_t mismatches = 0;
    for (float x : inputs) {
        const std::uint32_t expected = octet_test::reference_encode<Fmt, Round, Overflow>(x);
        const std::uint32_t got = encode<Fmt, Round, Overflow>(x);
        if (got != expected && mismatches++ < 5)
            FAIL_CHECK(format_name<Fmt>()
                       << " " << rounding_name<Round>() << " " << what << ": x=" << x << " (bits 0x" << std::hex
                       << float_to_bits(x) << ") got 0x" << got << " expected 0x" << expected);
    }
    CHECK_MESSAGE(mismatches == 0, format_name<Fmt>() << " " << rounding_name<Round>() << " " << what << ": "
                                                      << mismatches << " mismatches of " << inputs.size());
}

template <class Fmt, class Overflow>
void check_all_deterministic_modes(const std::vector<float>& inputs, const char* what) {
    check_encode_against_reference<Fmt, round::nearest_even, Overflow>(inputs, what);
    check_encode_against_reference<Fmt, round::toward_zero, Overflow>(inputs, what);
    check_encode_against_reference<Fmt, round::up, Overflow>(inputs, what);
    check_encode_against_reference<Fmt, round::down, Overflow>(inputs, what);
}

template <class Fmt>
void check_all_modes(const std::vector<float>& inputs, const char* what) {
    check_all_deterministic_modes<Fmt, overflow::saturate>(inputs, what);
    if constexpr (Fmt::has_nan || Fmt::has_inf)
        check_all_deterministic_modes<Fmt, overflow::to_nonfinite>(inputs, what);
}

std::vector<float> all_bf16_and_fp16() {
    std::vector<float> v;
    v.reserve(1u << 17);
    for (std::uint32_t b = 0; b < 65536; ++b) {
        v.push_back(to_float(bf16{static_cast<std::uint16_t>(b)}));
        v.push_back(to_float(fp16{static_cast<std::uint16_t>(b)}));
    }
    return v;
}

}  // namespace

#define OCTET_ALL_FORMATS e4m3, e5m2, e4m3fnuz, e5m2fnuz, e2m1, e2m3, e3m2, ue8m0, e3m4, e4m3_b11, ue4m4, e3m0

TEST_CASE("format traits are the documented constants") {
    CHECK(e4m3::max_finite == 448.0f);
    CHECK(e4m3::min_normal == std::ldexp(1.0f, -6));
    CHECK(e4m3::min_subnormal == std::ldexp(1.0f, -9));
    CHECK(!e4m3::has_inf);
    CHECK(e4m3::nan_code == 0x7Fu);
    CHECK(e5m2::max_finite == 57344.0f);
    CHECK(e5m2::min_normal == std::ldexp(1.0f, -14));
    CHECK(e5m2::min_subnormal == std::ldexp(1.0f, -16));
    CHECK(e5m2::has_inf);
    CHECK(e5m2::inf_code == 0x7Cu);
    CHECK(e4m3fnuz::max_finite == 240.0f);
    CHECK(e4m3fnuz::min_subnormal == std::ldexp(1.0f, -10));
    CHECK(e4m3fnuz::nan_code == 0x80u);
    CHECK(!e4m3fnuz::has_negative_zero);
    CHECK(e5m2fnuz::max_finite == 57344.0f);
    CHECK(e5m2fnuz::min_subnormal == std::ldexp(1.0f, -17));
    CHECK(e2m1::max_finite == 6.0f);
    CHECK(e2m1::min_subnormal == 0.5f);
    CHECK(e2m1::bits == 4);
    CHECK(!e2m1::has_nan);
    CHECK(e2m3::max_finite == 7.5f);
    CHECK(e2m3::min_subnormal == 0.125f);
    CHECK(e3m2::max_finite == 28.0f);
    CHECK(e3m2::min_subnormal == 0.0625f);
    CHECK(e2m3::bits == 6);
    CHECK(ue8m0::max_finite == std::ldexp(1.0f, 127));
    CHECK(ue8m0::min_normal == std::ldexp(1.0f, -127));
    CHECK(!ue8m0::is_signed);
    CHECK(!ue8m0::has_zero);
    CHECK(ue8m0::nan_code == 0xFFu);
    CHECK(e3m4::max_finite == 15.5f);
    CHECK(e3m4::has_inf);
    CHECK(e4m3_b11::max_finite == 28.0f);
}

TEST_CASE_TEMPLATE("decode matches the field definition for every code", Fmt, OCTET_ALL_FORMATS) {
    for (std::uint32_t c = 0; c < (1u << Fmt::bits); ++c) {
        const auto r = octet_test::reference_decode<Fmt>(c);
        const float got = decode<Fmt>(static_cast<std::uint8_t>(c));
        INFO("code 0x" << std::hex << c);
        switch (r.kind) {
            case ref_kind::nan:
                CHECK(float_to_bits(got) == 0x7FFFFFFFu);
                CHECK(is_nan_code<Fmt>(static_cast<std::uint8_t>(c)));
                break;
            case ref_kind::pos_inf:
                CHECK(got == INFINITY);
                CHECK(is_inf_code<Fmt>(static_cast<std::uint8_t>(c)));
                break;
            case ref_kind::neg_inf:
                CHECK(got == -INFINITY);
                break;
            case ref_kind::finite:
                CHECK(static_cast<double>(got) == r.value);
                CHECK(std::signbit(got) == std::signbit(r.value));
                CHECK(!is_nan_code<Fmt>(static_cast<std::uint8_t>(c)));
                break;
        }
    }
}

TEST_CASE_TEMPLATE("encode(decode(c)) == c for every finite code", Fmt, OCTET_ALL_FORMATS) {
    for (std::uint32_t c = 0; c < (1u << Fmt::bits); ++c) {
        const auto r = octet_test::reference_decode<Fmt>(c);
        if (r.kind != ref_kind::finite) continue;
        const float v = decode<Fmt>(static_cast<std::uint8_t>(c));
        INFO("code 0x" << std::hex << c);
        CHECK(encode<Fmt>(v) == c);
        CHECK(encode<Fmt, round::toward_zero>(v) == c);
        CHECK(encode<Fmt, round::up>(v) == c);
        CHECK(encode<Fmt, round::down>(v) == c);
        CHECK(encode<Fmt, round::stochastic>(v, 0xFFFFFFFFu) == c);
    }
}

TEST_CASE_TEMPLATE("encode matches the float64 oracle on dense points, all roundings and overflows", Fmt,
                   OCTET_ALL_FORMATS) {
    auto g = octet_test::rng(1);
    check_all_modes<Fmt>(dense_points<Fmt>(g), "dense");
}

TEST_CASE_TEMPLATE("encode matches the float64 oracle on every bf16 and fp16 value", Fmt, OCTET_ALL_FORMATS) {
    check_all_modes<Fmt>(all_bf16_and_fp16(), "bf16/fp16");
}

TEST_CASE_TEMPLATE("encode matches the float64 oracle on fresh random floats", Fmt, OCTET_ALL_FORMATS) {
    auto g = octet_test::rng(2);
    std::uniform_int_distribution<std::uint32_t> bits;
    std::vector<float> in(1 << 15);
    for (auto& x : in) x = bits_to_float(bits(g));  // uniform over bit patterns: every binade, Inf, NaN
    auto near = octet_test::log_uniform(g, 1 << 15, Fmt::emin - Fmt::mantissa_bits - 4.0f, Fmt::emax + 3.0f);
    in.insert(in.end(), near.begin(), near.end());
    check_all_modes<Fmt>(in, "random");
}

TEST_CASE("bf16 and fp16 inputs round once, like their exact float value") {
    auto g = octet_test::rng(3);
    std::uniform_int_distribution<std::uint32_t> bits(0, 0xFFFF);
    for (int i = 0; i < 20000; ++i) {
        const bf16 b{static_cast<std::uint16_t>(bits(g))};
        const fp16 h{static_cast<std::uint16_t>(bits(g))};
        CHECK(encode<e4m3>(b) == encode<e4m3>(to_float(b)));
        CHECK(encode<e5m2, round::toward_zero>(h) == encode<e5m2, round::toward_zero>(to_float(h)));
        CHECK(encode<e2m1, round::stochastic>(b, 12345u) == encode<e2m1, round::stochastic>(to_float(b), 12345u));
    }
}

TEST_CASE("bf16 and fp16 storage conversions against double rounding") {
    // fp16 -> float is exact: compare with the field definition.
    for (std::uint32_t b = 0; b < 65536; ++b) {
        const fp16 h{static_cast<std::uint16_t>(b)};
        const float f = to_float(h);
        const std::uint32_t e = (b >> 10) & 31, m = b & 1023;
        if (e == 31) {
            CHECK((m == 0 ? std::isinf(f) : std::isnan(f)));
            continue;
        }
        const double mag =
            e == 0 ? std::ldexp(static_cast<double>(m), -24) : std::ldexp(1.0 + m / 1024.0, static_cast<int>(e) - 15);
        CHECK(static_cast<double>(f) == ((b & 0x8000u) ? -mag : mag));
        CHECK(to_fp16(f).bits == b);  // round trip
    }
    // float -> fp16/bf16 is round-to-nearest-even: compare with the encode of an IEEE-like custom format.
    auto g = octet_test::rng(4);
    std::uniform_int_distribution<std::uint32_t> bits;
    for (int i = 0; i < 200000; ++i) {
        const float x = bits_to_float(bits(g));
        if (std::isnan(x)) {
            CHECK(std::isnan(to_float(to_fp16(x))));
            CHECK(std::isnan(to_float(to_bf16(x))));
            continue;
        }
        // bf16 RNE: the nearest of the two bf16 neighbours by float64 distance, ties to even
        const std::uint32_t u = float_to_bits(x);
        const float lo = bits_to_float(u & 0xFFFF0000u), hi = bits_to_float((u & 0xFFFF0000u) + 0x10000u);
        // beyond the largest bf16 the upper neighbour is 2^128 of an unbounded exponent (it rounds to Inf)
        const double hi_d =
            std::isinf(hi) ? std::copysign(std::ldexp(1.0, 128), static_cast<double>(x)) : static_cast<double>(hi);
        const double dl = std::fabs(static_cast<double>(x) - lo), dh = std::fabs(hi_d - x);
        const float expected = dl < dh ? lo : dh < dl ? hi : (((u >> 16) & 1u) ? hi : lo);
        CHECK(float_to_bits(to_float(to_bf16(x))) == float_to_bits(expected));
        // fp16 RNE via nearest double rounding check: |to_fp16(x) - x| is minimal among neighbours
        const float h = to_float(to_fp16(x));
        if (std::fabs(x) < 65504.0f) {
            const float up = to_float(fp16{static_cast<std::uint16_t>(to_fp16(x).bits + 1)});
            const float dn = to_float(fp16{static_cast<std::uint16_t>(to_fp16(x).bits - 1)});
            const double dh2 = std::fabs(static_cast<double>(h) - x);
            if (std::isfinite(up)) CHECK(dh2 <= std::fabs(static_cast<double>(up) - x));
            if (std::isfinite(dn) && (to_fp16(x).bits & 0x7FFFu) != 0)
                CHECK(dh2 <= std::fabs(static_cast<double>(dn) - x));
        }
    }
}

TEST_CASE("edge contract: zeros, NaN, Inf, the largest finite value, unsigned inputs") {
    CHECK(encode<e4m3>(0.0f) == 0x00);
    CHECK(encode<e4m3>(-0.0f) == 0x80);
    CHECK(encode<e4m3fnuz>(-0.0f) == 0x00);
    CHECK(encode<e4m3fnuz>(-1e-30f) == 0x00);  // fnuz has no -0: tiny negatives give +0
    CHECK(encode<e4m3>(NAN) == 0x7F);
    CHECK(encode<e4m3>(-NAN) == 0x7F);
    CHECK(encode<e5m2>(NAN) == 0x7F);
    CHECK(encode<e4m3fnuz>(NAN) == 0x80);
    CHECK(encode<e2m1>(NAN) == 0x07);  // no NaN in FP4: +max
    CHECK(encode<e4m3>(INFINITY) == 0x7E);
    CHECK(encode<e4m3>(-INFINITY) == 0xFE);
    CHECK((encode<e4m3, round::nearest_even, overflow::to_nonfinite>(-INFINITY)) == 0xFF);
    CHECK((encode<e5m2, round::nearest_even, overflow::to_nonfinite>(INFINITY)) == 0x7C);
    CHECK((encode<e5m2, round::toward_zero, overflow::to_nonfinite>(1e30f)) == 0x7B);  // IEEE: RZ overflow -> max
    CHECK((encode<e5m2, round::toward_zero, overflow::to_nonfinite>(INFINITY)) == 0x7C);
    CHECK((encode<e5m2, round::up, overflow::to_nonfinite>(-1e30f)) == 0xFB);
    CHECK((encode<e5m2, round::down, overflow::to_nonfinite>(-1e30f)) == 0xFC);
    CHECK(encode<e4m3>(464.0f) == 0x7E);  // the tie between 448 and 480 goes to the even 448
    CHECK((encode<e4m3, round::nearest_even, overflow::to_nonfinite>(464.0f)) == 0x7E);
    CHECK((encode<e4m3, round::nearest_even, overflow::to_nonfinite>(std::nextafter(464.0f, 1000.0f))) == 0x7F);
    CHECK((encode<e5m2, round::nearest_even, overflow::to_nonfinite>(61440.0f)) == 0x7C);  // tie to the even 65536
    CHECK((encode<e5m2, round::nearest_even, overflow::to_nonfinite>(std::nextafter(61440.0f, 0.0f))) == 0x7B);
    CHECK(encode<ue8m0, round::toward_zero>(-3.0f) == encode<ue8m0, round::toward_zero>(3.0f));  // magnitude
    CHECK(encode<ue8m0, round::toward_zero>(0.0f) == 0x00);
    CHECK(encode<ue8m0, round::up>(0.0f) == 0x00);
    CHECK(encode<ue8m0, round::up>(std::ldexp(1.0f, -127)) == 0x00);
    CHECK(encode<ue8m0, round::up>(std::ldexp(1.25f, -127)) == 0x01);
    CHECK(encode<ue8m0, round::up>(std::ldexp(1.25f, 127)) == 0xFE);
    CHECK((encode<ue8m0, round::up, overflow::to_nonfinite>(std::ldexp(1.25f, 127))) == 0xFF);
    CHECK(encode<ue8m0>(std::ldexp(1.5f, 3)) == 130);  // tie to the even code (2^3 -> 130)
    CHECK(encode<ue8m0>(std::ldexp(1.5f, 4)) == 132);  // tie to the even code (2^5 -> 132)
    CHECK(encode<ue8m0>(NAN) == 0xFF);
    CHECK(decode<ue8m0>(0) == std::ldexp(1.0f, -127));
    CHECK(std::isnan(decode<ue8m0>(0xFF)));
}

TEST_CASE("stochastic rounding picks a neighbour exactly as the contract says") {
    auto g = octet_test::rng(5);
    std::uniform_int_distribution<std::uint32_t> bits;
    auto check = [&](auto fmt_tag) {
        using Fmt = decltype(fmt_tag);
        const auto pts = dense_points<Fmt>(g);
        std::size_t bad = 0;
        for (float x : pts)
            for (int k = 0; k < 4; ++k) {
                const std::uint32_t r = bits(g);
                const auto expected = octet_test::reference_encode<Fmt, round::stochastic, overflow::saturate>(x, r);
                if (encode<Fmt, round::stochastic>(x, r) != expected) ++bad;
            }
        CHECK_MESSAGE(bad == 0, format_name<Fmt>() << ": " << bad << " mismatches");
    };
    check(e4m3{});
    check(e5m2{});
    check(e4m3fnuz{});
    check(e2m1{});
    check(e2m3{});
    check(e3m2{});
    check(ue8m0{});
    check(e3m4{});
}

TEST_CASE("stochastic rounding is unbiased: the mean over random bits equals the input") {
    // For each x between neighbours lo < hi, the result is lo or hi, and over N draws the mean
    // of the decoded results estimates x with standard error (hi - lo) * sqrt(p (1 - p) / N).
    // Tolerance: 5 standard errors (a false alarm about once in 3.5 million checks).
    const philox_stream rng{octet_test::run_seed(), 7};
    const int n = 1 << 17;
    std::uint64_t draw = 0;
    auto check = [&](auto fmt_tag, float x) {
        using Fmt = decltype(fmt_tag);
        const auto nb = octet_test::reference_neighbours<Fmt>(std::fabs(static_cast<double>(x)));
        double sum = 0;
        std::set<std::uint8_t> seen;
        for (int i = 0; i < n; ++i) {
            const std::uint8_t c = encode<Fmt, round::stochastic>(x, rng.bits(draw++));
            seen.insert(c);
            sum += decode<Fmt>(c);
        }
        const double gap = nb.hi_value - nb.lo_value;
        const double p = (std::fabs(x) - nb.lo_value) / gap;
        const double se = gap * std::sqrt(p * (1 - p) / n);
        INFO(format_name<Fmt>() << " x=" << x << " mean=" << sum / n << " se=" << se);
        CHECK(seen.size() <= 2);
        CHECK(std::fabs(sum / n - x) <= 5 * se + 1e-12 * std::fabs(x));
    };
    for (float x : {1.03f, -1.03f, 0.3f, 100.1f, 0.0013f, -0.0031f, 447.0f, 3.3f}) check(e4m3{}, x);
    for (float x : {1.03f, 2.5e-6f, -7000.0f}) check(e5m2{}, x);
    for (float x : {0.7f, -2.6f, 5.1f, 0.1f}) check(e2m1{}, x);
    for (float x : {0.01f, -6.9f}) check(e2m3{}, x);
    for (float x : {3.3f, 1e-20f}) check(ue8m0{}, x);
}

TEST_CASE("Philox4x32-10 known-answer vectors (Random123 kat_vectors)") {
    const philox4 a = philox4x32_10(philox4{{0, 0, 0, 0}}, 0, 0);
    CHECK(a.v[0] == 0x6627e8d5u);
    CHECK(a.v[1] == 0xe169c58du);
    CHECK(a.v[2] == 0xbc57ac4cu);
    CHECK(a.v[3] == 0x9b00dbd8u);
    const philox4 b =
        philox4x32_10(philox4{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
    CHECK(b.v[0] == 0x408f276du);
    CHECK(b.v[1] == 0x41c83b0eu);
    CHECK(b.v[2] == 0xa20bc7c6u);
    CHECK(b.v[3] == 0x6d5451fdu);
    const philox4 c =
        philox4x32_10(philox4{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
    CHECK(c.v[0] == 0xd16cfe09u);
    CHECK(c.v[1] == 0x94fdccebu);
    CHECK(c.v[2] == 0x5001e420u);
    CHECK(c.v[3] == 0x24126ea1u);
    // bits(i) is the (i % 4)-th word of block i / 4
    const philox_stream s{0x0123456789abcdefull, 42};
    CHECK(s.bits(9) == s.block(2).v[1]);
    double mean = 0;
    for (int i = 0; i < 100000; ++i) mean += s.uniform(static_cast<std::uint64_t>(i));
    CHECK(std::fabs(mean / 100000 - 0.5) < 5 * std::sqrt(1.0 / 12 / 100000));
}

TEST_CASE("encode_array and decode_array on the host: any thread count gives the same bits") {
    auto g = octet_test::rng(6);
    auto x = octet_test::with_edge_cases(g, 300001, 100.0f, true);
    std::vector<std::uint8_t> one(x.size()), many(x.size()), scalar(x.size());
    const philox_stream rng{octet_test::run_seed(), 3};
    encode_array<e4m3, round::stochastic>(on_host(1), as_cspan(x), as_span(one), rng);
    encode_array<e4m3, round::stochastic>(on_host(7), as_cspan(x), as_span(many), rng);
    for (std::size_t i = 0; i < x.size(); ++i) scalar[i] = encode<e4m3, round::stochastic>(x[i], rng.bits(i));
    CHECK(one == many);
    CHECK(one == scalar);
    std::vector<float> back(x.size());
    decode_array<e4m3>(on_host(), as_cspan(one), as_span(back));
    for (std::size_t i = 0; i < x.size(); i += 997)
        CHECK(float_to_bits(back[i]) == float_to_bits(decode<e4m3>(one[i])));

    std::vector<std::uint8_t> short_out(10);
    CHECK_THROWS_AS(encode_array<e4m3>(on_host(), as_cspan(x), as_span(short_out)), octet::error);
    CHECK_THROWS_WITH_AS(encode_array<e4m3>(on_host(), as_cspan(x), as_span(short_out)),
                         doctest::Contains("argument 'out'"), octet::error);
}

TEST_CASE("bf16 stochastic rounding: a neighbour, unbiased, and keeps updates below half an ulp") {
    const philox_stream rng{octet_test::run_seed(), 11};
    const int n = 1 << 16;
    for (float x : {1.001f, -3.14159f, 1e-30f, 65000.3f}) {
        const float lo = to_float(bf16{static_cast<std::uint16_t>(float_to_bits(x) >> 16)});
        const float hi = to_float(bf16{static_cast<std::uint16_t>((float_to_bits(x) >> 16) + 1)});
        double sum = 0;
        for (int i = 0; i < n; ++i) {
            const float r = to_float(to_bf16_stochastic(x, rng.bits(static_cast<std::uint64_t>(i))));
            CHECK((r == lo || r == hi));
            sum += r;
        }
        const double p = (static_cast<double>(x) - lo) / (static_cast<double>(hi) - lo);
        const double se = std::fabs(static_cast<double>(hi) - lo) * std::sqrt(p * (1 - p) / n);
        CHECK(std::fabs(sum / n - x) <= 5 * se + 1e-12);
    }
    CHECK(std::isnan(to_float(to_bf16_stochastic(NAN, 123u))));
    CHECK(to_float(to_bf16_stochastic(-INFINITY, 0xFFFFu)) == -INFINITY);
    CHECK(to_float(to_bf16_stochastic(2.0f, 0xFFFFu)) == 2.0f);  // exact values never move
}
