// octet/comm/allreduce.hpp: the compressed all-reduce, written once over a small transport
// interface (MPI for CPU processes: comm/mpi.hpp; NCCL for GPUs: comm/nccl.cuh, same algorithm on
// device buffers). This header needs neither MPI nor CUDA.
//
//   octet::mpi_communicator comm;                                     // comm/mpi.hpp
//   octet::allreduce_report r = octet::compressed_allreduce(comm, cfg, grad);   // grad <- sum over ranks
//
// Algorithm (P ranks, n elements, every rank holds its own gradient g_r):
//   0. agree: every rank contributes a 64-byte descriptor (codec config, n, P, the caller's
//      expected rank count, feedback shapes, and whether its own arguments passed validation) to
//      one all-gather; if the descriptors differ, or any rank failed validation, EVERY rank throws
//      octet::error (the same decision everywhere, so no rank is left waiting in a later collective).
//      On the host (compressed_allreduce_host) each rank first validates its arguments and takes
//      its one block of scratch (below), and the ranks exchange a failure flag (allreduce_max)
//      before the descriptors: a rank that cannot take its scratch stops every rank there;
//   1. shard: [0, n) is cut into P contiguous shards on multiples of the granule
//      G = max(Hadamard block, scale block, 128) (allreduce_shard); rank s owns shard s;
//   2. encode: every rank encodes each shard of its gradient as one message (transform, scales,
//      codes; with options.feedback, the stage-1 residual of g_r is added and updated);
//   3. all-to-all: rank s receives the P messages of shard s;
//   4. reduce: rank s validates each message (header and checksum), dequantizes it WITHOUT the
//      inverse transform and sums the P of them in float, in rank order 0..P-1. The sum is taken in
//      ROTATED coordinates: the transform is linear and every rank uses the same seed and global
//      indices, so T(sum g_r) = sum T(g_r), and two transforms per shard are saved;
//   5. re-encode: rank s encodes the reduced shard from rotated coordinates (with
//      options.reduced_feedback, the stage-2 residual of the owned shard is added and updated).
//      On the host, 4 and 5 run span by span (16 K coordinates): the sum is never held whole;
//   6. all-gather the P reduced messages; every rank validates and decodes all of them (inverse
//      transform included). Every rank decodes the same bytes, so all ranks end with bit-identical
//      results. A message that fails validation in step 4 or 6 is reported through an all-reduce
//      of an error flag before anyone proceeds, and then every rank throws.
// Bytes on the wire per rank: 2 (P-1)/P * encoded bytes of the gradient (as a ring all-reduce of
// floats sends 2 (P-1)/P * 4n), plus headers. Error: see allreduce_error_bound (two codec
// roundings, one float sum).
//
// Host scratch: compressed_allreduce_host takes every temporary (the descriptors, the per-rank
// counts and offsets, the stage-1 messages, the received messages, the reduced message, and the
// codec calls' scratch, the rotated sum's spans among it) as ONE block from options.executor's allocator when one is
// lent (octet::with_allocator), else ::operator new, before its first collective; the codec calls
// inside take theirs from a region of that block (see compressed_allreduce_scratch_bytes). The
// transport's own buffers are the transport's (mpi_communicator allocates its int count arrays).
//
// Transport interface (a class with these members; blocking collectives over host memory):
//   int rank() const;  int size() const;
//   void allgather(const void* send, std::size_t bytes, void* recv);           // recv: size() * bytes
//   void alltoallv(const void* send, const std::size_t* send_counts, const std::size_t* send_offsets,
//                  void* recv, const std::size_t* recv_counts, const std::size_t* recv_offsets);
//   void allgatherv(const void* send, std::size_t bytes, void* recv, const std::size_t* counts,
//                   const std::size_t* offsets);
//   int allreduce_max(int value);
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "octet/codec/codec.hpp"
#include "octet/codec/feedback.hpp"
#include "octet/codec/wire.hpp"
#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/span.hpp"

namespace octet {

struct allreduce_options {
    /// Throw unless the communicator has this many ranks (0: any).
    int expected_ranks = 0;
    /// Stage-1 error feedback: a residual of the whole gradient (n elements), original coordinates.
    residual_view feedback{};
    /// Stage-2 error feedback: a residual of this rank's shard (allreduce_shard(...).count elements).
    residual_view reduced_feedback{};
    /// Host threads for encoding and decoding.
    host_executor executor = on_host();
    /// Test hook: called with each stage-1 message (destination rank, bytes; device memory for NCCL)
    /// before it is sent, including the one a rank sends to itself.
    std::function<void(int, span<std::uint8_t>)> tamper{};
};

struct allreduce_report {
    int world = 0;
    std::size_t bytes_sent = 0;      ///< bytes this rank sent to other ranks (both stages)
    std::size_t bytes_received = 0;  ///< bytes this rank received from other ranks (both stages)
    double agree_s = 0, encode_s = 0, exchange_s = 0, reduce_s = 0, gather_s = 0, decode_s = 0;
    double total_s() const { return agree_s + encode_s + exchange_s + reduce_s + gather_s + decode_s; }
};

struct shard_range {
    std::size_t begin = 0;
    std::size_t count = 0;
};

/// Shard boundaries fall on multiples of this many elements.
inline std::size_t allreduce_granule(const codec_config& cfg) {
    std::size_t g = residual_block;
    g = std::max<std::size_t>(g, detail::scale_block_of(cfg));
    if (cfg.transform == transform_kind::hadamard) g = std::max<std::size_t>(g, cfg.block);
    return g;
}

/// The shard rank `rank` of `world` owns.
inline shard_range allreduce_shard(const codec_config& cfg, std::size_t n, int world, int rank) {
    const std::size_t g = allreduce_granule(cfg);
    const std::size_t chunks = (n + g - 1) / g;
    const std::size_t c0 = chunks * static_cast<std::size_t>(rank) / static_cast<std::size_t>(world);
    const std::size_t c1 = chunks * static_cast<std::size_t>(rank + 1) / static_cast<std::size_t>(world);
    shard_range s;
    s.begin = std::min(n, c0 * g);
    s.count = std::min(n, c1 * g) - s.begin;
    return s;
}

/// Worst-case ||result - sum_r g_r|| of compressed_allreduce without feedback, given
/// sum_of_norms = sum_r ||g_r|| and norm_of_sum = ||sum_r g_r||: stage-1 rounding of every rank,
/// the float sum of P dequantized shards, and the stage-2 rounding of the reduced shard.
inline double allreduce_error_bound(const codec_config& cfg, std::size_t n, int world, double sum_of_norms,
                                    double norm_of_sum) {
    std::size_t largest = 0;
    for (int r = 0; r < world; ++r) largest = std::max(largest, allreduce_shard(cfg, n, world, r).count);
    const codec_bound b = error_bound(cfg, largest);
    const double P = world, u = 0x1p-24;
    const double stage1 = b.relative * sum_of_norms + b.absolute * P * std::sqrt(P);
    const double fsum = (P - 1.0) * u * ((1.0 + b.relative) * sum_of_norms + b.absolute * P * std::sqrt(P));
    const double reduced = norm_of_sum + stage1 + fsum;
    const double stage2 = b.relative * reduced + b.absolute * std::sqrt(P);
    return (stage1 + fsum + stage2) * (1.0 + 0x1p-20);
}

namespace detail {

/// What every rank contributes to the agreement step (64 bytes, compared byte for byte).
struct allreduce_descriptor {
    std::uint32_t magic = 0x4152434Fu;  // "OCRA"
    std::uint32_t version = 1;
    std::uint64_t n = 0;
    std::uint64_t seed = 0;
    std::uint32_t block = 0;
    std::uint32_t scale_block = 0;
    std::int32_t world = 0;
    std::int32_t expected = 0;
    std::uint8_t format = 0, transform = 0, stochastic = 0, feedback = 0;  // feedback: 0 none, else storage + 1
    std::uint8_t reduced_feedback = 0, reserved0 = 0, reserved1 = 0, reserved2 = 0;
    std::uint32_t reserved3 = 0;
    std::int32_t local_error = 0;  ///< 1 if this rank's own arguments failed validation (0 on the host path,
                                   ///< which stops on a failure flag before the gather)
    std::uint32_t reserved4 = 0;
};
static_assert(sizeof(allreduce_descriptor) == 64, "allreduce_descriptor must be 64 bytes");

inline std::string describe_mismatch(const allreduce_descriptor& a, const allreduce_descriptor& b, int ra, int rb) {
    auto line = [&](const char* what, auto va, auto vb) {
        return message(what, " differs: rank ", ra, " has ", +va, ", rank ", rb, " has ", +vb);
    };
    if (a.n != b.n) return line("the gradient size", a.n, b.n);
    if (a.format != b.format) return line("config.format", a.format, b.format);
    if (a.transform != b.transform) return line("config.transform", a.transform, b.transform);
    if (a.block != b.block) return line("config.block", a.block, b.block);
    if (a.scale_block != b.scale_block) return line("config.scale_block", a.scale_block, b.scale_block);
    if (a.seed != b.seed) return line("config.seed", a.seed, b.seed);
    if (a.stochastic != b.stochastic) return line("config.stochastic", a.stochastic, b.stochastic);
    if (a.expected != b.expected) return line("options.expected_ranks", a.expected, b.expected);
    if (a.feedback != b.feedback) return line("the use of options.feedback", a.feedback, b.feedback);
    if (a.reduced_feedback != b.reduced_feedback)
        return line("the use of options.reduced_feedback", a.reduced_feedback, b.reduced_feedback);
    return "the descriptors differ";
}

/// An octet::error's text without the "octet: " prefix (for wrapping it in another message).
inline std::string text_of(const std::exception& e) {
    std::string t = e.what();
    while (t.rfind("octet: ", 0) == 0) t.erase(0, 7);
    return t;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// This rank's agreement descriptor (local_error 0).
inline allreduce_descriptor make_descriptor(const codec_config& cfg, std::size_t n, int world,
                                            const allreduce_options& opt) {
    allreduce_descriptor d;
    d.n = n;
    d.seed = cfg.seed;
    d.block = cfg.block;
    d.scale_block = cfg.scale_block;
    d.world = world;
    d.expected = opt.expected_ranks;
    d.format = static_cast<std::uint8_t>(cfg.format);
    d.transform = static_cast<std::uint8_t>(cfg.transform);
    d.stochastic = cfg.stochastic ? 1 : 0;
    d.feedback = opt.feedback.empty() ? 0 : static_cast<std::uint8_t>(static_cast<int>(opt.feedback.storage) + 1);
    d.reduced_feedback = opt.reduced_feedback.empty()
                             ? 0
                             : static_cast<std::uint8_t>(static_cast<int>(opt.reduced_feedback.storage) + 1);
    return d;
}

/// The local check every version makes first: options.expected_ranks against the communicator.
inline void check_expected_ranks(const allreduce_options& opt, int world, const char* fn) {
    OCTET_REQUIRE(opt.expected_ranks == 0 || opt.expected_ranks == world, fn, "options.expected_ranks",
                  message("is ", opt.expected_ranks, " but the communicator has ", world, " ranks; launch with ",
                          opt.expected_ranks, " ranks (mpirun -np ", opt.expected_ranks, ") or pass 0"));
}

/// Throws (the same decision on every rank) unless the `world` gathered descriptors are identical.
inline void throw_unless_agreed(const allreduce_descriptor* all, int world, const char* fn) {
    for (int r = 1; r < world; ++r) {
        allreduce_descriptor a = all[0], b = all[r];
        if (std::memcmp(&a, &b, sizeof a) != 0)
            throw error(
                message(fn, ": the ranks disagree on the call (mismatched headers): ", describe_mismatch(a, b, 0, r),
                        "; every rank must pass the same config, size and options"));
    }
}

/// Step 0 of the NCCL versions: validate locally, agree collectively, throw everywhere.
/// `local_check` throws octet::error on bad local arguments; `gather(send, recv)` all-gathers 64 bytes.
template <class Check, class Gather>
void agree_or_throw(const codec_config& cfg, std::size_t n, int world, int rank, const allreduce_options& opt,
                    Check&& local_check, Gather&& gather, const char* fn) {
    allreduce_descriptor d = make_descriptor(cfg, n, world, opt);
    std::string local_message;
    try {
        check_expected_ranks(opt, world, fn);
        local_check();
    } catch (const error& e) {
        d.local_error = 1;
        local_message = text_of(e);
    }
    std::vector<allreduce_descriptor> all(static_cast<std::size_t>(world));
    gather(&d, all.data());
    if (d.local_error)
        throw error(message(fn, ": rank ", rank, " failed validation (every rank stops): ", local_message));
    for (int r = 0; r < world; ++r)
        if (all[r].local_error)
            throw error(message(fn, ": rank ", r,
                                " failed validation of its own arguments; every rank stops (see rank ", r,
                                "'s error)"));
    throw_unless_agreed(all.data(), world, fn);
}

/// The host scratch of one compressed_allreduce_host call on rank `me` of P, all of it carved from
/// one block (see scratch_carver; carve_allreduce describes it for the query and the operation):
struct allreduce_scratch {
    allreduce_descriptor* descriptors = nullptr;  ///< P: the agreement's all-gather
    shard_range* shard = nullptr;                 ///< P: every rank's shard
    std::size_t* msg_bytes = nullptr;             ///< P: the message of each shard (stage 1 and reduced)
    std::size_t* send_off = nullptr;              ///< P + 1: their offsets, one after another
    std::size_t* recv_counts = nullptr;           ///< P: msg_bytes[me] each
    std::size_t* recv_off = nullptr;              ///< P
    std::uint8_t* messages = nullptr;     ///< send_off[P]: the stage-1 messages sent; then the reduced ones gathered
    std::uint8_t* recvbuf = nullptr;      ///< P * msg_bytes[me]: the stage-1 messages of my shard
    const std::uint8_t** mine = nullptr;  ///< P: where each of those is (for their sum's encode)
    float* mine_scales = nullptr;         ///< P: their tensor scales
    std::uint8_t* reduced = nullptr;      ///< msg_bytes[me]: my reduced message
    unsigned char* codec = nullptr;       ///< codec_bytes: lent to the codec calls inside, one at a time
    std::size_t codec_bytes = 0;
};

/// The most host scratch one codec call inside compressed_allreduce_host takes (they run one after
/// another): the stage-1 encodes of every shard, the re-encode of mine, the decodes of every shard.
/// `bf16`: the gradient's elements are bf16 (the stage-1 encodes and the decodes stage a span).
inline std::size_t allreduce_codec_bytes(const host_executor& ex, const codec_config& cfg, std::size_t n, int P, int me,
                                         bool feedback, bool reduced_feedback, bool bf16) {
    std::size_t most = 0;
    auto keep = [&](scratch_carver& c) { most = std::max(most, c.bytes()); };
    for (int r = 0; r < P; ++r) {
        const wire_layout l = wire_layout_of(cfg, allreduce_shard(cfg, n, P, r).count);
        scratch_carver e, d;
        carve_encode(e, ex, cfg, l, false, feedback, false, bf16);
        carve_decode(d, ex, cfg.transform, l, decoded_space::original, bf16);
        keep(e), keep(d);
        if (r == me) {
            scratch_carver t;
            carve_encode(t, ex, cfg, l, true, reduced_feedback, true);
            keep(t);
        }
    }
    return most;
}

/// Describes the scratch of compressed_allreduce_host on rank `me` of P (arguments validated):
/// one description for compressed_allreduce_scratch_bytes and the operation. The sizes come from
/// the shards, not from the arrays (which a counting carver does not hand out).
inline allreduce_scratch carve_allreduce(scratch_carver& c, const host_executor& ex, const codec_config& cfg,
                                         std::size_t n, int P, int me, bool feedback, bool reduced_feedback,
                                         bool bf16) {
    const std::size_t world = static_cast<std::size_t>(P);
    std::size_t total = 0;
    for (int r = 0; r < P; ++r) total += encoded_size(cfg, allreduce_shard(cfg, n, P, r).count);
    const shard_range mine = allreduce_shard(cfg, n, P, me);
    const std::size_t msg_me = encoded_size(cfg, mine.count);
    allreduce_scratch s;
    s.descriptors = c.take<allreduce_descriptor>(world);
    s.shard = c.take<shard_range>(world);
    s.msg_bytes = c.take<std::size_t>(world);
    s.send_off = c.take<std::size_t>(world + 1);
    s.recv_counts = c.take<std::size_t>(world);
    s.recv_off = c.take<std::size_t>(world);
    // The stage-1 messages are dead once the all-to-all returns (a blocking collective): the
    // reduced messages are gathered into the same bytes.
    s.messages = c.take<std::uint8_t>(total);
    s.recvbuf = c.take<std::uint8_t>(world * msg_me);
    s.mine = c.take<const std::uint8_t*>(world);
    s.mine_scales = c.take<float>(world);
    s.reduced = c.take<std::uint8_t>(msg_me);
    s.codec_bytes = allreduce_codec_bytes(ex, cfg, n, P, me, feedback, reduced_feedback, bf16);
    s.codec = c.take<unsigned char>(s.codec_bytes);
    return s;
}

/// The region of the all-reduce's block that the codec calls inside it take their scratch from, as
/// a host_allocator: one request at a time (the codec calls run one after another), at most its bytes.
struct codec_region {
    unsigned char* base = nullptr;
    std::size_t bytes = 0;
    bool taken = false;

    host_allocator allocator() {
        host_allocator a;
        a.context = this;
        a.allocate = [](void* c, std::size_t bytes) -> void* {
            auto& r = *static_cast<codec_region*>(c);
            if (r.taken || bytes > r.bytes) return nullptr;
            r.taken = true;
            return r.base;
        };
        a.deallocate = [](void* c, void*, std::size_t) { static_cast<codec_region*>(c)->taken = false; };
        return a;
    }
};

/// Step 0's scratch (the host versions), unless this rank already failed: carve(c) lays the
/// call's buffers out on a scratch_carver; a first pass sizes the block, which is taken from ex
/// (host_scratch) and carved by the second. A failure (an allocator that refuses or throws) sets
/// local_failure to 2 with its message, for stop_every_rank_on_failure.
template <class Scratch, class Carve>
void take_scratch(const host_executor& ex, const char* fn, Carve&& carve, std::optional<host_scratch>& block,
                  Scratch& s, int& local_failure, std::string& local_message) {
    if (local_failure != 0) return;
    try {
        scratch_carver size;
        carve(size);
        block.emplace(ex, size.bytes(), fn);
        scratch_carver carver = block->carver();
        s = carve(carver);
    } catch (const error& e) {
        local_failure = 2;
        local_message = text_of(e);
    } catch (const std::exception& e) {  // an allocator that throws, or ::operator new
        local_failure = 2;
        local_message = message("the scratch could not be taken: ", e.what());
    }
}

/// Step 0's failure flag (the host versions): every rank contributes its local_failure (0 none,
/// 1 its arguments, 2 its scratch) to one allreduce_max; if any rank failed, EVERY rank throws
/// octet::error (the failing rank with its own message, the others naming the lowest failing rank).
template <class Transport>
void stop_every_rank_on_failure(Transport& comm, int local_failure, const std::string& local_message, const char* fn) {
    // The lowest failing rank wins (2 (P - rank) + what failed), as every rank sees the same flag.
    const int P = comm.size(), me = comm.rank();
    const int flag = comm.allreduce_max(local_failure == 0 ? 0 : 2 * (P - me) + (local_failure - 1));
    if (flag != 0) {
        const int who = P - flag / 2;
        const bool scratch = (flag & 1) != 0;
        if (local_failure == 1)
            throw error(message(fn, ": rank ", me, " failed validation (every rank stops): ", local_message));
        if (local_failure == 2)
            throw error(message(fn, ": rank ", me, " could not take its scratch (every rank stops): ", local_message));
        throw error(message(fn, ": rank ", who,
                            scratch ? " could not take its scratch from its executor's allocator"
                                    : " failed validation of its own arguments",
                            "; every rank stops (see rank ", who, "'s error)"));
    }
}

/// Checks a received message's header against what this rank expects (after read_wire_header).
inline void expect_message(const wire_header& h, const codec_config& cfg, const shard_range& s, const char* fn,
                           int from) {
    const bool ok = h.format == cfg.format && h.transform == cfg.transform && h.seed == cfg.seed &&
                    h.first_index == s.begin && h.count == s.count && h.stochastic == cfg.stochastic;
    if (!ok)
        throw error(message(fn, ": the message from rank ", from, " describes elements [", h.first_index, ", ",
                            h.first_index + h.count, ") of a different configuration; expected [", s.begin, ", ",
                            s.begin + s.count, ")"));
}

/// Steps 1-3 of the host versions (arguments validated, scratch carved): every rank's shard and
/// message size (s.shard, s.msg_bytes, s.send_off), this rank's message of each shard of `data`
/// (encoded with `feedback`, the stage-1 residual, when not empty), the all-to-all of them (the P
/// messages of this rank's shard land in s.recvbuf at s.recv_off). Adds the seconds and the bytes.
template <class Transport, class T>
void encode_and_exchange(Transport& comm, const codec_config& cfg, span<const T> data, const residual_view& feedback,
                         const std::function<void(int, span<std::uint8_t>)>& tamper, const host_executor& codec_ex,
                         const allreduce_scratch& s, double& encode_s, double& exchange_s, std::size_t& bytes_sent,
                         std::size_t& bytes_received) {
    using clock = std::chrono::steady_clock;
    const int P = comm.size(), me = comm.rank();
    const std::size_t n = data.size();
    std::size_t* const msg_bytes = s.msg_bytes;
    std::size_t* const send_off = s.send_off;
    shard_range* const shard = s.shard;
    send_off[0] = 0;
    for (int r = 0; r < P; ++r) {
        shard[r] = allreduce_shard(cfg, n, P, r);
        msg_bytes[r] = encoded_size(cfg, shard[r].count);
        send_off[r + 1] = send_off[r] + msg_bytes[r];
    }
    const std::size_t msg_me = msg_bytes[me];
    auto t0 = clock::now();
    for (int r = 0; r < P; ++r) {
        encode_options eo;
        eo.first_index = shard[r].begin;
        eo.random_stream = 1 + static_cast<std::uint64_t>(me);
        if (!feedback.empty()) eo.feedback = feedback.subrange(shard[r].begin, shard[r].count);
        const span<std::uint8_t> out(s.messages + send_off[r], msg_bytes[r]);
        encode_gradient(codec_ex, cfg, span<const T>(data.data() + shard[r].begin, shard[r].count), out, eo);
        if (tamper) tamper(r, out);
    }
    encode_s = seconds_since(t0);

    // 3. All-to-all: P messages of my shard arrive.
    t0 = clock::now();
    for (int r = 0; r < P; ++r) {
        s.recv_counts[r] = msg_me;
        s.recv_off[r] = static_cast<std::size_t>(r) * msg_me;
    }
    comm.alltoallv(s.messages, msg_bytes, send_off, s.recvbuf, s.recv_counts, s.recv_off);
    exchange_s = seconds_since(t0);
    for (int r = 0; r < P; ++r)
        if (r != me) bytes_sent += msg_bytes[r], bytes_received += msg_me;
}

/// Step 4's checks of the host versions: each of the P received messages of this rank's shard
/// (s.recvbuf) is a valid message of `mine` under cfg; their addresses and tensor scales go to
/// s.mine and s.mine_scales. Throws octet::error naming the sender.
inline void validate_received(const allreduce_scratch& s, const codec_config& cfg, const shard_range& mine,
                              const wire_layout& mine_layout, int P, int me, const char* fn) {
    const std::size_t msg_me = s.msg_bytes[me];
    for (int r = 0; r < P; ++r) {
        const span<const std::uint8_t> m(s.recvbuf + s.recv_off[r], msg_me);
        wire_header h;
        wire_layout lr;
        try {
            h = read_wire_header(m, &lr, fn);
            OCTET_REQUIRE(lr.coded == mine_layout.coded && lr.scale_block == mine_layout.scale_block &&
                              lr.block == mine_layout.block,
                          fn, "message", "has another layout than this rank's shard under the agreed codec");
        } catch (const error& e) {
            throw error(
                message(fn, ": the stage-1 message from rank ", r, " to rank ", me, " is invalid: ", text_of(e)));
        }
        expect_message(h, cfg, mine, fn, r);
        s.mine[r] = m.data();
        s.mine_scales[r] = h.tensor_scale;
    }
}

}  // namespace detail

/// Bytes of host scratch that compressed_allreduce_host(comm, cfg, data, opt) (and
/// compressed_allreduce over MPI) takes on rank `rank` of a communicator of `world` ranks, for
/// n = data.size() elements, when it runs on the host executor `ex` (pass options.executor; the
/// options' own executor is not read, only whether options.feedback and options.reduced_feedback
/// are empty): the peak the call holds from ex.allocator (or ::operator new), the whole call
/// included. It is ONE block, taken before the first collective and given back on return or throw:
/// the call's own buffers (the P shard messages, sent and then gathered in the same bytes, about
/// encoded_size(cfg, n); P + 1 messages of this rank's shard, received and reduced; 80 + 48 bytes
/// per rank) plus the largest scratch of one codec call nested inside
/// (encode_gradient_scratch_bytes of a shard, encode_gradient_transformed_scratch_bytes of this
/// rank's shard, decode_gradient_scratch_bytes of a shard), which those calls take, one after
/// another, from a region of that block. Shards differ in size, so the bytes depend on the rank;
/// the largest over the ranks bounds them all. T: the gradient's element type (float, or bf16: a
/// span of staged floats per thread more in the codec calls' region).
template <class T = float>
std::size_t compressed_allreduce_scratch_bytes(const host_executor& ex, const codec_config& cfg, std::size_t n,
                                               int world, int rank, const allreduce_options& opt = {}) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>, "gradients are float or octet::bf16");
    constexpr const char* fn = "octet::compressed_allreduce_scratch_bytes";
    detail::validate_config(cfg, fn);
    OCTET_REQUIRE(n <= wire_max_elements, fn, "n", detail::message("counts ", n, " elements; at most 2^40"));
    OCTET_REQUIRE(world >= 1, fn, "world", detail::message("is ", world, "; a communicator has at least one rank"));
    OCTET_REQUIRE(rank >= 0 && rank < world, fn, "rank", detail::message("is ", rank, "; ranks are 0..", world - 1));
    detail::scratch_carver c;
    detail::carve_allreduce(c, ex, cfg, n, world, rank, !opt.feedback.empty(), !opt.reduced_feedback.empty(),
                            std::is_same_v<T, bf16>);
    return c.bytes();
}

/// The compressed all-reduce over any transport (see the header comment). data <- sum over ranks.
/// Every temporary comes from one block of host scratch (compressed_allreduce_scratch_bytes), from
/// opt.executor's allocator when one is lent; a rank that cannot take it stops every rank with
/// octet::error before any data moves. T: float, or bf16 gradients, read in place (the messages
/// and residuals of their float values, bit for bit) and written back rounded once to nearest
/// even from the float result: a bf16 gradient buffer needs no float copy beside it.
template <class Transport, class T>
allreduce_report compressed_allreduce_host(Transport& comm, const codec_config& cfg, span<T> data,
                                           const allreduce_options& opt = {},
                                           const char* fn = "octet::compressed_allreduce") {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>,
                  "octet::compressed_allreduce: gradients are float or octet::bf16");
    using clock = std::chrono::steady_clock;
    allreduce_report rep;
    const int P = comm.size(), me = comm.rank();
    rep.world = P;
    const std::size_t n = data.size();
    auto t0 = clock::now();

    // 0. Validate locally and take the scratch; exchange the failure flag; agree on the call.
    std::optional<detail::host_scratch> block;
    detail::allreduce_scratch s;
    int local_failure = 0;  // 1: the arguments, 2: the scratch
    std::string local_message;
    try {
        detail::check_expected_ranks(opt, P, fn);
        detail::validate_config(cfg, fn);
        OCTET_REQUIRE(n == 0 || data.data() != nullptr, fn, "data", "is null with a non-zero size");
        OCTET_REQUIRE(n <= wire_max_elements, fn, "data", "has more than 2^40 elements");
        if (!opt.feedback.empty())
            OCTET_REQUIRE(opt.feedback.size == n, fn, "options.feedback",
                          detail::message("has ", opt.feedback.size,
                                          " elements; the stage-1 residual covers the whole gradient (", n, ")"));
        if (!opt.reduced_feedback.empty()) {
            const shard_range sh = allreduce_shard(cfg, n, P, me);
            OCTET_REQUIRE(opt.reduced_feedback.size == sh.count, fn, "options.reduced_feedback",
                          detail::message("has ", opt.reduced_feedback.size, " elements; this rank's shard has ",
                                          sh.count, " (allreduce_shard)"));
        }
        for (int r = 0; r < P; ++r)
            OCTET_REQUIRE(encoded_size(cfg, allreduce_shard(cfg, n, P, r).count) < (std::size_t{1} << 31), fn, "data",
                          "gives a shard message of 2 GiB or more; use more ranks or a smaller gradient per call");
    } catch (const error& e) {
        local_failure = 1;
        local_message = detail::text_of(e);
    }
    const bool fb = !opt.feedback.empty(), rfb = !opt.reduced_feedback.empty();
    detail::take_scratch(
        opt.executor, fn,
        [&](detail::scratch_carver& c) {
            return detail::carve_allreduce(c, opt.executor, cfg, n, P, me, fb, rfb, std::is_same_v<T, bf16>);
        },
        block, s, local_failure, local_message);
    detail::stop_every_rank_on_failure(comm, local_failure, local_message, fn);
    const detail::allreduce_descriptor d = detail::make_descriptor(cfg, n, P, opt);
    comm.allgather(&d, sizeof d, s.descriptors);
    detail::throw_unless_agreed(s.descriptors, P, fn);
    rep.agree_s = detail::seconds_since(t0);

    // The codec calls take their scratch from the block's codec region.
    detail::codec_region region{s.codec, s.codec_bytes};
    host_executor codec_ex = opt.executor;
    codec_ex.allocator = region.allocator();

    // 1-3. Shards, stage-1 messages, all-to-all.
    detail::encode_and_exchange(comm, cfg, span<const T>(data.data(), n), opt.feedback, opt.tamper, codec_ex, s,
                                rep.encode_s, rep.exchange_s, rep.bytes_sent, rep.bytes_received);
    std::size_t* const msg_bytes = s.msg_bytes;
    std::size_t* const send_off = s.send_off;
    shard_range* const shard = s.shard;
    const shard_range mine = shard[me];
    const std::size_t msg_me = msg_bytes[me];

    // 4. Validate the P messages of my shard; 5. sum them in rotated coordinates and re-encode the
    // sum, span by span (the sum is never held whole).
    t0 = clock::now();
    const wire_layout mine_layout = wire_layout_of(cfg, mine.count);
    const span<std::uint8_t> reduced(s.reduced, msg_me);
    std::string failure;
    try {
        detail::validate_received(s, cfg, mine, mine_layout, P, me, fn);
        encode_options eo;
        eo.first_index = mine.begin;
        eo.random_stream = 0;
        eo.feedback = opt.reduced_feedback;
        detail::encode_sum_of_messages(codec_ex, cfg, mine_layout, s.mine, s.mine_scales, static_cast<std::size_t>(P),
                                       reduced, eo, fn);
    } catch (const error& e) {
        failure = detail::text_of(e);
    }
    const int bad_stage1 = comm.allreduce_max(failure.empty() ? 0 : me + 1);
    if (bad_stage1) {
        if (!failure.empty()) throw error(failure);  // the rank that saw it names it
        throw error(
            detail::message(fn, ": rank ", bad_stage1 - 1, " received an invalid stage-1 message; every rank stops"));
    }
    rep.reduce_s = detail::seconds_since(t0);

    // 6. All-gather the reduced shards (into the stage-1 messages' bytes), validate and decode every one.
    t0 = clock::now();
    std::uint8_t* const gathered = s.messages;
    comm.allgatherv(s.reduced, msg_me, gathered, msg_bytes, send_off);
    rep.gather_s = detail::seconds_since(t0);
    rep.bytes_sent += static_cast<std::size_t>(P - 1) * msg_me;
    rep.bytes_received += send_off[P] - msg_me;

    t0 = clock::now();
    failure.clear();
    try {
        for (int r = 0; r < P; ++r) {
            const span<const std::uint8_t> m(gathered + send_off[r], msg_bytes[r]);
            wire_header h;
            try {
                h = decode_gradient(codec_ex, m, span<T>(data.data() + shard[r].begin, shard[r].count));
            } catch (const error& e) {
                throw error(detail::message(fn, ": the reduced message of rank ", r, " is invalid on rank ", me, ": ",
                                            detail::text_of(e)));
            }
            detail::expect_message(h, cfg, shard[r], fn, r);
        }
    } catch (const error& e) {
        failure = detail::text_of(e);
    }
    const int bad_stage2 = comm.allreduce_max(failure.empty() ? 0 : me + 1);
    if (bad_stage2) {
        if (!failure.empty()) throw error(failure);  // the rank that saw it names it
        throw error(
            detail::message(fn, ": rank ", bad_stage2 - 1, " received an invalid reduced message; every rank stops"));
    }
    rep.decode_s = detail::seconds_since(t0);
    return rep;
}

}  // namespace octet
