// octet-test: timeout=600
//
// The linear layer on a stream (octet/nn/linear.cuh) against the host layer (which
// tests/host/nn_linear.cpp checks against quantize and scaled_gemm composed by hand). Every device
// output is poisoned first, so an unwritten byte fails. For each named linear recipe whose GEMMs
// octet's own kernels serve (tensorwise, tensorwise_delayed, blockwise, mxfp8) and for MXFP8 with
// NVFP4's mechanisms (stochastic dY, Hadamard-rotated weight-gradient inputs), over ragged token
// counts, edge values (zeros, subnormals, outliers) and given delayed-scaling amaxes:
//   * every quantized copy (X, W, X^T, W^T, dY, dY^T, the rotated ones) equals the host's bit for
//     bit, and so do the rotated buffers and db;
//   * Y, dX and dW are the stream's scaled_gemm on those copies, bit for bit (the stream GEMM
//     against the host GEMM is gemm_device.cu's test);
//   * the device statistics equal the host's: counts exactly, amaxes bit for bit, energies to 1e-9;
//   * octet::cuda::linear_context over several steps equals octet::linear_context (statistics and
//     delayed-scaling state bit for bit; outputs within 1e-5, see check_context_steps).
// Suite "cuda" (no GPU needed): the entry's argument checks on the stream form. Suite "gpu": the
// rest; under the interpreter (interpret.linear_device) on the same small shapes.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "octet/cuda/buffer.cuh"
#include "octet/nn/linear.cuh"
#include "support/random.hpp"

namespace linear_device_test {
using namespace octet;

/// MXFP8 operands with NVFP4's mechanisms (stochastic dY, rotated weight-gradient inputs): the
/// rotation and the random streams on a stream, with GEMMs octet's kernels serve.
using mxfp8_rotated =
    linear_recipe<recipes::mxfp8_e4m3, recipes::mxfp8_e4m3, recipes::mxfp8_e5m2, linear_scaling::current, true, true>;

/// A quantized copy in poisoned device memory, laid out as the host's quantized_tensor (16-byte rows).
template <class R>
struct device_copy {
    quant_layout layout;
    cuda::device_buffer<std::uint8_t> data, scales;
    cuda::device_buffer<float> tensor_scale{1};
    device_copy(std::size_t rows, std::size_t cols)
        : layout(quant_layout_of<R>::make(rows, cols, true)), data(layout.data_bytes), scales(layout.scale_bytes) {
        data.fill_bytes(0xA5);
        scales.fill_bytes(0xA5);
        tensor_scale.fill_bytes(0xA5);
    }
    quantized_ref<R> ref() { return quantized_ref<R>(data.data(), scales.data(), layout, tensor_scale.data()); }
    quantized_cref<R> cref() { return ref(); }
};

template <class R>
void check_same_copy(device_copy<R>& d, quantized_tensor<R>& h, const char* what) {
    INFO(what);
    CHECK(d.data.download() == h.data());
    CHECK(d.scales.download() == h.scales());
    if constexpr (R::two_level) {
        const float ts = d.tensor_scale.download()[0], hts = h.tensor_scale();
        CHECK(std::memcmp(&ts, &hts, sizeof ts) == 0);
    }
}

void check_same_stats(const quant_stats& d, const quant_stats& h, const char* what) {
    INFO(what);
    CHECK(std::memcmp(&d.amax, &h.amax, sizeof d.amax) == 0);
    CHECK(d.elements == h.elements);
    CHECK(d.saturated == h.saturated);
    CHECK(d.flushed_to_zero == h.flushed_to_zero);
    CHECK(d.non_finite == h.non_finite);
    CHECK(d.lost_to_nan == h.lost_to_nan);
    CHECK(d.signal_energy == doctest::Approx(h.signal_energy).epsilon(1e-9));
    CHECK(d.noise_energy == doctest::Approx(h.noise_energy).epsilon(1e-9));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

cuda::device_buffer<float> poisoned(std::size_t n) {
    cuda::device_buffer<float> b(n);
    b.fill_bytes(0xFF);
    return b;
}

float finite_amax(const std::vector<float>& v) {
    float m = 0.0f;
    for (float x : v)
        if (std::isfinite(x)) m = std::max(m, std::fabs(x));
    return m;
}

/// One forward and backward of LR on the host and on a stream, compared as the top of the file says.
/// given_amax: delayed scaling's amaxes given (2x each input's), else current scaling.
template <class LR>
void check_layer(std::size_t tokens, std::size_t in, std::size_t out, bool given_amax, std::uint64_t salt) {
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    using GR = typename LR::g_quantize_recipe;
    INFO("tokens " << tokens << " in " << in << " out " << out << " given amax " << given_amax);
    auto g = octet_test::rng(salt);
    const std::size_t P = linear_wgrad_tokens<LR>(tokens);
    const std::vector<float> x = octet_test::with_edge_cases(g, tokens * in, 1.0f),
                             w = octet_test::with_edge_cases(g, out * in, 0.1f),
                             dy = octet_test::with_edge_cases(g, tokens * out, 0.01f);
    std::vector<float> bias(out);
    for (std::size_t j = 0; j < out; ++j) bias[j] = 0.25f * static_cast<float>(j % 7) - 0.75f;

    // The host layer.
    quantized_tensor<XR> hx(tokens, in), hxt(in, P);
    quantized_tensor<WR> hw(out, in), hwt(in, out);
    quantized_tensor<GR> hdy(tokens, out), hdyt(out, P);
    std::vector<float> hrot(P * std::max(in, out)), hy(tokens * out), hdx(tokens * in), hdw(out * in), hdb(out);
    linear_step_options ho;
    ho.seed = 0x5EED + salt;
    ho.step = 3;
    if (given_amax) {
        ho.x_scale_amax = 2.0f * finite_amax(x);
        ho.w_scale_amax = 2.0f * finite_amax(w);
        ho.g_scale_amax = 2.0f * finite_amax(dy);
    }
    linear_stats hs;
    linear_forward<LR>(on_host(), matrix_ref<const float>(x.data(), tokens, in),
                       matrix_ref<const float>(w.data(), out, in), as_cspan(bias),
                       matrix_ref<float>(hy.data(), tokens, out),
                       {hx.ref(), hw.ref(), hxt.ref(), hwt.ref(), span<float>(hrot.data(), hrot.size())}, ho, hs);
    const std::vector<float> hrot_x(hrot.begin(),
                                    hrot.begin() + static_cast<std::ptrdiff_t>(LR::hadamard_wgrad ? P * in : 0));
    linear_backward<LR>(on_host(), matrix_ref<const float>(dy.data(), tokens, out),
                        matrix_ref<float>(hdx.data(), tokens, in), matrix_ref<float>(hdw.data(), out, in), as_span(hdb),
                        {hxt.cref(), hwt.cref(), hdy.ref(), hdyt.ref(), span<float>(hrot.data(), hrot.size())}, ho, hs);
    const std::vector<float> hrot_dy(hrot.begin(),
                                     hrot.begin() + static_cast<std::ptrdiff_t>(LR::hadamard_wgrad ? P * out : 0));

    // The same on a stream.
    const cuda::device_buffer<float> dxin(x), dwin(w), ddy(dy), dbias(bias);
    device_copy<XR> dx_row(tokens, in), dx_col(in, P);
    device_copy<WR> dw_row(out, in), dw_col(in, out);
    device_copy<GR> ddy_row(tokens, out), ddy_col(out, P);
    auto rot = poisoned(P * std::max(in, out)), y = poisoned(tokens * out), dxo = poisoned(tokens * in),
         dwo = poisoned(out * in), db = poisoned(out);
    cuda::device_buffer<float> amaxes(std::vector<float>{ho.x_scale_amax, ho.w_scale_amax, ho.g_scale_amax});
    device_linear_step_options dopt;
    dopt.seed = ho.seed;
    dopt.step = ho.step;
    if (given_amax) {
        dopt.x_scale_amax = amaxes.data();
        dopt.w_scale_amax = amaxes.data() + 1;
        dopt.g_scale_amax = amaxes.data() + 2;
    }
    cuda::device_buffer<device_linear_forward_stats> fs(1);
    cuda::device_buffer<device_linear_backward_stats> bs(1);
    fs.fill_bytes(0xA5);
    bs.fill_bytes(0xA5);
    const stream_executor ex = on_stream();
    const matrix_ref<const float> X(dxin.data(), tokens, in), W(dwin.data(), out, in), dY(ddy.data(), tokens, out);
    linear_forward<LR>(ex, X, W, dbias.cview(), matrix_ref<float>(y.data(), tokens, out),
                       {dx_row.ref(), dw_row.ref(), dx_col.ref(), dw_col.ref(), rot.view()}, dopt, fs.data());
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    check_same_copy(dx_row, hx, "X's row-wise copy");
    check_same_copy(dw_row, hw, "W's row-wise copy");
    check_same_copy(dx_col, hxt, LR::hadamard_wgrad ? "the rotated X's column-wise copy" : "X's column-wise copy");
    check_same_copy(dw_col, hwt, "W's column-wise copy");
    if (LR::hadamard_wgrad) {
        std::vector<float> r = rot.download();
        r.resize(P * in);
        CHECK(same_bits(r, hrot_x));
    }
    const device_linear_forward_stats f = fs.download()[0];
    check_same_stats(f.x[0], hs.x.rowwise, "stats x rowwise");
    check_same_stats(f.x[1], hs.x.columnwise, "stats x columnwise");
    check_same_stats(f.w[0], hs.w.rowwise, "stats w rowwise");
    check_same_stats(f.w[1], hs.w.columnwise, "stats w columnwise");
    check_same_stats(f.x_hadamard[0], hs.x_hadamard.rowwise, "stats x_hadamard rowwise");
    check_same_stats(f.x_hadamard[1], hs.x_hadamard.columnwise, "stats x_hadamard columnwise");
    CHECK(f.x_amax == hs.x.amax);
    CHECK(f.w_amax == hs.w.amax);

    linear_backward<LR>(ex, dY, matrix_ref<float>(dxo.data(), tokens, in), matrix_ref<float>(dwo.data(), out, in),
                        db.view(), {dx_col.cref(), dw_col.cref(), ddy_row.ref(), ddy_col.ref(), rot.view()}, dopt,
                        bs.data());
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    check_same_copy(ddy_row, hdy, "dY's row-wise copy");
    check_same_copy(ddy_col, hdyt, LR::hadamard_wgrad ? "the rotated dY's column-wise copy" : "dY's column-wise copy");
    if (LR::hadamard_wgrad) {
        std::vector<float> r = rot.download();
        r.resize(P * out);
        CHECK(same_bits(r, hrot_dy));
    }
    CHECK(same_bits(db.download(), hdb));
    const device_linear_backward_stats b = bs.download()[0];
    check_same_stats(b.dy[0], hs.dy.rowwise, "stats dy rowwise");
    check_same_stats(b.dy[1], hs.dy.columnwise, "stats dy columnwise");
    check_same_stats(b.dy_hadamard[0], hs.dy_hadamard.rowwise, "stats dy_hadamard rowwise");
    check_same_stats(b.dy_hadamard[1], hs.dy_hadamard.columnwise, "stats dy_hadamard columnwise");
    CHECK(b.dy_amax == hs.dy.amax);

    // Y, dX, dW: the stream GEMM on the copies just checked, bit for bit.
    auto y2 = poisoned(tokens * out), dx2 = poisoned(tokens * in), dw2 = poisoned(out * in);
    gemm_options go;
    go.bias = dbias.cview();
    scaled_gemm(ex, dx_row.cref(), dw_row.cref(), matrix_ref<float>(y2.data(), tokens, out), go);
    scaled_gemm(ex, ddy_row.cref(), dw_col.cref(), matrix_ref<float>(dx2.data(), tokens, in));
    scaled_gemm(ex, ddy_col.cref(), dx_col.cref(), matrix_ref<float>(dw2.data(), out, in));
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(same_bits(y.download(), y2.download()));
    CHECK(same_bits(dxo.download(), dx2.download()));
    CHECK(same_bits(dwo.download(), dw2.download()));
}

template <class LR>
void check_shapes(std::uint64_t salt) {
    // Ragged token counts (a Hadamard group of 16 cut short, MX and 128-blocks cut short), and no tokens.
    check_layer<LR>(37, 64, 96, false, salt);
    check_layer<LR>(130, 96, 32, false, salt + 1);
    check_layer<LR>(0, 32, 64, false, salt + 2);
    if (LR::x_recipe::is_per_tensor) check_layer<LR>(37, 64, 96, true, salt + 3);
}

/// Several training steps of LR through octet::linear_context on the host and
/// octet::cuda::linear_context on a stream, on the same inputs (ragged token counts; inputs that
/// grow 4x a step, so that delayed scaling's stale amaxes saturate): every step's statistics
/// (counts exactly, amaxes bit for bit), the delayed-scaling histories and scale amaxes bit for bit,
/// and Y, dX, dW within 1e-5 normwise of the host's (the stream GEMM sums in another order; a scale
/// from the wrong amax moves them by about 1e-2).
template <class LR>
void check_context_steps(std::uint64_t salt) {
    const std::size_t in = 64, out = 48, max_tokens = 80;
    linear_config c;
    c.max_tokens = max_tokens;
    c.in_features = in;
    c.out_features = out;
    c.delayed.history_length = 3;
    c.seed = 0xC0FFEE + salt;
    linear_context<LR> host(c);
    const stream_executor ex = on_stream();
    cuda::linear_context<LR> dev(ex, c);
    CHECK(dev.memory().total() == host.memory().total());
    CHECK(dev.memory().saved_for_backward == host.memory().saved_for_backward);
    CHECK_THROWS_WITH_AS(dev.delayed_state(3), doctest::Contains("0 (X), 1 (W) or 2 (dY)"), octet::error);
    CHECK_THROWS_WITH_AS(dev.delayed_history(-1), doctest::Contains("argument 'operand'"), octet::error);
    auto g = octet_test::rng(salt);
    const std::size_t tokens_of[] = {37, 80, 16, 37, 5};
    float grow = 1.0f;
    for (int step = 0; step < 5; ++step, grow *= 4.0f) {
        const std::size_t tokens = tokens_of[step];
        INFO("step " << step << " tokens " << tokens);
        const std::vector<float> x = octet_test::with_edge_cases(g, tokens * in, grow),
                                 w = octet_test::with_edge_cases(g, out * in, 0.1f * grow),
                                 dy = octet_test::with_edge_cases(g, tokens * out, 0.01f * grow);
        std::vector<float> hy(tokens * out), hdx(tokens * in), hdw(out * in);
        linear_forward(on_host(), host, matrix_ref<const float>(x.data(), tokens, in),
                       matrix_ref<const float>(w.data(), out, in), {}, matrix_ref<float>(hy.data(), tokens, out));
        const linear_stats hf = host.stats();
        linear_backward(on_host(), host, matrix_ref<const float>(dy.data(), tokens, out),
                        matrix_ref<float>(hdx.data(), tokens, in), matrix_ref<float>(hdw.data(), out, in), {});
        const linear_stats hb = host.stats();

        const cuda::device_buffer<float> dxin(x), dwin(w), ddy(dy);
        auto y = poisoned(tokens * out), dxo = poisoned(tokens * in), dwo = poisoned(out * in);
        linear_forward(ex, dev, matrix_ref<const float>(dxin.data(), tokens, in),
                       matrix_ref<const float>(dwin.data(), out, in), {}, matrix_ref<float>(y.data(), tokens, out));
        device_linear_forward_stats f;
        OCTET_CUDA_CHECK(cudaMemcpy(&f, dev.forward_stats(), sizeof f, cudaMemcpyDeviceToHost));
        linear_backward(ex, dev, matrix_ref<const float>(ddy.data(), tokens, out),
                        matrix_ref<float>(dxo.data(), tokens, in), matrix_ref<float>(dwo.data(), out, in), {});
        device_linear_backward_stats b;
        OCTET_CUDA_CHECK(cudaMemcpy(&b, dev.backward_stats(), sizeof b, cudaMemcpyDeviceToHost));
        CHECK(dev.step() == host.step());
        CHECK(!dev.has_saved_forward());

        check_same_stats(f.x[0], hf.x.rowwise, "stats x rowwise");
        check_same_stats(f.x[1], hf.x.columnwise, "stats x columnwise");
        check_same_stats(f.w[0], hf.w.rowwise, "stats w rowwise");
        check_same_stats(f.w[1], hf.w.columnwise, "stats w columnwise");
        check_same_stats(f.x_hadamard[1], hf.x_hadamard.columnwise, "stats x_hadamard columnwise");
        check_same_stats(b.dy[0], hb.dy.rowwise, "stats dy rowwise");
        check_same_stats(b.dy[1], hb.dy.columnwise, "stats dy columnwise");
        check_same_stats(b.dy_hadamard[1], hb.dy_hadamard.columnwise, "stats dy_hadamard columnwise");
        CHECK(f.x_amax == hf.x.amax);
        CHECK(f.w_amax == hf.w.amax);
        CHECK(b.dy_amax == hb.dy.amax);
        if (LR::scaling == linear_scaling::delayed) {
            const delayed_scaling* hd[3] = {&host.delayed_x(), &host.delayed_w(), &host.delayed_g()};
            for (int k = 0; k < 3; ++k) {
                INFO("operand " << k);
                delayed_scaling_state ds;
                std::vector<float> dh(3);
                OCTET_CUDA_CHECK(cudaMemcpy(&ds, dev.delayed_state(k), sizeof ds, cudaMemcpyDeviceToHost));
                OCTET_CUDA_CHECK(
                    cudaMemcpy(dh.data(), dev.delayed_history(k), 3 * sizeof(float), cudaMemcpyDeviceToHost));
                CHECK(same_bits(dh, hd[k]->history()));
                CHECK(std::memcmp(&ds.scale_amax, &hd[k]->state().scale_amax, sizeof(float)) == 0);
                CHECK(ds.recorded == hd[k]->state().recorded);
            }
        }
        const auto close = [](const std::vector<float>& d, const std::vector<float>& h, const char* what) {
            INFO(what);
            double num = 0.0, den = 0.0;
            for (std::size_t i = 0; i < h.size(); ++i) {
                if (!std::isfinite(h[i])) {
                    CHECK(std::isnan(h[i]) == std::isnan(d[i]));  // edge cases carry NaN and Inf through
                    continue;
                }
                num += (static_cast<double>(d[i]) - h[i]) * (static_cast<double>(d[i]) - h[i]);
                den += static_cast<double>(h[i]) * h[i];
            }
            CHECK(std::sqrt(num) <= 1e-5 * std::sqrt(den) + 1e-30);
        };
        close(y.download(), hy, "Y");
        close(dxo.download(), hdx, "dX");
        close(dwo.download(), hdw, "dW");
    }
}

TEST_SUITE("cuda") {
    TEST_CASE("the stream form checks the entry's arguments before touching a device") {
        using LR = octet::linear_recipes::blockwise;
        std::vector<float> x(4 * 64), w(8 * 64), y(4 * 8);
        octet::device_linear_step_options o;
        octet::linear_forward_buffers<LR> none;
        CHECK_THROWS_WITH_AS(
            octet::linear_forward<LR>(octet::on_stream(), octet::matrix_ref<const float>(x.data(), 4, 64),
                                      octet::matrix_ref<const float>(w.data(), 8, 64), {},
                                      octet::matrix_ref<float>(y.data(), 4, 8), none, o, nullptr),
            doctest::Contains("buffers.x/buffers.w"), octet::error);
        CHECK_THROWS_WITH_AS(
            octet::linear_forward<LR>(octet::on_stream(), octet::matrix_ref<const float>(x.data(), 4, 64),
                                      octet::matrix_ref<const float>(w.data(), 8, 32), {},
                                      octet::matrix_ref<float>(y.data(), 4, 8), none, o, nullptr),
            doctest::Contains("argument 'w'"), octet::error);
        octet::linear_backward_buffers<LR> bnone;
        CHECK_THROWS_WITH_AS(
            octet::linear_backward<LR>(octet::on_stream(), octet::matrix_ref<const float>(y.data(), 4, 8),
                                       octet::matrix_ref<float>(x.data(), 4, 64), {}, {}, bnone, o, nullptr),
            doctest::Contains("buffers.w_t"), octet::error);
    }
    TEST_CASE("the stream context checks its configuration before allocating") {
        using LR = octet::linear_recipes::tensorwise_delayed;
        octet::linear_config c;
        c.max_tokens = 4;
        c.out_features = 8;
        CHECK_THROWS_WITH_AS(octet::cuda::linear_context<LR>(octet::on_stream(), c),
                             doctest::Contains("config.in_features"), octet::error);
        c.in_features = 16;
        c.delayed.history_length = 0;
        CHECK_THROWS_AS(octet::cuda::linear_context<LR>(octet::on_stream(), c), octet::error);
    }
}

TEST_SUITE("gpu") {
    TEST_CASE("tensorwise: the stream layer equals the host layer") {
        check_shapes<octet::linear_recipes::tensorwise>(1);
    }
    TEST_CASE("tensorwise_delayed: given amaxes on the device") {
        check_shapes<octet::linear_recipes::tensorwise_delayed>(11);
    }
    TEST_CASE("blockwise (1x128 / 128x128)") {
        check_shapes<octet::linear_recipes::blockwise>(21);
    }
    TEST_CASE("mxfp8") {
        check_shapes<octet::linear_recipes::mxfp8>(31);
    }
    TEST_CASE("MXFP8 with stochastic dY and the Hadamard-rotated weight-gradient inputs") {
        check_shapes<mxfp8_rotated>(41);
    }
    TEST_CASE("the stream context's steps equal the host context's: delayed scaling, stochastic dY, rotation") {
        check_context_steps<octet::linear_recipes::tensorwise_delayed>(51);
        check_context_steps<octet::linear_recipes::blockwise>(52);
        check_context_steps<mxfp8_rotated>(53);
    }
}

}  // namespace linear_device_test
