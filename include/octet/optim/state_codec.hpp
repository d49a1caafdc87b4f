// octet/optim/state_codec.hpp: compressors for Adam's two moments, one interface, one policy type
// per codec.
//
//   octet::state_codec::fp32           float, no compression                       4 B/element
//   octet::state_codec::bf16_stochastic
//                                      bfloat16, stochastic rounding (Philox)      2 B/element
//   octet::state_codec::bf16           bfloat16, nearest-even: stalls slow drifts  2 B/element
//                                      of v (see "bf16 and beta2" below)
//   octet::state_codec::e4m3_scaled    FP8 E4M3, one float scale per group of 128  1 + 4/128 B
//   octet::state_codec::e4m3_expanded  FP8 E4M3 with dynamic range expansion, per
//                                      group of 128: centre, exponent k, scale    1 + 12/128 B
//   octet::state_codec::dynamic8       8-bit non-linear dynamic map, one float
//                                      absmax per block of 256                     1 + 4/256 B
//
// bf16 and beta2. With beta2 = 0.999 an update moves v by 0.001 (g^2 - v), which is below half a
// bf16 ulp (2^-9 relative) unless g^2 and v differ by more than ~2x: under nearest rounding such
// updates round back to the old code, so a slow drift of v is never realised (v from 1.0 toward
// 1.5 moves 0% in 3000 steps) and the step uses a stale second moment (tests/host/
// optim_convergence.cpp measures both). bf16_stochastic rounds up with probability equal to the
// dropped fraction of an ulp, so E[code] = v and the drift is realised in expectation; its
// one-shot error is up to 1 ulp (2^-7 |x|) instead of half. Its random bits are a pure function
// of (seed, step, element, moment): word (i mod 4) of Philox block ((i >> 2) | tag << 62) of the
// step's stream philox_stream{seed, step}, tag 1 for the first moment and 2 for the second
// (the master weights' stochastic rounding uses tag 0, i.e. blocks below 2^62), the same on
// host and device and after a resume. Codecs that round stochastically say
// `uses_random_bits = true` and take the 32 random bits as a fourth argument of encode.
//
// Every codec is a type with the same members (see `is_state_codec`): code_type, meta_type (the
// per-group metadata), group (elements per group; divides optim_block = 256), and OCTET_HD
// functions forward<moment>(x) (the value the codec stores), make_meta<moment>(stats),
// prepare_encode(meta), prepare_decode(meta), encode<moment>(forward value, encoder, ctx) and
// decode<moment>(code, decoder, ctx) -> the moment itself. A group's meta depends only on the
// group's largest and smallest non-zero magnitude (group_stats): a max and a min, so a warp
// reduction and a serial loop give the same bits in any order.
//
// The 8-bit codecs store the second moment as sqrt(v) (decode squares it back). The update only
// ever uses sqrt(v), so this costs nothing in the error that matters, and it halves the dynamic
// range in binades: second moments of a group that span 8 decades need only 4 as sqrt(v), inside
// E4M3's range. On realistic moments it halves the error of the update direction (measured in
// tests/host/optim_codecs.cpp: relative RMS 0.097 -> 0.048 for E4M3 per-group scaling).
//
// Numerics contract (tested in tests/host/optim_codecs.cpp against float64):
//   * Zero is exact: 0 encodes to code 0 and code 0 decodes to +0 in every codec, so a zeroed
//     buffer (memset 0, codes and meta alike) is the valid all-zero state.
//   * The second moment never decodes negative: its codes carry no sign (the sign bit is
//     ignored on decode in the float/bf16/E4M3 codecs; the dynamic map is unsigned).
//   * A non-zero second moment never decodes to zero: where it would underflow the codec's
//     range (E4M3 below half its smallest subnormal times the group scale, dynamic map below
//     half of 1e-7 of the block absmax, bf16 below its smallest subnormal, and a square that
//     underflows float) it rounds up to the smallest non-zero value instead. That errs on the
//     side of a smaller update. Together with eps > 0 this is the epsilon handling of the step:
//     sqrt(v) + eps >= eps > 0 always, a zero v only occurs with a zero m (never given a
//     gradient, or a zeroed block) and then the update is exactly 0, and no codec error can make
//     the denominator smaller than the true one by underflow.
//   * E4M3 encodes round to nearest-even and saturate at 448 (octet::encode); the dynamic map
//     rounds to the nearest entry in linear space (midpoint ties go up); bf16 is nearest-even,
//     bf16_stochastic rounds away from zero with probability = the dropped fraction of an ulp.
//   * Per-element error bounds (tests/host/optim_codecs.cpp checks each on 131072 realistic
//     moments against float64; for the second moment of the 8-bit codecs they hold for sqrt(v)):
//     bf16 2^-8 |x|; bf16_stochastic below 2^-7 |x|; e4m3_scaled 2^-4 |x| + 2^-10 s (s = group absmax / 448; 2^-9 s for
//     the floor); e4m3_expanded (2^(log2(1 + 2^-4) / k) - 1) |x| + 1e-5 |x| (+ the scaled term when k = 1); dynamic8
//     half the gap between the neighbouring map entries times the absmax.
//   * Non-finite moments are outside the contract: the step keeps them out (see adamw.hpp).
//
// e4m3_expanded (dynamic range expansion, after the idea in COAT, Xi et al., ICLR 2025): in a
// group of 128, let lmax and lmin be log2 of the largest and the smallest non-zero magnitude and
// L = lmax - lmin. E4M3's normal range spans T = log2(448) + 6 = 14.81 binades; a group that
// spans fewer wastes codes. The codec centres the magnitudes on c = (lmax + lmin) / 2, the
// log-space centre (the geometric mean of the extreme magnitudes), raises them to the power
// k = clamp(T / L, 1, 256), and scales so that the largest lands on 448:
//     y = 2^(k (log2|x| - c) + s),   s = log2(448) - k L / 2,     code = sign | e4m3(y)
//     |x| = 2^(c + (log2 y - s) / k)
// With k > 1 the group's range fills E4M3's normal range exactly (smallest -> 2^-6, largest ->
// 448) and the relative error shrinks to about 2^-4 / k; a group wider than T keeps k = 1 and
// is the per-group-scaled E4M3 codec. The centre is that of the extremes, not the mean of all
// log-magnitudes: it is what makes the expanded range symmetric inside the format, and a max and
// a min reduce to the same bits in any order while a float sum does not. log2/exp2 here are
// octet's own polynomials (optim/detail/float_ops.hpp), identical on host and device.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "octet/config.hpp"
#include "octet/core/bits.hpp"
#include "octet/format/encode.hpp"
#include "octet/optim/detail/dynamic_map.hpp"
#include "octet/optim/detail/float_ops.hpp"

namespace octet {

/// Elements per block of the fused step: the unit of work, of the non-finite policy, and of
/// sharding (shard boundaries are multiples of it). Every codec's group divides it.
inline constexpr int optim_block = 256;

/// Which moment a codec call encodes: the first (signed) or the second (never negative).
enum class moment { first, second };

/// Stable numeric ids (used in checkpoints and the memory ledger).
enum class state_codec_id : std::uint32_t {
    fp32 = 1,
    bf16 = 2,
    e4m3_scaled = 3,
    e4m3_expanded = 4,
    dynamic8 = 5,
    bf16_stochastic = 6
};

inline const char* state_codec_name(state_codec_id id) {
    switch (id) {
        case state_codec_id::fp32:
            return "fp32";
        case state_codec_id::bf16:
            return "bf16";
        case state_codec_id::e4m3_scaled:
            return "e4m3_scaled";
        case state_codec_id::e4m3_expanded:
            return "e4m3_expanded";
        case state_codec_id::dynamic8:
            return "dynamic8";
        case state_codec_id::bf16_stochastic:
            return "bf16_stochastic";
    }
    return "unknown";
}

/// Tables a codec may read (only dynamic8 does). On the host: host_codec_context(); in a kernel:
/// copies in shared memory (optim/adamw.cuh).
struct codec_context {
    const float* signed_values = nullptr;
    const float* signed_thresholds = nullptr;
    const float* unsigned_values = nullptr;
    const float* unsigned_thresholds = nullptr;
};

inline codec_context host_codec_context() {
    return codec_context{optim_detail::dynamic_map_signed.values, optim_detail::dynamic_map_signed.thresholds,
                         optim_detail::dynamic_map_unsigned.values, optim_detail::dynamic_map_unsigned.thresholds};
}

/// Largest magnitude and smallest non-zero magnitude of a group's finite values.
struct group_stats {
    float absmax = 0.0f;
    float minnz = std::numeric_limits<float>::infinity();
};

OCTET_OPTIM_HD group_stats stats_merge(group_stats a, group_stats b) {
    return group_stats{optim_detail::max_rn(a.absmax, b.absmax), optim_detail::min_rn(a.minnz, b.minnz)};
}
/// Statistics of x[0..count) (non-finite values are ignored, zeros count only toward absmax).
/// Non-negative finite floats order like their bit patterns, so the reduction runs on integers:
/// exact, order-free, and it vectorizes.
template <int Count>
OCTET_OPTIM_HD group_stats stats_of(const float* x) {
    std::uint32_t mx = 0u, mn = 0x7F800000u;
    OCTET_OPTIM_UNROLL
    for (int i = 0; i < Count; ++i) {
        const std::uint32_t u = float_to_bits(x[i]) & 0x7FFFFFFFu;
        const bool finite = u < 0x7F800000u;
        const std::uint32_t for_max = finite ? u : 0u;
        const std::uint32_t for_min = (finite & (u != 0u)) ? u : 0x7F800000u;
        mx = mx > for_max ? mx : for_max;
        mn = mn < for_min ? mn : for_min;
    }
    return group_stats{bits_to_float(mx), bits_to_float(mn)};
}

/// Meta (and encoder/decoder) of codecs that have none.
struct no_meta {};

namespace state_codec {

/// Float moments, no compression (the baseline).
struct fp32 {
    using code_type = float;
    using meta_type = no_meta;
    using encoder = no_meta;
    using decoder = no_meta;
    static constexpr int group = optim_block;
    static constexpr bool has_meta = false;
    static constexpr bool needs_tables = false;
    static constexpr int meta_floats = 0;
    static constexpr state_codec_id id = state_codec_id::fp32;

    template <moment K>
    OCTET_OPTIM_HD static float forward(float x) {
        return x;
    }
    template <moment K>
    OCTET_OPTIM_HD static meta_type make_meta(group_stats) {
        return {};
    }
    OCTET_OPTIM_HD static encoder prepare_encode(const meta_type&) { return {}; }
    OCTET_OPTIM_HD static decoder prepare_decode(const meta_type&) { return {}; }
    template <moment K>
    OCTET_OPTIM_HD static code_type encode(float x, const encoder&, const codec_context&) {
        return x;
    }
    template <moment K>
    OCTET_OPTIM_HD static float decode(code_type c, const decoder&, const codec_context&) {
        if constexpr (K == moment::second)
            return optim_detail::abs_rn(c);
        else
            return c;
    }
};

/// bfloat16 moments, nearest-even. Under beta2 = 0.999 updates of v below half an ulp are lost
/// (see the header comment); prefer bf16_stochastic for training.
struct bf16 {
    using code_type = ::octet::bf16;
    using meta_type = no_meta;
    using encoder = no_meta;
    using decoder = no_meta;
    static constexpr int group = optim_block;
    static constexpr bool has_meta = false;
    static constexpr bool needs_tables = false;
    static constexpr int meta_floats = 0;
    static constexpr state_codec_id id = state_codec_id::bf16;

    template <moment K>
    OCTET_OPTIM_HD static float forward(float x) {
        return x;
    }
    template <moment K>
    OCTET_OPTIM_HD static meta_type make_meta(group_stats) {
        return {};
    }
    OCTET_OPTIM_HD static encoder prepare_encode(const meta_type&) { return {}; }
    OCTET_OPTIM_HD static decoder prepare_decode(const meta_type&) { return {}; }
    template <moment K>
    OCTET_OPTIM_HD static code_type encode(float x, const encoder&, const codec_context&) {
        return keep_second_nonzero<K>(x, to_bf16(x));
    }
    /// A positive second moment never rounds to 0: the smallest bf16 subnormal stands in for it.
    template <moment K>
    OCTET_OPTIM_HD static code_type keep_second_nonzero(float x, code_type c) {
        if constexpr (K == moment::second)
            c.bits = static_cast<std::uint16_t>(c.bits |
                                                static_cast<std::uint16_t>((x > 0.0f) & ((c.bits & 0x7FFFu) == 0u)));
        return c;
    }
    template <moment K>
    OCTET_OPTIM_HD static float decode(code_type c, const decoder&, const codec_context&) {
        if constexpr (K == moment::second) c.bits &= 0x7FFFu;
        return to_float(c);
    }
};

/// bfloat16 moments, stochastic rounding with Philox bits per (seed, step, element, moment): an
/// unbiased code, so slow drifts of v are realised in expectation (see the header comment).
/// Everything but the encode (and the id) is bf16's.
struct bf16_stochastic : bf16 {
    static constexpr bool uses_random_bits = true;
    static constexpr state_codec_id id = state_codec_id::bf16_stochastic;

    template <moment K>
    OCTET_OPTIM_HD static code_type encode(float x, const encoder&, const codec_context&, std::uint32_t random_bits) {
        return keep_second_nonzero<K>(x, to_bf16_stochastic(x, random_bits));
    }
};

/// FP8 E4M3 with one float scale per group of 128: code = e4m3(x / scale), scale = absmax / 448.
struct e4m3_scaled {
    using code_type = std::uint8_t;
    struct meta_type {
        float scale;
    };
    struct encoder {
        float inv_scale;
    };
    struct decoder {
        float scale;
    };
    static constexpr int group = 128;
    static constexpr bool has_meta = true;
    static constexpr bool needs_tables = false;
    static constexpr int meta_floats = 1;
    static constexpr state_codec_id id = state_codec_id::e4m3_scaled;

    template <moment K>
    OCTET_OPTIM_HD static float forward(float x) {
        if constexpr (K == moment::second)
            return optim_detail::sqrt_rn(x);
        else
            return x;
    }
    template <moment K>
    OCTET_OPTIM_HD static meta_type make_meta(group_stats s) {
        return meta_type{optim_detail::div_rn(s.absmax, e4m3::max_finite)};
    }
    OCTET_OPTIM_HD static encoder prepare_encode(const meta_type& m) {
        return encoder{m.scale > 0.0f ? optim_detail::div_rn(1.0f, m.scale) : 0.0f};
    }
    OCTET_OPTIM_HD static decoder prepare_decode(const meta_type& m) { return decoder{m.scale}; }
    template <moment K>
    OCTET_OPTIM_HD static code_type encode(float x, const encoder& e, const codec_context&) {
        std::uint8_t c = ::octet::encode<e4m3>(optim_detail::mul_rn(x, e.inv_scale));
        if constexpr (K == moment::second)
            c = static_cast<std::uint8_t>(c |
                                          static_cast<std::uint8_t>((x > 0.0f) & ((c & 0x7Fu) == 0u)));  // the floor
        return c;
    }
    template <moment K>
    OCTET_OPTIM_HD static float decode(code_type c, const decoder& d, const codec_context&) {
        if constexpr (K == moment::second)
            return optim_detail::square_floor(optim_detail::mul_rn(::octet::decode<e4m3>(c & 0x7Fu), d.scale));
        return optim_detail::mul_rn(::octet::decode<e4m3>(c), d.scale);
    }
};

/// FP8 E4M3 with dynamic range expansion per group of 128 (see the header comment).
struct e4m3_expanded {
    using code_type = std::uint8_t;
    struct meta_type {
        float centre_log2;  ///< c: log2 of the geometric mean of the group's extreme magnitudes
        float k;            ///< expansion exponent, in [1, 256]
        float scale_log2;   ///< s: log2 of the factor that puts the largest magnitude on 448
    };
    struct encoder {
        float centre_log2, k, scale_log2;
    };
    struct decoder {
        float centre_log2, inv_k, scale_log2;
    };
    static constexpr int group = 128;
    static constexpr bool has_meta = true;
    static constexpr bool needs_tables = false;
    static constexpr int meta_floats = 3;
    static constexpr state_codec_id id = state_codec_id::e4m3_expanded;

    /// log2(448) and E4M3's normal range in binades (log2(448) - log2(2^-6)).
    static constexpr float log2_max = 8.80735492f;
    static constexpr float target_range = 14.80735492f;
    static constexpr float max_k = 256.0f;

    template <moment K>
    OCTET_OPTIM_HD static float forward(float x) {
        if constexpr (K == moment::second)
            return optim_detail::sqrt_rn(x);
        else
            return x;
    }
    template <moment K>
    OCTET_OPTIM_HD static meta_type make_meta(group_stats s) {
        using namespace optim_detail;
        if (!(s.absmax > 0.0f)) return meta_type{0.0f, 1.0f, 0.0f};  // all zero: nothing to encode
        const float lmax = log2_rn(s.absmax);
        const float lmin = log2_rn(s.minnz);
        const float range = max_rn(sub_rn(lmax, lmin), 0.0f);
        const float centre = mul_rn(add_rn(lmax, lmin), 0.5f);
        float k = max_k;
        if (range > 0.0f) k = min_rn(max_rn(div_rn(target_range, range), 1.0f), max_k);
        const float scale = fma_rn(-k, sub_rn(lmax, centre), log2_max);
        return meta_type{centre, k, scale};
    }
    OCTET_OPTIM_HD static encoder prepare_encode(const meta_type& m) {
        return encoder{m.centre_log2, m.k, m.scale_log2};
    }
    OCTET_OPTIM_HD static decoder prepare_decode(const meta_type& m) {
        return decoder{m.centre_log2, optim_detail::div_rn(1.0f, m.k), m.scale_log2};
    }
    template <moment K>
    OCTET_OPTIM_HD static code_type encode(float x, const encoder& e, const codec_context&) {
        using namespace optim_detail;
        // branch-free (selects), so that host loops vectorize; a = 0 computes a value it discards
        const float a = abs_rn(x);
        const bool nonzero = a > 0.0f;
        const float y = exp2_rn(fma_rn(e.k, sub_rn(log2_rn(nonzero ? a : 1.0f), e.centre_log2), e.scale_log2));
        std::uint32_t c = ::octet::encode<e4m3>(y);
        if constexpr (K == moment::second)
            c |= static_cast<std::uint32_t>((c & 0x7Fu) == 0u);  // the floor
        else
            c |= static_cast<std::uint32_t>((x < 0.0f) & (c != 0u)) << 7;
        return static_cast<std::uint8_t>(c & (0u - static_cast<std::uint32_t>(nonzero)));
    }
    template <moment K>
    OCTET_OPTIM_HD static float decode(code_type c, const decoder& d, const codec_context&) {
        using namespace optim_detail;
        const std::uint32_t mag = c & 0x7Fu;
        const std::uint32_t live = 0u - static_cast<std::uint32_t>(mag != 0u);  // all ones unless code 0
        const float y =
            ::octet::decode<e4m3>(static_cast<std::uint8_t>(mag | (~live & 0x38u)));  // code 0: any value, masked below
        const float a = exp2_rn(fma_rn(sub_rn(log2_rn(y), d.scale_log2), d.inv_k, d.centre_log2));
        const float r = bits_to_float(float_to_bits(a) & live);
        if constexpr (K == moment::second)
            return square_floor(r);
        else
            return bits_to_float(float_to_bits(r) ^ ((c & 0x80u) << 24));
    }
};

/// 8-bit dynamic map per block of 256 (optim/detail/dynamic_map.hpp): the first moment uses a
/// sign bit and 7 magnitude bits (1e-6 .. 1 of the block absmax), the second moment 8 unsigned
/// bits (1e-7 .. 1).
struct dynamic8 {
    using code_type = std::uint8_t;
    struct meta_type {
        float absmax;
    };
    struct encoder {
        float inv_absmax;
    };
    struct decoder {
        float absmax;
    };
    static constexpr int group = 256;
    static constexpr bool has_meta = true;
    static constexpr bool needs_tables = true;
    static constexpr int meta_floats = 1;
    static constexpr state_codec_id id = state_codec_id::dynamic8;

    template <moment K>
    OCTET_OPTIM_HD static float forward(float x) {
        if constexpr (K == moment::second)
            return optim_detail::sqrt_rn(x);
        else
            return x;
    }
    template <moment K>
    OCTET_OPTIM_HD static meta_type make_meta(group_stats s) {
        return meta_type{s.absmax};
    }
    OCTET_OPTIM_HD static encoder prepare_encode(const meta_type& m) {
        return encoder{m.absmax > 0.0f ? optim_detail::div_rn(1.0f, m.absmax) : 0.0f};
    }
    OCTET_OPTIM_HD static decoder prepare_decode(const meta_type& m) { return decoder{m.absmax}; }
    template <moment K>
    OCTET_OPTIM_HD static code_type encode(float x, const encoder& e, const codec_context& ctx) {
        using namespace optim_detail;
        const float a = mul_rn(abs_rn(x), e.inv_absmax);
        if constexpr (K == moment::second) {
            const int i = dynamic_map_index<8>(ctx.unsigned_thresholds, a);
            return static_cast<std::uint8_t>(i + static_cast<int>((x > 0.0f) & (i == 0)));  // the floor
        } else {
            const int i = dynamic_map_index<7>(ctx.signed_thresholds, a);
            return static_cast<std::uint8_t>(i | (static_cast<int>((x < 0.0f) & (i != 0)) << 7));
        }
    }
    template <moment K>
    OCTET_OPTIM_HD static float decode(code_type c, const decoder& d, const codec_context& ctx) {
        using namespace optim_detail;
        if constexpr (K == moment::second) return square_floor(mul_rn(ctx.unsigned_values[c], d.absmax));
        const float a = mul_rn(ctx.signed_values[c & 0x7Fu], d.absmax);
        return bits_to_float(float_to_bits(a) ^ (static_cast<std::uint32_t>(c & 0x80u) << 24));
    }
};

}  // namespace state_codec

/// Trait: is C one of the state codec policies (or a user type with the same members)?
template <class C, class = void>
struct is_state_codec : std::false_type {};
template <class C>
struct is_state_codec<C, std::void_t<typename C::code_type, typename C::meta_type, typename C::encoder,
                                     typename C::decoder, decltype(C::group), decltype(C::has_meta), decltype(C::id)>>
    : std::bool_constant<(optim_block % C::group == 0)> {};
template <class C>
inline constexpr bool is_state_codec_v = is_state_codec<C>::value;

/// Trait: does codec C round stochastically (encode takes 32 random bits)? False unless C says
/// `uses_random_bits = true`.
template <class C, class = void>
struct codec_uses_random_bits : std::false_type {};
template <class C>
struct codec_uses_random_bits<C, std::void_t<decltype(C::uses_random_bits)>> : std::bool_constant<C::uses_random_bits> {
};
template <class C>
inline constexpr bool codec_uses_random_bits_v = codec_uses_random_bits<C>::value;

/// The Philox block holding the random word of element `index` for moment K (header comment:
/// tag 1 first moment, 2 second moment, above every block index the master weights use).
template <moment K>
OCTET_OPTIM_HD std::uint64_t moment_random_block(std::uint64_t index) {
    return (index >> 2) | (std::uint64_t{K == moment::first ? 1u : 2u} << 62);
}

/// Number of meta entries a codec needs for n elements (0 for codecs without meta).
template <class Codec>
constexpr std::size_t state_meta_count(std::size_t n) {
    return Codec::has_meta ? (n + Codec::group - 1) / Codec::group : 0;
}

/// Bytes of one moment per element: the code plus the group's meta shared over its elements.
template <class Codec>
constexpr double state_bytes_per_element() {
    return static_cast<double>(sizeof(typename Codec::code_type)) +
           (Codec::has_meta ? static_cast<double>(sizeof(typename Codec::meta_type)) / Codec::group : 0.0);
}

/// The same, from a runtime id.
inline double state_bytes_per_element(state_codec_id id) {
    switch (id) {
        case state_codec_id::fp32:
            return state_bytes_per_element<state_codec::fp32>();
        case state_codec_id::bf16:
            return state_bytes_per_element<state_codec::bf16>();
        case state_codec_id::e4m3_scaled:
            return state_bytes_per_element<state_codec::e4m3_scaled>();
        case state_codec_id::e4m3_expanded:
            return state_bytes_per_element<state_codec::e4m3_expanded>();
        case state_codec_id::dynamic8:
            return state_bytes_per_element<state_codec::dynamic8>();
        case state_codec_id::bf16_stochastic:
            return state_bytes_per_element<state_codec::bf16_stochastic>();
    }
    throw error("octet::state_bytes_per_element: argument 'id' is not a state_codec_id");
}

}  // namespace octet
