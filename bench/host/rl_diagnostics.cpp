// Host throughput of the per-token RL diagnostics (tokens per second): importance ratios, the
// clipped surrogate with its gradient, threshold crossings (from log-probabilities: two ratios
// per token; from ratios), one calibration update (quantile matching on n ratios), and the
// cost of recording one monitor value. Inputs are fresh random batches of 2^20 tokens whose
// ratios crowd the clip bounds (log-ratio N(0, 0.2)).
//
//   ./bench_rl_diagnostics --benchmark_filter=crossings
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "octet/core/bits.hpp"
#include "octet/monitor/checks.hpp"
#include "octet/rl/calibration.hpp"
#include "octet/rl/crossings.hpp"
#include "octet/rl/surrogate.hpp"

namespace {

constexpr std::size_t kTokens = std::size_t{1} << 20;

struct tokens {
    std::vector<float> logp_new, logp_old, logp_low, adv, ratio_high, ratio_low;
    tokens()
        : logp_new(kTokens),
          logp_old(kTokens),
          logp_low(kTokens),
          adv(kTokens),
          ratio_high(kTokens),
          ratio_low(kTokens) {
        std::mt19937_64 g(std::random_device{}());
        std::uniform_real_distribution<float> lp(-20.0f, 0.0f);
        std::normal_distribution<float> d(0.0f, 0.2f), a(0.0f, 1.0f);
        for (std::size_t i = 0; i < kTokens; ++i) {
            logp_old[i] = lp(g);
            logp_new[i] = logp_old[i] + d(g);
            logp_low[i] = octet::to_float(octet::to_bf16(logp_new[i]));
            adv[i] = a(g);
        }
        octet::importance_ratios(octet::on_host(), logp_new, logp_old, ratio_high);
        octet::importance_ratios(octet::on_host(), logp_low, logp_old, ratio_low);
    }
    static const tokens& get() {
        static const tokens t;
        return t;
    }
};

void importance_ratios(benchmark::State& state) {
    const auto& t = tokens::get();
    std::vector<float> out(kTokens);
    for (auto _ : state) {
        octet::importance_ratios(octet::on_host(static_cast<int>(state.range(0))), t.logp_new, t.logp_old, out);
        benchmark::DoNotOptimize(out.data());
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kTokens));
}

void clipped_surrogate(benchmark::State& state) {
    const auto& t = tokens::get();
    std::vector<float> grad(kTokens);
    octet::surrogate_config cfg;
    cfg.range = octet::clip_range::asymmetric(0.2f, 0.28f);
    for (auto _ : state) {
        const auto s = octet::clipped_surrogate(octet::on_host(static_cast<int>(state.range(0))), t.logp_new,
                                                t.logp_old, t.adv, cfg, {{}, {}, grad});
        benchmark::DoNotOptimize(s);
        benchmark::DoNotOptimize(grad.data());
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kTokens));
}

void crossings_from_logp(benchmark::State& state) {
    const auto& t = tokens::get();
    const auto range = octet::clip_range::asymmetric(0.2f, 0.28f);
    for (auto _ : state) {
        const auto c = octet::threshold_crossings(octet::on_host(static_cast<int>(state.range(0))), t.logp_low,
                                                  t.logp_new, t.logp_old, t.adv, range);
        benchmark::DoNotOptimize(c);
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kTokens));
}

void crossings_from_ratios(benchmark::State& state) {
    const auto& t = tokens::get();
    const auto range = octet::clip_range::asymmetric(0.2f, 0.28f);
    for (auto _ : state) {
        const auto c = octet::threshold_crossings_from_ratios(octet::on_host(static_cast<int>(state.range(0))),
                                                              t.ratio_low, t.ratio_high, t.adv, range);
        benchmark::DoNotOptimize(c);
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kTokens));
}

void calibration_update(benchmark::State& state) {
    const auto& t = tokens::get();
    octet::calibrated_clipping cal({octet::clip_range::asymmetric(0.2f, 0.28f), 50, 0.8});
    cal.set_reference(0, t.ratio_high);
    std::int64_t step = 0;
    for (auto _ : state) benchmark::DoNotOptimize(cal.update(++step, t.ratio_low));
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kTokens));
}

void monitor_record(benchmark::State& state) {
    octet::check_registry reg;
    const auto id = reg.add("x", octet::check_kind::softmax_row_sum);
    std::int64_t step = 0;
    for (auto _ : state) benchmark::DoNotOptimize(reg.record(id, ++step, 1e-4, 1e-6));
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

}  // namespace

BENCHMARK(importance_ratios)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(clipped_surrogate)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(crossings_from_logp)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(crossings_from_ratios)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(calibration_update)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(monitor_record);

BENCHMARK_MAIN();
