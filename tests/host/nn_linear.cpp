// The linear layer (octet/nn/linear.hpp) for every named linear recipe: forward and backward equal,
// bit for bit, octet::quantize and octet::scaled_gemm composed by hand with the documented copies
// (the Hadamard rotation by hand through octet::transform_forward), over several steps and any
// thread count; every output within gemm_error_bound of the float64 product of the copies, and near
// the unquantized float64 product (a wrong copy or transposition is off by O(1)); the statistics are
// quantize's. Delayed scaling: the first step measures, later steps use the max of EARLIER steps in
// the window, a larger input saturates and is counted, inference does not push. NVFP4: stochastic
// rounding reproducible from (seed, step), unbiased over steps and seeds; the rotation leaves
// dY^T X unchanged. Edge cases (zeros, no tokens, ragged tokens, NaN) and argument errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "octet/nn/linear.hpp"
#include "octet/reference/gemm.hpp"
#include "support/random.hpp"

namespace nn_linear_test {
using namespace octet;

std::vector<float> normal(std::mt19937_64& g, std::size_t n, float sigma) {
    std::normal_distribution<float> d(0.0f, sigma);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

/// One step's inputs: X (tokens x in), W (out x in), bias (out), dY (tokens x out).
struct problem {
    std::size_t tokens = 0, in = 0, out = 0;
    std::vector<float> x, w, bias, dy;

    matrix_ref<const float> X() const { return {x.data(), tokens, in}; }
    matrix_ref<const float> W() const { return {w.data(), out, in}; }
    matrix_ref<const float> dY() const { return {dy.data(), tokens, out}; }
};

/// Normal inputs, or (edge) octet_test's mix of zeros, subnormals and 1000x outliers.
problem make_problem(std::mt19937_64& g, std::size_t tokens, std::size_t in, std::size_t out, bool edge = false) {
    problem p;
    p.tokens = tokens;
    p.in = in;
    p.out = out;
    p.x = edge ? octet_test::with_edge_cases(g, tokens * in, 1.0f) : normal(g, tokens * in, 1.0f);
    p.w = edge ? octet_test::with_edge_cases(g, out * in, 0.1f) : normal(g, out * in, 0.1f);
    p.bias = normal(g, out, 0.5f);
    p.dy = edge ? octet_test::with_edge_cases(g, tokens * out, 0.01f) : normal(g, tokens * out, 0.01f);
    return p;
}

float largest_finite_abs(const std::vector<float>& v) {
    float m = 0.0f;
    for (float x : v)
        if (std::isfinite(x)) m = std::max(m, std::fabs(x));
    return m;
}

/// Every column of m (rows x cols) transformed by octet::transform_forward (hadamard, block 16):
/// the rotation HadamardWgrad documents, written from the codec's API (rows padded to 16).
std::vector<float> rotated_columns(const std::vector<float>& m, std::size_t rows, std::size_t cols,
                                   std::uint64_t seed) {
    const std::size_t L = transform_length(transform_kind::hadamard, rows, 16);
    std::vector<float> out(L * cols), col(rows), y(L);
    for (std::size_t j = 0; j < cols; ++j) {
        for (std::size_t t = 0; t < rows; ++t) col[t] = m[t * cols + j];
        transform_forward(on_host(1), transform_kind::hadamard, as_cspan(col), as_span(y), 16, seed);
        for (std::size_t t = 0; t < L; ++t) out[t * cols + j] = y[t];
    }
    return out;
}

/// The layer's documented composition, by hand: quantize each operand into the copies the header
/// names, multiply them with scaled_gemm (default options), sum db in double in token order.
template <class LR>
struct composed {
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    using GR = typename LR::g_quantize_recipe;
    std::size_t tokens, in, out, K;  // K: the weight-gradient GEMM's (tokens, padded under the rotation)
    quantized_tensor<XR> x_row, x_col;
    quantized_tensor<WR> w_row, w_col;
    quantized_tensor<GR> dy_row, dy_col;
    quantize_result qx, qw, qdy, qx_h, qdy_h;
    std::vector<float> y, dx, dw, db;

    composed(std::size_t t, std::size_t i, std::size_t o)
        : tokens(t),
          in(i),
          out(o),
          K(LR::hadamard_wgrad ? (t + 15) / 16 * 16 : t),
          x_row(t, i),
          x_col(i, K),
          w_row(o, i),
          w_col(i, o),
          dy_row(t, o),
          dy_col(o, K),
          y(t * o),
          dx(t * i),
          dw(o * i),
          db(o) {}

    void forward(const problem& p, float x_amax, float w_amax, std::uint64_t seed) {
        quantize_options opt;
        opt.collect_stats = true;
        opt.tensor_amax = x_amax;
        if constexpr (LR::hadamard_wgrad) {
            qx = quantize<XR>(on_host(1), p.X(), x_row.ref(), {}, opt);
            const auto r = rotated_columns(p.x, tokens, in, seed);
            quantize_options cur;
            cur.collect_stats = true;
            qx_h = quantize<XR>(on_host(1), matrix_ref<const float>(r.data(), K, in), {}, x_col.ref(), cur);
        } else {
            qx = quantize<XR>(on_host(1), p.X(), x_row.ref(), x_col.ref(), opt);
        }
        opt.tensor_amax = w_amax;
        qw = quantize<WR>(on_host(1), p.W(), w_row.ref(), w_col.ref(), opt);
        gemm_options g;
        g.bias = as_cspan(p.bias);
        scaled_gemm(on_host(1), x_row.cref(), w_row.cref(), matrix_ref<float>(y.data(), tokens, out), g);
    }

    void backward(const problem& p, float g_amax, std::uint64_t seed, std::uint64_t step) {
        quantize_options opt;
        opt.collect_stats = true;
        opt.tensor_amax = g_amax;
        opt.rng = philox_stream{seed, 4 * step};
        if constexpr (LR::hadamard_wgrad) {
            qdy = quantize<GR>(on_host(1), p.dY(), dy_row.ref(), {}, opt);
            const auto r = rotated_columns(p.dy, tokens, out, seed);
            quantize_options rot;
            rot.collect_stats = true;
            rot.rng = philox_stream{seed, 4 * step + 2};
            qdy_h = quantize<GR>(on_host(1), matrix_ref<const float>(r.data(), K, out), {}, dy_col.ref(), rot);
        } else {
            qdy = quantize<GR>(on_host(1), p.dY(), dy_row.ref(), dy_col.ref(), opt);
        }
        scaled_gemm(on_host(1), dy_row.cref(), w_col.cref(), matrix_ref<float>(dx.data(), tokens, in));
        scaled_gemm(on_host(1), dy_col.cref(), x_col.cref(), matrix_ref<float>(dw.data(), out, in));
        for (std::size_t o = 0; o < out; ++o) {
            double s = 0.0;
            for (std::size_t t = 0; t < tokens; ++t) s += p.dy[t * out + o];
            db[o] = static_cast<float>(s);
        }
    }
};

/// The layer's outputs for one step, poisoned first so that every element must be written.
struct outputs {
    std::vector<float> y, dx, dw, db;
    outputs(const problem& p)
        : y(p.tokens * p.out, NAN), dx(p.tokens * p.in, NAN), dw(p.out * p.in, NAN), db(p.out, NAN) {}
};

template <class LR>
void run_layer(host_executor ex, linear_context<LR>& ctx, const problem& p, outputs& o) {
    linear_forward(ex, ctx, p.X(), p.W(), as_cspan(p.bias), matrix_ref<float>(o.y.data(), p.tokens, p.out));
    linear_backward(ex, ctx, p.dY(), matrix_ref<float>(o.dx.data(), p.tokens, p.in),
                    matrix_ref<float>(o.dw.data(), p.out, p.in), as_span(o.db));
}

void check_same_bits(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    REQUIRE(got.size() == want.size());
    std::size_t diff = 0, first = 0;
    for (std::size_t k = 0; k < got.size(); ++k)
        if (std::memcmp(&got[k], &want[k], sizeof(float)) != 0 && diff++ == 0) first = k;
    if (diff)
        FAIL_CHECK(what << ": " << diff << " of " << got.size() << " elements differ from the hand composition; first ["
                        << first << "] = " << got[first] << ", want " << want[first]);
}

void check_same_stats(const quant_stats& a, const quant_stats& b, const char* what) {
    INFO(what);
    CHECK(a.amax == b.amax);
    CHECK(a.elements == b.elements);
    CHECK(a.saturated == b.saturated);
    CHECK(a.flushed_to_zero == b.flushed_to_zero);
    CHECK(a.non_finite == b.non_finite);
}

/// The largest relative rounding error of a format's normals: half an ulp, a whole one when the
/// rounding is stochastic.
template <class R>
double unit_roundoff() {
    const bool stochastic = std::is_same_v<typename R::rounding, round::stochastic>;
    return std::ldexp(1.0, -(R::format::mantissa_bits + (stochastic ? 0 : 1)));
}

/// Every element of D (M x N) within gemm_error_bound of the float64 product of the copies A, B
/// (plus bias), and ||D - exact64|| / ||exact64|| <= rel_tol for the unquantized float64 product.
template <class RA, class RB>
void check_against_float64(const std::vector<float>& d, const quantized_cref<RA>& A, const quantized_cref<RB>& B,
                           const std::vector<float>* bias, const std::vector<double>& unquantized, double rel_tol,
                           const char* what) {
    INFO(what << " (" << recipe_description<RA>() << " x " << recipe_description<RB>() << ")");
    const std::size_t M = A.rows(), N = B.rows();
    const auto ref = reference::gemm(A, B);
    const gemm_numerics nm = gemm_numerics_of<RA, RB, float>(gemm_backend::host, A.cols());
    int bad = 0;
    double num = 0.0, den = 0.0;
    for (std::size_t i = 0; i < M; ++i)
        for (std::size_t j = 0; j < N; ++j) {
            const double b = bias ? (*bias)[j] : 0.0;
            const double exact = ref.product[i * N + j] + b;
            const double bound =
                gemm_error_bound(nm, 1.0, ref.abs_products[i * N + j], 0.0, std::fabs(b), std::fabs(exact));
            const double err = std::fabs(d[i * N + j] - exact);
            if (!(err <= bound) && bad++ < 3)
                FAIL_CHECK("(" << i << "," << j << ") = " << d[i * N + j] << ", float64 of the copies " << exact
                               << ", error " << err << " > bound " << bound);
            const double e = d[i * N + j] - unquantized[i * N + j];
            num += e * e;
            den += unquantized[i * N + j] * unquantized[i * N + j];
        }
    if (rel_tol > 0) {
        const double rel = std::sqrt(num / den);
        INFO("relative error against the unquantized float64 product: " << rel << " (tolerance " << rel_tol << ")");
        CHECK(rel <= rel_tol);
    }
}

/// Float64 products of the unquantized inputs: Y = X W^T + b, dX = dY W, dW = dY^T X.
struct exact64 {
    std::vector<double> y, dx, dw;
    explicit exact64(const problem& p) : y(p.tokens * p.out, 0.0), dx(p.tokens * p.in, 0.0), dw(p.out * p.in, 0.0) {
        const std::size_t T = p.tokens, I = p.in, O = p.out;
        for (std::size_t t = 0; t < T; ++t)
            for (std::size_t o = 0; o < O; ++o) {
                double s = p.bias[o];
                for (std::size_t i = 0; i < I; ++i) s += static_cast<double>(p.x[t * I + i]) * p.w[o * I + i];
                y[t * O + o] = s;
            }
        for (std::size_t t = 0; t < T; ++t)
            for (std::size_t o = 0; o < O; ++o) {
                const double g = p.dy[t * O + o];
                for (std::size_t i = 0; i < I; ++i) {
                    dx[t * I + i] += g * p.w[o * I + i];
                    dw[o * I + i] += g * p.x[t * I + i];
                }
            }
    }
};

/// What delayed scaling must pass as tensor_amax: the max of the earlier steps' amaxes in the
/// window, or -1 (measure) when there is none or it is 0. Written from the header's words.
struct history {
    std::size_t length;
    std::vector<float> amaxes;  // every step's, oldest first
    float for_scale() const {
        float m = 0.0f;
        for (std::size_t k = amaxes.size() > length ? amaxes.size() - length : 0; k < amaxes.size(); ++k)
            m = std::max(m, amaxes[k]);
        return m > 0.0f ? m : -1.0f;
    }
};

}  // namespace nn_linear_test

using namespace nn_linear_test;

#define OCTET_LINEAR_RECIPES                                                                                        \
    octet::linear_recipes::tensorwise, octet::linear_recipes::tensorwise_delayed, octet::linear_recipes::blockwise, \
        octet::linear_recipes::mxfp8, octet::linear_recipes::nvfp4

TEST_CASE_TEMPLATE(
    "linear: bit-exact with quantize + scaled_gemm composed by hand, within the GEMM bound of "
    "float64 and near the unquantized product",
    LR, OCTET_LINEAR_RECIPES) {
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    using GR = typename LR::g_quantize_recipe;
    constexpr bool delayed = LR::scaling == linear_scaling::delayed;
    // Ragged everywhere: 200 tokens (not a multiple of 128 or 16), in 160, out 96 (ragged 128 blocks).
    const std::size_t T = 200, I = 160, O = 96;
    const std::uint64_t seed = octet_test::run_seed() ^ 0x5EEDu;
    INFO("run seed " << octet_test::run_seed());
    auto g = octet_test::rng(101);
    linear_config cfg;
    cfg.max_tokens = 256;
    cfg.in_features = I;
    cfg.out_features = O;
    cfg.seed = seed;
    linear_context<LR> ctx(cfg);
    history hx{16, {}}, hw{16, {}}, hg{16, {}};

    // Steps: normal inputs, the same at a smaller magnitude (delayed: the previous scale), then the
    // edge-case mix (zeros, subnormals, outliers).
    for (int step = 0; step < 3; ++step) {
        INFO("step " << step);
        problem p = make_problem(g, T, I, O, step == 2);
        if (step == 1)
            for (auto* v : {&p.x, &p.w, &p.dy})
                for (auto& e : *v) e *= 0.37f;
        outputs o(p);
        run_layer(on_host(), ctx, p, o);

        composed<LR> c(T, I, O);
        const float xa = delayed ? hx.for_scale() : -1.0f, wa = delayed ? hw.for_scale() : -1.0f,
                    ga = delayed ? hg.for_scale() : -1.0f;
        c.forward(p, xa, wa, seed);
        c.backward(p, ga, seed, static_cast<std::uint64_t>(step));
        hx.amaxes.push_back(largest_finite_abs(p.x));
        hw.amaxes.push_back(largest_finite_abs(p.w));
        hg.amaxes.push_back(largest_finite_abs(p.dy));

        check_same_bits(o.y, c.y, "Y");
        check_same_bits(o.dx, c.dx, "dX");
        check_same_bits(o.dw, c.dw, "dW");
        check_same_bits(o.db, c.db, "db");
        CHECK(ctx.step() == static_cast<std::uint64_t>(step + 1));

        // The telemetry is quantize's, and the amaxes are the inputs' largest finite magnitudes.
        const linear_stats& s = ctx.stats();
        CHECK(s.x.amax == hx.amaxes.back());
        CHECK(s.w.amax == hw.amaxes.back());
        CHECK(s.dy.amax == hg.amaxes.back());
        check_same_stats(s.x.rowwise, c.qx.rowwise, "x rowwise");
        check_same_stats(s.w.columnwise, c.qw.columnwise, "w columnwise");
        check_same_stats(s.dy.rowwise, c.qdy.rowwise, "dy rowwise");
        if constexpr (LR::hadamard_wgrad) {
            check_same_stats(s.x_hadamard.columnwise, c.qx_h.columnwise, "x rotated");
            check_same_stats(s.dy_hadamard.columnwise, c.qdy_h.columnwise, "dy rotated");
        } else {
            check_same_stats(s.x.columnwise, c.qx.columnwise, "x columnwise");
            check_same_stats(s.dy.columnwise, c.qdy.columnwise, "dy columnwise");
        }
        CHECK(s.merged().elements > 0);

        // Against float64: the GEMM's bound on the copies always; the unquantized product on
        // normal inputs (the edge mix's outliers legitimately flush their blocks).
        const exact64 e(p);
        const double tol_y = step < 2 ? unit_roundoff<XR>() + unit_roundoff<WR>() : 0.0;
        const double tol_dx = step < 2 ? unit_roundoff<GR>() + unit_roundoff<WR>() : 0.0;
        const double tol_dw = step < 2 ? unit_roundoff<GR>() + unit_roundoff<XR>() : 0.0;
        check_against_float64(o.y, c.x_row.cref(), c.w_row.cref(), &p.bias, e.y, tol_y, "Y");
        check_against_float64(o.dx, c.dy_row.cref(), c.w_col.cref(), nullptr, e.dx, tol_dx, "dX");
        check_against_float64(o.dw, c.dy_col.cref(), c.x_col.cref(), nullptr, e.dw, tol_dw, "dW");
    }
}

TEST_CASE_TEMPLATE("linear: memory accounting and an inference forward", LR, OCTET_LINEAR_RECIPES) {
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    const std::size_t T = 64, I = 48, O = 32;
    linear_context<LR> ctx({T, I, O});
    const std::size_t K = linear_context<LR>::wgrad_tokens(T);
    const quant_layout xc = quant_layout_of<XR>::make(I, K), wc = quant_layout_of<WR>::make(I, O);
    const std::size_t ts = XR::two_level ? sizeof(float) : 0;
    const linear_memory m = ctx.memory();
    CHECK(m.saved_for_backward == xc.data_bytes + xc.scale_bytes + wc.data_bytes + wc.scale_bytes + 2 * ts);
    CHECK(m.workspace > 0);
    CHECK(m.state == (LR::scaling == linear_scaling::delayed ? 3 * 16 * sizeof(float) : 0));
    CHECK(ctx.bytes() == m.total());

    // An inference forward gives the training forward's Y, leaves no backward to run, and pushes
    // no amax.
    auto g = octet_test::rng(102);
    const problem p = make_problem(g, T, I, O);
    outputs a(p), b(p);
    linear_forward(on_host(), ctx, p.X(), p.W(), as_cspan(p.bias), matrix_ref<float>(a.y.data(), T, O),
                   linear_pass::inference);
    CHECK_FALSE(ctx.has_saved_forward());
    CHECK(ctx.delayed_x().state().recorded == 0);
    linear_forward(on_host(), ctx, p.X(), p.W(), as_cspan(p.bias), matrix_ref<float>(b.y.data(), T, O));
    CHECK(ctx.has_saved_forward());
    check_same_bits(a.y, b.y, "Y (inference vs training)");
    CHECK(ctx.delayed_x().state().recorded == (LR::scaling == linear_scaling::delayed ? 1 : 0));
    CHECK(ctx.stats().x.rowwise.elements == T * I);

    // Without statistics: the same bits, the amaxes still kept, no counts.
    ctx.set_collect_stats(false);
    linear_forward(on_host(), ctx, p.X(), p.W(), as_cspan(p.bias), matrix_ref<float>(a.y.data(), T, O),
                   linear_pass::inference);
    check_same_bits(a.y, b.y, "Y (without statistics)");
    CHECK(ctx.stats().x.rowwise.elements == 0);
    CHECK(ctx.stats().x.amax == largest_finite_abs(p.x));
}

TEST_CASE(
    "linear, delayed scaling: current scaling first, then the window's max of earlier steps; a larger "
    "input saturates and is counted") {
    using LR = linear_recipes::tensorwise_delayed;
    using XR = LR::x_recipe;
    const std::size_t T = 48, I = 64, O = 32;
    linear_config cfg;
    cfg.max_tokens = T;
    cfg.in_features = I;
    cfg.out_features = O;
    cfg.delayed.history_length = 2;
    linear_context<LR> ctx(cfg);
    auto g = octet_test::rng(103);
    INFO("run seed " << octet_test::run_seed());
    const problem base = make_problem(g, T, I, O);
    const float a0 = largest_finite_abs(base.x);

    // Forward Y of X scaled by `f` under the layer, and by hand with X quantized from `x_amax`.
    auto forward = [&](float f, float x_amax, float w_amax) {
        problem p = base;
        for (auto& v : p.x) v *= f;
        outputs o(p);
        run_layer(on_host(), ctx, p, o);
        composed<LR> c(T, I, O);
        c.forward(p, x_amax, w_amax, 0);
        check_same_bits(o.y, c.y, "Y");
        return c;
    };
    const float wa = largest_finite_abs(base.w);
    auto c0 = forward(1.0f, -1.0f, -1.0f);  // step 0: nothing recorded, current scaling
    CHECK(ctx.stats().x.rowwise.saturated == 0);
    CHECK(c0.x_row.cref().scale(0, 0) == make_block_scale<XR>(a0).value);
    CHECK(ctx.delayed_x().history()[0] == a0);

    auto c1 = forward(0.37f, a0, wa);  // step 1: the scale of step 0's amax, not its own
    CHECK(c1.x_row.cref().scale(0, 0) == make_block_scale<XR>(a0).value);
    CHECK(c1.x_row.cref().scale(0, 0) != make_block_scale<XR>(0.37f * a0).value);

    // Step 2: four times step 0's amax, quantized with the window's max (a0): what lies beyond
    // 464 (= 448 + half its ulp) after dividing by the scale saturates, and is counted.
    forward(4.0f, a0, wa);
    const float S = make_block_scale<XR>(a0).value;
    unsigned long long beyond = 0;
    for (float v : base.x)
        if (std::fabs((4.0f * v) / S) > 464.0f) ++beyond;
    CHECK(beyond > 0);
    CHECK(ctx.stats().x.rowwise.saturated == beyond);
    CHECK(ctx.stats().x.amax == 4.0f * a0);

    // Step 3: window of 2 = steps 1 and 2, so 4 a0. Step 4: steps 2 and 3 (4 a0). Step 5: steps 3
    // and 4, whose amaxes were 0.5 a0: 4 a0 has left the window.
    forward(0.5f, 4.0f * a0, wa);
    forward(0.5f, 4.0f * a0, wa);
    forward(0.5f, 0.5f * a0, wa);
    CHECK(ctx.stats().x.rowwise.saturated == 0);

    // A copy of the context is a checkpoint: histories and step included, it continues the same.
    linear_context<LR> snapshot = ctx;
    problem p = base;
    for (auto& v : p.dy) v *= 3.0f;
    outputs o1(p), o2(p);
    run_layer(on_host(), ctx, p, o1);
    run_layer(on_host(), snapshot, p, o2);
    check_same_bits(o2.y, o1.y, "Y (snapshot)");
    check_same_bits(o2.dx, o1.dx, "dX (snapshot)");
    check_same_bits(o2.dw, o1.dw, "dW (snapshot)");
    CHECK(ctx.stats().dy.rowwise.saturated > 0);  // dY grew 3x over its history
    CHECK(snapshot.stats().dy.rowwise.saturated == ctx.stats().dy.rowwise.saturated);
}

TEST_CASE(
    "linear, NVFP4: stochastic rounding reproducible from (seed, step) and unbiased; the Hadamard "
    "rotation leaves dY^T X unchanged") {
    using LR = linear_recipes::nvfp4;
    const std::size_t T = 64, I = 64, O = 32;
    auto g = octet_test::rng(104);
    INFO("run seed " << octet_test::run_seed());
    const problem p = make_problem(g, T, I, O);
    const exact64 e(p);

    auto config = [&](std::uint64_t seed) {
        linear_config c;
        c.max_tokens = T;
        c.in_features = I;
        c.out_features = O;
        c.seed = seed;
        return c;
    };

    // Reproducible: same (seed, step) gives the same bits; set_step resumes a run; another step or
    // another seed draws other bits.
    linear_context<LR> a(config(7)), b(config(7)), other(config(8));
    outputs a0(p), a1(p), a2(p), b0(p), b2(p), o0(p);
    run_layer(on_host(), a, p, a0);
    run_layer(on_host(), a, p, a1);
    run_layer(on_host(), a, p, a2);
    run_layer(on_host(1), b, p, b0);
    b.set_step(2);
    run_layer(on_host(), b, p, b2);
    run_layer(on_host(), other, p, o0);
    check_same_bits(a0.dx, b0.dx, "dX (same seed and step)");
    check_same_bits(a0.dw, b0.dw, "dW (same seed and step)");
    check_same_bits(a2.dw, b2.dw, "dW (step 2 after set_step(2))");
    check_same_bits(a2.dx, b2.dx, "dX (step 2 after set_step(2))");
    CHECK(a0.dx != a1.dx);
    CHECK(a0.dw != a1.dw);
    CHECK(a0.dw != o0.dw);
    check_same_bits(a0.y, o0.y, "Y (the forward draws no random bits)");

    auto rel = [](const std::vector<double>& mean, const std::vector<double>& want) {
        double num = 0.0, den = 0.0;
        for (std::size_t k = 0; k < want.size(); ++k) {
            num += (mean[k] - want[k]) * (mean[k] - want[k]);
            den += want[k] * want[k];
        }
        return std::sqrt(num / den);
    };

    // Unbiased over steps (one seed: fixed rotation, fresh rounding bits). The data gradient's
    // expectation is dY times W's (deterministic) column-wise copy, dequantized; the mean over N
    // steps approaches it like 1/sqrt(N), unlike any single step. (Only an element at its block's
    // amax can be biased, where the E4M3 block scale rounded down and it saturates: a small term.)
    constexpr int N = 256;
    composed<LR> c(T, I, O);
    c.forward(p, -1.0f, -1.0f, 7);
    const std::vector<double> wq = reference::dequantized(c.w_col.cref());  // in x out
    std::vector<double> expect_dx(T * I, 0.0);
    for (std::size_t t = 0; t < T; ++t)
        for (std::size_t o = 0; o < O; ++o)
            for (std::size_t i = 0; i < I; ++i)
                expect_dx[t * I + i] += static_cast<double>(p.dy[t * O + o]) * wq[i * O + o];
    std::vector<double> mean_dx(T * I, 0.0), one_dx(a0.dx.begin(), a0.dx.end());
    linear_context<LR> s(config(7));
    for (int k = 0; k < N; ++k) {
        outputs o(p);
        run_layer(on_host(), s, p, o);
        for (std::size_t j = 0; j < mean_dx.size(); ++j) mean_dx[j] += o.dx[j] / N;
    }
    const double single = rel(one_dx, expect_dx), averaged = rel(mean_dx, expect_dx);
    MESSAGE("NVFP4 dX, relative error to its expectation: one step " << single << ", mean of " << N << " steps "
                                                                     << averaged);
    CHECK(averaged < 3.0 * single / std::sqrt(static_cast<double>(N)) + 2e-3);

    // Over seeds (rotation and rounding bits both fresh), the mean weight gradient approaches the
    // exact dY^T X of the unquantized inputs.
    std::vector<double> mean_dw(O * I, 0.0), one_dw(a0.dw.begin(), a0.dw.end());
    for (int k = 0; k < N; ++k) {
        linear_context<LR> r(config(1000 + k));
        outputs o(p);
        run_layer(on_host(), r, p, o);
        for (std::size_t j = 0; j < mean_dw.size(); ++j) mean_dw[j] += o.dw[j] / N;
    }
    const double single_w = rel(one_dw, e.dw), averaged_w = rel(mean_dw, e.dw);
    MESSAGE("NVFP4 dW, relative error to dY^T X: one seed " << single_w << ", mean of " << N << " seeds "
                                                            << averaged_w);
    CHECK(averaged_w < 3.0 * single_w / std::sqrt(static_cast<double>(N)) + 2e-3);

    // The rotation itself: (H D dY)^T (H D X) in float64 from the float rotated matrices equals
    // dY^T X up to the rotation's float rounding (a few ulps of each coordinate), for a ragged
    // token count too (zero-padded to 16).
    for (std::size_t tokens : {std::size_t{64}, std::size_t{41}}) {
        const problem q = make_problem(g, tokens, I, O);
        const exact64 eq(q);
        const std::size_t K = (tokens + 15) / 16 * 16;
        const auto rx = rotated_columns(q.x, tokens, I, 7), rg = rotated_columns(q.dy, tokens, O, 7);
        std::vector<double> dw(O * I, 0.0);
        for (std::size_t t = 0; t < K; ++t)
            for (std::size_t o = 0; o < O; ++o)
                for (std::size_t i = 0; i < I; ++i) dw[o * I + i] += static_cast<double>(rg[t * O + o]) * rx[t * I + i];
        double worst = 0.0;
        for (std::size_t o = 0; o < O; ++o)
            for (std::size_t i = 0; i < I; ++i) {
                double mag = 0.0;  // sum_t |dY_to| |X_ti|: the scale of a rounding error
                for (std::size_t t = 0; t < tokens; ++t) mag += std::fabs(q.dy[t * O + o] * q.x[t * I + i]);
                worst = std::max(worst, std::fabs(dw[o * I + i] - eq.dw[o * I + i]) / mag);
            }
        INFO("tokens " << tokens);
        CHECK(worst < 64 * std::ldexp(1.0, -24));
    }
}

TEST_CASE_TEMPLATE("linear: zeros, no tokens, NaN and Inf", LR, OCTET_LINEAR_RECIPES) {
    const std::size_t I = 40, O = 24, max_tokens = 40;
    auto g = octet_test::rng(105);
    INFO("run seed " << octet_test::run_seed());
    linear_context<LR> ctx({max_tokens, I, O});

    SUBCASE("zero input and zero gradient") {
        problem p = make_problem(g, 33, I, O);
        std::fill(p.x.begin(), p.x.end(), 0.0f);
        std::fill(p.dy.begin(), p.dy.end(), 0.0f);
        outputs o(p);
        run_layer(on_host(), ctx, p, o);
        for (std::size_t t = 0; t < p.tokens; ++t)
            for (std::size_t j = 0; j < O; ++j) CHECK(o.y[t * O + j] == p.bias[j]);  // 0 + bias, exactly
        for (float v : o.dx) CHECK(v == 0.0f);
        for (float v : o.dw) CHECK(v == 0.0f);
        for (float v : o.db) CHECK(v == 0.0f);
        CHECK(ctx.stats().x.amax == 0.0f);
        CHECK(ctx.stats().x.rowwise.saturated + ctx.stats().dy.rowwise.saturated == 0);
    }
    SUBCASE("no tokens: Y and dX are empty, dW and db are zero") {
        const problem p = make_problem(g, 0, I, O);
        outputs o(p);
        run_layer(on_host(), ctx, p, o);
        for (float v : o.dw) CHECK(v == 0.0f);
        for (float v : o.db) CHECK(v == 0.0f);
        CHECK(ctx.step() == 1);
    }
    SUBCASE("dX or dW not needed, or no bias") {
        const problem p = make_problem(g, 17, I, O);
        outputs full(p), part(p);
        linear_context<LR> twin({max_tokens, I, O});
        run_layer(on_host(), ctx, p, full);
        linear_forward(on_host(), twin, p.X(), p.W(), {}, matrix_ref<float>(part.y.data(), p.tokens, O));
        linear_backward(on_host(), twin, p.dY(), {}, matrix_ref<float>(part.dw.data(), O, I), {});
        check_same_bits(part.dw, full.dw, "dW without dX");
        for (std::size_t t = 0; t < p.tokens; ++t)
            for (std::size_t j = 0; j < O; ++j)
                CHECK(part.y[t * O + j] + p.bias[j] == full.y[t * O + j]);  // the epilogue adds bias last
        for (float v : part.dx) CHECK(std::isnan(v));                       // not written
        for (float v : part.db) CHECK(std::isnan(v));
        linear_forward(on_host(), twin, p.X(), p.W(), {}, matrix_ref<float>(part.y.data(), p.tokens, O));
        linear_backward(on_host(), twin, p.dY(), matrix_ref<float>(part.dx.data(), p.tokens, I), {}, {});
        if (!LR::stochastic_gradients) check_same_bits(part.dx, full.dx, "dX without dW");
    }
    SUBCASE("a NaN or an Inf in X is counted and reaches every output its blocks reach (nan_policy::propagate)") {
        for (const float bad : {NAN, -INFINITY}) {
            problem p = make_problem(g, 37, I, O);
            const std::size_t t0 = 5, i0 = 11;
            p.x[t0 * I + i0] = bad;
            outputs o(p);
            run_layer(on_host(), ctx, p, o);
            CHECK(ctx.stats().x.rowwise.non_finite == 1);
            CHECK(ctx.stats().x.amax == largest_finite_abs(p.x));
            // Its block's scale is NaN: row t0 of Y (every row for a per-tensor X recipe) ...
            const bool whole = LR::x_recipe::is_per_tensor;
            for (std::size_t t = 0; t < p.tokens; ++t)
                for (std::size_t j = 0; j < O; ++j) CHECK(std::isnan(o.y[t * O + j]) == (whole || t == t0));
            // ... and column i0 of dW, which reads X's column-wise copy (or the rotated one)
            for (std::size_t o_ = 0; o_ < O; ++o_)
                for (std::size_t i = 0; i < I; ++i) {
                    const bool nan_col = whole || i == i0;
                    CHECK(std::isnan(o.dw[o_ * I + i]) == nan_col);
                }
        }
    }
}

// Real training data: multiplying X, W or dY by 2^k (k from -40 to 40, around the 1e-3..1e-6 a
// gradient has) multiplies what depends on it by 2^k bit for bit (no bias: it is added after the
// product), and zero tokens appended after the real ones (padding) leave Y and dX of the real
// tokens, and dW, unchanged bit for bit. One fresh context per run (its first step: delayed scaling
// measures; stochastic rounding draws the same bits, which depend on (seed, step) and position).
template <class LR>
outputs run_fresh(const problem& p, std::size_t max_tokens) {
    linear_context<LR> ctx({max_tokens, p.in, p.out});
    outputs o(p);
    linear_forward(on_host(), ctx, p.X(), p.W(), {}, matrix_ref<float>(o.y.data(), p.tokens, p.out));
    linear_backward(on_host(), ctx, p.dY(), matrix_ref<float>(o.dx.data(), p.tokens, p.in),
                    matrix_ref<float>(o.dw.data(), p.out, p.in), {});
    return o;
}

std::size_t count_not_scaled(const std::vector<float>& a, const std::vector<float>& b, int k, std::size_t n) {
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += !(a[i] == std::ldexp(b[i], k));
    return bad;
}

TEST_CASE_TEMPLATE("linear: X, W and dY times 2^k scale what they reach by 2^k; zero tokens appended change nothing",
                   LR, OCTET_LINEAR_RECIPES) {
    const std::size_t T = 70, I = 128, O = 64, pad = 58;
    auto g = octet_test::rng(106);
    INFO("run seed " << octet_test::run_seed());
    problem p = make_problem(g, T, I, O);
    for (float& v : p.dy) v *= 1e-3f;                               // a mean-reduced loss's gradient
    std::fill(p.dy.begin() + 69 * O, p.dy.begin() + 70 * O, 0.0f);  // the last token has no label
    const outputs base = run_fresh<LR>(p, T + pad);
    for (const int k : {-40, -13, 1, 9, 40}) {
        INFO("k = " << k);
        problem px = p, pw = p, pd = p;
        for (float& v : px.x) v = std::ldexp(v, k);
        for (float& v : pw.w) v = std::ldexp(v, k);
        for (float& v : pd.dy) v = std::ldexp(v, k);
        const outputs ox = run_fresh<LR>(px, T + pad), ow = run_fresh<LR>(pw, T + pad), od = run_fresh<LR>(pd, T + pad);
        CHECK(count_not_scaled(ox.y, base.y, k, T * O) == 0);
        CHECK(count_not_scaled(ox.dx, base.dx, 0, T * I) == 0);
        CHECK(count_not_scaled(ox.dw, base.dw, k, O * I) == 0);
        CHECK(count_not_scaled(ow.y, base.y, k, T * O) == 0);
        CHECK(count_not_scaled(ow.dx, base.dx, k, T * I) == 0);
        CHECK(count_not_scaled(ow.dw, base.dw, 0, O * I) == 0);
        CHECK(count_not_scaled(od.y, base.y, 0, T * O) == 0);
        CHECK(count_not_scaled(od.dx, base.dx, k, T * I) == 0);
        CHECK(count_not_scaled(od.dw, base.dw, k, O * I) == 0);
    }
    problem padded = p;
    padded.tokens = T + pad;
    padded.x.resize((T + pad) * I, 0.0f);
    padded.dy.resize((T + pad) * O, 0.0f);
    const outputs op = run_fresh<LR>(padded, T + pad);
    check_same_bits(std::vector<float>(op.y.begin(), op.y.begin() + T * O), base.y, "Y of the real tokens");
    check_same_bits(std::vector<float>(op.dx.begin(), op.dx.begin() + T * I), base.dx, "dX of the real tokens");
    check_same_bits(op.dw, base.dw, "dW");
    for (std::size_t i = T * O; i < op.y.size(); ++i) CHECK(op.y[i] == 0.0f);  // zero tokens, no bias: Y = 0
}

/// One quantized copy in storage the test owns (what a framework's tensors are to linear_forward).
template <class R>
struct owned_copy {
    quant_layout layout;
    std::vector<std::uint8_t> data, scales;
    float tensor_scale = 0.0f;
    owned_copy(std::size_t rows, std::size_t cols)
        : layout(quant_layout_of<R>::make(rows, cols)), data(layout.data_bytes), scales(layout.scale_bytes) {}
    quantized_ref<R> ref() { return {data.data(), scales.data(), layout, R::two_level ? &tensor_scale : nullptr}; }
};

TEST_CASE_TEMPLATE("linear: the caller-owned buffers give the context's bits, step by step", LR, OCTET_LINEAR_RECIPES) {
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    using GR = typename LR::g_quantize_recipe;
    INFO("run seed " << octet_test::run_seed());
    auto g = octet_test::rng(0x11AEu);
    const std::size_t T = 37, I = 48, O = 40;  // ragged tokens: the Hadamard pads 37 to 48
    linear_config cfg{T, I, O};
    cfg.seed = g();
    linear_context<LR> ctx(cfg);
    const std::size_t P = linear_wgrad_tokens<LR>(T);
    owned_copy<XR> x(T, I), x_t(I, P);
    owned_copy<WR> w(O, I), w_t(I, O);
    owned_copy<GR> dy(T, O), dy_t(O, P);
    std::vector<float> rotated(P * std::max(I, O));
    for (int step = 0; step < 3; ++step) {
        CAPTURE(step);
        const problem p = make_problem(g, T, I, O, step == 2);
        linear_step_options o;
        if constexpr (LR::scaling == linear_scaling::delayed) {
            o.x_scale_amax = ctx.delayed_x().amax_for_scale();
            o.w_scale_amax = ctx.delayed_w().amax_for_scale();
            o.g_scale_amax = ctx.delayed_g().amax_for_scale();
        }
        o.seed = cfg.seed;
        o.step = ctx.step();
        outputs want(p), got(p);
        run_layer(on_host(2), ctx, p, want);

        linear_stats stats;
        linear_forward_buffers<LR> fb{x.ref(), w.ref(), x_t.ref(), w_t.ref(), as_span(rotated)};
        linear_forward<LR>(on_host(2), p.X(), p.W(), as_cspan(p.bias), matrix_ref<float>(got.y.data(), T, O), fb, o,
                           stats);
        linear_backward_buffers<LR> bb{x_t.ref(), w_t.ref(), dy.ref(), dy_t.ref(), as_span(rotated)};
        linear_backward<LR>(on_host(2), p.dY(), matrix_ref<float>(got.dx.data(), T, I),
                            matrix_ref<float>(got.dw.data(), O, I), as_span(got.db), bb, o, stats);
        check_same_bits(got.y, want.y, "y");
        check_same_bits(got.dx, want.dx, "dx");
        check_same_bits(got.dw, want.dw, "dw");
        check_same_bits(got.db, want.db, "db");
        check_same_stats(stats.x.rowwise, ctx.stats().x.rowwise, "x");
        check_same_stats(stats.w.columnwise, ctx.stats().w.columnwise, "w_t");
        check_same_stats(stats.dy.rowwise, ctx.stats().dy.rowwise, "dy");
        check_same_stats(stats.merged(), ctx.stats().merged(), "all copies");
    }
}

TEST_CASE("linear: the caller-owned form names the buffer that is missing or too small") {
    using LR = linear_recipes::nvfp4;
    using XR = LR::x_recipe;
    using WR = LR::w_recipe;
    using GR = LR::g_quantize_recipe;
    const std::size_t T = 20, I = 32, O = 16, P = 32;
    std::vector<float> x(T * I, 1.0f), w(O * I, 1.0f), y(T * O), dx(T * I), dw(O * I), rotated(P * I);
    owned_copy<XR> xq(T, I), x_t(I, P), x_t_short(I, T);
    owned_copy<WR> wq(O, I), w_t(I, O);
    owned_copy<GR> dyq(T, O), dy_t(O, P);
    const matrix_ref<const float> X(x.data(), T, I), W(w.data(), O, I), dY(y.data(), T, O);
    const matrix_ref<float> Y(y.data(), T, O), dX(dx.data(), T, I), dW(dw.data(), O, I);
    linear_stats st;
    using doctest::Contains;
    CHECK_THROWS_WITH_AS(
        linear_forward<LR>(on_host(), X, W, {}, Y,
                           {xq.ref(), wq.ref(), x_t.ref(), w_t.ref(), span<float>(rotated.data(), 10)}, {}, st),
        Contains("argument 'buffers.rotated'"), octet::error);
    CHECK_THROWS_WITH_AS(
        linear_forward<LR>(on_host(), X, W, {}, Y, {{}, wq.ref(), x_t.ref(), w_t.ref(), as_span(rotated)}, {}, st),
        Contains("argument 'buffers.x/buffers.w'"), octet::error);
    CHECK_THROWS_WITH_AS(linear_forward<LR>(on_host(), X, W, {}, Y,
                                            {xq.ref(), wq.ref(), x_t_short.ref(), w_t.ref(), as_span(rotated)}, {}, st),
                         Contains("octet::quantize"), octet::error);  // the rotated copy spans 32 tokens, not 20
    linear_forward<LR>(on_host(), X, W, {}, Y, {xq.ref(), wq.ref(), x_t.ref(), w_t.ref(), as_span(rotated)}, {}, st);
    CHECK_THROWS_WITH_AS(linear_backward<LR>(on_host(), dY, dX, dW, {},
                                             {{}, w_t.ref(), dyq.ref(), dy_t.ref(), as_span(rotated)}, {}, st),
                         Contains("argument 'buffers.x_t'"), octet::error);
    CHECK_THROWS_WITH_AS(linear_backward<LR>(on_host(), dY, dX, dW, {},
                                             {x_t.ref(), {}, dyq.ref(), dy_t.ref(), as_span(rotated)}, {}, st),
                         Contains("argument 'buffers.w_t'"), octet::error);
    CHECK_THROWS_WITH_AS(linear_backward<LR>(on_host(), dY, dX, dW, {},
                                             {x_t.ref(), w_t.ref(), {}, dy_t.ref(), as_span(rotated)}, {}, st),
                         Contains("argument 'buffers.dy'"), octet::error);
    CHECK_THROWS_WITH_AS(
        linear_backward<LR>(on_host(), dY, dX, dW, {}, {x_t.ref(), w_t.ref(), dyq.ref(), {}, as_span(rotated)}, {}, st),
        Contains("argument 'buffers.dy_t'"), octet::error);
    CHECK_THROWS_WITH_AS(linear_backward<LR>(on_host(), matrix_ref<const float>(y.data(), T - 4, O), {}, dW, {},
                                             {x_t.ref(), w_t.ref(), dyq.ref(), dy_t.ref(), as_span(rotated)}, {}, st),
                         Contains("argument 'buffers.x_t'"), octet::error);  // 16 tokens pad to 16, not 32
    // Only what is wanted must be there: dX alone needs neither X^T's copy nor dY^T's.
    linear_backward<LR>(on_host(), dY, dX, {}, {}, {{}, w_t.ref(), dyq.ref(), {}, {}}, {}, st);
    CHECK(std::isfinite(dx[0]));
}

TEST_CASE("linear: arguments are checked once, with the argument and the fix named") {
    using LR = linear_recipes::blockwise;
    const std::size_t T = 32, I = 48, O = 16;
    linear_context<LR> ctx({T, I, O});
    std::vector<float> x((T + 1) * I, 1.0f), w(O * I, 1.0f), y((T + 1) * O), dx(T * I), dw(O * I), b(O);
    const matrix_ref<const float> X(x.data(), T, I), W(w.data(), O, I);
    const matrix_ref<float> Y(y.data(), T, O);
    using doctest::Contains;

    CHECK_THROWS_WITH_AS(linear_backward(on_host(), ctx, matrix_ref<const float>(y.data(), T, O), {},
                                         matrix_ref<float>(dw.data(), O, I), {}),
                         Contains("octet::linear_backward: argument 'ctx'"), octet::error);
    CHECK_THROWS_WITH_AS(linear_forward(on_host(), ctx, matrix_ref<const float>(x.data(), T + 1, I), W, {},
                                        matrix_ref<float>(y.data(), T + 1, O)),
                         Contains("max_tokens"), octet::error);
    CHECK_THROWS_WITH_AS(linear_forward(on_host(), ctx, matrix_ref<const float>(x.data(), T, I - 1), W, {}, Y),
                         Contains("argument 'x'"), octet::error);
    CHECK_THROWS_WITH_AS(linear_forward(on_host(), ctx, X, matrix_ref<const float>(w.data(), I, O), {}, Y),
                         Contains("argument 'w'"), octet::error);
    CHECK_THROWS_WITH_AS(linear_forward(on_host(), ctx, X, W, {}, matrix_ref<float>(y.data(), T, O - 1)),
                         Contains("argument 'y'"), octet::error);
    CHECK_THROWS_WITH_AS(linear_forward(on_host(), ctx, X, W, span<const float>(b.data(), O - 1), Y),
                         Contains("argument 'bias'"), octet::error);
    CHECK_THROWS_WITH_AS(linear_forward(on_host(), ctx, matrix_ref<const float>(nullptr, T, I), W, {}, Y),
                         Contains("argument 'x'"), octet::error);
    CHECK_FALSE(ctx.has_saved_forward());

    linear_forward(on_host(), ctx, X, W, {}, Y);
    CHECK_THROWS_WITH_AS(linear_backward(on_host(), ctx, matrix_ref<const float>(y.data(), T - 1, O), {},
                                         matrix_ref<float>(dw.data(), O, I), {}),
                         Contains("argument 'dy'"), octet::error);
    CHECK_THROWS_WITH_AS(
        linear_backward(on_host(), ctx, matrix_ref<const float>(y.data(), T, O), matrix_ref<float>(dx.data(), T, I - 1),
                        matrix_ref<float>(dw.data(), O, I), {}),
        Contains("argument 'dx'"), octet::error);
    CHECK_THROWS_WITH_AS(linear_backward(on_host(), ctx, matrix_ref<const float>(y.data(), T, O), {},
                                         matrix_ref<float>(dw.data(), I, O), {}),
                         Contains("argument 'dw'"), octet::error);
    CHECK_THROWS_WITH_AS(linear_backward(on_host(), ctx, matrix_ref<const float>(y.data(), T, O), {},
                                         matrix_ref<float>(dw.data(), O, I), span<float>(b.data(), O + 1)),
                         Contains("argument 'db'"), octet::error);
    // The failed calls left the forward's copies: one backward runs, a second one has nothing.
    linear_backward(on_host(), ctx, matrix_ref<const float>(y.data(), T, O), {}, matrix_ref<float>(dw.data(), O, I),
                    {});
    CHECK_THROWS_WITH_AS(linear_backward(on_host(), ctx, matrix_ref<const float>(y.data(), T, O), {},
                                         matrix_ref<float>(dw.data(), O, I), {}),
                         Contains("call linear_forward"), octet::error);

    CHECK_THROWS_WITH_AS(linear_context<LR>({T, 0, O}), Contains("argument 'config.in_features'"), octet::error);
    CHECK_THROWS_WITH_AS(linear_context<LR>({T, I, 0}), Contains("argument 'config.out_features'"), octet::error);
    linear_config bad{T, I, O};
    bad.delayed.history_length = 0;
    CHECK_THROWS_WITH_AS(linear_context<linear_recipes::tensorwise_delayed>{bad}, Contains("config.history_length"),
                         octet::error);
}

namespace nn_linear_workspace_test {
using namespace octet;

/// Three layers of different shapes on one linear_workspace, run as a model runs them (forwards in
/// order, backwards in reverse, two steps), against the same layers with storage of their own.
template <class LR>
void check_shared_workspace(std::uint64_t salt) {
    INFO("seed=" << octet_test::run_seed());
    auto g = octet_test::rng(salt);
    const std::size_t tokens = 1 + g() % 70;
    const std::size_t widths[4] = {64, 96, 160, 64};
    linear_workspace ws;
    std::vector<linear_context<LR>> own, shared;
    std::size_t most = 0;
    for (int l = 0; l < 3; ++l) {
        linear_config c;
        c.max_tokens = tokens + static_cast<std::size_t>(l);  // contexts of different sizes
        c.in_features = widths[l];
        c.out_features = widths[l + 1];
        c.seed = salt + static_cast<std::uint64_t>(l);
        own.emplace_back(c);
        shared.emplace_back(c, ws);
        most = std::max(most, linear_context<LR>::workspace_bytes(c));
        CHECK(shared.back().memory().workspace == 0);
        CHECK(shared.back().memory().saved_for_backward == own.back().memory().saved_for_backward);
        CHECK(shared.back().workspace() == &ws);
    }
    CHECK(ws.bytes() == most);
    thread_pool pool(2);
    for (int step = 0; step < 2; ++step) {
        std::vector<std::vector<float>> acts[2], grads[2], dws[2];
        for (int k = 0; k < 2; ++k) {
            auto& ctx = k == 0 ? own : shared;
            acts[k].push_back(octet_test::with_edge_cases(g, tokens * widths[0], 1.0f));
            if (k == 1) acts[1][0] = acts[0][0];
            std::vector<std::vector<float>> ws_(3);
            for (int l = 0; l < 3; ++l) {
                auto gw = octet_test::rng(salt * 31 + static_cast<std::uint64_t>(l));
                ws_[l] = octet_test::with_edge_cases(gw, widths[l + 1] * widths[l], 0.1f);
                acts[k].emplace_back(tokens * widths[l + 1]);
                linear_forward(on_host(pool), ctx[l], matrix_ref<const float>(acts[k][l].data(), tokens, widths[l]),
                               matrix_ref<const float>(ws_[l].data(), widths[l + 1], widths[l]), {},
                               matrix_ref<float>(acts[k][l + 1].data(), tokens, widths[l + 1]));
            }
            auto gd = octet_test::rng(salt * 7 + static_cast<std::uint64_t>(step));
            grads[k].push_back(octet_test::with_edge_cases(gd, tokens * widths[3], 0.01f));
            for (int l = 2; l >= 0; --l) {
                std::vector<float> dx(tokens * widths[l]), dw(widths[l + 1] * widths[l]);
                linear_backward(on_host(pool), ctx[l],
                                matrix_ref<const float>(grads[k].back().data(), tokens, widths[l + 1]),
                                matrix_ref<float>(dx.data(), tokens, widths[l]),
                                matrix_ref<float>(dw.data(), widths[l + 1], widths[l]), {});
                grads[k].push_back(dx);
                dws[k].push_back(dw);
            }
        }
        for (std::size_t i = 0; i < acts[0].size(); ++i)
            CHECK(std::memcmp(acts[0][i].data(), acts[1][i].data(), acts[0][i].size() * sizeof(float)) == 0);
        for (std::size_t i = 0; i < grads[0].size(); ++i)
            CHECK(std::memcmp(grads[0][i].data(), grads[1][i].data(), grads[0][i].size() * sizeof(float)) == 0);
        for (std::size_t i = 0; i < dws[0].size(); ++i)
            CHECK(std::memcmp(dws[0][i].data(), dws[1][i].data(), dws[0][i].size() * sizeof(float)) == 0);
    }
}

TEST_CASE("layers on one shared linear_workspace compute the bits of layers with storage of their own") {
    check_shared_workspace<linear_recipes::mxfp8>(11);
    check_shared_workspace<linear_recipes::blockwise>(12);
    check_shared_workspace<linear_recipes::tensorwise_delayed>(13);
    check_shared_workspace<linear_recipes::nvfp4>(14);
}

}  // namespace nn_linear_workspace_test

namespace nn_linear_recompute_test {
using namespace octet;

/// Two steps of a layer that keeps X's copy against one that takes X again in the backward
/// (config.recompute_input), on a workspace and on storage of its own: given the forward's X, the
/// same bits (delayed scaling included: the forward's X scale); given another X, dX and db the
/// same and dW that of the other X's copy; the activation memory W's copy alone.
template <class LR>
void check_recompute(std::uint64_t salt) {
    INFO("seed=" << octet_test::run_seed());
    auto g = octet_test::rng(salt);
    const std::size_t tokens = 1 + g() % 150, in = 32 * (1 + g() % 5), out = 32 * (1 + g() % 5);
    linear_config c;
    c.max_tokens = tokens + 3;
    c.in_features = in;
    c.out_features = out;
    c.seed = salt;
    linear_config r = c;
    r.recompute_input = true;
    linear_workspace ws;
    linear_context<LR> kept(c), again(r), again_ws(r, ws), again_other(r);
    CHECK(again.memory().saved_for_backward == detail::quant_buffer_bytes<typename LR::w_recipe>(in, out));
    CHECK(again.memory().saved_for_backward + detail::quant_buffer_bytes<typename LR::x_recipe>(in, c.max_tokens) ==
          kept.memory().saved_for_backward);
    CHECK(again_ws.memory().saved_for_backward == again.memory().saved_for_backward);
    CHECK(ws.bytes() == linear_context<LR>::workspace_bytes(r));
    CHECK(linear_context<LR>::workspace_bytes(r) >= linear_context<LR>::workspace_bytes(c));
    thread_pool pool(2);
    for (int step = 0; step < 2; ++step) {
        const auto x = octet_test::with_edge_cases(g, tokens * in, 1.0f);
        const auto w = octet_test::with_edge_cases(g, out * in, 0.1f);
        const auto dy = octet_test::with_edge_cases(g, tokens * out, 0.01f);
        auto x2 = x;  // "a recomputation": another X
        for (std::size_t i = 0; i < x2.size(); i += 3) x2[i] *= 1.5f;
        const matrix_ref<const float> X(x.data(), tokens, in), X2(x2.data(), tokens, in), W(w.data(), out, in),
            DY(dy.data(), tokens, out);
        struct result {
            std::vector<float> y, dx, dw, db;
        };
        auto run = [&](linear_context<LR>& ctx, const matrix_ref<const float>* x_again) {
            result res{std::vector<float>(tokens * out), std::vector<float>(tokens * in), std::vector<float>(out * in),
                       std::vector<float>(out)};
            linear_forward(on_host(pool), ctx, X, W, {}, matrix_ref<float>(res.y.data(), tokens, out));
            const matrix_ref<float> dx(res.dx.data(), tokens, in), dw(res.dw.data(), out, in);
            if (x_again)
                linear_backward(on_host(pool), ctx, *x_again, DY, dx, dw, as_span(res.db));
            else
                linear_backward(on_host(pool), ctx, DY, dx, dw, as_span(res.db));
            return res;
        };
        const result a = run(kept, nullptr), b = run(again, &X), bw = run(again_ws, &X);
        for (const result* q : {&b, &bw}) {
            CHECK(std::memcmp(a.y.data(), q->y.data(), a.y.size() * sizeof(float)) == 0);
            CHECK(std::memcmp(a.dx.data(), q->dx.data(), a.dx.size() * sizeof(float)) == 0);
            CHECK(std::memcmp(a.dw.data(), q->dw.data(), a.dw.size() * sizeof(float)) == 0);
            CHECK(std::memcmp(a.db.data(), q->db.data(), a.db.size() * sizeof(float)) == 0);
        }
        CHECK(again.stats().x.columnwise.elements == kept.stats().x.columnwise.elements);
        CHECK(again.stats().x.columnwise.noise_energy == kept.stats().x.columnwise.noise_energy);
        // another X (a context in lockstep: the same delayed-scaling histories): dX and db as
        // before, dW another
        const result d = run(again_other, &X2);
        CHECK(std::memcmp(a.dx.data(), d.dx.data(), a.dx.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(a.db.data(), d.db.data(), a.db.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(a.dw.data(), d.dw.data(), a.dw.size() * sizeof(float)) != 0);
    }
    // bad input, named: no X where a weight gradient needs it, an X the context does not take, a
    // wrong shape, a recipe whose X copy is rotated
    std::vector<float> x(tokens * in, 1.0f), w(out * in, 0.5f), y(tokens * out), dy(tokens * out, 1.0f),
        dx(tokens * in), dw(out * in);
    const matrix_ref<const float> X(x.data(), tokens, in), W(w.data(), out, in), DY(dy.data(), tokens, out);
    linear_forward(on_host(), again, X, W, {}, matrix_ref<float>(y.data(), tokens, out));
    CHECK_THROWS_WITH_AS(linear_backward(on_host(), again, DY, matrix_ref<float>(dx.data(), tokens, in),
                                         matrix_ref<float>(dw.data(), out, in), {}),
                         doctest::Contains("x"), octet::error);
    CHECK_THROWS_WITH_AS(
        linear_backward(on_host(), again, matrix_ref<const float>(x.data(), tokens, in - 1), DY,
                        matrix_ref<float>(dx.data(), tokens, in), matrix_ref<float>(dw.data(), out, in), {}),
        doctest::Contains("x"), octet::error);
    // dX alone needs no X
    linear_backward(on_host(), again, DY, matrix_ref<float>(dx.data(), tokens, in), {}, {});
    linear_forward(on_host(), kept, X, W, {}, matrix_ref<float>(y.data(), tokens, out));
    CHECK_THROWS_WITH_AS(linear_backward(on_host(), kept, X, DY, matrix_ref<float>(dx.data(), tokens, in),
                                         matrix_ref<float>(dw.data(), out, in), {}),
                         doctest::Contains("recompute_input"), octet::error);
}

TEST_CASE("linear: recompute_input takes X again in the backward: the saved forward's bits, W's copy alone kept") {
    check_recompute<linear_recipes::blockwise>(21);
    check_recompute<linear_recipes::mxfp8>(22);
    check_recompute<linear_recipes::tensorwise>(23);
    check_recompute<linear_recipes::tensorwise_delayed>(24);
    linear_config c;
    c.max_tokens = 16;
    c.in_features = c.out_features = 32;
    c.recompute_input = true;
    CHECK_THROWS_WITH_AS(linear_context<linear_recipes::nvfp4>{c}, doctest::Contains("recompute_input"), octet::error);
}

}  // namespace nn_linear_recompute_test
