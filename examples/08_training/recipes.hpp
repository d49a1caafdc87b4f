// examples/08_training/recipes.hpp: the recipes the training program compares, by name: float32,
// each mechanism alone in low precision (the linears, attention, the optimizer state, the gradient
// codec, the saved activations), all of them together (octet), and runs without recovery.
#pragma once

#include "train.hpp"

#include <octet/octet.hpp>

#include <utility>
#include <vector>

namespace train {

inline std::vector<recipe_config> all_recipes() {
    std::vector<recipe_config> r;
    auto add = [&](recipe_config c) { r.push_back(std::move(c)); };
    recipe_config fp32;
    fp32.name = "fp32";
    add(fp32);
    // Linear layers alone, one recipe each (attention, optimizer and gradients stay float32).
    const std::pair<const char*, linear_mode> linears[] = {{"bf16", linear_mode::bf16},
                                                           {"fp8_delayed", linear_mode::tensorwise_delayed},
                                                           {"fp8_tensorwise", linear_mode::tensorwise},
                                                           {"fp8_blockwise", linear_mode::blockwise},
                                                           {"mxfp8", linear_mode::mxfp8},
                                                           {"nvfp4", linear_mode::nvfp4}};
    for (const auto& [name, mode] : linears) {
        recipe_config c = fp32;
        c.name = name;
        c.linear = mode;
        add(c);
    }
    // What users compare against: bf16 mixed precision with float32 masters and optimizer state,
    // bf16 gradients (as Megatron and FSDP's bf16 mixed precision keep them), the linears on bf16
    // operands keeping their inputs in bf16, every other saved activation in bf16 (the norms' and
    // GELU's inputs, attention's Q, K, V and output), attention's arithmetic in float32 on bf16
    // inputs (as FlashAttention's bf16 kernels accumulate in float). It keeps no bf16 copy of the
    // weights between operations (torch.autocast caches one per forward, 2 bytes per parameter
    // more): the peer is given the smaller footprint.
    recipe_config mixed = fp32;
    mixed.name = "bf16_mixed";
    mixed.linear = linear_mode::bf16;
    mixed.saved_activations = saved_storage::bf16;
    mixed.gradients = gradient_storage::bf16;
    add(mixed);
    // Attention alone: the delta modes under a per-token V scale (the stale-delta failure case),
    // and matched under the per-head V scale octet recommends.
    recipe_config attn = fp32;
    attn.attention = attention_mode::fp8;
    attn.name = "attn_fp8";
    add(attn);
    attn.v_scale = v_scale_mode::per_token;
    attn.name = "attn_matched_per_token_v";
    add(attn);
    attn.delta = octet::delta_mode::from_output;
    attn.name = "attn_from_output_per_token_v";
    add(attn);
    // Optimizer state alone, gradient codec alone.
    recipe_config opt8 = fp32;
    opt8.name = "optim_8bit";
    opt8.moments = moment_mode::dynamic8;
    opt8.master = master_mode::bf16_stochastic;
    add(opt8);
    recipe_config grads = fp32;
    grads.name = "grad_bf16";
    grads.gradients = gradient_storage::bf16;
    add(grads);
    recipe_config codec = fp32;
    codec.name = "grad_codec";
    codec.gradient_codec = true;
    add(codec);
    // The non-linear layers' saved inputs in FP8, alone.
    recipe_config act = fp32;
    act.name = "act_fp8";
    act.saved_activations = saved_storage::fp8;
    add(act);
    // All together, and the same without recovery.
    recipe_config all = fp32;
    all.name = "octet";
    all.linear = linear_mode::blockwise;
    all.attention = attention_mode::fp8;
    all.moments = moment_mode::dynamic8;
    all.master = master_mode::bf16_stochastic;
    all.gradient_codec = true;
    all.residuals = octet::residual_storage::e4m3;
    all.saved_activations = saved_storage::fp8;
    all.recompute_linear_inputs = true;
    all.gradients = gradient_storage::bf16;
    add(all);
    all.name = "octet_no_recovery";
    all.recovery = false;
    add(all);
    recipe_config fp32_nr = fp32;
    fp32_nr.name = "fp32_no_recovery";
    fp32_nr.recovery = false;
    add(fp32_nr);
    return r;
}

inline bool is_low_precision(const recipe_config& r) {
    return r.linear != linear_mode::float32 || r.attention != attention_mode::float32 ||
           r.moments != moment_mode::float32 || r.master != master_mode::float32 || r.gradient_codec ||
           r.saved_activations != saved_storage::float32 || r.gradients != gradient_storage::float32;
}

}  // namespace train
