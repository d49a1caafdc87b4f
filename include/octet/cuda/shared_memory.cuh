// octet/cuda/shared_memory.cuh: how octet's kernels declare and pass shared memory. Under nvcc these are
// the plain CUDA forms; in interpret mode (OCTET_INTERPRET, a host compiler; octet/cuda/interpret_seam.hpp)
// they are the interpreter's checked shared memory, so the same kernel source runs on the CPU with every
// shared access checked.
//
//   OCTET_SHARED(type, name)                 __shared__ type name;   (type may be an array: float[8][8])
//   OCTET_SHARED_ALIGNED(type, name, align)  __shared__ __align__(align) type name;
//   OCTET_DYNAMIC_SHARED(type, name)         extern __shared__ __align__(1024) type name[];
//   OCTET_DYNAMIC_SHARED_ALIGNED(type, name, align)  extern __shared__ __align__(align) type name[];
//                                            (align <= 1024; a kernel's existing alignment, kept so that its
//                                            static shared memory is not padded up to 1024 bytes)
//   octet::shared_ptr_t<T>                   T* on the device, interpret::sptr<T> in interpret mode
//   octet::shared_cast<U>(p)                 reinterpret_cast<U*>(p) on the device, the checked cast there
//   OCTET_SHARED_CAST(U, p)                  the same, but a plain reinterpret_cast<U*>(p) under nvcc, not a
//                                            call: through a function, even a __forceinline__ one, nvcc folds
//                                            constant offsets into shared loads and stores differently (other
//                                            SASS); kernels whose SASS that changed use the macro
#pragma once

#include "octet/config.hpp"
#include "octet/cuda/interpret_seam.hpp"

#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)

namespace octet {
template <class T>
using shared_ptr_t = interpret::sptr<T>;
using interpret::shared_cast;
}  // namespace octet

#define OCTET_SHARED_ALIGNED(type, name, align) OCTET_INTERPRET_SHARED_ALIGNED(type, name, align)
#define OCTET_SHARED(type, name) OCTET_INTERPRET_SHARED(type, name)
#define OCTET_DYNAMIC_SHARED(type, name) OCTET_INTERPRET_DYNAMIC_SHARED(type, name)
// The interpreter's dynamic shared memory is 1024-byte aligned, which serves any align <= 1024.
#define OCTET_DYNAMIC_SHARED_ALIGNED(type, name, align)                                   \
    static_assert((align) <= 1024, "dynamic shared memory is at most 1024-byte aligned"); \
    OCTET_INTERPRET_DYNAMIC_SHARED(type, name)
#define OCTET_SHARED_CAST(U, p) ::octet::shared_cast<U>(p)

#else  // nvcc, or a host build without the interpreter

#define OCTET_SHARED_CAST(U, p) reinterpret_cast<U*>(p)

namespace octet {
template <class T>
using shared_ptr_t = T*;
template <class U, class T>
OCTET_HD U* shared_cast(T* p) {
    return reinterpret_cast<U*>(p);
}
namespace detail {
/// T itself: lets OCTET_SHARED declare an array type (float[8][8]) as `shared_declared<float[8][8]>::type name`.
template <class T>
struct shared_declared {
    using type = T;
};
}  // namespace detail
}  // namespace octet

// (The parameter is not named `type`: it would replace the `::type` after shared_declared<...>.)
#define OCTET_SHARED_ALIGNED(decl_type, name, align) \
    __shared__ __align__(align) typename ::octet::detail::shared_declared<decl_type>::type name
#define OCTET_SHARED(decl_type, name) __shared__ typename ::octet::detail::shared_declared<decl_type>::type name
#define OCTET_DYNAMIC_SHARED(type, name) extern __shared__ __align__(1024) type name[]
// clang-format off
#define OCTET_DYNAMIC_SHARED_ALIGNED(type, name, align) extern __shared__ __align__(align) type name[]
// clang-format on

#endif
