"""octet inside JAX: the quantizer, dequantize and the scaled GEMM as XLA FFI targets (CPU).

``import octet.jax`` loads ``_jax_ffi.so`` (from $OCTET_LIBRARY_DIR, else the package) with ctypes
and registers its handlers with ``jax.ffi.register_ffi_target(..., platform="cpu")``. The functions
below are built on ``jax.ffi.ffi_call`` and work under ``jax.jit``; the kernels are octet's host
paths, run on a thread pool the library owns (one per process, no thread started per call).

Recipes: tensorwise_e4m3, blockwise_1x128, blockwise_128x128, mxfp8_e4m3, nvfp4 (see RECIPES).
GEMM pairs: tensorwise_e4m3 x tensorwise_e4m3, blockwise_1x128 x blockwise_128x128,
mxfp8_e4m3 x mxfp8_e4m3, nvfp4 x nvfp4 (see PAIRS).

A quantized copy is a ``QuantizedArray`` (a pytree, so it passes in and out of jit; vmap is not
supported) in octet's layout (include/octet/quant/tensor.hpp, padded), as ``octet.torch`` passes
it: codes rows x ld (e4m3 as jnp.float8_e4m3fn) or rows x row_bytes (uint8, NVFP4 packed two per
byte); columns past ``cols`` are zero padding; scales scale_cols x scale_ld, the column-major scale grid (block
(bi, bj) at [bj, bi]) as float32, float8_e8m0fnu (MX) or float8_e4m3fn (NVFP4); tensor_scale one
float32 for NVFP4, zero elements otherwise.

Overflow differs from XLA's own cast: ``x.astype(jnp.float8_e4m3fn)`` sends a value beyond E4M3's
448 to NaN (e.g. ``jnp.float32(1000).astype(jnp.float8_e4m3fn)`` is NaN), while octet's recipes
saturate to +-448 (and their scales keep x / scale within range anyway).
"""

import ctypes
import os
from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from ._library import library_dirs

RECIPES = ("tensorwise_e4m3", "blockwise_1x128", "blockwise_128x128", "mxfp8_e4m3", "nvfp4")
PAIRS = (
    ("tensorwise_e4m3", "tensorwise_e4m3"),
    ("blockwise_1x128", "blockwise_128x128"),
    ("mxfp8_e4m3", "mxfp8_e4m3"),
    ("nvfp4", "nvfp4"),
)
_FLOAT_INPUTS = (jnp.float32, jnp.bfloat16)
_SCALE_DTYPES = (jnp.float32, jnp.float8_e8m0fnu, jnp.float8_e4m3fn)


def _load():
    name = "_jax_ffi.so"
    for d in library_dirs():
        path = os.path.join(d, name)
        if os.path.exists(path):
            lib = ctypes.CDLL(path)
            break
    else:
        raise ImportError(
            f"octet: the JAX FFI library {name} was not found in {library_dirs()}; install the package "
            "(pip install .) or point OCTET_LIBRARY_DIR at a build tree's python/lib"
        )
    for target, symbol in (("octet_quantize", "OctetJaxQuantize"), ("octet_dequantize", "OctetJaxDequantize"),
                           ("octet_scaled_mm", "OctetJaxScaledMm")):
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    lib.octet_jax_layout.argtypes = (ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64))
    lib.octet_jax_layout.restype = ctypes.c_int
    return lib


_lib = _load()


@dataclass(frozen=True)
class Layout:
    """Shapes and dtypes of a rows x cols copy in octet's layout (quant_layout_of<R>::make, asked of
    the library itself so that Python never re-derives the padding rules)."""

    codes_shape: tuple
    codes_dtype: type
    scales_shape: tuple
    scales_dtype: type
    tensor_scale_shape: tuple
    bits: int
    block_rows: int  # 0: the whole extent
    block_cols: int


def _check_recipe(recipe, arg="recipe"):
    if not isinstance(recipe, str) or recipe not in RECIPES:
        raise ValueError(f"octet.jax: argument '{arg}' is {recipe!r}; pass one of {', '.join(RECIPES)}")


def layout(recipe: str, rows: int, cols: int) -> Layout:
    _check_recipe(recipe)
    out = (ctypes.c_int64 * 9)()
    if _lib.octet_jax_layout(recipe.encode(), int(rows), int(cols), out) != 0:
        raise ValueError(f"octet.jax.layout: no layout for recipe {recipe!r} and shape {rows} x {cols}")
    code_rows, code_cols, scale_cols, scale_ld, ts, bits, storage, br, bc = list(out)
    return Layout((code_rows, code_cols), jnp.float8_e4m3fn if bits == 8 else jnp.uint8, (scale_cols, scale_ld),
                  _SCALE_DTYPES[storage], (ts,), bits, br, bc)


@jax.tree_util.register_pytree_node_class
@dataclass(frozen=True)
class QuantizedArray:
    """One quantized copy of a rows x cols matrix (module docstring: the layout). ``amax`` is the
    largest finite |x| the quantizer saw (float32 scalar; what delayed scaling records)."""

    codes: jax.Array
    scales: jax.Array
    tensor_scale: jax.Array
    amax: jax.Array
    recipe: str
    cols: int

    @property
    def shape(self):
        return (self.codes.shape[0], self.cols)

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        return dequantize(self, dtype)

    def tree_flatten(self):
        return (self.codes, self.scales, self.tensor_scale, self.amax), (self.recipe, self.cols)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children, *aux)


def _check_dtype(x, dtypes, op, arg):
    if jnp.dtype(x.dtype) not in tuple(jnp.dtype(d) for d in dtypes):
        names = ", ".join(jnp.dtype(d).name for d in dtypes)
        raise TypeError(f"octet.jax.{op}: argument '{arg}' has dtype {jnp.dtype(x.dtype).name}; pass {names}")


def quantize(x: jax.Array, recipe: str, *, tensor_amax: Optional[jax.Array] = None) -> QuantizedArray:
    """Quantizes a 2-D float32/bfloat16 array with a named recipe (row-wise copy; the column-wise
    copy of x is ``quantize(x.T, recipe)``). ``tensor_amax`` (per-tensor and NVFP4 recipes): the amax
    to derive the tensor scale from (delayed scaling; may be traced); None measures it from x."""
    x = jnp.asarray(x)
    _check_dtype(x, _FLOAT_INPUTS, "quantize", "x")
    if x.ndim != 2:
        raise ValueError(f"octet.jax.quantize: argument 'x' has shape {x.shape}; pass a 2-D array (rows x cols)")
    _check_recipe(recipe)
    rows, cols = x.shape
    lay = layout(recipe, rows, cols)
    amax_in = jnp.asarray(-1.0 if tensor_amax is None else tensor_amax, jnp.float32)
    if amax_in.shape != ():
        raise ValueError(f"octet.jax.quantize: argument 'tensor_amax' has shape {amax_in.shape}; pass a scalar")
    call = jax.ffi.ffi_call("octet_quantize", (
        jax.ShapeDtypeStruct(lay.codes_shape, lay.codes_dtype),
        jax.ShapeDtypeStruct(lay.scales_shape, lay.scales_dtype),
        jax.ShapeDtypeStruct(lay.tensor_scale_shape, jnp.float32),
        jax.ShapeDtypeStruct((), jnp.float32),
    ))
    codes, scales, ts, amax = call(x, amax_in, recipe=recipe)
    return QuantizedArray(codes, scales, ts, amax, recipe, cols)


def _check_copy(q, op, arg):
    if not isinstance(q, QuantizedArray):
        raise TypeError(f"octet.jax.{op}: argument '{arg}' is a {type(q).__name__}; pass an octet.jax.QuantizedArray")
    _check_recipe(q.recipe, arg + ".recipe")
    lay = layout(q.recipe, q.codes.shape[0], q.cols)
    for part, shape, dtype in (("codes", lay.codes_shape, lay.codes_dtype), ("scales", lay.scales_shape, lay.scales_dtype),
                               ("tensor_scale", lay.tensor_scale_shape, jnp.float32)):
        v = getattr(q, part)
        if tuple(v.shape) != shape or jnp.dtype(v.dtype) != jnp.dtype(dtype):
            raise ValueError(f"octet.jax.{op}: argument '{arg}.{part}' is {jnp.dtype(v.dtype).name}{tuple(v.shape)}; "
                             f"a {q.shape[0]} x {q.cols} {q.recipe} copy has {jnp.dtype(dtype).name}{shape}")


def _check_out_dtype(dtype, op):
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise TypeError(f"octet.jax.{op}: argument 'dtype' is {jnp.dtype(dtype).name}; pass float32 or bfloat16")


def dequantize(q: QuantizedArray, dtype=jnp.float32) -> jax.Array:
    """decode(code) * scale for every element, one rounding to dtype (float32 or bfloat16)."""
    _check_copy(q, "dequantize", "q")
    _check_out_dtype(dtype, "dequantize")
    call = jax.ffi.ffi_call("octet_dequantize", jax.ShapeDtypeStruct(q.shape, dtype))
    return call(q.codes, q.scales, q.tensor_scale, recipe=q.recipe)


def scaled_mm(a: QuantizedArray, b: QuantizedArray, *, alpha: float = 1.0, dtype=jnp.float32) -> jax.Array:
    """alpha * dequant(a) @ dequant(b).T with octet's host GEMM (its numerics contract and error bound:
    include/octet/gemm/scaled_gemm.hpp). a is the copy of an M x K matrix, b that of an N x K matrix
    (a K x N weight w is passed as quantize(w.T, ...)); the result is M x N in dtype. alpha is static
    (a Python float compiled into the call)."""
    _check_copy(a, "scaled_mm", "a")
    _check_copy(b, "scaled_mm", "b")
    _check_out_dtype(dtype, "scaled_mm")
    if (a.recipe, b.recipe) not in PAIRS:
        served = ", ".join(f"{x} x {y}" for x, y in PAIRS)
        raise ValueError(f"octet.jax.scaled_mm: arguments 'a'/'b' have recipes {a.recipe} x {b.recipe}; "
                         f"the served pairs are {served}")
    if a.cols != b.cols:
        raise ValueError(f"octet.jax.scaled_mm: argument 'b' has K = {b.cols} columns but 'a' has K = {a.cols}; both "
                         "are K-major (a is M x K, b is N x K)")
    call = jax.ffi.ffi_call("octet_scaled_mm", jax.ShapeDtypeStruct((a.shape[0], b.shape[0]), dtype))
    return call(a.codes, a.scales, a.tensor_scale, b.codes, b.scales, b.tensor_scale, recipe_a=a.recipe,
                recipe_b=b.recipe, k=np.int64(a.cols), alpha=np.float32(alpha))
