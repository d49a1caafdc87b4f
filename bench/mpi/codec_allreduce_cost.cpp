// The cost model of the compressed all-reduce, checked against measurements (run under mpirun).
//
//   mpirun -np 4 --oversubscribe build/default/bench/mpi/bench_mpi_codec_allreduce_cost [max_log2_n]
//
// Model. For P ranks, n float elements and a codec of b wire bytes per element (headers included):
//   T_float(n) = MPI_Allreduce of 4n bytes (measured; a ring sends 2 (P-1)/P 4n bytes per rank)
//   T_codec(n) = t_sync + (c0 + c n) + (a + 2 (P-1)/P b n / BW)
// with c the codec work per element per rank (encode n as P shard messages, dequantize and sum P
// messages of n/P, re-encode n/P, decode n), a and BW the latency and bandwidth of the two
// exchanges (MPI_Alltoallv + MPI_Allgatherv of the compressed sizes), and t_sync the three small
// collectives of the agreement and error-flag steps. Each term is fitted by least squares on its
// own measurement (codec work alone, all ranks at once; raw exchanges; the small collectives; fits
// weighted by 1/t^2, i.e. in relative error), then
// the model predicts the full compressed all-reduce, which is measured too. For large n,
// compression pays when
//   2 (P-1)/P (4 - b) n / BW > c n,   i.e. when the link is slower than BW* = 2 (P-1)/P (4 - b) / c.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "octet/comm/mpi.hpp"

namespace {
using namespace octet;

double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Median over `reps` of the slowest rank's time of fn().
template <class Fn>
double timed(MPI_Comm comm, int reps, Fn&& fn) {
    std::vector<double> t;
    for (int i = 0; i < reps + 1; ++i) {
        MPI_Barrier(comm);
        const double t0 = now();
        fn();
        double dt = now() - t0, worst = 0;
        MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, comm);
        if (i > 0) t.push_back(worst);  // the first run warms up
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

struct fit {
    double a = 0, inv_bw = 0;  // t = a + bytes * inv_bw
};
/// Least squares of t = a + x * inv_bw weighted by 1 / t^2 (relative errors count, so that the
/// small sizes are not drowned by the large ones).
fit least_squares(const std::vector<double>& x, const std::vector<double>& t) {
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double w = 1.0 / (t[i] * t[i]);
        sw += w, sx += w * x[i], sy += w * t[i], sxx += w * x[i] * x[i], sxy += w * x[i] * t[i];
    }
    fit f;
    f.inv_bw = (sw * sxy - sx * sy) / (sw * sxx - sx * sx);
    f.a = (sy - f.inv_bw * sx) / sw;
    return f;
}

/// The codec work of one compressed all-reduce on this rank, without communication (its own
/// messages stand in for the other ranks').
double codec_only(const codec_config& cfg, std::vector<float>& grad, int P, int me) {
    const std::size_t n = grad.size();
    const double t0 = now();
    std::vector<std::vector<std::uint8_t>> msgs(P);
    for (int r = 0; r < P; ++r) {
        const shard_range s = allreduce_shard(cfg, n, P, r);
        msgs[r].resize(encoded_size(cfg, s.count));
        encode_options o;
        o.first_index = s.begin;
        encode_gradient(on_host(1), cfg, span<const float>(grad.data() + s.begin, s.count), msgs[r], o);
    }
    const shard_range mine = allreduce_shard(cfg, n, P, me);
    std::vector<float> y(transform_length(cfg.transform, mine.count, cfg.block));
    for (int r = 0; r < P; ++r) decode_gradient_transformed(on_host(1), msgs[me], y, r > 0);
    std::vector<std::uint8_t> red(encoded_size(cfg, mine.count));
    encode_options o;
    o.first_index = mine.begin;
    encode_gradient_transformed(on_host(1), cfg, y, mine.count, red, o);
    for (int r = 0; r < P; ++r) {
        const shard_range s = allreduce_shard(cfg, n, P, r);
        decode_gradient(on_host(1), msgs[r], span<float>(grad.data() + s.begin, s.count));
    }
    return now() - t0;
}

}  // namespace

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    {
        mpi_communicator comm;
        const int P = comm.size(), me = comm.rank();
        const int max_log = argc > 1 ? std::atoi(argv[1]) : 22;
        const codec_config codecs[] = {{wire_format::e4m3, transform_kind::hadamard, 1024, 0, 1},
                                       {wire_format::e4m3, transform_kind::identity, 1024, 0, 1},
                                       {wire_format::nvfp4, transform_kind::hadamard, 1024, 0, 1}};
        constexpr int C = 3;
        std::vector<int> logs;
        for (int k = 12; k <= max_log; k += 2) logs.push_back(k);

        // The small collectives of the agreement and error-flag steps.
        const double t_sync = timed(comm.get(), 50, [&] {
            char d[64] = {}, all[64 * 64];
            comm.allgather(d, 64, all);
            comm.allreduce_max(0);
            comm.allreduce_max(0);
        });

        std::vector<double> tf(logs.size());
        std::vector<double> xb[C], xt[C], cn[C], ct[C], tc[C], wire[C];
        for (std::size_t li = 0; li < logs.size(); ++li) {
            const std::size_t n = std::size_t{1} << logs[li];
            std::mt19937_64 g(static_cast<std::uint64_t>(me) + 1);
            std::normal_distribution<float> d(0.0f, 1e-3f);
            std::vector<float> grad(n), work(n);
            for (auto& v : grad) v = d(g);
            const int reps = logs[li] <= 18 ? 9 : 3;
            tf[li] = timed(comm.get(), reps, [&] {
                work = grad;
                comm.allreduce_sum(span<float>(work.data(), n));
            });
            for (int c = 0; c < C; ++c) {
                const codec_config& cfg = codecs[c];
                std::vector<std::size_t> sizes(P), off(P + 1, 0);
                for (int r = 0; r < P; ++r)
                    sizes[r] = encoded_size(cfg, allreduce_shard(cfg, n, P, r).count), off[r + 1] = off[r] + sizes[r];
                std::vector<std::uint8_t> sendb(off[P], 1), recvb(P * sizes[me]), gath(off[P]);
                std::vector<std::size_t> rc(P, sizes[me]), ro(P);
                for (int r = 0; r < P; ++r) ro[r] = static_cast<std::size_t>(r) * sizes[me];
                // The exchanges alone.
                xt[c].push_back(timed(comm.get(), reps, [&] {
                    comm.alltoallv(sendb.data(), sizes.data(), off.data(), recvb.data(), rc.data(), ro.data());
                    comm.allgatherv(recvb.data(), sizes[me], gath.data(), sizes.data(), off.data());
                }));
                double sent = static_cast<double>(off[P] - sizes[me]) + static_cast<double>(P - 1) * sizes[me],
                       sent_max = 0;
                MPI_Allreduce(&sent, &sent_max, 1, MPI_DOUBLE, MPI_MAX, comm.get());
                xb[c].push_back(sent_max);
                wire[c].push_back(static_cast<double>(off[P]) / static_cast<double>(n));
                // The codec work alone (all ranks at once, as in the real call).
                cn[c].push_back(static_cast<double>(n));
                ct[c].push_back(timed(comm.get(), reps, [&] {
                    work = grad;
                    codec_only(cfg, work, P, me);
                }));
                // The real thing.
                allreduce_options opt;
                opt.executor = on_host(1);
                tc[c].push_back(timed(comm.get(), reps, [&] {
                    work = grad;
                    compressed_allreduce(comm, cfg, span<float>(work.data(), n), opt);
                }));
            }
        }
        if (me == 0) {
            std::printf("%d ranks; small collectives t_sync = %.3f ms\n", P, 1e3 * t_sync);
            for (int c = 0; c < C; ++c) {
                const fit link = least_squares(xb[c], xt[c]);
                const fit work = least_squares(cn[c], ct[c]);
                const double b = wire[c].back();
                const double breakeven = 2.0 * (P - 1) / P * (4.0 - b) / work.inv_bw;
                std::printf(
                    "\n%s/%s: %.3f wire bytes per element; codec work %.3g ms + %.2f ns/element; exchange %.3g ms + "
                    "bytes / %.2f GB/s;"
                    " compression pays below %.2f GB/s per rank\n",
                    wire_format_name(codecs[c].format), transform_name(codecs[c].transform), b, 1e3 * work.a,
                    1e9 * work.inv_bw, 1e3 * link.a, 1e-9 / link.inv_bw, 1e-9 * breakeven);
                std::printf("  %-6s %-10s %-12s %-10s %-9s %s\n", "log2n", "float ms", "compressed", "model ms",
                            "model err", "pays here");
                for (std::size_t li = 0; li < logs.size(); ++li) {
                    const double model = t_sync + work.a + work.inv_bw * cn[c][li] + link.a + link.inv_bw * xb[c][li];
                    std::printf("  %-6d %-10.3f %-12.3f %-10.3f %+-8.0f%% %s\n", logs[li], 1e3 * tf[li],
                                1e3 * tc[c][li], 1e3 * model, 100.0 * (model - tc[c][li]) / tc[c][li],
                                tc[c][li] < tf[li] ? "yes" : "no");
                }
            }
        }
    }
    MPI_Finalize();
    return 0;
}
