// examples/08_training/optimizer.hpp: the training program's optimizer: octet::adamw_optimizer with
// the recipe's moment codec and master weights, behind one interface so that the trainer is
// written once; and the optimizer's part of the memory ledger's configuration.
#pragma once

#include "train.hpp"

#include <octet/octet.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>

namespace train {

class optimizer {
public:
    virtual ~optimizer() = default;
    /// One step on gradients g (float or bf16), each multiplied by grad_scale in (0, 1] as the
    /// fused step reads it (adamw_hyper::grad_scale: the clipping coefficient and the mean's 1 / P).
    virtual octet::adamw_report step(octet::host_executor ex, octet::span<const float> g, float lr,
                                     float grad_scale) = 0;
    virtual octet::adamw_report step(octet::host_executor ex, octet::span<const octet::bf16> g, float lr,
                                     float grad_scale) = 0;
    virtual void weights(octet::span<float> out) const = 0;  // master weights as float (a copy)
    virtual weights_ref view() const = 0;                    // the master weights compute reads in place
    virtual void save(const std::string& path) = 0;
    virtual void load(const std::string& path) = 0;
    virtual double weight_bytes() const = 0;  // master weights (and compensation)
    virtual double state_bytes() const = 0;   // moments and their metadata
};

template <class MCodec, class Master>
class adamw_with : public optimizer {
public:
    adamw_with(octet::span<const float> init, const octet::adamw_hyper& h) : opt_(init.size(), h) {
        opt_.state.set_params(init);
    }
    octet::adamw_report step(octet::host_executor ex, octet::span<const float> g, float lr, float grad_scale) override {
        opt_.hyper.grad_scale = grad_scale;
        return opt_.step(ex, g, lr);
    }
    octet::adamw_report step(octet::host_executor ex, octet::span<const octet::bf16> g, float lr,
                             float grad_scale) override {
        opt_.hyper.grad_scale = grad_scale;
        return opt_.step(ex, g, lr);
    }
    void weights(octet::span<float> out) const override {
        const auto& s = opt_.state;
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = Master::load(s.params[i], comp(i));
    }
    weights_ref view() const override {
        const auto& p = opt_.state.params;
        static_assert(std::is_same_v<typename Master::comp_type, octet::no_compensation>,
                      "compute reads the master weights in place: a master with compensation needs a copy");
        return octet::span<const typename Master::weight_type>(p.data(), p.size());
    }
    void save(const std::string& path) override { opt_.save(path); }
    void load(const std::string& path) override { opt_.load(path); }
    double weight_bytes() const override {
        const auto& s = opt_.state;
        return static_cast<double>(s.params.size() * sizeof(s.params[0]) +
                                   s.compensation.size() * sizeof(typename Master::comp_type));
    }
    double state_bytes() const override {
        const auto& s = opt_.state;
        return static_cast<double>(s.m_codes.size() * sizeof(s.m_codes[0]) + s.m_meta.size() * sizeof(s.m_meta[0]) +
                                   s.v_codes.size() * sizeof(s.v_codes[0]) + s.v_meta.size() * sizeof(s.v_meta[0]));
    }

private:
    typename Master::comp_type comp(std::size_t i) const {
        if constexpr (std::is_same_v<typename Master::comp_type, octet::no_compensation>) {
            (void)i;
            return {};
        } else {
            return opt_.state.compensation[i];
        }
    }
    octet::adamw_optimizer<MCodec, MCodec, Master> opt_;
};

inline std::unique_ptr<optimizer> make_optimizer(const recipe_config& r, octet::span<const float> init,
                                                 const octet::adamw_hyper& h) {
    namespace sc = octet::state_codec;
    namespace ms = octet::master;
    const bool m8 = r.moments == moment_mode::dynamic8, bf = r.master == master_mode::bf16_stochastic;
    if (m8 && bf) return std::make_unique<adamw_with<sc::dynamic8, ms::bf16_stochastic>>(init, h);
    if (m8) return std::make_unique<adamw_with<sc::dynamic8, ms::fp32>>(init, h);
    if (bf) return std::make_unique<adamw_with<sc::fp32, ms::bf16_stochastic>>(init, h);
    return std::make_unique<adamw_with<sc::fp32, ms::fp32>>(init, h);
}

inline octet::optimizer_memory_config optimizer_ledger_config(const recipe_config& r, double parameters) {
    octet::optimizer_memory_config c;
    c.parameters = parameters;
    c.first_moment = c.second_moment =
        r.moments == moment_mode::dynamic8 ? octet::state_codec_id::dynamic8 : octet::state_codec_id::fp32;
    c.master = r.master == master_mode::bf16_stochastic ? octet::master_weights_id::bf16_stochastic
                                                        : octet::master_weights_id::fp32;
    return c;
}

}  // namespace train
