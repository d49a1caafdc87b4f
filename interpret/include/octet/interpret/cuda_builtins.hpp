// octet/interpret/cuda_builtins.hpp: CUDA's kernel-side names for kernel source compiled as host code
// under the interpreter (octet/interpret/interpret.hpp), and the interpreter's shared-memory
// declarations. Included by octet/interpret/cuda.hpp; empty without OCTET_INTERPRET or under nvcc.
//
// With OCTET_INTERPRET defined and a compiler other than nvcc:
//   threadIdx, blockIdx, blockDim, gridDim   the running fiber's interpret::thread_idx() ... grid_dim()
//   warpSize                                 32
//   __syncthreads()                          interpret::syncthreads() (the call site is recorded)
//   __syncthreads_count/_and/_or(p)          interpret::syncthreads_count
//   __syncwarp, __activemask                 interpret::syncwarp, activemask
//   __shfl_sync/_up/_down/_xor (int, unsigned, float, 64-bit types as two 32-bit shuffles)
//                                            interpret::shfl_sync with CUDA's c = ((32 - width) << 8) | clamp
//   __all_sync, __any_sync, __ballot_sync, __match_any_sync, __match_all_sync
//   atomicAdd/Sub/Max/Min/Exch/CAS/And/Or/Xor on T* (global) and interpret::sptr<T> (shared)
//   __threadfence*, __nanosleep              nothing, a yield
//   clock64()                                a count of its calls (monotonic, not cycles)
//   __trap()                                 interpret::trap(): a report that stops the block
//   __float_as_int/uint, __int/uint_as_float, __fmul_rn, __fadd_rn, __byte_perm, __ldg,
//   __cvta_generic_to_shared (of an sptr), min/max (int, unsigned)  their CUDA meanings
//   __align__(n), __grid_constant__, __constant__  alignas(n), nothing, nothing
//   __global__, __device__, __host__, __forceinline__, __noinline__, __launch_bounds__(...)  nothing
//   __shared__                               NOT defined here (cuda.hpp makes it an error): a declaration
//                                            the interpreter cannot see would be private to each thread.
//
// Shared memory is declared with the interpreter's macros, which hand out checked shared pointers
// (interpret::sptr<T>; interpret::shared_cast<U>(p) reinterprets one):
//   OCTET_INTERPRET_SHARED_ALIGNED(type, name, align)   a static shared variable (type may be an array)
//   OCTET_INTERPRET_SHARED(type, name)                  the same, at the type's alignment
//   OCTET_INTERPRET_DYNAMIC_SHARED(type, name)          the launch's dynamic shared memory (1024-byte aligned)
// octet's kernels use octet's spelling of these, OCTET_SHARED ... (octet/cuda/shared_memory.cuh), which
// is `__shared__` under nvcc and these macros in interpret mode.
#pragma once

#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "octet/interpret/interpret.hpp"

#define OCTET_INTERPRET_SHARED_ALIGNED(type, name, align)                                \
    static const char octet_shared_tag_##name = 0;                                       \
    auto name = ::octet::interpret::static_shared<type>(&octet_shared_tag_##name, #name, \
                                                        (align) > alignof(type) ? (align) : alignof(type))
#define OCTET_INTERPRET_SHARED(type, name) OCTET_INTERPRET_SHARED_ALIGNED(type, name, alignof(type))
// The interpreter's dynamic shared memory is 1024-byte aligned.
#define OCTET_INTERPRET_DYNAMIC_SHARED(type, name) auto name = ::octet::interpret::dynamic_shared<type>()

// The toolkit's headers, when included before (octet/interpret/cuda.hpp does), define some of these.
#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim
#undef warpSize
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#undef __syncthreads
#undef __syncthreads_count
#undef __syncthreads_and
#undef __syncthreads_or
#undef __trap
#undef __align__
#undef __grid_constant__
#undef __constant__
#define threadIdx (::octet::interpret::thread_idx())
#define blockIdx (::octet::interpret::block_idx())
#define blockDim (::octet::interpret::block_dim())
#define gridDim (::octet::interpret::grid_dim())
#define warpSize 32
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __syncthreads() ::octet::interpret::syncthreads()
#define __syncthreads_count(p) ::octet::interpret::syncthreads_count((p) != 0)
#define __syncthreads_and(p) \
    (::octet::interpret::syncthreads_count((p) != 0) == static_cast<int>(::octet::interpret::block_dim().count()))
#define __syncthreads_or(p) (::octet::interpret::syncthreads_count((p) != 0) != 0)
#define __trap() ::octet::interpret::trap()
#define __align__(n) alignas(n)
#define __grid_constant__
#define __constant__

namespace octet {
namespace interpret {
namespace names {
template <class T>
std::uint32_t lo_bits(T v) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "shuffles move 4- or 8-byte values");
    std::uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return static_cast<std::uint32_t>(u);
}
template <class T>
std::uint32_t hi_bits(T v) {
    std::uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return static_cast<std::uint32_t>(u >> 32);
}
template <class T>
T from_bits(std::uint32_t lo, std::uint32_t hi) {
    const std::uint64_t u = lo | static_cast<std::uint64_t>(hi) << 32;
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}
/// CUDA's __shfl*_sync: c = ((32 - width) << 8) | clamp, clamp 0x1f except for up (0).
template <class T>
T shfl(shfl_mode mode, unsigned mask, T var, unsigned b, int width, const char* file, int line) {
    const std::uint32_t c = (static_cast<std::uint32_t>(32 - width) << 8) | (mode == shfl_mode::up ? 0u : 0x1Fu);
    const std::uint32_t lo = shfl_sync(mode, lo_bits(var), b, c, mask, file, line).value;
    const std::uint32_t hi = sizeof(T) == 8 ? shfl_sync(mode, hi_bits(var), b, c, mask, file, line).value : 0u;
    return from_bits<T>(lo, hi);
}
}  // namespace names
}  // namespace interpret
}  // namespace octet

template <class T>
T __shfl_sync(unsigned mask, T var, int src, int width = 32, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
    return ::octet::interpret::names::shfl(::octet::interpret::shfl_mode::idx, mask, var, static_cast<unsigned>(src),
                                           width, file, line);
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
    return ::octet::interpret::names::shfl(::octet::interpret::shfl_mode::up, mask, var, delta, width, file, line);
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
    return ::octet::interpret::names::shfl(::octet::interpret::shfl_mode::down, mask, var, delta, width, file, line);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
    return ::octet::interpret::names::shfl(::octet::interpret::shfl_mode::bfly, mask, var,
                                           static_cast<unsigned>(lane_mask), width, file, line);
}
inline int __all_sync(unsigned mask, int p, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return ::octet::interpret::vote_all_sync(mask, p != 0, file, line);
}
inline int __any_sync(unsigned mask, int p, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return ::octet::interpret::vote_any_sync(mask, p != 0, file, line);
}
inline unsigned __ballot_sync(unsigned mask, int p, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return ::octet::interpret::vote_ballot_sync(mask, p != 0, file, line);
}
template <class T>
unsigned __match_any_sync(unsigned mask, T value, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return ::octet::interpret::match_any_sync(
        mask,
        ::octet::interpret::names::lo_bits(value) | std::uint64_t{::octet::interpret::names::hi_bits(value)} << 32,
        file, line);
}
template <class T>
unsigned __match_all_sync(unsigned mask, T value, int* pred, const char* file = __builtin_FILE(),
                          int line = __builtin_LINE()) {
    bool p = false;
    const unsigned r = ::octet::interpret::match_all_sync(
        mask,
        ::octet::interpret::names::lo_bits(value) | std::uint64_t{::octet::interpret::names::hi_bits(value)} << 32, &p,
        file, line);
    if (pred) *pred = p;
    return r;
}
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    ::octet::interpret::syncwarp(mask, file, line);
}
inline unsigned __activemask() {
    return ::octet::interpret::activemask();
}
inline float __int_as_float(int v) {
    float f;
    std::memcpy(&f, &v, 4);
    return f;
}
inline float __uint_as_float(unsigned v) {
    float f;
    std::memcpy(&f, &v, 4);
    return f;
}
inline int __float_as_int(float f) {
    int v;
    std::memcpy(&v, &f, 4);
    return v;
}
inline unsigned __float_as_uint(float f) {
    unsigned v;
    std::memcpy(&v, &f, 4);
    return v;
}
/// The product rounded to nearest even: what host float arithmetic does (SSE, no excess precision).
inline float __fmul_rn(float a, float b) {
    return a * b;
}
inline float __fadd_rn(float a, float b) {
    return a + b;
}
/// CUDA's __byte_perm: byte n of the result is byte ((s >> 4n) & 7) of the 8 bytes y:x (x lowest).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const std::uint64_t in = x | static_cast<std::uint64_t>(y) << 32;
    unsigned r = 0;
    for (unsigned n = 0; n < 4; ++n) r |= static_cast<unsigned>((in >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
    return r;
}
/// CUDA's device-side integer min and max (int and unsigned; mixed calls are ambiguous here, not converted).
inline int min(int a, int b) {
    return a < b ? a : b;
}
inline unsigned min(unsigned a, unsigned b) {
    return a < b ? a : b;
}
inline int max(int a, int b) {
    return a > b ? a : b;
}
inline unsigned max(unsigned a, unsigned b) {
    return a > b ? a : b;
}
/// __ldg: a read through the read-only cache, here a plain read.
template <class T>
T __ldg(const T* p) {
    return *p;
}
/// The shared-window address of a shared pointer (cvta.to.shared).
template <class T>
std::size_t __cvta_generic_to_shared(const ::octet::interpret::sptr<T>& p) {
    return ::octet::interpret::shared_address(p);
}
/// clock64: the SM's cycle counter; here a count of its calls (monotonic, not cycles).
inline long long clock64() {
    static std::atomic<long long> ticks{0};
    return ++ticks;
}
inline void __threadfence_block() {}
inline void __threadfence() {}
inline void __nanosleep(unsigned, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    ::octet::interpret::yield(file, line);
}
template <class P, class T>
auto atomicAdd(P p, T v) {
    return ::octet::interpret::atomic_add(p, v);
}
template <class P, class T>
auto atomicSub(P p, T v) {
    return ::octet::interpret::atomic_sub(p, v);
}
template <class P, class T>
auto atomicMax(P p, T v) {
    return ::octet::interpret::atomic_max(p, v);
}
template <class P, class T>
auto atomicMin(P p, T v) {
    return ::octet::interpret::atomic_min(p, v);
}
template <class P, class T>
auto atomicExch(P p, T v) {
    return ::octet::interpret::atomic_exch(p, v);
}
template <class P, class T>
auto atomicCAS(P p, T compare, T v) {
    return ::octet::interpret::atomic_cas(p, compare, v);
}
template <class P, class T>
auto atomicAnd(P p, T v) {
    return ::octet::interpret::atomic_and(p, v);
}
template <class P, class T>
auto atomicOr(P p, T v) {
    return ::octet::interpret::atomic_or(p, v);
}
template <class P, class T>
auto atomicXor(P p, T v) {
    return ::octet::interpret::atomic_xor(p, v);
}

#endif
