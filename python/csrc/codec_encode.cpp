// octet::encode_gradient(x, format, transform, block, scale_block, seed, stochastic, first_index,
//                        random_stream, residual) -> message (uint8)
// octet::encode_gradient_transformed(y, n, ...same...) -> message
// (octet/codec/codec.hpp; on CUDA tensors codec.cuh's stream forms, which never synchronize). The
// optional residual is error feedback, updated in place: float32 (f32), bfloat16 (bf16) or uint8 (the
// e4m3 block layout of octet/codec/feedback.hpp), on x's device.
#include "codec_torch.hpp"

namespace octet_torch {
namespace {

using octet::span;

octet::encode_options options_of(int64_t first_index, int64_t random_stream, const char* op) {
    octet::encode_options o;
    o.first_index = non_negative(first_index, op, "first_index");
    o.random_stream = static_cast<std::uint64_t>(random_stream);
    return o;
}

at::Tensor encode_gradient(const at::Tensor& x, c10::string_view format, c10::string_view transform, int64_t block,
                           int64_t scale_block, int64_t seed, bool stochastic, int64_t first_index,
                           int64_t random_stream, const std::optional<at::Tensor>& residual) {
    constexpr const char* op = "encode_gradient";
    check_tensor(x, op, "x", {at::kFloat}, kernel_device(x, op, "x"));
    check_vector(x, op, "x");
    const octet::codec_config cfg = codec_config_of(format, transform, block, scale_block, seed, stochastic, op);
    octet::encode_options opt = options_of(first_index, random_stream, op);
    const auto n = static_cast<std::size_t>(x.numel());
    if (residual.has_value()) opt.feedback = residual_of(*residual, n, x, op);
    return guarded([&] {
        at::Tensor out = at::empty({static_cast<int64_t>(octet::encoded_size(cfg, n))}, x.options().dtype(at::kByte));
        const span<const float> xs(x.data_ptr<float>(), n);
        const span<std::uint8_t> os(out.data_ptr<std::uint8_t>(), static_cast<std::size_t>(out.numel()));
        if (x.is_cuda()) {
#ifdef OCTET_TORCH_CUDA
            const c10::cuda::CUDAGuard guard(x.device());
            device::encode_gradient(device_executor(x), cfg, xs, os, opt);
#endif
        } else {
            octet::encode_gradient(host(), cfg, xs, os, opt);
        }
        return out;
    });
}

at::Tensor encode_gradient_transformed(const at::Tensor& y, int64_t n, c10::string_view format,
                                       c10::string_view transform, int64_t block, int64_t scale_block, int64_t seed,
                                       bool stochastic, int64_t first_index, int64_t random_stream,
                                       const std::optional<at::Tensor>& residual) {
    constexpr const char* op = "encode_gradient_transformed";
    check_tensor(y, op, "y", {at::kFloat}, kernel_device(y, op, "y"));
    TORCH_CHECK_VALUE(y.dim() == 1 && y.is_contiguous(), where(op, "y"),
                      "must be a contiguous 1-D tensor of transformed coordinates (shape ", y.sizes(), ")");
    const octet::codec_config cfg = codec_config_of(format, transform, block, scale_block, seed, stochastic, op);
    octet::encode_options opt = options_of(first_index, random_stream, op);
    const std::size_t count = non_negative(n, op, "n");
    if (residual.has_value()) opt.feedback = residual_of(*residual, count, y, op);
    return guarded([&] {
        const octet::wire_layout l = octet::wire_layout_of(cfg, count);
        TORCH_CHECK_VALUE(static_cast<std::uint64_t>(y.numel()) == l.coded, where(op, "y"), "has ", y.numel(),
                          " coordinates; ", count, " elements transform to ", l.coded, " (octet.transform_length)");
        at::Tensor out = at::empty({static_cast<int64_t>(l.total_bytes)}, y.options().dtype(at::kByte));
        const span<const float> ys(y.data_ptr<float>(), static_cast<std::size_t>(y.numel()));
        const span<std::uint8_t> os(out.data_ptr<std::uint8_t>(), static_cast<std::size_t>(out.numel()));
        if (y.is_cuda()) {
#ifdef OCTET_TORCH_CUDA
            const c10::cuda::CUDAGuard guard(y.device());
            device::encode_gradient_transformed(device_executor(y), cfg, ys, count, os, opt);
#endif
        } else {
            octet::encode_gradient_transformed(host(), cfg, ys, count, os, opt);
        }
        return out;
    });
}

}  // namespace
}  // namespace octet_torch

TORCH_LIBRARY_FRAGMENT(octet, m) {
    m.def(
        "encode_gradient(Tensor x, str format=\"e4m3\", str transform=\"hadamard\", int block=1024, int "
        "scale_block=0, int seed=0, bool stochastic=False, int first_index=0, int random_stream=0, Tensor(a!)? "
        "residual=None) -> Tensor");
    m.def(
        "encode_gradient_transformed(Tensor y, int n, str format=\"e4m3\", str transform=\"hadamard\", int "
        "block=1024, int scale_block=0, int seed=0, bool stochastic=False, int first_index=0, int random_stream=0, "
        "Tensor(a!)? residual=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(octet, CPU, m) {
    m.impl("encode_gradient", &octet_torch::encode_gradient);
    m.impl("encode_gradient_transformed", &octet_torch::encode_gradient_transformed);
}

// Without CUDA kernels the same functions answer a CUDA tensor with an error that says so.
TORCH_LIBRARY_IMPL(octet, CUDA, m) {
    m.impl("encode_gradient", &octet_torch::encode_gradient);
    m.impl("encode_gradient_transformed", &octet_torch::encode_gradient_transformed);
}
