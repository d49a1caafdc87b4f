// octet/attention/detail/tiles.cuh: the tile machinery of the FP8 attention kernels (sm_89+):
// fragment loads (ldmatrix), cp.async, the shared-memory layouts and the FP8 tile transpose.
//
// The tensor-core operation is mma.sync.m16n8k32 (ptx::mma_m16n8k32_acc, octet/cuda/ptx.cuh, which
// traps below sm_89) with E4M3/E5M2 operands and float accumulators.
// Its fragments (per lane: g = lane / 4, t = lane % 4):
//   A (16 x 32, row): reg 0 = row g, reg 1 = row g + 8, reg 2 = row g, reg 3 = row g + 8; regs 0/1
//     hold the first half of k, regs 2/3 the second half, 4 bytes each;
//   B (32 x 8, col): reg 0 and reg 1 = column g, first and second half of k;
//   C (16 x 8): c0, c1 = row g, columns 2t, 2t + 1; c2, c3 = row g + 8, same columns.
// The hardware pairs A's byte b of (lane t, half h) with B's byte b of (lane t, half h); which k
// index that is does not matter as long as A and B are filled with the same convention, which
// this file does everywhere: slot (t, h, b) of k-step ks holds k = 32 ks + 16 h + 4 t + b when the
// operand comes from shared memory with k contiguous (ldmatrix gives lane t bytes 4t..4t+3 of a
// 16-byte row).
//
// P (and dS) go from the C fragments of one product to the A fragments of the next without shared
// memory: the score tile's n8 tiles 4ks+2h and 4ks+2h+1 give lane t the keys
// {8n + 2t, 8n + 2t + 1} of both, and these four keys fill slot (t, h). The value tile (V^T and the
// other transposed operands) is stored with the keys of each 16-key group permuted to match:
// position 4t + 2a + e holds key 8a + 2t + e (perm_pos), so B's slot (t, h) is again 4 contiguous
// bytes. The transpose that builds these tiles (transpose_tile) reads 4 keys x 4 channels and
// writes 4 channels x 4 keys with byte permutes; on sm_90 transpose_tile_sm90 writes the same bytes
// with ldmatrix.trans, byte permutes and stmatrix.
//
// Shared-memory tiles are rows of 64 or 128 bytes whose 16-byte chunks are XOR-swizzled by row, so
// that ldmatrix's 8-row reads and cp.async's 16-byte writes are free of bank conflicts.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "octet/attention/detail/fragments.hpp"
#include "octet/cuda/ptx.cuh"
#include "octet/cuda/shared_memory.cuh"
#include "octet/format/float_format.hpp"

namespace octet {
namespace detail {
namespace attention {

constexpr int kThreads = 128;  // 4 warps
constexpr int kTile = 64;      // queries or keys per tile (attention::tile_size)

// ---- shared-memory layout ----------------------------------------------------------------------

/// Starts copying rows [row0, row0 + 64) (those below row_end; the rest are zero-filled) of an FP8
/// matrix with `row_bytes` bytes per row, columns [col0, col0 + D), into a swizzled 64 x D tile.
template <int D>
__device__ __forceinline__ void load_tile_async(shared_ptr_t<std::uint8_t> tile, const std::uint8_t* base,
                                                std::size_t row_bytes, int row0, int row_end, int col0) {
    constexpr int chunks = D / 16;
    for (int c = threadIdx.x; c < kTile * chunks; c += kThreads) {
        const int r = c / chunks, ch = c % chunks;
        const bool valid = row0 + r < row_end;
        const std::uint8_t* src = valid ? base + static_cast<std::size_t>(row0 + r) * row_bytes + col0 + 16 * ch : base;
        ptx::cp_async_cg_16(ptx::shared_address(tile + swz<D>(r, ch)), src, valid ? 16u : 0u);
    }
}

/// Zeroes rows [valid, 64) of a swizzled 64 x D tile (each row keeps its D bytes under the swizzle),
/// 16 bytes per store, `thread` of `Threads`: the rows past a sequence that a TMA tile load brought
/// (TMA fills zeros only past the whole tensor), so that the tile holds what load_tile_async leaves.
/// Nothing to do when valid >= 64.
template <int D, int Threads>
__device__ __forceinline__ void zero_rows_from(shared_ptr_t<std::uint8_t> tile, int valid, int thread) {
    const int first = valid < 0 ? 0 : valid * (D / 16);
    for (int c = first + thread; c < kTile * (D / 16); c += Threads)
        *OCTET_SHARED_CAST(uint4, tile + 16 * c) = make_uint4(0u, 0u, 0u, 0u);
}

// ---- ldmatrix ---------------------------------------------------------------------------------------

/// A fragments (16 rows from row0, k-step ks) of a tile with k contiguous.
template <int RowBytes>
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], shared_ptr_t<const std::uint8_t> tile, int row0, int ks,
                                       int lane) {
    const attention::row_chunk rc = attention::a_address(lane, row0, ks);
    ptx::ldmatrix_x4(a, ptx::shared_address(tile + swz<RowBytes>(rc.row, rc.chunk)));
}

/// B fragments of two n8 tiles (columns n0..n0+15 = tile rows, k-step ks) of a tile with k contiguous:
/// b[0] for columns n0..n0+7, b[1] for n0+8..n0+15.
template <int RowBytes>
__device__ __forceinline__ void load_b2(std::uint32_t (&b)[2][2], shared_ptr_t<const std::uint8_t> tile, int n0, int ks,
                                        int lane) {
    const attention::row_chunk rc = attention::b2_address(lane, n0, ks);
    std::uint32_t r[4];
    ptx::ldmatrix_x4(r, ptx::shared_address(tile + swz<RowBytes>(rc.row, rc.chunk)));
    b[0][0] = r[0];
    b[0][1] = r[1];
    b[1][0] = r[2];
    b[1][1] = r[3];
}

/// B fragments of one n8 tile (tile rows n0..n0+7) for both k-steps of a 64-wide transposed tile:
/// b[ks] for ks = 0, 1.
__device__ __forceinline__ void load_bt(std::uint32_t (&b)[2][2], shared_ptr_t<const std::uint8_t> tile, int n0,
                                        int lane) {
    const attention::row_chunk rc = attention::bt_address(lane, n0);
    std::uint32_t r[4];
    ptx::ldmatrix_x4(r, ptx::shared_address(tile + swz<64>(rc.row, rc.chunk)));
    b[0][0] = r[0];
    b[0][1] = r[1];
    b[1][0] = r[2];
    b[1][1] = r[3];
}

// ---- bytes ------------------------------------------------------------------------------------------

/// Four codes into a 32-bit fragment word, c0 in the lowest byte.
__device__ __forceinline__ std::uint32_t pack4(std::uint32_t c0, std::uint32_t c1, std::uint32_t c2, std::uint32_t c3) {
    return c0 | (c1 << 8) | (c2 << 16) | (c3 << 24);
}

/// Transposes a swizzled 64 x D tile (rows = tokens) into a swizzled D x 64 tile (rows = channels)
/// whose 16-token groups are permuted by perm_pos, with the tokens from `valid` on written as zeros
/// (the rows past a sequence's end that a tile load did not zero-fill). The Threads threads
/// 0 .. Threads - 1 of the caller (`thread`: this one's index among them) take part.
template <int D, int Threads>
__device__ __forceinline__ void transpose_tile(shared_ptr_t<const std::uint8_t> src, shared_ptr_t<std::uint8_t> dst,
                                               int thread, int valid) {
    for (int w = thread; w < attention::transpose_items<D>; w += Threads) {
        const attention::transpose_item it = attention::transpose_work<D>(w);
        const int chunk = it.col / 16, inner = it.col % 16;
        auto word = [&](int r) -> std::uint32_t {
            return r < valid ? *OCTET_SHARED_CAST(const std::uint32_t, src + swz<D>(r, chunk) + inner) : 0u;
        };
        std::uint32_t out[4];
        attention::transpose_words(
            word(it.r0), word(it.r0 + 1), word(it.r0 + 8), word(it.r0 + 9), out,
            [](std::uint32_t a, std::uint32_t b, std::uint32_t sel) { return __byte_perm(a, b, sel); });
        OCTET_UNROLL
        for (int i = 0; i < 4; ++i)
            *OCTET_SHARED_CAST(std::uint32_t, dst + swz<64>(it.col + i, it.gq) + 4 * it.t) = out[i];
    }
}

/// transpose_tile's result, on sm_90 with ldmatrix and stmatrix: each of the Threads / 32 warps moves
/// 16 tokens x 32 channels per step with one ldmatrix.x4.trans (lane L: tokens 2 (L % 4), + 1 and
/// + 8, + 9 of the group, channels 2 (L / 4), + 1 and + 16, + 17 of the block), four byte permutes
/// that make each channel's 4 tokens one word (perm_pos's order), and one stmatrix.x4. It reads whole
/// 8-token blocks, also the tokens from `valid` on (written as zeros): a caller that writes them
/// orders those writes before (a barrier). `thread`: this one's index among the Threads.
///
/// Row r of stmatrix's matrix k is channel 32 cb + 16 (k >> 1) + 2 r + ((k & 1) ^ (r >> 2)): rows 4-7
/// take the other channel of each pair, so that each matrix's 8 rows (of 64-byte rows, swizzled by
/// channel / 2) cover all 32 banks; with one parity per matrix they would share them two ways.
template <int D, int Threads>
__device__ __forceinline__ void transpose_tile_sm90(shared_ptr_t<const std::uint8_t> src,
                                                    shared_ptr_t<std::uint8_t> dst, int thread, int valid) {
    static_assert(Threads % 32 == 0, "whole warps");
    const int warp = thread >> 5, lane = thread & 31;
    const int m = lane >> 3, i = lane & 7;  // the matrix and row this lane addresses
    const int t = lane & 3;                 // tokens 2t, 2t + 1 of each 8-token half
    // the permutes that pick channel 2 (L / 4) (even) and 2 (L / 4) + 1 (odd) of a register pair,
    // swapped for the lanes that fill rows 4-7 (L / 4 >= 4)
    const std::uint32_t even = (lane >> 4) != 0 ? 0x7531u : 0x6420u, odd = even ^ 0x1111u;
    for (int step = warp; step < 4 * (D / 32); step += Threads / 32) {
        const int gq = step / (D / 32), cb = step % (D / 32);  // 16-token group, 32-channel block
        std::uint32_t r[4];  // matrices: tokens 0-7 and 8-15 of the group, by channels 0-15 and 16-31
        ptx::ldmatrix_x4_trans(r, ptx::shared_address(src + swz<D>(16 * gq + 8 * (m & 1) + i, 2 * cb + (m >> 1))));
        std::uint32_t w[4] = {__byte_perm(r[0], r[1], even), __byte_perm(r[0], r[1], odd),
                              __byte_perm(r[2], r[3], even), __byte_perm(r[2], r[3], odd)};
        if (16 * gq + 16 > valid) {  // byte b of a word is token 16 gq + 2t + (b & 1) + 8 (b >> 1)
            std::uint32_t keep = 0;
            OCTET_UNROLL
            for (int b = 0; b < 4; ++b)
                if (16 * gq + 2 * t + (b & 1) + 8 * (b >> 1) < valid) keep |= 0xFFu << (8 * b);
            OCTET_UNROLL
            for (int k = 0; k < 4; ++k) w[k] &= keep;
        }
        // w[k] is row L / 4 of matrix k
        ptx::stmatrix_x4(
            w, ptx::shared_address(dst + swz<64>(32 * cb + 16 * (m >> 1) + 2 * i + ((m & 1) ^ (i >> 2)), gq)));
    }
}

// ---- warp reductions ------------------------------------------------------------------------------

__device__ __forceinline__ float shfl_xor(float v, int m) {
    return __shfl_xor_sync(0xFFFFFFFFu, v, m);
}

}  // namespace attention
}  // namespace detail
}  // namespace octet
