// attention_rules.hpp: what the attention ops' CPU half (attention_ops.hpp, torch's headers) and
// CUDA half (attention_device.cuh, nvcc) share, free of torch: the recipes the operands are
// quantized with, and the backward telemetry vector built from an octet::attention_stats (on the
// host, or by a kernel on the device, from the same function).
#pragma once

#include <type_traits>

#include "octet/attention/attention.hpp"
#include "octet/attention/bf16_inputs.hpp"
#include "octet/config.hpp"

namespace octet_torch::attention {

/// The operand recipes: Q, K, dO per token and head; V per head ("per_head") or per token and head.
template <int D, bool PerTokenV>
struct recipes {
    using qk = typename octet::attention_input_recipes<D>::qk;
    using dout = typename octet::attention_input_recipes<D>::dout;
    using v = std::conditional_t<PerTokenV, qk, typename octet::attention_input_recipes<D>::v>;
};

/// Backward telemetry: octet::attention_stats as doubles, then its derived ratios, then the
/// residuals of dS as the dQ and dK products used it (octet.torch's BACKWARD_FIELDS).
inline constexpr int backward_telemetry_size = 19;

/// t[0 .. backward_telemetry_size) from st.
OCTET_HD void put_backward_telemetry(const octet::attention_stats& st, double* t) {
    t[0] = static_cast<double>(st.rows);
    t[1] = st.residual_max;
    t[2] = st.residual_rel_max;
    t[3] = st.gap_max;
    t[4] = st.gap_rel_max;
    t[5] = st.residual_sumsq;
    t[6] = st.abs_ds_sumsq;
    t[7] = st.gap_sumsq;
    t[8] = st.p_abs_dp_sumsq;
    t[9] = st.residual_rms();
    t[10] = st.gap_rms();
    t[11] = st.residual_rel();
    t[12] = st.gap_rel();
    t[13] = st.residual_dq_max;
    t[14] = st.residual_dq_sumsq;
    t[15] = st.residual_dk_max;
    t[16] = st.residual_dk_sumsq;
    t[17] = st.residual_dq_rel();
    t[18] = st.residual_dk_rel();
}

}  // namespace octet_torch::attention
