#!/usr/bin/env python3
"""Disaggregated prefill/decode benchmark (issue 13, docs/disaggregation.md): remote partial
fetch (RPF) against full KV transfer at admission.

For every (input length, fetch ratio, mode) it starts a prefill instance on one GPU, a decode
instance on another (--rpf on or off) and oasis-router in front, then runs oasis-bench against
the router at each request rate (random prompts, fixed output length) and reads the three
processes' /metrics before and after. Per run it reports output throughput, TTFT (the client's,
through the router), the bytes a request moved at admission and by drift, the bytes staged per
request on the prefill side, and the decode side's host KV: per request (what each imported
request held when it finished; remote blocks on summary-only rows hold none) and the peak of all
imported requests together.

  tools/bench_disagg.py --inputs 32768 --output-len 2048 --rates 0.25 --modes rpf,full \\
      --fetch-ratios 0.05 --num-prompts 8 --budget-s 500 --pack

Prefix caching on the decode instance (docs/prefix_caching.md, "The decode side"): with
--prefix-lens every prompt starts with a shared prefix of that many tokens (of --inputs in
all; oasis-bench --random-prefix-len), and --decode-prefix-caching on,off runs the decode
instance with and without it; the report gains the prompt tokens per request the decode
instance held already (not fetched):

  tools/bench_disagg.py --inputs 16384 --prefix-lens 0,8192,12288 --decode-prefix-caching on,off ...

On a machine with one GPU (or the CPU, --server-args "--backend cpu") both instances share it.
Results: <out-dir>/summary.json and runs/ (oasis-bench's files, server logs), like
tools/bench_long_context.py, whose process and metrics helpers this reuses.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_long_context as lc  # noqa: E402

GIB = float(1 << 30)


def counters(m, prefix):
    return {k: v for k, v in m.items() if k.startswith(prefix)}


def delta(before, after, key):
    return after.get(key, 0.0) - before.get(key, 0.0)


def staged_lease_total(after, before):
    return sum(delta(before, after, f"oasis:staging_pool_leases_total{{end={e}}}") for e in ("completed", "aborted", "expired"))


def host_slot_bytes(cfg, dtype_bytes):
    """Host KV store bytes of one head-block in every layer (K and V)."""
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * 16 * head_dim * dtype_bytes * cfg["num_hidden_layers"]


class Bench:
    def __init__(self, a):
        self.a = a
        self.t0 = time.time()
        self.deadline = self.t0 + a.budget_s if a.budget_s > 0 else None
        lc.unpack_bundle(a.bin_dir)
        self.server_bin = a.server_bin or lc.find_binary(a.bin_dir, "oasis-server", ("src/server",))
        self.router_bin = a.router_bin or lc.find_binary(a.bin_dir, "oasis-router", ("src/router",))
        self.bench_bin = a.bench_bin or lc.find_binary(a.bin_dir, "oasis-bench", ("tools/loadgen",))
        self.env = lc.binary_env(os.path.dirname(self.server_bin) if a.server_bin else a.bin_dir)
        with open(a.model_config) as f:
            self.cfg = json.load(f)
        self.vocab = a.vocab_size or self.cfg["vocab_size"]
        os.makedirs(os.path.join(a.out_dir, "runs"), exist_ok=True)
        self.model_dir = tempfile.mkdtemp(prefix="oasis-disagg-model-")
        shutil.copy(a.model_config, os.path.join(self.model_dir, "config.json"))
        self.records, self.n_logs, self.live = [], 0, []

    def remaining(self):
        return None if self.deadline is None else self.deadline - time.time()

    def log(self, msg):
        print(f"[{time.time() - self.t0:7.1f}s] {msg}", flush=True)

    def save(self):
        lc.write_json(os.path.join(self.a.out_dir, "summary.json"), {
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:], "model_config": self.a.model_config,
            "elapsed_s": time.time() - self.t0, "runs": self.records})

    def start(self, binary, args, gpu, name):
        self.n_logs += 1
        log = os.path.join(self.a.out_dir, f"server-{self.n_logs}-{name}.log")
        with open(log, "w") as f:
            f.write("# " + " ".join([binary] + args) + "\n")
        env = dict(self.env)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        p = lc.Server(binary, args, env, log)
        self.live.append(p)
        limit = self.a.startup_timeout if self.remaining() is None else max(1.0, min(self.a.startup_timeout, self.remaining()))
        err = p.start(limit)
        if err:
            return None, f"{name}: {err}: {p.log_tail(6)}"
        self.log(f"{name} ready in {p.startup_s:.1f} s at {p.base}")
        return p, None

    def stop_all(self):
        for p in self.live:
            p.stop(30)
        self.live = []

    def instance_args(self, role, input_len, fetch_ratio, mode, caching="on"):
        a = self.a
        args = ["--model", self.model_dir, "--load-format", "dummy", "--served-model-name", "m", "--port", "0",
                "--max-model-len", str(input_len + a.output_len + 64), "--max-num-seqs", str(a.max_num_seqs),
                "--role", role, "--topk-blocks", str(a.topk), "--fetch-ratio", f"{fetch_ratio:g}",
                "--draft-load-format", "dummy", "--draft-vocab-size", str(a.draft_vocab_size), "--lookahead", "reject"]
        if a.tokenizer:
            args += ["--tokenizer", a.tokenizer]
        if role == "prefill":
            args += ["--staging-listen", "127.0.0.1:0", "--staging-pool-gib", f"{a.staging_pool_gib:g}",
                     "--host-kv-gib", f"{a.prefill_host_kv_gib:g}"]
        else:
            args += ["--host-kv-gib", f"{a.host_kv_gib:g}", "--rpf", "on" if mode == "rpf" else "off"]
            if caching == "off":
                args.append("--no-enable-prefix-caching")
            args += a.server_args.split() + a.decode_server_args.split()
            return args
        return args + a.server_args.split()

    def group(self, input_len, fetch_ratio, mode, caching="on"):
        a = self.a
        pre, err = self.start(self.server_bin, self.instance_args("prefill", input_len, fetch_ratio, mode), a.prefill_gpu,
                              "prefill")
        dec = rtr = None
        if pre:
            dec, err = self.start(self.server_bin, self.instance_args("decode", input_len, fetch_ratio, mode, caching),
                                  a.decode_gpu, f"decode-{mode}")
        if dec:
            host = lambda s: s.base.replace("http://", "")
            rtr, err = self.start(self.router_bin, ["--port", "0", "--prefill", host(pre), "--decode", host(dec)], None,
                                  "router")
        for rate, prefix in [(r, p) for p in a.prefix_lens for r in a.rates]:
            rid = (f"{mode}-in{input_len}-out{a.output_len}-f{fetch_ratio:g}-r{rate:g}-n{a.num_prompts}"
                   + (f"-p{prefix}" if prefix else "") + ("-nocache" if caching == "off" else ""))
            base = dict(id=rid, mode=mode, input_len=input_len, output_len=a.output_len, fetch_ratio=fetch_ratio,
                        rate=rate, num_prompts=a.num_prompts, prefix_len=prefix, decode_prefix_caching=caching)
            if err:
                self.records.append(dict(base, status="server-failed", error=err))
                self.save()
                self.log(f"{rid}: {err}")
                continue
            if self.remaining() is not None and self.remaining() < a.min_run_s:
                self.records.append(dict(base, status="skipped", error="--budget-s spent"))
                self.save()
                continue
            self.records.append(self.measure(pre, dec, rtr, rid, base, input_len, rate, prefix))
            self.save()
        self.stop_all()

    def measure(self, pre, dec, rtr, rid, base, input_len, rate, prefix=0):
        a = self.a
        timeout = a.run_timeout if self.remaining() is None else max(1.0, min(a.run_timeout, self.remaining() - 10))
        bench_json = os.path.join(a.out_dir, "runs", rid + ".bench.json")
        argv = ["--base-url", rtr.base, "--model", "m", "--dataset", "random", "--random-input-len",
                str(input_len - prefix), "--random-prefix-len", str(prefix),
                "--random-output-len", str(a.output_len), "--random-vocab-size", str(self.vocab), "--num-prompts",
                str(a.num_prompts), "--request-rate", f"{rate:g}", "--seed", str(a.seed), "--request-timeout",
                str(int(timeout) + 1), "--label", rid, "--no-progress", "--result-file", bench_json]
        try:
            before = {n: p.metrics() for n, p in (("prefill", pre), ("decode", dec), ("router", rtr))}
        except (OSError, urllib.error.URLError) as e:
            return dict(base, status="failed", error=f"/metrics before: {e}")
        rc, secs = lc.run_bench(self.bench_bin, self.env, argv, os.path.join(a.out_dir, "runs", rid + ".bench.txt"), timeout)
        result = {}
        if os.path.exists(bench_json):
            with open(bench_json) as f:
                result = json.load(f)
        bench = lc.summarize_bench(result) if result else None
        try:
            after = {"prefill": pre.metrics(), "decode": dec.quiet_metrics(), "router": rtr.metrics()}
            time.sleep(1.0)  # lease completions reach the prefill side asynchronously
            after["prefill"] = pre.metrics()
        except (OSError, urllib.error.URLError) as e:
            return dict(base, status="failed", error=f"/metrics after: {e}", bench=bench)
        P, D = before["prefill"], after["prefill"]
        d0, d1 = before["decode"], after["decode"]
        handoffs = delta(P, D, "oasis:handoffs_total")
        imports = delta(d0, d1, "oasis:rpf_imports_total")
        adm = delta(d0, d1, "oasis:rpf_admission_bytes_total")
        drift = delta(d0, d1, "oasis:rpf_drift_bytes_total")
        staged = delta(P, D, "oasis:handoff_staged_bytes_total")
        per = lambda x: x / imports / GIB if imports else None
        slot = host_slot_bytes(self.cfg, a.dtype_bytes) * self.cfg["num_key_value_heads"]
        reserved = (input_len + a.output_len + 15) // 16 * slot / GIB
        finished = delta(d0, d1, "oasis:rpf_imports_finished_total")
        host_per = (delta(d0, d1, "oasis:rpf_host_kv_bytes_finished_total") / finished / GIB) if finished else None
        rec = dict(base, status="ok" if rc == 0 else f"oasis-bench exit {rc}", seconds=secs, bench=bench,
                   handoffs=handoffs, imports=imports,
                   staged_gib_per_request=staged / handoffs / GIB if handoffs else None,
                   admission_gib_per_request=per(adm), drift_gib_per_request=per(drift),
                   moved_gib_per_request=per(adm + drift),
                   decode_host_reserved_gib_per_request=reserved,
                   decode_host_gib_per_request=host_per,
                   decode_host_peak_gib=d1.get("oasis:rpf_host_kv_bytes_peak", 0.0) / GIB,
                   drift_dropped=delta(d0, d1, "oasis:rpf_drift_blocks_dropped_total"),
                   drift_blocks=delta(d0, d1, "oasis:rpf_drift_blocks_total"),
                   admission_fetch_s_per_request=(delta(d0, d1, "oasis:rpf_admission_fetch_seconds_total") / imports
                                                  if imports else None),
                   handoff_s_per_request=(delta(P, D, "oasis:handoff_seconds_total") / handoffs if handoffs else None),
                   leases_ended=staged_lease_total(D, P), leases_held_after=D.get("oasis:staging_pool_requests_held"),
                   failures=delta(d0, d1, "oasis:rpf_import_failures_total"),
                   decode_cached_tokens_per_request=(delta(d0, d1, "oasis:rpf_prefix_cache_hit_tokens_total") / imports
                                                     if imports else None),
                   decode_cache_evictions=delta(d0, d1, "oasis:rpf_prefix_cache_evictions_total"),
                   metrics={"before": before, "after": after})
        lc.write_json(os.path.join(a.out_dir, "runs", rid + ".json"), dict(rec, bench_full=result))
        rec.pop("metrics")
        b = bench or {}
        self.log(f"{rid}: {rec['status']}, {b.get('output_throughput') or 0:.1f} tok/s, TTFT median "
                 f"{b.get('median_ttft_ms') or 0:.0f} ms, admission {rec['admission_gib_per_request'] or 0:.3f} GiB/req")
        return rec

    def table(self):
        cols = ("mode", "in", "prefix", "dcache", "out", "f", "rate", "ok/n", "tok/s", "TTFT p50 ms", "TTFT p99 ms",
                "TPOT ms", "staged GiB", "adm GiB", "drift GiB", "moved GiB", "held tok", "host GiB", "host peak GiB",
                "adm s", "handoff s")
        rows = []
        for r in self.records:
            b = r.get("bench") or {}
            f = lambda v, s="{:.3f}": lc.fmt(v, s)
            rows.append((r["mode"], str(r["input_len"]), str(r.get("prefix_len", 0)), r.get("decode_prefix_caching", "on"),
                         str(r["output_len"]), f"{r['fetch_ratio']:g}", f"{r['rate']:g}",
                         f"{b.get('completed') or 0}/{r['num_prompts']}", f(b.get("output_throughput"), "{:.1f}"),
                         f(b.get("median_ttft_ms"), "{:.0f}"), f(b.get("p99_ttft_ms"), "{:.0f}"),
                         f(b.get("median_tpot_ms"), "{:.2f}"), f(r.get("staged_gib_per_request")),
                         f(r.get("admission_gib_per_request")), f(r.get("drift_gib_per_request")),
                         f(r.get("moved_gib_per_request")), f(r.get("decode_cached_tokens_per_request"), "{:.0f}"),
                         f(r.get("decode_host_gib_per_request")),
                         f(r.get("decode_host_peak_gib"), "{:.2f}"),
                         f(r.get("admission_fetch_s_per_request")), f(r.get("handoff_s_per_request"))))
        widths = [max(len(c), *(len(x[i]) for x in rows)) if rows else len(c) for i, c in enumerate(cols)]
        print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
        for x in rows:
            print("  ".join(v.rjust(w) for v, w in zip(x, widths)))
        print("per request: staged = bytes the prefill instance staged (KV, summaries, draft KV); adm = read at "
              "admission; drift = remote blocks read later; moved = adm + drift; held tok = prompt tokens the decode "
              "instance held already (its prefix cache, dcache on); prefix = shared prompt prefix; "
              "host = decode host KV a request held "
              "at its end; host peak = all imported requests' host KV at its highest (decode instance, since "
              "start); adm s = admission fetch time; handoff s = the prefill loop's staging time")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=lc.ints, default=[24576, 32768])
    ap.add_argument("--output-len", type=int, default=2048)
    ap.add_argument("--rates", type=lc.floats, default=[0.25, 0.5], help="requests per second (oasis-bench --request-rate)")
    ap.add_argument("--modes", default="rpf,full", help="rpf (remote partial fetch) and/or full (transfer at admission)")
    ap.add_argument("--fetch-ratios", type=lc.floats, default=[0.05, 0.1])
    ap.add_argument("--prefix-lens", type=lc.ints, default=[0],
                    help="tokens of a prefix every prompt shares (of --inputs; oasis-bench --random-prefix-len)")
    ap.add_argument("--decode-prefix-caching", default="on",
                    help="on and/or off: the decode instance with and without prefix caching")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--host-kv-gib", type=float, default=100, help="decode instance --host-kv-gib")
    ap.add_argument("--prefill-host-kv-gib", type=float, default=16, help="prefill instance --host-kv-gib")
    ap.add_argument("--staging-pool-gib", type=float, default=64)
    ap.add_argument("--prefill-gpu", type=int, default=0)
    ap.add_argument("--decode-gpu", type=int, default=1)
    ap.add_argument("--draft-vocab-size", type=int, default=32000)
    ap.add_argument("--dtype-bytes", type=int, default=2)
    ap.add_argument("--out-dir", default=os.path.join(os.environ.get("OUT", "/tmp"), "disagg"))
    ap.add_argument("--bin-dir", default=os.path.join(lc.ROOT, ".bundle/bin"))
    ap.add_argument("--server-bin")
    ap.add_argument("--router-bin")
    ap.add_argument("--bench-bin")
    ap.add_argument("--model-config", default=os.path.join(lc.ROOT, "tools/bench/model_configs/qwen3-8b.json"))
    ap.add_argument("--tokenizer", default=os.path.join(lc.ROOT, ".cache/test-data/qwen3"))
    ap.add_argument("--vocab-size", type=int, default=0)
    ap.add_argument("--server-args", default="", help="extra flags for both instances")
    ap.add_argument("--decode-server-args", default="",
                    help="extra flags for the decode instance only, after --server-args (both on one GPU: "
                         "its --gpu-memory-utilization counts the prefill instance's memory too)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--run-timeout", type=float, default=600)
    ap.add_argument("--startup-timeout", type=float, default=600)
    ap.add_argument("--budget-s", type=float, default=0)
    ap.add_argument("--min-run-s", type=float, default=30)
    ap.add_argument("--pack", action="store_true", help="pack runs/ and the logs into runs.tar.xz at the end")
    a = ap.parse_args(argv)
    if a.prefill_gpu < 0:
        a.prefill_gpu = None
    if a.decode_gpu < 0:
        a.decode_gpu = None
    a.modes = [m for m in a.modes.split(",") if m]
    if not a.modes or any(m not in ("rpf", "full") for m in a.modes):
        ap.error("--modes: rpf and/or full")
    a.decode_prefix_caching = [c for c in a.decode_prefix_caching.split(",") if c]
    if not a.decode_prefix_caching or any(c not in ("on", "off") for c in a.decode_prefix_caching):
        ap.error("--decode-prefix-caching: on and/or off")
    if any(p < 0 or p >= min(a.inputs) for p in a.prefix_lens):
        ap.error("--prefix-lens: each in [0, the smallest --inputs)")
    if a.tokenizer and not os.path.exists(a.tokenizer):
        a.tokenizer = ""
    return a


def main(argv=None):
    a = parse_args(argv)
    b = Bench(a)
    try:
        for input_len in a.inputs:
            for fr in a.fetch_ratios:
                for mode in a.modes:
                    for caching in a.decode_prefix_caching:
                        b.group(input_len, fr, mode, caching)
    finally:
        b.stop_all()
        shutil.rmtree(b.model_dir, ignore_errors=True)
    b.table()
    if a.pack:
        lc.pack(a.out_dir)
    bad = [r for r in b.records if r.get("status") != "ok"]
    return 1 if bad and len(bad) == len(b.records) else 0


if __name__ == "__main__":
    sys.exit(main())
