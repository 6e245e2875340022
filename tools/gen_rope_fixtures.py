#!/usr/bin/env python3
"""Builds tiny checkpoints with RoPE scaling (yarn, linear, dynamic) and their reference outputs.

Runs on the GPU machine (Python 3.12, torch 2.11, transformers 5.17); CPU is enough. From the
repository root:
    python3 tools/gen_rope_fixtures.py --out tests/fixtures/rope
Commit tests/fixtures/rope/ only as this script wrote it. Consumers: test_rope_models
(tests/models/test_rope_models.cpp, CPU; registered when the fixtures exist at configure time)
and test_gpu_rope (tests/kernels/test_cuda_rope.cpp, CUDA backend).

Every model has a short original context (64 positions) and prompts of 7, 50 and 100 tokens
followed by 32 greedy steps, so most positions lie past the original context. Weights are
random, widened like tools/gen_model_fixtures.py (greedy steps are not near-ties), rounded to
bf16 and saved with save_pretrained; reference.safetensors has the keys of that script
(prompt{i}.ids / logits / greedy / greedy_logits / greedy_margin), float32 math on the saved
weights, eager attention, the whole sequence recomputed at every greedy step.

  qwen3-yarn          Qwen3 (q/k norm), yarn factor 4 over 64 positions, max_position_embeddings
                      256, rope_theta 1e6; config.json rewritten in the legacy form Qwen3's
                      checkpoints use (top-level rope_theta + rope_scaling), which transformers
                      reads back for the reference
  llama-yarn-options  Llama, yarn factor 4 over 64 with beta_fast 16, beta_slow 2, mscale 1,
                      mscale_all_dim 0.5 (attention scaling 1.0648) and truncate false, in
                      transformers 5's rope_parameters form, rope_theta 1e4
  llama-linear        Llama, linear factor 4, max_position_embeddings 64 (served: 256)
  qwen3-dynamic       Qwen3, dynamic factor 4, max_position_embeddings 64 (served: 256). The
                      reference follows vLLM (DynamicNTKScalingRotaryEmbedding: one NTK base for
                      every position, computed at max_position_embeddings x factor, so that
                      cached keys stay valid): it is the same weights run by transformers with
                      the default RoPE and rope_theta' = theta * (f*f - f + 1) ** (d / (d - 2)).
                      transformers' own dynamic RoPE recomputes the base from the current length
                      (the original theta up to 64 positions); manifest.json records where its
                      greedy tokens part from the reference ("transformers_dynamic").
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
from gen_model_fixtures import VOCAB, reference_outputs, widen_weights  # noqa: E402

PROMPT_LENGTHS = [7, 50, 100]
ORIGINAL = 64

COMMON = dict(vocab_size=VOCAB, num_hidden_layers=2, rms_norm_eps=1e-6, bos_token_id=1,
              eos_token_id=2)

# name: (config class, model class, config kwargs)
CONFIGS = {
    "qwen3-yarn": (Qwen3Config, Qwen3ForCausalLM, dict(
        COMMON, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=4 * ORIGINAL,
        rope_theta=1000000.0, tie_word_embeddings=True,
        rope_scaling=dict(rope_type="yarn", factor=4.0,
                          original_max_position_embeddings=ORIGINAL))),
    "llama-yarn-options": (LlamaConfig, LlamaForCausalLM, dict(
        COMMON, hidden_size=128, intermediate_size=192, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=4 * ORIGINAL,
        rope_theta=10000.0, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=ORIGINAL,
                          beta_fast=16.0, beta_slow=2.0, mscale=1.0, mscale_all_dim=0.5,
                          truncate=False))),
    "llama-linear": (LlamaConfig, LlamaForCausalLM, dict(
        COMMON, hidden_size=96, intermediate_size=160, num_attention_heads=6,
        num_key_value_heads=3, head_dim=16, max_position_embeddings=ORIGINAL,
        rope_theta=10000.0, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="linear", factor=4.0))),
    "qwen3-dynamic": (Qwen3Config, Qwen3ForCausalLM, dict(
        COMMON, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=ORIGINAL,
        rope_theta=10000.0, tie_word_embeddings=True,
        rope_scaling=dict(rope_type="dynamic", factor=4.0))),
}


def make_prompts(generator):
    prompts = []
    for n in PROMPT_LENGTHS:
        ids = torch.randint(4, VOCAB, (n,), generator=generator)
        ids[0] = 1  # BOS
        prompts.append(ids)
    return prompts


def to_legacy_rope(out_dir):
    """config.json with top-level rope_theta + rope_scaling (Qwen3's published form)."""
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    params = dict(config.pop("rope_parameters"))
    config["rope_theta"] = params.pop("rope_theta")
    config["rope_scaling"] = params
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def vllm_dynamic_theta(theta, factor, head_dim):
    """vLLM's DynamicNTKScalingRotaryEmbedding base: the NTK base at max_len = M * factor."""
    return theta * (factor * factor - (factor - 1)) ** (head_dim / (head_dim - 2))


def load_reference(model_cls, config_cls, out_dir, name, kwargs):
    if name != "qwen3-dynamic":
        return model_cls.from_pretrained(out_dir, dtype=torch.float32,
                                         attn_implementation="eager").eval()
    config = config_cls.from_pretrained(out_dir)
    theta = vllm_dynamic_theta(kwargs["rope_theta"], kwargs["rope_scaling"]["factor"],
                               kwargs["head_dim"])
    config.rope_parameters = {"rope_type": "default", "rope_theta": theta}
    return model_cls.from_pretrained(out_dir, config=config, dtype=torch.float32,
                                     attn_implementation="eager").eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=20270214)
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    summary = {"generator": "tools/gen_rope_fixtures.py", "transformers": transformers.__version__,
               "torch": torch.__version__, "python": platform.python_version(),
               "seed": args.seed, "models": {}}
    for k, (name, (config_cls, model_cls, kwargs)) in enumerate(CONFIGS.items()):
        gen = torch.Generator().manual_seed(args.seed + k)
        model = model_cls(config_cls(**kwargs)).eval()
        widen_weights(model, gen)
        model = model.to(torch.bfloat16)
        out_dir = os.path.join(args.out, name)
        os.makedirs(out_dir, exist_ok=True)
        model.save_pretrained(out_dir, safe_serialization=True)
        if name == "qwen3-yarn":
            to_legacy_rope(out_dir)
        ref = load_reference(model_cls, config_cls, out_dir, name, kwargs)
        prompts = make_prompts(gen)
        tensors = reference_outputs(ref, prompts)
        save_file(tensors, os.path.join(out_dir, "reference.safetensors"),
                  metadata={"generator": "tools/gen_rope_fixtures.py",
                            "transformers": transformers.__version__})
        emb = ref.model.rotary_emb
        entry = {"params": sum(p.numel() for p in model.parameters()),
                 "rope_parameters": {key: value for key, value in ref.config.rope_parameters.items()},
                 "attention_scaling": float(emb.attention_scaling),
                 "inv_freq": [float(x) for x in emb.inv_freq],
                 "prompt_lengths": PROMPT_LENGTHS,
                 "min_greedy_margin": min(float(tensors[f"prompt{i}.greedy_margin"].min())
                                          for i in range(len(prompts)))}
        if name == "qwen3-dynamic":  # where transformers' per-length dynamic RoPE departs
            native = model_cls.from_pretrained(out_dir, dtype=torch.float32,
                                               attn_implementation="eager").eval()
            native_tensors = reference_outputs(native, prompts)
            firsts = []
            for i in range(len(prompts)):
                a = tensors[f"prompt{i}.greedy"].tolist()
                b = native_tensors[f"prompt{i}.greedy"].tolist()
                firsts.append(next((s for s in range(len(a)) if a[s] != b[s]), None))
            entry["transformers_dynamic"] = {
                "first_greedy_difference_per_prompt": firsts,
                "prompt0_logits_max_abs_difference": float(
                    (tensors["prompt0.logits"] - native_tensors["prompt0.logits"]).abs().max())}
        summary["models"][name] = entry
        print(name, {key: entry[key] for key in entry if key != "inv_freq"}, flush=True)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
