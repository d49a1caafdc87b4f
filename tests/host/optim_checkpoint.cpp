// Checkpoints of the compressed optimizer state: CRC-32 against its published check values and a
// bit-at-a-time oracle, the stated little-endian layout, round trips, bit-exact resume (N steps,
// save, load, M steps == N + M steps), truncated / corrupted / mismatched files raising
// octet::error with the state untouched, and the atomic save (a failed save loses nothing).
#include <doctest/doctest.h>

#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "octet/optim/checkpoint.hpp"
#include "octet/optim/optimizer.hpp"
#include "support/random.hpp"

// The largest single allocation while `tracking` is set: checks that loading a tiny state does
// not allocate a megabyte per section. (Replacing the global operator new is allowed in a
// program; each test file is its own program.)
static std::atomic<bool> tracking{false};
static std::atomic<std::size_t> largest_allocation{0};
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"  // GCC pairs the replaced new/delete with malloc/free itself
#endif
void* operator new(std::size_t size) {
    if (tracking.load(std::memory_order_relaxed)) {
        std::size_t seen = largest_allocation.load();
        while (size > seen && !largest_allocation.compare_exchange_weak(seen, size)) {
        }
    }
    if (void* p = std::malloc(size ? size : 1)) return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
    std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
    std::free(p);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

using namespace octet;

namespace {

/// A fresh scratch path per test (the test's pid and a counter).
std::string scratch(const char* name) {
    static int counter = 0;
    return "/tmp/octet_optim_ckpt_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" + name;
}

/// The files in path's folder whose names start with path's name (temporaries included), sorted.
std::vector<std::string> files_starting_with(const std::string& path) {
    const std::size_t slash = path.find_last_of('/');
    const std::string folder = path.substr(0, slash), name = path.substr(slash + 1);
    std::vector<std::string> out;
    if (DIR* d = ::opendir(folder.c_str())) {
        while (const dirent* e = ::readdir(d))
            if (std::string(e->d_name).compare(0, name.size(), name) == 0) out.push_back(folder + "/" + e->d_name);
        ::closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
}

std::vector<unsigned char> read_all(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<unsigned char>(std::istreambuf_iterator<char>(f), {});
}
void write_all(const std::string& path, const std::vector<unsigned char>& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

/// Bit-at-a-time CRC-32 (reflected 0xEDB88320): the independent oracle for the table version.
std::uint32_t crc32_bitwise(const unsigned char* p, std::size_t n) {
    std::uint32_t c = 0xFFFFFFFFu;
    for (std::size_t i = 0; i < n; ++i) {
        c ^= p[i];
        for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

std::vector<float> normal_vec(std::mt19937_64& g, std::size_t n, float sd = 1.0f) {
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

template <class State>
bool same_bits(const State& a, const State& b) {
    auto eq = [](const auto& x, const auto& y) {
        return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0);
    };
    return eq(a.params, b.params) && eq(a.compensation, b.compensation) && eq(a.m_codes, b.m_codes) &&
           eq(a.m_meta, b.m_meta) && eq(a.v_codes, b.v_codes) && eq(a.v_meta, b.v_meta);
}

using opt_t = adamw_optimizer<state_codec::e4m3_expanded, state_codec::dynamic8, master::bf16_kahan>;

opt_t trained(std::size_t n, int steps, std::uint64_t salt) {
    auto g = octet_test::rng(salt);
    adamw_hyper h;
    h.seed = 11;
    h.on_nonfinite = grad_nonfinite_policy::zero_block;
    opt_t opt(n, h);
    opt.state.set_params(as_cspan(normal_vec(g, n)));
    for (int t = 0; t < steps; ++t) opt.step(on_host(), as_cspan(normal_vec(g, n, 0.01f)), 1e-3f);
    return opt;
}

}  // namespace

TEST_CASE("CRC-32: published check values, incremental use, and a bit-at-a-time oracle") {
    CHECK(crc32("", 0) == 0x00000000u);
    CHECK(crc32("a", 1) == 0xE8B7BE43u);
    CHECK(crc32("abc", 3) == 0x352441C2u);
    CHECK(crc32("123456789", 9) == 0xCBF43926u);  // the standard check value of CRC-32/ISO-HDLC
    const char* fox = "The quick brown fox jumps over the lazy dog";
    CHECK(crc32(fox, std::strlen(fox)) == 0x414FA339u);
    auto g = octet_test::rng(20);
    std::vector<unsigned char> data(10007);
    for (auto& b : data) b = static_cast<unsigned char>(g());
    CHECK(crc32(data.data(), data.size()) == crc32_bitwise(data.data(), data.size()));
    for (std::size_t cut : {0, 1, 7, 8, 9, 4096, 10006}) {
        const std::uint32_t a = crc32_update(crc32_update(0, data.data(), cut), data.data() + cut, data.size() - cut);
        CHECK(a == crc32(data.data(), data.size()));
    }
}

TEST_CASE("the file is little-endian with the stated layout") {
    const std::size_t n = 300;
    const opt_t opt = trained(n, 3, 21);
    const std::string path = scratch("layout");
    save_adamw_checkpoint(path, const_cast<opt_t&>(opt).state.ref(), opt.hyper, opt.steps);
    const auto f = read_all(path);
    REQUIRE(f.size() > 200);
    CHECK(std::memcmp(f.data(), "OCTETADW", 8) == 0);
    CHECK((f[8] == 1 && f[9] == 0 && f[10] == 0 && f[11] == 0));                                // version 1, LE
    CHECK((f[24] == static_cast<unsigned char>(state_codec_id::e4m3_expanded) && f[25] == 0));  // m codec id
    CHECK((f[28] == static_cast<unsigned char>(state_codec_id::dynamic8) && f[29] == 0));
    CHECK((f[32] == static_cast<unsigned char>(master_weights_id::bf16_kahan)));
    CHECK((f[40] == (n & 0xFF) && f[41] == (n >> 8) && f[42] == 0));  // elements, u64 LE
    CHECK(f[56] == 3);                                                // steps taken
    std::uint32_t beta1 = 0;
    for (int i = 3; i >= 0; --i) beta1 = (beta1 << 8) | f[72 + i];
    CHECK(bits_to_float(beta1) == opt.hyper.beta1);
    // first section: id 1, 2 bytes per element (bf16 weights), n elements; payload at 96 + 24
    CHECK((f[96] == 1 && f[100] == 2 && f[104] == (n & 0xFF)));
    const std::uint16_t w0 = static_cast<std::uint16_t>(f[120] | (f[121] << 8));
    CHECK(w0 == opt.state.params[0].bits);
    CHECK(std::memcmp(f.data() + f.size() - 8, "OCTETEND", 8) == 0);
    const auto info = read_adamw_checkpoint_info(path);
    CHECK(info.elements == n);
    CHECK(info.steps == 3);
    CHECK(info.hyper.seed == 11);
    CHECK(info.hyper.on_nonfinite == grad_nonfinite_policy::zero_block);
    CHECK(info.octet_major == version_major);
    std::remove(path.c_str());
}

TEST_CASE_TEMPLATE(
    "resume is bit-exact: N steps, save, load, M steps == N + M steps", Cfg, adamw_optimizer<state_codec::fp32>,
    adamw_optimizer<state_codec::dynamic8, state_codec::dynamic8, master::bf16_stochastic>,
    adamw_optimizer<state_codec::e4m3_scaled, state_codec::e4m3_expanded, master::bf16_kahan>,
    adamw_optimizer<state_codec::bf16, state_codec::bf16, master::bf16_nearest>,
    adamw_optimizer<state_codec::bf16_stochastic, state_codec::bf16_stochastic, master::bf16_stochastic>) {
    auto g = octet_test::rng(22);
    const std::size_t n = 2000;
    const auto w0 = normal_vec(g, n);
    std::vector<std::vector<float>> grads;
    for (int t = 0; t < 12; ++t) grads.push_back(normal_vec(g, n, 0.02f));
    adamw_hyper h;
    h.seed = 1234;
    auto lr = [](int t) { return 1e-3f * (1.0f + 0.1f * static_cast<float>(t)); };

    Cfg straight(n, h);
    straight.state.set_params(as_cspan(w0));
    for (int t = 0; t < 12; ++t) straight.step(on_host(), as_cspan(grads[t]), lr(t));

    Cfg first(n, h);
    first.state.set_params(as_cspan(w0));
    for (int t = 0; t < 7; ++t) first.step(on_host(), as_cspan(grads[t]), lr(t));
    const std::string path = scratch("resume");
    first.save(path);
    Cfg resumed(n, adamw_hyper{});  // hyperparameters and the step count come from the file
    resumed.load(path);
    CHECK(resumed.steps == 7);
    CHECK(resumed.hyper.seed == 1234);
    for (int t = 7; t < 12; ++t) resumed.step(on_host(), as_cspan(grads[t]), lr(t));
    CHECK(same_bits(resumed.state, straight.state));
    CHECK(resumed.steps == straight.steps);
    std::remove(path.c_str());
}

TEST_CASE("truncated and corrupted files raise octet::error and leave the state untouched") {
    const std::size_t n = 700;
    opt_t opt = trained(n, 4, 23);
    const std::string path = scratch("bad");
    opt.save(path);
    const auto good = read_all(path);
    opt_t target = trained(n, 2, 24);  // a different state to load into
    const auto before = target.state;

    auto expect_failure = [&](const std::vector<unsigned char>& bytes, const char* what) {
        write_all(path, bytes);
        CHECK_THROWS_WITH_AS(target.load(path), doctest::Contains(what), octet::error);
        CHECK(same_bits(target.state, before));
    };
    // truncation anywhere: header, section header, payload, checksum, trailer
    for (std::size_t len : {std::size_t{0}, std::size_t{5}, std::size_t{95}, std::size_t{96}, std::size_t{110},
                            std::size_t{500}, good.size() / 2, good.size() - 13, good.size() - 1}) {
        INFO("truncated to " << len << " bytes");
        expect_failure(std::vector<unsigned char>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len)),
                       len < 8 ? "truncated" : "truncated");
    }
    // one flipped bit anywhere is caught by a checksum (or the magic / end marker)
    auto g = octet_test::rng(25);
    for (int trial = 0; trial < 40; ++trial) {
        auto bad = good;
        const std::size_t pos = static_cast<std::size_t>(g() % bad.size());
        bad[pos] ^= static_cast<unsigned char>(1u << (g() % 8));
        INFO("bit flipped in byte " << pos);
        write_all(path, bad);
        CHECK_THROWS_AS(target.load(path), octet::error);
        CHECK(same_bits(target.state, before));
    }
    // a payload flip names the corruption
    {
        auto bad = good;
        bad[200] ^= 0x10;
        expect_failure(bad, "corrupted");
    }
    // trailing garbage
    {
        auto bad = good;
        bad.push_back(0);
        expect_failure(bad, "after its end marker");
    }
    // not a checkpoint at all
    expect_failure(std::vector<unsigned char>(200, 0x41), "bad magic");
    // a newer format version (header CRC recomputed so that only the version is wrong)
    {
        auto bad = good;
        bad[8] = 2;
        const std::uint32_t c = crc32(bad.data(), 92);
        for (int i = 0; i < 4; ++i) bad[92 + i] = static_cast<unsigned char>(c >> (8 * i));
        expect_failure(bad, "format version 2");
    }
    // the good file still loads
    write_all(path, good);
    target.load(path);
    CHECK(same_bits(target.state, opt.state));
    CHECK_THROWS_WITH_AS(target.load(path + ".missing"), doctest::Contains("cannot be opened"), octet::error);
    std::remove(path.c_str());
}

TEST_CASE("a checkpoint of another configuration or size is refused") {
    const std::string path = scratch("mismatch");
    opt_t opt = trained(500, 2, 26);
    opt.save(path);
    adamw_optimizer<state_codec::dynamic8, state_codec::dynamic8, master::bf16_kahan> other_codec(500);
    CHECK_THROWS_WITH_AS(other_codec.load(path), doctest::Contains("e4m3_expanded/dynamic8 with bf16_kahan"),
                         octet::error);
    adamw_optimizer<state_codec::e4m3_expanded, state_codec::dynamic8, master::bf16_stochastic> other_master(500);
    CHECK_THROWS_WITH_AS(other_master.load(path), doctest::Contains("master weights"), octet::error);
    opt_t other_size(512);
    CHECK_THROWS_WITH_AS(other_size.load(path), doctest::Contains("holds 500 elements"), octet::error);
    // a shard's checkpoint records its offset
    auto shard = opt.state.ref().shard(256, 244);
    const std::string shard_path = scratch("shard");
    save_adamw_checkpoint(shard_path, shard, opt.hyper, opt.steps);
    CHECK(read_adamw_checkpoint_info(shard_path).element_offset == 256);
    CHECK_THROWS_WITH_AS(load_adamw_checkpoint(shard_path, opt.state.ref().shard(0, 244)),
                         doctest::Contains("at offset 256"), octet::error);
    load_adamw_checkpoint(shard_path, shard);
    std::remove(path.c_str());
    std::remove(shard_path.c_str());
}

TEST_CASE("saving is atomic: a failed save leaves the previous checkpoint intact") {
    const std::string path = scratch("atomic");
    opt_t opt = trained(600, 3, 27);
    opt.save(path);
    const auto saved = read_all(path);
    // make the next save fail half-way, as a full disk does: files may not grow past 1000 bytes
    opt.step(on_host(), as_cspan(std::vector<float>(600, 0.1f)), 1e-3f);
    {
        const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
        rlimit old_limit{};
        REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
        rlimit small = old_limit;
        small.rlim_cur = 1000;
        REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
        CHECK_THROWS_WITH_AS(opt.save(path), doctest::Contains("disk full or I/O error"), octet::error);
        REQUIRE(::setrlimit(RLIMIT_FSIZE, &old_limit) == 0);
        std::signal(SIGXFSZ, old_handler);
    }
    CHECK(read_all(path) == saved);                                      // the old checkpoint, byte for byte
    CHECK(files_starting_with(path) == std::vector<std::string>{path});  // and the partial temporary is gone
    opt_t reloaded(600);
    reloaded.load(path);
    CHECK(reloaded.steps == 3);
    // a save into a folder that does not exist fails cleanly too
    CHECK_THROWS_AS(opt.save("/nonexistent_octet_dir/x.ckpt"), octet::error);
    std::remove(path.c_str());
}

TEST_CASE("concurrent saves to one path: each writes its own temporary, the file is always one whole checkpoint") {
    char folder_template[] = "/tmp/octet_ckpt_concurrent_XXXXXX";
    REQUIRE(::mkdtemp(folder_template) != nullptr);
    const std::string folder = folder_template, path = folder + "/state.ckpt";
    opt_t a = trained(700, 3, 30), b = trained(700, 5, 31);
    std::atomic<int> failures{0};
    auto saver = [&](opt_t& opt) {
        for (int k = 0; k < 25; ++k) {
            try {
                opt.save(path);
            } catch (const octet::error&) {
                failures += 1;
            }
        }
    };
    std::thread ta(saver, std::ref(a)), tb(saver, std::ref(b));
    ta.join();
    tb.join();
    CHECK(failures == 0);
    CHECK(files_starting_with(path) == std::vector<std::string>{path});  // no temporaries left over
    opt_t loaded(700);
    loaded.load(path);  // verifies every checksum
    CHECK((same_bits(loaded.state, a.state) || same_bits(loaded.state, b.state)));
    CHECK((loaded.steps == 3 || loaded.steps == 5));
    std::remove(path.c_str());
    ::rmdir(folder.c_str());
}

TEST_CASE("a save to a bare file name flushes the current folder") {
    char folder_template[] = "/tmp/octet_ckpt_cwd_XXXXXX";
    REQUIRE(::mkdtemp(folder_template) != nullptr);
    char old_cwd[4096];
    REQUIRE(::getcwd(old_cwd, sizeof old_cwd) != nullptr);
    REQUIRE(::chdir(folder_template) == 0);
    opt_t opt = trained(300, 2, 32);
    CHECK_NOTHROW(opt.save("bare.ckpt"));
    opt_t loaded(300);
    loaded.load("bare.ckpt");
    CHECK(same_bits(loaded.state, opt.state));
    std::remove("bare.ckpt");
    REQUIRE(::chdir(old_cwd) == 0);
    ::rmdir(folder_template);
}

TEST_CASE("a folder is reported as a folder, not as a truncated file") {
    char folder_template[] = "/tmp/octet_ckpt_dir_XXXXXX";
    REQUIRE(::mkdtemp(folder_template) != nullptr);
    const std::string folder = folder_template;
    opt_t opt = trained(300, 2, 33);
    const auto before = opt.state;
    CHECK_THROWS_WITH_AS(opt.load(folder), doctest::Contains("is a directory"), octet::error);
    CHECK(same_bits(opt.state, before));
    CHECK_THROWS_WITH_AS(read_adamw_checkpoint_info(folder), doctest::Contains("is a directory"), octet::error);
    CHECK_THROWS_WITH_AS(opt.save(folder), doctest::Contains("is a directory"), octet::error);
    CHECK(files_starting_with(folder) == std::vector<std::string>{folder});  // the save left no temporary beside it
    ::rmdir(folder.c_str());
}

TEST_CASE("every header field is range-checked at load (the header CRC recomputed each time)") {
    const std::size_t n = 512;
    opt_t opt = trained(n, 3, 34);
    const std::string path = scratch("fields");
    opt.save(path);
    const auto good = read_all(path);
    opt_t target = trained(n, 1, 35);
    const auto before = target.state;
    auto with = [&](std::size_t at, std::uint32_t value, int bytes) {
        auto bad = good;
        for (int i = 0; i < bytes; ++i)
            bad[at + static_cast<std::size_t>(i)] = static_cast<unsigned char>(value >> (8 * i));
        const std::uint32_t c = crc32(bad.data(), 92);
        for (int i = 0; i < 4; ++i) bad[92 + i] = static_cast<unsigned char>(c >> (8 * i));
        return bad;
    };
    struct field {
        std::size_t at;
        std::uint32_t value;
        int bytes;
        const char* says;
    };
    const field fields[] = {{12, 1, 4, "reserved"},
                            {22, 5, 2, "reserved"},
                            {24, 99, 4, "unknown first-moment codec id 99"},
                            {28, 0, 4, "unknown second-moment codec id 0"},
                            {32, 7, 4, "unknown master-weights id 7"},
                            {36, 0, 4, "unknown non-finite policy id 0"},
                            {36, 3, 4, "unknown non-finite policy id 3"},
                            {48, 100, 4, "offsets are multiples of 256"},
                            {72, float_to_bits(1.0f), 4, "beta1 1"},
                            {76, float_to_bits(-0.5f), 4, "must lie in [0, 1)"},
                            {76, 0x7FC00000u, 4, "must lie in [0, 1)"},
                            {80, float_to_bits(0.0f), 4, "has eps 0"},
                            {80, 0x7F800000u, 4, "has eps inf"},
                            {84, float_to_bits(-1.0f), 4, "has weight_decay -1"}};
    for (const field& f : fields) {
        INFO("byte " << f.at << " = " << f.value);
        write_all(path, with(f.at, f.value, f.bytes));
        CHECK_THROWS_WITH_AS(target.load(path), doctest::Contains(f.says), octet::error);
        CHECK_THROWS_WITH_AS(read_adamw_checkpoint_info(path), doctest::Contains(f.says), octet::error);
        CHECK(same_bits(target.state, before));
    }
    // the same edits with in-range values load (the check is not stricter than the format)
    write_all(path, with(36, static_cast<std::uint32_t>(grad_nonfinite_policy::skip_step), 4));
    CHECK(read_adamw_checkpoint_info(path).hyper.on_nonfinite == grad_nonfinite_policy::skip_step);
    write_all(path, with(84, float_to_bits(0.0f), 4));
    CHECK(read_adamw_checkpoint_info(path).hyper.weight_decay == 0.0f);
    std::remove(path.c_str());
}

TEST_CASE("section reads and writes allocate by what the section holds, not 1 MiB each") {
    using small_t = adamw_optimizer<state_codec::fp32>;
    small_t opt(256);
    const std::string path = scratch("small");
    tracking = true;
    opt.save(path);
    small_t loaded(256);
    loaded.load(path);
    tracking = false;
    MESSAGE("largest allocation while saving and loading a 256-element state: " << largest_allocation.load()
                                                                                << " bytes");
    CHECK(largest_allocation.load() <= 4096);  // a section of 256 floats is 1 KiB
    CHECK(same_bits(loaded.state, opt.state));
    // a large state still streams in chunks of at most 1 MiB
    small_t big(600000);
    big.save(path);
    largest_allocation = 0;
    tracking = true;
    big.load(path);
    tracking = false;
    CHECK(largest_allocation.load() <= (std::size_t{1} << 20) + 4096);
    std::remove(path.c_str());
}
