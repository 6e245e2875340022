#!/usr/bin/env python3
"""FP8 KV scales per (layer, KV head) against per block, on the trained default (issue 34;
docs/fp8.md "Scales"). Needs numpy (on a machine without it: `apt-get download python3-numpy`,
`dpkg-deb -x` it into a directory and put its dist-packages on PYTHONPATH).

The server implements one FP8 KV scheme: e4m3 with one scale per (layer, KV head), calibrated at
start from a fixed text (scale = 2 x the calibration amax / 448; values beyond saturate). The
other candidate, a scale per 16-token block, would have to travel with every block through the
gather, the host store, the moves, the prefix cache and disaggregation. This tool measures what
each scheme costs in accuracy before anything is built: a numpy float32 forward of the model
(Qwen3 architecture, read from its safetensors) over the same held-out windows as
tools/eval_kv_cache_dtype.py, every forced token's log-probability teacher-forced, with the
keys (after RoPE) and values rounded to e4m3 and back under
  f32           no rounding (the reference; checked against the CPU server's own numbers)
  per-head      the server's scheme: per (layer, KV head) scale from --calib-tokens tokens of
                the training text (not the evaluated text), margin 2 as the server's
  per-block     per (layer, KV head, 16-token block) scale = the block's own amax / 448: the
                best any per-block scheme can do (it knows the block's future tokens)
  per-token     per (layer, KV head, token) scale = the token's amax / 448 (finest granularity)
Dense attention only (the sparse paths read the same stored bytes). Writes
--out-dir/eval_fp8_kv_scales.json and prints a table.

  PYTHONPATH=/tmp/np/root/usr/lib/python3/dist-packages tools/eval_fp8_kv_scales.py \\
      --bin-dir build/src/server [--contexts 1024,2048,4096] [--windows 4] [--forced 128]
"""
import argparse
import json
import lzma
import math
import os
import struct
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import eval_trained_model as etm  # noqa: E402

FP8_MAX = 448.0
BLOCK = 16
SCALE_MARGIN = 2.0  # kKvScaleMargin (src/runner/kv_calibration.h)


def e4m3_round(x):
    """float32 -> nearest e4m3 value (round half to even, saturating at +-448), as float32."""
    a = np.minimum(np.abs(x), FP8_MAX)
    e = np.floor(np.log2(np.maximum(a, 2.0 ** -9)))
    e = np.maximum(e, -6.0)  # subnormals: steps of 2^-9 below 2^-6
    step = np.exp2(e - 3.0)
    q = np.minimum(np.round(a / step) * step, FP8_MAX)  # np.round: half to even
    return (np.sign(x) * q).astype(np.float32)


def quantize(x, scale):
    """x / scale rounded to e4m3, times scale (scale broadcast against x)."""
    return e4m3_round(x / scale) * scale


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[b:e]
        if info["dtype"] == "BF16":
            t = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F32":
            t = np.frombuffer(raw, dtype=np.float32)
        else:
            raise SystemExit(f"eval_fp8_kv_scales: {name}: dtype {info['dtype']} not handled")
        out[name] = t.reshape(info["shape"]).astype(np.float32)
    return out


class Model:
    def __init__(self, model_dir):
        self.c = json.load(open(os.path.join(model_dir, "config.json")))
        self.w = load_safetensors(os.path.join(model_dir, "model.safetensors"))
        c = self.c
        self.L, self.H, self.Hkv = c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
        self.D = c.get("head_dim") or c["hidden_size"] // self.H
        self.eps = c["rms_norm_eps"]
        rope = c.get("rope_parameters") or {}
        self.theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
        self.lm_head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])

    def norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope_tables(self, T):  # cos, sin [T, 1, D] of positions 0..T-1 (once per forward)
        half = self.D // 2
        inv = 1.0 / (self.theta ** (np.arange(half, dtype=np.float64) * 2.0 / self.D))
        ang = np.outer(np.arange(T), inv)
        ang = np.concatenate([ang, ang], axis=1)
        return np.cos(ang).astype(np.float32)[:, None, :], np.sin(ang).astype(np.float32)[:, None, :]

    def rope(self, x, cos, sin):  # x [T, heads, D]: rotate-half RoPE
        half = self.D // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rot * sin

    def forward(self, ids, kv_quant=None, amax=None):
        """Log-probabilities [T, vocab] of the next token after each position. kv_quant(l, k, v)
        returns the stored (rounded) K and V; amax, a [L, 2, Hkv] array, collects max |K|, |V|."""
        T = len(ids)
        cos, sin = self.rope_tables(T)
        x = self.w["model.embed_tokens.weight"][np.asarray(ids)]
        mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
        g = self.H // self.Hkv
        for l in range(self.L):
            p = f"model.layers.{l}."
            h = self.norm(x, self.w[p + "input_layernorm.weight"])
            q = (h @ self.w[p + "self_attn.q_proj.weight"].T).reshape(T, self.H, self.D)
            k = (h @ self.w[p + "self_attn.k_proj.weight"].T).reshape(T, self.Hkv, self.D)
            v = (h @ self.w[p + "self_attn.v_proj.weight"].T).reshape(T, self.Hkv, self.D)
            q = self.rope(self.norm(q, self.w[p + "self_attn.q_norm.weight"]), cos, sin)
            k = self.rope(self.norm(k, self.w[p + "self_attn.k_norm.weight"]), cos, sin)
            if amax is not None:
                amax[l, 0] = np.maximum(amax[l, 0], np.abs(k).max(axis=(0, 2)))
                amax[l, 1] = np.maximum(amax[l, 1], np.abs(v).max(axis=(0, 2)))
            if kv_quant is not None:
                k, v = kv_quant(l, k, v)
            out = np.empty((T, self.H, self.D), dtype=np.float32)
            for hh in range(self.H):
                kh = hh // g
                s = (q[:, hh, :] @ k[:, kh, :].T) / math.sqrt(self.D) + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                out[:, hh, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kh, :]
            x = x + out.reshape(T, -1) @ self.w[p + "self_attn.o_proj.weight"].T
            h = self.norm(x, self.w[p + "post_attention_layernorm.weight"])
            gate = h @ self.w[p + "mlp.gate_proj.weight"].T
            up = h @ self.w[p + "mlp.up_proj.weight"].T
            x = x + (gate / (1.0 + np.exp(-gate)) * up) @ self.w[p + "mlp.down_proj.weight"].T
        logits = self.norm(x, self.w["model.norm.weight"]) @ self.lm_head.T
        m = logits.max(axis=1, keepdims=True)
        return logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))


def schemes(model, head_scales):
    """name -> kv_quant(l, k, v) (None: f32)."""
    def per_head(l, k, v):
        return (quantize(k, head_scales[l, 0][None, :, None]), quantize(v, head_scales[l, 1][None, :, None]))

    def per_block(l, k, v):
        def one(t):
            T = t.shape[0]
            pad = (-T) % BLOCK
            tb = np.concatenate([t, np.zeros((pad,) + t.shape[1:], np.float32)]).reshape(-1, BLOCK, *t.shape[1:])
            s = np.abs(tb).max(axis=(1, 3), keepdims=True) / FP8_MAX
            s = np.where(s > 0, s, 1.0)
            return quantize(tb, s).reshape(-1, *t.shape[1:])[:T]
        return one(k), one(v)

    def per_token(l, k, v):
        def one(t):
            s = np.abs(t).max(axis=2, keepdims=True) / FP8_MAX
            return quantize(t, np.where(s > 0, s, 1.0))
        return one(k), one(v)

    return [("f32", None), ("per-head", per_head), ("per-block", per_block), ("per-token", per_token)]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build/src/server"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/embedded"))
    ap.add_argument("--text", default=os.path.join(ROOT, ".cache/train/corpus/val.txt.xz"))
    ap.add_argument("--calib-text", default=os.path.join(ROOT, ".cache/train/corpus/train.txt.xz"))
    ap.add_argument("--calib-tokens", type=int, default=1024)
    ap.add_argument("--out-dir", default=os.path.join(ROOT, ".cache/eval-fp8-kv-scales"))
    ap.add_argument("--backend", default="cpu", choices=["cpu"])
    ap.add_argument("--contexts", default="1024,2048,4096")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--forced", type=int, default=128)
    a = ap.parse_args(argv)
    a.contexts = [int(x) for x in a.contexts.split(",")]
    t0 = time.time()
    ev = etm.Eval(a)
    # The server tokenizes the texts and gives the f32 reference (the check of this forward).
    s = ev.server([])
    try:
        _, wins = ev.windows(s.base)
        with lzma.open(a.calib_text, "rt", encoding="utf-8") as f:
            calib_text = f.read(200000)
        calib = etm.post(s.base, "/tokenize", {"prompt": calib_text, "add_special_tokens": False})["tokens"]
        calib = calib[:a.calib_tokens]
        server_ref = {ctx: ev.forced_run(s.base, wins[ctx]) for ctx in a.contexts}
    finally:
        s.stop()
    model = Model(a.model)
    amax = np.zeros((model.L, 2, model.Hkv), np.float32)
    model.forward(calib, amax=amax)
    head_scales = np.where(amax > 0, amax * SCALE_MARGIN / FP8_MAX, 1.0).astype(np.float32)
    report = {"config": vars(a).copy(), "calibration": {"tokens": len(calib), "amax": amax.tolist()},
              "contexts": {}}
    for ctx in a.contexts:
        rows = {}
        ref = None
        for name, fn in schemes(model, head_scales):
            lps, tops = [], []
            for prompt, forced in wins[ctx]:
                ids = prompt + forced
                lp = model.forward(ids[:-1], kv_quant=fn)  # row t predicts ids[t + 1]
                first = len(prompt) - 1
                for i, tok in enumerate(forced):
                    lps.append(float(lp[first + i, tok]))
                    tops.append(int(np.argmax(lp[first + i])))
            rec = {"ppl": math.exp(-sum(lps) / len(lps)), "tokens": len(lps)}
            if ref is None:
                ref = (lps, tops)
                srv = [x for w in server_ref[ctx] for x in w]
                rec["max_abs_logprob_diff_vs_server"] = max(abs(x - y[0]) for x, y in zip(lps, srv))
            else:
                rec["ppl_ratio"] = rec["ppl"] / rows["f32"]["ppl"]
                rec["top1_agreement"] = sum(x == y for x, y in zip(tops, ref[1])) / len(tops)
                rec["mean_abs_logprob_diff"] = sum(abs(x - y) for x, y in zip(lps, ref[0])) / len(lps)
            rows[name] = rec
            print(f"  {ctx:5d} {name:10s} ppl {rec['ppl']:9.4f} "
                  + (f"(/ f32 {rec['ppl_ratio']:.4f}, top-1 {rec['top1_agreement']:.4f}, "
                     f"|d logprob| {rec['mean_abs_logprob_diff']:.4f})" if "ppl_ratio" in rec else
                     f"(max |logprob - server f32| {rec['max_abs_logprob_diff_vs_server']:.2e})"), flush=True)
        report["contexts"][str(ctx)] = rows
    report["seconds"] = round(time.time() - t0, 1)
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, "eval_fp8_kv_scales.json"), "w") as fp:
        json.dump(report, fp, indent=1)
    print("\n| context | scales | perplexity | / f32 | top-1 agreement with f32 | mean \\|Δ log-prob\\| |")
    print("|---|---|---:|---:|---:|---:|")
    for ctx in a.contexts:
        for name, rec in report["contexts"][str(ctx)].items():
            print(f"| {ctx} | {name} | {rec['ppl']:.3f} | {rec.get('ppl_ratio', 1):.4f} | "
                  f"{rec.get('top1_agreement', 1):.4f} | {rec.get('mean_abs_logprob_diff', 0):.4f} |")
    print(f"({report['seconds']} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
