"""Monitors from Python: octet's run report (octet/monitor/run_report.hpp) over a training loop.

    report = octet.torch.RunReport()
    report.add_check("loss.spike", "custom", warn=5.0, trip=20.0)      # optional: own limits
    for step in range(steps):
        t0 = time.perf_counter()
        ...                                                             # forward, backward, update
        report.record_step(step, loss.item(), tokens, time.perf_counter() - t0)
        report.record_quantization("linear.x", step, stats)             # quantize(..., collect_stats=True)
        report.record_attention("attention.l0", step, telemetry)        # attention(..., return_telemetry=True)
        report.record_linear("mlp.fc1", step, layer)                    # a Float8Linear with collect_stats
    report.book_memory(model, optimizer)
    report.to_dict(), report.to_json(), report.to_markdown()

The report itself is octet's C++ run_report with its check_registry and memory_ledger (a torch
class in the monitor op library): loss, throughput, peak memory, the monitors' values, warnings
and trips, the same JSON and Markdown a C++ program writes. Quantization statistics become the
checks <name>.saturation_rate, <name>.underflow_rate and <name>.non_finite (octet's check kinds
with their default thresholds, unless added before with other limits); attention telemetry
becomes custom checks (which never trip unless given limits): <name>.residual_rel (the row-sum
residual of dS in float), <name>.residual_dq_rel (the same of dS as the dQ product used it) and
<name>.gap_rel (stored O against P V), plus the quantization checks of Q, K, V and dO. The
recovery section is empty: recoveries run through octet::recovery_policy's C++ callbacks.
"""

import json
import time
from typing import Optional

import torch

from .._library import load

load("monitor")

CHECK_KINDS = ("softmax_row_sum", "stored_o_vs_pv", "saturation_rate", "underflow_rate", "amax_drift", "non_finite",
               "optimizer_decode_error", "clip_crossings", "custom")
MEMORY_CATEGORIES = ("weights", "gradients", "optimizer_state", "activations", "temporaries")
ATTENTION_CHECKS = ("residual_rel", "residual_dq_rel", "gap_rel")


class RunReport:
    """octet::run_report with its check registry and memory ledger (see the module docstring)."""

    def __init__(self):
        self._r = torch.classes.octet.RunReport()

    # ---- steps ----

    def record_step(self, step: int, loss: float, tokens: float, seconds: float):
        """One executed step (replays and repeats included): its loss, tokens and wall seconds."""
        self._r.record_step(int(step), float(loss), float(tokens), float(seconds))

    def set_wall_seconds(self, seconds: float):
        """The run's measured wall time (default: the recorded step times)."""
        self._r.set_wall_seconds(float(seconds))

    # ---- checks ----

    def add_check(self, name: str, kind: str = "custom", *, operation: str = "", warn: Optional[float] = None,
                  trip: Optional[float] = None, side: str = "above", patience: int = 1) -> int:
        """Registers a check (octet::check_registry::add); warn and trip both None: the kind's
        default threshold. side "above": larger values are worse; "below": smaller ones."""
        return self._r.add_check(name, kind, operation, None if warn is None else float(warn),
                                 None if trip is None else float(trip), side, int(patience))

    def has_check(self, name: str) -> bool:
        return self._r.has_check(name)

    def record(self, name: str, step: int, value: float, seconds: float = 0.0) -> str:
        """Records a check's value at a step; returns its status: "ok", "warn" or "trip"."""
        return self._r.record(name, int(step), float(value), float(seconds))

    def measure(self, name: str, step: int, compute) -> str:
        """Runs compute() (which returns the value), timing it as the check's own cost."""
        t0 = time.perf_counter()
        value = float(compute())
        return self.record(name, step, value, time.perf_counter() - t0)

    def tripped(self, step: int):
        """Names of the checks whose latest sample at step trips."""
        return list(self._r.tripped(int(step)))

    def warned(self, step: int):
        return list(self._r.warned(int(step)))

    # ---- what octet's layers measured ----

    def record_quantization(self, name: str, step: int, stats):
        """Quantization statistics of one quantized copy: a stats dict of octet.torch.quantize
        (info["rowwise"] / info["columnwise"]) or a row of its raw statistics tensor."""
        if isinstance(stats, dict):
            from ._quant import STATS_FIELDS

            stats = torch.tensor([float(stats[k]) for k in STATS_FIELDS], dtype=torch.float64)
        self._r.record_quant_stats(name, int(step), stats.detach().to("cpu", torch.float64).contiguous())

    def record_attention(self, name: str, step: int, telemetry):
        """One attention call's telemetry (octet.torch.attention(..., return_telemetry=True)) after
        its backward: the quantization checks of Q, K, V (<name>.q, ...) and dO, and the backward's
        residuals (ATTENTION_CHECKS)."""
        back = telemetry.backward
        if back is None:
            raise ValueError(f"octet.torch.RunReport.record_attention: the telemetry of {name!r} has no backward "
                             "yet; record it after loss.backward()")
        for operand, row in zip(("q", "k", "v"), telemetry.forward_tensor):
            self.record_quantization(f"{name}.{operand}", step, row)
        self.record_quantization(f"{name}.dout", step, telemetry.dout_stats_tensor)
        for field in ATTENTION_CHECKS:
            check = f"{name}.{field}"
            if not self.has_check(check):
                self.add_check(check, "custom", operation=name)
            self.record(check, step, back[field])

    def record_linear(self, name: str, step: int, layer):
        """A Float8Linear's last step (``layer.collect_stats = True``): the quantization checks of
        each copy it made (<name>.x, <name>.w, <name>.dy, ...)."""
        stats = getattr(layer, "last_stats", None)
        if not stats:
            raise ValueError(f"octet.torch.RunReport.record_linear: {name!r} has no statistics; set "
                             "layer.collect_stats = True and run a step first")
        for operand, row in stats.items():
            self.record_quantization(f"{name}.{operand}", step, row)

    # ---- memory ----

    def memory(self, category: str, bytes: float, action: str = "set"):
        """The memory ledger: set (default), allocate or release bytes of a category
        (MEMORY_CATEGORIES)."""
        self._r.memory(category, action, float(bytes))

    def book_memory(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None):
        """Sets weights, gradients and optimizer_state to what model and optimizer hold now."""
        params = list(model.parameters())
        self.memory("weights", sum(p.numel() * p.element_size() for p in params))
        self.memory("gradients", sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None))
        if optimizer is not None:
            held = 0
            for state in optimizer.state.values():
                for v in state.values():
                    if torch.is_tensor(v):
                        held += v.numel() * v.element_size()
            self.memory("optimizer_state", held)

    # ---- the report ----

    def to_json(self) -> str:
        """octet::run_report::to_json: the JSON a C++ program writes."""
        return self._r.to_json()

    def to_dict(self) -> dict:
        return json.loads(self.to_json())

    def to_markdown(self) -> str:
        return self._r.to_markdown()
