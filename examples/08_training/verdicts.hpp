// examples/08_training/verdicts.hpp: the sweep's verdicts. Each low-precision recipe against fp32
// on the same seeds, size and length: the held-out loss gap, mean over seeds, paired by seed, within
// the tolerance or not (see docs/training-report.md: it is the seed-to-seed spread of float32 itself
// at these lengths that sets what "the same" can mean). Runs without recovery are shown, not judged.
#pragma once

#include "recipes.hpp"
#include "train.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace train {

/// Sets sweep.tolerance_nats, tolerance_reason and verdicts, and clears sweep.passed where a judged
/// recipe is beyond the tolerance.
inline void judge(sweep_result& sweep, const std::vector<recipe_config>& recipes, float tolerance) {
    sweep.tolerance_nats = tolerance;
    {
        // float32's own seed-to-seed spread in this sweep: what "the same" can mean at these lengths.
        std::map<std::string, std::pair<double, double>> spread;  // size|steps -> (min, max) held-out loss
        for (const auto& r : sweep.runs)
            if (r.recipe == "fp32" && std::isfinite(r.final_heldout_loss)) {
                auto key = r.size + " " + std::to_string(r.steps) + " steps";
                auto it = spread.emplace(key, std::make_pair(r.final_heldout_loss, r.final_heldout_loss)).first;
                it->second.first = std::min(it->second.first, r.final_heldout_loss);
                it->second.second = std::max(it->second.second, r.final_heldout_loss);
            }
        std::ostringstream why;
        why << "mean over seeds of (held-out loss of the recipe - held-out loss of fp32 on the same seed), nats per "
               "character, must not exceed "
            << tolerance << "; for scale, float32's own held-out loss spans";
        for (const auto& [key, mm] : spread) why << " " << (mm.second - mm.first) << " over seeds (" << key << ");";
        why << " a gap below the tolerance but above that spread is a measured cost, not noise";
        sweep.tolerance_reason = why.str();
    }
    std::map<std::string, std::pair<double, int>> gaps;  // key: recipe|size|steps
    for (const auto& r : sweep.runs) {
        if (r.recipe == "fp32") continue;
        for (const auto& b : sweep.runs)
            if (b.recipe == "fp32" && b.size == r.size && b.steps == r.steps && b.seed == r.seed) {
                auto& g = gaps[r.recipe + "|" + r.size + "|" + std::to_string(r.steps)];
                g.first += r.final_heldout_loss - b.final_heldout_loss;
                g.second += 1;
            }
    }
    for (const auto& [key, g] : gaps) {
        const double mean = g.first / g.second;
        const std::string recipe = key.substr(0, key.find('|'));
        const bool within = std::isfinite(mean) && mean <= sweep.tolerance_nats;
        const auto rc =
            std::find_if(recipes.begin(), recipes.end(), [&](const recipe_config& c) { return c.name == recipe; });
        const bool judged = rc != recipes.end() && is_low_precision(*rc) && rc->recovery;
        char line[256];
        std::snprintf(line, sizeof line, "%s (%s): held-out gap to fp32 %+.4f nats/char over %d seeds: %s",
                      recipe.c_str(), key.substr(key.find('|') + 1).c_str(), mean, g.second,
                      !judged  ? "not judged (a comparison run)"
                      : within ? "within tolerance"
                               : "BEYOND tolerance");
        sweep.verdicts.push_back(line);
        if (judged && !within) sweep.passed = false;
    }
}

}  // namespace train
