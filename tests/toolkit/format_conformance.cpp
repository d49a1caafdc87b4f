// octet-test: labels=slow timeout=900
//
// Exhaustive conformance with the CUDA toolkit's own host conversions (cuda_fp8.h, cuda_fp6.h,
// cuda_fp4.h): for every one of the 2^32 float bit patterns, octet::encode gives the same code as
// the toolkit for E4M3 and E5M2 (satfinite and no-saturation), E2M1, E2M3, E3M2 (nearest-even),
// and UE8M0 (toward zero and up, both saturation modes). decode matches for every code. The
// sweep runs on all hardware threads.
#include <doctest/doctest.h>

#include <cuda_fp4.h>
#include <cuda_fp6.h>
#include <cuda_fp8.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ios>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "octet/format/encode.hpp"
#include "octet/format/packed.hpp"

using namespace octet;

namespace {

struct mode_result {
    const char* name;
    std::atomic<std::uint64_t> mismatches{0};
    std::atomic<std::uint32_t> first_bad{0};
    std::atomic<bool> recorded{false};
};

enum mode : int {
    e4m3_sat,
    e4m3_nosat,
    e5m2_sat,
    e5m2_nosat,
    e2m1_rn,
    e2m3_rn,
    e3m2_rn,
    ue8m0_rz_sat,
    ue8m0_rz_nosat,
    ue8m0_ru_sat,
    ue8m0_ru_nosat,
    mode_count
};

const char* const mode_names[mode_count] = {
    "e4m3 satfinite", "e4m3 nosat",         "e5m2 satfinite", "e5m2 nosat",         "e2m1 nearest",  "e2m3 nearest",
    "e3m2 nearest",   "ue8m0 rz satfinite", "ue8m0 rz nosat", "ue8m0 ru satfinite", "ue8m0 ru nosat"};

using rn = round::nearest_even;
using rz = round::toward_zero;
using ru = round::up;
using sat = overflow::saturate;
using nosat = overflow::to_nonfinite;

// One mode over one batch: octet's codes in a loop the compiler vectorizes, the toolkit's in a
// scalar loop, then a comparison. Batching keeps each loop's branches predictable.
constexpr std::size_t kBatch = 4096;

template <class Ours, class Theirs>
void compare_batch(const float* x, std::uint32_t first_bits, Ours ours, Theirs theirs, int m, std::uint64_t* bad,
                   std::uint32_t* first) {
    std::uint8_t a[kBatch], b[kBatch];
    for (std::size_t i = 0; i < kBatch; ++i) a[i] = ours(x[i]);
    for (std::size_t i = 0; i < kBatch; ++i) b[i] = theirs(x[i]);
    for (std::size_t i = 0; i < kBatch; ++i)
        if (a[i] != b[i] && bad[m]++ == 0) first[m] = first_bits + static_cast<std::uint32_t>(i);
}

void sweep(std::uint64_t begin, std::uint64_t end, std::array<mode_result, mode_count>& results) {
    std::array<std::uint64_t, mode_count> bad{};
    std::array<std::uint32_t, mode_count> first{};
    float x[kBatch];
    for (std::uint64_t b = begin; b < end; b += kBatch) {
        const std::uint32_t u0 = static_cast<std::uint32_t>(b);
        for (std::size_t i = 0; i < kBatch; ++i) x[i] = bits_to_float(u0 + static_cast<std::uint32_t>(i));
        std::uint64_t* nb = bad.data();
        std::uint32_t* nf = first.data();
        compare_batch(
            x, u0, [](float v) { return encode<e4m3, rn, sat>(v); },
            [](float v) { return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); }, e4m3_sat, nb, nf);
        compare_batch(
            x, u0, [](float v) { return encode<e4m3, rn, nosat>(v); },
            [](float v) { return __nv_cvt_float_to_fp8(v, __NV_NOSAT, __NV_E4M3); }, e4m3_nosat, nb, nf);
        compare_batch(
            x, u0, [](float v) { return encode<e5m2, rn, sat>(v); },
            [](float v) { return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2); }, e5m2_sat, nb, nf);
        compare_batch(
            x, u0, [](float v) { return encode<e5m2, rn, nosat>(v); },
            [](float v) { return __nv_cvt_float_to_fp8(v, __NV_NOSAT, __NV_E5M2); }, e5m2_nosat, nb, nf);
        compare_batch(
            x, u0, [](float v) { return encode<e2m1, rn>(v); },
            [](float v) { return __nv_cvt_float_to_fp4(v, __NV_E2M1, cudaRoundNearest); }, e2m1_rn, nb, nf);
        compare_batch(
            x, u0, [](float v) { return encode<e2m3, rn>(v); },
            [](float v) { return __nv_cvt_float_to_fp6(v, __NV_E2M3, cudaRoundNearest); }, e2m3_rn, nb, nf);
        compare_batch(
            x, u0, [](float v) { return encode<e3m2, rn>(v); },
            [](float v) { return __nv_cvt_float_to_fp6(v, __NV_E3M2, cudaRoundNearest); }, e3m2_rn, nb, nf);
        compare_batch(
            x, u0, [](float v) { return encode<ue8m0, rz, sat>(v); },
            [](float v) { return __nv_cvt_float_to_e8m0(v, __NV_SATFINITE, cudaRoundZero); }, ue8m0_rz_sat, nb, nf);
        compare_batch(
            x, u0, [](float v) { return encode<ue8m0, rz, nosat>(v); },
            [](float v) { return __nv_cvt_float_to_e8m0(v, __NV_NOSAT, cudaRoundZero); }, ue8m0_rz_nosat, nb, nf);
        compare_batch(
            x, u0, [](float v) { return encode<ue8m0, ru, sat>(v); },
            [](float v) { return __nv_cvt_float_to_e8m0(v, __NV_SATFINITE, cudaRoundPosInf); }, ue8m0_ru_sat, nb, nf);
        compare_batch(
            x, u0, [](float v) { return encode<ue8m0, ru, nosat>(v); },
            [](float v) { return __nv_cvt_float_to_e8m0(v, __NV_NOSAT, cudaRoundPosInf); }, ue8m0_ru_nosat, nb, nf);
    }
    for (int m = 0; m < mode_count; ++m) {
        if (bad[m] == 0) continue;
        results[m].mismatches += bad[m];
        bool expected = false;
        if (results[m].recorded.compare_exchange_strong(expected, true)) results[m].first_bad = first[m];
    }
}

float toolkit_half_to_float(__half_raw h) {
    const __half hv(h);
    return __half2float(hv);
}

}  // namespace

TEST_CASE("encode is bit-identical to the CUDA toolkit for all 2^32 floats") {
    std::array<mode_result, mode_count> results;
    const auto t0 = std::chrono::steady_clock::now();
    const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    const std::uint64_t total = 1ull << 32;
    // Many more chunks than threads so that a slow chunk (specials, subnormals) does not idle the rest.
    const std::uint64_t chunk = 1ull << 24;
    std::atomic<std::uint64_t> next{0};
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&] {
            for (std::uint64_t b; (b = next.fetch_add(chunk)) < total;) sweep(b, b + chunk, results);
        });
    for (auto& th : pool) th.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("swept 2^32 floats x %d modes on %u threads in %.1f s\n", mode_count, threads, seconds);
    for (int m = 0; m < mode_count; ++m) {
        INFO(mode_names[m] << ": first mismatch at float bits 0x" << std::hex << results[m].first_bad.load());
        CHECK(results[m].mismatches.load() == 0);
    }
}

TEST_CASE("decode is identical to the CUDA toolkit for every code") {
    for (std::uint32_t c = 0; c < 256; ++c) {
        const auto code = static_cast<std::uint8_t>(c);
        INFO("code 0x" << std::hex << c);
        const float tk_e4m3 = toolkit_half_to_float(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3));
        const float tk_e5m2 = toolkit_half_to_float(__nv_cvt_fp8_to_halfraw(code, __NV_E5M2));
        // The toolkit's NaN is a half NaN widened; octet returns the canonical float NaN. Compare
        // NaN-ness for NaN codes and bits for the rest.
        if (std::isnan(tk_e4m3))
            CHECK(std::isnan(decode<e4m3>(code)));
        else
            CHECK(float_to_bits(decode<e4m3>(code)) == float_to_bits(tk_e4m3));
        if (std::isnan(tk_e5m2))
            CHECK(std::isnan(decode<e5m2>(code)));
        else
            CHECK(float_to_bits(decode<e5m2>(code)) == float_to_bits(tk_e5m2));

        const __nv_bfloat16_raw b = __nv_cvt_e8m0_to_bf16raw(code);
        const float tk_e8m0 = octet::to_float(octet::bf16{b.x});
        if (std::isnan(tk_e8m0))
            CHECK(std::isnan(decode<ue8m0>(code)));
        else
            CHECK(float_to_bits(decode<ue8m0>(code)) == float_to_bits(tk_e8m0));

        if (c < 64) {
            CHECK(float_to_bits(decode<e2m3>(code)) ==
                  float_to_bits(toolkit_half_to_float(__nv_cvt_fp6_to_halfraw(code, __NV_E2M3))));
            CHECK(float_to_bits(decode<e3m2>(code)) ==
                  float_to_bits(toolkit_half_to_float(__nv_cvt_fp6_to_halfraw(code, __NV_E3M2))));
        }
        if (c < 16)
            CHECK(float_to_bits(decode<e2m1>(code)) ==
                  float_to_bits(toolkit_half_to_float(__nv_cvt_fp4_to_halfraw(code, __NV_E2M1))));
    }
}

TEST_CASE("FP6/FP4 toward zero and the packed orders match the toolkit (every 61st float)") {
    std::uint64_t bad = 0;
    for (std::uint64_t i = 0; i < (1ull << 32); i += 61) {
        const float x = bits_to_float(static_cast<std::uint32_t>(i));
        bad += encode<e2m1, rz>(x) != __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundZero);
        bad += encode<e2m3, rz>(x) != __nv_cvt_float_to_fp6(x, __NV_E2M3, cudaRoundZero);
        bad += encode<e3m2, rz>(x) != __nv_cvt_float_to_fp6(x, __NV_E3M2, cudaRoundZero);
    }
    CHECK(bad == 0);
    const float2 pair{1.5f, -3.0f};
    CHECK(encode_x2<e4m3>(pair.x, pair.y) == __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3));
    CHECK(encode_x2<e5m2>(pair.x, pair.y) == __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E5M2));
    CHECK(encode_fp4x2<e2m1>(pair.x, pair.y) == __nv_cvt_float2_to_fp4x2(pair, __NV_E2M1, cudaRoundNearest));
}
