// The mbarrier model (octet::ptx mbarrier_*, octet/interpret/ptx_models.hpp) against the PTX ISA's
// description of mbarrier, independently of octet's kernels: phases and their parity over many
// phases, the ordering a completed phase gives (the waiters read what the arrivers wrote without a
// race; reading before the wait is a race), and the misuse the ISA leaves undefined or that hangs:
// a wait on a parity that never completes, a missing arrival, use before init, a misaligned object,
// an arrival not ordered after the init, more arrivals than the phase holds.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "octet/cuda/ptx.cuh"
#include "octet/cuda/shared_memory.cuh"
#include "support/interpret_reports.hpp"

namespace ptx_mbarrier_test {
namespace oi = octet::interpret;
namespace ptx = octet::ptx;

using octet_test::all_messages;
using octet_test::collect;
using octet_test::first;
using octet_test::has;

/// `phases` rounds: every thread writes its value of the round, arrives, waits for the phase of the
/// round's parity, and then sums every thread's value (written by the others: ordered only by the
/// mbarrier). A fresh mbarrier is in phase 0, so a wait for parity 1 returns at once.
void phases_kernel(const std::uint32_t* in, std::uint64_t* sums, int phases, std::uint32_t* fresh_wait_ok,
                   bool wait_first) {
    OCTET_SHARED(std::uint64_t, bar);
    OCTET_SHARED(std::uint32_t[2][128], vals);
    const unsigned t = threadIdx.x, n = blockDim.x;
    const std::uint32_t b = ptx::shared_address(&bar);
    if (t == 0) {
        ptx::mbarrier_init(b, n);
        ptx::fence_mbarrier_init();
    }
    __syncthreads();
    if (t == 0) *fresh_wait_ok = ptx::mbarrier_try_wait_parity(b, 1) ? 1u : 0u;
    for (int p = 0; p < phases; ++p) {
        vals[p & 1][t] = in[p * n + t];
        ptx::mbarrier_arrive(b);
        if (wait_first) ptx::mbarrier_try_wait_parity(b, static_cast<std::uint32_t>(p & 1));
        std::uint64_t s = 0;
        for (unsigned i = 0; i < n; ++i) s += vals[p & 1][i];
        sums[p * n + t] = s;
        // the next round's writes to vals[p & 1] (two rounds on) must wait for everyone's reads: the
        // round in between orders them (each thread arrives in round p+1 after reading round p)
    }
}

TEST_CASE("mbarrier: phases complete in turn, parity alternates, and a completed phase orders memory") {
    std::mt19937 rng(1234);
    for (unsigned threads : {32u, 96u, 128u}) {
        const int phases = 9;
        std::vector<std::uint32_t> in(phases * threads);
        for (auto& v : in) v = rng() % 100000;
        std::vector<std::uint64_t> sums(in.size(), 0);
        std::uint32_t fresh = 0;
        const auto r = oi::launch("phases", {oi::dim3(1), oi::dim3(threads)}, collect(), phases_kernel, in.data(),
                                  sums.data(), phases, &fresh, true);
        CHECK_MESSAGE(r.reports.empty(), all_messages(r));
        CHECK(fresh == 1);
        for (int p = 0; p < phases; ++p) {
            std::uint64_t want = 0;
            for (unsigned i = 0; i < threads; ++i) want += in[p * threads + i];
            for (unsigned i = 0; i < threads; ++i) CHECK(sums[p * threads + i] == want);
        }
    }
}

TEST_CASE("mbarrier: reading the others' values without waiting for the phase is a race") {
    std::vector<std::uint32_t> in(2 * 64, 1);
    std::vector<std::uint64_t> sums(in.size());
    std::uint32_t fresh = 0;
    oi::options o = collect();
    o.check_uninitialized = false;  // the early readers' uninitialised reads would fill the report list
    const auto r =
        oi::launch("no_wait", {oi::dim3(1), oi::dim3(64)}, o, phases_kernel, in.data(), sums.data(), 2, &fresh, false);
    CHECK(has(r, oi::check::race));
}

/// Thread 0 waits for parity `parity` after `arrivals` of the block's threads arrived on a barrier
/// expecting `count`.
void one_phase_kernel(unsigned count, unsigned arrivals, std::uint32_t parity, int waits) {
    OCTET_SHARED(std::uint64_t, bar);
    const unsigned t = threadIdx.x;
    const std::uint32_t b = ptx::shared_address(&bar);
    if (t == 0) ptx::mbarrier_init(b, count);
    __syncthreads();
    if (t < arrivals) ptx::mbarrier_arrive(b);
    __syncthreads();  // the wait comes after every arrival
    if (t == 0)
        for (int i = 0; i < waits; ++i) ptx::mbarrier_try_wait_parity(b, parity);
}

TEST_CASE("mbarrier: the phases with both parities, by arrival counts") {
    // 64 threads on a count of 32: two phases complete (parity 0, then 1); the current phase is 2 (parity 0)
    auto r = oi::launch("two_phases", {oi::dim3(1), oi::dim3(64)}, collect(), one_phase_kernel, 32u, 64u,
                        std::uint32_t{1}, 1);
    CHECK_MESSAGE(r.reports.empty(), all_messages(r));
    // a wait for parity 0 now waits for phase 2, which nobody arrives on: deadlock
    r = oi::launch("wrong_parity", {oi::dim3(1), oi::dim3(64)}, collect(), one_phase_kernel, 32u, 64u, std::uint32_t{0},
                   1);
    REQUIRE(has(r, oi::check::deadlock));
    const auto& d = first(r, oi::check::deadlock);
    CHECK(d.kernel == "wrong_parity");
    CHECK(d.address.find("shared") != std::string::npos);
    CHECK(d.detail.find("mbarrier") != std::string::npos);
    CHECK(d.detail.find("parity 0") != std::string::npos);
}

TEST_CASE("mbarrier: a missing arrival, or a wait on the parity of the phase not yet complete, deadlocks") {
    // 128 expected, 127 arrive
    auto r = oi::launch("missing_arrive", {oi::dim3(1), oi::dim3(128)}, collect(), one_phase_kernel, 128u, 127u,
                        std::uint32_t{0}, 1);
    REQUIRE(has(r, oi::check::deadlock));
    CHECK(first(r, oi::check::deadlock).detail.find("1 arrivals and 0 transaction bytes missing") != std::string::npos);
    // all arrive (phase 0 completes): waiting for parity 1 means phase 1, which never completes
    r = oi::launch("parity_1", {oi::dim3(1), oi::dim3(128)}, collect(), one_phase_kernel, 128u, 128u, std::uint32_t{1},
                   1);
    CHECK(has(r, oi::check::deadlock));
    // the right parity completes, also when waited on twice
    r = oi::launch("parity_0", {oi::dim3(1), oi::dim3(128)}, collect(), one_phase_kernel, 128u, 128u, std::uint32_t{0},
                   2);
    CHECK_MESSAGE(r.reports.empty(), all_messages(r));
}

enum class misuse { uninitialised, misaligned, unordered_init, over_arrival, bad_count };
void misuse_kernel(misuse m) {
    OCTET_SHARED(std::uint64_t[2], bars);
    const unsigned t = threadIdx.x;
    const std::uint32_t b = ptx::shared_address(&bars[0]);
    switch (m) {
        case misuse::uninitialised:
            if (t == 1) ptx::mbarrier_arrive(b + 8);
            break;
        case misuse::misaligned:
            if (t == 0) ptx::mbarrier_init(b + 4, 1);
            break;
        case misuse::unordered_init:  // no barrier between thread 0's init and thread 1's arrival
            if (t == 0) ptx::mbarrier_init(b, 2);
            if (t == 1) ptx::mbarrier_arrive(b);
            break;
        case misuse::over_arrival:  // the phase has its one arrival and waits for 16 bytes
            if (t == 0) ptx::mbarrier_init(b, 1);
            __syncthreads();
            if (t == 0) ptx::mbarrier_arrive_expect_tx(b, 16);
            __syncthreads();
            if (t == 1) ptx::mbarrier_arrive(b);
            break;
        case misuse::bad_count:
            if (t == 0) ptx::mbarrier_init(b, 0);
            break;
    }
}

TEST_CASE("mbarrier: use before init, misalignment, unordered init, over-arrival and a zero count are reported") {
    auto run = [](misuse m) { return oi::launch("misuse", {oi::dim3(2), oi::dim3(32)}, collect(), misuse_kernel, m); };
    auto r = run(misuse::uninitialised);
    REQUIRE(has(r, oi::check::mbarrier_misuse));
    {
        const auto& x = first(r, oi::check::mbarrier_misuse);
        CHECK(x.kernel == "misuse");
        CHECK(x.thread.x == 1);
        CHECK(x.address.find("shared") != std::string::npos);
        CHECK(x.detail.find("no mbarrier.init") != std::string::npos);
    }
    CHECK(r.reports.size() == 2);  // one per block: the report stops the block
    r = run(misuse::misaligned);
    REQUIRE(has(r, oi::check::mbarrier_misuse));
    CHECK(first(r, oi::check::mbarrier_misuse).detail.find("8-byte aligned") != std::string::npos);
    r = run(misuse::unordered_init);
    CHECK(has(r, oi::check::race));
    r = run(misuse::over_arrival);
    REQUIRE(has(r, oi::check::mbarrier_misuse));
    CHECK(first(r, oi::check::mbarrier_misuse).detail.find("more arrivals than the count") != std::string::npos);
    r = run(misuse::bad_count);
    CHECK(has(r, oi::check::mbarrier_misuse));
    // raise mode: the first report is thrown
    CHECK_THROWS_AS(oi::launch("misuse", {oi::dim3(1), oi::dim3(32)}, misuse_kernel, misuse::uninitialised),
                    oi::failure);
}

}  // namespace ptx_mbarrier_test
