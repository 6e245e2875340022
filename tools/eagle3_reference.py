#!/usr/bin/env python3
"""Reference EAGLE-3 draft heads for the tiny fixture targets (docs/eagle3.md).

Our own plain-PyTorch implementation of the EAGLE-3 head forward (DESIGN.md §3); no
transformers EAGLE class is used. transformers only runs the target model. CPU is enough.

For each entry of HEADS it:
  1. loads the target tests/fixtures/models/<name> (bf16 weights, computed in float32,
     eager attention) with transformers,
  2. draws a random head (fixed seed; matrices normal(0, 0.08), norm weights 1 + N(0, 0.1),
     all rounded to bf16; d2t from a random subset of the target vocabulary when the draft
     vocabulary is smaller), and writes it to <out>/<name>/ as model.safetensors (bf16
     matrices, int64 d2t, bool t2d; no embed_tokens: the target's embedding is used) and
     config.json (LlamaForCausalLMEagle3),
  3. for each prompt of the target's reference.safetensors, captures the residual stream
     ENTERING the aux target layers (forward pre-hooks; id L = the stream leaving the last
     layer, before the final norm), runs the head over rows p = 0 .. n-2 (target features at
     position p, embedding of token p+1, position p, causal over its own rows) and writes
     <out>/<name>/reference.safetensors:
       prompt{i}.ids           int64 [n]
       prompt{i}.aux           f32   [3, n, target_hidden]  the captured streams
       prompt{i}.draft_logits  f32   [n-1, draft_vocab]
       prompt{i}.draft_tokens  int64 [n-1]   argmax draft id mapped to a target id via d2t
       prompt{i}.draft_margins f32   [n-1]   top-1 minus top-2 draft logit
  4. writes <out>/manifest.json (versions, seed, aux ids, smallest margins).

Usage (repository root, on the GPU machine's Python with torch + transformers + safetensors):
    python3 tools/eagle3_reference.py --targets tests/fixtures/models --out tests/fixtures/eagle3
"""
import argparse
import json
import math
import os
import platform

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

SEED = 20261130
MATRIX_STD = 0.08

# name -> head settings. aux None = the default (2, L // 2, L - 3).
HEADS = {
    # 3-layer Qwen3 target: default aux ids (2, 1, 0); draft vocab 256 of 512 (non-trivial d2t).
    "qwen3-tiny": dict(aux=None, draft_vocab=256, intermediate=96),
    # 2-layer Llama target with llama3 RoPE scaling: explicit ids; 2 = L is the stream leaving
    # the last layer. Full draft vocabulary (d2t = 0).
    "llama-tiny-rope-scaling": dict(aux=[0, 1, 2], draft_vocab=512, intermediate=160),
}


def inv_freq_for(cfg):
    """RoPE inverse frequencies exactly as transformers computes them (default, llama3)."""
    dim = cfg["head_dim"]
    params = cfg.get("rope_parameters") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    scaling = params if "rope_parameters" in cfg else (cfg.get("rope_scaling") or {})
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rtype = scaling.get("rope_type", scaling.get("type", "default"))
    if rtype in (None, "default"):
        return inv
    assert rtype == "llama3", rtype
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    inv_l = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, inv_l)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def head_forward(cfg, w, embed, aux, tokens):
    """The EAGLE-3 head over T rows of one sequence at positions 0..T-1.

    aux: [3, >=T, target_hidden] residual streams; tokens: [T] ids embedded at each row.
    Returns draft logits [T, draft_vocab] (float32).
    """
    T = tokens.shape[0]
    H, D = cfg["hidden_size"], cfg["head_dim"]
    Hq, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps = cfg["rms_norm_eps"]
    cat = torch.cat([aux[j, :T] for j in range(aux.shape[0])], dim=-1)      # [T, 3 Ht]
    g = cat @ w["fc.weight"].T                                               # [T, H]
    e = embed[tokens]                                                        # [T, H]
    x = torch.cat([rms_norm(e, w["midlayer.input_layernorm.weight"], eps),
                   rms_norm(g, w["midlayer.hidden_norm.weight"], eps)], dim=-1)  # [T, 2H]
    q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(T, Hq, D).transpose(0, 1)
    k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(T, Hkv, D).transpose(0, 1)
    v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(T, Hkv, D).transpose(0, 1)
    freqs = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq_for(cfg)[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k = k.repeat_interleave(Hq // Hkv, dim=0)
    v = v.repeat_interleave(Hq // Hkv, dim=0)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf"))
    attn = torch.softmax(scores, dim=-1) @ v                                 # [Hq, T, D]
    attn = attn.transpose(0, 1).reshape(T, Hq * D)
    h = g + attn @ w["midlayer.self_attn.o_proj.weight"].T                   # residual = g
    n = rms_norm(h, w["midlayer.post_attention_layernorm.weight"], eps)
    gate = n @ w["midlayer.mlp.gate_proj.weight"].T
    up = n @ w["midlayer.mlp.up_proj.weight"].T
    h = h + (torch.nn.functional.silu(gate) * up) @ w["midlayer.mlp.down_proj.weight"].T
    return rms_norm(h, w["norm.weight"], eps) @ w["lm_head.weight"].T


def capture_streams(model, ids, layer_ids):
    """Residual stream entering each target layer in layer_ids (id L: leaving the last)."""
    layers = model.model.layers
    L = len(layers)
    got = {}
    hooks = []

    def pre_hook(i):
        def fn(module, args, kwargs):
            hs = args[0] if args else kwargs["hidden_states"]
            got[i] = hs[0].detach().clone()
        return fn

    def post_hook(module, args, kwargs, output):
        hs = output[0] if isinstance(output, tuple) else output
        got[L] = hs[0].detach().clone()

    for i in set(layer_ids):
        if i < L:
            hooks.append(layers[i].register_forward_pre_hook(pre_hook(i), with_kwargs=True))
        else:
            hooks.append(layers[L - 1].register_forward_hook(post_hook, with_kwargs=True))
    with torch.no_grad():
        out = model(ids[None], output_hidden_states=True)
    for h in hooks:
        h.remove()
    # Cross-check the convention with transformers' own hidden_states: entry i (< L) is the
    # input of layer i; entry 0 the embedding.
    for i in layer_ids:
        if i < L:
            torch.testing.assert_close(got[i], out.hidden_states[i][0], rtol=1e-5, atol=1e-5)
    return torch.stack([got[i] for i in layer_ids])


def random_head(cfg, target_vocab, gen):
    H, Ht, I = cfg["hidden_size"], cfg["target_hidden_size"], cfg["intermediate_size"]
    q_size = cfg["num_attention_heads"] * cfg["head_dim"]
    kv_size = cfg["num_key_value_heads"] * cfg["head_dim"]
    dv = cfg["draft_vocab_size"]
    shapes = {
        "fc.weight": (H, 3 * Ht),
        "midlayer.self_attn.q_proj.weight": (q_size, 2 * H),
        "midlayer.self_attn.k_proj.weight": (kv_size, 2 * H),
        "midlayer.self_attn.v_proj.weight": (kv_size, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, q_size),
        "midlayer.mlp.gate_proj.weight": (I, H),
        "midlayer.mlp.up_proj.weight": (I, H),
        "midlayer.mlp.down_proj.weight": (H, I),
        "lm_head.weight": (dv, H),
    }
    w = {}
    for name, shape in shapes.items():
        w[name] = (torch.randn(shape, generator=gen) * MATRIX_STD).to(torch.bfloat16)
    for name in ["midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
                 "midlayer.post_attention_layernorm.weight", "norm.weight"]:
        w[name] = (1.0 + 0.1 * torch.randn(H, generator=gen)).to(torch.bfloat16)
    if dv < target_vocab:
        sel = torch.sort(torch.randperm(target_vocab, generator=gen)[:dv]).values
    else:
        sel = torch.arange(dv)
    d2t = (sel - torch.arange(dv)).to(torch.int64)
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[sel] = True
    return w, d2t, t2d


def head_config(target_cfg, settings):
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": target_cfg["hidden_size"],
        "num_hidden_layers": 1,
        "num_attention_heads": target_cfg["num_attention_heads"],
        "num_key_value_heads": target_cfg["num_key_value_heads"],
        "head_dim": target_cfg.get("head_dim",
                                   target_cfg["hidden_size"] // target_cfg["num_attention_heads"]),
        "intermediate_size": settings["intermediate"],
        "vocab_size": target_cfg["vocab_size"],
        "draft_vocab_size": settings["draft_vocab"],
        "target_hidden_size": target_cfg["hidden_size"],
        "max_position_embeddings": target_cfg["max_position_embeddings"],
        "rms_norm_eps": target_cfg["rms_norm_eps"],
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "torch_dtype": "bfloat16",
    }
    for key in ("rope_parameters", "rope_theta", "rope_scaling"):  # the target's RoPE
        if key in target_cfg:
            cfg[key] = target_cfg[key]
    if settings["aux"] is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": settings["aux"]}
    return cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="tests/fixtures/models")
    ap.add_argument("--out", default="tests/fixtures/eagle3")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    manifest = {"transformers": transformers.__version__, "torch": torch.__version__,
                "python": platform.python_version(), "seed": SEED, "heads": {}}
    for index, (name, settings) in enumerate(HEADS.items()):
        tdir = os.path.join(args.targets, name)
        with open(os.path.join(tdir, "config.json")) as f:
            target_cfg = json.load(f)
        model = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32, attn_implementation="eager")
        model.eval()
        L = target_cfg["num_hidden_layers"]
        aux_ids = settings["aux"] if settings["aux"] is not None else [2, L // 2, L - 3]
        assert all(0 <= i <= L for i in aux_ids), aux_ids

        cfg = head_config(target_cfg, settings)
        gen = torch.Generator().manual_seed(SEED + index)
        w_bf16, d2t, t2d = random_head(cfg, target_cfg["vocab_size"], gen)
        out_dir = os.path.join(args.out, name)
        os.makedirs(out_dir, exist_ok=True)
        save_file({**w_bf16, "d2t": d2t, "t2d": t2d}, os.path.join(out_dir, "model.safetensors"))
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")

        w = {k: v.float() for k, v in w_bf16.items()}
        embed = model.get_input_embeddings().weight.detach().float()
        tensors = {}
        margins_min = float("inf")
        with safe_open(os.path.join(tdir, "reference.safetensors"), "pt") as ref:
            p = 0
            while f"prompt{p}.ids" in ref.keys():
                ids = ref.get_tensor(f"prompt{p}.ids").to(torch.int64)
                aux = capture_streams(model, ids, aux_ids).float()          # [3, n, Ht]
                logits = head_forward(cfg, w, embed, aux, ids[1:])           # [n-1, dv]
                top2 = torch.topk(logits, 2, dim=-1)
                draft = top2.indices[:, 0]
                tensors[f"prompt{p}.ids"] = ids.contiguous()
                tensors[f"prompt{p}.aux"] = aux.contiguous()
                tensors[f"prompt{p}.draft_logits"] = logits.contiguous()
                tensors[f"prompt{p}.draft_tokens"] = (draft + d2t[draft]).to(torch.int64).contiguous()
                margin = (top2.values[:, 0] - top2.values[:, 1]).contiguous()
                tensors[f"prompt{p}.draft_margins"] = margin
                margins_min = min(margins_min, float(margin.min()))
                p += 1
        save_file(tensors, os.path.join(out_dir, "reference.safetensors"))
        manifest["heads"][name] = {"aux_layer_ids": aux_ids, "draft_vocab_size": settings["draft_vocab"],
                                   "prompts": p, "min_draft_margin": margins_min}
        print(f"{name}: aux {aux_ids}, {p} prompts, min draft margin {margins_min:.4g}")
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
