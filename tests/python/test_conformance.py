"""octet's element conversions against torch's own float8 casts, on every float32 input.

Each of torch's float8 dtypes matches one octet mode; the sweep runs all 2^32 float32 bit
patterns through both and requires identical codes except where the two are documented to
differ (the table below; docs/python.md, "octet and torch's float8 casts"):

  torch dtype            octet format, rounding, overflow    differences
  float8_e4m3fn          e4m3, nearest_even, saturate        torch keeps a NaN's sign (0xFF); octet
                                                             encodes every NaN as 0x7F
  float8_e5m2            e5m2, nearest_even, to_nonfinite    the same for NaN (0xFF vs 0x7F)
  float8_e4m3fnuz        e4m3fnuz, nearest_even, to_nonfinite  none
  float8_e5m2fnuz        e5m2fnuz, nearest_even, to_nonfinite  none
  float8_e8m0fnu         ue8m0, nearest_even, to_nonfinite    ties (mantissa exactly 1.5 x 2^e): torch
                                                             rounds up, octet to the even code;
                                                             float32 subnormals: torch rounds them
                                                             by their bit pattern, octet by value

(torch saturates E4M3 overflow, Inf included, to +-448, which is octet's overflow::saturate;
for E5M2 it gives Inf, which is overflow::to_nonfinite.)
"""

import pytest
import torch

import octet.torch as ot

CHUNK = 1 << 24

MODES = [
    # (torch dtype, octet format, rounding, overflow)
    (torch.float8_e4m3fn, "e4m3", "nearest_even", "saturate"),
    (torch.float8_e5m2, "e5m2", "nearest_even", "to_nonfinite"),
    (torch.float8_e4m3fnuz, "e4m3fnuz", "nearest_even", "to_nonfinite"),
    (torch.float8_e5m2fnuz, "e5m2fnuz", "nearest_even", "to_nonfinite"),
    (torch.float8_e8m0fnu, "ue8m0", "nearest_even", "to_nonfinite"),
]


def _documented_difference(fmt, x, ours, theirs):
    """The inputs where octet and torch are documented to differ (the table above)."""
    bits = x.view(torch.int32)
    if fmt in ("e4m3", "e5m2"):  # a negative NaN: torch 0xFF, octet 0x7F
        neg_nan = torch.isnan(x) & (bits < 0)
        assert bool(((ours[neg_nan] == 0x7F) & (theirs[neg_nan] == 0xFF)).all())
        return neg_nan
    if fmt == "ue8m0":
        mantissa, exponent = bits & 0x7FFFFF, (bits >> 23) & 0xFF
        tie = (mantissa == 0x400000) & (exponent != 0xFF)
        # Where they differ at a tie, torch took the larger power of two: one code above octet's
        # even code, or NaN past 2^127.
        t = tie & (ours != theirs)
        assert bool(((theirs[t].int() == ours[t].int() + 1) | (theirs[t] == 0xFF)).all())
        return tie | ((exponent == 0) & (mantissa != 0))
    return torch.zeros_like(x, dtype=torch.bool)


def _chunks():
    base = torch.arange(CHUNK, dtype=torch.int32)
    for start in range(0, 1 << 32, CHUNK):
        # int32 arithmetic wraps, so base + start walks the bit patterns [start, start + CHUNK).
        yield (base + (start - (1 << 32) if start >= 1 << 31 else start)).view(torch.float32)


@pytest.mark.parametrize("dtype,fmt,rounding,overflow", [m[:4] for m in MODES], ids=[m[1] for m in MODES])
def test_every_float32_input_matches_torch(dtype, fmt, rounding, overflow):
    documented = 0
    for x in _chunks():
        ours = ot.cast(x, fmt, rounding=rounding, overflow=overflow)
        assert ours.dtype == dtype
        a, b = ours.view(torch.uint8), x.to(dtype).view(torch.uint8)
        if torch.equal(a, b):
            continue
        where = (a != b).nonzero().flatten()  # few: classify only these
        xd, ad, bd = x[where], a[where], b[where]
        bad = ~_documented_difference(fmt, xd, ad, bd)
        assert not bool(bad.any()), (
            f"{fmt}: {int(bad.sum())} codes differ from torch's, first at input bits "
            f"{int(xd.view(torch.int32)[bad.nonzero()[0]]) & 0xFFFFFFFF:#010x}")
        documented += where.numel()
    if fmt in ("e4m3", "e5m2"):
        assert documented == (1 << 23) - 1  # exactly the negative NaN bit patterns
    elif fmt == "ue8m0":
        assert documented > 0


@pytest.mark.parametrize("dtype,fmt,rounding,overflow", [m[:4] for m in MODES], ids=[m[1] for m in MODES])
def test_every_bf16_input_matches_torch(dtype, fmt, rounding, overflow):
    x = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    a = ot.cast(x, fmt, rounding=rounding, overflow=overflow).view(torch.uint8)
    # torch converts bf16 through float32 exactly, so the float32 cast is the oracle here.
    x32 = x.float()
    b = x32.to(dtype).view(torch.uint8)
    where = (a != b).nonzero().flatten()
    assert bool(_documented_difference(fmt, x32[where], a[where], b[where]).all())


@pytest.mark.parametrize("dtype,fmt", [(m[0], m[1]) for m in MODES], ids=[m[1] for m in MODES])
def test_every_code_decodes_like_torch(dtype, fmt):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    ours = ot.decode(codes.view(dtype), fmt)
    theirs = codes.view(dtype).float()
    both_nan = torch.isnan(ours) & torch.isnan(theirs)
    assert bool(((ours.view(torch.int32) == theirs.view(torch.int32)) | both_nan).all())
    assert bool((torch.isnan(ours) == torch.isnan(theirs)).all())
