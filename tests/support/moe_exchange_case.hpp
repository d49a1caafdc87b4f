// The expert-parallel MoE exchange (octet/nn/moe_exchange.hpp) as the tests run it, shared by the
// in-process test (tests/host/nn_moe_exchange.cpp) and the MPI test (tests/mpi/nn_moe_exchange.cpp):
// a problem over P ranks (every rank's tokens, routing and the experts' weights, generated from one
// seed so that any process can build any rank's inputs), one rank's run of the pipeline over any
// transport (plan, dispatch, the experts' grouped GEMM, combine), and the references: the same layer
// on one process over every rank's tokens, and one rank's tokens alone through all E experts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "octet/gemm/grouped_gemm.hpp"
#include "octet/nn/moe_exchange.hpp"
#include "octet/nn/moe_routing.hpp"
#include "octet/quant/quantize.hpp"
#include "support/random.hpp"

namespace octet_test {

using moe_x_recipe = octet::recipes::blockwise_1x128;    // the tokens' rows
using moe_w_recipe = octet::recipes::blockwise_128x128;  // the experts' weights

/// Every rank's inputs: tokens[r] rows of X (d wide) per rank, stacked in rank order; route's top-k
/// selection and weights over E experts (the experts in `masked` never selected: -Inf logits); E
/// expert weight matrices N x d, quantized 128x128.
struct moe_exchange_case {
    int P = 1;
    std::size_t E = 0, k = 0, d = 0, N = 0, T = 0;
    std::vector<std::size_t> tokens, begin;
    std::vector<float> x, w;
    std::vector<std::int32_t> idx;
    std::vector<octet::quantized_tensor<moe_w_recipe>> wq;
    std::vector<octet::quantized_cref<moe_w_recipe>> wref;

    moe_exchange_case(std::uint64_t salt, std::size_t experts, std::size_t slots, std::size_t width,
                      std::size_t out_width, const std::vector<std::size_t>& per_rank,
                      const std::vector<std::size_t>& masked = {})
        : P(static_cast<int>(per_rank.size())), E(experts), k(slots), d(width), N(out_width), tokens(per_rank) {
        for (std::size_t t : tokens) begin.push_back(T), T += t;
        auto g = rng(salt);
        x = with_edge_cases(g, T * d);
        std::normal_distribution<float> nd(0.0f, 1.5f);
        std::vector<float> logits(T * E);
        for (float& l : logits) l = nd(g);
        for (std::size_t t = 0; t < T; ++t)
            for (std::size_t e : masked) logits[t * E + e] = -std::numeric_limits<float>::infinity();
        idx.resize(T * k);
        w.resize(T * k);
        std::vector<std::size_t> counts(E);
        octet::router_options ro;
        ro.k = k;
        ro.gate = octet::gate_mode::softmax_topk_renormalized;
        octet::route(octet::on_host(), octet::matrix_ref<const float>(logits.data(), T, E), ro,
                     octet::matrix_ref<std::int32_t>(idx.data(), T, k), octet::matrix_ref<float>(w.data(), T, k),
                     octet::as_span(counts));
        for (std::size_t e = 0; e < E; ++e) {
            const auto wf = with_edge_cases(g, N * d, 0.05f);
            wq.emplace_back(N, d);
            octet::quantize<moe_w_recipe>(octet::on_host(), octet::matrix_ref<const float>(wf.data(), N, d),
                                          wq.back().ref());
        }
        for (auto& q : wq) wref.push_back(q.cref());
    }

    octet::matrix_ref<const float> x_of(int r) const { return {x.data() + begin[r] * d, tokens[r], d}; }
    octet::matrix_ref<const std::int32_t> idx_of(int r) const { return {idx.data() + begin[r] * k, tokens[r], k}; }
    octet::matrix_ref<const float> w_of(int r) const { return {w.data() + begin[r] * k, tokens[r], k}; }
    /// The weights of experts [first, first + count).
    octet::span<const octet::quantized_cref<moe_w_recipe>> experts(std::size_t first, std::size_t count) const {
        return {wref.data() + first, count};
    }
};

/// What one rank's run of the pipeline keeps.
struct moe_rank_run {
    octet::quantized_tensor<moe_x_recipe> xq;
    octet::dispatch_plan plan;
    octet::moe_exchange xch;
    octet::grouped_quantized_tensor<moe_x_recipe> xe;  ///< the rows this rank's experts received
    std::vector<float> y, out;                         ///< its experts' outputs; its tokens' combine
    std::vector<float> returned;                       ///< the rows as they came back (options.returned)
    octet::moe_exchange_report plan_report, dispatch_report, combine_report;
};

/// A grouped copy filled with a poison pattern (so that every byte the exchange writes is checked).
inline octet::grouped_quantized_tensor<moe_x_recipe> poisoned_groups(octet::span<const std::size_t> sizes,
                                                                     std::size_t d) {
    octet::grouped_quantized_tensor<moe_x_recipe> t(octet::grouped_rows(sizes, d));
    auto ref = t.ref();
    if (t.layout().data_bytes) std::memset(ref.data, 0xAB, t.layout().data_bytes);
    if (t.layout().scale_bytes) std::memset(ref.scales, 0xCD, t.layout().scale_bytes);
    return t;
}

/// Rank comm.rank()'s run: quantize its rows once, plan and exchange the counts, dispatch, its
/// experts' grouped GEMM, combine, keeping the rows that came back (outputs poisoned first).
template <class Transport>
void run_moe_rank(Transport& comm, const moe_exchange_case& c, moe_rank_run& run,
                  const octet::moe_exchange_options& opt, const octet::dispatch_options& dopt = {}) {
    using namespace octet;
    const int r = comm.rank();
    const std::size_t Tr = c.tokens[r], L = c.E / static_cast<std::size_t>(c.P);
    run.xq = quantized_tensor<moe_x_recipe>(Tr, c.d);
    if (Tr) quantize<moe_x_recipe>(opt.executor, c.x_of(r), run.xq.ref());
    run.plan = dispatch_plan(Tr, c.k, c.E);
    run.xch = moe_exchange(comm.size(), r, c.E);
    run.plan_report = moe_dispatch_plan_host(comm, c.idx_of(r), dopt, run.plan.ref(), run.xch.ref(), opt);
    run.xe = poisoned_groups(run.xch.ref().expert_rows, c.d);
    run.dispatch_report = moe_dispatch_host(comm, run.xq.cref(), run.plan.ref(), run.xch.ref(), run.xe.ref(), opt);
    const std::size_t M = run.xch.ref().rows();
    run.y.assign(M * c.N, -7.0f);
    if (M)
        grouped_scaled_gemm(opt.executor, run.xe.cref(), c.experts(r * L, L), matrix_ref<float>(run.y.data(), M, c.N));
    run.out.assign(Tr * c.N, -9.0f);
    const std::size_t rows = run.plan.ref().rows();
    run.returned.assign(rows * c.N, -11.0f);
    moe_exchange_options keep = opt;
    keep.returned = matrix_ref<float>(run.returned.data(), rows, c.N);
    run.combine_report =
        moe_combine_host(comm, matrix_ref<const float>(run.y.data(), M, c.N), c.w_of(r), run.plan.ref(), run.xch.ref(),
                         matrix_ref<float>(run.out.data(), Tr, c.N), keep);
}

/// y's rows as the combine's wire leaves them, in float: rounded to bf16, quantized to 1x128 E4M3
/// and dequantized, or as they are (f32).
inline std::vector<float> through_wire(const std::vector<float>& y, std::size_t rows, std::size_t cols,
                                       octet::moe_combine_wire wire) {
    using namespace octet;
    if (wire == moe_combine_wire::f32) return y;
    std::vector<float> v(y.size());
    if (wire == moe_combine_wire::bf16) {
        for (std::size_t i = 0; i < y.size(); ++i) v[i] = to_float(to_bf16(y[i]));
    } else if (rows && cols) {
        quantized_tensor<recipes::blockwise_1x128> q(rows, cols);
        quantize<recipes::blockwise_1x128>(on_host(), matrix_ref<const float>(y.data(), rows, cols), q.ref());
        dequantize(on_host(), q.cref(), matrix_ref<float>(v.data(), rows, cols));
    }
    return v;
}

/// The same layer on one process, tokens rows of x through all E experts: quantize once, plan (with
/// dopt), permute_quantized, grouped GEMM, the combine's wire rounding, combine.
struct moe_one_process {
    octet::dispatch_plan plan;
    octet::grouped_quantized_tensor<moe_x_recipe> xs;
    std::vector<float> y, out;

    moe_one_process(const moe_exchange_case& c, octet::matrix_ref<const float> x,
                    octet::matrix_ref<const std::int32_t> idx, octet::matrix_ref<const float> w,
                    octet::moe_combine_wire wire, const octet::dispatch_options& dopt = {}) {
        using namespace octet;
        const std::size_t T = x.rows;
        quantized_tensor<moe_x_recipe> xq(T, c.d);
        if (T) quantize<moe_x_recipe>(on_host(), x, xq.ref());
        plan = dispatch_plan(T, c.k, c.E);
        plan_dispatch(idx, dopt, plan.ref());
        xs = poisoned_groups(plan.ref().group_sizes, c.d);
        if (T) permute_quantized(on_host(), xq.cref(), plan.ref(), xs.ref());
        const std::size_t M = plan.ref().rows();
        y.assign(M * c.N, -5.0f);
        if (M) grouped_scaled_gemm(on_host(), xs.cref(), c.experts(0, c.E), matrix_ref<float>(y.data(), M, c.N));
        const std::vector<float> yw = through_wire(y, M, c.N, wire);
        out.assign(T * c.N, -3.0f);
        combine(on_host(), matrix_ref<const float>(yw.data(), M, c.N), w, plan.ref(),
                matrix_ref<float>(out.data(), T, c.N));
    }
};

/// FNV-1a over bytes (the MPI test prints one per rank).
inline std::uint64_t fnv1a(const void* p, std::size_t n, std::uint64_t h = 0xcbf29ce484222325ull) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

}  // namespace octet_test
