"""The expert-parallel FP8 token exchange from Python (octet.torch.expert_parallel_dispatch /
_experts / _combine over torch.distributed.all_to_all_single) on 2 gloo processes, against octet's
C++ exchange over 2 in-process ranks (moe_dispatch_plan_host, moe_dispatch_host, grouped_scaled_gemm,
moe_combine_host; the op moe_exchange_in_process): each rank's received codes and scales (octet's
grouped layout, padding included), its experts' outputs and its tokens' combined output (for each
combine wire: bf16, E4M3 1x128, float32) are the same bits, and so are the bytes each sends to the
other rank. Cases: ragged token
counts, a rank without tokens, an expert no token selects, blockwise 1x128 and MXFP8 rows."""

import os

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available in this torch build")

import octet.torch as ot  # noqa: E402
from octet.torch import moe  # noqa: E402

WORLD, EXPERTS, K, D, N = 2, 4, 2, 512, 192
WIRES = {"bf16": torch.bfloat16, "e4m3_1x128": "e4m3_1x128", "f32": torch.float32}  # the combine's
# (tokens per rank, experts the router may pick, x recipe, w recipe)
CASES = [((37, 53), (0, 1, 2, 3), "blockwise_1x128", "blockwise_128x128"),
         ((0, 29), (0, 1, 3), "blockwise_1x128", "blockwise_128x128"),  # rank 0 sends nothing; expert 2 idle
         ((41, 18), (0, 1, 2, 3), "mxfp8_e4m3", "mxfp8_e4m3")]


def _inputs(seed, case):
    """Every rank's tokens, top-k indices and softmax gates, and every expert's weight (the same on
    every process: drawn from the seed)."""
    tokens, allowed, _, _ = case
    gen = torch.Generator().manual_seed(seed)
    allowed = torch.tensor(allowed)
    xs, idx, gates = [], [], []
    for t in tokens:
        mag = torch.pow(10.0, (torch.rand(t, 1, generator=gen) - 0.5) * 3)
        xs.append(torch.randn(t, D, generator=gen) * mag)
        logits = torch.randn(t, EXPERTS, generator=gen)
        mask = torch.full((EXPERTS,), float("-inf"))
        mask[allowed] = 0.0
        p, i = torch.topk(torch.softmax(logits + mask, -1), K, dim=-1)
        idx.append(i)
        gates.append(p / p.sum(-1, keepdim=True))
    w = torch.randn(EXPERTS, N, D, generator=gen) / D**0.5
    return xs, idx, gates, w


def _worker(rank, world, init_file, out_dir, seed):
    import datetime

    import worker_exit

    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))  # a hang fails the test instead
    local = EXPERTS // world
    results = []
    for case in CASES:
        xs, idx, gates, w = _inputs(seed, case)
        d = ot.expert_parallel_dispatch(xs[rank], idx[rank], EXPERTS, recipe=case[2])
        data, scales = moe.grouped_blocks(d.received, d.expert_rows)
        y = ot.expert_parallel_experts(d, w[rank * local:(rank + 1) * local], w_recipe=case[3])
        out = ot.expert_parallel_combine(y, gates[rank], d)
        results.append({"data": data, "scales": scales, "expert_rows": d.expert_rows, "y": y, "out": out,
                        "report": dict(d.report)})
        for wire in list(WIRES)[1:]:
            results[-1][wire] = ot.expert_parallel_combine(y, gates[rank], d, wire=WIRES[wire])
            results[-1]["report"][wire] = d.report["combine_bytes_sent"]
    # Bad input raises on the rank that passed it, before any collective (so nothing is left waiting).
    x, i = torch.randn(6, D), torch.zeros(6, K, dtype=torch.int64)
    refused = []
    for call in (lambda: ot.expert_parallel_dispatch(x, i, 3), lambda: ot.expert_parallel_dispatch(x, i + 4, 4),
                 lambda: ot.expert_parallel_dispatch(x, i, 4, recipe="tensorwise_e4m3"),
                 lambda: ot.expert_parallel_moe(x, i, torch.ones(6, K), torch.zeros(2, 8, D), None,
                                                torch.zeros(2, D, 8), 4, recipe="tensorwise")):
        try:
            call()
            refused.append("no error")
        except ValueError as e:
            refused.append(str(e))
    results.append(refused)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()
    worker_exit.leave()


def test_exchange_on_2_gloo_processes_is_the_cpp_exchange_bit_for_bit(tmp_path):
    import torch.multiprocessing as mp

    seed = int(os.environ.get("OCTET_SEED", torch.randint(0, 2**31, (1,)).item()))
    mp.spawn(_worker, args=(WORLD, str(tmp_path / "init"), str(tmp_path), seed), nprocs=WORLD, join=True)
    runs = [torch.load(os.path.join(tmp_path, f"rank{r}.pt")) for r in range(WORLD)]
    for c, case in enumerate(CASES):
        xs, idx, gates, w = _inputs(seed, case)
        ref = torch.ops.octet.moe_exchange_in_process(xs, idx, gates, w, EXPERTS, case[2], case[3])
        for r in range(WORLD):
            got = runs[r][c]
            data, scales, expert_rows, y, out, nbytes = ref[6 * r : 6 * r + 6]
            assert torch.equal(got["expert_rows"], expert_rows), (case, r)
            assert torch.equal(got["data"], data) and torch.equal(got["scales"], scales), (case, r)
            assert torch.equal(got["y"], y), (case, r)
            assert torch.equal(got["out"], out), (case, r)
            rep = got["report"]
            assert [rep["bytes_sent"], rep["bytes_received"], rep["bf16_bytes_sent"], rep["combine_bytes_sent"]] == \
                nbytes.tolist(), (case, r, rep, nbytes)
            for wire in list(WIRES)[1:]:  # the combine's other wires, each against the C++ exchange's
                ref_w = torch.ops.octet.moe_exchange_in_process(xs, idx, gates, w, EXPERTS, case[2], case[3], wire)
                assert torch.equal(got[wire], ref_w[6 * r + 4]), (case, r, wire)
                assert rep[wire] == ref_w[6 * r + 5][3].item(), (case, r, wire)
            print(f"\n{case[2]} tokens {case[0]} rank {r}: dispatch sent {rep['rows_sent']} rows, "
                  f"{rep['bytes_sent']} bytes FP8 against {rep['bf16_bytes_sent']} as bf16 "
                  f"({rep['bytes_sent'] / max(rep['bf16_bytes_sent'], 1):.3f}x); combine sent "
                  f"{rep['combine_bytes_sent']} bytes as bf16, {rep['e4m3_1x128']} as E4M3 1x128, "
                  f"{rep['f32']} as float32; row counts {rep['counts_bytes_sent']} bytes")
    for r in range(WORLD):
        refused = runs[r][-1]
        assert "experts is 3; pass a multiple of the world size 2" in refused[0], refused
        assert "indices hold experts outside [0, 4)" in refused[1], refused
        assert "pass a row-local recipe" in refused[2], refused
        assert "recipe 'tensorwise'; pass blockwise or mxfp8" in refused[3], refused
    # A rank's rows cost d code bytes plus its scales: 1x128 E4M3 d + 4 d / 128, MXFP8 d + d / 32.
    rep = runs[0][0]["report"]
    assert rep["bytes_sent"] == rep["rows_sent"] * (D + 4 * D // 128)
    rep = runs[0][2]["report"]
    assert rep["bytes_sent"] == rep["rows_sent"] * (D + D // 32)


# Expert-parallel training: d, ff (k = K = 2: a token's two rows sum the same in any order).
TRAIN_D, TRAIN_FF = 256, 128


def _train_inputs(seed, tokens):
    gen = torch.Generator().manual_seed(seed + 1)
    xs = [torch.randn(t, TRAIN_D, generator=gen) for t in tokens]
    idx = [torch.stack([torch.randperm(EXPERTS, generator=gen)[:K] for _ in range(t)]) if t else
           torch.zeros(0, K, dtype=torch.int64) for t in tokens]
    gates = [torch.softmax(torch.randn(t, K, generator=gen), -1) for t in tokens]
    wu = torch.randn(EXPERTS, TRAIN_FF, TRAIN_D, generator=gen) / TRAIN_D**0.5
    wg = torch.randn(EXPERTS, TRAIN_FF, TRAIN_D, generator=gen) / TRAIN_D**0.5
    wd = torch.randn(EXPERTS, TRAIN_D, TRAIN_FF, generator=gen) / TRAIN_FF**0.5
    dout = [torch.randn(t, TRAIN_D, generator=gen) for t in tokens]
    return xs, idx, gates, wu, wg, wd, dout


def _train_worker(rank, world, init_file, out_dir, seed, tokens, grad_wire):
    import datetime

    import worker_exit

    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    xs, idx, gates, wu, wg, wd, dout = _train_inputs(seed, tokens)
    local = slice(rank * EXPERTS // world, (rank + 1) * EXPERTS // world)
    x, g = xs[rank].requires_grad_(), gates[rank].requires_grad_()
    w = [t[local].clone().requires_grad_() for t in (wu, wg, wd)]
    report = {}
    out = ot.expert_parallel_moe(x, idx[rank], g, *w, EXPERTS, recipe="blockwise", grad_wire=grad_wire,
                                 report=report)
    out.backward(dout[rank])
    torch.save({"out": out.detach(), "dx": x.grad, "dgates": g.grad, "dw": [t.grad for t in w], "report": report},
               os.path.join(out_dir, f"train{rank}.pt"))
    dist.destroy_process_group()
    worker_exit.leave()


class _GradWire(torch.autograd.Function):
    """Identity; its backward rounds each gradient row through 1x128 E4M3 (the grad_wire)."""

    @staticmethod
    def forward(ctx, y):
        return y.clone()

    @staticmethod
    def backward(ctx, dy):
        q, _, _ = ot.quantize(dy.contiguous(), "blockwise_1x128")
        return q.dequantize()


def _one_process_moe(xs, idx, gates, wu, wg, wd, grad_wire):
    """The same block on one process for every rank's tokens stacked in rank order: X quantized once
    and its rows permuted into expert order, each owner's experts run on their rows as the owner
    runs them, the outputs rounded to bf16 (the rounding passed straight through in the backward,
    as the exchange does), the gated combine."""
    x, i, g = torch.cat(xs).requires_grad_(), torch.cat(idx), torch.cat(gates).requires_grad_()
    w = [t.clone().requires_grad_() for t in (wu, wg, wd)]
    flat = i.reshape(-1)
    order = torch.argsort(flat, stable=True)
    sizes = torch.bincount(flat, minlength=EXPERTS)
    q, _, _ = ot.quantize(x.detach(), "blockwise_1x128")
    codes, scales = q.codes.view(torch.uint8)[:, :TRAIN_D], moe._row_scales(q, x.shape[0])
    tok = order // K
    ys, begin, local = [], 0, EXPERTS // WORLD
    for r in range(WORLD):
        s = sizes[r * local:(r + 1) * local]
        t = tok[begin:begin + int(s.sum())]
        begin += int(s.sum())
        rows = moe._row_copy(codes[t], scales[t], "blockwise_1x128", TRAIN_D)
        xr = x[t] + (rows.dequantize() - x[t]).detach()  # the rows' exact values, gradient to x
        ws = [p[r * local:(r + 1) * local] for p in w]
        u = moe._QuantizedRowsLinearFn.apply(xr, ws[0], s, "blockwise", rows)
        h = torch.nn.functional.silu(moe._QuantizedRowsLinearFn.apply(xr, ws[1], s, "blockwise", rows)) * u
        ys.append(moe._GroupedLinearFn.apply(h, ws[2], s, "blockwise"))
    y = torch.cat(ys)
    if grad_wire == "e4m3_1x128":
        y = _GradWire.apply(y)
    y = y + (y.bfloat16().float() - y).detach()
    row_of = torch.empty_like(order)
    row_of[order] = torch.arange(order.numel())
    return x, g, w, moe.combine(y, g, row_of)


# (0, 29): rank 0 sends and sums nothing
@pytest.mark.parametrize("tokens,grad_wire", [((37, 53), "f32"), ((0, 29), "f32"), ((37, 53), "e4m3_1x128")])
def test_expert_parallel_training_on_2_gloo_processes_is_one_process_bit_for_bit(tmp_path, tokens, grad_wire):
    """expert_parallel_moe's forward and backward on 2 processes (FP8 rows out, bf16 rows back; the
    backward's float32 rows to the owners and back) against the same block on one process for all
    tokens: outputs, dX, dgates and each owner's expert weight gradients, bit for bit; and against
    float64 within octet/nn/moe.hpp's contract."""
    import torch.multiprocessing as mp

    seed = int(os.environ.get("OCTET_SEED", torch.randint(0, 2**31, (1,)).item()))
    mp.spawn(_train_worker, args=(WORLD, str(tmp_path / "init"), str(tmp_path), seed, tokens, grad_wire),
             nprocs=WORLD, join=True)
    runs = [torch.load(os.path.join(tmp_path, f"train{r}.pt")) for r in range(WORLD)]
    xs, idx, gates, wu, wg, wd, dout = _train_inputs(seed, tokens)
    x, g, w, out = _one_process_moe(xs, idx, gates, wu, wg, wd, grad_wire)
    out.backward(torch.cat(dout))
    begin, local = 0, EXPERTS // WORLD
    for r in range(WORLD):
        rows = slice(begin, begin + tokens[r])
        begin += tokens[r]
        assert torch.equal(runs[r]["out"], out[rows].detach()), r
        assert torch.equal(runs[r]["dx"], x.grad[rows]), r
        assert torch.equal(runs[r]["dgates"], g.grad[rows]), r
        for got, p in zip(runs[r]["dw"], w):
            assert torch.equal(got, p.grad[r * local:(r + 1) * local]), r
    # float64: the same routing and gates, unquantized.
    x64, w64 = x.detach().double().requires_grad_(), [p.detach().double().requires_grad_() for p in w]
    g64 = g.detach().double().requires_grad_()
    i = torch.cat(idx)
    out64 = torch.zeros_like(x64)
    for e in range(EXPERTS):
        t, j = (i == e).nonzero(as_tuple=True)
        h = torch.nn.functional.silu(x64[t] @ w64[1][e].t()) * (x64[t] @ w64[0][e].t())
        out64 = out64.index_add(0, t, g64[t, j].unsqueeze(1) * (h @ w64[2][e].t()))
    out64.backward(torch.cat(dout).double())

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    errs = [rel(out, out64), rel(x.grad, x64.grad), rel(g.grad, g64.grad)] + [rel(p.grad, q.grad)
                                                                              for p, q in zip(w, w64)]
    rep = runs[1]["report"]
    print(f"\nrank 1 sent {rep['rows_sent']} rows: forward {rep['bytes_sent']} bytes (bf16 rows: "
          f"{rep['bf16_bytes_sent']}), backward {rep['grad_bytes_sent']} bytes of gradient rows as {grad_wire}")
    assert rep["grad_bytes_sent"] == rep["rows_sent"] * (4 * TRAIN_D if grad_wire == "f32" else TRAIN_D + 8)
    print("expert-parallel MoE (blockwise) against float64: out {:.4f} dX {:.4f} dgates {:.4f} dW_up {:.4f} "
          "dW_gate {:.4f} dW_down {:.4f}".format(*errs))
    assert errs[0] <= 2 * (2**-4 + 2**-4) and max(errs[1:]) <= 2**-4 + 2 * 2**-4 + 2 * 2**-4, errs
