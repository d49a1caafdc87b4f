// octet/format/convert.hpp: whole-array conversions on the host (multi-threaded).
//
//   octet::encode_array<Fmt, Round, Overflow>(octet::on_host(), in, out [, rng])
//   octet::decode_array<Fmt>(octet::on_host(), codes, out)
//
// `in` is float, octet::bf16 or octet::fp16; `out` holds one code per byte (sub-byte formats
// are packed by the quantizers, see quant/). Stochastic rounding draws element i's bits from
// rng.bits(i), so the result does not depend on the thread count or on host versus device.
// The deterministic roundings and decode_array run a kernel compiled for the CPU's best
// instruction set (core/isa_dispatch.hpp), bit-identical to encode()/decode().
// Host scratch: none (both allocate nothing; no ..._scratch_bytes query).
// The stream overloads are in octet/format/convert.cuh.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "octet/core/bits.hpp"
#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/isa_dispatch.hpp"
#include "octet/core/philox.hpp"
#include "octet/core/span.hpp"
#include "octet/format/encode.hpp"

namespace octet {

namespace detail {
template <class In>
inline constexpr bool is_encode_input_v =
    std::is_same_v<In, float> || std::is_same_v<In, bf16> || std::is_same_v<In, fp16>;

template <class Fmt, class Round, class Overflow, class In>
OCTET_HD std::uint8_t encode_element(In x, const philox_stream& rng, std::uint64_t index) {
    if constexpr (std::is_same_v<Round, round::stochastic>)
        return encode<Fmt, Round, Overflow>(x, rng.bits(index));
    else {
        (void)rng, (void)index;
        return encode<Fmt, Round, Overflow>(x);
    }
}
/// encode_array's loop for the deterministic roundings: dst[i] = encode(src[i]), i < n.
template <class Fmt, class Round, class Overflow, class In>
struct encode_kernel {
    static_assert(!std::is_same_v<Round, round::stochastic>, "octet: stochastic rounding has its own loop");
    OCTET_KERNEL_INLINE static void chunk(const In* __restrict src, std::uint8_t* __restrict dst) {
        for (std::size_t i = 0; i < kernel_chunk; ++i) dst[i] = encode<Fmt, Round, Overflow>(src[i]);
    }
    OCTET_KERNEL_INLINE static void run(const In* src, std::uint8_t* dst, std::size_t n) {
        std::size_t i = 0;
        for (; i + kernel_chunk <= n; i += kernel_chunk) chunk(src + i, dst + i);
        if (i == n) return;
        In tail[kernel_chunk] = {};
        std::uint8_t codes[kernel_chunk];
        std::memcpy(tail, src + i, (n - i) * sizeof(In));
        chunk(tail, codes);
        std::memcpy(dst + i, codes, n - i);
    }
};

/// decode_array's loop: dst[i] = decode(src[i]), i < n.
template <class Fmt>
struct decode_kernel {
    OCTET_KERNEL_INLINE static void chunk(const std::uint8_t* __restrict src, float* __restrict dst) {
        for (std::size_t i = 0; i < kernel_chunk; ++i) dst[i] = decode<Fmt>(src[i]);
    }
    OCTET_KERNEL_INLINE static void run(const std::uint8_t* src, float* dst, std::size_t n) {
        std::size_t i = 0;
        for (; i + kernel_chunk <= n; i += kernel_chunk) chunk(src + i, dst + i);
        if (i == n) return;
        std::uint8_t tail[kernel_chunk] = {};
        float values[kernel_chunk];
        std::memcpy(tail, src + i, n - i);
        chunk(tail, values);
        std::memcpy(dst + i, values, (n - i) * sizeof(float));
    }
};

/// The argument checks of encode_array and decode_array (host and stream overloads).
inline void check_encode_views(std::size_t n_in, const void* in, std::size_t n_out, const void* out) {
    OCTET_REQUIRE(n_out == n_in, "octet::encode_array", "out",
                  message("has ", n_out, " elements but 'in' has ", n_in, "; pass one code per input"));
    OCTET_REQUIRE(n_in == 0 || in != nullptr, "octet::encode_array", "in", "is null with a non-zero size");
    OCTET_REQUIRE(n_in == 0 || out != nullptr, "octet::encode_array", "out", "is null with a non-zero size");
}
inline void check_decode_views(std::size_t n_codes, const void* codes, std::size_t n_out, const void* out) {
    OCTET_REQUIRE(n_out == n_codes, "octet::decode_array", "out",
                  message("has ", n_out, " elements but 'codes' has ", n_codes, "; pass one float per code"));
    OCTET_REQUIRE(n_codes == 0 || codes != nullptr, "octet::decode_array", "codes", "is null with a non-zero size");
    OCTET_REQUIRE(n_codes == 0 || out != nullptr, "octet::decode_array", "out", "is null with a non-zero size");
}

}  // namespace detail

template <class Fmt, class Round = round::nearest_even, class Overflow = overflow::saturate, class In>
void encode_array(host_executor ex, span<const In> in, span<std::uint8_t> out, philox_stream rng = {}) {
    static_assert(detail::is_encode_input_v<In>,
                  "octet::encode_array: input must be float, octet::bf16 or octet::fp16");
    detail::check_encode_views(in.size(), in.data(), out.size(), out.data());
    if constexpr (std::is_same_v<Round, round::stochastic>) {
        parallel_for(ex, in.size(), std::size_t{1} << 16, [&](std::size_t b, std::size_t e) {
            const In* __restrict src = in.data();
            std::uint8_t* __restrict dst = out.data();
            for (std::size_t i = b; i < e; ++i) dst[i] = detail::encode_element<Fmt, Round, Overflow>(src[i], rng, i);
        });
    } else {
        (void)rng;
        const detail::simd_isa isa = detail::best_isa();
        parallel_for(ex, in.size(), std::size_t{1} << 16, [&](std::size_t b, std::size_t e) {
            detail::run_kernel<detail::encode_kernel<Fmt, Round, Overflow, In>>(isa, in.data() + b, out.data() + b,
                                                                                e - b);
        });
    }
}

template <class Fmt>
void decode_array(host_executor ex, span<const std::uint8_t> codes, span<float> out) {
    detail::check_decode_views(codes.size(), codes.data(), out.size(), out.data());
    const detail::simd_isa isa = detail::best_isa();
    parallel_for(ex, codes.size(), std::size_t{1} << 16, [&](std::size_t b, std::size_t e) {
        detail::run_kernel<detail::decode_kernel<Fmt>>(isa, codes.data() + b, out.data() + b, e - b);
    });
}

}  // namespace octet
