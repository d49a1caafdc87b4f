// expect: OCTET_INTERPRET_declare_shared_memory_with_OCTET_SHARED_or_OCTET_DYNAMIC_SHARED
// needs: interpret
// In interpret mode a plain `__shared__` declaration would be a private array per thread, unchecked
// (the toolkit defines __shared__ as nothing for a host compiler): it must not compile, and the
// error names the macros to use instead.
#include <octet/config.hpp>

OCTET_KERNEL void reverse_kernel(float* out) {
    __shared__ float tile[32];
    tile[threadIdx.x] = static_cast<float>(threadIdx.x);
    __syncthreads();
    out[threadIdx.x] = tile[31 - threadIdx.x];
}
