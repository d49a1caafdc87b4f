// examples/08_training/gradient_exchange.hpp: how the data-parallel ranks' gradients become one.
// With the recipe's gradient codec: octet::compressed_allreduce (E4M3 on a 1024-point Hadamard
// rotation, error feedback at both stages: each rank's whole gradient, and the shard it reduces;
// the residuals stored as recipe.residuals), each rank's scratch exactly the bytes the call asks
// for, lent by the step buffers (idle between steps: the all-reduce adds no memory of its own where
// the step's float buffers are larger). Without it: the plain sum in rank order; under mpirun from an all-gather (the
// order the in-process ranks sum in, not MPI_Allreduce's, which MPI does not fix), so that both modes produce the same
// bits. Every buffer is booked in the run's meter.
//
// bf16 gradients (recipe.gradients): the all-reduce reads and writes them in place (the codec's
// messages of their float values; the plain sum in float, rounded once), and the reduced buffer
// holds the SUM: the mean's 1 / P is the optimizer's to apply (mean_scale), so that the result is
// rounded to bf16 once, not twice.
//
// restore_point keeps a copy of the codec's residuals before each all-reduce (the only call that
// updates them), in the step buffers lent beside the all-reduce's scratch: a repeated step restores
// them before its forward (every attempt's encode updates them; without this a corrupted first
// attempt would live on in the residuals and poison the repeat).
#pragma once

#include "common/model.hpp"
#include "gradients.hpp"
#include "ranks.hpp"
#include "train.hpp"

#include <octet/octet.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace train {

class gradient_exchange {
public:
    /// P ranks in all, of which this process runs L, global ranks first .. first + L - 1 (procs:
    /// the other processes under mpirun; nullptr: all ranks are threads of this process).
    gradient_exchange(memory_meter& meter, const recipe_config& rc, std::size_t n, int P, int L, int first,
                      process_ranks* procs)
        : n_(n),
          P_(P),
          codec_on_(rc.gradient_codec),
          bf16_(rc.gradients == gradient_storage::bf16),
          procs_(procs),
          world_(L),
          gathered_(make_metered<unsigned char>(meter, octet::memory_category::gradients, 0)) {
        codec_.format = octet::wire_format::e4m3;
        codec_.transform = octet::transform_kind::hadamard;
        codec_.block = 1024;
        if (codec_on_) {
            for (int l = 0; l < L; ++l) {
                feedback_.emplace_back(n, rc.residuals);
                reduced_feedback_.emplace_back(octet::allreduce_shard(codec_, n, P, first + l).count, rc.residuals);
                const double residual_bytes =
                    static_cast<double>(feedback_.back().bytes() + reduced_feedback_.back().bytes());
                // (the checkpoint keeps them in its file)
                meter.allocate(octet::memory_category::gradients, residual_bytes);
            }
            // compressed_allreduce's buffers (each rank: its stage-1 messages, those it receives,
            // the reduced shard and the gathered messages, and the codec's scratch): exactly its
            // query, one part of the step buffers' block per rank (lend_parts).
            for (int l = 0; l < L; ++l) parts_.push_back(scratch_bytes(first + l));
        }
        gathered_ = make_metered<unsigned char>(meter, octet::memory_category::gradients,
                                                procs && !codec_on_ ? P * n * element_bytes() : 0);
    }

    bool uses_codec() const { return codec_on_; }
    /// The bytes of one gradient element (float or bf16).
    std::size_t element_bytes() const { return bf16_ ? sizeof(octet::bf16) : sizeof(float); }
    /// What the optimizer multiplies the reduced gradient by: 1 where reduce() leaves the mean,
    /// 1 / P where it leaves the sum (bf16 gradients).
    float mean_scale() const { return bf16_ ? 1.0f / static_cast<float>(P_) : 1.0f; }
    const octet::codec_config& codec() const { return codec_; }

    /// The bytes compressed_allreduce takes on rank r (with both residuals; one thread each).
    std::size_t scratch_bytes(int r) {
        octet::allreduce_options probe;
        probe.feedback = feedback_.front().view();
        probe.reduced_feedback = reduced_feedback_.front().view();
        if (bf16_)
            return octet::compressed_allreduce_scratch_bytes<octet::bf16>(octet::on_host(1), codec_, n_, P_, r, probe);
        return octet::compressed_allreduce_scratch_bytes(octet::on_host(1), codec_, n_, P_, r, probe);
    }

    /// The scratch of each of this process's ranks' all-reduce (none without the codec), which
    /// reduce() borrows from the step buffers: construct them with lend_capacity =
    /// step_buffers::lend_bytes(lend_parts()).
    const std::vector<std::size_t>& lend_parts() const { return parts_; }

    /// The codec's error-feedback residuals of this process's ranks (none without the codec).
    std::vector<octet::residual_view> residual_views() {
        std::vector<octet::residual_view> v;
        for (auto* set : {&feedback_, &reduced_feedback_})
            for (auto& fb : *set) v.push_back(fb.view());
        return v;
    }

    /// Reduces this process's ranks' gradients `grads` (one per local rank) with every other
    /// rank's into grads[0]: their mean over the P ranks (float), or their sum (bf16: see
    /// mean_scale); returns the L2 norm of the mean. `scratch`: one part per local rank of
    /// lend_parts()'s sizes (the step buffers, lent between steps).
    double reduce(std::vector<gradient_buffer>& grads, const std::vector<octet::span<unsigned char>>& scratch) {
        if (bf16_) return reduce_as<octet::bf16>(grads, scratch);
        return reduce_as<float>(grads, scratch);
    }

private:
    template <class G>
    static octet::span<G> values(gradient_buffer& g) {
        octet::span<G> out;
        g.visit([&](auto s) {
            if constexpr (std::is_same_v<typename decltype(s)::value_type, G>) out = s;
        });
        return out;
    }

    template <class G>
    double reduce_as(std::vector<gradient_buffer>& grads, const std::vector<octet::span<unsigned char>>& scratch) {
        constexpr bool bf16 = std::is_same_v<G, octet::bf16>;
        const std::size_t n = n_;
        const int P = P_;
        G* const out = values<G>(grads[0]).data();
        if (codec_on_) {
            OCTET_REQUIRE(scratch.size() == parts_.size(), "train::gradient_exchange::reduce", "scratch",
                          "needs one part per local rank, of lend_parts()'s sizes");
            std::vector<octet::host_arena> arenas;
            for (const auto& part : scratch) arenas.emplace_back(part);
            auto options = [&](int l) {
                octet::allreduce_options ao;
                ao.expected_ranks = P;
                ao.feedback = feedback_[l].view();
                ao.reduced_feedback = reduced_feedback_[l].view();
                ao.executor = octet::with_allocator(octet::on_host(1), arenas[static_cast<std::size_t>(l)].allocator());
                return ao;
            };
            if (procs_) {
                procs_->compressed_allreduce(codec_, octet::span<G>(out, n), options(0));
            } else {
                on_every_rank(P, [&](int r) {
                    in_process_transport t(world_, r);
                    octet::compressed_allreduce_host(t, codec_, values<G>(grads[static_cast<std::size_t>(r)]),
                                                     options(r));
                });
            }
        } else {
            // The plain sum in rank order, in float (bf16: rounded once at the end).
            std::vector<const G*> from;
            if (procs_) {
                procs_->allgather(out, n * sizeof(G), gathered_.data());
                for (int r = 0; r < P; ++r)
                    from.push_back(reinterpret_cast<const G*>(gathered_.data()) + static_cast<std::size_t>(r) * n);
            } else {
                for (int r = 0; r < P; ++r) from.push_back(values<G>(grads[static_cast<std::size_t>(r)]).data());
            }
            auto wide = [](G x) -> float {
                if constexpr (bf16)
                    return octet::to_float(x);
                else
                    return x;
            };
            for (std::size_t i = 0; i < n; ++i) {
                float s = wide(from[0][i]);
                for (int r = 1; r < P; ++r) s += wide(from[static_cast<std::size_t>(r)][i]);
                if constexpr (bf16)
                    out[i] = octet::to_bf16(s);
                else
                    out[i] = s;
            }
        }
        double sq = 0;
        const float inv = 1.0f / static_cast<float>(P);
        for (std::size_t i = 0; i < n; ++i) {
            float mean;
            if constexpr (bf16) {
                mean = octet::to_float(out[i]) * inv;  // as the optimizer reads it (mean_scale)
            } else {
                out[i] *= inv;
                mean = out[i];
            }
            sq += static_cast<double>(mean) * mean;
        }
        return std::sqrt(sq);
    }

    std::size_t n_;
    int P_;
    bool codec_on_;
    bool bf16_;  // bf16 gradients (recipe.gradients)
    process_ranks* procs_;
    octet::codec_config codec_;
    std::vector<octet::error_feedback> feedback_, reduced_feedback_;
    std::vector<std::size_t> parts_;  // each local rank's all-reduce scratch (bytes)
    in_process_world world_;
    metered_vector<unsigned char> gathered_;  // under mpirun without the codec: every rank's gradient
};

/// The codec's residuals as they were before a step's all-reduce, for a repeat of the step to
/// start from. The copies live in parts the caller lends (the step buffers, idle from the
/// all-reduce until the repeat's forward, which starts with restore()).
class restore_point {
public:
    explicit restore_point(gradient_exchange& exchange) : exchange_(exchange) {
        for (const auto& v : exchange.residual_views()) parts_.push_back(v.bytes());
    }
    /// The bytes of each copy: lend these beside the all-reduce's scratch.
    const std::vector<std::size_t>& lend_parts() const { return parts_; }
    /// Copies the residuals into `copies` (lend_parts()'s sizes), which must stay untouched until
    /// restore() or the next keep().
    void keep(const std::vector<octet::span<unsigned char>>& copies) {
        OCTET_REQUIRE(copies.size() == parts_.size(), "train::restore_point::keep", "copies",
                      "needs one part per residual, of lend_parts()'s sizes");
        copies_ = copies;
        const auto views = exchange_.residual_views();
        for (std::size_t i = 0; i < views.size(); ++i)
            std::copy(views[i].data, views[i].data + views[i].bytes(), copies_[i].data());
    }
    void restore() {
        const auto views = exchange_.residual_views();
        for (std::size_t i = 0; i < views.size() && i < copies_.size(); ++i)
            std::copy(copies_[i].data(), copies_[i].data() + copies_[i].size(), views[i].data);
    }

private:
    gradient_exchange& exchange_;
    std::vector<std::size_t> parts_;
    std::vector<octet::span<unsigned char>> copies_;
};

}  // namespace train
