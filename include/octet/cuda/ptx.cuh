// octet/cuda/ptx.cuh: the one home of the PTX instructions octet's kernels issue as inline assembly,
// each a named device function. Compiled for the device (nvcc's device pass) it emits the instruction;
// compiled as host code in interpret mode (OCTET_INTERPRET, the octet::interpret target) it calls the
// interpreter's model of the instruction (interpret/include/octet/interpret/ptx_models.hpp, reached
// through octet/cuda/interpret_seam.hpp), written from the PTX ISA's description and tested on its own
// (interpret/tests/), so that kernels built on these functions run,
// and are checked, on the CPU. Elsewhere (nvcc's host pass) the bodies are empty: only kernels call them.
//
// Shared-memory operands are 32-bit shared-window addresses, as in PTX (shared_address below); the
// models turn them back into checked shared pointers, so an instruction's shared reads and writes go
// through the same race, bounds and initialisation checks as the kernel's own accesses.
#pragma once

#include <cstdint>
#include <type_traits>

#include "octet/config.hpp"
#include "octet/format/float_format.hpp"

#include "octet/cuda/interpret_seam.hpp"  // the interpreter's models, in interpret mode only
#if defined(__CUDACC__) || defined(OCTET_INTERPRET)
#include <cuda.h>  // CUtensorMap (the toolkit's header only: nothing is linked)
#endif

// In interpret mode the functions take their call site (for reports) as defaulted arguments; the
// device code has none.
#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
#define OCTET_PTX_SITE , const char *file = __builtin_FILE(), int line = __builtin_LINE()
#define OCTET_PTX_SITE_ONLY const char *file = __builtin_FILE(), int line = __builtin_LINE()
#else
#define OCTET_PTX_SITE
#define OCTET_PTX_SITE_ONLY
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
    interpret::model::mma_m16n8k32<cuda::interpret_element_t<FA>, cuda::interpret_element_t<FB> >(d, a, b, c);
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
    interpret::model::mma_m16n8k32<cuda::interpret_element_t<FA>, cuda::interpret_element_t<FB> >(d, a, b, d);
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

// ---- stmatrix --------------------------------------------------------------------------------------

/// stmatrix.sync.aligned.m8n8.x4.shared.b16 (sm_90): ldmatrix_x4's inverse. Lanes 8m..8m+7 give the
/// 16-byte-aligned shared addresses of rows 0..7 of matrix m; r[m] of lane L holds elements 2 (L % 4)
/// and 2 (L % 4) + 1 of row L / 4 of matrix m (lowest half first). Compiled for an older device the
/// call traps. In interpret mode: interpret::model::stmatrix_x4.
OCTET_DEVICE void stmatrix_x4(const std::uint32_t (&r)[4], std::uint32_t address) {
#if OCTET_DEVICE_PASS
#if __CUDA_ARCH__ >= 900
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(r[0]),
                 "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
#else
    (void)r, (void)address;
    __trap();
#endif
#elif defined(OCTET_INTERPRET)
    interpret::model::stmatrix_x4(r, address);
#else
    (void)r, (void)address;
#endif
}

// ---- cp.async ---------------------------------------------------------------------------------------
// Ampere's asynchronous global -> shared copy. A copy's bytes may land any time before the
// wait_group / wait_all covering its group, and are visible to other threads only through a barrier
// after that (the model writes them at the wait: a read before it is reported). Every asm has a
// memory clobber so the compiler keeps the kernel's own shared accesses on their side of it.

/// cp.async.cg.shared.global [dst], [src], 16, src_size: copies 16 bytes to shared address dst (16-byte
/// aligned), the first src_size (0..16) from src (16-byte aligned), the rest zeros; src_size 0 reads
/// nothing from src. Bypasses L1 (.cg).
OCTET_DEVICE void cp_async_cg_16(std::uint32_t dst, const void* src, std::uint32_t src_size) {
#if OCTET_DEVICE_PASS
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size) : "memory");
#elif defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    interpret::model::cp_async("cp.async.cg.shared.global", dst, src, 16, src_size);
#else
    (void)dst, (void)src, (void)src_size;
#endif
}

/// cp.async.ca.shared.global [dst], [src], Size, src_size (Size 4, 8 or 16; src_size 0..Size): as
/// cp_async_cg_16, cached in L1 (.ca); both addresses aligned to Size.
template <int Size>
OCTET_DEVICE void cp_async_ca(std::uint32_t dst, const void* src, std::uint32_t src_size) {
    static_assert(Size == 4 || Size == 8 || Size == 16, "cp.async.ca copies 4, 8 or 16 bytes");
#if OCTET_DEVICE_PASS
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(Size), "r"(src_size)
                 : "memory");
#elif defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    interpret::model::cp_async("cp.async.ca.shared.global", dst, src, Size, src_size);
#else
    (void)dst, (void)src, (void)src_size;
#endif
}

/// cp.async.commit_group: the thread's copies issued since its last commit form one group.
OCTET_DEVICE void cp_async_commit_group() {
#if OCTET_DEVICE_PASS
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#elif defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    interpret::model::cp_async_commit_group();
#endif
}

/// cp.async.wait_group N: waits until at most the N newest of the thread's groups are pending.
template <int N>
OCTET_DEVICE void cp_async_wait_group() {
    static_assert(N >= 0, "wait_group counts groups");
#if OCTET_DEVICE_PASS
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#elif defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    interpret::model::cp_async_wait_group(N);
#endif
}

/// cp.async.wait_all: commit_group, then wait_group 0.
OCTET_DEVICE void cp_async_wait_all() {
#if OCTET_DEVICE_PASS
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#elif defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    interpret::model::cp_async_wait_all();
#endif
}

// ---- mbarrier ---------------------------------------------------------------------------------------
// An mbarrier is an 8-byte object in shared memory (`bar`: its 8-byte aligned shared address) that
// counts arrivals and transaction bytes of its current phase; the phase completes when both reach zero,
// and its parity flips (PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier").

/// mbarrier.init.shared::cta.b64: a phase 0 expecting `count` arrivals.
OCTET_DEVICE void mbarrier_init(std::uint32_t bar, std::uint32_t count) {
#if OCTET_DEVICE_PASS
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#elif defined(OCTET_INTERPRET)
    interpret::model::mbarrier_init(bar, count);
#endif
}
/// fence.mbarrier_init.release.cluster: makes prior mbarrier.init visible (to the cluster).
OCTET_DEVICE void fence_mbarrier_init() {
#if OCTET_DEVICE_PASS
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#elif defined(OCTET_INTERPRET)
    interpret::model::fence_mbarrier_init();
#endif
}
/// mbarrier.arrive.shared::cta.b64 (state discarded): one arrival, with release semantics.
OCTET_DEVICE void mbarrier_arrive(std::uint32_t bar) {
#if OCTET_DEVICE_PASS
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#elif defined(OCTET_INTERPRET)
    interpret::model::mbarrier_arrive(bar, 0, false);
#endif
}
/// mbarrier.arrive.expect_tx.shared::cta.b64: expect `bytes` more transaction bytes, then arrive.
OCTET_DEVICE void mbarrier_arrive_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
#if OCTET_DEVICE_PASS
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#elif defined(OCTET_INTERPRET)
    interpret::model::mbarrier_arrive(bar, bytes, true);
#endif
}
// ---- thread block clusters (sm_90) ------------------------------------------------------------------

/// %cluster_ctarank: this CTA's rank in its cluster (0 without clusters).
OCTET_DEVICE std::uint32_t cluster_ctarank() {
#if OCTET_DEVICE_PASS
    std::uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
#elif defined(OCTET_INTERPRET)
    return interpret::model::cluster_ctarank();
#else
    return 0;
#endif
}
/// %cluster_nctarank: the CTAs in this CTA's cluster (1 without clusters).
OCTET_DEVICE std::uint32_t cluster_nctarank() {
#if OCTET_DEVICE_PASS
    std::uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
    return r;
#elif defined(OCTET_INTERPRET)
    return interpret::model::cluster_nctarank();
#else
    return 1;
#endif
}
/// mapa.shared::cluster.u32: the shared::cluster address of shared::cta address `addr` in the CTA of
/// cluster rank `rank` (for a remote mbarrier arrival).
OCTET_DEVICE std::uint32_t mapa_shared(std::uint32_t addr, std::uint32_t rank) {
#if OCTET_DEVICE_PASS
    std::uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
#elif defined(OCTET_INTERPRET)
    return interpret::model::mapa_shared(addr, rank);
#else
    (void)rank;
    return addr;
#endif
}
/// mbarrier.arrive.shared::cluster.b64: one arrival, with release semantics, on the mbarrier at
/// shared::cluster address `bar` (mapa_shared: possibly another CTA's of the cluster).
OCTET_DEVICE void mbarrier_arrive_cluster(std::uint32_t bar) {
#if OCTET_DEVICE_PASS
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
#elif defined(OCTET_INTERPRET)
    interpret::model::mbarrier_arrive(bar, 0, false);
#else
    (void)bar;
#endif
}
/// barrier.cluster.arrive.release: this thread's arrival at the cluster-wide barrier (every thread of
/// every CTA of the cluster arrives, then waits), releasing its prior memory accesses.
OCTET_DEVICE void barrier_cluster_arrive() {
#if OCTET_DEVICE_PASS
    asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
#elif defined(OCTET_INTERPRET)
    interpret::model::barrier_cluster_arrive();
#endif
}
/// barrier.cluster.wait.acquire: waits until every thread of the cluster has arrived.
OCTET_DEVICE void barrier_cluster_wait() {
#if OCTET_DEVICE_PASS
    asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
#elif defined(OCTET_INTERPRET)
    interpret::model::barrier_cluster_wait();
#endif
}

/// mbarrier.try_wait.parity.shared::cta.b64: true when the phase of parity `parity` (the current
/// phase's predecessor, if the current phase has the other parity) has completed; acquire semantics.
/// The instruction may suspend the thread for a while before giving up; the model suspends it until
/// the phase completes (so it always returns true), and a wait that can never end is a deadlock report.
OCTET_DEVICE bool mbarrier_try_wait_parity(std::uint32_t bar, std::uint32_t parity) {
#if OCTET_DEVICE_PASS
    std::uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return done != 0;
#elif defined(OCTET_INTERPRET)
    return interpret::model::mbarrier_try_wait_parity(bar, parity);
#else
    (void)bar;
    (void)parity;
    return true;
#endif
}

/// bar.sync id, count: waits until `count` threads (a multiple of 32) have arrived at named barrier
/// `id` (1..15; 0 is __syncthreads'), ordering their shared-memory accesses.
OCTET_DEVICE void bar_sync(std::uint32_t id, std::uint32_t count) {
#if OCTET_DEVICE_PASS
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
#elif defined(OCTET_INTERPRET)
    interpret::bar_sync(id, count);
#else
    (void)id, (void)count;
#endif
}

/// bar.arrive id, count: counts this thread toward named barrier `id`'s `count` without waiting (the
/// threads that bar_sync on it wait for these arrivals), releasing its shared-memory writes to them.
OCTET_DEVICE void bar_arrive(std::uint32_t id, std::uint32_t count) {
#if OCTET_DEVICE_PASS
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
#elif defined(OCTET_INTERPRET)
    interpret::bar_arrive(id, count);
#else
    (void)id, (void)count;
#endif
}

/// Waits until the phase of parity `parity` has completed (mbarrier_try_wait_parity in a loop). With
/// OCTET_MBARRIER_WATCHDOG defined (a debug option; define it for every translation unit of the
/// program) the wait traps after about 2^35 clocks (~17 s at 1.98 GHz) instead of spinning for ever on
/// a protocol bug; without it, the default, a legitimate long wait (a GPU shared with other work, a
/// debugger) is never cut short.
OCTET_DEVICE void mbarrier_wait(std::uint32_t bar, std::uint32_t parity) {
#if OCTET_DEVICE_PASS && defined(OCTET_MBARRIER_WATCHDOG)
    std::uint32_t spins = 0;
    long long start = 0;
    while (!mbarrier_try_wait_parity(bar, parity)) {
        if ((++spins & 0x3FFu) == 0) {
            const long long now = clock64();
            if (start == 0)
                start = now;
            else if (now - start > (1ll << 35))
                __trap();
        }
    }
#else
    while (!mbarrier_try_wait_parity(bar, parity)) {
    }
#endif
}

// ---- cp.async.bulk.tensor (TMA), prefetch.tensormap -------------------------------------------------

#if defined(__CUDACC__) || defined(OCTET_INTERPRET)
/// cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes: copies the box of
/// `map` at element coordinates (inner, outer) into shared memory at `dst` (swizzled as the map says,
/// out-of-bounds elements zero), and completes the box's bytes as transactions on the mbarrier `bar`.
OCTET_DEVICE void tma_load_2d(std::uint32_t dst, const CUtensorMap* map, std::int32_t inner, std::int32_t outer,
                              std::uint32_t bar) {
#if OCTET_DEVICE_PASS
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
            "r"(dst),
        "l"(reinterpret_cast<std::uint64_t>(map)), "r"(inner), "r"(outer), "r"(bar)
        : "memory");
#elif defined(OCTET_INTERPRET)
    interpret::model::tma_load_2d(dst, map, inner, outer, bar);
#else
    (void)dst, (void)map, (void)inner, (void)outer, (void)bar;
#endif
}
/// The same with .multicast::cluster: the box lands at the same CTA-relative offset `dst` in every CTA
/// of the cluster whose rank is set in `mask`, each completing the box's bytes on its own mbarrier at
/// offset `bar`.
OCTET_DEVICE void tma_load_2d_multicast(std::uint32_t dst, const CUtensorMap* map, std::int32_t inner,
                                        std::int32_t outer, std::uint32_t bar, std::uint16_t mask) {
#if OCTET_DEVICE_PASS
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
        "{%2, "
        "%3}], [%4], %5;\n" ::"r"(dst),
        "l"(reinterpret_cast<std::uint64_t>(map)), "r"(inner), "r"(outer), "r"(bar), "h"(mask)
        : "memory");
#elif defined(OCTET_INTERPRET)
    interpret::model::tma_load_2d_multicast(dst, map, inner, outer, bar, mask);
#else
    (void)dst, (void)map, (void)inner, (void)outer, (void)bar, (void)mask;
#endif
}
/// cp.async.bulk.tensor.2d.global.shared::cta.bulk_group: stores the box of `map` at element
/// coordinates (inner, outer) from shared memory at `src` (laid out, swizzled, as a tma_load_2d of the
/// same map would write it); elements outside the tensor are not written. Joins this thread's
/// current bulk group (bulk_commit_group closes it); `src` may be written again only after a
/// bulk_wait_group_read has completed the group, and the thread must complete its groups before it
/// exits. The source must have been made visible to the async proxy (fence_proxy_async_shared by its
/// writers, then a barrier).
OCTET_DEVICE void tma_store_2d(const CUtensorMap* map, std::int32_t inner, std::int32_t outer, std::uint32_t src) {
#if OCTET_DEVICE_PASS
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                     reinterpret_cast<std::uint64_t>(map)),
                 "r"(inner), "r"(outer), "r"(src)
                 : "memory");
#elif defined(OCTET_INTERPRET)
    interpret::model::tma_store_2d(map, inner, outer, src);
#else
    (void)map, (void)inner, (void)outer, (void)src;
#endif
}
/// prefetch.tensormap: brings the tensor map into the cache (a hint: no effect on results).
OCTET_DEVICE void prefetch_tensormap(const CUtensorMap* map) {
#if OCTET_DEVICE_PASS
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(map)) : "memory");
#elif defined(OCTET_INTERPRET)
    interpret::model::prefetch_tensormap(map);
#else
    (void)map;
#endif
}
#endif
/// cp.async.bulk.commit_group: this thread's bulk stores since its last commit become its newest group.
OCTET_DEVICE void bulk_commit_group() {
#if OCTET_DEVICE_PASS
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#elif defined(OCTET_INTERPRET)
    interpret::model::bulk_commit_group();
#endif
}
/// cp.async.bulk.wait_group.read N: waits until all but this thread's newest N bulk groups have read
/// their shared-memory sources (their global writes may still be in flight).
template <int N>
OCTET_DEVICE void bulk_wait_group_read() {
    static_assert(N >= 0 && N <= 7, "cp.async.bulk.wait_group takes 0..7");
#if OCTET_DEVICE_PASS
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#elif defined(OCTET_INTERPRET)
    interpret::model::bulk_wait_group_read(N);
#endif
}

// ---- fence.proxy.async, setmaxnreg ------------------------------------------------------------------

/// fence.proxy.async.shared::cta: orders this thread's generic-proxy shared-memory accesses with the
/// async proxy's (wgmma operand reads, TMA stores) that follow it.
OCTET_DEVICE void fence_proxy_async_shared() {
#if OCTET_DEVICE_PASS
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#elif defined(OCTET_INTERPRET)
    interpret::model::fence_proxy_async_shared();
#endif
}
/// setmaxnreg.inc.sync.aligned.u32 N: raises this warp's register limit to N (warpgroup-collective:
/// all threads of the warpgroup execute it, with the same N).
template <std::uint32_t N>
OCTET_DEVICE void setmaxnreg_inc() {
    static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg: a multiple of 8 in 24..256");
#if OCTET_DEVICE_PASS
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#elif defined(OCTET_INTERPRET)
    interpret::model::setmaxnreg(N, true);
#endif
}
/// setmaxnreg.dec.sync.aligned.u32 N: lowers this warp's register limit to N (as setmaxnreg_inc).
template <std::uint32_t N>
OCTET_DEVICE void setmaxnreg_dec() {
    static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg: a multiple of 8 in 24..256");
#if OCTET_DEVICE_PASS
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#elif defined(OCTET_INTERPRET)
    interpret::model::setmaxnreg(N, false);
#endif
}

// ---- wgmma ------------------------------------------------------------------------------------------
// Hopper's warpgroup MMA (sm_90a only: elsewhere in the device pass the bodies are empty). All four are
// .sync.aligned: the 128 threads of a warpgroup execute them together. The model (ptx_models.hpp,
// "wgmma") says what interpret mode computes and checks.

/// wgmma's shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"), as byte values.
enum class wgmma_swizzle : std::uint32_t { none = 0, b128 = 1, b64 = 2, b32 = 3 };
struct wgmma_descriptor {
    std::uint32_t start = 0;        ///< shared address of the matrix (16-byte aligned)
    std::uint32_t leading = 0;      ///< LBO: bytes between core matrices adjacent in K (no swizzle)
    std::uint32_t stride = 0;       ///< SBO: bytes between 8-row groups (core matrices / swizzle atoms) in M or N
    std::uint32_t base_offset = 0;  ///< 3 bits; 0 when swizzle atoms are aligned to the pattern's repeat
    wgmma_swizzle swizzle = wgmma_swizzle::none;
    /// Bits 0-13 start >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, 49-51 base offset, 62-63 swizzle mode;
    /// addresses and offsets keep their low 18 bits.
    OCTET_HD constexpr std::uint64_t encode() const {
#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
        // the encoding drops the low 4 bits: a misaligned address or offset would silently move
        if ((start | leading | stride) & 15u) interpret::model::wgmma_descriptor_misaligned(start, leading, stride);
#endif
        return static_cast<std::uint64_t>((start & 0x3FFFFu) >> 4) |
               static_cast<std::uint64_t>((leading & 0x3FFFFu) >> 4) << 16 |
               static_cast<std::uint64_t>((stride & 0x3FFFFu) >> 4) << 32 |
               static_cast<std::uint64_t>(base_offset & 7u) << 49 | static_cast<std::uint64_t>(swizzle) << 62;
    }
};

/// wgmma.fence.sync.aligned: orders the warpgroup's register accesses before the wgmma.mma_async
/// that follow (required before the first, and after touching the accumulators).
OCTET_DEVICE void wgmma_fence(OCTET_PTX_SITE_ONLY) {
#if OCTET_DEVICE_PASS
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
#elif defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    interpret::model::wgmma_fence(file, line);
#endif
}
/// wgmma.commit_group.sync.aligned: the uncommitted wgmma.mma_async become one wgmma-group.
OCTET_DEVICE void wgmma_commit_group(OCTET_PTX_SITE_ONLY) {
#if OCTET_DEVICE_PASS
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
#elif defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    interpret::model::wgmma_commit_group(file, line);
#endif
}
/// wgmma.wait_group.sync.aligned N: waits until at most N wgmma-groups are pending; the accumulators
/// of the completed ones may be read from then on.
template <int N>
OCTET_DEVICE void wgmma_wait_group(OCTET_PTX_SITE_ONLY) {
#if OCTET_DEVICE_PASS
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
#elif defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    interpret::model::wgmma_wait_group(N, file, line);
#endif
}
/// Keeps the compiler from moving accesses of an accumulator register across the wgmma fences (an
/// empty asm that "modifies" r; nothing in interpret mode, where calls are not reordered).
OCTET_DEVICE void fence_operand(float& r) {
#if OCTET_DEVICE_PASS
    asm volatile("" : "+f"(r)::"memory");
#else
    (void)r;
#endif
}
/// The same for a register the RS form of wgmma reads as A: fenced after the wait_group that completes
/// the wgmma, it stays live (and so unchanged: the compiler cannot give its register to another value)
/// while the tensor cores may still read it.
OCTET_DEVICE void fence_operand(std::uint32_t& r) {
#if OCTET_DEVICE_PASS
    asm volatile("" : "+r"(r)::"memory");
#else
    (void)r;
#endif
}

// The accumulator operand lists of the asm statements below: N / 2 float registers in and out.
#define OCTET_WGMMA_D16                                                                                         \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define OCTET_WGMMA_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define OCTET_WGMMA_D32                                                                                         \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define OCTET_WGMMA_D64                                                                                         \
    OCTET_WGMMA_D32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), \
        "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), \
        "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), \
        "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
        "+f"(d[63])
#define OCTET_WGMMA_D96                                                                                         \
    OCTET_WGMMA_D64, "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), \
        "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), \
        "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), \
        "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), \
        "+f"(d[95])
#define OCTET_WGMMA_R32                                                                                               \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
    "%24, %25, %26, %27, %28, %29, %30, %31}"
#define OCTET_WGMMA_R64                                                                                               \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
    "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
    "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define OCTET_WGMMA_R96                                                                                               \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
    "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
    "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, "  \
    "%68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, "  \
    "%90, %91, %92, %93, %94, %95}"

/// 0..3 for (e4m3, e4m3), (e4m3, e5m2), (e5m2, e4m3), (e5m2, e5m2).
template <class FA, class FB>
OCTET_HD constexpr int wgmma_type_pair() {
    return (std::is_same_v<FA, e4m3> ? 0 : 2) + (std::is_same_v<FB, e4m3> ? 0 : 1);
}
#define OCTET_WGMMA_SS(NN, DREGS, DOPS, TA, TB, A, B, P)                                                               \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P                                                                 \
                 ", 0;\n"                                                                                              \
                 "wgmma.mma_async.sync.aligned.m64n" NN "k32.f32." TA "." TB " " DREGS ", " A ", " B ", p, 1, 1;\n}\n" \
                 : OCTET_WGMMA_##DOPS                                                                                  \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d))
#define OCTET_WGMMA_RS(NN, DREGS, DOPS, TA, TB, A, B, P)                                                               \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P                                                                 \
                 ", 0;\n"                                                                                              \
                 "wgmma.mma_async.sync.aligned.m64n" NN "k32.f32." TA "." TB " " DREGS ", " A ", " B ", p, 1, 1;\n}\n" \
                 : OCTET_WGMMA_##DOPS                                                                                  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))
// The asm of wgmma.mma_async m64nNk32 .f32.FA.FB with A from a descriptor (SS) or from four registers
// (RS); the predicate is scale-d, no negation. One statement per type pair (the types are part of the instruction's
// name).
#define OCTET_WGMMA_TYPES(FORM, NN, DREGS, DOPS, A, B, P)  \
    if constexpr (wgmma_type_pair<FA, FB>() == 0) {        \
        FORM(NN, DREGS, DOPS, "e4m3", "e4m3", A, B, P);    \
    } else if constexpr (wgmma_type_pair<FA, FB>() == 1) { \
        FORM(NN, DREGS, DOPS, "e4m3", "e5m2", A, B, P);    \
    } else if constexpr (wgmma_type_pair<FA, FB>() == 2) { \
        FORM(NN, DREGS, DOPS, "e5m2", "e4m3", A, B, P);    \
    } else {                                               \
        FORM(NN, DREGS, DOPS, "e5m2", "e5m2", A, B, P);    \
    }

/// The instruction's name for the interpreter's reports (RegisterA: the RS form).
template <int N, class FA, class FB, bool RegisterA>
constexpr const char* wgmma_name() {
    constexpr const char* names[2][4][4] = {
        {{"wgmma.mma_async.m64n32k32.f32.e4m3.e4m3", "wgmma.mma_async.m64n32k32.f32.e4m3.e5m2",
          "wgmma.mma_async.m64n32k32.f32.e5m2.e4m3", "wgmma.mma_async.m64n32k32.f32.e5m2.e5m2"},
         {"wgmma.mma_async.m64n64k32.f32.e4m3.e4m3", "wgmma.mma_async.m64n64k32.f32.e4m3.e5m2",
          "wgmma.mma_async.m64n64k32.f32.e5m2.e4m3", "wgmma.mma_async.m64n64k32.f32.e5m2.e5m2"},
         {"wgmma.mma_async.m64n128k32.f32.e4m3.e4m3", "wgmma.mma_async.m64n128k32.f32.e4m3.e5m2",
          "wgmma.mma_async.m64n128k32.f32.e5m2.e4m3", "wgmma.mma_async.m64n128k32.f32.e5m2.e5m2"},
         {"wgmma.mma_async.m64n192k32.f32.e4m3.e4m3", "wgmma.mma_async.m64n192k32.f32.e4m3.e5m2",
          "wgmma.mma_async.m64n192k32.f32.e5m2.e4m3", "wgmma.mma_async.m64n192k32.f32.e5m2.e5m2"}},
        {{"wgmma.mma_async.m64n32k32.f32.e4m3.e4m3 (A in registers)",
          "wgmma.mma_async.m64n32k32.f32.e4m3.e5m2 (A in registers)",
          "wgmma.mma_async.m64n32k32.f32.e5m2.e4m3 (A in registers)",
          "wgmma.mma_async.m64n32k32.f32.e5m2.e5m2 (A in registers)"},
         {"wgmma.mma_async.m64n64k32.f32.e4m3.e4m3 (A in registers)",
          "wgmma.mma_async.m64n64k32.f32.e4m3.e5m2 (A in registers)",
          "wgmma.mma_async.m64n64k32.f32.e5m2.e4m3 (A in registers)",
          "wgmma.mma_async.m64n64k32.f32.e5m2.e5m2 (A in registers)"},
         {"wgmma.mma_async.m64n128k32.f32.e4m3.e4m3 (A in registers)",
          "wgmma.mma_async.m64n128k32.f32.e4m3.e5m2 (A in registers)",
          "wgmma.mma_async.m64n128k32.f32.e5m2.e4m3 (A in registers)",
          "wgmma.mma_async.m64n128k32.f32.e5m2.e5m2 (A in registers)"},
         {"wgmma.mma_async.m64n192k32.f32.e4m3.e4m3 (A in registers)",
          "wgmma.mma_async.m64n192k32.f32.e4m3.e5m2 (A in registers)",
          "wgmma.mma_async.m64n192k32.f32.e5m2.e4m3 (A in registers)",
          "wgmma.mma_async.m64n192k32.f32.e5m2.e5m2 (A in registers)"}}};
    return names[RegisterA][N == 32 ? 0 : N == 64 ? 1 : N == 128 ? 2 : 3][wgmma_type_pair<FA, FB>()];
}

template <int N, class FA, class FB>
OCTET_HD constexpr void wgmma_check_types() {
    static_assert(N == 32 || N == 64 || N == 128 || N == 192,
                  "wgmma_m64nNk32: N = 32, 64, 128 or 192 (add the operand list for others)");
    static_assert(std::is_same_v<FA, e4m3> || std::is_same_v<FA, e5m2>, "wgmma_m64nNk32: FP8 A (e4m3, e5m2)");
    static_assert(std::is_same_v<FB, e4m3> || std::is_same_v<FB, e5m2>, "wgmma_m64nNk32: FP8 B (e4m3, e5m2)");
}

/// wgmma.mma_async.sync.aligned.m64nNk32.f32.FA.FB with A (64 x 32) and B (N x 32), both K-major in
/// shared memory as the descriptors say, N = 32, 64, 128 or 192 (FA, FB: e4m3 or e5m2):
/// d = A B^T + (scale_d ? d : 0), complete at the wgmma.wait_group of its group.
template <int N, class FA, class FB>
OCTET_DEVICE void wgmma_m64nNk32(float (&d)[N / 2], std::uint64_t desc_a, std::uint64_t desc_b,
                                 std::uint32_t scale_d OCTET_PTX_SITE) {
    wgmma_check_types<N, FA, FB>();
#if OCTET_DEVICE_PASS
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (N == 192) {
        OCTET_WGMMA_TYPES(OCTET_WGMMA_SS, "192", OCTET_WGMMA_R96, D96, "%96", "%97", "%98")
    } else if constexpr (N == 128) {
        OCTET_WGMMA_TYPES(OCTET_WGMMA_SS, "128", OCTET_WGMMA_R64, D64, "%64", "%65", "%66")
    } else if constexpr (N == 64) {
        OCTET_WGMMA_TYPES(OCTET_WGMMA_SS, "64", OCTET_WGMMA_R32, D32, "%32", "%33", "%34")
    } else {
        OCTET_WGMMA_TYPES(OCTET_WGMMA_SS, "32", OCTET_WGMMA_R16, D16, "%16", "%17", "%18")
    }
#endif
#elif defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    interpret::model::wgmma_m64nNk32<N, cuda::interpret_element_t<FA>, cuda::interpret_element_t<FB> >(
        d, desc_a, desc_b, scale_d, wgmma_name<N, FA, FB, false>(), file, line);
#else
    (void)d, (void)desc_a, (void)desc_b, (void)scale_d;
#endif
}

/// The same with A from registers (wgmma's RS form): each warp w of the warpgroup supplies rows
/// 16 w .. 16 w + 15 of A in mma.sync.m16n8k32's A fragment layout (lane 4 g + t: a[0] = row g,
/// K bytes 4 t .. 4 t + 3; a[1] = row g + 8, the same bytes; a[2], a[3] = the same rows, K bytes
/// 16 + 4 t .. 16 + 4 t + 3; byte b of a register is K byte b of its four). The ISA leaves the
/// registers undefined to access until the wait_group that completes the instruction.
template <int N, class FA, class FB>
OCTET_DEVICE void wgmma_m64nNk32(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint64_t desc_b,
                                 std::uint32_t scale_d OCTET_PTX_SITE) {
    wgmma_check_types<N, FA, FB>();
#if OCTET_DEVICE_PASS
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (N == 192) {
        OCTET_WGMMA_TYPES(OCTET_WGMMA_RS, "192", OCTET_WGMMA_R96, D96, "{%96, %97, %98, %99}", "%100", "%101")
    } else if constexpr (N == 128) {
        OCTET_WGMMA_TYPES(OCTET_WGMMA_RS, "128", OCTET_WGMMA_R64, D64, "{%64, %65, %66, %67}", "%68", "%69")
    } else if constexpr (N == 64) {
        OCTET_WGMMA_TYPES(OCTET_WGMMA_RS, "64", OCTET_WGMMA_R32, D32, "{%32, %33, %34, %35}", "%36", "%37")
    } else {
        OCTET_WGMMA_TYPES(OCTET_WGMMA_RS, "32", OCTET_WGMMA_R16, D16, "{%16, %17, %18, %19}", "%20", "%21")
    }
#endif
#elif defined(OCTET_INTERPRET) && !defined(__CUDACC__)
    interpret::model::wgmma_m64nNk32_rs<N, cuda::interpret_element_t<FA>, cuda::interpret_element_t<FB> >(
        d, a, desc_b, scale_d, wgmma_name<N, FA, FB, true>(), file, line);
#else
    (void)d, (void)a, (void)desc_b, (void)scale_d;
#endif
}

#undef OCTET_WGMMA_TYPES
#undef OCTET_WGMMA_RS
#undef OCTET_WGMMA_SS
#undef OCTET_WGMMA_R96
#undef OCTET_WGMMA_R64
#undef OCTET_WGMMA_R32
#undef OCTET_WGMMA_D96
#undef OCTET_WGMMA_D64
#undef OCTET_WGMMA_D32
#undef OCTET_WGMMA_R16
#undef OCTET_WGMMA_D16

}  // namespace ptx
}  // namespace octet
