// The wire format of the gradient codecs (codec/wire.hpp):
//   * the header round-trips every field; sizes follow the documented layout (16-byte sections);
//   * every truncation (each prefix) and a trailing byte raise octet::error naming 'message';
//   * every single-bit flip of whole messages (each format, both transforms) is detected;
//   * each invalid field, with the checksum recomputed so that only the field is wrong, is rejected
//     with its own message: magic, version, header size, format, transform, blocks, flags, count
//     (including counts whose sizes would overflow), tensor scale, total size, scale values, padding;
//   * random buffers (half of them given a valid magic, version and checksum) never decode without
//     octet::error unless they are valid messages (the libFuzzer target in tests/fuzz does this at
//     scale under AddressSanitizer);
//   * argument errors of encode/decode name the argument.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "octet/codec/codec.hpp"
#include "support/random.hpp"

namespace {
using namespace octet;

std::vector<std::uint8_t> make_message(const codec_config& cfg, std::size_t n, std::mt19937_64& g,
                                       std::uint64_t first = 0) {
    std::vector<float> x(n);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : x) v = d(g);
    std::vector<std::uint8_t> m(encoded_size(cfg, n));
    encode_options o;
    o.first_index = first;
    encode_gradient(on_host(), cfg, x, m, o);
    return m;
}

std::string decode_error(const std::vector<std::uint8_t>& m) {
    try {
        const wire_header h = read_wire_header(m);
        std::vector<float> out(h.count);
        decode_gradient(on_host(), m, out);
    } catch (const octet::error& e) {
        return e.what();
    }
    return "";
}

void put32(std::vector<std::uint8_t>& m, std::size_t off, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) m[off + i] = static_cast<std::uint8_t>(v >> (8 * i));
}
void put64(std::vector<std::uint8_t>& m, std::size_t off, std::uint64_t v) {
    for (int i = 0; i < 8; ++i) m[off + i] = static_cast<std::uint8_t>(v >> (8 * i));
}

/// Applies `edit`, reseals the checksum, and returns the decode error.
template <class Edit>
std::string error_after(std::vector<std::uint8_t> m, Edit&& edit) {
    edit(m);
    seal_wire_message(m);
    return decode_error(m);
}

}  // namespace

TEST_CASE("wire: header fields and layout") {
    auto g = octet_test::rng(21);
    const codec_config cfg{wire_format::nvfp4, transform_kind::hadamard, 2048, 0, 0x1234567890ull, true};
    const std::vector<std::uint8_t> m = make_message(cfg, 5000, g, 777);
    wire_layout l;
    const wire_header h = read_wire_header(m, &l);
    CHECK(h.version == 1);
    CHECK(h.format == wire_format::nvfp4);
    CHECK(h.transform == transform_kind::hadamard);
    CHECK(h.block == 2048);
    CHECK(h.scale_block == 16);
    CHECK(h.seed == 0x1234567890ull);
    CHECK(h.first_index == 777);
    CHECK(h.count == 5000);
    CHECK(h.stochastic);
    CHECK(h.tensor_scale > 0.0f);
    CHECK(h.total_bytes == m.size());
    CHECK(h.checksum == wire_checksum(m));
    // L = 3 * 2048; scales 6144 / 16 = 384 bytes; payload 3072 bytes.
    CHECK(l.coded == 6144);
    CHECK(l.scales_offset == 64);
    CHECK(l.scales_bytes == 384);
    CHECK(l.payload_offset == 448);
    CHECK(l.payload_bytes == 3072);
    CHECK(m.size() == 448 + 3072);
    const codec_config back = config_of(h);
    CHECK(back.format == cfg.format);
    CHECK(back.block == cfg.block);
    CHECK(back.seed == cfg.seed);
    // Identity, E4M3, 100 elements, scale per 128: 1 float scale padded to 16 bytes, 100 codes padded to 112.
    const codec_config id{wire_format::e4m3, transform_kind::identity, 1024, 0, 0};
    CHECK(encoded_size(id, 100) == 64 + 16 + 112);
    CHECK(encoded_size(id, 0) == 64);
    // Sections are 16-byte multiples for every format and size.
    for (const wire_format f : {wire_format::e4m3, wire_format::e5m2, wire_format::mxfp8, wire_format::nvfp4})
        for (std::size_t n = 0; n < 200; n += 13)
            CHECK(encoded_size({f, transform_kind::identity, 16, 0, 0}, n) % 16 == 0);
}

TEST_CASE("wire: truncated, overlong and bit-flipped messages raise octet::error") {
    auto g = octet_test::rng(22);
    for (const wire_format f : {wire_format::e4m3, wire_format::e5m2, wire_format::mxfp8, wire_format::nvfp4})
        for (const transform_kind t : {transform_kind::identity, transform_kind::hadamard}) {
            const std::vector<std::uint8_t> m = make_message({f, t, 64, 0, g()}, 101, g);
            CHECK(decode_error(m).empty());
            CAPTURE(std::string(wire_format_name(f)));
            CAPTURE(std::string(transform_name(t)));
            for (std::size_t len = 0; len < m.size(); ++len) {
                const std::vector<std::uint8_t> part(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(len));
                const std::string e = decode_error(part);
                CHECK(e.find("argument 'message'") != std::string::npos);
                if (len >= 64) CHECK(e.find("truncated") != std::string::npos);
            }
            std::vector<std::uint8_t> longer = m;
            longer.push_back(0);
            CHECK(decode_error(longer).find("trailing bytes") != std::string::npos);
            std::size_t missed = 0;
            for (std::size_t bit = 0; bit < 8 * m.size(); ++bit) {
                std::vector<std::uint8_t> c = m;
                c[bit / 8] ^= static_cast<std::uint8_t>(1u << (bit % 8));
                missed += decode_error(c).empty();
            }
            CHECK(missed == 0);
        }
}

TEST_CASE("wire: each invalid field is rejected with its own message") {
    auto g = octet_test::rng(23);
    const std::vector<std::uint8_t> e4 = make_message({wire_format::e4m3, transform_kind::hadamard, 64, 0, 5}, 200, g);
    const std::vector<std::uint8_t> mx = make_message({wire_format::mxfp8, transform_kind::identity, 64, 0, 5}, 200, g);
    const std::vector<std::uint8_t> nv = make_message({wire_format::nvfp4, transform_kind::identity, 64, 0, 5}, 201, g);
    auto has = [](const std::string& e, const char* what) {
        CAPTURE(e);
        CAPTURE(std::string(what));
        CHECK(e.find(what) != std::string::npos);
    };
    has(error_after(e4, [](auto& m) { m[0] = 'X'; }), "magic");
    has(error_after(e4, [](auto& m) { m[4] = 2; }), "version");
    has(error_after(e4, [](auto& m) { m[6] = 32; }), "header size");
    has(error_after(e4, [](auto& m) { m[8] = 9; }), "unknown format");
    has(error_after(e4, [](auto& m) { m[8] = 0; }), "unknown format");
    has(error_after(e4, [](auto& m) { m[9] = 2; }), "unknown transform");
    has(error_after(e4, [](auto& m) { m[10] = 3; }), "Hadamard block of 2^3");
    has(error_after(e4, [](auto& m) { m[10] = 16; }), "Hadamard block of 2^16");
    has(error_after(e4, [](auto& m) { m[10] = 12; }),
        "Hadamard block of 4096 for 200 elements");  // not the effective block
    has(error_after(mx, [](auto& m) { m[10] = 5; }), "block size with the identity transform");
    has(error_after(e4, [](auto& m) { m[11] = 3; }), "scale block of 2^3");
    has(error_after(mx, [](auto& m) { m[11] = 4; }), "must be 32");
    has(error_after(e4, [](auto& m) { m[12] = 2; }), "flag bits");
    has(error_after(e4, [](auto& m) { m[44] = 1; }), "reserved");
    has(error_after(e4, [](auto& m) { put64(m, 32, (std::uint64_t{1} << 40) + 1); }), "at most 2^40");
    has(error_after(e4, [](auto& m) { put64(m, 32, ~std::uint64_t{0}); }), "at most 2^40");
    has(error_after(e4, [](auto& m) { put64(m, 32, std::uint64_t{1} << 40); }),
        "total size field");  // huge but valid count
    has(error_after(e4, [](auto& m) { put64(m, 32, 100); }),
        "total size field");  // (199 would be valid: same coded length)
    has(error_after(e4, [](auto& m) { put64(m, 48, 1); }), "total size field");
    has(error_after(e4, [](auto& m) { put64(m, 24, ~std::uint64_t{0} - 9); }),
        "first index");  // found by the fuzzer: indices wrapped
    has(error_after(e4, [](auto& m) { put64(m, 24, (std::uint64_t{1} << 62) - 255); }), "first index");
    has(error_after(e4, [](auto& m) { put32(m, 40, 0x40000000u); }), "tensor scale other than 1");
    has(error_after(nv, [](auto& m) { put32(m, 40, 0x7FC00000u); }), "NVFP4 tensor scale");
    has(error_after(nv, [](auto& m) { put32(m, 40, 0x80000000u); }), "NVFP4 tensor scale");
    has(error_after(e4, [](auto& m) { put32(m, 64, 0x7FC00000u); }), "scale 0");
    has(error_after(e4, [](auto& m) { put32(m, 68, 0); }), "scale 1");
    has(error_after(e4, [](auto& m) { put32(m, 64, 0xBF800000u); }), "scale 0");
    has(error_after(mx, [](auto& m) { m[64 + 3] = 0xFF; }), "UE8M0 NaN");
    has(error_after(nv, [](auto& m) { m[64 + 2] = 0x7F; }), "E4M3 code 127");
    has(error_after(nv, [](auto& m) { m[64 + 2] = 0x85; }), "E4M3 code 133");
    {
        wire_layout l;
        read_wire_header(e4, &l);
        has(error_after(e4, [&](auto& m) { m[l.scales_offset + l.scale_count * 4] = 1; }), "padding after its scales");
        has(error_after(mx, [&](auto& m) { m[m.size() - 1] = 1; }),
            "padding after its payload");  // 200 codes padded to 208
        read_wire_header(nv, &l);
        CHECK(l.coded % 2 == 1);
        has(error_after(nv, [&](auto& m) { m[l.payload_offset + l.coded / 2] |= 0x30; }), "padding nibble");
    }
    has(decode_error(std::vector<std::uint8_t>{}), "truncated");
    // A valid message decoded into the wrong size, and encode's own argument checks.
    std::vector<float> out(199);
    CHECK_THROWS_WITH_AS(decode_gradient(on_host(), e4, out), doctest::Contains("argument 'out'"), octet::error);
    std::vector<float> x(200);
    std::vector<std::uint8_t> small(10);
    CHECK_THROWS_WITH_AS(encode_gradient(on_host(), {}, x, small), doctest::Contains("argument 'out'"), octet::error);
    std::vector<std::uint8_t> ok(encoded_size({}, 200));
    CHECK_THROWS_WITH_AS(encode_gradient(on_host(), {wire_format::e4m3, transform_kind::hadamard, 100}, x, ok),
                         doctest::Contains("argument 'config.block'"), octet::error);
    CHECK_THROWS_WITH_AS(encode_gradient(on_host(), {wire_format::mxfp8, transform_kind::identity, 64, 16}, x, ok),
                         doctest::Contains("argument 'config.scale_block'"), octet::error);
    CHECK_THROWS_WITH_AS(encode_gradient(on_host(), {wire_format::e4m3, transform_kind::identity, 64, 24}, x, ok),
                         doctest::Contains("argument 'config.scale_block'"), octet::error);
    CHECK_THROWS_WITH_AS(encode_gradient(on_host(), {static_cast<wire_format>(9)}, x, ok),
                         doctest::Contains("argument 'config.format'"), octet::error);
}

TEST_CASE("wire: random buffers never decode by accident") {
    auto g = octet_test::rng(24);
    const std::vector<std::uint8_t> valid =
        make_message({wire_format::mxfp8, transform_kind::hadamard, 32, 0, 1}, 64, g);
    std::size_t accepted = 0;
    for (int trial = 0; trial < 20000; ++trial) {
        std::vector<std::uint8_t> m(g() % 2 ? valid.size() : 16 * (g() % 40));
        for (auto& b : m) b = static_cast<std::uint8_t>(g());
        if (trial % 2 == 0 && m.size() >= 64) {
            // A plausible header: valid magic, version, size, format, transform and block fields.
            std::memcpy(m.data(), valid.data(), 16);
            if (trial % 4 == 0) std::memcpy(m.data(), valid.data(), 64);
            if (m.size() % 8 == 0) seal_wire_message(m);
        }
        const std::string e = decode_error(m);
        if (e.empty())
            ++accepted;
        else
            CHECK(e.find("argument 'message'") != std::string::npos);
    }
    // A random payload with a copied header and a resealed checksum can be a valid message (any
    // code is a value); nothing else can. Those decode without reading out of bounds.
    MESSAGE("random buffers accepted as valid messages: ", accepted, " of 20000");
    CHECK(accepted < 20000 / 4 + 1);
}

TEST_CASE("wire: non-finite payload codes are counted and reported, not hidden") {
    auto g = octet_test::rng(0x4E46);
    // the classifier against the formats' own decode (all 256 codes)
    for (int c = 0; c < 256; ++c) {
        const auto code = static_cast<std::uint8_t>(c);
        CHECK(detail::non_finite_code(wire_format::e4m3, code) == !std::isfinite(decode<e4m3>(code)));
        CHECK(detail::non_finite_code(wire_format::mxfp8, code) == !std::isfinite(decode<e4m3>(code)));
        CHECK(detail::non_finite_code(wire_format::e5m2, code) == !std::isfinite(decode<e5m2>(code)));
        CHECK_FALSE(detail::non_finite_code(wire_format::nvfp4, code));
    }
    for (wire_format f : {wire_format::e4m3, wire_format::e5m2, wire_format::mxfp8}) {
        for (transform_kind t : {transform_kind::identity, transform_kind::hadamard}) {
            INFO(wire_format_name(f) << (t == transform_kind::hadamard ? " hadamard" : " identity"));
            const codec_config cfg{f, t, 64};
            const std::size_t n = 300;
            auto m = make_message(cfg, n, g);
            wire_layout l;
            CHECK(read_wire_header(m, &l).non_finite_codes == 0);
            // a crafted message: valid checksums and scales, NaN codes at coordinates 5 and 200 (and an
            // E5M2 infinity at 7), resealed so that only the codes are unusual
            const std::uint8_t nan_code = f == wire_format::e5m2 ? 0x7E : 0x7F;
            m[l.payload_offset + 5] = nan_code;
            m[l.payload_offset + 200] = static_cast<std::uint8_t>(nan_code | 0x80);
            std::uint64_t expected = 2;
            if (f == wire_format::e5m2) {
                m[l.payload_offset + 7] = 0xFC;  // -Inf
                expected = 3;
            }
            seal_wire_message(m);
            const wire_header h = read_wire_header(m);
            CHECK(h.non_finite_codes == expected);
            std::vector<float> out(n);
            const wire_header hd = decode_gradient(on_host(), m, out);
            CHECK(hd.non_finite_codes == expected);  // decode reports it too
            std::size_t bad = 0;
            for (float v : out) bad += std::isfinite(v) ? 0 : 1;
            if (t == transform_kind::identity) {
                CHECK(std::isnan(out[5]));
                CHECK(std::isnan(out[200]));
                CHECK(bad == expected);
            } else {
                CHECK(bad >= 2 * 64);  // Hadamard spreads each one over its block of 64
            }
            std::vector<float> y(l.coded);
            CHECK(decode_gradient_transformed(on_host(), m, y).non_finite_codes == expected);
        }
    }
    // the encoder writes a non-finite code for a NaN or an Inf input, and the count says so; the
    // decoded gradient is non-finite exactly there (E5M2 keeps the Inf's sign)
    for (const wire_format f : {wire_format::e4m3, wire_format::e5m2, wire_format::mxfp8}) {
        const codec_config cfg{f, transform_kind::identity, 64};
        std::vector<float> x(256, 0.5f);
        x[17] = std::numeric_limits<float>::quiet_NaN();
        x[100] = std::numeric_limits<float>::infinity();
        x[101] = -std::numeric_limits<float>::infinity();
        std::vector<std::uint8_t> m(encoded_size(cfg, x.size()));
        encode_gradient(on_host(), cfg, x, m);
        CHECK(read_wire_header(m).non_finite_codes == 3);
        std::vector<float> y(x.size());
        CHECK(decode_gradient(on_host(), m, y).non_finite_codes == 3);
        for (std::size_t i = 0; i < y.size(); ++i) CHECK(std::isfinite(y[i]) == std::isfinite(x[i]));
        if (f == wire_format::e5m2) CHECK((y[100] == INFINITY && y[101] == -INFINITY));
    }
    // NVFP4 has no non-finite codes: every message counts 0
    const codec_config fp4{wire_format::nvfp4, transform_kind::identity, 64};
    const auto m4 = make_message(fp4, 100, g);
    CHECK(read_wire_header(m4).non_finite_codes == 0);
}
