// ptx::stmatrix_x4 (stmatrix.sync.aligned.m8n8.x4.shared.b16) under the interpreter, checked against the
// PTX ISA's description, independently of octet's kernels: lanes 8m..8m+7 give the row addresses of
// matrix m (here rows of a shared tile in a random order), and thread i of the warp holds, of each
// matrix, row i / 4, elements 2 (i % 4) and 2 (i % 4) + 1. Misuse: a misaligned row address. Then the
// sm_90 tile transpose built on it and ldmatrix (detail::attention::transpose_tile_sm90) against the
// portable one (transpose_tile), byte for byte, tokens past `valid` included.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "octet/attention/detail/tiles.cuh"
#include "octet/cuda/ptx.cuh"
#include "octet/cuda/shared_memory.cuh"
#include "support/interpret_reports.hpp"
#include "support/random.hpp"

namespace ptx_stmatrix_test {
namespace oi = octet::interpret;

using octet_test::all_messages;
using octet_test::collect;
using octet_test::first;
using octet_test::has;

constexpr int kRows = 48;  // the shared tile: 48 rows of 8 16-bit elements

/// One warp stores its lanes' registers (regs[4 L + m]: lane L's r[m]) with the row address of lane L
/// at tile row rows[L], over a tile filled with 0xEEEE; `offset` is added to lane `bad_lane`'s address
/// (misuse test). The tile is copied out after a barrier.
__global__ void stmatrix_kernel(const std::uint32_t* regs, const int* rows, std::uint16_t* tile_out, int bad_lane,
                                int offset) {
    OCTET_SHARED_ALIGNED(std::uint16_t[kRows * 8], tile, 128);
    const unsigned t = threadIdx.x, lane = t % 32;
    for (unsigned i = t; i < kRows * 8; i += blockDim.x) tile[i] = 0xEEEEu;
    __syncthreads();
    std::uint32_t address = octet::ptx::shared_address(tile + 8 * rows[lane]);
    if (static_cast<int>(lane) == bad_lane) address += static_cast<std::uint32_t>(offset);
    const std::uint32_t r[4] = {regs[4 * lane], regs[4 * lane + 1], regs[4 * lane + 2], regs[4 * lane + 3]};
    octet::ptx::stmatrix_x4(r, address);
    __syncthreads();
    for (unsigned i = t; i < kRows * 8; i += blockDim.x) tile_out[i] = tile[i];
}

TEST_CASE("stmatrix m8n8 .x4: every row written as the ISA describes, the other rows untouched") {
    auto g = octet_test::rng(78);
    std::vector<std::uint32_t> regs(32 * 4);
    for (auto& x : regs) x = static_cast<std::uint32_t>(g());
    std::vector<int> rows(kRows);
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), g);
    rows.resize(32);
    std::vector<std::uint16_t> tile(kRows * 8, 0);
    const auto r = oi::launch("stmatrix", {oi::dim3(1), oi::dim3(32)}, collect(), stmatrix_kernel, regs.data(),
                              rows.data(), tile.data(), -1, 0);
    REQUIRE_MESSAGE(r.clean(), all_messages(r));
    std::vector<int> matrix_row(kRows, -1);  // which (matrix, row) each tile row received
    for (int l = 0; l < 32; ++l) matrix_row[rows[l]] = l;
    for (int tr = 0; tr < kRows; ++tr)
        for (int c = 0; c < 8; ++c) {
            INFO("tile row " << tr << ", element " << c);
            std::uint32_t expect = 0xEEEEu;
            if (matrix_row[tr] >= 0) {
                const int m = matrix_row[tr] / 8, row = matrix_row[tr] % 8;
                // element c of row `row` of matrix m: half c % 2 of register m of lane 4 row + c / 2
                const std::uint32_t v = regs[4 * (4 * row + c / 2) + m];
                expect = c % 2 == 0 ? v & 0xFFFFu : v >> 16;
            }
            CHECK(tile[8 * tr + c] == expect);
        }
}

TEST_CASE("stmatrix: a misaligned row address is reported") {
    std::vector<std::uint32_t> regs(32 * 4, 1);
    std::vector<int> rows(32);
    std::iota(rows.begin(), rows.end(), 0);
    std::vector<std::uint16_t> tile(kRows * 8, 0);
    const auto mis = oi::launch("stmatrix_misaligned", {oi::dim3(1), oi::dim3(32)}, collect(), stmatrix_kernel,
                                regs.data(), rows.data(), tile.data(), 6, 4);
    REQUIRE_MESSAGE(has(mis, oi::check::out_of_bounds), all_messages(mis));
    CHECK(first(mis, oi::check::out_of_bounds).thread.x == 6);
    CHECK(first(mis, oi::check::out_of_bounds).detail.find("not 16-byte aligned") != std::string::npos);
}

/// Both transposes of one 64 x D tile (random codes), with `valid` tokens, into two outputs.
template <int D>
__global__ void transpose_kernel(const std::uint8_t* in, int valid, std::uint8_t* portable, std::uint8_t* sm90) {
    OCTET_SHARED_ALIGNED(std::uint8_t[64 * D], src, 1024);
    OCTET_SHARED_ALIGNED(std::uint8_t[64 * D], a, 1024);
    OCTET_SHARED_ALIGNED(std::uint8_t[64 * D], b, 1024);
    const int t = static_cast<int>(threadIdx.x);
    for (int i = t; i < 64 * D; i += 128) src[i] = in[i];
    __syncthreads();
    octet::detail::attention::transpose_tile<D, 128>(src, a, t, valid);
    octet::detail::attention::transpose_tile_sm90<D, 128>(src, b, t, valid);
    __syncthreads();
    for (int i = t; i < 64 * D; i += 128) {
        portable[i] = a[i];
        sm90[i] = b[i];
    }
}

TEST_CASE_TEMPLATE("transpose_tile_sm90 (ldmatrix.trans, byte permutes, stmatrix) writes transpose_tile's bytes", Dc,
                   std::integral_constant<int, 64>, std::integral_constant<int, 128>) {
    constexpr int D = Dc::value;
    auto g = octet_test::rng(79 + D);
    std::vector<std::uint8_t> in(64 * D);
    for (auto& x : in) x = static_cast<std::uint8_t>(g());
    for (int valid : {64, 100, 63, 50, 17, 9, 1, 0, -3}) {
        INFO("D " << D << ", valid " << valid);
        std::vector<std::uint8_t> portable(64 * D, 1), sm90(64 * D, 2);
        const auto r = oi::launch("transpose", {oi::dim3(1), oi::dim3(128)}, collect(), transpose_kernel<D>, in.data(),
                                  valid, portable.data(), sm90.data());
        REQUIRE_MESSAGE(r.clean(), all_messages(r));
        CHECK(portable == sm90);
        // and the tokens from `valid` on are zeros: channel 0's row holds token 0 at position 0 (perm_pos)
        if (valid <= 0) CHECK(std::all_of(sm90.begin(), sm90.end(), [](std::uint8_t x) { return x == 0; }));
        if (valid >= 64) CHECK(std::count(sm90.begin(), sm90.end(), std::uint8_t{0}) < 64 * D / 16);
    }
}

}  // namespace ptx_stmatrix_test
