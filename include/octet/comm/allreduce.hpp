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
//      octet::error (the same decision everywhere, so no rank is left waiting in a later collective);
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
//      options.reduced_feedback, the stage-2 residual of the owned shard is added and updated);
//   6. all-gather the P reduced messages; every rank validates and decodes all of them (inverse
//      transform included). Every rank decodes the same bytes, so all ranks end with bit-identical
//      results. A message that fails validation in step 4 or 6 is reported through an all-reduce
//      of an error flag before anyone proceeds, and then every rank throws.
// Bytes on the wire per rank: 2 (P-1)/P * encoded bytes of the gradient (as a ring all-reduce of
// floats sends 2 (P-1)/P * 4n), plus headers. Error: see allreduce_error_bound (two codec
// roundings, one float sum).
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
    std::int32_t local_error = 0;  ///< not compared: 1 if this rank's own arguments failed validation
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

/// Step 0 (shared by the MPI and NCCL versions): validate locally, agree collectively, throw everywhere.
/// `local_check` throws octet::error on bad local arguments; `gather(send, recv)` all-gathers 64 bytes.
template <class Check, class Gather>
void agree_or_throw(const codec_config& cfg, std::size_t n, int world, int rank, const allreduce_options& opt,
                    Check&& local_check, Gather&& gather, const char* fn) {
    allreduce_descriptor d;
    std::string local_message;
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
    try {
        OCTET_REQUIRE(opt.expected_ranks == 0 || opt.expected_ranks == world, fn, "options.expected_ranks",
                      message("is ", opt.expected_ranks, " but the communicator has ", world, " ranks; launch with ",
                              opt.expected_ranks, " ranks (mpirun -np ", opt.expected_ranks, ") or pass 0"));
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
    for (int r = 1; r < world; ++r) {
        allreduce_descriptor a = all[0], b = all[r];
        if (std::memcmp(&a, &b, sizeof a) != 0)
            throw error(
                message(fn, ": the ranks disagree on the call (mismatched headers): ", describe_mismatch(a, b, 0, r),
                        "; every rank must pass the same config, size and options"));
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

}  // namespace detail

/// The compressed all-reduce over any transport (see the header comment). data <- sum over ranks.
template <class Transport>
allreduce_report compressed_allreduce_host(Transport& comm, const codec_config& cfg, span<float> data,
                                           const allreduce_options& opt = {},
                                           const char* fn = "octet::compressed_allreduce") {
    using clock = std::chrono::steady_clock;
    allreduce_report rep;
    const int P = comm.size(), me = comm.rank();
    rep.world = P;
    const std::size_t n = data.size();
    auto t0 = clock::now();

    detail::agree_or_throw(
        cfg, n, P, me, opt,
        [&] {
            detail::validate_config(cfg, fn);
            OCTET_REQUIRE(n == 0 || data.data() != nullptr, fn, "data", "is null with a non-zero size");
            OCTET_REQUIRE(n <= wire_max_elements, fn, "data", "has more than 2^40 elements");
            if (!opt.feedback.empty())
                OCTET_REQUIRE(opt.feedback.size == n, fn, "options.feedback",
                              detail::message("has ", opt.feedback.size,
                                              " elements; the stage-1 residual covers the whole gradient (", n, ")"));
            if (!opt.reduced_feedback.empty()) {
                const shard_range s = allreduce_shard(cfg, n, P, me);
                OCTET_REQUIRE(opt.reduced_feedback.size == s.count, fn, "options.reduced_feedback",
                              detail::message("has ", opt.reduced_feedback.size, " elements; this rank's shard has ",
                                              s.count, " (allreduce_shard)"));
            }
            for (int r = 0; r < P; ++r)
                OCTET_REQUIRE(encoded_size(cfg, allreduce_shard(cfg, n, P, r).count) < (std::size_t{1} << 31), fn,
                              "data",
                              "gives a shard message of 2 GiB or more; use more ranks or a smaller gradient per call");
        },
        [&](const void* send, void* recv) { comm.allgather(send, sizeof(detail::allreduce_descriptor), recv); }, fn);
    rep.agree_s = detail::seconds_since(t0);

    // 1-2. Shards and stage-1 messages.
    std::vector<shard_range> shard(static_cast<std::size_t>(P));
    std::vector<std::size_t> msg_bytes(static_cast<std::size_t>(P)), send_off(static_cast<std::size_t>(P) + 1, 0);
    for (int r = 0; r < P; ++r) {
        shard[r] = allreduce_shard(cfg, n, P, r);
        msg_bytes[r] = encoded_size(cfg, shard[r].count);
        send_off[r + 1] = send_off[r] + msg_bytes[r];
    }
    const shard_range mine = shard[me];
    t0 = clock::now();
    std::vector<std::uint8_t> sendbuf(send_off[P]);
    for (int r = 0; r < P; ++r) {
        encode_options eo;
        eo.first_index = shard[r].begin;
        eo.random_stream = 1 + static_cast<std::uint64_t>(me);
        if (!opt.feedback.empty()) eo.feedback = opt.feedback.subrange(shard[r].begin, shard[r].count);
        const span<std::uint8_t> out(sendbuf.data() + send_off[r], msg_bytes[r]);
        encode_gradient(opt.executor, cfg, span<const float>(data.data() + shard[r].begin, shard[r].count), out, eo);
        if (opt.tamper) opt.tamper(r, out);
    }
    rep.encode_s = detail::seconds_since(t0);

    // 3. All-to-all: P messages of my shard arrive.
    t0 = clock::now();
    std::vector<std::size_t> recv_counts(static_cast<std::size_t>(P), msg_bytes[me]),
        recv_off(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) recv_off[r] = static_cast<std::size_t>(r) * msg_bytes[me];
    std::vector<std::uint8_t> recvbuf(static_cast<std::size_t>(P) * msg_bytes[me]);
    comm.alltoallv(sendbuf.data(), msg_bytes.data(), send_off.data(), recvbuf.data(), recv_counts.data(),
                   recv_off.data());
    rep.exchange_s = detail::seconds_since(t0);
    for (int r = 0; r < P; ++r)
        if (r != me) rep.bytes_sent += msg_bytes[r], rep.bytes_received += msg_bytes[me];

    // 4. Validate and sum in rotated coordinates; 5. re-encode.
    t0 = clock::now();
    const std::size_t L = static_cast<std::size_t>(transform_length(cfg.transform, mine.count, cfg.block));
    std::vector<float> y(L, 0.0f);
    std::vector<std::uint8_t> reduced(msg_bytes[me]);
    std::string failure;
    try {
        for (int r = 0; r < P; ++r) {
            const span<const std::uint8_t> m(recvbuf.data() + recv_off[r], msg_bytes[me]);
            wire_header h;
            try {
                h = decode_gradient_transformed(opt.executor, m, y, r > 0);
            } catch (const error& e) {
                throw error(detail::message(fn, ": the stage-1 message from rank ", r, " to rank ", me,
                                            " is invalid: ", detail::text_of(e)));
            }
            detail::expect_message(h, cfg, mine, fn, r);
        }
        encode_options eo;
        eo.first_index = mine.begin;
        eo.random_stream = 0;
        eo.feedback = opt.reduced_feedback;
        encode_gradient_transformed(opt.executor, cfg, y, mine.count, reduced, eo);
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

    // 6. All-gather the reduced shards, validate and decode every one.
    t0 = clock::now();
    std::vector<std::uint8_t> gathered(send_off[P]);
    comm.allgatherv(reduced.data(), reduced.size(), gathered.data(), msg_bytes.data(), send_off.data());
    rep.gather_s = detail::seconds_since(t0);
    rep.bytes_sent += static_cast<std::size_t>(P - 1) * msg_bytes[me];
    rep.bytes_received += send_off[P] - msg_bytes[me];

    t0 = clock::now();
    failure.clear();
    try {
        for (int r = 0; r < P; ++r) {
            const span<const std::uint8_t> m(gathered.data() + send_off[r], msg_bytes[r]);
            wire_header h;
            try {
                h = decode_gradient(opt.executor, m, span<float>(data.data() + shard[r].begin, shard[r].count));
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
