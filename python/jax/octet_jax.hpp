// octet_jax.hpp: what the XLA FFI handlers of octet's JAX embedding share: the recipes they serve,
// buffer checks that name the argument, buffer <-> octet view conversions, and the executor.
//
// Conventions of every handler (the Python side, python/octet/jax.py, checks the same things at
// trace time, so these are the second line of defence against a hand-made ffi_call):
//   * buffers are untyped (ffi::AnyBuffer: typed FP8 buffers do not compile with jaxlib's
//     ffi.h); the element type is checked at run time and a wrong one returns
//     ffi::Error(kInvalidArgument) naming the op and the argument;
//   * XLA hands custom calls row-major (default layout) buffers, so a 2-D buffer is a dense
//     row-major matrix;
//   * an octet::error thrown by octet reaches JAX as an InvalidArgument error with octet's message;
//   * a quantized copy travels as (codes, scales, tensor_scale) in octet's layout (quant/tensor.hpp,
//     padded), exactly as the torch ops pass it: codes rows x ld (e4m3 as float8_e4m3fn) or rows x
//     row_bytes (uint8, NVFP4 packed); scales scale_cols x scale_ld (float32, float8_e8m0fnu or
//     float8_e4m3fn); tensor_scale one float32 for NVFP4, zero elements otherwise.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>

#include "octet/core/executor.hpp"
#include "octet/core/matrix.hpp"
#include "octet/quant/recipe.hpp"
#include "octet/quant/tensor.hpp"
#include "xla/ffi/api/ffi.h"

namespace octet_jax {

namespace ffi = xla::ffi;

template <class T>
struct type_tag {
    using type = T;
};

/// The handlers' executor: a pool of the machine's hardware threads, started on first use and
/// owned by this library, so no call starts threads. XLA's CPU runtime may run two custom calls
/// at once; the pool then runs the second one on its calling thread alone (thread_pool::try_run).
inline octet::host_executor host() {
    static octet::thread_pool pool(static_cast<int>(std::thread::hardware_concurrency()));
    return octet::on_host(pool);
}

inline std::string where(const char* op, std::string_view arg) {
    return std::string("octet_jax.") + op + ": argument '" + std::string(arg) + "' ";
}

inline ffi::Error invalid(const char* op, std::string_view arg, const std::string& what) {
    return ffi::Error::InvalidArgument(where(op, arg) + what);
}

/// Runs body (returning ffi::Error), turning octet::error into InvalidArgument and anything else
/// thrown into Internal, so that no exception crosses the C ABI into XLA.
template <class Body>
ffi::Error guarded(Body&& body) {
    try {
        return body();
    } catch (const octet::error& e) {
        return ffi::Error::InvalidArgument(e.what());
    } catch (const std::exception& e) {
        return ffi::Error::Internal(std::string("octet_jax: ") + e.what());
    }
}

/// The recipes the handlers serve (each is an instantiation of the quantizer, dequantize and the
/// GEMM, so the list is short on purpose).
inline constexpr const char* recipe_names = "tensorwise_e4m3, blockwise_1x128, blockwise_128x128, mxfp8_e4m3, nvfp4";

/// Calls f(type_tag<Recipe>{}) for a served recipe name; `unknown` (returning the same type as f)
/// otherwise.
template <class F, class Unknown>
decltype(auto) with_recipe(std::string_view name, F&& f, Unknown&& unknown) {
    namespace r = octet::recipes;
    if (name == "tensorwise_e4m3") return f(type_tag<r::tensorwise_e4m3>{});
    if (name == "blockwise_1x128") return f(type_tag<r::blockwise_1x128>{});
    if (name == "blockwise_128x128") return f(type_tag<r::blockwise_128x128>{});
    if (name == "mxfp8_e4m3") return f(type_tag<r::mxfp8_e4m3>{});
    if (name == "nvfp4") return f(type_tag<r::nvfp4>{});
    return unknown();
}

inline ffi::Error unknown_recipe(const char* op, std::string_view arg, std::string_view name) {
    return invalid(op, arg, "is '" + std::string(name) + "'; pass one of " + recipe_names);
}

/// The buffer element type of one code of Fmt (uint8 for packed sub-byte formats).
template <class Recipe>
constexpr ffi::DataType code_type() {
    return std::is_same_v<typename Recipe::format, octet::e4m3> ? ffi::DataType::F8E4M3FN : ffi::DataType::U8;
}

/// The buffer element type of a recipe's stored scales.
template <class Recipe>
constexpr ffi::DataType scale_type() {
    using St = typename Recipe::scale_storage_type;
    if constexpr (std::is_same_v<St, octet::scale_storage::ue8m0>)
        return ffi::DataType::F8E8M0FNU;
    else if constexpr (std::is_same_v<St, octet::scale_storage::e4m3>)
        return ffi::DataType::F8E4M3FN;
    else
        return ffi::DataType::F32;
}

inline const char* type_name(ffi::DataType t) {
    switch (t) {
        case ffi::DataType::F32:
            return "float32";
        case ffi::DataType::BF16:
            return "bfloat16";
        case ffi::DataType::F16:
            return "float16";
        case ffi::DataType::F64:
            return "float64";
        case ffi::DataType::U8:
            return "uint8";
        case ffi::DataType::F8E4M3FN:
            return "float8_e4m3fn";
        case ffi::DataType::F8E5M2:
            return "float8_e5m2";
        case ffi::DataType::F8E8M0FNU:
            return "float8_e8m0fnu";
        default:
            return "another type";
    }
}

/// An error when b's element type is neither `want` nor `also` (pass `want` twice for one type).
inline ffi::Error check_type(const ffi::AnyBuffer& b, const char* op, std::string_view arg, ffi::DataType want,
                             ffi::DataType also) {
    const ffi::DataType t = b.element_type();
    if (t == want || t == also) return ffi::Error::Success();
    std::string pass = type_name(want);
    if (also != want) pass += std::string(" or ") + type_name(also);
    return invalid(op, arg, std::string("has element type ") + type_name(t) + "; pass " + pass);
}

/// An error when b is not a rank-2 buffer.
inline ffi::Error check_matrix(const ffi::AnyBuffer& b, const char* op, std::string_view arg) {
    const auto d = b.dimensions();
    if (d.size() == 2) return ffi::Error::Success();
    return invalid(op, arg, "has " + std::to_string(d.size()) + " dimensions; pass a 2-D array (rows x cols)");
}

/// The view of a quantized copy passed as (codes, scales, tensor_scale) plus its logical column
/// count, after checking every buffer against the layout of rows x cols under Recipe.
template <class Recipe>
ffi::Error as_quantized(const ffi::AnyBuffer& codes, const ffi::AnyBuffer& scales, const ffi::AnyBuffer& tensor_scale,
                        std::int64_t cols, const char* op, const std::string& arg, octet::quantized_cref<Recipe>& out) {
    const std::string codes_arg = arg + "_codes", scales_arg = arg + "_scales", ts_arg = arg + "_tensor_scale";
    if (auto e = check_type(codes, op, codes_arg, code_type<Recipe>(), ffi::DataType::U8); e.failure()) return e;
    if (auto e = check_type(scales, op, scales_arg, scale_type<Recipe>(), ffi::DataType::U8); e.failure()) return e;
    if (auto e = check_matrix(codes, op, codes_arg); e.failure()) return e;
    if (cols < 0) return invalid(op, arg + "_cols", "is " + std::to_string(cols) + "; pass the logical column count");
    const auto rows = static_cast<std::size_t>(codes.dimensions()[0]);
    const octet::quant_layout l = octet::quant_layout_of<Recipe>::make(rows, static_cast<std::size_t>(cols));
    if (codes.size_bytes() != l.data_bytes)
        return invalid(op, codes_arg,
                       "holds " + std::to_string(codes.size_bytes()) + " bytes; a " + std::to_string(rows) + " x " +
                           std::to_string(cols) + " copy under this recipe holds " + std::to_string(l.data_bytes) +
                           " (pass the codes and cols that octet.jax.quantize returned)");
    if (scales.size_bytes() != l.scale_bytes)
        return invalid(op, scales_arg,
                       "holds " + std::to_string(scales.size_bytes()) + " bytes; this copy's scale grid holds " +
                           std::to_string(l.scale_bytes));
    const float* ts = nullptr;
    if constexpr (Recipe::two_level) {
        if (auto e = check_type(tensor_scale, op, ts_arg, ffi::DataType::F32, ffi::DataType::F32); e.failure())
            return e;
        if (tensor_scale.element_count() != 1)
            return invalid(op, ts_arg,
                           "has " + std::to_string(tensor_scale.element_count()) +
                               " elements; two-level recipes keep one float32 tensor scale");
        ts = static_cast<const float*>(tensor_scale.untyped_data());
    }
    out = octet::quantized_cref<Recipe>(static_cast<const std::uint8_t*>(codes.untyped_data()),
                                        static_cast<const std::uint8_t*>(scales.untyped_data()), l, ts);
    return ffi::Error::Success();
}

/// Checks a buffer's element type and byte size: outputs (Python sizes them from the same layout,
/// so a mismatch means a hand-made call) and scalar operands.
inline ffi::Error check_output(const ffi::AnyBuffer& b, const char* op, std::string_view arg, ffi::DataType want,
                               ffi::DataType also, std::size_t bytes) {
    if (auto e = check_type(b, op, arg, want, also); e.failure()) return e;
    if (b.size_bytes() != bytes)
        return invalid(op, arg,
                       "holds " + std::to_string(b.size_bytes()) + " bytes; it must hold " + std::to_string(bytes) +
                           " (results are sized with octet.jax.layout; tensor_amax is one float32)");
    return ffi::Error::Success();
}

}  // namespace octet_jax
