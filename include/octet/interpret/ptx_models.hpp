// octet/interpret/ptx_models.hpp: the interpreter's models of the PTX instructions in octet/cuda/ptx.cuh,
// each written from the PTX ISA's description of the instruction (fragment layouts, operand order,
// rounding), independent of octet's kernels. Warp-collective instructions are warp_exchange calls
// (interpret.hpp); operands in shared memory are read and written by each lane through sptr, so the
// checks see them as that lane's accesses.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "octet/format/encode.hpp"
#include "octet/interpret/interpret.hpp"

namespace octet {
namespace interpret {
namespace model {

// ---- mma.sync ---------------------------------------------------------------------------------------

// mma.sync.aligned.m16n8k32.row.col.f32.FA.FB.f32 (FA, FB: e4m3 or e5m2): d = a * b + c over the warp,
// fragments as in the PTX ISA's "Matrix fragments for mma.m16n8k32" (per lane, g = lane / 4,
// t = lane % 4, codes packed lowest byte first; element i of a lane's A/B codes is byte i % 4 of
// register i / 4):
//   A 16 x 32: a_i at row g (i < 4 or 8 <= i < 12) else g + 8, column 4t + (i % 4) (+ 16 for i >= 8);
//   B 32 x 8:  b_i at row 4t + (i % 4) (+ 16 for i >= 4), column g;
//   C, D 16 x 8: c_i at row g (i < 2) else g + 8, column 2t + (i % 2).
// Numerics (a documented model, not the hardware's): each output is c + the sum of its 32 products.
// The products are exact, and so is their sum S: every E4M3/E5M2 product is an integer multiple of
// 2^-32 below 2^32 in magnitude, so S is added up in 128-bit fixed point, in no particular order.
// S is rounded to double (exact when S has at most 53 significant bits: always for E4M3 x E4M3,
// whose sums have at most 41; with E5M2 operands only when the products span more than ~53 binades
// is this a rounding), then S + c is rounded once to float (round to nearest even, Inf on overflow).
// Special values follow IEEE arithmetic on the exact products: a NaN operand, 0 * Inf, or +Inf and
// -Inf among the products or c give NaN (the canonical 0x7FFFFFFF); an Inf product gives that Inf
// (+ c); a sum of zero products is -0 only when all are -0 (and c is -0).
// What it cannot tell: the tensor core adds products in its own groups and order with a truncating
// accumulator of limited width (not documented), so the hardware's d can differ from this model's
// in the last bits; kernels are compared with this model only where the numerics contract allows.
namespace mma_detail {
__extension__ typedef __int128 fixed128;  // units of 2^-32 (GCC and Clang)

struct mma_in {
    std::uint32_t a[4], b[2];
    float c[4];
};
struct mma_out {
    float d[4];
};

/// Round-to-nearest of hi + lo (lo the exact error of hi = RN(x), |lo| <= ulp(hi) / 2) to float,
/// through round-to-odd at double precision (53 >= 24 + 2, so the second rounding is exact).
inline float round_to_float(double hi, double lo) {
    if (lo != 0.0 && std::isfinite(hi)) {
        std::uint64_t bits;
        std::memcpy(&bits, &hi, sizeof bits);
        // truncate toward zero: when lo points toward zero, the truncation is hi's neighbour below
        const bool toward_zero = (lo < 0.0) != (hi < 0.0);
        if (toward_zero) bits -= 1;  // same sign, one ulp nearer zero (hi != 0 here: lo != 0)
        bits |= 1u;                  // inexact: make it odd
        std::memcpy(&hi, &bits, sizeof bits);
    }
    return static_cast<float>(hi);
}

/// One output: c + sum of a[k] * b[k] over k < 32, as described above.
template <class FA, class FB>
float dot32(const std::uint8_t* a, const std::uint8_t* b, float c) {
    fixed128 sum = 0;
    bool nan = false, pos_inf = false, neg_inf = false, all_neg_zero = true;
    for (int k = 0; k < 32; ++k) {
        const double p = static_cast<double>(decode<FA>(a[k])) * static_cast<double>(decode<FB>(b[k]));  // exact
        if (std::isnan(p)) {
            nan = true;
        } else if (std::isinf(p)) {
            (p > 0 ? pos_inf : neg_inf) = true;
        } else {
            sum += static_cast<fixed128>(std::ldexp(p, 32));  // an integer: exact
        }
        all_neg_zero = all_neg_zero && p == 0.0 && std::signbit(p);
    }
    double s, lo = 0.0;
    if (nan || (pos_inf && neg_inf)) {
        s = std::numeric_limits<double>::quiet_NaN();
    } else if (pos_inf || neg_inf) {
        s = pos_inf ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
    } else if (sum == 0) {
        s = all_neg_zero ? -0.0 : 0.0;
    } else {
        s = std::ldexp(static_cast<double>(sum), -32);  // the one place S may be rounded (see above)
    }
    // hi + lo = s + c exactly (TwoSum), then one rounding to float
    const double cd = c, hi = s + cd;
    if (std::isfinite(hi)) {
        const double bv = hi - s;
        lo = (s - (hi - bv)) + (cd - bv);
    }
    const float d = round_to_float(hi, lo);
    return std::isnan(d) ? ::octet::canonical_nan() : d;
}
}  // namespace mma_detail

template <class FA, class FB>
void mma_m16n8k32(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2], const float (&c)[4]) {
    mma_detail::mma_in mine{};
    for (int i = 0; i < 4; ++i) mine.a[i] = a[i], mine.c[i] = c[i];  // c read before d is written: d may be c
    for (int i = 0; i < 2; ++i) mine.b[i] = b[i];
    const char* name = std::is_same<FA, e4m3>::value
                           ? (std::is_same<FB, e4m3>::value ? "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"
                                                            : "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32")
                           : (std::is_same<FB, e4m3>::value ? "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32"
                                                            : "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32");
    const mma_detail::mma_out out = warp_exchange<mma_detail::mma_in, mma_detail::mma_out>(
        name, 0xFFFFFFFFu, mine, [](const mma_detail::mma_in* const* in, mma_detail::mma_out* const* res) {
            std::uint8_t A[16][32], B[8][32];  // B stored by column: B[n][k]
            float C[16][8];
            for (int lane = 0; lane < 32; ++lane) {
                const int g = lane / 4, t = lane % 4;
                const mma_detail::mma_in& x = *in[lane];
                for (int i = 0; i < 16; ++i) {
                    const int row = (i < 4 || (i >= 8 && i < 12)) ? g : g + 8, col = 4 * t + i % 4 + (i >= 8 ? 16 : 0);
                    A[row][col] = static_cast<std::uint8_t>(x.a[i / 4] >> (8 * (i % 4)));
                }
                for (int i = 0; i < 8; ++i)
                    B[g][4 * t + i % 4 + (i >= 4 ? 16 : 0)] = static_cast<std::uint8_t>(x.b[i / 4] >> (8 * (i % 4)));
                for (int i = 0; i < 4; ++i) C[i < 2 ? g : g + 8][2 * t + i % 2] = x.c[i];
            }
            for (int lane = 0; lane < 32; ++lane) {
                const int g = lane / 4, t = lane % 4;
                for (int i = 0; i < 4; ++i) {
                    const int row = i < 2 ? g : g + 8, col = 2 * t + i % 2;
                    res[lane]->d[i] = mma_detail::dot32<FA, FB>(A[row], B[col], C[row][col]);
                }
            }
        });
    for (int i = 0; i < 4; ++i) d[i] = out.d[i];
}

// ---- ldmatrix ---------------------------------------------------------------------------------------

// ldmatrix.sync.aligned.m8n8.xN{,.trans}.shared.b16 (N = 1, 2, 4), from the PTX ISA: lanes 8m..8m+7
// hold the addresses of rows 0..7 of matrix m (m < N; the other lanes' addresses are not used), each
// row 8 16-bit elements = 16 bytes, its address 16-byte aligned. Lane L receives in r[m] the elements
// (row L / 4, columns 2 (L % 4) and 2 (L % 4) + 1) of matrix m, lower half first; with .trans those at
// (rows 2 (L % 4) and 2 (L % 4) + 1, column L / 4). Each addressing lane reads its row itself (checked
// and attributed to it) before the exchange; a row address that is not 16-byte aligned is reported
// (as an out-of-bounds access: the device faults with a misaligned address) and stops the block.
namespace ldmatrix_detail {
struct row16 {
    std::uint16_t e[8];
};
struct rows_in {
    row16 row;
};
template <int N>
struct regs_out {
    std::uint32_t r[N];
};
template <int N, bool Trans>
constexpr const char* name() {
    return N == 1
               ? (Trans ? "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16" : "ldmatrix.sync.aligned.m8n8.x1.shared.b16")
           : N == 2
               ? (Trans ? "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16" : "ldmatrix.sync.aligned.m8n8.x2.shared.b16")
               : (Trans ? "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
                        : "ldmatrix.sync.aligned.m8n8.x4.shared.b16");
}
}  // namespace ldmatrix_detail

template <int N, bool Trans>
void ldmatrix(std::uint32_t (&r)[N], std::uint32_t address) {
    static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
    using namespace ldmatrix_detail;
    rows_in mine{};
    if (lane_id() < 8u * N) {
        if (address % 16 != 0) {
            detail::machine& m = detail::running("ldmatrix");
            m.emit(m.make(check::out_of_bounds, m.current->tid, m.describe(address, -1),
                          std::string(name<N, Trans>()) + ": row address " + detail::hex(address) + " of lane " +
                              std::to_string(lane_id()) +
                              " is not 16-byte aligned (the ISA requires it; the device faults: misaligned address)"),
                   true);
        }
        mine.row = (*shared_at<row16>(address)).load();  // 16 bytes, checked as this lane's read
    }
    const regs_out<N> out = warp_exchange<rows_in, regs_out<N>>(
        name<N, Trans>(), 0xFFFFFFFFu, mine, [](const rows_in* const* in, regs_out<N>* const* res) {
            for (int L = 0; L < 32; ++L)
                for (int m = 0; m < N; ++m) {
                    std::uint32_t lo, hi;
                    if (Trans) {
                        lo = in[8 * m + 2 * (L % 4)]->row.e[L / 4];
                        hi = in[8 * m + 2 * (L % 4) + 1]->row.e[L / 4];
                    } else {
                        lo = in[8 * m + L / 4]->row.e[2 * (L % 4)];
                        hi = in[8 * m + L / 4]->row.e[2 * (L % 4) + 1];
                    }
                    res[L]->r[m] = lo | hi << 16;
                }
        });
    for (int m = 0; m < N; ++m) r[m] = out.r[m];
}

// ---- cp.async ---------------------------------------------------------------------------------------

// ---- mbarrier ---------------------------------------------------------------------------------------

// ---- cp.async.bulk.tensor (TMA), prefetch.tensormap -------------------------------------------------

// ---- fence.proxy.async, setmaxnreg ------------------------------------------------------------------

// ---- wgmma ------------------------------------------------------------------------------------------

}  // namespace model
}  // namespace interpret
}  // namespace octet
