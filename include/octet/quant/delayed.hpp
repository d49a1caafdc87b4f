// octet/quant/delayed.hpp: tensor-wide delayed scaling (an amax history ring).
//
// Per-tensor FP8 scaling needs the tensor's amax before it quantizes. Current scaling measures it
// (an extra pass); delayed scaling derives the scale from the amaxes of earlier steps instead:
//
//   step k:  quantize with tensor_amax = amax_for_scale(state)   (derived from steps < k)
//            record(state, amax of this step)                     (the quantizer returns it)
//   end k:   update(history, state, config)                       (push, reduce, ready for k+1)
//
// The state is plain data (delayed_scaling_state plus a float array of `history_length` entries) so
// that it can live in device memory: the stream quantizer records with an atomic max and a one-thread
// kernel updates it (delayed.cuh), with the same OCTET_HD rules as here. update() touches the
// history only when the tensor was actually quantized that step (record was called); a step
// without a quantize leaves history, position and scale amax unchanged. Before the first update
// amax_for_scale() is negative, which tells the quantizer to measure (current scaling for step 0).
//
// Reduction: amax_reduction::max (largest amax in the window) or most_recent. The margin scales the
// reduced amax by 2^margin_bits (headroom for growth between steps).
#pragma once

#include <cstdint>
#include <vector>

#include "octet/config.hpp"
#include "octet/core/bits.hpp"
#include "octet/core/check.hpp"

namespace octet {

enum class amax_reduction : int { max = 0, most_recent = 1 };

struct delayed_scaling_config {
    int history_length = 16;
    int margin_bits = 0;
    amax_reduction reduction = amax_reduction::max;
};

struct delayed_scaling_state {
    float step_amax = 0.0f;    ///< largest amax recorded since the last update
    int quantized = 0;         ///< 1 if record() was called since the last update
    float scale_amax = -1.0f;  ///< the amax the next quantize derives its scale from (< 0: measure)
    int position = 0;          ///< next history slot
    int recorded = 0;          ///< valid history entries (<= history_length)
};

/// What the next quantize should derive its tensor scale from (negative: measure it). A history of
/// all-zero steps gives nothing to derive a scale from (the host quantizer refuses a zero amax for
/// non-zero data), so it measures too.
OCTET_HD float amax_for_scale(const delayed_scaling_state& s) {
    return s.recorded > 0 && s.scale_amax > 0.0f ? s.scale_amax : -1.0f;
}

/// Records a quantize's amax (host; the device records with an atomic max on the float bits).
OCTET_HD void record(delayed_scaling_state& s, float amax) {
    s.step_amax = amax > s.step_amax ? amax : s.step_amax;
    s.quantized = 1;
}

/// End of step: push the step's amax if the tensor was quantized, then reduce the window.
OCTET_HD void update(float* history, delayed_scaling_state& s, const delayed_scaling_config& c) {
    if (!s.quantized) return;
    history[s.position] = s.step_amax;
    s.position = (s.position + 1) % c.history_length;
    s.recorded = s.recorded < c.history_length ? s.recorded + 1 : c.history_length;
    float reduced = 0.0f;
    if (c.reduction == amax_reduction::most_recent) {
        reduced = history[(s.position + c.history_length - 1) % c.history_length];
    } else {
        for (int k = 0; k < s.recorded; ++k) reduced = history[k] > reduced ? history[k] : reduced;
    }
    const float margin = exp2i_normal(c.margin_bits);
    s.scale_amax = reduced * margin;
    s.step_amax = 0.0f;
    s.quantized = 0;
}

/// Host-resident delayed scaling for one tensor.
class delayed_scaling {
public:
    explicit delayed_scaling(delayed_scaling_config c = {}) : config_(c), history_(check(c)) {}
    float amax_for_scale() const { return octet::amax_for_scale(state_); }
    void record(float amax) { octet::record(state_, amax); }
    void update() { octet::update(history_.data(), state_, config_); }
    const delayed_scaling_state& state() const { return state_; }
    const std::vector<float>& history() const { return history_; }
    const delayed_scaling_config& config() const { return config_; }

private:
    static std::size_t check(const delayed_scaling_config& c) {
        OCTET_REQUIRE(c.history_length >= 1 && c.history_length <= (1 << 20), "octet::delayed_scaling",
                      "config.history_length", detail::message("is ", c.history_length, "; use a length in [1, 2^20]"));
        OCTET_REQUIRE(c.margin_bits >= 0 && c.margin_bits <= 32, "octet::delayed_scaling", "config.margin_bits",
                      detail::message("is ", c.margin_bits, "; use a margin in [0, 32] bits"));
        return static_cast<std::size_t>(c.history_length);
    }
    delayed_scaling_config config_;
    std::vector<float> history_;
    delayed_scaling_state state_;
};

}  // namespace octet
