// octet/optim/checkpoint.hpp: versioned, checksummed checkpoints of the compressed optimizer state.
//
//   octet::save_adamw_checkpoint(path, state_ref, hyper, steps_taken);
//   octet::adamw_checkpoint_info info = octet::load_adamw_checkpoint(path, state_ref);
//
// Saving writes a temporary file beside `path` (`path.tmp.<pid>.<suffix>`, created exclusively,
// so concurrent saves to one path never share it), flushes it to disk, renames it over `path`,
// and flushes the folder (POSIX), so the rename itself survives a crash. A save that fails
// (disk full, crash) leaves the previous checkpoint intact; with concurrent saves the last
// rename wins and the file is always one complete checkpoint. Loading verifies the whole file
// (every checksum, every header field and id in range, sizes) before it writes anything into
// the state; a truncated, corrupted, foreign or mismatched file (or a folder) raises
// octet::error naming what is wrong, and the state is left as it was. Header fields are checked
// at load, not at the first step: unknown codec, master-weight or non-finite-policy ids,
// non-zero reserved bytes, betas outside [0, 1), eps <= 0, a negative or non-finite weight
// decay, or an offset off the 256-element block grid are refused there.
//
// Format, version 1; every integer and float little-endian whatever the host's byte order:
//   header (96 bytes)
//     0  char[8]  "OCTETADW"
//     8  u32      format version (1)
//    12  u32      reserved (0)
//    16  u16 x 4  octet version major, minor, patch, 0
//    24  u32 x 4  first-moment codec id, second-moment codec id, master-weights id, non-finite policy
//                 (state_codec_id: 1 fp32, 2 bf16 nearest, 3 e4m3_scaled, 4 e4m3_expanded, 5 dynamic8,
//                 6 bf16_stochastic, added without a version change: the layout is that of id 2)
//    40  u64 x 4  elements, element_offset (shard start), steps taken, Philox seed
//    72  f32 x 4  beta1, beta2, eps, weight_decay (IEEE 754 binary32 bits)
//    88  u32      section count
//    92  u32      CRC-32 of bytes 0..91
//   sections, in order: weights, compensation, m codes, m meta, v codes, v meta; each
//     u32 section id (1..6), u32 bytes per element, u64 element count, u64 payload bytes,
//     payload (elements little-endian: float as u32 bits, bf16 as u16, FP8/dynamic codes as u8,
//     meta as its float fields in declaration order), u32 CRC-32 of the payload
//   trailer: u32 CRC-32 of everything before it, then char[8] "OCTETEND"
// CRC-32 is the IEEE 802.3 / zlib polynomial (reflected 0xEDB88320, init and final xor
// 0xFFFFFFFF); octet::crc32 is tested against its published check values.
#pragma once

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

#include "octet/config.hpp"
#include "octet/core/bits.hpp"
#include "octet/core/byte_io.hpp"
#include "octet/core/check.hpp"
#include "octet/core/span.hpp"
#include "octet/optim/adamw.hpp"

namespace octet {

// ---- CRC-32 ----------------------------------------------------------------------------------

namespace optim_detail {
struct crc32_tables {
    std::uint32_t t[8][256];
};
constexpr crc32_tables make_crc32_tables() {
    crc32_tables x{};
    for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        x.t[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i)
        for (int s = 1; s < 8; ++s) x.t[s][i] = (x.t[s - 1][i] >> 8) ^ x.t[0][x.t[s - 1][i] & 0xFFu];
    return x;
}
inline constexpr crc32_tables crc32_table = make_crc32_tables();
}  // namespace optim_detail

/// Continues a CRC-32 over more bytes: crc32_update(crc32_update(0, a), b) == crc32(a + b).
inline std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t size) {
    const auto& T = optim_detail::crc32_table.t;
    const auto* p = static_cast<const unsigned char*>(data);
    std::uint32_t c = ~crc;
    while (size >= 8) {  // slicing by 8
        const std::uint32_t lo = c ^ load_le32(p);
        c = T[7][lo & 0xFFu] ^ T[6][(lo >> 8) & 0xFFu] ^ T[5][(lo >> 16) & 0xFFu] ^ T[4][lo >> 24] ^ T[3][p[4]] ^
            T[2][p[5]] ^ T[1][p[6]] ^ T[0][p[7]];
        p += 8;
        size -= 8;
    }
    while (size--) c = (c >> 8) ^ T[0][(c ^ *p++) & 0xFFu];
    return ~c;
}

/// CRC-32 (IEEE 802.3, as zlib's crc32) of a byte range.
inline std::uint32_t crc32(const void* data, std::size_t size) {
    return crc32_update(0u, data, size);
}

// ---- checkpoint ------------------------------------------------------------------------------

struct adamw_checkpoint_info {
    std::uint32_t format_version = 0;
    int octet_major = 0, octet_minor = 0, octet_patch = 0;
    state_codec_id m_codec{}, v_codec{};
    master_weights_id master{};
    std::uint64_t elements = 0;
    std::uint64_t element_offset = 0;
    std::uint64_t steps = 0;  ///< steps taken when saved; the next step is steps + 1
    adamw_hyper hyper;
};

inline constexpr std::uint32_t adamw_checkpoint_version = 1;

namespace optim_detail {

inline constexpr char checkpoint_magic[9] = "OCTETADW";
inline constexpr char checkpoint_end[9] = "OCTETEND";
inline constexpr std::size_t checkpoint_header_bytes = 96;
inline constexpr std::uint32_t checkpoint_sections = 6;

// The checkpoint's names for the little-endian byte I/O of octet/core/byte_io.hpp.
inline void put_u16(unsigned char* p, std::uint32_t v) {
    store_le16(p, v);
}
inline void put_u32(unsigned char* p, std::uint32_t v) {
    store_le32(p, v);
}
inline void put_u64(unsigned char* p, std::uint64_t v) {
    store_le64(p, v);
}
inline std::uint32_t get_u16(const unsigned char* p) {
    return load_le16(p);
}
inline std::uint32_t get_u32(const unsigned char* p) {
    return load_le32(p);
}
inline std::uint64_t get_u64(const unsigned char* p) {
    return load_le64(p);
}

/// Serialization of one element: bytes per element, put, get (little-endian).
template <class T>
struct wire;
template <>
struct wire<float> {
    static constexpr std::size_t bytes = 4;
    static void put(unsigned char* p, float x) { put_u32(p, float_to_bits(x)); }
    static void get(const unsigned char* p, float& x) { x = bits_to_float(get_u32(p)); }
};
template <>
struct wire<::octet::bf16> {
    static constexpr std::size_t bytes = 2;
    static void put(unsigned char* p, ::octet::bf16 x) { put_u16(p, x.bits); }
    static void get(const unsigned char* p, ::octet::bf16& x) { x.bits = static_cast<std::uint16_t>(get_u16(p)); }
};
template <>
struct wire<std::uint8_t> {
    static constexpr std::size_t bytes = 1;
    static void put(unsigned char* p, std::uint8_t x) { p[0] = x; }
    static void get(const unsigned char* p, std::uint8_t& x) { x = p[0]; }
};
/// Codec meta: its float fields in order.
template <class Meta, int Floats>
struct meta_wire {
    static_assert(sizeof(Meta) == 4 * Floats && std::is_trivially_copyable_v<Meta>,
                  "octet: codec meta must be Floats floats");
    static constexpr std::size_t bytes = 4 * Floats;
    static void put(unsigned char* p, const Meta& m) {
        float f[Floats];
        std::memcpy(f, &m, sizeof m);
        for (int i = 0; i < Floats; ++i) put_u32(p + 4 * i, float_to_bits(f[i]));
    }
    static void get(const unsigned char* p, Meta& m) {
        float f[Floats];
        for (int i = 0; i < Floats; ++i) f[i] = bits_to_float(get_u32(p + 4 * i));
        std::memcpy(&m, f, sizeof m);
    }
};
struct empty_wire {
    static constexpr std::size_t bytes = 0;
    template <class T>
    static void put(unsigned char*, const T&) {}
    template <class T>
    static void get(const unsigned char*, T&) {}
};
template <class Codec>
using meta_wire_of =
    std::conditional_t<Codec::has_meta, meta_wire<typename Codec::meta_type, Codec::meta_floats>, empty_wire>;
template <class Master>
using comp_wire_of = std::conditional_t<Master::has_compensation, wire<typename Master::comp_type>, empty_wire>;

/// A FILE that keeps a running CRC of everything written or read.
class checked_file {
public:
    checked_file(const std::string& path, const char* mode) : f_(std::fopen(path.c_str(), mode)), path_(path) {}
    checked_file(std::FILE* f, const std::string& path) : f_(f), path_(path) {}
    ~checked_file() { close(); }
    checked_file(const checked_file&) = delete;
    checked_file& operator=(const checked_file&) = delete;
    bool ok() const { return f_ != nullptr; }
    void write(const void* p, std::size_t n) {
        if (n && std::fwrite(p, 1, n, f_) != n) fail_write();
        crc_ = crc32_update(crc_, p, n);
    }
    /// Reads exactly n bytes or returns false (end of file: truncated).
    bool read(void* p, std::size_t n) {
        if (n && std::fread(p, 1, n, f_) != n) return false;
        crc_ = crc32_update(crc_, p, n);
        return true;
    }
    std::uint32_t crc() const { return crc_; }
    bool at_end() {
        const int c = std::fgetc(f_);
        return c == EOF;
    }
    void flush_to_disk() {
        if (std::fflush(f_) != 0) fail_write();
#if defined(__unix__) || defined(__APPLE__)
        if (::fsync(fileno(f_)) != 0) fail_write();
#endif
    }
    bool close() {
        if (!f_) return true;
        const bool ok = std::fclose(f_) == 0;
        f_ = nullptr;
        return ok;
    }

private:
    [[noreturn]] void fail_write() {
        throw error("octet::save_adamw_checkpoint: writing '" + path_ + "' failed (disk full or I/O error)");
    }
    std::FILE* f_;
    std::string path_;
    std::uint32_t crc_ = 0;
};

/// Elements per chunk of a section's payload: up to 1 MiB, but never more than the section holds
/// (a tiny state does not allocate a megabyte per section).
inline std::size_t section_chunk(std::size_t bytes_per_element, std::size_t count) {
    if (bytes_per_element == 0) return 0;
    return std::min((std::size_t{1} << 20) / bytes_per_element, count);
}

template <class T, class Wire>
void write_section(checked_file& f, std::uint32_t id, const T* data, std::size_t count) {
    unsigned char head[24];
    put_u32(head, id);
    put_u32(head + 4, static_cast<std::uint32_t>(Wire::bytes));
    put_u64(head + 8, count);
    put_u64(head + 16, static_cast<std::uint64_t>(count) * Wire::bytes);
    f.write(head, sizeof head);
    std::uint32_t crc = 0;
    const std::size_t per = section_chunk(Wire::bytes, count);
    std::vector<unsigned char> buf(per * Wire::bytes);
    for (std::size_t i = 0; i < count; i += per) {
        const std::size_t k = count - i < per ? count - i : per;
        for (std::size_t j = 0; j < k; ++j) Wire::put(buf.data() + j * Wire::bytes, data[i + j]);
        f.write(buf.data(), k * Wire::bytes);
        crc = crc32_update(crc, buf.data(), k * Wire::bytes);
    }
    unsigned char tail[4];
    put_u32(tail, crc);
    f.write(tail, 4);
}

/// Reads one section; with `out` null only verifies it. Returns an empty string or what is wrong.
template <class T, class Wire>
std::string read_section(checked_file& f, std::uint32_t id, T* out, std::size_t count) {
    unsigned char head[24];
    if (!f.read(head, sizeof head)) return "is truncated (in a section header)";
    if (get_u32(head) != id)
        return detail::message("has section ", get_u32(head), " where section ", id,
                               " belongs (not an octet checkpoint of this layout)");
    if (get_u32(head + 4) != Wire::bytes || get_u64(head + 8) != count ||
        get_u64(head + 16) != static_cast<std::uint64_t>(count) * Wire::bytes)
        return detail::message("section ", id, " holds ", get_u64(head + 8), " elements of ", get_u32(head + 4),
                               " bytes; this state needs ", count, " of ", Wire::bytes);
    std::uint32_t crc = 0;
    const std::size_t per = section_chunk(Wire::bytes, count);
    std::vector<unsigned char> buf(per * Wire::bytes);
    for (std::size_t i = 0; i < count; i += per) {
        const std::size_t k = count - i < per ? count - i : per;
        if (!f.read(buf.data(), k * Wire::bytes)) return "is truncated (in a section's data)";
        crc = crc32_update(crc, buf.data(), k * Wire::bytes);
        if (out)
            for (std::size_t j = 0; j < k; ++j) Wire::get(buf.data() + j * Wire::bytes, out[i + j]);
    }
    unsigned char tail[4];
    if (!f.read(tail, 4)) return "is truncated (in a section checksum)";
    if (get_u32(tail) != crc) return detail::message("is corrupted: section ", id, " fails its CRC-32");
    return {};
}

inline std::string parse_header(const unsigned char* h, adamw_checkpoint_info& info) {
    if (std::memcmp(h, checkpoint_magic, 8) != 0) return "is not an octet AdamW checkpoint (bad magic)";
    if (get_u32(h + 92) != crc32(h, 92)) return "is corrupted: its header fails its CRC-32";
    info.format_version = get_u32(h + 8);
    if (info.format_version != adamw_checkpoint_version)
        return detail::message("has format version ", info.format_version, "; this octet reads version ",
                               adamw_checkpoint_version);
    info.octet_major = static_cast<int>(get_u16(h + 16));
    info.octet_minor = static_cast<int>(get_u16(h + 18));
    info.octet_patch = static_cast<int>(get_u16(h + 20));
    info.m_codec = static_cast<state_codec_id>(get_u32(h + 24));
    info.v_codec = static_cast<state_codec_id>(get_u32(h + 28));
    info.master = static_cast<master_weights_id>(get_u32(h + 32));
    info.hyper.on_nonfinite = static_cast<grad_nonfinite_policy>(get_u32(h + 36));
    info.elements = get_u64(h + 40);
    info.element_offset = get_u64(h + 48);
    info.steps = get_u64(h + 56);
    info.hyper.seed = get_u64(h + 64);
    info.hyper.beta1 = bits_to_float(get_u32(h + 72));
    info.hyper.beta2 = bits_to_float(get_u32(h + 76));
    info.hyper.eps = bits_to_float(get_u32(h + 80));
    info.hyper.weight_decay = bits_to_float(get_u32(h + 84));
    if (get_u32(h + 88) != checkpoint_sections)
        return detail::message("has ", get_u32(h + 88), " sections; version 1 has ", checkpoint_sections);
    // Every field in range here, so that a bad value is named at load and not at the next step.
    // (The CRC only says the header is what its writer wrote; a foreign or newer writer can
    // still write values this octet does not know.)
    const char* unknown = "unknown";
    if (get_u32(h + 12) != 0 || get_u16(h + 22) != 0)
        return detail::message("has non-zero reserved header bytes (", get_u32(h + 12), ", ", get_u16(h + 22),
                               "); it was written by a newer or foreign writer");
    if (std::strcmp(state_codec_name(info.m_codec), unknown) == 0)
        return detail::message("has an unknown first-moment codec id ", get_u32(h + 24),
                               "; it was written by a newer or foreign writer");
    if (std::strcmp(state_codec_name(info.v_codec), unknown) == 0)
        return detail::message("has an unknown second-moment codec id ", get_u32(h + 28),
                               "; it was written by a newer or foreign writer");
    if (std::strcmp(master_weights_name(info.master), unknown) == 0)
        return detail::message("has an unknown master-weights id ", get_u32(h + 32),
                               "; it was written by a newer or foreign writer");
    if (info.hyper.on_nonfinite != grad_nonfinite_policy::skip_step &&
        info.hyper.on_nonfinite != grad_nonfinite_policy::zero_block)
        return detail::message("has an unknown non-finite policy id ", get_u32(h + 36), " (1 skip_step, 2 zero_block)");
    if (info.element_offset % optim_block != 0 ||
        info.elements > std::numeric_limits<std::uint64_t>::max() - info.element_offset ||
        info.elements > std::numeric_limits<std::size_t>::max() / 4)
        return detail::message("holds ", info.elements, " elements at offset ", info.element_offset,
                               "; offsets are multiples of ", optim_block, " and the range must fit in memory");
    const adamw_hyper& hp = info.hyper;
    if (!(hp.beta1 >= 0.0f && hp.beta1 < 1.0f) || !(hp.beta2 >= 0.0f && hp.beta2 < 1.0f))
        return detail::message("has beta1 ", hp.beta1, ", beta2 ", hp.beta2, "; both must lie in [0, 1)");
    if (!(hp.eps > 0.0f && std::isfinite(hp.eps)))
        return detail::message("has eps ", hp.eps, "; it must be finite and > 0");
    if (!(hp.weight_decay >= 0.0f && std::isfinite(hp.weight_decay)))
        return detail::message("has weight_decay ", hp.weight_decay, "; it must be finite and >= 0");
    return {};
}

/// "is a directory" for a folder, else empty: fopen succeeds on a folder and the first read fails,
/// which would otherwise read as a truncated file.
inline std::string not_a_file(const std::string& path) {
#if defined(__unix__) || defined(__APPLE__)
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        return "is a directory; pass the path of a checkpoint file";
#else
    (void)path;
#endif
    return {};
}

template <class MC, class VC, class M>
std::string read_checkpoint(const std::string& path, const adamw_state_ref<MC, VC, M>* state,
                            adamw_checkpoint_info& info) {
    if (std::string dir = not_a_file(path); !dir.empty()) return dir;
    checked_file f(path, "rb");
    if (!f.ok()) return "cannot be opened for reading";
    unsigned char h[checkpoint_header_bytes];
    if (!f.read(h, sizeof h)) return "is truncated (shorter than the header)";
    std::string why = parse_header(h, info);
    if (!why.empty()) return why;
    if (info.m_codec != MC::id || info.v_codec != VC::id || info.master != M::id)
        return detail::message("holds moments ", state_codec_name(info.m_codec), "/", state_codec_name(info.v_codec),
                               " with ", master_weights_name(info.master), " master weights; this state is ",
                               state_codec_name(MC::id), "/", state_codec_name(VC::id), " with ",
                               master_weights_name(M::id));
    const std::size_t n = static_cast<std::size_t>(info.elements);
    if (state && (info.elements != state->size() || info.element_offset != state->element_offset))
        return detail::message("holds ", info.elements, " elements at offset ", info.element_offset,
                               "; this state has ", state->size(), " at offset ", state->element_offset);
    using W = typename M::weight_type;
    const bool write = state != nullptr;
    if (!(why = read_section<W, wire<W>>(f, 1, write ? state->params.data() : nullptr, n)).empty()) return why;
    if (!(why = read_section<typename M::comp_type, comp_wire_of<M>>(f, 2, write ? state->compensation.data() : nullptr,
                                                                     M::has_compensation ? n : 0))
             .empty())
        return why;
    if (!(why = read_section<typename MC::code_type, wire<typename MC::code_type>>(
              f, 3, write ? state->m_codes.data() : nullptr, n))
             .empty())
        return why;
    if (!(why = read_section<typename MC::meta_type, meta_wire_of<MC>>(f, 4, write ? state->m_meta.data() : nullptr,
                                                                       state_meta_count<MC>(n)))
             .empty())
        return why;
    if (!(why = read_section<typename VC::code_type, wire<typename VC::code_type>>(
              f, 5, write ? state->v_codes.data() : nullptr, n))
             .empty())
        return why;
    if (!(why = read_section<typename VC::meta_type, meta_wire_of<VC>>(f, 6, write ? state->v_meta.data() : nullptr,
                                                                       state_meta_count<VC>(n)))
             .empty())
        return why;
    const std::uint32_t expected = f.crc();
    unsigned char tail[12];
    if (!f.read(tail, sizeof tail)) return "is truncated (no trailer)";
    if (get_u32(tail) != expected) return "is corrupted: the file fails its CRC-32";
    if (std::memcmp(tail + 4, checkpoint_end, 8) != 0) return "is corrupted: bad end marker";
    if (!f.at_end()) return "has bytes after its end marker";
    return {};
}

}  // namespace optim_detail

namespace optim_detail {

/// Creates a temporary file beside `path` for one save, exclusively (it fails rather than open a
/// file another save is writing): path.tmp.<pid>.<suffix>, the suffix from this thread, the clock
/// and the attempt. Returns null (and the last name tried) if no name could be created.
inline std::FILE* create_temporary(const std::string& path, std::string& tmp) {
    const auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    const std::uint64_t base =
        now ^
        (static_cast<std::uint64_t>(std::hash<std::thread::id>{}(std::this_thread::get_id())) * 0x9E3779B97F4A7C15ull);
#if defined(__unix__) || defined(__APPLE__)
    const long pid = static_cast<long>(::getpid());
#else
    const long pid = 0;
#endif
    for (std::uint64_t attempt = 0; attempt < 64; ++attempt) {
        char suffix[40];
        std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%016llx", pid,
                      static_cast<unsigned long long>(base + attempt * 0x632BE59BD9B4E019ull));
        tmp = path + suffix;
#if defined(__unix__) || defined(__APPLE__)
        const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd >= 0) {
            if (std::FILE* f = ::fdopen(fd, "wb")) return f;
            ::close(fd);
            std::remove(tmp.c_str());
            return nullptr;
        }
        if (errno != EEXIST) return nullptr;
#else
        if (std::FILE* f = std::fopen(tmp.c_str(), "wbx")) return f;  // C11 exclusive mode
#endif
    }
    return nullptr;
}

/// Flushes the folder holding `path` to disk, so that a completed rename survives a crash.
inline void sync_folder_of(const std::string& path, const char* fn) {
#if defined(__unix__) || defined(__APPLE__)
    const std::size_t slash = path.find_last_of('/');
    const std::string folder = slash == std::string::npos ? std::string(".")
                               : slash == 0               ? std::string("/")
                                                          : path.substr(0, slash);
    const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY);
    int failed = fd < 0 ? errno : 0;
    if (fd >= 0) {
        if (::fsync(fd) != 0) failed = errno;
        ::close(fd);
    }
    // EINVAL: this file system cannot sync folders (the rename is as durable as it can make it)
    if (failed != 0 && failed != EINVAL)
        throw error(std::string(fn) + ": argument 'path': '" + path +
                    "' is written and renamed, but flushing its folder '" + folder + "' to disk failed (" +
                    std::strerror(failed) + "); after a crash the previous checkpoint may reappear");
#else
    (void)path, (void)fn;
#endif
}

}  // namespace optim_detail

/// Writes the state (and the hyperparameters and step count needed to resume) to `path`,
/// atomically: a temporary file of this save alone is written, flushed to disk and renamed over
/// `path`, and the folder is flushed.
template <class MC, class VC, class M>
void save_adamw_checkpoint(const std::string& path, const adamw_state_ref<MC, VC, M>& state, const adamw_hyper& hyper,
                           std::uint64_t steps) {
    using namespace optim_detail;
    constexpr const char* fn = "octet::save_adamw_checkpoint";
    check_state(fn, state);
    OCTET_REQUIRE(!path.empty(), fn, "path", "is empty");
    const std::string dir = not_a_file(path);
    OCTET_REQUIRE(dir.empty(), fn, "path", "'" + path + "' " + dir);
    std::string tmp;
    std::FILE* created = create_temporary(path, tmp);
    OCTET_REQUIRE(
        created != nullptr, fn, "path",
        "'" + tmp + "' cannot be created (" + std::strerror(errno) + "); check the folder exists and is writable");
    {
        checked_file f(created, tmp);
        try {
            unsigned char h[checkpoint_header_bytes] = {};
            std::memcpy(h, checkpoint_magic, 8);
            put_u32(h + 8, adamw_checkpoint_version);
            put_u16(h + 16, version_major);
            put_u16(h + 18, version_minor);
            put_u16(h + 20, version_patch);
            put_u32(h + 24, static_cast<std::uint32_t>(MC::id));
            put_u32(h + 28, static_cast<std::uint32_t>(VC::id));
            put_u32(h + 32, static_cast<std::uint32_t>(M::id));
            put_u32(h + 36, static_cast<std::uint32_t>(hyper.on_nonfinite));
            put_u64(h + 40, state.size());
            put_u64(h + 48, state.element_offset);
            put_u64(h + 56, steps);
            put_u64(h + 64, hyper.seed);
            put_u32(h + 72, float_to_bits(hyper.beta1));
            put_u32(h + 76, float_to_bits(hyper.beta2));
            put_u32(h + 80, float_to_bits(hyper.eps));
            put_u32(h + 84, float_to_bits(hyper.weight_decay));
            put_u32(h + 88, checkpoint_sections);
            put_u32(h + 92, crc32(h, 92));
            f.write(h, sizeof h);
            const std::size_t n = state.size();
            using W = typename M::weight_type;
            write_section<W, wire<W>>(f, 1, state.params.data(), n);
            write_section<typename M::comp_type, comp_wire_of<M>>(f, 2, state.compensation.data(),
                                                                  M::has_compensation ? n : 0);
            write_section<typename MC::code_type, wire<typename MC::code_type>>(f, 3, state.m_codes.data(), n);
            write_section<typename MC::meta_type, meta_wire_of<MC>>(f, 4, state.m_meta.data(), state_meta_count<MC>(n));
            write_section<typename VC::code_type, wire<typename VC::code_type>>(f, 5, state.v_codes.data(), n);
            write_section<typename VC::meta_type, meta_wire_of<VC>>(f, 6, state.v_meta.data(), state_meta_count<VC>(n));
            unsigned char tail[12];
            put_u32(tail, f.crc());
            std::memcpy(tail + 4, checkpoint_end, 8);
            f.write(tail, sizeof tail);
            f.flush_to_disk();
            if (!f.close()) throw error(std::string(fn) + ": closing '" + tmp + "' failed");
        } catch (...) {
            f.close();
            std::remove(tmp.c_str());
            throw;
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        throw error(std::string(fn) + ": argument 'path': renaming '" + tmp + "' to '" + path +
                    "' failed; the previous checkpoint is unchanged");
    }
    sync_folder_of(path, fn);
}

/// Reads only the header (and verifies the whole file).
inline adamw_checkpoint_info read_adamw_checkpoint_info(const std::string& path) {
    adamw_checkpoint_info info;
    unsigned char h[optim_detail::checkpoint_header_bytes];
    const std::string dir = optim_detail::not_a_file(path);
    OCTET_REQUIRE(dir.empty(), "octet::read_adamw_checkpoint_info", "path", "'" + path + "' " + dir);
    std::FILE* f = std::fopen(path.c_str(), "rb");
    OCTET_REQUIRE(f != nullptr, "octet::read_adamw_checkpoint_info", "path",
                  "'" + path + "' cannot be opened for reading");
    const bool complete = std::fread(h, 1, sizeof h, f) == sizeof h;
    std::fclose(f);
    OCTET_REQUIRE(complete, "octet::read_adamw_checkpoint_info", "path",
                  "'" + path + "' is truncated (shorter than the header)");
    const std::string why = optim_detail::parse_header(h, info);
    OCTET_REQUIRE(why.empty(), "octet::read_adamw_checkpoint_info", "path", "'" + path + "' " + why);
    return info;
}

/// Verifies the whole file, then fills `state` (whose codecs, master policy, size and offset must
/// match the file's) and returns the header. On any error the state is untouched.
template <class MC, class VC, class M>
adamw_checkpoint_info load_adamw_checkpoint(const std::string& path, const adamw_state_ref<MC, VC, M>& state) {
    constexpr const char* fn = "octet::load_adamw_checkpoint";
    optim_detail::check_state(fn, state);
    adamw_checkpoint_info info;
    std::string why = optim_detail::read_checkpoint<MC, VC, M>(path, nullptr, info);  // pass 1: verify only
    if (why.empty() && (info.elements != state.size() || info.element_offset != state.element_offset))
        why = detail::message("holds ", info.elements, " elements at offset ", info.element_offset, "; this state has ",
                              state.size(), " at offset ", state.element_offset);
    OCTET_REQUIRE(why.empty(), fn, "path", "'" + path + "' " + why);
    why = optim_detail::read_checkpoint<MC, VC, M>(path, &state, info);  // pass 2: read
    OCTET_REQUIRE(why.empty(), fn, "path",
                  "'" + path + "' changed while it was loaded: " + why + " (the state is partly overwritten)");
    return info;
}

}  // namespace octet
