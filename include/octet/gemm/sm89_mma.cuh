// octet/gemm/sm89_mma.cuh: the simple, robust FP8 GEMM kernel on mma.sync m16n8k32 (sm_89 and
// later; it also runs on Hopper). It serves every FP8 recipe pair whose scale blocks along K are
// multiples of 32 (tensor, row, 1x128, 128x128, MX 1x32 with UE8M0 scales, mixed E4M3/E5M2), and
// any promotion interval that is a multiple of 32. Used directly (gemm_backend::sm89_mma) or as the
// fallback when the sm_90a kernel does not apply.
//
// Structure (one CTA = 256 threads = 8 warps, a 128 x 128 tile of D, K in steps of 64):
//   cp.async 16-byte copies (zero-filled past M, N and K, so ragged shapes and M = 1 need no padded
//   input) into a 4-stage shared-memory ring with rows padded to 80 bytes (no bank conflicts on the
//   fragment loads); each warp computes a 64 x 32 sub-tile with 4 x 4 mma.sync per 32-wide k-step
//   into a tensor-core accumulator `frag`, which is promoted every g elements (the segment of the
//   contract in scaled_gemm.hpp): acc += frag * (sA * sB) with the scales of each of the thread's
//   rows and columns read through the quantized layout (L1-cached), then frag = 0.
#pragma once

#include "octet/cuda/shared_memory.cuh"  // OCTET_DYNAMIC_SHARED_ALIGNED, octet::shared_ptr_t
#include "octet/gemm/detail/device_common.cuh"

namespace octet {
namespace detail {

constexpr int kSm89BM = 128, kSm89BN = 128, kSm89BK = 64, kSm89Stages = 4, kSm89Threads = 256;
constexpr int kSm89Pitch = kSm89BK + 16;  // bytes per shared-memory row
constexpr int kSm89StageBytes = (kSm89BM + kSm89BN) * kSm89Pitch;
constexpr int kSm89SmemBytes = kSm89Stages * kSm89StageBytes;

template <class RA, class RB, class CT, class DT>
struct sm89_params {
    const std::uint8_t* a;
    const std::uint8_t* b;
    std::size_t a_row_bytes, b_row_bytes;
    std::uint32_t M, N, K;
    std::uint32_t segment;  ///< promote every `segment` K elements (a multiple of 32, or >= K)
    device_scales<RA> sa;
    device_scales<RB> sb;
    device_epilogue<CT, DT> epi;
};

/// One CTA's 128 x 128 tile, rows m0.. of p's A and columns n0.. (rows of p's B), into p's epilogue
/// (the dense kernel's body; the grouped kernel's, detail/grouped_sm89.cuh, with Grouped: rows at or
/// past p.M are not stored, and row r of the tile's A goes to row d_row0 + r of the epilogue's D).
template <bool Grouped, class RA, class RB, class CT, class DT>
OCTET_DEVICE void sm89_gemm_tile(const sm89_params<RA, RB, CT, DT>& p, shared_ptr_t<std::uint8_t> gemm89_smem,
                                 std::uint32_t m0, std::uint32_t n0, std::uint32_t d_row0) {
#if OCTET_ARCH_AT_LEAST(890)
    using FA = typename RA::format;
    using FB = typename RB::format;
    const std::uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const std::uint32_t wm = warp / 4, wn = warp % 4;  // 2 x 4 warps, 64 x 32 each
    const std::uint32_t g = lane / 4, t = lane % 4;
    const std::uint32_t M = p.M, N = p.N, K = p.K;

    // (STAGES, BM, PITCH) then (STAGES, BN, PITCH)
    const shared_ptr_t<std::uint8_t> As = gemm89_smem;
    const shared_ptr_t<std::uint8_t> Bs = gemm89_smem + kSm89Stages * kSm89BM * kSm89Pitch;

    auto load_stage = [&](std::uint32_t stage, std::uint32_t kt) {
        const std::uint32_t k0 = kt * kSm89BK;
        OCTET_UNROLL
        for (int i = 0; i < 2; ++i) {
            const std::uint32_t c = tid + i * kSm89Threads;  // 512 16-byte chunks per operand tile
            const std::uint32_t row = c / 4, kc = (c % 4) * 16, k = k0 + kc;
            const std::uint32_t kbytes = k < K ? min(16u, K - k) : 0u;
            const std::uint32_t ga = m0 + row, gb = n0 + row;
            const std::uint8_t* srca = ga < M && kbytes ? p.a + static_cast<std::size_t>(ga) * p.a_row_bytes + k : p.a;
            const std::uint8_t* srcb = gb < N && kbytes ? p.b + static_cast<std::size_t>(gb) * p.b_row_bytes + k : p.b;
            ptx::cp_async_cg_16(ptx::shared_address(As + (stage * kSm89BM + row) * kSm89Pitch + kc), srca,
                                ga < M ? kbytes : 0u);
            ptx::cp_async_cg_16(ptx::shared_address(Bs + (stage * kSm89BN + row) * kSm89Pitch + kc), srcb,
                                gb < N ? kbytes : 0u);
        }
    };

    // The scale-grid rows of this thread's 8 rows of A and 8 rows of B (= columns of D), clamped
    // into range (out-of-range rows multiply zeros and are never stored).
    std::uint32_t a_blk[8], b_blk[8];
    OCTET_UNROLL
    for (int x = 0; x < 8; ++x) {
        const std::uint32_t r = m0 + wm * 64 + (x / 2) * 16 + g + (x % 2) * 8;
        const std::uint32_t n = n0 + wn * 32 + (x / 2) * 8 + t * 2 + (x % 2);
        a_blk[x] = min(r, M - 1) / p.sa.block_rows;
        b_blk[x] = min(n, N - 1) / p.sb.block_rows;
    }
    const float tsa = p.sa.load_tensor_scale(), tsb = p.sb.load_tensor_scale();

    float acc[4][4][4], frag[4][4][4];
    OCTET_UNROLL
    for (int i = 0; i < 4; ++i) OCTET_UNROLL
    for (int j = 0; j < 4; ++j) OCTET_UNROLL
    for (int r = 0; r < 4; ++r) acc[i][j][r] = frag[i][j][r] = 0.0f;

    auto promote = [&](std::uint32_t seg_k0) {
        const std::uint32_t ka = seg_k0 / p.sa.block_cols, kb = seg_k0 / p.sb.block_cols;
        float fa[8], fb[8];
        OCTET_UNROLL
        for (int x = 0; x < 8; ++x) {
            fa[x] = p.sa.value(a_blk[x], ka, tsa);
            fb[x] = p.sb.value(b_blk[x], kb, tsb);
        }
        OCTET_UNROLL
        for (int i = 0; i < 4; ++i) OCTET_UNROLL
        for (int j = 0; j < 4; ++j) OCTET_UNROLL
        for (int r = 0; r < 4; ++r) {
            const float s = fa[i * 2 + r / 2] * fb[j * 2 + r % 2];
            acc[i][j][r] += frag[i][j][r] * s;
            frag[i][j][r] = 0.0f;
        }
    };

    const std::uint32_t KT = (K + kSm89BK - 1) / kSm89BK;
    OCTET_UNROLL
    for (int s = 0; s < kSm89Stages - 1; ++s) {
        if (static_cast<std::uint32_t>(s) < KT) load_stage(s, s);
        ptx::cp_async_commit_group();
    }
    std::uint32_t seg_k0 = 0;
    for (std::uint32_t kt = 0; kt < KT; ++kt) {
        ptx::cp_async_wait_group<kSm89Stages - 2>();
        __syncthreads();  // stage kt is in shared memory, and every warp is done with stage kt - 1
        const std::uint32_t next = kt + kSm89Stages - 1;
        if (next < KT) load_stage(next % kSm89Stages, next);
        ptx::cp_async_commit_group();

        const shared_ptr_t<const std::uint8_t> as = As + (kt % kSm89Stages) * kSm89BM * kSm89Pitch;
        const shared_ptr_t<const std::uint8_t> bs = Bs + (kt % kSm89Stages) * kSm89BN * kSm89Pitch;
        OCTET_UNROLL
        for (int ks = 0; ks < kSm89BK / 32; ++ks) {
            const std::uint32_t kglob = kt * kSm89BK + ks * 32;
            if (kglob >= K) break;
            std::uint32_t a[4][4], b[4][2];
            OCTET_UNROLL
            for (int i = 0; i < 4; ++i) {
                const shared_ptr_t<const std::uint8_t> r0 = as + (wm * 64 + i * 16 + g) * kSm89Pitch + ks * 32 + t * 4;
                a[i][0] = *shared_cast<const std::uint32_t>(r0);
                a[i][1] = *shared_cast<const std::uint32_t>(r0 + 8 * kSm89Pitch);
                a[i][2] = *shared_cast<const std::uint32_t>(r0 + 16);
                a[i][3] = *shared_cast<const std::uint32_t>(r0 + 8 * kSm89Pitch + 16);
            }
            OCTET_UNROLL
            for (int j = 0; j < 4; ++j) {
                const shared_ptr_t<const std::uint8_t> c0 = bs + (wn * 32 + j * 8 + g) * kSm89Pitch + ks * 32 + t * 4;
                b[j][0] = *shared_cast<const std::uint32_t>(c0);
                b[j][1] = *shared_cast<const std::uint32_t>(c0 + 16);
            }
            OCTET_UNROLL
            for (int i = 0; i < 4; ++i) OCTET_UNROLL
            for (int j = 0; j < 4; ++j) ptx::mma_m16n8k32_acc<FA, FB>(frag[i][j], a[i], b[j]);
            const std::uint32_t kend = kglob + 32;
            if (kend - seg_k0 >= p.segment || kend >= K) {
                promote(seg_k0);
                seg_k0 = kend;
            }
        }
    }
    ptx::cp_async_wait_group<0>();

    OCTET_UNROLL
    for (int i = 0; i < 4; ++i) OCTET_UNROLL
    for (int j = 0; j < 4; ++j) OCTET_UNROLL
    for (int h = 0; h < 2; ++h) {
        const std::uint32_t r = m0 + wm * 64 + i * 16 + g + h * 8;
        const std::uint32_t n = n0 + wn * 32 + j * 8 + t * 2;
        if constexpr (Grouped) {
            if (r < M) p.epi.store2(d_row0 + r, n, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        } else {
            p.epi.store2(r, n, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        }
    }
#else
    (void)p, (void)gemm89_smem, (void)m0, (void)n0, (void)d_row0;
#endif
}

template <class RA, class RB, class CT, class DT>
OCTET_KERNEL void __launch_bounds__(kSm89Threads)
    sm89_gemm_kernel(const __grid_constant__ sm89_params<RA, RB, CT, DT> p) {
#if OCTET_ARCH_AT_LEAST(890)
    OCTET_DYNAMIC_SHARED_ALIGNED(std::uint8_t, gemm89_smem, 16);
    sm89_gemm_tile<false>(p, gemm89_smem, blockIdx.y * kSm89BM, blockIdx.x * kSm89BN, 0u);
#endif
}

/// Its sm_89+ images carry the probe marker (device_common.cuh): never launched, only inspected.
OCTET_KERNEL void sm89_probe_kernel() {
#if OCTET_ARCH_AT_LEAST(890)
    OCTET_PROBE_MARKER();
#endif
}

/// Whether this binary holds the sm_89+ code of the kernel above for the running device (no
/// allocation, no launch, no synchronization).
inline bool sm89_available() {
    if (cuda::compute_capability() < 89) return false;
    static std::atomic<int> cache[64] = {};
    return image_has_marker(sm89_probe_kernel, cache);
}

template <class RA, class RB, class CT, class DT>
void launch_sm89(cudaStream_t stream, const quantized_cref<RA>& A, const quantized_cref<RB>& B,
                 const device_epilogue<CT, DT>& epi, std::size_t segment) {
    const std::size_t M = A.rows(), N = B.rows(), K = A.cols();
    if (M == 0 || N == 0) return;
    OCTET_REQUIRE((M + kSm89BM - 1) / kSm89BM <= 65535u, "octet::scaled_gemm", "A",
                  "has more than 8 million rows; split it");
    OCTET_REQUIRE(K < (1u << 31) && M < (1u << 31) && N < (1u << 31), "octet::scaled_gemm", "A/B",
                  "has a dimension of 2^31 or more");
    sm89_params<RA, RB, CT, DT> p{};
    p.a = A.data;
    p.b = B.data;
    p.a_row_bytes = A.layout.row_bytes;
    p.b_row_bytes = B.layout.row_bytes;
    p.M = static_cast<std::uint32_t>(M);
    p.N = static_cast<std::uint32_t>(N);
    p.K = static_cast<std::uint32_t>(K);
    p.segment = static_cast<std::uint32_t>(std::min<std::size_t>(segment, 1u << 30));
    p.sa = make_device_scales(A);
    p.sb = make_device_scales(B);
    p.epi = epi;
    auto kernel = sm89_gemm_kernel<RA, RB, CT, DT>;
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSm89SmemBytes));
    const dim3 grid(static_cast<unsigned>((N + kSm89BN - 1) / kSm89BN),
                    static_cast<unsigned>((M + kSm89BM - 1) / kSm89BM));
    cuda::launch("sm89_gemm_kernel", kernel, grid, dim3(kSm89Threads), kSm89SmemBytes, stream, p);
    OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace detail
}  // namespace octet
