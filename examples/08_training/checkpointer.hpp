// examples/08_training/checkpointer.hpp: a training run's checkpoints. The optimizer (octet's
// checkpoint format, a file) and the gradient codec's error-feedback residuals (a second file
// beside it, their bytes as they are): nothing of the checkpoint stays in memory. One checkpoint is
// kept, overwritten every checkpoint_interval(steps) applied steps. The models' own state
// (delayed-scaling histories, stochastic-rounding step counters) is not checkpointed: a run that
// goes back to a checkpoint goes on with it as it stands.
#pragma once

#include "gradient_exchange.hpp"
#include "optimizer.hpp"
#include "ranks.hpp"
#include "train.hpp"

#include <octet/octet.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

namespace train {

/// Applied steps between two checkpoints of a run of `steps` steps.
inline std::int64_t checkpoint_interval(int steps) {
    return std::max(1, steps / 10);
}

/// The optimizer's checkpoint file in `folder`: one per process under mpirun.
inline std::string checkpoint_path(const std::string& folder, const process_ranks* procs) {
    return folder + "/checkpoint" + (procs ? ".rank" + std::to_string(procs->rank()) : std::string()) + ".bin";
}

class checkpointer {
public:
    checkpointer(const std::string& folder, const process_ranks* procs, int steps, optimizer& opt,
                 gradient_exchange& exchange)
        : path_(checkpoint_path(folder, procs)),
          feedback_path_(path_ + ".feedback"),
          every_(checkpoint_interval(steps)),
          opt_(opt),
          exchange_(exchange) {}

    /// Whether the update of `step` is followed by a checkpoint.
    bool due_after(std::int64_t step) const { return (step + 1) % every_ == 0; }

    /// Writes the checkpoint of the state after `step` (-1: before the first).
    void save(std::int64_t step) {
        opt_.save(path_);
        if (exchange_.uses_codec()) {
            std::FILE* f = std::fopen(feedback_path_.c_str(), "wb");
            OCTET_REQUIRE(f != nullptr, "example_08_training", "--out",
                          "names a folder where the checkpoint's residual file cannot be written: " + feedback_path_);
            bool ok = true;
            for (const auto& v : exchange_.residual_views())
                ok = ok && std::fwrite(v.data, 1, v.bytes(), f) == v.bytes();
            ok = std::fclose(f) == 0 && ok;
            OCTET_REQUIRE(ok, "example_08_training", "--out", "could not write " + feedback_path_);
        }
        step_ = step;
    }

    /// Reads the last checkpoint back: the optimizer (its master weights, which compute reads) and
    /// the residuals. Returns the step it was written after.
    std::int64_t load() {
        opt_.load(path_);
        if (exchange_.uses_codec()) {
            std::FILE* f = std::fopen(feedback_path_.c_str(), "rb");
            OCTET_REQUIRE(f != nullptr, "example_08_training", "checkpoint", "has no residual file " + feedback_path_);
            bool ok = true;
            for (const auto& v : exchange_.residual_views())
                ok = ok && std::fread(v.data, 1, v.bytes(), f) == v.bytes();
            std::fclose(f);
            OCTET_REQUIRE(ok, "example_08_training", "checkpoint", "has a short residual file " + feedback_path_);
        }
        return step_;
    }

private:
    std::string path_, feedback_path_;
    std::int64_t every_;
    optimizer& opt_;
    gradient_exchange& exchange_;
    std::int64_t step_ = -1;
};

}  // namespace train
