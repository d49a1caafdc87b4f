// octet/quant/detail/quantize.hpp: the implementation of octet/quant/quantize.hpp (which includes
// it at its end): the argument checks, the host backend (quant_backend<host_executor>: its SIMD
// loops, scratch layout and passes), and the definitions of the entries declared there.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/isa_dispatch.hpp"
#include "octet/core/matrix.hpp"
#include "octet/core/philox.hpp"
#include "octet/quant/quantize.hpp"
#include "octet/quant/recipe.hpp"
#include "octet/quant/scale.hpp"
#include "octet/quant/stats.hpp"
#include "octet/quant/tensor.hpp"

namespace octet {

namespace detail {

template <class In>
inline constexpr bool is_quant_input_v =
    std::is_same_v<In, float> || std::is_same_v<In, bf16> || std::is_same_v<In, fp16>;

template <class In>
OCTET_HD float as_float(In v) {
    if constexpr (std::is_same_v<In, float>)
        return v;
    else
        return to_float(v);
}

/// The quantizer's element loop (deterministic roundings), compiled per instruction set
/// (core/isa_dispatch.hpp): codes[j] = encode_scaled(x[j], S[j]) for j < n.
template <class Recipe, class In>
struct encode_scaled_kernel {
    OCTET_KERNEL_INLINE static void chunk(const In* __restrict x, const float* __restrict S,
                                          std::uint8_t* __restrict codes) {
        for (std::size_t j = 0; j < kernel_chunk; ++j) codes[j] = encode_scaled<Recipe>(as_float(x[j]), S[j]);
    }
    OCTET_KERNEL_INLINE static void run(const In* x, const float* S, std::uint8_t* codes, std::size_t n) {
        std::size_t j = 0;
        for (; j + kernel_chunk <= n; j += kernel_chunk) chunk(x + j, S + j, codes + j);
        if (j == n) return;
        In x_tail[kernel_chunk] = {};
        float S_tail[kernel_chunk];
        std::uint8_t code_tail[kernel_chunk];
        std::fill(S_tail, S_tail + kernel_chunk, 1.0f);
        std::memcpy(x_tail, x + j, (n - j) * sizeof(In));
        std::memcpy(S_tail, S + j, (n - j) * sizeof(float));
        chunk(x_tail, S_tail, code_tail);
        std::memcpy(codes + j, code_tail, n - j);
    }
};

/// The scale loop over n blocks, compiled per instruction set: the block_scale of each amax (of
/// override_amax instead where that is >= 0 and the block's amax is not NaN), as value and stored.
template <class Recipe>
struct block_scale_kernel {
    OCTET_KERNEL_INLINE static void chunk(const float* __restrict amax, float override_amax, float tensor_scale,
                                          float* __restrict value, std::uint32_t* __restrict stored) {
        for (std::size_t k = 0; k < kernel_chunk; ++k) {
            const float block_amax = amax[k];  // NaN: the block keeps its NaN scale
            const float a = override_amax >= 0.0f && block_amax == block_amax ? override_amax : block_amax;
            const block_scale s = make_block_scale<Recipe>(a, tensor_scale);
            value[k] = s.value;
            stored[k] = s.stored;
        }
    }
    OCTET_KERNEL_INLINE static void run(const float* amax, float override_amax, float tensor_scale, float* value,
                                        std::uint32_t* stored, std::size_t n) {
        std::size_t k = 0;
        for (; k + kernel_chunk <= n; k += kernel_chunk)
            chunk(amax + k, override_amax, tensor_scale, value + k, stored + k);
        if (k == n) return;
        float amax_tail[kernel_chunk] = {}, value_tail[kernel_chunk];
        std::uint32_t stored_tail[kernel_chunk];
        std::memcpy(amax_tail, amax + k, (n - k) * sizeof(float));
        chunk(amax_tail, override_amax, tensor_scale, value_tail, stored_tail);
        std::memcpy(value + k, value_tail, (n - k) * sizeof(float));
        std::memcpy(stored + k, stored_tail, (n - k) * sizeof(std::uint32_t));
    }
};

/// The amax loop of one row-major row, compiled per instruction set: a[bj] = the larger of a[bj]
/// and the largest block_abs<Recipe> (finite_abs when Recipe is void) of the row's block bj of C
/// columns. amax_max orders values by bit pattern, so maxima of bit patterns in 16 lanes give the
/// same result (max is exact and order-free); a[] holds non-negative values or the NaN 0x7FFFFFFF.
template <class Recipe, class In>
struct row_block_amax_kernel {
    OCTET_KERNEL_INLINE static void abs_bits(const In* __restrict src, std::uint32_t* __restrict bits) {
        for (std::size_t k = 0; k < kernel_chunk; ++k) {
            if constexpr (std::is_void_v<Recipe>)
                bits[k] = float_to_bits(finite_abs(as_float(src[k])));
            else
                bits[k] = float_to_bits(block_abs<Recipe>(as_float(src[k])));
        }
    }
    OCTET_KERNEL_INLINE static void run(const In* src, std::size_t cols, std::size_t C, float* a) {
        constexpr std::size_t lanes = 16;
        std::uint32_t bits[kernel_chunk];
        for (std::size_t c0 = 0; c0 < cols; c0 += kernel_chunk) {
            const std::size_t n = std::min(kernel_chunk, cols - c0);
            if (n == kernel_chunk) {
                abs_bits(src + c0, bits);
            } else {
                In tail[kernel_chunk] = {};
                std::memcpy(tail, src + c0, n * sizeof(In));
                abs_bits(tail, bits);
            }
            for (std::size_t k = 0; k < n;) {  // the part of each block inside this chunk
                const std::size_t bj = (c0 + k) / C, end = std::min(n, (bj + 1) * C - c0);
                std::uint32_t lane[lanes] = {};
                for (; k + lanes <= end; k += lanes)
                    for (std::size_t l = 0; l < lanes; ++l) lane[l] = lane[l] >= bits[k + l] ? lane[l] : bits[k + l];
                std::uint32_t m = float_to_bits(a[bj]);
                for (; k < end; ++k) m = m >= bits[k] ? m : bits[k];
                for (std::size_t l = 0; l < lanes; ++l) m = m >= lane[l] ? m : lane[l];
                a[bj] = bits_to_float(m);
            }
        }
    }
};

/// dequantize's element loop, compiled per instruction set: out[j] = decode(codes[j]) * S[j]
/// converted to Out, for j < n <= kernel_chunk. (A NaN code times a NaN scale of another payload
/// may keep either payload, as scalar code may: compilers order a product's operands freely.)
template <class Fmt, class Out>
struct dequantize_kernel {
    OCTET_KERNEL_INLINE static void chunk(const std::uint8_t* __restrict codes, const float* __restrict S,
                                          Out* __restrict out) {
        for (std::size_t j = 0; j < kernel_chunk; ++j) {
            const float v = decode<Fmt>(codes[j]) * S[j];
            if constexpr (std::is_same_v<Out, float>)
                out[j] = v;
            else if constexpr (std::is_same_v<Out, bf16>)
                out[j] = to_bf16(v);
            else
                out[j] = to_fp16(v);
        }
    }
    OCTET_KERNEL_INLINE static void run(const std::uint8_t* codes, const float* S, Out* out, std::size_t n) {
        if (n == kernel_chunk) return chunk(codes, S, out);
        Out out_tail[kernel_chunk];
        chunk(codes, S, out_tail);  // callers pass full kernel_chunk-sized code and scale buffers
        std::memcpy(out, out_tail, n * sizeof(Out));
    }
};

/// Checks that a quantized view fits a rows x cols copy of its recipe.
template <class Recipe, class Byte>
void validate_output(const quantized_ref<Recipe, Byte>& q, std::size_t rows, std::size_t cols, const char* fn,
                     const char* arg) {
    const quant_layout& l = q.layout;
    OCTET_REQUIRE(l.rows == rows && l.cols == cols, fn, arg,
                  message("has shape ", l.rows, " x ", l.cols, " but must be ", rows, " x ", cols,
                          "; build it with quant_layout_of<Recipe>::make(", rows, ", ", cols, ")"));
    if (rows == 0 || cols == 0) return;
    using LO = quant_layout_of<Recipe>;
    const quant_layout expect = LO::make(rows, cols, false);
    OCTET_REQUIRE(l.ld >= cols && l.ld % LO::group_codes == 0 && l.row_bytes == LO::bytes_for_codes(l.ld), fn, arg,
                  message("has an inconsistent row layout (ld ", l.ld, ", row_bytes ", l.row_bytes,
                          "); use quant_layout_of<Recipe>::make"));
    OCTET_REQUIRE(l.data_bytes >= rows * l.row_bytes, fn, arg, "has data_bytes smaller than rows * row_bytes");
    OCTET_REQUIRE(
        l.block_rows == expect.block_rows && l.block_cols == expect.block_cols && l.scale_rows == expect.scale_rows &&
            l.scale_cols == expect.scale_cols && l.scale_ld >= l.scale_rows,
        fn, arg, "has a scale grid that does not fit the recipe's granularity; use quant_layout_of<Recipe>::make");
    OCTET_REQUIRE(l.scale_bytes >= l.scale_cols * l.scale_ld * Recipe::scale_bytes, fn, arg,
                  message("has scale_bytes ", l.scale_bytes, " but the scale grid needs ",
                          l.scale_cols * l.scale_ld * Recipe::scale_bytes));
    OCTET_REQUIRE(q.data != nullptr, fn, arg,
                  "has a null data pointer; pass a complete copy (data, scales, layout), or {} to skip it");
    OCTET_REQUIRE(q.scales != nullptr, fn, arg,
                  "has a null scales pointer; pass a complete copy (data, scales, layout), or {} to skip it");
    OCTET_REQUIRE(!Recipe::two_level || q.tensor_scale != nullptr, fn, arg,
                  "is a two-level (NVFP4) copy without a tensor_scale pointer; point it at one float");
}

template <class T>
void validate_input(const matrix_ref<T>& x, const char* fn, const char* arg = "x") {
    const std::size_t minor = x.order == storage_order::row_major ? x.cols : x.rows;
    OCTET_REQUIRE(x.empty() || x.data != nullptr, fn, arg, "is null with a non-zero shape");
    OCTET_REQUIRE(x.empty() || x.ld >= minor, fn, arg,
                  message("has ld ", x.ld, " smaller than its ",
                          (x.order == storage_order::row_major ? "cols " : "rows "), minor));
}

template <class In>
float tensor_amax_host(host_executor ex, matrix_ref<const In> x);

/// quant_stats of one quantized row (quant/stats.hpp defines each count), compiled per instruction
/// set: branch-free so that it vectorizes. Counts are exact. The energies are sums in double over 8
/// interleaved partial sums per row, each term formed by itself (the products are stored before they
/// are summed, so no compiler fuses them into an fma on one instruction set and not another); their
/// order is not part of the contract, only the counts are. The saturation test is beyond_max_finite
/// of x / S for edge codes (the largest finite magnitude, Inf or NaN: the only codes an input beyond
/// max_finite can encode to, under either overflow policy and either rounding).
template <class Fmt>
struct row_stats_kernel {
    static constexpr std::size_t lanes = 8, width = 64;  // rows are often 64 or 128 wide: little padding
    OCTET_KERNEL_INLINE static void chunk(const float* __restrict v, const float* __restrict S_of,
                                          const std::uint8_t* __restrict codes, double* __restrict sig,
                                          double* __restrict err2, std::uint32_t* __restrict counts) {
        std::uint32_t non_finite = 0, lost = 0, saturated = 0, flushed = 0;
        for (std::size_t j = 0; j < width; ++j) {
            const float val = v[j], S = S_of[j];
            const std::uint32_t a = float_to_bits(val) & 0x7FFFFFFFu;
            // unsigned 0/1 flags and & (not &&): no branch, so that the loop vectorizes
            const unsigned finite = a < 0x7F800000u, nan_block = S != S;  // a NaN block: dequantizes to NaN
            const unsigned used = finite & (nan_block ^ 1u);
            const float value = decode<Fmt>(codes[j]);
            const float back = value * S;
            const unsigned edge = !(abs_float(value) < static_cast<float>(Fmt::max_finite));
            non_finite += finite ^ 1u;
            lost += finite & nan_block;
            saturated +=
                used & edge & static_cast<unsigned>(S != 0.0f) & static_cast<unsigned>(beyond_max_finite<Fmt>(val / S));
            flushed += used & static_cast<unsigned>(a != 0u) & static_cast<unsigned>(back == 0.0f);
            const std::uint32_t keep = 0u - used;  // all ones when used; a mask, since float selects do not vectorize
            const double d = bits_to_float(float_to_bits(val) & keep),
                         e = d - bits_to_float(float_to_bits(back) & keep);
            sig[j] = d * d;
            err2[j] = e * e;
        }
        counts[0] += non_finite;
        counts[1] += lost;
        counts[2] += saturated;
        counts[3] += flushed;
    }
    OCTET_KERNEL_INLINE static void sum_lanes(const double* __restrict sig, const double* __restrict err2,
                                              double* __restrict signal, double* __restrict noise) {
        for (std::size_t j = 0; j < width; j += lanes)
            for (std::size_t l = 0; l < lanes; ++l) {
                signal[l] += sig[j + l];
                noise[l] += err2[j + l];
            }
    }
    OCTET_KERNEL_INLINE static void run(const float* v, const float* S_of, const std::uint8_t* codes, std::size_t n,
                                        quant_stats* st) {
        double sig[width], err2[width], signal[lanes] = {}, noise[lanes] = {};
        std::uint32_t counts[4] = {0, 0, 0, 0};
        std::size_t j0 = 0;
        for (; j0 + width <= n; j0 += width) {
            chunk(v + j0, S_of + j0, codes + j0, sig, err2, counts);
            sum_lanes(sig, err2, signal, noise);
        }
        if (j0 < n) {  // the tail on a copy padded with zeros (scale 1), which count nothing
            float v_tail[width] = {}, S_tail[width];
            std::uint8_t code_tail[width] = {};
            std::fill(S_tail, S_tail + width, 1.0f);
            std::memcpy(v_tail, v + j0, (n - j0) * sizeof(float));
            std::memcpy(S_tail, S_of + j0, (n - j0) * sizeof(float));
            std::memcpy(code_tail, codes + j0, n - j0);
            chunk(v_tail, S_tail, code_tail, sig, err2, counts);
            sum_lanes(sig, err2, signal, noise);
        }
        st->elements += n;
        st->non_finite += counts[0];
        st->lost_to_nan += counts[1];
        st->saturated += counts[2];
        st->flushed_to_zero += counts[3];
        double s = 0.0, e = 0.0;
        for (std::size_t l = 0; l < lanes; ++l) {
            s += signal[l];
            e += noise[l];
        }
        st->signal_energy += s;
        st->noise_energy += e;
    }
};

/// The host scratch of one quantized copy of x (rows x cols in the copy's orientation): described
/// once, as what it takes from a carver, for both quantize_scratch_bytes and quantize_copy_host.
/// A copy that reads x down its columns (x not row-major) works in bands of rows of the copy (x's
/// columns), each transposed into a row-major temporary: band_rows x cols of x's type, not the
/// whole x (a weight gradient's X^T copy reads tokens x features).
template <class In>
struct quantize_copy_scratch {
    // The work splits of the passes (parallel_for grains, in rows or bands); per-chunk arrays are
    // sized by the chunks these give.
    static std::size_t band_grain(std::size_t R, std::size_t cols) {
        // At least 2^15 elements a chunk: a small x stays on the calling thread, since waking a
        // pool's workers costs more than the whole pass over a few thousand values.
        return std::max<std::size_t>(1, (1 << 15) / std::max<std::size_t>(R * cols, 1));
    }
    static std::size_t amax_row_grain(std::size_t cols) {
        return std::max<std::size_t>(1, (1 << 16) / std::max<std::size_t>(cols, 1));
    }
    static std::size_t code_row_grain(std::size_t cols) {
        return std::max<std::size_t>(1, (1 << 15) / std::max<std::size_t>(cols, 1));
    }
    /// Rows of the copy a band holds: all of them for a row-major x; else whole scale bands of at
    /// least 64 rows (any 64 when the grid has one band of rows, whose amax is measured first).
    static std::size_t band_rows(const matrix_ref<const In>& x, const quant_layout& L) {
        if (x.order == storage_order::row_major) return x.rows;
        const std::size_t R = L.scale_rows <= 1 ? 1 : L.block_rows;
        return std::min(x.rows, R * ((64 + R - 1) / R));
    }

    In* transposed = nullptr;         ///< one band, row-major (x not row-major)
    float* amax = nullptr;            ///< one band's block amax, row-major (scale_rows <= 1: sc)
    float* part = nullptr;            ///< per chunk of the one-band amax pass (sr == 1): sc each
    float* scale = nullptr;           ///< one band's decoded scales, row-major
    std::uint32_t* stored = nullptr;  ///< one band row of stored scales, sc
    float* values = nullptr;          ///< per chunk of the code pass: cols each
    float* row_scales = nullptr;      ///< per chunk of the code pass: cols each
    std::uint8_t* codes = nullptr;    ///< per chunk of the code pass: cols each

    quantize_copy_scratch(scratch_carver& c, const host_executor& ex, const matrix_ref<const In>& x,
                          const quant_layout& L) {
        const std::size_t rows = x.rows, cols = x.cols, sr = L.scale_rows, sc = L.scale_cols;
        const std::size_t band = band_rows(x, L);
        const std::size_t band_sr = sr <= 1 ? sr : (band + L.block_rows - 1) / L.block_rows;
        if (x.order != storage_order::row_major) transposed = c.take<In>(band * cols);
        amax = c.take<float>(band_sr * sc);
        if (sr <= 1) part = c.take<float>(parallel_chunks(ex, rows, amax_row_grain(cols)) * sc);
        scale = c.take<float>(band_sr * sc);
        stored = c.take<std::uint32_t>(sc);
        const std::size_t chunks = parallel_chunks(ex, band, code_row_grain(cols));
        values = c.take<float>(chunks * cols);
        row_scales = c.take<float>(chunks * cols);
        codes = c.take<std::uint8_t>(chunks * cols);
    }
};

/// One quantized copy of x (rows x cols in x's logical orientation) on the host, its temporaries
/// carved from `scratch` (a block of at least quantize_copy_scratch's bytes for this copy).
template <class Recipe, class In>
void quantize_copy_host(host_executor ex, matrix_ref<const In> x, const quantized_ref<Recipe>& out,
                        float amax_for_scale_override, float tensor_scale, const philox_stream& rng, bool stats_on,
                        quant_stats& stats, scratch_carver scratch) {
    using work_type = quantize_copy_scratch<In>;
    const quant_layout& L = out.layout;
    const std::size_t rows = x.rows, cols = x.cols;
    const std::size_t R = L.block_rows, C = L.block_cols, sr = L.scale_rows, sc = L.scale_cols;
    const work_type work(scratch, ex, x, L);
    const simd_isa isa = best_isa();
    std::fill(out.scales, out.scales + L.scale_bytes, std::uint8_t{0});
    bool nan_block = false;  // only under nan_policy::propagate

    // Phase 1: the finite amax of every block of band rows [r0, r1) (grid rows r0 / R.., row-major in
    // work.amax); row i of the band is at base + (i - r0) * ld. max is exact and order-free, so any
    // split of the work gives the same grid.
    auto band_amax = [&](std::size_t r0, std::size_t r1, const In* base, std::size_t ld) {
        const std::size_t b0 = r0 / R, b1 = (r1 + R - 1) / R;
        std::fill(work.amax, work.amax + (b1 - b0) * sc, 0.0f);
        parallel_for(ex, b1 - b0, work_type::band_grain(R, cols), [&](std::size_t b, std::size_t e) {
            for (std::size_t bi = b0 + b; bi < b0 + e; ++bi)
                for (std::size_t i = bi * R; i < std::min(r1, (bi + 1) * R); ++i)
                    run_kernel<row_block_amax_kernel<Recipe, In>>(isa, base + (i - r0) * ld, cols, C,
                                                                  work.amax + (bi - b0) * sc);
        });
    };
    // Phase 2: the scales of grid rows [b0, b1) from work.amax (column-major grid in out).
    auto band_scales = [&](std::size_t b0, std::size_t b1) {
        for (std::size_t bi = b0; bi < b1; ++bi) {
            const float* a = work.amax + (bi - b0) * sc;
            for (std::size_t k = 0; k < sc; ++k) {
                nan_block = nan_block || a[k] != a[k];
                stats.amax = a[k] == a[k] ? std::max(stats.amax, a[k]) : stats.amax;
            }
            run_kernel<block_scale_kernel<Recipe>>(isa, a, amax_for_scale_override, tensor_scale,
                                                   work.scale + (bi - b0) * sc, work.stored, sc);
            for (std::size_t bj = 0; bj < sc; ++bj) {
                const std::size_t k = bj * L.scale_ld + bi;
                if constexpr (Recipe::scale_bytes == 4)
                    std::memcpy(out.scales + 4 * k, &work.stored[bj], 4);
                else
                    out.scales[k] = static_cast<std::uint8_t>(work.stored[bj]);
            }
        }
    };
    // Phase 3: the codes of rows [r0, r1), row by row (a row never shares a byte with another row);
    // the scales of grid row bi are work.scale[(bi - b0) * sc ..].
    using Fmt = typename Recipe::format;
    constexpr bool stochastic = std::is_same_v<typename Recipe::rounding, round::stochastic>;
    std::mutex m;
    auto band_codes = [&](std::size_t r0, std::size_t r1, const In* base, std::size_t ld, std::size_t b0) {
        parallel_for_chunks(
            ex, r1 - r0, work_type::code_row_grain(cols), [&](std::size_t chunk, std::size_t b, std::size_t e) {
                quant_stats local;
                float* const v = work.values + chunk * cols;
                float* const S_of = work.row_scales + chunk * cols;
                std::uint8_t* const codes = work.codes + chunk * cols;
                std::size_t band = static_cast<std::size_t>(-1);
                for (std::size_t i = r0 + b; i < r0 + e; ++i) {
                    if (i / R != band) {  // the scales of this row's blocks, one per column
                        band = i / R;
                        const float* sb = work.scale + (band - b0) * sc;
                        for (std::size_t bj = 0; bj < sc; ++bj)
                            std::fill(S_of + bj * C, S_of + std::min(cols, (bj + 1) * C), sb[bj]);
                    }
                    const In* row_src = base + (i - r0) * ld;
                    if (stochastic || stats_on)
                        for (std::size_t j = 0; j < cols; ++j) v[j] = as_float(row_src[j]);
                    if constexpr (stochastic) {
                        for (std::size_t j = 0; j < cols; ++j)
                            codes[j] = encode_scaled<Recipe>(v[j], S_of[j], rng.bits(stochastic_index(i, j)));
                    } else {
                        run_kernel<encode_scaled_kernel<Recipe, In>>(isa, row_src, static_cast<const float*>(S_of),
                                                                     codes, cols);
                    }
                    std::uint8_t* row = out.data + i * L.row_bytes;
                    if constexpr (Fmt::bits == 8) {
                        std::memcpy(row, codes, cols);
                        std::fill(row + cols, row + L.row_bytes, std::uint8_t{0});
                    } else if constexpr (Fmt::bits <=
                                         4) {  // two codes a byte, element 0 in the low nibble (store_code's layout)
                        std::fill(row, row + L.row_bytes, std::uint8_t{0});
                        const std::uint8_t* c = codes;
                        for (std::size_t k = 0; k + 1 < cols; k += 2)
                            row[k / 2] = static_cast<std::uint8_t>((c[k] & 0x0Fu) | ((c[k + 1] & 0x0Fu) << 4));
                        if (cols % 2 != 0) row[cols / 2] = static_cast<std::uint8_t>(c[cols - 1] & 0x0Fu);
                    } else {
                        std::fill(row, row + L.row_bytes, std::uint8_t{0});
                        for (std::size_t j = 0; j < cols; ++j) detail::store_code<Fmt>(row, j, codes[j]);
                    }
                    if (stats_on)
                        run_kernel<row_stats_kernel<Fmt>>(isa, static_cast<const float*>(v),
                                                          static_cast<const float*>(S_of),
                                                          static_cast<const std::uint8_t*>(codes), cols, &local);
                }
                if (stats_on) {
                    std::lock_guard<std::mutex> lock(m);
                    const float keep = stats.amax;
                    stats.merge(local);
                    stats.amax = keep;
                }
            });
    };
    // Rows [r0, r1) of x as a row-major band: x itself, or (x read down its columns) transposed
    // into work.transposed in cache-sized tiles (the same values, so the same codes).
    auto band_of = [&](std::size_t r0, std::size_t r1, std::size_t& ld) -> const In* {
        if (x.order == storage_order::row_major) {
            ld = x.ld;
            return x.data + r0 * x.ld;
        }
        constexpr std::size_t tile = 32;
        In* const dst = work.transposed;
        const In* const src = x.data;
        const std::size_t xld = x.ld, n = r1 - r0;
        const std::size_t tile_grain = std::max<std::size_t>(1, (1 << 15) / (tile * std::max<std::size_t>(cols, 1)));
        parallel_for(ex, (n + tile - 1) / tile, tile_grain, [&](std::size_t b, std::size_t e) {
            for (std::size_t i0 = b * tile; i0 < std::min(n, e * tile); i0 += tile) {
                const std::size_t i1 = std::min(n, i0 + tile);
                for (std::size_t j0 = 0; j0 < cols; j0 += tile) {
                    const std::size_t j1 = std::min(cols, j0 + tile);
                    for (std::size_t i = i0; i < i1; ++i)
                        for (std::size_t j = j0; j < j1; ++j) dst[i * cols + j] = src[j * xld + r0 + i];
                }
            }
        });
        ld = cols;
        return dst;
    };

    const std::size_t band = work_type::band_rows(x, L);
    if (sr <= 1) {
        // One band of grid rows: its amax over all of x first (any order: x(i, j)), then the codes
        // band by band.
        float* const amax = work.amax;
        std::fill(amax, amax + sc, 0.0f);
        parallel_for_chunks(ex, rows, work_type::amax_row_grain(cols),
                            [&](std::size_t chunk, std::size_t b, std::size_t e) {
                                float* const part = work.part + chunk * sc;
                                std::fill(part, part + sc, 0.0f);
                                for (std::size_t i = b; i < e; ++i)
                                    for (std::size_t j = 0; j < cols; ++j)
                                        part[j / C] = amax_max(part[j / C], block_abs<Recipe>(as_float(x(i, j))));
                                std::lock_guard<std::mutex> lock(m);
                                for (std::size_t k = 0; k < sc; ++k) amax[k] = amax_max(amax[k], part[k]);
                            });
        band_scales(0, sr);
        for (std::size_t r0 = 0; r0 < rows; r0 += band) {
            const std::size_t r1 = std::min(rows, r0 + band);
            std::size_t ld = 0;
            const In* base = band_of(r0, r1, ld);
            band_codes(r0, r1, base, ld, 0);
        }
    } else {
        for (std::size_t r0 = 0; r0 < rows; r0 += band) {  // band is a multiple of R
            const std::size_t r1 = std::min(rows, r0 + band);
            std::size_t ld = 0;
            const In* base = band_of(r0, r1, ld);
            band_amax(r0, r1, base, ld);
            band_scales(r0 / R, (r1 + R - 1) / R);
            band_codes(r0, r1, base, ld, r0 / R);
        }
    }
    // A NaN block hides its finite amax, which the result reports: measure it (NaN inputs only).
    if (nan_block) stats.amax = tensor_amax_host(ex, x);
}

/// The finite amax of a whole matrix (the "amax pass" of current per-tensor scaling).
template <class In>
float tensor_amax_host(host_executor ex, matrix_ref<const In> x) {
    std::mutex m;
    float amax = 0.0f;
    const simd_isa isa = best_isa();
    parallel_for(
        ex, x.rows, std::max<std::size_t>(1, (1 << 16) / std::max<std::size_t>(x.cols, 1)),
        [&](std::size_t b, std::size_t e) {
            float a = 0.0f;
            for (std::size_t i = b; i < e; ++i) {
                if (x.order ==
                    storage_order::row_major) {  // finite_abs values are >= +0: max by bit pattern is max by value
                    run_kernel<row_block_amax_kernel<void, In>>(isa, x.data + i * x.ld, x.cols, x.cols, &a);
                    continue;
                }
                for (std::size_t j = 0; j < x.cols; ++j) a = std::max(a, finite_abs(as_float(x(i, j))));
            }
            std::lock_guard<std::mutex> lock(m);
            amax = std::max(amax, a);
        });
    return amax;
}

/// The argument checks of dequantize (host and stream); false when there is nothing to do.
template <class Recipe, class T>
bool validate_dequantize(const quantized_cref<Recipe>& q, const matrix_ref<T>& out) {
    constexpr const char* fn = "octet::dequantize";
    OCTET_REQUIRE(
        out.rows == q.rows() && out.cols == q.cols(), fn, "out",
        message("has shape ", out.rows, " x ", out.cols, " but the quantized copy is ", q.rows(), " x ", q.cols()));
    validate_input(out, fn, "out");
    if (out.empty()) return false;
    OCTET_REQUIRE(q.data != nullptr && q.scales != nullptr, fn, "q", "has a null data or scales pointer");
    OCTET_REQUIRE(!Recipe::two_level || q.tensor_scale != nullptr, fn, "q",
                  "is two-level (NVFP4) but has no tensor_scale");
    return true;
}

/// Where quantize and dequantize run: the executor's half of each operation, host_executor's below
/// and stream_executor's in quantize.cuh. octet::quantize and octet::dequantize (after this) are the one
/// entry of each operation: they check what does not depend on the executor, once, then call the
/// backend's run_quantize / run_dequantize, which checks what does (device pointers, host options).
template <class Executor>
struct quant_backend {
    static_assert(sizeof(Executor) == 0,
                  "octet::quantize/dequantize: the executor is octet::on_host(...), or octet::on_stream(...) with "
                  "octet/quant/quantize.cuh included");
};

template <>
struct quant_backend<host_executor> {
    using options = quantize_options;
    using result = quantize_result;
    /// The element type the kernels see for an argument's T.
    template <class T>
    using element = T;

    /// The bytes of the one scratch block run_quantize takes: the larger of the two copies' needs.
    template <class Recipe, class In>
    static std::size_t scratch_bytes(const host_executor& ex, const matrix_ref<const In>& x, bool want_row,
                                     bool want_col) {
        if (x.empty()) return 0;
        std::size_t bytes = 0;
        if (want_row) {
            scratch_carver c;
            quantize_copy_scratch<In>(c, ex, x, quant_layout_of<Recipe>::make(x.rows, x.cols));
            bytes = c.bytes();
        }
        if (want_col) {
            scratch_carver c;
            quantize_copy_scratch<In>(c, ex, x.transposed(), quant_layout_of<Recipe>::make(x.cols, x.rows));
            bytes = std::max(bytes, c.bytes());
        }
        return bytes;
    }

    template <class Recipe, class In>
    static quantize_result run_quantize(host_executor ex, matrix_ref<const In> x, const quantized_ref<Recipe>& rowwise,
                                        const quantized_ref<Recipe>& columnwise, const options& opt) {
        constexpr const char* fn = "octet::quantize";
        const bool want_row = !rowwise.absent(), want_col = !columnwise.absent();
        OCTET_REQUIRE(!(opt.tensor_amax > 3.40282347e38f) && opt.tensor_amax == opt.tensor_amax, fn,
                      "options.tensor_amax", "is Inf or NaN; pass a finite amax (or a negative value to measure it)");

        quantize_result result;
        if (x.empty()) return result;

        const bool need_tensor_amax = Recipe::is_per_tensor || Recipe::two_level;
        float tensor_amax = opt.tensor_amax;
        if (need_tensor_amax && tensor_amax <= 0.0f) {
            const float measured = tensor_amax_host(ex, x);
            // A zero amax beside non-zero data would give scale 1 and clamp everything (NVFP4: 9.75
            // stored as 6 times its block scale): refuse it before writing anything.
            OCTET_REQUIRE(tensor_amax < 0.0f || measured == 0.0f, fn, "options.tensor_amax",
                          message("is 0 but x holds non-zero values (largest |x| ", measured,
                                  "); pass the amax the scale should come from, or a negative value to measure it"));
            tensor_amax = measured;
        }
        const float override_amax = Recipe::is_per_tensor ? tensor_amax : -1.0f;
        const float tensor_scale = Recipe::two_level ? make_tensor_scale<Recipe>(tensor_amax) : 1.0f;

        // One block serves both copies, one after the other.
        const host_scratch scratch(ex, scratch_bytes<Recipe, In>(ex, x, want_row, want_col), fn);
        if (want_row) {
            if constexpr (Recipe::two_level) *rowwise.tensor_scale = tensor_scale;
            quantize_copy_host<Recipe, In>(ex, x, rowwise, override_amax, tensor_scale, opt.rng, opt.collect_stats,
                                           result.rowwise, scratch.carver());
            result.amax = result.rowwise.amax;
        }
        if (want_col) {
            if constexpr (Recipe::two_level) *columnwise.tensor_scale = tensor_scale;
            const philox_stream rng_t{opt.rng.seed, opt.rng.offset + 1};
            quantize_copy_host<Recipe, In>(ex, x.transposed(), columnwise, override_amax, tensor_scale, rng_t,
                                           opt.collect_stats, result.columnwise, scratch.carver());
            result.amax = result.columnwise.amax;
        }
        return result;
    }

    template <class Recipe, class Out>
    static void run_dequantize(host_executor ex, const quantized_cref<Recipe>& q, matrix_ref<Out> out) {
        constexpr std::size_t chunk = kernel_chunk;
        const simd_isa isa = best_isa();
        parallel_for(ex, out.rows, std::max<std::size_t>(1, (1 << 16) / std::max<std::size_t>(out.cols, 1)),
                     [&](std::size_t b, std::size_t e) {
                         for (std::size_t i = b; i < e; ++i) {
                             if (out.order != storage_order::row_major) {
                                 for (std::size_t j = 0; j < out.cols; ++j) {
                                     const float v = q.value(i, j);
                                     if constexpr (std::is_same_v<Out, float>)
                                         out(i, j) = v;
                                     else if constexpr (std::is_same_v<Out, bf16>)
                                         out(i, j) = to_bf16(v);
                                     else
                                         out(i, j) = to_fp16(v);
                                 }
                                 continue;
                             }
                             // Row-major rows in segments: unpack the codes, spread the block scales, then the
                             // dispatched kernel computes decode(code) * S exactly as q.value(i, j) does.
                             const std::size_t band = i / q.layout.block_rows, C = q.layout.block_cols;
                             for (std::size_t j0 = 0; j0 < out.cols; j0 += chunk) {
                                 const std::size_t n = std::min(chunk, out.cols - j0);
                                 std::uint8_t codes[chunk];
                                 float S[chunk];
                                 if (n < chunk) {
                                     std::fill(codes + n, codes + chunk, std::uint8_t{0});
                                     std::fill(S + n, S + chunk, 0.0f);
                                 }
                                 for (std::size_t k = 0; k < n; ++k) codes[k] = q.code(i, j0 + k);
                                 for (std::size_t k = 0; k < n;) {
                                     const std::size_t bj = (j0 + k) / C, end = std::min(n, (bj + 1) * C - j0);
                                     std::fill(S + k, S + end, q.scale(band, bj));
                                     k = end;
                                 }
                                 run_kernel<dequantize_kernel<typename Recipe::format, Out>>(
                                     isa, static_cast<const std::uint8_t*>(codes), static_cast<const float*>(S),
                                     &out(i, j0), n);
                             }
                         }
                     });
    }
};

}  // namespace detail

// ---- the entries, declared and documented in octet/quant/quantize.hpp ---------------------------

template <class Recipe, class T, class Executor>
typename detail::quant_backend<Executor>::result quantize(
    const Executor& ex, matrix_ref<T> x_in, quantized_ref<Recipe> rowwise, quantized_ref<Recipe> columnwise,
    const typename detail::quant_backend<Executor>::options& opt) {
    using backend = detail::quant_backend<Executor>;
    using In = typename backend::template element<std::remove_const_t<T>>;
    static_assert(detail::is_quant_input_v<In>, "octet::quantize: the input must be float, octet::bf16 or octet::fp16");
    static_assert(is_recipe_v<Recipe>, "octet::quantize: Recipe must be an octet::recipe<...>");
    const matrix_ref<const In> x(reinterpret_cast<const In*>(x_in.data), x_in.rows, x_in.cols, x_in.ld, x_in.order);
    constexpr const char* fn = "octet::quantize";
    detail::validate_input(x, fn);
    const bool want_row = !rowwise.absent(), want_col = !columnwise.absent();
    OCTET_REQUIRE(want_row || want_col || x.empty(), fn, "rowwise/columnwise",
                  "are both absent ({}); pass at least one output copy");
    if (want_row) detail::validate_output(rowwise, x.rows, x.cols, fn, "rowwise");
    if (want_col) detail::validate_output(columnwise, x.cols, x.rows, fn, "columnwise");
    return backend::template run_quantize<Recipe, In>(ex, x, rowwise, columnwise, opt);
}

template <class Recipe, class T>
std::size_t quantize_scratch_bytes(const host_executor& ex, matrix_ref<T> x, quantized_ref<Recipe> rowwise,
                                   quantized_ref<Recipe> columnwise) {
    using In = std::remove_const_t<T>;
    const matrix_ref<const In> xc(x.data, x.rows, x.cols, x.ld, x.order);
    return detail::quant_backend<host_executor>::scratch_bytes<Recipe, In>(ex, xc, !rowwise.absent(),
                                                                           !columnwise.absent());
}

template <class Recipe, class Byte, class Out, class Executor>
void dequantize(const Executor& ex, quantized_ref<Recipe, Byte> q_in, matrix_ref<Out> out_in) {
    using backend = detail::quant_backend<Executor>;
    static_assert(!std::is_const_v<Out>, "octet::dequantize: out must be writable (matrix_ref<float>, not const)");
    using O = typename backend::template element<Out>;
    static_assert(detail::is_quant_input_v<O>,
                  "octet::dequantize: the output must be float, octet::bf16 or octet::fp16");
    const quantized_cref<Recipe> q = q_in;
    const matrix_ref<O> out(reinterpret_cast<O*>(out_in.data), out_in.rows, out_in.cols, out_in.ld, out_in.order);
    if (!detail::validate_dequantize(q, out)) return;
    backend::template run_dequantize<Recipe, O>(ex, q, out);
}

}  // namespace octet
