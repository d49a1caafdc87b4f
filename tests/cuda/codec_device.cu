// octet-test: timeout=600
//
// The gradient-codec kernels (codec/hadamard.cuh, codec/codec.cuh) against the host path. Suite
// "cuda" runs anywhere (launch-shape facts, argument checks that come before any CUDA call);
// suite "gpu" needs a device:
//   * transform kernels equal the host transform bit for bit, for every block size 16..32768,
//     ragged lengths and odd first indices, forward and inverse; canaries after each output prove
//     nothing is written out of bounds;
//   * encode kernels produce the host's message byte for byte (every format, both transforms,
//     blocks 16..32768, scale blocks up to 32768 (the two-pass path), stochastic rounding, error
//     feedback in each residual storage, pre-rotated input), and leave the same residual bytes;
//     outputs are poisoned first;
//   * decode kernels equal the host decode bit for bit (original and transformed coordinates,
//     accumulate), through the non-blocking decoders (status word ok) and the synchronizing ones;
//     a corrupted message sets the status word (check_decode_status throws the host decoder's
//     octet::error) and leaves `out` untouched; a message that differs from what the caller
//     expects (first index, seed, count) is refused the same way; a truncated buffer is refused on
//     the host; the synchronizing decoder throws for all of these.
// In interpret mode (CTest interpret.codec_device) both suites run under the CPU interpreter, on
// smaller messages (kInterpreted below), with the same bit-for-bit comparisons.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "octet/codec/codec.cuh"
#include "octet/cuda/buffer.cuh"
#include "support/random.hpp"

namespace codec_device_test {
using namespace octet;

// Under the interpreter (the `interpret` tests) the messages are smaller: every block size, format,
// transform, scale block, residual storage and ragged shape is still there, on fewer elements.
#if defined(OCTET_INTERPRET)
constexpr bool kInterpreted = true;
constexpr std::size_t kTransformOddN = 20011;
#else
constexpr bool kInterpreted = false;
constexpr std::size_t kTransformOddN = 100003;
#endif

/// The encode test's ragged message length (with an all-zero tail of 1000). Under the interpreter it
/// still spans several tiles, and with scale blocks of 4096 and up (the two-pass path) 9001 elements,
/// so that the 4096 case has several scale blocks.
std::size_t ragged_length(std::uint32_t scale_block) {
    return !kInterpreted ? 70001 : (scale_block >= 4096 ? 9001 : 3001);
}

/// The encode test's second message length: two transform blocks. Under the interpreter, blocks of
/// 16384 and 32768 (512- and 1024-thread CTAs, the slowest to interpret) take half a block and one
/// element instead: one CTA with zero padding (the transform test runs their multi-CTA grids).
std::size_t two_blocks(std::uint32_t block) {
    return kInterpreted && block >= 16384 ? std::size_t{block} / 2 + 1 : std::size_t{block} * 2;
}

std::vector<float> random_gradient(std::mt19937_64& g, std::size_t n) {
    std::student_t_distribution<float> t(2.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = 1e-3f * t(g);
    if (n > 3) v[n / 3] = 0.0f, v[n / 2] = -0.0f;
    return v;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// Device copy of `host` followed by `canary` extra elements of `fill`; check_canary verifies them.
template <class T>
struct guarded {
    cuda::device_buffer<T> buf;
    std::size_t n;
    guarded(std::size_t count, unsigned char poison) : buf(count + 64), n(count) { buf.fill_bytes(poison); }
    span<T> view() const { return span<T>(buf.data(), n); }
    std::vector<T> body() const {
        auto all = buf.download();
        return std::vector<T>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));
    }
    bool canary_intact(unsigned char poison) const {
        auto all = buf.download();
        const unsigned char* p = reinterpret_cast<const unsigned char*>(all.data() + n);
        for (std::size_t i = 0; i < 64 * sizeof(T); ++i)
            if (p[i] != poison) return false;
        return true;
    }
};

}  // namespace codec_device_test

TEST_SUITE("cuda") {
    TEST_CASE("codec kernels: launch shapes cover whole blocks and fit the device") {
        using namespace octet::detail::codec_dev;
        for (int log_b = 0; log_b <= 15; ++log_b) {
            if (log_b > 0 && log_b < 4) continue;
            const int R = regs_for(log_b);
            const int threads = threads_for(log_b, R);
            const long tile = static_cast<long>(threads) * R;
            CAPTURE(log_b);
            CHECK(threads % 32 == 0);
            CHECK(threads <= (R == 8 ? max_threads<8> : (R == 16 ? max_threads<16> : max_threads<32>)));
            CHECK(tile % (1L << log_b) == 0);  // a tile holds whole transform blocks
            CHECK(tile % 128 == 0);            // and whole e4m3 residual blocks
            CHECK(tile >= 1024);
            CHECK(log_b - log2_of(R) - 5 <= log2_of(R));  // cross-warp bits fit in registers
            CHECK(smem_bytes(log_b, R, threads) <= 227 * 1024);
        }
    }
    TEST_CASE("codec kernels: argument errors come before any device work") {
        using namespace octet;
        std::vector<std::uint8_t> msg(encoded_size({}, 10));
        CHECK_THROWS_WITH_AS(
            encode_gradient(on_stream(), {wire_format::e4m3, transform_kind::hadamard, 3},
                            span<const float>(nullptr, 10), span<std::uint8_t>(msg.data(), msg.size())),
            doctest::Contains("argument 'config.block'"), octet::error);
        CHECK_THROWS_WITH_AS(
            encode_gradient(on_stream(), {}, span<const float>(nullptr, 10), span<std::uint8_t>(msg.data(), 5)),
            doctest::Contains("argument 'out'"), octet::error);
        // The checks the host forms share (one entry, one destination rule) come before the stream's own.
        std::vector<float> y(3);
        CHECK_THROWS_WITH_AS(encode_gradient_transformed(on_stream(), {}, span<const float>(y.data(), y.size()), 10,
                                                         span<std::uint8_t>(msg.data(), msg.size())),
                             doctest::Contains("argument 'y' has 3 coordinates"), octet::error);
        CHECK_THROWS_WITH_AS(
            decode_gradient_transformed(on_stream(), {}, 10, span<const std::uint8_t>(msg.data(), msg.size()),
                                        span<float>(y.data(), y.size()), nullptr),
            doctest::Contains("argument 'y' has 3 elements"), octet::error);
    }
}

TEST_SUITE("gpu") {
    TEST_CASE("transform kernels equal the host transform, bit for bit") {
        using namespace codec_device_test;
        auto g = octet_test::rng(31);
        for (std::uint32_t B = 16; B <= 32768; B *= 2)
            for (const std::size_t n :
                 {std::size_t{B} * 3, std::size_t{B} + 7, std::size_t{B} / 2 + 1, kTransformOddN}) {
                const std::uint64_t seed = g(), first = g() % 1000;  // often not a multiple of 32
                const std::vector<float> x = random_gradient(g, n);
                const std::size_t L = transform_length(transform_kind::hadamard, n, B);
                std::vector<float> y_host(L), x_host(n);
                transform_forward(on_host(), transform_kind::hadamard, x, y_host, B, seed, first);
                transform_inverse(on_host(), transform_kind::hadamard, y_host, x_host, B, seed, first);
                cuda::device_buffer<float> dx(x);
                guarded<float> dy(L, 0xFF), dback(n, 0xFF);
                transform_forward(on_stream(), transform_kind::hadamard, dx.cview(), dy.view(), B, seed, first);
                transform_inverse(on_stream(), transform_kind::hadamard, span<const float>(dy.buf.data(), L),
                                  dback.view(), B, seed, first);
                CAPTURE(B);
                CAPTURE(n);
                CHECK(same_bits(dy.body(), y_host));
                CHECK(same_bits(dback.body(), x_host));
                CHECK(dy.canary_intact(0xFF));
                CHECK(dback.canary_intact(0xFF));
            }
    }

    TEST_CASE("encode kernels produce the host's message byte for byte; decode kernels the host's floats") {
        using namespace codec_device_test;
        auto g = octet_test::rng(32);
        struct cse {
            wire_format f;
            transform_kind t;
            std::uint32_t block, scale_block;
            bool stochastic;
            int feedback;  // -1 none, else residual_storage
            bool pre_rotated;
        };
        std::vector<cse> cases;
        for (const wire_format f : {wire_format::e4m3, wire_format::e5m2, wire_format::mxfp8, wire_format::nvfp4})
            for (const std::uint32_t B : {16u, 256u, 1024u, 4096u, 16384u, 32768u}) {
                cases.push_back({f, transform_kind::hadamard, B, 0, false, -1, false});
                cases.push_back({f, transform_kind::hadamard, B, 0, true, static_cast<int>(cases.size() % 3), false});
                cases.push_back({f, transform_kind::hadamard, B, 0, false, 2, true});
            }
        for (const wire_format f : {wire_format::e4m3, wire_format::nvfp4}) {
            cases.push_back({f, transform_kind::identity, 1024, 0, false, -1, false});
            cases.push_back({f, transform_kind::identity, 1024, 0, true, 1, false});
        }
        for (const std::uint32_t sb : {16u, 512u, 4096u, 32768u}) {  // large scale blocks: the two-pass path
            cases.push_back({wire_format::e4m3, transform_kind::hadamard, 256, sb, false, -1, false});
            cases.push_back({wire_format::e5m2, transform_kind::identity, 1024, sb, false, 0, false});
        }
        for (const cse& c : cases)
            for (const std::size_t n : {ragged_length(c.scale_block), two_blocks(c.block), std::size_t{5}}) {
                const codec_config cfg{c.f, c.t, c.block, c.scale_block, g(), c.stochastic};
                const std::uint64_t first = 128 * (g() % 50);
                std::vector<float> x = random_gradient(g, n);
                // An all-zero tail: the zero padding's sign must match the host's (+0) for zero results.
                if (n == ragged_length(c.scale_block)) std::fill(x.end() - 1000, x.end(), 0.0f);
                const std::size_t L = transform_length(c.t, n, c.block);
                const std::vector<float> y_in = c.pre_rotated ? random_gradient(g, L) : std::vector<float>{};
                const std::size_t bytes = encoded_size(cfg, n);
                // Host.
                std::vector<std::uint8_t> m_host(bytes);
                error_feedback fb_host(
                    n, c.feedback < 0 ? residual_storage::f32 : static_cast<residual_storage>(c.feedback));
                if (c.feedback >= 0) {
                    std::vector<float> e0 = random_gradient(g, n);
                    store_residual(fb_host.view(), 0, n, e0.data());
                }
                const std::vector<std::uint8_t> fb_before = [&] {
                    const residual_view v = fb_host.view();
                    return std::vector<std::uint8_t>(v.data, v.data + v.bytes());
                }();
                encode_options ho;
                ho.first_index = first;
                ho.random_stream = 3;
                if (c.feedback >= 0) ho.feedback = fb_host.view();
                if (c.pre_rotated)
                    encode_gradient_transformed(on_host(), cfg, y_in, n, m_host, ho);
                else
                    encode_gradient(on_host(), cfg, x, m_host, ho);
                // Device.
                cuda::device_buffer<float> dx(c.pre_rotated ? y_in : x);
                guarded<std::uint8_t> dm(bytes, 0xCD);
                cuda::device_buffer<std::uint8_t> dfb(fb_before.size() ? fb_before : std::vector<std::uint8_t>(1));
                encode_options dop = ho;
                if (c.feedback >= 0) dop.feedback = residual_view{fb_host.storage(), dfb.data(), n};
                if (c.pre_rotated)
                    encode_gradient_transformed(on_stream(), cfg, dx.cview(), n, dm.view(), dop);
                else
                    encode_gradient(on_stream(), cfg, dx.cview(), dm.view(), dop);
                CAPTURE(std::string(wire_format_name(c.f)));
                CAPTURE(std::string(transform_name(c.t)));
                CAPTURE(c.block);
                CAPTURE(c.scale_block);
                CAPTURE(c.stochastic);
                CAPTURE(c.feedback);
                CAPTURE(c.pre_rotated);
                CAPTURE(n);
                const std::vector<std::uint8_t> m_dev = dm.body();
                CHECK(same_bits(m_dev, m_host));
                CHECK(dm.canary_intact(0xCD));
                if (c.feedback >= 0) {
                    const residual_view v = fb_host.view();
                    CHECK(same_bits(dfb.download(), std::vector<std::uint8_t>(v.data, v.data + v.bytes())));
                }
                // Decode: original coordinates, transformed, accumulate.
                std::vector<float> out_host(n), yt_host(L);
                const wire_header hh = decode_gradient(on_host(), m_host, out_host);
                decode_gradient_transformed(on_host(), m_host, yt_host);
                guarded<float> dout(n, 0xEE), dyt(L, 0xEE);
                const span<const std::uint8_t> dmsg(dm.buf.data(), bytes);
                cuda::device_buffer<std::uint32_t> status(std::vector<std::uint32_t>{77u});
                cuda::device_buffer<unsigned long long> nf(std::vector<unsigned long long>{12345});
                device_decode_options dopt;
                dopt.first_index = first;
                dopt.device_non_finite = nf.data();
                decode_gradient(on_stream(), cfg, dmsg, dout.view(), status.data(), dopt);
                CHECK(status.download()[0] == 0u);
                CHECK(nf.download()[0] == hh.non_finite_codes);
                decode_gradient_transformed(on_stream(), cfg, n, dmsg, dyt.view(), status.data(), false, dopt);
                CHECK(status.download()[0] == 0u);
                CHECK(same_bits(dout.body(), out_host));
                CHECK(same_bits(dyt.body(), yt_host));
                CHECK(dout.canary_intact(0xEE));
                CHECK(dyt.canary_intact(0xEE));
                // The synchronizing decoders give the same floats.
                guarded<float> sout(n, 0xEE);
                const wire_header hs = decode_gradient_synchronizing(on_stream(), dmsg, sout.view());
                CHECK(hs.non_finite_codes == hh.non_finite_codes);
                CHECK(same_bits(sout.body(), out_host));
                decode_gradient_transformed(on_host(), m_host, yt_host, true);
                decode_gradient_transformed(on_stream(), cfg, n, dmsg, dyt.view(), status.data(), true, dopt);
                CHECK(status.download()[0] == 0u);
                CHECK(same_bits(dyt.body(), yt_host));
            }
    }

    TEST_CASE("device decode: corrupted, unexpected and truncated messages are refused and write nothing") {
        using namespace codec_device_test;
        auto g = octet_test::rng(33);
        const codec_config cfg{wire_format::mxfp8, transform_kind::hadamard, 1024, 0, 4};
        const std::size_t n = 5000;
        const std::vector<float> x = random_gradient(g, n);
        std::vector<std::uint8_t> m(encoded_size(cfg, n));
        encode_gradient(on_host(), cfg, x, m);
        cuda::device_buffer<std::uint8_t> dm(m.size());
        cuda::device_buffer<std::uint32_t> status(1);
        guarded<float> out(n, 0x7F);
        auto untouched = [&] {
            for (float v : out.body()) {
                std::uint32_t u;
                std::memcpy(&u, &v, 4);
                if (u != 0x7F7F7F7Fu) return false;
            }
            return true;
        };
        for (int trial = 0; trial < 40; ++trial) {
            std::vector<std::uint8_t> c = m;
            const std::size_t at = trial < 8 ? static_cast<std::size_t>(trial) * 8 + 1 : g() % c.size();
            c[at] ^= static_cast<std::uint8_t>(1u << (g() % 8));
            dm.upload(c);
            CAPTURE(at);
            // Non-blocking: the status word says why, check_decode_status throws what the host would.
            decode_gradient(on_stream(), cfg, dm.cview(), out.view(), status.data());
            const std::uint32_t st = status.download()[0];
            CHECK(st != 0u);
            CHECK_THROWS_WITH_AS(check_decode_status(st), doctest::Contains("argument 'message'"), octet::error);
            // The synchronizing decoder throws from the call.
            CHECK_THROWS_WITH_AS(decode_gradient_synchronizing(on_stream(), dm.cview(), out.view()),
                                 doctest::Contains("argument 'message'"), octet::error);
            CHECK(untouched());
        }
        dm.upload(m);
        // What the caller expects differs from the message: refused on the device.
        for (const std::uint64_t first : {std::uint64_t{128}, std::uint64_t{0}}) {
            codec_config other = cfg;
            if (first == 0) other.seed = cfg.seed + 1;
            device_decode_options o;
            o.first_index = first;
            decode_gradient(on_stream(), other, dm.cview(), out.view(), status.data(), o);
            const std::uint32_t st = status.download()[0];
            CHECK(st == static_cast<std::uint32_t>(decode_status::header_mismatch));
            CHECK_THROWS_WITH_AS(check_decode_status(st), doctest::Contains("expected message"), octet::error);
            CHECK(untouched());
        }
        // A buffer of the wrong size is refused on the host (no device work).
        CHECK_THROWS_WITH_AS(decode_gradient(on_stream(), cfg, span<const std::uint8_t>(dm.data(), m.size() - 16),
                                             out.view(), status.data()),
                             doctest::Contains("truncated"), octet::error);
        CHECK_THROWS_WITH_AS(
            decode_gradient_synchronizing(on_stream(), span<const std::uint8_t>(dm.data(), m.size() - 16), out.view()),
            doctest::Contains("truncated"), octet::error);
        CHECK_THROWS_WITH_AS(decode_gradient(on_stream(), cfg, dm.cview(), out.view(), nullptr),
                             doctest::Contains("device_status"), octet::error);
        CHECK(untouched());
        decode_gradient(on_stream(), cfg, dm.cview(), out.view(), status.data());
        CHECK(status.download()[0] == 0u);
        std::vector<float> host(n);
        decode_gradient(on_host(), m, host);
        CHECK(same_bits(out.body(), host));
    }
}
