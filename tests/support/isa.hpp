// Helpers for the tests that run every instruction-set variant of the host loops
// (core/isa_dispatch.hpp): which variants this CPU runs, their names, hex for messages.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "octet/core/isa_dispatch.hpp"

namespace octet_test {

inline std::string hex(std::uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%X", v);
    return buf;
}

inline const char* isa_name(octet::detail::simd_isa isa) {
    using octet::detail::simd_isa;
    return isa == simd_isa::avx512 ? "avx512" : isa == simd_isa::avx2 ? "avx2" : "portable";
}

/// The variants this build compiled and this CPU runs.
inline std::vector<octet::detail::simd_isa> runnable_isas() {
    using octet::detail::simd_isa;
    std::vector<simd_isa> v;
    for (simd_isa isa : {simd_isa::portable, simd_isa::avx2, simd_isa::avx512})
        if (octet::detail::isa_supported(isa)) v.push_back(isa);
    return v;
}

}  // namespace octet_test
