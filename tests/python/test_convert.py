"""octet.torch.convert on the models people train: what it converts and what it leaves (with the
reason), Hugging Face GPT-2's Conv1D, dimensions that are not multiples of a recipe's block (padded
inside: bit for bit the unpadded layer), the output head kept in high precision, and state dicts that
load strictly into the unconverted model and back (the per-step FP8 state travels in linear_state()).

Oracles: the unpadded layer itself (bit for bit), the float model (within FP8's error), the
unconverted model's state dict (keys, shapes, values)."""

import logging

import pytest
import torch
from torch import nn

import octet.torch as ot

RECIPES = list(ot.LINEAR_RECIPES)


def rel_l2(x, ref):
    return float((x.detach().double() - ref.detach().double()).norm() / ref.detach().double().norm())


@pytest.mark.parametrize("recipe", RECIPES)
def test_padding_inside_is_bit_for_bit_the_unpadded_layer(gen, recipe):
    # 100 -> 72 features: no multiple of 16, 32 or 128; what the CUDA kernels would get padded
    base = nn.Linear(100, 72)
    runs = []
    for pad in ("never", "always"):
        layer = ot.Float8Linear.from_float(base, recipe=recipe, seed=3)
        layer.pad_features = pad
        x = torch.randn(37, 100, generator=torch.Generator().manual_seed(5)).requires_grad_()
        outs = []
        for step in range(2):  # a second step: delayed scaling's histories and the Philox offsets move on
            base.zero_grad()
            x.grad = None
            y = layer(x)
            y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(7 + step)) * 1e-3)
            outs.append([y.detach().clone(), x.grad.clone(), base.weight.grad.clone(), base.bias.grad.clone()])
        runs.append((outs, ot.linear_state(layer)))
    (a, sa), (b, sb) = runs
    for step_a, step_b in zip(a, b):
        for u, v in zip(step_a, step_b):
            assert torch.equal(u, v)
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    with pytest.raises(ValueError, match="pad_features"):
        layer.pad_features = "sometimes"
        layer(x)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 320)
        self.up = nn.Linear(320, 320)
        self.attn = nn.MultiheadAttention(320, 4, batch_first=True)  # out_proj: a Linear subclass
        self.down = nn.Linear(320, 96)
        self.lm_head = nn.Linear(96, 50, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        h = torch.relu(self.up(h))
        h = h + self.attn(h, h, h, need_weights=False)[0]
        return self.lm_head(torch.relu(self.down(h)))


def test_report_names_every_linear_and_why(caplog):
    model = Tiny()
    with caplog.at_level(logging.INFO, logger="octet.torch"):
        model, report = ot.convert(model, recipe="blockwise", return_report=True)
    assert report.converted == ["up", "down"]
    assert report.padded == ["up", "down"]  # 320 and 96 are not multiples of 128
    assert "output head" in report.skipped["lm_head"]
    assert "subclasses nn.Linear" in report.skipped["attn.out_proj"]
    assert isinstance(model.up, ot.Float8Linear) and type(model.lm_head) is nn.Linear
    assert "2 converted, 2 skipped" in caplog.text
    ids = torch.randint(0, 50, (2, 9))
    model(ids).sum().backward()  # 320 and 96 features convert and train (the CPU takes any shape)
    # the filter, in either form, and the output head on request
    model2, r2 = ot.convert(Tiny(), recipe="mxfp8", module_filter_fn=lambda m, fqn: fqn != "down",
                            keep_output_head=False, return_report=True)
    assert r2.converted == ["up", "lm_head"] and r2.skipped["down"] == "the filter left it out"
    _, r3 = ot.convert(Tiny(), filter=lambda fqn, m: fqn == "down", return_report=True)
    assert r3.converted == ["down"]


@pytest.mark.parametrize("recipe", ["tensorwise_delayed", "nvfp4", "blockwise"])
def test_state_dicts_load_strictly_both_ways_and_linear_state_resumes(recipe):
    torch.manual_seed(0)
    plain = Tiny()
    converted = ot.convert(Tiny(), recipe=recipe)
    converted.load_state_dict(plain.state_dict(), strict=True)  # unconverted -> converted
    plain.load_state_dict(converted.state_dict(), strict=True)  # converted -> unconverted
    assert converted.state_dict().keys() == plain.state_dict().keys()

    # a bit-exact resume: the state dict plus linear_state() after 3 steps, 2 more steps on each
    def steps(model, opt, n, seed):
        g = torch.Generator().manual_seed(seed)
        losses = []
        for _ in range(n):
            loss = model(torch.randint(0, 50, (2, 9), generator=g)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return losses

    opt = torch.optim.SGD(converted.parameters(), lr=0.1)
    steps(converted, opt, 3, 1)
    saved, saved_fp8 = {k: v.clone() for k, v in converted.state_dict().items()}, ot.linear_state(converted)
    go_on = steps(converted, opt, 2, 2)
    resumed = ot.convert(Tiny(), recipe=recipe)
    resumed.load_state_dict(saved, strict=True)
    ot.load_linear_state(resumed, saved_fp8)
    again = steps(resumed, torch.optim.SGD(resumed.parameters(), lr=0.1), 2, 2)
    assert all(torch.equal(a, b) for a, b in zip(go_on, again))
    if recipe != "blockwise":
        assert saved_fp8  # the state the state dict leaves out
        with pytest.raises(ValueError, match="missing"):
            ot.load_linear_state(resumed, {})


def test_gpt2_conv1d_converts_trains_and_keeps_its_state_dict():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=128, n_layer=2, n_head=2,
                                  attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(cfg)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    model, report = ot.convert(model, recipe="mxfp8", return_report=True)
    # c_attn, c_proj (attention), c_fc, c_proj (MLP) per layer; the tied lm_head stays
    assert len(report.converted) == 8 and all(isinstance(model.get_submodule(n), ot.Float8Conv1D)
                                              for n in report.converted)
    assert "lm_head" in report.skipped
    model.load_state_dict(ref.state_dict(), strict=True)
    ref.load_state_dict(model.state_dict(), strict=True)
    ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        lr, lo = ref(input_ids=ids).logits, model(input_ids=ids).logits
    assert rel_l2(lo, lr) < 0.1
    losses = {}
    for name, m in (("float", ref), ("octet", model)):
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
        run = []
        for _ in range(15):
            out = m(input_ids=ids, labels=ids)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
            run.append(float(out.loss))
        losses[name] = run
    assert losses["octet"][0] - losses["octet"][-1] > 1.0
    assert abs(losses["octet"][-1] - losses["float"][-1]) < 0.1, losses
