"""Float8Linear: nn.Linear whose three GEMMs run on octet's quantized copies, and convert().

For Y = X W^T (X: tokens x in, W: out x in) the layer runs, like torchao's Float8Linear and
Transformer Engine's Linear:
    forward         Y  = X  W^T   A = X's row-wise copy          B = W's row-wise copy
    data gradient   dX = dY W     A = dY's row-wise copy         B = W's column-wise copy (W^T's rows)
    weight gradient dW = dY^T X   A = dY's column-wise copy      B = X's column-wise copy
Every operand is quantized by octet.quantize and multiplied by octet.scaled_mm (float sums,
promotion every 128 K elements, the contract of octet/gemm/scaled_gemm.hpp). The forward keeps
the column-wise copies of X and W for the backward (not X and W themselves).

Recipes (``recipe=``, LINEAR_RECIPES):
  tensorwise          E4M3 activations and weights, E5M2 gradients, one scale per tensor from
                      the tensor's current amax (current scaling).
  tensorwise_delayed  the same formats with delayed scaling (TE's DelayedScaling, amax_compute_algo
                      "max"): each of X, W and dY keeps an amax history of ``amax_history_len``
                      steps in a buffer; a step quantizes with the scale of the history's max (the
                      amaxes of earlier steps, not its own), then pushes its own amax in front. While
                      a history is still all zero (the first step) that tensor uses current scaling.
                      Values above a stale amax saturate (octet counts them in quantize's stats).
  blockwise           DeepSeek-V3: 1x128 tiles for activations and gradients, 128x128 blocks for
                      weights, E4M3 everywhere, float scales.
  mxfp8               OCP MX (32-element blocks, UE8M0 scales): E4M3 activations and weights, E5M2
                      gradients (TE's HYBRID format choice).
  nvfp4               NVFP4 (16-element E2M1 blocks, E4M3 block scales on a float tensor scale) for
                      every operand; the output gradient is rounded stochastically (Philox seed =
                      the module's ``seed``, offsets from a per-module step counter, so a run is
                      reproducible), and the weight-gradient inputs dY and X are rotated along the
                      token dimension by a 16x16 random Hadamard transform (H D / 4, fixed random
                      signs D per module) before their column-wise copies: (H dY)^T (H X) = dY^T X.
                      The RHT runs in torch float32 here (octet's C++ transform lives in the codec
                      op library, a per-message transform that is not exposed as a torch op); NVFP4
                      weights use 1x16 blocks (octet has no 16x16 NVFP4 recipe).
"""

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from ._gemm import scaled_mm
from ._quant import QuantizedTensor, quantize


@dataclass(frozen=True)
class LinearRecipe:
    name: str
    x: str  # activation recipe (forward A; weight-gradient B)
    w: str  # weight recipe (forward B; data-gradient B)
    g: str  # output-gradient recipe (data-gradient A; weight-gradient A)
    # convert() swaps a linear only when in_features and out_features are multiples of this: each
    # is the K of one GEMM (in: forward, out: data gradient) and a multiple of the recipe's K block
    # leaves no ragged scale block (what tensor-core kernels need; the host GEMM takes any shape).
    dim_multiple: int
    delayed: bool = False
    stochastic_gradients: bool = False
    hadamard_wgrad: bool = False


LINEAR_RECIPES = {
    "tensorwise": LinearRecipe("tensorwise", "tensorwise_e4m3", "tensorwise_e4m3", "tensorwise_e5m2", 16),
    "tensorwise_delayed": LinearRecipe("tensorwise_delayed", "tensorwise_e4m3", "tensorwise_e4m3", "tensorwise_e5m2",
                                       16, delayed=True),
    "blockwise": LinearRecipe("blockwise", "blockwise_1x128", "blockwise_128x128", "blockwise_1x128", 128),
    "mxfp8": LinearRecipe("mxfp8", "mxfp8_e4m3", "mxfp8_e4m3", "mxfp8_e5m2", 32),
    "nvfp4": LinearRecipe("nvfp4", "nvfp4", "nvfp4", "nvfp4", 16, stochastic_gradients=True, hadamard_wgrad=True),
}

_RHT_BLOCK = 16


def linear_recipe(recipe) -> LinearRecipe:
    if isinstance(recipe, LinearRecipe):
        # The autograd function finds a recipe by name (a string is what torch.compile traces best).
        known = LINEAR_RECIPES.setdefault(recipe.name, recipe)
        if known != recipe:
            raise ValueError(f"octet.torch.Float8Linear: a different recipe is already named {recipe.name!r}")
        return recipe
    if recipe not in LINEAR_RECIPES:
        raise ValueError(f"octet.torch.Float8Linear: recipe {recipe!r} is unknown; pass one of "
                         f"{', '.join(LINEAR_RECIPES)} (or a LinearRecipe)")
    return LINEAR_RECIPES[recipe]


def _hadamard16() -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < _RHT_BLOCK:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def _rht_signs(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (_RHT_BLOCK,), generator=g, device="cpu").float() * 2 - 1


def rht_tokens(t: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """(H D / 4) applied to every group of 16 rows of t (tokens x features), in float32; the token
    count is zero-padded to a multiple of 16 (zero rows add nothing to dY^T X)."""
    rows, cols = t.shape
    pad = (-rows) % _RHT_BLOCK
    t = t.float()
    if pad:
        t = torch.cat([t, t.new_zeros(pad, cols)])
    rotation = _hadamard16().to(t.device) * signs.view(1, -1) * 0.25  # c H_16 D, c = 1/sqrt(16)
    blocks = t.view(-1, _RHT_BLOCK, cols)
    return torch.matmul(rotation, blocks).reshape(rows + pad, cols)


def _push_amax(hist: torch.Tensor, amax: torch.Tensor):
    """Puts this step's amax in front of the history; the oldest falls off (in place)."""
    with torch.no_grad():
        hist.copy_(torch.cat([amax.reshape(1).to(hist.dtype), hist[:-1]]))


def _copy(t3, recipe, cols):
    return QuantizedTensor(t3[0], t3[1], t3[2], recipe, cols)


def _stats_of(infos):
    """{operand: quantize's stats dict} for the copies that were made: "x" / "w" / "dy" are the
    row-wise copies, "x_t" / "w_t" / "dy_t" the column-wise ones (collect_stats)."""
    out = {}
    for name, info in infos.items():
        key = "columnwise" if name.endswith("_t") else "rowwise"
        if info is not None and key in info:
            out[name] = info[key]
    return out


# Philox offsets one backward pass draws: dY's row-wise copy, then (+2) H dY's column-wise copy.
_PHILOX_STRIDE = 4


class _Float8LinearFn(torch.autograd.Function):
    """Y = X W^T + b on quantized copies. Per-step state travels as tensors (the amax histories,
    the Philox (seed, offset) pair, the RHT signs), so torch.compile neither breaks the graph nor
    guards on it: the op reads a history's max itself, and the backward pushes dY's amax into
    g_hist in place. Returns (Y, amax of X, amax of W); the module pushes the two amaxes."""

    @staticmethod
    def forward(ctx, x, weight, bias, x_hist, w_hist, g_hist, philox, rht_signs, recipe_name, need_x_t, need_w_t,
                keep):
        cfg = LINEAR_RECIPES[recipe_name]
        stats = keep is not None and keep.collect_stats
        x_col = need_x_t and not cfg.hadamard_wgrad
        xq, x_t, x_info = quantize(x, cfg.x, rowwise=True, columnwise=x_col, amax_history=x_hist,
                                   collect_stats=stats)
        xh_info = None
        if need_x_t and cfg.hadamard_wgrad:
            _, x_t, xh_info = quantize(rht_tokens(x, rht_signs), cfg.x, rowwise=False, columnwise=True,
                                       collect_stats=stats)
        wq, w_t, w_info = quantize(weight, cfg.w, rowwise=True, columnwise=need_w_t, amax_history=w_hist,
                                   collect_stats=stats)
        y = scaled_mm(xq, wq, bias=None if bias is None else bias.float(), out_dtype=x.dtype)

        empty = x.new_empty(0)
        saved = []
        for q in (x_t, w_t):
            saved += [q.codes, q.scales, q.tensor_scale] if q is not None else [empty, empty, empty]
        saved.append(rht_signs if rht_signs is not None else empty)
        ctx.save_for_backward(*saved)
        # g_hist and philox are written by the backward, so they are kept as references, not saved
        # tensors (whose version check would fail when two forwards run before their backwards).
        ctx.g_hist = g_hist
        ctx.philox = philox
        ctx.recipe_name = recipe_name
        ctx.keep = keep
        ctx.meta = (weight.shape[0], x.dtype, weight.dtype, None if bias is None else bias.dtype,
                    x_t.cols if x_t is not None else 0)
        if keep is not None and keep.keep_operands:
            keep.last_operands = {"x": xq, "w": wq, "x_t": x_t, "w_t": w_t}
        if stats:
            keep.last_stats = _stats_of({"x": x_info, "x_t": xh_info or x_info, "w": w_info, "w_t": w_info})
        x_amax, w_amax = x_info["amax"], w_info["amax"]
        ctx.mark_non_differentiable(x_amax, w_amax)
        return y, x_amax, w_amax

    @staticmethod
    def backward(ctx, dy, _dx_amax, _dw_amax):
        cfg = LINEAR_RECIPES[ctx.recipe_name]
        out_features, x_dtype, w_dtype, b_dtype, x_t_cols = ctx.meta
        s = ctx.saved_tensors
        rht_signs = s[6]
        g_hist = ctx.g_hist
        stats = ctx.keep is not None and ctx.keep.collect_stats
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        # An empty expanded gradient has zero strides, which is_contiguous() accepts but
        # octet's shape checks do not: give it fresh storage.
        dy = dy.contiguous() if dy.numel() else torch.zeros(dy.shape, dtype=dy.dtype, device=dy.device)
        if cfg.stochastic_gradients and dy.dtype == torch.float16:
            dy = dy.float()  # octet's stochastic rounding takes float32 or bfloat16
        rounding, philox = "nearest_even", None
        if cfg.stochastic_gradients:
            # This backward draws from (seed, offset) and moves the module's pair to the next step.
            # (Read and advanced here, not in the forward: a compiled forward's copy of a buffer it
            # then advances reached the backward advanced.)
            rounding, philox = "stochastic", ctx.philox.clone()
            with torch.no_grad():
                ctx.philox.add_(torch.tensor([0, _PHILOX_STRIDE], device=philox.device))
        dy_col = need_dw and not cfg.hadamard_wgrad
        dy_q = dy_t = info = h_info = None
        if need_dx or dy_col:
            dy_q, dy_t, info = quantize(dy, cfg.g, rowwise=need_dx, columnwise=dy_col, amax_history=g_hist,
                                        rounding=rounding, philox=philox, collect_stats=stats)
            if g_hist is not None:
                _push_amax(g_hist, info["amax"])
        if need_dw and cfg.hadamard_wgrad:
            _, dy_t, h_info = quantize(rht_tokens(dy, rht_signs), cfg.g, rowwise=False, columnwise=True,
                                       rounding=rounding, philox=philox + torch.tensor([0, 2], device=philox.device),
                                       collect_stats=stats)
        dx = dw = db = None
        if need_dx:
            w_t = _copy(s[3:6], cfg.w, out_features)
            dx = scaled_mm(dy_q, w_t, out_dtype=x_dtype)
        if need_dw:
            x_t = _copy(s[0:3], cfg.x, x_t_cols)
            dw = scaled_mm(dy_t, x_t, out_dtype=w_dtype)
        if need_db:
            db = dy.float().sum(0).to(b_dtype)
        if ctx.keep is not None and ctx.keep.keep_operands:
            ctx.keep.last_operands.update({"dy": dy_q, "dy_t": dy_t})
        if stats:
            ctx.keep.last_stats.update(_stats_of({"dy": info, "dy_t": h_info or info}))
        return dx, dw, db, None, None, None, None, None, None, None, None, None


class Float8Linear(nn.Linear):
    """nn.Linear with octet's quantized GEMMs in forward and backward (see the module docstring).

    Same constructor as nn.Linear plus ``recipe`` (a name of LINEAR_RECIPES or a LinearRecipe),
    ``amax_history_len`` (tensorwise_delayed) and ``seed`` (stochastic rounding and the RHT signs
    of nvfp4). Inputs of any leading shape, float32, bfloat16 or float16; the output has the
    input's dtype. Set ``keep_operands = True`` to keep the last step's quantized copies in
    ``last_operands`` (tests, inspection), ``collect_stats = True`` to keep their quantization
    statistics in ``last_stats`` ({"x", "w", "x_t", "w_t", "dy", "dy_t"} -> quantize's stats dict;
    RunReport.record_linear reads them). Both are for eager mode: torch.compile(fullgraph=True)
    refuses the side effect."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 recipe="tensorwise", amax_history_len: int = 16, seed: int = 0):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.recipe = linear_recipe(recipe)
        self.seed = int(seed)
        self.keep_operands = False
        self.last_operands = None
        self.collect_stats = False
        self.last_stats = None
        if self.recipe.delayed:
            if amax_history_len < 1:
                raise ValueError(f"octet.torch.Float8Linear: amax_history_len is {amax_history_len}; pass >= 1")
            for role in ("x", "w", "g"):
                self.register_buffer(f"amax_history_{role}", torch.zeros(amax_history_len, device=device))
        if self.recipe.stochastic_gradients:
            # (seed, Philox offset of the next backward): a tensor, so that torch.compile does not
            # guard on the step; saved with the model, so that a resumed run draws new bits.
            self.register_buffer("philox", torch.tensor([self.seed, 0], dtype=torch.int64, device=device))
        if self.recipe.hadamard_wgrad:
            self.register_buffer("rht_signs", _rht_signs(self.seed).to(device), persistent=False)

    @property
    def step(self) -> int:
        """Backward passes that drew random bits (stochastic rounding); 0 for other recipes."""
        return int(self.philox[1]) // _PHILOX_STRIDE if self.recipe.stochastic_gradients else 0

    @classmethod
    def from_float(cls, linear: nn.Linear, *, recipe="tensorwise", **kwargs) -> "Float8Linear":
        """A Float8Linear sharing ``linear``'s weight and bias Parameters (optimizers keep working)."""
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, recipe=recipe,
                      **kwargs)
        new.weight = linear.weight
        new.bias = linear.bias
        dev = linear.weight.device
        for name, buf in list(new.named_buffers(recurse=False)):
            setattr(new, name, torch.zeros_like(buf, device=dev))
        if new.recipe.stochastic_gradients:
            new.philox = torch.tensor([new.seed, 0], dtype=torch.int64, device=dev)
        if new.recipe.hadamard_wgrad:
            new.rht_signs = _rht_signs(new.seed).to(dev)
        return new

    def _apply(self, fn, recurse=True):
        # .half() / .to(dtype) must not round the amax histories: they stay float32, and move.
        kept = {n: b for n, b in self.named_buffers(recurse=False) if n.startswith("amax_history")}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            setattr(self, name, before.to(device=getattr(self, name).device, dtype=torch.float32))
        return self

    def extra_repr(self) -> str:
        return super().extra_repr() + f", recipe={self.recipe.name}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"octet.torch.Float8Linear: input has {x.shape[-1]} features in its last dimension; "
                             f"this layer takes {self.in_features}")
        lead = x.shape[:-1]
        x2d = x.reshape(-1, self.in_features).contiguous()
        grad = torch.is_grad_enabled()
        need_x_t = grad and self.weight.requires_grad
        need_w_t = grad and x.requires_grad
        cfg = self.recipe
        x_hist = w_hist = g_hist = philox = None
        if cfg.delayed:
            x_hist, w_hist, g_hist = self.amax_history_x, self.amax_history_w, self.amax_history_g
        if cfg.stochastic_gradients:
            philox = self.philox  # the backward draws from it and advances it
        # eager inspection (a side effect that torch.compile refuses)
        keep = self if self.keep_operands or self.collect_stats else None
        y, x_amax, w_amax = _Float8LinearFn.apply(x2d, self.weight, self.bias, x_hist, w_hist, g_hist, philox,
                                                  getattr(self, "rht_signs", None), cfg.name, need_x_t, need_w_t,
                                                  keep)
        if cfg.delayed and grad:  # training steps record amaxes; evaluation does not
            _push_amax(x_hist, x_amax)
            _push_amax(w_hist, w_amax)
        return y.reshape(*lead, self.out_features)


def fits(recipe, linear: nn.Linear) -> bool:
    """convert()'s rule: in_features and out_features are multiples of the recipe's dim_multiple."""
    m = linear_recipe(recipe).dim_multiple
    return linear.in_features % m == 0 and linear.out_features % m == 0


def convert(model: nn.Module, recipe="tensorwise", filter: Optional[Callable[[str, nn.Module], bool]] = None,
            **kwargs) -> nn.Module:
    """Swaps every nn.Linear of ``model`` (exactly that type: subclasses such as attention's
    out_proj, whose weight is read directly, are left alone) for a Float8Linear sharing its
    parameters, in place, when fits(recipe, linear) and filter(qualified_name, linear) say so.
    Returns the model (a new Float8Linear when ``model`` itself is a linear)."""
    cfg = linear_recipe(recipe)

    def wanted(name, m):
        return type(m) is nn.Linear and fits(cfg, m) and (filter is None or filter(name, m))

    if wanted("", model):
        return Float8Linear.from_float(model, recipe=cfg, **kwargs)
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if wanted(name, child):
                setattr(parent, child_name, Float8Linear.from_float(child, recipe=cfg, **kwargs))
    return model
