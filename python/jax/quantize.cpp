// The quantizer (octet/quant/quantize.hpp) as an XLA FFI target:
//   octet_jax_quantize(x f32|bf16 [rows, cols], tensor_amax f32[]; recipe: str)
//       -> (codes, scales, tensor_scale, amax f32[])
// One row-wise copy in octet's layout (octet_jax.hpp); a column-wise copy is the quantized copy of
// x.T, which Python asks for with another call. tensor_amax < 0 measures the amax from x; it is an
// operand, not an attribute, so that a jitted step can pass a traced (delayed-scaling) amax.
#include "octet/quant/quantize.hpp"
#include "octet_jax.hpp"

namespace octet_jax {
namespace {

constexpr const char* op = "quantize";

template <class R, class In>
ffi::Error run(const ffi::AnyBuffer& x, float tensor_amax, ffi::AnyBuffer codes, ffi::AnyBuffer scales,
               ffi::AnyBuffer tensor_scale, ffi::AnyBuffer amax) {
    const auto d = x.dimensions();
    const auto rows = static_cast<std::size_t>(d[0]), cols = static_cast<std::size_t>(d[1]);
    const octet::quant_layout l = octet::quant_layout_of<R>::make(rows, cols);
    if (auto e = check_output(codes, op, "codes", code_type<R>(), code_type<R>(), l.data_bytes); e.failure()) return e;
    if (auto e = check_output(scales, op, "scales", scale_type<R>(), scale_type<R>(), l.scale_bytes); e.failure())
        return e;
    if (auto e = check_output(tensor_scale, op, "tensor_scale", ffi::DataType::F32, ffi::DataType::F32,
                              R::two_level ? 4 : 0);
        e.failure())
        return e;
    if (auto e = check_output(amax, op, "amax", ffi::DataType::F32, ffi::DataType::F32, 4); e.failure()) return e;
    const octet::matrix_ref<const In> xm(static_cast<const In*>(x.untyped_data()), rows, cols, cols);
    const octet::quantized_ref<R> q(static_cast<std::uint8_t*>(codes.untyped_data()),
                                    static_cast<std::uint8_t*>(scales.untyped_data()), l,
                                    R::two_level ? static_cast<float*>(tensor_scale.untyped_data()) : nullptr);
    octet::quantize_options opt;
    opt.tensor_amax = tensor_amax;
    const octet::quantize_result res = octet::quantize<R>(host(), xm, q, {}, opt);
    *static_cast<float*>(amax.untyped_data()) = res.amax;
    return ffi::Error::Success();
}

ffi::Error quantize(ffi::AnyBuffer x, ffi::AnyBuffer tensor_amax_buf, std::string_view recipe,
                    ffi::Result<ffi::AnyBuffer> codes, ffi::Result<ffi::AnyBuffer> scales,
                    ffi::Result<ffi::AnyBuffer> tensor_scale, ffi::Result<ffi::AnyBuffer> amax) {
    if (auto e = check_type(x, op, "x", ffi::DataType::F32, ffi::DataType::BF16); e.failure()) return e;
    if (auto e = check_matrix(x, op, "x"); e.failure()) return e;
    if (auto e = check_output(tensor_amax_buf, op, "tensor_amax", ffi::DataType::F32, ffi::DataType::F32, 4);
        e.failure())
        return e;
    const float tensor_amax = *static_cast<const float*>(tensor_amax_buf.untyped_data());
    return guarded([&] {
        return with_recipe(
            recipe,
            [&](auto rt) {
                using R = typename decltype(rt)::type;
                if (x.element_type() == ffi::DataType::BF16)
                    return run<R, octet::bf16>(x, tensor_amax, *codes, *scales, *tensor_scale, *amax);
                return run<R, float>(x, tensor_amax, *codes, *scales, *tensor_scale, *amax);
            },
            [&] { return unknown_recipe(op, "recipe", recipe); });
    });
}

}  // namespace
}  // namespace octet_jax

#pragma GCC visibility push(default)
XLA_FFI_DEFINE_HANDLER_SYMBOL(OctetJaxQuantize, octet_jax::quantize,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Attr<std::string_view>("recipe")
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>());
#pragma GCC visibility pop
