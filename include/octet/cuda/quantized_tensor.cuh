// octet/cuda/quantized_tensor.cuh: an owning quantized tensor in device memory, allocated through
// the executor's allocator (cuda/executor.cuh), handing out quantized_ref views.
//
//   octet::cuda::device_quantized_tensor<Recipe> a(ex, rows, cols);   // codes + scales from ex's allocator
//   octet::quantize<Recipe>(ex, x, a.ref());
//   octet::scaled_gemm(ex, a.cref(), b.cref(), D);
//
// The storage follows quant_layout_of<Recipe>::make(rows, cols, pad) (pad: 16-byte rows, what the
// GEMM and attention kernels need) and is uninitialized. It is requested from ex's allocator on
// ex.stream and returned there when the tensor is destroyed: work enqueued on that stream before
// the destruction may still use it (stream-ordered); work on other streams must be ordered before
// the destruction by the caller (events), as with any stream-ordered allocation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "octet/cuda/executor.cuh"
#include "octet/quant/tensor.hpp"

namespace octet {
namespace cuda {

template <class Recipe>
class device_quantized_tensor {
public:
    device_quantized_tensor() = default;
    device_quantized_tensor(const stream_executor& ex, std::size_t rows, std::size_t cols, bool pad = true)
        : layout_(quant_layout_of<Recipe>::make(rows, cols, pad)),
          data_(ex, layout_.data_bytes),
          scales_(ex, layout_.scale_bytes),
          tensor_scale_(ex, Recipe::two_level ? sizeof(float) : 0) {}

    const quant_layout& layout() const { return layout_; }
    std::size_t rows() const { return layout_.rows; }
    std::size_t cols() const { return layout_.cols; }
    /// Device bytes held (codes, scales, and the two-level tensor scale), as requested.
    std::size_t bytes() const { return layout_.data_bytes + layout_.scale_bytes + (Recipe::two_level ? 4 : 0); }

    quantized_ref<Recipe> ref() const {
        return quantized_ref<Recipe>(data_.as<std::uint8_t>(), scales_.as<std::uint8_t>(), layout_,
                                     tensor_scale_.as<float>());
    }
    quantized_cref<Recipe> cref() const { return ref(); }

private:
    quant_layout layout_{};
    detail::stream_scratch data_, scales_, tensor_scale_;
};

}  // namespace cuda
}  // namespace octet
