#!/usr/bin/env python3
"""Builds a tiny block-scaled FP8 Qwen3 checkpoint in Qwen's layout (Qwen3-8B-FP8) and its
reference outputs with transformers: transformers' own FP8 path, and the dequantized model.

Runs on the GPU machine (Python 3.12, torch 2.11, transformers 5.x; the FP8 path needs a GPU
of compute capability >= 8.9, the H200 is one). Steps:
  1. builds Qwen3ForCausalLM from CONFIG (hidden 256, intermediate 384, head_dim 128, 2 q
     heads / 1 KV head, 2 layers, vocab 512, untied) with random weights (fixed seed, widened
     init as tools/gen_model_fixtures.py does), rounded to bf16;
  2. quantizes every q/k/v/o/gate/up/down_proj weight in 128x128 blocks as transformers'
     FineGrainedFP8 quantizer does: scale = 448 / amax(|w| over the block),
     weight = float8_e4m3fn(clamp(w * scale, ±448)), weight_scale_inv = 1 / scale (float32,
     [ceil(out / 128), ceil(in / 128)]); embeddings, lm_head and norms stay bf16. Writes
     <out>/qwen3-tiny-fp8/{model.safetensors, config.json with Qwen's quantization_config,
     generation_config.json};
  3. reference.safetensors, for prompts of 7, 23 and 50 tokens + 32 greedy steps (the layout
     of tools/gen_model_fixtures.py):
       prompt{i}.ids / .logits / .greedy / .greedy_logits / .greedy_margin
           the DEQUANTIZED model: float32 weights = float(weight) * weight_scale_inv, float32
           math on the CPU, eager attention (what OasisKV's CPU reference must match, 1e-4)
       fp8.prompt{i}.logits / .greedy / .greedy_logits / .greedy_margin
           transformers' FP8 path: the checkpoint loaded on cuda with its quantization_config
           (FP8Linear: e4m3 weights, activations quantized dynamically per 1x128 group, bf16
           elsewhere) — close to, not equal to, the dequantized model;
  4. merges a "qwen3-tiny-fp8" entry into <out>/manifest.json: versions, seed, the FP8
     module class transformers used, the normalized logit error of the FP8 path against the
     dequantized reference per prompt, the greedy steps on which they agree, the smallest
     greedy margins of both.
Usage: python3 tools/gen_fp8_fixtures.py --out tests/fixtures/models
"""
import argparse
import json
import os
import platform
import re
import shutil
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

NAME = "qwen3-tiny-fp8"
GENERATOR = "tools/gen_fp8_fixtures.py"
VOCAB = 512
GREEDY_STEPS = 32
PROMPT_LENGTHS = [7, 23, 50]
BLOCK = (128, 128)
FP8_MAX = 448.0
CONFIG = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=128,
              max_position_embeddings=1024, rope_theta=1000000.0, rms_norm_eps=1e-6,
              tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
QUANTIZATION_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                       "weight_block_size": list(BLOCK), "modules_to_not_convert": ["lm_head"]}
QUANTIZED = re.compile(r"\.(q|k|v|o|gate|up|down)_proj\.weight$")


def widen_weights(model, generator):
    """Random weights with enough spread that greedy choices are far from ties."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # RMSNorm weights: around 1, perturbed
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=generator))
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(torch.randn(p.shape, generator=generator))
            else:
                p.copy_(torch.randn(p.shape, generator=generator) / p.shape[-1] ** 0.5)


def quantize_block_fp8(w):
    """[out, in] float -> (float8_e4m3fn [out, in], float32 scale_inv [ceil(out/B0), ceil(in/B1)])."""
    out_f, in_f = w.shape
    b0, b1 = BLOCK
    so, si = -(-out_f // b0), -(-in_f // b1)
    padded = torch.zeros(so * b0, si * b1, dtype=torch.float32)
    padded[:out_f, :in_f] = w.float()
    blocks = padded.reshape(so, b0, si, b1)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)  # [so, si]
    scale = FP8_MAX / amax
    q = (blocks * scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    q = q.reshape(so * b0, si * b1)[:out_f, :in_f].contiguous()
    return q, (1.0 / scale).to(torch.float32).contiguous()


def dequantize_block_fp8(q, scale_inv):
    b0, b1 = BLOCK
    s = scale_inv.repeat_interleave(b0, dim=0).repeat_interleave(b1, dim=1)
    return q.to(torch.float32) * s[:q.shape[0], :q.shape[1]]


def make_prompts(generator):
    prompts = []
    for n in PROMPT_LENGTHS:
        ids = torch.randint(4, VOCAB, (n,), generator=generator)
        ids[0] = 1  # BOS
        prompts.append(ids)
    return prompts


@torch.no_grad()
def reference_outputs(model, prompts, device, prefix=""):
    tensors = {}
    for i, ids in enumerate(prompts):
        logits = model(input_ids=ids[None].to(device)).logits[0].float().cpu()
        if not prefix:
            tensors[f"prompt{i}.ids"] = ids.to(torch.int64).contiguous()
        tensors[f"{prefix}prompt{i}.logits"] = logits.contiguous()
        seq = ids.clone()
        greedy, greedy_logits, margins = [], [], []
        for _ in range(GREEDY_STEPS):
            last = model(input_ids=seq[None].to(device)).logits[0, -1].float().cpu()
            top2 = torch.topk(last, 2).values
            nxt = int(torch.argmax(last))
            greedy.append(nxt)
            greedy_logits.append(last)
            margins.append(float(top2[0] - top2[1]))
            seq = torch.cat([seq, torch.tensor([nxt])])
        tensors[f"{prefix}prompt{i}.greedy"] = torch.tensor(greedy, dtype=torch.int64)
        tensors[f"{prefix}prompt{i}.greedy_logits"] = torch.stack(greedy_logits).contiguous()
        tensors[f"{prefix}prompt{i}.greedy_margin"] = torch.tensor(margins, dtype=torch.float32)
    return tensors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=20261205)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("transformers' FP8 path needs a CUDA GPU (compute capability >= 8.9)")
    torch.use_deterministic_algorithms(True, warn_only=True)
    gen = torch.Generator().manual_seed(args.seed)
    config = Qwen3Config(**CONFIG)
    model = Qwen3ForCausalLM(config).eval()
    widen_weights(model, gen)
    model = model.to(torch.bfloat16)
    out_dir = os.path.join(args.out, NAME)
    os.makedirs(out_dir, exist_ok=True)

    # 1-2. The bf16 checkpoint (config.json, generation_config.json), then its FP8 weights.
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        bf16 = load_file(os.path.join(tmp, "model.safetensors"))
        for f in ("config.json", "generation_config.json"):
            shutil.copy(os.path.join(tmp, f), os.path.join(out_dir, f))
    fp8, dequantized = {}, {}
    for name, t in bf16.items():
        if QUANTIZED.search(name) and t.dim() == 2:
            q, s = quantize_block_fp8(t)
            fp8[name], fp8[name + "_scale_inv"] = q, s
            dequantized[name] = dequantize_block_fp8(q, s)
        else:
            fp8[name] = t.contiguous()
            dequantized[name] = t.to(torch.float32)
    save_file(fp8, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = QUANTIZATION_CONFIG
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    # 3a. The dequantized model: float32 weights, float32 math on the CPU, eager attention.
    holder = Qwen3ForCausalLM(Qwen3Config(**CONFIG)).to(torch.float32).eval()
    missing, unexpected = holder.load_state_dict(dequantized, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    with tempfile.TemporaryDirectory() as tmp:
        holder.save_pretrained(tmp, safe_serialization=True)
        ref = Qwen3ForCausalLM.from_pretrained(tmp, dtype=torch.float32,
                                               attn_implementation="eager").eval()
    prompts = make_prompts(gen)
    tensors = reference_outputs(ref, prompts, "cpu")

    # 3b. transformers' FP8 path: the checkpoint as written, on cuda. Its block-FP8 matmul
    # comes from the `kernels` package (fetched from the hub); where that is missing (the GPU
    # machine is offline) transformers' own dequantizing load of the same checkpoint
    # (FineGrainedFP8Config(dequantize=True): weight * weight_scale_inv per block, bf16 math on
    # cuda) is the reference instead, and the manifest says which ran.
    fp8_path = "fp8-matmul"
    try:
        fp8_model = Qwen3ForCausalLM.from_pretrained(out_dir, device_map="cuda",
                                                     dtype=torch.bfloat16).eval()
        fp8_class = type(fp8_model.model.layers[0].self_attn.q_proj).__name__
        if "FP8" not in fp8_class.upper():
            raise SystemExit(f"transformers loaded q_proj as {fp8_class}, not an FP8 linear layer")
        with torch.no_grad():
            fp8_model(input_ids=prompts[0][None].to("cuda"))
    except ImportError as e:
        print(f"transformers' FP8 matmul unavailable ({str(e)[:160]}): using its dequantizing load",
              flush=True)
        from transformers import FineGrainedFP8Config
        fp8_path = "dequantize"
        fp8_model = Qwen3ForCausalLM.from_pretrained(
            out_dir, device_map="cuda", dtype=torch.bfloat16,
            quantization_config=FineGrainedFP8Config(dequantize=True)).eval()
        fp8_class = type(fp8_model.model.layers[0].self_attn.q_proj).__name__
    tensors.update(reference_outputs(fp8_model, prompts, "cuda", prefix="fp8."))
    save_file(tensors, os.path.join(out_dir, "reference.safetensors"),
              metadata={"generator": GENERATOR, "transformers": transformers.__version__})

    # 4. The manifest entry.
    errors, agree = [], []
    for i in range(len(prompts)):
        a, b = tensors[f"fp8.prompt{i}.logits"], tensors[f"prompt{i}.logits"]
        errors.append(float((a - b).norm() / b.norm()))
        same = (tensors[f"fp8.prompt{i}.greedy"] == tensors[f"prompt{i}.greedy"]).tolist()
        agree.append(same.index(False) if False in same else len(same))
    manifest_path = os.path.join(args.out, "manifest.json")
    manifest = {"models": {}}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
    manifest["models"][NAME] = {
        "generator": GENERATOR, "transformers": transformers.__version__,
        "torch": torch.__version__, "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(0), "seed": args.seed,
        "params": sum(p.numel() for p in model.parameters()),
        "prompt_lengths": PROMPT_LENGTHS, "weight_block_size": list(BLOCK),
        "fp8_module": fp8_class, "fp8_path": fp8_path,
        "min_greedy_margin": min(float(tensors[f"prompt{i}.greedy_margin"].min())
                                 for i in range(len(prompts))),
        "fp8_min_greedy_margin": min(float(tensors[f"fp8.prompt{i}.greedy_margin"].min())
                                     for i in range(len(prompts))),
        "fp8_vs_dequantized_logit_error": errors,
        "fp8_greedy_agrees_with_dequantized_for_steps": agree}
    print(NAME, json.dumps(manifest["models"][NAME], indent=2), flush=True)
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
