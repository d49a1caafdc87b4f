// octet/core/executor.hpp: where an operation runs.
//
//   octet::on_host()        host, all hardware threads (started and joined by each call)
//   octet::on_host(1)       host, one thread (deterministic work split is the same either way)
//   octet::on_host(pool)    host, the caller's octet::thread_pool (no thread started per call)
//   octet::on_stream(s)     a CUDA stream (octet/cuda/executor.cuh)
//   octet::with_allocator(on_host(...), a)   the same, with the caller's host allocator lent: every
//                           temporary a host operation needs comes from `a` (host_allocator, below)
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
#include <new>
#include <thread>
#include <vector>

#include "octet/core/check.hpp"

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

/// A host allocator lent to octet by the caller (a framework's CPU allocator, an arena):
///   allocate(context, bytes): memory at least 64-byte aligned, bytes > 0. Returns null (or throws)
///     when it cannot; octet then throws octet::error naming the operation and the bytes.
///   deallocate(context, p, bytes): gives back `p` (from allocate, same bytes).
/// octet calls both only from the thread that called the operation (never from a pool's worker), and
/// gives back everything it took before the operation returns (or throws). Both null: nothing lent;
/// then octet's temporaries come from ::operator new (64-byte aligned). The bytes an operation takes
/// are at most what its ..._scratch_bytes(ex, ...) query returns for the same executor and shapes.
struct host_allocator {
    void* context = nullptr;
    void* (*allocate)(void* context, std::size_t bytes) = nullptr;
    void (*deallocate)(void* context, void* p, std::size_t bytes) = nullptr;
};

struct host_executor {
    int threads = 0;              ///< 0: std::thread::hardware_concurrency() (ignored with a pool)
    thread_pool* pool = nullptr;  ///< the caller's pool, or null: threads are started per call
    host_allocator allocator{};   ///< optional (octet::with_allocator); default: ::operator new

    int thread_count() const {
        if (pool) return pool->size();
        if (threads > 0) return threads;
        const unsigned hw = std::thread::hardware_concurrency();
        return hw == 0 ? 1 : static_cast<int>(hw);
    }
};

inline host_executor on_host(int threads = 0) {
    return host_executor{threads, nullptr, {}};
}

/// Host work on the caller's pool: no thread is started or joined per call.
inline host_executor on_host(thread_pool& pool) {
    return host_executor{0, &pool, {}};
}

/// `ex` with the caller's host allocator lent: every temporary of a host operation called with the
/// returned executor comes from `a` (see host_allocator for the contract). With a pool as well
/// (on_host(pool)), an operation neither allocates nor starts a thread behind the caller's back.
inline host_executor with_allocator(host_executor ex, host_allocator a) {
    OCTET_REQUIRE(a.allocate != nullptr && a.deallocate != nullptr, "octet::with_allocator", "allocator",
                  "needs both allocate and deallocate (leave both null for octet's default, ::operator new)");
    ex.allocator = a;
    return ex;
}

namespace detail {

/// Sizes and hands out the typed arrays of one block of scratch, each 64-byte aligned. An operation
/// describes its scratch once, as a function of a carver: run on a carver without a base it counts
/// the bytes (the ..._scratch_bytes query); run on one with a base it returns the arrays. One
/// description serves both, so the query and the operation cannot disagree.
class scratch_carver {
public:
    scratch_carver() = default;
    explicit scratch_carver(unsigned char* base) : base_(base) {}
    template <class T>
    T* take(std::size_t count) {
        offset_ = (offset_ + 63) & ~std::size_t{63};
        T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + offset_);
        offset_ += count * sizeof(T);
        return p;
    }
    std::size_t bytes() const { return offset_; }

private:
    unsigned char* base_ = nullptr;
    std::size_t offset_ = 0;
};

/// One block of host scratch for the length of an operation: from the executor's allocator when one
/// is lent, else ::operator new. Given back in the destructor (also when the operation throws).
class host_scratch {
public:
    host_scratch(const host_executor& ex, std::size_t bytes, const char* fn) : allocator_(ex.allocator), bytes_(bytes) {
        if (bytes_ == 0) return;
        if (allocator_.allocate != nullptr) {
            base_ = static_cast<unsigned char*>(allocator_.allocate(allocator_.context, bytes_));
            OCTET_REQUIRE(base_ != nullptr, fn, "executor's allocator",
                          message("returned null for ", bytes_, " bytes of scratch; lend an allocator that can serve ",
                                  "the operation's ..._scratch_bytes(ex, ...)"));
        } else {
            base_ = static_cast<unsigned char*>(::operator new (bytes_, std::align_val_t{64}));
        }
    }
    ~host_scratch() {
        if (base_ == nullptr) return;
        if (allocator_.deallocate != nullptr)
            allocator_.deallocate(allocator_.context, base_, bytes_);
        else
            ::operator delete (base_, std::align_val_t{64});
    }
    host_scratch(const host_scratch&) = delete;
    host_scratch& operator=(const host_scratch&) = delete;
    scratch_carver carver() const { return scratch_carver(base_); }

private:
    host_allocator allocator_;
    std::size_t bytes_;
    unsigned char* base_ = nullptr;
};

/// The number of chunks parallel_for(ex, n, grain, ...) splits [0, n) into: per-chunk scratch is
/// sized by it (a body run as chunk w uses slot w).
inline std::size_t parallel_chunks(const host_executor& ex, std::size_t n, std::size_t grain) {
    if (n == 0) return 0;
    grain = std::max<std::size_t>(grain, 1);
    return std::min<std::size_t>(static_cast<std::size_t>(ex.thread_count()), (n + grain - 1) / grain);
}

}  // namespace detail

/// Calls body(chunk, begin, end) over [0, n) split into contiguous chunks of at least `grain`
/// elements, chunk in [0, detail::parallel_chunks(ex, n, grain)), on up to ex.thread_count() threads;
/// no two calls at once share a chunk index, so a body may use per-chunk scratch slot `chunk` (sized
/// without regard to the chunk's length: a busy pool runs all of [0, n) as chunk 0). The split never
/// changes results: each index is processed exactly once and by the same code. Exceptions propagate
/// to the caller. With a pool (on_host(pool)) nothing is allocated; without one, threads are started.
template <class Body>
void parallel_for_chunks(const host_executor& ex, std::size_t n, std::size_t grain, Body&& body) {
    const std::size_t workers = detail::parallel_chunks(ex, n, grain);
    if (workers == 0) return;
    if (workers == 1) {
        body(std::size_t{0}, std::size_t{0}, n);
        return;
    }
    const std::size_t chunk = (n + workers - 1) / workers;
    if (ex.pool) {
        auto task = [&](std::size_t w) {
            const std::size_t b = w * chunk, e = std::min(n, b + chunk);
            if (b < e) body(w, b, e);
        };
        if (ex.pool->try_run(workers, task)) return;
        body(std::size_t{0}, std::size_t{0}, n);  // the pool is busy (a nested or concurrent operation): same results
        return;
    }
    std::vector<std::thread> pool;
    std::vector<std::exception_ptr> errors(workers);
    pool.reserve(workers - 1);
    for (std::size_t w = 1; w < workers; ++w) {
        pool.emplace_back([&, w] {
            try {
                const std::size_t b = w * chunk, e = std::min(n, b + chunk);
                if (b < e) body(w, b, e);
            } catch (...) {
                errors[w] = std::current_exception();
            }
        });
    }
    try {
        body(std::size_t{0}, std::size_t{0}, std::min(n, chunk));
    } catch (...) {
        errors[0] = std::current_exception();
    }
    for (auto& t : pool) t.join();
    for (auto& e : errors)
        if (e) std::rethrow_exception(e);
}

/// parallel_for_chunks for a body that needs no per-chunk scratch: body(begin, end).
template <class Body>
void parallel_for(const host_executor& ex, std::size_t n, std::size_t grain, Body&& body) {
    parallel_for_chunks(ex, n, grain, [&](std::size_t, std::size_t b, std::size_t e) { body(b, e); });
}

}  // namespace octet
