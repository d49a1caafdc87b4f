// octet/core/span.hpp: a minimal non-owning view (C++17 has no std::span).
//
// Library functions take views; callers own memory (std::vector, thrust::device_vector,
// octet::cuda::device_buffer). A view says nothing about where its memory lives: host
// functions expect host memory, stream functions expect device memory.
#pragma once

#include <cstddef>
#include <type_traits>

#include "octet/config.hpp"

namespace octet {

template <class T>
class span {
public:
    using element_type = T;
    using value_type = std::remove_cv_t<T>;

    constexpr span() = default;
    OCTET_HD constexpr span(T* data, std::size_t size) : data_(data), size_(size) {}
    /// From a contiguous container of T (or of non-const T for a span of const T), as std::span:
    /// only where the elements convert without a cast, so that overloads on the element type
    /// (span<const float> beside span<const bf16>) stay unambiguous.
    template <class Container, class Elem = std::remove_pointer_t<decltype(std::declval<Container&>().data())>,
              class = std::enable_if_t<std::is_convertible_v<Elem (*)[], T (*)[]>>>
    constexpr span(Container& c) : data_(c.data()), size_(c.size()) {}
    template <class U, class = std::enable_if_t<std::is_same_v<const U, T>>>
    OCTET_HD constexpr span(span<U> other) : data_(other.data()), size_(other.size()) {}

    OCTET_HD constexpr T* data() const { return data_; }
    OCTET_HD constexpr std::size_t size() const { return size_; }
    OCTET_HD constexpr std::size_t size_bytes() const { return size_ * sizeof(T); }
    OCTET_HD constexpr bool empty() const { return size_ == 0; }
    OCTET_HD constexpr T& operator[](std::size_t i) const { return data_[i]; }
    OCTET_HD constexpr T* begin() const { return data_; }
    OCTET_HD constexpr T* end() const { return data_ + size_; }
    OCTET_HD constexpr span subspan(std::size_t offset, std::size_t count) const { return span(data_ + offset, count); }

private:
    T* data_ = nullptr;
    std::size_t size_ = 0;
};

template <class T>
span(T*, std::size_t) -> span<T>;

/// A read-only view of a contiguous container (std::vector, std::array, ...).
template <class Container>
auto as_cspan(const Container& c) {
    return span<const typename Container::value_type>(c.data(), c.size());
}
/// A writable view of a contiguous container.
template <class Container>
auto as_span(Container& c) {
    return span<typename Container::value_type>(c.data(), c.size());
}

}  // namespace octet
