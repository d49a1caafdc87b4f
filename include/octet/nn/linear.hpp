// octet/nn/linear.hpp: the quantized linear layer Y = X W^T + b (forward, and backward giving dX,
// dW and db), built from octet::quantize and octet::scaled_gemm, on the host or (the buffer form,
// nn/linear.cuh) on a CUDA stream.
//
//   using LR = octet::linear_recipes::blockwise;
//   octet::linear_context<LR> ctx({/*max_tokens=*/512, /*in_features=*/256, /*out_features=*/1024});
//   octet::linear_forward(octet::on_host(), ctx, x, w, bias, y);    // keeps the copies the backward needs
//   octet::linear_backward(octet::on_host(), ctx, dy, dx, dw, db);  // dx or db may be {} (not needed)
//   ctx.stats().x.rowwise.saturated;  ctx.memory().total();         // telemetry, memory for a ledger
//
// A framework that owns its memory calls the same two steps on its own buffers instead
// (linear_forward_buffers / linear_backward_buffers, linear_step_options: the amaxes of delayed
// scaling, the Philox seed and backward number); the context is that form over buffers it owns,
// plus the delayed-scaling histories and the step count (python/csrc/linear_common.hpp is the other).
//
// X is tokens x in, W is out x in, Y is tokens x out, all float (either storage order). Every
// GEMM multiplies quantized copies (quant/tensor.hpp; the column-wise copy of M is the quantized
// copy of M^T) with scaled_gemm's default options (host backend, promotion every 128):
//   forward          Y  = X  W^T + b   A = X's row-wise copy     B = W's row-wise copy
//   data gradient    dX = dY W         A = dY's row-wise copy    B = W's column-wise copy
//   weight gradient  dW = dY^T X       A = dY's column-wise copy B = X's column-wise copy
//   bias gradient    db = the column sums of dY, summed in double in token order, rounded once to float
// A training forward quantizes X and W once each into both copies and keeps the column-wise ones in
// the context (not X and W themselves); the backward quantizes dY. The bias is added in the forward
// GEMM's float epilogue. Results are those of the operations composed by hand, bit for bit, for any
// thread count (tests/host/nn_linear.cpp composes them).
//
// A linear recipe (linear_recipe<XRecipe, WRecipe, GRecipe, Scaling, StochasticGradients,
// HadamardWgrad>) names the recipe of activations (X), weights (W) and output gradients (dY), and:
//   * Scaling: linear_scaling::current derives each tensor scale from the tensor's own amax;
//     linear_scaling::delayed (per-tensor recipes) from an amax history per tensor (X, W, dY;
//     quant/delayed.hpp, reduction max, config.delayed.history_length steps, 16 by default): a step
//     quantizes with the largest amax of EARLIER steps, then pushes its own. While a history holds
//     no non-zero amax (the first step) the tensor uses current scaling. Values above a stale amax
//     saturate and are counted in quant_stats::saturated. Inference forwards read the histories
//     but do not push.
//   * StochasticGradients: dY is rounded stochastically (GRecipe with round::stochastic). Backward
//     number s (ctx.step(), counted from 0 per context) draws from Philox (config.seed, offset 4 s):
//     dY's row-wise copy at offset 4 s, its column-wise copy at 4 s + 1, and the rotated dY's
//     column-wise copy below at 4 s + 3 (quantize's rule: a call on offset o writes its column-wise
//     copy from o + 1). So a run is reproducible from (seed, step), and set_step() resumes one.
//   * HadamardWgrad: the weight-gradient inputs are rotated along the token dimension before their
//     column-wise copies are made: every column of X and of dY is transformed as a message by
//     octet::transform_forward(transform_kind::hadamard, column, block 16, config.seed)
//     (codec/hadamard.hpp: c H_16 D per 16 tokens, signs from the token index, zero-padded to a
//     multiple of 16 tokens), so that (H D dY)^T (H D X) = dY^T X exactly in real arithmetic and
//     the weight-gradient GEMM has K = tokens rounded up to 16. NVIDIA's NVFP4 training recipe does
//     this to spread outliers across a 16-element scale block. The rotated copies use current
//     scaling (their amax is not X's).
// The named ones are in linear_recipes (tensorwise, tensorwise_delayed, blockwise, mxfp8, nvfp4):
// python/octet/torch/linear.py's recipes, whose rotation draws its 16 signs from torch's generator
// (the same for every block) where this one follows the codec's rule. No shape rule beyond the
// GEMM's: the host GEMM takes any in, out and token count (ragged scale blocks included).
//
// Numerics: each output is scaled_gemm's result on those copies, within gemm_error_bound of the
// float64 product of the dequantized copies (scaled_gemm.hpp). Non-finite inputs are data
// (quantize's contract): they are counted in quant_stats::non_finite, encoded by the format (E4M3
// and E5M2 keep NaN, so a NaN in row t of X makes row t of Y and the weight-gradient column of its
// feature NaN; E2M1 has no NaN and encodes it as +max_finite), and propagate through the GEMMs as
// IEEE arithmetic does.
//
// Memory (linear_context::memory): the context owns every quantized copy and scratch buffer at its
// maximum shape, allocated once in the constructor. scaled_gemm and quantize also allocate
// temporaries per call (the host GEMM decodes both operands to float, about (M + N) * K floats).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <vector>

#include "octet/codec/hadamard.hpp"
#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/matrix.hpp"
#include "octet/core/philox.hpp"
#include "octet/core/span.hpp"
#include "octet/gemm/scaled_gemm.hpp"
#include "octet/quant/delayed.hpp"
#include "octet/quant/quantize.hpp"
#include "octet/quant/recipe.hpp"
#include "octet/quant/stats.hpp"
#include "octet/quant/tensor.hpp"

namespace octet {

enum class linear_scaling { current, delayed };

/// A training forward keeps the copies the backward needs and pushes delayed-scaling amaxes; an
/// inference forward does neither (and leaves the last training forward's copies alone).
enum class linear_pass { training, inference };

namespace detail {
template <class R, class Round>
using recipe_with_rounding_t =
    recipe<typename R::format, typename R::granularity, typename R::scale_rule, typename R::scale_storage_type, Round,
           typename R::overflow_policy, typename R::nan_handling>;
template <class R>
inline constexpr bool is_stochastic_recipe_v = std::is_same_v<typename R::rounding, round::stochastic>;
template <class R>
inline constexpr bool saturates_v = std::is_same_v<typename R::overflow_policy, overflow::saturate>;
}  // namespace detail

/// The recipes of one linear layer (see the top of this file).
template <class XRecipe, class WRecipe, class GRecipe, linear_scaling Scaling = linear_scaling::current,
          bool StochasticGradients = false, bool HadamardWgrad = false>
struct linear_recipe {
    static_assert(is_recipe_v<XRecipe> && is_recipe_v<WRecipe> && is_recipe_v<GRecipe>,
                  "octet::linear_recipe: XRecipe, WRecipe and GRecipe must be octet::recipe<...> (see "
                  "octet::recipes for the named ones)");
    static_assert(!detail::is_stochastic_recipe_v<XRecipe> && !detail::is_stochastic_recipe_v<WRecipe> &&
                      !detail::is_stochastic_recipe_v<GRecipe>,
                  "octet::linear_recipe: the layer draws random bits for output gradients only; pass recipes with "
                  "a deterministic rounding and set StochasticGradients = true for stochastic gradients");
    static_assert(!StochasticGradients || std::is_same_v<typename GRecipe::rounding, round::nearest_even>,
                  "octet::linear_recipe: StochasticGradients replaces the gradient recipe's rounding with "
                  "round::stochastic; pass GRecipe with round::nearest_even");
    static_assert(Scaling != linear_scaling::delayed ||
                      (XRecipe::is_per_tensor && WRecipe::is_per_tensor && GRecipe::is_per_tensor),
                  "octet::linear_recipe: delayed scaling derives one scale per tensor from an amax history; use "
                  "per-tensor recipes (recipes::tensorwise_e4m3 / tensorwise_e5m2) or linear_scaling::current");
    static_assert(Scaling != linear_scaling::delayed ||
                      (detail::saturates_v<XRecipe> && detail::saturates_v<WRecipe> && detail::saturates_v<GRecipe>),
                  "octet::linear_recipe: under delayed scaling values above a stale amax must saturate; use "
                  "overflow::saturate");
    static_assert(!HadamardWgrad || Scaling == linear_scaling::current,
                  "octet::linear_recipe: the Hadamard-rotated weight-gradient copies have their own amax, which "
                  "no history tracks; use linear_scaling::current with HadamardWgrad");

    using x_recipe = XRecipe;
    using w_recipe = WRecipe;
    using g_recipe = GRecipe;
    /// The recipe dY is quantized with (GRecipe, with round::stochastic under StochasticGradients).
    using g_quantize_recipe =
        std::conditional_t<StochasticGradients, detail::recipe_with_rounding_t<GRecipe, round::stochastic>, GRecipe>;
    static constexpr linear_scaling scaling = Scaling;
    static constexpr bool stochastic_gradients = StochasticGradients;
    static constexpr bool hadamard_wgrad = HadamardWgrad;
    /// Tokens per Hadamard block of HadamardWgrad.
    static constexpr std::size_t hadamard_block = 16;
};

template <class T>
struct is_linear_recipe : std::false_type {};
template <class X, class W, class G, linear_scaling S, bool SG, bool H>
struct is_linear_recipe<linear_recipe<X, W, G, S, SG, H>> : std::true_type {};
template <class T>
inline constexpr bool is_linear_recipe_v = is_linear_recipe<T>::value;

/// The linear recipes of training, by name (python/octet/torch/linear.py's LINEAR_RECIPES).
namespace linear_recipes {
/// E4M3 activations and weights, E5M2 gradients, one scale per tensor from its current amax.
using tensorwise = linear_recipe<recipes::tensorwise_e4m3, recipes::tensorwise_e4m3, recipes::tensorwise_e5m2>;
/// The same with delayed scaling (Transformer Engine's DelayedScaling, amax_compute_algo "max").
using tensorwise_delayed = linear_recipe<recipes::tensorwise_e4m3, recipes::tensorwise_e4m3, recipes::tensorwise_e5m2,
                                         linear_scaling::delayed>;
/// DeepSeek-V3: 1x128 tiles for activations and gradients, 128x128 blocks for weights, E4M3, float scales.
using blockwise = linear_recipe<recipes::blockwise_1x128, recipes::blockwise_128x128, recipes::blockwise_1x128>;
/// OCP MX (32-element blocks, UE8M0 scales): E4M3 activations and weights, E5M2 gradients.
using mxfp8 = linear_recipe<recipes::mxfp8_e4m3, recipes::mxfp8_e4m3, recipes::mxfp8_e5m2>;
/// NVFP4 everywhere, stochastic rounding of dY, 16-point random Hadamard transform of the
/// weight-gradient inputs (NVIDIA's NVFP4 training recipe; weights in 1x16 blocks).
using nvfp4 = linear_recipe<recipes::nvfp4, recipes::nvfp4, recipes::nvfp4, linear_scaling::current, true, true>;
}  // namespace linear_recipes

/// What a linear_context is built for.
struct linear_config {
    std::size_t max_tokens = 0;    ///< the largest token count (rows of X) a call may pass
    std::size_t in_features = 0;   ///< columns of X and W
    std::size_t out_features = 0;  ///< rows of W, columns of Y
    /// Delayed scaling: history length (16) and margin; the reduction is the history's max.
    delayed_scaling_config delayed{};
    /// Philox seed of stochastic rounding and of the Hadamard signs.
    std::uint64_t seed = 0;
    /// Gather quant_stats (saturation, underflow, SQNR) in every quantize (set_collect_stats
    /// changes it between steps); the amaxes are kept either way.
    bool collect_stats = true;
    /// Host contexts: a training forward keeps W's column-wise copy only, and the backward takes X
    /// again (linear_context::backward(ex, x, dy, ...): the forward's X, or the caller's
    /// recomputation of it, e.g. a norm's output from its saved input) and makes X's column-wise
    /// copy then, in the transient storage. Given the forward's X, every result is the saved
    /// forward's bit for bit (a delayed-scaling X copy uses the forward's scale); another X changes
    /// dW only. Activation memory keeps W's copy alone; not with HadamardWgrad (nvfp4) or on a stream.
    bool recompute_input = false;
};

/// The quantize results of the last forward (x, w, x_hadamard) and backward (dy, dy_hadamard).
/// rowwise / columnwise hold the statistics of each copy made (empty for a copy not made); amax
/// is the input's largest finite magnitude.
struct linear_stats {
    quantize_result x, w, dy;
    quantize_result x_hadamard, dy_hadamard;  ///< HadamardWgrad: the rotated column-wise copies

    /// Every copy's statistics merged (counts add up; amax is the largest).
    quant_stats merged() const {
        quant_stats s;
        for (const quantize_result* r : {&x, &w, &dy, &x_hadamard, &dy_hadamard}) {
            s.merge(r->rowwise);
            s.merge(r->columnwise);
        }
        return s;
    }
};

/// Bytes a linear_context owns, by what they are for (a memory ledger books them).
struct linear_memory {
    std::size_t saved_for_backward = 0;  ///< X's and W's column-wise copies (activation memory)
    std::size_t workspace = 0;           ///< row-wise copies, dY's copies, the Hadamard buffer
    std::size_t state = 0;               ///< delayed-scaling amax histories
    std::size_t total() const { return saved_for_backward + workspace + state; }
};

namespace detail {

/// The tag of a quant_buffer that owns no storage: the caller binds it to borrowed bytes (a
/// linear_workspace's) before each use.
struct borrowed_storage {};

/// Storage for quantized copies of up to max_rows x max_cols (a copy of fewer rows or columns fits,
/// since the layout's data and scale bytes grow with both): owned, or borrowed and bound per call.
template <class R>
class quant_buffer {
public:
    quant_buffer() = default;
    quant_buffer(std::size_t max_rows, std::size_t max_cols) {
        const quant_layout l = quant_layout_of<R>::make(max_rows, max_cols);
        data_.resize(l.data_bytes);
        scales_.resize(l.scale_bytes);
        capacity_data_ = l.data_bytes;
        capacity_scales_ = l.scale_bytes;
    }
    quant_buffer(borrowed_storage, std::size_t max_rows, std::size_t max_cols) : borrowed_(true) {
        const quant_layout l = quant_layout_of<R>::make(max_rows, max_cols);
        capacity_data_ = l.data_bytes;
        capacity_scales_ = l.scale_bytes;
    }
    /// Borrowed storage: takes its data and scale bytes (at most the largest copy's) from `c`.
    void bind(scratch_carver& c) {
        data_ptr_ = c.take<std::uint8_t>(capacity_data_);
        scales_ptr_ = c.take<std::uint8_t>(capacity_scales_);
    }
    /// A rows x cols copy in this storage (the shape of the copy made next).
    quantized_ref<R> ref(std::size_t rows, std::size_t cols) {
        layout_ = quant_layout_of<R>::make(rows, cols);
        OCTET_REQUIRE(layout_.data_bytes <= capacity_data_ && layout_.scale_bytes <= capacity_scales_,
                      "octet::linear_context", "shape",
                      message("of a ", rows, " x ", cols, " copy exceeds the storage the context holds (internal)"));
        return quantized_ref<R>(data(), scales(), layout_, &tensor_scale_);
    }
    quantized_cref<R> cref() const { return quantized_cref<R>(data(), scales(), layout_, &tensor_scale_); }

private:
    std::uint8_t* data() { return borrowed_ ? data_ptr_ : data_.data(); }
    std::uint8_t* scales() { return borrowed_ ? scales_ptr_ : scales_.data(); }
    const std::uint8_t* data() const { return borrowed_ ? data_ptr_ : data_.data(); }
    const std::uint8_t* scales() const { return borrowed_ ? scales_ptr_ : scales_.data(); }

    quant_layout layout_{};
    bool borrowed_ = false;
    std::size_t capacity_data_ = 0, capacity_scales_ = 0;  // of the largest copy
    std::vector<std::uint8_t> data_;
    std::vector<std::uint8_t> scales_;
    std::uint8_t* data_ptr_ = nullptr;
    std::uint8_t* scales_ptr_ = nullptr;
    float tensor_scale_ = 1.0f;
};

/// out (rows_out x cols, row-major, rows_out = rows of x rounded up to 16) = every column of x
/// transformed as transform_forward(hadamard, column, 16, seed) does it, bit for bit: sign flips by
/// token index, butterfly stages h = 1, 2, 4, 8 in order, times c = 1/4 (exact), zero padding.
inline void hadamard_tokens(host_executor ex, matrix_ref<const float> x, std::uint64_t seed, float* out) {
    constexpr std::size_t B = 16;
    const std::size_t tokens = x.rows, cols = x.cols, groups = (tokens + B - 1) / B;
    const float c = hadamard_norm(4);
    parallel_for(ex, groups, std::max<std::size_t>(1, 4096 / std::max<std::size_t>(cols, 1)),
                 [&](std::size_t g0, std::size_t g1) {
                     std::uint32_t words[2];  // 16 tokens starting at a multiple of 16 span at most two words
                     for (std::size_t g = g0; g < g1; ++g) {
                         float* o = out + g * B * cols;  // (B, cols)
                         const std::size_t t0 = g * B, n = std::min(B, tokens - t0);
                         sign_words(seed, t0, n, words);
                         for (std::size_t r = 0; r < B; ++r) {
                             float* row = o + r * cols;
                             if (r >= n) {
                                 std::fill(row, row + cols, 0.0f);
                                 continue;
                             }
                             const std::uint64_t t = t0 + r;
                             const std::uint32_t flip = ((words[(t >> 5) - (t0 >> 5)] >> (t & 31u)) & 1u) << 31;
                             for (std::size_t j = 0; j < cols; ++j)
                                 row[j] = bits_to_float(float_to_bits(x(t, j)) ^ flip);
                         }
                         for (std::size_t h = 1; h < B; h <<= 1)
                             for (std::size_t r = 0; r < B; ++r) {
                                 if (r & h) continue;
                                 float* a = o + r * cols;
                                 float* b = o + (r + h) * cols;
                                 for (std::size_t j = 0; j < cols; ++j) {
                                     const float p = a[j], q = b[j];
                                     a[j] = p + q;
                                     b[j] = p - q;
                                 }
                             }
                         for (std::size_t k = 0; k < B * cols; ++k) o[k] = o[k] * c;
                     }
                 });
}

template <class T>
void require_linear_matrix(const matrix_ref<T>& m, std::size_t rows, std::size_t cols, const char* fn, const char* arg,
                           const char* what) {
    OCTET_REQUIRE(m.rows == rows && m.cols == cols, fn, arg,
                  message("has shape ", m.rows, " x ", m.cols, " but must be ", rows, " x ", cols, " (", what, ")"));
    validate_input(m, fn, arg);
}

}  // namespace detail

/// The buffers one forward writes, owned by the caller (a framework that allocates its own
/// tensors: python/csrc/linear_common.hpp); linear_context owns them at its maximum shape.
template <class LR>
struct linear_forward_buffers {
    quantized_ref<typename LR::x_recipe> x;    ///< X's row-wise copy, tokens x in
    quantized_ref<typename LR::w_recipe> w;    ///< W's row-wise copy, out x in
    quantized_ref<typename LR::x_recipe> x_t;  ///< X^T's copy, in x wgrad_tokens(tokens), or {} (no dW follows)
    quantized_ref<typename LR::w_recipe> w_t;  ///< W^T's copy, in x out, or {} (no dX follows)
    /// HadamardWgrad with x_t: wgrad_tokens(tokens) * in floats of scratch (else empty).
    span<float> rotated;
};

/// The buffers one backward reads and writes, owned by the caller.
template <class LR>
struct linear_backward_buffers {
    quantized_cref<typename LR::x_recipe> x_t;           ///< the forward's X^T copy (read when dw is wanted)
    quantized_cref<typename LR::w_recipe> w_t;           ///< the forward's W^T copy (read when dx is wanted)
    quantized_ref<typename LR::g_quantize_recipe> dy;    ///< dY's row-wise copy, tokens x out (when dx is wanted)
    quantized_ref<typename LR::g_quantize_recipe> dy_t;  ///< dY^T's copy, out x wgrad_tokens(tokens) (when dw is)
    /// HadamardWgrad with dw: wgrad_tokens(tokens) * out floats of scratch (else empty).
    span<float> rotated;
};

/// What one step of a layer draws on besides its buffers: the delayed-scaling amaxes (negative:
/// current scaling), the random stream (Philox seed, backward number) and statistics.
struct linear_step_options {
    float x_scale_amax = -1.0f;  ///< tensor_amax of X's copies
    float w_scale_amax = -1.0f;  ///< tensor_amax of W's copies
    float g_scale_amax = -1.0f;  ///< tensor_amax of dY's copies
    std::uint64_t seed = 0;      ///< Philox seed of stochastic rounding and of the Hadamard signs
    std::uint64_t step = 0;      ///< backward number s: stochastic rounding draws from offset 4 s
    bool collect_stats = true;
};

/// What one step of a layer on a CUDA stream (nn/linear.cuh) draws on: the delayed-scaling amaxes in device memory
/// (null: current scaling, the tensor's own amax), the Philox seed and backward number (as linear_step_options), and
/// whether the copies' quant statistics are gathered.
struct device_linear_step_options {
    const float* x_scale_amax = nullptr;  ///< device: tensor_amax of X's copies, or null
    const float* w_scale_amax = nullptr;  ///< device: tensor_amax of W's copies, or null
    const float* g_scale_amax = nullptr;  ///< device: tensor_amax of dY's copies, or null
    std::uint64_t seed = 0;               ///< Philox seed of stochastic rounding and of the Hadamard signs
    std::uint64_t step = 0;               ///< backward number s: stochastic rounding draws from offset 4 s
    bool collect_stats = true;
};

/// What a forward on a stream writes (device memory): each copy's statistics as {row-wise,
/// column-wise} (zeros for a copy not made, and all zeros without collect_stats), and the finite
/// amaxes of X and W (what delayed scaling records).
struct device_linear_forward_stats {
    quant_stats x[2], w[2], x_hadamard[2];
    float x_amax, w_amax;
};

/// What a backward on a stream writes (device memory): dY's and the rotated dY's statistics and
/// dY's finite amax (0 when dY was not quantized).
struct device_linear_backward_stats {
    quant_stats dy[2], dy_hadamard[2];
    float dy_amax;
};

/// Tokens of the weight-gradient GEMM's K for `tokens` tokens (padded to 16 under HadamardWgrad).
template <class LR>
constexpr std::size_t linear_wgrad_tokens(std::size_t tokens) {
    return LR::hadamard_wgrad ? (tokens + LR::hadamard_block - 1) / LR::hadamard_block * LR::hadamard_block : tokens;
}

/// Which input of a layer a quantize call copies (the backends' statistics slots): X and W in the
/// forward, dY in the backward, and under HadamardWgrad the rotated X and dY.
enum class linear_operand { x, w, x_hadamard, dy, dy_hadamard };

namespace detail {
inline bool matrix_absent(const matrix_ref<float>& m) {
    return m.data == nullptr && m.rows == 0 && m.cols == 0;
}

/// The executor half of octet::linear_forward / linear_backward, specialized per executor:
/// `options` (what a step draws on), `forward_stats` / `backward_stats` (where the statistics go),
/// begin_forward / begin_backward (clear the slots a call writes), quantize_operand (one quantize
/// with the operand's scale amax, random stream and statistics slot), hadamard_tokens and
/// column_sums. The host's is here, the stream's in nn/linear.cuh; the entries below hold the
/// argument checks and the order of the steps, once for every executor.
template <class Executor>
struct linear_backend;

template <>
struct linear_backend<host_executor> {
    using options = linear_step_options;
    using forward_stats = linear_stats&;
    using backward_stats = linear_stats&;

    static void begin_forward(host_executor, linear_stats& st) { st.x_hadamard = {}; }
    static void begin_backward(host_executor, linear_stats& st) { st.dy = st.dy_hadamard = {}; }

    template <class R>
    static void quantize_operand(host_executor ex, linear_operand which, matrix_ref<const float> x,
                                 const quantized_ref<R>& rowwise, const quantized_ref<R>& columnwise, const options& o,
                                 philox_stream rng, linear_stats& st) {
        quantize_options q;
        q.collect_stats = o.collect_stats;
        q.rng = rng;
        q.tensor_amax = which == linear_operand::x    ? o.x_scale_amax
                        : which == linear_operand::w  ? o.w_scale_amax
                        : which == linear_operand::dy ? o.g_scale_amax
                                                      : -1.0f;  // a rotated copy: its own amax, no history
        quantize_result* slot[] = {&st.x, &st.w, &st.x_hadamard, &st.dy, &st.dy_hadamard};
        *slot[static_cast<int>(which)] = quantize<R>(ex, x, rowwise, columnwise, q);
    }

    static void hadamard_tokens(host_executor ex, matrix_ref<const float> x, std::uint64_t seed, span<float> out,
                                const char* /*fn*/) {
        detail::hadamard_tokens(ex, x, seed, out.data());
    }

    /// db[j] = sum over tokens of dY(t, j), in float64 in token order, 64 columns at a time.
    static void column_sums(host_executor, matrix_ref<const float> dy, span<float> db) {
        constexpr std::size_t width = 64;
        for (std::size_t j0 = 0; j0 < dy.cols; j0 += width) {
            const std::size_t n = std::min(width, dy.cols - j0);
            double sum[width] = {};
            for (std::size_t t = 0; t < dy.rows; ++t)
                for (std::size_t j = 0; j < n; ++j) sum[j] += static_cast<double>(dy(t, j0 + j));
            for (std::size_t j = 0; j < n; ++j) db[j0 + j] = static_cast<float>(sum[j]);
        }
    }
};
}  // namespace detail

/// Y = X W^T + bias on quantized copies of X and W, in the caller's buffers (bias: out_features
/// floats, or empty for none), on the executor: the host (host memory; linear_step_options,
/// statistics into a linear_stats) or a CUDA stream (nn/linear.cuh: device memory;
/// device_linear_step_options, statistics into device memory; enqueues, never synchronizes).
/// Writes buf.x_t / buf.w_t when given (a backward reads them) and the statistics of the copies
/// made (X's, W's, and the rotated X's under HadamardWgrad). The caller records the amaxes of
/// delayed scaling (X's and W's). Shapes come from x and w (tokens x in, out x in); every buffer is
/// checked against them.
template <class LR, class Executor>
void linear_forward(const Executor& ex, matrix_ref<const float> x, matrix_ref<const float> w, span<const float> bias,
                    matrix_ref<float> y, const linear_forward_buffers<LR>& buf,
                    const typename detail::linear_backend<Executor>::options& o,
                    typename detail::linear_backend<Executor>::forward_stats stats) {
    static_assert(is_linear_recipe_v<LR>,
                  "octet::linear_forward: LR must be an octet::linear_recipe<...> (see octet::linear_recipes)");
    using backend = detail::linear_backend<Executor>;
    constexpr const char* fn = "octet::linear_forward";
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    const std::size_t tokens = x.rows, in = x.cols, out = w.rows;
    detail::validate_input(x, fn, "x");
    detail::require_linear_matrix(w, out, in, fn, "w", "out_features x in_features, in_features = x's columns");
    detail::require_linear_matrix(y, tokens, out, fn, "y", "tokens x out_features");
    OCTET_REQUIRE(bias.empty() || bias.size() == out, fn, "bias",
                  detail::message("has ", bias.size(), " entries; pass out_features = ", out, " or none"));
    OCTET_REQUIRE(bias.empty() || bias.data() != nullptr, fn, "bias", "is null with a non-zero size");
    OCTET_REQUIRE(!buf.x.absent() && !buf.w.absent(), fn, "buffers.x/buffers.w",
                  "must both be given: the forward GEMM multiplies X's and W's row-wise copies");
    const std::size_t padded = linear_wgrad_tokens<LR>(tokens);
    const bool rotate = LR::hadamard_wgrad && !buf.x_t.absent();
    OCTET_REQUIRE(!rotate || buf.rotated.size() >= padded * in, fn, "buffers.rotated",
                  detail::message("holds ", buf.rotated.size(), " floats; the Hadamard-rotated X needs ", padded, " x ",
                                  in, " (linear_wgrad_tokens(tokens) x in_features)"));

    backend::begin_forward(ex, stats);
    // X: the forward operand, and (no rotation) the weight-gradient operand.
    backend::quantize_operand(ex, linear_operand::x, x, buf.x, rotate ? quantized_ref<XR>{} : buf.x_t, o,
                              philox_stream{}, stats);
    // W: the forward operand, and the data-gradient operand.
    backend::quantize_operand(ex, linear_operand::w, w, buf.w, buf.w_t, o, philox_stream{}, stats);
    if (rotate) {
        const span<float> rotated(buf.rotated.data(), padded * in);
        backend::hadamard_tokens(ex, x, o.seed, rotated, fn);
        backend::quantize_operand(ex, linear_operand::x_hadamard, matrix_ref<const float>(rotated.data(), padded, in),
                                  quantized_ref<XR>{}, buf.x_t, o, philox_stream{}, stats);
    }
    gemm_options g;
    g.bias = bias;
    scaled_gemm(ex, quantized_cref<XR>(buf.x), quantized_cref<WR>(buf.w), y, g);
}

/// dX = dY W (skipped when dx is {}), dW = dY^T X (skipped when dw is {}) and db = the column sums
/// of dY (skipped when db is empty), from the forward's copies in buf.w_t and buf.x_t, in the
/// caller's buffers, on the executor (as linear_forward). Writes the statistics of dY's copies (and
/// of the rotated dY's under HadamardWgrad); the caller records dY's amax (delayed scaling) and
/// counts the step.
template <class LR, class Executor>
void linear_backward(const Executor& ex, matrix_ref<const float> dy, matrix_ref<float> dx, matrix_ref<float> dw,
                     span<float> db, const linear_backward_buffers<LR>& buf,
                     const typename detail::linear_backend<Executor>::options& o,
                     typename detail::linear_backend<Executor>::backward_stats stats) {
    static_assert(is_linear_recipe_v<LR>,
                  "octet::linear_backward: LR must be an octet::linear_recipe<...> (see octet::linear_recipes)");
    using backend = detail::linear_backend<Executor>;
    constexpr const char* fn = "octet::linear_backward";
    using GR = typename LR::g_quantize_recipe;
    const std::size_t tokens = dy.rows, out = dy.cols;
    detail::validate_input(dy, fn, "dy");
    const bool want_dx = !detail::matrix_absent(dx), want_dw = !detail::matrix_absent(dw);
    const std::size_t padded = linear_wgrad_tokens<LR>(tokens);
    if (want_dx) {
        OCTET_REQUIRE(!buf.w_t.absent(), fn, "buffers.w_t",
                      "is absent; a data gradient reads the forward's W^T copy (keep it in the forward)");
        OCTET_REQUIRE(buf.w_t.cols() == out, fn, "buffers.w_t",
                      detail::message("is ", buf.w_t.rows(), " x ", buf.w_t.cols(), "; dy has ", out,
                                      " columns (out_features), so W^T's copy must be in_features x ", out));
        detail::require_linear_matrix(dx, tokens, buf.w_t.rows(), fn, "dx", "tokens x in_features, or {} to skip it");
        OCTET_REQUIRE(!buf.dy.absent(), fn, "buffers.dy", "is absent; a data gradient needs dY's row-wise copy");
    }
    if (want_dw) {
        OCTET_REQUIRE(!buf.x_t.absent(), fn, "buffers.x_t",
                      "is absent; a weight gradient reads the forward's X^T copy (keep it in the forward)");
        OCTET_REQUIRE(buf.x_t.cols() == padded, fn, "buffers.x_t",
                      detail::message("is ", buf.x_t.rows(), " x ", buf.x_t.cols(), "; dy has ", tokens,
                                      " rows (tokens), so X^T's copy must be in_features x ", padded,
                                      " (the forward's tokens, padded to 16 under HadamardWgrad)"));
        detail::require_linear_matrix(dw, out, buf.x_t.rows(), fn, "dw",
                                      "out_features x in_features, or {} to skip it");
        OCTET_REQUIRE(!buf.dy_t.absent(), fn, "buffers.dy_t", "is absent; a weight gradient needs dY^T's copy");
    }
    OCTET_REQUIRE(db.empty() || db.size() == out, fn, "db",
                  detail::message("has ", db.size(), " entries; pass out_features = ", out, " or none"));
    OCTET_REQUIRE(db.empty() || db.data() != nullptr, fn, "db", "is null with a non-zero size");
    const bool rotate = LR::hadamard_wgrad && want_dw;
    OCTET_REQUIRE(!rotate || buf.rotated.size() >= padded * out, fn, "buffers.rotated",
                  detail::message("holds ", buf.rotated.size(), " floats; the Hadamard-rotated dY needs ", padded,
                                  " x ", out, " (linear_wgrad_tokens(tokens) x out_features)"));

    backend::begin_backward(ex, stats);
    const bool dy_col = want_dw && !rotate;
    if (want_dx || dy_col)
        backend::quantize_operand(ex, linear_operand::dy, dy, want_dx ? buf.dy : quantized_ref<GR>{},
                                  dy_col ? buf.dy_t : quantized_ref<GR>{}, o, philox_stream{o.seed, 4 * o.step}, stats);
    if (rotate) {
        const span<float> rotated(buf.rotated.data(), padded * out);
        backend::hadamard_tokens(ex, dy, o.seed, rotated, fn);
        backend::quantize_operand(ex, linear_operand::dy_hadamard, matrix_ref<const float>(rotated.data(), padded, out),
                                  quantized_ref<GR>{}, buf.dy_t, o, philox_stream{o.seed, 4 * o.step + 2}, stats);
    }

    if (want_dx) scaled_gemm(ex, quantized_cref<GR>(buf.dy), buf.w_t, dx);
    if (want_dw) scaled_gemm(ex, quantized_cref<GR>(buf.dy_t), buf.x_t, dw);
    if (!db.empty()) backend::column_sums(ex, dy, db);
}

/// Bytes of host scratch one linear_forward or linear_backward of `tokens` tokens (in_features in,
/// out_features out) takes from ex's allocator at most: its steps (quantize X, W, dY and the rotated
/// copies; the three GEMMs) run one after another, each giving its block back before the next, so
/// this is the largest step's need (quantize_scratch_bytes, scaled_gemm_scratch_bytes), not their
/// sum. It grows with tokens: the query at a context's max_tokens serves every call of the context.
template <class LR>
std::size_t linear_scratch_bytes(const host_executor& ex, std::size_t tokens, std::size_t in, std::size_t out) {
    static_assert(is_linear_recipe_v<LR>, "octet::linear_scratch_bytes: LR must be an octet::linear_recipe<...>");
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    using GR = typename LR::g_quantize_recipe;
    using quant = detail::quant_backend<host_executor>;
    const std::size_t padded = linear_wgrad_tokens<LR>(tokens);
    const auto m = [](std::size_t rows, std::size_t cols) { return matrix_ref<const float>(nullptr, rows, cols); };
    const auto block_cols = [](auto layout) { return layout.block_cols; };
    const gemm_options g;
    const std::size_t steps[] = {
        quant::scratch_bytes<XR, float>(ex, m(tokens, in), true, !LR::hadamard_wgrad),
        quant::scratch_bytes<XR, float>(ex, m(padded, in), false, LR::hadamard_wgrad),
        quant::scratch_bytes<WR, float>(ex, m(out, in), true, true),
        quant::scratch_bytes<GR, float>(ex, m(tokens, out), true, !LR::hadamard_wgrad),
        quant::scratch_bytes<GR, float>(ex, m(padded, out), false, LR::hadamard_wgrad),
        detail::host_gemm_scratch_bytes(ex, tokens, out, in, block_cols(quant_layout_of<XR>::make(tokens, in)),
                                        block_cols(quant_layout_of<WR>::make(out, in)), g.promotion_interval),
        detail::host_gemm_scratch_bytes(ex, tokens, in, out, block_cols(quant_layout_of<GR>::make(tokens, out)),
                                        block_cols(quant_layout_of<WR>::make(in, out)), g.promotion_interval),
        detail::host_gemm_scratch_bytes(ex, out, in, padded, block_cols(quant_layout_of<GR>::make(out, padded)),
                                        block_cols(quant_layout_of<XR>::make(in, padded)), g.promotion_interval),
    };
    std::size_t most = 0;
    for (std::size_t b : steps) most = std::max(most, b);
    return most;
}

namespace detail {
// The rules of a linear context that do not depend on where its buffers live: the host's below and
// the stream's (octet::cuda::linear_context, nn/linear.cuh) share them.

/// Bytes of a quantized copy's storage at rows x cols (codes, scales, and a two-level recipe's
/// tensor scale).
template <class R>
std::size_t quant_buffer_bytes(std::size_t rows, std::size_t cols) {
    const quant_layout l = quant_layout_of<R>::make(rows, cols);
    return l.data_bytes + l.scale_bytes + (R::two_level ? sizeof(float) : 0);
}

/// Floats of a context's Hadamard buffer (the rotated X or dY at max_tokens; none without HadamardWgrad).
template <class LR>
std::size_t linear_rotated_floats(const linear_config& c) {
    return LR::hadamard_wgrad ? linear_wgrad_tokens<LR>(c.max_tokens) * std::max(c.in_features, c.out_features) : 0;
}

/// What a context of LR built for c holds, by role.
template <class LR>
linear_memory linear_context_memory(const linear_config& c) {
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    using GR = typename LR::g_quantize_recipe;
    const std::size_t in = c.in_features, out = c.out_features, wgrad = linear_wgrad_tokens<LR>(c.max_tokens);
    linear_memory m;
    m.saved_for_backward =
        (c.recompute_input ? 0 : quant_buffer_bytes<XR>(in, wgrad)) + quant_buffer_bytes<WR>(in, out);
    m.workspace = quant_buffer_bytes<XR>(c.max_tokens, in) + quant_buffer_bytes<WR>(out, in) +
                  quant_buffer_bytes<GR>(c.max_tokens, out) + quant_buffer_bytes<GR>(out, wgrad);
    if (c.recompute_input) m.workspace += quant_buffer_bytes<XR>(in, wgrad);  // X's copy, made in the backward
    m.workspace += linear_rotated_floats<LR>(c) * sizeof(float);
    if (LR::scaling == linear_scaling::delayed)
        m.state = 3 * static_cast<std::size_t>(c.delayed.history_length) * sizeof(float);
    return m;
}

template <class LR>
const linear_config& checked_linear_config(const linear_config& c, const char* fn, bool on_stream = false) {
    OCTET_REQUIRE(!c.recompute_input || !on_stream, fn, "config.recompute_input",
                  "is set, but a stream context keeps X's copy (recompute_input is for host contexts)");
    OCTET_REQUIRE(!c.recompute_input || !LR::hadamard_wgrad, fn, "config.recompute_input",
                  "is set for a recipe with HadamardWgrad (nvfp4), whose X copy is of the rotated X; keep the "
                  "forward's copy (recompute_input = false)");
    OCTET_REQUIRE(c.in_features > 0, fn, "config.in_features", "is 0; pass the columns of X and W (>= 1)");
    OCTET_REQUIRE(c.out_features > 0, fn, "config.out_features", "is 0; pass the rows of W (>= 1)");
    (void)delayed_scaling(c.delayed);  // checks the history length and margin
    return c;
}

/// A context's forward: X must be tokens x in_features with tokens <= max_tokens, W out x in.
inline void require_context_forward(const linear_config& c, matrix_ref<const float> x, matrix_ref<const float> w) {
    constexpr const char* fn = "octet::linear_forward";
    OCTET_REQUIRE(x.cols == c.in_features, fn, "x",
                  message("has ", x.cols, " columns but the layer has in_features = ", c.in_features,
                          "; pass X as tokens x ", c.in_features));
    OCTET_REQUIRE(x.rows <= c.max_tokens, fn, "x",
                  message("has ", x.rows, " rows (tokens) but the context was built for max_tokens = ", c.max_tokens,
                          "; build the linear_context with a larger max_tokens"));
    require_linear_matrix(w, c.out_features, c.in_features, fn, "w", "out_features x in_features");
}

/// A context's backward: it follows a training forward of `tokens` tokens (saved), with dY of that
/// many rows and dX / dW of the layer's shapes or {} to skip them.
inline void require_context_backward(const linear_config& c, bool saved, std::size_t tokens, matrix_ref<const float> dy,
                                     const matrix_ref<float>& dx, const matrix_ref<float>& dw) {
    constexpr const char* fn = "octet::linear_backward";
    OCTET_REQUIRE(saved, fn, "ctx",
                  "holds no training forward to differentiate; call linear_forward (linear_pass::training) "
                  "before each linear_backward");
    require_linear_matrix(dy, tokens, c.out_features, fn, "dy", "the forward's tokens x out_features");
    if (!matrix_absent(dx))
        require_linear_matrix(dx, tokens, c.in_features, fn, "dx", "tokens x in_features, or {} to skip it");
    if (!matrix_absent(dw))
        require_linear_matrix(dw, c.out_features, c.in_features, fn, "dw",
                              "out_features x in_features, or {} to skip it");
}

/// A context's six quantized copies at their largest shapes (Buffer<R>: quant_buffer here, the
/// stream's device_quant_buffer; `where...` is what a buffer is built with before its shape), and
/// which of them a forward or backward of `tokens` tokens hands to linear_forward / linear_backward.
template <class LR, template <class> class Buffer>
struct linear_copies {
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    using GR = typename LR::g_quantize_recipe;

    template <class... Where>
    linear_copies(const linear_config& c, const Where&... where)
        : x_row(where..., c.max_tokens, c.in_features),
          w_row(where..., c.out_features, c.in_features),
          x_col(where..., c.in_features, linear_wgrad_tokens<LR>(c.max_tokens)),
          w_col(where..., c.in_features, c.out_features),
          dy_row(where..., c.max_tokens, c.out_features),
          dy_col(where..., c.out_features, linear_wgrad_tokens<LR>(c.max_tokens)) {}

    /// The same with the transient copies (row-wise X and W, dY's two) borrowed (host storage only).
    linear_copies(const linear_config& c, borrowed_storage b)
        : x_row(b, c.max_tokens, c.in_features),
          w_row(b, c.out_features, c.in_features),
          x_col(c.recompute_input ? Buffer<XR>(b, c.in_features, linear_wgrad_tokens<LR>(c.max_tokens))
                                  : Buffer<XR>(c.in_features, linear_wgrad_tokens<LR>(c.max_tokens))),
          w_col(c.in_features, c.out_features),
          dy_row(b, c.max_tokens, c.out_features),
          dy_col(b, c.out_features, linear_wgrad_tokens<LR>(c.max_tokens)) {}

    /// The row-wise copies, and for a training pass the column-wise ones the backward reads.
    linear_forward_buffers<LR> forward(const linear_config& c, std::size_t tokens, bool training, span<float> rotated) {
        linear_forward_buffers<LR> buf;
        buf.x = x_row.ref(tokens, c.in_features);
        buf.w = w_row.ref(c.out_features, c.in_features);
        if (training) {
            if (!c.recompute_input) buf.x_t = x_col.ref(c.in_features, linear_wgrad_tokens<LR>(tokens));
            buf.w_t = w_col.ref(c.in_features, c.out_features);
            buf.rotated = rotated;
        }
        return buf;
    }
    /// The forward's column-wise copies, and dY's copies for the gradients wanted.
    linear_backward_buffers<LR> backward(const linear_config& c, std::size_t tokens, bool want_dx, bool want_dw,
                                         span<float> rotated) {
        linear_backward_buffers<LR> buf;
        buf.x_t = x_col.cref();
        buf.w_t = w_col.cref();
        if (want_dx) buf.dy = dy_row.ref(tokens, c.out_features);
        if (want_dw) buf.dy_t = dy_col.ref(c.out_features, linear_wgrad_tokens<LR>(tokens));
        buf.rotated = rotated;
        return buf;
    }

    Buffer<XR> x_row;
    Buffer<WR> w_row;
    Buffer<XR> x_col;
    Buffer<WR> w_col;
    Buffer<GR> dy_row;
    Buffer<GR> dy_col;
};

/// Whether a backward quantized dY itself (not only its rotation), so delayed scaling records its amax.
template <class LR>
constexpr bool linear_backward_quantizes_dy(bool want_dx, bool want_dw) {
    return want_dx || (want_dw && !LR::hadamard_wgrad);
}
}  // namespace detail

/// The transient buffers of host linear contexts, shared: X's and W's row-wise copies (read by the
/// forward GEMM only), dY's two copies (the backward's), the Hadamard buffer. A context built on a
/// workspace (linear_context(config, workspace)) owns only what its backward reads (X's and W's
/// column-wise copies) and its delayed-scaling state, and binds the rest here on each call, so that
/// the layers of a model hold one set of transient copies, the largest layer's, not one each.
/// Contexts that share a workspace must not run at the same time (one model on one thread: its
/// layers run one after another). Building a context reserves what it needs (the workspace grows to
/// the largest context's need then, and never during a call); the workspace outlives its contexts.
class linear_workspace {
public:
    linear_workspace() = default;
    ~linear_workspace() { release(); }
    linear_workspace(const linear_workspace&) = delete;
    linear_workspace& operator=(const linear_workspace&) = delete;

    /// Grows the storage to at least `bytes` (a new block: no call may be running; the contents
    /// are not kept, since no copy outlives its call).
    void reserve(std::size_t bytes) {
        if (bytes <= bytes_) return;
        auto* block = static_cast<unsigned char*>(::operator new (bytes, std::align_val_t{64}));
        release();
        data_ = block;
        bytes_ = bytes;
    }
    /// The bytes allocated (the largest reserve so far).
    std::size_t bytes() const { return bytes_; }
    /// 64-byte aligned storage of bytes() bytes.
    unsigned char* data() { return data_; }

private:
    void release() {
        if (data_) ::operator delete (data_, std::align_val_t{64});
        data_ = nullptr;
        bytes_ = 0;
    }
    unsigned char* data_ = nullptr;
    std::size_t bytes_ = 0;
};

/// One linear layer's quantized copies, scratch, delayed-scaling histories, stochastic-rounding
/// step and last statistics. Copyable: a copy is a snapshot (a checkpoint of the layer's state;
/// a context on a workspace shares the workspace with its copy).
template <class LR>
class linear_context {
    static_assert(is_linear_recipe_v<LR>,
                  "octet::linear_context: LR must be an octet::linear_recipe<...> (see octet::linear_recipes)");

public:
    using recipe_type = LR;
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    using GR = typename LR::g_quantize_recipe;

    explicit linear_context(const linear_config& c)
        : config_(detail::checked_linear_config<LR>(c, "octet::linear_context")),
          copies_(c),
          rotated_(detail::linear_rotated_floats<LR>(c)),
          delayed_x_(c.delayed),
          delayed_w_(c.delayed),
          delayed_g_(c.delayed) {}

    /// A context whose transient copies live in `workspace` (see linear_workspace), which grows
    /// here to workspace_bytes(c) if smaller. Same results, bit for bit, as a context of its own.
    linear_context(const linear_config& c, linear_workspace& workspace)
        : config_(detail::checked_linear_config<LR>(c, "octet::linear_context")),
          copies_(c, detail::borrowed_storage{}),
          workspace_(&workspace),
          delayed_x_(c.delayed),
          delayed_w_(c.delayed),
          delayed_g_(c.delayed) {
        workspace.reserve(workspace_bytes(c));
    }

    /// Bytes of linear_workspace a context built for c binds: the larger of a forward's transient
    /// copies (X's and W's row-wise, the Hadamard buffer) and a backward's (dY's two, the buffer).
    static std::size_t workspace_bytes(const linear_config& c) {
        const detail::borrowed_storage b;
        detail::quant_buffer<XR> x(b, c.max_tokens, c.in_features);
        detail::quant_buffer<WR> w(b, c.out_features, c.in_features);
        detail::quant_buffer<GR> dy(b, c.max_tokens, c.out_features);
        detail::quant_buffer<GR> dy_t(b, c.out_features, linear_wgrad_tokens<LR>(c.max_tokens));
        detail::scratch_carver forward, backward;
        (void)bind_transients(forward, c, x, w);
        (void)bind_transients(backward, c, dy, dy_t);
        if (c.recompute_input) {  // X's column-wise copy, made in the backward
            detail::quant_buffer<XR> x_t(b, c.in_features, linear_wgrad_tokens<LR>(c.max_tokens));
            x_t.bind(backward);
        }
        return std::max(forward.bytes(), backward.bytes());
    }

    const linear_config& config() const { return config_; }
    const linear_stats& stats() const { return stats_; }
    /// Statistics cost more than the quantization itself on the host (about half of a step of a
    /// 1024 x 256 x 256 layer): a training loop may gather them only on the steps it reports.
    void set_collect_stats(bool on) { config_.collect_stats = on; }
    /// What the context owns (on a workspace: no transient copies; the workspace holds them).
    linear_memory memory() const {
        linear_memory m = detail::linear_context_memory<LR>(config_);
        if (workspace_) m.workspace = 0;
        return m;
    }
    /// The workspace the context binds its transient copies to (null: it owns them).
    const linear_workspace* workspace() const { return workspace_; }
    std::size_t bytes() const { return memory().total(); }

    /// Backward passes completed (the stochastic-rounding offset is 4 * step()).
    std::uint64_t step() const { return step_; }
    void set_step(std::uint64_t s) { step_ = s; }
    /// Token count of the training forward a backward may follow (none: no backward is allowed).
    bool has_saved_forward() const { return saved_; }
    std::size_t saved_tokens() const { return tokens_; }
    /// Delayed scaling of X, W and dY (their histories; unused under current scaling).
    const delayed_scaling& delayed_x() const { return delayed_x_; }
    const delayed_scaling& delayed_w() const { return delayed_w_; }
    const delayed_scaling& delayed_g() const { return delayed_g_; }

    /// Bytes of host scratch any forward or backward of this context takes from ex's allocator at
    /// most (linear_scratch_bytes at max_tokens).
    std::size_t scratch_bytes(const host_executor& ex) const {
        return linear_scratch_bytes<LR>(ex, config_.max_tokens, config_.in_features, config_.out_features);
    }

    /// Tokens of the weight-gradient GEMM's K for `tokens` tokens (padded to 16 under HadamardWgrad).
    static std::size_t wgrad_tokens(std::size_t tokens) { return linear_wgrad_tokens<LR>(tokens); }

    /// Y = X W^T + bias on quantized copies of X and W (bias: out_features floats, or empty for
    /// none). A training pass keeps X's and W's column-wise copies here for backward() and pushes
    /// delayed-scaling amaxes; an inference pass does neither.
    void forward(host_executor ex, matrix_ref<const float> x, matrix_ref<const float> w, span<const float> bias,
                 matrix_ref<float> y, linear_pass pass = linear_pass::training) {
        detail::require_context_forward(config_, x, w);
        const bool training = pass == linear_pass::training;
        if (training) saved_ = false;                          // until the new copies are complete
        if (training) x_scale_amax_ = options().x_scale_amax;  // the backward's X copy uses it too
        span<float> rotated = as_span(rotated_);
        if (workspace_) {
            detail::scratch_carver c(workspace_->data());
            rotated = bind_transients(c, config_, copies_.x_row, copies_.w_row);
        }
        linear_forward(ex, x, w, bias, y, copies_.forward(config_, x.rows, training, rotated), options(), stats_);
        if (training) {
            if constexpr (LR::scaling == linear_scaling::delayed) {
                delayed_x_.record(stats_.x.amax);
                delayed_x_.update();
                delayed_w_.record(stats_.w.amax);
                delayed_w_.update();
            }
            tokens_ = x.rows;
            saved_ = true;
        }
    }

    /// dX, dW and db (each skipped when passed empty) from the copies of the training forward
    /// before it. One backward per training forward. Under config.recompute_input a weight
    /// gradient needs X: pass it to the overload below.
    void backward(host_executor ex, matrix_ref<const float> dy, matrix_ref<float> dx, matrix_ref<float> dw,
                  span<float> db) {
        detail::require_context_backward(config_, saved_, tokens_, dy, dx, dw);
        OCTET_REQUIRE(!config_.recompute_input || detail::matrix_absent(dw), "octet::linear_backward", "x",
                      "is missing: the context keeps no copy of X (config.recompute_input), so a weight gradient "
                      "takes X again; call backward(ex, x, dy, dx, dw, db)");
        run_backward(ex, nullptr, dy, dx, dw, db);
    }
    /// The same under config.recompute_input: x (the forward's tokens x in_features) is the
    /// forward's X or the caller's recomputation of it; X's column-wise copy is made from it here.
    void backward(host_executor ex, matrix_ref<const float> x, matrix_ref<const float> dy, matrix_ref<float> dx,
                  matrix_ref<float> dw, span<float> db) {
        constexpr const char* fn = "octet::linear_backward";
        detail::require_context_backward(config_, saved_, tokens_, dy, dx, dw);
        OCTET_REQUIRE(config_.recompute_input, fn, "x",
                      "is given, but the context keeps the forward's copy of X (config.recompute_input is false); "
                      "call backward(ex, dy, dx, dw, db)");
        detail::validate_input(x, fn, "x");
        detail::require_linear_matrix(x, tokens_, config_.in_features, fn, "x",
                                      "the forward's tokens x in_features (its X, or a recomputation of it)");
        run_backward(ex, &x, dy, dx, dw, db);
    }

private:
    void run_backward(host_executor ex, const matrix_ref<const float>* x, matrix_ref<const float> dy,
                      matrix_ref<float> dx, matrix_ref<float> dw, span<float> db) {
        const bool want_dx = !detail::matrix_absent(dx), want_dw = !detail::matrix_absent(dw);
        span<float> rotated = as_span(rotated_);
        if (workspace_) {
            detail::scratch_carver c(workspace_->data());
            rotated = bind_transients(c, config_, copies_.dy_row, copies_.dy_col);
            if (config_.recompute_input) copies_.x_col.bind(c);
        }
        if (want_dw && x) {  // recompute_input: X's column-wise copy, with the forward's X scale
            quantize_options q;
            q.collect_stats = config_.collect_stats;
            q.tensor_amax = x_scale_amax_;
            stats_.x.columnwise =
                quantize<XR>(ex, *x, quantized_ref<XR>{},
                             copies_.x_col.ref(config_.in_features, linear_wgrad_tokens<LR>(tokens_)), q)
                    .columnwise;
        }
        linear_backward(ex, dy, dx, dw, db, copies_.backward(config_, tokens_, want_dx, want_dw, rotated), options(),
                        stats_);
        if constexpr (LR::scaling == linear_scaling::delayed) {
            if (detail::linear_backward_quantizes_dy<LR>(want_dx, want_dw)) {
                delayed_g_.record(stats_.dy.amax);
                delayed_g_.update();
            }
        }
        ++step_;
        saved_ = false;
    }

    /// Binds a call's two transient copies and the Hadamard buffer to the carver's storage, in one
    /// order for the call and for workspace_bytes; returns the buffer.
    template <class A, class B>
    static span<float> bind_transients(detail::scratch_carver& c, const linear_config& config, A& first, B& second) {
        first.bind(c);
        second.bind(c);
        const std::size_t floats = detail::linear_rotated_floats<LR>(config);
        return span<float>(c.take<float>(floats), floats);
    }

    linear_step_options options() const {
        linear_step_options o;
        if constexpr (LR::scaling == linear_scaling::delayed) {
            o.x_scale_amax = delayed_x_.amax_for_scale();
            o.w_scale_amax = delayed_w_.amax_for_scale();
            o.g_scale_amax = delayed_g_.amax_for_scale();
        }
        o.seed = config_.seed;
        o.step = step_;
        o.collect_stats = config_.collect_stats;
        return o;
    }

    linear_config config_;
    detail::linear_copies<LR, detail::quant_buffer> copies_;
    std::vector<float> rotated_;             // empty on a workspace
    linear_workspace* workspace_ = nullptr;  // the transient copies' storage, or null: the context's own
    delayed_scaling delayed_x_, delayed_w_, delayed_g_;
    linear_stats stats_;
    std::uint64_t step_ = 0;
    std::size_t tokens_ = 0;
    float x_scale_amax_ = -1.0f;  // the training forward's X scale amax (recompute_input's X copy)
    bool saved_ = false;
};

/// Y = X W^T + bias on quantized copies of X and W (bias: out_features floats, or empty for none).
/// A training pass keeps X's and W's column-wise copies in ctx for linear_backward.
template <class LR>
void linear_forward(host_executor ex, linear_context<LR>& ctx, matrix_ref<const float> x, matrix_ref<const float> w,
                    span<const float> bias, matrix_ref<float> y, linear_pass pass = linear_pass::training) {
    ctx.forward(ex, x, w, bias, y, pass);
}

/// dX = dY W (skipped when dx is {}), dW = dY^T X (skipped when dw is {}) and db = the column sums
/// of dY (skipped when db is empty), from the copies of the training forward before it. One
/// backward per training forward.
template <class LR>
void linear_backward(host_executor ex, linear_context<LR>& ctx, matrix_ref<const float> dy, matrix_ref<float> dx,
                     matrix_ref<float> dw, span<float> db) {
    ctx.backward(ex, dy, dx, dw, db);
}
/// The same for a context built with config.recompute_input: x is the forward's X (tokens x
/// in_features) or the caller's recomputation of it, from which X's column-wise copy is made.
template <class LR>
void linear_backward(host_executor ex, linear_context<LR>& ctx, matrix_ref<const float> x, matrix_ref<const float> dy,
                     matrix_ref<float> dx, matrix_ref<float> dw, span<float> db) {
    ctx.backward(ex, x, dy, dx, dw, db);
}

}  // namespace octet
