// octet/format/convert.cuh: whole-array conversions on a CUDA stream.
//
//   octet::encode_array<Fmt, Round, Overflow>(octet::on_stream(s), in, out [, rng])
//   octet::decode_array<Fmt>(octet::on_stream(s), codes, out)
//
// Same contract and same bits as the host overloads in convert.hpp (the kernels call the same
// OCTET_HD encode/decode). Inputs: float, octet::bf16 / __nv_bfloat16, octet::fp16 / __half, in
// device memory. Each thread converts 16 elements with 16-byte loads and stores when both
// pointers are 16-byte aligned; any other alignment or length is handled element by element.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/format/convert.hpp"
#include "octet/format/packed.hpp"

namespace octet {
namespace detail {

// CUDA's 16-bit types are layout-compatible with octet's storage types.
template <class T>
struct storage_of {
    using type = T;
};
template <>
struct storage_of<__nv_bfloat16> {
    using type = bf16;
};
template <>
struct storage_of<__half> {
    using type = fp16;
};
template <class T>
using storage_of_t = typename storage_of<std::remove_cv_t<T>>::type;

constexpr int kConvertPerThread = 16;

/// Loads 16 consecutive inputs as floats with 16-byte loads (p must be 16-byte aligned).
template <class In>
OCTET_DEVICE void load16_as_float(const In* __restrict__ p, float (&v)[16]) {
    if constexpr (std::is_same_v<In, float>) {
        const float4* q = reinterpret_cast<const float4*>(p);
        OCTET_UNROLL
        for (int k = 0; k < 4; ++k) {
            const float4 f = q[k];
            v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
        }
    } else {
        const uint4* q = reinterpret_cast<const uint4*>(p);
        OCTET_UNROLL
        for (int k = 0; k < 2; ++k) {
            const uint4 w = q[k];
            const std::uint32_t words[4] = {w.x, w.y, w.z, w.w};
            OCTET_UNROLL
            for (int j = 0; j < 4; ++j) {
                v[8 * k + 2 * j] = to_float(In{static_cast<std::uint16_t>(words[j] & 0xFFFFu)});
                v[8 * k + 2 * j + 1] = to_float(In{static_cast<std::uint16_t>(words[j] >> 16)});
            }
        }
    }
}

template <class Fmt, class Round, class Overflow, class In>
OCTET_KERNEL void encode_array_kernel(const In* __restrict__ in, std::uint8_t* __restrict__ out, std::size_t n,
                                      philox_stream rng, bool vectorized) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const std::size_t chunks = vectorized ? n / kConvertPerThread : 0;
    for (std::size_t c = tid; c < chunks; c += stride) {
        const std::size_t base = c * kConvertPerThread;
        float v[16];
        load16_as_float(in + base, v);
        std::uint32_t words[4];
        OCTET_UNROLL
        for (int k = 0; k < 4; ++k) {
            if constexpr (std::is_same_v<Round, round::stochastic>) {
                const philox4 r = rng.block((base >> 2) + k);
                words[k] = static_cast<std::uint32_t>(encode<Fmt, Round, Overflow>(v[4 * k], r.v[0])) |
                           (static_cast<std::uint32_t>(encode<Fmt, Round, Overflow>(v[4 * k + 1], r.v[1])) << 8) |
                           (static_cast<std::uint32_t>(encode<Fmt, Round, Overflow>(v[4 * k + 2], r.v[2])) << 16) |
                           (static_cast<std::uint32_t>(encode<Fmt, Round, Overflow>(v[4 * k + 3], r.v[3])) << 24);
            } else {
                words[k] = encode_x4<Fmt, Round, Overflow>(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
            }
        }
        *reinterpret_cast<uint4*>(out + base) = make_uint4(words[0], words[1], words[2], words[3]);
    }
    for (std::size_t i = chunks * kConvertPerThread + tid; i < n; i += stride)
        out[i] = encode_element<Fmt, Round, Overflow>(in[i], rng, i);
}

template <class Fmt>
OCTET_KERNEL void decode_array_kernel(const std::uint8_t* __restrict__ in, float* __restrict__ out, std::size_t n,
                                      bool vectorized) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const std::size_t chunks = vectorized ? n / kConvertPerThread : 0;
    for (std::size_t c = tid; c < chunks; c += stride) {
        const std::size_t base = c * kConvertPerThread;
        const uint4 w = *reinterpret_cast<const uint4*>(in + base);
        const std::uint32_t words[4] = {w.x, w.y, w.z, w.w};
        float4* o = reinterpret_cast<float4*>(out + base);
        OCTET_UNROLL
        for (int k = 0; k < 4; ++k) {
            float f[4];
            decode_x4<Fmt>(words[k], f);
            o[k] = make_float4(f[0], f[1], f[2], f[3]);
        }
    }
    for (std::size_t i = chunks * kConvertPerThread + tid; i < n; i += stride) out[i] = decode<Fmt>(in[i]);
}

}  // namespace detail

template <class Fmt, class Round = round::nearest_even, class Overflow = overflow::saturate, class In>
void encode_array(stream_executor ex, span<const In> in, span<std::uint8_t> out, philox_stream rng = {}) {
    using Storage = detail::storage_of_t<In>;
    static_assert(detail::is_encode_input_v<Storage>,
                  "octet::encode_array: input must be float, bf16 (octet::bf16 or __nv_bfloat16) or fp16 (octet::fp16 "
                  "or __half)");
    detail::check_encode_views(in.size(), in.data(), out.size(), out.data());
    if (in.empty()) return;
    cuda::require_device_accessible(in.data(), "octet::encode_array", "in");
    cuda::require_device_accessible(out.data(), "octet::encode_array", "out");
    const auto* src = reinterpret_cast<const Storage*>(in.data());
    const bool vectorized = detail::is_aligned(src, 16) && detail::is_aligned(out.data(), 16);
    constexpr int threads = 256;
    const unsigned blocks =
        cuda::grid_stride_blocks((in.size() + detail::kConvertPerThread - 1) / detail::kConvertPerThread, threads);
    cuda::launch("encode_array_kernel", detail::encode_array_kernel<Fmt, Round, Overflow, Storage>, blocks, threads, 0,
                 ex.stream, src, out.data(), in.size(), rng, vectorized);
    OCTET_CUDA_CHECK_LAUNCH();
}

template <class Fmt>
void decode_array(stream_executor ex, span<const std::uint8_t> codes, span<float> out) {
    detail::check_decode_views(codes.size(), codes.data(), out.size(), out.data());
    if (codes.empty()) return;
    cuda::require_device_accessible(codes.data(), "octet::decode_array", "codes");
    cuda::require_device_accessible(out.data(), "octet::decode_array", "out");
    const bool vectorized = detail::is_aligned(codes.data(), 16) && detail::is_aligned(out.data(), 16);
    constexpr int threads = 256;
    const unsigned blocks =
        cuda::grid_stride_blocks((codes.size() + detail::kConvertPerThread - 1) / detail::kConvertPerThread, threads);
    cuda::launch("decode_array_kernel", detail::decode_array_kernel<Fmt>, blocks, threads, 0, ex.stream, codes.data(),
                 out.data(), codes.size(), vectorized);
    OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace octet
