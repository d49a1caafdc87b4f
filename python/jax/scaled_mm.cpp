// The scaled GEMM (octet/gemm/scaled_gemm.hpp, host backend) as an XLA FFI target:
//   octet_jax_scaled_mm(a_codes, a_scales, a_tensor_scale, b_codes, b_scales, b_tensor_scale;
//                       recipe_a: str, recipe_b: str, k: i64, alpha: f32) -> out f32|bf16 [M, N]
// out = alpha * dequant(A) dequant(B)^T, with A the quantized copy of an M x K matrix and B that of
// an N x K matrix (both K-major, as octet's GEMM takes them). Served pairs: tensorwise_e4m3 x
// tensorwise_e4m3, blockwise_1x128 x blockwise_128x128, mxfp8_e4m3 x mxfp8_e4m3, nvfp4 x nvfp4.
#include "octet/gemm/scaled_gemm.hpp"
#include "octet_jax.hpp"

namespace octet_jax {
namespace {

constexpr const char* op = "scaled_mm";

struct operands {
    ffi::AnyBuffer codes, scales, tensor_scale;
};

template <class RA, class RB>
ffi::Error run(const operands& a, const operands& b, std::int64_t k, float alpha, ffi::AnyBuffer out) {
    octet::quantized_cref<RA> A;
    octet::quantized_cref<RB> B;
    if (auto e = as_quantized<RA>(a.codes, a.scales, a.tensor_scale, k, op, "a", A); e.failure()) return e;
    if (auto e = as_quantized<RB>(b.codes, b.scales, b.tensor_scale, k, op, "b", B); e.failure()) return e;
    const std::size_t M = A.rows(), N = B.rows();
    const auto d = out.dimensions();
    if (static_cast<std::size_t>(d[0]) != M || static_cast<std::size_t>(d[1]) != N)
        return invalid(op, "out",
                       "has shape " + std::to_string(d[0]) + " x " + std::to_string(d[1]) + " but A B^T is " +
                           std::to_string(M) + " x " + std::to_string(N));
    octet::gemm_options opt;
    opt.alpha = alpha;
    if (out.element_type() == ffi::DataType::BF16)
        octet::scaled_gemm(host(), A, B,
                           octet::matrix_ref<octet::bf16>(static_cast<octet::bf16*>(out.untyped_data()), M, N, N), opt);
    else
        octet::scaled_gemm(host(), A, B, octet::matrix_ref<float>(static_cast<float*>(out.untyped_data()), M, N, N),
                           opt);
    return ffi::Error::Success();
}

ffi::Error scaled_mm(ffi::AnyBuffer a_codes, ffi::AnyBuffer a_scales, ffi::AnyBuffer a_ts, ffi::AnyBuffer b_codes,
                     ffi::AnyBuffer b_scales, ffi::AnyBuffer b_ts, std::string_view recipe_a, std::string_view recipe_b,
                     std::int64_t k, float alpha, ffi::Result<ffi::AnyBuffer> out) {
    if (auto e = check_type(*out, op, "out", ffi::DataType::F32, ffi::DataType::BF16); e.failure()) return e;
    if (auto e = check_matrix(*out, op, "out"); e.failure()) return e;
    const operands a{a_codes, a_scales, a_ts}, b{b_codes, b_scales, b_ts};
    namespace r = octet::recipes;
    return guarded([&] {
        if (recipe_a == "tensorwise_e4m3" && recipe_b == "tensorwise_e4m3")
            return run<r::tensorwise_e4m3, r::tensorwise_e4m3>(a, b, k, alpha, *out);
        if (recipe_a == "blockwise_1x128" && recipe_b == "blockwise_128x128")
            return run<r::blockwise_1x128, r::blockwise_128x128>(a, b, k, alpha, *out);
        if (recipe_a == "mxfp8_e4m3" && recipe_b == "mxfp8_e4m3")
            return run<r::mxfp8_e4m3, r::mxfp8_e4m3>(a, b, k, alpha, *out);
        if (recipe_a == "nvfp4" && recipe_b == "nvfp4") return run<r::nvfp4, r::nvfp4>(a, b, k, alpha, *out);
        return invalid(op, "recipe_a/recipe_b",
                       "are '" + std::string(recipe_a) + "' x '" + std::string(recipe_b) +
                           "'; the served pairs are tensorwise_e4m3 x tensorwise_e4m3, blockwise_1x128 x "
                           "blockwise_128x128, mxfp8_e4m3 x mxfp8_e4m3 and nvfp4 x nvfp4");
    });
}

}  // namespace
}  // namespace octet_jax

#pragma GCC visibility push(default)
XLA_FFI_DEFINE_HANDLER_SYMBOL(OctetJaxScaledMm, octet_jax::scaled_mm,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Attr<std::string_view>("recipe_a")
                                  .Attr<std::string_view>("recipe_b")
                                  .Attr<std::int64_t>("k")
                                  .Attr<float>("alpha")
                                  .Ret<xla::ffi::AnyBuffer>());
#pragma GCC visibility pop
