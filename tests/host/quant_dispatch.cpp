// The quantizer's host kernels compiled for each instruction set (core/isa_dispatch.hpp) against
// the scalar rules of scale.hpp, bit for bit, on every variant this CPU runs: the element loop
// (encode_scaled) under scales that include 0, tiny, huge and NaN ones; the block scale loop
// (make_block_scale, every scale rule and storage, NaN blocks, the amax override); the amax loop
// with NaN-propagating and per-element recipes, ragged blocks and chunk tails; dequantize's loop
// into float, bf16 and fp16. Then the dispatched front doors (quantize, dequantize) against the
// scalar composition of the same rules; quant_recipes.cpp checks them against the float64
// reference.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "octet/format/convert.hpp"
#include "octet/quant/quantize.hpp"
#include "support/isa.hpp"
#include "support/random.hpp"

namespace quant_dispatch_test {
using namespace octet;
using detail::simd_isa;

using octet_test::hex;
using octet_test::isa_name;
using octet_test::runnable_isas;

template <class In>
std::uint32_t bits_of(In x) {
    if constexpr (std::is_same_v<In, float>)
        return float_to_bits(x);
    else
        return x.bits;
}

template <class T>
float to_float_any(T x) {
    if constexpr (std::is_same_v<T, float>)
        return x;
    else
        return to_float(x);
}

template <class In>
std::vector<In> inputs(std::mt19937_64& g, std::size_t n) {
    auto f = octet_test::with_edge_cases(g, n, 20.0f, true);
    std::uniform_int_distribution<std::uint32_t> bits;
    for (std::size_t i = 0; i < n; i += 7) f[i] = bits_to_float(bits(g));  // every exponent, NaN payloads
    std::vector<In> v(n);
    for (std::size_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<In, float>)
            v[i] = f[i];
        else if constexpr (std::is_same_v<In, bf16>)
            v[i] = bf16{static_cast<std::uint16_t>(float_to_bits(f[i]) >> 16)};
        else
            v[i] = to_fp16(f[i]);
    }
    return v;
}

/// Scales as the quantizer makes them, plus the edge values: 0 (an underflowed E4M3 scale),
/// 2^-126, 2^127, NaN (a NaN block under nan_policy::propagate), subnormal and odd values.
std::vector<float> scales(std::mt19937_64& g, std::size_t n) {
    std::uniform_int_distribution<int> e(-126, 127), pick(0, 15);
    std::uniform_real_distribution<float> m(1.0f, 2.0f);
    std::vector<float> s(n);
    for (auto& v : s) {
        const int p = pick(g);
        v = p == 0   ? 0.0f
            : p == 1 ? FLT_MIN
            : p == 2 ? std::ldexp(1.0f, 127)
            : p == 3 ? NAN
            : p == 4 ? FLT_TRUE_MIN * 5
                     : std::ldexp(m(g), e(g));
    }
    return s;
}

template <class Recipe, class In>
void check_encode_scaled(simd_isa isa, std::uint64_t salt) {
    auto g = octet_test::rng(salt);
    for (std::size_t n : {std::size_t{4099}, std::size_t{256}, std::size_t{1}, std::size_t{300}}) {
        const auto x = inputs<In>(g, n);
        const auto S = scales(g, n);
        std::vector<std::uint8_t> got(n + 1, 0xEE);
        detail::run_kernel<detail::encode_scaled_kernel<Recipe, In>>(isa, x.data(), S.data(), got.data(), n);
        std::size_t bad = 0;
        for (std::size_t j = 0; j < n; ++j) {
            const std::uint8_t want = encode_scaled<Recipe>(detail::as_float(x[j]), S[j]);
            if (got[j] != want && bad++ < 3)
                FAIL_CHECK((std::string(format_name<typename Recipe::format>()) + " " + isa_name(isa) + " x bits " +
                            hex(bits_of(x[j])) + " S bits " + hex(float_to_bits(S[j])) + " got " + hex(got[j]) +
                            " expected " + hex(want)));
        }
        CHECK(bad == 0);
        CHECK(got[n] == 0xEE);  // nothing past the end
    }
}

/// The kernel's per-element rule: block_abs of the recipe, finite_abs for the tensor amax (void).
template <class Recipe>
float abs_rule(float x) {
    if constexpr (std::is_void_v<Recipe>)
        return finite_abs(x);
    else
        return block_abs<Recipe>(x);
}

template <class Recipe, class In>
void check_block_amax(simd_isa isa, std::uint64_t salt) {
    auto g = octet_test::rng(salt);
    std::uniform_real_distribution<float> start(0.0f, 30.0f);
    for (std::size_t cols : {std::size_t{2048}, std::size_t{1000}, std::size_t{37}, std::size_t{256}})
        for (std::size_t C : {std::size_t{16}, std::size_t{32}, std::size_t{128}, std::size_t{100}, cols}) {
            const auto x = inputs<In>(g, cols);
            const std::size_t blocks = (cols + C - 1) / C;
            std::vector<float> a(blocks + 1);
            for (auto& v : a) v = start(g) < 10.0f ? 0.0f : start(g);  // earlier rows of the band
            std::vector<float> want = a;
            for (std::size_t j = 0; j < cols; ++j) {
                want[j / C] = amax_max(want[j / C], abs_rule<Recipe>(detail::as_float(x[j])));
            }
            detail::run_kernel<detail::row_block_amax_kernel<Recipe, In>>(isa, x.data(), cols, C, a.data());
            std::size_t bad = 0;
            for (std::size_t k = 0; k <= blocks; ++k) bad += float_to_bits(a[k]) != float_to_bits(want[k]);
            CHECK_MESSAGE(bad == 0,
                          (std::string(isa_name(isa)) + " cols " + std::to_string(cols) + " C " + std::to_string(C)));
        }
}

template <class Recipe>
void check_block_scales(simd_isa isa, std::uint64_t salt) {
    auto g = octet_test::rng(salt);
    std::uniform_int_distribution<int> e(-149, 127), pick(0, 9);
    std::uniform_real_distribution<float> m(1.0f, 2.0f);
    for (std::size_t n : {std::size_t{1000}, std::size_t{256}, std::size_t{3}})
        for (float override_amax : {-1.0f, 0.0f, 37.5f}) {
            std::vector<float> amax(n);
            for (auto& a : amax) {
                const int p = pick(g);  // 0, NaN (a NaN block), the largest float, or 2^e * [1, 2)
                a = p == 0 ? 0.0f : p == 1 ? bits_to_float(0x7FFFFFFFu) : p == 2 ? FLT_MAX : std::ldexp(m(g), e(g));
            }
            const float tensor_scale = std::ldexp(m(g), e(g) / 2);
            std::vector<float> value(n + 1, -3.0f);
            std::vector<std::uint32_t> stored(n + 1, 0xEEEEEEEEu);
            detail::run_kernel<detail::block_scale_kernel<Recipe>>(isa, static_cast<const float*>(amax.data()),
                                                                   override_amax, tensor_scale, value.data(),
                                                                   stored.data(), n);
            std::size_t bad = 0;
            for (std::size_t k = 0; k < n; ++k) {
                const float a = override_amax >= 0.0f && amax[k] == amax[k] ? override_amax : amax[k];
                const block_scale want = make_block_scale<Recipe>(a, tensor_scale);
                bad += float_to_bits(value[k]) != float_to_bits(want.value) || stored[k] != want.stored;
            }
            CHECK_MESSAGE(bad == 0, (std::string(isa_name(isa)) + " n " + std::to_string(n)));
            CHECK((value[n] == -3.0f && stored[n] == 0xEEEEEEEEu));
        }
}

template <class Fmt, class Out>
void check_dequantize(simd_isa isa, std::uint64_t salt) {
    auto g = octet_test::rng(salt);
    constexpr std::size_t chunk = detail::kernel_chunk;
    for (std::size_t n : {chunk, std::size_t{1}, std::size_t{77}}) {
        std::uniform_int_distribution<unsigned> code(0, 255);
        std::vector<std::uint8_t> c(chunk);
        for (std::size_t j = 0; j < chunk; ++j)
            c[j] = static_cast<std::uint8_t>((j < n && j < 256 ? j : code(g)) & Fmt::code_mask);
        const auto S = scales(g, chunk);
        std::vector<Out> got(n + 1);
        std::memset(got.data(), 0xEE, got.size() * sizeof(Out));
        detail::run_kernel<detail::dequantize_kernel<Fmt, Out>>(isa, static_cast<const std::uint8_t*>(c.data()),
                                                                S.data(), got.data(), n);
        std::size_t bad = 0;
        for (std::size_t j = 0; j < n; ++j) {
            const float v = decode<Fmt>(c[j]) * S[j];
            std::uint32_t want;
            if constexpr (std::is_same_v<Out, float>)
                want = float_to_bits(v);
            else if constexpr (std::is_same_v<Out, bf16>)
                want = to_bf16(v).bits;
            else
                want = to_fp16(v).bits;
            // NaN code times NaN scale: IEEE leaves the payload open, and compilers order the
            // operands of a product freely (scalar code too); the result must be a NaN.
            const bool both_nan = decode<Fmt>(c[j]) != decode<Fmt>(c[j]) && S[j] != S[j];
            if (both_nan && is_nan_bits(float_to_bits(to_float_any(got[j])))) continue;
            if (bits_of(got[j]) != want && bad++ < 3)
                FAIL_CHECK((std::string(format_name<Fmt>()) + " " + isa_name(isa) + " code " + hex(c[j]) + " S bits " +
                            hex(float_to_bits(S[j])) + " got " + hex(bits_of(got[j])) + " expected " + hex(want)));
        }
        CHECK_MESSAGE(bad == 0, (std::string(format_name<Fmt>()) + " " + isa_name(isa) + " n " + std::to_string(n)));
        Out past;
        std::memset(&past, 0xEE, sizeof past);
        CHECK(bits_of(got[n]) == bits_of(past));
    }
}

using mxfp8_per_element = recipe<e4m3, block<1, 32>, scale::pow2_floor, scale_storage::ue8m0, round::nearest_even,
                                 overflow::saturate, nan_policy::per_element>;
using e5m2_to_nonfinite =
    recipe<e5m2, block<1, 128>, scale::amax_ratio<0>, scale_storage::f32, round::nearest_even, overflow::to_nonfinite>;

/// quantize and dequantize through the front doors (the best variant) against the scalar rules
/// applied to the scales they stored.
template <class Recipe, class In>
void check_front_doors(std::size_t rows, std::size_t cols, std::uint64_t salt) {
    auto g = octet_test::rng(salt);
    const auto x = inputs<In>(g, rows * cols);
    quantized_tensor<Recipe> q(rows, cols);
    quantize<Recipe>(on_host(2), matrix_ref<const In>(x.data(), rows, cols), q.ref());
    const auto c = q.cref();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) {
            const float S = c.scale(i / c.layout.block_rows, j / c.layout.block_cols);
            bad += c.code(i, j) != encode_scaled<Recipe>(detail::as_float(x[i * cols + j]), S);
        }
    CHECK_MESSAGE(bad == 0, (std::string(format_name<typename Recipe::format>()) + " quantize " + std::to_string(rows) +
                             " x " + std::to_string(cols)));
    std::vector<float> y(rows * cols, -1.0f);
    dequantize(on_host(2), c, matrix_ref<float>(y.data(), rows, cols));
    std::vector<bf16> yb(rows * cols);
    dequantize(on_host(1), c, matrix_ref<bf16>(yb.data(), rows, cols));
    bad = 0;
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) {
            const float v = c.value(i, j);
            bad += float_to_bits(y[i * cols + j]) != float_to_bits(v);
            bad += yb[i * cols + j].bits != to_bf16(v).bits;
        }
    CHECK_MESSAGE(bad == 0, (std::string(format_name<typename Recipe::format>()) + " dequantize " +
                             std::to_string(rows) + " x " + std::to_string(cols)));
}

}  // namespace quant_dispatch_test

using namespace quant_dispatch_test;

TEST_CASE("encode_scaled kernel: every variant gives the scalar bits") {
    for (simd_isa isa : runnable_isas()) {
        check_encode_scaled<recipes::blockwise_1x128, float>(isa, 1);
        check_encode_scaled<recipes::blockwise_1x128, bf16>(isa, 2);
        check_encode_scaled<recipes::mxfp8_e4m3, fp16>(isa, 3);
        check_encode_scaled<recipes::mxfp8_e5m2, bf16>(isa, 4);
        check_encode_scaled<recipes::mxfp6_e2m3, float>(isa, 5);
        check_encode_scaled<recipes::mxfp6_e3m2, bf16>(isa, 6);
        check_encode_scaled<recipes::nvfp4, bf16>(isa, 7);
        check_encode_scaled<recipes::mxfp4, float>(isa, 8);
        check_encode_scaled<mxfp8_per_element, float>(isa, 9);
        check_encode_scaled<e5m2_to_nonfinite, float>(isa, 10);
    }
}

TEST_CASE("row amax kernel: every variant gives the scalar bits") {
    for (simd_isa isa : runnable_isas()) {
        check_block_amax<recipes::blockwise_1x128, bf16>(isa, 11);
        check_block_amax<recipes::mxfp8_e4m3, float>(isa, 12);
        check_block_amax<mxfp8_per_element, float>(isa, 13);
        check_block_amax<mxfp8_per_element, bf16>(isa, 14);
        check_block_amax<void, fp16>(isa, 15);
        check_block_amax<void, float>(isa, 16);
    }
}

using mxfp8_ceil_per_element = recipe<e4m3, block<1, 32>, scale::pow2_ceil, scale_storage::ue8m0, round::nearest_even,
                                      overflow::saturate, nan_policy::per_element>;
using nvfp4_per_element = recipe<e2m1, block<1, 16>, scale::amax_ratio<0>, scale_storage::e4m3, round::nearest_even,
                                 overflow::saturate, nan_policy::per_element>;
using amax_ratio_per_element = recipe<e4m3, block<1, 128>, scale::amax_ratio<1>, scale_storage::f32,
                                      round::nearest_even, overflow::saturate, nan_policy::per_element>;

TEST_CASE("block scale kernel: every variant gives the scalar bits") {
    for (simd_isa isa : runnable_isas()) {
        check_block_scales<recipes::blockwise_1x128>(isa, 41);
        check_block_scales<recipes::mxfp8_e4m3>(isa, 42);
        check_block_scales<recipes::mxfp8_e4m3_ceil>(isa, 43);
        check_block_scales<recipes::mxfp4>(isa, 44);
        check_block_scales<recipes::nvfp4>(isa, 45);
        check_block_scales<mxfp8_per_element>(isa, 46);
        check_block_scales<mxfp8_ceil_per_element>(isa, 47);
        check_block_scales<nvfp4_per_element>(isa, 48);
        check_block_scales<amax_ratio_per_element>(isa, 49);
        check_block_scales<recipe<e4m3, block<1, 32>, scale::pow2_nearest, scale_storage::f32>>(isa, 50);
    }
}

TEST_CASE("dequantize kernel: every variant gives the scalar bits") {
    for (simd_isa isa : runnable_isas()) {
        check_dequantize<e4m3, float>(isa, 21);
        check_dequantize<e4m3, bf16>(isa, 22);
        check_dequantize<e5m2, fp16>(isa, 23);
        check_dequantize<e2m1, float>(isa, 24);
        check_dequantize<e2m1, bf16>(isa, 25);
        check_dequantize<e3m2, float>(isa, 26);
    }
}

TEST_CASE("quantize and dequantize front doors against the scalar rules") {
    check_front_doors<recipes::blockwise_1x128, bf16>(67, 1000, 31);
    check_front_doors<recipes::mxfp8_e4m3, float>(33, 517, 32);
    check_front_doors<recipes::nvfp4, bf16>(40, 333, 33);
    check_front_doors<recipes::mxfp6_e2m3, fp16>(9, 260, 34);
    check_front_doors<recipes::blockwise_128x128, float>(200, 300, 35);
    check_front_doors<recipes::tensorwise_e4m3, bf16>(17, 999, 36);
    check_front_doors<mxfp8_per_element, float>(21, 290, 37);
}

TEST_CASE("encode_array and decode_array from a second translation unit") {
    // format_dispatch.cpp instantiates the same kernels and dispatch functions: linked into one
    // program with it, this file checks that the inline target-attributed copies link and agree.
    std::vector<float> x(1000);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.37f - 150.0f;
    std::vector<std::uint8_t> c(x.size());
    std::vector<float> y(x.size());
    encode_array<e4m3>(on_host(1), as_cspan(x), as_span(c));
    decode_array<e4m3>(on_host(1), as_cspan(c), as_span(y));
    std::size_t bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
        bad += c[i] != encode<e4m3>(x[i]) || float_to_bits(y[i]) != float_to_bits(decode<e4m3>(c[i]));
    CHECK(bad == 0);
}
