#!/usr/bin/env python3
"""Trains an EAGLE-3 draft head on the frozen trained target (docs/trained_model.md).

The head is `LlamaForCausalLMEagle3` exactly as models/eagle3.{h,cpp} load it and
tools/eagle3_reference.py computes it (docs/eagle3.md): fc over the concatenated residual
streams ENTERING three target layers, one decoder layer whose q/k/v take
concat(input_layernorm(embed(token)), hidden_norm(g)) (2H), residual g, MLP, norm, lm_head over
a draft vocabulary (the --draft-vocab most frequent training tokens + the special tokens;
d2t int64 offsets, t2d bool), the target's embedding (no embed_tokens in the checkpoint, so
the head's hidden size is the target's).

Objective (teacher forcing, as the engine runs the head: every row sees the target's real
features and the real next token, causal over the head's own rows): head row p takes the
target's features at position p and the embedding of x_{p+1}, at position p, and is trained
to match the target's next-token distribution at position p+1 (restricted to the draft
vocabulary, renormalised; soft cross-entropy). Reported: loss and "accept" = how often the
draft argmax equals the target's argmax (the greedy acceptance rate of one-token drafting),
also by position bucket. Test-time-training unrolls (chained drafts) are not done: the engine
drafts one token per step.

Aux layers: the EAGLE-3 default (2, L/2, L-3) when those are distinct and inside [0, L];
otherwise (1, L/2, L-1) -- for the 6-layer model the default would be (2, 3, 3) -- written to
config.json as eagle_config.eagle_aux_hidden_state_layer_ids (our and vLLM's convention: the
stream entering layer i; SGLang reads config ids as layer outputs, i.e. needs id - 1 there).

Checkpoints as train_model.py: --work/eagle_full.pt (exact resume on a warm machine) and the
export in --out (config.json + model.safetensors: bf16 matrices, int64 d2t, bool t2d;
trainer_state.json) from which --resume restarts AdamW with a re-warm-up. At the end the
exported weights are checked against tools/eagle3_reference.py's head_forward.

Usage (GPU machine): python3 tools/train/train_eagle3.py --fresh --time-budget-s 480
                     python3 tools/train/train_eagle3.py --smoke --target DIR   # CPU test
"""
import argparse
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import (DEFAULT_CORPUS, DEFAULT_STATE, DEFAULT_WORK, SPECIALS, Deadline, JsonlLog, KeepBest, TokenPlan,  # noqa: E402
                    die, given_dests, load_safetensors, lr_at, planned_tokens_arg, save_safetensors, token_stream, write_json)

POSITION_BUCKETS = [0, 128, 512, 1024, 2048, 4096, 8192, 16384, 32768]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=os.path.join(DEFAULT_STATE, "model"), help="exported target model dir")
    ap.add_argument("--corpus", default=DEFAULT_CORPUS)
    ap.add_argument("--out", default=os.path.join(DEFAULT_STATE, "eagle"))
    ap.add_argument("--work", default=DEFAULT_WORK)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true")
    mode.add_argument("--fresh", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny settings for a CPU smoke test")
    ap.add_argument("--aux-ids", default="auto", help="three target layer ids, e.g. 1,3,5 (auto: see above)")
    ap.add_argument("--draft-vocab", type=int, default=4096, help="draft vocabulary size (0 = the target's)")
    ap.add_argument("--intermediate", type=int, default=0, help="head MLP size (0 = the target's)")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--tokens-per-step", type=int, default=65536)
    ap.add_argument("--micro-batch-tokens", type=int, default=0)
    ap.add_argument("--total-tokens", default="",
                    help="planned tokens: a number, or 'auto' = fit to this run's time budget (the default for a "
                         "fresh run; on --resume the default keeps the plan, 'auto' extends it)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--rewarm-steps", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--time-budget-s", type=float, default=480)
    ap.add_argument("--checkpoint-every-s", type=float, default=120)
    ap.add_argument("--eval-every-s", type=float, default=60)
    ap.add_argument("--eval-tokens", type=int, default=65536)
    ap.add_argument("--export-reserve-s", type=float, default=20)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-train-mb", type=float, default=0)
    ap.add_argument("--max-epochs", type=float, default=20,
                    help="an auto plan trains on at most this many passes over the training tokens (0 = no cap)")
    ap.add_argument("--no-keep-best", dest="keep_best", action="store_false",
                    help="export the last weights even when an earlier eval had a higher greedy acceptance")
    args = ap.parse_args()
    if args.smoke:  # tiny settings, except those given on the command line (a scaled-down test of others)
        given = given_dests(ap)
        smoke = dict(seq_len=128, tokens_per_step=1024, eval_tokens=1024, eval_every_s=3, checkpoint_every_s=3,
                     export_reserve_s=3, warmup_steps=5, rewarm_steps=3, lr=3e-3)
        for k, v in smoke.items():
            if k not in given:
                setattr(args, k, v)
        args.total_tokens = args.total_tokens or str(30 * 1024)
        args.draft_vocab = min(args.draft_vocab, 256)
        args.max_train_mb = args.max_train_mb or 1.0
        args.time_budget_s = min(args.time_budget_s, 120)
    if args.tokens_per_step % args.seq_len:
        die("--tokens-per-step must be a multiple of --seq-len")
    return args



def export(head, hc, out, state):
    """config.json + model.safetensors (bf16 matrices, int64 d2t, bool t2d) + trainer_state.json."""
    import torch
    tmp, old = out.rstrip("/") + ".tmp", out.rstrip("/") + ".old"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    tensors = {k: v.to(torch.bfloat16) for k, v in head.state_dict().items() if k not in ("d2t", "t2d")}
    tensors["d2t"] = head.d2t.to(torch.int64)
    tensors["t2d"] = head.t2d.to(torch.bool)
    save_safetensors(tensors, os.path.join(tmp, "model.safetensors"))
    write_json(os.path.join(tmp, "config.json"), hc)
    write_json(os.path.join(tmp, "trainer_state.json"), state)
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(out):
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def main():
    args = parse_args()
    import torch
    import torch.nn.functional as F
    from eagle3_head import (Capture, aux_layer_ids, head_config, load_target, make_head_class, reference_check,
                             rope_theta, select_draft_vocab)
    try:
        import transformers  # noqa: F401
        use_hf = True
    except ImportError:
        use_hf = False
    if not use_hf and not args.smoke:
        die("transformers is not installed (the GPU machine has it); --smoke uses the plain-PyTorch stand-in")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cpu" and not args.smoke:
        die("no CUDA device: this run is meant for the GPU machine (--smoke for a CPU test, or --device cpu)")
    device = torch.device(args.device)
    amp = device.type == "cuda"
    torch.manual_seed(args.seed)
    if amp:
        torch.backends.cuda.matmul.allow_tf32 = True
    deadline = Deadline(args.time_budget_s)
    log = JsonlLog(os.path.join(os.path.dirname(args.out.rstrip("/")), "eagle_log.jsonl"))
    state_path = os.path.join(args.out, "trainer_state.json")
    if not args.resume and not args.fresh and os.path.exists(state_path):
        die(f"{state_path} exists: pass --resume to continue it or --fresh to start over")
    if args.resume and not os.path.exists(state_path):
        die(f"--resume: no checkpoint at {state_path}")

    def ctx():
        return torch.autocast("cuda", dtype=torch.bfloat16) if amp else torch.autocast("cpu", enabled=False)

    target, tc = load_target(args.target, device, use_hf, torch.bfloat16 if amp else torch.float32)
    L, V = tc["num_hidden_layers"], tc["vocab_size"]
    train_ids, tok = token_stream(args.corpus, args.target, "train", args.work, args.smoke, int(args.max_train_mb * 1e6))
    val_ids, _ = token_stream(args.corpus, args.target, "val", args.work, args.smoke)
    Head = make_head_class()
    if args.resume:
        with open(os.path.join(args.out, "config.json")) as f:
            hc = json.load(f)
        with open(state_path) as f:
            state = json.load(f)
    else:
        ids = aux_layer_ids(args.aux_ids, L)
        sel, coverage = select_draft_vocab(train_ids, V, args.draft_vocab, [tok.token_to_id(s) for s in SPECIALS])
        hc = head_config(tc, args, ids, len(sel))
        state = {"step": 0, "tokens": 0, "total_tokens": None, "runs": [],
                 "aux_layer_ids": ids, "draft_vocab_size": len(sel), "draft_vocab_coverage": round(coverage, 5),
                 "best_val_accept": None}
    ids = (hc.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [2, L // 2, L - 3]
    if hc["target_hidden_size"] != tc["hidden_size"] or hc["vocab_size"] != V:
        die(f"{args.out}/config.json does not fit the target {args.target}")
    head = Head(hc, rope_theta(tc)).to(device)
    opt_kwargs = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=args.weight_decay)
    if amp:
        opt_kwargs["fused"] = True
    opt = torch.optim.AdamW([p for p in head.parameters()], **opt_kwargs)
    full_path = os.path.join(args.work, "eagle_full.pt")
    rewarm_start, resumed = None, "fresh"
    if args.resume:
        full = torch.load(full_path, map_location=device, weights_only=False) if os.path.exists(full_path) else None
        if full is not None and full["state"]["step"] >= state["step"] and full["config"] == hc:
            head.load_state_dict(full["head"])
            opt.load_state_dict(full["optim"])
            state, resumed = full["state"], "full checkpoint (weights + optimizer)"
        else:
            w = load_safetensors(os.path.join(args.out, "model.safetensors"))
            head.load_state_dict({k: (v if k in ("d2t", "t2d") else v.float()) for k, v in w.items()})
            rewarm_start, resumed = state["step"], "portable checkpoint (bf16 weights, fresh AdamW + re-warm-up)"
        del full
    else:
        with torch.no_grad():
            sel = sel.to(device)
            head.d2t.copy_(sel - torch.arange(len(sel), device=device))
            head.t2d.zero_()
            head.t2d[sel] = True
            head.lm_head.weight.copy_(target.get_output_embeddings().weight[sel].float())
    draft_ids = torch.arange(hc["draft_vocab_size"], device=device) + head.d2t
    t2d_index = torch.full((V,), -1, dtype=torch.int64, device=device)
    t2d_index[draft_ids] = torch.arange(hc["draft_vocab_size"], device=device)
    capture = Capture(target, ids)
    embed = target.get_input_embeddings()
    train_t = torch.from_numpy(train_ids.astype("int64")).to(device)
    val_t = torch.from_numpy(val_ids.astype("int64")).to(device)
    if len(train_t) < 4 * args.seq_len:
        die(f"corpus too small ({len(train_t)} tokens) for --seq-len {args.seq_len}")

    def rows(x):
        """Per-row soft-CE loss and greedy acceptance of the head on token windows x [b, T]."""
        with torch.no_grad(), ctx():
            logits = target(input_ids=x, use_cache=False).logits
            feats = capture.features()
        with torch.no_grad():
            tl = logits[:, 1:].float()
            p = torch.softmax(tl[..., draft_ids], dim=-1)
            want = t2d_index[tl.argmax(-1)]
            emb = embed(x[:, 1:])
        with ctx():
            hl, _ = head(feats[:, :-1], emb)
        hl = hl.float()
        loss = -(p * torch.log_softmax(hl, dim=-1)).sum(-1)
        return loss, (hl.argmax(-1) == want)

    micro = max(1, (args.micro_batch_tokens or args.tokens_per_step) // args.seq_len)
    best = KeepBest(args.keep_best, higher_is_better=True)

    def evaluate(tag):
        T = min(args.seq_len, len(val_t) - 1)
        n = max(1, min(args.eval_tokens // T, (len(val_t) - 1) // T))
        offsets = torch.arange(n, device=device) * ((len(val_t) - 1 - T) // max(1, n - 1) if n > 1 else 0)
        loss_sum, acc = 0.0, torch.zeros(T - 1, device=device)
        head.eval()
        with torch.no_grad():
            for chunk in offsets.split(micro):
                x = val_t[chunk[:, None] + torch.arange(T, device=device)[None, :]]
                loss, ok = rows(x)
                loss_sum += float(loss.sum())
                acc += ok.float().sum(0)
        head.train()
        acc /= n
        buckets = {f"{a}-{min(b, T - 1)}": round(float(acc[a:b].mean()), 4)
                   for a, b in zip(POSITION_BUCKETS, POSITION_BUCKETS[1:]) if a < T - 1}
        mean_loss, mean_acc = loss_sum / (n * (T - 1)), float(acc.mean())
        if state["best_val_accept"] is None or mean_acc > state["best_val_accept"]:
            state["best_val_accept"] = round(mean_acc, 4)
        best.observe(head, mean_acc, state["step"], loss=mean_loss)
        log.write({"event": tag, "step": state["step"], "val_loss": round(mean_loss, 4),
                   "val_accept": round(mean_acc, 4), "val_accept_by_position": buckets},
                  f"  {tag} step {state['step']}: val loss {mean_loss:.4f}, greedy acceptance {mean_acc:.4f} "
                  f"by position {buckets}")
        return mean_loss, mean_acc

    def checkpoint():
        os.makedirs(args.work, exist_ok=True)
        torch.save({"head": head.state_dict(), "optim": opt.state_dict(), "state": state, "config": hc},
                   full_path + ".tmp")
        os.replace(full_path + ".tmp", full_path)
        export(head, hc, args.out, state)

    auto, explicit = planned_tokens_arg(args.total_tokens, args.resume)
    previous_total = state["total_tokens"]
    if explicit:
        state["total_tokens"] = explicit
    elif auto:
        state["total_tokens"] = None  # planned after the first steps (TokenPlan)
    plan = TokenPlan(auto, deadline, args.export_reserve_s + 5, args.tokens_per_step,
                     cap_tokens=int(args.max_epochs * len(train_t)))

    def steps_planned():
        return max(1, state["total_tokens"] // args.tokens_per_step) if state["total_tokens"] else 10**9

    total_steps = steps_planned()
    run = {"start_step": state["step"], "resumed_from": resumed, "device": torch.cuda.get_device_name(0) if amp else "cpu",
           "torch": torch.__version__}
    n_params = sum(p.numel() for p in head.parameters())
    log.write({"event": "start", **run, "params": n_params, "aux_layer_ids": ids, "head_config": hc,
               "draft_vocab_coverage": state.get("draft_vocab_coverage"), "total_steps": total_steps},
              f"train_eagle3: head {n_params / 1e6:.2f}M params ({n_params * 2 / 1e6:.1f} MB bf16), aux layers {ids}, "
              f"draft vocab {hc['draft_vocab_size']} (covers {state.get('draft_vocab_coverage', 0):.2%} of train "
              f"tokens), step {state['step']}/{total_steps if state['total_tokens'] else '(planned after a few steps)'}, "
              f"resumed from: {resumed}")
    t_last_ckpt = t_last_eval = time.time()
    step_times, t_run, tokens_run, stop_reason = [], time.time(), 0, "planned tokens reached"
    while state["step"] < steps_planned():
        total_steps = steps_planned()
        worst = max(step_times[-5:]) if step_times else 0.0
        if deadline.remaining() < args.export_reserve_s + 2 * worst:
            stop_reason = "time budget"
            break
        t0 = time.time()
        lr_steps = total_steps if state["total_tokens"] or not previous_total else previous_total // args.tokens_per_step
        lr = lr_at(state["step"], lr_steps, args.lr, args.warmup_steps, args.min_lr_ratio, rewarm_start,
                   args.rewarm_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = args.tokens_per_step // args.seq_len
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + state["step"])
        offsets = torch.randint(0, len(train_t) - args.seq_len, (batch,), generator=gen).to(device)
        loss_sum, acc_sum = 0.0, 0.0
        for chunk in offsets.split(micro):
            x = train_t[chunk[:, None] + torch.arange(args.seq_len, device=device)[None, :]]
            loss, ok = rows(x)
            (loss.mean() * (len(chunk) / batch)).backward()
            loss_sum += float(loss.mean().detach()) * len(chunk) / batch
            acc_sum += float(ok.float().mean()) * len(chunk) / batch
        gnorm = float(torch.nn.utils.clip_grad_norm_(head.parameters(), args.grad_clip))
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["step"] += 1
        state["tokens"] += batch * args.seq_len
        tokens_run += batch * args.seq_len
        step_times.append(time.time() - t0)
        planned = plan.observe(state)
        if planned:
            log.write({"event": "plan", "step": state["step"], "total_tokens": planned[0], "tokens_per_s": round(planned[1])},
                      f"  plan: {planned[0] / 1e6:.1f}M tokens in all ({steps_planned()} steps) at "
                      f"{planned[1] / 1e3:.0f}K tok/s to end inside the time budget")
        if state["step"] % args.log_every == 0 or state["step"] == 1:
            tps = tokens_run / max(1e-9, time.time() - t_run)
            log.write({"event": "train", "step": state["step"], "loss": round(loss_sum, 4), "accept": round(acc_sum, 4),
                       "lr": lr, "grad_norm": round(gnorm, 3), "tokens_per_s": round(tps)},
                      f"  step {state['step']}/{total_steps if state['total_tokens'] else '?'} loss {loss_sum:.4f} accept {acc_sum:.3f} lr {lr:.2e} "
                      f"gnorm {gnorm:.2f} {tps / 1e3:.0f}K tok/s, {deadline.remaining():.0f}s left")
        if time.time() - t_last_eval >= args.eval_every_s:
            evaluate("eval")
            t_last_eval = time.time()
        if time.time() - t_last_ckpt >= args.checkpoint_every_s:
            checkpoint()
            t_last_ckpt = time.time()

    elapsed = time.time() - t_run
    tps = tokens_run / max(1e-9, elapsed)
    val_loss, val_acc = evaluate("final_eval")
    if best.restore(head, val_acc):
        log.write({"event": "restore_best", "step": state["step"], "best_step": best.step,
                   "val_accept": round(best.score, 4), "last_val_accept": round(val_acc, 4)},
                  f"train_eagle3: val acceptance fell from {best.score:.4f} (step {best.step}) to {val_acc:.4f}: "
                  f"exporting the step-{best.step} weights")
        run["restored_best_step"] = best.step
        val_loss, val_acc = best.extra["loss"], best.score
    run.update({"end_step": state["step"], "tokens": tokens_run, "seconds": round(elapsed, 1), "tokens_per_s": round(tps),
                "stop": stop_reason, "val_loss": round(val_loss, 4), "val_accept": round(val_acc, 4)})
    state["runs"].append(run)
    if not state["total_tokens"]:
        state["total_tokens"] = max(state["tokens"], args.tokens_per_step)
    total_steps = steps_planned()
    state["finished"] = state["step"] >= total_steps
    checkpoint()
    # The exported weights against tools/eagle3_reference.py (what the C++ head is tested against).
    T = min(256, len(val_t) - 1)
    x = val_t[:T][None]
    with torch.no_grad(), ctx():
        target(input_ids=x, use_cache=False)
        feats = capture.features()[0, :-1]
    err = reference_check(head, hc, embed.weight, feats, x[0, 1:])
    if err > 1e-4:
        die(f"the exported head differs from tools/eagle3_reference.py's head_forward: normalized error {err:.3g}")
    log.write({"event": "end", **run, "reference_error": err},
              f"train_eagle3: done ({stop_reason}): step {state['step']}/{total_steps}, val greedy acceptance "
              f"{val_acc:.4f}, {tps / 1e3:.0f}K tok/s; matches eagle3_reference (normalized error {err:.2e}); "
              f"export in {args.out}")


if __name__ == "__main__":
    main()
