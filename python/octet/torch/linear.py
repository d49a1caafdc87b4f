"""Float8Linear: nn.Linear whose three GEMMs run on octet's quantized copies, and convert().

For Y = X W^T (X: tokens x in, W: out x in) the layer runs, like torchao's Float8Linear and
Transformer Engine's Linear:
    forward         Y  = X  W^T   A = X's row-wise copy          B = W's row-wise copy
    data gradient   dX = dY W     A = dY's row-wise copy         B = W's column-wise copy (W^T's rows)
    weight gradient dW = dY^T X   A = dY's column-wise copy      B = X's column-wise copy
The layer is octet's C++ layer (octet/nn/linear.hpp, linear_forward / linear_backward on buffers
the op allocates as tensors) behind two ops, torch.ops.octet.linear_forward and linear_backward:
the copies each GEMM multiplies, the delayed-scaling rule, the Philox offsets of stochastic
rounding and the Hadamard rotation are the C++ layer's, so this module and octet's C++ training
program run the same layer. The forward keeps the column-wise copies of X and W for the backward
(not X and W themselves). Products are float sums promoted every 128 K elements (the contract of
octet/gemm/scaled_gemm.hpp). The layer computes in float32: bfloat16 and float16 inputs, weights
and gradients are widened to float32 for the op (a copy), and results are rounded back to them.

Devices: the CPU, and CUDA where the op libraries have their CUDA kernels
(``octet.torch.cuda_kernels()``; the same C++ layer on torch's current stream, with torch's
caching allocator, never synchronizing) for tensorwise, tensorwise_delayed, blockwise and mxfp8
(nvfp4's FP4 GEMMs run through cuBLASLt in octet, which the ops do not use: it stays on the CPU).
The amax histories and the Philox pair are read on the host before the kernels are enqueued, so
they stay on the CPU when the module moves to a GPU; tensorwise_delayed then reads each step's
amaxes back into its histories (one synchronization per layer and step), while the
current-scaling recipes never synchronize.

Recipes (``recipe=``, LINEAR_RECIPES; octet::linear_recipes):
  tensorwise          E4M3 activations and weights, E5M2 gradients, one scale per tensor from
                      the tensor's current amax (current scaling).
  tensorwise_delayed  the same formats with delayed scaling (TE's DelayedScaling, amax_compute_algo
                      "max"): each of X, W and dY keeps an amax history of ``amax_history_len``
                      steps in a buffer; a step quantizes with the scale of the history's max (the
                      amaxes of earlier steps, not its own), then pushes its own amax in front. While
                      a history is still all zero (the first step) that tensor uses current scaling.
                      Values above a stale amax saturate (octet counts them in the statistics).
  blockwise           DeepSeek-V3: 1x128 tiles for activations and gradients, 128x128 blocks for
                      weights, E4M3 everywhere, float scales.
  mxfp8               OCP MX (32-element blocks, UE8M0 scales): E4M3 activations and weights, E5M2
                      gradients (TE's HYBRID format choice).
  nvfp4               NVFP4 (16-element E2M1 blocks, E4M3 block scales on a float tensor scale) for
                      every operand; the output gradient is rounded stochastically (Philox seed =
                      the module's ``seed``; backward s draws from offset 4 s, so a run is
                      reproducible and resumes from the ``philox`` buffer, which linear_state()
                      carries), and the weight-gradient inputs dY and X are rotated along the token dimension by the
                      16-point random Hadamard transform of octet's codec (c H_16 D, signs from the
                      seed and the token index; tokens zero-padded to a multiple of 16) before their
                      column-wise copies: (H D dY)^T (H D X) = dY^T X. Weights use 1x16 blocks.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from .._library import load
from ._quant import QuantizedTensor, _copy_fake, _no_tensor_scale, recipe_info, stats_dict

load("linear")
_ops = torch.ops.octet


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

    def wgrad_tokens(self, tokens: int) -> int:
        """K of the weight-gradient GEMM: the tokens, padded to 16 under the Hadamard rotation."""
        return (tokens + 15) // 16 * 16 if self.hadamard_wgrad else tokens


def _linear_recipes():
    """The recipes the linear ops serve (octet::linear_recipes; python/csrc/registry.hpp's
    OCTET_TORCH_LINEAR_RECIPES), as the ops describe them."""
    table = {}
    for name in _ops.linear_recipe_names():
        x, w, g, delayed, stochastic_gradients, hadamard_wgrad, _on_cuda = _ops.linear_recipe_info(name)
        # dim_multiple: every block edge of the three recipes (a copy is row- or column-wise, so
        # either edge can lie along K) and the tensor cores' K step of 16
        edges = [e for r in (x, w, g) for e in (recipe_info(r).block_rows, recipe_info(r).block_cols)]
        table[name] = LinearRecipe(name, x, w, g, max([16] + edges), delayed=delayed,
                                   stochastic_gradients=stochastic_gradients, hadamard_wgrad=hadamard_wgrad)
    return table


LINEAR_RECIPES = _linear_recipes()


def linear_recipe(recipe) -> LinearRecipe:
    name = recipe.name if isinstance(recipe, LinearRecipe) else recipe
    if name not in LINEAR_RECIPES or (isinstance(recipe, LinearRecipe) and LINEAR_RECIPES[name] != recipe):
        raise ValueError(f"octet.torch.Float8Linear: recipe {recipe!r} is unknown; pass one of "
                         f"{', '.join(LINEAR_RECIPES)} (the layers octet::linear_recipes instantiates)")
    return LINEAR_RECIPES[name]


def _push_amax(hist: torch.Tensor, amax: torch.Tensor):
    """Puts this step's amax in front of the history; the oldest falls off (in place). The history
    stays on the CPU (the ops read it on the host): a CUDA amax is read back here."""
    with torch.no_grad():
        hist.copy_(torch.cat([amax.reshape(1).to(device=hist.device, dtype=hist.dtype), hist[:-1]]))


def _copy_count(recipe: str) -> int:
    return 3 if recipe_info(recipe).two_level else 2


# ---- the linear ops' results: one layout, read by the fake kernels and by the autograd function ----
# octet.linear_forward and octet.linear_backward return a flat Tensor[] (a custom op returns no
# structs). These functions name its parts, in the order python/csrc/linear_ops.cpp writes them:
# ("tensor", shape, dtype) is one tensor (dtype None: the input's), ("copy", recipe, rows, cols) a
# quantized copy of a rows x cols matrix (codes and scales, and a tensor scale for two-level recipes).


def _forward_parts(cfg, tokens, in_f, out_f, save_x_t, save_w_t, keep_operands, collect_stats):
    parts = [("y", ("tensor", (tokens, out_f), None)), ("x_amax", ("tensor", (), None)),
             ("w_amax", ("tensor", (), None))]
    if save_x_t:
        parts.append(("x_t", ("copy", cfg.x, in_f, cfg.wgrad_tokens(tokens))))
    if save_w_t:
        parts.append(("w_t", ("copy", cfg.w, in_f, out_f)))
    if keep_operands:
        parts += [("x", ("copy", cfg.x, tokens, in_f)), ("w", ("copy", cfg.w, out_f, in_f))]
    if collect_stats:
        parts.append(("stats", ("tensor", (4, 8), torch.float64)))
    return parts


def _backward_parts(cfg, tokens, in_f, out_f, need_dx, need_dw, need_db, keep_operands, collect_stats):
    parts = []
    if need_dx:
        parts.append(("dx", ("tensor", (tokens, in_f), None)))
    if need_dw:
        parts.append(("dw", ("tensor", (out_f, in_f), None)))
    if need_db:
        parts.append(("db", ("tensor", (out_f,), None)))
    parts.append(("dy_amax", ("tensor", (), None)))
    if keep_operands:
        if need_dx:
            parts.append(("dy", ("copy", cfg.g, tokens, out_f)))
        if need_dw:
            parts.append(("dy_t", ("copy", cfg.g, out_f, cfg.wgrad_tokens(tokens))))
    if collect_stats:
        parts.append(("stats", ("tensor", (2, 8), torch.float64)))
    return parts


def _fake_of(parts, like):
    """Empty tensors of the parts' shapes and dtypes (the fake kernels' result)."""
    out = []
    for _, (kind, *spec) in parts:
        if kind == "tensor":
            shape, dtype = spec
            out.append(like.new_empty(shape, dtype=dtype or like.dtype))
        else:
            recipe, rows, cols = spec
            out += _copy_fake(like, recipe, rows, cols)
    return out


def _unpack(out, parts, like):
    """{name: tensor or QuantizedTensor} of an op's result list, by its parts."""
    named, at = {}, 0
    for name, (kind, *spec) in parts:
        if kind == "tensor":
            named[name], at = out[at], at + 1
        else:
            recipe, _, cols = spec
            n = _copy_count(recipe)
            ts = out[at + 2] if n == 3 else _no_tensor_scale(like)
            named[name], at = QuantizedTensor(out[at], out[at + 1], ts, recipe, cols), at + n
    if at != len(out):
        raise RuntimeError(f"octet: the linear op returned {len(out)} tensors where its layout names {at}; "
                           "the op library and octet.torch are from different versions: rebuild them together")
    return named


def _raw(q: QuantizedTensor):
    """A copy as linear_backward reads it: uint8 views of codes and one-byte scales (QuantizedTensor.raw)."""
    codes, scales, ts = q.raw()
    return [codes, scales] + ([ts] if recipe_info(q.recipe).two_level else [])


# ---- fake (meta) kernels: shapes and dtypes only, for torch.compile and FakeTensor ----


@torch.library.register_fake("octet::linear_forward")
def _linear_forward_fake(x, w, bias, recipe, x_history=None, w_history=None, seed=0, save_x_t=True, save_w_t=True,
                         keep_operands=False, collect_stats=False):
    tokens, in_f = x.shape
    parts = _forward_parts(LINEAR_RECIPES[recipe], tokens, in_f, w.shape[0], save_x_t, save_w_t, keep_operands,
                           collect_stats)
    return _fake_of(parts, x)


@torch.library.register_fake("octet::linear_backward")
def _linear_backward_fake(dy, saved, recipe, g_history=None, seed=0, philox=None, need_dx=True, need_dw=True,
                          need_db=True, keep_operands=False, collect_stats=False):
    tokens, out_f = dy.shape
    in_f = saved[0].shape[0] if saved else 0
    parts = _backward_parts(LINEAR_RECIPES[recipe], tokens, in_f, out_f, need_dx, need_dw, need_db, keep_operands,
                            collect_stats)
    return _fake_of(parts, dy)


_FORWARD_STATS = ("x", "x_t", "w", "w_t")  # rows of linear_forward's stats
_BACKWARD_STATS = ("dy", "dy_t")


def _stats_of(stats, names, made):
    """{operand: quantize's stats dict} for the copies that were made (collect_stats)."""
    return {name: stats_dict(stats[i]) for i, name in enumerate(names) if made[i]}


# Philox offsets one backward pass draws (octet/nn/linear.hpp: backward s from offset 4 s).
_PHILOX_STRIDE = 4


class _Float8LinearFn(torch.autograd.Function):
    """Y = X W^T + b through octet's linear ops, all float32. Per-step state travels as tensors
    (the amax histories, the Philox (seed, offset) pair), so torch.compile neither breaks the
    graph nor guards on it: the op reads a history's max itself, and the backward pushes dY's amax
    into g_hist in place. Returns (Y, amax of X, amax of W); the module pushes the two amaxes."""

    @staticmethod
    def forward(ctx, x, weight, bias, x_hist, w_hist, g_hist, philox, seed, recipe_name, need_x_t, need_w_t, keep):
        cfg = LINEAR_RECIPES[recipe_name]
        stats = keep is not None and keep.collect_stats
        keep_ops = keep is not None and keep.keep_operands
        out = _ops.linear_forward(x, weight, bias, recipe_name, x_hist, w_hist, seed, need_x_t, need_w_t, keep_ops,
                                  stats)
        tokens, in_f = x.shape
        r = _unpack(out, _forward_parts(cfg, tokens, in_f, weight.shape[0], need_x_t, need_w_t, keep_ops, stats), x)
        y, x_amax, w_amax = r["y"], r["x_amax"], r["w_amax"]
        x_t, w_t = r.get("x_t"), r.get("w_t")
        ctx.save_for_backward(*(_raw(x_t) if x_t is not None else []), *(_raw(w_t) if w_t is not None else []))
        # g_hist and philox are written by the backward, so they are kept as references, not saved
        # tensors (whose version check would fail when two forwards run before their backwards).
        ctx.g_hist = g_hist
        ctx.philox = philox
        ctx.seed = seed
        ctx.recipe_name = recipe_name
        ctx.keep = keep
        ctx.saved_x_t, ctx.saved_w_t = need_x_t, need_w_t
        if keep_ops:
            keep.last_operands = {"x": r["x"], "w": r["w"], "x_t": x_t, "w_t": w_t}
        if stats:
            keep.last_stats = _stats_of(r["stats"], _FORWARD_STATS, (True, need_x_t, True, need_w_t))
        ctx.mark_non_differentiable(x_amax, w_amax)
        return y, x_amax, w_amax

    @staticmethod
    def backward(ctx, dy, _dx_amax, _dw_amax):
        cfg = LINEAR_RECIPES[ctx.recipe_name]
        saved = ctx.saved_tensors
        stats = ctx.keep is not None and ctx.keep.collect_stats
        keep_ops = ctx.keep is not None and ctx.keep.keep_operands
        need_dx = ctx.needs_input_grad[0] and ctx.saved_w_t
        need_dw = ctx.needs_input_grad[1] and ctx.saved_x_t
        need_db = ctx.needs_input_grad[2]
        # An empty expanded gradient has zero strides, which is_contiguous() accepts but
        # octet's shape checks do not: give it fresh storage.
        dy = dy.float().contiguous() if dy.numel() else torch.zeros(dy.shape, dtype=torch.float32, device=dy.device)
        n_x = _copy_count(cfg.x) if ctx.saved_x_t else 0
        copies = (list(saved[:n_x]) if need_dw else []) + (list(saved[n_x:]) if need_dx else [])
        philox = None
        if cfg.stochastic_gradients:
            # This backward draws from (seed, offset) and moves the module's pair to the next step.
            # (Read and advanced here, not in the forward: a compiled forward's copy of a buffer it
            # then advances reached the backward advanced.)
            philox = ctx.philox.clone()
            with torch.no_grad():
                ctx.philox.add_(torch.tensor([0, _PHILOX_STRIDE], device=philox.device))
        out = _ops.linear_backward(dy, copies, ctx.recipe_name, ctx.g_hist, ctx.seed, philox, need_dx, need_dw,
                                   need_db, keep_ops, stats)
        tokens, out_f = dy.shape
        in_f = copies[0].shape[0] if copies else 0
        r = _unpack(out, _backward_parts(cfg, tokens, in_f, out_f, need_dx, need_dw, need_db, keep_ops, stats), dy)
        dx, dw, db = r.get("dx"), r.get("dw"), r.get("db")
        if ctx.g_hist is not None and (need_dx or need_dw):  # dY was quantized (no rotation under delayed)
            _push_amax(ctx.g_hist, r["dy_amax"])
        if keep_ops:
            ctx.keep.last_operands.update({"dy": r.get("dy"), "dy_t": r.get("dy_t")})
        if stats:
            ctx.keep.last_stats.update(_stats_of(r["stats"], _BACKWARD_STATS, (need_dx, need_dw)))
        return dx, dw, db, None, None, None, None, None, None, None, None, None


class Float8Linear(nn.Linear):
    """nn.Linear with octet's quantized GEMMs in forward and backward (see the module docstring).

    Same constructor as nn.Linear plus ``recipe`` (a name of LINEAR_RECIPES or a LinearRecipe),
    ``amax_history_len`` (tensorwise_delayed) and ``seed`` (stochastic rounding and the Hadamard
    signs of nvfp4). Any in_features and out_features: the CPU's GEMM takes any shape, and on CUDA,
    whose kernels want multiples of the recipe's block (``recipe.dim_multiple``), the layer pads X,
    W and the bias with zeros inside and slices Y (``pad_features``: "auto", the default, pads
    where the kernels need it; "always"; "never"). Zero padding changes no code, scale or sum: the
    result is the unpadded layer's, bit for bit (tests/python/test_convert.py).
    Inputs of any leading shape, float32, bfloat16 or float16; the output has the
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
                self.register_buffer(f"amax_history_{role}", torch.zeros(amax_history_len, device="cpu"),
                                     persistent=False)
        if self.recipe.stochastic_gradients:
            # (seed, Philox offset of the next backward): a tensor, so that torch.compile does not
            # guard on the step.
            self.register_buffer("philox", torch.tensor([self.seed, 0], dtype=torch.int64, device="cpu"),
                                 persistent=False)
        # The amax histories and the Philox pair are not in state_dict(), so that a converted model's
        # state dict loads strictly into the unconverted model and back; linear_state() /
        # load_linear_state() carry them for a bit-exact resume.
        self.pad_features = "auto"

    @property
    def step(self) -> int:
        """Backward passes that drew random bits (stochastic rounding); 0 for other recipes."""
        return int(self.philox[1]) // _PHILOX_STRIDE if self.recipe.stochastic_gradients else 0

    @classmethod
    def from_float(cls, linear: nn.Linear, *, recipe="tensorwise", **kwargs) -> "Float8Linear":
        """A Float8Linear sharing ``linear``'s weight and bias Parameters (optimizers keep working)."""
        return cls._sharing(linear.in_features, linear.out_features, linear.weight, linear.bias, recipe, **kwargs)

    @classmethod
    def _sharing(cls, in_features, out_features, weight, bias, recipe, **kwargs):
        """A new layer of this class whose weight and bias are the given Parameters."""
        with torch.device("meta"):
            new = cls(in_features, out_features, bias=bias is not None, recipe=recipe, **kwargs)
        new.weight = weight
        new.bias = bias
        for name, buf in list(new.named_buffers(recurse=False)):  # host-read state: on the CPU
            setattr(new, name, torch.zeros_like(buf, device="cpu"))
        if new.recipe.stochastic_gradients:
            new.philox = torch.tensor([new.seed, 0], dtype=torch.int64)
        return new

    def _apply(self, fn, recurse=True):
        # The amax histories and the Philox pair are host-read state: .cuda() / .half() / .to(...)
        # leave them on the CPU in their dtype (float32, int64).
        kept = dict(self.named_buffers(recurse=False))
        super()._apply(fn, recurse)
        for name, before in kept.items():
            setattr(self, name, before)
        return self

    def extra_repr(self) -> str:
        return super().extra_repr() + f", recipe={self.recipe.name}"

    def _weight_out_in(self) -> torch.Tensor:
        """The weight as [out_features, in_features] (Float8Conv1D: a transposed view)."""
        return self.weight

    def _padding(self, device: torch.device):
        """(in, out) zeros to append, or None: "auto" pads on CUDA when a dimension is not a multiple
        of the recipe's block."""
        if self.pad_features not in ("auto", "always", "never"):
            raise ValueError(f"octet.torch.Float8Linear: pad_features is {self.pad_features!r}; pass 'auto', "
                             "'always' or 'never'")
        m = self.recipe.dim_multiple
        pad_in, pad_out = -self.in_features % m, -self.out_features % m
        if (pad_in or pad_out) and (self.pad_features == "always" or
                                    (self.pad_features == "auto" and device.type == "cuda")):
            return pad_in, pad_out
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"octet.torch.Float8Linear: input has {x.shape[-1]} features in its last dimension; "
                             f"this layer takes {self.in_features}")
        lead = x.shape[:-1]
        x2d = x.reshape(-1, self.in_features).contiguous()
        if getattr(self.weight, "_fp8_gathered", False):  # FSDP2 gathered it as E4M3 codes (octet.torch.fsdp)
            from .fsdp import gathered_forward

            return _shaped(gathered_forward(self, _widen(x2d)), x.dtype, lead, self.out_features)
        weight, bias = self._weight_out_in(), self.bias
        padding = self._padding(x.device)
        if padding is not None:
            pad_in, pad_out = padding
            x2d = torch.nn.functional.pad(x2d, (0, pad_in))
            weight = torch.nn.functional.pad(weight, (0, pad_in, 0, pad_out))
            bias = None if bias is None else torch.nn.functional.pad(bias, (0, pad_out))
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
        # The layer computes in float32 (widened copies of bfloat16 / float16; float64 is refused
        # by the op, naming the argument): autograd rounds the gradients back to each dtype.
        y, x_amax, w_amax = _Float8LinearFn.apply(_widen(x2d), _widen(weight), None if bias is None else _widen(bias),
                                                  x_hist, w_hist, g_hist, philox, self.seed, cfg.name, need_x_t,
                                                  need_w_t, keep)
        if cfg.delayed and grad:  # training steps record amaxes; evaluation does not
            _push_amax(x_hist, x_amax)
            _push_amax(w_hist, w_amax)
        if padding is not None:
            y = y[:, :self.out_features]
        return _shaped(y, x.dtype, lead, self.out_features)


def _shaped(y: torch.Tensor, dtype: torch.dtype, lead, out_features: int) -> torch.Tensor:
    """Y in the input's dtype and leading shape; not a view of itself when nothing changes (FSDP2
    warns about a module that returns a view: an in-place op on it would skip its backward hook)."""
    y = y.to(dtype)
    return y if y.shape == (*lead, out_features) else y.reshape(*lead, out_features)


def _widen(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def fits(recipe, linear: nn.Linear) -> bool:
    """Whether in_features and out_features are multiples of the recipe's dim_multiple (the block the
    CUDA kernels want): a layer that does not fit still converts, and pads inside on CUDA."""
    m = linear_recipe(recipe).dim_multiple
    return linear.in_features % m == 0 and linear.out_features % m == 0


class Float8Conv1D(Float8Linear):
    """Hugging Face's Conv1D (GPT-2's projections: y = x W + b with W [in, out]) on octet's
    quantized GEMMs. It keeps the Conv1D's weight Parameter, [in_features, out_features], so its
    state dict is the Conv1D's; the GEMMs read the weight transposed, in place."""

    @classmethod
    def from_conv1d(cls, conv: nn.Module, *, recipe="tensorwise", **kwargs) -> "Float8Conv1D":
        in_f, out_f = conv.weight.shape
        return cls._sharing(in_f, out_f, conv.weight, conv.bias, recipe, **kwargs)

    def _weight_out_in(self) -> torch.Tensor:
        return self.weight.t()


def _is_hf_conv1d(m: nn.Module) -> bool:
    return type(m).__name__ == "Conv1D" and type(m).__module__.startswith("transformers") and m.weight.dim() == 2


@dataclass
class ConversionReport:
    """What convert() did: ``converted`` (qualified names, each swapped for a Float8Linear or
    Float8Conv1D), ``padded`` (the converted ones whose dimensions are not multiples of the recipe's
    block: padded inside on CUDA), ``skipped`` (qualified name -> why)."""
    recipe: str
    converted: list
    padded: list
    skipped: dict

    def __str__(self):
        lines = [f"octet.torch.convert ({self.recipe}): {len(self.converted)} converted, "
                 f"{len(self.skipped)} skipped, {len(self.padded)} padded inside on CUDA"]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


def convert(model: nn.Module, recipe="tensorwise", filter: Optional[Callable[[str, nn.Module], bool]] = None, *,
            module_filter_fn: Optional[Callable[[nn.Module, str], bool]] = None, keep_output_head: bool = True,
            return_report: bool = False, **kwargs):
    """Swaps, in place, every nn.Linear of ``model`` (exactly that type) for a Float8Linear and every
    Hugging Face Conv1D (GPT-2) for a Float8Conv1D, each sharing the module's Parameters (optimizers
    and tied weights keep working; the state dict keeps its keys and shapes). Any shape converts
    (see Float8Linear on padding). Left alone, each with its reason in the report:
      * the output head (``model.get_output_embeddings()``, or a module named ``lm_head``) while
        keep_output_head is set (the default: the logits' GEMM is the one most sensitive to FP8);
      * modules for which filter(qualified_name, module) or torchao's form
        module_filter_fn(module, qualified_name) returns False;
      * subclasses of nn.Linear (attention's out_proj, whose weight is read directly).
    Returns the model (a new module when ``model`` itself is a linear), or (model, ConversionReport)
    with return_report=True; the report's summary is also logged (logger "octet.torch", INFO)."""
    cfg = linear_recipe(recipe)
    heads = set()
    if keep_output_head:
        get = getattr(model, "get_output_embeddings", None)
        head = get() if callable(get) else None
        if head is not None:
            heads.add(id(head))
    report = ConversionReport(cfg.name, [], [], {})

    def swap(name, m):
        """The converted module, or None (with the reason recorded)."""
        linear = type(m) is nn.Linear
        if not (linear or _is_hf_conv1d(m)):
            if isinstance(m, nn.Linear) and not isinstance(m, Float8Linear):
                report.skipped[name or "<model>"] = (f"{type(m).__name__} subclasses nn.Linear (its weight may be "
                                                     "read directly)")
            return None
        if keep_output_head and (id(m) in heads or name.split(".")[-1] == "lm_head"):
            report.skipped[name] = "the output head stays in high precision (keep_output_head=False converts it)"
            return None
        if (filter is not None and not filter(name, m)) or (module_filter_fn is not None
                                                            and not module_filter_fn(m, name)):
            report.skipped[name] = "the filter left it out"
            return None
        new = Float8Linear.from_float(m, recipe=cfg, **kwargs) if linear else \
            Float8Conv1D.from_conv1d(m, recipe=cfg, **kwargs)
        report.converted.append(name)
        if not fits(cfg, new):
            report.padded.append(name)
        return new

    result = model
    top = swap("", model)
    if top is not None:
        result = top
    else:
        for parent_name, parent in list(model.named_modules()):
            for child_name, child in list(parent.named_children()):
                name = f"{parent_name}.{child_name}" if parent_name else child_name
                new = swap(name, child)
                if new is not None:
                    setattr(parent, child_name, new)
    import logging

    logging.getLogger("octet.torch").info("%s", report)
    return (result, report) if return_report else result


def linear_state(model: nn.Module) -> dict:
    """The per-step state of every Float8Linear of ``model`` that is not in its state_dict(): the
    amax histories (tensorwise_delayed) and the Philox pair (nvfp4), by qualified name. Save it
    beside the state dict for a bit-exact resume; load_linear_state() puts it back."""
    state = {}
    for name, m in model.named_modules():
        if isinstance(m, Float8Linear):
            for b, t in m.named_buffers(recurse=False):
                state[f"{name}.{b}" if name else b] = t.detach().clone()
    return state


def load_linear_state(model: nn.Module, state: dict) -> None:
    """Puts linear_state()'s tensors back into the Float8Linear modules of ``model``. Every entry must
    name a buffer of such a module, with its shape, and every such buffer must have an entry:
    anything else raises ValueError, and nothing is loaded."""
    own = linear_state(model)
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"octet.torch.load_linear_state: missing {missing}, unexpected {unexpected}; pass the "
                         "linear_state() of a model converted with the same recipes")
    for k, t in state.items():
        if tuple(t.shape) != tuple(own[k].shape):
            raise ValueError(f"octet.torch.load_linear_state: {k} has shape {tuple(t.shape)}, the model's "
                             f"{tuple(own[k].shape)}")
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        for k, t in state.items():
            buffers[k].copy_(t)


def sync_amax_histories(model: nn.Module, group=None) -> int:
    """Delayed scaling under data parallelism: replaces the newest amax of every history of
    ``model``'s tensorwise_delayed layers (X, W and dY of each) by its maximum over the ranks of
    ``group``, in one all-reduce for all layers together (as Transformer Engine and torchao reduce
    amaxes), so that every rank quantizes the next step with the same scales. Call it once per step,
    after the backward and before the next forward (the dY amax is pushed by the backward). Without
    an initialized process group it does nothing. Returns the number of amaxes reduced."""
    import torch.distributed as dist

    hists = [getattr(m, f"amax_history_{r}") for m in model.modules()
             if isinstance(m, Float8Linear) and m.recipe.delayed for r in "xwg"]
    if not hists or not (dist.is_available() and dist.is_initialized()):
        return 0
    newest = torch.stack([h[0] for h in hists])
    if dist.get_backend(group) == "nccl":  # NCCL reduces device tensors; the histories live on the CPU
        newest = newest.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(newest, op=dist.ReduceOp.MAX, group=group)
    newest = newest.cpu()
    with torch.no_grad():
        for h, v in zip(hists, newest):
            h[0] = v
    return len(hists)
