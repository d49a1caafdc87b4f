// octet/optim/master_weights.hpp: how the optimizer stores the weights it updates.
//
//   octet::master::fp32             float weights (4 B/parameter)
//   octet::master::bf16_nearest     bf16 weights, round to nearest (2 B). Shown for contrast: an
//                                   update smaller than half a bf16 ulp of the weight is lost,
//                                   every step, so small learning rates stall. Do not train with it.
//   octet::master::bf16_stochastic  bf16 weights, stochastic rounding with Philox bits indexed by
//                                   (seed, step, element): unbiased, so small updates survive in
//                                   expectation; reproducible on host and device (2 B).
//   octet::master::bf16_kahan       bf16 weights plus a bf16 compensation buffer that holds what
//                                   rounding dropped (2 + 2 B): the weight is w + c.
//
// Each policy is a type with OCTET_OPTIM_HD load(w, c) -> float (the value the update starts from) and
// store(target, w, c, random_bits) (writes the new weight, and compensation where there is one).
//
// Numerics:
//   * bf16_nearest: w' = bf16_rn(target). |target - w| < ulp(w)/2 leaves w unchanged.
//   * bf16_stochastic: w' = bf16_sr(target, bits): rounds up with probability equal to the
//     dropped fraction of an ulp (octet::to_bf16_stochastic), E[w'] = target.
//   * bf16_kahan: the target is computed from w + c; then w' = bf16_rn(target),
//     c' = bf16_rn(target - w') (the subtraction is exact). The pair carries about 16 significant
//     bits: updates down to about 2^-16 |w| accumulate; smaller ones are rounded away inside c
//     (use fp32 master weights for those). w alone is what a bf16 forward pass reads.
#pragma once

#include <cstdint>
#include <type_traits>

#include "octet/config.hpp"
#include "octet/core/bits.hpp"
#include "octet/optim/detail/float_ops.hpp"

namespace octet {

/// Stable numeric ids (checkpoints, memory ledger).
enum class master_weights_id : std::uint32_t { fp32 = 1, bf16_nearest = 2, bf16_stochastic = 3, bf16_kahan = 4 };

inline const char* master_weights_name(master_weights_id id) {
    switch (id) {
        case master_weights_id::fp32:
            return "fp32";
        case master_weights_id::bf16_nearest:
            return "bf16_nearest";
        case master_weights_id::bf16_stochastic:
            return "bf16_stochastic";
        case master_weights_id::bf16_kahan:
            return "bf16_kahan";
    }
    return "unknown";
}

/// Placeholder element type of the compensation buffer of policies that have none.
struct no_compensation {};

namespace master {

struct fp32 {
    using weight_type = float;
    using comp_type = no_compensation;
    static constexpr bool has_compensation = false;
    static constexpr bool uses_random_bits = false;
    static constexpr master_weights_id id = master_weights_id::fp32;
    OCTET_OPTIM_HD static float load(weight_type w, comp_type) { return w; }
    OCTET_OPTIM_HD static void store(float target, weight_type& w, comp_type&, std::uint32_t) { w = target; }
};

struct bf16_nearest {
    using weight_type = ::octet::bf16;
    using comp_type = no_compensation;
    static constexpr bool has_compensation = false;
    static constexpr bool uses_random_bits = false;
    static constexpr master_weights_id id = master_weights_id::bf16_nearest;
    OCTET_OPTIM_HD static float load(weight_type w, comp_type) { return to_float(w); }
    OCTET_OPTIM_HD static void store(float target, weight_type& w, comp_type&, std::uint32_t) { w = to_bf16(target); }
};

struct bf16_stochastic {
    using weight_type = ::octet::bf16;
    using comp_type = no_compensation;
    static constexpr bool has_compensation = false;
    static constexpr bool uses_random_bits = true;
    static constexpr master_weights_id id = master_weights_id::bf16_stochastic;
    OCTET_OPTIM_HD static float load(weight_type w, comp_type) { return to_float(w); }
    OCTET_OPTIM_HD static void store(float target, weight_type& w, comp_type&, std::uint32_t bits) {
        w = to_bf16_stochastic(target, bits);
    }
};

struct bf16_kahan {
    using weight_type = ::octet::bf16;
    using comp_type = ::octet::bf16;
    static constexpr bool has_compensation = true;
    static constexpr bool uses_random_bits = false;
    static constexpr master_weights_id id = master_weights_id::bf16_kahan;
    OCTET_OPTIM_HD static float load(weight_type w, comp_type c) {
        return optim_detail::add_rn(to_float(w), to_float(c));
    }
    OCTET_OPTIM_HD static void store(float target, weight_type& w, comp_type& c, std::uint32_t) {
        const ::octet::bf16 hi = to_bf16(target);
        c = to_bf16(optim_detail::sub_rn(target, to_float(hi)));
        w = hi;
    }
};

}  // namespace master

/// Trait: is M one of the master-weight policies?
template <class M>
inline constexpr bool is_master_weights_v =
    std::is_same_v<M, master::fp32> || std::is_same_v<M, master::bf16_nearest> ||
    std::is_same_v<M, master::bf16_stochastic> || std::is_same_v<M, master::bf16_kahan>;

/// Bytes per parameter of the stored weights (what the forward pass can read) and of the
/// compensation buffer (optimizer state).
inline double master_weight_bytes(master_weights_id id) {
    return id == master_weights_id::fp32 ? 4.0 : 2.0;
}
inline double master_compensation_bytes(master_weights_id id) {
    return id == master_weights_id::bf16_kahan ? 2.0 : 0.0;
}

}  // namespace octet
