// The router, dispatch plan, FP8 permute and combine of a mixture-of-experts layer
// (octet/nn/moe_routing.hpp), on the host. Oracles: float64 references written here (top-k with the
// lower index winning ties, softmax weights in every gate mode, the load-balancing loss, the router's
// gradient as an explicit Jacobian, the combine and its backward); the plan's invariants (a stable
// counting sort and its inverse); bit for bit, the permuted FP8 copy against quantizing the permuted
// float rows (per group, and through grouped_quantize) and the grouped GEMM on either; bad arguments.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "octet/nn/moe_routing.hpp"
#include "support/counting_allocator.hpp"
#include "support/random.hpp"

namespace nn_moe_routing_test {
using namespace octet;

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> normal(std::mt19937_64& g, std::size_t n, float scale) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

struct routed {
    std::vector<std::int32_t> idx;
    std::vector<float> w;
    std::vector<std::size_t> counts;
    router_result r;
};

routed run_route(const host_executor& ex, const std::vector<float>& logits, std::size_t T, std::size_t E,
                 const router_options& opt) {
    routed o;
    o.idx.assign(T * opt.k, -5);
    o.w.assign(T * opt.k, -7.0f);
    o.counts.assign(E, 99);
    o.r = route(ex, matrix_ref<const float>(logits.data(), T, E), opt, matrix_ref<std::int32_t>(o.idx.data(), T, opt.k),
                matrix_ref<float>(o.w.data(), T, opt.k), as_span(o.counts));
    return o;
}

/// float64 softmax of one row.
std::vector<double> softmax64(const float* l, std::size_t n) {
    double m = -INFINITY, s = 0.0;
    for (std::size_t e = 0; e < n; ++e) m = std::max<double>(m, l[e]);
    std::vector<double> p(n);
    for (std::size_t e = 0; e < n; ++e) s += p[e] = std::exp(static_cast<double>(l[e]) - m);
    for (auto& x : p) x /= s;
    return p;
}

/// The k best of `score` (larger first, the lower index on ties): a full stable sort.
std::vector<std::size_t> topk64(const std::vector<double>& score, std::size_t k) {
    std::vector<std::size_t> id(score.size());
    std::iota(id.begin(), id.end(), std::size_t{0});
    std::stable_sort(id.begin(), id.end(), [&](std::size_t a, std::size_t b) { return score[a] > score[b]; });
    id.resize(k);
    return id;
}

/// float64 weights of a token for the selection S.
std::vector<double> weights64(const float* l, std::size_t E, const std::vector<std::size_t>& S, gate_mode gate) {
    const auto p = softmax64(l, E);
    std::vector<double> w(S.size());
    if (gate == gate_mode::topk_softmax) {
        std::vector<float> sel(S.size());
        for (std::size_t j = 0; j < S.size(); ++j) sel[j] = l[S[j]];
        return softmax64(sel.data(), sel.size());
    }
    double z = 0.0;
    for (std::size_t j = 0; j < S.size(); ++j) z += p[S[j]];
    for (std::size_t j = 0; j < S.size(); ++j)
        w[j] = gate == gate_mode::softmax_topk_renormalized ? p[S[j]] / z : p[S[j]];
    return w;
}

double aux64(const std::vector<float>& logits, std::size_t T, std::size_t E, std::size_t k,
             const std::vector<std::size_t>& counts) {
    std::vector<double> P(E, 0.0);
    for (std::size_t t = 0; t < T; ++t) {
        const auto p = softmax64(logits.data() + t * E, E);
        for (std::size_t e = 0; e < E; ++e) P[e] += p[e] / static_cast<double>(T);
    }
    double s = 0.0;
    for (std::size_t e = 0; e < E; ++e) s += static_cast<double>(counts[e]) / static_cast<double>(T * k) * P[e];
    return static_cast<double>(E) * s;
}

void check_route_against_float64(const std::vector<float>& logits, std::size_t T, std::size_t E, std::size_t k,
                                 gate_mode gate) {
    INFO("T=" << T << " E=" << E << " k=" << k << " gate=" << static_cast<int>(gate)
              << " seed=" << octet_test::run_seed());
    router_options opt;
    opt.k = k;
    opt.gate = gate;
    const routed o = run_route(on_host(3), logits, T, E, opt);
    std::vector<std::size_t> counts(E, 0);
    double max_err = 0.0;
    for (std::size_t t = 0; t < T; ++t) {
        const float* l = logits.data() + t * E;
        const auto S = topk64(std::vector<double>(l, l + E), k);
        const auto w = weights64(l, E, S, gate);
        for (std::size_t j = 0; j < k; ++j) {
            REQUIRE(o.idx[t * k + j] == static_cast<std::int32_t>(S[j]));
            ++counts[S[j]];
            max_err = std::max(max_err, std::fabs(o.w[t * k + j] - w[j]) / std::max(w[j], 1e-30));
        }
        if (gate != gate_mode::softmax_topk) {
            double sum = 0.0;
            for (std::size_t j = 0; j < k; ++j) sum += o.w[t * k + j];
            CHECK(std::fabs(sum - 1.0) < 1e-5);
        }
    }
    CHECK(max_err < 2e-6 * static_cast<double>(E));
    CHECK(o.counts == counts);
    CHECK(o.r.nonfinite_tokens == 0);
    const double aux = aux64(logits, T, E, k, counts);
    CHECK(std::fabs(o.r.aux_loss - aux) <= 1e-5 * aux);
    // every thread count (and the transposed storage of the logits) gives the same bits
    const routed one = run_route(on_host(1), logits, T, E, opt);
    CHECK(one.idx == o.idx);
    CHECK(std::memcmp(one.w.data(), o.w.data(), o.w.size() * sizeof(float)) == 0);
    CHECK(one.r.aux_loss == o.r.aux_loss);
    std::vector<float> lt(T * E);
    for (std::size_t t = 0; t < T; ++t)
        for (std::size_t e = 0; e < E; ++e) lt[e * T + t] = logits[t * E + e];
    std::vector<std::int32_t> idx_t(T * k);
    std::vector<float> w_t(T * k);
    std::vector<std::size_t> c_t(E);
    route(on_host(2), matrix_ref<const float>(lt.data(), T, E, T, storage_order::col_major), opt,
          matrix_ref<std::int32_t>(idx_t.data(), T, k), matrix_ref<float>(w_t.data(), T, k), as_span(c_t));
    CHECK(idx_t == o.idx);
    CHECK(std::memcmp(w_t.data(), o.w.data(), o.w.size() * sizeof(float)) == 0);
}

TEST_CASE("route: top-k and weights against float64, every gate mode, ties, tiny and huge logits") {
    auto g = octet_test::rng(11);
    const gate_mode gates[] = {gate_mode::softmax_topk, gate_mode::softmax_topk_renormalized, gate_mode::topk_softmax};
    const std::size_t T = 300, E = 16;  // more than one 256-token block of the aux loss's sums
    auto logits = normal(g, T * E, 2.0f);
    for (gate_mode gm : gates)
        for (std::size_t k : {1, 2, 5, 16}) check_route_against_float64(logits, T, E, k, gm);
    // ties everywhere: logits on a grid of 4 values; the lower expert wins
    std::uniform_int_distribution<int> grid(0, 3);
    for (auto& x : logits) x = 0.5f * static_cast<float>(grid(g));
    for (gate_mode gm : gates) check_route_against_float64(logits, T, E, 3, gm);
    // 1e-6 magnitudes (near uniform weights), zero rows, and huge magnitudes (|l| up to 3e38)
    auto tiny = normal(g, T * E, 1e-6f);
    std::fill(tiny.begin(), tiny.begin() + 3 * E, 0.0f);
    for (gate_mode gm : gates) check_route_against_float64(tiny, T, E, 4, gm);
    auto huge = normal(g, 40 * E, 1e37f);
    huge[5] = 3e38f;
    huge[6] = -3e38f;
    for (gate_mode gm : gates) check_route_against_float64(huge, 40, E, 2, gm);
}

TEST_CASE("route: 0 tokens, k = experts, one expert") {
    router_options opt;
    opt.k = 4;
    std::vector<float> none;
    const routed empty = run_route(on_host(), none, 0, 4, opt);
    CHECK(empty.r.aux_loss == 0.0);
    CHECK(empty.counts == std::vector<std::size_t>(4, 0));
    auto g = octet_test::rng(12);
    const auto logits = normal(g, 10 * 4, 1.0f);
    opt.gate = gate_mode::softmax_topk;
    const routed all = run_route(on_host(), logits, 10, 4, opt);
    CHECK(all.counts == std::vector<std::size_t>(4, 10));
    // k = E: every expert once, and f_e = 1/E makes the loss exactly E * sum (1/E) P_e = 1 (float sums)
    CHECK(std::fabs(all.r.aux_loss - 1.0) < 1e-6);
    opt.k = 1;
    const std::vector<float> one{0.3f, -2.0f, 7.0f};
    const routed single = run_route(on_host(), one, 3, 1, opt);
    CHECK(single.idx == std::vector<std::int32_t>(3, 0));
    CHECK(single.w == std::vector<float>(3, 1.0f));
    CHECK(single.r.aux_loss == 1.0);
}

TEST_CASE("route: non-finite logits are data: NaN weights for their token only, counted; -Inf masks") {
    const std::size_t T = 6, E = 5, k = 2;
    auto g = octet_test::rng(13);
    auto logits = normal(g, T * E, 1.0f);
    logits[1 * E + 2] = NAN;
    logits[2 * E + 4] = kInf;
    std::fill(logits.begin() + 3 * E, logits.begin() + 4 * E, -kInf);
    logits[4 * E + 0] = -kInf;  // a masked expert: never selected while k finite experts remain
    logits[4 * E + 1] = -kInf;
    logits[4 * E + 2] = -kInf;
    router_options opt;
    opt.k = k;
    opt.gate = gate_mode::softmax_topk_renormalized;
    const routed o = run_route(on_host(), logits, T, E, opt);
    CHECK(o.r.nonfinite_tokens == 3);
    CHECK(std::isnan(o.r.aux_loss));
    for (std::size_t t = 0; t < T; ++t) {
        INFO("token " << t);
        const bool bad = t >= 1 && t <= 3;
        CHECK(o.idx[t * k] != o.idx[t * k + 1]);
        for (std::size_t j = 0; j < k; ++j) {
            CHECK(o.idx[t * k + j] >= 0);
            CHECK(o.idx[t * k + j] < static_cast<std::int32_t>(E));
            CHECK(std::isnan(o.w[t * k + j]) == bad);
        }
    }
    CHECK(o.idx[2 * k] == 4);  // +Inf ranks first
    CHECK(o.idx[1 * k] != 2);  // NaN ranks last
    CHECK(((o.idx[4 * k] == 3 && o.idx[4 * k + 1] == 4) || (o.idx[4 * k] == 4 && o.idx[4 * k + 1] == 3)));
    // the finite tokens' weights do not depend on the bad ones
    std::vector<float> clean(logits.begin(), logits.begin() + E);
    clean.insert(clean.end(), logits.begin() + 4 * E, logits.end());
    const routed c = run_route(on_host(), clean, 3, E, opt);
    CHECK(c.w[0] == o.w[0]);
    CHECK(c.w[2] == o.w[4 * k]);
    CHECK(c.w[5] == o.w[5 * k + 1]);
}

TEST_CASE("route: the selection bias picks, the unbiased scores weigh; update_expert_bias") {
    const std::size_t T = 200, E = 8, k = 2;
    auto g = octet_test::rng(14);
    const auto logits = normal(g, T * E, 1.0f);
    // a bias of +2 on experts 5 and 6 decides the selection of every token (p <= 1)
    std::vector<float> bias(E, 0.0f);
    bias[5] = bias[6] = 2.0f;
    for (gate_mode gm : {gate_mode::softmax_topk, gate_mode::softmax_topk_renormalized, gate_mode::topk_softmax}) {
        router_options opt;
        opt.k = k;
        opt.gate = gm;
        opt.selection_bias = as_cspan(bias);
        const routed o = run_route(on_host(), logits, T, E, opt);
        for (std::size_t t = 0; t < T; ++t) {
            const auto p = softmax64(logits.data() + t * E, E);
            // p + 2 may round two close probabilities to a tie (then the lower index, 5, comes first)
            const bool five_first = p[5] >= p[6] || p[6] - p[5] < 1e-6;
            const std::vector<std::size_t> S =
                five_first ? std::vector<std::size_t>{5, 6} : std::vector<std::size_t>{6, 5};
            REQUIRE(o.idx[t * k] == static_cast<std::int32_t>(S[0]));
            REQUIRE(o.idx[t * k + 1] == static_cast<std::int32_t>(S[1]));
            const auto w = weights64(logits.data() + t * E, E, S, gm);
            for (std::size_t j = 0; j < k; ++j) CHECK(std::fabs(o.w[t * k + j] - w[j]) <= 1e-5 * w[j]);
        }
        CHECK(o.counts[5] == T);
        CHECK(o.counts[6] == T);
    }
    // a small random bias: the selection is the top-k of p + bias (tokens with a near tie skipped)
    std::uniform_real_distribution<float> small(-0.05f, 0.05f);
    for (auto& b : bias) b = small(g);
    router_options opt;
    opt.k = 3;
    opt.selection_bias = as_cspan(bias);
    const routed o = run_route(on_host(), logits, T, E, opt);
    std::size_t checked = 0;
    for (std::size_t t = 0; t < T; ++t) {
        const auto p = softmax64(logits.data() + t * E, E);
        std::vector<double> s(E);
        for (std::size_t e = 0; e < E; ++e) s[e] = p[e] + bias[e];
        auto sorted = s;
        std::sort(sorted.rbegin(), sorted.rend());
        if (sorted[2] - sorted[3] < 1e-5 || sorted[0] - sorted[1] < 1e-5 || sorted[1] - sorted[2] < 1e-5) continue;
        ++checked;
        const auto S = topk64(s, 3);
        for (std::size_t j = 0; j < 3; ++j) CHECK(o.idx[t * 3 + j] == static_cast<std::int32_t>(S[j]));
        for (std::size_t j = 0; j < 3; ++j) CHECK(std::fabs(o.w[t * 3 + j] - p[S[j]]) <= 1e-5 * p[S[j]]);
    }
    CHECK(checked > T / 2);

    std::vector<float> b{0.5f, 0.0f, -1.0f, 0.25f};
    const std::vector<std::size_t> load{5, 1, 3, 3};  // mean 3
    update_expert_bias(as_span(b), as_cspan(load), 0.125f);
    CHECK(b == std::vector<float>{0.375f, 0.125f, -1.0f, 0.25f});
}

/// dL/dlogits in float64 as an explicit Jacobian: dl_e = sum_j g_j dw_j/dl_e (+ the aux loss's term).
std::vector<double> route_grad64(const std::vector<float>& logits, std::size_t T, std::size_t E, std::size_t k,
                                 gate_mode gate, const std::vector<std::int32_t>& idx, const std::vector<float>& gw,
                                 double aux_grad, const std::vector<std::size_t>& counts) {
    std::vector<double> dl(T * E, 0.0);
    for (std::size_t t = 0; t < T; ++t) {
        const float* l = logits.data() + t * E;
        const auto p = softmax64(l, E);
        auto dp = [&](std::size_t i, std::size_t e) { return p[i] * ((i == e) - p[e]); };  // dp_i / dl_e
        std::vector<std::size_t> S(k);
        for (std::size_t j = 0; j < k; ++j) S[j] = static_cast<std::size_t>(idx[t * k + j]);
        double z = 0.0;
        for (auto s : S) z += p[s];
        std::vector<float> sel(k);
        for (std::size_t j = 0; j < k; ++j) sel[j] = l[S[j]];
        const auto q = softmax64(sel.data(), k);
        for (std::size_t e = 0; e < E; ++e) {
            double acc = 0.0;
            for (std::size_t j = 0; j < k; ++j) {
                double J = 0.0;  // dw_j / dl_e
                if (gate == gate_mode::softmax_topk) {
                    J = dp(S[j], e);
                } else if (gate == gate_mode::softmax_topk_renormalized) {
                    double dz = 0.0;
                    for (auto s : S) dz += dp(s, e);
                    J = dp(S[j], e) / z - p[S[j]] * dz / (z * z);
                } else {
                    for (std::size_t m = 0; m < k; ++m)
                        if (S[m] == e) J += q[j] * ((j == m) - q[m]);
                }
                acc += gw[t * k + j] * J;
            }
            double aux = 0.0;  // E / T * sum_i f_i dp_i / dl_e
            for (std::size_t i = 0; i < E; ++i)
                aux += static_cast<double>(counts[i]) / static_cast<double>(T * k) * dp(i, e);
            dl[t * E + e] = acc + aux_grad * static_cast<double>(E) / static_cast<double>(T) * aux;
        }
    }
    return dl;
}

TEST_CASE("route_backward: dL/dlogits against a float64 Jacobian, every gate mode, with the aux loss") {
    auto g = octet_test::rng(15);
    const std::size_t T = 97, E = 12;
    auto logits = normal(g, T * E, 1.5f);
    for (std::size_t e = 0; e < E; ++e) logits[7 * E + e] = 1e-6f * static_cast<float>(e);  // near uniform
    for (gate_mode gm : {gate_mode::softmax_topk, gate_mode::softmax_topk_renormalized, gate_mode::topk_softmax})
        for (std::size_t k : {1, 3, 12})
            for (float aux_grad : {0.0f, 0.01f}) {
                INFO("gate=" << static_cast<int>(gm) << " k=" << k << " aux=" << aux_grad
                             << " seed=" << octet_test::run_seed());
                router_options opt;
                opt.k = k;
                opt.gate = gm;
                const routed o = run_route(on_host(), logits, T, E, opt);
                const auto gw = normal(g, T * k, 1.0f);
                std::vector<float> dl(T * E, -7.0f);
                route_backward(on_host(2), matrix_ref<const float>(logits.data(), T, E),
                               matrix_ref<const std::int32_t>(o.idx.data(), T, k),
                               matrix_ref<const float>(gw.data(), T, k), opt, matrix_ref<float>(dl.data(), T, E),
                               aux_grad, as_cspan(o.counts));
                const auto ref = route_grad64(logits, T, E, k, gm, o.idx, gw, aux_grad, o.counts);
                for (std::size_t t = 0; t < T; ++t) {
                    double scale = 1e-3 * aux_grad;
                    for (std::size_t j = 0; j < k; ++j) scale += std::fabs(gw[t * k + j]);
                    for (std::size_t e = 0; e < E; ++e) {
                        INFO("t=" << t << " e=" << e);
                        CHECK(std::fabs(dl[t * E + e] - ref[t * E + e]) <= 1e-5 * scale);
                    }
                }
                if (gm == gate_mode::topk_softmax && aux_grad == 0.0f && k < E) {
                    // experts outside the selection get nothing
                    for (std::size_t t = 0; t < T; ++t)
                        for (std::size_t e = 0; e < E; ++e)
                            if (std::find(o.idx.begin() + t * k, o.idx.begin() + (t + 1) * k,
                                          static_cast<std::int32_t>(e)) == o.idx.begin() + (t + 1) * k)
                                CHECK(dl[t * E + e] == 0.0f);
                }
            }
}

// ---- dispatch plan ------------------------------------------------------------------------------------

void check_plan_invariants(const std::vector<std::int32_t>& idx, std::size_t T, std::size_t k, std::size_t E,
                           const dispatch_plan_ref& p, const dispatch_result& r, std::size_t capacity) {
    std::vector<std::size_t> routed(E, 0), expect_dropped(E, 0);
    for (auto e : idx) ++routed[static_cast<std::size_t>(e)];
    std::size_t dropped = 0;
    for (std::size_t e = 0; e < E; ++e) {
        CHECK(p.group_sizes[e] == std::min(routed[e], capacity));
        CHECK(p.group_offsets[e + 1] == p.group_offsets[e] + p.group_sizes[e]);
        dropped += routed[e] - p.group_sizes[e];
    }
    CHECK(p.group_offsets[0] == 0);
    CHECK(r.rows == p.rows());
    CHECK(r.dropped == dropped);
    CHECK(r.rows + r.dropped == T * k);
    // stable: within an expert, assignments in increasing (token, slot) order, the first `capacity` of them
    std::vector<std::size_t> seen(E, 0);
    for (std::size_t a = 0; a < T * k; ++a) {
        const auto e = static_cast<std::size_t>(idx[a]);
        if (seen[e] < capacity) {
            REQUIRE(p.row_of[a] == static_cast<std::int32_t>(p.group_offsets[e] + seen[e]));
            CHECK(p.order[static_cast<std::size_t>(p.row_of[a])] == static_cast<std::int32_t>(a));
            CHECK(p.token_of_row(static_cast<std::size_t>(p.row_of[a])) == a / k);
        } else {
            CHECK(p.row_of[a] == -1);
        }
        ++seen[e];
    }
    for (std::size_t r2 = p.rows(); r2 < T * k; ++r2) CHECK(p.order[r2] == -1);
}

TEST_CASE("plan_dispatch: a stable counting sort by expert, its inverse, capacity (drop or error)") {
    auto g = octet_test::rng(21);
    const std::size_t T = 257, E = 9, k = 2;
    auto logits = normal(g, T * E, 1.0f);
    for (std::size_t t = 0; t < T; ++t) logits[t * E + 3] = -kInf;  // expert 3 receives no token
    router_options opt;
    opt.k = k;
    const routed o = run_route(on_host(), logits, T, E, opt);
    REQUIRE(o.counts[3] == 0);
    dispatch_plan plan(T, k, E);
    const matrix_ref<const std::int32_t> idx(o.idx.data(), T, k);
    {
        const dispatch_result r = plan_dispatch(idx, {}, plan.ref());
        check_plan_invariants(o.idx, T, k, E, plan.ref(), r, std::numeric_limits<std::size_t>::max());
        CHECK(r.dropped == 0);
        for (std::size_t e = 0; e < E; ++e) CHECK(plan.ref().group_sizes[e] == o.counts[e]);
    }
    for (std::size_t cap : {0, 1, 20, 60}) {
        INFO("capacity " << cap);
        dispatch_options d;
        d.capacity = cap;
        const dispatch_result r = plan_dispatch(idx, d, plan.ref());
        check_plan_invariants(o.idx, T, k, E, plan.ref(), r, cap);
    }
    dispatch_options strict;
    strict.capacity = 20;
    strict.overflow = capacity_policy::error;
    CHECK_THROWS_WITH_AS(plan_dispatch(idx, strict, plan.ref()), doctest::Contains("'opt.capacity'"), error);
    strict.capacity = *std::max_element(o.counts.begin(), o.counts.end());
    CHECK(plan_dispatch(idx, strict, plan.ref()).dropped == 0);
    // an expert twice in a token's slots, and zero tokens
    const std::vector<std::int32_t> dup{1, 1, 0, 1};
    dispatch_plan p2(2, 2, 3);
    const dispatch_result r2 = plan_dispatch(matrix_ref<const std::int32_t>(dup.data(), 2, 2), {}, p2.ref());
    check_plan_invariants(dup, 2, 2, 3, p2.ref(), r2, std::numeric_limits<std::size_t>::max());
    CHECK(p2.ref().group_sizes[2] == 0);
    dispatch_plan p0(0, 2, 3);
    CHECK(plan_dispatch(matrix_ref<const std::int32_t>(nullptr, 0, 2), {}, p0.ref()).rows == 0);
    CHECK(p0.ref().rows() == 0);
}

// ---- FP8 permute ----------------------------------------------------------------------------------------

/// Tokens: the library's edge mix, plus a zero row, a 1e-6 row and a row near E4M3's max (440 .. 448).
std::vector<float> token_rows(std::mt19937_64& g, std::size_t T, std::size_t d) {
    auto x = octet_test::with_edge_cases(g, T * d);
    std::fill(x.begin() + 2 * d, x.begin() + 3 * d, 0.0f);
    for (std::size_t c = 0; c < d; ++c) x[5 * d + c] *= 1e-6f;
    std::uniform_real_distribution<float> top(440.0f, 448.0f);
    for (std::size_t c = 0; c < d; ++c) x[7 * d + c] = (c & 1 ? -1.0f : 1.0f) * top(g);
    return x;
}

struct moe_case {
    std::size_t T = 70, d = 200, E = 6, k = 3;
    std::vector<float> x;
    routed o;
    dispatch_plan plan;
    explicit moe_case(std::uint64_t salt, std::size_t capacity = std::numeric_limits<std::size_t>::max()) {
        auto g = octet_test::rng(salt);
        x = token_rows(g, T, d);
        auto logits = normal(g, T * E, 1.0f);
        for (std::size_t t = 0; t < T; ++t) logits[t * E + 4] = -kInf;  // expert 4: no tokens
        router_options opt;
        opt.k = k;
        opt.gate = gate_mode::softmax_topk_renormalized;
        o = run_route(on_host(), logits, T, E, opt);
        plan = dispatch_plan(T, k, E);
        dispatch_options dopt;
        dopt.capacity = capacity;
        plan_dispatch(matrix_ref<const std::int32_t>(o.idx.data(), T, k), dopt, plan.ref());
    }
    std::vector<std::size_t> sizes() {
        auto p = plan.ref();
        return std::vector<std::size_t>(p.group_sizes.begin(), p.group_sizes.end());
    }
    std::vector<float> permuted() {
        std::vector<float> xs(plan.ref().rows() * d, -7.0f);
        permute_rows(on_host(), matrix_ref<const float>(x.data(), T, d), plan.ref(),
                     matrix_ref<float>(xs.data(), plan.ref().rows(), d));
        return xs;
    }
};

template <class R>
grouped_quantized_tensor<R> poisoned(const std::vector<std::size_t>& sizes, std::size_t d) {
    grouped_quantized_tensor<R> t(grouped_rows(as_cspan(sizes), d));
    auto ref = t.ref();
    if (t.layout().data_bytes) std::memset(ref.data, 0xAB, t.layout().data_bytes);
    if (t.layout().scale_bytes) std::memset(ref.scales, 0xCD, t.layout().scale_bytes);
    for (std::size_t gi = 0; gi < t.layout().size(); ++gi) ref.tensor_scales[gi] = -3.0f;
    return t;
}

template <class R, class B1, class B2>
bool same_group(quantized_ref<R, B1> a, quantized_ref<R, B2> b) {
    const quant_layout &la = a.layout, &lb = b.layout;
    if (la.rows != lb.rows || la.data_bytes != lb.data_bytes || la.scale_bytes != lb.scale_bytes) return false;
    if (la.rows == 0) return true;
    if (R::two_level && *a.tensor_scale != *b.tensor_scale) return false;
    return std::memcmp(a.data, b.data, la.data_bytes) == 0 && std::memcmp(a.scales, b.scales, la.scale_bytes) == 0;
}

/// The permuted copy equals quantize<R> of each expert's permuted float rows alone, scaled with X's amax
/// when R has a tensor-level scale; bytes moved as permute_traffic says.
template <class R>
void check_permute_bits(std::uint64_t salt, std::size_t capacity = std::numeric_limits<std::size_t>::max()) {
    INFO("recipe " << recipe_description<R>() << " capacity " << capacity << " seed=" << octet_test::run_seed());
    moe_case c(salt, capacity);
    quantized_tensor<R> xq(c.T, c.d);
    const quantize_result qr = quantize<R>(on_host(), matrix_ref<const float>(c.x.data(), c.T, c.d), xq.ref());
    const auto sizes = c.sizes();
    auto out = poisoned<R>(sizes, c.d);
    const permute_bytes moved = permute_quantized(on_host(3), xq.cref(), c.plan.ref(), out.ref());
    const auto xs = c.permuted();
    std::size_t begin = 0;
    for (std::size_t e = 0; e < sizes.size(); ++e) {
        INFO("expert " << e << " of " << sizes[e] << " rows");
        if (sizes[e]) {
            quantized_tensor<R> alone(sizes[e], c.d);
            quantize_options qo;
            if (R::is_per_tensor || R::two_level) qo.tensor_amax = qr.amax;
            quantize<R>(on_host(), matrix_ref<const float>(xs.data() + begin * c.d, sizes[e], c.d), alone.ref(), {},
                        qo);
            CHECK(same_group(out.cref().group(e), alone.cref()));
        }
        begin += sizes[e];
    }
    const permute_bytes expect = permute_traffic<R>(c.plan.ref().rows(), c.d);
    CHECK(moved.codes == expect.codes);
    CHECK(moved.scales == expect.scales);
    CHECK(moved.bf16 == c.plan.ref().rows() * c.d * 2);
    if (c.plan.ref().rows()) CHECK(moved.codes + moved.scales < moved.bf16 * 6 / 10);
}

TEST_CASE("permute_quantized: the permuted codes and scales are quantize's of the permuted rows, bit for bit") {
    check_permute_bits<recipes::blockwise_1x128>(31);
    check_permute_bits<recipes::mxfp8_e4m3>(32);
    check_permute_bits<recipes::rowwise_e4m3>(33);
    check_permute_bits<recipes::tensorwise_e4m3>(34);
    check_permute_bits<recipes::nvfp4>(35);
    check_permute_bits<recipes::blockwise_1x128>(36, 9);  // with dropped assignments
    check_permute_bits<recipes::mxfp8_e4m3>(37, 0);       // everything dropped: no rows
}

/// Keep-codes path against the float path: permute_rows, grouped_quantize, grouped_scaled_gemm.
template <class RA, class RB>
void check_grouped_gemm_path(std::uint64_t salt) {
    INFO("A: " << recipe_description<RA>() << ", B: " << recipe_description<RB>()
               << " seed=" << octet_test::run_seed());
    moe_case c(salt);
    auto g = octet_test::rng(salt + 100);
    const std::size_t N = 48;
    std::vector<quantized_tensor<RB>> w;
    std::vector<quantized_cref<RB>> wref;
    for (std::size_t e = 0; e < c.E; ++e) {
        const auto wf = octet_test::with_edge_cases(g, N * c.d, 0.05f);
        w.emplace_back(N, c.d);
        quantize<RB>(on_host(), matrix_ref<const float>(wf.data(), N, c.d), w.back().ref());
    }
    for (auto& t : w) wref.push_back(t.cref());
    const auto sizes = c.sizes();
    const std::size_t M = c.plan.ref().rows();

    quantized_tensor<RA> xq(c.T, c.d);
    quantize<RA>(on_host(), matrix_ref<const float>(c.x.data(), c.T, c.d), xq.ref());
    auto kept = poisoned<RA>(sizes, c.d);
    permute_quantized(on_host(), xq.cref(), c.plan.ref(), kept.ref());
    std::vector<float> y_kept(M * N, -7.0f);
    grouped_scaled_gemm(on_host(), kept.cref(), as_cspan(wref), matrix_ref<float>(y_kept.data(), M, N));

    const auto xs = c.permuted();
    grouped_quantized_tensor<RA> fresh(grouped_rows(as_cspan(sizes), c.d));
    grouped_quantize<RA>(on_host(), matrix_ref<const float>(xs.data(), M, c.d), as_cspan(sizes), fresh.ref());
    for (std::size_t e = 0; e < c.E; ++e) CHECK(same_group(kept.cref().group(e), fresh.cref().group(e)));
    std::vector<float> y_fresh(M * N, -9.0f);
    grouped_scaled_gemm(on_host(), fresh.cref(), as_cspan(wref), matrix_ref<float>(y_fresh.data(), M, N));
    CHECK(std::memcmp(y_kept.data(), y_fresh.data(), y_kept.size() * sizeof(float)) == 0);
    CHECK(sizes[4] == 0);
}

TEST_CASE("permute_quantized feeds grouped_scaled_gemm: the same bits as quantizing the sorted float rows") {
    check_grouped_gemm_path<recipes::blockwise_1x128, recipes::blockwise_128x128>(41);
    check_grouped_gemm_path<recipes::mxfp8_e4m3, recipes::mxfp8_e4m3>(42);
    check_grouped_gemm_path<recipes::rowwise_e4m3, recipes::rowwise_e4m3>(43);
}

// ---- combine ------------------------------------------------------------------------------------------

TEST_CASE("combine and its backward against float64, bf16 output, dropped slots") {
    for (std::size_t capacity : {std::numeric_limits<std::size_t>::max(), std::size_t{6}}) {
        INFO("capacity " << capacity << " seed=" << octet_test::run_seed());
        moe_case c(51, capacity);
        auto g = octet_test::rng(52);
        const auto p = c.plan.ref();
        const std::size_t M = p.rows(), T = c.T, k = c.k, d = 64;
        auto y = normal(g, M * d, 1.0f);
        if (M > 3) y[3 * d + 1] = 3e4f;  // a large expert output
        const matrix_ref<const float> w(c.o.w.data(), T, k);
        std::vector<float> out(T * d, -7.0f);
        combine(on_host(3), matrix_ref<const float>(y.data(), M, d), w, p, matrix_ref<float>(out.data(), T, d));
        std::vector<bf16> out16(T * d, bf16{0xFFFF});
        combine(on_host(), matrix_ref<float>(y.data(), M, d), w, p,
                matrix_ref<bf16>(out16.data(), T, d));  // y not const
        std::size_t fully_dropped = 0;
        for (std::size_t t = 0; t < T; ++t) {
            bool any = false;
            for (std::size_t j = 0; j < k; ++j) any |= p.row_of[t * k + j] >= 0;
            fully_dropped += !any;
            for (std::size_t col = 0; col < d; ++col) {
                double ref = 0.0, mag = 0.0;
                for (std::size_t j = 0; j < k; ++j) {
                    const std::int32_t r = p.row_of[t * k + j];
                    if (r < 0) continue;
                    const double term =
                        static_cast<double>(c.o.w[t * k + j]) * y[static_cast<std::size_t>(r) * d + col];
                    ref += term;
                    mag += std::fabs(term);
                }
                CHECK(std::fabs(out[t * d + col] - ref) <= 4e-7 * mag);
                CHECK(out16[t * d + col].bits == to_bf16(out[t * d + col]).bits);
                if (!any) CHECK(out[t * d + col] == 0.0f);
            }
        }
        if (capacity == 6) CHECK(fully_dropped > 0);

        // backward
        const auto dout = normal(g, T * d, 1.0f);
        std::vector<float> dy(M * d, -7.0f), dw(T * k, -7.0f);
        combine_backward(on_host(2), matrix_ref<const float>(dout.data(), T, d),
                         matrix_ref<const float>(y.data(), M, d), w, p, matrix_ref<float>(dy.data(), M, d),
                         matrix_ref<float>(dw.data(), T, k));
        std::vector<int> written(M, 0);
        for (std::size_t t = 0; t < T; ++t)
            for (std::size_t j = 0; j < k; ++j) {
                const std::int32_t ri = p.row_of[t * k + j];
                if (ri < 0) {
                    CHECK(dw[t * k + j] == 0.0f);
                    continue;
                }
                const auto r = static_cast<std::size_t>(ri);
                ++written[r];
                double dot = 0.0, mag = 0.0;
                for (std::size_t col = 0; col < d; ++col) {
                    // one float product, rounded once: exact against float64 rounded to float
                    CHECK(dy[r * d + col] ==
                          static_cast<float>(static_cast<double>(c.o.w[t * k + j]) * dout[t * d + col]));
                    dot += static_cast<double>(dout[t * d + col]) * y[r * d + col];
                    mag += std::fabs(static_cast<double>(dout[t * d + col]) * y[r * d + col]);
                }
                CHECK(std::fabs(dw[t * k + j] - dot) <= 1e-7 * mag + 1e-30);
            }
        CHECK(std::all_of(written.begin(), written.end(), [](int n) { return n == 1; }));
        // bf16 expert outputs and bf16 dy: the float path on the bf16 values, rounded
        std::vector<bf16> y16(M * d), dy16(M * d, bf16{0xFFFF});
        std::vector<float> y16f(M * d), dw16(T * k);
        for (std::size_t i = 0; i < M * d; ++i) y16f[i] = to_float(y16[i] = to_bf16(y[i]));
        combine_backward(on_host(), matrix_ref<const float>(dout.data(), T, d),
                         matrix_ref<const bf16>(y16.data(), M, d), w, p, matrix_ref<bf16>(dy16.data(), M, d),
                         matrix_ref<float>(dw16.data(), T, k));
        std::vector<float> dw_ref(T * k);
        combine_backward(on_host(), matrix_ref<const float>(dout.data(), T, d),
                         matrix_ref<const float>(y16f.data(), M, d), w, p, matrix_ref<float>(dy.data(), M, d),
                         matrix_ref<float>(dw_ref.data(), T, k));
        CHECK(dw16 == dw_ref);
        for (std::size_t i = 0; i < M * d; ++i) CHECK(dy16[i].bits == to_bf16(dy[i]).bits);
    }
}

// ---- memory ---------------------------------------------------------------------------------------------

TEST_CASE("with a pool and a lent allocator, a whole routing step allocates nothing behind the caller") {
    moe_case c(61);
    using R = recipes::mxfp8_e4m3;
    const std::size_t T = c.T, E = c.E, k = c.k, d = c.d;
    auto g = octet_test::rng(62);
    const auto logits = normal(g, T * E, 1.0f);
    std::vector<std::int32_t> idx(T * k);
    std::vector<float> w(T * k), dl(T * E);
    std::vector<std::size_t> counts(E);
    router_options opt;
    opt.k = k;
    thread_pool pool(3);
    octet_test::lent_allocator lent;
    const host_executor ex = with_allocator(on_host(pool), lent.ref());
    quantized_tensor<R> xq(T, d);
    quantize<R>(on_host(), matrix_ref<const float>(c.x.data(), T, d), xq.ref());
    // the plan and the grouped copy are sized from the routing here, outside the counted region
    route(ex, matrix_ref<const float>(logits.data(), T, E), opt, matrix_ref<std::int32_t>(idx.data(), T, k),
          matrix_ref<float>(w.data(), T, k), as_span(counts));
    dispatch_plan plan(T, k, E);
    plan_dispatch(matrix_ref<const std::int32_t>(idx.data(), T, k), {}, plan.ref());
    const std::size_t M = plan.ref().rows();
    grouped_quantized_tensor<R> xs(grouped_rows(plan.ref().group_sizes, d));
    std::vector<float> y = normal(g, M * d, 1.0f), out(T * d), dy(M * d), dw(T * k);
    lent.reset_peak();
    {
        octet_test::global_allocations counted;
        route(ex, matrix_ref<const float>(logits.data(), T, E), opt, matrix_ref<std::int32_t>(idx.data(), T, k),
              matrix_ref<float>(w.data(), T, k), as_span(counts));
        plan_dispatch(matrix_ref<const std::int32_t>(idx.data(), T, k), {}, plan.ref());
        permute_quantized(ex, xq.cref(), plan.ref(), xs.ref());
        combine(ex, matrix_ref<const float>(y.data(), M, d), matrix_ref<const float>(w.data(), T, k), plan.ref(),
                matrix_ref<float>(out.data(), T, d));
        combine_backward(ex, matrix_ref<const float>(out.data(), T, d), matrix_ref<const float>(y.data(), M, d),
                         matrix_ref<const float>(w.data(), T, k), plan.ref(), matrix_ref<float>(dy.data(), M, d),
                         matrix_ref<float>(dw.data(), T, k));
        route_backward(ex, matrix_ref<const float>(logits.data(), T, E),
                       matrix_ref<const std::int32_t>(idx.data(), T, k), matrix_ref<const float>(dw.data(), T, k), opt,
                       matrix_ref<float>(dl.data(), T, E), 0.01f, as_cspan(counts));
        CHECK(counted.count() == 0);
    }
    CHECK(lent.allocations == 3);  // route twice (before and in the counted region), route_backward once
    CHECK(lent.balanced());
    CHECK(lent.peak == std::max(route_scratch_bytes(T, E), route_backward_scratch_bytes(ex, T, E)));
}

// ---- bad arguments ------------------------------------------------------------------------------------

TEST_CASE("bad arguments are refused by name") {
    const std::size_t T = 4, E = 3;
    std::vector<float> logits(T * E, 0.5f), w(T * 2);
    std::vector<std::int32_t> idx(T * 2);
    std::vector<std::size_t> counts(E);
    const matrix_ref<const float> L(logits.data(), T, E);
    router_options opt;
    opt.k = 0;
    CHECK_THROWS_WITH_AS(route(on_host(), L, opt, matrix_ref<std::int32_t>(idx.data(), T, 0),
                               matrix_ref<float>(w.data(), T, 0), as_span(counts)),
                         doctest::Contains("'opt.k'"), error);
    opt.k = 4;
    CHECK_THROWS_WITH_AS(route(on_host(), L, opt, matrix_ref<std::int32_t>(idx.data(), 2, 4),
                               matrix_ref<float>(w.data(), 2, 4), as_span(counts)),
                         doctest::Contains("'opt.k'"), error);
    opt.k = 2;
    CHECK_THROWS_WITH_AS(route(on_host(), L, opt, matrix_ref<std::int32_t>(idx.data(), T, 1),
                               matrix_ref<float>(w.data(), T, 2), as_span(counts)),
                         doctest::Contains("'indices'"), error);
    CHECK_THROWS_WITH_AS(route(on_host(), L, opt, matrix_ref<std::int32_t>(idx.data(), T, 2),
                               matrix_ref<float>(w.data(), T, 1), as_span(counts)),
                         doctest::Contains("'weights'"), error);
    std::vector<std::size_t> short_counts(E - 1);
    CHECK_THROWS_WITH_AS(route(on_host(), L, opt, matrix_ref<std::int32_t>(idx.data(), T, 2),
                               matrix_ref<float>(w.data(), T, 2), as_span(short_counts)),
                         doctest::Contains("'counts'"), error);
    const std::vector<float> bias(E + 1, 0.0f);
    router_options biased = opt;
    biased.selection_bias = as_cspan(bias);
    CHECK_THROWS_WITH_AS(route(on_host(), L, biased, matrix_ref<std::int32_t>(idx.data(), T, 2),
                               matrix_ref<float>(w.data(), T, 2), as_span(counts)),
                         doctest::Contains("'opt.selection_bias'"), error);
    route(on_host(), L, opt, matrix_ref<std::int32_t>(idx.data(), T, 2), matrix_ref<float>(w.data(), T, 2),
          as_span(counts));
    std::vector<float> dl(T * E);
    CHECK_THROWS_WITH_AS(
        route_backward(on_host(), L, matrix_ref<const std::int32_t>(idx.data(), T, 2),
                       matrix_ref<const float>(w.data(), T, 2), opt, matrix_ref<float>(dl.data(), T, E), 0.1f),
        doctest::Contains("'counts'"), error);
    CHECK_THROWS_WITH_AS(
        route_backward(on_host(), L, matrix_ref<const std::int32_t>(idx.data(), T, 2),
                       matrix_ref<const float>(w.data(), T, 2), opt, matrix_ref<float>(dl.data(), T, E - 1)),
        doctest::Contains("'dlogits'"), error);
    std::vector<std::int32_t> bad_idx = idx;
    bad_idx[3] = static_cast<std::int32_t>(E);
    CHECK_THROWS_WITH_AS(
        route_backward(on_host(), L, matrix_ref<const std::int32_t>(bad_idx.data(), T, 2),
                       matrix_ref<const float>(w.data(), T, 2), opt, matrix_ref<float>(dl.data(), T, E)),
        doctest::Contains("'indices'"), error);
    std::vector<float> b2(2);
    CHECK_THROWS_WITH_AS(update_expert_bias(as_span(b2), as_cspan(counts), 0.1f), doctest::Contains("'counts'"), error);

    // the plan
    dispatch_plan plan(T, 2, E);
    CHECK_THROWS_WITH_AS(plan_dispatch(matrix_ref<const std::int32_t>(bad_idx.data(), T, 2), {}, plan.ref()),
                         doctest::Contains("'indices'"), error);
    bad_idx[3] = -1;
    CHECK_THROWS_WITH_AS(plan_dispatch(matrix_ref<const std::int32_t>(bad_idx.data(), T, 2), {}, plan.ref()),
                         doctest::Contains("'indices'"), error);
    CHECK_THROWS_WITH_AS(plan_dispatch(matrix_ref<const std::int32_t>(idx.data(), T / 2, 4), {}, plan.ref()),
                         doctest::Contains("'indices'"), error);
    dispatch_plan other(T, 2, E + 1);
    auto mixed = plan.ref();
    mixed.group_sizes = other.ref().group_sizes;
    CHECK_THROWS_WITH_AS(plan_dispatch(matrix_ref<const std::int32_t>(idx.data(), T, 2), {}, mixed),
                         doctest::Contains("'plan'"), error);
    plan_dispatch(matrix_ref<const std::int32_t>(idx.data(), T, 2), {}, plan.ref());

    // permute: a recipe whose blocks span rows; x of other tokens; an output laid out for other sizes
    const std::size_t d = 32;
    std::vector<float> x(T * d, 1.0f);
    quantized_tensor<recipes::blockwise_128x128> x128(T, d);
    quantize<recipes::blockwise_128x128>(on_host(), matrix_ref<const float>(x.data(), T, d), x128.ref());
    std::vector<std::size_t> sizes(plan.ref().group_sizes.begin(), plan.ref().group_sizes.end());
    grouped_quantized_tensor<recipes::blockwise_128x128> o128(grouped_rows(as_cspan(sizes), d));
    CHECK_THROWS_WITH_AS(permute_quantized(on_host(), x128.cref(), plan.ref(), o128.ref()),
                         doctest::Contains("row-local"), error);
    using R = recipes::blockwise_1x128;
    quantized_tensor<R> xq(T, d), xq3(T - 1, d);
    quantize<R>(on_host(), matrix_ref<const float>(x.data(), T, d), xq.ref());
    grouped_quantized_tensor<R> good(grouped_rows(as_cspan(sizes), d));
    CHECK_THROWS_WITH_AS(permute_quantized(on_host(), xq3.cref(), plan.ref(), good.ref()), doctest::Contains("'x'"),
                         error);
    std::vector<std::size_t> wrong_sizes = sizes;
    wrong_sizes[0] += 1;
    wrong_sizes[1] -= std::min<std::size_t>(wrong_sizes[1], 1);
    grouped_quantized_tensor<R> wrong(grouped_rows(as_cspan(wrong_sizes), d));
    CHECK_THROWS_WITH_AS(permute_quantized(on_host(), xq.cref(), plan.ref(), wrong.ref()), doctest::Contains("'out'"),
                         error);

    // combine
    const std::size_t M = plan.ref().rows();
    std::vector<float> y(M * d), out(T * d);
    CHECK_THROWS_WITH_AS(
        combine(on_host(), matrix_ref<const float>(y.data(), M - 1, d), matrix_ref<const float>(w.data(), T, 2),
                plan.ref(), matrix_ref<float>(out.data(), T, d)),
        doctest::Contains("'y'"), error);
    CHECK_THROWS_WITH_AS(
        combine(on_host(), matrix_ref<const float>(y.data(), M, d), matrix_ref<const float>(w.data(), T, 1), plan.ref(),
                matrix_ref<float>(out.data(), T, d)),
        doctest::Contains("'weights'"), error);
    std::vector<float> dy(M * d), dw(T * 2);
    CHECK_THROWS_WITH_AS(
        combine_backward(on_host(), matrix_ref<const float>(out.data(), T, d), matrix_ref<const float>(y.data(), M, d),
                         matrix_ref<const float>(w.data(), T, 2), plan.ref(), matrix_ref<float>(dy.data(), M, d - 1),
                         matrix_ref<float>(dw.data(), T, 2)),
        doctest::Contains("'dy'"), error);
}

}  // namespace nn_moe_routing_test
