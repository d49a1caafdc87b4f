// octet-test: timeout=300
//
// The optimizer on a GPU against the host path. Suite "cuda" runs anywhere (argument checks of
// the stream overloads, which must fail before touching a device); suite "gpu" needs a device:
//   * adamw_step kernels against the host adamw_step, bit for bit, for six codec / master /
//     gradient-type combinations, ragged sizes, both non-finite policies (with NaN, Inf and
//     |g| >= 2^63 in the gradients), several steps, shards, and unaligned views; bytes around
//     each view are poisoned and must stay untouched; the device report equals the host's;
//   * the step kernel launched with very different grid shapes gives the same bits (the Philox
//     bits of stochastic rounding are indexed by element);
//   * encode_moments / decode_moments kernels against the host, outputs poisoned first.
// Under the interpreter (interpret.optim_device) every case runs at its GPU sizes: the model
// device's 2 multiprocessors cap the library's grid-stride launches at 16 CTAs, so the whole suite
// takes about 10 s on one core, and the largest sizes still loop several times over the grid.
#include <doctest/doctest.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "octet/cuda/buffer.cuh"
#include "octet/optim/adamw.cuh"
#include "octet/optim/moments.cuh"
#include "support/random.hpp"

namespace optim_device_test {
using namespace octet;

namespace {

constexpr std::size_t kPad = 64;  // poisoned elements before and after every device view

/// A device copy of an adamw_state with kPad poisoned elements on both sides of every array,
/// and the data starting `shift` elements into the allocation (to test unaligned views).
template <class MC, class VC, class M>
struct device_state {
    using ref_type = adamw_state_ref<MC, VC, M>;
    template <class T>
    struct arr {
        cuda::device_buffer<T> buf;
        std::size_t n = 0, shift = 0;
        void init(const std::vector<T>& host, std::size_t s) {
            n = host.size();
            shift = s;
            buf = cuda::device_buffer<T>(n + 2 * kPad + s);
            buf.fill_bytes(0xA5);
            if (n)
                OCTET_CUDA_CHECK(cudaMemcpy(buf.data() + kPad + s, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
        }
        span<T> view() { return span<T>(n ? buf.data() + kPad + shift : nullptr, n); }
        void download(std::vector<T>& host) {
            if (n)
                OCTET_CUDA_CHECK(
                    cudaMemcpy(host.data(), buf.data() + kPad + shift, n * sizeof(T), cudaMemcpyDeviceToHost));
        }
        /// Bytes outside the view still hold the poison.
        bool pad_intact() {
            std::vector<unsigned char> all((n + 2 * kPad + shift) * sizeof(T));
            OCTET_CUDA_CHECK(cudaMemcpy(all.data(), buf.data(), all.size(), cudaMemcpyDeviceToHost));
            for (std::size_t i = 0; i < (kPad + shift) * sizeof(T); ++i)
                if (all[i] != 0xA5) return false;
            for (std::size_t i = (kPad + shift + n) * sizeof(T); i < all.size(); ++i)
                if (all[i] != 0xA5) return false;
            return true;
        }
    };
    arr<typename M::weight_type> params;
    arr<typename M::comp_type> comp;
    arr<typename MC::code_type> m_codes;
    arr<typename MC::meta_type> m_meta;
    arr<typename VC::code_type> v_codes;
    arr<typename VC::meta_type> v_meta;

    void upload(const adamw_state<MC, VC, M>& h, std::size_t shift) {
        params.init(h.params, shift);
        comp.init(h.compensation, shift);
        m_codes.init(h.m_codes, shift);
        m_meta.init(h.m_meta, shift);
        v_codes.init(h.v_codes, shift);
        v_meta.init(h.v_meta, shift);
    }
    void download(adamw_state<MC, VC, M>& h) {
        params.download(h.params);
        comp.download(h.compensation);
        m_codes.download(h.m_codes);
        m_meta.download(h.m_meta);
        v_codes.download(h.v_codes);
        v_meta.download(h.v_meta);
    }
    ref_type ref() {
        return ref_type{params.view(), comp.view(), m_codes.view(), m_meta.view(), v_codes.view(), v_meta.view(), 0};
    }
    bool pads_intact() {
        return params.pad_intact() && comp.pad_intact() && m_codes.pad_intact() && m_meta.pad_intact() &&
               v_codes.pad_intact() && v_meta.pad_intact();
    }
};

template <class State>
std::size_t count_differences(const State& a, const State& b) {
    auto diff = [](const auto& x, const auto& y) {
        std::size_t d = 0;
        const std::size_t bytes = sizeof(x[0]);
        for (std::size_t i = 0; i < x.size(); ++i) d += std::memcmp(&x[i], &y[i], bytes) != 0;
        return d;
    };
    return diff(a.params, b.params) + diff(a.compensation, b.compensation) + diff(a.m_codes, b.m_codes) +
           diff(a.m_meta, b.m_meta) + diff(a.v_codes, b.v_codes) + diff(a.v_meta, b.v_meta);
}

/// Gradients with scales spanning 1e-4 .. 1e1, and (when asked) NaN, -Inf and 1e19 sprinkled in.
std::vector<float> gradients(std::mt19937_64& g, std::size_t n, bool nonfinite) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::uniform_real_distribution<float> e(-4.0f, 1.0f);
    std::uniform_int_distribution<int> pick(0, 999);
    std::vector<float> v(n);
    for (auto& x : v) {
        x = d(g) * std::pow(10.0f, e(g));
        if (nonfinite) {
            const int p = pick(g);
            if (p == 0)
                x = NAN;
            else if (p == 1)
                x = -INFINITY;
            else if (p == 2)
                x = 1e19f;
        }
    }
    return v;
}

template <class G>
std::vector<G> as_grad(const std::vector<float>& x) {
    if constexpr (std::is_same_v<G, float>)
        return x;
    else {
        std::vector<G> out(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) out[i] = to_bf16(x[i]);
        return out;
    }
}

template <class MC, class VC, class M, class G>
void check_step_against_host(std::size_t n, grad_nonfinite_policy policy, std::size_t shift, std::uint64_t salt) {
    auto g = octet_test::rng(salt);
    adamw_hyper h;
    h.on_nonfinite = policy;
    h.seed = octet_test::run_seed() ^ salt;
    h.weight_decay = 0.05f;
    adamw_state<MC, VC, M> host(n), from_device(n);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> w0(n);
    for (auto& x : w0) x = d(g);
    host.set_params(as_cspan(w0));
    device_state<MC, VC, M> dev;
    dev.upload(host, shift);
    cuda::device_buffer<adamw_report> report(1);
    for (std::uint64_t t = 1; t <= 4; ++t) {
        const bool bad = t == 2 || t == 4;  // steps 2 and 4 carry non-finite gradients
        const auto gh = as_grad<G>(gradients(g, n, bad));
        const float lr = 1e-3f * static_cast<float>(t);
        const adamw_report hr = adamw_step(on_host(), host.ref(), span<const G>(gh.data(), n), h, t, lr);
        cuda::device_buffer<G> gd(n + shift);
        if (n) OCTET_CUDA_CHECK(cudaMemcpy(gd.data() + shift, gh.data(), n * sizeof(G), cudaMemcpyHostToDevice));
        report.fill_bytes(0x5C);                                                       // the call must reset it
        using DG = std::conditional_t<std::is_same_v<G, bf16>, __nv_bfloat16, float>;  // CUDA's type on the device side
        adamw_step(on_stream(), dev.ref(), span<const DG>(reinterpret_cast<const DG*>(gd.data() + shift), n), h, t, lr,
                   report.data());
        OCTET_CUDA_CHECK(cudaDeviceSynchronize());
        const adamw_report dr = report.download()[0];
        INFO("n=" << n << " shift=" << shift << " step " << t << " policy " << static_cast<int>(policy));
        CHECK(dr.nonfinite_gradients == hr.nonfinite_gradients);
        CHECK(dr.blocks_zeroed == hr.blocks_zeroed);
        CHECK(dr.skipped == hr.skipped);
        dev.download(from_device);
        CHECK(count_differences(host, from_device) == 0);
    }
    CHECK(dev.pads_intact());
}

template <class MC, class VC, class M, class G>
void check_step_config(std::uint64_t salt) {
    for (std::size_t n : {std::size_t{1}, std::size_t{255}, std::size_t{256}, std::size_t{1000},
                          std::size_t{256 * 37 + 5}, std::size_t{100003}})
        for (auto policy : {grad_nonfinite_policy::skip_step, grad_nonfinite_policy::zero_block})
            check_step_against_host<MC, VC, M, G>(n, policy, 0, salt++);
    check_step_against_host<MC, VC, M, G>(5000, grad_nonfinite_policy::zero_block, 3, salt++);  // unaligned views
}

template <class Codec, moment K>
void check_moments(std::size_t n, std::uint64_t salt) {
    auto g = octet_test::rng(salt);
    std::student_t_distribution<float> t3(3.0f);
    std::uniform_real_distribution<float> e(-8.0f, 0.0f);
    std::vector<float> x(n);
    for (auto& v : x) {
        v = t3(g) * std::pow(10.0f, e(g));
        if (K == moment::second) v = v * v;
    }
    const std::size_t groups = state_meta_count<Codec>(n);
    std::vector<typename Codec::code_type> hc(n);
    std::vector<typename Codec::meta_type> hm(groups);
    const philox_stream rng{salt, 3};  // bits for stochastic codecs: the same rule on both sides
    encode_moments<Codec, K>(on_host(), as_cspan(x), as_span(hc), as_span(hm), rng);
    std::vector<float> hx(n);
    decode_moments<Codec, K>(on_host(), as_cspan(hc), as_cspan(hm), as_span(hx));

    cuda::device_buffer<float> dx(x);
    cuda::device_buffer<typename Codec::code_type> dc(n);
    cuda::device_buffer<typename Codec::meta_type> dm(groups);
    cuda::device_buffer<float> dy(n);
    dc.fill_bytes(0xA5);
    dm.fill_bytes(0xA5);
    dy.fill_bytes(0xA5);
    encode_moments<Codec, K>(on_stream(), dx.cview(), dc.view(), dm.view(), rng);
    decode_moments<Codec, K>(on_stream(), dc.cview(), dm.cview(), dy.view());
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    const auto c = dc.download();
    const auto m = dm.download();
    const auto y = dy.download();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += std::memcmp(&c[i], &hc[i], sizeof c[i]) != 0;
    for (std::size_t i = 0; i < groups; ++i) bad += std::memcmp(&m[i], &hm[i], sizeof m[i]) != 0;
    for (std::size_t i = 0; i < n; ++i) bad += std::memcmp(&y[i], &hx[i], sizeof y[i]) != 0;
    INFO("n=" << n);
    CHECK(bad == 0);
}

}  // namespace

TEST_SUITE("cuda") {
    TEST_CASE("stream overloads reject bad arguments before touching a device") {
        adamw_state<state_codec::dynamic8> st(1000);
        std::vector<float> gr(1000), short_g(999);
        const adamw_hyper h;
        adamw_report* no_report = nullptr;
        CHECK_THROWS_WITH_AS(adamw_step(on_stream(), st.ref(), as_cspan(short_g), h, 1, 1e-3f, no_report),
                             doctest::Contains("argument 'grads'"), octet::error);
        CHECK_THROWS_WITH_AS(adamw_step(on_stream(), st.ref(), as_cspan(gr), h, 0, 1e-3f, no_report),
                             doctest::Contains("argument 'step'"), octet::error);
        CHECK_THROWS_WITH_AS(adamw_step(on_stream(), st.ref(), as_cspan(gr), h, 1, 1e-3f, no_report),
                             doctest::Contains("argument 'report'"), octet::error);
        std::vector<std::uint8_t> codes(300);
        std::vector<state_codec::dynamic8::meta_type> meta(1);
        std::vector<float> x(300);
        CHECK_THROWS_WITH_AS((encode_moments<state_codec::dynamic8, moment::first>(on_stream(), as_cspan(x),
                                                                                   as_span(codes), as_span(meta))),
                             doctest::Contains("argument 'meta'"), octet::error);
    }

    TEST_CASE("host code built by nvcc: the fused step still matches its float64-bounded host behaviour") {
        // The same host path the g++ tests check, compiled by nvcc's host pass: a small smoke run
        // whose zero-gradient elements must only decay and whose others must move.
        adamw_state<state_codec::e4m3_expanded, state_codec::dynamic8, master::bf16_kahan> st(600);
        std::vector<float> w(600, 1.0f), gr(600, 0.0f);
        for (std::size_t i = 0; i < 600; i += 2) gr[i] = 0.5f;
        st.set_params(as_cspan(w));
        adamw_hyper h;
        h.weight_decay = 0.0f;
        adamw_step(on_host(), st.ref(), as_cspan(gr), h, 1, 1e-2f);
        const auto p = st.params_as_float();
        for (std::size_t i = 0; i < 600; ++i) CHECK(p[i] == doctest::Approx(i % 2 == 0 ? 0.99 : 1.0).epsilon(1e-4));
    }
}

TEST_SUITE("gpu") {
    TEST_CASE("adamw_step: fp32 moments, fp32 master, float gradients") {
        check_step_config<state_codec::fp32, state_codec::fp32, master::fp32, float>(100);
    }
    TEST_CASE("adamw_step: bf16 moments, bf16 nearest master, bf16 gradients") {
        check_step_config<state_codec::bf16, state_codec::bf16, master::bf16_nearest, bf16>(200);
    }
    TEST_CASE("adamw_step: bf16_stochastic moments, bf16 stochastic master, float gradients") {
        check_step_config<state_codec::bf16_stochastic, state_codec::bf16_stochastic, master::bf16_stochastic, float>(
            250);
    }
    TEST_CASE("adamw_step: e4m3_scaled moments, fp32 master, float gradients") {
        check_step_config<state_codec::e4m3_scaled, state_codec::e4m3_scaled, master::fp32, float>(300);
    }
    TEST_CASE("adamw_step: e4m3_expanded moments, bf16 Kahan master, bf16 gradients") {
        check_step_config<state_codec::e4m3_expanded, state_codec::e4m3_expanded, master::bf16_kahan, bf16>(400);
    }
    TEST_CASE("adamw_step: dynamic8 moments, bf16 stochastic master, float gradients") {
        check_step_config<state_codec::dynamic8, state_codec::dynamic8, master::bf16_stochastic, float>(500);
    }
    TEST_CASE("adamw_step: e4m3_scaled first / dynamic8 second moment, bf16 stochastic master, bf16 gradients") {
        check_step_config<state_codec::e4m3_scaled, state_codec::dynamic8, master::bf16_stochastic, bf16>(600);
    }

    TEST_CASE("shards on the device equal the unsharded host step") {
        using MC = state_codec::dynamic8;
        using M = master::bf16_stochastic;
        auto g = octet_test::rng(700);
        const std::size_t n = 256 * 40 + 17;
        adamw_hyper h;
        h.seed = 42;
        h.on_nonfinite = grad_nonfinite_policy::zero_block;
        adamw_state<MC, MC, M> host(n), from_device(n);
        std::vector<float> w0(n, 0.75f);
        host.set_params(as_cspan(w0));
        device_state<MC, MC, M> dev;
        dev.upload(host, 0);
        cuda::device_buffer<adamw_report> report(1);
        const std::size_t cuts[4] = {0, 256 * 9, 256 * 31, n};
        for (std::uint64_t t = 1; t <= 3; ++t) {
            const auto gh = gradients(g, n, t == 2);
            adamw_step(on_host(), host.ref(), as_cspan(gh), h, t, 1e-3f);
            cuda::device_buffer<float> gd(gh);
            for (int s = 0; s < 3; ++s) {
                const std::size_t b = cuts[s], len = cuts[s + 1] - cuts[s];
                adamw_step(on_stream(), dev.ref().shard(b, len), span<const float>(gd.data() + b, len), h, t, 1e-3f,
                           report.data());
            }
            OCTET_CUDA_CHECK(cudaDeviceSynchronize());
        }
        dev.download(from_device);
        CHECK(count_differences(host, from_device) == 0);
    }

    TEST_CASE("the step kernel's result does not depend on the launch shape") {
        using MC = state_codec::e4m3_expanded;
        using M = master::bf16_stochastic;
        auto g = octet_test::rng(800);
        const std::size_t n = 256 * 300 + 99;
        adamw_hyper h;
        h.seed = 7;
        h.on_nonfinite = grad_nonfinite_policy::zero_block;
        adamw_state<MC, MC, M> init(n), a(n), b(n);
        std::vector<float> w0(n);
        std::normal_distribution<float> d(0.0f, 1.0f);
        for (auto& x : w0) x = d(g);
        init.set_params(as_cspan(w0));
        const auto gh = gradients(g, n, true);
        cuda::device_buffer<float> gd(gh);
        cuda::device_buffer<adamw_report> report(1);
        const unsigned grids[2] = {1, 4096};
        const unsigned threads[2] = {32, 256};
        for (int k = 0; k < 2; ++k) {
            device_state<MC, MC, M> dev;
            dev.upload(init, 0);
            auto r = dev.ref();
            report.fill_bytes(0);
            const optim_detail::adamw_block_args<MC, MC, M, float> args{r.params.data(),
                                                                        r.compensation.data(),
                                                                        r.m_codes.data(),
                                                                        r.m_meta.data(),
                                                                        r.v_codes.data(),
                                                                        r.v_meta.data(),
                                                                        gd.data(),
                                                                        n,
                                                                        0,
                                                                        make_adamw_coeffs(h, 1, 1e-3f),
                                                                        h.on_nonfinite,
                                                                        true};
            cuda::launch("adamw_step_kernel", optim_detail::adamw_step_kernel<MC, MC, M, float>, grids[k], threads[k],
                         0, nullptr, args, report.data(), false);
            OCTET_CUDA_CHECK_LAUNCH();
            OCTET_CUDA_CHECK(cudaDeviceSynchronize());
            dev.download(k == 0 ? a : b);
        }
        CHECK(count_differences(a, b) == 0);
        adamw_step(on_host(), init.ref(), as_cspan(gh), h, 1, 1e-3f);
        CHECK(count_differences(a, init) == 0);
    }

    TEST_CASE("encode_moments / decode_moments kernels equal the host") {
        std::uint64_t salt = 900;
        for (std::size_t n : {std::size_t{1}, std::size_t{129}, std::size_t{1000}, std::size_t{65536 + 300}}) {
            check_moments<state_codec::fp32, moment::first>(n, salt++);
            check_moments<state_codec::bf16, moment::second>(n, salt++);
            check_moments<state_codec::bf16_stochastic, moment::first>(n, salt++);
            check_moments<state_codec::bf16_stochastic, moment::second>(n, salt++);
            check_moments<state_codec::e4m3_scaled, moment::first>(n, salt++);
            check_moments<state_codec::e4m3_scaled, moment::second>(n, salt++);
            check_moments<state_codec::e4m3_expanded, moment::first>(n, salt++);
            check_moments<state_codec::e4m3_expanded, moment::second>(n, salt++);
            check_moments<state_codec::dynamic8, moment::first>(n, salt++);
            check_moments<state_codec::dynamic8, moment::second>(n, salt++);
        }
    }
}

}  // namespace optim_device_test
