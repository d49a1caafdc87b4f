#!/usr/bin/env python3
"""The device check of `example_08_training --linears cuda`.

    python3 cuda_matches_host.py PROGRAM OUT [--tolerance NATS] -- ARGS...

Runs PROGRAM ARGS twice, with the FP8 linears on the host and on the CUDA GPU (--linears host /
cuda, reports in OUT/host and OUT/cuda), and compares the two report.json files run by run. The
device GEMM may sum a promotion segment in another order than the host's k order, so the runs are
held to a tolerance, not to the same bits: every training loss and the final held-out loss within
--tolerance nats (default 0.02) of the host's. Prints, per run, how many training losses are
bit-identical and the largest difference. Without a CUDA device, or in a build without CUDA, it
prints `OCTET_SKIP: <why>` and exits 0 (the CTest test skips on that line).
"""
import argparse
import json
import os
import re
import subprocess
import sys


def main():
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser()
    p.add_argument("program")
    p.add_argument("out")
    p.add_argument("--tolerance", type=float, default=0.02)
    a = p.parse_args(argv[:cut])
    args = argv[cut + 1:]
    reports = {}
    for mode in ("cuda", "host"):  # the device first: without one, nothing else runs
        folder = os.path.join(a.out, mode)
        r = subprocess.run([a.program, *args, "--linears", mode, "--out", folder], capture_output=True, text=True)
        text = r.stdout + r.stderr
        if mode == "cuda" and r.returncode != 0:
            m = re.search(r"--linears cuda: ([^\n]*)", text)
            if m and re.search(r"no usable CUDA device|this build has no CUDA", m.group(1)):
                print(f"OCTET_SKIP: {m.group(1)}")
                return 0
        if r.returncode != 0:
            print(f"--linears {mode} failed ({r.returncode}):\n{text[-3000:]}")
            return 1
        with open(os.path.join(folder, "report.json")) as f:
            reports[mode] = json.load(f)
    host, cuda = reports["host"], reports["cuda"]
    if "FP8 linears on CUDA" not in cuda["machine"]:
        print(f"the cuda run's report does not say where its linears ran: {cuda['machine']}")
        return 1
    if len(host["runs"]) != len(cuda["runs"]) or not host["runs"]:
        print(f"host: {len(host['runs'])} runs, cuda: {len(cuda['runs'])} runs")
        return 1
    ok = True
    for h, c in zip(host["runs"], cuda["runs"]):
        name = f"{h['recipe']} seed {h['seed']} ({h['size']}, {h['steps']} steps)"
        if (h["recipe"], h["seed"]) != (c["recipe"], c["seed"]) or len(h["train_loss"]) != len(c["train_loss"]):
            print(f"{name}: the runs do not pair up")
            return 1
        diffs = [abs(x - y) for x, y in zip(h["train_loss"], c["train_loss"])]
        same = sum(d == 0 for d in diffs)
        worst = max(diffs)
        held = abs(h["final_heldout_loss"] - c["final_heldout_loss"])
        good = worst <= a.tolerance and held <= a.tolerance
        ok = ok and good
        print(f"{'ok  ' if good else 'FAIL'} {name}: {same}/{len(diffs)} training losses bit-identical, largest "
              f"difference {worst:.3g} nats; held-out {h['final_heldout_loss']:.6f} (host) vs "
              f"{c['final_heldout_loss']:.6f} (cuda); tokens/s {h['tokens_per_second']:.0f} vs {c['tokens_per_second']:.0f}")
    print(f"tolerance {a.tolerance} nats: {'passed' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
