#!/usr/bin/env python3
"""octet's host encode/decode against ml_dtypes, in one run, on one core, on the same 64M floats.

    python3 bench/host/mldtypes_peer.py --build build/h-speed [--reps 5] [LABEL=BINARY ...]

Runs the peer/ benchmarks of bench_format_encode built two ways (bench_format_encode_default_flags:
the compiler's default target flags, what a user who includes the headers gets;
bench_format_encode: -march=native), plus any LABEL=BINARY given (an older build, say), then
ml_dtypes' astype on the same array, and prints one table of ns per element. Each side takes the
best (smallest) CPU time of --reps repetitions: the machine may be shared, and CPU time of one
thread is what a busy neighbour disturbs least.

The array: element i is built from splitmix64(i) (the same integer recipe as format_encode.cpp),
log-uniform in [2^-12, 2^8) for E4M3 and [2^-4, 2^2) for E2M1, random signs and mantissas. It
stays below max_finite: above 464 ml_dtypes gives E4M3 NaN where octet's saturate gives 448 (and
ml_dtypes' E2M1 gives -0 for NaN, octet +6). The codes are compared by checksum.

Needs: pip install ml_dtypes numpy.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import ml_dtypes
import numpy as np

N = 1 << 26
RANGES = {"e4m3": (-12, 8), "e2m1": (-4, 2)}
DTYPES = {"e4m3": ml_dtypes.float8_e4m3fn, "e2m1": ml_dtypes.float4_e2m1fn}
ROWS = [("encode", "e4m3"), ("encode", "e2m1"), ("decode", "e4m3"), ("decode", "e2m1")]


def peer_array(lo, hi):
    z = np.arange(1, N + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    h = z ^ (z >> np.uint64(31))
    exponent = np.uint64(127 + lo) + (h >> np.uint64(40)) % np.uint64(hi - lo)
    bits = ((h >> np.uint64(63)) << np.uint64(31)) | (exponent << np.uint64(23)) | (h & np.uint64(0x7FFFFF))
    return bits.astype(np.uint32).view(np.float32)


def checksums(codes):
    c = codes.view(np.uint8).astype(np.int64)
    return int(c.sum()), int((c * (np.arange(N, dtype=np.int64) & 0xFFFF)).sum())


def best_cpu(fn, reps):
    best = float("inf")
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def run_octet(binary, reps):
    out = subprocess.run([binary, "--benchmark_filter=^peer/", f"--benchmark_repetitions={reps}", "--benchmark_min_time=0.1",
                          "--benchmark_format=json"], check=True, capture_output=True, text=True).stdout
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    res = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        _, op_fmt, _ = b["run_name"].split("/", 2)
        op, fmt = op_fmt.split("_")
        t = b["cpu_time"] * scale[b["time_unit"]] / N * 1e9
        key = (op, fmt)
        prev = res.get(key)
        res[key] = {"ns": t if prev is None else min(prev["ns"], t), "sum": b.get("code_sum"), "wsum": b.get("code_wsum")}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build/default", help="CMake build folder holding bench/bench_format_encode*")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("extra", nargs="*", help="more octet binaries as LABEL=PATH")
    args = ap.parse_args()

    binaries = [("octet default flags", os.path.join(args.build, "bench", "bench_format_encode_default_flags")),
                ("octet -march=native", os.path.join(args.build, "bench", "bench_format_encode"))]
    binaries += [tuple(e.split("=", 1)) for e in args.extra]
    results = {}
    for label, path in binaries:
        print(f"running {label}: {path}", file=sys.stderr)
        results[label] = run_octet(path, args.reps)

    print(f"running ml_dtypes {ml_dtypes.__version__} (numpy {np.__version__})", file=sys.stderr)
    peer = {}
    agree = {}
    for fmt, (lo, hi) in RANGES.items():
        x = peer_array(lo, hi)
        codes = x.astype(DTYPES[fmt])
        peer[("encode", fmt)] = best_cpu(lambda: x.astype(DTYPES[fmt]), args.reps) / N * 1e9
        peer[("decode", fmt)] = best_cpu(lambda: codes.astype(np.float32), args.reps) / N * 1e9
        s, w = checksums(codes)
        agree[fmt] = all(r[("encode", fmt)]["sum"] == s and r[("encode", fmt)]["wsum"] == w for r in results.values())
        del x, codes

    labels = [label for label, _ in binaries]
    print(f"\n2^26 float32 values, one thread; ns per element, best CPU time of {args.reps} repetitions\n")
    print("| operation | " + " | ".join(labels) + " | ml_dtypes | " + " | ".join(f"{l} vs ml_dtypes" for l in labels) + " |")
    print("|---" * (2 + 2 * len(labels)) + "|")
    for op, fmt in ROWS:
        cells = [f"{results[l][(op, fmt)]['ns']:.3f}" for l in labels]
        ratios = [f"{peer[(op, fmt)] / results[l][(op, fmt)]['ns']:.1f}x" for l in labels]
        print(f"| {op} {fmt.upper()} | " + " | ".join(cells) + f" | {peer[(op, fmt)]:.3f} | " + " | ".join(ratios) + " |")
    for fmt, ok in agree.items():
        print(f"\n{fmt.upper()} codes of every octet build equal ml_dtypes' (checksums): {'yes' if ok else 'NO'}", end="")
    print()
    return 0 if all(agree.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
