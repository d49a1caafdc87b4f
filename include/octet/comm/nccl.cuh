// octet/comm/nccl.cuh: the compressed all-reduce over NCCL (GPU memory), the same algorithm and
// the same interface as the MPI version (comm/allreduce.hpp, comm/mpi.hpp).
//
//   octet::nccl_communicator comm(nccl_comm, stream);                     // non-owning
//   std::size_t ws = octet::compressed_allreduce_workspace(cfg, n, comm.size());
//   // ws bytes of device memory, 256-byte aligned (cudaMalloc), owned by the caller
//   octet::compressed_allreduce_synchronizing(comm, cfg, grad_on_device, workspace);  // grad <- sum over ranks
//
// Steps (see comm/allreduce.hpp): the 64-byte descriptors are all-gathered with ncclAllGather and
// compared on the host (every rank throws on a mismatch, before any data moves); each rank encodes
// its P shard messages on the device (codec.cuh kernels), exchanges them with grouped
// ncclSend/ncclRecv, validates the P received messages on the device (header fields against the
// expected ones, checksum, scales, padding) and all-reduces an error flag (ncclMax) before going
// on; it sums the P messages' dequantized coordinates in ROTATED coordinates in one kernel (rank
// order), re-encodes its reduced shard, all-gathers the P reduced messages (ncclAllGather into equal
// slots of the largest message's size), validates them the same way, and decodes each into its
// range of `grad`. Every rank decodes the same bytes: results are bit-identical across ranks and
// equal to the host path's (the same kernels as codec.cuh). compressed_allreduce_synchronizing
// synchronizes the stream three times (the descriptor check and the two error flags) and returns when the result is in
// `grad`.
//
//   octet::compressed_allreduce(comm, cfg, grad, workspace, device_status);  // never synchronizes
//   octet::check_allreduce_status(status_copied_to_host, comm.rank());        // what the above would throw
//
// The overload with a device status word enqueues the same steps and reports every verdict on the
// device (see its comment); it captures into a CUDA graph where NCCL does.
// NCCL needs one GPU per rank.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "octet/codec/codec.cuh"
#include "octet/comm/allreduce.hpp"
#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"

namespace octet {

namespace detail {
inline void nccl_check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess)
        throw error(std::string("octet::compressed_allreduce: ") + what + " failed: " + ncclGetErrorString(r));
}
}  // namespace detail

/// A non-owning view of an NCCL communicator and the stream executor octet's work runs on (its
/// allocator, if lent, serves the all-reduce's one temporary: the descriptors, 64 * (P + 1) bytes).
class nccl_communicator {
public:
    nccl_communicator(ncclComm_t comm, cudaStream_t stream) : nccl_communicator(comm, on_stream(stream)) {}
    nccl_communicator(ncclComm_t comm, const stream_executor& ex) : comm_(comm), ex_(ex) {
        detail::nccl_check(ncclCommUserRank(comm, &rank_), "ncclCommUserRank");
        detail::nccl_check(ncclCommCount(comm, &size_), "ncclCommCount");
    }
    int rank() const { return rank_; }
    int size() const { return size_; }
    ncclComm_t get() const { return comm_; }
    cudaStream_t stream() const { return ex_.stream; }
    const stream_executor& executor() const { return ex_; }

private:
    ncclComm_t comm_;
    stream_executor ex_;
    int rank_ = 0, size_ = 1;
};

namespace detail {

/// Where each part of the workspace lies (every part 256-byte aligned).
struct nccl_plan {
    std::vector<shard_range> shard;
    std::vector<wire_layout> layout;
    std::vector<std::uint64_t> send_off;  ///< P + 1 offsets of the stage-1 messages
    std::uint64_t slot = 0;               ///< bytes per message slot (largest message)
    std::uint64_t max_coded = 0;
    std::uint64_t flags = 0, expected = 0, send = 0, recv = 0, y = 0, gather = 0, total = 0;
};

inline std::uint64_t align256(std::uint64_t v) {
    return (v + 255) & ~std::uint64_t{255};
}

inline nccl_plan plan_nccl(const codec_config& cfg, std::size_t n, int P) {
    nccl_plan p;
    p.send_off.assign(static_cast<std::size_t>(P) + 1, 0);
    for (int r = 0; r < P; ++r) {
        p.shard.push_back(allreduce_shard(cfg, n, P, r));
        p.layout.push_back(wire_layout_of(cfg, p.shard.back().count));
        p.send_off[r + 1] = p.send_off[r] + p.layout.back().total_bytes;
        p.slot = std::max<std::uint64_t>(p.slot, p.layout.back().total_bytes);
        p.max_coded = std::max<std::uint64_t>(p.max_coded, p.layout.back().coded);
    }
    const std::uint64_t Pu = static_cast<std::uint64_t>(P);
    p.flags = 0;                                    // acc[P] u64, bad[P] u32, flag[4] int
    p.expected = align256(p.flags + Pu * 12 + 16);  // P x 64 expected headers
    p.send = align256(p.expected + Pu * 64);
    p.recv = align256(p.send + p.send_off[P]);
    p.y = align256(p.recv + Pu * p.slot);
    p.gather = align256(p.y + p.max_coded * sizeof(float));
    p.total = align256(p.gather + Pu * p.slot);
    return p;
}

/// The local argument checks of both compressed_allreduce overloads (throw octet::error); the plan.
inline nccl_plan nccl_local_checks(const codec_config& cfg, span<float> data, span<std::uint8_t> workspace,
                                   const allreduce_options& opt, int P, int me) {
    constexpr const char* fn = "octet::compressed_allreduce";
    const std::size_t n = data.size();
    validate_config(cfg, fn);
    OCTET_REQUIRE(n <= wire_max_elements, fn, "data", "has more than 2^40 elements");
    if (n) cuda::require_device_accessible(data.data(), fn, "data");
    nccl_plan plan = plan_nccl(cfg, n, P);
    std::uint8_t* ws = workspace.data();
    OCTET_REQUIRE(ws != nullptr && workspace.size() >= plan.total && is_aligned(ws, 256), fn, "workspace",
                  message("has ", workspace.size(), " bytes; it needs ", plan.total,
                          " bytes of 256-byte aligned device memory (compressed_allreduce_workspace)"));
    cuda::require_device_accessible(ws, fn, "workspace");
    if (!opt.feedback.empty()) {
        OCTET_REQUIRE(
            opt.feedback.size == n, fn, "options.feedback",
            message("has ", opt.feedback.size, " elements; the stage-1 residual covers the whole gradient (", n, ")"));
        cuda::require_device_accessible(opt.feedback.data, fn, "options.feedback");
    }
    if (!opt.reduced_feedback.empty()) {
        OCTET_REQUIRE(
            opt.reduced_feedback.size == plan.shard[me].count, fn, "options.reduced_feedback",
            message("has ", opt.reduced_feedback.size, " elements; this rank's shard has ", plan.shard[me].count));
        cuda::require_device_accessible(opt.reduced_feedback.data, fn, "options.reduced_feedback");
    }
    return plan;
}

/// The error text of an invalid message found in `stage` ("stage-1" or "reduced"): by this rank
/// (`mine`, from rank `rank`), or by rank `rank` (every rank stops). One home for both overloads.
inline std::string invalid_message_text(const char* stage, int me, bool mine, int rank) {
    constexpr const char* fn = "octet::compressed_allreduce";
    if (mine)
        return message(fn, ": the ", stage, " message from rank ", rank, " to rank ", me,
                       " is invalid (header, checksum, scales or padding)");
    return message(fn, ": rank ", rank, " received an invalid ", stage, " message; every rank stops");
}

/// status = descriptors_differ | rank << 16 when rank r's descriptor differs from rank 0's, else 0.
OCTET_KERNEL void nccl_descriptors_kernel(const std::uint8_t* all, int P, std::uint32_t* status) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    std::uint32_t st = 0;
    for (int r = 1; r < P && st == 0; ++r)
        for (int b = 0; b < 64; ++b)
            if (all[64 * r + b] != all[b]) {
                st = 1u | (static_cast<std::uint32_t>(r) << 16);
                break;
            }
    *status = st;
}

/// Folds an all-reduced stage flag (flag[0..1]: this rank's finding, flag[2]: the max over ranks)
/// into the status word, keeping the first failure.
OCTET_KERNEL void nccl_stage_status_kernel(const int* flag, std::uint32_t code, std::uint32_t* status) {
    if (threadIdx.x != 0 || blockIdx.x != 0 || *status != 0 || flag[2] == 0) return;
    const bool mine = flag[0] != 0;
    const std::uint32_t rank = static_cast<std::uint32_t>(mine ? flag[1] - 1 : flag[2] - 1);
    *status = code | (mine ? 0x100u : 0u) | (rank << 16);
}

/// Writes 64 bytes given by value (the descriptor) to device memory.
OCTET_KERNEL void nccl_store_words_kernel(codec_dev::header_words w, std::uint8_t* out) {
    if (threadIdx.x < 8) store_le64(out + 8 * threadIdx.x, w.w[threadIdx.x]);
}

}  // namespace detail

/// What a non-blocking compressed_allreduce found, in its status word: bits 0-7 the code, bit 8 set
/// when this rank found the invalid message, bits 16-31 the rank concerned. Every rank writes the
/// same code (the flags are all-reduced), so every rank knows whether `data` holds the sum.
enum class allreduce_status : std::uint32_t {
    ok = 0,
    descriptors_differ = 1,  ///< the ranks disagree on the call (config, size, options)
    stage1_invalid = 2,      ///< a stage-1 message failed validation
    reduced_invalid = 3,     ///< a reduced (all-gathered) message failed validation
};

/// The error text for a status word of a non-blocking compressed_allreduce on rank `me` (empty
/// for ok): the same text the synchronizing overload throws.
inline std::string allreduce_status_message(std::uint32_t status, int me) {
    const std::uint32_t code = status & 0xFFu;
    const int rank = static_cast<int>(status >> 16);
    const bool mine = (status & 0x100u) != 0;
    switch (static_cast<allreduce_status>(code)) {
        case allreduce_status::ok:
            return "";
        case allreduce_status::descriptors_differ:
            return detail::message(
                "octet::compressed_allreduce: the ranks disagree on the call (mismatched headers): "
                "rank ",
                rank,
                "'s descriptor differs from rank 0's; every rank must pass the same config, "
                "size and options");
        case allreduce_status::stage1_invalid:
            return detail::invalid_message_text("stage-1", me, mine, rank);
        case allreduce_status::reduced_invalid:
            return detail::invalid_message_text("reduced", me, mine, rank);
    }
    return detail::message("octet::compressed_allreduce: unknown status ", status);
}

/// Throws octet::error (allreduce_status_message) unless `status` (copied to the host) is ok.
inline void check_allreduce_status(std::uint32_t status, int me) {
    if ((status & 0xFFu) != 0) throw error(allreduce_status_message(status, me));
}

/// Device bytes the workspace of compressed_allreduce needs (the same on every rank).
inline std::size_t compressed_allreduce_workspace(const codec_config& cfg, std::size_t n, int world) {
    detail::validate_config(cfg, "octet::compressed_allreduce_workspace");
    OCTET_REQUIRE(world >= 1, "octet::compressed_allreduce_workspace", "world", "must be at least 1");
    return static_cast<std::size_t>(detail::plan_nccl(cfg, n, world).total);
}

/// The compressed all-reduce over NCCL: data (device memory) <- the sum over ranks. A template
/// (Comm is always nccl_communicator, deduced) so that only callers compile the codec's kernels.
template <class Comm, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int> = 0>
allreduce_report compressed_allreduce_synchronizing(Comm& comm, const codec_config& cfg, span<float> data,
                                                    span<std::uint8_t> workspace, const allreduce_options& opt = {}) {
    constexpr const char* fn = "octet::compressed_allreduce";
    using namespace detail::codec_dev;
    const cudaStream_t s = comm.stream();
    const int P = comm.size(), me = comm.rank();
    const std::size_t n = data.size();
    allreduce_report rep;
    rep.world = P;
    detail::nccl_plan plan;
    std::uint8_t* ws = workspace.data();
    const auto t_start = std::chrono::steady_clock::now();

    // 0. Agree. The descriptors travel through a small stream-ordered allocation of their own, so
    // that a rank whose workspace is bad still takes part in the all-gather (and then every rank throws).
    detail::agree_or_throw(
        cfg, n, P, me, opt, [&] { plan = detail::nccl_local_checks(cfg, data, workspace, opt, P, me); },
        [&](const void* send, void* recv) {
            const detail::stream_scratch buf(comm.executor(), 64 * (static_cast<std::size_t>(P) + 1));
            auto* d = buf.as<std::uint8_t>();
            OCTET_CUDA_CHECK(cudaMemcpyAsync(d, send, 64, cudaMemcpyHostToDevice, s));
            detail::nccl_check(ncclAllGather(d, d + 64, 64, ncclUint8, comm.get(), s), "ncclAllGather");
            OCTET_CUDA_CHECK(
                cudaMemcpyAsync(recv, d + 64, 64 * static_cast<std::size_t>(P), cudaMemcpyDeviceToHost, s));
            OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
        },
        fn);
    rep.agree_s = detail::seconds_since(t_start);

    const wire_layout& mine = plan.layout[me];
    const std::uint64_t msg_me = mine.total_bytes;
    auto* acc = reinterpret_cast<unsigned long long*>(ws + plan.flags);
    auto* bad = reinterpret_cast<unsigned*>(ws + plan.flags + 8 * static_cast<std::uint64_t>(P));
    int* flag = reinterpret_cast<int*>(ws + plan.flags + 12 * static_cast<std::uint64_t>(P));
    cudaEvent_t ev[6];
    for (auto& e : ev) OCTET_CUDA_CHECK(cudaEventCreate(&e));
    auto destroy_events = [&] {
        for (auto& e : ev) cudaEventDestroy(e);
    };
    auto check_flag = [&](const char* stage) {
        detail::nccl_check(ncclAllReduce(flag, flag + 2, 1, ncclInt, ncclMax, comm.get(), s), "ncclAllReduce");
        int host_flag[4] = {0, 0, 0, 0};
        OCTET_CUDA_CHECK(cudaMemcpyAsync(host_flag, flag, sizeof host_flag, cudaMemcpyDeviceToHost, s));
        OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
        if (host_flag[2] != 0) {
            destroy_events();
            throw error(detail::invalid_message_text(stage, me, host_flag[0] != 0,
                                                     host_flag[0] != 0 ? host_flag[1] - 1 : host_flag[2] - 1));
        }
    };

    // 1-2. Stage-1 messages.
    OCTET_CUDA_CHECK(cudaEventRecord(ev[0], s));
    std::uint8_t* send = ws + plan.send;
    for (int r = 0; r < P; ++r) {
        const residual_view fb =
            opt.feedback.empty() ? residual_view{} : opt.feedback.subrange(plan.shard[r].begin, plan.shard[r].count);
        dispatch_wire_format(cfg.format, [&](auto tr) {
            launch_encode<decltype(tr)>(s, cfg, plan.layout[r], data.data() + plan.shard[r].begin, false,
                                        plan.shard[r].begin, fb, 1 + static_cast<std::uint64_t>(me),
                                        send + plan.send_off[r]);
        });
        if (opt.tamper) opt.tamper(r, span<std::uint8_t>(send + plan.send_off[r], plan.layout[r].total_bytes));
    }
    OCTET_CUDA_CHECK(cudaEventRecord(ev[1], s));
    // 3. All-to-all.
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

    // 4. Validate the P messages of my shard, sum them in rotated coordinates, re-encode.
    {
        std::vector<std::uint8_t> expect(64 * static_cast<std::size_t>(P));
        for (int r = 0; r < P; ++r) expected_header_fields(expect.data() + 64 * r, cfg, mine, plan.shard[me].begin);
        OCTET_CUDA_CHECK(cudaMemcpyAsync(ws + plan.expected, expect.data(), expect.size(), cudaMemcpyHostToDevice, s));
        OCTET_CUDA_CHECK(cudaMemsetAsync(ws + plan.flags, 0, 12 * static_cast<std::uint64_t>(P) + 16, s));
        launch_validate(s, validation_of(mine, cfg.format, recv, msg_me, P, ws + plan.expected, acc, bad));
        validate_finish_kernel<<<1, 32, 0, s>>>(recv, msg_me, P, acc, bad, flag, me + 1);
        OCTET_CUDA_CHECK_LAUNCH();
        OCTET_CUDA_CHECK(cudaStreamSynchronize(s));  // `expect` is a host buffer the copy above reads
        check_flag("stage-1");
    }
    float* y = reinterpret_cast<float*>(ws + plan.y);
    std::uint8_t* gather = ws + plan.gather;
    dispatch_wire_format(cfg.format, [&](auto tr) {
        launch_decode<decltype(tr)>(s, mine, cfg.transform, cfg.seed, plan.shard[me].begin, recv, msg_me, P, y,
                                    decode_transformed);
        launch_encode<decltype(tr)>(s, cfg, mine, y, true, plan.shard[me].begin, opt.reduced_feedback, 0,
                                    gather + static_cast<std::uint64_t>(me) * plan.slot);
    });
    OCTET_CUDA_CHECK(cudaEventRecord(ev[3], s));

    // 6. All-gather the reduced shards (equal slots), validate, decode.
    detail::nccl_check(
        ncclAllGather(gather + static_cast<std::uint64_t>(me) * plan.slot, gather, plan.slot, ncclUint8, comm.get(), s),
        "ncclAllGather");
    OCTET_CUDA_CHECK(cudaEventRecord(ev[4], s));
    rep.bytes_sent += static_cast<std::size_t>(P - 1) * plan.slot;
    rep.bytes_received += static_cast<std::size_t>(P - 1) * plan.slot;
    {
        std::vector<std::uint8_t> expect(64 * static_cast<std::size_t>(P));
        for (int r = 0; r < P; ++r)
            expected_header_fields(expect.data() + 64 * r, cfg, plan.layout[r], plan.shard[r].begin);
        OCTET_CUDA_CHECK(cudaMemcpyAsync(ws + plan.expected, expect.data(), expect.size(), cudaMemcpyHostToDevice, s));
        OCTET_CUDA_CHECK(cudaMemsetAsync(ws + plan.flags, 0, 12 * static_cast<std::uint64_t>(P) + 16, s));
        for (int r = 0; r < P; ++r) {
            validate_args v =
                validation_of(plan.layout[r], cfg.format, gather + static_cast<std::uint64_t>(r) * plan.slot, 0, 1,
                              ws + plan.expected + 64 * r, acc + r, bad + r);
            launch_validate(s, v);
        }
        validate_finish_kernel<<<1, 32, 0, s>>>(gather, plan.slot, P, acc, bad, flag, me + 1);
        OCTET_CUDA_CHECK_LAUNCH();
        OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
        check_flag("reduced");
    }
    for (int r = 0; r < P; ++r)
        dispatch_wire_format(cfg.format, [&](auto tr) {
            launch_decode<decltype(tr)>(s, plan.layout[r], cfg.transform, cfg.seed, plan.shard[r].begin,
                                        gather + static_cast<std::uint64_t>(r) * plan.slot, 0, 1,
                                        data.data() + plan.shard[r].begin, decode_original);
        });
    OCTET_CUDA_CHECK(cudaEventRecord(ev[5], s));
    OCTET_CUDA_CHECK(cudaEventSynchronize(ev[5]));
    float ms[5] = {};
    for (int k = 0; k < 5; ++k) cudaEventElapsedTime(&ms[k], ev[k], ev[k + 1]);
    destroy_events();
    rep.encode_s = ms[0] * 1e-3;
    rep.exchange_s = ms[1] * 1e-3;
    rep.reduce_s = ms[2] * 1e-3;  // includes the stage-1 validation and its flag
    rep.gather_s = ms[3] * 1e-3;
    rep.decode_s = ms[4] * 1e-3;  // includes the stage-2 validation and its flag
    return rep;
}

/// The compressed all-reduce over NCCL without synchronizing the host: the same algorithm, bytes
/// and results as the overload above, with every verdict on the device. The descriptors are
/// all-gathered and compared by a kernel, the messages validated against headers passed by value,
/// the error flags all-reduced with ncclMax and folded into *device_status (std::uint32_t, device
/// memory; allreduce_status, the same value on every rank). Encode kernels that would write the
/// residuals and the final decode into `data` read the status and do nothing once it is not ok:
/// on failure `data` and the residuals keep their previous values except the stage-1 residual if
/// the failure came after stage 1. check_allreduce_status(status, rank) on the host throws the
/// synchronizing overload's error. Local argument errors still throw from the call, before any
/// NCCL operation (as with any collective called with bad arguments, the other ranks then wait);
/// ranks that disagree on the config or size are reported in the status, but the exchange has then
/// already paired messages of different sizes (NCCL's behaviour for mismatched calls applies):
/// bring a job up with the synchronizing overload. Enqueues: a descriptor kernel, ncclAllGather, a
/// compare kernel, the P encodes, grouped ncclSend/ncclRecv, validation, ncclAllReduce of a flag,
/// the rotated sum and re-encode, ncclAllGather, validation, ncclAllReduce, the P decodes; one
/// temporary of 64 * (P + 1) bytes from the communicator's executor allocator. The report carries
/// the byte counts; its timings are 0 (they would need a synchronization).
template <class Comm, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int> = 0>
allreduce_report compressed_allreduce(Comm& comm, const codec_config& cfg, span<float> data,
                                      span<std::uint8_t> workspace, std::uint32_t* device_status,
                                      const allreduce_options& opt = {}) {
    constexpr const char* fn = "octet::compressed_allreduce";
    using namespace detail::codec_dev;
    const cudaStream_t s = comm.stream();
    const int P = comm.size(), me = comm.rank();
    const std::size_t n = data.size();
    allreduce_report rep;
    rep.world = P;
    detail::nccl_plan plan;
    std::uint8_t* ws = workspace.data();

    // 0. Local checks (throw here), and this rank's descriptor, built by the shared agreement code
    // with a gather that only keeps it: the comparison happens on the device.
    header_words mine_desc{};
    detail::agree_or_throw(
        cfg, n, P, me, opt,
        [&] {
            plan = detail::nccl_local_checks(cfg, data, workspace, opt, P, me);
            OCTET_REQUIRE(device_status != nullptr && detail::is_aligned(device_status, 4), fn, "device_status",
                          "must be a 4-byte aligned std::uint32_t in device memory");
            cuda::require_device_accessible(device_status, fn, "device_status");
        },
        [&](const void* send, void* recv) {
            const auto* b = static_cast<const std::uint8_t*>(send);
            for (int k = 0; k < 8; ++k) mine_desc.w[k] = load_le64(b + 8 * k);
            for (int r = 0; r < P; ++r) std::memcpy(static_cast<std::uint8_t*>(recv) + 64 * r, send, 64);
        },
        fn);
    {
        const detail::stream_scratch buf(comm.executor(), 64 * (static_cast<std::size_t>(P) + 1));
        auto* d = buf.as<std::uint8_t>();
        detail::nccl_store_words_kernel<<<1, 32, 0, s>>>(mine_desc, d);
        OCTET_CUDA_CHECK_LAUNCH();
        detail::nccl_check(ncclAllGather(d, d + 64, 64, ncclUint8, comm.get(), s), "ncclAllGather");
        detail::nccl_descriptors_kernel<<<1, 32, 0, s>>>(d + 64, P, device_status);
        OCTET_CUDA_CHECK_LAUNCH();
    }

    const wire_layout& mine = plan.layout[me];
    const std::uint64_t msg_me = mine.total_bytes;
    auto* acc = reinterpret_cast<unsigned long long*>(ws + plan.flags);
    auto* bad = reinterpret_cast<unsigned*>(ws + plan.flags + 8 * static_cast<std::uint64_t>(P));
    int* flag = reinterpret_cast<int*>(ws + plan.flags + 12 * static_cast<std::uint64_t>(P));
    auto stage_status = [&](std::uint32_t code) {
        detail::nccl_check(ncclAllReduce(flag, flag + 2, 1, ncclInt, ncclMax, comm.get(), s), "ncclAllReduce");
        detail::nccl_stage_status_kernel<<<1, 32, 0, s>>>(flag, code, device_status);
        OCTET_CUDA_CHECK_LAUNCH();
    };
    auto words_of = [&](const wire_layout& l, std::uint64_t first) {
        std::uint8_t head[wire_header_bytes];
        expected_header_fields(head, cfg, l, first);
        header_words w{};
        for (int k = 0; k < 8; ++k) w.w[k] = load_le64(head + 8 * k);
        return w;
    };

    // 1-2. Stage-1 messages (the residual update is skipped once the status is bad).
    std::uint8_t* send = ws + plan.send;
    for (int r = 0; r < P; ++r) {
        const residual_view fb =
            opt.feedback.empty() ? residual_view{} : opt.feedback.subrange(plan.shard[r].begin, plan.shard[r].count);
        dispatch_wire_format(cfg.format, [&](auto tr) {
            launch_encode<decltype(tr)>(s, cfg, plan.layout[r], data.data() + plan.shard[r].begin, false,
                                        plan.shard[r].begin, fb, 1 + static_cast<std::uint64_t>(me),
                                        send + plan.send_off[r], device_status);
        });
        if (opt.tamper) opt.tamper(r, span<std::uint8_t>(send + plan.send_off[r], plan.layout[r].total_bytes));
    }
    // 3. All-to-all.
    std::uint8_t* recv = ws + plan.recv;
    detail::nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < P; ++r) {
        detail::nccl_check(ncclSend(send + plan.send_off[r], plan.layout[r].total_bytes, ncclUint8, r, comm.get(), s),
                           "ncclSend");
        detail::nccl_check(ncclRecv(recv + static_cast<std::uint64_t>(r) * msg_me, msg_me, ncclUint8, r, comm.get(), s),
                           "ncclRecv");
    }
    detail::nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    for (int r = 0; r < P; ++r)
        if (r != me) rep.bytes_sent += plan.layout[r].total_bytes, rep.bytes_received += msg_me;

    // 4. Validate the P messages of my shard (one expected header, by value), sum, re-encode.
    OCTET_CUDA_CHECK(cudaMemsetAsync(ws + plan.flags, 0, 12 * static_cast<std::uint64_t>(P) + 16, s));
    {
        validate_args v = validation_of(mine, cfg.format, recv, msg_me, P, nullptr, acc, bad);
        v.has_expected_words = true;
        v.expected_words = words_of(mine, plan.shard[me].begin);
        launch_validate(s, v);
    }
    validate_finish_kernel<<<1, 32, 0, s>>>(recv, msg_me, P, acc, bad, flag, me + 1);
    OCTET_CUDA_CHECK_LAUNCH();
    stage_status(static_cast<std::uint32_t>(allreduce_status::stage1_invalid));
    float* y = reinterpret_cast<float*>(ws + plan.y);
    std::uint8_t* gather = ws + plan.gather;
    dispatch_wire_format(cfg.format, [&](auto tr) {
        launch_decode<decltype(tr)>(s, mine, cfg.transform, cfg.seed, plan.shard[me].begin, recv, msg_me, P, y,
                                    decode_transformed, device_status);
        launch_encode<decltype(tr)>(s, cfg, mine, y, true, plan.shard[me].begin, opt.reduced_feedback, 0,
                                    gather + static_cast<std::uint64_t>(me) * plan.slot, device_status);
    });

    // 6. All-gather the reduced shards (equal slots), validate, decode into data.
    detail::nccl_check(
        ncclAllGather(gather + static_cast<std::uint64_t>(me) * plan.slot, gather, plan.slot, ncclUint8, comm.get(), s),
        "ncclAllGather");
    rep.bytes_sent += static_cast<std::size_t>(P - 1) * plan.slot;
    rep.bytes_received += static_cast<std::size_t>(P - 1) * plan.slot;
    OCTET_CUDA_CHECK(cudaMemsetAsync(ws + plan.flags, 0, 12 * static_cast<std::uint64_t>(P) + 16, s));
    for (int r = 0; r < P; ++r) {
        validate_args v = validation_of(plan.layout[r], cfg.format, gather + static_cast<std::uint64_t>(r) * plan.slot,
                                        0, 1, nullptr, acc + r, bad + r);
        v.has_expected_words = true;
        v.expected_words = words_of(plan.layout[r], plan.shard[r].begin);
        launch_validate(s, v);
    }
    validate_finish_kernel<<<1, 32, 0, s>>>(gather, plan.slot, P, acc, bad, flag, me + 1);
    OCTET_CUDA_CHECK_LAUNCH();
    stage_status(static_cast<std::uint32_t>(allreduce_status::reduced_invalid));
    for (int r = 0; r < P; ++r)
        dispatch_wire_format(cfg.format, [&](auto tr) {
            launch_decode<decltype(tr)>(s, plan.layout[r], cfg.transform, cfg.seed, plan.shard[r].begin,
                                        gather + static_cast<std::uint64_t>(r) * plan.slot, 0, 1,
                                        data.data() + plan.shard[r].begin, decode_original, device_status);
        });
    return rep;
}

}  // namespace octet
