// octet/quant/recipe.hpp: granularity, scale rule and scale storage as types; recipes compose them.
//
//   using my_recipe = octet::recipe<octet::e4m3, octet::block<1, 64>, octet::scale::pow2_ceil,
//   octet::scale_storage::ue8m0>;
//
// Granularity: `block<R, C>` scales each R x C block of a matrix with one scale; `full` means the
// whole extent. per_tensor = block<full, full>, per_row = block<1, full> (per token),
// per_column = block<full, 1> (per channel), block<1, N> (1x128 activations, MX's 1x32, NVFP4's
// 1x16), block<128, 128> (weights). (octet 0.1 also had tile<R, C>, another name for block<R, C>.)
//
// Scale rule (independent of granularity): how a block's amax becomes its scale s, so that the
// stored element is encode(x / s) and the dequantized value is decode(code) * s:
//   scale::amax_ratio<m>  s = amax / max_finite * 2^m          (float; margin m >= 0 leaves headroom)
//   scale::pow2_floor     s = 2^(floor(log2 amax) - emax)        (OCP MX spec; the top binade may saturate)
//   scale::pow2_ceil      s = smallest 2^e with amax / s <= max_finite   (never saturates; NVIDIA's rule)
//   scale::pow2_nearest   s = 2^round(log2(amax / max_finite))   (in log space; may saturate up to sqrt 2)
// Scale storage: scale_storage::f32 (any rule), ue8m0 (pow2 rules: code = e + 127), e4m3 (two-level,
// as NVFP4: the block scale is stored in E4M3 relative to one float scale per tensor,
// tensor_scale = tensor amax / (max_finite * 448)).
// Non-finite policy: nan_policy::propagate (the default) gives a block holding a NaN or an Inf the
// NaN scale (UE8M0 0xFF as the OCP MX spec defines it, E4M3 0x7F, a float NaN) and zero codes, so
// the whole block dequantizes to NaN and so does every GEMM output, gradient and attention row
// that reads it: a non-finite input never comes out finite, and a NaN-loss check or a skipped
// step fires (per-tensor recipes: the whole tensor is one block). nan_policy::per_element (the
// earlier default, kept as an option) encodes each element by the format's contract (NaN: its NaN
// code, +max_finite in FP6/FP4, which have none, as CUDA's conversions do; Inf: +-max_finite under
// overflow::saturate) and leaves the rest of its block alone; the codecs' wire formats use it.
#pragma once

#include <cstddef>
#include <type_traits>

#include "octet/format/float_format.hpp"
#include "octet/format/rounding.hpp"

namespace octet {

/// Block extent meaning "the whole dimension".
inline constexpr std::size_t full = 0;

template <std::size_t R, std::size_t C>
struct block {
    static constexpr std::size_t rows = R;
    static constexpr std::size_t cols = C;
};
using per_tensor = block<full, full>;
using per_row = block<1, full>;
using per_column = block<full, 1>;

/// Extent of a block along a dimension of length n (full -> n; at least 1).
OCTET_HD constexpr std::size_t block_extent(std::size_t b, std::size_t n) {
    return b == full ? (n > 0 ? n : 1) : b;
}
/// Number of blocks along a dimension of length n.
OCTET_HD constexpr std::size_t block_count(std::size_t b, std::size_t n) {
    return n == 0 ? 0 : (n + block_extent(b, n) - 1) / block_extent(b, n);
}

namespace scale {
template <int MarginBits = 0>
struct amax_ratio {
    static_assert(MarginBits >= 0 && MarginBits <= 32, "scale::amax_ratio: the margin is a number of bits in [0, 32]");
    static constexpr int margin = MarginBits;
};
struct pow2_floor {};
struct pow2_ceil {};
struct pow2_nearest {};
}  // namespace scale

namespace scale_storage {
struct f32 {};
struct ue8m0 {};
struct e4m3 {};
}  // namespace scale_storage

/// What a NaN or Inf input does to its block (see the top of this file).
namespace nan_policy {
struct per_element {};
struct propagate {};
}  // namespace nan_policy

template <class T>
struct is_amax_ratio : std::false_type {};
template <int M>
struct is_amax_ratio<scale::amax_ratio<M>> : std::true_type {};
template <class T>
inline constexpr bool is_pow2_rule_v = std::is_same_v<T, scale::pow2_floor> || std::is_same_v<T, scale::pow2_ceil> ||
                                       std::is_same_v<T, scale::pow2_nearest>;

template <class T>
struct is_block : std::false_type {};
template <std::size_t R, std::size_t C>
struct is_block<block<R, C>> : std::true_type {};

template <class Format, class Granularity, class ScaleRule, class ScaleStorage = scale_storage::f32,
          class Round = round::nearest_even, class Overflow = overflow::saturate, class Nan = nan_policy::propagate>
struct recipe {
    static_assert(is_float_format_v<Format>, "octet::recipe: Format must be an octet::float_format (e4m3, e2m1, ...)");
    static_assert(Format::special_codes != specials::exponent_only,
                  "octet::recipe: ue8m0 is a scale format; use it as scale_storage::ue8m0, not as the element format");
    static_assert(is_block<Granularity>::value,
                  "octet::recipe: Granularity must be octet::block<R, C> (or per_tensor, per_row, per_column)");
    static_assert(
        is_amax_ratio<ScaleRule>::value || is_pow2_rule_v<ScaleRule>,
        "octet::recipe: ScaleRule must be scale::amax_ratio<m>, scale::pow2_floor, pow2_ceil or pow2_nearest");
    static_assert(std::is_same_v<ScaleStorage, scale_storage::f32> ||
                      std::is_same_v<ScaleStorage, scale_storage::ue8m0> ||
                      std::is_same_v<ScaleStorage, scale_storage::e4m3>,
                  "octet::recipe: ScaleStorage must be scale_storage::f32, ue8m0 or e4m3");
    static_assert(
        !std::is_same_v<ScaleStorage, scale_storage::ue8m0> || is_pow2_rule_v<ScaleRule>,
        "octet::recipe: scale_storage::ue8m0 holds powers of two; use scale::pow2_floor, pow2_ceil or pow2_nearest");
    static_assert(!std::is_same_v<ScaleStorage, scale_storage::e4m3> || is_amax_ratio<ScaleRule>::value,
                  "octet::recipe: scale_storage::e4m3 (two-level, NVFP4) stores amax ratios; use scale::amax_ratio<m>");
    static_assert(is_rounding_v<Round>, "octet::recipe: Round must be one of octet::round::*");
    static_assert(is_overflow_v<Overflow>,
                  "octet::recipe: Overflow must be overflow::saturate or overflow::to_nonfinite");
    static_assert(Format::has_nan || Format::has_inf || std::is_same_v<Overflow, overflow::saturate>,
                  "octet::recipe: FP6/FP4 have neither Inf nor NaN; use overflow::saturate");
    static_assert(Format::bits > 6 || Granularity::cols == full || Granularity::cols % (Format::bits <= 4 ? 2 : 4) == 0,
                  "octet::recipe: sub-byte formats pack 2 (FP4) or 4 (FP6) codes per byte group, so a block's width "
                  "(Granularity::cols) must be a multiple of 2 (FP4) or 4 (FP6), or full");
    static_assert(std::is_same_v<Nan, nan_policy::per_element> || std::is_same_v<Nan, nan_policy::propagate>,
                  "octet::recipe: Nan must be nan_policy::per_element or nan_policy::propagate");

    using format = Format;
    using granularity = Granularity;
    using scale_rule = ScaleRule;
    using scale_storage_type = ScaleStorage;
    using rounding = Round;
    using overflow_policy = Overflow;
    using nan_handling = Nan;

    static constexpr bool two_level = std::is_same_v<ScaleStorage, scale_storage::e4m3>;
    /// nan_policy::propagate: a NaN or an Inf makes its whole block NaN.
    static constexpr bool propagates_nan = std::is_same_v<Nan, nan_policy::propagate>;
    static constexpr bool is_per_tensor = Granularity::rows == full && Granularity::cols == full;
    /// Bytes of one stored scale.
    static constexpr std::size_t scale_bytes = std::is_same_v<ScaleStorage, scale_storage::f32> ? 4 : 1;
};

template <class T>
struct is_recipe : std::false_type {};
template <class F, class G, class S, class St, class R, class O, class N>
struct is_recipe<recipe<F, G, S, St, R, O, N>> : std::true_type {};
template <class T>
inline constexpr bool is_recipe_v = is_recipe<T>::value;

/// The common recipes, by name.
namespace recipes {
using tensorwise_e4m3 = recipe<e4m3, per_tensor, scale::amax_ratio<0>>;
using tensorwise_e5m2 = recipe<e5m2, per_tensor, scale::amax_ratio<0>>;
using rowwise_e4m3 = recipe<e4m3, per_row, scale::amax_ratio<0>>;
using columnwise_e4m3 = recipe<e4m3, per_column, scale::amax_ratio<0>>;
/// DeepSeek-V3: activations and gradients in 1x128 tiles, weights in 128x128 blocks, float scales.
using blockwise_1x128 = recipe<e4m3, block<1, 128>, scale::amax_ratio<0>>;
using blockwise_128x128 = recipe<e4m3, block<128, 128>, scale::amax_ratio<0>>;
/// OCP MX: 32 elements share a UE8M0 scale (the spec's floor rule).
using mxfp8_e4m3 = recipe<e4m3, block<1, 32>, scale::pow2_floor, scale_storage::ue8m0>;
using mxfp8_e5m2 = recipe<e5m2, block<1, 32>, scale::pow2_floor, scale_storage::ue8m0>;
using mxfp6_e2m3 = recipe<e2m3, block<1, 32>, scale::pow2_floor, scale_storage::ue8m0>;
using mxfp6_e3m2 = recipe<e3m2, block<1, 32>, scale::pow2_floor, scale_storage::ue8m0>;
using mxfp4 = recipe<e2m1, block<1, 32>, scale::pow2_floor, scale_storage::ue8m0>;
/// MXFP8 with the round-up scale rule (never saturates).
using mxfp8_e4m3_ceil = recipe<e4m3, block<1, 32>, scale::pow2_ceil, scale_storage::ue8m0>;
/// NVFP4: 16 E2M1 elements share an E4M3 scale, on top of one float scale per tensor.
using nvfp4 = recipe<e2m1, block<1, 16>, scale::amax_ratio<0>, scale_storage::e4m3>;
}  // namespace recipes

/// Recipe R with another non-finite policy (nan_policy::per_element: the earlier default, each
/// NaN or Inf by the format's contract and the rest of its block unchanged).
template <class R, class Nan>
using with_nan_policy = recipe<typename R::format, typename R::granularity, typename R::scale_rule,
                               typename R::scale_storage_type, typename R::rounding, typename R::overflow_policy, Nan>;

}  // namespace octet
