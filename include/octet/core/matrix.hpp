// octet/core/matrix.hpp: a non-owning 2-D view with a leading dimension and a storage order.
//
//   matrix_ref<const float> x{ptr, rows, cols, ld};                 // row-major, ld >= cols
//   matrix_ref<const bf16>  y{ptr, rows, cols, ld, storage_order::col_major};  // column-major, ld >= rows
//
// Element (i, j) lives at data[i * ld + j] (row-major) or data[j * ld + i] (column-major).
#pragma once

#include <cstddef>
#include <type_traits>

#include "octet/config.hpp"

namespace octet {

/// How a matrix_ref's elements sit in memory. (Named `layout` in octet 0.1; "layout" now means
/// only the byte layout of a quantized copy, quant_layout, or of a wire message, wire_layout.)
enum class storage_order { row_major, col_major };

template <class T>
struct matrix_ref {
    T* data = nullptr;
    std::size_t rows = 0;
    std::size_t cols = 0;
    std::size_t ld = 0;  ///< elements between consecutive rows (row-major) or columns (column-major)
    octet::storage_order order = storage_order::row_major;

    constexpr matrix_ref() = default;
    OCTET_HD constexpr matrix_ref(T* d, std::size_t r, std::size_t c, std::size_t lead,
                                  octet::storage_order o = storage_order::row_major)
        : data(d), rows(r), cols(c), ld(lead), order(o) {}
    /// A dense row-major matrix (ld = cols).
    OCTET_HD constexpr matrix_ref(T* d, std::size_t r, std::size_t c) : data(d), rows(r), cols(c), ld(c) {}

    template <class U, class = std::enable_if_t<std::is_same_v<const U, T>>>
    OCTET_HD constexpr matrix_ref(matrix_ref<U> o)
        : data(o.data), rows(o.rows), cols(o.cols), ld(o.ld), order(o.order) {}

    OCTET_HD constexpr std::size_t offset(std::size_t i, std::size_t j) const {
        return order == storage_order::row_major ? i * ld + j : j * ld + i;
    }
    OCTET_HD constexpr T& operator()(std::size_t i, std::size_t j) const { return data[offset(i, j)]; }
    OCTET_HD constexpr std::size_t size() const { return rows * cols; }
    OCTET_HD constexpr bool empty() const { return rows == 0 || cols == 0; }
    /// The same memory seen as the transpose (no copy).
    OCTET_HD constexpr matrix_ref transposed() const {
        return matrix_ref(data, cols, rows, ld,
                          order == storage_order::row_major ? storage_order::col_major : storage_order::row_major);
    }
};

}  // namespace octet
