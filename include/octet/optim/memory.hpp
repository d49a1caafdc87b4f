// octet/optim/memory.hpp: bytes per parameter of each codec and master-weight choice, and a
// memory ledger (octet/monitor/memory_ledger.hpp) filled from a training configuration.
//
//   octet::optimizer_memory_config cfg;
//   cfg.parameters = 7'000'000'000; cfg.first_moment = cfg.second_moment = octet::state_codec_id::dynamic8;
//   cfg.master = octet::master_weights_id::bf16_kahan; cfg.activation_bytes = 40e9;
//   octet::memory_ledger ledger = octet::optimizer_memory_ledger(cfg);
//
// Accounting (per parameter):
//   weights          master weights as stored: 4 B (fp32) or 2 B (bf16 policies); plus 2 B when
//                    an fp32 master keeps a bf16 copy for the forward and backward passes
//   gradients        gradient_bytes (2 for bf16 gradients, 4 for float)
//   optimizer state  both moments, codes plus per-group meta (state_bytes_per_element), plus the
//                    2 B Kahan compensation buffer of master::bf16_kahan
//   activations, temporaries: given by the caller in bytes (the optimizer cannot know them)
#pragma once

#include <cstdint>

#include "octet/core/check.hpp"
#include "octet/monitor/memory_ledger.hpp"
#include "octet/optim/master_weights.hpp"
#include "octet/optim/state_codec.hpp"

namespace octet {

struct optimizer_memory_config {
    double parameters = 0;
    state_codec_id first_moment = state_codec_id::fp32;
    state_codec_id second_moment = state_codec_id::fp32;
    master_weights_id master = master_weights_id::fp32;
    double gradient_bytes = 2.0;    ///< per parameter
    bool bf16_weight_copy = false;  ///< an fp32 master also keeps a bf16 copy for compute
    double activation_bytes = 0.0;  ///< total, bytes
    double temporary_bytes = 0.0;   ///< total, bytes
};

struct parameter_bytes {
    double weights = 0, gradients = 0, optimizer_state = 0;
    double total() const { return weights + gradients + optimizer_state; }
};

/// Bytes per parameter of weights, gradients and optimizer state for a configuration.
inline parameter_bytes bytes_per_parameter(const optimizer_memory_config& c) {
    OCTET_REQUIRE(c.gradient_bytes >= 0, "octet::bytes_per_parameter", "config.gradient_bytes", "must be >= 0");
    parameter_bytes b;
    b.weights =
        master_weight_bytes(c.master) + ((c.bf16_weight_copy && c.master == master_weights_id::fp32) ? 2.0 : 0.0);
    b.gradients = c.gradient_bytes;
    b.optimizer_state = state_bytes_per_element(c.first_moment) + state_bytes_per_element(c.second_moment) +
                        master_compensation_bytes(c.master);
    return b;
}

/// The ledger of a configuration: weights, gradients and optimizer state from the bytes per
/// parameter, activations and temporaries as given.
inline memory_ledger optimizer_memory_ledger(const optimizer_memory_config& c) {
    OCTET_REQUIRE(c.parameters >= 0, "octet::optimizer_memory_ledger", "config.parameters", "must be >= 0");
    const parameter_bytes b = bytes_per_parameter(c);
    return memory_ledger{{memory_category::weights, b.weights * c.parameters},
                         {memory_category::gradients, b.gradients * c.parameters},
                         {memory_category::optimizer_state, b.optimizer_state * c.parameters},
                         {memory_category::activations, c.activation_bytes},
                         {memory_category::temporaries, c.temporary_bytes}};
}

/// The configuration of an optimizer type (moments and master weights), for `parameters` parameters.
template <class MCodec, class VCodec, class Master>
optimizer_memory_config memory_config_for(double parameters, double gradient_bytes = 2.0) {
    optimizer_memory_config c;
    c.parameters = parameters;
    c.first_moment = MCodec::id;
    c.second_moment = VCodec::id;
    c.master = Master::id;
    c.gradient_bytes = gradient_bytes;
    return c;
}

}  // namespace octet
