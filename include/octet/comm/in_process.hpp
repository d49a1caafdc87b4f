// octet/comm/in_process.hpp: ranks that are threads of one process, as a transport for the
// collectives of comm/ (compressed_allreduce_host, compressed_reduce_scatter_host,
// quantized_allgather_host): the same algorithms they run over MPI or NCCL, with the collectives
// copying between the ranks' buffers. For tests, single-machine runs, and as the reference a
// multi-process run must match bit for bit.
//
//   octet::in_process_world world(P);                        // shared by the P ranks
//   // on thread r (every rank calls every collective, as with MPI):
//   octet::in_process_transport comm(world, r);
//   octet::compressed_allreduce_host(comm, cfg, grad, opt);
//
// The world's arrays are allocated in its constructor: the collectives allocate nothing. A rank
// that never reaches a collective leaves the others waiting (as MPI would): the collectives of
// comm/ agree on their arguments first, so on bad input every rank throws or none does.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <vector>

namespace octet {

namespace detail {
/// A barrier that can be used again and again (C++17 has no std::barrier). Allocates nothing.
class reusable_barrier {
public:
    explicit reusable_barrier(int n) : n_(n) {}
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
}  // namespace detail

/// What the ranks of one process share: each rank publishes its send buffer, then all copy.
struct in_process_world {
    explicit in_process_world(int ranks)
        : size(ranks), barrier(ranks), send(ranks), counts(ranks), offsets(ranks), values(ranks) {}
    int size;
    detail::reusable_barrier barrier;
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

    /// recv[q * bytes, (q + 1) * bytes) <- rank q's `bytes` bytes at send.
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

}  // namespace octet
