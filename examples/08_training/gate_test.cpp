// The training program's validation gate (gate.hpp): it passes on fresh seeds with every value
// finite and within its limit, and each measuring function fails when handed a wrong result (a
// stale or corrupted attention delta, a corrupted output, transform, codec message, residual,
// optimizer step or quantized code), so the gate can stop a run.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gate.hpp"
#include "support/random.hpp"

using namespace train;
using namespace train::gate;

namespace {

const gate_check& find(const std::vector<gate_check>& checks, const std::string& name) {
    for (const auto& c : checks)
        if (c.name == name) return c;
    FAIL("no check named " << name);
    return checks.front();
}

}  // namespace

TEST_CASE("the gate passes on fresh seeds; every value is finite and within its limit") {
    for (std::uint64_t k = 0; k < 3; ++k) {
        const std::uint64_t seed = octet_test::run_seed() + k;
        const auto checks = run_gate(octet::on_host(1), seed);
        CHECK(checks.size() >= 19);
        std::set<std::string> names;
        for (const auto& c : checks) {
            if (k == 0) MESSAGE(c.name << ": " << c.value << " <= " << c.limit);
            INFO("seed " << seed << ", " << c.name << ": " << c.value << " (limit " << c.limit << ") " << c.detail);
            CHECK(std::isfinite(c.value));
            CHECK(std::isfinite(c.limit));
            CHECK(c.value >= 0.0);
            CHECK(c.value <= c.limit);
            CHECK(c.passed);
            CHECK(!c.detail.empty());
            CHECK(names.insert(c.name).second);  // names are unique
        }
        CHECK(gate_passed(checks));
        // the checks the issue names are all there
        for (const char* name :
             {"attention.row_sum_residual", "attention.row_sum_residual_per_row", "attention.forward_vs_float64",
              "attention.stale_delta", "codec.hadamard_roundtrip", "codec.hadamard_norm", "codec.e4m3.error",
              "codec.feedback_f32", "optim.adamw_fp32", "optim.adamw_dynamic8_bf16_stochastic",
              "format.e4m3.conversion", "format.e5m2.conversion", "quant.blockwise_1x128.roundtrip",
              "linear.forward_vs_float64"})
            CHECK(find(checks, name).passed);
    }
}

TEST_CASE("the gate measures the same on one thread and on two; gate_passed fails on any failed check") {
    auto checks = run_gate(octet::on_host(1), octet_test::run_seed() ^ 7);
    REQUIRE(gate_passed(checks));
    const auto two = run_gate(octet::on_host(2), octet_test::run_seed() ^ 7);
    REQUIRE(two.size() == checks.size());
    for (std::size_t i = 0; i < two.size(); ++i) {
        CHECK(two[i].name == checks[i].name);
        CHECK(two[i].value == checks[i].value);  // octet's results do not depend on the thread count
    }
    checks[checks.size() / 2] = make_check("x", 2.0, 1.0, "fails");
    CHECK_FALSE(checks[checks.size() / 2].passed);
    CHECK_FALSE(gate_passed(checks));
    CHECK_FALSE(gate_passed({}));
    CHECK_FALSE(make_check("nan", std::nan(""), 1.0, "a NaN value never passes").passed);
    CHECK_FALSE(make_check("inf", 0.0, std::numeric_limits<double>::infinity(), "nor an infinite limit").passed);
}

TEST_CASE("attention: a wrong delta breaks the row-sum bound") {
    const auto ex = octet::on_host(1);
    const attention_case c = make_attention_case(ex, octet_test::run_seed() ^ 11);
    const auto fwd = run_attention_forward(ex, c, v_scale_mode::per_head);
    const auto good = measure_attention_residual(ex, c, v_scale_mode::per_head, octet::delta_mode::matched, fwd);
    REQUIRE(good.rel <= good.rel_limit);
    REQUIRE(good.row_worst <= 1.0);
    MESSAGE("matched: residual_rel " << good.rel << " (limit " << good.rel_limit << "), per-row " << good.row_worst);

    SUBCASE("from_output's stale delta (D from the stored O) is not at rounding level, even with V per head") {
        const auto m = measure_attention_residual(ex, c, v_scale_mode::per_head, octet::delta_mode::from_output, fwd);
        MESSAGE("from_output: residual_rel " << m.rel << ", per-row " << m.row_worst);
        CHECK(m.rel > 10 * m.rel_limit);
        CHECK(m.row_worst > 10.0);
        for (const auto& ch : residual_checks(m, octet::delta_mode::from_output, v_scale_mode::per_head))
            CHECK_FALSE(ch.passed);
    }
    SUBCASE("from_output on an O off by 1%") {
        auto bad = fwd;
        for (auto& x : bad.o) x *= 1.01f;
        const auto m = measure_attention_residual(ex, c, v_scale_mode::per_head, octet::delta_mode::from_output, bad);
        CHECK(m.rel > 100 * m.rel_limit);
    }
    SUBCASE("matched on a log-sum-exp off by 0.01 (P no longer sums to 1)") {
        auto bad = fwd;
        for (auto& x : bad.lse) x += 0.01f;
        const auto m = measure_attention_residual(ex, c, v_scale_mode::per_head, octet::delta_mode::matched, bad);
        CHECK(m.rel > 10 * m.rel_limit);
        CHECK(m.row_worst > 10.0);
    }
    SUBCASE("the stale-delta check fails when the two measurements are swapped") {
        const auto fwd_t = run_attention_forward(ex, c, v_scale_mode::per_token);
        const auto matched =
            measure_attention_residual(ex, c, v_scale_mode::per_token, octet::delta_mode::matched, fwd_t);
        const auto stale =
            measure_attention_residual(ex, c, v_scale_mode::per_token, octet::delta_mode::from_output, fwd_t);
        MESSAGE("V per token: matched " << matched.rel << ", from_output " << stale.rel);
        CHECK(stale_delta_check(matched, stale).passed);
        CHECK_FALSE(stale_delta_check(stale, matched).passed);
    }
}

TEST_CASE("attention: the forward check fails on a corrupted output") {
    const auto ex = octet::on_host(1);
    const attention_case c = make_attention_case(ex, octet_test::run_seed() ^ 12);
    auto fwd = run_attention_forward(ex, c, v_scale_mode::per_head);
    REQUIRE(check_attention_forward(c, fwd).passed);
    SUBCASE("O scaled by 1.25") {
        for (auto& x : fwd.o) x *= 1.25f;
        CHECK_FALSE(check_attention_forward(c, fwd).passed);
    }
    SUBCASE("the first token's output off by 10% (it sees one key, so its O is V's row exactly)") {
        fwd.o[5] += 0.1f * std::fabs(fwd.o[5]) + 1e-3f;
        CHECK_FALSE(check_attention_forward(c, fwd).passed);
    }
}

TEST_CASE("codec: the transform, error-bound and feedback checks fail on corrupted results") {
    const auto ex = octet::on_host(1);
    std::mt19937_64 g(octet_test::run_seed() ^ 13);
    const std::size_t n = 1500;
    const std::uint32_t block = 1024;
    const auto x = gradient_like(g, n);
    std::vector<float> y(octet::transform_length(octet::transform_kind::hadamard, n, block)), back(n);
    octet::transform_forward(ex, octet::transform_kind::hadamard, octet::as_cspan(x), octet::as_span(y), block, 5);
    octet::transform_inverse(ex, octet::transform_kind::hadamard, octet::as_cspan(y), octet::as_span(back), block, 5);
    for (const auto& c : check_hadamard(x, y, block, 5)) CHECK(c.passed);
    CHECK(check_hadamard_roundtrip(x, back, block).passed);
    // another seed's signs: still an isometry, but not this transform
    for (const auto& c : check_hadamard(x, y, block, 6))
        if (c.name == "codec.hadamard_vs_float64") CHECK_FALSE(c.passed);
    // scaled by 1 + 1e-5: neither accurate nor norm-preserving; one coordinate off: not accurate
    auto y_bad = y;
    for (auto& v : y_bad) v *= 1.00001f;
    for (const auto& c : check_hadamard(x, y_bad, block, 5)) CHECK_FALSE(c.passed);
    y_bad = y;
    y_bad[7] += 1e-5f * static_cast<float>(norm2(x));
    CHECK_FALSE(check_hadamard(x, y_bad, block, 5).front().passed);
    auto back_bad = back;
    back_bad[3] += 1e-5f * static_cast<float>(norm2(x));
    CHECK_FALSE(check_hadamard_roundtrip(x, back_bad, block).passed);

    const octet::codec_config cfg{octet::wire_format::e4m3, octet::transform_kind::hadamard, block, 0, 9, false};
    std::vector<std::uint8_t> msg(octet::encoded_size(cfg, n));
    octet::error_feedback fb(n, octet::residual_storage::f32);
    octet::encode_options opt;
    opt.feedback = fb.view();
    octet::encode_gradient(ex, cfg, octet::as_cspan(x), octet::as_span(msg), opt);
    std::vector<float> x_hat(n);
    octet::decode_gradient(ex, octet::as_cspan(msg), octet::as_span(x_hat));
    CHECK(check_codec_error(cfg, x, x_hat).passed);
    CHECK(check_feedback_residual(cfg, octet::residual_storage::f32, x, x_hat, fb.values()).passed);
    auto x_hat_bad = x_hat;
    for (auto& v : x_hat_bad) v *= 1.2f;
    CHECK_FALSE(check_codec_error(cfg, x, x_hat_bad).passed);
    // a residual that was not carried (all zero), or carried with the wrong sign
    CHECK_FALSE(
        check_feedback_residual(cfg, octet::residual_storage::f32, x, x_hat, std::vector<float>(n, 0.0f)).passed);
    auto neg = fb.values();
    for (auto& v : neg) v = -v;
    CHECK_FALSE(check_feedback_residual(cfg, octet::residual_storage::f32, x, x_hat, neg).passed);
}

TEST_CASE("optimizer: a step with the wrong learning rate, or a perturbed weight, fails") {
    const auto ex = octet::on_host(1);
    const adamw_case c = make_adamw_case(octet_test::run_seed() ^ 14, 1000);
    auto step_fp32 = [&](float lr) {
        octet::adamw_state<octet::state_codec::fp32> st(c.w.size());
        st.set_params(octet::as_cspan(c.w));
        st.m_codes = c.m;
        st.v_codes = c.v;
        octet::adamw_step(ex, st.ref(), octet::as_cspan(c.g), c.hyper, c.step, lr);
        return st;
    };
    const auto good = step_fp32(c.lr);
    CHECK(check_adamw_fp32(c, good.params, good.m_codes, good.v_codes).passed);
    const auto off = step_fp32(c.lr * 1.01f);
    CHECK_FALSE(check_adamw_fp32(c, off.params, off.m_codes, off.v_codes).passed);
    auto w = good.params;
    w[w.size() / 2] += 1e-4f * std::fabs(w[w.size() / 2]) + 1e-6f;  // far above a few float roundings
    CHECK_FALSE(check_adamw_fp32(c, w, good.m_codes, good.v_codes).passed);
    auto m = good.m_codes;
    m[5] = m[5] * 1.001f + 1e-30f;
    CHECK_FALSE(check_adamw_fp32(c, good.params, m, good.v_codes).passed);
}

TEST_CASE("conversion: the blockwise check fails on one wrong code or one wrong value") {
    const auto ex = octet::on_host(1);
    const std::size_t rows = 128, cols = 256;
    const auto x = quantize_test_matrix(octet_test::run_seed() ^ 15, rows, cols);
    octet::quantized_tensor<octet::recipes::blockwise_1x128> q(rows, cols);
    octet::quantize<octet::recipes::blockwise_1x128>(ex, octet::matrix_ref<const float>(x.data(), rows, cols), q.ref());
    std::vector<float> y(rows * cols);
    octet::dequantize(ex, q.cref(), octet::matrix_ref<float>(y.data(), rows, cols));
    for (const auto& c : check_blockwise(x, rows, cols, q, y)) CHECK(c.passed);
    auto q_bad = q;
    q_bad.data()[q_bad.layout().row_bytes * 5 + 17] ^= 0x01;  // one code one step off
    CHECK_FALSE(find(check_blockwise(x, rows, cols, q_bad, y), "quant.blockwise_1x128.vs_float64").passed);
    auto y_bad = y;
    float row_amax = 0;  // element 1000 is (3, 232): columns 128..255 of row 3 share its scale
    for (std::size_t j = 128; j < 256; ++j) row_amax = std::max(row_amax, std::fabs(x[3 * cols + j]));
    y_bad[1000] += 0.2f * std::fabs(x[1000]) + 1e-3f * row_amax;  // the bound is 2^-4 |x| + 2^-10 amax / 448
    CHECK_FALSE(find(check_blockwise(x, rows, cols, q, y_bad), "quant.blockwise_1x128.roundtrip").passed);
}

TEST_CASE("linear layer: the forward check fails on a corrupted output") {
    const auto ex = octet::on_host(1);
    const std::size_t tokens = 40, in = 200, out = 70;  // ragged 128-blocks along K and N
    std::mt19937_64 g(octet_test::run_seed() ^ 16);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(tokens * in), w(out * in), bias(out), y(tokens * out);
    for (auto& v : x) v = nd(g);
    for (auto& v : w) v = nd(g);
    for (auto& v : bias) v = nd(g);
    octet::linear_context<octet::linear_recipes::blockwise> ctx({tokens, in, out});
    octet::linear_forward(ex, ctx, octet::matrix_ref<const float>(x.data(), tokens, in),
                          octet::matrix_ref<const float>(w.data(), out, in), octet::as_cspan(bias),
                          octet::matrix_ref<float>(y.data(), tokens, out));
    CHECK(check_linear_forward(ex, x, w, bias, y, tokens, in, out).passed);
    auto y_bad = y;
    y_bad[123] += 1e-3f * (std::fabs(y_bad[123]) + 1.0f);
    CHECK_FALSE(check_linear_forward(ex, x, w, bias, y_bad, tokens, in, out).passed);
    // without the bias it is another function
    auto no_bias = y;
    for (std::size_t i = 0; i < tokens; ++i)
        for (std::size_t j = 0; j < out; ++j) no_bias[i * out + j] -= bias[j];
    CHECK_FALSE(check_linear_forward(ex, x, w, bias, no_bias, tokens, in, out).passed);
}
