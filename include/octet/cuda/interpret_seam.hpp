// octet/cuda/interpret_seam.hpp: octet's one way into the CUDA interpreter (interpret/, CMake target
// octet::interpret; docs/interpret-mode.md). The interpreter is a separate component that octet's CUDA
// code is checked with: it depends on the standard library and the CUDA toolkit's headers only, never
// on octet's library headers, and octet reaches it only here. octet/cuda/launch.cuh (the launches),
// octet/cuda/ptx.cuh (the PTX instructions' models) and octet/cuda/shared_memory.cuh (the shared-memory
// declarations) include this header.
//
// In interpret mode (OCTET_INTERPRET defined, a compiler other than nvcc) it brings in the interpreter:
// CUDA's names and runtime on the host (octet/interpret/cuda.hpp, which the octet::interpret target
// also force-includes into every source, as nvcc implicitly includes cuda_runtime.h), the launch
// machinery (interpret.hpp) and the instruction models (ptx_models.hpp), and it maps octet's FP8
// format types onto the interpreter's own PTX element types (interpret_element_t below), so that
// the models decode operands with their own reading of the PTX ISA, not octet's format rules.
// Elsewhere (nvcc, or a host build without the interpreter) it is empty.
#pragma once

#include "octet/config.hpp"

#if defined(OCTET_INTERPRET) && !defined(__CUDACC__)
#include "octet/format/float_format.hpp"
#include "octet/interpret/cuda.hpp"
#include "octet/interpret/interpret.hpp"
#include "octet/interpret/ptx_models.hpp"

namespace octet {
namespace cuda {

/// The interpreter's PTX element type (octet/interpret/fp8.hpp) for octet's format F: what F's codes
/// are to an mma or wgmma instruction. Only the formats the instructions take have one.
template <class F>
struct interpret_element;
template <>
struct interpret_element<e4m3> {
    using type = ::octet::interpret::ptx::e4m3;
};
template <>
struct interpret_element<e5m2> {
    using type = ::octet::interpret::ptx::e5m2;
};
template <class F>
using interpret_element_t = typename interpret_element<F>::type;

}  // namespace cuda
}  // namespace octet
#endif
