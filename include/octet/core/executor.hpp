// octet/core/executor.hpp: where an operation runs.
//
//   octet::on_host()        host, all hardware threads (started and joined by each call)
//   octet::on_host(1)       host, one thread (deterministic work split is the same either way)
//   octet::on_host(pool)    host, the caller's octet::thread_pool (no thread started per call)
//   octet::on_stream(s)     a CUDA stream (octet/cuda/executor.cuh)
//
// Every operation has one name for both executors; the host's implementation lives in a .hpp
// header, the stream's in the .cuh beside it (quantize and dequantize: one entry in the .hpp that
// dispatches to the executor's half, detail::quant_backend; the others: an overload per executor).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace octet {

/// A fixed set of worker threads that a caller owns and lends to host operations through
/// `on_host(pool)`, so that an operation does not start and join threads on every call (what a
/// framework's training loop wants). The workers start in the constructor and are joined in the
/// destructor; nothing else allocates or starts threads. One operation uses the pool at a time: a
/// second caller (another thread, or an operation nested inside a running one) does not wait for
/// it but runs its own work on its calling thread, which gives the same results (the work split
/// never changes them) and cannot deadlock.
class thread_pool {
public:
    /// `threads` is the parallelism of an operation: the calling thread plus threads - 1 workers.
    explicit thread_pool(int threads) : threads_(threads < 1 ? 1 : threads) {
        workers_.reserve(static_cast<std::size_t>(threads_ - 1));
        try {
            for (int w = 1; w < threads_; ++w) workers_.emplace_back([this] { work(); });
        } catch (...) {  // a thread could not be started: stop those that were
            stop();
            throw;
        }
    }
    ~thread_pool() { stop(); }
    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;

    int size() const { return threads_; }

    /// Runs task(i) for every i in [0, count) on the calling thread and the workers, and returns
    /// when all have finished; the first exception a task throws is rethrown here. Returns false
    /// (having run nothing) when the pool is busy with another operation.
    template <class Task>
    bool try_run(std::size_t count, Task& task) {
        std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
        if (!busy.owns_lock()) return false;
        job current{&invoke<Task>, &task, count};
        {
            std::lock_guard<std::mutex> lock(m_);
            job_ = current;
            next_.store(0);
            pending_ = count;
            error_ = nullptr;
            ++generation_;
        }
        wake_.notify_all();
        drain(current);
        std::unique_lock<std::mutex> lock(m_);
        // Every worker that joined this job has left it before the job (and task) goes away.
        done_.wait(lock, [this] { return pending_ == 0 && active_ == 0; });
        job_ = job{};
        if (error_) std::rethrow_exception(error_);
        return true;
    }

private:
    struct job {
        void (*run)(void*, std::size_t) = nullptr;
        void* task = nullptr;
        std::size_t count = 0;
    };

    void stop() {
        {
            std::lock_guard<std::mutex> lock(m_);
            stop_ = true;
        }
        wake_.notify_all();
        for (auto& t : workers_) t.join();
    }

    template <class Task>
    static void invoke(void* task, std::size_t i) {
        (*static_cast<Task*>(task))(i);
    }

    // Takes task indices of job j until none is left; records the first exception.
    void drain(const job& j) {
        for (;;) {
            const std::size_t i = next_.fetch_add(1);
            if (i >= j.count) return;
            std::exception_ptr err;
            try {
                j.run(j.task, i);
            } catch (...) {
                err = std::current_exception();
            }
            std::lock_guard<std::mutex> lock(m_);
            if (err && !error_) error_ = err;
            if (--pending_ == 0) done_.notify_all();
        }
    }

    void work() {
        unsigned long long seen = 0;
        for (;;) {
            job j;
            {
                std::unique_lock<std::mutex> lock(m_);
                wake_.wait(lock, [&] { return stop_ || (generation_ != seen && job_.run != nullptr); });
                if (stop_) return;
                seen = generation_;
                j = job_;
                ++active_;
            }
            drain(j);
            std::lock_guard<std::mutex> lock(m_);
            if (--active_ == 0) done_.notify_all();
        }
    }

    int threads_;
    std::vector<std::thread> workers_;
    std::mutex busy_;  // held by the operation using the pool
    std::mutex m_;     // guards the job fields below
    std::condition_variable wake_, done_;
    job job_;                           // the running job (run == nullptr: none)
    std::atomic<std::size_t> next_{0};  // the next task index to take
    std::size_t pending_ = 0;           // tasks not yet finished
    int active_ = 0;                    // workers inside the running job
    std::exception_ptr error_;
    unsigned long long generation_ = 0;
    bool stop_ = false;
};

struct host_executor {
    int threads = 0;              ///< 0: std::thread::hardware_concurrency() (ignored with a pool)
    thread_pool* pool = nullptr;  ///< the caller's pool, or null: threads are started per call

    int thread_count() const {
        if (pool) return pool->size();
        if (threads > 0) return threads;
        const unsigned hw = std::thread::hardware_concurrency();
        return hw == 0 ? 1 : static_cast<int>(hw);
    }
};

inline host_executor on_host(int threads = 0) {
    return host_executor{threads, nullptr};
}

/// Host work on the caller's pool: no thread is started or joined per call.
inline host_executor on_host(thread_pool& pool) {
    return host_executor{0, &pool};
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
    if (ex.pool) {
        auto task = [&](std::size_t w) {
            const std::size_t b = w * chunk, e = std::min(n, b + chunk);
            if (b < e) body(b, e);
        };
        if (ex.pool->try_run(workers, task)) return;
        body(std::size_t{0}, n);  // the pool is busy (a nested or concurrent operation): same results
        return;
    }
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
