// The Hopper scaled GEMM kernel (octet/gemm/sm90_wgmma.cuh: TMA into a shared ring guarded by full/empty
// mbarriers, a producer warpgroup with setmaxnreg, consumer warpgroups on wgmma) under the interpreter,
// against the host backend, as tests/cuda/gemm_device.cu's "sm90_wgmma against the host" does on the GPU:
// every recipe pair the kernel serves, both tiles, on small ragged shapes (M = 1, M/N/K not multiples of
// the tile, several k-blocks, more (k-block, tile) steps per CTA than stages so the ring wraps, more tiles
// than the interpreter's 2 SMs so the persistent loop runs).
//   * exact inputs (values in {-1, 0, 1}, a 7 at the start of every scale block): bit for bit;
//   * random inputs: |interpreted - host| <= bound(sm90_wgmma) + bound(host) (scaled_gemm.hpp).
// The kernel is launched through detail::launch_sm90: scaled_gemm.cuh also includes the sm_89 kernel,
// which another branch converts. The helpers follow gemm_device.cu's (which this file may not share yet).
// Last, a broken configuration of the real kernel: a TMA map without the swizzle the wgmma descriptors
// assume must give wrong results.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "octet/cuda/buffer.cuh"
#include "octet/gemm/sm90_wgmma.cuh"
#include "support/random.hpp"

namespace interpret_gemm_sm90_test {
using namespace octet;

using e5m2_1x128 = recipe<e5m2, block<1, 128>, scale::amax_ratio<0>>;

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
quantized_tensor<R> quantized(const std::vector<float>& x, std::size_t rows, std::size_t cols) {
    quantized_tensor<R> q(rows, cols, true);
    quantize<R>(on_host(), matrix_ref<const float>(x.data(), rows, cols), q.ref());
    return q;
}

/// Values in {-1, 0, 1} with a 7 at the start of every `block`-wide run along K (so every scale is a
/// power of two and every partial sum a small integer times one: any correct accumulator is exact).
std::vector<float> exact_values(std::mt19937_64& g, std::size_t rows, std::size_t K, std::size_t block) {
    std::uniform_int_distribution<int> d(-1, 1);
    std::vector<float> x(rows * K);
    for (auto& v : x) v = static_cast<float>(d(g));
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t k = 0; k < K; k += block) x[i * K + k] = 7.0f;
    return x;
}

/// Sums of magnitudes sum_k |a_ik| |b_jk| (the host backend on the operands with sign bits cleared).
template <class RA, class RB>
std::vector<float> abs_products(const quantized_tensor<RA>& a, const quantized_tensor<RB>& b) {
    quantized_tensor<RA> aa = a;
    quantized_tensor<RB> bb = b;
    for (auto& c : aa.data()) c &= 0x7F;
    for (auto& c : bb.data()) c &= 0x7F;
    std::vector<float> t(a.layout().rows * b.layout().rows);
    scaled_gemm(on_host(), aa.cref(), bb.cref(), matrix_ref<float>(t.data(), a.layout().rows, b.layout().rows));
    return t;
}

/// D = A B^T by the sm90 kernel under the interpreter (row-major float D, poisoned first).
template <class RA, class RB>
std::vector<float> run_sm90(const quantized_tensor<RA>& ha, const quantized_tensor<RB>& hb, gemm_tile tile) {
    const std::size_t M = ha.layout().rows, N = hb.layout().rows;
    const device_copy<RA> da(ha);
    const device_copy<RB> db(hb);
    cuda::device_buffer<float> dd(M * N);
    dd.fill_bytes(0xFF);
    const matrix_ref<float> D(dd.data(), M, N);
    detail::launch_sm90(nullptr, da.cref(), db.cref(), detail::make_device_epilogue<float, float>(nullptr, D, {}),
                        tile);
    return dd.download();
}

/// One comparison with the host backend; returns the number of mismatching elements.
template <class RA, class RB>
int compare_with_host(const quantized_tensor<RA>& ha, const quantized_tensor<RB>& hb, bool exact, gemm_tile tile) {
    const std::size_t M = ha.layout().rows, N = hb.layout().rows, K = ha.layout().cols;
    INFO("A " << recipe_description<RA>() << ", B " << recipe_description<RB>() << ", M=" << M << " N=" << N
              << " K=" << K << (exact ? " (exact inputs)" : "") << ", seed " << octet_test::run_seed());
    std::vector<float> hd(M * N);
    gemm_options host_opt;
    host_opt.backend = gemm_backend::host;
    scaled_gemm(on_host(), ha.cref(), hb.cref(), matrix_ref<float>(hd.data(), M, N), host_opt);
    const std::vector<float> got = run_sm90(ha, hb, tile);
    const std::vector<float> T = exact ? std::vector<float>() : abs_products(ha, hb);
    const gemm_numerics ng = gemm_numerics_of<RA, RB, float>(gemm_backend::sm90_wgmma, K);
    const gemm_numerics nh = gemm_numerics_of<RA, RB, float>(gemm_backend::host, K);
    int bad = 0;
    for (std::size_t o = 0; o < M * N; ++o) {
        if (exact) {
            if (std::memcmp(&got[o], &hd[o], sizeof(float)) != 0 && bad++ < 5)
                FAIL_CHECK("D(" << o / N << "," << o % N << "): interpreted " << got[o] << " host " << hd[o]
                                << " (must be equal: exact inputs)");
            continue;
        }
        const double allowed = gemm_error_bound(ng, 1.0, T[o], 0.0, 0.0, std::fabs(hd[o])) +
                               gemm_error_bound(nh, 1.0, T[o], 0.0, 0.0, std::fabs(hd[o]));
        const double diff = std::fabs(static_cast<double>(got[o]) - hd[o]);
        if (!(diff <= allowed) && bad++ < 5)
            FAIL_CHECK("D(" << o / N << "," << o % N << "): interpreted " << got[o] << " host " << hd[o] << " |diff| "
                            << diff << " > allowed " << allowed);
    }
    return bad;
}

struct shape {
    std::size_t M, N, K;
};

/// Exact-input and random-input comparisons of one recipe pair over several shapes.
template <class RA, class RB>
void pair(const std::vector<shape>& shapes, std::size_t a_block, std::size_t b_block,
          gemm_tile tile = gemm_tile::automatic) {
    std::uint64_t salt = 1000;
    for (const shape& s : shapes) {
        auto g = octet_test::rng(salt++);
        {
            const auto ha = quantized<RA>(exact_values(g, s.M, s.K, a_block), s.M, s.K);
            const auto hb = quantized<RB>(exact_values(g, s.N, s.K, b_block), s.N, s.K);
            CHECK(compare_with_host(ha, hb, true, tile) == 0);
        }
        const auto ha = quantized<RA>(octet_test::with_edge_cases(g, s.M * s.K, 2.0f), s.M, s.K);
        const auto hb = quantized<RB>(octet_test::with_edge_cases(g, s.N * s.K, 0.5f), s.N, s.K);
        CHECK(compare_with_host(ha, hb, false, tile) == 0);
    }
}

// The small tile has 8 stages and the large 6: (70, 130, 384) on the small tile is 6 tiles on 2 CTAs,
// 9 (tile, k-block) steps each; (130, 250, 512) on the large tile 4 tiles, 8 steps each.
TEST_CASE("sm90_wgmma 1x128 x 128x128, both tiles") {
    pair<recipes::blockwise_1x128, recipes::blockwise_128x128>({{1, 64, 256}, {70, 130, 384}}, 128, 128,
                                                               gemm_tile::m64n64);
    pair<recipes::blockwise_1x128, recipes::blockwise_128x128>({{130, 250, 512}}, 128, 128, gemm_tile::m128n128);
}
TEST_CASE("sm90_wgmma 1x128 x 1x128 (weight gradient), both tiles") {
    pair<recipes::blockwise_1x128, recipes::blockwise_1x128>({{130, 250, 384}}, 128, 128, gemm_tile::m128n128);
    pair<recipes::blockwise_1x128, recipes::blockwise_1x128>({{1, 64, 256}}, 128, 128, gemm_tile::m64n64);
}
TEST_CASE("sm90_wgmma tensor x tensor and row x row (K not a multiple of 128)") {
    pair<recipes::tensorwise_e4m3, recipes::tensorwise_e4m3>({{100, 200, 300}}, 128, 128);
    pair<recipes::rowwise_e4m3, recipes::rowwise_e4m3>({{100, 200, 300}}, 128, 128);
}
TEST_CASE("sm90_wgmma E5M2 1x128 x E4M3 128x128 (data gradient) and E4M3 x E5M2") {
    pair<e5m2_1x128, recipes::blockwise_128x128>({{77, 190, 640}}, 128, 128);
    pair<recipes::tensorwise_e4m3, recipes::tensorwise_e5m2>({{64, 64, 128}}, 128, 128);
}

// A TMA map without the 128-byte swizzle that the kernel's wgmma descriptors (sm90_smem_desc) assume: the
// copy lands linearly, the descriptors read it permuted, so all rows but every 8th get the wrong K bytes.
// This is a legal program (neither the ISA nor the interpreter can know which layout was meant), so it
// shows as wrong results, which the bit-exact comparison catches.
TEST_CASE("sm90_wgmma with a tensor map whose swizzle does not match the descriptors gives wrong results") {
    using R = recipes::tensorwise_e4m3;
    using Cfg = detail::sm90_small;
    const std::size_t M = 64, N = 64, K = 128;
    auto g = octet_test::rng(7);
    const auto ha = quantized<R>(exact_values(g, M, K, 128), M, K);
    const auto hb = quantized<R>(exact_values(g, N, K, 128), N, K);
    std::vector<float> hd(M * N);
    scaled_gemm(on_host(), ha.cref(), hb.cref(), matrix_ref<float>(hd.data(), M, N));

    const device_copy<R> da(ha), db(hb);
    cuda::device_buffer<float> dd(M * N);
    dd.fill_bytes(0xFF);
    const auto A = da.cref(), B = db.cref();
    detail::sm90_params<float, float> p{};
    p.M = static_cast<std::uint32_t>(M);
    p.N = static_cast<std::uint32_t>(N);
    p.K = static_cast<std::uint32_t>(K);
    p.num_kb = 1;
    p.tiles_m = p.tiles_n = 1;
    p.sa = reinterpret_cast<const float*>(A.scales);
    p.sa_ld = static_cast<std::uint32_t>(A.layout.scale_ld);
    p.sa_br = static_cast<std::uint32_t>(A.layout.block_rows);
    p.sa_bc = static_cast<std::uint32_t>(A.layout.block_cols);
    p.sb = reinterpret_cast<const float*>(B.scales);
    p.sb_ld = static_cast<std::uint32_t>(B.layout.scale_ld);
    p.sb_br = static_cast<std::uint32_t>(B.layout.block_rows);
    p.sb_bc = static_cast<std::uint32_t>(B.layout.block_cols);
    p.epi = detail::make_device_epilogue<float, float>(nullptr, matrix_ref<float>(dd.data(), M, N), {});
    auto unswizzled = [](const std::uint8_t* data, std::size_t rows, std::size_t row_bytes) {
        CUtensorMap map{};
        const cuuint64_t dims[2] = {K, rows};
        const cuuint64_t strides[1] = {row_bytes};
        const cuuint32_t box[2] = {128u, 64u};
        const cuuint32_t elem[2] = {1u, 1u};
        REQUIRE(detail::tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<std::uint8_t*>(data),
                                             dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                             CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS);
        return map;
    };
    const CUtensorMap ma = unswizzled(A.data, M, A.layout.row_bytes), mb = unswizzled(B.data, N, B.layout.row_bytes);
    auto kernel = detail::sm90_gemm_kernel<e4m3, e4m3, Cfg, true, float, float>;
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::smem_bytes));
    cuda::launch("sm90_gemm_kernel", kernel, 1, Cfg::threads, Cfg::smem_bytes, nullptr, ma, mb, p);
    const std::vector<float> got = dd.download();
    std::size_t wrong = 0;
    for (std::size_t o = 0; o < M * N; ++o) wrong += std::memcmp(&got[o], &hd[o], sizeof(float)) != 0;
    INFO("wrong elements: " << wrong << " of " << M * N);
    CHECK(wrong > M * N / 2);
}

}  // namespace interpret_gemm_sm90_test
