// Example 06, multi-process: the codecs of examples/06_gradient_codec as a compressed all-reduce
// over MPI. Every rank builds its own realistic layer gradient; the program all-reduces them with
// MPI_Allreduce (float) and with octet::compressed_allreduce for each codec, and rank 0 prints the
// error against the float64 sum, the cosine, the bytes each rank sent, and the time.
//
//   mpirun -np 4 build/default/tests/mpi/example_06_gradient_codec_mpi
//
// (It lives in tests/mpi because examples/ builds single-process programs only; CTest runs it as
// mpi.example_06_gradient_codec_mpi.)
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "octet/codec/codec.hpp"
#include "octet/codec/metrics.hpp"
#include "octet/comm/mpi.hpp"

namespace {

std::vector<float> layer_gradient(int rank) {
    std::mt19937_64 g(1000 + static_cast<unsigned>(rank));
    const int rows = 256, cols = 512, r = 8;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::student_t_distribution<float> t(3.0f);
    std::vector<float> a(rows * r), b(cols * r), out(rows * cols);
    for (auto& x : a) x = nd(g);
    for (auto& x : b) x = nd(g);
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j) {
            float s = 0;
            for (int q = 0; q < r; ++q) s += a[i * r + q] * b[j * r + q];
            out[i * cols + j] = 1e-3f * (s * (j % 97 == 0 ? 30.0f : 1.0f) + 0.5f * t(g));
        }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int status = 0;
    try {
        using namespace octet;
        mpi_communicator comm;
        const int P = comm.size(), me = comm.rank();
        const std::vector<float> mine = layer_gradient(me);
        const std::size_t n = mine.size();
        // The exact sum, for reporting (every rank can rebuild every rank's gradient).
        std::vector<double> exact(n, 0.0);
        for (int r = 0; r < P; ++r) {
            const std::vector<float> g = layer_gradient(r);
            for (std::size_t i = 0; i < n; ++i) exact[i] += g[i];
        }
        std::vector<float> exact_f(exact.begin(), exact.end());
        if (me == 0)
            std::printf("%d ranks, %zu elements per gradient (%zu bytes as float)\n%-8s %-9s %-10s %-11s %-12s %s\n", P,
                        n, 4 * n, "codec", "transform", "rel.L2", "cosine", "bytes sent", "ms");

        std::vector<float> data = mine;
        comm.barrier();
        auto t0 = std::chrono::steady_clock::now();
        comm.allreduce_sum(span<float>(data.data(), n));
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        codec_metrics m = measure_codec(exact_f, data, 0);
        if (me == 0)
            std::printf("%-8s %-9s %-10.6f %-11.8f %-12.0f %.2f   (MPI_Allreduce; ring bytes)\n", "float", "-",
                        m.relative_l2, m.cosine, 2.0 * (P - 1) / P * 4.0 * static_cast<double>(n), ms);

        for (const wire_format f : {wire_format::e4m3, wire_format::e5m2, wire_format::mxfp8, wire_format::nvfp4})
            for (const transform_kind t : {transform_kind::identity, transform_kind::hadamard}) {
                const codec_config cfg{f, t, 1024, 0, 11};
                data = mine;
                comm.barrier();
                t0 = std::chrono::steady_clock::now();
                allreduce_options opt;
                opt.executor = on_host(1);
                const allreduce_report rep = compressed_allreduce(comm, cfg, span<float>(data.data(), n), opt);
                ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
                m = measure_codec(exact_f, data, 0);
                if (me == 0)
                    std::printf("%-8s %-9s %-10.6f %-11.8f %-12zu %.2f\n", wire_format_name(f), transform_name(t),
                                m.relative_l2, m.cosine, rep.bytes_sent, ms);
            }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        status = 1;
    }
    int worst = 0;
    MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return worst;
}
