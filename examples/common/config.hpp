// examples/common/config.hpp: what a run of the shared transformer is configured by: the model's
// sizes (tiny, small, medium) and a recipe (which precision each mechanism runs in). Shared by the
// training program (examples/08_training) and the RL program (examples/09_rl).
#pragma once

#include <octet/octet.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace common {

/// A decoder-only transformer: token embedding, `layers` pre-norm blocks (RMSNorm, causal
/// multi-head attention with grouped-query heads, RMSNorm, a GELU MLP or a mixture of experts), a
/// final RMSNorm and an output head (tied to the embedding or separate). Characters are tokens.
struct model_config {
    std::string name = "tiny";
    int vocab = 0;  ///< set from the corpus
    int d_model = 128;
    int layers = 2;
    int heads_q = 4;
    int heads_kv = 2;
    int head_dim = 32;  ///< d_model = heads_q * head_dim
    int d_ff = 512;
    int seq_len = 128;  ///< tokens per sequence (the model sees seq_len inputs, predicts seq_len targets)
    bool tied_head = true;
    /// Mixture of experts (0: every MLP is dense): the MLP of every moe_every-th block (blocks
    /// moe_every - 1, 2 moe_every - 1, ...) is moe_experts GELU experts of width d_ff / moe_top_k,
    /// each token routed to moe_top_k of them, so a token meets as many MLP weights as the dense
    /// MLP of the same d_ff (equal active parameters).
    int moe_experts = 0;
    int moe_top_k = 0;
    int moe_every = 1;
    /// The load-balancing loss's weight (Switch Transformer's 0.01; its gradient reaches the router).
    float moe_aux_loss = 0.01f;

    bool moe() const { return moe_experts > 0; }
    /// Whether block l's MLP is the mixture of experts.
    bool moe_block(int l) const { return moe() && (l + 1) % moe_every == 0; }
    /// Blocks whose MLP is the mixture of experts.
    int moe_blocks() const { return moe() ? layers / moe_every : 0; }
    /// Each expert's hidden width.
    int expert_ff() const { return moe() ? d_ff / moe_top_k : 0; }
};

/// The non-empty items of a comma-separated flag value ("a,b,,c" -> a, b, c).
inline std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> v;
    std::stringstream ss(s);
    for (std::string item; std::getline(ss, item, ',');)
        if (!item.empty()) v.push_back(item);
    return v;
}

/// The suffix a size's name takes for its mixture-of-experts variant: _moe{experts}x{top_k}, and
/// _every{n} when not every block's MLP is one ("tiny_moe8x2", "small_moe8x2_every2").
inline std::string moe_suffix(int experts, int top_k, int every) {
    std::string s = "_moe" + std::to_string(experts) + "x" + std::to_string(top_k);
    if (every != 1) s += "_every" + std::to_string(every);
    return s;
}

/// The named sizes: tiny, small, medium, each optionally with moe_suffix (vocab is left 0: set it
/// from the corpus).
inline model_config size_config(const std::string& full_name) {
    model_config m;
    std::string name = full_name;
    if (const auto at = full_name.find("_moe"); at != std::string::npos) {
        name = full_name.substr(0, at);
        int experts = 0, top_k = 0, every = 1, used = 0;
        const std::string tail = full_name.substr(at);
        const bool parsed =
            std::sscanf(tail.c_str(), "_moe%dx%d%n", &experts, &top_k, &used) == 2 &&
            (static_cast<std::size_t>(used) == tail.size() ||
             (std::sscanf(tail.c_str() + used, "_every%d", &every) == 1 && moe_suffix(experts, top_k, every) == tail));
        if (!parsed || experts < 1 || top_k < 1 || every < 1)
            throw std::invalid_argument("--sizes: '" + full_name +
                                        "' is not SIZE_moeEXPERTSxTOPK[_everyN] (e.g. tiny_moe8x2)");
        m.moe_experts = experts, m.moe_top_k = top_k, m.moe_every = every;
    }
    m.name = full_name;
    if (name == "tiny") {  // ~0.2M parameters
        m.d_model = 128, m.layers = 1, m.heads_q = 4, m.heads_kv = 2, m.head_dim = 32, m.d_ff = 512, m.seq_len = 64;
    } else if (name == "small") {  // ~0.8M parameters
        m.d_model = 128, m.layers = 4, m.heads_q = 4, m.heads_kv = 2, m.head_dim = 32, m.d_ff = 512;
    } else if (name == "medium") {  // ~2M parameters
        m.d_model = 256, m.layers = 3, m.heads_q = 8, m.heads_kv = 4, m.head_dim = 32, m.d_ff = 1024;
    } else {
        throw std::invalid_argument("--sizes: unknown size '" + name + "' (use tiny, small or medium)");
    }
    if (m.moe()) {
        if (m.moe_top_k > m.moe_experts || m.d_ff % m.moe_top_k != 0 || m.moe_every > m.layers)
            throw std::invalid_argument(
                "--sizes: '" + full_name + "': top_k must be at most the experts and divide d_ff (" +
                std::to_string(m.d_ff) + "), and every at most the layers (" + std::to_string(m.layers) + ")");
    }
    return m;
}

/// How the linear layers compute (forward, data gradient, weight gradient).
enum class linear_mode { float32, bf16, tensorwise_delayed, tensorwise, blockwise, mxfp8, nvfp4 };
/// How attention computes: float32 throughout, or octet's FP8 attention (forward and backward).
enum class attention_mode { float32, fp8 };
/// Granularity of the V operand's scales in FP8 attention.
enum class v_scale_mode { per_head, per_token };
/// Optimizer moments: float32, or octet's 8-bit dynamic codec.
enum class moment_mode { float32, dynamic8 };
/// Master weights: float32, or bf16 with stochastic rounding.
enum class master_mode { float32, bf16_stochastic };
/// How the non-linear layers' saved inputs (RMSNorm's residual-stream inputs, GELU's input) are
/// kept for the backward: float32; bf16 (round to nearest even; with float32 attention, its Q, K,
/// V and output too, as autocast's bf16 attention keeps them); or FP8 (octet::saved_activation,
/// E4M3 with a float scale per 32 elements of a row; with the FP8 attention and matched delta,
/// attention's output too).
enum class saved_storage { float32, bf16, fp8 };
/// How each rank keeps its gradient: float32, or bf16 (each tensor's gradient computed in float in
/// the step buffers and rounded once to nearest even as it completes; the all-reduce, the checks
/// and the optimizer read the bf16 buffer in place).
enum class gradient_storage { float32, bf16 };

class linear_layer;  // model.hpp
class memory_meter;

/// Makes one linear layer of a model: make_linear_layer (model.hpp) on the host, or another
/// placement of the same layers (cuda_linear.hpp: the FP8 modes on a CUDA stream).
using linear_factory = std::unique_ptr<linear_layer> (*)(memory_meter& m, linear_mode mode, std::size_t max_tokens,
                                                         int in, int out, std::uint64_t seed);

/// One recipe of the comparison: every mechanism's precision, named.
struct recipe_config {
    std::string name;
    linear_mode linear = linear_mode::float32;
    attention_mode attention = attention_mode::float32;
    octet::delta_mode delta = octet::delta_mode::matched;
    v_scale_mode v_scale = v_scale_mode::per_head;
    moment_mode moments = moment_mode::float32;
    master_mode master = master_mode::float32;
    bool gradient_codec = false;  ///< gradients cross the ranks through octet's codec with error feedback
    /// How the codec's error-feedback residuals are stored (both stages): bf16, or E4M3 with a scale
    /// per block (half the bytes)
    octet::residual_storage residuals = octet::residual_storage::bf16;
    /// The non-linear layers' saved inputs: float32, bf16 or FP8 copies (saved_storage)
    saved_storage saved_activations = saved_storage::float32;
    /// FP8 linears on the host (not nvfp4) keep no copy of their input X: the backward recomputes
    /// X from what the non-linear layers saved (a norm's output from its input and rstd, GELU's
    /// output from its input, attention's output from its copy) and quantizes it then
    /// (octet::linear_config::recompute_input). Bit for bit the kept copies where those saves are
    /// float32; from their bf16 or FP8 copies, the weight gradients read the decoded inputs.
    bool recompute_linear_inputs = false;
    gradient_storage gradients = gradient_storage::float32;  ///< each rank's gradient buffer
    bool recovery = true;                                    ///< checks before each update, and the recovery policy
    linear_factory make_linear = nullptr;  ///< where the linears run (null: make_linear_layer, the host)
};

}  // namespace common
