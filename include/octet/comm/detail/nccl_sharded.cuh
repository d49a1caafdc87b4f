// octet/comm/detail/nccl_sharded.cuh: the implementation of octet/comm/nccl_sharded.cuh (included at
// its end; the declarations and the contract are there). Kernels: the row amax of the all-gather's
// agreement and two stores of a value passed by value.
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

#include "octet/codec/codec.cuh"
#include "octet/comm/nccl.cuh"
#include "octet/comm/nccl_sharded.cuh"
#include "octet/comm/sharded.hpp"
#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/format/convert.cuh"
#include "octet/quant/quantize.cuh"

namespace octet {
namespace detail {

/// What a rank all-gathers in the agreement of the NCCL sharded operations: the host version's
/// descriptor, whether this rank's own arguments failed, and (the all-gather) its amax and
/// non-finite flag, which a kernel writes on the device.
template <class Desc>
struct nccl_agreement {
    Desc d{};
    std::int32_t local_error = 0;
    std::uint32_t amax_bits = 0;  ///< the finite amax of my_rows (atomic max on the bits, >= +0)
    std::uint32_t nonfinite = 0;  ///< my_rows holds a NaN or an Inf
    std::uint32_t reserved = 0;
};

/// *amax_bits <- max(|x(i, j)|) over finite elements (bits of a float >= +0), *nonfinite <- 1 if
/// any element is NaN or Inf. Max is exact: the order does not matter.
template <class In>
OCTET_KERNEL void rows_amax_kernel(matrix_ref<const In> x, std::uint32_t* amax_bits, std::uint32_t* nonfinite) {
    const std::uint64_t total = static_cast<std::uint64_t>(x.rows) * x.cols;
    float a = 0.0f;
    bool bad = false;
    for (std::uint64_t k = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
         k += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
        const float v = as_float(x(static_cast<std::size_t>(k / x.cols), static_cast<std::size_t>(k % x.cols)));
        const float f = finite_abs(v);
        a = f > a ? f : a;
        bad = bad || !is_finite_float(v);
    }
    if (a > 0.0f) atomicMax(amax_bits, float_to_bits(a));
    if (bad) atomicExch(nonfinite, 1u);
}

/// *out <- v (a float passed by value: no host buffer to outlive the copy).
OCTET_KERNEL void nccl_store_float_kernel(float v, float* out) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *out = v;
}

/// Step 0 of the NCCL sharded operations: `local_check` (throws octet::error on bad local
/// arguments, may take the scratch block) runs, then `on_device(slot)` enqueues what writes this
/// rank's device-side fields into its gathered slot (only when the checks passed); the P slots are
/// all-gathered with ncclAllGather and copied back (one stream synchronization). Every rank throws
/// together when any rank failed its checks; the caller compares the descriptors. Returns the P slots.
template <class Desc, class Check, class OnDevice>
std::vector<nccl_agreement<Desc>> nccl_agree(const nccl_communicator& comm, const stream_executor& ex, const Desc& mine,
                                             Check&& local_check, OnDevice&& on_device, const char* fn) {
    using A = nccl_agreement<Desc>;
    const int P = comm.size(), me = comm.rank();
    const cudaStream_t s = ex.stream;
    A a;
    a.d = mine;
    std::string local_message;
    try {
        local_check(a.d);
    } catch (const error& e) {
        a.local_error = 1;
        local_message = text_of(e);
    }
    std::vector<A> all(static_cast<std::size_t>(P));
    {
        const stream_scratch buf(ex, sizeof(A) * (static_cast<std::size_t>(P) + 1));
        auto* d = buf.as<A>();
        OCTET_CUDA_CHECK(cudaMemcpyAsync(d, &a, sizeof(A), cudaMemcpyHostToDevice, s));
        if (!a.local_error) on_device(d);
        nccl_check(ncclAllGather(d, d + 1, sizeof(A), ncclUint8, comm.get(), s), "ncclAllGather");
        OCTET_CUDA_CHECK(cudaMemcpyAsync(all.data(), d + 1, sizeof(A) * all.size(), cudaMemcpyDeviceToHost, s));
        OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    if (a.local_error)
        throw error(message(fn, ": rank ", me, " failed validation (every rank stops): ", local_message));
    for (int r = 0; r < P; ++r)
        if (all[r].local_error)
            throw error(message(fn, ": rank ", r,
                                " failed validation of its own arguments (or could not take its scratch); every "
                                "rank stops (see rank ",
                                r, "'s error)"));
    return all;
}

// ---- compressed reduce-scatter -------------------------------------------------------------------

/// Where each part of the reduce-scatter's block lies (every part 256-byte aligned).
struct nccl_rs_plan {
    std::vector<shard_range> shard;
    std::vector<wire_layout> layout;
    std::vector<std::uint64_t> send_off;  ///< P + 1 offsets of the messages this rank sends
    std::uint64_t flags = 0, expected = 0, send = 0, recv = 0, total = 0;
};

inline nccl_rs_plan plan_nccl_reduce_scatter(const codec_config& cfg, std::size_t n, int P, int me) {
    nccl_rs_plan p;
    p.send_off.assign(static_cast<std::size_t>(P) + 1, 0);
    for (int r = 0; r < P; ++r) {
        p.shard.push_back(allreduce_shard(cfg, n, P, r));
        p.layout.push_back(wire_layout_of(cfg, p.shard.back().count));
        p.send_off[r + 1] = p.send_off[r] + p.layout.back().total_bytes;
    }
    const std::uint64_t Pu = static_cast<std::uint64_t>(P);
    p.flags = 0;                                    // acc[P] u64, bad[P] u32, flag[4] int
    p.expected = align256(p.flags + Pu * 12 + 16);  // P x 64 expected headers
    p.send = align256(p.expected + Pu * 64);
    p.recv = align256(p.send + p.send_off[P]);
    p.total = align256(p.recv + Pu * p.layout[me].total_bytes);
    return p;
}

}  // namespace detail

inline std::size_t compressed_reduce_scatter_scratch_bytes(const stream_executor&, const codec_config& cfg,
                                                           std::size_t n, int world, int rank,
                                                           const reduce_scatter_options&) {
    constexpr const char* fn = "octet::compressed_reduce_scatter_scratch_bytes";
    detail::validate_config(cfg, fn);
    OCTET_REQUIRE(n <= wire_max_elements, fn, "n", detail::message("counts ", n, " elements; at most 2^40"));
    OCTET_REQUIRE(world >= 1, fn, "world", detail::message("is ", world, "; a communicator has at least one rank"));
    OCTET_REQUIRE(rank >= 0 && rank < world, fn, "rank", detail::message("is ", rank, "; ranks are 0..", world - 1));
    const std::size_t desc =
        sizeof(detail::nccl_agreement<detail::allreduce_descriptor>) * (static_cast<std::size_t>(world) + 1);
    return detail::scratch_round(desc) +
           detail::scratch_round(static_cast<std::size_t>(detail::plan_nccl_reduce_scatter(cfg, n, world, rank).total));
}

template <class Comm, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int>>
reduce_scatter_report compressed_reduce_scatter(Comm& comm, const stream_executor& ex, const codec_config& cfg,
                                                span<const float> grad, span<float> out_shard,
                                                const reduce_scatter_options& opt) {
    constexpr const char* fn = "octet::compressed_reduce_scatter";
    using namespace detail::codec_dev;
    const cudaStream_t s = ex.stream;
    const int P = comm.size(), me = comm.rank();
    const std::size_t n = grad.size();
    reduce_scatter_report rep;
    rep.world = P;
    detail::nccl_rs_plan plan;
    std::optional<detail::stream_scratch> block;
    const auto t_start = std::chrono::steady_clock::now();

    // 0. Local checks and the block (a rank that fails either stops every rank), then agree.
    const detail::allreduce_descriptor desc = detail::make_reduce_scatter_descriptor(cfg, n, P, opt);
    const auto all = detail::nccl_agree(
        comm, ex, desc,
        [&](detail::allreduce_descriptor&) {
            allreduce_options ao;
            ao.expected_ranks = opt.expected_ranks;
            detail::check_expected_ranks(ao, P, fn);
            detail::validate_config(cfg, fn);
            OCTET_REQUIRE(n == 0 || grad.data() != nullptr, fn, "grad", "is null with a non-zero size");
            OCTET_REQUIRE(n <= wire_max_elements, fn, "grad", "has more than 2^40 elements");
            if (n) cuda::require_device_accessible(grad.data(), fn, "grad");
            const shard_range sh = allreduce_shard(cfg, n, P, me);
            OCTET_REQUIRE(out_shard.size() == sh.count, fn, "out_shard",
                          detail::message("has ", out_shard.size(), " elements; this rank's shard has ", sh.count,
                                          " (allreduce_shard(cfg, grad.size(), ", P, ", ", me, "))"));
            OCTET_REQUIRE(sh.count == 0 || out_shard.data() != nullptr, fn, "out_shard",
                          "is null with a non-zero size");
            if (sh.count) cuda::require_device_accessible(out_shard.data(), fn, "out_shard");
            if (!opt.feedback.empty()) {
                OCTET_REQUIRE(opt.feedback.size == n, fn, "options.feedback",
                              detail::message("has ", opt.feedback.size,
                                              " elements; the residual covers the whole gradient (", n, ")"));
                cuda::require_device_accessible(opt.feedback.data, fn, "options.feedback");
            }
            plan = detail::plan_nccl_reduce_scatter(cfg, n, P, me);
            block.emplace(ex, static_cast<std::size_t>(plan.total));
        },
        [](auto*) {}, fn);
    {
        std::vector<detail::allreduce_descriptor> descriptors(all.size());
        for (std::size_t r = 0; r < all.size(); ++r) descriptors[r] = all[r].d;
        detail::throw_unless_agreed(descriptors.data(), P, fn);
    }
    rep.agree_s = detail::seconds_since(t_start);

    std::uint8_t* ws = block->as<std::uint8_t>();
    const shard_range mine_shard = plan.shard[me];
    const wire_layout& mine = plan.layout[me];
    const std::uint64_t msg_me = mine.total_bytes;
    rep.shard = mine_shard;
    rep.float_bytes = 4 * (n - mine_shard.count);
    auto* acc = reinterpret_cast<unsigned long long*>(ws + plan.flags);
    auto* bad = reinterpret_cast<unsigned*>(ws + plan.flags + 8 * static_cast<std::uint64_t>(P));
    int* flag = reinterpret_cast<int*>(ws + plan.flags + 12 * static_cast<std::uint64_t>(P));
    cudaEvent_t ev[4];
    for (auto& e : ev) OCTET_CUDA_CHECK(cudaEventCreate(&e));
    struct events_guard {
        cudaEvent_t* e;
        ~events_guard() {
            for (int k = 0; k < 4; ++k) cudaEventDestroy(e[k]);
        }
    } guard{ev};

    // 1-2. This rank's message of every shard (stage-1 feedback over the shard's part of the residual).
    OCTET_CUDA_CHECK(cudaEventRecord(ev[0], s));
    std::uint8_t* send = ws + plan.send;
    for (int r = 0; r < P; ++r) {
        const residual_view fb =
            opt.feedback.empty() ? residual_view{} : opt.feedback.subrange(plan.shard[r].begin, plan.shard[r].count);
        dispatch_wire_format(cfg.format, [&](auto tr) {
            launch_encode<decltype(tr)>(s, cfg, plan.layout[r], grad.data() + plan.shard[r].begin, false,
                                        plan.shard[r].begin, fb, 1 + static_cast<std::uint64_t>(me),
                                        send + plan.send_off[r]);
        });
        if (opt.tamper) opt.tamper(r, span<std::uint8_t>(send + plan.send_off[r], plan.layout[r].total_bytes));
    }
    OCTET_CUDA_CHECK(cudaEventRecord(ev[1], s));
    // 3. All-to-all: the P messages of my shard.
    std::uint8_t* recv = ws + plan.recv;
    detail::nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < P; ++r) {
        detail::nccl_check(ncclSend(send + plan.send_off[r], plan.layout[r].total_bytes, ncclUint8, r, comm.get(), s),
                           "ncclSend");
        detail::nccl_check(ncclRecv(recv + static_cast<std::uint64_t>(r) * msg_me, msg_me, ncclUint8, r, comm.get(), s),
                           "ncclRecv");
    }
    detail::nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    OCTET_CUDA_CHECK(cudaEventRecord(ev[2], s));
    for (int r = 0; r < P; ++r)
        if (r != me) rep.bytes_sent += plan.layout[r].total_bytes, rep.bytes_received += msg_me;

    // 4. Validate the P messages (every rank throws together on an invalid one), sum them in
    // rotated coordinates in rank order and transform the sum back into out_shard (one kernel).
    {
        std::vector<std::uint8_t> expect(64 * static_cast<std::size_t>(P));
        for (int r = 0; r < P; ++r) expected_header_fields(expect.data() + 64 * r, cfg, mine, mine_shard.begin);
        OCTET_CUDA_CHECK(cudaMemcpyAsync(ws + plan.expected, expect.data(), expect.size(), cudaMemcpyHostToDevice, s));
        OCTET_CUDA_CHECK(cudaMemsetAsync(ws + plan.flags, 0, 12 * static_cast<std::uint64_t>(P) + 16, s));
        launch_validate(s, validation_of(mine, cfg.format, recv, msg_me, P, ws + plan.expected, acc, bad));
        validate_finish_kernel<<<1, 32, 0, s>>>(recv, msg_me, P, acc, bad, flag, me + 1);
        OCTET_CUDA_CHECK_LAUNCH();
        detail::nccl_check(ncclAllReduce(flag, flag + 2, 1, ncclInt, ncclMax, comm.get(), s), "ncclAllReduce");
        int host_flag[4] = {0, 0, 0, 0};
        OCTET_CUDA_CHECK(cudaMemcpyAsync(host_flag, flag, sizeof host_flag, cudaMemcpyDeviceToHost, s));
        OCTET_CUDA_CHECK(cudaStreamSynchronize(s));  // also: `expect` is a host buffer the copy above reads
        if (host_flag[2] != 0) {
            if (host_flag[0] != 0)
                throw error(detail::message(fn, ": the stage-1 message from rank ", host_flag[1] - 1, " to rank ", me,
                                            " is invalid (header, checksum, scales or padding)"));
            throw error(
                detail::message(fn, ": rank ", host_flag[2] - 1, " received an invalid message; every rank stops"));
        }
    }
    dispatch_wire_format(cfg.format, [&](auto tr) {
        launch_decode<decltype(tr)>(s, mine, cfg.transform, cfg.seed, mine_shard.begin, recv, msg_me, P,
                                    out_shard.data(), decode_original);
    });
    OCTET_CUDA_CHECK(cudaEventRecord(ev[3], s));
    OCTET_CUDA_CHECK(cudaEventSynchronize(ev[3]));
    float ms[3] = {};
    for (int k = 0; k < 3; ++k) cudaEventElapsedTime(&ms[k], ev[k], ev[k + 1]);
    rep.encode_s = ms[0] * 1e-3;
    rep.exchange_s = ms[1] * 1e-3;
    rep.reduce_s = ms[2] * 1e-3;  // includes the validation and its flag
    return rep;
}

// ---- quantized all-gather ---------------------------------------------------------------------

namespace detail {

/// The all-gather's device block (every part 256-byte aligned): this rank's scale grid, every
/// rank's, the local tensor scale and the global amax; with out_t, every rank's column-wise codes
/// and scale grids (this rank quantizes its own in place there) and their local tensor scale.
struct nccl_ag_plan {
    std::size_t scales = 0, gathered = 0, tensor_scale = 0, amax = 0;
    std::size_t codes_t = 0, gathered_t = 0, tensor_scale_t = 0, total = 0;
};

template <class Recipe>
nccl_ag_plan plan_nccl_allgather(std::size_t rows, const quant_layout& out, const quant_layout& out_t, bool want_row,
                                 bool want_col, int P) {
    using LO = quant_layout_of<Recipe>;
    const std::size_t world = static_cast<std::size_t>(P);
    nccl_ag_plan p;
    std::size_t at = 0;
    if (want_row) {
        const quant_layout l = local_layout<Recipe>(rows, out);
        p.scales = at;
        p.gathered = align256(p.scales + l.scale_bytes);
        at = align256(p.gathered + (out.scale_rows + world) * out.scale_cols * Recipe::scale_bytes);
    }
    if (want_col) {
        p.codes_t = at;
        p.gathered_t = align256(p.codes_t + out_t.rows * (out_t.cols / LO::group_codes + world + 1) * LO::group_bytes);
        at = align256(p.gathered_t + (out_t.scale_cols + world) * out_t.scale_rows * Recipe::scale_bytes);
    }
    p.tensor_scale = at;
    p.tensor_scale_t = at + 4;
    p.amax = at + 8;
    p.total = align256(p.amax + 4);
    return p;
}

/// quantize_scratch_bytes of a rank's quantize call (row-wise and/or column-wise local copies).
template <class Recipe, class In>
std::size_t nccl_ag_quantize_bytes(const matrix_ref<const In>& x, const quant_layout& out, bool want_row,
                                   bool want_col) {
    if (x.empty()) return 0;
    static std::uint8_t stand_in = 0;  // a non-null pointer: the query reads the layouts only
    quantized_ref<Recipe> local, local_t;
    if (want_row) local = quantized_ref<Recipe>(&stand_in, &stand_in, local_layout<Recipe>(x.rows, out), nullptr);
    if (want_col)
        local_t = quantized_ref<Recipe>(&stand_in, &stand_in, local_layout_t<Recipe>(x.rows, x.cols), nullptr);
    device_quantize_options qo;
    float dummy = 0.0f;
    if (Recipe::is_per_tensor || Recipe::two_level) qo.device_tensor_amax = &dummy;
    return quantize_scratch_bytes<Recipe>(x, local, local_t, qo);
}

template <class Recipe, class T>
std::size_t nccl_ag_scratch_bytes(matrix_ref<T> my_rows, quantized_ref<Recipe> out, quantized_ref<Recipe> out_t,
                                  int world) {
    check_allgather_recipe<Recipe>();
    using In = std::remove_const_t<T>;
    OCTET_REQUIRE(world >= 1, "octet::quantized_allgather_scratch_bytes", "world",
                  message("is ", world, "; a communicator has at least one rank"));
    const bool want_row = !out.absent(), want_col = !out_t.absent();
    const std::size_t desc = sizeof(nccl_agreement<allgather_descriptor>) * (static_cast<std::size_t>(world) + 1);
    const matrix_ref<const In> x(my_rows.data, my_rows.rows, my_rows.cols, my_rows.ld, my_rows.order);
    const std::size_t q = nccl_ag_quantize_bytes<Recipe, In>(x, out.layout, want_row, want_col);
    return scratch_round(desc) +
           scratch_round(
               plan_nccl_allgather<Recipe>(my_rows.rows, out.layout, out_t.layout, want_row, want_col, world).total) +
           scratch_round(q);
}

template <class Recipe, class Comm, class T>
quantized_allgather_report nccl_quantized_allgather(Comm& comm, const stream_executor& ex, matrix_ref<T> my_rows,
                                                    quantized_ref<Recipe> out, quantized_ref<Recipe> out_t,
                                                    const quantized_allgather_options& opt) {
    constexpr const char* fn = "octet::quantized_allgather";
    check_allgather_recipe<Recipe>();
    using In = storage_of_t<std::remove_const_t<T>>;  // __nv_bfloat16 / __half as octet's types
    static_assert(is_quant_input_v<In>, "octet::quantized_allgather: my_rows must be float, bf16 or fp16");
    using G = typename Recipe::granularity;
    const matrix_ref<const In> x(reinterpret_cast<const In*>(my_rows.data), my_rows.rows, my_rows.cols, my_rows.ld,
                                 my_rows.order);
    const cudaStream_t s = ex.stream;
    const int P = comm.size(), me = comm.rank();
    const std::size_t world = static_cast<std::size_t>(P);
    constexpr bool tensor_amax = Recipe::is_per_tensor || Recipe::two_level;
    constexpr bool whole_nan = Recipe::is_per_tensor && Recipe::propagates_nan;
    const bool want_row = !out.absent(), want_col = !out_t.absent();
    quantized_allgather_report rep;
    rep.world = P;
    const auto t_start = std::chrono::steady_clock::now();

    // 0. Local checks and the block, this rank's amax on the device, the agreement.
    std::optional<stream_scratch> block;
    nccl_ag_plan plan;
    allgather_descriptor d0;
    const quant_layout no_layout{};
    const auto all = nccl_agree(
        comm, ex, d0,
        [&](allgather_descriptor& d) {
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
                cuda::require_device_accessible(out.data, fn, "out.data");
                cuda::require_device_accessible(out.scales, fn, "out.scales");
                if constexpr (Recipe::two_level)
                    cuda::require_device_accessible(out.tensor_scale, fn, "out.tensor_scale");
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
                cuda::require_device_accessible(out_t.data, fn, "out_t.data");
                cuda::require_device_accessible(out_t.scales, fn, "out_t.scales");
                if constexpr (Recipe::two_level)
                    cuda::require_device_accessible(out_t.tensor_scale, fn, "out_t.tensor_scale");
            }
            if (!x.empty()) cuda::require_device_accessible(x.data, fn, "my_rows");
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
            plan = plan_nccl_allgather<Recipe>(x.rows, want_row ? out.layout : no_layout,
                                               want_col ? out_t.layout : no_layout, want_row, want_col, P);
            block.emplace(ex, plan.total);
        },
        [&](nccl_agreement<allgather_descriptor>* slot) {
            if (!(tensor_amax || whole_nan) || x.empty()) return;
            const std::uint64_t total = static_cast<std::uint64_t>(x.rows) * x.cols;
            const unsigned blocks = static_cast<unsigned>(std::min<std::uint64_t>((total + 255) / 256, 1024));
            cuda::launch("rows_amax_kernel", rows_amax_kernel<In>, blocks, 256, 0, s, x, &slot->amax_bits,
                         &slot->nonfinite);
            OCTET_CUDA_CHECK_LAUNCH();
        },
        fn);
    for (int r = 1; r < P; ++r)
        if (std::memcmp(&all[0].d, &all[r].d, allgather_agreed_bytes) != 0)
            throw error(message(fn, ": the ranks disagree on the call (mismatched descriptors): ",
                                describe_mismatch(all[0].d, all[r].d, 0, r),
                                "; every rank must pass the same cols, recipe, out / out_t shapes and options"));
    // Every rank decides the rest from the same descriptors: the same decision everywhere.
    std::size_t total = 0, offset = 0;
    float amax = 0.0f;
    int nan_rank = -1, first_nonempty = -1;
    for (int r = 0; r < P; ++r) {
        const auto& ar = all[r];
        if (r == me) offset = total;
        total += static_cast<std::size_t>(ar.d.rows);
        if constexpr (tensor_amax) amax = std::max(amax, bits_to_float(ar.amax_bits));
        if (whole_nan && ar.nonfinite && nan_rank < 0) nan_rank = r;
        if (ar.d.rows > 0 && first_nonempty < 0) first_nonempty = r;
    }
    check_gathered_rows<Recipe>(
        fn, P, [&](int r) { return static_cast<std::size_t>(all[r].d.rows); }, total,
        static_cast<std::size_t>(d0.total_rows), x.cols, want_row, want_col);
    rep.row_offset = offset;
    rep.rows = total;
    rep.amax = amax;
    rep.agree_s = seconds_since(t_start);
    if (total == 0 || x.cols == 0) return rep;  // quantize writes nothing for an empty matrix

    cudaEvent_t ev[3];
    for (auto& e : ev) OCTET_CUDA_CHECK(cudaEventCreate(&e));
    struct events_guard {
        cudaEvent_t* e;
        ~events_guard() {
            for (int k = 0; k < 3; ++k) cudaEventDestroy(e[k]);
        }
    } guard{ev};

    // Where every rank's pieces go: row-wise codes into out.data, scale grids and column-wise codes
    // into the block (the same offsets on every rank).
    const std::size_t sb = Recipe::scale_bytes;
    std::vector<std::size_t> code_count(world), code_off(world), scale_count(world), scale_off(world);
    std::vector<std::size_t> code_count_t(world), code_off_t(world), scale_count_t(world), scale_off_t(world);
    std::size_t every = 0;
    {
        std::size_t c = 0, sc = 0, ct = 0, st = 0;
        for (int r = 0; r < P; ++r) {
            const std::size_t m = static_cast<std::size_t>(all[r].d.rows);
            if (want_row) {
                code_count[r] = m * out.layout.row_bytes;
                scale_count[r] = block_count(G::rows, m) * out.layout.scale_cols * sb;
            }
            if (want_col && m > 0) {
                const quant_layout lr = local_layout_t<Recipe>(m, x.cols);
                code_count_t[r] = lr.data_bytes;
                scale_count_t[r] = lr.scale_cols * out_t.layout.scale_rows * sb;
            }
            code_off[r] = c, scale_off[r] = sc, code_off_t[r] = ct, scale_off_t[r] = st;
            c += code_count[r], sc += scale_count[r], ct += code_count_t[r], st += scale_count_t[r];
        }
        every = c + sc + ct + st;
    }

    // 1. Quantize my rows (and their transpose) with the whole matrix's amax: the row-wise codes
    // straight into my rows of out.data, the column-wise codes and scales into my place in the block.
    OCTET_CUDA_CHECK(cudaEventRecord(ev[0], s));
    auto* ws = block->as<std::uint8_t>();
    std::uint8_t* my_scales = ws + plan.scales;
    std::uint8_t* gathered = ws + plan.gathered;
    std::uint8_t* codes_t = ws + plan.codes_t;
    std::uint8_t* gathered_t = ws + plan.gathered_t;
    auto* local_tensor_scale = reinterpret_cast<float*>(ws + plan.tensor_scale);
    auto* local_tensor_scale_t = reinterpret_cast<float*>(ws + plan.tensor_scale_t);
    auto* global_amax = reinterpret_cast<float*>(ws + plan.amax);
    if (!x.empty()) {
        quantized_ref<Recipe> local, local_t;
        if (want_row)
            local = quantized_ref<Recipe>(out.data + offset * out.layout.row_bytes, my_scales,
                                          local_layout<Recipe>(x.rows, out.layout), local_tensor_scale);
        if (want_col)
            local_t = quantized_ref<Recipe>(codes_t + code_off_t[me], gathered_t + scale_off_t[me],
                                            local_layout_t<Recipe>(x.rows, x.cols), local_tensor_scale_t);
        device_quantize_options qo;
        if constexpr (tensor_amax) {
            cuda::launch("nccl_store_float_kernel", nccl_store_float_kernel, 1, 32, 0, s, amax, global_amax);
            OCTET_CUDA_CHECK_LAUNCH();
            qo.device_tensor_amax = global_amax;
        }
        quantize<Recipe>(ex, x, local, local_t, qo);
    }
    OCTET_CUDA_CHECK(cudaEventRecord(ev[1], s));

    // 2. Every rank's pieces to every rank, one group of ncclBroadcast (roots: the ranks with rows).
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < P; ++r) {
        if (all[r].d.rows == 0) continue;  // the same decision on every rank
        if (want_row) {
            std::uint8_t* codes_r = out.data + code_off[r];
            nccl_check(ncclBroadcast(codes_r, codes_r, code_count[r], ncclUint8, r, comm.get(), s), "ncclBroadcast");
            nccl_check(ncclBroadcast(r == me ? my_scales : gathered + scale_off[r], gathered + scale_off[r],
                                     scale_count[r], ncclUint8, r, comm.get(), s),
                       "ncclBroadcast");
        }
        if (want_col) {
            nccl_check(ncclBroadcast(codes_t + code_off_t[r], codes_t + code_off_t[r], code_count_t[r], ncclUint8, r,
                                     comm.get(), s),
                       "ncclBroadcast");
            nccl_check(ncclBroadcast(gathered_t + scale_off_t[r], gathered_t + scale_off_t[r], scale_count_t[r],
                                     ncclUint8, r, comm.get(), s),
                       "ncclBroadcast");
        }
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    const std::size_t mine = code_count[me] + scale_count[me] + code_count_t[me] + scale_count_t[me];
    rep.bytes_sent = (world - 1) * mine;
    rep.bytes_received = every - mine;
    rep.float_bytes_sent = (world - 1) * x.rows * x.cols * sizeof(float);
    rep.bf16_bytes_sent = rep.float_bytes_sent / 2;

    if (want_row) {
        const std::size_t sc = out.layout.scale_cols;
        OCTET_CUDA_CHECK(cudaMemsetAsync(out.scales, 0, out.layout.scale_bytes, s));
        if constexpr (G::rows == full) {
            // One grid row, the same on every rank with rows; a NaN on any rank makes the whole copy
            // NaN (its scale, zero codes), as quantize of the whole matrix does.
            const int from = nan_rank >= 0 ? nan_rank : first_nonempty;
            OCTET_CUDA_CHECK(
                cudaMemcpyAsync(out.scales, gathered + scale_off[from], sc * sb, cudaMemcpyDeviceToDevice, s));
            if (nan_rank >= 0) OCTET_CUDA_CHECK(cudaMemsetAsync(out.data, 0, total * out.layout.row_bytes, s));
        } else {
            std::size_t begin = 0;
            for (int r = 0; r < P; ++r) {
                const std::size_t m = static_cast<std::size_t>(all[r].d.rows);
                const std::size_t lr = block_count(G::rows, m), b0 = begin / G::rows;
                // rank r's grid is column-major (lr x sc, unpadded); out's has scale_ld rows per column
                if (lr)
                    OCTET_CUDA_CHECK(cudaMemcpy2DAsync(out.scales + b0 * sb, out.layout.scale_ld * sb,
                                                       gathered + scale_off[r], lr * sb, lr * sb, sc,
                                                       cudaMemcpyDeviceToDevice, s));
                begin += m;
            }
        }
        if constexpr (Recipe::two_level) {
            cuda::launch("nccl_store_float_kernel", nccl_store_float_kernel, 1, 32, 0, s,
                         make_tensor_scale<Recipe>(amax), out.tensor_scale);
            OCTET_CUDA_CHECK_LAUNCH();
        }
    }
    if (want_col) {
        // x^T's rows hold every rank's columns side by side (padding codes zero); its block columns
        // are the ranks' (x's rows start on multiples of C): two strided copies per rank.
        using LO = quant_layout_of<Recipe>;
        const std::size_t srt = out_t.layout.scale_rows, ld_t = out_t.layout.scale_ld;
        OCTET_CUDA_CHECK(cudaMemsetAsync(out_t.data, 0, out_t.layout.data_bytes, s));
        OCTET_CUDA_CHECK(cudaMemsetAsync(out_t.scales, 0, out_t.layout.scale_bytes, s));
        if constexpr (G::cols == full) {  // per tensor
            const int from = nan_rank >= 0 ? nan_rank : first_nonempty;
            OCTET_CUDA_CHECK(
                cudaMemcpyAsync(out_t.scales, gathered_t + scale_off_t[from], sb, cudaMemcpyDeviceToDevice, s));
        }
        std::size_t begin = 0;
        for (int r = 0; r < P; ++r) {
            const std::size_t m = static_cast<std::size_t>(all[r].d.rows);
            if (m > 0 && !(G::cols == full && nan_rank >= 0)) {
                const std::size_t local_bytes = local_layout_t<Recipe>(m, x.cols).row_bytes;
                OCTET_CUDA_CHECK(cudaMemcpy2DAsync(out_t.data + LO::bytes_for_codes(begin), out_t.layout.row_bytes,
                                                   codes_t + code_off_t[r], local_bytes, local_bytes, x.cols,
                                                   cudaMemcpyDeviceToDevice, s));
            }
            if constexpr (G::cols != full) {
                const std::size_t lc = block_count(G::cols, m), b0 = begin / G::cols;
                if (lc)
                    OCTET_CUDA_CHECK(cudaMemcpy2DAsync(out_t.scales + b0 * ld_t * sb, ld_t * sb,
                                                       gathered_t + scale_off_t[r], srt * sb, srt * sb, lc,
                                                       cudaMemcpyDeviceToDevice, s));
            }
            begin += m;
        }
        if constexpr (Recipe::two_level) {
            cuda::launch("nccl_store_float_kernel", nccl_store_float_kernel, 1, 32, 0, s,
                         make_tensor_scale<Recipe>(amax), out_t.tensor_scale);
            OCTET_CUDA_CHECK_LAUNCH();
        }
    }
    OCTET_CUDA_CHECK(cudaEventRecord(ev[2], s));
    OCTET_CUDA_CHECK(cudaEventSynchronize(ev[2]));
    float ms[2] = {};
    for (int k = 0; k < 2; ++k) cudaEventElapsedTime(&ms[k], ev[k], ev[k + 1]);
    rep.quantize_s = ms[0] * 1e-3;
    rep.gather_s = ms[1] * 1e-3;
    return rep;
}

}  // namespace detail

template <class Recipe, class T>
std::size_t quantized_allgather_scratch_bytes(const stream_executor&, matrix_ref<T> my_rows, quantized_ref<Recipe> out,
                                              int world) {
    return detail::nccl_ag_scratch_bytes<Recipe>(my_rows, out, quantized_ref<Recipe>{}, world);
}

template <class Recipe, class T>
std::size_t quantized_allgather_scratch_bytes(const stream_executor&, matrix_ref<T> my_rows, quantized_ref<Recipe> out,
                                              quantized_ref<Recipe> out_t, int world) {
    detail::check_allgather_columnwise_recipe<Recipe>();
    return detail::nccl_ag_scratch_bytes<Recipe>(my_rows, out, out_t, world);
}

template <class Recipe, class Comm, class T, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int>>
quantized_allgather_report quantized_allgather(Comm& comm, const stream_executor& ex, matrix_ref<T> my_rows,
                                               quantized_ref<Recipe> out, const quantized_allgather_options& opt) {
    return detail::nccl_quantized_allgather<Recipe>(comm, ex, my_rows, out, quantized_ref<Recipe>{}, opt);
}

template <class Recipe, class Comm, class T, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int>>
quantized_allgather_report quantized_allgather(Comm& comm, const stream_executor& ex, matrix_ref<T> my_rows,
                                               quantized_ref<Recipe> out, quantized_ref<Recipe> out_t,
                                               const quantized_allgather_options& opt) {
    detail::check_allgather_columnwise_recipe<Recipe>();
    return detail::nccl_quantized_allgather<Recipe>(comm, ex, my_rows, out, out_t, opt);
}

}  // namespace octet
