// examples/common/model/step_buffers.hpp: what the transformer (../model.hpp) works in: the step
// buffers (one block, lent between steps) and the saved copies of the non-linear layers' inputs.
#pragma once

#include "base.hpp"

namespace common {

/// One of step_buffers' float buffers: size() floats of its block.
struct float_region {
    float* start = nullptr;
    std::size_t count = 0;
    float* data() const { return start; }
    std::size_t size() const { return count; }
    bool empty() const { return count == 0; }
};

/// What a training step works in and drops (booked as temporaries): the logits, the float
/// temporaries, the host FP8 linears' workspace and octet's scratch arena. One set serves every
/// model of a process whose steps run one after another (the in-process ranks share one, as each
/// rank of a multi-process run has its own): transformer's constructor takes it. The first model
/// sizes it; every other model must have the same configuration, recipe, batch and threads.
///
/// The float buffers are regions of one block, each from a 64-byte boundary. Nothing of a step
/// lives on in them after it, so between steps the block serves other operations: lend() hands
/// out parts of it (the trainer's gradient all-reduce takes its scratch there). The block is as
/// large as the regions or as what it must lend (lend_capacity), whichever is more.
struct step_buffers {
    /// The float regions, in the block's order.
    enum region : std::size_t {
        logits,
        t_h,
        t_qkv,
        t_a,
        dx,
        dx2,
        dh,
        dwide,
        do_,
        wt,
        yt,
        xr,
        wr,
        attn_scratch,
        chunk_partials,
        wdec,
        gstage,
        gemb,
        region_count
    };
    using region_sizes = std::array<std::size_t, region_count>;
    static constexpr std::size_t kAlignFloats = 16;  // 64 bytes

    /// lend_capacity: the bytes lend() must be able to hand out (lend_bytes of the parts).
    explicit step_buffers(memory_meter& m, std::size_t lend_capacity = 0)
        : lend_capacity(lend_capacity),
          cu(metered_allocator<std::int32_t>(m, octet::memory_category::temporaries)),
          block(metered_allocator<float>(m, octet::memory_category::temporaries)),
          loss_partials(metered_allocator<double>(m, octet::memory_category::temporaries)) {}
    step_buffers(const step_buffers&) = delete;
    step_buffers& operator=(const step_buffers&) = delete;

    static std::size_t aligned(std::size_t floats) { return (floats + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }
    /// Bytes that lend(parts) takes: each part from a 64-byte boundary.
    static std::size_t lend_bytes(const std::vector<std::size_t>& parts) {
        std::size_t total = 0;
        for (std::size_t b : parts) total += aligned((b + 3) / 4) * 4;
        return total;
    }
    /// Floats of the block: the regions of these sizes, or lend_capacity bytes if more, and 64
    /// bytes to align its start (the ledger's side of carve()).
    static std::size_t block_floats(const region_sizes& floats, std::size_t lend_capacity) {
        std::size_t total = 0;
        for (std::size_t f : floats) total += aligned(f);
        return std::max(total, aligned((lend_capacity + 3) / 4)) + kAlignFloats;
    }
    /// Allocates the block and lays the regions out in it (the first model, once).
    void carve(const region_sizes& floats) {
        block.assign(block_floats(floats, lend_capacity), 0.0f);
        float* at = aligned_start();
        for (std::size_t r = 0; r < region_count; ++r) {
            regions[r] = float_region{floats[r] == 0 ? nullptr : at, floats[r]};
            at += aligned(floats[r]);
        }
    }
    /// Between steps, while no model runs: disjoint blocks of parts[i] bytes, each from a 64-byte
    /// boundary, out of the step's float memory (every region's contents are lost; a model's
    /// score() must be taken again). At most lend_capacity bytes (lend_bytes(parts)).
    std::vector<octet::span<unsigned char>> lend(const std::vector<std::size_t>& parts) {
        OCTET_REQUIRE(!block.empty() && lend_bytes(parts) <= (block.size() - kAlignFloats) * sizeof(float),
                      "common::step_buffers::lend", "parts",
                      octet::detail::message("take ", lend_bytes(parts), " bytes but the block holds ",
                                             block.empty() ? 0 : (block.size() - kAlignFloats) * sizeof(float),
                                             "; construct step_buffers with lend_capacity = lend_bytes(parts)"));
        ++lent;
        std::vector<octet::span<unsigned char>> out;
        auto* at = reinterpret_cast<unsigned char*>(aligned_start());
        for (std::size_t b : parts) {
            out.emplace_back(at, b);
            at += aligned((b + 3) / 4) * 4;
        }
        return out;
    }

    std::size_t lend_capacity = 0;
    std::uint64_t lent = 0;  // lend() calls so far
    metered_vector<std::int32_t> cu;
    metered_vector<float> block;  // the regions' floats (carve)
    std::array<float_region, region_count> regions{};
    metered_vector<double> loss_partials;
#if TRAIN_HAS_FP8_LINEAR
    octet::linear_workspace linear_workspace;  // the host FP8 linears' transient copies
#endif
    std::unique_ptr<meter_booking> workspace_booking;  // linear_workspace's bytes
    octet::host_arena arena;                           // octet's host scratch (scratch_arena_bytes)
    std::unique_ptr<meter_booking> arena_booking;      // its bytes
    std::string sized_for;                             // the first model's shape ("" until then)

private:
    float* aligned_start() {
        const auto misalign = reinterpret_cast<std::uintptr_t>(block.data()) % (kAlignFloats * sizeof(float));
        return block.data() + (misalign == 0 ? 0 : (kAlignFloats * sizeof(float) - misalign) / sizeof(float));
    }
};

/// One saved input of a non-linear layer (or of float attention) for the backward, in the recipe's
/// saved_storage: an FP8 copy (octet::saved_activation, E4M3 with a float scale per 32 elements of
/// a row) or a bf16 copy (round to nearest even), in storage it owns for up to max_rows x cols.
/// A float32 recipe keeps none (its floats stay in the layer's buffers).
class saved_copy {
public:
    using fp8_recipe = octet::activation_recipes::e4m3_1x32;

    saved_copy(saved_storage s, std::size_t max_rows, std::size_t cols)
        : storage_(s),
          max_rows_(max_rows),
          cols_(cols),
          fp8_(s == saved_storage::fp8 ? max_rows : 0, s == saved_storage::fp8 ? cols : 0),
          bf16_(s == saved_storage::bf16 ? max_rows * cols : 0) {}

    /// Bytes a copy of max_rows x cols takes in storage s (the ledger's side of bytes()).
    static std::size_t bytes_of(saved_storage s, std::size_t max_rows, std::size_t cols) {
        if (s == saved_storage::fp8) return octet::saved_activation_bytes<fp8_recipe>(max_rows, cols);
        return s == saved_storage::bf16 ? max_rows * cols * sizeof(octet::bf16) : 0;
    }
    std::size_t bytes() const { return fp8_.bytes() + bf16_.size() * sizeof(octet::bf16); }

    /// Keeps x (rows x cols, rows <= max_rows).
    void store(octet::host_executor ex, octet::matrix_ref<const float> x) {
        if (storage_ == saved_storage::fp8) {
            fp8_.store(ex, x);
            return;
        }
        OCTET_REQUIRE(storage_ == saved_storage::bf16, "common::saved_copy::store", "this",
                      "keeps nothing for a float32 recipe; keep the floats instead");
        OCTET_REQUIRE(x.cols == cols_ && x.rows <= max_rows_ && x.ld == x.cols, "common::saved_copy::store", "x",
                      octet::detail::message("is ", x.rows, " x ", x.cols, " (ld ", x.ld, "); the copy holds up to ",
                                             max_rows_, " dense rows of ", cols_));
        rows_ = x.rows;
        const float* in = x.data;
        octet::bf16* out = bf16_.data();
        octet::parallel_for(ex, x.rows * cols_, 1 << 14, [&](std::size_t b, std::size_t e) {
            for (std::size_t i = b; i < e; ++i) out[i] = octet::to_bf16(in[i]);
        });
    }
    /// Writes the last store's values (decoded) into out (its rows x cols, dense).
    void load(octet::host_executor ex, octet::matrix_ref<float> out) const {
        if (storage_ == saved_storage::fp8) {
            fp8_.load(ex, out);
            return;
        }
        OCTET_REQUIRE(
            storage_ == saved_storage::bf16 && out.rows == rows_ && out.cols == cols_ && out.ld == cols_,
            "common::saved_copy::load", "out",
            octet::detail::message("is ", out.rows, " x ", out.cols, "; the copy holds ", rows_, " x ", cols_));
        const octet::bf16* in = bf16_.data();
        float* o = out.data;
        octet::parallel_for(ex, rows_ * cols_, 1 << 14, [&](std::size_t b, std::size_t e) {
            for (std::size_t i = b; i < e; ++i) o[i] = octet::to_float(in[i]);
        });
    }

private:
    saved_storage storage_;
    std::size_t max_rows_, cols_, rows_ = 0;
    octet::saved_activation<fp8_recipe> fp8_;
    std::vector<octet::bf16> bf16_;
};

}  // namespace common
