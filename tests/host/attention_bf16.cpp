// The bf16 entry points (octet/attention/bf16_inputs.hpp): they equal quantizing with the
// documented recipes and calling the FP8 path (bit for bit), they land within the end-to-end
// tolerance of the float64 reference on the original values, and they refuse head dims they do
// not serve.
#include <doctest/doctest.h>

#include <vector>

#include "attention_common.hpp"
#include "octet/attention/bf16_inputs.hpp"

namespace attention_bf16_test {
using namespace octet;

std::vector<bf16> to_bf16_vec(const std::vector<float>& x) {
    std::vector<bf16> v(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) v[i] = to_bf16(x[i]);
    return v;
}
std::vector<double> widen_bf16(const std::vector<bf16>& x) {
    std::vector<double> v(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) v[i] = to_float(x[i]);
    return v;
}
std::vector<double> widen_f(const std::vector<float>& x) {
    return std::vector<double>(x.begin(), x.end());
}

template <int D>
void check(bool causal, std::uint64_t salt) {
    attention_test::config c;
    c.lens_q = {37, 0, 70};
    c.hq = 4;
    c.hkv = 2;
    c.d = D;
    c.causal = causal;
    c.salt = salt;
    const auto p = attention_test::make_problem(c);
    const auto shape = p.shape();
    const auto q = to_bf16_vec(p.q), k = to_bf16_vec(p.k), v = to_bf16_vec(p.v), dout = to_bf16_vec(p.dout);
    const std::size_t qc = static_cast<std::size_t>(c.hq) * D, kc = static_cast<std::size_t>(c.hkv) * D;
    const auto mq = [&](const std::vector<bf16>& x, std::size_t rows, std::size_t cols) {
        return matrix_ref<const bf16>(x.data(), rows, cols);
    };
    attention_options fo;
    fo.mask = causal ? attention_mask::causal : attention_mask::full;
    attention_backward_options bo;
    bo.mask = fo.mask;
    bo.delta = delta_mode::matched;

    // through the bf16 entry points
    std::vector<float> o(p.tq * qc), lse(static_cast<std::size_t>(c.hq) * p.tq), dq(p.tq * qc), dk(p.tk * kc),
        dv(p.tk * kc);
    attention_forward(on_host(), shape, mq(q, p.tq, qc), mq(k, p.tk, kc), mq(v, p.tk, kc),
                      matrix_ref<float>(o.data(), p.tq, qc), as_span(lse), fo);
    attention_backward(on_host(), shape, mq(q, p.tq, qc), mq(k, p.tk, kc), mq(v, p.tk, kc),
                       matrix_ref<const float>(o.data(), p.tq, qc), as_cspan(lse), mq(dout, p.tq, qc),
                       matrix_ref<float>(dq.data(), p.tq, qc), matrix_ref<float>(dk.data(), p.tk, kc),
                       matrix_ref<float>(dv.data(), p.tk, kc), bo);

    // by hand: quantize with the documented recipes, call the FP8 path
    using R = attention_input_recipes<D>;
    quantized_tensor<typename R::qk> qq(p.tq, qc), kq(p.tk, kc);
    quantized_tensor<typename R::v> vq(p.tk, kc);
    quantized_tensor<typename R::dout> dq8(p.tq, qc);
    quantize<typename R::qk>(on_host(), mq(q, p.tq, qc), qq.ref());
    quantize<typename R::qk>(on_host(), mq(k, p.tk, kc), kq.ref());
    quantize<typename R::v>(on_host(), mq(v, p.tk, kc), vq.ref());
    quantize<typename R::dout>(on_host(), mq(dout, p.tq, qc), dq8.ref());
    std::vector<float> o2(o.size()), lse2(lse.size()), dq2(dq.size()), dk2(dk.size()), dv2(dv.size());
    attention_forward(on_host(), shape, qq.cref(), kq.cref(), vq.cref(), matrix_ref<float>(o2.data(), p.tq, qc),
                      as_span(lse2), fo);
    attention_backward(on_host(), shape, qq.cref(), kq.cref(), vq.cref(), matrix_ref<const float>(o2.data(), p.tq, qc),
                       as_cspan(lse2), dq8.cref(), matrix_ref<float>(dq2.data(), p.tq, qc),
                       matrix_ref<float>(dk2.data(), p.tk, kc), matrix_ref<float>(dv2.data(), p.tk, kc), bo);
    CHECK(o == o2);
    CHECK(dq == dq2);
    CHECK(dk == dk2);
    CHECK(dv == dv2);

    // Against float64 on the quantized operands (the path's own error: the internal tolerances of
    // tests/host/attention_host.cpp for per-head V) and on the bf16 values (that error plus what
    // quantizing the inputs does to the exact function, at most twice the internal tolerance more).
    const auto deq = [&](const auto& t, std::size_t rows, std::size_t cols) {
        std::vector<float> y(rows * cols);
        dequantize(on_host(), t.cref(), matrix_ref<float>(y.data(), rows, cols));
        return widen_f(y);
    };
    const auto pr = p.reference_problem();
    const auto rq =
        reference::attention(pr, deq(qq, p.tq, qc), deq(kq, p.tk, kc), deq(vq, p.tk, kc), deq(dq8, p.tq, qc));
    const auto r0 = reference::attention(pr, widen_bf16(q), widen_bf16(k), widen_bf16(v), widen_bf16(dout));
    using attention_test::rel_l2;
    INFO("D=" << D << " causal=" << causal);
    const double tol[4] = {0.015, 0.03, 0.025, 0.04};  // O, dQ, dK, dV
    const std::vector<double>* got[4] = {nullptr, nullptr, nullptr, nullptr};
    const auto wo = widen_f(o), wdq = widen_f(dq), wdk = widen_f(dk), wdv = widen_f(dv);
    got[0] = &wo, got[1] = &wdq, got[2] = &wdk, got[3] = &wdv;
    const std::vector<double>* in_q[4] = {&rq.o, &rq.dq, &rq.dk, &rq.dv};
    const std::vector<double>* in_0[4] = {&r0.o, &r0.dq, &r0.dk, &r0.dv};
    for (int t = 0; t < 4; ++t) {
        CHECK(rel_l2(*got[t], *in_q[t]) <= tol[t]);
        CHECK(rel_l2(*got[t], *in_0[t]) <= rel_l2(*in_q[t], *in_0[t]) + 2 * tol[t]);
    }
}

}  // namespace attention_bf16_test

TEST_CASE("bf16 entry points equal quantize + the FP8 path, within tolerance of float64") {
    attention_bf16_test::check<64>(false, 11);
    attention_bf16_test::check<64>(true, 12);
    attention_bf16_test::check<128>(true, 13);
}

TEST_CASE("bf16 entry points refuse head dims they do not serve") {
    using namespace octet;
    std::vector<std::int32_t> cu{0, 4};
    attention_shape s;
    s.cu_seqlens_q = as_cspan(cu);
    s.heads_q = s.heads_kv = 1;
    s.head_dim = 48;
    std::vector<bf16> x(4 * 48);
    std::vector<float> o(4 * 48), lse(4);
    const matrix_ref<const bf16> m(x.data(), 4, 48);
    CHECK_THROWS_WITH_AS(attention_forward(on_host(), s, m, m, m, matrix_ref<float>(o.data(), 4, 48), as_span(lse)),
                         doctest::Contains("shape.head_dim"), octet::error);
}
