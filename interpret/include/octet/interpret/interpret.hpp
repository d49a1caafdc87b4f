// octet/interpret/interpret.hpp: interpret mode, the CPU interpreter that runs a CUDA-style kernel over
// a grid of thread blocks with CUDA's semantics and checks what compute-sanitizer would.
//
// Execution model
//   A launch runs its blocks one after another on the calling host thread, or spread over
//   options::host_threads threads (each with its own `detail::machine`). The threads of a
//   block are fibers (each with its own mmap'ed stack and a guard page below it, kept with the shared
//   window for the host thread's next launch and unmapped when it ends; a hand-written
//   switch on x86-64, ucontext elsewhere or with OCTET_INTERPRET_UCONTEXT), scheduled
//   cooperatively in round-robin order of their linear thread id: a fiber runs until it waits (a
//   barrier, a warp-synchronous instruction) or exits. Warps are groups of 32 consecutive linear ids
//   (x fastest), as on the device. Kernel parameters are copied per thread, as a launch copies them.
//   A launch with thread block clusters (launch_config::cluster) runs each cluster's blocks together,
//   as one unit: their threads are scheduled as one group (block after block in rank order), each
//   block has its own shared window, and a shared::cluster address (mapa) reaches another block's.
//   Under AddressSanitizer every fiber switch is announced to it (__sanitizer_start/finish_switch_fiber:
//   each fiber has its own stack bounds and fake stack) and a stack's shadow is cleared before it is
//   reused, so ASan checks kernels' stack accesses without false reports; without ASan this compiles away.
//
// What it checks (each report names the kernel, block, thread and, where there is one, the address)
//   - shared-memory races: two threads of a block touch the same byte, at least one writes, and no
//     synchronisation orders the two accesses. Ordering is happens-before with vector clocks (the
//     FastTrack algorithm): barriers (`__syncthreads`, `bar.sync`/`bar.arrive`, `__syncwarp`) order
//     their participants; shfl/vote/match do not order memory (the PTX memory model gives them no
//     release/acquire semantics). Atomics never race with atomics; an atomic races with a plain
//     access it is not ordered with (only the last atomic per byte is remembered).
//     Because the check is on happens-before, not on the schedule, it finds a race whichever order the
//     fibers happen to run in.
//   - reads of uninitialised shared memory (shared memory is not zeroed between blocks or launches;
//     every block starts with all bytes uninitialised), including the read half of an atomic;
//   - out-of-bounds shared accesses: outside the variable the pointer was derived from (stricter than
//     the hardware, which only faults outside the block's window), or outside the window;
//   - the device's shared-memory limits (48 KiB without the opt-in attribute, 227 KiB on sm_90 with it);
//   - divergent barriers: `__syncthreads` that some threads never reach (they exited) or reach at a
//     different call site; `bar.sync` with inconsistent thread counts or a count that is not a multiple
//     of the warp size; warp-synchronous instructions whose member masks or operations disagree, that
//     are executed by a thread outside its mask, or whose source lane lies outside the mask;
//   - deadlock: every live fiber of a block is blocked (e.g. `bar.sync 1, 128` reached by 64 threads);
//   - mbarriers (ptx::mbarrier_*, the models in ptx_models.hpp): use before init, misalignment, more
//     arrivals than a phase holds, a tx-count left negative (mbarrier_misuse); a completed phase orders
//     its arrivals (and TMA copies) before its waiters; a wait that cannot end is a deadlock. TMA
//     (cp.async.bulk.tensor) with maps from the interpret runtime's cuTensorMapEncodeTiled, and
//     setmaxnreg's warpgroup-collective use, generic writes read by the async proxy (a model calls
//     machine::async_proxy_read) without their writer's fence.proxy.async (async_proxy);
//   - clusters (ptx_models.hpp): %cluster_ctarank, mapa, remote mbarrier arrivals, TMA multicast and
//     barrier.cluster, whose accesses to another block's shared memory are checked as its own (one
//     happens-before order over the cluster's threads); a rank or multicast mask outside the cluster,
//     a signal to a block whose threads have all exited, a cluster wait without its arrival;
//   - out-of-bounds global accesses past the end of a guarded_buffer (an inaccessible page after it:
//     the fault becomes a report), and fiber stack overflows (the guard page below each stack).
//   Other global memory is ordinary host memory: its accesses are not checked.
//
// Reports are thrown, by default, as `octet::interpret::failure` (an `interpret::error` carrying the
// `report`): the first report ends the launch, the block's other fibers are unwound, and a test's
// CHECK_THROWS or the caller's handler sees it where it happened (after an out-of-bounds access or a
// deadlock the kernel's further behaviour means nothing). `options::mode = on_report::collect` instead
// gathers every report into `run_result::reports` and carries on: after a race or an uninitialised read
// the fiber continues, an out-of-bounds read returns zero and an out-of-bounds write is dropped, and a
// report that stops a block (deadlock, divergent barrier, misuse) ends that block and the launch goes on
// with the next.
//
// What it cannot tell
//   timing and performance (bank conflicts, occupancy); the hardware's order of accumulation inside
//   tensor-core instructions and the FP8 accumulators' truncation (a model sums in a documented order,
//   so kernels are compared with the host path only where the numerics contract fixes the order);
//   `ex2.approx` and other approximate instructions' exact ulps (a model states its error bound); races
//   that need a schedule the cooperative scheduler never produces when a kernel spins on memory
//   (a spinning fiber must call `yield()`); global-memory races between blocks; bar.sync executed by
//   part of a warp (counted per thread here, per warp by the hardware).
//
// Mapping of CUDA's names (octet/interpret/cuda_builtins.hpp, active when OCTET_INTERPRET is defined and
// the compiler is not nvcc): threadIdx, blockIdx, blockDim, gridDim -> thread_idx(), block_idx(),
// block_dim(), grid_dim() of the running fiber; __syncthreads() -> syncthreads(); __syncwarp,
// __shfl*_sync, __all/__any/__ballot_sync, __match_any/all_sync, __activemask, atomicAdd... -> the
// functions below; __global__/__device__/__host__/__forceinline__/__launch_bounds__ -> nothing.
// `__shared__` is deliberately left undefined, so that a declaration not yet converted fails to compile:
// kernels declare shared memory with OCTET_INTERPRET_SHARED(type, name) and
// OCTET_INTERPRET_DYNAMIC_SHARED(type, name) (1024-byte aligned), which give checked handles (sptr /
// sref), and reinterpret them with shared_cast<U>(p); octet's kernels write OCTET_SHARED /
// OCTET_DYNAMIC_SHARED, octet::shared_ptr_t<T> and octet::shared_cast (octet/cuda/shared_memory.cuh),
// `__shared__` declarations and T* under nvcc and these here. A kernel runs with launch("name",
// {grid, block, dynamic_bytes}, kernel, args...).
//
// PTX instructions (octet/cuda/ptx.cuh, the one home of octet's inline PTX, and their models in
// octet/interpret/ptx_models.hpp, each written from the PTX ISA and tested on its own in interpret/tests):
//   mma.sync.m16n8k32 with E4M3/E5M2 operands, ldmatrix (.x1/.x2/.x4, .trans), stmatrix (.x4), cp.async
//   (+ commit_group, wait_group: a copy lands at the wait, as the issuing thread's writes), mbarrier (init, arrive,
//   expect_tx, complete_tx, phase parity, try_wait: a waiting thread blocks like a barrier waiter),
//   cp.async.bulk.tensor 2d loads through tensor maps (runtime.hpp serves cuTensorMapEncodeTiled; box,
//   swizzle, out-of-bounds zero fill), fence.proxy.async, setmaxnreg, wgmma.mma_async m64nNk32 FP8 with
//   shared-memory descriptors and their swizzle modes (+ fence, commit_group, wait_group: results land
//   at the wait). A warp-collective instruction is a warp_exchange (every lane deposits its registers,
//   the last arrival computes all lanes' results from the ISA's fragment definitions); a warpgroup
//   instruction a warpgroup_exchange over the 4 warps of a warpgroup. Operands in shared memory are
//   read and written by each thread through sptr (shared_at turns a 32-bit shared address back into
//   one), so the model's accesses go through the same checks as the kernel's and are attributed to
//   the right thread. Misuse the ISA leaves undefined is a ptx_misuse or mbarrier_misuse report.
// The FP8 operands of mma and wgmma are decoded by fp8.hpp, written from the ISA's description of
// .e4m3 and .e5m2 (not by octet's format rules, which the models check).
// Not modelled yet: cvt to/from FP8/FP6/FP4 as instructions (kernels reach them through octet's
// encode/decode, which are host code here), ex2.approx, and finer global-memory checks (kernels take
// raw pointers: guarded_buffer catches accesses past an end; races and uninitialised reads in global
// memory would need a checked pointer type in the kernels' signatures).
#pragma once

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace octet {
namespace interpret {

/// What the interpreter throws: misuse outside a launch (a thread's coordinates asked for on the
/// host, a descriptor it cannot encode), resources it cannot get (mappings), and, as `failure` below,
/// a launch's reports. The message starts with "interpret: ". Its own type, not octet's: the
/// interpreter is a tool that octet is checked with, and depends on the standard library and the CUDA
/// toolkit's headers only.
class error : public std::runtime_error {
public:
    explicit error(const std::string& what) : std::runtime_error(what) {}
};

// =====================================================================================================
// Public API
// =====================================================================================================

/// CUDA's dim3 (and uint3): the sizes and indices of a launch.
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
    constexpr unsigned long long count() const { return 1ull * x * y * z; }
};

/// What a report is about.
enum class check {
    race,                ///< two unordered accesses to one shared byte, at least one a write
    uninitialized_read,  ///< a read of a shared byte no thread of the block has written
    out_of_bounds,       ///< a shared access outside its variable or the block's window
    shared_limit,        ///< static + dynamic shared memory over the device's limit
    divergent_barrier,   ///< __syncthreads not reached by all threads, or at different call sites
    barrier_misuse,      ///< bar.sync with a bad id or count, or counts that disagree
    warp_sync,           ///< a warp-synchronous instruction with inconsistent masks or operations
    deadlock,            ///< every live thread of a block is blocked
    launch_config,       ///< the launch's grid, block or shared size is not launchable
    trap,                ///< the kernel executed trap (__trap): on the device, the launch fails
    mbarrier_misuse,     ///< an mbarrier used before init, misaligned, over-arrived or over-completed
    async_proxy,         ///< shared bytes read through the async proxy (wgmma, TMA store) after a generic write without
                         ///< fence.proxy.async
    ptx_misuse,          ///< a modelled PTX instruction used against the ISA's rules (ptx_models.hpp)
};
inline const char* to_string(check c) {
    switch (c) {
        case check::race:
            return "race";
        case check::uninitialized_read:
            return "uninitialized read";
        case check::out_of_bounds:
            return "out-of-bounds access";
        case check::shared_limit:
            return "shared memory limit";
        case check::divergent_barrier:
            return "divergent barrier";
        case check::barrier_misuse:
            return "barrier misuse";
        case check::warp_sync:
            return "warp-synchronous misuse";
        case check::deadlock:
            return "deadlock";
        case check::launch_config:
            return "launch configuration";
        case check::trap:
            return "trap";
        case check::mbarrier_misuse:
            return "mbarrier misuse";
        case check::async_proxy:
            return "async proxy without fence";
        case check::ptx_misuse:
            return "PTX misuse";
    }
    return "?";
}

/// One finding: which check, in which kernel, block and thread, at which address, and what happened.
struct report {
    check kind = check::race;
    std::string kernel;
    dim3 block{0, 0, 0}, thread{0, 0, 0};
    std::string address;  ///< "red+0x10 (shared 0x410)"; empty when no address is involved
    std::string detail;
    std::string message() const {
        auto d3 = [](const dim3& d) {
            return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
        };
        std::string m = std::string("interpret: ") + to_string(kind) + " in kernel " + kernel + ", block " + d3(block) +
                        ", thread " + d3(thread);
        if (!address.empty()) m += ", address " + address;
        return m + ": " + detail;
    }
};

/// What a launch in the default mode throws: an interpret::error whose what() is the report's message.
class failure : public error {
public:
    explicit failure(report r) : error(r.message()), report_(std::move(r)) {}
    const report& which() const noexcept { return report_; }

private:
    report report_;
};

enum class on_report {
    raise,    ///< throw the first report as `failure` (default)
    collect,  ///< gather all reports into run_result::reports and go on
};

/// The device's limits the interpreter enforces (defaults: sm_90).
struct device_model {
    std::size_t shared_per_block = 48 * 1024;     ///< without the opt-in attribute
    std::size_t shared_per_block_optin = 232448;  ///< sm_90: 227 KiB; sm_89: 101376 (99 KiB)
    unsigned max_threads_per_block = 1024;
    unsigned max_block_z = 64;
    unsigned max_grid_yz = 65535;
    static device_model sm90() { return {}; }
    static device_model sm89() {
        device_model d;
        d.shared_per_block_optin = 101376;
        return d;
    }
};

struct options {
    on_report mode = on_report::raise;
    device_model device{};
    /// cudaFuncAttributeMaxDynamicSharedMemorySize as the host code would set it; 0: not opted in, so
    /// static + dynamic shared memory must fit in device.shared_per_block.
    std::size_t max_dynamic_shared = 0;
    std::size_t stack_bytes = 256 * 1024;  ///< per fiber (virtual; pages are touched as used)
    bool check_races = true;
    bool check_uninitialized = true;
    std::size_t max_reports = 64;  ///< collect mode keeps this many (dropped_reports counts the rest)
    /// Blocks run on this many host threads (each with its own fibers and shared window); global
    /// memory is shared as on the device, so blocks that race on it without atomics race here too.
    unsigned host_threads = 1;
    std::size_t max_spins = std::size_t{1} << 20;  ///< yields per thread and block before a deadlock report
};

struct launch_config {
    dim3 grid, block;
    std::size_t dynamic_shared = 0;  ///< bytes, the <<<grid, block, bytes>>> argument
    /// Blocks per thread block cluster (cudaLaunchAttributeClusterDimension); the grid is a whole
    /// number of clusters. A cluster's blocks run together, as one unit of the launch, each with its
    /// own shared window (their blocks need a multiple of 128 threads here).
    dim3 cluster{1, 1, 1};
};

struct run_result {
    std::vector<report> reports;
    std::size_t dropped_reports = 0;
    std::size_t static_shared = 0;  ///< bytes of static shared memory the kernel declared
    unsigned long long context_switches = 0;
    bool clean() const { return reports.empty() && dropped_reports == 0; }
};

template <class T>
class sptr;
template <class T>
class sref;

/// Runs kernel(args...) for every thread of every block of cfg. `name` appears in reports.
template <class Kernel, class... Args>
run_result launch(const char* name, const launch_config& cfg, const options& opt, Kernel&& kernel, Args&&... args);
template <class Kernel, class... Args, std::enable_if_t<!std::is_same<std::decay_t<Kernel>, options>::value, int> = 0>
run_result launch(const char* name, const launch_config& cfg, Kernel&& kernel, Args&&... args) {
    return launch(name, cfg, options{}, std::forward<Kernel>(kernel), std::forward<Args>(args)...);
}

// The running fiber's coordinates (throw interpret::error outside an interpreted launch).
inline const dim3& thread_idx();
inline const dim3& block_idx();
inline const dim3& block_dim();
inline const dim3& grid_dim();
inline unsigned lane_id();  ///< linear thread id % 32
inline unsigned warp_id();  ///< linear thread id / 32

/// __syncthreads: bar.sync 0 for all threads of the block; all must reach it at the same call site.
inline void syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE());
/// __syncthreads_count (bar.red.popc 0): __syncthreads that returns how many threads passed pred true;
/// __syncthreads_and / _or compare it with the block's size and with 0.
inline int syncthreads_count(bool pred, const char* file = __builtin_FILE(), int line = __builtin_LINE());
/// bar.sync id, count (count 0: all threads of the block); count is a multiple of 32. Arrivals are
/// counted per thread (the hardware counts whole warps: the two agree when warps arrive converged).
inline void bar_sync(unsigned id, unsigned count = 0, const char* file = __builtin_FILE(), int line = __builtin_LINE());
/// bar.arrive id, count: counts toward the barrier's completion (and releases this thread's
/// writes to its waiters) without waiting.
inline void bar_arrive(unsigned id, unsigned count, const char* file = __builtin_FILE(), int line = __builtin_LINE());
/// trap: ends the block with a report (stopping it) naming the call site.
[[noreturn]] inline void trap(const char* file = __builtin_FILE(), int line = __builtin_LINE());
/// Lets the other fibers run (for spin loops on memory, nanosleep). A thread that yields more than
/// options::max_spins times in one block is reported as a deadlock.
inline void yield(const char* file = __builtin_FILE(), int line = __builtin_LINE());

/// shfl.sync modes; c packs the clamp value (bits 0-4) and the segment mask (bits 8-12), as in PTX.
enum class shfl_mode { idx, up, down, bfly };
struct shfl_result {
    std::uint32_t value;
    bool in_range;  ///< PTX's predicate p: the source lane was inside the clamp/segment
};
inline shfl_result shfl_sync(shfl_mode mode, std::uint32_t a, std::uint32_t b, std::uint32_t c,
                             std::uint32_t membermask, const char* file = __builtin_FILE(),
                             int line = __builtin_LINE());
inline bool vote_all_sync(std::uint32_t membermask, bool p, const char* file = __builtin_FILE(),
                          int line = __builtin_LINE());
inline bool vote_any_sync(std::uint32_t membermask, bool p, const char* file = __builtin_FILE(),
                          int line = __builtin_LINE());
inline std::uint32_t vote_ballot_sync(std::uint32_t membermask, bool p, const char* file = __builtin_FILE(),
                                      int line = __builtin_LINE());
/// match.sync.any.b32/b64: the lanes of membermask whose value equals this lane's.
inline std::uint32_t match_any_sync(std::uint32_t membermask, std::uint64_t value, const char* file = __builtin_FILE(),
                                    int line = __builtin_LINE());
/// match.sync.all: membermask if all lanes of it hold the same value (pred true), else 0 (pred false).
inline std::uint32_t match_all_sync(std::uint32_t membermask, std::uint64_t value, bool* pred,
                                    const char* file = __builtin_FILE(), int line = __builtin_LINE());
/// bar.warp.sync (__syncwarp): a barrier among the lanes of membermask that orders their memory.
inline void syncwarp(std::uint32_t membermask = 0xFFFFFFFFu, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE());
/// The building block of an instruction model (ldmatrix, mma.sync, ...): a warp collective over
/// membermask in which every lane deposits its operands `mine`; when the last lane arrives, it calls
/// compute(ins, outs) with ins[l] (const In*) and outs[l] (Out*) for every lane l of the mask (null
/// for the others), and each lane returns its outs[l]. Lanes that reach different instructions
/// (by name) or masks are a warp_sync report, as for shfl. A model that reads shared memory has each
/// lane read its own operands (through sptr, so the reads are checked and attributed to that lane)
/// before the exchange.
template <class In, class Out, class F>
Out warp_exchange(const char* instruction, std::uint32_t membermask, const In& mine, F compute,
                  const char* file = __builtin_FILE(), int line = __builtin_LINE());
/// warp_exchange over a warpgroup (the 128 threads 128 g .. 128 g + 127 of the block, g = linear id
/// / 128), for the .sync.aligned warpgroup instructions (wgmma): every thread deposits `mine`, the last
/// to arrive calls compute(ins, outs) with ins[t], outs[t] for t = 0..127 (index within the warpgroup).
/// A warpgroup that the block does not fill, or threads that reach a different instruction (by
/// name), are warp_sync reports. It does not order memory.
template <class In, class Out, class F>
Out warpgroup_exchange(const char* instruction, const In& mine, F compute, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE());
/// For models: reports `kind` for the running thread (raised, or kept in collect mode; stops_block
/// ends the block there).
inline void model_report(check kind, std::string address, std::string detail, bool stops_block);
/// The lanes of this warp that have not exited.
inline std::uint32_t activemask();

/// Host memory for a kernel's global operands whose last byte sits against an inaccessible page (the
/// start rounded down to 16 bytes, so up to 15 bytes past the end go unnoticed; a page before the
/// start is inaccessible too). An access beyond it during a launch is an out_of_bounds report naming
/// the buffer and the byte offset; the faulting thread is ended there (not unwound). Create buffers
/// before the launches that use them. Elements are not initialised.
template <class T>
class guarded_buffer {
    static_assert(std::is_trivially_copyable<T>::value, "guarded buffers hold trivially copyable elements");

public:
    explicit guarded_buffer(std::size_t n, std::string name = "global buffer");
    ~guarded_buffer();
    guarded_buffer(const guarded_buffer&) = delete;
    guarded_buffer& operator=(const guarded_buffer&) = delete;
    T* data() { return data_; }
    const T* data() const { return data_; }
    std::size_t size() const { return size_; }
    T& operator[](std::size_t i) { return data_[i]; }
    const T& operator[](std::size_t i) const { return data_[i]; }
    T* begin() { return data_; }
    T* end() { return data_ + size_; }

private:
    std::uint8_t* map_ = nullptr;
    std::size_t map_bytes_ = 0, size_ = 0;
    T* data_ = nullptr;
};

// ---- block-shared memory ---------------------------------------------------------------------------

namespace detail {
enum class access { read, write, atomic };
/// Checks (and records) an access of `bytes` bytes at p of shared region `region`; false when it is
/// out of bounds (the caller then reads zero or drops the write).
inline bool shared_access(const std::uint8_t* p, std::size_t bytes, access kind, int region);
inline std::uint8_t* static_shared_alloc(const void* tag, const char* name, std::size_t bytes, std::size_t align,
                                         int* region);
inline std::uint8_t* dynamic_shared_base(int* region);
inline std::uint8_t* shared_window(std::size_t* bytes);
/// One cp.async in flight (octet/interpret/ptx_models.hpp): its source bytes, read when it was issued
/// and zero-filled to its size, wait to be written at `dst` (a shared address) by the wait that
/// completes its group.
struct async_copy {
    std::uint32_t dst = 0, bytes = 0;
    std::uint8_t data[16] = {};
};
/// The running thread's cp.async state: copies issued since its last commit_group, and its committed
/// groups, oldest first (a group may be empty).
struct async_copies {
    std::vector<async_copy> uncommitted;
    std::vector<std::vector<async_copy>> groups;
    bool empty() const { return uncommitted.empty() && groups.empty(); }
};
inline async_copies& thread_async_copies();
/// An instruction model's report about the running thread: check::ptx_misuse at shared
/// address `shared` (or none when negative), which ends the block as a fault would on the device.
inline void ptx_misuse(long long shared, const std::string& detail);
/// The shared variable (region) holding shared address `address`, or -1 (then only the window bounds
/// apply): for models, whose operands are 32-bit addresses that carry no variable.
inline int shared_region_at(std::uint32_t address);
template <class T>
using element_ref = std::conditional_t<std::is_array<T>::value, sptr<std::remove_extent_t<T>>, sref<T>>;
template <class T>
element_ref<T> make_ref(std::uint8_t* p, int region) {
    return element_ref<T>(p, region);
}
}  // namespace detail

/// A checked lvalue in shared memory: reading converts to T, assigning writes, both through the checks.
template <class T>
class sref {
    static_assert(std::is_trivially_copyable<T>::value, "shared memory holds trivially copyable types");

public:
    sref(std::uint8_t* p, int region) : p_(p), region_(region) {}
    sref(const sref&) = default;
    std::remove_cv_t<T> load() const {
        std::remove_cv_t<T> v{};
        if (detail::shared_access(p_, sizeof(T), detail::access::read, region_)) std::memcpy(&v, p_, sizeof(T));
        return v;
    }
    void store(const T& v) const {
        if (detail::shared_access(p_, sizeof(T), detail::access::write, region_)) std::memcpy(p_, &v, sizeof(T));
    }
    operator T() const { return load(); }
    const sref& operator=(const T& v) const {
        store(v);
        return *this;
    }
    const sref& operator=(const sref& o) const {
        store(o.load());
        return *this;
    }
    sref& operator=(const sref& o) {
        store(o.load());
        return *this;
    }
    template <class U>
    const sref& operator+=(const U& u) const {
        return *this = static_cast<T>(load() + u);
    }
    template <class U>
    const sref& operator-=(const U& u) const {
        return *this = static_cast<T>(load() - u);
    }
    template <class U>
    const sref& operator*=(const U& u) const {
        return *this = static_cast<T>(load() * u);
    }
    template <class U>
    const sref& operator/=(const U& u) const {
        return *this = static_cast<T>(load() / u);
    }
    template <class U>
    const sref& operator|=(const U& u) const {
        return *this = static_cast<T>(load() | u);
    }
    template <class U>
    const sref& operator&=(const U& u) const {
        return *this = static_cast<T>(load() & u);
    }
    template <class U>
    const sref& operator^=(const U& u) const {
        return *this = static_cast<T>(load() ^ u);
    }
    const sref& operator++() const { return *this += 1; }
    const sref& operator--() const { return *this -= 1; }
    T operator++(int) const {
        T v = load();
        store(static_cast<T>(v + 1));
        return v;
    }
    T operator--(int) const {
        T v = load();
        store(static_cast<T>(v - 1));
        return v;
    }
    sptr<T> operator&() const { return sptr<T>(p_, region_); }
    std::uint8_t* bytes() const { return p_; }
    int region() const { return region_; }

private:
    std::uint8_t* p_;
    int region_;
};

/// A checked pointer into shared memory: arithmetic as T*, dereference yields sref<T> (or, for an
/// array T, the decayed sptr of its element type). `region` is the variable it was derived from.
template <class T>
class sptr {
public:
    using element_type = T;
    sptr() = default;
    sptr(std::uint8_t* p, int region) : p_(p), region_(region) {}
    template <class U,
              std::enable_if_t<std::is_same<std::remove_const_t<T>, U>::value && !std::is_same<T, U>::value, int> = 0>
    sptr(const sptr<U>& o) : p_(o.bytes()), region_(o.region()) {}  // NOLINT: T* -> const T*

    template <class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>
    detail::element_ref<T> operator[](I i) const {
        return detail::make_ref<T>(at(static_cast<std::ptrdiff_t>(i)), region_);
    }
    detail::element_ref<T> operator*() const { return detail::make_ref<T>(p_, region_); }
    template <class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>
    sptr operator+(I i) const {
        return sptr(at(static_cast<std::ptrdiff_t>(i)), region_);
    }
    template <class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>
    sptr operator-(I i) const {
        return sptr(at(-static_cast<std::ptrdiff_t>(i)), region_);
    }
    std::ptrdiff_t operator-(const sptr& o) const { return (p_ - o.p_) / static_cast<std::ptrdiff_t>(sizeof(T)); }
    template <class I>
    sptr& operator+=(I i) {
        p_ = at(static_cast<std::ptrdiff_t>(i));
        return *this;
    }
    template <class I>
    sptr& operator-=(I i) {
        p_ = at(-static_cast<std::ptrdiff_t>(i));
        return *this;
    }
    sptr& operator++() { return *this += 1; }
    sptr& operator--() { return *this -= 1; }
    sptr operator++(int) {
        sptr o = *this;
        ++*this;
        return o;
    }
    bool operator==(const sptr& o) const { return p_ == o.p_; }
    bool operator!=(const sptr& o) const { return p_ != o.p_; }
    bool operator<(const sptr& o) const { return p_ < o.p_; }
    explicit operator bool() const { return p_ != nullptr; }
    /// The host address, unchecked: for models that check their accesses themselves.
    T* raw() const { return reinterpret_cast<T*>(p_); }
    std::uint8_t* bytes() const { return p_; }
    int region() const { return region_; }

private:
    // Pointer arithmetic through integers: an sptr may point anywhere (the access is what is checked).
    std::uint8_t* at(std::ptrdiff_t i) const {
        return reinterpret_cast<std::uint8_t*>(reinterpret_cast<std::uintptr_t>(p_) +
                                               static_cast<std::uintptr_t>(i * static_cast<std::ptrdiff_t>(sizeof(T))));
    }
    std::uint8_t* p_ = nullptr;
    int region_ = -1;
};

/// reinterpret_cast for shared pointers (the region, hence the bounds, is kept).
template <class U, class T>
sptr<U> shared_cast(const sptr<T>& p) {
    return sptr<U>(p.bytes(), p.region());
}
/// &p->*member as a shared pointer.
template <class M, class S>
sptr<M> member(const sptr<S>& p, M S::*m) {
    alignas(S) static unsigned char storage[sizeof(S)];  // offsetof for a member pointer: only addresses
    const S* base = reinterpret_cast<const S*>(storage);
    const auto offset = reinterpret_cast<const unsigned char*>(&(base->*m)) - storage;
    return sptr<M>(p.bytes() + offset, p.region());
}
/// The 32-bit shared-window address of p (what cvta.to.shared gives a kernel) and back.
template <class T>
std::uint32_t shared_address(const sptr<T>& p) {
    std::size_t n = 0;
    return static_cast<std::uint32_t>(p.bytes() - detail::shared_window(&n));
}
template <class T>
sptr<T> shared_at(std::uint32_t address) {
    std::size_t n = 0;
    return sptr<T>(detail::shared_window(&n) + address, -1);
}

/// A static __shared__ variable of type T (an array type gives the decayed element pointer, a
/// scalar an sref), allocated in the block's window the first time a thread of the block reaches
/// the declaration; `tag` identifies the declaration (the address of a static object).
template <class T>
detail::element_ref<T> static_shared(const void* tag, const char* name, std::size_t align = alignof(T)) {
    int region = -1;
    std::uint8_t* p = detail::static_shared_alloc(tag, name, sizeof(T), align, &region);
    if constexpr (std::is_array<T>::value)
        return sptr<std::remove_extent_t<T>>(p, region);
    else
        return sref<T>(p, region);
}
/// The extern __shared__ T name[] of the launch (its bytes: launch_config::dynamic_shared), aligned
/// to 1024 bytes.
template <class T>
sptr<T> dynamic_shared() {
    int region = -1;
    std::uint8_t* p = detail::dynamic_shared_base(&region);
    return sptr<T>(p, region);
}

// ---- atomics ---------------------------------------------------------------------------------------

namespace detail {
/// Atomic read-modify-write on host memory: *p = f(*p), returning the old value.
template <class T, class F>
T atomic_rmw(T* p, F f) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomics act on 4- and 8-byte values");
    using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    U* q = reinterpret_cast<U*>(p);
    U expected = __atomic_load_n(q, __ATOMIC_RELAXED);
    while (true) {
        T old;
        std::memcpy(&old, &expected, sizeof(T));
        const T next = f(old);
        U desired;
        std::memcpy(&desired, &next, sizeof(T));
        if (__atomic_compare_exchange_n(q, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return old;
    }
}
template <class T, class F>
T atomic_rmw(const sptr<T>& p, F f) {
    T old{};
    if (!shared_access(p.bytes(), sizeof(T), access::atomic, p.region())) return old;
    std::memcpy(&old, p.bytes(), sizeof(T));
    const T next = f(old);
    std::memcpy(p.bytes(), &next, sizeof(T));
    return old;
}
}  // namespace detail

// The CUDA atomics' meanings (all return the old value); P is T* (global) or sptr<T> (shared).
template <class P, class T>
auto atomic_add(P p, T v) {
    return detail::atomic_rmw(p, [v](auto old) { return static_cast<decltype(old)>(old + v); });
}
template <class P, class T>
auto atomic_sub(P p, T v) {
    return detail::atomic_rmw(p, [v](auto old) { return static_cast<decltype(old)>(old - v); });
}
template <class P, class T>
auto atomic_max(P p, T v) {
    return detail::atomic_rmw(p, [v](auto old) { return old < v ? static_cast<decltype(old)>(v) : old; });
}
template <class P, class T>
auto atomic_min(P p, T v) {
    return detail::atomic_rmw(p, [v](auto old) { return v < old ? static_cast<decltype(old)>(v) : old; });
}
template <class P, class T>
auto atomic_exch(P p, T v) {
    return detail::atomic_rmw(p, [v](auto) { return v; });
}
template <class P, class T>
auto atomic_cas(P p, T compare, T v) {
    return detail::atomic_rmw(p, [compare, v](auto old) { return old == compare ? v : old; });
}
template <class P, class T>
auto atomic_and(P p, T v) {
    return detail::atomic_rmw(p, [v](auto old) { return static_cast<decltype(old)>(old & v); });
}
template <class P, class T>
auto atomic_or(P p, T v) {
    return detail::atomic_rmw(p, [v](auto old) { return static_cast<decltype(old)>(old | v); });
}
template <class P, class T>
auto atomic_xor(P p, T v) {
    return detail::atomic_rmw(p, [v](auto old) { return static_cast<decltype(old)>(old ^ v); });
}

}  // namespace interpret
}  // namespace octet

#include "octet/interpret/detail/machine.inl"
