// octet-test: timeout=240
// The expert-parallel token exchange of octet/nn/moe_exchange.hpp over the in-process transport
// (support/in_process_world.hpp: one thread per rank), P = 1, 2, 3, 4 ranks, E = 12 experts:
//   * dispatch: every rank's received copy (outputs poisoned first) is, group by group, bit for bit
//     the groups permute_quantized gives its experts on one process for every rank's tokens stacked
//     in rank order (codes, scales, padding), ragged token counts (a rank with 0 tokens), experts no
//     token selects (a rank that receives nothing), for 1x128, MXFP8 and per-row E4M3 rows;
//     source_of names each row's rank and plan row;
//   * combine: after each rank's experts run the grouped GEMM on what they received, every rank's
//     tokens' outputs are bit for bit the one-process layer's (bf16 wire, the E4M3 1x128 wire against
//     quantize + dequantize of the outputs, the f32 wire), with 1 and 2 threads per rank; with a
//     capacity (dropped assignments, applied per source rank) bit for bit each rank's tokens alone
//     through all E experts;
//   * backward: combine_backward on the rows the combine kept (options.returned), dY's rows to the
//     owners (moe_dispatch_rows_host), the experts' data-gradient GEMM, dX back with weights of 1:
//     dweights, each owner's dY copy and dX bit for bit the same functions on one process;
//   * the reports: rows and bytes to and from other ranks, against the plan's counts and the row
//     formulas; the bytes on the wire of a DeepSeek-V3-sized row (d = 7168) FP8 against bf16;
//   * bad input on one rank (an expert index out of range, a record for another world, another
//     expert count, plan counts that do not sum, a record the senders do not match, another wire,
//     another expected rank count, weights or options.returned of the wrong shape) makes EVERY rank
//     throw octet::error (a watchdog fails the test instead of hanging);
//   * with a lent counting allocator: zero global allocations around the whole multi-rank plan,
//     dispatch and four combines (bf16, E4M3, E4M3 into options.returned, f32), one lent block per
//     call, the peak exactly the largest query.
#include "support/counting_allocator.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "octet/comm/in_process.hpp"
#include "octet/nn/moe_exchange.hpp"
#include "support/counted_ranks.hpp"
#include "support/in_process_world.hpp"
#include "support/moe_exchange_case.hpp"
#include "support/random.hpp"

namespace {
using namespace octet;
using octet_test::in_process_transport;
using octet_test::in_process_world;
using octet_test::is_octet_error;
using octet_test::moe_exchange_case;
using octet_test::moe_one_process;
using octet_test::moe_rank_run;
using octet_test::text_of;
using XR = octet_test::moe_x_recipe;

using octet_test::run_ranks;

void require_no_error(const std::vector<std::exception_ptr>& errors) {
    for (std::size_t r = 0; r < errors.size(); ++r) REQUIRE_MESSAGE(!errors[r], "rank ", r, ": ", text_of(errors[r]));
}

/// Every rank threw octet::error; `culprit`'s message holds `own`, every other's holds `others`.
void require_every_rank_throws(const std::vector<std::exception_ptr>& errors, int culprit, const char* own,
                               const char* others) {
    for (std::size_t r = 0; r < errors.size(); ++r) {
        CAPTURE(r);
        REQUIRE(is_octet_error(errors[r]));
        const std::string m = text_of(errors[r]);
        CAPTURE(m);
        CHECK(m.find(static_cast<int>(r) == culprit ? own : others) != std::string::npos);
    }
}

bool same_floats(const std::vector<float>& a, const float* b, std::size_t n) {
    return a.size() == n && (n == 0 || std::memcmp(a.data(), b, n * sizeof(float)) == 0);
}

template <class B1, class B2>
bool same_group(quantized_ref<XR, B1> a, quantized_ref<XR, B2> b) {
    const quant_layout &la = a.layout, &lb = b.layout;
    if (la.rows != lb.rows || la.data_bytes != lb.data_bytes || la.scale_bytes != lb.scale_bytes) return false;
    if (la.rows == 0) return true;
    return std::memcmp(a.data, b.data, la.data_bytes) == 0 && std::memcmp(a.scales, b.scales, la.scale_bytes) == 0;
}

/// Row j of group g of a grouped copy against row i of group h of another: codes and scales.
bool same_row(grouped_quantized_cref<XR> a, std::size_t g, std::size_t j, grouped_quantized_cref<XR> b, std::size_t h,
              std::size_t i, std::size_t d) {
    const quantized_cref<XR> qa = a.group(g), qb = b.group(h);
    if (std::memcmp(qa.data + j * qa.layout.row_bytes, qb.data + i * qb.layout.row_bytes, d) != 0) return false;
    for (std::size_t bj = 0; bj < qa.layout.scale_cols; ++bj)
        if (std::memcmp(qa.scales + (bj * qa.layout.scale_ld + j) * 4, qb.scales + (bj * qb.layout.scale_ld + i) * 4,
                        4) != 0)
            return false;
    return true;
}

/// Runs the pipeline on every rank of c and returns each rank's run.
std::vector<moe_rank_run> run_world(const moe_exchange_case& c, const moe_exchange_options& opt,
                                    const dispatch_options& dopt = {}) {
    std::vector<moe_rank_run> runs(static_cast<std::size_t>(c.P));
    require_no_error(run_ranks(c.P, [&](int r, in_process_transport& t) {
        moe_exchange_options o = opt;
        octet_test::run_moe_rank(t, c, runs[r], o, dopt);
    }));
    return runs;
}

/// The checks every run shares: each received row is the row its source sent (source_of, against the
/// source's plan and quantized copy), and the reports' rows and bytes match the plans.
void check_rows_and_reports(const moe_exchange_case& c, std::vector<moe_rank_run>& runs, moe_combine_wire wire) {
    const std::size_t P = static_cast<std::size_t>(c.P), L = c.E / P;
    const std::size_t drow = moe_dispatch_row_bytes<XR>(c.d), crow = moe_combine_row_bytes(c.N, wire);
    CHECK(drow == c.d + 4 * ((c.d + 127) / 128));
    for (std::size_t r = 0; r < P; ++r) {
        CAPTURE(r);
        moe_exchange_ref xch = runs[r].xch.ref();
        CHECK(xch.local_experts() == L);
        CHECK(xch.first_expert() == r * L);
        // every received row: its source's row, from its source's quantized copy
        for (std::size_t i = 0, e = 0, j = 0; i < xch.rows(); ++i, ++j) {
            while (j == xch.expert_rows[e]) ++e, j = 0;
            const moe_row_source src = xch.source_of(i);
            CHECK(src.expert == r * L + e);
            dispatch_plan_ref sp = runs[static_cast<std::size_t>(src.rank)].plan.ref();
            REQUIRE(src.index < sp.group_sizes[src.expert]);
            const std::size_t t = sp.token_of_row(sp.group_offsets[src.expert] + src.index);
            const quantized_cref<XR> xq = runs[static_cast<std::size_t>(src.rank)].xq.cref();
            const quantized_cref<XR> got = runs[r].xe.cref().group(e);
            CHECK(std::memcmp(got.data + j * got.layout.row_bytes, xq.data + t * xq.layout.row_bytes, c.d) == 0);
        }
        // the reports: the rows of other ranks' experts (plan), the rows from other ranks (record)
        dispatch_plan_ref plan = runs[r].plan.ref();
        std::size_t sent = 0, received = 0;
        for (std::size_t e = 0; e < c.E; ++e)
            if (e / L != r) sent += plan.group_sizes[e];
        for (std::size_t q = 0; q < P; ++q)
            for (std::size_t e = 0; e < L; ++e)
                if (q != r) received += xch.recv_counts[q * L + e];
        const moe_exchange_report &dr = runs[r].dispatch_report, &cr = runs[r].combine_report;
        CHECK(dr.rows_sent == sent);
        CHECK(dr.rows_received == received);
        CHECK(dr.bytes_sent == sent * drow);
        CHECK(dr.bytes_received == received * drow);
        CHECK(dr.bf16_bytes_sent == sent * c.d * 2);
        CHECK(dr.agreement_bytes == 64 + 16 * c.E);
        CHECK(runs[r].plan_report.agreement_bytes == 64 + 8 * c.E);
        CHECK(runs[r].plan_report.dispatch.rows == plan.rows());
        CHECK(cr.rows_sent == received);
        CHECK(cr.rows_received == sent);
        CHECK(cr.bytes_sent == received * crow);
        CHECK(cr.bytes_received == sent * crow);
        CHECK(cr.world == c.P);
    }
}

/// Dispatch and combine on P ranks against the one-process layer over every rank's tokens.
void check_against_one_process(std::uint64_t salt, const std::vector<std::size_t>& tokens,
                               const std::vector<std::size_t>& masked, moe_combine_wire wire, unsigned threads) {
    const std::size_t E = 12, k = 3, d = 200, N = 136;
    const moe_exchange_case c(salt, E, k, d, N, tokens, masked);
    INFO("P=" << c.P << " wire=" << static_cast<int>(wire) << " threads=" << threads
              << " seed=" << octet_test::run_seed());
    moe_exchange_options opt;
    opt.executor = on_host(threads);
    opt.combine_wire = wire;
    opt.expected_ranks = c.P;
    auto runs = run_world(c, opt);
    moe_one_process one(c, matrix_ref<const float>(c.x.data(), c.T, d),
                        matrix_ref<const std::int32_t>(c.idx.data(), c.T, k),
                        matrix_ref<const float>(c.w.data(), c.T, k), wire);
    const std::size_t L = E / static_cast<std::size_t>(c.P);
    for (int r = 0; r < c.P; ++r) {
        CAPTURE(r);
        for (std::size_t e = 0; e < L; ++e) {
            CAPTURE(e);
            CHECK(runs[r].xch.ref().expert_rows[e] == one.plan.ref().group_sizes[r * L + e]);
            CHECK(same_group(runs[r].xe.cref().group(e), one.xs.cref().group(r * L + e)));
        }
        CHECK(same_floats(runs[r].out, one.out.data() + c.begin[r] * N, c.tokens[r] * N));
    }
    check_rows_and_reports(c, runs, wire);
    for (std::size_t e : masked) CHECK(one.plan.ref().group_sizes[e] == 0);
    if (wire != moe_combine_wire::bf16) return;
    // bf16 expert outputs and a bf16 output: the same sums, rounded once more at the end
    std::vector<std::vector<bf16>> out16(static_cast<std::size_t>(c.P));
    require_no_error(run_ranks(c.P, [&](int r, in_process_transport& t) {
        moe_rank_run& run = runs[r];
        const std::size_t M = run.xch.ref().rows(), Tr = c.tokens[r];
        std::vector<bf16> y16(M * N);
        for (std::size_t i = 0; i < y16.size(); ++i) y16[i] = to_bf16(run.y[i]);
        out16[r].assign(Tr * N, bf16{0xFFFF});
        moe_combine_host(t, matrix_ref<const bf16>(y16.data(), M, N), c.w_of(r), run.plan.ref(), run.xch.ref(),
                         matrix_ref<bf16>(out16[r].data(), Tr, N), opt);
    }));
    for (int r = 0; r < c.P; ++r)
        for (std::size_t i = 0; i < c.tokens[r] * N; ++i)
            if (out16[r][i].bits != to_bf16(one.out[c.begin[r] * N + i]).bits) {
                FAIL_CHECK("rank " << r << " element " << i << ": bf16 output differs");
                break;
            }
}

}  // namespace

TEST_CASE("moe exchange: dispatch and combine on 1-4 ranks give the one-process layer bit for bit") {
    for (const moe_combine_wire wire : {moe_combine_wire::bf16, moe_combine_wire::e4m3_1x128, moe_combine_wire::f32}) {
        check_against_one_process(7101, {41}, {}, wire, 1);
        check_against_one_process(7102, {41, 0}, {6, 7, 8}, wire, 2);
        check_against_one_process(7103, {23, 37, 1}, {6, 7}, wire, 1);
        // rank 1 has no tokens; rank 2 owns experts 6, 7, 8, which no token selects: it receives nothing
        check_against_one_process(7104, {30, 0, 45, 9}, {6, 7, 8}, wire, 2);
    }
}

namespace {
/// Dispatch alone for another row-local recipe: every rank's received groups are the one-process
/// permute_quantized's groups of its experts, bit for bit.
template <class Rx>
void check_dispatch_recipe(std::uint64_t salt, std::size_t d) {
    INFO(recipe_description<Rx>() << " seed=" << octet_test::run_seed());
    const moe_exchange_case c(salt, 12, 2, d, 8, {19, 0, 33, 7}, {4});
    const int P = c.P;
    const std::size_t L = c.E / static_cast<std::size_t>(P);
    quantized_tensor<Rx> all(c.T, d);
    quantize<Rx>(on_host(), matrix_ref<const float>(c.x.data(), c.T, d), all.ref());
    dispatch_plan plan(c.T, c.k, c.E);
    plan_dispatch(matrix_ref<const std::int32_t>(c.idx.data(), c.T, c.k), {}, plan.ref());
    grouped_quantized_tensor<Rx> one(grouped_rows(plan.ref().group_sizes, d));
    permute_quantized(on_host(), all.cref(), plan.ref(), one.ref());
    std::vector<quantized_tensor<Rx>> xq(P);
    std::vector<dispatch_plan> plans(P);
    std::vector<moe_exchange> xch(P);
    std::vector<grouped_quantized_tensor<Rx>> got(P);
    std::vector<moe_exchange_report> rep(P);
    require_no_error(run_ranks(P, [&](int r, in_process_transport& t) {
        xq[r] = quantized_tensor<Rx>(c.tokens[r], d);
        if (c.tokens[r]) quantize<Rx>(on_host(), c.x_of(r), xq[r].ref());
        plans[r] = dispatch_plan(c.tokens[r], c.k, c.E);
        xch[r] = moe_exchange(P, r, c.E);
        moe_dispatch_plan_host(t, c.idx_of(r), {}, plans[r].ref(), xch[r].ref());
        got[r] = grouped_quantized_tensor<Rx>(grouped_rows(xch[r].ref().expert_rows, d));
        auto ref = got[r].ref();
        if (got[r].layout().data_bytes) std::memset(ref.data, 0xAB, got[r].layout().data_bytes);
        if (got[r].layout().scale_bytes) std::memset(ref.scales, 0xCD, got[r].layout().scale_bytes);
        rep[r] = moe_dispatch_host(t, xq[r].cref(), plans[r].ref(), xch[r].ref(), got[r].ref());
    }));
    for (int r = 0; r < P; ++r)
        for (std::size_t e = 0; e < L; ++e) {
            CAPTURE(r);
            CAPTURE(e);
            const quantized_cref<Rx> a = got[r].cref().group(e), b = one.cref().group(r * L + e);
            REQUIRE(a.layout.rows == b.layout.rows);
            REQUIRE(a.layout.data_bytes == b.layout.data_bytes);
            REQUIRE(a.layout.scale_bytes == b.layout.scale_bytes);
            if (a.layout.rows == 0) continue;
            CHECK(std::memcmp(a.data, b.data, a.layout.data_bytes) == 0);
            CHECK(std::memcmp(a.scales, b.scales, a.layout.scale_bytes) == 0);
        }
    std::size_t sent = 0;
    for (int r = 0; r < P; ++r) {
        sent += rep[r].rows_sent;
        CHECK(rep[r].bytes_sent == rep[r].rows_sent * moe_dispatch_row_bytes<Rx>(d));
    }
    CHECK(sent > 0);
}
}  // namespace

TEST_CASE("moe exchange: dispatch of MXFP8 and per-row E4M3 rows, bit for bit permute_quantized's groups") {
    check_dispatch_recipe<recipes::mxfp8_e4m3>(7151, 200);
    CHECK(moe_dispatch_row_bytes<recipes::mxfp8_e4m3>(7168) == 7168 + 224);
    check_dispatch_recipe<recipes::rowwise_e4m3>(7152, 72);
    CHECK(moe_dispatch_row_bytes<recipes::rowwise_e4m3>(72) == 72 + 4);
}

TEST_CASE("moe exchange: with a capacity, each rank's tokens alone through all experts, bit for bit") {
    const std::size_t E = 12, k = 3, d = 160, N = 64;
    for (const moe_combine_wire wire : {moe_combine_wire::bf16, moe_combine_wire::e4m3_1x128}) {
        const moe_exchange_case c(7201, E, k, d, N, {40, 17, 0, 33});
        INFO("wire=" << static_cast<int>(wire) << " seed=" << octet_test::run_seed());
        dispatch_options dopt;
        dopt.capacity = 4;  // per source rank and expert: some assignments dropped on every rank with tokens
        moe_exchange_options opt;
        opt.combine_wire = wire;
        auto runs = run_world(c, opt, dopt);
        std::size_t dropped = 0;
        std::vector<std::unique_ptr<moe_one_process>> alone_of;
        for (int r = 0; r < c.P; ++r)
            alone_of.push_back(std::make_unique<moe_one_process>(c, c.x_of(r), c.idx_of(r), c.w_of(r), wire, dopt));
        for (int r = 0; r < c.P; ++r) {
            CAPTURE(r);
            moe_one_process& alone = *alone_of[r];
            CHECK(runs[r].plan_report.dispatch.dropped == c.tokens[r] * k - alone.plan.ref().rows());
            dropped += runs[r].plan_report.dispatch.dropped;
            CHECK(same_floats(runs[r].out, alone.out.data(), c.tokens[r] * N));
            // each received row is, codes and scales, the row of its source's own permuted copy
            moe_exchange_ref xch = runs[r].xch.ref();
            for (std::size_t i = 0, e = 0, j = 0; i < xch.rows(); ++i, ++j) {
                while (j == xch.expert_rows[e]) ++e, j = 0;
                const moe_row_source src = xch.source_of(i);
                CHECK(same_row(runs[r].xe.cref(), e, j, alone_of[src.rank]->xs.cref(), src.expert, src.index, d));
            }
        }
        CHECK(dropped > 0);
        check_rows_and_reports(c, runs, wire);
    }
}

TEST_CASE("moe exchange: bytes on the wire, FP8 dispatch against bf16 (DeepSeek-V3 row, d = 7168)") {
    // 4 ranks, 32 experts (8 each), top-8, 64 tokens per rank; the experts' outputs stand in for a GEMM.
    const std::size_t E = 32, k = 8, d = 7168, T = 64;
    const int P = 4;
    auto g = octet_test::rng(7301);
    std::vector<std::vector<float>> x(P), w(P), y(P), out_bf16(P), out_fp8(P);
    std::vector<std::vector<std::int32_t>> idx(P);
    std::vector<quantized_tensor<XR>> xq(P);
    std::vector<dispatch_plan> plan(P);
    std::vector<moe_exchange> xch(P);
    std::vector<grouped_quantized_tensor<XR>> xe(P);
    std::vector<moe_exchange_report> disp(P), comb_bf16(P), comb_fp8(P);
    for (int r = 0; r < P; ++r) {
        x[r] = octet_test::with_edge_cases(g, T * d);
        xq[r] = quantized_tensor<XR>(T, d);
        quantize<XR>(on_host(), matrix_ref<const float>(x[r].data(), T, d), xq[r].ref());
        idx[r].resize(T * k);
        w[r].assign(T * k, 1.0f / k);
        for (std::size_t t = 0; t < T; ++t)  // k distinct experts per token, uniformly
            for (std::size_t j = 0; j < k; ++j) {
                std::int32_t e;
                bool again;
                do {
                    e = static_cast<std::int32_t>(g() % E);
                    again = false;
                    for (std::size_t i = 0; i < j; ++i) again = again || idx[r][t * k + i] == e;
                } while (again);
                idx[r][t * k + j] = e;
            }
        plan[r] = dispatch_plan(T, k, E);
        xch[r] = moe_exchange(P, r, E);
        out_bf16[r].resize(T * d);
        out_fp8[r].resize(T * d);
    }
    require_no_error(run_ranks(P, [&](int r, in_process_transport& t) {
        moe_exchange_options o;
        moe_dispatch_plan_host(t, matrix_ref<const std::int32_t>(idx[r].data(), T, k), {}, plan[r].ref(), xch[r].ref(),
                               o);
        xe[r] = grouped_quantized_tensor<XR>(grouped_rows(xch[r].ref().expert_rows, d));
        disp[r] = moe_dispatch_host(t, xq[r].cref(), plan[r].ref(), xch[r].ref(), xe[r].ref(), o);
        const std::size_t M = xch[r].ref().rows();
        auto gr = octet_test::rng(7302 + static_cast<std::uint64_t>(r));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        y[r].resize(M * d);
        for (float& v : y[r]) v = nd(gr);
        comb_bf16[r] =
            moe_combine_host(t, matrix_ref<const float>(y[r].data(), M, d), matrix_ref<const float>(w[r].data(), T, k),
                             plan[r].ref(), xch[r].ref(), matrix_ref<float>(out_bf16[r].data(), T, d), o);
        o.combine_wire = moe_combine_wire::e4m3_1x128;
        comb_fp8[r] =
            moe_combine_host(t, matrix_ref<const float>(y[r].data(), M, d), matrix_ref<const float>(w[r].data(), T, k),
                             plan[r].ref(), xch[r].ref(), matrix_ref<float>(out_fp8[r].data(), T, d), o);
    }));
    // The cost of each wire: the combine of the float outputs (each row sent back to its source's plan
    // order by hand), against which the bf16 and FP8 combines' relative errors are measured.
    std::vector<std::vector<float>> yplan(P);
    for (int q = 0; q < P; ++q) yplan[q].assign(plan[q].ref().rows() * d, -1.0f);
    for (int r = 0; r < P; ++r) {
        moe_exchange_ref xr = xch[r].ref();
        for (std::size_t i = 0; i < xr.rows(); ++i) {
            const moe_row_source src = xr.source_of(i);
            dispatch_plan_ref sp = plan[src.rank].ref();
            std::memcpy(yplan[src.rank].data() + (sp.group_offsets[src.expert] + src.index) * d, y[r].data() + i * d,
                        d * sizeof(float));
        }
    }
    double err_bf16 = 0, err_fp8 = 0, norm = 0;
    for (int q = 0; q < P; ++q) {
        std::vector<float> exact(T * d);
        combine(on_host(), matrix_ref<const float>(yplan[q].data(), plan[q].ref().rows(), d),
                matrix_ref<const float>(w[q].data(), T, k), plan[q].ref(), matrix_ref<float>(exact.data(), T, d));
        for (std::size_t i = 0; i < exact.size(); ++i) {
            norm += static_cast<double>(exact[i]) * exact[i];
            err_bf16 +=
                (static_cast<double>(out_bf16[q][i]) - exact[i]) * (static_cast<double>(out_bf16[q][i]) - exact[i]);
            err_fp8 +=
                (static_cast<double>(out_fp8[q][i]) - exact[i]) * (static_cast<double>(out_fp8[q][i]) - exact[i]);
        }
    }
    err_bf16 = std::sqrt(err_bf16 / norm);
    err_fp8 = std::sqrt(err_fp8 / norm);
    CHECK(err_bf16 < 0x1p-8);  // bf16's unit roundoff 2^-9, RMS well below
    CHECK(err_fp8 < 0x1p-4);   // E4M3's unit roundoff 2^-4
    CHECK(err_fp8 > err_bf16);
    std::size_t rows = 0, fp8 = 0, bf16_bytes = 0, back_bf16 = 0, back_fp8 = 0;
    for (int r = 0; r < P; ++r) {
        rows += disp[r].rows_sent;
        fp8 += disp[r].bytes_sent;
        bf16_bytes += disp[r].bf16_bytes_sent;
        back_bf16 += comb_bf16[r].bytes_sent;
        back_fp8 += comb_fp8[r].bytes_sent;
        CHECK(comb_bf16[r].rows_sent == comb_fp8[r].rows_sent);
    }
    const std::size_t per_row = d + 4 * (d / 128);  // 7168 codes, 56 float scales
    CHECK(fp8 == rows * per_row);
    CHECK(bf16_bytes == rows * d * 2);
    CHECK(back_bf16 == rows * d * 2);  // every row sent out comes back
    CHECK(back_fp8 == rows * per_row);
    std::printf(
        "moe exchange bytes on the wire (4 ranks x 64 tokens, top-8 of 32 experts, d = 7168): %zu rows to other "
        "ranks; dispatch FP8 1x128 %zu bytes (%zu a row) vs bf16 %zu (%.4f of bf16); combine bf16 %zu vs FP8 1x128 "
        "%zu (%.4f); relative L2 error of the combined outputs against float rows: bf16 %.2e, FP8 %.2e\n",
        rows, fp8, per_row, bf16_bytes, static_cast<double>(fp8) / static_cast<double>(bf16_bytes), back_bf16, back_fp8,
        static_cast<double>(back_fp8) / static_cast<double>(back_bf16), err_bf16, err_fp8);
    CHECK(static_cast<double>(fp8) / static_cast<double>(bf16_bytes) == doctest::Approx(7392.0 / 14336.0));
}

// ---- backward ------------------------------------------------------------------------------------------

TEST_CASE("moe exchange: the backward through the exchanges gives the one-process backward bit for bit") {
    const std::size_t E = 12, k = 3, d = 160, N = 96;
    const moe_exchange_case c(7601, E, k, d, N, {26, 0, 41, 12}, {7});
    const int P = c.P;
    const std::size_t L = E / static_cast<std::size_t>(P);
    auto g = octet_test::rng(7602);
    // the experts' data-gradient weights (d x N each) and dout
    std::vector<quantized_tensor<octet_test::moe_w_recipe>> bt;
    std::vector<quantized_cref<octet_test::moe_w_recipe>> bref;
    for (std::size_t e = 0; e < E; ++e) {
        const auto bf = octet_test::with_edge_cases(g, d * N, 0.05f);
        bt.emplace_back(d, N);
        quantize<octet_test::moe_w_recipe>(on_host(), matrix_ref<const float>(bf.data(), d, N), bt.back().ref());
    }
    for (auto& q : bt) bref.push_back(q.cref());
    const std::vector<float> dout = octet_test::with_edge_cases(g, c.T * N);
    for (const auto& wires : {std::pair{moe_combine_wire::bf16, moe_combine_wire::f32},
                              std::pair{moe_combine_wire::e4m3_1x128, moe_combine_wire::bf16}}) {
        INFO("forward wire " << static_cast<int>(wires.first) << ", dX wire " << static_cast<int>(wires.second)
                             << " seed=" << octet_test::run_seed());
        moe_exchange_options fwd;
        fwd.combine_wire = wires.first;
        auto runs = run_world(c, fwd);
        std::vector<std::vector<float>> dw(P), dx(P);
        std::vector<grouped_quantized_tensor<XR>> dye(P);
        require_no_error(run_ranks(P, [&](int r, in_process_transport& t) {
            moe_rank_run& run = runs[r];
            dispatch_plan_ref plan = run.plan.ref();
            moe_exchange_ref xch = run.xch.ref();
            const std::size_t Tr = c.tokens[r], rows = plan.rows(), M = xch.rows();
            std::vector<float> dy(rows * N, -1.0f);
            dw[r].assign(Tr * k, -2.0f);
            combine_backward(on_host(), matrix_ref<const float>(dout.data() + c.begin[r] * N, Tr, N),
                             matrix_ref<const float>(run.returned.data(), rows, N), c.w_of(r), plan,
                             matrix_ref<float>(dy.data(), rows, N), matrix_ref<float>(dw[r].data(), Tr, k));
            quantized_tensor<XR> dyq(rows, N);
            if (rows) quantize<XR>(on_host(), matrix_ref<const float>(dy.data(), rows, N), dyq.ref());
            dye[r] = octet_test::poisoned_groups(xch.expert_rows, N);
            moe_dispatch_rows_host(t, dyq.cref(), plan, xch, dye[r].ref());
            std::vector<float> dxe(M * d, -3.0f);
            if (M)
                grouped_scaled_gemm(on_host(), dye[r].cref(),
                                    span<const quantized_cref<octet_test::moe_w_recipe>>(bref.data() + r * L, L),
                                    matrix_ref<float>(dxe.data(), M, d));
            const std::vector<float> ones(Tr * k, 1.0f);
            dx[r].assign(Tr * d, -4.0f);
            moe_exchange_options back;
            back.combine_wire = wires.second;
            moe_combine_host(t, matrix_ref<const float>(dxe.data(), M, d), matrix_ref<const float>(ones.data(), Tr, k),
                             plan, xch, matrix_ref<float>(dx[r].data(), Tr, d), back);
        }));
        // one process: the same functions over every rank's tokens
        moe_one_process one(c, matrix_ref<const float>(c.x.data(), c.T, d),
                            matrix_ref<const std::int32_t>(c.idx.data(), c.T, k),
                            matrix_ref<const float>(c.w.data(), c.T, k), wires.first);
        dispatch_plan_ref plan = one.plan.ref();
        const std::size_t M = plan.rows();
        const std::vector<float> returned = octet_test::through_wire(one.y, M, N, wires.first);
        std::vector<float> dy(M * N), dwg(c.T * k), dxr(M * d), dxg(c.T * d);
        combine_backward(on_host(), matrix_ref<const float>(dout.data(), c.T, N),
                         matrix_ref<const float>(returned.data(), M, N), matrix_ref<const float>(c.w.data(), c.T, k),
                         plan, matrix_ref<float>(dy.data(), M, N), matrix_ref<float>(dwg.data(), c.T, k));
        grouped_quantized_tensor<XR> dyg(grouped_rows(plan.group_sizes, N));
        grouped_quantize<XR>(on_host(), matrix_ref<const float>(dy.data(), M, N), plan.group_sizes, dyg.ref());
        grouped_scaled_gemm(on_host(), dyg.cref(), as_cspan(bref), matrix_ref<float>(dxr.data(), M, d));
        const std::vector<float> dxw = octet_test::through_wire(dxr, M, d, wires.second), ones(c.T * k, 1.0f);
        combine(on_host(), matrix_ref<const float>(dxw.data(), M, d), matrix_ref<const float>(ones.data(), c.T, k),
                plan, matrix_ref<float>(dxg.data(), c.T, d));
        for (int r = 0; r < P; ++r) {
            CAPTURE(r);
            // the rows that came back, in the rank's plan order, are the one-process rows of its tokens
            dispatch_plan_ref lp = runs[r].plan.ref();
            bool same = true;
            for (std::size_t e = 0; e < E; ++e) {
                std::size_t before = 0;  // the rows of expert e from lower ranks
                for (int q = 0; q < r; ++q) before += runs[q].plan.ref().group_sizes[e];
                for (std::size_t i = 0; i < lp.group_sizes[e]; ++i)
                    same = same && std::memcmp(runs[r].returned.data() + (lp.group_offsets[e] + i) * N,
                                               returned.data() + (plan.group_offsets[e] + before + i) * N,
                                               N * sizeof(float)) == 0;
            }
            CHECK(same);
            CHECK(same_floats(dw[r], dwg.data() + c.begin[r] * k, c.tokens[r] * k));
            for (std::size_t e = 0; e < L; ++e) CHECK(same_group(dye[r].cref().group(e), dyg.cref().group(r * L + e)));
            CHECK(same_floats(dx[r], dxg.data() + c.begin[r] * d, c.tokens[r] * d));
        }
    }
}

// ---- bad input -----------------------------------------------------------------------------------------

namespace {
/// Runs plan + dispatch + combine on P ranks with `tamper(rank, stage, run, opt)` called before each stage
/// (0 plan, 1 dispatch, 2 combine); returns every rank's exception.
using tamper_fn = std::function<void(int, int, moe_rank_run&, moe_exchange_options&, dispatch_plan_ref&,
                                     moe_exchange_ref&, std::vector<float>&)>;

std::vector<std::exception_ptr> run_tampered(const moe_exchange_case& c, const tamper_fn& tamper) {
    std::vector<moe_rank_run> runs(static_cast<std::size_t>(c.P));
    return run_ranks(c.P, [&](int r, in_process_transport& t) {
        moe_rank_run& run = runs[r];
        moe_exchange_options opt;
        const std::size_t Tr = c.tokens[r], L = c.E / static_cast<std::size_t>(c.P);
        run.xq = quantized_tensor<XR>(Tr, c.d);
        if (Tr) quantize<XR>(on_host(), c.x_of(r), run.xq.ref());
        std::vector<std::int32_t> idx(c.idx.begin() + static_cast<std::ptrdiff_t>(c.begin[r] * c.k),
                                      c.idx.begin() + static_cast<std::ptrdiff_t>((c.begin[r] + Tr) * c.k));
        std::vector<float> wts(c.w.begin() + static_cast<std::ptrdiff_t>(c.begin[r] * c.k),
                               c.w.begin() + static_cast<std::ptrdiff_t>((c.begin[r] + Tr) * c.k));
        run.plan = dispatch_plan(Tr, c.k, c.E);
        run.xch = moe_exchange(c.P, r, c.E);
        dispatch_plan_ref plan = run.plan.ref();
        moe_exchange_ref xch = run.xch.ref();
        std::vector<float> scratch;
        tamper(r, 0, run, opt, plan, xch, scratch);
        if (!scratch.empty()) idx[0] = static_cast<std::int32_t>(scratch[0]);
        moe_dispatch_plan_host(t, matrix_ref<const std::int32_t>(idx.data(), Tr, c.k), {}, plan, xch, opt);
        tamper(r, 1, run, opt, plan, xch, scratch);
        run.xe = octet_test::poisoned_groups(xch.expert_rows, c.d);
        moe_dispatch_host(t, run.xq.cref(), plan, xch, run.xe.ref(), opt);
        const std::size_t M = xch.rows();
        run.y.assign(M * c.N, 0.5f);
        run.out.assign(Tr * c.N, 0.0f);
        scratch.clear();
        tamper(r, 2, run, opt, plan, xch, scratch);
        const std::size_t wk = scratch.empty() ? c.k : c.k + 1;
        wts.resize(Tr * wk, 0.25f);
        moe_combine_host(t, matrix_ref<const float>(run.y.data(), M, c.N), matrix_ref<const float>(wts.data(), Tr, wk),
                         plan, xch, matrix_ref<float>(run.out.data(), Tr, c.N), opt);
        (void)L;
    });
}
}  // namespace

TEST_CASE("moe exchange: bad input on one rank stops every rank with octet::error") {
    const moe_exchange_case c(7401, 12, 2, 130, 40, {20, 31, 0, 12});
    INFO("seed=" << octet_test::run_seed());
    auto nothing = [](int, int, moe_rank_run&, moe_exchange_options&, dispatch_plan_ref&, moe_exchange_ref&,
                      std::vector<float>&) {};
    require_no_error(run_tampered(c, nothing));

    SUBCASE("an expert index out of range on rank 1") {
        auto errors = run_tampered(c, [&](int r, int stage, moe_rank_run&, moe_exchange_options&, dispatch_plan_ref&,
                                          moe_exchange_ref&, std::vector<float>& s) {
            if (r == 1 && stage == 0) s.assign(1, 12.0f);  // idx[0] = 12 of 12 experts
        });
        require_every_rank_throws(errors, 1, "indices", "rank 1 failed validation");
    }
    SUBCASE("a record built for another world on rank 2") {
        moe_exchange other(5, 2, 12);
        auto errors = run_tampered(c, [&](int r, int stage, moe_rank_run&, moe_exchange_options&, dispatch_plan_ref&,
                                          moe_exchange_ref& xch, std::vector<float>&) {
            if (r == 2 && stage == 0) xch = other.ref();
        });
        require_every_rank_throws(errors, 2, "was built for 5 ranks", "rank 2 failed validation");
    }
    SUBCASE("another expert count on rank 0") {
        dispatch_plan plan(c.tokens[0], c.k, 16);
        moe_exchange other(4, 0, 16);
        auto errors = run_tampered(c, [&](int r, int stage, moe_rank_run&, moe_exchange_options&, dispatch_plan_ref& p,
                                          moe_exchange_ref& xch, std::vector<float>&) {
            if (r == 0 && stage == 0) p = plan.ref(), xch = other.ref();
        });
        require_every_rank_throws(errors, 0, "expert count", "expert count");
    }
    SUBCASE("plan counts that do not sum on rank 3") {
        auto errors = run_tampered(c, [&](int r, int stage, moe_rank_run&, moe_exchange_options&, dispatch_plan_ref& p,
                                          moe_exchange_ref&, std::vector<float>&) {
            if (r == 3 && stage == 1) ++p.group_sizes[5];
        });
        require_every_rank_throws(errors, 3, "plan.group_sizes", "rank 3 failed validation");
    }
    SUBCASE("a record whose counts sum but do not match what the senders send, on rank 1") {
        auto errors = run_tampered(c, [&](int r, int stage, moe_rank_run&, moe_exchange_options&, dispatch_plan_ref&,
                                          moe_exchange_ref& xch, std::vector<float>&) {
            if (r == 1 && stage == 1) ++xch.recv_counts[0], ++xch.expert_rows[0];
        });
        require_every_rank_throws(errors, -1, "", "the exchange record of rank 1");
    }
    SUBCASE("received counts that do not sum on rank 0") {
        auto errors = run_tampered(c, [&](int r, int stage, moe_rank_run&, moe_exchange_options&, dispatch_plan_ref&,
                                          moe_exchange_ref& xch, std::vector<float>&) {
            if (r == 0 && stage == 2) ++xch.recv_counts[1];
        });
        require_every_rank_throws(errors, 0, "xch.expert_rows", "rank 0 failed validation");
    }
    SUBCASE("another combine wire on rank 2") {
        auto errors = run_tampered(c, [&](int r, int stage, moe_rank_run&, moe_exchange_options& o, dispatch_plan_ref&,
                                          moe_exchange_ref&, std::vector<float>&) {
            if (r == 2 && stage == 2) o.combine_wire = moe_combine_wire::e4m3_1x128;
        });
        require_every_rank_throws(errors, -1, "", "options.combine_wire differs");
    }
    SUBCASE("options.returned of the wrong shape on rank 0") {
        float one = 0.0f;
        auto errors = run_tampered(c, [&](int r, int stage, moe_rank_run&, moe_exchange_options& o, dispatch_plan_ref&,
                                          moe_exchange_ref&, std::vector<float>&) {
            if (r == 0 && stage == 2) o.returned = matrix_ref<float>(&one, 1, 1);
        });
        require_every_rank_throws(errors, 0, "options.returned", "rank 0 failed validation");
    }
    SUBCASE("another expected rank count on rank 3") {
        auto errors = run_tampered(c, [&](int r, int stage, moe_rank_run&, moe_exchange_options& o, dispatch_plan_ref&,
                                          moe_exchange_ref&, std::vector<float>&) {
            if (stage == 1) o.expected_ranks = r == 3 ? 3 : 4;
        });
        require_every_rank_throws(errors, 3, "options.expected_ranks", "rank 3 failed validation");
    }
    SUBCASE("weights of the wrong shape on rank 1") {
        auto errors = run_tampered(c, [&](int r, int stage, moe_rank_run&, moe_exchange_options&, dispatch_plan_ref&,
                                          moe_exchange_ref&, std::vector<float>& s) {
            if (r == 1 && stage == 2) s.assign(1, 0.0f);
        });
        require_every_rank_throws(errors, 1, "weights", "rank 1 failed validation");
    }
}

// ---- memory ---------------------------------------------------------------------------------------------

TEST_CASE("moe exchange: every temporary from the lent allocator, one block of exactly the query per call") {
    const moe_exchange_case c(7501, 12, 3, 200, 72, {25, 0, 40});
    const int P = c.P;
    const std::size_t L = c.E / static_cast<std::size_t>(P);
    INFO("seed=" << octet_test::run_seed());
    std::vector<moe_rank_run> runs(static_cast<std::size_t>(P));
    // sized from a first run, outside the counted region
    require_no_error(run_ranks(
        P, [&](int r, in_process_transport& t) { octet_test::run_moe_rank(t, c, runs[r], moe_exchange_options{}); }));
    std::vector<octet_test::lent_allocator> lent(static_cast<std::size_t>(P));
    std::vector<std::unique_ptr<thread_pool>> pools;
    for (int r = 0; r < P; ++r) pools.push_back(std::make_unique<thread_pool>(2));
    std::vector<std::size_t> most(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) {
        moe_exchange_options o;
        o.executor = with_allocator(on_host(*pools[r]), lent[r].ref());
        const std::size_t M = runs[r].xch.ref().rows();
        const matrix_ref<const float> y(runs[r].y.data(), M, c.N);
        most[r] = std::max(moe_dispatch_plan_scratch_bytes(runs[r].xch.ref()),
                           moe_dispatch_scratch_bytes(runs[r].xq.cref(), runs[r].plan.ref(), runs[r].xch.ref()));
        most[r] = std::max(most[r], moe_combine_scratch_bytes(y, runs[r].plan.ref(), runs[r].xch.ref(), o));
        o.combine_wire = moe_combine_wire::e4m3_1x128;
        const std::size_t fp8 = moe_combine_scratch_bytes(y, runs[r].plan.ref(), runs[r].xch.ref(), o);
        most[r] = std::max(most[r], fp8);
        // the E4M3 rows dequantized into options.returned: no float rows of scratch
        const std::size_t rows = runs[r].plan.ref().rows();
        o.returned = matrix_ref<float>(runs[r].returned.data(), rows, c.N);
        if (rows) CHECK(moe_combine_scratch_bytes(y, runs[r].plan.ref(), runs[r].xch.ref(), o) <= fp8 - rows * c.N * 4);
        o.combine_wire = moe_combine_wire::f32;
        most[r] = std::max(most[r], moe_combine_scratch_bytes(y, runs[r].plan.ref(), runs[r].xch.ref(), o));
    }
    long counted = -1;
    require_no_error(run_ranks(
        P,
        [&](int r, in_process_transport& t) {
            moe_rank_run& run = runs[r];
            moe_exchange_options o;
            o.executor = with_allocator(on_host(*pools[r]), lent[r].ref());
            const std::size_t M = run.xch.ref().rows(), Tr = c.tokens[r];
            moe_dispatch_plan_host(t, c.idx_of(r), {}, run.plan.ref(), run.xch.ref(), o);
            moe_dispatch_host(t, run.xq.cref(), run.plan.ref(), run.xch.ref(), run.xe.ref(), o);
            moe_combine_host(t, matrix_ref<const float>(run.y.data(), M, c.N), c.w_of(r), run.plan.ref(), run.xch.ref(),
                             matrix_ref<float>(run.out.data(), Tr, c.N), o);
            o.combine_wire = moe_combine_wire::e4m3_1x128;
            moe_combine_host(t, matrix_ref<const float>(run.y.data(), M, c.N), c.w_of(r), run.plan.ref(), run.xch.ref(),
                             matrix_ref<float>(run.out.data(), Tr, c.N), o);
            o.returned = matrix_ref<float>(run.returned.data(), run.plan.ref().rows(), c.N);
            moe_combine_host(t, matrix_ref<const float>(run.y.data(), M, c.N), c.w_of(r), run.plan.ref(), run.xch.ref(),
                             matrix_ref<float>(run.out.data(), Tr, c.N), o);
            o.combine_wire = moe_combine_wire::f32;
            moe_combine_host(t, matrix_ref<const float>(run.y.data(), M, c.N), c.w_of(r), run.plan.ref(), run.xch.ref(),
                             matrix_ref<float>(run.out.data(), Tr, c.N), o);
        },
        &counted));
    CHECK(counted == 0);
    for (int r = 0; r < P; ++r) {
        CAPTURE(r);
        CHECK(lent[r].allocations == 6);
        CHECK(lent[r].balanced());
        CHECK(lent[r].peak == most[r]);
    }
    (void)L;
}
