#!/usr/bin/env python3
"""Builds the tiny model fixtures and their reference outputs with transformers.

Runs on the GPU machine (Python 3.12, torch 2.11, transformers 5.17); CPU is enough.
For each tiny configuration below it:
  1. builds the model from the config with random weights (fixed seed, widened init so
     logits are well spread and greedy choices are not near-ties; norm weights perturbed
     so a missing norm is caught),
  2. rounds the weights to bf16 and saves them with save_pretrained (model.safetensors +
     config.json) into <out>/<name>/,
  3. loads those exact bf16 weights into a float32 model (eager attention) and writes
     <out>/<name>/reference.safetensors holding, for each prompt i:
       prompt{i}.ids            int64 [n]        the prompt
       prompt{i}.logits         f32   [n, vocab] logits at every prompt position
       prompt{i}.greedy         int64 [32]       the 32-token greedy continuation
       prompt{i}.greedy_logits  f32   [32, vocab] logits that chose each greedy token
       prompt{i}.greedy_margin  f32   [32]       top-1 minus top-2 logit at each step
Usage: python3 tools/gen_model_fixtures.py --out tests/fixtures/models
"""
import argparse
import json
import os
import platform

import torch
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

VOCAB = 512
GREEDY_STEPS = 32
PROMPT_LENGTHS = [7, 23, 50]  # crosses one and several 16-token blocks

CONFIGS = {
    # Qwen3, GQA 4/2, explicit head_dim (32) != hidden/heads (16), tied embeddings.
    "qwen3-tiny": (Qwen3Config, Qwen3ForCausalLM, dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2)),
    # Qwen3, multi-query (1 KV head), untied embeddings.
    "qwen3-tiny-untied": (Qwen3Config, Qwen3ForCausalLM, dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=1024,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2)),
    # Llama 3.x with llama3 rope scaling (original 64 positions so it bites), GQA 4/2, untied.
    "llama-tiny-rope-scaling": (LlamaConfig, LlamaForCausalLM, dict(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        bos_token_id=1, eos_token_id=[2, 3])),
    # Llama, full multi-head attention, explicit head_dim (24) != hidden/heads (16), tied.
    "llama-tiny-tied": (LlamaConfig, LlamaForCausalLM, dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, head_dim=24, max_position_embeddings=512,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2)),
}


def widen_weights(model, generator):
    """Random weights with enough spread that logits are far from ties."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # RMSNorm weights: around 1, perturbed
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=generator))
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(torch.randn(p.shape, generator=generator))
            else:
                fan_in = p.shape[1]
                p.copy_(torch.randn(p.shape, generator=generator) / fan_in ** 0.5)


def make_prompts(generator):
    prompts = []
    for n in PROMPT_LENGTHS:
        ids = torch.randint(4, VOCAB, (n,), generator=generator)
        ids[0] = 1  # BOS
        prompts.append(ids)
    return prompts


@torch.no_grad()
def reference_outputs(model, prompts):
    tensors = {}
    for i, ids in enumerate(prompts):
        logits = model(input_ids=ids[None]).logits[0].float()
        tensors[f"prompt{i}.ids"] = ids.to(torch.int64).contiguous()
        tensors[f"prompt{i}.logits"] = logits.contiguous()
        seq = ids.clone()
        greedy, greedy_logits, margins = [], [], []
        for _ in range(GREEDY_STEPS):
            last = model(input_ids=seq[None]).logits[0, -1].float()
            top2 = torch.topk(last, 2).values
            nxt = int(torch.argmax(last))
            greedy.append(nxt)
            greedy_logits.append(last)
            margins.append(float(top2[0] - top2[1]))
            seq = torch.cat([seq, torch.tensor([nxt])])
        tensors[f"prompt{i}.greedy"] = torch.tensor(greedy, dtype=torch.int64)
        tensors[f"prompt{i}.greedy_logits"] = torch.stack(greedy_logits).contiguous()
        tensors[f"prompt{i}.greedy_margin"] = torch.tensor(margins, dtype=torch.float32)
    return tensors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=20261129)
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    summary = {"transformers": transformers.__version__, "torch": torch.__version__,
               "python": platform.python_version(), "seed": args.seed, "models": {}}
    for k, (name, (config_cls, model_cls, kwargs)) in enumerate(CONFIGS.items()):
        gen = torch.Generator().manual_seed(args.seed + k)
        config = config_cls(**kwargs)
        model = model_cls(config).eval()
        widen_weights(model, gen)
        model = model.to(torch.bfloat16)
        out_dir = os.path.join(args.out, name)
        os.makedirs(out_dir, exist_ok=True)
        model.save_pretrained(out_dir, safe_serialization=True)
        # The reference: the same bf16 weights, float32 math, eager attention.
        ref = model_cls.from_pretrained(out_dir, dtype=torch.float32,
                                        attn_implementation="eager").eval()
        prompts = make_prompts(gen)
        tensors = reference_outputs(ref, prompts)
        save_file(tensors, os.path.join(out_dir, "reference.safetensors"),
                  metadata={"generator": "tools/gen_model_fixtures.py",
                            "transformers": transformers.__version__})
        min_margin = min(float(tensors[f"prompt{i}.greedy_margin"].min())
                         for i in range(len(prompts)))
        summary["models"][name] = {"params": sum(p.numel() for p in model.parameters()),
                                   "prompt_lengths": PROMPT_LENGTHS,
                                   "min_greedy_margin": min_margin}
        print(name, summary["models"][name], flush=True)
    # Keep the entries other generators own (tools/gen_moe_fixtures.py's MoE models).
    manifest_path = os.path.join(args.out, "manifest.json")
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            for name, entry in json.load(f).get("models", {}).items():
                if entry.get("generator") not in (None, "tools/gen_model_fixtures.py"):
                    summary["models"].setdefault(name, entry)
    with open(manifest_path, "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
