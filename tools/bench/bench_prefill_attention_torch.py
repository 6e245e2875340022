#!/usr/bin/env python3
"""PyTorch SDPA peer for tools/bench/bench_prefill_attention (run on the GPU machine).

Times torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
enable_gqa=True) in bf16 at the same Qwen3-8B shapes as the C++ benchmark: 32 query heads,
8 KV heads, head_dim 128, one 8192-token prompt and 4 x 2048. Every SDPA backend that accepts
the call is timed (default dispatch, flash, cuDNN, efficient); CUDA events, 3 warm-up calls,
median of --iters (>= 10). FLOPs are counted as in the C++ benchmark:
4 * d * Hq * n(n+1)/2 per prompt.

With --ours PATH the C++ benchmark binary is run first in the same process tree (same
machine, same run) and the ratio ours / PyTorch's best is printed per shape.

    python3 tools/bench/bench_prefill_attention_torch.py [--iters 20] [--ours .bundle/bin/bench_prefill_attention]

Last line: RESULT prefill_attention_torch ...
"""
import argparse
import re
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

HQ, HKV, D = 32, 8, 128
CEILING_TFLOPS = 788.0  # cuBLAS bf16 GEMM on the H200 (DESIGN.md section 5)
SHAPES = [("1x8192", 1, 8192), ("4x2048", 4, 2048)]


def flops(batch, n):
    return 4.0 * D * HQ * batch * n * (n + 1) / 2


def time_ms(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def backends():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    yield "default", None
    for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
        if hasattr(SDPBackend, name):
            yield name.lower(), (sdpa_kernel, getattr(SDPBackend, name))


def run_ours(path):
    """Runs the C++ benchmark; returns {shape: median ms of its best config}."""
    out = subprocess.run([path], capture_output=True, text=True)
    sys.stdout.write(out.stdout)
    sys.stdout.write(out.stderr)
    best = {}
    for line in out.stdout.splitlines():
        m = re.match(r"^(\dx\d+)\s+(\S+)\s+([\d.]+)\s", line)
        if m:
            shape, ms = m.group(1), float(m.group(3))
            best[shape] = min(ms, best.get(shape, float("inf")))
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--ours", help="path of the bench_prefill_attention binary to run for the ratio")
    args = ap.parse_args()
    iters = max(10, args.iters)

    ours = run_ours(args.ours) if args.ours else {}
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; SDPA is_causal=True enable_gqa=True bf16, "
          f"Hq {HQ} Hkv {HKV} d {D}; median of {iters}")
    print(f"{'shape':8} {'backend':20} {'median ms':>10} {'TFLOP/s':>9} {'of ceil':>8}")
    best = {}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape, batch, n in SHAPES:
        q = torch.randn(batch, HQ, n, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(batch, HKV, n, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(batch, HKV, n, D, device="cuda", dtype=torch.bfloat16, generator=gen)

        def call():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        for name, ctx in backends():
            try:
                if ctx is None:
                    ms = time_ms(call, iters)
                else:
                    with ctx[0](ctx[1]):
                        ms = time_ms(call, iters)
            except Exception as e:  # a backend that rejects these inputs
                print(f"{shape:8} {name:20} unavailable: {str(e).splitlines()[0][:80]}")
                continue
            tf = flops(batch, n) / (ms * 1e-3) / 1e12
            print(f"{shape:8} {name:20} {ms:10.3f} {tf:9.1f} {100 * tf / CEILING_TFLOPS:7.1f}%")
            if shape not in best or ms < best[shape][1]:
                best[shape] = (name, ms, tf)
        del q, k, v
        torch.cuda.empty_cache()

    parts = []
    for shape, _, _ in SHAPES:
        if shape not in best:
            continue
        name, ms, tf = best[shape]
        part = f"{shape} torch {ms:.3f} ms {tf:.1f} TFLOP/s ({name})"
        if shape in ours:
            part += f", ours {ours[shape]:.3f} ms, ours/torch speed {ms / ours[shape]:.2f}x"
        parts.append(part)
    print("RESULT prefill_attention_torch " + "; ".join(parts))


if __name__ == "__main__":
    main()
