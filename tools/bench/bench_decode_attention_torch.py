#!/usr/bin/env python3
"""PyTorch peer of bench_decode_attention: scaled_dot_product_attention(q, k, v, enable_gqa=True)
on the same decode shapes (GQA 32/8, head_dim 128, bf16), with contiguous KV [B, Hkv, L, D].

Same method as the C++ benchmark: warm-up, then >= 30 timed calls, each after an L2 flush,
timed with CUDA events; median reported as GB/s over the K+V bytes (B × Hkv × L × D × 2 × 2),
next to the read-only streaming ceiling (4.56 TB/s, DESIGN.md §5). q_len 2 runs without a
mask (PyTorch's is_causal aligns top-left, not like decode); it reads the same bytes.
The line before the last, PEER_GBS, lists the cases' GB/s in order, comma-separated: pass it to
bench_decode_attention --torch-gbs for its ratios (tools/gpu_suite.sh does). The last line starts
with RESULT.

    python3 tools/bench/bench_decode_attention_torch.py [--runs N]
"""
import argparse
import statistics

import torch
import torch.nn.functional as F

CEILING_GBS = 4560.0
HQ, HKV, D = 32, 8, 128
CASES = [
    ("batch 32 x 16K, q_len 1", 32, 16384, 1),
    ("batch 32 x 16K, q_len 2", 32, 16384, 2),
    ("batch 64 x 4K, q_len 1", 64, 4096, 1),
    ("batch 1 x 16K, q_len 1", 1, 16384, 1),
    ("batch 48 x 2064 (sparse set), q_len 2", 48, 2064, 2),
]


def time_ms(fn, runs, flush):
    for _ in range(5):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(runs):
        flush.fill_(i & 0xFF)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    runs = max(20, args.runs)
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    print(f"PyTorch SDPA decode: GQA {HQ}/{HKV}, head_dim {D}, bf16, contiguous KV; median of {runs} runs, L2 flushed")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    print(f"\n{'case':<40} {'median us':>10} {'KV GB':>9} {'GB/s':>10} {'ceiling':>9} {'ratio':>8}")
    main_gbs = None
    all_gbs = []
    for name, batch, ctx, q_len in CASES:
        q = torch.randn(batch, HQ, q_len, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(batch, HKV, ctx, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(batch, HKV, ctx, D, device=dev, dtype=torch.bfloat16)
        with torch.no_grad():
            ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), runs, flush)
        kv_gb = batch * HKV * ctx * D * 2 * 2 / 1e9
        gbs = kv_gb / (ms * 1e-3)
        print(f"{name:<40} {ms * 1e3:10.1f} {kv_gb:9.3f} {gbs:10.0f} {CEILING_GBS:9.0f} {gbs / CEILING_GBS:8.3f}")
        all_gbs.append(gbs)
        if main_gbs is None:
            main_gbs = gbs
        del q, k, v
        torch.cuda.empty_cache()
    print("\nPEER_GBS " + ",".join(f"{g:.1f}" for g in all_gbs))
    print(f"RESULT torch_sdpa_decode b32x16K GQA32/8 d128: {main_gbs:.0f} GB/s of KV, ceiling {CEILING_GBS:.0f} GB/s, "
          f"ratio {main_gbs / CEILING_GBS:.3f}")


if __name__ == "__main__":
    main()
