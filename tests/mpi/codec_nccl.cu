// The compressed all-reduce over NCCL (comm/nccl.cuh). Suite "cuda" runs anywhere (workspace
// sizes); suite "gpu" needs a device and runs one rank per visible GPU (up to 4) from one process,
// each rank on its own thread:
//   * the result equals a single-process host simulation of the algorithm with the host codec
//     (comm/allreduce.hpp's steps), bit for bit, on every rank; with two-stage error feedback the
//     residuals after the call equal the host's too; ragged sizes, every format;
//   * a corrupted stage-1 message and a too-small workspace raise octet::error on every rank
//     (nothing hangs: CTest's timeout would catch it), and the communicator still works afterwards.
// On a machine with one GPU the world is one rank: the kernels, the self send/receive, the
// validation and the all-gather still run.
#include <doctest/doctest.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "octet/comm/nccl.cuh"
#include "octet/cuda/buffer.cuh"
#include "support/random.hpp"

namespace codec_nccl_test {
using namespace octet;

std::vector<float> gradient_of(int r, std::size_t n, std::uint64_t salt) {
    auto g = octet_test::rng(salt * 17 + static_cast<std::uint64_t>(r));
    std::student_t_distribution<float> t(3.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = 1e-3f * t(g);
    return v;
}

/// The algorithm on the host: results, and the residuals each rank keeps (stage 1: n, stage 2: its shard).
struct host_run {
    std::vector<float> result;
    std::vector<std::vector<std::uint8_t>> fb1, fb2;
};
host_run simulate(const codec_config& cfg, const std::vector<std::vector<float>>& g, bool feedback, residual_storage st,
                  const std::vector<std::vector<std::uint8_t>>& fb1_in,
                  const std::vector<std::vector<std::uint8_t>>& fb2_in) {
    const int P = static_cast<int>(g.size());
    const std::size_t n = g[0].size();
    host_run h;
    h.result.assign(n, 0.0f);
    h.fb1 = fb1_in;
    h.fb2 = fb2_in;
    for (int s = 0; s < P; ++s) {
        const shard_range sh = allreduce_shard(cfg, n, P, s);
        const std::size_t bytes = encoded_size(cfg, sh.count);
        std::vector<float> y(transform_length(cfg.transform, sh.count, cfg.block));
        for (int r = 0; r < P; ++r) {
            std::vector<std::uint8_t> m(bytes);
            encode_options eo;
            eo.first_index = sh.begin;
            eo.random_stream = 1 + static_cast<std::uint64_t>(r);
            if (feedback) eo.feedback = residual_view{st, h.fb1[r].data(), n}.subrange(sh.begin, sh.count);
            encode_gradient(on_host(1), cfg, span<const float>(g[r].data() + sh.begin, sh.count), m, eo);
            decode_gradient_transformed(on_host(1), m, y, r > 0);
        }
        std::vector<std::uint8_t> red(bytes);
        encode_options eo;
        eo.first_index = sh.begin;
        if (feedback) eo.feedback = residual_view{st, h.fb2[s].data(), sh.count};
        encode_gradient_transformed(on_host(1), cfg, y, sh.count, red, eo);
        decode_gradient(on_host(1), red, span<float>(h.result.data() + sh.begin, sh.count));
    }
    return h;
}

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

}  // namespace codec_nccl_test

TEST_SUITE("cuda") {
    TEST_CASE("nccl all-reduce: workspace sizes") {
        using namespace octet;
        const codec_config cfg{wire_format::e4m3, transform_kind::hadamard, 1024, 0, 0};
        const std::size_t a = compressed_allreduce_workspace(cfg, 1 << 20, 4),
                          b = compressed_allreduce_workspace(cfg, 1 << 21, 4);
        CHECK(a % 256 == 0);
        CHECK(b > a);
        // Stage-1 messages, P received, the reduced coordinates and P gather slots: about 2.3 x the
        // encoded gradient plus 4 bytes per shard coordinate.
        CHECK(a >= 2 * encoded_size(cfg, 1 << 20));
        CHECK_THROWS_WITH_AS(compressed_allreduce_workspace(cfg, 10, 0), doctest::Contains("argument 'world'"),
                             octet::error);
    }
}

TEST_SUITE("gpu") {
    TEST_CASE("nccl all-reduce equals the host path bit for bit, with and without error feedback") {
        using namespace codec_nccl_test;
        const int P = device_count();
        REQUIRE(P >= 1);
        world w(P);
        MESSAGE("NCCL world of ", P, " rank(s)");
        std::uint64_t salt = 0;
        for (const wire_format f : {wire_format::e4m3, wire_format::e5m2, wire_format::mxfp8, wire_format::nvfp4})
            for (const bool feedback : {false, true})
                for (const std::size_t n : {std::size_t{1} << 20, std::size_t{100003}, std::size_t{300}}) {
                    ++salt;
                    const codec_config cfg{f, transform_kind::hadamard, 1024, 0, 1000 + salt, feedback};
                    const residual_storage st =
                        feedback ? static_cast<residual_storage>(salt % 3) : residual_storage::f32;
                    std::vector<std::vector<float>> g(static_cast<std::size_t>(P));
                    std::vector<std::vector<std::uint8_t>> fb1(static_cast<std::size_t>(P)),
                        fb2(static_cast<std::size_t>(P));
                    for (int r = 0; r < P; ++r) {
                        g[r] = gradient_of(r, n, salt);
                        // Start from non-zero residuals so that the feedback path is exercised at once.
                        error_feedback a(n, st), b(allreduce_shard(cfg, n, P, r).count, st);
                        const std::vector<float> e = gradient_of(r + 100, n, salt);
                        store_residual(a.view(), 0, n, e.data());
                        store_residual(b.view(), 0, b.size(), e.data());
                        fb1[r].assign(a.view().data, a.view().data + a.bytes());
                        fb2[r].assign(b.view().data, b.view().data + b.bytes());
                    }
                    const host_run expect = simulate(cfg, g, feedback, st, fb1, fb2);
                    std::vector<std::vector<float>> got(static_cast<std::size_t>(P));
                    std::vector<std::vector<std::uint8_t>> got1(static_cast<std::size_t>(P)),
                        got2(static_cast<std::size_t>(P));
                    const auto errors = w.run([&](int r) {
                        nccl_communicator comm(w.comms[r], w.streams[r]);
                        cuda::device_buffer<float> data(g[r]);
                        cuda::device_buffer<std::uint8_t> ws(compressed_allreduce_workspace(cfg, n, P));
                        cuda::device_buffer<std::uint8_t> d1(fb1[r]), d2(fb2[r]);
                        allreduce_options opt;
                        if (feedback) {
                            opt.feedback = residual_view{st, d1.data(), n};
                            opt.reduced_feedback = residual_view{st, d2.data(), allreduce_shard(cfg, n, P, r).count};
                        }
                        compressed_allreduce_synchronizing(comm, cfg, data.view(), ws.view(), opt);
                        got[r] = data.download();
                        got1[r] = d1.download();
                        got2[r] = d2.download();
                    });
                    CAPTURE(std::string(wire_format_name(f)));
                    CAPTURE(feedback);
                    CAPTURE(n);
                    for (int r = 0; r < P; ++r) {
                        CHECK(errors[r] == "");
                        CHECK(std::memcmp(got[r].data(), expect.result.data(), n * sizeof(float)) == 0);
                        if (feedback) {
                            CHECK(got1[r] == expect.fb1[r]);
                            CHECK(got2[r] == expect.fb2[r]);
                        }
                    }
                }
    }

    TEST_CASE("nccl all-reduce: bad input raises octet::error on every rank") {
        using namespace codec_nccl_test;
        const int P = device_count();
        REQUIRE(P >= 1);
        world w(P);
        const codec_config cfg{wire_format::e4m3, transform_kind::hadamard, 1024, 0, 7};
        const std::size_t n = 50000;
        auto attempt = [&](bool corrupt, bool small_workspace) {
            return w.run([&](int r) {
                nccl_communicator comm(w.comms[r], w.streams[r]);
                cuda::device_buffer<float> data(gradient_of(r, n, 99));
                const std::size_t need = compressed_allreduce_workspace(cfg, n, P);
                cuda::device_buffer<std::uint8_t> ws(small_workspace && r == P - 1 ? need / 2 : need);
                allreduce_options opt;
                if (corrupt && r == 0)
                    opt.tamper = [](int, span<std::uint8_t> m) {
                        OCTET_CUDA_CHECK(cudaMemset(m.data() + m.size() - 24, 0x5A, 1));
                    };
                compressed_allreduce_synchronizing(comm, cfg, data.view(), ws.view(), opt);
            });
        };
        auto errors = attempt(true, false);
        for (int r = 0; r < P; ++r) CHECK(errors[r].find("invalid") != std::string::npos);
        errors = attempt(false, true);
        for (int r = 0; r < P; ++r) CHECK(errors[r].find("validation") != std::string::npos);
        errors = attempt(false, false);
        for (int r = 0; r < P; ++r) CHECK(errors[r] == "");
    }
}
