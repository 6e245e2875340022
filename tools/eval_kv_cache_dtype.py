#!/usr/bin/env python3
"""Accuracy of the FP8 KV cache on the trained default (issue 34; docs/fp8.md). Python 3
standard library only; reuses tools/eval_trained_model.py's server driver and windows.

Held-out text (tools/train/make_corpus.py's val split), teacher-forced through the real decode
path: each window's last --forced tokens are forced continuation tokens ("forced_output_ids")
whose log-probabilities and top-1 tokens come back. Four servers, one after the other:
  dense auto   the reference (f32 KV on the CPU reference, bf16 on CUDA)
  dense fp8    --kv-cache-dtype fp8
  sparse auto  --sparse on, every request sparse (draft predictor, K = --topk, --fetch-ratio)
  sparse fp8   the same with --kv-cache-dtype fp8
Reported per context and configuration: perplexity of the forced tokens, its ratio to the
reference (and, for sparse fp8, to sparse auto), top-1 agreement with the reference and mean
|log-prob - reference|. Writes --out-dir/eval_kv_dtype.json.

  tools/eval_kv_cache_dtype.py --bin-dir build/src/server [--backend cpu|cuda]
      [--contexts 1024,2048,4096] [--windows 4] [--forced 128] [--topk 16] [--fetch-ratio 0.05]
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import eval_trained_model as etm  # noqa: E402


def compare(ref, got):
    pairs = [(g, r) for gw, rw in zip(got, ref) for g, r in zip(gw, rw)]
    return {"ppl": etm.perplexity(got)[0],
            "top1_agreement": sum(g[1] == r[1] for g, r in pairs) / len(pairs),
            "mean_abs_logprob_diff": sum(abs(g[0] - r[0]) for g, r in pairs) / len(pairs),
            "tokens": len(pairs)}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build/src/server"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/embedded"))
    ap.add_argument("--draft-model", default=os.path.join(ROOT, "models/embedded-eagle3"))
    ap.add_argument("--text", default=os.path.join(ROOT, ".cache/train/corpus/val.txt.xz"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, ".cache/eval-kv-dtype"))
    ap.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--contexts", default="1024,2048,4096")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--forced", type=int, default=128)
    ap.add_argument("--topk", type=int, default=16)
    ap.add_argument("--fetch-ratio", type=float, default=0.05)
    ap.add_argument("--threshold", type=int, default=256)
    ap.add_argument("--host-kv-gib", type=float, default=1.0)
    a = ap.parse_args(argv)
    a.contexts = [int(x) for x in a.contexts.split(",")]
    if min(a.contexts) - a.forced <= a.threshold:
        ap.error("every window's prompt (context - forced) must exceed --threshold")
    ev = etm.Eval(a)
    sparse = etm.sparse_flags(a, "draft", a.topk, a.fetch_ratio, 64)
    configs = [("dense", "auto", []), ("dense", "fp8", ["--kv-cache-dtype", "fp8"]),
               ("sparse", "auto", sparse), ("sparse", "fp8", sparse + ["--kv-cache-dtype", "fp8"])]
    runs, wins = {}, None
    for kind, dtype, flags in configs:
        s = ev.server(flags)
        try:
            if wins is None:
                _, wins = ev.windows(s.base)
            runs[(kind, dtype)] = {ctx: ev.forced_run(s.base, wins[ctx]) for ctx in a.contexts}
            if kind == "sparse":
                m = s.quiet_metrics()
                if m.get("oasis:sparse_switches_total", 0) < a.windows * len(a.contexts):
                    raise SystemExit(f"eval_kv_cache_dtype: not every request went sparse ({kind} {dtype})")
        finally:
            s.stop()
    report = {"config": {k: v for k, v in vars(a).items()}, "contexts": {}}
    print(f"{'context':>7} {'kv':>6} {'dtype':>5} {'ppl':>8} {'/dense':>8} {'/same kv':>8} {'top-1':>7} {'|dlp|':>7}")
    for ctx in a.contexts:
        ref = runs[("dense", "auto")][ctx]
        rows = {}
        for kind, dtype, _ in configs:
            r = compare(ref, runs[(kind, dtype)][ctx])
            base = compare(ref, runs[(kind, "auto")][ctx])
            r["ppl_ratio"] = r["ppl"] / compare(ref, ref)["ppl"]
            r["ppl_ratio_same_kv"] = r["ppl"] / base["ppl"]
            rows[f"{kind}_{dtype}"] = r
            print(f"{ctx:7d} {kind:>6} {dtype:>5} {r['ppl']:8.4f} {r['ppl_ratio']:8.4f} {r['ppl_ratio_same_kv']:8.4f} "
                  f"{r['top1_agreement']:7.4f} {r['mean_abs_logprob_diff']:7.4f}")
        report["contexts"][str(ctx)] = rows
    with open(os.path.join(a.out_dir, "eval_kv_dtype.json"), "w") as fp:
        json.dump(report, fp, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
