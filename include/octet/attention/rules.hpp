// octet/attention/rules.hpp: the numeric rules of FP8 attention, as OCTET_HD functions that the host
// path (attention.hpp) and the CUDA kernels (attention.cuh) both call.
//
// The host path and the kernels compute every element-wise quantity with these functions, written
// with explicitly rounded float operations (no a*b+c is left for a compiler to fuse on one side
// and not the other). Two things differ between the paths: the order of the float sums inside the
// products (the tensor cores' order is not the host's, and Hopper's FP8 accumulation keeps fewer
// bits), and exp2, which the host computes with a polynomial (the same bits with any C++ library)
// and the kernels with the hardware's ex2.approx (2 ulps; a polynomial costs ~15 issue slots per
// score, the kernels' bottleneck). So the two paths agree up to float rounding of the scores, and
// an FP8 code of P or dS can round the other way where a value sits at a code boundary;
// tests/cuda/attention_device.cu measures how far apart they are.
//
// The quantization points (what docs/attention.md calls the numerics contract of FP8 attention):
//   * Q, K, V, dO arrive quantized (octet::quantize with any recipe whose blocks do not split a
//     head: block<1, head_dim>, block<R, head_dim>, per_row, per_tensor, ...). Element values are
//     decode(code) * S with S the block's scale, exactly as quantized_ref::value says.
//   * S = Q K^T is the product of the codes (exact products, float sums), then scaled:
//     x_ij = (acc_ij * (s_q(i) * scale * log2 e)) * s_k(j), the score in log2 units.
//   * P for the P V product (forward) is quantized to E4M3 with the fixed scale 2^-8
//     (code = encode<e4m3>(P * 256)). P is in [0, 1] (the online softmax subtracts the running
//     maximum), so P * 256 is in [0, 256]: 1 maps to 256 = 2^8 <= 448 (E4M3's largest value) with
//     no saturation, the scaling is a power of two and therefore exact, and P keeps E4M3's full
//     relative precision (3 mantissa bits, error <= 2^-4) down to P = 2^-14 (E4M3's smallest
//     normal 2^-6 over 256), with subnormal steps of 2^-17 below that; P < 2^-18 rounds to 0.
//     2^9 = 512 would saturate P near 1, and 448 (the "full range" choice) would make the scaling
//     inexact for less than one extra binade at the bottom. A per-token V scale s_v(j) is folded
//     into P before rounding: u_ij = P_ij * (s_v(j) / m_v) with m_v the largest s_v of the
//     64-key tile (so u <= 1 still, and u == P exactly when V has one scale per head), and the
//     tile's P V partial sum is multiplied by m_v * 2^-8.
//   * The backward recomputes P_ij = exp2(x_ij - L_i * log2 e) in float (from the saved
//     log-sum-exp L), and dP_ij = (acc_ij * s_do(i)) * s_v(j) from the FP8 codes of dO and V.
//     dS_ij = P_ij * (dP_ij - D_i), in float.
//   * P for dV = P^T dO is quantized like the forward's P, with s_do folded in over 64-query tiles.
//   * dS is quantized twice, once per product, each with a dynamic E4M3 scale S = amax / 448
//     (ds_recipe, the amax_ratio rule, so the largest |dS| of a tile row is exactly 448 and
//     carries no rounding error: a power-of-two scale measured 3.7% instead of 2.0% dQ error):
//     code = encode<e4m3>(x * (1 / S)) with the reciprocal taken once per tile row (the kernels
//     multiply instead of dividing per element; this differs from encode_scaled's x / S by one code
//     only when x * (1/S) and x / S fall on two sides of a rounding boundary: none in 10^5
//     random values, tests/host/attention_host.cpp). For dK = scale * dS^T Q the operand is
//     dS_ij * s_q(i) with one scale per key row and 64-query tile; for dQ = scale * dS K it is
//     dS_ij * s_k(j) with one scale per query row and 64-key tile. Both scales are constant
//     along the product's contraction within a tile, so the tile's partial sum is multiplied by
//     its scale after the FP8 product.
//   * D (the delta): from_output: D_i = sum_c dO_ic O_ic with dO dequantized and O as stored;
//     matched: D_i = sum_j P_ij dP_ij over exactly the P and dP above, so sum_j dS_ij is zero up to
//     float rounding (P sums to 1 up to float rounding).
//
// Tiles are 64 queries by 64 keys, aligned at each sequence's first token; the host path walks the
// same tiles in the same order (key_tile_order, front to back or back to front) because the running
// maximum of the online softmax (and so the FP8 codes of P) depends on them.
#pragma once

#include <cmath>
#include <cstdint>

#include "octet/config.hpp"
#include "octet/core/bits.hpp"
#include "octet/core/rounded.hpp"
#include "octet/format/encode.hpp"
#include "octet/quant/recipe.hpp"
#include "octet/quant/scale.hpp"

namespace octet {

/// How the backward computes the row term D_i of dS = P * (dP - D).
enum class delta_mode {
    /// D_i = rowsum(dO_i * O_i) from the stored output: the usual way, kept for comparison. Under FP8
    /// it is stale (the O the forward stored is not the P V the backward sees), and every row of dS
    /// then sums to a non-zero value.
    from_output,
    /// D_i = sum_j P_ij dP_ij from exactly the P and dP that form dS (a second pass over the keys):
    /// every row of dS sums to zero up to float rounding.
    matched,
};

/// The order in which the forward visits the key tiles of a query tile. The online softmax is exact
/// in either order, but the FP8 codes of P are not: each tile's P is taken against the running
/// maximum of the tiles visited so far, so a tile visited after a much larger score (an attention
/// sink, usually the first tokens) has its P pushed into E4M3's subnormals or to zero, although
/// its final probability would be representable. Visiting back to front meets the sink last.
/// bench/RESULTS.md ("Key tile order and P underflow") measures both on sink-heavy inputs.
enum class key_tile_order {
    front_to_back,
    back_to_front,
};

enum class attention_mask {
    full,
    /// Query i (0-based in its sequence of length Lq) sees key j (of Lk) iff j <= i + Lk - Lq
    /// (aligned at the bottom right, as FlashAttention 2.1+; Lq == Lk gives j <= i).
    causal,
};

namespace detail {
namespace attention {

/// Queries per tile and keys per tile, for the host path and the kernels.
inline constexpr int tile_size = 64;

/// P is stored as encode<e4m3>(P / p_scale): see the header comment for why 2^-8.
inline constexpr float p_scale = 0.00390625f;  // 2^-8
/// The rule P is quantized with: E4M3, nearest-even, saturate, with the fixed scale p_scale (the
/// granularity and scale rule of this recipe are not used: the scale is not derived from an amax).
using p_recipe = recipe<e4m3, per_tensor, scale::pow2_ceil>;
/// The rule dS's scale follows: E4M3, one float scale amax / 448 per row of a 64-wide tile.
using ds_recipe = recipe<e4m3, octet::block<1, 64>, scale::amax_ratio<0>>;

inline constexpr float log2e = 1.4426950408889634f;
inline constexpr float ln2 = 0.6931471805599453f;

// ---- explicitly rounded float operations (the same bits on host and device): core/rounded.hpp
using rn::add;
using rn::div;
using rn::fma;
using rn::mul;
using rn::sub;

/// max(a, b) where a NaN b is dropped and a NaN a is kept (a running max keeps a NaN it already has;
/// fmaxf would drop it on either side).
OCTET_HD float fmax(float a, float b) {
    return b > a ? b : a;
}
OCTET_HD float neg_inf() {
    return bits_to_float(0xFF800000u);
}
OCTET_HD float pos_inf() {
    return bits_to_float(0x7F800000u);
}

/// 2^y. Host: rn::exp2, y = n + f with n = round(y), |f| <= 1/2, 2^f by its Taylor polynomial of
/// degree 7 (truncation below 5e-9; measured error under 2 float ulps for y in [-126, 0],
/// tests/host/attention_host.cpp); y < -126 (and -Inf) gives 0; y > 127 gives +Inf; NaN gives NaN;
/// exp2(0) == 1 exactly. Device: ex2.approx.ftz (2 ulps; results below 2^-126 flush to 0; -Inf
/// gives 0, NaN gives NaN).
OCTET_HD float exp2(float y) {
#if OCTET_DEVICE_PASS
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
    return r;
#else
    // Selects, not branches, so that a loop of exp2 vectorizes (the host path's tile kernels).
    const float r = rn::exp2(y);  // the shared polynomial (core/rounded.hpp); on [-126, 127] its clamps do nothing
    return y != y ? y : y < -126.0f ? 0.0f : y > 127.0f ? pos_inf() : r;
#endif
}

// ---- the element rules -----------------------------------------------------------------------

/// The per-query factor of the score: s_q(i) * softmax_scale * log2 e.
OCTET_HD float query_factor(float q_scale, float scale_log2) {
    return mul(q_scale, scale_log2);
}

/// The score in log2 units from the FP8 product acc_ij = sum_c q_code * k_code.
OCTET_HD float score(float acc, float query_factor, float k_scale) {
    return mul(mul(acc, query_factor), k_scale);
}

/// dP_ij from the FP8 product acc_ij = sum_c do_code * v_code.
OCTET_HD float dprob(float acc, float do_scale, float v_scale) {
    return mul(mul(acc, do_scale), v_scale);
}

/// dS_ij = P_ij * (dP_ij - D_i).
OCTET_HD float dscore(float p, float dp, float delta) {
    return mul(p, sub(dp, delta));
}

/// The running maximum that exponents are taken against: 0 while a row has seen no key (so that
/// exp2(-Inf - 0) = 0 instead of NaN).
OCTET_HD float usable_max(float m) {
    return m == neg_inf() ? 0.0f : m;
}

/// The E4M3 code of P (or of P times a scale ratio in [0, 1]) for a P V or P^T dO product:
/// encode_scaled<p_recipe>(u, p_scale), written as a multiplication by 256 (the same bits: the
/// scale is a power of two).
OCTET_HD std::uint8_t encode_p(float u) {
    return encode<e4m3>(mul(u, 256.0f));
}

/// The ratio s / m (in [0, 1]) that folds a per-token scale into P; exactly 1 when s == m.
OCTET_HD float scale_ratio(float s, float m) {
    return s == m ? 1.0f : div(s, m);
}

/// The dynamic scale S of a dS tile row from its largest finite |value| (ds_recipe's rule), and
/// the reciprocal the codes are formed with.
OCTET_HD float ds_scale(float amax) {
    return make_block_scale<ds_recipe>(amax).value;
}
OCTET_HD float ds_inverse(float scale) {
    return div(1.0f, scale);
}
/// The E4M3 code of a dS value: encode<e4m3>(x * inverse), inverse = ds_inverse(S).
OCTET_HD std::uint8_t encode_ds(float x, float inverse) {
    return encode<e4m3>(mul(x, inverse));
}

/// The log-sum-exp L_i = ln sum_j exp(scale * S_ij), from the running max m (log2 units) and the
/// row sum l of exp2(x - m). A row that saw no key (l == 0) gets L = +Inf, so that the backward's
/// exp2(x - L log2 e) is 0 there.
OCTET_HD float log_sum_exp(float m, float l) {
    if (!(l > 0.0f)) return pos_inf();
#if OCTET_DEVICE_PASS
    const float lg = log2f(l);
#else
    const float lg = std::log2(l);
#endif
    return mul(add(usable_max(m), lg), ln2);
}

/// True when every query of rows [i0, i0 + 64) below lq sees every key of [j0, j0 + 64) (no mask
/// test needed inside the tile). Rows past lq are not stored, so they do not count.
OCTET_HD bool tile_all_visible(int i0, int j0, int lq, int lk, bool causal) {
    if (j0 + tile_size > lk || i0 + tile_size > lq) return false;
    return !causal || j0 + tile_size - 1 <= i0 + (lk - lq);
}

/// True when query i (of Lq) sees key j (of Lk).
OCTET_HD bool visible(int i, int j, int lq, int lk, bool causal) {
    return i < lq && j < lk && (!causal || j <= i + (lk - lq));
}

/// Number of 64-key tiles the queries of tile `qt` visit (keys past the last one are masked for
/// every row of the tile).
OCTET_HD int key_tiles_for(int qt, int lq, int lk, bool causal) {
    const int all = (lk + tile_size - 1) / tile_size;
    if (!causal) return all;
    const int last_row = (qt + 1) * tile_size - 1 < lq - 1 ? (qt + 1) * tile_size - 1 : lq - 1;
    const int last_key = last_row + (lk - lq);
    if (last_key < 0) return 0;
    const int n = last_key / tile_size + 1;
    return n < all ? n : all;
}

/// The key tile visited at step `step` (0-based) of the `ntiles` a query tile visits.
OCTET_HD int key_tile_at(int step, int ntiles, key_tile_order order) {
    return order == key_tile_order::back_to_front ? ntiles - 1 - step : step;
}

/// First 64-query tile that sees any key of key tile `kt`.
OCTET_HD int first_query_tile_for(int kt, int lq, int lk, bool causal) {
    if (!causal) return 0;
    const int first_row = kt * tile_size - (lk - lq);  // smallest i with i + lk - lq >= kt * tile
    return first_row <= 0 ? 0 : first_row / tile_size;
}

}  // namespace attention
}  // namespace detail
}  // namespace octet
