// tests/support/counted_ranks.hpp: on_world (support/in_process_world.hpp) with the global
// allocations the ranks make counted (support/counting_allocator.hpp), for the host collectives'
// "no allocation outside the lent allocator" checks.
#pragma once

#include <exception>
#include <functional>
#include <optional>
#include <vector>

#include "support/counting_allocator.hpp"
#include "support/in_process_world.hpp"

namespace octet_test {

/// Runs fn(rank, transport) on every rank of a fresh world of P ranks; counted (if given) receives
/// the global allocations made while the ranks ran. Returns each rank's exception.
template <class Fn>
std::vector<std::exception_ptr> run_ranks(int P, Fn&& fn, long* counted = nullptr) {
    std::optional<global_allocations> guard;
    std::function<void()> before, after;
    if (counted) {
        before = [&] { guard.emplace(); };
        after = [&] {
            *counted = guard->count();
            guard.reset();
        };
    }
    return on_world(P, std::forward<Fn>(fn), before, after);
}

}  // namespace octet_test
