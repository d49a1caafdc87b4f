// octet/codec/feedback.hpp: error-feedback residuals for the gradient codecs.
//
//   octet::error_feedback fb(n, octet::residual_storage::bf16);   // owns the residual, zeroed
//   octet::encode_gradient(octet::on_host(), cfg, grad, out, {.feedback = fb.view()});
//
// Error feedback keeps what the codec dropped and adds it to the next gradient before encoding:
//     g' = g + e;   codes = encode(g');   e <- g' - decode(codes)
// so that, summed over steps, the transmitted gradients differ from the true ones by the last
// residual only (nothing is lost for good). The residual lives in the ORIGINAL coordinates (the
// codec inverts the transform of its rounding error), so the seed may change from step to step.
//
// Storage (residual_storage), chosen per use:
//   f32    4 bytes/element, exact
//   bf16   2 bytes/element, rounded to nearest-even (relative 2^-8)
//   e4m3   blocks of 128: one float scale (amax / 448, the recipe rule amax_ratio<0>) then 128
//          E4M3 codes, 132 bytes per full block (1.03 bytes/element); the last block is ragged
//          (4 + remaining bytes). Relative error 2^-4 per element, absolute 2^-10 amax/448.
// What the storage rounds away is lost (it is not fed back again). A non-finite residual element
// is stored as 0, so that one bad step does not poison every later one. A view of a range of a
// residual (view.subrange(offset, count)) needs offset % 128 == 0 for e4m3 storage.
// The layout is the same in host and device memory (the kernels in codec.cuh read and write it).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "octet/config.hpp"
#include "octet/core/bits.hpp"
#include "octet/core/byte_io.hpp"
#include "octet/core/check.hpp"
#include "octet/core/rounded.hpp"
#include "octet/core/span.hpp"
#include "octet/format/encode.hpp"
#include "octet/quant/recipe.hpp"
#include "octet/quant/scale.hpp"

namespace octet {

enum class residual_storage : std::uint8_t { f32 = 0, bf16 = 1, e4m3 = 2 };

inline const char* residual_storage_name(residual_storage s) {
    switch (s) {
        case residual_storage::f32:
            return "f32";
        case residual_storage::bf16:
            return "bf16";
        case residual_storage::e4m3:
            return "e4m3";
    }
    return "unknown";
}

/// Elements per scale of the e4m3 residual, and the recipe whose rules make its scales.
inline constexpr std::size_t residual_block = 128;
using residual_recipe = recipe<e4m3, block<1, 128>, scale::amax_ratio<0>, scale_storage::f32, round::nearest_even,
                               overflow::saturate, nan_policy::per_element>;

OCTET_HD std::size_t residual_bytes(residual_storage s, std::size_t n) {
    switch (s) {
        case residual_storage::f32:
            return 4 * n;
        case residual_storage::bf16:
            return 2 * n;
        default:
            return n + 4 * ((n + residual_block - 1) / residual_block);
    }
}

/// A non-owning view of a residual (host or device memory, like span).
struct residual_view {
    residual_storage storage = residual_storage::f32;
    std::uint8_t* data = nullptr;
    std::size_t size = 0;  ///< elements

    OCTET_HD bool empty() const { return data == nullptr; }
    OCTET_HD std::size_t bytes() const { return residual_bytes(storage, size); }
    /// Byte offset of element i's storage (e4m3: inside its block, after the block's scale).
    OCTET_HD std::size_t byte_offset(std::size_t i) const {
        switch (storage) {
            case residual_storage::f32:
                return 4 * i;
            case residual_storage::bf16:
                return 2 * i;
            default:
                return (i / residual_block) * (residual_block + 4) + 4 + i % residual_block;
        }
    }
    residual_view subrange(std::size_t offset, std::size_t count) const {
        OCTET_REQUIRE(
            offset <= size && count <= size - offset, "octet::residual_view::subrange", "offset/count",
            detail::message("select [", offset, ", ", offset + count, ") outside a residual of ", size, " elements"));
        OCTET_REQUIRE(
            storage != residual_storage::e4m3 || offset % residual_block == 0, "octet::residual_view::subrange",
            "offset",
            detail::message("is ", offset, "; an e4m3 residual splits only at multiples of ", residual_block));
        residual_view v = *this;
        v.data = data ? data + (storage == residual_storage::e4m3 ? (offset / residual_block) * (residual_block + 4)
                                                                  : byte_offset(offset))
                      : nullptr;
        v.size = count;
        return v;
    }
};

namespace detail {

OCTET_HD float load_f32_unaligned(const std::uint8_t* p) {
    return bits_to_float(load_le32(p));
}
OCTET_HD void store_f32_unaligned(std::uint8_t* p, float v) {
    store_le32(p, float_to_bits(v));
}

/// A product that the compiler may not fuse with a following add (host and device give the same
/// bits; see codec.hpp on FMA contraction): rn::mul of core/rounded.hpp.
OCTET_HD float mul_rn(float a, float b) {
    return rn::mul(a, b);
}

OCTET_HD float finite_or_zero(float v) {
    return is_finite_float(v) ? v : 0.0f;
}

/// Element i of a residual block whose scale is S (e4m3 storage).
OCTET_HD float residual_e4m3_value(std::uint8_t code, float scale) {
    return mul_rn(decode<e4m3>(code), scale);
}

}  // namespace detail

/// Reads residual elements [begin, begin + count) as floats (host memory).
inline void load_residual(const residual_view& r, std::size_t begin, std::size_t count, float* out) {
    if (count == 0) return;  // (an empty range may come with null pointers: memcpy must not see them)
    switch (r.storage) {
        case residual_storage::f32:
            std::memcpy(out, r.data + 4 * begin, 4 * count);
            return;
        case residual_storage::bf16:
            for (std::size_t i = 0; i < count; ++i) {
                bf16 h;
                std::memcpy(&h.bits, r.data + 2 * (begin + i), 2);
                out[i] = to_float(h);
            }
            return;
        default:
            for (std::size_t i = 0; i < count;) {
                const std::size_t e = begin + i, blk = e / residual_block;
                const std::uint8_t* base = r.data + blk * (residual_block + 4);
                const float S = detail::load_f32_unaligned(base);
                const std::size_t stop = std::min(count, i + (residual_block - e % residual_block));
                for (; i < stop; ++i) out[i] = detail::residual_e4m3_value(base[4 + (begin + i) % residual_block], S);
            }
            return;
    }
}

/// Stores floats into residual elements [begin, begin + count). For e4m3 storage, begin must be a
/// multiple of 128 and the range must cover whole blocks (or end at the residual's end).
/// Non-finite values are stored as 0.
inline void store_residual(const residual_view& r, std::size_t begin, std::size_t count, const float* in) {
    switch (r.storage) {
        case residual_storage::f32:
            for (std::size_t i = 0; i < count; ++i) {
                const float v = detail::finite_or_zero(in[i]);
                std::memcpy(r.data + 4 * (begin + i), &v, 4);
            }
            return;
        case residual_storage::bf16:
            for (std::size_t i = 0; i < count; ++i) {
                const bf16 h = to_bf16(detail::finite_or_zero(in[i]));
                std::memcpy(r.data + 2 * (begin + i), &h.bits, 2);
            }
            return;
        default:
            OCTET_REQUIRE(begin % residual_block == 0 && (count % residual_block == 0 || begin + count == r.size),
                          "octet::store_residual", "begin/count",
                          "must cover whole 128-element blocks of an e4m3 residual");
            for (std::size_t b0 = 0; b0 < count; b0 += residual_block) {
                const std::size_t m = std::min(residual_block, count - b0);
                float amax = 0.0f;
                for (std::size_t j = 0; j < m; ++j) amax = std::max(amax, finite_abs(in[b0 + j]));
                const block_scale s = make_block_scale<residual_recipe>(amax);
                std::uint8_t* base = r.data + ((begin + b0) / residual_block) * (residual_block + 4);
                detail::store_f32_unaligned(base, s.value);
                for (std::size_t j = 0; j < m; ++j)
                    base[4 + j] = encode_scaled<residual_recipe>(detail::finite_or_zero(in[b0 + j]), s.value);
            }
            return;
    }
}

/// An owning, zero-initialised residual in host memory.
class error_feedback {
public:
    error_feedback() = default;
    explicit error_feedback(std::size_t n, residual_storage s = residual_storage::f32)
        : storage_(s), size_(n), bytes_(residual_bytes(s, n), std::uint8_t{0}) {
        OCTET_REQUIRE(s == residual_storage::f32 || s == residual_storage::bf16 || s == residual_storage::e4m3,
                      "octet::error_feedback", "storage", "is not a known residual storage; use f32, bf16 or e4m3");
        // An all-zero e4m3 block has scale 0 bytes = 0.0f: decodes to 0 (decode(0) * 0).
    }
    residual_view view() { return residual_view{storage_, bytes_.data(), size_}; }
    std::size_t size() const { return size_; }
    residual_storage storage() const { return storage_; }
    std::size_t bytes() const { return bytes_.size(); }
    void reset() { std::fill(bytes_.begin(), bytes_.end(), std::uint8_t{0}); }
    /// The residual as floats (for inspection and tests).
    std::vector<float> values() {
        std::vector<float> v(size_);
        load_residual(view(), 0, size_, v.data());
        return v;
    }

private:
    residual_storage storage_ = residual_storage::f32;
    std::size_t size_ = 0;
    std::vector<std::uint8_t> bytes_;
};

}  // namespace octet
