// examples/common/meter.hpp: the meter that counts every buffer a run allocates, by ledger
// category (an octet::memory_ledger fed by allocations and frees), and the vectors booked in it.
#pragma once

#include <octet/octet.hpp>

#include <cstddef>
#include <memory>
#include <vector>

namespace common {

/// Counts the bytes of every buffer the run allocates, by ledger category, with running and peak
/// totals (an octet::memory_ledger fed by allocations and frees).
class memory_meter {
public:
    void allocate(octet::memory_category c, double bytes) { ledger_.allocate(c, bytes); }
    void release(octet::memory_category c, double bytes) { ledger_.release(c, bytes); }
    const octet::memory_ledger& ledger() const { return ledger_; }

private:
    octet::memory_ledger ledger_;
};

/// A std::allocator that books what it allocates in a memory_meter under one category.
template <class T>
struct metered_allocator {
    using value_type = T;
    memory_meter* meter = nullptr;
    octet::memory_category category = octet::memory_category::temporaries;

    metered_allocator(memory_meter& m, octet::memory_category c) : meter(&m), category(c) {}
    template <class U>
    metered_allocator(const metered_allocator<U>& o) : meter(o.meter), category(o.category) {}

    T* allocate(std::size_t n) {
        T* p = std::allocator<T>{}.allocate(n);
        meter->allocate(category, static_cast<double>(n * sizeof(T)));
        return p;
    }
    void deallocate(T* p, std::size_t n) {
        meter->release(category, static_cast<double>(n * sizeof(T)));
        std::allocator<T>{}.deallocate(p, n);
    }
    template <class U>
    bool operator==(const metered_allocator<U>& o) const {
        return meter == o.meter && category == o.category;
    }
    template <class U>
    bool operator!=(const metered_allocator<U>& o) const {
        return !(*this == o);
    }
};

/// A vector whose storage is booked in a memory_meter.
template <class T>
using metered_vector = std::vector<T, metered_allocator<T>>;

template <class T>
metered_vector<T> make_metered(memory_meter& m, octet::memory_category c, std::size_t n, T value = T{}) {
    return metered_vector<T>(n, value, metered_allocator<T>(m, c));
}

/// Books bytes allocated outside the meter's vectors (octet's own buffers: a linear_context's, a
/// host_arena's) in the meter for as long as it lives.
class meter_booking {
public:
    meter_booking(memory_meter& m, octet::memory_category c, double bytes) : m_(&m), c_(c), bytes_(bytes) {
        m_->allocate(c_, bytes_);
    }
    ~meter_booking() { m_->release(c_, bytes_); }
    meter_booking(const meter_booking&) = delete;
    meter_booking& operator=(const meter_booking&) = delete;

private:
    memory_meter* m_;
    octet::memory_category c_;
    double bytes_;
};

}  // namespace common
