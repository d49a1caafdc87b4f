// octet/comm/detail/sharded.hpp: the implementation of octet/comm/sharded.hpp (included at its end;
// the declarations and the contract are there).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>

#include "octet/codec/codec.hpp"
#include "octet/comm/allreduce.hpp"
#include "octet/comm/sharded.hpp"
#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/quant/quantize.hpp"
#include "octet/quant/tensor.hpp"

namespace octet {

// ---- compressed reduce-scatter -------------------------------------------------------------------

inline double reduce_scatter_error_bound(const codec_config& cfg, std::size_t n, int world, double sum_of_norms,
                                         double norm_of_sum) {
    std::size_t largest = 0;
    for (int r = 0; r < world; ++r) largest = std::max(largest, allreduce_shard(cfg, n, world, r).count);
    const codec_bound b = error_bound(cfg, largest);
    const double P = world, u = 0x1p-24;
    const double stage1 = b.relative * sum_of_norms + b.absolute * P * std::sqrt(P);
    const double fsum = (P - 1.0) * u * ((1.0 + b.relative) * sum_of_norms + b.absolute * P * std::sqrt(P));
    // The one inverse transform of the summed coordinates (error_bound's 3 (log2 B + 1) 2^-24 per
    // transform pair, here of the sum's norm).
    const wire_layout l = wire_layout_of(cfg, largest);
    const int k = cfg.transform == transform_kind::hadamard && l.block > 0 ? log2_exact(l.block) : 0;
    const double inverse = 3.0 * (k + 1) * u * (norm_of_sum + stage1 + fsum);
    return (stage1 + fsum + inverse) * (1.0 + 0x1p-20);
}

namespace detail {

/// The most host scratch one codec step inside compressed_reduce_scatter_host takes (one after
/// another): the encodes of every shard, the sum and inverse transform of mine.
inline std::size_t reduce_scatter_codec_bytes(const host_executor& ex, const codec_config& cfg, std::size_t n, int P,
                                              int me, bool feedback) {
    std::size_t most = 0;
    for (int r = 0; r < P; ++r) {
        const wire_layout l = wire_layout_of(cfg, allreduce_shard(cfg, n, P, r).count);
        scratch_carver e;
        carve_encode(e, ex, cfg, l, false, feedback);
        most = std::max(most, e.bytes());
        if (r == me) {
            scratch_carver d;
            carve_decode(d, ex, cfg.transform, l, decoded_space::original);
            most = std::max(most, d.bytes());
        }
    }
    return most;
}

/// Describes the scratch of compressed_reduce_scatter_host on rank `me` of P (arguments
/// validated): the all-reduce's arrays without its reduced message.
inline allreduce_scratch carve_reduce_scatter(scratch_carver& c, const host_executor& ex, const codec_config& cfg,
                                              std::size_t n, int P, int me, bool feedback) {
    const std::size_t world = static_cast<std::size_t>(P);
    std::size_t total = 0;
    for (int r = 0; r < P; ++r) total += encoded_size(cfg, allreduce_shard(cfg, n, P, r).count);
    const std::size_t msg_me = encoded_size(cfg, allreduce_shard(cfg, n, P, me).count);
    allreduce_scratch s;
    s.descriptors = c.take<allreduce_descriptor>(world);
    s.shard = c.take<shard_range>(world);
    s.msg_bytes = c.take<std::size_t>(world);
    s.send_off = c.take<std::size_t>(world + 1);
    s.recv_counts = c.take<std::size_t>(world);
    s.recv_off = c.take<std::size_t>(world);
    s.messages = c.take<std::uint8_t>(total);
    s.recvbuf = c.take<std::uint8_t>(world * msg_me);
    s.mine = c.take<const std::uint8_t*>(world);
    s.mine_scales = c.take<float>(world);
    s.codec_bytes = reduce_scatter_codec_bytes(ex, cfg, n, P, me, feedback);
    s.codec = c.take<unsigned char>(s.codec_bytes);
    return s;
}

/// out <- T^-1 (the sum, in order, of the dequantized coordinates of `count` validated messages of
/// layout l under cfg, of the elements from first_index on), span by span: the sum is never held
/// whole. The same coordinates as encode_sum_of_messages sums; the inverse as decode_gradient's.
/// Host scratch: carve_decode(..., original), from ex's allocator.
inline void decode_sum_of_messages(const host_executor& ex, const codec_config& cfg, const wire_layout& l,
                                   std::uint64_t first_index, const std::uint8_t* const* messages,
                                   const float* tensor_scales, std::size_t count, span<float> out, const char* fn) {
    scratch_carver size;
    carve_decode(size, ex, cfg.transform, l, decoded_space::original);
    const host_scratch scratch(ex, size.bytes(), fn);
    scratch_carver carver = scratch.carver();
    const codec_scratch s = carve_decode(carver, ex, cfg.transform, l, decoded_space::original);
    const std::size_t coded = static_cast<std::size_t>(l.coded), n = static_cast<std::size_t>(l.count);
    const std::size_t S = codec_span(l), Bs = l.scale_block;
    float* const dst = out.data();
    dispatch_wire_format(cfg.format, [&](auto tr) {
        using Tr = decltype(tr);
        parallel_for_chunks(ex, codec_spans(l), 1, [&](std::size_t chunk, std::size_t lo, std::size_t hi) {
            for (std::size_t k = lo; k < hi; ++k) {
                const std::size_t c0 = k * S, c1 = std::min(coded, c0 + S), k0 = c0 / Bs, k1 = (c1 + Bs - 1) / Bs;
                // the identity's coordinates are the elements: straight into out
                float* y = s.y == nullptr ? dst + c0 : s.y + chunk * s.span;
                for (std::size_t r = 0; r < count; ++r)
                    dequantize_blocks<Tr>(k0, k1, Bs, coded, messages[r] + l.scales_offset,
                                          messages[r] + l.payload_offset, tensor_scales[r], y, r > 0, c0);
                if (s.y != nullptr)
                    span_inverse(cfg.transform, l, cfg.seed, first_index, y, c0, std::min(c1, n) - c0, dst + c0,
                                 s.words + chunk * s.words_per_chunk, s.work + chunk * s.work_per_chunk);
            }
        });
    });
}

/// This rank's descriptor for the reduce-scatter: the all-reduce's, marked as another operation.
inline allreduce_descriptor make_reduce_scatter_descriptor(const codec_config& cfg, std::size_t n, int world,
                                                           const reduce_scatter_options& opt) {
    allreduce_options ao;
    ao.expected_ranks = opt.expected_ranks;
    ao.feedback = opt.feedback;
    allreduce_descriptor d = make_descriptor(cfg, n, world, ao);
    d.reserved0 = 1;  // the reduce-scatter
    return d;
}

}  // namespace detail

inline std::size_t compressed_reduce_scatter_scratch_bytes(const host_executor& ex, const codec_config& cfg,
                                                           std::size_t n, int world, int rank,
                                                           const reduce_scatter_options& opt) {
    constexpr const char* fn = "octet::compressed_reduce_scatter_scratch_bytes";
    detail::validate_config(cfg, fn);
    OCTET_REQUIRE(n <= wire_max_elements, fn, "n", detail::message("counts ", n, " elements; at most 2^40"));
    OCTET_REQUIRE(world >= 1, fn, "world", detail::message("is ", world, "; a communicator has at least one rank"));
    OCTET_REQUIRE(rank >= 0 && rank < world, fn, "rank", detail::message("is ", rank, "; ranks are 0..", world - 1));
    detail::scratch_carver c;
    detail::carve_reduce_scatter(c, ex, cfg, n, world, rank, !opt.feedback.empty());
    return c.bytes();
}

template <class Transport>
reduce_scatter_report compressed_reduce_scatter_host(Transport& comm, const codec_config& cfg, span<const float> grad,
                                                     span<float> out_shard, const reduce_scatter_options& opt,
                                                     const char* fn) {
    using clock = std::chrono::steady_clock;
    reduce_scatter_report rep;
    const int P = comm.size(), me = comm.rank();
    rep.world = P;
    const std::size_t n = grad.size();
    auto t0 = clock::now();

    // 0. Validate locally and take the scratch; exchange the failure flag; agree on the call.
    std::optional<detail::host_scratch> block;
    detail::allreduce_scratch s;
    int local_failure = 0;  // 1: the arguments, 2: the scratch
    std::string local_message;
    try {
        allreduce_options ao;
        ao.expected_ranks = opt.expected_ranks;
        detail::check_expected_ranks(ao, P, fn);
        detail::validate_config(cfg, fn);
        OCTET_REQUIRE(n == 0 || grad.data() != nullptr, fn, "grad", "is null with a non-zero size");
        OCTET_REQUIRE(n <= wire_max_elements, fn, "grad", "has more than 2^40 elements");
        const shard_range sh = allreduce_shard(cfg, n, P, me);
        OCTET_REQUIRE(out_shard.size() == sh.count, fn, "out_shard",
                      detail::message("has ", out_shard.size(), " elements; this rank's shard has ", sh.count,
                                      " (allreduce_shard(cfg, grad.size(), ", P, ", ", me, "))"));
        OCTET_REQUIRE(sh.count == 0 || out_shard.data() != nullptr, fn, "out_shard", "is null with a non-zero size");
        if (!opt.feedback.empty())
            OCTET_REQUIRE(opt.feedback.size == n, fn, "options.feedback",
                          detail::message("has ", opt.feedback.size,
                                          " elements; the residual covers the whole gradient (", n, ")"));
        for (int r = 0; r < P; ++r)
            OCTET_REQUIRE(encoded_size(cfg, allreduce_shard(cfg, n, P, r).count) < (std::size_t{1} << 31), fn, "grad",
                          "gives a shard message of 2 GiB or more; use more ranks or a smaller gradient per call");
    } catch (const error& e) {
        local_failure = 1;
        local_message = detail::text_of(e);
    }
    const bool fb = !opt.feedback.empty();
    detail::take_scratch(
        opt.executor, fn,
        [&](detail::scratch_carver& c) { return detail::carve_reduce_scatter(c, opt.executor, cfg, n, P, me, fb); },
        block, s, local_failure, local_message);
    detail::stop_every_rank_on_failure(comm, local_failure, local_message, fn);
    const detail::allreduce_descriptor d = detail::make_reduce_scatter_descriptor(cfg, n, P, opt);
    comm.allgather(&d, sizeof d, s.descriptors);
    detail::throw_unless_agreed(s.descriptors, P, fn);
    rep.agree_s = detail::seconds_since(t0);

    detail::codec_region region{s.codec, s.codec_bytes};
    host_executor codec_ex = opt.executor;
    codec_ex.allocator = region.allocator();

    // 1-3. Shards, messages, all-to-all (the all-reduce's steps).
    detail::encode_and_exchange(comm, cfg, grad, opt.feedback, opt.tamper, codec_ex, s, rep.encode_s, rep.exchange_s,
                                rep.bytes_sent, rep.bytes_received);
    const shard_range mine = s.shard[me];
    rep.shard = mine;
    rep.float_bytes = 4 * (n - mine.count);

    // 4. Validate the P messages of my shard, sum them in rotated coordinates and transform back.
    t0 = clock::now();
    std::string failure;
    try {
        const wire_layout mine_layout = wire_layout_of(cfg, mine.count);
        detail::validate_received(s, cfg, mine, mine_layout, P, me, fn);
        detail::decode_sum_of_messages(codec_ex, cfg, mine_layout, mine.begin, s.mine, s.mine_scales,
                                       static_cast<std::size_t>(P), out_shard, fn);
    } catch (const error& e) {
        failure = detail::text_of(e);
    }
    const int bad = comm.allreduce_max(failure.empty() ? 0 : me + 1);
    if (bad) {
        if (!failure.empty()) throw error(failure);  // the rank that saw it names it
        throw error(detail::message(fn, ": rank ", bad - 1, " received an invalid message; every rank stops"));
    }
    rep.reduce_s = detail::seconds_since(t0);
    return rep;
}

// ---- quantized all-gather ---------------------------------------------------------------------

namespace detail {

/// What every rank contributes to the all-gather's agreement (88 bytes). The first 72 bytes must
/// be identical on every rank; rows, amax and nonfinite are this rank's own.
struct allgather_descriptor {
    std::uint32_t magic = 0x4741434Fu;  // "OCAG"
    std::uint32_t version = 2;
    std::uint64_t cols = 0;
    std::uint64_t total_rows = 0;  ///< the whole matrix's rows (out.rows(), out_t.cols())
    std::uint64_t recipe_format = 0, recipe_policy = 0;
    std::uint64_t ld = 0;    ///< out's codes per stored row (0: no row-wise copy)
    std::uint64_t ld_t = 0;  ///< out_t's codes per stored row (0: no column-wise copy)
    std::int32_t world = 0;
    std::int32_t expected = 0;
    std::uint32_t copies = 1;  ///< 1: the row-wise copy, 2: the column-wise copy (out_t), 3: both
    std::uint32_t reserved = 0;
    // ---- this rank's own (not compared)
    std::uint64_t rows = 0;
    float amax = 0.0f;           ///< the finite amax of my_rows (per-tensor and two-level recipes)
    std::uint8_t nonfinite = 0;  ///< my_rows holds a NaN or an Inf (per-tensor recipes under nan_policy::propagate)
    std::uint8_t reserved0 = 0, reserved1 = 0, reserved2 = 0;
};
static_assert(sizeof(allgather_descriptor) == 88, "allgather_descriptor must be 88 bytes");
inline constexpr std::size_t allgather_agreed_bytes = 72;

template <class T>
constexpr std::uint64_t policy_id() {
    if constexpr (is_amax_ratio<T>::value)
        return 1 + 4 * static_cast<std::uint64_t>(T::margin);  // 1, 5, .., 129
    else if constexpr (std::is_same_v<T, scale::pow2_floor> || std::is_same_v<T, scale_storage::ue8m0> ||
                       std::is_same_v<T, round::stochastic> || std::is_same_v<T, overflow::to_nonfinite> ||
                       std::is_same_v<T, nan_policy::per_element>)
        return 2;
    else if constexpr (std::is_same_v<T, scale::pow2_ceil> || std::is_same_v<T, scale_storage::e4m3>)
        return 3;
    else if constexpr (std::is_same_v<T, scale::pow2_nearest>)
        return 4;
    else
        return 0;
}

/// The recipe as two words (format; granularity and policies), compared across ranks.
template <class Recipe>
constexpr std::uint64_t recipe_format_word() {
    using F = typename Recipe::format;
    return static_cast<std::uint64_t>(F::exponent_bits) | static_cast<std::uint64_t>(F::mantissa_bits) << 8 |
           static_cast<std::uint64_t>(static_cast<std::uint32_t>(F::bias) & 0xFFFFu) << 16 |
           static_cast<std::uint64_t>(static_cast<int>(F::special_codes)) << 32 |
           static_cast<std::uint64_t>(F::is_signed ? 1 : 0) << 40;
}
template <class Recipe>
constexpr std::uint64_t recipe_policy_word() {
    using G = typename Recipe::granularity;
    return (static_cast<std::uint64_t>(G::rows) & 0xFFFFFFu) | (static_cast<std::uint64_t>(G::cols) & 0xFFFFFFu) << 24 |
           policy_id<typename Recipe::scale_rule>() << 48 | policy_id<typename Recipe::scale_storage_type>() << 56 |
           (policy_id<typename Recipe::rounding>() != 0 ? 1ull : 0ull) << 60 |
           (policy_id<typename Recipe::overflow_policy>() != 0 ? 1ull : 0ull) << 61 |
           (policy_id<typename Recipe::nan_handling>() != 0 ? 1ull : 0ull) << 62;
}

inline const char* copies_named(std::uint32_t copies) {
    return copies == 1 ? "the row-wise copy" : copies == 2 ? "the column-wise copy" : "both copies";
}

inline std::string describe_mismatch(const allgather_descriptor& a, const allgather_descriptor& b, int ra, int rb) {
    auto line = [&](const char* what, auto va, auto vb) {
        return message(what, " differs: rank ", ra, " has ", +va, ", rank ", rb, " has ", +vb);
    };
    if (a.cols != b.cols) return line("my_rows.cols", a.cols, b.cols);
    if (a.copies != b.copies)
        return message("the copies differ: rank ", ra, " asks for ", copies_named(a.copies), ", rank ", rb, " for ",
                       copies_named(b.copies), " (pass out and out_t alike on every rank)");
    if (a.total_rows != b.total_rows)
        return line("the whole matrix's rows (out.rows(), out_t.cols())", a.total_rows, b.total_rows);
    if (a.recipe_format != b.recipe_format || a.recipe_policy != b.recipe_policy)
        return message("the recipe differs between rank ", ra, " and rank ", rb,
                       " (format, granularity, scale rule, storage, rounding or non-finite policy)");
    if (a.ld != b.ld) return line("out.layout.ld", a.ld, b.ld);
    if (a.ld_t != b.ld_t) return line("out_t.layout.ld", a.ld_t, b.ld_t);
    if (a.expected != b.expected) return line("options.expected_ranks", a.expected, b.expected);
    return "the descriptors differ";
}

/// The all-gather's host scratch on one rank, carved from one block.
struct allgather_scratch {
    allgather_descriptor* descriptors = nullptr;  ///< P
    std::size_t* code_counts = nullptr;           ///< P: every rank's bytes of codes
    std::size_t* code_off = nullptr;              ///< P: where they go in out.data
    std::size_t* scale_counts = nullptr;          ///< P: every rank's bytes of scales
    std::size_t* scale_off = nullptr;             ///< P: where they go in `gathered`
    std::uint8_t* codes = nullptr;                ///< my rows' codes (rows x row_bytes)
    std::uint8_t* scales = nullptr;               ///< my rows' scale grid (column-major, unpadded)
    std::uint8_t* gathered = nullptr;             ///< every rank's scale grid, one after another
    // the column-wise copy (out_t): my rows' columns, quantized as rows of x^T, unpadded
    std::size_t *code_counts_t = nullptr, *code_off_t = nullptr;    ///< P each
    std::size_t *scale_counts_t = nullptr, *scale_off_t = nullptr;  ///< P each
    std::uint8_t* codes_t = nullptr;           ///< my columns of x^T's codes (cols x local row_bytes)
    std::uint8_t* scales_t = nullptr;          ///< their scale grid (column-major, unpadded)
    std::uint8_t* gathered_codes_t = nullptr;  ///< every rank's, one after another
    std::uint8_t* gathered_t = nullptr;        ///< every rank's scale grid, one after another
    unsigned char* quantize = nullptr;         ///< quantize_bytes, lent to quantize
    std::size_t quantize_bytes = 0;
};

/// The layout of my rows' copy: out's rows (same ld, so the codes land in out as they are) and an
/// unpadded scale grid (so the scales are sent as they are).
template <class Recipe>
quant_layout local_layout(std::size_t rows, const quant_layout& out) {
    quant_layout l = quant_layout_of<Recipe>::make(rows, out.cols, false);
    l.ld = out.ld;
    l.row_bytes = out.row_bytes;
    l.data_bytes = rows * out.row_bytes;
    return l;
}

/// The layout of my rows' column-wise copy (x^T: cols x rows), unpadded: its codes rows of
/// ceil(rows / group_codes) groups, its scale grid without padding.
template <class Recipe>
quant_layout local_layout_t(std::size_t rows, std::size_t cols) {
    return quant_layout_of<Recipe>::make(cols, rows, false);
}

/// Describes the all-gather's scratch (arguments validated; an absent copy's layout is all zero).
/// The gathered scales are bounded by the whole grid plus one partial block per rank; the gathered
/// column-wise codes by the whole matrix's rows plus one partial packing group per rank.
template <class Recipe, class In>
allgather_scratch carve_allgather(scratch_carver& c, const host_executor& ex, const matrix_ref<const In>& x,
                                  const quant_layout& out, const quant_layout& out_t, bool want_row, bool want_col,
                                  int P) {
    using LO = quant_layout_of<Recipe>;
    const std::size_t world = static_cast<std::size_t>(P);
    allgather_scratch s;
    s.descriptors = c.take<allgather_descriptor>(world);
    s.code_counts = c.take<std::size_t>(world);
    s.code_off = c.take<std::size_t>(world);
    s.scale_counts = c.take<std::size_t>(world);
    s.scale_off = c.take<std::size_t>(world);
    quantized_ref<Recipe> local, local_t;
    if (want_row) {
        const quant_layout l = local_layout<Recipe>(x.rows, out);
        s.codes = c.take<std::uint8_t>(l.data_bytes);
        s.scales = c.take<std::uint8_t>(l.scale_bytes);
        s.gathered = c.take<std::uint8_t>((out.scale_rows + world) * out.scale_cols * Recipe::scale_bytes);
        local = quantized_ref<Recipe>(nullptr, nullptr, l, nullptr);
    }
    if (want_col) {
        const quant_layout l = local_layout_t<Recipe>(x.rows, x.cols);
        s.code_counts_t = c.take<std::size_t>(world);
        s.code_off_t = c.take<std::size_t>(world);
        s.scale_counts_t = c.take<std::size_t>(world);
        s.scale_off_t = c.take<std::size_t>(world);
        s.codes_t = c.take<std::uint8_t>(l.data_bytes);
        s.scales_t = c.take<std::uint8_t>(l.scale_bytes);
        s.gathered_codes_t =
            c.take<std::uint8_t>(out_t.rows * (out_t.cols / LO::group_codes + world + 1) * LO::group_bytes);
        s.gathered_t = c.take<std::uint8_t>((out_t.scale_cols + world) * out_t.scale_rows * Recipe::scale_bytes);
        local_t = quantized_ref<Recipe>(nullptr, nullptr, l, nullptr);
    }
    s.quantize_bytes = x.empty() ? 0 : quantize_scratch_bytes<Recipe>(ex, x, local, local_t);
    s.quantize = c.take<unsigned char>(s.quantize_bytes);
    return s;
}

template <class Recipe>
constexpr void check_allgather_recipe() {
    using G = typename Recipe::granularity;
    static_assert(!(G::rows == full && G::cols != full),
                  "octet::quantized_allgather_host: blocks that span every row (per_column, block<full, C>) need "
                  "each column's amax over every rank; use per_tensor, a row-local recipe (per_row, block<1, C>) or "
                  "block<R, C> with shards on multiples of R rows");
    static_assert(!std::is_same_v<typename Recipe::rounding, round::stochastic>,
                  "octet::quantized_allgather_host: stochastic rounding draws from each element's index in the "
                  "matrix it quantizes, which a shard does not know; use round::nearest_even");
}

template <class Recipe>
constexpr void check_allgather_columnwise_recipe() {
    using G = typename Recipe::granularity;
    static_assert(!(G::cols == full && G::rows != full),
                  "octet::quantized_allgather_host (out_t): the column-wise copy's blocks would span every row of the "
                  "matrix (a per_row recipe quantizes x^T per column of x), which needs each column's amax over every "
                  "rank; use per_tensor or block<R, C> (1x128, MXFP8, NVFP4, 128x128) with shards on multiples of C "
                  "rows, or gather the row-wise copy only");
}

/// The block of whole rows a rank's rows must start (and, but for the last rank, end) on for a
/// copy: R of the row-wise copy's block<R, C>, C of the column-wise copy's (x^T's blocks run C
/// along x's rows), the packing group of a sub-byte column-wise copy, at least 1.
template <class Recipe>
constexpr std::size_t row_granule(bool want_row, bool want_col) {
    using G = typename Recipe::granularity;
    std::size_t r = 1;
    if (want_row && G::rows != full && G::rows > 1) r = G::rows;
    if (want_col) {
        const std::size_t c = G::cols != full ? G::cols : quant_layout_of<Recipe>::group_codes;
        r = r > c ? r : c;  // every granule here divides the other (powers of two, 128, 1x16, ...)
    }
    return r;
}

/// The checks of the ranks' rows that every rank makes alike once it has all descriptors (host and
/// NCCL all-gathers): together they are the destination's `out_rows` rows (out's rows, or out_t's
/// columns), and each rank's rows start on a multiple of row_granule and end on one (the last may
/// end at the matrix's end). Throws octet::error naming the rank and the fix. rows_of(r): rank r's rows.
template <class Recipe, class RowsOf>
void check_gathered_rows(const char* fn, int P, RowsOf&& rows_of, std::size_t total, std::size_t out_rows,
                         std::size_t cols, bool want_row, bool want_col) {
    if (total != out_rows)
        throw error(message(fn, ": ", want_row ? "out has " : "out_t has ", out_rows, want_row ? " rows" : " columns",
                            " but the ranks hold ", total,
                            " rows together; pass out with quant_layout_of<Recipe>::make(", total, ", ", cols,
                            ") (out_t: make(", cols, ", ", total, ")) on every rank"));
    const std::size_t granule = row_granule<Recipe>(want_row, want_col);
    if (granule <= 1) return;
    std::size_t begin = 0;
    for (int r = 0; r < P; ++r) {
        const std::size_t m = rows_of(r), end = begin + m;
        if (m > 0 && (begin % granule != 0 || (end % granule != 0 && end != total)))
            throw error(message(
                fn, ": my_rows of rank ", r, " are rows [", begin, ", ", end, ") of the matrix, but the ",
                want_col ? "copies' blocks (the column-wise copy's run along the rows) need" : "recipe's blocks need",
                " every rank's rows to start on a multiple of ", granule,
                " and end on one (the last rows may end at the matrix's end, row ", total,
                "); give every rank a multiple of ", granule, " rows (the last one the rest)",
                want_col ? ", or gather the row-wise copy only" : ", or use a row-local recipe (block<1, C>)"));
        begin = end;
    }
}

/// Places rank r's gathered column-wise codes (rows of x^T, m codes each from column `begin`)
/// into out_t's rows; `begin` is a multiple of the packing group.
template <class Recipe>
void place_columns(const std::uint8_t* src, std::size_t m, std::size_t begin, std::size_t cols,
                   quantized_ref<Recipe> out_t) {
    using LO = quant_layout_of<Recipe>;
    const std::size_t local_bytes = local_layout_t<Recipe>(m, cols).row_bytes;
    const std::size_t at = LO::bytes_for_codes(begin);
    for (std::size_t i = 0; i < cols; ++i)
        std::memcpy(out_t.data + i * out_t.layout.row_bytes + at, src + i * local_bytes, local_bytes);
}

template <class Recipe, class Transport, class In>
quantized_allgather_report quantized_allgather_impl(Transport& comm, const host_executor& ex,
                                                    const matrix_ref<const In>& x, quantized_ref<Recipe> out,
                                                    quantized_ref<Recipe> out_t, const quantized_allgather_options& opt,
                                                    const char* fn) {
    using G = typename Recipe::granularity;
    using clock = std::chrono::steady_clock;
    const int P = comm.size(), me = comm.rank();
    const std::size_t world = static_cast<std::size_t>(P);
    constexpr bool tensor_amax = Recipe::is_per_tensor || Recipe::two_level;
    constexpr bool whole_nan = Recipe::is_per_tensor && Recipe::propagates_nan;
    const bool want_row = !out.absent(), want_col = !out_t.absent();
    quantized_allgather_report rep;
    rep.world = P;
    auto t0 = clock::now();

    // 0. Validate locally, measure the amax, take the scratch; exchange the failure flag; agree.
    std::optional<host_scratch> block;
    allgather_scratch s;
    allgather_descriptor d;
    int local_failure = 0;
    std::string local_message;
    try {
        allreduce_options ao;
        ao.expected_ranks = opt.expected_ranks;
        check_expected_ranks(ao, P, fn);
        validate_input(x, fn, "my_rows");
        OCTET_REQUIRE(want_row || want_col, fn, "out and out_t",
                      "are both absent ({}); pass the row-wise copy (out), the column-wise copy (out_t) or both");
        if (want_row) {
            OCTET_REQUIRE(out.layout.cols == x.cols && out.layout.rows >= x.rows, fn, "out",
                          message("has shape ", out.layout.rows, " x ", out.layout.cols,
                                  "; it must be the whole matrix: (the sum of every rank's rows) x ", x.cols,
                                  " (my_rows.cols), built with quant_layout_of<Recipe>::make"));
            validate_output(out, out.layout.rows, out.layout.cols, fn, "out");
        }
        if (want_col) {
            OCTET_REQUIRE(out_t.layout.rows == x.cols && out_t.layout.cols >= x.rows, fn, "out_t",
                          message("has shape ", out_t.layout.rows, " x ", out_t.layout.cols,
                                  "; it must be the whole matrix's transpose: ", x.cols,
                                  " (my_rows.cols) x (the sum of every rank's rows), built with "
                                  "quant_layout_of<Recipe>::make"));
            OCTET_REQUIRE(!want_row || out_t.layout.cols == out.layout.rows, fn, "out_t",
                          message("has ", out_t.layout.cols, " columns and out ", out.layout.rows,
                                  " rows; out_t is the transpose of out's matrix"));
            validate_output(out_t, out_t.layout.rows, out_t.layout.cols, fn, "out_t");
        }
        d.cols = x.cols;
        d.total_rows = want_row ? out.layout.rows : out_t.layout.cols;
        d.recipe_format = recipe_format_word<Recipe>();
        d.recipe_policy = recipe_policy_word<Recipe>();
        d.ld = want_row ? out.layout.ld : 0;
        d.ld_t = want_col ? out_t.layout.ld : 0;
        d.copies = (want_row ? 1u : 0u) | (want_col ? 2u : 0u);
        d.world = P;
        d.expected = opt.expected_ranks;
        d.rows = x.rows;
        if constexpr (tensor_amax)
            if (!x.empty()) d.amax = tensor_amax_host(ex, x);
        if constexpr (whole_nan)
            for (std::size_t i = 0; i < x.rows && !d.nonfinite; ++i)
                for (std::size_t j = 0; j < x.cols; ++j)
                    if (!std::isfinite(as_float(x(i, j)))) {
                        d.nonfinite = 1;
                        break;
                    }
    } catch (const error& e) {
        local_failure = 1;
        local_message = text_of(e);
    }
    const quant_layout no_layout{};
    take_scratch(
        ex, fn,
        [&](scratch_carver& c) {
            return carve_allgather<Recipe, In>(c, ex, x, want_row ? out.layout : no_layout,
                                               want_col ? out_t.layout : no_layout, want_row, want_col, P);
        },
        block, s, local_failure, local_message);
    stop_every_rank_on_failure(comm, local_failure, local_message, fn);
    comm.allgather(&d, sizeof d, s.descriptors);
    for (int r = 1; r < P; ++r)
        if (std::memcmp(&s.descriptors[0], &s.descriptors[r], allgather_agreed_bytes) != 0)
            throw error(message(fn, ": the ranks disagree on the call (mismatched descriptors): ",
                                describe_mismatch(s.descriptors[0], s.descriptors[r], 0, r),
                                "; every rank must pass the same cols, recipe, out / out_t shapes and options"));
    // Every rank decides the rest from the same descriptors: the same decision everywhere.
    std::size_t total = 0, offset = 0;
    float amax = 0.0f;
    int nan_rank = -1, first_nonempty = -1;
    for (int r = 0; r < P; ++r) {
        const allgather_descriptor& dr = s.descriptors[r];
        if (r == me) offset = total;
        total += static_cast<std::size_t>(dr.rows);
        amax = std::max(amax, dr.amax);
        if (dr.nonfinite && nan_rank < 0) nan_rank = r;
        if (dr.rows > 0 && first_nonempty < 0) first_nonempty = r;
    }
    check_gathered_rows<Recipe>(
        fn, P, [&](int r) { return static_cast<std::size_t>(s.descriptors[r].rows); }, total,
        static_cast<std::size_t>(d.total_rows), x.cols, want_row, want_col);
    rep.row_offset = offset;
    rep.rows = total;
    rep.amax = amax;
    rep.agree_s = seconds_since(t0);
    if (total == 0 || x.cols == 0) return rep;  // quantize writes nothing for an empty matrix

    // 1. Quantize my rows (and their transpose) with the whole matrix's amax (scratch from the block).
    t0 = clock::now();
    float local_tensor_scale = 1.0f, local_tensor_scale_t = 1.0f;
    quantized_ref<Recipe> local, local_t;
    if (want_row)
        local = quantized_ref<Recipe>(s.codes, s.scales, local_layout<Recipe>(x.rows, out.layout), &local_tensor_scale);
    if (want_col)
        local_t =
            quantized_ref<Recipe>(s.codes_t, s.scales_t, local_layout_t<Recipe>(x.rows, x.cols), &local_tensor_scale_t);
    if (!x.empty()) {
        codec_region region{s.quantize, s.quantize_bytes};
        host_executor qex = ex;
        qex.allocator = region.allocator();
        quantize_options qo;
        if constexpr (tensor_amax) qo.tensor_amax = amax;
        quantize<Recipe>(qex, x, local, local_t, qo);
    }
    rep.quantize_s = seconds_since(t0);

    // 2. All-gather the codes (row-wise: straight into out) and the scale grids; place them.
    t0 = clock::now();
    const std::size_t sb = Recipe::scale_bytes;
    std::size_t mine = 0, every = 0;  // bytes: this rank's, every rank's together
    if (want_row) {
        const std::size_t sc = out.layout.scale_cols;
        std::size_t code_total = 0, scale_total = 0;
        for (int r = 0; r < P; ++r) {
            const std::size_t m = static_cast<std::size_t>(s.descriptors[r].rows);
            s.code_counts[r] = m * out.layout.row_bytes;
            s.code_off[r] = code_total;
            s.scale_counts[r] = block_count(G::rows, m) * sc * sb;
            s.scale_off[r] = scale_total;
            code_total += s.code_counts[r];
            scale_total += s.scale_counts[r];
        }
        comm.allgatherv(s.codes, s.code_counts[me], out.data, s.code_counts, s.code_off);
        comm.allgatherv(s.scales, s.scale_counts[me], s.gathered, s.scale_counts, s.scale_off);
        mine += s.code_counts[me] + s.scale_counts[me];
        every += code_total + scale_total;
    }
    if (want_col) {
        const std::size_t cols = x.cols, srt = out_t.layout.scale_rows;  // x^T's rows of blocks
        std::size_t code_total = 0, scale_total = 0;
        for (int r = 0; r < P; ++r) {
            const std::size_t m = static_cast<std::size_t>(s.descriptors[r].rows);
            const quant_layout lr = local_layout_t<Recipe>(m, cols);
            s.code_counts_t[r] = m ? lr.data_bytes : 0;
            s.code_off_t[r] = code_total;
            s.scale_counts_t[r] = m ? lr.scale_cols * srt * sb : 0;
            s.scale_off_t[r] = scale_total;
            code_total += s.code_counts_t[r];
            scale_total += s.scale_counts_t[r];
        }
        comm.allgatherv(s.codes_t, s.code_counts_t[me], s.gathered_codes_t, s.code_counts_t, s.code_off_t);
        comm.allgatherv(s.scales_t, s.scale_counts_t[me], s.gathered_t, s.scale_counts_t, s.scale_off_t);
        mine += s.code_counts_t[me] + s.scale_counts_t[me];
        every += code_total + scale_total;
    }
    rep.gather_s = seconds_since(t0);
    rep.bytes_sent = (world - 1) * mine;
    rep.bytes_received = every - mine;
    rep.float_bytes_sent = (world - 1) * x.rows * x.cols * sizeof(float);
    rep.bf16_bytes_sent = rep.float_bytes_sent / 2;

    if (want_row) {
        const std::size_t sc = out.layout.scale_cols;
        std::fill(out.scales, out.scales + out.layout.scale_bytes, std::uint8_t{0});
        if constexpr (G::rows == full) {
            // One grid row, the same on every rank with rows; a NaN on any rank makes the whole copy
            // NaN (its scale, zero codes), as quantize of the whole matrix does.
            const int from = nan_rank >= 0 ? nan_rank : first_nonempty;
            std::memcpy(out.scales, s.gathered + s.scale_off[from], sc * sb);
            if (nan_rank >= 0) std::fill(out.data, out.data + total * out.layout.row_bytes, std::uint8_t{0});
        } else {
            std::size_t begin = 0;
            for (int r = 0; r < P; ++r) {
                const std::size_t m = static_cast<std::size_t>(s.descriptors[r].rows);
                const std::size_t lr = block_count(G::rows, m), b0 = begin / G::rows;
                const std::uint8_t* src = s.gathered + s.scale_off[r];
                for (std::size_t bj = 0; bj < sc; ++bj)
                    if (lr) std::memcpy(out.scales + (bj * out.layout.scale_ld + b0) * sb, src + bj * lr * sb, lr * sb);
                begin += m;
            }
        }
        if constexpr (Recipe::two_level) *out.tensor_scale = make_tensor_scale<Recipe>(amax);
    }
    if (want_col) {
        // x^T's rows hold every rank's columns side by side (padding codes zero, as quantize writes
        // them); its block columns are the ranks' (x's rows start on multiples of C).
        const std::size_t cols = x.cols, srt = out_t.layout.scale_rows;
        std::fill(out_t.data, out_t.data + out_t.layout.data_bytes, std::uint8_t{0});
        std::fill(out_t.scales, out_t.scales + out_t.layout.scale_bytes, std::uint8_t{0});
        if constexpr (G::cols == full) {  // per tensor (per_row is refused at compile time)
            const int from = nan_rank >= 0 ? nan_rank : first_nonempty;
            std::memcpy(out_t.scales, s.gathered_t + s.scale_off_t[from], sb);
        }
        std::size_t begin = 0;
        for (int r = 0; r < P; ++r) {
            const std::size_t m = static_cast<std::size_t>(s.descriptors[r].rows);
            if (m > 0 && !(G::cols == full && nan_rank >= 0))
                place_columns<Recipe>(s.gathered_codes_t + s.code_off_t[r], m, begin, cols, out_t);
            if constexpr (G::cols != full) {
                const std::size_t lc = block_count(G::cols, m), b0 = begin / G::cols;
                for (std::size_t bj = 0; bj < lc; ++bj)
                    std::memcpy(out_t.scales + (b0 + bj) * out_t.layout.scale_ld * sb,
                                s.gathered_t + s.scale_off_t[r] + bj * srt * sb, srt * sb);
            }
            begin += m;
        }
        if constexpr (Recipe::two_level) *out_t.tensor_scale = make_tensor_scale<Recipe>(amax);
    }
    return rep;
}

}  // namespace detail

template <class Recipe, class T>
std::size_t quantized_allgather_scratch_bytes(const host_executor& ex, matrix_ref<T> my_rows, quantized_ref<Recipe> out,
                                              int world) {
    return quantized_allgather_scratch_bytes<Recipe>(ex, my_rows, out, quantized_ref<Recipe>{}, world);
}

template <class Recipe, class T>
std::size_t quantized_allgather_scratch_bytes(const host_executor& ex, matrix_ref<T> my_rows, quantized_ref<Recipe> out,
                                              quantized_ref<Recipe> out_t, int world) {
    detail::check_allgather_recipe<Recipe>();
    using In = std::remove_const_t<T>;
    const matrix_ref<const In> x(my_rows.data, my_rows.rows, my_rows.cols, my_rows.ld, my_rows.order);
    OCTET_REQUIRE(world >= 1, "octet::quantized_allgather_scratch_bytes", "world",
                  detail::message("is ", world, "; a communicator has at least one rank"));
    detail::scratch_carver c;
    detail::carve_allgather<Recipe, In>(c, ex, x, out.layout, out_t.layout, !out.absent(), !out_t.absent(), world);
    return c.bytes();
}

template <class Recipe, class Transport, class T>
quantized_allgather_report quantized_allgather_host(Transport& comm, const host_executor& ex, matrix_ref<T> my_rows,
                                                    quantized_ref<Recipe> out, const quantized_allgather_options& opt,
                                                    const char* fn) {
    detail::check_allgather_recipe<Recipe>();
    using In = std::remove_const_t<T>;
    static_assert(detail::is_quant_input_v<In>, "octet::quantized_allgather_host: my_rows must be float, bf16 or fp16");
    const matrix_ref<const In> x(my_rows.data, my_rows.rows, my_rows.cols, my_rows.ld, my_rows.order);
    return detail::quantized_allgather_impl<Recipe>(comm, ex, x, out, quantized_ref<Recipe>{}, opt, fn);
}

template <class Recipe, class Transport, class T>
quantized_allgather_report quantized_allgather_host(Transport& comm, const host_executor& ex, matrix_ref<T> my_rows,
                                                    quantized_ref<Recipe> out, quantized_ref<Recipe> out_t,
                                                    const quantized_allgather_options& opt, const char* fn) {
    detail::check_allgather_recipe<Recipe>();
    detail::check_allgather_columnwise_recipe<Recipe>();
    using In = std::remove_const_t<T>;
    static_assert(detail::is_quant_input_v<In>, "octet::quantized_allgather_host: my_rows must be float, bf16 or fp16");
    const matrix_ref<const In> x(my_rows.data, my_rows.rows, my_rows.cols, my_rows.ld, my_rows.order);
    return detail::quantized_allgather_impl<Recipe>(comm, ex, x, out, out_t, opt, fn);
}

}  // namespace octet
