// Example 06: gradient codecs. Encodes realistic gradients with each codec (E4M3, E5M2, MXFP8,
// NVFP4; identity or randomized-Hadamard transform) and prints the relative L2 error, cosine
// similarity, worst 128-block error, the error on the smallest-magnitude decile, and the bytes on
// the wire; then the "100 and 0.1" case over many steps: what nearest rounding, stochastic rounding
// and error feedback do to a small component that shares a block with a large one.
//
//   build/default/examples/example_06_gradient_codec
//
// The multi-process variant (the same codecs as a compressed all-reduce over MPI) is
// tests/mpi/example_gradient_codec_mpi.cpp:
//   mpirun -np 4 build/default/tests/mpi/example_06_gradient_codec_mpi
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "octet/codec/codec.hpp"
#include "octet/codec/metrics.hpp"

namespace {

/// A weight gradient of a 256 x 512 layer: rank-8 signal, a few outlier input channels (30x), and
/// heavy-tailed noise (Student t, 3 degrees of freedom), at a typical gradient scale of 1e-3.
std::vector<float> layer_gradient(std::mt19937_64& g) {
    const int rows = 256, cols = 512, rank = 8;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::student_t_distribution<float> t(3.0f);
    std::vector<float> a(rows * rank), b(cols * rank), out(rows * cols);
    for (auto& x : a) x = nd(g);
    for (auto& x : b) x = nd(g);
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j) {
            float s = 0;
            for (int q = 0; q < rank; ++q) s += a[i * rank + q] * b[j * rank + q];
            out[i * cols + j] = 1e-3f * (s * (j % 97 == 0 ? 30.0f : 1.0f) + 0.5f * t(g));
        }
    return out;
}

/// Heavy-tailed and sparse-ish: an embedding gradient where a few rows carry most of the energy.
std::vector<float> embedding_gradient(std::mt19937_64& g) {
    std::student_t_distribution<float> t(1.5f);
    std::vector<float> out(1 << 17);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = 1e-4f * t(g) * ((i / 512) % 16 == 0 ? 50.0f : 1.0f);
    return out;
}

}  // namespace

int main() {
    using namespace octet;
    std::mt19937_64 g(2026);
    struct named {
        const char* name;
        std::vector<float> x;
    } grads[] = {{"layer (low rank + outlier channels)", layer_gradient(g)},
                 {"embedding (heavy tails)", embedding_gradient(g)}};

    std::printf("codec                  transform  rel.L2    cosine      worst128  small10%%  bytes     bits/elt\n");
    for (const auto& grad : grads) {
        std::printf("-- %s, %zu elements, %zu bytes as float\n", grad.name, grad.x.size(), 4 * grad.x.size());
        for (const wire_format f : {wire_format::e4m3, wire_format::e5m2, wire_format::mxfp8, wire_format::nvfp4})
            for (const transform_kind t : {transform_kind::identity, transform_kind::hadamard}) {
                const codec_config cfg{f, t, 1024, 0, 7};
                std::vector<std::uint8_t> msg(encoded_size(cfg, grad.x.size()));
                encode_gradient(on_host(), cfg, grad.x, msg);
                std::vector<float> back(grad.x.size());
                decode_gradient(on_host(), msg, back);
                const codec_metrics m = measure_codec(grad.x, back, msg.size());
                std::printf("%-22s %-10s %-9.5f %-11.7f %-9.4f %-9.4f %-9zu %.3f\n", wire_format_name(f),
                            transform_name(t), m.relative_l2, m.cosine, m.worst_block, m.small_decile, m.bytes,
                            m.bits_per_element);
            }
    }

    // The 100-and-0.1 case: blocks of 16 where one element is 100 and the others are +-0.1.
    std::printf(
        "\n-- 100 and 0.1: one 100 and fifteen +-0.1 per 16 elements; error of the small components in the\n"
        "   mean of K decoded steps (a bias that does not shrink with K is a direction lost for good)\n");
    std::vector<float> x(4096);
    std::bernoulli_distribution coin(0.5);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = i % 16 == 5 ? 100.0f : (coin(g) ? 0.1f : -0.1f);
    std::printf("codec   transform  rounding     feedback   K=1       K=64      K=1024\n");
    for (const wire_format f : {wire_format::e4m3, wire_format::nvfp4})
        for (const transform_kind t : {transform_kind::identity, transform_kind::hadamard})
            for (const int mode : {0, 1, 2}) {  // 0 nearest, 1 stochastic, 2 nearest + error feedback
                error_feedback fb(x.size());
                std::vector<double> sum(x.size(), 0.0);
                std::vector<float> back(x.size());
                std::printf("%-7s %-10s %-12s %-10s", wire_format_name(f), transform_name(t),
                            mode == 1 ? "stochastic" : "nearest", mode == 2 ? "f32" : "none");
                for (int k = 0; k < 1024; ++k) {
                    codec_config cfg{f, t, 256, 0, static_cast<std::uint64_t>(k) + 1, mode == 1};
                    std::vector<std::uint8_t> msg(encoded_size(cfg, x.size()));
                    encode_options opt;
                    if (mode == 2) opt.feedback = fb.view();
                    encode_gradient(on_host(), cfg, x, msg, opt);
                    decode_gradient(on_host(), msg, back);
                    for (std::size_t i = 0; i < x.size(); ++i) sum[i] += back[i];
                    if (k == 0 || k == 63 || k == 1023) {
                        double e = 0, s = 0;
                        for (std::size_t i = 0; i < x.size(); ++i)
                            if (i % 16 != 5) {
                                const double mean = sum[i] / (k + 1);
                                e += (mean - x[i]) * (mean - x[i]), s += static_cast<double>(x[i]) * x[i];
                            }
                        std::printf(" %-9.4f", std::sqrt(e / s));
                    }
                }
                std::printf("\n");
            }
    return 0;
}
