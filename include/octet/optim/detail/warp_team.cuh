// octet/optim/detail/warp_team.cuh: the device team (a warp, 8 elements per lane) for the block
// functions of optim/detail/team.hpp, and the dynamic-map tables in device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "octet/cuda/shared_memory.cuh"
#include "octet/optim/detail/dynamic_map.hpp"
#include "octet/optim/detail/team.hpp"

// Where the warp team's lane code runs: nvcc's device pass, and interpret mode (CUDA source as host
// code, kernels run by the CPU interpreter, whose fibers are the lanes and which serves threadIdx
// and the shuffles). OCTET_DEVICE_PASS alone would leave interpret mode with the host pass's
// stand-ins below (rank 0, no reduction): every lane would act as lane 0 of a warp that never
// reduces, which is not what the kernels compute.
#if OCTET_DEVICE_PASS || (defined(OCTET_INTERPRET) && !defined(__CUDACC__))
#define OCTET_OPTIM_WARP_LANES 1
#else
#define OCTET_OPTIM_WARP_LANES 0
#endif

namespace octet {
namespace optim_detail {

// The tables of the dynamic map, built by the same constexpr function as the host's.
static __constant__ dynamic_map<7> device_dynamic_map_signed = make_dynamic_map<7>();
static __constant__ dynamic_map<8> device_dynamic_map_unsigned = make_dynamic_map<8>();

/// Floats of shared memory a kernel needs for the tables.
inline constexpr int codec_table_floats = 2 * 128 + 2 * 256;

/// Copies the tables into shared memory (every thread of the block must call it; it syncs) and
/// returns a context that points at them. Constant memory would serialize the data-dependent
/// lookups of a warp; shared memory does not.
/// In interpret mode the copy's writes and the barrier go through the interpreter's checks, but the
/// context holds the tables' plain host addresses: codec_context and dynamic_map_index take
/// `const float*`, shared with the host path, so the lookups after the barrier are not checked.
OCTET_DEVICE codec_context load_codec_tables(shared_ptr_t<float> smem) {
    for (int i = threadIdx.x; i < 128; i += blockDim.x) {
        smem[i] = device_dynamic_map_signed.values[i];
        smem[128 + i] = device_dynamic_map_signed.thresholds[i];
    }
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        smem[256 + i] = device_dynamic_map_unsigned.values[i];
        smem[512 + i] = device_dynamic_map_unsigned.thresholds[i];
    }
    __syncthreads();
#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    const float* t = smem.raw();
#else
    const float* t = smem;
#endif
    return codec_context{t, t + 128, t + 256, t + 512};
}

/// A warp: lane l owns elements [8 l, 8 l + 8) of a 256-element block. Members are
/// __host__ __device__ so that the shared OCTET_HD block functions can name them; they only run
/// in kernels (on the device or under the interpreter: OCTET_OPTIM_WARP_LANES).
struct warp_team {
    static constexpr int per_member = 8;

    OCTET_HD int rank() const {
#if OCTET_OPTIM_WARP_LANES
        return static_cast<int>(threadIdx.x & 31u);
#else
        return 0;
#endif
    }

    template <int Lanes>
    OCTET_HD group_stats reduce(group_stats s) const {
#if OCTET_OPTIM_WARP_LANES
        OCTET_UNROLL
        for (int offset = Lanes / 2; offset >= 1; offset >>= 1) {
            const group_stats other{__shfl_xor_sync(0xFFFFFFFFu, s.absmax, offset),
                                    __shfl_xor_sync(0xFFFFFFFFu, s.minnz, offset)};
            s = stats_merge(s, other);
        }
#endif
        return s;
    }

    OCTET_HD int sum(int x) const {
#if OCTET_OPTIM_WARP_LANES
        OCTET_UNROLL
        for (int offset = 16; offset >= 1; offset >>= 1) x += __shfl_xor_sync(0xFFFFFFFFu, x, offset);
#endif
        return x;
    }

    /// Loads 8 elements: vector loads when the whole slice is valid and pointers are aligned.
    template <class T>
    OCTET_HD void load(const T* src, int valid, T (&dst)[per_member], bool vectorized) const {
        constexpr int bytes = per_member * static_cast<int>(sizeof(T));
        if (vectorized && valid == per_member) {
            if constexpr (bytes % 16 == 0) {
                OCTET_UNROLL
                for (int k = 0; k < bytes / 16; ++k) {
                    const uint4 w = reinterpret_cast<const uint4*>(src)[k];
                    std::memcpy(reinterpret_cast<unsigned char*>(dst) + 16 * k, &w, 16);
                }
                return;
            } else if constexpr (bytes % 8 == 0) {
                OCTET_UNROLL
                for (int k = 0; k < bytes / 8; ++k) {
                    const uint2 w = reinterpret_cast<const uint2*>(src)[k];
                    std::memcpy(reinterpret_cast<unsigned char*>(dst) + 8 * k, &w, 8);
                }
                return;
            }
        }
        OCTET_UNROLL
        for (int i = 0; i < per_member; ++i) dst[i] = i < valid ? src[i] : T{};
    }

    template <class T>
    OCTET_HD void store(T* dst, int valid, const T (&src)[per_member], bool vectorized) const {
        constexpr int bytes = per_member * static_cast<int>(sizeof(T));
        if (vectorized && valid == per_member) {
            if constexpr (bytes % 16 == 0) {
                OCTET_UNROLL
                for (int k = 0; k < bytes / 16; ++k) {
                    uint4 w;
                    std::memcpy(&w, reinterpret_cast<const unsigned char*>(src) + 16 * k, 16);
                    reinterpret_cast<uint4*>(dst)[k] = w;
                }
                return;
            } else if constexpr (bytes % 8 == 0) {
                OCTET_UNROLL
                for (int k = 0; k < bytes / 8; ++k) {
                    uint2 w;
                    std::memcpy(&w, reinterpret_cast<const unsigned char*>(src) + 8 * k, 8);
                    reinterpret_cast<uint2*>(dst)[k] = w;
                }
                return;
            }
        }
        OCTET_UNROLL
        for (int i = 0; i < per_member; ++i)
            if (i < valid) dst[i] = src[i];
    }
};

/// Global warp index and warp count of a grid-stride loop over blocks.
OCTET_DEVICE std::size_t global_warp() {
    return (static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
}
OCTET_DEVICE std::size_t warp_count() {
    return (static_cast<std::size_t>(gridDim.x) * blockDim.x) >> 5;
}

}  // namespace optim_detail
}  // namespace octet
