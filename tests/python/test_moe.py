"""Mixture of experts in FP8 (python/octet/torch/moe.py; issue 41, its PyTorch part).

Oracles: octet's dense scaled_mm on each group's slice (every group of scaled_grouped_mm,
bit for bit: ragged, empty and sub-block groups, fresh random inputs), float64 torch (the grouped
GEMM, GroupedLinear's gradients and the MoE block's output and gradients, within stated norm-wise
bounds), and torch's bf16 grouped matmul (torch._grouped_mm, which runs on the CPU in this torch)
for the same products, whose error the test reports beside octet's."""

import pytest
import torch

import octet.torch as ot
from octet.torch import moe

_ops = torch.ops.octet
RECIPES = ("tensorwise", "blockwise", "mxfp8")
# Unit roundoffs: E4M3 2^-4, E5M2 2^-3 (2^-(mantissa bits + 1)).
_U = {"tensorwise": (2**-4, 2**-4, 2**-3), "blockwise": (2**-4, 2**-4, 2**-4), "mxfp8": (2**-4, 2**-4, 2**-3)}


def _data(gen, rows, cols, decades=3, dtype=torch.float32):
    mag = torch.pow(10.0, (torch.rand(rows, 1, generator=gen) - 0.5) * decades)
    return (torch.randn(rows, cols, generator=gen) * mag).to(dtype)


def _slices(sizes):
    b = 0
    for n in sizes:
        yield b, n
        b += n


def _rel(a, ref):
    return ((a.double() - ref).norm() / ref.norm()).item()


# Ragged (37, 130: not multiples of any block), empty (0) and sub-block (1, 5 rows) groups.
SIZES = [0, 37, 1, 130, 0, 5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recipe", RECIPES)
def test_each_group_is_the_dense_op_on_its_slice_bit_for_bit(gen, recipe, dtype):
    r = moe.GROUPED_RECIPES[recipe]
    sizes = torch.tensor(SIZES)
    m, k, n = sum(SIZES), 200, 96  # K and N cut 128-, 32- and 16-blocks raggedly
    x, w = _data(gen, m, k, dtype=dtype), _data(gen, 6 * n, k, dtype=dtype).view(6, n, k)
    for out_dtype in (torch.float32, torch.bfloat16):
        y = ot.scaled_grouped_mm(x, w, sizes, recipe=recipe, out_dtype=out_dtype)
        assert y.shape == (m, n) and y.dtype == out_dtype
        for e, (b, rows) in enumerate(_slices(SIZES)):
            if rows == 0:
                continue
            a, _, _ = ot.quantize(x[b : b + rows], r.x)
            bq, _, _ = ot.quantize(w[e], r.w)
            assert torch.equal(y[b : b + rows], ot.scaled_mm(a, bq, out_dtype=out_dtype)), (e, out_dtype)
        # torch._grouped_mm's offsets give the same groups.
        offs = torch.cumsum(sizes, 0).to(torch.int32)
        assert torch.equal(ot.scaled_grouped_mm(x, w, offs=offs, recipe=recipe, out_dtype=out_dtype), y)


@pytest.mark.parametrize("recipe", RECIPES)
def test_data_and_weight_gradient_ops_are_the_dense_op_bit_for_bit(gen, recipe):
    r = moe.GROUPED_RECIPES[recipe]
    sizes = torch.tensor(SIZES)
    m, k, n = sum(SIZES), 200, 96
    dy, x, w = _data(gen, m, n), _data(gen, m, k), _data(gen, 6 * n, k).view(6, n, k)
    # dX = dY W_e: B = W_e^T (a transposed view, read in place), quantized as a matrix of its own.
    dx = _ops.scaled_grouped_mm(dy, w.transpose(1, 2), sizes, r.g, r.w)
    # dW_e = dY_e^T X_e from the column-wise copies of the group's rows.
    dw = _ops.scaled_grouped_mm_k(dy, x, sizes, r.g, r.x)
    assert dx.shape == (m, k) and dw.shape == (6, n, k)
    for e, (b, rows) in enumerate(_slices(SIZES)):
        if rows == 0:
            assert torch.equal(dw[e], torch.zeros(n, k))  # an expert without tokens: dW = 0 exactly
            continue
        g, _, _ = ot.quantize(dy[b : b + rows], r.g)
        wt, _, _ = ot.quantize(w[e].t().contiguous(), r.w)
        assert torch.equal(dx[b : b + rows], ot.scaled_mm(g, wt)), e
        _, gt, _ = ot.quantize(dy[b : b + rows], r.g, rowwise=False, columnwise=True)
        _, xt, _ = ot.quantize(x[b : b + rows], r.x, rowwise=False, columnwise=True)
        assert torch.equal(dw[e], ot.scaled_mm(gt, xt)), e


@pytest.mark.parametrize("recipe", RECIPES)
def test_against_float64_and_torch_bf16_grouped_mm(gen, recipe):
    u_x, u_w, _ = _U[recipe]
    sizes = torch.tensor([64, 0, 200, 17, 3])
    m, k, n = int(sizes.sum()), 256, 128
    x, w = _data(gen, m, k, decades=0), _data(gen, 5 * n, k, decades=0).view(5, n, k)
    ref = torch.cat([x[b : b + r].double() @ w[e].double().t() for e, (b, r) in enumerate(_slices(sizes.tolist()))])
    y = ot.scaled_grouped_mm(x, w, sizes, recipe=recipe)
    offs = torch.cumsum(sizes, 0).to(torch.int32)
    y_bf16 = torch._grouped_mm(x.bfloat16(), w.bfloat16().transpose(1, 2), offs=offs)
    err, err_bf16 = _rel(y, ref), _rel(y_bf16, ref)
    print(f"\n{recipe}: grouped GEMM relative error (Frobenius) octet {err:.4f}, torch bf16 {err_bf16:.5f}")
    # Each element of X and W is rounded once (relative u_x, u_w, RMS about u / sqrt(3)): the
    # norm-wise error of the product stays under u_x + u_w for these well-conditioned products.
    assert err <= u_x + u_w
    assert err_bf16 <= 2 * 2**-8
    # The bound tells experts apart: each group multiplied by the next expert's weight misses by far more.
    wrong = ot.scaled_grouped_mm(x, w.roll(1, 0), sizes, recipe=recipe)
    assert _rel(wrong, ref) > 4 * (u_x + u_w)


def test_empty_and_degenerate_shapes(gen):
    w = _data(gen, 3 * 16, 64).view(3, 16, 64)
    y = ot.scaled_grouped_mm(torch.zeros(0, 64), w, torch.zeros(3, dtype=torch.int64))
    assert y.shape == (0, 16)
    dw = _ops.scaled_grouped_mm_k(torch.zeros(0, 16), torch.zeros(0, 64), torch.zeros(3, dtype=torch.int64),
                                  "blockwise_1x128", "blockwise_1x128")
    assert torch.equal(dw, torch.zeros(3, 16, 64))
    # Zeros give zeros; values of 1e-6 are scaled like any others (block scales absorb them).
    x = _data(gen, 40, 64, decades=0)
    sizes = torch.tensor([10, 0, 30])
    assert torch.equal(ot.scaled_grouped_mm(torch.zeros(40, 64), w, sizes), torch.zeros(40, 16))
    y = ot.scaled_grouped_mm(x, w, sizes)
    y_tiny = ot.scaled_grouped_mm(x * 1e-6, w, sizes)
    ref = torch.cat([x[:10].double() @ w[0].double().t(), x[10:].double() @ w[2].double().t()]) * 1e-6
    assert _rel(y_tiny, ref) <= 2**-3 and _rel(y * 1e-6, ref) <= 2**-3


def test_views_and_size_dtypes_are_read_in_place(gen):
    w = _data(gen, 3 * 16, 64).view(3, 16, 64)
    x = _data(gen, 64, 50).t()  # 50 x 64 with contiguous columns, and rows of stride 2 below
    y = ot.scaled_grouped_mm(x.contiguous(), w, torch.tensor([20, 0, 30]))
    assert torch.equal(ot.scaled_grouped_mm(x, w, torch.tensor([20, 0, 30], dtype=torch.int32)), y)
    assert torch.equal(ot.scaled_grouped_mm(x, w, [20, 0, 30]), y)  # a list of sizes
    strided = torch.zeros(100, 64)
    strided[::2] = x
    assert torch.equal(ot.scaled_grouped_mm(strided[::2], w, torch.tensor([20, 0, 30])), y)
    # torch._grouped_mm's G x K x N weight is w.transpose(1, 2); octet reads its transpose in place.
    wk = w.transpose(1, 2).contiguous()
    assert torch.equal(ot.scaled_grouped_mm(x, wk.transpose(1, 2), torch.tensor([20, 0, 30])), y)


def _raises(exc, match, fn):
    with pytest.raises(exc, match=match):
        fn()


def test_bad_arguments_name_the_argument_and_the_fix(gen):
    x, w = _data(gen, 10, 64), _data(gen, 3 * 8, 64).view(3, 8, 64)
    sizes = torch.tensor([4, 0, 6])
    _raises(ValueError, "group_sizes gives 9 rows in all but x has 10",
            lambda: ot.scaled_grouped_mm(x, w, torch.tensor([4, 0, 5])))
    _raises(ValueError, "group_sizes.*negative", lambda: ot.scaled_grouped_mm(x, w, torch.tensor([5, -1, 6])))
    _raises(ValueError, "offs gives group 1 a negative size",
            lambda: ot.scaled_grouped_mm(x, w, offs=torch.tensor([6, 4, 10], dtype=torch.int32)))
    _raises(ValueError, "exactly one of group_sizes", lambda: ot.scaled_grouped_mm(x, w))
    _raises(ValueError, "recipe 'fp8' is not a grouped GEMM recipe.*tensorwise, blockwise, mxfp8",
            lambda: ot.scaled_grouped_mm(x, w, sizes, recipe="fp8"))
    # The op's own checks (what torch.compile runs): each names the op and the argument.
    _raises(ValueError, "argument 'group_sizes'.*sum to 9 but a has 10 rows",
            lambda: _ops.scaled_grouped_mm(x, w, torch.tensor([4, 0, 5]), "blockwise_1x128", "blockwise_128x128"))
    _raises(ValueError, r"argument 'group_sizes'.*\[1\] is -1",
            lambda: _ops.scaled_grouped_mm(x, w, torch.tensor([5, -1, 6]), "blockwise_1x128", "blockwise_128x128"))
    _raises(ValueError, "argument 'group_sizes' has 2 entries but b holds 3 experts",
            lambda: _ops.scaled_grouped_mm(x, w, torch.tensor([4, 6]), "blockwise_1x128", "blockwise_128x128"))
    _raises(TypeError, "argument 'group_sizes' has dtype Float",
            lambda: _ops.scaled_grouped_mm(x, w, sizes.float(), "blockwise_1x128", "blockwise_128x128"))
    _raises(TypeError, "argument 'a' has dtype Double",
            lambda: _ops.scaled_grouped_mm(x.double(), w, sizes, "blockwise_1x128", "blockwise_128x128"))
    _raises(TypeError, "argument 'b' has dtype BFloat16 but a has Float",
            lambda: _ops.scaled_grouped_mm(x, w.bfloat16(), sizes, "blockwise_1x128", "blockwise_128x128"))
    _raises(ValueError, "argument 'b' has shape.*G x N x K",
            lambda: _ops.scaled_grouped_mm(x, w[0], sizes, "blockwise_1x128", "blockwise_128x128"))
    _raises(ValueError, "argument 'b'.*K = a's columns",
            lambda: _ops.scaled_grouped_mm(x, w[:, :, :32], sizes, "blockwise_1x128", "blockwise_128x128"))
    _raises(ValueError, "argument 'a_recipe' is 'e4m3'",
            lambda: _ops.scaled_grouped_mm(x, w, sizes, "e4m3", "blockwise_128x128"))
    _raises(ValueError, "a pair this op does not serve; it serves",
            lambda: _ops.scaled_grouped_mm(x, w, sizes, "nvfp4", "nvfp4"))
    _raises(TypeError, "argument 'out_dtype'",
            lambda: _ops.scaled_grouped_mm(x, w, sizes, "blockwise_1x128", "blockwise_128x128", torch.float16))
    _raises(ValueError, "argument 'b' has 9 rows but a has 10",
            lambda: _ops.scaled_grouped_mm_k(x, x[:9], sizes, "blockwise_1x128", "blockwise_1x128"))
    q, _, _ = ot.quantize(x, "blockwise_1x128")
    codes, scales, _ = q.raw()
    _raises(ValueError, "argument 'a_codes'",
            lambda: _ops.scaled_grouped_mm_quantized(codes, scales, "blockwise_1x128", 32, sizes, w[:, :, :32],
                                                     "blockwise_128x128"))
    _raises(ValueError, "a pair this op does not serve.*row-local",
            lambda: _ops.scaled_grouped_mm_quantized(codes, scales, "tensorwise_e4m3", 64, sizes, w,
                                                     "tensorwise_e4m3"))
    xs, idx, g = [x, x], [torch.zeros(10, 1, dtype=torch.int64)] * 2, [torch.ones(10, 1)] * 2
    _raises(ValueError, "argument 'experts' is 3; pass a positive multiple of the rank count 2",
            lambda: _ops.moe_exchange_in_process(xs, idx, g, w, 3))
    _raises(ValueError, r"argument 'indices'.*\[1\] holds expert 7",
            lambda: _ops.moe_exchange_in_process(xs, [idx[0], idx[1] + 7], g, w[:2].repeat(2, 1, 1), 4))
    _raises(ValueError, "argument 'x_recipe/w_recipe'.*blockwise_1x128 x blockwise_128x128",
            lambda: _ops.moe_exchange_in_process(xs, idx, g, w[:2], 2, "tensorwise_e4m3", "tensorwise_e4m3"))
    layer = ot.GroupedLinear(3, 64, 8)
    _raises(ValueError, "GroupedLinear: x has shape", lambda: layer(x[:, :32], sizes))
    _raises(ValueError, "activation 'relu'", lambda: ot.MoE(64, 32, 4, activation="relu"))
    _raises(ValueError, "k is 5", lambda: ot.MoE(64, 32, 4, k=5))


def test_opcheck(gen):
    x, w = _data(gen, 20, 48), _data(gen, 3 * 8, 48).view(3, 8, 48)
    sizes = torch.tensor([7, 0, 13])
    for ra, rb in (("blockwise_1x128", "blockwise_128x128"), ("mxfp8_e4m3", "mxfp8_e4m3"),
                   ("tensorwise_e5m2", "tensorwise_e4m3")):
        torch.library.opcheck(_ops.scaled_grouped_mm, (x, w, sizes, ra, rb), {"out_dtype": torch.bfloat16})
    wt = _data(gen, 3 * 48, 8).view(3, 48, 8).bfloat16().transpose(1, 2)  # each b[g] read in place, columns contiguous
    torch.library.opcheck(_ops.scaled_grouped_mm, (x.bfloat16(), wt, sizes, "mxfp8_e5m2", "mxfp8_e4m3"))
    torch.library.opcheck(_ops.scaled_grouped_mm_k, (x[:, :8], x, sizes, "blockwise_1x128", "blockwise_1x128"))
    q, _, _ = ot.quantize(x, "mxfp8_e4m3")
    codes, scales, _ = q.raw()
    torch.library.opcheck(_ops.scaled_grouped_mm_quantized, (codes, scales, "mxfp8_e4m3", 48, sizes, w, "mxfp8_e4m3"))
    xs = [_data(gen, 5, 128), _data(gen, 7, 128)]
    idx = [torch.randint(0, 4, (5, 2), generator=gen), torch.randint(0, 4, (7, 2), generator=gen)]
    gates = [torch.rand(5, 2, generator=gen), torch.rand(7, 2, generator=gen)]
    torch.library.opcheck(_ops.moe_exchange_in_process, (xs, idx, gates, _data(gen, 4 * 16, 128).view(4, 16, 128), 4))


def test_compiles_fullgraph_and_equals_eager(gen):
    torch._dynamo.reset()
    x, w = _data(gen, 50, 128), _data(gen, 4 * 32, 128).view(4, 32, 128)
    sizes = torch.tensor([20, 0, 25, 5])
    fn = torch.compile(lambda x, w, s: ot.scaled_grouped_mm(x, w, s, recipe="blockwise"), fullgraph=True)
    assert torch.equal(fn(x, w, sizes), ot.scaled_grouped_mm(x, w, sizes, recipe="blockwise"))
    # Other sizes, the same graph (the sizes are a tensor: no guard on their values).
    sizes2 = torch.tensor([0, 50, 0, 0])
    assert torch.equal(fn(x, w, sizes2), ot.scaled_grouped_mm(x, w, sizes2, recipe="blockwise"))
    # GroupedLinear's forward and backward compile too, and equal eager bit for bit.
    layer = ot.GroupedLinear(4, 128, 32, recipe="mxfp8")
    xe = x.clone().requires_grad_()
    layer(xe, sizes).square().sum().backward()
    dx, dw = xe.grad.clone(), layer.weight.grad.clone()
    layer.weight.grad = None
    xc = x.clone().requires_grad_()
    step = torch.compile(lambda x, s: layer(x, s).square().sum(), fullgraph=True)
    step(xc, sizes).backward()
    assert torch.equal(xc.grad, dx) and torch.equal(layer.weight.grad, dw)


def _grouped_linear_ref(x, w, sizes):
    return torch.cat([x[b : b + r] @ w[e].t() for e, (b, r) in enumerate(_slices(sizes))])


@pytest.mark.parametrize("recipe", RECIPES)
def test_grouped_linear_gradients_against_float64(gen, recipe):
    u_x, u_w, u_g = _U[recipe]
    sizes = [33, 0, 150, 7]
    layer = ot.GroupedLinear(4, 256, 128, recipe=recipe)
    x = _data(gen, sum(sizes), 256, decades=0).requires_grad_()
    dy = _data(gen, sum(sizes), 128, decades=0)
    y = layer(x, torch.tensor(sizes))
    y.backward(dy)
    x64, w64 = x.detach().double().requires_grad_(), layer.weight.detach().double().requires_grad_()
    y64 = _grouped_linear_ref(x64, w64, sizes)
    y64.backward(dy.double())
    ey, edx, edw = _rel(y, y64), _rel(x.grad, x64.grad), _rel(layer.weight.grad, w64.grad)
    print(f"\n{recipe}: GroupedLinear relative errors Y {ey:.4f} dX {edx:.4f} dW {edw:.4f}")
    assert ey <= u_x + u_w and edx <= u_g + u_w and edw <= u_g + u_x
    assert torch.equal(layer.weight.grad[1], torch.zeros(128, 256))  # the expert without tokens


def _moe_ref64(m, x, routing):
    """The same block in float64 on the unquantized inputs, routed as the module routed (the same
    top-k indices), gates and everything else recomputed in float64 (differentiable)."""
    x64 = x.detach().double().requires_grad_()
    p = {n: t.detach().double().requires_grad_() for n, t in m.named_parameters()}
    probs = torch.softmax(x64 @ p["router.weight"].t(), dim=-1)
    gates = probs.gather(1, routing.indices)
    if m.renormalize:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x64)
    for e in range(m.experts):
        t, j = (routing.indices == e).nonzero(as_tuple=True)
        if t.numel() == 0:
            continue
        xe = x64[t]
        u = xe @ p["up.weight"][e].t()
        h = torch.nn.functional.silu(xe @ p["gate.weight"][e].t()) * u if m.activation == "swiglu" else \
            torch.nn.functional.gelu(u)
        out = out.index_add(0, t, gates[t, j].unsqueeze(1) * (h @ p["down.weight"][e].t()))
    return x64, p, out


def _moe_bf16(m, x, routing):
    """The same block with its expert GEMMs as torch's bf16 grouped matmul (torch._grouped_mm, CPU)."""
    xs = x[routing.order // m.k].bfloat16()
    offs = torch.cumsum(routing.group_sizes, 0).to(torch.int32)
    gmm = lambda a, w: torch._grouped_mm(a, w.bfloat16().transpose(1, 2), offs=offs)  # noqa: E731
    u = gmm(xs, m.up.weight)
    h = torch.nn.functional.silu(gmm(xs, m.gate.weight).float()) * u.float() if m.gate is not None else \
        torch.nn.functional.gelu(u.float())
    return moe.combine(gmm(h.bfloat16(), m.down.weight).float(), routing.gates, routing.row_of)


@pytest.mark.parametrize("recipe,activation", [("blockwise", "swiglu"), ("mxfp8", "gelu"), ("tensorwise", "swiglu")])
def test_moe_forward_and_gradients_against_float64(gen, recipe, activation):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    u_x, u_w, u_g = _U[recipe]
    m = ot.MoE(256, 128, 8, k=2, activation=activation, recipe=recipe)
    x = _data(gen, 160, 256, decades=0).requires_grad_()
    dout = _data(gen, 160, 256, decades=0)
    out = m(x)
    out.backward(dout)
    r = m.last_routing
    assert int(r.group_sizes.sum()) == 160 * 2
    x64, p, out64 = _moe_ref64(m, x, r)
    out64.backward(dout.double())
    errs = {"out": _rel(out, out64), "dX": _rel(x.grad, x64.grad)}
    for n, t in m.named_parameters():
        errs["d" + n] = _rel(t.grad, p[n].grad)
    err_bf16 = _rel(_moe_bf16(m, x.detach(), r), out64.detach())
    print(f"\n{recipe} {activation}: " + ", ".join(f"{k} {v:.4f}" for k, v in errs.items()) +
          f"; torch bf16 grouped matmul out {err_bf16:.4f}")
    # octet/nn/moe.hpp's norm-wise contract: kappa_fwd = 2 (u_X + u_W), kappa_bwd = u_X + 2 u_W + 2 u_G
    # (its u_S term is absent: this block keeps U and G in float32 for the activation's backward).
    k_fwd, k_bwd = 2 * (u_x + u_w), u_x + 2 * u_w + 2 * u_g
    assert errs["out"] <= k_fwd
    assert all(v <= k_bwd for n, v in errs.items() if n != "out"), errs
    assert err_bf16 <= 2**-5  # bf16's 2^-8 per rounding, four roundings on the path


def test_moe_trains_and_its_aux_loss(gen):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    m = ot.MoE(128, 64, 4, k=2, recipe="blockwise")
    x = _data(gen, 96, 128, decades=0)
    target = torch.tanh(x)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        loss = torch.nn.functional.mse_loss(m(x), target) + 0.01 * m.aux_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
    # aux_loss is Switch's L_aux = E sum_e f_e P_e of the last forward (1 when perfectly balanced).
    r = m.last_routing
    f = r.group_sizes.double() / r.indices.numel()
    assert abs(m.aux_loss.item() - 4 * (f * r.probs.double().mean(0)).sum().item()) < 1e-5
    # Every expert that received tokens got a weight gradient.
    assert all(m.up.weight.grad[e].abs().sum() > 0 for e in range(4) if r.group_sizes[e] > 0)


def one_process_exchange(x, idx, gates, w, x_recipe="blockwise_1x128", w_recipe="blockwise_128x128"):
    """One process's MoE on X quantized once: the codes and scales of each assignment's token moved
    into expert order (no dequantize), the grouped GEMM on them, outputs rounded to bf16, combined."""
    E, k = w.shape[0], idx.shape[1]
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    sizes = torch.bincount(flat, minlength=E)
    q, _, _ = ot.quantize(x, x_recipe)
    tok = order // k
    rows = moe._row_copy(q.codes.view(torch.uint8)[:, : x.shape[1]][tok], moe._row_scales(q, x.shape[0])[tok],
                         x_recipe, x.shape[1])
    codes, scales, _ = rows.raw()
    y = _ops.scaled_grouped_mm_quantized(codes, scales, x_recipe, x.shape[1], sizes, w, w_recipe)
    row_of = torch.empty_like(order)
    row_of[order] = torch.arange(order.numel())
    return rows, sizes, y, moe.combine(y.bfloat16().float(), gates, row_of)


@pytest.mark.parametrize("tokens", [(23, 41), (0, 30)])
def test_in_process_exchange_matches_one_process(gen, tokens):
    """octet's C++ exchange (moe_dispatch_host, grouped GEMM, moe_combine_host, bf16 wire) over 2
    in-process ranks: every rank's combined output equals one process's block on its own tokens
    (X quantized once and permuted, all experts), bit for bit; rank 1 with no tokens included."""
    E, d, n, k = 4, 256, 96, 2
    xs = [_data(gen, t, d) for t in tokens]
    idx = [torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(t)]) if t else
           torch.zeros(0, k, dtype=torch.int64) for t in tokens]
    gates = [torch.softmax(torch.randn(t, k, generator=gen), -1) for t in tokens]
    w = _data(gen, E * n, d).view(E, n, d)
    res = _ops.moe_exchange_in_process(xs, idx, gates, w, E)
    for r in range(2):
        _, _, _, out = one_process_exchange(xs[r], idx[r], gates[r], w)
        assert torch.equal(res[6 * r + 4], out), r


def _tiny_hf_moe(kind):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("transformers.integrations.moe")
    common = dict(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, num_experts_per_tok=2, max_position_embeddings=64)
    if kind == "mixtral":
        return transformers.MixtralConfig(num_local_experts=4, **common)
    return transformers.Qwen3MoeConfig(num_experts=4, moe_intermediate_size=256, head_dim=32, **common)


@pytest.mark.parametrize("kind", ["mixtral", "qwen3_moe"])
def test_hf_experts_implementation_against_float64_and_trains(gen, kind):
    from transformers import AutoModelForCausalLM

    cfg = _tiny_hf_moe(kind)
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    name = moe.register_hf_experts("blockwise")
    model = AutoModelForCausalLM.from_config(cfg, experts_implementation=name)
    experts = model.model.layers[0].mlp.experts
    # The experts module alone: octet's FP8 forward and backward against the eager float64 module.
    h = _data(gen, 48, 128, decades=0).requires_grad_()
    idx = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(48)])
    wts = torch.softmax(torch.randn(48, 2, generator=gen), -1)
    dout = _data(gen, 48, 128, decades=0)
    out = experts(h, idx, wts)
    out.backward(dout)
    import copy

    ref = copy.deepcopy(experts).double()
    ref.config._experts_implementation = "eager"
    h64 = h.detach().double().requires_grad_()
    out64 = ref(h64, idx, wts.double())
    out64.backward(dout.double())
    errs = {"out": _rel(out, out64), "dh": _rel(h.grad, h64.grad),
            "dgate_up": _rel(experts.gate_up_proj.grad, ref.gate_up_proj.grad),
            "ddown": _rel(experts.down_proj.grad, ref.down_proj.grad)}
    print(f"\n{kind} experts (octet_blockwise) against float64: " + ", ".join(f"{k} {v:.4f}" for k, v in errs.items()))
    assert errs["out"] <= 2 * (2**-4 + 2**-4) and all(v <= 5 * 2**-4 for v in errs.values()), errs
    # The whole model trains with its experts in FP8; its state_dict is the model's own.
    keys = set(AutoModelForCausalLM.from_config(cfg).state_dict())
    assert set(model.state_dict()) == keys
    ids = torch.randint(0, 64, (4, 16), generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses


def test_moe_compiles_fullgraph(gen):
    """The whole block compiles without a graph break; inductor computes the float32 parts (softmax,
    SiLU, the combine) in its own order, so results agree with eager to float32 rounding, not bits
    (the FP8 grouped GEMMs themselves are bit for bit: test_compiles_fullgraph_and_equals_eager)."""
    torch._dynamo.reset()
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    m = ot.MoE(128, 64, 4, k=2, recipe="blockwise")
    x = _data(gen, 40, 128, decades=0)
    eager = m(x)
    eager.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    out = torch.compile(m, fullgraph=True)(x)
    out.square().sum().backward()
    assert _rel(out, eager.detach().double()) < 1e-5
    # A float32 difference can move a value across a rounding boundary of an FP8 quantizer
    # downstream (a code one step off, or a block's scale a few ulps off): the gradients then differ
    # by a small part of the FP8 error itself (about 0.06 against float64; measured up to 1.2e-3).
    for n, p in m.named_parameters():
        assert _rel(p.grad, grads[n].double()) < 2**-6, n
