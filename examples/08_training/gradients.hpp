// examples/08_training/gradients.hpp: one rank's gradient buffer, in the recipe's storage
// (recipe.gradients): float32, or bf16 (half the bytes; the model rounds each tensor's gradient
// once as it completes, the all-reduce reads and writes the bf16 values in place, and the
// optimizer reads them as they are, scaled inside its fused step). Booked as gradients.
#pragma once

#include "train.hpp"

#include <octet/octet.hpp>

#include <cstddef>

namespace train {

class gradient_buffer {
public:
    gradient_buffer(memory_meter& meter, gradient_storage storage, std::size_t n)
        : bf16_(storage == gradient_storage::bf16),
          f32_(make_metered<float>(meter, octet::memory_category::gradients, bf16_ ? 0 : n)),
          b16_(make_metered<octet::bf16>(meter, octet::memory_category::gradients, bf16_ ? n : 0)) {}

    bool is_bf16() const { return bf16_; }
    std::size_t size() const { return bf16_ ? b16_.size() : f32_.size(); }
    /// Bytes per element of a buffer in this storage.
    static double element_bytes(gradient_storage s) {
        return s == gradient_storage::bf16 ? sizeof(octet::bf16) : sizeof(float);
    }

    /// f(span<float>) or f(span<octet::bf16>), as the buffer holds.
    template <class F>
    decltype(auto) visit(F&& f) {
        if (bf16_) return f(octet::span<octet::bf16>(b16_.data(), b16_.size()));
        return f(octet::span<float>(f32_.data(), f32_.size()));
    }
    template <class F>
    decltype(auto) visit(F&& f) const {
        if (bf16_) return f(octet::span<const octet::bf16>(b16_.data(), b16_.size()));
        return f(octet::span<const float>(f32_.data(), f32_.size()));
    }

private:
    bool bf16_;
    metered_vector<float> f32_;
    metered_vector<octet::bf16> b16_;
};

}  // namespace train
