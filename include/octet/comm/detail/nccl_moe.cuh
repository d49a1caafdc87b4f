// octet/comm/detail/nccl_moe.cuh: the implementation of octet/comm/nccl_moe.cuh (included at its end;
// the declarations and the contract are there). Kernels: a table-driven row move (the dispatch's
// pack and unpack), the combine's pack (bf16 rounding or float copy), its weighted sum, and the copy
// of the returned rows.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "octet/comm/nccl.cuh"
#include "octet/comm/nccl_moe.cuh"
#include "octet/core/bits.hpp"
#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/nn/moe_exchange.hpp"

namespace octet {
namespace detail {

/// The host exchange's transport for its agreement (allgather and allreduce_max of small host
/// buffers) over NCCL: each call stages the bytes through a device buffer from ex's allocator,
/// ncclAllGather, and copies the result back (one stream synchronization).
class nccl_metadata_transport {
public:
    nccl_metadata_transport(const nccl_communicator& comm, const stream_executor& ex) : comm_(comm), ex_(ex) {}
    int size() const { return comm_.size(); }
    int rank() const { return comm_.rank(); }
    void allgather(const void* mine, std::size_t bytes, void* all) const {
        const std::size_t P = static_cast<std::size_t>(size());
        if (bytes == 0) return;
        const stream_scratch buf(ex_, bytes * (P + 1));
        auto* d = buf.as<std::uint8_t>();
        const cudaStream_t s = ex_.stream;
        OCTET_CUDA_CHECK(cudaMemcpyAsync(d, mine, bytes, cudaMemcpyHostToDevice, s));
        nccl_check(ncclAllGather(d, d + bytes, bytes, ncclUint8, comm_.get(), s), "ncclAllGather");
        OCTET_CUDA_CHECK(cudaMemcpyAsync(all, d + bytes, bytes * P, cudaMemcpyDeviceToHost, s));
        OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    int allreduce_max(int v) const {
        std::vector<int> all(static_cast<std::size_t>(size()));
        allgather(&v, sizeof v, all.data());
        return *std::max_element(all.begin(), all.end());
    }

private:
    const nccl_communicator& comm_;
    stream_executor ex_;
};

/// One row move of the dispatch: `code_bytes` bytes from src_codes + t[0] to dst_codes + t[3], and
/// `scale_cols` scale entries of `sb` bytes from src_scales + t[1] + bj t[2] to dst_scales + t[4] +
/// bj t[5] (t: the row's 6 offsets). One block per row.
OCTET_KERNEL void moe_move_rows_kernel(const std::uint8_t* src_codes, const std::uint8_t* src_scales,
                                       std::uint8_t* dst_codes, std::uint8_t* dst_scales, const std::uint64_t* table,
                                       std::size_t code_bytes, std::size_t scale_cols, std::size_t sb) {
    const std::uint64_t* t = table + 6 * static_cast<std::size_t>(blockIdx.x);
    for (std::size_t b = threadIdx.x; b < code_bytes; b += blockDim.x) dst_codes[t[3] + b] = src_codes[t[0] + b];
    for (std::size_t k = threadIdx.x; k < scale_cols * sb; k += blockDim.x) {
        const std::size_t bj = k / sb, byte = k % sb;
        dst_scales[t[4] + bj * t[5] + byte] = src_scales[t[1] + bj * t[2] + byte];
    }
}

/// The combine's pack: row i of y into send row dst_row[i], rounded to bf16 (or as float).
template <class Y, bool F32>
OCTET_KERNEL void moe_combine_pack_kernel(matrix_ref<const Y> y, const std::uint64_t* dst_row, std::uint8_t* send) {
    const std::size_t i = blockIdx.x, d = y.cols;
    for (std::size_t c = threadIdx.x; c < d; c += blockDim.x) {
        float v;
        if constexpr (std::is_same_v<Y, float>)
            v = y(i, c);
        else
            v = to_float(y(i, c));
        if constexpr (F32)
            reinterpret_cast<float*>(send)[dst_row[i] * d + c] = v;
        else
            reinterpret_cast<bf16*>(send)[dst_row[i] * d + c] = to_bf16(v);
    }
}

/// out(t, c) = sum_j w(t, j) y(row_of[t k + j], c) over the kept slots, in slot order, in float: a
/// rounded multiply and a rounded add each (octet::combine on the host), then stored as Out.
template <class W, class Out>
OCTET_KERNEL void moe_combine_sum_kernel(matrix_ref<const W> y, matrix_ref<const float> weights,
                                         const std::int32_t* row_of, std::size_t k, matrix_ref<Out> out) {
    const std::size_t t = blockIdx.x;
    for (std::size_t c = threadIdx.x; c < out.cols; c += blockDim.x) {
        float acc = 0.0f;
        for (std::size_t j = 0; j < k; ++j) {
            const std::int32_t r = row_of[t * k + j];
            if (r < 0) continue;
            float v;
            if constexpr (std::is_same_v<W, float>)
                v = y(static_cast<std::size_t>(r), c);
            else
                v = to_float(y(static_cast<std::size_t>(r), c));
            acc = __fadd_rn(acc, __fmul_rn(weights(t, j), v));
        }
        if constexpr (std::is_same_v<Out, float>)
            out(t, c) = acc;
        else
            out(t, c) = to_bf16(acc);
    }
}

/// returned(r, c) = the row as it came back, as float.
template <class W>
OCTET_KERNEL void moe_returned_kernel(matrix_ref<const W> y, matrix_ref<float> returned) {
    const std::size_t r = blockIdx.x;
    for (std::size_t c = threadIdx.x; c < y.cols; c += blockDim.x) {
        if constexpr (std::is_same_v<W, float>)
            returned(r, c) = y(r, c);
        else
            returned(r, c) = to_float(y(r, c));
    }
}

/// Bytes per row each rank sends to and receives from each rank (the host exchange's counts), from
/// the plan and the record; s.expert_off and s.block_row filled (moe_received_offsets).
inline void moe_nccl_counts(const dispatch_plan_ref& plan, const moe_exchange_ref& xch, const moe_exchange_scratch& s,
                            std::size_t row, bool dispatch) {
    const std::size_t world = static_cast<std::size_t>(xch.world), L = xch.local_experts();
    moe_received_offsets(xch, s);
    for (std::size_t q = 0; q < world; ++q) {
        const std::size_t r0 = plan.group_offsets[q * L], r1 = plan.group_offsets[(q + 1) * L];
        std::size_t from = 0;
        for (std::size_t e = 0; e < L; ++e) from += xch.recv_counts[q * L + e];
        // dispatch: the plan's rows of q's experts go to q, q's rows of my experts come back into
        // their block of the receive buffer; combine: the reverse.
        const std::size_t plan_count = (r1 - r0) * row, plan_off = r0 * row;
        const std::size_t block_count = from * row, block_off = s.block_row[q * L] * row;
        s.send_counts[q] = dispatch ? plan_count : block_count;
        s.send_off[q] = dispatch ? plan_off : block_off;
        s.recv_counts[q] = dispatch ? block_count : plan_count;
        s.recv_off[q] = dispatch ? block_off : plan_off;
    }
}

/// One group of ncclSend / ncclRecv: the host exchange's alltoallv (a rank's own rows included).
inline void moe_nccl_alltoallv(const nccl_communicator& comm, cudaStream_t s, const std::uint8_t* send,
                               std::uint8_t* recv, const moe_exchange_scratch& c) {
    const int P = comm.size();
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int q = 0; q < P; ++q) {
        if (c.send_counts[q])
            nccl_check(ncclSend(send + c.send_off[q], c.send_counts[q], ncclUint8, q, comm.get(), s), "ncclSend");
        if (c.recv_counts[q])
            nccl_check(ncclRecv(recv + c.recv_off[q], c.recv_counts[q], ncclUint8, q, comm.get(), s), "ncclRecv");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
}

/// Uploads a host table into device memory at `dst` (pageable: the copy is staged before it returns).
template <class T>
void moe_upload(T* dst, const std::vector<T>& v, cudaStream_t s) {
    if (!v.empty()) OCTET_CUDA_CHECK(cudaMemcpyAsync(dst, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s));
}

inline std::size_t moe_align256(std::size_t n) {
    return (n + 255) / 256 * 256;
}

template <class Recipe, class Byte>
moe_exchange_report nccl_moe_dispatch_impl(const nccl_communicator& comm, const stream_executor& ex,
                                           quantized_ref<Recipe, Byte> x, const dispatch_plan_ref& plan,
                                           const moe_exchange_ref& xch, grouped_quantized_ref<Recipe> out,
                                           const moe_exchange_options& opt, bool by_token, const char* fn) {
    check_moe_exchange_recipe<Recipe>();
    using clock = std::chrono::steady_clock;
    using Q = quant_layout_of<Recipe>;
    constexpr std::size_t SB = Recipe::scale_bytes;
    const int P = comm.size(), me = comm.rank();
    const cudaStream_t s = ex.stream;
    nccl_metadata_transport meta(comm, ex);
    moe_exchange_report rep;
    rep.world = P;
    auto t0 = clock::now();

    // 0. The host exchange's local checks (and the device ones), the device block, the agreement.
    std::optional<host_scratch> hblock;
    std::optional<detail::stream_scratch> dblock;
    moe_exchange_scratch hs;
    int local_failure = 0;
    std::string local_message;
    const std::size_t d = x.cols(), row = moe_dispatch_row_bytes<Recipe>(d);
    std::size_t send_at = 0, recv_at = 0, pack_at = 0, unpack_at = 0;
    try {
        allreduce_options ao;
        ao.expected_ranks = opt.expected_ranks;
        check_expected_ranks(ao, P, fn);
        check_moe_exchange(fn, P, me, plan, xch, true);
        if (by_token)
            OCTET_REQUIRE(x.rows() == plan.tokens, fn, "x",
                          message("has ", x.rows(), " rows; the plan routes ", plan.tokens, " tokens"));
        else
            OCTET_REQUIRE(x.rows() == plan.rows(), fn, "rows",
                          message("has ", x.rows(), " rows; it must have one per row of the plan (", plan.rows(),
                                  "), in plan order"));
        OCTET_REQUIRE(plan.rows() == 0 || d == 0 || (!x.absent() && x.data != nullptr && x.scales != nullptr), fn, "x",
                      "is absent or has a null data or scales pointer; pass X's quantized copy (quantize<Recipe>)");
        OCTET_REQUIRE(x.layout.scale_cols == block_count(Recipe::granularity::cols, d) &&
                          (x.rows() == 0 || x.layout.scale_ld >= x.rows()),
                      fn, "x",
                      "has a scale grid that does not fit the recipe; build it with quant_layout_of<Recipe>::make");
        const std::size_t L = xch.local_experts();
        OCTET_REQUIRE(out.layout != nullptr && out.groups() == L, fn, "out",
                      message("has ", out.groups(), " groups; this rank owns ", L,
                              " experts: lay it out with grouped_rows(xch.expert_rows, d)"));
        for (std::size_t e = 0; e < L; ++e) {
            const quant_layout& q = out.layout->groups[e];
            OCTET_REQUIRE(q.rows == xch.expert_rows[e] && (q.cols == d || q.rows == 0), fn, "out",
                          message("group ", e, " is ", q.rows, " x ", q.cols, " but must be ", xch.expert_rows[e],
                                  " x ", d, "; lay it out with grouped_rows(xch.expert_rows, d)"));
        }
        OCTET_REQUIRE(xch.rows() == 0 || d == 0 || (out.data != nullptr && out.scales != nullptr), fn, "out",
                      "has a null data or scales pointer; pass a grouped_quantized_tensor's ref() in device memory");
        cuda::require_device_accessible(x.data, fn, "x.data");
        cuda::require_device_accessible(x.scales, fn, "x.scales");
        cuda::require_device_accessible(out.data, fn, "out.data");
        cuda::require_device_accessible(out.scales, fn, "out.scales");
        // the device block: the send and receive rows, the pack and unpack tables (6 offsets a row)
        send_at = 0;
        recv_at = moe_align256(plan.rows() * row);
        pack_at = recv_at + moe_align256(xch.rows() * row);
        unpack_at = pack_at + moe_align256(plan.rows() * 6 * sizeof(std::uint64_t));
        dblock.emplace(ex, unpack_at + moe_align256(xch.rows() * 6 * sizeof(std::uint64_t)));
    } catch (const error& e) {
        local_failure = 1;
        local_message = text_of(e);
    }
    take_scratch(
        opt.executor, fn,
        [&](scratch_carver& c) {
            moe_exchange_sizes z = moe_dispatch_sizes(x, plan, xch);
            z.send_bytes = z.recv_bytes = 0;  // the rows travel in device memory
            return carve_moe_exchange(c, z, 0);
        },
        hblock, hs, local_failure, local_message);
    const auto desc = dispatch_descriptor<Recipe>(by_token, P, opt.expected_ranks, xch.experts, d);
    agree_moe_exchange(meta, hs, desc, plan, xch, true, local_failure, local_message, fn);
    rep.agreement_bytes = sizeof desc + 2 * xch.experts * sizeof(std::uint64_t);
    rep.agree_s = seconds_since(t0);

    // 1. The tables, on the host as the host exchange computes its offsets; the pack kernel.
    t0 = clock::now();
    const std::size_t L = xch.local_experts();
    const std::size_t code_bytes = (d + Q::group_codes - 1) / Q::group_codes * Q::group_bytes;
    const std::size_t scale_cols = block_count(Recipe::granularity::cols, d);
    moe_nccl_counts(plan, xch, hs, row, true);
    auto* base = dblock->as<std::uint8_t>();
    std::uint8_t* send = base + send_at;
    std::uint8_t* recv = base + recv_at;
    auto* pack_table = reinterpret_cast<std::uint64_t*>(base + pack_at);
    auto* unpack_table = reinterpret_cast<std::uint64_t*>(base + unpack_at);
    if (d > 0 && plan.rows() > 0) {
        std::vector<std::uint64_t> t(plan.rows() * 6);
        for (std::size_t r = 0; r < plan.rows(); ++r) {
            const std::size_t tok = by_token ? plan.token_of_row(r) : r;
            std::uint64_t* e = t.data() + 6 * r;
            e[0] = tok * x.layout.row_bytes;
            e[1] = tok * SB;
            e[2] = x.layout.scale_ld * SB;
            e[3] = r * row;
            e[4] = r * row + code_bytes;
            e[5] = SB;
        }
        moe_upload(pack_table, t, s);
        cuda::launch("moe_move_rows_kernel", moe_move_rows_kernel, static_cast<unsigned>(plan.rows()), 128, 0, s,
                     reinterpret_cast<const std::uint8_t*>(x.data), reinterpret_cast<const std::uint8_t*>(x.scales),
                     send, send, pack_table, code_bytes, scale_cols, SB);
        OCTET_CUDA_CHECK_LAUNCH();
    }
    rep.pack_s = seconds_since(t0);

    // 2. Exchange.
    t0 = clock::now();
    moe_nccl_alltoallv(comm, s, send, recv, hs);
    moe_report_rows(rep, hs, P, me, row, d);

    // 3. Unpack into the grouped layout (zeroed first: the padding of rows and of scale columns).
    const grouped_layout& G = *out.layout;
    if (G.data_bytes) OCTET_CUDA_CHECK(cudaMemsetAsync(out.data, 0, G.data_bytes, s));
    if (G.scale_bytes) OCTET_CUDA_CHECK(cudaMemsetAsync(out.scales, 0, G.scale_bytes, s));
    if (d > 0 && xch.rows() > 0) {
        std::vector<std::uint64_t> t(xch.rows() * 6);
        for (std::size_t i = 0; i < xch.rows(); ++i) {
            const std::size_t e =
                static_cast<std::size_t>(std::upper_bound(hs.expert_off, hs.expert_off + L + 1, i) - hs.expert_off - 1);
            const std::size_t j = i - hs.expert_off[e], br = moe_buffer_row(xch, hs, i);
            const quant_layout& q = G.groups[e];
            std::uint64_t* u = t.data() + 6 * i;
            u[0] = br * row;
            u[1] = br * row + code_bytes;
            u[2] = SB;
            u[3] = G.data_offset[e] + j * q.row_bytes;
            u[4] = G.scale_offset[e] + j * SB;
            u[5] = q.scale_ld * SB;
        }
        moe_upload(unpack_table, t, s);
        cuda::launch("moe_move_rows_kernel", moe_move_rows_kernel, static_cast<unsigned>(xch.rows()), 128, 0, s,
                     static_cast<const std::uint8_t*>(recv), static_cast<const std::uint8_t*>(recv), out.data,
                     out.scales, unpack_table, code_bytes, scale_cols, SB);
        OCTET_CUDA_CHECK_LAUNCH();
    }
    OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
    rep.exchange_s = seconds_since(t0);  // the exchange and the unpack (one synchronization)
    return rep;
}

}  // namespace detail

template <class Comm, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int>>
moe_exchange_report moe_dispatch_plan(Comm& comm, const stream_executor& ex, matrix_ref<const std::int32_t> indices,
                                      const dispatch_options& dopt, const dispatch_plan_ref& plan,
                                      const moe_exchange_ref& xch, const moe_exchange_options& opt) {
    detail::nccl_metadata_transport meta(comm, ex);
    return moe_dispatch_plan_host(meta, indices, dopt, plan, xch, opt);
}

template <class Recipe, class Comm, class Byte, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int>>
moe_exchange_report moe_dispatch(Comm& comm, const stream_executor& ex, quantized_ref<Recipe, Byte> x,
                                 const dispatch_plan_ref& plan, const moe_exchange_ref& xch,
                                 grouped_quantized_ref<Recipe> out, const moe_exchange_options& opt) {
    return detail::nccl_moe_dispatch_impl(comm, ex, x, plan, xch, out, opt, true, "octet::moe_dispatch");
}

template <class Recipe, class Comm, class Byte, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int>>
moe_exchange_report moe_dispatch_rows(Comm& comm, const stream_executor& ex, quantized_ref<Recipe, Byte> rows,
                                      const dispatch_plan_ref& plan, const moe_exchange_ref& xch,
                                      grouped_quantized_ref<Recipe> out, const moe_exchange_options& opt) {
    return detail::nccl_moe_dispatch_impl(comm, ex, rows, plan, xch, out, opt, false, "octet::moe_dispatch_rows");
}

template <class Comm, class Y, class Out, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int>>
moe_exchange_report moe_combine(Comm& comm, const stream_executor& ex, matrix_ref<Y> y, matrix_ref<const float> weights,
                                const dispatch_plan_ref& plan, const moe_exchange_ref& xch, matrix_ref<Out> out,
                                const moe_exchange_options& opt) {
    using Yv = std::remove_const_t<Y>;
    static_assert(detail::is_float_or_bf16_v<Yv> && detail::is_float_or_bf16_v<Out>,
                  "octet::moe_combine: y and out hold float or octet::bf16");
    constexpr const char* fn = "octet::moe_combine";
    using clock = std::chrono::steady_clock;
    const int P = comm.size(), me = comm.rank();
    const cudaStream_t s = ex.stream;
    const bool f32 = opt.combine_wire == moe_combine_wire::f32;
    detail::nccl_metadata_transport meta(comm, ex);
    moe_exchange_report rep;
    rep.world = P;
    auto t0 = clock::now();

    std::optional<detail::host_scratch> hblock;
    std::optional<detail::stream_scratch> dblock;
    detail::moe_exchange_scratch hs;
    int local_failure = 0;
    std::string local_message;
    const std::size_t d = out.cols;
    std::size_t row = 0, recv_at = 0, table_at = 0, row_of_at = 0;
    try {
        allreduce_options ao;
        ao.expected_ranks = opt.expected_ranks;
        detail::check_expected_ranks(ao, P, fn);
        OCTET_REQUIRE(opt.combine_wire == moe_combine_wire::bf16 || opt.combine_wire == moe_combine_wire::f32, fn,
                      "options.combine_wire",
                      "is e4m3_1x128 (or not a moe_combine_wire); the NCCL combine sends bf16 or f32 rows (the E4M3 "
                      "wire is moe_combine_host's only, for now)");
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
        OCTET_REQUIRE(opt.returned.empty() ||
                          (opt.returned.rows == plan.rows() && opt.returned.cols == d && opt.returned.data != nullptr),
                      fn, "options.returned",
                      detail::message("is ", opt.returned.rows, " x ", opt.returned.cols,
                                      "; it must be plan.rows() x d = ", plan.rows(), " x ", d, ", or {}"));
        cuda::require_device_accessible(y.data, fn, "y");
        cuda::require_device_accessible(weights.data, fn, "weights");
        cuda::require_device_accessible(out.data, fn, "out");
        cuda::require_device_accessible(opt.returned.data, fn, "options.returned");
        row = moe_combine_row_bytes(d, opt.combine_wire);
        recv_at = detail::moe_align256(xch.rows() * row);
        table_at = recv_at + detail::moe_align256(plan.rows() * row);
        row_of_at = table_at + detail::moe_align256(xch.rows() * sizeof(std::uint64_t));
        dblock.emplace(ex, row_of_at + detail::moe_align256(plan.assignments() * sizeof(std::int32_t)));
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
            z.count_words = 2 * xch.experts;
            return detail::carve_moe_exchange(c, z, 0);
        },
        hblock, hs, local_failure, local_message);
    const auto desc = detail::combine_descriptor(P, opt.expected_ranks, xch.experts, d, opt.combine_wire);
    detail::agree_moe_exchange(meta, hs, desc, plan, xch, true, local_failure, local_message, fn);
    rep.agreement_bytes = sizeof desc + 2 * xch.experts * sizeof(std::uint64_t);
    rep.agree_s = detail::seconds_since(t0);

    // 1. Pack: each received row's output goes back where the row was in the dispatch's receive buffer.
    t0 = clock::now();
    detail::moe_nccl_counts(plan, xch, hs, row, false);
    auto* base = dblock->as<std::uint8_t>();
    std::uint8_t* send = base;
    std::uint8_t* recv = base + recv_at;
    auto* table = reinterpret_cast<std::uint64_t*>(base + table_at);
    auto* row_of = reinterpret_cast<std::int32_t*>(base + row_of_at);
    const matrix_ref<const Yv> yc(y.data, y.rows, y.cols, y.ld, y.order);
    if (d > 0 && xch.rows() > 0) {
        std::vector<std::uint64_t> t(xch.rows());
        for (std::size_t i = 0; i < xch.rows(); ++i) t[i] = detail::moe_buffer_row(xch, hs, i);
        detail::moe_upload(table, t, s);
        if (f32)
            cuda::launch("moe_combine_pack_kernel", detail::moe_combine_pack_kernel<Yv, true>,
                         static_cast<unsigned>(xch.rows()), 128, 0, s, yc, static_cast<const std::uint64_t*>(table),
                         send);
        else
            cuda::launch("moe_combine_pack_kernel", detail::moe_combine_pack_kernel<Yv, false>,
                         static_cast<unsigned>(xch.rows()), 128, 0, s, yc, static_cast<const std::uint64_t*>(table),
                         send);
        OCTET_CUDA_CHECK_LAUNCH();
    }
    rep.pack_s = detail::seconds_since(t0);

    // 2. Exchange; 3. the weighted sum (and the returned rows).
    t0 = clock::now();
    detail::moe_nccl_alltoallv(comm, s, send, recv, hs);
    detail::moe_report_rows(rep, hs, P, me, row, d);
    const std::size_t rows = plan.rows();
    if (plan.tokens > 0 && d > 0) {
        std::vector<std::int32_t> r(plan.row_of.begin(), plan.row_of.end());
        detail::moe_upload(row_of, r, s);
        const matrix_ref<Out> o(out.data, out.rows, out.cols, out.ld, out.order);
        if (f32)
            cuda::launch("moe_combine_sum_kernel", detail::moe_combine_sum_kernel<float, Out>,
                         static_cast<unsigned>(plan.tokens), 128, 0, s,
                         matrix_ref<const float>(reinterpret_cast<const float*>(recv), rows, d), weights,
                         static_cast<const std::int32_t*>(row_of), plan.k, o);
        else
            cuda::launch("moe_combine_sum_kernel", detail::moe_combine_sum_kernel<bf16, Out>,
                         static_cast<unsigned>(plan.tokens), 128, 0, s,
                         matrix_ref<const bf16>(reinterpret_cast<const bf16*>(recv), rows, d), weights,
                         static_cast<const std::int32_t*>(row_of), plan.k, o);
        OCTET_CUDA_CHECK_LAUNCH();
    }
    if (!opt.returned.empty() && rows > 0 && d > 0) {
        if (f32)
            cuda::launch("moe_returned_kernel", detail::moe_returned_kernel<float>, static_cast<unsigned>(rows), 128, 0,
                         s, matrix_ref<const float>(reinterpret_cast<const float*>(recv), rows, d), opt.returned);
        else
            cuda::launch("moe_returned_kernel", detail::moe_returned_kernel<bf16>, static_cast<unsigned>(rows), 128, 0,
                         s, matrix_ref<const bf16>(reinterpret_cast<const bf16*>(recv), rows, d), opt.returned);
        OCTET_CUDA_CHECK_LAUNCH();
    }
    OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
    rep.exchange_s = detail::seconds_since(t0);  // the exchange and the sum (one synchronization)
    return rep;
}

}  // namespace octet
