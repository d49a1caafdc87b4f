// The Hopper scaled GEMM kernel (octet/gemm/sm90_wgmma.cuh) launched by hand under the interpreter:
// a TMA map without the swizzle its wgmma descriptors assume must give wrong results, and both ways of
// bringing the scales (TMA, or loads by the producer threads), the 128 x 192 tile's two B scale blocks,
// and pairs of CTAs multicasting B must give the host's bits. (The kernel
// itself runs under the interpreter in interpret.gemm_device, every recipe pair it serves against the
// host backend, as on a GPU.)
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "octet/cuda/buffer.cuh"
#include "octet/gemm/sm90_wgmma.cuh"
#include "support/random.hpp"

namespace interpret_gemm_sm90_test {
using namespace octet;

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

/// The kernel's parameters for D = A B^T into `d` (float, row-major), one range, stores from registers.
template <class RA, class RB, class Cfg>
detail::sm90_params<float, float> params(const quantized_cref<RA>& A, const quantized_cref<RB>& B, float* d) {
    return detail::sm90_problem_params<Cfg>(
        A, B, detail::make_device_epilogue<float, float>(nullptr, matrix_ref<float>(d, A.rows(), B.rows()), {}));
}

/// Elements of got whose bits differ from want's.
std::size_t differing(const std::vector<float>& got, const std::vector<float>& want) {
    REQUIRE(got.size() == want.size());
    std::size_t wrong = 0;
    for (std::size_t o = 0; o < got.size(); ++o) wrong += std::memcmp(&got[o], &want[o], sizeof(float)) != 0;
    return wrong;
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
    const auto A = da.cref(), B = db.cref();
    const detail::sm90_params<float, float> p = params<R, R, Cfg>(A, B, dd.data());
    auto kernel = detail::sm90_gemm_kernel<e4m3, e4m3, Cfg, detail::sm90_b_scales::per_tile, float, float>;
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::smem_bytes));
    auto wrong_elements = [&](const CUtensorMap& ma, const CUtensorMap& mb) {
        dd.fill_bytes(0xFF);
        // p.tma_scale_a/b false: the scales are loaded by threads; p.tma_store false: D from registers
        cuda::launch("sm90_gemm_kernel", kernel, 1, Cfg::threads, Cfg::smem_bytes, nullptr, ma, mb, CUtensorMap{},
                     CUtensorMap{}, CUtensorMap{}, p);
        return differing(dd.download(), hd);
    };
    // the control: the kernel's own maps (128-byte swizzle) give the host's bits
    CHECK(wrong_elements(detail::sm90_operand_map(A.data, M, K, A.layout.row_bytes, Cfg::BM),
                         detail::sm90_operand_map(B.data, N, K, B.layout.row_bytes, Cfg::BN)) == 0);
    const std::size_t wrong =
        wrong_elements(detail::sm90_operand_map(A.data, M, K, A.layout.row_bytes, Cfg::BM, CU_TENSOR_MAP_SWIZZLE_NONE),
                       detail::sm90_operand_map(B.data, N, K, B.layout.row_bytes, Cfg::BN, CU_TENSOR_MAP_SWIZZLE_NONE));
    INFO("wrong elements: " << wrong << " of " << M * N);
    CHECK(wrong > M * N / 2);
}

/// Exact values scaled by 2^(r + 3 b - 4): r = (i + kb) % 3 varies by row, b = (i / 128 + 2 kb) % 3 by
/// 128-row block. Every 128-row block holds rows of each r, so its amax (and 128x128 scale) is 7 * 2^(3 b
/// - 2), which differs from both neighbouring blocks' and the next K block's; a 1x128 scale also
/// differs from the next row's. A scale read from the wrong block changes the result; the products stay
/// exact.
std::vector<float> varied_blocks(std::mt19937_64& g, std::size_t rows, std::size_t K) {
    std::vector<float> x = exact_values(g, rows, K, 128);
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t k = 0; k < K; ++k) {
            const std::size_t kb = k / 128, r = (i + kb) % 3, b = (i / 128 + 2 * kb) % 3;
            x[i * K + k] *= std::ldexp(1.0f, static_cast<int>(r + 3 * b) - 4);
        }
    return x;
}

// 1x128 scales on both operands (one float per row and K block): the TMA path reads them as a float
// matrix, boxes of BM (BN) rows of one K block, zero-filled past M (N). Ragged M and N, several K blocks
// and persistent tiles (one CTA walks all of them): both paths must give the host's bits.
TEST_CASE("sm90_wgmma's scales by TMA and by the producer's loads both give the host's bits") {
    using R = recipes::blockwise_1x128;
    using Cfg = detail::sm90_small;
    const std::size_t M = 100, N = 72, K = 384;
    auto g = octet_test::rng(11);
    // every (row, K block) its own power-of-two scale, so that a scale read from the wrong row or block
    // changes the result (the products stay exact)
    auto varied = [&](std::size_t rows) {
        std::vector<float> x = exact_values(g, rows, K, 128);
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t k = 0; k < K; ++k)
                x[i * K + k] *= std::ldexp(1.0f, static_cast<int>((3 * i + k / 128) % 7) - 3);
        return x;
    };
    const auto ha = quantized<R>(varied(M), M, K);
    const auto hb = quantized<R>(varied(N), N, K);
    std::vector<float> hd(M * N);
    scaled_gemm(on_host(), ha.cref(), hb.cref(), matrix_ref<float>(hd.data(), M, N));

    const device_copy<R> da(ha), db(hb);
    cuda::device_buffer<float> dd(M * N);
    const auto A = da.cref(), B = db.cref();
    REQUIRE(detail::sm90_scales_by_tma(A.scales, A.layout));
    REQUIRE(detail::sm90_scales_by_tma(B.scales, B.layout));
    auto kernel = detail::sm90_gemm_kernel<e4m3, e4m3, Cfg, detail::sm90_b_scales::per_column, float, float>;
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::smem_bytes));
    const CUtensorMap ma = detail::sm90_operand_map(A.data, M, K, A.layout.row_bytes, Cfg::BM);
    const CUtensorMap mb = detail::sm90_operand_map(B.data, N, K, B.layout.row_bytes, Cfg::BN);
    const CUtensorMap msa = detail::sm90_scale_map(A.scales, A.layout, Cfg::BM);
    const CUtensorMap msb = detail::sm90_scale_map(B.scales, B.layout, Cfg::BN);
    for (int tma_a = 0; tma_a < 2; ++tma_a)
        for (int tma_b = 0; tma_b < 2; ++tma_b) {
            CAPTURE(tma_a);
            CAPTURE(tma_b);
            detail::sm90_params<float, float> p = params<R, R, Cfg>(A, B, dd.data());
            p.tma_scale_a = tma_a != 0;
            p.tma_scale_b = tma_b != 0;
            dd.fill_bytes(0xFF);
            cuda::launch("sm90_gemm_kernel", kernel, 1, Cfg::threads, Cfg::smem_bytes, nullptr, ma, mb,
                         tma_a ? msa : CUtensorMap{}, tma_b ? msb : CUtensorMap{}, CUtensorMap{}, p);
            CHECK(differing(dd.download(), hd) == 0);
        }
}

// The 128 x 192 tile against B's 128x128 scale blocks: a tile starting at a multiple of 384 crosses into
// the next block at its column 128, one starting at 192 mod 384 at column 64, and the last tile of N =
// 330 reaches a third block only past N (its second scale is not loaded). Each (128-row block, K block)
// of B has its own scale, so a column promoted with its neighbour block's scale changes the bits; ragged
// M, several K blocks, and one CTA walking every tile. B per tensor (one scale per tile at any N) too.
TEST_CASE("sm90_wgmma's 128 x 192 tile reads B's 128x128 scales of both blocks it spans: the host's bits") {
    using RA = recipes::blockwise_1x128;
    using Cfg = detail::sm90_wide;
    static_assert(detail::sm90_b_scales_of<128, Cfg::BN>() == detail::sm90_b_scales::two_blocks);
    static_assert(detail::sm90_b_scales_of<full, Cfg::BN>() == detail::sm90_b_scales::per_tile);
    static_assert(detail::sm90_b_scales_of<1, Cfg::BN>() == detail::sm90_b_scales::per_column);
    static_assert(detail::sm90_b_scales_of<128, 128>() == detail::sm90_b_scales::per_tile);
    static_assert(detail::sm90_b_scales_of<256, Cfg::BN>() == detail::sm90_b_scales::two_blocks);
    static_assert(detail::sm90_b_scales_of<64, Cfg::BN>() == detail::sm90_b_scales::per_column);  // crosses 3
    const std::size_t M = 70, K = 384;
    auto g = octet_test::rng(13);
    const auto ha = quantized<RA>(varied_blocks(g, M, K), M, K);
    const device_copy<RA> da(ha);
    const auto A = da.cref();
    auto run = [&](auto b_recipe, std::size_t N, std::size_t expected_tiles) {
        using RB = decltype(b_recipe);
        constexpr detail::sm90_b_scales mode = detail::sm90_b_scales_of<RB::granularity::rows, Cfg::BN>();
        CAPTURE(N);
        const auto hb = quantized<RB>(varied_blocks(g, N, K), N, K);
        std::vector<float> hd(M * N);
        scaled_gemm(on_host(), ha.cref(), hb.cref(), matrix_ref<float>(hd.data(), M, N));
        const device_copy<RB> db(hb);
        const auto B = db.cref();
        cuda::device_buffer<float> dd(M * N);
        auto kernel = detail::sm90_gemm_kernel<e4m3, e4m3, Cfg, mode, float, float>;
        OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::smem_bytes));
        detail::sm90_params<float, float> p = params<RA, RB, Cfg>(A, B, dd.data());
        CHECK(p.tiles_m * p.tiles_n == expected_tiles);
        dd.fill_bytes(0xFF);
        cuda::launch("sm90_gemm_kernel", kernel, 1, Cfg::threads, Cfg::smem_bytes, nullptr,
                     detail::sm90_operand_map(A.data, M, K, A.layout.row_bytes, Cfg::BM),
                     detail::sm90_operand_map(B.data, N, K, B.layout.row_bytes, Cfg::BN), CUtensorMap{}, CUtensorMap{},
                     CUtensorMap{}, p);
        return differing(dd.download(), hd);
    };
    CHECK(run(recipes::blockwise_128x128{}, 330, 2) == 0);
    CHECK(run(recipes::blockwise_128x128{}, 576, 3) == 0);  // splits at 128, 64, 128 (no ragged edge)
    CHECK(run(recipes::tensorwise_e4m3{}, 200, 2) == 0);
}

// Pairs of CTAs (clusters of two): each CTA loads A for its own tile and half of the pair's common B
// tile, which TMA multicasts into both CTAs' stages; consumers release a stage in both CTAs. Ragged M
// with an odd number of tile rows (the second CTA of the last pair computes a tile wholly below M,
// which is not stored), several K blocks, and one cluster walking every pair of tiles (persistent), on
// each tile configuration and each way B's scales vary across a tile: the host's bits. Then through
// the launcher, with the TMA-store epilogue and with split-K.
TEST_CASE("sm90_wgmma in clusters of two CTAs sharing B's tile by multicast gives the host's bits") {
    using RA = recipes::blockwise_1x128;
    const std::size_t K = 384;
    auto g = octet_test::rng(17);
    auto run = [&](auto config, auto b_recipe, std::size_t M, std::size_t N, std::uint32_t tiles_m) {
        using Cfg = decltype(config);
        using RB = decltype(b_recipe);
        constexpr detail::sm90_b_scales mode = detail::sm90_b_scales_of<RB::granularity::rows, Cfg::BN>();
        CAPTURE(Cfg::BN);
        CAPTURE(M);
        CAPTURE(N);
        const auto ha = quantized<RA>(varied_blocks(g, M, K), M, K);
        const auto hb = quantized<RB>(varied_blocks(g, N, K), N, K);
        std::vector<float> hd(M * N);
        scaled_gemm(on_host(), ha.cref(), hb.cref(), matrix_ref<float>(hd.data(), M, N));
        const device_copy<RA> da(ha);
        const device_copy<RB> db(hb);
        const auto A = da.cref();
        const auto B = db.cref();
        cuda::device_buffer<float> dd(M * N);
        auto kernel = detail::sm90_gemm_kernel<e4m3, e4m3, Cfg, mode, float, float>;
        OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::smem_bytes));
        detail::sm90_params<float, float> p = params<RA, RB, Cfg>(A, B, dd.data());
        REQUIRE(p.tiles_m == tiles_m);
        p.cluster = 2;
        dd.fill_bytes(0xFF);
        cuda::launch_cluster("sm90_gemm_kernel", kernel, dim3(2), dim3(Cfg::threads), dim3(2), Cfg::smem_bytes, nullptr,
                             detail::sm90_operand_map(A.data, M, K, A.layout.row_bytes, Cfg::BM),
                             detail::sm90_operand_map(B.data, N, K, B.layout.row_bytes, Cfg::BN / 2), CUtensorMap{},
                             CUtensorMap{}, CUtensorMap{}, p);
        return differing(dd.download(), hd);
    };
    // tile rows (3: a ragged pair) x tile columns, and how B's scales vary across a tile
    CHECK(run(detail::sm90_small{}, recipes::blockwise_1x128{}, 150, 72, 3) == 0);     // 3 x 2, per column
    CHECK(run(detail::sm90_large{}, recipes::blockwise_128x128{}, 300, 200, 3) == 0);  // 3 x 2, per tile
    CHECK(run(detail::sm90_wide{}, recipes::blockwise_128x128{}, 140, 330, 2) == 0);   // 2 x 2, two blocks
    CHECK(run(detail::sm90_large{}, recipes::blockwise_1x128{}, 130, 130, 2) == 0);    // 2 x 2, per column

    // the launcher: a grid of clusters, the TMA-store epilogue (D's rows 16-byte aligned), split-K
    const std::size_t M = 200, N = 136;
    const auto ha = quantized<RA>(varied_blocks(g, M, K), M, K);
    const auto hb = quantized<recipes::blockwise_128x128>(varied_blocks(g, N, K), N, K);
    std::vector<float> hd(M * N);
    scaled_gemm(on_host(), ha.cref(), hb.cref(), matrix_ref<float>(hd.data(), M, N));
    const device_copy<RA> da(ha);
    const device_copy<recipes::blockwise_128x128> db(hb);
    cuda::device_buffer<float> dd(M * N);
    const auto epi =
        detail::make_device_epilogue<float, float>(nullptr, matrix_ref<float>(dd.data(), M, N), gemm_options{});
    for (std::uint32_t splits : {1u, 3u}) {
        CAPTURE(splits);
        detail::sm90_plan plan;
        plan.tile = gemm_tile::m64n64;
        plan.cluster = 2;
        plan.splits = splits;
        plan.kb_per_split = 3 / splits;
        cuda::device_buffer<float> partial(std::max<std::size_t>(plan.scratch_bytes(M, N) / sizeof(float), 1));
        dd.fill_bytes(0xFF);
        detail::launch_sm90(nullptr, da.cref(), db.cref(), epi, plan, partial.data());
        CHECK(differing(dd.download(), hd) == 0);
    }
}

}  // namespace interpret_gemm_sm90_test
