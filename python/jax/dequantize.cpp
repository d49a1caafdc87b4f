// dequantize (octet/quant/quantize.hpp) as an XLA FFI target, and the layout query Python sizes
// results with:
//   octet_jax_dequantize(codes, scales, tensor_scale; recipe: str) -> out f32|bf16 [rows, cols]
//       (cols is the output's; decode(code) * scale with one rounding to the output type)
//   octet_jax_layout(recipe, rows, cols, out[9]) (plain C, for ctypes) -> 0, or -1 for an unknown
//       recipe: code rows, code cols, scale cols, scale ld, tensor-scale elements, bits, scale type
//       (0 float32, 1 ue8m0, 2 e4m3), block rows, block cols (0: the whole extent).
#include "octet/quant/quantize.hpp"
#include "octet_jax.hpp"

namespace octet_jax {
namespace {

constexpr const char* op = "dequantize";

ffi::Error dequantize(ffi::AnyBuffer codes, ffi::AnyBuffer scales, ffi::AnyBuffer tensor_scale, std::string_view recipe,
                      ffi::Result<ffi::AnyBuffer> out) {
    if (auto e = check_type(*out, op, "out", ffi::DataType::F32, ffi::DataType::BF16); e.failure()) return e;
    if (auto e = check_matrix(*out, op, "out"); e.failure()) return e;
    const auto rows = static_cast<std::size_t>(out->dimensions()[0]);
    const auto cols = static_cast<std::size_t>(out->dimensions()[1]);
    if (auto e = check_matrix(codes, op, "q_codes"); e.failure()) return e;
    if (static_cast<std::size_t>(codes.dimensions()[0]) != rows)
        return invalid(
            op, "q_codes",
            "has " + std::to_string(codes.dimensions()[0]) + " rows but the output has " + std::to_string(rows));
    return guarded([&] {
        return with_recipe(
            recipe,
            [&](auto rt) {
                using R = typename decltype(rt)::type;
                octet::quantized_cref<R> q;
                if (auto e = as_quantized<R>(codes, scales, tensor_scale, static_cast<std::int64_t>(cols), op, "q", q);
                    e.failure())
                    return e;
                if (out->element_type() == ffi::DataType::BF16)
                    octet::dequantize(host(), q,
                                      octet::matrix_ref<octet::bf16>(static_cast<octet::bf16*>(out->untyped_data()),
                                                                     rows, cols, cols));
                else
                    octet::dequantize(
                        host(), q,
                        octet::matrix_ref<float>(static_cast<float*>(out->untyped_data()), rows, cols, cols));
                return ffi::Error::Success();
            },
            [&] { return unknown_recipe(op, "recipe", recipe); });
    });
}

}  // namespace
}  // namespace octet_jax

#pragma GCC visibility push(default)
XLA_FFI_DEFINE_HANDLER_SYMBOL(OctetJaxDequantize, octet_jax::dequantize,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Attr<std::string_view>("recipe")
                                  .Ret<xla::ffi::AnyBuffer>());

extern "C" int octet_jax_layout(const char* recipe, std::int64_t rows, std::int64_t cols, std::int64_t* out) {
    if (recipe == nullptr || out == nullptr || rows < 0 || cols < 0) return -1;
    return octet_jax::with_recipe(
        recipe,
        [&](auto rt) {
            using R = typename decltype(rt)::type;
            using G = typename R::granularity;
            using St = typename R::scale_storage_type;
            const octet::quant_layout l =
                octet::quant_layout_of<R>::make(static_cast<std::size_t>(rows), static_cast<std::size_t>(cols));
            const bool one_code_per_byte = R::format::bits == 8;
            const std::int64_t v[9] = {
                rows,
                static_cast<std::int64_t>(one_code_per_byte ? l.ld : l.row_bytes),
                static_cast<std::int64_t>(l.scale_cols),
                static_cast<std::int64_t>(l.scale_ld),
                R::two_level ? 1 : 0,
                R::format::bits,
                std::is_same_v<St, octet::scale_storage::ue8m0>  ? 1
                : std::is_same_v<St, octet::scale_storage::e4m3> ? 2
                                                                 : 0,
                G::rows == octet::full ? 0 : static_cast<std::int64_t>(G::rows),
                G::cols == octet::full ? 0 : static_cast<std::int64_t>(G::cols),
            };
            for (int i = 0; i < 9; ++i) out[i] = v[i];
            return 0;
        },
        [] { return -1; });
}
#pragma GCC visibility pop
