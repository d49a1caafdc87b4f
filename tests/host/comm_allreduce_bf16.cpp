// bf16 gradients through the gradient codec and the compressed all-reduce (octet/codec/codec.hpp,
// octet/comm/allreduce.hpp), against the float path as the oracle:
//   - encode_gradient of bf16 elements gives the message (and the residual) that encode_gradient
//     gives for their float values, bit for bit; decode_gradient into bf16 gives each float
//     decode rounded once to nearest even (the toolkit-independent to_bf16, itself checked against
//     the CUDA toolkit in tests/toolkit);
//   - compressed_allreduce_host over bf16 data, 1 to 4 in-process ranks, several steps with both
//     residuals: every step's result is the float all-reduce's of the widened gradients rounded to
//     bf16, and the residuals stay bit-identical to the float run's;
//   - each call takes one block from the lent allocator, at most compressed_allreduce_scratch_bytes<bf16>.
// Inputs: fresh random values with zeros, subnormals, outliers and 1e-6 magnitudes, ragged sizes
// (below the granule too: ranks with empty shards).
#include "support/counting_allocator.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "octet/codec/codec.hpp"
#include "octet/codec/feedback.hpp"
#include "octet/comm/allreduce.hpp"
#include "support/in_process_world.hpp"
#include "support/random.hpp"

namespace {
using namespace octet;

std::vector<bf16> to_bf16_vec(const std::vector<float>& x) {
    std::vector<bf16> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = to_bf16(x[i]);
    return y;
}
std::vector<float> widened(const std::vector<bf16>& x) {
    std::vector<float> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = to_float(x[i]);
    return y;
}
bool same_bf16(const bf16& a, const bf16& b) {
    return std::memcmp(&a, &b, sizeof a) == 0;
}

std::vector<std::uint8_t> bytes_of(error_feedback& f) {
    const residual_view v = f.view();
    return std::vector<std::uint8_t>(v.data, v.data + v.bytes());
}

/// A gradient as training produces one: the edge cases, a run of zeros (a padded row), and a run
/// of 1e-6 magnitudes.
std::vector<float> gradient(std::mt19937_64& g, std::size_t n) {
    auto x = octet_test::with_edge_cases(g, n, 0.02f);
    for (std::size_t i = 0; i < n / 8; ++i) x[i] = 0.0f;
    for (std::size_t i = n / 8; i < n / 4; ++i) x[i] *= 5e-5f;
    return x;
}

struct variant {
    wire_format format;
    transform_kind transform;
    std::uint32_t block;
    bool stochastic;
    residual_storage residuals;
};
const variant variants[] = {
    {wire_format::e4m3, transform_kind::hadamard, 1024, false, residual_storage::e4m3},
    {wire_format::e4m3, transform_kind::identity, 1024, false, residual_storage::f32},
    {wire_format::nvfp4, transform_kind::hadamard, 256, true, residual_storage::bf16},
    {wire_format::e5m2, transform_kind::identity, 1024, true, residual_storage::bf16},
};

codec_config config_of(const variant& v) {
    codec_config c;
    c.format = v.format;
    c.transform = v.transform;
    c.block = v.block;
    c.stochastic = v.stochastic;
    return c;
}

}  // namespace

TEST_CASE("codec: bf16 elements encode as their float values and decode rounded once") {
    auto g = octet_test::rng(71);
    for (const variant& v : variants) {
        const codec_config cfg = config_of(v);
        for (std::size_t n :
             {std::size_t{0}, std::size_t{1}, std::size_t{333}, std::size_t{4096 + 77}, std::size_t{40000}}) {
            CAPTURE(n);
            const auto xb = to_bf16_vec(gradient(g, n));
            const auto xf = widened(xb);
            std::vector<std::uint8_t> mf(encoded_size(cfg, n)), mb(encoded_size(cfg, n));
            error_feedback ff(n, v.residuals), fbb(n, v.residuals);
            for (int step = 0; step < 2; ++step) {
                encode_options of, ob;
                of.feedback = ff.view();
                ob.feedback = fbb.view();
                const host_executor ex = on_host(2);
                encode_gradient(ex, cfg, span<const float>(xf.data(), n), span<std::uint8_t>(mf.data(), mf.size()), of);
                encode_gradient(ex, cfg, span<const bf16>(xb.data(), n), span<std::uint8_t>(mb.data(), mb.size()), ob);
                CHECK(mf == mb);
                CHECK(bytes_of(ff) == bytes_of(fbb));
            }
            std::vector<float> df(n);
            std::vector<bf16> db(n);
            decode_gradient(on_host(2), span<const std::uint8_t>(mf.data(), mf.size()), span<float>(df.data(), n));
            decode_gradient(on_host(2), span<const std::uint8_t>(mb.data(), mb.size()), span<bf16>(db.data(), n));
            bool all = true;
            for (std::size_t i = 0; i < n; ++i) all = all && same_bf16(db[i], to_bf16(df[i]));
            CHECK(all);
        }
    }
}

TEST_CASE("codec: the bf16 scratch queries cover what the calls take") {
    const codec_config cfg = config_of(variants[0]);
    const std::size_t n = 50000;
    auto g = octet_test::rng(72);
    const auto xb = to_bf16_vec(gradient(g, n));
    std::vector<std::uint8_t> m(encoded_size(cfg, n));
    std::vector<bf16> out(n);
    octet_test::lent_allocator lent;
    const host_executor ex = with_allocator(on_host(2), lent.ref());
    encode_gradient(ex, cfg, span<const bf16>(xb.data(), n), span<std::uint8_t>(m.data(), m.size()));
    CHECK(lent.peak == encode_gradient_scratch_bytes<bf16>(ex, cfg, n));
    CHECK(encode_gradient_scratch_bytes<bf16>(ex, cfg, n) > encode_gradient_scratch_bytes(ex, cfg, n));
    lent.reset_peak();
    decode_gradient(ex, span<const std::uint8_t>(m.data(), m.size()), span<bf16>(out.data(), n));
    CHECK(lent.peak == decode_gradient_scratch_bytes<bf16>(ex, cfg, n));
    CHECK(lent.balanced());
    // a destination of the wrong size names the argument
    std::vector<bf16> short_out(n - 1);
    CHECK_THROWS_WITH_AS(
        decode_gradient(ex, span<const std::uint8_t>(m.data(), m.size()), span<bf16>(short_out.data(), n - 1)),
        doctest::Contains("argument 'out'"), octet::error);
}

TEST_CASE("compressed all-reduce over bf16 gradients: the float result rounded once, the same residuals") {
    auto g = octet_test::rng(73);
    for (const variant& v : variants)
        for (int P : {1, 2, 3, 4})
            for (std::size_t n : {std::size_t{700}, std::size_t{3 * 4096 + 5}, std::size_t{33000}}) {
                CAPTURE(P);
                CAPTURE(n);
                const codec_config cfg = config_of(v);
                // every rank's residuals, float run and bf16 run
                std::vector<std::unique_ptr<error_feedback>> ff, fr, bf, br;
                for (int r = 0; r < P; ++r) {
                    const std::size_t shard = allreduce_shard(cfg, n, P, r).count;
                    ff.push_back(std::make_unique<error_feedback>(n, v.residuals));
                    bf.push_back(std::make_unique<error_feedback>(n, v.residuals));
                    fr.push_back(std::make_unique<error_feedback>(shard, v.residuals));
                    br.push_back(std::make_unique<error_feedback>(shard, v.residuals));
                }
                for (int step = 0; step < 3; ++step) {
                    std::vector<std::vector<bf16>> gb(P);
                    std::vector<std::vector<float>> gf(P);
                    for (int r = 0; r < P; ++r) gf[r] = widened(gb[r] = to_bf16_vec(gradient(g, n)));
                    std::vector<octet_test::lent_allocator> lent(static_cast<std::size_t>(P));
                    std::vector<std::size_t> query(static_cast<std::size_t>(P));
                    auto options = [&](int r, std::vector<std::unique_ptr<error_feedback>>& f,
                                       std::vector<std::unique_ptr<error_feedback>>& rf, host_executor ex) {
                        allreduce_options o;
                        o.expected_ranks = P;
                        o.feedback = f[r]->view();
                        o.reduced_feedback = rf[r]->view();
                        // a rank with an empty shard still passes a residual (a view that is not empty())
                        static std::uint8_t nothing = 0;
                        if (o.reduced_feedback.size == 0) o.reduced_feedback.data = &nothing;
                        o.executor = ex;
                        return o;
                    };
                    octet_test::on_world_or_throw(P, [&](int r, octet_test::in_process_transport& t) {
                        compressed_allreduce_host(t, cfg, span<float>(gf[r].data(), n), options(r, ff, fr, on_host(1)));
                    });
                    octet_test::on_world_or_throw(P, [&](int r, octet_test::in_process_transport& t) {
                        const host_executor ex = with_allocator(on_host(1), lent[r].ref());
                        const allreduce_options o = options(r, bf, br, ex);
                        query[r] = compressed_allreduce_scratch_bytes<bf16>(ex, cfg, n, P, r, o);
                        compressed_allreduce_host(t, cfg, span<bf16>(gb[r].data(), n), o);
                    });
                    for (int r = 0; r < P; ++r) {
                        bool all = true;
                        for (std::size_t i = 0; i < n; ++i) all = all && same_bf16(gb[r][i], to_bf16(gf[r][i]));
                        CHECK(all);
                        CHECK(bytes_of(*ff[r]) == bytes_of(*bf[r]));
                        CHECK(bytes_of(*fr[r]) == bytes_of(*br[r]));
                        CHECK(lent[r].allocations == 1);
                        CHECK(lent[r].peak <= query[r]);
                        CHECK(lent[r].balanced());
                    }
                }
            }
}
