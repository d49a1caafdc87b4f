// The wgmma model (octet/interpret/ptx_models.hpp, "wgmma") against the PTX ISA's definition of
// wgmma.mma_async.sync.aligned.m64nNk32.f32.{e4m3,e5m2}.{e4m3,e5m2} with both operands in shared memory:
// random FP8 A (64 x K) and B (N x K, K-major) placed in shared memory in the canonical layout of each
// swizzle mode (none, 32, 64, 128 bytes), descriptors encoded here from the ISA's bit layout, the
// accumulator fragment read back with the ISA's fragment layout, compared with a float64 oracle; then
// the misuses the model reports (and a swizzle mismatch it cannot see, which the oracle does).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "octet/cuda/ptx.cuh"
#include "octet/cuda/shared_memory.cuh"
#include "octet/format/encode.hpp"
#include "support/interpret_reports.hpp"
#include "support/random.hpp"

namespace ptx_wgmma_test {
namespace oi = octet::interpret;
using octet::e4m3;
using octet::e5m2;

using octet_test::all_messages;
using octet_test::collect;
using octet_test::has;

// ---- the ISA's descriptor and layouts, written out here --------------------------------------------

enum swizzle { none = 0, b128 = 1, b64 = 2, b32 = 3 };  // the descriptor's bits 62-63
unsigned width_of(swizzle s) {
    return s == b128 ? 128 : s == b64 ? 64 : s == b32 ? 32 : 0;
}

/// Bits 0-13: start address >> 4; 16-29: leading byte offset >> 4; 32-45: stride byte offset >> 4;
/// 49-51: base offset; 62-63: swizzle mode.
std::uint64_t descriptor(std::uint32_t start, std::uint32_t lbo, std::uint32_t sbo, swizzle s) {
    return (std::uint64_t{start} >> 4 & 0x3FFF) | (std::uint64_t{lbo} >> 4 & 0x3FFF) << 16 |
           (std::uint64_t{sbo} >> 4 & 0x3FFF) << 32 | std::uint64_t{static_cast<unsigned>(s)} << 62;
}

/// An operand of `rows` x `kbytes` FP8 codes, K-major, in the canonical layout of `s` at byte `base`
/// of the shared image. No swizzle: 8 x 16-byte core matrices, (r / 8) sbo + (k / 16) lbo apart.
/// T-byte swizzle: 8-row atoms sbo = 8 T apart, rows T bytes apart, and the 16-byte chunk j of row r of
/// an atom stored at chunk j XOR ((r mod 8) / (128 / T)) (the ISA's swizzle pictures; TMA's layout).
struct placement {
    swizzle s;
    std::uint32_t base, lbo, sbo;
    std::uint32_t offset(unsigned r, unsigned k) const {
        if (s == none) return base + (r / 8) * sbo + (k / 16) * lbo + (r % 8) * 16 + k % 16;
        const unsigned T = width_of(s);
        const unsigned chunk = (k / 16) ^ ((r % 8) / (128 / T));
        return base + (r / 8) * sbo + (r % 8) * T + chunk * 16 + k % 16;
    }
    /// The descriptor of the K step kstep (32 bytes of K): swizzled rows advance the start address by
    /// 32 bytes inside the row; unswizzled ones by two core matrices along K.
    std::uint64_t desc(unsigned kstep) const {
        const std::uint32_t start = s == none ? base + 2 * kstep * lbo : base + 32 * kstep;
        return descriptor(start, s == none ? lbo : 0, sbo, s);
    }
};

template <class F>
std::uint8_t random_code(std::mt19937_64& g) {
    while (true) {  // finite codes (the NaN and Inf case sets its specials where it wants them)
        const auto c = static_cast<std::uint8_t>(g());
        if (std::isfinite(octet::decode<F>(c))) return c;
    }
}

// ---- the kernel ------------------------------------------------------------------------------------

enum misuse {
    ok = 0,
    no_fence,
    write_in_flight,
    read_in_flight,
    nonuniform_desc,
    warps_disagree,
    short_image,
    warp_exits,
    no_proxy_fence
};

/// One warpgroup: copies `image` into dynamic shared memory (fence.proxy.async, barrier), then fence,
/// `steps` mma_async (the first with scale-d = scale0, the others 1) on descs[2 s], descs[2 s + 1],
/// commit, wait 0, and stores its accumulator fragment to d_out (d_in the initial registers).
template <int N, class FA, class FB>
__global__ void wgmma_kernel(const std::uint8_t* image, unsigned bytes, const std::uint64_t* descs, int steps,
                             std::uint32_t scale0, const float* d_in, float* d_out, int how) {
    OCTET_DYNAMIC_SHARED(std::uint8_t, smem);
    const unsigned copy = how == short_image ? bytes / 2 : bytes;  // short_image: B never written
    for (unsigned i = threadIdx.x; i < copy; i += blockDim.x) smem[i] = image[i];
    if (how != no_proxy_fence) octet::ptx::fence_proxy_async_shared();  // generic writes, for wgmma's reads
    __syncthreads();
    const unsigned t = threadIdx.x;
    if (how == warp_exits && t / 32 == 3) return;
    float d[N / 2];
    for (int i = 0; i < N / 2; ++i) d[i] = d_in[t * (N / 2) + i];
    if (how != no_fence && !(how == warps_disagree && t / 32 == 1)) octet::ptx::wgmma_fence();
    for (int s = 0; s < steps; ++s) {
        std::uint64_t da = descs[2 * s];
        if (how == nonuniform_desc && t == 37) da += 1;
        octet::ptx::wgmma_m64nNk32<N, FA, FB>(d, da, descs[2 * s + 1], s > 0 ? 1u : scale0);
    }
    if (how == write_in_flight) d[3] = 1.0f;
    if (how == read_in_flight) d_out[t * (N / 2)] = d[0];
    octet::ptx::wgmma_commit_group();
    octet::ptx::wgmma_wait_group<0>();
    for (int i = (how == read_in_flight ? 1 : 0); i < N / 2; ++i) d_out[t * (N / 2) + i] = d[i];
}

/// The RS form's A registers (the ISA's register fragment of A for 8-bit types, m64nNk32): thread t of
/// the warpgroup, warp w = t / 32, lane 4 g + u; byte b of register r is A[m][k] with
/// m = 16 w + g + 8 (r % 2), k = 16 (r / 2) + 4 u + b.
unsigned rs_row(unsigned t, int r) {
    return 16 * (t / 32) + (t % 32) / 4 + 8 * static_cast<unsigned>(r % 2);
}
unsigned rs_k(unsigned t, int r, int b) {
    return 16 * static_cast<unsigned>(r / 2) + 4 * (t % 4) + static_cast<unsigned>(b);
}

enum rs_misuse { rs_ok = 0, rs_no_fence, rs_mixed_forms };

/// The RS form: A (64 x K codes, row-major in global memory) into registers per K step, B from shared
/// memory; fence, `steps` mma_async (scale-d = scale0, then 1), commit, wait 0, store the fragment.
/// rs_no_fence: no fence;
/// rs_mixed_forms: warp 2 issues the SS form with descs[0] as A while the others issue RS.
template <int N, class FA, class FB>
__global__ void wgmma_rs_kernel(const std::uint8_t* image, unsigned bytes, const std::uint8_t* a_codes, unsigned K,
                                const std::uint64_t* descs, int steps, std::uint32_t scale0, const float* d_in,
                                float* d_out, int how) {
    OCTET_DYNAMIC_SHARED(std::uint8_t, smem);
    for (unsigned i = threadIdx.x; i < bytes; i += blockDim.x) smem[i] = image[i];
    octet::ptx::fence_proxy_async_shared();
    __syncthreads();
    const unsigned t = threadIdx.x;
    float d[N / 2];
    for (int i = 0; i < N / 2; ++i) d[i] = d_in[t * (N / 2) + i];
    std::uint32_t a[4][4];  // [K step][register]
    auto fill = [&](int s) {
        for (int r = 0; r < 4; ++r) {
            std::uint32_t v = 0;
            for (int b = 0; b < 4; ++b)
                v |= std::uint32_t{a_codes[rs_row(t, r) * K + 32 * static_cast<unsigned>(s) + rs_k(t, r, b)]}
                     << (8 * b);
            a[s][r] = v;
        }
    };
    for (int s = 0; s < steps; ++s) fill(s);
    if (how != rs_no_fence) octet::ptx::wgmma_fence();
    for (int s = 0; s < steps; ++s) {
        if (how == rs_mixed_forms && t / 32 == 2)
            octet::ptx::wgmma_m64nNk32<N, FA, FB>(d, descs[0], descs[2 * s + 1], s > 0 ? 1u : scale0);
        else
            octet::ptx::wgmma_m64nNk32<N, FA, FB>(d, a[s], descs[2 * s + 1], s > 0 ? 1u : scale0);
    }
    octet::ptx::wgmma_commit_group();
    octet::ptx::wgmma_wait_group<0>();
    for (int i = 0; i < N / 2; ++i) d_out[t * (N / 2) + i] = d[i];
}

// ---- the oracle --------------------------------------------------------------------------------------

template <int N, class FA, class FB>
struct problem {
    static constexpr std::uint32_t image_bytes = 32768, a_base = 0, b_base = 16384;
    unsigned K = 0;                  // bytes of K: 32 per step
    std::vector<std::uint8_t> a, b;  // row-major codes: a[r * K + k], b[c * K + k]
    std::vector<std::uint8_t> image = std::vector<std::uint8_t>(image_bytes);
    std::vector<float> d_in = std::vector<float>(128 * (N / 2));
    placement pa{}, pb{};

    problem(std::mt19937_64& g, swizzle s) {
        K = s == none ? 64 : width_of(s);
        a.resize(64 * K);
        b.resize(N * K);
        for (auto& c : a) c = random_code<FA>(g);
        for (auto& c : b) c = random_code<FB>(g);
        std::uniform_real_distribution<float> u(-4.0f, 4.0f);
        for (auto& x : d_in) x = u(g);
        const unsigned kcores = K / 16;
        if (s == none) {
            pa = {none, a_base, 128, 128 * kcores};   // A: a row group's K core matrices side by side
            pb = {none, b_base, 128 * (N / 8), 128};  // B: a K chunk's row groups side by side
        } else {
            pa = {s, a_base, 0, 8 * width_of(s)};
            pb = {s, b_base, 0, 8 * width_of(s)};
        }
        for (unsigned r = 0; r < 64; ++r)
            for (unsigned k = 0; k < K; ++k) image[pa.offset(r, k)] = a[r * K + k];
        for (unsigned c = 0; c < static_cast<unsigned>(N); ++c)
            for (unsigned k = 0; k < K; ++k) image[pb.offset(c, k)] = b[c * K + k];
    }
    int steps() const { return static_cast<int>(K / 32); }
    std::vector<std::uint64_t> descs(int steps_, const placement& qa, const placement& qb) const {
        std::vector<std::uint64_t> v;
        for (int s = 0; s < steps_; ++s) {
            v.push_back(qa.desc(static_cast<unsigned>(s)));
            v.push_back(qb.desc(static_cast<unsigned>(s)));
        }
        return v;
    }
    /// D[row][col] = sum_k A[row][k] B[col][k] (+ d_in), float64, and sum |terms| for the tolerance.
    void oracle(unsigned t, int i, bool accumulate, double* value, double* magnitude) const {
        const unsigned l = t % 32;  // the ISA's m64nNk32 f32 accumulator fragment
        const unsigned row = row_of(t, i), col = 8 * (i / 4) + 2 * (l % 4) + i % 2;
        double sum = 0, mag = 0;
        for (unsigned k = 0; k < K; ++k) {
            const double p = static_cast<double>(octet::decode<FA>(a[row * K + k])) *
                             static_cast<double>(octet::decode<FB>(b[col * K + k]));
            sum += p;
            mag += std::fabs(p);
        }
        if (accumulate) {
            const double d = d_in[t * (N / 2) + static_cast<unsigned>(i)];
            sum += d;
            mag += std::fabs(d);
        }
        *value = sum;
        *magnitude = mag;
    }
    oi::run_result run(const std::vector<std::uint64_t>& descs_, int steps_, std::uint32_t scale0,
                       std::vector<float>& out, int how = ok, const oi::options& opt = collect()) const {
        out.assign(128 * (N / 2), -7.0f);
        return oi::launch("wgmma", {oi::dim3(1), oi::dim3(128), image_bytes}, opt, wgmma_kernel<N, FA, FB>,
                          image.data(), image_bytes, descs_.data(), steps_, scale0, d_in.data(), out.data(), how);
    }
    /// The RS form on the same A (from the codes, not the image) and B.
    oi::run_result run_rs(const std::vector<std::uint64_t>& descs_, int steps_, std::uint32_t scale0,
                          std::vector<float>& out, int how = rs_ok, const oi::options& opt = collect()) const {
        out.assign(128 * (N / 2), -7.0f);
        return oi::launch("wgmma_rs", {oi::dim3(1), oi::dim3(128), image_bytes}, opt, wgmma_rs_kernel<N, FA, FB>,
                          image.data(), image_bytes, a.data(), K, descs_.data(), steps_, scale0, d_in.data(),
                          out.data(), how);
    }
    /// How many accumulator elements differ from the oracle by more than float rounding of the steps
    /// (a NaN or infinite oracle value, IEEE arithmetic in float64 on the exact products, must be
    /// matched exactly: NaN by NaN, an infinity by itself).
    int mismatches(const std::vector<float>& out, bool accumulate) const {
        int bad = 0;
        for (unsigned t = 0; t < 128; ++t)
            for (int i = 0; i < N / 2; ++i) {
                double v, m;
                oracle(t, i, accumulate, &v, &m);
                const float got = out[t * (N / 2) + static_cast<unsigned>(i)];
                if (std::isnan(v)) {
                    bad += !std::isnan(got);
                } else if (std::isinf(v)) {
                    bad += static_cast<double>(got) != v;
                } else {
                    const double tol = 4 * std::ldexp(m, -24) + 1e-30;
                    bad += !(std::fabs(got - v) <= tol);
                }
            }
        return bad;
    }
    /// Element (r, k) of A, or (c, k) of B, set to `code`, in the codes and the shared image.
    void set_a(unsigned r, unsigned k, std::uint8_t code) { image[pa.offset(r, k)] = a[r * K + k] = code; }
    void set_b(unsigned c, unsigned k, std::uint8_t code) { image[pb.offset(c, k)] = b[c * K + k] = code; }
    /// The accumulator row of fragment element i of thread t (the ISA's layout).
    static unsigned row_of(unsigned t, int i) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2); }
};

template <int N, class FA, class FB>
void check_all_swizzles(std::uint64_t salt) {
    auto g = octet_test::rng(salt);
    for (swizzle s : {none, b32, b64, b128}) {
        CAPTURE(N);
        CAPTURE(octet::format_name<FA>());
        CAPTURE(octet::format_name<FB>());
        CAPTURE(static_cast<int>(s));
        const problem<N, FA, FB> p(g, s);
        for (std::uint32_t scale0 : {0u, 1u}) {
            std::vector<float> out;
            const auto r = p.run(p.descs(p.steps(), p.pa, p.pb), p.steps(), scale0, out);
            CHECK_MESSAGE(r.clean(), all_messages(r));
            CHECK(p.mismatches(out, scale0 != 0) == 0);
        }
    }
}

TEST_CASE("wgmma m64nNk32: all FP8 type pairs, every swizzle mode, against a float64 oracle") {
    check_all_swizzles<32, e4m3, e4m3>(9000);
    check_all_swizzles<64, e4m3, e4m3>(9001);
    check_all_swizzles<64, e4m3, e5m2>(9002);
    check_all_swizzles<64, e5m2, e4m3>(9003);
    check_all_swizzles<64, e5m2, e5m2>(9004);
    check_all_swizzles<128, e4m3, e4m3>(9005);
    check_all_swizzles<128, e4m3, e5m2>(9006);
    check_all_swizzles<128, e5m2, e4m3>(9007);
    check_all_swizzles<128, e5m2, e5m2>(9008);
}

TEST_CASE("wgmma: NaN and Inf operands and accumulators give IEEE results on the exact products (SS and RS)") {
    // E5M2: +Inf 0x7C, -Inf 0xFC, NaN 0x7F, +1 0x3C, -1 0xBC, +0 0x00; E4M3: NaN 0x7F / 0xFF (no Inf).
    CHECK(octet::decode<e5m2>(0x7C) == INFINITY);
    CHECK(octet::decode<e5m2>(0xFC) == -INFINITY);
    CHECK(std::isnan(octet::decode<e5m2>(0x7F)));
    CHECK(std::isnan(octet::decode<e4m3>(0x7F)));
    CHECK(std::isnan(octet::decode<e4m3>(0xFF)));
    auto g = octet_test::rng(9050);
    {
        problem<64, e5m2, e5m2> p(g, b64);  // K = 64: two K steps
        p.set_a(0, 40, 0x7F);               // row 0: a NaN operand (second K step)
        p.set_a(1, 3, 0x7C);                // row 1: +Inf times +1 / -1 / 0 -> +Inf / -Inf / NaN
        for (unsigned c = 0; c < 64; ++c) p.set_b(c, 3, c % 3 == 0 ? 0x00 : c % 3 == 1 ? 0x3C : 0xBC);
        p.set_a(2, 10, 0x7C);  // row 2: +Inf and -Inf in one K step: NaN where both products are
        p.set_a(2, 11, 0xFC);  // infinite with opposite signs, an infinity where they agree
        p.set_a(5, 33, 0xFC);  // row 5: -Inf in the second step, then the accumulator below
        for (unsigned t = 0; t < 128; ++t)
            for (int i = 0; i < 32; ++i) {
                const unsigned row = p.row_of(t, i);
                if (row == 4 || row == 5) p.d_in[t * 32 + static_cast<unsigned>(i)] = INFINITY;  // +Inf accumulator
            }
        for (std::uint32_t scale0 : {0u, 1u}) {
            CAPTURE(scale0);
            std::vector<float> out;
            const auto r = p.run(p.descs(p.steps(), p.pa, p.pb), p.steps(), scale0, out);
            CHECK_MESSAGE(r.clean(), all_messages(r));
            CHECK(p.mismatches(out, scale0 != 0) == 0);
            int nan = 0, inf = 0;  // the oracle's specials really occur
            for (float v : out) nan += std::isnan(v), inf += std::isinf(v);
            CHECK(nan > 64);
            CHECK(inf > 32);
            // the RS form (A from registers) on the same operands
            const auto rr = p.run_rs(p.descs(p.steps(), p.pa, p.pb), p.steps(), scale0, out);
            CHECK_MESSAGE(rr.clean(), all_messages(rr));
            CHECK(p.mismatches(out, scale0 != 0) == 0);
        }
    }
    {
        problem<64, e4m3, e4m3> p(g, b128);  // K = 128: four K steps
        p.set_a(7, 100, 0x7F);               // row 7: NaN
        p.set_b(9, 64, 0xFF);                // column 9: NaN (negative-signed code)
        std::vector<float> out;
        const auto r = p.run(p.descs(p.steps(), p.pa, p.pb), p.steps(), 1, out);
        CHECK_MESSAGE(r.clean(), all_messages(r));
        CHECK(p.mismatches(out, true) == 0);
        int nan = 0;
        for (float v : out) nan += std::isnan(v);
        CHECK(nan == 64 + 64 - 1);
        const auto rr = p.run_rs(p.descs(p.steps(), p.pa, p.pb), p.steps(), 1, out);
        CHECK_MESSAGE(rr.clean(), all_messages(rr));
        CHECK(p.mismatches(out, true) == 0);
    }
}

TEST_CASE("wgmma descriptor: ptx::wgmma_descriptor encodes the ISA's bit layout") {
    octet::ptx::wgmma_descriptor d;
    d.start = 0x2A40;
    d.leading = 0x180;
    d.stride = 0x400;
    d.swizzle = octet::ptx::wgmma_swizzle::b64;
    CHECK(d.encode() == descriptor(0x2A40, 0x180, 0x400, b64));
    d.base_offset = 5;
    CHECK(d.encode() == (descriptor(0x2A40, 0x180, 0x400, b64) | std::uint64_t{5} << 49));
    d.start = 0x2A48;  // not 16-byte aligned: outside a launch an error
    CHECK_THROWS_AS((void)d.encode(), octet::interpret::error);
}

TEST_CASE("wgmma: a swizzle mode that does not match the layout gives a wrong product (seen by the oracle)") {
    auto g = octet_test::rng(9100);
    const problem<128, e4m3, e4m3> p(g, b128);
    std::vector<float> out;
    // data in the 128-byte layout, read as 64-byte swizzled and as unswizzled rows: the model cannot know
    // (every byte it reads is initialised and in bounds), the product is wrong
    for (swizzle wrong : {b64, none}) {
        placement qa = p.pa, qb = p.pb;
        qa.s = qb.s = wrong;
        if (wrong == none) {  // 128-byte rows read as core matrices: LBO 16 keeps the reads in the tile
            qa.lbo = qb.lbo = 16;
        }
        const auto r = p.run(p.descs(1, qa, qb), 1, 0, out);
        CHECK_MESSAGE(r.clean(), all_messages(r));
        // the first K step (32 bytes) in the right mode
        std::vector<float> right;
        const auto rr = p.run(p.descs(1, p.pa, p.pb), 1, 0, right);
        CHECK(rr.clean());
        int differ = 0;
        for (std::size_t i = 0; i < out.size(); ++i) differ += out[i] != right[i];
        CHECK(differ > static_cast<int>(out.size()) / 2);
    }
    // and the right mode over all four K steps matches the oracle
    const auto r = p.run(p.descs(4, p.pa, p.pb), 4, 0, out);
    CHECK(r.clean());
    CHECK(p.mismatches(out, false) == 0);
}

TEST_CASE("wgmma: misuse is reported") {
    auto g = octet_test::rng(9200);
    const problem<64, e4m3, e5m2> p(g, b128);
    const auto descs = p.descs(p.steps(), p.pa, p.pb);
    std::vector<float> out;
    {  // descriptor past the shared window: out-of-bounds reads, attributed to the reading thread
        std::vector<std::uint64_t> far = descs;
        far[0] = descriptor(0x3F000, 0, 1024, b128);
        const auto r = p.run(far, 1, 0, out);
        REQUIRE(has(r, oi::check::out_of_bounds));
        CHECK(all_messages(r).find("kernel wgmma") != std::string::npos);
    }
    {  // B never written: uninitialised reads
        const auto r = p.run(descs, p.steps(), 0, out, short_image);
        CHECK(has(r, oi::check::uninitialized_read));
    }
    {  // the operands written by the threads without fence.proxy.async: the async proxy may not see them
        const auto r = p.run(descs, p.steps(), 0, out, no_proxy_fence);
        REQUIRE(has(r, oi::check::async_proxy));
        CHECK(all_messages(r).find("without a fence.proxy.async") != std::string::npos);
    }
    {  // no wgmma.fence before the first mma_async
        const auto r = p.run(descs, p.steps(), 0, out, no_fence);
        REQUIRE(has(r, oi::check::ptx_misuse));
        CHECK(all_messages(r).find("no wgmma.fence") != std::string::npos);
    }
    {  // an accumulator register written while the mma_async is in flight
        const auto r = p.run(descs, p.steps(), 0, out, write_in_flight);
        REQUIRE(has(r, oi::check::ptx_misuse));
        CHECK(all_messages(r).find("written before the wgmma.wait_group") != std::string::npos);
    }
    {  // read while in flight: not reported, but the value read is NaN; the rest lands at the wait
        const auto r = p.run(descs, p.steps(), 1, out, read_in_flight);
        CHECK(r.clean());
        for (unsigned t = 0; t < 128; ++t) CHECK(std::isnan(out[t * 32]));
        CHECK(std::isfinite(out[1]));
    }
    {  // descriptors that differ across the warpgroup
        const auto r = p.run(descs, p.steps(), 0, out, nonuniform_desc);
        REQUIRE(has(r, oi::check::warp_sync));
        CHECK(all_messages(r).find("thread 37") != std::string::npos);
    }
    {  // warp 1 skips the fence the others execute: the warpgroup reaches different instructions
        const auto r = p.run(descs, p.steps(), 0, out, warps_disagree);
        REQUIRE(has(r, oi::check::warp_sync));
        CHECK(all_messages(r).find("wgmma.fence") != std::string::npos);
    }
    {  // warp 3 exits before the warpgroup's fence: the other three wait for it for ever
        const auto r = p.run(descs, p.steps(), 0, out, warp_exits);
        REQUIRE(has(r, oi::check::deadlock));
        CHECK(all_messages(r).find("wgmma.fence.sync.aligned") != std::string::npos);
    }
    {  // a warpgroup instruction in a block of 64 threads
        const auto r = oi::launch("wgmma_small", {oi::dim3(1), oi::dim3(64), p.image_bytes}, collect(),
                                  wgmma_kernel<64, e4m3, e5m2>, p.image.data(), p.image_bytes, descs.data(), p.steps(),
                                  0u, p.d_in.data(), out.data(), static_cast<int>(ok));
        CHECK(has(r, oi::check::warp_sync));
    }
}

template <int N, class FA, class FB>
void check_rs(std::uint64_t salt) {
    auto g = octet_test::rng(salt);
    for (swizzle s : {none, b64, b128}) {  // B's layouts; K = 64 or 128: two or four K steps of A registers
        CAPTURE(N);
        CAPTURE(octet::format_name<FA>());
        CAPTURE(octet::format_name<FB>());
        CAPTURE(static_cast<int>(s));
        const problem<N, FA, FB> p(g, s);
        for (std::uint32_t scale0 : {0u, 1u}) {
            std::vector<float> out, ss;
            const auto r = p.run_rs(p.descs(p.steps(), p.pa, p.pb), p.steps(), scale0, out);
            CHECK_MESSAGE(r.clean(), all_messages(r));
            CHECK(p.mismatches(out, scale0 != 0) == 0);
            // and the same bits as the SS form on the same operands
            const auto rs = p.run(p.descs(p.steps(), p.pa, p.pb), p.steps(), scale0, ss);
            CHECK(rs.clean());
            CHECK(std::memcmp(out.data(), ss.data(), out.size() * sizeof(float)) == 0);
        }
    }
}

TEST_CASE("wgmma m64nNk32 with A from registers: all FP8 type pairs against a float64 oracle") {
    check_rs<32, e4m3, e5m2>(9300);
    check_rs<64, e4m3, e4m3>(9301);
    check_rs<64, e4m3, e5m2>(9302);
    check_rs<64, e5m2, e4m3>(9303);
    check_rs<64, e5m2, e5m2>(9304);
    check_rs<128, e4m3, e4m3>(9305);
    check_rs<128, e5m2, e5m2>(9306);
}

TEST_CASE("wgmma with A from registers: a register layout other than the ISA's gives wrong results") {
    // A whose rows differ only in row 8 of each warp's 16: with rows g and g + 8 swapped in the
    // registers (the layout a wrong fragment convention would give), the oracle sees it
    auto g = octet_test::rng(9310);
    problem<64, e4m3, e4m3> p(g, b64);
    std::vector<float> out;
    const auto r = p.run_rs(p.descs(p.steps(), p.pa, p.pb), p.steps(), 0, out);
    REQUIRE(r.clean());
    REQUIRE(p.mismatches(out, false) == 0);
    // the oracle with A's rows g and g + 8 of every warp exchanged disagrees almost everywhere
    problem<64, e4m3, e4m3> swapped = p;
    for (unsigned row = 0; row < 64; ++row)
        for (unsigned k = 0; k < p.K; ++k) swapped.a[row * p.K + k] = p.a[(row ^ 8u) * p.K + k];
    CHECK(swapped.mismatches(out, false) > 128 * 32 / 2);
}

TEST_CASE("wgmma with A from registers: misuse is reported") {
    auto g = octet_test::rng(9320);
    const problem<64, e4m3, e5m2> p(g, b128);
    const auto descs = p.descs(p.steps(), p.pa, p.pb);
    std::vector<float> out;
    {  // no wgmma.fence after writing A's registers
        const auto r = p.run_rs(descs, p.steps(), 0, out, rs_no_fence);
        REQUIRE(has(r, oi::check::ptx_misuse));
        CHECK(all_messages(r).find("no wgmma.fence") != std::string::npos);
    }
    {  // one warp issues the SS form while the others issue RS: different instructions
        const auto r = p.run_rs(descs, p.steps(), 0, out, rs_mixed_forms);
        REQUIRE(has(r, oi::check::warp_sync));
        CHECK(all_messages(r).find("A in registers") != std::string::npos);
    }
}

}  // namespace ptx_wgmma_test
