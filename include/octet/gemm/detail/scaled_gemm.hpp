// octet/gemm/detail/scaled_gemm.hpp: the implementation of octet/gemm/scaled_gemm.hpp (which
// includes it at its end): which backend serves which recipe pair and why not, the constants of
// the error bound, the argument checks every backend shares, the host backend (its register
// tiles, SIMD kernels and blocking plan) and the executor backends' entry, and the definitions of
// the functions declared there.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>

#include "octet/config.hpp"
#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/isa_dispatch.hpp"
#include "octet/core/matrix.hpp"
#include "octet/core/span.hpp"
#include "octet/gemm/scaled_gemm.hpp"
#include "octet/quant/quantize.hpp"
#include "octet/quant/recipe.hpp"
#include "octet/quant/tensor.hpp"

namespace octet {

namespace detail {

constexpr std::size_t gcd_size(std::size_t a, std::size_t b) {
    while (b) {
        const std::size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/// How B's scales of one K block vary across the BN columns of a tile, from the rows of B's scale
/// blocks (R: B's rows are D's columns) and BN:
///   per_tile    one value (R spans whole tiles: per-tensor, or R a multiple of BN, as 128x128 at BN 128);
///   two_blocks  at most two values, the tile's columns [0, split) in one block and [split, BN) in the
///               next (R a multiple of 8 with BN <= R + gcd(R, BN): a tile starting at n0, a multiple of
///               BN, has n0 % R <= R - gcd(R, BN), so it ends within the next block; split = R - n0 % R
///               is a multiple of 8, so each 8-column group of the accumulator takes one value; DeepGEMM's
///               handling of 128x128 blocks under a 192-wide tile);
///   per_column  one value per column (per-row and 1x128 B), kept in BN / 4 registers per thread, so only
///               for BN <= 128.
enum class sm90_b_scales { per_tile, two_blocks, per_column };
template <std::size_t R, int BN>
constexpr sm90_b_scales sm90_b_scales_of() {
    constexpr std::size_t n = static_cast<std::size_t>(BN);
    if constexpr (R == full || R % n == 0) {
        return sm90_b_scales::per_tile;
    } else {
        return R % 8 == 0 && n <= R + gcd_size(R, n) ? sm90_b_scales::two_blocks : sm90_b_scales::per_column;
    }
}
/// The N of sm90_wgmma's wide tile (gemm_tile::m128n192), and whether it serves a B recipe (B's scales
/// must not be per column).
inline constexpr int sm90_wide_bn = 192;
template <class RB>
constexpr bool sm90_wide_serves() {
    return sm90_b_scales_of<RB::granularity::rows, sm90_wide_bn>() != sm90_b_scales::per_column;
}
/// Why options.tile m128n192 cannot run a B whose scales are per column (after "options.tile is m128n192").
inline constexpr const char* sm90_wide_refusal =
    ", and the 128 x 192 tile needs B's scales per tensor or in blocks of rows (128x128 and the like), not per "
    "row: use m128n128 or automatic";

/// Segment length g = gcd of the promotion interval and both K-blocks, ignoring any that cover K.
inline std::size_t gemm_segment(std::size_t promotion, std::size_t a_block_cols, std::size_t b_block_cols,
                                std::size_t K) {
    std::size_t g = 0;
    for (std::size_t v : {promotion, a_block_cols, b_block_cols})
        if (v > 0 && v < K) g = g == 0 ? v : gcd_size(g, v);
    return g == 0 ? std::max<std::size_t>(K, 1) : g;
}

/// True when every boundary of a block of `b` columns (b < K) is a multiple of `step`.
inline bool boundaries_on(std::size_t b, std::size_t step, std::size_t K) {
    return b >= K || b % step == 0;
}

inline double gamma_n(double n) {
    const double u = std::ldexp(1.0, -24);
    return n * u / (1.0 - n * u);
}
template <class Out>
double output_unit() {
    if constexpr (std::is_same_v<Out, bf16>)
        return std::ldexp(1.0, -8);
    else if constexpr (std::is_same_v<Out, fp16>)
        return std::ldexp(1.0, -11);
    else
        return std::ldexp(1.0, -24);
}
template <class Out>
double output_tiny() {
    if constexpr (std::is_same_v<Out, bf16>)
        return std::ldexp(1.0, -134);
    else if constexpr (std::is_same_v<Out, fp16>)
        return std::ldexp(1.0, -25);
    else
        return std::ldexp(1.0, -150);
}

// ---- argument checks shared by every backend ----------------------------------------------------

template <class T>
inline constexpr bool is_gemm_output_v = std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

template <class T>
void require_matrix(const matrix_ref<T>& m, const char* fn, const char* arg) {
    const std::size_t minor = m.order == storage_order::row_major ? m.cols : m.rows;
    OCTET_REQUIRE(m.empty() || m.data != nullptr, fn, arg, "is null with a non-zero shape");
    OCTET_REQUIRE(m.empty() || m.ld >= minor, fn, arg,
                  message("has ld ", m.ld, " smaller than its ",
                          (m.order == storage_order::row_major ? "cols " : "rows "), minor));
}

/// Checks A, B and the options (what every output kind shares).
template <class RA, class BA, class RB, class BB>
void check_gemm_operands(const quantized_ref<RA, BA>& A, const quantized_ref<RB, BB>& B, const gemm_options& opt) {
    constexpr const char* fn = "octet::scaled_gemm";
    const std::size_t M = A.rows(), N = B.rows(), K = A.cols();
    OCTET_REQUIRE(
        B.cols() == K, fn, "B",
        message("has K = ", B.cols(), " columns but A has K = ", K,
                "; both operands are K-major (A is M x K, B is N x K: pass a K x N weight's column-wise copy)"));
    validate_output(A, M, K, fn, "A");
    validate_output(B, N, K, fn, "B");
    OCTET_REQUIRE(
        opt.promotion_interval >= 1, fn, "options.promotion_interval",
        message("is ", opt.promotion_interval, "; pass a positive number of K elements (128 is DeepSeek-V3's)"));
    OCTET_REQUIRE(opt.split_k >= 0, fn, "options.split_k",
                  message("is ", opt.split_k, "; pass 0 (chosen with the tile), 1 (no split) or a number of K ranges"));
    OCTET_REQUIRE(opt.cluster >= 0 && opt.cluster <= 2, fn, "options.cluster",
                  message("is ", opt.cluster, "; pass 0 (chosen with the tile), 1 (single CTAs) or 2 (pairs)"));
    OCTET_REQUIRE(
        opt.bias.empty() || opt.bias.size() == N, fn, "options.bias",
        message("has ", opt.bias.size(), " entries but D has N = ", N, " columns; pass one per output column or none"));
    OCTET_REQUIRE(opt.bias.empty() || opt.bias.data() != nullptr, fn, "options.bias", "is null with a non-zero size");
    OCTET_REQUIRE(std::isfinite(opt.alpha) && std::isfinite(opt.beta), fn, "options.alpha/beta", "must be finite");
}

/// Checks A, B, the options and the shapes of C and D against each other.
template <class RA, class BA, class RB, class BB, class CT, class DT>
void check_gemm_args(const quantized_ref<RA, BA>& A, const quantized_ref<RB, BB>& B, const matrix_ref<CT>* C,
                     const matrix_ref<DT>& D, const gemm_options& opt, bool has_c) {
    constexpr const char* fn = "octet::scaled_gemm";
    check_gemm_operands(A, B, opt);
    const std::size_t M = A.rows(), N = B.rows();
    OCTET_REQUIRE(D.rows == M && D.cols == N, fn, "D",
                  message("has shape ", D.rows, " x ", D.cols, " but A B^T is ", M, " x ", N));
    require_matrix(D, fn, "D");
    if (has_c) {
        OCTET_REQUIRE(C->rows == M && C->cols == N, fn, "C",
                      message("has shape ", C->rows, " x ", C->cols, " but D is ", M, " x ", N));
        require_matrix(*C, fn, "C");
    } else {
        OCTET_REQUIRE(opt.beta == 0.0f, fn, "options.beta",
                      "is non-zero but no C was passed; use the overload that takes C");
    }
}

/// The checks of the quantized-D overloads (host and stream), all made before the GEMM runs, so
/// that a D of the wrong shape is reported under octet::scaled_gemm and nothing is computed.
template <class RA, class BA, class RB, class BB, class RD>
void check_gemm_quantized_d(const quantized_ref<RA, BA>& A, const quantized_ref<RB, BB>& B, const quantized_ref<RD>& D,
                            const gemm_options& opt) {
    constexpr const char* fn = "octet::scaled_gemm";
    check_gemm_operands(A, B, opt);
    OCTET_REQUIRE(opt.beta == 0.0f, fn, "options.beta", "is non-zero but a quantized D takes no C; pass beta = 0");
    OCTET_REQUIRE(!D.absent(), fn, "D", "is absent ({}); pass the quantized copy to write");
    validate_output(D, A.rows(), B.rows(), fn, "D");
}

inline void check_host_backend(const gemm_options& opt) {
    OCTET_REQUIRE(opt.backend == gemm_backend::automatic || opt.backend == gemm_backend::host, "octet::scaled_gemm",
                  "options.backend",
                  message("is ", backend_name(opt.backend),
                          ", a CUDA backend; call scaled_gemm with octet::on_stream(s) "
                          "(octet/gemm/scaled_gemm.cuh) or choose gemm_backend::host"));
}

// ---- host backend -------------------------------------------------------------------------------

template <class T>
OCTET_HD float load_as_float(const T& v) {
    if constexpr (std::is_same_v<T, float>)
        return v;
    else
        return to_float(v);
}
template <class T>
OCTET_HD T store_from_float(float v) {
    if constexpr (std::is_same_v<T, float>)
        return v;
    else if constexpr (std::is_same_v<T, bf16>)
        return to_bf16(v);
    else
        return to_fp16(v);
}

// How the host backend runs. Both operands are decoded once per call (unscaled codes, as float)
// into panels: A in panels of MR rows stored k-major ([k][MR]), B in panels of NR rows ([k][NR]),
// with every row's scale over every segment beside them ([s][MR], [s][NR]). A task is a tile of D;
// for each chunk of whole segments, and for each pair of B and A panels of the tile, the
// micro-kernel sums each segment's code products in an MR x NR tile of vector registers, running
// down k, then promotes them into the tile's accumulators in memory: acc += p * (sA * sB). Each
// element sums its segment in k order, so every instruction set, tile shape and thread count gives
// the same bits. The micro-kernel runs compiled for the CPU's best instruction set
// (core/isa_dispatch.hpp) with fused multiply-adds for the products: a product of two codes is
// exact, so fusing it changes no bit; the promotion, rounded twice by contract, is kept unfused.

#if defined(__GNUC__) || defined(__clang__)
/// W float lanes: a GCC/Clang vector (one AVX-512, AVX or SSE/NEON register for W = 16, 8, 4).
template <std::size_t W>
struct host_vector;
template <>
struct host_vector<4> {
    typedef float type __attribute__((vector_size(16)));
};
template <>
struct host_vector<8> {
    typedef float type __attribute__((vector_size(32)));
};
template <>
struct host_vector<16> {
    typedef float type __attribute__((vector_size(64)));
};
#else
template <std::size_t W>
struct host_vector {
    struct type {
        float v[W];
        type& operator+=(const type& o) {
            for (std::size_t i = 0; i < W; ++i) v[i] += o.v[i];
            return *this;
        }
        friend type operator*(const type& a, const type& b) {
            type r;
            for (std::size_t i = 0; i < W; ++i) r.v[i] = a.v[i] * b.v[i];
            return r;
        }
        friend type operator-(float x, const type& b) {
            type r;
            for (std::size_t i = 0; i < W; ++i) r.v[i] = x - b.v[i];
            return r;
        }
    };
};
#endif

// GCC unrolls the register tile's loops at -O2 only when asked, and at -O3 by itself (nvcc's front
// end does not know the pragma, so under nvcc the host compiler's -O3 does it).
#if defined(__GNUC__) && !defined(__CUDACC__)
#define OCTET_HOST_UNROLL _Pragma("GCC unroll 16")
#else
#define OCTET_HOST_UNROLL
#endif

/// Hides v's value from the optimizer, so that the multiply that made it is not fused into the add
/// that uses it (a fused multiply-add would round once where the contract rounds twice).
template <class V>
OCTET_KERNEL_INLINE void host_unfused(V& v) {
#if defined(__GNUC__) || defined(__clang__)
    __asm__("" : "+m"(v));
#else
    (void)v;  // MSVC does not contract by default
#endif
}

/// The micro-kernel's register tile for one instruction set: MR rows x NV vectors of W lanes
/// (NR = NV * W columns of D); MR x NV partial sums plus NV + 1 operands fill the vector registers.
template <simd_isa Isa, std::size_t W, std::size_t MR, std::size_t NV>
struct host_gemm_tile {
    static constexpr simd_isa isa = Isa;
    static constexpr std::size_t width = W, mr = MR, nv = NV, nr = NV * W;
};
using host_gemm_tile_avx512 = host_gemm_tile<simd_isa::avx512, 16, 6, 2>;     // 12 of 32 zmm
using host_gemm_tile_avx2 = host_gemm_tile<simd_isa::avx2, 8, 6, 2>;          // 12 of 16 ymm
using host_gemm_tile_portable = host_gemm_tile<simd_isa::portable, 4, 6, 2>;  // 12 of 16 xmm (SSE2, NEON)

/// Segments [s0, s1) of one task: for every B panel and A panel of its tile, p = the sum of each
/// segment's code products (k order), then acc += p * (sA * sB). Panels are `K` codes long and
/// their scales `S` segments long; the tile's accumulators are blocks of MR x NR floats, block
/// (jb, ia) at acc + (jb * a_panels + ia) * MR * NR.
template <class Tile>
struct host_gemm_kernel {
    OCTET_KERNEL_INLINE static void run(const float* a_pack, const float* a_scales, std::size_t a_panels,
                                        const float* b_pack, const float* b_scales, std::size_t b_panels, std::size_t K,
                                        std::size_t S, std::size_t g, std::size_t s0, std::size_t s1, float* acc) {
        constexpr std::size_t W = Tile::width, MR = Tile::mr, NV = Tile::nv, NR = Tile::nr;
        using V = typename host_vector<W>::type;
        for (std::size_t jb = 0; jb < b_panels; ++jb)
            for (std::size_t ia = 0; ia < a_panels; ++ia) {
                const float* a = a_pack + ia * K * MR;  // (K, MR)
                const float* b = b_pack + jb * K * NR;  // (K, NR)
                const float* sa = a_scales + ia * S * MR;
                const float* sb = b_scales + jb * S * NR;
                float* c = acc + (jb * a_panels + ia) * MR * NR;  // (MR, NR)
                for (std::size_t s = s0; s < s1; ++s) {
                    const std::size_t k1 = std::min(K, (s + 1) * g);
                    V p[MR][NV];  // (MR, NR) partial sums of segment s
                    OCTET_HOST_UNROLL
                    for (std::size_t r = 0; r < MR; ++r) OCTET_HOST_UNROLL
                    for (std::size_t v = 0; v < NV; ++v) p[r][v] = V{};
                    for (std::size_t k = s * g; k < k1; ++k) {
                        V bv[NV];
                        OCTET_HOST_UNROLL
                        for (std::size_t v = 0; v < NV; ++v) std::memcpy(&bv[v], b + k * NR + v * W, sizeof(V));
                        OCTET_HOST_UNROLL
                        for (std::size_t r = 0; r < MR; ++r) {
                            const V av = a[k * MR + r] - V{};  // x - 0 is x: one broadcast
                            OCTET_HOST_UNROLL
                            for (std::size_t v = 0; v < NV; ++v) p[r][v] += av * bv[v];
                        }
                    }
                    OCTET_HOST_UNROLL
                    for (std::size_t r = 0; r < MR; ++r) {
                        const V sr = sa[s * MR + r] - V{};
                        OCTET_HOST_UNROLL
                        for (std::size_t v = 0; v < NV; ++v) {
                            V sc, cv;
                            std::memcpy(&sc, sb + s * NR + v * W, sizeof(V));
                            std::memcpy(&cv, c + r * NR + v * W, sizeof(V));
                            V t = p[r][v] * (sr * sc);
                            host_unfused(t);
                            cv += t;
                            std::memcpy(c + r * NR + v * W, &cv, sizeof(V));
                        }
                    }
                }
            }
    }
};

// The GEMM's AVX2 variant adds FMA (see host_unfused for why it is safe): core/isa_dispatch.hpp's
// run_fma_kernel variants, chosen by fma_kernel_supported / best_fma_isa.
/// Whether this CPU runs the GEMM's variant for `isa` (AVX2 also needs FMA).
inline bool host_gemm_isa_supported(simd_isa isa) {
    return fma_kernel_supported(isa);
}

/// The GEMM's best variant on this CPU.
inline simd_isa host_gemm_isa() {
    return best_fma_isa();
}

template <class Tile, class... Args>
void run_host_gemm_kernel(Args... args) {
#if OCTET_ISA_DISPATCH
    if constexpr (Tile::isa == simd_isa::avx512)
        return run_kernel_avx512<host_gemm_kernel<Tile>>(args...);
    else if constexpr (Tile::isa == simd_isa::avx2)
        return run_fma_kernel_avx2<host_gemm_kernel<Tile>>(args...);
    else
#endif
        host_gemm_kernel<Tile>::run(args...);
}

/// Packs segments [s0, s1) of panel `panel` of q (rows panel * Rows + r, r < Rows; rows past the end
/// are zeros), k in [s0 g, min(K, s1 g)): the decoded codes k-major, dst[(k - s0 g) * Rows + r], and
/// each row's scale per segment, scales[(s - s0) * Rows + r].
template <std::size_t Rows, class R>
void host_gemm_pack_panel(const quantized_cref<R>& q, const float* table, std::size_t panel, std::size_t g,
                          std::size_t s0, std::size_t s1, float* dst, float* scales) {
    using Fmt = typename R::format;
    const std::size_t k0 = s0 * g, k1 = std::min(q.cols(), s1 * g), i0 = panel * Rows,
                      rows = std::min(Rows, q.rows() - i0);
    const std::uint8_t* row[Rows];
    for (std::size_t r = 0; r < Rows; ++r) row[r] = q.data + (i0 + std::min(r, rows - 1)) * q.layout.row_bytes;
    for (std::size_t k = k0; k < k1; ++k)
        for (std::size_t r = 0; r < Rows; ++r) {
            if constexpr (Fmt::bits == 8)
                dst[(k - k0) * Rows + r] = table[row[r][k]];
            else
                dst[(k - k0) * Rows + r] = table[load_code<Fmt>(row[r], k)];
        }
    if (rows < Rows)  // the missing rows read the last row above; zero them
        for (std::size_t k = k0; k < k1; ++k)
            for (std::size_t r = rows; r < Rows; ++r) dst[(k - k0) * Rows + r] = 0.0f;
    const std::size_t br = q.layout.block_rows, bc = q.layout.block_cols;
    for (std::size_t s = s0; s < s1; ++s)
        for (std::size_t r = 0; r < Rows; ++r)
            scales[(s - s0) * Rows + r] = r < rows ? q.scale((i0 + r) / br, (s * g) / bc) : 0.0f;
}

/// The host backend's work split with one register tile (A task: 16 A panels x 128 columns of D, 48
/// KB of accumulators with the AVX-512 tile. A chunk: whole segments of about 128 k, so that a chunk
/// of one B panel stays in L1 while the task's A panels stream past it) and its scratch, described
/// once for both the query (scaled_gemm_scratch_bytes) and the call. Two shapes of scratch, the
/// smaller chosen:
///   whole K: both operands decoded at once ((M + N) x K floats and their segment scales) and one
///     task's accumulators per thread;
///   K blocks: the operands decoded one chunk (about 128 k) at a time, and every task's
///     accumulators kept across the blocks (about M x N floats): far less when K is long (a weight
///     gradient's K is the tokens).
/// Each output element adds its segments' products in the same order either way: the same bits
/// (tests force each shape with host_gemm_k_blocks).
enum class host_gemm_k_blocks { smaller, whole, blocks };
template <class Tile>
struct host_gemm_plan {
    static constexpr std::size_t MR = Tile::mr, NR = Tile::nr;
    static constexpr std::size_t task_panels_a = 16, task_panels_b = std::max<std::size_t>(1, 128 / NR);
    static constexpr std::size_t chunk_k = 128, block_k = 128;
    std::size_t M, N, K, g, S, chunk_segments, a_panels, b_panels, tiles_m, tiles_n;
    std::size_t block_segments;  ///< segments decoded at once (S: the whole K)
    std::size_t pack_k;          ///< k columns a pack holds (K, or block_segments * g)
    float* a_pack = nullptr;     ///< a_panels x MR rows of pack_k decoded codes
    float* b_pack = nullptr;     ///< b_panels x NR rows of pack_k
    float* a_scales = nullptr;   ///< a_panels x MR rows of block_segments segment scales
    float* b_scales = nullptr;   ///< b_panels x NR rows of block_segments
    float* acc = nullptr;        ///< whole K: one task's accumulators per chunk; K blocks: every task's

    host_gemm_plan(scratch_carver& c, const host_executor& ex, std::size_t M_, std::size_t N_, std::size_t K_,
                   std::size_t a_block_cols, std::size_t b_block_cols, int promotion_interval,
                   host_gemm_k_blocks choice = host_gemm_k_blocks::smaller)
        : M(M_), N(N_), K(K_) {
        g = gemm_segment(static_cast<std::size_t>(promotion_interval), a_block_cols, b_block_cols, K);
        S = K == 0 ? 0 : (K + g - 1) / g;
        chunk_segments = std::max<std::size_t>(1, chunk_k / g);
        a_panels = (M + MR - 1) / MR;
        b_panels = (N + NR - 1) / NR;
        tiles_m = (a_panels + task_panels_a - 1) / task_panels_a;
        tiles_n = (b_panels + task_panels_b - 1) / task_panels_b;
        const std::size_t rows = a_panels * MR + b_panels * NR, tasks = tiles_m * tiles_n;
        const std::size_t blocked_segments = std::max<std::size_t>(1, block_k / g);
        const std::size_t whole = rows * (K + S) + parallel_chunks(ex, tasks, 1) * task_acc_floats();
        const std::size_t blocked = rows * (blocked_segments * g + blocked_segments) + tasks * task_acc_floats();
        const bool block =
            choice == host_gemm_k_blocks::smaller ? blocked < whole : choice == host_gemm_k_blocks::blocks;
        block_segments = blocked_segments < S && block ? blocked_segments : S;
        pack_k = block_segments == S ? K : block_segments * g;
        a_pack = c.take<float>(a_panels * MR * pack_k);
        b_pack = c.take<float>(b_panels * NR * pack_k);
        a_scales = c.take<float>(a_panels * MR * block_segments);
        b_scales = c.take<float>(b_panels * NR * block_segments);
        acc = c.take<float>((blocked_k() ? tasks : parallel_chunks(ex, tasks, 1)) * task_acc_floats());
    }
    bool blocked_k() const { return block_segments < S; }
    static constexpr std::size_t task_acc_floats() { return task_panels_a * MR * task_panels_b * NR; }
};

/// The host backend with one register tile: out(i, j) = epilogue(acc(i, j)) for D float, bf16, fp16.
template <class Tile, class RA, class RB, class CT, class DT>
void host_scaled_gemm_tiled(host_executor ex, const quantized_cref<RA>& A, const quantized_cref<RB>& B,
                            const matrix_ref<const CT>* C, const matrix_ref<DT>& D, const gemm_options& opt,
                            host_gemm_k_blocks k_blocks = host_gemm_k_blocks::smaller) {
    using plan_type = host_gemm_plan<Tile>;
    constexpr std::size_t MR = Tile::mr, NR = Tile::nr;
    constexpr std::size_t kTaskPanelsA = plan_type::task_panels_a, kTaskPanelsB = plan_type::task_panels_b;
    const std::size_t M = A.rows(), N = B.rows(), K = A.cols();
    scratch_carver sizing;
    (void)plan_type(sizing, ex, M, N, K, A.layout.block_cols, B.layout.block_cols, opt.promotion_interval, k_blocks);
    const host_scratch scratch(ex, sizing.bytes(), "octet::scaled_gemm");
    scratch_carver carver = scratch.carver();
    const plan_type plan(carver, ex, M, N, K, A.layout.block_cols, B.layout.block_cols, opt.promotion_interval,
                         k_blocks);
    const std::size_t g = plan.g, S = plan.S, chunk_segments = plan.chunk_segments;
    const std::size_t a_panels = plan.a_panels, b_panels = plan.b_panels;
    float* const a_pack = plan.a_pack;
    float* const b_pack = plan.b_pack;
    float* const a_scales = plan.a_scales;
    float* const b_scales = plan.b_scales;
    float table_a[256], table_b[256];
    for (int c = 0; c < 256; ++c) {
        table_a[c] = decode<typename RA::format>(static_cast<std::uint8_t>(c));
        table_b[c] = decode<typename RB::format>(static_cast<std::uint8_t>(c));
    }
    // Decodes segments [s0, s1) of every panel, k_len = min(K, s1 g) - s0 g columns each (the
    // panels' stride). Split by rows (A's then B's): a range packs the panels whose first row falls in it.
    const std::size_t a_rows = a_panels * MR, SP = plan.block_segments;
    const std::size_t pack_grain = std::max<std::size_t>(1, 16384 / std::max<std::size_t>(plan.pack_k, 1));
    auto pack = [&](std::size_t s0, std::size_t s1, std::size_t k_len) {
        parallel_for(ex, a_rows + b_panels * NR, pack_grain, [&](std::size_t u0, std::size_t u1) {
            for (std::size_t p = (u0 + MR - 1) / MR; p * MR < std::min(u1, a_rows); ++p)
                host_gemm_pack_panel<MR>(A, table_a, p, g, s0, s1, a_pack + p * MR * k_len, a_scales + p * MR * SP);
            for (std::size_t q = (std::max(u0, a_rows) - a_rows + NR - 1) / NR; a_rows + q * NR < u1; ++q)
                host_gemm_pack_panel<NR>(B, table_b, q, g, s0, s1, b_pack + q * NR * k_len, b_scales + q * NR * SP);
        });
    };
    const std::size_t tiles_m = plan.tiles_m, tiles_n = plan.tiles_n;
    // Adds the products of the packed segments [0, segments) (panels of k_len columns) into task t's
    // accumulators, in chunks of whole segments.
    auto accumulate = [&](std::size_t t, std::size_t k_len, std::size_t segments, float* acc) {
        const std::size_t pa0 = (t / tiles_n) * kTaskPanelsA, pb0 = (t % tiles_n) * kTaskPanelsB;
        const std::size_t pa = std::min(kTaskPanelsA, a_panels - pa0), pb = std::min(kTaskPanelsB, b_panels - pb0);
        for (std::size_t s0 = 0; s0 < segments; s0 += chunk_segments)
            run_host_gemm_kernel<Tile>(a_pack + pa0 * MR * k_len, a_scales + pa0 * MR * SP, pa,
                                       b_pack + pb0 * NR * k_len, b_scales + pb0 * NR * SP, pb, k_len, SP, g, s0,
                                       std::min(segments, s0 + chunk_segments), acc);
    };
    const float alpha = opt.alpha, beta = opt.beta;
    const float* bias = opt.bias.empty() ? nullptr : opt.bias.data();
    // Epilogue of task t: v = alpha * acc, + beta * C, + bias, each rounded (no fused multiply-add),
    // then one rounding to D's type.
    auto finish = [&](std::size_t t, const float* acc) {
        const std::size_t pa0 = (t / tiles_n) * kTaskPanelsA, pb0 = (t % tiles_n) * kTaskPanelsB;
        const std::size_t pa = std::min(kTaskPanelsA, a_panels - pa0), pb = std::min(kTaskPanelsB, b_panels - pb0);
        const std::size_t i0 = pa0 * MR, i1 = std::min(M, (pa0 + pa) * MR);
        for (std::size_t i = i0; i < i1; ++i)
            for (std::size_t jb = 0; jb < pb; ++jb) {
                const float* a_row = acc + (jb * pa + (i - i0) / MR) * MR * NR + (i - i0) % MR * NR;
                const std::size_t j0 = (pb0 + jb) * NR, j1 = std::min(N, j0 + NR);
                if constexpr (std::is_same_v<DT, float>) {
                    if (!C && !bias && D.order == storage_order::row_major) {  // a loop that vectorizes
                        float* d = &D(i, j0);
                        for (std::size_t j = j0; j < j1; ++j) d[j - j0] = alpha * a_row[j - j0];
                        continue;
                    }
                }
                for (std::size_t j = j0; j < j1; ++j) {
                    float v = alpha * a_row[j - j0];
                    host_unfused(v);
                    if (C) {
                        float c = beta * load_as_float((*C)(i, j));
                        host_unfused(c);
                        v += c;
                    }
                    if (bias) v += bias[j];
                    D(i, j) = store_from_float<DT>(v);
                }
            }
    };
    constexpr std::size_t task_acc = plan_type::task_acc_floats();
    if (!plan.blocked_k()) {  // the whole K decoded once; each task accumulates and finishes in one go
        pack(0, S, K);
        parallel_for_chunks(ex, tiles_m * tiles_n, 1, [&](std::size_t chunk, std::size_t t0, std::size_t t1) {
            float* const acc = plan.acc + chunk * task_acc;
            for (std::size_t t = t0; t < t1; ++t) {
                std::fill(acc, acc + task_acc, 0.0f);
                accumulate(t, K, S, acc);
                finish(t, acc);
            }
        });
        return;
    }
    // K blocks: every task's accumulators live across the blocks.
    std::fill(plan.acc, plan.acc + tiles_m * tiles_n * task_acc, 0.0f);
    for (std::size_t s0 = 0; s0 < S; s0 += SP) {
        const std::size_t s1 = std::min(S, s0 + SP), k_len = std::min(K, s1 * g) - s0 * g;
        pack(s0, s1, k_len);
        parallel_for(ex, tiles_m * tiles_n, 1, [&](std::size_t t0, std::size_t t1) {
            for (std::size_t t = t0; t < t1; ++t) accumulate(t, k_len, s1 - s0, plan.acc + t * task_acc);
        });
    }
    parallel_for(ex, tiles_m * tiles_n, 1, [&](std::size_t t0, std::size_t t1) {
        for (std::size_t t = t0; t < t1; ++t) finish(t, plan.acc + t * task_acc);
    });
}

/// The host backend: the variant of `isa` (host_gemm_isa_supported; tests pass each one).
template <class RA, class RB, class CT, class DT>
void host_scaled_gemm(host_executor ex, const quantized_cref<RA>& A, const quantized_cref<RB>& B,
                      const matrix_ref<const CT>* C, const matrix_ref<DT>& D, const gemm_options& opt,
                      simd_isa isa = host_gemm_isa(), host_gemm_k_blocks k_blocks = host_gemm_k_blocks::smaller) {
    if (A.rows() == 0 || B.rows() == 0) return;
#if OCTET_ISA_DISPATCH
    if (isa == simd_isa::avx512) return host_scaled_gemm_tiled<host_gemm_tile_avx512>(ex, A, B, C, D, opt, k_blocks);
    if (isa == simd_isa::avx2) return host_scaled_gemm_tiled<host_gemm_tile_avx2>(ex, A, B, C, D, opt, k_blocks);
#else
    (void)isa;
#endif
    host_scaled_gemm_tiled<host_gemm_tile_portable>(ex, A, B, C, D, opt, k_blocks);
}

/// The scratch host_scaled_gemm takes with the tile `isa` selects (host_gemm_plan).
inline std::size_t host_gemm_scratch_bytes(const host_executor& ex, std::size_t M, std::size_t N, std::size_t K,
                                           std::size_t a_block_cols, std::size_t b_block_cols, int promotion_interval,
                                           simd_isa isa = host_gemm_isa()) {
    if (M == 0 || N == 0) return 0;
    scratch_carver c;
#if OCTET_ISA_DISPATCH
    if (isa == simd_isa::avx512) {
        (void)host_gemm_plan<host_gemm_tile_avx512>(c, ex, M, N, K, a_block_cols, b_block_cols, promotion_interval);
        return c.bytes();
    }
    if (isa == simd_isa::avx2) {
        (void)host_gemm_plan<host_gemm_tile_avx2>(c, ex, M, N, K, a_block_cols, b_block_cols, promotion_interval);
        return c.bytes();
    }
#else
    (void)isa;
#endif
    (void)host_gemm_plan<host_gemm_tile_portable>(c, ex, M, N, K, a_block_cols, b_block_cols, promotion_interval);
    return c.bytes();
}

/// The executor half of octet::scaled_gemm, specialized per executor: `element<T>` maps the caller's
/// element type to octet's (the stream's also takes CUDA's __nv_bfloat16 / __half); run(ex, A, B, C,
/// D, opt) with the arguments already checked by the entry (C null when absent); run_quantized(ex,
/// A, B, D, opt, device_amax) for a quantized D. The host's is here, the stream's in scaled_gemm.cuh.
template <class Executor>
struct gemm_executor_backend;

template <>
struct gemm_executor_backend<host_executor> {
    template <class T>
    using element = T;

    template <class RA, class RB, class CT, class DT>
    static gemm_result run(host_executor ex, const quantized_cref<RA>& A, const quantized_cref<RB>& B,
                           const matrix_ref<const CT>* C, const matrix_ref<DT>& D, const gemm_options& opt) {
        check_host_backend(opt);
        host_scaled_gemm<RA, RB, CT, DT>(ex, A, B, C, D, opt);
        gemm_result result;
        result.backend = gemm_backend::host;
        return result;
    }

    /// The float result in a host vector, then quantized with RD; its amax is returned.
    template <class RA, class RB, class RD>
    static gemm_result run_quantized(host_executor ex, const quantized_cref<RA>& A, const quantized_cref<RB>& B,
                                     const quantized_ref<RD>& D, const gemm_options& opt, float* device_amax) {
        OCTET_REQUIRE(device_amax == nullptr, "octet::scaled_gemm", "device_amax",
                      "is for a stream executor; on the host the amax is returned in gemm_result::amax");
        const std::size_t M = A.rows(), N = B.rows();
        const host_scratch result_scratch(ex, M * N * sizeof(float), "octet::scaled_gemm");
        scratch_carver c = result_scratch.carver();
        float* const tmp = c.take<float>(M * N);
        gemm_result r = run<RA, RB, float, float>(ex, A, B, nullptr, matrix_ref<float>(tmp, M, N), opt);
        r.amax = quantize<RD>(ex, matrix_ref<const float>(tmp, M, N), D).amax;
        return r;
    }
};

/// The entry of the matrix-output forms: element types, the checks every backend shares, then the
/// executor's backend.
template <class Executor, class RA, class BA, class RB, class BB, class CT, class DT>
gemm_result scaled_gemm_entry(const Executor& ex, const quantized_ref<RA, BA>& A, const quantized_ref<RB, BB>& B,
                              const matrix_ref<CT>* C_in, const matrix_ref<DT>& D_in, const gemm_options& opt) {
    using backend = gemm_executor_backend<Executor>;
    using D0 = typename backend::template element<DT>;
    using C0 = typename backend::template element<std::remove_const_t<CT>>;
    static_assert(is_gemm_output_v<D0>,
                  "octet::scaled_gemm: D must be float, octet::bf16 or octet::fp16 (or a quantized_ref)");
    static_assert(is_gemm_output_v<C0>, "octet::scaled_gemm: C must be float, octet::bf16 or octet::fp16");
    const matrix_ref<D0> D(reinterpret_cast<D0*>(D_in.data), D_in.rows, D_in.cols, D_in.ld, D_in.order);
    std::optional<matrix_ref<const C0>> C;
    if (C_in) C.emplace(reinterpret_cast<const C0*>(C_in->data), C_in->rows, C_in->cols, C_in->ld, C_in->order);
    check_gemm_args(A, B, C ? &*C : nullptr, D, opt, C_in != nullptr);
    return backend::template run<RA, RB, C0, D0>(ex, A, B, C ? &*C : nullptr, D, opt);
}

}  // namespace detail

// ---- declared and documented in octet/gemm/scaled_gemm.hpp --------------------------------------

template <class Recipe>
std::string recipe_description() {
    using G = typename Recipe::granularity;
    std::string s = format_name<typename Recipe::format>();
    auto ext = [](std::size_t b) { return b == full ? std::string("full") : std::to_string(b); };
    if (G::rows == full && G::cols == full)
        s += ", per-tensor";
    else if (G::rows == 1 && G::cols == full)
        s += ", per-row";
    else if (G::rows == full && G::cols == 1)
        s += ", per-column";
    else
        s += ", " + ext(G::rows) + "x" + ext(G::cols) + " blocks";
    using St = typename Recipe::scale_storage_type;
    s += std::is_same_v<St, scale_storage::f32>     ? ", f32 scales"
         : std::is_same_v<St, scale_storage::ue8m0> ? ", ue8m0 scales"
                                                    : ", two-level e4m3 scales";
    return s;
}

template <class RA, class RB>
std::string gemm_backend_support(gemm_backend backend, std::size_t K, const gemm_options& opt) {
    using TA = gemm_operand_traits<RA>;
    using TB = gemm_operand_traits<RB>;
    const quant_layout la = quant_layout_of<RA>::make(1, K), lb = quant_layout_of<RB>::make(1, K);
    const std::size_t P = static_cast<std::size_t>(std::max(opt.promotion_interval, 1));
    switch (backend) {
        case gemm_backend::automatic:
        case gemm_backend::host:
            return "";
        case gemm_backend::sm89_mma:
            if (!TA::tensor_core_fp8 || !TB::tensor_core_fp8)
                return "it multiplies E4M3/E5M2 codes only (mma.sync FP8)";
            if (!detail::boundaries_on(la.block_cols, 32, K) || !detail::boundaries_on(lb.block_cols, 32, K))
                return "scale blocks along K must be multiples of 32 (one mma k-step) or span K";
            if (!detail::boundaries_on(P, 32, K)) return "options.promotion_interval must be a multiple of 32";
            return "";
        case gemm_backend::sm90_wgmma:
            if (!TA::tensor_core_fp8 || !TB::tensor_core_fp8) return "it multiplies E4M3/E5M2 codes only (wgmma FP8)";
            if (!TA::f32_scales || !TB::f32_scales)
                return "it reads float scales only (use sm89_mma for MX's ue8m0 scales)";
            if (!detail::boundaries_on(la.block_cols, 128, K) || !detail::boundaries_on(lb.block_cols, 128, K))
                return "scale blocks along K must be multiples of 128 or span K (it promotes every 128)";
            if (!detail::boundaries_on(P, 128, K)) return "options.promotion_interval must be a multiple of 128";
            if (opt.tile == gemm_tile::m128n192 && !detail::sm90_wide_serves<RB>())
                return std::string("options.tile is m128n192") + detail::sm90_wide_refusal;
            return "";
        case gemm_backend::cublaslt: {
            if (TA::nvfp4_like && TB::nvfp4_like) return "";  // dequantizing path (no FP4 tensor cores on Hopper)
            if (!TA::tensor_core_fp8 || !TB::tensor_core_fp8)
                return "it takes E4M3/E5M2 operands (and NVFP4 x NVFP4 through its dequantizing path)";
            if (std::is_same_v<typename RA::format, e5m2> && std::is_same_v<typename RB::format, e5m2>)
                return "cuBLASLt has no E5M2 x E5M2 FP8 GEMM";
            if (!TA::f32_scales || !TB::f32_scales)
                return "cuBLASLt's MX modes (VEC32_UE8M0) need Blackwell; octet does not map them";
            const bool ok = (TA::per_tensor && TB::per_tensor) || (TA::per_row && TB::per_row) ||
                            (TA::vec128 && TB::vec128) || (TA::vec128 && TB::blk128) || (TA::blk128 && TB::vec128);
            if (!ok)
                return "its scale modes pair as tensor x tensor, row x row (OUTER_VEC_32F), 1x128 x 1x128, 1x128 x "
                       "128x128 or "
                       "128x128 x 1x128 (VEC128_32F, BLK128x128_32F)";
            if (K % 16 != 0) return "cuBLASLt's FP8 GEMM needs K to be a multiple of 16";
            return "";
        }
    }
    return "unknown backend";
}

template <class RA, class RB>
std::string gemm_backends_serving(std::size_t K, const gemm_options& opt) {
    std::string s;
    for (gemm_backend b :
         {gemm_backend::host, gemm_backend::sm89_mma, gemm_backend::sm90_wgmma, gemm_backend::cublaslt})
        if (gemm_backend_support<RA, RB>(b, K, opt).empty())
            s += (s.empty() ? "" : ", ") + std::string(backend_name(b));
    return s;
}

template <class RA, class RB, class Out>
gemm_numerics gemm_numerics_of(gemm_backend backend, std::size_t K, const gemm_options& opt) {
    const quant_layout la = quant_layout_of<RA>::make(1, K), lb = quant_layout_of<RB>::make(1, K);
    const std::size_t P = static_cast<std::size_t>(std::max(opt.promotion_interval, 1));
    gemm_numerics n;
    n.output_unit = detail::output_unit<Out>();
    std::size_t L = detail::gemm_segment(P, la.block_cols, lb.block_cols, K);
    bool tensor_cores = true;
    switch (backend) {
        case gemm_backend::sm90_wgmma:
            L = std::min<std::size_t>(L, 128);
            break;
        case gemm_backend::sm89_mma:
            break;
        case gemm_backend::cublaslt:
            if (gemm_operand_traits<RA>::nvfp4_like)
                L = K;  // BF16 GEMM on dequantized values, promotion unknown
            else
                L = (gemm_operand_traits<RA>::per_tensor || gemm_operand_traits<RA>::per_row)
                        ? K
                        : std::min<std::size_t>(K, 128);
            break;
        default:
            tensor_cores = false;
            break;
    }
    L = std::max<std::size_t>(1, std::min(L, std::max<std::size_t>(K, 1)));
    n.segment = L;
    n.segments = (K + L - 1) / L;
    const double S = static_cast<double>(n.segments);
    if (tensor_cores)
        n.accumulation = std::ceil(static_cast<double>(L) / 32.0) * std::ldexp(1.0, -12) + detail::gamma_n(S + 1);
    else
        n.accumulation = detail::gamma_n(static_cast<double>(L) + S);
    n.underflow = (S + 2.0) * static_cast<double>(L) * RA::format::max_finite_d * RB::format::max_finite_d *
                      std::ldexp(1.0, -150) +
                  std::ldexp(1.0, -148);
    n.output_tiny = detail::output_tiny<Out>();
    return n;
}

inline double gemm_error_bound(const gemm_numerics& n, double alpha, double abs_products, double abs_beta_c,
                               double abs_bias, double abs_exact) {
    const double a = std::fabs(alpha);
    const double acc_err = a * n.accumulation * abs_products;
    const double epi = detail::gamma_n(3) * (a * (1.0 + n.accumulation) * abs_products + abs_beta_c + abs_bias);
    const double before_rounding = acc_err + epi + a * n.underflow;
    return before_rounding + n.output_unit * (abs_exact + before_rounding) + n.output_tiny;
}

template <class RA, class BA, class RB, class BB, class DT, class Executor>
gemm_result scaled_gemm(const Executor& ex, quantized_ref<RA, BA> A, quantized_ref<RB, BB> B, matrix_ref<DT> D,
                        const gemm_options& opt) {
    return detail::scaled_gemm_entry<Executor>(ex, A, B, static_cast<const matrix_ref<const float>*>(nullptr), D, opt);
}

template <class RA, class BA, class RB, class BB, class CT, class DT, class Executor>
gemm_result scaled_gemm(const Executor& ex, quantized_ref<RA, BA> A, quantized_ref<RB, BB> B, matrix_ref<CT> C,
                        matrix_ref<DT> D, const gemm_options& opt) {
    return detail::scaled_gemm_entry<Executor>(ex, A, B, &C, D, opt);
}

template <class RA, class BA, class RB, class BB, class DT>
std::size_t scaled_gemm_scratch_bytes(const host_executor& ex, quantized_ref<RA, BA> A, quantized_ref<RB, BB> B,
                                      matrix_ref<DT> D, const gemm_options& opt) {
    (void)D;
    return detail::host_gemm_scratch_bytes(ex, A.layout.rows, B.layout.rows, A.layout.cols, A.layout.block_cols,
                                           B.layout.block_cols, opt.promotion_interval);
}

template <class RA, class BA, class RB, class BB, class RD>
std::size_t scaled_gemm_scratch_bytes(const host_executor& ex, quantized_ref<RA, BA> A, quantized_ref<RB, BB> B,
                                      quantized_ref<RD> D, const gemm_options& opt) {
    const std::size_t M = A.layout.rows, N = B.layout.rows;
    const matrix_ref<const float> result(nullptr, M, N);
    return M * N * sizeof(float) + std::max(scaled_gemm_scratch_bytes(ex, A, B, matrix_ref<float>(nullptr, M, N), opt),
                                            quantize_scratch_bytes(ex, result, D));
}

template <class RA, class BA, class RB, class BB, class RD, class Executor>
gemm_result scaled_gemm(const Executor& ex, quantized_ref<RA, BA> A, quantized_ref<RB, BB> B, quantized_ref<RD> D,
                        const gemm_options& opt, float* device_amax) {
    detail::check_gemm_quantized_d(A, B, D, opt);  // before any work: a bad D is reported here
    return detail::gemm_executor_backend<Executor>::template run_quantized<RA, RB, RD>(ex, A, B, D, opt, device_amax);
}

}  // namespace octet
