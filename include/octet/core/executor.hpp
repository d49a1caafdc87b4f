// octet/core/executor.hpp: where an operation runs.
//
//   octet::on_host()        host, all hardware threads
//   octet::on_host(1)       host, one thread (deterministic work split is the same either way)
//   octet::on_stream(s)     a CUDA stream (octet/cuda/executor.cuh)
//
// Every operation has one name for both executors; host overloads live in .hpp headers,
// stream overloads in .cuh headers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

namespace octet {

struct host_executor {
    int threads = 0;  ///< 0: std::thread::hardware_concurrency()

    int thread_count() const {
        if (threads > 0) return threads;
        const unsigned hw = std::thread::hardware_concurrency();
        return hw == 0 ? 1 : static_cast<int>(hw);
    }
};

inline host_executor on_host(int threads = 0) {
    return host_executor{threads};
}

/// Calls body(begin, end) over [0, n) split into contiguous chunks of at least `grain`
/// elements, on up to ex.thread_count() threads. The split never changes results: each
/// index is processed exactly once and by the same code. Exceptions propagate to the caller.
template <class Body>
void parallel_for(host_executor ex, std::size_t n, std::size_t grain, Body&& body) {
    if (n == 0) return;
    grain = std::max<std::size_t>(grain, 1);
    const std::size_t max_chunks = (n + grain - 1) / grain;
    const std::size_t workers = std::min<std::size_t>(static_cast<std::size_t>(ex.thread_count()), max_chunks);
    if (workers <= 1) {
        body(std::size_t{0}, n);
        return;
    }
    const std::size_t chunk = (n + workers - 1) / workers;
    std::vector<std::thread> pool;
    std::vector<std::exception_ptr> errors(workers);
    pool.reserve(workers - 1);
    for (std::size_t w = 1; w < workers; ++w) {
        pool.emplace_back([&, w] {
            try {
                const std::size_t b = w * chunk, e = std::min(n, b + chunk);
                if (b < e) body(b, e);
            } catch (...) {
                errors[w] = std::current_exception();
            }
        });
    }
    try {
        body(std::size_t{0}, std::min(n, chunk));
    } catch (...) {
        errors[0] = std::current_exception();
    }
    for (auto& t : pool) t.join();
    for (auto& e : errors)
        if (e) std::rethrow_exception(e);
}

}  // namespace octet
