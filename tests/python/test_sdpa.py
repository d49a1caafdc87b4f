"""octet.torch.scaled_dot_product_attention (SDPA's interface) and the Hugging Face attention backend.

Oracles: torch's own scaled_dot_product_attention in float64 on the original inputs (end to end:
FP8 inputs, P and dS; docs/attention.md's tolerances O 0.13, gradients 0.18 at head dims 64 and 128),
octet.torch.attention on the same tokens packed by hand (bit for bit: the entry only moves data),
and exact identities (padding query rows are 0 and get no gradient; a mask of all-valid tokens is
the unmasked call). The HF part trains a tiny random-init Llama (nothing downloaded) with padding and
-100 labels through convert(), the octet attention backend and octet's AdamW, against the float
model on the same seeds."""

import math

import pytest
import torch
import torch.nn.functional as F

import octet.torch as ot

E2E_O, E2E_GRAD = 0.13, 0.18


def rel_l2(x, ref):
    return float((x.detach().double() - ref.detach().double()).norm() / ref.detach().double().norm().clamp(min=1e-300))


def make_bhsd(gen, b, h, s, d, dtype=torch.float32, mean=False):
    """SDPA-layout inputs, made as a model makes them: a [b, s, h, d] projection transposed (a view)."""
    x = torch.randn(b, s, h, d, generator=gen) * (0.5 + 1.5 * torch.rand(b, s, h, 1, generator=gen))
    if mean:  # keys share a mean direction per head, as real keys do
        x = x + torch.randn(1, 1, h, d, generator=gen)
    return x.to(dtype).transpose(1, 2)


def qkv(gen, b, hq, hk, lq, lk, d, dtype=torch.float32):
    q = make_bhsd(gen, b, hq, lq, d, dtype) * 1.5
    return q, make_bhsd(gen, b, hk, lk, d, dtype, mean=True), make_bhsd(gen, b, hk, lk, d, dtype)


def sdpa64(q, k, v, **kw):
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_torch_sdpa_and_the_packed_call(gen, dtype, causal):
    b, hq, hk, s, d = 2, 4, 2, 100, 64
    q, k, v = qkv(gen, b, hq, hk, s, s, d, dtype)
    o = ot.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    assert o.shape == q.shape and o.dtype == dtype
    ref = sdpa64(q, k, v, is_causal=causal, enable_gqa=True)
    assert rel_l2(o, ref) < E2E_O + (0.01 if dtype != torch.float32 else 0)
    # the same tokens through octet.torch.attention in its own layout: bit for bit
    if dtype != torch.float16:
        direct = ot.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal, layout="bshd")
        assert torch.equal(o, direct.transpose(1, 2))


@pytest.mark.parametrize("d", [16, 80, 96])
def test_head_dims_served_by_padding(gen, d):
    b, h, s = 2, 2, 70
    q, k, v = qkv(gen, b, h, h, s, s, d)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o = ot.scaled_dot_product_attention(*leaves, is_causal=True)
    assert o.shape == (b, h, s, d)
    ref_leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_leaves, is_causal=True)
    # at d = 16 E4M3 inputs move the scores more than at 64 (fewer terms average the rounding)
    assert rel_l2(o, ref) < (0.2 if d < 32 else E2E_O)
    do = torch.randn(o.shape, generator=gen)
    o.backward(do)
    ref.backward(do.double())
    for x, r in zip(leaves, ref_leaves):
        assert x.grad.shape == x.shape
        assert rel_l2(x.grad, r.grad) < (0.3 if d < 32 else E2E_GRAD)


def padding_mask(lengths, s, left=False):
    """[b, s] boolean: True where a token is real."""
    j = torch.arange(s)
    return torch.stack([(j >= s - n) if left else (j < n) for n in lengths])


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("as_float", [False, True])
def test_padding_masks_pack_the_valid_tokens(gen, left, causal, as_float):
    b, hq, hk, s, d = 3, 2, 1, 90, 64
    lengths = [90, 57, 1]
    q, k, v = qkv(gen, b, hq, hk, s, s, d)
    valid = padding_mask(lengths, s, left)
    allowed = valid[:, None, None, :] & valid[:, None, :, None]  # padding queries see nothing
    if causal:
        allowed = allowed & torch.ones(s, s, dtype=torch.bool).tril()
    mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min) if as_float else allowed
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o = ot.scaled_dot_product_attention(*leaves, attn_mask=mask, enable_gqa=True)
    rows = valid[:, None, :, None].expand_as(o)
    assert torch.all(o[~rows] == 0)  # the padding queries' rows
    # against the packed call on the valid tokens, bit for bit
    packed = [torch.cat([x.transpose(1, 2)[e][valid[e]] for e in range(b)]) for x in (q, k, v)]
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32)
    o_packed = ot.attention(*packed, causal=causal, cu_seqlens_q=cu)
    assert torch.equal(o.transpose(1, 2)[valid], o_packed)
    # against torch's SDPA in float64 with the same mask, on the valid rows; gradients too
    # (the reference's padding queries attend themselves, so that its rows stay finite; they get dO = 0)
    ref_mask = allowed | (torch.eye(s, dtype=torch.bool) & ~valid[:, None, :, None])
    ref_leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_leaves, attn_mask=ref_mask, enable_gqa=True)
    assert rel_l2(o[rows], ref[rows]) < E2E_O
    do = torch.randn(o.shape, generator=gen) * rows  # a loss on the valid tokens only
    o.backward(do)
    ref.backward(do.double())
    for x, r in zip(leaves, ref_leaves):
        tok = valid[:, None, :, None].expand_as(x)
        assert torch.all(x.grad[~tok] == 0)  # padding tokens get no gradient
        assert rel_l2(x.grad[tok], r.grad[tok]) < E2E_GRAD


def test_a_mask_without_padding_is_the_unmasked_call(gen):
    q, k, v = qkv(gen, 2, 2, 2, 70, 70, 64)
    causal_mask = torch.ones(70, 70, dtype=torch.bool).tril()
    assert torch.equal(ot.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask),
                       ot.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert torch.equal(ot.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(70, 70, dtype=torch.bool)),
                       ot.scaled_dot_product_attention(q, k, v))


def test_cross_attention_with_key_padding(gen):
    b, h, lq, lk, d = 2, 2, 30, 80, 64
    q, k, v = qkv(gen, b, h, h, lq, lk, d)
    valid = padding_mask([80, 41], lk)
    mask = valid[:, None, None, :]  # [b, 1, 1, lk]: every query sees the valid keys
    o = ot.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ref = sdpa64(q, k, v, attn_mask=mask)
    assert rel_l2(o, ref) < E2E_O


def test_layout_is_explicit_and_errors_name_the_argument(gen):
    q, k, v = qkv(gen, 1, 2, 2, 64, 64, 64)
    # SDPA's [b, h, s, d] handed to octet.torch.attention: refused, not read as [b, s, h, d]
    with pytest.raises(ValueError, match="layout='bshd'"):
        ot.attention(q, k, v)
    with pytest.raises(ValueError, match="layout"):
        ot.attention(q[0], k[0], v[0], layout="bshd")
    with pytest.raises(ValueError, match="dropout_p"):
        ot.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match="enable_gqa"):
        ot.scaled_dot_product_attention(q, k[:, :1], v[:, :1])
    with pytest.raises(ValueError, match="lq=64 != lk=32"):
        ot.scaled_dot_product_attention(q, k[:, :, :32], v[:, :, :32], is_causal=True)
    with pytest.raises(ValueError, match="bias"):
        ot.scaled_dot_product_attention(q, k, v, attn_mask=torch.randn(64, 64, generator=gen))
    holes = torch.ones(64, 64, dtype=torch.bool)
    holes[:, 10] = False
    with pytest.raises(ValueError, match="contiguous run"):
        ot.scaled_dot_product_attention(q, k, v, attn_mask=holes)
    per_head = torch.ones(1, 2, 64, 64, dtype=torch.bool)
    per_head[0, 1] = torch.ones(64, 64, dtype=torch.bool).tril()
    with pytest.raises(ValueError, match="differs between heads"):
        ot.scaled_dot_product_attention(q, k, v, attn_mask=per_head)
    with pytest.raises(ValueError, match="head_dim is 300"):
        ot.scaled_dot_product_attention(*(torch.zeros(1, 1, 4, 300) for _ in range(3)))
    with pytest.raises(ValueError, match="float64"):
        ot.scaled_dot_product_attention(q.double(), k.double(), v.double())


# ---- Hugging Face transformers -------------------------------------------------------------------


def tiny_llama(seed, attn):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                   max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=attn)


def batch(seed):
    """Two sequences of 64 tokens; the second right-padded after 40 (attention_mask 0, labels -100)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (2, 64), generator=g)
    mask = torch.ones(2, 64, dtype=torch.long)
    mask[1, 40:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return ids, mask, labels


def test_hf_backend_forward_equals_sdpa_up_to_fp8(gen):
    name = ot.register_hf_attention()
    ref, model = tiny_llama(0, "sdpa"), tiny_llama(0, name)
    ids, mask, labels = batch(1)
    with torch.no_grad():
        lr = ref(input_ids=ids, attention_mask=mask, labels=labels)
        lo = model(input_ids=ids, attention_mask=mask, labels=labels)
    valid = mask.bool()
    assert rel_l2(lo.logits[valid], lr.logits[valid]) < 0.05
    assert abs(float(lo.loss) - float(lr.loss)) < 0.02


def test_hf_llama_trains_through_convert_the_backend_and_adamw():
    """A tiny Llama, random init, padding and -100 labels: 30 AdamW steps with FP8 linears (MXFP8),
    octet's attention and octet's 8-bit AdamW against the float model with torch's AdamW, same seeds
    and data. Stated tolerance: the final loss within 0.1 nats of the float run's, and both runs
    learn (loss falls by more than 0.5 nats from the start)."""
    name = ot.register_hf_attention()
    ids, mask, labels = batch(2)
    losses = {}
    for kind in ("float", "octet"):
        model = tiny_llama(3, "sdpa" if kind == "float" else name)
        if kind == "octet":
            ot.convert(model, recipe="mxfp8", filter=lambda n, m: "lm_head" not in n)
            assert sum(isinstance(m, ot.Float8Linear) for m in model.modules()) == 14  # 7 per layer
            opt = ot.AdamW(model.parameters(), lr=3e-3)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        run = []
        for _ in range(30):
            out = model(input_ids=ids, attention_mask=mask, labels=labels)
            opt.zero_grad()
            out.loss.backward()
            assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
            # the value projections learn: their gradient is never lost to a zero dO row
            assert all(float(layer.self_attn.v_proj.weight.grad.abs().max()) > 0 for layer in model.model.layers)
            opt.step()
            run.append(float(out.loss))
        losses[kind] = run
    f, o = losses["float"], losses["octet"]
    assert f[0] - f[-1] > 0.5 and o[0] - o[-1] > 0.5
    assert abs(o[-1] - f[-1]) < 0.1, (f, o)
