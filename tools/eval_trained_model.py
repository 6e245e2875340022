#!/usr/bin/env python3
"""Lookahead agreement, sparse accuracy and draft acceptance of the trained embedded model
(issue 11; docs/trained_model.md, "Measurements"). Python 3 standard library only.

Starts oasis-server on the trained model (models/embedded) and its EAGLE-3 head
(models/embedded-eagle3) in several configurations and sends it held-out text
(tools/train/make_corpus.py's val split) teacher-forced: each window of the text is cut into a
prompt and a forced continuation of --forced tokens ("forced_output_ids", docs/server.md), so
every continuation token goes through the real decode path (lookahead [x_t, draft] steps,
sparse KV and its predictor) and comes back with its log-probability and the top-1 token.
Windows end at each of --contexts tokens (the forced tokens decode at contexts just below).

Measured, per context length:
  dense      the reference: negative log-likelihood (perplexity) of the forced tokens and the
             top-1 token at each position; dense with --lookahead speculate: the head's
             acceptance on the held-out text (draft = the true next token) and, generating
             greedily from the windows' prompts, on the model's own text
  sparse     for each predictor (draft = the lookahead query of the EAGLE-3 draft token,
             previous-query, oracle = the step's real query) x K (--topks) x fetch ratio:
             per-layer top-K agreement of the predicted blocks with the real query's top-K
             (sampled every step: --sparse-agreement-interval 1, counter deltas per context),
             perplexity, top-1 agreement with dense, mean |log-prob - dense|, hit rate and
             blocks fetched per step.
Writes --out-dir/eval.json (everything) and prints tables; --plot runs tools/plot_trained_model.py
(gnuplot) over it.

  tools/eval_trained_model.py --bin-dir build/src/server --out-dir .cache/eval-trained \\
      [--backend cuda] [--contexts 1024,2048,4096] [--windows 4] [--forced 128] [--plot]

The servers run with --max-model-len max(4096, the largest context) (--max-model-len overrides):
contexts past 4096 need a model trained for them, e.g. the 16K variant (--model, --draft-model,
--text; tools/train/run_long_context.sh).

On the GPU machine from the bundle: --bin-dir .bundle/bin (unpacked from .bundle-pack).
The text: --text .cache/train/corpus/val.txt.xz (default; made by tools/train/make_corpus.py).
"""
import argparse
import json
import lzma
import math
import os
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_long_context as blc  # noqa: E402  (Server, binary_env, find_binary, unpack_bundle)

PAPER = {"draft": 0.960, "previous-query": 0.839}  # the paper's top-20 agreement (published, H100)


def post(base, path, body, timeout=600.0):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        raise SystemExit(f"eval_trained_model: {path} answered {e.code}: {e.read()[:500]!r}")


def read_text(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read()


def layer_counts(metrics, name):
    out = {}
    for k, v in metrics.items():
        if k.startswith(name + "{layer="):
            out[int(k[len(name) + 7:-1])] = v
    return out


def perplexity(runs):
    """exp(mean NLL) over forced_run's windows: ([(logprob, top-1)], ...)."""
    nll = [-lp for w in runs for lp, _ in w]
    return math.exp(sum(nll) / len(nll)), len(nll)


def sparse_flags(a, predictor, topk, fetch_ratio, agreement_interval, extra=()):
    """The server flags of a sparse run: every request switches at --threshold, drafts stacked
    (reject) so the draft predictor has its query; the fixed fetch budget unless `extra` names one
    (a.sparse_budget where the tool has that option); `extra` adds to them."""
    budget = [] if "--sparse-budget" in extra else ["--sparse-budget", getattr(a, "sparse_budget", "fixed")]
    return ["--sparse", "on", "--sparse-threshold", str(a.threshold), "--sparse-switch", "threshold",
            "--topk-blocks", str(topk), "--fetch-ratio", str(fetch_ratio), "--sparse-predictor", predictor,
            "--sparse-agreement-interval", str(agreement_interval), "--host-kv-gib", str(a.host_kv_gib),
            "--draft-model", a.draft_model, "--lookahead", "reject", *budget, *extra]


class Eval:
    def __init__(self, a):
        self.a = a
        blc.unpack_bundle(a.bin_dir)
        self.binary = blc.find_binary(a.bin_dir, "oasis-server", ("src/server",))
        self.env = blc.binary_env(a.bin_dir)
        self.env.pop("OASIS_EMBEDDED_MODEL", None)
        os.makedirs(a.out_dir, exist_ok=True)
        self.n_servers = 0
        self.t0 = time.time()

    def server(self, extra):
        self.n_servers += 1
        # tools like eval_fetch_budget.py build their own arguments: 4096 and the server's threads there
        max_len, threads = getattr(self.a, "max_model_len", 0) or 4096, getattr(self.a, "threads", 0)
        args = ["--port", "0", "--log-level", "warn", "--model", self.a.model, "--max-model-len", str(max_len),
                "--max-num-seqs", "8", "--max-num-batched-tokens", "4096"]
        if self.a.backend != "auto":
            args += ["--backend", self.a.backend]
        if self.a.backend == "cuda":
            args += ["--num-kv-slots", "16384"]
        if threads:
            args += ["--threads", str(threads)]
        s = blc.Server(self.binary, args + extra, self.env, os.path.join(self.a.out_dir, f"server-{self.n_servers}.log"))
        err = s.start(300)
        if err:
            raise SystemExit(f"eval_trained_model: {err}\n{s.log_tail()}\n(flags: {' '.join(extra)})")
        return s

    def windows(self, base):
        """{context: [(prompt ids, forced ids)]}: --windows windows per context, evenly spread
        over the held-out token stream (documents joined by <|endoftext|> as in training)."""
        text = read_text(self.a.text)
        ids = post(base, "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
        out = {}
        for ctx in self.a.contexts:
            if ctx > len(ids):
                raise SystemExit(f"eval_trained_model: the text has {len(ids)} tokens, fewer than a {ctx}-token window")
            n = self.a.windows
            step = (len(ids) - ctx) // max(1, n - 1) if n > 1 else 0
            out[ctx] = [(ids[o:o + ctx - self.a.forced], ids[o + ctx - self.a.forced:o + ctx])
                        for o in (i * step for i in range(n))]
        return ids, out

    def forced_run(self, base, wins):
        """Each window's forced continuation: [(logprob, top-1 token)] per window."""
        res = []
        for prompt, forced in wins:
            body = {"prompt": prompt, "forced_output_ids": forced, "max_tokens": len(forced), "temperature": 0,
                    "ignore_eos": True, "logprobs": 1, "return_tokens_as_token_ids": True}
            lp = post(base, "/v1/completions", body)["choices"][0]["logprobs"]
            tops = []
            for alt in lp["top_logprobs"]:
                best = max(alt.items(), key=lambda kv: kv[1])[0] if alt else None
                tops.append(best)
            res.append(list(zip(lp["token_logprobs"], tops)))
        return res

    def run(self):
        a, report = self.a, {"config": vars(self.a).copy(), "contexts": {}}
        # ---- dense reference, and the stream of windows
        s = self.server([])
        try:
            ids, wins = self.windows(s.base)
            report["text_tokens"] = len(ids)
            dense = {ctx: self.forced_run(s.base, wins[ctx]) for ctx in a.contexts}
        finally:
            s.stop()
        for ctx in a.contexts:
            ppl, n = perplexity(dense[ctx])
            report["contexts"][str(ctx)] = {"dense": {"ppl": ppl, "tokens": n}, "sparse": []}
        # ---- the head's acceptance (dense, --lookahead speculate)
        s = self.server(["--draft-model", a.draft_model, "--lookahead", "speculate"])
        try:
            for ctx in a.contexts:
                before = s.quiet_metrics()
                self.forced_run(s.base, wins[ctx])
                mid = s.quiet_metrics()
                for prompt, _ in wins[ctx]:
                    post(s.base, "/v1/completions", {"prompt": prompt, "max_tokens": a.forced, "temperature": 0,
                                                     "ignore_eos": True})
                after = s.quiet_metrics()

                def rate(m0, m1):
                    d = m1.get("oasis:spec_decode_num_draft_tokens_total", 0) - m0.get("oasis:spec_decode_num_draft_tokens_total", 0)
                    acc = m1.get("oasis:spec_decode_num_accepted_tokens_total", 0) - m0.get("oasis:spec_decode_num_accepted_tokens_total", 0)
                    return {"drafts": d, "accepted": acc, "rate": acc / d if d else None}
                report["contexts"][str(ctx)]["acceptance"] = {"held_out_text": rate(before, mid),
                                                              "own_greedy_text": rate(mid, after)}
        finally:
            s.stop()
        # ---- sparse configurations
        configs = [(p, k, a.fetch_ratios[0], 0) for p in a.predictors for k in a.topks]
        configs += [(p, a.topks[len(a.topks) // 2], f, 0) for f in a.fetch_ratios[1:] for p in a.predictors
                    if p != "oracle"]
        configs += [(a.predictors[0], a.topks[len(a.topks) // 2], a.fetch_ratios[0], n) for n in a.dense_layers if n > 0]
        for predictor, k, f, dense_layers in configs:
            if a.budget_s and time.time() - self.t0 > a.budget_s:
                print(f"eval_trained_model: --budget-s reached, {predictor} K {k} fetch {f} and later not run", flush=True)
                break
            home = ["--kv-home", a.kv_home] if a.kv_home else []
            s = self.server(sparse_flags(a, predictor, k, f, 1, ["--dense-layers", str(dense_layers), *home]))
            try:
                for ctx in a.contexts:
                    before = s.quiet_metrics()
                    got = self.forced_run(s.base, wins[ctx])
                    after = s.quiet_metrics()
                    rec = self.compare(ctx, predictor, k, f, dense[ctx], got, before, after)
                    rec["dense_layers"] = dense_layers
                    report["contexts"][str(ctx)]["sparse"].append(rec)
                    print(f"  {ctx:5d} {predictor:14s} K {k:3d} f {f:<5} dense layers {dense_layers} agreement {fmt(rec['agreement'])} "
                          f"ppl {rec['ppl']:.3f} (dense {report['contexts'][str(ctx)]['dense']['ppl']:.3f}) "
                          f"top-1 {rec['top1_agreement']:.4f} hit {fmt(rec['hit_rate'])}", flush=True)
            finally:
                s.stop()
        report["seconds"] = round(time.time() - self.t0, 1)
        with open(os.path.join(a.out_dir, "eval.json"), "w") as fp:
            json.dump(report, fp, indent=1)
        print_tables(report)
        if a.plot:
            plot(a.out_dir)
        return report

    def compare(self, ctx, predictor, k, f, dense, got, before, after):
        d = lambda name: after.get(name, 0) - before.get(name, 0)  # noqa: E731
        if d("oasis:sparse_switches_total") < len(got):
            raise SystemExit(f"eval_trained_model: only {d('oasis:sparse_switches_total'):.0f} of {len(got)} requests "
                             f"went sparse at context {ctx} (threshold {self.a.threshold})")
        def layer_deltas(name):
            b0 = layer_counts(before, name)
            return {l: v - b0.get(l, 0) for l, v in layer_counts(after, name).items()}
        ov = layer_deltas("oasis:sparse_topk_agreement_overlap_total")
        tot = layer_deltas("oasis:sparse_topk_agreement_sampled_total")
        by_layer = {l: ov[l] / tot[l] for l in sorted(tot) if tot[l] > 0}
        pairs = [(g, r) for gw, rw in zip(got, dense) for g, r in zip(gw, rw)]
        hits, misses = d("oasis:sparse_hits_total"), d("oasis:sparse_misses_total")
        steps = d("oasis:sparse_steps_total")
        return {"predictor": predictor, "topk": k, "fetch_ratio": f, "blocks": ctx // 16,
                "agreement": sum(ov.values()) / sum(tot.values()) if sum(tot.values()) else None,
                "agreement_by_layer": by_layer, "ppl": perplexity(got)[0],
                "top1_agreement": sum(g[1] == r[1] for g, r in pairs) / len(pairs),
                "mean_abs_logprob_diff": sum(abs(g[0] - r[0]) for g, r in pairs) / len(pairs),
                "hit_rate": hits / (hits + misses) if hits + misses else None,
                "fetched_per_step": d("oasis:sparse_blocks_fetched_total") / steps if steps else None,
                "sparse_steps": steps}


def fmt(v, spec="{:.4f}"):
    return "-" if v is None else spec.format(v)


def print_tables(r):
    print("\n== dense: perplexity of the forced tokens; the head's greedy acceptance")
    print(f"{'context':>7} {'ppl':>8} {'accept (held-out)':>18} {'accept (own text)':>18}")
    for ctx, c in r["contexts"].items():
        acc = c.get("acceptance", {})
        print(f"{ctx:>7} {c['dense']['ppl']:8.3f} {fmt((acc.get('held_out_text') or {}).get('rate')):>18} "
              f"{fmt((acc.get('own_greedy_text') or {}).get('rate')):>18}")
    print("\n== sparse: top-K agreement with the real query's top-K (per layer: first..last), accuracy vs dense")
    print(f"{'context':>7} {'predictor':>14} {'K':>4} {'f':>5} {'dl':>3} {'agree':>7} {'by layer':>40} {'ppl':>8} "
          f"{'ppl/dense':>9} {'top-1':>7} {'hit':>6}")
    for ctx, c in r["contexts"].items():
        for s in c["sparse"]:
            layers = " ".join(f"{v:.2f}" for v in s["agreement_by_layer"].values())
            print(f"{ctx:>7} {s['predictor']:>14} {s['topk']:4d} {s['fetch_ratio']:5} {s.get('dense_layers', 0):3d} "
                  f"{fmt(s['agreement']):>7} "
                  f"{layers:>40} {s['ppl']:8.3f} {s['ppl'] / c['dense']['ppl']:9.4f} {s['top1_agreement']:7.4f} "
                  f"{fmt(s['hit_rate'], '{:.3f}'):>6}")
    print(f"(the paper, published on H100, top-20 blocks: draft {PAPER['draft']:.1%} (98.74% with the draft query "
          f"propagated along the working set), previous query {PAPER['previous-query']:.1%})")


def plot(out_dir):
    """tools/plot_trained_model.py (gnuplot) over eval.json, when gnuplot is installed."""
    import shutil
    import subprocess
    if not shutil.which("gnuplot"):
        print("eval_trained_model: no gnuplot here: plot later with tools/plot_trained_model.py --eval "
              f"{os.path.join(out_dir, 'eval.json')}", flush=True)
        return
    subprocess.run([sys.executable, os.path.join(HERE, "plot_trained_model.py"), "--eval",
                    os.path.join(out_dir, "eval.json"), "--out-dir", out_dir], check=False)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build/src/server"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/embedded"))
    ap.add_argument("--draft-model", default=os.path.join(ROOT, "models/embedded-eagle3"))
    ap.add_argument("--text", default=os.path.join(ROOT, ".cache/train/corpus/val.txt.xz"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, ".cache/eval-trained"))
    ap.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--contexts", default="1024,2048,4096")
    ap.add_argument("--windows", type=int, default=4, help="windows per context")
    ap.add_argument("--forced", type=int, default=128, help="teacher-forced tokens at the end of each window")
    ap.add_argument("--topks", default="8,16,32")
    ap.add_argument("--fetch-ratios", default="0.05,0.25,1", help="the first for every K, the others at the middle K")
    ap.add_argument("--predictors", default="draft,previous-query,oracle")
    ap.add_argument("--dense-layers", default="0",
                    help="--dense-layers values; each N > 0 adds a run of the first predictor at the middle K")
    ap.add_argument("--threshold", type=int, default=256, help="--sparse-threshold (below every window's prompt)")
    ap.add_argument("--host-kv-gib", type=float, default=1.0)
    ap.add_argument("--kv-home", default="", choices=["", "host", "hbm", "auto"],
                    help="the sparse runs' --kv-home (default: the server's, auto: in place while the pool has "
                         "room, every predicted block a hit); host: every miss a fetch under --fetch-ratio's cap, "
                         "as every run before --kv-home existed (eval_h200.json, 2026-11-30)")
    ap.add_argument("--sparse-budget", default="fixed", choices=["fixed", "adaptive"],
                    help="the sparse runs' --sparse-budget (default fixed: every layer fetches up to C, so the "
                         "predictors and K are compared at the same caps; the server's default is adaptive, "
                         "tools/eval_fetch_budget.py compares the two)")
    ap.add_argument("--budget-s", type=float, default=0, help="stop starting sparse configurations after this")
    ap.add_argument("--max-model-len", type=int, default=0,
                    help="the servers' --max-model-len (0 = the largest of 4096 and --contexts; at most the model's "
                         "max_position_embeddings)")
    ap.add_argument("--threads", type=int, default=0, help="the servers' --threads (0 = the server's default)")
    ap.add_argument("--plot", action="store_true")
    a = ap.parse_args(argv)
    a.contexts = [int(x) for x in a.contexts.split(",")]
    a.topks = [int(x) for x in a.topks.split(",")]
    a.fetch_ratios = [float(x) for x in a.fetch_ratios.split(",")]
    a.predictors = a.predictors.split(",")
    a.dense_layers = [int(x) for x in a.dense_layers.split(",")]
    a.max_model_len = a.max_model_len or max(4096, max(a.contexts))
    if max(a.contexts) > a.max_model_len:
        ap.error(f"--max-model-len {a.max_model_len} is below the largest context {max(a.contexts)}")
    if min(a.contexts) - a.forced <= a.threshold:
        ap.error("every window's prompt (context - forced) must exceed --threshold, so all forced tokens decode sparse")
    return a


if __name__ == "__main__":
    Eval(parse_args(sys.argv[1:])).run()
