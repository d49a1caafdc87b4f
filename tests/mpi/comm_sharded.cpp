// The sharded-training building blocks (octet/comm/sharded.hpp) over MPI, under mpiexec (4 ranks):
// every rank's result of compressed_reduce_scatter_host and quantized_allgather_host over
// mpi_communicator is bit for bit the result of the same call on the in-process transport
// (support/in_process_world.hpp: one thread per rank inside this process), for ragged shards
// (ranks with 0 rows, shards below the granule), with error feedback over 3 steps; the all-gather
// also equals quantize() of the whole matrix; a rank with other cols makes every rank throw
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

}  // namespace

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
