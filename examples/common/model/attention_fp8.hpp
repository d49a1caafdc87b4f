// examples/common/model/attention_fp8.hpp: the transformer's FP8 attention through octet
// (octet/attention/attention.hpp), for ../model.hpp.
#pragma once

#include "attention_f32.hpp"
#include "base.hpp"
#include "linear_layers.hpp"

namespace common {

// =================================================================================================
// FP8 attention through octet (octet/attention/attention.hpp)
// =================================================================================================

/// A quantized copy of up to max_rows x cols in metered storage.
template <class R>
class metered_quant {
public:
    metered_quant(memory_meter& m, octet::memory_category c, std::size_t max_rows, std::size_t cols)
        : cols_(cols),
          data_(make_metered<std::uint8_t>(m, c, octet::quant_layout_of<R>::make(max_rows, cols).data_bytes)),
          scales_(make_metered<std::uint8_t>(m, c, octet::quant_layout_of<R>::make(max_rows, cols).scale_bytes)) {}
    /// The copy of `rows` rows made next (the layout's bytes grow with rows, so it fits).
    octet::quantized_ref<R> ref(std::size_t rows) {
        layout_ = octet::quant_layout_of<R>::make(rows, cols_);
        return octet::quantized_ref<R>(data_.data(), scales_.data(), layout_, &tensor_scale_);
    }
    /// The copy made last.
    octet::quantized_ref<R> last() {
        return octet::quantized_ref<R>(data_.data(), scales_.data(), layout_, &tensor_scale_);
    }

private:
    std::size_t cols_;
    metered_vector<std::uint8_t> data_, scales_;
    octet::quant_layout layout_{};
    float tensor_scale_ = 1.0f;
};

/// The model's FP8 attention: per layer the E4M3 copies of Q, K, V the backward reads.
class fp8_attention {
public:
    virtual ~fp8_attention() = default;
    virtual void forward(octet::host_executor ex, std::size_t layer, const attention_dims& a, const float* qkv,
                         float* O, float* lse, const std::int32_t* cu, step_telemetry* t) = 0;
    /// dqkv laid out like qkv; returns attention_stats::residual_rel() of the backward.
    virtual double backward(octet::host_executor ex, std::size_t layer, const attention_dims& a, const float* O,
                            const float* lse, const float* dO, float* dqkv, const std::int32_t* cu,
                            octet::delta_mode delta, step_telemetry* t) = 0;
};

/// Q, K and dO E4M3 with one scale per token and head (block<1, HD>); V E4M3 per head
/// (block<full, HD>) or per token and head (VR = block<1, HD>). head_dim is a compile-time
/// constant because the scale blocks must hold whole heads.
template <int HD, class VR>
class fp8_attention_impl final : public fp8_attention {
public:
    using QR = octet::recipe<octet::e4m3, octet::block<1, HD>, octet::scale::amax_ratio<0>>;

    fp8_attention_impl(memory_meter& m, std::size_t layers, std::size_t max_tokens, std::size_t heads_q,
                       std::size_t heads_kv)
        : dout_(m, octet::memory_category::temporaries, max_tokens, heads_q * HD) {
        for (std::size_t l = 0; l < layers; ++l)
            saved_.push_back(std::make_unique<saved>(m, max_tokens, heads_q * HD, heads_kv * HD));
    }

    void forward(octet::host_executor ex, std::size_t layer, const attention_dims& a, const float* qkv, float* O,
                 float* lse, const std::int32_t* cu, step_telemetry* t) override {
        saved& S = *saved_[layer];
        const std::size_t N = a.tokens(), W = a.qkv_ld(), A = a.o_ld(), KW = a.heads_kv * HD;
        octet::quantize_options qo;
        qo.collect_stats = true;
        add_quant_stats(t, octet::quantize<QR>(ex, octet::matrix_ref<const float>(qkv, N, A, W), S.q.ref(N), {}, qo));
        add_quant_stats(t,
                        octet::quantize<QR>(ex, octet::matrix_ref<const float>(qkv + A, N, KW, W), S.k.ref(N), {}, qo));
        add_quant_stats(
            t, octet::quantize<VR>(ex, octet::matrix_ref<const float>(qkv + A + KW, N, KW, W), S.v.ref(N), {}, qo));
        octet::attention_options ao;
        ao.mask = octet::attention_mask::causal;
        octet::attention_forward(ex, shape(a, cu), S.q.last(), S.k.last(), S.v.last(),
                                 octet::matrix_ref<float>(O, N, A), octet::span<float>(lse, a.heads_q * N), ao);
    }

    double backward(octet::host_executor ex, std::size_t layer, const attention_dims& a, const float* O,
                    const float* lse, const float* dO, float* dqkv, const std::int32_t* cu, octet::delta_mode delta,
                    step_telemetry* t) override {
        saved& S = *saved_[layer];
        const std::size_t N = a.tokens(), W = a.qkv_ld(), A = a.o_ld(), KW = a.heads_kv * HD;
        octet::quantize_options qo;
        qo.collect_stats = true;
        add_quant_stats(t, octet::quantize<QR>(ex, octet::matrix_ref<const float>(dO, N, A), dout_.ref(N), {}, qo));
        octet::attention_backward_options bo;
        bo.mask = octet::attention_mask::causal;
        bo.delta = delta;
        bo.telemetry = true;
        const octet::attention_stats st = octet::attention_backward(
            ex, shape(a, cu), S.q.last(), S.k.last(), S.v.last(), octet::matrix_ref<const float>(O, N, A),
            octet::span<const float>(lse, a.heads_q * N), dout_.last(), octet::matrix_ref<float>(dqkv, N, A, W),
            octet::matrix_ref<float>(dqkv + A, N, KW, W), octet::matrix_ref<float>(dqkv + A + KW, N, KW, W), bo);
        // The same row sums on the quantized dS that feeds dQ (what the product actually used).
        if (t && layer < t->attention_residual_q.size()) t->attention_residual_q[layer] = st.residual_dq_rel();
        return st.residual_rel();
    }

private:
    struct saved {
        saved(memory_meter& m, std::size_t tokens, std::size_t qw, std::size_t kw)
            : q(m, octet::memory_category::activations, tokens, qw),
              k(m, octet::memory_category::activations, tokens, kw),
              v(m, octet::memory_category::activations, tokens, kw) {}
        metered_quant<QR> q, k;
        metered_quant<VR> v;
    };
    static octet::attention_shape shape(const attention_dims& a, const std::int32_t* cu) {
        octet::attention_shape s;
        s.cu_seqlens_q = octet::span<const std::int32_t>(cu, a.batch + 1);
        s.heads_q = static_cast<int>(a.heads_q);
        s.heads_kv = static_cast<int>(a.heads_kv);
        s.head_dim = HD;
        return s;
    }
    std::vector<std::unique_ptr<saved>> saved_;
    metered_quant<QR> dout_;
};

template <int HD>
std::unique_ptr<fp8_attention> make_fp8_attention(memory_meter& m, v_scale_mode v, std::size_t layers,
                                                  std::size_t max_tokens, std::size_t heads_q, std::size_t heads_kv) {
    using per_head = octet::recipe<octet::e4m3, octet::block<octet::full, HD>, octet::scale::amax_ratio<0>>;
    using per_token = octet::recipe<octet::e4m3, octet::block<1, HD>, octet::scale::amax_ratio<0>>;
    if (v == v_scale_mode::per_head)
        return std::make_unique<fp8_attention_impl<HD, per_head>>(m, layers, max_tokens, heads_q, heads_kv);
    return std::make_unique<fp8_attention_impl<HD, per_token>>(m, layers, max_tokens, heads_q, heads_kv);
}

}  // namespace common
