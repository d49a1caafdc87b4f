// octet/optim/adamw.hpp: the fused AdamW step on compressed moments (host path).
//
//   octet::adamw_state<MCodec, VCodec, Master> st(n);              // owning host buffers, zero state
//   octet::adamw_hyper h;                                          // betas, eps, weight decay, policy, seed
//   octet::adamw_report r = octet::adamw_step(octet::on_host(), st.ref(), octet::as_cspan(grads), h, step, lr);
//
// Host scratch: none. adamw_step and count_nonfinite on the host allocate nothing (with
// on_host(pool), they start no thread either), so they have no ..._scratch_bytes query and never
// call a lent allocator (octet::with_allocator); adamw_state owns its buffers from construction.
//
// The stream overload is in optim/adamw.cuh, same name, same bits. One pass per element reads the
// weight (and its compensation), the gradient and both compressed moments, updates in float, and
// writes everything back; each block of 256 re-encodes its moments from the new values.
//
// The update (decoupled weight decay, bias correction, per-step learning rate; PyTorch's AdamW):
//     m = b1 m + (1 - b1) g            v = b2 v + (1 - b2) g^2
//     w = w (1 - lr wd) - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// computed in float with one rounding per operation, in this order (every multiply-add an explicit
// fma, see optim/detail/float_ops.hpp), from per-step scalars that the host computes in double:
//     m' = fma(b1, m, (1-b1) g)         v' = fma(b2, v, (1-b2) (g g))
//     d  = fma(sqrt(v'), 1/sqrt(1-b2^t), eps)          u = m' / d
//     w' = fma(-lr/(1-b1^t), u, w (1 - lr wd))
// then w' goes through the master-weight policy (master_weights.hpp) and m', v' through the
// codecs (state_codec.hpp). The float64 reference is octet/reference/adamw.hpp.
//
// Epsilon and zero second moments: eps must be > 0. The second moment is never negative and a
// non-zero one never decodes to zero (state_codec.hpp), and the update uses v' (which includes
// this step's g^2), so d >= eps and |u| <= |m'| / eps; an element whose m and v are both zero
// (never given a gradient, or in a zeroed block) gets u = 0 exactly and only decays.
//
// Non-finite gradients. A gradient element is offending when it is NaN, +-Inf, or so large that
// its square would overflow float (|g| >= 2^63). Policies:
//   * grad_nonfinite_policy::skip_step: the gradients are scanned first (one extra read of them); if any
//     element offends, nothing is written and the report says skipped = 1. The caller decides
//     whether the step counter advances (adamw_optimizer does not advance it). For sharded runs,
//     count_nonfinite on every shard, all-reduce, and skip the call everywhere when the sum is
//     non-zero: the local scan cannot see other shards.
//   * grad_nonfinite_policy::zero_block: single pass; a block of 256 with an offending element keeps
//     its weights (and compensation) unchanged and has both moments reset to zero; other blocks
//     update normally.
// Either way the report counts offending elements, zeroed blocks and skipped steps.
//
// Determinism: the result is a function of the inputs only: the same for any thread count, any
// shard split on block boundaries (element_offset), and on host and device. Stochastic rounding
// of bf16 master weights draws element i's bits from philox_stream{seed, step}.bits(offset + i);
// the bf16_stochastic moment codec draws from the same stream in a disjoint range of Philox
// blocks, one per moment (state_codec.hpp), so the three never share bits.
#pragma once

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "octet/core/bits.hpp"
#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/isa_dispatch.hpp"
#include "octet/core/philox.hpp"
#include "octet/core/span.hpp"
#include "octet/optim/detail/float_ops.hpp"
#include "octet/optim/detail/team.hpp"
#include "octet/optim/master_weights.hpp"
#include "octet/optim/state_codec.hpp"

namespace octet {

/// What a step does with gradients that are NaN, +-Inf or >= 2^63 in magnitude (see the header
/// comment). Not to be confused with rl's token_nonfinite_policy, which governs log-probabilities.
enum class grad_nonfinite_policy : std::uint32_t { skip_step = 1, zero_block = 2 };

/// Hyperparameters that stay fixed over a run (the learning rate is per step).
struct adamw_hyper {
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;
    float weight_decay = 0.01f;
    grad_nonfinite_policy on_nonfinite = grad_nonfinite_policy::skip_step;
    std::uint64_t seed = 0;  ///< Philox seed for stochastic rounding (bf16 master weights, bf16_stochastic moments)
    /// Multiplies every gradient as the step reads it (float, rounded once): the clipping
    /// coefficient, a loss scale's inverse or 1 / micro-batches, without a pass over the gradients
    /// and without rounding bf16 gradients a second time. In (0, 1], so that a finite gradient stays
    /// finite (the non-finite checks read the gradients as given). It may change from step to step;
    /// checkpoints do not keep it. 1 (the default) reads the gradients as they are, bit for bit.
    float grad_scale = 1.0f;
};

/// What a step did. The device overload writes it to device memory.
struct adamw_report {
    std::uint64_t nonfinite_gradients = 0;  ///< offending gradient elements seen
    std::uint64_t blocks_zeroed = 0;        ///< blocks whose moments were reset (zero_block)
    std::uint64_t skipped = 0;              ///< 1 when the whole step was skipped (skip_step)
};

/// Per-step scalars, computed on the host in double and rounded once to float; the host path and
/// the kernels read the same values.
struct adamw_coeffs {
    float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
    float neg_step_size;  ///< -lr / (1 - beta1^t)
    float inv_sqrt_bc2;   ///< 1 / sqrt(1 - beta2^t)
    float decay;          ///< 1 - lr * weight_decay
    float grad_scale;     ///< hyper.grad_scale
    philox_stream rng;    ///< {seed, t}
};

/// Views of the optimizer state of n parameters (host or device memory, as the executor says).
/// Sizes: params, m_codes, v_codes: n; compensation: n for master::bf16_kahan, else empty;
/// m_meta / v_meta: state_meta_count<Codec>(n) (empty for codecs without meta). A shard of a flat
/// parameter buffer is the same views offset by a multiple of optim_block, with element_offset
/// its global index.
template <class MCodec, class VCodec = MCodec, class Master = master::fp32>
struct adamw_state_ref {
    static_assert(is_state_codec_v<MCodec> && is_state_codec_v<VCodec>,
                  "octet::adamw_state_ref: MCodec and VCodec must be octet::state_codec::{fp32, bf16_stochastic, bf16, "
                  "e4m3_scaled, e4m3_expanded, dynamic8} (or a type with the same members whose group divides 256)");
    static_assert(
        is_master_weights_v<Master>,
        "octet::adamw_state_ref: Master must be octet::master::{fp32, bf16_nearest, bf16_stochastic, bf16_kahan}");
    using m_codec = MCodec;
    using v_codec = VCodec;
    using master_type = Master;

    span<typename Master::weight_type> params;
    span<typename Master::comp_type> compensation;
    span<typename MCodec::code_type> m_codes;
    span<typename MCodec::meta_type> m_meta;
    span<typename VCodec::code_type> v_codes;
    span<typename VCodec::meta_type> v_meta;
    std::uint64_t element_offset = 0;

    std::size_t size() const { return params.size(); }

    /// The views of elements [begin, begin + count) as a shard (begin a multiple of optim_block).
    adamw_state_ref shard(std::size_t begin, std::size_t count) const {
        OCTET_REQUIRE(
            begin % optim_block == 0, "octet::adamw_state_ref::shard", "begin",
            detail::message("is ", begin, "; shards start on block boundaries (multiples of ", optim_block, ")"));
        OCTET_REQUIRE(begin + count <= size(), "octet::adamw_state_ref::shard", "count",
                      detail::message("reaches ", begin + count, " past the ", size(), " elements"));
        auto meta_part = [&](auto s, int group) {
            using S = decltype(s);
            if (s.empty()) return S{};
            const std::size_t b = begin / static_cast<std::size_t>(group);
            const std::size_t e = (begin + count + group - 1) / static_cast<std::size_t>(group);
            return s.subspan(b, e - b);
        };
        adamw_state_ref out;
        out.params = params.subspan(begin, count);
        out.compensation = compensation.empty() ? compensation : compensation.subspan(begin, count);
        out.m_codes = m_codes.subspan(begin, count);
        out.v_codes = v_codes.subspan(begin, count);
        out.m_meta = meta_part(m_meta, MCodec::group);
        out.v_meta = meta_part(v_meta, VCodec::group);
        out.element_offset = element_offset + begin;
        return out;
    }
};

/// Owning host buffers for the state of n parameters, zero-initialized (the valid zero state).
template <class MCodec, class VCodec = MCodec, class Master = master::fp32>
class adamw_state {
public:
    using ref_type = adamw_state_ref<MCodec, VCodec, Master>;
    using weight_type = typename Master::weight_type;

    adamw_state() = default;
    explicit adamw_state(std::size_t n)
        : params(n),
          compensation(Master::has_compensation ? n : 0),
          m_codes(n),
          m_meta(state_meta_count<MCodec>(n)),
          v_codes(n),
          v_meta(state_meta_count<VCodec>(n)) {}

    ref_type ref() {
        return ref_type{as_span(params),
                        as_span(compensation),
                        as_span(m_codes),
                        as_span(m_meta),
                        as_span(v_codes),
                        as_span(v_meta),
                        0};
    }
    std::size_t size() const { return params.size(); }

    /// Sets the weights from floats (bf16 policies round to nearest; Kahan keeps the remainder).
    void set_params(span<const float> x) {
        OCTET_REQUIRE(x.size() == params.size(), "octet::adamw_state::set_params", "x",
                      detail::message("has ", x.size(), " elements for ", params.size(), " parameters"));
        for (std::size_t i = 0; i < x.size(); ++i) {
            if constexpr (Master::has_compensation)
                Master::store(x[i], params[i], compensation[i], 0u);
            else if constexpr (std::is_same_v<weight_type, float>)
                params[i] = x[i];
            else
                params[i] = to_bf16(x[i]);  // nearest, also for the stochastic policy
        }
    }
    /// The weights as floats (w + c for Kahan).
    std::vector<float> params_as_float() const {
        std::vector<float> out(params.size());
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = Master::load(params[i], comp_at(i));
        return out;
    }

    std::vector<weight_type> params;
    std::vector<typename Master::comp_type> compensation;
    std::vector<typename MCodec::code_type> m_codes;
    std::vector<typename MCodec::meta_type> m_meta;
    std::vector<typename VCodec::code_type> v_codes;
    std::vector<typename VCodec::meta_type> v_meta;

private:
    typename Master::comp_type comp_at(std::size_t i) const {
        if constexpr (Master::has_compensation)
            return compensation[i];
        else
            return {};
    }
};

namespace optim_detail {

OCTET_OPTIM_HD float to_f(float x) {
    return x;
}
OCTET_OPTIM_HD float to_f(::octet::bf16 x) {
    return to_float(x);
}

template <class G>
inline constexpr bool is_grad_type_v = std::is_same_v<G, float> || std::is_same_v<G, ::octet::bf16>;

/// NaN, +-Inf, or |g| >= 2^63 (its square would overflow float).
OCTET_OPTIM_HD bool offending(float g) {
    return !(abs_rn(g) < 9.22337204e18f);
}

/// One element's Adam direction u = m' / (sqrt(v') / sqrt(bc2) + eps); updates m and v in place.
OCTET_OPTIM_HD float adamw_direction(float g, float& m, float& v, const adamw_coeffs& c) {
    m = fma_rn(c.beta1, m, mul_rn(c.one_minus_beta1, g));
    v = fma_rn(c.beta2, v, mul_rn(c.one_minus_beta2, mul_rn(g, g)));
    const float denom = fma_rn(sqrt_rn(v), c.inv_sqrt_bc2, c.eps);
    return div_rn(m, denom);
}

/// The new weight before the master policy: w (1 - lr wd) - step_size u.
OCTET_OPTIM_HD float adamw_target(float w, float u, const adamw_coeffs& c) {
    return fma_rn(c.neg_step_size, u, mul_rn(w, c.decay));
}

template <class MCodec, class VCodec, class Master, class Grad>
struct adamw_block_args {
    typename Master::weight_type* params;
    typename Master::comp_type* comp;
    typename MCodec::code_type* m_codes;
    typename MCodec::meta_type* m_meta;
    typename VCodec::code_type* v_codes;
    typename VCodec::meta_type* v_meta;
    const Grad* grads;
    std::size_t n;
    std::uint64_t element_offset;
    adamw_coeffs c;
    grad_nonfinite_policy policy;
    bool vectorized;  ///< every pointer 16-byte aligned (device loads)
};

struct block_result {
    std::uint32_t nonfinite;  ///< offending gradients in this member's slice
    std::uint32_t zeroed;     ///< 1 on the block's first member when the block was zeroed
};

/// The fused step on one block of 256 elements, as one member of `team` (host: the whole block;
/// device: a warp lane's 8 elements). The same function runs on host and device.
template <class MCodec, class VCodec, class Master, class Grad, class Team>
OCTET_OPTIM_HD block_result adamw_block(const Team& team, const adamw_block_args<MCodec, VCodec, Master, Grad>& a,
                                        const codec_context& ctx, std::size_t block) {
    constexpr int P = Team::per_member;
    const std::size_t start = block * optim_block + static_cast<std::size_t>(team.rank()) * P;
    const int valid = start < a.n ? (a.n - start < static_cast<std::size_t>(P) ? static_cast<int>(a.n - start) : P) : 0;

    Grad graw[P];
    team.load(a.grads + start, valid, graw, a.vectorized);
    float g[P];
    int bad = 0;
    OCTET_OPTIM_UNROLL
    for (int i = 0; i < P; ++i) {
        g[i] = to_f(graw[i]);  // 0 beyond valid (team.load)
        bad += offending(g[i]) ? 1 : 0;
        g[i] = mul_rn(g[i], a.c.grad_scale);  // exact when 1
    }
    if (a.policy == grad_nonfinite_policy::zero_block) {
        if (team.sum(bad) != 0) {
            zero_slice<MCodec, Team, P>(team, start, valid, a.m_codes, a.m_meta, a.vectorized);
            zero_slice<VCodec, Team, P>(team, start, valid, a.v_codes, a.v_meta, a.vectorized);
            return block_result{static_cast<std::uint32_t>(bad), team.rank() == 0 ? 1u : 0u};
        }
    }

    typename MCodec::code_type mc[P];
    typename VCodec::code_type vc[P];
    team.load(a.m_codes + start, valid, mc, a.vectorized);
    team.load(a.v_codes + start, valid, vc, a.vectorized);
    float m[P], v[P];
    decode_slice<MCodec, moment::first, P>(mc, a.m_meta, start, valid, ctx, m);
    decode_slice<VCodec, moment::second, P>(vc, a.v_meta, start, valid, ctx, v);

    typename Master::weight_type w[P];
    typename Master::comp_type cp[P];
    team.load(a.params + start, valid, w, a.vectorized);
    if constexpr (Master::has_compensation) team.load(a.comp + start, valid, cp, a.vectorized);
    philox4 r4{};
    OCTET_OPTIM_UNROLL
    for (int i = 0; i < P; ++i) {
        if constexpr (Master::uses_random_bits) {
            if ((i & 3) == 0) r4 = a.c.rng.block((a.element_offset + start + static_cast<std::size_t>(i)) >> 2);
        }
        // beyond valid everything is 0 and stays 0 (and is not stored): no condition needed
        const float u = adamw_direction(g[i], m[i], v[i], a.c);
        const float target = adamw_target(Master::load(w[i], cp[i]), u, a.c);
        Master::store(target, w[i], cp[i], Master::uses_random_bits ? r4.v[i & 3] : 0u);
    }
    team.store(a.params + start, valid, w, a.vectorized);
    if constexpr (Master::has_compensation) team.store(a.comp + start, valid, cp, a.vectorized);

    const moment_bits bits{a.c.rng, a.element_offset + start};  // stochastic moment codecs (state_codec.hpp)
    encode_slice<MCodec, moment::first>(team, m, start, valid, a.m_meta, ctx, mc, bits);
    encode_slice<VCodec, moment::second>(team, v, start, valid, a.v_meta, ctx, vc, bits);
    team.store(a.m_codes + start, valid, mc, a.vectorized);
    team.store(a.v_codes + start, valid, vc, a.vectorized);
    return block_result{static_cast<std::uint32_t>(bad), 0u};
}

template <class Ref>
void check_state(const char* fn, const Ref& s) {
    using MC = typename Ref::m_codec;
    using VC = typename Ref::v_codec;
    using M = typename Ref::master_type;
    const std::size_t n = s.size();
    OCTET_REQUIRE(s.m_codes.size() == n, fn, "state.m_codes",
                  detail::message("has ", s.m_codes.size(), " codes for ", n, " parameters; pass one per parameter"));
    OCTET_REQUIRE(s.v_codes.size() == n, fn, "state.v_codes",
                  detail::message("has ", s.v_codes.size(), " codes for ", n, " parameters; pass one per parameter"));
    OCTET_REQUIRE(s.m_meta.size() == state_meta_count<MC>(n), fn, "state.m_meta",
                  detail::message("has ", s.m_meta.size(), " entries; ", n,
                                  " parameters need state_meta_count = ", state_meta_count<MC>(n)));
    OCTET_REQUIRE(s.v_meta.size() == state_meta_count<VC>(n), fn, "state.v_meta",
                  detail::message("has ", s.v_meta.size(), " entries; ", n,
                                  " parameters need state_meta_count = ", state_meta_count<VC>(n)));
    OCTET_REQUIRE(s.compensation.size() == (M::has_compensation ? n : 0), fn, "state.compensation",
                  detail::message("has ", s.compensation.size(), " elements; this master-weight policy needs ",
                                  M::has_compensation ? n : 0));
    OCTET_REQUIRE(s.element_offset % optim_block == 0, fn, "state.element_offset",
                  detail::message("is ", s.element_offset, "; shards start on block boundaries (multiples of ",
                                  optim_block, ")"));
    OCTET_REQUIRE(n == 0 || (s.params.data() && s.m_codes.data() && s.v_codes.data()), fn, "state",
                  "has a null view with a non-zero size");
    OCTET_REQUIRE(!MC::has_meta || n == 0 || s.m_meta.data(), fn, "state.m_meta", "is null with a non-zero size");
    OCTET_REQUIRE(!VC::has_meta || n == 0 || s.v_meta.data(), fn, "state.v_meta", "is null with a non-zero size");
    OCTET_REQUIRE(!M::has_compensation || n == 0 || s.compensation.data(), fn, "state.compensation",
                  "is null with a non-zero size");
}

inline void check_hyper(const char* fn, const adamw_hyper& h, std::uint64_t step, float lr) {
    OCTET_REQUIRE(h.beta1 >= 0.0f && h.beta1 < 1.0f, fn, "hyper.beta1",
                  detail::message("is ", h.beta1, "; pass a value in [0, 1)"));
    OCTET_REQUIRE(h.beta2 >= 0.0f && h.beta2 < 1.0f, fn, "hyper.beta2",
                  detail::message("is ", h.beta2, "; pass a value in [0, 1)"));
    OCTET_REQUIRE(h.eps > 0.0f && std::isfinite(h.eps), fn, "hyper.eps",
                  detail::message("is ", h.eps, "; eps must be finite and > 0 (it bounds the update when v is 0)"));
    OCTET_REQUIRE(h.weight_decay >= 0.0f && std::isfinite(h.weight_decay), fn, "hyper.weight_decay",
                  detail::message("is ", h.weight_decay, "; pass a finite value >= 0"));
    OCTET_REQUIRE(
        h.on_nonfinite == grad_nonfinite_policy::skip_step || h.on_nonfinite == grad_nonfinite_policy::zero_block, fn,
        "hyper.on_nonfinite", "is not a grad_nonfinite_policy");
    OCTET_REQUIRE(h.grad_scale > 0.0f && h.grad_scale <= 1.0f, fn, "hyper.grad_scale",
                  detail::message("is ", h.grad_scale,
                                  "; pass a scale in (0, 1] (1: the gradients as given; divide by the loss scale or "
                                  "clip with a factor below 1)"));
    OCTET_REQUIRE(step >= 1, fn, "step", "is 0; steps count from 1 (bias correction divides by 1 - beta^step)");
    OCTET_REQUIRE(lr >= 0.0f && std::isfinite(lr), fn, "lr",
                  detail::message("is ", lr, "; pass a finite learning rate >= 0"));
}

template <class Ref, class Grad>
void check_step(const char* fn, const Ref& s, std::size_t grads, const adamw_hyper& h, std::uint64_t step, float lr) {
    static_assert(is_grad_type_v<Grad>,
                  "octet::adamw_step: gradients must be float or octet::bf16 (__nv_bfloat16 on a stream)");
    check_state(fn, s);
    OCTET_REQUIRE(grads == s.size(), fn, "grads",
                  detail::message("has ", grads, " elements for ", s.size(), " parameters"));
    check_hyper(fn, h, step, lr);
}

}  // namespace optim_detail

/// The per-step scalars (validated).
inline adamw_coeffs make_adamw_coeffs(const adamw_hyper& h, std::uint64_t step, float lr) {
    optim_detail::check_hyper("octet::make_adamw_coeffs", h, step, lr);
    const double b1 = h.beta1, b2 = h.beta2, t = static_cast<double>(step);
    const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
    adamw_coeffs c{};
    c.beta1 = h.beta1;
    c.one_minus_beta1 = static_cast<float>(1.0 - b1);
    c.beta2 = h.beta2;
    c.one_minus_beta2 = static_cast<float>(1.0 - b2);
    c.eps = h.eps;
    c.neg_step_size = static_cast<float>(-static_cast<double>(lr) / bc1);
    c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
    c.decay = static_cast<float>(1.0 - static_cast<double>(lr) * h.weight_decay);
    c.grad_scale = h.grad_scale;
    c.rng = philox_stream{h.seed, step};
    return c;
}

/// Number of offending gradient elements (NaN, +-Inf, |g| >= 2^63).
template <class Grad>
std::uint64_t count_nonfinite(host_executor ex, span<const Grad> grads) {
    static_assert(optim_detail::is_grad_type_v<Grad>, "octet::count_nonfinite: gradients must be float or octet::bf16");
    OCTET_REQUIRE(grads.empty() || grads.data(), "octet::count_nonfinite", "grads", "is null with a non-zero size");
    std::atomic<std::uint64_t> total{0};
    parallel_for(ex, grads.size(), std::size_t{1} << 16, [&](std::size_t b, std::size_t e) {
        std::uint64_t local = 0;
        for (std::size_t i = b; i < e; ++i) local += optim_detail::offending(optim_detail::to_f(grads[i])) ? 1 : 0;
        total += local;
    });
    return total.load();
}

namespace optim_detail {

/// The executor half of octet::adamw_step, specialized per executor: `element<Grad>` maps the
/// caller's gradient type to octet's (the stream's also takes CUDA's __nv_bfloat16); `report_out`
/// is where the report goes besides the result (the host returns it: nothing; a stream writes it to
/// device memory: adamw_report*); run(...) with the arguments already checked by the entry. The
/// host's is here, the stream's in adamw.cuh.
template <class Executor>
struct step_backend;

/// The step kernel's arguments for one state and its gradients (host and stream alike);
/// `vectorized` when every pointer is 16-byte aligned (device loads).
template <class MCodec, class VCodec, class Master, class Grad>
adamw_block_args<MCodec, VCodec, Master, Grad> block_args_of(const adamw_state_ref<MCodec, VCodec, Master>& state,
                                                             span<const Grad> grads, const adamw_hyper& hyper,
                                                             std::uint64_t step, float lr, bool vectorized) {
    return {state.params.data(),  state.compensation.data(),
            state.m_codes.data(), state.m_meta.data(),
            state.v_codes.data(), state.v_meta.data(),
            grads.data(),         state.size(),
            state.element_offset, make_adamw_coeffs(hyper, step, lr),
            hyper.on_nonfinite,   vectorized};
}

/// The host step over blocks [b, e) as an ISA-dispatched kernel (core/isa_dispatch.hpp,
/// run_fma_kernel: the step's rules are contraction-free by construction, so every variant gives the
/// same bits; tests/host/optim_adamw.cpp compares them).
template <class MCodec, class VCodec, class Master, class Grad>
struct adamw_blocks_kernel {
    static OCTET_KERNEL_INLINE void run(const adamw_block_args<MCodec, VCodec, Master, Grad>* args, std::size_t b,
                                        std::size_t e, std::uint64_t* bad, std::uint64_t* zeroed) {
        const host_team team;
        const codec_context ctx = host_codec_context();
        std::uint64_t lb = 0, lz = 0;
        for (std::size_t blk = b; blk < e; ++blk) {
            const auto r = adamw_block(team, *args, ctx, blk);
            lb += r.nonfinite;
            lz += r.zeroed;
        }
        *bad = lb;
        *zeroed = lz;
    }
};

template <>
struct step_backend<host_executor> {
    template <class Grad>
    using element = Grad;
    using report_out = std::nullptr_t;
    using result = adamw_report;

    template <class MCodec, class VCodec, class Master, class Grad>
    static adamw_report run(host_executor ex, const adamw_state_ref<MCodec, VCodec, Master>& state,
                            span<const Grad> grads, const adamw_hyper& hyper, std::uint64_t step, float lr,
                            std::nullptr_t, detail::simd_isa isa = detail::best_fma_isa()) {
        adamw_report report;
        if (hyper.on_nonfinite == grad_nonfinite_policy::skip_step) {
            report.nonfinite_gradients = count_nonfinite(ex, grads);
            if (report.nonfinite_gradients != 0) {
                report.skipped = 1;
                return report;
            }
        }
        const auto args = block_args_of(state, grads, hyper, step, lr, false);
        const std::size_t blocks = (state.size() + optim_block - 1) / optim_block;
        std::atomic<std::uint64_t> bad{0}, zeroed{0};
        parallel_for(ex, blocks, 64, [&](std::size_t b, std::size_t e) {
            std::uint64_t lb = 0, lz = 0;
            detail::run_fma_kernel<adamw_blocks_kernel<MCodec, VCodec, Master, Grad>>(isa, &args, b, e, &lb, &lz);
            bad += lb;
            zeroed += lz;
        });
        report.nonfinite_gradients = bad.load();
        report.blocks_zeroed = zeroed.load();
        return report;
    }
};

}  // namespace optim_detail

/// One fused AdamW step over the state, on the executor; `step` counts from 1. On the host it
/// returns the report; on a CUDA stream (octet/optim/adamw.cuh: device memory everywhere, grads
/// may also be __nv_bfloat16) it enqueues the step, writes the report to `report` (device memory
/// for one adamw_report) and returns nothing, never synchronizing.
template <class MCodec, class VCodec, class Master, class Grad, class Executor>
typename optim_detail::step_backend<Executor>::result adamw_step(
    const Executor& ex, const adamw_state_ref<MCodec, VCodec, Master>& state, span<const Grad> grads,
    const adamw_hyper& hyper, std::uint64_t step, float lr,
    typename optim_detail::step_backend<Executor>::report_out report = {}) {
    using backend = optim_detail::step_backend<Executor>;
    using G = typename backend::template element<Grad>;
    constexpr const char* fn = "octet::adamw_step";
    optim_detail::check_step<adamw_state_ref<MCodec, VCodec, Master>, G>(fn, state, grads.size(), hyper, step, lr);
    OCTET_REQUIRE(grads.empty() || grads.data(), fn, "grads", "is null with a non-zero size");
    const span<const G> g(reinterpret_cast<const G*>(grads.data()), grads.size());
    return backend::run(ex, state, g, hyper, step, lr, report);
}

}  // namespace octet
