// The host quantizer against the float64 reference quantizer (octet/reference/quantize.hpp) for
// every named recipe (tests/support/quant_recipes_check.hpp: every stored scale equals what its rule
// says, every code equals encode(x / S) under the recipe's rounding, padding is zero, statistics equal
// brute force counts, the dequantized error stays within half a unit of the format), bf16 and fp16
// inputs, both copies and column-major input, the edge contract, NaN blocks, a given tensor amax and
// bad arguments. Custom recipes: tests/host/quant_recipes_custom.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "octet/quant/delayed.hpp"
#include "octet/quant/quantize.hpp"
#include "octet/reference/quantize.hpp"
#include "support/quant_recipes_check.hpp"
#include "support/random.hpp"
#include "support/storage.hpp"

using namespace quant_recipes_test;
namespace rcp = octet::recipes;

TEST_CASE("named recipes against the float64 reference") {
    check_all_shapes<rcp::tensorwise_e4m3>(100);
    check_all_shapes<rcp::tensorwise_e5m2>(200);
    check_all_shapes<rcp::rowwise_e4m3>(300);
    check_all_shapes<rcp::columnwise_e4m3>(400);
    check_all_shapes<rcp::blockwise_1x128>(500);
    check_all_shapes<rcp::blockwise_128x128>(600);
    check_all_shapes<rcp::mxfp8_e4m3>(700);
    check_all_shapes<rcp::mxfp8_e5m2>(800);
    check_all_shapes<rcp::mxfp6_e2m3>(900);
    check_all_shapes<rcp::mxfp6_e3m2>(1000);
    check_all_shapes<rcp::mxfp4>(1100);
    check_all_shapes<rcp::mxfp8_e4m3_ceil>(1200);
    check_all_shapes<rcp::nvfp4>(1300);
    // the same under nan_policy::per_element (the named recipes propagate)
    using per_element = octet::nan_policy::per_element;
    check_all_shapes<octet::with_nan_policy<rcp::tensorwise_e4m3, per_element>>(1400);
    check_all_shapes<octet::with_nan_policy<rcp::mxfp8_e5m2, per_element>>(1500);
    check_all_shapes<octet::with_nan_policy<rcp::mxfp6_e2m3, per_element>>(1600);
    check_all_shapes<octet::with_nan_policy<rcp::blockwise_128x128, per_element>>(1700);
    check_all_shapes<octet::with_nan_policy<rcp::mxfp4, per_element>>(1800);
    check_all_shapes<octet::with_nan_policy<rcp::nvfp4, per_element>>(1900);
}

TEST_CASE("bf16 and fp16 inputs are quantized from their exact float values") {
    check_recipe<rcp::blockwise_1x128, octet::bf16>(67, 300, 3000);
    check_recipe<rcp::mxfp4, octet::bf16>(33, 100, 3001);
    check_recipe<rcp::nvfp4, octet::fp16>(40, 48, 3002, 1.0f);
    check_recipe<rcp::mxfp8_e5m2, octet::fp16>(9, 65, 3003, 1.0f);
}

// 333 x 301 (100k values, ragged against every block shape) splits each parallel pass (the
// transpose, the block amaxes, the codes: at least 2^15 values a chunk) into several chunks.
template <class R>
void check_thread_counts_and_orders(std::uint64_t seed) {
    using namespace octet;
    auto g = octet_test::rng(seed);
    const std::size_t rows = 333, cols = 301;
    const auto x = octet_test::with_edge_cases(g, rows * cols, 5.0f);
    const auto xt = transpose(x, rows, cols);  // x stored column-major == x^T row-major
    quantized_tensor<R> a(rows, cols), b(rows, cols), c(rows, cols), at(cols, rows), bt(cols, rows);
    quantize<R>(on_host(1), matrix_ref<const float>(x.data(), rows, cols), a.ref(), at.ref());
    quantize<R>(on_host(5), matrix_ref<const float>(xt.data(), rows, cols, rows, storage_order::col_major), b.ref(),
                bt.ref());
    thread_pool pool(3);
    quantize<R>(on_host(pool), matrix_ref<const float>(x.data(), rows, cols), c.ref());
    CHECK(a.data() == b.data());
    CHECK(a.scales() == b.scales());
    CHECK(at.data() == bt.data());
    CHECK(at.scales() == bt.scales());
    CHECK(a.data() == c.data());
    CHECK(a.scales() == c.scales());
}

TEST_CASE("a column-major input, thread counts and both copies give the same bits") {
    check_thread_counts_and_orders<rcp::blockwise_1x128>(4000);
    check_thread_counts_and_orders<rcp::blockwise_128x128>(4001);
    check_thread_counts_and_orders<rcp::mxfp8_e4m3>(4002);
    check_thread_counts_and_orders<rcp::nvfp4>(4003);
}

TEST_CASE("edge contract: zero blocks, subnormal amax, Inf and NaN, underflowing E4M3 scales") {
    using namespace octet;
    SUBCASE("an all-zero block gets a finite scale and zero codes") {
        std::vector<float> x(2 * 128, 0.0f);
        for (std::size_t j = 0; j < 128; ++j) x[128 + j] = 0.01f * static_cast<float>(j);
        quantized_tensor<rcp::blockwise_1x128> q(2, 128);
        quantized_tensor<rcp::mxfp8_e4m3> m(2, 128);
        quantize<rcp::blockwise_1x128>(on_host(), matrix_ref<const float>(x.data(), 2, 128), q.ref());
        quantize<rcp::mxfp8_e4m3>(on_host(), matrix_ref<const float>(x.data(), 2, 128), m.ref());
        // the smallest scale of the rule, so that it never wins a maximum over scales (attention's
        // tile folds; tests/host/attention_padding.cpp)
        CHECK(q.cref().scale(0, 0) == std::ldexp(1.0f, -126));
        CHECK(m.cref().stored_scale(0, 0) == 0u);
        CHECK(m.cref().scale(0, 0) == std::ldexp(1.0f, -127));
        for (std::size_t j = 0; j < 128; ++j) CHECK(q.cref().code(0, j) == 0);
        CHECK(std::isfinite(q.cref().scale(1, 0)));
    }
    SUBCASE("a block whose amax is subnormal never gets an infinite or zero scale") {
        std::vector<float> x(128);
        for (std::size_t j = 0; j < 128; ++j) x[j] = 1e-42f * static_cast<float>(j % 7);
        quantized_tensor<rcp::blockwise_1x128> q(1, 128);
        const auto r =
            quantize<rcp::blockwise_1x128>(on_host(), matrix_ref<const float>(x.data(), 1, 128), q.ref(), {}, {true});
        const float s = q.cref().scale(0, 0);
        CHECK(s == std::ldexp(1.0f, -126));
        CHECK(std::isfinite(1.0f / s));
        CHECK(r.rowwise.non_finite == 0);
        CHECK(r.rowwise.flushed_to_zero > 0);  // 1e-42 / 2^-126 ~ 8.5e-5, below E4M3's 2^-9: flushed and counted
    }
    SUBCASE("per_element: Inf and NaN do not take part in the amax; they encode by the format contract, counted") {
        using R = with_nan_policy<rcp::mxfp8_e4m3, nan_policy::per_element>;
        std::vector<float> x(32, 1.0f);
        x[3] = 2.0f;
        x[5] = INFINITY;
        x[6] = -INFINITY;
        x[7] = NAN;
        quantized_tensor<R> q(1, 32);
        const auto r = quantize<R>(on_host(), matrix_ref<const float>(x.data(), 1, 32), q.ref(), {}, {true});
        CHECK(q.cref().scale(0, 0) == std::ldexp(1.0f, 1 - 8));  // floor(log2 2) - emax(8)
        CHECK(q.cref().code(0, 5) == 0x7E);                      // saturate: +max
        CHECK(q.cref().code(0, 6) == 0xFE);
        CHECK(q.cref().code(0, 7) == 0x7F);  // NaN
        CHECK(q.cref().value(0, 3) == 2.0f);
        CHECK(r.rowwise.non_finite == 3);
        CHECK(r.rowwise.amax == 2.0f);
        CHECK(r.rowwise.noise_energy == 0.0);  // 1 and 2 are exact at this scale: SQNR is +Inf
        CHECK(r.rowwise.sqnr_db() == INFINITY);
    }
    SUBCASE("propagate (the default): an Inf alone makes its block NaN; the finite amax is still reported") {
        std::vector<float> x(64, 1.0f);
        x[3] = 2.0f;
        x[40] = 4.0f;
        x[5] = -INFINITY;
        quantized_tensor<rcp::mxfp8_e4m3> q(1, 64);
        const auto r =
            quantize<rcp::mxfp8_e4m3>(on_host(), matrix_ref<const float>(x.data(), 1, 64), q.ref(), {}, {true});
        CHECK(q.cref().stored_scale(0, 0) == 0xFFu);
        CHECK(std::isnan(q.cref().value(0, 5)));
        CHECK(std::isnan(q.cref().value(0, 3)));
        CHECK(q.cref().value(0, 40) == 4.0f);  // the next block is untouched
        CHECK(r.rowwise.non_finite == 1);
        CHECK(r.rowwise.lost_to_nan == 31);
        CHECK(r.amax == 4.0f);
    }
    SUBCASE("NVFP4: a block far below the tensor amax underflows its E4M3 scale to zero codes, counted") {
        std::vector<float> x(32, 0.0f);
        for (std::size_t j = 0; j < 16; ++j) x[j] = 1e6f;    // sets the tensor scale
        for (std::size_t j = 16; j < 32; ++j) x[j] = 1e-3f;  // 1e-3/6 / (1e6/2688) ~ 4.5e-7 < E4M3's 2^-10 half-min
        quantized_tensor<rcp::nvfp4> q(1, 32);
        const auto r = quantize<rcp::nvfp4>(on_host(), matrix_ref<const float>(x.data(), 1, 32), q.ref(), {}, {true});
        CHECK(q.cref().scale(0, 1) == 0.0f);
        CHECK(q.cref().code(0, 20) == 0);
        CHECK(r.rowwise.flushed_to_zero == 16);
        CHECK(r.rowwise.saturated == 0);
    }
    SUBCASE("the MX floor rule saturates the top of the binade; the round-up rule never does") {
        std::vector<float> x(32, 1.0f);
        x[0] = 500.0f;  // floor(log2 500) = 8 = emax: scale 1, and 500 > 464 clamps to 448
        quantized_tensor<rcp::mxfp8_e4m3> f(1, 32);
        quantized_tensor<rcp::mxfp8_e4m3_ceil> c(1, 32);
        const auto rf =
            quantize<rcp::mxfp8_e4m3>(on_host(), matrix_ref<const float>(x.data(), 1, 32), f.ref(), {}, {true});
        const auto rc =
            quantize<rcp::mxfp8_e4m3_ceil>(on_host(), matrix_ref<const float>(x.data(), 1, 32), c.ref(), {}, {true});
        CHECK(rf.rowwise.saturated == 1);
        CHECK(f.cref().value(0, 0) == 448.0f);
        CHECK(rc.rowwise.saturated == 0);
        CHECK(c.cref().scale(0, 0) == 2.0f);
        CHECK(c.cref().value(0, 0) == 512.0f);  // 250 -> E4M3 256 (the nearest), times 2
    }
}

TEST_CASE("a single coarse scale erases small values that finer granularity keeps") {
    using namespace octet;
    // One row holding 100 and many 0.1s: a per-tensor E4M3 scale keeps 0.1 (E4M3 has range), but
    // MXFP4 over 32 elements flushes the 0.1s next to 100, while a block of their own keeps them.
    std::vector<float> x(64, 0.1f);
    x[0] = 100.0f;
    quantized_tensor<rcp::mxfp4> q(1, 64);
    const auto r = quantize<rcp::mxfp4>(on_host(), matrix_ref<const float>(x.data(), 1, 64), q.ref(), {}, {true});
    CHECK(q.cref().value(0, 1) == 0.0f);   // same block as 100: flushed
    CHECK(q.cref().value(0, 40) > 0.09f);  // own block: kept
    CHECK(r.rowwise.flushed_to_zero == 31);
}

TEST_CASE("bad arguments raise octet::error naming the argument") {
    using namespace octet;
    using R = rcp::blockwise_1x128;
    std::vector<float> x(4 * 256, 1.0f);
    const matrix_ref<const float> xm(x.data(), 4, 256);
    quantized_tensor<R> ok(4, 256), wrong(4, 255), t(256, 4);
    CHECK_THROWS_WITH_AS(quantize<R>(on_host(), xm, wrong.ref()), doctest::Contains("argument 'rowwise'"),
                         octet::error);
    CHECK_THROWS_WITH_AS(quantize<R>(on_host(), xm, ok.ref(), ok.ref()), doctest::Contains("argument 'columnwise'"),
                         octet::error);
    CHECK_THROWS_WITH_AS(quantize<R>(on_host(), xm, quantized_ref<R>{}, quantized_ref<R>{}),
                         doctest::Contains("rowwise/columnwise"), octet::error);
    auto small = ok.ref();
    small.layout.scale_bytes -= 4;
    CHECK_THROWS_WITH_AS(quantize<R>(on_host(), xm, small), doctest::Contains("scale_bytes"), octet::error);
    auto null_scales = ok.ref();
    null_scales.scales = nullptr;
    CHECK_THROWS_WITH_AS(quantize<R>(on_host(), xm, null_scales), doctest::Contains("null scales"), octet::error);
    CHECK_THROWS_WITH_AS(quantize<R>(on_host(), matrix_ref<const float>(x.data(), 4, 256, 100), ok.ref()),
                         doctest::Contains("argument 'x'"), octet::error);
    quantized_tensor<rcp::nvfp4> n(4, 256);
    auto no_ts = n.ref();
    no_ts.tensor_scale = nullptr;
    CHECK_THROWS_WITH_AS(quantize<rcp::nvfp4>(on_host(), xm, no_ts), doctest::Contains("tensor_scale"), octet::error);
    quantize_options bad;
    bad.tensor_amax = NAN;
    CHECK_THROWS_WITH_AS(
        quantize<rcp::tensorwise_e4m3>(on_host(), xm, quantized_tensor<rcp::tensorwise_e4m3>(4, 256).ref(), {}, bad),
        doctest::Contains("tensor_amax"), octet::error);
    std::vector<float> y(4 * 255);
    CHECK_THROWS_WITH_AS(dequantize(on_host(), ok.cref(), matrix_ref<float>(y.data(), 4, 255)),
                         doctest::Contains("argument 'out'"), octet::error);
}

namespace quant_recipes_test {
/// One row of five blocks: all NaN; one NaN among finite values; NaN beside +Inf and -Inf; finite;
/// one +Inf among finite values. Checked bit for bit against the float64 reference, and for what
/// dequantize then gives.
template <class Recipe>
void check_nan_blocks(std::uint64_t salt) {
    using namespace octet;
    using Fmt = typename Recipe::format;
    constexpr std::size_t C = Recipe::granularity::cols;
    const std::size_t cols = 5 * C;
    auto g = octet_test::rng(salt);
    std::vector<float> x = octet_test::with_edge_cases(g, cols, 3.0f, false);
    for (std::size_t j = 0; j < C; ++j) x[j] = NAN;
    x[C + 5] = NAN;
    x[2 * C + 1] = NAN;
    x[2 * C + 2] = INFINITY;
    x[2 * C + 3] = -INFINITY;
    for (std::size_t j = 3 * C; j < 4 * C; ++j)
        if (!std::isfinite(x[j])) x[j] = 1.0f;
    x[4 * C + 7] = INFINITY;
    INFO(format_name<Fmt>() << " block 1x" << C << (Recipe::propagates_nan ? ", propagate" : ", per_element"));
    quantized_tensor<Recipe> q(1, cols);
    quantize_options opt;
    opt.collect_stats = true;
    const auto r = quantize<Recipe>(on_host(), matrix_ref<const float>(x.data(), 1, cols), q.ref(), {}, opt);
    const auto ref = reference::quantize<Recipe>(x, 1, cols, -1.0, [](std::size_t, std::size_t) { return 0u; });
    CHECK(compare_copy(q, ref, x, r.rowwise, true, "NaN blocks") == 0);
    std::vector<float> y(cols);
    dequantize(on_host(), q.cref(), matrix_ref<float>(y.data(), 1, cols));
    const auto c = q.cref();
    CHECK(r.rowwise.non_finite == C + 1 + 3 + 1);
    const auto poisoned = [](std::size_t b) { return b != 3; };
    if constexpr (Recipe::propagates_nan) {
        using Storage = typename Recipe::scale_storage_type;
        const std::uint32_t nan_scale = std::is_same_v<Storage, scale_storage::ue8m0>  ? 0xFFu
                                        : std::is_same_v<Storage, scale_storage::e4m3> ? 0x7Fu
                                                                                       : 0x7FFFFFFFu;
        for (std::size_t b = 0; b < 5; ++b)
            if (poisoned(b)) CHECK(c.stored_scale(0, b) == nan_scale);
        for (std::size_t j = 0; j < cols; ++j)
            if (poisoned(j / C)) {
                CHECK(std::isnan(y[j]));
                CHECK(c.code(0, j) == 0);
            }
        CHECK(r.rowwise.lost_to_nan == (C - 1) + (C - 3) + (C - 1));
    } else {
        CHECK(r.rowwise.lost_to_nan == 0);
        // per element: a NaN is the format's NaN code, or +max_finite times the scale where there
        // is none; an Inf saturates to +-max_finite times the scale
        for (std::size_t j = 0; j < cols; ++j) {
            if (x[j] != x[j])
                CHECK(std::isnan(y[j]) == Fmt::has_nan);
            else
                CHECK(std::isfinite(y[j]));
        }
        if constexpr (!Fmt::has_nan) CHECK(y[0] == static_cast<float>(Fmt::max_finite) * c.scale(0, 0));
        CHECK(y[4 * C + 7] == static_cast<float>(Fmt::max_finite) * c.scale(0, 4));
    }
    // the clean block is untouched by its neighbours' NaNs and Infs
    for (std::size_t j = 3 * C; j < 4 * C; ++j) CHECK(std::isfinite(y[j]));
    CHECK(std::isfinite(c.scale(0, 3)));
    CHECK(r.amax == ref.amax);  // the finite amax, what delayed scaling records
}
}  // namespace quant_recipes_test

TEST_CASE(
    "NaN and Inf inside blocks: propagate (the default) makes the whole block NaN, per_element keeps the earlier "
    "codes") {
    using per_element = octet::nan_policy::per_element;
    using octet::with_nan_policy;
    check_nan_blocks<rcp::mxfp4>(5100);
    check_nan_blocks<with_nan_policy<rcp::mxfp4, per_element>>(5101);
    check_nan_blocks<rcp::mxfp6_e3m2>(5102);
    check_nan_blocks<with_nan_policy<rcp::mxfp6_e3m2, per_element>>(5103);
    check_nan_blocks<rcp::mxfp6_e2m3>(5104);
    check_nan_blocks<rcp::nvfp4>(5105);
    check_nan_blocks<with_nan_policy<rcp::nvfp4, per_element>>(5106);
    check_nan_blocks<rcp::mxfp8_e4m3>(5107);
    check_nan_blocks<with_nan_policy<rcp::mxfp8_e4m3, per_element>>(5108);
    check_nan_blocks<rcp::mxfp8_e5m2>(5109);
    check_nan_blocks<rcp::blockwise_1x128>(5110);
    check_nan_blocks<with_nan_policy<rcp::blockwise_1x128, per_element>>(5111);
    // the defect propagation answers: an all-NaN MXFP4 block dequantizes to a finite value under
    // per_element (FP4's largest, 6, times the smallest scale: the block has no finite magnitude)
    std::vector<float> x(32, NAN);
    octet::quantized_tensor<with_nan_policy<rcp::mxfp4, per_element>> a(1, 32);
    octet::quantized_tensor<rcp::mxfp4> b(1, 32);
    octet::quantize<with_nan_policy<rcp::mxfp4, per_element>>(octet::on_host(),
                                                              octet::matrix_ref<const float>(x.data(), 1, 32), a.ref());
    octet::quantize<rcp::mxfp4>(octet::on_host(), octet::matrix_ref<const float>(x.data(), 1, 32), b.ref());
    CHECK(a.cref().value(0, 7) == std::ldexp(6.0f, -127));
    CHECK(std::isnan(b.cref().value(0, 7)));
    // a UE8M0 scale code 0xFF decodes to NaN, whoever wrote it
    CHECK(std::isnan(octet::stored_scale_value<rcp::mxfp8_e4m3>(0xFFu)));
}

TEST_CASE("a given tensor amax: zero refused for non-zero data, a stale smaller one saturates and is counted") {
    using namespace octet;
    auto g = octet_test::rng(5200);
    const std::size_t rows = 33, cols = 96;
    std::vector<float> x = octet_test::with_edge_cases(g, rows * cols, 2.0f, false);
    const matrix_ref<const float> xm(x.data(), rows, cols);
    quantized_tensor<rcp::nvfp4> n(rows, cols);
    quantized_tensor<rcp::tensorwise_e4m3> t(rows, cols);
    quantize_options zero;
    zero.tensor_amax = 0.0f;
    CHECK_THROWS_WITH_AS(quantize<rcp::nvfp4>(on_host(), xm, n.ref(), {}, zero),
                         doctest::Contains("argument 'options.tensor_amax'"), octet::error);
    CHECK_THROWS_WITH_AS(quantize<rcp::tensorwise_e4m3>(on_host(), xm, t.ref(), {}, zero),
                         doctest::Contains("is 0 but x holds non-zero"), octet::error);
    // ... but all-zero data with a zero amax is fine (the smallest scales, zero codes)
    std::vector<float> z(rows * cols, 0.0f);
    quantize<rcp::nvfp4>(on_host(), matrix_ref<const float>(z.data(), rows, cols), n.ref(), {}, zero);
    CHECK(n.cref().value(3, 5) == 0.0f);
    // a delayed-scaling history of all-zero steps asks the quantizer to measure
    delayed_scaling ds;
    ds.record(0.0f);
    ds.update();
    CHECK(ds.amax_for_scale() < 0.0f);

    // stale: a quarter of the true amax; what lies above saturates, counted as the reference counts it
    const auto ref_measured =
        reference::quantize<rcp::tensorwise_e4m3>(x, rows, cols, -1.0, [](std::size_t, std::size_t) { return 0u; });
    const double stale = ref_measured.amax / 4;
    quantize_options opt;
    opt.collect_stats = true;
    opt.tensor_amax = static_cast<float>(stale);
    const auto rt = quantize<rcp::tensorwise_e4m3>(on_host(), xm, t.ref(), {}, opt);
    const auto rn = quantize<rcp::nvfp4>(on_host(), xm, n.ref(), {}, opt);
    const auto ref_t =
        reference::quantize<rcp::tensorwise_e4m3>(x, rows, cols, stale, [](std::size_t, std::size_t) { return 0u; });
    const auto ref_n =
        reference::quantize<rcp::nvfp4>(x, rows, cols, stale, [](std::size_t, std::size_t) { return 0u; });
    CHECK(compare_copy(t, ref_t, x, rt.rowwise, true, "stale per-tensor") == 0);
    CHECK(compare_copy(n, ref_n, x, rn.rowwise, true, "stale NVFP4") == 0);
    CHECK(rt.rowwise.saturated > 0);
    CHECK(rn.rowwise.saturated > 0);
}

TEST_CASE("an output is absent only when it is {}; a half-given one is an error naming it") {
    using namespace octet;
    using R = rcp::mxfp4;
    std::vector<float> x(8 * 64, 1.5f);
    const matrix_ref<const float> xm(x.data(), 8, 64);
    quantized_tensor<R> row(8, 64), col(64, 8);
    auto no_data = row.ref();
    no_data.data = nullptr;  // scales and layout still valid
    CHECK_FALSE(no_data.absent());
    CHECK(quantized_ref<R>{}.absent());
    // beside a valid column-wise copy: not skipped silently
    CHECK_THROWS_WITH_AS(quantize<R>(on_host(), xm, no_data, col.ref()),
                         doctest::Contains("argument 'rowwise' has a null data pointer"), octet::error);
    // alone: names the half-given copy, not "both absent"
    CHECK_THROWS_WITH_AS(quantize<R>(on_host(), xm, no_data),
                         doctest::Contains("argument 'rowwise' has a null data pointer"), octet::error);
    auto col_no_scales = col.ref();
    col_no_scales.scales = nullptr;
    CHECK_THROWS_WITH_AS(quantize<R>(on_host(), xm, row.ref(), col_no_scales),
                         doctest::Contains("argument 'columnwise' has a null scales pointer"), octet::error);
    auto layout_only = quantized_ref<R>{};
    layout_only.layout = row.layout();
    CHECK_THROWS_WITH_AS(quantize<R>(on_host(), xm, layout_only), doctest::Contains("argument 'rowwise'"),
                         octet::error);
    // both absent: the message says so
    CHECK_THROWS_WITH_AS(quantize<R>(on_host(), xm, quantized_ref<R>{}), doctest::Contains("are both absent"),
                         octet::error);
    // and a valid column-wise copy alone is fine
    CHECK_NOTHROW(quantize<R>(on_host(), xm, quantized_ref<R>{}, col.ref()));
    // dequantize with a null output names 'out'
    CHECK_THROWS_WITH_AS(dequantize(on_host(), row.cref(), matrix_ref<float>(nullptr, 8, 64)),
                         doctest::Contains("argument 'out' is null"), octet::error);
}
