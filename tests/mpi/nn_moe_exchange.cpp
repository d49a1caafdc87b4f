// The expert-parallel MoE exchange (octet/nn/moe_exchange.hpp) over MPI, under mpiexec (4 ranks; 3 too):
// every rank's plan, dispatch (the received FP8 rows, codes and scales) and combine (its tokens'
// outputs and the rows that came back; bf16, E4M3 and f32 wires; with and without a capacity) over
// mpi_communicator are bit for bit the same calls on the in-process transport
// (support/in_process_world.hpp: one thread per rank inside this process), and without a capacity
// bit for bit the one-process layer over every rank's tokens; each rank prints a hash of what it
// received and of its outputs (the same line from the in-process run). An expert index out of range
// on one rank and another expert count on another make every rank throw octet::error, and leave the
// communicator usable. Every rank generates every rank's inputs from the shared seed.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "octet/comm/mpi.hpp"
#include "octet/nn/moe_exchange.hpp"
#include "support/in_process_world.hpp"
#include "support/moe_exchange_case.hpp"
#include "support/random.hpp"

namespace {
using namespace octet;
using octet_test::moe_exchange_case;
using octet_test::moe_rank_run;

template <class Fn>
void in_process(int P, Fn&& fn) {
    octet_test::on_world_or_throw(P, std::forward<Fn>(fn));
}

/// The rank's tokens: ragged, rank 1 without any.
std::vector<std::size_t> tokens_of(int P) {
    std::vector<std::size_t> t;
    for (int r = 0; r < P; ++r) t.push_back(r == 1 ? 0 : 17 + 13 * static_cast<std::size_t>(r));
    return t;
}

std::uint64_t received_hash(moe_rank_run& run) {
    const grouped_layout& l = run.xe.layout();
    std::uint64_t h = octet_test::fnv1a(run.xe.cref().data, l.data_bytes);
    return octet_test::fnv1a(run.xe.cref().scales, l.scale_bytes, h);
}

std::uint64_t output_hash(const moe_rank_run& run) {
    return octet_test::fnv1a(run.out.data(), run.out.size() * sizeof(float));
}

void check_against_in_process(mpi_communicator& comm, moe_combine_wire wire, const dispatch_options& dopt,
                              std::uint64_t salt) {
    const int P = comm.size(), me = comm.rank();
    const std::size_t E = 3 * static_cast<std::size_t>(P), k = 3, d = 200, N = 136;
    const moe_exchange_case c(salt, E, k, d, N, tokens_of(P), {2});
    moe_exchange_options opt;
    opt.combine_wire = wire;
    opt.expected_ranks = P;
    moe_rank_run got;
    octet_test::run_moe_rank(comm, c, got, opt, dopt);
    std::vector<moe_rank_run> sim(static_cast<std::size_t>(P));
    in_process(P, [&](int r, octet_test::in_process_transport& t) {
        moe_exchange_options o = opt;
        o.executor = on_host(1);
        octet_test::run_moe_rank(t, c, sim[r], o, dopt);
    });
    const grouped_layout& l = got.xe.layout();
    REQUIRE(l.data_bytes == sim[me].xe.layout().data_bytes);
    REQUIRE(l.scale_bytes == sim[me].xe.layout().scale_bytes);
    CHECK(received_hash(got) == received_hash(sim[me]));
    CHECK(std::memcmp(got.xe.cref().data, sim[me].xe.cref().data, l.data_bytes) == 0);
    CHECK(std::memcmp(got.xe.cref().scales, sim[me].xe.cref().scales, l.scale_bytes) == 0);
    CHECK(got.out.size() == sim[me].out.size());
    CHECK((got.out.empty() || std::memcmp(got.out.data(), sim[me].out.data(), got.out.size() * sizeof(float)) == 0));
    CHECK(got.returned.size() == sim[me].returned.size());
    CHECK((got.returned.empty() ||
           std::memcmp(got.returned.data(), sim[me].returned.data(), got.returned.size() * sizeof(float)) == 0));
    CHECK(got.dispatch_report.bytes_sent == sim[me].dispatch_report.bytes_sent);
    CHECK(got.combine_report.bytes_received == sim[me].combine_report.bytes_received);
    std::printf(
        "moe exchange rank %d wire %d capacity %s: received %016llx out %016llx (MPI), %016llx %016llx "
        "(in-process); dispatch sent %zu bytes\n",
        me, static_cast<int>(wire), dopt.capacity == std::numeric_limits<std::size_t>::max() ? "none" : "4",
        static_cast<unsigned long long>(received_hash(got)), static_cast<unsigned long long>(output_hash(got)),
        static_cast<unsigned long long>(received_hash(sim[me])), static_cast<unsigned long long>(output_hash(sim[me])),
        got.dispatch_report.bytes_sent);
    if (dopt.capacity == std::numeric_limits<std::size_t>::max()) {
        octet_test::moe_one_process one(c, matrix_ref<const float>(c.x.data(), c.T, d),
                                        matrix_ref<const std::int32_t>(c.idx.data(), c.T, k),
                                        matrix_ref<const float>(c.w.data(), c.T, k), wire);
        CHECK((got.out.empty() ||
               std::memcmp(got.out.data(), one.out.data() + c.begin[me] * N, got.out.size() * sizeof(float)) == 0));
    }
}

}  // namespace

TEST_CASE("MPI moe exchange: bit for bit the in-process transport and the one-process layer") {
    mpi_communicator comm;
    dispatch_options capped;
    capped.capacity = 4;
    for (const moe_combine_wire wire : {moe_combine_wire::bf16, moe_combine_wire::e4m3_1x128, moe_combine_wire::f32}) {
        CAPTURE(static_cast<int>(wire));
        check_against_in_process(comm, wire, {}, 9501);
        check_against_in_process(comm, wire, capped, 9502);
    }
}

TEST_CASE("MPI moe exchange: bad input on one rank stops every rank, the communicator stays usable") {
    mpi_communicator comm;
    const int P = comm.size(), me = comm.rank();
    const std::size_t E = 3 * static_cast<std::size_t>(P), k = 2;
    const moe_exchange_case c(9601, E, k, 64, 32, tokens_of(P));
    {  // an expert index out of range on rank 0
        std::vector<std::int32_t> idx(c.idx.begin() + static_cast<std::ptrdiff_t>(c.begin[me] * k),
                                      c.idx.begin() + static_cast<std::ptrdiff_t>((c.begin[me] + c.tokens[me]) * k));
        if (me == 0) idx[0] = static_cast<std::int32_t>(E);
        dispatch_plan plan(c.tokens[me], k, E);
        moe_exchange xch(P, me, E);
        CHECK_THROWS_AS(moe_dispatch_plan_host(comm, matrix_ref<const std::int32_t>(idx.data(), c.tokens[me], k), {},
                                               plan.ref(), xch.ref()),
                        octet::error);
    }
    {  // another expert count on the last rank
        const std::size_t e = me == P - 1 ? E + static_cast<std::size_t>(P) : E;
        dispatch_plan plan(c.tokens[me], k, e);
        moe_exchange xch(P, me, e);
        CHECK_THROWS_AS(moe_dispatch_plan_host(comm, c.idx_of(me), {}, plan.ref(), xch.ref()), octet::error);
    }
    comm.barrier();  // still usable
}
