// Shared by tests/host/attention_*.cpp and tests/cuda/attention_*.cu: random attention problems,
// their FP8 copies (made with octet::quantize), the float64 reference on the dequantized and on the
// original values, and error measures.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "octet/attention/attention.hpp"
#include "octet/quant/quantize.hpp"
#include "octet/reference/attention.hpp"
#include "support/random.hpp"

namespace attention_test {

struct config {
    std::vector<std::int32_t> lens_q;  ///< per sequence
    std::vector<std::int32_t> lens_k;  ///< empty: same as lens_q
    int hq = 2, hkv = 1, d = 64;
    bool causal = false;
    float q_std = 1.5f;   ///< query entries ~ N(0, q_std^2): sharper or flatter attention
    float k_mean = 1.0f;  ///< keys share a mean direction of this norm per channel (as real keys do)
    float scale = 0.0f;   ///< softmax scale (0: 1/sqrt(d))
    std::uint64_t salt = 1;
    octet::key_tile_order key_order = octet::attention_options{}.key_order;  ///< the forward's
    octet::attention_options forward_options() const {
        octet::attention_options o;
        o.mask = causal ? octet::attention_mask::causal : octet::attention_mask::full;
        o.softmax_scale = scale;
        o.key_order = key_order;
        return o;
    }
};

inline std::vector<std::int32_t> offsets(const std::vector<std::int32_t>& lens) {
    std::vector<std::int32_t> cu(lens.size() + 1, 0);
    for (std::size_t b = 0; b < lens.size(); ++b) cu[b + 1] = cu[b] + lens[b];
    return cu;
}

/// Original float data, [tokens][heads * d] row-major.
struct problem {
    config cfg;
    std::vector<std::int32_t> cu_q, cu_k;
    int tq = 0, tk = 0;
    std::vector<float> q, k, v, dout;

    octet::attention_shape shape() const {
        octet::attention_shape s;
        s.cu_seqlens_q = octet::span<const std::int32_t>(cu_q.data(), cu_q.size());
        s.cu_seqlens_k = octet::span<const std::int32_t>(cu_k.data(), cu_k.size());
        s.heads_q = cfg.hq;
        s.heads_kv = cfg.hkv;
        s.head_dim = cfg.d;
        return s;
    }
    octet::reference::attention_problem reference_problem() const {
        octet::reference::attention_problem p;
        p.cu_q.assign(cu_q.begin(), cu_q.end());
        p.cu_k.assign(cu_k.begin(), cu_k.end());
        p.heads_q = cfg.hq;
        p.heads_kv = cfg.hkv;
        p.head_dim = cfg.d;
        p.scale = cfg.scale;
        p.causal = cfg.causal;
        return p;
    }
};

inline problem make_problem(const config& c) {
    problem p;
    p.cfg = c;
    p.cu_q = offsets(c.lens_q);
    p.cu_k = offsets(c.lens_k.empty() ? c.lens_q : c.lens_k);
    p.tq = p.cu_q.back();
    p.tk = p.cu_k.back();
    auto g = octet_test::rng(c.salt);
    std::normal_distribution<float> n(0.0f, 1.0f);
    const std::size_t nq = static_cast<std::size_t>(p.tq) * c.hq * c.d,
                      nk = static_cast<std::size_t>(p.tk) * c.hkv * c.d;
    p.q.resize(nq);
    p.dout.resize(nq);
    p.k.resize(nk);
    p.v.resize(nk);
    // a mean key direction per kv head (unit-norm scaled by k_mean * sqrt(d))
    std::vector<float> mu(static_cast<std::size_t>(c.hkv) * c.d);
    for (auto& x : mu) x = n(g) * c.k_mean;
    // per-token magnitudes vary over a binade or two, as real activations do
    std::uniform_real_distribution<float> mag(0.5f, 2.0f);
    for (int t = 0; t < p.tq; ++t)
        for (int h = 0; h < c.hq; ++h) {
            const float a = mag(g), bm = mag(g);
            for (int e = 0; e < c.d; ++e) {
                const std::size_t i = (static_cast<std::size_t>(t) * c.hq + h) * c.d + e;
                p.q[i] = n(g) * c.q_std * a;
                p.dout[i] = n(g) * bm;
            }
        }
    for (int t = 0; t < p.tk; ++t)
        for (int h = 0; h < c.hkv; ++h) {
            const float a = mag(g), bm = mag(g);
            for (int e = 0; e < c.d; ++e) {
                const std::size_t i = (static_cast<std::size_t>(t) * c.hkv + h) * c.d + e;
                p.k[i] = (n(g) + mu[static_cast<std::size_t>(h) * c.d + e]) * a;
                p.v[i] = n(g) * bm;
            }
        }
    return p;
}

/// FP8 copies of a problem's tensors (recipes per tensor) and their dequantized values.
template <class QR, class KR = QR, class VR = QR, class DR = QR>
struct quantized {
    octet::quantized_tensor<QR> q;
    octet::quantized_tensor<KR> k;
    octet::quantized_tensor<VR> v;
    octet::quantized_tensor<DR> dout;
    std::vector<double> qd, kd, vd, dd;

    template <class R>
    static std::vector<double> quantize_one(const std::vector<float>& x, std::size_t rows, std::size_t cols,
                                            octet::quantized_tensor<R>& out) {
        out = octet::quantized_tensor<R>(rows, cols);
        octet::quantize<R>(octet::on_host(), octet::matrix_ref<const float>(x.data(), rows, cols), out.ref());
        std::vector<float> y(rows * cols);
        octet::dequantize(octet::on_host(), out.cref(), octet::matrix_ref<float>(y.data(), rows, cols));
        return std::vector<double>(y.begin(), y.end());
    }
    explicit quantized(const problem& p) {
        const std::size_t cq = static_cast<std::size_t>(p.cfg.hq) * p.cfg.d,
                          ck = static_cast<std::size_t>(p.cfg.hkv) * p.cfg.d;
        qd = quantize_one(p.q, p.tq, cq, q);
        kd = quantize_one(p.k, p.tk, ck, k);
        vd = quantize_one(p.v, p.tk, ck, v);
        dd = quantize_one(p.dout, p.tq, cq, dout);
    }
};

inline std::vector<double> widen(const std::vector<float>& x) {
    return std::vector<double>(x.begin(), x.end());
}
inline std::vector<double> widen(const std::vector<octet::bf16>& x) {
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = octet::to_float(x[i]);
    return y;
}

/// ||a - b|| / ||b|| over finite entries of b (both same length).
inline double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(b[i])) continue;
        const double e = a[i] - b[i];
        num += e * e;
        den += b[i] * b[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}
/// Largest |a - b| where b is finite, and whether a and b agree on which entries are +Inf.
inline double max_abs_finite(const std::vector<double>& a, const std::vector<double>& b, bool& inf_agree) {
    double m = 0;
    inf_agree = true;
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (std::isinf(b[i]) || std::isinf(a[i])) {
            inf_agree = inf_agree && (a[i] == b[i]);
            continue;
        }
        m = std::max(m, std::fabs(a[i] - b[i]));
    }
    return m;
}

/// Outputs of one host or device run, widened to double.
struct outputs {
    std::vector<double> o, lse, dq, dk, dv;
};

// ---- problems for the invariance tests (tests/host/attention_padding.cpp, tests/cuda/attention_device.cu)

/// Multiplies every element of x by 2^k (exact where no element leaves the normal range).
inline void scale_pow2(std::vector<float>& x, int k) {
    for (float& v : x) v = std::ldexp(v, k);
}
/// Zeroes row `token` of x, [tokens][width] row-major.
inline void zero_row(std::vector<float>& x, std::size_t width, int token) {
    std::fill(x.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(token) * width),
              x.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(token + 1) * width), 0.0f);
}

/// Where each token of a problem sits in its padded version (see pad).
struct padded_problem {
    problem p;
    std::vector<int> q_at, k_at;  ///< token t of the original is token q_at[t] / k_at[t] here
};

/// `p` with `tail` tokens appended to every sequence and, before every sequence, an all-zero
/// sequence of `gap` tokens (varlen padding). The appended tokens have dO = 0 and v = 0 (padding);
/// their q and k are zero when `zero_tail` is set, random otherwise. Under a causal mask with
/// Lq == Lk no original query sees an appended key, so every output of the original tokens is
/// unchanged in exact arithmetic: the tests ask for it bit for bit. (A non-zero v would not do: an
/// appended key shares the last key tile of its sequence, whose per-token V scales are folded into
/// P by the tile's largest, rules.hpp; that is the V recipe's blocking, as any block scale is.)
inline padded_problem pad(const problem& p, int tail, int gap, bool zero_tail, std::uint64_t salt) {
    padded_problem r;
    r.p.cfg = p.cfg;
    const config& c = p.cfg;
    const std::size_t wq = static_cast<std::size_t>(c.hq) * c.d, wk = static_cast<std::size_t>(c.hkv) * c.d;
    auto g = octet_test::rng(salt);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<std::int32_t> lq, lk;
    auto extend = [&](const std::vector<float>& src, std::vector<float>& dst, std::size_t w, int t0, int len,
                      bool random_tail, std::vector<int>* at) {
        for (int z = 0; z < gap; ++z) dst.insert(dst.end(), w, 0.0f);
        for (int t = t0; t < t0 + len; ++t) {
            if (at) (*at)[static_cast<std::size_t>(t)] = static_cast<int>(dst.size() / w);
            dst.insert(dst.end(), src.begin() + static_cast<std::ptrdiff_t>(t * w),
                       src.begin() + static_cast<std::ptrdiff_t>((t + 1) * w));
        }
        for (int z = 0; z < tail; ++z)
            for (std::size_t e = 0; e < w; ++e) dst.push_back(random_tail ? n(g) : 0.0f);
    };
    r.q_at.assign(static_cast<std::size_t>(p.tq), -1);
    r.k_at.assign(static_cast<std::size_t>(p.tk), -1);
    for (std::size_t b = 0; b + 1 < p.cu_q.size(); ++b) {
        const int q0 = p.cu_q[b], nq = p.cu_q[b + 1] - q0, k0 = p.cu_k[b], nk = p.cu_k[b + 1] - k0;
        if (gap > 0) {
            lq.push_back(gap);
            lk.push_back(gap);
        }
        lq.push_back(nq + tail);
        lk.push_back(nk + tail);
        extend(p.q, r.p.q, wq, q0, nq, !zero_tail, &r.q_at);
        extend(p.dout, r.p.dout, wq, q0, nq, false, nullptr);
        extend(p.k, r.p.k, wk, k0, nk, !zero_tail, &r.k_at);
        extend(p.v, r.p.v, wk, k0, nk, false, nullptr);
    }
    r.p.cfg.lens_q = lq;
    r.p.cfg.lens_k = lk;
    r.p.cu_q = offsets(lq);
    r.p.cu_k = offsets(lk);
    r.p.tq = r.p.cu_q.back();
    r.p.tk = r.p.cu_k.back();
    return r;
}

/// The rows of x ([tokens][width]) at `at`, in order: a padded output brought back to the original's.
template <class T>
std::vector<T> gather_rows(const std::vector<T>& x, std::size_t width, const std::vector<int>& at) {
    std::vector<T> y;
    y.reserve(at.size() * width);
    for (const int t : at)
        y.insert(y.end(), x.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(t) * width),
                 x.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(t + 1) * width));
    return y;
}
/// L is [heads][tokens]: the entries of the original tokens, head by head.
inline std::vector<float> gather_lse(const std::vector<float>& lse, int heads, int tokens, const std::vector<int>& at) {
    std::vector<float> y;
    for (int h = 0; h < heads; ++h)
        for (const int t : at) y.push_back(lse[static_cast<std::size_t>(h) * tokens + t]);
    return y;
}

/// Number of elements where a != 2^k * b as floats (bit for bit, NaN never equal).
inline std::size_t count_not_scaled(const std::vector<float>& a, const std::vector<float>& b, int k) {
    std::size_t n = a.size() == b.size() ? 0 : a.size() + b.size();
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += !(a[i] == std::ldexp(b[i], k));
    return n;
}
/// Number of elements whose bits differ.
inline std::size_t count_bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
    std::size_t n = a.size() == b.size() ? 0 : a.size() + b.size();
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        std::uint32_t x, y;
        std::memcpy(&x, &a[i], 4);
        std::memcpy(&y, &b[i], 4);
        n += x != y;
    }
    return n;
}

/// rows x (heads*d) quantized view type helpers
template <class R>
octet::quantized_cref<R> cref(const octet::quantized_tensor<R>& t) {
    return t.cref();
}

}  // namespace attention_test
