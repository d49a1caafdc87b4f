// examples/common/model.hpp: the decoder-only transformer the training program (examples/08_training)
// trains and the RL program (examples/09_rl) fine-tunes, built from octet on the host executor.
//
//   common::transformer model(cfg, recipe, meter, octet::on_host(pool), max_batch, seed);
//   common::step_telemetry t = model.forward_backward(params, tokens, batch, grads);
//
// Architecture: token embedding + learned position embedding, `layers` pre-norm blocks
//   x = x + W_o attn(W_qkv rmsnorm(x))          causal attention, grouped-query heads
//   x = x + W_down gelu(W_up rmsnorm(x))        GELU with the tanh approximation
// then a final RMSNorm and the output head (tied: logits = h E^T; else its own matrix). No biases.
// RMSNorm: y = x / sqrt(mean(x^2) + 1e-5) * gain. Loss: mean softmax cross-entropy (nats).
//
// Precision by recipe. The four linears of a block (fused QKV, attention output, MLP up, MLP down)
// run in recipe.linear: float32 (the blocked GEMM below), bf16 (operands rounded to bf16, products
// summed in float) or an FP8 mode through octet's linear component (octet/nn/linear.hpp).
// Attention runs in float32 (below) or octet's FP8 attention (Q, K, dO E4M3 per token and head,
// V E4M3 per head or per token). Everything else (embedding, norms, GELU, residual adds, the
// output head and the loss) is float32: the head's vocabulary is not a multiple of a scale block
// and its logits feed the loss directly (the head's products run on the float32 GEMM and are timed
// as "embedding_head", not "linear"). set_high_precision(true) runs the linears and the attention
// in float32 too (recovery's "raise precision").
//
// step_telemetry.op_seconds keys: "linear" (the four block linears, forward and backward, their
// quantization included), "attention" (float32, or FP8 with the quantization of Q, K, V, dO),
// "norm" (RMSNorms and residual adds), "mlp_activation" (GELU), "embedding_head" (embedding
// gather and scatter, head products), "loss" (softmax cross-entropy and its gradient).
//
// Memory: every buffer is booked in the meter and allocated in the constructor for max_batch
// sequences (activations: what the backward reads; temporaries: the rest), so forward_backward
// allocates nothing of its own: octet's operations take their scratch from one host_arena in the
// step buffers, and compute reads the optimizer's master weights in place (weights_ref). Float
// copies of the linears' inputs, needed when a layer computes in float, are kept only while it
// does: a float32 recipe keeps them always, an FP8 recipe only while high precision is on
// (set_high_precision allocates and frees them).
//
// The parts (model/): base.hpp (includes, step_telemetry), kernels.hpp (float32 GEMM, GELU,
// softmax), linear_layers.hpp, attention_f32.hpp, attention_fp8.hpp, step_buffers.hpp (the step
// buffers and the saved copies); here: the parameter layout and the transformer.
#pragma once

#include <octet/octet.hpp>

#include "model/attention_f32.hpp"
#include "model/attention_fp8.hpp"
#include "model/base.hpp"
#include "model/kernels.hpp"
#include "model/linear_layers.hpp"
#include "model/moe_block.hpp"
#include "model/step_buffers.hpp"

namespace common {

// =================================================================================================
// Parameter layout
// =================================================================================================

/// Offsets (in floats) of every tensor in the flat parameter vector, in this order:
///   tok_emb [vocab, d]     pos_emb [seq_len, d]
///   per layer l: norm1 [d], qkv [(heads_q + 2 heads_kv) head_dim, d], proj [d, heads_q head_dim],
///                norm2 [d], then a dense MLP: up [d_ff, d], down [d, d_ff]
///                or a mixture of experts (config.moe_block(l)): router [E, d], up [E f, d] (expert
///                e's f x d matrix at rows [e f, (e + 1) f)), down [E d, f] (expert e's d x f at rows
///                [e d, (e + 1) d)), f = config.expert_ff()
///   norm_f [d]             head [vocab, d] (absent when tied: the head is tok_emb)
/// Matrices are out x in (Y = X W^T), row-major.
struct parameter_layout {
    struct block {
        std::size_t norm1, qkv, proj, norm2, up, down;
        std::size_t router = 0;      ///< a mixture of experts' router (moe_params > 0), else unused
        std::size_t moe_params = 0;  ///< router, up and down of a mixture of experts (contiguous), else 0
    };
    std::size_t tok_emb = 0, pos_emb = 0, norm_f = 0, head = 0, total = 0;
    std::vector<block> blocks;
    std::size_t qkv_out = 0, attn_width = 0;  ///< (heads_q + 2 heads_kv) head_dim, heads_q head_dim
    std::size_t moe_params = 0;               ///< the largest block's moe_params

    explicit parameter_layout(const model_config& c) {
        const std::size_t d = static_cast<std::size_t>(c.d_model), F = static_cast<std::size_t>(c.d_ff);
        const std::size_t E = static_cast<std::size_t>(c.moe_experts), Fe = static_cast<std::size_t>(c.expert_ff());
        qkv_out = static_cast<std::size_t>(c.heads_q + 2 * c.heads_kv) * static_cast<std::size_t>(c.head_dim);
        attn_width = static_cast<std::size_t>(c.heads_q) * static_cast<std::size_t>(c.head_dim);
        std::size_t at = 0;
        auto take = [&](std::size_t n) {
            const std::size_t o = at;
            at += n;
            return o;
        };
        tok_emb = take(static_cast<std::size_t>(c.vocab) * d);
        pos_emb = take(static_cast<std::size_t>(c.seq_len) * d);
        for (int l = 0; l < c.layers; ++l) {
            block b;
            b.norm1 = take(d);
            b.qkv = take(qkv_out * d);
            b.proj = take(d * attn_width);
            b.norm2 = take(d);
            if (c.moe_block(l)) {
                b.router = take(E * d);
                b.up = take(E * Fe * d);
                b.down = take(E * d * Fe);
                b.moe_params = E * d + 2 * E * Fe * d;
                moe_params = b.moe_params;
            } else {
                b.up = take(F * d);
                b.down = take(d * F);
            }
            blocks.push_back(b);
        }
        norm_f = take(d);
        head = c.tied_head ? tok_emb : take(static_cast<std::size_t>(c.vocab) * d);
        total = at;
    }
};

// =================================================================================================
// The model
// =================================================================================================

/// The parameters a model computes with, as the optimizer keeps them: float32 (read in place) or
/// bf16 (bf16 master weights, decoded tensor by tensor into the step buffers as an operation reads
/// them: no float copy of the whole model). A span of either converts to it.
struct weights_ref {
    const float* f32 = nullptr;
    const octet::bf16* b16 = nullptr;
    std::size_t count = 0;

    weights_ref(octet::span<const float> w) : f32(w.data()), count(w.size()) {}
    weights_ref(octet::span<float> w) : f32(w.data()), count(w.size()) {}
    weights_ref(octet::span<const octet::bf16> w) : b16(w.data()), count(w.size()) {}
    std::size_t size() const { return count; }
};

/// Where the backward writes the gradient: float32, or bf16 (recipe.gradients): each tensor's
/// gradient is computed in float in the step buffers and rounded once to nearest even into the
/// bf16 buffer as it completes; the embeddings' (written from both ends of the backward when the
/// head is tied) stay in float until the end. No float copy of the whole gradient. A span of
/// either converts to it.
struct gradients_ref {
    float* f32 = nullptr;
    octet::bf16* b16 = nullptr;
    std::size_t count = 0;

    gradients_ref(octet::span<float> g) : f32(g.data()), count(g.size()) {}
    gradients_ref(octet::span<octet::bf16> g) : b16(g.data()), count(g.size()) {}
    std::size_t size() const { return count; }
};

class transformer {
public:
    /// `shared`: the step buffers to work in (see step_buffers); null: the model's own.
    transformer(const model_config& cfg, const recipe_config& recipe, memory_meter& meter, octet::host_executor ex,
                int max_batch, std::uint64_t seed, std::shared_ptr<step_buffers> shared = nullptr)
        : buf_(shared ? std::move(shared) : std::make_shared<step_buffers>(meter)),
          cfg_(checked(cfg, max_batch)),
          recipe_(recipe),
          meter_(meter),
          ex_(ex),
          max_batch_(max_batch),
          seed_(seed),
          lay_(cfg_),
          T_(static_cast<std::size_t>(cfg_.seq_len)),
          d_(static_cast<std::size_t>(cfg_.d_model)),
          F_(static_cast<std::size_t>(cfg_.d_ff)),
          V_(static_cast<std::size_t>(cfg_.vocab)),
          Nmax_(static_cast<std::size_t>(max_batch) * T_) {
        OCTET_REQUIRE(
            recipe.linear == linear_mode::float32 || recipe.linear == linear_mode::bf16 || TRAIN_HAS_FP8_LINEAR,
            "common::transformer", "recipe.linear",
            "is an FP8 mode but octet/nn/linear.hpp is not available in this build");
        if (cfg_.moe()) {
            OCTET_REQUIRE(*moe_mode_refusal(recipe.linear) == '\0', "common::transformer", "recipe.linear",
                          moe_mode_refusal(recipe.linear));
            OCTET_REQUIRE(!recipe.make_linear, "common::transformer", "recipe.make_linear",
                          "places the linears on CUDA, but the mixture of experts runs on the host; use the host "
                          "linears (--linears host) with a MoE size");
        }
        const bool first = buf_->sized_for.empty();
        allocate(first);
        // Every temporary octet's host operations take (quantizer, GEMM, attention) comes from one
        // arena as large as the largest single operation's need, booked like the model's buffers.
        const std::size_t arena_bytes = scratch_arena_bytes(cfg_, recipe_, max_batch_, ex.thread_count());
        if (arena_bytes > 0) {
            if (first) {
                buf_->arena = octet::host_arena(arena_bytes);
                buf_->arena_booking =
                    std::make_unique<meter_booking>(meter_, temporaries(), static_cast<double>(arena_bytes));
            }
            ex_ = octet::with_allocator(ex, buf_->arena.allocator());
        }
    }

    const model_config& config() const { return cfg_; }
    const parameter_layout& layout() const { return lay_; }

    static std::size_t parameter_count(const model_config& c) { return parameter_layout(c).total; }

    /// The ledger's prediction of what a model built with (cfg, recipe, max_batch) on `threads`
    /// threads (0: all hardware threads, as octet::on_host()) books in its meter: bytes the
    /// backward keeps (activations) and the rest (temporaries). Written from the buffer list, per
    /// token, apart from the allocation code (the step buffers' block from step_regions, the list
    /// both read); the FP8 copies are sized by octet's own layout rules (quant_layout_of,
    /// linear_context::memory). Raising precision adds raise_precision_bytes. lend_bytes: the
    /// step buffers' lend_capacity (their block is the larger of the regions and it).
    static double activation_bytes(const model_config& cfg, const recipe_config& r, int max_batch, int threads = 0) {
        return memory_plan(cfg, r, max_batch, threads).activations;
    }
    static double temporary_bytes(const model_config& cfg, const recipe_config& r, int max_batch, int threads = 0,
                                  std::size_t lend_bytes = 0) {
        return memory_plan(cfg, r, max_batch, threads, lend_bytes).temporaries;
    }
    /// The part of temporary_bytes in step_buffers: a model built on another's shared buffers
    /// books temporary_bytes - step_buffer_bytes.
    static double step_buffer_bytes(const model_config& cfg, const recipe_config& r, int max_batch, int threads = 0,
                                    std::size_t lend_bytes = 0) {
        return memory_plan(cfg, r, max_batch, threads, lend_bytes).step_buffers;
    }
    /// Activation bytes set_high_precision(true) adds while on (float copies of what a float
    /// computation keeps; 0 for a float32 recipe).
    static double raise_precision_bytes(const model_config& cfg, const recipe_config& r, int max_batch) {
        const double N = static_cast<double>(max_batch) * cfg.seq_len, d = cfg.d_model, F = cfg.d_ff;
        const double W = static_cast<double>(cfg.heads_q + 2 * cfg.heads_kv) * cfg.head_dim;
        double floats = 0;
        if (r.linear != linear_mode::float32) floats += N * (2 * d + F);
        if (r.attention != attention_mode::float32) floats += N * W;
        if (compress_o_recipe(r)) floats += N * cfg.heads_q * cfg.head_dim;  // O, kept as FP8 otherwise
        if (bf16_attention_recipe(r)) floats += N * W;                       // Q, K, V (bf16 otherwise)
        if (packed_o_recipe(r) && !compress_o_recipe(r)) floats += N * cfg.heads_q * cfg.head_dim;  // O (bf16)
        // a MoE block's MLP keeps its placement (no float copies of the up and down inputs)
        const double moe_less = r.linear != linear_mode::float32 ? N * (d + F) * cfg.moe_blocks() : 0.0;
        return 4.0 * (cfg.layers * floats - moe_less);
    }
    /// The temporaries raising precision adds while it is on: the float linears' dY^T where the
    /// step buffers hold the head's alone (0 where the recipe's linears are float or bf16).
    static std::size_t raise_temporary_bytes(const model_config& cfg, const recipe_config& r, int max_batch) {
        if (dense_linears(r)) return 0;
        const std::size_t N = static_cast<std::size_t>(max_batch) * static_cast<std::size_t>(cfg.seq_len);
        const std::size_t A = static_cast<std::size_t>(cfg.heads_q * cfg.head_dim),
                          W = A + 2 * static_cast<std::size_t>(cfg.heads_kv * cfg.head_dim);
        return sizeof(float) * N *
               std::max({W, A, static_cast<std::size_t>(cfg.d_ff), static_cast<std::size_t>(cfg.d_model)});
    }

    /// GPT-2's initialization: weights and embeddings N(0, 0.02), the two projections that write
    /// into the residual stream (proj, down) N(0, 0.02 / sqrt(2 layers)), norm gains 1. Draws
    /// come from octet's philox stream (one stream per tensor), so they are the same everywhere.
    static void init_parameters(const model_config& c, std::uint64_t seed, octet::span<float> params) {
        const parameter_layout lay(c);
        OCTET_REQUIRE(params.size() == lay.total, "common::transformer::init_parameters", "params",
                      octet::detail::message("has ", params.size(), " floats but the model has ", lay.total,
                                             "; size it with parameter_count(config)"));
        std::uint64_t stream = 0;
        auto normal = [&](std::size_t off, std::size_t n, double stddev) {
            const octet::philox_stream rng{seed, stream++};
            for (std::size_t i = 0; i < n; ++i) {
                const double u1 = (static_cast<double>(rng.bits(2 * i) >> 8) + 1.0) / 16777216.0;  // (0, 1]
                const double u2 = static_cast<double>(rng.bits(2 * i + 1) >> 8) / 16777216.0;
                params[off + i] =
                    static_cast<float>(stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
            }
        };
        auto ones = [&](std::size_t off, std::size_t n) {
            std::fill(params.data() + off, params.data() + off + n, 1.0f);
        };
        const std::size_t d = static_cast<std::size_t>(c.d_model), F = static_cast<std::size_t>(c.d_ff);
        const double s = 0.02, s_res = 0.02 / std::sqrt(2.0 * c.layers);
        normal(lay.tok_emb, static_cast<std::size_t>(c.vocab) * d, s);
        normal(lay.pos_emb, static_cast<std::size_t>(c.seq_len) * d, s);
        const std::size_t E = static_cast<std::size_t>(c.moe_experts), Fe = static_cast<std::size_t>(c.expert_ff());
        for (const auto& b : lay.blocks) {
            ones(b.norm1, d);
            normal(b.qkv, lay.qkv_out * d, s);
            normal(b.proj, d * lay.attn_width, s_res);
            ones(b.norm2, d);
            if (b.moe_params > 0) {  // each expert initialized as a dense MLP of width f
                normal(b.router, E * d, s);
                normal(b.up, E * Fe * d, s);
                normal(b.down, E * d * Fe, s_res);
            } else {
                normal(b.up, F * d, s);
                normal(b.down, d * F, s_res);
            }
        }
        ones(lay.norm_f, d);
        if (!c.tied_head) normal(lay.head, static_cast<std::size_t>(c.vocab) * d, s);
    }

    /// One forward and backward over `batch` sequences of seq_len + 1 tokens each (row-major:
    /// inputs [0, seq_len), targets [1, seq_len]). grads receives the gradient of the mean
    /// cross-entropy (overwritten).
    step_telemetry forward_backward(const weights_ref& params, const std::int32_t* tokens, int batch,
                                    const gradients_ref& grads) {
        constexpr const char* fn = "common::transformer::forward_backward";
        check_call(fn, params, tokens, batch);
        check_gradients(fn, grads);
        step_telemetry t;
        t.attention_residual.assign(static_cast<std::size_t>(cfg_.layers), 0.0);
        if (!float_attention()) t.attention_residual_q.assign(static_cast<std::size_t>(cfg_.layers), 0.0);
        forward(params, tokens, batch, T_, T_ + 1, true, &t);
        t.loss = loss(tokens, true, &t);
        backward(params, tokens, batch, grads, &t);
        return t;
    }

    /// The policy side of RL: a training forward over `batch` sequences in forward_backward's
    /// layout that writes, per target position n (batch * seq_len of them, sequence-major),
    /// logp[n] = log p(tokens[target n]) and entropy[n] = -sum_v p_v log p_v of the predicted
    /// distribution (both from the float logits, log-softmax in double). Keeps what
    /// policy_backward needs. Returns the forward's telemetry (loss: mean -logp).
    step_telemetry score(const weights_ref& params, const std::int32_t* tokens, int batch, octet::span<float> logp,
                         octet::span<float> entropy) {
        constexpr const char* fn = "common::transformer::score";
        check_call(fn, params, tokens, batch);
        const std::size_t n = static_cast<std::size_t>(batch) * T_;
        OCTET_REQUIRE(logp.size() == n, fn, "logp",
                      octet::detail::message("has ", logp.size(), " floats; pass batch * seq_len = ", n));
        OCTET_REQUIRE(entropy.size() == n, fn, "entropy",
                      octet::detail::message("has ", entropy.size(), " floats; pass batch * seq_len = ", n));
        step_telemetry t;
        t.attention_residual.assign(static_cast<std::size_t>(cfg_.layers), 0.0);
        if (!float_attention()) t.attention_residual_q.assign(static_cast<std::size_t>(cfg_.layers), 0.0);
        forward(params, tokens, batch, T_, T_ + 1, true, &t);
        timer tm{&t, "loss"};
        double sum = 0;
        for (std::size_t r = 0; r < n; ++r) {
            const float* z = logits_.data() + r * V_;
            const softmax_row sm = softmax_of(z, V_);
            const std::int32_t target = tokens[(r / T_) * (T_ + 1) + r % T_ + 1];
            logp[r] = static_cast<float>(sm.logp(z[target]));
            entropy[r] = static_cast<float>(sm.entropy);
            sum -= logp[r];
        }
        t.loss = sum / static_cast<double>(n);
        scored_batch_ = batch;
        scored_lent_ = buf_->lent;
        return t;
    }

    /// Gradient of a loss whose derivative by each logp[n] of the last score() is dloss_dlogp[n]
    /// (0 for a position outside the loss): d loss / d logits = dloss_dlogp[n] (onehot - softmax)
    /// per position (d logp / d z_v = [v == target] - p_v), then the backward. `tokens` and `batch` must be score()'s.
    /// grads is overwritten; the backward's timings and telemetry are added to `t`.
    void policy_backward(const weights_ref& params, const std::int32_t* tokens, int batch,
                         octet::span<const float> dloss_dlogp, const gradients_ref& grads, step_telemetry& t) {
        constexpr const char* fn = "common::transformer::policy_backward";
        OCTET_REQUIRE(scored_batch_ == batch, fn, "batch",
                      octet::detail::message("is ", batch, " but the last score() was over ", scored_batch_,
                                             " sequences (0: none since the last backward); call score first"));
        OCTET_REQUIRE(scored_lent_ == buf_->lent, fn, "this",
                      "has step buffers that were lent (step_buffers::lend) since the last score(), which lost its "
                      "logits; call score again");
        check_call(fn, params, tokens, batch);
        const std::size_t n = static_cast<std::size_t>(batch) * T_;
        OCTET_REQUIRE(dloss_dlogp.size() == n, fn, "dloss_dlogp",
                      octet::detail::message("has ", dloss_dlogp.size(), " floats; pass batch * seq_len = ", n));
        check_gradients(fn, grads);
        {
            timer tm{&t, "loss"};
            for (std::size_t r = 0; r < n; ++r) {
                float* z = logits_.data() + r * V_;
                const double c = dloss_dlogp[r];
                const std::int32_t target = tokens[(r / T_) * (T_ + 1) + r % T_ + 1];
                const double lse = softmax_of(z, V_).lse;
                for (std::size_t v = 0; v < V_; ++v)
                    z[v] = static_cast<float>(c * ((v == static_cast<std::size_t>(target) ? 1.0 : 0.0) -
                                                   std::exp(static_cast<double>(z[v]) - lse)));
            }
        }
        scored_batch_ = 0;
        backward(params, tokens, batch, grads, &t);
    }

    /// Mean cross-entropy over the batch, forward only.
    double evaluate(const weights_ref& params, const std::int32_t* tokens, int batch) {
        check_call("common::transformer::evaluate", params, tokens, batch);
        forward(params, tokens, batch, T_, T_ + 1, false, nullptr);
        return loss(tokens, false, nullptr);
    }

    /// Samples n characters after `prompt` (the last seq_len tokens are the context), at
    /// `temperature` (<= 0: greedy). Runs the forward in float32 whatever the recipe (a sample
    /// is for reading, not for measuring the recipe), in the buffers it already has: a forward
    /// that does not train keeps nothing per layer, so sampling allocates nothing.
    std::vector<std::int32_t> generate(const weights_ref& params, std::vector<std::int32_t> prompt, int n,
                                       std::uint64_t seed, float temperature) {
        constexpr const char* fn = "common::transformer::generate";
        check_weights(fn, params);
        OCTET_REQUIRE(!prompt.empty(), fn, "prompt", "is empty; pass at least one token");
        for (auto tok : prompt)
            OCTET_REQUIRE(tok >= 0 && tok < cfg_.vocab, fn, "prompt",
                          octet::detail::message("holds token ", tok, " outside [0, vocab = ", cfg_.vocab, ")"));
        const bool was = sampling_;
        sampling_ = true;
        const octet::philox_stream rng{seed, 0};
        std::vector<std::int32_t> window;
        std::vector<double> p(V_);
        for (int step = 0; step < n; ++step) {
            const std::size_t len = std::min(prompt.size(), T_);
            window.assign(prompt.end() - static_cast<std::ptrdiff_t>(len), prompt.end());
            forward(params, window.data(), 1, len, len, false, nullptr);
            const float* z = logits_.data() + (len - 1) * V_;
            std::size_t pick = static_cast<std::size_t>(std::max_element(z, z + V_) - z);
            if (temperature > 0) {
                double sum = 0;
                for (std::size_t v = 0; v < V_; ++v) sum += p[v] = std::exp((z[v] - z[pick]) / temperature);
                double u = rng.uniform(static_cast<std::uint64_t>(step)) * sum;
                for (std::size_t v = 0; v < V_; ++v)
                    if ((u -= p[v]) < 0 || v + 1 == V_) {
                        pick = v;
                        break;
                    }
            }
            prompt.push_back(static_cast<std::int32_t>(pick));
        }
        sampling_ = was;
        return prompt;
    }

    /// Recovery's "raise precision": while on, every linear and attention runs in float32 (the
    /// float copies of the linears' inputs this needs are allocated here and freed when it ends).
    void set_high_precision(bool on) {
        if (on == high_precision_) return;
        high_precision_ = on;
        if (on) {
            for (auto& L : layers_) allocate_float_saves(L);
            // the float path's dY^T, where the step buffers hold the head's alone
            const std::size_t wide = raise_temporary_bytes(cfg_, recipe_, max_batch_) / sizeof(float);
            if (wide > 0) yt_raised_ = make_metered<float>(meter_, temporaries(), wide);
        } else {
            yt_raised_ = metered_vector<float>(meter_alloc(temporaries()));
        }
        if (!on && (!float_linear_recipe() || !float_attention_recipe() || bf16_attention_recipe(recipe_)))
            for (auto& L : layers_) {
                // move-assigning an empty vector frees the storage (a copy-assignment would keep it)
                if (!float_linear_recipe())
                    for (auto* v : {&L.h1, &L.h2, &L.a}) *v = metered_vector<float>(meter_alloc(activations()));
                if (!float_attention_recipe() || bf16_attention_recipe(recipe_))
                    L.qkv = metered_vector<float>(meter_alloc(activations()));
                if (packed_o()) L.o = metered_vector<float>(meter_alloc(activations()));
            }
    }
    bool high_precision() const { return high_precision_; }

private:
    static octet::memory_category activations() { return octet::memory_category::activations; }
    static octet::memory_category temporaries() { return octet::memory_category::temporaries; }
    metered_allocator<float> meter_alloc(octet::memory_category c) { return metered_allocator<float>(meter_, c); }

    struct memory_split {
        double activations = 0, temporaries = 0;
        double step_buffers = 0;  // the part of temporaries in step_buffers (shareable)
    };
    /// The floats of each of step_buffers' regions for this model at max_batch on `workers`
    /// threads (one list for the allocation and the ledger): the logits, h, qkv, the GELU output, 3
    /// residual-sized gradients, the widest gradient, dO, W^T, dY^T, the bf16 linears' rounded
    /// operands, the float attention's per-worker scratch, partial sums of the norms' gains, and
    /// under bf16 master weights the region their tensors are decoded into (weights_at).
    static step_buffers::region_sizes step_regions(const model_config& c, const recipe_config& r, int max_batch,
                                                   std::size_t workers) {
        const std::size_t N = static_cast<std::size_t>(max_batch) * static_cast<std::size_t>(c.seq_len);
        const std::size_t d = static_cast<std::size_t>(c.d_model), F = static_cast<std::size_t>(c.d_ff),
                          V = static_cast<std::size_t>(c.vocab);
        const std::size_t A = static_cast<std::size_t>(c.heads_q * c.head_dim),
                          W = A + 2 * static_cast<std::size_t>(c.heads_kv * c.head_dim);
        const std::size_t wide = std::max({W, F, A}), max_in_out = std::max({W * d, A * d, F * d, V * d});
        const bool bf16 = r.linear == linear_mode::bf16;
        using S = step_buffers;
        S::region_sizes f{};
        f[S::logits] = N * V;
        f[S::t_h] = N * d;
        f[S::t_qkv] = N * W;
        f[S::t_a] = N * F;
        f[S::dx] = f[S::dx2] = f[S::dh] = N * d;
        f[S::dwide] = N * wide;
        f[S::do_] = N * A;
        f[S::wt] = max_in_out;
        // dY^T: of every linear where they run in float or bf16, else of the head alone (a raised
        // step's float linears take their own, raise_temporary_bytes)
        f[S::yt] = N * (dense_linears(r) ? std::max({W, A, F, V, d}) : V);
        f[S::xr] = bf16 ? N * std::max(wide, d) : 0;
        f[S::wr] = bf16 ? max_in_out : 0;
        f[S::attn_scratch] = workers * attention_scratch_floats(static_cast<std::size_t>(c.seq_len),
                                                                static_cast<std::size_t>(c.head_dim));
        f[S::chunk_partials] = ((N + kChunk - 1) / kChunk) * d;
        f[S::wdec] = r.master == master_mode::bf16_stochastic
                         ? decode_slot_floats(c) + static_cast<std::size_t>(c.seq_len) * d
                         : 0;
        // bf16 gradients: one tensor's float gradient at a time (the largest matrix but the
        // embeddings', or the head's when untied), and the embeddings' for the whole backward
        const bool bf16_grads = r.gradients == gradient_storage::bf16;
        // (a MoE block's router, up and down together: its backward writes them at once)
        f[S::gstage] =
            bf16_grads ? std::max({W * d, A * d, F * d, c.tied_head ? d : V * d, parameter_layout(c).moe_params}) : 0;
        f[S::gemb] = bf16_grads ? (V + static_cast<std::size_t>(c.seq_len)) * d : 0;
        return f;
    }
    /// The mixture-of-experts MLP's shape of a model at max_batch sequences.
    static moe_shape moe_shape_of(const model_config& c, int max_batch) {
        moe_shape s;
        s.max_tokens = static_cast<std::size_t>(max_batch) * static_cast<std::size_t>(c.seq_len);
        s.d = static_cast<std::size_t>(c.d_model);
        s.ff = static_cast<std::size_t>(c.expert_ff());
        s.experts = static_cast<std::size_t>(c.moe_experts);
        s.k = static_cast<std::size_t>(c.moe_top_k);
        s.aux_loss = c.moe_aux_loss;
        return s;
    }
    /// Whether the recipe's linears run in float or bf16 on the host, transposing dY into the step
    /// buffers (an FP8 linear keeps its own copies; a raised step's float path takes them too).
    static bool dense_linears(const recipe_config& r) {
        return r.linear == linear_mode::float32 || r.linear == linear_mode::bf16;
    }
    /// Floats of slot 0 of the bf16 weights' decode region: the largest parameter tensor (slot 1,
    /// after it, holds the position embedding, read beside the token embedding).
    static std::size_t decode_slot_floats(const model_config& c) {
        const std::size_t d = static_cast<std::size_t>(c.d_model);
        const std::size_t W = static_cast<std::size_t>((c.heads_q + 2 * c.heads_kv) * c.head_dim);
        return std::max(d * std::max({W, static_cast<std::size_t>(c.d_ff), static_cast<std::size_t>(c.vocab),
                                      static_cast<std::size_t>(c.seq_len)}),
                        parameter_layout(c).moe_params);  // a MoE block's router, up and down, read at once
    }
    /// Bytes of the model's scratch arena: the largest ..._scratch_bytes query of the octet host
    /// operations a step of this recipe calls (the FP8 linears', the FP8 attention's quantizes,
    /// forward and backward, the saved activations' quantizes), on `threads` threads at max_batch.
    static std::size_t scratch_arena_bytes(const model_config& c, const recipe_config& r, int max_batch, int threads) {
        const octet::host_executor ex = octet::on_host(threads > 0 ? threads : octet::on_host().thread_count());
        const std::size_t N = static_cast<std::size_t>(max_batch) * static_cast<std::size_t>(c.seq_len);
        const std::size_t d = static_cast<std::size_t>(c.d_model), F = static_cast<std::size_t>(c.d_ff);
        const std::size_t A = static_cast<std::size_t>(c.heads_q * c.head_dim),
                          KW = static_cast<std::size_t>(c.heads_kv * c.head_dim);
        const std::size_t W = A + 2 * KW;
        using quant = octet::detail::quant_backend<octet::host_executor>;
        const auto rows = [](std::size_t n, std::size_t cols) {
            return octet::matrix_ref<const float>(nullptr, n, cols);
        };
        std::size_t most = 0;
#if TRAIN_HAS_FP8_LINEAR
        if (!r.make_linear) {  // the CUDA layers take device memory, not this arena
            const std::size_t shapes[4][2] = {{d, W}, {A, d}, {d, F}, {F, d}};
            const std::size_t used = c.moe_blocks() == c.layers ? 2 : 4;  // up and down: dense blocks only
            with_fp8_linear_recipe(r.linear, [&](auto tag) {
                using LR = typename decltype(tag)::type;
                for (std::size_t i = 0; i < used; ++i)
                    most = std::max(most, octet::linear_scratch_bytes<LR>(ex, N, shapes[i][0], shapes[i][1]));
            });
        }
#endif
        if (c.moe()) most = std::max(most, moe_scratch_bytes(r.linear, ex, moe_shape_of(c, max_batch)));
        if (r.attention == attention_mode::fp8) {
            std::vector<std::int32_t> cu(static_cast<std::size_t>(max_batch) + 1);
            for (std::size_t b = 0; b < cu.size(); ++b) cu[b] = static_cast<std::int32_t>(b * c.seq_len);
            octet::attention_shape shape;
            shape.cu_seqlens_q = octet::span<const std::int32_t>(cu.data(), cu.size());
            shape.heads_q = c.heads_q;
            shape.heads_kv = c.heads_kv;
            shape.head_dim = c.head_dim;
            octet::attention_backward_options bo;
            bo.telemetry = true;
            // Q, K, dO and V (its recipe's grid is no larger than per-token's) quantize row-major
            using QK = octet::recipe<octet::e4m3, octet::block<1, 32>, octet::scale::amax_ratio<0>>;
            most = std::max({most, quant::scratch_bytes<QK, float>(ex, rows(N, A), true, false),
                             quant::scratch_bytes<QK, float>(ex, rows(N, KW), true, false),
                             octet::attention_forward_scratch_bytes(ex, shape),
                             octet::attention_backward_scratch_bytes(ex, shape, bo)});
        }
        if (r.saved_activations == saved_storage::fp8)
            most = std::max({most, quant::scratch_bytes<saved_recipe, float>(ex, rows(N, d), true, false),
                             quant::scratch_bytes<saved_recipe, float>(ex, rows(N, F), true, false)});
        return most;
    }

    static memory_split memory_plan(const model_config& c, const recipe_config& r, int max_batch, int threads,
                                    std::size_t lend_bytes = 0) {
        checked(c, max_batch);
        const double N = static_cast<double>(max_batch) * c.seq_len, d = c.d_model, F = c.d_ff;
        const double Hq = c.heads_q, hd = c.head_dim, A = Hq * hd, KW = c.heads_kv * hd, W = A + 2 * KW;
        const double layers = c.layers, moe_layers = c.moe_blocks(), dense_layers = layers - moe_layers;
        memory_split m;
        // per layer, in floats per token: residual input and middle, two rstd, GELU input, O, L
        const bool packed = r.saved_activations != saved_storage::float32;
        double act = 2 + Hq + (packed_o_recipe(r) ? 0 : A);      // rstd1, rstd2, L, O (float)
        if (!packed) act += 2 * d + F;                           // x_in, x_mid, u in float
        if (r.linear == linear_mode::float32) act += 2 * d + F;  // the linears' float inputs
        if (r.attention == attention_mode::float32 && !bf16_attention_recipe(r)) act += W;  // Q, K, V
        m.activations = 4 * N * act * layers + 4 * N;                                       // + the final norm's rstd
        // a MoE block has no GELU input u nor up and down inputs of its own: its block keeps its saves
        m.activations -= 4 * N * moe_layers * ((packed ? 0 : F) + (r.linear == linear_mode::float32 ? d + F : 0));
        if (c.moe()) {
            const moe_block_memory mb = moe_memory_of(r.linear, moe_shape_of(c, max_batch));
            m.activations += moe_layers * mb.activations;
            m.temporaries += moe_layers * mb.temporaries + 4.0 * static_cast<double>(mb.scratch_floats);
        }
        // + its input: float, or its copy (its output is recomputed in the backward)
        const std::size_t Ns = static_cast<std::size_t>(N);
        m.activations +=
            packed ? static_cast<double>(saved_copy::bytes_of(r.saved_activations, Ns, static_cast<std::size_t>(d)))
                   : 4 * N * d;
        if (packed)  // x_in, x_mid, u (and O, Q K V where the recipe packs them) as copies; no u in a MoE block
            for (const std::size_t u_cols : {static_cast<std::size_t>(F), std::size_t{0}})
                m.activations += (u_cols ? dense_layers : moe_layers) *
                                 packed_saves_bytes(r, Ns, static_cast<std::size_t>(d), u_cols,
                                                    static_cast<std::size_t>(A), static_cast<std::size_t>(W));
        if (r.linear == linear_mode::bf16) m.activations += 2 * N * (2 * d + A + F) * layers;  // bf16 inputs
        const int workers = threads > 0 ? threads : octet::on_host().thread_count();
        const double chunks = std::ceil(N / kChunk);
        m.step_buffers =
            4.0 * static_cast<double>(step_buffers::block_floats(
                      step_regions(c, r, max_batch, static_cast<std::size_t>(std::max(1, workers))), lend_bytes)) +
            8 * chunks + 4 * (max_batch + 1.0);  // + loss partials (double), offsets
        // FP8 linears: octet's context says what it keeps for the backward and what it works in
        const std::size_t Nt = static_cast<std::size_t>(N);
        const std::size_t shapes[4][2] = {{static_cast<std::size_t>(d), static_cast<std::size_t>(W)},
                                          {static_cast<std::size_t>(A), static_cast<std::size_t>(d)},
                                          {static_cast<std::size_t>(d), static_cast<std::size_t>(F)},
                                          {static_cast<std::size_t>(F), static_cast<std::size_t>(d)}};
        // The host layers share one workspace (the largest layer's transient copies); the CUDA
        // layers (recipe.make_linear) keep their own.
        double shared_workspace = 0;
        for (std::size_t i = 0; i < 4; ++i) {
            const auto& sh = shapes[i];
            const double with = i < 2 ? layers : dense_layers;  // up and down: the dense blocks'
            if (with == 0) continue;
            const auto lm = fp8_linear_memory(r.linear, Nt, sh[0], sh[1], recompute_linears_recipe(r));
            m.activations += with * static_cast<double>(lm.saved_for_backward);
            // each model's own: the delayed-scaling histories, a CUDA layer's workspace
            m.temporaries += with * static_cast<double>(lm.state + (r.make_linear ? lm.workspace : 0));
            if (!r.make_linear)
                shared_workspace =
                    std::max(shared_workspace, static_cast<double>(fp8_linear_workspace_bytes(
                                                   r.linear, Nt, sh[0], sh[1], recompute_linears_recipe(r))));
        }
        m.step_buffers += shared_workspace;
        m.step_buffers += static_cast<double>(scratch_arena_bytes(c, r, max_batch, threads));
        m.temporaries += m.step_buffers;
        // FP8 attention: E4M3 Q, K, V per layer (activations) and dO (temporaries)
        if (r.attention == attention_mode::fp8) {
            const auto q = fp8_attention_bytes(c.head_dim, false, Nt, static_cast<std::size_t>(A));
            const auto kv = fp8_attention_bytes(c.head_dim, false, Nt, static_cast<std::size_t>(KW));
            const auto v =
                fp8_attention_bytes(c.head_dim, r.v_scale == v_scale_mode::per_head, Nt, static_cast<std::size_t>(KW));
            m.activations += layers * static_cast<double>(q + kv + v);
            m.temporaries += static_cast<double>(q);
        }
        return m;
    }
    /// Bytes of an E4M3 copy of tokens x cols with one scale per token and head (or per head).
    static std::size_t fp8_attention_bytes(int head_dim, bool per_head, std::size_t tokens, std::size_t cols) {
        auto bytes = [&](auto recipe_tag) {
            using R = decltype(recipe_tag);
            const auto l = octet::quant_layout_of<R>::make(tokens, cols);
            return l.data_bytes + l.scale_bytes;
        };
        if (head_dim == 32)
            return per_head
                       ? bytes(octet::recipe<octet::e4m3, octet::block<octet::full, 32>, octet::scale::amax_ratio<0>>{})
                       : bytes(octet::recipe<octet::e4m3, octet::block<1, 32>, octet::scale::amax_ratio<0>>{});
        return per_head
                   ? bytes(octet::recipe<octet::e4m3, octet::block<octet::full, 64>, octet::scale::amax_ratio<0>>{})
                   : bytes(octet::recipe<octet::e4m3, octet::block<1, 64>, octet::scale::amax_ratio<0>>{});
    }
    /// Bytes of octet::linear_workspace a layer of this mode binds (none for float32 / bf16).
    static std::size_t fp8_linear_workspace_bytes(linear_mode mode, std::size_t tokens, std::size_t in, std::size_t out,
                                                  bool recompute_input) {
        std::size_t bytes = 0;
#if TRAIN_HAS_FP8_LINEAR
        with_fp8_linear_recipe(mode, [&](auto tag) {
            using LR = typename decltype(tag)::type;
            bytes = octet::linear_context<LR>::workspace_bytes(
                fp8_linear_config(tokens, static_cast<int>(in), static_cast<int>(out), 0, recompute_input));
        });
#else
        (void)mode, (void)tokens, (void)in, (void)out, (void)recompute_input;
#endif
        return bytes;
    }
    /// What octet's linear_context of this mode reports for its buffers (none for float32 / bf16).
    static octet::linear_memory fp8_linear_memory(linear_mode mode, std::size_t tokens, std::size_t in, std::size_t out,
                                                  bool recompute_input = false) {
#if TRAIN_HAS_FP8_LINEAR
        octet::linear_config lc;
        lc.max_tokens = tokens;
        lc.in_features = in;
        lc.out_features = out;
        lc.recompute_input = recompute_input;
        namespace lr = octet::linear_recipes;
        switch (mode) {
            case linear_mode::tensorwise_delayed:
                return octet::linear_context<lr::tensorwise_delayed>(lc).memory();
            case linear_mode::tensorwise:
                return octet::linear_context<lr::tensorwise>(lc).memory();
            case linear_mode::blockwise:
                return octet::linear_context<lr::blockwise>(lc).memory();
            case linear_mode::mxfp8:
                return octet::linear_context<lr::mxfp8>(lc).memory();
            case linear_mode::nvfp4:
                return octet::linear_context<lr::nvfp4>(lc).memory();
            default:
                break;
        }
#endif
        (void)mode, (void)tokens, (void)in, (void)out, (void)recompute_input;
        return {};
    }

    static const model_config& checked(const model_config& c, int max_batch) {
        constexpr const char* fn = "common::transformer";
        OCTET_REQUIRE(c.vocab > 0, fn, "config.vocab",
                      octet::detail::message("is ", c.vocab, "; set it from the corpus"));
        OCTET_REQUIRE(c.head_dim == 32 || c.head_dim == 64, fn, "config.head_dim",
                      octet::detail::message("is ", c.head_dim, "; the model supports head_dim 32 or 64"));
        OCTET_REQUIRE(c.heads_q > 0 && c.heads_kv > 0 && c.heads_q % c.heads_kv == 0, fn, "config.heads_kv",
                      octet::detail::message("is ", c.heads_kv, " with heads_q ", c.heads_q,
                                             "; heads_kv must be positive and divide heads_q"));
        OCTET_REQUIRE(c.d_model == c.heads_q * c.head_dim, fn, "config.d_model",
                      octet::detail::message("is ", c.d_model, " but heads_q * head_dim = ", c.heads_q * c.head_dim));
        OCTET_REQUIRE(c.layers > 0 && c.d_ff > 0 && c.seq_len > 0, fn, "config", "needs layers, d_ff and seq_len > 0");
        OCTET_REQUIRE(max_batch > 0, fn, "max_batch", octet::detail::message("is ", max_batch, "; pass at least 1"));
        return c;
    }

    void check_weights(const char* fn, const weights_ref& params) const {
        OCTET_REQUIRE(params.size() == lay_.total, fn, "params",
                      octet::detail::message("has ", params.size(), " values but the model has ", lay_.total,
                                             "; size it with parameter_count(config)"));
        OCTET_REQUIRE(params.f32 != nullptr || !wdec_.empty(), fn, "params",
                      "are bf16, but this recipe's model decodes none (its recipe.master is float32); pass float32 "
                      "parameters, or build the model for a recipe with bf16 master weights");
    }
    void check_gradients(const char* fn, const gradients_ref& grads) const {
        OCTET_REQUIRE(grads.size() == lay_.total, fn, "grads",
                      octet::detail::message("has ", grads.size(), " values but the model has ", lay_.total,
                                             "; size it with parameter_count(config)"));
        OCTET_REQUIRE(grads.f32 != nullptr || !gstage_.empty() || lay_.total == 0, fn, "grads",
                      "are bf16, but this model was built for float32 gradients (recipe.gradients); pass float32 "
                      "gradients, or build the model with recipe.gradients = gradient_storage::bf16");
    }
    void check_call(const char* fn, const weights_ref& params, const std::int32_t* tokens, int batch) const {
        check_weights(fn, params);
        OCTET_REQUIRE(batch >= 1 && batch <= max_batch_, fn, "batch",
                      octet::detail::message("is ", batch, "; pass 1 to max_batch = ", max_batch_,
                                             " (the buffers are sized in the constructor)"));
        OCTET_REQUIRE(tokens != nullptr, fn, "tokens", "is null; pass batch * (seq_len + 1) token ids");
        const std::size_t n = static_cast<std::size_t>(batch) * (T_ + 1);
        for (std::size_t i = 0; i < n; ++i)
            OCTET_REQUIRE(tokens[i] >= 0 && tokens[i] < cfg_.vocab, fn, "tokens",
                          octet::detail::message("holds ", tokens[i], " at index ", i,
                                                 ", outside [0, vocab = ", cfg_.vocab, ")"));
    }

    bool float_linear_recipe() const {
        return recipe_.linear == linear_mode::float32;
    }
    bool float_attention_recipe() const {
        return recipe_.attention == attention_mode::float32;
    }
    bool float_linear() const {
        return high_precision_ || sampling_ || float_linear_recipe();
    }
    bool float_attention() const {
        return high_precision_ || sampling_ || float_attention_recipe();
    }

    // ---- buffers ---------------------------------------------------------------------------------
    /// A layer's RMSNorm inputs (the residual stream before and after attention), GELU input and,
    /// under compress_o, attention's output as FP8 copies, booked as activations; their float values
    /// live in shared temporaries while the forward uses them, and are decoded into temporaries for
    /// the backward.
    using saved_recipe = saved_copy::fp8_recipe;
    struct packed_saves {
        /// o_cols: attention's output width when it is kept as a copy too (packed_o), else 0;
        /// qkv_cols: Q, K, V's width when they are (bf16_attention), else 0.
        packed_saves(memory_meter& m, saved_storage st, std::size_t tokens, std::size_t d, std::size_t F,
                     std::size_t o_cols, std::size_t qkv_cols)
            : x_in(st, tokens, d),
              x_mid(st, tokens, d),
              u(st, F ? tokens : 0, F),
              o(st, o_cols ? tokens : 0, o_cols),
              qkv(st, qkv_cols ? tokens : 0, qkv_cols),
              booking(m, octet::memory_category::activations,
                      static_cast<double>(x_in.bytes() + x_mid.bytes() + u.bytes() + o.bytes() + qkv.bytes())) {}
        saved_copy x_in, x_mid, u, o, qkv;
        meter_booking booking;
    };
    /// The final norm's input as a copy (recipe.saved_activations).
    struct packed_final {
        packed_final(memory_meter& m, saved_storage st, std::size_t tokens, std::size_t d)
            : x(st, tokens, d), booking(m, octet::memory_category::activations, static_cast<double>(x.bytes())) {}
        saved_copy x;
        meter_booking booking;
    };
    struct layer_state {
        explicit layer_state(memory_meter& m)
            : x_in(alloc(m)),
              rstd1(alloc(m)),
              x_mid(alloc(m)),
              rstd2(alloc(m)),
              u(alloc(m)),
              o(alloc(m)),
              lse(alloc(m)),
              h1(alloc(m)),
              h2(alloc(m)),
              a(alloc(m)),
              qkv(alloc(m)) {}
        static metered_allocator<float> alloc(memory_meter& m) {
            return metered_allocator<float>(m, octet::memory_category::activations);
        }
        metered_vector<float> x_in, rstd1, x_mid, rstd2, u, o, lse;  // kept for the backward (x_in, x_mid, u: float)
        metered_vector<float> h1, h2, a;  // float inputs of qkv, up, down (while they compute in float)
        metered_vector<float> qkv;        // Q, K, V in float (while attention computes in float)
        std::unique_ptr<linear_layer> lin_qkv, lin_proj, lin_up, lin_down;  // (up, down: a dense MLP)
        std::unique_ptr<moe_block> moe;        // the MLP of a mixture-of-experts block (no up, down, u)
        std::unique_ptr<packed_saves> packed;  // x_in, x_mid, u (o, qkv) as copies (recipe.saved_activations)
    };

    /// Bytes of one layer's packed_saves at `tokens` under recipe r (the ledger's side); F: GELU's
    /// input width (0 in a MoE block); A and W: attention's output and Q, K, V widths.
    static double packed_saves_bytes(const recipe_config& r, std::size_t tokens, std::size_t d, std::size_t F,
                                     std::size_t A, std::size_t W) {
        const saved_storage st = r.saved_activations;
        return static_cast<double>(2 * saved_copy::bytes_of(st, tokens, d) +
                                   saved_copy::bytes_of(st, F ? tokens : 0, F) +
                                   (packed_o_recipe(r) ? saved_copy::bytes_of(st, tokens, A) : 0) +
                                   (bf16_attention_recipe(r) ? saved_copy::bytes_of(st, tokens, W) : 0));
        // (O's copy only where packed_o_recipe; under float32 linears O stays in the layer's floats)
    }
    /// Whether the non-linear layers' inputs are kept as copies (bf16 or FP8), not as floats.
    bool compress() const {
        return recipe_.saved_activations != saved_storage::float32;
    }
    /// Whether attention's output is kept only as FP8 (compress_o_recipe): with the FP8 attention
    /// and matched delta its backward's gradients never read O (D = sum_j P_ij dP_ij); only the
    /// telemetry's gap to rowsum(dO * O) does, which then reads the E4M3 copy. Not under float32
    /// linears: the output projection's float backward reads O itself (packed_o_recipe).
    /// Whether the host FP8 linears keep no copy of their inputs (recipe.recompute_linear_inputs;
    /// not nvfp4, whose copy is of a rotated X, nor the CUDA layers of recipe.make_linear).
    static bool recompute_linears_recipe(const recipe_config& r) {
        return r.recompute_linear_inputs && r.linear != linear_mode::float32 && r.linear != linear_mode::bf16 &&
               r.linear != linear_mode::nvfp4 && !r.make_linear;
    }
    bool recompute_linears() const {
        return recompute_linears_recipe(recipe_);
    }
    static bool compress_o_recipe(const recipe_config& r) {
        return r.saved_activations == saved_storage::fp8 && r.attention == attention_mode::fp8 &&
               r.delta == octet::delta_mode::matched && r.linear != linear_mode::float32;
    }
    bool compress_o() const {
        return compress_o_recipe(recipe_);
    }
    /// Whether the float32 attention keeps its inputs Q, K, V and output O as bf16 copies (bf16
    /// saved activations, as autocast's bf16 attention does): Q, K, V and O are rounded to bf16 in
    /// the forward, which computes on the rounded values, and the backward decodes them.
    static bool bf16_attention_recipe(const recipe_config& r) {
        return r.saved_activations == saved_storage::bf16 && r.attention == attention_mode::float32;
    }
    /// ... while the attention runs in the recipe's precision (not raised, not sampling).
    bool bf16_attention() const {
        return bf16_attention_recipe(recipe_) && !high_precision_ && !sampling_;
    }
    /// Whether attention's output is kept only as a copy (FP8: compress_o; bf16: bf16_attention),
    /// not in the layer's float O. Not under float32 linears: the output projection's float path
    /// keeps a pointer to its input O until its backward (there O stays float, rounded to bf16).
    static bool packed_o_recipe(const recipe_config& r) {
        return compress_o_recipe(r) || (bf16_attention_recipe(r) && r.linear != linear_mode::float32);
    }
    bool packed_o() const {
        return packed_o_recipe(recipe_);
    }
    /// Where layer l's attention writes O: the layer's float O, or (packed_o, unless a float
    /// attention trains on floats: raised precision) the shared do_, free until the backward.
    float* o_of(std::size_t l, bool training) {
        if (!packed_o() || (float_attention() && training && !bf16_attention())) return layers_[l].o.data();
        return do_.data();
    }
    // The float x_in, x_mid and u of layer l: the layer's own, or (compressed) shared temporaries
    // that the forward's other buffers never use: dh_ and dx2_ (backward-only) and t_a_, where GELU
    // then runs in place.
    float* x_in_of(std::size_t l) {
        return compress() ? dh_.data() : layers_[l].x_in.data();
    }
    float* x_mid_of(std::size_t l) {
        return compress() ? dx2_.data() : layers_[l].x_mid.data();
    }
    float* u_of(std::size_t l) {
        return compress() ? t_a_.data() : layers_[l].u.data();
    }
    // The final norm's float input: the model's, or (compressed) dh_, free once the last layer's
    // residual middle is computed.
    float* x_fin_of() {
        return compress() ? dh_.data() : x_fin_.data();
    }

    void allocate_float_saves(layer_state& L) {
        if (L.h1.empty()) {
            L.h1 = make_metered<float>(meter_, activations(), Nmax_ * d_);
            if (!L.moe) {  // a MoE block keeps its own copies
                L.h2 = make_metered<float>(meter_, activations(), Nmax_ * d_);
                L.a = make_metered<float>(meter_, activations(), Nmax_ * F_);
            }
        }
        if (L.qkv.empty()) L.qkv = make_metered<float>(meter_, activations(), Nmax_ * lay_.qkv_out);
        if (L.o.empty()) L.o = make_metered<float>(meter_, activations(), Nmax_ * lay_.attn_width);
    }

    octet::linear_workspace* shared_linear_workspace() {
#if TRAIN_HAS_FP8_LINEAR
        return &linear_workspace_;
#else
        return nullptr;
#endif
    }

    std::unique_ptr<linear_layer> make_linear(int in, int out) {
        const std::uint64_t seed = seed_ * 1000003u + linear_count_++;  // one stream per layer
        if (recipe_.make_linear) return recipe_.make_linear(meter_, recipe_.linear, Nmax_, in, out, seed);
        return make_linear_layer(meter_, recipe_.linear, Nmax_, in, out, seed, shared_linear_workspace(),
                                 recompute_linears());
    }

    /// The layers' buffers, and with `first` the step buffers (else: checks they fit this model).
    void allocate(bool first) {
        const std::string shape = octet::detail::message(
            cfg_.d_model, ' ', cfg_.layers, ' ', cfg_.heads_q, ' ', cfg_.heads_kv, ' ', cfg_.head_dim, ' ', cfg_.d_ff,
            ' ', cfg_.seq_len, ' ', cfg_.vocab, ' ', max_batch_, ' ', ex_.thread_count(), ' ', recipe_.name, ' ',
            static_cast<int>(recipe_.linear), ' ', static_cast<int>(recipe_.attention));
        OCTET_REQUIRE(first || buf_->sized_for == shape, "common::transformer", "shared",
                      "holds step buffers sized for another model (" + buf_->sized_for + " against " + shape +
                          "); share them only between models of one configuration, recipe, batch and thread count");
        auto act = [&](std::size_t n) { return make_metered<float>(meter_, activations(), n); };
        const std::size_t N = Nmax_, W = lay_.qkv_out, A = lay_.attn_width;
        const std::size_t Hq = static_cast<std::size_t>(cfg_.heads_q);
        layers_.reserve(static_cast<std::size_t>(cfg_.layers));
        for (int l = 0; l < cfg_.layers; ++l) layers_.emplace_back(meter_);
        if (cfg_.moe() && recipe_.linear == linear_mode::float32)
            moe_scratch_ = std::make_unique<moe_scratch>(meter_, moe_shape_of(cfg_, max_batch_));
        for (std::size_t l = 0; l < layers_.size(); ++l) {
            auto& L = layers_[l];
            const bool moe = cfg_.moe_block(static_cast<int>(l));
            if (moe) L.moe = make_moe_block(meter_, recipe_.linear, moe_shape_of(cfg_, max_batch_), moe_scratch_.get());
            if (compress()) {
                L.packed = std::make_unique<packed_saves>(meter_, recipe_.saved_activations, N, d_, moe ? 0 : F_,
                                                          packed_o() ? A : 0, bf16_attention_recipe(recipe_) ? W : 0);
            } else {
                L.x_in = act(N * d_);
                L.x_mid = act(N * d_);
                if (!moe) L.u = act(N * F_);
            }
            L.rstd1 = act(N);
            L.rstd2 = act(N);
            if (!packed_o()) L.o = act(N * A);
            L.lse = act(Hq * N);
            if (float_linear_recipe()) {
                L.h1 = act(N * d_);
                if (!moe) {
                    L.h2 = act(N * d_);
                    L.a = act(N * F_);
                }
            }
            if (float_attention_recipe() && !bf16_attention_recipe(recipe_)) L.qkv = act(N * W);
            L.lin_qkv = make_linear(cfg_.d_model, static_cast<int>(W));
            L.lin_proj = make_linear(static_cast<int>(A), cfg_.d_model);
            if (!moe) {
                L.lin_up = make_linear(cfg_.d_model, cfg_.d_ff);
                L.lin_down = make_linear(cfg_.d_ff, cfg_.d_model);
            }
        }
        if (compress())
            x_fin_packed_ = std::make_unique<packed_final>(meter_, recipe_.saved_activations, N, d_);
        else
            x_fin_ = act(N * d_);
        rstd_f_ = act(N);
        if (!float_attention_recipe()) {
            const std::size_t L = layers_.size(), Hk = static_cast<std::size_t>(cfg_.heads_kv);
            fp8_attn_ = cfg_.head_dim == 32 ? make_fp8_attention<32>(meter_, recipe_.v_scale, L, N, Hq, Hk)
                                            : make_fp8_attention<64>(meter_, recipe_.v_scale, L, N, Hq, Hk);
        }
        workers_ = static_cast<std::size_t>(std::max(1, ex_.thread_count()));
        if (!first) return;
        buf_->sized_for = shape;
#if TRAIN_HAS_FP8_LINEAR
        if (linear_workspace_.bytes() > 0)
            buf_->workspace_booking =
                std::make_unique<meter_booking>(meter_, temporaries(), static_cast<double>(linear_workspace_.bytes()));
#endif
        buf_->carve(step_regions(cfg_, recipe_, max_batch_, workers_));
        cu_ = metered_vector<std::int32_t>(static_cast<std::size_t>(max_batch_) + 1, 0,
                                           metered_allocator<std::int32_t>(meter_, temporaries()));
        loss_partials_ =
            metered_vector<double>((N + kChunk - 1) / kChunk, 0.0, metered_allocator<double>(meter_, temporaries()));
    }

    attention_dims dims(int batch, std::size_t len) const {
        return {static_cast<std::size_t>(batch), len, static_cast<std::size_t>(cfg_.heads_q),
                static_cast<std::size_t>(cfg_.heads_kv), static_cast<std::size_t>(cfg_.head_dim)};
    }

    /// Parameters [off, off + count) as floats: in place when they are float32; decoded from bf16
    /// into the step buffers' decode region otherwise (slot 0: any tensor; slot 1: the position
    /// embedding, beside the token embedding), valid until that slot's next read. Decoding is
    /// exact (bf16 widens to float), so both forms compute the same bits.
    const float* weights_at(const weights_ref& P, std::size_t off, std::size_t count, int slot = 0) {
        if (P.f32) return P.f32 + off;
        float* out = wdec_.data() + (slot == 0 ? 0 : decode_slot_floats(cfg_));
        const octet::bf16* in = P.b16 + off;
        octet::parallel_for(ex_, count, 1 << 14, [&](std::size_t b, std::size_t e) {
            for (std::size_t i = b; i < e; ++i) out[i] = octet::to_float(in[i]);
        });
        return out;
    }

    linear_layer::scratch lin_scratch() {
        return {wt_.data(), yt_raised_.empty() ? yt_.data() : yt_raised_.data(), xr_.empty() ? nullptr : xr_.data(),
                wr_.empty() ? nullptr : wr_.data()};
    }

    // ---- forward -----------------------------------------------------------------------------
    /// A dense block's MLP: dx_ = W_down gelu(W_up h2) (u and the GELU output kept as the recipe keeps them).
    void dense_mlp_forward(const weights_ref& P, std::size_t l, float* h2, std::size_t N, bool training,
                           const linear_layer::scratch& s, step_telemetry* t) {
        auto& L = layers_[l];
        const auto& B = lay_.blocks[l];
        {
            timer tm{t, "linear"};
            L.lin_up->forward(ex_, h2, N, weights_at(P, B.up, F_ * d_), u_of(l), float_linear(), training, s, t);
        }
        float* a = float_linear() && training ? L.a.data() : t_a_.data();  // compressed: u_of(l) is t_a_ (in place)
        {
            timer tm{t, "mlp_activation"};
            if (compress() && training) L.packed->u.store(ex_, octet::matrix_ref<const float>(u_of(l), N, F_));
            gelu_forward(u_of(l), a, N * F_);
        }
        {
            timer tm{t, "linear"};
            L.lin_down->forward(ex_, a, N, weights_at(P, B.down, d_ * F_), dx_.data(), float_linear(), training, s, t);
        }
    }

    using clock = std::chrono::steady_clock;
    struct timer {
        step_telemetry* t;
        const char* key;
        clock::time_point t0 = clock::now();
        ~timer() {
            if (t) t->op_seconds[key] += std::chrono::duration<double>(clock::now() - t0).count();
        }
    };

    /// Forward over `batch` sequences of `len` input tokens, sequence b starting at tokens[b * stride].
    /// Leaves the logits in logits_.
    void forward(const weights_ref& P, const std::int32_t* tokens, int batch, std::size_t len, std::size_t stride,
                 bool training, step_telemetry* t) {
        const std::size_t N = static_cast<std::size_t>(batch) * len;
        scored_batch_ = 0;  // logits_ is about to change
        if (t) {
            for (const char* k : {"linear", "attention", "norm", "mlp_activation", "embedding_head", "loss"})
                t->op_seconds[k] = 0.0;
            if (cfg_.moe()) t->op_seconds["moe"] = 0.0;
        }
        n_ = N;
        len_ = len;
        batch_ = batch;
        const auto s = lin_scratch();
        float* x = layers_.empty() ? x_fin_of() : x_in_of(0);
        {
            timer tm{t, "embedding_head"};
            const float* E = weights_at(P, lay_.tok_emb, V_ * d_);
            const float* PE = weights_at(P, lay_.pos_emb, T_ * d_, 1);
            octet::parallel_for(ex_, N, 256, [&](std::size_t b, std::size_t e) {
                for (std::size_t n = b; n < e; ++n) {
                    const std::size_t seq = n / len, pos = n % len;
                    const float* te = E + static_cast<std::size_t>(tokens[seq * stride + pos]) * d_;
                    const float* pe = PE + pos * d_;
                    for (std::size_t c = 0; c < d_; ++c) x[n * d_ + c] = te[c] + pe[c];
                }
            });
        }
        for (std::size_t l = 0; l < layers_.size(); ++l) {
            auto& L = layers_[l];
            const auto& B = lay_.blocks[l];
            // A float linear or attention keeps its inputs for the backward in the layer's own
            // buffers; a forward that does not train (or an FP8 one) works in shared temporaries.
            float* h1 = float_linear() && training ? L.h1.data() : t_h_.data();
            float* qkv = float_attention() && training && !bf16_attention() ? L.qkv.data() : t_qkv_.data();
            {
                timer tm{t, "norm"};
                rmsnorm_forward(x_in_of(l), weights_at(P, B.norm1, d_), h1, L.rstd1.data(), N);
                if (compress() && training)
                    L.packed->x_in.store(ex_, octet::matrix_ref<const float>(x_in_of(l), N, d_));
            }
            {
                timer tm{t, "linear"};
                L.lin_qkv->forward(ex_, h1, N, weights_at(P, B.qkv, lay_.qkv_out * d_), qkv, float_linear(), training,
                                   s, t);
            }
            {
                timer tm{t, "attention"};
                if (bf16_attention()) {  // on bf16 Q, K, V (kept for the backward)
                    round_to_bf16(qkv, N * lay_.qkv_out);
                    if (training) L.packed->qkv.store(ex_, octet::matrix_ref<const float>(qkv, N, lay_.qkv_out));
                }
                if (float_attention())
                    attention_forward_f32(ex_, dims(batch, len), qkv, o_of(l, training), L.lse.data(),
                                          attn_scratch_.data(), workers_);
                else
                    attention_forward_fp8(l, qkv, o_of(l, training), batch, len, t);
                if (bf16_attention()) round_to_bf16(o_of(l, training), N * lay_.attn_width);  // (as kept)
                if (packed_o() && training && (!float_attention() || bf16_attention()))
                    L.packed->o.store(ex_, octet::matrix_ref<const float>(o_of(l, training), N, lay_.attn_width));
            }
            {
                timer tm{t, "linear"};
                L.lin_proj->forward(ex_, o_of(l, training), N, weights_at(P, B.proj, d_ * lay_.attn_width), dx_.data(),
                                    float_linear(), training, s, t);
            }
            float* h2 = float_linear() && training && !L.moe ? L.h2.data() : t_h_.data();
            {
                timer tm{t, "norm"};
                add(x_in_of(l), dx_.data(), x_mid_of(l), N * d_);
                rmsnorm_forward(x_mid_of(l), weights_at(P, B.norm2, d_), h2, L.rstd2.data(), N);
                if (compress() && training)
                    L.packed->x_mid.store(ex_, octet::matrix_ref<const float>(x_mid_of(l), N, d_));
            }
            if (L.moe) {
                timer tm{t, "moe"};
                const moe_forward_stats st =
                    L.moe->forward(ex_, h2, N, weights_at(P, B.router, B.moe_params), dx_.data());
                if (t) {
                    t->expert_tokens.emplace_back(st.counts.begin(), st.counts.end());
                    t->moe_dropped += st.dropped;
                    t->moe_aux_loss += st.aux_loss;
                    t->dispatch_fp8_bytes += static_cast<double>(st.dispatch.codes + st.dispatch.scales);
                    t->dispatch_bf16_bytes += static_cast<double>(st.dispatch.bf16);
                }
            } else {
                dense_mlp_forward(P, l, h2, N, training, s, t);
            }
            {
                timer tm{t, "norm"};
                float* next = l + 1 < layers_.size() ? x_in_of(l + 1) : x_fin_of();
                add(x_mid_of(l), dx_.data(), next, N * d_);
            }
        }
        {
            timer tm{t, "norm"};
            // the norm's output H in t_h_ (the backward recomputes it: the same bits)
            rmsnorm_forward(x_fin_of(), weights_at(P, lay_.norm_f, d_), t_h_.data(), rstd_f_.data(), N);
            if (compress() && training) x_fin_packed_->x.store(ex_, octet::matrix_ref<const float>(x_fin_of(), N, d_));
        }
        {
            timer tm{t, "embedding_head"};
            transpose(ex_, weights_at(P, lay_.head, V_ * d_), V_, d_, wt_.data());
            gemm(ex_, t_h_.data(), d_, wt_.data(), V_, logits_.data(), V_, N, V_, d_);
        }
    }

    /// Mean cross-entropy of logits_ against the targets; with `gradient`, logits_ becomes
    /// d loss / d logits = (softmax - onehot) / N.
    double loss(const std::int32_t* tokens, bool gradient, step_telemetry* t) {
        timer tm{t, "loss"};
        const std::size_t N = n_, chunks = (N + kChunk - 1) / kChunk;
        double* sums = loss_partials_.data();  // per chunk of rows: its loss sum, added in order below
        octet::parallel_for(ex_, chunks, 1, [&](std::size_t c0, std::size_t c1) {
            for (std::size_t c = c0; c < c1; ++c) {
                double acc = 0;
                for (std::size_t n = c * kChunk; n < std::min(N, (c + 1) * kChunk); ++n) {
                    const std::size_t seq = n / T_, pos = n % T_;
                    const std::int32_t target = tokens[seq * (T_ + 1) + pos + 1];
                    float* z = logits_.data() + n * V_;
                    const float m = *std::max_element(z, z + V_);
                    double sum = 0;
                    for (std::size_t v = 0; v < V_; ++v) sum += std::exp(static_cast<double>(z[v] - m));
                    const double lse = static_cast<double>(m) + std::log(sum);
                    acc += lse - z[target];
                    if (gradient) {
                        const double inv_n = 1.0 / static_cast<double>(N);
                        for (std::size_t v = 0; v < V_; ++v)
                            z[v] = static_cast<float>(std::exp(static_cast<double>(z[v]) - lse) * inv_n);
                        z[target] -= static_cast<float>(inv_n);
                    }
                }
                sums[c] = acc;
            }
        });
        double total = 0;
        for (std::size_t c = 0; c < chunks; ++c) total += sums[c];
        return total / static_cast<double>(N);
    }

    // ---- backward ----------------------------------------------------------------------------
    // The saved x_in, x_mid and u of layer l for the backward: the layer's floats, or (compressed)
    // their FP8 copies decoded into temporaries the backward does not otherwise use (t_h_, t_a_).
    const float* saved_x_in(std::size_t l) {
        return decoded(l, &packed_saves::x_in, t_h_.data(), d_);
    }
    const float* saved_x_mid(std::size_t l) {
        return decoded(l, &packed_saves::x_mid, t_h_.data(), d_);
    }
    const float* saved_u(std::size_t l) {
        return decoded(l, &packed_saves::u, t_a_.data(), F_);
    }
    const float* decoded(std::size_t l, saved_copy packed_saves::*which, float* into, std::size_t cols) {
        auto& L = layers_[l];
        if (!compress()) {
            if (which == &packed_saves::x_in) return L.x_in.data();
            if (which == &packed_saves::x_mid) return L.x_mid.data();
            return L.u.data();
        }
        (L.packed.get()->*which).load(ex_, octet::matrix_ref<float>(into, n_, cols));
        return into;
    }

    /// Attention's output O of layer l for the backward: the layer's float O, or its copy decoded into `into`.
    const float* saved_o(std::size_t l, float* into) {
        auto& L = layers_[l];
        if (!packed_o() || !L.o.empty()) return L.o.data();
        L.packed->o.load(ex_, octet::matrix_ref<float>(into, n_, lay_.attn_width));
        return into;
    }

    /// Where the backward writes tensor [off, off + n) of the gradient in float: in place, or for bf16
    /// gradients the staging region (one tensor at a time; grad_done rounds it into place).
    float* grad_out(const gradients_ref& G, std::size_t off, std::size_t n) {
        if (G.f32) return G.f32 + off;
        OCTET_REQUIRE(n <= gstage_.size(), "common::transformer::backward", "grads",
                      "has a tensor larger than the staging region (step_regions is out of date)");
        return gstage_.data();
    }
    /// Tensor [off, off + n), written at `from` (grad_out's), is complete: bf16 gradients round it
    /// once to nearest even into place.
    void grad_done(const gradients_ref& G, std::size_t off, std::size_t n, const float* from) {
        if (G.f32) return;
        octet::bf16* out = G.b16 + off;
        octet::parallel_for(ex_, n, 1 << 15, [&](std::size_t i0, std::size_t i1) {
            for (std::size_t i = i0; i < i1; ++i) out[i] = octet::to_bf16(from[i]);
        });
    }
    /// The float gradient of the embeddings (the first (vocab + seq_len) d parameters, tok_emb then
    /// pos_emb; the tied head's too) for the whole backward: in place, or gemb_ for bf16 gradients.
    float* embedding_grads(const gradients_ref& G) {
        return G.f32 ? G.f32 : gemb_.data();
    }

    /// A dense block's MLP backward: dh_ = d loss / d h2 from dx, the up and down gradients.
    void dense_mlp_backward(const weights_ref& P, std::size_t l, const float* dx, const gradients_ref& G,
                            const linear_layer::scratch& s, step_telemetry* t) {
        auto& L = layers_[l];
        const auto& B = lay_.blocks[l];
        const std::size_t N = n_;
        float* dwide = dwide_.data();
        {
            timer tm{t, "linear"};
            // recomputed input: GELU's output, from its input (decoded into t_a_ and activated there)
            const float* a = nullptr;
            if (L.lin_down->recomputes_input()) {
                gelu_forward(saved_u(l), t_a_.data(), N * F_);
                a = t_a_.data();
            }
            float* dw = grad_out(G, B.down, d_ * F_);
            L.lin_down->backward(ex_, dx, N, weights_at(P, B.down, d_ * F_), dwide, dw, s, t, a);
            grad_done(G, B.down, d_ * F_, dw);
        }
        {
            timer tm{t, "mlp_activation"};
            gelu_backward(saved_u(l), dwide, N * F_);
        }
        {
            timer tm{t, "linear"};
            // recomputed input: the second norm's output, from its input and rstd, into t_qkv_ (free here)
            const float* h2 = nullptr;
            if (L.lin_up->recomputes_input())
                h2 = rmsnorm_apply(saved_x_mid(l), weights_at(P, B.norm2, d_), L.rstd2.data(), t_qkv_.data(), N);
            float* dw = grad_out(G, B.up, F_ * d_);
            L.lin_up->backward(ex_, dwide, N, weights_at(P, B.up, F_ * d_), dh_.data(), dw, s, t, h2);
            grad_done(G, B.up, F_ * d_, dw);
        }
    }

    void backward(const weights_ref& P, const std::int32_t* tokens, int batch, const gradients_ref& G,
                  step_telemetry* t) {
        const std::size_t N = n_;
        const auto s = lin_scratch();
        float* const emb = embedding_grads(G);
        // The final norm's input (decoded into dx2_ when compressed: free until the layers) and its
        // output H, recomputed into t_h_.
        const float* x_fin = x_fin_.data();
        {
            timer tm{t, "norm"};
            if (compress()) {
                x_fin_packed_->x.load(ex_, octet::matrix_ref<float>(dx2_.data(), N, d_));
                x_fin = dx2_.data();
            }
            rmsnorm_forward(x_fin, weights_at(P, lay_.norm_f, d_), t_h_.data(), rstd_f_.data(), N);
        }
        // head: dH = dZ W_head, dW_head = dZ^T H
        {
            timer tm{t, "embedding_head"};
            gemm(ex_, logits_.data(), V_, weights_at(P, lay_.head, V_ * d_), d_, dh_.data(), d_, N, d_, V_);
            transpose(ex_, logits_.data(), N, V_, yt_.data());
            float* dw = cfg_.tied_head ? emb + lay_.head : grad_out(G, lay_.head, V_ * d_);
            gemm(ex_, yt_.data(), N, t_h_.data(), d_, dw, d_, V_, d_, N);  // tied: the embedding adds below
            if (!cfg_.tied_head) grad_done(G, lay_.head, V_ * d_, dw);
        }
        {
            timer tm{t, "norm"};
            float* dg = grad_out(G, lay_.norm_f, d_);
            rmsnorm_backward(x_fin, weights_at(P, lay_.norm_f, d_), rstd_f_.data(), dh_.data(), nullptr, dx_.data(), dg,
                             N);
            grad_done(G, lay_.norm_f, d_, dg);
        }
        float* dx = dx_.data();  // d loss / d residual stream
        float* dx_alt = dx2_.data();
        for (std::size_t l = layers_.size(); l-- > 0;) {
            auto& L = layers_[l];
            const auto& B = lay_.blocks[l];
            float* dwide = dwide_.data();
            if (L.moe) {
                timer tm{t, "moe"};
                float* dw = grad_out(G, B.router, B.moe_params);
                L.moe->backward(ex_, dx, N, weights_at(P, B.router, B.moe_params), dh_.data(), dw);
                grad_done(G, B.router, B.moe_params, dw);
            } else {
                dense_mlp_backward(P, l, dx, G, s, t);
            }
            {
                timer tm{t, "norm"};  // dx_mid = dx + norm2'(dh)
                float* dg = grad_out(G, B.norm2, d_);
                rmsnorm_backward(saved_x_mid(l), weights_at(P, B.norm2, d_), L.rstd2.data(), dh_.data(), dx, dx_alt, dg,
                                 N);
                grad_done(G, B.norm2, d_, dg);
            }
            std::swap(dx, dx_alt);
            {
                timer tm{t, "linear"};
                // recomputed input: attention's output, from its copy (decoded into t_qkv_)
                const float* o = L.lin_proj->recomputes_input() ? saved_o(l, t_qkv_.data()) : nullptr;
                float* dw = grad_out(G, B.proj, d_ * lay_.attn_width);
                L.lin_proj->backward(ex_, dx, N, weights_at(P, B.proj, d_ * lay_.attn_width), do_.data(), dw, s, t, o);
                grad_done(G, B.proj, d_ * lay_.attn_width, dw);
            }
            {
                timer tm{t, "attention"};
                if (float_attention()) {
                    const float* qkv = L.qkv.data();
                    const float* O = L.o.data();
                    if (bf16_attention()) {  // their bf16 copies, decoded into t_qkv_ and dh_ (free here)
                        L.packed->qkv.load(ex_, octet::matrix_ref<float>(t_qkv_.data(), N, lay_.qkv_out));
                        qkv = t_qkv_.data();
                        if (packed_o()) {
                            L.packed->o.load(ex_, octet::matrix_ref<float>(dh_.data(), N, lay_.attn_width));
                            O = dh_.data();
                        }
                    }
                    attention_backward_f32(ex_, dims(batch, len_), qkv, O, L.lse.data(), do_.data(), dwide,
                                           attn_scratch_.data(), workers_);
                } else
                    t->attention_residual[l] = attention_backward_fp8(l, do_.data(), dwide, batch, len_, t);
            }
            {
                timer tm{t, "linear"};
                // recomputed input: the first norm's output, from its input and rstd, into t_qkv_ (free
                // once attention's backward has run)
                const float* h1 = nullptr;
                if (L.lin_qkv->recomputes_input())
                    h1 = rmsnorm_apply(saved_x_in(l), weights_at(P, B.norm1, d_), L.rstd1.data(), t_qkv_.data(), N);
                float* dw = grad_out(G, B.qkv, lay_.qkv_out * d_);
                L.lin_qkv->backward(ex_, dwide, N, weights_at(P, B.qkv, lay_.qkv_out * d_), dh_.data(), dw, s, t, h1);
                grad_done(G, B.qkv, lay_.qkv_out * d_, dw);
            }
            {
                timer tm{t, "norm"};
                float* dg = grad_out(G, B.norm1, d_);
                rmsnorm_backward(saved_x_in(l), weights_at(P, B.norm1, d_), L.rstd1.data(), dh_.data(), dx, dx_alt, dg,
                                 N);
                grad_done(G, B.norm1, d_, dg);
            }
            std::swap(dx, dx_alt);
        }
        {
            timer tm{t, "embedding_head"};
            float* dE = emb + lay_.tok_emb;
            float* dPE = emb + lay_.pos_emb;
            if (!cfg_.tied_head) std::fill(dE, dE + V_ * d_, 0.0f);
            std::fill(dPE, dPE + T_ * d_, 0.0f);
            // Sequential scatter-add (a token's rows collide): deterministic, and cheap beside the GEMMs.
            for (std::size_t n = 0; n < N; ++n) {
                const std::size_t seq = n / T_, pos = n % T_;
                float* de = dE + static_cast<std::size_t>(tokens[seq * (T_ + 1) + pos]) * d_;
                float* dp = dPE + pos * d_;
                const float* g = dx + n * d_;
                for (std::size_t c = 0; c < d_; ++c) {
                    de[c] += g[c];
                    dp[c] += g[c];
                }
            }
            grad_done(G, 0, lay_.pos_emb + T_ * d_, emb);  // tok_emb and pos_emb (and the tied head)
        }
    }

    // ---- elementwise parts -------------------------------------------------------------------
    static constexpr std::size_t kChunk = 64;  // rows per chunk of the norms' gain reductions
    static constexpr float kEps = 1e-5f;

    void round_to_bf16(float* x, std::size_t n) {
        octet::parallel_for(ex_, n, 1 << 15, [&](std::size_t i0, std::size_t i1) {
            for (std::size_t i = i0; i < i1; ++i) x[i] = octet::to_float(octet::to_bf16(x[i]));
        });
    }

    void add(const float* a, const float* b, float* out, std::size_t n) {
        octet::parallel_for(ex_, n, 1 << 15, [&](std::size_t i0, std::size_t i1) {
            for (std::size_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
        });
    }

    void rmsnorm_forward(const float* x, const float* g, float* y, float* rstd, std::size_t N) {
        octet::parallel_for(ex_, N, 64, [&](std::size_t b, std::size_t e) {
            for (std::size_t n = b; n < e; ++n) {
                const float* xr = x + n * d_;
                double ss = 0;
                for (std::size_t c = 0; c < d_; ++c) ss += static_cast<double>(xr[c]) * xr[c];
                const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d_) + kEps));
                rstd[n] = r;
                for (std::size_t c = 0; c < d_; ++c) y[n * d_ + c] = xr[c] * r * g[c];
            }
        });
    }

    /// y = x rstd g with the forward's rstd: the forward's output again, bit for bit from its x.
    const float* rmsnorm_apply(const float* x, const float* g, const float* rstd, float* y, std::size_t N) {
        octet::parallel_for(ex_, N, 64, [&](std::size_t b, std::size_t e) {
            for (std::size_t n = b; n < e; ++n) {
                const float* xr = x + n * d_;
                const float r = rstd[n];
                for (std::size_t c = 0; c < d_; ++c) y[n * d_ + c] = xr[c] * r * g[c];
            }
        });
        return y;
    }

    /// dx_out = residual + d(rmsnorm)/dx . dy (residual may be null), dg = sum_n dy * x * rstd.
    /// y = x r g with r = (mean x^2 + eps)^-1/2: dx = r (g dy) - x r^3 / d * sum_c (g dy x)_c.
    void rmsnorm_backward(const float* x, const float* g, const float* rstd, const float* dy, const float* residual,
                          float* dx_out, float* dg, std::size_t N) {
        const std::size_t chunks = (N + kChunk - 1) / kChunk;
        float* part = chunk_partials_.data();  // [chunks][d]
        octet::parallel_for(ex_, chunks, 1, [&](std::size_t c0, std::size_t c1) {
            for (std::size_t c = c0; c < c1; ++c) {
                float* pg = part + c * d_;
                std::fill(pg, pg + d_, 0.0f);
                for (std::size_t n = c * kChunk; n < std::min(N, (c + 1) * kChunk); ++n) {
                    const float* xr = x + n * d_;
                    const float* dyr = dy + n * d_;
                    const float r = rstd[n];
                    double dot = 0;
                    for (std::size_t k = 0; k < d_; ++k) {
                        dot += static_cast<double>(g[k]) * dyr[k] * xr[k];
                        pg[k] += dyr[k] * xr[k] * r;
                    }
                    const float coef = static_cast<float>(dot / static_cast<double>(d_)) * r * r * r;
                    for (std::size_t k = 0; k < d_; ++k) {
                        const float v = r * g[k] * dyr[k] - coef * xr[k];
                        dx_out[n * d_ + k] = residual ? residual[n * d_ + k] + v : v;
                    }
                }
            }
        });
        for (std::size_t k = 0; k < d_; ++k) dg[k] = 0.0f;
        for (std::size_t c = 0; c < chunks; ++c)
            for (std::size_t k = 0; k < d_; ++k) dg[k] += part[c * d_ + k];
    }

    void gelu_forward(const float* u, float* a, std::size_t n) {
        const auto isa = octet::detail::best_isa();
        octet::parallel_for(ex_, n, 1 << 14, [&](std::size_t b, std::size_t e) {
            octet::detail::run_kernel<detail::gelu_forward_kernel>(isa, u + b, a + b, e - b);
        });
    }
    /// da <- da * gelu'(u), in place.
    void gelu_backward(const float* u, float* da, std::size_t n) {
        const auto isa = octet::detail::best_isa();
        octet::parallel_for(ex_, n, 1 << 14, [&](std::size_t b, std::size_t e) {
            octet::detail::run_kernel<detail::gelu_backward_kernel>(isa, u + b, da + b, e - b);
        });
    }

    // ---- FP8 attention -------------------------------------------------------------------------
    void attention_forward_fp8(std::size_t l, const float* qkv, float* O, int batch, std::size_t len,
                               step_telemetry* t) {
        fill_offsets(batch, len);
        fp8_attn_->forward(ex_, l, dims(batch, len), qkv, O, layers_[l].lse.data(), cu_.data(), t);
    }
    double attention_backward_fp8(std::size_t l, const float* dO, float* dqkv, int batch, std::size_t len,
                                  step_telemetry* t) {
        fill_offsets(batch, len);
        const float* O = layers_[l].o.data();
        if (compress_o()) {  // its E4M3 copy, decoded into t_qkv_ (free in the backward), for the telemetry
            layers_[l].packed->o.load(ex_, octet::matrix_ref<float>(t_qkv_.data(), n_, lay_.attn_width));
            O = t_qkv_.data();
        }
        return fp8_attn_->backward(ex_, l, dims(batch, len), O, layers_[l].lse.data(), dO, dqkv, cu_.data(),
                                   recipe_.delta, t);
    }
    void fill_offsets(int batch, std::size_t len) {
        for (int b = 0; b <= batch; ++b) cu_[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(b * len);
    }

    std::shared_ptr<step_buffers> buf_;  // (first: the references below are bound to it)
    model_config cfg_;
    recipe_config recipe_;
    memory_meter& meter_;
    octet::host_executor ex_;
    int max_batch_;
    std::uint64_t seed_;
    parameter_layout lay_;
    std::size_t T_, d_, F_, V_, Nmax_;
    std::size_t workers_ = 1;
    bool high_precision_ = false;
    bool sampling_ = false;  // generate(): float32 compute, nothing kept for a backward
    std::uint64_t linear_count_ = 0;
    std::size_t n_ = 0, len_ = 0;  // the last forward's token count and sequence length
    int batch_ = 0;
    int scored_batch_ = 0;           // batch of the score() whose logits policy_backward may use (0: none)
    std::uint64_t scored_lent_ = 0;  // the step buffers' lend() count at that score()

    // The step buffers (step_buffers: this model's own, or shared), by their names here.
#if TRAIN_HAS_FP8_LINEAR
    octet::linear_workspace& linear_workspace_ = buf_->linear_workspace;
#endif
    metered_vector<std::int32_t>& cu_ = buf_->cu;
    float_region& logits_ = buf_->regions[step_buffers::logits];
    float_region& t_h_ = buf_->regions[step_buffers::t_h];
    float_region& t_qkv_ = buf_->regions[step_buffers::t_qkv];
    float_region& t_a_ = buf_->regions[step_buffers::t_a];
    float_region& dx_ = buf_->regions[step_buffers::dx];
    float_region& dx2_ = buf_->regions[step_buffers::dx2];
    float_region& dh_ = buf_->regions[step_buffers::dh];
    float_region& dwide_ = buf_->regions[step_buffers::dwide];
    float_region& do_ = buf_->regions[step_buffers::do_];
    float_region& wt_ = buf_->regions[step_buffers::wt];
    float_region& yt_ = buf_->regions[step_buffers::yt];
    float_region& xr_ = buf_->regions[step_buffers::xr];
    float_region& wr_ = buf_->regions[step_buffers::wr];
    float_region& attn_scratch_ = buf_->regions[step_buffers::attn_scratch];
    float_region& chunk_partials_ = buf_->regions[step_buffers::chunk_partials];
    float_region& wdec_ = buf_->regions[step_buffers::wdec];
    float_region& gstage_ = buf_->regions[step_buffers::gstage];
    float_region& gemb_ = buf_->regions[step_buffers::gemb];
    metered_vector<float> yt_raised_{metered_allocator<float>(meter_, temporaries())};  // (raised, FP8 linears)
    metered_vector<double>& loss_partials_ = buf_->loss_partials;
    std::unique_ptr<moe_scratch> moe_scratch_;  // (before layers_: their float32 MoE blocks point into it)
    std::vector<layer_state> layers_;
    std::unique_ptr<fp8_attention> fp8_attn_;
    metered_vector<float> x_fin_{metered_allocator<float>(meter_, activations())};  // (empty: compress())
    std::unique_ptr<packed_final> x_fin_packed_;                                    // (compress())
    metered_vector<float> rstd_f_{metered_allocator<float>(meter_, activations())};
};

}  // namespace common
