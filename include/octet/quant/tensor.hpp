// octet/quant/tensor.hpp: quantized tensor views, their memory layout, and an owning host container.
//
// Layout of a quantized copy of a rows x cols matrix (quant_layout<Recipe>::make):
//   * data: row-major, `ld` codes per row; a row occupies `row_bytes` bytes. FP8 codes are one
//     byte; FP4 codes are packed two per byte (element j in the low nibble when j is even); FP6
//     codes four per three bytes (little-endian 24-bit groups). With padding (the default), ld is
//     rounded up so that every row starts on a 16-byte boundary (32 FP4 / 64 FP6 / 16 FP8 codes).
//     Padding codes are written as zero.
//   * scales: one per block; the scale grid has scale_rows = ceil(rows / R) x scale_cols =
//     ceil(cols / C). It is stored COLUMN-MAJOR: the scale of block (bi, bj) is element
//     bj * scale_ld + bi, so the row-block index is contiguous (for 1x128 tiles of an M x K
//     activation: M contiguous within each K block, what a GEMM loading A's scales per K step
//     wants). scale_ld is scale_rows rounded up to a multiple of 16 bytes of scales (4 floats or
//     16 one-byte scales) when scale_rows > 1, so each scale column starts 16-byte aligned and can
//     be loaded with TMA. Elements are float (scale_storage::f32) or one byte (ue8m0, e4m3 codes).
//   * two-level recipes (NVFP4) also keep one float tensor_scale (a pointer, in the same memory
//     space as the data, because a device quantizer computes it on the device).
//   * the column-wise (transposed) copy of X is simply the quantized copy of X^T (cols x rows),
//     with the same recipe: its 1x128 tiles run down X's columns. Kernels that need an operand in
//     a layout other than K-major read this copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "octet/config.hpp"
#include "octet/core/byte_io.hpp"
#include "octet/core/check.hpp"
#include "octet/format/packed.hpp"
#include "octet/quant/recipe.hpp"
#include "octet/quant/scale.hpp"

namespace octet {

struct quant_layout {
    std::size_t rows = 0, cols = 0;
    std::size_t ld = 0;         ///< codes per stored row (>= cols)
    std::size_t row_bytes = 0;  ///< bytes per stored row
    std::size_t data_bytes = 0;
    std::size_t block_rows = 0, block_cols = 0;  ///< R and C of the granularity for this shape
    std::size_t scale_rows = 0, scale_cols = 0, scale_ld = 0;
    std::size_t scale_bytes = 0;  ///< bytes of the whole scale grid (with padding)
};

template <class Recipe>
struct quant_layout_of {
    using Fmt = typename Recipe::format;
    /// Codes that one packing group holds (1 FP8, 2 FP4, 4 FP6) and its bytes (1, 1, 3).
    static constexpr std::size_t group_codes = Fmt::bits <= 4 ? 2 : (Fmt::bits <= 6 ? 4 : 1);
    static constexpr std::size_t group_bytes = Fmt::bits <= 4 ? 1 : (Fmt::bits <= 6 ? 3 : 1);
    /// Codes per 16-byte-aligned row unit (FP6: 48 bytes = 64 codes).
    static constexpr std::size_t aligned_codes = Fmt::bits <= 4 ? 32 : (Fmt::bits <= 6 ? 64 : 16);

    static constexpr std::size_t bytes_for_codes(std::size_t n) { return (n / group_codes) * group_bytes; }

    static quant_layout make(std::size_t rows, std::size_t cols, bool pad = true) {
        quant_layout l;
        l.rows = rows;
        l.cols = cols;
        const std::size_t unit = pad ? aligned_codes : group_codes;
        l.ld = (cols + unit - 1) / unit * unit;
        l.row_bytes = bytes_for_codes(l.ld);
        l.data_bytes = rows * l.row_bytes;
        using G = typename Recipe::granularity;
        l.block_rows = block_extent(G::rows, rows);
        l.block_cols = block_extent(G::cols, cols);
        l.scale_rows = block_count(G::rows, rows);
        l.scale_cols = block_count(G::cols, cols);
        const std::size_t per16 = 16 / Recipe::scale_bytes;
        l.scale_ld =
            l.scale_rows <= 1 ? l.scale_rows : (pad ? (l.scale_rows + per16 - 1) / per16 * per16 : l.scale_rows);
        l.scale_bytes = l.scale_cols * l.scale_ld * Recipe::scale_bytes;
        return l;
    }
};

namespace detail {
template <class Fmt>
OCTET_HD std::uint8_t load_code(const std::uint8_t* row, std::size_t j) {
    if constexpr (Fmt::bits <= 4) {
        return unpack_fp4(row[j >> 1], static_cast<int>(j & 1u));
    } else if constexpr (Fmt::bits <= 6) {
        return unpack_fp6(row + (j >> 2) * 3, static_cast<int>(j & 3u));
    } else {
        return row[j];
    }
}
/// Read-modify-write store of one code (callers make sure no other thread touches the byte group).
template <class Fmt>
OCTET_HD void store_code(std::uint8_t* row, std::size_t j, std::uint8_t code) {
    if constexpr (Fmt::bits <= 4) {
        std::uint8_t& b = row[j >> 1];
        const unsigned shift = (j & 1u) * 4;
        b = static_cast<std::uint8_t>((b & ~(0x0Fu << shift)) | ((code & 0x0Fu) << shift));
    } else if constexpr (Fmt::bits <= 6) {
        std::uint8_t* g = row + (j >> 2) * 3;
        const unsigned shift = static_cast<unsigned>(j & 3u) * 6;
        store_le24(g, (load_le24(g) & ~(0x3Fu << shift)) | ((code & 0x3Fu) << shift));
    } else {
        row[j] = code;
    }
}
}  // namespace detail

/// A view of one quantized copy. `Byte` is std::uint8_t (writable) or const std::uint8_t.
template <class Recipe, class Byte = std::uint8_t>
struct quantized_ref {
    static_assert(is_recipe_v<Recipe>, "octet::quantized_ref: the first parameter must be an octet::recipe<...>");
    using recipe_type = Recipe;
    using float_ptr = std::conditional_t<std::is_const_v<Byte>, const float*, float*>;

    Byte* data = nullptr;
    Byte* scales = nullptr;
    float_ptr tensor_scale = nullptr;  ///< two-level recipes only: one float
    quant_layout layout{};

    constexpr quantized_ref() = default;
    OCTET_HD quantized_ref(Byte* d, Byte* s, const quant_layout& l, float_ptr ts = nullptr)
        : data(d), scales(s), tensor_scale(ts), layout(l) {}
    template <class B, class = std::enable_if_t<std::is_same_v<const B, Byte>>>
    OCTET_HD quantized_ref(const quantized_ref<Recipe, B>& o)
        : data(o.data), scales(o.scales), tensor_scale(o.tensor_scale), layout(o.layout) {}

    OCTET_HD bool empty() const { return data == nullptr; }
    /// No copy at all: the default ref ({}), every pointer null and the layout all zero. Quantize
    /// skips an absent output; one that is only partly set is validated, and fails.
    OCTET_HD bool absent() const {
        const quant_layout& l = layout;
        return data == nullptr && scales == nullptr && tensor_scale == nullptr && l.rows == 0 && l.cols == 0 &&
               l.ld == 0 && l.row_bytes == 0 && l.data_bytes == 0 && l.block_rows == 0 && l.block_cols == 0 &&
               l.scale_rows == 0 && l.scale_cols == 0 && l.scale_ld == 0 && l.scale_bytes == 0;
    }
    OCTET_HD std::size_t rows() const { return layout.rows; }
    OCTET_HD std::size_t cols() const { return layout.cols; }

    OCTET_HD std::uint32_t stored_scale(std::size_t bi, std::size_t bj) const {
        const std::size_t k = bj * layout.scale_ld + bi;
        if constexpr (Recipe::scale_bytes == 4) {
            float f;
            std::memcpy(&f, scales + 4 * k, 4);
            return float_to_bits(f);
        } else {
            return scales[k];
        }
    }
    /// Effective scale S of block (bi, bj): elements dequantize as decode(code) * S.
    OCTET_HD float scale(std::size_t bi, std::size_t bj) const {
        return stored_scale_value<Recipe>(stored_scale(bi, bj),
                                          Recipe::two_level && tensor_scale ? *tensor_scale : 1.0f);
    }
    OCTET_HD std::uint8_t code(std::size_t i, std::size_t j) const {
        return detail::load_code<typename Recipe::format>(data + i * layout.row_bytes, j);
    }
    /// The dequantized value of element (i, j).
    OCTET_HD float value(std::size_t i, std::size_t j) const {
        return decode<typename Recipe::format>(code(i, j)) * scale(i / layout.block_rows, j / layout.block_cols);
    }
};

template <class Recipe>
using quantized_cref = quantized_ref<Recipe, const std::uint8_t>;

/// An owning quantized copy in host memory (tests, examples, CPU users).
template <class Recipe>
class quantized_tensor {
public:
    quantized_tensor() = default;
    quantized_tensor(std::size_t rows, std::size_t cols, bool pad = true)
        : layout_(quant_layout_of<Recipe>::make(rows, cols, pad)),
          data_(layout_.data_bytes),
          scales_(layout_.scale_bytes) {}

    quantized_ref<Recipe> ref() { return quantized_ref<Recipe>(data_.data(), scales_.data(), layout_, &tensor_scale_); }
    quantized_cref<Recipe> cref() const {
        return quantized_cref<Recipe>(data_.data(), scales_.data(), layout_, &tensor_scale_);
    }
    const quant_layout& layout() const { return layout_; }
    std::vector<std::uint8_t>& data() { return data_; }
    std::vector<std::uint8_t>& scales() { return scales_; }
    float tensor_scale() const { return tensor_scale_; }

private:
    quant_layout layout_{};
    std::vector<std::uint8_t> data_;
    std::vector<std::uint8_t> scales_;
    float tensor_scale_ = 1.0f;
};

}  // namespace octet
