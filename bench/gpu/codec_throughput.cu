// GPU benchmark of the gradient codecs (run by bench/device_suite.sh):
//   * the randomized Hadamard transform (forward, out of place) at blocks 256..4096 and 32768
//     against a device-to-device copy of the same bytes; goal: time within 1.3x of the copy for
//     blocks 256 to 4096;
//   * encode (float -> message) and decode (message -> float) of every format, identity and
//     Hadamard (block 1024), as bandwidth (bytes read + written) against copy bandwidth; goal: 80%.
//     NVFP4 encodes in two passes over the input (its tensor scale needs the message amax first),
//     so it reads the gradient twice;
//   * encode with error feedback (reads and writes the residual too), for reference.
#include <cstdio>

#include "gpu_bench.cuh"
#include "octet/codec/codec.cuh"

int main() {
    using namespace octet;
    octet_bench::print_device();
    const double copy = octet_bench::copy_bandwidth_gbs();
    octet_bench::result("copy", "bandwidth", copy, "GB/s", "cudaMemcpy D2D, read+write");

    const std::size_t n = std::size_t{1} << 28;  // 1 GiB of float
    const auto host = octet_bench::random_floats(std::size_t{1} << 20, 1e-3f, 1);
    cuda::device_buffer<float> x(n), y(n);
    for (std::size_t off = 0; off < n; off += host.size())
        OCTET_CUDA_CHECK(cudaMemcpy(x.data() + off, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));

    const double copy_ms = octet_bench::median_ms(
        [&] { OCTET_CUDA_CHECK(cudaMemcpyAsync(y.data(), x.data(), n * sizeof(float), cudaMemcpyDeviceToDevice)); });
    for (const std::uint32_t B : {256u, 512u, 1024u, 2048u, 4096u, 32768u}) {
        const double ms = octet_bench::median_ms(
            [&] { transform_forward(on_stream(), transform_kind::hadamard, x.cview(), y.view(), B, 1, 0); });
        char name[64];
        std::snprintf(name, sizeof name, "hadamard_b%u", B);
        octet_bench::result(name, "time_vs_copy", ms / copy_ms, "x", B <= 4096 ? "goal <= 1.3" : "");
        octet_bench::result(name, "bandwidth", 8.0 * n / (ms * 1e6), "GB/s", "");
    }

    for (const wire_format f : {wire_format::e4m3, wire_format::e5m2, wire_format::mxfp8, wire_format::nvfp4})
        for (const transform_kind t : {transform_kind::identity, transform_kind::hadamard}) {
            const codec_config cfg{f, t, 1024, 0, 9};
            const std::size_t bytes = encoded_size(cfg, n);
            cuda::device_buffer<std::uint8_t> msg(bytes);
            const double enc =
                octet_bench::median_ms([&] { encode_gradient(on_stream(), cfg, x.cview(), msg.view()); }, 10);
            const double moved = 4.0 * n + static_cast<double>(bytes);
            char name[64];
            std::snprintf(name, sizeof name, "encode_%s_%s", wire_format_name(f), transform_name(t));
            octet_bench::result(name, "bandwidth", moved / (enc * 1e6), "GB/s", "");
            octet_bench::result(name, "fraction_of_copy", moved / (enc * 1e6) / copy, "x", "goal >= 0.8");
            // Decode without the host-side validation (which synchronizes): the kernels alone.
            wire_layout l = wire_layout_of(cfg, n);
            const double dec = octet_bench::median_ms(
                [&] {
                    dispatch_wire_format(f, [&](auto tr) {
                        detail::codec_dev::launch_decode<decltype(tr)>(nullptr, l, t, cfg.seed, 0, msg.data(), 0, 1,
                                                                       y.data(), detail::codec_dev::decode_original);
                    });
                },
                10);
            std::snprintf(name, sizeof name, "decode_%s_%s", wire_format_name(f), transform_name(t));
            octet_bench::result(name, "bandwidth", moved / (dec * 1e6), "GB/s", "kernel only");
            octet_bench::result(name, "fraction_of_copy", moved / (dec * 1e6) / copy, "x", "goal >= 0.8");
            if (f == wire_format::e4m3 && t == transform_kind::hadamard) {
                // The full decode call: device validation against the expected header, status, decode (no host
                // sync); then the synchronizing call (header copied to the host, two stream syncs).
                cuda::device_buffer<std::uint32_t> status(1);
                const double full = octet_bench::median_ms(
                    [&] { decode_gradient(on_stream(), cfg, msg.cview(), y.view(), status.data()); }, 10);
                octet_bench::result("decode_e4m3_hadamard_validated", "bandwidth", moved / (full * 1e6), "GB/s",
                                    "validation + decode, no host sync");
                const double synced = octet_bench::median_ms(
                    [&] { decode_gradient_synchronizing(on_stream(), msg.cview(), y.view()); }, 10);
                octet_bench::result("decode_e4m3_hadamard_synchronizing", "bandwidth", moved / (synced * 1e6), "GB/s",
                                    "header read on the host, validation + decode");
                cuda::device_buffer<std::uint8_t> fb(residual_bytes(residual_storage::bf16, n));
                fb.fill_bytes(0);
                encode_options o;
                o.feedback = residual_view{residual_storage::bf16, fb.data(), n};
                const double fbms =
                    octet_bench::median_ms([&] { encode_gradient(on_stream(), cfg, x.cview(), msg.view(), o); }, 10);
                octet_bench::result("encode_e4m3_hadamard_feedback_bf16", "bandwidth", (moved + 4.0 * n) / (fbms * 1e6),
                                    "GB/s", "reads x and the residual, writes message and residual");
            }
        }
    return 0;
}
