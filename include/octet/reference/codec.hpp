// octet/reference/codec.hpp: a float64 reference for the gradient codecs, written from the
// definitions in codec/hadamard.hpp and codec/wire.hpp without their code.
//
//   * transform_forward_f64 / transform_inverse_f64: the randomized Hadamard transform straight from
//     its matrix definition, y_i = c * sum_j (-1)^popcount(i & j) d_j x_j per block (O(B^2) per block,
//     so meant for blocks up to a few thousand), in float64, zero padding included.
//   * quantize_coded_f64<Recipe>: per-block amax in double, the scale rule of reference/quantize.hpp
//     (exact arithmetic), elements through the brute-force format reference; the codes must equal the
//     codec's for the same float coordinates.
//   * codec_roundtrip_f64: the whole codec in float64 (transform, scale, encode, decode, inverse),
//     rounding only where the wire rounds (coordinates to the format, scales to their storage).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "octet/codec/hadamard.hpp"
#include "octet/codec/wire.hpp"
#include "octet/core/philox.hpp"
#include "octet/reference/format.hpp"
#include "octet/reference/quantize.hpp"

namespace octet {
namespace reference {

/// Entry (i, j) of the Sylvester-Hadamard matrix: (-1)^popcount(i & j).
inline double hadamard_entry(std::uint64_t i, std::uint64_t j) {
    std::uint64_t v = i & j;
    int parity = 0;
    while (v) parity ^= 1, v &= v - 1;
    return parity ? -1.0 : 1.0;
}

/// The random sign d_g of global index g (+1 or -1).
inline double hadamard_sign(std::uint64_t seed, std::uint64_t g) {
    const std::uint32_t word = philox_stream{seed, hadamard_sign_stream}.bits(g >> 5);
    return ((word >> (g & 31u)) & 1u) ? -1.0 : 1.0;
}

inline std::uint64_t effective_block_f64(std::uint64_t n, std::uint64_t block) {
    if (n >= block) return block;
    std::uint64_t b = 16;
    while (b < n) b *= 2;
    return b;
}

/// y = T x in float64 (L coordinates).
inline std::vector<double> transform_forward_f64(transform_kind kind, const std::vector<double>& x, std::uint64_t block,
                                                 std::uint64_t seed, std::uint64_t first_index = 0) {
    if (kind == transform_kind::identity || x.empty()) return x;
    const std::uint64_t n = x.size(), b = effective_block_f64(n, block), L = (n + b - 1) / b * b;
    const double c = 1.0 / std::sqrt(static_cast<double>(b));
    std::vector<double> y(L, 0.0);
    for (std::uint64_t base = 0; base < L; base += b)
        for (std::uint64_t i = 0; i < b; ++i) {
            double s = 0.0;
            for (std::uint64_t j = 0; j < b && base + j < n; ++j)
                s += hadamard_entry(i, j) * hadamard_sign(seed, first_index + base + j) * x[base + j];
            y[base + i] = c * s;
        }
    return y;
}

/// x = T^-1 y in float64 (the first n of the L reconstructed coordinates).
inline std::vector<double> transform_inverse_f64(transform_kind kind, const std::vector<double>& y, std::uint64_t n,
                                                 std::uint64_t block, std::uint64_t seed,
                                                 std::uint64_t first_index = 0) {
    if (kind == transform_kind::identity || n == 0)
        return std::vector<double>(y.begin(), y.begin() + static_cast<std::ptrdiff_t>(n));
    const std::uint64_t b = effective_block_f64(n, block);
    const double c = 1.0 / std::sqrt(static_cast<double>(b));
    std::vector<double> x(n);
    for (std::uint64_t base = 0; base < n; base += b)
        for (std::uint64_t j = 0; j < b && base + j < n; ++j) {
            double s = 0.0;
            for (std::uint64_t i = 0; i < b; ++i) s += hadamard_entry(j, i) * y[base + i];
            x[base + j] = hadamard_sign(seed, first_index + base + j) * c * s;
        }
    return x;
}

/// A message's scales and codes computed in float64 from float coordinates y.
struct coded_f64 {
    std::vector<std::uint32_t> stored_scale;  ///< float bits, or the one-byte code
    std::vector<double> scale;                ///< effective scale S per block
    std::vector<std::uint8_t> codes;          ///< one code per coordinate (not packed)
    double tensor_scale = 1.0;
    std::size_t scale_block = 0;
};

template <class Recipe>
coded_f64 quantize_coded_f64(const std::vector<float>& y, std::size_t scale_block) {
    using Fmt = typename Recipe::format;
    coded_f64 q;
    q.scale_block = scale_block;
    double tensor_amax = 0.0;
    for (float v : y)
        if (std::isfinite(v)) tensor_amax = std::max(tensor_amax, std::fabs(static_cast<double>(v)));
    if (Recipe::two_level)
        q.tensor_scale =
            tensor_amax > 0
                ? std::max(static_cast<double>(static_cast<float>(tensor_amax / (Fmt::max_finite_d * 448.0))),
                           std::ldexp(1.0, -126))
                : 1.0;
    q.codes.resize(y.size());
    for (std::size_t b = 0; b < y.size(); b += scale_block) {
        const std::size_t e = std::min(y.size(), b + scale_block);
        double amax = 0.0;
        for (std::size_t j = b; j < e; ++j)
            if (std::isfinite(y[j])) amax = std::max(amax, std::fabs(static_cast<double>(y[j])));
        const auto s = block_scale_f64<Recipe>(amax, q.tensor_scale);
        q.stored_scale.push_back(s.first);
        q.scale.push_back(s.second);
        for (std::size_t j = b; j < e; ++j) {
            const float v = static_cast<float>(static_cast<double>(y[j]) / s.second);
            q.codes[j] = s.second == 0.0
                             ? 0
                             : static_cast<std::uint8_t>(
                                   encode_code<Fmt, typename Recipe::rounding, typename Recipe::overflow_policy>(v, 0));
        }
    }
    return q;
}

template <class Recipe>
std::vector<double> dequantize_coded_f64(const coded_f64& q) {
    std::vector<double> y(q.codes.size());
    for (std::size_t j = 0; j < y.size(); ++j)
        y[j] = decode_code<typename Recipe::format>(q.codes[j]).value * q.scale[j / q.scale_block];
    return y;
}

/// The codec in float64: x -> T x -> (round to float, scale, encode, decode) -> T^-1.
inline std::vector<double> codec_roundtrip_f64(const codec_config& cfg, const std::vector<float>& x,
                                               std::uint64_t first_index = 0) {
    const std::vector<double> x64(x.begin(), x.end());
    const std::vector<double> y64 = transform_forward_f64(cfg.transform, x64, cfg.block, cfg.seed, first_index);
    std::vector<float> yf(y64.size());
    for (std::size_t j = 0; j < yf.size(); ++j) yf[j] = static_cast<float>(y64[j]);
    std::vector<double> yq;
    dispatch_wire_format(cfg.format, [&](auto tr) {
        using Tr = decltype(tr);
        const std::size_t Bs = cfg.scale_block ? cfg.scale_block : Tr::default_scale_block;
        yq = dequantize_coded_f64<typename Tr::recipe>(quantize_coded_f64<typename Tr::recipe>(yf, Bs));
    });
    return transform_inverse_f64(cfg.transform, yq, x.size(), cfg.block, cfg.seed, first_index);
}

}  // namespace reference
}  // namespace octet
