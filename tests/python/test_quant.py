"""octet.torch's quantization ops: opcheck, layouts, codes and scales against independent oracles
(torch's float32 arithmetic and float8 casts, ml_dtypes' FP6/FP4 casts), dequantize, stochastic
rounding, torch.compile, and the errors bad input gets."""

import ml_dtypes
import numpy as np
import pytest
import torch

import octet.torch as ot

FP8_RECIPES = ["tensorwise_e4m3", "tensorwise_e5m2", "rowwise_e4m3", "columnwise_e4m3", "blockwise_1x128",
               "blockwise_128x128", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp8_e4m3_ceil"]
SUBBYTE_RECIPES = ["mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "nvfp4"]
MAX_FINITE = {"e4m3": 448.0, "e5m2": 57344.0, "e2m3": 7.5, "e3m2": 28.0, "e2m1": 6.0}
EMAX = {"e4m3": 8, "e5m2": 15, "e2m3": 2, "e3m2": 4, "e2m1": 2}
ML_DTYPES = {"e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn, "e2m1": ml_dtypes.float4_e2m1fn}
SHAPES = [(1, 1), (3, 40), (17, 130), (130, 33), (64, 256)]


def _unpack(codes: torch.Tensor, bits: int, cols: int) -> torch.Tensor:
    """One code per element from octet's packed rows (FP4: two per byte, low nibble first; FP6: four
    per little-endian 24-bit group)."""
    b = codes.view(torch.uint8).to(torch.int64)
    if bits == 4:
        out = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(b.shape[0], -1)
    else:
        g = b.reshape(b.shape[0], -1, 3)
        word = g[..., 0] | (g[..., 1] << 8) | (g[..., 2] << 16)
        out = torch.stack([(word >> (6 * k)) & 0x3F for k in range(4)], dim=-1).reshape(b.shape[0], -1)
    return out[:, :cols]


def _oracle_codes(x: torch.Tensor, s: torch.Tensor, fmt: str) -> torch.Tensor:
    """The codes of clamp(x / s) in float32, by torch's float8 casts or ml_dtypes (nearest-even)."""
    # A block scale that underflowed to zero (NVFP4's E4M3 block scales) gives zero codes.
    v = torch.where(s == 0, torch.zeros_like(x, dtype=torch.float32), x.float() / s)
    v = v.clamp(-MAX_FINITE[fmt], MAX_FINITE[fmt])
    if fmt in ("e4m3", "e5m2"):
        return v.to({"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]).view(torch.uint8).to(torch.int64)
    return torch.from_numpy(v.numpy().astype(ML_DTYPES[fmt]).view(np.uint8).astype(np.int64))


def _expand(scales_grid: torch.Tensor, info, rows, cols):
    br = rows if info.block_rows == 0 else info.block_rows
    bc = cols if info.block_cols == 0 else info.block_cols
    return scales_grid.repeat_interleave(max(br, 1), 0)[:rows].repeat_interleave(max(bc, 1), 1)[:, :cols]


def _check_scales(s: torch.Tensor, amax: torch.Tensor, info, fmt):
    """Each block scale obeys its recipe's rule (quant/recipe.hpp), computed independently."""
    mx = MAX_FINITE[fmt]
    if info.scale_dtype == torch.float32:  # amax_ratio<0>: s = amax / max_finite in float32
        expect = (amax / mx).clamp(min=2.0**-126)  # a zero block too: the smallest scale
        assert torch.equal(s, expect)
    elif info.two_level:  # NVFP4: s = e4m3(amax / 6 / ts) * ts, ts = tensor amax / (6 * 448)
        t_amax = amax.max()
        ts = (t_amax / (mx * 448.0)).clamp(min=2.0**-126) if t_amax > 0 else torch.tensor(1.0)
        raw = (amax / mx).clamp(min=2.0**-126)
        expect = torch.where(amax > 0, (raw / ts).to(torch.float8_e4m3fn).float() * ts, torch.zeros_like(amax))
        assert torch.equal(s, expect)  # a zero block: E4M3 code 0
    else:  # UE8M0 powers of two; pow2_floor: 2^(floor(log2 amax) - emax), pow2_ceil: smallest with amax/s <= max
        assert bool((torch.frexp(s).mantissa == 0.5).all())
        nz = amax > 0
        assert bool((s[~nz] == 2.0**-127).all())  # a zero block: the smallest scale, UE8M0 code 0
        e = torch.floor(torch.log2(amax[nz].double()))
        if info.name.endswith("_ceil"):
            assert bool((amax[nz] / s[nz] <= mx).all()) and bool((amax[nz] / (s[nz] / 2) > mx).all())
        else:
            assert torch.equal(s[nz].double(), torch.exp2(e - EMAX[fmt]))


@pytest.mark.parametrize("recipe", FP8_RECIPES + SUBBYTE_RECIPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_codes_and_scales_match_an_independent_oracle(recipe, shape, gen):
    rows, cols = shape
    info = ot.recipe_info(recipe)
    x = torch.randn(rows, cols, generator=gen) * torch.exp2(torch.randint(-8, 8, (rows, 1), generator=gen).float())
    x[0, 0] = 0.0
    row, col, res = ot.quantize(x, recipe, columnwise=True, collect_stats=True)
    for q, src in ((row, x), (col, x.t().contiguous())):
        r, c = src.shape
        cs, ss, ts = ot.layout(recipe, r, c)
        assert q.codes.shape == cs and q.scales.shape == ss and q.tensor_scale.shape == ts
        assert q.codes.dtype == info.code_dtype and q.scales.dtype == info.scale_dtype
        grid = q.block_scales()
        s = _expand(grid, info, r, c)
        br = r if info.block_rows == 0 else info.block_rows
        bc = c if info.block_cols == 0 else info.block_cols
        amax = torch.nn.functional.max_pool2d(src.abs()[None], (br, bc), ceil_mode=True)[0]
        _check_scales(grid, amax, info, info.format)
        got = (q.codes.view(torch.uint8)[:, :c].to(torch.int64) if info.bits == 8
               else _unpack(q.codes, info.bits, c))
        assert torch.equal(got, _oracle_codes(src, s, info.format))
        # dequantize = decode(code) * s, one float32 multiply (compared with torch's own decode).
        if info.bits == 8:
            dec = q.codes[:, :c].float() * s
            assert torch.equal(q.dequantize(), dec)
        else:
            assert torch.allclose(q.dequantize(), ot.decode(got.to(torch.uint8), info.format) * s, rtol=0, atol=0)
    st = res["rowwise"]
    assert st["elements"] == rows * cols and st["amax"] == float(x.abs().max())
    assert float(res["amax"]) == float(x.abs().max())


@pytest.mark.parametrize("recipe", ["tensorwise_e4m3", "blockwise_1x128", "mxfp8_e4m3", "nvfp4"])
def test_layout_mirror_matches_the_op_on_ragged_and_empty_shapes(recipe):
    # The op returns only what was asked for: each copy's codes and scales (and tensor scale for
    # two-level recipes), then amax, then the statistics when collected.
    n = 3 if ot.recipe_info(recipe).two_level else 2
    for rows, cols in [(0, 0), (0, 5), (5, 0), (1, 129), (129, 1), (200, 300)]:
        x = torch.ones(rows, cols)
        out = torch.ops.octet.quantize(x, recipe, True, True)
        shapes = [tuple(t.shape) for t in out]
        assert shapes[:n] == list(ot.layout(recipe, rows, cols)[:n])
        assert shapes[n:2 * n] == list(ot.layout(recipe, cols, rows)[:n])
        assert shapes[2 * n:] == [()]
        col_only = torch.ops.octet.quantize(x, recipe, False, True, collect_stats=True)
        assert [tuple(t.shape) for t in col_only] == shapes[n:] + [(2, 8)]
        if n == 3 and rows * cols == 0:  # an empty copy's tensor scale is 1 (amax 0), never unwritten
            assert out[2].item() == 1.0 and out[5].item() == 1.0 and col_only[2].item() == 1.0


def test_inputs_in_bf16_fp16_and_transposed_views_give_the_same_codes(gen):
    x = torch.randn(48, 64, generator=gen).bfloat16()
    ref, _, _ = ot.quantize(x.float(), "blockwise_1x128")
    got, _, _ = ot.quantize(x, "blockwise_1x128")
    assert torch.equal(got.codes.view(torch.uint8), ref.codes.view(torch.uint8))
    h = x.half()
    got16, _, _ = ot.quantize(h, "blockwise_1x128")
    ref16, _, _ = ot.quantize(h.float(), "blockwise_1x128")
    assert torch.equal(got16.codes.view(torch.uint8), ref16.codes.view(torch.uint8))
    xt = torch.randn(64, 48, generator=gen).t()  # column-major view: read in place, not copied
    a, _, _ = ot.quantize(xt, "mxfp8_e4m3")
    b, _, _ = ot.quantize(xt.contiguous(), "mxfp8_e4m3")
    assert torch.equal(a.codes.view(torch.uint8), b.codes.view(torch.uint8))


def test_single_rows_columns_and_empty_views_of_any_strides():
    x = torch.randn(40, 64)
    for v in (x[3:4], x[:, 5:6], x.t()[3:4], x.t()[:, 5:6], x[:0], x[:, :0], torch.empty(0, 7).t()):
        a, _, _ = ot.quantize(v, "tensorwise_e4m3")
        b, _, _ = ot.quantize(v.contiguous(), "tensorwise_e4m3")
        assert torch.equal(a.codes.view(torch.uint8), b.codes.view(torch.uint8))
        assert torch.equal(a.dequantize(), b.dequantize())


def test_stochastic_rounding_is_reproducible_and_unbiased(gen):
    x = torch.full((64, 128), 1.0) + torch.rand(64, 128, generator=gen) * 0.1
    a, _, _ = ot.quantize(x, "tensorwise_e4m3", rounding="stochastic", seed=7, offset=3, tensor_amax=448.0)
    b, _, _ = ot.quantize(x, "tensorwise_e4m3", rounding="stochastic", seed=7, offset=3, tensor_amax=448.0)
    c, _, _ = ot.quantize(x, "tensorwise_e4m3", rounding="stochastic", seed=8, offset=3, tensor_amax=448.0)
    assert torch.equal(a.codes.view(torch.uint8), b.codes.view(torch.uint8))
    assert not torch.equal(a.codes.view(torch.uint8), c.codes.view(torch.uint8))
    # Mean over 64 draws: E4M3 spacing at 1 is 1/8, so one draw's error is at most 1/8 and its
    # standard deviation at most 1/16; the mean of 64 has sd <= 1/128, test at 5 sd.
    acc = torch.zeros_like(x, dtype=torch.float64)
    for k in range(64):
        q, _, _ = ot.quantize(x, "tensorwise_e4m3", rounding="stochastic", seed=k, tensor_amax=448.0)
        acc += q.dequantize().double()
    assert float((acc / 64 - x.double()).abs().max()) < 5 / 128


def test_tensor_valued_amax_history_and_philox(gen):
    # amax_history and philox are tensor forms of tensor_amax and seed/offset (what a compiled
    # training step passes): the same codes as the scalar forms, and current scaling while a
    # history holds nothing positive (all zero, or a NaN).
    x = torch.randn(24, 80, generator=gen) * 3
    amax = float(x.abs().max())
    hist = torch.tensor([0.5, 2 * amax, 0.0, amax])

    def codes(**kw):
        q, _, info = ot.quantize(x, "tensorwise_e4m3", **kw)
        return q.codes.view(torch.uint8), q.scales, info["amax"]

    got, want = codes(amax_history=hist), codes(tensor_amax=2 * amax)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert got[2].item() == want[2].item() == torch.tensor(amax).item()  # the input's own amax, either way
    current = codes()
    for h in (torch.zeros(4), torch.tensor([1.0, float("nan")]), torch.empty(0)):
        got = codes(amax_history=h)
        assert torch.equal(got[0], current[0]) and torch.equal(got[1], current[1])
    kw = dict(rounding="stochastic", tensor_amax=448.0)
    a = codes(seed=11, offset=6, **kw)[0]
    b = codes(philox=torch.tensor([11, 6]), **kw)[0]
    c = codes(philox=torch.tensor([11, 7]), **kw)[0]
    assert torch.equal(a, b) and not torch.equal(a, c)
    torch.library.opcheck(torch.ops.octet.quantize.default, (x, "tensorwise_e5m2", True, True),
                          {"amax_history": hist, "philox": torch.tensor([1, 2]), "rounding": "stochastic"})
    with pytest.raises(ValueError, match="'amax_history'.*tensor_amax"):
        ot.quantize(x, "tensorwise_e4m3", tensor_amax=1.0, amax_history=hist)
    with pytest.raises(TypeError, match="'amax_history'"):
        ot.quantize(x, "tensorwise_e4m3", amax_history=hist.double())
    with pytest.raises(ValueError, match="'amax_history'"):
        ot.quantize(x, "tensorwise_e4m3", amax_history=hist.reshape(2, 2))
    with pytest.raises(TypeError, match="'philox'"):
        ot.quantize(x, "tensorwise_e4m3", philox=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="'philox'"):
        ot.quantize(x, "tensorwise_e4m3", philox=torch.tensor([1, 2, 3]))


def test_opcheck_every_op(gen):
    x = torch.randn(20, 70, generator=gen)
    for recipe in ["tensorwise_e4m3", "blockwise_1x128", "mxfp8_e5m2", "mxfp4", "nvfp4"]:
        torch.library.opcheck(torch.ops.octet.quantize.default, (x, recipe, True, True))
        torch.library.opcheck(torch.ops.octet.quantize.default, (x, recipe, False, True), {"collect_stats": True})
        q, _, _ = ot.quantize(x, recipe)
        # Ops that read codes take them as uint8 views (torch's schema check compares inputs with
        # allclose, which float8 tensors do not implement); the Python API passes such views.
        torch.library.opcheck(torch.ops.octet.dequantize.default, (*q.raw(), recipe, 70))
    torch.library.opcheck(torch.ops.octet.cast.default, (x, "e4m3"))
    torch.library.opcheck(torch.ops.octet.cast.default, (x, "e2m1", "stochastic", "saturate", 3, 4))
    torch.library.opcheck(torch.ops.octet.decode.default, (ot.cast(x, "e5m2").view(torch.uint8), "e5m2"))


def test_torch_compile_fullgraph(gen):
    def roundtrip(x):
        a, b, info = ot.quantize(x, "mxfp8_e4m3", columnwise=True)
        return a.dequantize(), b.dequantize(), info["amax"]

    def roundtrip_nvfp4(x):
        out = torch.ops.octet.quantize(x, "nvfp4", True, False)
        return torch.ops.octet.dequantize(out[0], out[1], out[2], "nvfp4", x.shape[1])

    x = torch.randn(32, 64, generator=gen)
    for fn in (roundtrip, roundtrip_nvfp4):
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
        want, got = fn(x), compiled(x)
        assert all(torch.equal(a, b) for a, b in zip(want, got)) if isinstance(want, tuple) else torch.equal(want, got)


def test_bad_input_raises_an_error_naming_the_argument():
    x = torch.randn(8, 32)
    with pytest.raises(TypeError, match="'x'"):
        ot.quantize(x.int(), "mxfp8_e4m3")
    with pytest.raises(ValueError, match="'x'.*dimensions"):
        torch.ops.octet.quantize(torch.randn(2, 3, 4), "mxfp8_e4m3")
    with pytest.raises(ValueError, match="'x'.*strides"):
        ot.quantize(torch.randn(8, 64)[:, ::2], "mxfp8_e4m3")
    with pytest.raises(ValueError, match="'x'.*strides"):  # broadcast rows are not quietly read as distinct rows
        ot.quantize(torch.randn(1, 64).expand(8, 64), "mxfp8_e4m3")
    with pytest.raises(ValueError, match="'recipe'.*mxfp8_e4m3"):
        ot.quantize(x, "mxfp9")
    with pytest.raises(ValueError, match="'rowwise/columnwise'"):
        ot.quantize(x, "mxfp8_e4m3", rowwise=False)
    for bad in (float("inf"), float("nan"), 1e300):  # 1e300 is finite as a double, Inf as the float32 amax
        with pytest.raises(ValueError, match="'tensor_amax'.*finite"):
            ot.quantize(x, "tensorwise_e4m3", tensor_amax=bad)
    with pytest.raises(ValueError, match="'amax_history'.*finite"):
        ot.quantize(x, "tensorwise_e4m3", amax_history=torch.tensor([1.0, float("inf")]))
    q, _, _ = ot.quantize(x, "mxfp8_e4m3")
    with pytest.raises(ValueError, match="'q_codes'"):
        torch.ops.octet.dequantize(q.codes, q.scales, q.tensor_scale, "mxfp8_e4m3", 100)
    with pytest.raises(TypeError, match="'dtype'"):
        torch.ops.octet.dequantize(q.codes, q.scales, q.tensor_scale, "mxfp8_e4m3", 32, torch.int32)
    with pytest.raises(ValueError, match="'format'"):
        ot.cast(x, "e9m9")
    with pytest.raises(ValueError, match="'overflow'"):
        ot.cast(x, "e2m1", overflow="to_nonfinite")
    with pytest.raises(ValueError, match="'x'.*contiguous"):
        ot.cast(x[:, ::2], "e4m3")
