// The attention kernels' tile and fragment bookkeeping, checked on the CPU: the index functions the
// kernels use (octet/attention/detail/fragments.hpp) drive an emulation of ldmatrix.x4 and
// mma.sync.m16n8k32 (written from the PTX ISA's fragment definitions, see the header's
// conventions), and every product a warp of the kernels forms is compared with the plain matrix
// product of the same FP8 tiles:
//   S = Q K^T (A from a row-major tile, B from a row-major tile; also S^T = K Q^T and dP^T),
//   O = P V with P taken from S's accumulator fragments and V transposed by the kernels' transpose,
//   dV/dK = P^T dO, dS^T Q (the same path with other tiles),
//   dQ = dS K with dS written to the kernels' dS tile and K transposed.
// Head dims 64 and 128 (64- and 128-byte tile rows), all four warps, random codes.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "octet/attention/detail/fragments.hpp"
#include "octet/format/encode.hpp"
#include "support/random.hpp"

namespace attention_fragments_test {
using namespace octet;
using namespace octet::detail::attention;

using regs4 = std::uint32_t[32][4];

/// A tile stored the kernels' way: rows of RowBytes bytes with swizzled 16-byte chunks.
template <int RowBytes>
std::vector<std::uint8_t> store_tile(const std::vector<std::uint8_t>& m, int rows) {
    std::vector<std::uint8_t> s(static_cast<std::size_t>(rows) * RowBytes);
    for (int r = 0; r < rows; ++r)
        for (int ch = 0; ch < RowBytes / 16; ++ch)
            for (int i = 0; i < 16; ++i)
                s[swz<RowBytes>(r, ch) + i] = m[static_cast<std::size_t>(r) * RowBytes + 16 * ch + i];
    return s;
}

std::uint32_t word(const std::vector<std::uint8_t>& s, int off) {
    return s[off] | (s[off + 1] << 8) | (s[off + 2] << 16) | (static_cast<std::uint32_t>(s[off + 3]) << 24);
}

/// ldmatrix.x4: lane L supplies the address of row L % 8 of matrix L / 8; lane L receives, of
/// each matrix m, the 4 bytes at offset 4 (L % 4) of row L / 4.
template <int RowBytes, class Addr>
void ldsm(const std::vector<std::uint8_t>& s, Addr addr, regs4& out) {
    for (int L = 0; L < 32; ++L)
        for (int m = 0; m < 4; ++m) {
            const row_chunk rc = addr(8 * m + (L >> 2));
            out[L][m] = word(s, swz<RowBytes>(rc.row, rc.chunk) + 4 * (L & 3));
        }
}

/// mma.sync.m16n8k32 (E4M3 x E4M3 + float): A's (lane 4g + t, reg (row >= 8) + 2h, byte b) meets
/// B's (lane 4 col + t, reg h, byte b); C element (row, col) is lane 4 (row % 8) + col / 2,
/// element 2 (row >= 8) + col % 2. Sums in double (the check compares with float64 products).
void mma(double (&c)[32][4], const std::uint32_t (&a)[32][4], const std::uint32_t (&b)[32][2]) {
    for (int row = 0; row < 16; ++row)
        for (int col = 0; col < 8; ++col) {
            double acc = 0;
            for (int t = 0; t < 4; ++t)
                for (int h = 0; h < 2; ++h)
                    for (int by = 0; by < 4; ++by) {
                        const std::uint8_t ca = (a[4 * (row % 8) + t][(row >= 8 ? 1 : 0) + 2 * h] >> (8 * by)) & 0xFF;
                        const std::uint8_t cb = (b[4 * col + t][h] >> (8 * by)) & 0xFF;
                        acc += static_cast<double>(decode<e4m3>(ca)) * decode<e4m3>(cb);
                    }
            c[4 * (row % 8) + col / 2][2 * (row >= 8 ? 1 : 0) + col % 2] += acc;
        }
}

std::vector<std::uint8_t> random_codes(std::mt19937_64& g, std::size_t n) {
    std::uniform_int_distribution<int> d(0, 0x7E);  // finite E4M3 magnitudes
    std::bernoulli_distribution s(0.5);
    std::vector<std::uint8_t> v(n);
    for (auto& x : v) x = static_cast<std::uint8_t>(d(g) | (s(g) ? 0x80 : 0));
    return v;
}
double val(const std::vector<std::uint8_t>& m, int row, int cols, int col) {
    return decode<e4m3>(m[static_cast<std::size_t>(row) * cols + col]);
}

/// The kernels' transpose of a 64 x D tile into a D x 64 tile with permuted token groups.
template <int D>
std::vector<std::uint8_t> transpose(const std::vector<std::uint8_t>& src) {
    std::vector<std::uint8_t> dst(static_cast<std::size_t>(D) * 64);
    for (int w = 0; w < transpose_items<D>; ++w) {
        const transpose_item it = transpose_work<D>(w);
        const int chunk = it.col / 16, inner = it.col % 16;
        std::uint32_t out[4];
        transpose_words(word(src, swz<D>(it.r0, chunk) + inner), word(src, swz<D>(it.r0 + 1, chunk) + inner),
                        word(src, swz<D>(it.r0 + 8, chunk) + inner), word(src, swz<D>(it.r0 + 9, chunk) + inner), out,
                        [](std::uint32_t a, std::uint32_t b, std::uint32_t s) { return byte_perm_emulated(a, b, s); });
        for (int i = 0; i < 4; ++i)
            for (int by = 0; by < 4; ++by)
                dst[swz<64>(it.col + i, it.gq) + 4 * it.t + by] = static_cast<std::uint8_t>(out[i] >> (8 * by));
    }
    return dst;
}

template <int D>
void check_tiles(std::uint64_t salt) {
    INFO("head dim " << D);
    auto g = octet_test::rng(salt);
    const auto Q = random_codes(g, 64 * D), K = random_codes(g, 64 * D), V = random_codes(g, 64 * D);
    const auto sQ = store_tile<D>(Q, 64), sK = store_tile<D>(K, 64), sV = store_tile<D>(V, 64);

    // the transpose: every token and channel lands where perm_pos says, each transpose item
    // written exactly once
    const auto sVt = transpose<D>(sV);
    std::size_t misplaced = 0;
    for (int j = 0; j < 64; ++j)
        for (int c = 0; c < D; ++c)
            misplaced += sVt[swz<64>(c, j / 16) + perm_pos(j % 16)] != V[static_cast<std::size_t>(j) * D + c];
    CHECK(misplaced == 0);
    std::vector<int> hits(static_cast<std::size_t>(D) * 64, 0);
    for (int w = 0; w < transpose_items<D>; ++w) {
        const transpose_item it = transpose_work<D>(w);
        for (int i = 0; i < 4; ++i)
            for (int by = 0; by < 4; ++by) ++hits[swz<64>(it.col + i, it.gq) + 4 * it.t + by];
    }
    std::size_t bad_hits = 0;
    for (int h : hits) bad_hits += h != 1;
    CHECK(bad_hits == 0);

    std::size_t bad_s = 0, bad_o = 0, bad_dq = 0;
    std::vector<std::uint8_t> dsT(64 * 64);  // the dS tile as the gradient kernel's warps write it: [query][key]
    std::vector<std::uint8_t> sDS(64 * 64);
    for (int warp = 0; warp < 4; ++warp) {
        // S = Q K^T for rows 16 warp .. +15
        regs4 qa[D / 32];
        for (int ks = 0; ks < D / 32; ++ks)
            ldsm<D>(
                sQ, [&](int L) { return a_address(L, 16 * warp, ks); }, qa[ks]);
        double s[8][32][4] = {};
        for (int ks = 0; ks < D / 32; ++ks)
            for (int np = 0; np < 4; ++np) {
                regs4 r;
                ldsm<D>(
                    sK, [&](int L) { return b2_address(L, 16 * np, ks); }, r);
                std::uint32_t b0[32][2], b1[32][2];
                for (int L = 0; L < 32; ++L) {
                    b0[L][0] = r[L][0];
                    b0[L][1] = r[L][1];
                    b1[L][0] = r[L][2];
                    b1[L][1] = r[L][3];
                }
                mma(s[2 * np], qa[ks], b0);
                mma(s[2 * np + 1], qa[ks], b1);
            }
        for (int L = 0; L < 32; ++L)
            for (int n = 0; n < 8; ++n)
                for (int x = 0; x < 4; ++x) {
                    double want = 0;
                    for (int c = 0; c < D; ++c)
                        want += val(Q, 16 * warp + c_row(L, x), D, c) * val(K, c_col(L, n, x), D, c);
                    bad_s += s[n][L][x] != want;
                }

        // O = P V with P codes taken from S's fragment positions
        auto pcodes = random_codes(g, 32 * 8 * 4);
        auto pc = [&](int L, int n, int x) { return pcodes[(static_cast<std::size_t>(L) * 8 + n) * 4 + x]; };
        double P[16][64];
        for (int L = 0; L < 32; ++L)
            for (int n = 0; n < 8; ++n)
                for (int x = 0; x < 4; ++x) P[c_row(L, x)][c_col(L, n, x)] = decode<e4m3>(pc(L, n, x));
        std::uint32_t pa[2][32][4];
        for (int L = 0; L < 32; ++L)
            for (int ks = 0; ks < 2; ++ks)
                for (int reg = 0; reg < 4; ++reg) {
                    std::uint32_t w = 0;
                    for (int by = 0; by < 4; ++by) {
                        const n_x src = a_source(ks, reg, by);
                        w |= static_cast<std::uint32_t>(pc(L, src.n, src.x)) << (8 * by);
                    }
                    pa[ks][L][reg] = w;
                }
        for (int nd = 0; nd < D / 8; ++nd) {
            regs4 r;
            ldsm<64>(
                sVt, [&](int L) { return bt_address(L, 8 * nd); }, r);
            std::uint32_t b[2][32][2];
            for (int L = 0; L < 32; ++L)
                for (int ks = 0; ks < 2; ++ks) {
                    b[ks][L][0] = r[L][2 * ks];
                    b[ks][L][1] = r[L][2 * ks + 1];
                }
            double acc[32][4] = {};
            mma(acc, pa[0], b[0]);
            mma(acc, pa[1], b[1]);
            for (int L = 0; L < 32; ++L)
                for (int x = 0; x < 4; ++x) {
                    double want = 0;
                    for (int j = 0; j < 64; ++j) want += P[c_row(L, x)][j] * val(V, j, D, c_col(L, nd, x));
                    bad_o += acc[L][x] != want;
                }
        }

        // the gradient kernel's dS tile: this warp's 16 keys (rows of its S^T fragments) x 64 queries
        auto dcodes = random_codes(g, 32 * 8 * 4);
        for (int L = 0; L < 32; ++L)
            for (int n = 0; n < 8; ++n)
                for (int x = 0; x < 4; ++x) {
                    const std::uint8_t code = dcodes[(static_cast<std::size_t>(L) * 8 + n) * 4 + x];
                    const int key = 16 * warp + c_row(L, x), query = c_col(L, n, x);
                    dsT[static_cast<std::size_t>(query) * 64 + key] = code;
                    sDS[ds_offset(query, warp, c_row(L, x))] = code;
                }
    }
    // dQ = dS K for each warp's 16 queries: A from the dS tile, B from K transposed
    const auto sKt = transpose<D>(sK);
    for (int warp = 0; warp < 4; ++warp) {
        regs4 da[2];
        for (int ks = 0; ks < 2; ++ks)
            ldsm<64>(
                sDS, [&](int L) { return a_address(L, 16 * warp, ks); }, da[ks]);
        for (int nd = 0; nd < D / 8; ++nd) {
            regs4 r;
            ldsm<64>(
                sKt, [&](int L) { return bt_address(L, 8 * nd); }, r);
            std::uint32_t b[2][32][2];
            for (int L = 0; L < 32; ++L)
                for (int ks = 0; ks < 2; ++ks) {
                    b[ks][L][0] = r[L][2 * ks];
                    b[ks][L][1] = r[L][2 * ks + 1];
                }
            double acc[32][4] = {};
            mma(acc, da[0], b[0]);
            mma(acc, da[1], b[1]);
            for (int L = 0; L < 32; ++L)
                for (int x = 0; x < 4; ++x) {
                    const int query = 16 * warp + c_row(L, x);
                    double want = 0;
                    for (int j = 0; j < 64; ++j) want += val(dsT, query, 64, j) * val(K, j, D, c_col(L, nd, x));
                    bad_dq += acc[L][x] != want;
                }
        }
    }
    CHECK(bad_s == 0);
    CHECK(bad_o == 0);
    CHECK(bad_dq == 0);
}

TEST_CASE(
    "attention fragments: S = Q K^T, O = P V (P from S's fragments, V transposed) and dQ = dS K match plain products") {
    check_tiles<64>(61);
    check_tiles<128>(62);
}

TEST_CASE("attention fragments: swizzles are bijections and 8-row ldmatrix reads hit 8 bank groups") {
    for (int rb : {64, 128}) {
        const int chunks = rb / 16;
        std::vector<int> seen(64 * rb / 16, 0);
        for (int r = 0; r < 64; ++r)
            for (int c = 0; c < chunks; ++c) ++seen[(rb == 64 ? swz<64>(r, c) : swz<128>(r, c)) / 16];
        for (int s : seen) CHECK(s == 1);
        for (int r0 = 0; r0 < 64; r0 += 8)
            for (int c = 0; c < chunks; ++c) {
                int groups = 0;
                for (int r = r0; r < r0 + 8; ++r)
                    groups |= 1 << (((rb == 64 ? swz<64>(r, c) : swz<128>(r, c)) / 16) % 8);
                CHECK(groups == 0xFF);
            }
    }
    for (int j = 0; j < 16; ++j) {
        int n = 0;
        for (int k = 0; k < 16; ++k) n += perm_pos(k) == perm_pos(j);
        CHECK(n == 1);
    }
}

}  // namespace attention_fragments_test
