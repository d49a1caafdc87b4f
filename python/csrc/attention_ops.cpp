// octet's FP8 attention (octet/attention/attention.hpp, host path) as torch ops:
//   octet::attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, v_scaling, telemetry)
//       -> (o, lse, telemetry)
//   octet::attention_backward(q, k, v, o, lse, dout, cu_seqlens_q, cu_seqlens_k, causal, scale, delta,
//                             v_scaling, telemetry, fold_dq_residual) -> (dq, dk, dv, telemetry, dout_stats)
// q, k, v, dout: float32 or bfloat16, [tokens, heads, head_dim] or [batch, tokens, heads, head_dim]
// (layout and quantization: attention_ops.hpp); o, dq, dk, dv: the same dtype and shapes;
// lse: [heads_q, total_q] float32 (natural log; +Inf for a row that sees no key).
// Forward telemetry: float64 [3, 8], the quantization statistics of Q, K, V (octet.torch.STATS_FIELDS).
// Backward telemetry: float64 [13], octet::attention_stats (rows, residual_max, residual_rel_max,
// gap_max, gap_rel_max, residual_sumsq, abs_ds_sumsq, gap_sumsq, p_abs_dp_sumsq) then residual_rms,
// gap_rms, residual_rel, gap_rel, then residual_dq_max, residual_dq_sumsq, residual_dk_max,
// residual_dk_sumsq, residual_dq_rel, residual_dk_rel (the row sums of dS as the dQ and dK products
// used it, after its E4M3 rounding); dout_stats: float64 [8], dO's quantization statistics.
// All zero unless telemetry is True. fold_dq_residual: attention_backward_options::fold_dq_residual.
#include "attention_ops.hpp"

namespace octet_torch::attention {
namespace {

using opt_tensor = std::optional<at::Tensor>;

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const opt_tensor& cu_seqlens_q, const opt_tensor& cu_seqlens_k,
                                                       bool causal, double scale, c10::string_view v_scaling,
                                                       bool telemetry) {
    constexpr const char* op = "attention_forward";
    const call c = make_call(q, k, v, cu_seqlens_q, cu_seqlens_k, op);
    const bool per_token = per_token_v(v_scaling, op);
    forward_args a{};
    a.opt.mask = mask_of(causal);
    a.opt.softmax_scale = scale_of(scale, op);
    a.per_token_v = per_token;
    a.telemetry_on = telemetry;
    const at::TensorOptions o = q.options();
    at::Tensor out = at::empty(q.sizes(), o);
    at::Tensor lse = at::empty({c.shape.heads_q, c.total_q}, o.dtype(at::kFloat));
    at::Tensor tele = at::zeros({3, 8}, o.dtype(at::kDouble));
    a.c = &c;
    a.q = &q;
    a.k = &k;
    a.v = &v;
    a.o = &out;
    a.lse = &lse;
    a.telemetry = &tele;
    guarded([&] {
        if (q.scalar_type() == at::kBFloat16)
            run_forward<octet::bf16>(a);
        else
            run_forward<float>(a);
    });
    return {out, lse, tele};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const opt_tensor& o, const at::Tensor& lse,
    const at::Tensor& dout, const opt_tensor& cu_seqlens_q, const opt_tensor& cu_seqlens_k, bool causal, double scale,
    c10::string_view delta, c10::string_view v_scaling, bool telemetry, bool fold_dq_residual) {
    constexpr const char* op = "attention_backward";
    const call c = make_call(q, k, v, cu_seqlens_q, cu_seqlens_k, op);
    check_tensor(dout, op, "dout", {q.scalar_type()});
    TORCH_CHECK_VALUE(dout.sizes() == q.sizes(), where(op, "dout"), "has shape ", dout.sizes(), " but q has ",
                      q.sizes(), "; dout is the gradient of o, which has q's shape");
    const at::Tensor o_t = o ? *o : at::Tensor();
    if (o_t.defined()) {
        check_tensor(o_t, op, "o", {q.scalar_type()});
        TORCH_CHECK_VALUE(o_t.sizes() == q.sizes(), where(op, "o"), "has shape ", o_t.sizes(), " but q has ", q.sizes(),
                          "; pass the forward's output");
    }
    check_tensor(lse, op, "lse", {at::kFloat});
    TORCH_CHECK_VALUE(
        lse.dim() == 2 && lse.size(0) == c.shape.heads_q && lse.size(1) == c.total_q && lse.is_contiguous(),
        where(op, "lse"), "has shape ", lse.sizes(), " (contiguous: ", lse.is_contiguous(),
        "); pass the forward's contiguous [heads_q, total_q] = [", c.shape.heads_q, ", ", c.total_q, "] log-sum-exp");
    TORCH_CHECK_VALUE(delta == "matched" || delta == "from_output", where(op, "delta"), "is '", std::string(delta),
                      "'; pass matched or from_output");
    const bool matched = delta == "matched";
    TORCH_CHECK_VALUE(matched || o_t.defined(), where(op, "o"),
                      "is None; delta='from_output' computes D = rowsum(dO * O) and needs the forward's output");
    backward_args a{};
    a.opt.mask = mask_of(causal);
    a.opt.softmax_scale = scale_of(scale, op);
    a.opt.delta = matched ? octet::delta_mode::matched : octet::delta_mode::from_output;
    a.opt.telemetry = telemetry;
    a.opt.fold_dq_residual = fold_dq_residual;
    a.per_token_v = per_token_v(v_scaling, op);
    at::Tensor dq = at::empty(q.sizes(), q.options()), dk = at::empty(k.sizes(), k.options()),
               dv = at::empty(v.sizes(), v.options());
    at::Tensor tele = at::zeros({backward_telemetry_size}, q.options().dtype(at::kDouble));
    at::Tensor dout_stats = at::zeros({8}, q.options().dtype(at::kDouble));
    a.c = &c;
    a.q = &q;
    a.k = &k;
    a.v = &v;
    a.o = &o_t;
    a.lse = &lse;
    a.dout = &dout;
    a.dq = &dq;
    a.dk = &dk;
    a.dv = &dv;
    a.telemetry = &tele;
    a.dout_stats = &dout_stats;
    guarded([&] {
        if (q.scalar_type() == at::kBFloat16)
            run_backward<octet::bf16>(a);
        else
            run_backward<float>(a);
    });
    return {dq, dk, dv, tele, dout_stats};
}

}  // namespace
}  // namespace octet_torch::attention

TORCH_LIBRARY_FRAGMENT(octet, m) {
    m.def(
        "attention_forward(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, bool "
        "causal=False, float scale=0.0, str v_scaling=\"per_head\", bool telemetry=False) -> (Tensor o, Tensor lse, "
        "Tensor telemetry)");
    m.def(
        "attention_backward(Tensor q, Tensor k, Tensor v, Tensor? o, Tensor lse, Tensor dout, Tensor? "
        "cu_seqlens_q=None, Tensor? cu_seqlens_k=None, bool causal=False, float scale=0.0, str delta=\"matched\", str "
        "v_scaling=\"per_head\", bool telemetry=False, bool fold_dq_residual=False) -> (Tensor dq, Tensor dk, Tensor "
        "dv, "
        "Tensor telemetry, Tensor dout_stats)");
}

TORCH_LIBRARY_IMPL(octet, CPU, m) {
    m.impl("attention_forward", &octet_torch::attention::forward);
    m.impl("attention_backward", &octet_torch::attention::backward);
}
