// octet-test: timeout=600
//
// The CUDA quantizer against the host quantizer (which tests/host/quant_recipes.cpp checks against
// the float64 reference): bit-identical codes, stored scales, padding and tensor scales, exact
// counts and amax, energies to rounding; for every named recipe and custom ones that take the
// global (grid) path; float, bf16 and fp16 inputs; row- and column-major inputs; both copies from
// one read; stochastic rounding; delayed scaling with device state; dequantize. Outputs are
// poisoned before each run, so an unwritten byte cannot pass. In interpret mode (the test
// interpret.quant_device) the kernels run under the CPU interpreter on smaller matrices, and a
// copy of the tile pattern with planted bugs checks that the interpreter reports them.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "octet/cuda/buffer.cuh"
#include "octet/quant/delayed.cuh"
#include "octet/quant/quantize.cuh"
#include "support/random.hpp"
#include "support/storage.hpp"

namespace quant_device_test {
using namespace octet;

/// A quantized copy in device memory.
template <class Recipe>
struct device_copy {
    quant_layout layout;
    cuda::device_buffer<std::uint8_t> data, scales;
    cuda::device_buffer<float> tensor_scale;
    device_copy(std::size_t rows, std::size_t cols, bool pad = true)
        : layout(quant_layout_of<Recipe>::make(rows, cols, pad)),
          data(layout.data_bytes),
          scales(layout.scale_bytes),
          tensor_scale(1) {
        data.fill_bytes(0xCD);
        scales.fill_bytes(0xCD);
        tensor_scale.fill_bytes(0xCD);
    }
    quantized_ref<Recipe> ref() {
        return quantized_ref<Recipe>(data.data(), scales.data(), layout, tensor_scale.data());
    }
};

template <class Recipe>
void compare(device_copy<Recipe>& d, quantized_tensor<Recipe>& h, const quant_stats& ds, const quant_stats& hs,
             const char* what) {
    INFO(what << " " << h.layout().rows << "x" << h.layout().cols);
    const auto data = d.data.download();
    const auto scales = d.scales.download();
    std::size_t bad_data = 0, bad_scales = 0;
    for (std::size_t i = 0; i < data.size(); ++i) bad_data += data[i] != h.data()[i];
    for (std::size_t i = 0; i < scales.size(); ++i) bad_scales += scales[i] != h.scales()[i];
    CHECK(bad_data == 0);
    CHECK(bad_scales == 0);
    if (Recipe::two_level) {
        const float ts = d.tensor_scale.download()[0];
        if (h.layout().rows * h.layout().cols == 0) {
            std::uint32_t bits = 0;  // an empty x writes nothing, on the host or the device: the poison stays
            std::memcpy(&bits, &ts, 4);
            CHECK(bits == 0xCDCDCDCDu);
        } else {
            CHECK(ts == h.tensor_scale());
        }
    }
    CHECK(ds.elements == hs.elements);
    CHECK(ds.saturated == hs.saturated);
    CHECK(ds.flushed_to_zero == hs.flushed_to_zero);
    CHECK(ds.non_finite == hs.non_finite);
    CHECK(ds.lost_to_nan == hs.lost_to_nan);
    CHECK(ds.amax == hs.amax);
    CHECK(ds.signal_energy == doctest::Approx(hs.signal_energy).epsilon(1e-9));
    CHECK(ds.noise_energy == doctest::Approx(hs.noise_energy).epsilon(1e-6));
}

template <class Recipe, class In = float>
void check_device(std::size_t rows, std::size_t cols, std::uint64_t salt, bool col_major = false, float scale = 10.0f,
                  bool pad = true) {
    auto g = octet_test::rng(salt);
    const auto x = octet_test::to_storage<In>(octet_test::with_edge_cases(g, rows * cols, scale, true));
    // col_major: the same logical matrix stored transposed
    std::vector<In> stored = x;
    if (col_major)
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t j = 0; j < cols; ++j) stored[j * rows + i] = x[i * cols + j];
    const matrix_ref<const In> hx =
        col_major ? matrix_ref<const In>(stored.data(), rows, cols, rows, storage_order::col_major)
                  : matrix_ref<const In>(stored.data(), rows, cols);
    quantized_tensor<Recipe> h(rows, cols, pad), ht(cols, rows, pad);
    quantize_options hopt;
    hopt.collect_stats = true;
    hopt.rng = philox_stream{octet_test::run_seed(), salt};
    const auto hr = quantize<Recipe>(on_host(), hx, h.ref(), ht.ref(), hopt);

    cuda::device_buffer<In> dx(stored);
    const matrix_ref<const In> dxm = col_major
                                         ? matrix_ref<const In>(dx.data(), rows, cols, rows, storage_order::col_major)
                                         : matrix_ref<const In>(dx.data(), rows, cols);
    device_copy<Recipe> d(rows, cols, pad), dt(cols, rows, pad);
    cuda::device_buffer<quant_stats> stats(2);
    device_quantize_options dopt;
    dopt.device_stats = stats.data();
    dopt.rng = hopt.rng;
    quantize<Recipe>(on_stream(), dxm, d.ref(), dt.ref(), dopt);
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    const auto s = stats.download();
    compare(d, h, s[0], hr.rowwise, "rowwise");
    compare(dt, ht, s[1], hr.columnwise, "columnwise");

    // dequantize on the device equals the host's
    std::vector<float> hy(rows * cols);
    dequantize(on_host(), h.cref(), matrix_ref<float>(hy.data(), rows, cols));
    cuda::device_buffer<float> dy(rows * cols);
    dy.fill_bytes(0xFF);
    dequantize(on_stream(), d.ref(), matrix_ref<float>(dy.data(), rows, cols));
    const auto y = dy.download();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < y.size(); ++i) bad += std::memcmp(&y[i], &hy[i], 4) != 0;
    CHECK(bad == 0);
}

struct shape {
    std::size_t rows, cols;
};
// Under the interpreter (the `interpret` tests) the largest shapes shrink, still several 128 x 128
// tiles each way and ragged: 300 x 260 for 300 x 700, 300 x 520 for the large 2048 x 3072.
#if defined(OCTET_INTERPRET)
const shape kShapes[] = {{1, 300}, {300, 1}, {129, 257}, {257, 33}, {128, 128}, {3, 5}, {0, 7}, {300, 260}};
constexpr shape kLarge = {300, 520};
#else
const shape kShapes[] = {{1, 300}, {300, 1}, {129, 257}, {257, 33}, {128, 128}, {3, 5}, {0, 7}, {300, 700}};
constexpr shape kLarge = {2048, 3072};
#endif

template <class Recipe>
void check_all_shapes(std::uint64_t salt) {
    for (const auto& s : kShapes) check_device<Recipe>(s.rows, s.cols, salt++);
}

/// The largest number of different 4-byte words one bank serves when the 32 lanes of a warp read
/// copy row cr at step k (as quantize_tile_copy does): 1 is conflict-free.
template <int Copy, class In, class Order>
int worst_bank_degree(Order order) {
    int worst = 0;
    for (int cr = 0; cr < octet::detail::kQuantTile; ++cr)
        for (int k = 0; k < 4; ++k) {
            std::vector<std::vector<int>> words(32);
            for (int lane = 0; lane < 32; ++lane) {
                const int index = octet::detail::tile_index<Copy, In>(cr, 4 * lane + order(lane, k));
                const int word = index * static_cast<int>(sizeof(In)) / 4;
                auto& w = words[static_cast<std::size_t>(word % 32)];
                if (std::find(w.begin(), w.end(), word) == w.end()) w.push_back(word);
            }
            for (const auto& w : words) worst = std::max(worst, static_cast<int>(w.size()));
        }
    return worst;
}

}  // namespace quant_device_test

TEST_SUITE("cuda") {
    TEST_CASE("the tile reads of both copies are free of shared-memory bank conflicts (float and bf16 inputs)") {
        using namespace quant_device_test;
        auto rotated = [](int lane, int k) { return octet::detail::tile_read_order(lane, k); };
        auto in_order = [](int, int k) { return k; };
        CHECK(worst_bank_degree<0, float>(rotated) == 1);
        CHECK(worst_bank_degree<1, float>(rotated) == 1);
        CHECK(worst_bank_degree<0, octet::bf16>(rotated) == 1);
        CHECK(worst_bank_degree<1, octet::bf16>(rotated) == 1);
        // the reading order it replaced: 4-way conflicts for float inputs in both copies
        CHECK(worst_bank_degree<0, float>(in_order) == 4);
        CHECK(worst_bank_degree<1, float>(in_order) == 4);
        CHECK(worst_bank_degree<1, octet::bf16>(in_order) == 4);
        // every lane still reads each of its four elements once
        for (int lane = 0; lane < 32; ++lane) {
            int seen = 0;
            for (int k = 0; k < 4; ++k) seen |= 1 << octet::detail::tile_read_order(lane, k);
            CHECK(seen == 15);
        }
    }

    TEST_CASE("stream quantize rejects bad arguments before touching the device") {
        using namespace octet;
        using R = recipes::blockwise_1x128;
        std::vector<float> x(4 * 256);
        quantized_tensor<R> wrong(4, 255);
        CHECK_THROWS_WITH_AS(quantize<R>(on_stream(), matrix_ref<const float>(x.data(), 4, 256), wrong.ref()),
                             doctest::Contains("argument 'rowwise'"), octet::error);
        CHECK_THROWS_WITH_AS(quantize<R>(on_stream(), matrix_ref<const float>(x.data(), 4, 256, 3), wrong.ref()),
                             doctest::Contains("argument 'x'"), octet::error);
        // a half-given output is an error naming it, not a skipped copy (checked before any device call)
        quantized_tensor<R> ok(4, 256), okt(256, 4);
        auto no_data = ok.ref();
        no_data.data = nullptr;
        CHECK_THROWS_WITH_AS(quantize<R>(on_stream(), matrix_ref<const float>(x.data(), 4, 256), no_data, okt.ref()),
                             doctest::Contains("argument 'rowwise' has a null data pointer"), octet::error);
        CHECK_THROWS_WITH_AS(quantize<R>(on_stream(), matrix_ref<const float>(x.data(), 4, 256), quantized_ref<R>{}),
                             doctest::Contains("are both absent"), octet::error);
    }

    TEST_CASE("one entry per operation: host and stream refuse the same bad arguments in the same words") {
        using namespace octet;
        using R = recipes::blockwise_1x128;
        std::vector<float> x(4 * 256), y(4 * 256);
        quantized_tensor<R> wrong(4, 255), ok(4, 256), okt(256, 4);
        auto no_data = ok.ref();
        no_data.data = nullptr;
        auto no_scales = ok.ref();
        no_scales.scales = nullptr;
        const matrix_ref<const float> xr(x.data(), 4, 256), short_ld(x.data(), 4, 256, 3);
        const matrix_ref<float> yr(y.data(), 4, 256), y_bad(y.data(), 256, 4);
        const auto message_of = [](auto&& call) -> std::string {
            try {
                call();
            } catch (const octet::error& e) {
                return e.what();
            }
            return "(no error)";
        };
        int cases = 0;
        const auto both = [&](auto&& call) {  // call(executor): the same call on each executor
            ++cases;
            CAPTURE(cases);
            const std::string host = message_of([&] { call(on_host(1)); });
            const std::string stream = message_of([&] { call(on_stream()); });
            CHECK(host == stream);
            CHECK(host.find("argument '") != std::string::npos);
        };
        both([&](auto ex) { quantize<R>(ex, xr, wrong.ref()); });
        both([&](auto ex) { quantize<R>(ex, short_ld, ok.ref()); });
        both([&](auto ex) { quantize<R>(ex, xr, no_data, okt.ref()); });
        both([&](auto ex) { quantize<R>(ex, xr, quantized_ref<R>{}); });
        both([&](auto ex) { quantize<R>(ex, xr, ok.ref(), wrong.ref()); });
        both([&](auto ex) { dequantize(ex, wrong.cref(), yr); });
        both([&](auto ex) { dequantize(ex, ok.cref(), y_bad); });
        both([&](auto ex) { dequantize(ex, no_scales, yr); });
        CHECK(cases == 8);
    }
}

TEST_SUITE("gpu") {
    TEST_CASE("named recipes: device equals host, both copies from one read") {
        using namespace quant_device_test;
        namespace r = octet::recipes;
        check_all_shapes<r::tensorwise_e4m3>(100);
        check_all_shapes<r::rowwise_e4m3>(200);
        check_all_shapes<r::columnwise_e4m3>(300);
        check_all_shapes<r::blockwise_1x128>(400);
        check_all_shapes<r::blockwise_128x128>(500);
        check_all_shapes<r::mxfp8_e4m3>(600);
        check_all_shapes<r::mxfp8_e5m2>(700);
        check_all_shapes<r::mxfp6_e2m3>(800);
        check_all_shapes<r::mxfp4>(900);
        check_all_shapes<r::nvfp4>(1000);
    }

    TEST_CASE(
        "non-finite policies: device equals host under propagate (the named recipes above: NaN scales, zero codes, "
        "lost_to_nan) and per_element (each element alone) on the tile and grid paths") {
        using namespace quant_device_test;
        using namespace octet;
        namespace r = octet::recipes;
        using per_element = nan_policy::per_element;
        check_all_shapes<with_nan_policy<r::mxfp8_e4m3, per_element>>(1100);
        check_all_shapes<with_nan_policy<r::mxfp6_e3m2, per_element>>(1200);
        check_all_shapes<with_nan_policy<r::mxfp4, per_element>>(1300);
        check_all_shapes<with_nan_policy<r::nvfp4, per_element>>(1400);
        check_all_shapes<with_nan_policy<r::tensorwise_e4m3, per_element>>(1450);
        check_all_shapes<recipe<e4m3, block<96, 96>, scale::amax_ratio<0>>>(1500);
        check_all_shapes<recipe<e4m3, per_tensor, scale::amax_ratio<0>>>(1600);
        check_all_shapes<recipe<e2m1, block<16, 16>, scale::pow2_ceil, scale_storage::ue8m0>>(1700);
        check_device<r::mxfp4, octet::bf16>(129, 300, 1800, true);
        check_device<with_nan_policy<r::mxfp4, per_element>, octet::bf16>(129, 300, 1850, true);
    }

    TEST_CASE("custom recipes: odd blocks (grid path), stochastic, other rules") {
        using namespace quant_device_test;
        using namespace octet;
        check_all_shapes<recipe<e4m3, block<96, 96>, scale::amax_ratio<0>>>(2000);
        check_all_shapes<recipe<e5m2, block<16, 16>, scale::pow2_ceil, scale_storage::ue8m0>>(2100);
        check_all_shapes<recipe<e4m3, block<1, 128>, scale::amax_ratio<0>, scale_storage::f32, round::stochastic>>(
            2200);
        check_all_shapes<recipe<e3m2, block<1, 32>, scale::pow2_nearest, scale_storage::ue8m0, round::toward_zero>>(
            2300);
    }

    TEST_CASE("bf16/fp16 inputs, column-major inputs, a large matrix") {
        using namespace quant_device_test;
        namespace r = octet::recipes;
        check_device<r::blockwise_1x128, octet::bf16>(257, 1000, 3000);
        check_device<r::mxfp8_e4m3, octet::bf16>(100, 96, 3001);
        check_device<r::nvfp4, octet::bf16>(130, 160, 3002, false, 1.0f);
        check_device<r::blockwise_1x128, octet::fp16>(77, 300, 3003, false, 1.0f);
        check_device<r::blockwise_1x128, octet::bf16>(129, 300, 3004, true);
        check_device<r::rowwise_e4m3>(300, 129, 3005, true);
        check_device<r::blockwise_1x128, octet::bf16>(kLarge.rows, kLarge.cols, 3006);
        // unpadded layouts: rows start at any byte, so the packed stores fall back to bytes
        check_device<r::mxfp8_e4m3>(37, 70, 3007, false, 10.0f, false);
        check_device<r::mxfp4>(37, 70, 3008, false, 10.0f, false);
        check_device<r::mxfp6_e3m2>(37, 68, 3009, false, 10.0f, false);
        check_device<r::nvfp4, octet::bf16>(19, 34, 3010, false, 1.0f, false);
    }

    TEST_CASE("delayed scaling with device state equals the host class") {
        using namespace octet;
        using R = recipes::tensorwise_e4m3;
        const std::size_t rows = 64, cols = 200;
        octet::delayed_scaling host({4, 1, amax_reduction::max});
        cuda::delayed_scaling dev({4, 1, amax_reduction::max});
        auto g = octet_test::rng(4000);
        for (int step = 0; step < 7; ++step) {
            const float scale = step == 3 ? 50.0f : 1.0f + static_cast<float>(step);
            const auto x = octet_test::with_edge_cases(g, rows * cols, scale);
            quantized_tensor<R> h(rows, cols);
            quantize_options o;
            o.tensor_amax = host.amax_for_scale();
            const auto hr = quantize<R>(on_host(), matrix_ref<const float>(x.data(), rows, cols), h.ref(), {}, o);
            host.record(hr.amax);
            host.update();

            cuda::device_buffer<float> dx(x);
            quant_device_test::device_copy<R> d(rows, cols);
            dev.quantize<R>(on_stream(), matrix_ref<const float>(dx.data(), rows, cols), d.ref());
            dev.update(on_stream());
            OCTET_CUDA_CHECK(cudaDeviceSynchronize());
            INFO("step " << step);
            CHECK(d.data.download() == h.data());
            CHECK(d.scales.download() == h.scales());
            const auto st = dev.state_synchronizing();
            CHECK(st.scale_amax == host.state().scale_amax);
            CHECK(st.position == host.state().position);
            CHECK(st.recorded == host.state().recorded);
            CHECK(dev.history_synchronizing() == host.history());
        }
        // a step without a quantize leaves the device state alone
        const auto before = dev.state_synchronizing();
        dev.update(on_stream());
        CHECK(dev.state_synchronizing().position == before.position);
        CHECK(dev.state_synchronizing().scale_amax == before.scale_amax);
    }

    TEST_CASE("stream quantize rejects host pointers") {
        using namespace octet;
        using R = recipes::blockwise_1x128;
        std::vector<float> x(4 * 256);
        quant_device_test::device_copy<R> d(4, 256);
        CHECK_THROWS_WITH_AS(quantize<R>(on_stream(), matrix_ref<const float>(x.data(), 4, 256), d.ref()),
                             doctest::Contains("host memory"), octet::error);
    }
}

#if defined(OCTET_INTERPRET)
namespace quant_device_test {

// A 32 x 32 copy of the quantizer's one-read tile (quantize_tile_kernel): warp 0 loads the tile into
// shared memory with an odd pitch (row r by lane r), warp 1 reads it transposed, as the column-wise
// copy does (column c by lane c), and writes each column's amax. Each planted bug is one the tile
// kernel could have: a missing barrier between the load and the transposed read, a loop bound one
// row past the tile.
enum class planted { none, missing_sync, off_by_one };
constexpr int kPlantedTile = 32;

template <planted Bug>
OCTET_KERNEL void planted_column_amax_kernel(const float* x, float* amax) {
    constexpr int T = kPlantedTile, pitch = T + 1;
    OCTET_SHARED(float[T * pitch], tile);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp == 0)
        for (int c = 0; c < T; ++c) tile[lane * pitch + c] = x[lane * T + c];
    if (Bug != planted::missing_sync) __syncthreads();
    if (warp == 1) {
        const int rows = Bug == planted::off_by_one ? T + 1 : T;
        float m = 0.0f;
        for (int r = 0; r < rows; ++r) m = fmaxf(m, fabsf(tile[r * pitch + lane]));
        amax[lane] = m;
    }
}

/// Runs the kernel on x (T x T, row-major) and returns the column amaxes; a report of the
/// interpreter is thrown (interpret::failure).
template <planted Bug>
std::vector<float> run_planted(const std::vector<float>& x) {
    cuda::device_buffer<float> dx(x), damax(kPlantedTile);
    damax.fill_bytes(0xFF);
    cuda::launch("planted_column_amax_kernel", planted_column_amax_kernel<Bug>, 1, 2 * 32, 0, nullptr, dx.data(),
                 damax.data());
    return damax.download();
}

}  // namespace quant_device_test

TEST_SUITE("interpret") {
    TEST_CASE("the interpreter reports a missing barrier or an off-by-one in a copy of the tile kernel") {
        using namespace quant_device_test;
        constexpr int T = kPlantedTile;
        auto g = octet_test::rng(5000);
        const auto x = octet_test::with_edge_cases(g, T * T, 10.0f);
        // without a bug: no report, and the amaxes are right
        const auto amax = run_planted<planted::none>(x);
        std::size_t bad = 0;
        for (int c = 0; c < T; ++c) {
            float m = 0.0f;
            for (int r = 0; r < T; ++r) m = std::fmax(m, std::fabs(x[r * T + c]));
            bad += amax[c] != m;
        }
        CHECK(bad == 0);
        // warp 1 reads what warp 0 wrote with nothing ordering the two
        CHECK_THROWS_WITH_AS(run_planted<planted::missing_sync>(x),
                             doctest::Contains("interpret: race in kernel planted_column_amax_kernel"),
                             octet::interpret::failure);
        // row 32 of a 32-row tile: past the shared variable
        CHECK_THROWS_WITH_AS(run_planted<planted::off_by_one>(x),
                             doctest::Contains("interpret: out-of-bounds access in kernel planted_column_amax_kernel"),
                             octet::interpret::failure);
    }
}
#endif

// Real training data on the quantize kernels (tests/host/scaled_invariance.cpp has the host's, for
// every recipe): x times 2^k gives the same codes and dequantizes to 2^k times the values, bit for
// bit; zero tokens appended leave every code and scale of the real ones unchanged (the column-wise
// copy then gains zero columns: its stochastic rounding draws do not depend on the row length).
namespace quant_device_test {

template <class Recipe>
struct device_run {
    std::vector<std::uint8_t> row_data, row_scales, col_data, col_scales;
    std::vector<float> row_values;
    quant_layout row_layout, col_layout;
};

template <class Recipe>
device_run<Recipe> quantize_on_device(const std::vector<float>& x, std::size_t rows, std::size_t cols) {
    cuda::device_buffer<float> dx(x);
    device_copy<Recipe> d(rows, cols), dt(cols, rows);
    device_quantize_options o;
    o.rng = philox_stream{17, 4};
    quantize<Recipe>(on_stream(), matrix_ref<const float>(dx.data(), rows, cols), d.ref(), dt.ref(), o);
    cuda::device_buffer<float> y(rows * cols);
    dequantize(on_stream(), d.ref(), matrix_ref<float>(y.data(), rows, cols));
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    return {d.data.download(), d.scales.download(), dt.data.download(), dt.scales.download(), y.download(), d.layout,
            dt.layout};
}

template <class Recipe>
void check_invariances(const char* name) {
    INFO("recipe " << name);
    auto g = octet_test::rng(4441);
    const std::size_t rows = 70, cols = 256;
    std::normal_distribution<float> nd(0.0f, 1e-3f);
    std::vector<float> x(rows * cols);
    for (auto& v : x) v = nd(g);
    std::fill(x.begin() + 3 * cols, x.begin() + 4 * cols, 0.0f);  // a zero token
    const auto r0 = quantize_on_device<Recipe>(x, rows, cols);
    for (const int k : {-40, -9, 17, 40}) {
        INFO("k = " << k);
        std::vector<float> xk = x;
        for (auto& v : xk) v = std::ldexp(v, k);
        const auto rk = quantize_on_device<Recipe>(xk, rows, cols);
        CHECK(rk.row_data == r0.row_data);
        CHECK(rk.col_data == r0.col_data);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < x.size(); ++i) bad += !(rk.row_values[i] == std::ldexp(r0.row_values[i], k));
        CHECK(bad == 0);
    }
    const std::size_t more = 58;
    std::vector<float> xp = x;
    xp.resize((rows + more) * cols, 0.0f);
    const auto rp = quantize_on_device<Recipe>(xp, rows + more, cols);
    // row-wise: the first rows' bytes and scale rows; column-wise: each row's first `rows` codes
    std::size_t bad = 0;
    for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t b = 0; b < r0.row_layout.row_bytes; ++b)
            bad += rp.row_data[r * rp.row_layout.row_bytes + b] != r0.row_data[r * r0.row_layout.row_bytes + b];
    // the scale grid is column-major (quant/tensor.hpp): block (bi, bj) at bj * scale_ld + bi
    const std::size_t sb = std::is_same_v<typename Recipe::scale_storage_type, scale_storage::f32> ? 4 : 1;
    const quant_layout &l0 = r0.row_layout, &lp = rp.row_layout;
    for (std::size_t bj = 0; bj < l0.scale_cols; ++bj)
        for (std::size_t bi = 0; bi < l0.scale_rows; ++bi)
            bad += std::memcmp(&rp.row_scales[(bj * lp.scale_ld + bi) * sb],
                               &r0.row_scales[(bj * l0.scale_ld + bi) * sb], sb) != 0;
    for (std::size_t r = 0; r < cols; ++r)
        for (std::size_t c = 0; c < rows; ++c) {
            const std::size_t bits = Recipe::format::bits;
            const auto code = [&](const device_run<Recipe>& run, std::size_t cr, std::size_t cc) {
                const std::size_t bit = cc * bits;
                return (run.col_data[cr * run.col_layout.row_bytes + bit / 8] >> (bit % 8)) & ((1u << bits) - 1u);
            };
            bad += code(rp, r, c) != code(r0, r, c);
        }
    CHECK(bad == 0);
}

}  // namespace quant_device_test

TEST_SUITE("gpu") {
    TEST_CASE(
        "quantize kernels: x times 2^k gives the same codes and 2^k times the values; zero tokens change nothing") {
        using namespace quant_device_test;
        namespace r = octet::recipes;
        using stochastic_nvfp4 = recipe<e2m1, block<1, 16>, scale::amax_ratio<0>, scale_storage::e4m3,
                                        round::stochastic, overflow::saturate>;
        check_invariances<r::blockwise_1x128>("blockwise_1x128");
        check_invariances<r::tensorwise_e4m3>("tensorwise_e4m3");
        check_invariances<r::mxfp8_e4m3>("mxfp8_e4m3");
        check_invariances<r::nvfp4>("nvfp4");
        check_invariances<stochastic_nvfp4>("nvfp4, stochastic rounding");
    }
}
