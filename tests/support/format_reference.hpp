// The float64 brute-force format oracle lives in the library (octet/reference/format.hpp) so that
// users can check results too; tests use it under the names below.
#pragma once

#include "octet/reference/format.hpp"

namespace octet_test {
using octet::reference::code_kind;
using ref_kind = octet::reference::code_kind;
template <class Fmt>
auto reference_decode(std::uint32_t code) {
    return octet::reference::decode_code<Fmt>(code);
}
template <class Fmt>
using reference_table = octet::reference::format_table<Fmt>;
template <class Fmt>
auto reference_neighbours(double m) {
    return octet::reference::neighbours<Fmt>(m);
}
template <class Fmt, class Round, class Overflow>
std::uint32_t reference_encode(float x, std::uint32_t random_bits = 0) {
    return octet::reference::encode_code<Fmt, Round, Overflow>(x, random_bits);
}
}  // namespace octet_test
