// octet/comm/nccl.cuh: the compressed all-reduce over NCCL (GPU memory), the same algorithm and
// the same interface as the MPI version (comm/allreduce.hpp, comm/mpi.hpp).
//
//   octet::nccl_communicator comm(nccl_comm, stream);                     // non-owning
//   std::size_t ws = octet::compressed_allreduce_workspace(cfg, n, comm.size());
//   // ws bytes of device memory, 256-byte aligned (cudaMalloc), owned by the caller
//   octet::compressed_allreduce(comm, cfg, grad_on_device, workspace);    // grad <- sum over ranks
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
// equal to the host path's (the same kernels as codec.cuh). The call synchronizes the stream three
// times (the descriptor check and the two error flags) and returns when the result is in `grad`.
// NCCL needs one GPU per rank.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "octet/codec/codec.cuh"
#include "octet/comm/allreduce.hpp"
#include "octet/cuda/check.cuh"

namespace octet {

namespace detail {
inline void nccl_check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess)
        throw error(std::string("octet::compressed_allreduce: ") + what + " failed: " + ncclGetErrorString(r));
}
}  // namespace detail

/// A non-owning view of an NCCL communicator and the stream octet's work runs on.
class nccl_communicator {
public:
    nccl_communicator(ncclComm_t comm, cudaStream_t stream) : comm_(comm), stream_(stream) {
        detail::nccl_check(ncclCommUserRank(comm, &rank_), "ncclCommUserRank");
        detail::nccl_check(ncclCommCount(comm, &size_), "ncclCommCount");
    }
    int rank() const { return rank_; }
    int size() const { return size_; }
    ncclComm_t get() const { return comm_; }
    cudaStream_t stream() const { return stream_; }

private:
    ncclComm_t comm_;
    cudaStream_t stream_;
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

inline void expected_header(std::uint8_t* out, const codec_config& cfg, const wire_layout& l,
                            std::uint64_t first_index) {
    write_header_fields(out, cfg.format, cfg.transform, l.block, l.scale_block, cfg.seed, first_index, l.count, 1.0f,
                        l.total_bytes, cfg.stochastic);
}

}  // namespace detail

/// Device bytes the workspace of compressed_allreduce needs (the same on every rank).
inline std::size_t compressed_allreduce_workspace(const codec_config& cfg, std::size_t n, int world) {
    detail::validate_config(cfg, "octet::compressed_allreduce_workspace");
    OCTET_REQUIRE(world >= 1, "octet::compressed_allreduce_workspace", "world", "must be at least 1");
    return static_cast<std::size_t>(detail::plan_nccl(cfg, n, world).total);
}

/// The compressed all-reduce over NCCL: data (device memory) <- the sum over ranks. A template
/// (Comm is always nccl_communicator, deduced) so that only callers compile the codec's kernels.
template <class Comm, std::enable_if_t<std::is_same_v<Comm, nccl_communicator>, int> = 0>
allreduce_report compressed_allreduce(Comm& comm, const codec_config& cfg, span<float> data,
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
        cfg, n, P, me, opt,
        [&] {
            detail::validate_config(cfg, fn);
            OCTET_REQUIRE(n <= wire_max_elements, fn, "data", "has more than 2^40 elements");
            if (n) cuda::require_device_accessible(data.data(), fn, "data");
            plan = detail::plan_nccl(cfg, n, P);
            OCTET_REQUIRE(ws != nullptr && workspace.size() >= plan.total && detail::is_aligned(ws, 256), fn,
                          "workspace",
                          detail::message("has ", workspace.size(), " bytes; it needs ", plan.total,
                                          " bytes of 256-byte aligned device memory (compressed_allreduce_workspace)"));
            cuda::require_device_accessible(ws, fn, "workspace");
            if (!opt.feedback.empty()) {
                OCTET_REQUIRE(opt.feedback.size == n, fn, "options.feedback",
                              detail::message("has ", opt.feedback.size,
                                              " elements; the stage-1 residual covers the whole gradient (", n, ")"));
                cuda::require_device_accessible(opt.feedback.data, fn, "options.feedback");
            }
            if (!opt.reduced_feedback.empty()) {
                OCTET_REQUIRE(opt.reduced_feedback.size == plan.shard[me].count, fn, "options.reduced_feedback",
                              detail::message("has ", opt.reduced_feedback.size, " elements; this rank's shard has ",
                                              plan.shard[me].count));
                cuda::require_device_accessible(opt.reduced_feedback.data, fn, "options.reduced_feedback");
            }
        },
        [&](const void* send, void* recv) {
            void* buf = nullptr;
            OCTET_CUDA_CHECK(cudaMallocAsync(&buf, 64 * (static_cast<std::size_t>(P) + 1), s));
            auto* d = static_cast<std::uint8_t*>(buf);
            OCTET_CUDA_CHECK(cudaMemcpyAsync(d, send, 64, cudaMemcpyHostToDevice, s));
            detail::nccl_check(ncclAllGather(d, d + 64, 64, ncclUint8, comm.get(), s), "ncclAllGather");
            OCTET_CUDA_CHECK(
                cudaMemcpyAsync(recv, d + 64, 64 * static_cast<std::size_t>(P), cudaMemcpyDeviceToHost, s));
            OCTET_CUDA_CHECK(cudaFreeAsync(buf, s));
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
            if (host_flag[0] != 0)
                throw error(detail::message(fn, ": the ", stage, " message from rank ", host_flag[1] - 1, " to rank ",
                                            me, " is invalid (header, checksum, scales or padding)"));
            throw error(detail::message(fn, ": rank ", host_flag[2] - 1, " received an invalid ", stage,
                                        " message; every rank stops"));
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
        for (int r = 0; r < P; ++r) detail::expected_header(expect.data() + 64 * r, cfg, mine, plan.shard[me].begin);
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
            detail::expected_header(expect.data() + 64 * r, cfg, plan.layout[r], plan.shard[r].begin);
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

}  // namespace octet
