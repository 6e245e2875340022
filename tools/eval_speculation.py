#!/usr/bin/env python3
"""Speculation with real acceptance: tokens per step and TPOT by chain length k on a trained model.

For each KV mode (dense; sparse: every request sparse past --threshold, the draft predictor) and
each k in --ks (0 = no speculation: plain decoding for dense, `--lookahead reject` for sparse, the
paper's forced rejection), one oasis-server runs the model with its EAGLE-3 head
(`--lookahead speculate --num-speculative-tokens k`), and oasis-bench sends --prompts requests
of --prompt-len tokens cut from held-out text (the same prompts for every server), --output-len
tokens each, at --concurrency, for every temperature in --temperatures. From the bench result
and the server's /metrics (before / after, deltas) it reports median TPOT, output tok/s, tokens
emitted per request decode step (dense and sparse requests apart), the acceptance rate and the
drafts accepted by chain position; TPOT is also given as a ratio to k = 0's in the same mode.

  tools/eval_speculation.py --bin-dir build/src/server --bench-bin build/tools/loadgen/oasis-bench \\
      --backend cpu --text .cache/train/corpus/val.txt.xz --prompts 4 --output-len 64
  On the GPU machine from the bundle (oasis-server + oasis-bench): --bin-dir .bundle/bin --backend cuda

The model is the trained default (models/embedded, its head models/embedded-eagle3) unless
--model / --draft-model say otherwise; the held-out text is made by tools/train/fetch_corpus.sh and
make_corpus.py (docs/trained_model.md). Writes --out-dir/speculation.json and prints a table.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_long_context as blc  # noqa: E402
import eval_trained_model as etm  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def delta(m0, m1, key):
    return m1.get(key, 0.0) - m0.get(key, 0.0)


def mode_flags(a, kv, k):
    # Every temperature sends the same prompts: without the prefix cache each run prefills them.
    flags = ["--no-enable-prefix-caching"] + a.server_args.split()
    if k > 0:
        flags += ["--draft-model", a.draft_model, "--lookahead", "speculate", "--num-speculative-tokens", str(k)]
    elif kv == "sparse":
        flags += ["--draft-model", a.draft_model, "--lookahead", "reject"]
    if kv == "sparse":
        flags += ["--sparse", "on", "--sparse-threshold", str(a.threshold), "--sparse-switch", "threshold",
                  "--topk-blocks", str(a.topk), "--sparse-predictor", "draft", "--host-kv-gib", str(a.host_kv_gib)]
        if a.kv_home:
            flags += ["--kv-home", a.kv_home]
    return flags


def prompts_file(a, ev, path):
    """--prompts prompts of --prompt-len token ids, evenly spread over the held-out token stream
    (--synthetic-prompts: ids of a fixed arithmetic pattern instead, no text needed)."""
    if a.synthetic_prompts:
        with open(path, "w") as f:
            for i in range(a.prompts):
                ids = [(97 * i + 31 * j + 5) % 8000 + 1 for j in range(a.prompt_len)]
                f.write(json.dumps({"prompt": ids, "output_len": a.output_len}) + "\n")
        return 0
    s = ev.server([])
    try:
        ids = etm.post(s.base, "/tokenize", {"prompt": etm.read_text(a.text), "add_special_tokens": False})["tokens"]
    finally:
        s.stop()
    if len(ids) < a.prompt_len:
        raise SystemExit(f"eval_speculation: the text has {len(ids)} tokens, fewer than --prompt-len {a.prompt_len}")
    step = (len(ids) - a.prompt_len) // max(1, a.prompts - 1) if a.prompts > 1 else 0
    with open(path, "w") as f:
        for i in range(a.prompts):
            o = i * step
            f.write(json.dumps({"prompt": ids[o:o + a.prompt_len], "output_len": a.output_len}) + "\n")
    return len(ids)


def run_one(a, ev, bench_bin, kv, k, prompts_path):
    s = ev.server(mode_flags(a, kv, k))
    rows = []
    try:
        # One request first: whatever the first steps of a server set up is not measured.
        etm.post(s.base, "/v1/completions", {"prompt": "In the beginning", "max_tokens": 16, "temperature": 0})
        for t in a.temperatures:
            before = s.quiet_metrics()
            tag = f"{kv}-k{k}-t{t:g}"
            res_path = os.path.join(a.out_dir, tag + ".bench.json")
            argv = ["--base-url", s.base, "--dataset", "jsonl", "--dataset-path", prompts_path,
                    "--num-prompts", str(a.prompts), "--max-concurrency", str(a.concurrency), "--temperature", f"{t:g}",
                    "--ignore-eos", "--no-progress", "--seed", "0", "--save-text", "--result-file", res_path] + a.bench_args.split()
            rc, secs = blc.run_bench(bench_bin, ev.env, argv, os.path.join(a.out_dir, tag + ".bench.txt"), a.run_timeout)
            after = s.quiet_metrics()
            result = json.load(open(res_path)) if rc == 0 and os.path.exists(res_path) else {}
            summary = blc.summarize_bench(result) if result else {}
            texts = {str(q.get("index")): q.get("generated_text") for q in result.get("requests", [])}
            steps = {x: delta(before, after, f"oasis:spec_decode_num_steps_by_kv_total{{kv={x}}}") for x in ("dense", "sparse")}
            tokens = {x: delta(before, after, f"oasis:spec_decode_num_emitted_tokens_by_kv_total{{kv={x}}}")
                      for x in ("dense", "sparse")}
            drafts = delta(before, after, "oasis:spec_decode_num_draft_tokens_total")
            accepted = delta(before, after, "oasis:spec_decode_num_accepted_tokens_total")
            per_pos = [(delta(before, after, f"oasis:spec_decode_num_accepted_tokens_per_pos{{position={j}}}"),
                        delta(before, after, f"oasis:spec_decode_num_draft_tokens_per_pos{{position={j}}}"))
                       for j in range(max(k, 1))]
            row = {"kv": kv, "k": k, "temperature": t, "rc": rc, "seconds": secs,
                   "completed": summary.get("completed"), "failed": summary.get("failed"),
                   "median_tpot_ms": summary.get("median_tpot_ms"), "mean_tpot_ms": summary.get("mean_tpot_ms"),
                   "output_throughput": summary.get("output_throughput"),
                   "steps_by_kv": steps, "tokens_by_kv": tokens,
                   "tokens_per_step": {x: tokens[x] / steps[x] if steps[x] else None for x in steps},
                   "acceptance": accepted / drafts if drafts else None,
                   "accepted_by_position": [[int(x), int(y)] for x, y in per_pos],
                   "sparse_steps": delta(before, after, "oasis:sparse_steps_total"), "texts": texts}
            rows.append(row)
            print(f"eval_speculation: {tag}: {json.dumps({x: row[x] for x in ('median_tpot_ms', 'output_throughput', 'tokens_per_step', 'acceptance', 'accepted_by_position')})}",
                  flush=True)
    finally:
        s.stop()
    return rows


def same_outputs(rows):
    """Greedy rows: how many requests' texts equal the k = 0 server's in the same KV mode
    (dense speculation is lossless, so all of them up to bf16 near-ties; sparse k = 0 is reject,
    whose working sets follow another path, so there it is a comparison, not a check)."""
    base = {r["kv"]: r.get("texts") or {} for r in rows if r["k"] == 0 and r["temperature"] == 0}
    for r in rows:
        b, t = base.get(r["kv"]), r.get("texts") or {}
        if r["k"] > 0 and r["temperature"] == 0 and b:
            r["same_text_as_k0"] = [sum(1 for i, x in t.items() if b.get(i) == x), len(t)]


def print_table(rows):
    base = {(r["kv"], r["temperature"]): r.get("median_tpot_ms") for r in rows if r["k"] == 0}
    print("\nkv      k     T  TPOT ms  x k=0   tok/s  tok/step (dense/sparse)  accept  same text as k=0  accepted by position")
    for r in rows:
        b, tp = base.get((r["kv"], r["temperature"])), r.get("median_tpot_ms")
        ratio = f"{tp / b:5.2f}" if tp and b else "    -"
        tps = "/".join(f"{v:.2f}" if v else "-" for v in r["tokens_per_step"].values())
        acc = f"{r['acceptance']:.3f}" if r["acceptance"] is not None else "-"
        pos = " ".join(f"{x}/{y}" for x, y in r["accepted_by_position"]) if r["k"] else "-"
        same = "{}/{}".format(*r["same_text_as_k0"]) if "same_text_as_k0" in r else "-"
        print(f"{r['kv']:<7} {r['k']:>1} {r['temperature']:>5g} {blc.fmt(tp, '{:8.3f}'):>8} {ratio}  "
              f"{blc.fmt(r.get('output_throughput'), '{:7.1f}'):>7}  {tps:>23}  {acc:>6}  {same:>16}  {pos}")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build/src/server"))
    ap.add_argument("--bench-bin", default="", help="oasis-bench (default: beside oasis-server, or build/tools/loadgen)")
    ap.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--model", default=os.path.join(ROOT, "models/embedded"))
    ap.add_argument("--draft-model", default=os.path.join(ROOT, "models/embedded-eagle3"))
    ap.add_argument("--text", default=os.path.join(ROOT, ".cache/train/corpus/val.txt.xz"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, ".cache/eval-speculation"))
    ap.add_argument("--kv", default="dense,sparse", help="KV modes: dense, sparse")
    ap.add_argument("--ks", default="0,1,2,3,4", help="chain lengths; 0 = no speculation (sparse: reject)")
    ap.add_argument("--temperatures", default="0,0.8")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--threshold", type=int, default=256, help="sparse: --sparse-threshold")
    ap.add_argument("--topk", type=int, default=16, help="sparse: --topk-blocks")
    ap.add_argument("--kv-home", default="", choices=["", "host", "hbm", "auto"])
    ap.add_argument("--host-kv-gib", type=float, default=1.0)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--run-timeout", type=float, default=600)
    ap.add_argument("--synthetic-prompts", action="store_true",
                    help="prompts of pattern ids (97 i + 31 j + 5) mod 8000 + 1, not held-out text")
    ap.add_argument("--server-args", default="", help="more oasis-server flags for every server")
    ap.add_argument("--bench-args", default="", help="more oasis-bench flags for every run")
    a = ap.parse_args(argv)
    a.kv_modes = [x for x in a.kv.split(",") if x]
    a.k_list = [int(x) for x in a.ks.split(",") if x]
    a.temperatures = [float(x) for x in a.temperatures.split(",") if x]
    bad = [x for x in a.kv_modes if x not in ("dense", "sparse")] + [k for k in a.k_list if not 0 <= k <= 4]
    if bad or not a.kv_modes or not a.k_list or not a.temperatures:
        ap.error(f"--kv takes dense,sparse; --ks 0..4; --temperatures at least one (bad: {bad})")
    if min(a.prompts, a.prompt_len, a.output_len, a.concurrency) < 1:
        ap.error("--prompts, --prompt-len, --output-len and --concurrency must be positive")
    if a.prompt_len + a.output_len + 5 > a.max_model_len:
        ap.error(f"--prompt-len + --output-len + 5 must fit --max-model-len {a.max_model_len}")
    return a


def main(argv):
    a = parse_args(argv)
    os.makedirs(a.out_dir, exist_ok=True)
    ev = etm.Eval(a)
    bench_bin = a.bench_bin or blc.find_binary(a.bin_dir, "oasis-bench", ("../../tools/loadgen",))
    prompts_path = os.path.join(a.out_dir, "prompts.jsonl")
    n = prompts_file(a, ev, prompts_path)
    t0, rows = time.time(), []
    for kv in a.kv_modes:
        for k in a.k_list:
            rows += run_one(a, ev, bench_bin, kv, k, prompts_path)
    same_outputs(rows)
    report = {"config": {x: v for x, v in vars(a).items()}, "text_tokens": n, "seconds": time.time() - t0, "rows": rows}
    blc.write_json(os.path.join(a.out_dir, "speculation.json"), report)
    print_table(rows)
    bad = [r for r in rows if r["rc"] != 0 or r.get("failed")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
