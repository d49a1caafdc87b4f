// examples/08_training/mpi_ranks.hpp: the training program's ranks under mpirun: each process is
// one data-parallel rank, and gradients cross the processes through octet's compressed all-reduce
// over MPI (octet/comm/mpi.hpp). Compiled only where CMake found MPI (OCTET_TRAINING_MPI).
#pragma once

#include <octet/comm/mpi.hpp>

#include "ranks.hpp"

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace train {

/// True in a process that an MPI launcher started (mpirun/mpiexec of Open MPI or MPICH, srun):
/// only then does the program initialize MPI, so that a plain start needs no MPI runtime.
inline bool started_by_mpi_launcher() {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
        if (std::getenv(v)) return true;
    return false;
}

/// MPI_Init on construction, MPI_Finalize on destruction.
class mpi_session {
public:
    mpi_session(int& argc, char**& argv) {
        if (MPI_Init(&argc, &argv) != MPI_SUCCESS) throw std::runtime_error("MPI_Init failed");
    }
    ~mpi_session() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
    }
    mpi_session(const mpi_session&) = delete;
    mpi_session& operator=(const mpi_session&) = delete;
};

/// MPI_COMM_WORLD's processes as the program's ranks (through a duplicate that reports failures
/// as octet::error instead of aborting, so that main can say which rank failed and why).
class mpi_ranks final : public process_ranks {
public:
    mpi_ranks() {
        MPI_Comm node = MPI_COMM_NULL;
        if (MPI_Comm_split_type(comm_.get(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
            MPI_Comm_size(node, &here_);
            MPI_Comm_free(&node);
        }
    }
    int rank() const override { return comm_.rank(); }
    int size() const override { return comm_.size(); }
    int processes_here() const override { return here_; }
    void allgather(const void* send, std::size_t bytes, void* recv) override { comm_.allgather(send, bytes, recv); }
    int allreduce_max(int value) override { return comm_.allreduce_max(value); }
    void compressed_allreduce(const octet::codec_config& codec, octet::span<float> data,
                              const octet::allreduce_options& opt) override {
        octet::compressed_allreduce(comm_, codec, data, opt);
    }
    void compressed_allreduce(const octet::codec_config& codec, octet::span<octet::bf16> data,
                              const octet::allreduce_options& opt) override {
        octet::compressed_allreduce(comm_, codec, data, opt);
    }

private:
    octet::mpi_communicator comm_;
    int here_ = 1;
};

/// Ends every process of the job (an error on one rank must not leave the others blocked in a
/// collective).
[[noreturn]] inline void abort_all_ranks(int code) {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::abort();
}

}  // namespace train
