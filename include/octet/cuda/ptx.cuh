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

#include "octet/config.hpp"

#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
#include "octet/interpret/ptx_models.hpp"
#endif
#if defined(__CUDACC__) || defined(OCTET_INTERPRET)
#include <cuda.h>  // CUtensorMap (the toolkit's header only: nothing is linked)
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

// ---- ldmatrix ---------------------------------------------------------------------------------------

// ---- cp.async ---------------------------------------------------------------------------------------

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

}  // namespace ptx
}  // namespace octet
