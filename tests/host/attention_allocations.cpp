// Every temporary of the host attention operations comes from the caller's allocator: with
// with_allocator(on_host(pool), a) (and on_host(1)) the FP8 and the bf16-input forward and backward
// make no global allocation, take at most attention_*_scratch_bytes from `a` (exactly that, for the
// FP8 forms' one block) and give it all back, and give the default executor's bits; without an
// allocator the counter sees their scratch; an allocator that returns null (at any of an
// operation's requests) raises octet::error and everything taken comes back; a reused
// attention_row_telemetry is filled without allocating; the FP8 forms' scratch grows with the
// longest sequence, not with the batch (16 sequences of 128 tokens take what 1 sequence does, up to
// the telemetry's row arrays).
#include "support/counting_allocator.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "attention_common.hpp"
#include "octet/attention/bf16_inputs.hpp"

namespace attention_allocations_test {
using namespace octet;

template <int D>
using per_token = recipe<e4m3, block<1, D>, scale::amax_ratio<0>>;
template <int D>
using per_head = recipe<e4m3, block<full, D>, scale::amax_ratio<0>>;

/// An allocator that serves `allow` requests from a lent_allocator, then returns null.
struct failing_allocator {
    octet_test::lent_allocator lent;
    host_allocator under = lent.ref();
    long allow = 0;
    failing_allocator(long allow_) : allow(allow_) {}
    failing_allocator(const failing_allocator&) = delete;
    failing_allocator& operator=(const failing_allocator&) = delete;
    host_allocator ref() {
        host_allocator a;
        a.context = this;
        a.allocate = [](void* c, std::size_t bytes) -> void* {
            auto& self = *static_cast<failing_allocator*>(c);
            if (self.allow <= 0) return nullptr;
            --self.allow;
            return self.under.allocate(self.under.context, bytes);
        };
        a.deallocate = [](void* c, void* p, std::size_t bytes) {
            auto& self = *static_cast<failing_allocator*>(c);
            self.under.deallocate(self.under.context, p, bytes);
        };
        return a;
    }
};

/// The bytes of some output buffers, for bit-for-bit comparison (NaN-safe).
struct outputs {
    std::vector<std::vector<float>*> buffers;
    std::vector<unsigned char> bytes() const {
        std::vector<unsigned char> b;
        for (const auto* x : buffers) {
            const auto* p = reinterpret_cast<const unsigned char*>(x->data());
            b.insert(b.end(), p, p + x->size() * sizeof(float));
        }
        return b;
    }
    void poison() const {
        for (auto* x : buffers) std::fill(x->begin(), x->end(), std::numeric_limits<float>::quiet_NaN());
    }
};

/// Runs call(ex) under the checks of the file's header comment; query(ex) is its scratch query.
/// `exact`: the operation takes one block, so its peak is the query.
template <class Call, class Query>
void check_lent(const outputs& out, Call&& call, Query&& query, bool exact) {
    out.poison();
    call(on_host());
    const auto expected = out.bytes();
    thread_pool pool(3);

    // (a) the caller's pool, no allocator: the scratch comes from ::operator new, and the counter sees it
    {
        out.poison();
        long n = 0;
        {
            octet_test::global_allocations g;
            call(on_host(pool));
            n = g.count();
        }
        CHECK(n > 0);
        CHECK(out.bytes() == expected);
    }

    // (b), (d) the caller's allocator, on the pool and on one thread: nothing else is allocated
    long requests = 0;
    for (const host_executor base : {on_host(pool), on_host(1)}) {
        CAPTURE(base.thread_count());
        octet_test::lent_allocator lent;
        const host_executor ex = with_allocator(base, lent.ref());
        out.poison();
        long n = 0;
        {
            octet_test::global_allocations g;
            call(ex);
            n = g.count();
        }
        CHECK(n == 0);
        CHECK(lent.allocations >= 1);
        CHECK(lent.balanced());
        const std::size_t bytes = query(ex);
        CHECK(lent.peak <= bytes);
        if (exact) CHECK(lent.peak == bytes);
        CHECK(out.bytes() == expected);
        requests = lent.allocations;
    }

    // (c) an allocator that returns null at each of the requests in turn: octet::error, nothing kept
    for (long allow = 0; allow < requests; ++allow) {
        CAPTURE(allow);
        failing_allocator failing(allow);
        CHECK_THROWS_AS(call(with_allocator(on_host(pool), failing.ref())), octet::error);
        CHECK(failing.lent.allocations == allow);
        CHECK(failing.lent.balanced());
    }
}

template <class QR, class KR, class VR, class DR>
void check_fp8(const attention_test::config& c, const attention_backward_options& bo) {
    const auto p = attention_test::make_problem(c);
    const auto shape = p.shape();
    const attention_test::quantized<QR, KR, VR, DR> qz(p);
    const std::size_t qc = static_cast<std::size_t>(c.hq) * c.d, kc = static_cast<std::size_t>(c.hkv) * c.d;
    std::vector<float> o(p.tq * qc), lse(static_cast<std::size_t>(c.hq) * p.tq), dq(p.tq * qc), dk(p.tk * kc),
        dv(p.tk * kc);
    const attention_options fo = c.forward_options();

    SUBCASE("forward") {
        check_lent(
            outputs{{&o, &lse}},
            [&](host_executor ex) {
                attention_forward(ex, shape, qz.q.cref(), qz.k.cref(), qz.v.cref(),
                                  matrix_ref<float>(o.data(), p.tq, qc), as_span(lse), fo);
            },
            [&](host_executor ex) { return attention_forward_scratch_bytes(ex, shape, fo); }, true);
    }
    SUBCASE("backward") {
        attention_forward(on_host(), shape, qz.q.cref(), qz.k.cref(), qz.v.cref(),
                          matrix_ref<float>(o.data(), p.tq, qc), as_span(lse), fo);
        check_lent(
            outputs{{&dq, &dk, &dv}},
            [&](host_executor ex) {
                attention_backward(ex, shape, qz.q.cref(), qz.k.cref(), qz.v.cref(),
                                   matrix_ref<const float>(o.data(), p.tq, qc), as_cspan(lse), qz.dout.cref(),
                                   matrix_ref<float>(dq.data(), p.tq, qc), matrix_ref<float>(dk.data(), p.tk, kc),
                                   matrix_ref<float>(dv.data(), p.tk, kc), bo);
            },
            [&](host_executor ex) { return attention_backward_scratch_bytes(ex, shape, bo); }, true);
    }
}

TEST_CASE("FP8 attention: causal, GQA 4:2, ragged (an empty sequence, Lk != Lq), telemetry and the dQ fold") {
    attention_test::config c;
    c.lens_q = {37, 0, 130};
    c.lens_k = {70, 3, 100};
    c.hq = 4;
    c.hkv = 2;
    c.d = 64;
    c.causal = true;
    c.salt = 11;
    attention_backward_options bo;
    bo.mask = attention_mask::causal;
    bo.delta = delta_mode::matched;
    bo.telemetry = true;
    bo.fold_dq_residual = true;
    check_fp8<per_token<64>, per_token<64>, per_token<64>, per_token<64>>(c, bo);
}

TEST_CASE("FP8 attention: full mask, GQA 2:1, head dim 32, per-head scales, delta from the output") {
    attention_test::config c;
    c.lens_q = {65, 1, 20};
    c.hq = 2;
    c.hkv = 1;
    c.d = 32;
    c.salt = 12;
    attention_backward_options bo;
    bo.delta = delta_mode::from_output;
    check_fp8<per_head<32>, per_head<32>, per_head<32>, per_token<32>>(c, bo);
}

template <int D>
void check_bf16(const attention_test::config& c, const attention_backward_options& bo) {
    const auto p = attention_test::make_problem(c);
    const auto shape = p.shape();
    const auto to_bf16_vec = [](const std::vector<float>& x) {
        std::vector<bf16> v(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) v[i] = to_bf16(x[i]);
        return v;
    };
    const auto q = to_bf16_vec(p.q), k = to_bf16_vec(p.k), v = to_bf16_vec(p.v), dout = to_bf16_vec(p.dout);
    const std::size_t qc = static_cast<std::size_t>(c.hq) * D, kc = static_cast<std::size_t>(c.hkv) * D;
    const auto mq = [&](const std::vector<bf16>& x, std::size_t rows, std::size_t cols) {
        return matrix_ref<const bf16>(x.data(), rows, cols);
    };
    std::vector<float> o(p.tq * qc), lse(static_cast<std::size_t>(c.hq) * p.tq), dq(p.tq * qc), dk(p.tk * kc),
        dv(p.tk * kc);
    const attention_options fo = c.forward_options();

    SUBCASE("forward") {
        check_lent(
            outputs{{&o, &lse}},
            [&](host_executor ex) {
                attention_forward(ex, shape, mq(q, p.tq, qc), mq(k, p.tk, kc), mq(v, p.tk, kc),
                                  matrix_ref<float>(o.data(), p.tq, qc), as_span(lse), fo);
            },
            [&](host_executor ex) {
                return attention_forward_scratch_bytes(ex, shape, mq(q, p.tq, qc), mq(k, p.tk, kc), mq(v, p.tk, kc),
                                                       fo);
            },
            false);
    }
    SUBCASE("backward") {
        attention_forward(on_host(), shape, mq(q, p.tq, qc), mq(k, p.tk, kc), mq(v, p.tk, kc),
                          matrix_ref<float>(o.data(), p.tq, qc), as_span(lse), fo);
        check_lent(
            outputs{{&dq, &dk, &dv}},
            [&](host_executor ex) {
                attention_backward(ex, shape, mq(q, p.tq, qc), mq(k, p.tk, kc), mq(v, p.tk, kc),
                                   matrix_ref<const float>(o.data(), p.tq, qc), as_cspan(lse), mq(dout, p.tq, qc),
                                   matrix_ref<float>(dq.data(), p.tq, qc), matrix_ref<float>(dk.data(), p.tk, kc),
                                   matrix_ref<float>(dv.data(), p.tk, kc), bo);
            },
            [&](host_executor ex) {
                return attention_backward_scratch_bytes(ex, shape, mq(q, p.tq, qc), mq(k, p.tk, kc), mq(v, p.tk, kc),
                                                        mq(dout, p.tq, qc), bo);
            },
            false);
    }
}

TEST_CASE("bf16 inputs: head dim 64, causal, GQA 4:2, ragged with an empty sequence") {
    attention_test::config c;
    c.lens_q = {37, 0, 70};
    c.hq = 4;
    c.hkv = 2;
    c.d = 64;
    c.causal = true;
    c.salt = 13;
    attention_backward_options bo;
    bo.mask = attention_mask::causal;
    check_bf16<64>(c, bo);
}

TEST_CASE("bf16 inputs: head dim 128, full mask, GQA 2:1, Lk != Lq, delta from the output with telemetry") {
    attention_test::config c;
    c.lens_q = {20, 50};
    c.lens_k = {64, 9};
    c.hq = 2;
    c.hkv = 1;
    c.d = 128;
    c.salt = 14;
    attention_backward_options bo;
    bo.delta = delta_mode::from_output;
    bo.telemetry = true;
    check_bf16<128>(c, bo);
}

TEST_CASE("backward telemetry rows: the only allocations, and none when the struct is reused") {
    attention_test::config c;
    c.lens_q = {40, 90};
    c.hq = 2;
    c.hkv = 2;
    c.d = 64;
    c.salt = 15;
    const auto p = attention_test::make_problem(c);
    const auto shape = p.shape();
    const attention_test::quantized<per_token<64>> qz(p);
    const std::size_t qc = static_cast<std::size_t>(c.hq) * c.d;
    std::vector<float> o(p.tq * qc), lse(static_cast<std::size_t>(c.hq) * p.tq), dq(p.tq * qc), dk(dq.size()),
        dv(dq.size());
    attention_forward(on_host(), shape, qz.q.cref(), qz.k.cref(), qz.v.cref(), matrix_ref<float>(o.data(), p.tq, qc),
                      as_span(lse));
    attention_backward_options bo;
    bo.telemetry = true;
    thread_pool pool(2);
    octet_test::lent_allocator lent;
    const host_executor ex = with_allocator(on_host(pool), lent.ref());
    attention_row_telemetry rows, expected;
    attention_backward(on_host(), shape, qz.q.cref(), qz.k.cref(), qz.v.cref(),
                       matrix_ref<const float>(o.data(), p.tq, qc), as_cspan(lse), qz.dout.cref(),
                       matrix_ref<float>(dq.data(), p.tq, qc), matrix_ref<float>(dk.data(), p.tk, qc),
                       matrix_ref<float>(dv.data(), p.tk, qc), bo, &expected);
    long counts[2] = {0, 0};
    for (long& n : counts) {
        octet_test::global_allocations g;
        attention_backward(ex, shape, qz.q.cref(), qz.k.cref(), qz.v.cref(),
                           matrix_ref<const float>(o.data(), p.tq, qc), as_cspan(lse), qz.dout.cref(),
                           matrix_ref<float>(dq.data(), p.tq, qc), matrix_ref<float>(dk.data(), p.tk, qc),
                           matrix_ref<float>(dv.data(), p.tk, qc), bo, &rows);
        n = g.count();
    }
    CHECK(counts[0] == 8);  // the eight arrays of attention_row_telemetry
    CHECK(counts[1] == 0);  // reused: assign into the capacity they have
    CHECK(lent.balanced());
    const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    CHECK(rows.delta.size() == static_cast<std::size_t>(c.hq) * p.tq);
    CHECK(same(rows.delta, expected.delta));
    CHECK(same(rows.delta_from_output, expected.delta_from_output));
    CHECK(same(rows.residual, expected.residual));
    CHECK(same(rows.abs_ds, expected.abs_ds));
    CHECK(same(rows.p_dp, expected.p_dp));
    CHECK(same(rows.p_abs_dp, expected.p_abs_dp));
    CHECK(same(rows.residual_dq, expected.residual_dq));
    CHECK(same(rows.residual_dk, expected.residual_dk));
}

TEST_CASE("FP8 scratch grows with the longest sequence, not with the batch") {
    // 16 sequences of 128 tokens against 1 of 128 (and 1 of 2048: the same tokens in one sequence),
    // heads 8:4, head_dim 32, two threads: the forward and the backward take the same scratch for 16
    // sequences as for 1 (a thread holds one sequence and head at a time); with telemetry (and the
    // dQ fold) the seven [heads_q][total_q] row arrays add a float per token and head. Before the
    // scratch held whole decoded planes and accumulators, 12-14x more for the 16 sequences.
    const auto offsets = [](int sequences, int len) {
        std::vector<std::int32_t> cu(static_cast<std::size_t>(sequences) + 1);
        for (int b = 0; b <= sequences; ++b) cu[static_cast<std::size_t>(b)] = b * len;
        return cu;
    };
    const auto cu16 = offsets(16, 128), cu1 = offsets(1, 128), cu_long = offsets(1, 2048);
    const auto shape_of = [](const std::vector<std::int32_t>& cu) {
        attention_shape s;
        s.cu_seqlens_q = span<const std::int32_t>(cu.data(), cu.size());
        s.heads_q = 8;
        s.heads_kv = 4;
        s.head_dim = 32;
        return s;
    };
    const host_executor ex = on_host(2);
    attention_backward_options plain, tele;
    tele.telemetry = true;
    tele.fold_dq_residual = true;
    const auto fwd = [&](const std::vector<std::int32_t>& cu) {
        return attention_forward_scratch_bytes(ex, shape_of(cu));
    };
    const auto bwd = [&](const std::vector<std::int32_t>& cu, const attention_backward_options& o) {
        return attention_backward_scratch_bytes(ex, shape_of(cu), o);
    };
    MESSAGE("forward scratch: 16 x 128 tokens ", fwd(cu16), " B, 1 x 128 ", fwd(cu1), " B, 1 x 2048 ", fwd(cu_long),
            " B");
    MESSAGE("backward scratch: 16 x 128 tokens ", bwd(cu16, plain), " B, 1 x 128 ", bwd(cu1, plain), " B, 1 x 2048 ",
            bwd(cu_long, plain), " B; with telemetry and the fold ", bwd(cu16, tele), " B, ", bwd(cu1, tele), " B, ",
            bwd(cu_long, tele), " B");
    CHECK(fwd(cu16) < 2 * fwd(cu1));
    CHECK(bwd(cu16, plain) < 2 * bwd(cu1, plain));
    CHECK(bwd(cu16, tele) < 4 * bwd(cu1, tele));
    // the longest sequence is what counts
    CHECK(fwd(cu_long) > 4 * fwd(cu16));
    CHECK(bwd(cu_long, plain) > 4 * bwd(cu16, plain));

    // and the calls on 16 sequences take exactly the query (with causal masks, ragged units)
    attention_test::config c;
    c.lens_q.assign(16, 128);
    c.hq = 8;
    c.hkv = 4;
    c.d = 32;
    c.causal = true;
    c.salt = 16;
    const auto p = attention_test::make_problem(c);
    const auto shape = p.shape();
    const attention_test::quantized<per_token<32>> qz(p);
    const std::size_t qc = static_cast<std::size_t>(c.hq) * c.d, kc = static_cast<std::size_t>(c.hkv) * c.d;
    std::vector<float> o(p.tq * qc), lse(static_cast<std::size_t>(c.hq) * p.tq), dq(p.tq * qc), dk(p.tk * kc),
        dv(p.tk * kc);
    const attention_options fo = c.forward_options();
    {
        octet_test::lent_allocator lent;
        attention_forward(with_allocator(ex, lent.ref()), shape, qz.q.cref(), qz.k.cref(), qz.v.cref(),
                          matrix_ref<float>(o.data(), p.tq, qc), as_span(lse), fo);
        CHECK(lent.balanced());
        CHECK(lent.peak == attention_forward_scratch_bytes(ex, shape, fo));
    }
    for (attention_backward_options bo : {plain, tele}) {
        bo.mask = attention_mask::causal;
        octet_test::lent_allocator lent;
        attention_backward(with_allocator(ex, lent.ref()), shape, qz.q.cref(), qz.k.cref(), qz.v.cref(),
                           matrix_ref<const float>(o.data(), p.tq, qc), as_cspan(lse), qz.dout.cref(),
                           matrix_ref<float>(dq.data(), p.tq, qc), matrix_ref<float>(dk.data(), p.tk, kc),
                           matrix_ref<float>(dv.data(), p.tk, kc), bo);
        CHECK(lent.balanced());
        CHECK(lent.peak == attention_backward_scratch_bytes(ex, shape, bo));
    }
}

}  // namespace attention_allocations_test
