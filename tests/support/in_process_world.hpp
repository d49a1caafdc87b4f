// An in-process world for the collectives of octet/comm/: each rank is a thread of one process and
// the transport's collectives copy between the ranks' buffers (the transport interface of
// comm/allreduce.hpp; the same as tests/host/comm_allreduce_allocations.cpp's). The world's arrays
// are allocated in its constructor: the collectives allocate nothing.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace octet_test {

/// A barrier that can be used again and again (C++17 has no std::barrier). Allocates nothing.
class thread_barrier {
public:
    explicit thread_barrier(int n) : n_(n) {}
    void arrive_and_wait() {
        std::unique_lock<std::mutex> lock(m_);
        const unsigned long gen = generation_;
        if (++waiting_ == n_) {
            waiting_ = 0;
            ++generation_;
            cv_.notify_all();
            return;
        }
        cv_.wait(lock, [&] { return gen != generation_; });
    }

private:
    std::mutex m_;
    std::condition_variable cv_;
    int n_, waiting_ = 0;
    unsigned long generation_ = 0;
};

/// What the ranks share.
struct in_process_world {
    explicit in_process_world(int ranks)
        : size(ranks), barrier(ranks), send(ranks), counts(ranks), offsets(ranks), values(ranks) {}
    int size;
    thread_barrier barrier;
    std::vector<const unsigned char*> send;
    std::vector<const std::size_t*> counts, offsets;
    std::vector<int> values;
};

/// One rank's view of the world: the transport interface of comm/allreduce.hpp.
class in_process_transport {
public:
    in_process_transport(in_process_world& w, int rank) : w_(&w), rank_(rank) {}
    int rank() const { return rank_; }
    int size() const { return w_->size; }

    void allgather(const void* send, std::size_t bytes, void* recv) {
        publish(send);
        for (int q = 0; q < w_->size; ++q)
            if (bytes) std::memcpy(static_cast<unsigned char*>(recv) + q * bytes, w_->send[q], bytes);
        w_->barrier.arrive_and_wait();
    }
    void alltoallv(const void* send, const std::size_t* send_counts, const std::size_t* send_offsets, void* recv,
                   const std::size_t* recv_counts, const std::size_t* recv_offsets) {
        w_->counts[rank_] = send_counts;
        w_->offsets[rank_] = send_offsets;
        publish(send);
        for (int q = 0; q < w_->size; ++q)
            if (recv_counts[q])
                std::memcpy(static_cast<unsigned char*>(recv) + recv_offsets[q], w_->send[q] + w_->offsets[q][rank_],
                            recv_counts[q]);
        w_->barrier.arrive_and_wait();
    }
    void allgatherv(const void* send, std::size_t, void* recv, const std::size_t* counts, const std::size_t* offsets) {
        publish(send);
        for (int q = 0; q < w_->size; ++q)
            if (counts[q]) std::memcpy(static_cast<unsigned char*>(recv) + offsets[q], w_->send[q], counts[q]);
        w_->barrier.arrive_and_wait();
    }
    int allreduce_max(int value) {
        w_->values[rank_] = value;
        w_->barrier.arrive_and_wait();
        const int m = *std::max_element(w_->values.begin(), w_->values.end());
        w_->barrier.arrive_and_wait();
        return m;
    }

private:
    void publish(const void* send) {
        w_->send[rank_] = static_cast<const unsigned char*>(send);
        w_->barrier.arrive_and_wait();
    }
    in_process_world* w_;
    int rank_;
};

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

}  // namespace octet_test
