// examples/08_training/step_checks.hpp: what one step measured, and the monitors measured on each
// step's reduced gradient BEFORE its update is applied (the recovery policy acts on their trips):
//   gradients.non_finite           any non-finite entry;
//   gradients.norm_spike           the norm against the median of the last 20 applied steps: 100x is
//                                  a fault, not training dynamics (the injected corruption measures
//                                  about 1e4-3e4x; a mixture of experts leaving its first plateau
//                                  measured 25-45x, in float32 as in FP8, and trains through it; the
//                                  recovery log prints each trip's value); warn at 5x;
//   linear.saturation_rate         of the FP8 linears' quantized elements, the clamped: delayed
//                                  scaling clamps when a tensor outgrows its amax history; 1% trips;
//   attention.row_sum_residual     watched, not acted on: the ablation runs from_output on purpose
//                                  to show what a stale delta does.
#pragma once

#include "train.hpp"

#include <octet/octet.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace train {

/// One step's numbers, summed over the ranks in rank order.
struct step_numbers {
    double loss = 0, norm = 0;  ///< mean loss over the ranks; the reduced gradient's L2 norm
    std::uint64_t quantized = 0, saturated = 0, underflow = 0;
    std::vector<double> residual, residual_q;  ///< per layer: the attention row-sum residuals
    /// Mixture of experts, summed over the ranks: [MoE block * experts + e] assignments, the
    /// assignments dropped, L_aux summed over the blocks (mean over the ranks), and the bytes
    /// dispatching the rows moves as FP8 and as bf16.
    std::vector<double> expert_tokens;
    double moe_dropped = 0, moe_aux_loss = 0, dispatch_fp8_bytes = 0, dispatch_bf16_bytes = 0;
};

inline double median_of(std::vector<double> v) {
    if (v.empty()) return 0;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
}

class step_checks {
public:
    step_checks()
        : non_finite_(checks_.add("gradients.non_finite", octet::check_kind::non_finite, "backward")),
          spike_(checks_.add("gradients.norm_spike", octet::check_kind::custom, octet::threshold::above(5.0, 100.0),
                             "backward")),
          saturation_(checks_.add("linear.saturation_rate", octet::check_kind::saturation_rate,
                                  octet::threshold::above(1e-3, 1e-2), "linear")),
          residual_(checks_.add("attention.row_sum_residual", octet::check_kind::custom,
                                octet::threshold::above(1e-3, std::numeric_limits<double>::infinity()), "attention")) {}

    /// Measures every check on step `step`'s numbers and its reduced gradient (float or bf16).
    template <class G>
    void measure(std::int64_t step, const step_numbers& s, octet::span<G> gradient) {
        checks_.measure(non_finite_, step, [&] {
            std::size_t bad = 0;
            for (std::size_t i = 0; i < gradient.size(); ++i) {
                if constexpr (std::is_same_v<std::remove_const_t<G>, float>)
                    bad += !std::isfinite(gradient[i]);
                else
                    bad += !std::isfinite(octet::to_float(gradient[i]));
            }
            return static_cast<double>(bad);
        });
        checks_.measure(spike_, step, [&] {
            if (clean_norms_.size() < 20) return 1.0;
            const std::vector<double> last(clean_norms_.end() - 20, clean_norms_.end());
            return s.norm / std::max(median_of(last), 1e-30);
        });
        checks_.measure(saturation_, step, [&] {
            return s.quantized ? static_cast<double>(s.saturated) / static_cast<double>(s.quantized) : 0.0;
        });
        checks_.measure(residual_, step, [&] {
            double m = 0;
            for (double v : s.residual) m = std::max(m, v);
            return m;
        });
    }

    /// An update was applied with a gradient of this norm (the spike check's history).
    void applied(double norm) {
        if (std::isfinite(norm)) clean_norms_.push_back(norm);
    }

    const octet::check_registry& registry() const { return checks_; }
    double cost_seconds() const { return checks_.cost_seconds(); }

private:
    octet::check_registry checks_;
    octet::check_registry::check_id non_finite_, spike_, saturation_, residual_;
    std::vector<double> clean_norms_;
};

}  // namespace train
