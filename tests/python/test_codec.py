"""Gradient codec ops (encode/decode, error feedback, validation) and the DDP communication hook."""

import math
import os

import pytest
import torch

import octet.torch as ot
from octet.torch import distributed as od

import worker_exit

ops = torch.ops.octet
FORMATS = ("e4m3", "e5m2", "mxfp8", "nvfp4")


def _configs():
    for fmt in FORMATS:
        for transform in ("identity", "hadamard"):
            for stochastic in (False, True):
                yield od.CodecConfig(fmt, transform, block=256, seed=12345, stochastic=stochastic)


def _gradient(gen, n, scale=1.0):
    # Heavy-tailed magnitudes across blocks, as gradients have.
    x = torch.randn(n, generator=gen) * scale
    return x * torch.exp(torch.randn(n, generator=gen))


def _norm(t):
    return t.double().norm().item()


# ---- sizes and queries against the layout that wire.hpp documents ----


def _round16(v):
    return (v + 15) // 16 * 16


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n", [0, 1, 15, 16, 100, 1024, 1500, 5000])
def test_encoded_size_matches_documented_layout(fmt, n):
    for transform, block in (("identity", 1024), ("hadamard", 1024), ("hadamard", 64)):
        c = od.CodecConfig(fmt, transform, block)
        if transform == "identity":
            L = n
        else:
            eff = block if n >= block else max(16, 1 << max(0, (n - 1).bit_length()))
            L = -(-n // eff) * eff
        assert od.transform_length(n, c) == L
        bs = {"e4m3": 128, "e5m2": 128, "mxfp8": 32, "nvfp4": 16}[fmt]
        scale_bytes = 4 if fmt in ("e4m3", "e5m2") else 1
        payload = (L + 1) // 2 if fmt == "nvfp4" else L
        expected = 64 + _round16(-(-L // bs) * scale_bytes) + _round16(payload)
        assert od.encoded_size(n, c) == expected
        assert ot.encode_gradient(torch.zeros(n), c).numel() == expected


def test_error_bound_matches_documented_formula():
    # e4m3, identity, Bs = 128: beta = (eps + alpha sqrt(Bs)) (1 + 2^-20) + 3 * 2^-24 (codec.hpp).
    rel, ab = od.error_bound(4096, od.CodecConfig("e4m3", "identity"))
    assert rel == pytest.approx((2**-4 + 2**-10 / 448 * math.sqrt(128)) * (1 + 2**-20) + 3 * 2**-24, rel=1e-12)
    assert ab == pytest.approx(2**-10 * 2**-126 * math.sqrt(4096), rel=1e-12)  # eta sqrt(L)
    # Stochastic rounding doubles eps and alpha.
    rel_sr, _ = od.error_bound(4096, od.CodecConfig("e4m3", "identity", stochastic=True))
    assert rel_sr == pytest.approx(2 * (rel - 3 * 2**-24) + 3 * 2**-24, rel=1e-9)


@pytest.mark.parametrize("n,world", [(0, 2), (100, 2), (5000, 2), (70000, 3), (4096, 4)])
def test_shards_cover_on_granule_boundaries(n, world):
    c = od.CodecConfig("mxfp8", "hadamard", 2048)
    b = ops.codec_shards(n, world, *c._layout_args())
    assert len(b) == world + 1 and b[0] == 0 and b[-1] == n
    assert all(lo <= hi for lo, hi in zip(b, b[1:]))
    assert all(v % 2048 == 0 for v in b[:-1])


# ---- round trip ----


@pytest.mark.parametrize("config", list(_configs()), ids=lambda c: f"{c.format}-{c.transform}-sr{int(c.stochastic)}")
def test_round_trip_within_error_bound(gen, config):
    for n in (1, 37, 256, 1000, 3000):
        for scale in (1.0, 1e-30, 1e30):
            x = _gradient(gen, n, scale)
            msg = ot.encode_gradient(x, config)
            x_hat = ot.decode_gradient(msg, n)
            rel, ab = od.error_bound(n, config)
            err = _norm(x_hat - x)
            assert err <= rel * _norm(x) + ab, (n, scale, err / _norm(x), rel)
            assert x_hat.dtype == torch.float32 and x_hat.shape == (n,)


@pytest.mark.parametrize("fmt,maxf,dtype", [("e4m3", 448.0, torch.float8_e4m3fn), ("e5m2", 57344.0, torch.float8_e5m2)])
def test_identity_codes_match_torch_float8_casts(gen, fmt, maxf, dtype):
    # Per block of 128: S = amax / max_finite (float), code = round(x / S) in torch's float8 dtype.
    n = 128 * 7 + 45
    x = _gradient(gen, n)
    x[:128] = 0.0  # a zero block: scale 2^-126, codes 0
    msg = ot.encode_gradient(x, od.CodecConfig(fmt, "identity"))
    pad = torch.zeros(-(-n // 128) * 128)
    pad[:n] = x
    blocks = pad.view(-1, 128)
    amax = blocks.abs().amax(1)
    S = torch.clamp(amax / maxf, min=2.0**-126)  # a zero block too: the smallest scale
    expected = ((blocks / S[:, None]).to(dtype).float() * S[:, None]).reshape(-1)[:n]
    assert torch.equal(ot.decode_gradient(msg, n), expected)
    assert torch.equal(msg[64: 64 + 4 * S.numel()].view(torch.float32), S)


def test_empty_and_non_finite(gen):
    c = od.CodecConfig("e4m3", "identity")
    assert ot.decode_gradient(ot.encode_gradient(torch.zeros(0), c), 0).numel() == 0
    x = _gradient(gen, 300)
    x[5], x[200], x[201] = float("nan"), float("inf"), float("-inf")
    finite = torch.ones(300, dtype=torch.bool)
    finite[[5, 200, 201]] = False
    # Each non-finite element takes a non-finite code (E4M3: NaN; E5M2: +-Inf); the rest is untouched.
    y = ot.decode_gradient(ot.encode_gradient(x, c), 300)
    assert torch.isnan(y[[5, 200, 201]]).all() and torch.isfinite(y[finite]).all()
    y = ot.decode_gradient(ot.encode_gradient(x, od.CodecConfig("e5m2", "identity")), 300)
    assert torch.isnan(y[5]) and y[200] == float("inf") and y[201] == float("-inf") and torch.isfinite(y[finite]).all()


def test_first_index_and_seed_change_the_rotation(gen):
    x = _gradient(gen, 512)
    c = od.CodecConfig("e4m3", "hadamard", 256, seed=7)
    a = ot.encode_gradient(x, c)
    assert not torch.equal(a, ot.encode_gradient(x, c, first_index=256))
    assert not torch.equal(a, ot.encode_gradient(x, c.with_seed(8)))
    assert torch.equal(a, ot.encode_gradient(x, c))  # deterministic
    # Shards start on block boundaries: a shard's rotated coordinates are the whole vector's.
    whole = od.decode_gradient_transformed(a, 512, c)
    tail = od.decode_gradient_transformed(ot.encode_gradient(x[256:], c, first_index=256), 256, c, first_index=256)
    assert torch.equal(whole[256:], tail)


# ---- error feedback ----


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("transform", ["identity", "hadamard"])
def test_feedback_residual_carries_what_was_lost(gen, fmt, transform):
    n = 1000
    c = od.CodecConfig(fmt, transform, 256, seed=3)
    residual = torch.zeros(n)
    sent = torch.zeros(n, dtype=torch.float64)
    total = torch.zeros(n, dtype=torch.float64)
    # Hadamard's butterflies round each coordinate log2(B) times (hadamard.hpp); identity only the add.
    tol = 4 * (9 + 2) * 2**-24 if transform == "hadamard" else 2 * 2**-24
    for step in range(4):
        x = _gradient(gen, n)
        previous = residual.clone()
        msg = ot.encode_gradient(x, c.with_seed(step), residual=residual)
        x_hat = ot.decode_gradient(msg, n)
        intended = x.double() + previous.double()
        assert _norm((x_hat.double() + residual.double()) - intended) <= tol * _norm(intended)
        assert not torch.equal(residual, previous)
        sent += x_hat.double()
        total += x.double()
    # Nothing is lost for good: what was sent differs from what was given by the last residual only.
    assert _norm(sent + residual.double() - total) <= 4 * tol * _norm(total)


@pytest.mark.parametrize("storage", ["bf16", "e4m3"])
def test_feedback_compressed_storage(gen, storage):
    n = 700
    c = od.CodecConfig("nvfp4", "hadamard", 256)
    exact = torch.zeros(n)
    residual = od.new_residual(n, storage)
    x = _gradient(gen, n)
    ot.encode_gradient(x, c, residual=exact)
    ot.encode_gradient(x, c, residual=residual)
    # The stored residual is the exact one rounded by its storage (feedback.hpp: bf16 2^-8
    # relative; e4m3 2^-4 relative plus the block scale's subnormal step).
    got = od.residual_values(residual, n)
    rel = 2**-8 if storage == "bf16" else 2**-4 + 2**-10
    assert _norm(got - exact) <= rel * _norm(exact)
    assert _norm(exact) > 0


# ---- validation ----


def test_corrupted_message_is_rejected(gen):
    n = 3000
    c = od.CodecConfig("mxfp8", "hadamard", 1024, seed=1)
    msg = ot.encode_gradient(_gradient(gen, n), c)
    for _ in range(8):
        bad = msg.clone()
        i = int(torch.randint(msg.numel(), (1,), generator=gen))
        bad[i] ^= 1 << int(torch.randint(8, (1,), generator=gen))
        with pytest.raises(ValueError, match="message"):
            ot.decode_gradient(bad, n)
    with pytest.raises(ValueError, match="truncated"):
        ot.decode_gradient(msg[:-16].clone(), n)
    with pytest.raises(ValueError, match="message"):
        ot.decode_gradient(torch.cat([msg, torch.zeros(16, dtype=torch.uint8)]), n)
    with pytest.raises(ValueError, match=r"carries elements \[0, 3000\); expected \[0, 2999\)"):
        ot.decode_gradient(msg, n - 1)
    with pytest.raises(ValueError, match="expected"):
        ot.decode_gradient(msg, n, first_index=1024)
    with pytest.raises(ValueError, match="another configuration"):
        od.decode_gradient_transformed(msg, n, c.with_seed(2))
    with pytest.raises(ValueError, match="another configuration"):  # another L: caught before the sizes clash
        od.decode_gradient_transformed(msg, n, od.CodecConfig("mxfp8", "hadamard", 2048, seed=1))
    with pytest.raises(ValueError, match="checksum"):
        bad = msg.clone()
        bad[-100] ^= 4
        od.decode_gradient_transformed(bad, n, c)
    with pytest.raises(ValueError, match="message"):
        ot.decode_gradient(torch.zeros(10, dtype=torch.uint8), 0)


def test_bad_input_errors():
    x = torch.randn(300)
    with pytest.raises(TypeError, match="'x'"):
        ot.encode_gradient(x.double())
    with pytest.raises(ValueError, match="'x'.*contiguous"):
        ot.encode_gradient(torch.randn(300, 2)[:, 0])
    with pytest.raises(ValueError, match="'format'"):
        ot.encode_gradient(x, od.CodecConfig("fp8"))
    with pytest.raises(ValueError, match="'transform'"):
        ot.encode_gradient(x, od.CodecConfig(transform="dct"))
    with pytest.raises(ValueError, match="block"):
        ot.encode_gradient(x, od.CodecConfig(block=100))
    with pytest.raises(ValueError, match="scale_block"):
        ot.encode_gradient(x, od.CodecConfig("mxfp8", scale_block=64))
    with pytest.raises(ValueError, match="'first_index'"):
        ot.encode_gradient(x, first_index=-1)
    with pytest.raises(ValueError, match="'residual'.*bytes"):
        ot.encode_gradient(x, residual=torch.zeros(299))
    with pytest.raises(TypeError, match="'residual'"):
        ot.encode_gradient(x, residual=torch.zeros(300, dtype=torch.float64))
    with pytest.raises(ValueError, match="'residual'.*overlaps"):
        ot.encode_gradient(x, residual=x)
    with pytest.raises(TypeError, match="'message'"):
        ot.decode_gradient(torch.zeros(64, dtype=torch.int32), 0)
    with pytest.raises(ValueError, match="'message'"):
        ot.decode_gradient(torch.zeros(64, 2, dtype=torch.uint8), 0)
    with pytest.raises(ValueError, match="'n'"):
        ot.decode_gradient(ot.encode_gradient(x), -1)
    with pytest.raises(ValueError, match="'y'"):
        od.encode_gradient_transformed(torch.zeros(100), 300)
    with pytest.raises(ValueError, match="'n'"):
        od.encoded_size(-5)
    with pytest.raises(ValueError, match="'world'"):
        ops.codec_shards(10, 0)
    with pytest.raises(TypeError, match="'x'"):
        od.compressed_allreduce(x.double())
    with pytest.raises(ValueError, match="'x'.*contiguous"):
        od.compressed_allreduce(torch.randn(4, 3).t())
    with pytest.raises(ValueError, match="'feedback'"):
        od.CodecHookState(feedback="fp16")


# ---- opcheck and torch.compile ----


def _opcheck(op, args, kwargs=None):
    torch.library.opcheck(op, args, kwargs or {})


def test_opcheck(gen):
    for fmt, transform, n, storage in (("e4m3", "hadamard", 1000, "f32"), ("nvfp4", "hadamard", 300, "bf16"),
                                       ("e5m2", "identity", 0, None), ("mxfp8", "identity", 260, "e4m3")):
        c = od.CodecConfig(fmt, transform, 256, seed=5)
        x = _gradient(gen, n)
        residual = None if storage is None else od.new_residual(n, storage)
        _opcheck(ops.encode_gradient.default, (x, *c._args(), 0, 0, residual))
        msg = ot.encode_gradient(x, c)
        _opcheck(ops.decode_gradient.default, (msg, n, 0))
        y = od.decode_gradient_transformed(msg, n, c)
        _opcheck(ops.decode_gradient_transformed.default, (msg, n, *c._args(), 0))
        _opcheck(ops.encode_gradient_transformed.default, (y, n, *c._args(), 0, 0, residual))


def test_opcheck_queries():
    for op, args in ((ops.encoded_size.default, (1000, "nvfp4")), (ops.transform_length.default, (300,)),
                     (ops.codec_error_bound.default, (100, "mxfp8")), (ops.codec_shards.default, (5000, 3)),
                     (ops.allreduce_error_bound.default, (100, 2, 1.0, 1.0))):
        _opcheck(op, args)


def test_compile_fullgraph(gen):
    c = od.CodecConfig("e4m3", "hadamard", 256)

    def round_trip(x, residual):
        msg = ot.encode_gradient(x, c, residual=residual)
        return ot.decode_gradient(msg, x.numel()), msg

    x = _gradient(gen, 600)
    r_eager, r_compiled = torch.zeros(600), torch.zeros(600)
    eager = round_trip(x, r_eager)
    compiled = torch.compile(round_trip, fullgraph=True, backend="aot_eager")(x, r_compiled)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])
    assert torch.equal(r_eager, r_compiled)


# ---- two processes over gloo: the compressed all-reduce and the DDP hook ----


def _ddp_worker(rank, world, store, seed, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = {}
        # compressed_allreduce without feedback: within octet's bound of the exact sum, same bits everywhere.
        g = torch.Generator().manual_seed(seed * 7 + rank)
        c = od.CodecConfig("e4m3", "hadamard", 256, seed=seed)
        x = _gradient(g, 5000)
        total = od.compressed_allreduce(x, c)
        exact = x.double().clone()
        dist.all_reduce(exact)
        norms = torch.tensor([_norm(x)], dtype=torch.float64)
        dist.all_reduce(norms)
        result["allreduce"] = total
        result["allreduce_error"] = _norm(total.double() - exact)
        result["allreduce_bound"] = od.allreduce_error_bound(5000, world, norms.item(), _norm(exact), c)

        # DDP training with the hook: a tiny MLP, different data per rank.
        torch.manual_seed(seed)  # the same init everywhere (DDP also broadcasts rank 0's)
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
        # Several small buckets, so that residuals are kept per bucket.
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb_list=[0.001, 0.001, 0.001])
        state = ot.CodecHookState(od.CodecConfig("e4m3", "hadamard", 256, seed=seed))
        ddp.register_comm_hook(state, ot.comm_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        teacher = torch.Generator().manual_seed(seed + 1)
        w_true = torch.randn(16, 1, generator=teacher)
        data = torch.Generator().manual_seed(seed + 100 + rank)
        inputs = torch.randn(8, 64, 16, generator=data)
        targets = torch.tanh(inputs @ w_true)
        losses = []
        for step in range(8):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(inputs[step]), targets[step])
            loss.backward()
            opt.step()
            with torch.no_grad():
                full = torch.nn.functional.mse_loss(model(inputs.reshape(-1, 16)), targets.reshape(-1, 1))
            losses.append(full.item())
        result["params"] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        result["losses"] = losses
        result["buckets"] = len(state.residuals)
        result["residual_norm"] = sum(_norm(r) for r in state.residuals.values())
        result["steps"] = state.step

        # Ranks that disagree on the configuration all stop with ValueError (no one waits).
        bad = ot.CodecHookState(od.CodecConfig("e4m3" if rank == 0 else "e5m2"))
        try:
            bad._prepare(0, ("layout",), 100, torch.device("cpu"))
            result["mismatch"] = None
        except ValueError as e:
            result["mismatch"] = str(e)
        # A stage-1 message corrupted in transit to rank 0: rank 0 names it, rank 1 stops too.
        honest = od.encode_gradient

        def corrupt_to_rank0(x, config=None, *, first_index=0, **kw):
            msg = honest(x, config, first_index=first_index, **kw)
            if rank == 1 and first_index == 0:
                msg[-1] ^= 0x10
            return msg

        od.encode_gradient = corrupt_to_rank0
        try:
            od.compressed_allreduce(x, c)
            result["corrupted"] = None
        except ValueError as e:
            result["corrupted"] = str(e)
        finally:
            od.encode_gradient = honest
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    worker_exit.leave()  # reached only when the worker succeeded


def test_ddp_two_processes_gloo(tmp_path, gen):
    import torch.multiprocessing as mp

    seed = int(torch.randint(2**31, (1,), generator=gen))
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "store"), seed, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    # Every rank decodes the same bytes: bit-identical sums and parameters.
    assert torch.equal(r0["allreduce"], r1["allreduce"])
    assert r0["allreduce_error"] <= r0["allreduce_bound"]
    assert 0 < r0["allreduce_error"]
    assert torch.equal(r0["params"], r1["params"])
    for r in (r0, r1):
        assert r["losses"][-1] < 0.7 * r["losses"][0], r["losses"]
        assert r["buckets"] >= 2 and r["residual_norm"] > 0 and r["steps"] == 8
        assert r["mismatch"] is not None and "disagree" in r["mismatch"]
    assert "checksum" in r0["corrupted"] and "rank 0 received an invalid stage-1 message" in r1["corrupted"]
