// octet/core/host_arena.hpp: one block of host memory that serves every temporary of a sequence
// of host operations, as a host_allocator.
//
//   octet::host_arena arena(bytes);   // bytes: the largest ..._scratch_bytes(ex, ...) of the calls
//   const auto ex = octet::with_allocator(octet::on_host(pool), arena.allocator());
//   octet::quantize<R>(ex, ...); octet::scaled_gemm(ex, ...); ...   // no allocation per call
//
// An operation takes its scratch and gives it back before it returns, nested requests last-in
// first-out, so one block as large as the largest single operation's need serves a whole training
// step: the step's peak of temporaries is that operation's need, not the sum over its calls. The
// arena counts its high-water mark (peak()), which a memory ledger can compare with its prediction.
// A request beyond the block returns null: the operation throws octet::error naming the bytes.
// The block is the arena's own (host_arena(bytes)) or the caller's (host_arena(borrowed)): memory
// that is idle while the operations run, such as a training step's buffers between steps, serves
// them without a byte more.
// Not thread-safe (octet calls an allocator only from the calling thread): one arena per thread
// that calls octet operations concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/span.hpp"

namespace octet {

class host_arena {
public:
    host_arena() = default;
    /// A block of `bytes` (64-byte aligned), allocated here and only here.
    explicit host_arena(std::size_t bytes)
        : block_(bytes == 0 ? nullptr : static_cast<unsigned char*>(::operator new (bytes, std::align_val_t{64}))),
          capacity_(bytes),
          owned_(true) {}
    /// An arena over the caller's block, which must start on a 64-byte boundary and outlive the
    /// arena; the arena never frees it.
    explicit host_arena(span<unsigned char> borrowed) : block_(borrowed.data()), capacity_(borrowed.size()) {
        OCTET_REQUIRE(borrowed.data() != nullptr || borrowed.empty(), "octet::host_arena", "borrowed",
                      "is null with a non-zero size; pass the block's address");
        OCTET_REQUIRE(reinterpret_cast<std::uintptr_t>(borrowed.data()) % 64 == 0, "octet::host_arena", "borrowed",
                      "does not start on a 64-byte boundary; align the block's start (its requests are handed out "
                      "64-byte aligned)");
    }
    host_arena(host_arena&& o) noexcept { swap(o); }
    host_arena& operator=(host_arena&& o) noexcept {
        host_arena(std::move(o)).swap(*this);
        return *this;
    }
    host_arena(const host_arena&) = delete;
    host_arena& operator=(const host_arena&) = delete;
    ~host_arena() {
        if (block_ && owned_) ::operator delete (block_, std::align_val_t{64});
    }

    /// The allocator to lend with octet::with_allocator. Valid while the arena lives (and is not
    /// moved from).
    host_allocator allocator() {
        host_allocator a;
        a.context = this;
        a.allocate = [](void* c, std::size_t bytes) -> void* { return static_cast<host_arena*>(c)->take(bytes); };
        a.deallocate = [](void* c, void* p, std::size_t bytes) { static_cast<host_arena*>(c)->give_back(p, bytes); };
        return a;
    }

    std::size_t capacity() const { return capacity_; }
    /// Bytes in use now (0 between operations).
    std::size_t used() const { return top_; }
    /// The most bytes in use at once since construction or reset_peak() (alignment padding included).
    std::size_t peak() const { return peak_; }
    void reset_peak() { peak_ = top_; }

private:
    void swap(host_arena& o) noexcept {
        std::swap(block_, o.block_);
        std::swap(capacity_, o.capacity_);
        std::swap(top_, o.top_);
        std::swap(peak_, o.peak_);
        std::swap(live_, o.live_);
        std::swap(owned_, o.owned_);
    }
    void* take(std::size_t bytes) {
        const std::size_t at = (top_ + 63) & ~std::size_t{63};
        if (at > capacity_ || bytes > capacity_ - at) return nullptr;
        top_ = at + bytes;
        peak_ = top_ > peak_ ? top_ : peak_;
        ++live_;
        return block_ + at;
    }
    void give_back(void* p, std::size_t bytes) {
        // octet's scratch blocks nest, so p is the newest request and its bytes are reused at once;
        // a block given back out of order is reused when every block has come back.
        --live_;
        const auto* q = static_cast<const unsigned char*>(p);
        if (live_ == 0)
            top_ = 0;
        else if (q + bytes == block_ + top_)
            top_ = static_cast<std::size_t>(q - block_);
    }

    unsigned char* block_ = nullptr;
    std::size_t capacity_ = 0, top_ = 0, peak_ = 0, live_ = 0;
    bool owned_ = false;  // the block is freed here (host_arena(bytes)), not the caller's
};

}  // namespace octet
