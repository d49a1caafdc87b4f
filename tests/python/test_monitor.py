"""octet.torch.RunReport: octet's run report (octet/monitor/run_report.hpp) from a Python loop.

Oracles: the report's definitions (run_report.hpp's header) evaluated here on the recorded numbers;
quantization rates counted here from the inputs with E4M3's rules (saturated: |x / S| beyond
max_finite by half an ulp or more; flushed: a non-zero that rounds to zero); attention and
Float8Linear checks against the telemetry and statistics those layers return."""

import json
import math

import pytest
import torch
from torch import nn

import octet.torch as ot


def test_steps_loss_throughput_and_replays(gen):
    report = ot.RunReport()
    steps = [(0, 3.0, 100, 0.5), (1, 2.5, 100, 0.25), (2, float("nan"), 100, 0.25), (1, 2.0, 80, 0.5),
             (2, 1.5, 100, 0.5)]  # step 1 and 2 replayed (a reload), the first try of step 2 had a NaN loss
    for s in steps:
        report.record_step(*s)
    d = report.to_dict()
    assert d["steps"] == {"executed": 5, "distinct": 3}
    # first: the first execution's loss; final: the last distinct step's last execution; min over kept
    assert d["loss"] == {"first": 3.0, "final": 1.5, "min": 1.5}
    processed = sum(s[2] for s in steps)
    kept = 100 + 80 + 100  # the last execution of each distinct step
    wall = sum(s[3] for s in steps)
    t = d["throughput"]
    assert t["tokens_processed"] == processed and t["tokens_kept"] == kept
    assert t["wall_seconds"] == pytest.approx(wall)
    assert t["tokens_per_second"] == pytest.approx(processed / wall)
    assert t["kept_tokens_per_second"] == pytest.approx(kept / wall)
    report.set_wall_seconds(10.0)
    assert report.to_dict()["throughput"]["tokens_per_second"] == pytest.approx(processed / 10.0)
    # nothing recovered from Python: the recovery section is present and empty
    assert report.to_dict()["recovery"]["log"] == [] and report.to_dict()["recovery"]["restarts"] == 0
    assert report.to_markdown().startswith("## Run report")
    # an empty report: the losses are NaN in C++, null in JSON
    assert ot.RunReport().to_dict()["loss"] == {"first": None, "final": None, "min": None}


def test_checks_thresholds_patience_and_summary():
    report = ot.RunReport()
    report.add_check("grad.norm_ratio", "custom", operation="backward", warn=2.0, trip=5.0, patience=2)
    report.add_check("lr.floor", "custom", warn=0.5, trip=0.1, side="below")
    report.add_check("grad.non_finite", "non_finite")  # the kind's default: any > 0 trips
    values = [1.0, 3.0, 6.0, 7.0, 1.5]
    statuses = [report.record("grad.norm_ratio", step, v) for step, v in enumerate(values)]
    # warn above 2, trip above 5 twice in a row (patience 2: the first trip reports warn)
    assert statuses == ["ok", "warn", "warn", "trip", "ok"]
    assert report.tripped(3) == ["grad.norm_ratio"] and report.warned(1) == ["grad.norm_ratio"]
    assert [report.record("lr.floor", 0, v) for v in (1.0, 0.3, 0.05)] == ["ok", "warn", "trip"]
    assert report.record("grad.non_finite", 0, 0) == "ok" and report.record("grad.non_finite", 1, 1) == "trip"
    assert report.measure("grad.non_finite", 2, lambda: 0) == "ok"
    checks = {c["name"]: c for c in report.to_dict()["monitors"]["checks"]}
    c = checks["grad.norm_ratio"]
    assert (c["kind"], c["operation"], c["warn"], c["trip"]) == ("custom", "backward", 2.0, 5.0)
    assert (c["samples"], c["warns"], c["trips"], c["last"], c["worst"]) == (5, 2, 1, 1.5, 7.0)
    assert checks["lr.floor"]["worst"] == 0.05  # side below: the smallest value is the worst
    assert checks["grad.non_finite"]["samples"] == 3 and checks["grad.non_finite"]["seconds"] >= 0
    assert report.to_dict()["monitors"]["seconds"] >= checks["grad.non_finite"]["seconds"]


def test_quantization_rates_against_counts_from_the_inputs(gen):
    # Saturation: a stale amax of 1 (S = 1 / 448) and inputs up to 10: |x| S^-1 is beyond 448 by
    # half of E4M3's top ulp (32) exactly when |x| > 464 / 448.
    x = torch.randn(64, 96, generator=gen) * 3
    _, _, info = ot.quantize(x, "tensorwise_e4m3", tensor_amax=1.0, collect_stats=True)
    saturated = int((x.abs() * 448 > 464).sum())
    # Underflow and non-finite: values 1e-7 of the amax (below half the smallest subnormal 2^-9 of
    # E4M3 after scaling, so they round to zero), an Inf and a NaN. Per row: the rows holding the
    # Inf and the NaN get NaN scales (the default non-finite policy), so their finite values are
    # lost to NaN, not flushed.
    y = torch.randn(64, 96, generator=gen)
    tiny = torch.rand(64, 96, generator=gen) < 0.1
    y[tiny] = y[tiny] * 1e-7
    y[0, 0], y[1, 1] = float("inf"), float("nan")
    _, _, info_y = ot.quantize(y, "rowwise_e4m3", collect_stats=True)
    clean = torch.arange(64)[:, None] >= 2
    scale = y.abs().amax(dim=1, keepdim=True) / 448
    flushed = int(((y.abs() / scale < 2.0**-10) & (y != 0) & clean).sum())
    assert info_y["rowwise"]["lost_to_nan"] == 2 * 96 - 2
    assert flushed > 0

    report = ot.RunReport()
    report.add_check("y.underflow_rate", "underflow_rate", warn=0.5, trip=0.9)  # own limits are kept
    report.record_quantization("x", 3, info["rowwise"])
    report.record_quantization("y", 3, info_y["rowwise"])
    checks = {c["name"]: c for c in report.to_dict()["monitors"]["checks"]}
    assert checks["x.saturation_rate"]["last"] == pytest.approx(saturated / x.numel())
    assert checks["x.saturation_rate"]["kind"] == "saturation_rate" and checks["x.saturation_rate"]["operation"] == "x"
    assert checks["x.underflow_rate"]["last"] == 0 and checks["x.non_finite"]["last"] == 0
    assert checks["y.underflow_rate"]["last"] == pytest.approx(flushed / y.numel())
    assert checks["y.underflow_rate"]["warn"] == 0.5
    assert checks["y.non_finite"]["last"] == 2
    # default thresholds (checks.hpp): saturation trips above 1e-3, any non-finite value trips
    assert set(report.tripped(3)) == {"x.saturation_rate", "y.non_finite"}
    # the raw statistics tensor works as well as the dict
    raw = torch.ops.octet.quantize(x, "tensorwise_e4m3", True, False, 1.0, collect_stats=True)[-1]
    report.record_quantization("x", 4, raw[0])
    checks = {c["name"]: c for c in report.to_dict()["monitors"]["checks"]}
    assert checks["x.saturation_rate"]["samples"] == 2
    assert checks["x.saturation_rate"]["last"] == pytest.approx(saturated / x.numel())


def test_attention_and_linear_telemetry(gen):
    report = ot.RunReport()
    q, k, v = (torch.randn(70, 2, 64, generator=gen).requires_grad_() for _ in range(3))
    o, tele = ot.attention(q, k, v, causal=True, return_telemetry=True)
    with pytest.raises(ValueError, match="after loss.backward"):
        report.record_attention("attn.l0", 0, tele)
    o.square().sum().backward()
    report.record_attention("attn.l0", 0, tele)
    checks = {c["name"]: c for c in report.to_dict()["monitors"]["checks"]}
    for field in ot.monitor.ATTENTION_CHECKS:
        assert checks[f"attn.l0.{field}"]["last"] == pytest.approx(tele.backward[field], rel=1e-9)
    for operand in ("q", "k", "v", "dout"):
        assert checks[f"attn.l0.{operand}.saturation_rate"]["last"] == 0  # per-token scales never saturate

    layer = ot.Float8Linear(64, 32, recipe="tensorwise_delayed")
    layer.collect_stats = True
    with pytest.raises(ValueError, match="collect_stats"):
        report.record_linear("fc", 0, ot.Float8Linear(64, 32))
    for step, gain in enumerate((1.0, 4.0)):  # step 1's input outgrows the history of step 0
        x = (torch.randn(40, 64, generator=gen) * gain).requires_grad_()
        layer(x).sum().backward()
        report.record_linear("fc", step, layer)
    assert set(layer.last_stats) == {"x", "w", "x_t", "w_t", "dy", "dy_t"}
    checks = {c["name"]: c for c in report.to_dict()["monitors"]["checks"]}
    assert checks["fc.x.saturation_rate"]["samples"] == 2
    assert checks["fc.x.saturation_rate"]["last"] == pytest.approx(layer.last_stats["x"]["saturated"] / x.numel())
    assert checks["fc.x.saturation_rate"]["last"] > 0.01  # 4x the recorded amax saturates the tails
    assert checks["fc.w.saturation_rate"]["last"] == 0


def test_memory_ledger(gen):
    model = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(5, 32, generator=gen)).sum().backward()
    opt.step()
    report = ot.RunReport()
    report.book_memory(model, opt)
    n = sum(p.numel() for p in model.parameters())
    report.memory("activations", 1000, "allocate")
    report.memory("activations", 600, "release")
    m = report.to_dict()["memory"]
    assert m["ledger"]["weights"]["bytes"] == 4 * n and m["ledger"]["gradients"]["bytes"] == 4 * n
    assert m["ledger"]["optimizer_state"]["bytes"] == 8 * n + 4 * 4  # exp_avg, exp_avg_sq, and a step per tensor
    assert m["ledger"]["activations"] == {"bytes": 400, "peak": 1000}
    assert m["peak_bytes"] == 16 * n + 16 + 1000
    with pytest.raises(ValueError, match="'bytes'"):
        report.memory("activations", 500, "release")  # more than is held: the books are wrong
    with pytest.raises(ValueError, match="'category'"):
        report.memory("caches", 1)


def test_bad_arguments():
    report = ot.RunReport()
    with pytest.raises(ValueError, match="'kind'"):
        report.add_check("a", "softmax")
    with pytest.raises(ValueError, match="'warn/trip'"):
        report.add_check("a", "custom", warn=1.0)
    with pytest.raises(ValueError, match="'warn'"):
        report.add_check("a", "custom", warn=2.0, trip=1.0)  # the warning limit must come first
    with pytest.raises(ValueError, match="never negative"):
        report.add_check("a", "saturation_rate", warn=-1.0, trip=0.0)
    report.add_check("a", "custom")
    with pytest.raises(ValueError, match="already registered"):
        report.add_check("a", "custom")
    with pytest.raises(ValueError, match="not a registered check"):
        report.record("b", 0, 1.0)
    with pytest.raises(ValueError, match="'tokens'"):
        report.record_step(0, 1.0, -1, 0.1)
    with pytest.raises(ValueError, match="'stats'"):
        report.record_quantization("x", 0, torch.zeros(7, dtype=torch.float64))
    # the JSON stays valid with awkward names
    report.add_check('quote " and \\ and\nnewline', "custom")
    assert json.loads(report.to_json())["monitors"]["checks"][1]["name"] == 'quote " and \\ and\nnewline'
    # a monitor that cannot produce a number has found a problem: NaN trips, and JSON says null
    assert report.record("a", 0, math.nan) == "trip"
    assert json.loads(report.to_json())["monitors"]["checks"][0]["worst"] is None
