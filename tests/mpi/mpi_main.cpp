// Main for the multi-process tests: MPI_Init, one shared seed for every rank (broadcast from rank
// 0, so that every rank can generate every rank's inputs), doctest, and one exit code for all
// ranks (the worst). Ranks other than 0 print only failures.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "support/random.hpp"

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    unsigned long long seed = rank == 0 ? static_cast<unsigned long long>(octet_test::run_seed()) : 0ull;
    MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    if (rank != 0) setenv("OCTET_TEST_SEED", std::to_string(seed).c_str(), 1);
    if (rank == 0) std::printf("octet test seed: %llu (set OCTET_TEST_SEED to repeat), %d ranks\n", seed, size);
    int rc = 0;
    {
        doctest::Context context(argc, argv);
        if (rank != 0) context.setOption("minimal", true);
        rc = context.run();
    }
    int worst = 0;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return worst;
}
