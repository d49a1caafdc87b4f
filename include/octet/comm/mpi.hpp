// octet/comm/mpi.hpp: the compressed all-reduce over MPI (CPU processes). The only octet header
// that includes <mpi.h>; nothing else in octet needs MPI.
//
//   MPI_Init(&argc, &argv);
//   {
//       octet::mpi_communicator comm;                      // duplicates MPI_COMM_WORLD
//       octet::codec_config cfg{octet::wire_format::e4m3, octet::transform_kind::hadamard, 1024};
//       octet::compressed_allreduce(comm, cfg, octet::span<float>(grad.data(), grad.size()));   // grad <- sum
//   }
//   MPI_Finalize();
//
// The communicator duplicates its parent (so octet's traffic never matches the caller's messages)
// and sets MPI_ERRORS_RETURN on the duplicate: a failing MPI call throws octet::error instead of
// aborting. Bad arguments on any rank make every rank throw (see comm/allreduce.hpp): nothing is
// left blocked in a collective. Byte counts travel as MPI int counts: one shard message must stay
// below 2 GiB (checked).
#pragma once

// Only the C interface of MPI: skip the deprecated C++ bindings of Open MPI and MPICH.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <climits>
#include <cstddef>
#include <string>
#include <vector>

#include "octet/comm/allreduce.hpp"
#include "octet/config.hpp"
#include "octet/core/check.hpp"
#include "octet/core/span.hpp"

namespace octet {

class mpi_communicator {
public:
    /// Duplicates `parent` (collective over parent's ranks).
    explicit mpi_communicator(MPI_Comm parent = MPI_COMM_WORLD) {
        int initialized = 0;
        MPI_Initialized(&initialized);
        if (!initialized) throw error("octet::mpi_communicator: MPI is not initialized; call MPI_Init first");
        check(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
        check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
        check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
        check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    }
    ~mpi_communicator() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    }
    mpi_communicator(const mpi_communicator&) = delete;
    mpi_communicator& operator=(const mpi_communicator&) = delete;

    int rank() const { return rank_; }
    int size() const { return size_; }
    MPI_Comm get() const { return comm_; }

    // ---- the transport interface of comm/allreduce.hpp ------------------------------------
    void allgather(const void* send, std::size_t bytes, void* recv) {
        check(MPI_Allgather(send, to_int(bytes), MPI_BYTE, recv, to_int(bytes), MPI_BYTE, comm_), "MPI_Allgather");
    }
    void alltoallv(const void* send, const std::size_t* send_counts, const std::size_t* send_offsets, void* recv,
                   const std::size_t* recv_counts, const std::size_t* recv_offsets) {
        std::vector<int> sc(size_), so(size_), rc(size_), ro(size_);
        for (int r = 0; r < size_; ++r)
            sc[r] = to_int(send_counts[r]), so[r] = to_int(send_offsets[r]), rc[r] = to_int(recv_counts[r]),
            ro[r] = to_int(recv_offsets[r]);
        check(MPI_Alltoallv(send, sc.data(), so.data(), MPI_BYTE, recv, rc.data(), ro.data(), MPI_BYTE, comm_),
              "MPI_Alltoallv");
    }
    void allgatherv(const void* send, std::size_t bytes, void* recv, const std::size_t* counts,
                    const std::size_t* offsets) {
        std::vector<int> c(size_), o(size_);
        for (int r = 0; r < size_; ++r) c[r] = to_int(counts[r]), o[r] = to_int(offsets[r]);
        check(MPI_Allgatherv(send, to_int(bytes), MPI_BYTE, recv, c.data(), o.data(), MPI_BYTE, comm_),
              "MPI_Allgatherv");
    }
    int allreduce_max(int value) {
        int out = 0;
        check(MPI_Allreduce(&value, &out, 1, MPI_INT, MPI_MAX, comm_), "MPI_Allreduce");
        return out;
    }
    /// The uncompressed baseline: data <- sum over ranks, in float (MPI_Allreduce).
    void allreduce_sum(span<float> data) {
        std::size_t done = 0;
        while (done < data.size()) {  // in pieces of at most 2^30 elements (int counts)
            const std::size_t m = std::min<std::size_t>(data.size() - done, std::size_t{1} << 30);
            check(MPI_Allreduce(MPI_IN_PLACE, data.data() + done, static_cast<int>(m), MPI_FLOAT, MPI_SUM, comm_),
                  "MPI_Allreduce");
            done += m;
        }
    }
    void barrier() { check(MPI_Barrier(comm_), "MPI_Barrier"); }

private:
    static int to_int(std::size_t v) {
        if (v > static_cast<std::size_t>(INT_MAX))
            throw error("octet::mpi_communicator: a message of 2 GiB or more; MPI counts are int");
        return static_cast<int>(v);
    }
    static void check(int rc, const char* what) {
        if (rc == MPI_SUCCESS) return;
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, text, &len);
        throw error(std::string("octet::mpi_communicator: ") + what +
                    " failed: " + std::string(text, static_cast<std::size_t>(len)));
    }

    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0;
    int size_ = 1;
};

/// The compressed all-reduce over MPI: data <- the sum of every rank's data (see comm/allreduce.hpp).
inline allreduce_report compressed_allreduce(mpi_communicator& comm, const codec_config& cfg, span<float> data,
                                             const allreduce_options& opt = {}) {
    return compressed_allreduce_host(comm, cfg, data, opt, "octet::compressed_allreduce");
}

/// The same over bf16 gradients, read and written in place (compressed_allreduce_host).
inline allreduce_report compressed_allreduce(mpi_communicator& comm, const codec_config& cfg, span<bf16> data,
                                             const allreduce_options& opt = {}) {
    return compressed_allreduce_host(comm, cfg, data, opt, "octet::compressed_allreduce");
}

}  // namespace octet
