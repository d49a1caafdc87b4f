// examples/08_training/ranks.hpp: the data-parallel ranks. By default N ranks live inside one
// process, as a transport for octet::compressed_allreduce (octet/comm/allreduce.hpp): the
// all-reduce runs the same algorithm it runs over MPI (agree, shard, encode, all-to-all, reduce,
// re-encode, all-gather, decode); here each rank is a thread of one call and the collectives copy
// between the ranks' buffers. Under mpirun each process is one rank, seen through process_ranks
// (mpi_ranks.hpp implements it; this header does not need MPI).
#pragma once

#include <octet/comm/allreduce.hpp>
#include <octet/core/span.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace train {

/// A barrier that can be used again and again (C++17 has no std::barrier).
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

/// What the ranks of one process share: each rank publishes its send buffer, then all copy.
struct in_process_world {
    explicit in_process_world(int ranks)
        : size(ranks), barrier(ranks), send(ranks), counts(ranks), offsets(ranks), values(ranks) {}
    int size;
    thread_barrier barrier;
    std::vector<const unsigned char*> send;
    std::vector<const std::size_t*> counts, offsets;
    std::vector<int> values;
};

/// One rank's view of the world: the transport interface compressed_allreduce expects.
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

/// Runs fn(rank) on one thread per rank and waits for all; the first exception is rethrown.
/// (A rank that throws inside a collective is not a case here: compressed_allreduce agrees on
/// its arguments first, so every rank throws or none does.)
template <class Fn>
void on_every_rank(int ranks, Fn&& fn) {
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> errors(ranks);
    threads.reserve(ranks);
    for (int r = 0; r < ranks; ++r)
        threads.emplace_back([&, r] {
            try {
                fn(r);
            } catch (...) {
                errors[r] = std::current_exception();
            }
        });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
        if (e) std::rethrow_exception(e);
}

/// The ranks of a world of processes (one rank each), as the training loop uses them; nullptr
/// where every rank is a thread of this process. Every call is a collective over all ranks.
class process_ranks {
public:
    virtual ~process_ranks() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    /// Processes of this world on this machine (they share its cores).
    virtual int processes_here() const = 0;
    /// recv[q * bytes, (q + 1) * bytes) <- rank q's `bytes` bytes at send.
    virtual void allgather(const void* send, std::size_t bytes, void* recv) = 0;
    virtual int allreduce_max(int value) = 0;
    /// data <- the sum of every rank's data, through octet's compressed all-reduce.
    virtual void compressed_allreduce(const octet::codec_config& codec, octet::span<float> data,
                                      const octet::allreduce_options& opt) = 0;
};

}  // namespace train
