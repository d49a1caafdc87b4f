// GPU benchmark: array conversions (float/bf16 -> E4M3 and back) against the device's copy
// bandwidth, counting bytes read plus bytes written. Goal (issue 2): 85% of copy bandwidth for
// float/bf16 -> E4M3.
#include <cstdio>

#include "gpu_bench.cuh"
#include "octet/format/convert.cuh"

int main() {
    using namespace octet;
    octet_bench::print_device();
    const double copy = octet_bench::copy_bandwidth_gbs();
    octet_bench::result("copy", "bandwidth", copy, "GB/s", "cudaMemcpy D2D, read+write");

    const std::size_t n = std::size_t{1} << 28;  // 1 GiB of float
    const auto host = octet_bench::random_floats(std::size_t{1} << 20, 100.0f, 1);
    cuda::device_buffer<float> x(n);
    for (std::size_t off = 0; off < n; off += host.size())
        OCTET_CUDA_CHECK(cudaMemcpy(x.data() + off, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
    cuda::device_buffer<std::uint8_t> codes(n);
    cuda::device_buffer<bf16> xb(n);
    {
        std::vector<bf16> hb(host.size());
        for (std::size_t i = 0; i < host.size(); ++i) hb[i] = to_bf16(host[i]);
        for (std::size_t off = 0; off < n; off += hb.size())
            OCTET_CUDA_CHECK(cudaMemcpy(xb.data() + off, hb.data(), hb.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    }
    cuda::device_buffer<float> back(n);

    auto report = [&](const char* name, double ms, double bytes) {
        const double gbs = bytes / (ms * 1e6);
        octet_bench::result(name, "bandwidth", gbs, "GB/s", "");
        octet_bench::result(name, "fraction_of_copy", gbs / copy, "x", "goal >= 0.85 for float/bf16 -> e4m3");
    };
    double ms = octet_bench::median_ms([&] { encode_array<e4m3>(on_stream(), x.cview(), codes.view()); });
    report("encode_f32_to_e4m3_rn", ms, n * 5.0);
    ms = octet_bench::median_ms([&] { encode_array<e4m3>(on_stream(), xb.cview(), codes.view()); });
    report("encode_bf16_to_e4m3_rn", ms, n * 3.0);
    ms = octet_bench::median_ms([&] {
        encode_array<e4m3, round::stochastic>(on_stream(), x.cview(), codes.view(), philox_stream{7, 0});
    });
    report("encode_f32_to_e4m3_stochastic", ms, n * 5.0);
    ms = octet_bench::median_ms([&] { encode_array<e2m1>(on_stream(), xb.cview(), codes.view()); });
    report("encode_bf16_to_e2m1_rn_bytecodes", ms, n * 3.0);
    ms = octet_bench::median_ms([&] { decode_array<e4m3>(on_stream(), codes.cview(), back.view()); });
    report("decode_e4m3_to_f32", ms, n * 5.0);
    return 0;
}
