#!/usr/bin/env python3
"""Multi-turn serving with and without prefix caching, same build, same call (issue 33).

Starts oasis-server on dummy weights for an HF config (default: Qwen3-8B's shapes) once with
prefix caching on (the default) and once with --no-enable-prefix-caching, runs the same
`oasis-bench --dataset-name multi-turn` workload against each (conversations whose every turn
resends the whole history plus an increment), scrapes /metrics around each run, and prints a
table last: TTFT p50 / p90 over the turns that follow an earlier one, output tok/s, cached
share, prefix-cache hit rate, and the ratios caching off / caching on.

Workloads (--workload, several allowed; each is "NAME:first_len:increment_len:turns:conversations:concurrency"
or one of the presets):
  8k   turn 1 8,000 tokens, +800 a turn (every later turn shares >= 90% with the one before),
       8 turns (8.0K -> 13.6K), 16 conversations, 8 at once
  24k  turn 1 24,000 tokens, +2,400 a turn, 4 turns (24K -> 31.2K), 8 conversations, 4 at once
  agents  turn 1 8,000 tokens, +800 a turn, 6 turns, 32 conversations all at once: with
       --think-ms the histories of idle conversations outgrow a small GPU pool (--server-args
       "--gpu-memory-utilization 0.35"); --modes on,host compares recomputing evicted
       prefixes with reloading them from the host tier (--host-tier-gib)
The system prompt shared by all conversations is --prefix-len tokens (default 1,000).

On the GPU machine, from the bundle (here: cmake --build build && tools/gpu_suite.sh --bundle;
the device call carries [".bundle-pack"] and runs in the repository root):
  tools/bench_prefix_cache.py --workload 8k --workload 24k --budget-s 540
  tools/bench_prefix_cache.py --workload agents --think-ms 3000 --modes on,host \
    --server-args "--gpu-memory-utilization 0.35" --budget-s 540
writes $OUT/prefix-cache/summary.json and runs.tar.xz (each run's oasis-bench output and result
file, the server logs: the device tool brings back only so many files).
  tools/bench_prefix_cache.py --report DIR ...      prints the table of earlier summary.json files.
Smoke on the CPU (the embedded model):
  tools/bench_prefix_cache.py --bin-dir build --model-config models/embedded/config.json \
    --tokenizer models/embedded --workload tiny:256:48:3:4:2 --output-len 16 --prefix-len 32 \
    --max-model-len 1024
Python 3 standard library only; processes and metrics through tools/bench_long_context.py.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_long_context as lc  # noqa: E402

ROOT = lc.ROOT
PRESETS = {"8k": (8000, 800, 8, 16, 8), "24k": (24000, 2400, 4, 8, 4), "agents": (8000, 800, 6, 32, 32)}
COUNTERS = ("oasis:prefix_cache_queries_total", "oasis:prefix_cache_hits_total",
            "oasis:prefix_cache_evictions_total", "oasis:prompt_tokens_total", "oasis:num_preemptions_total",
            "oasis:prefix_cache_host_hits_total", "oasis:prefix_cache_host_spilled_bytes_total",
            "oasis:prefix_cache_host_reloaded_bytes_total")


def workload(text):
    name, _, rest = text.partition(":")
    if not rest:
        if name not in PRESETS:
            raise argparse.ArgumentTypeError(f"unknown workload {text!r} (presets: {', '.join(PRESETS)})")
        vals = PRESETS[name]
    else:
        try:
            vals = tuple(int(x) for x in rest.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"workload {text!r}: NAME:first:increment:turns:conversations:concurrency")
        if len(vals) != 5 or min(vals) <= 0:
            raise argparse.ArgumentTypeError(f"workload {text!r}: five positive integers after the name")
    first, inc, turns, convs, conc = vals
    return dict(name=name, first_len=first, increment_len=inc, turns=turns, conversations=convs, concurrency=conc)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", action="append", type=workload, help="preset (8k, 24k) or "
                    "NAME:first_len:increment_len:turns:conversations:concurrency (repeatable; default 8k)")
    ap.add_argument("--output-len", type=int, default=128, help="tokens generated per turn")
    ap.add_argument("--prefix-len", type=int, default=1000, help="system prompt shared by all conversations")
    ap.add_argument("--think-ms", type=float, default=0, help="pause between a turn's response and the next "
                    "turn (oasis-bench --multi-turn-think-ms): the conversation's blocks sit unreferenced meanwhile")
    ap.add_argument("--modes", default="on,off", help="servers to run, in this order: on (prefix caching, GPU "
                    "pool only), off (--no-enable-prefix-caching), host (caching with a host tier of "
                    "--host-tier-gib)")
    ap.add_argument("--host-tier-gib", type=float, default=64, help="--prefix-cache-host-gib of the host mode")
    ap.add_argument("--out-dir", default=os.path.join(os.environ.get("OUT", "/tmp"), "prefix-cache"))
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, ".bundle/bin"))
    ap.add_argument("--server-bin", help="oasis-server (default: found under --bin-dir)")
    ap.add_argument("--bench-bin", help="oasis-bench (default: found under --bin-dir)")
    ap.add_argument("--model-config", default=os.path.join(ROOT, "tools/bench/model_configs/qwen3-8b.json"))
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, ".cache/test-data/qwen3"))
    ap.add_argument("--max-model-len", type=int, default=40960)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--vocab-size", type=int, default=0, help="random prompt ids below this (0 = the config's)")
    ap.add_argument("--server-args", default="", help="extra oasis-server flags for both servers")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--run-timeout", type=float, default=600)
    ap.add_argument("--startup-timeout", type=float, default=300)
    ap.add_argument("--budget-s", type=float, default=0, help="stop starting runs after this many seconds")
    ap.add_argument("--report", nargs="+", metavar="DIR")
    a = ap.parse_args(argv)
    a.workload = a.workload or [workload("8k")]
    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not a.modes or any(m not in ("on", "off", "host") for m in a.modes):
        ap.error("--modes takes on, off and host, comma-separated")
    return a


def later_turns_ttft(result):
    """TTFT (ms) of every successful request of turn >= 2: the ones a cache can serve."""
    return sorted(r["ttft_ms"] for r in result.get("requests", [])
                  if r.get("success") and r.get("turn", 1) >= 2 and r.get("ttft_ms") is not None)


def pct(xs, p):
    if not xs:
        return None
    k = max(0, min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def summarize(result, before, after):
    s = result.get("summary", {})
    later = later_turns_ttft(result)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS}
    q = delta["oasis:prefix_cache_queries_total"]
    return dict(completed=s.get("completed"), failed=s.get("failed"), duration_s=s.get("duration"),
                output_tok_s=s.get("output_throughput"), total_tok_s=s.get("total_token_throughput"),
                ttft_p50_ms=s.get("median_ttft_ms"), later_ttft_p50_ms=pct(later, 50),
                later_ttft_p90_ms=pct(later, 90), tpot_p50_ms=s.get("median_tpot_ms"),
                cached_ratio=s.get("cached_token_ratio"), cached_tokens=s.get("total_cached_tokens"),
                input_tokens=s.get("total_input_tokens"),
                hit_rate=(delta["oasis:prefix_cache_hits_total"] / q) if q else None,
                evictions=delta["oasis:prefix_cache_evictions_total"],
                host_hits=delta["oasis:prefix_cache_host_hits_total"],
                host_spilled_gb=delta["oasis:prefix_cache_host_spilled_bytes_total"] / 1e9,
                host_reloaded_gb=delta["oasis:prefix_cache_host_reloaded_bytes_total"] / 1e9,
                preemptions=delta["oasis:num_preemptions_total"], per_turn=s.get("per_turn"))


def fmt(v, spec="{:.1f}"):
    return "-" if v is None else spec.format(v)


def print_table(records, out=sys.stdout):
    print("\nworkload  caching  done  out tok/s  TTFT p50  later TTFT p50/p90 ms  TPOT p50  cached  hit rate  evict"
          "  host hits  spill/reload GB", file=out)
    by = {}
    for r in records:
        by.setdefault(r["workload"], {})[r["caching"]] = r
        m = r.get("summary") or {}
        print(f"{r['workload']:<9} {r['caching']:<8} {fmt(m.get('completed'), '{:d}'):>4}  "
              f"{fmt(m.get('output_tok_s')):>9}  {fmt(m.get('ttft_p50_ms')):>8}  "
              f"{fmt(m.get('later_ttft_p50_ms')):>10} / {fmt(m.get('later_ttft_p90_ms')):<9} "
              f"{fmt(m.get('tpot_p50_ms'), '{:.2f}'):>9}  {fmt(m.get('cached_ratio'), '{:.2f}'):>6}  "
              f"{fmt(m.get('hit_rate'), '{:.2f}'):>8}  {fmt(m.get('evictions'), '{:.0f}'):>5}"
              f"  {fmt(m.get('host_hits'), '{:.0f}'):>9}  {fmt(m.get('host_spilled_gb'), '{:.2f}')}/"
              f"{fmt(m.get('host_reloaded_gb'), '{:.2f}')}"
              + ("" if r["status"] == "ok" else f"  [{r['status']}: {r.get('error', '')}]"), file=out)
    for name, pair in by.items():
        on, off, host = (pair.get(k, {}).get("summary") or {} for k in ("on", "off", "host"))
        if host.get("later_ttft_p50_ms") and on.get("later_ttft_p50_ms") and on.get("output_tok_s"):
            print(f"RESULT prefix_cache {name} host tier: later-turn TTFT p50 {on['later_ttft_p50_ms']:.0f} (GPU "
                  f"pool only) -> {host['later_ttft_p50_ms']:.0f} ms "
                  f"({on['later_ttft_p50_ms'] / host['later_ttft_p50_ms']:.2f}x lower), output "
                  f"{on['output_tok_s']:.0f} -> {host['output_tok_s']:.0f} tok/s, cached "
                  f"{on.get('cached_ratio') or 0:.2f} -> {host.get('cached_ratio') or 0:.2f}, reloaded "
                  f"{host.get('host_reloaded_gb') or 0:.1f} GB", file=out)
        if on.get("later_ttft_p50_ms") and off.get("later_ttft_p50_ms") and on.get("output_tok_s"):
            print(f"RESULT prefix_cache {name}: later-turn TTFT p50 {off['later_ttft_p50_ms']:.0f} -> "
                  f"{on['later_ttft_p50_ms']:.0f} ms ({off['later_ttft_p50_ms'] / on['later_ttft_p50_ms']:.2f}x "
                  f"lower, target >= 5x), output {off['output_tok_s']:.0f} -> {on['output_tok_s']:.0f} tok/s "
                  f"({on['output_tok_s'] / off['output_tok_s']:.2f}x), all-turn TTFT p50 "
                  f"{off.get('ttft_p50_ms') or 0:.0f} -> {on.get('ttft_p50_ms') or 0:.0f} ms", file=out)


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.report:
        records = []
        for d in a.report:
            with open(os.path.join(d, "summary.json") if os.path.isdir(d) else d) as f:
                records += json.load(f)["runs"]
        print_table(records)
        return 0
    t0 = time.time()
    lc.unpack_bundle(a.bin_dir)
    server_bin = a.server_bin or lc.find_binary(a.bin_dir, "oasis-server", ("src/server",))
    bench_bin = a.bench_bin or lc.find_binary(a.bin_dir, "oasis-bench", ("tools/loadgen",))
    env = lc.binary_env(os.path.dirname(server_bin) if a.server_bin else a.bin_dir)
    with open(a.model_config) as f:
        cfg = json.load(f)
    vocab = a.vocab_size or cfg["vocab_size"]
    os.makedirs(a.out_dir, exist_ok=True)
    model_dir = tempfile.mkdtemp(prefix="oasis-pc-model-")
    shutil.copy(a.model_config, os.path.join(model_dir, "config.json"))
    records, nserver = [], 0

    def save():
        lc.write_json(os.path.join(a.out_dir, "summary.json"), {
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:], "runs": records,
            "elapsed_s": time.time() - t0})

    def pack():
        import glob
        import tarfile
        names = sorted(glob.glob(os.path.join(a.out_dir, "*.result.json")) + glob.glob(
            os.path.join(a.out_dir, "*.bench.txt")) + glob.glob(os.path.join(a.out_dir, "server-*.log")))
        if not names:
            return
        with tarfile.open(os.path.join(a.out_dir, "runs.tar.xz"), "w:xz") as t:
            for n in names:
                t.add(n, arcname=os.path.basename(n))
        for n in names:
            os.remove(n)

    try:
        for caching in a.modes:
            if a.budget_s and time.time() - t0 > a.budget_s - 30:
                break
            nserver += 1
            log = os.path.join(a.out_dir, f"server-{caching}.log")
            args = ["--model", model_dir, "--load-format", "dummy", "--served-model-name", "m", "--port", "0",
                    "--max-model-len", str(a.max_model_len), "--max-num-seqs", str(a.max_num_seqs)]
            if a.tokenizer:
                args += ["--tokenizer", a.tokenizer]
            args += {"on": ["--enable-prefix-caching"], "off": ["--no-enable-prefix-caching"],
                     "host": ["--enable-prefix-caching", "--prefix-cache-host-gib", f"{a.host_tier_gib:g}"]}[caching]
            args += a.server_args.split()
            with open(log, "w") as f:
                f.write("# " + " ".join([server_bin] + args) + "\n")
            server = lc.Server(server_bin, args, env, log)
            print(f"[{time.time() - t0:7.1f}s] server (caching {caching}): {' '.join(args)}", flush=True)
            err = server.start(a.startup_timeout)
            if err:
                server.stop(10)
                for w in a.workload:
                    records.append(dict(workload=w["name"], caching=caching, status="failed", error=err))
                save()
                continue
            try:
                # One short request: lazy initialisation stays out of the first run.
                body = json.dumps({"model": "m", "prompt": list(range(1, 17)), "max_tokens": 4}).encode()
                try:
                    urllib.request.urlopen(urllib.request.Request(server.base + "/v1/completions", body, {
                        "Content-Type": "application/json"}), timeout=120).read()
                except (OSError, urllib.error.URLError) as e:
                    print(f"warm-up request failed: {e}", flush=True)
                for w in a.workload:
                    left = a.budget_s - (time.time() - t0) if a.budget_s else a.run_timeout
                    if left < 20:
                        records.append(dict(workload=w["name"], caching=caching, status="skipped",
                                            error="out of budget"))
                        continue
                    rid = f"{w['name']}-{caching}"
                    result_path = os.path.join(a.out_dir, rid + ".result.json")
                    argv = ["--base-url", server.base, "--model", "m", "--endpoint", "/v1/completions",
                            "--dataset-name", "multi-turn",
                            "--multi-turn-conversations", str(w["conversations"]),
                            "--multi-turn-turns", str(w["turns"]),
                            "--multi-turn-first-len", str(w["first_len"]),
                            "--multi-turn-increment-len", str(w["increment_len"]),
                            "--prefix-len", str(a.prefix_len), "--output-len", str(a.output_len),
                            "--multi-turn-think-ms", f"{a.think_ms:g}",
                            "--max-concurrency", str(w["concurrency"]), "--random-vocab-size", str(vocab),
                            "--seed", str(a.seed), "--label", rid, "--result-file", result_path]
                    before = server.quiet_metrics()
                    print(f"[{time.time() - t0:7.1f}s] {rid}: oasis-bench {' '.join(argv)}", flush=True)
                    rc, secs = lc.run_bench(bench_bin, env, argv, os.path.join(a.out_dir, rid + ".bench.txt"),
                                            min(a.run_timeout, left))
                    after = server.quiet_metrics()
                    rec = dict(workload=w["name"], caching=caching, params=w, seconds=secs,
                               status="ok" if rc == 0 else ("timeout" if rc is None else f"rc {rc}"))
                    if os.path.exists(result_path):
                        with open(result_path) as f:
                            rec["summary"] = summarize(json.load(f), before, after)
                    records.append(rec)
                    save()
                    m = rec.get("summary") or {}
                    print(f"[{time.time() - t0:7.1f}s] {rid}: {rec['status']}, {fmt(m.get('output_tok_s'))} tok/s, "
                          f"later-turn TTFT p50 {fmt(m.get('later_ttft_p50_ms'))} ms, cached "
                          f"{fmt(m.get('cached_ratio'), '{:.2f}')}", flush=True)
            finally:
                server.stop()
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
        save()
        pack()
    print_table(records)
    return 0 if records and all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
