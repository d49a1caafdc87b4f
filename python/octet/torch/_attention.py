"""FP8 attention (octet/attention/attention.hpp) as an autograd function over two ops.

Ops (CPU kernels from octet's host path; python/csrc/attention_ops.cpp has the schemas):
  torch.ops.octet.attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, v_scaling,
                                    telemetry) -> (o, lse, telemetry[3, 8])
  torch.ops.octet.attention_backward(q, k, v, o, lse, dout, cu_seqlens_q, cu_seqlens_k, causal, scale,
                                     delta, v_scaling, telemetry, fold_dq_residual)
      -> (dq, dk, dv, telemetry[19], dout_stats[8])

Layout: q, k, v are float32 or bfloat16, [tokens, heads, head_dim] (one sequence, or several packed
along tokens with int32 cu_seqlens_q / cu_seqlens_k offsets, FlashAttention's varlen layout) or
[batch, tokens, heads, head_dim]; octet reads either as its [tokens, heads * head_dim] matrix without
a copy (channels contiguous, heads head_dim apart, tokens at least heads * head_dim apart: a slice
of a fused QKV projection qualifies). Other strides raise ValueError (call .contiguous()). k and v
have heads_kv heads, which must divide q's heads (grouped-query attention). head_dim: 32, 64, 128
or 256. o, dq, dk, dv have their input's shape and dtype; lse is [heads_q, total_q] float32.

Quantization is inside the ops, with octet::quantize: Q, K, dO to E4M3 with one float scale per
token and head; V to E4M3 with one scale per head over all tokens (v_scaling="per_head", octet's
default, about 3x more accurate O) or per token and head ("per_token"). P and dS are quantized as
octet/attention/rules.hpp says. The backward re-quantizes q, k, v (deterministic: the same codes).
"""

import math
from typing import Optional

import torch

from .._library import load
from ._quant import STATS_FIELDS, stats_dict

load("attention")
_ops = torch.ops.octet

DELTA_MODES = ("matched", "from_output")
V_SCALINGS = ("per_head", "per_token")
HEAD_DIMS = (32, 64, 128, 256)

# The backward's telemetry vector (octet::attention_stats, its derived ratios, then the residuals of
# dS as the dQ and dK products used it, with their ratios).
BACKWARD_FIELDS = ("rows", "residual_max", "residual_rel_max", "gap_max", "gap_rel_max", "residual_sumsq",
                   "abs_ds_sumsq", "gap_sumsq", "p_abs_dp_sumsq", "residual_rms", "gap_rms", "residual_rel",
                   "gap_rel", "residual_dq_max", "residual_dq_sumsq", "residual_dk_max", "residual_dk_sumsq",
                   "residual_dq_rel", "residual_dk_rel")


def _total_tokens(x):
    return x.shape[0] * x.shape[1] if x.dim() == 4 else x.shape[0]


@torch.library.register_fake("octet::attention_forward")
def _attention_forward_fake(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, causal=False, scale=0.0,
                            v_scaling="per_head", telemetry=False):
    return (q.new_empty(q.shape), q.new_empty((q.shape[-2], _total_tokens(q)), dtype=torch.float32),
            q.new_empty((3, len(STATS_FIELDS)), dtype=torch.float64))


@torch.library.register_fake("octet::attention_backward")
def _attention_backward_fake(q, k, v, o, lse, dout, cu_seqlens_q=None, cu_seqlens_k=None, causal=False,
                             scale=0.0, delta="matched", v_scaling="per_head", telemetry=False,
                             fold_dq_residual=False):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty((len(BACKWARD_FIELDS),), dtype=torch.float64),
            q.new_empty((len(STATS_FIELDS),), dtype=torch.float64))


class AttentionTelemetry:
    """What one ``attention(..., return_telemetry=True)`` call measured.

    ``forward``: {"q", "k", "v"} -> the quantization statistics of each operand (the dicts
    ``octet.torch.quantize`` gives: amax, saturated, sqnr_db, ...).
    ``backward``: None until the backward of this call has run; then the row telemetry of
    octet::attention_stats over the query rows that see a key: ``residual_rel`` = ||r|| / ||a||
    with r_i = sum_j dS_ij and a_i = sum_j |dS_ij| (zero in exact arithmetic; float rounding with
    delta="matched", the stale delta with "from_output"), ``residual_max``, ``residual_rel_max``
    (noisy), ``gap_rel`` (how far the stored O is from the P V the backward sees),
    ``residual_dq_rel`` / ``residual_dk_rel`` = ||rq|| / ||a||, ||rk|| / ||a|| with rq_i, rk_i the
    row sums of dS as the dQ and dK products used it (after its E4M3 rounding, so about
    u sqrt(sum_j dS_ij^2) per row even with "matched"; fold_dq_residual removes rq's effect on dQ),
    ... (the names of BACKWARD_FIELDS), plus ``dout``: dO's quantization statistics.
    The raw float64 tensors are ``forward_tensor``, ``backward_tensor`` and ``dout_stats_tensor``.
    """

    def __init__(self):
        self.forward_tensor: Optional[torch.Tensor] = None
        self.backward_tensor: Optional[torch.Tensor] = None
        self.dout_stats_tensor: Optional[torch.Tensor] = None

    @property
    def forward(self) -> Optional[dict]:
        if self.forward_tensor is None:
            return None
        return {name: stats_dict(row) for name, row in zip(("q", "k", "v"), self.forward_tensor)}

    @property
    def backward(self) -> Optional[dict]:
        if self.backward_tensor is None:
            return None
        d = dict(zip(BACKWARD_FIELDS, self.backward_tensor.tolist()))
        d["rows"] = int(d["rows"])
        d["dout"] = stats_dict(self.dout_stats_tensor)
        return d

    def __repr__(self):
        return f"AttentionTelemetry(forward={self.forward}, backward={self.backward})"


class AttentionFunction(torch.autograd.Function):
    """O = softmax(scale * Q K^T) V through octet's FP8 forward, gradients through its FP8 backward.

    apply(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, delta, v_scaling, telemetry,
    fold_dq_residual) returns
    (o, lse, forward telemetry); lse and the telemetry are not differentiable. ``telemetry`` is an
    AttentionTelemetry (the backward records into it) or None (no telemetry is gathered)."""

    @staticmethod
    def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, delta, v_scaling, telemetry,
                fold_dq_residual=False):
        return _ops.attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, v_scaling,
                                      telemetry is not None)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, delta, v_scaling, telemetry = inputs[:10]
        ctx.fold_dq_residual = bool(inputs[10]) if len(inputs) > 10 else False
        o, lse, _ = output
        ctx.save_for_backward(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k)
        ctx.mark_non_differentiable(lse, output[2])
        ctx.causal, ctx.scale, ctx.delta, ctx.v_scaling, ctx.telemetry = causal, scale, delta, v_scaling, telemetry

    @staticmethod
    def backward(ctx, do, _dlse, _dtelemetry):
        q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
        # the incoming gradient may be any view (an expanded scalar from .sum()); the op takes rows
        dq, dk, dv, tele, dout_stats = _ops.attention_backward(
            q, k, v, o, lse, do.contiguous(), cu_seqlens_q, cu_seqlens_k, ctx.causal, ctx.scale, ctx.delta,
            ctx.v_scaling, ctx.telemetry is not None, ctx.fold_dq_residual)
        if ctx.telemetry is not None:
            ctx.telemetry.backward_tensor = tele
            ctx.telemetry.dout_stats_tensor = dout_stats
        return dq, dk, dv, None, None, None, None, None, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, delta: str = "matched",
              scale: Optional[float] = None, return_telemetry: bool = False, v_scaling: str = "per_head",
              cu_seqlens_q: Optional[torch.Tensor] = None, cu_seqlens_k: Optional[torch.Tensor] = None,
              fold_dq_residual: bool = False):
    """softmax(scale * Q K^T) V with octet's FP8 attention, differentiable in q, k and v.

    q: [tokens, heads_q, head_dim] or [batch, tokens, heads_q, head_dim], float32 or bfloat16;
    k, v: the same with heads_kv heads (dividing heads_q; grouped-query attention) and their own
    token count. cu_seqlens_q / cu_seqlens_k (int32, batch + 1 offsets, 3-D inputs only) pack
    several sequences along tokens; cu_seqlens_k defaults to cu_seqlens_q. causal masks key j of
    query i unless j <= i + Lk - Lq (aligned bottom-right, FlashAttention 2.1+). scale defaults to
    1 / sqrt(head_dim). delta: how the backward forms D in dS = P (dP - D): "matched" (from the P
    and dP the backward uses: rows of dS sum to zero) or "from_output" (rowsum(dO * O), stale under
    FP8; kept for comparison). v_scaling: "per_head" or "per_token" V scales. fold_dq_residual:
    fold the row residual of dS as the dQ product used it back into dQ (octet's
    attention_backward_options::fold_dq_residual; dK and dV are unchanged).

    Returns O (q's shape and dtype, contiguous), or (O, AttentionTelemetry) with
    return_telemetry=True; the telemetry's ``backward`` fills in when the backward of this call runs.
    torch.compile(fullgraph=True) traces the call without telemetry; with it, the backward's record
    into the Python object is a side effect that fullgraph refuses (without fullgraph it breaks the
    graph there and works).
    """
    if delta not in DELTA_MODES:
        raise ValueError(f"octet.torch.attention: delta is {delta!r}; pass one of {DELTA_MODES}")
    if v_scaling not in V_SCALINGS:
        raise ValueError(f"octet.torch.attention: v_scaling is {v_scaling!r}; pass one of {V_SCALINGS}")
    if scale is None:
        scale = 0.0  # octet's 1 / sqrt(head_dim)
    elif not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"octet.torch.attention: scale is {scale}; pass a finite positive softmax scale")
    telemetry = AttentionTelemetry() if return_telemetry else None
    o, _lse, forward_stats = AttentionFunction.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, bool(causal),
                                                     float(scale), delta, v_scaling, telemetry,
                                                     bool(fold_dq_residual))
    if telemetry is None:
        return o
    telemetry.forward_tensor = forward_stats
    return o, telemetry
