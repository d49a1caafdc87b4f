// Conversions between float test data and the 16-bit storage types the library takes as input.
#pragma once

#include <type_traits>
#include <vector>

#include "octet/core/bits.hpp"

namespace octet_test {

/// x rounded (nearest-even) to In: float, octet::bf16 or octet::fp16.
template <class In>
std::vector<In> to_storage(const std::vector<float>& x) {
    std::vector<In> v(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        if constexpr (std::is_same_v<In, float>)
            v[i] = x[i];
        else if constexpr (std::is_same_v<In, octet::bf16>)
            v[i] = octet::to_bf16(x[i]);
        else
            v[i] = octet::to_fp16(x[i]);
    }
    return v;
}

/// The exact float values of stored data.
template <class In>
std::vector<float> widen(const std::vector<In>& v) {
    std::vector<float> x(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
        if constexpr (std::is_same_v<In, float>)
            x[i] = v[i];
        else
            x[i] = octet::to_float(v[i]);
    }
    return x;
}

}  // namespace octet_test
