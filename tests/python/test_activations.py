"""compress_activations: what non-linear layers save for backward, stored in FP8 (issue 40).

Checked: the backward equals the float backward with each compressed tensor replaced by its
dequantized value, bit for bit (GELU, SiLU, LayerNorm, RMSNorm, a Hugging Face-style RMSNorm
module); the stored values against float64 within the recipe's half-unit bound; non-finite values
reach the gradient; what autograd keeps for a two-layer MLP, counted byte by byte, beside float32.
"""
import pytest
import torch
from torch import nn

import octet.torch as ot


def _dequantized(x, recipe):
    q, _, _ = ot.quantize(x.detach().reshape(-1, x.shape[-1]), recipe)
    return q.dequantize(x.dtype).reshape(x.shape)


class HFStyleRMSNorm(nn.Module):  # the shape of transformers' LlamaRMSNorm (composite ops)
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        v = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(v + self.eps))


@pytest.mark.parametrize("recipe", ["mxfp8_e4m3_ceil", "blockwise_1x128"])
@pytest.mark.parametrize("make", [nn.GELU, nn.SiLU, nn.ReLU])
def test_pointwise_backward_is_the_float_backward_at_the_dequantized_input(gen, recipe, make):
    # ragged: 37 x 3 rows, 200 features (not a multiple of 32 or 128); 1e-6 magnitudes and zero rows
    x = torch.randn(37, 3, 200, generator=gen) * torch.logspace(-6, 1, 200)
    x[5] = 0
    dy = torch.randn(x.shape, generator=gen)
    layer = make()
    with ot.compress_activations(layer, recipe=recipe, min_elements=1) as c:
        xa = x.clone().requires_grad_()
        y = layer(xa)
        y.backward(dy)
    assert c.modules == [""] and c.bytes_saved == x.numel() * 4
    # ReLU saves its output, GELU and SiLU their input
    saved = y.detach() if make is nn.ReLU else x
    ref_in = _dequantized(saved, recipe)
    if make is nn.ReLU:
        ref = torch.ops.aten.threshold_backward(dy, ref_in, 0.0)
    else:
        xr = ref_in.clone().requires_grad_()
        make()(xr).backward(dy)
        ref = xr.grad
    assert torch.equal(xa.grad, ref)
    assert torch.equal(y, make()(x))  # the forward is untouched


@pytest.mark.parametrize("recipe", ["mxfp8_e4m3_ceil", "blockwise_1x128"])
def test_stored_values_within_half_a_unit_of_float64(gen, recipe):
    x = (torch.randn(64, 256, generator=gen, dtype=torch.float64) * torch.logspace(-6, 2, 256, dtype=torch.float64))
    x[3] = 0
    xs = x.float()
    got = _dequantized(xs, recipe).double()
    info = ot.recipe_info(recipe)
    block = info.block_cols
    amax = xs.double().abs().reshape(64, -1, block).amax(-1, keepdim=True).expand(-1, -1, block).reshape(64, 256)
    # the block scale: pow2_ceil gives amax / 448 <= S < 2 amax / 448; amax_ratio S = amax / 448
    s_max = amax / 448 * (2 if info.name.endswith("_ceil") else 1)
    bound = torch.maximum(xs.double().abs() * 2.0**-4, s_max * 2.0**-10)
    err = (got - xs.double()).abs()
    assert (err <= bound * (1 + 1e-12)).all()
    assert torch.equal(got[3], torch.zeros(256, dtype=torch.float64))
    # an unbiased estimate: about 2^-4 / sqrt(12) relative RMS for values spread over binades
    rel = (err / xs.double().abs().clamp_min(1e-300))[xs.double().abs() > s_max * 2.0**-6]
    assert float(rel.pow(2).mean().sqrt()) < 2.0**-4


def test_layernorm_and_rmsnorm_backward_with_the_dequantized_input(gen):
    x = torch.randn(96, 160, generator=gen) * 3 + 1
    dy = torch.randn(96, 160, generator=gen)
    ln = nn.LayerNorm(160)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5, generator=gen)
        ln.bias.uniform_(-0.5, 0.5, generator=gen)
    with ot.compress_activations(ln, min_elements=1) as c:
        xa = x.clone().requires_grad_()
        ln(xa).backward(dy)
    # compressed: the input (96 x 160); kept: the per-row mean and 1/std ([96, 1], shorter than a block)
    assert c.bytes_saved == x.numel() * 4 and c.bytes_kept == 2 * 96 * 4
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [160], ln.weight, ln.bias, ln.eps)
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(dy, _dequantized(x, "mxfp8_e4m3_ceil"), [160], mean,
                                                           rstd, ln.weight, ln.bias, [True, True, True])
    assert torch.equal(xa.grad, dx) and torch.equal(ln.weight.grad, dw) and torch.equal(ln.bias.grad, db)
    # a composite RMSNorm (chosen by its class name): every float tensor its ops save is compressed
    norm = HFStyleRMSNorm(160)
    with ot.compress_activations(norm, min_elements=1) as c:
        xa = x.clone().requires_grad_()
        norm(xa).backward(dy)
    assert c.modules == [""] and c.bytes_saved >= x.numel() * 4
    ref = (xa.grad - torch.func.vjp(norm, x)[1](dy)[0]).norm() / xa.grad.norm()
    assert float(ref.detach()) < 0.1  # within FP8 storage error of the uncompressed backward


def test_non_finite_values_reach_the_gradient(gen):
    x = torch.randn(8, 64, generator=gen)
    x[2, 7] = float("inf")
    layer = nn.SiLU()
    with ot.compress_activations(layer, min_elements=1):
        xa = x.clone().requires_grad_()
        layer(xa).sum().backward()
    assert torch.isnan(xa.grad[2, :32]).all() and torch.isfinite(xa.grad[torch.arange(8) != 2]).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match="argument 'recipe'.*'tensorwise_e4m3'"):
        ot.compress_activations(nn.GELU(), recipe="tensorwise_e4m3")
    with pytest.raises(ValueError, match="argument 'min_elements'"):
        ot.compress_activations(nn.GELU(), min_elements=0)


class _Counter:
    """Bytes autograd keeps for backward, outside the compressed modules (a tensor saved twice
    counts once; parameters are not activations and are not counted)."""

    def __init__(self, model):
        self.bytes, self.seen = 0, {p.data_ptr() for p in model.parameters()}

    def pack(self, t):
        if t.data_ptr() not in self.seen:
            self.seen.add(t.data_ptr())
            self.bytes += t.numel() * t.element_size()
        return t


def test_saved_bytes_of_a_two_layer_mlp(gen):
    # What autograd keeps between forward and backward for Linear -> GELU -> Linear, 512 tokens,
    # 256 -> 1024 -> 256: float32 keeps X, H = X W1^T and GELU(H) (4.5 MiB); octet keeps the
    # Float8Linear copies (FP8 X^T and W^T, FP8 GELU(H)^T and W2^T) and GELU's input in FP8.
    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))

    x = torch.randn(512, 256, generator=gen)

    def saved(model, compress):
        counter = _Counter(model)
        c = ot.compress_activations(model) if compress else None
        with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
            y = model(x.clone().requires_grad_())
        total = counter.bytes + (c.bytes_stored + c.bytes_kept if c else 0)
        y.sum().backward()
        if c:
            c.remove()
        return total

    fp32 = saved(mlp(), False)
    fp8_linears = saved(ot.convert(mlp(), recipe="mxfp8", keep_output_head=False), False)
    octet = saved(ot.convert(mlp(), recipe="mxfp8", keep_output_head=False), True)
    assert fp32 == 4 * (512 * 256 + 2 * 512 * 1024)  # X, H and GELU(H); the weights (W^T views) are parameters
    # the FP8 linears alone keep GELU's float input; compressing it takes it to 1 byte and a 32nd
    expected_gelu = 512 * 1024 + 512 * 1024 // 32  # E4M3 codes and one UE8M0 scale per 32
    assert octet == fp8_linears - 4 * 512 * 1024 + expected_gelu
    assert octet < 0.4 * fp32  # 0.37x: the FP8 W^T copies (0.5 MiB) are a large share at 512 tokens
    print(f"saved for backward: fp32 {fp32 / 2**20:.2f} MiB, FP8 linears {fp8_linears / 2**20:.2f} MiB, "
          f"FP8 linears + compressed GELU {octet / 2**20:.2f} MiB ({octet / fp32:.3f}x)")
