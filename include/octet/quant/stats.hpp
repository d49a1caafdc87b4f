// octet/quant/stats.hpp: statistics gathered in the same pass as quantization.
//
//   amax             largest |x| over finite inputs (exact)
//   elements         inputs seen
//   saturated        finite inputs whose scaled magnitude |x / S| lies beyond max_finite by at
//                    least half its ulp (clamped by overflow::saturate; see beyond_max_finite)
//   flushed_to_zero  finite non-zero inputs whose code decodes to zero
//   non_finite       Inf and NaN inputs
//   lost_to_nan      finite inputs in a block whose scale is NaN (nan_policy::propagate, the
//                    default: the block held a NaN or an Inf): they dequantize to NaN and take no
//                    part in the energies below
//   signal_energy    sum of x^2 over finite inputs; noise_energy: sum of (x - dequantized)^2
//   sqnr_db()        10 log10(signal / noise): the signal-to-quantization-noise ratio
//
// Counts and amax are exact and identical on host and device. The two energies are sums in
// double whose order differs between host threads and device blocks: they agree to rounding.
// The struct is plain data so that a device quantizer can accumulate into it with atomics.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace octet {

struct quant_stats {
    float amax = 0.0f;
    std::uint32_t reserved = 0;
    unsigned long long elements = 0;
    unsigned long long saturated = 0;
    unsigned long long flushed_to_zero = 0;
    unsigned long long non_finite = 0;
    unsigned long long lost_to_nan = 0;
    double signal_energy = 0.0;
    double noise_energy = 0.0;

    /// Signal-to-quantization-noise ratio in dB; +Inf when the quantization was exact.
    double sqnr_db() const {
        if (noise_energy == 0.0) return std::numeric_limits<double>::infinity();
        return 10.0 * std::log10(signal_energy / noise_energy);
    }
    double saturated_fraction() const { return elements ? static_cast<double>(saturated) / elements : 0.0; }
    double flushed_fraction() const { return elements ? static_cast<double>(flushed_to_zero) / elements : 0.0; }

    void merge(const quant_stats& o) {
        amax = o.amax > amax ? o.amax : amax;
        elements += o.elements;
        saturated += o.saturated;
        flushed_to_zero += o.flushed_to_zero;
        non_finite += o.non_finite;
        lost_to_nan += o.lost_to_nan;
        signal_energy += o.signal_energy;
        noise_energy += o.noise_energy;
    }
};

}  // namespace octet
