#!/usr/bin/env python3
"""What autograd keeps for backward, counted byte by byte, for one MLP block on the CPU.

    PYTHONPATH=python OCTET_LIBRARY_DIR=build/default/python/lib python3 bench/python/saved_bytes.py

The block: LayerNorm -> Linear(d, 4d) -> GELU -> Linear(4d, d), T tokens (default 512 x 256, which torchao's CPU float8 path runs in seconds;
OCTET_BENCH_T, OCTET_BENCH_D). Counted: every tensor autograd saves during the forward (a tensor
saved twice once; parameters and views of them not at all, they are stored anyway), plus what
compress_activations stores in their place. Configurations: float32; torchao's Float8Linear
(convert_to_float8_training, its default tensorwise recipe); octet's Float8Linear
(convert(recipe=...)); octet's Float8Linear with compress_activations on the LayerNorm and GELU.
A peer that cannot be imported is reported as skipped.
"""
import os

import torch
from torch import nn

import octet.torch as ot

T = int(os.environ.get("OCTET_BENCH_T", "512"))
D = int(os.environ.get("OCTET_BENCH_D", "256"))


def block():
    torch.manual_seed(0)
    return nn.Sequential(nn.LayerNorm(D), nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))


class Counter:
    def __init__(self, model):
        self.bytes = 0
        self.seen = {p.data_ptr() for p in model.parameters()}

    def pack(self, t):
        if t.data_ptr() not in self.seen:
            self.seen.add(t.data_ptr())
            self.bytes += t.numel() * t.element_size()
        return t


def saved_bytes(model, compress=False):
    x = torch.randn(T, D, requires_grad=True)
    counter = Counter(model)
    c = ot.compress_activations(model) if compress else None
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
        y = model(x)
    total = counter.bytes + (c.bytes_stored + c.bytes_kept if c else 0)
    y.float().sum().backward()  # the backward runs on what was kept
    if c:
        c.remove()
    return total


def row(name, fn, base):
    try:
        b = fn()
        print(f"| {name} | {b / 2**20:.2f} | {b / base:.3f} |", flush=True)
    except Exception as e:  # noqa: BLE001 - a peer that does not run here is reported, not fatal
        print(f"| {name} | skipped: {type(e).__name__}: {str(e).splitlines()[0][:100]} | |", flush=True)


def main():
    print(f"block LayerNorm -> Linear({D}, {4 * D}) -> GELU -> Linear({4 * D}, {D}), {T} tokens; "
          f"torch {torch.__version__}")
    print("| configuration | saved for backward (MiB) | / float32 |")
    print("|---|---|---|")
    base = saved_bytes(block())
    row("float32", lambda: base, base)

    def torchao():
        from torchao.float8 import convert_to_float8_training
        return saved_bytes(convert_to_float8_training(block()))

    row("torchao Float8Linear (tensorwise)", torchao, base)
    for recipe in ("tensorwise", "mxfp8"):
        row(f"octet Float8Linear ({recipe})",
            lambda r=recipe: saved_bytes(ot.convert(block(), recipe=r, keep_output_head=False)), base)
        row(f"octet Float8Linear ({recipe}) + compress_activations",
            lambda r=recipe: saved_bytes(ot.convert(block(), recipe=r, keep_output_head=False), True), base)


if __name__ == "__main__":
    main()
