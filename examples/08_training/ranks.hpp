// examples/08_training/ranks.hpp: the data-parallel ranks. By default N ranks live inside one
// process (octet/comm/in_process.hpp), as a transport for octet::compressed_allreduce
// (octet/comm/allreduce.hpp): the all-reduce runs the same algorithm it runs over MPI (agree,
// shard, encode, all-to-all, reduce, re-encode, all-gather, decode); here each rank is a thread of
// one call and the collectives copy between the ranks' buffers. Under mpirun each process is one rank, seen through
// process_ranks (mpi_ranks.hpp implements it; this header does not need MPI).
#pragma once

#include <octet/comm/allreduce.hpp>
#include <octet/comm/in_process.hpp>
#include <octet/core/span.hpp>

#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

namespace train {

using octet::in_process_transport;  // octet/comm/in_process.hpp
using octet::in_process_world;

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
    virtual void compressed_allreduce(const octet::codec_config& codec, octet::span<octet::bf16> data,
                                      const octet::allreduce_options& opt) = 0;
};

}  // namespace train
