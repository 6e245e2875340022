#!/usr/bin/env python3
"""Builds the tiny Qwen3-MoE fixtures and their reference outputs with transformers.

Runs on the GPU machine (Python 3.12, torch 2.11, transformers 5.17); CPU is enough. The
companion of tools/gen_model_fixtures.py (same steps, same reference.safetensors layout):
for each tiny Qwen3MoeConfig below it
  1. builds Qwen3MoeForCausalLM from the config with random weights (fixed seed; widened
     init so logits and router probabilities are well spread; norm weights perturbed),
  2. rounds the weights to bf16 and saves them with save_pretrained (model.safetensors or
     shards + model.safetensors.index.json, config.json) into <out>/<name>/,
  3. loads those exact bf16 weights into a float32 model (eager attention) and writes
     <out>/<name>/reference.safetensors (experts run by the eager per-expert loop) holding,
     for each prompt i:
       prompt{i}.ids            int64 [n]        the prompt
       prompt{i}.logits         f32   [n, vocab] logits at every prompt position
       prompt{i}.greedy         int64 [32]       the 32-token greedy continuation
       prompt{i}.greedy_logits  f32   [32, vocab] logits that chose each greedy token
       prompt{i}.greedy_margin  f32   [32]       top-1 minus top-2 logit at each step
  4. records in manifest.json (merged: other models' entries are kept) the smallest greedy
     margin and the smallest router gap (k-th minus (k+1)-th routing probability over
     every token and MoE layer of the prompts: how far routing is from a tie).
Two fixtures exercise the checkpoint layouts: qwen3-moe-tiny-many is saved in shards
(max_shard_size 200KB), and qwen3-moe-tiny-raw is rewritten after the reference was
computed into transformers 5's fused expert layout (mlp.experts.gate_up_proj [E, 2I, H],
mlp.experts.down_proj [E, H, I]); the others keep what save_pretrained wrote.
Usage: python3 tools/gen_moe_fixtures.py --out tests/fixtures/models
"""
import argparse
import glob
import json
import os
import platform
import re

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

VOCAB = 512
GREEDY_STEPS = 32
PROMPT_LENGTHS = [7, 23, 50]  # crosses one and several 16-token blocks
GENERATOR = "tools/gen_moe_fixtures.py"

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=1024, rope_theta=1000000.0, rms_norm_eps=1e-6,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
            decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.0)

# name -> (config overrides, layout on disk: "saved" | "sharded" | "fused")
CONFIGS = {
    # (a) top-2 of 8 experts, renormalised routing weights, every layer MoE.
    "qwen3-moe-tiny": (dict(num_experts=8, num_experts_per_tok=2, norm_topk_prob=True), "saved"),
    # (b) norm_topk_prob=false: the k softmax probabilities as they are; fused layout on disk.
    "qwen3-moe-tiny-raw": (dict(num_experts=8, num_experts_per_tok=2, norm_topk_prob=False),
                           "fused"),
    # (c) mlp_only_layers: layer 1 keeps a dense MLP of intermediate_size; sparse step 1.
    "qwen3-moe-tiny-mixed": (dict(num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                                  mlp_only_layers=[1], decoder_sparse_step=1), "saved"),
    # (d) k=1 (renormalised weight 1), untied head, GQA 4/1.
    "qwen3-moe-tiny-top1": (dict(num_experts=8, num_experts_per_tok=1, norm_topk_prob=True,
                                 num_key_value_heads=1), "saved"),
    # (e) many experts: 32, k=4, tied embeddings; saved in shards.
    "qwen3-moe-tiny-many": (dict(num_experts=32, num_experts_per_tok=4, norm_topk_prob=True,
                                 tie_word_embeddings=True), "sharded"),
}


def widen_weights(model, generator):
    """Random weights with enough spread that logits and routing are far from ties."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # RMSNorm weights: around 1, perturbed
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=generator))
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(torch.randn(p.shape, generator=generator))
            elif name.endswith("mlp.gate.weight"):  # router [E, H]: logits of spread ~3
                p.copy_(3.0 * torch.randn(p.shape, generator=generator) / p.shape[-1] ** 0.5)
            else:  # 2-D [out, in], or transformers 5's fused 3-D experts [E, out, in]
                p.copy_(torch.randn(p.shape, generator=generator) / p.shape[-1] ** 0.5)


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


@torch.no_grad()
def min_router_gap(model, prompts, k, num_experts):
    """Smallest (k-th - (k+1)-th) routing probability over the prompts' greedy sequences."""
    if k >= num_experts:
        return None
    try:
        gaps = []
        for ids in prompts:
            out = model(input_ids=ids[None], output_router_logits=True)
            for layer_logits in out.router_logits or ():
                p = torch.softmax(layer_logits.float().reshape(-1, num_experts), dim=-1)
                top = torch.topk(p, k + 1, dim=-1).values
                gaps.append(float((top[:, k - 1] - top[:, k]).min()))
        return min(gaps) if gaps else None
    except Exception as e:  # informational only
        print("router gap not recorded:", e, flush=True)
        return None


def rewrite_fused(out_dir, num_experts):
    """Rewrites the saved per-expert tensors into transformers 5's fused expert layout."""
    files = sorted(glob.glob(os.path.join(out_dir, "*.safetensors")))
    files = [f for f in files if not f.endswith("reference.safetensors")]
    assert len(files) == 1, files
    tensors = load_file(files[0])
    if any(name.endswith("mlp.experts.gate_up_proj") for name in tensors):
        return  # save_pretrained wrote the fused layout already
    pattern = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
    experts = {}
    fused = {}
    for name, t in tensors.items():
        m = pattern.match(name)
        if m:
            experts.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = t
        else:
            fused[name] = t
    for prefix, parts in experts.items():
        gate_up = [torch.cat([parts[(e, "gate_proj")], parts[(e, "up_proj")]], dim=0)
                   for e in range(num_experts)]
        fused[prefix + ".gate_up_proj"] = torch.stack(gate_up).contiguous()
        fused[prefix + ".down_proj"] = torch.stack(
            [parts[(e, "down_proj")] for e in range(num_experts)]).contiguous()
    save_file(fused, files[0], metadata={"format": "pt"})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=20261202)
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    manifest_path = os.path.join(args.out, "manifest.json")
    manifest = {"models": {}}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
    for k, (name, (overrides, layout)) in enumerate(CONFIGS.items()):
        gen = torch.Generator().manual_seed(args.seed + k)
        config = Qwen3MoeConfig(**{**BASE, **overrides})
        model = Qwen3MoeForCausalLM(config).eval()
        widen_weights(model, gen)
        model = model.to(torch.bfloat16)
        out_dir = os.path.join(args.out, name)
        os.makedirs(out_dir, exist_ok=True)
        for stale in glob.glob(os.path.join(out_dir, "model*.safetensors*")):
            os.remove(stale)
        if layout == "sharded":
            model.save_pretrained(out_dir, safe_serialization=True, max_shard_size="200KB")
        else:
            model.save_pretrained(out_dir, safe_serialization=True)
        # The reference: the same bf16 weights, float32 math, eager attention.
        ref = Qwen3MoeForCausalLM.from_pretrained(out_dir, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
        # transformers 5 picks a fused experts kernel (grouped_mm, ...) by default; the plain
        # per-expert loop is the reference (deterministic, float32 throughout).
        if hasattr(ref, "set_experts_implementation"):
            ref.set_experts_implementation("eager")
        prompts = make_prompts(gen)
        tensors = reference_outputs(ref, prompts)
        save_file(tensors, os.path.join(out_dir, "reference.safetensors"),
                  metadata={"generator": GENERATOR, "transformers": transformers.__version__})
        if layout == "fused":
            rewrite_fused(out_dir, config.num_experts)
        shards = sorted(os.path.basename(f) for f in glob.glob(os.path.join(out_dir, "model*.safetensors")))
        min_margin = min(float(tensors[f"prompt{i}.greedy_margin"].min())
                         for i in range(len(prompts)))
        manifest["models"][name] = {
            "generator": GENERATOR, "transformers": transformers.__version__,
            "torch": torch.__version__, "python": platform.python_version(),
            "seed": args.seed + k, "params": sum(p.numel() for p in model.parameters()),
            "prompt_lengths": PROMPT_LENGTHS, "min_greedy_margin": min_margin,
            "min_router_gap": min_router_gap(ref, prompts, config.num_experts_per_tok,
                                             config.num_experts),
            "layout": layout, "files": shards}
        print(name, manifest["models"][name], flush=True)
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
