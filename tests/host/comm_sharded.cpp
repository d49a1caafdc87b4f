// octet-test: timeout=240
// The sharded-training building blocks of octet/comm/sharded.hpp over the in-process transport
// (support/in_process_world.hpp: one thread per rank), P = 1, 2, 3, 4 ranks:
//   * quantized_allgather_host: ragged row blocks (including ranks with 0 rows); every rank's copy
//     is bit for bit quantize() of the whole matrix on one process (codes, scales with their
//     padding, the NVFP4 tensor scale; outputs poisoned first), for tensorwise E4M3, per-row E4M3,
//     1x128, MXFP8, NVFP4 and 128x128 (aligned shards), from float and bf16 rows, with a NaN on one
//     rank (tensorwise: the whole copy NaN, as one process); bytes sent against float and bf16;
//     misaligned 128x128 shards and mismatched descriptors (cols, recipe, out's rows) make EVERY
//     rank throw octet::error (a watchdog fails the test instead of hanging);
//   * compressed_reduce_scatter_host: every rank's shard within reduce_scatter_error_bound of the
//     float64 sum (unit, 1e-6 and 1e30 magnitudes; zero gradients give zeros), bit-identical across
//     runs; with the identity transform bit for bit the rank-ordered float sum of the decoded
//     messages (an oracle of the bytes moved); error feedback telescopes over steps (the outputs
//     plus the senders' residuals give the exact sum within float rounding); mismatched
//     descriptors and a corrupted message make every rank throw;
//   * quantized_allgather_host with out_t: the row-wise copy and the column-wise copy (W^T), or W^T's
//     alone, from one gather, each bit for bit quantize()'s (with its columnwise output) of the whole
//     matrix, for tensorwise E4M3 (float, bf16, a NaN), tensorwise FP4 and FP6 (packed groups of the
//     matrix's rows), 1x128, MXFP8, MXFP6, NVFP4 (float, bf16) and 128x128, on ragged shards whose
//     boundaries fall on multiples of C; bytes sent; misaligned shards (NVFP4's 16, FP4's packing
//     pair), ranks asking for different copies, out_t of the wrong shape, both copies absent: EVERY
//     rank throws;
//   * both: with a lent counting allocator, zero global allocations around the whole multi-rank
//     call and one lent block of exactly the scratch query per rank; with the default executor one
//     global allocation per rank.
#include "support/counting_allocator.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "octet/codec/codec.hpp"
#include "octet/codec/feedback.hpp"
#include "octet/comm/sharded.hpp"
#include "octet/quant/quantize.hpp"
#include "support/counted_ranks.hpp"
#include "support/in_process_world.hpp"
#include "support/random.hpp"

namespace {
using namespace octet;
using octet_test::in_process_transport;
using octet_test::in_process_world;
using octet_test::is_octet_error;
using octet_test::text_of;

using octet_test::run_ranks;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void require_no_error(const std::vector<std::exception_ptr>& errors) {
    for (std::size_t r = 0; r < errors.size(); ++r) REQUIRE_MESSAGE(!errors[r], "rank ", r, ": ", text_of(errors[r]));
}

void require_every_rank_throws(const std::vector<std::exception_ptr>& errors, const char* expect) {
    for (std::size_t r = 0; r < errors.size(); ++r) {
        CAPTURE(r);
        const std::string text = errors[r] ? text_of(errors[r]) : std::string("no error");
        CAPTURE(text);
        CHECK(is_octet_error(errors[r]));
        if (expect) CHECK(text.find(expect) != std::string::npos);
    }
}

// ---- the quantized all-gather -----------------------------------------------------------------

/// Row counts of P ranks: ragged, some 0; with R > 1 multiples of R except the last.
std::vector<std::size_t> row_counts(std::mt19937_64& g, int P, std::size_t R) {
    std::vector<std::size_t> m(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) {
        const bool last = r == P - 1;
        if (g() % 4 == 0)
            m[r] = 0;
        else if (R > 1)
            m[r] = last ? 1 + g() % (2 * R) : R * (1 + g() % 2);
        else
            m[r] = 1 + g() % 37;
    }
    return m;
}

template <class Recipe, class In>
void check_allgather(std::mt19937_64& g, int P, std::size_t cols, const std::vector<std::size_t>& rows,
                     int nan_rank = -1) {
    std::size_t total = 0;
    std::vector<std::size_t> begin;
    for (std::size_t m : rows) begin.push_back(total), total += m;
    CAPTURE(P);
    CAPTURE(cols);
    CAPTURE(total);
    CAPTURE(nan_rank);
    // The whole matrix (row-major) and each rank's rows as views of it.
    std::vector<float> xf = octet_test::with_edge_cases(g, total * cols);
    if (nan_rank >= 0 && rows[nan_rank] > 0) xf[(begin[nan_rank] + g() % rows[nan_rank]) * cols + g() % cols] = NAN;
    std::vector<In> x(xf.size());
    for (std::size_t i = 0; i < xf.size(); ++i) {
        if constexpr (std::is_same_v<In, float>)
            x[i] = xf[i];
        else
            x[i] = to_bf16(xf[i]);
    }
    quantized_tensor<Recipe> want(total, cols);
    quantize<Recipe>(on_host(), matrix_ref<const In>(x.data(), total, cols), want.ref());

    std::vector<std::unique_ptr<quantized_tensor<Recipe>>> got;
    std::vector<quantized_allgather_report> reps(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) {
        got.push_back(std::make_unique<quantized_tensor<Recipe>>(total, cols));
        std::fill(got[r]->data().begin(), got[r]->data().end(), std::uint8_t{0xA5});
        std::fill(got[r]->scales().begin(), got[r]->scales().end(), std::uint8_t{0x5A});
    }
    auto errors = run_ranks(P, [&](int r, in_process_transport& t) {
        const matrix_ref<const In> mine(x.data() + begin[r] * cols, rows[r], cols);
        reps[r] = quantized_allgather_host(t, on_host(1), mine, got[r]->ref());
    });
    require_no_error(errors);
    for (int r = 0; r < P; ++r) {
        CAPTURE(r);
        CHECK(got[r]->data() == want.data());
        CHECK(got[r]->scales() == want.scales());
        if (Recipe::two_level && total > 0) CHECK(got[r]->tensor_scale() == want.tensor_scale());
        const quantized_allgather_report& rep = reps[r];
        CHECK(rep.world == P);
        CHECK(rep.rows == total);
        CHECK(rep.row_offset == begin[r]);
        const quant_layout l = want.layout();
        const std::size_t codes = rows[r] * l.row_bytes;
        using G = typename Recipe::granularity;
        const std::size_t scales = block_count(G::rows, rows[r]) * l.scale_cols * Recipe::scale_bytes;
        CHECK(rep.bytes_sent == (total == 0 ? 0 : static_cast<std::size_t>(P - 1) * (codes + scales)));
        CHECK(rep.float_bytes_sent == static_cast<std::size_t>(P - 1) * rows[r] * cols * 4);
        CHECK(rep.bf16_bytes_sent == rep.float_bytes_sent / 2);
        if (P > 1 && rows[r] > 0 && cols >= 64) CHECK(rep.bytes_sent < rep.bf16_bytes_sent);
    }
}

template <class Recipe>
void allgather_cases(std::uint64_t salt, bool with_bf16 = false) {
    auto g = octet_test::rng(salt);
    using G = typename Recipe::granularity;
    const std::size_t R = G::rows == full ? 1 : G::rows;
    for (int P = 1; P <= 4; ++P)
        for (int trial = 0; trial < 3; ++trial) {
            const std::size_t cols = trial == 0 ? 256 : 1 + g() % 300;
            const auto rows = row_counts(g, P, R);
            check_allgather<Recipe, float>(g, P, cols, rows);
            if (with_bf16) check_allgather<Recipe, bf16>(g, P, cols, rows);
            check_allgather<Recipe, float>(g, P, cols, rows, static_cast<int>(g() % P));
        }
    // Every rank empty; one rank holds everything.
    check_allgather<Recipe, float>(g, 3, 64, {0, 0, 0});
    check_allgather<Recipe, float>(g, 3, 64, {0, 0, 5});
}

// ---- the column-wise copy (out_t) ----

/// Gathers out and out_t (or out_t alone) and checks both against quantize() of the whole matrix
/// with its columnwise output, bytes sent included (codes and scales of both copies, counted here
/// from the layouts' rules).
template <class Recipe, class In>
void check_allgather_t(std::mt19937_64& g, int P, std::size_t cols, const std::vector<std::size_t>& rows,
                       bool with_rowwise, int nan_rank = -1) {
    using G = typename Recipe::granularity;
    using LO = quant_layout_of<Recipe>;
    std::size_t total = 0;
    std::vector<std::size_t> begin;
    for (std::size_t m : rows) begin.push_back(total), total += m;
    CAPTURE(P);
    CAPTURE(cols);
    CAPTURE(total);
    CAPTURE(nan_rank);
    CAPTURE(with_rowwise);
    std::vector<float> xf = octet_test::with_edge_cases(g, total * cols);
    if (nan_rank >= 0 && rows[nan_rank] > 0) xf[(begin[nan_rank] + g() % rows[nan_rank]) * cols + g() % cols] = NAN;
    std::vector<In> x(xf.size());
    for (std::size_t i = 0; i < xf.size(); ++i) {
        if constexpr (std::is_same_v<In, float>)
            x[i] = xf[i];
        else
            x[i] = to_bf16(xf[i]);
    }
    quantized_tensor<Recipe> want(total, cols), want_t(cols, total);
    quantize<Recipe>(on_host(), matrix_ref<const In>(x.data(), total, cols), want.ref(), want_t.ref());

    std::vector<std::unique_ptr<quantized_tensor<Recipe>>> got, got_t;
    std::vector<quantized_allgather_report> reps(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) {
        got.push_back(std::make_unique<quantized_tensor<Recipe>>(total, cols));
        got_t.push_back(std::make_unique<quantized_tensor<Recipe>>(cols, total));
        for (auto* q : {got[r].get(), got_t[r].get()}) {
            std::fill(q->data().begin(), q->data().end(), std::uint8_t{0xA5});
            std::fill(q->scales().begin(), q->scales().end(), std::uint8_t{0x5A});
        }
    }
    auto errors = run_ranks(P, [&](int r, in_process_transport& t) {
        const matrix_ref<const In> mine(x.data() + begin[r] * cols, rows[r], cols);
        reps[r] = quantized_allgather_host(t, on_host(1), mine, with_rowwise ? got[r]->ref() : quantized_ref<Recipe>{},
                                           got_t[r]->ref());
    });
    require_no_error(errors);
    for (int r = 0; r < P; ++r) {
        CAPTURE(r);
        if (with_rowwise) {
            CHECK(got[r]->data() == want.data());
            CHECK(got[r]->scales() == want.scales());
            if (Recipe::two_level && total > 0) CHECK(got[r]->tensor_scale() == want.tensor_scale());
        }
        CHECK(got_t[r]->data() == want_t.data());
        CHECK(got_t[r]->scales() == want_t.scales());
        if (Recipe::two_level && total > 0) CHECK(got_t[r]->tensor_scale() == want_t.tensor_scale());
        const quantized_allgather_report& rep = reps[r];
        CHECK(rep.rows == total);
        CHECK(rep.row_offset == begin[r]);
        const std::size_t m = rows[r];
        std::size_t mine = 0;
        if (with_rowwise)
            mine +=
                m * want.layout().row_bytes + block_count(G::rows, m) * want.layout().scale_cols * Recipe::scale_bytes;
        if (m > 0)  // x^T's rows of m codes (whole packing groups) and the blocks over them
            mine += cols * LO::bytes_for_codes((m + LO::group_codes - 1) / LO::group_codes * LO::group_codes) +
                    block_count(G::cols, m) * block_count(G::rows, cols) * Recipe::scale_bytes;
        CHECK(rep.bytes_sent == (total == 0 ? 0 : static_cast<std::size_t>(P - 1) * mine));
        if (P > 1 && m >= 64 && !with_rowwise) CHECK(rep.bytes_sent < rep.bf16_bytes_sent);  // x^T's blocks run along m
    }
}

/// Ragged row counts whose boundaries fall on multiples of C (but for the last rank's end).
template <class Recipe>
void allgather_t_cases(std::uint64_t salt, bool with_bf16 = false, bool with_nan = false) {
    auto g = octet_test::rng(salt);
    using G = typename Recipe::granularity;
    const std::size_t C = G::cols != full ? G::cols : quant_layout_of<Recipe>::group_codes;
    const std::size_t R = G::rows != full && G::rows > C ? G::rows : C;
    for (int P = 1; P <= 4; ++P)
        for (int trial = 0; trial < 3; ++trial) {
            const std::size_t cols = trial == 0 ? 256 : 1 + g() % 300;
            const auto rows = row_counts(g, P, R);
            check_allgather_t<Recipe, float>(g, P, cols, rows, true);
            check_allgather_t<Recipe, float>(g, P, cols, rows, false);
            if (with_bf16) check_allgather_t<Recipe, bf16>(g, P, cols, rows, true);
            if (with_nan) check_allgather_t<Recipe, float>(g, P, cols, rows, trial % 2 == 0, static_cast<int>(g() % P));
        }
    check_allgather_t<Recipe, float>(g, 3, 64, {0, 0, 0}, true);
    check_allgather_t<Recipe, float>(g, 3, 64, {0, 0, 5}, true);
    check_allgather_t<Recipe, float>(g, 3, 64, {0, 0, 5}, false);
}

// Per-tensor sub-byte recipes: x^T's codes pack 2 (FP4) or 4 (FP6) of the matrix's rows to a group.
using tensorwise_fp4 = recipe<e2m1, per_tensor, scale::amax_ratio<0>>;
using tensorwise_fp6 = recipe<e2m3, per_tensor, scale::amax_ratio<0>>;

}  // namespace

TEST_CASE("quantized all-gather: bit for bit quantize() of the whole matrix, every recipe family") {
    allgather_cases<recipes::tensorwise_e4m3>(8101, true);
    allgather_cases<recipes::rowwise_e4m3>(8102);
    allgather_cases<recipes::blockwise_1x128>(8103, true);
    allgather_cases<recipes::mxfp8_e4m3>(8104);
    allgather_cases<recipes::nvfp4>(8105, true);
    allgather_cases<recipes::blockwise_128x128>(8106);
}

TEST_CASE("quantized all-gather: misaligned 128x128 shards and mismatched descriptors stop every rank") {
    auto g = octet_test::rng(8111);
    using R = recipes::blockwise_128x128;
    const std::size_t cols = 160;
    // Rank 1 starts at row 100: not a multiple of 128.
    {
        const std::vector<std::size_t> rows = {100, 128, 40};
        std::vector<float> x = octet_test::with_edge_cases(g, 268 * cols);
        std::vector<std::unique_ptr<quantized_tensor<R>>> out;
        for (int r = 0; r < 3; ++r) out.push_back(std::make_unique<quantized_tensor<R>>(268, cols));
        const std::size_t begin[] = {0, 100, 228};
        auto errors = run_ranks(3, [&](int r, in_process_transport& t) {
            quantized_allgather_host(t, on_host(1), matrix_ref<const float>(x.data() + begin[r] * cols, rows[r], cols),
                                     out[r]->ref());
        });
        require_every_rank_throws(errors, "multiple of 128");
    }
    // Rank 2 has other cols; then another recipe; then out with other rows; then bad local arguments.
    for (int variant = 0; variant < 4; ++variant) {
        CAPTURE(variant);
        const int P = 3;
        std::vector<float> x = octet_test::with_edge_cases(g, 30 * 200);
        auto errors = run_ranks(P, [&](int r, in_process_transport& t) {
            using A = recipes::blockwise_1x128;
            using B = recipes::mxfp8_e4m3;
            const std::size_t c = variant == 0 && r == 2 ? 199 : 200;
            const std::size_t total = variant == 2 && r == 1 ? 31 : 30;
            const matrix_ref<const float> mine(x.data() + 10 * r * 200, 10, c);
            if (variant == 1 && r == 2) {
                quantized_tensor<B> q(total, c);
                quantized_allgather_host(t, on_host(1), mine, q.ref());
            } else if (variant == 3 && r == 0) {
                quantized_tensor<A> q(total, c + 1);  // out's cols differ from my_rows'
                quantized_allgather_host(t, on_host(1), mine, q.ref());
            } else {
                quantized_tensor<A> q(total, c);
                quantized_allgather_host(t, on_host(1), mine, q.ref());
            }
        });
        require_every_rank_throws(errors, nullptr);
    }
    // The world's row counts do not add up to out's rows (every rank passes the same wrong out).
    std::vector<float> x = octet_test::with_edge_cases(g, 30 * 64);
    auto errors = run_ranks(3, [&](int r, in_process_transport& t) {
        quantized_tensor<recipes::mxfp8_e4m3> q(31, 64);
        quantized_allgather_host(t, on_host(1), matrix_ref<const float>(x.data() + 10 * r * 64, 10, 64), q.ref());
    });
    require_every_rank_throws(errors, "rows");
}

TEST_CASE("quantized all-gather with out_t: both copies (or W^T's alone) bit for bit quantize()'s, one gather") {
    allgather_t_cases<recipes::tensorwise_e4m3>(8121, true, true);
    allgather_t_cases<tensorwise_fp4>(8122);
    allgather_t_cases<tensorwise_fp6>(8123);
    allgather_t_cases<recipes::blockwise_1x128>(8124);
    allgather_t_cases<recipes::mxfp8_e4m3>(8125);
    allgather_t_cases<recipes::mxfp6_e2m3>(8126);
    allgather_t_cases<recipes::nvfp4>(8127, true);
    allgather_t_cases<recipes::blockwise_128x128>(8128);
}

TEST_CASE("quantized all-gather with out_t: misaligned shards, mismatched copies and shapes stop every rank") {
    auto g = octet_test::rng(8131);
    using R = recipes::nvfp4;
    const std::size_t cols = 48;
    std::vector<float> x = octet_test::with_edge_cases(g, 64 * cols);
    auto mine = [&](std::size_t begin, std::size_t rows) {
        return matrix_ref<const float>(x.data() + begin * cols, rows, cols);
    };
    // Rank 1 starts at row 10: x^T's 1x16 blocks would straddle ranks 0 and 1. The row-wise copy
    // alone gathers these shards (row-local blocks).
    {
        const std::size_t rows[] = {10, 16, 5}, begin[] = {0, 10, 26};
        require_every_rank_throws(run_ranks(3,
                                            [&](int r, in_process_transport& t) {
                                                quantized_tensor<R> q(31, cols), qt(cols, 31);
                                                quantized_allgather_host(t, on_host(1), mine(begin[r], rows[r]),
                                                                         q.ref(), qt.ref());
                                            }),
                                  "multiple of 16");
        require_no_error(run_ranks(3, [&](int r, in_process_transport& t) {
            quantized_tensor<R> q(31, cols);
            quantized_allgather_host(t, on_host(1), mine(begin[r], rows[r]), q.ref());
        }));
    }
    // FP4 per tensor: rank 1 starts at an odd row (a byte of x^T's codes would hold two ranks' rows).
    require_every_rank_throws(run_ranks(2,
                                        [&](int r, in_process_transport& t) {
                                            quantized_tensor<tensorwise_fp4> q(8, cols), qt(cols, 8);
                                            quantized_allgather_host(t, on_host(1), mine(r ? 3 : 0, r ? 5 : 3), q.ref(),
                                                                     qt.ref());
                                        }),
                              "multiple of 2");
    // Rank 2 asks for the row-wise copy only; rank 0's out_t has the wrong shape; out and out_t both
    // absent on rank 1; out_t's columns are not out's rows on rank 2.
    for (int variant = 0; variant < 4; ++variant) {
        CAPTURE(variant);
        auto errors = run_ranks(3, [&](int r, in_process_transport& t) {
            quantized_tensor<R> q(48, cols), qt(cols, 48), wrong(cols + 1, 48), other(cols, 32);
            quantized_ref<R> out = q.ref(), out_t = qt.ref();
            if (variant == 0 && r == 2) out_t = {};
            if (variant == 1 && r == 0) out_t = wrong.ref();
            if (variant == 2 && r == 1) out = out_t = {};
            if (variant == 3 && r == 2) out_t = other.ref();
            quantized_allgather_host(t, on_host(1), mine(16 * r, 16), out, out_t);
        });
        if (variant == 0) {  // the descriptors disagree: every rank names it
            require_every_rank_throws(errors, "copies differ");
            continue;
        }
        // a rank's own bad argument: it names the argument, the others name the rank
        require_every_rank_throws(errors, nullptr);
        const int bad = variant - 1;
        const std::string own = text_of(errors[bad]);
        CAPTURE(own);
        CHECK(own.find(variant == 2 ? "'out and out_t' are both absent" : "out_t") != std::string::npos);
        for (int r = 0; r < 3; ++r)
            if (r != bad)
                CHECK(text_of(errors[r]).find("rank " + std::to_string(bad) + " failed validation") !=
                      std::string::npos);
    }
}

TEST_CASE("quantized all-gather with out_t: every temporary from the lent allocator, one block of the query") {
    auto g = octet_test::rng(8141);
    using R = recipes::nvfp4;
    for (const int P : {1, 2, 3}) {
        CAPTURE(P);
        const std::size_t cols = 96 + g() % 200;
        const auto rows = row_counts(g, P, 16);
        std::size_t total = 0;
        std::vector<std::size_t> begin;
        for (std::size_t m : rows) begin.push_back(total), total += m;
        std::vector<float> x = octet_test::with_edge_cases(g, total * cols);
        quantized_tensor<R> want(total, cols), want_t(cols, total);
        quantize<R>(on_host(), matrix_ref<const float>(x.data(), total, cols), want.ref(), want_t.ref());
        std::vector<std::unique_ptr<quantized_tensor<R>>> got, got_t;
        std::vector<octet_test::lent_allocator> lent(static_cast<std::size_t>(P));
        std::vector<std::size_t> need(P);
        for (int r = 0; r < P; ++r) {
            got.push_back(std::make_unique<quantized_tensor<R>>(total, cols));
            got_t.push_back(std::make_unique<quantized_tensor<R>>(cols, total));
            need[r] = quantized_allgather_scratch_bytes(
                with_allocator(on_host(1), lent[r].ref()),
                matrix_ref<const float>(x.data() + begin[r] * cols, rows[r], cols), got[r]->ref(), got_t[r]->ref(), P);
        }
        long global = -1;
        require_no_error(run_ranks(
            P,
            [&](int r, in_process_transport& t) {
                quantized_allgather_host(t, with_allocator(on_host(1), lent[r].ref()),
                                         matrix_ref<const float>(x.data() + begin[r] * cols, rows[r], cols),
                                         got[r]->ref(), got_t[r]->ref());
            },
            &global));
        CHECK(global == 0);
        for (int r = 0; r < P; ++r) {
            CAPTURE(r);
            CHECK(lent[r].balanced());
            CHECK(lent[r].allocations == 1);
            CHECK(lent[r].peak == need[r]);
            CHECK(got[r]->data() == want.data());
            CHECK(got_t[r]->data() == want_t.data());
            CHECK(got_t[r]->scales() == want_t.scales());
        }
    }
}

// ---- the compressed reduce-scatter ------------------------------------------------------------

namespace {

struct rs_variant {
    wire_format format;
    transform_kind transform;
    std::uint32_t block;
    bool stochastic;
};

const rs_variant rs_variants[] = {
    {wire_format::e4m3, transform_kind::hadamard, 1024, false},
    {wire_format::nvfp4, transform_kind::hadamard, 256, true},
    {wire_format::mxfp8, transform_kind::identity, 1024, false},
    {wire_format::e5m2, transform_kind::identity, 1024, true},
};

codec_config config_of(const rs_variant& v, std::uint64_t seed) {
    codec_config cfg;
    cfg.format = v.format;
    cfg.transform = v.transform;
    cfg.block = v.block;
    cfg.stochastic = v.stochastic;
    cfg.seed = seed;
    return cfg;
}

/// Runs the reduce-scatter on every rank; out[r] gets rank r's shard.
std::vector<std::exception_ptr> reduce_scatter(const codec_config& cfg, const std::vector<std::vector<float>>& grads,
                                               std::vector<std::vector<float>>& out,
                                               std::vector<error_feedback>* fb = nullptr,
                                               std::vector<reduce_scatter_report>* reps = nullptr) {
    const int P = static_cast<int>(grads.size());
    const std::size_t n = grads[0].size();
    out.assign(static_cast<std::size_t>(P), {});
    for (int r = 0; r < P; ++r) out[r].assign(allreduce_shard(cfg, n, P, r).count, std::nanf(""));
    if (reps) reps->assign(static_cast<std::size_t>(P), {});
    return run_ranks(P, [&](int r, in_process_transport& t) {
        reduce_scatter_options o;
        o.expected_ranks = P;
        o.executor = on_host(1);
        if (fb) o.feedback = (*fb)[r].view();
        const auto rep = compressed_reduce_scatter_host(t, cfg, as_cspan(grads[r]), as_span(out[r]), o);
        if (reps) (*reps)[r] = rep;
    });
}

std::vector<float> concat(const std::vector<std::vector<float>>& parts) {
    std::vector<float> v;
    for (const auto& p : parts) v.insert(v.end(), p.begin(), p.end());
    return v;
}

}  // namespace

TEST_CASE("compressed reduce-scatter: within reduce_scatter_error_bound of the float64 sum, the same bits twice") {
    auto g = octet_test::rng(8201);
    for (int P = 1; P <= 4; ++P)
        for (const rs_variant& v : rs_variants) {
            const codec_config cfg = config_of(v, g());
            const std::size_t G = allreduce_granule(cfg);
            const std::size_t sizes[] = {0, 1 + g() % (G - 1), G * static_cast<std::size_t>(P) - 1 - g() % 7,
                                         G + g() % (9 * G)};
            for (const std::size_t n : sizes)
                for (const float scale : {1.0f, 1e-6f, 1e30f, 0.0f}) {
                    CAPTURE(P);
                    CAPTURE(wire_format_name(v.format));
                    CAPTURE(transform_name(v.transform));
                    CAPTURE(n);
                    CAPTURE(scale);
                    std::vector<std::vector<float>> grads;
                    for (int r = 0; r < P; ++r) {
                        grads.push_back(octet_test::with_edge_cases(g, n));
                        for (float& x : grads.back()) x *= scale;
                    }
                    std::vector<std::vector<float>> out, again;
                    std::vector<reduce_scatter_report> reps;
                    require_no_error(reduce_scatter(cfg, grads, out, nullptr, &reps));
                    require_no_error(reduce_scatter(cfg, grads, again));
                    const std::vector<float> got = concat(out);
                    REQUIRE(got.size() == n);
                    CHECK(same_bits(got, concat(again)));
                    double sum_of_norms = 0, norm_of_sum = 0, err = 0;
                    for (int r = 0; r < P; ++r) {
                        double s = 0;
                        for (float x : grads[r]) s += double(x) * x;
                        sum_of_norms += std::sqrt(s);
                    }
                    for (std::size_t i = 0; i < n; ++i) {
                        double exact = 0;
                        for (int r = 0; r < P; ++r) exact += grads[r][i];
                        norm_of_sum += exact * exact;
                        err += (got[i] - exact) * (got[i] - exact);
                    }
                    norm_of_sum = std::sqrt(norm_of_sum);
                    const double bound = reduce_scatter_error_bound(cfg, n, P, sum_of_norms, norm_of_sum);
                    CAPTURE(bound);
                    CHECK(std::isfinite(std::sqrt(err)));
                    CHECK(std::sqrt(err) <= bound);
                    if (scale == 0.0f)
                        for (float x : got) CHECK(x == 0.0f);
                    std::size_t encoded = 0;
                    for (int r = 0; r < P; ++r) encoded += encoded_size(cfg, allreduce_shard(cfg, n, P, r).count);
                    for (int r = 0; r < P; ++r) {
                        const shard_range s = allreduce_shard(cfg, n, P, r);
                        CHECK(reps[r].shard.begin == s.begin);
                        CHECK(reps[r].shard.count == s.count);
                        CHECK(reps[r].bytes_sent == encoded - encoded_size(cfg, s.count));
                        CHECK(reps[r].float_bytes == 4 * (n - s.count));
                    }
                }
        }
}

TEST_CASE("compressed reduce-scatter, identity transform: the rank-ordered float sum of the decoded messages") {
    auto g = octet_test::rng(8202);
    for (const int P : {2, 3, 4}) {
        const codec_config cfg = config_of(rs_variants[2], g());
        const std::size_t n = 3000 + g() % 5000;
        std::vector<std::vector<float>> grads;
        for (int r = 0; r < P; ++r) grads.push_back(octet_test::with_edge_cases(g, n));
        std::vector<std::vector<float>> out;
        require_no_error(reduce_scatter(cfg, grads, out));
        for (int s = 0; s < P; ++s) {
            const shard_range sh = allreduce_shard(cfg, n, P, s);
            std::vector<float> want(sh.count, 0.0f), dec(sh.count);
            for (int r = 0; r < P; ++r) {
                std::vector<std::uint8_t> msg(encoded_size(cfg, sh.count));
                encode_options eo;
                eo.first_index = sh.begin;
                eo.random_stream = 1 + static_cast<std::uint64_t>(r);
                encode_gradient(on_host(), cfg, span<const float>(grads[r].data() + sh.begin, sh.count), as_span(msg),
                                eo);
                decode_gradient(on_host(), as_cspan(msg), as_span(dec));
                for (std::size_t i = 0; i < sh.count; ++i) want[i] = r == 0 ? dec[i] : want[i] + dec[i];
            }
            CAPTURE(P);
            CAPTURE(s);
            CHECK(same_bits(want, out[s]));
        }
    }
}

TEST_CASE("compressed reduce-scatter: error feedback telescopes over steps") {
    auto g = octet_test::rng(8203);
    for (const int P : {1, 2, 3, 4})
        for (const rs_variant& v : {rs_variants[0], rs_variants[2]}) {
            const codec_config cfg = config_of(v, g());
            const std::size_t n = 2000 + g() % 6000;
            CAPTURE(P);
            CAPTURE(transform_name(v.transform));
            CAPTURE(n);
            std::vector<error_feedback> fb;
            for (int r = 0; r < P; ++r) fb.emplace_back(n, residual_storage::f32);
            std::vector<double> exact(n, 0.0), outputs(n, 0.0);
            double scale_of = 0;
            for (int step = 0; step < 5; ++step) {
                std::vector<std::vector<float>> grads;
                for (int r = 0; r < P; ++r) grads.push_back(octet_test::with_edge_cases(g, n, 0.01f));
                for (int r = 0; r < P; ++r)
                    for (std::size_t i = 0; i < n; ++i) {
                        exact[i] += grads[r][i];
                        scale_of = std::max(scale_of, double(std::fabs(grads[r][i])));
                    }
                std::vector<std::vector<float>> out;
                require_no_error(reduce_scatter(cfg, grads, out, &fb));
                const std::vector<float> got = concat(out);
                for (std::size_t i = 0; i < n; ++i) outputs[i] += got[i];
            }
            // sum of the outputs + what every sender's residual holds = the exact sum.
            std::vector<double> held = outputs;
            for (int r = 0; r < P; ++r) {
                const std::vector<float> e = fb[r].values();
                for (std::size_t i = 0; i < n; ++i) held[i] += e[i];
            }
            double worst = 0, err_without = 0;
            for (std::size_t i = 0; i < n; ++i) {
                worst = std::max(worst, std::fabs(held[i] - exact[i]));
                err_without = std::max(err_without, std::fabs(outputs[i] - exact[i]));
            }
            // float rounding of sums of values up to scale_of (outliers 1000x), a few per step
            CHECK(worst <= 5 * 8 * P * 0x1p-22 * scale_of);
            CHECK(worst < err_without);  // the residuals hold what the outputs lack
        }
}

TEST_CASE("compressed reduce-scatter: mismatched descriptors and a corrupted message stop every rank") {
    auto g = octet_test::rng(8204);
    const int P = 3;
    const codec_config cfg = config_of(rs_variants[0], g());
    const std::size_t n = 5000;
    std::vector<std::vector<float>> grads;
    for (int r = 0; r < P; ++r) grads.push_back(octet_test::with_edge_cases(g, n));
    for (int variant = 0; variant < 4; ++variant) {
        CAPTURE(variant);
        std::vector<std::vector<float>> out(P);
        auto errors = run_ranks(P, [&](int r, in_process_transport& t) {
            codec_config c = cfg;
            std::size_t m = n;
            if (variant == 0 && r == 1) c.seed += 1;                   // another config
            if (variant == 1 && r == 2) m = n - 1;                     // another size
            if (variant == 2 && r == 0) c.format = wire_format::e5m2;  // another format
            out[r].assign(allreduce_shard(c, m, P, r).count + (variant == 3 && r == 1 ? 1 : 0), 0.0f);
            reduce_scatter_options o;
            o.executor = on_host(1);
            compressed_reduce_scatter_host(t, c, span<const float>(grads[r].data(), m), as_span(out[r]), o);
        });
        require_every_rank_throws(errors, nullptr);
    }
    // A flipped payload bit in rank 2's message to rank 1.
    std::vector<std::vector<float>> out(P);
    auto errors = run_ranks(P, [&](int r, in_process_transport& t) {
        out[r].assign(allreduce_shard(cfg, n, P, r).count, 0.0f);
        reduce_scatter_options o;
        o.executor = on_host(1);
        if (r == 2)
            o.tamper = [](int to, span<std::uint8_t> m) {
                if (to == 1) m[m.size() - 1] ^= 0x10;
            };
        compressed_reduce_scatter_host(t, cfg, as_cspan(grads[r]), as_span(out[r]), o);
    });
    require_every_rank_throws(errors, nullptr);
}

TEST_CASE("sharded collectives: every temporary from the lent allocator, one block of exactly the query") {
    auto g = octet_test::rng(8301);
    for (const int P : {1, 2, 3}) {
        CAPTURE(P);
        // The reduce-scatter, with and without feedback.
        for (const rs_variant& v : rs_variants)
            for (const bool with_fb : {false, true}) {
                const codec_config cfg = config_of(v, g());
                const std::size_t n = 1 + g() % 40000;
                CAPTURE(wire_format_name(v.format));
                CAPTURE(n);
                CAPTURE(with_fb);
                std::vector<std::vector<float>> grads;
                for (int r = 0; r < P; ++r) grads.push_back(octet_test::with_edge_cases(g, n));
                std::vector<std::vector<float>> want(P), got(P);
                std::vector<error_feedback> fb_want, fb_got;
                for (int r = 0; r < P; ++r) {
                    fb_want.emplace_back(n, residual_storage::bf16);
                    fb_got.emplace_back(n, residual_storage::bf16);
                    want[r].assign(allreduce_shard(cfg, n, P, r).count, 0.0f);
                    got[r].assign(want[r].size(), 0.0f);
                }
                std::vector<octet_test::lent_allocator> lent(static_cast<std::size_t>(P));
                std::vector<reduce_scatter_options> def(P), lend(P);
                std::vector<std::size_t> need(P);
                for (int r = 0; r < P; ++r) {
                    def[r].executor = on_host(1);
                    lend[r].executor = with_allocator(on_host(1), lent[r].ref());
                    if (with_fb) def[r].feedback = fb_want[r].view(), lend[r].feedback = fb_got[r].view();
                    need[r] = compressed_reduce_scatter_scratch_bytes(lend[r].executor, cfg, n, P, r, lend[r]);
                }
                long global = -1;
                require_no_error(run_ranks(
                    P,
                    [&](int r, in_process_transport& t) {
                        compressed_reduce_scatter_host(t, cfg, as_cspan(grads[r]), as_span(want[r]), def[r]);
                    },
                    &global));
                CHECK(global == P);
                global = -1;
                require_no_error(run_ranks(
                    P,
                    [&](int r, in_process_transport& t) {
                        compressed_reduce_scatter_host(t, cfg, as_cspan(grads[r]), as_span(got[r]), lend[r]);
                    },
                    &global));
                CHECK(global == 0);
                for (int r = 0; r < P; ++r) {
                    CAPTURE(r);
                    CHECK(lent[r].balanced());
                    CHECK(lent[r].allocations == 1);
                    CHECK(lent[r].peak == need[r]);
                    CHECK(same_bits(want[r], got[r]));
                    CHECK(fb_want[r].values() == fb_got[r].values());
                }
            }
        // The all-gather (NVFP4: the quantizer's own scratch and the tensor scale).
        using R = recipes::nvfp4;
        const std::size_t cols = 96 + g() % 200;
        const auto rows = row_counts(g, P, 1);
        std::size_t total = 0;
        std::vector<std::size_t> begin;
        for (std::size_t m : rows) begin.push_back(total), total += m;
        std::vector<float> x = octet_test::with_edge_cases(g, total * cols);
        std::vector<std::unique_ptr<quantized_tensor<R>>> want, got;
        std::vector<octet_test::lent_allocator> lent(static_cast<std::size_t>(P));
        std::vector<std::size_t> need(P);
        for (int r = 0; r < P; ++r) {
            want.push_back(std::make_unique<quantized_tensor<R>>(total, cols));
            got.push_back(std::make_unique<quantized_tensor<R>>(total, cols));
            need[r] = quantized_allgather_scratch_bytes(
                with_allocator(on_host(1), lent[r].ref()),
                matrix_ref<const float>(x.data() + begin[r] * cols, rows[r], cols), got[r]->ref(), P);
        }
        long global = -1;
        require_no_error(run_ranks(
            P,
            [&](int r, in_process_transport& t) {
                quantized_allgather_host(
                    t, on_host(1), matrix_ref<const float>(x.data() + begin[r] * cols, rows[r], cols), want[r]->ref());
            },
            &global));
        CHECK(global == P);
        global = -1;
        require_no_error(run_ranks(
            P,
            [&](int r, in_process_transport& t) {
                quantized_allgather_host(t, with_allocator(on_host(1), lent[r].ref()),
                                         matrix_ref<const float>(x.data() + begin[r] * cols, rows[r], cols),
                                         got[r]->ref());
            },
            &global));
        CHECK(global == 0);
        for (int r = 0; r < P; ++r) {
            CAPTURE(r);
            CHECK(lent[r].balanced());
            CHECK(lent[r].allocations == 1);
            CHECK(lent[r].peak == need[r]);
            CHECK(got[r]->data() == want[r]->data());
            CHECK(got[r]->scales() == want[r]->scales());
        }
    }
}
