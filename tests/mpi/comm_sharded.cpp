// The sharded-training building blocks (octet/comm/sharded.hpp) over MPI, under mpiexec (4 ranks):
// every rank's result of compressed_reduce_scatter_host and quantized_allgather_host over
// mpi_communicator is bit for bit the result of the same call on the in-process transport
// (support/in_process_world.hpp: one thread per rank inside this process), for ragged shards
// (ranks with 0 rows, shards below the granule), with error feedback over 3 steps; the all-gather
// also equals quantize() of the whole matrix, and with out_t its column-wise copy (W^T) equals the
// in-process transport's and quantize()'s columnwise output (with and without the row-wise copy; a
// rank asking for other copies makes every rank throw); a rank with other cols makes every rank throw
// octet::error and leaves the communicator usable. Every rank generates every rank's inputs from
// the shared seed.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <random>
#include <vector>

#include "octet/comm/mpi.hpp"
#include "octet/comm/sharded.hpp"
#include "support/in_process_world.hpp"
#include "support/random.hpp"

namespace {
using namespace octet;

std::vector<float> input_of(int r, std::size_t n, std::uint64_t salt) {
    auto g = octet_test::rng(salt * 131 + static_cast<std::uint64_t>(r));
    return octet_test::with_edge_cases(g, n);
}

template <class Fn>
void in_process(int P, Fn&& fn) {
    octet_test::on_world_or_throw(P, std::forward<Fn>(fn));
}

template <class Recipe>
void check_allgather(mpi_communicator& comm, std::uint64_t salt, std::size_t cols) {
    const int P = comm.size(), me = comm.rank();
    auto g = octet_test::rng(salt);
    std::vector<std::size_t> rows(static_cast<std::size_t>(P)), begin(static_cast<std::size_t>(P));
    std::size_t total = 0;
    for (int r = 0; r < P; ++r) {
        rows[r] = r == 1 ? 0 : (Recipe::granularity::rows == 128 ? (r == P - 1 ? 1 + g() % 200 : 128) : 1 + g() % 40);
        begin[r] = total;
        total += rows[r];
    }
    const std::vector<float> x = input_of(99, total * cols, salt);
    quantized_tensor<Recipe> want(total, cols), got(total, cols);
    quantize<Recipe>(on_host(), matrix_ref<const float>(x.data(), total, cols), want.ref());
    quantized_allgather_host(comm, on_host(), matrix_ref<const float>(x.data() + begin[me] * cols, rows[me], cols),
                             got.ref());
    std::vector<std::unique_ptr<quantized_tensor<Recipe>>> sim;
    for (int r = 0; r < P; ++r) sim.push_back(std::make_unique<quantized_tensor<Recipe>>(total, cols));
    in_process(P, [&](int r, octet_test::in_process_transport& t) {
        quantized_allgather_host(t, on_host(1), matrix_ref<const float>(x.data() + begin[r] * cols, rows[r], cols),
                                 sim[r]->ref());
    });
    CHECK(got.data() == sim[me]->data());
    CHECK(got.scales() == sim[me]->scales());
    CHECK(got.data() == want.data());
    CHECK(got.scales() == want.scales());
    CHECK(got.tensor_scale() == want.tensor_scale());
}

/// The column-wise copy (out_t) beside the row-wise one (or alone): rows on multiples of x^T's C.
template <class Recipe>
void check_allgather_t(mpi_communicator& comm, std::uint64_t salt, std::size_t cols, bool with_rowwise) {
    using G = typename Recipe::granularity;
    const std::size_t C = G::cols != full ? G::cols : 1;
    const int P = comm.size(), me = comm.rank();
    auto g = octet_test::rng(salt);
    std::vector<std::size_t> rows(static_cast<std::size_t>(P)), begin(static_cast<std::size_t>(P));
    std::size_t total = 0;
    for (int r = 0; r < P; ++r) {
        rows[r] = r == 1 ? 0 : (r == P - 1 ? 1 + g() % (2 * C + 7) : C * (1 + g() % 3));
        begin[r] = total;
        total += rows[r];
    }
    CAPTURE(total);
    CAPTURE(with_rowwise);
    const std::vector<float> x = input_of(98, total * cols, salt);
    quantized_tensor<Recipe> want(total, cols), want_t(cols, total), got(total, cols), got_t(cols, total);
    quantize<Recipe>(on_host(), matrix_ref<const float>(x.data(), total, cols), want.ref(), want_t.ref());
    const quantized_ref<Recipe> none{};
    quantized_allgather_host(comm, on_host(), matrix_ref<const float>(x.data() + begin[me] * cols, rows[me], cols),
                             with_rowwise ? got.ref() : none, got_t.ref());
    std::vector<std::unique_ptr<quantized_tensor<Recipe>>> sim;
    for (int r = 0; r < P; ++r) sim.push_back(std::make_unique<quantized_tensor<Recipe>>(cols, total));
    in_process(P, [&](int r, octet_test::in_process_transport& t) {
        quantized_allgather_host(t, on_host(1), matrix_ref<const float>(x.data() + begin[r] * cols, rows[r], cols),
                                 none, sim[r]->ref());
    });
    CHECK(got_t.data() == sim[me]->data());
    CHECK(got_t.scales() == sim[me]->scales());
    CHECK(got_t.data() == want_t.data());
    CHECK(got_t.scales() == want_t.scales());
    CHECK(got_t.tensor_scale() == want_t.tensor_scale());
    if (with_rowwise) {
        CHECK(got.data() == want.data());
        CHECK(got.scales() == want.scales());
    }
}

}  // namespace

TEST_CASE("MPI quantized all-gather with out_t: W^T's copy bit for bit the in-process transport and quantize()") {
    mpi_communicator comm;
    for (const bool with_rowwise : {true, false}) {
        check_allgather_t<recipes::tensorwise_e4m3>(comm, 9111, 200, with_rowwise);
        check_allgather_t<recipes::blockwise_1x128>(comm, 9112, 300, with_rowwise);
        check_allgather_t<recipes::mxfp8_e4m3>(comm, 9113, 96, with_rowwise);
        check_allgather_t<recipes::nvfp4>(comm, 9114, 161, with_rowwise);
        check_allgather_t<recipes::blockwise_128x128>(comm, 9115, 130, with_rowwise);
    }
    // Rank 2 asks for the row-wise copy only: every rank throws, and the communicator stays usable.
    const int me = comm.rank();
    const std::vector<float> x = input_of(me, 16 * 64, 9116);
    quantized_tensor<recipes::nvfp4> out(16 * comm.size(), 64), out_t(64, 16 * comm.size());
    const quantized_ref<recipes::nvfp4> none{};
    CHECK_THROWS_AS(quantized_allgather_host(comm, on_host(), matrix_ref<const float>(x.data(), 16, 64), out.ref(),
                                             me == 2 ? none : out_t.ref()),
                    octet::error);
    comm.barrier();
}

TEST_CASE("MPI quantized all-gather: bit for bit the in-process transport and quantize() of the whole matrix") {
    mpi_communicator comm;
    check_allgather<recipes::tensorwise_e4m3>(comm, 9101, 200);
    check_allgather<recipes::blockwise_1x128>(comm, 9102, 300);
    check_allgather<recipes::mxfp8_e4m3>(comm, 9103, 96);
    check_allgather<recipes::nvfp4>(comm, 9104, 160);
    check_allgather<recipes::blockwise_128x128>(comm, 9105, 130);
}

TEST_CASE("MPI compressed reduce-scatter: bit for bit the in-process transport, with feedback over 3 steps") {
    mpi_communicator comm;
    const int P = comm.size(), me = comm.rank();
    for (const wire_format f : {wire_format::e4m3, wire_format::nvfp4})
        for (const std::size_t n : {std::size_t{300}, std::size_t{20011}}) {
            CAPTURE(wire_format_name(f));
            CAPTURE(n);
            codec_config cfg;
            cfg.format = f;
            cfg.transform = transform_kind::hadamard;
            cfg.block = 256;
            cfg.stochastic = f == wire_format::nvfp4;
            cfg.seed = 77;
            error_feedback fb(n, residual_storage::f32);
            std::vector<error_feedback> sim_fb;
            for (int r = 0; r < P; ++r) sim_fb.emplace_back(n, residual_storage::f32);
            for (int step = 0; step < 3; ++step) {
                const std::uint64_t salt = 9200 + 10 * n + static_cast<std::uint64_t>(step);
                const std::vector<float> grad = input_of(me, n, salt);
                std::vector<float> got(allreduce_shard(cfg, n, P, me).count);
                reduce_scatter_options o;
                o.expected_ranks = 4;
                o.feedback = fb.view();
                compressed_reduce_scatter_host(comm, cfg, as_cspan(grad), as_span(got), o);
                std::vector<std::vector<float>> sim(static_cast<std::size_t>(P));
                in_process(P, [&](int r, octet_test::in_process_transport& t) {
                    const std::vector<float> gr = input_of(r, n, salt);
                    sim[r].assign(allreduce_shard(cfg, n, P, r).count, 0.0f);
                    reduce_scatter_options so;
                    so.feedback = sim_fb[r].view();
                    so.executor = on_host(1);
                    compressed_reduce_scatter_host(t, cfg, as_cspan(gr), as_span(sim[r]), so);
                });
                CHECK((got.empty() || std::memcmp(got.data(), sim[me].data(), got.size() * sizeof(float)) == 0));
                CHECK(fb.values() == sim_fb[me].values());
            }
        }
}

TEST_CASE("MPI sharded collectives: a rank with other arguments stops every rank, the communicator stays usable") {
    mpi_communicator comm;
    const int me = comm.rank();
    const std::vector<float> x = input_of(me, 10 * 65, 9301);
    const std::size_t cols = me == 1 ? 65 : 64;
    quantized_tensor<recipes::mxfp8_e4m3> out(10 * comm.size(), cols);
    CHECK_THROWS_AS(quantized_allgather_host(comm, on_host(), matrix_ref<const float>(x.data(), 10, cols), out.ref()),
                    octet::error);
    codec_config cfg;
    const std::size_t n = me == 2 ? 999 : 1000;
    std::vector<float> shard(allreduce_shard(cfg, n, comm.size(), me).count);
    CHECK_THROWS_AS(compressed_reduce_scatter_host(comm, cfg, span<const float>(x.data(), n), as_span(shard)),
                    octet::error);
    comm.barrier();  // still usable
}
