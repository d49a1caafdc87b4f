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

/// Device memory a layer owns (cudaMalloc in the constructor, cudaFree in the destructor).
class device_bytes {
public:
    device_bytes() = default;
    explicit device_bytes(std::size_t n) : n_(n) {
        if (n_) OCTET_CUDA_CHECK(cudaMalloc(&p_, n_));
    }
    ~device_bytes() {
        if (p_) cudaFree(p_);
    }
    device_bytes(const device_bytes&) = delete;
    device_bytes& operator=(const device_bytes&) = delete;
    template <class T>
    T* as() const {
        return static_cast<T*>(p_);
    }
    std::size_t size() const { return n_; }

private:
    void* p_ = nullptr;
    std::size_t n_ = 0;
};

/// One quantized copy's storage at its largest shape, handed out at the shape of each call (as
/// nn/linear.hpp's quant_buffer does on the host, with the same layouts and so the same bytes).
template <class R>
class device_copy {
public:
    device_copy(std::size_t max_rows, std::size_t max_cols)
        : max_(octet::quant_layout_of<R>::make(max_rows, max_cols)),
          data_(max_.data_bytes),
          scales_(max_.scale_bytes),
          tensor_scale_(R::two_level ? sizeof(float) : 0) {}
    octet::quantized_ref<R> ref(std::size_t rows, std::size_t cols) {
        layout_ = octet::quant_layout_of<R>::make(rows, cols);
        OCTET_REQUIRE(layout_.data_bytes <= max_.data_bytes && layout_.scale_bytes <= max_.scale_bytes,
                      "train::cuda_linear", "shape", "exceeds the copy's storage (internal)");
        return octet::quantized_ref<R>(data_.as<std::uint8_t>(), scales_.as<std::uint8_t>(), layout_,
                                       tensor_scale_.as<float>());
    }
    octet::quantized_cref<R> cref() const {
        return octet::quantized_cref<R>(data_.as<std::uint8_t>(), scales_.as<std::uint8_t>(), layout_,
                                        tensor_scale_.as<float>());
    }
    std::size_t bytes() const { return max_.data_bytes + max_.scale_bytes + (R::two_level ? sizeof(float) : 0); }

private:
    octet::quant_layout max_, layout_{};
    device_bytes data_, scales_, tensor_scale_;
};

/// The stream's step state in device memory: the three delayed-scaling amaxes and the statistics.
struct device_step {
    float scale_amax[3];
    octet::device_linear_forward_stats forward;
    octet::device_linear_backward_stats backward;
};

template <class LR>
class cuda_fp8_linear final : public linear_layer {
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    using GR = typename LR::g_quantize_recipe;

public:
    cuda_fp8_linear(memory_meter& m, std::size_t max_tokens, int in_, int out_, std::uint64_t seed)
        : I_(static_cast<std::size_t>(in_)),
          O_(static_cast<std::size_t>(out_)),
          max_tokens_(max_tokens),
          seed_(seed),
          x_row_(max_tokens, I_),
          w_row_(O_, I_),
          x_col_(I_, octet::linear_wgrad_tokens<LR>(max_tokens)),
          w_col_(I_, O_),
          dy_row_(max_tokens, O_),
          dy_col_(O_, octet::linear_wgrad_tokens<LR>(max_tokens)),
          rotated_(LR::hadamard_wgrad ? octet::linear_wgrad_tokens<LR>(max_tokens) * std::max(I_, O_) * sizeof(float)
                                      : 0),
          x_(max_tokens * std::max(I_, O_) * sizeof(float)),
          w_(O_ * I_ * sizeof(float)),
          y_(max_tokens * std::max(I_, O_) * sizeof(float)),
          dw_(O_ * I_ * sizeof(float)),
          state_(sizeof(device_step)),
          delayed_x_(octet::linear_config{}.delayed),
          delayed_w_(octet::linear_config{}.delayed),
          delayed_g_(octet::linear_config{}.delayed),
          saved_(m, octet::memory_category::activations, static_cast<double>(x_col_.bytes() + w_col_.bytes())),
          work_(m, octet::memory_category::temporaries, static_cast<double>(workspace_bytes())) {
        in = in_;
        out = out_;
        OCTET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    }
    ~cuda_fp8_linear() override { cudaStreamDestroy(stream_); }

    void forward(octet::host_executor ex, const float* x, std::size_t n, const float* w, float* y, bool float_path,
                 bool training, const scratch& s, step_telemetry* t) override {
        float_path_ = float_path;
        if (float_path) {
            saved_x_ = x;
            float_forward(ex, x, n, w, y, s);
            return;
        }
        OCTET_REQUIRE(n <= max_tokens_, "train::cuda_linear", "n", "exceeds the layer's max_tokens");
        if (training) has_forward_ = false;
        upload(x_.as<float>(), x, n * I_);
        upload(w_.as<float>(), w, O_ * I_);
        octet::linear_forward_buffers<LR> buf;
        buf.x = x_row_.ref(n, I_);
        buf.w = w_row_.ref(O_, I_);
        if (training) {
            buf.x_t = x_col_.ref(I_, octet::linear_wgrad_tokens<LR>(n));
            buf.w_t = w_col_.ref(I_, O_);
            buf.rotated = octet::span<float>(rotated_.as<float>(), rotated_.size() / sizeof(float));
        }
        device_step* st = state_.as<device_step>();
        octet::linear_forward<LR>(octet::on_stream(stream_), octet::matrix_ref<const float>(x_.as<float>(), n, I_),
                                  octet::matrix_ref<const float>(w_.as<float>(), O_, I_), {},
                                  octet::matrix_ref<float>(y_.as<float>(), n, O_), buf, options(), &st->forward);
        octet::device_linear_forward_stats stats;
        download(y, y_.as<float>(), n * O_);
        OCTET_CUDA_CHECK(cudaMemcpyAsync(&stats, &st->forward, sizeof stats, cudaMemcpyDeviceToHost, stream_));
        OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
        for (int c = 0; c < 2; ++c) {
            add_quant_stats(t, stats.x[c]);
            add_quant_stats(t, stats.w[c]);
            add_quant_stats(t, stats.x_hadamard[c]);
        }
        if (training) {  // as linear_context::forward
            if constexpr (LR::scaling == octet::linear_scaling::delayed) {
                delayed_x_.record(stats.x_amax);
                delayed_x_.update();
                delayed_w_.record(stats.w_amax);
                delayed_w_.update();
            }
            tokens_ = n;
            has_forward_ = true;
        }
    }

    void backward(octet::host_executor ex, const float* dy, std::size_t n, const float* w, float* dx, float* dw,
                  const scratch& s, step_telemetry* t) override {
        if (float_path_) {
            float_backward(ex, saved_x_, dy, n, w, dx, dw, s);
            return;
        }
        OCTET_REQUIRE(has_forward_ && n == tokens_, "train::cuda_linear", "dy",
                      "follows no training forward of the same tokens");
        upload(x_.as<float>(), dy, n * O_);  // X's device buffer is free again: its copies are made
        octet::linear_backward_buffers<LR> buf;
        buf.x_t = x_col_.cref();
        buf.w_t = w_col_.cref();
        buf.dy = dy_row_.ref(n, O_);
        buf.dy_t = dy_col_.ref(O_, octet::linear_wgrad_tokens<LR>(n));
        buf.rotated = octet::span<float>(rotated_.as<float>(), rotated_.size() / sizeof(float));
        device_step* st = state_.as<device_step>();
        octet::linear_backward<LR>(octet::on_stream(stream_), octet::matrix_ref<const float>(x_.as<float>(), n, O_),
                                   octet::matrix_ref<float>(y_.as<float>(), n, I_),
                                   octet::matrix_ref<float>(dw_.as<float>(), O_, I_), {}, buf, options(),
                                   &st->backward);
        octet::device_linear_backward_stats stats;
        download(dx, y_.as<float>(), n * I_);
        download(dw, dw_.as<float>(), O_ * I_);
        OCTET_CUDA_CHECK(cudaMemcpyAsync(&stats, &st->backward, sizeof stats, cudaMemcpyDeviceToHost, stream_));
        OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
        for (int c = 0; c < 2; ++c) {
            add_quant_stats(t, stats.dy[c]);
            add_quant_stats(t, stats.dy_hadamard[c]);
        }
        if constexpr (LR::scaling == octet::linear_scaling::delayed) {  // dX and dW are both wanted here
            delayed_g_.record(stats.dy_amax);
            delayed_g_.update();
        }
        ++step_;
        has_forward_ = false;
    }

private:
    std::size_t workspace_bytes() const {
        std::size_t b = x_row_.bytes() + w_row_.bytes() + dy_row_.bytes() + dy_col_.bytes() + rotated_.size();
        if (LR::scaling == octet::linear_scaling::delayed)
            b += 3 * static_cast<std::size_t>(octet::linear_config{}.delayed.history_length) * sizeof(float);
        return b;
    }
    void upload(float* d, const float* h, std::size_t n) {
        OCTET_CUDA_CHECK(cudaMemcpyAsync(d, h, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    }
    void download(float* h, const float* d, std::size_t n) {
        OCTET_CUDA_CHECK(cudaMemcpyAsync(h, d, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
    /// The step's options, as linear_context::options: the delayed amaxes (null: measure), the
    /// seed and the backward count. The amaxes go to device memory on the stream first.
    octet::device_linear_step_options options() {
        octet::device_linear_step_options o;
        device_step* st = state_.as<device_step>();
        if constexpr (LR::scaling == octet::linear_scaling::delayed) {
            const float host[3] = {delayed_x_.amax_for_scale(), delayed_w_.amax_for_scale(),
                                   delayed_g_.amax_for_scale()};
            OCTET_CUDA_CHECK(cudaMemcpyAsync(st->scale_amax, host, sizeof host, cudaMemcpyHostToDevice, stream_));
            OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `host` goes out of scope
            o.x_scale_amax = host[0] < 0 ? nullptr : &st->scale_amax[0];
            o.w_scale_amax = host[1] < 0 ? nullptr : &st->scale_amax[1];
            o.g_scale_amax = host[2] < 0 ? nullptr : &st->scale_amax[2];
        }
        o.seed = seed_;
        o.step = step_;
        o.collect_stats = true;
        return o;
    }

    std::size_t I_, O_, max_tokens_;
    std::uint64_t seed_, step_ = 0;
    cudaStream_t stream_ = nullptr;
    device_copy<XR> x_row_;
    device_copy<WR> w_row_;
    device_copy<XR> x_col_;
    device_copy<WR> w_col_;
    device_copy<GR> dy_row_;
    device_copy<GR> dy_col_;
    device_bytes rotated_;
    device_bytes x_, w_, y_, dw_;  // X or dY; W; Y or dX; dW (floats)
    device_bytes state_;
    octet::delayed_scaling delayed_x_, delayed_w_, delayed_g_;
    meter_booking saved_, work_;
    std::size_t tokens_ = 0;
    bool has_forward_ = false, float_path_ = false;
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

std::unique_ptr<linear_layer> make_cuda_linear_layer(memory_meter& m, linear_mode mode, std::size_t max_tokens, int in,
                                                     int out, std::uint64_t seed) {
    std::unique_ptr<linear_layer> layer;
    const bool fp8 = with_fp8_linear_recipe(mode, [&](auto tag) {
        using LR = typename decltype(tag)::type;
        if constexpr (std::is_same_v<LR, octet::linear_recipes::nvfp4>) {
            OCTET_REQUIRE(false, "example_08_training", "--linears cuda",
                          "cannot run the nvfp4 recipe: Hopper has no NVFP4 tensor-core GEMM (octet serves it "
                          "through cuBLASLt only); leave nvfp4 out or run it with --linears host");
        } else {
            layer = std::make_unique<cuda_fp8_linear<LR>>(m, max_tokens, in, out, seed);
        }
    });
    return fp8 ? std::move(layer) : make_linear_layer(m, mode, max_tokens, in, out, seed);  // float32, bf16: host
}

}  // namespace train
