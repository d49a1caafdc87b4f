"""Mixture of experts in FP8: the grouped scaled GEMM, GroupedLinear, MoE, and the expert-parallel
FP8 token exchange over torch.distributed.

    y = ot.scaled_grouped_mm(x, w, group_sizes, recipe="blockwise")   # x sorted by expert
    layer = ot.GroupedLinear(experts, in_features, out_features, recipe="blockwise")
    moe = ot.MoE(d_model, d_ff, experts, k=2, activation="swiglu", recipe="blockwise")
    model.set_experts_implementation(ot.register_hf_experts("blockwise"))  # transformers 5 MoE models
    d = ot.expert_parallel_dispatch(x, indices, experts)          # torch.distributed: FP8 rows to owners
    out = ot.expert_parallel_moe(x, indices, gates, w_up, w_gate, w_down, experts)   # with autograd

The ops (library ``_grouped``, octet/gemm/grouped_gemm.hpp's host path, CPU):
  scaled_grouped_mm(a, b, group_sizes, a_recipe, b_recipe, out_dtype)
      m-grouped contiguous: a (M x K, float32 or bf16) holds G groups of rows in order (sizes
      group_sizes[g], summing to M; 0 allowed), b (G x N x K, the same dtype) one N x K matrix per
      group (a transposed view is read in place). Octet quantizes a group by group (grouped_quantize:
      each group is scaled as a matrix of its own, so a per-tensor recipe scales each group by its own
      amax and no scale block straddles two groups) and each b[g] as a matrix of its own, then rows of
      group g = A_g B_g^T (grouped_scaled_gemm). Each group's rows are, bit for bit, scaled_mm of
      quantize(a[rows of g]) and quantize(b[g]).
  scaled_grouped_mm_k(a, b, group_sizes, a_recipe, b_recipe)
      k-grouped (weight gradients): D[g] = a_g^T b_g (G x N x K, float32) from the column-wise
      copies of each group's rows (grouped_scaled_gemm_k); a group of 0 rows gives 0.
  scaled_grouped_mm_quantized(a_codes, a_scales, a_recipe, k, group_sizes, b, b_recipe, out_dtype)
      as scaled_grouped_mm, with A already quantized (one row-wise copy of a row-local recipe:
      blockwise_1x128 or mxfp8_e4m3), e.g. the rows an expert-parallel dispatch delivered.
  moe_exchange_in_process(x[], indices[], weights[], w, experts, x_recipe, w_recipe)
      octet/nn/moe_exchange.hpp's dispatch, grouped GEMM and bf16 combine over P in-process ranks:
      the reference the torch.distributed exchange below matches bit for bit (combine_wire: bf16,
      e4m3_1x128 or f32, octet::moe_combine_wire's).

The linear recipes (``recipe=``) name the operands' recipes as Float8Linear's do:
    forward  Y  = X W_e^T     (x, w)     data gradient  dX = dY W_e  (g, w: W_e^T quantized)
    weight gradient dW_e = dY_e^T X_e    (g, x: the column-wise copies of the group's rows)
tensorwise (E4M3 x and w, E5M2 g, one scale per group / expert), blockwise (DeepSeek-V3: 1x128 x
and g, 128x128 w) and mxfp8 (E4M3 x and w, E5M2 g, 32-element blocks, UE8M0 scales).
"""

from dataclasses import dataclass, field
from typing import List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from .._library import load
from ._quant import QuantizedTensor, layout, quantize, recipe_info

load("grouped")
_ops = torch.ops.octet


@dataclass(frozen=True)
class GroupedRecipe:
    name: str
    x: str  # the tokens' recipe (forward A; weight-gradient B)
    w: str  # the experts' weights' recipe (forward B; data-gradient B)
    g: str  # the output gradient's recipe (data-gradient A; weight-gradient A)


# The linear recipes the grouped GEMM serves (python/csrc/grouped_common.hpp lists the pairs).
GROUPED_RECIPES = {
    "tensorwise": GroupedRecipe("tensorwise", "tensorwise_e4m3", "tensorwise_e4m3", "tensorwise_e5m2"),
    "blockwise": GroupedRecipe("blockwise", "blockwise_1x128", "blockwise_128x128", "blockwise_1x128"),
    "mxfp8": GroupedRecipe("mxfp8", "mxfp8_e4m3", "mxfp8_e4m3", "mxfp8_e5m2"),
}


def grouped_recipe(recipe) -> GroupedRecipe:
    name = recipe.name if isinstance(recipe, GroupedRecipe) else recipe
    if not isinstance(name, str) or name not in GROUPED_RECIPES:
        raise ValueError(f"octet.torch: recipe {recipe!r} is not a grouped GEMM recipe; pass one of "
                         f"{', '.join(GROUPED_RECIPES)} (or an (a_recipe, b_recipe) pair to scaled_grouped_mm)")
    return GROUPED_RECIPES[name]


# ---- fake (meta) kernels: shapes and dtypes only, for torch.compile and FakeTensor ----


@torch.library.register_fake("octet::scaled_grouped_mm")
def _scaled_grouped_mm_fake(a, b, group_sizes, a_recipe, b_recipe, out_dtype=torch.float32):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


@torch.library.register_fake("octet::scaled_grouped_mm_quantized")
def _scaled_grouped_mm_quantized_fake(a_codes, a_scales, a_recipe, k, group_sizes, b, b_recipe,
                                      out_dtype=torch.float32):
    return b.new_empty((a_codes.shape[0], b.shape[1]), dtype=out_dtype)


@torch.library.register_fake("octet::scaled_grouped_mm_k")
def _scaled_grouped_mm_k_fake(a, b, group_sizes, a_recipe, b_recipe):
    return a.new_empty((group_sizes.shape[0], a.shape[1], b.shape[1]), dtype=torch.float32)


@torch.library.register_fake("octet::moe_exchange_in_process")
def _moe_exchange_in_process_fake(x, indices, weights, w, experts, x_recipe="blockwise_1x128",
                                  w_recipe="blockwise_128x128", combine_wire="bf16"):
    ctx = torch.library.get_ctx()
    out = []
    local = experts // len(x)
    for r in range(len(x)):
        rows = ctx.new_dynamic_size()
        out += [w.new_empty((ctx.new_dynamic_size(),), dtype=torch.uint8),
                w.new_empty((ctx.new_dynamic_size(),), dtype=torch.uint8),
                w.new_empty((local,), dtype=torch.int64), w.new_empty((rows, w.shape[1])),
                w.new_empty((x[r].shape[0], w.shape[1])), w.new_empty((4,), dtype=torch.int64)]
    return out


# ---- the grouped GEMM from Python ----


def _check_sizes_eagerly(sizes: torch.Tensor, rows: int, arg: str, how: str):
    """The op checks the sizes too (naming group_sizes); here the message names what was passed."""
    if torch.compiler.is_compiling() or sizes.numel() == 0:
        return
    if (sizes < 0).any():
        g = int((sizes < 0).nonzero()[0, 0])
        raise ValueError(f"octet.torch.scaled_grouped_mm: {arg} gives group {g} a negative size "
                         f"({int(sizes[g])}); {how}")
    total = int(sizes.sum())
    if total != rows:
        raise ValueError(f"octet.torch.scaled_grouped_mm: {arg} gives {total} rows in all but x has {rows}; {how}")


def _sizes_tensor(group_sizes) -> torch.Tensor:
    """Group sizes as a tensor (a list or tuple of ints is taken too)."""
    return group_sizes if isinstance(group_sizes, torch.Tensor) else torch.as_tensor(group_sizes, dtype=torch.int64)


def group_sizes_from_offsets(offs: torch.Tensor) -> torch.Tensor:
    """torch._grouped_mm's offs (the end row of each group, cumulative) as group sizes (int64)."""
    offs = offs.to(torch.int64)
    return torch.diff(offs, prepend=offs.new_zeros(1))


def scaled_grouped_mm(x: torch.Tensor, w: torch.Tensor, group_sizes: Optional[torch.Tensor] = None, *,
                      offs: Optional[torch.Tensor] = None, recipe: Union[str, Tuple[str, str]] = "blockwise",
                      out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows of group g of the result = quant(x_g) quant(w[g])^T, for G groups of x's rows.

    x: M x K float32 or bf16 tokens sorted by group (expert); w: G x N x K (the experts' nn.Linear
    weights stacked; torch._grouped_mm's G x K x N weights are w.transpose(1, 2) of this). Pass the
    groups as ``group_sizes`` (G row counts, int64 or int32, 0 allowed, summing to M) or as ``offs``
    (torch._grouped_mm's cumulative end rows). recipe: a linear recipe (tensorwise, blockwise, mxfp8:
    its x and w recipes) or an (a_recipe, b_recipe) pair of quantization recipes the op serves.
    x is quantized per group with a_recipe and each w[g] as a matrix of its own with b_recipe."""
    if (group_sizes is None) == (offs is None):
        raise ValueError("octet.torch.scaled_grouped_mm: pass exactly one of group_sizes (rows per group) and offs "
                         "(cumulative end row per group, torch._grouped_mm's convention)")
    if isinstance(recipe, tuple):
        a_recipe, b_recipe = recipe
    else:
        r = grouped_recipe(recipe)
        a_recipe, b_recipe = r.x, r.w
    if w.dim() != 3:
        raise ValueError(f"octet.torch.scaled_grouped_mm: w has shape {tuple(w.shape)}; pass G x N x K (one "
                         "N x K weight per group)")
    if offs is not None:
        sizes = group_sizes_from_offsets(offs)
        _check_sizes_eagerly(sizes, x.shape[0], "offs",
                             "pass the end row of each group, non-decreasing, the last equal to x's rows")
    else:
        sizes = _sizes_tensor(group_sizes)
        _check_sizes_eagerly(sizes, x.shape[0], "group_sizes",
                             "pass each group's row count (>= 0), in the order x holds the groups, summing to x's rows")
    if w.dtype != x.dtype and x.dtype in (torch.float32, torch.bfloat16) and w.dtype in (torch.float32,
                                                                                           torch.bfloat16):
        x, w = x.float(), w.float()  # widening is exact: the same codes
    return _ops.scaled_grouped_mm(x, w, sizes, a_recipe, b_recipe, out_dtype)


def _float(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype in (torch.float32, torch.bfloat16) else t.float()


class _GroupedLinearFn(torch.autograd.Function):
    """Y = X W_e^T per group: forward scaled_grouped_mm (x, w), dX scaled_grouped_mm (g, w) against
    W_e^T (w.transpose(1, 2), read in place), dW scaled_grouped_mm_k (g, x). Saves X and W."""

    @staticmethod
    def forward(ctx, x, weight, group_sizes, recipe_name):
        r = GROUPED_RECIPES[recipe_name]
        xf, wf = _float(x), _float(weight)
        if xf.dtype != wf.dtype:
            xf, wf = xf.float(), wf.float()
        y = _ops.scaled_grouped_mm(xf.contiguous(), wf, group_sizes, r.x, r.w, torch.float32)
        ctx.save_for_backward(xf, wf, group_sizes)
        ctx.recipe_name = recipe_name
        ctx.x_dtype, ctx.w_dtype = x.dtype, weight.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        r = GROUPED_RECIPES[ctx.recipe_name]
        xf, wf, sizes = ctx.saved_tensors
        dy = dy.to(xf.dtype).contiguous() if dy.numel() else torch.zeros(dy.shape, dtype=xf.dtype)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = _ops.scaled_grouped_mm(dy, wf.transpose(1, 2), sizes, r.g, r.w, torch.float32).to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            dw = _ops.scaled_grouped_mm_k(dy, xf, sizes, r.g, r.x).to(ctx.w_dtype)
        return dx, dw, None, None


class GroupedLinear(nn.Module):
    """E experts' linear layers (no bias) applied to tokens sorted by expert: rows of group e of
    the output = x_e W_e^T, with the forward, data gradient and weight gradient in FP8 (the three
    grouped GEMMs of the module docstring). weight: experts x out_features x in_features, each
    expert initialized as nn.Linear initializes its weight."""

    def __init__(self, experts: int, in_features: int, out_features: int, *, recipe="blockwise",
                 device=None, dtype=None):
        super().__init__()
        self.experts, self.in_features, self.out_features = experts, in_features, out_features
        self.recipe = grouped_recipe(recipe)
        self.weight = nn.Parameter(torch.empty(experts, out_features, in_features, device=device, dtype=dtype))
        bound = 1.0 / in_features**0.5 if in_features else 0.0
        nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"octet.torch.GroupedLinear: x has shape {tuple(x.shape)}; pass tokens x "
                             f"in_features = {self.in_features}, sorted by expert")
        return _GroupedLinearFn.apply(x, self.weight, _sizes_tensor(group_sizes), self.recipe.name)

    def extra_repr(self):
        return (f"experts={self.experts}, in_features={self.in_features}, out_features={self.out_features}, "
                f"recipe={self.recipe.name}")


# ---- routing and the MoE block ----


@dataclass
class Routing:
    """One forward's routing: indices and gates (tokens x k), the expert-sorted order of the
    assignments (assignment a = t k + j is token t's slot j; stable: by expert, then token, then
    slot, plan_dispatch's order), the group sizes and each assignment's row (row_of[order] = arange)."""

    indices: torch.Tensor
    gates: torch.Tensor
    order: torch.Tensor
    group_sizes: torch.Tensor
    row_of: torch.Tensor
    probs: torch.Tensor


def route(logits: torch.Tensor, k: int, *, renormalize: bool = True) -> Routing:
    """Top-k routing with softmax gates: p = softmax(logits) over all experts (float32), the k
    largest selected (torch.topk), gates p_S (Switch, GShard) or p_S / sum p_S (renormalize:
    DeepSeek-V3, Qwen-MoE). Differentiable in the gates."""
    experts = logits.shape[-1]
    probs = torch.softmax(logits.float(), dim=-1)
    gates, indices = torch.topk(probs, k, dim=-1)
    if renormalize:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    flat = indices.reshape(-1)
    order = torch.argsort(flat, stable=True)
    sizes = torch.zeros(experts, dtype=torch.int64, device=logits.device).index_add_(0, flat, torch.ones_like(flat))
    row_of = torch.empty_like(order)
    row_of[order] = torch.arange(order.numel(), device=order.device)
    return Routing(indices, gates, order, sizes, row_of, probs)


def combine(y: torch.Tensor, gates: torch.Tensor, row_of: torch.Tensor) -> torch.Tensor:
    """out_t = sum_j gates_tj y[row_of(t, j)], summed in slot order in y's dtype (octet::combine's order)."""
    tokens, k = gates.shape
    rows = row_of.view(tokens, k)
    out = torch.zeros(tokens, y.shape[1], dtype=y.dtype, device=y.device)
    for j in range(k):
        out = out + gates[:, j : j + 1].to(y.dtype) * y[rows[:, j]]
    return out


class MoE(nn.Module):
    """A mixture-of-experts MLP block: router (nn.Linear, float32, no bias) -> top-k with softmax
    gates -> expert-sorted tokens -> per-expert SwiGLU (silu(x W_gate^T) * (x W_up^T)) or GELU MLP
    on GroupedLinear (FP8 forward, dX and dW) -> W_down -> gated combine. The router, the gates,
    the activation and the combine run in float32 in torch (autograd), the six expert GEMMs in FP8.
    Experts and router train through it; ``aux_loss`` (after a forward) is the Switch/GShard
    load-balancing loss E sum_e f_e P_e (add ``coef * moe.aux_loss`` to the loss to use it)."""

    def __init__(self, d_model: int, d_ff: int, experts: int, *, k: int = 2, activation: str = "swiglu",
                 recipe="blockwise", renormalize: bool = True, device=None, dtype=None):
        super().__init__()
        if activation not in ("swiglu", "gelu"):
            raise ValueError(f"octet.torch.MoE: activation {activation!r} is unknown; pass 'swiglu' or 'gelu'")
        if not 1 <= k <= experts:
            raise ValueError(f"octet.torch.MoE: k is {k}; pass 1 <= k <= experts ({experts})")
        self.d_model, self.d_ff, self.experts, self.k = d_model, d_ff, experts, k
        self.activation, self.renormalize = activation, renormalize
        self.router = nn.Linear(d_model, experts, bias=False, device=device, dtype=dtype)
        self.up = GroupedLinear(experts, d_model, d_ff, recipe=recipe, device=device, dtype=dtype)
        self.gate = (GroupedLinear(experts, d_model, d_ff, recipe=recipe, device=device, dtype=dtype)
                     if activation == "swiglu" else None)
        self.down = GroupedLinear(experts, d_ff, d_model, recipe=recipe, device=device, dtype=dtype)
        self.last_routing: Optional[Routing] = None
        self.aux_loss: Optional[torch.Tensor] = None

    def experts_forward(self, xs: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        """The experts on tokens sorted by expert (group sizes ``sizes``)."""
        u = self.up(xs, sizes)
        h = F.silu(self.gate(xs, sizes)) * u if self.gate is not None else F.gelu(u)
        return self.down(h, sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.d_model:
            raise ValueError(f"octet.torch.MoE: x has shape {tuple(x.shape)}; its last dimension must be "
                             f"d_model = {self.d_model}")
        shape = x.shape
        x2 = x.reshape(-1, self.d_model)
        r = route(self.router(x2), self.k, renormalize=self.renormalize)
        ys = self.experts_forward(x2[r.order // self.k], r.group_sizes)
        out = combine(ys.float(), r.gates, r.row_of)
        f = r.group_sizes.to(torch.float32) / max(r.indices.numel(), 1)
        self.aux_loss = self.experts * (f * r.probs.mean(dim=0)).sum()
        self.last_routing = r
        return out.to(x.dtype).reshape(shape)

    def extra_repr(self):
        return (f"d_model={self.d_model}, d_ff={self.d_ff}, experts={self.experts}, k={self.k}, "
                f"activation={self.activation}, recipe={self.up.recipe.name}")


# ---- expert parallelism: the FP8 token exchange over torch.distributed ----


def _row_scales(q: QuantizedTensor, rows: int) -> torch.Tensor:
    """Each row's scales (rows x scale_cols) of a row-local copy, as raw bytes (uint8)."""
    s = q.scales[:, :rows].t().contiguous()
    return s.view(torch.uint8) if s.dtype != torch.uint8 else s


def _row_copy(codes: torch.Tensor, scales: torch.Tensor, recipe: str, cols: int) -> QuantizedTensor:
    """A row-wise copy in octet's layout (padding 0) from rows of codes (rows x d bytes) and their
    scales (rows x scale_cols, raw bytes)."""
    info = recipe_info(recipe)
    rows = codes.shape[0]
    (_, ld), (scale_cols, scale_ld), _ = layout(recipe, rows, cols)
    c = torch.zeros(rows, ld, dtype=torch.uint8)
    c[:, : codes.shape[1]] = codes
    s = torch.zeros(scale_cols, scale_ld, dtype=info.scale_dtype)
    if rows:
        s[:, :rows] = scales.view(info.scale_dtype).reshape(rows, scale_cols).t()
    return QuantizedTensor(c.view(info.code_dtype), s, torch.empty(0), recipe, cols)


@dataclass
class Dispatch:
    """What expert_parallel_dispatch returns, and expert_parallel_combine needs."""

    received: QuantizedTensor  # this rank's experts' rows (one row-wise copy), grouped by local expert
    expert_rows: torch.Tensor  # [L] rows of each local expert (the group sizes of `received`)
    routing_order: torch.Tensor  # this rank's plan order of its assignments
    row_of: torch.Tensor  # the plan row of each of this rank's assignments
    tokens: int
    k: int
    send_splits: List[int]  # rows sent to each rank
    recv_splits: List[int]  # rows received from each rank
    regroup: torch.Tensor  # received row i of `received` = row regroup[i] as it arrived
    report: dict = field(default_factory=dict)


def _peers_bytes(splits, row_bytes, rank):
    return sum(n for q, n in enumerate(splits) if q != rank) * row_bytes


def expert_parallel_dispatch(x: torch.Tensor, indices: torch.Tensor, experts: int, *, group=None,
                             recipe: str = "blockwise_1x128") -> Dispatch:
    """Sends this rank's tokens' FP8 rows to the ranks that own their experts (rank r owns experts
    [r L, (r + 1) L), L = experts / world), over torch.distributed.all_to_all_single.

    x (T x d, float32/bf16) is quantized ONCE with a row-local recipe (blockwise_1x128 or
    mxfp8_e4m3); the codes (d bytes a row) and the row's scales travel, not floats. indices: the
    router's top-k (T x k). A token routed to k experts is sent k times (its codes are copied, not
    quantized again). The rows a rank receives are grouped by its local expert, within an expert by
    source rank, then in the source's plan order: octet::moe_dispatch_host's order and bytes, bit
    for bit (the in-process op moe_exchange_in_process is the reference)."""
    import torch.distributed as dist

    if recipe not in ("blockwise_1x128", "mxfp8_e4m3"):
        raise ValueError(f"octet.torch.expert_parallel_dispatch: recipe {recipe!r}; pass a row-local recipe, "
                         "blockwise_1x128 or mxfp8_e4m3 (a token's codes and scales are then its own)")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if experts % world:
        raise ValueError(f"octet.torch.expert_parallel_dispatch: experts is {experts}; pass a multiple of the "
                         f"world size {world}")
    if x.dim() != 2 or indices.shape[0] != x.shape[0]:
        raise ValueError(f"octet.torch.expert_parallel_dispatch: x {tuple(x.shape)} and indices "
                         f"{tuple(indices.shape)}; pass T x d tokens and their T x k expert indices")
    tokens, d = x.shape
    k = indices.shape[1]
    local = experts // world
    flat = indices.reshape(-1).to(torch.int64)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= experts):
        raise ValueError(f"octet.torch.expert_parallel_dispatch: indices hold experts outside [0, {experts})")
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(experts, dtype=torch.int64).index_add_(0, flat, torch.ones_like(flat))
    row_of = torch.empty_like(order)
    row_of[order] = torch.arange(order.numel())
    q, _, _ = quantize(x, recipe)
    code_bytes = d  # FP8: one byte a code
    tok = order // k
    send_codes = q.codes.view(torch.uint8)[:, :code_bytes][tok].contiguous()
    send_scales = _row_scales(q, tokens)[tok].contiguous()
    recv_counts = torch.empty(experts, dtype=torch.int64)
    dist.all_to_all_single(recv_counts, counts, group=group)  # [q L + e]: rows of my expert e from rank q
    send_splits = counts.view(world, local).sum(1).tolist()
    recv_splits = recv_counts.view(world, local).sum(1).tolist()
    rows = sum(recv_splits)
    recv_codes = torch.empty(rows, code_bytes, dtype=torch.uint8)
    recv_scales = torch.empty(rows, send_scales.shape[1], dtype=torch.uint8)
    dist.all_to_all_single(recv_codes, send_codes, recv_splits, send_splits, group=group)
    dist.all_to_all_single(recv_scales, send_scales, recv_splits, send_splits, group=group)
    # Arrived by (source, expert, plan order); grouped by (expert, source, plan order).
    rc = recv_counts.view(world, local)
    starts = torch.cumsum(rc.reshape(-1), 0) - rc.reshape(-1)
    pieces = [torch.arange(int(starts[s * local + e]), int(starts[s * local + e]) + int(rc[s, e]))
              for e in range(local) for s in range(world)]
    regroup = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)
    received = _row_copy(recv_codes[regroup], recv_scales[regroup], recipe, d)
    row_bytes = code_bytes + send_scales.shape[1]
    report = {"rows_sent": sum(n for s, n in enumerate(send_splits) if s != rank),
              "bytes_sent": _peers_bytes(send_splits, row_bytes, rank),
              "bytes_received": _peers_bytes(recv_splits, row_bytes, rank),
              "bf16_bytes_sent": _peers_bytes(send_splits, 2 * d, rank),
              "counts_bytes_sent": (world - 1) * local * 8}  # the per-expert row counts, int64
    return Dispatch(received, rc.sum(0), order, row_of, tokens, k, send_splits, recv_splits, regroup, report)


def expert_parallel_combine(y: torch.Tensor, gates: torch.Tensor, dispatch: Dispatch, *, group=None,
                            wire: Union[torch.dtype, str] = torch.bfloat16) -> torch.Tensor:
    """Sends the experts' outputs y (the received rows' results, in `received`'s order, float32) back
    to their tokens' ranks, then out_t = sum_j gates_tj y[row of (t, j)] in float32 in slot order:
    bit for bit octet::moe_combine_host under the same wire. ``wire``: torch.bfloat16 (the default:
    rows rounded to nearest even, 2 N bytes), "e4m3_1x128" (rows quantized with blockwise_1x128:
    N code bytes and a float scale per 128, dequantized on arrival; one more rounding, 2^-4
    relative) or torch.float32 (exact rows, 4 N bytes)."""
    import torch.distributed as dist

    if wire not in (torch.bfloat16, torch.float32, "e4m3_1x128"):
        raise ValueError(f"octet.torch.expert_parallel_combine: wire is {wire!r}; pass torch.bfloat16, "
                         "'e4m3_1x128' or torch.float32")
    rank = dist.get_rank(group)
    n = y.shape[1]
    if wire == "e4m3_1x128":
        q, _, _ = quantize(y, "blockwise_1x128")
        payload = torch.cat([q.codes.view(torch.uint8)[:, :n], _row_scales(q, y.shape[0])], dim=1)
    else:
        payload = y.to(wire)
    back = torch.empty(payload.shape, dtype=payload.dtype)
    back[dispatch.regroup] = payload  # back in the order the rows arrived
    rows = torch.empty(sum(dispatch.send_splits), payload.shape[1], dtype=payload.dtype)
    dist.all_to_all_single(rows, back, dispatch.send_splits, dispatch.recv_splits, group=group)
    dispatch.report["combine_bytes_sent"] = _peers_bytes(dispatch.recv_splits,
                                                         payload.shape[1] * payload.element_size(), rank)
    if wire == "e4m3_1x128":
        rows = _row_copy(rows[:, :n], rows[:, n:], "blockwise_1x128", n).dequantize()
    return combine(rows.float(), gates.float(), dispatch.row_of)


def expert_parallel_experts(dispatch: Dispatch, w_local: torch.Tensor, *, w_recipe: str = "blockwise_128x128",
                            out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """This rank's experts (w_local: L x N x d, float32) on the FP8 rows it received, without
    dequantizing them: scaled_grouped_mm_quantized (octet::grouped_scaled_gemm's per-group products)."""
    q = dispatch.received
    codes, scales, _ = q.raw()
    return _ops.scaled_grouped_mm_quantized(codes, scales, q.recipe, q.cols, dispatch.expert_rows, w_local, w_recipe,
                                            out_dtype)


# ---- expert parallelism with autograd: the backward's exchanges ----


def _to_owners(rows: torch.Tensor, dispatch: Dispatch, group=None) -> torch.Tensor:
    """Rows in this rank's plan order (one per assignment) to their experts' owners, where they
    arrive in the owner's grouped order (the dispatch's order)."""
    import torch.distributed as dist

    recv = torch.empty(sum(dispatch.recv_splits), rows.shape[1], dtype=rows.dtype)
    dist.all_to_all_single(recv, rows.contiguous(), dispatch.recv_splits, dispatch.send_splits, group=group)
    return recv[dispatch.regroup]


def _to_sources(rows: torch.Tensor, dispatch: Dispatch, group=None) -> torch.Tensor:
    """The owner's rows (grouped order) back to their sources, where they arrive in plan order."""
    import torch.distributed as dist

    back = torch.empty_like(rows)
    back[dispatch.regroup] = rows
    out = torch.empty(sum(dispatch.send_splits), rows.shape[1], dtype=rows.dtype)
    dist.all_to_all_single(out, back, dispatch.send_splits, dispatch.recv_splits, group=group)
    return out


class _DispatchFn(torch.autograd.Function):
    """x -> the owner's received rows as floats (the exact values of their FP8 codes and scales). The
    backward sends each row's gradient (float32) back to its token's rank and sums a token's rows in
    slot order: dX_t = sum_j dXrow(t, j) (moe_combine_host with weights of 1 and the f32 wire)."""

    @staticmethod
    def forward(ctx, x, dispatch, group):
        ctx.dispatch, ctx.group, ctx.x_dtype = dispatch, group, x.dtype
        return dispatch.received.dequantize()

    @staticmethod
    def backward(ctx, dxr):
        d = ctx.dispatch
        rows = _to_sources(dxr.float().contiguous(), d, ctx.group)
        return combine(rows, torch.ones(d.tokens, d.k), d.row_of).to(ctx.x_dtype), None, None


class _QuantizedRowsLinearFn(torch.autograd.Function):
    """The experts' first GEMMs on the FP8 rows as they arrived (scaled_grouped_mm_quantized: no
    second rounding of X); dX against W_e^T and dW from the rows' float values (k-grouped)."""

    @staticmethod
    def forward(ctx, xr, weight, sizes, recipe_name, q):
        r = GROUPED_RECIPES[recipe_name]
        codes, scales, _ = q.raw()
        y = _ops.scaled_grouped_mm_quantized(codes, scales, q.recipe, q.cols, sizes, weight, r.w, torch.float32)
        ctx.save_for_backward(xr, weight, sizes)
        ctx.recipe_name = recipe_name
        return y

    @staticmethod
    def backward(ctx, dy):
        r = GROUPED_RECIPES[ctx.recipe_name]
        xr, w, sizes = ctx.saved_tensors
        dy = dy.float().contiguous()
        dx = _ops.scaled_grouped_mm(dy, w.transpose(1, 2), sizes, r.g, r.w, torch.float32)
        dw = _ops.scaled_grouped_mm_k(dy, xr, sizes, r.g, r.x)
        return dx, dw, None, None, None


class _CombineFn(torch.autograd.Function):
    """The owner's expert outputs y and this rank's gates -> out (expert_parallel_combine, bf16 wire).
    Backward: dgates and the rows' gradients from the rows as they came back (the wire's rounding
    passed straight through), the rows' gradients (float32) sent to the owners."""

    @staticmethod
    def forward(ctx, y, gates, dispatch, group, grad_wire):
        import torch.distributed as dist

        back = torch.empty(y.shape, dtype=torch.bfloat16)
        back[dispatch.regroup] = y.to(torch.bfloat16)
        rows = torch.empty(sum(dispatch.send_splits), y.shape[1], dtype=torch.bfloat16)
        dist.all_to_all_single(rows, back, dispatch.send_splits, dispatch.recv_splits, group=group)
        rows = rows.float()
        ctx.save_for_backward(rows, gates)
        ctx.dispatch, ctx.group, ctx.grad_wire = dispatch, group, grad_wire
        return combine(rows, gates.float(), dispatch.row_of)

    @staticmethod
    def backward(ctx, dout):
        import torch.distributed as dist

        rows, gates = ctx.saved_tensors
        d = ctx.dispatch
        with torch.enable_grad():
            r, g = rows.detach().requires_grad_(), gates.detach().float().requires_grad_()
            drows, dgates = torch.autograd.grad(combine(r, g, d.row_of), (r, g), dout)
        n = drows.shape[1]
        if ctx.grad_wire == "e4m3_1x128":  # codes and a float scale per 1 x 128 block, dequantized on arrival
            q, _, _ = quantize(drows, "blockwise_1x128")
            payload = torch.cat([q.codes.view(torch.uint8)[:, :n], _row_scales(q, drows.shape[0])], dim=1)
            got = _to_owners(payload, d, ctx.group)
            dy = _row_copy(got[:, :n], got[:, n:], "blockwise_1x128", n).dequantize()
        else:
            payload = drows
            dy = _to_owners(payload, d, ctx.group)
        d.report["grad_bytes_sent"] = _peers_bytes(d.send_splits, payload.shape[1] * payload.element_size(),
                                                   dist.get_rank(ctx.group))
        return dy, dgates.to(gates.dtype), None, None, None


def expert_parallel_moe(x: torch.Tensor, indices: torch.Tensor, gates: torch.Tensor, w_up: torch.Tensor,
                        w_gate: Optional[torch.Tensor], w_down: torch.Tensor, experts: int, *,
                        recipe: str = "blockwise", group=None, grad_wire: str = "f32",
                        report: Optional[dict] = None) -> torch.Tensor:
    """One expert-parallel MoE block, forward and backward (autograd): this rank's tokens x (T x d)
    routed by indices / gates (T x k; the router is the caller's, and trains through the gates),
    this rank's experts' weights w_up, w_gate (SwiGLU; None: GELU) (L x ff x d) and w_down
    (L x d x ff). Forward: X quantized once and dispatched as FP8 rows, the up (and gate) GEMMs on
    those rows, the down GEMM, the outputs back as bf16, the gated combine. Backward: the rows'
    gradients (float32) to the owners, the experts' data and weight gradients in FP8 (GroupedLinear's
    GEMMs), dX's rows back (float32), summed per token. recipe: blockwise or mxfp8 (row-local).
    grad_wire: how the rows' gradients travel to the owners: "f32" (exact) or "e4m3_1x128" (1x128 E4M3
    codes and float scales, about a quarter of the bytes; one more rounding of 2^-4 relative).
    report: a dict that receives the dispatch's byte counts (and the backward's, grad_bytes_sent)."""
    if grad_wire not in ("f32", "e4m3_1x128"):
        raise ValueError(f"octet.torch.expert_parallel_moe: grad_wire is {grad_wire!r}; pass 'f32' or 'e4m3_1x128'")
    r = grouped_recipe(recipe)
    if r.name not in ("blockwise", "mxfp8"):
        raise ValueError(f"octet.torch.expert_parallel_moe: recipe {recipe!r}; pass blockwise or mxfp8 (a token's "
                         "FP8 row must be its own: row-local activation scales)")
    d = expert_parallel_dispatch(x.detach(), indices, experts, group=group, recipe=r.x)
    if report is not None:  # the caller's dict: the backward adds grad_bytes_sent to it
        report.update(d.report)
        d.report = report
    xr = _DispatchFn.apply(x, d, group)
    sizes = d.expert_rows
    u = _QuantizedRowsLinearFn.apply(xr, w_up, sizes, r.name, d.received)
    if w_gate is not None:
        h = F.silu(_QuantizedRowsLinearFn.apply(xr, w_gate, sizes, r.name, d.received)) * u
    else:
        h = F.gelu(u)
    y = _GroupedLinearFn.apply(h, w_down, sizes, r.name)
    return _CombineFn.apply(y, gates, d, group, grad_wire)


def grouped_blocks(q: QuantizedTensor, expert_rows: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The data and scale blocks of octet's grouped layout (make_grouped_layout of grouped_rows) of a
    row-wise copy's groups: what moe_dispatch_host writes, padding included (for comparisons)."""
    data, scales = [], []
    codes = q.codes.view(torch.uint8)
    grid = q.scales.view(torch.uint8)  # scale_cols x (scale_ld * bytes per scale)
    per = q.scales.element_size()
    begin = 0
    for n in expert_rows.tolist():
        if n and q.cols:
            c = codes[begin : begin + n].reshape(-1)
            (_, _), (scale_cols, scale_ld), _ = layout(q.recipe, n, q.cols)
            s = torch.zeros(scale_cols, scale_ld * per, dtype=torch.uint8)
            s[:, : n * per] = grid[:, begin * per : (begin + n) * per]
            for block, out in ((c, data), (s.reshape(-1), scales)):
                pad = (-block.numel()) % 16
                out.append(torch.cat([block, torch.zeros(pad, dtype=torch.uint8)]))
        begin += n
    cat = lambda parts: torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)  # noqa: E731
    return cat(data), cat(scales)


# ---- Hugging Face transformers: an experts implementation ----


def _hf_experts_forward(recipe_name: str):
    """transformers' experts forward (hidden_states, top_k_index, top_k_weights) -> hidden_states,
    over the module's stacked expert weights (gate_up_proj / up_proj and down_proj, 3-D; biases and
    transposed layouts as transformers' grouped_mm implementation reads them), on GroupedLinear's
    FP8 grouped GEMMs. The tokens are sorted by expert stably; the gated sum is in float32."""

    def forward(self, hidden_states, top_k_index, top_k_weights):
        if getattr(self, "_is_expert_parallel", False):
            raise NotImplementedError("octet's transformers experts implementation does not run transformers' "
                                      "expert parallelism; use octet.torch.expert_parallel_dispatch instead")
        tokens, k = top_k_index.shape
        experts = self.num_experts
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat, stable=True)
        sizes = torch.zeros(experts, dtype=torch.int64, device=flat.device).index_add_(0, flat, torch.ones_like(flat))
        xs = hidden_states[order // k]
        transposed = getattr(self, "is_transposed", False)

        def linear(x, weight, bias):
            w = weight.transpose(1, 2) if transposed else weight  # E x N x K (a view: read in place)
            y = _GroupedLinearFn.apply(x, w, sizes, recipe_name)
            return y + bias[flat[order]].to(y.dtype) if bias is not None else y

        has_gate, has_bias = getattr(self, "has_gate", True), getattr(self, "has_bias", False)
        if has_gate:
            h = self._apply_gate(linear(xs, self.gate_up_proj, self.gate_up_proj_bias if has_bias else None))
        else:
            h = self.act_fn(linear(xs, self.up_proj, self.up_proj_bias if has_bias else None))
        y = linear(h, self.down_proj, self.down_proj_bias if has_bias else None)
        if getattr(self, "has_post_expert_norm", False):
            y = self.post_expert_norm(y)
        row_of = torch.empty_like(order)
        row_of[order] = torch.arange(order.numel(), device=order.device)
        return combine(y.float(), top_k_weights.float(), row_of).to(hidden_states.dtype)

    return forward


def register_hf_experts(recipe: str = "blockwise", name: Optional[str] = None) -> str:
    """Registers octet's FP8 experts (GroupedLinear's grouped GEMMs: forward, dX and dW) with
    transformers' ExpertsInterface under ``name`` (default ``octet_<recipe>``); then
    ``AutoModelForCausalLM.from_config(config, experts_implementation=name)`` (or
    ``model.set_experts_implementation(name)``) runs the experts of every MoE block whose experts
    module transformers decorates with ``use_experts_implementation`` (Mixtral, Qwen-MoE,
    DeepSeek-V3, OLMoE, ... in transformers 5) through octet. The router, the gates and the weights
    (and so the checkpoint) stay the model's own. Returns the name. Needs transformers 5."""
    r = grouped_recipe(recipe)
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError as e:
        raise ImportError("octet.torch.register_hf_experts needs transformers 5 (its ExpertsInterface)") from e
    name = name or f"octet_{r.name}"
    ExpertsInterface.register(name, _hf_experts_forward(r.name))
    return name
