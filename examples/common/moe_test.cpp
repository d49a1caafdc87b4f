// Tests of the transformer's mixture-of-experts MLP (examples/common/model/moe_block.hpp) and of a
// model built with it (model.hpp): each placement against a float64 MoE that routes alike (the
// float32 one to float roundoff, the FP8 ones within octet's norm-wise contract), the float32 model's
// gradient against finite differences where no routing decision moves, bf16 gradients, the ledger
// against the meter, and what is refused. Random inputs are fresh each run (the seed is printed).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model.hpp"
#include "support/random.hpp"

namespace {

using common::transformer;

double gelu64(double u) {
    return 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0)));
}
double gelu64_grad(double u) {
    return 0.5 * (1.0 + std::erf(u / std::sqrt(2.0))) + u * std::exp(-0.5 * u * u) / std::sqrt(2.0 * 3.141592653589793);
}

/// ||a - b||_F / ||b||_F.
double rel_error(const std::vector<float>& a, const std::vector<double>& b, std::size_t from = 0,
                 std::size_t count = std::size_t(-1)) {
    count = std::min(count, b.size() - from);
    double num = 0, den = 0;
    for (std::size_t i = from; i < from + count; ++i) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return std::sqrt(num / std::max(den, 1e-300));
}

/// A float64 MoE layer that takes the router's decisions the layer takes (octet::route on the same
/// float logits, summed in double and rounded once) and computes everything else in double.
struct moe_reference {
    std::vector<double> out, dx, dw;  // dw: router, up, down (the model's layout)
    std::vector<std::size_t> counts;

    moe_reference(const common::moe_shape& s, const std::vector<float>& x, std::size_t n, const std::vector<float>& w,
                  const std::vector<float>& dout) {
        const std::size_t d = s.d, F = s.ff, E = s.experts, k = s.k;
        const float* wr = w.data();
        const float* wu = wr + E * d;
        const float* wd = wu + E * F * d;
        std::vector<float> logits(n * E), weights(n * k);
        std::vector<std::int32_t> idx(n * k);
        for (std::size_t t = 0; t < n; ++t)
            for (std::size_t e = 0; e < E; ++e) {
                double acc = 0;
                for (std::size_t c = 0; c < d; ++c) acc += static_cast<double>(x[t * d + c]) * wr[e * d + c];
                logits[t * E + e] = static_cast<float>(acc);
            }
        counts.assign(E, 0);
        const auto opt = common::moe_router(k);
        octet::route(octet::on_host(1), octet::matrix_ref<const float>(logits.data(), n, E), opt,
                     octet::matrix_ref<std::int32_t>(idx.data(), n, k), octet::matrix_ref<float>(weights.data(), n, k),
                     octet::span<std::size_t>(counts.data(), E));
        out.assign(n * d, 0.0);
        dx.assign(n * d, 0.0);
        dw.assign(s.params(), 0.0);
        double* dwr = dw.data();
        double* dwu = dwr + E * d;
        double* dwd = dwu + E * F * d;
        std::vector<float> dweights(n * k);
        std::vector<double> u(F), h(F), y(d), dh(F);
        for (std::size_t t = 0; t < n; ++t)
            for (std::size_t j = 0; j < k; ++j) {
                const std::size_t e = static_cast<std::size_t>(idx[t * k + j]);
                const double wt = weights[t * k + j];
                for (std::size_t f = 0; f < F; ++f) {
                    double acc = 0;
                    for (std::size_t c = 0; c < d; ++c)
                        acc += static_cast<double>(wu[(e * F + f) * d + c]) * x[t * d + c];
                    u[f] = acc, h[f] = gelu64(acc);
                }
                double dwt = 0;
                for (std::size_t c = 0; c < d; ++c) {
                    double acc = 0;
                    for (std::size_t f = 0; f < F; ++f) acc += static_cast<double>(wd[(e * d + c) * F + f]) * h[f];
                    y[c] = acc;
                    out[t * d + c] += wt * acc;
                    dwt += static_cast<double>(dout[t * d + c]) * acc;
                }
                dweights[t * k + j] = static_cast<float>(dwt);
                // dY = w dout: dH = W_down^T dY, dW_down += dY H^T, dU = dH gelu'(U), dX += W_up^T dU, dW_up += dU X^T
                std::fill(dh.begin(), dh.end(), 0.0);
                for (std::size_t c = 0; c < d; ++c) {
                    const double dy = wt * dout[t * d + c];
                    for (std::size_t f = 0; f < F; ++f) {
                        dh[f] += dy * wd[(e * d + c) * F + f];
                        dwd[(e * d + c) * F + f] += dy * h[f];
                    }
                }
                for (std::size_t f = 0; f < F; ++f) {
                    const double du = dh[f] * gelu64_grad(u[f]);
                    for (std::size_t c = 0; c < d; ++c) {
                        dx[t * d + c] += du * wu[(e * F + f) * d + c];
                        dwu[(e * F + f) * d + c] += du * x[t * d + c];
                    }
                }
            }
        std::vector<float> dlogits(n * E);
        octet::route_backward(octet::on_host(1), octet::matrix_ref<const float>(logits.data(), n, E),
                              octet::matrix_ref<const std::int32_t>(idx.data(), n, k),
                              octet::matrix_ref<const float>(dweights.data(), n, k), opt,
                              octet::matrix_ref<float>(dlogits.data(), n, E), s.aux_loss,
                              octet::span<const std::size_t>(counts.data(), E));
        for (std::size_t t = 0; t < n; ++t)
            for (std::size_t e = 0; e < E; ++e)
                for (std::size_t c = 0; c < d; ++c) {
                    dx[t * d + c] += static_cast<double>(dlogits[t * E + e]) * wr[e * d + c];
                    dwr[e * d + c] += static_cast<double>(dlogits[t * E + e]) * x[t * d + c];
                }
    }
};

common::model_config moe_config(int vocab, int layers, int every) {
    common::model_config c;
    c.name = "test_moe";
    c.vocab = vocab;
    c.d_model = 64;
    c.layers = layers;
    c.heads_q = 2;
    c.heads_kv = 1;
    c.head_dim = 32;
    c.d_ff = 128;
    c.seq_len = 16;
    c.tied_head = true;
    c.moe_experts = 4;
    c.moe_top_k = 2;
    c.moe_every = every;
    return c;
}

common::recipe_config recipe(common::linear_mode l, common::attention_mode a = common::attention_mode::float32) {
    common::recipe_config r;
    r.name = "test";
    r.linear = l;
    r.attention = a;
    return r;
}

std::vector<std::int32_t> random_tokens(std::mt19937_64& g, int batch, int seq_len, int vocab) {
    std::uniform_int_distribution<int> pick(0, vocab - 1);
    std::vector<std::int32_t> t(static_cast<std::size_t>(batch) * (seq_len + 1));
    for (auto& v : t) v = pick(g);
    return t;
}

}  // namespace

TEST_CASE("moe block: float32 and FP8 placements against a float64 MoE that routes alike") {
    auto g = octet_test::rng(61);
    using LM = common::linear_mode;
    for (const LM mode : {LM::float32, LM::blockwise, LM::mxfp8}) {
        CAPTURE(static_cast<int>(mode));
        common::moe_shape s;
        s.max_tokens = 100, s.d = 128, s.ff = 96, s.experts = 8, s.k = 2, s.aux_loss = 0.01f;
        const std::size_t n = 93, d = s.d, E = s.experts;  // fewer tokens than the block holds
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> x(n * d), w(s.params()), dout(n * d);
        for (auto& v : x) v = nd(g);
        for (auto& v : w) v = 0.08f * nd(g);
        for (auto& v : dout) v = nd(g);
        // real data: zero rows (padding), rows of 1e-6 magnitude, and an expert no token selects
        // (its router row far negative along a column every token holds positive)
        for (std::size_t c = 0; c < d; ++c) x[5 * d + c] = 0.0f, x[6 * d + c] *= 1e-6f, dout[7 * d + c] = 0.0f;
        for (std::size_t t = 0; t < n; ++t) x[t * d] = std::fabs(x[t * d]) + 0.5f;
        x[5 * d] = 0.0f;
        w[(E - 1) * d] = -40.0f;
        common::memory_meter meter;
        common::moe_scratch scratch(meter, s);
        auto block = common::make_moe_block(meter, mode, s, &scratch);
        std::vector<float> out(n * d, NAN), dx(n * d, NAN), dw(s.params(), NAN);
        const auto ex = octet::on_host(2);
        const auto st = block->forward(ex, x.data(), n, w.data(), out.data());
        block->backward(ex, dout.data(), n, w.data(), dx.data(), dw.data());
        const moe_reference ref(s, x, n, w, dout);

        CHECK(st.rows == n * s.k);
        CHECK(st.dropped == 0);
        CHECK(st.counts == ref.counts);
        CHECK(st.counts[E - 1] == 0);
        CHECK(st.dispatch.bf16 == n * s.k * d * 2);
        CHECK(st.dispatch.codes + st.dispatch.scales < st.dispatch.bf16);
        const std::size_t router = E * d, up = E * s.ff * d;
        const double e_out = rel_error(out, ref.out), e_dx = rel_error(dx, ref.dx),
                     e_r = rel_error(dw, ref.dw, 0, router), e_u = rel_error(dw, ref.dw, router, up),
                     e_d = rel_error(dw, ref.dw, router + up);
        std::printf("moe block mode %d: relative errors out %.2e dx %.2e dW_r %.2e dW_up %.2e dW_down %.2e\n",
                    static_cast<int>(mode), e_out, e_dx, e_r, e_u, e_d);
        double fwd = 1e-5, bwd = 1e-4;  // float32: accumulation roundoff
        if (mode == LM::blockwise)
            fwd = octet::moe_forward_error_bound<octet::linear_recipes::blockwise>(),
            bwd = octet::moe_backward_error_bound<octet::linear_recipes::blockwise>();
        if (mode == LM::mxfp8)
            fwd = octet::moe_forward_error_bound<octet::linear_recipes::mxfp8>(),
            bwd = octet::moe_backward_error_bound<octet::linear_recipes::mxfp8>();
        CHECK(e_out <= fwd);
        CHECK(e_dx <= bwd);
        CHECK(e_r <= bwd);
        CHECK(e_u <= bwd);
        CHECK(e_d <= bwd);
        // the expert no token reached gets a zero gradient, exactly
        const std::size_t F = s.ff;
        CHECK(std::all_of(dw.begin() + router + (E - 1) * F * d, dw.begin() + router + E * F * d,
                          [](float v) { return v == 0.0f; }));
        CHECK(std::all_of(dw.begin() + router + up + (E - 1) * d * F, dw.end(), [](float v) { return v == 0.0f; }));
    }
}

TEST_CASE("moe model: the float32 gradient of the experts, final norm and head matches finite differences") {
    // One MoE block: the experts' weights, the final norm and the head lie after every routing
    // decision, so a small step in them moves no token to another expert and the loss is smooth.
    auto g = octet_test::rng(62);
    auto cfg = moe_config(13, 1, 1);
    common::memory_meter meter;
    transformer model(cfg, recipe(common::linear_mode::float32), meter, octet::on_host(1), 2, 1);
    const auto tokens = random_tokens(g, 2, cfg.seq_len, cfg.vocab);
    std::vector<float> params(transformer::parameter_count(cfg)), grads(params.size());
    transformer::init_parameters(cfg, g(), octet::as_span(params));
    for (auto& v : params) v *= 6.0f;
    const common::parameter_layout lay(cfg);
    const auto& B = lay.blocks[0];
    for (int k = 0; k < cfg.d_model; ++k) params[lay.norm_f + static_cast<std::size_t>(k)] = 1.0f;
    model.forward_backward(octet::as_cspan(params), tokens.data(), 2, octet::as_span(grads));
    const std::size_t d = static_cast<std::size_t>(cfg.d_model);
    const std::pair<std::size_t, std::size_t> ranges[] = {{B.up, B.moe_params - (B.up - B.router)},
                                                          {lay.norm_f, d},
                                                          {lay.tok_emb, static_cast<std::size_t>(cfg.vocab) * d}};
    // (tied head: the embedding's gradient holds the head's part and the input's; the input's moves
    // routing, so only rows of tokens the batch never reads are pure head gradient)
    std::vector<bool> read(static_cast<std::size_t>(cfg.vocab), false);
    for (std::size_t b = 0; b < 2; ++b)
        for (int p = 0; p < cfg.seq_len; ++p) read[static_cast<std::size_t>(tokens[b * (cfg.seq_len + 1) + p])] = true;
    double gmax = 0;
    for (float v : grads) gmax = std::max(gmax, static_cast<double>(std::fabs(v)));
    const float eps = 2e-3f;
    std::vector<double> rel;
    double ab = 0, aa = 0, bb = 0;
    for (const auto& [off, count] : ranges) {
        std::uniform_int_distribution<std::size_t> at(0, count - 1);
        for (int i = 0; i < 60; ++i) {
            const std::size_t p = off + at(g);
            if (off == lay.tok_emb && read[(p - off) / d]) continue;
            const float keep = params[p];
            params[p] = keep + eps;
            const double up = model.evaluate(octet::as_cspan(params), tokens.data(), 2);
            params[p] = keep - eps;
            const double down = model.evaluate(octet::as_cspan(params), tokens.data(), 2);
            params[p] = keep;
            const double fd = (up - down) / (static_cast<double>(keep + eps) - static_cast<double>(keep - eps));
            rel.push_back(std::fabs(fd - grads[p]) /
                          std::max({std::fabs(fd), std::fabs(static_cast<double>(grads[p])), 1e-2 * gmax}));
            ab += fd * grads[p], aa += fd * fd, bb += static_cast<double>(grads[p]) * grads[p];
        }
    }
    std::sort(rel.begin(), rel.end());
    const double cos = ab / std::sqrt(aa * bb);
    std::printf("moe gradient check: %zu coordinates, median relative error %.2e, 90th %.2e, cosine %.7f\n", rel.size(),
                rel[rel.size() / 2], rel[rel.size() * 9 / 10], cos);
    CHECK(rel.size() > 100);
    CHECK(rel[rel.size() / 2] < 1e-2);
    CHECK(cos > 0.999);
}

TEST_CASE("moe model: bf16 gradients and bf16 master weights give the float path's bits") {
    auto g = octet_test::rng(63);
    for (const int every : {1, 2}) {
        const auto cfg = moe_config(19, 2, every);
        for (auto r : {recipe(common::linear_mode::float32),
                       recipe(common::linear_mode::blockwise, common::attention_mode::fp8)}) {
            CAPTURE(every);
            r.saved_activations = common::saved_storage::fp8;
            auto rb = r;
            rb.gradients = common::gradient_storage::bf16;
            rb.master = common::master_mode::bf16_stochastic;
            std::vector<float> params(transformer::parameter_count(cfg));
            transformer::init_parameters(cfg, g(), octet::as_span(params));
            std::vector<octet::bf16> p16(params.size());
            for (std::size_t i = 0; i < params.size(); ++i) {  // bf16 masters, and their exact float copy
                p16[i] = octet::to_bf16(params[i]);
                params[i] = octet::to_float(p16[i]);
            }
            const auto tokens = random_tokens(g, 3, cfg.seq_len, cfg.vocab);
            std::vector<float> gf(params.size(), NAN);
            std::vector<octet::bf16> gb(params.size(), octet::to_bf16(NAN));
            common::memory_meter m0, m1;
            transformer a(cfg, r, m0, octet::on_host(2), 3, 7), b(cfg, rb, m1, octet::on_host(2), 3, 7);
            const auto ta = a.forward_backward(octet::as_cspan(params), tokens.data(), 3, octet::as_span(gf));
            const auto tb = b.forward_backward(octet::span<const octet::bf16>(p16.data(), p16.size()), tokens.data(), 3,
                                               octet::span<octet::bf16>(gb.data(), gb.size()));
            CHECK(ta.loss == tb.loss);
            CHECK(ta.expert_tokens == tb.expert_tokens);
            CHECK(ta.expert_tokens.size() == static_cast<std::size_t>(cfg.moe_blocks()));
            std::size_t differ = 0;
            for (std::size_t i = 0; i < gf.size(); ++i) {
                const octet::bf16 want = octet::to_bf16(gf[i]);
                differ += std::memcmp(&want, &gb[i], sizeof want) != 0;
            }
            CHECK(differ == 0);
            // every assignment counted, every row dispatched
            for (const auto& block : ta.expert_tokens) {
                double sum = 0;
                for (double v : block) sum += v;
                CHECK(sum == 3.0 * cfg.seq_len * cfg.moe_top_k);
            }
            CHECK(ta.moe_dropped == 0);
            CHECK(ta.dispatch_bf16_bytes == 2.0 * 3 * cfg.seq_len * cfg.moe_top_k * cfg.d_model * cfg.moe_blocks());
        }
    }
}

TEST_CASE("moe model: the ledger's prediction is what the meter books, and a step allocates nothing") {
    auto g = octet_test::rng(64);
    using LM = common::linear_mode;
    using AM = common::attention_mode;
    for (const int every : {1, 2})
        for (auto l : {LM::float32, LM::blockwise, LM::mxfp8})
            for (auto a : {AM::float32, AM::fp8})
                for (auto st :
                     {common::saved_storage::float32, common::saved_storage::bf16, common::saved_storage::fp8})
                    for (const bool recompute : {false, true}) {
                        auto cfg = moe_config(23, 2, every);
                        cfg.d_model = 128, cfg.heads_q = 4, cfg.d_ff = 256;
                        auto r = recipe(l, a);
                        r.saved_activations = st;
                        r.recompute_linear_inputs = recompute;
                        r.gradients = recompute ? common::gradient_storage::bf16 : common::gradient_storage::float32;
                        CAPTURE(every);
                        CAPTURE(static_cast<int>(l));
                        CAPTURE(static_cast<int>(a));
                        CAPTURE(static_cast<int>(st));
                        CAPTURE(recompute);
                        common::memory_meter meter;
                        transformer model(cfg, r, meter, octet::on_host(2), 3, 0);
                        const auto& L = meter.ledger();
                        CHECK(L.bytes(octet::memory_category::activations) ==
                              transformer::activation_bytes(cfg, r, 3, 2));
                        CHECK(L.bytes(octet::memory_category::temporaries) ==
                              transformer::temporary_bytes(cfg, r, 3, 2));
                        const double before = L.bytes(octet::memory_category::activations),
                                     before_tmp = L.bytes(octet::memory_category::temporaries);
                        model.set_high_precision(true);
                        CHECK(L.bytes(octet::memory_category::activations) - before ==
                              transformer::raise_precision_bytes(cfg, r, 3));
                        model.set_high_precision(false);
                        CHECK(L.bytes(octet::memory_category::temporaries) == before_tmp);
                        // a step (and a raised one) runs in what was booked: octet's operations on the arena
                        std::vector<float> params(transformer::parameter_count(cfg)), grads(params.size());
                        std::vector<octet::bf16> g16(params.size());
                        transformer::init_parameters(cfg, g(), octet::as_span(params));
                        const double total = L.total();
                        for (const bool raised : {false, true}) {
                            model.set_high_precision(raised);
                            const auto tokens = random_tokens(g, 3, cfg.seq_len, cfg.vocab);
                            if (r.gradients == common::gradient_storage::bf16)
                                model.forward_backward(octet::as_cspan(params), tokens.data(), 3,
                                                       octet::span<octet::bf16>(g16.data(), g16.size()));
                            else
                                model.forward_backward(octet::as_cspan(params), tokens.data(), 3,
                                                       octet::as_span(grads));
                            model.set_high_precision(false);
                            CHECK(L.total() == total);
                        }
                    }
}

TEST_CASE("moe: sizes parse, and what the mixture of experts does not run is refused by name") {
    const auto c = common::size_config("small_moe8x2_every2");
    CHECK(c.moe_experts == 8);
    CHECK(c.moe_top_k == 2);
    CHECK(c.moe_every == 2);
    CHECK(c.moe_blocks() == 2);
    CHECK(c.expert_ff() == c.d_ff / 2);
    CHECK(common::size_config("tiny_moe4x1").moe_blocks() == 1);
    CHECK(common::size_config("tiny").moe_blocks() == 0);
    for (const char* bad : {"tiny_moe", "tiny_moe8", "tiny_moe8x0", "tiny_moe2x4", "tiny_moe8x2_every0", "tiny_moe8x2x",
                            "tiny_moe8x3", "tiny_moe8x2_every2", "huge_moe8x2"})
        CHECK_THROWS_AS(common::size_config(bad), std::invalid_argument);
    const auto cfg = moe_config(11, 2, 1);
    common::memory_meter meter;
    for (auto l : {common::linear_mode::bf16, common::linear_mode::tensorwise, common::linear_mode::nvfp4}) {
        CHECK_THROWS_WITH_AS(transformer(cfg, recipe(l), meter, octet::on_host(1), 2, 0),
                             doctest::Contains("argument 'recipe.linear'"), octet::error);
    }
}
