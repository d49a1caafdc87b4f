// octet/gemm/detail/grouped_common.cuh: what the grouped GEMM kernels (grouped_sm90.cuh, grouped_sm89.cuh)
// share: the host's description of one group of a launch, the number of groups one launch takes, the
// device lookup of the group that owns a tile row, and the kernel that zeroes the rows of D no group
// computes (a masked group's padding, a k-grouped expert without tokens).
//
// The tile scheduler of both kernels walks the m tiles of all groups of a launch as one sequence: group g
// owns the m tiles [tile_m0[g], tile_m0[g + 1]) (tile_m0 is the prefix sum of ceil(rows_g / BM); a group
// of zero rows owns none), and a tile row is mapped to its group by a scan of that prefix sum (at most
// grouped_launch_groups entries, in the kernel's parameters). Within its group a tile's rows are the
// group's rows m0 .. m0 + BM; rows at or past the group's end are computed on whatever the operand's
// memory holds there (the next group's rows, or TMA's zero fill) and never stored.
#pragma once

#include <cstddef>
#include <cstdint>

#include "octet/gemm/detail/device_common.cuh"

namespace octet {
namespace detail {

/// Groups per kernel launch (their per-group facts travel in the kernel's parameters: for sm90, one TMA
/// map of B per group, 128 bytes each). A call with more groups launches one kernel per 32 groups.
inline constexpr std::uint32_t grouped_launch_groups = 32;

/// One group of a grouped launch, as the host launchers see it: its operands (device pointers, checked
/// by the entry), where its A rows start in A's block seen as one matrix of A's row_bytes rows (the sm90
/// kernel's one TMA map over A), and where its rows of D start.
template <class RA, class RB>
struct grouped_device_group {
    quantized_cref<RA> a;  ///< rows x K (rows may be 0)
    quantized_cref<RB> b;  ///< N x K
    std::size_t a_row = 0, d_row = 0;
};

/// The group that owns global m tile `mt` (tile_m0: G + 1 prefix sums, tile_m0[G] > mt). Groups
/// without tiles are skipped.
template <class Array>
OCTET_HD std::uint32_t grouped_group_of(const Array& tile_m0, std::uint32_t mt) {
    std::uint32_t g = 0;
    while (mt >= tile_m0[g + 1]) ++g;
    return g;
}

/// The masked GEMM's padding rows: rows [g capacity + valid[g], (g + 1) capacity) of D set to 0, for the
/// groups of one launch (blockIdx.y = group).
template <class DT>
struct grouped_zero_params {
    DT* d = nullptr;
    std::size_t ld = 0;
    bool col_major = false;
    std::uint32_t N = 0, capacity = 0, first_group = 0;
    std::uint32_t valid[grouped_launch_groups];
};

template <class DT>
OCTET_KERNEL void grouped_zero_rows_kernel(const __grid_constant__ grouped_zero_params<DT> p) {
    const std::uint32_t g = blockIdx.y, v = p.valid[g], rows = p.capacity - v;
    const std::size_t count = static_cast<std::size_t>(rows) * p.N;
    const std::size_t row0 = static_cast<std::size_t>(p.first_group + g) * p.capacity + v;
    for (std::size_t e = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
         e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        // along D's storage: consecutive threads write consecutive addresses in either order
        const std::size_t r = row0 + (p.col_major ? e % rows : e / p.N), c = p.col_major ? e / rows : e % p.N;
        p.d[p.col_major ? c * p.ld + r : r * p.ld + c] = store_from_float<DT>(0.0f);
    }
}

/// rows / tile, rounded up.
constexpr std::uint32_t grouped_tiles(std::size_t rows, std::size_t tile) {
    return static_cast<std::uint32_t>((rows + tile - 1) / tile);
}

}  // namespace detail
}  // namespace octet
