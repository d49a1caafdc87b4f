// octet::thread_pool and parallel_for on a caller's pool: every index is processed exactly once,
// no thread is started per call (the threads that run bodies are the pool's and the caller's),
// exceptions reach the caller and leave the pool usable, nested and concurrent use neither
// deadlocks nor changes results, and a library operation gives the same bits on a pool as on one
// thread.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "octet/config.hpp"
#include "octet/core/executor.hpp"
#include "octet/format/convert.hpp"
#include "support/random.hpp"

using namespace octet;

namespace {

// Runs parallel_for over [0, n) and checks each index was visited exactly once.
void check_covers_once(host_executor ex, std::size_t n, std::size_t grain) {
    std::vector<std::atomic<int>> hits(n);
    for (auto& h : hits) h.store(0);
    parallel_for(ex, n, grain, [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    std::size_t wrong = 0;
    for (auto& h : hits) wrong += h.load() != 1;
    CHECK_MESSAGE(wrong == 0, "n = ", n, ", grain = ", grain);
}

}  // namespace

TEST_CASE("parallel_for on a pool covers every index once, for ragged sizes and grains") {
    auto g = octet_test::rng(71);
    for (int threads : {1, 2, 3, 5}) {
        thread_pool pool(threads);
        CHECK(pool.size() == threads);
        CHECK(on_host(pool).thread_count() == threads);
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{1000}})
            for (std::size_t grain : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{64}})
                check_covers_once(on_host(pool), n, grain);
        for (int k = 0; k < 20; ++k)
            check_covers_once(on_host(pool), static_cast<std::size_t>(g() % 5000), static_cast<std::size_t>(g() % 300));
    }
    CHECK(thread_pool(0).size() == 1);  // at least the calling thread
}

TEST_CASE("a pool starts no thread per call: bodies run on its workers and the caller") {
    thread_pool pool(3);
    std::mutex m;
    std::set<std::thread::id> ids;
    for (int call = 0; call < 200; ++call) {
        parallel_for(on_host(pool), 3000, 1, [&](std::size_t, std::size_t) {
            std::lock_guard<std::mutex> lock(m);
            ids.insert(std::this_thread::get_id());
        });
    }
    // Per-call threads would give up to 2 new ids per call (400 here).
    CHECK(ids.size() <= 3);
    CHECK(ids.count(std::this_thread::get_id()) == 1);
}

TEST_CASE("an exception in a body reaches the caller, and the pool stays usable") {
    thread_pool pool(4);
    for (int round = 0; round < 5; ++round) {
        CHECK_THROWS_WITH_AS(parallel_for(on_host(pool), 400, 1,
                                          [&](std::size_t b, std::size_t e) {
                                              for (std::size_t i = b; i < e; ++i)
                                                  if (i == 250) throw error("index 250");
                                          }),
                             "octet: index 250", octet::error);
        check_covers_once(on_host(pool), 999, 1);
    }
}

TEST_CASE("nested and concurrent use of one pool neither deadlocks nor changes results") {
    thread_pool pool(3);
    // Nested: a body that runs parallel_for on the same pool (it runs on its own thread).
    std::vector<std::atomic<int>> hits(64 * 50);
    for (auto& h : hits) h.store(0);
    parallel_for(on_host(pool), 64, 1, [&](std::size_t b, std::size_t e) {
        for (std::size_t outer = b; outer < e; ++outer)
            parallel_for(on_host(pool), 50, 1, [&](std::size_t ib, std::size_t ie) {
                for (std::size_t i = ib; i < ie; ++i) hits[outer * 50 + i].fetch_add(1);
            });
    });
    std::size_t wrong = 0;
    for (auto& h : hits) wrong += h.load() != 1;
    CHECK(wrong == 0);

    // Concurrent: two threads share the pool; one of them may get it, the other runs alone.
    std::atomic<int> failures{0};
    auto caller = [&] {
        for (int k = 0; k < 100; ++k) {
            std::vector<std::atomic<int>> h(777);
            for (auto& x : h) x.store(0);
            parallel_for(on_host(pool), h.size(), 1, [&](std::size_t b, std::size_t e) {
                for (std::size_t i = b; i < e; ++i) h[i].fetch_add(1);
            });
            for (auto& x : h)
                if (x.load() != 1) failures.fetch_add(1);
        }
    };
    std::thread t1(caller), t2(caller);
    t1.join();
    t2.join();
    CHECK(failures.load() == 0);
}

TEST_CASE("a library operation on a pool gives the bits of one thread") {
    auto g = octet_test::rng(72);
    const std::vector<float> x = octet_test::with_edge_cases(g, 100003, 300.0f);
    std::vector<std::uint8_t> one(x.size()), pooled(x.size(), 0xAB);
    encode_array<e4m3>(on_host(1), span<const float>(x.data(), x.size()), span<std::uint8_t>(one.data(), one.size()));
    thread_pool pool(4);
    for (int k = 0; k < 3; ++k) {
        encode_array<e4m3>(on_host(pool), span<const float>(x.data(), x.size()),
                           span<std::uint8_t>(pooled.data(), pooled.size()));
        CHECK(pooled == one);
    }
}
