"""octet.jax: the quantizer, dequantize and scaled GEMM as XLA FFI targets, under jax.jit on CPU.

Oracles are independent of octet: codes and scales are decoded with ml_dtypes and numpy float64
(quantize -> dequantize within the format's half spacing; tensorwise codes bitwise equal to
ml_dtypes' float8_e4m3fn cast of x / scale), and scaled_mm is checked against a float64 product of
those decoded operands within the host GEMM's documented bound. Inputs come from the per-run seed
(np_rng, conftest.py).
"""

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import octet.jax as oj

# (element format facts for the half-spacing bound: mantissa bits, min normal exponent, max finite)
FORMAT = {"e4m3": (3, -6, 448.0), "e2m1": (1, 0, 6.0)}
RECIPE_FORMAT = {"tensorwise_e4m3": "e4m3", "blockwise_1x128": "e4m3", "blockwise_128x128": "e4m3",
                 "mxfp8_e4m3": "e4m3", "nvfp4": "e2m1"}
# (block rows, block cols), 0 = the whole extent; scale bytes
RECIPE_BLOCK = {"tensorwise_e4m3": (0, 0, 4), "blockwise_1x128": (1, 128, 4), "blockwise_128x128": (128, 128, 4),
                "mxfp8_e4m3": (1, 32, 1), "nvfp4": (1, 16, 1)}


def _ceil_div(a, b):
    return -(-a // b)


def expected_shapes(recipe, rows, cols):
    """octet's layout (quant/tensor.hpp) written out again for these recipes, as the oracle of the
    shapes octet.jax.layout asks the library for."""
    fp4 = RECIPE_FORMAT[recipe] == "e2m1"
    ld = _ceil_div(cols, 32 if fp4 else 16) * (32 if fp4 else 16)
    br, bc, sbytes = RECIPE_BLOCK[recipe]
    sr = 0 if rows == 0 else _ceil_div(rows, br or rows)
    sc = 0 if cols == 0 else _ceil_div(cols, bc or cols)
    per16 = 16 // sbytes
    sld = sr if sr <= 1 else _ceil_div(sr, per16) * per16
    return (rows, ld // 2 if fp4 else ld), (sc, sld), ((1,) if recipe == "nvfp4" else (0,))


def decode_codes(q):
    """Element values of the codes (unscaled), float64, rows x cols."""
    codes = np.asarray(q.codes)
    rows, cols = q.shape
    if q.recipe == "nvfp4":
        nibbles = np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(rows, -1)
        assert not nibbles[:, cols:].any(), "padding codes must be zero"
        return nibbles[:, :cols].view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    assert not np.asarray(codes.view(np.uint8))[:, cols:].any(), "padding codes must be zero"
    return codes[:, :cols].astype(np.float64)


def element_scales(q):
    """The effective scale of every element, float64 holding octet's float32 block scale."""
    rows, cols = q.shape
    br, bc, _ = RECIPE_BLOCK[q.recipe]
    br, bc = br or max(rows, 1), bc or max(cols, 1)
    sr, sc = _ceil_div(rows, br), _ceil_div(cols, bc)
    grid = np.asarray(q.scales).astype(np.float64)[:, :sr].T  # column-major grid: block (bi, bj) at [bj, bi]
    if q.recipe == "nvfp4":
        grid = (grid * np.float64(np.asarray(q.tensor_scale)[0])).astype(np.float32).astype(np.float64)
    assert grid.shape == (sr, sc)
    return np.repeat(np.repeat(grid, br, axis=0), bc, axis=1)[:rows, :cols]


def quantization_bound(x, S, fmt):
    """|dequant - x| allowed per element: half the format's spacing at |x| / S, times S, plus what
    saturation at max finite removes (mxfp8's floor scale rule and NVFP4's rounded E4M3 block scale
    can put |x| / S past max)."""
    mbits, emin, top = FORMAT[fmt]
    v = np.abs(x) / S
    e = np.maximum(np.floor(np.log2(np.minimum(np.maximum(v, 2.0**-200), top))), emin)
    half = 2.0 ** (e - mbits - 1)
    return S * (half + np.maximum(v - top, 0)) * (1 + 2.0**-20) + np.abs(x) * 2.0**-22


def random_matrix(rng, rows, cols, dtype=np.float32):
    # log-uniform magnitudes over a few decades so that blocks get different scales
    x = rng.standard_normal((rows, cols)) * np.exp(rng.uniform(-4, 4, (rows, 1)))
    return jnp.asarray(x.astype(np.float32), dtype)


@pytest.mark.parametrize("recipe", oj.RECIPES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape", [(3, 200), (130, 257), (1, 1)])
def test_quantize_dequantize_round_trip(np_rng, recipe, dtype, shape):
    x = random_matrix(np_rng, *shape, dtype)
    q = jax.jit(lambda x: oj.quantize(x, recipe))(x)
    codes_shape, scales_shape, ts_shape = expected_shapes(recipe, *shape)
    assert q.codes.shape == codes_shape and q.scales.shape == scales_shape and q.tensor_scale.shape == ts_shape
    assert q.codes.dtype == (jnp.uint8 if recipe == "nvfp4" else jnp.float8_e4m3fn)
    x64 = np.asarray(x).astype(np.float64)
    assert float(q.amax) == np.abs(x64).max()
    reference = decode_codes(q) * element_scales(q)  # exact in float64
    y = jax.jit(oj.dequantize)(q)
    assert y.shape == shape and y.dtype == jnp.float32
    # dequantize is decode(code) * S with one rounding to float32
    np.testing.assert_array_equal(np.asarray(y), reference.astype(np.float32))
    S = element_scales(q)
    flushed = S == 0
    if flushed.any():
        # only NVFP4's E4M3 block scale can underflow (block amax / 6 / tensor_scale <= 2^-10,
        # half E4M3's smallest subnormal); its block then stores zero codes (scale.hpp)
        assert recipe == "nvfp4" and not reference[flushed].any()
        ts = np.float64(np.asarray(q.tensor_scale)[0])
        assert (np.abs(x64[flushed]) / 6 / ts <= 2.0**-10 * (1 + 2.0**-20)).all()
    err = np.abs(reference - x64)[~flushed]
    bound = quantization_bound(x64[~flushed], S[~flushed], RECIPE_FORMAT[recipe])
    assert (err <= bound).all(), f"worst excess {np.max(err - bound)}"
    y16 = jax.jit(lambda q: oj.dequantize(q, jnp.bfloat16))(q)
    assert y16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y16, np.float64), reference, rtol=2.0**-8, atol=0)


def test_tensorwise_codes_match_ml_dtypes_cast(np_rng):
    x = random_matrix(np_rng, 64, 100)
    x = x.at[0, :4].set(jnp.asarray([0.0, -0.0, 1e-30, -3e-38]))  # zeros and values that flush
    q = jax.jit(lambda x: oj.quantize(x, "tensorwise_e4m3"))(x)
    x32 = np.asarray(x)
    S = np.asarray(q.scales)[0, 0]
    amax = np.float32(np.abs(x32).max())
    assert math.isclose(S, amax / np.float32(448), rel_tol=2.0**-22)
    expected = (x32 / S).astype(ml_dtypes.float8_e4m3fn)  # float32 division, then one RNE rounding
    codes = np.asarray(q.codes)[:, :100]
    # octet sends negative values that round to zero to +0 (the negative-zero code is their NaN
    # elsewhere); compare those as values, everything else bit for bit
    exp_bits, got_bits = expected.view(np.uint8), codes.view(np.uint8)
    neg_zero = exp_bits == 0x80
    np.testing.assert_array_equal(got_bits[~neg_zero], exp_bits[~neg_zero])
    assert (codes[neg_zero].astype(np.float32) == 0).all()


def test_xla_cast_overflows_to_nan_octet_saturates():
    """Documented difference: XLA's float32 -> float8_e4m3fn convert sends overflow to NaN, while
    octet's recipes saturate to +-448 * scale (here a stale delayed-scaling amax of 448 gives
    scale 1, so 1000 lies beyond E4M3's range)."""
    assert np.isnan(np.asarray(jnp.asarray(1000.0, jnp.float32).astype(jnp.float8_e4m3fn), np.float32))
    x = jnp.asarray([[1000.0, -1000.0, 3.0]], jnp.float32)
    q = jax.jit(lambda x, a: oj.quantize(x, "tensorwise_e4m3", tensor_amax=a))(x, jnp.float32(448.0))
    assert float(np.asarray(q.scales)[0, 0]) == 1.0
    np.testing.assert_array_equal(np.asarray(oj.dequantize(q)), [[448.0, -448.0, 3.0]])
    assert float(q.amax) == 1000.0  # the amax the quantizer saw, for the history


def test_traced_tensor_amax_matches_eager(np_rng):
    x = random_matrix(np_rng, 8, 64)
    amax = jnp.float32(0.5) * jnp.max(jnp.abs(x))
    for recipe in ("tensorwise_e4m3", "nvfp4"):
        jitted = jax.jit(lambda x, a: oj.quantize(x, recipe, tensor_amax=a).codes)(x, amax)
        eager = oj.quantize(x, recipe, tensor_amax=float(amax)).codes
        np.testing.assert_array_equal(np.asarray(jitted).view(np.uint8), np.asarray(eager).view(np.uint8))


@pytest.mark.parametrize("recipe", oj.RECIPES)
def test_nonfinite_and_zero_inputs(recipe):
    # The default non-finite policy: a block holding a NaN or an Inf dequantizes to NaN (every
    # element), the other blocks are untouched; per-tensor and 128 x 128 blocks hold both rows.
    x = jnp.asarray([[np.inf, 1.0, 2.0, 0.0, -1.0, 0.5], [3.0, 0.0, -1.0, 0.5, 0.0, 2.0],
                     [0.25, np.nan, 2.0, 0.0, -1.0, 4.0]], jnp.float32)
    y = np.asarray(oj.dequantize(oj.quantize(x, recipe)))
    assert np.isnan(y[0]).all() and np.isnan(y[2]).all()
    if recipe in ("tensorwise_e4m3", "blockwise_128x128"):
        assert np.isnan(y[1]).all()
    else:
        assert np.isfinite(y[1]).all() and y[1, 1] == 0.0
    zeros = oj.dequantize(oj.quantize(jnp.zeros((4, 40)), recipe))
    assert not np.asarray(zeros).any()


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (0, 0)])
def test_empty_shapes(shape):
    for recipe in oj.RECIPES:
        q = jax.jit(lambda x: oj.quantize(x, recipe))(jnp.zeros(shape, jnp.float32))
        assert q.codes.shape == expected_shapes(recipe, *shape)[0]
        assert oj.dequantize(q).shape == shape
    a = oj.quantize(jnp.ones((2, shape[1])), "tensorwise_e4m3")
    b = oj.quantize(jnp.ones((shape[0], shape[1])), "tensorwise_e4m3")
    d = oj.scaled_mm(a, b)
    assert d.shape == (2, shape[0]) and not np.asarray(d).any()  # K = 0 gives zeros


def gemm_bound(A, B, alpha, K, out_unit):
    """The host backend's bound (scaled_gemm.hpp) with L + S <= 2K, plus the epilogue's gamma_3
    and the output rounding."""
    u = 2.0**-24
    n = 2 * K + 4
    T = np.abs(A) @ np.abs(B).T
    exact = alpha * (A @ B.T)
    return exact, abs(alpha) * n * u / (1 - n * u) * T + out_unit * np.abs(exact) * 1.01 + 1e-38


@pytest.mark.parametrize("pair", oj.PAIRS, ids=lambda p: "x".join(p))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_scaled_mm_against_float64(np_rng, pair, dtype):
    M, N, K = 33, 20, 300  # ragged in every block size
    x = random_matrix(np_rng, M, K)
    w = random_matrix(np_rng, K, N)  # a K x N weight enters as the copy of w.T (N x K)
    alpha = 0.75

    @jax.jit
    def step(x, w):
        a, b = oj.quantize(x, pair[0]), oj.quantize(w.T, pair[1])
        return oj.scaled_mm(a, b, alpha=alpha, dtype=dtype), a, b

    d, a, b = step(x, w)
    assert d.shape == (M, N) and d.dtype == dtype
    A = decode_codes(a) * element_scales(a)
    B = decode_codes(b) * element_scales(b)
    exact, bound = gemm_bound(A, B, alpha, K, 2.0**-24 if dtype == jnp.float32 else 2.0**-8)
    err = np.abs(np.asarray(d, np.float64) - exact)
    assert (err <= bound).all(), f"worst excess {np.max(err - bound)}"
    # and the quantized product is near the float64 product of the inputs (the recipe's error)
    full = alpha * np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    rel = np.linalg.norm(np.asarray(d, np.float64) - full) / np.linalg.norm(full)
    # (each operand's elements round by at most E4M3's 2^-4 relative, so the product by at most about
    # 2 x 2^-4 norm-wise; 1x128 float scales measure about 0.04, MXFP8's power-of-two scales up to 0.063)
    assert rel < (0.2 if pair[0] == "nvfp4" else 2 * 2.0**-4)


# ---- bad input ----


def test_bad_inputs_raise_naming_the_argument():
    x = jnp.ones((4, 32), jnp.float32)
    with pytest.raises(TypeError, match="'x'.*float16"):
        oj.quantize(x.astype(jnp.float16), "tensorwise_e4m3")
    with pytest.raises(TypeError, match="'x'.*int32"):
        oj.quantize(jnp.ones((4, 32), jnp.int32), "tensorwise_e4m3")
    with pytest.raises(ValueError, match="'recipe'.*'fp3_nope'"):
        oj.quantize(x, "fp3_nope")
    with pytest.raises(ValueError, match="'x'.*2-D"):
        oj.quantize(jnp.ones((2, 3, 4)), "tensorwise_e4m3")
    q = oj.quantize(x, "tensorwise_e4m3")
    with pytest.raises(TypeError, match="'dtype'"):
        oj.dequantize(q, jnp.float16)
    with pytest.raises(ValueError, match="'q.codes'"):
        oj.dequantize(oj.QuantizedArray(q.codes[:, :8], q.scales, q.tensor_scale, q.amax, q.recipe, q.cols))
    with pytest.raises(ValueError, match="served pairs"):
        oj.scaled_mm(q, oj.quantize(x, "mxfp8_e4m3"))
    with pytest.raises(ValueError, match="'b' has K = 16"):
        oj.scaled_mm(q, oj.quantize(jnp.ones((4, 16)), "tensorwise_e4m3"))


def test_ffi_handlers_check_their_buffers():
    """A hand-made ffi_call bypasses the Python checks; the C++ handlers reject it with an error
    naming the argument (JaxRuntimeError, at execution)."""
    shapes = (jax.ShapeDtypeStruct((4, 16), jnp.float8_e4m3fn), jax.ShapeDtypeStruct((1, 1), jnp.float32),
              jax.ShapeDtypeStruct((0,), jnp.float32), jax.ShapeDtypeStruct((), jnp.float32))
    call = jax.ffi.ffi_call("octet_quantize", shapes)
    with pytest.raises(jax.errors.JaxRuntimeError, match="argument 'x' has element type float16"):
        jax.block_until_ready(call(jnp.ones((4, 16), jnp.float16), jnp.float32(-1), recipe="tensorwise_e4m3"))
    with pytest.raises(jax.errors.JaxRuntimeError, match="argument 'recipe' is 'nope'"):
        jax.block_until_ready(call(jnp.ones((4, 16), jnp.float32), jnp.float32(-1), recipe="nope"))
    with pytest.raises(jax.errors.JaxRuntimeError, match="argument 'scales' holds 4 bytes"):
        jax.block_until_ready(call(jnp.ones((4, 16), jnp.float32), jnp.float32(-1), recipe="blockwise_1x128"))
    q = oj.quantize(jnp.ones((4, 16)), "tensorwise_e4m3")
    deq = jax.ffi.ffi_call("octet_dequantize", jax.ShapeDtypeStruct((4, 16), jnp.float32))
    with pytest.raises(jax.errors.JaxRuntimeError, match="argument 'q_scales' has element type float32"):
        jax.block_until_ready(deq(q.codes, q.scales, q.tensor_scale, recipe="mxfp8_e4m3"))
    mm = jax.ffi.ffi_call("octet_scaled_mm", jax.ShapeDtypeStruct((4, 4), jnp.float32))
    with pytest.raises(jax.errors.JaxRuntimeError, match="recipe_a/recipe_b"):
        jax.block_until_ready(mm(q.codes, q.scales, q.tensor_scale, q.codes, q.scales, q.tensor_scale,
                                 recipe_a="tensorwise_e4m3", recipe_b="nvfp4", k=np.int64(16), alpha=np.float32(1)))
    with pytest.raises(jax.errors.JaxRuntimeError, match="argument 'a_codes' holds 64 bytes"):
        jax.block_until_ready(mm(q.codes, q.scales, q.tensor_scale, q.codes, q.scales, q.tensor_scale,
                                 recipe_a="tensorwise_e4m3", recipe_b="tensorwise_e4m3", k=np.int64(40),
                                 alpha=np.float32(1)))
