// octet/codec/codec.cuh: the gradient codecs on a CUDA stream (device memory in and out).
//
//   octet::encode_gradient(octet::on_stream(s), cfg, x, msg, opt);          // x, msg, opt.feedback on the device
//   octet::decode_gradient(octet::on_stream(s), cfg, msg, out, device_status, {first_index});  // no sync
//   octet::check_decode_status(status_copied_to_host);                     // throws what the host would
//   octet::decode_gradient_synchronizing(octet::on_stream(s), msg, out);    // reads the header (syncs)
//   octet::encode_gradient_transformed / decode_gradient_transformed[_synchronizing]  // as on the host
//
// The stream backend (codec_backend<stream_executor>) of the entries in codec.hpp, which check the
// arguments every executor shares once; the non-synchronizing decoders, which take the
// codec_config instead of reading the header, are the stream's own forms (below), and share the
// destination checks with the entries (check_decode_destination).
// Same contract and the same bytes as the host forms in codec.hpp: every kernel calls the
// same OCTET_HD rules (transform stages in the same order, make_block_scale, encode_scaled,
// decode, the checksum terms), and products that feed an add use __fmul_rn, so nvcc cannot fuse
// them into FMAs the host does not do. Message buffers must be 16-byte aligned (cudaMalloc's are).
//
// Encoding is one pass over x for E4M3/E5M2 with scale blocks up to a CTA tile (1024..32768
// elements) and for MXFP8: each CTA transforms its tile in registers (hadamard.cuh), reduces the
// block amax with shuffles (and shared memory when a scale block spans warps), writes scales and
// codes with 8- or 16-byte stores and adds the checksum terms of the words it wrote. NVFP4 needs
// the message's amax before any block scale (its second-level tensor scale), so a first pass
// transforms and reduces that amax; scale blocks larger than a tile also take a first pass (the
// block amax lands in the scale slots, and a last small kernel turns it into scales). The scales'
// checksum and the header are written by two small kernels at the end.
//
// Decoding never synchronizes: the caller states what it expects (the codec_config and element
// count it encoded with, and the encode's first_index), the host checks the buffer's size against
// that, and on the device one kernel compares the header with the expected one, computes the
// checksum and checks every scale and padding byte, a one-thread kernel writes the verdict to the
// caller's status word (decode_status), and the decode kernel reads it and writes `out` only when
// the message is good: a bad message leaves `out` untouched. check_decode_status turns the status
// into the octet::error the host decoder throws. The validation takes 24 bytes of scratch from
// the executor's allocator. decode_gradient_synchronizing keeps the older contract (the header is
// read on the host, any problem is thrown from the call): it synchronizes the stream twice.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "octet/codec/codec.hpp"
#include "octet/codec/hadamard.cuh"
#include "octet/cuda/check.cuh"
#include "octet/cuda/executor.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/shared_memory.cuh"
#include "octet/cuda/warp.cuh"

namespace octet {

/// What a device decode found, written to the caller's status word (std::uint32_t in device
/// memory): ok (0) when the message was good and decoded; otherwise the output was not written.
enum class decode_status : std::uint32_t {
    ok = 0,
    header_mismatch = 1,    ///< the header differs from the expected one (config, n, first_index)
    checksum_mismatch = 2,  ///< corrupted or truncated in transit
    invalid_sections = 3,   ///< an invalid scale or non-zero padding
};

/// The text octet's decoders give for `status` (empty for ok).
inline std::string decode_status_message(std::uint32_t status) {
    switch (static_cast<decode_status>(status)) {
        case decode_status::ok:
            return "";
        case decode_status::header_mismatch:
            return "does not match the expected message: its header's format, transform, block, scale block, seed, "
                   "first index, element count or size differ from the codec_config, n and first_index given";
        case decode_status::checksum_mismatch:
            return "fails its checksum: it was corrupted or truncated in transit";
        case decode_status::invalid_sections:
            return "has an invalid scale or non-zero padding";
    }
    return detail::message("has an unknown decode status ", status);
}

/// Throws the octet::error the decoder `fn` gives for a bad message (argument 'message') unless
/// `status` (a device decode's status word, copied to the host by the caller) is ok.
inline void check_decode_status(std::uint32_t status, const char* fn = "octet::decode_gradient") {
    if (status != 0) detail::bad_message(fn, decode_status_message(status));
}

/// Options of the non-blocking device decoders.
struct device_decode_options {
    std::uint64_t first_index = 0;  ///< the encode's encode_options::first_index (part of the expected header)
    /// Device memory or null: receives the message's payload codes that decode to NaN or +-Inf
    /// (wire_header::non_finite_codes; overwritten, also for a bad message).
    unsigned long long* device_non_finite = nullptr;
};

namespace detail {
namespace codec_dev {

enum encode_mode : int { mode_fused = 0, mode_tensor_amax = 1, mode_block_amax = 2, mode_encode_slots = 3 };
enum decode_mode : int { decode_original = 0, decode_transformed = 1, decode_transformed_add = 2 };

struct encode_args {
    const float* x = nullptr;  ///< n elements (L when pre_rotated)
    std::uint64_t n = 0, L = 0;
    int log_b = 0;  ///< 0: identity
    std::uint32_t scale_block = 0;
    std::uint64_t seed = 0, first_index = 0;
    philox_stream rng{};
    bool stochastic = false, pre_rotated = false;
    residual_view fb{};
    std::uint8_t* msg = nullptr;
    std::uint64_t scales_offset = 0, payload_offset = 0, payload_bytes = 0;
    int mode = mode_fused;
    const std::uint32_t* status = nullptr;  ///< if set: do nothing unless *status == 0 (non-blocking all-reduce)
};

struct decode_args {
    const std::uint8_t* msg = nullptr;  ///< first message
    std::uint64_t msg_stride = 0;       ///< bytes between messages (decode_transformed_add over `count` messages)
    int count = 1;
    std::uint64_t n = 0, L = 0;
    int log_b = 0;
    std::uint32_t scale_block = 0;
    std::uint64_t seed = 0, first_index = 0;
    std::uint64_t scales_offset = 0, payload_offset = 0;
    float* out = nullptr;
    int mode = decode_original;
    const std::uint32_t* status = nullptr;  ///< if set: decode only when *status == 0 (validated message)
};

OCTET_DEVICE std::uint64_t warp_sum_u64(std::uint64_t v) {
    OCTET_UNROLL
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

/// Residual elements [i0, i0+R) of a residual view (positions >= limit read as 0).
template <int R>
OCTET_DEVICE void load_residual_dev(const residual_view& r, std::uint64_t i0, std::uint64_t limit, float (&v)[R]) {
    if (r.storage == residual_storage::f32) {
        const float* p = reinterpret_cast<const float*>(r.data);
        OCTET_UNROLL
        for (int j = 0; j < R; ++j) v[j] = i0 + j < limit ? p[i0 + j] : 0.0f;
    } else if (r.storage == residual_storage::bf16) {
        const std::uint16_t* p = reinterpret_cast<const std::uint16_t*>(r.data);
        OCTET_UNROLL
        for (int j = 0; j < R; ++j) v[j] = i0 + j < limit ? to_float(bf16{p[i0 + j]}) : 0.0f;
    } else {
        // R divides 128 and i0 is a multiple of R: the R elements share one 132-byte block.
        const std::uint8_t* base = r.data + (i0 / residual_block) * (residual_block + 4);
        const float S = i0 < limit ? bits_to_float(*reinterpret_cast<const std::uint32_t*>(base)) : 0.0f;
        OCTET_UNROLL
        for (int j = 0; j < R; ++j)
            v[j] = i0 + j < limit ? residual_e4m3_value(base[4 + (i0 + j) % residual_block], S) : 0.0f;
    }
}

/// Stores residual elements [i0, i0+R) (positions >= limit are skipped; non-finite values store 0).
/// Every lane of the warp must call it (the e4m3 storage reduces a block amax across lanes).
template <int R>
OCTET_DEVICE void store_residual_dev(const residual_view& r, std::uint64_t i0, std::uint64_t limit,
                                     const float (&v)[R]) {
    if (r.storage == residual_storage::f32) {
        float* p = reinterpret_cast<float*>(r.data);
        OCTET_UNROLL
        for (int j = 0; j < R; ++j)
            if (i0 + j < limit) p[i0 + j] = finite_or_zero(v[j]);
    } else if (r.storage == residual_storage::bf16) {
        std::uint16_t* p = reinterpret_cast<std::uint16_t*>(r.data);
        OCTET_UNROLL
        for (int j = 0; j < R; ++j)
            if (i0 + j < limit) p[i0 + j] = to_bf16(finite_or_zero(v[j])).bits;
    } else {
        float amax = 0.0f;
        OCTET_UNROLL
        for (int j = 0; j < R; ++j)
            if (i0 + j < limit) amax = fmaxf(amax, finite_abs(v[j]));
        amax = cuda::warp_max(amax, static_cast<unsigned>(residual_block / R));
        const block_scale s = make_block_scale<residual_recipe>(amax);
        std::uint8_t* base = r.data + (i0 / residual_block) * (residual_block + 4);
        if (i0 % residual_block == 0 && i0 < limit) *reinterpret_cast<std::uint32_t*>(base) = float_to_bits(s.value);
        OCTET_UNROLL
        for (int j = 0; j < R; ++j)
            if (i0 + j < limit)
                base[4 + (i0 + j) % residual_block] = encode_scaled<residual_recipe>(finite_or_zero(v[j]), s.value);
    }
}

/// The encode kernel (all modes); see the header comment for the passes.
template <class Tr, int R>
OCTET_KERNEL void __launch_bounds__(max_threads<R>) encode_kernel(encode_args a) {
    using RN = typename Tr::template recipe_with<round::nearest_even>;
    using RS = typename Tr::template recipe_with<round::stochastic>;
    using Fmt = typename RN::format;
    constexpr bool fp4 = Fmt::bits <= 4;
    OCTET_DYNAMIC_SHARED(float, smem);
    if (a.status && *a.status != 0) return;  // uniform per block: leaves the residual untouched
    const bool cross = a.log_b > log2_of(R) + 5;
    shared_ptr_t<float> warp_part = smem + (cross ? blockDim.x * R : 0);
    const std::uint64_t tile = static_cast<std::uint64_t>(blockDim.x) * R;
    const std::uint64_t i0 =
        static_cast<std::uint64_t>(blockIdx.x) * tile + static_cast<std::uint64_t>(threadIdx.x) * R;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float c = hadamard_norm(a.log_b);
    const bool feedback = !a.fb.empty();

    // 1. y = T(x + e), or y = y_in + T(e) for pre-rotated input.
    float v[R];
    if (a.pre_rotated) {
        if (feedback) {
            load_residual_dev<R>(a.fb, i0, a.n, v);
            if (a.log_b) {
                apply_signs<R>(v, a.seed, a.first_index, i0, a.n);
                fwht_tile<R>(v, a.log_b, smem);
                OCTET_UNROLL
                for (int j = 0; j < R; ++j) v[j] = v[j] * c;
            }
            OCTET_UNROLL
            for (int j = 0; j < R; ++j) v[j] = (i0 + j < a.L ? a.x[i0 + j] : 0.0f) + v[j];
        } else {
            load_floats<R>(a.x, i0, a.L, v);
        }
    } else {
        load_floats<R>(a.x, i0, a.n, v);
        if (feedback) {
            float e[R];
            load_residual_dev<R>(a.fb, i0, a.n, e);
            OCTET_UNROLL
            for (int j = 0; j < R; ++j) v[j] = v[j] + e[j];
        }
        if (a.log_b) {
            apply_signs<R>(v, a.seed, a.first_index, i0, a.n);
            fwht_tile<R>(v, a.log_b, smem);
            OCTET_UNROLL
            for (int j = 0; j < R; ++j) v[j] = v[j] * c;
        }
    }

    // 2. Amax of each 8-element group, then of each scale block.
    float a8[R / 8];
    OCTET_UNROLL
    for (int g = 0; g < R / 8; ++g) {
        float m = 0.0f;
        OCTET_UNROLL
        for (int j = 8 * g; j < 8 * g + 8; ++j)
            if (i0 + j < a.L) m = fmaxf(m, finite_abs(v[j]));
        a8[g] = m;
    }
    const std::uint32_t Bs = a.scale_block;
    if (a.mode == mode_tensor_amax || a.mode == mode_block_amax) {
        float m = 0.0f;
        OCTET_UNROLL
        for (int g = 0; g < R / 8; ++g) m = fmaxf(m, a8[g]);
        m = cuda::warp_max(m, 32);  // mode_block_amax: Bs > tile, so the whole warp is in one scale block
        if (lane == 0 && i0 < a.L) {
            unsigned* slot = a.mode == mode_tensor_amax
                                 ? reinterpret_cast<unsigned*>(a.msg + 40)
                                 : reinterpret_cast<unsigned*>(a.msg + a.scales_offset + 4 * (i0 / Bs));
            atomicMax(slot, float_to_bits(m));
        }
        return;
    }
    if (a.mode == mode_encode_slots) {
        const float m = bits_to_float(*reinterpret_cast<const std::uint32_t*>(a.msg + a.scales_offset + 4 * (i0 / Bs)));
        OCTET_UNROLL
        for (int g = 0; g < R / 8; ++g) a8[g] = m;
    } else if (Bs <= static_cast<std::uint32_t>(R)) {
        const int bs8 = static_cast<int>(Bs / 8);
        OCTET_UNROLL
        for (int k = 1; k < R / 8; k <<= 1)
            if (k < bs8) {
                OCTET_UNROLL
                for (int g = 0; g < R / 8; ++g)
                    if (!(g & k)) a8[g] = a8[g + k] = fmaxf(a8[g], a8[g + k]);
            }
    } else {
        float m = 0.0f;
        OCTET_UNROLL
        for (int g = 0; g < R / 8; ++g) m = fmaxf(m, a8[g]);
        m = cuda::warp_max(m, min(32u, Bs / R));
        if (Bs > 32u * R) {
            const int wpb = static_cast<int>(Bs / (32u * R));
            if (lane == 0) warp_part[warp] = m;
            __syncthreads();
            const int w0 = warp / wpb * wpb;
            for (int w = w0; w < w0 + wpb; ++w) m = fmaxf(m, warp_part[w]);
        }
        OCTET_UNROLL
        for (int g = 0; g < R / 8; ++g) a8[g] = m;
    }

    // 3. Scales and codes.
    float ts = 1.0f;
    if constexpr (RN::two_level)
        ts = make_tensor_scale<RN>(bits_to_float(*reinterpret_cast<const std::uint32_t*>(a.msg + 40)));
    float S[R / 8];
    OCTET_UNROLL
    for (int g = 0; g < R / 8; ++g) {
        const block_scale s = make_block_scale<RN>(a8[g], ts);
        S[g] = s.value;
        const std::uint64_t cg = i0 + 8 * g;
        if (a.mode == mode_fused && cg % Bs == 0 && cg < a.L) {
            if constexpr (Tr::scale_bytes == 4)
                *reinterpret_cast<std::uint32_t*>(a.msg + a.scales_offset + 4 * (cg / Bs)) = s.stored;
            else
                a.msg[a.scales_offset + cg / Bs] = static_cast<std::uint8_t>(s.stored);
        }
    }
    std::uint8_t code[R];
    OCTET_UNROLL
    for (int j = 0; j < R; ++j) {
        const std::uint64_t cj = i0 + j;
        std::uint8_t q = 0;
        if (cj < a.L) {
            if (a.stochastic)
                q = encode_wire_code<RS>(v[j], S[j / 8], a.rng.bits(a.first_index + cj));
            else
                q = encode_wire_code<RN>(v[j], S[j / 8]);
        }
        code[j] = q;
    }
    std::uint8_t* payload = a.msg + a.payload_offset;
    std::uint64_t term = 0;
    if constexpr (!fp4) {
        OCTET_UNROLL
        for (int k = 0; k < R / 8; ++k) {
            const std::uint64_t bo = i0 + 8 * k;
            std::uint64_t w = 0;
            OCTET_UNROLL
            for (int b = 7; b >= 0; --b) w = (w << 8) | code[8 * k + b];
            if (bo < a.payload_bytes) {
                *reinterpret_cast<std::uint64_t*>(payload + bo) = w;
                term += checksum_term(w, (a.payload_offset + bo) / 8);
            }
        }
    } else if constexpr (R == 8) {
        std::uint32_t w = 0;
        OCTET_UNROLL
        for (int b = 3; b >= 0; --b) w = (w << 8) | pack_fp4x2(code[2 * b], code[2 * b + 1]);
        const std::uint64_t bo = i0 / 2;
        if (bo < a.payload_bytes) *reinterpret_cast<std::uint32_t*>(payload + bo) = w;
        const std::uint32_t hi = __shfl_down_sync(0xFFFFFFFFu, w, 1);
        if ((lane & 1) == 0 && bo < a.payload_bytes)
            term = checksum_term(static_cast<std::uint64_t>(w) | (static_cast<std::uint64_t>(hi) << 32),
                                 (a.payload_offset + bo) / 8);
    } else {
        OCTET_UNROLL
        for (int k = 0; k < R / 16; ++k) {
            const std::uint64_t bo = i0 / 2 + 8 * k;
            std::uint64_t w = 0;
            OCTET_UNROLL
            for (int b = 7; b >= 0; --b) w = (w << 8) | pack_fp4x2(code[16 * k + 2 * b], code[16 * k + 2 * b + 1]);
            if (bo < a.payload_bytes) {
                *reinterpret_cast<std::uint64_t*>(payload + bo) = w;
                term += checksum_term(w, (a.payload_offset + bo) / 8);
            }
        }
    }
    term = warp_sum_u64(term);
    if (lane == 0 && term != 0)
        atomicAdd(reinterpret_cast<unsigned long long*>(a.msg + 56), static_cast<unsigned long long>(term));

    // 4. Error feedback: e <- T^-1 (y - dequantized), in the original coordinates.
    if (feedback) {
        OCTET_UNROLL
        for (int j = 0; j < R; ++j) v[j] = i0 + j < a.L ? v[j] - mul_rn(decode<Fmt>(code[j]), S[j / 8]) : 0.0f;
        if (a.log_b) {
            fwht_tile<R>(v, a.log_b, smem);
            OCTET_UNROLL
            for (int j = 0; j < R; ++j) v[j] = v[j] * c;
            apply_signs<R>(v, a.seed, a.first_index, i0);
        }
        store_residual_dev<R>(a.fb, i0, a.n, v);
    }
}

/// Large scale blocks: the block amax in each f32 scale slot becomes the block's scale.
template <class Tr>
OCTET_KERNEL void slots_to_scales_kernel(std::uint8_t* msg, std::uint64_t scales_offset, std::uint64_t count) {
    using RN = typename Tr::recipe;
    for (std::uint64_t k = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; k < count;
         k += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
        std::uint32_t* slot = reinterpret_cast<std::uint32_t*>(msg + scales_offset + 4 * k);
        *slot = make_block_scale<RN>(bits_to_float(*slot)).stored;
    }
}

/// Adds the checksum terms of words [w0, w1) of msg (word 7, the checksum field, counts as 0) to *acc.
OCTET_KERNEL void checksum_words_kernel(const std::uint8_t* msg, std::uint64_t w0, std::uint64_t w1,
                                        unsigned long long* acc) {
    std::uint64_t t = 0;
    for (std::uint64_t k = w0 + blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; k < w1;
         k += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
        t += checksum_term(k == wire_checksum_offset / 8 ? 0 : *reinterpret_cast<const std::uint64_t*>(msg + 8 * k), k);
    t = warp_sum_u64(t);
    if ((threadIdx.x & 31) == 0 && t != 0) atomicAdd(acc, static_cast<unsigned long long>(t));
}

/// Writes the header; the checksum slot holds the sum of every other word's term, the tensor-scale
/// slot the NVFP4 amax bits.
OCTET_KERNEL void finalize_header_kernel(std::uint8_t* msg, wire_format f, transform_kind t, std::uint32_t block_eff,
                                         std::uint32_t scale_block, std::uint64_t seed, std::uint64_t first_index,
                                         std::uint64_t count, std::uint64_t total, bool stochastic) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const std::uint64_t acc = *reinterpret_cast<const std::uint64_t*>(msg + 56);
    const float ts =
        f == wire_format::nvfp4
            ? make_tensor_scale<recipes::nvfp4>(bits_to_float(*reinterpret_cast<const std::uint32_t*>(msg + 40)))
            : 1.0f;
    write_header_fields(msg, f, t, block_eff, scale_block, seed, first_index, count, ts, total, stochastic);
    std::uint64_t sum = acc;
    for (int k = 0; k < 8; ++k)
        sum += checksum_term(k == 7 ? 0 : load_le64(msg + 8 * k), static_cast<std::uint64_t>(k));
    store_le64(msg + 56, sum);
}

/// Dequantizes messages: original coordinates (inverse transform), or transformed coordinates
/// stored or summed over `count` messages in order.
template <class Tr, int R>
OCTET_KERNEL void __launch_bounds__(max_threads<R>) decode_kernel(decode_args a) {
    using RN = typename Tr::recipe;
    using Fmt = typename RN::format;
    OCTET_DYNAMIC_SHARED(float, smem);
    if (a.status && *a.status != 0) return;  // a bad message: leave the output untouched (uniform per block)
    const std::uint64_t tile = static_cast<std::uint64_t>(blockDim.x) * R;
    const std::uint64_t i0 =
        static_cast<std::uint64_t>(blockIdx.x) * tile + static_cast<std::uint64_t>(threadIdx.x) * R;
    float v[R];
    for (int m = 0; m < a.count; ++m) {
        const std::uint8_t* msg = a.msg + static_cast<std::uint64_t>(m) * a.msg_stride;
        const float ts = RN::two_level ? bits_to_float(*reinterpret_cast<const std::uint32_t*>(msg + 40)) : 1.0f;
        const std::uint8_t* scales = msg + a.scales_offset;
        const std::uint8_t* payload = msg + a.payload_offset;
        std::uint8_t code[R];
        if (i0 + R <= a.L) {
            if constexpr (Fmt::bits <= 4) {
                OCTET_UNROLL
                for (int b = 0; b < R / 2; ++b) {
                    const std::uint8_t byte = payload[i0 / 2 + b];
                    code[2 * b] = unpack_fp4(byte, 0), code[2 * b + 1] = unpack_fp4(byte, 1);
                }
            } else {
                OCTET_UNROLL
                for (int k = 0; k < R / 8; ++k) {
                    const std::uint64_t w = *reinterpret_cast<const std::uint64_t*>(payload + i0 + 8 * k);
                    OCTET_UNROLL
                    for (int b = 0; b < 8; ++b) code[8 * k + b] = static_cast<std::uint8_t>(w >> (8 * b));
                }
            }
        } else {
            OCTET_UNROLL
            for (int j = 0; j < R; ++j) {
                const std::uint64_t cj = i0 + j;
                code[j] = cj < a.L
                              ? (Fmt::bits <= 4 ? unpack_fp4(payload[cj / 2], static_cast<int>(cj & 1u)) : payload[cj])
                              : std::uint8_t{0};
            }
        }
        OCTET_UNROLL
        for (int g = 0; g < R / 8; ++g) {
            const std::uint64_t cg = i0 + 8 * g;
            float S = 0.0f;
            if (cg < a.L) {
                const std::uint64_t k = cg / a.scale_block;
                const std::uint32_t stored =
                    Tr::scale_bytes == 4 ? *reinterpret_cast<const std::uint32_t*>(scales + 4 * k) : scales[k];
                S = stored_scale_value<RN>(stored, ts);
            }
            OCTET_UNROLL
            for (int j = 8 * g; j < 8 * g + 8; ++j) {
                const float d = i0 + j < a.L ? mul_rn(decode<Fmt>(code[j]), S) : 0.0f;
                v[j] = m == 0 ? d : v[j] + d;
            }
        }
    }
    if (a.mode == decode_original) {
        if (a.log_b) {
            fwht_tile<R>(v, a.log_b, smem);
            const float c = hadamard_norm(a.log_b);
            OCTET_UNROLL
            for (int j = 0; j < R; ++j) v[j] = v[j] * c;
            apply_signs<R>(v, a.seed, a.first_index, i0);
        }
        store_floats<R>(a.out, i0, a.n, v);
    } else if (a.mode == decode_transformed) {
        store_floats<R>(a.out, i0, a.L, v);
    } else {
        float w[R];
        load_floats<R>(a.out, i0, a.L, w);
        OCTET_UNROLL
        for (int j = 0; j < R; ++j) w[j] = w[j] + v[j];
        store_floats<R>(a.out, i0, a.L, w);
    }
}

/// A message header as 8 little-endian words, passed by value to a kernel (no copy to the device).
struct header_words {
    std::uint64_t w[8];
};

/// Checks `count` messages of one layout (stride bytes apart): adds every word's checksum term to
/// acc[m] and sets bad[m] when a header word differs from the expected one (bit 2; if given: the
/// tensor-scale word and the checksum word are not compared), a scale is invalid, or padding is not
/// zero (bit 1).
struct validate_args {
    const std::uint8_t* msgs = nullptr;
    std::uint64_t stride = 0;
    int count = 0;
    const std::uint8_t* expected = nullptr;  ///< count x 64 header bytes (device memory), or null
    bool has_expected_words = false;         ///< compare message 0's header with expected_words instead
    header_words expected_words{};
    std::uint64_t words = 0;  ///< message bytes / 8
    wire_format format = wire_format::e4m3;
    std::uint64_t scales_offset = 0, scale_count = 0, scale_bytes = 0, payload_offset = 0, payload_used = 0;
    bool odd_fp4 = false;
    unsigned long long* acc = nullptr;
    unsigned* bad = nullptr;
    unsigned long long* non_finite = nullptr;  ///< if set: += the message's non-finite payload codes (count == 1 only)
};

OCTET_KERNEL void validate_kernel(validate_args a) {
    const int m = blockIdx.y;
    const std::uint8_t* msg = a.msgs + static_cast<std::uint64_t>(m) * a.stride;
    std::uint64_t t = 0, nf = 0;
    unsigned bad = 0;
    for (std::uint64_t k = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; k < a.words;
         k += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
        const std::uint64_t w = *reinterpret_cast<const std::uint64_t*>(msg + 8 * k);
        t += checksum_term(k == 7 ? 0 : w, k);
        const std::uint64_t b0 = 8 * k;
        if (k < 8) {
            if (k != 5 && k != 7) {
                if (a.expected && w != load_le64(a.expected + 64 * m + 8 * k)) bad |= 2;
                if (a.has_expected_words && w != a.expected_words.w[k]) bad |= 2;
            }
            if (k == 5) {
                const float ts = bits_to_float(static_cast<std::uint32_t>(w));
                if ((w >> 32) != 0) bad |= 2;
                if (a.format == wire_format::nvfp4 ? !(ts > 0.0f && ts <= 3.40282347e38f)
                                                   : float_to_bits(ts) != float_to_bits(1.0f))
                    bad |= 2;
            }
        } else if (b0 < a.payload_offset) {
            for (int i = 0; i < 8; ++i) {
                const std::uint64_t pos = b0 + i - a.scales_offset;
                const std::uint8_t byte = static_cast<std::uint8_t>(w >> (8 * i));
                if (a.scale_bytes == 4) {
                    if (i % 4 == 0 && pos / 4 < a.scale_count) {
                        const float s = bits_to_float(static_cast<std::uint32_t>(w >> (8 * i)));
                        if (!(s > 0.0f && s <= 3.40282347e38f)) bad |= 1;
                    } else if (pos >= 4 * a.scale_count && byte != 0) {
                        bad |= 1;
                    }
                } else if (pos < a.scale_count) {
                    if (a.format == wire_format::mxfp8 ? byte == 0xFF : byte >= 0x7F) bad |= 1;
                } else if (byte != 0) {
                    bad |= 1;
                }
            }
        } else {
            for (int i = 0; i < 8; ++i) {
                const std::uint64_t pos = b0 + i - a.payload_offset;
                const std::uint8_t byte = static_cast<std::uint8_t>(w >> (8 * i));
                if (pos >= a.payload_used && byte != 0) bad |= 1;
                if (a.odd_fp4 && pos == a.payload_used - 1 && (byte >> 4) != 0) bad |= 1;
                if (pos < a.payload_used && non_finite_code(a.format, byte)) nf += 1;  // NVFP4: never
            }
        }
    }
    t = warp_sum_u64(t);
    if ((threadIdx.x & 31) == 0 && t != 0) atomicAdd(a.acc + m, static_cast<unsigned long long>(t));
    if (bad) atomicOr(a.bad + m, bad);
    if (a.non_finite && nf != 0) atomicAdd(a.non_finite, static_cast<unsigned long long>(nf));
}

/// flag[0] = rank_tag if any message failed, else 0; flag[1] = the last failing message's index + 1.
/// (Launched by comm/nccl.cuh.)
OCTET_KERNEL void validate_finish_kernel(const std::uint8_t* msgs, std::uint64_t stride, int count,
                                         const unsigned long long* acc, const unsigned* bad, int* flag, int rank_tag) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int f = 0;
    for (int m = 0; m < count; ++m) {
        const std::uint64_t stored = load_le64(msgs + static_cast<std::uint64_t>(m) * stride + 56);
        if (bad[m] || stored != acc[m]) f = m + 1;
    }
    flag[0] = f ? rank_tag : 0;
    flag[1] = f;
}

/// The verdict of one validated message, in the order the host decoder checks: header, checksum,
/// sections. Also passes the non-finite code count on (if asked).
OCTET_KERNEL void decode_status_kernel(const std::uint8_t* msg, const unsigned long long* acc, const unsigned* bad,
                                       const unsigned long long* non_finite, std::uint32_t* status,
                                       unsigned long long* non_finite_out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    std::uint32_t s = 0;
    if (*bad & 2u)
        s = static_cast<std::uint32_t>(decode_status::header_mismatch);
    else if (load_le64(msg + 56) != *acc)
        s = static_cast<std::uint32_t>(decode_status::checksum_mismatch);
    else if (*bad & 1u)
        s = static_cast<std::uint32_t>(decode_status::invalid_sections);
    *status = s;
    if (non_finite_out) *non_finite_out = *non_finite;
}

inline validate_args validation_of(const wire_layout& l, wire_format f, const std::uint8_t* msgs, std::uint64_t stride,
                                   int count, const std::uint8_t* expected, unsigned long long* acc, unsigned* bad) {
    validate_args v;
    v.msgs = msgs;
    v.stride = stride;
    v.count = count;
    v.expected = expected;
    v.words = l.total_bytes / 8;
    v.format = f;
    v.scales_offset = l.scales_offset;
    v.scale_count = l.scale_count;
    v.scale_bytes = l.scale_bytes;
    v.payload_offset = l.payload_offset;
    v.payload_used = l.code_bits == 4 ? (l.coded + 1) / 2 : l.coded;
    v.odd_fp4 = l.code_bits == 4 && (l.coded & 1u);
    v.acc = acc;
    v.bad = bad;
    return v;
}

inline void launch_validate(cudaStream_t s, const validate_args& v) {
    if (v.count == 0) return;
    const unsigned bx = static_cast<unsigned>(std::min<std::uint64_t>(1024, (v.words + 255) / 256));
    cuda::launch("validate_kernel", validate_kernel, dim3(std::max(1u, bx), static_cast<unsigned>(v.count)), 256, 0, s,
                 v);
    OCTET_CUDA_CHECK_LAUNCH();
}

// The launchers are templates on the wire format (Tr = wire_traits<cfg.format>; callers dispatch
// with dispatch_wire_format), and the public stream functions are templates too: a translation unit
// compiles the encode and decode kernels only if it calls them (all formats x 3 tile shapes x each
// architecture take minutes), not merely because it includes this header.

/// Every kernel of one encode (see the header comment), on stream s. No validation here.
template <class Tr>
void launch_encode(cudaStream_t s, const codec_config& cfg, const wire_layout& l, const float* x, bool pre_rotated,
                   std::uint64_t first_index, const residual_view& fb, std::uint64_t random_stream, std::uint8_t* msg,
                   const std::uint32_t* status = nullptr) {
    OCTET_CUDA_CHECK(cudaMemsetAsync(msg, 0, l.payload_offset, s));
    const int log_b = cfg.transform == transform_kind::hadamard ? log2_exact(l.block) : 0;
    encode_args a;
    a.x = x;
    a.n = l.count;
    a.L = l.coded;
    a.log_b = log_b;
    a.scale_block = l.scale_block;
    a.seed = cfg.seed;
    a.first_index = first_index;
    a.rng = philox_stream{cfg.seed, codec_rounding_stream + random_stream};
    a.stochastic = cfg.stochastic;
    a.pre_rotated = pre_rotated;
    a.fb = fb;
    a.msg = msg;
    a.scales_offset = l.scales_offset;
    a.payload_offset = l.payload_offset;
    a.payload_bytes = l.payload_bytes;
    a.status = status;
    if (l.coded > 0) {
        dispatch_regs(log_b, [&](auto r) {
            constexpr int R = decltype(r)::value;
            const int threads = threads_for(log_b, R);
            const std::uint64_t tile = static_cast<std::uint64_t>(threads) * R;
            const std::size_t smem = smem_bytes(log_b, R, threads);
            set_smem(encode_kernel<Tr, R>, smem);
            const unsigned grid = static_cast<unsigned>((l.coded + tile - 1) / tile);
            const bool large = l.scale_block > tile;
            if (Tr::recipe::two_level) {
                encode_args p = a;
                p.mode = mode_tensor_amax;
                cuda::launch("encode_kernel", encode_kernel<Tr, R>, grid, threads, smem, s, p);
                OCTET_CUDA_CHECK_LAUNCH();
            }
            if (large) {
                encode_args p = a;
                p.mode = mode_block_amax;
                cuda::launch("encode_kernel", encode_kernel<Tr, R>, grid, threads, smem, s, p);
                OCTET_CUDA_CHECK_LAUNCH();
            }
            a.mode = large ? mode_encode_slots : mode_fused;
            cuda::launch("encode_kernel", encode_kernel<Tr, R>, grid, threads, smem, s, a);
            OCTET_CUDA_CHECK_LAUNCH();
            if (large) {
                if constexpr (Tr::scale_bytes == 4) {
                    const unsigned g =
                        static_cast<unsigned>(std::min<std::uint64_t>(1024, (l.scale_count + 255) / 256));
                    cuda::launch("slots_to_scales_kernel", slots_to_scales_kernel<Tr>, std::max(1u, g), 256, 0, s, msg,
                                 l.scales_offset, l.scale_count);
                    OCTET_CUDA_CHECK_LAUNCH();
                }
            }
        });
    }
    const std::uint64_t w0 = l.scales_offset / 8, w1 = l.payload_offset / 8;
    if (w1 > w0) {
        const unsigned g = static_cast<unsigned>(std::min<std::uint64_t>(1024, (w1 - w0 + 255) / 256));
        cuda::launch("checksum_words_kernel", checksum_words_kernel, std::max(1u, g), 256, 0, s, msg, w0, w1,
                     reinterpret_cast<unsigned long long*>(msg + 56));
        OCTET_CUDA_CHECK_LAUNCH();
    }
    cuda::launch("finalize_header_kernel", finalize_header_kernel, 1, 32, 0, s, msg, cfg.format, cfg.transform, l.block,
                 l.scale_block, cfg.seed, first_index, l.count, l.total_bytes, cfg.stochastic);
    OCTET_CUDA_CHECK_LAUNCH();
}

/// Dequantize kernels for `count` messages of layout l (stride bytes apart), all of format Tr.
template <class Tr>
void launch_decode(cudaStream_t s, const wire_layout& l, transform_kind t, std::uint64_t seed,
                   std::uint64_t first_index, const std::uint8_t* msgs, std::uint64_t stride, int count, float* out,
                   int mode, const std::uint32_t* status = nullptr) {
    if (l.coded == 0) return;
    const int log_b = t == transform_kind::hadamard ? log2_exact(l.block) : 0;
    decode_args a;
    a.msg = msgs;
    a.msg_stride = stride;
    a.count = count;
    a.n = l.count;
    a.L = l.coded;
    a.log_b = log_b;
    a.scale_block = l.scale_block;
    a.seed = seed;
    a.first_index = first_index;
    a.scales_offset = l.scales_offset;
    a.payload_offset = l.payload_offset;
    a.out = out;
    a.mode = mode;
    a.status = status;
    dispatch_regs(log_b, [&](auto r) {
        constexpr int R = decltype(r)::value;
        const int threads = threads_for(log_b, R);
        const std::uint64_t tile = static_cast<std::uint64_t>(threads) * R;
        const std::size_t smem = smem_bytes(log_b, R, threads);
        set_smem(decode_kernel<Tr, R>, smem);
        cuda::launch("decode_kernel", decode_kernel<Tr, R>, static_cast<unsigned>((l.coded + tile - 1) / tile), threads,
                     smem, s, a);
        OCTET_CUDA_CHECK_LAUNCH();
    });
}

/// The header the encoder writes for (cfg, layout l, first_index), tensor-scale word 1.0 and
/// checksum 0 (validate_kernel compares neither).
inline void expected_header_fields(std::uint8_t* out, const codec_config& cfg, const wire_layout& l,
                                   std::uint64_t first_index) {
    write_header_fields(out, cfg.format, cfg.transform, l.block, l.scale_block, cfg.seed, first_index, l.count, 1.0f,
                        l.total_bytes, cfg.stochastic);
}

/// Host checks of a device message buffer that need no header: size, device memory, alignment.
inline void check_device_message(span<const std::uint8_t> msg, const char* fn) {
    OCTET_REQUIRE(msg.size() >= wire_header_bytes, fn, "message",
                  message("is truncated: ", msg.size(), " bytes, but a message has a 64-byte header"));
    cuda::require_device_accessible(msg.data(), fn, "message");
    OCTET_REQUIRE(is_aligned(msg.data(), 16), fn, "message",
                  "is not 16-byte aligned; device messages need 16-byte alignment");
}

/// The synchronizing validation: header on the host, checksum and sections on the device. Throws.
inline wire_header validate_device_message_synchronizing(const stream_executor& ex, span<const std::uint8_t> msg,
                                                         wire_layout& l, const char* fn) {
    const cudaStream_t s = ex.stream;
    check_device_message(msg, fn);
    std::uint8_t head[wire_header_bytes];
    OCTET_CUDA_CHECK(cudaMemcpyAsync(head, msg.data(), wire_header_bytes, cudaMemcpyDeviceToHost, s));
    OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
    // parse_header reads only the 64 header bytes and checks the fields against the buffer's size:
    // give it the copied header with the device buffer's size.
    wire_header h = parse_header(span<const std::uint8_t>(head, msg.size()), l, fn);
    std::uint64_t back[3] = {0, 0, 0};
    {
        const stream_scratch scratch(ex, 24);
        OCTET_CUDA_CHECK(cudaMemsetAsync(scratch.get(), 0, 24, s));
        auto* acc = scratch.as<unsigned long long>();
        auto* bad = reinterpret_cast<unsigned*>(scratch.as<std::uint8_t>() + 8);
        validate_args v = validation_of(l, h.format, msg.data(), 0, 1, nullptr, acc, bad);
        v.non_finite = acc + 2;
        launch_validate(s, v);
        OCTET_CUDA_CHECK(cudaMemcpyAsync(back, scratch.get(), 24, cudaMemcpyDeviceToHost, s));
    }
    OCTET_CUDA_CHECK(cudaStreamSynchronize(s));
    if (back[0] != h.checksum) bad_message(fn, "fails its checksum: it was corrupted or truncated in transit");
    if (static_cast<std::uint32_t>(back[1]) != 0) bad_message(fn, "has an invalid scale or non-zero padding");
    h.non_finite_codes = back[2];
    return h;
}

/// The host checks of a non-blocking decode: the message the caller expects (cfg, n, first_index)
/// against the buffer, the status word, and the destination (decoded_space). Returns the layout.
inline wire_layout check_expected_message(const codec_config& cfg, std::size_t n, std::uint64_t first_index,
                                          span<const std::uint8_t> msg, span<float> dst, decoded_space space,
                                          std::uint32_t* status, unsigned long long* non_finite_out, const char* fn) {
    const wire_layout l = checked_layout(cfg, n, "n", first_index, fn);
    check_decode_destination(dst, l, space, fn);
    if (!dst.empty()) cuda::require_device_accessible(dst.data(), fn, space == decoded_space::original ? "out" : "y");
    check_device_message(msg, fn);
    if (msg.size() != l.total_bytes)
        bad_message(fn, message(msg.size() < l.total_bytes ? "is truncated: " : "has trailing bytes: ", msg.size(),
                                " bytes, but the expected message (the codec_config and n given) has ", l.total_bytes));
    OCTET_REQUIRE(status != nullptr, fn, "device_status",
                  "is null; pass a std::uint32_t in device memory that receives the decode_status");
    cuda::require_device_accessible(status, fn, "device_status");
    OCTET_REQUIRE(is_aligned(status, 4), fn, "device_status", "is not 4-byte aligned");
    if (non_finite_out) cuda::require_device_accessible(non_finite_out, fn, "options.device_non_finite");
    return l;
}

/// The device half of a non-blocking validation: compares header (against cfg, l, first_index),
/// checksum and sections and writes *status (decode_status). 24 bytes of scratch, no host sync.
inline void validate_device_message_async(const stream_executor& ex, const codec_config& cfg, const wire_layout& l,
                                          std::uint64_t first_index, span<const std::uint8_t> msg,
                                          std::uint32_t* status, unsigned long long* non_finite_out) {
    header_words expected{};
    std::uint8_t head[wire_header_bytes];
    expected_header_fields(head, cfg, l, first_index);
    for (int k = 0; k < 8; ++k) expected.w[k] = load_le64(head + 8 * k);

    const cudaStream_t s = ex.stream;
    const stream_scratch scratch(ex, 24);
    OCTET_CUDA_CHECK(cudaMemsetAsync(scratch.get(), 0, 24, s));
    auto* acc = scratch.as<unsigned long long>();
    auto* bad = reinterpret_cast<unsigned*>(scratch.as<std::uint8_t>() + 8);
    validate_args v = validation_of(l, cfg.format, msg.data(), 0, 1, nullptr, acc, bad);
    v.has_expected_words = true;
    v.expected_words = expected;
    v.non_finite = acc + 2;
    launch_validate(s, v);
    cuda::launch("decode_status_kernel", decode_status_kernel, 1, 32, 0, s, msg.data(), acc, bad, acc + 2, status,
                 non_finite_out);
    OCTET_CUDA_CHECK_LAUNCH();
}

/// The decode kernel's mode for a decoded_space.
inline int decode_mode_of(decoded_space space) {
    if (space == decoded_space::original) return decode_original;
    return space == decoded_space::transformed_add ? decode_transformed_add : decode_transformed;
}

/// The non-blocking decoders' body: host checks, then the validation, status and decode kernels
/// enqueued on ex.stream (the decode kernel writes dst only if the status says ok). No host sync.
inline void decode_expected(const stream_executor& ex, const codec_config& cfg, std::size_t n,
                            span<const std::uint8_t> message, span<float> dst, decoded_space space,
                            std::uint32_t* status, const device_decode_options& opt, const char* fn) {
    const wire_layout l =
        check_expected_message(cfg, n, opt.first_index, message, dst, space, status, opt.device_non_finite, fn);
    validate_device_message_async(ex, cfg, l, opt.first_index, message, status, opt.device_non_finite);
    dispatch_wire_format(cfg.format, [&](auto tr) {
        launch_decode<decltype(tr)>(ex.stream, l, cfg.transform, cfg.seed, opt.first_index, message.data(), 0, 1,
                                    dst.data(), decode_mode_of(space), status);
    });
}

}  // namespace codec_dev

/// The gradient codec on a stream (the entries are in codec.hpp and check the arguments every
/// executor shares first).
template <>
struct codec_backend<stream_executor> {
    /// Enqueued on ex.stream: a memset of the header and scales and two to four kernels; no
    /// scratch, no host sync. encode_result::amax is not measured on the device (-1).
    static encode_result encode(const stream_executor& ex, const codec_config& cfg, const wire_layout& l,
                                span<const float> in, bool transformed, span<std::uint8_t> out,
                                const encode_options& opt) {
        const char* fn = transformed ? "octet::encode_gradient_transformed" : "octet::encode_gradient";
        cuda::require_device_accessible(out.data(), fn, "out");
        OCTET_REQUIRE(is_aligned(out.data(), 16), fn, "out",
                      "is not 16-byte aligned; device messages need 16-byte alignment (cudaMalloc gives 256)");
        if (!opt.feedback.empty()) cuda::require_device_accessible(opt.feedback.data, fn, "options.feedback");
        if (!opt.feedback.empty() && opt.feedback.storage != residual_storage::bf16)
            OCTET_REQUIRE(is_aligned(opt.feedback.data, 4), fn, "options.feedback", "is not 4-byte aligned");
        if (!in.empty()) cuda::require_device_accessible(in.data(), fn, transformed ? "y" : "x");
        dispatch_wire_format(cfg.format, [&](auto tr) {
            codec_dev::launch_encode<decltype(tr)>(ex.stream, cfg, l, in.data(), transformed, opt.first_index,
                                                   opt.feedback, opt.random_stream, out.data());
        });
        return encode_result{static_cast<std::size_t>(l.total_bytes), -1.0f};
    }

    /// The header read on the host, checksum and sections on the device: SYNCHRONIZES the stream
    /// twice and throws on a bad message.
    static wire_header read_header(const stream_executor& ex, span<const std::uint8_t> message, wire_layout& l,
                                   const char* fn) {
        return codec_dev::validate_device_message_synchronizing(ex, message, l, fn);
    }

    /// Enqueues the decode kernel (the message was validated by read_header).
    static void decode(const stream_executor& ex, const wire_header& h, const wire_layout& l,
                       span<const std::uint8_t> message, span<float> dst, decoded_space space, const char* fn) {
        if (!dst.empty())
            cuda::require_device_accessible(dst.data(), fn, space == decoded_space::original ? "out" : "y");
        dispatch_wire_format(h.format, [&](auto tr) {
            codec_dev::launch_decode<decltype(tr)>(ex.stream, l, h.transform, h.seed, h.first_index, message.data(), 0,
                                                   1, dst.data(), codec_dev::decode_mode_of(space));
        });
    }
};

}  // namespace detail

/// Decodes the message that encode_gradient(ex, cfg, x, message, {first_index}) wrote for
/// n = out.size() elements into out (device memory), without synchronizing: the host checks the
/// buffer's size against encoded_size(cfg, n); the device checks header (against cfg, n and
/// opt.first_index), checksum, scales and padding, writes a decode_status to *device_status
/// (std::uint32_t, device memory) and writes `out` only if it is ok (a bad message leaves `out`
/// untouched). check_decode_status(status) on the host gives the error the host decoder throws.
/// Enqueues a memset, a validation kernel, a one-thread status kernel and the decode kernel; takes
/// 24 bytes of scratch from ex's allocator.
template <class Ex, detail::if_stream_executor<Ex> = 0>
void decode_gradient(Ex ex, const codec_config& cfg, span<const std::uint8_t> message, span<float> out,
                     std::uint32_t* device_status, const device_decode_options& opt = {}) {
    detail::codec_dev::decode_expected(ex, cfg, out.size(), message, out, detail::decoded_space::original,
                                       device_status, opt, "octet::decode_gradient");
}

/// Writes (add: adds) the L = y.size() transformed coordinates of the message encoded from n
/// elements under cfg into y (device memory), without synchronizing; as decode_gradient above (a
/// bad message leaves y untouched, also with add).
template <class Ex, detail::if_stream_executor<Ex> = 0>
void decode_gradient_transformed(Ex ex, const codec_config& cfg, std::size_t n, span<const std::uint8_t> message,
                                 span<float> y, std::uint32_t* device_status, bool add = false,
                                 const device_decode_options& opt = {}) {
    detail::codec_dev::decode_expected(
        ex, cfg, n, message, y, add ? detail::decoded_space::transformed_add : detail::decoded_space::transformed,
        device_status, opt, "octet::decode_gradient_transformed");
}

/// Validates a device message and decodes it into out (device memory), reading the header on the
/// host: SYNCHRONIZES the stream twice, and throws octet::error on a bad message before writing out.
template <class Ex, detail::if_stream_executor<Ex> = 0>
wire_header decode_gradient_synchronizing(Ex ex, span<const std::uint8_t> message, span<float> out) {
    return detail::decode_reading_header(ex, message, out, detail::decoded_space::original, "octet::decode_gradient");
}

/// As decode_gradient_synchronizing, writing (add: adding) the L transformed coordinates to y.
/// SYNCHRONIZES the stream twice.
template <class Ex, detail::if_stream_executor<Ex> = 0>
wire_header decode_gradient_transformed_synchronizing(Ex ex, span<const std::uint8_t> message, span<float> y,
                                                      bool add = false) {
    return detail::decode_reading_header(
        ex, message, y, add ? detail::decoded_space::transformed_add : detail::decoded_space::transformed,
        "octet::decode_gradient_transformed");
}

}  // namespace octet
