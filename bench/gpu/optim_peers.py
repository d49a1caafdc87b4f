#!/usr/bin/env python3
"""Peers of octet's fused AdamW step (bench/gpu/optim_adamw.cu) on the GPU machine.

Times one optimizer step on a single flat float32 parameter of N elements (default 2^28; env
OCTET_OPTIM_BENCH_N) with float32 gradients, for:
  * torch.optim.AdamW(fused=True): float32 moments (8 B/parameter of state)
  * bitsandbytes.optim.AdamW8bit: 8-bit blockwise dynamic moments (block 256), when importable
  * torchao.optim.AdamWFp8: FP8 moments with a scale per block of 256, when importable (it
    compiles its step with torch.compile; the compile is warm-up, not timed)
and, when the environment variable OCTET_BUILD names a CMake build folder that holds
bench/gpubench_optim_adamw, runs octet's matching configurations at the same N and prints the
ratios (peer step time / octet step time: above 1 means octet is faster).

Every result is a line `OCTET_RESULT|bench|metric|value|unit|note`, as bench/gpu/gpu_bench.cuh
prints them; a peer that cannot be imported or run says so in a `skipped` line instead.
"""
import os
import re
import subprocess
import sys

N = int(os.environ.get("OCTET_OPTIM_BENCH_N", str(1 << 28)))


def result(bench, metric, value, unit, note=""):
    print(f"OCTET_RESULT|{bench}|{metric}|{value:.4g}|{unit}|{note}", flush=True)


def skipped(bench, why):
    print(f"OCTET_RESULT|{bench}|skipped|0|-|{why}", flush=True)


try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means no peers
    skipped("optim_peers", f"torch not importable: {e}")
    sys.exit(0)
if not torch.cuda.is_available():
    skipped("optim_peers", "no CUDA device visible to torch")
    sys.exit(0)


def median_ms(fn, repeats=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth_gbs(nbytes=1 << 30):
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(0x5A)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    del src, dst
    return 2.0 * nbytes / (ms * 1e6)


def report(bench, ms, bytes_moved, state_bytes_per_param, copy_gbs, note):
    gbs = bytes_moved / (ms * 1e6)
    result(bench, "step_time", ms, "ms", f"{N} parameters; {note}")
    result(bench, "bandwidth", gbs, "GB/s", "bytes the step must move (read + write)")
    result(bench, "fraction_of_copy", gbs / copy_gbs, "x", "of device-to-device copy bandwidth")
    result(bench, "parameters_per_s", N / (ms * 1e6), "G/s", "")
    result(bench, "state_bytes_per_param", state_bytes_per_param, "B", "both moments + per-block scales")


def make_param():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(N, device="cuda", dtype=torch.float32))
    p.grad = torch.randn_like(p) * 1e-3
    return p


def run_peer(bench, make_opt, bytes_per_param, state_bytes, copy_gbs, note):
    """Times opt.step(); returns the median ms or None."""
    try:
        p = make_param()
        opt = make_opt(p)
        ms = median_ms(opt.step)
        report(bench, ms, bytes_per_param * N, state_bytes, copy_gbs, note)
        return ms
    except Exception as e:  # noqa: BLE001 - report and go on with the other peers
        skipped(bench, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
        return None
    finally:
        torch.cuda.empty_cache()


def octet_times():
    """Runs octet's gpubench_optim_adamw for the float32-gradient configurations at this N."""
    build = os.environ.get("OCTET_BUILD")
    if not build:
        return {}, "OCTET_BUILD not set"
    exe = os.path.join(build, "bench", "gpubench_optim_adamw")
    if not os.access(exe, os.X_OK):
        return {}, f"{exe} not built"
    env = dict(os.environ, OCTET_OPTIM_BENCH_N=str(N))
    try:
        out = subprocess.run([exe, "fp32master_f32grad"], env=env, capture_output=True, text=True, timeout=180).stdout
    except Exception as e:  # noqa: BLE001
        return {}, f"running {exe} failed: {e}"
    times = {}
    for m in re.finditer(r"^OCTET_RESULT\|optim_adamw_(\w+)\|step_time\|([0-9.eE+-]+)\|", out, re.M):
        times[m.group(1)] = float(m.group(2))
    return times, ""


def main():
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}, torch {torch.__version__}", flush=True)
    copy = copy_bandwidth_gbs()
    result("torch_copy", "bandwidth", copy, "GB/s", "tensor.copy_ D2D, read+write")

    peers = {}
    # PyTorch fused AdamW, float32 moments: param r+w 8, grad 4, m r+w 8, v r+w 8 = 28 B.
    peers["torch_fused_adamw_fp32"] = run_peer(
        "torch_fused_adamw_fp32",
        lambda p: torch.optim.AdamW([p], lr=1e-4, weight_decay=0.01, fused=True),
        28.0, 8.0, copy, "float32 params, grads and moments")

    try:
        import bitsandbytes as bnb  # noqa: F401
        # param r+w 8, grad 4, 8-bit m and v r+w 4, absmax per 256 (float32) r+w for both
        peers["bnb_adamw8bit"] = run_peer(
            "bnb_adamw8bit",
            lambda p: bnb.optim.AdamW8bit([p], lr=1e-4, weight_decay=0.01),
            16.0 + 4 * 4.0 / 256, 2.0 + 2 * 4.0 / 256, copy,
            f"bitsandbytes {getattr(bnb, '__version__', '?')}, blockwise 8-bit states")
    except Exception as e:  # noqa: BLE001
        skipped("bnb_adamw8bit", f"bitsandbytes not importable: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")

    try:
        from torchao.optim import AdamWFp8
        import torchao
        peers["torchao_adamw_fp8"] = run_peer(
            "torchao_adamw_fp8",
            lambda p: AdamWFp8([p], lr=1e-4, weight_decay=0.01),
            16.0 + 4 * 4.0 / 256, 2.0 + 2 * 4.0 / 256, copy,
            f"torchao {getattr(torchao, '__version__', '?')}, FP8 E4M3 states, block 256 (torch.compile)")
    except Exception as e:  # noqa: BLE001
        skipped("torchao_adamw_fp8", f"torchao not importable: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")

    times, why = octet_times()
    if not times:
        skipped("optim_peer_ratios", why or "octet's benchmark printed no step times")
        return
    pairs = [
        ("torch_fused_adamw_fp32", "fp32_fp32master_f32grad", "octet fp32 states vs PyTorch fused AdamW"),
        ("bnb_adamw8bit", "dynamic8_fp32master_f32grad", "octet dynamic8 (2.03 B/param) vs bnb 8-bit (2.03 B/param); goal > 1"),
        ("torchao_adamw_fp8", "e4m3_scaled_fp32master_f32grad", "octet e4m3_scaled (2.06 B/param) vs torchao FP8 (2.03 B/param)"),
        ("torchao_adamw_fp8", "e4m3_expanded_fp32master_f32grad", "octet e4m3_expanded (2.19 B/param) vs torchao FP8"),
    ]
    for peer, mine, note in pairs:
        if peers.get(peer) and times.get(mine):
            result(f"ratio_{peer}_over_octet_{mine.split('_')[0]}" + ("_expanded" if "expanded" in mine else ""),
                   "speedup", peers[peer] / times[mine], "x", note)
        else:
            skipped(f"ratio_{peer}_vs_{mine}", "peer or octet time missing")


if __name__ == "__main__":
    main()
