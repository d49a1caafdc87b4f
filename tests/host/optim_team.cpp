// The device decomposition of the fused step, checked on the CPU. The CUDA kernels run the shared
// block functions (adamw_block, encode/decode of moments) as a warp: 32 members of 8 elements,
// group statistics combined across 16 or 32 members, meta written by each group's first member,
// Philox bits indexed by element. This test runs exactly that decomposition with 32 host threads
// (a "thread team" whose reductions go through shared memory and a barrier) and requires the same
// bits as the host path (one member owning the whole block), for every codec, master policy,
// gradient type, ragged sizes and both non-finite policies. What it cannot check is CUDA itself
// (shuffles, vector loads, shared-memory tables): tests/cuda/optim_device.cu does, on a GPU.
#include <doctest/doctest.h>

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "octet/optim/adamw.hpp"
#include "octet/optim/moments.hpp"
#include "support/random.hpp"

using namespace octet;

namespace {

class barrier {
public:
    explicit barrier(int n) : count_(n) {}
    void arrive_and_wait() {
        std::unique_lock<std::mutex> lock(m_);
        const std::uint64_t gen = generation_;
        if (++waiting_ == count_) {
            waiting_ = 0;
            ++generation_;
            cv_.notify_all();
        } else {
            cv_.wait(lock, [&] { return generation_ != gen; });
        }
    }

private:
    std::mutex m_;
    std::condition_variable cv_;
    int count_, waiting_ = 0;
    std::uint64_t generation_ = 0;
};

struct shared_area {
    barrier bar{32};
    group_stats stats[32];
    int ints[32];
};

/// A warp emulated by 32 threads: the same interface as optim_detail::warp_team.
struct thread_team {
    static constexpr int per_member = 8;
    int lane;
    shared_area* sh;

    int rank() const { return lane; }
    template <int Lanes>
    group_stats reduce(group_stats s) const {
        sh->stats[lane] = s;
        sh->bar.arrive_and_wait();
        group_stats r;
        const int base = lane / Lanes * Lanes;
        for (int k = Lanes - 1; k >= 0; --k) r = stats_merge(r, sh->stats[base + k]);  // another order than the host's
        sh->bar.arrive_and_wait();
        return r;
    }
    int sum(int x) const {
        sh->ints[lane] = x;
        sh->bar.arrive_and_wait();
        int total = 0;
        for (int k = 0; k < 32; ++k) total += sh->ints[k];
        sh->bar.arrive_and_wait();
        return total;
    }
    template <class T>
    void load(const T* src, int valid, T (&dst)[per_member], bool) const {
        for (int i = 0; i < per_member; ++i) dst[i] = i < valid ? src[i] : T{};
    }
    template <class T>
    void store(T* dst, int valid, const T (&src)[per_member], bool) const {
        for (int i = 0; i < valid; ++i) dst[i] = src[i];
    }
};

/// Runs body(team) on 32 threads, one per lane.
template <class Body>
void run_warp(Body body) {
    shared_area sh;
    std::vector<std::thread> lanes;
    for (int l = 0; l < 32; ++l) lanes.emplace_back([&, l] { body(thread_team{l, &sh}); });
    for (auto& t : lanes) t.join();
}

template <class State>
std::size_t differences(const State& a, const State& b) {
    auto diff = [](const auto& x, const auto& y) {
        std::size_t d = 0;
        for (std::size_t i = 0; i < x.size(); ++i) d += std::memcmp(&x[i], &y[i], sizeof x[i]) != 0;
        return d;
    };
    return diff(a.params, b.params) + diff(a.compensation, b.compensation) + diff(a.m_codes, b.m_codes) +
           diff(a.m_meta, b.m_meta) + diff(a.v_codes, b.v_codes) + diff(a.v_meta, b.v_meta);
}

template <class MC, class VC, class M, class G>
void check_config(std::uint64_t salt) {
    for (std::size_t n : {std::size_t{5}, std::size_t{256}, std::size_t{1000}, std::size_t{256 * 9 + 130}}) {
        for (auto policy : {grad_nonfinite_policy::skip_step, grad_nonfinite_policy::zero_block}) {
            auto g = octet_test::rng(salt++);
            adamw_hyper h;
            h.on_nonfinite = policy;
            h.seed = g();
            h.weight_decay = 0.02f;
            adamw_state<MC, VC, M> host(n), warp(n);
            std::normal_distribution<float> d(0.0f, 1.0f);
            std::vector<float> w0(n);
            for (auto& x : w0) x = d(g);
            host.set_params(as_cspan(w0));
            warp.set_params(as_cspan(w0));
            std::uniform_real_distribution<float> e(-5.0f, 1.0f);
            for (std::uint64_t t = 1; t <= 4; ++t) {
                std::vector<G> gr(n);
                for (std::size_t i = 0; i < n; ++i) {
                    float x = d(g) * std::pow(10.0f, e(g));
                    if (t == 3 && i % 97 == 5) x = (i % 2) ? NAN : -INFINITY;
                    if constexpr (std::is_same_v<G, float>)
                        gr[i] = x;
                    else
                        gr[i] = to_bf16(x);
                }
                const float lr = 1e-3f * static_cast<float>(t);
                const adamw_report hr = adamw_step(on_host(), host.ref(), as_cspan(gr), h, t, lr);
                // the kernel's path: the same prepass decision, then every block as a warp
                adamw_report wr;
                if (policy == grad_nonfinite_policy::skip_step)
                    wr.nonfinite_gradients = count_nonfinite(on_host(), as_cspan(gr));
                if (policy == grad_nonfinite_policy::skip_step && wr.nonfinite_gradients) {
                    wr.skipped = 1;
                } else {
                    auto r = warp.ref();
                    const optim_detail::adamw_block_args<MC, VC, M, G> args{r.params.data(),
                                                                            r.compensation.data(),
                                                                            r.m_codes.data(),
                                                                            r.m_meta.data(),
                                                                            r.v_codes.data(),
                                                                            r.v_meta.data(),
                                                                            gr.data(),
                                                                            n,
                                                                            0,
                                                                            make_adamw_coeffs(h, t, lr),
                                                                            policy,
                                                                            false};
                    std::uint64_t bad[32] = {}, zeroed[32] = {};
                    run_warp([&](thread_team team) {
                        const codec_context ctx = host_codec_context();
                        for (std::size_t blk = 0; blk < (n + 255) / 256; ++blk) {
                            const auto res = optim_detail::adamw_block(team, args, ctx, blk);
                            bad[team.lane] += res.nonfinite;
                            zeroed[team.lane] += res.zeroed;
                        }
                    });
                    for (int l = 0; l < 32; ++l) {
                        wr.nonfinite_gradients += bad[l];
                        wr.blocks_zeroed += zeroed[l];
                    }
                }
                INFO("n=" << n << " policy " << static_cast<int>(policy) << " step " << t);
                CHECK(wr.nonfinite_gradients == hr.nonfinite_gradients);
                CHECK(wr.blocks_zeroed == hr.blocks_zeroed);
                CHECK(wr.skipped == hr.skipped);
                CHECK(differences(host, warp) == 0);
            }
        }
    }
}

template <class Codec, moment K>
void check_moments(std::uint64_t salt) {
    auto g = octet_test::rng(salt);
    std::student_t_distribution<float> t3(3.0f);
    std::uniform_real_distribution<float> e(-8.0f, 0.0f);
    const std::size_t n = 256 * 5 + 77;
    std::vector<float> x(n);
    for (auto& v : x) v = t3(g) * std::pow(10.0f, e(g)) * (K == moment::second ? t3(g) : 1.0f);
    if (K == moment::second)
        for (auto& v : x) v = v * v;
    std::vector<typename Codec::code_type> hc(n), wc(n);
    std::vector<typename Codec::meta_type> hm(state_meta_count<Codec>(n)), wm(hm.size());
    const philox_stream rng{salt, 9};  // bits for stochastic codecs
    encode_moments<Codec, K>(on_host(), as_cspan(x), as_span(hc), as_span(hm), rng);
    std::vector<float> hx(n), wx(n);
    decode_moments<Codec, K>(on_host(), as_cspan(hc), as_cspan(hm), as_span(hx));
    run_warp([&](thread_team team) {
        const codec_context ctx = host_codec_context();
        for (std::size_t blk = 0; blk < (n + 255) / 256; ++blk)
            optim_detail::encode_moments_block<Codec, K>(team, x.data(), wc.data(), wm.data(), n, ctx, blk, false, rng);
    });
    run_warp([&](thread_team team) {
        const codec_context ctx = host_codec_context();
        for (std::size_t blk = 0; blk < (n + 255) / 256; ++blk)
            optim_detail::decode_moments_block<Codec, K>(team, wc.data(), wm.data(), wx.data(), n, ctx, blk, false);
    });
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i)
        bad += std::memcmp(&hc[i], &wc[i], sizeof hc[i]) != 0 || std::memcmp(&hx[i], &wx[i], 4) != 0;
    for (std::size_t i = 0; i < hm.size(); ++i) bad += std::memcmp(&hm[i], &wm[i], sizeof hm[i]) != 0;
    CHECK(bad == 0);
}

namespace sc = octet::state_codec;

}  // namespace

TEST_CASE("the warp decomposition (32 members x 8 elements) gives the host path's bits") {
    check_config<sc::fp32, sc::fp32, master::fp32, float>(1000);
    check_config<sc::bf16, sc::bf16, master::bf16_nearest, bf16>(1100);
    check_config<sc::e4m3_scaled, sc::e4m3_scaled, master::fp32, float>(1200);
    check_config<sc::e4m3_expanded, sc::e4m3_expanded, master::bf16_kahan, bf16>(1300);
    check_config<sc::dynamic8, sc::dynamic8, master::bf16_stochastic, float>(1400);
    check_config<sc::e4m3_scaled, sc::dynamic8, master::bf16_stochastic, bf16>(1500);
    check_config<sc::bf16_stochastic, sc::bf16_stochastic, master::bf16_stochastic, float>(1600);
    check_config<sc::bf16_stochastic, sc::dynamic8, master::fp32, bf16>(1700);
}

TEST_CASE("the warp decomposition of encode_moments / decode_moments gives the host path's bits") {
    check_moments<sc::e4m3_scaled, moment::first>(2000);
    check_moments<sc::e4m3_scaled, moment::second>(2001);
    check_moments<sc::e4m3_expanded, moment::first>(2002);
    check_moments<sc::e4m3_expanded, moment::second>(2003);
    check_moments<sc::dynamic8, moment::first>(2004);
    check_moments<sc::dynamic8, moment::second>(2005);
    check_moments<sc::bf16, moment::second>(2006);
    check_moments<sc::bf16_stochastic, moment::first>(2007);
    check_moments<sc::bf16_stochastic, moment::second>(2008);
}
