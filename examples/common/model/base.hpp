// examples/common/model/base.hpp: what every part of the transformer (../model.hpp) reads: the
// includes, the switch for octet's FP8 linear layer, and the step's telemetry.
#pragma once

#include <octet/octet.hpp>

namespace octet {
class linear_workspace;  // octet/nn/linear.hpp, when this build has it
}

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if __has_include(<octet/nn/linear.hpp>)
#include <octet/nn/linear.hpp>
#define TRAIN_HAS_FP8_LINEAR 1
#else
#define TRAIN_HAS_FP8_LINEAR 0
#endif

#include "../config.hpp"
#include "../meter.hpp"

#include <map>

namespace common {

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
    // Mixture of experts (empty and 0 for a dense model)
    std::vector<std::vector<double>> expert_tokens;  ///< per MoE block (block order): assignments per expert
    std::uint64_t moe_dropped = 0;                   ///< assignments past an expert's capacity (none has one)
    double moe_aux_loss = 0;                         ///< L_aux summed over the MoE blocks (1 each when balanced)
    /// What dispatching the assignments' rows to their experts moves: FP8 codes and scales (the
    /// recipe's activation copy; blockwise's 1x128 E4M3 under float32), and bf16 rows.
    double dispatch_fp8_bytes = 0, dispatch_bf16_bytes = 0;
};

}  // namespace common
