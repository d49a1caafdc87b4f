// examples/08_training/cuda_linear.cu: the FP8 linears of the training program on a CUDA stream
// (cuda_linear.hpp says what they do and what stays on the host).
#include <cuda_runtime.h>

#include <octet/cuda/check.cuh>
#include <octet/cuda/executor.cuh>
#include <octet/nn/linear.cuh>

#include <algorithm>
#include <type_traits>

#include "cuda_linear.hpp"

namespace train {
namespace {

/// Device memory a layer owns (cudaMalloc in the constructor, cudaFree in the destructor): the
/// float operands and results that cross PCIe.
class device_floats {
public:
    explicit device_floats(std::size_t n) {
        if (n) OCTET_CUDA_CHECK(cudaMalloc(&p_, n * sizeof(float)));
    }
    ~device_floats() {
        if (p_) cudaFree(p_);
    }
    device_floats(const device_floats&) = delete;
    device_floats& operator=(const device_floats&) = delete;
    float* get() const { return p_; }

private:
    float* p_ = nullptr;
};

/// An FP8 linear whose copies and step state live in an octet::cuda::linear_context on the layer's
/// stream; X, W and dY are copied in and Y, dX, dW and the statistics out on every call.
template <class LR>
class cuda_fp8_linear final : public linear_layer {
public:
    cuda_fp8_linear(memory_meter& m, std::size_t max_tokens, int in_, int out_, std::uint64_t seed)
        : stream_{new_stream()},
          ctx_(octet::on_stream(stream_.s), fp8_linear_config(max_tokens, in_, out_, seed)),
          x_(max_tokens * static_cast<std::size_t>(std::max(in_, out_))),
          w_(static_cast<std::size_t>(in_) * static_cast<std::size_t>(out_)),
          y_(max_tokens * static_cast<std::size_t>(std::max(in_, out_))),
          dw_(static_cast<std::size_t>(in_) * static_cast<std::size_t>(out_)),
          booking_(m, ctx_.memory()) {
        in = in_;
        out = out_;
    }

protected:
    void recipe_forward(octet::host_executor, const float* x, std::size_t n, const float* w, float* y, bool training,
                        const scratch&, step_telemetry* t) override {
        const std::size_t I = static_cast<std::size_t>(in), O = static_cast<std::size_t>(out);
        OCTET_REQUIRE(n <= ctx_.config().max_tokens, "train::cuda_linear", "n", "exceeds the layer's max_tokens");
        upload(x_.get(), x, n * I);
        upload(w_.get(), w, O * I);
        octet::linear_forward(ex(), ctx_, octet::matrix_ref<const float>(x_.get(), n, I),
                              octet::matrix_ref<const float>(w_.get(), O, I), {},
                              octet::matrix_ref<float>(y_.get(), n, O),
                              training ? octet::linear_pass::training : octet::linear_pass::inference);
        octet::device_linear_forward_stats stats;
        download(y, y_.get(), n * O);
        OCTET_CUDA_CHECK(
            cudaMemcpyAsync(&stats, ctx_.forward_stats(), sizeof stats, cudaMemcpyDeviceToHost, stream_.s));
        OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_.s));
        for (int c = 0; c < 2; ++c) {
            add_quant_stats(t, stats.x[c]);
            add_quant_stats(t, stats.w[c]);
            add_quant_stats(t, stats.x_hadamard[c]);
        }
    }

    void recipe_backward(octet::host_executor, const float* dy, std::size_t n, const float*, float* dx, float* dw,
                         const scratch&, step_telemetry* t, const float*) override {
        const std::size_t I = static_cast<std::size_t>(in), O = static_cast<std::size_t>(out);
        upload(x_.get(), dy, n * O);  // X's device buffer is free again: its copies are made
        octet::linear_backward(ex(), ctx_, octet::matrix_ref<const float>(x_.get(), n, O),
                               octet::matrix_ref<float>(y_.get(), n, I), octet::matrix_ref<float>(dw_.get(), O, I), {});
        octet::device_linear_backward_stats stats;
        download(dx, y_.get(), n * I);
        download(dw, dw_.get(), O * I);
        OCTET_CUDA_CHECK(
            cudaMemcpyAsync(&stats, ctx_.backward_stats(), sizeof stats, cudaMemcpyDeviceToHost, stream_.s));
        OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_.s));
        for (int c = 0; c < 2; ++c) {
            add_quant_stats(t, stats.dy[c]);
            add_quant_stats(t, stats.dy_hadamard[c]);
        }
    }

private:
    static cudaStream_t new_stream() {
        cudaStream_t s = nullptr;
        OCTET_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        return s;
    }
    octet::stream_executor ex() const { return octet::on_stream(stream_.s); }
    void upload(float* d, const float* h, std::size_t n) {
        OCTET_CUDA_CHECK(cudaMemcpyAsync(d, h, n * sizeof(float), cudaMemcpyHostToDevice, stream_.s));
    }
    void download(float* h, const float* d, std::size_t n) {
        OCTET_CUDA_CHECK(cudaMemcpyAsync(h, d, n * sizeof(float), cudaMemcpyDeviceToHost, stream_.s));
    }

    /// The stream the context lives on, destroyed after the context has returned its memory on it.
    struct owned_stream {
        cudaStream_t s;
        ~owned_stream() { cudaStreamDestroy(s); }
    };
    owned_stream stream_;
    octet::cuda::linear_context<LR> ctx_;
    device_floats x_, w_, y_, dw_;  // X or dY; W; Y or dX; dW
    linear_context_booking booking_;
};

}  // namespace

std::string cuda_linear_device(std::string* why) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        if (why)
            *why = std::string("no usable CUDA device (") + (e != cudaSuccess ? cudaGetErrorString(e) : "none") + ")";
        return "";
    }
    int dev = 0;
    cudaDeviceProp p{};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        if (why) *why = "the CUDA device cannot be queried";
        return "";
    }
    return p.name;
}

std::string cuda_linear_refusal(linear_mode mode) {
    return mode == linear_mode::nvfp4 ? "NVFP4 linears cannot run on CUDA here: Hopper has no NVFP4 tensor-core GEMM "
                                        "(octet serves it through cuBLASLt only); leave the recipe out or use "
                                        "--linears host"
                                      : "";
}

std::unique_ptr<linear_layer> make_cuda_linear_layer(memory_meter& m, linear_mode mode, std::size_t max_tokens, int in,
                                                     int out, std::uint64_t seed) {
    const std::string refusal = cuda_linear_refusal(mode);
    OCTET_REQUIRE(refusal.empty(), "train::make_cuda_linear_layer", "mode", refusal);
    std::unique_ptr<linear_layer> layer;
    const bool fp8 = with_fp8_linear_recipe(mode, [&](auto tag) {
        using LR = typename decltype(tag)::type;
        if constexpr (!std::is_same_v<LR, octet::linear_recipes::nvfp4>)  // refused above
            layer = std::make_unique<cuda_fp8_linear<LR>>(m, max_tokens, in, out, seed);
    });
    return fp8 ? std::move(layer) : make_linear_layer(m, mode, max_tokens, in, out, seed);  // float32, bf16: host
}

}  // namespace train
