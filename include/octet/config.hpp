// octet/config.hpp: compiler portability macros, the library version and the error type.
//
// Every numeric rule in octet is an OCTET_HD function: under nvcc it is compiled for host
// and device from the same source, under a plain C++ compiler it is an ordinary inline
// function. That single definition is what makes host results prove device results.
#pragma once

#include <stdexcept>
#include <string>

// The one home of the version: CMakeLists.txt reads these three lines (keep their form).
#define OCTET_VERSION_MAJOR 0
#define OCTET_VERSION_MINOR 1
#define OCTET_VERSION_PATCH 0
#define OCTET_STRINGIFY_IMPL(x) #x
#define OCTET_STRINGIFY(x) OCTET_STRINGIFY_IMPL(x)
/// "MAJOR.MINOR.PATCH", a string literal built from the three numbers above.
#define OCTET_VERSION_STRING             \
    OCTET_STRINGIFY(OCTET_VERSION_MAJOR) \
    "." OCTET_STRINGIFY(OCTET_VERSION_MINOR) "." OCTET_STRINGIFY(OCTET_VERSION_PATCH)

#if defined(__CUDACC__)
#define OCTET_HD __host__ __device__ __forceinline__
#define OCTET_DEVICE __device__ __forceinline__
/// Every kernel a header defines is an OCTET_KERNEL: internal linkage, so that any number of
/// translation units of one program (or of several shared libraries) can include the header.
/// Each translation unit is its own device program under whole-program compilation, so its
/// launches must reach its own copy; nvcc 13 gives template kernels' host stubs this linkage
/// by default (-static-global-template-stub), and this gives it to every kernel, with any nvcc.
#define OCTET_KERNEL static __global__
#elif defined(OCTET_INTERPRET)
// Interpret mode: CUDA source compiled as host code and its kernels run by the interpreter (interpret/,
// the octet::interpret target, which force-includes octet/interpret/cuda.hpp; octet reaches the
// interpreter through octet/cuda/interpret_seam.hpp only).
#define OCTET_HD inline
#define OCTET_DEVICE inline
#define OCTET_KERNEL [[maybe_unused]] static  // a translation unit launches only some of a header's kernels
#else
#define OCTET_HD inline
#endif

#if defined(__CUDA_ARCH__)
#define OCTET_DEVICE_PASS 1
#else
#define OCTET_DEVICE_PASS 0
#endif

/// Kernel code for compute capability `cc` (890, 900) or newer, for #if: true in nvcc's device pass
/// for such a target, and in interpret mode, whose device model is an sm_90a GPU; false elsewhere.
#if defined(__CUDA_ARCH__)
#define OCTET_ARCH_AT_LEAST(cc) (__CUDA_ARCH__ >= (cc))
#elif defined(OCTET_INTERPRET) && !defined(__CUDACC__)
#define OCTET_ARCH_AT_LEAST(cc) ((cc) <= 900)
#else
#define OCTET_ARCH_AT_LEAST(cc) 0
#endif
/// sm_90a's architecture-specific instructions (wgmma, setmaxnreg): nvcc's device pass for sm_90a, or
/// interpret mode.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || (defined(OCTET_INTERPRET) && !defined(__CUDACC__))
#define OCTET_ARCH_SM90A 1
#else
#define OCTET_ARCH_SM90A 0
#endif

#if defined(__CUDA_ARCH__)
#define OCTET_UNROLL _Pragma("unroll")
#elif defined(__CUDACC__)
#define OCTET_UNROLL  // nvcc's host pass: neither nvcc's front end nor the host compiler wants a pragma here
#elif defined(__GNUC__) && !defined(__clang__)
#define OCTET_UNROLL _Pragma("GCC unroll 8")
#elif defined(__clang__)
#define OCTET_UNROLL _Pragma("unroll")
#else
#define OCTET_UNROLL
#endif

namespace octet {

/// The one exception type octet throws. Host API calls validate their arguments and throw
/// `octet::error` with a message that names the argument and says how to fix it. Device
/// code never throws; non-finite inputs are data, not errors (see each format's contract).
class error : public std::runtime_error {
public:
    explicit error(const std::string& what) : std::runtime_error("octet: " + what) {}
};

/// Version of the headers in use, for run reports and checkpoint headers.
inline constexpr int version_major = OCTET_VERSION_MAJOR;
inline constexpr int version_minor = OCTET_VERSION_MINOR;
inline constexpr int version_patch = OCTET_VERSION_PATCH;

}  // namespace octet
