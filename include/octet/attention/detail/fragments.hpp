// octet/attention/detail/fragments.hpp: the index arithmetic of the attention kernels' tiles and
// tensor-core fragments, as OCTET_HD functions. The kernels (detail/tiles.cuh and the kernel files
// beside it) take every shared-memory address and every fragment coordinate from here, and
// tests/host/attention_fragments.cpp runs the same functions against an emulation of ldmatrix and
// mma.sync on the CPU, so the bookkeeping is checked without a GPU.
//
// Conventions (lane = 4 g + t):
//   mma.sync.m16n8k32 with 8-bit operands: A regs 0..3 = (row g, k half 0), (row g + 8, half 0),
//   (row g, half 1), (row g + 8, half 1); B regs 0..1 = (column g, half 0), (column g, half 1);
//   each register holds 4 bytes b = 0..3 of lane t; A's (t, half, b) meets B's (t, half, b).
//   C: element x = 0..3 of an n8 tile is (row g + 8 (x >> 1), column 2 t + (x & 1)).
//   ldmatrix.x4: lane L gives the address of row L % 8 of matrix L / 8 and receives, of each matrix
//   m, the 4 bytes at offset 4 t of row g (register m).
#pragma once

#include <cstdint>

#include "octet/config.hpp"

namespace octet {
namespace detail {
namespace attention {

inline constexpr int tile = 64;

/// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of RowBytes-byte rows (64 or 128),
/// with chunks XOR-swizzled by row so that 8 consecutive rows at one chunk hit 8 bank groups.
template <int RowBytes>
OCTET_HD constexpr int swz(int row, int chunk) {
    static_assert(RowBytes == 64 || RowBytes == 128, "attention tiles have rows of 64 or 128 bytes");
    constexpr int C = RowBytes / 16;
    return row * RowBytes + 16 * (chunk ^ ((row / (8 / C)) % C));
}

/// Position, within its 16-token group, at which a transposed tile stores token `local` (0..15):
/// token 8a + 2t + e sits at 4t + 2a + e, so that the four tokens a lane's P word holds are 4
/// contiguous bytes.
OCTET_HD constexpr int perm_pos(int local) {
    return 4 * ((local >> 1) & 3) + 2 * (local >> 3) + (local & 1);
}

struct row_chunk {
    int row, chunk;
};

/// ldmatrix.x4 address of lane `lane` for the A fragments of 16 rows from row0, k-step ks (32 bytes).
OCTET_HD constexpr row_chunk a_address(int lane, int row0, int ks) {
    return {row0 + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * ks + (lane >> 4)};
}
/// ldmatrix.x4 address for the B fragments of two n8 tiles (tile rows n0 .. n0 + 15), k-step ks:
/// registers 0, 1 = first n8 tile (halves 0, 1), registers 2, 3 = second.
OCTET_HD constexpr row_chunk b2_address(int lane, int n0, int ks) {
    return {n0 + 8 * (lane >> 4) + (lane & 7), 2 * ks + ((lane >> 3) & 1)};
}
/// ldmatrix.x4 address for the B fragments of one n8 tile (rows n0 .. n0 + 7) of a transposed
/// 64-wide tile, both k-steps: registers 0, 1 = k-step 0 halves 0, 1; registers 2, 3 = k-step 1.
OCTET_HD constexpr row_chunk bt_address(int lane, int n0) {
    return {n0 + (lane & 7), lane >> 3};
}

/// Row (0..15) of C element x held by lane.
OCTET_HD constexpr int c_row(int lane, int x) {
    return (lane >> 2) + 8 * (x >> 1);
}
/// Column (0..63) of C element x of n8 tile n held by lane.
OCTET_HD constexpr int c_col(int lane, int n, int x) {
    return 8 * n + 2 * (lane & 3) + (x & 1);
}

struct n_x {
    int n, x;
};
/// Which C element (n8 tile n, element x) of a 16 x 64 score tile fills byte b of A register reg
/// in k-step ks (0, 1) of the next product (P V, P^T dO, dS^T Q): the n8 tiles 4 ks + 2 half and
/// 4 ks + 2 half + 1 give lane t the columns {8n + 2t, 8n + 2t + 1} of both.
OCTET_HD constexpr n_x a_source(int ks, int reg, int b) {
    return {4 * ks + 2 * (reg >> 1) + (b >> 1), 2 * (reg & 1) + (b & 1)};
}

/// Byte offset in the dS tile (64 queries x 64 keys, keys permuted like a transposed tile) of the
/// element at query `query` and key 16 warp + local.
OCTET_HD constexpr int ds_offset(int query, int warp, int local) {
    return swz<64>(query, warp) + perm_pos(local);
}

/// One work item of the tile transpose: tokens 16 gq + {2t, 2t + 1, 8 + 2t, 9 + 2t} (positions
/// 4t .. 4t + 3 of group gq) by channels col .. col + 3. A warp's lanes take 4 values of t and 8
/// consecutive channel quads: reads hit 32 banks (D = 128), writes at most 4 per bank.
struct transpose_item {
    int r0, col, gq, t;
};
template <int D>
OCTET_HD constexpr transpose_item transpose_work(int w) {
    return {16 * (w / 32 / (D / 32)) + 2 * (w & 3), 4 * (8 * ((w / 32) % (D / 32)) + ((w & 31) >> 2)),
            (w / 32) / (D / 32), w & 3};
}
template <int D>
inline constexpr int transpose_items = 4 * D;  // 4 groups x 4 quads x D / 4 channel quads

/// __byte_perm on the host (the device uses the instruction): byte i of the result is byte
/// (s >> 4i) & 7 of the 8-byte value (b:a).
OCTET_HD constexpr std::uint32_t byte_perm_emulated(std::uint32_t a, std::uint32_t b, std::uint32_t s) {
    std::uint32_t r = 0;
    for (int i = 0; i < 4; ++i) {
        const std::uint32_t sel = (s >> (4 * i)) & 7u;
        const std::uint32_t byte = sel < 4 ? (a >> (8 * sel)) & 0xFFu : (b >> (8 * (sel - 4))) & 0xFFu;
        r |= byte << (8 * i);
    }
    return r;
}

/// The 4 output words of a transpose item from its 4 input words (rows r0, r0 + 1, r0 + 8, r0 + 9,
/// channels col .. col + 3): word i = channel col + i of the four tokens, in that order.
template <class Perm>
OCTET_HD void transpose_words(std::uint32_t w0, std::uint32_t w1, std::uint32_t w2, std::uint32_t w3,
                              std::uint32_t (&out)[4], Perm perm) {
    const std::uint32_t lo01 = perm(w0, w1, 0x5140u), hi01 = perm(w0, w1, 0x7362u);
    const std::uint32_t lo23 = perm(w2, w3, 0x5140u), hi23 = perm(w2, w3, 0x7362u);
    out[0] = perm(lo01, lo23, 0x5410u);
    out[1] = perm(lo01, lo23, 0x7632u);
    out[2] = perm(hi01, hi23, 0x5410u);
    out[3] = perm(hi01, hi23, 0x7632u);
}

}  // namespace attention
}  // namespace detail
}  // namespace octet
