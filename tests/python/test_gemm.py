"""octet::scaled_mm: every served recipe pair against the float64 product of the exactly
dequantized operands, within octet's own error bound (octet/gemm/scaled_gemm.hpp, the host row of
the numerics contract, evaluated by gemm_error_bound); edge shapes; bad arguments; opcheck."""

import pytest
import torch

import octet.torch as ot
from gemm_oracle import dequantize64

_ops = torch.ops.octet


def _data(gen, rows, cols, decades=4):
    # Rows of very different magnitudes, so per-row/per-block scales matter.
    mag = torch.pow(10.0, (torch.rand(rows, 1, generator=gen) - 0.5) * decades)
    return torch.randn(rows, cols, generator=gen) * mag


def _pair(gen, ra, rb, m, n, k, decades=4):
    a, _, _ = ot.quantize(_data(gen, m, k, decades), ra)
    b, _, _ = ot.quantize(_data(gen, n, k, decades), rb)
    return a, b


def _check(d, a, b, *, alpha=1.0, beta=0.0, c=None, bias=None, out_dtype=torch.float32, promotion_interval=128):
    a64, b64 = dequantize64(a), dequantize64(b)
    exact = alpha * (a64 @ b64.t())
    abs_beta_c = 0.0
    if c is not None:
        exact = exact + beta * c.double()
        abs_beta_c = (beta * c.double()).abs()
    if bias is not None:
        exact = exact + bias.double()
    abs_products = a64.abs() @ b64.abs().t()
    bound = ot.gemm_error_bound(a.recipe, b.recipe, a.cols, abs_products, alpha=alpha, abs_beta_c=abs_beta_c,
                                abs_bias=0.0 if bias is None else bias.double().abs(), abs_exact=exact.abs(),
                                out_dtype=out_dtype, promotion_interval=promotion_interval)
    # float64's own summation error (K roundings of 2^-53 relative), far below the bound.
    bound = bound + a.cols * 2.0**-52 * abs(alpha) * abs_products
    assert d.shape == exact.shape and d.dtype == out_dtype
    err = (d.double() - exact).abs()
    assert torch.isfinite(d).all()
    assert (err <= bound).all(), f"max err/bound {(err / bound).max().item()}"
    return (err / bound).max().item()


@pytest.mark.parametrize("ra,rb", ot.SCALED_MM_PAIRS)
def test_every_served_pair_within_the_bound(gen, ra, rb):
    # Ragged: none of M, N, K is a multiple of a block (K = 300 cuts 128-, 32- and 16-blocks).
    a, b = _pair(gen, ra, rb, 37, 21, 300)
    _check(ot.scaled_mm(a, b), a, b)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ra,rb", [("blockwise_1x128", "blockwise_128x128"), ("nvfp4", "nvfp4"),
                                   ("tensorwise_e5m2", "tensorwise_e4m3")])
def test_epilogue_alpha_beta_c_bias(gen, ra, rb, out_dtype):
    a, b = _pair(gen, ra, rb, 19, 33, 260, decades=1)  # |D| stays far from fp16's overflow
    c = (torch.randn(19, 33, generator=gen) * 3).to(out_dtype)
    bias = torch.randn(33, generator=gen)
    d = ot.scaled_mm(a, b, bias=bias, c=c, alpha=0.75, beta=-1.5, out_dtype=out_dtype)
    _check(d, a, b, alpha=0.75, beta=-1.5, c=c, bias=bias, out_dtype=out_dtype)
    # A transposed C (columns contiguous) is read as it is.
    ct = c.t().contiguous().t()
    assert torch.equal(ot.scaled_mm(a, b, bias=bias, c=ct, alpha=0.75, beta=-1.5, out_dtype=out_dtype), d)


@pytest.mark.parametrize("promotion_interval", [1, 7, 32, 128, 4096])
def test_promotion_interval(gen, promotion_interval):
    a, b = _pair(gen, "tensorwise_e4m3", "tensorwise_e4m3", 9, 10, 1000)
    d = ot.scaled_mm(a, b, promotion_interval=promotion_interval)
    _check(d, a, b, promotion_interval=promotion_interval)


def test_variants_multiply_as_their_base_recipe(gen):
    x, w = _data(gen, 12, 96), _data(gen, 8, 96)
    for ra, rb in [("mxfp8_e4m3_ceil", "mxfp8_e5m2"), ("mxfp8_e5m2", "mxfp8_e4m3_ceil")]:
        a, _, _ = ot.quantize(x, ra)
        b, _, _ = ot.quantize(w, rb)
        _check(ot.scaled_mm(a, b), a, b)


def test_empty_shapes(gen):
    bias = torch.randn(5, generator=gen)
    # K = 0: the sum is empty, D is the bias (or zero).
    a, b = _pair(gen, "blockwise_1x128", "blockwise_128x128", 4, 5, 0)
    assert torch.equal(ot.scaled_mm(a, b, bias=bias), bias.expand(4, 5))
    assert torch.equal(ot.scaled_mm(a, b), torch.zeros(4, 5))
    a, b = _pair(gen, "nvfp4", "nvfp4", 3, 5, 0)
    assert torch.equal(ot.scaled_mm(a, b, bias=bias, out_dtype=torch.bfloat16), bias.bfloat16().expand(3, 5))
    # M = 0 and N = 0: empty results of the right shape.
    a, b = _pair(gen, "mxfp8_e4m3", "mxfp8_e4m3", 0, 5, 64)
    assert ot.scaled_mm(a, b, bias=bias).shape == (0, 5)
    a, b = _pair(gen, "tensorwise_e4m3", "tensorwise_e4m3", 3, 0, 64)
    assert ot.scaled_mm(a, b).shape == (3, 0)


def test_zeros_and_nan(gen):
    a, b = _pair(gen, "mxfp8_e4m3", "mxfp8_e5m2", 6, 7, 70)
    z, _, _ = ot.quantize(torch.zeros(6, 70), "mxfp8_e4m3")
    assert torch.equal(ot.scaled_mm(z, b), torch.zeros(6, 7))
    # A NaN or an Inf makes its block's scale NaN (the default non-finite policy), so it reaches
    # its row of D and nowhere else; per-tensor recipes: every output.
    x = _data(gen, 6, 70)
    x[2, 40] = float("nan")
    x[4, 3] = float("-inf")
    a, _, _ = ot.quantize(x, "mxfp8_e4m3")
    d = ot.scaled_mm(a, b)
    bad = (torch.arange(6) == 2) | (torch.arange(6) == 4)
    assert torch.isnan(d[bad]).all() and torch.isfinite(d[~bad]).all()
    a, _, _ = ot.quantize(x, "tensorwise_e4m3")
    bt, _, _ = ot.quantize(_data(gen, 7, 70), "tensorwise_e4m3")
    assert torch.isnan(ot.scaled_mm(a, bt)).all()


def test_large_values_stay_within_the_bound(gen):
    # Near E5M2's range: scales absorb the magnitude; products stay finite in float.
    x, w = _data(gen, 8, 200) * 1e30, _data(gen, 6, 200) * 1e-30
    a, _, _ = ot.quantize(x, "tensorwise_e5m2")
    b, _, _ = ot.quantize(w, "tensorwise_e5m2")
    _check(ot.scaled_mm(a, b), a, b)


def _raises(exc, match, fn):
    with pytest.raises(exc, match=match):
        fn()


def test_bad_arguments(gen):
    a, b = _pair(gen, "blockwise_1x128", "blockwise_128x128", 4, 6, 130)
    args = (a.codes, a.scales, a.tensor_scale, a.recipe, b.codes, b.scales, b.tensor_scale, b.recipe, 130)
    _raises(ValueError, "a pair this op does not serve.*tensorwise_e4m3 x tensorwise_e4m3",
            lambda: _ops.scaled_mm(*args[:3], "blockwise_128x128", *args[4:]))
    _raises(ValueError, "argument 'a_recipe'", lambda: _ops.scaled_mm(*args[:3], "fp8", *args[4:]))
    _raises(ValueError, "argument 'b_recipe'", lambda: _ops.scaled_mm(*args[:7], "nvfp5", 130))
    _raises(ValueError, "argument 'a_codes'", lambda: _ops.scaled_mm(*args[:8], 100))  # k does not fit the codes
    _raises(ValueError, "share K", lambda: ot.scaled_mm(a, _pair(gen, "blockwise_1x128", "blockwise_128x128",
                                                                  1, 6, 120)[1]))
    _raises(TypeError, "argument 'bias'", lambda: _ops.scaled_mm(*args, torch.zeros(6, dtype=torch.float64)))
    _raises(ValueError, "argument 'bias'", lambda: _ops.scaled_mm(*args, torch.zeros(5)))
    _raises(TypeError, "argument 'c'", lambda: _ops.scaled_mm(*args, None, torch.zeros(4, 6, dtype=torch.bfloat16),
                                                              beta=1.0))
    _raises(ValueError, "'C'", lambda: _ops.scaled_mm(*args, None, torch.zeros(4, 5), beta=1.0))
    _raises(ValueError, "strides", lambda: _ops.scaled_mm(*args, None, torch.zeros(8, 12)[::2, ::2], beta=1.0))
    _raises(ValueError, "beta", lambda: _ops.scaled_mm(*args, beta=1.0))  # beta without C
    _raises(ValueError, "alpha", lambda: _ops.scaled_mm(*args, alpha=float("inf")))
    _raises(TypeError, "argument 'out_dtype'", lambda: _ops.scaled_mm(*args, out_dtype=torch.float64))
    _raises(ValueError, "promotion_interval", lambda: _ops.scaled_mm(*args, promotion_interval=0))
    _raises(TypeError, "argument 'a_codes'", lambda: _ops.scaled_mm(a.codes.float(), *args[1:]))
    _raises(ValueError, "argument 'b_codes'",
            lambda: _ops.scaled_mm(*args[:4], b.codes.t().contiguous().t(), *args[5:]))
    _raises(ValueError, "argument 'b_scales'", lambda: _ops.scaled_mm(*args[:5], b.scales[:-1], *args[6:]))
    n, _ = _pair(gen, "nvfp4", "nvfp4", 4, 6, 130)
    _raises(ValueError, "argument 'a_tensor_scale'",
            lambda: _ops.scaled_mm(n.codes, n.scales, torch.zeros(0), "nvfp4", n.codes, n.scales, n.tensor_scale,
                                   "nvfp4", 130))


def test_opcheck(gen):
    samples = []
    for ra, rb, m, n, k in [("tensorwise_e4m3", "tensorwise_e5m2", 5, 7, 33), ("blockwise_1x128", "blockwise_1x128",
                                                                                 3, 4, 200),
                            ("nvfp4", "nvfp4", 6, 2, 48), ("mxfp6_e3m2", "mxfp6_e3m2", 2, 3, 70)]:
        a, b = _pair(gen, ra, rb, m, n, k)
        # Codes and one-byte scales travel as uint8 views (the op accepts both): opcheck's schema
        # test compares inputs with allclose, which torch does not implement for float8 dtypes.
        def raw(t):
            return t.view(torch.uint8) if t.element_size() == 1 else t

        base = (raw(a.codes), raw(a.scales), a.tensor_scale, ra, raw(b.codes), raw(b.scales), b.tensor_scale, rb, k)
        samples.append((base, {}))
        samples.append((base, {"bias": torch.randn(n, generator=gen), "c": torch.randn(m, n, generator=gen).bfloat16(),
                               "alpha": 2.0, "beta": 0.5, "out_dtype": torch.bfloat16, "promotion_interval": 32}))
    for args, kwargs in samples:
        torch.library.opcheck(_ops.scaled_mm, args, kwargs)
