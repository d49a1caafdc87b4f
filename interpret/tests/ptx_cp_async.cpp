// The interpreter's model of cp.async (octet/interpret/ptx_models.hpp) through the ptx:: functions
// (octet/cuda/ptx.cuh), checked against the PTX ISA's description on small kernels written here:
// cp-size bytes land at dst, the first src-size of them from src and the rest zeros; a copy's bytes
// are visible to its thread only after the wait_group / wait_all covering its group (wait_group N
// completes all but the N newest committed groups, commit_group of nothing makes an empty group, and
// uncommitted copies stay in flight), and to other threads only through a barrier after that wait.
// The misuses the ISA leaves undefined are reports: reading the destination before the wait, reading
// another thread's copy without a barrier after its wait, a misaligned operand, src-size over cp-size,
// a source past the end of its buffer, and exiting with copies in flight.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "octet/cuda/launch.cuh"
#include "octet/cuda/ptx.cuh"
#include "octet/cuda/shared_memory.cuh"

namespace interpret_cp_async_test {
namespace oi = octet::interpret;
namespace ptx = octet::ptx;

constexpr std::uint8_t kStale = 0xA5;  // what the destination held before a copy

std::vector<std::uint8_t> random_bytes(std::size_t n, unsigned seed) {
    std::mt19937 gen(seed);
    std::vector<std::uint8_t> v(n);
    for (auto& b : v) b = static_cast<std::uint8_t>(gen());
    return v;
}

oi::options collecting() {
    oi::options o;
    o.mode = oi::on_report::collect;
    return o;
}

/// Thread t copies Size bytes from src + Size t with src-size t % (Size + 1) into tile + Size t,
/// over stale bytes, waits, and after a barrier thread 0 copies the tile out.
template <int Size, bool CacheAll>
OCTET_KERNEL void sizes_kernel(const std::uint8_t* src, std::uint8_t* out) {
    OCTET_SHARED_ALIGNED(std::uint8_t[17 * 16], tile, 16);
    const unsigned t = threadIdx.x, n = blockDim.x;
    for (int i = 0; i < Size; ++i) tile[Size * t + i] = kStale;
    const std::uint32_t src_size = t % (Size + 1);
    if (CacheAll)
        ptx::cp_async_ca<Size>(ptx::shared_address(tile + Size * t), src + Size * t, src_size);
    else
        ptx::cp_async_cg_16(ptx::shared_address(tile + Size * t), src + Size * t, src_size);
    ptx::cp_async_commit_group();
    ptx::cp_async_wait_group<0>();
    __syncthreads();
    if (t == 0)
        for (unsigned i = 0; i < Size * n; ++i) out[i] = tile[i];
}

template <int Size, bool CacheAll>
void check_sizes(unsigned seed) {
    constexpr unsigned n = Size + 1;  // every src-size 0..Size once
    oi::guarded_buffer<std::uint8_t> src(Size * n, "src"), out(Size * n, "out");
    const auto in = random_bytes(Size * n, seed);
    for (std::size_t i = 0; i < in.size(); ++i) src[i] = in[i];
    const auto r = oi::launch("sizes_kernel", {1, n}, sizes_kernel<Size, CacheAll>, src.data(), out.data());
    CHECK(r.clean());
    for (unsigned t = 0; t < n; ++t)
        for (unsigned i = 0; i < static_cast<unsigned>(Size); ++i) {
            INFO("cp-size ", Size, ", src-size ", t, ", byte ", i, ", seed ", seed);
            CHECK(out[Size * t + i] == (i < t ? in[Size * t + i] : 0));
        }
}

TEST_CASE("cp.async copies src-size bytes and zero-fills the rest of cp-size, for every src-size") {
    const unsigned seed = std::random_device{}();
    check_sizes<16, false>(seed);
    check_sizes<16, true>(seed + 1);
    check_sizes<8, true>(seed + 2);
    check_sizes<4, true>(seed + 3);
}

/// One thread, with groups {slot 0}, {} (empty), {slot 1}, {slot 2, slot 3}, then an uncommitted copy
/// to slot 4: after each wait it records which slots hold the copied bytes.
OCTET_KERNEL void groups_kernel(const std::uint8_t* src, unsigned* landed) {
    OCTET_SHARED_ALIGNED(std::uint8_t[5 * 16], tile, 16);
    for (int i = 0; i < 5 * 16; ++i) tile[i] = kStale;
    auto copy = [&](int slot) { ptx::cp_async_cg_16(ptx::shared_address(tile + 16 * slot), src + 16 * slot, 16); };
    auto record = [&](int step) {
        unsigned mask = 0;
        for (int s = 0; s < 5; ++s) {
            bool same = true;
            for (int i = 0; i < 16; ++i) same = same && tile[16 * s + i] == src[16 * s + i];
            mask |= same ? 1u << s : 0u;
        }
        landed[step] = mask;
    };
    copy(0);
    ptx::cp_async_commit_group();
    ptx::cp_async_commit_group();  // an empty group
    copy(1);
    ptx::cp_async_commit_group();
    copy(2);
    copy(3);
    ptx::cp_async_commit_group();
    copy(4);  // not committed
    record(0);
    ptx::cp_async_wait_group<4>();  // 4 groups pending: nothing completes
    record(1);
    ptx::cp_async_wait_group<3>();  // the oldest, {slot 0}
    record(2);
    ptx::cp_async_wait_group<2>();  // the empty group
    record(3);
    ptx::cp_async_wait_group<1>();  // {slot 1}
    record(4);
    ptx::cp_async_wait_group<0>();  // {slot 2, slot 3}; slot 4 is not in a group
    record(5);
    ptx::cp_async_wait_all();  // commits slot 4's copy and waits for it
    record(6);
}

TEST_CASE("wait_group N completes exactly the groups older than the N newest, empty groups counting") {
    oi::guarded_buffer<std::uint8_t> src(5 * 16, "src");
    const auto in = random_bytes(5 * 16, std::random_device{}());
    for (std::size_t i = 0; i < in.size(); ++i) src[i] = static_cast<std::uint8_t>(in[i] == kStale ? 0 : in[i]);
    std::vector<unsigned> landed(7, ~0u);
    const auto r = oi::launch("groups_kernel", {1, 1}, groups_kernel, src.data(), landed.data());
    CHECK(r.clean());
    CHECK(landed == std::vector<unsigned>{0x00, 0x00, 0x01, 0x01, 0x03, 0x0F, 0x1F});
}

/// Thread 0 copies into tile and `mode` picks what follows: 0 reads tile before the wait; 1 waits,
/// and thread 1 reads tile with no barrier; 2 the barrier sits between the copy and the wait; 3 the
/// barrier follows the wait (correct).
OCTET_KERNEL void visibility_kernel(const std::uint8_t* src, int mode, unsigned* out) {
    OCTET_SHARED_ALIGNED(std::uint8_t[16], tile, 16);
    const unsigned t = threadIdx.x;
    if (t == 0) {
        ptx::cp_async_cg_16(ptx::shared_address(tile), src, 16);
        ptx::cp_async_commit_group();
        if (mode == 0) out[0] = tile[3];
    }
    if (mode == 2) __syncthreads();
    if (t == 0) ptx::cp_async_wait_group<0>();
    if (mode == 3) __syncthreads();
    if (t == 1) out[1] = tile[5];
}

TEST_CASE("the copy lands at the wait: reads before it, or unordered after it, are reported") {
    oi::guarded_buffer<std::uint8_t> src(16, "src");
    for (unsigned i = 0; i < 16; ++i) src[i] = static_cast<std::uint8_t>(i + 1);
    std::vector<unsigned> out(2, 0);
    SUBCASE("a barrier after the wait orders the copy before another thread's read") {
        const auto r = oi::launch("visibility_kernel", {1, 2}, visibility_kernel, src.data(), 3, out.data());
        CHECK(r.clean());
        CHECK(out[1] == 6);
    }
    SUBCASE("reading the destination before the wait is an uninitialized read") {
        try {
            oi::launch("visibility_kernel", {1, 2}, visibility_kernel, src.data(), 0, out.data());
            FAIL("no report");
        } catch (const oi::failure& f) {
            CHECK(f.which().kind == oi::check::uninitialized_read);
            CHECK(f.which().kernel == "visibility_kernel");
            CHECK(f.which().thread.x == 0);
            CHECK(f.which().address.find("tile+0x3") != std::string::npos);
        }
    }
    SUBCASE("another thread's read without a barrier after the wait races with the copy") {
        const auto r =
            oi::launch("visibility_kernel", {1, 2}, collecting(), visibility_kernel, src.data(), 1, out.data());
        REQUIRE(!r.reports.empty());
        CHECK(r.reports[0].kind == oi::check::race);
        CHECK(r.reports[0].thread.x == 1);
        CHECK(r.reports[0].address.find("tile+0x5") != std::string::npos);
        CHECK(r.reports[0].detail.find("thread (0,0,0) wrote") != std::string::npos);
    }
    SUBCASE("a barrier between the copy and its wait does not order the copy") {
        const auto r =
            oi::launch("visibility_kernel", {1, 2}, collecting(), visibility_kernel, src.data(), 2, out.data());
        // The barrier lets thread 1 read before thread 0's wait: the bytes have not landed (an
        // uninitialized read), and the copy's write at the wait is unordered with that read (a race).
        REQUIRE(r.reports.size() == 2);
        CHECK(r.reports[0].kind == oi::check::uninitialized_read);
        CHECK(r.reports[0].thread.x == 1);
        CHECK(r.reports[1].kind == oi::check::race);
        CHECK(r.reports[1].thread.x == 0);
        CHECK(r.reports[1].address.find("tile+0x0") != std::string::npos);
        CHECK(r.reports[1].detail.find("thread (1,0,0) read") != std::string::npos);
    }
}

/// Issues one copy with the given offsets and sizes and waits for it.
OCTET_KERNEL void misuse_kernel(const std::uint8_t* src, unsigned dst_offset, std::uint32_t src_size, bool wait) {
    OCTET_SHARED_ALIGNED(std::uint8_t[64], tile, 16);
    ptx::cp_async_cg_16(ptx::shared_address(tile + dst_offset), src, src_size);
    if (wait) ptx::cp_async_wait_all();
}

TEST_CASE("misaligned operands, src-size over cp-size and a source past its buffer are reported") {
    oi::guarded_buffer<std::uint8_t> src(64, "src");
    for (unsigned i = 0; i < 64; ++i) src[i] = static_cast<std::uint8_t>(i);
    auto report_of = [&](const std::uint8_t* s, unsigned dst_offset, std::uint32_t src_size) {
        const auto r = oi::launch("misuse_kernel", {2, 1}, collecting(), misuse_kernel, s, dst_offset, src_size, true);
        REQUIRE(r.reports.size() == 2);  // one per block: each report ends its block
        CHECK(r.reports[1].block.x == 1);
        return r.reports[0];
    };
    SUBCASE("the correct copy is clean") {
        CHECK(oi::launch("misuse_kernel", {2, 1}, collecting(), misuse_kernel, src.data(), 16u, 16u, true).clean());
    }
    SUBCASE("a destination not 16-byte aligned") {
        const oi::report r = report_of(src.data(), 8, 16);
        CHECK(r.kind == oi::check::ptx_misuse);
        CHECK(r.kernel == "misuse_kernel");
        CHECK(r.thread.x == 0);
        CHECK(r.address.find("tile+0x8") != std::string::npos);
        CHECK(r.detail.find("not aligned") != std::string::npos);
    }
    SUBCASE("a source not 16-byte aligned") {
        const oi::report r = report_of(src.data() + 4, 0, 16);
        CHECK(r.kind == oi::check::ptx_misuse);
        CHECK(r.detail.find("source") != std::string::npos);
    }
    SUBCASE("src-size over cp-size") {
        const oi::report r = report_of(src.data(), 0, 17);
        CHECK(r.kind == oi::check::ptx_misuse);
        CHECK(r.detail.find("src-size 17") != std::string::npos);
    }
    SUBCASE("a source past the end of a guarded buffer faults at the cp.async") {
        const oi::report r = report_of(src.data() + 64, 0, 16);
        CHECK(r.kind == oi::check::out_of_bounds);
        CHECK(r.thread.x == 0);
        CHECK(r.address.find("src+64") != std::string::npos);
    }
    SUBCASE("src-size 0 reads nothing, so a source at the end is fine and the bytes are zeros") {
        CHECK(oi::launch("misuse_kernel", {2, 1}, collecting(), misuse_kernel, src.data() + 64, 0u, 0u, true).clean());
    }
}

TEST_CASE("a thread that exits with copies in flight is reported") {
    oi::guarded_buffer<std::uint8_t> src(16, "src");
    for (unsigned i = 0; i < 16; ++i) src[i] = 0;
    const auto r = oi::launch("misuse_kernel", {1, 2}, collecting(), misuse_kernel, src.data(), 16u, 16u, false);
    REQUIRE(r.reports.size() == 2);  // both threads
    for (const oi::report& x : r.reports) {
        CHECK(x.kind == oi::check::ptx_misuse);
        CHECK(x.address.find("tile+0x10") != std::string::npos);
        CHECK(x.detail.find("1 cp.async copies") != std::string::npos);
    }
    CHECK(r.reports[1].thread.x == 1);
}

}  // namespace interpret_cp_async_test
