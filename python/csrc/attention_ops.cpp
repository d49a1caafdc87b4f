// octet's FP8 attention (octet/attention/attention.hpp; on CUDA tensors attention.cuh through
// attention_device.hpp, head dims 64 and 128) as torch ops:
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
// All zero unless telemetry is True (on CUDA the dS residuals as the dQ and dK products used them,
// fields 13-18, are host-only and stay 0). fold_dq_residual: attention_backward_options::fold_dq_residual
// (host-only: refused on CUDA). cu_seqlens_q / _k are CPU tensors for either device (read on the
// host: the launch grid depends on them).
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>

#include <algorithm>

#include "attention_ops.hpp"
#ifdef OCTET_TORCH_CUDA
#include "attention_device.hpp"
#include "octet_torch_cuda.hpp"
#endif

namespace octet_torch::attention {
namespace {

using opt_tensor = std::optional<at::Tensor>;

/// Calls f(type_tag<float>) or f(type_tag<octet::bf16>) for q's dtype (make_call admits these two).
template <class F>
void with_dtype(const at::Tensor& q, F&& f) {
    if (q.scalar_type() == at::kBFloat16)
        f(type_tag<octet::bf16>{});
    else
        f(type_tag<float>{});
}

#ifdef OCTET_TORCH_CUDA
/// The CUDA kernels serve head dims 64 and 128 (the CPU op also 32 and 256).
void require_device_head_dim(const call& c, const char* op) {
    TORCH_CHECK_VALUE(c.head_dim == 64 || c.head_dim == 128, where(op, "q"), "has head_dim ", c.head_dim,
                      "; the CUDA kernels serve head dims 64 and 128 (the CPU op serves ", head_dims, ")");
}

/// Device copies of c's offsets into c.shape (the kernels read them there): a kernel for the uniform
/// layouts (arange: capturable in a CUDA graph), an asynchronous copy from pinned memory for given
/// cu_seqlens. The returned tensors hold them.
std::pair<at::Tensor, at::Tensor> device_offsets(call& c, const at::Tensor& q, const at::Tensor& k, bool given) {
    auto one = [&](const std::vector<std::int32_t>& cu, const at::Tensor& x) {
        const auto n = static_cast<int64_t>(cu.size());
        const at::TensorOptions o = x.options().dtype(at::kInt);
        if (!given) {
            const int64_t tokens = x.size(x.dim() - 3);
            return tokens > 0 ? at::arange(0, n * tokens, tokens, o) : at::zeros({n}, o);
        }
        at::Tensor host = at::empty({n}, at::TensorOptions().dtype(at::kInt).pinned_memory(true));
        std::copy(cu.begin(), cu.end(), host.data_ptr<std::int32_t>());
        return host.to(o, /*non_blocking=*/true);
    };
    std::pair<at::Tensor, at::Tensor> d{one(c.cu_q, q), one(c.cu_k, k)};
    c.shape.device_cu_seqlens_q = d.first.data_ptr<std::int32_t>();
    c.shape.device_cu_seqlens_k = d.second.data_ptr<std::int32_t>();
    return d;
}
#endif

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const opt_tensor& cu_seqlens_q, const opt_tensor& cu_seqlens_k,
                                                       bool causal, double scale, c10::string_view v_scaling,
                                                       bool telemetry) {
    constexpr const char* op = "attention_forward";
    const c10::DeviceType device = kernel_device(q, op, "q");
    call c = make_call(q, k, v, cu_seqlens_q, cu_seqlens_k, op, device);
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
    if (device == c10::DeviceType::CUDA) {
#ifdef OCTET_TORCH_CUDA
        require_device_head_dim(c, op);
        const c10::cuda::CUDAGuard guard(q.device());
        const auto offsets = device_offsets(c, q, k, cu_seqlens_q.has_value());
        // six quant_stats: Q, K, V, each a row-wise and an unused column-wise slot
        const at::Tensor raw = telemetry ? at::empty({6 * 64}, o.dtype(at::kByte)) : at::Tensor();
        auto* stats = telemetry ? static_cast<octet::quant_stats*>(raw.data_ptr()) : nullptr;
        with_dtype(q, [&](auto t) {
            using In = typename decltype(t)::type;
            guarded([&] {
                device::attention_forward<In>(
                    device_executor(q), c.shape, per_token, token_matrix<const In>(q, op, "q"),
                    token_matrix<const In>(k, op, "k"), token_matrix<const In>(v, op, "v"),
                    token_matrix<In>(out, op, "o"),
                    octet::span<float>(lse.data_ptr<float>(), static_cast<std::size_t>(lse.numel())), a.opt, stats);
            });
        });
        if (telemetry) {
            const at::Tensor s = stats_from_device(raw, 0, 6);
            tele = at::cat({s.narrow(0, 0, 1), s.narrow(0, 2, 1), s.narrow(0, 4, 1)});
        }
#endif
    } else {
        guarded([&] { with_dtype(q, [&](auto t) { run_forward<typename decltype(t)::type>(a); }); });
    }
    return {out, lse, tele};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const opt_tensor& o, const at::Tensor& lse,
    const at::Tensor& dout, const opt_tensor& cu_seqlens_q, const opt_tensor& cu_seqlens_k, bool causal, double scale,
    c10::string_view delta, c10::string_view v_scaling, bool telemetry, bool fold_dq_residual) {
    constexpr const char* op = "attention_backward";
    const c10::DeviceType device = kernel_device(q, op, "q");
    call c = make_call(q, k, v, cu_seqlens_q, cu_seqlens_k, op, device);
    check_tensor(dout, op, "dout", {q.scalar_type()}, device);
    TORCH_CHECK_VALUE(dout.sizes() == q.sizes(), where(op, "dout"), "has shape ", dout.sizes(), " but q has ",
                      q.sizes(), "; dout is the gradient of o, which has q's shape");
    const at::Tensor o_t = o ? *o : at::Tensor();
    if (o_t.defined()) {
        check_tensor(o_t, op, "o", {q.scalar_type()}, device);
        TORCH_CHECK_VALUE(o_t.sizes() == q.sizes(), where(op, "o"), "has shape ", o_t.sizes(), " but q has ", q.sizes(),
                          "; pass the forward's output");
    }
    check_tensor(lse, op, "lse", {at::kFloat}, device);
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
    if (device == c10::DeviceType::CUDA) {
#ifdef OCTET_TORCH_CUDA
        require_device_head_dim(c, op);
        const c10::cuda::CUDAGuard guard(q.device());
        const auto offsets = device_offsets(c, q, k, cu_seqlens_q.has_value());
        const at::TensorOptions bytes = q.options().dtype(at::kByte);
        const at::Tensor workspace =
            at::empty({static_cast<int64_t>(octet::attention_backward_workspace_for(c.shape).floats)},
                      q.options().dtype(at::kFloat));
        const at::Tensor raw_stats = at::empty({static_cast<int64_t>(sizeof(octet::attention_stats))}, bytes);
        const at::Tensor raw_dout = telemetry ? at::empty({2 * 64}, bytes) : at::Tensor();
        with_dtype(q, [&](auto t) {
            using In = typename decltype(t)::type;
            guarded([&] {
                device::attention_backward<In>(
                    device_executor(q), c.shape, a.per_token_v, token_matrix<const In>(q, op, "q"),
                    token_matrix<const In>(k, op, "k"), token_matrix<const In>(v, op, "v"),
                    o_t.defined() ? token_matrix<const In>(o_t, op, "o") : octet::matrix_ref<const In>{},
                    octet::span<const float>(lse.data_ptr<float>(), static_cast<std::size_t>(lse.numel())),
                    token_matrix<const In>(dout, op, "dout"), token_matrix<In>(dq, op, "dq"),
                    token_matrix<In>(dk, op, "dk"), token_matrix<In>(dv, op, "dv"),
                    octet::span<float>(workspace.data_ptr<float>(), static_cast<std::size_t>(workspace.numel())), a.opt,
                    static_cast<octet::attention_stats*>(raw_stats.data_ptr()), tele.data_ptr<double>(),
                    telemetry ? static_cast<octet::quant_stats*>(raw_dout.data_ptr()) : nullptr);
            });
        });
        if (telemetry) dout_stats = stats_from_device(raw_dout, 0, 1).reshape({8});
#endif
    } else {
        guarded([&] { with_dtype(q, [&](auto t) { run_backward<typename decltype(t)::type>(a); }); });
    }
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

// Without CUDA kernels the same functions answer a CUDA tensor with an error that says so.
TORCH_LIBRARY_IMPL(octet, CUDA, m) {
    m.impl("attention_forward", &octet_torch::attention::forward);
    m.impl("attention_backward", &octet_torch::attention::backward);
}
