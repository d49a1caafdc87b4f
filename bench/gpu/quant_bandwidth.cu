// GPU benchmark: tile quantizers on a large bf16 tensor, achieved bandwidth (bytes read plus
// written, counting the input once and every output once) against the device's copy bandwidth.
// Goal (issue 3): 80% of copy bandwidth for 1x128, MX and NVFP4 quantization of large bf16
// tensors; and the row-wise + column-wise copies from one read against two separate passes.
#include <cstdio>

#include "gpu_bench.cuh"
#include "octet/quant/quantize.cuh"

namespace {

template <class Recipe>
struct dcopy {
    octet::quant_layout layout;
    octet::cuda::device_buffer<std::uint8_t> data, scales;
    octet::cuda::device_buffer<float> ts;
    dcopy(std::size_t r, std::size_t c)
        : layout(octet::quant_layout_of<Recipe>::make(r, c)),
          data(layout.data_bytes),
          scales(layout.scale_bytes),
          ts(1) {}
    octet::quantized_ref<Recipe> ref() {
        return octet::quantized_ref<Recipe>(data.data(), scales.data(), layout, ts.data());
    }
    double bytes() const { return static_cast<double>(layout.data_bytes + layout.scale_bytes); }
};

template <class Recipe>
void run(const char* name, const octet::bf16* x, std::size_t rows, std::size_t cols, double copy_gbs, bool both,
         bool given_amax, float* amax_dev) {
    using namespace octet;
    dcopy<Recipe> q(rows, cols), qt(cols, rows);
    const matrix_ref<const bf16> xm(x, rows, cols);
    device_quantize_options opt;
    if (given_amax) opt.device_tensor_amax = amax_dev;
    const double ms = octet_bench::median_ms(
        [&] { quantize<Recipe>(on_stream(), xm, q.ref(), both ? qt.ref() : quantized_ref<Recipe>{}, opt); });
    const double bytes = 2.0 * rows * cols + q.bytes() + (both ? qt.bytes() : 0.0);
    const double gbs = bytes / (ms * 1e6);
    octet_bench::result(name, "bandwidth", gbs, "GB/s", "");
    octet_bench::result(name, "fraction_of_copy", gbs / copy_gbs, "x", "goal >= 0.80 (1x128, MX, NVFP4)");
    octet_bench::result(name, "time", ms, "ms", "");
}

}  // namespace

int main() {
    using namespace octet;
    octet_bench::print_device();
    const double copy = octet_bench::copy_bandwidth_gbs();
    octet_bench::result("copy", "bandwidth", copy, "GB/s", "cudaMemcpy D2D, read+write");

    const std::size_t rows = 8192, cols = 8192;
    const auto host = octet_bench::random_floats(rows * 64, 3.0f, 11);
    std::vector<bf16> hb(host.size());
    for (std::size_t i = 0; i < host.size(); ++i) hb[i] = to_bf16(host[i]);
    cuda::device_buffer<bf16> x(rows * cols);
    for (std::size_t off = 0; off < rows * cols; off += hb.size())
        OCTET_CUDA_CHECK(cudaMemcpy(x.data() + off, hb.data(), hb.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    cuda::device_buffer<float> amax(1);
    const float a = 12.0f;
    OCTET_CUDA_CHECK(cudaMemcpy(amax.data(), &a, 4, cudaMemcpyHostToDevice));

    run<recipes::blockwise_1x128>("quant_1x128_rowwise_bf16_8k", x.data(), rows, cols, copy, false, false, amax.data());
    run<recipes::mxfp8_e4m3>("quant_mxfp8_rowwise_bf16_8k", x.data(), rows, cols, copy, false, false, amax.data());
    run<recipes::mxfp4>("quant_mxfp4_rowwise_bf16_8k", x.data(), rows, cols, copy, false, false, amax.data());
    run<recipes::nvfp4>("quant_nvfp4_rowwise_bf16_8k_amaxpass", x.data(), rows, cols, copy, false, false, amax.data());
    run<recipes::nvfp4>("quant_nvfp4_rowwise_bf16_8k_given_amax", x.data(), rows, cols, copy, false, true, amax.data());
    run<recipes::blockwise_128x128>("quant_128x128_bf16_8k", x.data(), rows, cols, copy, false, false, amax.data());
    run<recipes::tensorwise_e4m3>("quant_tensorwise_bf16_8k_current", x.data(), rows, cols, copy, false, false,
                                  amax.data());
    run<recipes::tensorwise_e4m3>("quant_tensorwise_bf16_8k_delayed", x.data(), rows, cols, copy, false, true,
                                  amax.data());
    run<recipes::rowwise_e4m3>("quant_rowwise_pertoken_bf16_8k", x.data(), rows, cols, copy, false, false, amax.data());

    // row-wise + column-wise from one read, against two separate passes
    run<recipes::blockwise_1x128>("quant_1x128_row+col_one_read", x.data(), rows, cols, copy, true, false, amax.data());
    {
        dcopy<recipes::blockwise_1x128> q(rows, cols), qt(cols, rows);
        const matrix_ref<const bf16> xm(x.data(), rows, cols);
        const double ms = octet_bench::median_ms([&] {
            quantize<recipes::blockwise_1x128>(on_stream(), xm, q.ref());
            quantize<recipes::blockwise_1x128>(on_stream(), xm, quantized_ref<recipes::blockwise_1x128>{}, qt.ref());
        });
        octet_bench::result("quant_1x128_row+col_two_passes", "time", ms, "ms",
                            "compare with quant_1x128_row+col_one_read time");
    }
    return 0;
}
