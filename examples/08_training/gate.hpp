// examples/08_training/gate.hpp: the validation gate the training run passes before it trains.
//
//   std::vector<train::gate_check> gate = train::run_gate(octet::on_host(), seed);
//   if (!train::gate_passed(gate)) return 1;  // the run refuses to train
//
// Invariants on small controlled cases, each a measured value against a limit that comes from
// octet's documented bounds or from an error analysis written beside it (and in the check's
// detail): the attention backward's row-sum residual and forward output against float64, the
// Hadamard transform and the gradient codecs with error feedback, one AdamW step against float64,
// E4M3 / E5M2 conversion and blockwise quantization against the float64 references, and one FP8
// linear-layer forward against float64. A check passes when its value is finite and at most its
// limit. Every measuring function takes the results it judges as arguments (gate_test.cpp feeds it
// corrupted ones and sees it fail). About 0.3 s on one core.
//
// The checks live in gate/, one file per part: attention.hpp, codec.hpp, optimizer.hpp,
// conversion.hpp, linear.hpp (and common.hpp, what they share); here: the gate that runs them all.
#pragma once

#include <octet/octet.hpp>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "gate/attention.hpp"
#include "gate/codec.hpp"
#include "gate/common.hpp"
#include "gate/conversion.hpp"
#include "gate/linear.hpp"
#include "gate/optimizer.hpp"
#include "train.hpp"

namespace train {

/// Every check of the gate on fresh inputs drawn from `seed`.
inline std::vector<gate_check> run_gate(octet::host_executor ex, std::uint64_t seed) {
    std::vector<gate_check> out;
    auto add = [&out](std::vector<gate_check> v) {
        for (auto& c : v) out.push_back(std::move(c));
    };
    auto salt = [seed](std::uint64_t k) { return seed ^ (k * 0x9E3779B97F4A7C15ull); };
    add(gate::attention_checks(ex, salt(1)));
    add(gate::codec_checks(ex, salt(2)));
    add(gate::optim_checks(ex, salt(3)));
    add(gate::conversion_checks(ex, salt(4)));
    add(gate::linear_checks(ex, salt(5)));
    return out;
}

/// True when every check passed (and there is at least one).
inline bool gate_passed(const std::vector<gate_check>& checks) {
    return !checks.empty() && std::all_of(checks.begin(), checks.end(), [](const gate_check& c) { return c.passed; });
}

}  // namespace train
