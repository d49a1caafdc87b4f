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

// ---- cp.async.bulk.tensor (TMA), prefetch.tensormap -------------------------------------------------

// ---- fence.proxy.async, setmaxnreg ------------------------------------------------------------------

// ---- wgmma ------------------------------------------------------------------------------------------

}  // namespace ptx
}  // namespace octet
