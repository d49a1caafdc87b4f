#!/usr/bin/env python3
"""octet's low-precision AdamW beside its peers on the CPU: state bytes, step time and loss, in one run.

    PYTHONPATH=python OCTET_LIBRARY_DIR=build/default/python/lib python3 bench/python/optimizer_peers.py
    ... optimizer_peers.py --quick              # about a minute: smaller model, 60 steps, one seed
    ... optimizer_peers.py --json out.json      # also write every number (per seed) as JSON
    ... optimizer_peers.py --only octet --only bitsandbytes   # only names containing one of these

The task: teacher-student regression. A fixed random teacher (Linear(256, 128) -> tanh ->
Linear(128, 16), outputs scaled to unit variance; data seed 0) labels Gaussian inputs; every step
draws a fresh minibatch of 128 inputs from a seeded generator (no data is seen twice, so the
held-out loss measures optimization, not overfitting); 4096 fixed held-out pairs. The student, the
model every optimizer trains: an MLP of nn.Linear layers with GELU, 256 -> width -> ... -> 16
(default width 1024, 3 hidden layers: 2.39M parameters), MSE loss. For a given seed every optimizer
gets the same initial weights, minibatches and hyperparameters (lr 1e-3, betas (0.9, 0.999), eps
1e-8, weight decay 0.01); configurations with bfloat16 parameters cast the same float32 initial
weights to bfloat16 and run forward and backward in bfloat16 (the loss in float32).

Measured per configuration, all from this run:
  * state B/param: the bytes of every tensor in optimizer.state after training (each distinct
    storage once, so a quantization map that several parameters share counts once; tensor
    subclasses such as torchao's OptimState8bit are opened into their inner tensors), divided by
    the number of parameters. A master copy of the weights is counted when the optimizer keeps one
    in its state (octet's bf16_kahan compensation buffer is counted; none of these optimizers keeps
    a float32 copy of bfloat16 parameters). Gradients are not counted.
  * param B/param: the parameters' own bytes (4 for float32, 2 for bfloat16), reported separately.
  * step ms, interleaved: after all training, every configuration's trained model and optimizer
    (last seed) take one more training step per round, in a shuffled order each round, for
    --rounds timed rounds after one untimed; the median (and p10..p90) wall time of
    optimizer.step(). Interleaving makes load from other processes on a shared machine fall on all
    configurations alike. Also reported: the median of optimizer.step() during training (all
    seeds, the first --warmup steps of each dropped: they hold torch.compile for torchao's
    optimizers), which runs one configuration at a time. torch.set_num_threads(--threads, default
    all cores); octet's host pool takes torch's thread count.
  * held-out MSE after --steps steps (mean over seeds), and its gap to torch.optim.AdamW (float32,
    foreach) on the same seed: mean and min..max over seeds. The float32 reference's own spread
    over seeds is printed too, to read the gaps against.

Configurations: torch.optim.AdamW (float32 foreach, float32 fused, and bfloat16 parameters with
its bfloat16 state as a plain-rounding reference); torchao.optim AdamW8bit, AdamW4bit (float32
parameters) and AdamW8bit with bfloat16 parameters and bf16_stochastic_round; bitsandbytes'
AdamW8bit; octet.torch.AdamW with the dynamic8, e4m3_scaled and e4m3_expanded codecs (float32
master) and dynamic8 with bfloat16 parameters (bf16_stochastic and bf16_kahan masters). A peer
that cannot be imported, built or stepped here is listed as skipped with its exception.

Cost: the default run is 12 configurations x 3 seeds x 200 steps, plus torchao's compiles (about a
minute in all). On the 2-core VM of bench/RESULTS.md its steps add up to about 10 minutes on one
thread (from the step times measured there) and roughly 6 on two; torchao's CPU steps take over a
third of it. --seeds 1 takes a third of that, --quick under a minute.
"""
import argparse
import json
import math
import os
import platform
import random
import statistics
import time

import torch
from torch import nn

HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
D_IN, D_HIDDEN_TEACHER, D_OUT, N_TEST = 256, 128, 16, 4096


# ---- the configurations ----------------------------------------------------------------------------

def _torch(**kw):
    return lambda ps, seed: torch.optim.AdamW(ps, **HYPER, **kw)


def _torchao(name, **kw):
    def make(ps, seed):
        import torchao.optim

        return getattr(torchao.optim, name)(ps, **HYPER, **kw)

    return make


def _bnb(ps, seed):
    import bitsandbytes

    return bitsandbytes.optim.AdamW8bit(ps, **HYPER)


def _octet(codec, master):
    def make(ps, seed):
        import octet.torch as ot

        return ot.AdamW(ps, **HYPER, m_codec=codec, v_codec=codec, master=master, seed=seed)

    return make


REFERENCE = "torch AdamW fp32 (foreach)"
# (name, parameter dtype, factory(params, seed) -> optimizer)
CONFIGS = [
    (REFERENCE, torch.float32, _torch(foreach=True)),
    ("torch AdamW fp32 (fused)", torch.float32, _torch(fused=True)),
    ("torch AdamW bf16 params (foreach, bf16 state)", torch.bfloat16, _torch(foreach=True)),
    ("torchao AdamW8bit", torch.float32, _torchao("AdamW8bit")),
    ("torchao AdamW4bit", torch.float32, _torchao("AdamW4bit")),
    ("torchao AdamW8bit bf16 params (bf16_stochastic_round)", torch.bfloat16,
     _torchao("AdamW8bit", bf16_stochastic_round=True)),
    ("bitsandbytes AdamW8bit", torch.float32, _bnb),
    ("octet AdamW dynamic8, fp32 master", torch.float32, _octet("dynamic8", "fp32")),
    ("octet AdamW e4m3_scaled, fp32 master", torch.float32, _octet("e4m3_scaled", "fp32")),
    ("octet AdamW e4m3_expanded (default), fp32 master", torch.float32, _octet("e4m3_expanded", "fp32")),
    ("octet AdamW dynamic8, bf16_stochastic master", torch.bfloat16, _octet("dynamic8", "bf16_stochastic")),
    ("octet AdamW dynamic8, bf16_kahan master", torch.bfloat16, _octet("dynamic8", "bf16_kahan")),
]


# ---- task, model, measurement ----------------------------------------------------------------------

class Task:
    """The fixed teacher (data seed 0) and its held-out set."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.randn(D_IN, D_HIDDEN_TEACHER, generator=g) / D_IN ** 0.5
        self.w2 = torch.randn(D_HIDDEN_TEACHER, D_OUT, generator=g) / D_HIDDEN_TEACHER ** 0.5
        y = self._raw(torch.randn(1 << 16, D_IN, generator=g))
        self.mean, self.std = y.mean(0), y.std(0)
        self.x_test = torch.randn(N_TEST, D_IN, generator=g)
        self.y_test = self(self.x_test)

    def _raw(self, x):
        return torch.tanh(x @ self.w1) @ self.w2

    def __call__(self, x):
        return (self._raw(x) - self.mean) / self.std


def make_model(seed, width, depth, dtype):
    torch.manual_seed(seed)
    layers, d = [], D_IN
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.GELU()]
        d = width
    layers.append(nn.Linear(d, D_OUT))
    return nn.Sequential(*layers).to(dtype)


def _inner_tensors(t):
    """The plain tensors that hold t's data (a tensor subclass opened with __tensor_flatten__)."""
    if type(t) not in (torch.Tensor, nn.Parameter) and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        for n in names:
            yield from _inner_tensors(getattr(t, n))
    else:
        yield t


def state_bytes(opt):
    """Bytes of every distinct storage that the optimizer's state tensors use."""
    seen = {}
    for s in opt.state.values():
        for v in s.values():
            if isinstance(v, torch.Tensor):
                for t in _inner_tensors(v):
                    st = t.untyped_storage()
                    seen[(st.data_ptr(), st.nbytes())] = st.nbytes()
    return sum(seen.values())


def _step(model, opt, dtype, task, x):
    """One training step on inputs x; returns (loss, forward+backward ms, optimizer.step() ms)."""
    y = task(x)
    t0 = time.perf_counter()
    loss = nn.functional.mse_loss(model(x.to(dtype)).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    t1 = time.perf_counter()
    opt.step()
    t2 = time.perf_counter()
    return loss.item(), (t1 - t0) * 1e3, (t2 - t1) * 1e3


def train(factory, dtype, seed, task, args):
    """--steps steps from seed's initial weights; returns (numbers, model, optimizer)."""
    model = make_model(seed, args.width, args.depth, torch.float32).to(dtype)  # same init for both dtypes
    params = list(model.parameters())
    opt = factory(params, seed)
    batches = torch.Generator().manual_seed(1000 + seed)
    losses, fwd_bwd_ms, step_ms = [], [], []
    for _ in range(args.steps):
        loss, fb, st = _step(model, opt, dtype, task, torch.randn(args.batch, D_IN, generator=batches))
        losses.append(loss)
        fwd_bwd_ms.append(fb)
        step_ms.append(st)
    with torch.no_grad():
        test = nn.functional.mse_loss(model(task.x_test.to(dtype)).float(), task.y_test).item()
    n = sum(p.numel() for p in params)
    numbers = dict(test_mse=test, first_train_mse=losses[0], last_train_mse=losses[-1],
                   nonfinite_losses=sum(not math.isfinite(v) for v in losses),
                   step_ms=step_ms[args.warmup:], fwd_bwd_ms=fwd_bwd_ms[args.warmup:],
                   state_bytes_per_param=state_bytes(opt) / n,
                   param_bytes_per_param=sum(p.numel() * p.element_size() for p in params) / n, n_params=n)
    return numbers, model, opt


def interleaved_step_ms(live, task, args):
    """optimizer.step() times of the trained (model, optimizer, dtype) of every configuration,
    visited in a shuffled order each round (one step each; round 0 untimed), so that load from
    other processes falls on all configurations alike. Returns {name: [ms per round]}."""
    order, shuffle = list(live), random.Random(0)
    batches = torch.Generator().manual_seed(4321)
    samples = {name: [] for name in live}
    for r in range(args.rounds + 1):
        shuffle.shuffle(order)
        for name in order:
            model, opt, dtype = live[name]
            _, _, ms = _step(model, opt, dtype, task, torch.randn(args.batch, D_IN, generator=batches))
            if r:
                samples[name].append(ms)
    return samples


def _error(e):
    lines = str(e).strip().splitlines() or [""]
    return f"{type(e).__name__}: {lines[0][:200]}"


def _versions():
    out = {"torch": torch.__version__, "python": platform.python_version()}
    for mod in ("torchao", "bitsandbytes"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            out[mod] = f"not importable ({_error(e)})"
    return out


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="width 512, 60 steps, one seed, 15 rounds (about a minute)")
    ap.add_argument("--steps", type=int, help="training steps per run (default 200; quick 60)")
    ap.add_argument("--warmup", type=int,
                    help="steps per run left out of the in-training step time (default 10; quick 5)")
    ap.add_argument("--seeds", type=int, help="seeds 0..n-1 (default 3; quick 1)")
    ap.add_argument("--rounds", type=int, help="timed rounds of the interleaved step timing (default 40; quick 15)")
    ap.add_argument("--width", type=int, help="hidden width (default 1024; quick 512)")
    ap.add_argument("--depth", type=int, default=3, help="hidden layers (default 3)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (default: all)")
    ap.add_argument("--only", action="append", help="run only configurations whose name contains this "
                                                     "(repeatable; the torch float32 reference always runs)")
    ap.add_argument("--json", help="write every number (per seed, every timed step) to this path")
    args = ap.parse_args(argv)
    quick = dict(steps=60, warmup=5, seeds=1, rounds=15, width=512)
    full = dict(steps=200, warmup=10, seeds=3, rounds=40, width=1024)
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.steps <= args.warmup:
        ap.error("--steps must exceed --warmup")
    torch.set_num_threads(args.threads)
    # torchao compiles its step once per parameter shape and state type (dynamic=False); with
    # dynamo's default limit of 8 entries per function, the later torchao configurations would
    # silently run uncompiled. Room for all of them, as in a process that uses one optimizer.
    torch._dynamo.config.recompile_limit = 64

    configs = CONFIGS
    if args.only:
        configs = [c for c in CONFIGS if c[0] == REFERENCE or any(k in c[0] for k in args.only)]

    started = time.perf_counter()
    load_before = os.getloadavg()
    versions = _versions()
    task = Task()
    print(f"CPU: {_cpu_model()}, {os.cpu_count()} logical CPUs; torch.set_num_threads({args.threads}); "
          f"load average {load_before[0]:.2f} at start")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"model: MLP {D_IN} -> {args.width} x {args.depth} -> {D_OUT}, batch {args.batch}, {args.steps} steps, "
          f"warm-up {args.warmup}, seeds 0..{args.seeds - 1}, {args.rounds} interleaved timing rounds\n", flush=True)

    results, live = {}, {}
    for name, dtype, factory in configs:
        t = time.perf_counter()
        runs = []
        try:
            for seed in range(args.seeds):
                numbers, model, opt = train(factory, dtype, seed, task, args)
                runs.append(numbers)
        except Exception as e:  # noqa: BLE001 - a peer that does not run here is reported, not fatal
            results[name] = dict(skipped=_error(e))
            print(f"  {name}: skipped: {_error(e)}", flush=True)
            continue
        live[name] = (model, opt, dtype)
        results[name] = dict(param_dtype=str(dtype).replace("torch.", ""), runs=runs,
                             train_step_ms=statistics.median(s for r in runs for s in r["step_ms"]),
                             fwd_bwd_ms=statistics.median(s for r in runs for s in r["fwd_bwd_ms"]),
                             state_bytes_per_param=runs[0]["state_bytes_per_param"],
                             param_bytes_per_param=runs[0]["param_bytes_per_param"],
                             test_mse=statistics.mean(r["test_mse"] for r in runs),
                             train_wall_s=time.perf_counter() - t)
        print(f"  {name}: trained in {time.perf_counter() - t:.1f} s", flush=True)

    t = time.perf_counter()
    for name, samples in interleaved_step_ms(live, task, args).items():
        results[name].update(step_ms_samples=samples, step_ms=statistics.median(samples),
                             step_ms_p10=_pct(samples, 0.1), step_ms_p90=_pct(samples, 0.9))
    print(f"  interleaved step timing: {time.perf_counter() - t:.1f} s", flush=True)

    ref = results.get(REFERENCE, {})
    ref_mse = [r["test_mse"] for r in ref.get("runs", [])]
    n_params = ref["runs"][0]["n_params"] if ref_mse else None
    if ref_mse:
        print(f"\n{n_params} parameters; MSE of the first minibatch (initial model, reference, mean of seeds): "
              f"{statistics.mean(r['first_train_mse'] for r in ref['runs']):.4f}")
    print("\n| optimizer | params | state B/param | param B/param | step ms: interleaved median (p10..p90) | "
          "step ms: in training, median | held-out MSE | gap to torch fp32 (mean; min..max over seeds) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, dtype, _ in configs:
        r = results[name]
        if "skipped" in r:
            print(f"| {name} | {str(dtype).replace('torch.', '')} | skipped: {r['skipped']} | | | | | |")
            continue
        gaps = [a["test_mse"] - b for a, b in zip(r["runs"], ref_mse)]
        r["gaps"] = gaps
        gap = (f"{statistics.mean(gaps):+.4f} ({min(gaps):+.4f}..{max(gaps):+.4f})" if len(gaps) > 1
               else f"{gaps[0]:+.4f}") if gaps else "n/a (reference skipped)"
        bad = sum(x["nonfinite_losses"] for x in r["runs"])
        mse = f"{r['test_mse']:.4f}" + (f" ({bad} non-finite training losses)" if bad else "")
        print(f"| {name} | {r['param_dtype']} | {r['state_bytes_per_param']:.3f} | {r['param_bytes_per_param']:.0f} | "
              f"{r['step_ms']:.2f} ({r['step_ms_p10']:.2f}..{r['step_ms_p90']:.2f}) | {r['train_step_ms']:.2f} | "
              f"{mse} | {gap} |")
    if len(ref_mse) > 1:
        print(f"\ntorch fp32 reference held-out MSE per seed: {', '.join(f'{m:.4f}' for m in ref_mse)} "
              f"(spread {max(ref_mse) - min(ref_mse):.4f})")
    if ref_mse:
        print(f"forward+backward median (float32 reference, in training): {ref['fwd_bwd_ms']:.2f} ms per step")
    wall = time.perf_counter() - started
    load_after = os.getloadavg()
    print(f"load average {load_after[0]:.2f} at the end (1-minute); wall time: {wall:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), versions=versions, cpu=_cpu_model(), n_params=n_params, wall_s=wall,
                           load_average_start=load_before, load_average_end=load_after, results=results), f, indent=1)
    return results


if __name__ == "__main__":
    main()
