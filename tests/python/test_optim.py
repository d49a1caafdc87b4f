"""octet's fused AdamW step (torch.ops.octet.adamw_step) and octet.torch.AdamW.

Oracles: PyTorch's AdamW formula in float64 (written here: decoupled weight decay, bias
correction), the moment codecs' documented per-element error bounds (octet/optim/state_codec.hpp)
with the codes decoded here from their definitions (torch's own float8_e4m3fn decode for the E4M3
codecs, the dynamic map's closed form), and torch.optim.AdamW itself.
"""

import copy
import io
import math

import pytest
import torch

import octet.torch as ot
from octet.torch import optim as oo

ops = torch.ops.octet
CODECS = oo.CODECS
MASTERS = oo.MASTERS


def f32(x):
    """A hyperparameter as the step sees it (float), widened: the comparison measures the step."""
    return float(torch.tensor(x, dtype=torch.float32))


def reference_step(w, m, v, g, *, lr, beta1, beta2, eps, weight_decay, t):
    """PyTorch's AdamW in float64: returns (w', m', v', u) with u the Adam direction."""
    b1, b2, eps, wd = f32(beta1), f32(beta2), f32(eps), f32(weight_decay)
    w, m, v, g = (x.double() for x in (w, m, v, g))
    w = w * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    u = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
    return w - lr * u, m, v, u


# ---- the codecs' decoders, from their definitions (state_codec.hpp) ----


def _dynamic_map(bits):
    """value(i) = 10^-z (0.1 + 0.9 (f + 1) / 2^r), r = floor(log2 i), z = bits - 1 - r, f = i - 2^r."""
    vals = [0.0]
    for i in range(1, 1 << bits):
        r = i.bit_length() - 1
        z, f = bits - 1 - r, i - (1 << r)
        vals.append(float(torch.tensor(10.0**-z * (0.1 + 0.9 * (f + 1) / 2**r), dtype=torch.float32)))
    return torch.tensor(vals, dtype=torch.float64)


MAP7, MAP8 = _dynamic_map(7), _dynamic_map(8)


def _per_element(meta_rows, group, n):
    return meta_rows.repeat_interleave(group, dim=0)[:n]


def _e4m3(codes):
    return codes.view(torch.float8_e4m3fn).double()


def decode_moment(codec, codes, meta, n, second):
    """The moment a codec's codes hold (float64), and the value the codec stores (sqrt(v) for the
    second moment of the 8-bit codecs) for the error bounds."""
    if codec in ("fp32", "bf16", "bf16_stochastic"):
        x = codes.double()
        x = x.abs() if second else x
        return x, x
    mag = codes & 0x7F
    if codec == "e4m3_scaled":
        scale = _per_element(meta.view(torch.float32).double(), 128, n)
        a = _e4m3(mag if second else codes) * scale
    elif codec == "e4m3_expanded":
        c, k, s = _per_element(meta.view(torch.float32).double().view(-1, 3), 128, n).unbind(1)
        y = _e4m3(mag)
        a = torch.where(mag == 0, 0.0, torch.exp2(c + (torch.log2(y.clamp_min(1e-30)) - s) / k))
        if not second:
            a = torch.where(codes >= 128, -a, a)
    else:  # dynamic8
        absmax = _per_element(meta.view(torch.float32).double(), 256, n)
        if second:
            a = MAP8[codes.long()] * absmax
        else:
            a = MAP7[mag.long()] * absmax
            a = torch.where(codes >= 128, -a, a)
    return (a * a if second else a), a


def codec_bound(codec, target, meta, n, second):
    """The documented per-element error bound on the stored value x = target (state_codec.hpp)."""
    x = target.abs()
    if codec == "fp32":
        return 2**-22 * x  # the float computation of m' and v' only
    if codec == "bf16":
        return 2**-8 * x
    if codec == "bf16_stochastic":
        return 2**-7 * x
    if codec == "e4m3_scaled":
        s = _per_element(meta.view(torch.float32).double(), 128, n)
        return 2**-4 * x + 2**-9 * s
    if codec == "e4m3_expanded":
        c, k, s_log2 = _per_element(meta.view(torch.float32).double().view(-1, 3), 128, n).unbind(1)
        scaled = torch.where(k == 1, 2**-9 * torch.exp2(c - s_log2), 0.0)  # k = 1: scaled E4M3, scale 2^(c - s)
        return (torch.exp2(math.log2(1 + 2**-4) / k) - 1) * x + 1e-5 * x + scaled
    # dynamic8: half the gap between the neighbouring map entries around x, times the absmax
    absmax = _per_element(meta.view(torch.float32).double(), 256, n)
    table = MAP8 if second else MAP7
    r = (x / absmax).clamp(0, 1)
    hi = torch.searchsorted(table, r).clamp(1, len(table) - 1)
    bound = (table[hi] - table[hi - 1]) / 2 * absmax * (1 + 1e-6)
    if second:  # the floor: a non-zero v below the smallest entry decodes as that entry
        bound = torch.where((r < table[1]) & (x > 0), table[1] * absmax, bound)
    return bound


def check_moment(codec, codes, meta, truth, second):
    """Decoded codes within the codec's bound of the float64 moment (on sqrt(v) for the 8-bit codecs)."""
    n = truth.numel()
    decoded, stored = decode_moment(codec, codes, meta, n, second)
    eight_bit = codec in ("e4m3_scaled", "e4m3_expanded", "dynamic8")
    target = truth.sqrt() if (second and eight_bit) else truth
    err = (stored - target).abs()
    bound = codec_bound(codec, target, meta, n, second) + 2**-22 * target.abs()  # + the float m', v'
    assert (err <= bound).all(), f"{codec}: worst excess {(err - bound).max().item():.3g} at {(err - bound).argmax()}"
    if second:
        assert (decoded >= 0).all() and (decoded[truth > 0] > 0).all()  # never negative, never lost


# ---- one step against the float64 reference ----


def fresh(param, codec, master):
    return oo.new_state(param, codec, codec, master)


def run_op(param, state, grad, codec, master, *, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01,
           step=1, seed=0, on_nonfinite="skip_step", element_offset=0):
    return oo.adamw_step(param, state, grad, m_codec=codec, v_codec=codec, master=master, lr=lr, beta1=beta1,
                         beta2=beta2, eps=eps, weight_decay=weight_decay, step=step, seed=seed,
                         on_nonfinite=on_nonfinite, element_offset=element_offset)


@pytest.mark.parametrize("codec", CODECS)
def test_one_step_fp32_master_against_float64(codec, gen):
    n = 1000  # ragged: 3 full blocks of 256 and part of a fourth
    w = torch.randn(n, generator=gen)
    g = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-12, 4, (n,), generator=gen).float())
    g[::97] = 0.0  # elements without gradient: u = 0 exactly, the weight only decays
    lr, wd = 3e-3, 0.1
    param, state = w.clone(), fresh(w, codec, "fp32")
    report = run_op(param, state, g, codec, "fp32", lr=lr, weight_decay=wd, step=1)
    assert report.tolist() == [0, 0, 0]
    w_ref, m_ref, v_ref, u_ref = reference_step(w, 0 * w, 0 * w, g, lr=lr, beta1=0.9, beta2=0.999, eps=1e-8,
                                                weight_decay=wd, t=1)
    # The step updates the weight from the float moments before it encodes them (adamw.hpp), so
    # the weight is within a few float ulps of the terms w (1 - lr wd) and lr u for every codec.
    tol = 2**-21 * (w.double().abs() + lr * u_ref.abs())
    err = (param.double() - w_ref).abs()
    assert (err <= tol).all(), f"worst {(err / tol).max().item():.3g} of the tolerance"
    check_moment(codec, state["m_codes"], state["m_meta"], m_ref, second=False)
    check_moment(codec, state["v_codes"], state["v_meta"], v_ref, second=True)


@pytest.mark.parametrize("codec", ["fp32", "e4m3_expanded", "dynamic8"])
def test_second_step_reads_the_decoded_moments(codec, gen):
    # Step 2 starts from the codes: the reference starts from the decoded step-1 moments, so the
    # weights agree to float rounding plus the decoder's difference (octet's log2/exp2 for e4m3_expanded).
    n = 700
    w, g1, g2 = (torch.randn(n, generator=gen) for _ in range(3))
    param, state = w.clone(), fresh(w, codec, "fp32")
    run_op(param, state, g1, codec, "fp32", step=1)
    m1, _ = decode_moment(codec, state["m_codes"], state["m_meta"], n, False)
    v1, _ = decode_moment(codec, state["v_codes"], state["v_meta"], n, True)
    w1 = param.clone()
    run_op(param, state, g2, codec, "fp32", lr=2e-3, step=2)
    w_ref, _, _, u_ref = reference_step(w1, m1, v1, g2, lr=2e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                                        weight_decay=0.01, t=2)
    rel = 2**-20 if codec != "e4m3_expanded" else 2**-20 + 1e-5
    tol = 2**-21 * w1.double().abs() + rel * 2e-3 * u_ref.abs() + 1e-12
    assert ((param.double() - w_ref).abs() <= tol).all()


@pytest.mark.parametrize("master", ["bf16_nearest", "bf16_stochastic", "bf16_kahan"])
def test_one_step_bf16_master(master, gen):
    n = 777
    w = torch.randn(n, generator=gen).bfloat16()
    g = torch.randn(n, generator=gen).bfloat16()
    lr = 1e-2
    param, state = w.clone(), fresh(w, "bf16_stochastic", master)
    run_op(param, state, g, "bf16_stochastic", master, lr=lr, seed=7)
    w_ref, _, _, _ = reference_step(w, 0 * w, 0 * w, g, lr=lr, beta1=0.9, beta2=0.999, eps=1e-8,
                                    weight_decay=0.01, t=1)
    ulp = torch.exp2(torch.floor(torch.log2(w_ref.abs())) - 7)  # one bf16 ulp at the target
    slack = 2**-21 * (w.double().abs() + lr)
    got = param.double()
    if master == "bf16_nearest":
        assert ((got - w_ref).abs() <= ulp / 2 + slack).all()
    elif master == "bf16_stochastic":
        assert ((got - w_ref).abs() < ulp + slack).all()
        # unbiased: over 777 elements the rounding errors average out to well under an ulp
        assert abs(((got - w_ref) / ulp).mean().item()) < 0.15
    else:  # Kahan: w + c carries ~16 significant bits
        total = got + state["compensation"].double()
        assert ((total - w_ref).abs() <= 2**-16 * w_ref.abs() + slack).all()
        assert ((got - w_ref).abs() <= ulp / 2 + slack).all()  # w alone is the nearest bf16


def test_bf16_gradients_match_float_gradients(gen):
    # A bf16 gradient is read as its float value: the same step as the float32 copy of it.
    n = 513
    w, g = torch.randn(n, generator=gen), torch.randn(n, generator=gen).bfloat16()
    a, b = w.clone(), w.clone()
    sa, sb = fresh(w, "dynamic8", "fp32"), fresh(w, "dynamic8", "fp32")
    run_op(a, sa, g, "dynamic8", "fp32")
    run_op(b, sb, g.float(), "dynamic8", "fp32")
    assert torch.equal(a, b) and all(torch.equal(sa[k], sb[k]) for k in sa)


# ---- octet.torch.AdamW ----


def test_agrees_with_torch_adamw(gen):
    # fp32 moments and weights: the same formula as torch.optim.AdamW up to the order of float
    # operations (torch lerps m, octet uses an fma); after 10 steps the weights differ by at most
    # 1e-6 |w| + 1e-5 lr (a float ulp of the first steps' lr / (1 - beta1^t) = 10 lr times a few).
    shapes = [(37, 19), (300,), (5,)]
    ws = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(10)]
    ours = [torch.nn.Parameter(w.clone()) for w in ws]
    theirs = [torch.nn.Parameter(w.clone()) for w in ws]
    kw = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
    a = ot.AdamW(ours, m_codec="fp32", v_codec="fp32", master="fp32", **kw)
    b = torch.optim.AdamW(theirs, **kw)
    for gs in grads:
        for p, q, g in zip(ours, theirs, gs):
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-5 * kw["lr"])
        assert a.state[p]["step"] == 10
    # the moments too (fp32 codes hold them as they are)
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(a.state[p]["m_codes"].view(q.shape), b.state[q]["exp_avg"], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(a.state[p]["v_codes"].view(q.shape), b.state[q]["exp_avg_sq"], rtol=1e-5,
                                   atol=1e-12)


def _model(gen, dtype=torch.float32):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).to(dtype)


def _grads_for(model, x, y):
    model.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x).float(), y)
    loss.backward()
    return loss.item()


def _state_tensors(opt):
    return [(k, v) for p in opt.state for k, v in opt.state[p].items() if isinstance(v, torch.Tensor)]


def _bitwise_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


CONFIGS = [("e4m3_expanded", "fp32"), ("dynamic8", "bf16_kahan"), ("bf16_stochastic", "bf16_stochastic"),
           ("e4m3_scaled", "bf16_nearest")]


@pytest.mark.parametrize("codec,master", CONFIGS)
def test_state_dict_round_trip_is_bit_exact(codec, master, gen):
    dtype = torch.float32 if master == "fp32" else torch.bfloat16
    model = _model(gen, dtype)
    x, y = torch.randn(64, 8, generator=gen).to(dtype), torch.randn(64, 1, generator=gen)
    opt = ot.AdamW(model.parameters(), lr=1e-2, m_codec=codec, v_codec=codec, master=master, seed=11)
    for _ in range(3):
        _grads_for(model, x, y)
        opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    other = ot.AdamW(model.parameters(), lr=5.0, m_codec="fp32", v_codec="fp32", master=master, seed=0)
    other.load_state_dict(torch.load(buf))
    assert [(k, g[k]) for g in other.param_groups for k in g if k != "params"] == \
        [(k, g[k]) for g in opt.param_groups for k in g if k != "params"]
    mine, theirs = _state_tensors(opt), _state_tensors(other)
    assert [k for k, _ in mine] == [k for k, _ in theirs] and len(mine) == 5 * len(list(model.parameters()))
    assert all(_bitwise_equal(a, b) for (_, a), (_, b) in zip(mine, theirs))
    assert all(a.data_ptr() != b.data_ptr() for (_, a), (_, b) in zip(mine, theirs) if a.numel())  # copies
    for p in model.parameters():
        assert {k: v for k, v in other.state[p].items() if not isinstance(v, torch.Tensor)} == \
            {k: v for k, v in opt.state[p].items() if not isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("codec,master", CONFIGS[:3])
def test_resumed_run_continues_bit_identically(codec, master, gen):
    dtype = torch.float32 if master == "fp32" else torch.bfloat16
    base = _model(gen, dtype)
    data = [(torch.randn(32, 8, generator=gen).to(dtype), torch.randn(32, 1, generator=gen)) for _ in range(6)]

    def make(model):
        opt = ot.AdamW(model.parameters(), lr=1e-2, m_codec=codec, v_codec=codec, master=master, seed=1234)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    def train(model, opt, sched, batches):
        for x, y in batches:
            _grads_for(model, x, y)
            opt.step()
            sched.step()

    straight = copy.deepcopy(base)
    opt_straight, sched = make(straight)
    train(straight, opt_straight, sched, data)

    first = copy.deepcopy(base)
    opt, sched = make(first)
    train(first, opt, sched, data[:3])
    buf = io.BytesIO()
    torch.save({"model": first.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf)
    resumed = copy.deepcopy(base)
    resumed.load_state_dict(saved["model"])
    opt2, sched2 = make(resumed)
    opt2.load_state_dict(saved["opt"])
    sched2.load_state_dict(saved["sched"])
    train(resumed, opt2, sched2, data[3:])
    for p, q in zip(straight.parameters(), resumed.parameters()):
        assert _bitwise_equal(p.detach(), q.detach())
    assert all(_bitwise_equal(a, b) for (_, a), (_, b) in zip(_state_tensors(opt_straight), _state_tensors(opt2)))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 2.0**64])
def test_skip_step_leaves_everything_untouched(bad, gen):
    model = _model(gen)
    x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 1, generator=gen)
    opt = ot.AdamW(model.parameters(), lr=1e-2, m_codec="e4m3_expanded", v_codec="e4m3_expanded")
    _grads_for(model, x, y)
    opt.step()
    before = [p.detach().clone() for p in model.parameters()]
    state_before = [(k, v.clone()) for k, v in _state_tensors(opt)]
    _grads_for(model, x, y)
    params = list(model.parameters())
    params[2].grad.view(-1)[5] = bad  # one element of one parameter
    params[0].grad.view(-1)[0] = bad
    opt.step()
    assert opt.report == {"nonfinite_gradients": 2, "blocks_zeroed": 0, "skipped": 1}
    assert all(_bitwise_equal(a, p.detach()) for a, p in zip(before, model.parameters()))
    assert all(_bitwise_equal(a, b) for (_, a), (_, b) in zip(state_before, _state_tensors(opt)))
    assert all(opt.state[p]["step"] == 1 for p in params)
    _grads_for(model, x, y)
    opt.step()
    assert opt.report["skipped"] == 0 and all(opt.state[p]["step"] == 2 for p in params)
    assert opt.totals["skipped"] == 1 and opt.totals["nonfinite_gradients"] == 2
    assert not all(_bitwise_equal(a, p.detach()) for a, p in zip(before, model.parameters()))


def test_zero_block_resets_only_the_offending_block(gen):
    n = 1000
    w = torch.randn(n, generator=gen)
    p = torch.nn.Parameter(w.clone())
    opt = ot.AdamW([p], m_codec="dynamic8", v_codec="dynamic8", on_nonfinite="zero_block")
    p.grad = torch.randn(n, generator=gen)
    opt.step()
    w1 = p.detach().clone()
    p.grad = torch.randn(n, generator=gen)
    p.grad[300] = float("nan")  # block 1 (elements 256..511)
    opt.step()
    assert opt.report == {"nonfinite_gradients": 1, "blocks_zeroed": 1, "skipped": 0}
    s = opt.state[p]
    assert torch.equal(p.detach()[256:512], w1[256:512])
    assert (s["m_codes"][256:512] == 0).all() and (s["v_codes"][256:512] == 0).all()
    assert (s["m_meta"].view(torch.float32)[1] == 0).all() and (s["v_meta"].view(torch.float32)[1] == 0).all()
    assert not torch.equal(p.detach()[:256], w1[:256]) and not torch.equal(p.detach()[512:], w1[512:])


@pytest.mark.parametrize("codec,master", [("e4m3_expanded", "fp32"), ("dynamic8", "bf16_stochastic")])
def test_tiny_model_trains(codec, master, gen):
    dtype = torch.float32 if master == "fp32" else torch.bfloat16
    model = _model(gen, dtype)
    x = torch.randn(256, 8, generator=gen)
    y = torch.sin(x.sum(1, keepdim=True))
    opt = ot.AdamW(model.parameters(), lr=1e-2, m_codec=codec, v_codec=codec, master=master)
    first = _grads_for(model, x.to(dtype), y)
    for _ in range(150):
        opt.step()
        last = _grads_for(model, x.to(dtype), y)
    assert last < 0.3 * first, (first, last)


def test_parameters_get_disjoint_offsets(gen):
    ps = [torch.nn.Parameter(torch.randn(n, generator=gen)) for n in (300, 1, 256, 10)]
    opt = ot.AdamW(ps)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step()
    assert [opt.state[p]["element_offset"] for p in ps] == [0, 512, 768, 1024]


def test_parameters_without_gradients_are_left_alone(gen):
    a, b = torch.nn.Parameter(torch.randn(10, generator=gen)), torch.nn.Parameter(torch.randn(10, generator=gen))
    b0 = b.detach().clone()
    opt = ot.AdamW([a, b])
    a.grad = torch.randn(10, generator=gen)
    opt.step()
    assert torch.equal(b.detach(), b0) and len(opt.state[b]) == 0 and opt.state[a]["step"] == 1


# ---- opcheck ----


OPCHECK_CASES = [  # (codec, master, n, gradient dtype): ragged, empty, one exact block
    ("fp32", "fp32", 300, torch.float32),
    ("e4m3_expanded", "bf16_kahan", 513, torch.bfloat16),
    ("dynamic8", "bf16_stochastic", 256, torch.bfloat16),
    ("bf16", "fp32", 0, torch.float32),
    ("e4m3_scaled", "bf16_nearest", 129, torch.float32),
]


def _samples(gen):
    out = []
    for codec, master, n, gdt in OPCHECK_CASES:
        pdt = torch.float32 if master == "fp32" else torch.bfloat16
        p = torch.randn(n, generator=gen).to(pdt)
        s = fresh(p, codec, master)
        g = torch.randn(n, generator=gen).to(gdt)
        out.append((p, s["compensation"], s["m_codes"], s["m_meta"], s["v_codes"], s["v_meta"], g, codec, codec,
                    master, 1e-3, 0.9, 0.999, 1e-8, 0.01, 3, 5, "skip_step", 256))
    return out


def test_opcheck(gen):
    for args in _samples(gen):
        torch.library.opcheck(ops.adamw_step, args)
    for g in (torch.randn(100, generator=gen), torch.tensor([1.0, float("nan")]).bfloat16(), torch.empty(0)):
        torch.library.opcheck(ops.adamw_count_nonfinite, (g,))
    assert ops.adamw_count_nonfinite(torch.tensor([1.0, float("nan"), float("inf"), 2.0**63, 2.0**62])).item() == 3


def test_state_sizes():
    s = oo.state_sizes("e4m3_expanded", "e4m3_expanded", "bf16_kahan", 300)
    assert s == {"m_code_dtype": torch.uint8, "m_meta_bytes": 3 * 12, "v_code_dtype": torch.uint8,
                 "v_meta_bytes": 3 * 12, "compensation": 300, "param_dtype": torch.bfloat16}
    s = oo.state_sizes("fp32", "bf16", "fp32", 1000)
    assert (s["m_code_dtype"], s["v_code_dtype"], s["m_meta_bytes"], s["compensation"]) == \
        (torch.float32, torch.bfloat16, 0, 0)
    assert oo.state_sizes("dynamic8", "dynamic8", "fp32", 257)["v_meta_bytes"] == 8


# ---- bad input ----


def test_bad_input_raises_naming_the_argument(gen):
    n = 300
    p = torch.randn(n, generator=gen)
    s = fresh(p, "e4m3_expanded", "fp32")
    g = torch.randn(n, generator=gen)

    def call(**kw):
        a = dict(param=p, state=s, grad=g, codec="e4m3_expanded", master="fp32")
        a.update(kw)
        return run_op(a.pop("param"), a.pop("state"), a.pop("grad"), a.pop("codec"), a.pop("master"), **a)

    with pytest.raises(TypeError, match="'params'"):
        call(param=p.double())
    with pytest.raises(TypeError, match="'params'"):
        call(master="bf16_stochastic")  # a float32 parameter with a bf16 master policy
    with pytest.raises(TypeError, match="'grads'"):
        call(grad=g.half())
    with pytest.raises(ValueError, match="'grads'"):
        call(grad=g[:-1])
    with pytest.raises(ValueError, match="'grads'"):
        call(grad=torch.randn(2 * n, generator=gen)[::2])
    with pytest.raises(ValueError, match="'m_codes'"):
        call(state={**s, "m_codes": s["m_codes"][:-1]})
    with pytest.raises(TypeError, match="'v_codes'"):
        call(state={**s, "v_codes": s["v_codes"].float()})
    with pytest.raises(ValueError, match="'m_meta'"):
        call(state={**s, "m_meta": torch.zeros(8, dtype=torch.uint8)})
    with pytest.raises(ValueError, match="'v_meta'"):
        call(state={**s, "v_meta": torch.zeros(40, dtype=torch.uint8)[1:37]})  # misaligned floats
    with pytest.raises(ValueError, match="'compensation'"):
        call(state={**s, "compensation": torch.zeros(n, dtype=torch.bfloat16)})
    with pytest.raises(ValueError, match="'grads' shares memory with 'params'"):
        call(grad=p)
    with pytest.raises(ValueError, match="'v_codes' shares memory with 'm_codes'"):
        call(state={**s, "v_codes": s["m_codes"]})
    with pytest.raises(ValueError, match="'m_codec'"):
        call(codec="e4m3")
    with pytest.raises(ValueError, match="'master'"):
        call(master="fp16")
    with pytest.raises(ValueError, match="'on_nonfinite'"):
        call(on_nonfinite="ignore")
    with pytest.raises(ValueError, match="'step'"):
        call(step=0)
    with pytest.raises(ValueError, match="element_offset"):
        call(element_offset=100)
    with pytest.raises(ValueError, match="eps"):
        call(eps=0.0)
    with pytest.raises(ValueError, match="beta1"):
        call(beta1=1.0)
    with pytest.raises(ValueError, match="lr"):
        call(lr=float("nan"))
    with pytest.raises(ValueError, match="'v_codec'"):
        ops.adamw_step(p, s["compensation"], s["m_codes"], s["m_meta"], s["v_codes"], s["v_meta"], g,
                       "e4m3_expanded", "dynamic8", "fp32", 1e-3, 0.9, 0.999, 1e-8, 0.0, 1, 0, "skip_step", 0)
    with pytest.raises(ValueError, match="'n'"):
        oo.state_sizes("fp32", "fp32", "fp32", -1)
    # nothing was written by the refused calls
    assert (s["m_codes"] == 0).all() and (s["m_meta"] == 0).all()


def test_optimizer_bad_arguments(gen):
    p = torch.nn.Parameter(torch.randn(4, generator=gen))
    with pytest.raises(ValueError, match="'m_codec'"):
        ot.AdamW([p], m_codec="fp8")
    with pytest.raises(ValueError, match="'v_codec'"):
        ot.AdamW([p], m_codec="fp32", v_codec="bf16")
    with pytest.raises(ValueError, match="'master'"):
        ot.AdamW([p], master="fp16")
    with pytest.raises(ValueError, match="'on_nonfinite'"):
        ot.AdamW([p], on_nonfinite="ignore")
    with pytest.raises(ValueError, match="'eps'"):
        ot.AdamW([p], eps=0.0)
    with pytest.raises(TypeError, match="bfloat16"):
        ot.AdamW([p], master="bf16_stochastic")
    with pytest.raises(TypeError, match="float32"):
        ot.AdamW([torch.nn.Parameter(torch.randn(4, generator=gen).bfloat16())])
    opt = ot.AdamW([p], m_codec="dynamic8", v_codec="dynamic8")
    p.grad = torch.randn(4, generator=gen)
    opt.step()
    opt.param_groups[0]["m_codec"] = opt.param_groups[0]["v_codec"] = "e4m3_scaled"
    with pytest.raises(ValueError, match="cannot change"):
        opt.step()


def test_one_codec_named_sets_both(gen):
    p = torch.nn.Parameter(torch.randn(40, generator=gen))
    for kw in (dict(m_codec="bf16"), dict(v_codec="bf16")):
        opt = ot.AdamW([p], **kw)
        assert opt.param_groups[0]["m_codec"] == opt.param_groups[0]["v_codec"] == "bf16"
        p.grad = torch.randn(40, generator=gen)
        opt.step()
    assert ot.AdamW([p]).param_groups[0]["m_codec"] == oo.DEFAULT_CODEC


def _steps(params, opt, grads):
    for gs in grads:
        for p, g in zip(params, gs):
            p.grad = g.clone()
        opt.step()


@pytest.mark.parametrize("codec", ["fp32", "e4m3_expanded", "dynamic8"])
def test_state_moves_between_torch_adamw_and_octet(codec, gen):
    """torch.optim.AdamW -> octet (load_state_dict imports exp_avg / exp_avg_sq) and octet -> torch
    (torch_state_dict): the run continues as the other optimizer's would, exactly up to float order
    with fp32 moments, within the codec's error otherwise."""
    shapes = [(37, 19), (300,)]
    kw = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
    ws = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(6)]
    # an Adam update is about lr per element; an 8-bit codec's relative error (2^-4 for E4M3 at worst)
    # moves each of the 3 steps after the hand-over by at most about 0.1 lr
    tol = dict(rtol=1e-5, atol=1e-5 * kw["lr"]) if codec == "fp32" else dict(rtol=0, atol=3 * 0.1 * kw["lr"])

    # torch for 3 steps, then both continue from its state
    ref = [torch.nn.Parameter(w.clone()) for w in ws]
    torch_opt = torch.optim.AdamW(ref, **kw)
    _steps(ref, torch_opt, grads[:3])
    ours = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    octet_opt = ot.AdamW(ours, lr=1.0, m_codec=codec)  # lr, betas, eps, weight_decay come from the state
    octet_opt.load_state_dict(torch_opt.state_dict())
    assert octet_opt.param_groups[0]["lr"] == kw["lr"] and octet_opt.state[ours[0]]["step"] == 3
    _steps(ref, torch_opt, grads[3:])
    _steps(ours, octet_opt, grads[3:])
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p.detach(), q.detach(), **tol)

    # octet for 3 steps, then torch continues from its exported state
    ours = [torch.nn.Parameter(w.clone()) for w in ws]
    octet_opt = ot.AdamW(ours, m_codec=codec, **kw)
    _steps(ours, octet_opt, grads[:3])
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    torch_opt = torch.optim.AdamW(theirs, lr=1.0)
    torch_opt.load_state_dict(octet_opt.torch_state_dict())
    assert torch_opt.param_groups[0]["lr"] == kw["lr"]
    for p, q in zip(ours, theirs):  # the exported moments are what the codec decodes
        s = octet_opt.state[p]
        exp_avg = oo.decode_moment(s["m_codes"], s["m_meta"], codec, 1)
        assert torch.equal(torch_opt.state[q]["exp_avg"].reshape(-1), exp_avg)
    _steps(ours, octet_opt, grads[3:])
    _steps(theirs, torch_opt, grads[3:])
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p.detach(), q.detach(), **tol)


def test_torch_state_with_amsgrad_or_other_parameters_is_refused(gen):
    p = torch.nn.Parameter(torch.randn(8, generator=gen))
    t = torch.optim.AdamW([p], amsgrad=True)
    p.grad = torch.randn(8, generator=gen)
    t.step()
    with pytest.raises(ValueError, match="amsgrad"):
        ot.AdamW([torch.nn.Parameter(p.detach().clone())]).load_state_dict(t.state_dict())
    t2 = torch.optim.AdamW([p])
    t2.step()
    with pytest.raises(ValueError, match="same parameters"):
        ot.AdamW([torch.nn.Parameter(torch.zeros(9))]).load_state_dict(t2.state_dict())
