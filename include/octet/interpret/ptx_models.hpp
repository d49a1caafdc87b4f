// octet/interpret/ptx_models.hpp: the interpreter's models of the PTX instructions in octet/cuda/ptx.cuh,
// each written from the PTX ISA's description of the instruction (fragment layouts, operand order,
// rounding), independent of octet's kernels. Warp-collective instructions are warp_exchange calls
// (interpret.hpp); operands in shared memory are read and written by each lane through sptr, so the
// checks see them as that lane's accesses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "octet/interpret/interpret.hpp"

namespace octet {
namespace interpret {
namespace model {

// ---- mma.sync ---------------------------------------------------------------------------------------

// ---- ldmatrix ---------------------------------------------------------------------------------------

// ---- cp.async ---------------------------------------------------------------------------------------
// PTX ISA, cp.async: copies cp_size bytes (4, 8 or 16; .cg only 16) from global src to shared dst,
// of which the first src_size come from src and the rest are zeros (src_size > cp_size is undefined);
// both addresses must be aligned to cp_size. The copy is performed asynchronously: its writes are
// guaranteed visible to the issuing thread only after the cp.async.wait_group / wait_all that covers
// its group (commit_group closes a group of the thread's uncommitted copies, possibly empty), and to
// other threads only through a barrier after that. The model is one execution the ISA allows:
//   - the source is read when the copy is issued (the earliest the hardware may read it), so a source
//     past the end of a guarded_buffer faults at the cp.async, naming the issuing thread there;
//     later writes to the source before the wait are not detected (global memory is not race-checked);
//   - the destination is written at the wait that completes the copy's group, as that thread's plain
//     writes through the shared-memory checks, i.e. the latest the ISA allows: a read of it before the
//     wait sees stale bytes, or is an uninitialized read, and a read by another thread that no barrier
//     orders after the wait is a race. Bounds of dst are checked at that write;
//   - a misaligned operand (the device faults: misaligned address) or src_size > cp_size (undefined)
//     is check::instruction_misuse and ends the block;
//   - a thread that exits with copies pending is reported (machine::check_exit) and its copies are
//     dropped: no wait of its own can complete them, and octet's kernels end with a wait.

/// cp.async.{ca,cg}.shared.global [dst], [src], cp_size, src_size.
inline void cp_async(const char* instruction, std::uint32_t dst, const void* src, std::uint32_t cp_size,
                     std::uint32_t src_size) {
    const auto s = reinterpret_cast<std::uintptr_t>(src);
    if (src_size > cp_size)
        detail::instruction_misuse(dst, std::string(instruction) + " with src-size " + std::to_string(src_size) +
                                            " over its cp-size " + std::to_string(cp_size));
    if (dst % cp_size != 0)
        detail::instruction_misuse(
            dst, std::string(instruction) + " to a destination not aligned to its cp-size " + std::to_string(cp_size));
    if (s % cp_size != 0)
        detail::instruction_misuse(-1, std::string(instruction) + " from source " + detail::hex(s) +
                                           ", not aligned to its cp-size " + std::to_string(cp_size));
    detail::async_copies& q = detail::thread_async_copies();
    detail::async_copy c;
    c.dst = dst;
    c.bytes = cp_size;
    if (src_size > 0) std::memcpy(c.data, src, src_size);  // a guard page faults here, at the cp.async
    q.uncommitted.push_back(c);
}

/// cp.async.commit_group: the thread's uncommitted copies become its newest group (empty if none).
inline void cp_async_commit_group() {
    detail::async_copies& q = detail::thread_async_copies();
    q.groups.push_back(std::move(q.uncommitted));
    q.uncommitted.clear();
}

/// cp.async.wait_group n: completes the thread's committed groups but the newest n, oldest first;
/// each copy writes its bytes now, as this thread's writes (uncommitted copies stay in flight).
inline void cp_async_wait_group(unsigned n) {
    detail::async_copies& q = detail::thread_async_copies();
    if (q.groups.size() <= n) return;
    // take the groups out first: a report thrown from a write leaves no half-landed state behind
    const auto end = q.groups.end() - static_cast<std::ptrdiff_t>(n);
    std::vector<std::vector<detail::async_copy>> done(std::make_move_iterator(q.groups.begin()),
                                                      std::make_move_iterator(end));
    q.groups.erase(q.groups.begin(), end);
    for (const auto& g : done)
        for (const detail::async_copy& c : g) {
            // checked against the variable holding the first byte, as the kernel's own accesses are
            std::uint8_t* p = shared_at<std::uint8_t>(c.dst).bytes();
            if (detail::shared_access(p, c.bytes, detail::access::write, detail::shared_region_at(c.dst)))
                std::memcpy(p, c.data, c.bytes);
        }
}

/// cp.async.wait_all: as commit_group then wait_group 0 (the ISA's definition).
inline void cp_async_wait_all() {
    cp_async_commit_group();
    cp_async_wait_group(0);
}

// ---- mbarrier ---------------------------------------------------------------------------------------

// ---- cp.async.bulk.tensor (TMA), prefetch.tensormap -------------------------------------------------

// ---- fence.proxy.async, setmaxnreg ------------------------------------------------------------------

// ---- wgmma ------------------------------------------------------------------------------------------

}  // namespace model
}  // namespace interpret
}  // namespace octet
