#!/usr/bin/env python3
"""Writes a random-weight checkpoint with transformers (save_pretrained: bf16 safetensors,
sharded at --shard-size) for loader benchmarks on the GPU machine.
Usage: python3 tools/bench/make_checkpoint.py --config tools/bench/model_configs/qwen3-8b.json --out /tmp/ckpt
"""
import argparse
import json

import torch
from transformers import AutoConfig, AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--config", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--shard-size", default="2GB")
args = ap.parse_args()
with open(args.config) as f:
    cfg = json.load(f)
config = AutoConfig.for_model(cfg.pop("model_type"), **{k: v for k, v in cfg.items() if k != "architectures"})
with torch.device("cuda"):
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
model.save_pretrained(args.out, max_shard_size=args.shard_size)
print(f"wrote {args.out}")
