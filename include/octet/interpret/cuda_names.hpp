// octet/interpret/cuda_names.hpp: TEMPORARY forwarding header. The shared-memory macros that kernels
// took from here (OCTET_SHARED, OCTET_DYNAMIC_SHARED(_ALIGNED), OCTET_SHARED_CAST, octet::shared_ptr_t,
// octet::shared_cast) are octet's own now, in octet/cuda/shared_memory.cuh, and the interpreter lives in
// interpret/ (docs/interpret-mode.md). This header remains only for the kernel headers that still
// include it (gemm/, quant/ and rl/, being reworked meanwhile); it goes once they include
// octet/cuda/shared_memory.cuh. Do not include it in new code.
#pragma once

#include "octet/cuda/shared_memory.cuh"
