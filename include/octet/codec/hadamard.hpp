// octet/codec/hadamard.hpp: the orthogonal transforms of the gradient codecs (host path and the
// OCTET_HD rules the kernels in hadamard.cuh share).
//
//   octet::transform_kind::hadamard   y = c H_B D x  per block of B elements (randomized Hadamard)
//   octet::transform_kind::identity   y = x          (the comparison point)
//
//   std::size_t L = octet::transform_length(kind, n, block);            // coordinates y holds
//   octet::transform_forward(octet::on_host(), kind, x, y, block, seed, first_index);  // x: n, y: L
//   octet::transform_inverse(octet::on_host(), kind, y, x, block, seed, first_index);  // y: L, x: n
//   octet::transform_scratch_bytes(ex, kind, n, block);   // host scratch either direction takes (from
//                                                          // ex.allocator when lent; 0 for identity)
//
// The randomized Hadamard transform of one block of B = 2^k elements (16 <= B <= 32768) is
// y = c * H_B * D * x, with D a diagonal of random signs, H_B the Sylvester-Hadamard matrix
// (H[i][j] = (-1)^popcount(i & j), entries +-1, H_B H_B = B I) and c = 1/sqrt(B), so the block's
// transform is orthogonal and its inverse is x = D * H_B * (c * y). It runs as a fast Walsh-Hadamard
// transform in O(B log B): log2(B) butterfly stages (a, b) -> (a + b, a - b) over index pairs that
// differ in bit s, for s = 0, 1, ..., k-1 in that order, then one multiply by c. Host and device
// apply the stages in the same order with the same float operations, so they give the same bits.
//
// Signs: element i of a message (global index g = first_index + i) is negated iff bit (g & 31)
// of philox_stream{seed, hadamard_sign_stream}.bits(g >> 5) is set. Signs depend on the global
// index only, so the shards of a vector transform exactly as the whole vector does (shards start
// on block boundaries), and ranks that share the seed share the rotation. Because the transform
// is linear and seeded identically everywhere, sums may be taken in rotated coordinates.
//
// Blocks and the ragged tail (zero padding in registers, never out of bounds):
//   * the effective block of an n-element message is B_eff = B when n >= B, otherwise the
//     smallest power of two >= max(n, 16) (a short message is not padded to a huge block);
//   * the message is cut into ceil(n / B_eff) blocks; the last one, if partial, is read as if
//     zero-padded to B_eff (the zeros live in registers or a local copy; nothing beyond x[n-1] is
//     read), so the transform produces L = ceil(n / B_eff) * B_eff coordinates;
//   * the map x -> y is an isometric embedding of R^n into R^L (||y|| = ||x|| up to rounding), and
//     the inverse reads all L coordinates and writes only x[0..n-1] (the padding's share of any
//     quantization error is discarded, which can only shrink the error).
//   So a Hadamard message of a ragged length carries at most B_eff - 1 extra coordinates. The
//   identity transform has L = n.
//
// Rounding: each butterfly stage rounds once per element (float adds), and c is the float nearest
// 1/sqrt(B) (exact for B = 4^j). Relative to the float64 transform, ||y - y64|| <= about
// (log2(B) / 2 + 1) * 2^-24 * ||x|| in practice (tests/host/codec_transform.cpp measures it).
// Non-finite inputs: a NaN or Inf in a block makes every coordinate of that block non-finite
// (the transform mixes them); the identity transform keeps them where they are.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "octet/config.hpp"
#include "octet/core/bits.hpp"
#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/philox.hpp"
#include "octet/core/span.hpp"

namespace octet {

enum class transform_kind : std::uint8_t { identity = 0, hadamard = 1 };

inline const char* transform_name(transform_kind t) {
    switch (t) {
        case transform_kind::identity:
            return "identity";
        case transform_kind::hadamard:
            return "hadamard";
    }
    return "unknown";
}

inline constexpr std::uint32_t hadamard_min_block = 16;
inline constexpr std::uint32_t hadamard_max_block = 32768;
inline constexpr int hadamard_min_log2 = 4;
inline constexpr int hadamard_max_log2 = 15;
/// Philox stream offset of the sign bits ("HADSIGNS"), separate from any other use of a seed.
inline constexpr std::uint64_t hadamard_sign_stream = 0x48414453474E5331ull;

/// log2 of a power of two (undefined for other values).
OCTET_HD int log2_exact(std::uint64_t v) {
    int k = 0;
    while ((std::uint64_t{1} << k) < v) ++k;
    return k;
}
OCTET_HD constexpr bool is_power_of_two(std::uint64_t v) {
    return v != 0 && (v & (v - 1)) == 0;
}

/// c = 1/sqrt(2^k) rounded to float (exact for even k).
OCTET_HD float hadamard_norm(int k) {
    // 2^(-k/2): even k exactly, odd k as 2^(-(k+1)/2) * sqrt(2) rounded once.
    const float half = exp2i_normal(-(k >> 1));
    return (k & 1) ? half * 0.707106781186547524f : half;  // 0.7071...f is float(1/sqrt 2); times 2^-j is exact
}

/// 32 sign bits for global indices 32 w .. 32 w + 31 (bit j set: element 32 w + j is negated).
OCTET_HD std::uint32_t hadamard_sign_word(std::uint64_t seed, std::uint64_t word) {
    return philox_stream{seed, hadamard_sign_stream}.bits(word);
}

/// x with its sign flipped when `negate` (exact, also for NaN and zero).
OCTET_HD float flip_sign_if(float x, bool negate) {
    return bits_to_float(float_to_bits(x) ^ (negate ? 0x80000000u : 0u));
}

/// The effective block of an n-element message under a configured block B (see the contract).
OCTET_HD std::uint32_t hadamard_effective_block(std::uint64_t n, std::uint32_t block) {
    if (n >= block) return block;
    std::uint32_t b = hadamard_min_block;
    while (b < n) b <<= 1;
    return b;
}

/// Coordinates the transform of an n-element message produces.
OCTET_HD std::uint64_t transform_length(transform_kind kind, std::uint64_t n, std::uint32_t block) {
    if (kind == transform_kind::identity || n == 0) return n;
    const std::uint64_t b = hadamard_effective_block(n, block);
    return (n + b - 1) / b * b;
}

namespace detail {

/// Unnormalized in-place Walsh-Hadamard transform of m = 2^k floats (m >= 8), stages s = 0 .. k-1
/// in order. Stages 0-2 run on groups of 8 (eight groups side by side, so that they vectorize),
/// later stages two at a time (stage h then 2h on each quadruple j, j+h, j+2h, j+3h): the same
/// operations on the same values in the same order as one stage per pass, in half the passes.
inline void fwht_inplace(float* v, std::size_t m) {
    if (m >= 64) {
        for (std::size_t i = 0; i < m; i += 64) {
            float a[8][8];  // a[r][g] = element r of group g
            for (int g = 0; g < 8; ++g)
                for (int r = 0; r < 8; ++r) a[r][g] = v[i + 8 * g + r];
            for (int h = 1; h < 8; h <<= 1)
                for (int r = 0; r < 8; ++r)
                    if (!(r & h))
                        for (int g = 0; g < 8; ++g) {
                            const float p = a[r][g], q = a[r + h][g];
                            a[r][g] = p + q;
                            a[r + h][g] = p - q;
                        }
            for (int g = 0; g < 8; ++g)
                for (int r = 0; r < 8; ++r) v[i + 8 * g + r] = a[r][g];
        }
    } else {
        for (std::size_t i = 0; i < m; i += 8)
            for (std::size_t h = 1; h < 8; h <<= 1)
                for (std::size_t r = i; r < i + 8; ++r)
                    if (!((r - i) & h)) {
                        const float p = v[r], q = v[r + h];
                        v[r] = p + q;
                        v[r + h] = p - q;
                    }
    }
    std::size_t h = 8;
    for (; 4 * h <= m; h <<= 2)
        for (std::size_t i = 0; i < m; i += 4 * h)
            for (std::size_t j = i; j < i + h; ++j) {
                const float a = v[j], b = v[j + h], c = v[j + 2 * h], d = v[j + 3 * h];
                const float a1 = a + b, b1 = a - b, c1 = c + d, d1 = c - d;
                v[j] = a1 + c1;
                v[j + 2 * h] = a1 - c1;
                v[j + h] = b1 + d1;
                v[j + 3 * h] = b1 - d1;
            }
    for (; h < m; h <<= 1)
        for (std::size_t i = 0; i < m; i += 2 * h)
            for (std::size_t j = i; j < i + h; ++j) {
                const float p = v[j], q = v[j + h];
                v[j] = p + q;
                v[j + h] = p - q;
            }
}

inline void check_transform_args(transform_kind kind, std::uint32_t block, const char* fn,
                                 const char* kind_arg = "kind", const char* block_arg = "block") {
    OCTET_REQUIRE(kind == transform_kind::identity || kind == transform_kind::hadamard, fn, kind_arg,
                  "is not a known transform; use transform_kind::identity or transform_kind::hadamard");
    if (kind == transform_kind::hadamard)
        OCTET_REQUIRE(is_power_of_two(block) && block >= hadamard_min_block && block <= hadamard_max_block, fn,
                      block_arg, message("is ", block, "; the Hadamard block must be a power of two in [16, 32768]"));
}

/// Sign words of global indices [g0, g0 + count): words[k] holds the bits of 32 (g0 / 32 + k) ..
/// (one Philox block serves four words). Writes (g0 + count - 1) / 32 - g0 / 32 + 1 words (at most
/// count / 32 + 2).
inline void sign_words(std::uint64_t seed, std::uint64_t g0, std::size_t count, std::uint32_t* words) {
    const std::uint64_t w0 = g0 >> 5, w1 = count ? (g0 + count - 1) >> 5 : w0;
    const philox_stream rng{seed, hadamard_sign_stream};
    for (std::uint64_t w = w0; w <= w1;) {
        const std::uint64_t block = w >> 2;
        const philox4 b = rng.block(block);
        for (; w <= w1 && (w >> 2) == block; ++w) words[w - w0] = b.v[w & 3u];
    }
}

/// out[j] = in[j] with the sign of global index g0 + j flipped (j < count).
inline void flip_signs(const float* in, float* out, std::size_t count, std::uint64_t g0, const std::uint32_t* words) {
    const std::uint64_t w0 = g0 >> 5;
    for (std::size_t j = 0; j < count; ++j) {
        const std::uint64_t g = g0 + j;
        const std::uint32_t bit = (words[static_cast<std::size_t>((g >> 5) - w0)] >> (g & 31u)) & 1u;
        out[j] = bits_to_float(float_to_bits(in[j]) ^ (bit << 31));
    }
}

/// Forward transform of one block: out[0..b) = c H D in[0..count) (zero-padded to b); `words`
/// holds count / 32 + 2 sign words of scratch.
inline void hadamard_block_forward(const float* in, std::size_t count, float* out, std::uint32_t b, std::uint64_t seed,
                                   std::uint64_t global_first, std::uint32_t* words) {
    sign_words(seed, global_first, count, words);
    flip_signs(in, out, count, global_first, words);
    for (std::size_t j = count; j < b; ++j) out[j] = 0.0f;
    fwht_inplace(out, b);
    const float c = hadamard_norm(log2_exact(b));
    for (std::size_t j = 0; j < b; ++j) out[j] = out[j] * c;
}

/// Inverse of one block: work[0..b) is overwritten; out[0..count) = D H (c in).
inline void hadamard_block_inverse(const float* in, float* work, std::size_t count, float* out, std::uint32_t b,
                                   std::uint64_t seed, std::uint64_t global_first, std::uint32_t* words) {
    std::memcpy(work, in, b * sizeof(float));
    fwht_inplace(work, b);
    const float c = hadamard_norm(log2_exact(b));
    for (std::size_t j = 0; j < count; ++j) work[j] = work[j] * c;
    sign_words(seed, global_first, count, words);
    flip_signs(work, out, count, global_first, words);
}

/// The host scratch of one transform: per chunk of blocks (parallel_for_chunks), `words_per_chunk`
/// sign words and, for the inverse, `work_per_chunk` floats (one block). Empty for the identity.
struct transform_scratch {
    std::uint32_t* words = nullptr;
    float* work = nullptr;
    std::size_t words_per_chunk = 0;
    std::size_t work_per_chunk = 0;
};

/// Blocks per chunk at least (about 64 K elements).
inline std::size_t transform_grain(std::uint32_t b) {
    return std::max<std::size_t>(1, 65536 / b);
}

/// Describes the scratch of the host transform of n elements (inverse: transform_inverse's, which
/// holds the forward's too) on a carver (see detail::scratch_carver).
inline transform_scratch carve_transform(scratch_carver& c, const host_executor& ex, transform_kind kind,
                                         std::uint64_t n, std::uint32_t block, bool inverse) {
    transform_scratch s;
    if (kind != transform_kind::hadamard || n == 0) return s;
    const std::uint32_t b = hadamard_effective_block(n, block);
    const std::size_t blocks = static_cast<std::size_t>(transform_length(kind, n, block) / b);
    const std::size_t chunks = parallel_chunks(ex, blocks, transform_grain(b));
    s.words_per_chunk = b / 32 + 2;
    s.words = c.take<std::uint32_t>(chunks * s.words_per_chunk);
    if (inverse) {
        s.work_per_chunk = b;
        s.work = c.take<float>(chunks * s.work_per_chunk);
    }
    return s;
}

/// y[0..L) = the transform of x[0..n) (n > 0, arguments checked), with scratch from carve_transform.
inline void transform_forward_host(const host_executor& ex, transform_kind kind, const float* x, std::uint64_t n,
                                   float* y, std::uint32_t block, std::uint64_t seed, std::uint64_t first_index,
                                   const transform_scratch& s) {
    if (n == 0) return;
    if (kind == transform_kind::identity) {
        std::memmove(y, x, n * sizeof(float));
        return;
    }
    const std::uint32_t b = hadamard_effective_block(n, block);
    const std::size_t blocks = static_cast<std::size_t>(transform_length(kind, n, block) / b);
    parallel_for_chunks(ex, blocks, transform_grain(b), [&](std::size_t chunk, std::size_t lo, std::size_t hi) {
        std::uint32_t* words = s.words + chunk * s.words_per_chunk;
        for (std::size_t k = lo; k < hi; ++k) {
            const std::size_t begin = k * b;
            const std::size_t count = std::min<std::size_t>(b, n - begin);
            hadamard_block_forward(x + begin, count, y + begin, b, seed, first_index + begin, words);
        }
    });
}

/// x[0..n) = the inverse transform of y[0..L) (arguments checked), with scratch from carve_transform(inverse).
inline void transform_inverse_host(const host_executor& ex, transform_kind kind, const float* y, std::uint64_t n,
                                   float* x, std::uint32_t block, std::uint64_t seed, std::uint64_t first_index,
                                   const transform_scratch& s) {
    if (n == 0) return;
    if (kind == transform_kind::identity) {
        std::memmove(x, y, n * sizeof(float));
        return;
    }
    const std::uint32_t b = hadamard_effective_block(n, block);
    const std::size_t blocks = static_cast<std::size_t>(transform_length(kind, n, block) / b);
    parallel_for_chunks(ex, blocks, transform_grain(b), [&](std::size_t chunk, std::size_t lo, std::size_t hi) {
        std::uint32_t* words = s.words + chunk * s.words_per_chunk;
        float* work = s.work + chunk * s.work_per_chunk;
        for (std::size_t k = lo; k < hi; ++k) {
            const std::size_t begin = k * b;
            const std::size_t count = std::min<std::size_t>(b, n - begin);
            hadamard_block_inverse(y + begin, work, count, x + begin, b, seed, first_index + begin, words);
        }
    });
}

/// The arguments of a forward or inverse transform of n elements whose transformed side holds
/// y_size floats (host and stream overloads); returns L = transform_length(kind, n, block).
inline std::uint64_t checked_transform_length(transform_kind kind, std::uint32_t block, std::uint64_t n,
                                              std::uint64_t y_size, const char* fn) {
    check_transform_args(kind, block, fn);
    const std::uint64_t L = transform_length(kind, n, block);
    OCTET_REQUIRE(y_size == L, fn, "y",
                  message("has ", y_size, " elements; the transform of ", n, " elements has ", L));
    return L;
}

}  // namespace detail

/// Bytes of host scratch that transform_forward or transform_inverse of n elements takes on `ex`
/// (either direction at most this; from ex.allocator when one is lent, see octet::with_allocator):
/// per chunk of blocks, the sign words and (inverse) one block of floats. 0 for the identity.
inline std::size_t transform_scratch_bytes(const host_executor& ex, transform_kind kind, std::uint64_t n,
                                           std::uint32_t block) {
    detail::check_transform_args(kind, block, "octet::transform_scratch_bytes");
    detail::scratch_carver c;
    detail::carve_transform(c, ex, kind, n, block, true);
    return c.bytes();
}

/// y (L = transform_length(kind, x.size(), block) floats) = the transform of x. Host scratch:
/// transform_scratch_bytes.
inline void transform_forward(host_executor ex, transform_kind kind, span<const float> x, span<float> y,
                              std::uint32_t block, std::uint64_t seed, std::uint64_t first_index = 0) {
    constexpr const char* fn = "octet::transform_forward";
    const std::uint64_t n = x.size();
    detail::checked_transform_length(kind, block, n, y.size(), fn);
    OCTET_REQUIRE(n == 0 || (x.data() && y.data()), fn, "x/y", "is null with a non-zero size");
    if (n == 0) return;
    detail::scratch_carver count;
    detail::carve_transform(count, ex, kind, n, block, false);
    const detail::host_scratch scratch(ex, count.bytes(), fn);
    detail::scratch_carver carver = scratch.carver();
    const detail::transform_scratch s = detail::carve_transform(carver, ex, kind, n, block, false);
    detail::transform_forward_host(ex, kind, x.data(), n, y.data(), block, seed, first_index, s);
}

/// x (n floats) = the inverse transform of y (L = transform_length(kind, n, block) floats). Host
/// scratch: transform_scratch_bytes.
inline void transform_inverse(host_executor ex, transform_kind kind, span<const float> y, span<float> x,
                              std::uint32_t block, std::uint64_t seed, std::uint64_t first_index = 0) {
    constexpr const char* fn = "octet::transform_inverse";
    const std::uint64_t n = x.size();
    detail::checked_transform_length(kind, block, n, y.size(), fn);
    OCTET_REQUIRE(n == 0 || (x.data() && y.data()), fn, "x/y", "is null with a non-zero size");
    if (n == 0) return;
    detail::scratch_carver count;
    detail::carve_transform(count, ex, kind, n, block, true);
    const detail::host_scratch scratch(ex, count.bytes(), fn);
    detail::scratch_carver carver = scratch.carver();
    const detail::transform_scratch s = detail::carve_transform(carver, ex, kind, n, block, true);
    detail::transform_inverse_host(ex, kind, y.data(), n, x.data(), block, seed, first_index, s);
}

}  // namespace octet
