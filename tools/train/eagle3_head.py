"""The EAGLE-3 head module and its helpers for train_eagle3.py (docs/trained_model.md).

make_head_class(): a torch module whose state_dict names are the checkpoint's (fc.weight,
midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}.weight,
midlayer.self_attn.{q,k,v,o}_proj.weight, midlayer.mlp.{gate,up,down}_proj.weight,
norm.weight, lm_head.weight, d2t, t2d) and whose forward is tools/eagle3_reference.py's
head_forward, batched (SDPA attention); the aux-layer choice, the head config.json, target
loading, the residual-stream capture hooks, the draft vocabulary and the check against the
reference implementation.
"""
import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import ROOT, die, load_model_weights, require_file  # noqa: E402

# ---- the head -----------------------------------------------------------------------------

def make_head_class():
    import torch
    from torch import nn
    from mini_qwen3 import RMSNorm, causal_attention, rope_cos_sin, rotate_half

    class Attention(nn.Module):
        def __init__(self, c):
            super().__init__()
            h, d = c["hidden_size"], c["head_dim"]
            self.heads, self.kv_heads, self.head_dim = c["num_attention_heads"], c["num_key_value_heads"], d
            self.q_proj = nn.Linear(2 * h, self.heads * d, bias=False)
            self.k_proj = nn.Linear(2 * h, self.kv_heads * d, bias=False)
            self.v_proj = nn.Linear(2 * h, self.kv_heads * d, bias=False)
            self.o_proj = nn.Linear(self.heads * d, h, bias=False)

    class MLP(nn.Module):
        def __init__(self, c):
            super().__init__()
            h, i = c["hidden_size"], c["intermediate_size"]
            self.gate_proj = nn.Linear(h, i, bias=False)
            self.up_proj = nn.Linear(h, i, bias=False)
            self.down_proj = nn.Linear(i, h, bias=False)

    class Midlayer(nn.Module):
        def __init__(self, c):
            super().__init__()
            h, eps = c["hidden_size"], c["rms_norm_eps"]
            self.hidden_norm = RMSNorm(h, eps)
            self.input_layernorm = RMSNorm(h, eps)
            self.post_attention_layernorm = RMSNorm(h, eps)
            self.self_attn = Attention(c)
            self.mlp = MLP(c)

    class Eagle3Head(nn.Module):
        """Parameter names = the checkpoint's (fc.weight, midlayer.*, norm.weight, lm_head.weight,
        d2t, t2d)."""

        def __init__(self, c, theta):
            super().__init__()
            h = c["hidden_size"]
            self.c, self.theta = c, theta
            self.fc = nn.Linear(3 * c["target_hidden_size"], h, bias=False)
            self.midlayer = Midlayer(c)
            self.norm = RMSNorm(h, c["rms_norm_eps"])
            self.lm_head = nn.Linear(h, c["draft_vocab_size"], bias=False)
            self.register_buffer("d2t", torch.zeros(c["draft_vocab_size"], dtype=torch.int64))
            self.register_buffer("t2d", torch.zeros(c["vocab_size"], dtype=torch.bool))

        def forward(self, aux, emb):
            """aux [B, T, 3*Ht] target features of rows 0..T-1, emb [B, T, H] embeddings of the
            NEXT tokens; rows at positions 0..T-1, causal. -> (logits [B, T, dv], h [B, T, H])."""
            m, a = self.midlayer, self.midlayer.self_attn
            B, T, _ = emb.shape
            g = self.fc(aux)
            x = torch.cat([m.input_layernorm(emb), m.hidden_norm(g)], dim=-1)
            q = a.q_proj(x).view(B, T, a.heads, a.head_dim).transpose(1, 2)
            k = a.k_proj(x).view(B, T, a.kv_heads, a.head_dim).transpose(1, 2)
            v = a.v_proj(x).view(B, T, a.kv_heads, a.head_dim).transpose(1, 2)
            cos, sin = rope_cos_sin(torch.arange(T, device=emb.device), a.head_dim, self.theta, q.dtype)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            o = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, -1)
            h = g + a.o_proj(o)                                       # the residual is g
            n = m.post_attention_layernorm(h)
            h = h + m.mlp.down_proj(torch.nn.functional.silu(m.mlp.gate_proj(n)) * m.mlp.up_proj(n))
            return self.lm_head(self.norm(h)), h

    return Eagle3Head


def aux_layer_ids(spec, L):
    if spec != "auto":
        ids = [int(x) for x in spec.split(",")]
    else:
        ids = [2, L // 2, L - 3]
        if len(set(ids)) < 3 or min(ids) < 0:
            ids = [1, L // 2, L - 1]
    if len(ids) != 3 or len(set(ids)) != 3 or not all(0 <= i <= L for i in ids):
        die(f"aux layer ids {ids} must be three distinct ids in [0, {L}] (L = target layers)")
    return ids


def head_config(tc, args, ids, draft_vocab):
    L = tc["num_hidden_layers"]
    c = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": tc["hidden_size"],
         "num_hidden_layers": 1, "num_attention_heads": tc["num_attention_heads"],
         "num_key_value_heads": tc["num_key_value_heads"],
         "head_dim": tc.get("head_dim", tc["hidden_size"] // tc["num_attention_heads"]),
         "intermediate_size": args.intermediate or tc["intermediate_size"], "vocab_size": tc["vocab_size"],
         "draft_vocab_size": draft_vocab, "target_hidden_size": tc["hidden_size"],
         "max_position_embeddings": tc["max_position_embeddings"], "rms_norm_eps": tc["rms_norm_eps"],
         "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "bfloat16"}
    for key in ("rope_parameters", "rope_theta", "rope_scaling"):
        if tc.get(key) is not None:
            c[key] = tc[key]
    if ids != [2, L // 2, L - 3]:
        c["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
    return c


def rope_theta(tc):
    params = tc.get("rope_parameters") or {}
    scaling = params if "rope_parameters" in tc else (tc.get("rope_scaling") or {})
    if scaling.get("rope_type", scaling.get("type", "default")) not in (None, "default"):
        die("the head trainer supports only default RoPE targets")
    return float(params.get("rope_theta", tc.get("rope_theta", 10000.0)))


# ---- target -------------------------------------------------------------------------------

def load_target(target_dir, device, use_hf, dtype):
    import torch
    with open(require_file(os.path.join(target_dir, "config.json"), "run the 'model' phase first")) as f:
        tc = json.load(f)
    if use_hf:
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype)
    else:
        from mini_qwen3 import Qwen3ForCausalLM
        model = Qwen3ForCausalLM(tc)
        w = load_model_weights(target_dir)
        model.load_state_dict({k: v.to(dtype) for k, v in w.items()}, strict=False)
        model.to(dtype)
    model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tc


class Capture:
    """Residual streams entering target layers `ids` (id L: leaving the last layer)."""

    def __init__(self, model, ids):
        layers = model.model.layers
        L = len(layers)
        self.ids, self.got, self.hooks = ids, {}, []

        def keep(i):
            def fn(hidden):
                self.got[i] = hidden[0] if isinstance(hidden, tuple) else hidden
            return fn

        for i in set(ids):
            layer, fn = (layers[i], keep(i)) if i < L else (layers[L - 1], keep(L))
            try:  # torch >= 2: hidden_states may come as a keyword argument
                if i < L:
                    h = layer.register_forward_pre_hook(lambda m, a, k, fn=fn: fn(a[0] if a else k["hidden_states"]),
                                                        with_kwargs=True)
                else:
                    h = layer.register_forward_hook(lambda m, a, k, out, fn=fn: fn(out), with_kwargs=True)
            except TypeError:  # torch 1.x (the CPU stand-in passes it positionally)
                if i < L:
                    h = layer.register_forward_pre_hook(lambda m, a, fn=fn: fn(a[0]))
                else:
                    h = layer.register_forward_hook(lambda m, a, out, fn=fn: fn(out))
            self.hooks.append(h)

    def features(self):
        import torch
        return torch.cat([self.got[i] for i in self.ids], dim=-1)  # [B, T, 3*Ht]


def select_draft_vocab(train_ids, vocab, size, specials):
    import numpy as np
    import torch
    counts = np.bincount(train_ids, minlength=vocab).astype(np.float64)
    if size <= 0 or size >= vocab:
        sel = np.arange(vocab)
    else:
        order = np.argsort(-counts, kind="stable")
        chosen = list(dict.fromkeys([s for s in specials if s is not None] + order.tolist()))[:size]
        sel = np.sort(np.array(chosen))
    coverage = float(counts[sel].sum() / max(1.0, counts.sum()))
    return torch.from_numpy(sel.astype(np.int64)), coverage


def import_reference():
    """tools/eagle3_reference.py (the PyTorch reference our C++ head is tested against). It
    imports transformers and safetensors at the top; where they are missing (CPU smoke tests)
    empty stand-ins are put in sys.modules first: head_forward needs only torch."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    for name, attrs in (("transformers", {"AutoModelForCausalLM": None, "__version__": "absent"}),
                        ("safetensors", {"safe_open": None}), ("safetensors.torch", {"save_file": None})):
        try:
            __import__(name)
        except ImportError:
            mod = types.ModuleType(name)
            mod.__dict__.update(attrs)
            sys.modules[name] = mod
    import eagle3_reference
    return eagle3_reference


def reference_check(head, hc, embed_weight, aux, tokens):
    """Normalized max error between our module and eagle3_reference.head_forward, both in
    float32 on the CPU with the exported (bf16-rounded) weights. aux [T, 3*Ht] features of one
    sequence, tokens [T] the embedded (next) tokens."""
    import copy
    import torch
    ref = import_reference()
    w = {k: v.detach().to(torch.bfloat16).float().cpu() for k, v in head.state_dict().items() if k not in ("d2t", "t2d")}
    ours = copy.deepcopy(head).float().cpu()
    ours.load_state_dict({**w, "d2t": head.d2t.cpu(), "t2d": head.t2d.cpu()})
    embed = embed_weight.detach().float().cpu()
    aux = aux.detach().float().cpu()
    Ht = hc["target_hidden_size"]
    aux3 = torch.stack([aux[:, j * Ht:(j + 1) * Ht] for j in range(3)])            # [3, T, Ht]
    with torch.no_grad():
        expected = ref.head_forward(hc, w, embed, aux3, tokens.cpu())
        got, _ = ours(aux[None], embed[tokens.cpu()][None])
    err = float((got[0] - expected).abs().max() / expected.abs().max().clamp_min(1e-6))
    return err
