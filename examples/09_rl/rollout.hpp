// examples/09_rl/rollout.hpp: the inference side of the RL pipeline. Generates completions
// token by token from a copy of the policy with a KV cache, in float32 or in FP8:
//
//   rl::rollout_engine eng(model_cfg, {rl::rollout_precision::fp8, common::linear_mode::blockwise},
//                          max_sequences, octet::on_host(threads));
//   eng.generate(params, prompts, B, P, G, C, seed, step, sequences, logp, entropy);
//
// The forward is the one of common::transformer (model.hpp), recomputed incrementally: one
// position of every sequence per call, its K and V appended to a per-layer cache, attention of
// that position over the cache. FP8 rollouts run
//   * the four linears of each block through octet's linear component in the given FP8 recipe
//     (octet::linear_forward, inference pass: X and W quantized by the recipe, FP8 products);
//   * Q, K and V rounded to E4M3 with one scale per token and head (octet::quantize with a
//     block<1, head_dim> recipe) as they are produced: K and V enter the cache rounded, which is
//     what an E4M3 KV cache with per-token scales holds. The cache keeps the decoded values (the
//     codes times their scale) so that the attention arithmetic reads floats.
// Everything else (embedding, norms, GELU, softmax and P V, the output head) is float32, as in
// the trainer. The float32 engine differs from the trainer's forward only in the order of float
// operations, which the float_rollout run measures.
//
// Sampling: temperature 1 from the engine's own distribution, one uniform per (sequence,
// completion position) from the Philox stream (seed, stream). logp and entropy are computed from
// the engine's float logits with a log-softmax in double: they are what an inference engine
// reports for the tokens it sampled.
#pragma once

#include "common/model.hpp"

#include <octet/octet.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace rl {

enum class rollout_precision { float32, fp8 };

struct rollout_config {
    rollout_precision precision = rollout_precision::float32;
    common::linear_mode linear = common::linear_mode::blockwise;  ///< fp8: the linears' recipe
};

class rollout_engine {
public:
    rollout_engine(const common::model_config& c, rollout_config rc, int max_sequences, octet::host_executor ex)
        : cfg_(c), rc_(rc), ex_(ex), lay_(c), n_max_(static_cast<std::size_t>(max_sequences)) {
        constexpr const char* fn = "rl::rollout_engine";
        OCTET_REQUIRE(max_sequences > 0, fn, "max_sequences", "must be positive");
        OCTET_REQUIRE(c.head_dim == 32 || c.head_dim == 64, fn, "config.head_dim", "must be 32 or 64");
        OCTET_REQUIRE(rc.precision == rollout_precision::float32 ||
                          (rc.linear != common::linear_mode::float32 && rc.linear != common::linear_mode::bf16),
                      fn, "rc.linear", "must be an FP8 (or NVFP4) mode when rc.precision is fp8");
        d_ = static_cast<std::size_t>(c.d_model), F_ = static_cast<std::size_t>(c.d_ff);
        V_ = static_cast<std::size_t>(c.vocab), T_ = static_cast<std::size_t>(c.seq_len);
        A_ = lay_.attn_width, W_ = lay_.qkv_out, KW_ = static_cast<std::size_t>(c.heads_kv * c.head_dim);
        const common::linear_mode mode =
            rc.precision == rollout_precision::fp8 ? rc.linear : common::linear_mode::float32;
        std::uint64_t stream = 0;
        for (int l = 0; l < c.layers; ++l) {
            block b;
            b.qkv = common::make_linear_layer(meter_, mode, n_max_, c.d_model, static_cast<int>(W_), stream++);
            b.proj = common::make_linear_layer(meter_, mode, n_max_, static_cast<int>(A_), c.d_model, stream++);
            b.up = common::make_linear_layer(meter_, mode, n_max_, c.d_model, c.d_ff, stream++);
            b.down = common::make_linear_layer(meter_, mode, n_max_, c.d_ff, c.d_model, stream++);
            b.k.assign(n_max_ * T_ * KW_, 0.0f);
            b.v.assign(n_max_ * T_ * KW_, 0.0f);
            blocks_.push_back(std::move(b));
        }
        x_.resize(n_max_ * d_), h_.resize(n_max_ * d_), y_.resize(n_max_ * d_);
        qkv_.resize(n_max_ * W_), o_.resize(n_max_ * A_), u_.resize(n_max_ * F_), a_.resize(n_max_ * F_);
        logits_.resize(n_max_ * V_);
        wt_.resize(std::max({W_ * d_, A_ * d_, F_ * d_, V_ * d_}));
        yt_.resize(std::max({W_, A_, F_, V_, d_}) * n_max_);
        scores_.resize(T_);
        if (rc.precision == rollout_precision::fp8) {
            q8_ = std::make_unique<e4m3_rounder>(n_max_, A_, c.head_dim);
            k8_ = std::make_unique<e4m3_rounder>(n_max_, KW_, c.head_dim);
        }
    }

    const rollout_config& config() const { return rc_; }

    /// Generates G completions of C tokens for each of B prompts of P tokens (prompts: B x P,
    /// row-major). Writes sequences (B G x (P + C): prompt then completion, sequence b G + g
    /// continues prompt b), and per completion token logp (B G x C) and entropy (B G x C).
    /// P + C - 1 must not exceed the model's seq_len. Uniforms: Philox (seed, stream), counter
    /// sequence * C + position.
    void generate(octet::span<const float> params, const std::int32_t* prompts, int B, int P, int G, int C,
                  std::uint64_t seed, std::uint64_t stream, std::int32_t* sequences, float* logp, float* entropy) {
        constexpr const char* fn = "rl::rollout_engine::generate";
        OCTET_REQUIRE(params.size() == lay_.total, fn, "params",
                      octet::detail::message("has ", params.size(), " floats but the model has ", lay_.total));
        OCTET_REQUIRE(B > 0 && G > 0 && static_cast<std::size_t>(B) * G <= n_max_, fn, "B, G",
                      octet::detail::message("give ", B, " x ", G, " sequences; pass 1 to ", n_max_));
        OCTET_REQUIRE(P > 0 && C > 0 && static_cast<std::size_t>(P + C - 1) <= T_, fn, "P, C",
                      octet::detail::message("are ", P, " and ", C, "; need P, C > 0 and P + C - 1 <= seq_len = ", T_));
        const std::size_t n = static_cast<std::size_t>(B) * G, L = static_cast<std::size_t>(P + C);
        for (std::size_t s = 0; s < n; ++s)
            for (int p = 0; p < P; ++p) {
                const std::int32_t tok = prompts[(s / G) * P + p];
                OCTET_REQUIRE(tok >= 0 && tok < cfg_.vocab, fn, "prompts",
                              octet::detail::message("hold token ", tok, "; tokens lie in [0, ", cfg_.vocab, ")"));
                sequences[s * L + p] = tok;
            }
        const octet::philox_stream rng{seed, stream};
        std::vector<std::int32_t> feed(n);
        for (std::size_t pos = 0; pos + 1 < L; ++pos) {
            for (std::size_t s = 0; s < n; ++s) feed[s] = sequences[s * L + pos];
            step(params.data(), feed.data(), n, pos);
            if (pos + 1 < static_cast<std::size_t>(P)) continue;  // prefill: the next token is the prompt's
            const std::size_t c = pos + 1 - static_cast<std::size_t>(P);
            for (std::size_t s = 0; s < n; ++s) {
                const float* z = logits_.data() + s * V_;
                const common::softmax_row sm = common::softmax_of(z, V_);
                double u = rng.uniform(static_cast<std::uint64_t>(s * static_cast<std::size_t>(C) + c)) * sm.sum;
                std::size_t pick = V_ - 1;
                for (std::size_t v = 0; v < V_; ++v)
                    if ((u -= std::exp(static_cast<double>(z[v]) - sm.max)) < 0) {
                        pick = v;
                        break;
                    }
                sequences[s * L + pos + 1] = static_cast<std::int32_t>(pick);
                logp[s * C + c] = static_cast<float>(sm.logp(z[pick]));
                entropy[s * C + c] = static_cast<float>(sm.entropy);
            }
        }
    }

    /// The logits the last generate() computed at its last position (n x vocab); for tests.
    const std::vector<float>& last_logits() const { return logits_; }

    /// One position of n sequences: tokens[s] at position pos (positions 0..pos-1 of every
    /// sequence already in the cache). Leaves the logits of that position in last_logits().
    void step(const float* P, const std::int32_t* tokens, std::size_t n, std::size_t pos) {
        const std::size_t Hq = static_cast<std::size_t>(cfg_.heads_q), Hk = static_cast<std::size_t>(cfg_.heads_kv);
        const std::size_t hd = static_cast<std::size_t>(cfg_.head_dim), G = Hq / Hk;
        const float* E = P + lay_.tok_emb;
        for (std::size_t s = 0; s < n; ++s)
            for (std::size_t c = 0; c < d_; ++c)
                x_[s * d_ + c] = E[static_cast<std::size_t>(tokens[s]) * d_ + c] + P[lay_.pos_emb + pos * d_ + c];
        const common::linear_layer::scratch sc{wt_.data(), yt_.data(), nullptr, nullptr};
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        for (std::size_t l = 0; l < blocks_.size(); ++l) {
            block& b = blocks_[l];
            const auto& pb = lay_.blocks[l];
            rmsnorm(x_.data(), P + pb.norm1, h_.data(), n);
            b.qkv->forward(ex_, h_.data(), n, P + pb.qkv, qkv_.data(), false, false, sc, nullptr);
            if (q8_) {  // Q, K, V rounded to E4M3 per token and head
                q8_->round(ex_, qkv_.data(), W_, n);
                k8_->round(ex_, qkv_.data() + A_, W_, n);
                k8_->round(ex_, qkv_.data() + A_ + KW_, W_, n);
            }
            for (std::size_t s = 0; s < n; ++s) {
                std::copy_n(qkv_.data() + s * W_ + A_, KW_, b.k.data() + (s * T_ + pos) * KW_);
                std::copy_n(qkv_.data() + s * W_ + A_ + KW_, KW_, b.v.data() + (s * T_ + pos) * KW_);
            }
            for (std::size_t s = 0; s < n; ++s)
                for (std::size_t h = 0; h < Hq; ++h) {
                    const std::size_t hk = h / G;
                    const float* q = qkv_.data() + s * W_ + h * hd;
                    float m = -INFINITY;
                    for (std::size_t j = 0; j <= pos; ++j) {
                        const float* k = b.k.data() + (s * T_ + j) * KW_ + hk * hd;
                        float dot = 0;
                        for (std::size_t e = 0; e < hd; ++e) dot += q[e] * k[e];
                        m = std::max(m, scores_[j] = dot * scale);
                    }
                    float sum = 0;
                    for (std::size_t j = 0; j <= pos; ++j) sum += scores_[j] = std::exp(scores_[j] - m);
                    const float inv = 1.0f / sum;
                    float* o = o_.data() + s * A_ + h * hd;
                    std::fill(o, o + hd, 0.0f);
                    for (std::size_t j = 0; j <= pos; ++j) {
                        const float p = scores_[j] * inv;
                        const float* v = b.v.data() + (s * T_ + j) * KW_ + hk * hd;
                        for (std::size_t e = 0; e < hd; ++e) o[e] += p * v[e];
                    }
                }
            b.proj->forward(ex_, o_.data(), n, P + pb.proj, y_.data(), false, false, sc, nullptr);
            for (std::size_t i = 0; i < n * d_; ++i) x_[i] += y_[i];
            rmsnorm(x_.data(), P + pb.norm2, h_.data(), n);
            b.up->forward(ex_, h_.data(), n, P + pb.up, u_.data(), false, false, sc, nullptr);
            octet::detail::run_kernel<common::detail::gelu_forward_kernel>(octet::detail::best_isa(), u_.data(),
                                                                           a_.data(), n * F_);
            b.down->forward(ex_, a_.data(), n, P + pb.down, y_.data(), false, false, sc, nullptr);
            for (std::size_t i = 0; i < n * d_; ++i) x_[i] += y_[i];
        }
        rmsnorm(x_.data(), P + lay_.norm_f, h_.data(), n);
        common::transpose(ex_, P + lay_.head, V_, d_, wt_.data());
        common::gemm(ex_, h_.data(), d_, wt_.data(), V_, logits_.data(), V_, n, V_, d_);
    }

private:
    /// Rounds column blocks of head_dim to E4M3 with one scale per row and block, in place.
    class e4m3_rounder {
    public:
        e4m3_rounder(std::size_t rows, std::size_t cols, int head_dim) : cols_(cols), hd_(head_dim) {
            if (hd_ == 32)
                alloc<32>(rows);
            else
                alloc<64>(rows);
        }
        void round(octet::host_executor ex, float* x, std::size_t ld, std::size_t rows) {
            if (hd_ == 32)
                run<32>(ex, x, ld, rows);
            else
                run<64>(ex, x, ld, rows);
        }

    private:
        template <int HD>
        using recipe = octet::recipe<octet::e4m3, octet::block<1, HD>, octet::scale::amax_ratio<0>>;
        template <int HD>
        void alloc(std::size_t rows) {
            const auto l = octet::quant_layout_of<recipe<HD>>::make(rows, cols_);
            codes_.resize(l.data_bytes), scales_.resize(l.scale_bytes);
        }
        template <int HD>
        void run(octet::host_executor ex, float* x, std::size_t ld, std::size_t rows) {
            const auto l = octet::quant_layout_of<recipe<HD>>::make(rows, cols_);
            float ts = 1.0f;
            octet::quantized_ref<recipe<HD>> q(codes_.data(), scales_.data(), l, &ts);
            octet::quantize<recipe<HD>>(ex, octet::matrix_ref<const float>(x, rows, cols_, ld), q, {});
            octet::dequantize(ex, q, octet::matrix_ref<float>(x, rows, cols_, ld));
        }
        std::size_t cols_;
        int hd_;
        std::vector<std::uint8_t> codes_, scales_;
    };

    struct block {
        std::unique_ptr<common::linear_layer> qkv, proj, up, down;
        std::vector<float> k, v;  // cache: [sequence][position][kv heads * head_dim]
    };

    /// y = x / sqrt(mean(x^2) + 1e-5) * g per row (the trainer's rule: sum of squares in double).
    void rmsnorm(const float* x, const float* g, float* y, std::size_t n) const {
        for (std::size_t r = 0; r < n; ++r) {
            const float* xr = x + r * d_;
            double ss = 0;
            for (std::size_t c = 0; c < d_; ++c) ss += static_cast<double>(xr[c]) * xr[c];
            const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d_) + 1e-5f));
            for (std::size_t c = 0; c < d_; ++c) y[r * d_ + c] = xr[c] * inv * g[c];
        }
    }

    common::model_config cfg_;
    rollout_config rc_;
    octet::host_executor ex_;
    common::parameter_layout lay_;
    std::size_t n_max_, d_ = 0, F_ = 0, V_ = 0, T_ = 0, A_ = 0, W_ = 0, KW_ = 0;
    common::memory_meter meter_;  // the FP8 layers book their buffers here (the RL report does not use it)
    std::vector<block> blocks_;
    std::vector<float> x_, h_, y_, qkv_, o_, u_, a_, logits_, wt_, yt_, scores_;
    std::unique_ptr<e4m3_rounder> q8_, k8_;
};

}  // namespace rl
