// Delayed scaling: the amax history ring, its reductions and margin, updates only on steps that
// quantized, and the per-tensor scale the quantizer derives from it (checked against the rule).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "octet/quant/delayed.hpp"
#include "octet/quant/quantize.hpp"

namespace delayed_test {
using namespace octet;
using R = recipes::tensorwise_e4m3;

/// One training step on a tensor of constant magnitude `amax`: quantize with the delayed scale,
/// record, update. Returns the quantize result.
quantize_result step(delayed_scaling& ds, float amax, std::size_t n = 256) {
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i)
        x[i] = amax * static_cast<float>(i + 1) / static_cast<float>(n) * (i % 2 ? -1.0f : 1.0f);
    quantized_tensor<R> q(1, n);
    quantize_options opt;
    opt.collect_stats = true;
    opt.tensor_amax = ds.amax_for_scale();
    const auto r = quantize<R>(on_host(), matrix_ref<const float>(x.data(), 1, n), q.ref(), {}, opt);
    const float expected_scale = make_block_scale<R>(opt.tensor_amax >= 0 ? opt.tensor_amax : amax).value;
    CHECK(q.cref().scale(0, 0) == expected_scale);
    ds.record(r.amax);
    ds.update();
    return r;
}
}  // namespace delayed_test

using namespace delayed_test;

TEST_CASE("delayed scaling: first step measures, later steps use the history's max") {
    delayed_scaling ds({4, 0, amax_reduction::max});
    CHECK(ds.amax_for_scale() < 0);
    step(ds, 10.0f);
    CHECK(ds.amax_for_scale() == 10.0f);
    step(ds, 20.0f);
    CHECK(ds.amax_for_scale() == 20.0f);
    step(ds, 5.0f);
    step(ds, 5.0f);
    CHECK(ds.amax_for_scale() == 20.0f);
    step(ds, 5.0f);  // the last four steps were 20, 5, 5, 5
    CHECK(ds.amax_for_scale() == 20.0f);
    step(ds, 5.0f);  // now 20 has left the window of 4
    CHECK(ds.amax_for_scale() == 5.0f);
    CHECK(ds.state().recorded == 4);
}

TEST_CASE("delayed scaling: a growing tensor saturates until the history catches up; margin gives headroom") {
    delayed_scaling plain({8, 0, amax_reduction::most_recent}), margin({8, 1, amax_reduction::most_recent});
    step(plain, 100.0f);
    step(margin, 100.0f);
    const auto a = step(plain, 150.0f);   // scale from 100: 150 maps to 672 > 448: saturates
    const auto b = step(margin, 150.0f);  // scale from 200: 150 maps to 336: fits
    CHECK(a.rowwise.saturated > 0);
    CHECK(b.rowwise.saturated == 0);
    CHECK(plain.amax_for_scale() == 150.0f);
    CHECK(margin.amax_for_scale() == 300.0f);
}

TEST_CASE("delayed scaling: a step that did not quantize the tensor leaves the state alone") {
    delayed_scaling ds({4, 0, amax_reduction::max});
    step(ds, 3.0f);
    const auto before = ds.state();
    ds.update();  // no record this step
    CHECK(ds.state().position == before.position);
    CHECK(ds.state().recorded == before.recorded);
    CHECK(ds.amax_for_scale() == before.scale_amax);
}

TEST_CASE("delayed scaling: bad configurations are refused") {
    CHECK_THROWS_WITH_AS(delayed_scaling({0, 0, amax_reduction::max}), doctest::Contains("history_length"),
                         octet::error);
    CHECK_THROWS_WITH_AS(delayed_scaling({4, -1, amax_reduction::max}), doctest::Contains("margin_bits"), octet::error);
}
