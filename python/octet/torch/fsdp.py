"""FP8 weight all-gather under FSDP2 for octet's Float8Linear.

``enable_fp8_all_gather(model)`` (before ``fully_shard``) makes each tensorwise, tensorwise_delayed,
blockwise, mxfp8 and nvfp4 Float8Linear's weight a tensor that FSDP2 all-gathers as E4M3 codes (nvfp4:
packed E2M1 codes) instead of floats, through
FSDP2's ``fsdp_pre_all_gather`` / ``fsdp_post_all_gather`` extension (tensorwise described; a
blockwise block is scaled by its own amax, and its scale travels with its codes):

  * before the all-gather, each rank quantizes its rows of W with the scale of the whole weight:
    the amax of W is the maximum over the ranks of their shards' amaxes, either all-reduced per
    weight when the all-gather needs it, or for all weights together in one all-reduce by
    ``precompute_fp8_scales(model)`` after the optimizer step. An E4M3 code depends only on its
    element and the scale, so the gathered codes are exactly those of the whole weight quantized at
    once: what a single-process Float8Linear computes;
  * the layer's forward then runs on the gathered copy (Y = X W^T on the row-wise codes, and the
    codes transposed as W^T's copy for the data gradient), so Y, dX and dW are those of a
    single-process Float8Linear, bit for bit (tests/python/test_fsdp.py).

A weight travels as 1 byte per element (plus its 4-byte scale): 0.5x bfloat16's all-gather, 0.25x
float32's. Dequantizing the gathered codes and letting the layer quantize them again would not be
bit-identical: the layer's scale fl(amax / 448) computed from the dequantized maximum
fl(448 fl(amax / 448)) differs from the original scale for about 11% of float32 values.

Recipes: tensorwise (current scaling); tensorwise_delayed (each rank quantizes its rows with the
scale of the layer's weight amax history, the same on every rank because the amax each step pushes
is the whole weight's; the first step, whose history is empty, with the whole weight's amax); and
blockwise (DeepSeek-V3's 128 x 128 weight blocks, each
scaled by its own amax: no all-reduce) where each rank's rows, out_features / world rounded up, are a
multiple of 128, so that every block lies on one rank; a blockwise weight sharded otherwise travels in
float. mxfp8 blocks its two copies along different dimensions (1 x 32 along a row of W for the forward,
32 x 1 down a column for the data gradient): the forward's all-gather carries the row-wise copy and
the backward's, when FSDP2 gathers the weight again for the backward (a layer that is itself a
fully_shard module resharding after forward), the column-wise copy; otherwise (the root's weights,
or a layer inside a sharded block) the forward's carries both. Each rank quantizes its rows both
ways; where out_features is a multiple of 32 x world and in_features of 32, its rows hold whole
blocks, so its codes and scales are the whole weight's. A weight of other shapes travels in float.
nvfp4 (E2M1 codes packed two to a byte, an E4M3 scale per 16 elements, and a float tensor scale
from the whole weight's amax: all-reduced as tensorwise's, or by precompute_fp8_scales) gathers like
mxfp8: the row-wise copy (1 x 16 blocks along a row) in the forward's all-gather, the column-wise copy
(W^T's 1 x 16 blocks, 16 x 1 down a column of W; W is not rotated: the layer's Hadamard rotation is
of X and dY along the tokens) in the backward's, or both in the forward's. Each rank quantizes its
rows; where its rows (out_features / world rounded up, FSDP2's padded shard) are a multiple of 16 they
hold whole column blocks, and a byte of W^T's codes holds two of one rank's rows, so the gathered
copies are the whole weight's, even and uneven shards alike. A copy travels as 0.5625 bytes an element
(codes and block scales) where the shards are even; FSDP2 wants an uneven shard's all-gather inputs in
the padded shard's shape, so there one copy travels as 1 byte an element and both as 2. Weights of
other shapes travel in float.
On one process FSDP2 gathers nothing (and copies only a first all-gather input): the weight is
passed as it is and the layer quantizes it, as one process does. A weight that fully_shard's
shard_placement_fn shards along dim 1 is refused at its first all-gather, on every rank, naming the
layer (ValueError).

save_checkpoint / load_checkpoint: torch.distributed.checkpoint of the model, the optimizer and the
layers' linear_state with a CRC-32 per row of every tensor; the load is staged and checked on every
rank before anything is assigned (see their docstrings).
"""

import os
import weakref
from typing import Dict, List

import torch
import torch.utils._pytree as pytree
from torch import nn

from ._gemm import scaled_mm
from ._quant import QuantizedTensor, _no_tensor_scale, layout, quantize
from .linear import (_PHILOX_STRIDE, Float8Linear, _forward_parts, _ops, _push_amax, _raw, _unpack, _widen,
                     linear_recipe)

# Recipes gathered quantized: tensorwise's and blockwise's column-wise copy is the row-wise copy
# transposed (one scale per tensor, or per 128 x 128 block); mxfp8's and nvfp4's travel as their own.
FP8_ALL_GATHER_RECIPES = ("tensorwise", "tensorwise_delayed", "blockwise", "mxfp8", "nvfp4")
_BLOCK = 128  # blockwise's weight blocks: 128 x 128
_MX = 32  # MXFP8's blocks: 1 x 32 in the row-wise copy, 32 x 1 (of W) in the column-wise one
_NV = 16  # NVFP4's blocks: 1 x 16 in the row-wise copy, 16 x 1 (of W) in the column-wise one

# The name enable_fp8_all_gather found each layer under (for errors)
_LAYER_NAMES: "weakref.WeakKeyDictionary[nn.Module, str]" = weakref.WeakKeyDictionary()

# Ops whose results stay sharded weights: how FSDP2 chunks, pads, moves and copies a parameter.
_PRESERVING_OPS = {
    torch.ops.aten.empty_like.default, torch.ops.aten.new_zeros.default, torch.ops.aten.slice.Tensor,
    torch.ops.aten.copy_.default, torch.ops.aten.view.default, torch.ops.aten.as_strided.default,
    torch.ops.aten._to_copy.default, torch.ops.aten._pin_memory.default, torch.ops.aten.split.Tensor,
    torch.ops.aten.clone.default, torch.ops.aten.chunk.default, torch.ops.aten.detach.default,
}


class Float8ShardedWeight(torch.Tensor):
    """A Float8Linear's weight (or FSDP2's shard of it) that FSDP2 all-gathers as E4M3 codes. It
    holds the float values (``_data``); every op but the all-gather sees them as a plain tensor."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, recipe: str, cols: int, layer=None):
        return torch.Tensor._make_wrapper_subclass(cls, data.size(), strides=data.stride(),
                                                   storage_offset=data.storage_offset(), dtype=data.dtype,
                                                   device=data.device, requires_grad=data.requires_grad)

    def __init__(self, data: torch.Tensor, recipe: str, cols: int, layer=None):
        self._data = data
        self._recipe = recipe
        self._cols = cols
        self._layer = layer  # weakref to the Float8Linear (tensorwise_delayed: its amax history)
        self._amax = None  # (amax, the shard's version when it was computed): precompute_fp8_scales

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        like = None

        def unwrap(t):
            nonlocal like
            like = t
            return t._data

        args, kwargs = pytree.tree_map_only(Float8ShardedWeight, unwrap, (args, kwargs or {}))
        out = func(*args, **kwargs)
        if func not in _PRESERVING_OPS:
            return out
        return pytree.tree_map_only(torch.Tensor,
                                    lambda t: Float8ShardedWeight(t, like._recipe, like._cols, like._layer), out)

    def __tensor_flatten__(self):
        return ["_data"], (self._recipe, self._cols, self._layer)

    @staticmethod
    def __tensor_unflatten__(inner, spec, outer_size, outer_stride):
        return Float8ShardedWeight(inner["_data"], *spec)

    def __repr__(self):
        return f"Float8ShardedWeight(recipe={self._recipe}, {self._data!r})"

    def __reduce_ex__(self, protocol):
        # Saved as the plain tensor of its values (torch.save, torch.distributed.checkpoint), so that a
        # checkpoint loads anywhere, weights_only included; loading copies values into the weight.
        return self._data.detach().clone().__reduce_ex__(protocol)

    def _global_amax(self, mesh) -> float:
        if self._amax is not None and self._amax[1] == self._data._version:
            return self._amax[0]
        import torch.distributed as dist

        a = _shard_amax(self._data).reshape(1)
        dist.all_reduce(a, op=dist.ReduceOp.MAX, group=mesh.get_group())
        return float(a)

    def fsdp_pre_all_gather(self, mesh, outer_size=None, outer_stride=None, module=None, mp_policy=None):
        if self._data.dim() != 2 or self._data.shape[1] != self._cols:
            # FSDP2 sharded another dimension (fully_shard's shard_placement_fn): a rank's codes would not
            # be rows of the whole weight's. Every rank raises here, before the all-gather.
            layer = self._layer() if self._layer is not None else None
            name = _LAYER_NAMES.get(layer, "?") if layer is not None else "?"
            raise ValueError(f"octet.enable_fp8_all_gather: layer '{name}' (recipe {self._recipe}, weight "
                             f"{tuple(outer_size) if outer_size is not None else '?'}) is sharded along dim 1 (this "
                             f"rank's shard is {tuple(self._data.shape)}); its FP8 all-gather gathers rows of the "
                             "weight, dim 0 (FSDP2's default Shard(0)): shard it along dim 0, or leave the layer "
                             "out of enable_fp8_all_gather")
        if mesh.size() == 1:
            # Nothing to gather, and FSDP2 copies only the first all-gather input on one rank: the
            # weight itself, which the layer quantizes as one process does.
            return (self._data,), "float"
        recipe = linear_recipe(self._recipe).w
        rows = self._data.shape[0]
        padded = -(-outer_size[0] // mesh.size()) if outer_size is not None else rows
        probe = _widen(self._data if rows else self._data.new_zeros(1, self._cols))
        if self._recipe == "blockwise" and padded % _BLOCK:
            # A block would straddle two ranks: this weight travels in float (the same on every rank).
            return (_pad_rows(self._data, padded),), "float"
        if self._recipe == "mxfp8":
            return self._mxfp8_inputs(mesh, outer_size, module, rows, padded, recipe, probe)
        if self._recipe == "nvfp4":
            return self._nvfp4_inputs(mesh, outer_size, module, rows, padded, probe)
        if self._recipe == "blockwise":
            # Each 128 x 128 block is scaled by its own amax, and FSDP2's shards (padded rows a multiple
            # of 128, checked above) hold whole blocks: the shard's blocks are the weight's. Its block
            # scales travel too, row-major (a row of blocks per 128 rows).
            q, _, _ = quantize(probe, recipe, rowwise=True)
            codes, grid, _ = q.raw()
            row_blocks = -(-rows // _BLOCK)
            scales = grid[:, :row_blocks].t()
            scales = torch.cat([scales, scales.new_zeros(padded // _BLOCK - row_blocks, scales.shape[1])])
            return (_pad_rows(codes[:rows], padded), scales.contiguous()), None
        amax = self._global_amax(mesh)
        if self._recipe == "tensorwise_delayed":
            # The scale of the history's max, as the layer's own forward takes it (the history is the
            # same on every rank: each step pushes the whole weight's amax, gathered_forward); an
            # empty history (the first step) scales with this step's amax of the whole weight.
            layer = self._layer() if self._layer is not None else None
            if layer is None:
                raise RuntimeError("octet: a tensorwise_delayed weight FSDP2 gathers in FP8 lost its Float8Linear "
                                   "(whose amax history scales it); call enable_fp8_all_gather on the model "
                                   "that owns the layer")
            hist = layer.amax_history_w
            if float(hist.max()) > 0:
                q, _, _ = quantize(probe, recipe, rowwise=True, amax_history=hist)
            else:
                q, _, _ = quantize(probe, recipe, rowwise=True, tensor_amax=amax)
            codes, scales, _ = q.raw()
            return (_pad_rows(codes[:rows], padded),), (scales, amax)
        # Quantized with the whole weight's amax: the codes of these rows are the whole weight's.
        q, _, _ = quantize(probe, recipe, rowwise=True, tensor_amax=amax)
        codes, scales, _ = q.raw()
        return (_pad_rows(codes[:rows], padded),), scales

    def _mxfp8_inputs(self, mesh, outer_size, module, rows, padded, recipe, probe):
        """MXFP8: the row-wise copy (1 x 32 blocks along a row) in the forward's all-gather and the
        column-wise copy (32 x 1 blocks down a column of W) in the backward's, each a byte per element
        and a byte per 32; both in the forward's when FSDP2 will not gather the weight again for the
        backward. Each rank quantizes its rows; they hold whole 32-row blocks, so its codes and
        scales are the whole weight's. Shapes where that fails travel in float (out_features a
        multiple of 32 x world and in_features a multiple of 32 take FP8: then both copies'
        all-gather inputs have the same sizes, as FSDP2 reuses its buffers across all-gathers)."""
        out_f = outer_size[0] if outer_size is not None else rows * mesh.size()
        if out_f % (_MX * mesh.size()) or self._cols % _MX or rows != padded:
            return (_pad_rows(self._data, padded),), "float"
        backward = torch._C._current_graph_task_id() != -1  # FSDP2's own test (is_bw)
        rowwise = not backward
        columnwise = backward or not _regathered_for_backward(module)
        q, qt, _ = quantize(probe, recipe, rowwise=rowwise, columnwise=columnwise)
        inputs = []
        if rowwise:  # W's codes [rows, in] and per-row block scales [rows, in / 32]
            codes, grid, _ = q.raw()
            inputs += [codes[:, :self._cols].contiguous(), grid[:, :rows].t().contiguous()]
        if columnwise:  # W^T's codes, as W's rows [rows, in], and its block scales [rows / 32, in]
            codes_t, grid_t, _ = qt.raw()
            inputs += [codes_t[:self._cols, :rows].t().contiguous(), grid_t[:, :self._cols].contiguous()]
        return tuple(inputs), ("mxfp8", rowwise, columnwise)

    def _nvfp4_inputs(self, mesh, outer_size, module, rows, padded, probe):
        """NVFP4: the row-wise copy (1 x 16 blocks along a row of W) in the forward's all-gather and
        the column-wise copy (1 x 16 blocks of W^T: 16 x 1 down a column of W) in the backward's, both
        in the forward's when FSDP2 will not gather the weight again for the backward (as MXFP8).
        Each rank quantizes its rows with the tensor scale of the whole weight's amax (all-reduced
        here, or by precompute_fp8_scales); its rows, padded to a multiple of 16, hold whole column
        blocks, so its codes and block scales are the whole weight's. Weights whose padded shard is
        not a multiple of 16 rows, or with one column, travel in float.
        The copies travel as one uint8 input: the packed E2M1 codes (half a byte an element) and the
        E4M3 block scales (a byte per 16), 0.5625 bytes an element per copy. FSDP2 wants an unevenly
        sharded weight's all-gather inputs in the padded shard's shape: there they travel as a
        (padded rows, in) tensor of uint8 (one copy: 1 byte an element) or int16 (both copies)."""
        world, in_f = mesh.size(), self._cols
        out_f = outer_size[0] if outer_size is not None else rows * world
        if padded % _NV or in_f < 2:
            return (_pad_rows(self._data, padded),), "float"
        backward = torch._C._current_graph_task_id() != -1  # FSDP2's own test (is_bw)
        rowwise = not backward
        columnwise = backward or not _regathered_for_backward(module)
        amax = self._global_amax(mesh)
        q, qt, _ = quantize(probe, "nvfp4", rowwise=rowwise, columnwise=columnwise, tensor_amax=amax)
        row_b, col_b = _nv_bytes(padded, in_f)
        parts = []
        if rowwise:  # W's packed codes [padded, in / 2] and per-row block scales [padded, in / 16]
            codes, grid, ts = q.raw()
            cb, sb = -(-in_f // 2), -(-in_f // _NV)
            parts += [_pad_rows(codes[:rows, :cb], padded), _pad_rows(grid[:sb, :rows].t().contiguous(), padded)]
        if columnwise:  # W^T's codes as W's rows [padded / 2, in] (bytes hold pairs of W's rows: a
            # rank's rows start on a multiple of 16), and its block scales [padded / 16, in]
            codes_t, grid_t, ts = qt.raw()
            take = min(-(-rows // 2), codes_t.shape[1])
            parts += [_pad_rows(codes_t[:in_f, :take].t().contiguous(), padded // 2),
                      _pad_rows(grid_t[:-(-rows // _NV), :in_f].contiguous(), padded // _NV)]
        flat = torch.cat([p.reshape(-1) for p in parts])
        uneven = padded * world != out_f
        if uneven:  # FSDP2: inputs in the padded shard's shape
            dtype = torch.int16 if rowwise and columnwise else torch.uint8
            shape = (padded, in_f)
        else:  # tight; a layer gathered again for the backward keeps one size for both copies
            dtype = torch.uint8
            need = row_b + col_b if rowwise and columnwise else max(row_b, col_b)
            shape = (padded, -(-need // padded))
        buf = flat.new_zeros(shape, dtype=dtype)
        buf.view(torch.uint8).reshape(-1)[:flat.numel()] = flat
        return (buf,), ("nvfp4", rowwise, columnwise, ts.clone(), padded, out_f)

    def fsdp_post_all_gather(self, outputs, metadata, param_dtype, *, out=None):
        if isinstance(metadata, str):  # gathered in float: the weight itself
            return None if out is not None else (outputs[0], tuple(outputs))
        if isinstance(metadata, tuple) and metadata[0] == "nvfp4":
            wq, wt = _nvfp4_copies(outputs[0], self._cols, *metadata[1:])
            if out is not None:
                out._nv = (wq, wt)
                return None
            w = Float8GatheredWeight(outputs[0], None, self._recipe, param_dtype, self._cols)
            w._nv = (wq, wt)
            return w, tuple(outputs)
        if isinstance(metadata, tuple) and metadata[0] == "mxfp8":
            _, rowwise, columnwise = metadata
            parts = list(outputs)
            row = (parts.pop(0), parts.pop(0)) if rowwise else None
            col = (parts.pop(0), parts.pop(0)) if columnwise else None
            if out is not None:
                out._mx_row, out._mx_col = row, col
                return None
            w = Float8GatheredWeight(outputs[0], None, self._recipe, param_dtype, self._cols)
            w._mx_row, w._mx_col = row, col
            return w, tuple(outputs)
        codes = outputs[0]
        scales = outputs[1] if self._recipe == "blockwise" else metadata
        w_amax = None
        if self._recipe == "tensorwise_delayed":
            scales, w_amax = metadata
        if out is not None:  # FSDP2 gathered into the buffers of the last call's weight again
            out._scales, out._w_amax = scales, w_amax
            return None
        return Float8GatheredWeight(codes, scales, self._recipe, param_dtype, self._cols, w_amax), tuple(outputs)


class Float8GatheredWeight(torch.Tensor):
    """The whole weight as FSDP2 gathered it: its row-wise E4M3 codes (``_codes``, out x ld) and
    scale (tensorwise_delayed: and ``_w_amax``, this step's amax of the whole weight, which the
    layer's forward pushes into its history). Only Float8Linear's forward reads it."""

    _fp8_gathered = True

    @staticmethod
    def __new__(cls, codes, scales, recipe, dtype, cols, w_amax=None):
        return torch.Tensor._make_wrapper_subclass(cls, (codes.shape[0], cols), dtype=dtype, device=codes.device,
                                                   requires_grad=False)

    def __init__(self, codes, scales, recipe, dtype, cols, w_amax=None):
        self._codes, self._scales, self._recipe, self._cols, self._w_amax = codes, scales, recipe, cols, w_amax
        # mxfp8: the gathered (codes, scales) of the row-wise copy and of the column-wise copy (as
        # W's rows), each None where this all-gather did not carry it
        self._mx_row = self._mx_col = None
        # nvfp4: (W's row-wise copy, W^T's row-wise copy) as QuantizedTensors, each None where this
        # all-gather did not carry it
        self._nv = None

    def _like(self, codes):
        w = Float8GatheredWeight(codes, self._scales, self._recipe, self.dtype, self._cols, self._w_amax)
        w._mx_row, w._mx_col, w._nv = self._mx_row, self._mx_col, self._nv
        return w

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        kwargs = kwargs or {}
        t = args[0]
        if func == torch.ops.aten.detach.default:
            return t._like(t._codes)
        if func == torch.ops.aten.as_strided.default:  # FSDP2 drops the padding rows of uneven shards
            size = tuple(args[1])
            offset = args[3] if len(args) > 3 else kwargs.get("storage_offset", 0)
            if size[1:] == (t._cols,) and not offset:
                return t._like(t._codes[: size[0]])
        raise NotImplementedError(f"octet: {func} on an FP8-gathered weight; only Float8Linear's forward reads it "
                                  "(the weight FSDP2 gathered as E4M3 codes, see octet.torch.fsdp)")

    def __tensor_flatten__(self):
        return ["_codes", "_scales"], (self._recipe, self.dtype, self._cols, self._w_amax)

    @staticmethod
    def __tensor_unflatten__(inner, spec, outer_size, outer_stride):
        return Float8GatheredWeight(inner["_codes"], inner["_scales"], *spec)

    def copies(self):
        """(W's row-wise copy, W^T's row-wise copy): the same codes, transposed, with the same scales
        (a block (i, j) of W is the block (j, i) of W^T); mxfp8: the copies this all-gather carried
        (None for one it did not)."""
        w = linear_recipe(self._recipe).w
        if self._recipe == "mxfp8":
            return self._mx_copies(w)
        if self._recipe == "nvfp4":
            return self._nv
        out_f, in_f = self._codes.shape[0], self._cols
        ts = _no_tensor_scale(self._codes)
        (rows_t, ld_t), grid_t_shape, _ = layout(w, in_f, out_f)
        codes_t = self._codes.new_zeros(rows_t, ld_t)
        codes_t[:, :out_f] = self._codes[:, :in_f].t()
        if self._recipe == "blockwise":  # self._scales: block (i, j) at [i, j]; octet's grids are column-major
            _, grid_shape, _ = layout(w, out_f, in_f)
            row_blocks, col_blocks = -(-out_f // _BLOCK), -(-in_f // _BLOCK)
            blocks = self._scales[:row_blocks, :col_blocks]
            grid = blocks.new_zeros(grid_shape)
            grid[:col_blocks, :row_blocks] = blocks.t()
            grid_t = blocks.new_zeros(grid_t_shape)
            grid_t[:row_blocks, :col_blocks] = blocks
        else:
            grid = grid_t = self._scales
        wq = QuantizedTensor(self._codes.view(torch.float8_e4m3fn), grid, ts, w, in_f)
        wt = QuantizedTensor(codes_t.view(torch.float8_e4m3fn), grid_t, ts, w, out_f)
        return wq, wt


    def _mx_copies(self, w):
        out_f, in_f = self.shape
        ts = _no_tensor_scale(self._codes)
        wq = wt = None
        if self._mx_row is not None:
            codes, scales = self._mx_row  # [out, in], [out, in / 32]
            (_, ld), grid_shape, _ = layout(w, out_f, in_f)
            c = codes.new_zeros(out_f, ld)
            c[:, :in_f] = codes[:out_f]
            grid = scales.new_zeros(grid_shape)  # column-major: block (i, j) at [j, i]
            grid[:, :out_f] = scales[:out_f].t()
            wq = QuantizedTensor(c.view(torch.float8_e4m3fn), grid, ts, w, in_f)
        if self._mx_col is not None:
            codes, scales = self._mx_col  # W's rows [out, in], W^T's block scales [out / 32, in]
            (_, ld_t), grid_t_shape, _ = layout(w, in_f, out_f)
            c = codes.new_zeros(in_f, ld_t)
            c[:, :out_f] = codes[:out_f].t()
            grid = scales.new_zeros(grid_t_shape)  # block (i of in, j of out / 32) at [j, i]
            grid[:, :in_f] = scales[: grid_t_shape[0]]
            wt = QuantizedTensor(c.view(torch.float8_e4m3fn), grid, ts, w, out_f)
        return wq, wt


def _regathered_for_backward(module) -> bool:
    """Whether FSDP2 all-gathers the weights of ``module`` (the layer) again for the backward: the
    layer is itself a fully_shard module that reshards after forward (not the root, whose weights
    stay gathered). Where that cannot be told, False: the forward's all-gather then carries both of
    MXFP8's copies."""
    try:
        group = module._get_fsdp_state()._fsdp_param_group
        return group is not None and group.post_forward_mesh_info is group.mesh_info
    except (AttributeError, TypeError):
        return False


def _pad_rows(codes: torch.Tensor, rows: int) -> torch.Tensor:
    """FSDP2 gathers equal shards: an uneven one ends in rows of zero codes."""
    if codes.shape[0] == rows:
        return codes
    return torch.cat([codes, codes.new_zeros(rows - codes.shape[0], codes.shape[1])])


def _nv_bytes(padded: int, in_f: int):
    """Bytes of a rank's NVFP4 row-wise copy (codes [padded, in / 2], scales [padded, in / 16]) and
    column-wise copy (codes [padded / 2, in], scales [padded / 16, in])."""
    return padded * (-(-in_f // 2) + -(-in_f // _NV)), (padded // 2 + padded // _NV) * in_f


def _nvfp4_copies(gathered, in_f, rowwise, columnwise, ts, padded, out_f):
    """The whole weight's NVFP4 copies from the all-gather's output (each rank's payload of
    _nvfp4_inputs, one after another), in octet's layout: what quantize(W, "nvfp4", rowwise=True,
    columnwise=True) of the whole weight gives, bit for bit; None for a copy not carried."""
    world = gathered.shape[0] // padded
    chunks = gathered.reshape(world, -1).view(torch.uint8)
    cb, sb = -(-in_f // 2), -(-in_f // _NV)
    at, wq, wt = 0, None, None

    def take(rows, cols):
        nonlocal at
        part = chunks[:, at:at + rows * cols].reshape(world * rows, cols)
        at += rows * cols
        return part

    if rowwise:
        codes, scales = take(padded, cb)[:out_f], take(padded, sb)[:out_f]
        (code_shape, grid_shape, _) = layout("nvfp4", out_f, in_f)
        c = codes.new_zeros(code_shape)
        c[:, :cb] = codes
        grid = codes.new_zeros(grid_shape)  # column-major: block (i, j) at [j, i]
        grid[:sb, :out_f] = scales.t()
        wq = QuantizedTensor(c, grid.view(torch.float8_e4m3fn), ts, "nvfp4", in_f)
    if columnwise:
        ob, os_ = -(-out_f // 2), -(-out_f // _NV)
        codes, scales = take(padded // 2, in_f)[:ob], take(padded // _NV, in_f)[:os_]
        (code_shape, grid_shape, _) = layout("nvfp4", in_f, out_f)
        c = codes.new_zeros(code_shape)
        c[:, :ob] = codes.t()
        grid = codes.new_zeros(grid_shape)  # W^T's block (i of in, j of out / 16) at [j, i]
        grid[:os_, :in_f] = scales
        wt = QuantizedTensor(c, grid.view(torch.float8_e4m3fn), ts, "nvfp4", out_f)
    return wq, wt


def _shard_amax(t: torch.Tensor) -> torch.Tensor:
    return t.detach().abs().amax().float() if t.numel() else torch.zeros((), device=t.device)


class _GatheredLinearFn(torch.autograd.Function):
    """Float8Linear's _Float8LinearFn with W's copies given (the gathered codes): X is quantized as
    the layer quantizes it (tensorwise_delayed: with x_hist's scale), Y = X W^T by the same scaled
    GEMM, and the backward is the layer's (pushing dY's amax into g_hist). Returns (Y, X's amax)."""

    @staticmethod
    def forward(ctx, x, weight, bias, seed, x_hist, g_hist, layer):
        cfg = linear_recipe(weight._recipe)
        wq, wt = weight.copies()
        if wq is None:
            raise RuntimeError("octet: the FP8-gathered weight holds no row-wise copy in the forward (FSDP2 gathered "
                               "it for a backward)")
        if cfg.hadamard_wgrad:
            # nvfp4: X's copies as the layer's forward makes them (X^T's of the Hadamard-rotated X,
            # padded to 16 tokens): the layer op itself, on a one-row stand-in weight it also
            # quantizes (X's copies do not depend on W), keeping X's row-wise copy for Y = X W^T.
            tokens, in_f = x.shape
            out = _ops.linear_forward(x, x.new_zeros(1, in_f), None, weight._recipe, None, None, seed, True, False,
                                      True, False)
            named = _unpack(out, _forward_parts(cfg, tokens, in_f, 1, True, False, True, False), x)
            x_t, xq, info = named["x_t"], named["x"], {"amax": named["x_amax"]}
        else:
            xq, x_t, info = quantize(x, cfg.x, rowwise=True, columnwise=True, amax_history=x_hist)
        y = scaled_mm(xq, wq, bias=bias)
        # mxfp8 gathered for a backward all-gather of its own: W^T's copy comes with that one
        ctx.save_for_backward(*_raw(x_t), *(_raw(wt) if wt is not None else []))
        ctx.layer = weakref.ref(layer) if wt is None else None
        ctx.recipe_name, ctx.seed, ctx.n_x = weight._recipe, seed, len(_raw(x_t))
        ctx.g_hist = g_hist  # written by the backward: a reference, not a saved tensor
        ctx.philox = layer.philox if cfg.stochastic_gradients else None  # advanced by the backward
        x_amax = info["amax"]
        ctx.mark_non_differentiable(x_amax)
        return y, x_amax

    @staticmethod
    def backward(ctx, dy, _dx_amax):
        saved = ctx.saved_tensors
        need_dx, need_dw, need_db = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        w_t = list(saved[ctx.n_x:])
        if need_dx and ctx.layer is not None:  # FSDP2 gathered the column-wise copy for this backward
            layer = ctx.layer()
            gathered = getattr(layer, "weight", None) if layer is not None else None
            _, wt = gathered.copies() if getattr(gathered, "_fp8_gathered", False) else (None, None)
            if wt is None:
                raise RuntimeError(f"octet: {ctx.recipe_name} all-gather: the backward found no column-wise copy of "
                                   "the weight (FSDP2 did not gather it again for the backward)")
            w_t = list(_raw(wt))
        copies = (list(saved[:ctx.n_x]) if need_dw else []) + (w_t if need_dx else [])
        dy = dy.float().contiguous() if dy.numel() else torch.zeros(dy.shape, dtype=torch.float32, device=dy.device)
        philox = None
        if ctx.philox is not None:  # nvfp4: draws from (seed, offset), then moves the layer's pair on
            philox = ctx.philox.clone()
            with torch.no_grad():
                ctx.philox.add_(torch.tensor([0, _PHILOX_STRIDE], device=philox.device))
        out = _ops.linear_backward(dy, copies, ctx.recipe_name, ctx.g_hist, ctx.seed, philox, need_dx, need_dw,
                                   need_db, False, False)
        at, grads = 0, []
        for need in (need_dx, need_dw, need_db):
            grads.append(out[at] if need else None)
            at += int(need)
        if ctx.g_hist is not None and (need_dx or need_dw):  # dY was quantized with the history's scale
            _push_amax(ctx.g_hist, out[at])
        return grads[0], grads[1], grads[2], None, None, None, None


def gathered_forward(layer: Float8Linear, x2d: torch.Tensor) -> torch.Tensor:
    """Float8Linear.forward's GEMMs on a weight FSDP2 gathered as E4M3 codes (float32, 2-D)."""
    if layer.keep_operands or layer.collect_stats:
        raise ValueError("octet.torch.Float8Linear: keep_operands / collect_stats are not available while FSDP2 "
                         "gathers the weight in FP8 (enable_fp8_all_gather)")
    bias = None if layer.bias is None else _widen(layer.bias)
    x_hist = g_hist = None
    delayed = layer.recipe.delayed
    if delayed:
        x_hist, g_hist = layer.amax_history_x, layer.amax_history_g
    y, x_amax = _GatheredLinearFn.apply(x2d, layer.weight, bias, layer.seed, x_hist, g_hist, layer)
    if delayed and torch.is_grad_enabled():  # training steps record amaxes, as Float8Linear.forward does
        _push_amax(x_hist, x_amax)
        _push_amax(layer.amax_history_w, torch.tensor(layer.weight._w_amax, dtype=torch.float32))
    return y


def enable_fp8_all_gather(model: nn.Module) -> Dict[str, str]:
    """Makes every tensorwise, tensorwise_delayed, blockwise, mxfp8 and nvfp4 Float8Linear of ``model``
    all-gather its weight quantized (FP8; NVFP4's packed E2M1 codes) under FSDP2.
    Call it before ``fully_shard``. Returns {layer name: "fp8"} for the layers it changed and
    {layer name: the reason} for the Float8Linear layers it left to FSDP2's float all-gather."""
    from torch.distributed.tensor import DTensor

    report = {}
    for name, m in model.named_modules():
        if not isinstance(m, Float8Linear):
            continue
        if type(m) is not Float8Linear:
            report[name] = f"{type(m).__name__} keeps its float all-gather (its weight is stored transposed)"
        elif m.recipe.name not in FP8_ALL_GATHER_RECIPES:
            report[name] = (f"recipe {m.recipe.name} keeps its float all-gather (FP8 all-gather: "
                            f"{', '.join(FP8_ALL_GATHER_RECIPES)})")
        elif isinstance(m.weight, DTensor):
            raise ValueError(f"octet.enable_fp8_all_gather: layer '{name}' is already sharded; call it before "
                             "fully_shard")
        else:
            w = m.weight
            _LAYER_NAMES[m] = name
            if not isinstance(w, Float8ShardedWeight):
                m.weight = nn.Parameter(Float8ShardedWeight(w.detach(), m.recipe.name, w.shape[1], weakref.ref(m)),
                                        requires_grad=w.requires_grad)
            report[name] = {
                "blockwise": "fp8 where each rank's rows (out_features / world, rounded up) are a multiple of 128, "
                             "float elsewhere (a block would straddle two ranks)",
                "mxfp8": "fp8 where out_features is a multiple of 32 x world and in_features of 32 (the row-wise "
                         "copy in the forward's all-gather, the column-wise one in the backward's), float "
                         "elsewhere",
                "nvfp4": "nvfp4 where each rank's rows (out_features / world, rounded up) are a multiple of 16 "
                         "(the row-wise copy in the forward's all-gather, the column-wise one in the backward's), "
                         "float elsewhere",
            }.get(m.recipe.name, "fp8")
    return report


@torch.no_grad()
def precompute_fp8_scales(model: nn.Module) -> int:
    """Every FP8-gathered weight's amax (the maximum over the ranks of its shards'), in one
    all-reduce for all of them, so that FSDP2's next all-gathers need none; call it after the
    optimizer step. A weight changed after this call all-reduces its own amax again. Returns the
    number of weights."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    shards: List[Float8ShardedWeight] = []
    mesh = None
    for m in model.modules():
        w = getattr(m, "weight", None)
        if isinstance(w, DTensor) and isinstance(w._local_tensor, Float8ShardedWeight):
            shards.append(w._local_tensor)
            mesh = w.device_mesh
    if not shards:
        return 0
    amax = torch.stack([_shard_amax(s._data) for s in shards])
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=mesh.get_group())
    for s, a in zip(shards, amax.tolist()):
        s._amax = (a, s._data._version)
    return len(shards)


# ---- checked, staged checkpoints (torch.distributed.checkpoint) ----
#
# save_checkpoint writes beside the model's and the optimizer's state a "crc32" entry: for every
# tensor a CRC-32 per row (dim 0) of a DTensor sharded Shard(0) on a 1-D mesh, as an int64 DTensor
# sharded the same way (so that it reshards with the rows it checks), and one CRC-32 of the whole
# tensor otherwise. load_checkpoint reads everything into fresh tensors, checks every CRC-32 on every
# rank, and only when every rank found its bytes sound assigns them (set_optimizer_state_dict, then
# set_model_state_dict and load_linear_state); a failure on any rank raises the same ValueError on
# every rank, naming the tensor, its rows and the file holding them, and leaves the model and the
# optimizer as they were.


def _tree_leaves(x, prefix=""):
    """(key, leaf) of a nested dict / list state, keys joined with "." as torch.distributed.checkpoint
    flattens them."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _tree_leaves(v, f"{prefix}{k}.")
    elif isinstance(x, list):
        for k, v in enumerate(x):
            yield from _tree_leaves(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], x


def _by_rows(t) -> bool:
    from torch.distributed.tensor import DTensor, Shard

    return (isinstance(t, DTensor) and t.device_mesh.ndim == 1 and t.dim() >= 1
            and isinstance(t.placements[0], Shard) and t.placements[0].dim == 0)


def _first_row(t) -> int:
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    return compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)[1][0]


def _checksum(t: torch.Tensor, template: bool = False) -> torch.Tensor:
    """The "crc32" of one tensor (see above); template: the same shape, not computed."""
    from torch.distributed.tensor import DTensor

    from .optim import crc32_rows

    if _by_rows(t):
        local = t.to_local()
        rows = local.shape[0]
        values = [0] * rows if template else crc32_rows(local, rows, _first_row(t))
        crc = torch.tensor(values, dtype=torch.int64, device=local.device)
        return DTensor.from_local(crc, t.device_mesh, t.placements, run_check=False, shape=torch.Size(t.shape[:1]),
                                  stride=(1,))
    whole = t.full_tensor() if isinstance(t, DTensor) and not template else t
    return torch.tensor([0 if template else crc32_rows(whole, 1)[0]], dtype=torch.int64, device=t.device)


def _checksums(state, template: bool = False) -> Dict[str, torch.Tensor]:
    return {k: _checksum(v, template) for k, v in _tree_leaves(state) if isinstance(v, torch.Tensor)}


def _staged(x):
    """A copy of a state's structure whose tensors are fresh zeros, placed and sharded like the
    originals (what torch.distributed.checkpoint reads into)."""
    from torch.distributed.tensor import DTensor

    if isinstance(x, DTensor):
        local = x.to_local()
        fresh = torch.zeros(local.shape, dtype=local.dtype, device=local.device)
        return DTensor.from_local(fresh, x.device_mesh, x.placements, run_check=False, shape=x.shape,
                                  stride=x.stride())
    if isinstance(x, torch.Tensor):
        return torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    if isinstance(x, dict):
        return {k: _staged(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_staged(v) for v in x]
    return x


def _states(model: nn.Module, optimizer):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    from .linear import linear_state

    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer),
            "linear": linear_state(model)}


def save_checkpoint(model: nn.Module, optimizer, checkpoint_id, process_group=None) -> None:
    """torch.distributed.checkpoint.save of the model's and the optimizer's state (FSDP2, any
    optimizer) and of octet.torch.linear_state(model) (the Float8Linear amax histories that the
    model's state_dict() leaves out: the same on every rank), with a CRC-32 of every tensor's rows,
    which load_checkpoint checks."""
    import torch.distributed.checkpoint as dcp

    state = _states(model, optimizer)
    state["crc32"] = _checksums(state)
    dcp.save(state, checkpoint_id=checkpoint_id, process_group=process_group)


def _crc_keys(checkpoint_id):
    """The "crc32" entries a checkpoint holds (an empty set: none, or metadata unreadable here), and
    the metadata."""
    import torch.distributed.checkpoint as dcp

    try:
        metadata = dcp.FileSystemReader(checkpoint_id).read_metadata()
    except Exception:  # not a directory of files: checked by what dcp.load reads
        return None, None
    keys = {k[len("crc32."):] for k in metadata.state_dict_metadata if k.startswith("crc32.")}
    return keys, metadata


def _check_files(checkpoint_id, metadata) -> None:
    """Every file the checkpoint's metadata names exists and holds the bytes its items need (the
    same answer on every rank: they read the same files)."""
    need = {}
    for info in metadata.storage_data.values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(need.items()):
        path = os.path.join(os.fspath(checkpoint_id), name)
        have = os.path.getsize(path) if os.path.exists(path) else None
        if have is None or have < size:
            what = "is missing" if have is None else f"holds {have} bytes"
            raise ValueError(f"octet.torch.fsdp.load_checkpoint: checkpoint '{checkpoint_id}': the shard file {name} "
                             f"{what}, and its items need {size} (a copy cut short?); the model and the optimizer "
                             "are unchanged")


def _files_of(metadata, key, first, last) -> str:
    """The files that hold rows first..last of a checkpoint's tensor `key`."""
    if metadata is None or key not in metadata.state_dict_metadata:
        return ""
    files = set()
    for index, info in metadata.storage_data.items():
        if index.fqn != key:
            continue
        chunk = next((c for c in metadata.state_dict_metadata[key].chunks if tuple(c.offsets) == tuple(index.offset)),
                     None)
        start = chunk.offsets[0] if chunk is not None and len(chunk.offsets) else 0
        size = chunk.sizes[0] if chunk is not None and len(chunk.sizes) else 1
        if start <= last and first < start + size:
            files.add(info.relative_path)
    return f" (in {', '.join(sorted(files))})" if files else ""


def _check_staged(staged, crc_keys, metadata) -> List[str]:
    """What this rank finds wrong in what it read: each tensor whose rows fail their CRC-32."""
    found = []
    tensors = dict(_tree_leaves({k: v for k, v in staged.items() if k != "crc32"}))
    for key in sorted(crc_keys):
        t, saved = tensors.get(key), staged["crc32"].get(key)
        if not isinstance(t, torch.Tensor) or saved is None:
            continue
        got = _checksum(t)
        if _by_rows(t):
            got_local, saved_local = got.to_local(), saved.to_local()
            bad = (got_local != saved_local.to(got_local.device)).nonzero().reshape(-1)
            if bad.numel():
                first = _first_row(t)
                a, b = first + int(bad[0]), first + int(bad[-1])
                found.append(f"{key} rows {a}..{b} of {t.shape[0]}{_files_of(metadata, key, a, b)}")
        elif not torch.equal(got, saved.to(got.device)):
            found.append(f"{key}{_files_of(metadata, key, 0, max(t.shape[0] - 1, 0) if t.dim() else 0)}")
    return found


def _first_line(failure) -> str:
    x = failure[0] if isinstance(failure, tuple) else failure  # CheckpointException: (exception, traceback)
    text = str(x).strip()
    text = text.splitlines()[0].split(". ")[0] if text else ""  # torch's first sentence, not its advice
    return f"{type(x).__name__}: {text}"


def load_checkpoint(model: nn.Module, optimizer, checkpoint_id, process_group=None) -> None:
    """Loads what save_checkpoint wrote, on any number of processes (torch.distributed.checkpoint
    reshards), into the model (and its linear_state) and the optimizer; or raises ValueError on every
    rank and leaves both as they were: a shard file missing, cut short or unreadable, or tensor rows
    whose bytes fail their CRC-32 (named with their file). It holds a second copy of the state while
    loading. A checkpoint without CRC-32s (a plain dcp.save) loads staged but unchecked. A fresh
    optimizer (no state yet) is stepped once with lr 0 by torch's get_optimizer_state_dict to make
    its state; a failed load empties it again."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    from .linear import load_linear_state

    fn = "octet.torch.fsdp.load_checkpoint"
    fresh = not optimizer.state  # get_optimizer_state_dict steps it once with lr 0 to make its state
    try:
        live = _states(model, optimizer)
        crc_keys, metadata = _crc_keys(checkpoint_id)
        if metadata is not None:
            _check_files(checkpoint_id, metadata)
            if not any(k.startswith("linear.") for k in metadata.state_dict_metadata):
                live["linear"] = {}  # a plain dcp.save of the model and the optimizer
        staged = {k: _staged(v) for k, v in live.items()}
        tensors = dict(_tree_leaves(staged))
        crc_keys = {k for k in (crc_keys or ()) if isinstance(tensors.get(k), torch.Tensor)}
        staged["crc32"] = {k: _checksum(tensors[k], template=True) for k in sorted(crc_keys)}
        try:
            dcp.load(staged, checkpoint_id=checkpoint_id, process_group=process_group)
        except (CheckpointException, Exception) as e:  # CheckpointException (a BaseException) has every rank's
            failures = getattr(e, "failures", None) or {None: e}
            causes = "; ".join(f"{'' if r is None else f'rank {r}: '}{_first_line(x)}"
                               for r, x in sorted(failures.items(), key=lambda rx: rx[0] or 0))
            raise ValueError(f"{fn}: reading checkpoint '{checkpoint_id}' failed ({causes}): a shard file is damaged "
                             "or not this checkpoint's; the model and the optimizer are unchanged") from e
        found = _check_staged(staged, crc_keys, metadata)
        if dist.is_initialized():
            everyone = [None] * dist.get_world_size(process_group)
            dist.all_gather_object(everyone, found, group=process_group)
        else:
            everyone = [found]
        bad = [f"rank {r}: {x}" for r, xs in enumerate(everyone) for x in xs]
        if bad:
            raise ValueError(f"{fn}: checkpoint '{checkpoint_id}' is corrupted: {'; '.join(bad)} do not match their "
                             "CRC-32; the model and the optimizer are unchanged")
        set_optimizer_state_dict(model, optimizer, staged["optim"])
        set_model_state_dict(model, staged["model"])
        if staged["linear"]:
            load_linear_state(model, staged["linear"])
    except BaseException:
        if fresh:
            optimizer.state.clear()
        raise


__all__ = ["Float8ShardedWeight", "Float8GatheredWeight", "FP8_ALL_GATHER_RECIPES", "enable_fp8_all_gather",
           "precompute_fp8_scales", "gathered_forward", "save_checkpoint", "load_checkpoint"]
