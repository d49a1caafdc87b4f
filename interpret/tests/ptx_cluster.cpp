// Thread block clusters under the interpreter (launch_config::cluster), against the PTX ISA's
// description: %cluster_ctarank / %cluster_nctarank and blockIdx of each CTA; a TMA load multicast to
// both CTAs of a pair (each CTA loads half of a box into both, each CTA's mbarrier completes both
// halves' bytes), compared with the source matrix; remote mbarrier arrivals through mapa; the cluster
// barrier, which threads that exit release (the ISA's exit). And the broken variants: no cluster
// barrier between the mbarrier init and the peer's first signal (a race), a missing remote arrival
// (deadlock), a signal to a CTA that has exited, mapa of a rank outside the cluster, a multicast mask
// naming such a rank, a cluster wait without an arrival, and launch shapes that are not whole
// clusters.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "octet/cuda/ptx.cuh"
#include "octet/cuda/shared_memory.cuh"
#include "support/interpret_reports.hpp"

namespace ptx_cluster_test {
namespace oi = octet::interpret;
namespace ptx = octet::ptx;

using octet_test::all_messages;
using octet_test::first;
using octet_test::has;

enum class variant {
    correct,
    no_start_sync,
    missing_arrival,
    arrive_after_exit,
    bad_rank,
    bad_mask,
    wait_without_arrive
};

constexpr std::uint32_t rows = 64, row_bytes = 128, tile_bytes = rows * row_bytes;

/// Clusters of two CTAs of 128 threads. Thread 0 of each CTA initialises `full` (one arrival plus the
/// tile's bytes) and `done` (128 arrivals: the peer's threads); after the cluster barrier, thread 0 of
/// CTA r loads rows [32 r, 32 r + 32) of the matrix into both CTAs (multicast) and expects the whole
/// tile; every thread waits for it, copies its CTA's tile to out[blockIdx.x], then arrives on the
/// peer's `done` and waits for its own; a cluster barrier ends the kernel. ids[blockIdx.x] gets the
/// CTA's rank and the cluster's size.
void cluster_kernel(const CUtensorMap map, std::uint8_t* out, std::uint32_t* ids, variant v) {
    OCTET_DYNAMIC_SHARED(std::uint8_t, smem);
    OCTET_SHARED(std::uint64_t, full);
    OCTET_SHARED(std::uint64_t, done);
    const unsigned t = threadIdx.x, rank = ptx::cluster_ctarank(), n = ptx::cluster_nctarank();
    const std::uint32_t fb = ptx::shared_address(&full), db = ptx::shared_address(&done);
    if (t == 0) {
        ptx::mbarrier_init(fb, 1);
        ptx::mbarrier_init(db, 128);
        ptx::fence_mbarrier_init();
    }
    __syncthreads();
    if (v != variant::no_start_sync) {
        ptx::barrier_cluster_arrive();
        ptx::barrier_cluster_wait();
    }
    if (v == variant::arrive_after_exit) {  // CTA 0 returns at once; CTA 1 then signals it
        if (rank == 1 && t == 0) ptx::mbarrier_arrive_cluster(ptx::mapa_shared(db, 0));
        return;
    }
    if (v == variant::wait_without_arrive) ptx::barrier_cluster_wait();
    if (t == 0) {
        const std::uint16_t mask = v == variant::bad_mask ? 0x5 : 0x3;
        ptx::tma_load_2d_multicast(ptx::shared_address(smem) + rank * (rows / 2) * row_bytes, &map, 0,
                                   static_cast<std::int32_t>(rank * rows / 2), fb, mask);
        ptx::mbarrier_arrive_expect_tx(fb, tile_bytes);
    }
    ptx::mbarrier_try_wait_parity(fb, 0);
    for (std::uint32_t i = t; i < tile_bytes; i += blockDim.x) out[blockIdx.x * tile_bytes + i] = smem[i];
    if (!(v == variant::missing_arrival && rank == 1 && t == 5))
        ptx::mbarrier_arrive_cluster(ptx::mapa_shared(db, v == variant::bad_rank ? 2u : (rank + 1) % n));
    ptx::mbarrier_try_wait_parity(db, 0);
    ptx::barrier_cluster_arrive();
    ptx::barrier_cluster_wait();
    if (t == 0) ids[blockIdx.x] = rank | n << 8;
}

struct setup {
    std::vector<std::uint8_t> matrix = std::vector<std::uint8_t>(tile_bytes);
    CUtensorMap map{};
    explicit setup(unsigned seed) {
        std::mt19937 rng(seed);
        for (auto& b : matrix) b = static_cast<std::uint8_t>(rng());
        const cuuint64_t dims[2] = {row_bytes, rows}, strides[1] = {row_bytes};
        const cuuint32_t box[2] = {row_bytes, rows / 2}, es[2] = {1, 1};
        void* encode = nullptr;
        cudaDriverEntryPointQueryResult q{};
        REQUIRE(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &encode, 12000, cudaEnableDefault, &q) ==
                cudaSuccess);
        using encode_fn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                       const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                       CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
        REQUIRE(reinterpret_cast<encode_fn>(encode)(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, matrix.data(), dims,
                                                    strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                                    CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS);
    }
};

oi::run_result run(const setup& s, variant v, unsigned clusters, std::vector<std::uint8_t>& out,
                   std::vector<std::uint32_t>& ids, oi::on_report mode = oi::on_report::collect,
                   unsigned host_threads = 1) {
    oi::launch_config cfg{oi::dim3(2 * clusters), oi::dim3(128), tile_bytes};
    cfg.cluster = oi::dim3(2);
    out.assign(2 * clusters * tile_bytes, 0);
    ids.assign(2 * clusters, ~0u);
    oi::options o;
    o.mode = mode;
    o.host_threads = host_threads;
    return oi::launch("cluster_kernel", cfg, o, cluster_kernel, s.map, out.data(), ids.data(), v);
}

TEST_CASE("clusters: ranks, a multicast TMA load into both CTAs, remote mbarrier arrivals, the cluster barrier") {
    for (unsigned seed : {1u, 2u}) {
        CAPTURE(seed);
        const setup s(seed);
        std::vector<std::uint8_t> out;
        std::vector<std::uint32_t> ids;
        // seed 2: the three clusters spread over two host threads, each with its own machine
        const auto r = run(s, variant::correct, 3, out, ids, oi::on_report::collect, seed);
        REQUIRE_MESSAGE(r.clean(), all_messages(r));
        for (unsigned b = 0; b < 6; ++b) {
            CHECK(ids[b] == ((b % 2) | 2u << 8));  // rank = blockIdx.x % 2 (x fastest in a cluster), size 2
            bool same = true;
            for (std::uint32_t i = 0; i < tile_bytes; ++i) same = same && out[b * tile_bytes + i] == s.matrix[i];
            CHECK_MESSAGE(same, "block " << b << " holds the whole tile, half of it multicast by its peer");
        }
    }
}

TEST_CASE("clusters: a signal before the peer's init, a missing or late arrival, bad ranks and masks are reported") {
    const setup s(3);
    std::vector<std::uint8_t> out;
    std::vector<std::uint32_t> ids;
    // the peer's mbarrier.init is not ordered before the multicast's complete_tx on it
    auto r = run(s, variant::no_start_sync, 1, out, ids);
    REQUIRE_MESSAGE(has(r, oi::check::race), all_messages(r));
    CHECK(first(r, oi::check::race).address.find("of cluster rank 1") != std::string::npos);
    CHECK(first(r, oi::check::race).detail.find("of cluster rank 1 wrote") != std::string::npos);
    r = run(s, variant::missing_arrival, 1, out, ids);
    REQUIRE(has(r, oi::check::deadlock));
    CHECK(first(r, oi::check::deadlock).detail.find("1 arrivals") != std::string::npos);
    r = run(s, variant::arrive_after_exit, 1, out, ids);
    REQUIRE(has(r, oi::check::ptx_misuse));
    CHECK(first(r, oi::check::ptx_misuse).detail.find("have all exited") != std::string::npos);
    CHECK(first(r, oi::check::ptx_misuse).block.x == 1);
    r = run(s, variant::bad_rank, 1, out, ids);
    REQUIRE(has(r, oi::check::ptx_misuse));
    CHECK(first(r, oi::check::ptx_misuse).detail.find("rank 2, but the cluster has 2 CTAs") != std::string::npos);
    r = run(s, variant::bad_mask, 1, out, ids);
    REQUIRE(has(r, oi::check::ptx_misuse));
    CHECK(first(r, oi::check::ptx_misuse).detail.find("beyond the cluster's 2") != std::string::npos);
    r = run(s, variant::wait_without_arrive, 1, out, ids);
    REQUIRE(has(r, oi::check::barrier_misuse));
    CHECK(first(r, oi::check::barrier_misuse).detail.find("has not arrived") != std::string::npos);
    CHECK_THROWS_AS(run(s, variant::missing_arrival, 1, out, ids, oi::on_report::raise), oi::failure);
}

/// Threads 64-127 of cluster rank 1 exit at once (unless all_wait); the others pass two cluster
/// barriers, between which each CTA's threads 0-63 read back the rank they wrote to shared memory.
void early_exit_kernel(std::uint32_t* seen, bool all_wait) {
    OCTET_SHARED(std::uint32_t[64], mark);
    const unsigned t = threadIdx.x, rank = ptx::cluster_ctarank();
    if (!all_wait && rank == 1 && t >= 64) return;
    if (t < 64) mark[t] = rank;
    ptx::barrier_cluster_arrive();
    ptx::barrier_cluster_wait();
    if (t < 64) seen[blockIdx.x * 64 + t] = mark[t];
    ptx::barrier_cluster_arrive();
    ptx::barrier_cluster_wait();
}

TEST_CASE("clusters: threads that exit release the cluster barrier, as the ISA's exit says") {
    for (bool all_wait : {false, true}) {
        CAPTURE(all_wait);
        std::vector<std::uint32_t> seen(4 * 64, ~0u);
        oi::launch_config cfg{oi::dim3(4), oi::dim3(128), 0};
        cfg.cluster = oi::dim3(2);
        oi::options o;
        o.mode = oi::on_report::collect;
        const auto r = oi::launch("early_exit_kernel", cfg, o, early_exit_kernel, seen.data(), all_wait);
        REQUIRE_MESSAGE(r.clean(), all_messages(r));
        for (unsigned i = 0; i < seen.size(); ++i) CHECK(seen[i] == (i / 64) % 2);
    }
}

TEST_CASE("clusters: a grid that is not whole clusters, or blocks the interpreter cannot pair, are refused") {
    const setup s(4);
    std::vector<std::uint8_t> out(4 * tile_bytes);
    std::vector<std::uint32_t> ids(4);
    oi::options o;
    o.mode = oi::on_report::collect;
    oi::launch_config cfg{oi::dim3(3), oi::dim3(128), tile_bytes};
    cfg.cluster = oi::dim3(2);
    auto r = oi::launch("cluster_kernel", cfg, o, cluster_kernel, s.map, out.data(), ids.data(), variant::correct);
    REQUIRE(has(r, oi::check::launch_config));
    CHECK(first(r, oi::check::launch_config).detail.find("whole number of clusters") != std::string::npos);
    cfg = oi::launch_config{oi::dim3(2), oi::dim3(64), tile_bytes};
    cfg.cluster = oi::dim3(2);
    r = oi::launch("cluster_kernel", cfg, o, cluster_kernel, s.map, out.data(), ids.data(), variant::correct);
    REQUIRE(has(r, oi::check::launch_config));
    CHECK(first(r, oi::check::launch_config).detail.find("multiple of 128") != std::string::npos);
    cfg = oi::launch_config{oi::dim3(16), oi::dim3(128), tile_bytes};
    cfg.cluster = oi::dim3(16);
    r = oi::launch("cluster_kernel", cfg, o, cluster_kernel, s.map, out.data(), ids.data(), variant::correct);
    REQUIRE(has(r, oi::check::launch_config));
    CHECK(first(r, oi::check::launch_config).detail.find("portable size of 8") != std::string::npos);
}

}  // namespace ptx_cluster_test
