// octet_torch.hpp: what every op library of the PyTorch embedding shares: argument checks that
// name the argument, tensor <-> octet view conversions, the name dispatch on the recipe and format
// lists (registry.hpp, format_list.hpp: the names Python passes), and the host executor the CPU
// kernels run on.
//
// Conventions of every op:
//   * tensors are checked, never silently copied: a wrong dtype raises TypeError, a wrong device,
//     shape or layout ValueError, each naming the op and the argument;
//   * an octet::error thrown inside a kernel reaches Python as ValueError with octet's message;
//   * a quantized copy travels as (codes, scales, tensor_scale) in octet's layout
//     (quant/tensor.hpp, padded): codes are rows x ld (FP8, as torch's float8 dtype where one exists)
//     or rows x row_bytes (uint8: FP6/FP4 packed); scales are scale_cols x scale_ld (the grid is
//     column-major, so the row-block index is contiguous), float32, float8_e8m0fnu (UE8M0) or
//     float8_e4m3fn (NVFP4's block scales); tensor_scale is one float32 for two-level recipes
//     (NVFP4) and an empty tensor otherwise.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "format_list.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/matrix.hpp"
#include "octet/core/span.hpp"
#include "octet/format/float_format.hpp"
#include "octet/format/rounding.hpp"
#include "octet/quant/recipe.hpp"
#include "octet/quant/stats.hpp"
#include "octet/quant/tensor.hpp"
#include "registry.hpp"

namespace octet_torch {

template <class T>
struct type_tag {
    using type = T;
};

/// The names of a list, "a, b, c" (for messages).
template <std::size_t N>
std::string joined(const std::string_view (&names)[N]) {
    std::string s;
    for (std::string_view n : names) {
        if (!s.empty()) s += ", ";
        s += n;
    }
    return s;
}

/// The names of a list, in order (for Python, which asks the ops for them instead of restating them).
template <std::size_t N>
std::vector<std::string> name_list(const std::string_view (&names)[N]) {
    return std::vector<std::string>(std::begin(names), std::end(names));
}

/// The CPU kernels' executor: a pool of torch's intra-op thread count, started on first use and
/// owned by this library (the embedding is the application here), so no op starts threads.
inline octet::host_executor host() {
    static octet::thread_pool pool(at::get_num_threads());
    return octet::on_host(pool);
}

/// Runs body, turning octet::error into the ValueError that torch raises for c10::ValueError.
template <class Body>
decltype(auto) guarded(Body&& body) {
    try {
        return body();
    } catch (const octet::error& e) {
        TORCH_CHECK_VALUE(false, e.what());
    }
}

inline std::string where(const char* op, const char* arg) {
    return std::string("octet::") + op + ": argument '" + arg + "' ";
}

/// A defined tensor on `device` whose dtype is one of `dtypes`.
inline void check_tensor(const at::Tensor& t, const char* op, const char* arg,
                         std::initializer_list<at::ScalarType> dtypes, c10::DeviceType device = c10::DeviceType::CPU) {
    TORCH_CHECK_VALUE(t.defined(), where(op, arg), "is undefined; pass a tensor");
    bool ok = false;
    std::string names;
    for (auto d : dtypes) {
        ok = ok || t.scalar_type() == d;
        names += (names.empty() ? "" : ", ") + std::string(c10::toString(d));
    }
    TORCH_CHECK_TYPE(ok, where(op, arg), "has dtype ", t.scalar_type(), "; pass ", names);
    TORCH_CHECK_VALUE(t.device().type() == device, where(op, arg), "is on ", t.device(), "; this kernel runs on ",
                      c10::DeviceTypeName(device), " (move it there, or all arguments to one device)");
}

/// The device an op's kernel runs on, from its leading tensor: the CPU, or CUDA where the op has
/// CUDA kernels in this build (OCTET_TORCH_CUDA: torch with CUDA and nvcc at build time). Any
/// other device is refused by name, as is CUDA in a build without them.
inline c10::DeviceType kernel_device(const at::Tensor& t, const char* op, const char* arg) {
    if (!t.defined() || t.is_cpu()) return c10::DeviceType::CPU;
#ifdef OCTET_TORCH_CUDA
    if (t.is_cuda()) return c10::DeviceType::CUDA;
#endif
    TORCH_CHECK_VALUE(false, where(op, arg), "is on ", t.device(), "; this build of octet's op libraries runs ", op,
                      " on the CPU",
                      (t.is_cuda() ? " only (it was built without CUDA kernels: see docs/python.md, "
                                     "CUDA kernels, to build them), so move it to the CPU"
                                   : ", so move it there"));
}

/// A 2-D tensor whose rows or columns are contiguous (a transposed view is accepted as it is;
/// any other strides are rejected rather than copied).
template <class T>
octet::matrix_ref<T> as_matrix(const at::Tensor& t, const char* op, const char* arg) {
    TORCH_CHECK_VALUE(t.dim() == 2, where(op, arg), "has ", t.dim(), " dimensions; pass a 2-D tensor (reshape to ",
                      "rows x cols)");
    const auto r = static_cast<std::size_t>(t.size(0)), c = static_cast<std::size_t>(t.size(1));
    auto* data = reinterpret_cast<T*>(t.data_ptr());
    if (r == 0 || c == 0) return octet::matrix_ref<T>(data, r, c);  // strides of an empty tensor mean nothing
    if (t.stride(1) == 1 || c == 1) {  // rows contiguous (one row's stride(0) means nothing)
        TORCH_CHECK_VALUE(r == 1 || t.stride(0) >= static_cast<int64_t>(c), where(op, arg), "has strides ", t.strides(),
                          " (overlapping or broadcast rows); pass .contiguous()");
        return octet::matrix_ref<T>(data, r, c, r == 1 ? c : static_cast<std::size_t>(t.stride(0)));
    }
    TORCH_CHECK_VALUE(t.stride(0) == 1 && t.stride(1) >= static_cast<int64_t>(r), where(op, arg), "has strides ",
                      t.strides(),
                      "; pass a tensor whose rows or columns are contiguous and do not overlap (.contiguous())");
    return octet::matrix_ref<T>(data, r, c, static_cast<std::size_t>(t.stride(1)), octet::storage_order::col_major);
}

/// A 1-D contiguous tensor's elements.
inline void check_vector(const at::Tensor& t, const char* op, const char* arg) {
    TORCH_CHECK_VALUE(t.is_contiguous(), where(op, arg), "is not contiguous; pass .contiguous()");
}

/// The torch dtype that holds one code of Fmt, or uint8 where torch has none (and for packed
/// sub-byte formats).
template <class Fmt>
at::ScalarType code_dtype() {
    if constexpr (std::is_same_v<Fmt, octet::e4m3>)
        return at::kFloat8_e4m3fn;
    else if constexpr (std::is_same_v<Fmt, octet::e5m2>)
        return at::kFloat8_e5m2;
    else if constexpr (std::is_same_v<Fmt, octet::e4m3fnuz>)
        return at::kFloat8_e4m3fnuz;
    else if constexpr (std::is_same_v<Fmt, octet::e5m2fnuz>)
        return at::kFloat8_e5m2fnuz;
    else if constexpr (std::is_same_v<Fmt, octet::ue8m0>)
        return at::kFloat8_e8m0fnu;
    else
        return at::kByte;
}

/// The dtype of a recipe's stored scales.
template <class Recipe>
at::ScalarType scale_dtype() {
    using St = typename Recipe::scale_storage_type;
    if constexpr (std::is_same_v<St, octet::scale_storage::ue8m0>)
        return at::kFloat8_e8m0fnu;
    else if constexpr (std::is_same_v<St, octet::scale_storage::e4m3>)
        return at::kFloat8_e4m3fn;
    else
        return at::kFloat;
}

/// The format names Python passes (octet::format_name), in a fixed order (recipe_info's ids).
#define OCTET_TORCH_NAME(n) #n,
inline constexpr std::string_view format_names[] = {OCTET_TORCH_FORMATS(OCTET_TORCH_NAME)};
#undef OCTET_TORCH_NAME

/// Calls f(type_tag<Fmt>{}) for a format name.
template <class F>
decltype(auto) with_format(std::string_view name, const char* op, F&& f) {
#define OCTET_TORCH_FORMAT(n) \
    if (name == #n) return f(type_tag<octet::n>{});
    OCTET_TORCH_FORMATS(OCTET_TORCH_FORMAT)
#undef OCTET_TORCH_FORMAT
    TORCH_CHECK_VALUE(false, where(op, "format"), "is '", std::string(name), "'; pass one of ", joined(format_names));
}

/// The recipe names Python passes (octet::recipes::<name>), in registry.hpp's order.
#define OCTET_TORCH_NAME(n) #n,
inline constexpr std::string_view recipe_names[] = {OCTET_TORCH_RECIPES(OCTET_TORCH_NAME)};
#undef OCTET_TORCH_NAME

/// Calls f(type_tag<Recipe>{}) for a recipe name.
template <class F>
decltype(auto) with_recipe(std::string_view name, const char* op, F&& f) {
#define OCTET_TORCH_RECIPE(n) \
    if (name == #n) return f(type_tag<octet::recipes::n>{});
    OCTET_TORCH_RECIPES(OCTET_TORCH_RECIPE)
#undef OCTET_TORCH_RECIPE
    TORCH_CHECK_VALUE(false, where(op, "recipe"), "is '", std::string(name), "'; pass one of ", joined(recipe_names));
}

/// A quantized copy passed in from Python as (codes, scales, tensor_scale) plus its logical
/// column count (codes hold ld >= cols codes per row). Checks every tensor against the layout
/// that rows x cols has under Recipe, and returns the view.
template <class Recipe>
octet::quantized_cref<Recipe> as_quantized(const at::Tensor& codes, const at::Tensor& scales,
                                           const at::Tensor& tensor_scale, int64_t cols, const char* op,
                                           const char* arg, c10::DeviceType device = c10::DeviceType::CPU) {
    const std::string a(arg);
    const std::string codes_arg = a + "_codes", scales_arg = a + "_scales", ts_arg = a + "_tensor_scale";
    check_tensor(codes, op, codes_arg.c_str(), {code_dtype<typename Recipe::format>(), at::kByte}, device);
    check_tensor(scales, op, scales_arg.c_str(), {scale_dtype<Recipe>(), at::kByte}, device);
    TORCH_CHECK_VALUE(codes.dim() == 2 && codes.is_contiguous(), where(op, codes_arg.c_str()),
                      "must be a contiguous 2-D tensor of codes as octet.quantize returns it (shape ", codes.sizes(),
                      ")");
    TORCH_CHECK_VALUE(cols >= 0, where(op, (a + "_cols").c_str()), "is ", cols, "; pass the logical column count");
    const auto rows = static_cast<std::size_t>(codes.size(0));
    const octet::quant_layout l = octet::quant_layout_of<Recipe>::make(rows, static_cast<std::size_t>(cols));
    TORCH_CHECK_VALUE(static_cast<std::size_t>(codes.numel()) * codes.element_size() == l.data_bytes,
                      where(op, codes_arg.c_str()), "holds ", codes.numel() * codes.element_size(), " bytes; a ", rows,
                      " x ", cols, " copy under this recipe holds ", l.data_bytes,
                      " (pass the codes and cols that octet.quantize returned)");
    TORCH_CHECK_VALUE(
        scales.is_contiguous() && static_cast<std::size_t>(scales.numel()) * scales.element_size() == l.scale_bytes,
        where(op, scales_arg.c_str()), "holds ", scales.numel() * scales.element_size(),
        " bytes (contiguous: ", scales.is_contiguous(), "); this copy's scale grid holds ", l.scale_bytes);
    const float* ts = nullptr;
    if constexpr (Recipe::two_level) {
        check_tensor(tensor_scale, op, ts_arg.c_str(), {at::kFloat}, device);
        TORCH_CHECK_VALUE(tensor_scale.numel() == 1, where(op, ts_arg.c_str()), "has ", tensor_scale.numel(),
                          " elements; two-level recipes keep one float tensor scale");
        ts = tensor_scale.data_ptr<float>();
    }
    return octet::quantized_cref<Recipe>(static_cast<const std::uint8_t*>(codes.data_ptr()),
                                         static_cast<const std::uint8_t*>(scales.data_ptr()), l, ts);
}

// ---- shared by the quantization ops and those that quantize inside (gemm, linear) ----

template <class F>
decltype(auto) with_rounding(std::string_view name, const char* op, F&& f) {
#define OCTET_TORCH_ROUNDING(n) \
    if (name == #n) return f(type_tag<octet::round::n>{});
    OCTET_TORCH_ROUNDINGS(OCTET_TORCH_ROUNDING)
#undef OCTET_TORCH_ROUNDING
    TORCH_CHECK_VALUE(false, where(op, "rounding"), "is '", std::string(name),
                      "'; pass nearest_even, stochastic, toward_zero, up or down");
}

template <class F>
decltype(auto) with_overflow(std::string_view name, const char* op, F&& f) {
#define OCTET_TORCH_OVERFLOW(n) \
    if (name == #n) return f(type_tag<octet::overflow::n>{});
    OCTET_TORCH_OVERFLOWS(OCTET_TORCH_OVERFLOW)
#undef OCTET_TORCH_OVERFLOW
    TORCH_CHECK_VALUE(false, where(op, "overflow"), "is '", std::string(name), "'; pass saturate or to_nonfinite");
}

/// Calls f(type_tag<float | octet::bf16 | octet::fp16>{}) for x's dtype (checked by the caller).
template <class F>
decltype(auto) with_input(const at::Tensor& x, F&& f) {
    if (x.scalar_type() == at::kBFloat16) return f(type_tag<octet::bf16>{});
    if (x.scalar_type() == at::kHalf) return f(type_tag<octet::fp16>{});
    return f(type_tag<float>{});
}

constexpr std::initializer_list<at::ScalarType> float_inputs = {at::kFloat, at::kBFloat16, at::kHalf};

template <class Fmt>
constexpr bool one_code_per_dtype_element() {
    return Fmt::bits == 8;
}

/// Owning tensors of one quantized copy (rows x cols) in octet's layout (tensor_scale only for
/// two-level recipes), and its view.
template <class Recipe>
struct copy_tensors {
    at::Tensor codes, scales, tensor_scale;
    octet::quant_layout layout{};

    copy_tensors(std::size_t rows, std::size_t cols, const at::TensorOptions& o) {
        layout = octet::quant_layout_of<Recipe>::make(rows, cols);
        using Fmt = typename Recipe::format;
        const auto code_cols = one_code_per_dtype_element<Fmt>() ? layout.ld : layout.row_bytes;
        codes = at::empty({static_cast<int64_t>(rows), static_cast<int64_t>(code_cols)}, o.dtype(code_dtype<Fmt>()));
        scales = at::empty({static_cast<int64_t>(layout.scale_cols), static_cast<int64_t>(layout.scale_ld)},
                           o.dtype(scale_dtype<Recipe>()));
        if constexpr (Recipe::two_level) {  // else undefined
            tensor_scale = at::empty({1}, o.dtype(at::kFloat));
            // octet writes the tensor scale only when x holds elements; an empty copy's is 1, the
            // scale of an amax of 0 (so that no op returns an unwritten value)
            if (rows == 0 || cols == 0) tensor_scale.fill_(1.0f);
        }
    }
    octet::quantized_ref<Recipe> ref() {
        float* ts = nullptr;
        if constexpr (Recipe::two_level) ts = tensor_scale.data_ptr<float>();
        return octet::quantized_ref<Recipe>(static_cast<std::uint8_t*>(codes.data_ptr()),
                                            static_cast<std::uint8_t*>(scales.data_ptr()), layout, ts);
    }
};

/// The tensor_amax an amax history gives (delayed scaling, reduction max): the history's max when
/// it is positive, else -1 (current scaling: the first step, or a NaN in the history, where
/// torch's max would be NaN). The tensor form keeps per-step values out of torch.compile's guards.
inline float history_amax(const at::Tensor& history, const char* op, const char* arg) {
    check_tensor(history, op, arg, {at::kFloat});
    TORCH_CHECK_VALUE(history.dim() == 1 && history.is_contiguous(), where(op, arg), "has shape ", history.sizes(),
                      "; pass a contiguous 1-D float32 history");
    const float* h = history.data_ptr<float>();
    float m = 0.0f;
    bool nan = false;
    for (int64_t i = 0; i < history.numel(); ++i) {
        nan = nan || std::isnan(h[i]);
        m = std::max(m, h[i]);
    }
    // An Inf would become the scale's amax (the host path refuses it; the device would take it).
    TORCH_CHECK_VALUE(!(m > std::numeric_limits<float>::max()), where(op, arg),
                      "holds an infinite amax; pass a history of finite amaxes (a NaN entry means: measure)");
    return !nan && m > 0.0f ? m : -1.0f;
}

/// (seed, offset) from a Philox pair tensor: int64 [2].
inline std::pair<int64_t, int64_t> philox_pair(const at::Tensor& philox, const char* op) {
    check_tensor(philox, op, "philox", {at::kLong});
    TORCH_CHECK_VALUE(philox.numel() == 2 && philox.is_contiguous(), where(op, "philox"), "has shape ", philox.sizes(),
                      "; pass a contiguous int64 tensor (seed, offset)");
    return {philox.data_ptr<int64_t>()[0], philox.data_ptr<int64_t>()[1]};
}

/// quant_stats as 8 doubles, in the order of octet::quantize's stats rows (octet.torch.STATS_FIELDS).
inline void put_quant_stats(double* row, const octet::quant_stats& s) {
    const std::array<double, 8> v = {s.amax,
                                     static_cast<double>(s.elements),
                                     static_cast<double>(s.saturated),
                                     static_cast<double>(s.flushed_to_zero),
                                     static_cast<double>(s.non_finite),
                                     static_cast<double>(s.lost_to_nan),
                                     s.signal_energy,
                                     s.noise_energy};
    for (std::size_t i = 0; i < v.size(); ++i) row[i] = v[i];
}

}  // namespace octet_torch
