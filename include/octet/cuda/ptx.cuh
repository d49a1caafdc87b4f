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

// ---- mbarrier ---------------------------------------------------------------------------------------

// ---- cp.async.bulk.tensor (TMA), prefetch.tensormap -------------------------------------------------

// ---- fence.proxy.async, setmaxnreg ------------------------------------------------------------------

// ---- wgmma ------------------------------------------------------------------------------------------

}  // namespace ptx
}  // namespace octet
