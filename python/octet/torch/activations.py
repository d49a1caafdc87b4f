"""Activation compression: what the non-linear layers save for their backward, stored in FP8.

COAT's point (and DeepSeek-V3's practice): FP8 GEMMs alone barely move a training run's memory;
the tensors autograd keeps between forward and backward must shrink too. ``Float8Linear`` already
keeps only its FP8 copies. ``compress_activations(model)`` does the same for the non-linear layers
(GELU, SiLU, ReLU, LayerNorm, RMSNorm, and modules whose class names end in those, such as
Hugging Face's ``LlamaRMSNorm`` or ``GELUActivation``): every float tensor that autograd saves
while such a module runs its forward (the layer's input, the normalized values) is quantized with a
block-scaled recipe when saved and dequantized when the backward reads it. Parameters are never
compressed (they are stored anyway), nor are tensors under ``min_elements``, tensors whose last
dimension is shorter than one block (a LayerNorm's per-row mean and reciprocal deviation, [N, 1]),
or tensors of other dtypes.

Numerics (the recipe's own contract, tests/python/test_activations.py):
  * the backward is the float backward with each compressed tensor replaced by its dequantized
    value, bit for bit (for GELU, SiLU and ReLU: the float backward at the dequantized input or
    output; for LayerNorm: with the dequantized input and the exact per-row statistics);
  * the stored value x' of x satisfies, against float64, |x' - x| <= 2^-(m+1) |x| for x in the
    format's normal range at its block's scale S, and <= 2^(e_min - m - 1) S below it (half a unit in
    the last place; m mantissa bits, e_min the smallest normal exponent: E4M3 2^-4 |x| and 2^-10 S),
    where S <= 2 amax / max_finite for power-of-two rules (``mxfp8_e4m3_ceil``, the default: 1 x 32
    blocks, never saturates) and S = amax / max_finite for ``blockwise_1x128``; a NaN or an Inf
    makes its block NaN (the default non-finite policy), so it still reaches the gradient.

Cost: 1 byte per element plus one scale per block (1 x 32, UE8M0: 1/32 byte per element) instead
of 4 (float32) or 2 (bf16); ``bytes_saved`` and ``bytes_stored`` count what went through.
"""
from __future__ import annotations

import torch
from torch import nn

from ._quant import QuantizedTensor, quantize, recipe_info

# Modules whose saved tensors are compressed by default, by type and by class-name suffix.
DEFAULT_TYPES = tuple(t for t in (nn.GELU, nn.SiLU, nn.ReLU, nn.LayerNorm, getattr(nn, "RMSNorm", None)) if t)
DEFAULT_SUFFIXES = ("RMSNorm", "LayerNorm", "GELUActivation", "SiLUActivation", "GELU", "SiLU")

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


class _Stored:
    """A saved tensor in its compressed form."""

    __slots__ = ("q", "shape", "dtype")

    def __init__(self, q: QuantizedTensor, shape: torch.Size, dtype: torch.dtype):
        self.q, self.shape, self.dtype = q, shape, dtype


class compress_activations:
    """Stores the tensors that `model`'s non-linear layers save for backward in FP8.

    compress_activations(model, recipe="mxfp8_e4m3_ceil", modules=None, min_elements=1024)

    recipe: a row-wise block recipe of ``octet.torch.RECIPES`` whose blocks run along the last
    dimension (``mxfp8_e4m3_ceil``, ``mxfp8_e4m3``, ``blockwise_1x128``, ``mxfp6_e2m3``, ...);
    per-tensor and 2-D-block recipes are refused (one outlier would set the scale of everything).
    modules: None (the defaults above), or a function ``(name, module) -> bool`` choosing the
    modules whose forwards are compressed. min_elements: smaller saved tensors stay as they are.
    The hooks stay until ``remove()`` (or the end of a ``with`` block)."""

    def __init__(self, model: nn.Module, recipe: str = "mxfp8_e4m3_ceil", modules=None, min_elements: int = 1024):
        info = recipe_info(recipe)
        if info.block_rows != 1 or info.block_cols == 0:
            raise ValueError(f"compress_activations: argument 'recipe' is '{recipe}', whose blocks are not 1 x N "
                             "along the last dimension; pass a row-wise block recipe such as 'mxfp8_e4m3_ceil' "
                             "or 'blockwise_1x128'")
        if min_elements < 1:
            raise ValueError(f"compress_activations: argument 'min_elements' is {min_elements}; pass 1 or more")
        self.recipe, self.min_elements, self._block = recipe, int(min_elements), info.block_cols
        self.bytes_saved = 0   # bytes of the float tensors that were compressed
        self.bytes_stored = 0  # bytes of their compressed forms (codes and scales)
        self.bytes_kept = 0    # bytes of the tensors saved inside those modules as they were (not parameters)
        self.modules = []      # the qualified names of the modules compressed
        self._active = []      # the saved_tensors_hooks contexts entered, innermost last
        self._handles = []
        choose = modules if modules is not None else _default_choice
        for name, m in model.named_modules():
            if not choose(name, m):
                continue
            self.modules.append(name)
            self._handles.append(m.register_forward_pre_hook(self._enter))
            self._handles.append(m.register_forward_hook(self._exit, always_call=True))

    # -- the hooks ----------------------------------------------------------------------------
    def _enter(self, _module, _args):
        ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        ctx.__enter__()
        self._active.append(ctx)

    def _exit(self, _module, _args, _output):
        if self._active:
            self._active.pop().__exit__(None, None, None)

    def _pack(self, t: torch.Tensor):
        if isinstance(t, nn.Parameter) or isinstance(getattr(t, "_base", None), nn.Parameter):
            return t  # a parameter, or a view of one (W^T): stored anyway
        if t.dtype not in _FLOATS or t.dim() == 0 or t.numel() < self.min_elements or t.shape[-1] < self._block:
            self.bytes_kept += t.numel() * t.element_size()
            return t
        x = t.detach().reshape(-1, t.shape[-1])
        q, _, _ = quantize(x, self.recipe)
        self.bytes_saved += t.numel() * t.element_size()
        self.bytes_stored += q.codes.numel() * q.codes.element_size() + q.scales.numel() * q.scales.element_size()
        return _Stored(q, t.shape, t.dtype)

    @staticmethod
    def _unpack(s):
        if not isinstance(s, _Stored):
            return s
        return s.q.dequantize(s.dtype).reshape(s.shape)

    # -- lifetime -----------------------------------------------------------------------------
    def remove(self):
        """Removes the hooks (tensors already saved keep their compressed form)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False


def _default_choice(_name: str, m: nn.Module) -> bool:
    return isinstance(m, DEFAULT_TYPES) or type(m).__name__.endswith(DEFAULT_SUFFIXES)
