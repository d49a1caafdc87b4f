// octet/cuda/ptx.cuh: the one home of the PTX instructions octet's kernels issue as inline assembly,
// each a named device function. Compiled for the device (nvcc's device pass) it emits the instruction;
// compiled as host code in interpret mode (OCTET_INTERPRET, octet/interpret/interpret.hpp) it calls the
// interpreter's model of the instruction (octet/interpret/ptx_models.hpp), written from the PTX ISA's
// description and tested on its own (tests/interpret/), so that kernels built on these functions run,
// and are checked, on the CPU. Elsewhere (nvcc's host pass) the bodies are empty: only kernels call them.
//
// Shared-memory operands are 32-bit shared-window addresses, as in PTX (shared_address below); the
// models turn them back into checked shared pointers, so an instruction's shared reads and writes go
// through the same race, bounds and initialisation checks as the kernel's own accesses.
#pragma once

#include <cstdint>
#include <type_traits>

#include "octet/config.hpp"
#include "octet/format/float_format.hpp"  // e4m3, e5m2 (mma.sync's operand types)

#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
#include "octet/interpret/ptx_models.hpp"
#endif

namespace octet {
namespace ptx {

/// cvta.to.shared: the 32-bit shared-window address of a generic pointer into shared memory (a T* on
/// the device, an interpret::sptr<T> in interpret mode).
template <class P>
OCTET_DEVICE std::uint32_t shared_address(const P& p) {
    return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mma.sync ---------------------------------------------------------------------------------------

namespace detail {
template <class F>
constexpr bool is_fp8_mma_operand = std::is_same_v<F, e4m3> || std::is_same_v<F, e5m2>;
}  // namespace detail

// mma.sync.aligned.m16n8k32.row.col.f32.{e4m3,e5m2}.{e4m3,e5m2}.f32: d = a * b + c for the warp's
// 16 x 32 A (row-major), 32 x 8 B (column-major) and 16 x 8 C/D, in the ISA's fragments (per lane,
// g = lane / 4, t = lane % 4; codes packed lowest byte first): a[0] = A[g][4t..4t+3],
// a[1] = A[g+8][4t..], a[2] = A[g][16+4t..], a[3] = A[g+8][16+4t..]; b[0] = B[4t..4t+3][g],
// b[1] = B[16+4t..][g]; c/d[0..1] = row g, columns 2t, 2t+1; c/d[2..3] = row g+8, same columns.
// FP8 tensor cores need sm_89: compiled for an older device the call traps (launchers refuse those).
// In interpret mode: interpret::model::mma_m16n8k32 (its comment says how it rounds).

// The four type pairs, one asm statement each (M(TA, TB) is the statement).
#define OCTET_PTX_MMA_FP8_PAIRS(M)                                      \
    if constexpr (std::is_same_v<FA, e4m3> && std::is_same_v<FB, e4m3>) \
        M("e4m3", "e4m3");                                              \
    else if constexpr (std::is_same_v<FA, e4m3>)                        \
        M("e4m3", "e5m2");                                              \
    else if constexpr (std::is_same_v<FB, e4m3>)                        \
        M("e5m2", "e4m3");                                              \
    else                                                                \
        M("e5m2", "e5m2")

/// d = a * b + c (d may be c).
template <class FA, class FB>
OCTET_DEVICE void mma_m16n8k32(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                               const float (&c)[4]) {
    static_assert(detail::is_fp8_mma_operand<FA> && detail::is_fp8_mma_operand<FB>,
                  "mma.sync m16n8k32 multiplies E4M3 or E5M2 operands");
#if OCTET_DEVICE_PASS
#if __CUDA_ARCH__ >= 890
#define OCTET_PTX_MMA(TA, TB)                                                                                         \
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." TA "." TB                                                   \
                 ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"                                   \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                                     \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), \
                   "f"(c[3]))
    OCTET_PTX_MMA_FP8_PAIRS(OCTET_PTX_MMA);
#undef OCTET_PTX_MMA
#else
    (void)d, (void)a, (void)b, (void)c;
    __trap();
#endif
#elif defined(OCTET_INTERPRET)
    interpret::model::mma_m16n8k32<FA, FB>(d, a, b, c);
#else
    (void)d, (void)a, (void)b, (void)c;
#endif
}

/// d = a * b + d: the accumulate-in-place form the kernels use (d as "+f" operands, as C and D).
template <class FA, class FB>
OCTET_DEVICE void mma_m16n8k32_acc(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
    static_assert(detail::is_fp8_mma_operand<FA> && detail::is_fp8_mma_operand<FB>,
                  "mma.sync m16n8k32 multiplies E4M3 or E5M2 operands");
#if OCTET_DEVICE_PASS
#if __CUDA_ARCH__ >= 890
#define OCTET_PTX_MMA_ACC(TA, TB)                                               \
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." TA "." TB             \
                 ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])               \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
    OCTET_PTX_MMA_FP8_PAIRS(OCTET_PTX_MMA_ACC);
#undef OCTET_PTX_MMA_ACC
#else
    (void)d, (void)a, (void)b;
    __trap();
#endif
#elif defined(OCTET_INTERPRET)
    interpret::model::mma_m16n8k32<FA, FB>(d, a, b, d);
#else
    (void)d, (void)a, (void)b;
#endif
}
#undef OCTET_PTX_MMA_FP8_PAIRS

// ---- ldmatrix ---------------------------------------------------------------------------------------

// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16: the warp loads 1, 2 or 4 8 x 8 matrices of
// 16-bit elements from shared memory. Lanes 8m..8m+7 give the 16-byte-aligned shared addresses of rows
// 0..7 of matrix m (the other lanes' addresses are ignored); r[m] of lane L holds elements
// 2 (L % 4) and 2 (L % 4) + 1 of row L / 4 (lowest half first), or with .trans those of column
// L / 4: rows 2 (L % 4) and 2 (L % 4) + 1. In interpret mode: interpret::model::ldmatrix.
OCTET_DEVICE void ldmatrix_x1(std::uint32_t (&r)[1], std::uint32_t address) {
#if OCTET_DEVICE_PASS
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(address));
#elif defined(OCTET_INTERPRET)
    interpret::model::ldmatrix<1, false>(r, address);
#else
    (void)r, (void)address;
#endif
}
OCTET_DEVICE void ldmatrix_x2(std::uint32_t (&r)[2], std::uint32_t address) {
#if OCTET_DEVICE_PASS
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(address));
#elif defined(OCTET_INTERPRET)
    interpret::model::ldmatrix<2, false>(r, address);
#else
    (void)r, (void)address;
#endif
}
OCTET_DEVICE void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t address) {
#if OCTET_DEVICE_PASS
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
#elif defined(OCTET_INTERPRET)
    interpret::model::ldmatrix<4, false>(r, address);
#else
    (void)r, (void)address;
#endif
}
OCTET_DEVICE void ldmatrix_x1_trans(std::uint32_t (&r)[1], std::uint32_t address) {
#if OCTET_DEVICE_PASS
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(address));
#elif defined(OCTET_INTERPRET)
    interpret::model::ldmatrix<1, true>(r, address);
#else
    (void)r, (void)address;
#endif
}
OCTET_DEVICE void ldmatrix_x2_trans(std::uint32_t (&r)[2], std::uint32_t address) {
#if OCTET_DEVICE_PASS
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(address));
#elif defined(OCTET_INTERPRET)
    interpret::model::ldmatrix<2, true>(r, address);
#else
    (void)r, (void)address;
#endif
}
OCTET_DEVICE void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t address) {
#if OCTET_DEVICE_PASS
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
#elif defined(OCTET_INTERPRET)
    interpret::model::ldmatrix<4, true>(r, address);
#else
    (void)r, (void)address;
#endif
}

// ---- cp.async ---------------------------------------------------------------------------------------

// ---- mbarrier ---------------------------------------------------------------------------------------

// ---- cp.async.bulk.tensor (TMA), prefetch.tensormap -------------------------------------------------

// ---- fence.proxy.async, setmaxnreg ------------------------------------------------------------------

// ---- wgmma ------------------------------------------------------------------------------------------

}  // namespace ptx
}  // namespace octet
