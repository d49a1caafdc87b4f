// octet::dequantize(codes, scales, tensor_scale, recipe, cols, dtype) -> rows x cols in dtype
// (octet/quant/quantize.hpp): decode(code) * scale, one rounding to dtype.
#include "octet/quant/quantize.hpp"
#include "octet_torch.hpp"
#ifdef OCTET_TORCH_CUDA
#include "device_ops.hpp"
#include "octet_torch_cuda.hpp"
#endif

namespace octet_torch {
namespace {

using octet::span;

at::Tensor dequantize(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& tensor_scale,
                      c10::string_view recipe, int64_t cols, at::ScalarType dtype) {
    TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, where("dequantize", "dtype"),
                     "is ", dtype, "; pass torch.float32, torch.bfloat16 or torch.float16");
    const c10::DeviceType device = kernel_device(codes, "dequantize", "q_codes");
    return with_recipe(recipe, "dequantize", [&](auto rt) {
        using R = typename decltype(rt)::type;
        const auto q = as_quantized<R>(codes, scales, tensor_scale, cols, "dequantize", "q", device);
        at::Tensor out = at::empty({static_cast<int64_t>(q.rows()), cols}, codes.options().dtype(dtype));
        auto run = [&](auto out_tag) {
            using Out = typename decltype(out_tag)::type;
            const octet::matrix_ref<Out> o(static_cast<Out*>(out.data_ptr()), q.rows(), static_cast<std::size_t>(cols));
            if (device == c10::DeviceType::CUDA) {
#ifdef OCTET_TORCH_CUDA
                const c10::cuda::CUDAGuard guard(codes.device());
                guarded([&] { device::dequantize<R, Out>(device_executor(codes), q, o); });
#endif
            } else {
                guarded([&] { octet::dequantize(host(), q, o); });
            }
        };
        if (dtype == at::kBFloat16)
            run(type_tag<octet::bf16>{});
        else if (dtype == at::kHalf)
            run(type_tag<octet::fp16>{});
        else
            run(type_tag<float>{});
        return out;
    });
}

}  // namespace
}  // namespace octet_torch

TORCH_LIBRARY_FRAGMENT(octet, m) {
    m.def(
        "dequantize(Tensor codes, Tensor scales, Tensor tensor_scale, str recipe, int cols, ScalarType "
        "dtype=float) -> Tensor");
}

TORCH_LIBRARY_IMPL(octet, CPU, m) {
    m.impl("dequantize", &octet_torch::dequantize);
}

// Without CUDA kernels the same function answers a CUDA tensor with an error that says so.
TORCH_LIBRARY_IMPL(octet, CUDA, m) {
    m.impl("dequantize", &octet_torch::dequantize);
}
