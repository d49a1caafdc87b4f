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


LAYOUTS = ("thd", "bshd")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, delta: str = "matched",
              scale: Optional[float] = None, return_telemetry: bool = False, v_scaling: str = "per_head",
              cu_seqlens_q: Optional[torch.Tensor] = None, cu_seqlens_k: Optional[torch.Tensor] = None,
              fold_dq_residual: bool = False, layout: Optional[str] = None):
    """softmax(scale * Q K^T) V with octet's FP8 attention, differentiable in q, k and v.

    layout: "thd" (q is [tokens, heads_q, head_dim], the default for 3-D inputs) or "bshd"
    (q is [batch, tokens, heads_q, head_dim]: required for 4-D inputs, so that SDPA's
    [batch, heads, tokens, head_dim] is refused rather than read as tokens; for that layout use
    octet.torch.scaled_dot_product_attention). float32 or bfloat16;
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
    expected = {3: "thd", 4: "bshd"}.get(q.dim())
    if layout is not None and layout not in LAYOUTS:
        raise ValueError(f"octet.torch.attention: layout is {layout!r}; pass one of {LAYOUTS}")
    if q.dim() == 4 and layout != "bshd":
        raise ValueError(
            "octet.torch.attention: q is 4-D, so pass layout='bshd' ([batch, tokens, heads, head_dim]); for "
            "SDPA's [batch, heads, tokens, head_dim] call octet.torch.scaled_dot_product_attention")
    if layout is not None and expected is not None and layout != expected:
        raise ValueError(f"octet.torch.attention: layout is {layout!r} but q is {q.dim()}-D; "
                         f"pass layout={expected!r}")
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


# ---- SDPA's interface -----------------------------------------------------------------------------


def _served_head_dim(d: int) -> int:
    """The smallest head dim of HEAD_DIMS that holds d (q, k and v are zero-padded up to it)."""
    for h in HEAD_DIMS:
        if d <= h:
            return h
    raise ValueError(f"octet.torch.scaled_dot_product_attention: head_dim is {d}; octet serves head dims up to "
                     f"{HEAD_DIMS[-1]} (smaller ones are zero-padded to one of {HEAD_DIMS})")


def _allowed(attn_mask: torch.Tensor, b: int, lq: int, lk: int) -> torch.Tensor:
    """SDPA's attn_mask as a boolean [b, lq, lk] (True: query i may attend key j). A float mask must
    hold only 0 (attend) and large negative values (-inf, or dtype-min as HF writes): a bias is not a
    mask octet can serve."""
    fn = "octet.torch.scaled_dot_product_attention"
    if attn_mask.dim() > 4 or attn_mask.dim() < 2:
        raise ValueError(f"{fn}: attn_mask has {attn_mask.dim()} dimensions; pass [lq, lk], [b, 1, lq, lk] or a "
                         "shape broadcastable to [b, heads, lq, lk]")
    m = attn_mask
    while m.dim() < 4:
        m = m.unsqueeze(0)
    if m.dtype == torch.bool:
        allowed = m
    else:
        allowed = m == 0
        blocked = m <= -1e4
        if not bool((allowed | blocked).all()):
            raise ValueError(f"{fn}: attn_mask holds values other than 0 and large negatives (a bias); octet serves "
                             "padding and causal masks only")
    allowed = allowed.expand(b, allowed.shape[1], lq, lk)
    if allowed.shape[1] > 1 and not bool((allowed == allowed[:, :1]).all()):
        raise ValueError(f"{fn}: attn_mask differs between heads; octet serves masks shared by every head")
    return allowed[:, 0].to("cpu")


def _mask_as_sequences(allowed: torch.Tensor, self_attention: bool):
    """Reads a padding (and possibly causal) mask as one contiguous run of tokens per batch entry.
    Returns (starts, ends, causal) with tokens [starts[b], ends[b]) of entry b valid, as keys and
    (self-attention) as queries; raises ValueError for any other mask."""
    fn = "octet.torch.scaled_dot_product_attention"
    b, lq, lk = allowed.shape
    keys = allowed.any(dim=1)  # [b, lk]: keys some query sees
    starts, ends = [], []
    for e in range(b):
        idx = torch.nonzero(keys[e]).flatten()
        s0, s1 = (int(idx[0]), int(idx[-1]) + 1) if idx.numel() else (0, 0)
        if int(keys[e].sum()) != s1 - s0:
            raise ValueError(f"{fn}: attn_mask's keys of batch entry {e} are not one contiguous run; octet serves "
                             "left or right padding (one run of valid tokens per sequence)")
        starts.append(s0)
        ends.append(s1)
    j = torch.arange(lk)
    causal = None
    for e in range(b):
        s0, s1 = starts[e], ends[e]
        if s1 == s0:
            continue
        r0, r1 = (s0, s1) if self_attention else (0, lq)
        block = allowed[e, r0:r1]
        full = ((j >= s0) & (j < s1)).expand_as(block)
        is_full = torch.equal(block, full)
        is_causal = self_attention and torch.equal(block, full & (j.unsqueeze(0) <= torch.arange(r0, r1).unsqueeze(1)))
        if not (is_full or is_causal):
            raise ValueError(f"{fn}: attn_mask of batch entry {e} is neither a padding mask nor a causal one over "
                             "its valid tokens; octet serves those two")
        if is_full and is_causal:  # one valid token: both readings agree
            continue
        if causal is not None and causal != is_causal:
            raise ValueError(f"{fn}: attn_mask is causal for some batch entries and not for others")
        causal = is_causal
    return starts, ends, bool(causal)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None, enable_gqa: bool = False,
                                 *, delta: str = "matched", v_scaling: str = "per_head") -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention's interface over octet's FP8 attention.

    query [batch, heads_q, lq, head_dim], key and value [batch, heads_kv, lk, head_dim] (SDPA's
    layout), float32, bfloat16 or float16 (computed in float32 for float16). Returns
    [batch, heads_q, lq, head_dim] in query's dtype, differentiable in query, key and value.

    - heads_kv != heads_q needs enable_gqa=True (as SDPA); heads_kv must divide heads_q.
    - is_causal: key j of query i is masked unless j <= i; lq must equal lk (SDPA aligns a causal
      mask top-left, octet bottom-right: equal lengths are where they agree).
    - attn_mask: a padding mask, causal or not (boolean, True = attend; or float, 0 = attend and
      -inf or dtype-min = masked, as Hugging Face builds them), shared by every head: each batch
      entry's valid tokens must be one contiguous run (right or left padding). The valid tokens are
      packed into octet's varlen layout; the output rows of the other (padding) queries are 0 and
      get no gradient. Any other mask (a bias, per-head masks, holes) raises ValueError. The mask is
      read on the host: for a CUDA mask that is one device-to-host copy (a synchronization) per call.
    - head_dim: 32, 64, 128 and 256 directly; smaller ones are zero-padded to the next of those
      inside (16 -> 32, 80 and 96 -> 128, ...), which changes no score (the softmax scale stays
      1 / sqrt(head_dim) of the original) at the cost of the padded width.
    - dropout_p must be 0 (octet's attention has no dropout).
    delta and v_scaling are octet.torch.attention's."""
    fn = "octet.torch.scaled_dot_product_attention"
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.dim() != 4:
            raise ValueError(f"{fn}: {name} is {x.dim()}-D; pass [batch, heads, tokens, head_dim] (SDPA's layout)")
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"{fn}: {name} is {x.dtype}; pass float32, bfloat16 or float16")
    if not (query.dtype == key.dtype == value.dtype):
        raise ValueError(f"{fn}: query, key and value are {query.dtype}, {key.dtype}, {value.dtype}; pass one dtype")
    b, hq, lq, d = query.shape
    if key.shape != value.shape or key.shape[0] != b or key.shape[3] != d:
        raise ValueError(f"{fn}: key {tuple(key.shape)} and value {tuple(value.shape)} must share one shape "
                         f"[batch={b}, heads_kv, lk, head_dim={d}]")
    hk, lk = key.shape[1], key.shape[2]
    if dropout_p != 0.0:
        raise ValueError(f"{fn}: dropout_p is {dropout_p}; octet's attention has no dropout (pass 0.0)")
    if hk != hq and not enable_gqa:
        raise ValueError(f"{fn}: query has {hq} heads and key {hk}; pass enable_gqa=True for grouped-query attention")
    if hk == 0 or hq % hk != 0:
        raise ValueError(f"{fn}: key's {hk} heads must divide query's {hq}")
    if is_causal and attn_mask is not None:
        raise ValueError(f"{fn}: pass is_causal or attn_mask, not both (as SDPA)")
    if is_causal and lq != lk:
        raise ValueError(f"{fn}: is_causal with lq={lq} != lk={lk}: SDPA aligns the mask top-left and octet "
                         "bottom-right; pass equal lengths or an explicit attn_mask")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    dp = _served_head_dim(d)
    compute = torch.float32 if query.dtype == torch.float16 else query.dtype

    def prepare(x):  # [b, h, s, d] -> [b, s, h, dp] (a view when x came from a [b, s, h, d] projection)
        x = x.transpose(1, 2).to(compute)
        return torch.nn.functional.pad(x, (0, dp - d)) if dp != d else x

    q, k, v = prepare(query), prepare(key), prepare(value)
    if attn_mask is None:
        o = attention(q, k, v, causal=bool(is_causal), delta=delta, scale=scale, v_scaling=v_scaling,
                      layout="bshd")
    else:
        allowed = _allowed(attn_mask, b, lq, lk)
        starts, ends, causal = _mask_as_sequences(allowed, self_attention=(lq == lk))
        if lq == lk and all(s0 == 0 and s1 == lq for s0, s1 in zip(starts, ends)):
            o = attention(q, k, v, causal=causal, delta=delta, scale=scale, v_scaling=v_scaling, layout="bshd")
        else:
            qs = [(s0, s1) if lq == lk else (0, lq) for s0, s1 in zip(starts, ends)]
            q_index = torch.cat([torch.arange(e * lq + s0, e * lq + s1) for e, (s0, s1) in enumerate(qs)])
            k_index = torch.cat([torch.arange(e * lk + s0, e * lk + s1) for e, (s0, s1) in enumerate(zip(starts, ends))])
            cu_q = torch.tensor([0] + [s1 - s0 for s0, s1 in qs], dtype=torch.int32).cumsum(0).to(torch.int32)
            cu_k = torch.tensor([0] + [s1 - s0 for s0, s1 in zip(starts, ends)], dtype=torch.int32).cumsum(0)
            q_index, k_index = q_index.to(q.device), k_index.to(q.device)
            packed_q = q.reshape(b * lq, hq, dp).index_select(0, q_index)
            packed_k = k.reshape(b * lk, hk, dp).index_select(0, k_index)
            packed_v = v.reshape(b * lk, hk, dp).index_select(0, k_index)
            o_packed = attention(packed_q, packed_k, packed_v, causal=causal, delta=delta, scale=scale,
                                 v_scaling=v_scaling, cu_seqlens_q=cu_q.to(torch.int32),
                                 cu_seqlens_k=cu_k.to(torch.int32))
            o = o_packed.new_zeros(b * lq, hq, dp).index_copy(0, q_index, o_packed).reshape(b, lq, hq, dp)
    if dp != d:
        o = o[..., :d]
    return o.transpose(1, 2).to(query.dtype)


def hf_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                         **kwargs):
    """Hugging Face transformers' attention interface over octet.torch.scaled_dot_product_attention:
    register it with register_hf_attention() and load a model with attn_implementation="octet".
    Takes query, key, value as [batch, heads, tokens, head_dim]; returns ([batch, tokens, heads,
    head_dim], None) as transformers' sdpa_attention_forward does. Softcapping, attention sinks and
    attention weights are refused."""
    fn = "octet.torch.hf_attention_forward"
    for unsupported in ("softcap", "sinks", "s_aux", "position_bias"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(f"{fn}: the model passes {unsupported}; octet's attention has none")
    if kwargs.get("output_attentions", False):
        raise ValueError(f"{fn}: output_attentions=True; octet's attention returns no weights")
    lq = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal) and attention_mask is None and lq > 1
    if causal and key.shape[2] > lq:  # transformers' rule: keys past the queries are a cache, cut
        key, value = key[:, :, :lq], value[:, :, :lq]
    o = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                     is_causal=causal, scale=scaling, enable_gqa=key.shape[1] != query.shape[1])
    return o.transpose(1, 2).contiguous(), None


def register_hf_attention(name: str = "octet") -> str:
    """Registers hf_attention_forward with transformers' AttentionInterface under ``name``; then
    ``AutoModelForCausalLM.from_config(config, attn_implementation=name)`` (or
    ``model.set_attn_implementation(name)``) runs every attention layer through octet, with the masks
    transformers builds for SDPA. Returns the name. Needs transformers."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as e:
        raise ImportError("octet.torch.register_hf_attention needs transformers (pip install transformers)") from e
    AttentionInterface.register(name, hf_attention_forward)
    # the masks SDPA gets (None without padding, else boolean [b, 1, lq, lk]): without this a new name
    # gets no mask at all, and padding would be attended
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
