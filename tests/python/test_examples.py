"""The Python example runs (a short version of it): examples/python/train_tiny_gpt.py trains both
models, prints its table and its verdict, and exits 0 within the tolerance it is given."""

import math
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_train_tiny_gpt_short_run():
    cmd = [sys.executable, os.path.join(ROOT, "examples", "python", "train_tiny_gpt.py"), "--steps", "12",
           "--eval-every", "6", "--eval-batches", "2", "--batch", "8", "--warmup", "4", "--tolerance", "0.5"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line.split() for line in run.stdout.splitlines() if re.match(r"^\s+(6|12)\s", line)]
    assert [r[0] for r in rows] == ["6", "12"]
    for r in rows:  # four finite losses per row, below the uniform model's ln(72)
        losses = [float(v) for v in r[1:]]
        assert len(losses) == 4 and all(math.isfinite(v) and 0 < v < math.log(72) + 0.5 for v in losses)
    m = re.search(r"final held-out loss: float32 ([\d.]+) nats .* octet ([\d.]+) nats", run.stdout)
    assert m and abs(float(m.group(1)) - float(m.group(2))) <= 0.5
    assert "OK: within 0.5 nats" in run.stdout


def test_train_tiny_gpt_fsdp_short_run():
    """The FSDP2 example under torchrun, 2 gloo processes: both runs train, the octet run's weights
    travel as E4M3 codes and its gradients through the codec (the bytes it reports are counted on
    FSDP2's own collectives)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        import pytest

        pytest.skip("torch.distributed with gloo is not available in this torch build")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(ROOT, "examples", "python", "train_tiny_gpt_fsdp.py"), "--steps", "12", "--warmup", "4",
           "--compress", "--tolerance", "0.5"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    ratios = {}
    for label in ("all-gather bytes", "reduce-scatter bytes", "peak bytes saved"):
        m = re.search(label + r"[^\n]*?\s(\d+)\s+(\d+)\s+([\d.]+)\n", run.stdout)
        assert m, run.stdout
        ratios[label] = int(m.group(2)) / int(m.group(1))
    # weights: E4M3 codes against float32 (norms, embeddings, biases stay float32); gradients: E4M3 messages
    assert ratios["all-gather bytes"] < 0.35 and ratios["reduce-scatter bytes"] < 0.3, ratios
    assert ratios["peak bytes saved"] < 1.0, ratios
    assert "OK: within 0.5 nats" in run.stdout
