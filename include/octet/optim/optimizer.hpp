// octet/optim/optimizer.hpp: a small owning AdamW optimizer on the host, for programs and tests
// that want the state, the step counter and checkpoints in one object.
//
//   octet::adamw_optimizer<octet::state_codec::dynamic8, octet::state_codec::dynamic8, octet::master::bf16_kahan>
//   opt(n, hyper); opt.state.set_params(initial); for (...) { opt.step(octet::on_host(), octet::as_cspan(grads), lr); }
//   opt.save("run.ckpt");  ...  opt.load("run.ckpt");
//
// step() advances the counter unless the step was skipped (grad_nonfinite_policy::skip_step), and
// adds the step's report to `totals`. load() restores the state, the hyperparameters and the
// counter from the file, so that N steps, save, load, M steps equals N + M steps bit for bit.
#pragma once

#include <cstdint>
#include <string>

#include "octet/optim/adamw.hpp"
#include "octet/optim/checkpoint.hpp"

namespace octet {

template <class MCodec, class VCodec = MCodec, class Master = master::fp32>
class adamw_optimizer {
public:
    using state_type = adamw_state<MCodec, VCodec, Master>;

    explicit adamw_optimizer(std::size_t n, const adamw_hyper& h = {}) : state(n), hyper(h) {}

    template <class Grad>
    adamw_report step(host_executor ex, span<const Grad> grads, float lr) {
        const adamw_report r = adamw_step(ex, state.ref(), grads, hyper, steps + 1, lr);
        if (!r.skipped) ++steps;
        totals.nonfinite_gradients += r.nonfinite_gradients;
        totals.blocks_zeroed += r.blocks_zeroed;
        totals.skipped += r.skipped;
        return r;
    }

    void save(const std::string& path) { save_adamw_checkpoint(path, state.ref(), hyper, steps); }
    void load(const std::string& path) {
        const adamw_checkpoint_info info = load_adamw_checkpoint(path, state.ref());
        hyper = info.hyper;
        steps = info.steps;
    }

    state_type state;
    adamw_hyper hyper;
    std::uint64_t steps = 0;  ///< steps taken (the next one is steps + 1)
    adamw_report totals;      ///< sums of every step's report since construction
};

}  // namespace octet
