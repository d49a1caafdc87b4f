// Tests of the examples' shared transformer (examples/common/model.hpp): the float32
// model's gradient against finite differences, float32 attention against octet's float64
// reference, each low-precision recipe's gradient against float32's, raising precision, the
// memory meter, and bad arguments. Random inputs are fresh each run (the seed is printed).
#include <doctest/doctest.h>

#include <octet/reference/attention.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "model.hpp"
#include "support/random.hpp"

namespace {

using common::transformer;

common::model_config tiny_config(int vocab, bool tied) {
    common::model_config c;
    c.name = "test";
    c.vocab = vocab;
    c.d_model = 64;
    c.layers = 2;
    c.heads_q = 2;
    c.heads_kv = 1;
    c.head_dim = 32;
    c.d_ff = 128;
    c.seq_len = 16;
    c.tied_head = tied;
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

/// Initialized parameters made less trivial than GPT-2's start (which has near-uniform attention
/// and tiny gradients for Q and K): matrices scaled up, gains drawn around 1.
std::vector<float> lively_params(const common::model_config& c, std::mt19937_64& g, float matrix_scale) {
    std::vector<float> p(transformer::parameter_count(c));
    transformer::init_parameters(c, g(), octet::as_span(p));
    const common::parameter_layout lay(c);
    for (auto& v : p) v *= matrix_scale;
    std::uniform_real_distribution<float> gain(0.5f, 1.5f);
    auto gains = [&](std::size_t off) {
        for (int k = 0; k < c.d_model; ++k) p[off + static_cast<std::size_t>(k)] = gain(g);
    };
    for (const auto& b : lay.blocks) {
        gains(b.norm1);
        gains(b.norm2);
    }
    gains(lay.norm_f);
    return p;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
    double ab = 0, aa = 0, bb = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        ab += static_cast<double>(a[i]) * b[i];
        aa += static_cast<double>(a[i]) * a[i];
        bb += static_cast<double>(b[i]) * b[i];
    }
    return ab / std::sqrt(aa * bb);
}

/// (offset, size) of every tensor of the layout.
std::vector<std::pair<std::size_t, std::size_t>> tensors(const common::model_config& c) {
    const common::parameter_layout lay(c);
    const std::size_t d = static_cast<std::size_t>(c.d_model), F = static_cast<std::size_t>(c.d_ff);
    std::vector<std::pair<std::size_t, std::size_t>> t = {{lay.tok_emb, static_cast<std::size_t>(c.vocab) * d},
                                                          {lay.pos_emb, static_cast<std::size_t>(c.seq_len) * d}};
    for (const auto& b : lay.blocks) {
        t.push_back({b.norm1, d});
        t.push_back({b.qkv, lay.qkv_out * d});
        t.push_back({b.proj, d * lay.attn_width});
        t.push_back({b.norm2, d});
        t.push_back({b.up, F * d});
        t.push_back({b.down, d * F});
    }
    t.push_back({lay.norm_f, d});
    if (!c.tied_head) t.push_back({lay.head, static_cast<std::size_t>(c.vocab) * d});
    return t;
}

}  // namespace

TEST_CASE("model: the float32 gradient matches central finite differences of the loss") {
    auto g = octet_test::rng(1);
    for (bool tied : {false, true}) {
        CAPTURE(tied);
        const auto cfg = tiny_config(13, tied);
        common::memory_meter meter;
        transformer model(cfg, recipe(common::linear_mode::float32), meter, octet::on_host(1), 2, 1);
        const auto tokens = random_tokens(g, 2, cfg.seq_len, cfg.vocab);
        auto params = lively_params(cfg, g, 6.0f);
        std::vector<float> grads(params.size());
        model.forward_backward(octet::as_cspan(params), tokens.data(), 2, octet::as_span(grads));

        // ~200 coordinates, at least 6 in every tensor.
        std::vector<std::size_t> picks;
        for (const auto& [off, n] : tensors(cfg)) {
            std::uniform_int_distribution<std::size_t> at(0, n - 1);
            const std::size_t k = std::max<std::size_t>(6, 200 * n / params.size());
            for (std::size_t i = 0; i < k; ++i) picks.push_back(off + at(g));
        }
        double gmax = 0;
        for (float v : grads) gmax = std::max(gmax, static_cast<double>(std::fabs(v)));
        // The loss is evaluated in float (about 1e-7 relative): eps trades that noise (~1e-7 / eps)
        // against the O(eps^2) truncation of the central difference.
        const float eps = 2e-3f;
        std::vector<float> fd, an;
        std::vector<double> rel;
        for (std::size_t i : picks) {
            const float keep = params[i];
            params[i] = keep + eps;
            const double up = model.evaluate(octet::as_cspan(params), tokens.data(), 2);
            params[i] = keep - eps;
            const double down = model.evaluate(octet::as_cspan(params), tokens.data(), 2);
            params[i] = keep;
            const double d = (up - down) / (static_cast<double>(keep + eps) - static_cast<double>(keep - eps));
            fd.push_back(static_cast<float>(d));
            an.push_back(grads[i]);
            rel.push_back(std::fabs(d - grads[i]) /
                          std::max({std::fabs(d), std::fabs(static_cast<double>(grads[i])), 1e-2 * gmax}));
        }
        std::sort(rel.begin(), rel.end());
        const double median = rel[rel.size() / 2], cos = cosine(fd, an);
        std::printf("gradient check (tied %d): %zu coordinates, median relative error %.2e, 90th %.2e, cosine %.7f\n",
                    tied, rel.size(), median, rel[rel.size() * 9 / 10], cos);
        CHECK(median < 1e-2);
        CHECK(cos > 0.999);
    }
}

TEST_CASE("model: float32 attention forward and backward match the float64 reference") {
    auto g = octet_test::rng(2);
    for (int hd : {32, 64}) {
        common::attention_dims a{3, 37, 4, 2, static_cast<std::size_t>(hd)};
        CAPTURE(hd);
        const std::size_t N = a.tokens(), W = a.qkv_ld(), A = a.o_ld();
        std::normal_distribution<float> n(0.0f, 1.0f);
        std::vector<float> qkv(N * W), dO(N * A), O(N * A, NAN), lse(a.heads_q * N, NAN), dqkv(N * W, NAN);
        for (auto& v : qkv) v = 1.5f * n(g);
        for (auto& v : dO) v = n(g);
        const std::size_t workers = 2;
        std::vector<float> scratch(workers * common::attention_scratch_floats(a.len, a.head_dim));
        common::attention_forward_f32(octet::on_host(2), a, qkv.data(), O.data(), lse.data(), scratch.data(), workers);
        common::attention_backward_f32(octet::on_host(2), a, qkv.data(), O.data(), lse.data(), dO.data(), dqkv.data(),
                                       scratch.data(), workers);

        octet::reference::attention_problem pr;
        for (std::size_t b = 0; b <= a.batch; ++b) pr.cu_q.push_back(static_cast<int>(b * a.len));
        pr.heads_q = static_cast<int>(a.heads_q);
        pr.heads_kv = static_cast<int>(a.heads_kv);
        pr.head_dim = hd;
        pr.causal = true;
        std::vector<double> q, k, v, go(dO.begin(), dO.end());
        for (std::size_t t = 0; t < N; ++t) {
            const float* row = qkv.data() + t * W;
            q.insert(q.end(), row, row + A);
            k.insert(k.end(), row + A, row + A + a.heads_kv * a.head_dim);
            v.insert(v.end(), row + A + a.heads_kv * a.head_dim, row + W);
        }
        const auto ref = octet::reference::attention(pr, q, k, v, go);
        // max |error| over max |value| of each output: float32 sums of a few dozen terms
        auto check = [](const char* what, const std::vector<double>& want, auto get) {
            double err = 0, mag = 0;
            for (std::size_t i = 0; i < want.size(); ++i) {
                const double got = get(i);
                REQUIRE(std::isfinite(got));
                err = std::max(err, std::fabs(got - want[i]));
                mag = std::max(mag, std::fabs(want[i]));
            }
            CAPTURE(what);
            CHECK(err <= 2e-5 * mag);
        };
        check("O", ref.o, [&](std::size_t i) { return O[i]; });
        check("L", ref.lse, [&](std::size_t i) { return lse[i]; });
        const std::size_t kw = a.heads_kv * a.head_dim;
        check("dQ", ref.dq, [&](std::size_t i) { return dqkv[(i / A) * W + i % A]; });
        check("dK", ref.dk, [&](std::size_t i) { return dqkv[(i / kw) * W + A + i % kw]; });
        check("dV", ref.dv, [&](std::size_t i) { return dqkv[(i / kw) * W + A + kw + i % kw]; });
    }
}

TEST_CASE("model: the float32 GEMM matches a float64 product, any shape and thread count") {
    auto g = octet_test::rng(3);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (auto [M, N, K] :
         {std::array<std::size_t, 3>{1, 1, 1}, {5, 33, 7}, {67, 130, 129}, {128, 64, 300}, {3, 0, 4}}) {
        std::vector<float> A(M * K), B(K * N), C(M * N, NAN), C0(M * N);
        for (auto& v : A) v = n(g);
        for (auto& v : B) v = n(g);
        for (auto& v : C0) v = n(g);
        for (bool acc : {false, true}) {
            if (acc) C = C0;
            common::gemm(octet::on_host(2), A.data(), K, B.data(), N, C.data(), N, M, N, K, acc);
            for (std::size_t i = 0; i < M; ++i)
                for (std::size_t j = 0; j < N; ++j) {
                    double want = acc ? C0[i * N + j] : 0.0, mag = std::fabs(want);
                    for (std::size_t k = 0; k < K; ++k) {
                        want += static_cast<double>(A[i * K + k]) * B[k * N + j];
                        mag += std::fabs(static_cast<double>(A[i * K + k]) * B[k * N + j]);
                    }
                    REQUIRE(std::fabs(C[i * N + j] - want) <= 1e-6 * mag + 1e-30);
                }
        }
        // the thread count never changes the bits
        std::vector<float> C1(M * N), C2(M * N);
        common::gemm(octet::on_host(1), A.data(), K, B.data(), N, C1.data(), N, M, N, K);
        common::gemm(octet::on_host(2), A.data(), K, B.data(), N, C2.data(), N, M, N, K);
        CHECK(C1 == C2);
    }
}

TEST_CASE("model: the meter books every buffer at construction, and a step allocates nothing") {
    auto g = octet_test::rng(4);
    const auto cfg = tiny_config(17, true);
    auto packed = recipe(common::linear_mode::mxfp8, common::attention_mode::fp8);
    packed.saved_activations = common::saved_storage::fp8;  // every octet operation on the model's scratch arena
    auto mixed = recipe(common::linear_mode::bf16);
    mixed.saved_activations = common::saved_storage::bf16;  // bf16 mixed precision: attention's saves in bf16 too
    const common::recipe_config recipes[] = {recipe(common::linear_mode::float32),
                                             recipe(common::linear_mode::bf16),
                                             recipe(common::linear_mode::blockwise, common::attention_mode::fp8),
                                             recipe(common::linear_mode::tensorwise_delayed),
                                             packed,
                                             mixed};
    for (const auto& r : recipes) {
        common::memory_meter meter;
        transformer model(cfg, r, meter, octet::on_host(2), 3, 5);
        const auto& L = meter.ledger();
        CHECK(L.bytes(octet::memory_category::activations) > 0);
        CHECK(L.bytes(octet::memory_category::temporaries) > 0);
        const double total = L.total(), peak = L.peak_total();
        std::vector<float> params(transformer::parameter_count(cfg)), grads(params.size());
        transformer::init_parameters(cfg, g(), octet::as_span(params));
        for (int step = 0; step < 2; ++step) {
            const auto tokens = random_tokens(g, 3, cfg.seq_len, cfg.vocab);
            model.forward_backward(octet::as_cspan(params), tokens.data(), 3, octet::as_span(grads));
            model.evaluate(octet::as_cspan(params), tokens.data(), 2);
        }
        CHECK(L.total() == total);
        CHECK(L.peak_total() == peak);
    }
}

TEST_CASE("model: bf16 master weights read in place compute the bits of their float copy") {
    auto g = octet_test::rng(21);
    for (const bool tied : {false, true}) {
        const auto cfg = tiny_config(19, tied);
        auto r = recipe(common::linear_mode::blockwise, common::attention_mode::fp8);
        r.master = common::master_mode::bf16_stochastic;
        r.saved_activations = common::saved_storage::fp8;
        std::vector<float> init(transformer::parameter_count(cfg));
        transformer::init_parameters(cfg, g(), octet::as_span(init));
        std::vector<octet::bf16> masters(init.size());
        std::vector<float> widened(init.size());
        for (std::size_t i = 0; i < init.size(); ++i) {
            masters[i] = octet::to_bf16(init[i]);
            widened[i] = octet::to_float(masters[i]);
        }
        const auto tokens = random_tokens(g, 3, cfg.seq_len, cfg.vocab);
        std::vector<float> from_float(init.size(), NAN), from_bf16(init.size(), NAN);
        common::memory_meter m0, m1;
        transformer a(cfg, r, m0, octet::on_host(2), 3, 7), b(cfg, r, m1, octet::on_host(2), 3, 7);
        const auto ta = a.forward_backward(octet::as_cspan(widened), tokens.data(), 3, octet::as_span(from_float));
        const octet::span<const octet::bf16> view(masters.data(), masters.size());
        const auto tb = b.forward_backward(view, tokens.data(), 3, octet::as_span(from_bf16));
        CHECK(ta.loss == tb.loss);
        CHECK(std::memcmp(from_float.data(), from_bf16.data(), init.size() * sizeof(float)) == 0);
        CHECK(a.evaluate(octet::as_cspan(widened), tokens.data(), 3) == b.evaluate(view, tokens.data(), 3));
        // the decode region is booked at construction: the meters agree with each other and the ledger
        CHECK(m1.ledger().peak_total() == m1.ledger().total());
        CHECK(m1.ledger().bytes(octet::memory_category::temporaries) == transformer::temporary_bytes(cfg, r, 3, 2));
        // a model of a float32-master recipe has no decode region: bf16 weights are refused
        common::memory_meter m2;
        transformer c(cfg, recipe(common::linear_mode::blockwise), m2, octet::on_host(2), 3, 7);
        CHECK_THROWS_WITH_AS(c.forward_backward(view, tokens.data(), 3, octet::as_span(from_bf16)),
                             doctest::Contains("params"), octet::error);
    }
}

TEST_CASE("model: bf16 gradients are each tensor's float gradient rounded once to nearest even") {
    auto g = octet_test::rng(23);
    for (const bool tied : {false, true}) {
        const auto cfg = tiny_config(19, tied);
        for (auto r : {recipe(common::linear_mode::float32),
                       recipe(common::linear_mode::blockwise, common::attention_mode::fp8)}) {
            CAPTURE(tied);
            r.saved_activations = common::saved_storage::fp8;
            auto rb = r;
            rb.gradients = common::gradient_storage::bf16;
            std::vector<float> params(transformer::parameter_count(cfg));
            transformer::init_parameters(cfg, g(), octet::as_span(params));
            const auto tokens = random_tokens(g, 3, cfg.seq_len, cfg.vocab);
            std::vector<float> gf(params.size(), NAN);
            std::vector<octet::bf16> gb(params.size(), octet::to_bf16(NAN));
            common::memory_meter m0, m1;
            transformer a(cfg, r, m0, octet::on_host(2), 3, 7), b(cfg, rb, m1, octet::on_host(2), 3, 7);
            const auto ta = a.forward_backward(octet::as_cspan(params), tokens.data(), 3, octet::as_span(gf));
            const auto tb = b.forward_backward(octet::as_cspan(params), tokens.data(), 3,
                                               octet::span<octet::bf16>(gb.data(), gb.size()));
            CHECK(ta.loss == tb.loss);
            std::size_t differ = 0;
            for (std::size_t i = 0; i < gf.size(); ++i) {
                const octet::bf16 want = octet::to_bf16(gf[i]);
                differ += std::memcmp(&want, &gb[i], sizeof want) != 0;
            }
            CHECK(differ == 0);
            // the staging regions are booked with the model, as the ledger says
            CHECK(m1.ledger().bytes(octet::memory_category::temporaries) ==
                  transformer::temporary_bytes(cfg, rb, 3, 2));
            CHECK(transformer::temporary_bytes(cfg, rb, 3, 2) > transformer::temporary_bytes(cfg, r, 3, 2));
            // a model built for float gradients refuses bf16 ones, naming the argument
            CHECK_THROWS_WITH_AS(a.forward_backward(octet::as_cspan(params), tokens.data(), 3,
                                                    octet::span<octet::bf16>(gb.data(), gb.size())),
                                 doctest::Contains("argument 'grads'"), octet::error);
        }
    }
}

TEST_CASE("model: bad arguments throw octet::error naming them") {
    auto g = octet_test::rng(5);
    const auto cfg = tiny_config(11, false);
    common::memory_meter meter;
    transformer model(cfg, recipe(common::linear_mode::float32), meter, octet::on_host(1), 2, 0);
    std::vector<float> params(transformer::parameter_count(cfg)), grads(params.size());
    transformer::init_parameters(cfg, 1, octet::as_span(params));
    auto tokens = random_tokens(g, 3, cfg.seq_len, cfg.vocab);
    auto throws_naming = [](auto&& f, const char* arg) {
        try {
            f();
            FAIL("no octet::error for ", arg);
        } catch (const octet::error& e) {
            CHECK(std::string(e.what()).find(std::string("'") + arg + "'") != std::string::npos);
        }
    };
    throws_naming([&] { model.forward_backward(octet::as_cspan(params), tokens.data(), 3, octet::as_span(grads)); },
                  "batch");
    throws_naming([&] { model.evaluate(octet::as_cspan(params), tokens.data(), 0); }, "batch");
    tokens[5] = cfg.vocab;
    throws_naming([&] { model.forward_backward(octet::as_cspan(params), tokens.data(), 2, octet::as_span(grads)); },
                  "tokens");
    tokens[5] = -1;
    throws_naming([&] { model.evaluate(octet::as_cspan(params), tokens.data(), 2); }, "tokens");
    tokens[5] = 0;
    std::vector<float> short_params(params.size() - 1);
    throws_naming(
        [&] { model.forward_backward(octet::as_cspan(short_params), tokens.data(), 2, octet::as_span(grads)); },
        "params");
    throws_naming(
        [&] { model.forward_backward(octet::as_cspan(params), tokens.data(), 2, octet::as_span(short_params)); },
        "grads");
    throws_naming([&] { transformer::init_parameters(cfg, 1, octet::as_span(short_params)); }, "params");
    auto bad = cfg;
    bad.head_dim = 48;
    bad.d_model = 96;
    throws_naming([&] { transformer(bad, recipe(common::linear_mode::float32), meter, octet::on_host(1), 2, 0); },
                  "config.head_dim");
    bad = cfg;
    bad.heads_kv = 3;
    throws_naming([&] { transformer(bad, recipe(common::linear_mode::float32), meter, octet::on_host(1), 2, 0); },
                  "config.heads_kv");
    throws_naming([&] { transformer(cfg, recipe(common::linear_mode::float32), meter, octet::on_host(1), 0, 0); },
                  "max_batch");
    throws_naming([&] { model.generate(octet::as_cspan(params), {1, 2, cfg.vocab}, 3, 0, 1.0f); }, "prompt");
}

namespace {

common::model_config fp8_config(int vocab) {
    common::model_config c = tiny_config(vocab, true);
    c.d_model = 128;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.d_ff = 512;
    c.seq_len = 32;
    return c;
}

struct gradient_result {
    double loss = 0;
    std::vector<float> grads;
    common::step_telemetry telemetry;
};

gradient_result gradient_of(const common::model_config& cfg, const common::recipe_config& r,
                            const std::vector<float>& params, const std::vector<std::int32_t>& tokens, int batch,
                            bool high_precision = false) {
    common::memory_meter meter;
    transformer model(cfg, r, meter, octet::on_host(2), batch, 7);
    model.set_high_precision(high_precision);
    gradient_result g;
    g.grads.assign(params.size(), NAN);
    g.telemetry = model.forward_backward(octet::as_cspan(params), tokens.data(), batch, octet::as_span(g.grads));
    g.loss = g.telemetry.loss;
    return g;
}

}  // namespace

TEST_CASE("model: each low-precision recipe's gradient is close to float32's at the same parameters") {
    auto g = octet_test::rng(6);
    const auto cfg = fp8_config(37);
    const int batch = 4;
    std::vector<float> params(transformer::parameter_count(cfg));
    transformer::init_parameters(cfg, g(), octet::as_span(params));
    const auto tokens = random_tokens(g, batch, cfg.seq_len, cfg.vocab);
    const auto ref = gradient_of(cfg, recipe(common::linear_mode::float32), params, tokens, batch);
    for (float v : ref.grads) REQUIRE(std::isfinite(v));
    CHECK(ref.telemetry.quantized == 0);

    using LM = common::linear_mode;
    using AM = common::attention_mode;
    struct row {
        const char* name;
        LM linear;
        AM attention;
        octet::delta_mode delta;
        common::v_scale_mode v;
        double min_cosine;  // why: the elements' relative rounding error (below), through 2 blocks
        common::saved_storage saved = common::saved_storage::float32;  // the non-linear layers' saved inputs
    };
    const row rows[] = {
        {"bf16", LM::bf16, AM::float32, octet::delta_mode::matched, common::v_scale_mode::per_head, 0.9999},  // 2^-9
        {"tensorwise_delayed", LM::tensorwise_delayed, AM::float32, octet::delta_mode::matched,
         common::v_scale_mode::per_head, 0.99},  // E4M3 2^-4, E5M2 2^-3 gradients
        {"tensorwise", LM::tensorwise, AM::float32, octet::delta_mode::matched, common::v_scale_mode::per_head, 0.99},
        {"blockwise", LM::blockwise, AM::float32, octet::delta_mode::matched, common::v_scale_mode::per_head, 0.99},
        {"mxfp8", LM::mxfp8, AM::float32, octet::delta_mode::matched, common::v_scale_mode::per_head, 0.99},
        {"nvfp4", LM::nvfp4, AM::float32, octet::delta_mode::matched, common::v_scale_mode::per_head,
         0.9},  // E2M1: 2^-2, and stochastic rounding of dY
        {"fp8 attention, matched, V per head", LM::float32, AM::fp8, octet::delta_mode::matched,
         common::v_scale_mode::per_head, 0.99},
        {"fp8 attention, from_output, V per token", LM::float32, AM::fp8, octet::delta_mode::from_output,
         common::v_scale_mode::per_token, 0.99},
        {"blockwise + fp8 attention", LM::blockwise, AM::fp8, octet::delta_mode::matched,
         common::v_scale_mode::per_head, 0.99},
        {"FP8 saved activations", LM::float32, AM::float32, octet::delta_mode::matched, common::v_scale_mode::per_head,
         0.99, common::saved_storage::fp8},  // E4M3 2^-4 on the norms' and GELU's inputs
        {"blockwise + fp8 attention + FP8 saved activations", LM::blockwise, AM::fp8, octet::delta_mode::matched,
         common::v_scale_mode::per_head, 0.99, common::saved_storage::fp8},
        {"bf16 saved activations (norms, GELU, attention)", LM::float32, AM::float32, octet::delta_mode::matched,
         common::v_scale_mode::per_head, 0.9999, common::saved_storage::bf16},  // 2^-9
        {"bf16 mixed (bf16 linears, bf16 saved activations)", LM::bf16, AM::float32, octet::delta_mode::matched,
         common::v_scale_mode::per_head, 0.9999, common::saved_storage::bf16},
    };
    for (const auto& rw : rows) {
        CAPTURE(rw.name);
        auto r = recipe(rw.linear, rw.attention);
        r.delta = rw.delta;
        r.v_scale = rw.v;
        r.saved_activations = rw.saved;
        const auto got = gradient_of(cfg, r, params, tokens, batch);
        for (float v : got.grads) REQUIRE(std::isfinite(v));
        const double cos = cosine(got.grads, ref.grads), dloss = std::fabs(got.loss - ref.loss) / ref.loss;
        // per-tensor cosine of the worst tensor, to see that no tensor is left behind
        double worst = 1;
        for (const auto& [off, n] : tensors(cfg)) {
            const std::vector<float> a(got.grads.begin() + off, got.grads.begin() + off + n),
                b(ref.grads.begin() + off, ref.grads.begin() + off + n);
            worst = std::min(worst, cosine(a, b));
        }
        std::printf(
            "%-40s cosine %.6f (worst tensor %.4f), loss %.5f vs %.5f (%.1e), quantized %llu, saturated %llu, "
            "underflow %llu, attention residual %.2e\n",
            rw.name, cos, worst, got.loss, ref.loss, dloss, static_cast<unsigned long long>(got.telemetry.quantized),
            static_cast<unsigned long long>(got.telemetry.saturated),
            static_cast<unsigned long long>(got.telemetry.underflow),
            got.telemetry.attention_residual.empty() ? 0.0 : got.telemetry.attention_residual[0]);
        CHECK(cos > rw.min_cosine);
        CHECK(dloss < (rw.linear == LM::nvfp4 ? 2e-2 : 5e-3));
        REQUIRE(got.telemetry.attention_residual.size() == static_cast<std::size_t>(cfg.layers));
        if (rw.linear != LM::float32 && rw.linear != LM::bf16) CHECK(got.telemetry.quantized > 0);
        if (rw.saved != common::saved_storage::float32 && rw.linear == LM::float32 && rw.attention == AM::float32)
            CHECK(got.grads != ref.grads);
        if (rw.attention == AM::fp8) {
            CHECK(got.telemetry.quantized > 0);
            for (double res : got.telemetry.attention_residual) CHECK((res > 0 && res < 0.5));
        } else {
            for (double res : got.telemetry.attention_residual) CHECK(res == 0.0);
        }
    }
}

TEST_CASE("model: models that share step buffers compute their own models' bits, and book the buffers once") {
    auto g = octet_test::rng(16);
    const auto cfg = fp8_config(29);
    const int batch = 3;
    std::vector<float> params(transformer::parameter_count(cfg));
    transformer::init_parameters(cfg, g(), octet::as_span(params));
    auto r = recipe(common::linear_mode::blockwise, common::attention_mode::fp8);
    r.saved_activations = common::saved_storage::fp8;
    auto mixed = recipe(common::linear_mode::bf16);
    mixed.saved_activations = common::saved_storage::bf16;
    for (const auto& rc : {recipe(common::linear_mode::float32), r, mixed}) {
        CAPTURE(static_cast<int>(rc.linear));
        // two ranks' batches, stepped one after another (as the in-process ranks are), twice
        const std::vector<std::int32_t> tokens[2] = {random_tokens(g, batch, cfg.seq_len, cfg.vocab),
                                                     random_tokens(g, batch, cfg.seq_len, cfg.vocab)};
        std::vector<float> own[2][2], shared[2][2];
        {
            common::memory_meter m0, m1;
            transformer a(cfg, rc, m0, octet::on_host(2), batch, 5), b(cfg, rc, m1, octet::on_host(2), batch, 6);
            transformer* models[2] = {&a, &b};
            for (int step = 0; step < 2; ++step)
                for (int k = 0; k < 2; ++k) {
                    own[step][k].assign(params.size(), NAN);
                    models[k]->forward_backward(octet::as_cspan(params), tokens[k].data(), batch,
                                                octet::as_span(own[step][k]));
                }
        }
        common::memory_meter meter;
        // buffers that lend, between steps, two parts that together exceed the regions (the block
        // grows to the lend capacity; the ledger knows it)
        const double regions = transformer::step_buffer_bytes(cfg, rc, batch, 2);
        const std::vector<std::size_t> parts = {static_cast<std::size_t>(regions / 2) + 3,
                                                static_cast<std::size_t>(regions / 2)};
        const std::size_t lend = common::step_buffers::lend_bytes(parts);
        auto buffers = std::make_shared<common::step_buffers>(meter, lend);
        transformer a(cfg, rc, meter, octet::on_host(2), batch, 5, buffers);
        transformer b(cfg, rc, meter, octet::on_host(2), batch, 6, buffers);
        transformer* models[2] = {&a, &b};
        const double temporaries = 2 * transformer::temporary_bytes(cfg, rc, batch, 2, lend) -
                                   transformer::step_buffer_bytes(cfg, rc, batch, 2, lend);
        CHECK(transformer::step_buffer_bytes(cfg, rc, batch, 2) > 0);
        CHECK(transformer::step_buffer_bytes(cfg, rc, batch, 2, lend) > regions);
        CHECK(meter.ledger().bytes(octet::memory_category::temporaries) == temporaries);
        CHECK(meter.ledger().bytes(octet::memory_category::activations) ==
              2 * transformer::activation_bytes(cfg, rc, batch, 2));
        for (int step = 0; step < 2; ++step) {
            for (int k = 0; k < 2; ++k) {
                shared[step][k].assign(params.size(), NAN);
                models[k]->forward_backward(octet::as_cspan(params), tokens[k].data(), batch,
                                            octet::as_span(shared[step][k]));
                CHECK(std::memcmp(shared[step][k].data(), own[step][k].data(), params.size() * sizeof(float)) == 0);
            }
            // between steps the block is lent (disjoint, 64-byte aligned parts) and scribbled on:
            // nothing of a step lives on in it, so the next step's gradients do not change
            const auto lent = buffers->lend(parts);
            REQUIRE(lent.size() == 2);
            CHECK(reinterpret_cast<std::uintptr_t>(lent[0].data()) % 64 == 0);
            CHECK(reinterpret_cast<std::uintptr_t>(lent[1].data()) % 64 == 0);
            CHECK(lent[0].data() + lent[0].size() <= lent[1].data());
            for (const auto& part : lent) std::memset(part.data(), 0xff, part.size());  // NaN floats
        }
        CHECK_THROWS_AS(buffers->lend({lend + 64}), octet::error);
        // a lend takes the logits of the last score(): policy_backward asks for another score
        const std::size_t positions = static_cast<std::size_t>(batch) * static_cast<std::size_t>(cfg.seq_len);
        std::vector<float> logp(positions), entropy(positions), dlogp(positions, 0.0f), g(params.size());
        a.score(octet::as_cspan(params), tokens[0].data(), batch, octet::as_span(logp), octet::as_span(entropy));
        buffers->lend({64});
        common::step_telemetry st;
        CHECK_THROWS_WITH_AS(a.policy_backward(octet::as_cspan(params), tokens[0].data(), batch, octet::as_cspan(dlogp),
                                               octet::as_span(g), st),
                             doctest::Contains("lent"), octet::error);
        CHECK(meter.ledger().peak_total() == meter.ledger().total());  // a step allocates nothing
        // buffers sized for one model are refused by another shape
        auto other = cfg;
        other.d_ff = 2 * cfg.d_ff;
        try {
            transformer(other, rc, meter, octet::on_host(2), batch, 7, buffers);
            FAIL("no octet::error for step buffers of another shape");
        } catch (const octet::error& e) {
            CHECK(std::string(e.what()).find("'shared'") != std::string::npos);
        }
    }
}

TEST_CASE("model: FP8 linears that recompute their inputs give the kept copies' bits from float saves") {
    auto g = octet_test::rng(31);
    const auto cfg = fp8_config(23);
    std::vector<float> params(transformer::parameter_count(cfg));
    transformer::init_parameters(cfg, g(), octet::as_span(params));
    const int batch = 3;
    for (const auto mode :
         {common::linear_mode::blockwise, common::linear_mode::mxfp8, common::linear_mode::tensorwise_delayed}) {
        for (const auto saves : {common::saved_storage::float32, common::saved_storage::fp8}) {
            CAPTURE(static_cast<int>(mode));
            CAPTURE(static_cast<int>(saves));
            auto kept = recipe(mode, common::attention_mode::fp8);
            kept.saved_activations = saves;
            auto again = kept;
            again.recompute_linear_inputs = true;
            common::memory_meter m0, m1;
            transformer a(cfg, kept, m0, octet::on_host(2), batch, 9), b(cfg, again, m1, octet::on_host(2), batch, 9);
            // the copies of X the linears no longer keep, and the ledger's prediction of both
            CHECK(m1.ledger().bytes(octet::memory_category::activations) <
                  m0.ledger().bytes(octet::memory_category::activations));
            CHECK(m1.ledger().bytes(octet::memory_category::activations) ==
                  transformer::activation_bytes(cfg, again, batch, 2));
            CHECK(m1.ledger().bytes(octet::memory_category::temporaries) ==
                  transformer::temporary_bytes(cfg, again, batch, 2));
            const double peak = m1.ledger().peak_total();
            for (int step = 0; step < 2; ++step) {
                const auto tokens = random_tokens(g, batch, cfg.seq_len, cfg.vocab);
                std::vector<float> ga(params.size(), NAN), gb(params.size(), NAN);
                const auto ta = a.forward_backward(octet::as_cspan(params), tokens.data(), batch, octet::as_span(ga));
                const auto tb = b.forward_backward(octet::as_cspan(params), tokens.data(), batch, octet::as_span(gb));
                CHECK(ta.loss == tb.loss);
                if (saves == common::saved_storage::float32) {
                    CHECK(std::memcmp(ga.data(), gb.data(), ga.size() * sizeof(float)) == 0);
                } else {  // the weight gradients read X recomputed from the FP8 saves: close, not equal
                    CHECK(std::memcmp(ga.data(), gb.data(), ga.size() * sizeof(float)) != 0);
                    CHECK(cosine(ga, gb) > 0.999);
                }
            }
            CHECK(m1.ledger().peak_total() == peak);  // a step allocates nothing
        }
    }
}

TEST_CASE("model: raising precision makes an FP8 recipe's gradient float32's, bit for bit") {
    auto g = octet_test::rng(7);
    const auto cfg = fp8_config(29);
    const int batch = 2;
    std::vector<float> params(transformer::parameter_count(cfg));
    transformer::init_parameters(cfg, g(), octet::as_span(params));
    const auto tokens = random_tokens(g, batch, cfg.seq_len, cfg.vocab);
    const auto ref = gradient_of(cfg, recipe(common::linear_mode::float32), params, tokens, batch);
    // (the non-linear layers' saved inputs stay in the recipe's storage: raising precision is the
    // linears' and attention's, so recipes with bf16 or FP8 saved activations are not float32's)
    for (auto mode : {common::linear_mode::blockwise, common::linear_mode::nvfp4, common::linear_mode::bf16}) {
        CAPTURE(static_cast<int>(mode));
        auto r = recipe(mode, common::attention_mode::fp8);
        common::memory_meter meter;
        transformer model(cfg, r, meter, octet::on_host(2), batch, 3);
        const double before = meter.ledger().total();
        std::vector<float> grads(params.size());
        model.set_high_precision(true);
        CHECK(meter.ledger().total() > before);  // the float copies a float computation keeps
        const auto t = model.forward_backward(octet::as_cspan(params), tokens.data(), batch, octet::as_span(grads));
        CHECK(grads == ref.grads);
        CHECK(t.loss == ref.loss);
        CHECK(t.quantized == 0);
        model.set_high_precision(false);
        CHECK(meter.ledger().total() == before);
        model.forward_backward(octet::as_cspan(params), tokens.data(), batch, octet::as_span(grads));
        CHECK(grads != ref.grads);
    }
}

TEST_CASE("model: FP8 recipes keep less activation memory than float32") {
    const auto cfg = fp8_config(37);
    auto activations = [&](common::linear_mode l, common::attention_mode a) {
        common::memory_meter meter;
        transformer model(cfg, recipe(l, a), meter, octet::on_host(1), 8, 0);
        return meter.ledger().bytes(octet::memory_category::activations);
    };
    const double f32 = activations(common::linear_mode::float32, common::attention_mode::float32);
    const double bf16 = activations(common::linear_mode::bf16, common::attention_mode::float32);
    const double fp8 = activations(common::linear_mode::blockwise, common::attention_mode::fp8);
    auto packed_recipe = recipe(common::linear_mode::blockwise, common::attention_mode::fp8);
    packed_recipe.saved_activations = common::saved_storage::fp8;
    common::memory_meter meter;
    transformer packed_model(cfg, packed_recipe, meter, octet::on_host(1), 8, 0);
    const double packed = meter.ledger().bytes(octet::memory_category::activations);
    auto mixed_recipe = recipe(common::linear_mode::bf16);
    mixed_recipe.saved_activations = common::saved_storage::bf16;
    common::memory_meter mixed_meter;
    transformer mixed_model(cfg, mixed_recipe, mixed_meter, octet::on_host(1), 8, 0);
    const double mixed = mixed_meter.ledger().bytes(octet::memory_category::activations);
    std::printf(
        "activation bytes for 8 x %d tokens: float32 %.0f, bf16 linears %.0f, bf16 mixed %.0f, blockwise + fp8 "
        "attention %.0f, and with FP8 saved activations %.0f\n",
        cfg.seq_len, f32, bf16, mixed, fp8, packed);
    CHECK(bf16 < f32);
    CHECK(mixed < bf16);
    CHECK(fp8 < bf16);
    CHECK(packed < fp8);
    CHECK(packed < mixed);
}

TEST_CASE("model: generate extends the prompt with in-vocabulary tokens, reproducibly") {
    auto g = octet_test::rng(8);
    const auto cfg = tiny_config(19, true);
    common::memory_meter meter;
    transformer model(cfg, recipe(common::linear_mode::blockwise, common::attention_mode::fp8), meter,
                      octet::on_host(1), 1, 0);
    std::vector<float> params(transformer::parameter_count(cfg));
    transformer::init_parameters(cfg, g(), octet::as_span(params));
    const double before = meter.ledger().total(), peak_before = meter.ledger().peak_total();
    const std::vector<std::int32_t> prompt = {1, 2, 3};
    const auto a = model.generate(octet::as_cspan(params), prompt, 40, 11, 1.0f);
    const auto b = model.generate(octet::as_cspan(params), prompt, 40, 11, 1.0f);
    const auto greedy = model.generate(octet::as_cspan(params), prompt, 40, 11, 0.0f);
    CHECK(a.size() == prompt.size() + 40);  // longer than seq_len: the window slides
    CHECK(a == b);
    CHECK(std::equal(prompt.begin(), prompt.end(), a.begin()));
    for (auto t : a) CHECK((t >= 0 && t < cfg.vocab));
    CHECK(greedy.size() == a.size());
    CHECK(!model.high_precision());
    CHECK(meter.ledger().total() == before);
    CHECK(meter.ledger().peak_total() == peak_before);  // sampling runs in the buffers the model has
}

TEST_CASE("model: the vectorizable exp and tanh of GELU agree with the C library's") {
    auto g = octet_test::rng(9);
    std::uniform_real_distribution<float> x(-87.0f, 88.0f), z(-12.0f, 12.0f), small(-1e-3f, 1e-3f);
    double exp_err = 0, tanh_err = 0;
    for (int i = 0; i < 200000; ++i) {
        const float a = x(g);
        exp_err = std::max(exp_err, std::fabs(common::exp_approx(a) - std::exp(static_cast<double>(a))) /
                                        std::exp(static_cast<double>(a)));
        for (float b : {z(g), small(g)})
            tanh_err = std::max(tanh_err, std::fabs(common::tanh_approx(b) - std::tanh(static_cast<double>(b))));
    }
    std::printf("exp_approx: max relative error %.2e; tanh_approx: max absolute error %.2e\n", exp_err, tanh_err);
    CHECK(exp_err < 1e-6);
    CHECK(tanh_err < 2e-7);
    CHECK(common::tanh_approx(0.0f) == 0.0f);
    CHECK(common::tanh_approx(1e30f) == 1.0f);
    CHECK(common::tanh_approx(-INFINITY) == -1.0f);
    CHECK(std::isnan(common::exp_approx(NAN)));
    CHECK(std::isnan(common::tanh_approx(NAN)));
    CHECK(common::exp_approx(-1000.0f) < 1e-37f);
}

TEST_CASE("model: the ledger's prediction of activations and temporaries is what the meter books") {
    using LM = common::linear_mode;
    using AM = common::attention_mode;
    for (int hd : {32, 64}) {
        common::model_config cfg = fp8_config(41);
        cfg.head_dim = hd;
        cfg.heads_q = cfg.d_model / hd;
        cfg.heads_kv = 1;
        cfg.tied_head = hd == 64;
        for (auto l :
             {LM::float32, LM::bf16, LM::tensorwise_delayed, LM::tensorwise, LM::blockwise, LM::mxfp8, LM::nvfp4})
            for (auto a : {AM::float32, AM::fp8})
                for (auto v : {common::v_scale_mode::per_head, common::v_scale_mode::per_token})
                    for (auto st :
                         {common::saved_storage::float32, common::saved_storage::bf16, common::saved_storage::fp8}) {
                        auto r = recipe(l, a);
                        r.v_scale = v;
                        r.saved_activations = st;
                        CAPTURE(hd);
                        CAPTURE(static_cast<int>(l));
                        CAPTURE(static_cast<int>(a));
                        CAPTURE(static_cast<int>(st));
                        common::memory_meter meter;
                        transformer model(cfg, r, meter, octet::on_host(2), 3, 0);
                        const auto& L = meter.ledger();
                        CHECK(L.bytes(octet::memory_category::activations) ==
                              transformer::activation_bytes(cfg, r, 3, 2));
                        CHECK(L.bytes(octet::memory_category::temporaries) ==
                              transformer::temporary_bytes(cfg, r, 3, 2));
                        CHECK(L.total() == L.bytes(octet::memory_category::activations) +
                                               L.bytes(octet::memory_category::temporaries));
                        const double before = L.bytes(octet::memory_category::activations),
                                     before_tmp = L.bytes(octet::memory_category::temporaries);
                        model.set_high_precision(true);
                        CHECK(L.bytes(octet::memory_category::activations) - before ==
                              transformer::raise_precision_bytes(cfg, r, 3));
                        CHECK(L.bytes(octet::memory_category::temporaries) - before_tmp ==
                              static_cast<double>(transformer::raise_temporary_bytes(cfg, r, 3)));
                        model.set_high_precision(false);
                        CHECK(L.bytes(octet::memory_category::temporaries) == before_tmp);
                    }
    }
}
