// octet/nn/detail/moe_exchange.hpp: the implementation of octet/nn/moe_exchange.hpp (included at its
// end; the declarations and the contract are there): the agreement, the scratch, and the packing and
// unpacking of the rows each exchange moves.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>

#include "octet/comm/allreduce.hpp"
#include "octet/comm/sharded.hpp"
#include "octet/core/check.hpp"
#include "octet/nn/moe_exchange.hpp"
#include "octet/quant/quantize.hpp"

namespace octet {

inline std::size_t moe_exchange_ref::rows() const {
    std::size_t n = 0;
    for (std::size_t e : expert_rows) n += e;
    return n;
}

inline moe_row_source moe_exchange_ref::source_of(std::size_t i) const {
    const std::size_t L = local_experts();
    OCTET_REQUIRE(i < rows(), "octet::moe_exchange_ref::source_of", "i",
                  detail::message("is ", i, "; this rank received ", rows(), " rows"));
    std::size_t e = 0;
    while (i >= expert_rows[e]) i -= expert_rows[e++];
    for (int q = 0; q < world; ++q) {
        const std::size_t c = recv_counts[static_cast<std::size_t>(q) * L + e];
        if (i < c) return {q, first_expert() + e, i};
        i -= c;
    }
    return {};  // not reached: expert_rows[e] is the sum of its recv_counts
}

template <class Recipe>
std::size_t moe_dispatch_row_bytes(std::size_t d) {
    using Q = quant_layout_of<Recipe>;
    const std::size_t codes = (d + Q::group_codes - 1) / Q::group_codes * Q::group_bytes;
    return codes + block_count(Recipe::granularity::cols, d) * Recipe::scale_bytes;
}

inline std::size_t moe_combine_row_bytes(std::size_t d, moe_combine_wire wire) {
    return wire == moe_combine_wire::bf16  ? d * sizeof(bf16)
           : wire == moe_combine_wire::f32 ? d * sizeof(float)
                                           : moe_dispatch_row_bytes<recipes::blockwise_1x128>(d);
}

namespace detail {

enum class moe_exchange_op : std::uint32_t { plan = 1, dispatch = 2, combine = 3, dispatch_rows = 4 };

/// What every rank contributes to an exchange's agreement (64 bytes, compared byte for byte).
struct moe_exchange_descriptor {
    std::uint32_t magic = 0x584D434Fu;  // "OCMX"
    std::uint32_t version = 1;
    std::uint32_t op = 0;  ///< moe_exchange_op: which entry the rank called
    std::int32_t world = 0;
    std::int32_t expected = 0;
    std::uint32_t wire = 0;  ///< the combine's moe_combine_wire + 1 (0 elsewhere)
    std::uint64_t experts = 0;
    std::uint64_t cols = 0;  ///< d (0 for the plan)
    std::uint64_t recipe_format = 0, recipe_policy = 0;
    std::uint64_t reserved = 0;
};
static_assert(sizeof(moe_exchange_descriptor) == 64, "moe_exchange_descriptor must be 64 bytes");

inline const char* moe_op_name(std::uint32_t op) {
    return op == 1   ? "moe_dispatch_plan_host"
           : op == 2 ? "moe_dispatch_host"
           : op == 3 ? "moe_combine_host"
           : op == 4 ? "moe_dispatch_rows_host"
                     : "?";
}

inline std::string describe_mismatch(const moe_exchange_descriptor& a, const moe_exchange_descriptor& b, int ra,
                                     int rb) {
    auto line = [&](const char* what, auto va, auto vb) {
        return message(what, " differs: rank ", ra, " has ", +va, ", rank ", rb, " has ", +vb);
    };
    if (a.op != b.op)
        return message("rank ", ra, " called ", moe_op_name(a.op), ", rank ", rb, " called ", moe_op_name(b.op));
    if (a.world != b.world) return line("the world size of xch", a.world, b.world);
    if (a.experts != b.experts) return line("the expert count (xch.experts, plan.experts)", a.experts, b.experts);
    if (a.cols != b.cols) return line("the row width d", a.cols, b.cols);
    if (a.recipe_format != b.recipe_format || a.recipe_policy != b.recipe_policy)
        return message("the recipe differs between rank ", ra, " and rank ", rb);
    if (a.wire != b.wire) return line("options.combine_wire", a.wire - 1, b.wire - 1);
    if (a.expected != b.expected) return line("options.expected_ranks", a.expected, b.expected);
    return "the descriptors differ";
}

/// One exchange's host scratch, carved from one block.
struct moe_exchange_scratch {
    moe_exchange_descriptor* descriptors = nullptr;  ///< P
    std::uint64_t* mine = nullptr;                   ///< this rank's counts (E, or 2 E: sent, then claimed)
    std::uint64_t* counts = nullptr;                 ///< P of those, gathered
    std::size_t* send_counts = nullptr;              ///< P, bytes
    std::size_t* send_off = nullptr;                 ///< P
    std::size_t* recv_counts = nullptr;              ///< P
    std::size_t* recv_off = nullptr;                 ///< P
    std::size_t* expert_off = nullptr;               ///< L + 1: first received row of each local expert
    std::size_t* block_row = nullptr;  ///< P L: where rank q's rows of local expert e start in the receive buffer
    std::uint8_t* send = nullptr;
    std::uint8_t* recv = nullptr;
    // the FP8 combine
    std::uint8_t *y_codes = nullptr, *y_scales = nullptr;  ///< y's 1x128 copy (xch.rows() x d, unpadded)
    std::uint8_t *r_codes = nullptr, *r_scales = nullptr;  ///< the received rows' copy (plan.rows() x d)
    float* r_float = nullptr;                              ///< their dequantized floats
    unsigned char* quantize = nullptr;                     ///< quantize_bytes, lent to quantize
    std::size_t quantize_bytes = 0;
};

struct moe_exchange_sizes {
    std::size_t world = 0, experts = 0, local = 0, count_words = 0;  ///< count_words: per rank, E or 2 E
    std::size_t send_bytes = 0, recv_bytes = 0;
    std::size_t y_rows = 0, r_rows = 0, cols = 0;  ///< the FP8 combine's copies (0 rows: none)
    std::size_t float_rows = 0;                    ///< the FP8 combine's dequantized rows (0: into options.returned)
};

/// Describes an exchange's scratch (arguments validated); quantize_bytes is the quantizer's (FP8 combine).
inline moe_exchange_scratch carve_moe_exchange(scratch_carver& c, const moe_exchange_sizes& z,
                                               std::size_t quantize_bytes) {
    moe_exchange_scratch s;
    s.descriptors = c.take<moe_exchange_descriptor>(z.world);
    s.mine = c.take<std::uint64_t>(z.count_words);
    s.counts = c.take<std::uint64_t>(z.world * z.count_words);
    s.send_counts = c.take<std::size_t>(z.world);
    s.send_off = c.take<std::size_t>(z.world);
    s.recv_counts = c.take<std::size_t>(z.world);
    s.recv_off = c.take<std::size_t>(z.world);
    s.expert_off = c.take<std::size_t>(z.local + 1);
    s.block_row = c.take<std::size_t>(z.world * z.local);
    s.send = c.take<std::uint8_t>(z.send_bytes);
    s.recv = c.take<std::uint8_t>(z.recv_bytes);
    if (z.y_rows + z.r_rows + z.float_rows > 0 && z.cols > 0) {
        using Q = quant_layout_of<recipes::blockwise_1x128>;
        const quant_layout ly = Q::make(z.y_rows, z.cols, false), lr = Q::make(z.r_rows, z.cols, false);
        s.y_codes = c.take<std::uint8_t>(ly.data_bytes);
        s.y_scales = c.take<std::uint8_t>(ly.scale_bytes);
        s.r_codes = c.take<std::uint8_t>(lr.data_bytes);
        s.r_scales = c.take<std::uint8_t>(lr.scale_bytes);
        s.r_float = c.take<float>(z.float_rows * z.cols);
    }
    s.quantize_bytes = quantize_bytes;
    s.quantize = c.take<unsigned char>(quantize_bytes);
    return s;
}

/// The checks every entry makes of the record and the plan (locally; octet::error names the argument).
/// with_counts: the plan is built and the record filled (dispatch, combine): their counts must sum.
inline void check_moe_exchange(const char* fn, int P, int me, const dispatch_plan_ref& plan,
                               const moe_exchange_ref& xch, bool with_counts) {
    OCTET_REQUIRE(xch.world == P, fn, "xch",
                  message("was built for ", xch.world, " ranks but the communicator has ", P,
                          "; build moe_exchange(comm.size(), comm.rank(), experts)"));
    OCTET_REQUIRE(xch.rank == me, fn, "xch",
                  message("was built for rank ", xch.rank, " but this is rank ", me,
                          "; build moe_exchange(comm.size(), comm.rank(), experts)"));
    const std::size_t world = static_cast<std::size_t>(P);
    OCTET_REQUIRE(xch.experts >= 1 && xch.experts % world == 0, fn, "xch.experts",
                  message("is ", xch.experts, "; expert parallelism over ", P,
                          " ranks needs a positive multiple of the rank count (each rank owns E / P experts)"));
    OCTET_REQUIRE(plan.experts == xch.experts, fn, "plan",
                  message("routes over ", plan.experts, " experts but xch is for ", xch.experts,
                          "; route over every rank's experts (E in all) on every rank"));
    const std::size_t L = xch.local_experts();
    OCTET_REQUIRE(xch.recv_counts.size() == world * L && xch.expert_rows.size() == L, fn, "xch",
                  message("has ", xch.recv_counts.size(), " receive counts and ", xch.expert_rows.size(),
                          " expert rows; they must be E = ", world * L, " and E / P = ", L, " (moe_exchange)"));
    check_plan(fn, plan);
    if (!with_counts) return;
    OCTET_REQUIRE(plan.group_offsets[0] == 0, fn, "plan.group_offsets",
                  message("starts at ", plan.group_offsets[0], "; it must start at 0 (plan_dispatch)"));
    for (std::size_t e = 0; e < plan.experts; ++e)
        OCTET_REQUIRE(plan.group_offsets[e + 1] >= plan.group_offsets[e] &&
                          plan.group_offsets[e + 1] - plan.group_offsets[e] == plan.group_sizes[e],
                      fn, "plan.group_sizes",
                      message("[", e, "] is ", plan.group_sizes[e], " but the offsets give expert ", e, " ",
                              plan.group_offsets[e + 1] - plan.group_offsets[e],
                              " rows: the counts do not sum to the offsets (build the plan with plan_dispatch)"));
    OCTET_REQUIRE(plan.rows() <= plan.assignments(), fn, "plan",
                  message("has ", plan.rows(), " rows for ", plan.assignments(), " assignments"));
    for (std::size_t r = 0; r < plan.rows(); ++r)
        OCTET_REQUIRE(
            plan.order[r] >= 0 && static_cast<std::size_t>(plan.order[r]) < plan.assignments(), fn, "plan.order",
            message("[", r, "] is ", plan.order[r], "; assignments are 0 .. tokens k - 1 = ", plan.assignments() - 1,
                    " (build the plan with plan_dispatch)"));
    for (std::size_t a = 0; a < plan.assignments(); ++a)
        OCTET_REQUIRE(plan.row_of[a] >= -1 && plan.row_of[a] < static_cast<std::int64_t>(plan.rows()), fn,
                      "plan.row_of",
                      message("[", a, "] is ", plan.row_of[a], "; rows are -1 (dropped) or 0 .. ", plan.rows(),
                              " - 1 (build the plan with plan_dispatch)"));
    for (std::size_t e = 0; e < L; ++e) {
        std::size_t sum = 0;
        for (std::size_t q = 0; q < world; ++q) sum += xch.recv_counts[q * L + e];
        OCTET_REQUIRE(sum == xch.expert_rows[e], fn, "xch.expert_rows",
                      message("[", e, "] is ", xch.expert_rows[e], " but its receive counts sum to ", sum,
                              "; pass the record moe_dispatch_plan_host filled for this plan"));
    }
}

/// The transports count bytes in int (MPI): the rows a rank sends or receives in one call stay below 2 GiB.
inline void check_exchange_bytes(const char* fn, const char* arg, std::size_t rows_sent, std::size_t rows_received,
                                 std::size_t row_bytes) {
    constexpr std::size_t limit = std::size_t{1} << 31;
    OCTET_REQUIRE(rows_sent < limit / std::max<std::size_t>(row_bytes, 1) &&
                      rows_received < limit / std::max<std::size_t>(row_bytes, 1),
                  fn, arg,
                  message("gives ", rows_sent, " rows to send and ", rows_received, " to receive of ", row_bytes,
                          " bytes each: 2 GiB or more in one call (MPI counts are int); split the batch"));
}

/// Step 0's collective half: the failure flag, then the descriptors (every rank throws on a mismatch),
/// then every rank's counts: plan.group_sizes (what it sends to each expert) and, when `claimed`, the
/// record's recv_counts (what it expects from each rank); the claims must match what the others send.
template <class Transport>
void agree_moe_exchange(Transport& comm, const moe_exchange_scratch& s, const moe_exchange_descriptor& d,
                        const dispatch_plan_ref& plan, const moe_exchange_ref& xch, bool claimed, int local_failure,
                        const std::string& local_message, const char* fn) {
    stop_every_rank_on_failure(comm, local_failure, local_message, fn);
    const int P = comm.size();
    comm.allgather(&d, sizeof d, s.descriptors);
    for (int r = 1; r < P; ++r)
        if (std::memcmp(&s.descriptors[0], &s.descriptors[r], sizeof d) != 0)
            throw error(message(fn, ": the ranks disagree on the call (mismatched descriptors): ",
                                describe_mismatch(s.descriptors[0], s.descriptors[r], 0, r),
                                "; every rank must pass the same world, experts, d, recipe and options"));
    const std::size_t E = xch.experts, L = xch.local_experts(), words = claimed ? 2 * E : E;
    for (std::size_t e = 0; e < E; ++e) {
        s.mine[e] = plan.group_sizes[e];
        if (claimed) s.mine[E + e] = xch.recv_counts[e];
    }
    comm.allgather(s.mine, words * sizeof(std::uint64_t), s.counts);
    if (!claimed) return;
    for (int r = 0; r < P; ++r)
        for (int q = 0; q < P; ++q)
            for (std::size_t e = 0; e < L; ++e) {
                const std::uint64_t want = s.counts[static_cast<std::size_t>(q) * words + r * L + e];
                const std::uint64_t have = s.counts[static_cast<std::size_t>(r) * words + E + q * L + e];
                if (want != have)
                    throw error(message(fn, ": the exchange record of rank ", r, " expects ", have, " rows of expert ",
                                        r * L + e, " from rank ", q, ", which sends ", want,
                                        "; every rank must pass the plan and the record of the same "
                                        "moe_dispatch_plan_host call (every rank stops)"));
            }
}

/// The receive buffer's rows in the grouped order: expert_off (where each local expert's rows start)
/// and block_row (where rank q's rows of local expert e start in the buffer: q's rows one block after
/// another, each block expert by expert).
inline void moe_received_offsets(const moe_exchange_ref& xch, const moe_exchange_scratch& s) {
    const std::size_t P = static_cast<std::size_t>(xch.world), L = xch.local_experts();
    s.expert_off[0] = 0;
    for (std::size_t e = 0; e < L; ++e) s.expert_off[e + 1] = s.expert_off[e] + xch.expert_rows[e];
    std::size_t row = 0;
    for (std::size_t q = 0; q < P; ++q)
        for (std::size_t e = 0; e < L; ++e) {
            s.block_row[q * L + e] = row;
            row += xch.recv_counts[q * L + e];
        }
}

/// The receive buffer's row of received row i (grouped order).
inline std::size_t moe_buffer_row(const moe_exchange_ref& xch, const moe_exchange_scratch& s, std::size_t i) {
    const std::size_t P = static_cast<std::size_t>(xch.world), L = xch.local_experts();
    const std::size_t e =
        static_cast<std::size_t>(std::upper_bound(s.expert_off, s.expert_off + L + 1, i) - s.expert_off - 1);
    std::size_t j = i - s.expert_off[e];
    for (std::size_t q = 0; q < P; ++q) {
        const std::size_t c = xch.recv_counts[q * L + e];
        if (j < c) return s.block_row[q * L + e] + j;
        j -= c;
    }
    return 0;  // not reached (the counts were checked)
}

template <class Recipe>
constexpr void check_moe_exchange_recipe() {
    static_assert(Recipe::granularity::rows == 1 && !Recipe::two_level,
                  "octet::moe_dispatch_host: the rows must be quantized with a row-local recipe with one level of "
                  "scales (per_row or block<1, C>: recipes::blockwise_1x128, recipes::mxfp8_e4m3): a token's codes "
                  "and scales are its own, so they can travel alone (a per-tensor or NVFP4 tensor scale differs "
                  "between ranks)");
}

template <class Recipe, class Byte>
moe_exchange_sizes moe_dispatch_sizes(const quantized_ref<Recipe, Byte>& x, const dispatch_plan_ref& plan,
                                      const moe_exchange_ref& xch) {
    moe_exchange_sizes z;
    z.world = static_cast<std::size_t>(xch.world);
    z.experts = xch.experts;
    z.local = xch.local_experts();
    z.count_words = 2 * xch.experts;
    const std::size_t row = moe_dispatch_row_bytes<Recipe>(x.cols());
    z.send_bytes = plan.rows() * row;
    z.recv_bytes = xch.rows() * row;
    return z;
}

template <class Y>
moe_exchange_sizes moe_combine_sizes(const matrix_ref<Y>& y, const dispatch_plan_ref& plan, const moe_exchange_ref& xch,
                                     moe_combine_wire wire, bool into_returned) {
    moe_exchange_sizes z;
    z.world = static_cast<std::size_t>(xch.world);
    z.experts = xch.experts;
    z.local = xch.local_experts();
    z.count_words = 2 * xch.experts;
    const std::size_t row = moe_combine_row_bytes(y.cols, wire);
    z.send_bytes = xch.rows() * row;
    z.recv_bytes = plan.rows() * row;
    if (wire == moe_combine_wire::e4m3_1x128) {
        z.y_rows = xch.rows();
        z.r_rows = plan.rows();
        z.float_rows = into_returned ? 0 : plan.rows();
        z.cols = y.cols;
    }
    return z;
}

/// quantize's scratch for y's 1x128 copy (the FP8 combine), 0 when there is nothing to quantize.
template <class Y>
std::size_t moe_combine_quantize_bytes(const host_executor& ex, const matrix_ref<Y>& y, moe_combine_wire wire) {
    using R = recipes::blockwise_1x128;
    if (wire != moe_combine_wire::e4m3_1x128 || y.rows == 0 || y.cols == 0) return 0;
    const quantized_ref<R> local(nullptr, nullptr, quant_layout_of<R>::make(y.rows, y.cols, false), nullptr);
    return quantize_scratch_bytes<R>(ex, y, local);
}

inline void moe_report_rows(moe_exchange_report& rep, const moe_exchange_scratch& s, int P, int me, std::size_t row,
                            std::size_t cols) {
    for (int q = 0; q < P; ++q) {
        if (q == me) continue;
        rep.bytes_sent += s.send_counts[q];
        rep.bytes_received += s.recv_counts[q];
    }
    rep.rows_sent = row ? rep.bytes_sent / row : 0;
    rep.rows_received = row ? rep.bytes_received / row : 0;
    rep.bf16_bytes_sent = rep.rows_sent * cols * sizeof(bf16);
}

/// The descriptor every rank of a dispatch (by_token) or dispatch_rows call contributes to the
/// agreement (the host exchange's and the NCCL one's).
template <class Recipe>
moe_exchange_descriptor dispatch_descriptor(bool by_token, int world, int expected, std::size_t experts,
                                            std::size_t d) {
    moe_exchange_descriptor desc;
    desc.op = static_cast<std::uint32_t>(by_token ? moe_exchange_op::dispatch : moe_exchange_op::dispatch_rows);
    desc.world = world;
    desc.expected = expected;
    desc.experts = experts;
    desc.cols = d;
    desc.recipe_format = recipe_format_word<Recipe>();
    desc.recipe_policy = recipe_policy_word<Recipe>();
    return desc;
}

/// The descriptor every rank of a combine call contributes to the agreement.
inline moe_exchange_descriptor combine_descriptor(int world, int expected, std::size_t experts, std::size_t d,
                                                  moe_combine_wire wire) {
    moe_exchange_descriptor desc;
    desc.op = static_cast<std::uint32_t>(moe_exchange_op::combine);
    desc.world = world;
    desc.expected = expected;
    desc.experts = experts;
    desc.cols = d;
    desc.wire = static_cast<std::uint32_t>(wire) + 1;
    return desc;
}

}  // namespace detail

// ---- plan ------------------------------------------------------------------------------------------

inline std::size_t moe_dispatch_plan_scratch_bytes(const moe_exchange_ref& xch) {
    detail::moe_exchange_sizes z;
    z.world = static_cast<std::size_t>(std::max(xch.world, 0));
    z.experts = xch.experts;
    z.local = xch.local_experts();
    z.count_words = xch.experts;
    detail::scratch_carver c;
    detail::carve_moe_exchange(c, z, 0);
    return c.bytes();
}

template <class Transport>
moe_exchange_report moe_dispatch_plan_host(Transport& comm, matrix_ref<const std::int32_t> indices,
                                           const dispatch_options& dopt, const dispatch_plan_ref& plan,
                                           const moe_exchange_ref& xch, const moe_exchange_options& opt) {
    constexpr const char* fn = "octet::moe_dispatch_plan_host";
    const int P = comm.size(), me = comm.rank();
    moe_exchange_report rep;
    rep.world = P;
    auto t0 = std::chrono::steady_clock::now();

    std::optional<detail::host_scratch> block;
    detail::moe_exchange_scratch s;
    int local_failure = 0;
    std::string local_message;
    try {
        allreduce_options ao;
        ao.expected_ranks = opt.expected_ranks;
        detail::check_expected_ranks(ao, P, fn);
        detail::check_moe_exchange(fn, P, me, plan, xch, false);
        rep.dispatch = plan_dispatch(indices, dopt, plan);  // an expert out of range throws here
    } catch (const error& e) {
        local_failure = 1;
        local_message = detail::text_of(e);
    }
    detail::take_scratch(
        opt.executor, fn,
        [&](detail::scratch_carver& c) {
            detail::moe_exchange_sizes z;
            z.world = static_cast<std::size_t>(P);
            z.experts = xch.experts;
            z.local = xch.local_experts();
            z.count_words = xch.experts;
            return detail::carve_moe_exchange(c, z, 0);
        },
        block, s, local_failure, local_message);
    detail::moe_exchange_descriptor d;
    d.op = static_cast<std::uint32_t>(detail::moe_exchange_op::plan);
    d.world = P;
    d.expected = opt.expected_ranks;
    d.experts = xch.experts;
    detail::agree_moe_exchange(comm, s, d, plan, xch, false, local_failure, local_message, fn);
    rep.agreement_bytes = sizeof d + xch.experts * sizeof(std::uint64_t);

    const std::size_t E = xch.experts, L = xch.local_experts(), first = xch.first_expert();
    for (std::size_t e = 0; e < L; ++e) xch.expert_rows[e] = 0;
    for (int q = 0; q < P; ++q)
        for (std::size_t e = 0; e < L; ++e) {
            const std::size_t c = static_cast<std::size_t>(s.counts[static_cast<std::size_t>(q) * E + first + e]);
            xch.recv_counts[static_cast<std::size_t>(q) * L + e] = c;
            xch.expert_rows[e] += c;
        }
    rep.agree_s = detail::seconds_since(t0);
    return rep;
}

// ---- dispatch --------------------------------------------------------------------------------------

template <class Recipe, class Byte>
std::size_t moe_dispatch_scratch_bytes(quantized_ref<Recipe, Byte> x, const dispatch_plan_ref& plan,
                                       const moe_exchange_ref& xch) {
    detail::check_moe_exchange_recipe<Recipe>();
    detail::scratch_carver c;
    detail::carve_moe_exchange(c, detail::moe_dispatch_sizes(x, plan, xch), 0);
    return c.bytes();
}

namespace detail {

/// moe_dispatch_host (by_token: row r of the plan sends x's row token_of_row(r)) and
/// moe_dispatch_rows_host (x's row r itself).
template <class Recipe, class Transport, class Byte>
moe_exchange_report moe_dispatch_impl(Transport& comm, quantized_ref<Recipe, Byte> x, const dispatch_plan_ref& plan,
                                      const moe_exchange_ref& xch, grouped_quantized_ref<Recipe> out,
                                      const moe_exchange_options& opt, bool by_token, const char* fn) {
    detail::check_moe_exchange_recipe<Recipe>();
    using clock = std::chrono::steady_clock;
    using Q = quant_layout_of<Recipe>;
    constexpr std::size_t SB = Recipe::scale_bytes;
    const int P = comm.size(), me = comm.rank();
    const std::size_t world = static_cast<std::size_t>(P);
    moe_exchange_report rep;
    rep.world = P;
    auto t0 = clock::now();

    // 0. Validate locally, take the scratch; the failure flag; agree on the call and the counts.
    std::optional<detail::host_scratch> block;
    detail::moe_exchange_scratch s;
    int local_failure = 0;
    std::string local_message;
    const std::size_t d = x.cols();
    try {
        allreduce_options ao;
        ao.expected_ranks = opt.expected_ranks;
        detail::check_expected_ranks(ao, P, fn);
        detail::check_moe_exchange(fn, P, me, plan, xch, true);
        if (by_token)
            OCTET_REQUIRE(x.rows() == plan.tokens, fn, "x",
                          detail::message("has ", x.rows(), " rows; the plan routes ", plan.tokens, " tokens"));
        else
            OCTET_REQUIRE(x.rows() == plan.rows(), fn, "rows",
                          detail::message("has ", x.rows(), " rows; it must have one per row of the plan (",
                                          plan.rows(), "), in plan order"));
        OCTET_REQUIRE(plan.rows() == 0 || d == 0 || (!x.absent() && x.data != nullptr && x.scales != nullptr), fn, "x",
                      "is absent or has a null data or scales pointer; pass X's quantized copy (quantize<Recipe>)");
        OCTET_REQUIRE(x.layout.scale_cols == block_count(Recipe::granularity::cols, d) &&
                          (x.rows() == 0 || x.layout.scale_ld >= x.rows()),
                      fn, "x",
                      "has a scale grid that does not fit the recipe; build it with quant_layout_of<Recipe>::make");
        const std::size_t L = xch.local_experts();
        OCTET_REQUIRE(out.layout != nullptr && out.groups() == L, fn, "out",
                      detail::message("has ", out.groups(), " groups; this rank owns ", L,
                                      " experts: lay it out with grouped_rows(xch.expert_rows, d)"));
        for (std::size_t e = 0; e < L; ++e) {
            const quant_layout& q = out.layout->groups[e];
            OCTET_REQUIRE(
                q.rows == xch.expert_rows[e] && (q.cols == d || q.rows == 0), fn, "out",
                detail::message("group ", e, " is ", q.rows, " x ", q.cols, " but must be ", xch.expert_rows[e], " x ",
                                d, "; lay it out with grouped_rows(xch.expert_rows, d)"));
        }
        OCTET_REQUIRE(xch.rows() == 0 || d == 0 || (out.data != nullptr && out.scales != nullptr), fn, "out",
                      "has a null data or scales pointer; pass a grouped_quantized_tensor's ref()");
        detail::check_exchange_bytes(fn, "x", plan.rows(), xch.rows(), moe_dispatch_row_bytes<Recipe>(d));
    } catch (const error& e) {
        local_failure = 1;
        local_message = detail::text_of(e);
    }
    detail::take_scratch(
        opt.executor, fn,
        [&](detail::scratch_carver& c) {
            return detail::carve_moe_exchange(c, detail::moe_dispatch_sizes(x, plan, xch), 0);
        },
        block, s, local_failure, local_message);
    const auto desc = detail::dispatch_descriptor<Recipe>(by_token, P, opt.expected_ranks, xch.experts, d);
    detail::agree_moe_exchange(comm, s, desc, plan, xch, true, local_failure, local_message, fn);
    rep.agreement_bytes = sizeof desc + 2 * xch.experts * sizeof(std::uint64_t);
    rep.agree_s = detail::seconds_since(t0);

    // 1. Pack: the plan's rows in order (owner q's are rows [group_offsets[q L], group_offsets[(q+1) L])),
    // each its codes and then its scales.
    t0 = clock::now();
    const std::size_t L = xch.local_experts(), row = moe_dispatch_row_bytes<Recipe>(d);
    const std::size_t code_bytes = (d + Q::group_codes - 1) / Q::group_codes * Q::group_bytes;
    const std::size_t scale_cols = block_count(Recipe::granularity::cols, d);
    detail::moe_received_offsets(xch, s);
    for (std::size_t q = 0; q < world; ++q) {
        const std::size_t r0 = plan.group_offsets[q * L], r1 = plan.group_offsets[(q + 1) * L];
        s.send_counts[q] = (r1 - r0) * row;
        s.send_off[q] = r0 * row;
        std::size_t from = 0;
        for (std::size_t e = 0; e < L; ++e) from += xch.recv_counts[q * L + e];
        s.recv_counts[q] = from * row;
        s.recv_off[q] = s.block_row[q * L] * row;
    }
    if (d > 0)
        parallel_for(opt.executor, plan.rows(), 64, [&](std::size_t r0, std::size_t r1) {
            for (std::size_t r = r0; r < r1; ++r) {
                const std::size_t t = by_token ? plan.token_of_row(r) : r;
                std::uint8_t* dst = s.send + r * row;
                std::memcpy(dst, x.data + t * x.layout.row_bytes, code_bytes);
                for (std::size_t bj = 0; bj < scale_cols; ++bj)
                    std::memcpy(dst + code_bytes + bj * SB, x.scales + (bj * x.layout.scale_ld + t) * SB, SB);
            }
        });
    rep.pack_s = detail::seconds_since(t0);

    // 2. Exchange.
    t0 = clock::now();
    comm.alltoallv(s.send, s.send_counts, s.send_off, s.recv, s.recv_counts, s.recv_off);
    rep.exchange_s = detail::seconds_since(t0);
    detail::moe_report_rows(rep, s, P, me, row, d);

    // 3. Unpack into the grouped layout: each row's codes (its padding 0) and its scale column entries
    // (the group's last row also zeroes the padding of the scale columns), as permute_quantized writes.
    t0 = clock::now();
    if (d > 0)
        parallel_for(opt.executor, xch.rows(), 64, [&](std::size_t i0, std::size_t i1) {
            for (std::size_t i = i0; i < i1; ++i) {
                const std::size_t e = static_cast<std::size_t>(std::upper_bound(s.expert_off, s.expert_off + L + 1, i) -
                                                               s.expert_off - 1);
                const std::size_t j = i - s.expert_off[e];
                const std::uint8_t* src = s.recv + detail::moe_buffer_row(xch, s, i) * row;
                const grouped_layout& G = *out.layout;
                const quant_layout& q = G.groups[e];
                std::uint8_t* dst = out.data + G.data_offset[e] + j * q.row_bytes;
                std::memcpy(dst, src, code_bytes);
                std::memset(dst + code_bytes, 0, q.row_bytes - code_bytes);
                std::uint8_t* scales = out.scales + G.scale_offset[e];
                for (std::size_t bj = 0; bj < scale_cols; ++bj)
                    std::memcpy(scales + (bj * q.scale_ld + j) * SB, src + code_bytes + bj * SB, SB);
                if (j + 1 == q.rows)
                    for (std::size_t bj = 0; bj < q.scale_cols; ++bj)
                        std::memset(scales + (bj * q.scale_ld + q.scale_rows) * SB, 0,
                                    (q.scale_ld - q.scale_rows) * SB);
            }
        });
    rep.unpack_s = detail::seconds_since(t0);
    return rep;
}

}  // namespace detail

template <class Recipe, class Transport, class Byte>
moe_exchange_report moe_dispatch_host(Transport& comm, quantized_ref<Recipe, Byte> x, const dispatch_plan_ref& plan,
                                      const moe_exchange_ref& xch, grouped_quantized_ref<Recipe> out,
                                      const moe_exchange_options& opt) {
    return detail::moe_dispatch_impl(comm, x, plan, xch, out, opt, true, "octet::moe_dispatch_host");
}

template <class Recipe, class Transport, class Byte>
moe_exchange_report moe_dispatch_rows_host(Transport& comm, quantized_ref<Recipe, Byte> rows,
                                           const dispatch_plan_ref& plan, const moe_exchange_ref& xch,
                                           grouped_quantized_ref<Recipe> out, const moe_exchange_options& opt) {
    return detail::moe_dispatch_impl(comm, rows, plan, xch, out, opt, false, "octet::moe_dispatch_rows_host");
}

// ---- combine ---------------------------------------------------------------------------------------

template <class Y>
std::size_t moe_combine_scratch_bytes(matrix_ref<Y> y, const dispatch_plan_ref& plan, const moe_exchange_ref& xch,
                                      const moe_exchange_options& opt) {
    detail::scratch_carver c;
    detail::carve_moe_exchange(c, detail::moe_combine_sizes(y, plan, xch, opt.combine_wire, !opt.returned.empty()),
                               detail::moe_combine_quantize_bytes(opt.executor, y, opt.combine_wire));
    return c.bytes();
}

template <class Transport, class Y, class Out>
moe_exchange_report moe_combine_host(Transport& comm, matrix_ref<Y> y, matrix_ref<const float> weights,
                                     const dispatch_plan_ref& plan, const moe_exchange_ref& xch, matrix_ref<Out> out,
                                     const moe_exchange_options& opt) {
    static_assert(detail::is_float_or_bf16_v<Y> && detail::is_float_or_bf16_v<Out>,
                  "octet::moe_combine_host: y and out hold float or octet::bf16");
    constexpr const char* fn = "octet::moe_combine_host";
    using clock = std::chrono::steady_clock;
    using R = recipes::blockwise_1x128;
    using QR = quant_layout_of<R>;
    const int P = comm.size(), me = comm.rank();
    const std::size_t world = static_cast<std::size_t>(P);
    const bool fp8 = opt.combine_wire == moe_combine_wire::e4m3_1x128;
    const bool f32 = opt.combine_wire == moe_combine_wire::f32;
    moe_exchange_report rep;
    rep.world = P;
    auto t0 = clock::now();

    std::optional<detail::host_scratch> block;
    detail::moe_exchange_scratch s;
    int local_failure = 0;
    std::string local_message;
    const std::size_t d = out.cols;
    try {
        allreduce_options ao;
        ao.expected_ranks = opt.expected_ranks;
        detail::check_expected_ranks(ao, P, fn);
        OCTET_REQUIRE(opt.combine_wire == moe_combine_wire::bf16 || opt.combine_wire == moe_combine_wire::e4m3_1x128 ||
                          opt.combine_wire == moe_combine_wire::f32,
                      fn, "options.combine_wire", "is not a moe_combine_wire; pass bf16, e4m3_1x128 or f32");
        detail::check_moe_exchange(fn, P, me, plan, xch, true);
        OCTET_REQUIRE(y.rows == xch.rows() && y.cols == d, fn, "y",
                      detail::message("is ", y.rows, " x ", y.cols, "; it must be xch.rows() x d = ", xch.rows(), " x ",
                                      d, " (this rank's experts' outputs, in the received order)"));
        OCTET_REQUIRE(y.rows == 0 || d == 0 || y.data != nullptr, fn, "y", "is null with a non-zero shape");
        OCTET_REQUIRE(out.rows == plan.tokens, fn, "out",
                      detail::message("has ", out.rows, " rows; it must have one per token (", plan.tokens, ")"));
        OCTET_REQUIRE(weights.rows == plan.tokens && weights.cols == plan.k, fn, "weights",
                      detail::message("is ", weights.rows, " x ", weights.cols,
                                      "; it must be tokens x k = ", plan.tokens, " x ", plan.k, " (route's weights)"));
        detail::check_exchange_bytes(fn, "y", xch.rows(), plan.rows(), moe_combine_row_bytes(d, opt.combine_wire));
        OCTET_REQUIRE(opt.returned.empty() ||
                          (opt.returned.rows == plan.rows() && opt.returned.cols == d && opt.returned.data != nullptr),
                      fn, "options.returned",
                      detail::message("is ", opt.returned.rows, " x ", opt.returned.cols,
                                      "; it must be plan.rows() x d = ", plan.rows(), " x ", d, ", or {}"));
    } catch (const error& e) {
        local_failure = 1;
        local_message = detail::text_of(e);
    }
    detail::take_scratch(
        opt.executor, fn,
        [&](detail::scratch_carver& c) {
            return detail::carve_moe_exchange(
                c, detail::moe_combine_sizes(y, plan, xch, opt.combine_wire, !opt.returned.empty()),
                detail::moe_combine_quantize_bytes(opt.executor, y, opt.combine_wire));
        },
        block, s, local_failure, local_message);
    const auto desc = detail::combine_descriptor(P, opt.expected_ranks, xch.experts, d, opt.combine_wire);
    detail::agree_moe_exchange(comm, s, desc, plan, xch, true, local_failure, local_message, fn);
    rep.agreement_bytes = sizeof desc + 2 * xch.experts * sizeof(std::uint64_t);
    rep.agree_s = detail::seconds_since(t0);

    // 1. Pack: each received row's output goes back where the row was in the dispatch's receive
    // buffer, so that owner r's rows reach their source in its plan order.
    t0 = clock::now();
    const std::size_t L = xch.local_experts(), row = moe_combine_row_bytes(d, opt.combine_wire);
    detail::moe_received_offsets(xch, s);
    for (std::size_t q = 0; q < world; ++q) {
        std::size_t to = 0;
        for (std::size_t e = 0; e < L; ++e) to += xch.recv_counts[q * L + e];
        s.send_counts[q] = to * row;
        s.send_off[q] = s.block_row[q * L] * row;
        const std::size_t r0 = plan.group_offsets[q * L], r1 = plan.group_offsets[(q + 1) * L];
        s.recv_counts[q] = (r1 - r0) * row;
        s.recv_off[q] = r0 * row;
    }
    const std::size_t scale_cols = block_count(R::granularity::cols, d);
    const quant_layout ly = QR::make(xch.rows(), d, false);
    if (fp8 && xch.rows() > 0 && d > 0) {
        detail::codec_region region{s.quantize, s.quantize_bytes};
        host_executor qex = opt.executor;
        qex.allocator = region.allocator();
        quantize<R>(qex, y, quantized_ref<R>(s.y_codes, s.y_scales, ly, nullptr));
    }
    if (d > 0)
        parallel_for(opt.executor, xch.rows(), 64, [&](std::size_t i0, std::size_t i1) {
            for (std::size_t i = i0; i < i1; ++i) {
                std::uint8_t* dst = s.send + detail::moe_buffer_row(xch, s, i) * row;
                if (fp8) {
                    std::memcpy(dst, s.y_codes + i * ly.row_bytes, d);
                    for (std::size_t bj = 0; bj < scale_cols; ++bj)
                        std::memcpy(dst + d + bj * R::scale_bytes, s.y_scales + (bj * ly.scale_ld + i) * R::scale_bytes,
                                    R::scale_bytes);
                } else if (f32) {
                    for (std::size_t c = 0; c < d; ++c) {
                        const float v = detail::load_float(y(i, c));
                        std::memcpy(dst + c * sizeof(float), &v, sizeof v);
                    }
                } else {
                    for (std::size_t c = 0; c < d; ++c) {
                        const bf16 v = detail::store_float<bf16>(detail::load_float(y(i, c)));
                        std::memcpy(dst + c * sizeof(bf16), &v, sizeof v);
                    }
                }
            }
        });
    rep.pack_s = detail::seconds_since(t0);

    // 2. Exchange.
    t0 = clock::now();
    comm.alltoallv(s.send, s.send_counts, s.send_off, s.recv, s.recv_counts, s.recv_off);
    rep.exchange_s = detail::seconds_since(t0);
    detail::moe_report_rows(rep, s, P, me, row, d);

    // 3. The weighted sum: octet::combine over the returned rows (plan order), bf16 or float as they
    // came, or the E4M3 rows dequantized to float.
    t0 = clock::now();
    const std::size_t rows = plan.rows();
    if (fp8 && rows > 0 && d > 0) {
        const quant_layout lr = QR::make(rows, d, false);
        parallel_for(opt.executor, rows, 64, [&](std::size_t r0, std::size_t r1) {
            for (std::size_t r = r0; r < r1; ++r) {
                const std::uint8_t* src = s.recv + r * row;
                std::memcpy(s.r_codes + r * lr.row_bytes, src, d);
                for (std::size_t bj = 0; bj < scale_cols; ++bj)
                    std::memcpy(s.r_scales + (bj * lr.scale_ld + r) * R::scale_bytes, src + d + bj * R::scale_bytes,
                                R::scale_bytes);
            }
        });
        const matrix_ref<float> yf = opt.returned.empty() ? matrix_ref<float>(s.r_float, rows, d) : opt.returned;
        dequantize(opt.executor, quantized_cref<R>(s.r_codes, s.r_scales, lr, nullptr), yf);
        combine(opt.executor, matrix_ref<const float>(yf), weights, plan, out);
    } else if (f32) {
        const matrix_ref<const float> yr(reinterpret_cast<const float*>(s.recv), rows, d);
        combine(opt.executor, yr, weights, plan, out);
        if (!opt.returned.empty())
            parallel_for(opt.executor, rows, 64, [&](std::size_t r0, std::size_t r1) {
                for (std::size_t r = r0; r < r1; ++r)
                    for (std::size_t c = 0; c < d; ++c) opt.returned(r, c) = yr(r, c);
            });
    } else {
        const matrix_ref<const bf16> yb(reinterpret_cast<const bf16*>(s.recv), rows, d);
        combine(opt.executor, yb, weights, plan, out);
        if (!opt.returned.empty())
            parallel_for(opt.executor, rows, 64, [&](std::size_t r0, std::size_t r1) {
                for (std::size_t r = r0; r < r1; ++r)
                    for (std::size_t c = 0; c < d; ++c) opt.returned(r, c) = to_float(yb(r, c));
            });
    }
    rep.unpack_s = detail::seconds_since(t0);
    return rep;
}

}  // namespace octet
