// octet/optim/moments.cuh: encode and decode whole arrays of moments on a CUDA stream.
//
//   octet::encode_moments<Codec, octet::moment::first>(octet::on_stream(s), x, codes, meta);
//   octet::decode_moments<Codec, octet::moment::first>(octet::on_stream(s), codes, meta, x);
//
// Same contract and bits as optim/moments.hpp (one warp per block of 256 runs the shared block
// functions). All views are device memory.
#pragma once

#include <cuda_runtime.h>

#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/optim/detail/warp_team.cuh"
#include "octet/optim/moments.hpp"

namespace octet {
namespace optim_detail {

template <class Codec, moment K>
OCTET_KERNEL void __launch_bounds__(256)
    encode_moments_kernel(const float* __restrict__ x, typename Codec::code_type* codes,
                          typename Codec::meta_type* meta, std::size_t n, bool vectorized, philox_stream rng) {
    codec_context ctx{};
    if constexpr (Codec::needs_tables) {
        OCTET_SHARED(float[codec_table_floats], tables);
        ctx = load_codec_tables(tables);
    }
    const warp_team team;
    const std::size_t blocks = (n + optim_block - 1) / optim_block;
    for (std::size_t blk = global_warp(); blk < blocks; blk += warp_count())
        encode_moments_block<Codec, K>(team, x, codes, meta, n, ctx, blk, vectorized, rng);
}

template <class Codec, moment K>
OCTET_KERNEL void __launch_bounds__(256) decode_moments_kernel(const typename Codec::code_type* __restrict__ codes,
                                                               const typename Codec::meta_type* __restrict__ meta,
                                                               float* x, std::size_t n, bool vectorized) {
    codec_context ctx{};
    if constexpr (Codec::needs_tables) {
        OCTET_SHARED(float[codec_table_floats], tables);
        ctx = load_codec_tables(tables);
    }
    const warp_team team;
    const std::size_t blocks = (n + optim_block - 1) / optim_block;
    for (std::size_t blk = global_warp(); blk < blocks; blk += warp_count())
        decode_moments_block<Codec, K>(team, codes, meta, x, n, ctx, blk, vectorized);
}

/// The stream overloads' device-memory checks (the shapes are checked by check_moment_views).
template <class Codec>
void require_device_moment_views(const char* fn, const void* x, const void* codes, const void* meta) {
    cuda::require_device_accessible(x, fn, "x");
    cuda::require_device_accessible(codes, fn, "codes");
    if (Codec::has_meta) cuda::require_device_accessible(meta, fn, "meta");
}

}  // namespace optim_detail

template <class Codec, moment K>
void encode_moments(stream_executor ex, span<const float> x, span<typename Codec::code_type> codes,
                    span<typename Codec::meta_type> meta, const philox_stream& rng = {}) {
    static_assert(is_state_codec_v<Codec>, "octet::encode_moments: Codec must be an octet::state_codec policy");
    constexpr const char* fn = "octet::encode_moments";
    optim_detail::check_moment_views<Codec>(fn, x.size(), codes.size(), meta.size(), codes.data(), meta.data(),
                                            x.data());
    if (x.empty()) return;
    optim_detail::require_device_moment_views<Codec>(fn, x.data(), codes.data(), meta.data());
    const bool vec = detail::is_aligned(x.data(), 16) && detail::is_aligned(codes.data(), 16);
    const std::size_t blocks = (x.size() + optim_block - 1) / optim_block;
    cuda::launch("encode_moments_kernel", optim_detail::encode_moments_kernel<Codec, K>,
                 cuda::grid_stride_blocks(blocks * 32, 256, 8), 256, 0, ex.stream, x.data(), codes.data(), meta.data(),
                 x.size(), vec, rng);
    OCTET_CUDA_CHECK_LAUNCH();
}

template <class Codec, moment K>
void decode_moments(stream_executor ex, span<const typename Codec::code_type> codes,
                    span<const typename Codec::meta_type> meta, span<float> x) {
    static_assert(is_state_codec_v<Codec>, "octet::decode_moments: Codec must be an octet::state_codec policy");
    constexpr const char* fn = "octet::decode_moments";
    optim_detail::check_moment_views<Codec>(fn, x.size(), codes.size(), meta.size(), codes.data(), meta.data(),
                                            x.data());
    if (x.empty()) return;
    optim_detail::require_device_moment_views<Codec>(fn, x.data(), codes.data(), meta.data());
    const bool vec = detail::is_aligned(x.data(), 16) && detail::is_aligned(codes.data(), 16);
    const std::size_t blocks = (x.size() + optim_block - 1) / optim_block;
    cuda::launch("decode_moments_kernel", optim_detail::decode_moments_kernel<Codec, K>,
                 cuda::grid_stride_blocks(blocks * 32, 256, 8), 256, 0, ex.stream, codes.data(), meta.data(), x.data(),
                 x.size(), vec);
    OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace octet
