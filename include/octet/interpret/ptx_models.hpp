// octet/interpret/ptx_models.hpp: the interpreter's models of the PTX instructions in octet/cuda/ptx.cuh,
// each written from the PTX ISA's description of the instruction (fragment layouts, operand order,
// rounding), independent of octet's kernels. Warp-collective instructions are warp_exchange calls
// (interpret.hpp); operands in shared memory are read and written by each lane through sptr, so the
// checks see them as that lane's accesses.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "octet/format/encode.hpp"
#include "octet/interpret/interpret.hpp"

namespace octet {
namespace interpret {
namespace model {

// ---- mma.sync ---------------------------------------------------------------------------------------

// ---- ldmatrix ---------------------------------------------------------------------------------------

// ---- cp.async ---------------------------------------------------------------------------------------

// ---- mbarrier ---------------------------------------------------------------------------------------

// ---- cp.async.bulk.tensor (TMA), prefetch.tensormap -------------------------------------------------

// ---- fence.proxy.async, setmaxnreg ------------------------------------------------------------------

// ---- wgmma ------------------------------------------------------------------------------------------
// wgmma.mma_async.sync.aligned.m64nNk32.f32.{e4m3,e5m2}.{e4m3,e5m2} with A and B in shared memory, and
// wgmma.fence / commit_group / wait_group, from the PTX ISA ("Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate Operation").
//
// Matrix descriptor (64 bits): start address (bits 0-13), leading dimension byte offset (LBO, 16-29),
// stride dimension byte offset (SBO, 32-45), each the byte value >> 4 (addresses 18 bits, 16-byte
// units); matrix base offset (49-51); swizzle mode (62-63: 0 none, 1 128-byte, 2 64-byte, 3 32-byte).
// Both operands are K-major here (the only layout for FP8): A is 64 x 32 bytes, B is N x 32 bytes
// (row = M or N index, one byte per K element), built of core matrices of 8 rows x 16 bytes.
//   no swizzle: core matrix (row / 8, k / 16) at start + (row / 8) SBO + (k / 16) LBO, its 8 rows of
//     16 bytes contiguous;
//   T-byte swizzle (T = 32, 64, 128): 8-row atoms (row / 8) SBO apart, rows T bytes apart within the
//     atom, and the 16-byte granule address bits 4.. XOR-ed with address bits 7.. (1, 2 or 3 bits for
//     T = 32, 64, 128): what TMA's SWIZZLE_{32,64,128}B writes. The XOR is on the shared address, so a
//     start address advanced by 32 bytes inside a 128-byte row (the next K step) selects the right
//     granules; LBO is unused (32 K bytes never leave a swizzle row). Atoms are taken to be aligned to
//     the pattern's repeat (base offset 0): a non-zero base offset is reported as not modelled.
// Accumulator fragment (f32, N / 2 registers per thread): thread t of the warpgroup, warp w = t / 32,
// lane l = t % 32, register i holds D[16 w + l / 4 + 8 ((i / 2) % 2)][8 (i / 4) + 2 (l % 4) + i % 2].
//
// Numerics: the FP8 operands are decoded with octet::decode, the 32 products (exact in double) summed in
// double, the input accumulator added in double and the result rounded once to float. The hardware
// accumulates with fewer bits and in its own order: results agree to about float precision, not bits.
//
// Shared-memory reads: each thread reads the 16-byte granules it contributes (A: granule (t / 2, t % 2);
// B: granules t, t + 128, ... of the N x 2 in row-major order) through interpret::shared_at, so the
// reads are checked (window bounds, uninitialised bytes, races with writes not ordered before the
// instruction) and attributed to it. They happen at mma_async, i.e. at issue: the ISA lets the hardware
// read until wait_group, and a write to the operands in between is undefined, but not reported here.
//
// Asynchrony, as far as the ISA makes it checkable:
//   - a result lands in the accumulator registers at the wgmma.wait_group that completes its
//     wgmma-group; until then the registers hold a NaN pattern (so an early read shows in the
//     results), and a write to them in between is a ptx_misuse report at the wait (the ISA: accessing
//     the accumulator registers before the wait is undefined). mma_asyncs chained on the same registers
//     (scale-d = 1, same shape) take the in-flight value as their input, as the ISA allows;
//   - mma_async on registers not in flight needs a wgmma.fence since the thread's last wait_group (the
//     ISA's register-ordering rule; the model takes a wait as the point where the thread takes its
//     registers back): otherwise a ptx_misuse report;
//   - all four instructions are .sync.aligned warpgroup collectives: threads of a warpgroup that reach
//     different ones are warp_sync reports, and so are descriptors, scale-d or wait counts that differ
//     across the warpgroup;
//   - results never waited for, mma_asyncs never committed, and register reads before the wait (other
//     than through the NaN pattern) are not reported.

namespace detail {
/// The poison the accumulator registers hold while an mma_async on them is in flight.
constexpr std::uint32_t wgmma_poison_bits = 0x7FC0DEADu;
inline float wgmma_poison() {
    float f;
    std::memcpy(&f, &wgmma_poison_bits, sizeof f);
    return f;
}
inline std::string hex64(std::uint64_t v) {
    static const char* digits = "0123456789abcdef";
    std::string s = "0x";
    bool started = false;
    for (int i = 15; i >= 0; --i) {
        const unsigned d = static_cast<unsigned>(v >> (4 * i)) & 15u;
        if (d || started || i == 0) {
            s += digits[d];
            started = true;
        }
    }
    return s;
}
}  // namespace detail

/// The shared address of the 16-byte granule holding K bytes 16 g .. 16 g + 15 of row `row` of the
/// K-major operand that descriptor `desc` describes (g = 0, 1).
inline std::uint32_t wgmma_granule_address(std::uint64_t desc, unsigned row, unsigned g) {
    const std::uint32_t start = static_cast<std::uint32_t>(desc & 0x3FFFu) << 4;
    const std::uint32_t lbo = static_cast<std::uint32_t>((desc >> 16) & 0x3FFFu) << 4;
    const std::uint32_t sbo = static_cast<std::uint32_t>((desc >> 32) & 0x3FFFu) << 4;
    const unsigned mode = static_cast<unsigned>(desc >> 62);
    if (mode == 0) return start + (row / 8) * sbo + g * lbo + (row % 8) * 16;
    const unsigned bits = mode == 1 ? 3 : mode == 2 ? 2 : 1;  // 128, 64, 32 bytes
    const std::uint32_t width = 16u << bits;
    const std::uint32_t linear = start + (row / 8) * sbo + (row % 8) * width + 16 * g;
    return linear ^ (((linear >> 7) & ((1u << bits) - 1)) << 4);
}

/// ptx::wgmma_descriptor::encode of an address or offset that is not a multiple of 16 (the ISA's
/// descriptor holds them in 16-byte units): a ptx_misuse report inside a launch, an error outside.
inline void wgmma_descriptor_misaligned(std::uint32_t start, std::uint32_t leading, std::uint32_t stride) {
    const std::string what = "wgmma matrix descriptor: start address " + detail::hex64(start) + ", leading offset " +
                             detail::hex64(leading) + ", stride offset " + detail::hex64(stride) +
                             ": the descriptor holds them in 16-byte units, and these are not 16-byte aligned";
    if (!interpret::detail::tl_machine || !interpret::detail::tl_machine->current) throw octet::error(what);
    model_report(check::ptx_misuse, "shared " + detail::hex64(start), what, false);
}

template <int N>
struct wgmma_operands {
    static constexpr int b_granules = (2 * N + 127) / 128;
    std::uint8_t a[16];
    std::uint8_t b[b_granules][16];
    std::uint64_t desc_a, desc_b;
    std::uint32_t scale_d;
    float d[N / 2];  // the input accumulator
};
template <int N>
struct wgmma_result {
    float d[N / 2];
};

/// wgmma.mma_async.sync.aligned.m64nNk32.f32.FA.FB d, desc_a, desc_b, scale_d, 1, 1 (no negation):
/// d = A B + (scale_d ? d : 0), landing in d at the wait_group that completes it.
template <int N, class FA, class FB>
void wgmma_m64nNk32(float* d, std::uint64_t desc_a, std::uint64_t desc_b, std::uint32_t scale_d, const char* name,
                    const char* file, int line) {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk32: N is a multiple of 8 up to 256");
    interpret::detail::wgmma_thread& st = interpret::detail::wgmma_state();
    const unsigned t = interpret::detail::running(name).current->tid % 128;
    wgmma_operands<N> mine{};
    mine.desc_a = desc_a;
    mine.desc_b = desc_b;
    mine.scale_d = scale_d;
    for (std::uint64_t desc : {desc_a, desc_b})
        if ((desc >> 49) & 7u)
            model_report(check::ptx_misuse, "",
                         std::string(name) + ": descriptor " + detail::hex64(desc) +
                             " has a non-zero matrix base offset, which the model does not implement",
                         true);
    // the input accumulator: the in-flight value of a chained mma_async, else the registers
    interpret::detail::wgmma_inflight* chained = nullptr;
    for (auto& e : st.inflight)
        if (e.d == d) chained = &e;
    if (chained) {
        for (int i = 0; i < N / 2; ++i) mine.d[i] = chained->value[static_cast<std::size_t>(i)];
    } else {
        if (!st.fenced)
            model_report(check::ptx_misuse, "",
                         std::string(name) + " at " + file + ":" + std::to_string(line) +
                             ": no wgmma.fence since this thread last accessed the accumulator registers "
                             "(or before its first wgmma.mma_async)",
                         false);
        for (int i = 0; i < N / 2; ++i) mine.d[i] = d[i];
    }
    // this thread's share of the operands, read through the checks
    auto read16 = [](std::uint32_t address, std::uint8_t* out) {
        const auto p = interpret::shared_at<const std::uint8_t>(address);
        for (int i = 0; i < 16; ++i) out[i] = p[i];
    };
    read16(wgmma_granule_address(desc_a, t / 2, t % 2), mine.a);
    for (int j = 0; j < wgmma_operands<N>::b_granules; ++j) {
        const unsigned q = t + 128u * static_cast<unsigned>(j);
        if (q < 2u * N) read16(wgmma_granule_address(desc_b, q / 2, q % 2), mine.b[j]);
    }
    const auto out = warpgroup_exchange<wgmma_operands<N>, wgmma_result<N>>(
        name, mine,
        [&](const wgmma_operands<N>* const* in, wgmma_result<N>* const* res) {
            for (int u = 1; u < 128; ++u)
                if (in[u]->desc_a != in[0]->desc_a || in[u]->desc_b != in[0]->desc_b ||
                    (in[u]->scale_d != 0) != (in[0]->scale_d != 0))
                    model_report(check::warp_sync, "",
                                 std::string(name) + ": thread " + std::to_string(u) +
                                     " of the warpgroup passes descriptors " + detail::hex64(in[u]->desc_a) + ", " +
                                     detail::hex64(in[u]->desc_b) + " and scale-d " + std::to_string(in[u]->scale_d) +
                                     ", thread 0 " + detail::hex64(in[0]->desc_a) + ", " +
                                     detail::hex64(in[0]->desc_b) + " and " + std::to_string(in[0]->scale_d),
                                 true);
            double a[64][32], b[N][32];
            for (int u = 0; u < 128; ++u) {
                for (int k = 0; k < 16; ++k) a[u / 2][16 * (u % 2) + k] = static_cast<double>(decode<FA>(in[u]->a[k]));
                for (int j = 0; j < wgmma_operands<N>::b_granules; ++j) {
                    const int q = u + 128 * j;
                    if (q < 2 * N)
                        for (int k = 0; k < 16; ++k)
                            b[q / 2][16 * (q % 2) + k] = static_cast<double>(decode<FB>(in[u]->b[j][k]));
                }
            }
            const bool accumulate = in[0]->scale_d != 0;
            for (int u = 0; u < 128; ++u) {
                const int w = u / 32, l = u % 32;
                for (int i = 0; i < N / 2; ++i) {
                    const int row = 16 * w + l / 4 + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * (l % 4) + i % 2;
                    double sum = 0;
                    for (int k = 0; k < 32; ++k) sum += a[row][k] * b[col][k];
                    if (accumulate) sum += static_cast<double>(in[u]->d[i]);
                    res[u]->d[i] = static_cast<float>(sum);
                }
            }
        },
        file, line);
    if (chained) {
        chained->value.assign(out.d, out.d + N / 2);
        chained->group = st.groups;
    } else {
        interpret::detail::wgmma_inflight e;
        e.d = d;
        e.n = N / 2;
        e.group = st.groups;
        e.value.assign(out.d, out.d + N / 2);
        e.at = interpret::detail::site{file, line};
        st.inflight.push_back(std::move(e));
    }
    for (int i = 0; i < N / 2; ++i) d[i] = detail::wgmma_poison();
}

/// wgmma.fence.sync.aligned: orders this thread's register accesses before the next mma_async.
inline void wgmma_fence(const char* file, int line) {
    (void)warpgroup_exchange<int, int>(
        "wgmma.fence.sync.aligned", 0, [](const int* const*, int* const*) {}, file, line);
    interpret::detail::wgmma_state().fenced = true;
}
/// wgmma.commit_group.sync.aligned: the uncommitted mma_asyncs become one wgmma-group.
inline void wgmma_commit_group(const char* file, int line) {
    (void)warpgroup_exchange<int, int>(
        "wgmma.commit_group.sync.aligned", 0, [](const int* const*, int* const*) {}, file, line);
    ++interpret::detail::wgmma_state().groups;
}
/// wgmma.wait_group.sync.aligned n: completes all but the newest n committed wgmma-groups; their
/// results land in their accumulator registers.
inline void wgmma_wait_group(int n, const char* file, int line) {
    (void)warpgroup_exchange<int, int>(
        "wgmma.wait_group.sync.aligned", n,
        [n](const int* const* in, int* const*) {
            for (int u = 0; u < 128; ++u)
                if (*in[u] != n)
                    model_report(check::warp_sync, "",
                                 "wgmma.wait_group: thread " + std::to_string(u) + " of the warpgroup waits for " +
                                     std::to_string(*in[u]) + " pending groups, the last to arrive for " +
                                     std::to_string(n),
                                 true);
        },
        file, line);
    interpret::detail::wgmma_thread& st = interpret::detail::wgmma_state();
    const std::uint32_t keep = static_cast<std::uint32_t>(n < 0 ? 0 : n);
    for (std::size_t i = 0; i < st.inflight.size();) {
        auto& e = st.inflight[i];
        if (e.group + keep < st.groups) {  // committed, and older than the newest `keep` groups
            for (unsigned r = 0; r < e.n; ++r) {
                std::uint32_t bits;
                std::memcpy(&bits, &e.d[r], sizeof bits);
                if (bits != detail::wgmma_poison_bits) {
                    model_report(check::ptx_misuse, "",
                                 "accumulator register " + std::to_string(r) + " of the wgmma.mma_async at " +
                                     to_string(e.at) + " was written before the wgmma.wait_group at " + file + ":" +
                                     std::to_string(line) + " completed it (undefined in the ISA)",
                                 false);
                    break;
                }
            }
            for (unsigned r = 0; r < e.n; ++r) e.d[r] = e.value[r];
            st.inflight.erase(st.inflight.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
            ++i;
        }
    }
    st.fenced = false;
}

}  // namespace model
}  // namespace interpret
}  // namespace octet
