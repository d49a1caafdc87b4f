// octet/gemm/scaled_gemm.cuh: octet::scaled_gemm on a CUDA stream, and backend selection.
//
//   octet::scaled_gemm(octet::on_stream(s), A, B, D, opt);       // D = alpha * A B^T + bias
//   octet::scaled_gemm(octet::on_stream(s), A, B, C, D, opt);    // ... + beta * C
//   octet::scaled_gemm(octet::on_stream(s), A, B, Dq, opt, device_amax);  // quantized D
// (the entries are scaled_gemm.hpp's, one per form for every executor; this header adds the
// stream's half, detail::gemm_executor_backend<stream_executor>)
//   octet::scaled_gemm_scratch_bytes(ex, A, B, D, opt);         // scratch the call requests from ex
//
// Enqueued on the executor's stream, never a host sync: the GEMM kernel (octet's backends: one
// kernel, no scratch; with split-K on sm90_wgmma, options.split_k, two kernels and the ranges'
// partial sums as scratch), or the cublaslt backend's preparation kernels and one cublasLtMatmul
// with the lent handle and workspace; scratch comes from the executor's allocator (cuda/executor.cuh).
//
// Same contract as the host overloads (scaled_gemm.hpp); all pointers are device memory (the
// two-level tensor_scale too). D and C may be octet::bf16/fp16 or __nv_bfloat16/__half.
//
// Backends and the pairs they serve (scaled_gemm_support says why one refuses a problem on this
// GPU; octet::cuda::compute_capability() in octet/cuda/launch.cuh gives the GPU's architecture):
//   sm90_wgmma  sm_90 GPU, binary built for sm_90a. E4M3/E5M2 with float scales whose K blocks are
//               multiples of 128 (tensor, row, 1x128, 128x128; mixed formats), promotion every 128.
//   sm89_mma    sm_89+ GPU (Ada, Hopper). E4M3/E5M2 with any scale storage whose K blocks are
//               multiples of 32 (adds MX 1x32 with UE8M0 scales), promotion every multiple of 32.
//   cublaslt    only when the executor carries a cuBLASLt: octet::with_cublaslt(octet::on_stream(s),
//               handle, workspace, bytes) from octet/gemm/cublaslt.cuh (link CUDA::cublasLt).
//               cuBLASLt's own FP8 scale modes, and NVFP4 x NVFP4 through a dequantizing BF16 path.
//   NVFP4, MXFP4 and FP6 have no tensor-core path on Hopper or Ada; without cuBLASLt they run
//   only on the host (the error says so).
// `automatic` picks sm90_wgmma, then sm89_mma, then cublaslt (if lent), whichever first serves the pair on
// the running GPU. Every backend reads only the bytes of the operands (ragged M, N and K are zero-
// filled in shared memory), so small M (decode, M <= 64) needs no padded copy; sm90_wgmma uses a
// 64 x 64 tile for it, and splits K where the output's tiles would leave most SMs idle (M = 128
// against a 7168 x 7168 weight).
//
// This header holds the stream queries; the stream backend (backend choice, the kernels' launches
// through sm89_mma.cuh, sm90_wgmma.cuh and cuBLASLt, the quantized output) and their definitions
// are in octet/gemm/detail/stream.cuh, which it includes at its end.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "octet/cuda/executor.cuh"
#include "octet/gemm/scaled_gemm.hpp"

namespace octet {

/// Why `backend` cannot run scaled_gemm of (RA x RB) with inner dimension K on the current GPU with
/// executor `ex`: empty when it can, else the reason (no device, another architecture, no code for
/// it in this binary, no cuBLASLt on the executor, a pair or K the backend does not serve).
/// `automatic` asks whether any CUDA backend serves the problem (and lists those that would);
/// `host` is always served by the host overloads and is refused here (this is the stream question).
/// Whether this binary holds sm_89 / sm_90a code is read from cudaFuncGetAttributes (cached per
/// device): the query allocates nothing, launches nothing and never synchronizes.
template <class RA, class RB>
std::string scaled_gemm_support(const stream_executor& ex, gemm_backend backend, std::size_t K,
                                const gemm_options& opt = {});

/// Bytes of device scratch scaled_gemm(ex, A, B, [C,] D, opt) requests from ex's allocator (the sum
/// of its requests, each rounded up to 256: an arena of this size serves the call). octet's own
/// kernels request none, except sm90_wgmma when it splits K (splits x M x N floats, the ranges'
/// partial sums; options.split_k); the cublaslt backend requests re-laid scale grids (1x128 grids not
/// already padded to 4 rows, every 128x128 grid), the bias in cuBLASLt's type, and for NVFP4 x
/// NVFP4 both operands expanded to BF16 (2 bytes per element, K padded to 8). Throws as the call
/// would when no backend serves the problem.
template <class RA, class BA, class RB, class BB, class DT>
std::size_t scaled_gemm_scratch_bytes(const stream_executor& ex, quantized_ref<RA, BA> A, quantized_ref<RB, BB> B,
                                      matrix_ref<DT> D, const gemm_options& opt = {});

/// The quantized-output overload's scratch: M * N floats, the GEMM's own, and quantize's into RD.
template <class RA, class BA, class RB, class BB, class RD>
std::size_t scaled_gemm_scratch_bytes(const stream_executor& ex, quantized_ref<RA, BA> A, quantized_ref<RB, BB> B,
                                      quantized_ref<RD> D, const gemm_options& opt = {});

}  // namespace octet

#include "octet/gemm/detail/stream.cuh"  // IWYU pragma: export
