#!/usr/bin/env python3
"""octet's AdamW and Float8Linear on the CPU beside their peers, in one run.

    PYTHONPATH=python OCTET_LIBRARY_DIR=build/default/python/lib python3 bench/python/cpu_peers.py

AdamW: one step on one flat float32 parameter of N elements (default 2^22; OCTET_BENCH_N) with
float32 gradients: torch.optim.AdamW (fused=True, and foreach=True), torchao's AdamW8bit and
AdamWFp8 (torch.compile'd steps; the compile is warm-up), bitsandbytes' AdamW8bit, and octet's
AdamW with each moment codec. Float8Linear: forward and backward of one layer, T tokens x
in -> out (default 2048 x 1024 -> 1024): nn.Linear in float32, octet's Float8Linear per recipe,
and torchao's Float8Linear (tensorwise, its default). Times are medians of repeated runs with
torch's intra-op threads as set (OCTET_BENCH_THREADS, default 1); a peer that cannot be imported
or run on the CPU is reported as skipped with the reason.
"""
import os
import statistics
import time

import torch
from torch import nn

import octet.torch as ot

N = int(os.environ.get("OCTET_BENCH_N", str(1 << 22)))
T, IN, OUT = 2048, 1024, 1024
torch.set_num_threads(int(os.environ.get("OCTET_BENCH_THREADS", "1")))


def median_ms(fn, repeats=9, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def report(group, name, fn):
    try:
        ms = fn()
        print(f"| {group} | {name} | {ms:.2f} |", flush=True)
        return ms
    except Exception as e:  # noqa: BLE001 - a peer that does not run here is reported, not fatal
        print(f"| {group} | {name} | skipped: {type(e).__name__}: {str(e).splitlines()[0][:120]} |", flush=True)
        return None


def adamw_step_ms(make):
    p = nn.Parameter(torch.randn(N))
    p.grad = torch.randn(N) * 1e-3
    opt = make([p])
    return median_ms(opt.step)


def linear_ms(layer):
    x = torch.randn(T, IN, requires_grad=True)
    dy = torch.randn(T, OUT) * 1e-3

    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer(x).backward(dy)

    return median_ms(step, repeats=5)


def main():
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s); AdamW on {N} parameters, "
          f"linear {T} x {IN} -> {OUT}\n")
    print("| what | configuration | ms |")
    print("|---|---|---|")
    report("AdamW", "torch fused", lambda: adamw_step_ms(lambda ps: torch.optim.AdamW(ps, fused=True)))
    report("AdamW", "torch foreach", lambda: adamw_step_ms(lambda ps: torch.optim.AdamW(ps, foreach=True)))

    def torchao(name):
        from torchao.optim import AdamW8bit, AdamWFp8

        return adamw_step_ms(lambda ps: {"AdamW8bit": AdamW8bit, "AdamWFp8": AdamWFp8}[name](ps))

    report("AdamW", "torchao AdamW8bit", lambda: torchao("AdamW8bit"))
    report("AdamW", "torchao AdamWFp8", lambda: torchao("AdamWFp8"))

    def bnb():
        import bitsandbytes as b

        return adamw_step_ms(lambda ps: b.optim.AdamW8bit(ps))

    report("AdamW", "bitsandbytes AdamW8bit", bnb)
    for codec in ot.optim.CODECS:
        report("AdamW", f"octet {codec}", lambda c=codec: adamw_step_ms(lambda ps: ot.AdamW(ps, m_codec=c)))

    torch.manual_seed(0)
    base = nn.Linear(IN, OUT)
    report("linear fwd+bwd", "nn.Linear float32", lambda: linear_ms(base))
    for recipe in ot.LINEAR_RECIPES:
        report("linear fwd+bwd", f"octet Float8Linear {recipe}",
               lambda r=recipe: linear_ms(ot.Float8Linear.from_float(base, recipe=r)))

    def torchao_linear():
        from torchao.float8 import Float8LinearConfig
        from torchao.float8.float8_linear import Float8Linear

        return linear_ms(Float8Linear.from_float(nn.Linear(IN, OUT), config=Float8LinearConfig()))

    report("linear fwd+bwd", "torchao Float8Linear tensorwise", torchao_linear)


if __name__ == "__main__":
    main()
