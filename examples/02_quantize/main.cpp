// examples/02_quantize: one heavy-tailed tensor under every named recipe, side by side.
//
// Run:  build/default/examples/example_02_quantize
//
// The tensor is 256 x 1024 values with a heavy (Student-t, 3 degrees of freedom) tail and a few
// large outliers, like an activation with outlier channels. For each recipe the table prints the
// bits per element (scales included), the signal-to-quantization-noise ratio, the fraction of
// values saturated and flushed to zero, and the relative error on the smallest tenth of values.
// Then the smallest case of why granularity matters: a row of one 100 and many 0.1s.
#include <octet/octet.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

struct row_result {
    double bits_per_element, sqnr_db, saturated, flushed, small_error;
};

template <class Recipe>
row_result run(const std::vector<float>& x, std::size_t rows, std::size_t cols, double small_threshold) {
    using namespace octet;
    quantized_tensor<Recipe> q(rows, cols, /*pad=*/false);
    quantize_options opt;
    opt.collect_stats = true;
    const auto r = quantize<Recipe>(on_host(), matrix_ref<const float>(x.data(), rows, cols), q.ref(), {}, opt);
    std::vector<float> y(x.size());
    dequantize(on_host(), q.cref(), matrix_ref<float>(y.data(), rows, cols));
    double num = 0, den = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
        if (std::fabs(x[i]) <= small_threshold) {
            num += (x[i] - y[i]) * (x[i] - y[i]);
            den += static_cast<double>(x[i]) * x[i];
        }
    const double bits = 8.0 * (q.layout().data_bytes + q.layout().scale_bytes) / static_cast<double>(rows * cols) +
                        (Recipe::two_level ? 32.0 / static_cast<double>(rows * cols) : 0.0);
    return {bits, r.rowwise.sqnr_db(), r.rowwise.saturated_fraction(), r.rowwise.flushed_fraction(),
            std::sqrt(num / den)};
}

template <class Recipe>
void print(const char* name, const std::vector<float>& x, std::size_t rows, std::size_t cols, double small) {
    const row_result r = run<Recipe>(x, rows, cols, small);
    std::printf("  %-24s %6.2f %9.1f %10.4f%% %9.2f%% %12.3f\n", name, r.bits_per_element, r.sqnr_db, 100 * r.saturated,
                100 * r.flushed, r.small_error);
}

template <class Recipe>
void print_row(const char* name, const std::vector<float>& row) {
    using namespace octet;
    quantized_tensor<Recipe> q(1, row.size());
    quantize<Recipe>(on_host(), matrix_ref<const float>(row.data(), 1, row.size()), q.ref());
    std::printf("  %-24s 100 -> %-8g  0.1 (same block as 100) -> %-9g  0.1 (a block of its own) -> %g\n", name,
                static_cast<double>(q.cref().value(0, 0)), static_cast<double>(q.cref().value(0, 1)),
                static_cast<double>(q.cref().value(0, row.size() - 1)));
}

}  // namespace

int main() {
    using namespace octet;
    namespace r = recipes;
    const std::size_t rows = 256, cols = 1024;
    std::mt19937_64 g(2026);
    std::student_t_distribution<float> t(3.0f);
    std::vector<float> x(rows * cols);
    for (auto& v : x) v = t(g);
    for (std::size_t k = 0; k < 40; ++k) x[(k * 7919) % x.size()] = (k % 2 ? -1.0f : 1.0f) * 2000.0f;  // outliers
    std::vector<float> mags(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) mags[i] = std::fabs(x[i]);
    std::nth_element(mags.begin(), mags.begin() + mags.size() / 10, mags.end());
    const double small = mags[mags.size() / 10];

    std::printf("A %zu x %zu heavy-tailed tensor (Student-t, 3 dof) with 40 outliers of +-2000\n\n", rows, cols);
    std::printf("  %-24s %6s %9s %11s %10s %12s\n", "recipe", "bits", "SQNR dB", "saturated", "flushed",
                "small-10% err");
    print<r::tensorwise_e4m3>("tensorwise E4M3", x, rows, cols, small);
    print<r::tensorwise_e5m2>("tensorwise E5M2", x, rows, cols, small);
    print<r::rowwise_e4m3>("rowwise E4M3", x, rows, cols, small);
    print<r::blockwise_1x128>("1x128 E4M3 (DeepSeek)", x, rows, cols, small);
    print<r::blockwise_128x128>("128x128 E4M3 (weights)", x, rows, cols, small);
    print<r::mxfp8_e4m3>("MXFP8 E4M3", x, rows, cols, small);
    print<r::mxfp8_e4m3_ceil>("MXFP8 E4M3, round-up", x, rows, cols, small);
    print<r::mxfp8_e5m2>("MXFP8 E5M2", x, rows, cols, small);
    print<r::mxfp6_e2m3>("MXFP6 E2M3", x, rows, cols, small);
    print<r::mxfp6_e3m2>("MXFP6 E3M2", x, rows, cols, small);
    print<r::mxfp4>("MXFP4", x, rows, cols, small);
    print<r::nvfp4>("NVFP4", x, rows, cols, small);
    using tensorwise_fp4 = recipe<e2m1, per_tensor, scale::amax_ratio<0>>;
    print<tensorwise_fp4>("tensorwise FP4 (custom)", x, rows, cols, small);

    std::printf("\nThe smallest case: one row of 100 followed by 127 values of 0.1\n");
    std::vector<float> row(128, 0.1f);
    row[0] = 100.0f;
    print_row<r::tensorwise_e4m3>("tensorwise E4M3", row);
    print_row<tensorwise_fp4>("tensorwise FP4", row);
    print_row<r::mxfp4>("MXFP4 (32 per scale)", row);
    print_row<r::nvfp4>("NVFP4 (16 per scale)", row);
    print_row<r::blockwise_1x128>("1x128 E4M3", row);
    std::printf(
        "\nFP4 has 8 magnitudes from 0.5 to 6: one scale for 100 cannot also hold 0.1, so a coarse scale\n"
        "flushes it; a finer block gives the 0.1s a scale of their own. E4M3's wider exponent range\n"
        "keeps 0.1 even next to 100 (0.1 / (100/448) = 0.448 is above E4M3's smallest subnormal).\n");
    return 0;
}
