// examples/08_training/gate/codec.hpp: the gradient codec's checks: the Hadamard transform against its float64
// matrix definition, each wire format's error against float64, and error feedback's residuals.
#pragma once

#include <octet/octet.hpp>
#include <octet/reference/codec.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"

namespace train {
namespace gate {

/// Gradient-like values: normal, per-element scales over four decades, a few large outliers.
inline std::vector<float> gradient_like(std::mt19937_64& g, std::size_t n) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> e(-3.0f, 1.0f), p(0.0f, 1.0f);
    std::vector<float> x(n);
    for (auto& v : x) v = nd(g) * std::pow(10.0f, e(g)) * (p(g) < 0.002f ? 100.0f : 1.0f);
    return x;
}

/// The rounding bound of one transform of a Hadamard block B = 2^k (codec/hadamard.hpp): each of
/// the k butterfly stages rounds every element once (a stage is sqrt 2 times an orthogonal map, so
/// its rounding adds at most u ||x|| after normalization), plus the multiply by c and c's own
/// rounding: (k + 2) u ||x|| (the header quotes (k / 2 + 1) u as typical).
inline double transform_rounding(std::uint32_t block) {
    return (octet::log2_exact(block) + 2) * float_u;
}

/// Forward transform y of x against the float64 transform from the matrix definition, and
/// ||y|| against ||x|| (an isometry up to the same rounding).
inline std::vector<gate_check> check_hadamard(const std::vector<float>& x, const std::vector<float>& y,
                                              std::uint32_t block, std::uint64_t seed) {
    const std::vector<double> x64(x.begin(), x.end());
    const auto y64 = octet::reference::transform_forward_f64(octet::transform_kind::hadamard, x64, block, seed);
    const double nx = norm2(x), lim = transform_rounding(block);
    const std::string on = "randomized Hadamard, block " + std::to_string(block) + ", " + std::to_string(x.size()) +
                           " elements (ragged tail)";
    return {make_check("codec.hadamard_vs_float64",
                       y.size() == y64.size() ? dist2(y, y64) / nx : std::numeric_limits<double>::infinity(), lim,
                       "||T x - T64 x|| / ||x||, " + on +
                           "; limit (log2 B + 2) u, a stage's rounding per butterfly "
                           "stage, the scale c and its rounding"),
            make_check("codec.hadamard_norm", std::fabs(norm2(y) - nx) / nx, lim,
                       "| ||T x|| - ||x|| | / ||x|| (orthogonality), " + on +
                           "; limit (log2 B + 2) u (T64 is an isometry, then the triangle inequality)")};
}

/// Inverse after forward: x_back against x, within twice one transform's rounding.
inline gate_check check_hadamard_roundtrip(const std::vector<float>& x, const std::vector<float>& x_back,
                                           std::uint32_t block) {
    return make_check("codec.hadamard_roundtrip", dist2(x_back, x) / norm2(x), 2.0 * transform_rounding(block),
                      "||T^-1 T x - x|| / ||x||, block " + std::to_string(block) +
                          "; limit 2 (log2 B + 2) u (two transforms, each within its rounding bound)");
}

inline std::string codec_name(const octet::codec_config& cfg) {
    return std::string(octet::wire_format_name(cfg.format)) + (cfg.stochastic ? "_stochastic" : "");
}

/// One encode/decode of x: ||x_hat - x|| / ||x|| within octet::error_bound (codec.hpp's worst case).
inline gate_check check_codec_error(const octet::codec_config& cfg, const std::vector<float>& x,
                                    const std::vector<float>& x_hat) {
    const double nx = norm2(x);
    const octet::codec_bound b = octet::error_bound(cfg, x.size());
    return make_check("codec." + codec_name(cfg) + ".error", dist2(x_hat, x) / nx, b.of(nx) / nx,
                      "encode/decode of " + std::to_string(x.size()) + " gradient-like elements (" +
                          octet::transform_name(cfg.transform) + " " + std::to_string(cfg.block) +
                          "): ||x_hat - x|| / ||x|| against octet::error_bound, the codec's documented worst case "
                          "beta ||x|| + eta sqrt(L)");
}

/// Error feedback: after encoding x_in = g + e_prev, the carried residual e must be x_in - x_hat
/// (x_hat the decoded message). It is T^-1 (y - deq) while x_hat is T^-1 deq and y = T x_in, so
/// they differ by three transforms' rounding, (k + 2) u (||e|| + ||x_hat|| + ||x_in||), plus the
/// subtraction y - deq (u ||e||), plus the residual's storage (bf16: 2^-8 ||e||, feedback.hpp).
inline gate_check check_feedback_residual(const octet::codec_config& cfg, octet::residual_storage storage,
                                          const std::vector<float>& x_in, const std::vector<float>& x_hat,
                                          const std::vector<float>& residual) {
    std::vector<double> expect(x_in.size());
    for (std::size_t i = 0; i < x_in.size(); ++i)
        expect[i] = static_cast<double>(x_in[i]) - static_cast<double>(x_hat[i]);
    const double nx = norm2(x_in), ne = norm2(residual) * (1.0 + 0x1p-7), nh = norm2(x_hat);
    const double k2 = cfg.transform == octet::transform_kind::hadamard ? transform_rounding(cfg.block) : 0.0;
    const double store = storage == octet::residual_storage::bf16 ? 0x1p-8 : 0.0;
    const double limit = (k2 * (ne + nh + nx) + float_u * ne + store * ne) / nx;
    return make_check(std::string("codec.feedback_") + octet::residual_storage_name(storage),
                      dist2(residual, expect) / nx, limit,
                      "error feedback (" + codec_name(cfg) + ", residual in " + octet::residual_storage_name(storage) +
                          "), second step: ||e - (g + e_prev - x_hat)|| / ||g + e_prev||; limit: three transforms' "
                          "rounding (log2 B + 2) u on ||e||, ||x_hat||, ||x_in||, the subtraction, and the storage's "
                          "rounding");
}

inline std::vector<gate_check> codec_checks(octet::host_executor ex, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::vector<gate_check> out;
    const std::size_t n = 2500;  // two full 1024-blocks and a ragged one
    const std::uint32_t block = 1024;
    const auto x = gradient_like(g, n);
    std::vector<float> y(octet::transform_length(octet::transform_kind::hadamard, n, block)), back(n);
    octet::transform_forward(ex, octet::transform_kind::hadamard, octet::as_cspan(x), octet::as_span(y), block, seed);
    octet::transform_inverse(ex, octet::transform_kind::hadamard, octet::as_cspan(y), octet::as_span(back), block,
                             seed);
    for (auto& c : check_hadamard(x, y, block, seed)) out.push_back(std::move(c));
    out.push_back(check_hadamard_roundtrip(x, back, block));

    const std::size_t m = 5000;
    const auto grad = gradient_like(g, m);
    const octet::wire_format formats[] = {octet::wire_format::e4m3, octet::wire_format::e5m2, octet::wire_format::mxfp8,
                                          octet::wire_format::nvfp4};
    auto round_trip = [&](const octet::codec_config& cfg, const std::vector<float>& in, octet::encode_options opt) {
        std::vector<std::uint8_t> msg(octet::encoded_size(cfg, in.size()));
        octet::encode_gradient(ex, cfg, octet::as_cspan(in), octet::as_span(msg), opt);
        std::vector<float> x_hat(in.size());
        octet::decode_gradient(ex, octet::as_cspan(msg), octet::as_span(x_hat));
        return x_hat;
    };
    for (int s = 0; s < 2; ++s)
        for (auto f : formats) {
            if (s == 1 && f != octet::wire_format::e4m3) continue;  // stochastic rounding: one format
            const octet::codec_config cfg{f, octet::transform_kind::hadamard, block, 0, seed + 1, s == 1};
            out.push_back(check_codec_error(cfg, grad, round_trip(cfg, grad, {})));
        }
    const auto grad2 = gradient_like(g, m);
    for (auto storage : {octet::residual_storage::f32, octet::residual_storage::bf16}) {
        const octet::codec_config cfg{
            octet::wire_format::e4m3, octet::transform_kind::hadamard, block, 0, seed + 2, false};
        octet::error_feedback fb(m, storage);
        octet::encode_options opt;
        opt.feedback = fb.view();
        round_trip(cfg, grad, opt);
        const auto e1 = fb.values();
        std::vector<float> x_in(m);
        for (std::size_t i = 0; i < m; ++i) x_in[i] = grad2[i] + e1[i];  // what the codec adds, in float
        const auto x_hat = round_trip(cfg, grad2, opt);
        out.push_back(check_feedback_residual(cfg, storage, x_in, x_hat, fb.values()));
    }
    return out;
}

}  // namespace gate
}  // namespace train
