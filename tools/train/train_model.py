#!/usr/bin/env python3
"""Trains the small Qwen3-architecture model (docs/trained_model.md) within a time budget.

transformers' Qwen3ForCausalLM (GQA, q/k-norm, RoPE theta 1e6, tied embeddings) trained on the
corpus (make_corpus.py) tokenized with the trained tokenizer, documents joined by
<|endoftext|> and cut into random windows ("packed"); sequence-length curriculum ending at 4K
(--curriculum), constant tokens per step; AdamW (no decay on norms) + linear warm-up + cosine
decay; bf16 autocast on CUDA; optional torch.compile.

Checkpoints, every --checkpoint-every-s and at the end:
  --work/model_full.pt   fp32 weights + optimizer + counters (stays on the machine: a warm
                         device machine resumes from it exactly);
  --out/                 the portable checkpoint = the export: config.json,
                         generation_config.json, model.safetensors (bf16), tokenizer files,
                         trainer_state.json. It comes back through $OUT; --resume from it alone
                         restarts AdamW with a short re-warm-up (--rewarm-steps).
The log (train/val loss, val loss by position bucket, tokens/s) is appended to
<out>/../model_log.jsonl. The run stops by itself --export-reserve-s before --time-budget-s.
At the end: a greedy sample per prompt and, with transformers, an
AutoModelForCausalLM.from_pretrained(--out) round trip whose logits must match.

Usage (GPU machine; run_on_gpu.sh passes these):
  python3 tools/train/train_model.py --fresh  --time-budget-s 450
  python3 tools/train/train_model.py --resume --time-budget-s 540
  python3 tools/train/train_model.py --smoke --tokenizer models/embedded   # CPU, seconds
"""
import argparse
import copy
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (DEFAULT_CORPUS, DEFAULT_STATE, DEFAULT_WORK, Deadline, JsonlLog, KeepBest, TokenPlan, die,  # noqa: E402
                    given_dests, load_model_weights, lr_at, planned_tokens_arg, save_safetensors, token_stream, write_json)

SAMPLE_PROMPTS = ["In the beginning", "Wedlock, n.", "HACKER, n.", "And the LORD said unto Moses,"]
POSITION_BUCKETS = [0, 128, 512, 1024, 2048, 4096, 8192, 16384, 32768]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=DEFAULT_CORPUS)
    ap.add_argument("--tokenizer", default=os.path.join(DEFAULT_STATE, "tokenizer"))
    ap.add_argument("--out", default=os.path.join(DEFAULT_STATE, "model"))
    ap.add_argument("--work", default=DEFAULT_WORK)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="continue from --work's full checkpoint or --out")
    mode.add_argument("--fresh", action="store_true", help="start over even if --out holds a checkpoint")
    ap.add_argument("--smoke", action="store_true", help="tiny config for a CPU smoke test")
    # model
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--max-positions", type=int, default=4096)
    ap.add_argument("--rope-theta", type=float, default=1e6)
    ap.add_argument("--max-mb", type=float, default=30.0, help="refuse configs whose bf16 weights exceed this")
    # data / schedule
    ap.add_argument("--curriculum", default="2048@0,4096@0.5",
                    help="seq_len@start_fraction of the planned tokens, ascending; the last is the final length")
    ap.add_argument("--tokens-per-step", type=int, default=131072)
    ap.add_argument("--micro-batch-tokens", type=int, default=0, help="split a step (0 = one micro-batch)")
    ap.add_argument("--total-tokens", default="",
                    help="planned tokens: a number, or 'auto' = fit to this run's time budget (the default for a "
                         "fresh run; on --resume the default keeps the plan, 'auto' extends it)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--rewarm-steps", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=20261130)
    # time
    ap.add_argument("--time-budget-s", type=float, default=480)
    ap.add_argument("--checkpoint-every-s", type=float, default=120)
    ap.add_argument("--eval-every-s", type=float, default=60)
    ap.add_argument("--eval-tokens", type=int, default=131072)
    ap.add_argument("--export-reserve-s", type=float, default=25)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (compile time counts)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-train-mb", type=float, default=0, help="use only the first MB of train.txt")
    ap.add_argument("--dropout", type=float, default=0.1,
                    help="training-only dropout on every attention and MLP output (forward hooks; the exported "
                         "model has none): the small corpus is seen tens of times")
    ap.add_argument("--max-epochs", type=float, default=60,
                    help="an auto plan trains on at most this many passes over the training tokens (0 = no cap)")
    ap.add_argument("--no-keep-best", dest="keep_best", action="store_false",
                    help="export the last weights even when an earlier eval had a lower val loss (the default "
                         "restores the best-eval weights at the end: the small corpus is seen many times over)")
    args = ap.parse_args()
    if args.smoke:  # tiny settings, except those given on the command line (a scaled-down test of others)
        given = given_dests(ap)
        smoke = dict(hidden=64, layers=4, heads=4, kv_heads=2, head_dim=16, intermediate=128, max_positions=1024,
                     curriculum="64@0,128@0.5", tokens_per_step=1024, eval_tokens=1024, eval_every_s=3,
                     checkpoint_every_s=3, export_reserve_s=3, warmup_steps=5, rewarm_steps=3, lr=3e-3)
        for k, v in smoke.items():
            if k not in given:
                setattr(args, k, v)
        args.total_tokens = args.total_tokens or str(40 * 1024)
        args.max_train_mb = args.max_train_mb or 1.0
        args.time_budget_s = min(args.time_budget_s, 120)
    args.curriculum = [(int(a), float(b)) for a, b in (s.split("@") for s in args.curriculum.split(","))]
    if [f for _, f in args.curriculum] != sorted(f for _, f in args.curriculum) or args.curriculum[0][1] != 0:
        die("--curriculum must start at fraction 0 and ascend, e.g. 2048@0,4096@0.5")
    for seq_len, _ in args.curriculum:
        if args.tokens_per_step % seq_len:
            die(f"--tokens-per-step {args.tokens_per_step} is not a multiple of sequence length {seq_len}")
        if seq_len > args.max_positions:
            die(f"sequence length {seq_len} exceeds --max-positions {args.max_positions}")
    return args


def model_config(args, tok):
    eot, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    if eot is None or im_end is None:
        die("the tokenizer lacks <|endoftext|> / <|im_end|>")
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": tok.get_vocab_size(),
        "hidden_size": args.hidden, "intermediate_size": args.intermediate, "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads, "head_dim": args.head_dim,
        "max_position_embeddings": args.max_positions, "rope_theta": args.rope_theta, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu",
        "initializer_range": 0.02, "bos_token_id": eot, "eos_token_id": [im_end, eot], "pad_token_id": eot,
        "use_cache": True, "torch_dtype": "bfloat16",
    }


def param_count(c):
    """Exact parameter count of a tied-embedding Qwen3 config."""
    h, d, i = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h + 2 * d
    untied = 0 if c["tie_word_embeddings"] else c["vocab_size"] * h
    return c["vocab_size"] * h + c["num_hidden_layers"] * layer + h + untied


def have_transformers():
    try:
        import transformers  # noqa: F401
        return True
    except ImportError:
        return False


def make_model(c, use_hf):
    if use_hf:
        from transformers import Qwen3Config, Qwen3ForCausalLM
        kwargs = {k: v for k, v in c.items() if k not in ("architectures", "model_type", "torch_dtype")}
        config = Qwen3Config(**kwargs)
        config.architectures = ["Qwen3ForCausalLM"]
        return Qwen3ForCausalLM(config)
    from mini_qwen3 import Qwen3ForCausalLM
    return Qwen3ForCausalLM(c)


def add_dropout(model, p):
    """Dropout on the residual branches (each layer's attention and MLP output) while training;
    nothing changes in eval mode or in the export."""
    import torch.nn.functional as F

    def hook(module, inputs, out):
        if not module.training:
            return None
        if isinstance(out, tuple):
            return (F.dropout(out[0], p, True),) + tuple(out[1:])
        return F.dropout(out, p, True)

    n = 0
    for name, module in model.named_modules():
        if name.endswith(".self_attn") or name.endswith(".mlp"):
            module.register_forward_hook(hook)
            n += 1
    if n == 0:
        die("--dropout: no .self_attn / .mlp modules found in the model")
    return n


def load_weights_into(model, model_dir):
    """bf16 export -> the fp32 training model (lm_head is tied to the embedding in both classes)."""
    weights = load_model_weights(model_dir)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        die(f"{model_dir}: weights do not fit the config (missing {missing}, unexpected {unexpected})")


def export(model, c, args, state, use_hf):
    """Writes the portable checkpoint / export into args.out atomically."""
    import torch
    tmp = args.out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    if use_hf:
        m = copy.deepcopy(model).to(torch.bfloat16)
        m.save_pretrained(tmp, safe_serialization=True)
        del m
    else:
        sd = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()
              if not (k == "lm_head.weight" and c["tie_word_embeddings"])}
        save_safetensors(sd, os.path.join(tmp, "model.safetensors"))
        write_json(os.path.join(tmp, "config.json"), c)
    if not os.path.exists(os.path.join(tmp, "model.safetensors")):
        die(f"export wrote no single model.safetensors in {tmp}: {sorted(os.listdir(tmp))}")
    write_json(os.path.join(tmp, "generation_config.json"), {
        "bos_token_id": c["bos_token_id"], "eos_token_id": c["eos_token_id"], "pad_token_id": c["pad_token_id"],
        "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.tokenizer, name), os.path.join(tmp, name))
    with open(os.path.join(tmp, "tokenizer_config.json")) as f:
        tc = json.load(f)
    if tc.get("model_max_length") not in (None, c["max_position_embeddings"]):  # a longer-context variant
        tc["model_max_length"] = c["max_position_embeddings"]
        write_json(os.path.join(tmp, "tokenizer_config.json"), tc)
    write_json(os.path.join(tmp, "trainer_state.json"), state)
    old = args.out.rstrip("/") + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(args.out):
        os.replace(args.out, old)
    os.replace(tmp, args.out)
    shutil.rmtree(old, ignore_errors=True)


def windows(stream, offsets, seq_len):
    import torch
    idx = offsets[:, None] + torch.arange(seq_len + 1, device=stream.device)[None, :]
    w = stream[idx]
    return w[:, :-1], w[:, 1:]


def evaluate(model, val, seq_len, n_tokens, micro_seqs, ctx):
    """Mean val loss and mean loss per position bucket, on fixed evenly spaced windows."""
    import torch
    import torch.nn.functional as F
    seq_len = min(seq_len, len(val) - 1)
    n = max(1, min(n_tokens // seq_len, (len(val) - 1) // seq_len))
    offsets = torch.arange(n, device=val.device) * ((len(val) - 1 - seq_len) // max(1, n - 1) if n > 1 else 0)
    per_pos = torch.zeros(seq_len, device=val.device)
    model.eval()
    with torch.no_grad():
        for chunk in offsets.split(micro_seqs):
            x, y = windows(val, chunk, seq_len)
            with ctx():
                logits = model(input_ids=x, use_cache=False).logits
            loss = F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none")  # [b, T]
            per_pos += loss.sum(0)
    model.train()
    per_pos /= n
    buckets = {}
    for a, b in zip(POSITION_BUCKETS, POSITION_BUCKETS[1:]):
        if a < seq_len:
            buckets[f"{a}-{min(b, seq_len)}"] = round(float(per_pos[a:b].mean()), 4)
    return float(per_pos.mean()), buckets


def greedy_samples(model, tok, device, ctx, n_new=40):
    import torch
    out = []
    model.eval()
    for prompt in SAMPLE_PROMPTS:
        ids = tok.encode(prompt, add_special_tokens=False).ids if hasattr(tok, "encode_batch") else tok.encode_ids(prompt)
        seq = torch.tensor([ids], device=device)
        with torch.no_grad():
            for _ in range(n_new):
                with ctx():
                    nxt = model(input_ids=seq, use_cache=False).logits[0, -1].float().argmax()
                seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
        text = tok.decode(seq[0].tolist(), skip_special_tokens=False) if hasattr(tok, "decode") else str(seq[0].tolist())
        out.append(text)
    model.train()
    return out


def verify_export(model, out_dir, val, device):
    """from_pretrained(out_dir) must give the logits of the bf16-rounded training weights."""
    import torch
    from transformers import AutoModelForCausalLM
    loaded = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).to(device).eval()
    ref = copy.deepcopy(model).eval()
    with torch.no_grad():  # round the parameters only: buffers such as RoPE's inv_freq stay fp32, as loaded
        for prm in ref.parameters():
            prm.copy_(prm.to(torch.bfloat16).float())
    x = val[:256].view(1, -1)
    with torch.no_grad():
        a, b = loaded(input_ids=x, use_cache=False).logits, ref(input_ids=x, use_cache=False).logits
    err = float((a - b).abs().max())
    scale = float(b.abs().max())
    if err > 1e-3 * max(1.0, scale):
        die(f"from_pretrained({out_dir}) logits differ from the trained model's by {err:.3g} (scale {scale:.3g})")
    return err


def main():
    args = parse_args()
    import numpy as np
    import torch
    import torch.nn.functional as F
    use_hf = have_transformers()
    if not use_hf and not args.smoke:
        die("transformers is not installed (the GPU machine has it); --smoke runs the plain-PyTorch stand-in")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cpu" and not args.smoke:
        die("no CUDA device: this run is meant for the GPU machine (use --smoke for a CPU test, or --device cpu)")
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    deadline = Deadline(args.time_budget_s)
    log = JsonlLog(os.path.join(os.path.dirname(args.out.rstrip("/")), "model_log.jsonl"))
    state_path = os.path.join(args.out, "trainer_state.json")
    if not args.resume and not args.fresh and os.path.exists(state_path):
        die(f"{state_path} exists: pass --resume to continue it or --fresh to start over")
    if args.resume and not os.path.exists(state_path):
        die(f"--resume: no checkpoint at {state_path}")

    train_ids, tok = token_stream(args.corpus, args.tokenizer, "train", args.work, args.smoke,
                                  int(args.max_train_mb * 1e6))
    val_ids, _ = token_stream(args.corpus, args.tokenizer, "val", args.work, args.smoke)
    c = model_config(args, tok)
    if args.resume:
        with open(state_path) as f:
            state = json.load(f)
        with open(os.path.join(args.out, "config.json")) as f:
            saved = json.load(f)
        for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "intermediate_size", "vocab_size"):
            if saved[k] != c[k]:
                die(f"--resume: the checkpoint's {k} is {saved[k]}, the arguments say {c[k]}")
    else:
        state = {"step": 0, "tokens": 0, "total_tokens": None, "stage": 0, "runs": [], "best_val_loss": None}
    auto, explicit = planned_tokens_arg(args.total_tokens, args.resume)
    n_params = param_count(c)
    mb = n_params * 2 / 1e6
    if mb > args.max_mb:
        die(f"{n_params / 1e6:.2f}M parameters = {mb:.1f} MB in bf16, over --max-mb {args.max_mb}")

    model = make_model(c, use_hf).to(device)
    if args.dropout > 0:
        add_dropout(model, args.dropout)
    actual = sum(p.numel() for p in model.parameters())
    if actual != n_params:
        die(f"parameter count {actual} != the formula's {n_params} (config not what was intended?)")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt_kwargs = dict(lr=args.lr, betas=(0.9, args.beta2), eps=1e-8)
    if device.type == "cuda":
        opt_kwargs["fused"] = True
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], **opt_kwargs)
    full_path = os.path.join(args.work, "model_full.pt")
    rewarm_start, resumed = None, "fresh"
    if args.resume:
        full = torch.load(full_path, map_location=device, weights_only=False) if os.path.exists(full_path) else None
        if full is not None and full["state"]["step"] >= state["step"] and full["config"] == c:
            model.load_state_dict(full["model"])
            opt.load_state_dict(full["optim"])
            state, resumed = full["state"], "full checkpoint (weights + optimizer)"
        else:
            load_weights_into(model, args.out)
            rewarm_start, resumed = state["step"], "portable checkpoint (bf16 weights, fresh AdamW + re-warm-up)"
        del full

    previous_total = state["total_tokens"]  # the LR schedule's length until an auto plan exists
    if explicit:
        state["total_tokens"] = explicit
    elif auto:
        state["total_tokens"] = None  # planned after the first steps (TokenPlan)
    plan = TokenPlan(auto, deadline, args.export_reserve_s + 5, args.tokens_per_step,
                     cap_tokens=int(args.max_epochs * len(train_ids)))

    def steps_planned():
        return max(1, state["total_tokens"] // args.tokens_per_step) if state["total_tokens"] else 10**9

    total_steps = steps_planned()
    amp = device.type == "cuda"

    def ctx():
        return torch.autocast("cuda", dtype=torch.bfloat16) if amp else torch.autocast("cpu", enabled=False)

    fwd = torch.compile(model) if args.compile else model
    train_t = torch.from_numpy(train_ids.astype(np.int64)).to(device)
    val_t = torch.from_numpy(val_ids.astype(np.int64)).to(device)
    final_len = args.curriculum[-1][0]
    if len(train_t) < 4 * final_len or len(val_t) < final_len // 4:
        die(f"corpus too small: {len(train_t)} train / {len(val_t)} val tokens for sequences of {final_len}")
    run = {"start_step": state["step"], "resumed_from": resumed, "device": torch.cuda.get_device_name(0) if amp else "cpu",
           "torch": torch.__version__, "transformers": __import__("transformers").__version__ if use_hf else None,
           "attention": getattr(getattr(model, "config", None), "_attn_implementation", None), "compile": args.compile}
    log.write({"event": "start", **run, "params": n_params, "bf16_mb": round(mb, 2), "train_tokens": len(train_t),
               "val_tokens": len(val_t), "total_tokens": state["total_tokens"], "total_steps": total_steps,
               "config": c},
              f"train_model: {n_params / 1e6:.2f}M params ({mb:.1f} MB bf16), {len(train_t) / 1e6:.2f}M train tokens, "
              f"step {state['step']}/{total_steps if state['total_tokens'] else '(planned after a few steps)'}, resumed from: {resumed}, {'transformers' if use_hf else 'stand-in'} "
              f"model on {run['device']}")

    micro_tokens = args.micro_batch_tokens or args.tokens_per_step
    t_last_ckpt = t_last_eval = time.time()
    step_times, t_run, tokens_run = [], time.time(), 0
    stop_reason = "planned tokens reached"

    best = KeepBest(args.keep_best, higher_is_better=False)

    def do_eval(tag):
        loss, buckets = evaluate(fwd, val_t, final_len, args.eval_tokens, max(1, micro_tokens // final_len), ctx)
        if state["best_val_loss"] is None or loss < state["best_val_loss"]:
            state["best_val_loss"] = round(loss, 4)
        best.observe(model, loss, state["step"])
        log.write({"event": tag, "step": state["step"], "tokens": state["tokens"], "val_loss": round(loss, 4),
                   "val_loss_by_position": buckets},
                  f"  {tag} step {state['step']}: val loss {loss:.4f} by position {buckets}")
        return loss

    def checkpoint():
        os.makedirs(args.work, exist_ok=True)
        torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "state": state, "config": c},
                   full_path + ".tmp")
        os.replace(full_path + ".tmp", full_path)
        export(model, c, args, state, use_hf)

    while state["step"] < steps_planned():
        total_steps = steps_planned()
        worst = max(step_times[-5:]) if step_times else 0.0
        if deadline.remaining() < args.export_reserve_s + 2 * worst:
            stop_reason = "time budget"
            break
        t0 = time.time()
        if state["total_tokens"]:  # the curriculum stage only ever advances
            frac = state["tokens"] / state["total_tokens"]
            stage = max(i for i, (_, f) in enumerate(args.curriculum) if f <= frac)
            if stage > state.setdefault("stage", 0):
                state["stage"] = stage
                plan.phase_started()
        seq_len = args.curriculum[min(state.get("stage", 0), len(args.curriculum) - 1)][0]
        batch = args.tokens_per_step // seq_len
        lr_steps = total_steps if state["total_tokens"] or not previous_total else previous_total // args.tokens_per_step
        lr = lr_at(state["step"], lr_steps, args.lr, args.warmup_steps, args.min_lr_ratio, rewarm_start,
                   args.rewarm_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + state["step"])
        offsets = torch.randint(0, len(train_t) - seq_len - 1, (batch,), generator=gen).to(device)
        loss_sum = 0.0
        for chunk in offsets.split(max(1, micro_tokens // seq_len)):
            x, y = windows(train_t, chunk, seq_len)
            with ctx():
                logits = fwd(input_ids=x, use_cache=False).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            (loss * (len(chunk) / batch)).backward()
            loss_sum += float(loss.detach()) * len(chunk) / batch
        gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip))
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["step"] += 1
        state["tokens"] += batch * seq_len
        tokens_run += batch * seq_len
        step_times.append(time.time() - t0)
        planned = plan.observe(state)
        if planned:
            log.write({"event": "plan", "step": state["step"], "total_tokens": planned[0], "tokens_per_s": round(planned[1])},
                      f"  plan: {planned[0] / 1e6:.1f}M tokens in all ({steps_planned()} steps) at "
                      f"{planned[1] / 1e3:.0f}K tok/s (seq {seq_len}) to end inside the time budget")
        if state["step"] % args.log_every == 0 or state["step"] == 1:
            tps = tokens_run / max(1e-9, time.time() - t_run)
            log.write({"event": "train", "step": state["step"], "tokens": state["tokens"], "loss": round(loss_sum, 4),
                       "lr": lr, "grad_norm": round(gnorm, 3), "seq_len": seq_len, "tokens_per_s": round(tps)},
                      f"  step {state['step']}/{total_steps if state['total_tokens'] else '?'} seq {seq_len} loss {loss_sum:.4f} lr {lr:.2e} "
                      f"gnorm {gnorm:.2f} {tps / 1e3:.0f}K tok/s, {deadline.remaining():.0f}s left")
        if time.time() - t_last_eval >= args.eval_every_s:
            do_eval("eval")
            t_last_eval = time.time()
        if time.time() - t_last_ckpt >= args.checkpoint_every_s:
            checkpoint()
            t_last_ckpt = time.time()

    elapsed = time.time() - t_run
    tps = tokens_run / max(1e-9, elapsed)
    val_loss = do_eval("final_eval")
    if best.restore(model, val_loss):
        log.write({"event": "restore_best", "step": state["step"], "best_step": best.step,
                   "val_loss": round(best.score, 4), "last_val_loss": round(val_loss, 4)},
                  f"train_model: val loss rose from {best.score:.4f} (step {best.step}) to {val_loss:.4f}: "
                  f"exporting the step-{best.step} weights (the optimizer state stays the last step's)")
        run["restored_best_step"] = best.step
        val_loss = best.score
    run.update({"end_step": state["step"], "tokens": tokens_run, "seconds": round(elapsed, 1),
                "tokens_per_s": round(tps), "stop": stop_reason, "val_loss": round(val_loss, 4)})
    state["runs"].append(run)
    if not state["total_tokens"]:
        state["total_tokens"] = max(state["tokens"], args.tokens_per_step)
    total_steps = steps_planned()
    state["finished"] = state["step"] >= total_steps
    checkpoint()
    samples = greedy_samples(model, tok, device, ctx)
    for s in samples:
        log.write({"event": "sample", "step": state["step"], "text": s}, "  sample: " + s.replace("\n", "\\n"))
    if use_hf:
        err = verify_export(model, args.out, val_t, device)
        print(f"train_model: from_pretrained({args.out}) round trip: max |logit diff| {err:.2e}", flush=True)
    left = state["total_tokens"] - state["tokens"]
    if left > 0:
        per_run = tps * max(60.0, args.time_budget_s - 60)
        print(f"train_model: {left / 1e6:.1f}M planned tokens left: about {left / per_run:.1f} more 'resume' "
              f"run(s) of {args.time_budget_s:.0f}s at {tps / 1e3:.0f}K tok/s", flush=True)
    else:
        print("train_model: the planned schedule is complete; 'resume' with --total-tokens auto (or a larger number) "
              "trains on with a new cosine cycle", flush=True)
    log.write({"event": "end", **run}, f"train_model: done ({stop_reason}): step {state['step']}/{total_steps}, "
              f"val loss {val_loss:.4f}, {tps / 1e3:.0f}K tok/s, export in {args.out}")


if __name__ == "__main__":
    main()
