"""Float64 oracles of quantized copies, written independently of octet's decoders: FP8 codes are
read with torch's float8 casts, FP6/FP4 codes are unpacked from octet's documented layout
(octet/quant/tensor.hpp) and valued from the format definitions; scales come from torch's casts of
the stored scales. Shared by test_gemm.py and test_linear.py."""

import torch

import octet.torch as ot

# (exponent bits, mantissa bits, bias) of the formats without Inf/NaN (OCP MX element formats).
_NARROW = {"e2m1": (2, 1, 1), "e2m3": (2, 3, 1), "e3m2": (3, 2, 3)}


def _narrow_values(fmt):
    e, m, bias = _NARROW[fmt]
    values = []
    for code in range(1 << (1 + e + m)):
        sign = -1.0 if code >> (e + m) else 1.0
        exp, man = (code >> m) & ((1 << e) - 1), code & ((1 << m) - 1)
        mag = man / 2**m * 2.0 ** (1 - bias) if exp == 0 else (1 + man / 2**m) * 2.0 ** (exp - bias)
        values.append(sign * mag)
    return torch.tensor(values, dtype=torch.float64)


def code_values(q):
    """rows x cols float64: the decoded (unscaled) codes of a copy."""
    info = ot.recipe_info(q.recipe)
    rows, cols = q.shape
    if info.bits == 8:
        return q.codes[:, :cols].to(torch.float64)
    b = q.codes.to(torch.int64)
    if info.bits == 4:  # two per byte, element j in the low nibble when j is even
        codes = torch.stack([b & 0xF, b >> 4], dim=2).reshape(rows, -1)
    else:  # four per three bytes, little-endian 24-bit groups, element j at bit 6 j
        g = b.reshape(rows, -1, 3)
        word = g[..., 0] | (g[..., 1] << 8) | (g[..., 2] << 16)
        codes = torch.stack([(word >> (6 * j)) & 0x3F for j in range(4)], dim=2).reshape(rows, -1)
    return _narrow_values(info.format)[codes[:, :cols]]


def element_scales(q):
    """rows x cols float64: the effective scale of every element (octet forms it in float)."""
    info = ot.recipe_info(q.recipe)
    rows, cols = q.shape
    if rows == 0 or cols == 0:
        return torch.zeros(rows, cols, dtype=torch.float64)
    grid = q.scales.to(torch.float32)  # scale_cols x scale_ld, block (bi, bj) at [bj, bi]
    if info.two_level:
        grid = grid * q.tensor_scale  # one float rounding, as octet's stored_scale_value
    br = rows if info.block_rows == 0 else info.block_rows
    bc = cols if info.block_cols == 0 else info.block_cols
    bi = torch.arange(rows) // br
    bj = torch.arange(cols) // bc
    return grid.to(torch.float64)[bj][:, bi].t()


def dequantize64(q):
    """The exact value of every element of a copy: decode(code) * scale in float64."""
    return code_values(q) * element_scales(q)
