// The expert-parallel MoE exchange over NCCL (comm/nccl_moe.cuh). Suite "gpu" needs a device and runs
// one rank per visible GPU (up to 4) from one process, each rank on its own thread, and checks every
// rank's results against the host exchange (nn/moe_exchange.hpp) run on the same inputs over the
// in-process transport (tests/support/moe_exchange_case.hpp: ragged tokens, a rank without any, one
// expert masked out, with and without a capacity):
//   * moe_dispatch_plan: the plan and the exchange record equal the host's;
//   * moe_dispatch: the received grouped copy (codes, scales, padding) bit for bit the host's;
//   * moe_dispatch_rows: the plan's rows of X sent as rows (the backward's path), bit for bit the host's;
//   * moe_combine: out and the returned rows bit for bit the host's, bf16 and f32 wires; the E4M3 wire
//     and an expert count that differs on one rank make every rank throw octet::error.
// Suite "cuda" runs anywhere: the header's entries compile for the recipes the layer uses.
// On a machine with one GPU the world is one rank: the kernels, the self send / receive and the
// agreement still run. UNVERIFIED until a GPU (two for NCCL) has run it.
#include <doctest/doctest.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "octet/comm/nccl_moe.cuh"
#include "octet/cuda/buffer.cuh"
#include "support/in_process_world.hpp"
#include "support/moe_exchange_case.hpp"

namespace nn_moe_nccl_test {
using namespace octet;
using octet_test::moe_x_recipe;

struct world {
    int P = 0;
    std::vector<ncclComm_t> comms;
    std::vector<cudaStream_t> streams;
    explicit world(int devices)
        : P(devices), comms(static_cast<std::size_t>(devices)), streams(static_cast<std::size_t>(devices)) {
        std::vector<int> ids(static_cast<std::size_t>(devices));
        for (int d = 0; d < devices; ++d) ids[d] = d;
        REQUIRE(ncclCommInitAll(comms.data(), devices, ids.data()) == ncclSuccess);
        for (int d = 0; d < devices; ++d) {
            cudaSetDevice(d);
            cudaStreamCreate(&streams[d]);
        }
    }
    ~world() {
        for (int d = 0; d < P; ++d) {
            cudaSetDevice(d);
            cudaStreamDestroy(streams[d]);
            ncclCommDestroy(comms[d]);
        }
    }
    /// Runs fn(rank) on one thread per rank; returns each rank's exception text ("" if none).
    template <class Fn>
    std::vector<std::string> run(Fn&& fn) {
        std::vector<std::string> errors(static_cast<std::size_t>(P));
        std::vector<std::thread> threads;
        for (int r = 0; r < P; ++r)
            threads.emplace_back([&, r] {
                cudaSetDevice(r);
                try {
                    fn(r);
                } catch (const std::exception& e) {
                    errors[r] = e.what();
                    if (errors[r].empty()) errors[r] = "?";
                }
            });
        for (auto& t : threads) t.join();
        return errors;
    }
};

int device_count() {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) return 0;
    return std::min(c, 4);
}

std::vector<std::size_t> tokens_of(int P) {
    std::vector<std::size_t> t;
    for (int r = 0; r < P; ++r) t.push_back(r == 1 ? 0 : 17 + 13 * static_cast<std::size_t>(r));
    return t;
}

template <class T>
std::vector<T> download(const T* p, std::size_t n) {
    std::vector<T> v(n);
    if (n) REQUIRE(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return v;
}

/// What one NCCL rank got, downloaded.
struct nccl_rank {
    std::vector<std::size_t> recv_counts, expert_rows, group_offsets;
    std::vector<std::uint8_t> xe_data, xe_scales, rows_data, rows_scales;
    std::vector<float> out, returned;
};

void check_case(world& w, moe_combine_wire wire, const dispatch_options& dopt, std::uint64_t salt) {
    const int P = w.P;
    const std::size_t E = 3 * static_cast<std::size_t>(P), k = 3, d = 200, N = 136;
    const octet_test::moe_exchange_case c(salt, E, k, d, N, tokens_of(P), {2});
    moe_exchange_options opt;
    opt.combine_wire = wire;
    opt.expected_ranks = P;
    opt.executor = on_host(1);
    std::vector<octet_test::moe_rank_run> sim(static_cast<std::size_t>(P));
    octet_test::on_world_or_throw(
        P, [&](int r, octet_test::in_process_transport& t) { octet_test::run_moe_rank(t, c, sim[r], opt, dopt); });
    // the backward's path on the host: the plan's rows of X (gathered in plan order) sent as rows
    std::vector<quantized_tensor<moe_x_recipe>> plan_rows(static_cast<std::size_t>(P));
    std::vector<grouped_quantized_tensor<moe_x_recipe>> host_rows(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) {
        const dispatch_plan_ref pr = sim[r].plan.ref();
        std::vector<float> xr(pr.rows() * d);
        for (std::size_t i = 0; i < pr.rows(); ++i)
            std::memcpy(xr.data() + i * d, c.x.data() + (c.begin[r] + pr.token_of_row(i)) * d, d * sizeof(float));
        plan_rows[r] = quantized_tensor<moe_x_recipe>(pr.rows(), d);
        if (pr.rows())
            quantize<moe_x_recipe>(on_host(), matrix_ref<const float>(xr.data(), pr.rows(), d), plan_rows[r].ref());
        host_rows[r] = octet_test::poisoned_groups(sim[r].xch.ref().expert_rows, d);
    }
    octet_test::on_world_or_throw(P, [&](int r, octet_test::in_process_transport& t) {
        moe_dispatch_rows_host(t, plan_rows[r].cref(), sim[r].plan.ref(), sim[r].xch.ref(), host_rows[r].ref(), opt);
    });

    std::vector<nccl_rank> got(static_cast<std::size_t>(P));
    const auto errors = w.run([&](int r) {
        nccl_communicator comm(w.comms[r], w.streams[r]);
        const stream_executor ex = on_stream(w.streams[r]);
        const std::size_t Tr = c.tokens[r];
        dispatch_plan plan(Tr, k, E);
        moe_exchange xch(P, r, E);
        moe_dispatch_plan(comm, ex, c.idx_of(r), dopt, plan.ref(), xch.ref(), opt);
        got[r].recv_counts.assign(xch.ref().recv_counts.begin(), xch.ref().recv_counts.end());
        got[r].expert_rows.assign(xch.ref().expert_rows.begin(), xch.ref().expert_rows.end());
        got[r].group_offsets.assign(plan.ref().group_offsets.begin(), plan.ref().group_offsets.end());
        // X's quantized rows (the host's bytes) on the device
        const quant_layout lx = sim[r].xq.layout();
        const auto xd = sim[r].xq.cref();
        cuda::device_buffer<std::uint8_t> x_data(std::vector<std::uint8_t>(xd.data, xd.data + lx.data_bytes)),
            x_scales(std::vector<std::uint8_t>(xd.scales, xd.scales + lx.scale_bytes));
        const quantized_ref<moe_x_recipe> xq(x_data.data(), x_scales.data(), lx, nullptr);
        const grouped_layout gl = make_grouped_layout<moe_x_recipe>(grouped_rows(xch.ref().expert_rows, d));
        cuda::device_buffer<std::uint8_t> xe_data(std::vector<std::uint8_t>(gl.data_bytes, 0xAB)),
            xe_scales(std::vector<std::uint8_t>(gl.scale_bytes, 0xCD));
        const grouped_quantized_ref<moe_x_recipe> xe(xe_data.data(), xe_scales.data(), nullptr, gl);
        moe_dispatch(comm, ex, xq, plan.ref(), xch.ref(), xe, opt);
        got[r].xe_data = xe_data.download();
        got[r].xe_scales = xe_scales.download();
        // the rows path
        const quant_layout lr = plan_rows[r].layout();
        const auto pr = plan_rows[r].cref();
        cuda::device_buffer<std::uint8_t> r_data(std::vector<std::uint8_t>(pr.data, pr.data + lr.data_bytes)),
            r_scales(std::vector<std::uint8_t>(pr.scales, pr.scales + lr.scale_bytes));
        cuda::device_buffer<std::uint8_t> re_data(std::vector<std::uint8_t>(gl.data_bytes, 0xAB)),
            re_scales(std::vector<std::uint8_t>(gl.scale_bytes, 0xCD));
        moe_dispatch_rows(comm, ex, quantized_ref<moe_x_recipe>(r_data.data(), r_scales.data(), lr, nullptr),
                          plan.ref(), xch.ref(),
                          grouped_quantized_ref<moe_x_recipe>(re_data.data(), re_scales.data(), nullptr, gl), opt);
        got[r].rows_data = re_data.download();
        got[r].rows_scales = re_scales.download();
        // the combine: the host's expert outputs y
        const std::size_t M = xch.ref().rows(), rows = plan.ref().rows();
        cuda::device_buffer<float> y(sim[r].y.empty() ? std::vector<float>(1, 0.0f) : sim[r].y),
            wts(std::vector<float>(c.w.begin() + static_cast<std::ptrdiff_t>(c.begin[r] * k),
                                   c.w.begin() + static_cast<std::ptrdiff_t>((c.begin[r] + Tr) * k))),
            out(std::vector<float>(Tr * N + 1, -9.0f)), returned(std::vector<float>(rows * N + 1, -11.0f));
        moe_exchange_options keep = opt;
        keep.returned = matrix_ref<float>(returned.data(), rows, N);
        moe_combine(comm, ex, matrix_ref<const float>(y.data(), M, N), matrix_ref<const float>(wts.data(), Tr, k),
                    plan.ref(), xch.ref(), matrix_ref<float>(out.data(), Tr, N), keep);
        got[r].out = download(out.data(), Tr * N);
        got[r].returned = download(returned.data(), rows * N);
    });
    for (int r = 0; r < P; ++r) {
        CAPTURE(r);
        CAPTURE(static_cast<int>(wire));
        REQUIRE(errors[r] == "");
        const auto xr = sim[r].xch.ref();
        CHECK(got[r].recv_counts == std::vector<std::size_t>(xr.recv_counts.begin(), xr.recv_counts.end()));
        CHECK(got[r].expert_rows == std::vector<std::size_t>(xr.expert_rows.begin(), xr.expert_rows.end()));
        const auto pr = sim[r].plan.ref();
        CHECK(got[r].group_offsets == std::vector<std::size_t>(pr.group_offsets.begin(), pr.group_offsets.end()));
        const grouped_layout& l = sim[r].xe.layout();
        const auto xe = sim[r].xe.cref();
        CHECK(got[r].xe_data == std::vector<std::uint8_t>(xe.data, xe.data + l.data_bytes));
        CHECK(got[r].xe_scales == std::vector<std::uint8_t>(xe.scales, xe.scales + l.scale_bytes));
        const auto he = host_rows[r].cref();
        CHECK(got[r].rows_data == std::vector<std::uint8_t>(he.data, he.data + l.data_bytes));
        CHECK(got[r].rows_scales == std::vector<std::uint8_t>(he.scales, he.scales + l.scale_bytes));
        CHECK(got[r].out.size() == sim[r].out.size());
        CHECK((got[r].out.empty() ||
               std::memcmp(got[r].out.data(), sim[r].out.data(), got[r].out.size() * sizeof(float)) == 0));
        CHECK((got[r].returned.empty() || std::memcmp(got[r].returned.data(), sim[r].returned.data(),
                                                      got[r].returned.size() * sizeof(float)) == 0));
    }
}

}  // namespace nn_moe_nccl_test

TEST_SUITE("gpu") {
    TEST_CASE("nccl moe exchange equals the host exchange bit for bit (plan, dispatch, rows, combine)") {
        using namespace nn_moe_nccl_test;
        const int P = device_count();
        REQUIRE(P >= 1);
        world w(P);
        dispatch_options capped;
        capped.capacity = 4;
        for (const moe_combine_wire wire : {moe_combine_wire::bf16, moe_combine_wire::f32}) {
            check_case(w, wire, {}, 9701);
            check_case(w, wire, capped, 9702);
        }
    }

    TEST_CASE("nccl moe exchange: the E4M3 combine wire and a mismatched expert count stop every rank") {
        using namespace nn_moe_nccl_test;
        const int P = device_count();
        REQUIRE(P >= 1);
        world w(P);
        const std::size_t E = 3 * static_cast<std::size_t>(P), k = 2, d = 64, N = 32;
        const octet_test::moe_exchange_case c(9801, E, k, d, N, tokens_of(P));
        auto errors = w.run([&](int r) {
            nccl_communicator comm(w.comms[r], w.streams[r]);
            const stream_executor ex = on_stream(w.streams[r]);
            dispatch_plan plan(c.tokens[r], k, E);
            moe_exchange xch(P, r, E);
            moe_dispatch_plan(comm, ex, c.idx_of(r), {}, plan.ref(), xch.ref());
            const std::size_t M = xch.ref().rows(), Tr = c.tokens[r];
            cuda::device_buffer<float> y(std::vector<float>(M * N + 1, 1.0f)),
                wts(std::vector<float>(Tr * k + 1, 0.5f)), out(std::vector<float>(Tr * N + 1, 0.0f));
            moe_exchange_options o;
            o.combine_wire = moe_combine_wire::e4m3_1x128;
            moe_combine(comm, ex, matrix_ref<const float>(y.data(), M, N), matrix_ref<const float>(wts.data(), Tr, k),
                        plan.ref(), xch.ref(), matrix_ref<float>(out.data(), Tr, N), o);
        });
        for (int r = 0; r < P; ++r) {
            CAPTURE(r);
            CHECK(errors[r].find("octet::moe_combine") != std::string::npos);
        }
        CHECK(errors[0].find("e4m3_1x128") != std::string::npos);
        if (P > 1) {  // rank P - 1 plans over other experts
            errors = w.run([&](int r) {
                nccl_communicator comm(w.comms[r], w.streams[r]);
                const std::size_t e = r == P - 1 ? 2 * E : E;
                dispatch_plan plan(c.tokens[r], k, e);
                moe_exchange xch(P, r, e);
                moe_dispatch_plan(comm, on_stream(w.streams[r]), c.idx_of(r), {}, plan.ref(), xch.ref());
            });
            for (int r = 0; r < P; ++r) CHECK(errors[r].find("octet::moe_dispatch_plan_host") != std::string::npos);
        }
    }
}

TEST_SUITE("cuda") {
    TEST_CASE("nccl moe exchange: the entries compile for the layer's recipes") {
        // Only the declarations are checked here (no device): the gpu suite runs them.
        using namespace octet;
        using D = moe_exchange_report (*)(nccl_communicator&, const stream_executor&,
                                          quantized_ref<recipes::blockwise_1x128, const std::uint8_t>,
                                          const dispatch_plan_ref&, const moe_exchange_ref&,
                                          grouped_quantized_ref<recipes::blockwise_1x128>, const moe_exchange_options&);
        const D dispatch = &moe_dispatch<recipes::blockwise_1x128, nccl_communicator, const std::uint8_t>;
        const D rows = &moe_dispatch_rows<recipes::blockwise_1x128, nccl_communicator, const std::uint8_t>;
        using C = moe_exchange_report (*)(nccl_communicator&, const stream_executor&, matrix_ref<const float>,
                                          matrix_ref<const float>, const dispatch_plan_ref&, const moe_exchange_ref&,
                                          matrix_ref<bf16>, const moe_exchange_options&);
        const C combine = &moe_combine<nccl_communicator, const float, bf16>;
        const std::uintptr_t taken[] = {reinterpret_cast<std::uintptr_t>(dispatch),
                                        reinterpret_cast<std::uintptr_t>(rows),
                                        reinterpret_cast<std::uintptr_t>(combine)};
        for (const std::uintptr_t p : taken) CHECK(p != 0);
    }
}
