// octet/core/philox.hpp: Philox4x32-10, a counter-based generator identical on host and device.
//
// Stochastic rounding in octet is reproducible: the random bits for element i of a stream are
// a pure function of (seed, offset, i), so a host run and a device run, or a run resumed from
// a checkpoint, draw the same bits whatever the thread layout.
//
//   octet::philox_stream rng{seed, offset};
//   std::uint32_t r = rng.bits(i);          // 32 uniform bits for element i
//   auto four = rng.block(i / 4);           // the 4 words of elements 4*(i/4) .. 4*(i/4)+3
//
// Counter layout: (block lo, block hi, offset lo, offset hi), key (seed lo, seed hi). The
// algorithm is Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC'11); tests
// check the Random123 known-answer vectors.
#pragma once

#include <cstdint>

#include "octet/config.hpp"

namespace octet {

struct philox4 {
    std::uint32_t v[4];
};

namespace detail {
OCTET_HD std::uint32_t mul_hi(std::uint32_t a, std::uint32_t b) {
#if OCTET_DEVICE_PASS
    return __umulhi(a, b);
#else
    return static_cast<std::uint32_t>((static_cast<std::uint64_t>(a) * b) >> 32);
#endif
}
}  // namespace detail

/// Philox4x32 with 10 rounds on counter c and key k.
OCTET_HD philox4 philox4x32_10(philox4 c, std::uint32_t k0, std::uint32_t k1) {
    constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
    constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
    OCTET_UNROLL
    for (int round = 0; round < 10; ++round) {
        const std::uint32_t hi0 = detail::mul_hi(m0, c.v[0]), lo0 = m0 * c.v[0];
        const std::uint32_t hi1 = detail::mul_hi(m1, c.v[2]), lo1 = m1 * c.v[2];
        c = philox4{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
        k0 += w0;
        k1 += w1;
    }
    return c;
}

/// A reproducible stream of random words: element i's word depends only on (seed, offset, i).
struct philox_stream {
    std::uint64_t seed = 0;
    std::uint64_t offset = 0;

    OCTET_HD philox4 block(std::uint64_t block_index) const {
        return philox4x32_10(
            philox4{{static_cast<std::uint32_t>(block_index), static_cast<std::uint32_t>(block_index >> 32),
                     static_cast<std::uint32_t>(offset), static_cast<std::uint32_t>(offset >> 32)}},
            static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
    }
    OCTET_HD std::uint32_t bits(std::uint64_t index) const { return block(index >> 2).v[index & 3u]; }
    /// Uniform float in [0, 1) with 24 random bits.
    OCTET_HD float uniform(std::uint64_t index) const {
        return static_cast<float>(bits(index) >> 8) * (1.0f / 16777216.0f);
    }
};

}  // namespace octet
