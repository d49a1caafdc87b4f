// octet/interpret/detail/machine.inl: the interpreter's machinery (fibers, scheduler, barriers, warp
// collectives, shared-memory shadow state). Included by octet/interpret/interpret.hpp only.
#pragma once

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>

#if defined(__SANITIZE_ADDRESS__)
#define OCTET_INTERPRET_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OCTET_INTERPRET_ASAN 1
#endif
#endif
#if defined(OCTET_INTERPRET_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace octet {
namespace interpret {
namespace detail {

struct fiber_abort {};  // unwinds a fiber whose block is abandoned
struct block_abort {};  // collect mode: a report stopped the block

struct epoch {
    std::uint32_t clock = 0;  // 0: no access (happens before everything)
    std::uint32_t tid = 0;
};
struct shadow {
    epoch w, r, a;  // last plain write, last read (unless read_shared), last atomic
    bool init = false, read_shared = false, uninit_reported = false;
    bool async_w = false;       // the last plain write was the async proxy's (a TMA load), needing no proxy fence
    std::uint32_t readers = 0;  // read_shared: its index in machine::read_sets
};
struct region {
    std::string name;
    std::size_t begin = 0, size = 0;
};
struct site {
    const char* file = "";
    int line = 0;
};
inline std::string to_string(const site& s) {
    return std::string(s.file) + ":" + std::to_string(s.line);
}
inline std::string hex(std::uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
    return b;
}
/// "0-63, 70, 96-127"
inline std::string id_ranges(const std::vector<unsigned>& ids) {
    std::string s;
    for (std::size_t i = 0; i < ids.size();) {
        std::size_t j = i;
        while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
        if (!s.empty()) s += ", ";
        s += std::to_string(ids[i]);
        if (j > i) s += "-" + std::to_string(ids[j]);
        i = j + 1;
    }
    return s;
}
inline std::vector<unsigned> lanes_of(std::uint32_t mask) {
    std::vector<unsigned> v;
    for (unsigned l = 0; l < 32; ++l)
        if (mask >> l & 1u) v.push_back(l);
    return v;
}

enum class warp_kind {
    shfl_idx,
    shfl_up,
    shfl_down,
    shfl_bfly,
    vote_all,
    vote_any,
    vote_ballot,
    match_any,
    match_all,
    syncwarp,
    custom  // a modelled instruction (warp_exchange), named by its tag
};
inline const char* name_of(warp_kind k) {
    switch (k) {
        case warp_kind::shfl_idx:
            return "shfl.sync.idx";
        case warp_kind::shfl_up:
            return "shfl.sync.up";
        case warp_kind::shfl_down:
            return "shfl.sync.down";
        case warp_kind::shfl_bfly:
            return "shfl.sync.bfly";
        case warp_kind::vote_all:
            return "vote.sync.all";
        case warp_kind::vote_any:
            return "vote.sync.any";
        case warp_kind::vote_ballot:
            return "vote.sync.ballot";
        case warp_kind::match_any:
            return "match.sync.any";
        case warp_kind::match_all:
            return "match.sync.all";
        case warp_kind::syncwarp:
            return "bar.warp.sync";
        case warp_kind::custom:
            return "warp collective";
    }
    return "?";
}
using exchange_fn = std::function<void(const void* const*, void* const*)>;

// ---- context switching ---------------------------------------------------------------------------
// On x86-64 a fiber switch is a dozen instructions (callee-saved registers, MXCSR and the x87 control
// word, as the System V ABI has the callee keep them); elsewhere, or with OCTET_INTERPRET_UCONTEXT,
// swapcontext, which also saves the signal mask with two system calls (about 4x slower).
//
// Under AddressSanitizer every switch is announced to it (__sanitizer_start/finish_switch_fiber), so
// that it knows which stack is current (exceptions thrown in a fiber unpoison the right stack) and
// keeps a fake stack per fiber (detect_stack_use_after_return); a context that is left for good
// (exit_context) frees its fake stack. A stack's shadow is cleared before it is reused or unmapped:
// a fiber ended by a fault, or dropped, leaves its frames' redzones behind. Without ASan none of
// this is compiled.
#if defined(OCTET_INTERPRET_ASAN)
/// ASan's view of a context: the fake stack it keeps while switched out, and the bounds of its stack
/// (a fiber's from make_context; the scheduler's learned when a fiber first runs, context_entered).
struct asan_stack {
    void* fake = nullptr;
    const void* bottom = nullptr;
    std::size_t size = 0;
};
#endif
/// Clears the shadow of a stack about to be reused or unmapped (nothing without ASan).
inline void forget_stack(void* stack, std::size_t bytes) {
#if defined(OCTET_INTERPRET_ASAN)
    __asan_unpoison_memory_region(stack, bytes);
#else
    (void)stack;
    (void)bytes;
#endif
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(OCTET_INTERPRET_UCONTEXT)
#define OCTET_INTERPRET_X86_SWITCH 1
/// Saves this context's registers on its stack, stores the stack pointer in *from, and continues on
/// the stack `to` (where a previous switch, or make_context, left the same layout).
__attribute__((naked, noinline)) inline void x86_switch(void** /*from: rdi*/, void* /*to: rsi*/) {
    __asm__(
        "pushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n\t"
        "subq $8, %rsp\n\tstmxcsr (%rsp)\n\tfnstcw 4(%rsp)\n\t"
        "movq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n\t"
        "ldmxcsr (%rsp)\n\tfldcw 4(%rsp)\n\taddq $8, %rsp\n\t"
        "popq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\tret\n");
}
struct context {
    void* sp = nullptr;
#if defined(OCTET_INTERPRET_ASAN)
    asan_stack asan;
#endif
};
/// A context that starts entry() on the given stack; entry must never return.
inline void make_context(context& c, std::uint8_t* stack, std::size_t bytes, void (*entry)()) {
    forget_stack(stack, bytes);
#if defined(OCTET_INTERPRET_ASAN)
    c.asan = asan_stack{nullptr, stack, bytes};
#endif
    const std::uintptr_t top = (reinterpret_cast<std::uintptr_t>(stack) + bytes) & ~std::uintptr_t{15};
    void** a = reinterpret_cast<void**>(top - 16);  // entry starts with rsp = a + 1, 8 mod 16 as after a call
    a[0] = reinterpret_cast<void*>(entry);
    a[1] = nullptr;     // entry's return address: none (it also ends the unwinder's walk)
    void** sp = a - 7;  // control word slot, r15, r14, r13, r12, rbx, rbp
    for (int i = 0; i < 7; ++i) sp[i] = nullptr;
    std::uint32_t mxcsr = 0;
    std::uint16_t fcw = 0;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fcw));
    std::memcpy(reinterpret_cast<std::uint8_t*>(sp), &mxcsr, 4);
    std::memcpy(reinterpret_cast<std::uint8_t*>(sp) + 4, &fcw, 2);
    c.sp = sp;
}
inline void raw_switch(context& from, context& to) {
    x86_switch(&from.sp, to.sp);
}
#else
struct context {
    ucontext_t uc{};  // zeroed: ASan's swapcontext reads uc_stack of the context it switches to
#if defined(OCTET_INTERPRET_ASAN)
    asan_stack asan;
#endif
};
inline void make_context(context& c, std::uint8_t* stack, std::size_t bytes, void (*entry)()) {
    forget_stack(stack, bytes);
#if defined(OCTET_INTERPRET_ASAN)
    c.asan = asan_stack{nullptr, stack, bytes};
#endif
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = bytes;
    c.uc.uc_link = nullptr;  // entry never returns
    makecontext(&c.uc, entry, 0);
}
inline void raw_switch(context& from, context& to) {
    swapcontext(&from.uc, &to.uc);
}
#endif
/// Continues `to`; returns when another context switches back to `from`.
inline void switch_context(context& from, context& to) {
#if defined(OCTET_INTERPRET_ASAN)
    __sanitizer_start_switch_fiber(&from.asan.fake, to.asan.bottom, to.asan.size);
    raw_switch(from, to);
    __sanitizer_finish_switch_fiber(from.asan.fake, nullptr, nullptr);
#else
    raw_switch(from, to);
#endif
}
/// Continues `to` and leaves `from` for good: it is never resumed (under ASan its fake stack is freed).
inline void exit_context(context& from, context& to) {
#if defined(OCTET_INTERPRET_ASAN)
    __sanitizer_start_switch_fiber(nullptr, to.asan.bottom, to.asan.size);
#endif
    raw_switch(from, to);
}
/// The first thing a context made by make_context does: `from` is the context that switched to it
/// (under ASan, this learns the bounds of from's stack).
inline void context_entered(context& from) {
#if defined(OCTET_INTERPRET_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, &from.asan.bottom, &from.asan.size);
#else
    (void)from;
#endif
}

/// A thread's in-flight wgmma.mma_async results (the model in octet/interpret/ptx_models.hpp): the
/// accumulator registers they land in at wgmma.wait_group, and the wgmma-group they belong to.
struct wgmma_inflight {
    float* d = nullptr;  // the accumulator registers (the caller's array), poisoned until the wait
    unsigned n = 0;
    std::uint32_t group = 0;  // index of the wgmma-group (commit_group count when it was issued)
    std::vector<float> value;
    site at;
};
struct wgmma_thread {
    bool fenced = false;       // wgmma.fence since this thread last took its registers back (wait_group)
    std::uint32_t groups = 0;  // wgmma.commit_group executed so far
    std::vector<wgmma_inflight> inflight;
};

/// One TMA store in flight (cp.async.bulk.tensor shared -> global, ptx_models.hpp): its tensor map's
/// bytes, box coordinates and shared source; it reads the source and writes global memory at the
/// cp.async.bulk.wait_group.read that completes its bulk group.
struct bulk_store {
    std::uint8_t map[128] = {};
    std::int32_t c0 = 0, c1 = 0;
    std::uint32_t src = 0;
    site at;
};
/// The running thread's bulk stores: those since its last cp.async.bulk.commit_group, and its
/// committed groups, oldest first.
struct bulk_stores {
    std::vector<bulk_store> uncommitted;
    std::vector<std::vector<bulk_store>> groups;
    bool empty() const { return uncommitted.empty() && groups.empty(); }
};

struct fiber {
    context ctx;
    std::uint8_t* mapping = nullptr;  // guard page, then the stack
    unsigned tid = 0;
    dim3 idx;
    bool started = false, done = false, ready = false, abort = false;
    std::vector<std::uint32_t> vc;  // vector clock over the block's threads
    std::exception_ptr error;
    enum class wait { none, barrier, warp, mbarrier, cluster } waiting = wait::none;
    unsigned bar_id = 0;
    std::size_t mbar = 0;           // wait::mbarrier: its offset in the cluster's window (machine::resolve)
    std::uint32_t mbar_parity = 0;  // and the awaited parity
    // barrier.cluster: the phase of the thread's last arrival, and whether its wait is still to come
    std::uint64_t cluster_phase = 0;
    bool cluster_arrived = false;
    site at;
    site last_sync;            // the barrier or warp collective this thread passed last (for reports)
    std::uintptr_t fault = 0;  // the address of a fault that ended this fiber
    std::size_t spins = 0;     // yields in this block
    std::uint32_t wvalue = 0;  // a warp collective's result for this lane
    bool wpred = false;
    wgmma_thread wgmma;   // model state of the warpgroup MMA (ptx_models.hpp)
    async_copies copies;  // cp.async in flight
    bulk_stores stores;   // TMA stores in flight
};

struct barrier_state {
    unsigned expected = 0, arrived = 0, popc = 0;
    bool all = false;  // the phase began with __syncthreads
    std::vector<unsigned> waiters, arrivals;
    std::vector<site> sites;  // per arrival
    std::vector<std::uint32_t> vc;
    /// A new phase; the vectors keep their capacity (barriers are the interpreter's hot path).
    void reset() {
        expected = arrived = popc = 0;
        all = false;
        waiters.clear();
        arrivals.clear();
        sites.clear();
        vc.clear();
    }
};

/// An mbarrier object (PTX ISA, mbarrier): the interpreter keeps its state beside the 8 shared bytes it
/// occupies (which init writes and every other operation touches atomically, so plain accesses that
/// race with it are reported).
/// barrier.cluster: every thread of the cluster arrives (release), then waits (acquire) for the phase.
struct cluster_barrier_state {
    unsigned arrived = 0;
    std::uint64_t phase = 0;
    std::vector<std::uint32_t> vc, done_vc;  // the arrivals' release; the last completed phase's
    std::vector<unsigned> waiters;
    site first_at;  // the phase's first arrival (for reports)
};

struct mbarrier_state {
    std::uint32_t count = 0, pending = 0;   // expected arrivals per phase, arrivals still missing
    long long tx = 0;                       // transaction bytes expected minus completed, this phase
    std::uint64_t phase = 0;                // completed phases: the current phase's parity is phase & 1
    std::vector<std::uint32_t> vc;          // released by this phase's arrivals and completions
    std::vector<std::uint32_t> done_vc[2];  // what the last completed phase of each parity released
    site init_at;
    std::vector<unsigned> waiters;
};
/// One setmaxnreg of a warp: the k-th of each warp of a warpgroup must agree (warpgroup-collective).
struct maxnreg_op {
    std::uint32_t n = 0;
    bool inc = false;
    unsigned warps = 0;  // bit w: warp w of the warpgroup executed it
    site at;
};

struct warp_op {
    warp_kind kind = warp_kind::syncwarp;
    std::uint32_t mask = 0, arrived = 0;
    site at;
    std::uint32_t a[32] = {}, b[32] = {}, c[32] = {};
    std::uint64_t key[32] = {};
    const char* tag = nullptr;  // custom: the instruction's name
    const void* in[32] = {};    // custom: each lane's operands (on its blocked fiber's stack)
    void* out[32] = {};         // custom: each lane's results
};

/// A warpgroup collective in progress (warpgroup_exchange): the 128 threads 128 g .. 128 g + 127.
struct warpgroup_op {
    bool active = false;
    const char* tag = nullptr;
    site at;
    unsigned arrived = 0;
    std::vector<unsigned> who;  // arrival order (for reports)
    const void* in[128] = {};
    void* out[128] = {};
};

inline void join(std::vector<std::uint32_t>& into, const std::vector<std::uint32_t>& from) {
    for (std::size_t i = 0; i < into.size(); ++i) into[i] = std::max(into[i], from[i]);
}

// ---- guarded global buffers and the fault handler ------------------------------------------------
// A guarded_buffer's bytes end where an inaccessible page begins; an access past the end faults, and
// the SIGSEGV handler (installed while a launch runs) turns a fault inside a guard, or inside a fiber's
// stack guard page, into a report: it ends the faulting fiber (without unwinding it) and switches to
// the scheduler. Any other fault is passed on to the previous handler (the program crashes as usual).
struct guard_entry {
    std::uintptr_t map_begin = 0, map_end = 0, data_begin = 0;
    std::size_t bytes = 0;
    std::string name;
};
inline std::mutex& guard_mutex() {
    static std::mutex m;
    return m;
}
inline std::vector<guard_entry>& guard_registry() {
    static std::vector<guard_entry> v;
    return v;
}

struct machine;
inline thread_local machine* tl_machine = nullptr;
inline void on_fault(int sig, siginfo_t* info, void* uc);
/// Installs the handler (process-wide, counted) and an alternate signal stack (this thread) for the
/// life of a launch on this thread.
struct fault_scope {
    static std::mutex& mutex() {
        static std::mutex m;
        return m;
    }
    static int& users() {
        static int n = 0;
        return n;
    }
    static struct sigaction& previous() {
        static struct sigaction p;
        return p;
    }
    std::vector<unsigned char> alt = std::vector<unsigned char>(64 * 1024);
    stack_t old_alt{};
    fault_scope() {
        stack_t st{};
        st.ss_sp = alt.data();
        st.ss_size = alt.size();
        sigaltstack(&st, &old_alt);
        std::lock_guard<std::mutex> lock(mutex());
        if (users()++ == 0) {
            struct sigaction sa {};
            sa.sa_sigaction = on_fault;
            sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;  // NODEFER: the handler never returns
            sigemptyset(&sa.sa_mask);
            sigaction(SIGSEGV, &sa, &previous());
        }
    }
    ~fault_scope() {
        {
            std::lock_guard<std::mutex> lock(mutex());
            if (--users() == 0) sigaction(SIGSEGV, &previous(), nullptr);
        }
        sigaltstack(&old_alt, nullptr);
    }
    fault_scope(const fault_scope&) = delete;
    fault_scope& operator=(const fault_scope&) = delete;
};
inline void fiber_entry();

/// Mappings a launch needs (fiber stacks with their guard page, the shared window), kept per host
/// thread for its next launch: mapping them anew cost system calls and a fresh zeroed page for
/// every page touched, most of a small launch's time. Nothing in them is state a launch sees: each
/// block starts with its stacks' contexts made anew and every shared byte uninitialised (shadow
/// state), as before. A nested launch, or the launches of other host threads, take other mappings.
/// Unmapped when the host thread ends (at most `keep` mappings are kept).
struct mapping_pool {
    struct entry {
        std::uint8_t* base;
        std::size_t bytes;
        bool guarded;  // its first page is the PROT_NONE guard of a stack
    };
    static constexpr std::size_t keep = 2048;
    std::vector<entry> free;
    mapping_pool() = default;
    mapping_pool(const mapping_pool&) = delete;
    mapping_pool& operator=(const mapping_pool&) = delete;
    ~mapping_pool() {
        for (const entry& e : free) unmap(e);
    }
    static void unmap(const entry& e) {
        forget_stack(e.base, e.bytes);  // under ASan: a stack's frames may have left redzones behind
        munmap(e.base, e.bytes);
    }
    /// A mapping of `bytes`, read-write, except its first page when `guard_page` is nonzero.
    std::uint8_t* take(std::size_t bytes, std::size_t guard_page) {
        for (std::size_t i = free.size(); i-- > 0;)
            if (free[i].bytes == bytes && free[i].guarded == (guard_page != 0)) {
                std::uint8_t* const m = free[i].base;
                free[i] = free.back();
                free.pop_back();
                return m;
            }
        void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) return nullptr;
        if (guard_page)
            mprotect(m, guard_page, PROT_NONE);  // a stack overflow faults instead of corrupting a neighbour
        return static_cast<std::uint8_t*>(m);
    }
    void give(std::uint8_t* base, std::size_t bytes, bool guarded) {
        const entry e{base, bytes, guarded};
        if (free.size() < keep) {
            forget_stack(base, bytes);
            free.push_back(e);
        } else {
            unmap(e);
        }
    }
};
inline mapping_pool& mappings() {
    static thread_local mapping_pool pool;
    return pool;
}

struct machine {
    std::string kernel;
    launch_config cfg;
    options opt;
    run_result result;
    std::function<void()> body;
    // A cluster of `ctas` blocks (launch_config::cluster; 1 without clusters) runs as one unit: thread
    // tid is thread tid % cta_threads of CTA (cluster rank) tid / cta_threads.
    unsigned nthreads = 0, cta_threads = 0, ctas = 1;
    std::vector<dim3> blocks;         // blockIdx of each CTA of the running cluster
    std::vector<unsigned> cta_exits;  // per CTA: its threads that returned from the kernel
    std::unique_ptr<fiber[]> fibers;
    context sched;
    fiber* current = nullptr;
    std::size_t page = 4096, stack_bytes = 0;
    // Each CTA's shared window, window_bytes apart: dynamic shared memory at offset 0, static variables
    // after it (the same layout in every CTA). Shared addresses are CTA-relative, as on the device
    // (a wgmma descriptor holds 18 bits of one); resolve() maps them, and mapa's cluster addresses,
    // to offsets from `window`.
    std::uint8_t* window = nullptr;
    std::size_t window_bytes = 0, static_begin = 0, static_end = 0, touched_end = 0;
    std::vector<region> regions;  // [0]: the dynamic region
    std::unordered_map<const void*, int> static_regions;
    // per byte of the windows below touched_end (what a block can access), indexed by offset from window
    std::vector<shadow> shadows;
    // The unordered reads of each read-shared byte (shadow::readers), and the unused read sets.
    std::vector<std::vector<epoch>> read_sets;
    std::vector<std::uint32_t> free_read_sets;
    std::vector<barrier_state> bars;                        // 16 per CTA
    cluster_barrier_state cluster_bar;                      // barrier.cluster
    std::vector<std::vector<warp_op>> warp_ops;             // pending collectives per warp
    std::unordered_map<std::size_t, mbarrier_state> mbars;  // by offset from window (resolve)
    std::vector<std::vector<maxnreg_op>> maxnreg;           // per warpgroup, in program order
    std::vector<unsigned> maxnreg_count;                    // per warp: setmaxnreg executed so far
    std::vector<std::uint32_t> proxy_fenced;                // per thread: its clock at its last fence.proxy.async
    std::vector<warpgroup_op> warpgroup_ops;                // the pending collective per warpgroup
    bool block_aborted = false;

    machine(const char* name, const launch_config& c, const options& o) : kernel(name), cfg(c), opt(o) {}
    machine(const machine&) = delete;
    machine& operator=(const machine&) = delete;
    ~machine() {
        mapping_pool& pool = mappings();
        if (fibers)
            for (unsigned t = 0; t < nthreads; ++t)
                if (fibers[t].mapping) pool.give(fibers[t].mapping, page + stack_bytes, true);
        if (window) pool.give(window, window_bytes * ctas, false);
    }

    /// threadIdx of thread tid (of any CTA of the cluster)
    dim3 coords(unsigned tid) const {
        const unsigned bx = cfg.block.x, by = cfg.block.y, t = tid % cta_threads;
        return dim3(t % bx, (t / bx) % by, t / (bx * by));
    }
    unsigned cta_of(unsigned tid) const { return tid / cta_threads; }
    std::uint8_t* cta_window(unsigned rank) const { return window + rank * window_bytes; }
    /// The running thread's CTA's window.
    std::uint8_t* own_window() const { return cta_window(cta_of(current->tid)); }
    std::string thread_name(unsigned tid) const {
        const dim3 c = coords(tid);
        std::string s = "thread (" + std::to_string(c.x) + "," + std::to_string(c.y) + "," + std::to_string(c.z) + ")";
        if (ctas > 1) s += " of cluster rank " + std::to_string(cta_of(tid));
        return s;
    }
    /// The offset from `window` of shared address `addr`: a shared::cta address is the running thread's
    /// CTA's; a shared::cluster address (mapa: cluster_address) names its CTA.
    std::size_t resolve(std::uint32_t addr) {
        const std::uint32_t tag = addr >> cluster_address_shift;
        const unsigned rank = tag ? tag - 1 : cta_of(current->tid);
        if (rank >= ctas)
            emit(make(check::ptx_misuse, current->tid, hex(addr),
                      "shared::cluster address " + hex(addr) + " names cluster rank " + std::to_string(rank) +
                          ", but the cluster has " + std::to_string(ctas) + " CTAs"),
                 true);
        if (cta_exits[rank] == cta_threads)  // its shared memory is gone (a cluster barrier before exiting)
            emit(make(check::ptx_misuse, current->tid, hex(addr),
                      "shared::cluster address " + hex(addr) + " lies in the CTA of cluster rank " +
                          std::to_string(rank) + ", whose threads have all exited"),
                 true);
        return rank * window_bytes + (addr & ((1u << cluster_address_shift) - 1));
    }
    /// mapa.shared::cluster: the cluster address of shared::cta address `addr` in the CTA of `rank`.
    static constexpr unsigned cluster_address_shift = 24;
    static std::uint32_t cluster_address(std::uint32_t addr, unsigned rank) {
        return (rank + 1u) << cluster_address_shift | addr;
    }
    report make(check k, unsigned tid, std::string address, std::string detail) const {
        report r;
        r.kind = k;
        r.kernel = kernel;
        r.block = blocks[cta_of(tid)];
        r.thread = coords(tid);
        r.address = std::move(address);
        r.detail = std::move(detail);
        return r;
    }
    void keep(report r) {
        if (result.reports.size() < opt.max_reports)
            result.reports.push_back(std::move(r));
        else
            ++result.dropped_reports;
    }
    /// From a fiber: raise, or keep (and end the block when the report stops it).
    void emit(report r, bool stops_block) {
        if (opt.mode == on_report::raise) throw failure(std::move(r));
        keep(std::move(r));
        if (stops_block) throw block_abort{};
    }

    // ---- scheduling ------------------------------------------------------------------------------

    void resume(fiber& f) {
        current = &f;
        f.started = true;
        switch_context(sched, f.ctx);
        current = nullptr;
        ++result.context_switches;
    }
    void block_wait(fiber& f) {
        f.ready = false;
        switch_context(f.ctx, sched);
        if (f.abort) throw fiber_abort{};
    }
    void abandon() {
        for (unsigned t = 0; t < nthreads; ++t) {
            fiber& f = fibers[t];
            if (f.done) continue;
            if (f.started) {
                f.abort = true;
                resume(f);
            }
            f.done = true;
        }
    }

    /// Runs the cluster of CTAs `b` (by cluster rank; one block without clusters).
    void run_cluster(const std::vector<dim3>& b) {
        blocks = b;
        cta_exits.assign(ctas, 0);
        block_aborted = false;
        for (unsigned c = 0; c < ctas; ++c) {
            const auto from = shadows.begin() + static_cast<std::ptrdiff_t>(c * window_bytes);
            std::fill(from, from + static_cast<std::ptrdiff_t>(touched_end), shadow{});
        }
        free_read_sets.clear();
        for (std::size_t i = read_sets.size(); i-- > 0;) {
            read_sets[i].clear();
            free_read_sets.push_back(static_cast<std::uint32_t>(i));
        }
        for (auto& B : bars) B.reset();
        cluster_bar = cluster_barrier_state{};
        for (auto& w : warp_ops) w.clear();
        mbars.clear();
        maxnreg.assign((nthreads + 127) / 128, {});
        maxnreg_count.assign((nthreads + 31) / 32, 0);
        proxy_fenced.assign(nthreads, 0);
        for (auto& w : warpgroup_ops) w = warpgroup_op{};
        for (unsigned t = 0; t < nthreads; ++t) {
            fiber& f = fibers[t];
            f.tid = t;
            f.idx = coords(t);
            f.started = f.done = f.abort = false;
            f.ready = true;
            f.error = nullptr;
            f.waiting = fiber::wait::none;
            f.last_sync = site{};
            f.fault = 0;
            f.spins = 0;
            f.wgmma = wgmma_thread{};
            f.copies = async_copies{};
            f.cluster_phase = 0;
            f.cluster_arrived = false;
            f.vc.assign(nthreads, 0);
            f.vc[t] = 1;
            make_context(f.ctx, f.mapping + page, stack_bytes, fiber_entry);
        }
        while (true) {
            bool progressed = false, all_done = true;
            for (unsigned t = 0; t < nthreads; ++t) {
                fiber& f = fibers[t];
                if (!f.done && f.ready) {
                    resume(f);
                    progressed = true;
                    if (f.fault) {
                        report r = fault_report(f);
                        abandon();
                        if (opt.mode == on_report::raise) throw failure(std::move(r));
                        keep(std::move(r));
                        return;
                    }
                    if (f.error || block_aborted) {
                        const std::exception_ptr e = f.error;
                        abandon();
                        if (e) std::rethrow_exception(e);
                        return;
                    }
                }
                all_done = all_done && f.done;
            }
            if (all_done) {
                end_of_block();
                return;
            }
            if (!progressed) {
                report r = diagnose();
                abandon();
                if (opt.mode == on_report::raise) throw failure(std::move(r));
                keep(std::move(r));
                return;
            }
        }
    }

    report fault_report(const fiber& f) const {
        const std::uintptr_t a = f.fault;
        const auto stack = reinterpret_cast<std::uintptr_t>(f.mapping);
        if (a >= stack && a < stack + page)
            return make(check::out_of_bounds, f.tid, "host " + hex(a),
                        "stack overflow: the thread ran past its " + std::to_string(stack_bytes) +
                            "-byte stack (raise options::stack_bytes)");
        std::lock_guard<std::mutex> lock(guard_mutex());
        for (const guard_entry& g : guard_registry())
            if (a >= g.map_begin && a < g.map_end) {
                const long long off = static_cast<long long>(a) - static_cast<long long>(g.data_begin);
                return make(
                    check::out_of_bounds, f.tid, g.name + "+" + std::to_string(off) + " (host " + hex(a) + ")",
                    "global access at byte offset " + std::to_string(off) + " of " + g.name + " (" +
                        std::to_string(g.bytes) + " bytes); the thread was ended there" +
                        (f.last_sync.line ? " (its last barrier or warp collective: " + to_string(f.last_sync) + ")"
                                          : std::string(" (before its first barrier)")));
            }
        return make(check::out_of_bounds, f.tid, "host " + hex(a), "fault in a guard page");
    }

    /// No fiber can run: a divergent __syncthreads, a warp collective missing exited lanes, or a deadlock.
    report diagnose() const {
        std::vector<unsigned> exited, blocked;
        for (unsigned t = 0; t < nthreads; ++t) (fibers[t].done ? exited : blocked).push_back(t);
        for (unsigned c = 0; c < ctas; ++c) {
            const barrier_state& B0 = bars[16 * c];
            if (B0.arrived == 0 || !B0.all) continue;
            // the threads of the CTA not at this __syncthreads exited or wait somewhere else
            std::vector<bool> at_b0(nthreads, false);
            for (unsigned t : B0.arrivals) at_b0[t] = true;
            std::vector<unsigned> cta_exited;  // this CTA's share of `exited`
            for (unsigned t : exited)
                if (cta_of(t) == c) cta_exited.push_back(t);
            std::string elsewhere;
            for (unsigned t = c * cta_threads; t < (c + 1) * cta_threads; ++t) {
                const fiber& g = fibers[t];
                if (at_b0[t] || g.done) continue;
                if (!elsewhere.empty()) elsewhere += "; ";
                elsewhere += thread_name(t) + " waits at " +
                             (g.waiting == fiber::wait::barrier    ? "bar.sync " + std::to_string(g.bar_id)
                              : g.waiting == fiber::wait::mbarrier ? "mbarrier " + describe_resolved(g.mbar)
                              : g.waiting == fiber::wait::cluster  ? std::string("barrier.cluster.wait")
                                                                   : std::string("a warp collective")) +
                             " at " + to_string(g.at);
                if (elsewhere.size() > 400) {
                    elsewhere += "; ...";
                    break;
                }
            }
            return make(check::divergent_barrier, B0.arrivals.front(), "",
                        "__syncthreads at " + to_string(B0.sites.front()) + " is waited on by threads " +
                            id_ranges(B0.arrivals) + ", but " +
                            (cta_exited.empty() ? std::string()
                                                : "threads " + id_ranges(cta_exited) + " exited without reaching it") +
                            (!cta_exited.empty() && !elsewhere.empty() ? ", and " : "") + elsewhere);
        }
        for (std::size_t w = 0; w < warp_ops.size(); ++w)
            for (const warp_op& op : warp_ops[w]) {
                std::vector<unsigned> gone;
                for (unsigned l : lanes_of(op.mask & ~op.arrived))
                    if (fibers[32 * w + l].done) gone.push_back(l);
                if (!gone.empty())
                    return make(check::warp_sync, static_cast<unsigned>(32 * w + lanes_of(op.arrived).front()), "",
                                std::string(name_of(op.kind)) + " with member mask " + hex(op.mask) + " at " +
                                    to_string(op.at) + " in warp " + std::to_string(w) + " waits for lanes " +
                                    id_ranges(gone) + ", which exited");
            }
        std::string d = "every live thread is blocked:";
        for (unsigned i = 0; i < bars.size(); ++i) {
            const barrier_state& B = bars[i];
            if (B.arrived == 0) continue;
            const unsigned id = i % 16;
            d += " bar.sync " + std::to_string(id) + ", " + std::to_string(B.expected) +
                 (ctas > 1 ? " of cluster rank " + std::to_string(i / 16) : std::string()) + " at " +
                 to_string(B.sites.front()) + ": " + std::to_string(B.arrived) + " of " + std::to_string(B.expected) +
                 " threads arrived (threads " + id_ranges(B.arrivals) + ");";
        }
        for (std::size_t w = 0; w < warp_ops.size(); ++w)
            for (const warp_op& op : warp_ops[w])
                d += " " + std::string(name_of(op.kind)) + " with member mask " + hex(op.mask) + " at " +
                     to_string(op.at) + " in warp " + std::to_string(w) + ": lanes " + id_ranges(lanes_of(op.arrived)) +
                     " wait, lanes " + id_ranges(lanes_of(op.mask & ~op.arrived)) + " have not arrived;";
        std::string address;
        for (const auto& kv : mbars) {
            const mbarrier_state& M = kv.second;
            if (M.waiters.empty()) continue;
            if (address.empty()) address = describe_resolved(kv.first);
            std::vector<unsigned> w = M.waiters;
            std::sort(w.begin(), w.end());
            d += " mbarrier " + describe_resolved(kv.first) + " (initialised at " + to_string(M.init_at) + " for " +
                 std::to_string(M.count) + " arrivals) in phase " + std::to_string(M.phase) + " (parity " +
                 std::to_string(M.phase & 1) + "): " + std::to_string(M.pending) + " arrivals and " +
                 std::to_string(M.tx) + " transaction bytes missing; threads " + id_ranges(w) +
                 " wait for the phase of parity " + std::to_string(fibers[w.front()].mbar_parity) + " to complete;";
        }
        if (cluster_bar.arrived > 0 || !cluster_bar.waiters.empty()) {
            std::vector<unsigned> arrived;
            for (unsigned t = 0; t < nthreads; ++t)
                if (fibers[t].cluster_arrived && fibers[t].cluster_phase == cluster_bar.phase) arrived.push_back(t);
            d += " barrier.cluster (first arrival at " + to_string(cluster_bar.first_at) +
                 "): " + std::to_string(cluster_bar.arrived) + " of the cluster's " + std::to_string(nthreads) +
                 " threads arrived (threads " + id_ranges(arrived) + "), the others neither arrived nor exited;";
        }
        for (std::size_t g = 0; g < warpgroup_ops.size(); ++g)
            if (warpgroup_ops[g].active)
                d += std::string(" ") + warpgroup_ops[g].tag + " at " + to_string(warpgroup_ops[g].at) +
                     " in warpgroup " + std::to_string(g) + ": threads " + id_ranges(warpgroup_ops[g].who) + " wait;";
        if (!exited.empty()) d += " threads " + id_ranges(exited) + " exited";
        return make(check::deadlock, blocked.front(), address, d);
    }

    // ---- barriers --------------------------------------------------------------------------------

    /// Arrives at barrier id; returns the number of arrivals of this phase whose pred was true (bar.red.popc).
    unsigned bar(unsigned id, unsigned count, bool wait, bool all, site at, bool pred = false) {
        fiber& f = *current;
        f.last_sync = at;
        const char* op = all ? "__syncthreads" : wait ? "bar.sync" : "bar.arrive";
        // built only for a report: barriers are the interpreter's hot path
        auto what = [&] {
            return std::string(op) + " " + std::to_string(id) + ", " + std::to_string(count) + " at " + to_string(at);
        };
        if (id >= 16) emit(make(check::barrier_misuse, f.tid, "", what() + ": barrier ids are 0..15"), true);
        if (count % 32 != 0)
            emit(make(check::barrier_misuse, f.tid, "", what() + ": the thread count must be a multiple of 32"), true);
        const unsigned expected = count == 0 ? cta_threads : count;
        if (expected > cta_threads)
            emit(make(check::barrier_misuse, f.tid, "",
                      what() + ": waits for more threads than the block's " + std::to_string(cta_threads)),
                 true);
        barrier_state& B = bars[16 * cta_of(f.tid) + id];
        if (B.arrived == 0) {
            B.reset();
            B.expected = expected;
            B.all = all;
            B.vc.assign(nthreads, 0);
        } else if (B.expected != expected) {
            emit(make(check::barrier_misuse, f.tid, "",
                      what() + ": the barrier's current phase, begun by " + thread_name(B.arrivals.front()) + " at " +
                          to_string(B.sites.front()) + ", counts " + std::to_string(B.expected) + " threads"),
                 true);
        }
        join(B.vc, f.vc);
        ++f.vc[f.tid];  // this thread's later accesses are not covered by the release
        ++B.arrived;
        B.popc += pred ? 1u : 0u;
        B.arrivals.push_back(f.tid);
        B.sites.push_back(at);
        if (B.arrived == B.expected) {
            if (B.all)
                for (std::size_t i = 1; i < B.sites.size(); ++i)
                    if (B.sites[i].line != B.sites[0].line ||
                        (B.sites[i].file != B.sites[0].file && std::strcmp(B.sites[i].file, B.sites[0].file) != 0))
                        emit(make(check::divergent_barrier, B.arrivals[i], "",
                                  "__syncthreads reached at " + to_string(B.sites[i]) + " by this thread and at " +
                                      to_string(B.sites[0]) + " by " + thread_name(B.arrivals[0])),
                             true);
            for (unsigned w : B.waiters) {
                fiber& g = fibers[w];
                join(g.vc, B.vc);
                g.wvalue = B.popc;
                g.ready = true;
                g.waiting = fiber::wait::none;
            }
            if (wait) join(f.vc, B.vc);
            const unsigned popc = B.popc;
            B.reset();
            return popc;
        }
        if (!wait) return 0;
        B.waiters.push_back(f.tid);
        f.waiting = fiber::wait::barrier;
        f.bar_id = id;
        f.at = at;
        block_wait(f);
        return f.wvalue;
    }

    /// barrier.cluster.arrive (release): one arrival of the running thread at the cluster barrier's
    /// phase, which completes when every thread of the cluster has arrived.
    void cluster_arrive(site at) {
        fiber& f = *current;
        f.last_sync = at;
        if (f.cluster_arrived)
            emit(make(check::barrier_misuse, f.tid, "",
                      "barrier.cluster.arrive at " + to_string(at) +
                          ": the thread arrives again before its barrier.cluster.wait"),
                 true);
        cluster_barrier_state& C = cluster_bar;
        if (C.arrived == 0) {
            C.vc.assign(nthreads, 0);
            C.first_at = at;
        }
        join(C.vc, f.vc);
        ++f.vc[f.tid];  // this thread's later accesses are not covered by the release
        f.cluster_arrived = true;
        f.cluster_phase = C.phase;
        ++C.arrived;
        cluster_try_complete();
    }
    /// Completes the cluster barrier's phase when every thread of the cluster has arrived in it or
    /// exited (PTX ISA, exit: exited threads holding up a barrier.cluster release it); its waiters go on.
    void cluster_try_complete() {
        cluster_barrier_state& C = cluster_bar;
        if (C.arrived == 0) return;  // a phase nobody has arrived in is not under way
        for (unsigned t = 0; t < nthreads; ++t) {
            const fiber& g = fibers[t];
            if (!g.done && !(g.cluster_arrived && g.cluster_phase == C.phase)) return;
        }
        C.done_vc = C.vc;
        ++C.phase;
        C.arrived = 0;
        for (unsigned w : C.waiters) {
            fiber& g = fibers[w];
            join(g.vc, C.done_vc);
            g.cluster_arrived = false;
            g.ready = true;
            g.waiting = fiber::wait::none;
        }
        C.waiters.clear();
    }
    /// barrier.cluster.wait (acquire): waits for the phase of the running thread's last arrival.
    void cluster_wait(site at) {
        fiber& f = *current;
        f.last_sync = at;
        if (!f.cluster_arrived)
            emit(make(check::barrier_misuse, f.tid, "",
                      "barrier.cluster.wait at " + to_string(at) +
                          ": the thread has not arrived (barrier.cluster.arrive) since its last wait"),
                 true);
        cluster_barrier_state& C = cluster_bar;
        if (C.phase > f.cluster_phase) {  // completed: its release is the last completed phase's
            join(f.vc, C.done_vc);
            f.cluster_arrived = false;
            return;
        }
        C.waiters.push_back(f.tid);
        f.waiting = fiber::wait::cluster;
        f.at = at;
        block_wait(f);
    }

    // ---- warp collectives ------------------------------------------------------------------------

    std::pair<std::uint32_t, bool> warp_collective(warp_kind k, std::uint32_t mask, std::uint32_t a, std::uint32_t b,
                                                   std::uint32_t c, std::uint64_t key, site at,
                                                   const char* tag = nullptr, const void* in = nullptr,
                                                   void* out = nullptr, const exchange_fn* fn = nullptr) {
        fiber& f = *current;
        f.last_sync = at;
        const unsigned lane = f.tid % 32, warp = f.tid / 32;
        const unsigned size = std::min(32u, nthreads - 32 * warp);
        const std::uint32_t exists = size == 32 ? 0xFFFFFFFFu : (1u << size) - 1;
        auto what = [&] {
            return std::string(tag ? tag : name_of(k)) + " with member mask " + hex(mask) + " at " + to_string(at);
        };
        if (!(mask >> lane & 1u))
            emit(make(check::warp_sync, f.tid, "",
                      what() + ": executed by lane " + std::to_string(lane) + ", which is not in the member mask"),
                 true);
        if (mask & ~exists)
            emit(make(check::warp_sync, f.tid, "",
                      what() + ": names lanes " + id_ranges(lanes_of(mask & ~exists)) + " that this warp of " +
                          std::to_string(size) + " threads does not have"),
                 true);
        auto& ops = warp_ops[warp];
        std::size_t i = 0;
        while (i < ops.size() && !(ops[i].mask >> lane & 1u)) ++i;
        if (i < ops.size() &&
            (ops[i].kind != k || ops[i].mask != mask || (tag && std::strcmp(tag, ops[i].tag ? ops[i].tag : "") != 0)))
            emit(make(check::warp_sync, f.tid, "",
                      what() + ": lanes " + id_ranges(lanes_of(ops[i].arrived)) + " wait in " +
                          (ops[i].tag ? ops[i].tag : name_of(ops[i].kind)) + " with member mask " + hex(ops[i].mask) +
                          " at " + to_string(ops[i].at)),
                 true);
        if (i == ops.size()) {
            ops.emplace_back();
            ops[i].kind = k;
            ops[i].mask = mask;
            ops[i].at = at;
            ops[i].tag = tag;
        }
        warp_op& op = ops[i];
        op.in[lane] = in;
        op.out[lane] = out;
        op.a[lane] = a;
        op.b[lane] = b;
        op.c[lane] = c;
        op.key[lane] = key;
        op.arrived |= 1u << lane;
        if (op.arrived == mask) {
            const warp_op done = op;
            ops.erase(ops.begin() + static_cast<std::ptrdiff_t>(i));
            if (k == warp_kind::custom) (*fn)(done.in, done.out);  // the last lane computes for all
            complete(done, warp, f.tid);
            return {f.wvalue, f.wpred};
        }
        f.waiting = fiber::wait::warp;
        f.at = at;
        block_wait(f);
        return {f.wvalue, f.wpred};
    }

    void complete(const warp_op& op, unsigned warp, unsigned self) {
        // the lanes of the mask, without a heap allocation (collectives are on the hot path)
        unsigned lane_list[32], nlanes = 0;
        for (unsigned l = 0; l < 32; ++l)
            if (op.mask >> l & 1u) lane_list[nlanes++] = l;
        const unsigned* const lanes_begin = lane_list;
        struct lane_range {
            const unsigned *b, *e;
            const unsigned* begin() const { return b; }
            const unsigned* end() const { return e; }
            unsigned front() const { return *b; }
        } const lanes{lanes_begin, lanes_begin + nlanes};
        std::vector<std::uint32_t> vc;
        if (op.kind == warp_kind::syncwarp) {
            vc.assign(nthreads, 0);
            for (unsigned l : lanes) join(vc, fibers[32 * warp + l].vc);
        }
        for (unsigned l : lanes) {
            fiber& g = fibers[32 * warp + l];
            std::uint32_t v = 0;
            bool p = false;
            switch (op.kind) {
                case warp_kind::shfl_idx:
                case warp_kind::shfl_up:
                case warp_kind::shfl_down:
                case warp_kind::shfl_bfly: {
                    // PTX ISA, shfl.sync: c = clamp (bits 0-4) | segment mask (bits 8-12)
                    const int lane = static_cast<int>(l), bval = static_cast<int>(op.b[l] & 31),
                              cval = static_cast<int>(op.c[l] & 31), seg = static_cast<int>((op.c[l] >> 8) & 31);
                    const int max_lane = (lane & seg) | (cval & ~seg), min_lane = lane & seg;
                    int j = lane;
                    if (op.kind == warp_kind::shfl_up) {
                        j = lane - bval;
                        p = j >= max_lane;
                    } else if (op.kind == warp_kind::shfl_down) {
                        j = lane + bval;
                        p = j <= max_lane;
                    } else if (op.kind == warp_kind::shfl_bfly) {
                        j = lane ^ bval;
                        p = j <= max_lane;
                    } else {
                        j = min_lane | (bval & ~seg);
                        p = j <= max_lane;
                    }
                    if (!p) j = lane;
                    if (!(op.mask >> j & 1u))
                        emit(make(check::warp_sync, 32 * warp + l, "",
                                  std::string(name_of(op.kind)) + " with member mask " + hex(op.mask) + " at " +
                                      to_string(op.at) + ": lane " + std::to_string(l) + " reads lane " +
                                      std::to_string(j) + ", which is outside the member mask (unpredictable value)"),
                             false);
                    v = op.a[j];
                    break;
                }
                case warp_kind::vote_all:
                    p = true;
                    for (unsigned m : lanes) p = p && op.a[m] != 0;
                    v = p;
                    break;
                case warp_kind::vote_any:
                    for (unsigned m : lanes) p = p || op.a[m] != 0;
                    v = p;
                    break;
                case warp_kind::vote_ballot:
                    for (unsigned m : lanes)
                        if (op.a[m] != 0) v |= 1u << m;
                    break;
                case warp_kind::match_any:
                    for (unsigned m : lanes)
                        if (op.key[m] == op.key[l]) v |= 1u << m;
                    break;
                case warp_kind::match_all:
                    p = true;
                    for (unsigned m : lanes) p = p && op.key[m] == op.key[lanes.front()];
                    v = p ? op.mask : 0;
                    break;
                case warp_kind::syncwarp:
                    join(g.vc, vc);
                    ++g.vc[g.tid];
                    break;
                case warp_kind::custom:
                    break;
            }
            g.wvalue = v;
            g.wpred = p;
            if (g.tid != self) {
                g.ready = true;
                g.waiting = fiber::wait::none;
            }
        }
    }

    // ---- mbarrier (PTX ISA: mbarrier, its phases, and the tx-count) ---------------------------------

    std::string mbar_what(const char* op, std::uint32_t addr, site at) const {
        return std::string(op) + " on mbarrier " + describe(addr, -1) + " at " + to_string(at);
    }
    /// The mbarrier at addr (a shared::cta address, or a shared::cluster one from mapa), reporting (and
    /// stopping the block) when it is misaligned or not initialised.
    mbarrier_state& mbar_get(const char* op, std::uint32_t addr, site at) {
        fiber& f = *current;
        f.last_sync = at;
        if (addr % 8 != 0)
            emit(make(check::mbarrier_misuse, f.tid, describe(addr, -1),
                      mbar_what(op, addr, at) + ": an mbarrier is an 8-byte object and must be 8-byte aligned"),
                 true);
        const std::size_t key = resolve(addr);
        auto it = mbars.find(key);
        if (it == mbars.end())
            emit(make(check::mbarrier_misuse, f.tid, describe(addr, -1),
                      mbar_what(op, addr, at) + ": no mbarrier.init of this block initialised it"),
                 true);
        access(window + key, 8, detail::access::atomic, -1);
        return it->second;
    }
    void mbar_init(std::uint32_t addr, std::uint32_t count, site at) {
        fiber& f = *current;
        f.last_sync = at;
        if (addr % 8 != 0)
            emit(make(check::mbarrier_misuse, f.tid, describe(addr, -1),
                      mbar_what("mbarrier.init", addr, at) + ": an mbarrier must be 8-byte aligned"),
                 true);
        if (count < 1 || count > (1u << 20) - 1)
            emit(make(check::mbarrier_misuse, f.tid, describe(addr, -1),
                      mbar_what("mbarrier.init", addr, at) + ": the count " + std::to_string(count) +
                          " is outside 1..2^20-1"),
                 true);
        // the init is a plain write of the object: arrivals and waits must be ordered after it
        const std::size_t key = resolve(addr);
        if (access(window + key, 8, detail::access::write, -1)) {
            const std::uint64_t v = count;
            std::memcpy(window + key, &v, 8);
        }
        mbarrier_state& M = mbars[key];
        if (!M.waiters.empty())
            emit(make(check::mbarrier_misuse, f.tid, describe(addr, -1),
                      mbar_what("mbarrier.init", addr, at) + ": threads wait on the mbarrier it re-initialises"),
                 true);
        M = mbarrier_state{};
        M.count = M.pending = count;
        M.vc.assign(nthreads, 0);
        M.init_at = at;
    }
    /// Ends the current phase when its arrivals and transactions are all in: the next phase begins
    /// (parity flips, the count is restored) and the waiters for the completed phase go on, acquiring
    /// what the phase's arrivals released.
    void mbar_try_complete(std::uint32_t addr, mbarrier_state& M, const char* op, site at) {
        if (M.pending != 0) return;
        if (M.tx < 0)
            emit(make(check::mbarrier_misuse, current->tid, describe(addr, -1),
                      mbar_what(op, addr, at) + ": the phase's arrivals are all in but " + std::to_string(-M.tx) +
                          " more transaction bytes completed than were expected (tx-count negative)"),
                 true);
        if (M.tx != 0) return;
        const unsigned parity = static_cast<unsigned>(M.phase & 1);
        M.done_vc[parity] = M.vc;
        ++M.phase;
        M.pending = M.count;
        M.vc.assign(nthreads, 0);
        std::vector<unsigned> still;
        for (unsigned w : M.waiters) {
            fiber& g = fibers[w];
            if (g.mbar_parity == parity) {
                join(g.vc, M.done_vc[parity]);
                g.ready = true;
                g.waiting = fiber::wait::none;
            } else {
                still.push_back(w);
            }
        }
        M.waiters = std::move(still);
    }
    /// mbarrier.arrive[.expect_tx]: adds `tx` expected bytes (expect_tx), then one arrival (release).
    void mbar_arrive(std::uint32_t addr, std::uint32_t tx, bool expect, site at) {
        const char* op = expect ? "mbarrier.arrive.expect_tx" : "mbarrier.arrive";
        fiber& f = *current;
        mbarrier_state& M = mbar_get(op, addr, at);
        if (M.pending == 0)
            emit(make(check::mbarrier_misuse, f.tid, describe(addr, -1),
                      mbar_what(op, addr, at) + ": all " + std::to_string(M.count) +
                          " arrivals of the current phase (" + std::to_string(M.phase) +
                          ") are in already (more arrivals than the count given at " + to_string(M.init_at) + ")"),
                 true);
        if (expect) M.tx += tx;
        join(M.vc, f.vc);
        ++f.vc[f.tid];  // this thread's later accesses are not covered by the release
        --M.pending;
        mbar_try_complete(addr, M, op, at);
    }
    /// complete_tx from an asynchronous copy the running thread issued: its writes are released with it.
    void mbar_complete_tx(std::uint32_t addr, std::uint32_t bytes, const char* op, site at) {
        fiber& f = *current;
        mbarrier_state& M = mbar_get(op, addr, at);
        M.tx -= static_cast<long long>(bytes);
        join(M.vc, f.vc);
        ++f.vc[f.tid];
        mbar_try_complete(addr, M, op, at);
    }
    /// mbarrier.try_wait.parity: returns once the phase of `parity` has completed (the thread is
    /// suspended until then, as the instruction may be; a wait nothing can end is a deadlock).
    bool mbar_wait(std::uint32_t addr, std::uint32_t parity, site at) {
        fiber& f = *current;
        mbarrier_state& M = mbar_get("mbarrier.try_wait.parity", addr, at);
        parity &= 1u;
        if ((M.phase & 1) != parity) {  // the current phase has the other parity: the awaited one is done
            if (M.phase > 0) join(f.vc, M.done_vc[parity]);
            return true;
        }
        M.waiters.push_back(f.tid);
        f.waiting = fiber::wait::mbarrier;
        f.mbar = resolve(addr);
        f.mbar_parity = parity;
        f.at = at;
        block_wait(f);
        return true;
    }

    // ---- the async proxy (PTX ISA, memory consistency model: proxies) --------------------------------

    /// fence.proxy.async by the running thread: its generic writes so far are visible to the async
    /// proxy (its clock advances, so later writes are not covered).
    void fence_proxy_async() {
        fiber& f = *current;
        proxy_fenced[f.tid] = f.vc[f.tid];
        ++f.vc[f.tid];
    }
    /// A read of shared bytes by the async proxy on behalf of the running thread (a wgmma operand, a TMA
    /// store's source): checked as the thread's read (race, bounds, initialisation), and each byte's
    /// last generic write must have been followed by a fence.proxy.async of its writer (after the
    /// write, in the writer's program order), else an async_proxy report.
    bool async_proxy_read(const std::uint8_t* p, std::size_t bytes, const char* what, site at) {
        if (!access(p, bytes, detail::access::read, -1)) return false;
        const std::size_t off = static_cast<std::size_t>(p - window);
        for (std::size_t i = 0; i < bytes; ++i) {
            const epoch& w = shadows[off + i].w;
            if (w.clock != 0 && !shadows[off + i].async_w && w.clock > proxy_fenced[w.tid]) {
                emit(make(check::async_proxy, current->tid, describe((off + i) % window_bytes, -1),
                          std::string(what) + " at " + to_string(at) + " reads through the async proxy a byte that " +
                              thread_name(w.tid) +
                              " wrote through the generic proxy without a fence.proxy.async after the write"),
                     false);
                break;
            }
        }
        return true;
    }

    /// A write of shared bytes by the async proxy on behalf of the running thread (a TMA load): checked
    /// as the thread's write; async-proxy readers need no fence.proxy.async for it.
    bool async_proxy_write(std::uint8_t* p, std::size_t bytes) {
        if (!access(p, bytes, detail::access::write, -1)) return false;
        const std::size_t off = static_cast<std::size_t>(p - window);
        for (std::size_t i = 0; i < bytes; ++i) shadows[off + i].async_w = true;
        return true;
    }

    // ---- setmaxnreg (warpgroup-collective) ---------------------------------------------------------

    /// Called once per warp (its lanes already agreed, the model's warp_exchange): the k-th setmaxnreg
    /// of each warp of a warpgroup must have the same form; end_of_block checks that all 4 warps ran it.
    void setmaxnreg(std::uint32_t n, bool inc, site at) {
        fiber& f = *current;
        const unsigned warp = f.tid / 32, wg = warp / 4;
        const char* op = inc ? "setmaxnreg.inc" : "setmaxnreg.dec";
        if (nthreads < 128 * (wg + 1))
            emit(make(check::ptx_misuse, f.tid, "",
                      std::string(op) + " at " + to_string(at) + ": warpgroup " + std::to_string(wg) +
                          " is incomplete (the block has " + std::to_string(nthreads) + " threads)"),
                 true);
        auto& ops = maxnreg[wg];
        const unsigned k = maxnreg_count[warp]++;
        if (k == ops.size()) ops.push_back(maxnreg_op{n, inc, 0u, at});
        maxnreg_op& o = ops[k];
        if (o.n != n || o.inc != inc)
            emit(make(check::ptx_misuse, f.tid, "",
                      std::string(op) + " " + std::to_string(n) + " at " + to_string(at) + " in warp " +
                          std::to_string(warp) + ", but another warp of warpgroup " + std::to_string(wg) +
                          " executed setmaxnreg." + (o.inc ? "inc " : "dec ") + std::to_string(o.n) + " at " +
                          to_string(o.at) + " there (warpgroup-collective: all 4 warps, the same operand)"),
                 true);
        o.warps |= 1u << (warp % 4);
    }

    /// After every thread of the block exited: warpgroup collectives some warps never executed.
    void end_of_block() {
        for (std::size_t g = 0; g < maxnreg.size(); ++g)
            for (const maxnreg_op& o : maxnreg[g])
                if (o.warps != 0xFu) {
                    std::vector<unsigned> missing;
                    for (unsigned w = 0; w < 4; ++w)
                        if (!(o.warps >> w & 1u)) missing.push_back(static_cast<unsigned>(4 * g + w));
                    report r = make(check::ptx_misuse, static_cast<unsigned>(128 * g), "",
                                    std::string("setmaxnreg.") + (o.inc ? "inc " : "dec ") + std::to_string(o.n) +
                                        " at " + to_string(o.at) + " was not executed by warps " + id_ranges(missing) +
                                        " of warpgroup " + std::to_string(g) +
                                        " (warpgroup-collective: all 4 warps execute it)");
                    if (opt.mode == on_report::raise) throw failure(std::move(r));
                    keep(std::move(r));
                    return;
                }
    }

    // ---- warpgroup collectives --------------------------------------------------------------------

    /// The warpgroup analogue of warp_collective(custom): the 128 threads of this thread's warpgroup
    /// deposit `in`; the last to arrive runs fn over all of them; the others wait. A warpgroup the block
    /// does not fill, or threads that reach a different instruction, are warp_sync reports. Like the
    /// warp collectives it does not order memory.
    void warpgroup_collective(const char* tag, site at, const void* in, void* out, const exchange_fn& fn) {
        fiber& f = *current;
        f.last_sync = at;
        const unsigned g = f.tid / 128, member = f.tid % 128;
        const std::string what = std::string(tag) + " at " + to_string(at);
        if (128 * (g + 1) > nthreads)
            emit(make(check::warp_sync, f.tid, "",
                      what + ": a warpgroup instruction in warpgroup " + std::to_string(g) + ", which has only " +
                          std::to_string(nthreads - 128 * g) + " of its 128 threads in this block"),
                 true);
        warpgroup_op& op = warpgroup_ops[g];
        if (op.active && std::strcmp(op.tag, tag) != 0)
            emit(make(check::warp_sync, f.tid, "",
                      what + ": threads " + id_ranges(op.who) + " of the warpgroup wait in " + op.tag + " at " +
                          to_string(op.at) + " (.aligned: all 128 threads execute the same instruction)"),
                 true);
        if (!op.active) {
            op.active = true;
            op.tag = tag;
            op.at = at;
            op.arrived = 0;
            op.who.clear();
        }
        op.in[member] = in;
        op.out[member] = out;
        op.who.push_back(f.tid);
        if (++op.arrived == 128) {
            warpgroup_op done = op;
            op = warpgroup_op{};
            fn(done.in, done.out);  // the last thread computes for all
            for (unsigned t : done.who)
                if (t != f.tid) {
                    fibers[t].ready = true;
                    fibers[t].waiting = fiber::wait::none;
                }
            return;
        }
        f.waiting = fiber::wait::warp;
        f.at = at;
        block_wait(f);
    }

    // ---- shared memory ---------------------------------------------------------------------------

    std::size_t shared_limit() const {
        return opt.max_dynamic_shared ? opt.device.shared_per_block_optin : opt.device.shared_per_block;
    }
    /// The variable holding shared offset off (-1: none).
    int region_at(std::size_t off) const {
        for (std::size_t r = regions.size(); r-- > 0;)
            if (off >= regions[r].begin && off < regions[r].begin + regions[r].size) return static_cast<int>(r);
        return -1;
    }
    std::string describe_any(std::size_t off) const { return describe(off, region_at(off)); }
    /// A thread that exits with cp.async copies in flight: the ISA guarantees their writes to no one
    /// (only a wait_group/wait_all of the issuing thread makes them visible), so they are dropped and
    /// reported; octet's kernels end with wait_all.
    void check_exit(fiber& f) {
        if (!f.stores.empty()) {
            std::size_t n = f.stores.uncommitted.size();
            for (const auto& g : f.stores.groups) n += g.size();
            f.stores = bulk_stores{};
            emit(make(check::ptx_misuse, f.tid, "",
                      "the thread exited with " + std::to_string(n) +
                          " TMA stores (cp.async.bulk.tensor) pending: their shared sources may be gone before they "
                          "are read (cp.async.bulk.commit_group and cp.async.bulk.wait_group.read 0 before exiting)"),
                 false);
        }
        if (f.copies.empty()) return;
        std::size_t n = f.copies.uncommitted.size(), groups = f.copies.groups.size();
        const async_copy* first = nullptr;  // the oldest pending copy
        for (const auto& g : f.copies.groups) {
            n += g.size();
            if (!first && !g.empty()) first = &g.front();
        }
        if (!first && !f.copies.uncommitted.empty()) first = &f.copies.uncommitted.front();
        const std::string what = std::to_string(n) + " cp.async copies (" + std::to_string(groups) +
                                 " committed groups, " + std::to_string(f.copies.uncommitted.size()) +
                                 " uncommitted copies) pending";
        const std::string address = first ? describe_any(first->dst) : std::string();
        f.copies = async_copies{};
        emit(make(check::ptx_misuse, f.tid, address,
                  "the thread exited with " + what +
                      ": their writes are not guaranteed (cp.async.wait_all before exiting completes them)"),
             false);
    }
    /// An offset from `window` (resolve) as its CTA's shared address, naming the CTA in a cluster.
    std::string describe_resolved(std::size_t at) const {
        return describe(at % window_bytes, -1) +
               (ctas > 1 ? " of cluster rank " + std::to_string(at / window_bytes) : std::string());
    }
    std::string describe(std::size_t off, int r) const {
        if (r >= 0 && static_cast<std::size_t>(r) < regions.size())
            return regions[static_cast<std::size_t>(r)].name + "+" +
                   hex(off - regions[static_cast<std::size_t>(r)].begin) + " (shared " + hex(off) + ")";
        return "shared " + hex(off);
    }

    std::uint8_t* alloc_static(const void* tag, const char* name, std::size_t bytes, std::size_t align, int* r) {
        auto it = static_regions.find(tag);
        if (it == static_regions.end()) {
            align = std::max<std::size_t>(align, 1);
            const std::size_t begin = (static_end + align - 1) / align * align, end = begin + bytes;
            const std::size_t total = cfg.dynamic_shared + (end - static_begin);
            if (total > shared_limit() || end > window_bytes)
                emit(make(check::shared_limit, current->tid, "",
                          std::string("static __shared__ ") + name + " (" + std::to_string(bytes) + " bytes) brings " +
                              std::to_string(end - static_begin) + " static + " + std::to_string(cfg.dynamic_shared) +
                              " dynamic bytes over the limit of " + std::to_string(shared_limit()) +
                              (opt.max_dynamic_shared ? "" : " (without cudaFuncAttributeMaxDynamicSharedMemorySize)")),
                     true);
            regions.push_back(region{name, begin, bytes});
            it = static_regions.emplace(tag, static_cast<int>(regions.size() - 1)).first;
            static_end = end;
            touched_end = std::max(touched_end, end);
            if (shadows.size() < shadow_bytes()) shadows.resize(shadow_bytes());
            result.static_shared = static_end - static_begin;
        }
        *r = it->second;
        return own_window() + regions[static_cast<std::size_t>(it->second)].begin;
    }

    bool hb(const epoch& e, const fiber& f) const { return e.clock <= f.vc[e.tid]; }
    /// Shadow state for every CTA's bytes below touched_end.
    std::size_t shadow_bytes() const { return (ctas - 1) * window_bytes + touched_end; }

    bool access(const std::uint8_t* p, std::size_t bytes, detail::access kind, int r) {
        fiber& f = *current;
        auto context = [&f] {
            return f.last_sync.line ? " (this thread's last barrier or warp collective: " + to_string(f.last_sync) + ")"
                                    : std::string(" (before this thread's first barrier)");
        };
        // bounds from the window of the CTA p lies in (the running thread's when p is in none)
        const std::uintptr_t pu = reinterpret_cast<std::uintptr_t>(p), all = reinterpret_cast<std::uintptr_t>(window);
        const std::uintptr_t wu = pu >= all && pu < all + ctas * window_bytes
                                      ? all + (pu - all) / window_bytes * window_bytes
                                      : reinterpret_cast<std::uintptr_t>(own_window());
        const char* verb = kind == detail::access::read    ? "reads "
                           : kind == detail::access::write ? "writes "
                                                           : "atomically updates ";
        // a report's address: in a cluster, with the CTA whose window it lies in
        auto address_of = [&](std::size_t off, int region) {
            return describe(off, region) +
                   (ctas > 1 ? " of cluster rank " + std::to_string((wu - all) / window_bytes) : std::string());
        };
        std::size_t lo = 0, hi = static_end;
        if (r >= 0 && static_cast<std::size_t>(r) < regions.size()) {
            lo = regions[static_cast<std::size_t>(r)].begin;
            hi = lo + regions[static_cast<std::size_t>(r)].size;
        }
        if (pu < wu + lo || pu + bytes > wu + hi) {
            const bool in_window = pu >= wu && pu < wu + window_bytes;
            const std::size_t off = in_window ? pu - wu : 0;
            std::string where = "outside the block's shared window";
            if (r >= 0 && static_cast<std::size_t>(r) < regions.size())
                where = "outside " + regions[static_cast<std::size_t>(r)].name + " (" +
                        std::to_string(regions[static_cast<std::size_t>(r)].size) + " bytes at shared " + hex(lo) + ")";
            const std::string addr = in_window ? address_of(off, -1) : "host " + hex(pu);
            const long long rel = static_cast<long long>(pu) - static_cast<long long>(wu + lo);
            emit(make(check::out_of_bounds, f.tid, addr,
                      std::string(verb) + std::to_string(bytes) + " bytes at offset " + std::to_string(rel) + ", " +
                          where + context()),
                 false);
            return false;
        }
        const std::size_t off = pu - wu, at = pu - all;  // in the CTA's window; in shadows
        const epoch me{f.vc[f.tid], f.tid};
        bool reported = false;
        auto race = [&](const epoch& other, const char* what) {
            if (reported) return;
            reported = true;
            emit(make(check::race, f.tid, address_of(off, r),
                      std::string(verb) + std::to_string(bytes) + " bytes that " + thread_name(other.tid) + " " + what +
                          " with no barrier between the two accesses" + context()),
                 false);
        };
        for (std::size_t i = 0; i < bytes; ++i) {
            shadow& s = shadows[at + i];
            if (kind != detail::access::write && opt.check_uninitialized && !s.init && !s.uninit_reported) {
                s.uninit_reported = true;
                if (i == 0 || !reported) {
                    reported = true;
                    emit(make(check::uninitialized_read, f.tid, address_of(off + i, r),
                              std::string(verb) + std::to_string(bytes) +
                                  " bytes of which this byte was never written by the block" + context()),
                         false);
                }
            }
            if (opt.check_races) {
                if (!hb(s.w, f)) race(s.w, "wrote");
                if (kind != detail::access::atomic && !hb(s.a, f)) race(s.a, "updated atomically");
                if (kind != detail::access::read) {
                    if (s.read_shared) {
                        for (const epoch& e : read_sets[s.readers])
                            if (!hb(e, f)) race(e, "read");
                    } else if (!hb(s.r, f)) {
                        race(s.r, "read");
                    }
                }
            }
            if (kind == detail::access::read) {
                if (s.read_shared) {
                    auto& v = read_sets[s.readers];
                    v.erase(std::remove_if(v.begin(), v.end(), [&](const epoch& e) { return hb(e, f); }), v.end());
                    v.push_back(me);
                } else if (hb(s.r, f)) {
                    s.r = me;
                } else {
                    s.read_shared = true;
                    if (free_read_sets.empty()) {
                        s.readers = static_cast<std::uint32_t>(read_sets.size());
                        read_sets.emplace_back();
                    } else {
                        s.readers = free_read_sets.back();
                        free_read_sets.pop_back();
                    }
                    read_sets[s.readers].assign({s.r, me});
                }
            } else {
                if (s.read_shared) {
                    read_sets[s.readers].clear();
                    free_read_sets.push_back(s.readers);
                }
                s.read_shared = false;
                s.r = epoch{};
                if (kind == detail::access::write) {
                    s.w = me;
                    s.async_w = false;
                    s.a = epoch{};
                } else {
                    s.a = me;
                }
                s.init = true;
            }
        }
        return true;
    }

    // ---- the launch ------------------------------------------------------------------------------

    /// False (after raising or keeping a launch_config report) when the launch is not launchable.
    bool validate() {
        const dim3 g = cfg.grid, b = cfg.block, c = cfg.cluster;
        const device_model& dev = opt.device;
        std::string bad;
        if (g.count() == 0 || b.count() == 0 || c.count() == 0)
            bad = "grid, block and cluster dimensions must be at least 1";
        else if (g.x % c.x != 0 || g.y % c.y != 0 || g.z % c.z != 0)
            bad = "the grid (" + std::to_string(g.x) + ", " + std::to_string(g.y) + ", " + std::to_string(g.z) +
                  ") is not a whole number of clusters (" + std::to_string(c.x) + ", " + std::to_string(c.y) + ", " +
                  std::to_string(c.z) + ")";
        else if (c.count() > 8)
            bad = "a cluster of " + std::to_string(c.count()) + " blocks exceeds the portable size of 8";
        else if (c.count() > 1 && b.count() % 128 != 0)
            bad = "the interpreter runs clusters of blocks whose thread count is a multiple of 128 (this block has " +
                  std::to_string(b.count()) + ")";
        else if (b.count() > dev.max_threads_per_block || b.z > dev.max_block_z)
            bad = "a block of " + std::to_string(b.count()) + " threads (z " + std::to_string(b.z) +
                  ") exceeds the device's " + std::to_string(dev.max_threads_per_block) + " threads (z at most " +
                  std::to_string(dev.max_block_z) + ")";
        else if (g.y > dev.max_grid_yz || g.z > dev.max_grid_yz)
            bad = "gridDim.y and gridDim.z are at most " + std::to_string(dev.max_grid_yz);
        else if (opt.max_dynamic_shared > dev.shared_per_block_optin)
            bad = "options::max_dynamic_shared " + std::to_string(opt.max_dynamic_shared) +
                  " exceeds the device's opt-in limit " + std::to_string(dev.shared_per_block_optin);
        else if (cfg.dynamic_shared > (opt.max_dynamic_shared ? opt.max_dynamic_shared : dev.shared_per_block))
            bad = std::to_string(cfg.dynamic_shared) + " bytes of dynamic shared memory exceed " +
                  (opt.max_dynamic_shared ? "options::max_dynamic_shared ("
                                          : "the default limit without cudaFuncAttributeMaxDynamicSharedMemorySize (") +
                  std::to_string(opt.max_dynamic_shared ? opt.max_dynamic_shared : dev.shared_per_block) + ")";
        if (!bad.empty()) {
            report r;
            r.kind = check::launch_config;
            r.kernel = kernel;
            r.detail = bad;
            if (opt.mode == on_report::raise) throw failure(std::move(r));
            keep(std::move(r));
            return false;
        }
        return true;
    }

    /// Maps the shared window and the fiber stacks.
    void setup() {
        const dim3 b = cfg.block;
        const device_model& dev = opt.device;
        cta_threads = static_cast<unsigned>(b.count());
        ctas = static_cast<unsigned>(cfg.cluster.count());
        nthreads = cta_threads * ctas;
        page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
        stack_bytes = (std::max<std::size_t>(opt.stack_bytes, 64 * 1024) + page - 1) / page * page;
        window_bytes = (dev.shared_per_block_optin + 2048 + page - 1) / page * page;
        mapping_pool& pool = mappings();
        window = pool.take(window_bytes * ctas, 0);  // page-aligned, hence 1024-aligned as swizzled tiles need
        if (!window) throw interpret::error("interpret: cannot map the shared window");
        regions.push_back(region{"dynamic shared", 0, cfg.dynamic_shared});
        static_begin = static_end = (cfg.dynamic_shared + 15) / 16 * 16;
        touched_end = static_end;
        // shadow state only for the bytes a block can access (the dynamic region; static variables
        // add theirs as they are declared), not for the whole window
        shadows.assign(shadow_bytes(), shadow{});
        bars.assign(16 * ctas, barrier_state{});
        fibers.reset(new fiber[nthreads]);
        for (unsigned t = 0; t < nthreads; ++t) {
            fibers[t].mapping = pool.take(page + stack_bytes, page);
            if (!fibers[t].mapping) throw interpret::error("interpret: cannot map a fiber stack");
        }
        warp_ops.assign((nthreads + 31) / 32, {});
        warpgroup_ops.assign((nthreads + 127) / 128, {});
    }

    /// Runs the clusters (blocks, without clusters) first, first + stride, ... (linear index in the grid
    /// of clusters, x fastest) while keep_going(index).
    template <class KeepGoing>
    void run_blocks(unsigned long long first, unsigned long long stride, KeepGoing keep_going) {
        const dim3 c = cfg.cluster, g(cfg.grid.x / c.x, cfg.grid.y / c.y, cfg.grid.z / c.z);
        fault_scope faults;
        machine* const outer = tl_machine;
        tl_machine = this;
        std::vector<dim3> cluster(ctas);
        try {
            for (unsigned long long i = first; i < g.count() && keep_going(i); i += stride) {
                const unsigned x = static_cast<unsigned>(i % g.x), y = static_cast<unsigned>(i / g.x % g.y),
                               z = static_cast<unsigned>(i / g.x / g.y);
                for (unsigned r = 0; r < ctas; ++r)  // cluster rank r: x fastest within the cluster
                    cluster[r] = dim3(x * c.x + r % c.x, y * c.y + r / c.x % c.y, z * c.z + r / c.x / c.y);
                run_cluster(cluster);
            }
        } catch (...) {
            tl_machine = outer;
            throw;
        }
        tl_machine = outer;
    }
};

inline void on_fault(int sig, siginfo_t* info, void* uc) {
    machine* m = tl_machine;
    const auto a = reinterpret_cast<std::uintptr_t>(info->si_addr);
    bool ours = false;
    if (m && m->current) {
        const auto stack = reinterpret_cast<std::uintptr_t>(m->current->mapping);
        ours = a >= stack && a < stack + m->page;
        for (const guard_entry& g : guard_registry())  // registered before the launch: not locked here
            ours = ours || (a >= g.map_begin && a < g.map_end);
    }
    if (!ours) {  // not a guard: what the program had before decides
        const struct sigaction& p = fault_scope::previous();
        if (p.sa_flags & SA_SIGINFO) {
            if (p.sa_sigaction) return p.sa_sigaction(sig, info, uc);
        } else if (p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN) {
            return p.sa_handler(sig);
        }
        signal(SIGSEGV, SIG_DFL);  // the faulting instruction runs again and ends the program
        return;
    }
    fiber& f = *m->current;
    f.fault = a;
    f.done = true;
    f.ready = false;
#if defined(OCTET_INTERPRET_ASAN)
    stack_t alt{};  // this handler's frame never returns: clear the redzones it leaves on the signal stack
    if (sigaltstack(nullptr, &alt) == 0 && (alt.ss_flags & SS_ONSTACK)) forget_stack(alt.ss_sp, alt.ss_size);
#endif
    exit_context(f.ctx, m->sched);  // never resumed: the fiber's stack is dropped, not unwound
}

/// The launch: blocks (clusters, with launch_config::cluster) in order on this thread, or spread over
/// opt.host_threads threads, each with its own machine. Reports are ordered by block; in raise mode the report (or
/// exception) of the lowest failing block is thrown, after every lower block has run, so the outcome does not depend on
/// the threads' timing.
inline run_result run_launch(const char* name, const launch_config& cfg, const options& opt,
                             const std::function<void()>& body) {
    machine probe(name, cfg, opt);
    if (!probe.validate()) return std::move(probe.result);
    const unsigned long long units = cfg.grid.count() / cfg.cluster.count();  // clusters (or blocks)
    const unsigned workers = static_cast<unsigned>(std::min<unsigned long long>(std::max(opt.host_threads, 1u), units));
    if (workers == 1) {
        probe.body = body;
        probe.setup();
        probe.run_blocks(0, 1, [](unsigned long long) { return true; });
        return std::move(probe.result);
    }
    std::atomic<unsigned long long> first_failed{units};
    std::vector<std::exception_ptr> errors(workers);
    std::vector<unsigned long long> failed_at(workers, units);
    std::vector<run_result> results(workers);
    std::vector<std::thread> pool;
    for (unsigned w = 0; w < workers; ++w)
        pool.emplace_back([&, w] {
            try {
                machine m(name, cfg, opt);
                m.body = body;
                m.setup();
                unsigned long long current = w;
                try {
                    m.run_blocks(w, workers, [&](unsigned long long i) {
                        current = i;
                        return i < first_failed.load();
                    });
                } catch (...) {
                    errors[w] = std::current_exception();
                    failed_at[w] = current;
                    unsigned long long seen = first_failed.load();
                    while (current < seen && !first_failed.compare_exchange_weak(seen, current)) {
                    }
                }
                results[w] = std::move(m.result);
            } catch (...) {
                errors[w] = std::current_exception();  // setup failed
                failed_at[w] = 0;
                first_failed = 0;
            }
        });
    for (auto& t : pool) t.join();
    unsigned worst = workers;
    for (unsigned w = 0; w < workers; ++w)
        if (errors[w] && (worst == workers || failed_at[w] < failed_at[worst])) worst = w;
    if (worst != workers) std::rethrow_exception(errors[worst]);
    run_result out;
    for (auto& r : results) {
        out.reports.insert(out.reports.end(), r.reports.begin(), r.reports.end());
        out.dropped_reports += r.dropped_reports;
        out.static_shared = std::max(out.static_shared, r.static_shared);
        out.context_switches += r.context_switches;
    }
    const auto linear = [&](const report& r) {
        return r.block.x + 1ull * cfg.grid.x * (r.block.y + 1ull * cfg.grid.y * r.block.z);
    };
    std::stable_sort(out.reports.begin(), out.reports.end(),
                     [&](const report& a, const report& b) { return linear(a) < linear(b); });
    if (out.reports.size() > opt.max_reports) {
        out.dropped_reports += out.reports.size() - opt.max_reports;
        out.reports.resize(opt.max_reports);
    }
    return out;
}

inline void fiber_entry() {
    machine& m = *tl_machine;
    context_entered(m.sched);
    fiber& f = *m.current;
    try {
        m.body();
        m.check_exit(f);
        ++m.cta_exits[m.cta_of(f.tid)];
    } catch (const fiber_abort&) {
    } catch (const block_abort&) {
        m.block_aborted = true;
    } catch (...) {
        f.error = std::current_exception();
    }
    f.done = true;
    f.ready = false;
    if (!f.error && !f.abort && !m.block_aborted) m.cluster_try_complete();  // may release barrier.cluster
    exit_context(f.ctx, m.sched);                                            // never resumed
}

inline machine& running(const char* what) {
    machine* m = tl_machine;
    if (!m || !m->current)
        throw interpret::error(std::string("interpret: ") + what +
                               " used outside a kernel that octet::interpret::launch is running");
    return *m;
}

/// The running thread's wgmma model state (ptx_models.hpp).
inline wgmma_thread& wgmma_state() {
    return running("wgmma").current->wgmma;
}

inline bool shared_access(const std::uint8_t* p, std::size_t bytes, access kind, int region) {
    return running("a shared-memory access").access(p, bytes, kind, region);
}
inline async_copies& thread_async_copies() {
    return running("cp.async").current->copies;
}
inline bulk_stores& thread_bulk_stores() {
    return running("cp.async.bulk").current->stores;
}
inline int shared_region_at(std::uint32_t address) {
    return running("a shared address").region_at(address);
}
inline void ptx_misuse(long long shared, const std::string& detail) {
    machine& m = running("a PTX instruction");
    m.emit(m.make(check::ptx_misuse, m.current->tid,
                  shared < 0 ? std::string() : m.describe_any(static_cast<std::size_t>(shared)), detail),
           true);
}
inline std::uint8_t* static_shared_alloc(const void* tag, const char* name, std::size_t bytes, std::size_t align,
                                         int* region) {
    return running("a __shared__ declaration").alloc_static(tag, name, bytes, align, region);
}
inline std::uint8_t* dynamic_shared_base(int* region) {
    machine& m = running("extern __shared__");
    *region = 0;
    return m.own_window();
}
inline std::uint8_t* shared_window(std::size_t* bytes) {
    machine& m = running("a shared address");
    *bytes = m.static_end;
    return m.own_window();
}

}  // namespace detail

template <class T>
guarded_buffer<T>::guarded_buffer(std::size_t n, std::string name) : size_(n) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t bytes = n * sizeof(T), data_pages = (bytes + page - 1) / page;
    map_bytes_ = (data_pages + 2) * page;  // guard, data, guard
    void* m = mmap(nullptr, map_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        throw interpret::error("interpret: cannot map a guarded buffer of " + std::to_string(bytes) + " bytes");
    map_ = static_cast<std::uint8_t*>(m);
    if (data_pages) mprotect(map_ + page, data_pages * page, PROT_READ | PROT_WRITE);
    // the data ends at the back guard, its start rounded down to 16 bytes for vector loads
    const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(map_ + page + data_pages * page);
    data_ = reinterpret_cast<T*>((end - bytes) & ~std::uintptr_t{15});
    std::lock_guard<std::mutex> lock(detail::guard_mutex());
    detail::guard_registry().push_back(
        detail::guard_entry{reinterpret_cast<std::uintptr_t>(map_), reinterpret_cast<std::uintptr_t>(map_) + map_bytes_,
                            reinterpret_cast<std::uintptr_t>(data_), bytes, std::move(name)});
}
template <class T>
guarded_buffer<T>::~guarded_buffer() {
    {
        std::lock_guard<std::mutex> lock(detail::guard_mutex());
        auto& reg = detail::guard_registry();
        for (std::size_t i = 0; i < reg.size(); ++i)
            if (reg[i].map_begin == reinterpret_cast<std::uintptr_t>(map_)) {
                reg.erase(reg.begin() + static_cast<std::ptrdiff_t>(i));
                break;
            }
    }
    munmap(map_, map_bytes_);
}

template <class Kernel, class... Args>
run_result launch(const char* name, const launch_config& cfg, const options& opt, Kernel&& kernel, Args&&... args) {
    auto params = std::make_tuple(std::decay_t<Args>(std::forward<Args>(args))...);
    const std::function<void()> body = [&kernel, &params] {
        auto copy = params;  // each thread its own copy of the parameters, as on the device
        std::apply(kernel, copy);
    };
    return detail::run_launch(name, cfg, opt, body);
}

inline const dim3& thread_idx() {
    return detail::running("threadIdx").current->idx;
}
inline const dim3& block_idx() {
    const detail::machine& m = detail::running("blockIdx");
    return m.blocks[m.cta_of(m.current->tid)];
}
inline const dim3& block_dim() {
    return detail::running("blockDim").cfg.block;
}
inline const dim3& grid_dim() {
    return detail::running("gridDim").cfg.grid;
}
inline unsigned lane_id() {
    return detail::running("laneid").current->tid % 32;
}
inline unsigned warp_id() {
    return detail::running("warpid").current->tid / 32;
}

inline void syncthreads(const char* file, int line) {
    detail::running("__syncthreads").bar(0, 0, true, true, detail::site{file, line});
}
inline int syncthreads_count(bool pred, const char* file, int line) {
    return static_cast<int>(
        detail::running("__syncthreads_count").bar(0, 0, true, true, detail::site{file, line}, pred));
}
inline void bar_sync(unsigned id, unsigned count, const char* file, int line) {
    detail::running("bar.sync").bar(id, count, true, false, detail::site{file, line});
}
inline void bar_arrive(unsigned id, unsigned count, const char* file, int line) {
    detail::running("bar.arrive").bar(id, count, false, false, detail::site{file, line});
}
inline void trap(const char* file, int line) {
    detail::machine& m = detail::running("trap");
    m.emit(m.make(check::trap, m.current->tid, "", "trap at " + detail::to_string(detail::site{file, line})), true);
    throw detail::block_abort{};  // not reached: emit stops the block
}
inline void yield(const char* file, int line) {
    detail::machine& m = detail::running("yield");
    detail::fiber& f = *m.current;
    if (++f.spins > m.opt.max_spins)
        m.emit(m.make(check::deadlock, f.tid, "",
                      "the thread yielded " + std::to_string(m.opt.max_spins) + " times at " +
                          detail::to_string(detail::site{file, line}) +
                          " without what it waits for happening (another block's write? blocks run one after "
                          "another here, and need not run concurrently on the device either)"),
               true);
    detail::switch_context(f.ctx, m.sched);
    if (f.abort) throw detail::fiber_abort{};
}

inline shfl_result shfl_sync(shfl_mode mode, std::uint32_t a, std::uint32_t b, std::uint32_t c,
                             std::uint32_t membermask, const char* file, int line) {
    const detail::warp_kind k = mode == shfl_mode::idx    ? detail::warp_kind::shfl_idx
                                : mode == shfl_mode::up   ? detail::warp_kind::shfl_up
                                : mode == shfl_mode::down ? detail::warp_kind::shfl_down
                                                          : detail::warp_kind::shfl_bfly;
    const auto r = detail::running("shfl.sync").warp_collective(k, membermask, a, b, c, 0, detail::site{file, line});
    return {r.first, r.second};
}
inline bool vote_all_sync(std::uint32_t membermask, bool p, const char* file, int line) {
    return detail::running("vote.sync")
        .warp_collective(detail::warp_kind::vote_all, membermask, p, 0, 0, 0, detail::site{file, line})
        .second;
}
inline bool vote_any_sync(std::uint32_t membermask, bool p, const char* file, int line) {
    return detail::running("vote.sync")
        .warp_collective(detail::warp_kind::vote_any, membermask, p, 0, 0, 0, detail::site{file, line})
        .second;
}
inline std::uint32_t vote_ballot_sync(std::uint32_t membermask, bool p, const char* file, int line) {
    return detail::running("vote.sync")
        .warp_collective(detail::warp_kind::vote_ballot, membermask, p, 0, 0, 0, detail::site{file, line})
        .first;
}
inline std::uint32_t match_any_sync(std::uint32_t membermask, std::uint64_t value, const char* file, int line) {
    return detail::running("match.sync")
        .warp_collective(detail::warp_kind::match_any, membermask, 0, 0, 0, value, detail::site{file, line})
        .first;
}
inline std::uint32_t match_all_sync(std::uint32_t membermask, std::uint64_t value, bool* pred, const char* file,
                                    int line) {
    const auto r =
        detail::running("match.sync")
            .warp_collective(detail::warp_kind::match_all, membermask, 0, 0, 0, value, detail::site{file, line});
    if (pred) *pred = r.second;
    return r.first;
}
inline void syncwarp(std::uint32_t membermask, const char* file, int line) {
    detail::running("__syncwarp")
        .warp_collective(detail::warp_kind::syncwarp, membermask, 0, 0, 0, 0, detail::site{file, line});
}
template <class In, class Out, class F>
Out warp_exchange(const char* instruction, std::uint32_t membermask, const In& mine, F compute, const char* file,
                  int line) {
    static_assert(std::is_trivially_copyable<In>::value && std::is_trivially_copyable<Out>::value,
                  "warp_exchange moves register values");
    Out result{};
    const detail::exchange_fn fn = [&compute](const void* const* in, void* const* out) {
        const In* ins[32];
        Out* outs[32];
        for (int l = 0; l < 32; ++l) {
            ins[l] = static_cast<const In*>(in[l]);
            outs[l] = static_cast<Out*>(out[l]);
        }
        compute(ins, outs);
    };
    detail::running(instruction)
        .warp_collective(detail::warp_kind::custom, membermask, 0, 0, 0, 0, detail::site{file, line}, instruction,
                         &mine, &result, &fn);
    return result;
}
template <class In, class Out, class F>
Out warpgroup_exchange(const char* instruction, const In& mine, F compute, const char* file, int line) {
    static_assert(std::is_trivially_copyable<In>::value && std::is_trivially_copyable<Out>::value,
                  "warpgroup_exchange moves register values");
    Out result{};
    const detail::exchange_fn fn = [&compute](const void* const* in, void* const* out) {
        const In* ins[128];
        Out* outs[128];
        for (int t = 0; t < 128; ++t) {
            ins[t] = static_cast<const In*>(in[t]);
            outs[t] = static_cast<Out*>(out[t]);
        }
        compute(ins, outs);
    };
    detail::running(instruction).warpgroup_collective(instruction, detail::site{file, line}, &mine, &result, fn);
    return result;
}
inline void model_report(check kind, std::string address, std::string detail, bool stops_block) {
    detail::machine& m = detail::running("a PTX model");
    m.emit(m.make(kind, m.current->tid, std::move(address), std::move(detail)), stops_block);
}
inline std::uint32_t activemask() {
    detail::machine& m = detail::running("__activemask");
    const unsigned warp = m.current->tid / 32;
    std::uint32_t mask = 0;
    for (unsigned l = 0; l < 32 && 32 * warp + l < m.nthreads; ++l)
        if (!m.fibers[32 * warp + l].done) mask |= 1u << l;
    return mask;
}

}  // namespace interpret
}  // namespace octet
