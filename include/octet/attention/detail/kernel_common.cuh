// octet/attention/detail/kernel_common.cuh: what more than one family of the FP8 attention kernels uses, beside
// the tile machinery of tiles.cuh: wgmma tile descriptors and the 1024-byte alignment of the wgmma
// kernels' tiles, an operand's per-token scale, the mma.sync and wgmma products over 64 codes of k,
// and the block shape and mbarrier ring of the warp-specialized (sm_90a) kernels. Moved unchanged
// from attention.cuh.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "octet/attention/attention.hpp"
#include "octet/attention/detail/tiles.cuh"
#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/tensor_map.cuh"

namespace octet {
namespace detail {
namespace attention {

/// wgmma's descriptor of a K-major tile of `RowBytes`-byte rows (64 or 128), swizzled as swz does
/// (which is TMA's and wgmma's 64- and 128-byte swizzle for tiles aligned to 1024 bytes), from the
/// shared address of its first byte plus 32 k bytes for k-step k.
template <int RowBytes>
__device__ __forceinline__ std::uint64_t tile_descriptor(std::uint32_t address) {
    static_assert(RowBytes == 64 || RowBytes == 128, "attention tiles have rows of 64 or 128 bytes");
    ptx::wgmma_descriptor d;
    d.start = address;
    d.stride = 8 * RowBytes;  // 8-row swizzle atoms
    d.swizzle = RowBytes == 128 ? ptx::wgmma_swizzle::b128 : ptx::wgmma_swizzle::b64;
    return d.encode();
}

/// Bytes from the start of dynamic shared memory `smem` to its first 1024-byte boundary, where the
/// wgmma kernels start their tiles (the swizzle atoms' alignment; their *_smem_bytes hold the slack).
/// Added to the shared array itself, so that the tile pointers stay in the shared address space.
template <class SharedBytes>
__device__ __forceinline__ std::uint32_t wgmma_tile_padding(SharedBytes smem) {
    return (1024u - (ptx::shared_address(smem) & 1023u)) & 1023u;
}

/// The scale of token `tok`, head `h` (channels h*D .. h*D + D-1) of an FP8 operand.
template <class R>
__device__ __forceinline__ float token_scale(const quantized_cref<R>& x, std::size_t tok, int h, int D) {
    return x.scale(tok / x.layout.block_rows, static_cast<std::size_t>(h) * D / x.layout.block_cols);
}

/// acc = A B^T for one warp with mma.sync: A (16 x 64 E4M3 codes) as two k-steps of A fragments,
/// B rows n0 .. n0 + 7 (64 codes of FB each) of a transposed 64-wide tile (load_bt).
template <class FB>
__device__ __forceinline__ void mma_k64(float (&acc)[4], const std::uint32_t (&a)[2][4],
                                        shared_ptr_t<const std::uint8_t> bt_tile, int n0, int lane) {
    std::uint32_t b[2][2];
    load_bt(b, bt_tile, n0, lane);
    acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
    ptx::mma_m16n8k32_acc<e4m3, FB>(acc, a[0], b[0]);
    ptx::mma_m16n8k32_acc<e4m3, FB>(acc, a[1], b[1]);
}

/// Issues acc = A B^T for the warpgroup as one committed wgmma-group, without waiting for it: A (64 x
/// 64 E4M3 codes) from registers, each warp's 16 rows as two k-steps of mma.sync A fragments (wgmma's
/// register layout), B (N rows x 64 codes of FB) rows of a swizzled 64-byte-row tile from shared
/// address b_addr. acc and a belong to the tensor cores until a wgmma_wait_group completes the group;
/// then fence both (ptx::fence_operand), so that the compiler keeps a's registers until then.
template <int N, class FB>
__device__ __forceinline__ void wgmma_rs_k64_async(float (&acc)[N / 2], const std::uint32_t (&a)[2][4],
                                                   std::uint32_t b_addr) {
    OCTET_UNROLL
    for (int i = 0; i < N / 2; ++i) ptx::fence_operand(acc[i]);  // the first k-step ignores acc (scale-d 0)
    ptx::wgmma_fence();
    OCTET_UNROLL
    for (int ks = 0; ks < 2; ++ks)
        ptx::wgmma_m64nNk32<N, e4m3, FB>(acc, a[ks], tile_descriptor<64>(b_addr + 32 * ks), ks > 0 ? 1u : 0u);
    ptx::wgmma_commit_group();
}

/// wgmma_rs_k64_async, complete on return.
template <int N, class FB>
__device__ __forceinline__ void wgmma_rs_k64(float (&acc)[N / 2], std::uint32_t (&a)[2][4], std::uint32_t b_addr) {
    OCTET_UNROLL
    for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
    wgmma_rs_k64_async<N, FB>(acc, a, b_addr);
    ptx::wgmma_wait_group<0>();
    OCTET_UNROLL
    for (int i = 0; i < N / 2; ++i) ptx::fence_operand(acc[i]);
    OCTET_UNROLL
    for (int i = 0; i < 8; ++i) ptx::fence_operand(a[i / 4][i % 4]);
}

/// The block of the warp-specialized kernels (forward_wgmma_kernel, grad_wgmma_kernel): warpgroups
/// 0 and 1 consume, one 64-row tile each (queries in the forward, keys in the gradient), and
/// warpgroup 2 produces.
constexpr int kConsumerGroups = 2;
constexpr int kWarpSpecializedThreads = (kConsumerGroups + 1) * 128;
constexpr int kBlockRows = kConsumerGroups * kTile;
/// Initializes the mbarriers of a warp-specialized kernel's ring of `stages` stages (one thread,
/// before the block's first barrier): per stage `loaded` (the producer's TMA thread, with its
/// transaction bytes), `full` (every producer thread) and `empty` (every consumer warp).
__device__ __forceinline__ void init_ring(shared_ptr_t<std::uint64_t> loaded, shared_ptr_t<std::uint64_t> full,
                                          shared_ptr_t<std::uint64_t> empty, int stages) {
    for (int st = 0; st < stages; ++st) {
        ptx::mbarrier_init(ptx::shared_address(loaded + st), 1);
        ptx::mbarrier_init(ptx::shared_address(full + st), 128);
        ptx::mbarrier_init(ptx::shared_address(empty + st), 4 * kConsumerGroups);
    }
}

}  // namespace attention
}  // namespace detail
}  // namespace octet
