#!/usr/bin/env python3
"""Fixed vs adaptive fetch budget on the trained default (issue 31 part 4; docs/sparse.md §13).
Python 3 standard library only.

The same teacher-forced method as tools/eval_trained_model.py (whose server, windows and
comparison it reuses): the held-out text cut into --windows windows of --context tokens, each a
prompt and --forced forced tokens, every forced token a real decode step (lookahead [x_t, draft]
with the trained EAGLE-3 head, sparse KV switched on at --threshold tokens, the draft predictor,
the host KV home: every miss is a fetch over PCIe).
For each fetch ratio (--fetch-ratios) and budget (--sparse-budget fixed, adaptive) it reports the
forced tokens' perplexity (and its ratio to dense), the bytes fetched host -> device
(oasis:sparse_h2d_bytes_total; the CPU counts what CUDA would copy), blocks fetched per sparse
step, the hit rate and the per-layer fetch caps in use at the end (oasis:sparse_fetch_cap).

  tools/eval_fetch_budget.py --bin-dir build/src/server --backend cpu \\
      [--context 4096] [--windows 8] [--forced 256] [--topk 16] [--fetch-ratios 0.0625,0.25,1]

Writes --out-dir/fetch_budget.json and prints a table.
"""
import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import eval_trained_model as etm  # noqa: E402  (Eval: server, windows, forced_run, compare)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build/src/server"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/embedded"))
    ap.add_argument("--draft-model", default=os.path.join(ROOT, "models/embedded-eagle3"))
    ap.add_argument("--text", default=os.path.join(ROOT, ".cache/train/corpus/val.txt.xz"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, ".cache/eval-fetch-budget"))
    ap.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--forced", type=int, default=256)
    ap.add_argument("--topk", type=int, default=16)
    ap.add_argument("--fetch-ratios", default="0.0625,0.25,1")
    ap.add_argument("--budgets", default="fixed,adaptive")
    ap.add_argument("--predictor", default="draft")
    ap.add_argument("--threshold", type=int, default=256)
    ap.add_argument("--host-kv-gib", type=float, default=1.0)
    ap.add_argument("--agreement-interval", type=int, default=0,
                    help="--sparse-agreement-interval of the sparse runs: sample agreement and the fetched "
                         "blocks' use every N steps (0 = never)")
    a = ap.parse_args(argv)
    ratios = [float(x) for x in a.fetch_ratios.split(",")]
    budgets = a.budgets.split(",")
    if a.context - a.forced <= a.threshold:
        ap.error("the window's prompt (context - forced) must exceed --threshold")
    # eval_trained_model's Eval over one context, for its server and comparison helpers.
    a.contexts = [a.context]
    ev = etm.Eval(a)
    t0 = time.time()
    report = {"config": vars(a).copy(), "runs": []}
    s = ev.server([])
    try:
        _, wins = ev.windows(s.base)
        wins = wins[a.context]
        dense = ev.forced_run(s.base, wins)
    finally:
        s.stop()
    report["dense_ppl"], n = etm.perplexity(dense)
    print(f"dense: ppl {report['dense_ppl']:.4f} over {n} forced tokens ({a.windows} windows of "
          f"{a.context})", flush=True)
    for f in ratios:
        for budget in budgets:
            s = ev.server(etm.sparse_flags(a, a.predictor, a.topk, f, a.agreement_interval,
                                           ["--kv-home", "host", "--sparse-budget", budget]))
            try:
                before = s.quiet_metrics()
                got = ev.forced_run(s.base, wins)
                after = s.quiet_metrics()
            finally:
                s.stop()
            rec = ev.compare(a.context, a.predictor, a.topk, f, dense, got, before, after)
            d = lambda name: after.get(name, 0) - before.get(name, 0)  # noqa: E731
            rec["budget"] = budget
            rec["h2d_bytes"] = d("oasis:sparse_h2d_bytes_total")
            rec["blocks_fetched"] = d("oasis:sparse_blocks_fetched_total")
            rec["misses"] = d("oasis:sparse_misses_total")
            rec["fetch_caps"] = etm.layer_counts(after, "oasis:sparse_fetch_cap")
            # Sampled: of the blocks fetched for a step, the share in its real top-K (per layer).
            def layer_delta(name):
                was = etm.layer_counts(before, name)
                return {l: v - was.get(l, 0) for l, v in etm.layer_counts(after, name).items()}
            used, sampled = layer_delta("oasis:sparse_fetch_used_total"), layer_delta("oasis:sparse_fetch_sampled_total")
            rec["fetch_used"], rec["fetch_sampled"] = sum(used.values()), sum(sampled.values())
            rec["fetch_use_by_layer"] = {l: (used.get(l, 0) / n if n else None) for l, n in sorted(sampled.items())}
            rec["ppl_ratio"] = rec["ppl"] / report["dense_ppl"]
            report["runs"].append(rec)
            print(f"  f {f:<7} {budget:8s} ppl {rec['ppl']:.4f} ({rec['ppl_ratio']:.4f} x dense) "
                  f"bytes {rec['h2d_bytes'] / 1e6:9.2f} MB  fetched/step {rec['fetched_per_step']:.2f} "
                  f"hit {etm.fmt(rec['hit_rate'], '{:.3f}')} top-1 {rec['top1_agreement']:.4f} "
                  f"caps {[int(v) for _, v in sorted(rec['fetch_caps'].items())]}"
                  + (f" fetched-used {rec['fetch_used'] / rec['fetch_sampled']:.3f} by layer "
                     f"{[round(v, 3) if v is not None else None for v in rec['fetch_use_by_layer'].values()]}"
                     if rec["fetch_sampled"] else ""), flush=True)
    report["seconds"] = round(time.time() - t0, 1)
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, "fetch_budget.json"), "w") as fp:
        json.dump(report, fp, indent=1)
    print(f"\n| fetch ratio (C) | budget | ppl / dense | bytes fetched (MB) | adaptive / fixed bytes | "
          f"top-1 = dense's | hit rate | caps at the end |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for rec in report["runs"]:
        fixed = next((r for r in report["runs"] if r["fetch_ratio"] == rec["fetch_ratio"] and r["budget"] == "fixed"),
                     None)
        rel = (f"{rec['h2d_bytes'] / fixed['h2d_bytes']:.3f}" if fixed and fixed["h2d_bytes"] and
               rec["budget"] != "fixed" else "")
        c = max(1, math.ceil(rec["fetch_ratio"] * a.topk - 1e-9))
        print(f"| {rec['fetch_ratio']} ({c}) | {rec['budget']} | {rec['ppl_ratio']:.4f} | "
              f"{rec['h2d_bytes'] / 1e6:.2f} | {rel} | {rec['top1_agreement']:.4f} | "
              f"{etm.fmt(rec['hit_rate'], '{:.3f}')} | "
              f"{' '.join(str(int(v)) for _, v in sorted(rec['fetch_caps'].items()))} |")
    print(f"(dense ppl {report['dense_ppl']:.4f}; {report['seconds']} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
