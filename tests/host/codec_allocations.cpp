// Every byte through the caller: the host gradient codecs (encode_gradient, encode_gradient_transformed,
// decode_gradient, decode_gradient_transformed), the transforms, adamw_step / count_nonfinite, the
// moment and array conversions and the RL operations. For each, on on_host(pool) and on_host(1):
//   (a) without an allocator, an operation that needs scratch makes global allocations (the counter
//       sees them) and one that needs none makes zero;
//   (b) with with_allocator(ex, lent): zero global allocations around the call, the lent allocator
//       balanced, its peak <= the operation's ..._scratch_bytes query, the outputs bit-identical to
//       the default executor's;
//   (c) an allocator that returns null: octet::error (operations without scratch never ask it), and
//       nothing is given back that was not taken.
// Inputs are fresh random values (support/random.hpp) with zeros, subnormals, outliers and non-finite
// entries where the operation defines them.
#include "support/counting_allocator.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "octet/codec/codec.hpp"
#include "octet/codec/feedback.hpp"
#include "octet/codec/hadamard.hpp"
#include "octet/format/convert.hpp"
#include "octet/optim/adamw.hpp"
#include "octet/optim/moments.hpp"
#include "octet/rl/crossings.hpp"
#include "octet/rl/surrogate.hpp"
#include "support/random.hpp"

namespace {
using namespace octet;
using bytes = std::vector<std::uint8_t>;

template <class T>
void append(bytes& out, const T* p, std::size_t n) {
    const auto* b = reinterpret_cast<const std::uint8_t*>(p);
    out.insert(out.end(), b, b + n * sizeof(T));
}
template <class T>
void append(bytes& out, const std::vector<T>& v) {
    append(out, v.data(), v.size());
}
template <class T>
void append_value(bytes& out, const T& v) {
    append(out, &v, 1);
}

/// An allocator that refuses every request (returns null) and counts what it was asked.
struct refusing_allocator {
    long allocations = 0, deallocations = 0;
    host_allocator ref() {
        host_allocator a;
        a.context = this;
        a.allocate = [](void* c, std::size_t) -> void* {
            ++static_cast<refusing_allocator*>(c)->allocations;
            return nullptr;
        };
        a.deallocate = [](void* c, void*, std::size_t) { ++static_cast<refusing_allocator*>(c)->deallocations; };
        return a;
    }
};

/// One operation under test: prepare() resets its outputs (and in-out state), call(ex) runs it and
/// nothing else, result() snapshots its outputs, scratch(ex) is its ..._scratch_bytes (0: none).
template <class P, class C, class R, class S>
struct op_case {
    P prepare;
    C call;
    R result;
    S scratch;
};
template <class P, class C, class R, class S>
op_case<P, C, R, S> make_case(P p, C c, R r, S s) {
    return {p, c, r, s};
}
const auto no_scratch = [](const host_executor&) { return std::size_t{0}; };

/// Runs the checks (a)-(c) of the header comment on one operation.
template <class Case>
void check_op(thread_pool& pool, const Case& c) {
    c.prepare();
    c.call(on_host());
    const bytes want = c.result();
    const host_executor bases[] = {on_host(pool), on_host(1)};
    for (const host_executor& base : bases) {
        CAPTURE(base.thread_count());
        const std::size_t need = c.scratch(base);
        CAPTURE(need);
        long global = 0;

        // (a) no allocator: the scratch comes from ::operator new, and the counter sees it
        c.prepare();
        {
            octet_test::global_allocations counted;
            c.call(base);
            global = counted.count();
        }
        if (need > 0)
            CHECK(global > 0);
        else
            CHECK(global == 0);
        CHECK(c.result() == want);

        // (b) the lent allocator serves everything
        octet_test::lent_allocator lent;
        const host_executor lent_ex = with_allocator(base, lent.ref());
        c.prepare();
        {
            octet_test::global_allocations counted;
            c.call(lent_ex);
            global = counted.count();
        }
        CHECK(global == 0);
        CHECK(lent.balanced());
        CHECK(lent.peak <= need);
        CHECK(lent.allocations == (need > 0 ? 1 : 0));
        CHECK(c.result() == want);

        // (c) an allocator that cannot serve
        refusing_allocator refusing;
        const host_executor refusing_ex = with_allocator(base, refusing.ref());
        c.prepare();
        if (need > 0) {
            CHECK_THROWS_AS(c.call(refusing_ex), octet::error);
            CHECK(refusing.allocations == 1);
        } else {
            CHECK_NOTHROW(c.call(refusing_ex));
            CHECK(refusing.allocations == 0);
            CHECK(c.result() == want);
        }
        CHECK(refusing.deallocations == 0);
    }
}

std::vector<float> uniform(std::mt19937_64& g, std::size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

/// A residual of n elements holding random values (a state mid-run), and its bytes.
struct residual_fixture {
    error_feedback fb;
    bytes initial;
    residual_fixture(std::mt19937_64& g, std::size_t n, residual_storage s) : fb(n, s) {
        const std::vector<float> r = octet_test::with_edge_cases(g, n, 0.01f);
        store_residual(fb.view(), 0, n, r.data());
        const residual_view v = fb.view();
        initial.assign(v.data, v.data + v.bytes());
    }
    void reset() {
        const residual_view v = fb.view();
        if (!initial.empty()) std::memcpy(v.data, initial.data(), initial.size());
    }
    void append_to(bytes& out) {
        const residual_view v = fb.view();
        append(out, v.data, v.bytes());
    }
};

struct codec_variant {
    wire_format format;
    transform_kind transform;
    std::uint32_t block;
    bool stochastic;
    int feedback;  ///< -1: none, else a residual_storage
    std::size_t n;
};

const codec_variant codec_variants[] = {
    {wire_format::e4m3, transform_kind::hadamard, 1024, false, -1, 200003},
    {wire_format::e4m3, transform_kind::hadamard, 1024, false, 1, 200003},
    {wire_format::nvfp4, transform_kind::hadamard, 256, true, 2, 200003},
    {wire_format::mxfp8, transform_kind::identity, 1024, false, -1, 200003},
    {wire_format::e5m2, transform_kind::identity, 1024, true, 0, 200003},
    {wire_format::e4m3, transform_kind::hadamard, 32768, false, 0, 150001},
    {wire_format::e5m2, transform_kind::hadamard, 1024, false, 1, 37},
    {wire_format::nvfp4, transform_kind::hadamard, 1024, false, -1, 0},
    {wire_format::e4m3, transform_kind::identity, 1024, false, 2, 0},
};

}  // namespace

TEST_CASE("codec: encode_gradient and encode_gradient_transformed take every temporary from the lent allocator") {
    thread_pool pool(3);
    auto g = octet_test::rng(9101);
    for (const codec_variant& v : codec_variants) {
        CAPTURE(wire_format_name(v.format));
        CAPTURE(transform_name(v.transform));
        CAPTURE(v.block);
        CAPTURE(v.feedback);
        CAPTURE(v.n);
        codec_config cfg;
        cfg.format = v.format;
        cfg.transform = v.transform;
        cfg.block = v.block;
        cfg.stochastic = v.stochastic;
        cfg.seed = g();
        const std::vector<float> x = octet_test::with_edge_cases(g, v.n, 1.0f, v.format != wire_format::nvfp4);
        const std::size_t L = static_cast<std::size_t>(transform_length(v.transform, v.n, v.block));
        const std::vector<float> y = octet_test::with_edge_cases(g, L, 2.0f);
        residual_fixture res(g, v.n,
                             v.feedback < 0 ? residual_storage::f32 : static_cast<residual_storage>(v.feedback));
        encode_options opt;
        opt.first_index = g() % 100000;
        opt.random_stream = g() % 7;
        if (v.feedback >= 0) opt.feedback = res.fb.view();
        bytes msg(encoded_size(cfg, v.n));
        encode_result got{};

        for (const bool transformed : {false, true}) {
            CAPTURE(transformed);
            check_op(pool, make_case(
                               [&] {
                                   res.reset();
                                   std::fill(msg.begin(), msg.end(), std::uint8_t{0xA5});
                                   got = encode_result{};
                               },
                               [&](const host_executor& ex) {
                                   got = transformed
                                             ? encode_gradient_transformed(ex, cfg, as_cspan(y), v.n, as_span(msg), opt)
                                             : encode_gradient(ex, cfg, as_cspan(x), as_span(msg), opt);
                               },
                               [&] {
                                   bytes out = msg;
                                   res.append_to(out);
                                   append_value(out, got.bytes);
                                   append_value(out, got.amax);
                                   return out;
                               },
                               [&](const host_executor& ex) {
                                   return transformed ? encode_gradient_transformed_scratch_bytes(ex, cfg, v.n, opt)
                                                      : encode_gradient_scratch_bytes(ex, cfg, v.n, opt);
                               }));
        }
    }
}

TEST_CASE("codec: decode_gradient and decode_gradient_transformed take every temporary from the lent allocator") {
    thread_pool pool(3);
    auto g = octet_test::rng(9102);
    for (const codec_variant& v : codec_variants) {
        CAPTURE(wire_format_name(v.format));
        CAPTURE(transform_name(v.transform));
        CAPTURE(v.block);
        CAPTURE(v.n);
        codec_config cfg;
        cfg.format = v.format;
        cfg.transform = v.transform;
        cfg.block = v.block;
        cfg.stochastic = v.stochastic;
        cfg.seed = g();
        const std::vector<float> x = octet_test::with_edge_cases(g, v.n, 1.0f, v.format != wire_format::nvfp4);
        bytes msg(encoded_size(cfg, v.n));
        encode_options opt;
        opt.first_index = g() % 100000;
        encode_gradient(on_host(), cfg, as_cspan(x), as_span(msg), opt);
        const wire_header h = read_wire_header(as_cspan(msg));
        // the query from a received header's configuration is the query from the sender's
        for (const host_executor ex : {on_host(1), on_host(3), on_host()})
            CHECK(decode_gradient_scratch_bytes(ex, config_of(h), v.n) == decode_gradient_scratch_bytes(ex, cfg, v.n));
        if (v.transform == transform_kind::identity) CHECK(decode_gradient_scratch_bytes(on_host(3), cfg, v.n) == 0);

        std::vector<float> out(v.n);
        check_op(pool, make_case([&] { std::fill(out.begin(), out.end(), -7.0f); },
                                 [&](const host_executor& ex) { decode_gradient(ex, as_cspan(msg), as_span(out)); },
                                 [&] {
                                     bytes r;
                                     append(r, out);
                                     return r;
                                 },
                                 [&](const host_executor& ex) { return decode_gradient_scratch_bytes(ex, cfg, v.n); }));

        const std::size_t L = static_cast<std::size_t>(transform_length(v.transform, v.n, v.block));
        const std::vector<float> y0 = octet_test::with_edge_cases(g, L, 1.0f);
        std::vector<float> y(L);
        for (const bool add : {false, true}) {
            CAPTURE(add);
            check_op(pool, make_case([&] { y = y0; },
                                     [&](const host_executor& ex) {
                                         decode_gradient_transformed(ex, as_cspan(msg), as_span(y), add);
                                     },
                                     [&] {
                                         bytes r;
                                         append(r, y);
                                         return r;
                                     },
                                     no_scratch));
        }
    }
}

TEST_CASE("codec: the host encode and decode stream the message: their scratch does not grow with n") {
    // A span is 16 K coordinates (or the transform block, if larger); each thread at work holds at
    // most three spans of floats and one transform block's floats and sign words.
    for (const wire_format f : {wire_format::e4m3, wire_format::mxfp8, wire_format::nvfp4})
        for (const transform_kind t : {transform_kind::identity, transform_kind::hadamard})
            for (const std::uint32_t block : {1024u, 32768u})
                for (const int threads : {1, 3}) {
                    CAPTURE(wire_format_name(f));
                    CAPTURE(transform_name(t));
                    CAPTURE(block);
                    CAPTURE(threads);
                    codec_config cfg;
                    cfg.format = f;
                    cfg.transform = t;
                    cfg.block = block;
                    const host_executor ex = on_host(threads);
                    error_feedback fb(1);
                    encode_options with_fb;
                    with_fb.feedback = fb.view();  // only whether it is empty matters to the query
                    const std::size_t span = std::max<std::size_t>(16384, block);
                    const std::size_t bound =
                        static_cast<std::size_t>(threads) * ((4 * span + block / 32 + 2) * sizeof(float) + 64) + 4096;
                    const std::size_t big = (std::size_t{1} << 24) + 7;  // 64 MiB of floats
                    for (const std::size_t n : {std::size_t{1} << 20, big}) {
                        CAPTURE(n);
                        const encode_options none;
                        CHECK(encode_gradient_scratch_bytes(ex, cfg, n, with_fb) <= bound);
                        CHECK(encode_gradient_transformed_scratch_bytes(ex, cfg, n, with_fb) <= bound);
                        CHECK(encode_gradient_scratch_bytes(ex, cfg, n, none) <= bound);
                        CHECK(decode_gradient_scratch_bytes(ex, cfg, n) <= bound);
                    }
                    CHECK(encode_gradient_scratch_bytes(ex, cfg, big, with_fb) ==
                          encode_gradient_scratch_bytes(ex, cfg, std::size_t{1} << 20, with_fb));
                }
}

TEST_CASE("codec: transform_forward and transform_inverse take their scratch from the lent allocator") {
    thread_pool pool(3);
    auto g = octet_test::rng(9103);
    struct variant {
        transform_kind kind;
        std::uint32_t block;
        std::size_t n;
    };
    for (const variant v :
         {variant{transform_kind::hadamard, 1024, 300001}, variant{transform_kind::hadamard, 16, 70001},
          variant{transform_kind::hadamard, 32768, 100000}, variant{transform_kind::hadamard, 1024, 5},
          variant{transform_kind::identity, 1024, 100001}, variant{transform_kind::hadamard, 64, 0}}) {
        CAPTURE(transform_name(v.kind));
        CAPTURE(v.block);
        CAPTURE(v.n);
        if (v.kind == transform_kind::identity) CHECK(transform_scratch_bytes(on_host(4), v.kind, v.n, v.block) == 0);
        const std::size_t L = static_cast<std::size_t>(transform_length(v.kind, v.n, v.block));
        const std::uint64_t seed = g(), first = g() % 100000;
        const std::vector<float> x = octet_test::with_edge_cases(g, v.n, 1.0f, true);
        const std::vector<float> y0 = octet_test::with_edge_cases(g, L, 1.0f);
        std::vector<float> y(L), xb(v.n);
        auto scratch = [&](const host_executor& ex) { return transform_scratch_bytes(ex, v.kind, v.n, v.block); };
        check_op(pool, make_case([&] { std::fill(y.begin(), y.end(), 3.0f); },
                                 [&](const host_executor& ex) {
                                     transform_forward(ex, v.kind, as_cspan(x), as_span(y), v.block, seed, first);
                                 },
                                 [&] {
                                     bytes r;
                                     append(r, y);
                                     return r;
                                 },
                                 scratch));
        check_op(pool, make_case([&] { std::fill(xb.begin(), xb.end(), 3.0f); },
                                 [&](const host_executor& ex) {
                                     transform_inverse(ex, v.kind, as_cspan(y0), as_span(xb), v.block, seed, first);
                                 },
                                 [&] {
                                     bytes r;
                                     append(r, xb);
                                     return r;
                                 },
                                 scratch));
    }
}

namespace {

template <class MC, class VC, class Master, class Grad>
void check_adamw(thread_pool& pool, std::mt19937_64& g, std::size_t n, grad_nonfinite_policy policy, bool non_finite) {
    CAPTURE(n);
    CAPTURE(static_cast<int>(policy));
    CAPTURE(non_finite);
    using St = adamw_state<MC, VC, Master>;
    St init(n);
    const std::vector<float> w0 = octet_test::with_edge_cases(g, n, 0.5f);
    init.set_params(as_cspan(w0));
    const std::vector<float> m = octet_test::with_edge_cases(g, n, 1e-3f);
    std::vector<float> v = uniform(g, n, 0.0f, 1e-5f);
    if (n > 3) v[3] = 0.0f;
    encode_moments<MC, moment::first>(on_host(), as_cspan(m), as_span(init.m_codes), as_span(init.m_meta));
    encode_moments<VC, moment::second>(on_host(), as_cspan(v), as_span(init.v_codes), as_span(init.v_meta));
    const std::vector<float> gf = octet_test::with_edge_cases(g, n, 1e-2f, non_finite);
    std::vector<Grad> grads(n);
    for (std::size_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<Grad, float>)
            grads[i] = gf[i];
        else
            grads[i] = to_bf16(gf[i]);
    }
    adamw_hyper h;
    h.on_nonfinite = policy;
    h.seed = g();
    const std::uint64_t step = 1 + g() % 1000;
    St st = init;
    adamw_report rep{};
    check_op(pool,
             make_case(
                 [&] {
                     st = init;
                     rep = adamw_report{};
                 },
                 [&](const host_executor& ex) { rep = adamw_step(ex, st.ref(), as_cspan(grads), h, step, 1e-3f); },
                 [&] {
                     bytes r;
                     append(r, st.params);
                     append(r, st.compensation);
                     append(r, st.m_codes);
                     append(r, st.m_meta);
                     append(r, st.v_codes);
                     append(r, st.v_meta);
                     append_value(r, rep.nonfinite_gradients);
                     append_value(r, rep.blocks_zeroed);
                     append_value(r, rep.skipped);
                     return r;
                 },
                 no_scratch));
    std::uint64_t count = 0;
    check_op(pool, make_case([&] { count = ~std::uint64_t{0}; },
                             [&](const host_executor& ex) { count = count_nonfinite(ex, as_cspan(grads)); },
                             [&] {
                                 bytes r;
                                 append_value(r, count);
                                 return r;
                             },
                             no_scratch));
}

template <class Codec, moment K>
void check_moments(thread_pool& pool, std::mt19937_64& g, std::size_t n) {
    CAPTURE(n);
    std::vector<float> x = K == moment::second ? uniform(g, n, 0.0f, 1e-4f) : octet_test::with_edge_cases(g, n, 1e-3f);
    if (K == moment::second && n > 2) x[2] = 0.0f;
    const philox_stream rng{g(), g()};
    std::vector<typename Codec::code_type> codes(n);
    std::vector<typename Codec::meta_type> meta(state_meta_count<Codec>(n));
    check_op(pool, make_case(
                       [&] {
                           std::fill(codes.begin(), codes.end(), typename Codec::code_type{});
                           std::fill(meta.begin(), meta.end(), typename Codec::meta_type{});
                       },
                       [&](const host_executor& ex) {
                           encode_moments<Codec, K>(ex, as_cspan(x), as_span(codes), as_span(meta), rng);
                       },
                       [&] {
                           bytes r;
                           append(r, codes);
                           append(r, meta);
                           return r;
                       },
                       no_scratch));
    std::vector<float> back(n);
    check_op(pool, make_case([&] { std::fill(back.begin(), back.end(), -1.0f); },
                             [&](const host_executor& ex) {
                                 decode_moments<Codec, K>(ex, as_cspan(codes), as_cspan(meta), as_span(back));
                             },
                             [&] {
                                 bytes r;
                                 append(r, back);
                                 return r;
                             },
                             no_scratch));
}

}  // namespace

TEST_CASE("optim: adamw_step, count_nonfinite and the moment conversions allocate nothing") {
    thread_pool pool(3);
    auto g = octet_test::rng(9104);
    for (const std::size_t n : {std::size_t{70001}, std::size_t{257}, std::size_t{0}}) {
        check_adamw<state_codec::fp32, state_codec::fp32, master::fp32, float>(pool, g, n,
                                                                               grad_nonfinite_policy::skip_step, false);
        check_adamw<state_codec::fp32, state_codec::fp32, master::fp32, float>(pool, g, n,
                                                                               grad_nonfinite_policy::skip_step, true);
        check_adamw<state_codec::dynamic8, state_codec::e4m3_expanded, master::bf16_stochastic, bf16>(
            pool, g, n, grad_nonfinite_policy::zero_block, true);
        check_adamw<state_codec::e4m3_scaled, state_codec::dynamic8, master::bf16_kahan, float>(
            pool, g, n, grad_nonfinite_policy::zero_block, true);
        check_adamw<state_codec::bf16_stochastic, state_codec::bf16, master::bf16_nearest, bf16>(
            pool, g, n, grad_nonfinite_policy::skip_step, false);
        check_moments<state_codec::dynamic8, moment::second>(pool, g, n);
        check_moments<state_codec::e4m3_scaled, moment::first>(pool, g, n);
        check_moments<state_codec::bf16_stochastic, moment::first>(pool, g, n);
    }
}

TEST_CASE("format: encode_array and decode_array allocate nothing") {
    thread_pool pool(3);
    auto g = octet_test::rng(9105);
    for (const std::size_t n : {std::size_t{300007}, std::size_t{33}, std::size_t{0}}) {
        CAPTURE(n);
        const std::vector<float> x = octet_test::with_edge_cases(g, n, 100.0f, true);
        std::vector<bf16> xb(n);
        std::vector<fp16> xh(n);
        for (std::size_t i = 0; i < n; ++i) xb[i] = to_bf16(x[i]), xh[i] = to_fp16(x[i]);
        const philox_stream rng{g(), g()};
        std::vector<std::uint8_t> codes(n);
        auto codes_result = [&] { return bytes(codes); };
        auto clear_codes = [&] { std::fill(codes.begin(), codes.end(), std::uint8_t{0x5A}); };
        check_op(pool,
                 make_case(
                     clear_codes, [&](const host_executor& ex) { encode_array<e4m3>(ex, as_cspan(x), as_span(codes)); },
                     codes_result, no_scratch));
        check_op(pool, make_case(
                           clear_codes,
                           [&](const host_executor& ex) {
                               encode_array<e5m2, round::stochastic>(ex, as_cspan(xb), as_span(codes), rng);
                           },
                           codes_result, no_scratch));
        check_op(pool, make_case(
                           clear_codes,
                           [&](const host_executor& ex) {
                               encode_array<e4m3, round::nearest_even, overflow::saturate>(ex, as_cspan(xh),
                                                                                           as_span(codes));
                           },
                           codes_result, no_scratch));
        std::vector<float> back(n);
        check_op(pool,
                 make_case([&] { std::fill(back.begin(), back.end(), -1.0f); },
                           [&](const host_executor& ex) { decode_array<e5m2>(ex, as_cspan(codes), as_span(back)); },
                           [&] {
                               bytes r;
                               append(r, back);
                               return r;
                           },
                           no_scratch));
    }
}

TEST_CASE("rl: clipped_surrogate and threshold_crossings take their scratch from the lent allocator") {
    thread_pool pool(3);
    auto g = octet_test::rng(9106);
    for (const std::size_t n : {std::size_t{250003}, std::size_t{4096}, std::size_t{17}, std::size_t{0}}) {
        CAPTURE(n);
        std::vector<float> lp_old = uniform(g, n, -8.0f, -0.01f);
        std::vector<float> lp_new(n), lp_low(n);
        std::normal_distribution<float> drift(0.0f, 0.15f), noise(0.0f, 0.01f);
        for (std::size_t i = 0; i < n; ++i) {
            lp_new[i] = lp_old[i] + drift(g);
            lp_low[i] = lp_new[i] + noise(g);
        }
        std::vector<float> adv = octet_test::with_edge_cases(g, n, 1.0f, true);
        if (n > 10) lp_new[5] = NAN, lp_old[7] = -INFINITY, lp_new[9] = lp_old[9] + 50.0f;  // non-finite, limited
        std::vector<std::int64_t> offsets{0};
        for (std::size_t o = 0; o < n;) {
            o = std::min(n, o + 1 + static_cast<std::size_t>(g() % 3000));
            offsets.push_back(static_cast<std::int64_t>(o));
        }
        if (offsets.size() < 2) offsets.push_back(0);

        std::vector<float> ratio(n), objective(n), grad(n);
        for (const loss_aggregation agg : {loss_aggregation::token_mean, loss_aggregation::sequence_mean}) {
            CAPTURE(static_cast<int>(agg));
            surrogate_config cfg;
            cfg.range = clip_range::asymmetric(0.2f, 0.28f);
            cfg.aggregation = agg;
            const span<const std::int64_t> seq =
                agg == loss_aggregation::sequence_mean ? as_cspan(offsets) : span<const std::int64_t>{};
            surrogate_stats st{};
            check_op(pool, make_case(
                               [&] {
                                   std::fill(ratio.begin(), ratio.end(), 0.5f);
                                   std::fill(objective.begin(), objective.end(), 0.5f);
                                   std::fill(grad.begin(), grad.end(), 0.5f);
                                   st = surrogate_stats{};
                               },
                               [&](const host_executor& ex) {
                                   st = clipped_surrogate(ex, as_cspan(lp_new), as_cspan(lp_old), as_cspan(adv), cfg,
                                                          {as_span(ratio), as_span(objective), as_span(grad)}, seq);
                               },
                               [&] {
                                   bytes r;
                                   append(r, ratio);
                                   append(r, objective);
                                   append(r, grad);
                                   append_value(r, st);
                                   return r;
                               },
                               [&](const host_executor& ex) { return clipped_surrogate_scratch_bytes(ex, n); }));
        }

        check_op(pool, make_case([&] { std::fill(ratio.begin(), ratio.end(), 0.5f); },
                                 [&](const host_executor& ex) {
                                     importance_ratios(ex, as_cspan(lp_new), as_cspan(lp_old), as_span(ratio));
                                 },
                                 [&] {
                                     bytes r;
                                     append(r, ratio);
                                     return r;
                                 },
                                 no_scratch));

        const std::size_t group = n % 17 == 0 ? 17 : 1;
        std::vector<float> rewards = octet_test::with_edge_cases(g, n, 1.0f, true), advantages(n);
        check_op(pool, make_case([&] { std::fill(advantages.begin(), advantages.end(), 0.5f); },
                                 [&](const host_executor& ex) {
                                     group_advantages(ex, as_cspan(rewards), group, as_span(advantages));
                                 },
                                 [&] {
                                     bytes r;
                                     append(r, advantages);
                                     return r;
                                 },
                                 no_scratch));

        const clip_range range = clip_range::symmetric(0.2f), low_range{0.79f, 1.21f};
        std::vector<float> ratio_low(n), ratio_high(n);
        importance_ratios(on_host(), as_cspan(lp_low), as_cspan(lp_old), as_span(ratio_low));
        importance_ratios(on_host(), as_cspan(lp_new), as_cspan(lp_old), as_span(ratio_high));
        crossing_report rep{};
        auto rep_result = [&] {
            bytes r;
            append_value(r, rep);
            return r;
        };
        auto crossing_scratch = [&](const host_executor& ex) { return threshold_crossings_scratch_bytes(ex, n); };
        check_op(pool, make_case([&] { rep = crossing_report{}; },
                                 [&](const host_executor& ex) {
                                     rep = threshold_crossings(ex, as_cspan(lp_low), as_cspan(lp_new), as_cspan(lp_old),
                                                               as_cspan(adv), range, low_range);
                                 },
                                 rep_result, crossing_scratch));
        check_op(pool, make_case([&] { rep = crossing_report{}; },
                                 [&](const host_executor& ex) {
                                     rep = threshold_crossings_from_ratios(ex, as_cspan(ratio_low),
                                                                           as_cspan(ratio_high), as_cspan(adv), range);
                                 },
                                 rep_result, crossing_scratch));
    }
}
