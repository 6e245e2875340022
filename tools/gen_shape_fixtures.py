#!/usr/bin/env python3
"""Builds the tiny checkpoints of unusual shapes the CUDA backend's shape check is verified on
(issue 29): each is either computed exactly (greedy = transformers' greedy) or refused at load.

Runs on the GPU machine (torch + transformers; CPU is enough), from the repository root:
    python3 tools/gen_shape_fixtures.py --out tests/fixtures/shapes
then, in a CUDA build:  ./build/tests/kernels/test_gpu_shapes
Commit tests/fixtures/shapes/ only as this script wrote it.

Fixtures (random weights widened like tools/gen_model_fixtures.py, so greedy steps are not
near-ties; reference.safetensors has the same keys as there: prompt{i}.ids / logits / greedy /
greedy_logits / greedy_margin, float32 math on the saved weights, eager attention):
  llama-hd8     the probe's shape: hidden 64, 8 heads, 4 KV heads, head_dim 8, float32 weights
                (the CUDA backend must refuse it: head_dim below 16)
  llama-hd32    hidden 64, 2 heads, 1 KV head, head_dim 32 (> hidden / heads), float32 weights
  qwen3-gqa6    12 query heads over 2 KV heads (6 per group), head_dim 16, q/k norm
  llama-kv3     6 query heads over 3 KV heads, head_dim 32, llama3 RoPE scaling
"""
import argparse
import json
import os
import platform
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_model_fixtures import (PROMPT_LENGTHS, VOCAB, make_prompts,  # noqa: E402
                                reference_outputs, widen_weights)

COMMON = dict(vocab_size=VOCAB, num_hidden_layers=2, max_position_embeddings=1024,
              rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)

# name: (config class, model class, config kwargs, saved dtype, what the CUDA backend must do)
CONFIGS = {
    "llama-hd8": (LlamaConfig, LlamaForCausalLM, dict(
        COMMON, hidden_size=64, intermediate_size=128, num_attention_heads=8,
        num_key_value_heads=4, head_dim=8, rope_theta=10000.0, tie_word_embeddings=False),
        torch.float32, "refused"),
    "llama-hd32": (LlamaConfig, LlamaForCausalLM, dict(
        COMMON, hidden_size=64, intermediate_size=128, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, rope_theta=10000.0, tie_word_embeddings=False),
        torch.float32, "exact"),
    "qwen3-gqa6": (Qwen3Config, Qwen3ForCausalLM, dict(
        COMMON, hidden_size=96, intermediate_size=192, num_attention_heads=12,
        num_key_value_heads=2, head_dim=16, rope_theta=1000000.0, tie_word_embeddings=True),
        torch.bfloat16, "exact"),
    "llama-kv3": (LlamaConfig, LlamaForCausalLM, dict(
        COMMON, hidden_size=96, intermediate_size=160, num_attention_heads=6,
        num_key_value_heads=3, head_dim=32, rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=64)),
        torch.bfloat16, "exact"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=20270129)
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    summary = {"transformers": transformers.__version__, "torch": torch.__version__,
               "python": platform.python_version(), "seed": args.seed, "models": {}}
    for k, (name, (config_cls, model_cls, kwargs, dtype, expect)) in enumerate(CONFIGS.items()):
        gen = torch.Generator().manual_seed(args.seed + k)
        model = model_cls(config_cls(**kwargs)).eval()
        widen_weights(model, gen)
        # Round to bf16 first so the reference and the bf16 CUDA backend see the same values,
        # then save in `dtype` (float32 checkpoints exercise the loader's conversion).
        model = model.to(torch.bfloat16).to(dtype)
        out_dir = os.path.join(args.out, name)
        os.makedirs(out_dir, exist_ok=True)
        model.save_pretrained(out_dir, safe_serialization=True)
        ref = model_cls.from_pretrained(out_dir, dtype=torch.float32,
                                        attn_implementation="eager").eval()
        prompts = make_prompts(gen)
        tensors = reference_outputs(ref, prompts)
        save_file(tensors, os.path.join(out_dir, "reference.safetensors"),
                  metadata={"generator": "tools/gen_shape_fixtures.py",
                            "transformers": transformers.__version__})
        with open(os.path.join(out_dir, "expect.txt"), "w") as f:
            f.write(expect + "\n")
        min_margin = min(float(tensors[f"prompt{i}.greedy_margin"].min())
                         for i in range(len(prompts)))
        summary["models"][name] = {"params": sum(p.numel() for p in model.parameters()),
                                   "dtype": str(dtype), "cuda": expect,
                                   "prompt_lengths": PROMPT_LENGTHS,
                                   "min_greedy_margin": min_margin}
        print(name, summary["models"][name], flush=True)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
