// libFuzzer target: the gradient-codec wire decoder. Every input is decoded as a message, twice:
// as it is, and with its checksum recomputed (so that the fuzzer reaches the field, scale and
// payload checks behind the checksum). Decoding must either succeed or throw octet::error; any
// other exception, a crash, or an out-of-bounds access (AddressSanitizer; the input is copied into
// a buffer of exactly its size) is a bug. The decoded values are not checked (any code is a value).
//
// Seeds: corpus/codec_wire holds valid messages of every format and transform. They were written
// by this file built with -DOCTET_FUZZ_WRITE_SEEDS (a main that writes them to argv[1]):
//   clang++ -std=c++17 -O1 -DOCTET_FUZZ_WRITE_SEEDS -I include tests/fuzz/target/codec_wire_fuzz.cpp -o seeds -pthread
//   ./seeds tests/fuzz/corpus/codec_wire
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "octet/codec/codec.hpp"

namespace {

void try_decode(const std::vector<std::uint8_t>& m) {
    try {
        octet::wire_layout l;
        const octet::wire_header h = octet::read_wire_header(m, &l);
        std::vector<float> out(h.count);  // count <= 2 * m.size(): the size check came first
        octet::decode_gradient(octet::on_host(1), m, out);
        std::vector<float> y(l.coded);
        octet::decode_gradient_transformed(octet::on_host(1), m, y, false);
    } catch (const octet::error&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::vector<std::uint8_t> m(data, data + size);
    try_decode(m);
    if (size >= octet::wire_header_bytes && size % 8 == 0) {
        octet::seal_wire_message(m);
        try_decode(m);
    }
    return 0;
}

#ifdef OCTET_FUZZ_WRITE_SEEDS
int main(int argc, char** argv) {
    if (argc < 2) return 1;
    int k = 0;
    for (auto f :
         {octet::wire_format::e4m3, octet::wire_format::e5m2, octet::wire_format::mxfp8, octet::wire_format::nvfp4})
        for (auto t : {octet::transform_kind::identity, octet::transform_kind::hadamard})
            for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{37}, std::size_t{100}}) {
                const octet::codec_config cfg{f, t, 16, 0, 42 + static_cast<std::uint64_t>(k), (k % 3) == 0};
                std::vector<float> x(n);
                for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 7919) % 200) / 50.0f - 2.0f;
                std::vector<std::uint8_t> m(octet::encoded_size(cfg, n));
                octet::encode_gradient(octet::on_host(1), cfg, x, m);
                const std::string path = std::string(argv[1]) + "/seed_" + octet::wire_format_name(f) + "_" +
                                         octet::transform_name(t) + "_" + std::to_string(n) + ".bin";
                std::FILE* fp = std::fopen(path.c_str(), "wb");
                if (!fp) return 1;
                std::fwrite(m.data(), 1, m.size(), fp);
                std::fclose(fp);
                ++k;
            }
    return 0;
}
#endif
