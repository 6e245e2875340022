#!/usr/bin/env python3
"""The peer for bench_decode: transformers on the same GPU, same shapes, same run.

Builds the model from a config.json with random bf16 weights directly on the GPU (SDPA
attention), then measures
  - prefill of one prompt of --prefill tokens (logits of the last token only): tokens/s;
  - batch-1 decode with the KV cache (eager, as `generate` runs it): ms per token.
Each is the median of several runs after a warm-up, timed with CUDA events.
Usage: python3 tools/bench/bench_transformers.py --config tools/bench/model_configs/qwen3-8b.json
"""
import argparse
import json
import statistics

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


def timed(fn, runs, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="tools/bench/model_configs/qwen3-8b.json")
    ap.add_argument("--prefill", type=int, default=8192)
    ap.add_argument("--decode-steps", type=int, default=20)
    args = ap.parse_args()
    with open(args.config) as f:
        cfg = json.load(f)
    config = AutoConfig.for_model(cfg.pop("model_type"), **{k: v for k, v in cfg.items() if k != "architectures"})
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    vocab = config.vocab_size
    ids = torch.randint(0, vocab, (1, args.prefill), device="cuda")
    prefill_ms = timed(lambda: model(input_ids=ids, logits_to_keep=1), runs=5, warmup=2)

    def decode():
        cache = model(input_ids=ids[:, :128], use_cache=True).past_key_values
        nxt = ids[:, :1]
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.decode_steps):
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
        stop.record()
        torch.cuda.synchronize()
        return start.elapsed_time(stop) / args.decode_steps

    decode()
    tpot = statistics.median(decode() for _ in range(3))
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"prefill {args.prefill} tokens: {prefill_ms:.2f} ms, {args.prefill / prefill_ms * 1e3:.0f} tokens/s")
    print(f"decode batch 1 (context 128): {tpot:.2f} ms/token, {1e3 / tpot:.1f} tokens/s")
    model_tag = "" if args.config == ap.get_default("config") else f" [{args.config.rsplit('/', 1)[-1]}]"
    print(f"RESULT transformers{model_tag} prefill n={args.prefill}: {args.prefill / prefill_ms * 1e3:.0f} tokens/s; "
          f"decode b=1: {tpot:.2f} ms/token")


if __name__ == "__main__":
    main()
