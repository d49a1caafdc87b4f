// octet/optim/detail/dynamic_map.hpp: the non-linear 8-bit code of the blockwise dynamic codec.
//
// A "dynamic" code in the sense of Dettmers (2016, "8-bit approximations for parallelism in deep
// learning"): the magnitude bits are read as a count of leading zeros, which picks a decade, then
// a one, then the remaining bits, which are a linear position inside that decade. Large
// magnitudes (the ones that move the weights) get many fraction bits; tiny ones keep their
// order of magnitude with few. With B magnitude bits, index i in [1, 2^B):
//
//     r = floor(log2 i)          fraction bits after the leading one
//     z = B - 1 - r              leading zeros: the decade (10^-(z+1), 10^-z]
//     f = i - 2^r                position inside it
//     value(i) = 10^-z * (0.1 + 0.9 * (f + 1) / 2^r)          value(0) = 0
//
// so value(2^B - 1) = 1 (the block's absmax), the smallest non-zero value is 10^-(B-1), and
// values increase with i. The first moment uses B = 7 plus a sign bit (smallest 1e-6 of the
// block's absmax), the second moment B = 8, unsigned (smallest 1e-7).
//
// Every value is computed as one exact rational, (2^r + 9 (f + 1)) / (2^r 10^(z+1)), rounded
// once to double and once to float, so every IEEE compiler (host or nvcc's front end) builds the
// same table. Encoding is nearest in linear space by a branch-free binary search over the
// midpoints between neighbours (also exact in double before the one rounding to float); a value
// exactly on a midpoint goes to the larger neighbour.
#pragma once

#include <cstdint>
#include <limits>

#include "octet/config.hpp"
#include "octet/optim/detail/float_ops.hpp"

namespace octet {
namespace optim_detail {

template <int Bits>
struct dynamic_map {
    static constexpr int size = 1 << Bits;
    float values[size];      ///< ascending, values[0] = 0, values[size - 1] = 1
    float thresholds[size];  ///< midpoints between neighbours; thresholds[size - 1] = +Inf
};

template <int Bits>
constexpr dynamic_map<Bits> make_dynamic_map() {
    dynamic_map<Bits> m{};
    constexpr int n = 1 << Bits;
    m.values[0] = 0.0f;
    for (int i = 1; i < n; ++i) {
        int r = 0;
        while ((2 << r) <= i) ++r;
        const int z = Bits - 1 - r;
        const int f = i - (1 << r);
        double pow10 = 1.0;  // 10^(z+1), exact
        for (int k = 0; k <= z; ++k) pow10 *= 10.0;
        const double num = static_cast<double>((1 << r) + 9 * (f + 1));
        const double den = static_cast<double>(1 << r) * pow10;
        m.values[i] = static_cast<float>(num / den);
    }
    for (int i = 0; i + 1 < n; ++i)
        m.thresholds[i] =
            static_cast<float>((static_cast<double>(m.values[i]) + static_cast<double>(m.values[i + 1])) * 0.5);
    m.thresholds[n - 1] = std::numeric_limits<float>::infinity();
    return m;
}

/// The tables on the host. Device code reads copies in shared memory (see optim/adamw.cuh).
inline constexpr dynamic_map<7> dynamic_map_signed = make_dynamic_map<7>();
inline constexpr dynamic_map<8> dynamic_map_unsigned = make_dynamic_map<8>();

/// Index of the nearest table value to a >= 0 (a above 1 gives the last index): the number of
/// thresholds <= a, found in Bits branch-free steps.
template <int Bits>
OCTET_OPTIM_HD int dynamic_map_index(const float* thresholds, float a) {
    static_assert(Bits == 7 || Bits == 8, "octet: the dynamic maps have 7 or 8 magnitude bits");
    // written out step by step (not a loop) so that host compilers vectorize callers' loops
    int pos = 0;
    if constexpr (Bits == 8) pos += thresholds[127] <= a ? 128 : 0;
    pos += thresholds[pos + 63] <= a ? 64 : 0;
    pos += thresholds[pos + 31] <= a ? 32 : 0;
    pos += thresholds[pos + 15] <= a ? 16 : 0;
    pos += thresholds[pos + 7] <= a ? 8 : 0;
    pos += thresholds[pos + 3] <= a ? 4 : 0;
    pos += thresholds[pos + 1] <= a ? 2 : 0;
    pos += thresholds[pos] <= a ? 1 : 0;
    return pos;
}

}  // namespace optim_detail
}  // namespace octet
