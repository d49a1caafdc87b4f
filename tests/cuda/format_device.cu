// octet-test: timeout=600
//
// The format core on a GPU against the host path. Suite "cuda" runs anywhere (host code built by
// nvcc); suite "gpu" needs a device and reports itself skipped without one.
//
//   * every one of the 2^32 floats: the sm_89+ hardware cvt path against the software path, on
//     the device, for E4M3 and E5M2 (nearest-even, satfinite);
//   * every one of the 2^32 floats, for 16 format/rounding/overflow modes: the device's codes
//     against the host's, compared through a position-weighted 64-bit sum of all codes;
//   * encode_array / decode_array kernels against the host overloads on fresh random data, with
//     ragged lengths, unaligned pointers, bf16/fp16/float inputs and stochastic rounding, output
//     poisoned first so that an unwritten element cannot pass;
//   * Philox bits on the device against the host.
#include <doctest/doctest.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "octet/cuda/buffer.cuh"
#include "octet/format/convert.cuh"
#include "support/format_reference.hpp"
#include "support/random.hpp"
#include "support/storage.hpp"

// A named namespace: `using namespace octet` at global scope in a .cu file makes CUDA's own
// ::round ambiguous with octet::round in nvcc's generated host stub.
namespace format_device_test {
using namespace octet;
using rn = round::nearest_even;
using rz = round::toward_zero;
using ru = round::up;
using rd = round::down;
using sr = round::stochastic;
using sat = overflow::saturate;
using nonfinite = overflow::to_nonfinite;

namespace {

// Under the interpreter (the `interpret` tests) each sweep takes every 65537th float (65,536 of
// them, every exponent and sign, odd and even mantissas, the same set on both sides) and the
// launches are small; on a GPU, all 2^32 floats.
#if defined(OCTET_INTERPRET)
constexpr bool kInterpreted = true;
constexpr std::uint64_t kSweepStep = 65537;
constexpr unsigned kSweepBlocks = 8;
constexpr std::size_t kLargeN = 20011, kPhiloxN = 1 << 13;
#else
constexpr bool kInterpreted = false;
constexpr std::uint64_t kSweepStep = 1;
constexpr unsigned kSweepBlocks = 1024;
constexpr std::size_t kLargeN = 1000003, kPhiloxN = 1 << 20;
#endif
constexpr std::uint64_t kSweepCount = ((1ull << 32) + kSweepStep - 1) / kSweepStep;
OCTET_HD std::uint32_t sweep_float(std::uint64_t i) {
    return static_cast<std::uint32_t>(i * kSweepStep);
}

OCTET_HD std::uint64_t mix64(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

template <class Fmt, class Round, class Overflow>
OCTET_HD std::uint64_t weighted_code(std::uint32_t u) {
    const float x = bits_to_float(u);
    std::uint32_t code;
    if constexpr (std::is_same_v<Round, sr>)
        code = encode<Fmt, Round, Overflow>(x, static_cast<std::uint32_t>(mix64(u)));
    else
        code = encode<Fmt, Round, Overflow>(x);
    return (code + 1ull) * mix64(u + 0x1234567ull);
}

template <class Fmt, class Round, class Overflow>
__global__ void all_floats_sum_kernel(unsigned long long* sum) {
    std::uint64_t local = 0;
    const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
    for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < kSweepCount;
         i += stride)
        local += weighted_code<Fmt, Round, Overflow>(sweep_float(i));
    atomicAdd(sum, static_cast<unsigned long long>(local));
}

template <class Fmt, class Round, class Overflow>
std::uint64_t all_floats_sum_host() {
    const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::uint64_t> partial(threads, 0);
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            const std::uint64_t b = kSweepCount * t / threads, e = kSweepCount * (t + 1) / threads;
            std::uint64_t local = 0;
            for (std::uint64_t i = b; i < e; ++i) local += weighted_code<Fmt, Round, Overflow>(sweep_float(i));
            partial[t] = local;
        });
    for (auto& th : pool) th.join();
    std::uint64_t s = 0;
    for (auto p : partial) s += p;
    return s;
}

template <class Fmt, class Round, class Overflow>
void check_all_floats_device_vs_host(const char* name) {
    cuda::device_buffer<unsigned long long> sum(1);
    sum.fill_bytes(0);
    cuda::launch("all_floats_sum_kernel", all_floats_sum_kernel<Fmt, Round, Overflow>, kSweepBlocks, 256, 0, nullptr,
                 sum.data());
    OCTET_CUDA_CHECK_LAUNCH();
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    const std::uint64_t device = sum.download()[0];
    const std::uint64_t host = all_floats_sum_host<Fmt, Round, Overflow>();
    INFO(name);
    CHECK(device == host);
}

template <class Fmt>
__global__ void hardware_vs_software_kernel(unsigned long long* mismatches, unsigned* first) {
    const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
    unsigned long long bad = 0;
    for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (1ull << 32);
         i += stride) {
        const std::uint32_t u = static_cast<std::uint32_t>(i);
        const std::uint8_t hw = encode<Fmt, rn, sat>(bits_to_float(u));  // cvt.rn.satfinite on sm_89+
        const std::uint32_t sw = detail::encode_bits<Fmt, rn, sat>(u, 0u);
        if (hw != sw) {
            if (bad == 0) atomicMin(first, u);
            ++bad;
        }
    }
    atomicAdd(mismatches, bad);
}

__global__ void philox_kernel(philox_stream rng, std::uint32_t* out, std::size_t n) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = rng.bits(i);
}

/// encode_array on the device against the host overload, at an element offset (to test
/// unaligned pointers) and a ragged length.
template <class Fmt, class Round, class Overflow, class In>
void check_encode_array(std::size_t n, std::size_t offset, std::uint64_t salt) {
    auto g = octet_test::rng(salt);
    const auto x = octet_test::to_storage<In>(octet_test::with_edge_cases(g, n + offset, Fmt::max_finite / 4, true));
    std::vector<std::uint8_t> host(n);
    const philox_stream rng{octet_test::run_seed(), salt};
    encode_array<Fmt, Round, Overflow>(on_host(), span<const In>(x.data() + offset, n), as_span(host), rng);

    cuda::device_buffer<In> d_in(x);
    cuda::device_buffer<std::uint8_t> d_out(n + 3);
    d_out.fill_bytes(0xA5);
    encode_array<Fmt, Round, Overflow>(on_stream(), span<const In>(d_in.data() + offset, n),
                                       span<std::uint8_t>(d_out.data() + (offset % 4), n), rng);
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    const auto all = d_out.download();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += all[i + offset % 4] != host[i];
    INFO(format_name<Fmt>() << " " << rounding_name<Round>() << " n=" << n << " offset=" << offset);
    CHECK(bad == 0);
    for (std::size_t i = 0; i < offset % 4; ++i) CHECK(all[i] == 0xA5);               // nothing written before the view
    for (std::size_t i = n + offset % 4; i < all.size(); ++i) CHECK(all[i] == 0xA5);  // nor after it
}

}  // namespace

TEST_SUITE("cuda") {
    TEST_CASE("host code built by nvcc encodes like the float64 oracle") {
        auto g = octet_test::rng(11);
        const auto x = octet_test::log_uniform(g, 100000, -12.0f, 10.0f);
        std::size_t bad = 0;
        for (float v : x) {
            bad += encode<e4m3>(v) != octet_test::reference_encode<e4m3, rn, sat>(v);
            bad += encode<e5m2, rz, nonfinite>(v) != octet_test::reference_encode<e5m2, rz, nonfinite>(v);
            bad += encode<ue8m0, ru>(v) != octet_test::reference_encode<ue8m0, ru, sat>(v);
        }
        CHECK(bad == 0);
    }

    TEST_CASE("stream overloads reject bad arguments before touching the device") {
        std::vector<float> x(10);
        std::vector<std::uint8_t> y(9);
        CHECK_THROWS_WITH_AS(encode_array<e4m3>(on_stream(), as_cspan(x), as_span(y)),
                             doctest::Contains("argument 'out'"), octet::error);
        CHECK_THROWS_WITH_AS(
            encode_array<e4m3>(on_stream(), span<const float>(nullptr, 4), span<std::uint8_t>(y.data(), 4)),
            doctest::Contains("argument 'in'"), octet::error);
        std::vector<float> f(9);
        CHECK_THROWS_AS(
            decode_array<e4m3>(on_stream(), span<const std::uint8_t>(y.data(), 9), span<float>(f.data(), 8)),
            octet::error);
    }
}

TEST_SUITE("gpu") {
    // Not under the interpreter: it has no hardware cvt (the cvt model is the software path itself).
    TEST_CASE("hardware cvt and the software path agree on every float" * doctest::skip(kInterpreted)) {
        for (int which = 0; which < 2; ++which) {
            cuda::device_buffer<unsigned long long> bad(1);
            cuda::device_buffer<unsigned> first(1);
            bad.fill_bytes(0);
            first.fill_bytes(0xFF);
            if (which == 0)
                cuda::launch("hardware_vs_software_kernel", hardware_vs_software_kernel<e4m3>, kSweepBlocks, 256, 0,
                             nullptr, bad.data(), first.data());
            else
                cuda::launch("hardware_vs_software_kernel", hardware_vs_software_kernel<e5m2>, kSweepBlocks, 256, 0,
                             nullptr, bad.data(), first.data());
            OCTET_CUDA_CHECK_LAUNCH();
            OCTET_CUDA_CHECK(cudaDeviceSynchronize());
            INFO((which == 0 ? "e4m3" : "e5m2")
                 << ": first mismatch at float bits 0x" << std::hex << first.download()[0]);
            CHECK(bad.download()[0] == 0);
        }
    }

    TEST_CASE("device encode equals host encode on every float, 16 modes") {
        check_all_floats_device_vs_host<e4m3, rn, sat>("e4m3 rn sat");
        check_all_floats_device_vs_host<e4m3, rn, nonfinite>("e4m3 rn nonfinite");
        check_all_floats_device_vs_host<e4m3, rz, sat>("e4m3 rz sat");
        check_all_floats_device_vs_host<e4m3, ru, nonfinite>("e4m3 up nonfinite");
        check_all_floats_device_vs_host<e4m3, rd, sat>("e4m3 down sat");
        check_all_floats_device_vs_host<e4m3, sr, sat>("e4m3 stochastic sat");
        check_all_floats_device_vs_host<e5m2, rn, sat>("e5m2 rn sat");
        check_all_floats_device_vs_host<e5m2, rn, nonfinite>("e5m2 rn nonfinite");
        check_all_floats_device_vs_host<e4m3fnuz, rn, sat>("e4m3fnuz rn sat");
        check_all_floats_device_vs_host<e5m2fnuz, ru, nonfinite>("e5m2fnuz up nonfinite");
        check_all_floats_device_vs_host<e2m1, rn, sat>("e2m1 rn");
        check_all_floats_device_vs_host<e2m3, rn, sat>("e2m3 rn");
        check_all_floats_device_vs_host<e3m2, sr, sat>("e3m2 stochastic");
        check_all_floats_device_vs_host<ue8m0, rz, sat>("ue8m0 rz sat");
        check_all_floats_device_vs_host<ue8m0, ru, nonfinite>("ue8m0 up nonfinite");
        check_all_floats_device_vs_host<ue8m0, rn, sat>("ue8m0 rn sat");
    }

    TEST_CASE("encode_array kernels equal the host path: ragged, unaligned, float/bf16/fp16, stochastic") {
        std::uint64_t salt = 100;
        for (std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{17}, std::size_t{4096}, kLargeN})
            for (std::size_t offset : {std::size_t{0}, std::size_t{1}, std::size_t{5}}) {
                check_encode_array<e4m3, rn, sat, float>(n, offset, ++salt);
                check_encode_array<e4m3, rn, sat, bf16>(n, offset, ++salt);
                check_encode_array<e5m2, rn, nonfinite, fp16>(n, offset, ++salt);
                check_encode_array<e4m3, sr, sat, float>(n, offset, ++salt);
                check_encode_array<e2m1, rn, sat, bf16>(n, offset, ++salt);
                check_encode_array<ue8m0, ru, sat, float>(n, offset, ++salt);
            }
    }

    TEST_CASE("decode_array kernel equals the host path for every code") {
        std::vector<std::uint8_t> codes(256 * 37 + 5);
        for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint8_t>(i * 7);
        cuda::device_buffer<std::uint8_t> d_codes(codes);
        cuda::device_buffer<float> d_out(codes.size());
        d_out.fill_bytes(0xFF);
        decode_array<e4m3>(on_stream(), d_codes.cview(), d_out.view());
        OCTET_CUDA_CHECK(cudaDeviceSynchronize());
        const auto dev = d_out.download();
        std::size_t bad = 0;
        for (std::size_t i = 0; i < codes.size(); ++i)
            bad += float_to_bits(dev[i]) != float_to_bits(decode<e4m3>(codes[i]));
        CHECK(bad == 0);
        decode_array<e2m1>(on_stream(), span<const std::uint8_t>(d_codes.data() + 1, 1000),
                           span<float>(d_out.data() + 3, 1000));
        OCTET_CUDA_CHECK(cudaDeviceSynchronize());
        const auto dev2 = d_out.download();
        bad = 0;
        for (std::size_t i = 0; i < 1000; ++i)
            bad += float_to_bits(dev2[i + 3]) != float_to_bits(decode<e2m1>(codes[i + 1]));
        CHECK(bad == 0);
    }

    TEST_CASE("Philox bits are identical on device and host") {
        const philox_stream rng{octet_test::run_seed(), 99};
        const std::size_t n = kPhiloxN;
        cuda::device_buffer<std::uint32_t> d(n);
        cuda::launch("philox_kernel", philox_kernel, static_cast<unsigned>((n + 255) / 256), 256, 0, nullptr, rng,
                     d.data(), n);
        OCTET_CUDA_CHECK_LAUNCH();
        const auto dev = d.download();
        std::size_t bad = 0;
        for (std::size_t i = 0; i < n; ++i) bad += dev[i] != rng.bits(i);
        CHECK(bad == 0);
    }

    TEST_CASE("stream overloads reject host pointers with a clear error") {
        std::vector<float> x(64);
        std::vector<std::uint8_t> y(64);
        CHECK_THROWS_WITH_AS(encode_array<e4m3>(on_stream(), as_cspan(x), as_span(y)), doctest::Contains("host memory"),
                             octet::error);
    }
}

}  // namespace format_device_test
