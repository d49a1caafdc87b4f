"""Per-call overhead of octet's torch ops against the same C++ calls made directly.

    python bench/python/op_overhead.py build/default/bench/bench_small_call

Times torch.ops.octet.{quantize, dequantize, cast} on small tensors (16 x 64, the median of
repeated timeit runs), runs the Google Benchmark binary bench_small_call (the same operations,
shapes and inputs called from C++, outputs allocated per call as the ops do), and prints both and
their difference: what the PyTorch embedding (dispatcher, argument checks, output tensors) adds;
and, as a peer, a call of torch's own aten.neg on the same 1024 floats.
"""

import json
import subprocess
import sys
import timeit

import torch

import octet.torch  # noqa: F401  (registers torch.ops.octet)


def per_call_us(fn, number=2000, repeat=7):
    fn()
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main(binary):
    x = (torch.arange(16 * 64, dtype=torch.float32) % 17 * 0.25 - 2.0).reshape(16, 64)
    codes, scales, ts = octet.torch.quantize(x, "mxfp8_e4m3")[0].raw()
    flat = x.reshape(-1)
    ops = {
        "quantize/mxfp8_e4m3/16x64": lambda: torch.ops.octet.quantize(x, "mxfp8_e4m3", True, False),
        "dequantize/mxfp8_e4m3/16x64": lambda: torch.ops.octet.dequantize(codes, scales, ts, "mxfp8_e4m3", 64),
        "cast/e4m3/1024": lambda: torch.ops.octet.cast(flat, "e4m3"),
    }
    torch_us = {name: per_call_us(fn) for name, fn in ops.items()}
    out = subprocess.run([binary, "--benchmark_format=json", "--benchmark_min_time=0.2"], check=True,
                         capture_output=True, text=True).stdout
    cpp_us = {b["name"]: b["real_time"] / 1000.0 for b in json.loads(out)["benchmarks"]}  # ns -> us
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads")
    print(f"{'operation':32} {'torch op (us)':>14} {'C++ direct (us)':>16} {'overhead (us)':>14}")
    for name in ops:
        print(f"{name:32} {torch_us[name]:14.2f} {cpp_us[name]:16.2f} {torch_us[name] - cpp_us[name]:14.2f}")
    # A peer in the same run: what any torch op call from Python costs on a tensor this small.
    peer = per_call_us(lambda: torch.ops.aten.neg.default(flat))
    print(f"{'peer: torch.ops.aten.neg (1024)':32} {peer:14.2f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/default/bench/bench_small_call")
