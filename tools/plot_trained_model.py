#!/usr/bin/env python3
"""Plots of the trained embedded default (docs/trained_model.md) with gnuplot: its training
curves (tools/train's model_log.jsonl / eagle_log.jsonl, committed in docs/data/trained_model)
and tools/eval_trained_model.py's measurements (eval.json).

  tools/plot_trained_model.py --eval DIR/eval.json [--logs docs/data/trained_model] [--out-dir docs/plots]

Writes trained_training.png (val loss by position bucket over training; the head's greedy
acceptance), trained_agreement.png (top-K agreement with the real query's top-K, draft vs
previous-query, by context and K), trained_agreement_by_layer.png and trained_sparse_ppl.png
(perplexity sparse / dense by K and fetch ratio), with their gnuplot data files beside them.
Needs gnuplot (Debian: gnuplot-nox); Python standard library otherwise. Exit status 2 without
gnuplot.
"""
import argparse
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from plot_long_context import Plotter, gp_quote  # noqa: E402

PAPER = {"draft": 0.960, "previous-query": 0.839}  # the paper's top-20 agreement (published, H100)
STYLE = {"draft": "lw 2", "previous-query": "lw 2 dashtype 2", "oracle": "lw 1 dashtype 3"}


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_training(p, logs):
    model = read_jsonl(os.path.join(logs, "model_log.jsonl"))
    evals = [e for e in model if e.get("event") in ("eval", "final_eval")]
    buckets = list(evals[0]["val_loss_by_position"]) if evals else []
    d = p.data("trained_model_val.dat", "tokens_M val_loss " + " ".join(buckets),
               [[e["tokens"] / 1e6, e["val_loss"]] + [e["val_loss_by_position"].get(b) for b in buckets] for e in evals])
    train = [e for e in model if e.get("event") == "train"]
    t = p.data("trained_model_train.dat", "tokens_M train_loss", [(e["tokens"] / 1e6, e["loss"]) for e in train])
    series = [f"{t} using 1:2 with lines lc rgb '#bbbbbb' title 'train loss'",
              f"{d} using 1:2 with linespoints lw 2 title 'val loss'"]
    series += [f"{d} using 1:{3 + i} with lines title {gp_quote('val loss, positions ' + b)}" for i, b in enumerate(buckets)]
    restore = [e for e in model if e.get("event") == "restore_best"]
    setup = ["set yrange [1.5:8]"]
    if restore:
        best = next((e for e in evals if e["step"] == restore[-1]["best_step"]), None)
        if best:
            setup.append(f"set arrow from {best['tokens'] / 1e6},1.5 to {best['tokens'] / 1e6},8 nohead dashtype 2")
            setup.append(f"set label 'exported (best val)' at {best['tokens'] / 1e6},7.7")
    p.plot("trained_training.png", "training (val loss by position; the export is the best val point)",
           "training tokens (M)", "cross-entropy (nats)", series, setup)
    eagle = read_jsonl(os.path.join(logs, "eagle_log.jsonl"))
    et = [e for e in eagle if e.get("event") == "train"]
    ev = [e for e in eagle if e.get("event") in ("eval", "final_eval")]
    a = p.data("trained_eagle_train.dat", "step accept", [(e["step"], e["accept"]) for e in et])
    b = p.data("trained_eagle_val.dat", "step val_accept", [(e["step"], e["val_accept"]) for e in ev])
    p.plot("trained_eagle_training.png", "EAGLE-3 head: greedy acceptance (draft = target's argmax)", "step",
           "greedy acceptance", [f"{a} using 1:2 with lines title 'train'", f"{b} using 1:2 with linespoints lw 2 title 'val'"],
           ["set yrange [0:1]"])


def plot_eval(p, r):
    ctxs = sorted(r["contexts"], key=int)
    rows = [dict(s, context=int(c)) for c in ctxs for s in r["contexts"][c]["sparse"] if s.get("dense_layers", 0) == 0]
    f0 = r["config"]["fetch_ratios"][0]
    series = []
    for pred in ("draft", "previous-query"):
        for k in r["config"]["topks"]:
            pts = [(s["context"], s["agreement"]) for s in rows
                   if s["predictor"] == pred and s["topk"] == k and s["fetch_ratio"] == f0 and s["agreement"] is not None]
            if pts:
                d = p.data(f"trained_agreement_{pred}_k{k}.dat", "context agreement", pts)
                series.append(f"{d} using 1:2 with linespoints {STYLE[pred]} title {gp_quote(f'{pred}, K={k}')}")
    setup = ["set yrange [0.5:1]", "set logscale x 2", "set xrange [900:4700]", "set xtics (1024, 2048, 4096)"]
    for pred, val in PAPER.items():
        setup.append(f"set arrow from graph 0, first {val} to graph 1, first {val} nohead dashtype 4 lc rgb '#888888'")
        setup.append(f"set label {gp_quote(f'paper (published, H100, top-20): {pred} {val:.1%}')} at graph 0.02, first {val + 0.008} tc rgb '#666666'")
    p.plot("trained_agreement.png", "top-K agreement with the real query's top-K (all layers)",
           "context (tokens; blocks of 16)", "agreement", series, setup)
    kmid = r["config"]["topks"][len(r["config"]["topks"]) // 2]
    series = []
    for c in ctxs:
        for pred in ("draft", "previous-query"):
            s = next((s for s in rows if s["context"] == int(c) and s["predictor"] == pred and s["topk"] == kmid
                      and s["fetch_ratio"] == f0), None)
            if s:
                d = p.data(f"trained_layers_{pred}_{c}.dat", "layer agreement",
                           [(int(l), v) for l, v in s["agreement_by_layer"].items()])
                series.append(f"{d} using 1:2 with linespoints {STYLE[pred]} title {gp_quote(f'{pred}, context {c}')}")
    p.plot("trained_agreement_by_layer.png", f"top-K agreement by layer (K={kmid})", "layer", "agreement", series,
           ["set yrange [0.2:1]", "set xtics 1"])
    series = []
    for c in ctxs:
        dense = r["contexts"][c]["dense"]["ppl"]
        for pred in ("draft", "previous-query", "oracle"):
            pts = [(s["topk"], s["ppl"] / dense) for s in rows
                   if s["context"] == int(c) and s["predictor"] == pred and s["fetch_ratio"] == f0]
            if pts:
                d = p.data(f"trained_ppl_{pred}_{c}.dat", "K ppl_ratio", sorted(pts))
                series.append(f"{d} using 1:2 with linespoints {STYLE[pred]} title {gp_quote(f'{pred}, context {c}')}")
    p.plot("trained_sparse_ppl.png", f"perplexity of held-out text, sparse / dense (fetch ratio {f0})",
           "K (blocks of 16 tokens per layer and KV head)", "perplexity ratio", series,
           ["set logscale x 2", "set xrange [7:37]", "set xtics (8, 16, 32)", "set arrow from graph 0, first 1 to graph 1, first 1 nohead"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval", help="tools/eval_trained_model.py's eval.json")
    ap.add_argument("--logs", default=os.path.join(os.path.dirname(HERE), "docs/data/trained_model"))
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(HERE), "docs/plots"))
    a = ap.parse_args()
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        print("plot_trained_model: gnuplot not found (Debian: apt-get install gnuplot-nox)", file=sys.stderr)
        return 2
    os.makedirs(a.out_dir, exist_ok=True)
    p = Plotter(a.out_dir, "trained default")
    plot_training(p, a.logs)
    if a.eval:
        with open(a.eval) as f:
            plot_eval(p, json.load(f))
    return p.run(gnuplot)


if __name__ == "__main__":
    sys.exit(main())
