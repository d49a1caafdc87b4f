// octet-test: libs=cublasLt,cublas timeout=600
//
// The CUDA scaled GEMM backends (sm90_wgmma, sm89_mma, cublaslt) against the host backend, which
// tests/host/gemm_host.cpp checks against the float64 reference. Outputs are poisoned (all bits
// set: NaN in float, bf16 and fp16) before each run, so an element a kernel fails to write fails.
//   * exact inputs: values in {-1, 0, 1} with a 7 at the start of every scale block make every
//     scale a power of two and every partial sum a small integer multiple of a power of two, so
//     any correct accumulator (13-bit tensor cores included) is exact: the GPU must equal the host
//     bit for bit. This pins down layouts, scale indexing, pipelines and epilogue placement.
//   * random inputs: |GPU - host| <= bound(GPU backend) + bound(host backend), the documented
//     bounds of scaled_gemm.hpp (the tensor-core term is a stated model; the test reports the
//     largest observed fraction of it).
//   * octet's kernels against cuBLASLt where both serve the pair, with the same reasoning.
// Suite "cuda" (no GPU needed): argument errors, backend messages. Suite "gpu": the rest.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "octet/cuda/buffer.cuh"
#include "octet/gemm/cublaslt.cuh"
#include "octet/reference/gemm.hpp"
#include "support/random.hpp"

namespace gemm_device_test {
using namespace octet;

using e5m2_1x128 = recipe<e5m2, block<1, 128>, scale::amax_ratio<0>>;

// Under the interpreter (the `interpret` tests) the shapes are smaller (one 128 x 128 tile of the
// sm89 kernel costs about 30 ms of CPU per 64-wide k-step there): every recipe pair, promotion
// interval, ragged M/N/K, M = 1 and pipeline wrap-around is still there, on few tiles, with the same
// comparisons.
#if defined(OCTET_INTERPRET)
constexpr bool kInterpreted = true;
#else
constexpr bool kInterpreted = false;
#endif

/// The executor of the GPU tests: the default stream with a cuBLASLt lent, so that the cublaslt
/// backend can be requested and automatic selection may fall back to it. One per process, created
/// on first use (by a test that has a GPU), freed at exit. In interpret mode the plain stream:
/// cuBLASLt has no host model there.
stream_executor gpu() {
#if defined(OCTET_INTERPRET)
    return on_stream();
#else
    static cuda::cublaslt_context lt;
    return with_cublaslt(on_stream(), lt);
#endif
}

/// `device` on a GPU, `interpreted` under the interpreter.
template <class T>
T pick(T device, T interpreted) {
    return kInterpreted ? interpreted : device;
}

/// A quantized copy in device memory, uploaded from a host copy.
template <class R>
struct device_copy {
    quant_layout layout;
    cuda::device_buffer<std::uint8_t> data, scales;
    cuda::device_buffer<float> ts;
    explicit device_copy(const quantized_tensor<R>& h)
        : layout(h.layout()), data(h.layout().data_bytes), scales(h.layout().scale_bytes), ts(1) {
        auto& hh = const_cast<quantized_tensor<R>&>(h);
        if (layout.data_bytes) data.upload(hh.data());
        if (layout.scale_bytes) scales.upload(hh.scales());
        ts.upload(std::vector<float>{h.tensor_scale()});
    }
    quantized_cref<R> cref() const { return quantized_cref<R>(data.data(), scales.data(), layout, ts.data()); }
};

template <class R>
quantized_tensor<R> quantized(const std::vector<float>& x, std::size_t rows, std::size_t cols, bool pad = true) {
    quantized_tensor<R> q(rows, cols, pad);
    quantize<R>(on_host(), matrix_ref<const float>(x.data(), rows, cols), q.ref());
    return q;
}

/// Values in {-1, 0, 1} with a 7 at the start of every `block`-wide run along K (and 7 in the
/// first row of every `row_block` rows, so 128x128 blocks also have amax 7).
std::vector<float> exact_values(std::mt19937_64& g, std::size_t rows, std::size_t K, std::size_t block) {
    std::uniform_int_distribution<int> d(-1, 1);
    std::vector<float> x(rows * K);
    for (auto& v : x) v = static_cast<float>(d(g));
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t k = 0; k < K; k += block) x[i * K + k] = 7.0f;
    return x;
}

template <class T>
float to_f(T v) {
    if constexpr (std::is_same_v<T, float>)
        return v;
    else
        return to_float(v);
}

/// Sums of magnitudes T = sum_k |a_ik| |b_jk| via the host backend on the operands' absolute values
/// (sign bits cleared; same scales). Its own relative error (about K * 2^-24) is far below the bounds.
template <class RA, class RB>
std::vector<float> abs_products(const quantized_tensor<RA>& a, const quantized_tensor<RB>& b) {
    static_assert(RA::format::bits == 8 && RB::format::bits == 8, "abs_products: FP8 operands");
    quantized_tensor<RA> aa = a;
    quantized_tensor<RB> bb = b;
    for (auto& c : aa.data()) c &= 0x7F;
    for (auto& c : bb.data()) c &= 0x7F;
    std::vector<float> t(a.layout().rows * b.layout().rows);
    scaled_gemm(on_host(), aa.cref(), bb.cref(), matrix_ref<float>(t.data(), a.layout().rows, b.layout().rows));
    return t;
}

struct tally {
    double worst = 0.0;  // largest |difference| / allowed
    void message(const std::string& what) const { MESSAGE(what << ": largest |GPU - host| / allowed = " << worst); }
};

/// Runs `backend` on device copies and compares with the host backend element by element.
/// exact: require bitwise equality; else |gpu - host| <= bound(backend) + bound(host).
template <class RA, class RB, class DT = float>
void compare_with_host(gemm_backend backend, const quantized_tensor<RA>& ha, const quantized_tensor<RB>& hb, bool exact,
                       tally& t, gemm_options opt = {}, bool with_c = false,
                       storage_order d_layout = storage_order::row_major) {
    const std::size_t M = ha.layout().rows, N = hb.layout().rows, K = ha.layout().cols;
    INFO(backend_name(backend) << ": A " << recipe_description<RA>() << ", B " << recipe_description<RB>()
                               << ", M=" << M << " N=" << N << " K=" << K << (exact ? " (exact inputs)" : "")
                               << ", seed " << octet_test::run_seed());
    auto g = octet_test::rng(M * 7919 + N * 31 + K);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<DT> c(M * N);
    std::vector<float> bias(N);
    for (auto& v : c) v = detail::store_from_float<DT>(exact ? std::round(nd(g)) : nd(g));
    for (auto& v : bias) v = exact ? std::round(nd(g)) : nd(g);
    if (with_c) {
        opt.beta = exact ? 2.0f : 0.75f;
        opt.bias = as_cspan(bias);
    }
    const bool d_row = d_layout == storage_order::row_major;
    const std::size_t ld = d_row ? N : M;

    // host result
    std::vector<DT> hd(M * N);
    gemm_options host_opt = opt;
    host_opt.backend = gemm_backend::host;
    const matrix_ref<DT> HD(hd.data(), M, N, ld, d_layout);
    if (with_c)
        scaled_gemm(on_host(), ha.cref(), hb.cref(), matrix_ref<const DT>(c.data(), M, N, ld, d_layout), HD, host_opt);
    else
        scaled_gemm(on_host(), ha.cref(), hb.cref(), HD, host_opt);

    // device result
    const device_copy<RA> da(ha);
    const device_copy<RB> db(hb);
    cuda::device_buffer<DT> dd(M * N), dc(c);
    cuda::device_buffer<float> dbias(bias);
    dd.fill_bytes(0xFF);
    gemm_options dev_opt = opt;
    dev_opt.backend = backend;
    if (with_c) dev_opt.bias = dbias.cview();
    const matrix_ref<DT> DD(dd.data(), M, N, ld, d_layout);
    gemm_result r;
    if (with_c)
        r = scaled_gemm(gpu(), da.cref(), db.cref(), matrix_ref<const DT>(dc.data(), M, N, ld, d_layout), DD, dev_opt);
    else
        r = scaled_gemm(gpu(), da.cref(), db.cref(), DD, dev_opt);
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(r.backend == backend);
    const std::vector<DT> got = dd.download();

    const std::vector<float> T = exact ? std::vector<float>() : abs_products(ha, hb);
    const gemm_numerics ng = gemm_numerics_of<RA, RB, DT>(backend, K, opt);
    const gemm_numerics nh = gemm_numerics_of<RA, RB, DT>(gemm_backend::host, K, opt);
    int bad = 0;
    for (std::size_t i = 0; i < M; ++i)
        for (std::size_t j = 0; j < N; ++j) {
            const std::size_t o = d_row ? i * N + j : j * M + i;
            const float gv = to_f(got[o]), hv = to_f(hd[o]);
            if (exact) {
                if (std::memcmp(&got[o], &hd[o], sizeof(DT)) != 0 && bad++ < 5)
                    FAIL_CHECK("D(" << i << "," << j << "): GPU " << gv << " host " << hv
                                    << " (must be equal: exact inputs)");
                continue;
            }
            const double bc = with_c ? std::fabs(static_cast<double>(opt.beta) * to_f(c[o])) : 0.0;
            const double bb = with_c ? std::fabs(static_cast<double>(bias[j])) : 0.0;
            // cuBLASLt rounds the bias to bf16/fp16 first: allow that rounding too.
            const double bias_round = backend == gemm_backend::cublaslt && with_c ? bb * std::ldexp(1.0, -8) : 0.0;
            const double allowed = gemm_error_bound(ng, opt.alpha, T[i * N + j], bc, bb, std::fabs(hv)) +
                                   gemm_error_bound(nh, opt.alpha, T[i * N + j], bc, bb, std::fabs(hv)) + bias_round;
            const double diff = std::fabs(static_cast<double>(gv) - hv);
            if (!(diff <= allowed) && bad++ < 5)
                FAIL_CHECK("D(" << i << "," << j << "): GPU " << gv << " host " << hv << " |diff| " << diff
                                << " > allowed " << allowed);
            if (allowed > 0) t.worst = std::max(t.worst, diff / allowed);
        }
    CHECK(bad == 0);
}

struct shape {
    std::size_t M, N, K;
};

/// Exact-input and random-input comparisons of one backend for one recipe pair over several shapes.
template <class RA, class RB>
void backend_pair(gemm_backend backend, const char* name, const std::vector<shape>& shapes, std::size_t a_block,
                  std::size_t b_block, gemm_options opt = {}) {
    tally t;
    std::uint64_t salt = 1000;
    for (const shape& s : shapes) {
        auto g = octet_test::rng(salt++);
        {
            const auto ha = quantized<RA>(exact_values(g, s.M, s.K, a_block), s.M, s.K);
            const auto hb = quantized<RB>(exact_values(g, s.N, s.K, b_block), s.N, s.K);
            compare_with_host(backend, ha, hb, true, t, opt);
        }
        const auto ha = quantized<RA>(octet_test::with_edge_cases(g, s.M * s.K, 2.0f), s.M, s.K);
        const auto hb = quantized<RB>(octet_test::with_edge_cases(g, s.N * s.K, 0.5f), s.N, s.K);
        compare_with_host(backend, ha, hb, false, t, opt);
    }
    t.message(std::string(backend_name(backend)) + " " + name);
}

bool has_arch(int arch) {
    return cuda::compute_capability() >= arch;
}

// Ragged shapes, M = 1 and decode-like M, K not a multiple of 128, several K blocks (pipeline
// wrap-around), more tiles than SMs (persistent loop), and one larger square.
const std::vector<shape> kShapes =
    pick<std::vector<shape>>({{1, 256, 512},
                              {64, 7168 / 8, 1024},
                              {129, 257, 640},
                              {37, 300, 1000},
                              {1000, 1000, 1152},
                              {2048, 2048, 512},
                              {256, 128, 2048}},
                             {{1, 136, 264}, {64, 136, 320}, {129, 257, 256}, {37, 140, 392}, {130, 129, 1024}});

TEST_SUITE("gpu") {
    // options.cluster is automatic unless set: pairs of CTAs multicasting B wherever D has two tile rows
    // or more (the plan's ties go to pairs), so most cases below run in pairs; those with cluster 1 run
    // single CTAs.
    TEST_CASE("sm90_wgmma against the host: every pair it serves, every tile, single CTAs and pairs") {
        if (cuda::compute_capability() != 90 || !detail::sm90a_available()) {
            MESSAGE("skipped: needs an sm_90 GPU and sm_90a code");
            return;
        }
        const std::vector<shape> kTwoShapes90 =
            pick<std::vector<shape>>({{100, 200, 300}, {513, 257, 1024}}, {{100, 200, 300}, {129, 136, 512}});
        backend_pair<recipes::blockwise_1x128, recipes::blockwise_128x128>(gemm_backend::sm90_wgmma, "1x128 x 128x128",
                                                                           kShapes, 128, 128);
        gemm_options small;
        small.tile = gemm_tile::m64n64;
        backend_pair<recipes::blockwise_1x128, recipes::blockwise_128x128>(
            gemm_backend::sm90_wgmma, "1x128 x 128x128 (64x64 tile)", kShapes, 128, 128, small);
        // the 128 x 192 tile: B's 128x128 scales of two blocks per tile (N = 257: the second tile's split at
        // its column 64, its one column of a third block)
        gemm_options wide;
        wide.tile = gemm_tile::m128n192;
        backend_pair<recipes::blockwise_1x128, recipes::blockwise_128x128>(
            gemm_backend::sm90_wgmma, "1x128 x 128x128 (128x192 tile)", kShapes, 128, 128, wide);
        backend_pair<recipes::tensorwise_e4m3, recipes::tensorwise_e4m3>(
            gemm_backend::sm90_wgmma, "tensor x tensor (128x192 tile)", {{100, 200, 300}}, 128, 128, wide);
        gemm_options wide_single = wide, single;
        wide_single.cluster = single.cluster = 1;
        backend_pair<recipes::blockwise_1x128, recipes::blockwise_128x128>(
            gemm_backend::sm90_wgmma, "1x128 x 128x128 (128x192 tile, single CTAs)", {{300, 257, 640}}, 128, 128,
            wide_single);
        backend_pair<recipes::blockwise_1x128, recipes::blockwise_128x128>(
            gemm_backend::sm90_wgmma, "1x128 x 128x128 (single CTAs)", {{129, 257, 640}, {37, 300, 1000}}, 128, 128,
            single);
        // pairs asked for where D has one tile row: the second CTA of each pair computes a tile below M
        gemm_options pairs;
        pairs.cluster = 2;
        backend_pair<recipes::blockwise_1x128, recipes::blockwise_128x128>(
            gemm_backend::sm90_wgmma, "1x128 x 128x128 (pairs, one tile row)", {{1, 256, 512}, {100, 200, 300}}, 128,
            128, pairs);
        gemm_options large;
        large.tile = gemm_tile::m128n128;
        large.cluster = 1;
        backend_pair<recipes::blockwise_1x128, recipes::blockwise_1x128>(
            gemm_backend::sm90_wgmma, "1x128 x 1x128 (weight gradient)",
            pick<std::vector<shape>>({{130, 250, 384}, {1, 64, 256}, {512, 512, 1024}},
                                     {{130, 250, 384}, {1, 64, 256}}),
            128, 128, large);
        backend_pair<recipes::blockwise_1x128, recipes::blockwise_1x128>(
            gemm_backend::sm90_wgmma, "1x128 x 1x128 (64x64 tile)", {{130, 250, 384}, {1, 64, 256}}, 128, 128, small);
        backend_pair<recipes::tensorwise_e4m3, recipes::tensorwise_e4m3>(gemm_backend::sm90_wgmma, "tensor x tensor",
                                                                         kTwoShapes90, 128, 128);
        backend_pair<recipes::rowwise_e4m3, recipes::rowwise_e4m3>(gemm_backend::sm90_wgmma, "row x row", kTwoShapes90,
                                                                   128, 128);
        backend_pair<e5m2_1x128, recipes::blockwise_128x128>(
            gemm_backend::sm90_wgmma, "E5M2 1x128 x E4M3 128x128 (data gradient)",
            pick<std::vector<shape>>({{77, 190, 640}, {300, 300, 256}}, {{77, 190, 640}, {136, 130, 256}}), 128, 128);
        backend_pair<e5m2_1x128, recipes::blockwise_128x128>(
            gemm_backend::sm90_wgmma, "E5M2 1x128 x E4M3 128x128 (128x192 tile)", {{77, 450, 384}}, 128, 128, wide);
        backend_pair<recipes::tensorwise_e4m3, recipes::tensorwise_e5m2>(gemm_backend::sm90_wgmma, "E4M3 x E5M2 tensor",
                                                                         {{64, 64, 128}}, 128, 128);
    }

    TEST_CASE("sm89_mma against the host: every pair it serves, promotion intervals") {
        if (!has_arch(89) || !detail::sm89_available()) {
            MESSAGE("skipped: needs an sm_89+ GPU");
            return;
        }
        backend_pair<recipes::blockwise_1x128, recipes::blockwise_128x128>(gemm_backend::sm89_mma, "1x128 x 128x128",
                                                                           kShapes, 128, 128);
        backend_pair<recipes::mxfp8_e4m3, recipes::mxfp8_e4m3>(
            gemm_backend::sm89_mma, "MXFP8 x MXFP8",
            pick<std::vector<shape>>({{1, 96, 320}, {129, 257, 640}}, {{1, 96, 320}, {129, 257, 160}}), 32, 32);
        backend_pair<recipes::mxfp8_e4m3, recipes::mxfp8_e5m2>(gemm_backend::sm89_mma, "MXFP8 E4M3 x E5M2",
                                                               {{70, 33, 160}}, 32, 32);
        backend_pair<recipes::blockwise_1x128, recipes::blockwise_1x128>(gemm_backend::sm89_mma, "1x128 x 1x128",
                                                                         {{130, 250, 384}}, 128, 128);
        backend_pair<recipes::tensorwise_e4m3, recipes::tensorwise_e5m2>(gemm_backend::sm89_mma, "E4M3 x E5M2 tensor",
                                                                         {{100, 200, 300}}, 128, 128);
        backend_pair<recipes::rowwise_e4m3, recipes::rowwise_e4m3>(
            gemm_backend::sm89_mma, "row x row",
            pick<std::vector<shape>>({{3, 5, 7}, {513, 257, 1024}}, {{3, 5, 7}, {129, 136, 264}}), 128, 128);
        for (int P : {32, 64, 256}) {
            gemm_options opt;
            opt.promotion_interval = P;
            backend_pair<recipes::tensorwise_e4m3, recipes::tensorwise_e4m3>(
                gemm_backend::sm89_mma, "tensor x tensor, promotion interval",
                {pick<shape>({65, 70, 1000}, {65, 70, 392})}, 128, 128, opt);
        }
    }

    // cuBLASLt is a closed library with no host model: nothing to run under the interpreter.
    TEST_CASE("cublaslt against the host, and octet's kernels against cublaslt" * doctest::skip(kInterpreted)) {
        if (!has_arch(89)) {
            MESSAGE("skipped: needs an sm_89+ GPU");
            return;
        }
        tally t;
        auto g = octet_test::rng(77);
        const std::size_t M = 256, N = 384, K = 512;
        const auto ha = quantized<recipes::tensorwise_e4m3>(octet_test::with_edge_cases(g, M * K), M, K);
        const auto hb = quantized<recipes::tensorwise_e4m3>(octet_test::with_edge_cases(g, N * K), N, K);
        compare_with_host(gemm_backend::cublaslt, ha, hb, false, t);
        if (cuda::compute_capability() == 90) {
            // Hopper modes; cuBLASLt's shape rules for them are not documented: an aligned shape must
            // work, a ragged one may be refused (reported, not failed).
            backend_pair<recipes::blockwise_1x128, recipes::blockwise_128x128>(
                gemm_backend::cublaslt, "1x128 x 128x128", {{256, 384, 1024}}, 128, 128);
            backend_pair<recipes::blockwise_1x128, recipes::blockwise_1x128>(gemm_backend::cublaslt, "1x128 x 1x128",
                                                                             {{256, 384, 1024}}, 128, 128);
            backend_pair<recipes::rowwise_e4m3, recipes::rowwise_e4m3>(gemm_backend::cublaslt, "row x row",
                                                                       {{256, 384, 1024}}, 128, 128);
            for (const shape& s : std::vector<shape>{{1, 256, 512}, {129, 264, 640}}) {
                const auto qa = quantized<recipes::blockwise_1x128>(exact_values(g, s.M, s.K, 128), s.M, s.K);
                const auto qb = quantized<recipes::blockwise_128x128>(exact_values(g, s.N, s.K, 128), s.N, s.K);
                try {
                    compare_with_host(gemm_backend::cublaslt, qa, qb, true, t);
                } catch (const octet::error& e) {
                    MESSAGE("cuBLASLt refused a ragged 1x128 x 128x128 shape M=" << s.M << " N=" << s.N << " K=" << s.K
                                                                                 << ": " << e.what());
                }
            }
        }
        t.message("cublaslt vs host");

        // octet's own kernels against cuBLASLt on the same operands (same scaling).
        if (cuda::compute_capability() == 90 && detail::sm90a_available()) {
            const auto qa = quantized<recipes::blockwise_1x128>(octet_test::with_edge_cases(g, 512 * 1024), 512, 1024);
            const auto qb =
                quantized<recipes::blockwise_128x128>(octet_test::with_edge_cases(g, 768 * 1024), 768, 1024);
            const device_copy<recipes::blockwise_1x128> da(qa);
            const device_copy<recipes::blockwise_128x128> db(qb);
            cuda::device_buffer<float> d1(512 * 768), d2(512 * 768);
            d1.fill_bytes(0xFF);
            d2.fill_bytes(0xFF);
            gemm_options o1, o2;
            o1.backend = gemm_backend::sm90_wgmma;
            o2.backend = gemm_backend::cublaslt;
            scaled_gemm(gpu(), da.cref(), db.cref(), matrix_ref<float>(d1.data(), 512, 768), o1);
            scaled_gemm(gpu(), da.cref(), db.cref(), matrix_ref<float>(d2.data(), 512, 768), o2);
            const auto x = d1.download(), y = d2.download();
            const auto T = abs_products(qa, qb);
            const gemm_numerics n1 =
                gemm_numerics_of<recipes::blockwise_1x128, recipes::blockwise_128x128>(gemm_backend::sm90_wgmma, 1024);
            const gemm_numerics n2 =
                gemm_numerics_of<recipes::blockwise_1x128, recipes::blockwise_128x128>(gemm_backend::cublaslt, 1024);
            int bad = 0;
            double worst = 0;
            for (std::size_t i = 0; i < x.size(); ++i) {
                const double allowed = gemm_error_bound(n1, 1.0, T[i], 0, 0, std::fabs(y[i])) +
                                       gemm_error_bound(n2, 1.0, T[i], 0, 0, std::fabs(y[i]));
                const double diff = std::fabs(static_cast<double>(x[i]) - y[i]);
                if (!(diff <= allowed) && bad++ < 5)
                    FAIL_CHECK("element " << i << ": sm90 " << x[i] << " cublaslt " << y[i]);
                worst = std::max(worst, diff / allowed);
            }
            MESSAGE(
                "sm90_wgmma vs cublaslt (1x128 x 128x128, 512x768x1024): largest |difference| / allowed = " << worst);
        }
    }

    // cuBLASLt is a closed library with no host model: nothing to run under the interpreter.
    TEST_CASE("NVFP4 x NVFP4 through cuBLASLt's dequantizing path against the host" * doctest::skip(kInterpreted)) {
        if (!has_arch(80)) {
            MESSAGE("skipped: needs an sm_80+ GPU");
            return;
        }
        auto g = octet_test::rng(88);
        const std::size_t M = 200, N = 136, K = 512;
        const auto ha = quantized<recipes::nvfp4>(octet_test::with_edge_cases(g, M * K), M, K);
        const auto hb = quantized<recipes::nvfp4>(octet_test::with_edge_cases(g, N * K), N, K);
        std::vector<float> host(M * N);
        scaled_gemm(on_host(), ha.cref(), hb.cref(), matrix_ref<float>(host.data(), M, N));
        const device_copy<recipes::nvfp4> da(ha);
        const device_copy<recipes::nvfp4> db(hb);
        cuda::device_buffer<float> d(M * N);
        d.fill_bytes(0xFF);
        const gemm_result r = scaled_gemm(gpu(), da.cref(), db.cref(), matrix_ref<float>(d.data(), M, N));
        CHECK(r.backend == gemm_backend::cublaslt);
        const auto got = d.download();
        const auto ref = reference::gemm(ha.cref(), hb.cref());
        const gemm_numerics ng = gemm_numerics_of<recipes::nvfp4, recipes::nvfp4>(gemm_backend::cublaslt, K);
        const gemm_numerics nh = gemm_numerics_of<recipes::nvfp4, recipes::nvfp4>(gemm_backend::host, K);
        int bad = 0;
        double worst = 0;
        for (std::size_t i = 0; i < M * N; ++i) {
            // + 2^-23 relative: the path applies the tensor scales in alpha, not inside each scale
            const double T = ref.abs_products[i];
            const double allowed = gemm_error_bound(ng, 1, T, 0, 0, std::fabs(host[i])) +
                                   gemm_error_bound(nh, 1, T, 0, 0, std::fabs(host[i])) + std::ldexp(T, -22);
            const double diff = std::fabs(static_cast<double>(got[i]) - host[i]);
            if (!(diff <= allowed) && bad++ < 5)
                FAIL_CHECK("element " << i << ": GPU " << got[i] << " host " << host[i]);
            worst = std::max(worst, diff / allowed);
        }
        MESSAGE("NVFP4 dequantizing path vs host: largest |difference| / allowed = " << worst);
    }

    TEST_CASE("epilogue on the GPU: alpha, beta C, bias, bf16/fp16, column-major D, C = D") {
        if (!has_arch(89)) {
            MESSAGE("skipped: needs an sm_89+ GPU");
            return;
        }
        auto g = octet_test::rng(99);
        const std::size_t M = 150, N = 260, K = 384;
        tally t;
        std::vector<gemm_backend> backends = {gemm_backend::sm89_mma};
        if (cuda::compute_capability() == 90 && detail::sm90a_available()) backends.push_back(gemm_backend::sm90_wgmma);
        for (gemm_backend b : backends) {
            gemm_options opt;
            opt.alpha = -0.5f;
            const auto ea = quantized<recipes::blockwise_1x128>(exact_values(g, M, K, 128), M, K);
            const auto eb = quantized<recipes::blockwise_128x128>(exact_values(g, N, K, 128), N, K);
            compare_with_host<recipes::blockwise_1x128, recipes::blockwise_128x128, float>(b, ea, eb, true, t, opt,
                                                                                           true);
            compare_with_host<recipes::blockwise_1x128, recipes::blockwise_128x128, bf16>(b, ea, eb, true, t, opt,
                                                                                          true);
            compare_with_host<recipes::blockwise_1x128, recipes::blockwise_128x128, fp16>(b, ea, eb, true, t, opt, true,
                                                                                          storage_order::col_major);
            const auto ra = quantized<recipes::blockwise_1x128>(octet_test::with_edge_cases(g, M * K), M, K);
            const auto rb = quantized<recipes::blockwise_128x128>(octet_test::with_edge_cases(g, N * K), N, K);
            compare_with_host<recipes::blockwise_1x128, recipes::blockwise_128x128, bf16>(b, ra, rb, false, t, opt,
                                                                                          true);
        }
        if (cuda::compute_capability() == 90 && !kInterpreted) {  // no cuBLASLt under the interpreter
            const auto ra = quantized<recipes::blockwise_1x128>(octet_test::with_edge_cases(g, M * K), M, K);
            const auto rb = quantized<recipes::blockwise_128x128>(octet_test::with_edge_cases(g, N * K), N, K);
            compare_with_host<recipes::blockwise_1x128, recipes::blockwise_128x128, bf16>(gemm_backend::cublaslt, ra,
                                                                                          rb, false, t, {}, true);
        }
        t.message("epilogue cases");

        // C = D (in place): D += A B^T.
        const auto qa = quantized<recipes::blockwise_1x128>(exact_values(g, M, K, 128), M, K);
        const auto qb = quantized<recipes::blockwise_128x128>(exact_values(g, N, K, 128), N, K);
        std::vector<float> once(M * N);
        scaled_gemm(on_host(), qa.cref(), qb.cref(), matrix_ref<float>(once.data(), M, N));
        const device_copy<recipes::blockwise_1x128> da(qa);
        const device_copy<recipes::blockwise_128x128> db(qb);
        cuda::device_buffer<float> d(M * N);
        d.fill_bytes(0);
        gemm_options o;
        o.beta = 1.0f;
        for (int rep = 0; rep < 2; ++rep)
            scaled_gemm(gpu(), da.cref(), db.cref(), matrix_ref<const float>(d.data(), M, N),
                        matrix_ref<float>(d.data(), M, N), o);
        const auto twice = d.download();
        int bad = 0;
        for (std::size_t i = 0; i < M * N; ++i)
            if (twice[i] != 2 * once[i] && bad++ < 3)
                FAIL_CHECK("in-place element " << i << ": " << twice[i] << " vs " << 2 * once[i]);
        CHECK(bad == 0);
    }

    TEST_CASE("sm90_wgmma split-K against the host: exact and bounded, ragged ranges, the epilogue after the sum") {
        if (cuda::compute_capability() != 90 || !detail::sm90a_available()) {
            MESSAGE("skipped: needs an sm_90 GPU and sm_90a code");
            return;
        }
        using RA = recipes::blockwise_1x128;
        using RB = recipes::blockwise_128x128;
        auto g = octet_test::rng(131);
        tally t;
        // K = 600 and 640 are 5 K blocks (the last ragged in the first): 2 ranges of 3 + 2, 3 of 2 + 2 + 1,
        // 4 asked giving 3 (no empty range), 9 asked giving 5 of one block; K = 1280, 10 blocks, on a GPU. N = 129
        // takes the partial sums' one-element stores, N = 136 the paired ones.
        const std::vector<shape> shapes = pick<std::vector<shape>>({{70, 129, 600}, {64, 136, 640}, {200, 300, 1280}},
                                                                   {{70, 129, 600}, {64, 136, 640}});
        for (const shape& s : shapes)
            for (gemm_tile tile : {gemm_tile::m128n128, gemm_tile::m64n64, gemm_tile::m128n192})
                for (int split : {2, 3, 4, 9}) {
                    gemm_options opt;
                    opt.tile = tile;
                    opt.split_k = split;
                    opt.alpha = -0.5f;
                    const detail::sm90_plan plan = detail::sm90_choose_plan<RB>(s.M, s.N, s.K, opt);
                    const std::uint32_t blocks = static_cast<std::uint32_t>((s.K + 127) / 128);
                    CHECK(plan.tile == tile);
                    CHECK(plan.splits == (blocks + plan.kb_per_split - 1) / plan.kb_per_split);
                    const std::uint32_t asked = std::min<std::uint32_t>(static_cast<std::uint32_t>(split), blocks);
                    INFO("tile " << tile_name(tile) << ", split_k " << split << ": " << plan.splits << " ranges of "
                                 << plan.kb_per_split << " K blocks");
                    CHECK(plan.kb_per_split == (blocks + asked - 1) / asked);
                    CHECK(plan.splits > 1);
                    const auto ea = quantized<RA>(exact_values(g, s.M, s.K, 128), s.M, s.K);
                    const auto eb = quantized<RB>(exact_values(g, s.N, s.K, 128), s.N, s.K);
                    compare_with_host<RA, RB, float>(gemm_backend::sm90_wgmma, ea, eb, true, t, opt);
                    compare_with_host<RA, RB, bf16>(gemm_backend::sm90_wgmma, ea, eb, true, t, opt, true);
                    compare_with_host<RA, RB, fp16>(gemm_backend::sm90_wgmma, ea, eb, true, t, opt, true,
                                                    storage_order::col_major);
                    const auto ra = quantized<RA>(octet_test::with_edge_cases(g, s.M * s.K, 2.0f), s.M, s.K);
                    const auto rb = quantized<RB>(octet_test::with_edge_cases(g, s.N * s.K, 0.5f), s.N, s.K);
                    compare_with_host<RA, RB, float>(gemm_backend::sm90_wgmma, ra, rb, false, t, opt, true);
                }
        t.message("split-K cases");
    }

    TEST_CASE("quantized output on the GPU equals the host's, with its amax") {
        if (!has_arch(89)) {
            MESSAGE("skipped: needs an sm_89+ GPU");
            return;
        }
        auto g = octet_test::rng(111);
        const std::size_t M = 96, N = 256, K = 256;
        const auto qa = quantized<recipes::blockwise_1x128>(exact_values(g, M, K, 128), M, K);
        const auto qb = quantized<recipes::blockwise_128x128>(exact_values(g, N, K, 128), N, K);
        quantized_tensor<recipes::blockwise_1x128> hq(M, N);
        const gemm_result hr = scaled_gemm(on_host(), qa.cref(), qb.cref(), hq.ref());
        const device_copy<recipes::blockwise_1x128> da(qa);
        const device_copy<recipes::blockwise_128x128> db(qb);
        const quant_layout L = quant_layout_of<recipes::blockwise_1x128>::make(M, N);
        cuda::device_buffer<std::uint8_t> data(L.data_bytes), scales(L.scale_bytes);
        cuda::device_buffer<float> amax(1);
        data.fill_bytes(0xCD);
        scales.fill_bytes(0xCD);
        scaled_gemm(gpu(), da.cref(), db.cref(), quantized_ref<recipes::blockwise_1x128>(data.data(), scales.data(), L),
                    {}, amax.data());
        OCTET_CUDA_CHECK(cudaDeviceSynchronize());
        CHECK(data.download() == hq.data());
        CHECK(scales.download() == hq.scales());
        CHECK(amax.download()[0] == hr.amax);
    }

    TEST_CASE("automatic selection on this GPU, and misaligned operands are refused") {
        if (!has_arch(89)) {
            MESSAGE("skipped: needs an sm_89+ GPU");
            return;
        }
        auto g = octet_test::rng(123);
        const std::size_t M = 64, N = 64, K = 200;
        const auto qa = quantized<recipes::blockwise_1x128>(octet_test::with_edge_cases(g, M * K), M, K);
        const auto qb = quantized<recipes::blockwise_128x128>(octet_test::with_edge_cases(g, N * K), N, K);
        const device_copy<recipes::blockwise_1x128> da(qa);
        const device_copy<recipes::blockwise_128x128> db(qb);
        cuda::device_buffer<float> d(M * N);
        const gemm_result r = scaled_gemm(gpu(), da.cref(), db.cref(), matrix_ref<float>(d.data(), M, N));
        CHECK(r.backend == (cuda::compute_capability() == 90 && detail::sm90a_available() ? gemm_backend::sm90_wgmma
                                                                                          : gemm_backend::sm89_mma));
        // MX runs on sm89_mma automatically
        const auto ma = quantized<recipes::mxfp8_e4m3>(octet_test::with_edge_cases(g, M * K), M, K);
        const device_copy<recipes::mxfp8_e4m3> dma(ma);
        CHECK(scaled_gemm(gpu(), dma.cref(), dma.cref(), matrix_ref<float>(d.data(), M, M)).backend ==
              gemm_backend::sm89_mma);

        // Unpadded rows (K = 200 -> 200-byte rows) are not 16-byte aligned.
        const auto ua = quantized<recipes::blockwise_1x128>(octet_test::with_edge_cases(g, M * K), M, K, /*pad=*/false);
        const device_copy<recipes::blockwise_1x128> dua(ua);
        CHECK_THROWS_WITH_AS(scaled_gemm(gpu(), dua.cref(), db.cref(), matrix_ref<float>(d.data(), M, N)),
                             doctest::Contains("argument 'A' needs 16-byte aligned rows"), octet::error);
        // Host memory on a stream.
        std::vector<float> host_d(M * N);
        CHECK_THROWS_WITH_AS(scaled_gemm(gpu(), da.cref(), db.cref(), matrix_ref<float>(host_d.data(), M, N)),
                             doctest::Contains("argument 'D' points to host memory"), octet::error);
        // NVFP4 on sm89_mma is refused with the backends that serve it.
        const auto fa = quantized<recipes::nvfp4>(octet_test::with_edge_cases(g, M * K), M, K);
        const device_copy<recipes::nvfp4> dfa(fa);
        gemm_options o;
        o.backend = gemm_backend::sm89_mma;
        CHECK_THROWS_WITH_AS(
            scaled_gemm(gpu(), dfa.cref(), dfa.cref(), matrix_ref<float>(d.data(), M, M), o),
            doctest::Contains(kInterpreted ? "Backends that serve it here: host (octet::on_host())"
                                           : "Backends that serve it here: host (octet::on_host()), cublaslt"),
            octet::error);
    }
}

TEST_SUITE("cuda") {
    TEST_CASE("sm90_wgmma's plan: whole K blocks per range, no empty range, the tile and split asked for") {
        const int sms = 132;  // an H200's
        for (std::size_t K : {1, 128, 129, 600, 1024, 7168, 16384})
            for (int split : {0, 1, 2, 3, 7, 16, 1000})
                for (gemm_tile tile :
                     {gemm_tile::automatic, gemm_tile::m128n128, gemm_tile::m64n64, gemm_tile::m128n192}) {
                    const std::size_t blocks = (K + 127) / 128;
                    const detail::sm90_plan plan = detail::sm90_choose_plan(128, 7168, K, tile, split, sms, true);
                    INFO("K " << K << " split_k " << split << " splits " << plan.splits << " x " << plan.kb_per_split);
                    CHECK(plan.splits >= 1);
                    CHECK(static_cast<std::size_t>(plan.splits) * plan.kb_per_split >= blocks);
                    CHECK(static_cast<std::size_t>(plan.splits - 1) * plan.kb_per_split < blocks);
                    if (tile != gemm_tile::automatic) CHECK(plan.tile == tile);
                    if (split == 1) CHECK(plan.splits == 1);
                    if (split > 1) CHECK(plan.splits <= std::min<std::size_t>(split, blocks));
                    if (split == 0) CHECK(plan.kb_per_split >= std::min<std::size_t>(blocks, 4));
                    CHECK(plan.scratch_bytes(128, 7168) == (plan.splits > 1 ? plan.splits * 128 * 7168 * 4 : 0));
                }
        // The model's choices for the issue's shapes. 8192^3: 4096 128 x 128 tiles are 31.03 waves on 132
        // SMs (32, the last with 4 tiles), 2752 128 x 192 tiles 20.85 (21 at 1.5 times the work: 31.5 < 32),
        // so the wide tile where B's scales allow it. 7168^3: 3136 tiles are 23.8 waves (24), 2128 wide tiles
        // 16.1 (17 x 1.5 = 25.5 > 24): 128 x 128. One 128-row tile-row of a 7168 x 7168 weight (56 tiles)
        // is split, and 64 rows take 112 small tiles.
        for (bool wide : {true, false}) {
            CAPTURE(wide);
            const detail::sm90_plan square =
                detail::sm90_choose_plan(8192, 8192, 8192, gemm_tile::automatic, 0, sms, wide);
            CHECK((square.tile == (wide ? gemm_tile::m128n192 : gemm_tile::m128n128) && square.splits == 1));
            const detail::sm90_plan ds = detail::sm90_choose_plan(7168, 7168, 7168, gemm_tile::automatic, 0, sms, wide);
            CHECK((ds.tile == gemm_tile::m128n128 && ds.splits == 1));
            const detail::sm90_plan m128 =
                detail::sm90_choose_plan(128, 7168, 7168, gemm_tile::automatic, 0, sms, wide);
            CHECK((m128.tile == gemm_tile::m128n128 && m128.splits == 2));
            const detail::sm90_plan m64 = detail::sm90_choose_plan(64, 7168, 7168, gemm_tile::automatic, 0, sms, wide);
            CHECK((m64.tile == gemm_tile::m64n64 && m64.splits == 1));
        }
        // Pairs of CTAs (options.cluster 0, automatic): 2048 pairs of 128 x 128 tiles of 8192^3 on 66 pairs of
        // SMs are 31.03 waves (32), as many as 4096 single tiles on 132, and 1376 pairs of wide tiles 20.8 (21):
        // pairs, wide. 7168^3: 1568 pairs, 23.8 waves as 3136 single tiles: pairs. M = 128 and 64 have one tile
        // row: single CTAs. Asked for, pairs or single CTAs are taken as asked.
        const auto plan_of = [&](std::size_t M, std::size_t N, std::size_t K, int cluster) {
            return detail::sm90_choose_plan(M, N, K, gemm_tile::automatic, 0, sms, true, cluster);
        };
        CHECK((plan_of(8192, 8192, 8192, 0).tile == gemm_tile::m128n192 && plan_of(8192, 8192, 8192, 0).cluster == 2));
        CHECK((plan_of(7168, 7168, 7168, 0).tile == gemm_tile::m128n128 && plan_of(7168, 7168, 7168, 0).cluster == 2));
        CHECK((plan_of(128, 7168, 7168, 0).cluster == 1 && plan_of(128, 7168, 7168, 0).splits == 2));
        CHECK(plan_of(64, 7168, 7168, 0).cluster == 1);
        CHECK(plan_of(8192, 8192, 8192, 1).cluster == 1);
        CHECK(plan_of(64, 7168, 7168, 2).cluster == 2);
        // 3 tile rows x 100 tile columns: 200 pairs on 66 pairs of SMs are 4 waves, 300 tiles on 132 are 3
        CHECK(plan_of(384, 100 * 128, 1024, 0).cluster == 1);
        // options.cluster outside 0..2 is refused by name
        {
            quantized_tensor<recipes::blockwise_1x128> qa(8, 256), qb(16, 256);
            std::vector<float> dd(8 * 16);
            gemm_options bad;
            bad.cluster = 4;
            CHECK_THROWS_WITH_AS(
                scaled_gemm(on_stream(), qa.cref(), qb.cref(), matrix_ref<float>(dd.data(), 8, 16), bad),
                doctest::Contains("argument 'options.cluster' is 4"), octet::error);
        }
        // A negative split_k is refused by name, before any GPU work.
        quantized_tensor<recipes::blockwise_1x128> a(8, 256), b(16, 256);
        std::vector<float> d(8 * 16);
        gemm_options o;
        o.split_k = -1;
        CHECK_THROWS_WITH_AS(scaled_gemm(on_stream(), a.cref(), b.cref(), matrix_ref<float>(d.data(), 8, 16), o),
                             doctest::Contains("argument 'options.split_k' is -1"), octet::error);
        // The 128 x 192 tile refuses B's per-row (1x128) scales by name; 128x128 B is served.
        o.split_k = 0;
        o.backend = gemm_backend::sm90_wgmma;
        o.tile = gemm_tile::m128n192;
        CHECK(gemm_backend_support<recipes::blockwise_1x128, recipes::blockwise_1x128>(gemm_backend::sm90_wgmma, 256, o)
                  .find("options.tile is m128n192, and the 128 x 192 tile needs B's scales per tensor or in blocks "
                        "of rows") != std::string::npos);
        CHECK(
            gemm_backend_support<recipes::blockwise_1x128, recipes::blockwise_128x128>(gemm_backend::sm90_wgmma, 256, o)
                .empty());
        CHECK_THROWS_WITH_AS(scaled_gemm(on_stream(), a.cref(), b.cref(), matrix_ref<float>(d.data(), 8, 16), o),
                             doctest::Contains("argument 'options.tile' is m128n192, and the 128 x 192 tile needs"),
                             octet::error);
        // ... also when the backend is automatic (which would otherwise pass the tile over for sm89_mma)
        o.backend = gemm_backend::automatic;
        CHECK_THROWS_WITH_AS(scaled_gemm(on_stream(), a.cref(), b.cref(), matrix_ref<float>(d.data(), 8, 16), o),
                             doctest::Contains("argument 'options.tile' is m128n192, and the 128 x 192 tile needs"),
                             octet::error);
    }

    TEST_CASE("stream overloads check their arguments before touching the GPU") {
        using R = recipes::blockwise_1x128;
        quantized_tensor<R> a(8, 256), b(16, 128);
        std::vector<float> d(8 * 16);
        CHECK_THROWS_WITH_AS(scaled_gemm(on_stream(), a.cref(), b.cref(), matrix_ref<float>(d.data(), 8, 16)),
                             doctest::Contains("argument 'B' has K = 128"), octet::error);
        quantized_tensor<R> b2(16, 256);
        gemm_options o;
        o.backend = gemm_backend::host;
        CHECK_THROWS_WITH_AS(scaled_gemm(on_stream(), a.cref(), b2.cref(), matrix_ref<float>(d.data(), 8, 16), o),
                             doctest::Contains("argument 'options.backend' is host"), octet::error);
        o.backend = gemm_backend::sm90_wgmma;
        o.promotion_interval = 64;
        CHECK_THROWS_WITH_AS(scaled_gemm(on_stream(), a.cref(), b2.cref(), matrix_ref<float>(d.data(), 8, 16), o),
                             doctest::Contains("must be a multiple of 128"), octet::error);
        quantized_tensor<recipes::mxfp4> f(8, 256);
        o = {};
        o.backend = gemm_backend::cublaslt;
        CHECK_THROWS_WITH_AS(scaled_gemm(on_stream(), f.cref(), f.cref(), matrix_ref<float>(d.data(), 8, 8), o),
                             doctest::Contains("which cannot run e2m1, 1x32 blocks, ue8m0 scales"), octet::error);
        // A quantized D of the wrong shape is reported under scaled_gemm before anything is enqueued.
        quantized_tensor<R> dq_wrong(16, 8);
        CHECK_THROWS_WITH_AS(scaled_gemm(on_stream(), a.cref(), b2.cref(), dq_wrong.ref()),
                             doctest::Contains("octet::scaled_gemm: argument 'D' has shape 16 x 8 but must be 8 x 16"),
                             octet::error);
        // cuBLASLt is a property of the executor: one that carries none is refused, with the way to
        // lend one, before any GPU is needed.
        quantized_tensor<recipes::nvfp4> n4(8, 256);
        CHECK((on_stream().cublaslt.matmul == nullptr));
        CHECK_THROWS_WITH_AS(
            scaled_gemm(on_stream(), n4.cref(), n4.cref(), matrix_ref<float>(d.data(), 8, 8), o),
            doctest::Contains(
                "the executor carries no cuBLASLt (pass octet::with_cublaslt(octet::on_stream(s), handle"),
            octet::error);
        CHECK_THROWS_WITH_AS(
            scaled_gemm(on_stream(), n4.cref(), n4.cref(), matrix_ref<float>(d.data(), 8, 8)),
            doctest::Contains("cublaslt may, if the executor carries a cuBLASLt (octet::with_cublaslt"), octet::error);
        int not_a_handle = 0;
        const stream_executor lent =
            with_cublaslt(on_stream(), reinterpret_cast<cublasLtHandle_t>(&not_a_handle), nullptr, 0);
        CHECK(lent.cublaslt.handle == &not_a_handle);
        CHECK((lent.cublaslt.matmul != nullptr));
        if (kInterpreted)  // an executor that lends cuBLASLt is refused there, with the reason
            CHECK_THROWS_WITH_AS(scaled_gemm(lent, n4.cref(), n4.cref(), matrix_ref<float>(d.data(), 8, 8), o),
                                 doctest::Contains("the cublaslt backend is unavailable in interpret mode"),
                                 octet::error);
        CHECK_THROWS_WITH_AS(with_cublaslt(on_stream(), nullptr, nullptr, 0),
                             doctest::Contains("argument 'handle' is null"), octet::error);
        CHECK_THROWS_WITH_AS(
            with_cublaslt(on_stream(), reinterpret_cast<cublasLtHandle_t>(&not_a_handle), nullptr, 1024),
            doctest::Contains("argument 'workspace' is null"), octet::error);
    }
}

// Real training data on the kernels (tests/host/scaled_invariance.cpp has the host's): A times 2^k
// (k from -40 to 40, through the 1e-3..1e-6 magnitudes of gradients) gives D times 2^k bit for bit,
// and zero tokens appended to A, or a zero tail on the contraction, leave every row of D bit for bit.
namespace gemm_invariance {

template <class RA, class RB>
std::vector<float> device_gemm(gemm_backend backend, const std::vector<float>& a, const std::vector<float>& b,
                               std::size_t M, std::size_t N, std::size_t K) {
    const device_copy<RA> da(quantized<RA>(a, M, K));
    const device_copy<RB> db(quantized<RB>(b, N, K));
    cuda::device_buffer<float> d(M * N);
    d.fill_bytes(0xFF);
    gemm_options opt;
    opt.backend = backend;
    scaled_gemm(gpu(), da.cref(), db.cref(), matrix_ref<float>(d.data(), M, N), opt);
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    return d.download();
}

std::uint32_t bits_of(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

template <class RA, class RB>
void check_backend(gemm_backend backend, const char* pair) {
    INFO(backend_name(backend) << ": " << pair);
    auto g = octet_test::rng(4431);
    const std::size_t M = 70, N = 64, K = 256;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> a(M * K), b(N * K);
    for (auto& v : a) v = 1e-3f * nd(g);
    for (auto& v : b) v = 0.05f * nd(g);
    for (std::size_t k = 0; k < K; ++k) a[5 * K + k] = 0.0f;  // a zero token (padding) among them
    const std::vector<float> d0 = device_gemm<RA, RB>(backend, a, b, M, N, K);
    for (const int k : {-40, -9, 17, 40}) {
        INFO("k = " << k);
        std::vector<float> ak = a;
        for (auto& v : ak) v = std::ldexp(v, k);
        const std::vector<float> dk = device_gemm<RA, RB>(backend, ak, b, M, N, K);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < M * N; ++i) bad += !(dk[i] == std::ldexp(d0[i], k));
        CHECK(bad == 0);
    }
    const std::size_t pm = 58, pk = 128;
    std::vector<float> ap((M + pm) * (K + pk), 0.0f), bp(N * (K + pk), 0.0f);
    for (std::size_t i = 0; i < M; ++i) std::copy(&a[i * K], &a[i * K] + K, &ap[i * (K + pk)]);
    for (std::size_t j = 0; j < N; ++j) std::copy(&b[j * K], &b[j * K] + K, &bp[j * (K + pk)]);
    const std::vector<float> d1 = device_gemm<RA, RB>(backend, ap, bp, M + pm, N, K + pk);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < M * N; ++i) bad += bits_of(d1[i]) != bits_of(d0[i]);
    CHECK(bad == 0);
}

TEST_SUITE("gpu") {
    TEST_CASE(
        "sm89_mma and sm90_wgmma: A times 2^k scales D by 2^k bit for bit; zero tokens and a zero K tail change "
        "nothing") {
        std::vector<gemm_backend> backends;
        if (has_arch(89) && detail::sm89_available()) backends.push_back(gemm_backend::sm89_mma);
        if (cuda::compute_capability() == 90 && detail::sm90a_available()) backends.push_back(gemm_backend::sm90_wgmma);
        if (backends.empty()) MESSAGE("skipped: needs an sm_89+ GPU");
        for (const gemm_backend be : backends) {
            check_backend<recipes::blockwise_1x128, recipes::blockwise_128x128>(be, "1x128 x 128x128");
            check_backend<recipes::tensorwise_e4m3, recipes::tensorwise_e4m3>(be, "tensor x tensor");
            check_backend<recipes::rowwise_e4m3, recipes::rowwise_e4m3>(be, "row x row");
        }
    }
}

}  // namespace gemm_invariance
}  // namespace gemm_device_test
