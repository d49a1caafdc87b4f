// octet/optim/detail/team.hpp: the "team" that runs one block of the fused step or of a moment
// codec, and the slice functions that every team shares.
//
// A block (optim_block = 256 elements) is processed by a team of members, each owning a
// contiguous slice of per_member elements. On the host the team is one member with the whole
// block; on the device it is a warp, 8 elements per lane (optim/detail/warp_team.cuh). The block
// functions (adamw_block, encode/decode of moments) are written once against this interface:
//   per_member, rank(), reduce<Lanes>(group_stats), sum(int), load(src, valid, dst, vectorized),
//   store(dst, valid, src, vectorized)
// Reductions are max/min (group_stats) and integer sums, which give the same result in any
// order, so a warp and a serial loop agree bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "octet/config.hpp"
#include "octet/core/philox.hpp"
#include "octet/optim/state_codec.hpp"

namespace octet {
namespace optim_detail {

/// The host team: one member that owns the whole block.
struct host_team {
    static constexpr int per_member = optim_block;
    OCTET_HD int rank() const { return 0; }
    template <int Lanes>
    OCTET_HD group_stats reduce(group_stats s) const {
        static_assert(Lanes == 1, "host_team: one member covers whole groups");
        return s;
    }
    OCTET_HD int sum(int x) const { return x; }
    template <class T>
    OCTET_OPTIM_HD void load(const T* src, int valid, T (&dst)[per_member], bool) const {
        for (int i = 0; i < valid; ++i) dst[i] = src[i];
        for (int i = valid; i < per_member; ++i) dst[i] = T{};
    }
    template <class T>
    OCTET_OPTIM_HD void store(T* dst, int valid, const T (&src)[per_member], bool) const {
        for (int i = 0; i < valid; ++i) dst[i] = src[i];
    }
};

/// Elements of a member's slice that lie in one group, groups per slice, members per group.
template <class Codec, int P>
struct slice_shape {
    static constexpr int span = P < Codec::group ? P : Codec::group;
    static constexpr int groups = P / span;
    static constexpr int lanes = Codec::group / span;
    static_assert(P % span == 0 && Codec::group % span == 0, "octet: a team slice must tile the codec's groups");
};

/// Decodes a member's slice. Codes beyond `valid` must be 0 (team.load fills them so); they decode
/// to 0. No per-element conditions, so that host loops vectorize and warps do not diverge.
template <class Codec, moment K, int P>
OCTET_OPTIM_HD void decode_slice(const typename Codec::code_type (&codes)[P], const typename Codec::meta_type* meta,
                                 std::size_t start, int valid, const codec_context& ctx, float (&out)[P]) {
    using shape = slice_shape<Codec, P>;
    const codec_context tables = ctx;  // a local copy: the stores below cannot alias it (host vectorization)
    OCTET_OPTIM_UNROLL
    for (int j = 0; j < shape::groups; ++j) {
        typename Codec::decoder d{};
        if constexpr (Codec::has_meta) {
            if (j * shape::span < valid) d = Codec::prepare_decode(meta[(start + j * shape::span) / Codec::group]);
        } else {
            (void)meta;
        }
        OCTET_OPTIM_UNROLL
        for (int i = j * shape::span; i < (j + 1) * shape::span; ++i)
            out[i] = Codec::template decode<K>(codes[i], d, tables);  // code 0 (beyond valid) decodes to 0
    }
}

/// Where a stochastically rounding codec's bits come from: element i of the slice (global index
/// first_index + i, first_index a multiple of 4) draws word (i & 3) of
/// rng.block(moment_random_block<K>(first_index + i)) (state_codec.hpp). Ignored by other codecs.
struct moment_bits {
    philox_stream rng{};
    std::uint64_t first_index = 0;
};

/// Encodes a member's slice: maps each value into the codec's domain (Codec::forward), computes
/// each group's meta from the whole group (team reduction), writes it (the group's first member
/// does), and fills codes. Values beyond `valid` must be 0: zeros change no group statistic, and
/// their codes are not stored.
template <class Codec, moment K, class Team, int P>
OCTET_OPTIM_HD void encode_slice(const Team& team, const float (&x)[P], std::size_t start, int valid,
                                 typename Codec::meta_type* meta, const codec_context& ctx,
                                 typename Codec::code_type (&codes)[P], const moment_bits& bits = {}) {
    using shape = slice_shape<Codec, P>;
    const codec_context tables = ctx;  // a local copy: the stores below cannot alias it (host vectorization)
    float y[P];                        // the codec's domain (the square root of a second moment in the 8-bit codecs)
    OCTET_OPTIM_UNROLL
    for (int i = 0; i < P; ++i) y[i] = Codec::template forward<K>(x[i]);
    OCTET_OPTIM_UNROLL
    for (int j = 0; j < shape::groups; ++j) {
        typename Codec::encoder e{};
        if constexpr (Codec::has_meta) {
            group_stats s = stats_of<shape::span>(y + j * shape::span);  // zeros beyond valid do not count
            s = team.template reduce<shape::lanes>(s);                   // every member calls: warp shuffles
            const typename Codec::meta_type mt = Codec::template make_meta<K>(s);
            const bool leader = (team.rank() % shape::lanes) == 0;
            if (leader && j * shape::span < valid) meta[(start + j * shape::span) / Codec::group] = mt;
            e = Codec::prepare_encode(mt);
        } else {
            (void)team, (void)start, (void)meta;
        }
        if constexpr (codec_uses_random_bits_v<Codec>) {
            static_assert(shape::span % 4 == 0, "octet: a stochastic codec's slice covers whole Philox blocks of 4");
            philox4 r4{};
            OCTET_OPTIM_UNROLL
            for (int i = j * shape::span; i < (j + 1) * shape::span; ++i) {
                if ((i & 3) == 0)
                    r4 = bits.rng.block(moment_random_block<K>(bits.first_index + static_cast<std::uint64_t>(i)));
                codes[i] = Codec::template encode<K>(y[i], e, tables, r4.v[i & 3]);
            }
        } else {
            (void)bits;
            OCTET_OPTIM_UNROLL
            for (int i = j * shape::span; i < (j + 1) * shape::span; ++i)
                codes[i] = Codec::template encode<K>(y[i], e, tables);
        }
    }
}

/// Writes the zero state (codes 0, meta zero) over a member's slice.
template <class Codec, class Team, int P>
OCTET_OPTIM_HD void zero_slice(const Team& team, std::size_t start, int valid, typename Codec::code_type* codes,
                               typename Codec::meta_type* meta, bool vectorized) {
    using shape = slice_shape<Codec, P>;
    typename Codec::code_type zeros[P];
    OCTET_OPTIM_UNROLL
    for (int i = 0; i < P; ++i) zeros[i] = typename Codec::code_type{};
    team.store(codes + start, valid, zeros, vectorized);
    if constexpr (Codec::has_meta) {
        const bool leader = (team.rank() % shape::lanes) == 0;
        OCTET_OPTIM_UNROLL
        for (int j = 0; j < shape::groups; ++j)
            if (leader && j * shape::span < valid)
                meta[(start + j * shape::span) / Codec::group] = typename Codec::meta_type{};
    } else {
        (void)meta;
    }
}

}  // namespace optim_detail
}  // namespace octet
