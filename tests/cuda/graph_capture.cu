// octet-test: timeout=600
//
// A framework can host octet's stream functions: resources travel with the executor and nothing
// blocks the host. Suite "cuda" runs anywhere (argument checks that come before any CUDA call, the
// decode-status texts); suite "gpu" needs a device:
//   * a training step (quantize, scaled GEMM with float and quantized output, attention forward
//     and backward, the AdamW step), with every temporary and every quantized operand from a lent
//     allocator, is captured into a CUDA graph (global capture mode: any hidden synchronization or
//     non-stream-ordered allocation fails the capture) and replayed; the replay's outputs equal the
//     same step run eagerly, bit for bit, and so does a second replay; a case of its own captures
//     with octet's default allocator (cudaMallocAsync nodes in the graph). The attention problem
//     keeps every sequence within one 64-key tile, so each dQ element gets exactly one atomic add
//     and the backward is deterministic;
//   * the lent allocator sees every request on the executor's stream, gets every byte back, and
//     the scratch queries (quantize_scratch_bytes, scaled_gemm_scratch_bytes) equal what the calls
//     request.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "octet/attention/attention.cuh"
#include "octet/codec/codec.cuh"
#include "octet/cuda/buffer.cuh"
#include "octet/cuda/quantized_tensor.cuh"
#include "octet/gemm/scaled_gemm.cuh"
#include "octet/optim/adamw.cuh"
#include "octet/quant/quantize.cuh"
#include "support/random.hpp"

namespace graph_capture_test {
using namespace octet;

using R128 = recipes::blockwise_1x128;  // GEMM operands (one-pass quantizer: no scratch)
using RT = recipes::tensorwise_e4m3;    // quantized GEMM output (global path: scratch)
using RR = recipes::rowwise_e4m3;       // attention operands (blocks span whole heads; global path)
using MC = state_codec::bf16_stochastic;
using VC = state_codec::dynamic8;
using MW = master::bf16_stochastic;

/// A bump arena lent as the executor's allocator: stream-ordered trivially (addresses are never
/// reused while it lives), so a captured graph may keep them. Counts what octet asks of it.
struct arena {
    cuda::device_buffer<std::uint8_t> mem;
    cudaStream_t expected_stream = nullptr;
    std::size_t used = 0, requested = 0;
    int live = 0, requests = 0;
    bool wrong_stream = false, wrong_size = false;
    std::vector<std::pair<void*, std::size_t>> given;

    arena(std::size_t bytes, cudaStream_t s) : mem(bytes), expected_stream(s) {}
    static void* allocate(void* ctx, std::size_t bytes, cudaStream_t s) {
        auto* a = static_cast<arena*>(ctx);
        a->wrong_stream |= s != a->expected_stream;
        const std::size_t r = (bytes + 255) / 256 * 256;
        if (bytes == 0 || a->used + r > a->mem.size()) return nullptr;
        void* p = a->mem.data() + a->used;
        a->used += r;
        a->requested += r;
        ++a->live;
        ++a->requests;
        a->given.emplace_back(p, bytes);
        return p;
    }
    static void deallocate(void* ctx, void* p, std::size_t bytes, cudaStream_t s) {
        auto* a = static_cast<arena*>(ctx);
        a->wrong_stream |= s != a->expected_stream;
        bool found = false;
        for (const auto& g : a->given) found |= g.first == p && g.second == bytes;
        a->wrong_size |= !found;
        --a->live;
    }
    device_allocator lend() { return device_allocator{this, &arena::allocate, &arena::deallocate}; }
};

template <class T>
std::vector<unsigned char> bytes_of(const cuda::device_buffer<T>& b) {
    const std::vector<T> h = b.download();
    std::vector<unsigned char> out(h.size() * sizeof(T));
    if (!h.empty()) std::memcpy(out.data(), h.data(), out.size());
    return out;
}

std::vector<float> normal(std::mt19937_64& g, std::size_t n, float sigma) {
    std::normal_distribution<float> d(0.0f, sigma);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

/// The step's inputs, outputs and optimizer state (device memory owned by the test).
struct problem {
    // GEMM: D (M x N) = X W^T; D is also the gradient of an M*N-element parameter vector.
    static constexpr std::size_t M = 64, N = 128, K = 256;
    // Attention: two sequences of 48 and 64 tokens, 2 query heads over 1 key/value head, d = 64.
    static constexpr int Hq = 2, Hk = 1, D = 64;
    std::vector<std::int32_t> cu{0, 48, 112};
    static constexpr std::size_t T = 112;

    cuda::device_buffer<float> x, w, q_in, k_in, v_in, do_in;
    cuda::device_buffer<std::int32_t> dcu;
    // outputs
    cuda::device_buffer<float> d, dq_amax, o, lse, gq, gk, gv, workspace;
    cuda::device_buffer<std::uint8_t> dq_codes, dq_scale;
    cuda::device_buffer<attention_stats> astats;
    cuda::device_buffer<adamw_report> report;
    // optimizer state, restored before every run
    adamw_state<MC, VC, MW> initial;
    cuda::device_buffer<typename MW::weight_type> params;
    cuda::device_buffer<typename MW::comp_type> comp;
    cuda::device_buffer<typename MC::code_type> m_codes;
    cuda::device_buffer<typename MC::meta_type> m_meta;
    cuda::device_buffer<typename VC::code_type> v_codes;
    cuda::device_buffer<typename VC::meta_type> v_meta;

    attention_shape shape() const {
        attention_shape s;
        s.cu_seqlens_q = span<const std::int32_t>(cu.data(), cu.size());
        s.heads_q = Hq;
        s.heads_kv = Hk;
        s.head_dim = D;
        s.device_cu_seqlens_q = dcu.data();
        return s;
    }

    explicit problem(std::mt19937_64& g)
        : x(normal(g, M * K, 1.0f)),
          w(normal(g, N * K, 0.05f)),
          q_in(normal(g, T * Hq * D, 1.0f)),
          k_in(normal(g, T * Hk * D, 1.0f)),
          v_in(normal(g, T * Hk * D, 1.0f)),
          do_in(normal(g, T * Hq * D, 0.1f)),
          dcu(cu),
          d(M * N),
          dq_amax(1),
          o(T * Hq * D),
          lse(static_cast<std::size_t>(Hq) * T),
          gq(T * Hq * D),
          gk(T * Hk * D),
          gv(T * Hk * D),
          workspace(attention_backward_workspace_for(shape()).floats),
          dq_codes(quant_layout_of<RT>::make(M, N).data_bytes),
          dq_scale(quant_layout_of<RT>::make(M, N).scale_bytes),
          astats(1),
          report(1),
          initial(M * N) {
        initial.set_params(as_cspan(normal(g, M * N, 0.5f)));
        params = cuda::device_buffer<typename MW::weight_type>(initial.params);
        comp = cuda::device_buffer<typename MW::comp_type>(initial.compensation);
        m_codes = cuda::device_buffer<typename MC::code_type>(initial.m_codes);
        m_meta = cuda::device_buffer<typename MC::meta_type>(initial.m_meta);
        v_codes = cuda::device_buffer<typename VC::code_type>(initial.v_codes);
        v_meta = cuda::device_buffer<typename VC::meta_type>(initial.v_meta);
    }

    /// Optimizer state back to its initial bytes, outputs poisoned.
    void reset() {
        params.upload(initial.params);
        if (comp.size()) comp.upload(initial.compensation);
        m_codes.upload(initial.m_codes);
        if (m_meta.size()) m_meta.upload(initial.m_meta);
        v_codes.upload(initial.v_codes);
        if (v_meta.size()) v_meta.upload(initial.v_meta);
        for (auto* b : {&d, &dq_amax, &o, &lse, &gq, &gk, &gv, &workspace}) b->fill_bytes(0xFF);
        dq_codes.fill_bytes(0xFF);
        dq_scale.fill_bytes(0xFF);
        astats.fill_bytes(0xFF);
        report.fill_bytes(0xFF);
    }

    adamw_state_ref<MC, VC, MW> state() {
        return {params.view(), comp.view(), m_codes.view(), m_meta.view(), v_codes.view(), v_meta.view(), 0};
    }

    /// Every output and the optimizer state, as bytes.
    std::vector<std::vector<unsigned char>> results() const {
        return {bytes_of(d),       bytes_of(dq_amax), bytes_of(dq_codes), bytes_of(dq_scale), bytes_of(o),
                bytes_of(lse),     bytes_of(gq),      bytes_of(gk),       bytes_of(gv),       bytes_of(astats),
                bytes_of(report),  bytes_of(params),  bytes_of(comp),     bytes_of(m_codes),  bytes_of(m_meta),
                bytes_of(v_codes), bytes_of(v_meta)};
    }
};

/// One training step on ex: quantize, GEMM (float and quantized output), attention forward and
/// backward, AdamW on the GEMM output as gradient. Quantized operands live in
/// device_quantized_tensors from ex's allocator, created and released inside the step.
void step(const stream_executor& ex, problem& p) {
    constexpr std::size_t M = problem::M, N = problem::N, K = problem::K, T = problem::T;
    constexpr int Hq = problem::Hq, Hk = problem::Hk, D = problem::D;
    cuda::device_quantized_tensor<R128> a(ex, M, K), b(ex, N, K);
    quantize<R128>(ex, matrix_ref<const float>(p.x.data(), M, K), a.ref());
    quantize<R128>(ex, matrix_ref<const float>(p.w.data(), N, K), b.ref());
    scaled_gemm(ex, a.cref(), b.cref(), matrix_ref<float>(p.d.data(), M, N));
    {
        cuda::device_quantized_tensor<RT> dq(ex, M, N);
        scaled_gemm(ex, a.cref(), b.cref(), dq.ref(), {}, p.dq_amax.data());
        OCTET_CUDA_CHECK(cudaMemcpyAsync(p.dq_codes.data(), dq.ref().data, dq.layout().data_bytes,
                                         cudaMemcpyDeviceToDevice, ex.stream));
        OCTET_CUDA_CHECK(cudaMemcpyAsync(p.dq_scale.data(), dq.ref().scales, dq.layout().scale_bytes,
                                         cudaMemcpyDeviceToDevice, ex.stream));
    }
    const std::size_t cq = static_cast<std::size_t>(Hq) * D, ck = static_cast<std::size_t>(Hk) * D;
    cuda::device_quantized_tensor<RR> q(ex, T, cq), k(ex, T, ck), v(ex, T, ck), dout(ex, T, cq);
    quantize<RR>(ex, matrix_ref<const float>(p.q_in.data(), T, cq), q.ref());
    quantize<RR>(ex, matrix_ref<const float>(p.k_in.data(), T, ck), k.ref());
    quantize<RR>(ex, matrix_ref<const float>(p.v_in.data(), T, ck), v.ref());
    quantize<RR>(ex, matrix_ref<const float>(p.do_in.data(), T, cq), dout.ref());
    const attention_shape shape = p.shape();
    const std::size_t rows = static_cast<std::size_t>(Hq) * T;
    attention_forward(ex, shape, q.cref(), k.cref(), v.cref(), matrix_ref<float>(p.o.data(), T, cq),
                      span<float>(p.lse.data(), rows), {attention_mask::causal});
    attention_backward_options bo;
    bo.mask = attention_mask::causal;
    bo.delta = delta_mode::matched;
    bo.telemetry = true;
    attention_backward(ex, shape, q.cref(), k.cref(), v.cref(), matrix_ref<const float>(p.o.data(), T, cq),
                       span<const float>(p.lse.data(), rows), dout.cref(), matrix_ref<float>(p.gq.data(), T, cq),
                       matrix_ref<float>(p.gk.data(), T, ck), matrix_ref<float>(p.gv.data(), T, ck),
                       span<float>(p.workspace.data(), p.workspace.size()), bo, p.astats.data());
    adamw_hyper h;
    h.seed = 1234;
    h.weight_decay = 0.01f;
    adamw_step(ex, p.state(), span<const float>(p.d.data(), M * N), h, 1, 1e-3f, p.report.data());
}

/// Captures step(ex) on ex.stream (global mode) into a graph and instantiates it.
cudaGraphExec_t capture(const stream_executor& ex, problem& p) {
    cudaGraph_t graph = nullptr;
    OCTET_CUDA_CHECK(cudaStreamBeginCapture(ex.stream, cudaStreamCaptureModeGlobal));
    try {
        step(ex, p);
    } catch (...) {
        cudaStreamEndCapture(ex.stream, &graph);
        if (graph) cudaGraphDestroy(graph);
        throw;
    }
    OCTET_CUDA_CHECK(cudaStreamEndCapture(ex.stream, &graph));
    cudaGraphExec_t exec = nullptr;
    OCTET_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    OCTET_CUDA_CHECK(cudaGraphDestroy(graph));
    return exec;
}

}  // namespace graph_capture_test

TEST_SUITE("cuda") {
    TEST_CASE("executor resources: a half-lent allocator is refused; empty scratch asks nothing") {
        using namespace octet;
        device_allocator half;
        half.allocate = [](void*, std::size_t, cudaStream_t) -> void* { return nullptr; };
        CHECK_THROWS_WITH_AS(with_allocator(on_stream(), half), doctest::Contains("argument 'allocator'"),
                             octet::error);
        int calls = 0;
        device_allocator counting{&calls,
                                  [](void* c, std::size_t, cudaStream_t) -> void* {
                                      ++*static_cast<int*>(c);
                                      return nullptr;
                                  },
                                  [](void* c, void*, std::size_t, cudaStream_t) { ++*static_cast<int*>(c); }};
        const stream_executor ex = with_allocator(on_stream(), counting);
        {
            const detail::stream_scratch none(ex, 0);
            CHECK(none.get() == nullptr);
        }
        CHECK(calls == 0);
        // An allocator that cannot serve a request is reported as octet::error, naming it.
        CHECK_THROWS_WITH_AS(detail::stream_scratch(ex, 100), doctest::Contains("executor.allocator"), octet::error);
        CHECK(calls == 1);
    }

    TEST_CASE("the stream attention backward refuses the host-only fold_dq_residual") {
        using namespace octet;
        using R = recipes::rowwise_e4m3;
        attention_shape shape;
        attention_backward_options bo;
        bo.fold_dq_residual = true;
        const quantized_ref<R> none;
        CHECK_THROWS_WITH_AS(
            attention_backward(on_stream(), shape, none, none, none, matrix_ref<const float>(), span<const float>(),
                               none, matrix_ref<float>(), matrix_ref<float>(), matrix_ref<float>(), span<float>(), bo),
            doctest::Contains("argument 'options.fold_dq_residual' is set, but folding the dQ "
                              "residual is host-only"),
            octet::error);
    }

    TEST_CASE("decode statuses turn into the host decoder's errors") {
        using namespace octet;
        CHECK_NOTHROW(check_decode_status(0));
        CHECK(decode_status_message(0).empty());
        for (std::uint32_t s = 1; s <= 4; ++s) {
            CAPTURE(s);
            CHECK_THROWS_WITH_AS(check_decode_status(s, "octet::decode_gradient"),
                                 doctest::Contains("octet::decode_gradient: argument 'message' "), octet::error);
        }
        // The checksum and section texts are the host decoder's own (codec.cuh's synchronizing path).
        CHECK(decode_status_message(static_cast<std::uint32_t>(decode_status::checksum_mismatch)) ==
              "fails its checksum: it was corrupted or truncated in transit");
        CHECK(decode_status_message(static_cast<std::uint32_t>(decode_status::invalid_sections)) ==
              "has an invalid scale or non-zero padding");
    }
}

TEST_SUITE("gpu") {
    TEST_CASE("a training step captured into a CUDA graph replays bit for bit, with a lent allocator") {
        using namespace graph_capture_test;
        auto g = octet_test::rng(7100);
        problem p(g);
        cudaStream_t s = nullptr;
        OCTET_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        struct stream_guard {
            cudaStream_t s;
            ~stream_guard() { cudaStreamDestroy(s); }
        } guard{s};

        // Eager, with a lent arena.
        arena eager_arena(std::size_t{64} << 20, s);
        const stream_executor eager = with_allocator(on_stream(s), eager_arena.lend());
        p.reset();
        step(eager, p);
        OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
        const auto expected = p.results();
        CHECK(eager_arena.live == 0);
        CHECK(eager_arena.requests > 0);
        CHECK_FALSE(eager_arena.wrong_stream);
        CHECK_FALSE(eager_arena.wrong_size);

        // Captured with another arena, replayed twice.
        arena graph_arena(std::size_t{64} << 20, s);
        const stream_executor lent = with_allocator(on_stream(s), graph_arena.lend());
        cudaGraphExec_t exec = capture(lent, p);
        CHECK(graph_arena.live == 0);
        CHECK(graph_arena.requests == eager_arena.requests);
        CHECK(graph_arena.requested == eager_arena.requested);
        CHECK_FALSE(graph_arena.wrong_stream);
        for (int replay = 0; replay < 2; ++replay) {
            CAPTURE(replay);
            p.reset();
            OCTET_CUDA_CHECK(cudaGraphLaunch(exec, s));
            OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
            const auto got = p.results();
            REQUIRE(got.size() == expected.size());
            for (std::size_t i = 0; i < got.size(); ++i) {
                CAPTURE(i);
                CHECK(got[i] == expected[i]);
            }
        }
        OCTET_CUDA_CHECK(cudaGraphExecDestroy(exec));

        // The step did something: the GEMM output is finite and not all zero, the report is clean.
        const std::vector<float> d = p.d.download();
        bool finite = true, nonzero = false;
        for (float v : d) finite &= std::isfinite(v), nonzero |= v != 0.0f;
        CHECK(finite);
        CHECK(nonzero);
        CHECK(p.report.download()[0].nonfinite_gradients == 0);
    }

    TEST_CASE("the same step captured with octet's default allocator replays bit for bit") {
        // cudaMallocAsync during capture becomes allocation nodes of the graph; the step's quantized
        // operands then live at addresses that are only mapped when the graph runs (the pointer
        // checks of the stream functions see them during capture).
        using namespace graph_capture_test;
        auto g = octet_test::rng(7100);
        problem p(g);
        cudaStream_t s = nullptr;
        OCTET_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        struct stream_guard {
            cudaStream_t s;
            ~stream_guard() { cudaStreamDestroy(s); }
        } guard{s};
        p.reset();
        step(octet::on_stream(s), p);
        OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
        const auto expected = p.results();
        cudaGraphExec_t exec = capture(octet::on_stream(s), p);
        p.reset();
        OCTET_CUDA_CHECK(cudaGraphLaunch(exec, s));
        OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
        CHECK(p.results() == expected);
        OCTET_CUDA_CHECK(cudaGraphExecDestroy(exec));
    }

    TEST_CASE("the lent allocator serves every temporary; the scratch queries equal the requests") {
        using namespace graph_capture_test;
        using namespace octet;
        auto g = octet_test::rng(7200);
        cudaStream_t s = nullptr;
        OCTET_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        struct stream_guard {
            cudaStream_t s;
            ~stream_guard() { cudaStreamDestroy(s); }
        } guard{s};
        arena ar(std::size_t{64} << 20, s);
        const stream_executor ex = with_allocator(on_stream(s), ar.lend());
        for (const std::size_t rows : {std::size_t{1}, std::size_t{37}, std::size_t{300}}) {
            const std::size_t cols = 256;
            CAPTURE(rows);
            cuda::device_buffer<float> x(normal(g, rows * cols, 1.0f));
            const matrix_ref<const float> xr(x.data(), rows, cols);
            // A quantized tensor takes exactly its bytes (each request rounded to 256 by the arena).
            std::size_t before = ar.requested;
            cuda::device_quantized_tensor<RR> qr(ex, rows, cols);
            cuda::device_quantized_tensor<RR> qc(ex, cols, rows);
            CHECK(ar.requested - before ==
                  detail::scratch_round(qr.layout().data_bytes) + detail::scratch_round(qr.layout().scale_bytes) +
                      detail::scratch_round(qc.layout().data_bytes) + detail::scratch_round(qc.layout().scale_bytes));
            // quantize: per-row (global path) takes scratch; 1x128 (one pass) takes none.
            before = ar.requested;
            const int live = ar.live;
            quantize<RR>(ex, xr, qr.ref(), qc.ref());
            CHECK(ar.requested - before == quantize_scratch_bytes<RR>(xr, qr.ref(), qc.ref()));
            CHECK(quantize_scratch_bytes<RR>(xr, qr.ref(), qc.ref()) > 0);
            CHECK(ar.live == live);
            cuda::device_quantized_tensor<R128> a(ex, rows, cols), b(ex, 128, cols);
            before = ar.requested;
            quantize<R128>(ex, xr, a.ref());
            CHECK(ar.requested == before);
            CHECK(quantize_scratch_bytes<R128>(xr, a.ref()) == 0);
            cuda::device_buffer<float> w(normal(g, 128 * cols, 0.05f));
            quantize<R128>(ex, matrix_ref<const float>(w.data(), 128, cols), b.ref());
            // scaled GEMM: octet's kernels take none unless sm90_wgmma splits K (the ranges' partial
            // sums, returned by the call); the quantized output takes M * N floats and the per-tensor
            // quantizer's scratch.
            cuda::device_buffer<float> d(rows * 128);
            before = ar.requested;
            scaled_gemm(ex, a.cref(), b.cref(), matrix_ref<float>(d.data(), rows, 128));
            CHECK(ar.requested - before ==
                  scaled_gemm_scratch_bytes(ex, a.cref(), b.cref(), matrix_ref<float>(d.data(), rows, 128)));
            if (cuda::compute_capability() == 90 && detail::sm90a_available()) {
                gemm_options split;
                split.backend = gemm_backend::sm90_wgmma;
                split.split_k = 2;  // K = 256: two ranges of one block
                before = ar.requested;
                scaled_gemm(ex, a.cref(), b.cref(), matrix_ref<float>(d.data(), rows, 128), split);
                CHECK(ar.requested - before == detail::scratch_round(2 * rows * 128 * sizeof(float)));
                CHECK(ar.requested - before ==
                      scaled_gemm_scratch_bytes(ex, a.cref(), b.cref(), matrix_ref<float>(d.data(), rows, 128), split));
                CHECK(ar.live == live + 4);  // a and b: the partial sums went back
            }
            cuda::device_quantized_tensor<RT> dq(ex, rows, 128);
            before = ar.requested;
            scaled_gemm(ex, a.cref(), b.cref(), dq.ref());
            CHECK(ar.requested - before == scaled_gemm_scratch_bytes(ex, a.cref(), b.cref(), dq.ref()));
            CHECK(scaled_gemm_scratch_bytes(ex, a.cref(), b.cref(), dq.ref()) >=
                  detail::scratch_round(rows * 128 * sizeof(float)));
            CHECK(ar.live == live + 6);  // a, b and dq: codes and scales each
        }
        OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
        CHECK(ar.live == 0);
        CHECK_FALSE(ar.wrong_stream);
        CHECK_FALSE(ar.wrong_size);
    }
}
