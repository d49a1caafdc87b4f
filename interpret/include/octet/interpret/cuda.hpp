// octet/interpret/cuda.hpp: what a translation unit built in interpret mode (OCTET_INTERPRET defined, a
// compiler other than nvcc) sees of CUDA, as nvcc's translation units see cuda_runtime.h without
// including it: the `octet::interpret` CMake target force-includes this header (-include) into every
// source it is linked to. It brings the toolkit's headers for the types (dim3, uint4, float4,
// cudaStream_t, cudaError_t, __half, __nv_bfloat16), CUDA's kernel-side names mapped onto the
// interpreter (cuda_builtins.hpp), and the runtime API served on the host (runtime.hpp). A `__shared__`
// declaration does not compile here: shared memory is declared with the interpreter's macros
// (cuda_builtins.hpp), or in octet's kernels with OCTET_SHARED / OCTET_DYNAMIC_SHARED
// (octet/cuda/shared_memory.cuh), which the interpreter checks. Kernels are launched with
// interpret::launch, or octet::cuda::launch (octet/cuda/launch.cuh), not <<<...>>>, which only nvcc
// parses. Without OCTET_INTERPRET (or under nvcc) this header is empty.
#pragma once

#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "octet/interpret/cuda_builtins.hpp"
#include "octet/interpret/runtime.hpp"

// The toolkit defines __shared__ as nothing for a host compiler, which would make each thread's copy
// private and unchecked.
#undef __shared__
#define __shared__ OCTET_INTERPRET_declare_shared_memory_with_OCTET_SHARED_or_OCTET_DYNAMIC_SHARED
#endif
