// The tests' harness around octet/comm/in_process.hpp (ranks that are threads of one process):
// on_every_rank runs a call on every rank with a watchdog, so that a rank left waiting in a
// collective fails the test instead of hanging it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "octet/comm/in_process.hpp"
#include "octet/config.hpp"

namespace octet_test {

using octet::in_process_transport;
using octet::in_process_world;
using thread_barrier = octet::detail::reusable_barrier;

/// What a rank's exception says: an octet::error's message, or what else it was.
inline std::string text_of(const std::exception_ptr& e) {
    try {
        std::rethrow_exception(e);
    } catch (const octet::error& x) {
        return x.what();
    } catch (const std::exception& x) {
        return std::string("not an octet::error: ") + x.what();
    } catch (...) {
        return "not an exception";
    }
}

/// Whether a rank ended with an octet::error.
inline bool is_octet_error(const std::exception_ptr& e) {
    if (!e) return false;
    try {
        std::rethrow_exception(e);
    } catch (const octet::error&) {
        return true;
    } catch (...) {
        return false;
    }
}

/// Runs fn(rank) on one thread per rank; a rank's exception is kept in errors[rank]. The threads
/// start before `before()` and are joined after `after()` (a window around the whole multi-rank
/// call, for counting allocations). A call that does not finish within a minute (a rank left
/// waiting in a collective) ends the program with a message instead of hanging.
template <class Fn>
void on_every_rank(int ranks, Fn&& fn, std::vector<std::exception_ptr>& errors,
                   const std::function<void()>& before = {}, const std::function<void()>& after = {}) {
    errors.assign(static_cast<std::size_t>(ranks), nullptr);
    thread_barrier start(ranks + 1);
    std::mutex m;
    std::condition_variable cv;
    int finished = 0;
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r)
        threads.emplace_back([&, r] {
            start.arrive_and_wait();
            try {
                fn(r);
            } catch (...) {
                errors[r] = std::current_exception();
            }
            std::lock_guard<std::mutex> lock(m);
            ++finished;
            cv.notify_all();
        });
    if (before) before();
    start.arrive_and_wait();
    {
        std::unique_lock<std::mutex> lock(m);
        if (!cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished == ranks; })) {
            std::fprintf(stderr,
                         "in_process_world: %d of %d ranks still inside the call after 60 s (a rank left "
                         "waiting in a collective)\n",
                         ranks - finished, ranks);
            std::fflush(stderr);
            std::_Exit(3);
        }
    }
    if (after) after();
    for (auto& t : threads) t.join();
}

/// Runs fn(rank, transport) on every rank of a fresh world of P ranks (on_every_rank: one thread
/// each, the watchdog, before/after around the call); returns each rank's exception.
template <class Fn>
std::vector<std::exception_ptr> on_world(int P, Fn&& fn, const std::function<void()>& before = {},
                                         const std::function<void()>& after = {}) {
    in_process_world w(P);
    std::vector<in_process_transport> ts;
    for (int r = 0; r < P; ++r) ts.emplace_back(w, r);
    std::vector<std::exception_ptr> errors;
    on_every_rank(
        P, [&](int r) { fn(r, ts[r]); }, errors, before, after);
    return errors;
}

/// The same, rethrowing the first rank's exception.
template <class Fn>
void on_world_or_throw(int P, Fn&& fn) {
    for (auto& e : on_world(P, std::forward<Fn>(fn)))
        if (e) std::rethrow_exception(e);
}

}  // namespace octet_test
