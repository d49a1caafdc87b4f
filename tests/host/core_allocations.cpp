// Every byte through the caller, for quantize, dequantize, scaled_gemm and the linear layer on the
// host: with a host allocator lent (with_allocator(on_host(pool), a)), an operation makes zero
// allocations of its own (global operator new is replaced and counts every thread's allocations),
// takes at most its ..._scratch_bytes query from the allocator and gives everything back, and
// writes the same bits as with octet's default; without one, the counter sees its temporaries (so a
// zero is not the counter's blindness). An allocator that cannot serve gives octet::error. Fresh
// random shapes (ragged, one row, column-major inputs) and edge values, on one thread and a pool.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "octet/core/host_arena.hpp"
#include "octet/gemm/scaled_gemm.hpp"
#include "octet/nn/linear.hpp"
#include "support/counting_allocator.hpp"
#include "support/random.hpp"

namespace core_allocations_test {
using namespace octet;
using octet_test::global_allocations;
using octet_test::lent_allocator;

/// An allocator that refuses every request.
host_allocator refusing() {
    host_allocator a;
    a.allocate = [](void*, std::size_t) -> void* { return nullptr; };
    a.deallocate = [](void*, void*, std::size_t) {};
    return a;
}

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class R>
void check_quantize(const host_executor& base, std::size_t rows, std::size_t cols, storage_order order,
                    std::uint64_t salt) {
    INFO("recipe " << recipe_description<R>() << " rows=" << rows << " cols=" << cols
                   << " column-major=" << (order == storage_order::col_major) << " threads=" << base.thread_count()
                   << " seed=" << octet_test::run_seed());
    auto g = octet_test::rng(salt);
    const std::vector<float> x = octet_test::with_edge_cases(g, rows * cols, 1.0f);
    const matrix_ref<const float> xm = order == storage_order::row_major
                                           ? matrix_ref<const float>(x.data(), rows, cols)
                                           : matrix_ref<const float>(x.data(), rows, cols, rows, order);
    quantized_tensor<R> row_default(rows, cols), col_default(cols, rows), row_lent(rows, cols), col_lent(cols, rows);
    quantize_options opt;
    opt.collect_stats = true;
    long defaults = 0;
    {
        const global_allocations counter;
        quantize<R>(base, xm, row_default.ref(), col_default.ref(), opt);
        defaults = counter.count();
    }
    CHECK(defaults > 0);  // the counter sees octet's default temporaries

    lent_allocator lent;
    const host_executor ex = with_allocator(base, lent.ref());
    const std::size_t query = quantize_scratch_bytes(ex, xm, row_lent.ref(), col_lent.ref());
    long own = 0;
    quantize_result r;
    {
        const global_allocations counter;
        r = quantize<R>(ex, xm, row_lent.ref(), col_lent.ref(), opt);
        own = counter.count();
    }
    CHECK(own == 0);
    CHECK(lent.allocations == 1);  // one block for both copies
    CHECK(lent.balanced());
    CHECK(lent.peak <= query);
    CHECK(lent.peak > 0);
    CHECK(same_bytes(row_default.data(), row_lent.data()));
    CHECK(same_bytes(row_default.scales(), row_lent.scales()));
    CHECK(same_bytes(col_default.data(), col_lent.data()));
    CHECK(same_bytes(col_default.scales(), col_lent.scales()));
    CHECK(r.rowwise.elements == rows * cols);

    // dequantize takes no scratch: zero allocations of either kind.
    std::vector<float> back(rows * cols);
    {
        const global_allocations counter;
        dequantize(ex, row_lent.ref(), matrix_ref<float>(back.data(), rows, cols));
        own = counter.count();
    }
    CHECK(own == 0);
    CHECK(lent.allocations == 1);
}

TEST_CASE("quantize takes its scratch from the lent allocator; dequantize takes none") {
    thread_pool pool(3);
    auto g = octet_test::rng(1);
    std::uniform_int_distribution<std::size_t> dim(1, 300);
    for (int trial = 0; trial < 3; ++trial) {
        const std::size_t rows = trial == 0 ? 1 : dim(g), cols = dim(g);
        for (const host_executor& base : {on_host(1), on_host(pool)}) {
            for (storage_order order : {storage_order::row_major, storage_order::col_major}) {
                check_quantize<recipes::mxfp8_e4m3>(base, rows, cols, order, 10 + trial);
                check_quantize<recipes::blockwise_128x128>(base, rows, cols, order, 20 + trial);
                check_quantize<recipes::tensorwise_e4m3>(base, rows, cols, order, 30 + trial);
                check_quantize<recipes::nvfp4>(base, rows, cols + (cols % 2), order, 40 + trial);
            }
        }
    }
}

TEST_CASE("an allocator that cannot serve gives octet::error, and nothing leaks") {
    const std::vector<float> x(64 * 96, 1.0f);
    quantized_tensor<recipes::mxfp8_e4m3> q(64, 96);
    CHECK_THROWS_AS(quantize<recipes::mxfp8_e4m3>(with_allocator(on_host(1), refusing()),
                                                  matrix_ref<const float>(x.data(), 64, 96), q.ref()),
                    octet::error);
    CHECK_THROWS_AS(with_allocator(on_host(1), host_allocator{}), octet::error);
    // A failing operation still gives back what it took: a throwing quantize inside scaled_gemm's
    // quantized output (one request served, the next refused).
    struct limited {
        lent_allocator inner;
        host_allocator inner_ref;
        int left = 1;
    } lim;
    lim.inner_ref = lim.inner.ref();
    host_allocator a;
    a.context = &lim;
    a.allocate = [](void* c, std::size_t bytes) -> void* {
        auto& l = *static_cast<limited*>(c);
        if (l.left-- <= 0) return nullptr;
        return l.inner_ref.allocate(l.inner_ref.context, bytes);
    };
    a.deallocate = [](void* c, void* p, std::size_t bytes) {
        auto& l = *static_cast<limited*>(c);
        l.inner_ref.deallocate(l.inner_ref.context, p, bytes);
    };
    quantized_tensor<recipes::mxfp8_e4m3> A(32, 64), B(48, 64);
    quantize<recipes::mxfp8_e4m3>(on_host(1), matrix_ref<const float>(x.data(), 32, 64), A.ref());
    quantize<recipes::mxfp8_e4m3>(on_host(1), matrix_ref<const float>(x.data(), 48, 64), B.ref());
    quantized_tensor<recipes::mxfp8_e4m3> D(32, 48);
    CHECK_THROWS_AS(scaled_gemm(with_allocator(on_host(1), a), A.ref(), B.ref(), D.ref()), octet::error);
    CHECK(lim.inner.allocations == 1);
    CHECK(lim.inner.balanced());
}

template <class RA, class RB>
void check_gemm(const host_executor& base, std::size_t M, std::size_t N, std::size_t K, std::uint64_t salt) {
    INFO("A " << recipe_description<RA>() << " B " << recipe_description<RB>() << " M=" << M << " N=" << N << " K=" << K
              << " threads=" << base.thread_count() << " seed=" << octet_test::run_seed());
    auto g = octet_test::rng(salt);
    const std::vector<float> xa = octet_test::with_edge_cases(g, M * K, 1.0f);
    const std::vector<float> xb = octet_test::with_edge_cases(g, N * K, 0.5f);
    quantized_tensor<RA> A(M, K);
    quantized_tensor<RB> B(N, K);
    quantize<RA>(on_host(1), matrix_ref<const float>(xa.data(), M, K), A.ref());
    quantize<RB>(on_host(1), matrix_ref<const float>(xb.data(), N, K), B.ref());
    std::vector<float> d_default(M * N), d_lent(M * N);
    long defaults = 0, own = 0;
    {
        const global_allocations counter;
        scaled_gemm(base, A.ref(), B.ref(), matrix_ref<float>(d_default.data(), M, N));
        defaults = counter.count();
    }
    CHECK(defaults > 0);
    lent_allocator lent;
    const host_executor ex = with_allocator(base, lent.ref());
    const std::size_t query = scaled_gemm_scratch_bytes(ex, A.ref(), B.ref(), matrix_ref<float>(d_lent.data(), M, N));
    {
        const global_allocations counter;
        scaled_gemm(ex, A.ref(), B.ref(), matrix_ref<float>(d_lent.data(), M, N));
        own = counter.count();
    }
    CHECK(own == 0);
    CHECK(lent.allocations == 1);
    CHECK(lent.balanced());
    CHECK(lent.peak <= query);
    CHECK(same_bytes(d_default, d_lent));

    // With C and a quantized D.
    std::vector<float> c(M * N, 0.25f);
    lent = lent_allocator{};
    const host_executor ex2 = with_allocator(base, lent.ref());
    {
        const global_allocations counter;
        scaled_gemm(ex2, A.ref(), B.ref(), matrix_ref<const float>(c.data(), M, N),
                    matrix_ref<float>(d_lent.data(), M, N));
        own = counter.count();
    }
    CHECK(own == 0);
    CHECK(lent.balanced());
    quantized_tensor<recipes::mxfp8_e4m3> q_default(M, N), q_lent(M, N);
    scaled_gemm(base, A.ref(), B.ref(), q_default.ref());
    lent = lent_allocator{};
    const host_executor ex3 = with_allocator(base, lent.ref());
    const std::size_t query_q = scaled_gemm_scratch_bytes(ex3, A.ref(), B.ref(), q_lent.ref());
    gemm_result r;
    {
        const global_allocations counter;
        r = scaled_gemm(ex3, A.ref(), B.ref(), q_lent.ref());
        own = counter.count();
    }
    CHECK(own == 0);
    CHECK(lent.balanced());
    CHECK(lent.peak <= query_q);
    CHECK(same_bytes(q_default.data(), q_lent.data()));
    CHECK(same_bytes(q_default.scales(), q_lent.scales()));
}

TEST_CASE("scaled_gemm takes its scratch from the lent allocator (matrix, C, quantized outputs)") {
    thread_pool pool(3);
    auto g = octet_test::rng(2);
    std::uniform_int_distribution<std::size_t> dim(1, 200);
    for (int trial = 0; trial < 3; ++trial) {
        const std::size_t M = trial == 0 ? 1 : dim(g), N = dim(g), K = 32 * (1 + dim(g) % 8);
        for (const host_executor& base : {on_host(1), on_host(pool)}) {
            check_gemm<recipes::mxfp8_e4m3, recipes::mxfp8_e4m3>(base, M, N, K, 50 + trial);
            check_gemm<recipes::blockwise_1x128, recipes::blockwise_128x128>(base, M, N, K, 60 + trial);
            check_gemm<recipes::tensorwise_e4m3, recipes::tensorwise_e5m2>(base, M, N, K, 70 + trial);
        }
    }
}

template <class LR>
void check_linear(const host_executor& base, std::size_t tokens, std::size_t in, std::size_t out, std::uint64_t salt) {
    INFO("tokens=" << tokens << " in=" << in << " out=" << out << " threads=" << base.thread_count()
                   << " seed=" << octet_test::run_seed());
    auto g = octet_test::rng(salt);
    const std::vector<float> x = octet_test::with_edge_cases(g, tokens * in, 1.0f);
    const std::vector<float> w = octet_test::with_edge_cases(g, out * in, 0.1f);
    const std::vector<float> bias = octet_test::with_edge_cases(g, out, 0.5f);
    const std::vector<float> dy = octet_test::with_edge_cases(g, tokens * out, 0.01f);
    linear_config cfg;
    cfg.max_tokens = tokens + 7;
    cfg.in_features = in;
    cfg.out_features = out;
    cfg.seed = salt;
    linear_context<LR> ctx_default(cfg), ctx_lent(cfg);
    std::vector<float> y[2], dx[2], dw[2], db[2];
    lent_allocator lent;
    const host_executor ex = with_allocator(base, lent.ref());
    const std::size_t query = ctx_lent.scratch_bytes(ex);
    for (int step = 0; step < 2; ++step) {
        for (int k = 0; k < 2; ++k) {
            y[k].assign(tokens * out, 0.0f);
            dx[k].assign(tokens * in, 0.0f);
            dw[k].assign(out * in, 0.0f);
            db[k].assign(out, 0.0f);
        }
        linear_forward(base, ctx_default, matrix_ref<const float>(x.data(), tokens, in),
                       matrix_ref<const float>(w.data(), out, in), as_cspan(bias),
                       matrix_ref<float>(y[0].data(), tokens, out));
        linear_backward(base, ctx_default, matrix_ref<const float>(dy.data(), tokens, out),
                        matrix_ref<float>(dx[0].data(), tokens, in), matrix_ref<float>(dw[0].data(), out, in),
                        as_span(db[0]));
        long own = 0;
        {
            const global_allocations counter;
            linear_forward(ex, ctx_lent, matrix_ref<const float>(x.data(), tokens, in),
                           matrix_ref<const float>(w.data(), out, in), as_cspan(bias),
                           matrix_ref<float>(y[1].data(), tokens, out));
            linear_backward(ex, ctx_lent, matrix_ref<const float>(dy.data(), tokens, out),
                            matrix_ref<float>(dx[1].data(), tokens, in), matrix_ref<float>(dw[1].data(), out, in),
                            as_span(db[1]));
            own = counter.count();
        }
        CHECK(own == 0);
        CHECK(lent.allocations > 0);
        CHECK(lent.balanced());
        CHECK(lent.peak <= query);
        CHECK(same_bytes(y[0], y[1]));
        CHECK(same_bytes(dx[0], dx[1]));
        CHECK(same_bytes(dw[0], dw[1]));
        CHECK(same_bytes(db[0], db[1]));
    }
}

TEST_CASE("the linear layer's forward and backward take every temporary from the lent allocator") {
    thread_pool pool(2);
    auto g = octet_test::rng(3);
    std::uniform_int_distribution<std::size_t> dim(1, 100);
    for (int trial = 0; trial < 2; ++trial) {
        const std::size_t tokens = trial == 0 ? 1 : dim(g), in = 32 * (1 + dim(g) % 4), out = 32 * (1 + dim(g) % 4);
        for (const host_executor& base : {on_host(1), on_host(pool)}) {
            check_linear<linear_recipes::mxfp8>(base, tokens, in, out, 80 + trial);
            check_linear<linear_recipes::blockwise>(base, tokens, in, out, 90 + trial);
            check_linear<linear_recipes::tensorwise_delayed>(base, tokens, in, out, 100 + trial);
            check_linear<linear_recipes::nvfp4>(base, tokens, in, out, 110 + trial);  // Hadamard, stochastic
        }
    }
}

TEST_CASE("one host_arena sized by the largest query serves a training step of several layers") {
    thread_pool pool(2);
    auto g = octet_test::rng(4);
    const std::size_t tokens = 1 + g() % 90, widths[4] = {64, 128, 96, 64};
    std::vector<linear_config> configs(3);
    for (int l = 0; l < 3; ++l) {
        configs[l].max_tokens = tokens;
        configs[l].in_features = widths[l];
        configs[l].out_features = widths[l + 1];
    }
    linear_workspace ws;
    std::vector<linear_context<linear_recipes::blockwise>> layers;
    std::size_t largest = 0;
    for (const auto& c : configs) {
        layers.emplace_back(c, ws);
        largest = std::max(largest, layers.back().scratch_bytes(on_host(pool)));
    }
    host_arena arena(largest);
    const host_executor ex = with_allocator(on_host(pool), arena.allocator());
    std::vector<std::vector<float>> acts(1, octet_test::with_edge_cases(g, tokens * widths[0], 1.0f));
    std::vector<std::vector<float>> weights;
    long own = 0;
    for (int l = 0; l < 3; ++l) {
        weights.push_back(octet_test::with_edge_cases(g, widths[l + 1] * widths[l], 0.1f));
        acts.emplace_back(tokens * widths[l + 1]);
    }
    std::vector<float> dy = octet_test::with_edge_cases(g, tokens * widths[3], 0.01f), dx, dw;
    {
        const global_allocations counter;
        for (int l = 0; l < 3; ++l)
            linear_forward(ex, layers[l], matrix_ref<const float>(acts[l].data(), tokens, widths[l]),
                           matrix_ref<const float>(weights[l].data(), widths[l + 1], widths[l]), {},
                           matrix_ref<float>(acts[l + 1].data(), tokens, widths[l + 1]));
        own = counter.count();
    }
    CHECK(own == 0);
    for (int l = 2; l >= 0; --l) {
        dx.assign(tokens * widths[l], 0.0f);
        dw.assign(widths[l + 1] * widths[l], 0.0f);
        {
            const global_allocations counter;
            linear_backward(ex, layers[l], matrix_ref<const float>(dy.data(), tokens, widths[l + 1]),
                            matrix_ref<float>(dx.data(), tokens, widths[l]),
                            matrix_ref<float>(dw.data(), widths[l + 1], widths[l]), {});
            own = counter.count();
        }
        CHECK(own == 0);
        dy = dx;
    }
    CHECK(arena.used() == 0);
    CHECK(arena.peak() > 0);
    CHECK(arena.peak() <= arena.capacity());

    // An arena too small for the largest step: octet::error naming the bytes, and the arena empty after.
    host_arena small(largest / 4);
    CHECK_THROWS_AS(linear_forward(with_allocator(on_host(pool), small.allocator()), layers[1],
                                   matrix_ref<const float>(acts[1].data(), tokens, widths[1]),
                                   matrix_ref<const float>(weights[1].data(), widths[2], widths[1]), {},
                                   matrix_ref<float>(acts[2].data(), tokens, widths[2])),
                    octet::error);
    CHECK(small.used() == 0);

    // The same layer over a borrowed block (idle memory of the caller's): the same bits, no
    // allocation, the block left to its owner; a block that does not start on 64 bytes is refused.
    std::vector<unsigned char> idle(largest + 64);
    const auto misalign = reinterpret_cast<std::uintptr_t>(idle.data()) % 64;
    unsigned char* start = idle.data() + (misalign == 0 ? 0 : 64 - misalign);
    std::vector<float> out_own(tokens * widths[2]), out_borrowed(tokens * widths[2]);
    linear_forward(ex, layers[1], matrix_ref<const float>(acts[1].data(), tokens, widths[1]),
                   matrix_ref<const float>(weights[1].data(), widths[2], widths[1]), {},
                   matrix_ref<float>(out_own.data(), tokens, widths[2]));
    {
        host_arena borrowed(span<unsigned char>(start, largest));
        CHECK(borrowed.capacity() == largest);
        const global_allocations counter;
        linear_forward(with_allocator(on_host(pool), borrowed.allocator()), layers[1],
                       matrix_ref<const float>(acts[1].data(), tokens, widths[1]),
                       matrix_ref<const float>(weights[1].data(), widths[2], widths[1]), {},
                       matrix_ref<float>(out_borrowed.data(), tokens, widths[2]));
        CHECK(counter.count() == 0);
        CHECK(borrowed.used() == 0);
        CHECK(borrowed.peak() > 0);
        host_arena moved(std::move(borrowed));  // moved, still the caller's block
        CHECK(moved.capacity() == largest);
    }  // (AddressSanitizer: freeing the caller's block here would be a bad free)
    CHECK(std::memcmp(out_own.data(), out_borrowed.data(), out_own.size() * sizeof(float)) == 0);
    CHECK_THROWS_WITH_AS(host_arena(span<unsigned char>(start + 1, 64)), doctest::Contains("borrowed"), octet::error);
    CHECK_THROWS_WITH_AS(host_arena(span<unsigned char>(nullptr, 64)), doctest::Contains("borrowed"), octet::error);
}

}  // namespace core_allocations_test
