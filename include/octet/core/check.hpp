// octet/core/check.hpp: argument checks that throw octet::error naming the argument and the fix.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

#include "octet/config.hpp"

namespace octet {
namespace detail {

[[noreturn]] inline void throw_argument_error(const char* function, const char* argument, const std::string& problem) {
    std::ostringstream os;
    os << function << ": argument '" << argument << "' " << problem;
    throw error(os.str());
}

/// Builds a message from streamable parts: detail::message("has ", n, " elements").
template <class... Parts>
std::string message(const Parts&... parts) {
    std::ostringstream os;
    (os << ... << parts);
    return os.str();
}

inline bool is_aligned(const void* p, std::size_t alignment) {
    return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

}  // namespace detail
}  // namespace octet

/// OCTET_REQUIRE(cond, "octet::f", "arg", "what is wrong and how to fix it")
#define OCTET_REQUIRE(cond, function, argument, ...)                                         \
    do {                                                                                     \
        if (!(cond)) ::octet::detail::throw_argument_error(function, argument, __VA_ARGS__); \
    } while (0)
