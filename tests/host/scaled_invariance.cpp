// The two invariances every scaled operation owes real training data, on the host (attention's are in
// attention_padding.cpp, the linear layer's in nn_linear.cpp, the kernels' under the interpreter in
// tests/cuda/*_device.cu):
//   * scale equivariance: an input times 2^k (k from -40 to 40, through the 1e-3..1e-6 magnitudes
//     of real gradients) gives the same codes and every output times 2^k, bit for bit: every scale
//     rule is amax / max_finite or a power of two taken from the amax, so it moves with the input
//     by exactly 2^k in the normal range;
//   * padding invariance: zero rows or columns appended (padding tokens, a ragged last block, a
//     message padded to a block) leave every code, scale and output of the rest unchanged bit for
//     bit. An all-zero block takes the smallest scale of its rule, so it never changes a maximum
//     over scales, and stochastic rounding draws element (r, c) from an index that does not
//     depend on the row length.
// For quantize: every named recipe, both copies (row-wise and column-wise), stochastic rounding too.
// For the scaled GEMM: every scaling pair of training. For the codecs: every wire format, identity
// and Hadamard transforms, nearest and stochastic rounding.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "octet/codec/codec.hpp"
#include "octet/gemm/scaled_gemm.hpp"
#include "octet/quant/quantize.hpp"
#include "support/random.hpp"

namespace scaled_invariance_test {
using namespace octet;

const int kPowers[] = {-40, -23, -9, -1, 1, 8, 25, 40};

std::vector<float> normal(std::mt19937_64& g, std::size_t n, float sigma) {
    std::normal_distribution<float> d(0.0f, sigma);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}
/// Rows of a matrix [rows][cols] scaled by 2^e with e from -8 to 8 (activations and gradients vary
/// by binades from token to token), and some rows all zero (padding, masked labels).
std::vector<float> realistic(std::mt19937_64& g, std::size_t rows, std::size_t cols, float sigma) {
    std::vector<float> x = normal(g, rows * cols, sigma);
    std::uniform_int_distribution<int> e(-8, 8);
    for (std::size_t r = 0; r < rows; ++r) {
        const int k = r % 7 == 3 ? -1000 : e(g);  // every 7th row: zero
        for (std::size_t c = 0; c < cols; ++c) x[r * cols + c] = k == -1000 ? 0.0f : std::ldexp(x[r * cols + c], k);
    }
    return x;
}
std::vector<float> times_pow2(std::vector<float> x, int k) {
    for (float& v : x) v = std::ldexp(v, k);
    return x;
}
/// x [rows][cols] with `more_rows` zero rows below and `more_cols` zero columns to the right.
std::vector<float> padded(const std::vector<float>& x, std::size_t rows, std::size_t cols, std::size_t more_rows,
                          std::size_t more_cols) {
    std::vector<float> y((rows + more_rows) * (cols + more_cols), 0.0f);
    for (std::size_t r = 0; r < rows; ++r) std::memcpy(&y[r * (cols + more_cols)], &x[r * cols], cols * sizeof(float));
    return y;
}
std::uint32_t bits_of(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// ---- quantize ----------------------------------------------------------------------------------

template <class R>
quantized_tensor<R> quantized_copy(const std::vector<float>& x, std::size_t rows, std::size_t cols, bool columnwise,
                                   std::uint64_t seed) {
    quantized_tensor<R> q(columnwise ? cols : rows, columnwise ? rows : cols);
    quantize_options o;
    o.rng = philox_stream{seed, 7};
    const matrix_ref<const float> xm(x.data(), rows, cols);
    if (columnwise)
        quantize<R>(on_host(), xm, {}, q.ref(), o);
    else
        quantize<R>(on_host(), xm, q.ref(), {}, o);
    return q;
}

/// Elements of copy a (over its first rows x cols) whose code differs from b's or whose value is not
/// 2^k times b's.
template <class R>
std::size_t count_not_scaled(const quantized_tensor<R>& a, const quantized_tensor<R>& b, std::size_t rows,
                             std::size_t cols, int k) {
    std::size_t bad = 0;
    for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c) {
            bad += a.cref().code(r, c) != b.cref().code(r, c);
            const float va = a.cref().value(r, c), vb = b.cref().value(r, c);
            bad += !(va == std::ldexp(vb, k)) && !(std::isnan(va) && std::isnan(vb));
        }
    return bad;
}
/// Codes and stored scales of the first rows x cols of a against b, bit for bit (scales of the
/// blocks that hold them).
template <class R>
std::size_t count_differ(const quantized_tensor<R>& a, const quantized_tensor<R>& b, std::size_t rows,
                         std::size_t cols) {
    std::size_t bad = 0;
    const quant_layout& la = a.layout();
    for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c) {
            bad += a.cref().code(r, c) != b.cref().code(r, c);
            bad += a.cref().stored_scale(r / la.block_rows, c / la.block_cols) !=
                   b.cref().stored_scale(r / la.block_rows, c / la.block_cols);
            bad += bits_of(a.cref().value(r, c)) != bits_of(b.cref().value(r, c));
        }
    return bad;
}

template <class R>
void check_quantize(const char* name, std::uint64_t salt) {
    INFO("recipe " << name);
    auto g = octet_test::rng(salt);
    const std::size_t rows = 70, cols = 300;
    const std::vector<float> x = realistic(g, rows, cols, 1e-3f);
    for (const bool columnwise : {false, true}) {
        INFO((columnwise ? "column-wise copy" : "row-wise copy"));
        const std::size_t cr = columnwise ? cols : rows, cc = columnwise ? rows : cols;
        const auto q0 = quantized_copy<R>(x, rows, cols, columnwise, salt);
        for (const int k : kPowers) {
            INFO("k = " << k);
            CHECK(count_not_scaled(quantized_copy<R>(times_pow2(x, k), rows, cols, columnwise, salt), q0, cr, cc, k) ==
                  0);
        }
        // zero tokens below and zero features to the right: the original elements keep their bits
        const auto q1 = quantized_copy<R>(padded(x, rows, cols, 58, 84), rows + 58, cols + 84, columnwise, salt);
        CHECK(count_differ(q1, q0, cr, cc) == 0);
    }
}

using stochastic_nvfp4 =
    recipe<e2m1, block<1, 16>, scale::amax_ratio<0>, scale_storage::e4m3, round::stochastic, overflow::saturate>;
using stochastic_e4m3_1x128 =
    recipe<e4m3, block<1, 128>, scale::amax_ratio<0>, scale_storage::f32, round::stochastic, overflow::saturate>;

TEST_CASE("quantize: every named recipe is scale-equivariant and padding-invariant, bit for bit") {
    namespace rc = recipes;
    check_quantize<rc::tensorwise_e4m3>("tensorwise_e4m3", 1);
    check_quantize<rc::tensorwise_e5m2>("tensorwise_e5m2", 2);
    check_quantize<rc::rowwise_e4m3>("rowwise_e4m3", 3);
    check_quantize<rc::columnwise_e4m3>("columnwise_e4m3", 4);
    check_quantize<rc::blockwise_1x128>("blockwise_1x128", 5);
    check_quantize<rc::blockwise_128x128>("blockwise_128x128", 6);
    check_quantize<rc::mxfp8_e4m3>("mxfp8_e4m3", 7);
    check_quantize<rc::mxfp8_e5m2>("mxfp8_e5m2", 8);
    check_quantize<rc::mxfp8_e4m3_ceil>("mxfp8_e4m3_ceil", 9);
    check_quantize<rc::mxfp6_e2m3>("mxfp6_e2m3", 10);
    check_quantize<rc::mxfp6_e3m2>("mxfp6_e3m2", 11);
    check_quantize<rc::mxfp4>("mxfp4", 12);
    check_quantize<rc::nvfp4>("nvfp4", 13);
    check_quantize<with_nan_policy<rc::mxfp8_e4m3, nan_policy::per_element>>("mxfp8_e4m3, per_element", 14);
    check_quantize<with_nan_policy<rc::nvfp4, nan_policy::per_element>>("nvfp4, per_element", 15);
    check_quantize<stochastic_nvfp4>("nvfp4, stochastic rounding", 16);
    check_quantize<stochastic_e4m3_1x128>("e4m3 1x128, stochastic rounding", 17);
}

// ---- scaled GEMM -------------------------------------------------------------------------------

template <class RA, class RB>
std::vector<float> gemm(const std::vector<float>& a, const std::vector<float>& b, std::size_t M, std::size_t N,
                        std::size_t K) {
    quantized_tensor<RA> qa(M, K);
    quantized_tensor<RB> qb(N, K);
    quantize<RA>(on_host(), matrix_ref<const float>(a.data(), M, K), qa.ref());
    quantize<RB>(on_host(), matrix_ref<const float>(b.data(), N, K), qb.ref());
    std::vector<float> d(M * N, NAN);
    scaled_gemm(on_host(), qa.cref(), qb.cref(), matrix_ref<float>(d.data(), M, N));
    return d;
}

template <class RA, class RB>
void check_gemm(const char* name, std::uint64_t salt) {
    INFO("pair " << name);
    auto g = octet_test::rng(salt);
    const std::size_t M = 70, N = 48, K = 384;
    const std::vector<float> a = realistic(g, M, K, 1e-3f), b = realistic(g, N, K, 0.05f);
    const std::vector<float> d0 = gemm<RA, RB>(a, b, M, N, K);
    for (const int k : kPowers) {
        INFO("k = " << k);
        const std::vector<float> da = gemm<RA, RB>(times_pow2(a, k), b, M, N, K),
                                 db = gemm<RA, RB>(a, times_pow2(b, -k / 2), M, N, K);
        std::size_t bad_a = 0, bad_b = 0;
        for (std::size_t i = 0; i < M * N; ++i) {
            bad_a += !(da[i] == std::ldexp(d0[i], k));
            bad_b += !(db[i] == std::ldexp(d0[i], -k / 2));
        }
        CHECK(bad_a == 0);
        CHECK(bad_b == 0);
    }
    // zero tokens appended to A (rows of D), and a zero tail on the contraction (K padded to a
    // larger multiple of the blocks): D's rows of the real tokens keep their bits
    const std::size_t pm = 58, pk = 128;
    const std::vector<float> d1 = gemm<RA, RB>(padded(a, M, K, pm, pk), padded(b, N, K, 0, pk), M + pm, N, K + pk);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < M * N; ++i) bad += bits_of(d1[i]) != bits_of(d0[i]);
    CHECK(bad == 0);
    for (std::size_t i = M * N; i < d1.size(); ++i) CHECK(d1[i] == 0.0f);
}

TEST_CASE("scaled GEMM (host): every scaling pair is scale-equivariant in A and B and padding-invariant") {
    namespace rc = recipes;
    check_gemm<rc::tensorwise_e4m3, rc::tensorwise_e4m3>("tensor x tensor", 21);
    check_gemm<rc::tensorwise_e5m2, rc::tensorwise_e4m3>("E5M2 tensor x E4M3 tensor", 22);
    check_gemm<rc::rowwise_e4m3, rc::rowwise_e4m3>("row x row", 23);
    check_gemm<rc::blockwise_1x128, rc::blockwise_128x128>("1x128 x 128x128", 24);
    check_gemm<rc::blockwise_1x128, rc::blockwise_1x128>("1x128 x 1x128", 25);
    check_gemm<rc::mxfp8_e4m3, rc::mxfp8_e4m3>("MXFP8 x MXFP8", 26);
    check_gemm<rc::mxfp4, rc::mxfp4>("MXFP4 x MXFP4", 27);
    check_gemm<rc::nvfp4, rc::nvfp4>("NVFP4 x NVFP4", 28);
}

// ---- gradient codecs ---------------------------------------------------------------------------

std::vector<float> round_trip(const codec_config& cfg, const std::vector<float>& x) {
    std::vector<std::uint8_t> msg(encoded_size(cfg, x.size()));
    encode_gradient(on_host(), cfg, x, msg);
    std::vector<float> y(x.size(), NAN);
    decode_gradient(on_host(), msg, y);
    return y;
}

TEST_CASE("codecs: every wire format and transform is scale-equivariant and padding-invariant, bit for bit") {
    auto g = octet_test::rng(31);
    const std::size_t n = 5000, more = 3192;  // 5000 is no multiple of any block; 8192 is
    std::vector<float> x = realistic(g, 50, n / 50, 1e-4f);
    for (const wire_format f : {wire_format::e4m3, wire_format::e5m2, wire_format::mxfp8, wire_format::nvfp4})
        for (const transform_kind t : {transform_kind::identity, transform_kind::hadamard})
            for (const bool stochastic : {false, true}) {
                INFO(wire_format_name(f) << " " << transform_name(t) << (stochastic ? " stochastic" : " nearest"));
                codec_config cfg{f, t, 1024, 0, 41};
                cfg.stochastic = stochastic;
                const std::vector<float> y0 = round_trip(cfg, x);
                for (const int k : kPowers) {
                    INFO("k = " << k);
                    const std::vector<float> yk = round_trip(cfg, times_pow2(x, k));
                    std::size_t bad = 0;
                    for (std::size_t i = 0; i < n; ++i) bad += !(yk[i] == std::ldexp(y0[i], k));
                    CHECK(bad == 0);
                }
                std::vector<float> xp = x;
                xp.resize(n + more, 0.0f);
                const std::vector<float> yp = round_trip(cfg, xp);
                std::size_t bad = 0;
                for (std::size_t i = 0; i < n; ++i) bad += bits_of(yp[i]) != bits_of(y0[i]);
                // (the Hadamard transform mixes blocks of 1024: the zeros appended to the last, partial
                // block are the zeros the codec pads it with anyway)
                CHECK(bad == 0);
            }
}

}  // namespace scaled_invariance_test
