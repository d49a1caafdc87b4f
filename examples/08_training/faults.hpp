// examples/08_training/faults.hpp: the faults a training run is put through, and where they enter.
// The trainer (trainer.hpp) calls a fault_hook at two fixed points of every step and knows nothing
// of which faults there are; scripted_faults is the program's script:
//   - a silent data corruption: on rank 0 at 3/5 of the run, 256 gradient entries with their
//     exponent bumped by 20 (a bit flip in the exponent field); only the step's first attempt sees
//     it (the recovery policy's repeat runs clean);
//   - a crash: the process state is lost between two checkpoints (at 4/5 of the run plus half a
//     checkpoint interval), so that the restart from the last checkpoint replays steps;
//   - the test hook OCTET_TRAINING_FAIL_RANK: that rank fails at step 1 (a real error, not
//     recovered: every rank must end with its message instead of waiting in a collective).
#pragma once

#include <octet/octet.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace train {

/// A crash of the process at a step's start (thrown by a fault_hook): what the process held is
/// lost, and the trainer restarts from its last checkpoint. what() says what crashed.
struct simulated_crash : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// Where faults enter a training run. The trainer calls:
///   step_starts(step, ...)      at each step's start, before anything of the step has run (a hook
///                               may throw simulated_crash there, or any other error);
///   gradients_computed(...)     on each of this process's ranks' gradients after their backward
///                               and before the ranks reduce them; also on a repeated step's.
class fault_hook {
public:
    virtual ~fault_hook() = default;
    /// `first_rank`, `local_ranks`: the global ranks this process runs.
    virtual void step_starts(std::int64_t step, int first_rank, int local_ranks) = 0;
    virtual void gradients_computed(std::int64_t step, int rank, octet::span<float> gradient) = 0;
    virtual void gradients_computed(std::int64_t step, int rank, octet::span<octet::bf16> gradient) = 0;
};

/// A run without faults.
class no_faults final : public fault_hook {
public:
    void step_starts(std::int64_t, int, int) override {}
    void gradients_computed(std::int64_t, int, octet::span<float>) override {}
    void gradients_computed(std::int64_t, int, octet::span<octet::bf16>) override {}
};

/// The program's scripted faults (the header's list), each once per run.
class scripted_faults final : public fault_hook {
public:
    /// `inject`: the corruption and the crash (--no-faults: neither); `checkpoint_every`: the
    /// trainer's checkpoint interval, which places the crash; `fail_rank`: the rank that fails at
    /// step 1 (-1: none).
    scripted_faults(int steps, std::int64_t checkpoint_every, bool inject, int fail_rank)
        : corrupt_step_(inject ? steps * 3 / 5 : -1),
          crash_step_(inject ? steps * 4 / 5 + checkpoint_every / 2 : -1),
          fail_rank_(fail_rank) {}

    void step_starts(std::int64_t step, int first_rank, int local_ranks) override {
        if (step == crash_step_ && !crashed_) {
            crashed_ = true;
            throw simulated_crash("scripted crash at step " + std::to_string(step));
        }
        if (step == 1 && fail_rank_ >= first_rank && fail_rank_ < first_rank + local_ranks)
            throw std::runtime_error("the failure OCTET_TRAINING_FAIL_RANK=" + std::to_string(fail_rank_) +
                                     " asked for, at step 1");
    }
    void gradients_computed(std::int64_t step, int rank, octet::span<float> gradient) override {
        corrupt(step, rank, gradient, [](float x) { return x * 1048576.0f; });
    }
    void gradients_computed(std::int64_t step, int rank, octet::span<octet::bf16> gradient) override {
        // the same exponent bump (exact in bf16, which has float's exponent range)
        corrupt(step, rank, gradient, [](octet::bf16 x) { return octet::to_bf16(octet::to_float(x) * 1048576.0f); });
    }

private:
    template <class G, class Bump>
    void corrupt(std::int64_t step, int rank, octet::span<G> gradient, Bump bump) {
        if (rank != 0 || step != corrupt_step_ || corrupted_) return;
        corrupted_ = true;
        const std::size_t n = gradient.size();
        for (std::size_t i = 0; i < 256 && i < n; ++i) gradient[(i * 7919) % n] = bump(gradient[(i * 7919) % n]);
    }

    std::int64_t corrupt_step_, crash_step_;
    int fail_rank_;
    bool corrupted_ = false, crashed_ = false;
};

}  // namespace train
