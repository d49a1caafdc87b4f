// octet/gemm/grouped_gemm.cuh: the grouped scaled GEMMs (octet/gemm/grouped_gemm.hpp: m-grouped contiguous,
// m-grouped masked, k-grouped) on a CUDA stream: one kernel over the tiles of all experts instead of one
// launch per expert.
//
//   // A: a grouped_quantized_ref whose data and scales are device memory (its layout, a host object,
//   // describes them: make_grouped_layout); B: one device quantized_cref per expert; D device memory
//   octet::grouped_quantize<R>(octet::on_stream(s), x, sizes, A, {});  // x's rows by group, on the device
//   octet::grouped_scaled_gemm(octet::on_stream(s), A, B, D, opt);    // rows of group g = A_g B[g]^T
//   octet::grouped_scaled_gemm_masked(octet::on_stream(s), A, B, valid, D, opt);  // capacity rows per group
//   octet::grouped_scaled_gemm_k(octet::on_stream(s), dYt, Xt, dW, opt);  // dW_e = dY_e^T X_e, stacked
//
// Same contract as the host overloads (grouped_gemm.hpp): each group's rows of D are what
// scaled_gemm(on_stream(s), A.group(g), B[g], rows of D, opt) computes with the same backend (the
// grouped kernels run the dense kernels' mainloops, so each group's result is the dense device GEMM's
// and is within its bound of the host's: scaled_gemm.hpp; equal bit for bit on exact inputs). Rows of
// a group are never written by another group's tiles, and a tile row past its group is not stored.
//
// Backends: sm90_wgmma (sm_90 GPU, sm_90a code: one persistent kernel, 128 x 128 tiles, single CTAs,
// no split-K; detail/grouped_sm90.cuh) for the pairs the dense sm90_wgmma serves (E4M3/E5M2 with float
// scales whose K blocks are multiples of 128: per-tensor, per-row, 1x128, 128x128), and sm89_mma (sm_89+:
// one launch of the dense mma.sync tile over all groups; detail/grouped_sm89.cuh), which also serves MX
// 1x32 UE8M0 scales and runs the K = 0 case. `automatic` takes sm90_wgmma, then sm89_mma. There is no
// grouped cuBLASLt path: options.backend cublaslt (or host) is refused, as are options.tile other than
// automatic / m128n128, options.split_k above 1 and options.cluster 2 (the grouped kernel's tiles are fixed).
//
// Enqueued on ex.stream: one kernel per 32 groups (their per-group facts and B's TMA maps travel in the
// kernel's parameters, by value: about 6 KB for sm90_wgmma, which needs CUDA 12.1+'s large kernel
// parameters; a CUDA graph may capture the call), no scratch (nothing is requested
// from ex's allocator), no host synchronization. A's block must hold each group's rows at
// data_offset[g] = (its first row) * row_bytes, as make_grouped_layout lays them out; every pointer
// must be device memory with 16-byte aligned rows (the padded layouts). opt.beta must be 0 (no C);
// opt.bias (device memory, N floats) is added to every group's rows.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "octet/cuda/executor.cuh"
#include "octet/gemm/grouped_gemm.hpp"
#include "octet/gemm/scaled_gemm.cuh"
#include "octet/quant/quantize.cuh"

namespace octet {

/// grouped_quantize (grouped_gemm.hpp) on a stream: rows [o_g, o_g + sizes[g]) of x (device memory) are
/// quantized as a matrix of their own into group g of `rowwise` and/or `columnwise` (device blocks laid
/// out by make_grouped_layout) by the device quantize (octet/quant/quantize.cuh), group after group on
/// ex.stream: the same bits as the host's. Per-tensor scales are each group's own amax (measured on the
/// device: opt.device_tensor_amax must be null); opt.device_stats must be null (one pair per call would
/// not say which group); opt.device_record receives the amax of all of x; stochastic rounding draws as
/// quantize does with opt.rng.offset + 2 g. Scratch: each group's quantize requests its own from ex's
/// allocator, freed (stream-ordered) before the next group's; grouped_quantize_scratch_bytes is their sum.
template <class Recipe, class T>
void grouped_quantize(const stream_executor& ex, matrix_ref<T> x, span<const std::size_t> sizes,
                      grouped_quantized_ref<Recipe> rowwise, grouped_quantized_ref<Recipe> columnwise = {},
                      const device_quantize_options& opt = {});

/// Bytes of device scratch the stream grouped_quantize requests (the sum of its groups' quantize requests,
/// each rounded up to 256; 0 for the one-pass recipes such as 1x128, 128x128 and MX). Same arguments.
template <class Recipe, class T>
std::size_t grouped_quantize_scratch_bytes(matrix_ref<T> x, span<const std::size_t> sizes,
                                           grouped_quantized_ref<Recipe> rowwise,
                                           grouped_quantized_ref<Recipe> columnwise = {},
                                           const device_quantize_options& opt = {});

/// m-grouped contiguous on a stream: for each group g, rows [o_g, o_g + rows of A's group g) of D =
/// alpha * A_g B[g]^T + bias. Returns the backend that ran (gemm_result::backend).
template <class RA, class BA, class RB, class BB, class DT>
gemm_result grouped_scaled_gemm(const stream_executor& ex, grouped_quantized_ref<RA, BA> A,
                                span<const quantized_ref<RB, BB>> B, matrix_ref<DT> D, const gemm_options& opt = {});

/// m-grouped masked on a stream: every A group holds the same `capacity` rows, of which the first
/// valid[g] (host counts, one per group) are tokens; rows [g capacity, g capacity + valid[g]) of D =
/// alpha * A_g B[g]^T + bias over those rows (the kernels above, on the groups' first valid[g] rows),
/// and the group's other rows of D are set to 0 (one more small kernel per 32 groups). The counts
/// travel in the kernels' parameters: a CUDA graph replays the counts of its capture.
template <class RA, class BA, class RB, class BB, class DT>
gemm_result grouped_scaled_gemm_masked(const stream_executor& ex, grouped_quantized_ref<RA, BA> A,
                                       span<const quantized_ref<RB, BB>> B, span<const std::size_t> valid,
                                       matrix_ref<DT> D, const gemm_options& opt = {});

/// k-grouped on a stream (the weight gradient): rows [g N, (g + 1) N) of D = alpha * A_g B_g^T, A_g N x
/// k_g and B_g K x k_g (the column-wise copies of dY's and X's groups, grouped_quantize's); a group with
/// k_g = 0 gives 0 (its rows are set by one more small kernel per 32 groups). D is (G N) x K. opt.beta
/// must be 0 and opt.bias empty. On sm90_wgmma each group's A gets its own TMA map (its rows are k_g
/// codes long), in the kernel's parameters beside B's (about 10 KB).
template <class RA, class BA, class RB, class BB, class DT>
gemm_result grouped_scaled_gemm_k(const stream_executor& ex, grouped_quantized_ref<RA, BA> A,
                                  grouped_quantized_ref<RB, BB> B, matrix_ref<DT> D, const gemm_options& opt = {});

/// Why `backend` cannot run grouped_scaled_gemm of (RA x RB) with inner dimension K on this GPU (empty
/// when it can; `automatic`: whether either grouped kernel can).
template <class RA, class RB>
std::string grouped_scaled_gemm_support(const stream_executor& ex, gemm_backend backend, std::size_t K,
                                        const gemm_options& opt = {});

}  // namespace octet

#include "octet/gemm/detail/grouped_stream.cuh"  // IWYU pragma: export
