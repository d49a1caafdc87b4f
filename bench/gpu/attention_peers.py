#!/usr/bin/env python3
"""Peer for bench/gpu/attention_fp8.cu: PyTorch scaled_dot_product_attention in bf16 on the same GPU
and shapes (16384 tokens as a batch of equal sequences of 2k..16k, 16 heads of 128, causal and
full), forward and forward + backward, in TFLOPS counted as FlashAttention does (forward
4 * tokens * L * heads * head_dim, halved for causal; forward + backward 3.5x that).

Prints OCTET_RESULT|bench|metric|value|unit|note lines. Runs the default SDPA dispatch and, where
this PyTorch has them, the flash and cuDNN backends forced. Needs torch with CUDA; without a GPU it
prints a note and exits 0.
"""
import sys
import time


def result(bench, metric, value, unit, note=""):
    print(f"OCTET_RESULT|{bench}|{metric}|{value:.4g}|{unit}|{note}", flush=True)


def main():
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001
        print(f"attention_peers: torch unavailable ({e}); skipped")
        return 0
    if not torch.cuda.is_available():
        print("attention_peers: no CUDA device; skipped")
        return 0
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    total, H, D = 16384, 16, 128
    dev = torch.device("cuda")

    backends = [("default", None)]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends.append(("flash", SDPBackend.FLASH_ATTENTION))
        if hasattr(SDPBackend, "CUDNN_ATTENTION"):
            backends.append(("cudnn", SDPBackend.CUDNN_ATTENTION))
    except Exception:  # noqa: BLE001
        sdpa_kernel = None

    def timed(fn, budget_s=0.5):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        once = time.perf_counter() - t0
        reps = max(3, min(20, int(budget_s / max(once, 1e-4))))
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        times.sort()
        return times[len(times) // 2]

    start = time.time()
    for L in (2048, 4096, 8192, 16384):
        B = total // L
        q = torch.randn(B, H, L, D, device=dev, dtype=torch.bfloat16) * 1.5
        k = torch.randn(B, H, L, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(B, H, L, D, device=dev, dtype=torch.bfloat16)
        g = torch.randn(B, H, L, D, device=dev, dtype=torch.bfloat16)
        qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
        for causal in (False, True):
            tag = f"L{L}_{'causal' if causal else 'full'}"
            fwd_flops = 4.0 * total * L * H * D * (0.5 if causal else 1.0)
            for name, backend in backends:
                if time.time() - start > 90:
                    print("attention_peers: time budget reached; stopping", flush=True)
                    return 0

                def fwd():
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                def fwdbwd():
                    out = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
                    out.backward(g)

                try:
                    if backend is None:
                        t_f, t_fb = timed(fwd), timed(fwdbwd)
                    else:
                        with sdpa_kernel([backend]):
                            t_f, t_fb = timed(fwd), timed(fwdbwd)
                except Exception as e:  # noqa: BLE001 (a backend this build or GPU lacks)
                    print(f"attention_peers: {name} {tag}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                    continue
                result(f"attention_sdpa_bf16_{name}_fwd_{tag}", "tflops", fwd_flops / (t_f * 1e9), "TFLOPS", f"torch {torch.__version__}")
                result(f"attention_sdpa_bf16_{name}_fwdbwd_{tag}", "tflops", 3.5 * fwd_flops / (t_fb * 1e9), "TFLOPS", "")
        del q, k, v, g, qr, kr, vr
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
