// examples/08_training/train.hpp: what the parts of the training program share: the model's
// sizes, a recipe (which precision each mechanism runs in), the meter that counts every buffer the
// run allocates, and the records the report is written from.
#pragma once

#include <octet/octet.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace train {

/// A decoder-only transformer: token embedding, `layers` pre-norm blocks (RMSNorm, causal
/// multi-head attention with grouped-query heads, RMSNorm, a GELU MLP), a final RMSNorm and an
/// output head (tied to the embedding or separate). Characters are tokens.
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
};

/// The non-empty items of a comma-separated flag value ("a,b,,c" -> a, b, c).
inline std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> v;
    std::stringstream ss(s);
    for (std::string item; std::getline(ss, item, ',');)
        if (!item.empty()) v.push_back(item);
    return v;
}

/// The named sizes: tiny, small, medium (vocab is left 0: set it from the corpus).
inline model_config size_config(const std::string& name) {
    model_config m;
    m.name = name;
    if (name == "tiny") {  // ~0.2M parameters
        m.d_model = 128, m.layers = 1, m.heads_q = 4, m.heads_kv = 2, m.head_dim = 32, m.d_ff = 512, m.seq_len = 64;
    } else if (name == "small") {  // ~0.8M parameters
        m.d_model = 128, m.layers = 4, m.heads_q = 4, m.heads_kv = 2, m.head_dim = 32, m.d_ff = 512;
    } else if (name == "medium") {  // ~2M parameters
        m.d_model = 256, m.layers = 3, m.heads_q = 8, m.heads_kv = 4, m.head_dim = 32, m.d_ff = 1024;
    } else {
        throw std::invalid_argument("--sizes: unknown size '" + name + "' (use tiny, small or medium)");
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
    /// The non-linear layers' saved inputs (RMSNorm's residual-stream inputs, GELU's input) kept as
    /// FP8 copies (octet::saved_activation, E4M3 1x32) instead of float32
    bool compress_activations = false;
    bool recovery = true;                  ///< checks before each update, and the recovery policy
    linear_factory make_linear = nullptr;  ///< where the linears run (null: make_linear_layer, the host)
};

/// Counts the bytes of every buffer the run allocates, by ledger category, with running and peak
/// totals (an octet::memory_ledger fed by allocations and frees).
class memory_meter {
public:
    void allocate(octet::memory_category c, double bytes) { ledger_.allocate(c, bytes); }
    void release(octet::memory_category c, double bytes) { ledger_.release(c, bytes); }
    const octet::memory_ledger& ledger() const { return ledger_; }

private:
    octet::memory_ledger ledger_;
};

/// A std::allocator that books what it allocates in a memory_meter under one category.
template <class T>
struct metered_allocator {
    using value_type = T;
    memory_meter* meter = nullptr;
    octet::memory_category category = octet::memory_category::temporaries;

    metered_allocator(memory_meter& m, octet::memory_category c) : meter(&m), category(c) {}
    template <class U>
    metered_allocator(const metered_allocator<U>& o) : meter(o.meter), category(o.category) {}

    T* allocate(std::size_t n) {
        T* p = std::allocator<T>{}.allocate(n);
        meter->allocate(category, static_cast<double>(n * sizeof(T)));
        return p;
    }
    void deallocate(T* p, std::size_t n) {
        meter->release(category, static_cast<double>(n * sizeof(T)));
        std::allocator<T>{}.deallocate(p, n);
    }
    template <class U>
    bool operator==(const metered_allocator<U>& o) const {
        return meter == o.meter && category == o.category;
    }
    template <class U>
    bool operator!=(const metered_allocator<U>& o) const {
        return !(*this == o);
    }
};

/// A vector whose storage is booked in a memory_meter.
template <class T>
using metered_vector = std::vector<T, metered_allocator<T>>;

template <class T>
metered_vector<T> make_metered(memory_meter& m, octet::memory_category c, std::size_t n, T value = T{}) {
    return metered_vector<T>(n, value, metered_allocator<T>(m, c));
}

/// What the model reports about one forward + backward (summed over its layers).
struct step_telemetry {
    double loss = 0;              ///< mean cross-entropy over the batch's targets, nats
    std::uint64_t quantized = 0;  ///< elements quantized to a narrow format this step
    std::uint64_t saturated = 0;  ///< of them, clamped to the format's largest finite value
    std::uint64_t underflow = 0;  ///< of them, nonzero inputs that became zero
    std::vector<double>
        attention_residual;  ///< per layer: attention_stats::residual_rel() (FP8 attention; 0 otherwise)
    std::vector<double>
        attention_residual_q;  ///< per layer: the same residual measured on the quantized dS that feeds dQ/dK
    std::map<std::string, double>
        op_seconds;  ///< time per operation ("linear", "attention", "norm", "embedding", "loss", ...)
};

inline constexpr double not_measured = std::numeric_limits<double>::quiet_NaN();

/// One recovery intervention, as the report shows it.
struct recovery_event {
    std::int64_t step = 0;
    std::string action;  ///< recovery_action_name
    std::string reason;
    double seconds = 0;  ///< its cost, included in the run's time
};

/// Everything reported about one training run (one recipe, one seed, one size, one length).
struct run_result {
    std::string recipe, size;
    int seed = 0, steps = 0, ranks = 1;
    double parameters = 0;
    bool recovery = true;
    std::vector<double> train_loss;               ///< per step, nats per character
    std::vector<std::pair<int, double>> heldout;  ///< (step, held-out loss, nats per character)
    double final_train_loss = not_measured;       ///< mean of the last 10% of steps
    double final_heldout_loss = not_measured;     ///< nats per character
    double heldout_bpc = not_measured;            ///< bits per character
    double tokens_per_second = 0;                 ///< tokens of this run's own steps / their wall time
    double wall_seconds = 0;                      ///< this run's steps, recoveries included, evaluation excluded
    std::map<std::string, double> op_seconds;     ///< per operation, summed over the run's steps
    double peak_bytes_measured = 0;               ///< metered peak over the run
    std::map<std::string, double> peak_bytes_by_category;  ///< metered peak per ledger category
    std::map<std::string, double> ledger_bytes;            ///< the ledger's prediction per category
    double ledger_peak_bytes = 0;                          ///< the ledger's predicted total
    int restarts = 0;
    std::vector<recovery_event> recoveries;
    double monitor_seconds = 0, monitor_overhead = 0;     ///< checks' time, and its fraction of wall_seconds
    std::vector<double> saturation_rate, underflow_rate;  ///< per step: saturated / quantized, underflow / quantized
    int clip_crossings = 0;                               ///< steps whose gradient norm crossed the clipping threshold
    std::vector<std::vector<double>> attention_residual;  ///< [step][layer]
    std::vector<std::vector<double>> attention_residual_q;  ///< [step][layer]
    std::string sample;                                     ///< generated text after training
};

/// One check of the validation gate.
struct gate_check {
    std::string name;  ///< e.g. "attention.row_sum_residual"
    double value = 0;  ///< what was measured
    double limit = 0;  ///< the largest acceptable value
    bool passed = false;
    std::string detail;  ///< what was measured, on what, and why the limit
};

/// The whole sweep, as report.md and report.json show it.
struct sweep_result {
    std::string command;  ///< the command line
    std::string machine;  ///< CPU model, threads
    std::vector<gate_check> gate;
    std::vector<run_result> runs;
    double tolerance_nats = 0;              ///< FP8 vs float32 held-out loss tolerance
    std::string reference_recipe = "fp32";  ///< the recipe the report measures each recipe's held-out gap against
    std::string tolerance_reason;
    std::vector<std::string> verdicts;  ///< one line per FP8 recipe: within tolerance or not, and by how much
    bool passed = true;                 ///< gate passed and every FP8 recipe within tolerance
    double wall_seconds = 0;
};

}  // namespace train
