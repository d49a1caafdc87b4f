// octet/core/isa_dispatch.hpp: run a host loop compiled for the best instruction set of the CPU.
//
// The host hot loops (format/convert.hpp, quant/quantize.hpp) are plain C++ over the scalar
// OCTET_HD rules. Built with a compiler's default x86-64 flags (SSE2, and at -O2 GCC's
// "very cheap" vectorizer) they run several times slower than under -march=native. So each loop
// is a kernel, a struct with
//
//   static OCTET_KERNEL_INLINE void run(args...);
//
// that detail::run_kernel<Kernel>(isa, args...) runs compiled for that isa: the same source
// under GCC/clang target attributes (AVX2, AVX-512), chosen once from the CPU. Same source, so
// the same bits: the kernels hold no multiply-add that contraction could fuse, and
// tests/host/format_dispatch.cpp and quant_dispatch.cpp compare every variant with the scalar
// rules.
//
// Kernels process fixed-size chunks of `kernel_chunk` elements (a constant trip count is what
// GCC's -O2 vectorizer accepts) and run the tail through the same chunk code on a stack copy.
//
// Elsewhere (other CPUs, other compilers, the device pass of CUDA compilers) there is one
// portable variant. nvcc's host pass (tested: nvcc 13 with g++ 12) dispatches too, so that .cu and
// .cpp files of one program define these inline functions alike. Define OCTET_NO_ISA_DISPATCH
// (the same in every translation unit) to keep only the portable variant everywhere.
#pragma once

#include <cstddef>

#if defined(__x86_64__) && !defined(__CUDA_ARCH__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(OCTET_NO_ISA_DISPATCH)
#define OCTET_ISA_DISPATCH 1
// ISA flags only, never arch=: GCC inlines a default-target function into a target("avx2")
// one (a subset of its ISA) but refuses when arch or tune differ. avx2 without fma, so that no
// contraction can change a rounding; AVX-512 implies fma in GCC, and the kernels have no a*b+c.
#define OCTET_TARGET_AVX2 __attribute__((target("avx2")))
#define OCTET_TARGET_AVX2_FMA __attribute__((target("avx2,fma")))
#define OCTET_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
#else
#define OCTET_ISA_DISPATCH 0
#endif

#if defined(__GNUC__) || defined(__clang__)
// The kernel body must be compiled inside each target-attributed wrapper, not called out of line.
#define OCTET_KERNEL_INLINE __attribute__((always_inline)) inline
#else
#define OCTET_KERNEL_INLINE inline
#endif

namespace octet {
namespace detail {

/// The instruction sets a host kernel is compiled for. `portable` is the translation unit's own
/// flags (SSE2 under default x86-64 flags); the others exist where OCTET_ISA_DISPATCH is 1.
enum class simd_isa : int { portable = 0, avx2 = 1, avx512 = 2 };

/// Elements per chunk of a kernel's loop (a multiple of every vector width, 64 bytes of codes).
inline constexpr std::size_t kernel_chunk = 256;

/// Whether this CPU can run kernels compiled for `isa` (and this build compiled them).
inline bool isa_supported(simd_isa isa) {
#if OCTET_ISA_DISPATCH
    __builtin_cpu_init();  // harmless when already done; makes calls from static initializers safe
    switch (isa) {
        case simd_isa::avx512:
            return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
        case simd_isa::avx2:
            return __builtin_cpu_supports("avx2");
        default:
            return true;
    }
#else
    return isa == simd_isa::portable;
#endif
}

/// The best instruction set of this CPU, decided once. The function-local static is the only
/// state the dispatch keeps: initialised once, thread-safely (C++11), and never changed after.
inline simd_isa best_isa() {
    static const simd_isa chosen = isa_supported(simd_isa::avx512) ? simd_isa::avx512
                                   : isa_supported(simd_isa::avx2) ? simd_isa::avx2
                                                                   : simd_isa::portable;
    return chosen;
}

#if OCTET_ISA_DISPATCH
// One wrapper per instruction set; the always-inline Kernel::run is compiled inside it.
template <class Kernel, class... Args>
OCTET_TARGET_AVX2 void run_kernel_avx2(Args... args) {
    Kernel::run(args...);
}
template <class Kernel, class... Args>
OCTET_TARGET_AVX512 void run_kernel_avx512(Args... args) {
    Kernel::run(args...);
}
#endif

/// Runs Kernel::run(args...) compiled for `isa` (which must be isa_supported; tests pass each
/// one, library code passes best_isa()). Arguments are passed by value: pointers and sizes.
template <class Kernel, class... Args>
void run_kernel(simd_isa isa, Args... args) {
#if OCTET_ISA_DISPATCH
    if (isa == simd_isa::avx512) return run_kernel_avx512<Kernel, Args...>(args...);
    if (isa == simd_isa::avx2) return run_kernel_avx2<Kernel, Args...>(args...);
#else
    (void)isa;
#endif
    Kernel::run(args...);
}

#if OCTET_ISA_DISPATCH
template <class Kernel, class... Args>
OCTET_TARGET_AVX2_FMA void run_fma_kernel_avx2(Args... args) {
    Kernel::run(args...);
}
#endif

/// As run_kernel, for kernels written with explicit fused multiply-adds (rn::fma) and no other
/// product added to anything (the optimizer's rules: optim/detail/float_ops.hpp), so that a
/// compiler has nothing to contract: their AVX2 variant is compiled with FMA as well, where std::fma
/// is one instruction instead of a library call (10-20x faster for the polynomial-heavy codecs)
/// and gives the same, correctly rounded, bits. The CPU must have FMA for the avx2 variant
/// (fma_supported).
template <class Kernel, class... Args>
void run_fma_kernel(simd_isa isa, Args... args) {
#if OCTET_ISA_DISPATCH
    if (isa == simd_isa::avx512) return run_kernel_avx512<Kernel, Args...>(args...);
    if (isa == simd_isa::avx2) return run_fma_kernel_avx2<Kernel, Args...>(args...);
#else
    (void)isa;
#endif
    Kernel::run(args...);
}

/// Whether this CPU can run run_fma_kernel's `isa` variant.
inline bool fma_kernel_supported(simd_isa isa) {
#if OCTET_ISA_DISPATCH
    if (isa == simd_isa::avx2) return isa_supported(isa) && __builtin_cpu_supports("fma");
#endif
    return isa_supported(isa);
}

/// The best run_fma_kernel variant of this CPU, decided once.
inline simd_isa best_fma_isa() {
    static const simd_isa chosen = fma_kernel_supported(simd_isa::avx512) ? simd_isa::avx512
                                   : fma_kernel_supported(simd_isa::avx2) ? simd_isa::avx2
                                                                          : simd_isa::portable;
    return chosen;
}

}  // namespace detail
}  // namespace octet
