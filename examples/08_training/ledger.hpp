// examples/08_training/ledger.hpp: the memory ledger's prediction for one training run, written
// from its configuration (octet's bytes per parameter, the model's buffer plan, the codec's encoded
// size), not from the meter, so that the report can set the two side by side. Under mpirun it
// counts this process (its ranks) alone, as the meter does.
#pragma once

#include "common/model.hpp"
#include "gradient_exchange.hpp"
#include "gradients.hpp"
#include "optimizer.hpp"
#include "train.hpp"

#include <octet/octet.hpp>

#include <cstddef>
#include <vector>

namespace train {

/// What the prediction is written from: the run's configuration and where its ranks run.
struct ledger_shape {
    model_config size;
    recipe_config recipe;
    std::size_t parameters = 0;
    int ranks = 1;        ///< P: the ranks of the run
    int local_ranks = 1;  ///< L: those of this process, global ranks first .. first + L - 1
    int first = 0;
    int per_rank = 1;  ///< sequences per rank and step
    int eval_sequences = 0;
    int threads = 1;
    bool other_processes = false;  ///< under mpirun
};

/// The predicted bytes per category. `raised`: the run's recovery log has a repeated step (one rank
/// at a time ran it raised to float32, with the float copies that needs): an event of the run, not
/// of its configuration (a check trips or not; sampling the generated text keeps nothing per layer).
inline octet::memory_ledger predicted_ledger(const ledger_shape& s, gradient_exchange& exchange, bool raised) {
    const model_config& mc = s.size;
    const recipe_config& rc = s.recipe;
    const std::size_t n = s.parameters;
    const int P = s.ranks, L = s.local_ranks, first = s.first, per_rank = s.per_rank;
    const double tokens_bytes = 4.0 * (static_cast<double>(L) * per_rank + s.eval_sequences) * (mc.seq_len + 1);
    double residual_bytes = 0;
    if (rc.gradient_codec) {
        for (int r = first; r < first + L; ++r)
            residual_bytes += static_cast<double>(
                octet::residual_bytes(rc.residuals, n) +
                octet::residual_bytes(rc.residuals, octet::allreduce_shard(exchange.codec(), n, P, r).count));
    }
    octet::optimizer_memory_config lc = optimizer_ledger_config(rc, static_cast<double>(n));
    // A gradient per rank here (float or bf16), the residuals, and under mpirun without the codec
    // the all-gathered gradients of every rank.
    const double g = gradient_buffer::element_bytes(rc.gradients);
    lc.gradient_bytes =
        g * L + residual_bytes / static_cast<double>(n) + (s.other_processes && !rc.gradient_codec ? g * P : 0.0);
    // Every rank's model, and the float copies of a repeated step raised to float32.
    lc.activation_bytes = L * transformer::activation_bytes(mc, rc, per_rank, s.threads) +
                          (raised ? transformer::raise_precision_bytes(mc, rc, per_rank) : 0.0);
    // Temporaries: the models' own and their one set of step buffers (their block large enough to
    // lend, between steps, the codec its messages and scratch and the copy of the residuals a
    // repeated step restores; the checkpoint's copy is in its file), the token batches, and a raised
    // step's float buffers.
    std::vector<std::size_t> parts;
    if (rc.gradient_codec)
        for (int r = first; r < first + L; ++r) {
            parts.push_back(exchange.scratch_bytes(r));
            parts.push_back(octet::residual_bytes(rc.residuals, n));
            parts.push_back(
                octet::residual_bytes(rc.residuals, octet::allreduce_shard(exchange.codec(), n, P, r).count));
        }
    const std::size_t lend = step_buffers::lend_bytes(parts);
    lc.temporary_bytes = L * transformer::temporary_bytes(mc, rc, per_rank, s.threads, lend) -
                         (L - 1) * transformer::step_buffer_bytes(mc, rc, per_rank, s.threads, lend) + tokens_bytes +
                         (raised ? static_cast<double>(transformer::raise_temporary_bytes(mc, rc, per_rank)) : 0.0);
    return octet::optimizer_memory_ledger(lc);  // weights: the masters alone (compute reads them in place)
}

}  // namespace train
