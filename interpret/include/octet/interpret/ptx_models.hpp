// octet/interpret/ptx_models.hpp: the interpreter's models of the PTX instructions in octet/cuda/ptx.cuh,
// each written from the PTX ISA's description of the instruction (fragment layouts, operand order,
// rounding), independent of octet's kernels. Warp-collective instructions are warp_exchange calls
// (interpret.hpp); operands in shared memory are read and written by each lane through sptr, so the
// checks see them as that lane's accesses.
#pragma once

#include <cuda.h>  // CUtensorMap, cuTensorMapEncodeTiled's enums (the toolkit's header; nothing is linked)

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "octet/interpret/fp8.hpp"
#include "octet/interpret/interpret.hpp"
#include "octet/interpret/tensor_map.hpp"

namespace octet {
namespace interpret {
namespace model {

// ---- mma.sync ---------------------------------------------------------------------------------------

// mma.sync.aligned.m16n8k32.row.col.f32.FA.FB.f32 (FA, FB: ptx::e4m3 or ptx::e5m2, the element types of
// fp8.hpp, decoded by ptx::decode as the ISA defines them): d = a * b + c over the warp,
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
        const double p =
            static_cast<double>(ptx::decode<FA>(a[k])) * static_cast<double>(ptx::decode<FB>(b[k]));  // exact
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
    return std::isnan(d) ? interpret::canonical_nan() : d;
}
}  // namespace mma_detail

template <class FA, class FB>
void mma_m16n8k32(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2], const float (&c)[4]) {
    mma_detail::mma_in mine{};
    for (int i = 0; i < 4; ++i) mine.a[i] = a[i], mine.c[i] = c[i];  // c read before d is written: d may be c
    for (int i = 0; i < 2; ++i) mine.b[i] = b[i];
    static_assert((std::is_same<FA, ptx::e4m3>::value || std::is_same<FA, ptx::e5m2>::value) &&
                      (std::is_same<FB, ptx::e4m3>::value || std::is_same<FB, ptx::e5m2>::value),
                  "mma.sync's FP8 operands are ptx::e4m3 or ptx::e5m2 (octet/interpret/fp8.hpp)");
    const char* name =
        std::is_same<FA, ptx::e4m3>::value
            ? (std::is_same<FB, ptx::e4m3>::value ? "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"
                                                  : "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32")
            : (std::is_same<FB, ptx::e4m3>::value ? "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32"
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
/// A row address that is not 16-byte aligned is reported (as an out-of-bounds access: the device
/// faults with a misaligned address) and stops the block; ldmatrix's and stmatrix's rule.
inline void check_row_address(const char* instruction, std::uint32_t address) {
    if (address % 16 == 0) return;
    detail::machine& m = detail::running(instruction);
    m.emit(m.make(check::out_of_bounds, m.current->tid, m.describe(address, -1),
                  std::string(instruction) + ": row address " + detail::hex(address) + " of lane " +
                      std::to_string(lane_id()) +
                      " is not 16-byte aligned (the ISA requires it; the device faults: misaligned address)"),
           true);
}
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
        check_row_address(name<N, Trans>(), address);
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

// ---- stmatrix ---------------------------------------------------------------------------------------

// stmatrix.sync.aligned.m8n8.x4.shared.b16 (sm_90), from the PTX ISA: ldmatrix's inverse. Lanes
// 8m..8m+7 hold the addresses of rows 0..7 of matrix m (16 bytes each, 16-byte aligned); lane L's
// r[m] holds the elements (row L / 4, columns 2 (L % 4) and 2 (L % 4) + 1) of matrix m, lower half
// first. The rows are assembled in the exchange; then each addressing lane writes its row itself
// (checked and attributed to it); a row address that is not 16-byte aligned is reported as for ldmatrix.
namespace stmatrix_detail {
struct regs_in {
    std::uint32_t r[4];
};
struct row_out {
    ldmatrix_detail::row16 row;
};
}  // namespace stmatrix_detail

inline void stmatrix_x4(const std::uint32_t (&r)[4], std::uint32_t address) {
    using namespace stmatrix_detail;
    constexpr const char* name = "stmatrix.sync.aligned.m8n8.x4.shared.b16";
    regs_in mine{};
    for (int m = 0; m < 4; ++m) mine.r[m] = r[m];
    const row_out out =
        warp_exchange<regs_in, row_out>(name, 0xFFFFFFFFu, mine, [](const regs_in* const* in, row_out* const* res) {
            for (int m = 0; m < 4; ++m)
                for (int row = 0; row < 8; ++row)
                    for (int q = 0; q < 4; ++q) {  // lane 4 row + q holds columns 2q, 2q + 1
                        const std::uint32_t v = in[4 * row + q]->r[m];
                        res[8 * m + row]->row.e[2 * q] = static_cast<std::uint16_t>(v & 0xFFFFu);
                        res[8 * m + row]->row.e[2 * q + 1] = static_cast<std::uint16_t>(v >> 16);
                    }
        });
    ldmatrix_detail::check_row_address(name, address);
    *shared_at<ldmatrix_detail::row16>(address) = out.row;  // 16 bytes, checked as this lane's write
}

// ---- cp.async ---------------------------------------------------------------------------------------
// PTX ISA, cp.async: copies cp_size bytes (4, 8 or 16; .cg only 16) from global src to shared dst,
// of which the first src_size come from src and the rest are zeros (src_size > cp_size is undefined);
// both addresses must be aligned to cp_size. The copy is performed asynchronously: its writes are
// guaranteed visible to the issuing thread only after the cp.async.wait_group / wait_all that covers
// its group (commit_group closes a group of the thread's uncommitted copies, possibly empty), and to
// other threads only through a barrier after that. The model is one execution the ISA allows:
//   - the source is read when the copy is issued (the earliest the hardware may read it), so a source
//     past the end of a guarded_buffer faults at the cp.async, naming the issuing thread there;
//     later writes to the source before the wait are not detected (global memory is not race-checked);
//   - the destination is written at the wait that completes the copy's group, as that thread's plain
//     writes through the shared-memory checks, i.e. the latest the ISA allows: a read of it before the
//     wait sees stale bytes, or is an uninitialized read, and a read by another thread that no barrier
//     orders after the wait is a race. Bounds of dst are checked at that write;
//   - a misaligned operand (the device faults: misaligned address) or src_size > cp_size (undefined)
//     is check::ptx_misuse and ends the block;
//   - a thread that exits with copies pending is reported (machine::check_exit) and its copies are
//     dropped: no wait of its own can complete them, and octet's kernels end with a wait.

/// cp.async.{ca,cg}.shared.global [dst], [src], cp_size, src_size.
inline void cp_async(const char* instruction, std::uint32_t dst, const void* src, std::uint32_t cp_size,
                     std::uint32_t src_size) {
    const auto s = reinterpret_cast<std::uintptr_t>(src);
    if (src_size > cp_size)
        detail::ptx_misuse(dst, std::string(instruction) + " with src-size " + std::to_string(src_size) +
                                    " over its cp-size " + std::to_string(cp_size));
    if (dst % cp_size != 0)
        detail::ptx_misuse(
            dst, std::string(instruction) + " to a destination not aligned to its cp-size " + std::to_string(cp_size));
    if (s % cp_size != 0)
        detail::ptx_misuse(-1, std::string(instruction) + " from source " + detail::hex(s) +
                                   ", not aligned to its cp-size " + std::to_string(cp_size));
    detail::async_copies& q = detail::thread_async_copies();
    detail::async_copy c;
    c.dst = dst;
    c.bytes = cp_size;
    if (src_size > 0) std::memcpy(c.data, src, src_size);  // a guard page faults here, at the cp.async
    q.uncommitted.push_back(c);
}

/// cp.async.commit_group: the thread's uncommitted copies become its newest group (empty if none).
inline void cp_async_commit_group() {
    detail::async_copies& q = detail::thread_async_copies();
    q.groups.push_back(std::move(q.uncommitted));
    q.uncommitted.clear();
}

/// cp.async.wait_group n: completes the thread's committed groups but the newest n, oldest first;
/// each copy writes its bytes now, as this thread's writes (uncommitted copies stay in flight).
inline void cp_async_wait_group(unsigned n) {
    detail::async_copies& q = detail::thread_async_copies();
    if (q.groups.size() <= n) return;
    // take the groups out first: a report thrown from a write leaves no half-landed state behind
    const auto end = q.groups.end() - static_cast<std::ptrdiff_t>(n);
    std::vector<std::vector<detail::async_copy>> done(std::make_move_iterator(q.groups.begin()),
                                                      std::make_move_iterator(end));
    q.groups.erase(q.groups.begin(), end);
    for (const auto& g : done)
        for (const detail::async_copy& c : g) {
            // checked against the variable holding the first byte, as the kernel's own accesses are
            std::uint8_t* p = shared_at<std::uint8_t>(c.dst).bytes();
            if (detail::shared_access(p, c.bytes, detail::access::write, detail::shared_region_at(c.dst)))
                std::memcpy(p, c.data, c.bytes);
        }
}

/// cp.async.wait_all: as commit_group then wait_group 0 (the ISA's definition).
inline void cp_async_wait_all() {
    cp_async_commit_group();
    cp_async_wait_group(0);
}

// ---- mbarrier ---------------------------------------------------------------------------------------
// PTX ISA, mbarrier: an 8-byte shared object with a phase, a pending arrival count and a tx-count.
// init(count): phase 0, `count` arrivals pending, tx-count 0. arrive: one arrival (release);
// expect_tx(b): tx-count += b; complete_tx(b) (from an asynchronous copy): tx-count -= b. The phase
// completes when the pending arrivals and the tx-count are both zero: the parity flips and the counts
// reset. try_wait.parity(P) succeeds once the phase of parity P has completed, i.e. while the current
// phase has parity !P (a fresh barrier is in phase 0, so a wait for parity 1 succeeds at once); the
// successful wait acquires what the completed phase's arrivals released. Reports (mbarrier_misuse): use
// before init, an address not 8-byte aligned, an arrival when the phase has all its arrivals, and a
// tx-count still negative when the last arrival is in (more bytes completed than expected: a copy
// completing before its expect_tx is legal, the tx-count is only checked once the arrivals are all
// in). A wait that nothing can end (wrong parity, missing arrival, too few bytes) is a deadlock report.

inline void mbarrier_init(std::uint32_t bar, std::uint32_t count, const char* file = __builtin_FILE(),
                          int line = __builtin_LINE()) {
    detail::running("mbarrier.init").mbar_init(bar, count, detail::site{file, line});
}
/// fence.mbarrier_init: nothing to do here; the init is a plain write of the object, so an arrival
/// not ordered after it (by the __syncthreads that follows the fence) is reported as a race.
inline void fence_mbarrier_init() {}
inline void mbarrier_arrive(std::uint32_t bar, std::uint32_t tx_bytes, bool expect_tx,
                            const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    detail::running("mbarrier.arrive").mbar_arrive(bar, tx_bytes, expect_tx, detail::site{file, line});
}
inline bool mbarrier_try_wait_parity(std::uint32_t bar, std::uint32_t parity, const char* file = __builtin_FILE(),
                                     int line = __builtin_LINE()) {
    return detail::running("mbarrier.try_wait").mbar_wait(bar, parity, detail::site{file, line});
}

// ---- thread block clusters --------------------------------------------------------------------------
// A cluster's CTAs run as one unit of the launch (launch_config::cluster), each with its own shared
// window; shared::cta addresses are CTA-relative, and mapa turns one into a shared::cluster address of
// another CTA's byte (the model tags the rank + 1 in bits 24.., beyond any CTA's window; an untagged
// address is the running thread's CTA's, as the ISA has a shared::cta address be a valid
// shared::cluster one). mbarrier operations (a remote arrival: mbarrier_arrive on such an address),
// and TMA loads take either. Accesses to another CTA's window are checked as the CTA's own (races,
// bounds, initialisation), with the cluster's threads in one happens-before order.

/// %cluster_ctarank, %cluster_nctarank.
inline std::uint32_t cluster_ctarank() {
    const detail::machine& m = detail::running("%cluster_ctarank");
    return m.cta_of(m.current->tid);
}
inline std::uint32_t cluster_nctarank() {
    return detail::running("%cluster_nctarank").ctas;
}
/// mapa.shared::cluster.u32: the address of shared::cta address `addr` in the CTA of cluster rank `rank`.
inline std::uint32_t mapa_shared(std::uint32_t addr, std::uint32_t rank, const char* file = __builtin_FILE(),
                                 int line = __builtin_LINE()) {
    detail::machine& m = detail::running("mapa");
    const std::string what = std::string("mapa.shared::cluster at ") + file + ":" + std::to_string(line);
    if (rank >= m.ctas)
        m.emit(m.make(check::ptx_misuse, m.current->tid, "",
                      what + ": rank " + std::to_string(rank) + ", but the cluster has " + std::to_string(m.ctas) +
                          " CTAs"),
               true);
    if (addr >> detail::machine::cluster_address_shift)
        m.emit(m.make(check::ptx_misuse, m.current->tid, detail::hex(addr),
                      what + ": " + detail::hex(addr) + " is not a shared::cta address (mapa of a cluster address?)"),
               true);
    return detail::machine::cluster_address(addr, rank);
}
/// barrier.cluster.arrive (.release) and barrier.cluster.wait (.acquire): every thread of the cluster
/// arrives, then waits for the phase; a thread arriving twice without a wait, or waiting without an
/// arrival, is a barrier_misuse report.
inline void barrier_cluster_arrive(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    detail::running("barrier.cluster.arrive").cluster_arrive(detail::site{file, line});
}
inline void barrier_cluster_wait(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    detail::running("barrier.cluster.wait").cluster_wait(detail::site{file, line});
}

// ---- cp.async.bulk.tensor (TMA), prefetch.tensormap -------------------------------------------------
// The tensor maps themselves: octet/interpret/tensor_map.hpp.

/// The shared-memory byte offset at which a swizzled copy puts logical byte `offset` of the box (row
/// after row, from a destination aligned to the pattern's repeat): the swizzle permutes 16-byte
/// chunks by XORing the chunk index (address bits 4..) with the index of the 128-byte line (address
/// bits 7..), both taken modulo span / 16: 128B XORs bits 4-6 with bits 7-9 (for 128-byte rows,
/// chunk ^= row % 8; the pattern repeats every 1024 bytes), 64B bits 4-5 with bits 7-8 (repeat 512),
/// 32B bit 4 with bit 7 (repeat 256) (CUDA programming guide, "Tensor Memory Access", the swizzle
/// patterns; PTX ISA, "Tensor swizzling modes").
inline std::uint32_t tma_swizzle(std::uint32_t offset, std::uint32_t span) {
    if (span == 0) return offset;
    const std::uint32_t mask = span / 16 - 1;  // 7, 3, 1: the chunk bits
    return offset ^ (((offset >> 7) & mask) << 4);
}

/// cp.async.bulk.tensor.2d global -> shared with complete_tx on an mbarrier, issued by one thread:
/// the box of boxDim[1] rows of boxDim[0] elements at element coordinates (c0, c1) lands row after
/// row (rows boxDim[0] * element bytes long) at dst, swizzled; elements outside the tensor (either
/// coordinate negative or past globalDim) are zero (the FLOAT_OOB_FILL_NONE fill; NaN fill is not
/// modelled). The writes are the issuing thread's (checked, attributed to it), through the async proxy
/// (wgmma reads them without a proxy fence), made at issue; the copy then completes its bytes on the
/// mbarrier, which releases them to the phase's waiters.
/// The description in a tensor map, checked for what the TMA models cover (a map the encoder made,
/// rank 2, no interleave, element strides or NaN fill), and the shared address `smem` of a box for its
/// alignment: reports name `what`.
inline tensor_map_desc checked_tensor_map(interpret::detail::machine& m, const CUtensorMap* map, std::uint32_t smem,
                                          const std::string& what) {
    const unsigned tid = m.current->tid;
    tensor_map_desc d{};
    std::memcpy(&d, map, sizeof d);
    if (d.magic != kTensorMapMagic)
        m.emit(m.make(check::ptx_misuse, tid, "",
                      what + ": the tensor map was not made by cuTensorMapEncodeTiled (interpret mode's)"),
               true);
    if (d.rank != 2 || d.interleave != CU_TENSOR_MAP_INTERLEAVE_NONE || d.element_strides[0] != 1 ||
        d.element_strides[1] != 1 || d.oob_nan)
        m.emit(m.make(check::ptx_misuse, tid, "",
                      what + ": the model covers rank-2 maps without interleave, element strides or NaN fill (rank " +
                          std::to_string(d.rank) + ")"),
               true);
    const std::uint32_t align = d.swizzle_bytes ? 8u * d.swizzle_bytes : 128u;  // the swizzle pattern's repeat
    if (smem % align != 0)
        m.emit(m.make(check::ptx_misuse, tid, m.describe(smem, -1),
                      what + ": the shared box must be " + std::to_string(align) + "-byte aligned" +
                          (d.swizzle_bytes ? " (the ISA asks 128; the model asks the swizzle pattern's repeat, as "
                                             "the hardware derives the pattern from address bits)"
                                           : "")),
               true);
    return d;
}

/// The load into the CTAs of cluster ranks `ctas` (a bit each), or with `ctas` 0 into the CTA `dst`
/// names (a shared::cluster address: the running thread's CTA, or another's from mapa): the box at the
/// same CTA-relative offset in each, and complete_tx on the mbarrier at `bar`'s offset in each.
inline void tma_load_2d_into(std::uint32_t dst, const CUtensorMap* map, std::int32_t c0, std::int32_t c1,
                             std::uint32_t bar, std::uint32_t ctas, const char* instruction, const char* file,
                             int line) {
    detail::machine& m = detail::running(instruction);
    const detail::site at{file, line};
    const std::string what = std::string(instruction) + " at " + detail::to_string(at);
    const tensor_map_desc d = checked_tensor_map(m, map, dst, what);
    const unsigned shift = detail::machine::cluster_address_shift;
    const std::uint32_t named = dst >> shift;  // mapa's tag: the rank + 1, 0 for a shared::cta address
    dst &= (1u << shift) - 1;
    bar &= (1u << shift) - 1;
    if (!ctas) {
        const unsigned rank = named ? named - 1 : m.cta_of(m.current->tid);
        ctas = rank < m.ctas ? 1u << rank : 1u << m.ctas;  // the second: beyond the cluster, reported below
    }
    if (ctas >> m.ctas)
        m.emit(m.make(check::ptx_misuse, m.current->tid, "",
                      what + ": the destination CTAs (mask) " + detail::hex(ctas) +
                          " names CTAs beyond the cluster's " + std::to_string(m.ctas)),
               true);
    // each 16-byte chunk of the box is gathered once and written into every destination CTA
    const std::uint32_t row_bytes = std::uint32_t{d.box[0]} * d.element_bytes, rows = d.box[1],
                        bytes = row_bytes * rows;
    std::uint8_t chunk[16];
    for (std::uint32_t r = 0; r < rows; ++r) {
        const long long y = static_cast<long long>(c1) + r;
        for (std::uint32_t b = 0; b < row_bytes; b += 16) {
            for (std::uint32_t i = 0; i < 16; i += d.element_bytes) {
                const long long x = static_cast<long long>(c0) + (b + i) / d.element_bytes;
                const bool inside = x >= 0 && y >= 0 && static_cast<unsigned long long>(x) < d.dims[0] &&
                                    static_cast<unsigned long long>(y) < d.dims[1];
                if (inside)
                    std::memcpy(chunk + i,
                                reinterpret_cast<const std::uint8_t*>(
                                    static_cast<std::uintptr_t>(d.base + static_cast<std::uint64_t>(y) * d.strides[0] +
                                                                static_cast<std::uint64_t>(x) * d.element_bytes)),
                                d.element_bytes);
                else
                    std::memset(chunk + i, 0, d.element_bytes);
            }
            const std::uint32_t off = dst + tma_swizzle(r * row_bytes + b, d.swizzle_bytes);
            for (unsigned rank = 0; rank < m.ctas; ++rank) {
                std::uint8_t* const to = m.cta_window(rank) + off;
                if (ctas >> rank & 1u && m.async_proxy_write(to, 16)) std::memcpy(to, chunk, 16);
            }
        }
    }
    for (unsigned rank = 0; rank < m.ctas; ++rank)
        if (ctas >> rank & 1u)
            m.mbar_complete_tx(detail::machine::cluster_address(bar, rank), bytes, "cp.async.bulk.tensor complete_tx",
                               at);
}
inline void tma_load_2d(std::uint32_t dst, const CUtensorMap* map, std::int32_t c0, std::int32_t c1, std::uint32_t bar,
                        const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    tma_load_2d_into(dst, map, c0, c1, bar, 0u, "cp.async.bulk.tensor.2d", file, line);
}
/// .multicast::cluster: the box lands at `dst` in every CTA of cluster ranks `mask`, each completing
/// its bytes on its own mbarrier at `bar` (PTX ISA, cp.async.bulk.tensor).
inline void tma_load_2d_multicast(std::uint32_t dst, const CUtensorMap* map, std::int32_t c0, std::int32_t c1,
                                  std::uint32_t bar, std::uint16_t mask, const char* file = __builtin_FILE(),
                                  int line = __builtin_LINE()) {
    if (mask == 0)
        model_report(check::ptx_misuse, "",
                     std::string("cp.async.bulk.tensor.2d.multicast::cluster at ") + file + ":" + std::to_string(line) +
                         ": an empty multicast mask",
                     true);
    tma_load_2d_into(dst, map, c0, c1, bar, mask, "cp.async.bulk.tensor.2d.multicast::cluster", file, line);
}
// TMA stores (cp.async.bulk.tensor.2d.global.shared::cta.bulk_group) and their bulk groups. The model
// is one execution the ISA allows: a store joins the thread's uncommitted bulk stores, commit_group
// makes them its newest group, and wait_group.read n completes all but the newest n groups, oldest
// first. A store reads its shared source at that wait, the latest the ISA allows, through the async
// proxy (so generic writes to it need their writer's fence.proxy.async, and a write to it after the
// store and before the wait, by any thread, changes what is stored or is a race), and writes the
// box's elements inside the tensor to global memory then (on the device they may land later; only
// the kernel's end or a non-.read wait makes them visible to other threads). A thread that exits
// with stores pending is reported (machine::check_exit) and they are dropped.

/// cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [map, {c0, c1}], [src].
inline void tma_store_2d(const CUtensorMap* map, std::int32_t c0, std::int32_t c1, std::uint32_t src,
                         const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    detail::machine& m = detail::running("cp.async.bulk.tensor (store)");
    const detail::site at{file, line};
    (void)checked_tensor_map(m, map, src, "cp.async.bulk.tensor.2d (store) at " + detail::to_string(at));
    detail::bulk_store st;
    std::memcpy(st.map, map, sizeof st.map);
    st.c0 = c0;
    st.c1 = c1;
    st.src = src;
    st.at = at;
    m.current->stores.uncommitted.push_back(st);
}

/// cp.async.bulk.commit_group.
inline void bulk_commit_group() {
    detail::bulk_stores& q = detail::running("cp.async.bulk.commit_group").current->stores;
    q.groups.push_back(std::move(q.uncommitted));
    q.uncommitted.clear();
}

/// cp.async.bulk.wait_group.read n: the stores of all but the newest n groups read their sources and
/// write their boxes now.
inline void bulk_wait_group_read(int n) {
    detail::machine& m = detail::running("cp.async.bulk.wait_group.read");
    detail::bulk_stores& q = m.current->stores;
    const std::size_t keep = static_cast<std::size_t>(n < 0 ? 0 : n);
    if (q.groups.size() <= keep) return;
    const auto end = q.groups.end() - static_cast<std::ptrdiff_t>(keep);
    std::vector<std::vector<detail::bulk_store>> done(std::make_move_iterator(q.groups.begin()),
                                                      std::make_move_iterator(end));
    q.groups.erase(q.groups.begin(), end);
    std::size_t window = 0;
    std::uint8_t* const base = detail::shared_window(&window);
    for (const auto& g : done)
        for (const detail::bulk_store& st : g) {
            tensor_map_desc d{};
            std::memcpy(&d, st.map, sizeof d);
            const std::string what = "cp.async.bulk.tensor.2d (store) at " + detail::to_string(st.at);
            const std::uint32_t row_bytes = std::uint32_t{d.box[0]} * d.element_bytes;
            for (std::uint32_t r = 0; r < d.box[1]; ++r) {
                const long long y = static_cast<long long>(st.c1) + r;
                for (std::uint32_t b = 0; b < row_bytes; b += 16) {
                    const std::uint32_t off = st.src + tma_swizzle(r * row_bytes + b, d.swizzle_bytes);
                    if (!m.async_proxy_read(base + off, 16, what.c_str(), st.at)) continue;
                    for (std::uint32_t i = 0; i < 16; i += d.element_bytes) {
                        const long long x = static_cast<long long>(st.c0) + (b + i) / d.element_bytes;
                        if (x < 0 || y < 0 || static_cast<unsigned long long>(x) >= d.dims[0] ||
                            static_cast<unsigned long long>(y) >= d.dims[1])
                            continue;  // outside the tensor: not written
                        std::memcpy(reinterpret_cast<std::uint8_t*>(static_cast<std::uintptr_t>(
                                        d.base + static_cast<std::uint64_t>(y) * d.strides[0] +
                                        static_cast<std::uint64_t>(x) * d.element_bytes)),
                                    base + off + i, d.element_bytes);
                    }
                }
            }
        }
}

/// prefetch.tensormap: a cache hint; the model checks that the map is one.
inline void prefetch_tensormap(const CUtensorMap* map, const char* file = __builtin_FILE(),
                               int line = __builtin_LINE()) {
    tensor_map_desc d{};
    std::memcpy(&d, map, sizeof d);
    if (d.magic != kTensorMapMagic) {
        detail::machine& m = detail::running("prefetch.tensormap");
        m.emit(m.make(check::ptx_misuse, m.current->tid, "",
                      "prefetch.tensormap at " + detail::to_string(detail::site{file, line}) +
                          ": not a tensor map made by cuTensorMapEncodeTiled"),
               true);
    }
}

// ---- fence.proxy.async, setmaxnreg ------------------------------------------------------------------
// fence.proxy.async (PTX ISA, memory consistency model, "proxies"): generic-proxy writes to shared
// memory are seen by the async proxy (wgmma operand reads, TMA stores) only after the writer executes
// fence.proxy.async (and, across threads, a barrier orders the fence before the reader). The model
// records each thread's clock at its fence; a model of an async-proxy reader calls
// machine::async_proxy_read, which reports (async_proxy) a byte whose last generic write its writer
// did not fence. The TMA load writes through the async proxy, and its writes reach generic readers
// through the mbarrier, which needs no fence. Not checked: generic reads of async-proxy writes made
// visible by something other than an mbarrier or wgmma.wait_group.
inline void fence_proxy_async_shared() {
    detail::running("fence.proxy.async").fence_proxy_async();
}

/// setmaxnreg.{inc,dec}.sync.aligned: warpgroup-collective. Each warp executes it convergently (a full
/// warp collective: every lane, the same operand), and the k-th setmaxnreg of the 4 warps of a
/// warpgroup must agree; a warp of the warpgroup that never executes it is reported when the block
/// ends. Registers themselves are not modelled.
inline void setmaxnreg(std::uint32_t n, bool inc, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    struct in_t {
        std::uint32_t n;
    };
    struct out_t {
        bool agree;
    };
    const char* name = inc ? "setmaxnreg.inc" : "setmaxnreg.dec";
    const out_t r = warp_exchange<in_t, out_t>(
        name, 0xFFFFFFFFu, in_t{n},
        [](const in_t* const* ins, out_t* const* outs) {
            bool agree = true;
            for (int l = 0; l < 32; ++l) agree = agree && ins[l]->n == ins[0]->n;
            for (int l = 0; l < 32; ++l) outs[l]->agree = agree;
        },
        file, line);
    detail::machine& m = detail::running(name);
    const detail::site at{file, line};
    if (!r.agree)
        m.emit(m.make(check::ptx_misuse, m.current->tid, "",
                      std::string(name) + " at " + detail::to_string(at) + ": the lanes of the warp disagree on N"),
               true);
    if (m.current->tid % 32 == 0) m.setmaxnreg(n, inc, at);
}

// ---- wgmma ------------------------------------------------------------------------------------------
// wgmma.mma_async.sync.aligned.m64nNk32.f32.{e4m3,e5m2}.{e4m3,e5m2} with A and B in shared memory, or A
// in registers (the RS form), and wgmma.fence / commit_group / wait_group, from the PTX ISA
// ("Asynchronous Warpgroup Level Matrix Multiply-Accumulate Operation").
//
// Matrix descriptor (64 bits): start address (bits 0-13), leading dimension byte offset (LBO, 16-29),
// stride dimension byte offset (SBO, 32-45), each the byte value >> 4 (addresses 18 bits, 16-byte
// units); matrix base offset (49-51); swizzle mode (62-63: 0 none, 1 128-byte, 2 64-byte, 3 32-byte).
// Both operands are K-major here (the only layout for FP8): A is 64 x 32 bytes, B is N x 32 bytes
// (row = M or N index, one byte per K element), built of core matrices of 8 rows x 16 bytes.
//   no swizzle: core matrix (row / 8, k / 16) at start + (row / 8) SBO + (k / 16) LBO, its 8 rows of
//     16 bytes contiguous;
//   T-byte swizzle (T = 32, 64, 128): 8-row atoms (row / 8) SBO apart, rows T bytes apart within the
//     atom, and the 16-byte granule address bits 4.. XOR-ed with address bits 7.. (1, 2 or 3 bits for
//     T = 32, 64, 128): what TMA's SWIZZLE_{32,64,128}B writes. The XOR is on the shared address, so a
//     start address advanced by 32 bytes inside a 128-byte row (the next K step) selects the right
//     granules; LBO is unused (32 K bytes never leave a swizzle row). Atoms are taken to be aligned to
//     the pattern's repeat (base offset 0): a non-zero base offset is reported as not modelled.
// A in registers (8-bit types): four 32-bit registers per thread; warp w holds rows 16 w .. 16 w + 15,
// lane 4 g + t, register r, byte b is A[16 w + g + 8 (r % 2)][16 (r / 2) + 4 t + b] (per warp the A
// fragment of mma.sync.m16n8k32).
// Accumulator fragment (f32, N / 2 registers per thread): thread t of the warpgroup, warp w = t / 32,
// lane l = t % 32, register i holds D[16 w + l / 4 + 8 ((i / 2) % 2)][8 (i / 4) + 2 (l % 4) + i % 2].
//
// Numerics: the FP8 operands are decoded with ptx::decode (fp8.hpp), the 32 products (exact in double) summed in
// double, the input accumulator added in double and the result rounded once to float. The hardware
// accumulates with fewer bits and in its own order: results agree to about float precision, not bits.
//
// Shared-memory reads: each thread reads the 16-byte granules it contributes (A: granule (t / 2, t % 2);
// B: granules t, t + 128, ... of the N x 2 in row-major order) through the async proxy
// (machine::async_proxy_read), so the reads are checked (window bounds, uninitialised bytes, races with
// writes not ordered before the instruction, generic writes their writer did not follow with
// fence.proxy.async) and attributed to it. They happen at mma_async, i.e. at issue: the ISA lets the hardware
// read until wait_group, and a write to the operands in between is undefined, but not reported here.
//
// Asynchrony, as far as the ISA makes it checkable:
//   - a result lands in the accumulator registers at the wgmma.wait_group that completes its
//     wgmma-group; until then the registers hold a NaN pattern (so an early read shows in the
//     results), and a write to them in between is a ptx_misuse report at the wait (the ISA: accessing
//     the accumulator registers before the wait is undefined). mma_asyncs chained on the same registers
//     (scale-d = 1, same shape) take the in-flight value as their input, as the ISA allows;
//   - mma_async on registers not in flight needs a wgmma.fence since the thread's last wait_group (the
//     ISA's register-ordering rule; the model takes a wait as the point where the thread takes its
//     registers back): otherwise a ptx_misuse report. In the RS form A's registers are read at issue; a
//     write to them after the fence (which the ISA also orders by the fence) or before the wait is
//     not seen;
//   - all four instructions are .sync.aligned warpgroup collectives: threads of a warpgroup that reach
//     different ones are warp_sync reports, and so are descriptors, scale-d or wait counts that differ
//     across the warpgroup;
//   - results never waited for, mma_asyncs never committed, and register reads before the wait (other
//     than through the NaN pattern) are not reported.

namespace detail {
/// The poison the accumulator registers hold while an mma_async on them is in flight.
constexpr std::uint32_t wgmma_poison_bits = 0x7FC0DEADu;
inline float wgmma_poison() {
    float f;
    std::memcpy(&f, &wgmma_poison_bits, sizeof f);
    return f;
}
inline std::string hex64(std::uint64_t v) {
    static const char* digits = "0123456789abcdef";
    std::string s = "0x";
    bool started = false;
    for (int i = 15; i >= 0; --i) {
        const unsigned d = static_cast<unsigned>(v >> (4 * i)) & 15u;
        if (d || started || i == 0) {
            s += digits[d];
            started = true;
        }
    }
    return s;
}
}  // namespace detail

/// The shared address of the 16-byte granule holding K bytes 16 g .. 16 g + 15 of row `row` of the
/// K-major operand that descriptor `desc` describes (g = 0, 1).
inline std::uint32_t wgmma_granule_address(std::uint64_t desc, unsigned row, unsigned g) {
    const std::uint32_t start = static_cast<std::uint32_t>(desc & 0x3FFFu) << 4;
    const std::uint32_t lbo = static_cast<std::uint32_t>((desc >> 16) & 0x3FFFu) << 4;
    const std::uint32_t sbo = static_cast<std::uint32_t>((desc >> 32) & 0x3FFFu) << 4;
    const unsigned mode = static_cast<unsigned>(desc >> 62);
    if (mode == 0) return start + (row / 8) * sbo + g * lbo + (row % 8) * 16;
    const unsigned bits = mode == 1 ? 3 : mode == 2 ? 2 : 1;  // 128, 64, 32 bytes
    const std::uint32_t width = 16u << bits;
    const std::uint32_t linear = start + (row / 8) * sbo + (row % 8) * width + 16 * g;
    return linear ^ (((linear >> 7) & ((1u << bits) - 1)) << 4);
}

/// ptx::wgmma_descriptor::encode of an address or offset that is not a multiple of 16 (the ISA's
/// descriptor holds them in 16-byte units): a ptx_misuse report inside a launch, an error outside.
inline void wgmma_descriptor_misaligned(std::uint32_t start, std::uint32_t leading, std::uint32_t stride) {
    const std::string what = "wgmma matrix descriptor: start address " + detail::hex64(start) + ", leading offset " +
                             detail::hex64(leading) + ", stride offset " + detail::hex64(stride) +
                             ": the descriptor holds them in 16-byte units, and these are not 16-byte aligned";
    if (!interpret::detail::tl_machine || !interpret::detail::tl_machine->current)
        throw interpret::error("interpret: " + what);
    model_report(check::ptx_misuse, "shared " + detail::hex64(start), what, false);
}

template <int N>
struct wgmma_operands {
    static constexpr int b_granules = (2 * N + 127) / 128;
    /// A from shared memory: granule (t / 2, t % 2); from registers: a[4 r + b] = byte b of register r
    std::uint8_t a[16];
    std::uint8_t b[b_granules][16];
    std::uint64_t desc_a, desc_b;
    std::uint32_t scale_d;
    float d[N / 2];  // the input accumulator
};
template <int N>
struct wgmma_result {
    float d[N / 2];
};

namespace detail {
/// Both forms of wgmma.mma_async m64nNk32: A from desc_a when a_regs is null, else from the four registers
/// at a_regs (the RS form, mma.sync.m16n8k32's A fragment per warp).
template <int N, class FA, class FB>
void wgmma_issue(float* d, const std::uint32_t* a_regs, std::uint64_t desc_a, std::uint64_t desc_b,
                 std::uint32_t scale_d, const char* name, const char* file, int line) {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk32: N is a multiple of 8 up to 256");
    interpret::detail::wgmma_thread& st = interpret::detail::wgmma_state();
    const unsigned t = interpret::detail::running(name).current->tid % 128;
    wgmma_operands<N> mine{};
    mine.desc_a = desc_a;
    mine.desc_b = desc_b;
    mine.scale_d = scale_d;
    for (std::uint64_t desc : {desc_a, desc_b})
        if ((desc >> 49) & 7u)
            model_report(check::ptx_misuse, "",
                         std::string(name) + ": descriptor " + detail::hex64(desc) +
                             " has a non-zero matrix base offset, which the model does not implement",
                         true);
    // the input accumulator: the in-flight value of a chained mma_async, else the registers
    interpret::detail::wgmma_inflight* chained = nullptr;
    for (auto& e : st.inflight)
        if (e.d == d) chained = &e;
    if (chained) {
        for (int i = 0; i < N / 2; ++i) mine.d[i] = chained->value[static_cast<std::size_t>(i)];
    } else {
        if (!st.fenced)
            model_report(check::ptx_misuse, "",
                         std::string(name) + " at " + file + ":" + std::to_string(line) +
                             ": no wgmma.fence since this thread last accessed the accumulator registers "
                             "(or before its first wgmma.mma_async)",
                         false);
        for (int i = 0; i < N / 2; ++i) mine.d[i] = d[i];
    }
    // this thread's share of the operands, read through the checks
    auto read16 = [&](std::uint32_t address, std::uint8_t* out) {
        interpret::detail::machine& m = interpret::detail::running(name);
        const std::uint8_t* p = m.own_window() + address;
        if (m.async_proxy_read(p, 16, name, interpret::detail::site{file, line}))
            std::memcpy(out, p, 16);
        else
            std::memset(out, 0, 16);
    };
    if (a_regs) {
        for (int r = 0; r < 4; ++r)
            for (int b = 0; b < 4; ++b) mine.a[4 * r + b] = static_cast<std::uint8_t>(a_regs[r] >> (8 * b));
    } else {
        read16(wgmma_granule_address(desc_a, t / 2, t % 2), mine.a);
    }
    for (int j = 0; j < wgmma_operands<N>::b_granules; ++j) {
        const unsigned q = t + 128u * static_cast<unsigned>(j);
        if (q < 2u * N) read16(wgmma_granule_address(desc_b, q / 2, q % 2), mine.b[j]);
    }
    const auto out = warpgroup_exchange<wgmma_operands<N>, wgmma_result<N>>(
        name, mine,
        [&](const wgmma_operands<N>* const* in, wgmma_result<N>* const* res) {
            for (int u = 1; u < 128; ++u)
                if (in[u]->desc_a != in[0]->desc_a || in[u]->desc_b != in[0]->desc_b ||
                    (in[u]->scale_d != 0) != (in[0]->scale_d != 0))
                    model_report(check::warp_sync, "",
                                 std::string(name) + ": thread " + std::to_string(u) +
                                     " of the warpgroup passes descriptors " + detail::hex64(in[u]->desc_a) + ", " +
                                     detail::hex64(in[u]->desc_b) + " and scale-d " + std::to_string(in[u]->scale_d) +
                                     ", thread 0 " + detail::hex64(in[0]->desc_a) + ", " +
                                     detail::hex64(in[0]->desc_b) + " and " + std::to_string(in[0]->scale_d),
                                 true);
            double a[64][32], b[N][32];
            for (int u = 0; u < 128; ++u) {
                if (a_regs) {  // warp w's rows 16 w .. 16 w + 15 in mma.sync's A fragment layout
                    const int w = u / 32, g = (u % 32) / 4, tt = u % 4;
                    for (int r = 0; r < 4; ++r)
                        for (int bb = 0; bb < 4; ++bb)
                            a[16 * w + g + 8 * (r & 1)][16 * (r >> 1) + 4 * tt + bb] =
                                static_cast<double>(ptx::decode<FA>(in[u]->a[4 * r + bb]));
                } else {
                    for (int k = 0; k < 16; ++k)
                        a[u / 2][16 * (u % 2) + k] = static_cast<double>(ptx::decode<FA>(in[u]->a[k]));
                }
                for (int j = 0; j < wgmma_operands<N>::b_granules; ++j) {
                    const int q = u + 128 * j;
                    if (q < 2 * N)
                        for (int k = 0; k < 16; ++k)
                            b[q / 2][16 * (q % 2) + k] = static_cast<double>(ptx::decode<FB>(in[u]->b[j][k]));
                }
            }
            const bool accumulate = in[0]->scale_d != 0;
            for (int u = 0; u < 128; ++u) {
                const int w = u / 32, l = u % 32;
                for (int i = 0; i < N / 2; ++i) {
                    const int row = 16 * w + l / 4 + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * (l % 4) + i % 2;
                    double sum = 0;
                    for (int k = 0; k < 32; ++k) sum += a[row][k] * b[col][k];
                    if (accumulate) sum += static_cast<double>(in[u]->d[i]);
                    res[u]->d[i] = static_cast<float>(sum);
                }
            }
        },
        file, line);
    if (chained) {
        chained->value.assign(out.d, out.d + N / 2);
        chained->group = st.groups;
    } else {
        interpret::detail::wgmma_inflight e;
        e.d = d;
        e.n = N / 2;
        e.group = st.groups;
        e.value.assign(out.d, out.d + N / 2);
        e.at = interpret::detail::site{file, line};
        st.inflight.push_back(std::move(e));
    }
    for (int i = 0; i < N / 2; ++i) d[i] = detail::wgmma_poison();
}
}  // namespace detail

/// wgmma.mma_async.sync.aligned.m64nNk32.f32.FA.FB d, desc_a, desc_b, scale_d, 1, 1 (no negation):
/// d = A B + (scale_d ? d : 0), landing in d at the wait_group that completes it.
template <int N, class FA, class FB>
void wgmma_m64nNk32(float* d, std::uint64_t desc_a, std::uint64_t desc_b, std::uint32_t scale_d, const char* name,
                    const char* file, int line) {
    detail::wgmma_issue<N, FA, FB>(d, nullptr, desc_a, desc_b, scale_d, name, file, line);
}
/// The RS form, d, {a0, a1, a2, a3}, desc_b, scale_d, 1, 1: A from the four registers of each thread.
template <int N, class FA, class FB>
void wgmma_m64nNk32_rs(float* d, const std::uint32_t (&a)[4], std::uint64_t desc_b, std::uint32_t scale_d,
                       const char* name, const char* file, int line) {
    detail::wgmma_issue<N, FA, FB>(d, a, 0, desc_b, scale_d, name, file, line);
}

/// wgmma.fence.sync.aligned: orders this thread's register accesses before the next mma_async.
inline void wgmma_fence(const char* file, int line) {
    (void)warpgroup_exchange<int, int>(
        "wgmma.fence.sync.aligned", 0, [](const int* const*, int* const*) {}, file, line);
    interpret::detail::wgmma_state().fenced = true;
}
/// wgmma.commit_group.sync.aligned: the uncommitted mma_asyncs become one wgmma-group.
inline void wgmma_commit_group(const char* file, int line) {
    (void)warpgroup_exchange<int, int>(
        "wgmma.commit_group.sync.aligned", 0, [](const int* const*, int* const*) {}, file, line);
    ++interpret::detail::wgmma_state().groups;
}
/// wgmma.wait_group.sync.aligned n: completes all but the newest n committed wgmma-groups; their
/// results land in their accumulator registers.
inline void wgmma_wait_group(int n, const char* file, int line) {
    (void)warpgroup_exchange<int, int>(
        "wgmma.wait_group.sync.aligned", n,
        [n](const int* const* in, int* const*) {
            for (int u = 0; u < 128; ++u)
                if (*in[u] != n)
                    model_report(check::warp_sync, "",
                                 "wgmma.wait_group: thread " + std::to_string(u) + " of the warpgroup waits for " +
                                     std::to_string(*in[u]) + " pending groups, the last to arrive for " +
                                     std::to_string(n),
                                 true);
        },
        file, line);
    interpret::detail::wgmma_thread& st = interpret::detail::wgmma_state();
    const std::uint32_t keep = static_cast<std::uint32_t>(n < 0 ? 0 : n);
    for (std::size_t i = 0; i < st.inflight.size();) {
        auto& e = st.inflight[i];
        if (e.group + keep < st.groups) {  // committed, and older than the newest `keep` groups
            for (unsigned r = 0; r < e.n; ++r) {
                std::uint32_t bits;
                std::memcpy(&bits, &e.d[r], sizeof bits);
                if (bits != detail::wgmma_poison_bits) {
                    model_report(check::ptx_misuse, "",
                                 "accumulator register " + std::to_string(r) + " of the wgmma.mma_async at " +
                                     to_string(e.at) + " was written before the wgmma.wait_group at " + file + ":" +
                                     std::to_string(line) + " completed it (undefined in the ISA)",
                                 false);
                    break;
                }
            }
            for (unsigned r = 0; r < e.n; ++r) e.d[r] = e.value[r];
            st.inflight.erase(st.inflight.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
            ++i;
        }
    }
    st.fenced = false;
}

}  // namespace model
}  // namespace interpret
}  // namespace octet
