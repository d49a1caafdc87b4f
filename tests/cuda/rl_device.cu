// The RL clipping kernels against the host path. Suite "cuda" runs anywhere (host code built by
// nvcc, argument checks that come before any device call); suite "gpu" needs a device:
//   * importance_ratios: bit-equal to the host except where the double exp of the device and
//     of glibc round to different floats (expected about once in 2^28 tokens; counted, <= 2);
//   * clipped_surrogate: ratio, objective and gradient bit-equal on every token whose ratio is,
//     exact counts, and double sums within 1e-12 relative (atomics reorder them); every
//     aggregation, both clip ranges, ragged sizes, outputs poisoned first;
//   * threshold_crossings: exact counts from ratios; from log-probabilities, equal up to the
//     tokens whose ratios differ by an ulp;
//   * non-finite tokens counted on the device as on the host; host pointers rejected.
// Under the interpreter (interpret.rl_device: smaller large batches) the kernels' exp is glibc's, so
// no ratio differs there.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "octet/core/bits.hpp"
#include "octet/cuda/buffer.cuh"
#include "octet/reference/rl.hpp"
#include "octet/rl/crossings.cuh"
#include "octet/rl/surrogate.cuh"
#include "support/random.hpp"

namespace rl_device_test {
using namespace octet;

namespace {

// Under the interpreter (the `interpret` tests) the two largest batches are a tenth and a sixteenth
// of the GPU's; the ragged sizes stay. Its grid-stride launches have 16 blocks of 256 threads (two
// multiprocessors), so even those loop over the grid many times.
#if defined(OCTET_INTERPRET)
constexpr std::size_t kLargeN = 100003, kHugeN = (std::size_t{1} << 20) + 5;
#else
constexpr std::size_t kLargeN = 1000003, kHugeN = (std::size_t{1} << 24) + 5;
#endif

struct batch {
    std::vector<float> logp_new, logp_old, adv, logp_low;
};

/// Log-probabilities -U(0, 30), a policy step N(0, 0.2) (ratios crowd the bounds), 0.5% jumps past
/// the log-ratio limit, advantages N(0, 1) with 5% zeros, 0.4% non-finite entries, and a
/// bf16 copy of the new log-probabilities as the low-precision side.
batch random_batch(std::mt19937_64& g, std::size_t n) {
    std::uniform_real_distribution<float> lp(-30.0f, 0.0f), u(0.0f, 1.0f);
    std::normal_distribution<float> step(0.0f, 0.2f), a(0.0f, 1.0f);
    batch b;
    b.logp_new.resize(n), b.logp_old.resize(n), b.adv.resize(n), b.logp_low.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        const float old = lp(g);
        float d = step(g);
        const float p = u(g);
        if (p < 0.005f) d = (u(g) < 0.5f ? -1.0f : 1.0f) * (21.0f + 5.0f * u(g));
        b.logp_old[i] = old;
        b.logp_new[i] = old + d;
        b.adv[i] = u(g) < 0.05f ? 0.0f : a(g);
        const float q = u(g);
        if (q < 0.001f)
            b.logp_new[i] = NAN;
        else if (q < 0.002f)
            b.logp_old[i] = -INFINITY;
        else if (q < 0.003f)
            b.adv[i] = NAN;
        else if (q < 0.004f)
            b.logp_new[i] = INFINITY;
        b.logp_low[i] = to_float(to_bf16(b.logp_new[i]));
    }
    return b;
}

std::uint32_t bits(float x) {
    return float_to_bits(x);
}

template <class T>
octet::cuda::device_buffer<T> poisoned(std::size_t n) {
    octet::cuda::device_buffer<T> b(n);
    b.fill_bytes(0xFF);  // float 0xFFFFFFFF: a NaN no kernel writes (octet's NaN is 0x7FFFFFFF)
    return b;
}

/// Ratio indices where device and host differ; each must be a one-ulp difference.
std::vector<std::size_t> ratio_mismatches(const std::vector<float>& dev, const std::vector<float>& host) {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < dev.size(); ++i) {
        if (bits(dev[i]) == bits(host[i])) continue;
        out.push_back(i);
        INFO("token " << i << ": device " << dev[i] << ", host " << host[i]);
        CHECK(std::nextafter(host[i], dev[i]) == dev[i]);  // one ulp, never more (and never an unwritten element)
    }
    return out;
}

void check_crossings_equal(const crossing_report& d, const crossing_report& h, std::uint64_t slack) {
    for (int s = 0; s < 3; ++s)
        for (int k = 0; k < crossing_counts::count; ++k) {
            INFO("sign " << s << " counter " << k);
            const std::uint64_t a = d.by_sign[s].at(k), b = h.by_sign[s].at(k);
            CHECK((a > b ? a - b : b - a) <= slack);
        }
    CHECK(d.non_finite == h.non_finite);
}

}  // namespace

TEST_SUITE("cuda") {
    TEST_CASE("host code built by nvcc: surrogate and crossings against the float64 reference") {
        auto g = octet_test::rng(501);
        const batch b = random_batch(g, 20000);
        const clip_range range = clip_range::asymmetric(0.2f, 0.28f);
        surrogate_config cfg;
        cfg.range = range;
        std::vector<float> ratio(b.adv.size());
        const surrogate_stats s = clipped_surrogate(on_host(), b.logp_new, b.logp_old, b.adv, cfg, {ratio, {}, {}});
        std::uint64_t clipped = 0, non_finite = 0, bad = 0;
        for (std::size_t i = 0; i < ratio.size(); ++i) {
            const double r = reference::importance_ratio(b.logp_new[i], b.logp_old[i]);
            const auto t = reference::surrogate_token(static_cast<float>(r), b.adv[i], range.lower, range.upper);
            if (!t.finite) {
                ++non_finite;
                continue;
            }
            bad += bits(ratio[i]) != bits(static_cast<float>(r));
            clipped += t.clipped;
        }
        CHECK(bad == 0);
        CHECK(s.non_finite == non_finite);
        CHECK(s.clipped_low + s.clipped_high == clipped);
    }

    TEST_CASE("stream overloads reject bad arguments before touching the device") {
        std::vector<float> a(10), b9(9);
        std::vector<surrogate_stats> st(1);
        surrogate_config cfg;
        CHECK_THROWS_WITH_AS(importance_ratios(on_stream(), as_cspan(a), as_cspan(b9), as_span(a)),
                             doctest::Contains("argument 'logp_old'"), octet::error);
        CHECK_THROWS_WITH_AS(
            clipped_surrogate(on_stream(), as_cspan(a), as_cspan(a), as_cspan(b9), cfg, {}, as_span(st)),
            doctest::Contains("argument 'advantages'"), octet::error);
        CHECK_THROWS_WITH_AS(
            clipped_surrogate(on_stream(), as_cspan(a), as_cspan(a), as_cspan(a), cfg, {}, span<surrogate_stats>()),
            doctest::Contains("argument 'stats'"), octet::error);
        CHECK_THROWS_WITH_AS(clipped_surrogate(on_stream(), as_cspan(a), as_cspan(a), as_cspan(a), cfg,
                                               {{}, {}, as_span(b9)}, as_span(st)),
                             doctest::Contains("argument 'out.grad'"), octet::error);
        cfg.on_nonfinite = token_nonfinite_policy::raise;
        CHECK_THROWS_WITH_AS(
            clipped_surrogate(on_stream(), as_cspan(a), as_cspan(a), as_cspan(a), cfg, {}, as_span(st)),
            doctest::Contains("argument 'cfg.on_nonfinite'"), octet::error);
        cfg.on_nonfinite = token_nonfinite_policy::count;
        cfg.aggregation = loss_aggregation::sequence_mean;
        CHECK_THROWS_WITH_AS(
            clipped_surrogate(on_stream(), as_cspan(a), as_cspan(a), as_cspan(a), cfg, {}, as_span(st)),
            doctest::Contains("argument 'sequence_offsets'"), octet::error);
        std::vector<crossing_report> rep(2);
        CHECK_THROWS_WITH_AS(threshold_crossings(on_stream(), as_cspan(a), as_cspan(a), as_cspan(b9), as_cspan(a),
                                                 clip_range{}, clip_range{}, as_span(rep)),
                             doctest::Contains("argument 'logp_old'"), octet::error);
        CHECK_THROWS_WITH_AS(threshold_crossings(on_stream(), as_cspan(a), as_cspan(a), as_cspan(a), as_cspan(a),
                                                 clip_range{}, clip_range{}, as_span(rep)),
                             doctest::Contains("argument 'report' has 2 elements"), octet::error);
        CHECK_THROWS_WITH_AS(threshold_crossings_from_ratios(on_stream(), as_cspan(a), as_cspan(a), as_cspan(a),
                                                             clip_range{2.0f, 1.0f}, clip_range{}, as_span(rep)),
                             doctest::Contains("argument 'range'"), octet::error);
    }
}

TEST_SUITE("gpu") {
    TEST_CASE("importance_ratios kernel equals the host path (ragged sizes, poisoned output)") {
        auto g = octet_test::rng(502);
        std::size_t mismatched = 0, total = 0;
        for (std::size_t n : {std::size_t{1}, std::size_t{31}, std::size_t{4097}, kLargeN}) {
            const batch b = random_batch(g, n);
            std::vector<float> host(n);
            importance_ratios(on_host(), b.logp_new, b.logp_old, host);
            octet::cuda::device_buffer<float> dn(b.logp_new), dold(b.logp_old);
            auto dr = poisoned<float>(n);
            importance_ratios(on_stream(), dn.cview(), dold.cview(), dr.view());
            OCTET_CUDA_CHECK(cudaDeviceSynchronize());
            mismatched += ratio_mismatches(dr.download(), host).size();
            total += n;
        }
        MESSAGE("ratios differing by one ulp (device double exp vs glibc): ", mismatched, " of ", total);
        CHECK(mismatched <= 2);
    }

    TEST_CASE("clipped_surrogate kernel equals the host path: every aggregation, both ranges") {
        auto g = octet_test::rng(503);
        for (std::size_t n : {std::size_t{1}, std::size_t{255}, std::size_t{65537}, kLargeN}) {
            const batch b = random_batch(g, n);
            std::vector<std::int64_t> offsets{0};
            while (offsets.back() < static_cast<std::int64_t>(n))
                offsets.push_back(std::min<std::int64_t>(
                    static_cast<std::int64_t>(n), offsets.back() + std::uniform_int_distribution<int>(0, 700)(g)));
            octet::cuda::device_buffer<float> dn(b.logp_new), dold(b.logp_old), dadv(b.adv);
            octet::cuda::device_buffer<std::int64_t> doff(offsets);
            for (const clip_range range : {clip_range::symmetric(0.2f), clip_range::asymmetric(0.2f, 0.28f)})
                for (loss_aggregation agg :
                     {loss_aggregation::token_mean, loss_aggregation::sequence_mean, loss_aggregation::sum}) {
                    INFO("n " << n << ", upper " << range.upper << ", aggregation " << static_cast<int>(agg));
                    surrogate_config cfg;
                    cfg.range = range;
                    cfg.aggregation = agg;
                    const bool by_seq = agg == loss_aggregation::sequence_mean;
                    std::vector<float> hr(n), ho(n), hg(n);
                    const surrogate_stats hs =
                        clipped_surrogate(on_host(), b.logp_new, b.logp_old, b.adv, cfg, {hr, ho, hg},
                                          by_seq ? span<const std::int64_t>(offsets) : span<const std::int64_t>());
                    auto dr = poisoned<float>(n), dob = poisoned<float>(n), dg = poisoned<float>(n);
                    octet::cuda::device_buffer<surrogate_stats> dst(1);
                    dst.fill_bytes(0xFF);
                    clipped_surrogate(on_stream(), dn.cview(), dold.cview(), dadv.cview(), cfg,
                                      {dr.view(), dob.view(), dg.view()}, dst.view(),
                                      by_seq ? doff.cview() : span<const std::int64_t>());
                    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
                    const auto r = dr.download(), o = dob.download(), gr = dg.download();
                    const auto mism = ratio_mismatches(r, hr);
                    std::size_t bad = 0;
                    std::size_t m = 0;
                    for (std::size_t i = 0; i < n; ++i) {
                        if (m < mism.size() && mism[m] == i) {
                            ++m;
                            continue;
                        }
                        bad += bits(o[i]) != bits(ho[i]) || bits(gr[i]) != bits(hg[i]);
                    }
                    CHECK(bad == 0);
                    CHECK(mism.size() <= 2);
                    const surrogate_stats ds = dst.download()[0];
                    const std::uint64_t slack = mism.size();
                    CHECK(ds.tokens == hs.tokens);
                    CHECK(ds.non_finite == hs.non_finite);
                    CHECK(ds.negative == hs.negative);
                    CHECK(ds.positive == hs.positive);
                    CHECK(std::llabs(static_cast<long long>(ds.below - hs.below)) <= static_cast<long long>(slack));
                    CHECK(std::llabs(static_cast<long long>(ds.above - hs.above)) <= static_cast<long long>(slack));
                    CHECK(std::llabs(static_cast<long long>(ds.clipped_low - hs.clipped_low)) <=
                          static_cast<long long>(slack));
                    CHECK(std::llabs(static_cast<long long>(ds.clipped_high - hs.clipped_high)) <=
                          static_cast<long long>(slack));
                    CHECK(ds.limited == hs.limited);
                    // double sums of the same terms in another order: relative 1e-12 of the sum of magnitudes
                    CHECK(std::fabs(ds.objective - hs.objective) <=
                          1e-12 * (std::fabs(hs.objective) + 1.0) * (slack + 1));
                    CHECK(std::fabs(ds.ratio_sum - hs.ratio_sum) <= 1e-12 * hs.ratio_sum * (slack + 1) + 1e-6 * slack);
                }
        }
    }

    TEST_CASE("threshold_crossings kernel equals the host path, from ratios and from log-probabilities") {
        auto g = octet_test::rng(504);
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{33}, kLargeN, kHugeN}) {
            INFO("n " << n);
            const batch b = random_batch(g, n);
            const clip_range range = clip_range::asymmetric(0.2f, 0.28f), low_range{0.79f, 1.3f};
            octet::cuda::device_buffer<float> dlow(b.logp_low), dhigh(b.logp_new), dold(b.logp_old), dadv(b.adv);
            octet::cuda::device_buffer<crossing_report> drep(1);
            // from log-probabilities
            const crossing_report h =
                threshold_crossings(on_host(), b.logp_low, b.logp_new, b.logp_old, b.adv, range, low_range);
            drep.fill_bytes(0xFF);
            threshold_crossings(on_stream(), dlow.cview(), dhigh.cview(), dold.cview(), dadv.cview(), range, low_range,
                                drep.view());
            OCTET_CUDA_CHECK(cudaDeviceSynchronize());
            // ratios that differ by an ulp can change a count near a bound, one token each
            std::vector<float> hl(n), hh(n);
            importance_ratios(on_host(), b.logp_low, b.logp_old, hl);
            importance_ratios(on_host(), b.logp_new, b.logp_old, hh);
            auto dl = poisoned<float>(n), dh = poisoned<float>(n);
            importance_ratios(on_stream(), dlow.cview(), dold.cview(), dl.view());
            importance_ratios(on_stream(), dhigh.cview(), dold.cview(), dh.view());
            OCTET_CUDA_CHECK(cudaDeviceSynchronize());
            const std::uint64_t slack =
                ratio_mismatches(dl.download(), hl).size() + ratio_mismatches(dh.download(), hh).size();
            check_crossings_equal(drep.download()[0], h, slack);
            CHECK(h.tokens() + h.non_finite == n);
            // from the host's ratios: exact
            octet::cuda::device_buffer<float> dhl(hl), dhh(hh);
            const crossing_report hr = threshold_crossings_from_ratios(on_host(), hl, hh, b.adv, range, low_range);
            drep.fill_bytes(0xFF);
            threshold_crossings_from_ratios(on_stream(), dhl.cview(), dhh.cview(), dadv.cview(), range, low_range,
                                            drep.view());
            OCTET_CUDA_CHECK(cudaDeviceSynchronize());
            check_crossings_equal(drep.download()[0], hr, 0);
            if (n > 1000) CHECK(hr.region_changed() > 0);
        }
    }

    TEST_CASE("stream overloads reject host pointers with a clear error") {
        std::vector<float> a(16, -1.0f);
        octet::cuda::device_buffer<float> d(16);
        octet::cuda::device_buffer<surrogate_stats> st(1);
        CHECK_THROWS_WITH_AS(importance_ratios(on_stream(), as_cspan(a), d.cview(), d.view()),
                             doctest::Contains("argument 'logp_new' points to host memory"), octet::error);
        CHECK_THROWS_WITH_AS(
            clipped_surrogate(on_stream(), d.cview(), d.cview(), as_cspan(a), surrogate_config{}, {}, st.view()),
            doctest::Contains("argument 'advantages' points to host memory"), octet::error);
        std::vector<surrogate_stats> hst(1);
        CHECK_THROWS_WITH_AS(
            clipped_surrogate(on_stream(), d.cview(), d.cview(), d.cview(), surrogate_config{}, {}, as_span(hst)),
            doctest::Contains("argument 'stats' points to host memory"), octet::error);
        std::vector<crossing_report> hrep(1);
        CHECK_THROWS_WITH_AS(threshold_crossings(on_stream(), d.cview(), d.cview(), d.cview(), d.cview(), clip_range{},
                                                 clip_range{}, as_span(hrep)),
                             doctest::Contains("argument 'report' points to host memory"), octet::error);
    }
}

}  // namespace rl_device_test
