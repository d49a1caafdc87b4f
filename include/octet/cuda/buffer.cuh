// octet/cuda/buffer.cuh: an owning device buffer (RAII over cudaMalloc), for tests, examples
// and users who do not bring their own allocator. Library functions take views, never buffers.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "octet/core/span.hpp"
#include "octet/cuda/check.cuh"

namespace octet {
namespace cuda {

template <class T>
class device_buffer {
public:
    device_buffer() = default;
    explicit device_buffer(std::size_t n) : size_(n) {
        if (n > 0) OCTET_CUDA_CHECK(cudaMalloc(&data_, n * sizeof(T)));
    }
    explicit device_buffer(const std::vector<T>& host) : device_buffer(host.size()) { upload(host); }
    ~device_buffer() {
        if (data_) cudaFree(data_);
    }
    device_buffer(const device_buffer&) = delete;
    device_buffer& operator=(const device_buffer&) = delete;
    device_buffer(device_buffer&& o) noexcept
        : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    device_buffer& operator=(device_buffer&& o) noexcept {
        std::swap(data_, o.data_);
        std::swap(size_, o.size_);
        return *this;
    }

    T* data() const { return data_; }
    std::size_t size() const { return size_; }
    span<T> view() const { return span<T>(data_, size_); }
    span<const T> cview() const { return span<const T>(data_, size_); }

    void upload(const std::vector<T>& host) {
        if (host.size() != size_) throw octet::error("device_buffer::upload: size mismatch");
        if (size_) OCTET_CUDA_CHECK(cudaMemcpy(data_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice));
    }
    std::vector<T> download() const {
        std::vector<T> host(size_);
        if (size_) OCTET_CUDA_CHECK(cudaMemcpy(host.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost));
        return host;
    }
    /// Fill every byte with `byte` (poison before a kernel, then check every element was written).
    void fill_bytes(unsigned char byte) {
        if (size_) OCTET_CUDA_CHECK(cudaMemset(data_, byte, size_ * sizeof(T)));
    }

private:
    T* data_ = nullptr;
    std::size_t size_ = 0;
};

}  // namespace cuda
}  // namespace octet
