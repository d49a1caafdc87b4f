"""The scaled GEMM: D = alpha * dequant(A) dequant(B)^T (+ beta C) + bias on quantized copies.

A is the quantized copy of an M x K matrix and B that of an N x K matrix (both K-major, as
octet/gemm/scaled_gemm.hpp says): a weight held as K x N is passed as its column-wise copy.
"""

import math
from typing import Optional

import torch

from .._library import load
from ._quant import QuantizedTensor, recipe_info

load("gemm")
_ops = torch.ops.octet

# The pairs octet::scaled_mm serves (python/csrc/registry.hpp's OCTET_TORCH_GEMM_PAIRS_*), as the op
# lists them; mxfp8_e4m3_ceil multiplies as mxfp8_e4m3.
_pair_names = _ops.scaled_mm_pairs()
SCALED_MM_PAIRS = tuple(zip(_pair_names[0::2], _pair_names[1::2]))


@torch.library.register_fake("octet::scaled_mm")
def _scaled_mm_fake(a_codes, a_scales, a_tensor_scale, a_recipe, b_codes, b_scales, b_tensor_scale, b_recipe, k,
                    bias=None, c=None, alpha=1.0, beta=0.0, out_dtype=torch.float32, promotion_interval=128):
    return a_codes.new_empty((a_codes.shape[0], b_codes.shape[0]), dtype=out_dtype)


def scaled_mm(a: QuantizedTensor, b: QuantizedTensor, *, bias: Optional[torch.Tensor] = None,
              out_dtype: torch.dtype = torch.float32, alpha: float = 1.0, c: Optional[torch.Tensor] = None,
              beta: float = 0.0, promotion_interval: int = 128) -> torch.Tensor:
    """alpha * dequant(a) dequant(b)^T (+ beta * c) + bias as an M x N tensor of out_dtype.

    a: M x K copy, b: N x K copy (pass a K x N weight's column-wise copy). bias: float32 [N];
    c: M x N of out_dtype. Sums are promoted to float every ``promotion_interval`` K elements
    (the numerics contract of octet/gemm/scaled_gemm.hpp; gemm_error_bound evaluates it)."""
    if a.cols != b.cols:
        raise ValueError(f"octet.torch.scaled_mm: a is {a.shape[0]} x {a.cols} and b is {b.shape[0]} x {b.cols}; "
                         "both copies are K-major and must share K (pass a K x N weight's column-wise copy as b)")
    return _ops.scaled_mm(a.codes, a.scales, a.tensor_scale, a.recipe, b.codes, b.scales, b.tensor_scale, b.recipe,
                          a.cols, bias, c, float(alpha), float(beta), out_dtype, int(promotion_interval))


# ---- the numerics contract (octet::gemm_numerics_of / gemm_error_bound, host backend) ----

_MAX_FINITE = {"e4m3": 448.0, "e5m2": 57344.0, "e4m3fnuz": 240.0, "e5m2fnuz": 57344.0, "e2m3": 7.5, "e3m2": 28.0,
               "e2m1": 6.0}
_OUTPUT_UNIT = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
_OUTPUT_TINY = {torch.float32: 2.0**-150, torch.bfloat16: 2.0**-134, torch.float16: 2.0**-25}


def _gamma(n):
    u = 2.0**-24
    return n * u / (1 - n * u)


def gemm_segment(a_recipe: str, b_recipe: str, k: int, promotion_interval: int = 128):
    """(L, S): elements per promoted segment and their count, as the host backend cuts K."""
    g = 0
    for r in (a_recipe, b_recipe):
        bc = recipe_info(r).block_cols
        v = max(k, 1) if bc == 0 else bc  # a full-extent block covers K
        if 0 < v < k:
            g = v if g == 0 else math.gcd(g, v)
    if 0 < promotion_interval < k:
        g = promotion_interval if g == 0 else math.gcd(g, promotion_interval)
    length = max(k, 1) if g == 0 else g
    length = max(1, min(length, max(k, 1)))
    return length, (k + length - 1) // length


def gemm_error_bound(a_recipe: str, b_recipe: str, k: int, abs_products, *, alpha: float = 1.0, abs_beta_c=0.0,
                     abs_bias=0.0, abs_exact=0.0, out_dtype: torch.dtype = torch.float32,
                     promotion_interval: int = 128):
    """The host backend's bound on |D - exact| (octet::gemm_error_bound), element-wise.

    exact = alpha * sum_k dequant(A)_ik dequant(B)_jk + beta C_ij + bias_j in real arithmetic;
    abs_products = sum_k |dequant(A)_ik| |dequant(B)_jk| (float64 tensors broadcast)."""
    length, segments = gemm_segment(a_recipe, b_recipe, k, promotion_interval)
    acc = _gamma(length + segments)
    max_a = _MAX_FINITE[recipe_info(a_recipe).format]
    max_b = _MAX_FINITE[recipe_info(b_recipe).format]
    underflow = (segments + 2.0) * length * max_a * max_b * 2.0**-150 + 2.0**-148
    a = abs(alpha)
    before = (a * acc * abs_products + _gamma(3) * (a * (1 + acc) * abs_products + abs_beta_c + abs_bias)
              + a * underflow)
    return before + _OUTPUT_UNIT[out_dtype] * (abs_exact + before) + _OUTPUT_TINY[out_dtype]
