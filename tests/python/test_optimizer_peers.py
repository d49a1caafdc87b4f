"""bench/python/optimizer_peers.py, small: its byte count of optimizer state (plain tensors, and
torchao's OptimState8bit opened into codes, scales and map) and a short run of octet's AdamW beside
torch's float32 AdamW (state bytes, finite step times, the loss falls, the gap is small, the JSON)."""

import importlib.util
import json
import math
import os
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao.optim")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def _bench():
    spec = importlib.util.spec_from_file_location("optimizer_peers",
                                                  os.path.join(ROOT, "bench", "python", "optimizer_peers.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_state_bytes_of_torch_and_torchao_state():
    op = _bench()
    p = torch.nn.Parameter(torch.randn(4096))
    p.grad = torch.randn(4096)
    opt = torch.optim.AdamW([p], foreach=True)
    opt.step()
    assert op.state_bytes(opt) == 2 * 4096 * 4 + 4  # exp_avg, exp_avg_sq (float32) and the 0-d float32 step

    from torchao.optim.subclass_8bit import OptimState8bit

    m = OptimState8bit.zeros((64, 256), signed=True, block_size=256)
    v = OptimState8bit.zeros((64, 256), signed=False, block_size=256)
    fake = types.SimpleNamespace(state={p: {"exp_avg": m, "exp_avg_sq": v, "step": torch.tensor(1.0)}})
    per_state = 64 * 256 + 64 * 4 + 256 * 4  # uint8 codes, a float32 scale per 256-block, the 256-entry map
    assert op.state_bytes(fake) == 2 * per_state + 4
    shared = types.SimpleNamespace(state={p: {"a": m}, "q": {"b": m}})  # one storage counted once
    assert op.state_bytes(shared) == per_state


def test_short_run_octet_beside_torch(tmp_path):
    op = _bench()
    octet_name = "octet AdamW dynamic8, fp32 master"
    out = tmp_path / "peers.json"
    res = op.main(["--steps", "30", "--warmup", "2", "--seeds", "2", "--rounds", "3", "--width", "64", "--depth", "1",
                   "--threads", str(torch.get_num_threads()), "--only", octet_name, "--json", str(out)])
    assert set(res) == {op.REFERENCE, octet_name}
    ref, ours = res[op.REFERENCE], res[octet_name]
    n = ref["runs"][0]["n_params"]
    assert n == 256 * 64 + 64 + 64 * 16 + 16
    assert ref["state_bytes_per_param"] == pytest.approx(8 + 4 * 4 / n)  # two float32 moments, 4 step tensors
    assert 2.0 < ours["state_bytes_per_param"] < 2.1  # two uint8 codes and per-block meta
    assert ref["param_bytes_per_param"] == ours["param_bytes_per_param"] == 4
    for r in (ref, ours):
        assert len(r["step_ms_samples"]) == 3 and all(t > 0 for t in r["step_ms_samples"])
        for run in r["runs"]:
            assert math.isfinite(run["test_mse"]) and run["test_mse"] < run["first_train_mse"]
    assert all(abs(g) < 0.02 for g in ours["gaps"]) and len(ours["gaps"]) == 2
    saved = json.loads(out.read_text())
    assert saved["results"][octet_name]["test_mse"] == pytest.approx(ours["test_mse"])
