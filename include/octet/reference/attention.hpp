// octet/reference/attention.hpp: float64 attention forward and backward, written from the
// definitions (not from the tiled algorithm), for tests, benchmarks and users.
//
//   forward:  S = scale * Q K^T (masked entries -Inf), P = softmax_row(S), O = P V, L = logsumexp_row(S)
//   backward: dV = P^T dO, dP = dO V^T, D_i = sum_j P_ij dP_ij (exact), dS = P * (dP - D),
//             dQ = scale * dS K, dK = scale * dS^T Q
//
// Layout as octet::attention_forward: a batch of sequences packed along tokens,
// q/dout/o/dq [total_q][heads_q][head_dim], k/v/dk/dv [total_k][heads_kv][head_dim], lse and
// delta [heads_q][total_q]; sequence b holds tokens [cu_q[b], cu_q[b+1]) and keys
// [cu_k[b], cu_k[b+1]). Query head h reads key/value head h / (heads_q / heads_kv) (grouped-query
// attention). Causal masks align at the bottom right (query i sees key j iff j <= i + Lk - Lq).
// A query row that sees no key has O = 0, L = +Inf and zero gradients. In exact arithmetic
// D_i = rowsum(dO_i * O_i); here it is computed as sum_j P_ij dP_ij in float64.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace octet {
namespace reference {

struct attention_problem {
    std::vector<int> cu_q, cu_k;  ///< batch + 1 offsets each (cu_k empty: same as cu_q)
    int heads_q = 1, heads_kv = 1, head_dim = 1;
    double scale = 0.0;  ///< 0: 1 / sqrt(head_dim)
    bool causal = false;

    const std::vector<int>& keys() const { return cu_k.empty() ? cu_q : cu_k; }
    int total_q() const { return cu_q.empty() ? 0 : cu_q.back(); }
    int total_k() const { return keys().empty() ? 0 : keys().back(); }
    double softmax_scale() const { return scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim)); }
};

struct attention_result {
    std::vector<double> o, lse;      ///< forward
    std::vector<double> dq, dk, dv;  ///< backward (empty when no dout was given)
    std::vector<double> delta;       ///< exact D_i, [heads_q][total_q]
    std::vector<double> kbar;        ///< attention-weighted mean key sum_j P_ij K_j, like q
};

/// The whole computation in float64. `dout` may be empty (forward only).
inline attention_result attention(const attention_problem& pr, const std::vector<double>& q,
                                  const std::vector<double>& k, const std::vector<double>& v,
                                  const std::vector<double>& dout = {}) {
    const int H = pr.heads_q, G = pr.heads_q / pr.heads_kv, Hk = pr.heads_kv, d = pr.head_dim;
    const auto& cuk = pr.keys();
    const int Tq = pr.total_q(), Tk = pr.total_k();
    const double s = pr.softmax_scale();
    const bool bwd = !dout.empty();
    attention_result r;
    r.o.assign(static_cast<std::size_t>(Tq) * H * d, 0.0);
    r.kbar.assign(r.o.size(), 0.0);
    r.lse.assign(static_cast<std::size_t>(H) * Tq, std::numeric_limits<double>::infinity());
    if (bwd) {
        r.dq.assign(r.o.size(), 0.0);
        r.dk.assign(static_cast<std::size_t>(Tk) * Hk * d, 0.0);
        r.dv.assign(r.dk.size(), 0.0);
        r.delta.assign(r.lse.size(), 0.0);
    }
    auto qi = [&](int t, int h, int c) { return (static_cast<std::size_t>(t) * H + h) * d + c; };
    auto ki = [&](int t, int h, int c) { return (static_cast<std::size_t>(t) * Hk + h) * d + c; };
    std::vector<double> P, dP;
    for (std::size_t b = 0; b + 1 < pr.cu_q.size(); ++b) {
        const int q0 = pr.cu_q[b], lq = pr.cu_q[b + 1] - q0, k0 = cuk[b], lk = cuk[b + 1] - k0;
        for (int h = 0; h < H; ++h) {
            const int hk = h / G;
            P.assign(static_cast<std::size_t>(lq) * lk, 0.0);
            dP.assign(P.size(), 0.0);
            for (int i = 0; i < lq; ++i) {
                double m = -std::numeric_limits<double>::infinity();
                std::vector<double> srow(lk, -std::numeric_limits<double>::infinity());
                for (int j = 0; j < lk; ++j) {
                    if (pr.causal && j > i + lk - lq) continue;
                    double acc = 0.0;
                    for (int c = 0; c < d; ++c) acc += q[qi(q0 + i, h, c)] * k[ki(k0 + j, hk, c)];
                    srow[j] = s * acc;
                    m = std::max(m, srow[j]);
                }
                if (m == -std::numeric_limits<double>::infinity()) continue;  // sees no key
                double l = 0.0;
                for (int j = 0; j < lk; ++j) l += std::exp(srow[j] - m);
                r.lse[static_cast<std::size_t>(h) * Tq + q0 + i] = m + std::log(l);
                for (int j = 0; j < lk; ++j) {
                    const double p = std::exp(srow[j] - m) / l;
                    P[static_cast<std::size_t>(i) * lk + j] = p;
                    if (p == 0.0) continue;
                    for (int c = 0; c < d; ++c) {
                        r.o[qi(q0 + i, h, c)] += p * v[ki(k0 + j, hk, c)];
                        r.kbar[qi(q0 + i, h, c)] += p * k[ki(k0 + j, hk, c)];
                    }
                }
            }
            if (!bwd) continue;
            for (int i = 0; i < lq; ++i) {
                double D = 0.0;
                for (int j = 0; j < lk; ++j) {
                    const double p = P[static_cast<std::size_t>(i) * lk + j];
                    if (p == 0.0) continue;
                    double acc = 0.0;
                    for (int c = 0; c < d; ++c) acc += dout[qi(q0 + i, h, c)] * v[ki(k0 + j, hk, c)];
                    dP[static_cast<std::size_t>(i) * lk + j] = acc;
                    D += p * acc;
                    for (int c = 0; c < d; ++c) r.dv[ki(k0 + j, hk, c)] += p * dout[qi(q0 + i, h, c)];
                }
                r.delta[static_cast<std::size_t>(h) * Tq + q0 + i] = D;
                for (int j = 0; j < lk; ++j) {
                    const double p = P[static_cast<std::size_t>(i) * lk + j];
                    if (p == 0.0) continue;
                    const double ds = p * (dP[static_cast<std::size_t>(i) * lk + j] - D);
                    for (int c = 0; c < d; ++c) {
                        r.dq[qi(q0 + i, h, c)] += s * ds * k[ki(k0 + j, hk, c)];
                        r.dk[ki(k0 + j, hk, c)] += s * ds * q[qi(q0 + i, h, c)];
                    }
                }
            }
        }
    }
    return r;
}

}  // namespace reference
}  // namespace octet
