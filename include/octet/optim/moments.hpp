// octet/optim/moments.hpp: encode and decode whole arrays of moments with a state codec (host).
//
//   octet::encode_moments<octet::state_codec::dynamic8, octet::moment::second>(octet::on_host(), v, codes, meta);
//   octet::decode_moments<octet::state_codec::dynamic8, octet::moment::second>(octet::on_host(), codes, meta, v_out);
//
// Host scratch: none (both allocate nothing; no ..._scratch_bytes query).
// `meta` has state_meta_count<Codec>(n) entries (none for fp32/bf16). The stream overloads are in
// optim/moments.cuh; both run the same block functions as the fused step (optim/detail/team.hpp),
// so an array encoded here decodes to the same floats that the step would have used. A
// stochastically rounding codec (bf16_stochastic) draws its bits from `rng` (element i: the
// rule in state_codec.hpp with first index 0); the fused step uses philox_stream{seed, step}
// and the shard's offset, so encode_moments with that stream gives the step's codes.
#pragma once

#include <cstddef>

#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/philox.hpp"
#include "octet/core/span.hpp"
#include "octet/optim/detail/team.hpp"
#include "octet/optim/state_codec.hpp"

namespace octet {
namespace optim_detail {

template <class Codec, moment K, class Team>
OCTET_HD void encode_moments_block(const Team& team, const float* x, typename Codec::code_type* codes,
                                   typename Codec::meta_type* meta, std::size_t n, const codec_context& ctx,
                                   std::size_t block, bool vectorized, const philox_stream& rng = {}) {
    constexpr int P = Team::per_member;
    const std::size_t start = block * optim_block + static_cast<std::size_t>(team.rank()) * P;
    const int valid = start < n ? (n - start < static_cast<std::size_t>(P) ? static_cast<int>(n - start) : P) : 0;
    float xs[P];
    team.load(x + start, valid, xs, vectorized);
    typename Codec::code_type cs[P];
    encode_slice<Codec, K>(team, xs, start, valid, meta, ctx, cs, moment_bits{rng, start});
    team.store(codes + start, valid, cs, vectorized);
}

template <class Codec, moment K, class Team>
OCTET_HD void decode_moments_block(const Team& team, const typename Codec::code_type* codes,
                                   const typename Codec::meta_type* meta, float* x, std::size_t n,
                                   const codec_context& ctx, std::size_t block, bool vectorized) {
    constexpr int P = Team::per_member;
    const std::size_t start = block * optim_block + static_cast<std::size_t>(team.rank()) * P;
    const int valid = start < n ? (n - start < static_cast<std::size_t>(P) ? static_cast<int>(n - start) : P) : 0;
    typename Codec::code_type cs[P];
    team.load(codes + start, valid, cs, vectorized);
    float xs[P];
    decode_slice<Codec, K, P>(cs, meta, start, valid, ctx, xs);
    team.store(x + start, valid, xs, vectorized);
}

template <class Codec>
void check_moment_views(const char* fn, std::size_t n, std::size_t codes, std::size_t meta, const void* pc,
                        const void* pm, const void* px) {
    OCTET_REQUIRE(codes == n, fn, "codes",
                  detail::message("has ", codes, " elements for ", n, " moments; pass one code per moment"));
    OCTET_REQUIRE(meta == state_meta_count<Codec>(n), fn, "meta",
                  detail::message("has ", meta, " entries; ", n,
                                  " moments need state_meta_count = ", state_meta_count<Codec>(n)));
    OCTET_REQUIRE(n == 0 || (pc && px && (!Codec::has_meta || pm)), fn, "codes/meta/x", "is null with a non-zero size");
}

}  // namespace optim_detail

template <class Codec, moment K>
void encode_moments(host_executor ex, span<const float> x, span<typename Codec::code_type> codes,
                    span<typename Codec::meta_type> meta, const philox_stream& rng = {}) {
    static_assert(is_state_codec_v<Codec>, "octet::encode_moments: Codec must be an octet::state_codec policy");
    optim_detail::check_moment_views<Codec>("octet::encode_moments", x.size(), codes.size(), meta.size(), codes.data(),
                                            meta.data(), x.data());
    const std::size_t blocks = (x.size() + optim_block - 1) / optim_block;
    parallel_for(ex, blocks, 64, [&](std::size_t b, std::size_t e) {
        const optim_detail::host_team team;
        const codec_context ctx = host_codec_context();
        for (std::size_t blk = b; blk < e; ++blk)
            optim_detail::encode_moments_block<Codec, K>(team, x.data(), codes.data(), meta.data(), x.size(), ctx, blk,
                                                         false, rng);
    });
}

template <class Codec, moment K>
void decode_moments(host_executor ex, span<const typename Codec::code_type> codes,
                    span<const typename Codec::meta_type> meta, span<float> x) {
    static_assert(is_state_codec_v<Codec>, "octet::decode_moments: Codec must be an octet::state_codec policy");
    optim_detail::check_moment_views<Codec>("octet::decode_moments", x.size(), codes.size(), meta.size(), codes.data(),
                                            meta.data(), x.data());
    const std::size_t blocks = (x.size() + optim_block - 1) / optim_block;
    parallel_for(ex, blocks, 64, [&](std::size_t b, std::size_t e) {
        const optim_detail::host_team team;
        const codec_context ctx = host_codec_context();
        for (std::size_t blk = b; blk < e; ++blk)
            optim_detail::decode_moments_block<Codec, K>(team, codes.data(), meta.data(), x.data(), x.size(), ctx, blk,
                                                         false);
    });
}

}  // namespace octet
