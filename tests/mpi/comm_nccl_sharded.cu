// The sharded-training building blocks over NCCL (comm/nccl_sharded.cuh). Suite "cuda" runs
// anywhere (scratch queries); suite "gpu" needs a device and runs one rank per visible GPU (up to
// 4) from one process, each rank on its own thread, and checks every rank's result against the host
// versions (comm/sharded.hpp) run on the same inputs over the in-process transport:
//   * compressed_reduce_scatter: out_shard bit for bit compressed_reduce_scatter_host's, and with
//     error feedback the residual after the call too; every wire format, both transforms,
//     stochastic rounding, ragged sizes;
//   * quantized_allgather<R>: codes, scales and the tensor scale bit for bit
//     quantized_allgather_host's (itself quantize<R> of the whole matrix); per tensor (a NaN on one
//     rank, under both non-finite policies), 1x128, 128x128, MXFP8, NVFP4; uneven and empty shards;
//   * quantized_allgather<R> with out_t (beside out, or alone): W^T's copy bit for bit the host
//     version's (itself quantize<R>'s columnwise output); per tensor, 1x128, 128x128, MXFP8, NVFP4;
//   * bad input (a corrupted message, mismatched cols) raises octet::error on every rank.
// On a machine with one GPU the world is one rank: the kernels, the self send/receive, the
// validation and the broadcasts still run. UNVERIFIED until a GPU (two for NCCL) has run it.
#include <doctest/doctest.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "octet/comm/in_process.hpp"
#include "octet/comm/nccl_sharded.cuh"
#include "octet/comm/sharded.hpp"
#include "octet/cuda/buffer.cuh"
#include "support/in_process_world.hpp"
#include "support/random.hpp"

namespace nccl_sharded_test {
using namespace octet;

std::vector<float> gradient_of(int r, std::size_t n, std::uint64_t salt) {
    auto g = octet_test::rng(salt * 17 + static_cast<std::uint64_t>(r));
    std::student_t_distribution<float> t(3.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = 1e-3f * t(g);
    return v;
}

/// Runs fn(rank, transport) on every rank of an in-process world of P ranks (the host versions).
template <class Fn>
void host_ranks(int P, Fn&& fn) {
    in_process_world w(P);
    std::vector<in_process_transport> ts;
    for (int r = 0; r < P; ++r) ts.emplace_back(w, r);
    std::vector<std::exception_ptr> errors;
    octet_test::on_every_rank(
        P, [&](int r) { fn(r, ts[r]); }, errors);
    for (int r = 0; r < P; ++r) REQUIRE_MESSAGE(!errors[r], "host rank ", r, ": ", octet_test::text_of(errors[r]));
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

/// Rows of a matrix split unevenly over P ranks: rank r gets about (r + 1) parts, the last the
/// rest; with `multiple` > 1 every split falls on a multiple of it; rank 1 (if any) may get none.
std::vector<std::size_t> row_split(std::size_t rows, int P, std::size_t multiple, bool empty_rank) {
    std::vector<std::size_t> m(static_cast<std::size_t>(P), 0);
    const std::size_t units = (rows + multiple - 1) / multiple;
    std::size_t given = 0, weight = 0;
    for (int r = 0; r < P; ++r) weight += static_cast<std::size_t>(r + 1);
    for (int r = 0; r + 1 < P; ++r) {
        if (empty_rank && r == 1) continue;
        const std::size_t u = units * static_cast<std::size_t>(r + 1) / weight;
        m[r] = std::min(rows - given, u * multiple);
        given += m[r];
    }
    m[static_cast<std::size_t>(P) - 1] = rows - given;
    return m;
}

/// The NCCL all-gather of recipe R against the host version, on every rank, bit for bit.
template <class R>
void allgather_case(world& w, std::size_t rows, std::size_t cols, std::uint64_t salt, bool empty_rank,
                    bool nan_on_last = false) {
    const int P = w.P;
    using G = typename R::granularity;
    const std::size_t multiple = G::rows != full && G::rows > 1 ? G::rows : 1;
    const std::vector<std::size_t> m = row_split(rows, P, multiple, empty_rank);
    std::vector<std::vector<float>> x(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) {
        x[r] = gradient_of(r, m[r] * cols, salt);
        for (std::size_t i = 0; i < x[r].size(); i += 97) x[r][i] *= 4096.0f;  // outliers
        if (nan_on_last && r == P - 1 && !x[r].empty()) x[r][x[r].size() / 2] = std::nanf("");
    }
    // The host version over the in-process transport.
    std::vector<quantized_tensor<R>> expect;
    for (int r = 0; r < P; ++r) expect.emplace_back(rows, cols);
    host_ranks(P, [&](int r, in_process_transport& t) {
        quantized_allgather_host(t, on_host(1), matrix_ref<const float>(x[r].data(), m[r], cols), expect[r].ref());
    });
    // The NCCL version.
    std::vector<std::vector<std::uint8_t>> codes(static_cast<std::size_t>(P)), scales(static_cast<std::size_t>(P));
    std::vector<float> tensor_scale(static_cast<std::size_t>(P), -1.0f);
    const quant_layout layout = expect[0].layout();
    const auto errors = w.run([&](int r) {
        nccl_communicator comm(w.comms[r], w.streams[r]);
        const stream_executor ex = on_stream(w.streams[r]);
        cuda::device_buffer<float> xr(x[r]);
        cuda::device_buffer<std::uint8_t> data(std::vector<std::uint8_t>(layout.data_bytes, 0xA5)),
            sc(std::vector<std::uint8_t>(layout.scale_bytes, 0xA5));
        cuda::device_buffer<float> ts(std::vector<float>{-2.0f});
        const quantized_ref<R> out(data.data(), sc.data(), layout, ts.data());
        const auto rep = quantized_allgather<R>(comm, ex, matrix_ref<const float>(xr.data(), m[r], cols), out);
        CHECK(rep.rows == rows);
        codes[r] = data.download();
        scales[r] = sc.download();
        tensor_scale[r] = ts.download()[0];
    });
    for (int r = 0; r < P; ++r) {
        CAPTURE(r);
        CHECK(errors[r] == "");
        // Codes: every stored row's used bytes (the padding of a row is not written by either).
        bool same_codes = true;
        const std::size_t used = (cols * R::format::bits + 7) / 8;
        for (std::size_t i = 0; i < rows && same_codes; ++i)
            same_codes = std::memcmp(codes[r].data() + i * layout.row_bytes,
                                     expect[r].data().data() + i * layout.row_bytes, used) == 0;
        CHECK(same_codes);
        CHECK(scales[r] == expect[r].scales());
        if (R::two_level) {
            const float want = expect[r].tensor_scale();
            CHECK(std::memcmp(&tensor_scale[r], &want, 4) == 0);
        }
    }
}

/// The NCCL all-gather with out_t (and out, or out_t alone) against the host version, bit for bit:
/// x^T's copy from the same gather; the rows split on multiples of x^T's block C.
template <class R>
void allgather_t_case(world& w, std::size_t rows, std::size_t cols, std::uint64_t salt, bool empty_rank,
                      bool with_rowwise) {
    const int P = w.P;
    using G = typename R::granularity;
    const std::size_t multiple = G::cols != full ? G::cols : quant_layout_of<R>::group_codes;
    const std::vector<std::size_t> m = row_split(rows, P, multiple, empty_rank);
    std::vector<std::vector<float>> x(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) {
        x[r] = gradient_of(r, m[r] * cols, salt);
        for (std::size_t i = 0; i < x[r].size(); i += 97) x[r][i] *= 4096.0f;  // outliers
    }
    std::vector<quantized_tensor<R>> expect, expect_t;
    for (int r = 0; r < P; ++r) expect.emplace_back(rows, cols), expect_t.emplace_back(cols, rows);
    host_ranks(P, [&](int r, in_process_transport& t) {
        quantized_allgather_host(t, on_host(1), matrix_ref<const float>(x[r].data(), m[r], cols), expect[r].ref(),
                                 expect_t[r].ref());
    });
    std::vector<std::vector<std::uint8_t>> codes(static_cast<std::size_t>(P)), scales(static_cast<std::size_t>(P));
    std::vector<std::vector<std::uint8_t>> codes_t(static_cast<std::size_t>(P)), scales_t(static_cast<std::size_t>(P));
    std::vector<float> ts_t(static_cast<std::size_t>(P), -1.0f);
    const quant_layout layout = expect[0].layout(), layout_t = expect_t[0].layout();
    const auto errors = w.run([&](int r) {
        nccl_communicator comm(w.comms[r], w.streams[r]);
        const stream_executor ex = on_stream(w.streams[r]);
        cuda::device_buffer<float> xr(x[r]);
        cuda::device_buffer<std::uint8_t> data(std::vector<std::uint8_t>(layout.data_bytes, 0xA5)),
            sc(std::vector<std::uint8_t>(layout.scale_bytes, 0xA5)),
            data_t(std::vector<std::uint8_t>(layout_t.data_bytes, 0xA5)),
            sc_t(std::vector<std::uint8_t>(layout_t.scale_bytes, 0xA5));
        cuda::device_buffer<float> ts(std::vector<float>{-2.0f}), ts_t_dev(std::vector<float>{-2.0f});
        const quantized_ref<R> out =
            with_rowwise ? quantized_ref<R>(data.data(), sc.data(), layout, ts.data()) : quantized_ref<R>{};
        const quantized_ref<R> out_t(data_t.data(), sc_t.data(), layout_t, ts_t_dev.data());
        const auto rep = quantized_allgather<R>(comm, ex, matrix_ref<const float>(xr.data(), m[r], cols), out, out_t);
        CHECK(rep.rows == rows);
        codes[r] = data.download();
        scales[r] = sc.download();
        codes_t[r] = data_t.download();
        scales_t[r] = sc_t.download();
        ts_t[r] = ts_t_dev.download()[0];
    });
    auto same_rows = [](const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b, const quant_layout& l) {
        const std::size_t used = (l.cols * R::format::bits + 7) / 8;  // a row's padding: written by neither
        for (std::size_t i = 0; i < l.rows; ++i)
            if (std::memcmp(a.data() + i * l.row_bytes, b.data() + i * l.row_bytes, used) != 0) return false;
        return true;
    };
    for (int r = 0; r < P; ++r) {
        CAPTURE(r);
        CAPTURE(with_rowwise);
        CHECK(errors[r] == "");
        CHECK(same_rows(codes_t[r], expect_t[r].data(), layout_t));
        CHECK(scales_t[r] == expect_t[r].scales());
        if (R::two_level) {
            const float want = expect_t[r].tensor_scale();
            CHECK(std::memcmp(&ts_t[r], &want, 4) == 0);
        }
        if (with_rowwise) {
            CHECK(same_rows(codes[r], expect[r].data(), layout));
            CHECK(scales[r] == expect[r].scales());
        }
    }
}

}  // namespace nccl_sharded_test

TEST_SUITE("cuda") {
    TEST_CASE("nccl sharded: scratch queries") {
        using namespace octet;
        const codec_config cfg{wire_format::e4m3, transform_kind::hadamard, 1024, 0, 0};
        const stream_executor ex = on_stream();
        const std::size_t a = compressed_reduce_scatter_scratch_bytes(ex, cfg, 1 << 20, 4, 0),
                          b = compressed_reduce_scatter_scratch_bytes(ex, cfg, 1 << 21, 4, 0);
        CHECK(a % 256 == 0);
        CHECK(b > a);
        // The messages sent (the whole gradient encoded) and the P received (about one quarter of it).
        CHECK(a >= encoded_size(cfg, 1 << 20) + encoded_size(cfg, 1 << 18));
        CHECK_THROWS_WITH_AS(compressed_reduce_scatter_scratch_bytes(ex, cfg, 10, 0, 0),
                             doctest::Contains("argument 'world'"), octet::error);
        CHECK_THROWS_WITH_AS(compressed_reduce_scatter_scratch_bytes(ex, cfg, 10, 2, 2),
                             doctest::Contains("argument 'rank'"), octet::error);

        using R = recipes::mxfp8_e4m3;
        const quantized_ref<R> out(nullptr, nullptr, quant_layout_of<R>::make(1000, 256), nullptr);
        const std::size_t q = quantized_allgather_scratch_bytes(ex, matrix_ref<const float>(nullptr, 250, 256), out, 4);
        CHECK(q % 256 == 0);
        CHECK(q >= out.layout.scale_bytes);
        CHECK_THROWS_WITH_AS(quantized_allgather_scratch_bytes(ex, matrix_ref<const float>(nullptr, 250, 256), out, 0),
                             doctest::Contains("argument 'world'"), octet::error);
        // with out_t: the column-wise codes and scales of every rank on top
        const quantized_ref<R> out_t(nullptr, nullptr, quant_layout_of<R>::make(256, 1000), nullptr);
        const std::size_t qt =
            quantized_allgather_scratch_bytes(ex, matrix_ref<const float>(nullptr, 250, 256), out, out_t, 4);
        CHECK(qt % 256 == 0);
        CHECK(qt >= q + 256 * 1000);  // every rank's codes of x^T, a byte each
    }
}

TEST_SUITE("gpu") {
    TEST_CASE("nccl reduce-scatter equals compressed_reduce_scatter_host bit for bit, with and without feedback") {
        using namespace nccl_sharded_test;
        const int P = device_count();
        REQUIRE(P >= 1);
        world w(P);
        MESSAGE("NCCL world of ", P, " rank(s)");
        std::uint64_t salt = 0;
        for (const wire_format f : {wire_format::e4m3, wire_format::e5m2, wire_format::mxfp8, wire_format::nvfp4})
            for (const bool feedback : {false, true})
                for (const std::size_t n : {std::size_t{1} << 20, std::size_t{100003}, std::size_t{300}}) {
                    ++salt;
                    codec_config cfg;
                    cfg.format = f;
                    cfg.transform = salt % 3 == 0 ? transform_kind::identity : transform_kind::hadamard;
                    cfg.block = salt % 2 ? 1024 : 256;
                    cfg.seed = 5000 + salt;
                    cfg.stochastic = feedback && salt % 2 == 0;
                    const residual_storage st =
                        feedback ? static_cast<residual_storage>(salt % 3) : residual_storage::f32;
                    std::vector<std::vector<float>> g(static_cast<std::size_t>(P)), want(static_cast<std::size_t>(P)),
                        got(static_cast<std::size_t>(P));
                    std::vector<error_feedback> fb;
                    std::vector<std::vector<std::uint8_t>> fb_in(static_cast<std::size_t>(P)),
                        fb_got(static_cast<std::size_t>(P));
                    for (int r = 0; r < P; ++r) {
                        g[r] = gradient_of(r, n, salt);
                        want[r].assign(allreduce_shard(cfg, n, P, r).count, std::nanf(""));
                        // Start from a non-zero residual so that the feedback path is exercised at once.
                        fb.emplace_back(n, st);
                        const std::vector<float> e = gradient_of(r + 100, n, salt);
                        store_residual(fb.back().view(), 0, n, e.data());
                        fb_in[r].assign(fb.back().view().data, fb.back().view().data + fb.back().bytes());
                    }
                    host_ranks(P, [&](int r, in_process_transport& t) {
                        reduce_scatter_options o;
                        o.executor = on_host(1);
                        if (feedback) o.feedback = fb[r].view();
                        compressed_reduce_scatter_host(t, cfg, as_cspan(g[r]), as_span(want[r]), o);
                    });
                    const auto errors = w.run([&](int r) {
                        nccl_communicator comm(w.comms[r], w.streams[r]);
                        const stream_executor ex = on_stream(w.streams[r]);
                        cuda::device_buffer<float> grad(g[r]);
                        cuda::device_buffer<float> out(std::vector<float>(want[r].size(), std::nanf("")));
                        cuda::device_buffer<std::uint8_t> d1(fb_in[r]);
                        reduce_scatter_options o;
                        o.expected_ranks = P;
                        if (feedback) o.feedback = residual_view{st, d1.data(), n};
                        const auto rep = compressed_reduce_scatter(comm, ex, cfg, grad.cview(), out.view(), o);
                        CHECK(rep.shard.count == want[r].size());
                        got[r] = out.download();
                        fb_got[r] = d1.download();
                    });
                    CAPTURE(std::string(wire_format_name(f)));
                    CAPTURE(feedback);
                    CAPTURE(n);
                    for (int r = 0; r < P; ++r) {
                        CHECK(errors[r] == "");
                        REQUIRE(got[r].size() == want[r].size());
                        CHECK(std::memcmp(got[r].data(), want[r].data(), want[r].size() * sizeof(float)) == 0);
                        if (feedback) CHECK(std::memcmp(fb_got[r].data(), fb[r].view().data, fb[r].bytes()) == 0);
                    }
                }
    }

    TEST_CASE("nccl quantized all-gather equals quantized_allgather_host bit for bit") {
        using namespace nccl_sharded_test;
        const int P = device_count();
        REQUIRE(P >= 1);
        world w(P);
        allgather_case<recipes::tensorwise_e4m3>(w, 301, 200, 1, true);
        allgather_case<recipes::tensorwise_e4m3>(w, 77, 64, 2, false, true);  // a NaN: the whole copy NaN
        allgather_case<with_nan_policy<recipes::tensorwise_e4m3, nan_policy::per_element>>(w, 90, 64, 7, true, true);
        allgather_case<recipes::blockwise_1x128>(w, 515, 300, 3, true);
        allgather_case<recipes::blockwise_128x128>(w, 700, 384, 4, false);
        allgather_case<recipes::mxfp8_e4m3>(w, 129, 96, 5, true);
        allgather_case<recipes::nvfp4>(w, 333, 160, 6, false);
    }

    TEST_CASE("nccl quantized all-gather with out_t equals quantized_allgather_host bit for bit") {
        using namespace nccl_sharded_test;
        const int P = device_count();
        REQUIRE(P >= 1);
        world w(P);
        for (const bool with_rowwise : {true, false}) {
            allgather_t_case<recipes::tensorwise_e4m3>(w, 301, 200, 11, true, with_rowwise);
            allgather_t_case<recipes::blockwise_1x128>(w, 515, 300, 12, true, with_rowwise);
            allgather_t_case<recipes::blockwise_128x128>(w, 700, 384, 13, false, with_rowwise);
            allgather_t_case<recipes::mxfp8_e4m3>(w, 129, 96, 14, true, with_rowwise);
            allgather_t_case<recipes::nvfp4>(w, 333, 161, 15, false, with_rowwise);
        }
    }

    TEST_CASE("nccl sharded: bad input raises octet::error on every rank") {
        using namespace nccl_sharded_test;
        const int P = device_count();
        REQUIRE(P >= 1);
        world w(P);
        const codec_config cfg{wire_format::e4m3, transform_kind::hadamard, 1024, 0, 7};
        const std::size_t n = 50000;
        auto attempt = [&](bool corrupt) {
            return w.run([&](int r) {
                nccl_communicator comm(w.comms[r], w.streams[r]);
                cuda::device_buffer<float> grad(gradient_of(r, n, 99));
                cuda::device_buffer<float> out(allreduce_shard(cfg, n, P, r).count);
                reduce_scatter_options o;
                if (corrupt && r == 0)
                    o.tamper = [](int, span<std::uint8_t> m) {
                        OCTET_CUDA_CHECK(cudaMemset(m.data() + m.size() - 24, 0x5A, 1));
                    };
                compressed_reduce_scatter(comm, on_stream(w.streams[r]), cfg, grad.cview(), out.view(), o);
            });
        };
        auto errors = attempt(true);
        for (int r = 0; r < P; ++r) CHECK(errors[r].find("invalid") != std::string::npos);
        errors = attempt(false);
        for (int r = 0; r < P; ++r) CHECK(errors[r] == "");

        // out_shard of the wrong size on the last rank: every rank stops before any data moves.
        errors = w.run([&](int r) {
            nccl_communicator comm(w.comms[r], w.streams[r]);
            cuda::device_buffer<float> grad(gradient_of(r, n, 98));
            cuda::device_buffer<float> out(allreduce_shard(cfg, n, P, r).count + (r == P - 1 ? 1 : 0));
            compressed_reduce_scatter(comm, on_stream(w.streams[r]), cfg, grad.cview(), out.view());
        });
        for (int r = 0; r < P; ++r) CHECK(errors[r].find("failed validation") != std::string::npos);

        // The all-gather with cols that differ on the last rank (one rank: out's shape is wrong).
        using R = recipes::blockwise_1x128;
        errors = w.run([&](int r) {
            nccl_communicator comm(w.comms[r], w.streams[r]);
            const std::size_t cols = r == P - 1 ? 130 : 128;
            cuda::device_buffer<float> x(gradient_of(r, 4 * cols, 97));
            const quant_layout l = quant_layout_of<R>::make(4 * static_cast<std::size_t>(P), 128);
            cuda::device_buffer<std::uint8_t> data(l.data_bytes), sc(l.scale_bytes);
            quantized_allgather<R>(comm, on_stream(w.streams[r]), matrix_ref<const float>(x.data(), 4, cols),
                                   quantized_ref<R>(data.data(), sc.data(), l));
        });
        for (int r = 0; r < P; ++r) CHECK(errors[r].find("octet::quantized_allgather") != std::string::npos);
    }
}
