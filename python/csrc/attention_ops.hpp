// attention_ops.hpp: what the attention ops share (attention_ops.cpp and the shards
// attention_forward_<dtype>.cpp, attention_backward_<dtype>.cpp generated from registry.hpp's
// OCTET_TORCH_ATTENTION_INPUTS): the tensor layout, the argument checks, the recipes the operands
// are quantized with, and the head-dim / dtype / V-scaling dispatch.
//
// Layout: q, k, v (and o, dout, dq, dk, dv) are [tokens, heads, head_dim] (one sequence, or several
// packed along tokens with cu_seqlens_q / cu_seqlens_k: FlashAttention's varlen layout) or
// [batch, tokens, heads, head_dim] (batch sequences of equal length). Either is octet's
// [total_tokens, heads * head_dim] row-major matrix without a copy: the channel stride must be 1,
// the head stride head_dim, the token stride at least heads * head_dim (a slice of a fused QKV
// projection qualifies) and the batch stride tokens * token stride. Anything else is rejected.
// lse is [heads_q, total_q] float32 (octet's [heads][tokens]).
//
// Quantization happens inside the ops with octet::quantize and the recipes of
// octet/attention/bf16_inputs.hpp: E4M3 with one float scale per token and head for Q, K and dO
// (block<1, D>), and for V one per head over all tokens (block<full, D>, "per_head") or, for
// comparison, per token and head ("per_token"). Quantization is deterministic, so the backward
// re-quantizes Q, K, V and sees exactly the operands the forward saw.
#pragma once

#include <ATen/ops/zeros.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attention_rules.hpp"
#include "octet/attention/bf16_inputs.hpp"
#include "octet_torch.hpp"

namespace octet_torch::attention {

/// The head dims the ops serve (each is a set of compile-time recipes; see the note in
/// with_head_dim).
inline constexpr const char* head_dims = "32, 64, 128 and 256";

/// Sizes and offsets of one call, checked; shape's spans point into the offset vectors.
struct call {
    std::vector<std::int32_t> cu_q, cu_k;
    octet::attention_shape shape;
    std::int64_t batch = 1, total_q = 0, total_k = 0;
    int head_dim = 0;
};

/// [tokens, heads, dim] or [batch, tokens, heads, dim] as a [batch * tokens, heads * dim] row-major
/// matrix (see the top of this file), never copied.
template <class Elem>
octet::matrix_ref<Elem> token_matrix(const at::Tensor& t, const char* op, const char* arg) {
    TORCH_CHECK_VALUE(t.dim() == 3 || t.dim() == 4, where(op, arg), "has ", t.dim(),
                      " dimensions; pass [tokens, heads, head_dim] or [batch, tokens, heads, head_dim]");
    const int64_t n = t.dim();
    const int64_t B = n == 4 ? t.size(0) : 1, T = t.size(n - 3), H = t.size(n - 2), D = t.size(n - 1);
    const int64_t cols = H * D, rows = B * T;
    const bool ok_channel = D <= 1 || t.stride(n - 1) == 1;
    const bool ok_head = H <= 1 || t.stride(n - 2) == D;
    int64_t ld = cols;
    if (T > 1)
        ld = t.stride(n - 3);
    else if (B > 1 && T == 1)
        ld = t.stride(0);
    const bool ok_token = rows <= 1 || ld >= cols;
    const bool ok_batch = B <= 1 || T <= 1 || t.stride(0) == T * ld;
    TORCH_CHECK_VALUE(ok_channel && ok_head && ok_token && ok_batch, where(op, arg), "has strides ", t.strides(),
                      " for shape ", t.sizes(),
                      "; the kernels read it as [tokens, heads * head_dim] rows: channels contiguous, heads "
                      "head_dim apart, tokens at least heads * head_dim apart (and batches tokens * that apart). "
                      "Pass .contiguous()");
    return octet::matrix_ref<Elem>(reinterpret_cast<Elem*>(t.data_ptr()), static_cast<std::size_t>(rows),
                                   static_cast<std::size_t>(cols),
                                   static_cast<std::size_t>(std::max<int64_t>(ld, cols)));
}

inline std::vector<std::int32_t> offsets(const at::Tensor& cu, const char* op, const char* arg) {
    check_tensor(cu, op, arg, {at::kInt});
    TORCH_CHECK_VALUE(cu.dim() == 1 && cu.is_contiguous(), where(op, arg), "has shape ", cu.sizes(),
                      "; pass a contiguous 1-D int32 tensor of batch + 1 cumulative sequence offsets");
    const auto* p = cu.data_ptr<std::int32_t>();
    return std::vector<std::int32_t>(p, p + cu.numel());
}

inline std::vector<std::int32_t> uniform_offsets(std::int64_t batch, std::int64_t tokens) {
    std::vector<std::int32_t> cu(static_cast<std::size_t>(batch) + 1);
    for (std::int64_t b = 0; b <= batch; ++b) cu[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(b * tokens);
    return cu;
}

/// Checks q, k, v (dtype, device, matching ranks and sizes) and the offsets; builds the shape.
/// Offsets are checked against the token counts by octet (check_shape: ValueError with its message).
/// The offsets are read on the host (the launch grid depends on them), so cu_seqlens_q / _k are CPU
/// tensors for either device; the CUDA kernels get device copies (device_offsets).
inline call make_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
                      const char* op, c10::DeviceType device) {
    check_tensor(q, op, "q", {at::kFloat, at::kBFloat16}, device);
    check_tensor(k, op, "k", {q.scalar_type()}, device);
    check_tensor(v, op, "v", {q.scalar_type()}, device);
    for (auto [t, arg] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}})
        TORCH_CHECK_VALUE(t->dim() == 3 || t->dim() == 4, where(op, arg), "has ", t->dim(),
                          " dimensions; pass [tokens, heads, head_dim] or [batch, tokens, heads, head_dim]");
    TORCH_CHECK_VALUE(k.dim() == q.dim(), where(op, "k"), "has ", k.dim(), " dimensions but q has ", q.dim());
    TORCH_CHECK_VALUE(v.sizes() == k.sizes(), where(op, "v"), "has shape ", v.sizes(), " but k has ", k.sizes(),
                      "; keys and values come in pairs");
    const int64_t n = q.dim();
    TORCH_CHECK_VALUE(k.size(n - 1) == q.size(n - 1), where(op, "k"), "has head_dim ", k.size(n - 1), " but q has ",
                      q.size(n - 1));
    call c;
    c.head_dim = static_cast<int>(q.size(n - 1));
    c.shape.heads_q = static_cast<int>(q.size(n - 2));
    c.shape.heads_kv = static_cast<int>(k.size(n - 2));
    c.shape.head_dim = c.head_dim;
    if (n == 4) {
        TORCH_CHECK_VALUE(!cu_seqlens_q && !cu_seqlens_k, where(op, "cu_seqlens_q"),
                          "is given with 4-D q [batch, tokens, heads, head_dim]; sequence offsets are for the packed "
                          "3-D layout [total_tokens, heads, head_dim]");
        TORCH_CHECK_VALUE(k.size(0) == q.size(0), where(op, "k"), "has batch ", k.size(0), " but q has ", q.size(0));
        c.batch = q.size(0);
        c.cu_q = uniform_offsets(c.batch, q.size(1));
        c.cu_k = uniform_offsets(c.batch, k.size(1));
    } else if (cu_seqlens_q) {
        c.cu_q = offsets(*cu_seqlens_q, op, "cu_seqlens_q");
        c.cu_k = cu_seqlens_k ? offsets(*cu_seqlens_k, op, "cu_seqlens_k") : c.cu_q;
        c.batch = static_cast<std::int64_t>(c.cu_q.size()) - 1;
    } else {
        TORCH_CHECK_VALUE(!cu_seqlens_k, where(op, "cu_seqlens_k"),
                          "is given without cu_seqlens_q; pass both (or neither for one sequence)");
        c.cu_q = uniform_offsets(1, q.size(0));
        c.cu_k = uniform_offsets(1, k.size(0));
    }
    c.shape.cu_seqlens_q = octet::span<const std::int32_t>(c.cu_q.data(), c.cu_q.size());
    c.shape.cu_seqlens_k = octet::span<const std::int32_t>(c.cu_k.data(), c.cu_k.size());
    c.total_q = n == 4 ? q.size(0) * q.size(1) : q.size(0);
    c.total_k = n == 4 ? k.size(0) * k.size(1) : k.size(0);
    return c;
}

/// Calls f(std::integral_constant<int, D>{}) for the head dim. Each head dim is its own set of
/// recipes (block<1, D>, block<full, D>) and attention instantiations (the four instantiating TUs
/// take about 30 s of CPU each); octet's bf16 entry points serve 64, 128 and 256, and 32 is here
/// for small models.
template <class F>
decltype(auto) with_head_dim(int d, const char* op, F&& f) {
    switch (d) {
        case 32:
            return f(std::integral_constant<int, 32>{});
        case 64:
            return f(std::integral_constant<int, 64>{});
        case 128:
            return f(std::integral_constant<int, 128>{});
        case 256:
            return f(std::integral_constant<int, 256>{});
        default:
            TORCH_CHECK_VALUE(false, where(op, "q"), "has head_dim ", d, "; the attention ops serve head dims ",
                              head_dims);
    }
}

/// True for "per_token", false for "per_head" (the V scaling's name).
inline bool per_token_v(std::string_view name, const char* op) {
    TORCH_CHECK_VALUE(name == "per_head" || name == "per_token", where(op, "v_scaling"), "is '", std::string(name),
                      "'; pass per_head or per_token");
    return name == "per_token";
}

/// An operand quantized with Recipe (stats into row when asked).
template <class Recipe, class In>
octet::quantized_tensor<Recipe> quantize_operand(octet::matrix_ref<const In> x, bool stats, double* row) {
    octet::quantized_tensor<Recipe> out(x.rows, x.cols);
    octet::quantize_options opt;
    opt.collect_stats = stats;
    const octet::quantize_result r = octet::quantize<Recipe>(host(), x, out.ref(), {}, opt);
    if (stats) put_quant_stats(row, r.rowwise);
    return out;
}

inline octet::attention_mask mask_of(bool causal) {
    return causal ? octet::attention_mask::causal : octet::attention_mask::full;
}

/// The softmax scale as octet takes it (0: 1 / sqrt(head_dim)); a non-finite or negative one is
/// rejected here, naming the argument.
inline float scale_of(double scale, const char* op) {
    TORCH_CHECK_VALUE(std::isfinite(scale) && scale >= 0.0, where(op, "scale"), "is ", scale,
                      "; pass a finite positive softmax scale (0 for 1 / sqrt(head_dim))");
    return static_cast<float>(scale);
}

/// Calls body(std::bool_constant<per_token_v>{}).
template <class F>
void with_v_scaling(bool per_token, F&& body) {
    if (per_token)
        body(std::true_type{});
    else
        body(std::false_type{});
}

// ---- forward and backward, instantiated per input dtype in attention_{forward,backward}_<dtype>.cpp

struct forward_args {
    const call* c;
    const at::Tensor *q, *k, *v;
    at::Tensor *o, *lse, *telemetry;
    octet::attention_options opt;
    bool per_token_v, telemetry_on;
};

template <class In>
void run_forward(const forward_args& a) {
    constexpr const char* op = "attention_forward";
    const call& c = *a.c;
    const auto qm = token_matrix<const In>(*a.q, op, "q");
    const auto km = token_matrix<const In>(*a.k, op, "k");
    const auto vm = token_matrix<const In>(*a.v, op, "v");
    const auto om = token_matrix<In>(*a.o, op, "o");
    const octet::span<float> lse(a.lse->data_ptr<float>(), static_cast<std::size_t>(a.lse->numel()));
    double* stats = a.telemetry->data_ptr<double>();
    const bool on = a.telemetry_on;
    with_head_dim(c.head_dim, op, [&](auto d) {
        with_v_scaling(a.per_token_v, [&](auto per_token) {
            using R = recipes<decltype(d)::value, decltype(per_token)::value>;
            const auto qq = quantize_operand<typename R::qk, In>(qm, on, stats);
            const auto kq = quantize_operand<typename R::qk, In>(km, on, stats + 8);
            const auto vq = quantize_operand<typename R::v, In>(vm, on, stats + 16);
            octet::attention_forward(host(), c.shape, qq.cref(), kq.cref(), vq.cref(), om, lse, a.opt);
        });
    });
}
#define OCTET_TORCH_ATTENTION_EXTERN_FORWARD(shard, In) extern template void run_forward<In>(const forward_args&);
OCTET_TORCH_ATTENTION_INPUTS(OCTET_TORCH_ATTENTION_EXTERN_FORWARD)
#undef OCTET_TORCH_ATTENTION_EXTERN_FORWARD

struct backward_args {
    const call* c;
    const at::Tensor *q, *k, *v, *o, *lse, *dout;
    at::Tensor *dq, *dk, *dv, *telemetry, *dout_stats;
    octet::attention_backward_options opt;
    bool per_token_v;
};

template <class In>
void run_backward(const backward_args& a) {
    constexpr const char* op = "attention_backward";
    const call& c = *a.c;
    const auto qm = token_matrix<const In>(*a.q, op, "q");
    const auto km = token_matrix<const In>(*a.k, op, "k");
    const auto vm = token_matrix<const In>(*a.v, op, "v");
    const auto dom = token_matrix<const In>(*a.dout, op, "dout");
    const auto om = a.o->defined() ? token_matrix<const In>(*a.o, op, "o") : octet::matrix_ref<const In>{};
    const auto dqm = token_matrix<In>(*a.dq, op, "dq");
    const auto dkm = token_matrix<In>(*a.dk, op, "dk");
    const auto dvm = token_matrix<In>(*a.dv, op, "dv");
    const octet::span<const float> lse(a.lse->data_ptr<float>(), static_cast<std::size_t>(a.lse->numel()));
    const bool stats = a.opt.telemetry;
    double* dout_stats = a.dout_stats->data_ptr<double>();
    octet::attention_stats st;
    with_head_dim(c.head_dim, op, [&](auto d) {
        with_v_scaling(a.per_token_v, [&](auto per_token) {
            using R = recipes<decltype(d)::value, decltype(per_token)::value>;
            const auto qq = quantize_operand<typename R::qk, In>(qm, false, nullptr);
            const auto kq = quantize_operand<typename R::qk, In>(km, false, nullptr);
            const auto vq = quantize_operand<typename R::v, In>(vm, false, nullptr);
            const auto gq = quantize_operand<typename R::dout, In>(dom, stats, dout_stats);
            st = octet::attention_backward(host(), c.shape, qq.cref(), kq.cref(), vq.cref(), om, lse, gq.cref(), dqm,
                                           dkm, dvm, a.opt);
        });
    });
    put_backward_telemetry(st, a.telemetry->data_ptr<double>());
}
#define OCTET_TORCH_ATTENTION_EXTERN_BACKWARD(shard, In) extern template void run_backward<In>(const backward_args&);
OCTET_TORCH_ATTENTION_INPUTS(OCTET_TORCH_ATTENTION_EXTERN_BACKWARD)
#undef OCTET_TORCH_ATTENTION_EXTERN_BACKWARD

}  // namespace octet_torch::attention

/// The shards X(shard, In) of OCTET_TORCH_ATTENTION_INPUTS: the forward and the backward on In
/// operands, every head dim and V scaling (the generated attention_forward_<shard>.cpp and
/// attention_backward_<shard>.cpp).
#define OCTET_TORCH_ATTENTION_FORWARD_SHARD(shard, In) \
    template void octet_torch::attention::run_forward<In>(const octet_torch::attention::forward_args&);
#define OCTET_TORCH_ATTENTION_BACKWARD_SHARD(shard, In) \
    template void octet_torch::attention::run_backward<In>(const octet_torch::attention::backward_args&);
