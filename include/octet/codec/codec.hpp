// octet/codec/codec.hpp: geometry-aware gradient codecs: the entries (the encoders, one template
// over the executor; the header-reading decoders) and the host backend (multi-threaded); the
// stream backend and the stream's non-synchronizing decoders are in codec.cuh.
//
//   octet::codec_config cfg{octet::wire_format::e4m3, octet::transform_kind::hadamard, 1024};
//   std::vector<std::uint8_t> msg(octet::encoded_size(cfg, g.size()));
//   octet::encode_gradient(octet::on_host(), cfg, g, msg);                 // transform, scale, encode
//   octet::decode_gradient(octet::on_host(), msg, g_hat);                  // validate, decode, invert
//
//   octet::error_feedback fb(g.size(), octet::residual_storage::bf16);
//   octet::encode_gradient(octet::on_host(), cfg, g, msg, {0, fb.view()}); // with error feedback
//
// Host scratch: each host encode and decode takes its temporaries as one block, from the executor's
// allocator when one is lent (octet::with_allocator), else ::operator new; at most
//   encode_gradient_scratch_bytes(ex, cfg, n, opt)   encode_gradient_transformed_scratch_bytes(ex, cfg, n, opt)
//   decode_gradient_scratch_bytes(ex, cfg, n)        (decode_gradient_transformed takes none)
// The host encode and decode stream the message in spans of 16 K coordinates (or a transform or
// scale block, if larger): their scratch is a few spans per thread, whatever n.
//
// Stages (also public, for collectives that sum in rotated coordinates, see comm/allreduce.hpp):
//   encode_gradient_transformed(ex, cfg, y, n, msg)   y: the L transformed coordinates of n elements
//   decode_gradient_transformed(ex, msg, y, add)      y = (or +=) the L dequantized coordinates
//
// Encoding an n-element gradient x (cfg.transform T, L = transform_length(T, n, block)):
//   1. with feedback: x' = x + e (residual e, in x's coordinates; see feedback.hpp), else x' = x;
//   2. y = T x' (hadamard.hpp: L floats; the ragged tail is zero-padded in a local copy);
//   3. per scale block of Bs coordinates: amax = largest finite |y_j|; the block's scale and codes
//      come from the format's recipe rules (make_block_scale, encode_scaled in quant/scale.hpp,
//      saturating; nearest-even, or stochastic with cfg.stochastic): code_j = encode(y_j / S).
//      NVFP4's tensor scale is make_tensor_scale(largest finite |y| of the message);
//   4. with feedback: e <- T^-1 (y - dequantize(codes)), restricted to the n real coordinates;
//   5. header and checksum (wire.hpp).
// Decoding validates the whole message first (wire.hpp), then y_hat_j = decode(code_j) * S and
// x_hat = T^-1 y_hat. Identical bits on host and device (codec.cuh) for the same message, provided
// the host compiler does not contract a*b+c into FMA (plain x86-64, or -ffp-contract=off; device
// products that feed adds use __fmul_rn).
//
// Error bound (error_bound below; docs/codecs-and-collectives.md): one encode/decode of x satisfies
//   ||x_hat - x||_2 <= beta ||x||_2 + eta sqrt(L)
//   beta = eps + alpha sqrt(Bs) + zeta sqrt(L) + 3 (log2 B + 1) 2^-24,
// eps = 2^-(M+1) the format's relative rounding (M mantissa bits), alpha the per-block absolute term
// (half the smallest subnormal times S / amax; for NVFP4 also the saturation an E4M3-rounded block
// scale allows), zeta NVFP4's two-level underflow term, eta the scale floors (below 1e-40). Values:
//   e4m3  eps 2^-4, alpha 2^-10/448                 e5m2  eps 2^-3, alpha 2^-17/57344
//   mxfp8 eps 2^-4, alpha 2^-9/448 (scale < 2 amax/448)   nvfp4 eps 2^-2, alpha 2^-4, zeta 2^-10/448
// Stochastic rounding errs by up to a whole step: eps and the subnormal terms double (NVFP4's alpha
// becomes 0.0885). It is a worst case (every element at the worst point of its rounding interval);
// measured errors are 2.5 to 5 times smaller (tests/host/codec_quality.cpp prints both).
//
// Non-finite inputs are data: amax ignores them (every scale stays valid), and each one takes a
// non-finite code where the format has one (encode_wire_code: E4M3 / MXFP8 the NaN code, E5M2 +-Inf
// or NaN), so it decodes non-finite and the header counts it: a NaN or Inf gradient never arrives
// finite. E2M1 (NVFP4) has no such code: an Inf saturates to +-6 S and a NaN gives +6 S. Under
// Hadamard one non-finite element makes its whole block non-finite before quantization.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "octet/codec/feedback.hpp"
#include "octet/codec/hadamard.hpp"
#include "octet/codec/wire.hpp"
#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/philox.hpp"
#include "octet/core/span.hpp"
#include "octet/format/encode.hpp"
#include "octet/format/packed.hpp"
#include "octet/quant/scale.hpp"
#include "octet/quant/tensor.hpp"

namespace octet {

struct encode_options {
    std::uint64_t first_index = 0;    ///< global index of x[0] (the sign pattern's position); shards pass their offset
    residual_view feedback{};         ///< error-feedback residual of x's size (empty: none)
    std::uint64_t random_stream = 0;  ///< added to the stochastic-rounding stream (ranks and stages use different ones)
};

struct encode_result {
    std::size_t bytes = 0;  ///< message size
    float amax = 0.0f;      ///< largest finite |y| over the transformed coordinates
};

/// The worst-case error of one encode/decode: ||x_hat - x|| <= relative * ||x|| + absolute.
struct codec_bound {
    double relative = 0.0;
    double absolute = 0.0;
    double of(double norm) const { return relative * norm + absolute; }
};

inline codec_bound error_bound(const codec_config& cfg, std::size_t n) {
    const wire_layout l = wire_layout_of(cfg, n);
    // Nearest rounding errs by at most half a step, stochastic rounding by less than one.
    const double r = cfg.stochastic ? 2.0 : 1.0;
    double eps = 0, alpha = 0, zeta = 0, eta = 0;
    switch (cfg.format) {
        case wire_format::e4m3:
            eps = r * 0x1p-4;
            alpha = r * 0x1p-10 / 448.0;
            eta = r * 0x1p-10 * 0x1p-126;
            break;
        case wire_format::e5m2:
            eps = r * 0x1p-3;
            alpha = r * 0x1p-17 / 57344.0;
            eta = r * 0x1p-17 * 0x1p-126;
            break;
        case wire_format::mxfp8:
            eps = r * 0x1p-4;
            alpha = r * 2.0 * 0x1p-10 / 448.0;
            eta = r * 0x1p-10 * 0x1p-127;
            break;
        case wire_format::nvfp4:
            // saturation under an E4M3 scale rounded down (2^-4 amax), or the subnormal step
            // (0.25 r S with S <= (17/16) amax / 6), whichever is larger; zeta: the block scale's
            // own E4M3 underflow relative to the tensor amax.
            eps = r * 0x1p-2;
            alpha = std::max(0x1p-4, 0.25 * r * (17.0 / 16.0) / 6.0);
            zeta = 1.01 * 0x1p-10 / 448.0;
            eta = r * 0.25 * 0x1p-125;
            break;
    }
    const int k = cfg.transform == transform_kind::hadamard ? log2_exact(l.block) : 0;
    codec_bound b;
    b.relative =
        (eps + alpha * std::sqrt(static_cast<double>(l.scale_block)) + zeta * std::sqrt(static_cast<double>(l.coded))) *
            (1.0 + 0x1p-20) +
        3.0 * (k + 1) * 0x1p-24;
    b.absolute = eta * std::sqrt(static_cast<double>(l.coded));
    return b;
}

namespace detail {

/// Scale blocks [k0, k1) of a message's coordinates: their scales and codes (and, with deq, the
/// dequantized values). y and deq hold the coordinates from `origin` on (y[j - origin] is
/// coordinate j). A plain function: its pointers are locals that the byte stores cannot alias (as
/// a lambda's captures could), so the loops vectorize.
template <class Tr, class Round>
void quantize_blocks(std::size_t k0, std::size_t k1, std::size_t Bs, std::size_t coded, const float* y,
                     float tensor_scale, std::uint8_t* scales, std::uint8_t* payload, float* deq, philox_stream rng,
                     std::uint64_t first_index, std::size_t origin) {
    using R = typename Tr::template recipe_with<Round>;
    using Fmt = typename R::format;
    // Random bits only for stochastic rounding (a Philox block costs more than the encode itself).
    auto random_bits = [rng, first_index](std::size_t j) -> std::uint32_t {
        if constexpr (std::is_same_v<Round, round::stochastic>)
            return rng.bits(first_index + j);
        else
            return (void)rng, (void)first_index, (void)j, 0u;
    };
    for (std::size_t k = k0; k < k1; ++k) {
        const std::size_t b = k * Bs, e = std::min<std::size_t>(coded, b + Bs);
        float amax = 0.0f;
        for (std::size_t j = b; j < e; ++j) amax = std::max(amax, finite_abs(y[j - origin]));
        const block_scale s = make_block_scale<R>(amax, tensor_scale);
        if constexpr (Tr::scale_bytes == 4)
            store_le32(scales + 4 * k, s.stored);
        else
            scales[k] = static_cast<std::uint8_t>(s.stored);
        if constexpr (Fmt::bits <= 4) {
            // Bs is even, so a block owns whole bytes; an odd L leaves a zero high nibble at the end.
            for (std::size_t j0 = b; j0 < e; j0 += 64) {
                const std::size_t m = std::min<std::size_t>(64, e - j0);
                std::uint8_t c[64 + 1];
                for (std::size_t t = 0; t < m; ++t)
                    c[t] = encode_scaled<R>(y[j0 + t - origin], s.value, random_bits(j0 + t));
                c[m] = 0;  // the high nibble after an odd last element
                for (std::size_t t = 0; t < m; t += 2) payload[(j0 + t) / 2] = pack_fp4x2(c[t], c[t + 1]);
            }
            if (deq)
                for (std::size_t j = b; j < e; ++j)
                    deq[j - origin] =
                        mul_rn(decode<Fmt>(unpack_fp4(payload[j / 2], static_cast<int>(j & 1u))), s.value);
        } else {
            for (std::size_t j = b; j < e; ++j)
                payload[j] = encode_wire_code<R>(y[j - origin], s.value, random_bits(j));
            if (deq)
                for (std::size_t j = b; j < e; ++j) deq[j - origin] = mul_rn(decode<Fmt>(payload[j]), s.value);
        }
    }
}

/// Scale blocks [k0, k1) of a message's coordinates dequantized: y[j - origin] = (add: +=)
/// coordinate j (a plain function for the same reason as quantize_blocks).
template <class Tr>
void dequantize_blocks(std::size_t k0, std::size_t k1, std::size_t Bs, std::size_t coded, const std::uint8_t* scales,
                       const std::uint8_t* payload, float tensor_scale, float* y, bool add, std::size_t origin) {
    using R = typename Tr::recipe;
    using Fmt = typename R::format;
    for (std::size_t k = k0; k < k1; ++k) {
        const std::uint32_t stored = Tr::scale_bytes == 4 ? load_le32(scales + 4 * k) : scales[k];
        const float S = stored_scale_value<R>(stored, tensor_scale);
        const std::size_t b = k * Bs, e = std::min<std::size_t>(coded, b + Bs);
        if (add) {
            for (std::size_t j = b; j < e; ++j) {
                const std::uint8_t c =
                    Fmt::bits <= 4 ? unpack_fp4(payload[j / 2], static_cast<int>(j & 1u)) : payload[j];
                y[j - origin] = y[j - origin] + mul_rn(decode<Fmt>(c), S);
            }
        } else {
            for (std::size_t j = b; j < e; ++j) {
                const std::uint8_t c =
                    Fmt::bits <= 4 ? unpack_fp4(payload[j / 2], static_cast<int>(j & 1u)) : payload[j];
                y[j - origin] = mul_rn(decode<Fmt>(c), S);
            }
        }
    }
}

/// Largest finite |y_j| of m values.
inline float finite_amax(const float* y, std::size_t m) {
    float a = 0.0f;
    for (std::size_t j = 0; j < m; ++j) a = std::max(a, finite_abs(y[j]));
    return a;
}

/// The host encode and decode stream a message span by span: a span is whole transform blocks and
/// whole scale blocks (both powers of two), at least 16 K coordinates, so that their scratch is a
/// span's floats per thread rather than the message's. Every coordinate, scale and residual element
/// is computed by the same code as over the whole message at once: the same bits.
inline std::size_t codec_span(const wire_layout& l) {
    return std::max<std::size_t>(
        {std::size_t{16384}, static_cast<std::size_t>(l.block), static_cast<std::size_t>(l.scale_block)});
}
inline std::size_t codec_spans(const wire_layout& l) {
    return static_cast<std::size_t>((l.coded + codec_span(l) - 1) / codec_span(l));
}

/// The transform of elements [e0, e0 + count) of a message (whole blocks from e0, the last one maybe
/// ragged) into its coordinates from e0 (the ragged block zero-padded); the identity copies.
/// `words`: one block's sign words (block / 32 + 2).
inline void span_forward(transform_kind t, const wire_layout& l, std::uint64_t seed, std::uint64_t first_index,
                         const float* x, std::size_t e0, std::size_t count, float* y, std::uint32_t* words) {
    if (t == transform_kind::identity) {
        std::memcpy(y, x, count * sizeof(float));
        return;
    }
    const std::size_t b = l.block;
    for (std::size_t off = 0; off < count; off += b)
        hadamard_block_forward(x + off, std::min(b, count - off), y + off, l.block, seed, first_index + e0 + off,
                               words);
}

/// The inverse of span_forward: elements [e0, e0 + count) from the coordinates from e0 (`work`: one
/// block of floats).
inline void span_inverse(transform_kind t, const wire_layout& l, std::uint64_t seed, std::uint64_t first_index,
                         const float* y, std::size_t e0, std::size_t count, float* x, std::uint32_t* words,
                         float* work) {
    if (t == transform_kind::identity) {
        std::memcpy(x, y, count * sizeof(float));
        return;
    }
    const std::size_t b = l.block;
    for (std::size_t off = 0; off < count; off += b)
        hadamard_block_inverse(y + off, work, std::min(b, count - off), x + off, l.block, seed, first_index + e0 + off,
                               words);
}

inline void check_feedback(const residual_view& fb, std::size_t n, const char* fn) {
    if (fb.empty()) return;
    OCTET_REQUIRE(fb.size == n, fn, "options.feedback", message("has ", fb.size, " elements but the gradient has ", n));
    OCTET_REQUIRE(fb.storage == residual_storage::f32 || fb.storage == residual_storage::bf16 ||
                      fb.storage == residual_storage::e4m3,
                  fn, "options.feedback", "has an unknown residual storage");
}

/// The host scratch of one encode or decode, carved from one block (see detail::scratch_carver):
/// per chunk of spans (parallel_for_chunks gives each chunk its own slot)
///   y     a span of floats: the transformed coordinates (none when they are read from the input as
///         they are: transformed coordinates, or the identity, without feedback; a decode: only a
///         Hadamard message decoded to its elements)
///   x     a span (encode with feedback): the residual, or x + residual; then the new residual
///   d     a span (encode with feedback): T residual; then y - dequantized
///   amax  one float (encode)
///   words, work: one transform block's sign words and, for the inverse, its floats
///   staged a span (bf16 gradients): their float values, read or written a span at a time
struct codec_scratch {
    std::size_t span = 0, words_per_chunk = 0, work_per_chunk = 0;
    float* y = nullptr;
    float* staged = nullptr;
    float* x = nullptr;
    float* d = nullptr;
    float* amax = nullptr;
    std::uint32_t* words = nullptr;
    float* work = nullptr;
};

/// Takes the transform's per-chunk scratch (a Hadamard message only).
inline void carve_span_transform(scratch_carver& c, codec_scratch& s, const wire_layout& l, std::size_t chunks,
                                 bool inverse) {
    if (l.block == 0) return;
    s.words_per_chunk = l.block / 32 + 2;
    s.words = c.take<std::uint32_t>(chunks * s.words_per_chunk);
    if (inverse) {
        s.work_per_chunk = l.block;
        s.work = c.take<float>(chunks * s.work_per_chunk);
    }
}

/// Describes the scratch of encoding n = l.count elements (`transformed`: the L coordinates) on a
/// carver: one description for the query (encode_gradient_scratch_bytes) and the operation.
/// `summed`: the coordinates are summed into the span's y (encode_sum_of_messages). `bf16`: the n
/// elements are bf16, staged a span at a time as floats.
inline codec_scratch carve_encode(scratch_carver& c, const host_executor& ex, const codec_config& cfg,
                                  const wire_layout& l, bool transformed, bool feedback, bool summed = false,
                                  bool bf16 = false) {
    codec_scratch s;
    const std::size_t chunks = parallel_chunks(ex, codec_spans(l), 1);
    if (chunks == 0) return s;
    s.span = codec_span(l);
    const bool hadamard = cfg.transform == transform_kind::hadamard;
    if (feedback || summed || (!transformed && hadamard)) s.y = c.take<float>(chunks * s.span);
    if (feedback) {
        s.x = c.take<float>(chunks * s.span);
        s.d = c.take<float>(chunks * s.span);
    }
    s.amax = c.take<float>(chunks);
    if (feedback || !transformed) carve_span_transform(c, s, l, chunks, feedback);
    if (bf16 && !transformed) s.staged = c.take<float>(chunks * s.span);
    return s;
}

/// Encodes on the host, span by span (steps 1-5 of the header comment). source(c0, c1, buf) gives
/// the input from index c0 on: the n elements, or with `transformed` the L coordinates (a pointer
/// into the caller's array, or `buf`, the span's y, after writing coordinates [c0, c1) there; for
/// the n elements `buf` is the span's staged floats, or null when there are none).
/// NVFP4's tensor scale needs the message's amax before any block is scaled: its coordinates are
/// computed twice (a first pass for the amax).
template <class Source>
encode_result encode_spans(const host_executor& ex, const codec_config& cfg, const wire_layout& l, Source&& source,
                           bool transformed, const encode_options& opt, span<std::uint8_t> out,
                           const codec_scratch& s) {
    encode_result res;
    res.bytes = static_cast<std::size_t>(l.total_bytes);
    const std::size_t coded = static_cast<std::size_t>(l.coded), count = static_cast<std::size_t>(l.count);
    const std::size_t S = s.span, spans = codec_spans(l), chunks = parallel_chunks(ex, spans, 1);
    const std::size_t Bs = l.scale_block;
    const bool feedback = !opt.feedback.empty(), tensor_scaled = cfg.format == wire_format::nvfp4;
    std::uint8_t* scales = out.data() + l.scales_offset;
    std::uint8_t* payload = out.data() + l.payload_offset;
    // The coordinates of span [c0, c1) (elements [c0, min(c1, n))): the input's, or computed into
    // the chunk's y.
    auto coordinates = [&](std::size_t chunk, std::size_t c0, std::size_t c1) -> const float* {
        const std::size_t ne = std::min(c1, count) - c0;
        float* y = s.y ? s.y + chunk * S : nullptr;
        float* x = s.x ? s.x + chunk * S : nullptr;
        float* d = s.d ? s.d + chunk * S : nullptr;
        std::uint32_t* words = s.words ? s.words + chunk * s.words_per_chunk : nullptr;
        if (transformed) {
            const float* in = source(c0, c1, y);
            if (!feedback) return in;
            load_residual(opt.feedback, c0, ne, x);
            span_forward(cfg.transform, l, cfg.seed, opt.first_index, x, c0, ne, d, words);
            for (std::size_t j = 0; j < c1 - c0; ++j) y[j] = in[j] + d[j];  // (in may be y: the same index)
            return y;
        }
        const float* in = source(c0, c1, s.staged ? s.staged + chunk * S : nullptr);
        if (!feedback) {
            if (y == nullptr) return in;  // the identity's coordinates are the elements
            span_forward(cfg.transform, l, cfg.seed, opt.first_index, in, c0, ne, y, words);
            return y;
        }
        load_residual(opt.feedback, c0, ne, x);
        for (std::size_t i = 0; i < ne; ++i) x[i] = in[i] + x[i];
        span_forward(cfg.transform, l, cfg.seed, opt.first_index, x, c0, ne, y, words);
        return y;
    };
    auto span_of = [&](std::size_t k) { return std::make_pair(k * S, std::min(coded, (k + 1) * S)); };
    std::fill(s.amax, s.amax + chunks, 0.0f);
    float ts = 1.0f;
    if (tensor_scaled) {
        parallel_for_chunks(ex, spans, 1, [&](std::size_t chunk, std::size_t lo, std::size_t hi) {
            for (std::size_t k = lo; k < hi; ++k) {
                const auto [c0, c1] = span_of(k);
                s.amax[chunk] = std::max(s.amax[chunk], finite_amax(coordinates(chunk, c0, c1), c1 - c0));
            }
        });
        res.amax = chunks ? *std::max_element(s.amax, s.amax + chunks) : 0.0f;
        ts = make_tensor_scale<recipes::nvfp4>(res.amax);
    }
    const philox_stream rng{cfg.seed, codec_rounding_stream + opt.random_stream};
    dispatch_wire_format(cfg.format, [&](auto tr) {
        using Tr = decltype(tr);
        parallel_for_chunks(ex, spans, 1, [&](std::size_t chunk, std::size_t lo, std::size_t hi) {
            for (std::size_t k = lo; k < hi; ++k) {
                const auto [c0, c1] = span_of(k);
                const float* y = coordinates(chunk, c0, c1);
                if (!tensor_scaled) s.amax[chunk] = std::max(s.amax[chunk], finite_amax(y, c1 - c0));
                float* deq = feedback ? s.d + chunk * S : nullptr;
                const std::size_t k0 = c0 / Bs, k1 = (c1 + Bs - 1) / Bs;
                if (cfg.stochastic)
                    quantize_blocks<Tr, round::stochastic>(k0, k1, Bs, coded, y, ts, scales, payload, deq, rng,
                                                           opt.first_index, c0);
                else
                    quantize_blocks<Tr, round::nearest_even>(k0, k1, Bs, coded, y, ts, scales, payload, deq, rng,
                                                             opt.first_index, c0);
                if (!feedback) continue;
                // r = y - dequantized, back to x's coordinates, kept as the next residual.
                for (std::size_t j = 0; j < c1 - c0; ++j) deq[j] = y[j] - deq[j];
                const std::size_t ne = std::min(c1, count) - c0;
                float* x = s.x + chunk * S;
                span_inverse(cfg.transform, l, cfg.seed, opt.first_index, deq, c0, ne, x,
                             s.words ? s.words + chunk * s.words_per_chunk : nullptr,
                             s.work ? s.work + chunk * s.work_per_chunk : nullptr);
                store_residual(opt.feedback, c0, ne, x);
            }
        });
    });
    if (!tensor_scaled) res.amax = chunks ? *std::max_element(s.amax, s.amax + chunks) : 0.0f;
    const std::uint64_t scale_used = l.scale_count * l.scale_bytes;
    std::memset(scales + scale_used, 0, l.scales_bytes - scale_used);
    const std::uint64_t used = l.code_bits == 4 ? (l.coded + 1) / 2 : l.coded;
    std::memset(payload + used, 0, l.payload_bytes - used);
    write_header_fields(out.data(), cfg.format, cfg.transform, l.block, l.scale_block, cfg.seed, opt.first_index,
                        l.count, ts, l.total_bytes, cfg.stochastic);
    seal_wire_message(out);
    return res;
}

/// The checks of a call that states its message (every encoder, and the stream's decoders given
/// the codec_config): the config, the element count n (the argument n_arg) and the first index of
/// its coordinates. Returns the message's layout.
inline wire_layout checked_layout(const codec_config& cfg, std::size_t n, const char* n_arg, std::uint64_t first_index,
                                  const char* fn) {
    validate_config(cfg, fn);
    OCTET_REQUIRE(n <= wire_max_elements, fn, n_arg, message("counts ", n, " elements; a message holds at most 2^40"));
    const wire_layout l = wire_layout_of(cfg, n);
    OCTET_REQUIRE(first_index <= wire_max_index - l.coded, fn, "options.first_index",
                  message("is ", first_index, "; first index + coordinates must stay below 2^62"));
    return l;
}

/// The checks every executor's encoder shares (the message, the options, the input `in`: n elements,
/// or with `transformed` the L coordinates of n elements). Returns the message's layout.
template <class T>
wire_layout check_encode_args(const codec_config& cfg, span<const T> in, std::size_t n, bool transformed,
                              span<std::uint8_t> out, const encode_options& opt, const char* fn) {
    const wire_layout l = checked_layout(cfg, n, "x", opt.first_index, fn);
    OCTET_REQUIRE(out.size() == l.total_bytes, fn, "out",
                  message("has ", out.size(), " bytes; the message for ", n, " elements is ", l.total_bytes,
                          " bytes (encoded_size)"));
    OCTET_REQUIRE(out.data() != nullptr, fn, "out", "is null");
    check_feedback(opt.feedback, n, fn);
    const char* in_arg = transformed ? "y" : "x";
    if (transformed)
        OCTET_REQUIRE(in.size() == l.coded, fn, in_arg,
                      message("has ", in.size(), " coordinates; ", n, " elements transform to ", l.coded));
    OCTET_REQUIRE(in.empty() || in.data() != nullptr, fn, in_arg, "is null with a non-zero size");
    return l;
}

/// What a decode writes: the n original elements, or the L transformed coordinates (set or added).
enum class decoded_space { original, transformed, transformed_add };

/// The checks every executor's decoder shares on where the decoded values go: `out` holds the
/// message's n elements, `y` its L coordinates.
template <class T>
void check_decode_destination(span<T> dst, const wire_layout& l, decoded_space space, const char* fn) {
    const bool original = space == decoded_space::original;
    const char* arg = original ? "out" : "y";
    if (original)
        OCTET_REQUIRE(dst.size() == l.count, fn, arg,
                      message("has ", dst.size(), " elements; the message holds ", l.count));
    else
        OCTET_REQUIRE(dst.size() == l.coded, fn, arg,
                      message("has ", dst.size(), " elements; the message carries ", l.coded, " coordinates"));
    OCTET_REQUIRE(dst.empty() || dst.data() != nullptr, fn, arg, "is null with a non-zero size");
}

/// The executor half of the gradient codec, specialized per executor: encode(ex, cfg, l, in,
/// transformed, out, opt) and, for the decoders that read the message's header,
/// read_header(ex, message, l, fn) and decode(ex, header, l, message, dst, space, fn), all with the
/// arguments the entries checked. The host's is here, the stream's in codec.cuh (which also has the
/// stream's non-synchronizing decoders, given the codec_config instead of reading the header).
template <class Executor>
struct codec_backend;

/// Describes the scratch of decoding a message of layout l (decode_gradient_scratch_bytes and the
/// operation share it): a Hadamard message decoded to its elements takes a span and a transform
/// block's scratch per chunk; decoded to bf16 elements (`bf16`), a span of staged floats more.
inline codec_scratch carve_decode(scratch_carver& c, const host_executor& ex, transform_kind transform,
                                  const wire_layout& l, decoded_space space, bool bf16 = false) {
    codec_scratch s;
    const bool hadamard = space == decoded_space::original && transform == transform_kind::hadamard;
    if ((!hadamard && !bf16) || l.count == 0) return s;
    const std::size_t chunks = parallel_chunks(ex, codec_spans(l), 1);
    s.span = codec_span(l);
    if (hadamard) {
        s.y = c.take<float>(chunks * s.span);
        carve_span_transform(c, s, l, chunks, true);
    }
    if (bf16) s.staged = c.take<float>(chunks * s.span);
    return s;
}

template <>
struct codec_backend<host_executor> {
    /// Steps 1-5 of encoding x (the L coordinates y with `transformed`) into `out`, span by span.
    /// Every temporary comes from one block of host scratch (encode_gradient_scratch_bytes). bf16
    /// elements are read a span at a time into the span's staged floats.
    template <class T>
    static encode_result encode(host_executor ex, const codec_config& cfg, const wire_layout& l, span<const T> in,
                                bool transformed, span<std::uint8_t> out, const encode_options& opt) {
        constexpr bool narrow = std::is_same_v<T, bf16>;
        const bool feedback = !opt.feedback.empty();
        scratch_carver size;
        carve_encode(size, ex, cfg, l, transformed, feedback, false, narrow);
        const host_scratch scratch(ex, size.bytes(),
                                   transformed ? "octet::encode_gradient_transformed" : "octet::encode_gradient");
        scratch_carver carver = scratch.carver();
        const codec_scratch s = carve_encode(carver, ex, cfg, l, transformed, feedback, false, narrow);
        const T* x = in.data();
        if constexpr (narrow) {
            const std::size_t count = static_cast<std::size_t>(l.count);
            return encode_spans(
                ex, cfg, l,
                [x, count](std::size_t c0, std::size_t c1, float* buf) -> const float* {
                    const std::size_t ne = std::min(c1, count) - c0;
                    for (std::size_t i = 0; i < ne; ++i) buf[i] = to_float(x[c0 + i]);
                    return buf;
                },
                false, opt, out, s);
        } else {
            return encode_spans(
                ex, cfg, l, [x](std::size_t c0, std::size_t, float*) { return x + c0; }, transformed, opt, out, s);
        }
    }

    /// Validates the whole message (wire.hpp) and reads its header and layout.
    static wire_header read_header(host_executor, span<const std::uint8_t> message, wire_layout& l, const char* fn) {
        return read_wire_header(message, &l, fn);
    }

    /// Span by span; host scratch only for a Hadamard message decoded to its n elements, or for
    /// bf16 elements (decode_gradient_scratch_bytes), each rounded once to nearest even.
    template <class T>
    static void decode(host_executor ex, const wire_header& h, const wire_layout& l, span<const std::uint8_t> message,
                       span<T> dst, decoded_space space, const char* fn) {
        constexpr bool narrow = std::is_same_v<T, bf16>;
        scratch_carver size;
        carve_decode(size, ex, h.transform, l, space, narrow);
        const host_scratch scratch(ex, size.bytes(), fn);
        scratch_carver carver = scratch.carver();
        const codec_scratch s = carve_decode(carver, ex, h.transform, l, space, narrow);
        const std::uint8_t* scales = message.data() + l.scales_offset;
        const std::uint8_t* payload = message.data() + l.payload_offset;
        const std::size_t coded = static_cast<std::size_t>(l.coded), count = static_cast<std::size_t>(l.count);
        const std::size_t S = codec_span(l), Bs = l.scale_block;
        const bool add = space == decoded_space::transformed_add;
        T* const out = dst.data();
        dispatch_wire_format(h.format, [&](auto tr) {
            using Tr = decltype(tr);
            parallel_for_chunks(ex, codec_spans(l), 1, [&](std::size_t chunk, std::size_t lo, std::size_t hi) {
                for (std::size_t k = lo; k < hi; ++k) {
                    const std::size_t c0 = k * S, c1 = std::min(coded, c0 + S), k0 = c0 / Bs, k1 = (c1 + Bs - 1) / Bs;
                    const std::size_t ne = std::min(c1, count) - c0;
                    // the span's elements as floats: straight into dst, or staged for bf16
                    float* const x = narrow ? s.staged + chunk * s.span : reinterpret_cast<float*>(out + c0);
                    if (s.y == nullptr)  // coordinates wanted, or the identity's (the elements)
                        dequantize_blocks<Tr>(k0, k1, Bs, coded, scales, payload, h.tensor_scale, x, add, c0);
                    else {
                        float* y = s.y + chunk * s.span;
                        dequantize_blocks<Tr>(k0, k1, Bs, coded, scales, payload, h.tensor_scale, y, false, c0);
                        span_inverse(h.transform, l, h.seed, h.first_index, y, c0, ne, x,
                                     s.words + chunk * s.words_per_chunk, s.work + chunk * s.work_per_chunk);
                    }
                    if constexpr (narrow)
                        for (std::size_t i = 0; i < ne; ++i) out[c0 + i] = to_bf16(x[i]);
                }
            });
        });
    }
};

/// Stage 2 of the host compressed all-reduce: encodes into `out` the sum, in order, of the
/// dequantized coordinates of `count` validated messages (messages[r], each of layout l, encoded
/// under cfg, with tensor scale tensor_scales[r]) as the message of l.count elements, span by span:
/// the sum is never held whole. The same bits as decoding them into one array
/// (decode_gradient_transformed, adding from the second on) and encoding that array with
/// encode_gradient_transformed. Host scratch: carve_encode(..., transformed, feedback, summed).
inline encode_result encode_sum_of_messages(const host_executor& ex, const codec_config& cfg, const wire_layout& l,
                                            const std::uint8_t* const* messages, const float* tensor_scales,
                                            std::size_t count, span<std::uint8_t> out, const encode_options& opt,
                                            const char* fn) {
    const bool feedback = !opt.feedback.empty();
    if (feedback) check_feedback(opt.feedback, static_cast<std::size_t>(l.count), fn);
    scratch_carver size;
    carve_encode(size, ex, cfg, l, true, feedback, true);
    const host_scratch scratch(ex, size.bytes(), fn);
    scratch_carver carver = scratch.carver();
    const codec_scratch s = carve_encode(carver, ex, cfg, l, true, feedback, true);
    const std::size_t Bs = l.scale_block, coded = static_cast<std::size_t>(l.coded);
    auto sum = [&](std::size_t c0, std::size_t c1, float* y) -> const float* {
        const std::size_t k0 = c0 / Bs, k1 = (c1 + Bs - 1) / Bs;
        dispatch_wire_format(cfg.format, [&](auto tr) {
            using Tr = decltype(tr);
            for (std::size_t r = 0; r < count; ++r)
                dequantize_blocks<Tr>(k0, k1, Bs, coded, messages[r] + l.scales_offset, messages[r] + l.payload_offset,
                                      tensor_scales[r], y, r > 0, c0);
        });
        return y;
    };
    return encode_spans(ex, cfg, l, sum, true, opt, out, s);
}

/// The encoders' entry for every executor: the shared checks once, then the executor's backend.
template <class Executor>
encode_result encode_entry(const Executor& ex, const codec_config& cfg, span<const float> in, std::size_t n,
                           bool transformed, span<std::uint8_t> out, const encode_options& opt, const char* fn) {
    const wire_layout l = check_encode_args(cfg, in, n, transformed, out, opt, fn);
    return codec_backend<Executor>::encode(ex, cfg, l, in, transformed, out, opt);
}

/// The entry of the decoders that read the message's header (the host's, and the stream's
/// _synchronizing ones): the executor reads and validates the header, the destination is checked
/// against it here, then the executor's backend decodes. Returns the header.
template <class Executor, class T>
wire_header decode_reading_header(const Executor& ex, span<const std::uint8_t> message, span<T> dst,
                                  decoded_space space, const char* fn) {
    using backend = codec_backend<Executor>;
    wire_layout l;
    const wire_header h = backend::read_header(ex, message, l, fn);
    check_decode_destination(dst, l, space, fn);
    backend::decode(ex, h, l, message, dst, space, fn);
    return h;
}

}  // namespace detail

/// Encodes n = x.size() elements into out (exactly encoded_size(cfg, n) bytes) on the executor:
/// the host (host memory; returns the message's amax), or a CUDA stream (octet/codec/codec.cuh:
/// device memory, out 16-byte aligned; enqueues a memset of the header and scales and two to four
/// kernels, takes no scratch and never synchronizes; encode_result::amax is -1, not measured).
template <class Executor>
encode_result encode_gradient(const Executor& ex, const codec_config& cfg, span<const float> x, span<std::uint8_t> out,
                              const encode_options& opt = {}) {
    return detail::encode_entry(ex, cfg, x, x.size(), false, out, opt, "octet::encode_gradient");
}

/// bf16 gradients on the host, read in place: the message (and residual) that encode_gradient
/// gives for their float values, bit for bit. Scratch: encode_gradient_scratch_bytes<bf16>.
inline encode_result encode_gradient(host_executor ex, const codec_config& cfg, span<const bf16> x,
                                     span<std::uint8_t> out, const encode_options& opt = {}) {
    const char* fn = "octet::encode_gradient";
    const wire_layout l = detail::check_encode_args(cfg, x, x.size(), false, out, opt, fn);
    return detail::codec_backend<host_executor>::encode(ex, cfg, l, x, false, out, opt);
}

/// Encodes the L = transform_length(cfg.transform, n, cfg.block) coordinates y, already in cfg's
/// transformed coordinates (for example a sum of dequantized messages), as the message of n
/// elements. A feedback residual is in original coordinates (n elements) and is transformed first.
/// On the executor as encode_gradient (a stream enqueues the same work and never synchronizes).
template <class Executor>
encode_result encode_gradient_transformed(const Executor& ex, const codec_config& cfg, span<const float> y,
                                          std::size_t n, span<std::uint8_t> out, const encode_options& opt = {}) {
    return detail::encode_entry(ex, cfg, y, n, true, out, opt, "octet::encode_gradient_transformed");
}

/// Validates a message and writes its L dequantized coordinates in the transformed space into y
/// (add: y += them). Returns the header. Host memory; the stream forms are in codec.cuh
/// (decode_gradient_transformed with the codec_config, which never synchronizes, and
/// decode_gradient_transformed_synchronizing, which reads the header as this one does).
inline wire_header decode_gradient_transformed(host_executor ex, span<const std::uint8_t> message, span<float> y,
                                               bool add = false) {
    return detail::decode_reading_header(
        ex, message, y, add ? detail::decoded_space::transformed_add : detail::decoded_space::transformed,
        "octet::decode_gradient_transformed");
}

/// Validates a message and decodes its n elements into out (out.size() must be the header's
/// count). Host memory; the stream forms are in codec.cuh (decode_gradient with the codec_config,
/// which never synchronizes, and decode_gradient_synchronizing, which reads the header as this one does).
inline wire_header decode_gradient(host_executor ex, span<const std::uint8_t> message, span<float> out) {
    return detail::decode_reading_header(ex, message, out, detail::decoded_space::original, "octet::decode_gradient");
}

/// The same into bf16 elements: each the float decode_gradient gives, rounded once to nearest even.
inline wire_header decode_gradient(host_executor ex, span<const std::uint8_t> message, span<bf16> out) {
    return detail::decode_reading_header(ex, message, out, detail::decoded_space::original, "octet::decode_gradient");
}

/// Bytes of host scratch that encode_gradient(ex, cfg, x, out, opt) takes for n = x.size() elements
/// on the host executor `ex` (from ex.allocator when one is lent, see octet::with_allocator; else
/// ::operator new), in one block per call. The host encode streams the message span by span (16 K
/// coordinates, or the transform block or scale block if larger), so this is per thread at work
/// (at most ex.thread_count()): a span of transformed coordinates (none for the identity without
/// feedback), with opt.feedback two spans more, and a transform block's sign words and floats.
/// It does not grow with n beyond one span per thread. Only whether opt.feedback is empty matters.
/// T: the gradients' element type (bf16: a span of staged floats per thread more). A stream's
/// encoders take no scratch.
template <class T = float>
std::size_t encode_gradient_scratch_bytes(const host_executor& ex, const codec_config& cfg, std::size_t n,
                                          const encode_options& opt = {}) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>, "gradients are float or octet::bf16");
    const wire_layout l = detail::checked_layout(cfg, n, "n", opt.first_index, "octet::encode_gradient_scratch_bytes");
    detail::scratch_carver c;
    detail::carve_encode(c, ex, cfg, l, false, !opt.feedback.empty(), false, std::is_same_v<T, bf16>);
    return c.bytes();
}

/// Bytes of host scratch that encode_gradient_transformed(ex, cfg, y, n, out, opt) takes (as
/// encode_gradient_scratch_bytes): a few bytes per thread without feedback; with opt.feedback,
/// three spans of floats per thread and the transforms' scratch.
inline std::size_t encode_gradient_transformed_scratch_bytes(const host_executor& ex, const codec_config& cfg,
                                                             std::size_t n, const encode_options& opt = {}) {
    const wire_layout l =
        detail::checked_layout(cfg, n, "n", opt.first_index, "octet::encode_gradient_transformed_scratch_bytes");
    detail::scratch_carver c;
    detail::carve_encode(c, ex, cfg, l, true, !opt.feedback.empty());
    return c.bytes();
}

/// Bytes of host scratch that decode_gradient(ex, message, out) takes for a message of n elements
/// encoded under cfg (config_of(header) gives it from a received header): for a Hadamard message a
/// span of floats per thread at work and a transform block's scratch; 0 for the identity. T: the
/// elements' type (bf16: a span of staged floats per thread more). decode_gradient_transformed
/// takes no scratch (it writes the caller's y directly).
template <class T = float>
std::size_t decode_gradient_scratch_bytes(const host_executor& ex, const codec_config& cfg, std::size_t n) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>, "gradients are float or octet::bf16");
    const wire_layout l = detail::checked_layout(cfg, n, "n", 0, "octet::decode_gradient_scratch_bytes");
    detail::scratch_carver c;
    detail::carve_decode(c, ex, cfg.transform, l, detail::decoded_space::original, std::is_same_v<T, bf16>);
    return c.bytes();
}

/// The configuration a message was encoded with (block: its effective block).
inline codec_config config_of(const wire_header& h) {
    codec_config c;
    c.format = h.format;
    c.transform = h.transform;
    c.block = h.transform == transform_kind::hadamard ? h.block : 1024;
    c.scale_block = h.scale_block;
    c.seed = h.seed;
    c.stochastic = h.stochastic;
    return c;
}

}  // namespace octet
