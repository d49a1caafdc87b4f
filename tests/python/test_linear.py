"""octet.torch.Float8Linear and convert(): forward, data gradient and weight gradient against float64
references of the exact quantized operands the layer used (within octet's GEMM bound) and against
the float64 linear (within each recipe's quantization tolerance); delayed scaling's amax history;
convert() on a small model; torch.compile(fullgraph=True); SGD on a tiny regression; the tensorwise
recipe against torchao's Float8Linear, a peer written without octet."""

import pytest
import torch
from torch import nn

import octet.torch as ot
from gemm_oracle import dequantize64

# Normwise relative tolerance against the float64 linear: u_A + u_B, with u = 2^-(mantissa bits + 1)
# the unit roundoff of each operand's element format (E4M3 2^-4, E5M2 2^-3, E2M1 2^-2). Block and
# tensor scales keep elements in their format's normal range, so each quantized operand is off by
# at most about u normwise, and two operands' errors add to first order (measured on these inputs:
# about a third of the tolerance; NVFP4's stochastic gradients about two thirds).
_U = {"e4m3": 2.0**-4, "e5m2": 2.0**-3, "e2m1": 2.0**-2}
_FORMAT = {"tensorwise_e4m3": "e4m3", "tensorwise_e5m2": "e5m2", "blockwise_1x128": "e4m3",
           "blockwise_128x128": "e4m3", "mxfp8_e4m3": "e4m3", "mxfp8_e5m2": "e5m2", "nvfp4": "e2m1"}


def _tolerance(ra, rb):
    return _U[_FORMAT[ra]] + _U[_FORMAT[rb]]


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def _within_gemm_bound(d, a, b, bias=None):
    """d = dequant(a) dequant(b)^T (+ bias) within octet's bound, d's dtype the output's."""
    a64, b64 = dequantize64(a), dequantize64(b)
    exact = a64 @ b64.t()
    abs_bias = 0.0
    if bias is not None:
        exact = exact + bias.double()
        abs_bias = bias.double().abs()
    abs_products = a64.abs() @ b64.abs().t()
    bound = ot.gemm_error_bound(a.recipe, b.recipe, a.cols, abs_products, abs_bias=abs_bias, abs_exact=exact.abs(),
                                out_dtype=d.dtype) + a.cols * 2.0**-52 * abs_products
    err = (d.double() - exact).abs()
    assert (err <= bound).all(), f"max err/bound {(err / bound).max().item()}"


def _layers(gen, recipe, in_f, out_f, dtype=torch.float32):
    ref = nn.Linear(in_f, out_f).double()
    with torch.no_grad():
        ref.weight.copy_(torch.randn(out_f, in_f, generator=gen) / in_f**0.5)
        ref.bias.copy_(torch.randn(out_f, generator=gen))
    lin = nn.Linear(in_f, out_f, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(ref.weight)
        lin.bias.copy_(ref.bias)
    return ot.Float8Linear.from_float(lin, recipe=recipe, seed=int(torch.randint(1 << 30, (1,), generator=gen))), ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recipe", list(ot.LINEAR_RECIPES))
def test_forward_and_gradients(gen, recipe, dtype):
    # Ragged: 3 x 43 = 129 tokens, 160 in, 96 out features (no multiple of 128 among them).
    layer, ref = _layers(gen, recipe, 160, 96, dtype)
    layer.keep_operands = True
    cfg = layer.recipe
    x = torch.randn(3, 43, 160, generator=gen).to(dtype).requires_grad_()
    for _ in range(2):  # the second step runs delayed scaling from its history
        x.grad = layer.weight.grad = layer.bias.grad = None
        y = layer(x)
        dy = torch.randn(y.shape, generator=gen).to(dtype)
        y.backward(dy)
    assert y.shape == (3, 43, 96) and y.dtype == dtype and x.grad.dtype == dtype
    ops = layer.last_operands
    # Against the exact quantized operands: each GEMM within octet's bound.
    _within_gemm_bound(y.reshape(-1, 96), ops["x"], ops["w"], bias=layer.bias.float())
    _within_gemm_bound(x.grad.reshape(-1, 160), ops["dy"], ops["w_t"])
    _within_gemm_bound(layer.weight.grad, ops["dy_t"], ops["x_t"])
    assert (ops["x"].recipe, ops["w"].recipe, ops["dy"].recipe) == (cfg.x, cfg.w, cfg.g)
    assert ops["w_t"].shape == (160, 96) and ops["x_t"].shape[0] == 160 and ops["dy_t"].shape[0] == 96
    # Against the float64 linear on the same (rounded) inputs.
    x64 = x.detach().double().requires_grad_()
    ref.weight.data.copy_(layer.weight.detach().double())
    ref.bias.data.copy_(layer.bias.detach().double())
    y64 = ref(x64)
    y64.backward(dy.double())
    assert _rel(y, y64) <= _tolerance(cfg.x, cfg.w)
    assert _rel(x.grad, x64.grad) <= _tolerance(cfg.g, cfg.w)
    assert _rel(layer.weight.grad, ref.weight.grad) <= _tolerance(cfg.g, cfg.x)
    torch.testing.assert_close(layer.bias.grad.double(), ref.bias.grad, rtol=1e-5 if dtype == torch.float32 else 1e-2,
                               atol=1e-4)


@pytest.mark.parametrize("recipe", list(ot.LINEAR_RECIPES))
def test_equals_quantize_and_scaled_mm_composed_by_hand(gen, recipe):
    # The layer is octet's C++ layer behind two ops; composed here from octet.quantize and
    # octet.scaled_mm with the documented copies, delayed-scaling rule and Philox offsets, its
    # outputs agree bit for bit over three steps (NVFP4's rotated weight-gradient operands are
    # the layer's own kept copies: the rotation is checked in C++ against octet's codec).
    layer, _ = _layers(gen, recipe, 96, 48)
    layer.keep_operands = True
    cfg = layer.recipe
    hist = {role: torch.zeros(16) for role in "xwg"}
    for step in range(3):
        x = (torch.randn(29, 96, generator=gen) * (1 + step)).requires_grad_()
        dy = torch.randn(29, 48, generator=gen) * (3 - step)
        layer.weight.grad = layer.bias.grad = None
        y = layer(x)
        y.backward(dy)
        h = (lambda r: hist[r]) if cfg.delayed else (lambda r: None)
        xq, x_t, x_info = ot.quantize(x.detach(), cfg.x, columnwise=not cfg.hadamard_wgrad, amax_history=h("x"))
        wq, w_t, w_info = ot.quantize(layer.weight.detach(), cfg.w, columnwise=True, amax_history=h("w"))
        sr = dict(rounding="stochastic", seed=layer.seed, offset=4 * step) if cfg.stochastic_gradients else {}
        dyq, dy_t, g_info = ot.quantize(dy, cfg.g, columnwise=not cfg.hadamard_wgrad, amax_history=h("g"), **sr)
        if cfg.delayed:
            for role, info in zip("xwg", (x_info, w_info, g_info)):
                hist[role] = torch.cat([info["amax"].reshape(1), hist[role][:-1]])
        if cfg.hadamard_wgrad:
            x_t, dy_t = layer.last_operands["x_t"], layer.last_operands["dy_t"]
        assert torch.equal(y, ot.scaled_mm(xq, wq, bias=layer.bias.detach())), f"y, step {step}"
        assert torch.equal(x.grad, ot.scaled_mm(dyq, w_t)), f"dx, step {step}"
        assert torch.equal(layer.weight.grad, ot.scaled_mm(dy_t, x_t)), f"dw, step {step}"
        assert torch.equal(layer.bias.grad, dy.double().sum(0).float()), f"db, step {step}"
    if cfg.delayed:
        assert all(torch.equal(hist[r], getattr(layer, f"amax_history_{r}")) for r in "xwg")


# torchao's Float8Linear in its default configuration (dynamic per-tensor E4M3 input and weight,
# E5M2 output gradient) is another implementation of the tensorwise recipe, written without octet.
# Both layers' Y, dX and dW are off from the float64 linear by 4-6% (normwise). They differ in one
# convention: octet encodes fl32(x / S) (an IEEE division by the stored scale S = amax / 448; see
# quant/scale.hpp), torchao fl32(x * fl32(448 / amax)). Both round twice; where one of the two
# float32 values lands exactly on the midpoint of two E4M3 codes, ties-to-even takes it to the even
# neighbour, and the other value, a few ulps off the midpoint, goes to its own side. float32 inputs
# rarely hit a midpoint: their layers agree to float32 rounding (measured up to 2.6e-7 normwise) or,
# with one code apart, about 1.6e-4. bf16 inputs (8-bit significands) hit them often (up to about 1%
# of codes), so their layers are checked for equal accuracy and for differing by less than half
# their error, and the differing codes are checked to be exactly such midpoints
# (test_tensorwise_codes_differ_from_a_reciprocal_scale_only_at_midpoints).
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens,in_f,out_f", [(64, 256, 128), (48, 128, 96), (1024, 64, 256), (32, 1024, 32)])
def test_tensorwise_agrees_with_torchao_float8linear(gen, dtype, tokens, in_f, out_f):
    float8 = pytest.importorskip("torchao.float8")
    peer = nn.Sequential(nn.Linear(in_f, out_f, bias=False, dtype=dtype))
    with torch.no_grad():
        peer[0].weight.copy_(torch.randn(out_f, in_f, generator=gen) / in_f**0.5)
    layer = ot.Float8Linear.from_float(nn.Linear(in_f, out_f, bias=False, dtype=dtype), recipe="tensorwise")
    with torch.no_grad():
        layer.weight.copy_(peer[0].weight)
    float8.convert_to_float8_training(peer)
    assert type(peer[0]).__name__ == "Float8Linear"
    x = (3 * torch.randn(tokens, in_f, generator=gen)).to(dtype)
    dy = (1e-3 * torch.randn(tokens, out_f, generator=gen)).to(dtype)
    w64, x64, dy64 = layer.weight.detach().double(), x.double(), dy.double()
    exact = {"y": x64 @ w64.t(), "dx": dy64 @ w64, "dw": dy64.t() @ x64}
    got = {}
    for name, m in (("octet", layer), ("torchao", peer)):
        xi = x.clone().requires_grad_(True)
        y = m(xi)
        y.backward(dy)
        w = m.weight if m is layer else m[0].weight
        got[name] = {"y": y.detach(), "dx": xi.grad, "dw": w.grad}
    for t in exact:
        mine, theirs = got["octet"][t], got["torchao"][t]
        assert mine.dtype == theirs.dtype == dtype
        err_mine, err_theirs = _rel(mine, exact[t]), _rel(theirs, exact[t])
        assert 0.02 < err_mine < _tolerance("tensorwise_e4m3", "tensorwise_e4m3" if t == "y" else "tensorwise_e5m2")
        apart = ((mine.double() - theirs.double()).norm() / exact[t].norm()).item()
        msg = f"{t}: octet and torchao {apart:.3g} apart, off float64 by {err_mine:.4g} and {err_theirs:.4g}"
        assert abs(err_mine - err_theirs) <= 0.05 * err_theirs, msg
        # float32: the same E4M3 codes but where the two scales' roundings (amax / 448 against 448 / amax)
        # put an element on the other side of a rounding tie: a few codes one step apart, measured up to
        # 1.2e-3 of the product's norm, a small fraction of either's own error (about 0.037)
        assert apart <= (0.05 * err_theirs if dtype == torch.float32 else 0.5 * err_theirs), msg


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tensorwise_codes_differ_from_a_reciprocal_scale_only_at_midpoints(gen, dtype):
    """The one convention octet's tensorwise E4M3 codes and torchao's cast differ in, with torch's
    own float8 cast as the oracle of the second rounding: octet's code is the cast of the float32
    quotient fl32(x / S) everywhere, and where it differs from the cast of torchao's float32
    product fl32(x * fl32(448 / amax)), one of the two float32 values lies exactly on the midpoint
    of the two codes (ties-to-even took that one to the even code, the other value is a few ulps
    off the midpoint and went to its side)."""
    for amax_draw in range(8):
        x = (torch.randn(256, 128, generator=gen) * float(2.0 ** (amax_draw - 4))).to(dtype)
        q = ot.quantize(x, "tensorwise_e4m3")[0]
        s = q.block_scales().reshape(())
        amax = x.float().abs().max()
        assert s.item() == (amax / 448.0).item()
        quotient = x.float() / s  # float32, as octet divides
        product = x.float() * (448.0 / amax)  # float32, as torchao multiplies
        mine = q.codes[:, :128].float()
        theirs = product.to(torch.float8_e4m3fn).float()
        assert (mine == quotient.to(torch.float8_e4m3fn).float()).all()
        differ = mine != theirs
        midpoint = ((mine + theirs) / 2)[differ]
        assert ((quotient[differ] == midpoint) | (product[differ] == midpoint)).all()
    # A known case: amax 12.75, x 4.78125 (both bf16). fl32(x / S) is 168, the midpoint of 160 and
    # 176, and goes to the even 160; torchao's product is 168.0000082 and goes to 176.
    x = torch.tensor([[12.75, 4.78125]], dtype=dtype)
    q = ot.quantize(x, "tensorwise_e4m3")[0]
    assert q.codes[0, 1].float().item() == 160.0
    assert (x.float() * (448.0 / 12.75)).to(torch.float8_e4m3fn)[0, 1].float().item() == 176.0


def test_nvfp4_hadamard_and_reproducible_stochastic_rounding(gen):
    layer, _ = _layers(gen, "nvfp4", 64, 48)
    layer.keep_operands = True
    x = torch.randn(37, 64, generator=gen, requires_grad=True)
    dy = torch.randn(37, 48, generator=gen)

    def step(module):
        x.grad = module.weight.grad = None
        module(x).backward(dy)
        return x.grad.clone(), module.weight.grad.clone()

    first = step(layer)
    # The weight-gradient copies run over 48 tokens (37 padded to a multiple of 16), rotated.
    assert layer.last_operands["x_t"].shape == (64, 48) and layer.last_operands["dy_t"].shape == (48, 48)
    second = step(layer)
    assert layer.step == 2 and not torch.equal(first[0], second[0])  # fresh random bits per step
    twin = ot.Float8Linear.from_float(nn.Linear(64, 48), recipe="nvfp4", seed=layer.seed)
    twin.weight, twin.bias = layer.weight, layer.bias
    assert all(torch.equal(p, q) for p, q in zip(step(twin), first))  # same seed, same step: same bits
    # The rotated copies are rotations of X and dY: per feature, a column's energy is kept (up to
    # NVFP4's rounding), and padding rows are zeros, so the product is dY^T X (checked against
    # float64 within the recipe's tolerance in test_forward_and_gradients).
    x_t = dequantize64(layer.last_operands["x_t"])  # in x 48: column t is token t, rotated
    energy = x.detach().double().square().sum(0)
    assert ((x_t.square().sum(1) - energy).abs() <= 0.6 * energy).all()
    assert not torch.equal(x_t[:, :37], x.detach().double().t())  # rotated, not copied


def test_delayed_scaling_history(gen):
    layer, _ = _layers(gen, "tensorwise_delayed", 32, 16)
    layer.amax_history_x.resize_(3).zero_()  # a short history shows it rolling
    layer.keep_operands = True
    amaxes = [1.0, 8.0, 2.0, 0.5, 0.25]
    seen = []
    for i, amax in enumerate(amaxes):
        x = torch.randn(20, 32, generator=gen)
        x = x / x.abs().max() * amax
        layer(x.requires_grad_()).sum().backward()
        used = layer.last_operands["x"].scales.float().item()
        history_max = max(seen[-3:], default=0.0)
        expected = (torch.tensor(history_max if history_max > 0 else amax) / 448).item()  # amax_ratio<0>
        assert used == pytest.approx(expected, rel=1e-6), f"step {i}"
        # The step's own amax is pushed in front; the oldest falls off.
        seen.append(torch.tensor(amax).item())
        assert layer.amax_history_x.tolist() == list(reversed(seen[-3:])) + [0.0] * (3 - len(seen[-3:]))
    assert layer.amax_history_w.max() > 0 and layer.amax_history_g.max() > 0
    # Evaluation (no grad) leaves the histories alone.
    before = layer.amax_history_x.clone()
    with torch.no_grad():
        layer(torch.randn(4, 32, generator=gen) * 100)
    assert torch.equal(layer.amax_history_x, before)


def test_delayed_scaling_saturates_above_a_stale_amax(gen):
    layer, _ = _layers(gen, "tensorwise_delayed", 32, 16)
    layer.keep_operands = True
    layer.amax_history_x[0] = 1.0  # a recorded amax of 1; this step's input reaches 10
    x = torch.linspace(-10, 10, 4 * 32).reshape(4, 32)
    layer(x.requires_grad_())
    q = dequantize64(layer.last_operands["x"])
    assert q.abs().max().item() == pytest.approx(1.0)  # 448 codes * (1 / 448): clamped to the history's amax
    assert layer.amax_history_x[:2].tolist() == [10.0, 1.0]


def test_convert_sequential(gen):
    torch.manual_seed(int(torch.randint(1 << 30, (1,), generator=gen)))
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10), nn.Sequential(nn.Linear(128, 32)),
                          nn.Linear(32, 32))
    weights = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    x = torch.randn(8, 64, generator=gen)
    model2 = nn.Sequential(model[0], model[1], model[3])
    expected = model2(x)
    out = ot.convert(model, recipe="tensorwise", filter=lambda name, m: name != "4")
    assert out is model
    kinds = [type(m).__name__ for m in model]
    # 128 x 10 converts too (10 is no multiple of 16: padded inside on CUDA); "4" is filtered out.
    assert kinds == ["Float8Linear", "ReLU", "Float8Linear", "Sequential", "Linear"]
    assert type(model[3][0]) is ot.Float8Linear
    assert model[0].weight is weights[0] and model[3][0].weight is weights[2]  # parameters are shared
    got = nn.Sequential(model[0], model[1], model[3])(x)
    assert _rel(got, expected.double()) <= _tolerance("tensorwise_e4m3", "tensorwise_e4m3")
    # blockwise's kernels want multiples of 128: both convert, the second is padded inside on CUDA
    m2, report = ot.convert(nn.Sequential(nn.Linear(128, 256), nn.Linear(256, 64)), recipe="blockwise",
                            return_report=True)
    assert [type(m).__name__ for m in m2] == ["Float8Linear", "Float8Linear"] and report.padded == ["1"]
    single = ot.convert(nn.Linear(32, 32), recipe="mxfp8")
    assert isinstance(single, ot.Float8Linear) and single.recipe.name == "mxfp8"
    with pytest.raises(ValueError, match="recipe 'fp8' is unknown"):
        ot.convert(model, recipe="fp8")


@pytest.mark.parametrize("recipe", list(ot.LINEAR_RECIPES))
def test_edge_inputs(gen, recipe):
    layer = ot.Float8Linear(32, 16, recipe=recipe)
    for x in [torch.zeros(5, 32), torch.randn(0, 32, generator=gen), torch.randn(2, 0, 32, generator=gen)]:
        x.requires_grad_()
        layer.weight.grad = layer.bias.grad = None
        y = layer(x)
        y.sum().backward()
        # Zero input or no tokens: Y is the bias and dW = dY^T X is zero (an empty sum without tokens).
        assert y.shape == (*x.shape[:-1], 16) and torch.equal(y, layer.bias.detach().expand_as(y))
        assert torch.equal(layer.weight.grad, torch.zeros_like(layer.weight)) and x.grad.shape == x.shape
    # float16 end to end; a delayed layer's amax histories stay float32.
    layer.half()
    x = torch.randn(4, 32, generator=gen).half().requires_grad_()
    layer(x).sum().backward()
    assert x.grad.dtype == layer.weight.grad.dtype == torch.float16 and torch.isfinite(x.grad).all()
    for name, buf in layer.named_buffers():
        assert buf.dtype == torch.float32 or not name.startswith("amax"), name


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("recipe", list(ot.LINEAR_RECIPES))
def test_non_finite_inputs_come_out_nan(gen, recipe, bad):
    # The default non-finite policy: a NaN or an Inf in X or dY makes its block's scale NaN, so it
    # reaches every output that reads the block (per-tensor recipes: all of them) and never comes
    # out finite; the delayed-scaling history keeps the finite amax, so the next clean step is clean.
    layer, _ = _layers(gen, recipe, 64, 48, torch.float32)
    per_tensor = recipe.startswith("tensorwise")
    others = torch.arange(8) != 3
    x = torch.randn(8, 64, generator=gen)
    x[3, 7] = bad
    y = layer(x.requires_grad_())
    assert torch.isnan(y[3]).all()
    assert torch.isnan(y).all() if per_tensor else torch.isfinite(y[others]).all()
    # dY: row 2 of dX = dY W and row 5 of dW = dY^T X read the bad element's blocks
    x = torch.randn(8, 64, generator=gen).requires_grad_()
    layer.weight.grad = None
    y = layer(x)
    dy = torch.randn(y.shape, generator=gen)
    dy[2, 5] = bad
    y.backward(dy)
    assert torch.isnan(x.grad[2]).all() and torch.isnan(layer.weight.grad[5]).all()
    if not per_tensor:
        assert torch.isfinite(x.grad[torch.arange(8) != 2]).all()
    # a clean step afterwards (what a skipped step leaves behind) is finite everywhere
    x = torch.randn(8, 64, generator=gen).requires_grad_()
    layer.weight.grad = None
    layer(x).backward(torch.randn(8, 48, generator=gen))
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.weight.grad).all()


def test_bad_input(gen):
    layer = ot.Float8Linear(32, 16)
    with pytest.raises(ValueError, match="takes 32"):
        layer(torch.randn(4, 31, generator=gen))
    with pytest.raises(TypeError, match="argument 'x'"):
        layer(torch.randn(4, 32, generator=gen).double())
    with pytest.raises(ValueError, match="amax_history_len"):
        ot.Float8Linear(32, 16, recipe="tensorwise_delayed", amax_history_len=0)


@pytest.mark.parametrize("recipe", list(ot.LINEAR_RECIPES))
def test_compile_fullgraph_forward_and_backward(gen, recipe):
    # Every recipe traces into one graph (fullgraph) and compiles once: the per-step state (amax
    # histories, the Philox offset) travels as tensors, so later steps neither break the graph nor
    # recompile, and each step equals eager bit for bit, as do the buffers the steps update.
    import copy

    torch._dynamo.reset()
    eager = ot.Float8Linear(128, 64, recipe=recipe, seed=int(torch.randint(1 << 30, (1,), generator=gen)))
    twin = copy.deepcopy(eager)
    compiles = []

    def counting_backend(gm, example_inputs):
        compiles.append(gm)
        # aot_eager: Dynamo and AOTAutograd (fake kernels, the autograd function, fullgraph)
        # without inductor's C++ code generation, which is not octet's concern.
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    compiled = torch.compile(twin, backend=counting_backend, fullgraph=True)

    def run(module, params, x, dy):
        x = x.clone().requires_grad_()
        for p in params:
            p.grad = None
        y = module(x)
        y.backward(dy)
        return y.detach(), x.grad, *(p.grad for p in params)

    with torch._dynamo.config.patch(error_on_recompile=True):
        for step in range(4):
            x = torch.randn(3, 10, 128, generator=gen) * (1 + step)  # amaxes change; shapes do not
            dy = torch.randn(3, 10, 64, generator=gen) * (2 - 0.3 * step)
            want = run(eager, (eager.weight, eager.bias), x, dy)
            got = run(compiled, (twin.weight, twin.bias), x, dy)
            assert all(torch.equal(a, b) for a, b in zip(want, got)), f"step {step}"
    assert len(compiles) == 1
    for (name, a), (_, b) in zip(eager.named_buffers(), twin.named_buffers()):
        assert torch.equal(a, b), name
    if eager.recipe.delayed:
        assert eager.amax_history_g[:4].min() > 0  # four steps recorded, in the compiled backward too
    if eager.recipe.stochastic_gradients:
        assert eager.step == twin.step == 4


@pytest.mark.parametrize("recipe", ["tensorwise", "nvfp4"])
def test_sgd_reduces_the_loss(gen, recipe):
    torch.manual_seed(int(torch.randint(1 << 30, (1,), generator=gen)))
    x = torch.randn(256, 32, generator=gen)
    y = x @ torch.randn(32, 16, generator=gen) + 0.5
    layer = ot.Float8Linear(32, 16, recipe=recipe)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = ((layer(x) - y) ** 2).sum(1).mean()  # Hessian 2 E[x x^T] ~ 2 I: lr 0.1 contracts 0.8 a step
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # NVFP4's quantization noise (about 14% of |y| normwise) leaves a floor near 2% of the start.
    assert losses[-1] < 0.1 * losses[0], losses


@pytest.mark.parametrize("recipe", list(ot.LINEAR_RECIPES))
def test_opcheck(gen, recipe):
    ops = torch.ops.octet
    cfg = ot.LINEAR_RECIPES[recipe]
    x, w, b = torch.randn(21, 64, generator=gen), torch.randn(32, 64, generator=gen), torch.randn(32, generator=gen)
    hist = torch.rand(4, generator=gen) if cfg.delayed else None
    for keep, stats in ((False, False), (True, True)):
        args = (x, w, b, recipe, hist, hist, 7, True, True, keep, stats)
        torch.library.opcheck(ops.linear_forward.default, args)
    out = ops.linear_forward(x, w, b, recipe, hist, hist, 7)
    n = 3 if ot.recipe_info(cfg.x).two_level else 2
    # Ops that read codes take them as uint8 views (torch's schema check compares inputs with
    # allclose, which float8 tensors do not implement); Float8Linear passes such views.
    saved = [t.view(torch.uint8) if t.element_size() == 1 else t for t in out[3:3 + 2 * n]]
    philox = torch.tensor([7, 8]) if cfg.stochastic_gradients else None
    dy = torch.randn(21, 32, generator=gen)
    for need_dx, need_dw in ((True, True), (True, False), (False, True)):
        copies = (saved[:n] if need_dw else []) + (saved[n:] if need_dx else [])
        args = (dy, copies, recipe, hist, 7, philox, need_dx, need_dw, True, True, True)
        torch.library.opcheck(ops.linear_backward.default, args)


def test_bad_op_arguments(gen):
    ops = torch.ops.octet
    x, w = torch.randn(8, 32, generator=gen), torch.randn(16, 32, generator=gen)
    with pytest.raises(ValueError, match="argument 'recipe' is 'fp8'"):
        ops.linear_forward(x, w, None, "fp8")
    with pytest.raises(ValueError, match="argument 'w' has 31 columns"):
        ops.linear_forward(x, w[:, :31].contiguous(), None, "tensorwise")
    with pytest.raises(TypeError, match="argument 'x' has dtype"):
        ops.linear_forward(x.half(), w, None, "tensorwise")
    with pytest.raises(ValueError, match="argument 'x_history' is given for a recipe with current scaling"):
        ops.linear_forward(x, w, None, "tensorwise", torch.ones(4))
    with pytest.raises(ValueError, match="argument 'bias'"):
        ops.linear_forward(x, w, torch.zeros(15), "tensorwise")
    x = torch.randn(40, 32, generator=gen)  # X^T's copy (32 x 40) and W^T's (32 x 16) differ in size
    out = ops.linear_forward(x, w, None, "mxfp8")
    dy = torch.randn(40, 16, generator=gen)
    with pytest.raises(ValueError, match="argument 'saved' holds 2 tensors"):
        ops.linear_backward(dy, out[3:5], "mxfp8")  # both gradients need both copies
    with pytest.raises(ValueError, match="argument 'w_t_codes'"):
        ops.linear_backward(dy, [out[3], out[4], out[3], out[6]], "mxfp8")  # X^T's codes in W^T's place
    with pytest.raises(ValueError, match="argument 'philox' has offset 6"):
        ops.linear_backward(dy, out[3:7], "mxfp8", philox=torch.tensor([1, 6]))
    with pytest.raises(ValueError, match="octet::linear_backward: argument 'x_t_codes' holds 1536 bytes; a 32 x 5"):
        ops.linear_backward(dy[:5].contiguous(), out[3:7], "mxfp8")  # 5 tokens against a forward of 40


# ---- delayed scaling under data parallelism: two processes over gloo ----


def _amax_worker(rank, world, store, out_dir, sync):
    import os

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # the same weights on every rank
        model = nn.Sequential(nn.Linear(32, 48), nn.Tanh(), nn.Linear(48, 16))
        ot.convert(model, recipe="tensorwise_delayed")
        data = torch.Generator().manual_seed(100 + rank)
        local = []
        for step in range(3):
            x = torch.randn(8, 32, generator=data) * (1 + 3 * rank)  # rank 1 sees 4x larger inputs
            model(x).square().sum().backward()
            local.append([float(getattr(m, f"amax_history_{r}")[0]) for m in model if isinstance(m, ot.Float8Linear)
                          for r in "xwg"])
            reduced = ot.sync_amax_histories(model) if sync else 0
        hist = torch.cat([getattr(m, f"amax_history_{r}") for m in model if isinstance(m, ot.Float8Linear)
                          for r in "xwg"])
        torch.save({"hist": hist, "local": torch.tensor(local), "reduced": reduced},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("sync", [True, False])
def test_delayed_amax_histories_reduced_across_ranks(tmp_path, sync):
    import torch.multiprocessing as mp

    mp.spawn(_amax_worker, args=(2, str(tmp_path / "store"), str(tmp_path), sync), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    if not sync:  # each rank keeps its own amaxes: the histories disagree
        assert not torch.equal(r0["hist"], r1["hist"])
        return
    assert r0["reduced"] == r1["reduced"] == 6  # X, W, dY of two layers, one all-reduce
    assert torch.equal(r0["hist"], r1["hist"])
    # the last step's newest amaxes are the larger of the two ranks' own
    newest = r0["hist"].reshape(6, -1)[:, 0]
    assert torch.equal(newest, torch.maximum(r0["local"][-1], r1["local"][-1]))
