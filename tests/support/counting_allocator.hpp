// Counting every allocation a host operation makes, for the "every byte through the caller" tests.
//
// Include this header in exactly one translation unit of a test program: it replaces the global
// operator new (all forms), so that while a `global_allocations` guard is alive every allocation
// any thread makes through new (std::vector, std::string, std::thread, ...) is counted. A
// `lent_allocator` is an octet::host_allocator that counts what it serves, its peak and whether
// everything came back. A host operation called with with_allocator(on_host(pool), lent) must make
// zero global allocations: all its temporaries come from the lent allocator.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

#include "octet/core/executor.hpp"

namespace octet_test {

inline std::atomic<bool> counting_armed{false};
inline std::atomic<long> counted_allocations{0};

/// Counts global allocations from construction to count() (every thread).
class global_allocations {
public:
    global_allocations() {
        counted_allocations.store(0);
        counting_armed.store(true);
    }
    ~global_allocations() { counting_armed.store(false); }
    global_allocations(const global_allocations&) = delete;
    global_allocations& operator=(const global_allocations&) = delete;
    long count() const { return counted_allocations.load(); }
};

/// An octet::host_allocator that serves from malloc and counts: calls, bytes live, the peak, and
/// whether every allocation came back with the size it was taken with.
struct lent_allocator {
    long allocations = 0, deallocations = 0;
    std::size_t live = 0, peak = 0;
    bool size_mismatch = false;

    octet::host_allocator ref() {
        octet::host_allocator a;
        a.context = this;
        a.allocate = [](void* c, std::size_t bytes) -> void* {
            auto& self = *static_cast<lent_allocator*>(c);
            ++self.allocations;
            self.live += bytes;
            self.peak = self.live > self.peak ? self.live : self.peak;
            // 64-byte aligned, the contract's minimum; header of 64 bytes remembers the size.
            void* raw = std::aligned_alloc(64, ((bytes + 63) / 64) * 64 + 64);
            if (raw == nullptr) return nullptr;
            *static_cast<std::size_t*>(raw) = bytes;
            return static_cast<unsigned char*>(raw) + 64;
        };
        a.deallocate = [](void* c, void* p, std::size_t bytes) {
            auto& self = *static_cast<lent_allocator*>(c);
            ++self.deallocations;
            void* raw = static_cast<unsigned char*>(p) - 64;
            if (*static_cast<std::size_t*>(raw) != bytes) self.size_mismatch = true;
            self.live -= bytes;
            std::free(raw);
        };
        return a;
    }
    bool balanced() const { return allocations == deallocations && live == 0 && !size_mismatch; }
    void reset_peak() { peak = live; }
};

inline void* counted_new(std::size_t bytes, std::size_t align) {
    if (counting_armed.load(std::memory_order_relaxed)) counted_allocations.fetch_add(1);
    if (bytes == 0) bytes = 1;
    void* p = align <= alignof(std::max_align_t) ? std::malloc(bytes)
                                                 : std::aligned_alloc(align, ((bytes + align - 1) / align) * align);
    if (p == nullptr) throw std::bad_alloc();
    return p;
}

}  // namespace octet_test

void* operator new(std::size_t n) {
    return octet_test::counted_new(n, 0);
}
void* operator new[](std::size_t n) {
    return octet_test::counted_new(n, 0);
}
void* operator new(std::size_t n, std::align_val_t a) {
    return octet_test::counted_new(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
    return octet_test::counted_new(n, static_cast<std::size_t>(a));
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
    try {
        return octet_test::counted_new(n, 0);
    } catch (...) {
        return nullptr;
    }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
    try {
        return octet_test::counted_new(n, 0);
    } catch (...) {
        return nullptr;
    }
}
void operator delete(void* p) noexcept {
    std::free(p);
}
void operator delete[](void* p) noexcept {
    std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
    std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
    std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
    std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
    std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
    std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
    std::free(p);
}
