// octet-test: timeout=600
//
// The grouped scaled GEMM on a stream (octet/gemm/grouped_gemm.cuh: sm90_wgmma's persistent grouped
// kernel, sm89_mma's grouped launch) against the host grouped GEMM (grouped_gemm.hpp, which is the dense
// host GEMM per group bit for bit: tests/host/grouped_gemm_host.cpp), group by group. Outputs are
// poisoned (all bits set: NaN in float, bf16 and fp16) before each run, so an element a kernel fails
// to write fails, and so does a row of another group written by a tile that reaches past its group.
//   * exact inputs (values in {-1, 0, 1}, a 7 at the start of every scale block: every partial sum is
//     exact in any accumulator): the device must equal the host bit for bit.
//   * random inputs: |device - host| <= bound(device backend) + bound(host backend) per element (the
//     dense device GEMM's contract, scaled_gemm.hpp; as tests/cuda/gemm_device.cu checks it), and the
//     grouped result equals the dense device GEMM's on each group with the same backend bit for bit
//     (the grouped kernels run the dense kernels' mainloops and epilogues).
// Group sizes are ragged: a group of zero rows, groups smaller than one tile, sizes that are not
// multiples of 128, a group spanning several tiles; and more groups than one launch takes (32).
// Suite "cuda" (no GPU needed): argument errors and refused backends. Suite "gpu": the rest; under the
// interpreter (label interpret) on small shapes.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "octet/cuda/buffer.cuh"
#include "octet/gemm/grouped_gemm.cuh"
#include "octet/gemm/scaled_gemm.cuh"
#include "support/random.hpp"

namespace grouped_gemm_device_test {
using namespace octet;

#if defined(OCTET_INTERPRET)
constexpr bool kInterpreted = true;
#else
constexpr bool kInterpreted = false;
#endif

template <class T>
T pick(T device, T interpreted) {
    return kInterpreted ? interpreted : device;
}

template <class T>
float to_f(T v) {
    if constexpr (std::is_same_v<T, float>)
        return v;
    else
        return to_float(v);
}

/// Values in {-1, 0, 1} with a 7 at the start of every `block`-wide run along K and in the first row
/// (so that 128x128 blocks have amax 7 too): scales are powers of two and every sum is exact.
std::vector<float> exact_values(std::mt19937_64& g, std::size_t rows, std::size_t K, std::size_t block) {
    std::uniform_int_distribution<int> d(-1, 1);
    std::vector<float> x(rows * K);
    for (auto& v : x) v = static_cast<float>(d(g));
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t k = 0; k < K; k += block) x[i * K + k] = 7.0f;
    return x;
}

/// The inputs of one grouped problem on the host: A's groups quantized by grouped_quantize, one B per
/// group (each quantized as its own N x K matrix).
template <class RA, class RB>
struct host_problem {
    std::vector<std::size_t> sizes;
    std::size_t N, K;
    grouped_quantized_tensor<RA> a;
    std::vector<quantized_tensor<RB>> b;

    host_problem(std::vector<std::size_t> s, std::size_t n, std::size_t k, bool exact, std::uint64_t salt)
        : sizes(std::move(s)), N(n), K(k), a(grouped_rows(as_cspan(sizes), k)) {
        auto g = octet_test::rng(salt);
        std::size_t M = 0;
        for (std::size_t v : sizes) M += v;
        const std::vector<float> x = exact ? exact_values(g, M, K, 128) : octet_test::with_edge_cases(g, M * K, 2.0f);
        if (K > 0) grouped_quantize<RA>(on_host(), matrix_ref<const float>(x.data(), M, K), as_cspan(sizes), a.ref());
        for (std::size_t e = 0; e < sizes.size(); ++e) {
            const std::vector<float> w =
                exact ? exact_values(g, N, K, 128) : octet_test::with_edge_cases(g, N * K, 0.5f);
            b.emplace_back(N, K);
            if (K > 0) quantize<RB>(on_host(), matrix_ref<const float>(w.data(), N, K), b.back().ref());
        }
    }
    std::size_t rows() const {
        std::size_t M = 0;
        for (std::size_t v : sizes) M += v;
        return M;
    }
    std::vector<quantized_cref<RB>> b_crefs() const {
        std::vector<quantized_cref<RB>> r;
        for (const auto& q : b) r.push_back(q.cref());
        return r;
    }
};

/// The same operands in device memory (A's blocks uploaded whole; its layout stays the host's).
template <class RA, class RB>
struct device_problem {
    cuda::device_buffer<std::uint8_t> a_data, a_scales;
    cuda::device_buffer<float> a_ts;
    std::vector<cuda::device_buffer<std::uint8_t>> b_data, b_scales;
    std::vector<cuda::device_buffer<float>> b_ts;
    const host_problem<RA, RB>* h;

    explicit device_problem(const host_problem<RA, RB>& hp)
        : a_data(std::max<std::size_t>(hp.a.layout().data_bytes, 1)),
          a_scales(std::max<std::size_t>(hp.a.layout().scale_bytes, 1)),
          a_ts(std::max<std::size_t>(hp.sizes.size(), 1)),
          h(&hp) {
        const grouped_quantized_cref<RA> c = hp.a.cref();
        const grouped_layout& L = hp.a.layout();
        if (L.data_bytes) a_data.upload(std::vector<std::uint8_t>(c.data, c.data + L.data_bytes));
        if (L.scale_bytes) a_scales.upload(std::vector<std::uint8_t>(c.scales, c.scales + L.scale_bytes));
        a_ts.upload(std::vector<float>(c.tensor_scales, c.tensor_scales + std::max<std::size_t>(L.size(), 1)));
        for (const auto& q : hp.b) {
            auto& qq = const_cast<quantized_tensor<RB>&>(q);
            b_data.emplace_back(std::max<std::size_t>(q.layout().data_bytes, 1));
            b_scales.emplace_back(std::max<std::size_t>(q.layout().scale_bytes, 1));
            b_ts.emplace_back(1);
            if (q.layout().data_bytes) b_data.back().upload(qq.data());
            if (q.layout().scale_bytes) b_scales.back().upload(qq.scales());
            b_ts.back().upload(std::vector<float>{q.tensor_scale()});
        }
    }
    grouped_quantized_cref<RA> a() const {
        return grouped_quantized_cref<RA>(a_data.data(), a_scales.data(), a_ts.data(), h->a.layout());
    }
    quantized_cref<RA> a_group(std::size_t g) const { return a().group(g); }
    std::vector<quantized_cref<RB>> b() const {
        std::vector<quantized_cref<RB>> r;
        for (std::size_t e = 0; e < b_data.size(); ++e)
            r.emplace_back(b_data[e].data(), b_scales[e].data(), h->b[e].layout(), b_ts[e].data());
        return r;
    }
};

struct tally {
    double worst = 0.0;
    void message(const std::string& what) const { MESSAGE(what << ": largest |device - host| / allowed = " << worst); }
};

/// Runs the grouped GEMM on `backend` and compares it with the host grouped GEMM (exact: bit for bit;
/// else within both bounds) and, for random inputs, with the dense device GEMM on each group (bit for bit).
template <class RA, class RB, class DT = float>
void compare(gemm_backend backend, const std::vector<std::size_t>& sizes, std::size_t N, std::size_t K, bool exact,
             tally& t, gemm_options opt = {}, bool with_bias = false, storage_order order = storage_order::row_major) {
    std::string ss;
    for (std::size_t v : sizes) ss += std::to_string(v) + " ";
    INFO(backend_name(backend) << ": A " << recipe_description<RA>() << ", B " << recipe_description<RB>() << ", sizes "
                               << ss << "N=" << N << " K=" << K << (exact ? " (exact inputs)" : "") << ", seed "
                               << octet_test::run_seed());
    const host_problem<RA, RB> hp(sizes, N, K, exact, N * 7919 + K * 31 + sizes.size());
    const std::size_t M = hp.rows();
    auto g = octet_test::rng(M + N + K);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<float> bias(N);
    for (auto& v : bias) v = exact ? std::round(nd(g)) : nd(g);
    const bool row = order == storage_order::row_major;
    const std::size_t ld = row ? N : M;

    // host
    std::vector<DT> hd(M * N);
    gemm_options host_opt = opt;
    host_opt.backend = gemm_backend::host;
    if (with_bias) host_opt.bias = as_cspan(bias);
    const std::vector<quantized_cref<RB>> hb = hp.b_crefs();
    grouped_scaled_gemm(on_host(), hp.a.cref(), span<const quantized_cref<RB>>(hb.data(), hb.size()),
                        matrix_ref<DT>(hd.data(), M, N, ld, order), host_opt);

    // device, grouped
    const device_problem<RA, RB> dp(hp);
    const std::vector<quantized_cref<RB>> db = dp.b();
    cuda::device_buffer<DT> dd(std::max<std::size_t>(M * N, 1));
    cuda::device_buffer<float> dbias(bias);
    dd.fill_bytes(0xFF);
    gemm_options dev_opt = opt;
    dev_opt.backend = backend;
    if (with_bias) dev_opt.bias = dbias.cview();
    const gemm_result r = grouped_scaled_gemm(on_stream(), dp.a(), span<const quantized_cref<RB>>(db.data(), db.size()),
                                              matrix_ref<DT>(dd.data(), M, N, ld, order), dev_opt);
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(r.backend == backend);
    const std::vector<DT> got = dd.download();

    // device, dense, group by group (random inputs): the same backend on the same tile
    std::vector<DT> dense;
    if (!exact) {
        cuda::device_buffer<DT> de(std::max<std::size_t>(M * N, 1));
        de.fill_bytes(0xFF);
        gemm_options o = dev_opt;
        o.tile = gemm_tile::m128n128;
        o.cluster = 1;
        o.split_k = 1;
        std::size_t begin = 0;
        for (std::size_t e = 0; e < sizes.size(); ++e) {
            if (sizes[e]) {
                DT* at = row ? de.data() + begin * N : de.data() + begin;
                scaled_gemm(on_stream(), dp.a_group(e), db[e], matrix_ref<DT>(at, sizes[e], N, ld, order), o);
            }
            begin += sizes[e];
        }
        OCTET_CUDA_CHECK(cudaDeviceSynchronize());
        dense = de.download();
    }

    const gemm_numerics ng = gemm_numerics_of<RA, RB, DT>(backend, K, opt);
    const gemm_numerics nh = gemm_numerics_of<RA, RB, DT>(gemm_backend::host, K, opt);
    int bad = 0;
    std::size_t begin = 0;
    for (std::size_t e = 0; e < sizes.size(); ++e) {
        // T = sum_k |a_ik| |b_jk| of this group, by the host GEMM on the codes' magnitudes
        std::vector<float> T;
        if (!exact && sizes[e]) {
            quantized_tensor<RA> aa(sizes[e], K);
            const quantized_cref<RA> ag = hp.a.cref().group(e);
            std::memcpy(aa.data().data(), ag.data, ag.layout.data_bytes);
            std::memcpy(aa.scales().data(), ag.scales, ag.layout.scale_bytes);
            quantized_tensor<RB> bb = hp.b[e];
            for (auto& c : aa.data()) c &= 0x7F;
            for (auto& c : bb.data()) c &= 0x7F;
            T.resize(sizes[e] * N);
            scaled_gemm(on_host(), aa.cref(), bb.cref(), matrix_ref<float>(T.data(), sizes[e], N));
        }
        for (std::size_t i = begin; i < begin + sizes[e]; ++i)
            for (std::size_t j = 0; j < N; ++j) {
                const std::size_t o = row ? i * N + j : j * M + i;
                const float gv = to_f(got[o]), hv = to_f(hd[o]);
                if (exact) {
                    if (std::memcmp(&got[o], &hd[o], sizeof(DT)) != 0 && bad++ < 5)
                        FAIL_CHECK("group " << e << " D(" << i << "," << j << "): device " << gv << " host " << hv
                                            << " (must be equal: exact inputs)");
                    continue;
                }
                if (std::memcmp(&got[o], &dense[o], sizeof(DT)) != 0 && bad++ < 5)
                    FAIL_CHECK("group " << e << " D(" << i << "," << j << "): grouped " << gv << " dense "
                                        << to_f(dense[o]) << " (must be equal: the same kernel's mainloop)");
                const double bb = with_bias ? std::fabs(static_cast<double>(bias[j])) : 0.0;
                const double Tij = T[(i - begin) * N + j];
                const double allowed = gemm_error_bound(ng, opt.alpha, Tij, 0.0, bb, std::fabs(hv)) +
                                       gemm_error_bound(nh, opt.alpha, Tij, 0.0, bb, std::fabs(hv));
                const double diff = std::fabs(static_cast<double>(gv) - hv);
                if (!(diff <= allowed) && bad++ < 5)
                    FAIL_CHECK("group " << e << " D(" << i << "," << j << "): device " << gv << " host " << hv
                                        << " |diff| " << diff << " > allowed " << allowed);
                if (allowed > 0) t.worst = std::max(t.worst, diff / allowed);
            }
        begin += sizes[e];
    }
    CHECK(bad == 0);
}

template <class RA, class RB>
void backend_pair(gemm_backend backend, const char* name, const std::vector<std::vector<std::size_t>>& sizes,
                  std::size_t N, std::size_t K, gemm_options opt = {}) {
    tally t;
    for (const auto& s : sizes) {
        compare<RA, RB>(backend, s, N, K, true, t, opt);
        compare<RA, RB>(backend, s, N, K, false, t, opt);
    }
    t.message(std::string(backend_name(backend)) + " " + name);
}

/// The masked GEMM on `backend` against the host's: every group holds `capacity` rows, valid[g] of them
/// tokens; D (poisoned) must equal the host's bit for bit on exact inputs, padding rows (zeros) included,
/// and be within both bounds on random inputs.
template <class RA, class RB, class DT = float>
void compare_masked(gemm_backend backend, std::size_t capacity, const std::vector<std::size_t>& valid, std::size_t N,
                    std::size_t K, bool exact, tally& t, storage_order order = storage_order::row_major) {
    std::string vs;
    for (std::size_t v : valid) vs += std::to_string(v) + " ";
    INFO("masked " << backend_name(backend) << ": A " << recipe_description<RA>() << ", capacity " << capacity
                   << ", valid " << vs << "N=" << N << " K=" << K << (exact ? " (exact inputs)" : "") << ", seed "
                   << octet_test::run_seed());
    const host_problem<RA, RB> hp(std::vector<std::size_t>(valid.size(), capacity), N, K, exact, capacity + N + K);
    const std::size_t M = hp.rows();
    const bool row = order == storage_order::row_major;
    const std::size_t ld = row ? N : M;
    std::vector<DT> hd(M * N);
    gemm_options host_opt;
    host_opt.backend = gemm_backend::host;
    const std::vector<quantized_cref<RB>> hb = hp.b_crefs();
    grouped_scaled_gemm_masked(on_host(), hp.a.cref(), span<const quantized_cref<RB>>(hb.data(), hb.size()),
                               as_cspan(valid), matrix_ref<DT>(hd.data(), M, N, ld, order), host_opt);
    const device_problem<RA, RB> dp(hp);
    const std::vector<quantized_cref<RB>> db = dp.b();
    cuda::device_buffer<DT> dd(M * N);
    dd.fill_bytes(0xFF);
    gemm_options o;
    o.backend = backend;
    const gemm_result r =
        grouped_scaled_gemm_masked(on_stream(), dp.a(), span<const quantized_cref<RB>>(db.data(), db.size()),
                                   as_cspan(valid), matrix_ref<DT>(dd.data(), M, N, ld, order), o);
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(r.backend == backend);
    const std::vector<DT> got = dd.download();
    const gemm_numerics ng = gemm_numerics_of<RA, RB, DT>(backend, K),
                        nh = gemm_numerics_of<RA, RB, DT>(gemm_backend::host, K);
    int bad = 0;
    for (std::size_t e = 0; e < valid.size(); ++e) {
        std::vector<float> T;
        if (!exact && valid[e]) {  // sum_k |a_ik| |b_jk| of the group's tokens
            quantized_tensor<RA> aa(valid[e], K);
            const quantized_cref<RA> ag = hp.a.cref().group(e);
            for (std::size_t i = 0; i < aa.data().size(); ++i) aa.data()[i] = ag.data[i] & 0x7F;
            for (std::size_t k = 0; k < aa.layout().scale_cols; ++k)  // scale columns: ld capacity-padded in ag
                std::memcpy(aa.scales().data() + k * aa.layout().scale_ld * RA::scale_bytes,
                            ag.scales + k * ag.layout.scale_ld * RA::scale_bytes, valid[e] * RA::scale_bytes);
            quantized_tensor<RB> bb = hp.b[e];
            for (auto& c : bb.data()) c &= 0x7F;
            T.resize(valid[e] * N);
            scaled_gemm(on_host(), aa.cref(), bb.cref(), matrix_ref<float>(T.data(), valid[e], N));
        }
        for (std::size_t i = e * capacity; i < (e + 1) * capacity; ++i)
            for (std::size_t j = 0; j < N; ++j) {
                const std::size_t o2 = row ? i * N + j : j * M + i;
                const float gv = to_f(got[o2]), hv = to_f(hd[o2]);
                const bool token = i - e * capacity < valid[e];
                if (exact || !token) {
                    if (std::memcmp(&got[o2], &hd[o2], sizeof(DT)) != 0 && bad++ < 5)
                        FAIL_CHECK("group " << e << " D(" << i << "," << j << "): device " << gv << " host " << hv
                                            << (token ? " (must be equal: exact inputs)" : " (a padding row: 0)"));
                    continue;
                }
                const double Tij = T[(i - e * capacity) * N + j];
                const double allowed = gemm_error_bound(ng, 1.0, Tij, 0.0, 0.0, std::fabs(hv)) +
                                       gemm_error_bound(nh, 1.0, Tij, 0.0, 0.0, std::fabs(hv));
                const double diff = std::fabs(static_cast<double>(gv) - hv);
                if (!(diff <= allowed) && bad++ < 5)
                    FAIL_CHECK("group " << e << " D(" << i << "," << j << "): device " << gv << " host " << hv
                                        << " |diff| " << diff << " > allowed " << allowed);
                if (allowed > 0) t.worst = std::max(t.worst, diff / allowed);
            }
    }
    CHECK(bad == 0);
}

/// A grouped copy's group g as an owning quantized tensor (the same layout: quant_layout_of::make), with
/// its codes' sign bits cleared when `magnitudes` (for sums of |a| |b|).
template <class R>
quantized_tensor<R> group_copy(const grouped_quantized_cref<R>& q, std::size_t g, bool magnitudes) {
    const quantized_cref<R> c = q.group(g);
    quantized_tensor<R> t(c.layout.rows, c.layout.cols);
    REQUIRE(t.layout().data_bytes == c.layout.data_bytes);
    REQUIRE(t.layout().scale_bytes == c.layout.scale_bytes);
    for (std::size_t i = 0; i < c.layout.data_bytes; ++i) t.data()[i] = magnitudes ? c.data[i] & 0x7F : c.data[i];
    if (c.layout.scale_bytes) std::memcpy(t.scales().data(), c.scales, c.layout.scale_bytes);
    return t;
}

/// The k-grouped GEMM (weight gradient) on `backend` against the host's: tokens of `sizes` (zero sizes,
/// sizes that are not multiples of 128 included), dY (tokens x N) and X (tokens x K) quantized column-wise
/// per group by grouped_quantize; dW (G N x K, poisoned) must equal the host's bit for bit on exact inputs
/// (groups without tokens: 0), be within both bounds on random inputs, and equal the dense device GEMM of
/// each group bit for bit.
template <class R, class DT = float>
void compare_k(gemm_backend backend, const std::vector<std::size_t>& sizes, std::size_t N, std::size_t K, bool exact,
               tally& t, gemm_options opt = {}) {
    std::string ss;
    for (std::size_t v : sizes) ss += std::to_string(v) + " ";
    INFO("k-grouped " << backend_name(backend) << ": " << recipe_description<R>() << ", sizes " << ss << "N=" << N
                      << " K=" << K << (exact ? " (exact inputs)" : "") << ", seed " << octet_test::run_seed());
    std::size_t M = 0;
    for (std::size_t v : sizes) M += v;
    const std::size_t G = sizes.size();
    auto g = octet_test::rng(M * 31 + N + K);
    // exact: {-1, 0, 1} with a 7 at the first token of every 128-token block of every group
    auto tokens = [&](std::size_t cols, float scale) {
        if (!exact) return octet_test::with_edge_cases(g, M * cols, scale);
        std::vector<float> x = exact_values(g, M, cols, cols + 1);
        std::size_t begin = 0;
        for (std::size_t s : sizes) {
            for (std::size_t i = 0; i < s; ++i)
                for (std::size_t j = 0; j < cols; ++j)
                    x[(begin + i) * cols + j] = i % 128 == 0 ? 7.0f : x[(begin + i) * cols + j];
            begin += s;
        }
        return x;
    };
    const std::vector<float> dy = tokens(N, 2.0f), x = tokens(K, 0.5f);
    grouped_quantized_tensor<R> dyt(grouped_cols(N, as_cspan(sizes))), xt(grouped_cols(K, as_cspan(sizes)));
    if (M) {
        grouped_quantize<R>(on_host(), matrix_ref<const float>(dy.data(), M, N), as_cspan(sizes), {}, dyt.ref());
        grouped_quantize<R>(on_host(), matrix_ref<const float>(x.data(), M, K), as_cspan(sizes), {}, xt.ref());
    }
    std::vector<DT> hd(G * N * K);
    gemm_options host_opt = opt;
    host_opt.backend = gemm_backend::host;
    grouped_scaled_gemm_k(on_host(), dyt.cref(), xt.cref(), matrix_ref<DT>(hd.data(), G * N, K), host_opt);

    auto upload = [](const grouped_quantized_tensor<R>& h, cuda::device_buffer<std::uint8_t>& d,
                     cuda::device_buffer<std::uint8_t>& s) {
        const grouped_quantized_cref<R> c = h.cref();
        if (h.layout().data_bytes) d.upload(std::vector<std::uint8_t>(c.data, c.data + h.layout().data_bytes));
        if (h.layout().scale_bytes) s.upload(std::vector<std::uint8_t>(c.scales, c.scales + h.layout().scale_bytes));
    };
    cuda::device_buffer<std::uint8_t> a_data(std::max<std::size_t>(dyt.layout().data_bytes, 1)),
        a_scales(std::max<std::size_t>(dyt.layout().scale_bytes, 1)),
        b_data(std::max<std::size_t>(xt.layout().data_bytes, 1)),
        b_scales(std::max<std::size_t>(xt.layout().scale_bytes, 1));
    upload(dyt, a_data, a_scales);
    upload(xt, b_data, b_scales);
    const grouped_quantized_cref<R> da(a_data.data(), a_scales.data(), nullptr, dyt.layout()),
        db(b_data.data(), b_scales.data(), nullptr, xt.layout());
    cuda::device_buffer<DT> dd(std::max<std::size_t>(G * N * K, 1));
    dd.fill_bytes(0xFF);
    gemm_options o = opt;
    o.backend = backend;
    const gemm_result r = grouped_scaled_gemm_k(on_stream(), da, db, matrix_ref<DT>(dd.data(), G * N, K), o);
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(r.backend == backend);
    const std::vector<DT> got = dd.download();
    std::vector<DT> dense;
    if (!exact) {  // the dense device GEMM on each group with tokens, same backend and tile
        cuda::device_buffer<DT> de(std::max<std::size_t>(G * N * K, 1));
        de.fill_bytes(0);
        gemm_options od = o;
        od.tile = gemm_tile::m128n128;
        od.cluster = 1;
        od.split_k = 1;
        for (std::size_t e = 0; e < G; ++e)
            if (sizes[e])
                scaled_gemm(on_stream(), da.group(e), db.group(e), matrix_ref<DT>(de.data() + e * N * K, N, K), od);
        OCTET_CUDA_CHECK(cudaDeviceSynchronize());
        dense = de.download();
    }
    int bad = 0;
    for (std::size_t e = 0; e < G; ++e) {
        const gemm_numerics ng = gemm_numerics_of<R, R, DT>(backend, sizes[e], opt),
                            nh = gemm_numerics_of<R, R, DT>(gemm_backend::host, sizes[e], opt);
        std::vector<float> T;
        if (!exact && sizes[e]) {
            const quantized_tensor<R> aa = group_copy(dyt.cref(), e, true), bb = group_copy(xt.cref(), e, true);
            T.resize(N * K);
            scaled_gemm(on_host(), aa.cref(), bb.cref(), matrix_ref<float>(T.data(), N, K));
        }
        for (std::size_t i = 0; i < N; ++i)
            for (std::size_t j = 0; j < K; ++j) {
                const std::size_t at = (e * N + i) * K + j;
                const float gv = to_f(got[at]), hv = to_f(hd[at]);
                if (exact || sizes[e] == 0) {
                    if (std::memcmp(&got[at], &hd[at], sizeof(DT)) != 0 && bad++ < 5)
                        FAIL_CHECK("group " << e << " dW(" << i << "," << j << "): device " << gv << " host " << hv
                                            << " (must be equal)");
                    continue;
                }
                if (std::memcmp(&got[at], &dense[at], sizeof(DT)) != 0 && bad++ < 5)
                    FAIL_CHECK("group " << e << " dW(" << i << "," << j << "): grouped " << gv << " dense "
                                        << to_f(dense[at]) << " (must be equal)");
                const double allowed = gemm_error_bound(ng, opt.alpha, T[i * K + j], 0.0, 0.0, std::fabs(hv)) +
                                       gemm_error_bound(nh, opt.alpha, T[i * K + j], 0.0, 0.0, std::fabs(hv));
                const double diff = std::fabs(static_cast<double>(gv) - hv);
                if (!(diff <= allowed) && bad++ < 5)
                    FAIL_CHECK("group " << e << " dW(" << i << "," << j << "): device " << gv << " host " << hv
                                        << " |diff| " << diff << " > allowed " << allowed);
                if (allowed > 0) t.worst = std::max(t.worst, diff / allowed);
            }
    }
    CHECK(bad == 0);
}

/// grouped_quantize on a stream against the host's: every group's codes and scales (row-wise and
/// column-wise copies) bit for bit, the gaps between groups aside (the device blocks are poisoned first).
template <class R>
void compare_grouped_quantize(const std::vector<std::size_t>& sizes, std::size_t cols) {
    INFO("grouped_quantize " << recipe_description<R>() << ", cols " << cols << ", seed " << octet_test::run_seed());
    std::size_t M = 0;
    for (std::size_t v : sizes) M += v;
    auto g = octet_test::rng(M * 13 + cols);
    const std::vector<float> x = octet_test::with_edge_cases(g, M * cols, 3.0f);
    grouped_quantized_tensor<R> hr(grouped_rows(as_cspan(sizes), cols)), hc(grouped_cols(cols, as_cspan(sizes)));
    grouped_quantize<R>(on_host(), matrix_ref<const float>(x.data(), M, cols), as_cspan(sizes), hr.ref(), hc.ref());
    const cuda::device_buffer<float> dx(x);
    auto device_block = [](const grouped_layout& l) {
        std::pair<cuda::device_buffer<std::uint8_t>, cuda::device_buffer<std::uint8_t>> b{
            cuda::device_buffer<std::uint8_t>(std::max<std::size_t>(l.data_bytes, 1)),
            cuda::device_buffer<std::uint8_t>(std::max<std::size_t>(l.scale_bytes, 1))};
        b.first.fill_bytes(0xCD);
        b.second.fill_bytes(0xCD);
        return b;
    };
    auto dr = device_block(hr.layout()), dc = device_block(hc.layout());
    cuda::device_buffer<float> ts(2 * std::max<std::size_t>(sizes.size(), 1));
    const grouped_quantized_ref<R> rr(dr.first.data(), dr.second.data(), ts.data(), hr.layout()),
        rc(dc.first.data(), dc.second.data(), ts.data() + sizes.size(), hc.layout());
    const matrix_ref<const float> X(dx.data(), M, cols);
    CHECK(grouped_quantize_scratch_bytes<R>(X, as_cspan(sizes), rr, rc) % 256 == 0);
    grouped_quantize<R>(on_stream(), X, as_cspan(sizes), rr, rc);
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    auto same = [&](const grouped_quantized_tensor<R>& h, const decltype(dr)& d, const char* which) {
        const std::vector<std::uint8_t> data = d.first.download(), scales = d.second.download();
        const grouped_quantized_cref<R> c = h.cref();
        const grouped_layout& l = h.layout();
        for (std::size_t e = 0; e < l.size(); ++e) {
            INFO(which << " group " << e);
            CHECK(std::memcmp(data.data() + l.data_offset[e], c.data + l.data_offset[e], l.groups[e].data_bytes) == 0);
            CHECK(std::memcmp(scales.data() + l.scale_offset[e], c.scales + l.scale_offset[e],
                              l.groups[e].scale_bytes) == 0);
        }
    };
    same(hr, dr, "row-wise");
    same(hc, dc, "column-wise");
}

bool sm90() {
    return cuda::compute_capability() == 90 && detail::sm90a_available();
}
bool sm89() {
    return cuda::compute_capability() >= 89 && detail::sm89_available();
}

// Ragged groups: zero rows, fewer rows than one tile, not multiples of 128, several tiles.
const std::vector<std::vector<std::size_t>> kSizes = pick<std::vector<std::vector<std::size_t>>>(
    {{0, 1, 130, 64, 300}, {513, 0, 37, 256}, {7, 3}}, {{0, 1, 130, 64}, {37, 0, 5, 0}});

TEST_SUITE("gpu") {
    TEST_CASE("sm90_wgmma grouped against the host and the dense kernel: every pair it serves, ragged groups") {
        if (!sm90()) {
            MESSAGE("skipped: needs an sm_90 GPU and sm_90a code");
            return;
        }
        const std::size_t N = pick<std::size_t>(520, 136), K = pick<std::size_t>(1024, 256);
        backend_pair<recipes::blockwise_1x128, recipes::blockwise_128x128>(gemm_backend::sm90_wgmma, "1x128 x 128x128",
                                                                           kSizes, N, K);
        backend_pair<recipes::tensorwise_e4m3, recipes::tensorwise_e4m3>(gemm_backend::sm90_wgmma, "tensor x tensor",
                                                                         {{70, 0, 129}}, 200, 384);
        backend_pair<recipes::blockwise_1x128, recipes::blockwise_1x128>(gemm_backend::sm90_wgmma, "1x128 x 1x128",
                                                                         {{3, 140}}, 136, 256);
        backend_pair<recipes::rowwise_e4m3, recipes::rowwise_e4m3>(gemm_backend::sm90_wgmma, "row x row", {{50, 9}},
                                                                   129, 300);
        using e5m2_1x128 = recipe<e5m2, block<1, 128>, scale::amax_ratio<0>>;
        backend_pair<e5m2_1x128, recipes::blockwise_128x128>(gemm_backend::sm90_wgmma, "E5M2 1x128 x E4M3 128x128",
                                                             {{77, 0, 20}}, 190, 640);
    }

    TEST_CASE("sm90_wgmma grouped epilogue: alpha, bias, bf16 (TMA store) and col-major fp16 D, K = 0") {
        if (!sm90()) {
            MESSAGE("skipped: needs an sm_90 GPU and sm_90a code");
            return;
        }
        using RA = recipes::blockwise_1x128;
        using RB = recipes::blockwise_128x128;
        tally t;
        gemm_options opt;
        opt.alpha = -0.5f;
        const std::vector<std::size_t> s = {130, 0, 64, 3};
        compare<RA, RB, bf16>(gemm_backend::sm90_wgmma, s, 136, 256, true, t, opt, true);
        compare<RA, RB, bf16>(gemm_backend::sm90_wgmma, s, 136, 256, false, t, opt, true);
        compare<RA, RB, fp16>(gemm_backend::sm90_wgmma, s, 136, 256, true, t, opt, true, storage_order::col_major);
        compare<RA, RB, float>(gemm_backend::sm90_wgmma, s, 100, 256, false, t, opt, true);  // ragged N: no TMA store
        t.message("sm90_wgmma grouped epilogue");
    }

    TEST_CASE("grouped GEMM with more groups than one launch takes (33 groups: two launches)") {
        if (!sm89()) {
            MESSAGE("skipped: needs an sm_89+ GPU");
            return;
        }
        std::vector<std::size_t> s(33);
        for (std::size_t e = 0; e < s.size(); ++e) s[e] = e % 5 == 0 ? 0 : (e * 7) % 11 + 1;
        tally t;
        if (sm90())
            compare<recipes::blockwise_1x128, recipes::blockwise_128x128>(gemm_backend::sm90_wgmma, s, 64, 128, true,
                                                                          t);
        compare<recipes::blockwise_1x128, recipes::blockwise_128x128>(gemm_backend::sm89_mma, s, 64, 128, true, t);
    }

    TEST_CASE("sm89_mma grouped against the host and the dense kernel: 1x128 x 128x128, MXFP8, tensor") {
        if (!sm89()) {
            MESSAGE("skipped: needs an sm_89+ GPU");
            return;
        }
        backend_pair<recipes::blockwise_1x128, recipes::blockwise_128x128>(gemm_backend::sm89_mma, "1x128 x 128x128",
                                                                           kSizes, pick<std::size_t>(300, 136),
                                                                           pick<std::size_t>(640, 256));
        backend_pair<recipes::mxfp8_e4m3, recipes::mxfp8_e4m3>(gemm_backend::sm89_mma, "MXFP8 x MXFP8", {{9, 0, 130}},
                                                               96, 160);
        backend_pair<recipes::tensorwise_e4m3, recipes::tensorwise_e4m3>(gemm_backend::sm89_mma, "tensor x tensor",
                                                                         {{20, 3}}, 70, 200);
    }

    TEST_CASE("grouped_scaled_gemm_masked against the host: padding rows zeroed, empty and full groups") {
        if (!sm89()) {
            MESSAGE("skipped: needs an sm_89+ GPU");
            return;
        }
        using RA = recipes::blockwise_1x128;
        using RB = recipes::blockwise_128x128;
        tally t;
        std::vector<gemm_backend> backends = {gemm_backend::sm89_mma};
        if (sm90()) backends.push_back(gemm_backend::sm90_wgmma);
        const std::size_t capacity = pick<std::size_t>(384, 130);
        const std::vector<std::size_t> valid = pick<std::vector<std::size_t>>({0, 1, 384, 200, 129}, {0, 1, 130, 64});
        for (gemm_backend b : backends) {
            compare_masked<RA, RB>(b, capacity, valid, 136, 256, true, t);
            compare_masked<RA, RB>(b, capacity, valid, 136, 256, false, t);
            compare_masked<RA, RB, bf16>(b, capacity, valid, 72, 256, true, t, storage_order::col_major);
        }
        compare_masked<recipes::mxfp8_e4m3, recipes::mxfp8_e4m3>(gemm_backend::sm89_mma, capacity, valid, 64, 160,
                                                                 false, t);
        t.message("masked");
    }

    TEST_CASE("grouped_scaled_gemm_k (weight gradient) against the host: ragged and empty token groups") {
        if (!sm89()) {
            MESSAGE("skipped: needs an sm_89+ GPU");
            return;
        }
        using R = recipes::blockwise_1x128;
        tally t;
        std::vector<gemm_backend> backends = {gemm_backend::sm89_mma};
        if (sm90()) backends.push_back(gemm_backend::sm90_wgmma);
        const std::vector<std::size_t> sizes =
            pick<std::vector<std::size_t>>({0, 1, 300, 128, 1000, 37}, {0, 1, 300, 37});
        const std::size_t N = pick<std::size_t>(257, 136), K = pick<std::size_t>(384, 130);
        for (gemm_backend b : backends) {
            compare_k<R>(b, sizes, N, K, true, t);
            compare_k<R>(b, sizes, N, K, false, t);
            gemm_options o;
            o.alpha = -0.5f;
            compare_k<R, bf16>(b, {200, 0, 5}, 72, 64, true, t, o);
        }
        compare_k<recipes::tensorwise_e4m3>(backends.back(), {130, 0, 40}, 64, 72, false, t);
        t.message("k-grouped");
    }

    TEST_CASE("grouped_quantize on a stream equals the host's, bit for bit: ragged and empty groups") {
        if (cuda::compute_capability() == 0) {
            MESSAGE("skipped: needs a GPU");
            return;
        }
        const std::vector<std::size_t> sizes = pick<std::vector<std::size_t>>({0, 1, 130, 64, 300, 0}, {0, 1, 130, 37});
        compare_grouped_quantize<recipes::blockwise_1x128>(sizes, 200);
        compare_grouped_quantize<recipes::tensorwise_e4m3>(sizes, 72);
        compare_grouped_quantize<recipes::mxfp8_e4m3>(sizes, 96);
        compare_grouped_quantize<recipes::blockwise_128x128>(sizes, 136);
    }

    TEST_CASE("grouped quantize and GEMMs captured into a CUDA graph (global mode) replay the eager results") {
        if (!sm89()) {
            MESSAGE("skipped: needs an sm_89+ GPU");
            return;
        }
        using R = recipes::blockwise_1x128;
        using RB = recipes::blockwise_128x128;
        const std::vector<std::size_t> sizes = {37, 0, 130};
        const std::size_t M = 167, N = 136, K = 256;
        auto g = octet_test::rng(2024);
        const cuda::device_buffer<float> dx(octet_test::with_edge_cases(g, M * K, 2.0f));
        const host_problem<R, RB> hp(sizes, N, K, false, 9);  // its B; its A is replaced by dx's on the device
        const device_problem<R, RB> dp(hp);
        const std::vector<quantized_cref<RB>> db = dp.b();
        const span<const quantized_cref<RB>> Bs(db.data(), db.size());
        cuda::device_buffer<std::uint8_t> a_data(hp.a.layout().data_bytes), a_scales(hp.a.layout().scale_bytes);
        const grouped_quantized_ref<R> A(a_data.data(), a_scales.data(), nullptr, hp.a.layout());
        cuda::device_buffer<bf16> d(M * N), dk(sizes.size() * N * N);
        const grouped_layout lt = make_grouped_layout<R>(grouped_cols(N, as_cspan(sizes)));
        cuda::device_buffer<std::uint8_t> t_data(lt.data_bytes), t_scales(lt.scale_bytes);
        const grouped_quantized_ref<R> T(t_data.data(), t_scales.data(), nullptr, lt);
        cuda::device_buffer<float> y(M * N);
        cudaStream_t s = nullptr;
        OCTET_CUDA_CHECK(cudaStreamCreate(&s));
        const stream_executor ex = on_stream(s);
        // quantize x by group, multiply by the experts' weights, quantize the result column-wise, and its
        // weight-gradient-like k-grouped product with itself
        auto step = [&] {
            grouped_quantize<R>(ex, matrix_ref<const float>(dx.data(), M, K), as_cspan(sizes), A);
            grouped_scaled_gemm(ex, A, Bs, matrix_ref<float>(y.data(), M, N));
            grouped_scaled_gemm(ex, A, Bs, matrix_ref<bf16>(d.data(), M, N));
            grouped_quantize<R>(ex, matrix_ref<const float>(y.data(), M, N), as_cspan(sizes), {}, T);
            grouped_scaled_gemm_k(ex, T, T, matrix_ref<bf16>(dk.data(), sizes.size() * N, N));
        };
        d.fill_bytes(0xFF);
        dk.fill_bytes(0xFF);
        step();
        OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
        const std::vector<bf16> eager = d.download(), eager_k = dk.download();
        cudaGraph_t graph = nullptr;
        OCTET_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        try {
            step();
        } catch (...) {
            cudaStreamEndCapture(s, &graph);
            if (graph) cudaGraphDestroy(graph);
            throw;
        }
        OCTET_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
        cudaGraphExec_t exec = nullptr;
        OCTET_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        for (int rep = 0; rep < 2; ++rep) {
            d.fill_bytes(0xFF);
            dk.fill_bytes(0xFF);
            OCTET_CUDA_CHECK(cudaGraphLaunch(exec, s));
            OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
            const std::vector<bf16> replay = d.download(), replay_k = dk.download();
            CHECK(std::memcmp(replay.data(), eager.data(), eager.size() * sizeof(bf16)) == 0);
            CHECK(std::memcmp(replay_k.data(), eager_k.data(), eager_k.size() * sizeof(bf16)) == 0);
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaStreamDestroy(s);
    }

    TEST_CASE("automatic picks sm90_wgmma on sm_90, sm89_mma for MX; K = 0 gives the bias") {
        if (!sm89()) {
            MESSAGE("skipped: needs an sm_89+ GPU");
            return;
        }
        tally t;
        const std::vector<std::size_t> s = {5, 0, 130};
        const gemm_backend want = sm90() ? gemm_backend::sm90_wgmma : gemm_backend::sm89_mma;
        const host_problem<recipes::blockwise_1x128, recipes::blockwise_128x128> hp(s, 64, 128, true, 5);
        const device_problem<recipes::blockwise_1x128, recipes::blockwise_128x128> dp(hp);
        const auto db = dp.b();
        cuda::device_buffer<float> d(hp.rows() * 64);
        const gemm_result r = grouped_scaled_gemm(
            on_stream(), dp.a(), span<const quantized_cref<recipes::blockwise_128x128>>(db.data(), db.size()),
            matrix_ref<float>(d.data(), hp.rows(), 64));
        CHECK(r.backend == want);
        // K = 0: D = bias on every row of every group
        compare<recipes::blockwise_1x128, recipes::blockwise_128x128>(want, s, 64, 0, true, t, {}, true);
    }
}

TEST_SUITE("cuda") {
    TEST_CASE("grouped_scaled_gemm on a stream: argument errors and refused backends, before any device work") {
        using RA = recipes::blockwise_1x128;
        using RB = recipes::blockwise_128x128;
        const std::vector<std::size_t> sizes = {3, 0, 5};
        const grouped_layout L = make_grouped_layout<RA>(grouped_rows(as_cspan(sizes), 256));
        const grouped_quantized_cref<RA> A(nullptr, nullptr, nullptr, L);
        const quant_layout lb = quant_layout_of<RB>::make(64, 256);
        std::vector<quantized_cref<RB>> B(3, quantized_cref<RB>(nullptr, nullptr, lb));
        const span<const quantized_cref<RB>> two(B.data(), 2), three(B.data(), 3);
        std::vector<float> d(9 * 64);  // host memory: each call below fails before the device checks
        CHECK_THROWS_WITH_AS(grouped_scaled_gemm(on_stream(), A, two, matrix_ref<float>(d.data(), 8, 64)),
                             doctest::Contains("pass one per group"), octet::error);
        CHECK_THROWS_WITH_AS(grouped_scaled_gemm(on_stream(), A, three, matrix_ref<float>(d.data(), 9, 64)),
                             doctest::Contains("it must be 8 x 64"), octet::error);
        gemm_options o;
        o.backend = gemm_backend::cublaslt;
        CHECK_THROWS_WITH_AS(grouped_scaled_gemm(on_stream(), A, three, matrix_ref<float>(d.data(), 8, 64), o),
                             doctest::Contains("no grouped cuBLASLt path"), octet::error);
        o.backend = gemm_backend::sm90_wgmma;
        o.split_k = 2;
        CHECK(grouped_scaled_gemm_support<RA, RB>(on_stream(), gemm_backend::sm90_wgmma, 256, o).find("split") !=
              std::string::npos);
        o.split_k = 0;
        o.beta = 1.0f;
        CHECK_THROWS_WITH_AS(grouped_scaled_gemm(on_stream(), A, three, matrix_ref<float>(d.data(), 8, 64), o),
                             doctest::Contains("must be 0"), octet::error);
        // NVFP4 has no grouped CUDA backend
        CHECK(!grouped_scaled_gemm_support<recipes::nvfp4, recipes::nvfp4>(on_stream(), gemm_backend::automatic, 256)
                   .empty());
    }
}

}  // namespace grouped_gemm_device_test
