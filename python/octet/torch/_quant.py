"""Quantization ops: cast/decode (element-wise), quantize/dequantize (block-scaled copies)."""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .._library import load

load("quant")
_ops = torch.ops.octet

# recipe_info's ids (python/csrc/octet_torch.hpp, format_names).
FORMATS = ("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz", "e2m3", "e3m2", "e2m1", "ue8m0")

# The recipes the ops take by name (python/csrc/registry.hpp's OCTET_TORCH_RECIPES).
RECIPES = tuple(_ops.recipe_names())


def cuda_kernels() -> bool:
    """Whether these op libraries were built with CUDA kernels: quantize, dequantize, scaled_mm and
    the AdamW ops then take CUDA tensors and run on torch's current stream (the other ops are
    CPU-only for now)."""
    return bool(_ops.cuda_kernels())


def code_dtype(fmt: str) -> torch.dtype:
    """The torch dtype that holds one code of a format (uint8 where torch has none)."""
    return {
        "e4m3": torch.float8_e4m3fn,
        "e5m2": torch.float8_e5m2,
        "e4m3fnuz": torch.float8_e4m3fnuz,
        "e5m2fnuz": torch.float8_e5m2fnuz,
        "ue8m0": torch.float8_e8m0fnu,
    }.get(fmt, torch.uint8)


_SCALE_DTYPES = (torch.float32, torch.float8_e8m0fnu, torch.float8_e4m3fn)
_info_cache = {}


@dataclass(frozen=True)
class RecipeInfo:
    name: str
    format: str
    bits: int
    block_rows: int  # 0: the whole extent
    block_cols: int
    scale_dtype: torch.dtype
    two_level: bool

    @property
    def code_dtype(self) -> torch.dtype:
        return code_dtype(self.format) if self.bits == 8 else torch.uint8


def recipe_info(recipe: str) -> RecipeInfo:
    if recipe not in _info_cache:
        fmt, bits, br, bc, storage, two = _ops.recipe_info(recipe)
        _info_cache[recipe] = RecipeInfo(recipe, FORMATS[fmt], bits, br, bc, _SCALE_DTYPES[storage], bool(two))
    return _info_cache[recipe]


for _r in RECIPES:  # at import: torch.compile then reads a dict instead of tracing the op
    recipe_info(_r)


def _ceil_div(a, b):
    return (a + b - 1) // b


def _block_count(b, n):
    if n == 0:
        return 0
    return _ceil_div(n, n if b == 0 else b)


def layout(recipe: str, rows, cols):
    """Shapes of a rows x cols copy in octet's layout (octet/quant/tensor.hpp, padded):
    (codes shape, scales shape, tensor_scale shape). Mirrors quant_layout_of<R>::make."""
    info = recipe_info(recipe)
    bits = info.bits
    group_codes, group_bytes, aligned = (2, 1, 32) if bits <= 4 else ((4, 3, 64) if bits <= 6 else (1, 1, 16))
    ld = _ceil_div(cols, aligned) * aligned
    code_cols = ld if bits == 8 else ld // group_codes * group_bytes
    scale_rows = _block_count(info.block_rows, rows)
    scale_cols = _block_count(info.block_cols, cols)
    per16 = 16 // info.scale_dtype.itemsize
    scale_ld = scale_rows if scale_rows <= 1 else _ceil_div(scale_rows, per16) * per16
    return (rows, code_cols), (scale_cols, scale_ld), ((1,) if info.two_level else (0,))


# ---- fake (meta) kernels: shapes and dtypes only, for torch.compile and FakeTensor ----


@torch.library.register_fake("octet::cast")
def _cast_fake(x, format, rounding="nearest_even", overflow="saturate", seed=0, offset=0):
    return x.new_empty(x.shape, dtype=code_dtype(format))


@torch.library.register_fake("octet::decode")
def _decode_fake(codes, format):
    return codes.new_empty(codes.shape, dtype=torch.float32)


def _copy_fake(x, recipe, rows, cols):
    info = recipe_info(recipe)
    cs, ss, ts = layout(recipe, rows, cols)
    out = [x.new_empty(cs, dtype=info.code_dtype), x.new_empty(ss, dtype=info.scale_dtype)]
    return out + [x.new_empty(ts, dtype=torch.float32)] if info.two_level else out


@torch.library.register_fake("octet::quantize")
def _quantize_fake(x, recipe, rowwise=True, columnwise=False, tensor_amax=-1.0, rounding="nearest_even",
                   seed=0, offset=0, collect_stats=False, amax_history=None, philox=None):
    rows, cols = x.shape
    out = (_copy_fake(x, recipe, rows, cols) if rowwise else []) + (_copy_fake(x, recipe, cols, rows) if columnwise
                                                                     else [])
    out.append(x.new_empty((), dtype=torch.float32))
    if collect_stats:
        out.append(x.new_empty((2, 8), dtype=torch.float64))
    return out


@torch.library.register_fake("octet::dequantize")
def _dequantize_fake(codes, scales, tensor_scale, recipe, cols, dtype=torch.float32):
    return codes.new_empty((codes.shape[0], cols), dtype=dtype)


# ---- Python API ----

STATS_FIELDS = ("amax", "elements", "saturated", "flushed_to_zero", "non_finite", "lost_to_nan",
                "signal_energy", "noise_energy")


@dataclass
class QuantizedTensor:
    """One quantized copy of a rows x cols matrix in octet's layout.

    codes: rows x ld (FP8 as torch's float8 dtype) or rows x row_bytes (uint8, FP6/FP4 packed);
    columns past ``cols`` are zero padding. scales: scale_cols x scale_ld, the column-major scale
    grid (block (bi, bj) at [bj, bi]). tensor_scale: one float32 for two-level recipes (NVFP4).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    tensor_scale: torch.Tensor
    recipe: str
    cols: int

    @property
    def shape(self) -> Tuple[int, int]:
        return (self.codes.shape[0], self.cols)

    def raw(self):
        """(codes, scales, tensor_scale) as ops take them: codes and one-byte scales as uint8 views
        (zero-copy; torch's op checks cannot compare float8 inputs)."""
        s = self.scales if self.scales.dtype == torch.float32 else self.scales.view(torch.uint8)
        return self.codes.view(torch.uint8), s, self.tensor_scale

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return _ops.dequantize(*self.raw(), self.recipe, self.cols, dtype)

    def block_scales(self) -> torch.Tensor:
        """The effective scale of every block as float32, scale_rows x scale_cols (row-major)."""
        info = recipe_info(self.recipe)
        rows, cols = self.shape
        sr, sc = _block_count(info.block_rows, rows), _block_count(info.block_cols, cols)
        s = self.scales.float()[:, :sr].t()
        if info.two_level:
            s = s * self.tensor_scale
        return s[:sr, :sc]


_no_scale = {}


def _no_tensor_scale(x):
    """The empty tensor_scale of a one-level copy (the op returns none): one per device, read only."""
    if torch.compiler.is_compiling():
        return x.new_empty(0, dtype=torch.float32)
    if x.device not in _no_scale:
        _no_scale[x.device] = torch.empty(0, device=x.device)
    return _no_scale[x.device]


def stats_dict(row: torch.Tensor) -> dict:
    """One row of quantize's stats as a dict (plus sqnr_db)."""
    d = {k: float(v) for k, v in zip(STATS_FIELDS, row.tolist())}
    for k in ("elements", "saturated", "flushed_to_zero", "non_finite", "lost_to_nan"):
        d[k] = int(d[k])
    noise = d["noise_energy"]
    import math

    d["sqnr_db"] = math.inf if noise == 0 else 10 * math.log10(d["signal_energy"] / noise)
    return d


def quantize(x: torch.Tensor, recipe: str, *, rowwise: bool = True, columnwise: bool = False,
             tensor_amax: Optional[float] = None, rounding: str = "nearest_even", seed: int = 0, offset: int = 0,
             collect_stats: bool = False, amax_history: Optional[torch.Tensor] = None,
             philox: Optional[torch.Tensor] = None):
    """Quantizes a 2-D float32/bf16/fp16 tensor with a named recipe.

    tensor_amax: the amax the tensor scale is sized for (delayed scaling; None: x's own amax).
    amax_history: a float32 1-D history instead, scaled with its max (x's own amax while the
    history is all zero). philox: an int64 tensor (seed, offset) instead of seed and offset for
    stochastic rounding. The tensor forms keep per-step values out of torch.compile's guards.

    Returns (rowwise copy or None, columnwise copy (of x^T) or None, info dict with 'amax' (the
    amax of x, a 0-d float32 tensor) and, when collect_stats, 'rowwise'/'columnwise' statistics)."""
    out = _ops.quantize.default(x, recipe, rowwise, columnwise,
                                -1.0 if tensor_amax is None else float(tensor_amax), rounding, seed, offset,
                                collect_stats, amax_history, philox)
    rows, cols = x.shape
    two_level = recipe_info(recipe).two_level
    at = 0
    copies = []
    for present, n in ((rowwise, cols), (columnwise, rows)):
        if not present:
            copies.append(None)
            continue
        ts = out[at + 2] if two_level else _no_tensor_scale(x)
        copies.append(QuantizedTensor(out[at], out[at + 1], ts, recipe, n))
        at += 3 if two_level else 2
    info = {"amax": out[at]}
    if collect_stats:
        if rowwise:
            info["rowwise"] = stats_dict(out[at + 1][0])
        if columnwise:
            info["columnwise"] = stats_dict(out[at + 1][1])
    return copies[0], copies[1], info


def cast(x: torch.Tensor, format: str, *, rounding: str = "nearest_even", overflow: str = "saturate",
         seed: int = 0, offset: int = 0) -> torch.Tensor:
    """Element-wise encode to a format: one code per element (torch's float8 dtype where one exists)."""
    return _ops.cast(x, format, rounding, overflow, seed, offset)


def decode(codes: torch.Tensor, format: str) -> torch.Tensor:
    """Element-wise decode of one-code-per-element codes to float32."""
    return _ops.decode(codes.view(torch.uint8), format)


def dequantize(q: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return q.dequantize(dtype)
