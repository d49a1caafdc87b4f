// octet/interpret/ptx_models.hpp: the interpreter's models of the PTX instructions in octet/cuda/ptx.cuh,
// each written from the PTX ISA's description of the instruction (fragment layouts, operand order,
// rounding), independent of octet's kernels. Warp-collective instructions are warp_exchange calls
// (interpret.hpp); operands in shared memory are read and written by each lane through sptr, so the
// checks see them as that lane's accesses.
#pragma once

#include <cstdint>

#include "octet/interpret/interpret.hpp"

namespace octet {
namespace interpret {
namespace model {

// ---- mma.sync ---------------------------------------------------------------------------------------

// ---- ldmatrix ---------------------------------------------------------------------------------------

// ---- cp.async ---------------------------------------------------------------------------------------

// ---- mbarrier ---------------------------------------------------------------------------------------

// ---- cp.async.bulk.tensor (TMA), prefetch.tensormap -------------------------------------------------

// ---- fence.proxy.async, setmaxnreg ------------------------------------------------------------------

// ---- wgmma ------------------------------------------------------------------------------------------

}  // namespace model
}  // namespace interpret
}  // namespace octet
