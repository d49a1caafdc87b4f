// octet/codec/hadamard.cuh: the randomized Hadamard transform on a CUDA stream, and the tile
// primitive the codec kernels (codec.cuh) share.
//
//   octet::transform_forward(octet::on_stream(s), kind, x, y, block, seed, first_index);   // device memory
//   octet::transform_inverse(octet::on_stream(s), kind, y, x, block, seed, first_index);
//
// Same contract and the same bits as the host overloads in hadamard.hpp: the butterfly stages run
// in the same order (index bit 0 first) with the same float operations.
//
// Tile layout. A CTA owns a tile of THREADS * R consecutive elements; thread t holds the R
// elements t*R .. t*R+R-1 in registers (R = 8 for blocks up to 2048, 16 up to 8192, 32 for 16384
// and 32768; THREADS = max(B / R, 128), so 1024 threads for 32768). The R = 32 kernels are built
// for 1024 threads (64 registers) and spill: blocks of 16384 and 32768 work but are not fast; an
// R = 64 variant for them tripled the build time of every file that includes this header.
// The stages of index bits [0, log2 R) run inside a thread, bits [log2 R, log2 R + 5) across lanes with shuffles, and
// the remaining bits (blocks larger than 32 R) across warps: the tile goes through shared memory once, each thread
// takes R elements that differ in those bits (consecutive threads read consecutive words, so the transposition has no
// bank conflicts), finishes the butterflies in registers, and the tile goes back. Global memory is read and written
// once, with 16-byte accesses.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "octet/codec/hadamard.hpp"
#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/shared_memory.cuh"

namespace octet {
namespace detail {
namespace codec_dev {

/// Registers per thread for an effective block of 2^log_b (log_b = 0: identity).
OCTET_HD constexpr int regs_for(int log_b) {
    return log_b <= 11 ? 8 : (log_b <= 13 ? 16 : 32);
}
OCTET_HD constexpr int log2_of(int r) {
    return r == 8 ? 3 : (r == 16 ? 4 : 5);
}
/// Threads per CTA.
inline int threads_for(int log_b, int R) {
    return log_b == 0 ? 128 : std::max((1 << log_b) / R, 128);
}
template <int R>
inline constexpr int max_threads = R == 8 ? 256 : (R == 16 ? 512 : 1024);
/// Dynamic shared memory of a CTA: the tile when the block spans several warps, plus one float per warp.
inline std::size_t smem_bytes(int log_b, int R, int threads) {
    const bool cross_warp = log_b > log2_of(R) + 5;
    return (cross_warp ? static_cast<std::size_t>(threads) * R * sizeof(float) : 0) + (threads / 32) * sizeof(float) +
           16;
}

/// Unnormalized Walsh-Hadamard transform over index bits [0, log_b) of the CTA tile.
/// Every thread of the CTA must call it (it synchronizes when the block spans several warps).
template <int R>
OCTET_DEVICE void fwht_tile(float (&v)[R], int log_b, shared_ptr_t<float> smem) {
    constexpr int LOG_R = log2_of(R);
    // Bits [0, log2 R): inside the thread.
    OCTET_UNROLL
    for (int s = 0; s < LOG_R; ++s) {
        const int h = 1 << s;
        OCTET_UNROLL
        for (int j = 0; j < R; ++j)
            if (!(j & h)) {
                const float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
    }
    // Bits [log2 R, log2 R + 5): across lanes. The lower element of a pair computes a + b, the
    // upper one a - b with a the lower element's value, exactly as the host does.
    const int lane = threadIdx.x & 31;
    const int lane_bits = min(5, log_b - LOG_R);
    for (int s = 0; s < lane_bits; ++s) {
        const int m = 1 << s;
        const bool upper = (lane & m) != 0;
        OCTET_UNROLL
        for (int j = 0; j < R; ++j) {
            const float p = __shfl_xor_sync(0xFFFFFFFFu, v[j], m);
            v[j] = upper ? p - v[j] : v[j] + p;
        }
    }
    // Bits [log2 R + 5, log_b): across warps, through shared memory.
    const int cw = log_b - LOG_R - 5;
    if (cw > 0) {
        const int t = threadIdx.x;
        OCTET_UNROLL
        for (int j = 0; j < R; j += 4)
            *shared_cast<float4>(smem + t * R + j) = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
        __syncthreads();
        const int ntb = (1 << log_b) / R;  // threads per transform block
        const int base = (t / ntb) << log_b, tb = t % ntb, span = 32 * R, wmask = (1 << cw) - 1;
        OCTET_UNROLL
        for (int j = 0; j < R; ++j) v[j] = smem[base + (j & wmask) * span + tb + (j >> cw) * ntb];
        OCTET_UNROLL
        for (int s = 0; s < LOG_R; ++s) {
            if (s < cw) {
                const int h = 1 << s;
                OCTET_UNROLL
                for (int j = 0; j < R; ++j)
                    if (!(j & h)) {
                        const float a = v[j], b = v[j + h];
                        v[j] = a + b;
                        v[j + h] = a - b;
                    }
            }
        }
        OCTET_UNROLL
        for (int j = 0; j < R; ++j) smem[base + (j & wmask) * span + tb + (j >> cw) * ntb] = v[j];
        __syncthreads();
        OCTET_UNROLL
        for (int j = 0; j < R; j += 4) {
            const float4 f = *shared_cast<const float4>(smem + t * R + j);
            v[j] = f.x, v[j + 1] = f.y, v[j + 2] = f.z, v[j + 3] = f.w;
        }
        __syncthreads();
    }
}

/// Flips the signs of v[j] (element i0 + j of a message, global index first_index + i0 + j) by the
/// shared sign pattern. Elements at and beyond `limit` (the zero padding of a forward transform)
/// become +0, as the host pads them (a flipped zero would be -0 and could change a zero result's sign).
template <int R>
OCTET_DEVICE void apply_signs(float (&v)[R], std::uint64_t seed, std::uint64_t first_index, std::uint64_t i0,
                              std::uint64_t limit = ~std::uint64_t{0}) {
    const std::uint64_t g0 = first_index + i0;
    std::uint64_t w = g0 >> 5;
    std::uint32_t word = hadamard_sign_word(seed, w);
    OCTET_UNROLL
    for (int j = 0; j < R; ++j) {
        const std::uint64_t g = g0 + static_cast<std::uint64_t>(j);
        if ((g >> 5) != w) {
            w = g >> 5;
            word = hadamard_sign_word(seed, w);
        }
        v[j] = i0 + j < limit ? flip_sign_if(v[j], (word >> (g & 31u)) & 1u) : 0.0f;
    }
}

/// Loads R floats at p[i0 .. i0+R) with zeros at and beyond `limit` (16-byte loads when possible).
template <int R>
OCTET_DEVICE void load_floats(const float* __restrict__ p, std::uint64_t i0, std::uint64_t limit, float (&v)[R]) {
    if (i0 + R <= limit && (reinterpret_cast<std::uintptr_t>(p + i0) & 15u) == 0) {
        OCTET_UNROLL
        for (int j = 0; j < R; j += 4) {
            const float4 f = __ldg(reinterpret_cast<const float4*>(p + i0 + j));
            v[j] = f.x, v[j + 1] = f.y, v[j + 2] = f.z, v[j + 3] = f.w;
        }
    } else {
        OCTET_UNROLL
        for (int j = 0; j < R; ++j) v[j] = i0 + j < limit ? p[i0 + j] : 0.0f;
    }
}

/// Stores v[j] to p[i0 + j] for i0 + j < limit (16-byte stores when possible).
template <int R>
OCTET_DEVICE void store_floats(float* __restrict__ p, std::uint64_t i0, std::uint64_t limit, const float (&v)[R]) {
    if (i0 + R <= limit && (reinterpret_cast<std::uintptr_t>(p + i0) & 15u) == 0) {
        OCTET_UNROLL
        for (int j = 0; j < R; j += 4)
            *reinterpret_cast<float4*>(p + i0 + j) = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
    } else {
        OCTET_UNROLL
        for (int j = 0; j < R; ++j)
            if (i0 + j < limit) p[i0 + j] = v[j];
    }
}

/// Forward (inverse = false) or inverse transform of a message: in has n (forward) or L (inverse)
/// elements, out has L (forward) or n (inverse).
template <int R>
OCTET_KERNEL void __launch_bounds__(max_threads<R>)
    transform_kernel(const float* __restrict__ in, float* __restrict__ out, std::uint64_t n, std::uint64_t L, int log_b,
                     std::uint64_t seed, std::uint64_t first_index, bool inverse) {
    OCTET_DYNAMIC_SHARED(float, smem);
    const std::uint64_t tile = static_cast<std::uint64_t>(blockDim.x) * R;
    const std::uint64_t i0 =
        static_cast<std::uint64_t>(blockIdx.x) * tile + static_cast<std::uint64_t>(threadIdx.x) * R;
    float v[R];
    load_floats<R>(in, i0, inverse ? L : n, v);
    if (!inverse) apply_signs<R>(v, seed, first_index, i0, n);
    fwht_tile<R>(v, log_b, smem);
    const float c = hadamard_norm(log_b);
    OCTET_UNROLL
    for (int j = 0; j < R; ++j) v[j] = v[j] * c;
    if (inverse) apply_signs<R>(v, seed, first_index, i0);
    store_floats<R>(out, i0, inverse ? n : L, v);
}

template <class Kernel>
void set_smem(Kernel k, std::size_t bytes) {
    if (bytes > 48 * 1024)
        OCTET_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

/// Calls fn(std::integral_constant<int, R>{}) for the register count of log_b.
template <class Fn>
void dispatch_regs(int log_b, Fn&& fn) {
    switch (regs_for(log_b)) {
        case 8:
            fn(std::integral_constant<int, 8>{});
            break;
        case 16:
            fn(std::integral_constant<int, 16>{});
            break;
        default:
            fn(std::integral_constant<int, 32>{});
            break;
    }
}

inline void launch_transform(cudaStream_t s, const float* in, float* out, std::uint64_t n, std::uint64_t L, int log_b,
                             std::uint64_t seed, std::uint64_t first_index, bool inverse) {
    dispatch_regs(log_b, [&](auto r) {
        constexpr int R = decltype(r)::value;
        const int threads = threads_for(log_b, R);
        const std::uint64_t tile = static_cast<std::uint64_t>(threads) * R;
        const std::size_t smem = smem_bytes(log_b, R, threads);
        set_smem(transform_kernel<R>, smem);
        const unsigned grid = static_cast<unsigned>((L + tile - 1) / tile);
        cuda::launch("transform_kernel", transform_kernel<R>, grid, threads, smem, s, in, out, n, L, log_b, seed,
                     first_index, inverse);
        OCTET_CUDA_CHECK_LAUNCH();
    });
}

}  // namespace codec_dev
}  // namespace detail

namespace detail {
namespace codec_dev {
/// The stream forward (inverse == false: in = x, out = y) or inverse (in = y, out = x) transform.
inline void transform_on_stream(cudaStream_t stream, transform_kind kind, const float* in, float* out, std::uint64_t n,
                                std::uint64_t y_size, std::uint32_t block, std::uint64_t seed,
                                std::uint64_t first_index, bool inverse, const char* fn) {
    const std::uint64_t L = checked_transform_length(kind, block, n, y_size, fn);
    if (n == 0) return;
    cuda::require_device_accessible(inverse ? out : in, fn, "x");
    cuda::require_device_accessible(inverse ? in : out, fn, "y");
    if (kind == transform_kind::identity) {
        OCTET_CUDA_CHECK(cudaMemcpyAsync(out, in, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
        return;
    }
    const int log_b = log2_exact(hadamard_effective_block(n, block));
    launch_transform(stream, in, out, n, L, log_b, seed, first_index, inverse);
}
}  // namespace codec_dev
}  // namespace detail

/// y (L = transform_length(kind, x.size(), block) floats, device memory) = the transform of x.
inline void transform_forward(stream_executor ex, transform_kind kind, span<const float> x, span<float> y,
                              std::uint32_t block, std::uint64_t seed, std::uint64_t first_index = 0) {
    detail::codec_dev::transform_on_stream(ex.stream, kind, x.data(), y.data(), x.size(), y.size(), block, seed,
                                           first_index, false, "octet::transform_forward");
}

/// x (n floats, device memory) = the inverse transform of y (L floats).
inline void transform_inverse(stream_executor ex, transform_kind kind, span<const float> y, span<float> x,
                              std::uint32_t block, std::uint64_t seed, std::uint64_t first_index = 0) {
    detail::codec_dev::transform_on_stream(ex.stream, kind, y.data(), x.data(), x.size(), y.size(), block, seed,
                                           first_index, true, "octet::transform_inverse");
}

}  // namespace octet
