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
};

}  // namespace common
