// octet-test: timeout=240
// Every byte through the caller: the host compressed all-reduce (compressed_allreduce_host,
// octet/comm/allreduce.hpp) over an in-process transport of 2 and 3 ranks (one thread each:
// support/in_process_world.hpp, its arrays allocated up front):
//   (a) with the default executor, the whole multi-rank call makes exactly one global allocation
//       per rank (its one block of scratch);
//   (b) with with_allocator(on_host(1), lent) (and on_host(pool) with a lent allocator), one lent
//       allocator per rank: zero global allocations around the whole multi-thread call (threads
//       started before, joined after), every lent allocator balanced, one request of exactly
//       compressed_allreduce_scratch_bytes(ex, cfg, n, P, rank, opt) bytes, and the results (the
//       sums and both residuals) bit-identical to the default executor's;
//   (c) an allocator that refuses (returns null) or throws std::bad_alloc, on every rank or on one
//       rank only: octet::error on EVERY rank (no rank is left waiting in a collective: a watchdog
//       fails the test instead of hanging), the data untouched, every lent allocator balanced, and
//       the world usable afterwards.
// Inputs are fresh random values (support/random.hpp) at ragged sizes, including sizes below the
// granule (ranks with empty shards).
#include "support/counting_allocator.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "octet/codec/codec.hpp"
#include "octet/codec/feedback.hpp"
#include "octet/comm/allreduce.hpp"
#include "support/in_process_world.hpp"
#include "support/random.hpp"

namespace {
using namespace octet;

using octet_test::in_process_transport;
using octet_test::in_process_world;
using octet_test::is_octet_error;
using octet_test::text_of;

/// octet_test::on_every_rank, with the global allocations of every thread counted into `counted`
/// (when not null) from before the threads start to after they finish (they are created before
/// and joined after that window).
template <class Fn>
void on_every_rank(int ranks, Fn&& fn, std::vector<std::exception_ptr>& errors, long* counted = nullptr) {
    std::optional<octet_test::global_allocations> count;
    const std::function<void()> before = [&] {
        if (counted) count.emplace();
    };
    const std::function<void()> after = [&] {
        if (counted) *counted = count->count();
    };
    octet_test::on_every_rank(ranks, std::forward<Fn>(fn), errors, before, after);
}

/// An allocator that refuses every request (returns null, or throws std::bad_alloc) and counts.
struct refusing_allocator {
    long allocations = 0, deallocations = 0;
    bool throws = false;
    host_allocator ref() {
        host_allocator a;
        a.context = this;
        a.allocate = [](void* c, std::size_t) -> void* {
            auto& self = *static_cast<refusing_allocator*>(c);
            ++self.allocations;
            if (self.throws) throw std::bad_alloc();
            return nullptr;
        };
        a.deallocate = [](void* c, void*, std::size_t) { ++static_cast<refusing_allocator*>(c)->deallocations; };
        return a;
    }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::vector<std::uint8_t> residual_bytes_of(error_feedback* fb) {
    if (fb == nullptr) return {};
    const residual_view v = fb->view();
    return std::vector<std::uint8_t>(v.data, v.data + v.bytes());
}

struct allreduce_variant {
    wire_format format;
    transform_kind transform;
    std::uint32_t block;
    bool stochastic;
    int feedback;           ///< -1: none, else the residual_storage of both residuals
    bool reduced_feedback;  ///< also the stage-2 residual
};

const allreduce_variant variants[] = {
    {wire_format::e4m3, transform_kind::hadamard, 1024, false, -1, false},
    {wire_format::e4m3, transform_kind::hadamard, 1024, false, 1, true},
    {wire_format::nvfp4, transform_kind::hadamard, 256, true, 2, true},
    {wire_format::mxfp8, transform_kind::identity, 1024, false, -1, false},
    {wire_format::e5m2, transform_kind::identity, 1024, true, 0, false},
};

/// Everything one multi-rank call reads and writes: every rank's data and residuals.
struct world_state {
    std::vector<std::vector<float>> data;
    std::vector<std::unique_ptr<error_feedback>> fb, rfb;

    world_state(const codec_config& cfg, const std::vector<std::vector<float>>& g, const allreduce_variant& v)
        : data(g) {
        const int P = static_cast<int>(g.size());
        const std::size_t n = g.empty() ? 0 : g[0].size();
        for (int r = 0; r < P; ++r) {
            if (v.feedback >= 0) {
                const auto st = static_cast<residual_storage>(v.feedback);
                fb.push_back(std::make_unique<error_feedback>(n, st));
                rfb.push_back(v.reduced_feedback
                                  ? std::make_unique<error_feedback>(allreduce_shard(cfg, n, P, r).count, st)
                                  : nullptr);
            } else {
                fb.push_back(nullptr);
                rfb.push_back(nullptr);
            }
        }
    }
    /// A residual's view; for one of no elements, a view that is still not empty() (error_feedback's
    /// own view of nothing has a null pointer, which reads as "no residual": the ranks would disagree).
    static residual_view view_of(error_feedback& f) {
        static std::uint8_t nothing = 0;
        residual_view v = f.view();
        if (v.size == 0) v.data = &nothing;
        return v;
    }
    allreduce_options options(int r, host_executor ex) const {
        allreduce_options o;
        o.expected_ranks = static_cast<int>(data.size());
        if (fb[r]) o.feedback = view_of(*fb[r]);
        if (rfb[r]) o.reduced_feedback = view_of(*rfb[r]);
        o.executor = ex;
        return o;
    }
    bool same(const world_state& o) const {
        for (std::size_t r = 0; r < data.size(); ++r) {
            if (!same_bits(data[r], o.data[r])) return false;
            if (residual_bytes_of(fb[r].get()) != residual_bytes_of(o.fb[r].get())) return false;
            if (residual_bytes_of(rfb[r].get()) != residual_bytes_of(o.rfb[r].get())) return false;
        }
        return true;
    }
};

/// Runs one compressed all-reduce on every rank of `w` with executor ex(r); counts global allocations.
template <class Ex>
std::vector<std::exception_ptr> run_world(in_process_world& w, const codec_config& cfg, world_state& st, Ex&& ex,
                                          long* counted = nullptr) {
    const int P = w.size;
    std::vector<allreduce_options> opts;  // built outside the counted window
    std::vector<in_process_transport> ts;
    for (int r = 0; r < P; ++r) {
        opts.push_back(st.options(r, ex(r)));
        ts.emplace_back(w, r);
    }
    std::vector<std::exception_ptr> errors;
    on_every_rank(
        P,
        [&](int r) {
            compressed_allreduce_host(ts[r], cfg, span<float>(st.data[r].data(), st.data[r].size()), opts[r]);
        },
        errors, counted);
    return errors;
}

}  // namespace

TEST_CASE("compressed all-reduce: every temporary from the lent allocator, at most the query, same bits") {
    auto g = octet_test::rng(7301);
    for (const int P : {2, 3}) {
        in_process_world w(P);
        std::vector<std::unique_ptr<thread_pool>> pools;
        for (int r = 0; r < P; ++r) pools.push_back(std::make_unique<thread_pool>(2));
        for (const allreduce_variant& v : variants) {
            codec_config cfg;
            cfg.format = v.format;
            cfg.transform = v.transform;
            cfg.block = v.block;
            cfg.stochastic = v.stochastic;
            cfg.seed = g();
            const std::size_t G = allreduce_granule(cfg);
            const std::size_t sizes[] = {0, 1,
                                         1 + g() % (G - 1),  // below the granule: some ranks own nothing
                                         G * static_cast<std::size_t>(P) - 1 - g() % 7, G + g() % (12 * G)};
            for (const std::size_t n : sizes) {
                CAPTURE(P);
                CAPTURE(wire_format_name(v.format));
                CAPTURE(transform_name(v.transform));
                CAPTURE(v.feedback);
                CAPTURE(v.reduced_feedback);
                CAPTURE(n);
                std::vector<std::vector<float>> grads;
                for (int r = 0; r < P; ++r) grads.push_back(octet_test::with_edge_cases(g, n));

                // (a) the default executor: one global allocation per rank, the block.
                world_state want(cfg, grads, v);
                long global = -1;
                auto errors = run_world(
                    w, cfg, want, [](int) { return on_host(1); }, &global);
                for (int r = 0; r < P; ++r) REQUIRE_MESSAGE(!errors[r], text_of(errors[r]));
                CHECK(global == P);

                // (b) lent allocators, one thread and a pool of two per rank.
                for (const bool pooled : {false, true}) {
                    CAPTURE(pooled);
                    std::vector<octet_test::lent_allocator> lent(static_cast<std::size_t>(P));
                    auto ex = [&](int r) {
                        return with_allocator(pooled ? on_host(*pools[r]) : on_host(1), lent[r].ref());
                    };
                    world_state got(cfg, grads, v);
                    std::vector<std::size_t> need(static_cast<std::size_t>(P));
                    for (int r = 0; r < P; ++r)
                        need[r] = compressed_allreduce_scratch_bytes(ex(r), cfg, n, P, r, got.options(r, ex(r)));
                    global = -1;
                    errors = run_world(w, cfg, got, ex, &global);
                    for (int r = 0; r < P; ++r) REQUIRE_MESSAGE(!errors[r], text_of(errors[r]));
                    CHECK(global == 0);
                    for (int r = 0; r < P; ++r) {
                        CAPTURE(r);
                        CAPTURE(need[r]);
                        CHECK(lent[r].balanced());
                        CHECK(lent[r].allocations == 1);
                        CHECK(lent[r].peak <= need[r]);
                        CHECK(lent[r].peak == need[r]);  // one block of exactly the query
                    }
                    CHECK(got.same(want));
                }
            }
        }
    }
}

TEST_CASE("compressed all-reduce: an allocator that cannot serve stops every rank with octet::error") {
    auto g = octet_test::rng(7302);
    for (const int P : {2, 3}) {
        in_process_world w(P);
        codec_config cfg;
        cfg.format = wire_format::e4m3;
        cfg.transform = transform_kind::hadamard;
        cfg.block = 1024;
        cfg.seed = g();
        const allreduce_variant v{cfg.format, cfg.transform, cfg.block, false, 1, true};
        for (const std::size_t n : {std::size_t{300}, std::size_t{5000 + g() % 20000}}) {
            std::vector<std::vector<float>> grads;
            for (int r = 0; r < P; ++r) grads.push_back(octet_test::with_edge_cases(g, n));
            world_state want(cfg, grads, v);
            auto errors = run_world(w, cfg, want, [](int) { return on_host(1); });
            for (int r = 0; r < P; ++r) REQUIRE_MESSAGE(!errors[r], text_of(errors[r]));

            for (const bool throws : {false, true})
                for (int refuser = -1; refuser < P; ++refuser) {  // -1: every rank refuses
                    CAPTURE(P);
                    CAPTURE(n);
                    CAPTURE(throws);
                    CAPTURE(refuser);
                    std::vector<refusing_allocator> refusing(static_cast<std::size_t>(P));
                    std::vector<octet_test::lent_allocator> lent(static_cast<std::size_t>(P));
                    for (auto& a : refusing) a.throws = throws;
                    auto refuses = [&](int r) { return refuser < 0 || r == refuser; };
                    world_state st(cfg, grads, v);
                    errors = run_world(w, cfg, st, [&](int r) {
                        return with_allocator(on_host(1), refuses(r) ? refusing[r].ref() : lent[r].ref());
                    });
                    for (int r = 0; r < P; ++r) {
                        CAPTURE(r);
                        const std::string text = errors[r] ? text_of(errors[r]) : std::string("no error");
                        CAPTURE(text);
                        CHECK(is_octet_error(errors[r]));
                        CHECK(text.find("scratch") != std::string::npos);
                        if (refuses(r)) {
                            CHECK(refusing[r].allocations == 1);
                            CHECK(refusing[r].deallocations == 0);
                        } else {
                            CHECK(lent[r].allocations == 1);  // its block, given back when the call stopped
                            CHECK(lent[r].balanced());
                        }
                    }
                    // Nothing moved: the data and the residuals are as they were.
                    CHECK(st.same(world_state(cfg, grads, v)));
                }

            // The world is still usable: the same call completes with the same bits.
            world_state again(cfg, grads, v);
            errors = run_world(w, cfg, again, [](int) { return on_host(1); });
            for (int r = 0; r < P; ++r) REQUIRE_MESSAGE(!errors[r], text_of(errors[r]));
            CHECK(again.same(want));
        }
    }
}

TEST_CASE("compressed_allreduce_scratch_bytes: checked arguments; the block holds the codec calls' largest scratch") {
    codec_config cfg;
    cfg.format = wire_format::e4m3;
    cfg.transform = transform_kind::hadamard;
    cfg.block = 1024;
    const host_executor ex = on_host(1);
    CHECK_THROWS_AS(compressed_allreduce_scratch_bytes(ex, cfg, 100, 0, 0), octet::error);
    CHECK_THROWS_AS(compressed_allreduce_scratch_bytes(ex, cfg, 100, 2, 2), octet::error);
    CHECK_THROWS_AS(compressed_allreduce_scratch_bytes(ex, cfg, 100, 2, -1), octet::error);
    codec_config bad = cfg;
    bad.block = 1000;
    CHECK_THROWS_AS(compressed_allreduce_scratch_bytes(ex, bad, 100, 2, 0), octet::error);

    const std::size_t n = 100003;
    for (const int P : {1, 2, 3, 5})
        for (int r = 0; r < P; ++r) {
            CAPTURE(P);
            CAPTURE(r);
            const shard_range s = allreduce_shard(cfg, n, P, r);
            std::size_t messages = 0, codec = 0;
            for (int q = 0; q < P; ++q) {
                const std::size_t c = allreduce_shard(cfg, n, P, q).count;
                messages += encoded_size(cfg, c);
                codec = std::max(
                    {codec, encode_gradient_scratch_bytes(ex, cfg, c), decode_gradient_scratch_bytes(ex, cfg, c)});
            }
            // the reduce sums the P messages of this rank's shard span by span into the re-encode's
            // coordinates: one span of 16 K floats (one thread) beside encode_gradient_transformed's
            if (s.count > 0)
                codec = std::max(codec, encode_gradient_transformed_scratch_bytes(ex, cfg, s.count) + 4 * 16384);
            const std::size_t own = messages + (static_cast<std::size_t>(P) + 1) * encoded_size(cfg, s.count);
            const std::size_t small =
                (64 + 4 * sizeof(std::size_t) + sizeof(shard_range) + sizeof(void*) + sizeof(float)) * (P + 1);
            const std::size_t q = compressed_allreduce_scratch_bytes(ex, cfg, n, P, r);
            CHECK(q >= codec + own);
            CHECK(q <= codec + own + small + 12 * 64);  // and the 64-byte alignment of each array
        }
}
