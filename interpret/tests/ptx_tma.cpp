// The TMA model (octet::ptx::tma_load_2d, the interpret runtime's cuTensorMapEncodeTiled) and
// setmaxnreg, against the CUDA documentation, independently of octet's kernels: the encoder's
// argument rules; 2-D boxes at the edges and inside of random matrices, for each swizzle mode,
// compared with an oracle written from the documented layout (rows of the box one after another,
// 16-byte chunks XORed with the 128-byte line index modulo span / 16, zeros outside the tensor);
// the copy's completion on an mbarrier (expect_tx), and the broken variants: too many expected
// bytes (deadlock), too few (negative tx-count), reading the tile without waiting (race), a
// misaligned destination and a map the encoder did not make. fence.proxy.async: generic writes an
// async-proxy read sees need their writer's fence. setmaxnreg: warpgroup-collective.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "octet/cuda/ptx.cuh"
#include "octet/cuda/shared_memory.cuh"
#include "support/interpret_reports.hpp"

namespace ptx_tma_test {
namespace oi = octet::interpret;
namespace ptx = octet::ptx;

using octet_test::all_messages;
using octet_test::collect;
using octet_test::first;
using octet_test::has;

using encode_fn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                               const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                               CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
/// The encoder as a program finds it: through the runtime's driver entry point.
encode_fn encoder() {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    REQUIRE(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
            cudaSuccess);
    REQUIRE(q == cudaDriverEntryPointSuccess);
    REQUIRE(p != nullptr);
    return reinterpret_cast<encode_fn>(p);
}

CUtensorMapSwizzle swizzle_of(unsigned span) {
    return span == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
           : span == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
           : span == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                        : CU_TENSOR_MAP_SWIZZLE_NONE;
}

TEST_CASE("cuTensorMapEncodeTiled (interpret mode) accepts what the driver documents and rejects the rest") {
    const encode_fn enc = encoder();
    alignas(16) static std::uint8_t data[64 * 1024];
    CUtensorMap map{};
    const cuuint32_t es[2] = {1, 1};
    auto encode = [&](void* base, cuuint64_t d0, cuuint64_t d1, cuuint64_t stride, cuuint32_t b0, cuuint32_t b1,
                      CUtensorMapSwizzle sw, CUtensorMapDataType t = CU_TENSOR_MAP_DATA_TYPE_UINT8,
                      const cuuint32_t* e = nullptr) {
        const cuuint64_t dims[2] = {d0, d1}, strides[1] = {stride};
        const cuuint32_t box[2] = {b0, b1};
        return enc(&map, t, 2, base, dims, strides, box, e ? e : es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
                   CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    };
    CHECK(encode(data, 200, 100, 208, 128, 64, CU_TENSOR_MAP_SWIZZLE_128B) == CUDA_SUCCESS);
    CHECK(encode(data, 200, 100, 208, 64, 256, CU_TENSOR_MAP_SWIZZLE_NONE) == CUDA_SUCCESS);
    CHECK(encode(data + 8, 200, 100, 208, 128, 64, CU_TENSOR_MAP_SWIZZLE_128B) == CUDA_ERROR_INVALID_VALUE);  // base
    CHECK(encode(data, 200, 100, 200, 128, 64, CU_TENSOR_MAP_SWIZZLE_128B) == CUDA_ERROR_INVALID_VALUE);  // stride % 16
    CHECK(encode(data, 200, 100, 192, 128, 64, CU_TENSOR_MAP_SWIZZLE_128B) == CUDA_ERROR_INVALID_VALUE);  // < row
    CHECK(encode(data, 200, 100, 208, 128, 257, CU_TENSOR_MAP_SWIZZLE_NONE) == CUDA_ERROR_INVALID_VALUE);  // box > 256
    CHECK(encode(data, 200, 100, 208, 0, 8, CU_TENSOR_MAP_SWIZZLE_NONE) == CUDA_ERROR_INVALID_VALUE);      // box 0
    CHECK(encode(data, 200, 100, 208, 8, 8, CU_TENSOR_MAP_SWIZZLE_NONE) == CUDA_ERROR_INVALID_VALUE);   // 8 bytes % 16
    CHECK(encode(data, 200, 100, 208, 128, 8, CU_TENSOR_MAP_SWIZZLE_64B) == CUDA_ERROR_INVALID_VALUE);  // > span
    CHECK(encode(data, 0, 100, 208, 128, 8, CU_TENSOR_MAP_SWIZZLE_NONE) == CUDA_ERROR_INVALID_VALUE);   // dim 0
    const cuuint32_t es9[2] = {9, 1};
    CHECK(encode(data, 200, 100, 208, 128, 8, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_DATA_TYPE_UINT8, es9) ==
          CUDA_ERROR_INVALID_VALUE);
    {
        const cuuint64_t dims[2] = {64, 64}, strides[1] = {128};
        const cuuint32_t box[2] = {16, 16};
        CHECK(enc(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, data, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA) == CUDA_ERROR_INVALID_VALUE);  // NaN fill, ints
        CHECK(enc(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 6, data, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_ERROR_INVALID_VALUE);  // rank 6
    }
    void* other = &map;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSuccess;
    CHECK(cudaGetDriverEntryPointByVersion("cuMemAlloc", &other, 12000, cudaEnableDefault, &q) == cudaSuccess);
    CHECK(q == cudaDriverEntryPointSymbolNotFound);
    CHECK(other == nullptr);
}

enum class variant { correct, too_many_bytes, too_few_bytes, read_before_wait, misaligned };

/// One block of 128 threads: thread 0 initialises the mbarrier (one arrival), issues the box load and
/// arrives expecting its bytes; every thread waits for phase 0 and copies the tile's shared bytes
/// (as they lie, swizzled) to `out`.
void load_kernel(const CUtensorMap map, std::int32_t c0, std::int32_t c1, std::uint32_t bytes, std::uint8_t* out,
                 variant v) {
    OCTET_DYNAMIC_SHARED(std::uint8_t, smem);
    OCTET_SHARED(std::uint64_t, bar);
    const unsigned t = threadIdx.x;
    const std::uint32_t b = ptx::shared_address(&bar);
    if (t == 0) {
        ptx::mbarrier_init(b, 1);
        ptx::fence_mbarrier_init();
    }
    __syncthreads();
    if (t == 0) {
        const std::uint32_t dst = ptx::shared_address(smem) + (v == variant::misaligned ? 64u : 0u);
        ptx::prefetch_tensormap(&map);
        ptx::tma_load_2d(dst, &map, c0, c1, b);  // before the expect_tx, as sm90_wgmma's producer does
        const std::uint32_t expect = v == variant::too_many_bytes  ? bytes + 16
                                     : v == variant::too_few_bytes ? bytes - 16
                                                                   : bytes;
        ptx::mbarrier_arrive_expect_tx(b, expect);
    }
    if (v != variant::read_before_wait) ptx::mbarrier_try_wait_parity(b, 0);
    for (std::uint32_t i = t; i < bytes; i += blockDim.x) out[i] = smem[i];
}

/// Where the documented layout puts byte `c` of box row `r` (rows `row_bytes` long) in shared memory,
/// for a swizzle span of 0 (none), 32, 64 or 128 bytes: the box's bytes in row order, then within each
/// 128-byte line of shared memory the 16-byte chunk index XORed with the line index modulo span / 16.
std::size_t oracle_offset(std::size_t r, std::size_t c, std::size_t row_bytes, unsigned span) {
    const std::size_t linear = r * row_bytes + c;
    if (span == 0) return linear;
    const std::size_t line = linear / 128, in_line = linear % 128;
    const std::size_t chunk = in_line / 16, chunks = span / 16;
    const std::size_t group = chunk / chunks, within = chunk % chunks;  // chunks permute inside a span
    return line * 128 + (group * chunks + (within ^ (line % chunks))) * 16 + in_line % 16;
}

struct load_case {
    unsigned span;  // 0, 32, 64, 128
    std::uint32_t elem, box0, box1;
};

TEST_CASE("cp.async.bulk.tensor.2d: boxes inside and at every edge equal the documented layout with zero fill") {
    std::mt19937 rng(77);
    const encode_fn enc = encoder();
    const load_case cases[] = {{128, 1, 128, 64}, {128, 2, 64, 16}, {0, 1, 128, 64}, {0, 4, 12, 24},
                               {64, 1, 64, 32},   {32, 2, 16, 24},  {0, 2, 40, 7}};
    for (const load_case& lc : cases) {
        const std::uint64_t d0 = 150, d1 = 90;  // elements per row, rows
        const std::uint64_t stride = (d0 * lc.elem + 16 + 15) / 16 * 16;
        std::vector<std::uint8_t> storage(stride * d1 + 64);
        auto* base = reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(storage.data()) + 15) &
                                                     ~std::uintptr_t{15});
        for (std::size_t i = 0; i < stride * d1; ++i) base[i] = static_cast<std::uint8_t>(rng() % 255 + 1);
        CUtensorMap map{};
        const cuuint64_t dims[2] = {d0, d1}, strides[1] = {stride};
        const cuuint32_t box[2] = {lc.box0, lc.box1}, es[2] = {1, 1};
        const CUtensorMapDataType type = lc.elem == 1   ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                         : lc.elem == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16
                                                        : CU_TENSOR_MAP_DATA_TYPE_UINT32;
        REQUIRE(enc(&map, type, 2, base, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle_of(lc.span),
                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS);
        const std::uint32_t row_bytes = lc.box0 * lc.elem, bytes = row_bytes * lc.box1;
        const std::int32_t b0 = static_cast<std::int32_t>(lc.box0), b1 = static_cast<std::int32_t>(lc.box1);
        const std::int32_t D0 = static_cast<std::int32_t>(d0), D1 = static_cast<std::int32_t>(d1);
        const std::pair<std::int32_t, std::int32_t> corners[] = {{0, 0},
                                                                 {-b0 / 2, -b1 / 3},
                                                                 {D0 - b0 / 2, D1 - b1 / 2},
                                                                 {D0 - b0, D1 - b1},
                                                                 {-3, D1 - 1},
                                                                 {D0 - 1, -5},
                                                                 {D0 + 4, 0},
                                                                 {-b0, -b1},
                                                                 {static_cast<std::int32_t>(rng() % 20), 9}};
        for (const auto& c : corners) {
            CAPTURE(lc.span);
            CAPTURE(lc.elem);
            CAPTURE(c.first);
            CAPTURE(c.second);
            std::vector<std::uint8_t> out(bytes, 0xEE);
            oi::options o = collect();
            const auto r = oi::launch("tma_load", {oi::dim3(1), oi::dim3(128), bytes}, o, load_kernel, map, c.first,
                                      c.second, bytes, out.data(), variant::correct);
            REQUIRE_MESSAGE(r.reports.empty(), all_messages(r));
            std::size_t bad = 0;
            for (std::uint32_t row = 0; row < lc.box1; ++row)
                for (std::uint32_t col = 0; col < row_bytes; ++col) {
                    const long long x = static_cast<long long>(c.first) + col / lc.elem,
                                    y = static_cast<long long>(c.second) + row;
                    const bool inside = x >= 0 && y >= 0 && x < D0 && y < D1;
                    const std::uint8_t want = inside ? base[static_cast<std::size_t>(y) * stride +
                                                            static_cast<std::size_t>(x) * lc.elem + col % lc.elem]
                                                     : 0;
                    bad += out[oracle_offset(row, col, row_bytes, lc.span)] != want;
                }
            CHECK(bad == 0);
        }
    }
}

oi::run_result run_variant(variant v, oi::on_report mode = oi::on_report::collect) {
    static std::vector<std::uint8_t> storage(64 * 64 + 16);
    auto* base =
        reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(storage.data()) + 15) & ~std::uintptr_t{15});
    for (std::size_t i = 0; i < 64 * 64; ++i) base[i] = static_cast<std::uint8_t>(i * 7 + 1);
    CUtensorMap map{};
    const cuuint64_t dims[2] = {64, 64}, strides[1] = {64};
    const cuuint32_t box[2] = {64, 16}, es[2] = {1, 1};
    REQUIRE(encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, base, dims, strides, box, es,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS);
    std::vector<std::uint8_t> out(1024);
    oi::options o;
    o.mode = mode;
    return oi::launch("tma_variant", {oi::dim3(1), oi::dim3(128), 2048}, o, load_kernel, map, 0, 8, 1024u, out.data(),
                      v);
}

TEST_CASE("cp.async.bulk.tensor: wrong expect_tx counts, a read before the wait, misalignment are reported") {
    auto r = run_variant(variant::correct);
    CHECK_MESSAGE(r.reports.empty(), all_messages(r));
    r = run_variant(variant::too_many_bytes);  // 16 bytes never arrive
    REQUIRE(has(r, oi::check::deadlock));
    CHECK(first(r, oi::check::deadlock).detail.find("16 transaction bytes missing") != std::string::npos);
    r = run_variant(variant::too_few_bytes);  // the copy completes 16 bytes more than expected
    REQUIRE(has(r, oi::check::mbarrier_misuse));
    CHECK(first(r, oi::check::mbarrier_misuse).detail.find("tx-count negative") != std::string::npos);
    CHECK(first(r, oi::check::mbarrier_misuse).thread.x == 0);
    r = run_variant(variant::read_before_wait);
    REQUIRE(has(r, oi::check::race));
    {  // the copy's writes are thread 0's: the race is between them and another thread's reads
        const auto& x = first(r, oi::check::race);
        CHECK((x.thread.x == 0 || x.detail.find("thread (0,0,0) wrote") != std::string::npos));
        CHECK(x.address.find("shared 0x") != std::string::npos);
    }
    r = run_variant(variant::misaligned);
    REQUIRE(has(r, oi::check::ptx_misuse));
    CHECK(first(r, oi::check::ptx_misuse).detail.find("aligned") != std::string::npos);
    CHECK_THROWS_AS(run_variant(variant::too_many_bytes, oi::on_report::raise), oi::failure);
}

TEST_CASE("cp.async.bulk.tensor: a tensor map the encoder did not make is reported") {
    CUtensorMap map{};
    std::vector<std::uint8_t> out(64);
    const auto r = oi::launch("tma_zero_map", {oi::dim3(1), oi::dim3(32), 1024}, collect(), load_kernel, map, 0, 0, 64u,
                              out.data(), variant::correct);
    REQUIRE(has(r, oi::check::ptx_misuse));
    CHECK(first(r, oi::check::ptx_misuse).detail.find("cuTensorMapEncodeTiled") != std::string::npos);
}

// ---- TMA stores ------------------------------------------------------------------------------------

enum class store_variant { correct, no_fence, no_wait, overwrite_before_wait };

/// One block of 128 threads fills the shared box with `box` (bytes as they lie, swizzled), fences, and
/// thread 0 stores it with TMA at (c0, c1), commits and waits for the read (the broken variants skip a
/// step, or overwrite the box between the store and the wait).
void store_kernel(const CUtensorMap map, std::int32_t c0, std::int32_t c1, std::uint32_t bytes, const std::uint8_t* box,
                  store_variant v) {
    OCTET_DYNAMIC_SHARED(std::uint8_t, smem);
    const unsigned t = threadIdx.x;
    for (std::uint32_t i = t; i < bytes; i += blockDim.x) smem[i] = box[i];
    if (v != store_variant::no_fence) ptx::fence_proxy_async_shared();
    __syncthreads();
    if (t == 0) {
        ptx::tma_store_2d(&map, c0, c1, ptx::shared_address(smem));
        ptx::bulk_commit_group();
    }
    if (v == store_variant::overwrite_before_wait) {
        __syncthreads();
        for (std::uint32_t i = t; i < bytes; i += blockDim.x) smem[i] = 0xAB;
        ptx::fence_proxy_async_shared();
        __syncthreads();
    }
    if (t == 0 && v != store_variant::no_wait) ptx::bulk_wait_group_read<0>();
}

TEST_CASE("cp.async.bulk.tensor.2d stores: boxes inside and at every edge write the documented layout, clipped") {
    std::mt19937 rng(78);
    const encode_fn enc = encoder();
    const load_case cases[] = {{128, 1, 128, 64}, {128, 4, 32, 64}, {128, 2, 64, 16}, {0, 4, 12, 24},
                               {64, 1, 64, 32},   {32, 2, 16, 24},  {0, 2, 40, 7}};
    for (const load_case& lc : cases) {
        const std::uint64_t d0 = 150, d1 = 90;
        const std::uint64_t stride = (d0 * lc.elem + 16 + 15) / 16 * 16;
        std::vector<std::uint8_t> storage(stride * d1 + 64);
        auto* base = reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(storage.data()) + 15) &
                                                     ~std::uintptr_t{15});
        CUtensorMap map{};
        const cuuint64_t dims[2] = {d0, d1}, strides[1] = {stride};
        const cuuint32_t boxd[2] = {lc.box0, lc.box1}, es[2] = {1, 1};
        const CUtensorMapDataType type = lc.elem == 1   ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                         : lc.elem == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16
                                                        : CU_TENSOR_MAP_DATA_TYPE_UINT32;
        REQUIRE(enc(&map, type, 2, base, dims, strides, boxd, es, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle_of(lc.span),
                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS);
        const std::uint32_t row_bytes = lc.box0 * lc.elem, bytes = row_bytes * lc.box1;
        const std::int32_t b0 = static_cast<std::int32_t>(lc.box0), b1 = static_cast<std::int32_t>(lc.box1);
        const std::int32_t D0 = static_cast<std::int32_t>(d0), D1 = static_cast<std::int32_t>(d1);
        const std::pair<std::int32_t, std::int32_t> corners[] = {{0, 0},
                                                                 {-b0 / 2, -b1 / 3},
                                                                 {D0 - b0 / 2, D1 - b1 / 2},
                                                                 {D0 - b0, D1 - b1},
                                                                 {-3, D1 - 1},
                                                                 {D0 - 1, -5},
                                                                 {D0 + 4, 0},
                                                                 {static_cast<std::int32_t>(rng() % 20), 9}};
        for (const auto& c : corners) {
            CAPTURE(lc.span);
            CAPTURE(lc.elem);
            CAPTURE(c.first);
            CAPTURE(c.second);
            for (std::size_t i = 0; i < stride * d1; ++i) base[i] = static_cast<std::uint8_t>(rng());
            const std::vector<std::uint8_t> before(base, base + stride * d1);
            std::vector<std::uint8_t> box(bytes);
            for (auto& x : box) x = static_cast<std::uint8_t>(rng());
            const auto r = oi::launch("tma_store", {oi::dim3(1), oi::dim3(128), bytes}, collect(), store_kernel, map,
                                      c.first, c.second, bytes, box.data(), store_variant::correct);
            REQUIRE_MESSAGE(r.reports.empty(), all_messages(r));
            std::size_t bad = 0, written = 0;
            for (std::size_t y = 0; y < d1; ++y)
                for (std::size_t xb = 0; xb < stride; ++xb) {
                    const long long col = static_cast<long long>(xb / lc.elem) - c.first,
                                    row = static_cast<long long>(y) - c.second;
                    const bool in_box = xb < d0 * lc.elem && col >= 0 && col < b0 && row >= 0 && row < b1;
                    const std::uint8_t want =
                        in_box ? box[oracle_offset(static_cast<std::size_t>(row),
                                                   static_cast<std::size_t>(col) * lc.elem + xb % lc.elem, row_bytes,
                                                   lc.span)]
                               : before[y * stride + xb];
                    written += in_box;
                    bad += base[y * stride + xb] != want;
                }
            CHECK(bad == 0);
            const bool overlaps = c.first < D0 && c.second < D1 && c.first + b0 > 0 && c.second + b1 > 0;
            CHECK((written > 0) == overlaps);
        }
    }
}

TEST_CASE("cp.async.bulk.tensor stores: a source without fence, no wait before exit, a reused source are reported") {
    static std::vector<std::uint8_t> storage(64 * 64 + 16);
    auto* base =
        reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(storage.data()) + 15) & ~std::uintptr_t{15});
    CUtensorMap map{};
    const cuuint64_t dims[2] = {64, 64}, strides[1] = {64};
    const cuuint32_t box[2] = {64, 16}, es[2] = {1, 1};
    REQUIRE(encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, base, dims, strides, box, es,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS);
    std::vector<std::uint8_t> src(1024, 0x11);
    auto run = [&](store_variant v) {
        std::fill(base, base + 64 * 64, std::uint8_t{0});
        return oi::launch("tma_store_variant", {oi::dim3(1), oi::dim3(128), 2048}, collect(), store_kernel, map, 0, 8,
                          1024u, src.data(), v);
    };
    auto r = run(store_variant::correct);
    CHECK_MESSAGE(r.reports.empty(), all_messages(r));
    CHECK(base[8 * 64] == 0x11);
    r = run(store_variant::no_fence);
    REQUIRE(has(r, oi::check::async_proxy));
    CHECK(first(r, oi::check::async_proxy).detail.find("cp.async.bulk.tensor.2d (store)") != std::string::npos);
    r = run(store_variant::no_wait);
    REQUIRE(has(r, oi::check::ptx_misuse));
    CHECK(first(r, oi::check::ptx_misuse).detail.find("1 TMA stores") != std::string::npos);
    CHECK(base[8 * 64] == 0);                       // dropped
    r = run(store_variant::overwrite_before_wait);  // the store reads its source as late as the wait
    CHECK_MESSAGE(r.reports.empty(), all_messages(r));
    CHECK(base[8 * 64] == 0xAB);
}

// ---- fence.proxy.async -----------------------------------------------------------------------------

/// Every thread writes its byte of a tile (generic proxy), fences or not, and after a barrier thread 0
/// reads the tile through the async proxy (what a wgmma operand read does, here the machine's hook).
void proxy_kernel(bool fence, bool write_after_fence) {
    OCTET_SHARED(std::uint8_t[128], tile);
    const unsigned t = threadIdx.x;
    tile[t] = static_cast<std::uint8_t>(t);
    if (fence) ptx::fence_proxy_async_shared();
    if (write_after_fence && t == 5) tile[t] = 7;  // a write after the fence is not covered by it
    __syncthreads();
    if (t == 0)
        oi::detail::running("test").async_proxy_read(ptx::shared_address(tile) + oi::detail::running("test").window,
                                                     128, "async read", oi::detail::site{__FILE__, __LINE__});
}

TEST_CASE("fence.proxy.async: generic writes read by the async proxy need their writer's fence") {
    auto r = oi::launch("proxy", {oi::dim3(1), oi::dim3(128)}, collect(), proxy_kernel, true, false);
    CHECK_MESSAGE(r.reports.empty(), all_messages(r));
    r = oi::launch("proxy", {oi::dim3(1), oi::dim3(128)}, collect(), proxy_kernel, false, false);
    REQUIRE(has(r, oi::check::async_proxy));
    CHECK(first(r, oi::check::async_proxy).detail.find("thread (0,0,0) wrote") != std::string::npos);
    r = oi::launch("proxy", {oi::dim3(1), oi::dim3(128)}, collect(), proxy_kernel, true, true);
    REQUIRE(has(r, oi::check::async_proxy));
    CHECK(first(r, oi::check::async_proxy).detail.find("thread (5,0,0) wrote") != std::string::npos);
}

// ---- setmaxnreg ------------------------------------------------------------------------------------

enum class regs { both, missing_warp, half_warp, mixed };
void setmaxnreg_kernel(regs v) {
    const unsigned t = threadIdx.x, warp = t / 32;
    switch (v) {
        case regs::both:  // warpgroup 0 gives registers away, warpgroup 1 takes them
            if (warp < 4)
                ptx::setmaxnreg_dec<40>();
            else
                ptx::setmaxnreg_inc<232>();
            break;
        case regs::missing_warp:
            if (warp != 2) ptx::setmaxnreg_dec<40>();
            break;
        case regs::half_warp:
            if (t % 32 < 16) ptx::setmaxnreg_dec<40>();
            break;
        case regs::mixed:
            if (warp == 1)
                ptx::setmaxnreg_dec<48>();
            else
                ptx::setmaxnreg_dec<40>();
            break;
    }
}

TEST_CASE("setmaxnreg: executed by whole warpgroups with one operand, else reported") {
    auto run = [](regs v) {
        return oi::launch("setmaxnreg", {oi::dim3(1), oi::dim3(256)}, collect(), setmaxnreg_kernel, v);
    };
    auto r = run(regs::both);
    CHECK_MESSAGE(r.reports.empty(), all_messages(r));
    r = run(regs::missing_warp);
    REQUIRE(has(r, oi::check::ptx_misuse));
    CHECK(first(r, oi::check::ptx_misuse).detail.find("not executed by warps 2") != std::string::npos);
    r = run(regs::half_warp);
    CHECK(has(r, oi::check::warp_sync));
    r = run(regs::mixed);
    REQUIRE(has(r, oi::check::ptx_misuse));
    CHECK(first(r, oi::check::ptx_misuse).detail.find("another warp of warpgroup 0") != std::string::npos);
}

}  // namespace ptx_tma_test
