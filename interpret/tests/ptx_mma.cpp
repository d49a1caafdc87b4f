// ptx::mma_m16n8k32 (mma.sync.aligned.m16n8k32.row.col.f32.{e4m3,e5m2}.{e4m3,e5m2}.f32) under the
// interpreter, checked against the PTX ISA, independently of octet's kernels: each lane builds its
// fragments from a 16 x 32 row-major A, a 32 x 8 column-major B and a 16 x 8 C with the ISA's
// formulas (written out here), and D is compared with a float64 reference computed from the OCP FP8
// definitions (also written out here): the exact sum S of the 32 products, rounded to double, plus c,
// rounded once to float, the rounding the model documents (octet/interpret/ptx_models.hpp). Misuse
// (a partial warp, lanes in different instructions) is reported by the warp collective.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "octet/cuda/ptx.cuh"
#include "octet/cuda/shared_memory.cuh"
#include "support/interpret_reports.hpp"
#include "support/random.hpp"

namespace ptx_mma_test {
namespace oi = octet::interpret;
using octet::e4m3;
using octet::e5m2;

using octet_test::all_messages;
using octet_test::collect;
using octet_test::has;

// ---- FP8 from the OCP 8-bit floating point specification -------------------------------------------

/// E4M3 (bias 7, no Inf, S.1111.111 is NaN) and E5M2 (bias 15, IEEE Inf and NaN) codes as doubles.
template <class F>
double fp8_value(std::uint8_t code) {
    constexpr bool is_e4m3 = std::is_same<F, e4m3>::value;
    constexpr int man_bits = is_e4m3 ? 3 : 2, bias = is_e4m3 ? 7 : 15, max_exp = is_e4m3 ? 15 : 31;
    const double sign = code & 0x80 ? -1.0 : 1.0;
    const int exp = (code & 0x7F) >> man_bits, man = code & ((1 << man_bits) - 1);
    if (is_e4m3 && exp == max_exp && man == (1 << man_bits) - 1) return std::numeric_limits<double>::quiet_NaN();
    if (!is_e4m3 && exp == max_exp)
        return man ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
    if (exp == 0) return sign * std::ldexp(man, 1 - bias - man_bits);
    return sign * std::ldexp((1 << man_bits) + man, exp - bias - man_bits);
}

struct problem {
    std::vector<std::uint8_t> a;  // 16 x 32, row-major: a[32 i + k]
    std::vector<std::uint8_t> b;  // 32 x 8, column-major: b[32 j + k]
    std::vector<float> c;         // 16 x 8, row-major
    problem() : a(16 * 32), b(32 * 8), c(16 * 8) {}
};

/// One lane's fragments, from the ISA's "Matrix fragments for mma.m16n8k32" (.e4m3/.e5m2), and both
/// forms of the instruction: d = a * b + c, and the accumulate form on a copy of c.
template <class FA, class FB>
__global__ void mma_kernel(const problem* p, float* d, float* d_acc) {
    const unsigned lane = threadIdx.x % 32, group = lane / 4, tig = lane % 4;
    std::uint32_t a[4] = {}, b[2] = {};
    float c[4], acc[4];
    for (unsigned i = 0; i < 16; ++i) {  // a_i: row groupID (i < 4 or 8 <= i < 12) else groupID + 8
        const unsigned row = (i < 4 || (i >= 8 && i < 12)) ? group : group + 8;
        const unsigned col = tig * 4 + (i & 3) + (i >= 8 ? 16 : 0);
        a[i / 4] |= static_cast<std::uint32_t>(p->a[32 * row + col]) << (8 * (i % 4));
    }
    for (unsigned i = 0; i < 8; ++i) {  // b_i: row threadID_in_group * 4 + (i & 3) (+ 16), column groupID
        const unsigned row = tig * 4 + (i & 3) + (i >= 4 ? 16 : 0);
        b[i / 4] |= static_cast<std::uint32_t>(p->b[32 * group + row]) << (8 * (i % 4));
    }
    for (unsigned i = 0; i < 4; ++i) {  // c_i: row groupID (i < 2) else groupID + 8, column 2 tig + (i & 1)
        const unsigned row = i < 2 ? group : group + 8, col = tig * 2 + (i & 1);
        c[i] = acc[i] = p->c[8 * row + col];
    }
    float out[4];
    octet::ptx::mma_m16n8k32<FA, FB>(out, a, b, c);
    octet::ptx::mma_m16n8k32_acc<FA, FB>(acc, a, b);
    for (unsigned i = 0; i < 4; ++i) {
        const unsigned row = i < 2 ? group : group + 8, col = tig * 2 + (i & 1);
        d[8 * row + col] = out[i];
        d_acc[8 * row + col] = acc[i];
    }
}

template <class FA, class FB>
std::vector<float> run(const problem& p, std::vector<float>* acc_form = nullptr) {
    std::vector<float> d(128, -1.0f), acc(128, -1.0f);
    const auto r =
        oi::launch("mma", {oi::dim3(1), oi::dim3(32)}, collect(), mma_kernel<FA, FB>, &p, d.data(), acc.data());
    CHECK_MESSAGE(r.clean(), all_messages(r));
    for (int i = 0; i < 128; ++i) CHECK(std::memcmp(&d[i], &acc[i], 4) == 0);  // both forms agree, bit for bit
    if (acc_form) *acc_form = acc;
    return d;
}

__extension__ typedef __int128 exact_t;

struct reference {
    float value;
    bool exact;  ///< S + c was exact in double, so value is the correctly rounded result
};
/// c + sum_k A[i][k] B[k][j]: the products are exact in double; their sum S exactly (integers in
/// units of 2^-32: E5M2's smallest subnormal is 2^-16), rounded to double, then S + c rounded once.
template <class FA, class FB>
reference expected(const problem& p, int i, int j) {
    exact_t s = 0;
    double special = 0.0;  // NaN and Inf products, in IEEE arithmetic
    bool all_neg_zero = true;
    for (int k = 0; k < 32; ++k) {
        const double x = fp8_value<FA>(p.a[32 * i + k]) * fp8_value<FB>(p.b[32 * j + k]);
        all_neg_zero = all_neg_zero && x == 0.0 && std::signbit(x);
        if (std::isfinite(x))
            s += static_cast<exact_t>(std::ldexp(x, 32));
        else
            special += x;
    }
    const double c = p.c[8 * i + j];
    double sum = s == 0 ? (all_neg_zero ? -0.0 : 0.0) : std::ldexp(static_cast<double>(s), -32);
    if (special != 0.0 || std::isnan(special)) sum = special;
    const double hi = sum + c;
    bool exact = true;
    if (std::isfinite(hi)) {
        const double bv = hi - sum;
        exact = (sum - (hi - bv)) + (c - bv) == 0.0;
    }
    return {static_cast<float>(hi), exact};
}

/// Compares all 128 outputs; returns how many were checked bit for bit.
template <class FA, class FB>
int compare(const problem& p, const std::vector<float>& d) {
    int bitwise = 0;
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 8; ++j) {
            const reference ref = expected<FA, FB>(p, i, j);
            const float got = d[8 * i + j];
            INFO("D[" << i << "][" << j << "] = " << got << ", expected " << ref.value);
            if (std::isnan(ref.value)) {
                CHECK(std::isnan(got));
            } else if (ref.exact) {
                ++bitwise;
                CHECK(std::memcmp(&got, &ref.value, 4) == 0);
            } else {  // S + c inexact in double: the model's round-to-odd result is within an ulp
                CHECK(std::fabs(static_cast<double>(got) - ref.value) <= std::ldexp(1.0, std::ilogb(ref.value) - 23));
            }
        }
    return bitwise;
}

template <class FA, class FB>
void random_case(std::uint64_t salt) {
    auto g = octet_test::rng(salt);
    for (int rep = 0; rep < 4; ++rep) {
        problem p;
        const bool e4 = std::is_same<FA, e4m3>::value, f4 = std::is_same<FB, e4m3>::value;
        // random finite codes (NaN/Inf are the edge-case test's)
        auto code = [&g](bool is_e4m3) {
            while (true) {
                const auto c = static_cast<std::uint8_t>(g());
                if (is_e4m3 ? (c & 0x7F) != 0x7F : (c & 0x7C) != 0x7C) return c;
            }
        };
        for (auto& x : p.a) x = code(e4);
        for (auto& x : p.b) x = code(f4);
        for (auto& x : p.c) x = rep == 0 ? 0.0f : static_cast<float>(std::ldexp(double(g() % 2000001) - 1e6, -10));
        const int bitwise = compare<FA, FB>(p, run<FA, FB>(p));
        if (e4 && f4) CHECK(bitwise == 128);  // E4M3 sums span at most 41 bits: S + c is exact in double
        if (rep == 0) CHECK(bitwise == 128);  // c = 0: d = RN(S)
    }
}

TEST_CASE("mma.m16n8k32 FP8: random codes of the four type pairs against the ISA's fragments and a float64 sum") {
    random_case<e4m3, e4m3>(1);
    random_case<e4m3, e5m2>(2);
    random_case<e5m2, e4m3>(3);
    random_case<e5m2, e5m2>(4);
}

TEST_CASE("mma.m16n8k32 FP8: zeros, -0, subnormals, the largest finite values, one rounding") {
    problem p;
    // A = -0 everywhere, B = 1: every product is -0; c = -0 in row 0, +0 in row 1, 3 elsewhere
    std::fill(p.a.begin(), p.a.end(), std::uint8_t{0x80});
    std::fill(p.b.begin(), p.b.end(), std::uint8_t{0x38});  // E4M3 1.0
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 8; ++j) p.c[8 * i + j] = i == 0 ? -0.0f : i == 1 ? 0.0f : 3.0f;
    auto d = run<e4m3, e4m3>(p);
    for (int j = 0; j < 8; ++j) {
        CHECK((d[j] == 0.0f && std::signbit(d[j])));
        CHECK((d[8 + j] == 0.0f && !std::signbit(d[8 + j])));
        CHECK(d[16 + j] == 3.0f);
    }
    compare<e4m3, e4m3>(p, d);

    // smallest subnormals: E4M3 2^-9 x 2^-9 x 32 = 2^-13; E5M2 2^-16 x 2^-16 x 32 = 2^-27
    std::fill(p.a.begin(), p.a.end(), std::uint8_t{0x01});
    std::fill(p.b.begin(), p.b.end(), std::uint8_t{0x01});
    std::fill(p.c.begin(), p.c.end(), 0.0f);
    d = run<e4m3, e4m3>(p);
    for (float x : d) CHECK(x == std::ldexp(1.0f, -13));
    d = run<e5m2, e5m2>(p);
    for (float x : d) CHECK(x == std::ldexp(1.0f, -27));

    // largest finite values: E4M3 448, E5M2 57344; alternating signs along k cancel exactly
    for (int i = 0; i < 16; ++i)
        for (int k = 0; k < 32; ++k) p.a[32 * i + k] = i < 8 ? 0x7E : static_cast<std::uint8_t>(k % 2 ? 0xFE : 0x7E);
    std::fill(p.b.begin(), p.b.end(), std::uint8_t{0x7E});
    std::fill(p.c.begin(), p.c.end(), 1.0f);
    d = run<e4m3, e4m3>(p);
    for (int j = 0; j < 8; ++j) CHECK(d[j] == 448.0f * 448.0f * 32.0f + 1.0f);
    for (int j = 0; j < 8; ++j) CHECK(d[8 * 8 + j] == 1.0f);
    compare<e4m3, e4m3>(p, d);
    for (int i = 0; i < 16; ++i)
        for (int k = 0; k < 32; ++k) p.a[32 * i + k] = i < 8 ? 0x7B : static_cast<std::uint8_t>(k % 2 ? 0xFB : 0x7B);
    std::fill(p.b.begin(), p.b.end(), std::uint8_t{0x7B});
    d = run<e5m2, e5m2>(p);
    for (int j = 0; j < 8; ++j) CHECK(d[j] == 57344.0f * 57344.0f * 32.0f + 1.0f);
    for (int j = 0; j < 8; ++j) CHECK(d[8 * 8 + j] == 1.0f);
    compare<e5m2, e5m2>(p, d);

    // one rounding of c + S: c = 64 (ulp 2^-17), products 2^-18 and 2^-32: the exact sum lies just
    // above the midpoint, so it rounds up; adding in float (or rounding S + c twice) gives 64
    std::fill(p.a.begin(), p.a.end(), std::uint8_t{0x00});
    std::fill(p.b.begin(), p.b.end(), std::uint8_t{0x00});
    std::fill(p.c.begin(), p.c.end(), 64.0f);
    for (int i = 0; i < 16; ++i) {
        p.a[32 * i + 3] = 0x18;   // E5M2 2^-9
        p.a[32 * i + 20] = 0x01;  // E5M2 2^-16
    }
    for (int j = 0; j < 8; ++j) {
        p.b[32 * j + 3] = 0x18;
        p.b[32 * j + 20] = 0x01;
    }
    d = run<e5m2, e5m2>(p);
    for (float x : d) CHECK(x == 64.0f + std::ldexp(1.0f, -17));
    for (int j = 0; j < 8; ++j) p.b[32 * j + 20] = 0x00;  // the exact midpoint: ties to even
    d = run<e5m2, e5m2>(p);
    for (float x : d) CHECK(x == 64.0f);
}

TEST_CASE("mma.m16n8k32 FP8: NaN and Inf propagate as in IEEE arithmetic") {
    problem p;
    std::fill(p.a.begin(), p.a.end(), std::uint8_t{0x3C});  // E5M2 1.0
    std::fill(p.b.begin(), p.b.end(), std::uint8_t{0x3C});
    std::fill(p.c.begin(), p.c.end(), 0.5f);
    p.a[32 * 0 + 5] = 0x7F;  // row 0: a NaN operand
    p.a[32 * 1 + 5] = 0x7C;  // row 1: +Inf (x 1: +Inf)
    p.a[32 * 2 + 5] = 0x7C;  // row 2: +Inf and -Inf products: NaN
    p.a[32 * 2 + 6] = 0xFC;
    p.a[32 * 3 + 5] = 0xFC;  // row 3: -Inf, with c = +Inf in column 0: NaN
    p.c[8 * 3 + 0] = std::numeric_limits<float>::infinity();
    p.c[8 * 4 + 1] = -std::numeric_limits<float>::infinity();  // row 4: finite products + -Inf
    p.c[8 * 5 + 2] = std::numeric_limits<float>::quiet_NaN();  // row 5: c NaN
    p.a[32 * 6 + 9] = 0x7C;  // row 6: Inf x 0 (column 7's B is 0 there): NaN in column 7 only
    p.b[32 * 7 + 9] = 0x00;
    const auto d = run<e5m2, e5m2>(p);
    for (int j = 0; j < 8; ++j) {
        CHECK(std::isnan(d[j]));
        CHECK(d[8 + j] == std::numeric_limits<float>::infinity());
        CHECK(std::isnan(d[16 + j]));
        if (j == 0)
            CHECK(std::isnan(d[24 + j]));
        else
            CHECK(d[24 + j] == -std::numeric_limits<float>::infinity());
        const float finite = j == 7 ? 31.5f : 32.5f;  // column 7 has one product 1 x 0
        CHECK(d[32 + j] == (j == 1 ? -std::numeric_limits<float>::infinity() : finite));
        CHECK((j == 2 ? std::isnan(d[40 + j]) : d[40 + j] == finite));
        CHECK((j == 7 ? std::isnan(d[48 + j]) : d[48 + j] == std::numeric_limits<float>::infinity()));
    }
    compare<e5m2, e5m2>(p, d);
    std::uint32_t nan_bits;
    std::memcpy(&nan_bits, &d[0], 4);
    CHECK(nan_bits == 0x7FFFFFFFu);  // the canonical NaN

    // E4M3 has no Inf: its NaN (S.1111.111) propagates
    problem q;
    std::fill(q.a.begin(), q.a.end(), std::uint8_t{0x38});
    std::fill(q.b.begin(), q.b.end(), std::uint8_t{0x38});
    std::fill(q.c.begin(), q.c.end(), 0.0f);
    q.b[32 * 3 + 30] = 0xFF;  // column 3
    const auto e = run<e4m3, e4m3>(q);
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 8; ++j) CHECK((j == 3 ? std::isnan(e[8 * i + j]) : e[8 * i + j] == 32.0f));
}

__global__ void partial_warp_kernel() {
    float d[4] = {};
    const std::uint32_t a[4] = {}, b[2] = {};
    octet::ptx::mma_m16n8k32_acc<e4m3, e4m3>(d, a, b);
}
__global__ void divergent_kernel() {
    float d[4] = {};
    const std::uint32_t a[4] = {}, b[2] = {};
    if (threadIdx.x < 16)
        octet::ptx::mma_m16n8k32_acc<e4m3, e4m3>(d, a, b);
    else
        octet::ptx::mma_m16n8k32_acc<e4m3, e5m2>(d, a, b);
}
__global__ void early_exit_kernel() {
    if (threadIdx.x % 32 >= 24) return;  // 8 lanes of the warp never reach the mma
    float d[4] = {};
    const std::uint32_t a[4] = {}, b[2] = {};
    octet::ptx::mma_m16n8k32_acc<e5m2, e5m2>(d, a, b);
}

TEST_CASE("mma.m16n8k32 FP8: a partial warp, divergent lanes and exited lanes are reported") {
    const auto partial = oi::launch("mma_partial", {oi::dim3(1), oi::dim3(16)}, collect(), partial_warp_kernel);
    REQUIRE_MESSAGE(has(partial, oi::check::warp_sync), all_messages(partial));
    CHECK(partial.reports.front().kernel == "mma_partial");
    CHECK(partial.reports.front().detail.find("mma.sync.aligned.m16n8k32") != std::string::npos);
    const auto divergent = oi::launch("mma_divergent", {oi::dim3(1), oi::dim3(32)}, collect(), divergent_kernel);
    REQUIRE_MESSAGE(has(divergent, oi::check::warp_sync), all_messages(divergent));
    CHECK(divergent.reports.front().detail.find("e4m3.e5m2") != std::string::npos);
    CHECK(divergent.reports.front().detail.find("e4m3.e4m3") != std::string::npos);
    const auto exited = oi::launch("mma_exited", {oi::dim3(1), oi::dim3(32)}, collect(), early_exit_kernel);
    REQUIRE_MESSAGE(has(exited, oi::check::warp_sync), all_messages(exited));
    CHECK(exited.reports.front().detail.find("lanes 24-31, which exited") != std::string::npos);
}

}  // namespace ptx_mma_test
