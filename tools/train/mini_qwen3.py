"""A plain-PyTorch stand-in for transformers' Qwen3ForCausalLM, for CPU smoke tests only.

Used by train_model.py / train_eagle3.py when `transformers` is not installed (the dev machine):
the same module tree and parameter names as Qwen3ForCausalLM (model.embed_tokens,
model.layers.N.self_attn.{q,k,v,o}_proj / q_norm / k_norm, input_layernorm,
post_attention_layernorm, mlp.{gate,up,down}_proj, model.norm, lm_head tied), the same math
(RMSNorm in float32, q/k RMSNorm per head before RoPE, rotate-half RoPE, GQA, SiLU MLP), and
`forward(input_ids=...)` returning an object with `.logits`. The GPU runs use transformers.
Works on torch 1.13 (no scaled_dot_product_attention there: plain softmax attention).
"""
import types

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(positions, head_dim, theta, dtype):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float()[:, None] * inv.to(positions.device)[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def causal_attention(q, k, v):
    """q [B, Hq, T, D], k/v [B, Hkv, T, D] -> [B, Hq, T, D], causal, GQA by repetition."""
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[2]
    scores = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=q.device), diagonal=1)
    scores = scores.float().masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1).to(q.dtype) @ v


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        h = c["hidden_size"]
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.q_norm = RMSNorm(self.head_dim, c["rms_norm_eps"])
        self.k_norm = RMSNorm(self.head_dim, c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        o = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, hidden_states, cos, sin):
        h = hidden_states + self.self_attn(self.input_layernorm(hidden_states), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Qwen3Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, input_ids):
        h = self.embed_tokens(input_ids)
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        cos, sin = rope_cos_sin(pos, self.c["head_dim"], self.c["rope_theta"], h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.norm(h)


class Qwen3ForCausalLM(nn.Module):
    """config: the dict written as config.json (hidden_size, num_hidden_layers, ...)."""

    def __init__(self, config):
        super().__init__()
        self.config = types.SimpleNamespace(**config)
        self.model = Qwen3Model(config)
        self.lm_head = nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)
        if config.get("tie_word_embeddings", True):
            self.lm_head.weight = self.model.embed_tokens.weight
        std = config.get("initializer_range", 0.02)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=std)

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids=None, **_):
        return types.SimpleNamespace(logits=self.lm_head(self.model(input_ids)))
