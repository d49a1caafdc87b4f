// examples/common/model/linear_layers.hpp: the transformer's linear layers (../model.hpp): float32, bf16
// and FP8 through octet's linear component, and the meter bookings of octet's own buffers.
#pragma once

#include "base.hpp"
#include "kernels.hpp"

namespace common {

// =================================================================================================
// Linear layers
// =================================================================================================

/// What a linear layer does in a step, and what it saved for its backward.
class linear_layer {
public:
    /// Shared scratch of all linears (temporaries): W^T, dY^T and bf16-rounded operands.
    struct scratch {
        float* wt = nullptr;  ///< in * out
        float* yt = nullptr;  ///< out * max_tokens
        float* xr = nullptr;  ///< max_tokens * max(in, out), bf16 mode
        float* wr = nullptr;  ///< in * out, bf16 mode
    };

    virtual ~linear_layer() = default;
    int in = 0, out = 0;

    /// y (n x out) = x (n x in) W^T. float_path: float32 whatever the recipe (then x must stay
    /// unchanged until backward: the layer keeps a pointer to it).
    /// training: keep what the backward needs (FP8: the column-wise copies; delayed scaling
    /// pushes its amaxes); otherwise an inference pass that leaves the saved state alone.
    void forward(octet::host_executor ex, const float* x, std::size_t n, const float* w, float* y, bool float_path,
                 bool training, const scratch& s, step_telemetry* t) {
        float_path_ = float_path;
        if (float_path) {
            saved_x_ = x;
            float_forward(ex, x, n, w, y, s);
        } else {
            recipe_forward(ex, x, n, w, y, training, s, t);
        }
    }
    /// dx (n x in) = dy W, dw (out x in) = dy^T x (overwritten), from the last forward. x_again:
    /// the forward's input again (n x in), for a layer that keeps no copy of it (recomputes_input()).
    void backward(octet::host_executor ex, const float* dy, std::size_t n, const float* w, float* dx, float* dw,
                  const scratch& s, step_telemetry* t, const float* x_again = nullptr) {
        if (float_path_)
            float_backward(ex, saved_x_, dy, n, w, dx, dw, s);
        else
            recipe_backward(ex, dy, n, w, dx, dw, s, t, x_again);
    }
    /// Whether the recipe path's backward takes the input again (x_again) instead of a copy.
    virtual bool recomputes_input() const { return false; }

protected:
    /// The layer's own forward and backward (the float path is handled above).
    virtual void recipe_forward(octet::host_executor ex, const float* x, std::size_t n, const float* w, float* y,
                                bool training, const scratch& s, step_telemetry* t) = 0;
    virtual void recipe_backward(octet::host_executor ex, const float* dy, std::size_t n, const float* w, float* dx,
                                 float* dw, const scratch& s, step_telemetry* t, const float* x_again) = 0;
    void float_forward(octet::host_executor ex, const float* x, std::size_t n, const float* w, float* y,
                       const scratch& s) {
        transpose(ex, w, out, in, s.wt);
        gemm(ex, x, in, s.wt, out, y, out, n, out, in);
    }
    void float_backward(octet::host_executor ex, const float* x, const float* dy, std::size_t n, const float* w,
                        float* dx, float* dw, const scratch& s) {
        gemm(ex, dy, out, w, in, dx, in, n, in, out);
        transpose(ex, dy, n, out, s.yt);
        gemm(ex, s.yt, n, x, in, dw, in, out, in, n);
    }
    const float* saved_x_ = nullptr;  // the float path's input

private:
    bool float_path_ = false;  // the last forward took the float path
};

class float32_linear final : public linear_layer {
protected:
    void recipe_forward(octet::host_executor ex, const float* x, std::size_t n, const float* w, float* y, bool,
                        const scratch& s, step_telemetry*) override {
        saved_x_ = x;
        float_forward(ex, x, n, w, y, s);
    }
    void recipe_backward(octet::host_executor ex, const float* dy, std::size_t n, const float* w, float* dx, float* dw,
                         const scratch& s, step_telemetry*, const float*) override {
        float_backward(ex, saved_x_, dy, n, w, dx, dw, s);
    }
};

/// bf16 operands (round to nearest even), float products and sums. Keeps X as bf16 (activations).
class bf16_linear final : public linear_layer {
public:
    bf16_linear(memory_meter& m, std::size_t max_tokens, int in_, int out_)
        : x16_(make_metered<octet::bf16>(m, octet::memory_category::activations, max_tokens * in_)) {
        in = in_;
        out = out_;
    }

protected:
    void recipe_forward(octet::host_executor ex, const float* x, std::size_t n, const float* w, float* y, bool,
                        const scratch& s, step_telemetry* t) override {
        const std::size_t nx = n * in;
        octet::parallel_for(ex, nx, 1 << 14, [&](std::size_t b, std::size_t e) {
            for (std::size_t i = b; i < e; ++i) {
                x16_[i] = octet::to_bf16(x[i]);
                s.xr[i] = octet::to_float(x16_[i]);
            }
        });
        round_weights_t(ex, w, s);
        gemm(ex, s.xr, in, s.wr, out, y, out, n, out, in);
        (void)t;  // bf16 rounding is not counted as narrow-format quantization
    }
    void recipe_backward(octet::host_executor ex, const float* dy, std::size_t n, const float* w, float* dx, float* dw,
                         const scratch& s, step_telemetry*, const float*) override {
        const std::size_t ny = n * out, nx = n * in, nw = static_cast<std::size_t>(in) * out;
        // s.xr <- bf16(dY) (n x out), s.wr <- bf16(W) (out x in)
        octet::parallel_for(ex, ny, 1 << 14, [&](std::size_t b, std::size_t e) {
            for (std::size_t i = b; i < e; ++i) s.xr[i] = round(dy[i]);
        });
        octet::parallel_for(ex, nw, 1 << 14, [&](std::size_t b, std::size_t e) {
            for (std::size_t i = b; i < e; ++i) s.wr[i] = round(w[i]);
        });
        gemm(ex, s.xr, out, s.wr, in, dx, in, n, in, out);
        transpose(ex, s.xr, n, out, s.yt);
        octet::parallel_for(ex, nx, 1 << 14, [&](std::size_t b, std::size_t e) {
            for (std::size_t i = b; i < e; ++i) s.xr[i] = octet::to_float(x16_[i]);
        });
        gemm(ex, s.yt, n, s.xr, in, dw, in, out, in, n);
    }

private:
    static float round(float v) { return octet::to_float(octet::to_bf16(v)); }
    void round_weights_t(octet::host_executor ex, const float* w, const scratch& s) {
        transpose(ex, w, out, in, s.wt);
        const std::size_t nw = static_cast<std::size_t>(in) * out;
        octet::parallel_for(ex, nw, 1 << 14, [&](std::size_t b, std::size_t e) {
            for (std::size_t i = b; i < e; ++i) s.wr[i] = round(s.wt[i]);
        });
    }
    metered_vector<octet::bf16> x16_;
};

#if TRAIN_HAS_FP8_LINEAR
/// Books a linear context's bytes (octet::linear_memory) in the meter for as long as it lives: its
/// column-wise copies as activations, its workspace and amax histories as temporaries, wherever
/// the context keeps them (the host layer's and the CUDA layer's alike).
class linear_context_booking {
public:
    linear_context_booking(memory_meter& m, const octet::linear_memory& b)
        : saved_(m, octet::memory_category::activations, static_cast<double>(b.saved_for_backward)),
          work_(m, octet::memory_category::temporaries, static_cast<double>(b.workspace + b.state)) {}

private:
    meter_booking saved_, work_;
};
#endif

/// Adds one quantize call's statistics to the step's telemetry.
inline void add_quant_stats(step_telemetry* t, const octet::quant_stats& s) {
    if (!t) return;
    t->quantized += s.elements;
    t->saturated += s.saturated;
    t->underflow += s.flushed_to_zero;
}
inline void add_quant_stats(step_telemetry* t, const octet::quantize_result& r) {
    add_quant_stats(t, r.rowwise);
    add_quant_stats(t, r.columnwise);
}

#if TRAIN_HAS_FP8_LINEAR
/// The configuration of an FP8 layer's context, wherever it runs: statistics on every step.
inline octet::linear_config fp8_linear_config(std::size_t max_tokens, int in, int out, std::uint64_t seed,
                                              bool recompute_input = false) {
    octet::linear_config c;
    c.recompute_input = recompute_input;
    c.max_tokens = max_tokens;
    c.in_features = static_cast<std::size_t>(in);
    c.out_features = static_cast<std::size_t>(out);
    c.seed = seed;
    c.collect_stats = true;
    return c;
}

/// An FP8 (or NVFP4) linear through octet's component: the context keeps the backward's
/// column-wise copies (booked as activations) and its amax histories (temporaries); its transient
/// copies live in the model's shared octet::linear_workspace (booked once, by the model), or with
/// no workspace in the context (booked here as temporaries).
template <class LR>
class fp8_linear final : public linear_layer {
public:
    fp8_linear(memory_meter& m, std::size_t max_tokens, int in_, int out_, std::uint64_t seed,
               octet::linear_workspace* shared = nullptr, bool recompute_input = false)
        : ctx_(shared
                   ? octet::linear_context<LR>(fp8_linear_config(max_tokens, in_, out_, seed, recompute_input), *shared)
                   : octet::linear_context<LR>(fp8_linear_config(max_tokens, in_, out_, seed, recompute_input))),
          booking_(m, ctx_.memory()) {
        in = in_;
        out = out_;
    }

protected:
    void recipe_forward(octet::host_executor ex, const float* x, std::size_t n, const float* w, float* y, bool training,
                        const scratch&, step_telemetry* t) override {
        const std::size_t I = static_cast<std::size_t>(in), O = static_cast<std::size_t>(out);
        octet::linear_forward(ex, ctx_, octet::matrix_ref<const float>(x, n, I),
                              octet::matrix_ref<const float>(w, O, I), {}, octet::matrix_ref<float>(y, n, O),
                              training ? octet::linear_pass::training : octet::linear_pass::inference);
        add_quant_stats(t, ctx_.stats().x);
        add_quant_stats(t, ctx_.stats().w);
        add_quant_stats(t, ctx_.stats().x_hadamard);
    }
    bool recomputes_input() const override { return ctx_.config().recompute_input; }
    void recipe_backward(octet::host_executor ex, const float* dy, std::size_t n, const float*, float* dx, float* dw,
                         const scratch&, step_telemetry* t, const float* x_again) override {
        const std::size_t I = static_cast<std::size_t>(in), O = static_cast<std::size_t>(out);
        if (recomputes_input())
            octet::linear_backward(ex, ctx_, octet::matrix_ref<const float>(x_again, n, I),
                                   octet::matrix_ref<const float>(dy, n, O), octet::matrix_ref<float>(dx, n, I),
                                   octet::matrix_ref<float>(dw, O, I), {});
        else
            octet::linear_backward(ex, ctx_, octet::matrix_ref<const float>(dy, n, O),
                                   octet::matrix_ref<float>(dx, n, I), octet::matrix_ref<float>(dw, O, I), {});
        add_quant_stats(t, ctx_.stats().dy);
        add_quant_stats(t, ctx_.stats().dy_hadamard);
    }

private:
    octet::linear_context<LR> ctx_;
    linear_context_booking booking_;
};
#endif

#if TRAIN_HAS_FP8_LINEAR
template <class LR>
struct linear_recipe_tag {
    using type = LR;
};

/// Calls f(linear_recipe_tag<LR>{}) with the octet::linear_recipes type of an FP8 mode and returns
/// true; false for float32 and bf16. The one map from mode to recipe, for every placement of the
/// layers (the host's below, the GPU's in cuda_linear.cu).
template <class F>
bool with_fp8_linear_recipe(linear_mode mode, F&& f) {
    namespace lr = octet::linear_recipes;
    switch (mode) {
        case linear_mode::tensorwise_delayed:
            f(linear_recipe_tag<lr::tensorwise_delayed>{});
            return true;
        case linear_mode::tensorwise:
            f(linear_recipe_tag<lr::tensorwise>{});
            return true;
        case linear_mode::blockwise:
            f(linear_recipe_tag<lr::blockwise>{});
            return true;
        case linear_mode::mxfp8:
            f(linear_recipe_tag<lr::mxfp8>{});
            return true;
        case linear_mode::nvfp4:
            f(linear_recipe_tag<lr::nvfp4>{});
            return true;
        default:
            return false;
    }
}
#endif

/// A linear layer of `mode` for up to max_tokens rows (in -> out features); an FP8 layer draws its
/// stochastic rounding from `seed` and keeps its transient copies in `shared` (the model's
/// workspace; null: its own). Throws octet::error for an FP8 mode this build lacks.
inline std::unique_ptr<linear_layer> make_linear_layer(memory_meter& m, linear_mode mode, std::size_t max_tokens,
                                                       int in, int out, std::uint64_t seed,
                                                       octet::linear_workspace* shared = nullptr,
                                                       bool recompute_input = false) {
    if (mode == linear_mode::float32) {
        auto l = std::make_unique<float32_linear>();
        l->in = in;
        l->out = out;
        return l;
    }
    if (mode == linear_mode::bf16) return std::make_unique<bf16_linear>(m, max_tokens, in, out);
#if TRAIN_HAS_FP8_LINEAR
    std::unique_ptr<linear_layer> layer;
    const bool fp8 = with_fp8_linear_recipe(mode, [&](auto tag) {
        layer = std::make_unique<fp8_linear<typename decltype(tag)::type>>(m, max_tokens, in, out, seed, shared,
                                                                           recompute_input);
    });
    if (fp8) return layer;
#endif
    (void)seed;
    (void)shared;
    (void)recompute_input;
    OCTET_REQUIRE(false, "common::make_linear_layer", "mode", "names no linear mode this build has");
    return nullptr;
}

}  // namespace common
