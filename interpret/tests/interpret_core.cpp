// The interpreter's core (octet/interpret/interpret.hpp), checked against the PTX ISA's and the CUDA
// programming guide's descriptions, independently of octet's kernels: shuffles against a brute-force
// lane model written from the guide's wording, vote and match, barriers and their misuse, the
// shared-memory checks (a block reduction without its barrier is a race, out-of-bounds and
// uninitialised accesses, the size limits), deadlock, atomics, and small correct kernels (tiled
// transpose, block prefix sum) over several grid and block shapes, ragged ones included.
// The kernels below are CUDA source: octet/interpret/cuda_builtins.hpp maps threadIdx, __syncthreads,
// __shfl_xor_sync, atomicAdd... onto the interpreter, and they declare shared memory with the
// interpreter's own OCTET_INTERPRET_SHARED. Nothing of octet's library is included here.
#define OCTET_INTERPRET 1
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "octet/interpret/cuda.hpp"
#include "support/interpret_reports.hpp"
#include "support/random.hpp"

namespace interpret_core_test {
namespace oi = octet::interpret;

using octet_test::all_messages;
using octet_test::collect;
using octet_test::first;
using octet_test::has;

// ---- shuffles --------------------------------------------------------------------------------------

enum class mode { idx, up, down, bfly };

/// The programming guide's description, lane by lane: the lane whose var a lane receives.
int source_lane(mode m, int lane, int b, int width) {
    const int seg = lane / width * width;
    switch (m) {
        case mode::idx:
            return seg + ((b % width) + width) % width;
        case mode::up:
            return lane - seg >= b ? lane - b : lane;
        case mode::down:
            return lane - seg + b < width ? lane + b : lane;
        case mode::bfly:
            return (lane ^ b) < seg + width ? (lane ^ b) : lane;  // later groups: own value
    }
    return lane;
}

template <class T>
__global__ void shfl_kernel(mode m, const T* in, const int* b, int width, unsigned mask, T* out) {
    const unsigned t = threadIdx.x, lane = t % 32;
    if (!(mask >> lane & 1u)) return;  // lanes outside the mask do not execute the shuffle
    const T v = in[t];
    T r{};
    switch (m) {
        case mode::idx:
            r = __shfl_sync(mask, v, b[t], width);
            break;
        case mode::up:
            r = __shfl_up_sync(mask, v, static_cast<unsigned>(b[t]), width);
            break;
        case mode::down:
            r = __shfl_down_sync(mask, v, static_cast<unsigned>(b[t]), width);
            break;
        case mode::bfly:
            r = __shfl_xor_sync(mask, v, b[t], width);
            break;
    }
    out[t] = r;
}

TEST_CASE("shfl.sync idx/up/down/bfly match the lane model for every width, with full and segment masks") {
    auto g = octet_test::rng(1301);
    const unsigned threads = 64;  // two warps
    std::vector<std::uint32_t> in(threads);
    std::vector<double> ind(threads);
    for (auto& x : in) x = static_cast<std::uint32_t>(g());
    for (auto& x : ind) x = std::uniform_real_distribution<double>(-1e300, 1e300)(g);
    for (mode m : {mode::idx, mode::up, mode::down, mode::bfly})
        for (int width : {1, 2, 4, 8, 16, 32})
            for (unsigned mask : {0xFFFFFFFFu, width <= 16 ? 0x0000FFFFu : 0xFFFFFFFFu}) {
                std::vector<int> b(threads);
                // every lane its own operand (PTX allows per-lane b); idx also beyond width
                for (auto& x : b)
                    x = m == mode::idx ? static_cast<int>(g() % 64)
                                       : static_cast<int>(g() % static_cast<unsigned>(width + 1));
                std::vector<std::uint32_t> out(threads, 0xDEADBEEFu);
                std::vector<double> outd(threads, -1.0);
                oi::launch("shfl", {oi::dim3(1), oi::dim3(threads)}, shfl_kernel<std::uint32_t>, m, in.data(), b.data(),
                           width, mask, out.data());
                oi::launch("shfl64", {oi::dim3(1), oi::dim3(threads)}, shfl_kernel<double>, m, ind.data(), b.data(),
                           width, mask, outd.data());
                for (unsigned t = 0; t < threads; ++t) {
                    const int lane = static_cast<int>(t % 32);
                    if (!(mask >> lane & 1u)) continue;
                    const unsigned src = t / 32 * 32 + static_cast<unsigned>(source_lane(m, lane, b[t], width));
                    CAPTURE(static_cast<int>(m));
                    CAPTURE(width);
                    CAPTURE(t);
                    CAPTURE(b[t]);
                    CHECK(out[t] == in[src]);
                    CHECK(outd[t] == ind[src]);
                }
            }
}

__global__ void shfl_pred_kernel(const std::uint32_t* b, std::uint32_t c, std::uint32_t* value, int* pred) {
    const unsigned t = threadIdx.x;
    const auto r = oi::shfl_sync(oi::shfl_mode::down, 100 + t, b[t], c, 0xFFFFFFFFu);
    value[t] = r.value;
    pred[t] = r.in_range;
}

TEST_CASE("shfl.sync's predicate says whether the source lane was inside the clamp") {
    // PTX: .down with clamp 31 and no segment: p = lane + b <= 31, else the lane's own value
    std::vector<std::uint32_t> b(32), value(32);
    std::vector<int> pred(32, -1);
    for (unsigned t = 0; t < 32; ++t) b[t] = (t * 7) % 32;
    oi::launch("shfl_pred", {oi::dim3(1), oi::dim3(32)}, shfl_pred_kernel, b.data(), std::uint32_t{0x1F}, value.data(),
               pred.data());
    for (unsigned t = 0; t < 32; ++t) {
        const bool in = t + b[t] <= 31;
        CHECK(pred[t] == static_cast<int>(in));
        CHECK(value[t] == (in ? 100 + t + b[t] : 100 + t));
    }
}

__global__ void shfl_outside_mask_kernel(unsigned* out) {
    const unsigned lane = threadIdx.x % 32;
    if (lane < 16) out[lane] = __shfl_sync(0x0000FFFFu, lane, 20);  // width 32: lane 20 is not a member
}
__global__ void shfl_not_member_kernel() {
    const unsigned lane = threadIdx.x % 32;
    if (lane == 0) (void)__shfl_sync(0xFFFFFFFEu, lane, 1);
}
__global__ void shfl_mixed_masks_kernel() {
    const unsigned lane = threadIdx.x % 32;
    if (lane < 16)
        (void)__shfl_xor_sync(0xFFFFFFFFu, lane, 1);
    else
        (void)__ballot_sync(0xFFFFFFFFu, 1);
}
__global__ void shfl_exited_lane_kernel() {
    if (threadIdx.x == 5) return;
    (void)__shfl_xor_sync(0xFFFFFFFFu, 1u, 1);
}

TEST_CASE("warp-synchronous misuse is reported") {
    std::vector<unsigned> out(16);
    const auto r1 =
        oi::launch("outside_mask", {oi::dim3(1), oi::dim3(32)}, collect(), shfl_outside_mask_kernel, out.data());
    CHECK(has(r1, oi::check::warp_sync));
    CHECK(first(r1, oi::check::warp_sync).detail.find("outside the member mask") != std::string::npos);
    const auto r2 = oi::launch("not_member", {oi::dim3(1), oi::dim3(32)}, collect(), shfl_not_member_kernel);
    CHECK(first(r2, oi::check::warp_sync).detail.find("not in the member mask") != std::string::npos);
    const auto r3 = oi::launch("mixed", {oi::dim3(1), oi::dim3(32)}, collect(), shfl_mixed_masks_kernel);
    CHECK(first(r3, oi::check::warp_sync).detail.find("wait in") != std::string::npos);
    const auto r4 = oi::launch("exited", {oi::dim3(1), oi::dim3(32)}, collect(), shfl_exited_lane_kernel);
    CHECK(first(r4, oi::check::warp_sync).detail.find("which exited") != std::string::npos);
    // a warp of 20 threads has no lanes 20..31 to name in a mask
    const auto r5 = oi::launch("partial", {oi::dim3(1), oi::dim3(20)}, collect(), shfl_exited_lane_kernel);
    CHECK(first(r5, oi::check::warp_sync).detail.find("does not have") != std::string::npos);
}

// ---- vote and match --------------------------------------------------------------------------------

__global__ void vote_kernel(const int* p, unsigned mask, int* all, int* any, unsigned* ballot) {
    const unsigned t = threadIdx.x;
    if (!(mask >> (t % 32) & 1u)) return;
    all[t] = __all_sync(mask, p[t]);
    any[t] = __any_sync(mask, p[t]);
    ballot[t] = __ballot_sync(mask, p[t]);
}

TEST_CASE("vote.sync all/any/ballot over the member lanes") {
    auto g = octet_test::rng(1302);
    for (int trial = 0; trial < 40; ++trial) {
        const unsigned mask = trial % 4 == 0 ? 0xFFFFFFFFu : static_cast<std::uint32_t>(g()) | 1u;
        const int density = trial % 3;  // all false, random, all true (inside the mask)
        std::vector<int> p(64);
        for (auto& x : p)
            x = density == 0 ? 0 : density == 2 ? static_cast<int>(g() % 5 + 1) : static_cast<int>(g() % 2);
        std::vector<int> all(64, -1), any(64, -1);
        std::vector<unsigned> ballot(64, 0xDEADBEEFu);
        oi::launch("vote", {oi::dim3(1), oi::dim3(64)}, vote_kernel, p.data(), mask, all.data(), any.data(),
                   ballot.data());
        for (unsigned w = 0; w < 2; ++w) {
            unsigned expect_ballot = 0;
            bool expect_all = true, expect_any = false;
            for (unsigned l = 0; l < 32; ++l)
                if (mask >> l & 1u) {
                    const bool v = p[32 * w + l] != 0;
                    expect_all = expect_all && v;
                    expect_any = expect_any || v;
                    if (v) expect_ballot |= 1u << l;
                }
            for (unsigned l = 0; l < 32; ++l) {
                if (!(mask >> l & 1u)) continue;
                CHECK(all[32 * w + l] == static_cast<int>(expect_all));
                CHECK(any[32 * w + l] == static_cast<int>(expect_any));
                CHECK(ballot[32 * w + l] == expect_ballot);
            }
        }
    }
}

template <class T>
__global__ void match_kernel(const T* v, unsigned mask, unsigned* any, unsigned* all, int* pred) {
    const unsigned t = threadIdx.x;
    if (!(mask >> (t % 32) & 1u)) return;
    any[t] = __match_any_sync(mask, v[t]);
    all[t] = __match_all_sync(mask, v[t], &pred[t]);
}

TEST_CASE("match.sync any/all, 32- and 64-bit") {
    auto g = octet_test::rng(1303);
    for (int trial = 0; trial < 30; ++trial) {
        const unsigned mask = trial % 3 == 0 ? 0xFFFFFFFFu : static_cast<std::uint32_t>(g()) | 0x100u;
        const unsigned distinct = trial % 5 == 0 ? 1 : 1 + static_cast<unsigned>(g() % 4);
        std::vector<std::uint64_t> v64(32);
        for (auto& x : v64) x = (g() % distinct) * 0x100000001ull;  // differ in both halves
        std::vector<unsigned> v32(32);
        for (unsigned l = 0; l < 32; ++l) v32[l] = static_cast<unsigned>(v64[l] >> 32);
        for (int bits : {32, 64}) {
            std::vector<unsigned> any(32, 0xDEADBEEFu), all(32, 0xDEADBEEFu);
            std::vector<int> pred(32, -1);
            if (bits == 32)
                oi::launch("match32", {oi::dim3(1), oi::dim3(32)}, match_kernel<unsigned>, v32.data(), mask, any.data(),
                           all.data(), pred.data());
            else
                oi::launch("match64", {oi::dim3(1), oi::dim3(32)}, match_kernel<std::uint64_t>, v64.data(), mask,
                           any.data(), all.data(), pred.data());
            bool same = true;
            unsigned first_member = 0;
            while (!(mask >> first_member & 1u)) ++first_member;
            for (unsigned l = 0; l < 32; ++l)
                if (mask >> l & 1u) same = same && v64[l] == v64[first_member];
            for (unsigned l = 0; l < 32; ++l) {
                if (!(mask >> l & 1u)) continue;
                unsigned expect = 0;
                for (unsigned k = 0; k < 32; ++k)
                    if ((mask >> k & 1u) && v64[k] == v64[l]) expect |= 1u << k;
                CHECK(any[l] == expect);
                CHECK(all[l] == (same ? mask : 0u));
                CHECK(pred[l] == static_cast<int>(same));
            }
        }
    }
}

// ---- barriers, shared memory and the race check ----------------------------------------------------

/// The sum of x over each block, by a tree in shared memory; with_barrier = false leaves out the
/// barrier inside the tree (the classic bug).
__global__ void block_sum_kernel(const float* x, int n, float* sums, bool with_barrier) {
    OCTET_INTERPRET_SHARED(float[256], partial);
    const unsigned t = threadIdx.x;
    const int i = static_cast<int>(blockIdx.x * blockDim.x + t);
    partial[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
        if (t < s) partial[t] += partial[t + s];
        if (with_barrier) __syncthreads();
    }
    if (t == 0) sums[blockIdx.x] = partial[0];
}

TEST_CASE("a block reduction: right with its barrier, a race without it") {
    auto g = octet_test::rng(1304);
    const int n = 1000;
    std::vector<float> x(n);
    for (auto& v : x) v = static_cast<float>(static_cast<int>(g() % 2001) - 1000);  // integers: exact sums
    for (unsigned threads : {32u, 64u, 256u}) {
        const unsigned blocks = (n + threads - 1) / threads;
        std::vector<float> sums(blocks, -12345.0f);
        const auto ok = oi::launch("block_sum", {oi::dim3(blocks), oi::dim3(threads)}, collect(), block_sum_kernel,
                                   x.data(), n, sums.data(), true);
        CHECK_MESSAGE(ok.clean(), all_messages(ok));
        for (unsigned b = 0; b < blocks; ++b) {
            double expect = 0;
            for (unsigned k = b * threads; k < (b + 1) * threads && k < static_cast<unsigned>(n); ++k) expect += x[k];
            CHECK(sums[b] == expect);
        }
        const auto bad = oi::launch("block_sum_no_barrier", {oi::dim3(blocks), oi::dim3(threads)}, collect(),
                                    block_sum_kernel, x.data(), n, sums.data(), false);
        REQUIRE(has(bad, oi::check::race));
        const oi::report& r = first(bad, oi::check::race);
        CHECK(r.kernel == "block_sum_no_barrier");
        CHECK(r.address.find("partial+") == 0);
        CHECK(r.detail.find("no barrier") != std::string::npos);
        CHECK(r.detail.find("last barrier or warp collective: ") != std::string::npos);
        CHECK(r.detail.find("interpret_core.cpp:") != std::string::npos);
        CHECK(r.message().find("block (0,0,0)") != std::string::npos);
    }
    // the default mode throws the first report, as an interpret::failure (an interpret::error)
    std::vector<float> sums(4);
    CHECK_THROWS_AS(oi::launch("block_sum_no_barrier", {oi::dim3(4), oi::dim3(256)}, block_sum_kernel, x.data(), n,
                               sums.data(), false),
                    oi::error);
    try {
        oi::launch("block_sum_no_barrier", {oi::dim3(4), oi::dim3(256)}, block_sum_kernel, x.data(), n, sums.data(),
                   false);
    } catch (const oi::failure& f) {
        CHECK(f.which().kind == oi::check::race);
        CHECK(std::string(f.what()).find("kernel block_sum_no_barrier") != std::string::npos);
    }
}

__global__ void divergent_exit_kernel() {
    if (threadIdx.x >= 32) return;
    __syncthreads();
}
__global__ void divergent_named_kernel() {
    if (threadIdx.x < 64)
        __syncthreads();
    else
        oi::bar_sync(1, 128);
}
__global__ void divergent_sites_kernel() {
    if (threadIdx.x % 2)
        __syncthreads();
    else
        __syncthreads();
}

TEST_CASE("divergent __syncthreads: threads that exited, and different call sites") {
    const auto r1 = oi::launch("div_exit", {oi::dim3(2), oi::dim3(64)}, collect(), divergent_exit_kernel);
    REQUIRE(has(r1, oi::check::divergent_barrier));
    CHECK(first(r1, oi::check::divergent_barrier).detail.find("threads 32-63 exited") != std::string::npos);
    CHECK(r1.reports.size() == 2);  // each block reported, the launch went on
    const auto r2 = oi::launch("div_sites", {oi::dim3(1), oi::dim3(64)}, collect(), divergent_sites_kernel);
    REQUIRE(has(r2, oi::check::divergent_barrier));
    CHECK(first(r2, oi::check::divergent_barrier).detail.find("reached at") != std::string::npos);
    CHECK_THROWS_AS(oi::launch("div_exit", {oi::dim3(1), oi::dim3(64)}, divergent_exit_kernel), oi::failure);
    const auto r3 = oi::launch("div_named", {oi::dim3(1), oi::dim3(128)}, collect(), divergent_named_kernel);
    REQUIRE(has(r3, oi::check::divergent_barrier));
    CHECK(first(r3, oi::check::divergent_barrier).detail.find("thread (64,0,0) waits at bar.sync 1") !=
          std::string::npos);
}

__global__ void named_deadlock_kernel() {
    if (threadIdx.x < 64) oi::bar_sync(1, 128);  // 128 expected, 64 ever arrive
}
__global__ void named_deadlock_waiting_kernel() {
    if (threadIdx.x < 64)
        oi::bar_sync(1, 128);
    else
        oi::bar_sync(2, 128);
}
__global__ void bad_count_kernel() {
    oi::bar_sync(1, 48);
}
__global__ void mismatched_count_kernel() {
    oi::bar_sync(1, threadIdx.x < 32 ? 64 : 96);
}

TEST_CASE("deadlock and bar.sync misuse") {
    const auto r1 = oi::launch("deadlock", {oi::dim3(1), oi::dim3(128)}, collect(), named_deadlock_kernel);
    REQUIRE(has(r1, oi::check::deadlock));
    const auto& d = first(r1, oi::check::deadlock);
    CHECK(d.detail.find("bar.sync 1, 128") != std::string::npos);
    CHECK(d.detail.find("64 of 128 threads arrived") != std::string::npos);
    const auto r2 = oi::launch("deadlock2", {oi::dim3(1), oi::dim3(128)}, collect(), named_deadlock_waiting_kernel);
    CHECK(first(r2, oi::check::deadlock).detail.find("bar.sync 2, 128") != std::string::npos);
    const auto r3 = oi::launch("bad_count", {oi::dim3(1), oi::dim3(64)}, collect(), bad_count_kernel);
    CHECK(first(r3, oi::check::barrier_misuse).detail.find("multiple of 32") != std::string::npos);
    const auto r4 = oi::launch("mismatch", {oi::dim3(1), oi::dim3(128)}, collect(), mismatched_count_kernel);
    CHECK(has(r4, oi::check::barrier_misuse));
}

/// Warp specialisation through named barriers: warps 0-1 produce into shared memory and bar.arrive,
/// warps 2-3 bar.sync and consume; skip_wait makes the consumers read without waiting.
__global__ void producer_consumer_kernel(const int* in, int* out, bool skip_wait) {
    OCTET_INTERPRET_SHARED(int[64], buf);
    const unsigned t = threadIdx.x;
    if (t < 64) {
        buf[t] = in[blockIdx.x * 64 + t] * 3;
        oi::bar_arrive(1, 128);
    } else {
        if (!skip_wait) oi::bar_sync(1, 128);
        out[blockIdx.x * 64 + (t - 64)] = buf[127 - t];
    }
}

TEST_CASE("bar.arrive / bar.sync order a producer's writes before the consumers' reads") {
    auto g = octet_test::rng(1305);
    std::vector<int> in(3 * 64), out(3 * 64, -1);
    for (auto& v : in) v = static_cast<int>(g() % 1000);
    const auto ok = oi::launch("pc", {oi::dim3(3), oi::dim3(128)}, collect(), producer_consumer_kernel, in.data(),
                               out.data(), false);
    CHECK_MESSAGE(ok.clean(), all_messages(ok));
    for (unsigned b = 0; b < 3; ++b)
        for (unsigned k = 0; k < 64; ++k) CHECK(out[b * 64 + k] == 3 * in[b * 64 + 63 - k]);
    // without the wait the producers (lower ids) still run first under round-robin, so the values
    // come out right; the happens-before check finds the race all the same
    const auto bad = oi::launch("pc_no_wait", {oi::dim3(1), oi::dim3(128)}, collect(), producer_consumer_kernel,
                                in.data(), out.data(), true);
    CHECK(has(bad, oi::check::race));
}

__global__ void syncwarp_kernel(int* out, bool with_syncwarp) {
    OCTET_INTERPRET_SHARED(int[32], s);
    const unsigned lane = threadIdx.x;
    s[lane] = static_cast<int>(lane) * 10;
    if (with_syncwarp) __syncwarp();
    out[lane] = s[(lane + 1) % 32];
}

TEST_CASE("__syncwarp orders memory among its lanes; shfl does not") {
    std::vector<int> out(32, -1);
    const auto ok = oi::launch("syncwarp", {oi::dim3(1), oi::dim3(32)}, collect(), syncwarp_kernel, out.data(), true);
    CHECK_MESSAGE(ok.clean(), all_messages(ok));
    for (unsigned l = 0; l < 32; ++l) CHECK(out[l] == static_cast<int>((l + 1) % 32) * 10);
    const auto bad =
        oi::launch("no_syncwarp", {oi::dim3(1), oi::dim3(32)}, collect(), syncwarp_kernel, out.data(), false);
    CHECK(has(bad, oi::check::race));
}

__global__ void oob_static_kernel(int n) {
    OCTET_INTERPRET_SHARED(float[64], s);
    OCTET_INTERPRET_SHARED(float[64], neighbour);
    neighbour[threadIdx.x] = 1.0f;
    if (threadIdx.x == 5) s[n] = 2.0f;  // n = 64: one past the end
}
__global__ void oob_dynamic_kernel(int index) {
    OCTET_INTERPRET_DYNAMIC_SHARED(unsigned char, raw);
    auto words = oi::shared_cast<std::uint32_t>(raw);
    if (threadIdx.x == 3) words[index] = 7u;
}

TEST_CASE("out-of-bounds shared accesses are reported, with the variable and offset") {
    const auto r1 = oi::launch("oob_static", {oi::dim3(1), oi::dim3(64)}, collect(), oob_static_kernel, 64);
    REQUIRE(has(r1, oi::check::out_of_bounds));
    const auto& o = first(r1, oi::check::out_of_bounds);
    CHECK(o.thread.x == 5);
    CHECK(o.detail.find("offset 256") != std::string::npos);
    CHECK(o.detail.find("outside s (256 bytes") != std::string::npos);
    CHECK(r1.reports.size() == 1);  // the write was dropped: neighbour is untouched, no race with it
    const auto r2 = oi::launch("oob_static_ok", {oi::dim3(1), oi::dim3(64)}, collect(), oob_static_kernel, 63);
    CHECK_MESSAGE(r2.clean(), all_messages(r2));
    oi::launch_config cfg{oi::dim3(1), oi::dim3(32), 256};  // 64 words
    CHECK(oi::launch("oob_dyn_ok", cfg, collect(), oob_dynamic_kernel, 63).clean());
    const auto r3 = oi::launch("oob_dyn", cfg, collect(), oob_dynamic_kernel, 64);
    CHECK(first(r3, oi::check::out_of_bounds).detail.find("dynamic shared") != std::string::npos);
    const auto r4 = oi::launch("oob_dyn_neg", cfg, collect(), oob_dynamic_kernel, -1);
    CHECK(has(r4, oi::check::out_of_bounds));
    CHECK(first(r4, oi::check::out_of_bounds).thread.x == 3);
}

__global__ void uninit_kernel(float* out) {
    OCTET_INTERPRET_SHARED(float[128], s);
    const unsigned t = threadIdx.x;
    if (t % 2 == 0) s[t] = 1.0f;  // odd entries never written
    __syncthreads();
    out[t] = s[t ^ 1];
}
__global__ void stale_kernel(float* out) {
    OCTET_INTERPRET_SHARED(float, v);
    if (blockIdx.x == 0 && threadIdx.x == 0) v = 5.0f;  // later blocks read what block 0 left: not theirs
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

TEST_CASE("reads of uninitialised shared memory, also what an earlier block left behind") {
    std::vector<float> out(256);
    const auto r1 = oi::launch("uninit", {oi::dim3(1), oi::dim3(128)}, collect(), uninit_kernel, out.data());
    REQUIRE(has(r1, oi::check::uninitialized_read));
    const auto& u = first(r1, oi::check::uninitialized_read);
    CHECK(u.thread.x == 0);  // thread 0 reads s[1] first
    CHECK(u.address.find("s+0x4") == 0);
    const auto r2 = oi::launch("stale", {oi::dim3(2), oi::dim3(32)}, collect(), stale_kernel, out.data());
    REQUIRE(has(r2, oi::check::uninitialized_read));
    CHECK(first(r2, oi::check::uninitialized_read).block.x == 1);
}

// ---- atomics --------------------------------------------------------------------------------------

__global__ void histogram_kernel(const int* x, int n, unsigned* global_hist, bool read_early) {
    OCTET_INTERPRET_SHARED(unsigned[16], hist);
    const unsigned t = threadIdx.x;
    if (t < 16) hist[t] = 0;
    __syncthreads();
    for (int i = static_cast<int>(blockIdx.x * blockDim.x + t); i < n; i += static_cast<int>(gridDim.x * blockDim.x))
        atomicAdd(&hist[x[i] % 16], 1u);
    if (!read_early) __syncthreads();
    if (t < 16) atomicAdd(&global_hist[t], static_cast<unsigned>(hist[t]));
}

TEST_CASE("atomics: shared and global, never racing with each other, racing with plain reads") {
    auto g = octet_test::rng(1306);
    const int n = 5000;
    std::vector<int> x(n);
    for (auto& v : x) v = static_cast<int>(g() % 1000);
    std::vector<unsigned> expect(16, 0), hist(16, 0);
    for (int v : x) ++expect[static_cast<std::size_t>(v % 16)];
    const auto ok = oi::launch("histogram", {oi::dim3(5), oi::dim3(96)}, collect(), histogram_kernel, x.data(), n,
                               hist.data(), false);
    CHECK_MESSAGE(ok.clean(), all_messages(ok));
    CHECK(hist == expect);
    const auto bad = oi::launch("histogram_early", {oi::dim3(2), oi::dim3(96)}, collect(), histogram_kernel, x.data(),
                                n, hist.data(), true);
    REQUIRE(has(bad, oi::check::race));
    CHECK(first(bad, oi::check::race).detail.find("atomically") != std::string::npos);
}

// ---- shared-memory limits --------------------------------------------------------------------------

__global__ void big_static_kernel() {
    OCTET_INTERPRET_SHARED(unsigned char[40 * 1024], a);
    a[threadIdx.x] = 1;
}

TEST_CASE("the device's shared-memory limits") {
    oi::launch_config cfg{oi::dim3(1), oi::dim3(32), 64 * 1024};
    const auto r1 = oi::launch("too_much_dynamic", cfg, collect(), big_static_kernel);
    CHECK(has(r1, oi::check::launch_config));
    oi::options o = collect();
    o.max_dynamic_shared = 64 * 1024;  // cudaFuncSetAttribute(..., MaxDynamicSharedMemorySize, 64 KiB)
    const auto r2 = oi::launch("opted_in", cfg, o, big_static_kernel);
    CHECK_MESSAGE(r2.clean(), all_messages(r2));
    CHECK(r2.static_shared == 40 * 1024);
    cfg.dynamic_shared = 16 * 1024;  // 40 + 16 KiB > 48 KiB without the opt-in
    CHECK(has(oi::launch("static_plus_dynamic", cfg, collect(), big_static_kernel), oi::check::shared_limit));
    o.device = oi::device_model::sm89();
    o.max_dynamic_shared = 99 * 1024;
    cfg.dynamic_shared = 64 * 1024;  // 64 + 40 KiB > sm_89's 99 KiB
    CHECK(has(oi::launch("sm89", cfg, o, big_static_kernel), oi::check::shared_limit));
    CHECK(has(oi::launch("block_too_big", {oi::dim3(1), oi::dim3(2048)}, collect(), big_static_kernel),
              oi::check::launch_config));
}

// ---- correct kernels over ragged shapes ------------------------------------------------------------

constexpr int kTile = 16;

/// out (cols x rows) = in (rows x cols)^T through a padded shared tile; blockDim = (16, rows_per_pass).
__global__ void transpose_kernel(const float* in, float* out, int rows, int cols) {
    OCTET_INTERPRET_SHARED(float[kTile][kTile + 1], tile);
    const int c0 = static_cast<int>(blockIdx.x) * kTile, r0 = static_cast<int>(blockIdx.y) * kTile;
    for (int dy = static_cast<int>(threadIdx.y); dy < kTile; dy += static_cast<int>(blockDim.y)) {
        const int r = r0 + dy, c = c0 + static_cast<int>(threadIdx.x);
        if (r < rows && c < cols) tile[dy][threadIdx.x] = in[r * cols + c];
    }
    __syncthreads();
    for (int dy = static_cast<int>(threadIdx.y); dy < kTile; dy += static_cast<int>(blockDim.y)) {
        const int orow = c0 + dy, ocol = r0 + static_cast<int>(threadIdx.x);  // out row = in column
        if (orow < cols && ocol < rows) out[orow * rows + ocol] = tile[threadIdx.x][dy];
    }
}

TEST_CASE("a tiled transpose is right for several grid and block shapes, ragged edges included") {
    auto g = octet_test::rng(1307);
    struct shape {
        int rows, cols;
        unsigned block_y;
    };
    for (shape s : {shape{16, 16, 16}, shape{33, 17, 4}, shape{5, 70, 8}, shape{64, 1, 2}, shape{47, 47, 16}}) {
        std::vector<float> in(static_cast<std::size_t>(s.rows) * s.cols), out(in.size(), NAN);
        std::normal_distribution<float> d;
        for (auto& v : in) v = d(g);
        const oi::dim3 grid((s.cols + kTile - 1) / kTile, (s.rows + kTile - 1) / kTile);
        const auto r = oi::launch("transpose", {grid, oi::dim3(kTile, s.block_y)}, collect(), transpose_kernel,
                                  in.data(), out.data(), s.rows, s.cols);
        CHECK_MESSAGE(r.clean(), all_messages(r));
        for (int i = 0; i < s.rows; ++i)
            for (int j = 0; j < s.cols; ++j) CHECK(out[j * s.rows + i] == in[i * s.cols + j]);
    }
}

/// Inclusive prefix sum of each block's chunk: warp scans by __shfl_up_sync, warp totals through
/// shared memory, one warp scans the totals. Any block size up to 1024, partial last warp included
/// (its shuffles use the mask of its lanes).
__global__ void scan_kernel(const int* x, int n, int* y) {
    OCTET_INTERPRET_SHARED(int[32], warp_total);
    const unsigned t = threadIdx.x, lane = t % 32, warp = t / 32, warps = (blockDim.x + 31) / 32;
    const unsigned in_warp = warp + 1 < warps ? 32u : blockDim.x - 32 * warp;
    const unsigned mask = in_warp == 32 ? 0xFFFFFFFFu : (1u << in_warp) - 1;
    const int i = static_cast<int>(blockIdx.x * blockDim.x + t);
    int v = i < n ? x[i] : 0;
    for (unsigned d = 1; d < 32; d *= 2) {
        const int up = __shfl_up_sync(mask, v, d);
        if (lane >= d) v += up;
    }
    if (lane == in_warp - 1) warp_total[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const unsigned m = warps == 32 ? 0xFFFFFFFFu : (1u << warps) - 1;
        if (lane < warps) {
            int s = warp_total[lane];
            for (unsigned d = 1; d < 32; d *= 2) {
                const int up = __shfl_up_sync(m, s, d);
                if (lane >= d) s += up;
            }
            warp_total[lane] = s;
        }
    }
    __syncthreads();
    if (warp > 0) v += warp_total[warp - 1];
    if (i < n) y[i] = v;
}

TEST_CASE("a block prefix sum is right for several block sizes, partial warps included") {
    auto g = octet_test::rng(1308);
    for (unsigned threads : {32u, 50u, 96u, 256u, 1000u, 1024u})
        for (int n : {1, 100, 3000}) {
            std::vector<int> x(static_cast<std::size_t>(n)), y(x.size(), -7777777);
            for (auto& v : x) v = static_cast<int>(g() % 201) - 100;
            const unsigned blocks = (static_cast<unsigned>(n) + threads - 1) / threads;
            const auto r = oi::launch("scan", {oi::dim3(blocks), oi::dim3(threads)}, collect(), scan_kernel, x.data(),
                                      n, y.data());
            CHECK_MESSAGE(r.clean(), all_messages(r));
            for (unsigned b = 0; b < blocks; ++b) {
                long long acc = 0;
                for (unsigned k = b * threads; k < (b + 1) * threads && k < static_cast<unsigned>(n); ++k) {
                    acc += x[k];
                    CHECK(y[k] == acc);
                }
            }
        }
}

__global__ void coords_kernel(unsigned* out) {
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    out[b * blockDim.x * blockDim.y * blockDim.z + t] = b * 100000 + t * 10 + (__activemask() != 0);
}

TEST_CASE("every thread of a 3-D grid of 3-D blocks runs once with its coordinates") {
    const oi::dim3 grid(3, 2, 2), block(5, 3, 2);
    std::vector<unsigned> out(12 * 30, 0);
    oi::launch("coords", {grid, block}, coords_kernel, out.data());
    for (unsigned b = 0; b < 12; ++b)
        for (unsigned t = 0; t < 30; ++t) CHECK(out[b * 30 + t] == b * 100000 + t * 10 + 1);
    CHECK_THROWS_AS((void)oi::thread_idx(), oi::error);  // outside a launch
}

}  // namespace interpret_core_test

namespace interpret_core_test {

__global__ void throwing_kernel(int bad_thread) {
    OCTET_INTERPRET_SHARED(int[64], s);
    s[threadIdx.x] = 1;
    __syncthreads();
    if (static_cast<int>(threadIdx.x) == bad_thread) throw std::runtime_error("rule rejected its input");
    __syncthreads();
}
__global__ void deep_stack_kernel(int* out) {
    volatile int local[8192];  // 32 KiB of locals per thread, as a register-heavy kernel might spill
    for (int i = 0; i < 8192; ++i) local[i] = i ^ static_cast<int>(threadIdx.x);
    int acc = 0;
    for (int i = 0; i < 8192; ++i) acc += local[i];
    __syncthreads();
    out[threadIdx.x] = acc;
}

TEST_CASE("an exception from kernel code ends the launch, the other fibers are unwound, the next launch runs") {
    CHECK_THROWS_WITH_AS(oi::launch("throws", {oi::dim3(2), oi::dim3(64)}, throwing_kernel, 37),
                         "rule rejected its input", std::runtime_error);
    std::vector<int> out(64, -1);
    const auto r = oi::launch("deep", {oi::dim3(1), oi::dim3(64)}, collect(), deep_stack_kernel, out.data());
    CHECK(r.clean());
    for (int t = 0; t < 64; ++t) {
        int expect = 0;
        for (int i = 0; i < 8192; ++i) expect += i ^ t;
        CHECK(out[static_cast<std::size_t>(t)] == expect);
    }
}

}  // namespace interpret_core_test

namespace interpret_core_test {

struct temp_storage {  // a CUB-style TempStorage: a struct the caller puts in shared memory
    float partial[8];
    unsigned count;
};

__global__ void struct_kernel(float* out, bool skip_count) {
    OCTET_INTERPRET_SHARED(temp_storage, temp);
    auto self = &temp;
    const unsigned t = threadIdx.x, warp = t / 32;
    auto partial = oi::member(self, &temp_storage::partial);  // sptr<float[8]>
    if (t % 32 == 0) (*partial)[warp] = static_cast<float>(warp + 1);
    if (t == 0 && !skip_count) *oi::member(self, &temp_storage::count) = blockDim.x / 32;
    __syncthreads();
    if (t == 0) {
        float s = 0;
        const unsigned n = *oi::member(self, &temp_storage::count);
        for (unsigned w = 0; w < n && w < 8; ++w) s += (*partial)[w];
        out[blockIdx.x] = s;
    }
}

TEST_CASE("a struct in shared memory, its members reached through member()") {
    std::vector<float> out(2, -1.0f);
    const auto r = oi::launch("struct", {oi::dim3(2), oi::dim3(128)}, collect(), struct_kernel, out.data(), false);
    CHECK_MESSAGE(r.clean(), all_messages(r));
    CHECK(out[0] == 10.0f);
    CHECK(out[1] == 10.0f);
    const auto bad =
        oi::launch("struct_uninit", {oi::dim3(1), oi::dim3(128)}, collect(), struct_kernel, out.data(), true);
    REQUIRE(has(bad, oi::check::uninitialized_read));
    CHECK(first(bad, oi::check::uninitialized_read).address.find("temp+0x20") == 0);
}

}  // namespace interpret_core_test

namespace interpret_core_test {

__global__ void intrinsics_kernel(const unsigned* x, const unsigned* y, unsigned* out) {
    const unsigned t = threadIdx.x;
    out[4 * t + 0] = __byte_perm(x[t], 0u, 0x0123);    // byte reversal
    out[4 * t + 1] = __byte_perm(x[t], y[t], 0x5410);  // the low halves, x's below y's
    out[4 * t + 2] = __byte_perm(x[t], y[t], 0x7632);  // the high halves
    out[4 * t + 3] = __float_as_uint(__uint_as_float(x[t])) ^
                     static_cast<unsigned>(__float_as_int(__int_as_float(static_cast<int>(y[t]))));
}

TEST_CASE("__byte_perm and the bit casts, by their identities") {
    auto g = octet_test::rng(1309);
    std::vector<unsigned> x(32), y(32), out(128, 0);
    for (unsigned t = 0; t < 32; ++t) {
        x[t] = static_cast<unsigned>(g());
        y[t] = static_cast<unsigned>(g());
    }
    oi::launch("intrinsics", {oi::dim3(1), oi::dim3(32)}, intrinsics_kernel, x.data(), y.data(), out.data());
    for (unsigned t = 0; t < 32; ++t) {
        CHECK(out[4 * t + 0] == __builtin_bswap32(x[t]));
        CHECK(out[4 * t + 1] == ((x[t] & 0xFFFFu) | (y[t] << 16)));
        CHECK(out[4 * t + 2] == ((x[t] >> 16) | (y[t] & 0xFFFF0000u)));
        CHECK(out[4 * t + 3] == (x[t] ^ y[t]));
    }
}

__global__ void trap_kernel(int* out) {
    if (blockIdx.x == 1 && threadIdx.x == 3) __trap();
    out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

TEST_CASE("__trap stops its block with a report; collect mode goes on with the next block") {
    std::vector<int> out(3 * 32, 0);
    const auto r = oi::launch("trap", {oi::dim3(3), oi::dim3(32)}, collect(), trap_kernel, out.data());
    REQUIRE(r.reports.size() == 1);
    CHECK(r.reports[0].kind == oi::check::trap);
    CHECK(r.reports[0].block.x == 1);
    CHECK(r.reports[0].thread.x == 3);
    CHECK(out[2 * 32 + 5] == 1);  // block 2 ran
    CHECK_THROWS_AS(oi::launch("trap", {oi::dim3(3), oi::dim3(32)}, trap_kernel, out.data()), oi::failure);
}

}  // namespace interpret_core_test

namespace interpret_core_test {

__global__ void syncthreads_count_kernel(const int* p, int* out) {
    const unsigned t = threadIdx.x;
    const int c = __syncthreads_count(p[t]);
    const int a = __syncthreads_and(p[t]);
    const int o = __syncthreads_or(p[t]);
    out[3 * t] = c;
    out[3 * t + 1] = a;
    out[3 * t + 2] = o;
}

TEST_CASE("__syncthreads_count/_and/_or count the block's true predicates") {
    auto g = octet_test::rng(1310);
    for (int density : {0, 1, 2}) {
        std::vector<int> p(96), out(3 * 96, -1);
        for (auto& v : p) v = density == 0 ? 0 : density == 2 ? 7 : static_cast<int>(g() % 2);
        oi::launch("sync_count", {oi::dim3(1), oi::dim3(96)}, syncthreads_count_kernel, p.data(), out.data());
        int count = 0;
        for (int v : p) count += v != 0;
        for (unsigned t = 0; t < 96; ++t) {
            CHECK(out[3 * t] == count);
            CHECK(out[3 * t + 1] == (count == 96));
            CHECK(out[3 * t + 2] == (count > 0));
        }
    }
}

}  // namespace interpret_core_test

namespace interpret_core_test {

TEST_CASE("blocks on several host threads: the same answers, the reports in block order") {
    auto g = octet_test::rng(1311);
    const int n = 5000;
    std::vector<int> x(n);
    for (auto& v : x) v = static_cast<int>(g() % 1000);
    std::vector<unsigned> expect(16, 0), hist(16, 0);
    for (int v : x) ++expect[static_cast<std::size_t>(v % 16)];
    oi::options o = collect();
    o.host_threads = 2;
    const auto ok =
        oi::launch("histogram", {oi::dim3(7), oi::dim3(96)}, o, histogram_kernel, x.data(), n, hist.data(), false);
    CHECK_MESSAGE(ok.clean(), all_messages(ok));
    CHECK(hist == expect);

    std::vector<float> xf(1000, 1.0f), sums(8);
    const auto serial = oi::launch("block_sum_no_barrier", {oi::dim3(4), oi::dim3(256)}, collect(), block_sum_kernel,
                                   xf.data(), 1000, sums.data(), false);
    o.host_threads = 3;
    const auto parallel = oi::launch("block_sum_no_barrier", {oi::dim3(4), oi::dim3(256)}, o, block_sum_kernel,
                                     xf.data(), 1000, sums.data(), false);
    REQUIRE(serial.reports.size() == parallel.reports.size());
    for (std::size_t i = 0; i < serial.reports.size(); ++i)
        CHECK(serial.reports[i].message() == parallel.reports[i].message());

    std::vector<int> out(4 * 32, 0);
    oi::options raise;
    raise.host_threads = 2;
    try {
        oi::launch("trap", {oi::dim3(4), oi::dim3(32)}, raise, trap_kernel, out.data());
        FAIL("no report");
    } catch (const oi::failure& f) {
        CHECK(f.which().kind == oi::check::trap);
        CHECK(f.which().block.x == 1);
    }
}

}  // namespace interpret_core_test

namespace interpret_core_test {

// A model of ldmatrix.sync.aligned.m8n8.x4.shared.b16 written with warp_exchange, the way the ptx::
// layer will model instructions: lane L supplies the address of row L % 8 of matrix L / 8 and reads
// that 16-byte row itself (checked, and attributed to it); lane L receives, of each matrix m, the 4
// bytes at offset 4 (L % 4) of row L / 4 (register m).
struct row16 {
    std::uint8_t b[16];
};
struct regs4 {
    std::uint32_t r[4];
};
regs4 ldmatrix_x4(oi::sptr<const std::uint8_t> row) {
    row16 mine;
    for (int i = 0; i < 16; ++i) mine.b[i] = row[i];
    return oi::warp_exchange<row16, regs4>(
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16", 0xFFFFFFFFu, mine, [](const row16* const* rows, regs4* const* out) {
            for (int L = 0; L < 32; ++L)
                for (int m = 0; m < 4; ++m) std::memcpy(&out[L]->r[m], rows[8 * m + L / 4]->b + 4 * (L % 4), 4);
        });
}

/// Rows stored XOR-permuted (row r at slot r ^ 5) by 32 threads, then ldmatrix by the warp.
__global__ void ldmatrix_kernel(const std::uint8_t* rows, std::uint32_t* regs, bool with_barrier) {
    OCTET_INTERPRET_SHARED_ALIGNED(std::uint8_t[32 * 16], tile, 128);
    const unsigned t = threadIdx.x;
    const unsigned fill = (t + 7) % 32;  // each thread stores another lane's row
    for (int i = 0; i < 16; ++i) tile[((fill ^ 5) * 16) + i] = rows[(blockIdx.x * 32 + fill) * 16 + i];
    if (with_barrier) __syncthreads();
    const unsigned lane = t % 32;
    const unsigned my_row = 8 * (lane / 8) + lane % 8;  // = lane: row lane % 8 of matrix lane / 8
    const regs4 r = ldmatrix_x4(tile + (my_row ^ 5) * 16);
    for (int m = 0; m < 4; ++m) regs[4 * (blockIdx.x * blockDim.x + t) + m] = r.r[m];
}
__global__ void mixed_exchange_kernel() {
    const int mine = 1;
    if (threadIdx.x < 16)
        (void)oi::warp_exchange<int, int>("ldmatrix.x4", 0xFFFFFFFFu, mine, [](const int* const*, int* const*) {});
    else
        (void)oi::warp_exchange<int, int>("ldmatrix.x2", 0xFFFFFFFFu, mine, [](const int* const*, int* const*) {});
}

TEST_CASE("warp_exchange: an ldmatrix.x4 model matches the PTX fragment definition; misuse is reported") {
    auto g = octet_test::rng(1312);
    std::vector<std::uint8_t> rows(2 * 32 * 16);
    for (auto& b : rows) b = static_cast<std::uint8_t>(g());
    std::vector<std::uint32_t> regs(2 * 32 * 4, 0xDEADBEEFu);
    const auto r =
        oi::launch("ldmatrix", {oi::dim3(2), oi::dim3(32)}, collect(), ldmatrix_kernel, rows.data(), regs.data(), true);
    CHECK_MESSAGE(r.clean(), all_messages(r));
    for (unsigned b = 0; b < 2; ++b)
        for (unsigned L = 0; L < 32; ++L)
            for (unsigned m = 0; m < 4; ++m) {
                const std::uint8_t* row = rows.data() + b * 512 + (8 * m + L / 4) * 16 + 4 * (L % 4);
                const std::uint32_t expect =
                    row[0] | row[1] << 8 | row[2] << 16 | static_cast<std::uint32_t>(row[3]) << 24;
                CHECK(regs[4 * (b * 32 + L) + m] == expect);
            }
    oi::options races_only = collect();      // the early lanes also read rows not yet written: those
    races_only.check_uninitialized = false;  // reports would fill max_reports before the races
    const auto bad = oi::launch("ldmatrix_no_barrier", {oi::dim3(1), oi::dim3(32)}, races_only, ldmatrix_kernel,
                                rows.data(), regs.data(), false);
    CHECK_MESSAGE(has(bad, oi::check::race), all_messages(bad));
    const auto mixed = oi::launch("mixed", {oi::dim3(1), oi::dim3(32)}, collect(), mixed_exchange_kernel);
    REQUIRE(has(mixed, oi::check::warp_sync));
    CHECK(first(mixed, oi::check::warp_sync).detail.find("ldmatrix.x2") != std::string::npos);
}

}  // namespace interpret_core_test

namespace interpret_core_test {

/// Thread 0 publishes a value after the others start spinning on an atomic flag; the spinning
/// fibers yield (as __nanosleep does), so the publisher gets to run.
__global__ void spin_kernel(int* out) {
    OCTET_INTERPRET_SHARED(unsigned, flag);
    OCTET_INTERPRET_SHARED(int, value);
    if (threadIdx.x == 0) {
        flag = 0u;
        value = 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 0; i < 3; ++i) oi::yield();  // let the others reach their spin loops first
        atomicExch(&value, 42);
        atomicExch(&flag, 1u);
    } else {
        while (atomicAdd(&flag, 0u) == 0u) __nanosleep(100);
        out[threadIdx.x] = atomicAdd(&value, 0);
    }
}

__global__ void spin_forever_kernel(const unsigned* flag) {
    while (atomicAdd(const_cast<unsigned*>(flag), 0u) == 0u) __nanosleep(100);  // nobody sets it
}

TEST_CASE("spinning fibers yield to the thread they wait for") {
    std::vector<int> out(64, -1);
    const auto r = oi::launch("spin", {oi::dim3(1), oi::dim3(64)}, collect(), spin_kernel, out.data());
    CHECK_MESSAGE(r.clean(), all_messages(r));
    for (unsigned t = 1; t < 64; ++t) CHECK(out[t] == 42);
    unsigned flag = 0;
    oi::options o = collect();
    o.max_spins = 1000;
    const auto r2 = oi::launch("spin_forever", {oi::dim3(1), oi::dim3(32)}, o, spin_forever_kernel, &flag);
    REQUIRE(has(r2, oi::check::deadlock));
    CHECK(first(r2, oi::check::deadlock).detail.find("yielded 1000 times") != std::string::npos);
}

}  // namespace interpret_core_test

namespace interpret_core_test {

/// y[i] = 2 x[i] over a grid-stride loop whose bound is off by one when `off_by_one`.
__global__ void scale_kernel(const float* x, float* y, int n, bool off_by_one) {
    const int end = off_by_one ? n + 1 : n;
    for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < end;
         i += static_cast<int>(gridDim.x * blockDim.x))
        y[i] = 2.0f * x[i];
}

TEST_CASE("global accesses past the end of a guarded buffer are reported, naming the buffer and offset") {
    auto g = octet_test::rng(1313);
    for (int n : {1000, 1024, 4096}) {
        oi::guarded_buffer<float> x(static_cast<std::size_t>(n), "x"), y(static_cast<std::size_t>(n), "y");
        std::normal_distribution<float> d;
        for (auto& v : x) v = d(g);
        for (auto& v : y) v = NAN;
        const auto ok =
            oi::launch("scale", {oi::dim3(3), oi::dim3(128)}, collect(), scale_kernel, x.data(), y.data(), n, false);
        CHECK_MESSAGE(ok.clean(), all_messages(ok));
        for (int i = 0; i < n; ++i) CHECK(y[static_cast<std::size_t>(i)] == 2.0f * x[static_cast<std::size_t>(i)]);
        const auto bad = oi::launch("scale_off_by_one", {oi::dim3(3), oi::dim3(128)}, collect(), scale_kernel, x.data(),
                                    y.data(), n, true);
        REQUIRE(has(bad, oi::check::out_of_bounds));
        const auto& r = first(bad, oi::check::out_of_bounds);
        CHECK(r.address.find("x+" + std::to_string(4 * n)) == 0);
        const unsigned thread = static_cast<unsigned>(n) % (3 * 128);
        CHECK(r.block.x == thread / 128);
        CHECK(r.thread.x == thread % 128);
        CHECK_THROWS_AS(
            oi::launch("scale_off_by_one", {oi::dim3(3), oi::dim3(128)}, scale_kernel, x.data(), y.data(), n, true),
            oi::failure);
    }
    // the handler is removed after the launch; the next launches run as before
    std::vector<float> xs(64, 1.0f), ys(64, 0.0f);
    CHECK(oi::launch("scale", {oi::dim3(1), oi::dim3(64)}, collect(), scale_kernel, xs.data(), ys.data(), 64, false)
              .clean());
    CHECK(ys[63] == 2.0f);
}

}  // namespace interpret_core_test
