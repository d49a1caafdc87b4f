#!/usr/bin/env python3
"""Peers of octet's PyTorch layer on the GPU machine, in one run:

  * octet.torch.Float8Linear (recipe tensorwise: per-tensor current scaling, E4M3 activations and
    weights, E5M2 output gradients) against torchao.float8's Float8Linear with its default
    configuration (the same three casts), and nn.Linear in bf16: forward + backward time, and each
    layer's error in Y, dX and dW against a float64 reference computed from the same bf16 values.
  * torch.ops.octet.scaled_mm against torch._scaled_mm on the same E4M3 codes and scales: per
    tensor (float32 output) and per row of A / per row of B (bf16 output, the row-wise pair
    torch._scaled_mm serves): time in TFLOPS, and each one's largest error against the float64
    product of the dequantized operands, in units of T = sum_k |a_ik| |b_jk| (the magnitude the
    GEMM error bound scales with).

Every result is a line `OCTET_RESULT|bench|metric|value|unit|note` (bench/gpu/gpu_bench.cuh's
form); a peer that cannot be imported or run says so in a `skipped` line. octet's op libraries are
loaded from $OCTET_LIBRARY_DIR (the device suite points it at the build its torch_cuda step made)
and its Python package from this repository's python/ folder. torchao comes from .whl (see
bench/prepare_device.sh) when it is not installed.

    python3 bench/gpu/linear_peers.py               # CUDA, the suite's shapes
    python3 bench/gpu/linear_peers.py --device cpu  # small shapes on the CPU: a check of this
                                                    # script and of the error columns; its times
                                                    # mean nothing
"""
import argparse
import os
import sys


def result(bench, metric, value, unit, note=""):
    print(f"OCTET_RESULT|{bench}|{metric}|{value:.4g}|{unit}|{note}", flush=True)


def skipped(bench, why):
    print(f"OCTET_RESULT|{bench}|skipped|0|-|{why}", flush=True)


def first_line(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means no peers
    skipped("linear_peers", f"torch not importable: {first_line(e)}")
    sys.exit(0)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


def timer(device):
    """median_ms(fn): the median time of fn over a few repeats, in milliseconds."""
    import time

    def median_ms(fn, budget_s=0.5):
        fn()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        once = time.perf_counter() - t0
        times = []
        for _ in range(max(3, min(25, int(budget_s / max(once, 1e-5))))):
            if device == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        times.sort()
        return times[len(times) // 2]

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    return median_ms


def rel_err(got, ref):
    d = got.double() - ref
    return (d.norm() / ref.norm().clamp_min(1e-300)).item()


def compare_linear(device, tokens, d_in, d_out, median_ms):
    """Float8Linear (octet, torchao) and nn.Linear bf16: errors against float64, and times."""
    import octet.torch as ot

    shape = f"{tokens}x{d_in}->{d_out}"
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(d_out, d_in, generator=g) / d_in**0.5).to(torch.bfloat16)
    x = torch.randn(tokens, d_in, generator=g).to(torch.bfloat16)
    dy = torch.randn(tokens, d_out, generator=g).to(torch.bfloat16)
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    ref = {"y": x64 @ w64.t(), "dx": dy64 @ w64, "dw": dy64.t() @ x64}
    x, w, dy = x.to(device), w.to(device), dy.to(device)

    def make_plain():
        m = torch.nn.Linear(d_in, d_out, bias=False, device=device, dtype=torch.bfloat16)
        with torch.no_grad():
            m.weight.copy_(w)
        return m

    layers = {"bf16_linear": (make_plain, "nn.Linear, bf16")}
    layers["octet_float8linear"] = (lambda: ot.Float8Linear.from_float(make_plain(), recipe="tensorwise"),
                                    "octet.torch.Float8Linear, recipe tensorwise")
    try:
        import torchao
        from torchao.float8 import convert_to_float8_training

        def make_torchao():
            m = torch.nn.Sequential(make_plain())
            convert_to_float8_training(m)
            return m

        layers["torchao_float8linear"] = (make_torchao, f"torchao {torchao.__version__} Float8Linear, default "
                                          "configuration (dynamic per-tensor E4M3 / E5M2 grad output)")
    except Exception as e:  # noqa: BLE001
        skipped("torchao_float8linear", f"torchao not importable: {first_line(e)}")

    times, outputs = {}, {}
    for name, (make, note) in layers.items():
        try:
            m = make()
            xi = x.clone().requires_grad_(True)
            y = m(xi)
            y.backward(dy)
            weight = m[0].weight if isinstance(m, torch.nn.Sequential) else m.weight
            outputs[name] = {"y": y.detach().cpu(), "dx": xi.grad.cpu(), "dw": weight.grad.cpu()}
            for t, got in outputs[name].items():
                result(f"{name}_{shape}", f"rel_err_{t}", rel_err(got, ref[t]), "",
                       f"{note}; ||got - float64|| / ||float64||")

            def step():
                xi.grad = None
                weight.grad = None
                m(xi).backward(dy)

            times[name] = median_ms(step)
            flops = 3 * 2.0 * tokens * d_in * d_out
            result(f"{name}_{shape}", "fwd_bwd_time", times[name], "ms", note)
            result(f"{name}_{shape}", "fwd_bwd_tflops", flops / (times[name] * 1e9), "TFLOPS",
                   "3 GEMMs of 2 * tokens * in * out")
        except Exception as e:  # noqa: BLE001 - report and go on with the other layers
            skipped(f"{name}_{shape}", first_line(e))
    if "octet_float8linear" in outputs and "torchao_float8linear" in outputs:
        for t in ref:
            a, b = outputs["octet_float8linear"][t], outputs["torchao_float8linear"][t]
            result(f"octet_vs_torchao_{shape}", f"rel_diff_{t}", rel_err(a, b.double()), "",
                   f"||octet - torchao|| / ||torchao||; {(a != b).sum().item()} of {a.numel()} elements differ")
    for peer in ("torchao_float8linear", "bf16_linear"):
        if peer in times and "octet_float8linear" in times:
            result(f"ratio_{peer}_over_octet_{shape}", "speedup", times[peer] / times["octet_float8linear"], "x",
                   f"{peer} time / octet Float8Linear time (above 1: octet is faster)")


def compare_scaled_mm(device, m, n, k, median_ms):
    """octet's scaled_mm and torch._scaled_mm on the same codes and scales."""
    import octet.torch as ot

    shape = f"{m}x{n}x{k}"
    g = torch.Generator().manual_seed(1)
    a = torch.randn(m, k, generator=g).to(device)
    b = torch.randn(n, k, generator=g).to(device)
    # (octet recipe, output dtype, how torch._scaled_mm takes the scales)
    for recipe, out_dtype in (("tensorwise_e4m3", torch.float32), ("rowwise_e4m3", torch.bfloat16)):
        bench = f"scaled_mm_{recipe}_{shape}"
        try:
            qa = ot.quantize(a, recipe)[0]
            qb = ot.quantize(b, recipe)[0]
            sa, sb = qa.block_scales(), qb.block_scales()  # [1, 1] per tensor, [rows, 1] per row
            ca, cb = qa.codes[:, :k].contiguous(), qb.codes[:, :k].contiguous()
            deq_a = ca.float().double() * sa.double()
            deq_b = cb.float().double() * sb.double()
            ref = (deq_a @ deq_b.t()).cpu()
            mag = (deq_a.abs() @ deq_b.abs().t()).cpu().clamp_min(1e-300)
            # torch._scaled_mm takes a 0-d scale per tensor, or [M, 1] and [1, N] with unit strides
            per_tensor = recipe == "tensorwise_e4m3"
            scale_a = sa.reshape(()) if per_tensor else sa.flatten().reshape(m, 1)
            scale_b = sb.reshape(()) if per_tensor else sb.flatten().reshape(1, n)

            def octet_mm():
                return ot.scaled_mm(qa, qb, out_dtype=out_dtype)

            def torch_mm():
                return torch._scaled_mm(ca, cb.t(), scale_a, scale_b, out_dtype=out_dtype)

            note = f"same E4M3 codes and scales, {str(out_dtype).replace('torch.', '')} output"
            for name, fn in (("octet", octet_mm), ("torch_scaled_mm", torch_mm)):
                try:
                    err = ((fn().double().cpu() - ref).abs() / mag).max().item()
                    result(bench, f"{name}_max_err_over_T", err, "", note)
                except Exception as e:  # noqa: BLE001
                    skipped(f"{bench}_{name}", first_line(e))
            t_octet, t_torch = median_ms(octet_mm), median_ms(torch_mm)
            flops = 2.0 * m * n * k
            result(bench, "octet_tflops", flops / (t_octet * 1e9), "TFLOPS", note)
            result(bench, "torch_scaled_mm_tflops", flops / (t_torch * 1e9), "TFLOPS", note)
            result(bench, "speedup_torch_time_over_octet", t_torch / t_octet, "x", "above 1: octet is faster")
        except Exception as e:  # noqa: BLE001
            skipped(bench, first_line(e))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        skipped("linear_peers", "no CUDA device visible to torch")
        return
    try:
        import octet.torch as ot
    except Exception as e:  # noqa: BLE001
        skipped("linear_peers", f"octet.torch not importable (set OCTET_LIBRARY_DIR): {first_line(e)}")
        return
    if args.device == "cuda" and not ot.cuda_kernels():
        skipped("linear_peers", "octet's op libraries here have no CUDA kernels (build with OCTET_TORCH_CUDA=ON)")
        return
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU"
    print(f"device: {name}, torch {torch.__version__}", flush=True)
    median_ms = timer(args.device)
    if args.device == "cuda":
        linear_shapes, mm_shapes = [(8192, 4096, 4096), (16384, 8192, 8192)], [(4096, 4096, 4096), (8192, 8192, 8192)]
    else:
        linear_shapes, mm_shapes = [(64, 256, 128)], [(64, 96, 256)]
    for shape in linear_shapes:
        compare_linear(args.device, *shape, median_ms)
    for shape in mm_shapes:
        compare_scaled_mm(args.device, *shape, median_ms)


if __name__ == "__main__":
    main()
