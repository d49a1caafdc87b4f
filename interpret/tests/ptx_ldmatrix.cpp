// ptx::ldmatrix_x{1,2,4}{,_trans} (ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16) under the
// interpreter, checked against the PTX ISA's description, independently of octet's kernels: lanes
// 8m..8m+7 give the row addresses of matrix m (here rows of a shared tile in a random order), and
// thread i of the warp holds, of each matrix, row i / 4, elements 2 (i % 4) and 2 (i % 4) + 1 (with
// .trans, column i / 4, rows 2 (i % 4) and 2 (i % 4) + 1). The addresses of lanes beyond the loaded
// matrices are not used (so not checked). Misuse: a row address that is not 16-byte aligned or lies
// outside shared memory, rows nobody wrote, lanes in different forms of the instruction.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "octet/cuda/ptx.cuh"
#include "octet/cuda/shared_memory.cuh"
#include "support/interpret_reports.hpp"
#include "support/random.hpp"

namespace ptx_ldmatrix_test {
namespace oi = octet::interpret;

using octet_test::all_messages;
using octet_test::collect;
using octet_test::first;
using octet_test::has;

constexpr int kRows = 48;  // the shared tile: 48 rows of 8 16-bit elements

enum class form { x1, x2, x4, x1t, x2t, x4t };
int matrices(form f) {
    return f == form::x1 || f == form::x1t ? 1 : f == form::x2 || f == form::x2t ? 2 : 4;
}
bool transposed(form f) {
    return f == form::x1t || f == form::x2t || f == form::x4t;
}

/// The block's threads store the tile (each another lane's share), then each warp loads with the
/// row of lane L at tile row rows[L]; `offset` is added to lane `bad_lane`'s address (misuse tests).
__global__ void ldmatrix_kernel(const std::uint16_t* tile_in, const int* rows, form f, std::uint32_t* out, int bad_lane,
                                int offset, bool write_tile) {
    OCTET_SHARED_ALIGNED(std::uint16_t[kRows * 8], tile, 128);
    const unsigned t = threadIdx.x, lane = t % 32;
    if (write_tile)
        for (unsigned i = (t + 5) % blockDim.x; i < kRows * 8; i += blockDim.x) tile[i] = tile_in[i];
    __syncthreads();
    std::uint32_t address = octet::ptx::shared_address(tile + 8 * rows[lane]);
    if (static_cast<int>(lane) == bad_lane) address += static_cast<std::uint32_t>(offset);
    if (matrices(f) < 4 && lane >= 8u * static_cast<unsigned>(matrices(f)))
        address = 0xFFFFFFF0u;  // unused by the ISA: must not be read, nor reported
    std::uint32_t r[4] = {0xAAAAAAAAu, 0xAAAAAAAAu, 0xAAAAAAAAu, 0xAAAAAAAAu};
    switch (f) {
        case form::x1:
            octet::ptx::ldmatrix_x1(reinterpret_cast<std::uint32_t(&)[1]>(r), address);
            break;
        case form::x2:
            octet::ptx::ldmatrix_x2(reinterpret_cast<std::uint32_t(&)[2]>(r), address);
            break;
        case form::x4:
            octet::ptx::ldmatrix_x4(r, address);
            break;
        case form::x1t:
            octet::ptx::ldmatrix_x1_trans(reinterpret_cast<std::uint32_t(&)[1]>(r), address);
            break;
        case form::x2t:
            octet::ptx::ldmatrix_x2_trans(reinterpret_cast<std::uint32_t(&)[2]>(r), address);
            break;
        case form::x4t:
            octet::ptx::ldmatrix_x4_trans(r, address);
            break;
    }
    for (int m = 0; m < 4; ++m) out[4 * t + m] = r[m];
}

/// Lanes 0-15 load x4, lanes 16-31 x4.trans.
__global__ void divergent_kernel(std::uint32_t* out) {
    OCTET_SHARED_ALIGNED(std::uint16_t[32 * 8], tile, 16);
    for (int i = 0; i < 8; ++i) tile[8 * threadIdx.x + i] = static_cast<std::uint16_t>(i);
    __syncwarp();
    std::uint32_t r[4];
    const std::uint32_t address = octet::ptx::shared_address(tile + 8 * threadIdx.x);
    if (threadIdx.x < 16)
        octet::ptx::ldmatrix_x4(r, address);
    else
        octet::ptx::ldmatrix_x4_trans(r, address);
    out[threadIdx.x] = r[0];
}

TEST_CASE("ldmatrix m8n8 .x1/.x2/.x4 and .trans: every lane's registers as the ISA describes") {
    auto g = octet_test::rng(77);
    std::vector<std::uint16_t> tile(kRows * 8);
    for (auto& x : tile) x = static_cast<std::uint16_t>(g());
    for (form f : {form::x1, form::x2, form::x4, form::x1t, form::x2t, form::x4t}) {
        std::vector<int> rows(kRows);
        std::iota(rows.begin(), rows.end(), 0);
        std::shuffle(rows.begin(), rows.end(), g);
        rows.resize(32);
        std::vector<std::uint32_t> out(2 * 32 * 4, 0);
        const auto r = oi::launch("ldmatrix", {oi::dim3(1), oi::dim3(64)}, collect(), ldmatrix_kernel, tile.data(),
                                  rows.data(), f, out.data(), -1, 0, true);
        CHECK_MESSAGE(r.clean(), all_messages(r));
        const int n = matrices(f);
        for (unsigned t = 0; t < 64; ++t) {
            const unsigned i = t % 32;
            for (int m = 0; m < 4; ++m) {
                INFO("form " << static_cast<int>(f) << ", thread " << t << ", matrix " << m);
                std::uint32_t expect = 0xAAAAAAAAu;  // registers beyond the loaded matrices are untouched
                if (m < n) {
                    // element (row, col) of matrix m: element col of the row lane 8m + row addressed
                    auto element = [&](unsigned row, unsigned col) -> std::uint32_t {
                        return tile[8 * rows[8 * m + row] + col];
                    };
                    expect = transposed(f) ? element(2 * (i % 4), i / 4) | element(2 * (i % 4) + 1, i / 4) << 16
                                           : element(i / 4, 2 * (i % 4)) | element(i / 4, 2 * (i % 4) + 1) << 16;
                }
                CHECK(out[4 * t + m] == expect);
            }
        }
    }
}

TEST_CASE("ldmatrix: misaligned and out-of-bounds row addresses, unwritten rows, divergent lanes are reported") {
    std::vector<std::uint16_t> tile(kRows * 8, 1);
    std::vector<int> rows(32);
    std::iota(rows.begin(), rows.end(), 0);
    std::vector<std::uint32_t> out(32 * 4);
    // lane 5's row 8 bytes off its 16-byte boundary
    const auto mis = oi::launch("ldmatrix_misaligned", {oi::dim3(1), oi::dim3(32)}, collect(), ldmatrix_kernel,
                                tile.data(), rows.data(), form::x4, out.data(), 5, 8, true);
    REQUIRE_MESSAGE(has(mis, oi::check::out_of_bounds), all_messages(mis));
    const oi::report& m = first(mis, oi::check::out_of_bounds);
    CHECK(m.kernel == "ldmatrix_misaligned");
    CHECK(m.thread.x == 5);
    CHECK(m.detail.find("not 16-byte aligned") != std::string::npos);
    CHECK(m.address.find("shared 0x58") != std::string::npos);  // row 5 (0x50) + 8
    // lane 9's row past the tile's end (x2: lanes 8-15 address matrix 1)
    const auto oob = oi::launch("ldmatrix_oob", {oi::dim3(1), oi::dim3(32)}, collect(), ldmatrix_kernel, tile.data(),
                                rows.data(), form::x2t, out.data(), 9, 16 * (kRows - 9), true);
    REQUIRE_MESSAGE(has(oob, oi::check::out_of_bounds), all_messages(oob));
    CHECK(first(oob, oi::check::out_of_bounds).thread.x == 9);
    CHECK(first(oob, oi::check::out_of_bounds).detail.find("reads 16 bytes") != std::string::npos);
    // the same address from lane 9 of an x1, which does not use it: clean
    const auto unused = oi::launch("ldmatrix_unused", {oi::dim3(1), oi::dim3(32)}, collect(), ldmatrix_kernel,
                                   tile.data(), rows.data(), form::x1, out.data(), 9, 16 * (kRows - 9), true);
    CHECK_MESSAGE(unused.clean(), all_messages(unused));
    // nobody wrote the tile
    const auto uninit = oi::launch("ldmatrix_uninit", {oi::dim3(1), oi::dim3(32)}, collect(), ldmatrix_kernel,
                                   tile.data(), rows.data(), form::x4, out.data(), -1, 0, false);
    REQUIRE_MESSAGE(has(uninit, oi::check::uninitialized_read), all_messages(uninit));
    CHECK(first(uninit, oi::check::uninitialized_read).detail.find("16 bytes") != std::string::npos);
    // half the warp in x4, half in x4.trans
    const auto div =
        oi::launch("ldmatrix_divergent", {oi::dim3(1), oi::dim3(32)}, collect(), divergent_kernel, out.data());
    REQUIRE_MESSAGE(has(div, oi::check::warp_sync), all_messages(div));
    CHECK(first(div, oi::check::warp_sync).detail.find("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") !=
          std::string::npos);
}

}  // namespace ptx_ldmatrix_test
