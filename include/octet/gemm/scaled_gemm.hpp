// octet/gemm/scaled_gemm.hpp: scaled GEMM on quantized operands, the host backend, backend
// selection and the numerics contract.
//
//   octet::gemm_options opt;                       // alpha, beta, bias, backend, promotion interval
//   octet::scaled_gemm(octet::on_host(), A, B, D, opt);        // D = alpha * A B^T + bias
//   octet::scaled_gemm(octet::on_host(), A, B, C, D, opt);     // D = alpha * A B^T + beta * C + bias
//   octet::scaled_gemm(octet::on_stream(s), ...)               // the same on a GPU (scaled_gemm.cuh)
//
// Operands. A is the quantized copy of an M x K matrix and B the quantized copy of an N x K matrix:
// both are K-major (row i of A and row j of B run along K), so D = dequant(A) * dequant(B)^T is
// M x N. A weight held as K x N is passed as its column-wise copy (the quantizers produce it from
// the same read; quant/tensor.hpp), which is its N x K quantized copy; an operand needed in the
// other orientation (the data-gradient dX = dY W uses W's row-wise copy as B) is likewise a copy.
// There is no transpose flag: every backend reads K-major rows, which is what FP8 tensor cores want.
// D is float, octet::bf16 or octet::fp16 (either layout), or a quantized copy (quantized_ref<RD>),
// in which case the float result is quantized with RD and its amax is returned. C has D's shape
// and is float, bf16 or fp16; bias is a float vector of N entries added to every row.
//
// Scaling pairs. Any recipe pair with the same K; the host backend serves all of them (FP8, FP6,
// FP4, FNUZ, float/UE8M0/two-level scales, any block shapes). The named pairs of training are
// tensor x tensor, row x row (A per token, B per output channel), 1x128 x 128x128 (forward and
// data-gradient), 1x128 x 1x128 (weight-gradient), MX x MX, NVFP4 x NVFP4 and mixed E4M3 x E5M2.
// Which GPU backend serves which pair is listed in scaled_gemm.cuh and by
// octet::gemm_backend_support (the reason a backend refuses a pair, or "").
//
// Numerics contract (every backend; the bound is tested).
//   * Products of two element codes are exact in float (FP8 x FP8 needs at most 8 significant bits
//     and its exponent range fits float), so the only rounding is in sums and scalings.
//   * K is cut into segments of g = gcd(P, K-block of A, K-block of B) elements, where P is
//     options.promotion_interval and blocks (or P) that cover all of K do not count. Inside a
//     segment the scales are constant; the unscaled code products are summed (host: float, in k
//     order; tensor cores: their own accumulator), then the partial sum p is
//     "promoted": acc += p * (sA * sB) in float. On the GPU kernels the segment is what the
//     tensor-core accumulator holds before promotion (DeepSeek-V3 promotes every 128).
//   * Epilogue in float: v = alpha * acc, then + beta * C, then + bias, then one rounding to D's
//     type (nearest-even; bf16/fp16 overflow gives Inf). A quantized D quantizes v.
//   * NaN and Inf codes propagate as IEEE arithmetic does (a NaN input gives NaN in its row or
//     column); the bound below assumes finite inputs and no overflow.
//   * Bound. Let T = sum_k |dequant(A)_ik| |dequant(B)_jk|, S = number of segments, L = segment
//     length actually used, u = 2^-24, gamma_n = n u / (1 - n u). Then
//         |acc - sum_k dequant(A)_ik dequant(B)_jk| <= c * T,   with
//         host:          c = gamma_(L + S)          (float sums inside segments, one rounding for
//                                                    sA*sB, one for p*(sA*sB), S adds)
//         tensor cores:  c = ceil(L / 32) * 2^-12 + gamma_(S + 1)
//     The tensor-core term is a model, not a vendor specification: Hopper's FP8 MMA keeps an
//     accumulator with about 13 fraction bits (e8m13, truncating; measured by PyTorch and the
//     DeepSeek-V3 report, "about 14 bits"), so each MMA k-step of 32 products loses at most
//     2^-13 of the magnitude it has summed, doubled for the alignment of the products inside the
//     step. This is why promotion every 128 matters: without it L = K and the error grows with K.
//     The epilogue adds gamma_3 (|alpha| (1 + c) T + |beta C| + |bias|) and the output rounding
//     u_D |D| (u_D = 2^-24 float, 2^-8 bf16, 2^-11 fp16). Underflow adds absolute terms: a product
//     that lands below float's normal range is off by at most 2^-150, and the partial p it scales
//     is at most L * maxA * maxB (max finite values of the formats), so
//     |alpha| (S + 2) L maxA maxB 2^-150 + 2^-148, and D's rounding of a tiny value adds half its
//     smallest subnormal (2^-150 float, 2^-134 bf16, 2^-25 fp16). gemm_error_bound() evaluates it
//     all. Overflow (to Inf) is outside the bound; fp16 D overflows from 65520 on.
//     sm90_wgmma promotes every 128 whatever larger P asks (more often is only more accurate), so
//     its L is min(g, 128). With options.split_k = r its acc is the in-order float sum of r range
//     accs (each range a run of whole segments): a segment's term meets at most ceil(S / r) + r - 2
//     <= S - 1 additions, as many as unsplit, so the bound is the same. sm89_mma on Hopper runs as
//     FP16 HMMA (ptxas lowers FP8 mma.sync there; FP8 -> FP16 is exact), which the same model
//     covers. cuBLASLt does not document its promotion interval: the bound takes L = 128 for its
//     block-scaled modes (it must promote at each scale block) and L = K for the others.
//
// This header holds the types, the options, the entries and the numerics queries; their
// implementation (the backend support rules, the error bound, the argument checks every backend
// shares and the host backend) is in octet/gemm/detail/scaled_gemm.hpp, which it includes at
// its end.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>

#include "octet/config.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/matrix.hpp"
#include "octet/core/span.hpp"
#include "octet/quant/recipe.hpp"
#include "octet/quant/tensor.hpp"

namespace octet {

/// Where a scaled GEMM runs. `automatic` picks the host backend for host executors, and on a
/// stream the fastest CUDA backend that serves the recipe pair on the running GPU.
enum class gemm_backend {
    automatic,
    host,        ///< blocked, multi-threaded CPU code; the exact check of the others
    sm89_mma,    ///< CUDA, mma.sync FP8 m16n8k32 (Ada sm_89 and Hopper sm_90)
    sm90_wgmma,  ///< CUDA, sm_90a: wgmma + TMA + mbarrier pipeline + warp specialization
    cublaslt,    ///< cuBLASLt's FP8 scaling modes (lent with octet::with_cublaslt, octet/gemm/cublaslt.cuh; link
                 ///< CUDA::cublasLt)
};

inline const char* backend_name(gemm_backend b) {
    switch (b) {
        case gemm_backend::automatic:
            return "automatic";
        case gemm_backend::host:
            return "host";
        case gemm_backend::sm89_mma:
            return "sm89_mma";
        case gemm_backend::sm90_wgmma:
            return "sm90_wgmma";
        case gemm_backend::cublaslt:
            return "cublaslt";
    }
    return "?";
}

/// Tile shape of the sm90_wgmma kernel. `automatic` takes 128 x 128 when that fills the GPU, 128 x
/// 192 where 128 x 128 tiles would leave much of the last wave idle (fewer, larger tiles; only for a B
/// whose scales are per tensor or in blocks of 128 rows or more, such as 128x128: per-row and 1x128
/// B scales would take a register per column), and 64 x 64 for small M (decode-like shapes) or few
/// tiles.
enum class gemm_tile { automatic, m128n128, m64n64, m128n192 };

inline const char* tile_name(gemm_tile t) {
    switch (t) {
        case gemm_tile::automatic:
            return "automatic";
        case gemm_tile::m128n128:
            return "m128n128";
        case gemm_tile::m64n64:
            return "m64n64";
        case gemm_tile::m128n192:
            return "m128n192";
    }
    return "?";
}

struct gemm_options {
    float alpha = 1.0f;
    /// Multiplies C (the overload with C); must be 0 without C.
    float beta = 0.0f;
    /// N floats added to every row of the result (per output column); empty for none. Host memory
    /// for the host executor, device memory for a stream.
    span<const float> bias{};
    gemm_backend backend = gemm_backend::automatic;
    /// K elements summed in a tensor-core accumulator before it is scaled and added into float
    /// registers (see the contract above). The GPU kernels need a multiple of 32 (sm89_mma) or
    /// of 128 (sm90_wgmma, which then promotes every 128); the host takes any value >= 1.
    int promotion_interval = 128;
    gemm_tile tile = gemm_tile::automatic;
    /// sm90_wgmma only (the other backends run K whole): cut K into this many ranges of whole
    /// 128-element blocks, each output tile's ranges run by different CTAs, their float partial sums
    /// then added in range order by a second kernel (deterministic; scratch of splits x M x N floats
    /// from the executor's allocator, counted by scaled_gemm_scratch_bytes). More CTAs stream the
    /// operands when the output has too few tiles to fill the GPU (M = 64 or 128 against a large
    /// weight). 0: chosen with the tile (split only where the tiles leave most SMs idle and every
    /// range keeps at least 4 K blocks); 1: never; n: n ranges (at most one per K block).
    int split_k = 0;
    /// sm90_wgmma only: CTAs per thread block cluster. With 2, a pair of CTAs computes two vertically
    /// adjacent output tiles together, each loading half of their common B tile and multicasting it
    /// to both (TMA .multicast::cluster), so B crosses from L2 once per pair. 0: chosen with the tile
    /// (pairs where they take no more waves than single CTAs and D has at least two tile rows); 1:
    /// never; 2: pairs.
    int cluster = 0;
};

struct gemm_result {
    gemm_backend backend = gemm_backend::host;  ///< the backend that ran
    float amax = 0.0f;  ///< quantized D: the finite amax of the float result (for delayed scaling); else 0
};

// ---- recipe facts the backends select on ---------------------------------------------------------

/// How an operand's recipe looks to a GEMM backend.
template <class Recipe>
struct gemm_operand_traits {
    using format = typename Recipe::format;
    using G = typename Recipe::granularity;
    /// The element formats tensor cores multiply natively (OCP E4M3 and E5M2).
    static constexpr bool tensor_core_fp8 = std::is_same_v<format, e4m3> || std::is_same_v<format, e5m2>;
    static constexpr bool f32_scales = std::is_same_v<typename Recipe::scale_storage_type, scale_storage::f32>;
    static constexpr bool per_tensor = G::rows == full && G::cols == full;
    static constexpr bool per_row = G::rows == 1 && G::cols == full;
    static constexpr bool vec128 = G::rows == 1 && G::cols == 128;
    static constexpr bool blk128 = G::rows == 128 && G::cols == 128;
    static constexpr bool nvfp4_like = std::is_same_v<format, e2m1> && Recipe::two_level;
};

/// Compile-time part of what each CUDA kernel serves (so that no kernel is instantiated for a pair
/// it can never run; gemm_backend_support adds the runtime rules and the reasons).
template <class RA, class RB>
struct gemm_kernel_pair {
    template <class R>
    static constexpr bool k_blocks_of(std::size_t step) {
        return R::granularity::cols == full || R::granularity::cols % step == 0;
    }
    static constexpr bool fp8 = gemm_operand_traits<RA>::tensor_core_fp8 && gemm_operand_traits<RB>::tensor_core_fp8;
    static constexpr bool sm89 = fp8 && k_blocks_of<RA>(32) && k_blocks_of<RB>(32);
    static constexpr bool sm90 = fp8 && gemm_operand_traits<RA>::f32_scales && gemm_operand_traits<RB>::f32_scales &&
                                 k_blocks_of<RA>(128) && k_blocks_of<RB>(128);
};

/// "e4m3, 1x128 blocks, f32 scales" and the like, for messages.
template <class Recipe>
std::string recipe_description();

/// Why `backend` cannot run A x B with these options (an empty string when it can), judged from the
/// recipes, K and the promotion interval alone. Device facts (architecture, alignment of the actual
/// pointers) are checked when the GPU call runs.
template <class RA, class RB>
std::string gemm_backend_support(gemm_backend backend, std::size_t K, const gemm_options& opt = {});

/// The backends (of host, sm89_mma, sm90_wgmma, cublaslt) that serve A x B, for messages.
template <class RA, class RB>
std::string gemm_backends_serving(std::size_t K, const gemm_options& opt);

// ---- the error bound -----------------------------------------------------------------------------

/// The accumulation constants of one backend on one problem: |acc - exact| <= accumulation * T.
struct gemm_numerics {
    std::size_t segment = 0;    ///< L: elements per segment actually used
    std::size_t segments = 0;   ///< S
    double accumulation = 0.0;  ///< c
    double output_unit = 0.0;   ///< u_D of D's type
    double underflow = 0.0;     ///< absolute term of underflowing float products (times |alpha|), plus the epilogue's
    double output_tiny = 0.0;   ///< half the smallest subnormal of D's type
};

/// The constants of the bound (see the contract at the top) for `backend` on A x B with K columns.
template <class RA, class RB, class Out = float>
gemm_numerics gemm_numerics_of(gemm_backend backend, std::size_t K, const gemm_options& opt = {});

/// Bound on |D_ij - exact_ij| where exact_ij = alpha * sum_k dequant(A)_ik dequant(B)_jk + beta C_ij +
/// bias_j in real arithmetic. abs_products = sum_k |dequant(A)_ik| |dequant(B)_jk|; abs_beta_c =
/// |beta C_ij|; abs_bias = |bias_j|; abs_exact = |exact_ij|.
inline double gemm_error_bound(const gemm_numerics& n, double alpha, double abs_products, double abs_beta_c = 0.0,
                               double abs_bias = 0.0, double abs_exact = 0.0);

// ---- the entries ----------------------------------------------------------------------------------

/// D = alpha * dequant(A) * dequant(B)^T + bias on the executor: the host (D float, octet::bf16 or
/// octet::fp16, host memory) or a CUDA stream (octet/gemm/scaled_gemm.cuh: device memory; D may also
/// be __nv_bfloat16 / __half; enqueues, never synchronizes).
template <class RA, class BA, class RB, class BB, class DT, class Executor>
gemm_result scaled_gemm(const Executor& ex, quantized_ref<RA, BA> A, quantized_ref<RB, BB> B, matrix_ref<DT> D,
                        const gemm_options& opt = {});

/// D = alpha * dequant(A) * dequant(B)^T + beta * C + bias on the executor. C may be D itself.
template <class RA, class BA, class RB, class BB, class CT, class DT, class Executor>
gemm_result scaled_gemm(const Executor& ex, quantized_ref<RA, BA> A, quantized_ref<RB, BB> B, matrix_ref<CT> C,
                        matrix_ref<DT> D, const gemm_options& opt = {});

/// Bytes of host scratch scaled_gemm(ex, A, B, [C,] D, opt) takes from ex's allocator (one block):
/// both operands decoded into panels of floats ((M + N) x K, rounded up to the register tile) with
/// their segment scales, and one task's accumulators (48 KB) per thread. Same arguments as
/// scaled_gemm (not checked here; C does not change it). 0 when M or N is 0.
template <class RA, class BA, class RB, class BB, class DT>
std::size_t scaled_gemm_scratch_bytes(const host_executor& ex, quantized_ref<RA, BA> A, quantized_ref<RB, BB> B,
                                      matrix_ref<DT> D, const gemm_options& opt = {});

/// The same for a quantized D: the float result (M x N floats), then the larger of the product's
/// scratch and quantize's (quantize_scratch_bytes) for D.
template <class RA, class BA, class RB, class BB, class RD>
std::size_t scaled_gemm_scratch_bytes(const host_executor& ex, quantized_ref<RA, BA> A, quantized_ref<RB, BB> B,
                                      quantized_ref<RD> D, const gemm_options& opt = {});

/// Quantized output: the float result alpha * A B^T + bias is quantized into D with recipe RD
/// (octet::quantize's contract). On the host its amax is returned in gemm_result::amax; on a stream
/// the float result lives in M * N floats of scratch from the executor's allocator, and
/// `device_amax` (device memory, overwritten; null to skip) receives the amax while
/// gemm_result::amax stays 0 (scaled_gemm_scratch_bytes gives the scratch; no host sync).
template <class RA, class BA, class RB, class BB, class RD, class Executor>
gemm_result scaled_gemm(const Executor& ex, quantized_ref<RA, BA> A, quantized_ref<RB, BB> B, quantized_ref<RD> D,
                        const gemm_options& opt = {}, float* device_amax = nullptr);

}  // namespace octet

#include "octet/gemm/detail/scaled_gemm.hpp"  // IWYU pragma: export
