// Where the stale delta matters (issue 12, "Delta matching, honestly"): octet's host FP8 attention
// backward against float64 on the same FP8 operands, over sequence length, V-scale granularity and
// delta mode, with the row sums of dS both as formed (float) and as the dQ and dK products used it
// (dequantized from its E4M3 codes).
//
//   ./bench_attention_delta_study [--seed S] [--max-len L] [--cost-len L] [--reps N]
//
// Inputs: one causal sequence per length (256 to 4096), heads_q = heads_kv = 2, head_dim 64; Q, K,
// dO in E4M3 with one scale per token and head, V per token and head or per head; O stored as float.
// Keys share a mean direction mu per head (as trained keys do); a query is q_std * noise plus a
// random share beta_i of mu, so rows with a large beta attend sharply to the keys of large norm.
// Two regimes: "sharp" (q_std 1.5, beta in [0, 0.5)) and "flat" (q_std 0.5, beta in [0, 0.1)).
// dO is Gaussian. Every token has its own magnitude in [0.5, 2). n_eff: the median over rows of
// 1 / sum_j P_ij^2 (float64 P), the number of keys a row effectively attends to.
//
// Per row i (query rows that see a key): Kbar_i = sum_j P_ij K_j (float64 P); the dQ error along it,
// b_i = (dQ_i - dQref_i) . Kbar_i / |Kbar_i|, is reported as mean_i b_i (the systematic part) and
// sqrt(mean_i b_i^2), both over sqrt(mean_i |dQref_i|^2). res: attention_stats::residual_rel()
// (dS as formed, before rounding); res_dq / res_dk: residual_dq_rel() / residual_dk_rel() (dS as
// the dQ / dK products used it). "fold" columns: dQ with the quantized row residual folded back,
// dQ_i - scale * rq_i * Kbar_i (attention_backward_options::fold_dq_residual); dK err: dK's relative
// L2 error (the fold does not change dK). Everything runs on one thread.
//
// The cost table: CPU seconds of one backward at --cost-len (default 2048), telemetry off, the
// four variants alternated --reps times (default 3), the minimum of each.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "octet/attention/attention.hpp"
#include "octet/quant/quantize.hpp"
#include "octet/reference/attention.hpp"

namespace {
using namespace octet;
using clock_type = std::chrono::steady_clock;

constexpr int head_dim = 64;
using per_token = recipe<e4m3, block<1, head_dim>, scale::amax_ratio<0>>;
using per_head = recipe<e4m3, block<full, head_dim>, scale::amax_ratio<0>>;

template <class R>
struct fp8 {
    quantized_tensor<R> q;
    std::vector<double> values;  // dequantized, for the float64 reference
};

template <class R>
fp8<R> quantize_tensor(const std::vector<float>& x, std::size_t rows, std::size_t cols) {
    fp8<R> t{quantized_tensor<R>(rows, cols), {}};
    quantize<R>(on_host(), matrix_ref<const float>(x.data(), rows, cols), t.q.ref());
    std::vector<float> y(x.size());
    dequantize(on_host(), t.q.cref(), matrix_ref<float>(y.data(), rows, cols));
    t.values.assign(y.begin(), y.end());
    return t;
}

struct inputs {
    int len = 0, heads = 0;
    std::vector<float> q, k, v, dout;
};

struct regime {
    const char* name;
    float q_std, beta_max;
};

inputs make_inputs(int len, int heads, const regime& rg, std::uint64_t seed) {
    inputs in;
    in.len = len;
    in.heads = heads;
    std::mt19937_64 g(seed * 1000003u + static_cast<std::uint64_t>(len));
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::uniform_real_distribution<float> mag(0.5f, 2.0f), share(0.0f, rg.beta_max);
    const std::size_t cols = static_cast<std::size_t>(heads) * head_dim, size = static_cast<std::size_t>(len) * cols;
    std::vector<float> mu(cols);
    for (auto& x : mu) x = n(g);
    in.q.resize(size);
    in.k.resize(size);
    in.v.resize(size);
    in.dout.resize(size);
    for (int t = 0; t < len; ++t)
        for (int h = 0; h < heads; ++h) {
            const float aq = mag(g), ak = mag(g), av = mag(g), ad = mag(g), beta = share(g);
            for (int e = 0; e < head_dim; ++e) {
                const std::size_t c = static_cast<std::size_t>(h) * head_dim + e, i = t * cols + c;
                in.q[i] = aq * (rg.q_std * n(g) + beta * mu[c]);
                in.k[i] = ak * (n(g) + mu[c]);
                in.v[i] = av * n(g);
                in.dout[i] = ad * n(g);
            }
        }
    return in;
}

double rel_l2(const std::vector<float>& a, const std::vector<double>& b) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return std::sqrt(num / den);
}

struct row_measure {
    double bias_mean = 0, bias_rms = 0, err = 0;  // relative to rms |dQref_i|; err: relative L2 of dQ
};

/// The dQ error along Kbar_i, over rows that see a key.
row_measure measure(const std::vector<float>& dq, const reference::attention_result& ref, std::size_t rows) {
    double sum_b = 0, sum_b2 = 0, ref2 = 0, err2 = 0;
    std::size_t n = 0;
    for (std::size_t r = 0; r < rows; ++r) {  // r = token * heads + head, like the layout
        double kk = 0, dk = 0, rr = 0, ee = 0;
        for (int e = 0; e < head_dim; ++e) {
            const std::size_t i = r * head_dim + e;
            const double diff = dq[i] - ref.dq[i];
            kk += ref.kbar[i] * ref.kbar[i];
            dk += diff * ref.kbar[i];
            rr += ref.dq[i] * ref.dq[i];
            ee += diff * diff;
        }
        ref2 += rr;
        err2 += ee;
        if (!(kk > 0)) continue;
        const double b = dk / std::sqrt(kk);
        sum_b += b;
        sum_b2 += b * b;
        ++n;
    }
    row_measure m;
    const double scale = std::sqrt(ref2 / static_cast<double>(rows));
    m.bias_mean = sum_b / n / scale;
    m.bias_rms = std::sqrt(sum_b2 / n) / scale;
    m.err = std::sqrt(err2 / ref2);
    return m;
}

double cpu_seconds() {
    return static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
}

struct backward_run {
    std::vector<float> dq, dk;
    attention_stats st;
    double cpu = 0;
};

struct options {
    std::uint64_t seed = 2026;
    int max_len = 4096, cost_len = 2048, reps = 3;
};

/// The FP8 operands of one problem and the forward's O and L.
template <class VR>
struct layer {
    int len, H;
    std::size_t cols, rows;
    fp8<per_token> Q, K, dO;
    fp8<VR> V;
    std::vector<std::int32_t> cu;
    attention_shape shape;
    std::vector<float> o, lse;

    explicit layer(const inputs& in)
        : len(in.len),
          H(in.heads),
          cols(static_cast<std::size_t>(H) * head_dim),
          rows(static_cast<std::size_t>(len) * H),
          Q(quantize_tensor<per_token>(in.q, len, cols)),
          K(quantize_tensor<per_token>(in.k, len, cols)),
          dO(quantize_tensor<per_token>(in.dout, len, cols)),
          V(quantize_tensor<VR>(in.v, len, cols)),
          cu{0, len},
          o(rows * head_dim),
          lse(rows) {
        shape.cu_seqlens_q = span<const std::int32_t>(cu.data(), cu.size());
        shape.heads_q = H;
        shape.heads_kv = H;
        shape.head_dim = head_dim;
        attention_forward(on_host(1), shape, Q.q.cref(), K.q.cref(), V.q.cref(), matrix_ref<float>(o.data(), len, cols),
                          span<float>(lse.data(), lse.size()), {attention_mask::causal});
    }
    layer(const layer&) = delete;
    layer& operator=(const layer&) = delete;

    backward_run backward(delta_mode mode, bool fold, bool telemetry) const {
        backward_run b;
        b.dq.resize(rows * head_dim);
        b.dk.resize(b.dq.size());
        std::vector<float> dv(b.dq.size());
        attention_backward_options bo;
        bo.mask = attention_mask::causal;
        bo.delta = mode;
        bo.telemetry = telemetry;
        bo.fold_dq_residual = fold;
        const double t0 = cpu_seconds();
        b.st = attention_backward(
            on_host(1), shape, Q.q.cref(), K.q.cref(), V.q.cref(), matrix_ref<const float>(o.data(), len, cols),
            span<const float>(lse.data(), lse.size()), dO.q.cref(), matrix_ref<float>(b.dq.data(), len, cols),
            matrix_ref<float>(b.dk.data(), len, cols), matrix_ref<float>(dv.data(), len, cols), bo);
        b.cpu = cpu_seconds() - t0;
        return b;
    }
};

template <class VR>
void study(const inputs& in, const char* regime_name, const char* v_label) {
    const layer<VR> L(in);
    const int len = L.len, H = L.H;
    const std::size_t rows = L.rows;
    reference::attention_problem pr;
    pr.cu_q.assign(L.cu.begin(), L.cu.end());
    pr.heads_q = H;
    pr.heads_kv = H;
    pr.head_dim = head_dim;
    pr.causal = true;
    const auto ref = reference::attention(pr, L.Q.values, L.K.values, L.V.values, L.dO.values);

    std::vector<double> neff;
    neff.reserve(rows);
    const double sm = 1.0 / std::sqrt(static_cast<double>(head_dim));
    for (int h = 0; h < H; ++h)
        for (int i = 0; i < len; ++i) {
            double p2 = 0;
            const double lse = ref.lse[static_cast<std::size_t>(h) * len + i];
            for (int j = 0; j <= i; ++j) {
                double s = 0;
                for (int e = 0; e < head_dim; ++e)
                    s += L.Q.values[(static_cast<std::size_t>(i) * H + h) * head_dim + e] *
                         L.K.values[(static_cast<std::size_t>(j) * H + h) * head_dim + e];
                const double p = std::exp(sm * s - lse);
                p2 += p * p;
            }
            neff.push_back(1.0 / p2);
        }
    std::nth_element(neff.begin(), neff.begin() + neff.size() / 2, neff.end());

    for (const delta_mode mode : {delta_mode::from_output, delta_mode::matched}) {
        const backward_run plain = L.backward(mode, false, true), folded = L.backward(mode, true, true);
        const row_measure m = measure(plain.dq, ref, rows), f = measure(folded.dq, ref, rows);
        std::printf(
            "| %-5s | %4d | %-9s | %5.1f | %-11s | %8.2e | %8.2e | %8.2e | %+8.4f | %7.4f | %+8.4f | %7.4f | %6.4f | "
            "%6.4f | %6.4f |\n",
            regime_name, len, v_label, neff[neff.size() / 2], mode == delta_mode::matched ? "matched" : "from_output",
            plain.st.residual_rel(), plain.st.residual_dq_rel(), plain.st.residual_dk_rel(), m.bias_mean, m.bias_rms,
            f.bias_mean, f.bias_rms, m.err, f.err, rel_l2(plain.dk, ref.dk));
        std::fflush(stdout);
    }
}

/// CPU seconds of the four backward variants, telemetry off, alternated; minimum over reps.
void cost(const options& opt, const inputs& in) {
    const layer<per_token> L(in);
    double best[2][2] = {{1e30, 1e30}, {1e30, 1e30}};
    for (int r = 0; r < opt.reps; ++r)
        for (int m = 0; m < 2; ++m)
            for (int f = 0; f < 2; ++f)
                best[m][f] = std::min(best[m][f],
                                      L.backward(m ? delta_mode::matched : delta_mode::from_output, f == 1, false).cpu);
    std::printf("\nCost: one backward, %d tokens, %d heads, V per token, telemetry off, CPU seconds (min of %d)\n\n",
                L.len, L.H, opt.reps);
    std::printf("| delta | plain (s) | with fold (s) | fold cost |\n|---|---|---|---|\n");
    for (int m = 0; m < 2; ++m)
        std::printf("| %-11s | %6.2f | %6.2f | %+5.1f%% |\n", m ? "matched" : "from_output", best[m][0], best[m][1],
                    100.0 * (best[m][1] / best[m][0] - 1.0));
    std::printf("matched / from_output (no fold): %.2fx\n", best[1][0] / best[0][0]);
}

int usage(const char* argv0) {
    std::fprintf(stderr, "usage: %s [--seed S] [--max-len L] [--cost-len L] [--reps N]\n", argv0);
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    options opt;
    for (int a = 1; a < argc; ++a) {
        const bool has_value = a + 1 < argc;
        if (!std::strcmp(argv[a], "--seed") && has_value)
            opt.seed = std::strtoull(argv[++a], nullptr, 10);
        else if (!std::strcmp(argv[a], "--max-len") && has_value)
            opt.max_len = std::atoi(argv[++a]);
        else if (!std::strcmp(argv[a], "--cost-len") && has_value)
            opt.cost_len = std::atoi(argv[++a]);
        else if (!std::strcmp(argv[a], "--reps") && has_value)
            opt.reps = std::atoi(argv[++a]);
        else
            return usage(argv[0]);
    }
    if (opt.max_len < 1 || opt.cost_len < 1 || opt.reps < 1) return usage(argv[0]);
    const auto t0 = clock_type::now();
    const double c0 = cpu_seconds();
    std::printf(
        "FP8 attention backward (host path) vs float64 on the same FP8 operands: causal, 2 heads of %d, Q/K/dO E4M3 "
        "per token and head, O float; seed %llu, one thread\n\n",
        head_dim, static_cast<unsigned long long>(opt.seed));
    std::printf(
        "| regime | len | V scale | n_eff | delta | res | res_dq | res_dk | bias mean | bias rms | fold mean | fold "
        "rms "
        "| dQ err | fold dQ err | dK err |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    const regime regimes[] = {{"sharp", 1.5f, 0.5f}, {"flat", 0.5f, 0.1f}};
    for (const regime& rg : regimes)
        for (int len = 256; len <= opt.max_len; len *= 2) {
            const inputs in = make_inputs(len, 2, rg, opt.seed);
            study<per_token>(in, rg.name, "per token");
            study<per_head>(in, rg.name, "per head");
        }
    cost(opt, make_inputs(opt.cost_len, 2, regimes[0], opt.seed));
    std::printf("\ntotal %.1f s wall, %.1f s CPU\n", std::chrono::duration<double>(clock_type::now() - t0).count(),
                cpu_seconds() - c0);
    return 0;
}
