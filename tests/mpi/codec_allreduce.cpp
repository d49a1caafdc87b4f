// The compressed all-reduce over MPI, under mpiexec (4 ranks, and 3 for the sum tests):
//   * the result matches the float64 sum of every rank's gradient within allreduce_error_bound,
//     for each format and transform, on Gaussian, heavy-tailed and low-rank gradients, at ragged
//     sizes (including sizes where some ranks own empty shards);
//   * every rank ends with bit-identical results, equal to a single-process simulation of the
//     algorithm with the codec's host functions (so the transport moved the right bytes);
//   * bad input raises octet::error on EVERY rank and leaves the communicator usable: a wrong rank
//     count, mismatched configs or sizes across ranks (mismatched headers), a bad residual on one
//     rank, corrupted stage-1 buffers (a flipped payload bit, a truncated-size header); nothing hangs
//     (CTest's timeout would catch it).
// Every rank generates every rank's gradient from the shared seed, so each can compute the exact sum.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "octet/codec/codec.hpp"
#include "octet/comm/mpi.hpp"
#include "support/random.hpp"

namespace {
using namespace octet;

enum class kind { gaussian, heavy, low_rank };

/// Rank r's gradient: deterministic in (run seed, salt, r).
std::vector<float> gradient_of(int r, std::size_t n, kind k, std::uint64_t salt) {
    auto g = octet_test::rng(salt * 131 + static_cast<std::uint64_t>(r));
    std::vector<float> v(n);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    if (k == kind::gaussian) {
        for (auto& x : v) x = nd(g);
    } else if (k == kind::heavy) {
        std::student_t_distribution<float> t(2.0f);
        for (auto& x : v) x = 1e-3f * t(g);
    } else {
        // rank-4 matrix (rows of 128) with a few 30x outlier columns, plus noise
        const std::size_t cols = 128, rank = 4;
        std::vector<float> a(rank * ((n + cols - 1) / cols)), b(rank * cols);
        for (auto& x : a) x = nd(g);
        for (auto& x : b) x = nd(g);
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t row = i / cols, col = i % cols;
            float s = 0;
            for (std::size_t q = 0; q < rank; ++q) s += a[row * rank + q] * b[col * rank + q];
            v[i] = s * (col % 37 == 0 ? 30.0f : 1.0f) + 0.01f * nd(g);
        }
    }
    return v;
}

double norm(const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += static_cast<double>(x) * x;
    return std::sqrt(s);
}

/// The algorithm of comm/allreduce.hpp in one process, from the codec's public functions.
std::vector<float> simulate(const codec_config& cfg, const std::vector<std::vector<float>>& g) {
    const int P = static_cast<int>(g.size());
    const std::size_t n = g[0].size();
    std::vector<float> out(n);
    for (int s = 0; s < P; ++s) {
        const shard_range sh = allreduce_shard(cfg, n, P, s);
        const std::size_t bytes = encoded_size(cfg, sh.count);
        std::vector<float> y(transform_length(cfg.transform, sh.count, cfg.block));
        for (int r = 0; r < P; ++r) {
            std::vector<std::uint8_t> m(bytes);
            encode_options eo;
            eo.first_index = sh.begin;
            eo.random_stream = 1 + static_cast<std::uint64_t>(r);
            encode_gradient(on_host(1), cfg, span<const float>(g[r].data() + sh.begin, sh.count), m, eo);
            decode_gradient_transformed(on_host(1), m, y, r > 0);
        }
        std::vector<std::uint8_t> red(bytes);
        encode_options eo;
        eo.first_index = sh.begin;
        encode_gradient_transformed(on_host(1), cfg, y, sh.count, red, eo);
        decode_gradient(on_host(1), red, span<float>(out.data() + sh.begin, sh.count));
    }
    return out;
}

std::uint64_t hash_bits(const std::vector<float>& v) {
    std::uint64_t h = 1469598103934665603ull;
    for (float x : v) {
        std::uint32_t u;
        std::memcpy(&u, &x, 4);
        h = (h ^ u) * 1099511628211ull;
    }
    return h;
}

/// Runs fn on every rank and checks that every rank threw octet::error containing `what`.
template <class Fn>
void expect_all_ranks_throw(mpi_communicator& comm, const std::string& what, Fn&& fn) {
    int threw = 0;
    std::string text;
    try {
        fn();
    } catch (const octet::error& e) {
        threw = 1;
        text = e.what();
    }
    CHECK_MESSAGE(threw == 1, "rank ", comm.rank(), " did not throw");
    if (threw && comm.rank() == 0) MESSAGE("rank 0: ", text);
    int all = 0;
    MPI_Allreduce(&threw, &all, 1, MPI_INT, MPI_MIN, comm.get());
    CHECK(all == 1);
    if (!what.empty()) {
        // The rank that saw the problem first names it; the others say which rank stopped them.
        int has = text.find(what) != std::string::npos ? 1 : 0, any = 0;
        MPI_Allreduce(&has, &any, 1, MPI_INT, MPI_MAX, comm.get());
        CHECK_MESSAGE(any == 1, "no rank's error mentions '", what, "'");
    }
}

}  // namespace

TEST_CASE("compressed all-reduce: the sum within the stated bound, bit-identical on every rank") {
    mpi_communicator comm;
    const int P = comm.size(), me = comm.rank();
    const std::size_t sizes[] = {100003, 4096, 1, 0, 300};  // ragged; small ones leave ranks with empty shards
    const wire_format formats[] = {wire_format::e4m3, wire_format::e5m2, wire_format::mxfp8, wire_format::nvfp4};
    const kind kinds[] = {kind::gaussian, kind::heavy, kind::low_rank};
    std::uint64_t salt = 1;
    for (const std::size_t n : sizes)
        for (const wire_format f : formats)
            for (const transform_kind t : {transform_kind::identity, transform_kind::hadamard})
                for (const kind k : kinds) {
                    if (n < 4096 && k != kind::gaussian) continue;
                    ++salt;
                    codec_config cfg{f, t, 1024, 0, 77 + salt};
                    std::vector<std::vector<float>> g(static_cast<std::size_t>(P));
                    for (int r = 0; r < P; ++r) g[r] = gradient_of(r, n, k, salt);
                    std::vector<double> exact(n, 0.0);
                    double sum_of_norms = 0;
                    for (int r = 0; r < P; ++r) {
                        sum_of_norms += norm(g[r]);
                        for (std::size_t i = 0; i < n; ++i) exact[i] += g[r][i];
                    }
                    double norm_of_sum = 0;
                    for (double v : exact) norm_of_sum += v * v;
                    norm_of_sum = std::sqrt(norm_of_sum);

                    std::vector<float> data = g[me];
                    allreduce_options opt;
                    opt.executor = on_host(1);
                    const allreduce_report rep = compressed_allreduce(comm, cfg, span<float>(data.data(), n), opt);

                    double err = 0;
                    for (std::size_t i = 0; i < n; ++i) err += (data[i] - exact[i]) * (data[i] - exact[i]);
                    err = std::sqrt(err);
                    const double bound = allreduce_error_bound(cfg, n, P, sum_of_norms, norm_of_sum);
                    CAPTURE(n);
                    CAPTURE(std::string(wire_format_name(f)));
                    CAPTURE(std::string(transform_name(t)));
                    CAPTURE(static_cast<int>(k));
                    CHECK(err <= bound);
                    if (me == 0 && n == 100003 && k == kind::gaussian)
                        MESSAGE(std::string(wire_format_name(f)), " ", std::string(transform_name(t)),
                                ": relative error ", err / norm_of_sum, ", bound ", bound / norm_of_sum,
                                ", bytes sent ", rep.bytes_sent,
                                " (float ring: ", 2.0 * (P - 1) / P * 4.0 * static_cast<double>(n), ")");

                    // Every rank holds the same bits, and they are the single-process simulation's.
                    const std::uint64_t h = hash_bits(data);
                    std::vector<std::uint64_t> all(static_cast<std::size_t>(P));
                    MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, comm.get());
                    for (int r = 0; r < P; ++r) CHECK(all[r] == h);
                    if (n <= 4096 || me == 0) CHECK(hash_bits(simulate(cfg, g)) == h);
                }
}

TEST_CASE("compressed all-reduce: stochastic rounding stays within its (wider) bound") {
    mpi_communicator comm;
    const int P = comm.size(), me = comm.rank();
    const std::size_t n = 50000;
    for (const wire_format f : {wire_format::e4m3, wire_format::nvfp4}) {
        codec_config cfg{f, transform_kind::hadamard, 2048, 0, 5, /*stochastic=*/true};
        std::vector<std::vector<float>> g(static_cast<std::size_t>(P));
        for (int r = 0; r < P; ++r) g[r] = gradient_of(r, n, kind::gaussian, 900 + static_cast<int>(f));
        std::vector<double> exact(n, 0.0);
        double sum_of_norms = 0, norm_of_sum = 0;
        for (int r = 0; r < P; ++r) {
            sum_of_norms += norm(g[r]);
            for (std::size_t i = 0; i < n; ++i) exact[i] += g[r][i];
        }
        for (double v : exact) norm_of_sum += v * v;
        norm_of_sum = std::sqrt(norm_of_sum);
        std::vector<float> data = g[me];
        compressed_allreduce(comm, cfg, span<float>(data.data(), n));
        double err = 0;
        for (std::size_t i = 0; i < n; ++i) err += (data[i] - exact[i]) * (data[i] - exact[i]);
        CHECK(std::sqrt(err) <= allreduce_error_bound(cfg, n, P, sum_of_norms, norm_of_sum));
        CHECK(hash_bits(simulate(cfg, g)) == hash_bits(data));
    }
}

TEST_CASE("compressed all-reduce: bad input raises octet::error on every rank, and nothing hangs") {
    mpi_communicator comm;
    const int P = comm.size(), me = comm.rank();
    const std::size_t n = 20000;
    const codec_config cfg{wire_format::e4m3, transform_kind::hadamard, 1024, 0, 9};
    auto fresh = [&] { return gradient_of(me, n, kind::gaussian, 4242); };

    SUBCASE("wrong rank count") {
        std::vector<float> d = fresh();
        allreduce_options opt;
        opt.expected_ranks = P + 1;
        expect_all_ranks_throw(comm, "expected_ranks",
                               [&] { compressed_allreduce(comm, cfg, span<float>(d.data(), n), opt); });
    }
    SUBCASE("a different seed on one rank (mismatched headers)") {
        std::vector<float> d = fresh();
        codec_config c = cfg;
        if (me == P - 1) c.seed = 10;
        expect_all_ranks_throw(comm, "config.seed", [&] { compressed_allreduce(comm, c, span<float>(d.data(), n)); });
    }
    SUBCASE("a different format on one rank") {
        std::vector<float> d = fresh();
        codec_config c = cfg;
        if (me == 1 % P) c.format = wire_format::nvfp4;
        expect_all_ranks_throw(comm, "config.format", [&] { compressed_allreduce(comm, c, span<float>(d.data(), n)); });
    }
    SUBCASE("a different size on one rank") {
        std::vector<float> d = fresh();
        const std::size_t m = me == 0 ? n - 1 : n;
        expect_all_ranks_throw(comm, "gradient size",
                               [&] { compressed_allreduce(comm, cfg, span<float>(d.data(), m)); });
    }
    SUBCASE("an invalid config on one rank only") {
        std::vector<float> d = fresh();
        codec_config c = cfg;
        if (me == 0) c.block = 1000;  // not a power of two
        expect_all_ranks_throw(comm, "config.block", [&] { compressed_allreduce(comm, c, span<float>(d.data(), n)); });
    }
    SUBCASE("a residual of the wrong size on one rank") {
        std::vector<float> d = fresh();
        error_feedback fb(me == 0 ? n + 1 : n);
        allreduce_options opt;
        opt.feedback = fb.view();
        expect_all_ranks_throw(comm, "options.feedback",
                               [&] { compressed_allreduce(comm, cfg, span<float>(d.data(), n), opt); });
    }
    SUBCASE("a corrupted stage-1 buffer (one flipped payload bit)") {
        std::vector<float> d = fresh();
        allreduce_options opt;
        if (me == 0)
            opt.tamper = [](int peer, span<std::uint8_t> m) {
                if (peer == 1) m[m.size() - 40] ^= 0x10;
            };
        expect_all_ranks_throw(comm, "checksum",
                               [&] { compressed_allreduce(comm, cfg, span<float>(d.data(), n), opt); });
    }
    SUBCASE("a corrupted stage-1 header (a size field that says the buffer is truncated)") {
        std::vector<float> d = fresh();
        allreduce_options opt;
        if (me == P - 1)
            opt.tamper = [](int, span<std::uint8_t> m) {
                m[48] ^= 0x01;  // total bytes
                seal_wire_message(m);
            };
        expect_all_ranks_throw(comm, "total size",
                               [&] { compressed_allreduce(comm, cfg, span<float>(d.data(), n), opt); });
    }
    // After every failure the communicator still works: a valid call completes with the right sum.
    std::vector<float> d = fresh();
    std::vector<double> exact(n, 0.0);
    double sum_of_norms = 0, norm_of_sum = 0, err = 0;
    for (int r = 0; r < P; ++r) {
        const std::vector<float> g = gradient_of(r, n, kind::gaussian, 4242);
        sum_of_norms += norm(g);
        for (std::size_t i = 0; i < n; ++i) exact[i] += g[i];
    }
    compressed_allreduce(comm, cfg, span<float>(d.data(), n));
    for (std::size_t i = 0; i < n; ++i)
        err += (d[i] - exact[i]) * (d[i] - exact[i]), norm_of_sum += exact[i] * exact[i];
    CHECK(std::sqrt(err) <= allreduce_error_bound(cfg, n, P, sum_of_norms, std::sqrt(norm_of_sum)));
}
