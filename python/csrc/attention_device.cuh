// attention_device.cuh: the definitions behind attention_device.hpp, for the attention_device_*.cu
// files to instantiate (nvcc only; no torch).
#pragma once

#include <cuda_runtime.h>

#include "attention_device.hpp"
#include "attention_rules.hpp"
#include "octet/attention/attention.cuh"
#include "octet/cuda/check.cuh"
#include "octet/cuda/launch.cuh"
#include "octet/cuda/quantized_tensor.cuh"
#include "octet/quant/quantize.cuh"

namespace octet_torch::device {
namespace attention_detail {

/// The telemetry vector from the device's attention_stats, by the host's function (one thread).
OCTET_KERNEL void backward_telemetry_kernel(const octet::attention_stats* st, double* out) {
    if (blockIdx.x == 0 && threadIdx.x == 0) attention::put_backward_telemetry(*st, out);
}

/// An operand quantized with R into scratch from ex's allocator (returned on the stream when the
/// tensor goes: stream-ordered), its statistics into stats[0..2) when given.
template <class R, class In>
octet::cuda::device_quantized_tensor<R> quantized(const octet::stream_executor& ex, octet::matrix_ref<const In> x,
                                                  octet::quant_stats* stats) {
    octet::cuda::device_quantized_tensor<R> t(ex, x.rows, x.cols);
    octet::device_quantize_options o;
    o.device_stats = stats;
    octet::quantize<R>(ex, x, t.ref(), {}, o);
    return t;
}

/// f(recipes<D, per_token_v>{}) for the stream kernels' head dims (the op checks the head dim first).
template <class F>
void with_recipes(int head_dim, bool per_token_v, F&& f) {
    OCTET_REQUIRE(head_dim == 64 || head_dim == 128, "octet_torch::attention", "q",
                  "has a head_dim the CUDA kernels do not serve (64 and 128)");
    auto by_v = [&](auto d) {
        if (per_token_v)
            f(attention::recipes<decltype(d)::value, true>{});
        else
            f(attention::recipes<decltype(d)::value, false>{});
    };
    if (head_dim == 64)
        by_v(std::integral_constant<int, 64>{});
    else
        by_v(std::integral_constant<int, 128>{});
}

}  // namespace attention_detail

template <class In>
void attention_forward(const octet::stream_executor& ex, const octet::attention_shape& shape, bool per_token_v,
                       octet::matrix_ref<const In> q, octet::matrix_ref<const In> k, octet::matrix_ref<const In> v,
                       octet::matrix_ref<In> o, octet::span<float> lse, const octet::attention_options& opt,
                       octet::quant_stats* stats) {
    attention_detail::with_recipes(shape.head_dim, per_token_v, [&](auto r) {
        using R = decltype(r);
        const auto qq = attention_detail::quantized<typename R::qk>(ex, q, stats);
        const auto kq = attention_detail::quantized<typename R::qk>(ex, k, stats ? stats + 2 : nullptr);
        const auto vq = attention_detail::quantized<typename R::v>(ex, v, stats ? stats + 4 : nullptr);
        octet::attention_forward(ex, shape, qq.cref(), kq.cref(), vq.cref(), o, lse, opt);
    });
}

template <class In>
void attention_backward(const octet::stream_executor& ex, const octet::attention_shape& shape, bool per_token_v,
                        octet::matrix_ref<const In> q, octet::matrix_ref<const In> k, octet::matrix_ref<const In> v,
                        octet::matrix_ref<const In> o, octet::span<const float> lse, octet::matrix_ref<const In> dout,
                        octet::matrix_ref<In> dq, octet::matrix_ref<In> dk, octet::matrix_ref<In> dv,
                        octet::span<float> workspace, const octet::attention_backward_options& opt,
                        octet::attention_stats* device_stats, double* telemetry, octet::quant_stats* dout_stats) {
    attention_detail::with_recipes(shape.head_dim, per_token_v, [&](auto r) {
        using R = decltype(r);
        const auto qq = attention_detail::quantized<typename R::qk>(ex, q, nullptr);
        const auto kq = attention_detail::quantized<typename R::qk>(ex, k, nullptr);
        const auto vq = attention_detail::quantized<typename R::v>(ex, v, nullptr);
        const auto gq = attention_detail::quantized<typename R::dout>(ex, dout, opt.telemetry ? dout_stats : nullptr);
        octet::attention_backward(ex, shape, qq.cref(), kq.cref(), vq.cref(), o, lse, gq.cref(), dq, dk, dv, workspace,
                                  opt, device_stats);
    });
    if (opt.telemetry && telemetry) {
        octet::cuda::launch("backward_telemetry_kernel", attention_detail::backward_telemetry_kernel, 1, 32, 0,
                            ex.stream, static_cast<const octet::attention_stats*>(device_stats), telemetry);
        OCTET_CUDA_CHECK_LAUNCH();
    }
}

}  // namespace octet_torch::device
