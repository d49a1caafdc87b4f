// octet/reference/adamw.hpp: AdamW in float64, the oracle for octet's fused step
// (octet/optim/adamw.hpp). Textbook order, PyTorch's semantics (decoupled weight decay):
//     w *= 1 - lr wd
//     m  = b1 m + (1 - b1) g                 v = b2 v + (1 - b2) g^2
//     w -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// No compression, no rounding beyond float64's. Pass the same (float) hyperparameters the
// optimizer uses, widened, so that the comparison measures the step and not the inputs.
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "octet/core/check.hpp"
#include "octet/core/span.hpp"

namespace octet {
namespace reference {

struct adamw_hyper {
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

/// One step (t counts from 1) over w, m, v in place.
inline void adamw_step(span<double> w, span<double> m, span<double> v, span<const double> g, const adamw_hyper& h,
                       std::uint64_t t, double lr) {
    OCTET_REQUIRE(m.size() == w.size() && v.size() == w.size() && g.size() == w.size(), "octet::reference::adamw_step",
                  "m/v/g", "must have one element per weight");
    OCTET_REQUIRE(t >= 1, "octet::reference::adamw_step", "t", "is 0; steps count from 1");
    const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(t));
    for (std::size_t i = 0; i < w.size(); ++i) {
        w[i] *= 1.0 - lr * h.weight_decay;
        m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * g[i];
        v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * g[i] * g[i];
        w[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + h.eps);
    }
}

/// Owning float64 state, for tests and benches.
struct adamw_state {
    explicit adamw_state(std::vector<double> weights) : w(std::move(weights)), m(w.size(), 0.0), v(w.size(), 0.0) {}
    void step(span<const double> g, const adamw_hyper& h, double lr) {
        adamw_step(as_span(w), as_span(m), as_span(v), g, h, ++t, lr);
    }
    std::vector<double> w, m, v;
    std::uint64_t t = 0;
};

}  // namespace reference
}  // namespace octet
