// octet/codec/metrics.hpp: how much an encode/decode changed a gradient, in float64.
//
//   octet::codec_metrics m = octet::measure_codec(x, x_hat, msg.size());
//   m.relative_l2, m.cosine, m.worst_block, m.small_decile, m.bytes, m.bits_per_element
//
// Definitions (x the original, x_hat the decoded, e = x_hat - x, all sums in double):
//   relative_l2    ||e|| / ||x||                                  (0 when both are zero)
//   cosine         <x, x_hat> / (||x|| ||x_hat||)                  (1 when both are zero, 0 when one is)
//   worst_block    max over blocks of `block` elements (default 128) of ||e_b|| / ||x_b||; a block
//                  with ||x_b|| = 0 is measured against the root-mean-square block norm instead
//   small_decile   ||e_S|| / ||x_S|| over S, the ceil(n/10) coordinates of smallest |x| (ties by
//                  index); when ||x_S|| = 0 (a sparse gradient) it is ||e_S|| / (||x|| sqrt(|S|/n))
//   bytes          bytes on the wire; bits_per_element = 8 bytes / n; compression = 4 n / bytes
// Non-finite coordinates are outside the metrics' contract (they propagate as NaN).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <vector>

#include "octet/core/check.hpp"
#include "octet/core/span.hpp"

namespace octet {

struct codec_metrics {
    double relative_l2 = 0.0;
    double cosine = 1.0;
    double worst_block = 0.0;
    std::size_t worst_block_index = 0;
    double small_decile = 0.0;
    std::size_t bytes = 0;
    double bits_per_element = 0.0;
    double compression = 0.0;  ///< float32 bytes / wire bytes
};

inline codec_metrics measure_codec(span<const float> x, span<const float> x_hat, std::size_t wire_bytes,
                                   std::size_t block = 128) {
    constexpr const char* fn = "octet::measure_codec";
    OCTET_REQUIRE(x.size() == x_hat.size(), fn, "x_hat",
                  detail::message("has ", x_hat.size(), " elements; x has ", x.size()));
    OCTET_REQUIRE(block > 0, fn, "block", "is 0; pass the number of elements per block (for example 128)");
    codec_metrics m;
    const std::size_t n = x.size();
    m.bytes = wire_bytes;
    m.bits_per_element = n ? 8.0 * static_cast<double>(wire_bytes) / static_cast<double>(n) : 0.0;
    m.compression = wire_bytes ? 4.0 * static_cast<double>(n) / static_cast<double>(wire_bytes) : 0.0;
    if (n == 0) return m;
    double xx = 0, yy = 0, xy = 0, ee = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const double a = x[i], b = x_hat[i];
        xx += a * a, yy += b * b, xy += a * b, ee += (b - a) * (b - a);
    }
    m.relative_l2 = xx > 0 ? std::sqrt(ee / xx) : (ee > 0 ? INFINITY : 0.0);
    m.cosine = (xx > 0 && yy > 0) ? xy / std::sqrt(xx * yy) : (xx == 0 && yy == 0 ? 1.0 : 0.0);

    const std::size_t nb = (n + block - 1) / block;
    const double rms_block = std::sqrt(xx / static_cast<double>(nb));
    for (std::size_t b = 0; b < nb; ++b) {
        double bx = 0, be = 0;
        for (std::size_t i = b * block; i < std::min(n, (b + 1) * block); ++i) {
            const double a = x[i], d = static_cast<double>(x_hat[i]) - a;
            bx += a * a, be += d * d;
        }
        const double ref = bx > 0 ? std::sqrt(bx) : rms_block;
        const double r = ref > 0 ? std::sqrt(be) / ref : (be > 0 ? INFINITY : 0.0);
        if (r > m.worst_block || b == 0) m.worst_block = r, m.worst_block_index = b;
    }

    const std::size_t k = (n + 9) / 10;
    std::vector<std::size_t> idx(n);
    std::iota(idx.begin(), idx.end(), std::size_t{0});
    std::nth_element(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k - 1), idx.end(),
                     [&](std::size_t a, std::size_t b) {
                         const float fa = std::fabs(x[a]), fb = std::fabs(x[b]);
                         return fa < fb || (fa == fb && a < b);
                     });
    double sx = 0, se = 0;
    for (std::size_t t = 0; t < k; ++t) {
        const std::size_t i = idx[t];
        const double a = x[i], d = static_cast<double>(x_hat[i]) - a;
        sx += a * a, se += d * d;
    }
    const double ref = sx > 0 ? std::sqrt(sx) : std::sqrt(xx * static_cast<double>(k) / static_cast<double>(n));
    m.small_decile = ref > 0 ? std::sqrt(se) / ref : (se > 0 ? INFINITY : 0.0);
    return m;
}

}  // namespace octet
