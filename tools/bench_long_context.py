#!/usr/bin/env python3
"""Long-context serving benchmarks, dense vs lookahead sparse KV (issue 10; DESIGN.md §5).

Starts oasis-server on dummy weights for an HF config (default: Qwen3-8B's shapes), plus a dummy
EAGLE-3 head for sparse runs, runs oasis-bench against it for every point of the chosen sweeps,
scrapes /metrics around each run, and writes under --out-dir:
  runs/<id>.json        oasis-bench's result file + the server's metrics (before, after, counter
                        deltas, derived ratios) + the server command line + the roofline
  runs/<id>.bench.txt   oasis-bench's stdout; server-<n>.log: each server's log
  summary.json          one flat record per run (rewritten after every run, so a killed call
                        still leaves what it measured)
and prints a table last. tools/plot_long_context.py turns summary.json files into PNGs.

Sweeps (--sweep, several allowed):
  fig11    inputs 16K and 32K, output 1K, concurrency 1, 8, 16, 32 and max; dense vs sparse
           (K 128, fetch ratio 0.05). "max" = the most requests the server can hold at once,
           from its /metrics (KV head-blocks, host KV head-blocks; see max_concurrency()), or
           --max-concurrency.
  fetch    sparse at 16K, fetch ratio 0.01, 0.02, 0.05, 0.1, 0.2, 1 (= all K may change per
           step): blocks and bytes fetched per step, PCIe GB/s, throughput.
  topk     sparse at 16K, K 64, 128, 192.
  latency  batch 1 (one request in flight), TPOT dense vs sparse at 16K and 32K.
Runs with the same server settings share one server; identical runs of several sweeps run
once. A run that passes --run-timeout is killed (and its server restarted), recorded as
failed, and the sweep goes on; --budget-s stops starting runs when the call's time is up.

On the GPU machine, from the bundle (here: cmake --build build && tools/gpu_suite.sh --bundle, which
also packs the test tokenizers into .bundle-pack/tok.tar.xz; the device call carries
[".bundle-pack"], runs in the repository root and brings $OUT back; the default --out-dir is
$OUT/long-context; both packs are unpacked on first use). One call may take 10 minutes, so
split the sweeps; --budget-s stops starting runs in time (each server start also costs time):
  tools/bench_long_context.py --sweep fig11 --sweep latency --inputs 16384 --modes dense --budget-s 480 --pack
  tools/bench_long_context.py --sweep fig11 --sweep latency --inputs 16384 --modes sparse --budget-s 480 --pack
  tools/bench_long_context.py --sweep fig11 --sweep latency --inputs 32768 --modes dense --budget-s 480 --pack
  tools/bench_long_context.py --sweep fig11 --sweep latency --inputs 32768 --modes sparse --budget-s 480 --pack
  tools/bench_long_context.py --sweep fetch --modes sparse --fetch-ratios 0.01,0.02,0.1 --budget-s 480 --pack
  tools/bench_long_context.py --sweep fetch --modes sparse --fetch-ratios 0.2,1 --budget-s 480 --pack
  tools/bench_long_context.py --sweep topk --modes sparse --topks 64,192 --budget-s 480 --pack
(measured 2026-11-30: a dense 16K server starts in ~2 s, a sparse one with an 80 GiB host store
took 41-66 s (pinning, before the registered huge-page pool); a 32-request 16K run 40-60 s.)
(fig11's K 128 / fetch 0.05 point at concurrency 32 and its dense run serve the fetch and topk
sweeps.) Copy each call's long-context/ folder here, then:
  tools/bench_long_context.py --report DIR1 DIR2 ... [--ok-only]   and   tools/plot_long_context.py DIR1 DIR2 ...
(--pack leaves summary.json + runs.tar.xz only: the device tool returns a limited number of files.)
The table reads the decode phase off the median inter-token latency as well (decode_phase()):
output throughput includes every prompt's prefill, which at 16K x 32 lasts about as long as
the decode itself.
Smoke on the CPU (the embedded model's shapes, a CPU build in build-lc):
  tools/bench_long_context.py --bin-dir build-lc --model-config models/embedded/config.json \
    --tokenizer models/embedded --sweep fig11 --sweep fetch --sweep topk --sweep latency \
    --inputs 256 --output-len 16 --concurrencies 1,2,max --sweep-concurrency 2 --topk 4 --topks 2,4,6 \
    --fetch-ratios 0.25,0.5,1 --threshold 64 --host-kv-gib 0.01 --max-num-seqs 4 --latency-prompts 2
Python 3 standard library only.
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = 16  # tokens per KV block (docs/sparse.md)
HBM_READ_GBPS = 4560.0  # DESIGN.md §5: read-only streaming kernel on the H200
PCIE_GBPS = 51.0  # DESIGN.md §5: UVA gather of scattered blocks from pinned host memory
SWEEPS = ("fig11", "fetch", "topk", "latency")


# ---------------------------------------------------------------- rooflines (DESIGN.md §5)

def shape_of(cfg, draft_vocab):
    hid, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or hid // hq
    return dict(H=hid, L=layers, Hq=hq, Hkv=hkv, D=d, I=cfg["intermediate_size"], V=cfg["vocab_size"],
                tied=bool(cfg.get("tie_word_embeddings", False)), DV=min(draft_vocab, cfg["vocab_size"]))


def weight_bytes(s, dtype_bytes):
    """Weights one decode step reads: every layer's projections and MLP plus lm_head (the
    embedding table is only gathered; tied: it is the lm_head, read once). Qwen3-8B: 15.1 GB."""
    per_layer = s["H"] * (s["Hq"] + 2 * s["Hkv"]) * s["D"] + s["Hq"] * s["D"] * s["H"] + 3 * s["H"] * s["I"]
    return dtype_bytes * (s["L"] * per_layer + s["V"] * s["H"])


def draft_weight_bytes(s, dtype_bytes):
    """The EAGLE-3 head (Eagle3Head::ExpectedWeights): fc [H, 3H], one layer whose QKV take 2H
    inputs, o_proj, MLP, lm_head over the draft vocabulary."""
    h, qkv = s["H"], (s["Hq"] + 2 * s["Hkv"]) * s["D"]
    return dtype_bytes * (3 * h * h + 2 * h * qkv + s["Hq"] * s["D"] * h + 3 * h * s["I"] + s["DV"] * h)


def roofline(s, mode, input_len, output_len, batch, topk, threshold, dtype_bytes, hbm_gbps=HBM_READ_GBPS):
    """Decode-step roofline: the bytes one step must read from HBM, over the read ceiling.

    c = input + output/2, the mean context over a request's decode. kv = 2·Hkv·D·dtype bytes per
    token and layer (K and V).
      dense:  weights + B·c·L·kv                        (every step reads every request's KV)
      sparse: weights + draft head weights
              + B·L·kv·min(c, (K+1)·16)                 the resident working set (K blocks + the
                                                        local block per KV head), read once for
                                                        both stacked queries
              + B·L·Hkv·ceil(c/16)·2·D·dtype            the block summaries (min and max keys)
                                                        the draft query scores every step
              + B·c·kv_draft                            the head's own (dense, one-layer) KV
    (contexts at or below the threshold stay dense: then the dense formula plus the head).
    step time = bytes / 4.56 TB/s; throughput ceiling = B / step time, TPOT floor = step time.
    Prefill is not counted, so measured output throughput (which includes it) sits below.
    PCIe: at most C = ceil(ratio·K) blocks per (request, layer, KV head) per step cross it; the
    measured bytes per step over 51 GB/s (DESIGN §5's gather) is reported beside (pcie_ms).
    Qwen3-8B, 16K, B=48: dense ≈ 128 GB/step (≈ 30 ms), sparse ≈ 40 GB/step (≈ 9 ms).
    Tensor parallelism (s["tp"] > 1, from --tensor-parallel-size in the server flags): the bytes
    of one GPU — layers and KV divided by tp, lm_head replicated, the draft head on rank 0."""
    c = input_len + output_len / 2.0
    tp = s.get("tp", 1)
    kv = 2 * s["Hkv"] * s["D"] * dtype_bytes
    kv_gpu = kv / tp  # each rank holds Hkv / tp heads
    w = weight_bytes(s, dtype_bytes)
    lm_head = dtype_bytes * s["V"] * s["H"]
    w_gpu = (w - lm_head) / tp + lm_head  # layers sharded, lm_head replicated (docs/parallel.md §1)
    if mode == "dense":
        per_step = w_gpu + batch * c * s["L"] * kv_gpu
    else:
        # The head and its KV live on rank 0, the slowest rank: its bytes bound the step.
        per_step = w_gpu + draft_weight_bytes(s, dtype_bytes) + batch * c * kv  # head weights + head KV
        if c <= threshold:
            per_step += batch * c * s["L"] * kv_gpu
        else:
            ws = min(c, (topk + 1) * BLOCK)
            summaries = s["L"] * s["Hkv"] / tp * math.ceil(c / BLOCK) * 2 * s["D"] * dtype_bytes
            per_step += batch * (s["L"] * kv_gpu * ws + summaries)
    step_s = per_step / (hbm_gbps * 1e9)
    return {"bytes_per_step": per_step, "step_ms": step_s * 1e3, "tok_s": batch / step_s if batch else 0.0}


def tensor_parallel_size(flags):
    """--tensor-parallel-size N (or =N) among oasis-server flags; 1 when absent."""
    m = re.search(r"--tensor-parallel-size(?:=|\s+)(\d+)", flags)
    return int(m.group(1)) if m else 1


# ---------------------------------------------------------------- server capacity

def kv_home_of(args_text):
    """The sparse server's --kv-home in a flag string (the server's default: auto)."""
    m = re.search(r"--kv-home[ =](\S+)", args_text or "")
    return m.group(1) if m else "auto"


def max_concurrency(s, mode, input_len, output_len, topk, metrics, max_num_seqs, home="auto"):
    """The most requests of this size the server holds at once, and what bounds it ({} and None
    when /metrics lacks the pool sizes).
      dense:  num_kv_blocks (head-blocks per layer) // (Hkv · ceil(total/16))
      sparse: host store: num_host_kv_blocks // (Hkv · ceil(total/16)) (each request reserves
              room for every block it can reach, SparseKvManager::Reserve); GPU: each sparse
              request keeps (K+2)·Hkv head-blocks, and one request at a time prefills densely.
              --kv-home auto (the default): the host store's requests, then whole requests in
              place in what the pool has left; hbm: in place only (the dense bound).
    both at most --max-num-seqs (= the sparse rows by default)."""
    pool = metrics.get("oasis:num_kv_blocks")
    if not pool:
        return None, {}
    # Pools and host stores are per rank over its Hkv / tp heads (their /metrics sizes are one rank's).
    per_req = s["Hkv"] // s.get("tp", 1) * math.ceil((input_len + output_len + 1) / BLOCK)
    limits = {"gpu_kv_dense": int(pool // per_req), "max_num_seqs": max_num_seqs}
    if mode == "sparse":
        host = metrics.get("oasis:num_host_kv_blocks")
        if not host:
            return None, {}
        working = (topk + 2) * (s["Hkv"] // s.get("tp", 1))
        if home == "host":
            limits["gpu_kv_sparse"] = max(limits.pop("gpu_kv_dense"),
                                          1 + int((pool - per_req) // working) if pool >= per_req else 0)
            limits["host_kv"] = int(host // per_req)
        elif home == "auto":
            in_host = min(int(host // per_req), int(pool // working))
            limits["kv_homes"] = in_host + int((pool - in_host * working) // per_req)
            limits.pop("gpu_kv_dense")
    n = min(limits.values())
    return max(0, n), dict(limits, bound_by=min(limits, key=limits.get))


# ---------------------------------------------------------------- HTTP and metrics

def http_get(url, timeout=10.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode("utf-8", "replace")


METRIC_LINE = re.compile(r'^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$')


def parse_metrics(text):
    """Prometheus text -> {name or name{label=value,...} (model_name dropped): value}; no buckets."""
    out = {}
    for line in text.splitlines():
        m = METRIC_LINE.match(line.strip())
        if not m or m.group(1).endswith("_bucket"):
            continue
        labels = [kv for kv in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or "") if kv[0] != "model_name"]
        key = m.group(1) + ("{" + ",".join(f"{k}={v}" for k, v in labels) + "}" if labels else "")
        try:
            out[key] = float(m.group(3))
        except ValueError:
            pass
    return out


def derive(before, after, duration_s, median_tpot_ms, median_itl_ms=None):
    """Per-run numbers from counter deltas (the server's ratio gauges are cumulative)."""
    d = {k: after[k] - before.get(k, 0.0) for k in after if k.split("{")[0].endswith("_total")}
    g = lambda k: d.get(k, 0.0)
    steps = g("oasis:sparse_steps_total")
    looked = g("oasis:sparse_hits_total") + g("oasis:sparse_misses_total")
    h2d = g("oasis:sparse_h2d_bytes_total")
    per_step = h2d / steps if steps else None
    out = {
        "engine_steps": g("oasis:engine_steps_total"),
        "preemptions": g("oasis:num_preemptions_total"),
        "sparse_switches": g("oasis:sparse_switches_total"),
        "sparse_admission_waits": g("oasis:sparse_admission_waits_total"),
        "pressure_switches": g("oasis:sparse_pressure_switches_total"),
        "switches_hbm": g("oasis:kv_home_switches_total{home=hbm}"),
        "switches_host": g("oasis:kv_home_switches_total{home=host}"),
        "moves_begun": g("oasis:kv_moves_total{stage=begun}"),
        "moves_done": g("oasis:kv_moves_total{stage=done}"),
        "move_bytes": g("oasis:kv_move_bytes_total"),
        "move_seconds": g("oasis:kv_move_seconds_total"),
        "move_copy_seconds": g("oasis:kv_move_copy_seconds_total"),
        "sparse_steps": steps,
        "hit_rate": g("oasis:sparse_hits_total") / looked if looked else None,
        "blocks_fetched_per_step": g("oasis:sparse_blocks_fetched_total") / steps if steps else None,
        "misses_per_step": g("oasis:sparse_misses_total") / steps if steps else None,
        "h2d_bytes_per_step": per_step,
        "h2d_bytes": h2d,
        # over the whole run (prefill included), and over a decode step (bytes per step / TPOT)
        "pcie_gbps_avg": h2d / duration_s / 1e9 if duration_s else None,
        "pcie_gbps_step": per_step / (median_tpot_ms * 1e-3) / 1e9 if per_step and median_tpot_ms else None,
        "pcie_ms_per_step": per_step / (PCIE_GBPS * 1e9) * 1e3 if per_step is not None else None,
        "pcie_gbps_itl": per_step / (median_itl_ms * 1e-3) / 1e9 if per_step and median_itl_ms else None,
        "transfer_wait_s": g("oasis:sparse_transfer_wait_seconds_total"),
        "transfer_wait_ms_per_step": g("oasis:sparse_transfer_wait_seconds_total") / steps * 1e3 if steps else None,
        # The server's own decode-only steps (no prompt chunk in the batch): wall time per step
        # and its model part (forward + sampling; the rest is the engine loop and the head).
        "decode_steps": g("oasis:engine_decode_steps_total"),
        "decode_step_ms": (g("oasis:engine_decode_step_seconds_total") / g("oasis:engine_decode_steps_total") * 1e3
                           if g("oasis:engine_decode_steps_total") else None),
        "decode_model_step_ms": (g("oasis:engine_decode_model_step_seconds_total") /
                                 g("oasis:engine_decode_steps_total") * 1e3
                                 if g("oasis:engine_decode_steps_total") else None),
        "topk_agreement_cumulative": after.get("oasis:sparse_topk_agreement"),
        "draft_acceptance": (g("oasis:spec_decode_num_accepted_tokens_total") /
                             g("oasis:spec_decode_num_draft_tokens_total")
                             if g("oasis:spec_decode_num_draft_tokens_total") else None),
    }
    return d, out


def decode_phase(bench, roof, derived, admitted):
    """The decode phase alone. Output throughput includes every prompt's prefill (at 16K x 32
    about as long as the decode itself), so the step the roofline describes is read off the
    median inter-token latency: with all `admitted` requests decoding, one step emits one token
    per request (lookahead 'reject' never accepts more), so decode tok/s = admitted / ITL and
    roof_frac = roofline step / ITL (the issue's targets: dense >= 0.85, sparse step <= 1.25x
    its roofline, i.e. roof_frac >= 0.8). For sparse runs the roofline also counts the bytes
    the step really fetched over PCIe at DESIGN §5's 51 GB/s: step floor = max(HBM, PCIe)
    when the transfers overlap the step (they run on their own stream), reported as
    roof_pcie_ms / roof_pcie_frac beside the HBM-only figures. Servers that export
    oasis:engine_decode_step_seconds_total give the decode-only step's own wall time
    (derived decode_step_ms): roof_frac_step / roof_pcie_frac_step use it instead of the ITL."""
    if not roof:
        return {}
    itl = (bench or {}).get("median_itl_ms")  # 0 when tokens arrive coalesced (a tiny model)
    step = (derived or {}).get("decode_step_ms")  # the server's decode-only steps (newer servers)
    out = {}
    if itl:
        out.update(decode_tok_s=admitted / (itl * 1e-3), roof_frac_itl=roof["step_ms"] / itl)
    if step:
        out.update(decode_step_tok_s=admitted / (step * 1e-3), roof_frac_step=roof["step_ms"] / step)
    pcie_ms = (derived or {}).get("pcie_ms_per_step")
    if pcie_ms is not None:
        floor = max(roof["step_ms"], pcie_ms)
        out.update(roof_pcie_ms=floor)
        if itl:
            out.update(roof_pcie_frac=floor / itl)
        if step:
            out.update(roof_pcie_frac_step=floor / step)
    return out


# ---------------------------------------------------------------- processes

def find_binary(bin_dir, name, subdirs):
    for sub in ("",) + subdirs:
        p = os.path.join(bin_dir, sub, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    raise SystemExit(f"bench_long_context: no {name} under {bin_dir} (tried {', '.join(('.',) + subdirs)})")


def unpack_bundle(bin_dir):
    """.bundle/bin from .bundle-pack/bundle.tar.xz (tools/gpu_suite.sh --bundle) when missing."""
    pack = os.path.join(ROOT, ".bundle-pack/bundle.tar.xz")
    if os.path.abspath(bin_dir) == os.path.join(ROOT, ".bundle/bin") and not os.path.isdir(bin_dir) \
            and os.path.exists(pack):
        import tarfile
        print(f"unpacking {pack}", flush=True)
        with tarfile.open(pack) as t:
            t.extractall(ROOT)
    # The tokenizers, packed beside the bundle (carried together they stay under the 64 MiB).
    tok = os.path.join(ROOT, ".bundle-pack/tok.tar.xz")
    if not os.path.isdir(os.path.join(ROOT, ".cache/test-data/qwen3")) and os.path.exists(tok):
        import tarfile
        with tarfile.open(tok) as t:
            t.extractall(ROOT)


def binary_env(bin_dir):
    """LD_LIBRARY_PATH: the bundle's lib/ (beside bin/) and CUDA's (where cuBLAS is), as
    tools/gpu_server_smoke.sh sets it."""
    lib = os.path.join(os.path.dirname(os.path.abspath(bin_dir)), "lib")
    paths = [lib] if os.path.isdir(lib) else []
    cublas = sorted(glob.glob("/usr/local/cuda*/targets/x86_64-linux/lib/libcublas.so.*"))
    if cublas:
        paths.append(os.path.dirname(cublas[0]))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(p for p in paths + [env.get("LD_LIBRARY_PATH", "")] if p)
    return env


def send(proc, sig):
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass


class Server:
    """One oasis-server process. It stays in our process group, so whatever kills this driver's
    group (a device call's time limit) takes it too; SIGTERM makes it shut down cleanly."""

    def __init__(self, binary, args, env, log_path):
        self.binary, self.args, self.env, self.log_path = binary, args, env, log_path
        self.proc, self.base, self.startup_s = None, None, None

    def start(self, timeout_s):
        t0 = time.time()
        self.log = open(self.log_path, "ab")
        # The log is appended to (a rerun into the same --out-dir): only this start's lines name
        # its port.
        since = self.log.tell()
        self.proc = subprocess.Popen([self.binary] + self.args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=self.env)
        while time.time() - t0 < timeout_s:
            if self.proc.poll() is not None:
                return f"oasis-server exited with {self.proc.returncode} while starting"
            if self.base is None:
                with open(self.log_path, "rb") as f:
                    f.seek(since)
                    m = re.search(rb"listening on (http://\S+)", f.read())
                self.base = m.group(1).decode() if m else None
            if self.base:
                try:
                    if http_get(self.base + "/health", 2.0)[0] == 200:
                        self.startup_s = time.time() - t0
                        return None
                except (OSError, urllib.error.URLError):
                    pass
            time.sleep(0.5)
        self.stop(grace_s=10.0)  # not left running behind a failed start
        return f"oasis-server not healthy after {timeout_s:.0f} s"

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def metrics(self):
        return parse_metrics(http_get(self.base + "/metrics", 10.0)[1])

    def quiet_metrics(self, timeout_s=30.0):
        """/metrics once nothing runs or waits and the counters stopped moving (the engine
        publishes its counters after the step that finished the last request)."""
        t0, last = time.time(), None
        while True:
            m = self.metrics()
            engine = {k: x for k, x in m.items() if not k.startswith("oasis:http_")}  # scrapes count themselves
            idle = all(m.get(k, 0) == 0 for k in ("oasis:num_requests_running", "oasis:num_requests_waiting",
                                                  "oasis:sparse_requests"))
            if idle and engine == last or time.time() - t0 > timeout_s:
                return m
            last = engine
            time.sleep(0.3)

    def stop(self, grace_s=90.0):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            send(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                send(self.proc, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        rc, self.proc = self.proc.returncode, None
        return rc

    def log_tail(self, n=15):
        try:
            return b"\n".join(open(self.log_path, "rb").read().splitlines()[-n:]).decode("utf-8", "replace")
        except OSError:
            return ""


PEAK_KEYS = {  # /metrics gauges whose largest value during a run is recorded (record["peaks"])
    "held": "oasis:num_requests_running", "waiting": "oasis:num_requests_waiting",
    "hbm_requests": "oasis:kv_home_requests{home=hbm}", "host_requests": "oasis:kv_home_requests{home=host}",
    "hbm_blocks": "oasis:kv_home_blocks{home=hbm}", "host_blocks": "oasis:kv_home_blocks{home=host}",
    "gpu_kv_usage": "oasis:kv_cache_usage_perc", "sparse_requests": "oasis:sparse_requests",
}


class PeakPoller(threading.Thread):
    """Scrapes /metrics every `interval` s while a run goes on and keeps each PEAK_KEYS gauge's
    largest value: held concurrency is what the server really ran at once, not an estimate."""
    def __init__(self, server, interval=0.5):
        super().__init__(daemon=True)
        self.server, self.interval, self.stop_event = server, interval, threading.Event()
        self.peaks, self.samples = {}, 0

    def run(self):
        while not self.stop_event.is_set():
            try:
                m = self.server.metrics()
                self.samples += 1
                for name, key in PEAK_KEYS.items():
                    if key in m:
                        self.peaks[name] = max(self.peaks.get(name, 0.0), m[key])
            except (OSError, urllib.error.URLError, ValueError):
                pass
            self.stop_event.wait(self.interval)

    def finish(self):
        self.stop_event.set()
        self.join(15)
        return dict(self.peaks, samples=self.samples)


def run_bench(binary, env, argv, stdout_path, timeout_s):
    """Runs oasis-bench; (returncode or None on timeout, seconds)."""
    t0 = time.time()
    with open(stdout_path, "wb") as out:
        proc = subprocess.Popen([binary] + argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            send(proc, signal.SIGKILL)
            proc.wait()
            return None, time.time() - t0
        except BaseException:  # SIGTERM / Ctrl-C of the driver
            send(proc, signal.SIGKILL)
            raise
    return proc.returncode, time.time() - t0


# ---------------------------------------------------------------- the plan

def ints(text):
    return [int(x) for x in text.split(",") if x.strip()]


def floats(text):
    return [float(x) for x in text.split(",") if x.strip()]


def concurrencies(text):
    return [x.strip() if x.strip() == "max" else int(x) for x in text.split(",") if x.strip()]


def plan_runs(a):
    """Every run of the chosen sweeps: dicts of mode, input, output, concurrency ('max' or an
    int), prompts multiplier, K and fetch ratio (sparse), and the sweeps that asked for it."""
    runs, index = [], {}

    def add(sweep, mode, inp, conc, topk=None, fetch=None, prompts=None):
        if mode not in a.modes:
            return
        if mode == "dense":
            topk = fetch = None
        key = (mode, inp, a.output_len, conc, topk, fetch, prompts)
        if key in index:
            if sweep not in index[key]["sweeps"]:
                index[key]["sweeps"].append(sweep)
            return
        index[key] = dict(sweeps=[sweep], mode=mode, input_len=inp, output_len=a.output_len, concurrency=conc,
                          topk=topk, fetch_ratio=fetch, num_prompts=prompts)
        runs.append(index[key])

    for sweep in a.sweep:
        inputs = a.inputs or ([16384, 32768] if sweep in ("fig11", "latency") else [16384])
        for inp in inputs:
            if sweep == "fig11":
                for conc in a.concurrencies:
                    for mode in ("dense", "sparse"):
                        add(sweep, mode, inp, conc, a.topk, a.fetch_ratio)
            elif sweep == "fetch":
                add(sweep, "dense", inp, a.sweep_concurrency)  # the reference the ratio is taken against
                for r in a.fetch_ratios:
                    add(sweep, "sparse", inp, a.sweep_concurrency, a.topk, r)
            elif sweep == "topk":
                add(sweep, "dense", inp, a.sweep_concurrency)
                for k in a.topks:
                    add(sweep, "sparse", inp, a.sweep_concurrency, k, a.fetch_ratio)
            elif sweep == "latency":
                for mode in ("dense", "sparse"):
                    add(sweep, mode, inp, 1, a.topk, a.fetch_ratio, prompts=a.latency_prompts)
    return runs


def server_key(run):
    return ("dense",) if run["mode"] == "dense" else ("sparse", run["topk"], run["fetch_ratio"])


def server_args(a, run, model_dir, max_model_len):
    args = ["--model", model_dir, "--load-format", "dummy", "--served-model-name", "m", "--port", "0",
            "--max-model-len", str(max_model_len), "--max-num-seqs", str(a.max_num_seqs)]
    if a.tokenizer:
        args += ["--tokenizer", a.tokenizer]
    if run["mode"] == "sparse":
        args += ["--draft-load-format", "dummy", "--draft-vocab-size", str(a.draft_vocab_size),
                 "--lookahead", "reject", "--sparse", "on", "--sparse-threshold", str(a.threshold),
                 "--host-kv-gib", f"{a.host_kv_gib:g}", "--topk-blocks", str(run["topk"]),
                 "--fetch-ratio", f"{run['fetch_ratio']:g}"] + a.sparse_server_args.split()
    else:
        args += a.dense_server_args.split()
    return args + a.server_args.split()


def run_id(run, conc):
    rid = f"{run['mode']}-in{run['input_len']}-out{run['output_len']}-c{conc}"
    if run["concurrency"] == "max":
        rid += "max"
    if run["mode"] == "sparse":
        rid += f"-k{run['topk']}-f{run['fetch_ratio']:g}"
    if run["num_prompts"]:
        rid += f"-n{run['num_prompts']}"
    return rid


# ---------------------------------------------------------------- records

def flat_record(run, conc, rid, status, **kw):
    rec = dict(id=rid, status=status, sweeps=run["sweeps"], mode=run["mode"], input_len=run["input_len"],
               output_len=run["output_len"], concurrency=conc, concurrency_label=str(run["concurrency"]),
               topk=run["topk"], fetch_ratio=run["fetch_ratio"])
    rec.update(kw)
    return rec


def summarize_bench(result):
    s = result.get("summary", {})
    keys = ("completed", "failed", "duration", "output_throughput", "total_token_throughput",
            "request_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "mean_tpot_ms",
            "p99_tpot_ms", "median_itl_ms", "median_e2el_ms", "max_concurrent_requests")
    out = {k: s.get(k) for k in keys}
    out["failures"] = [f"{f.get('count')}x {f.get('reason')}" for f in result.get("failures", [])][:5]
    return out


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


# ---------------------------------------------------------------- the table

def fmt(v, spec="{:.1f}", none="-"):
    return none if v is None else spec.format(v)


def print_table(records, out=sys.stdout):
    """Output throughput (prefill included) and the decode phase (median ITL) each beside the
    roofline, sparse metrics, and sparse/dense at equal (input, output, concurrency, prompts)."""
    def key(r):
        return (r["input_len"], r["output_len"], r["concurrency"], r.get("num_prompts"))
    dense = {key(r): r for r in records if r["mode"] == "dense" and r["status"] == "ok"}
    dense_max = {(r["input_len"], r["output_len"]): r for r in records
                 if r["mode"] == "dense" and r["status"] == "ok" and r["concurrency_label"] == "max"}
    cols = ["sweeps", "mode", "in", "out", "conc", "K", "fetch", "ok/n", "tok/s", "roof", "frac", "sp/dense",
            "TTFT ms", "TPOT ms", "ITL ms", "step ms", "model ms", "roofTPOT", "dec tok/s", "dfrac", "sfrac",
            "dec sp/d", "hit", "blk/step", "H2D MB/st", "PCIe GB/s", "wait ms", "floor ms", "pfrac",
            "held", "preempt", "hbm/host", "switch", "moves", "move GB"]
    rows = []
    for r in records:
        b = r.get("bench") or {}
        m = r.get("derived") or {}
        roof = r.get("roofline") or {}
        pk = r.get("peaks") or {}
        dec = decode_phase(b, roof, m, r.get("held") or r.get("admitted") or r["concurrency"])
        thr = b.get("output_throughput")
        ratio = dratio = None
        if r["mode"] == "sparse" and thr:
            ref, tag = dense.get(key(r)), ""
            if ref is None and r["concurrency_label"] == "max":
                ref, tag = dense_max.get((r["input_len"], r["output_len"])), "m"
            if ref and ref["bench"].get("output_throughput"):
                ratio = f"{thr / ref['bench']['output_throughput']:.2f}{tag}"
                ref_dec = decode_phase(ref["bench"], ref.get("roofline"), ref.get("derived"),
                                       ref.get("held") or ref.get("admitted") or ref["concurrency"])
                if dec.get("decode_tok_s") and ref_dec.get("decode_tok_s"):
                    dratio = f"{dec['decode_tok_s'] / ref_dec['decode_tok_s']:.2f}{tag}"
        conc = f"{r['concurrency']}" + ("*" if r["concurrency_label"] == "max" else "")
        if r.get("admitted") is not None and r["admitted"] < r["concurrency"]:
            conc += f">{r['admitted']}"  # (the estimate; "held" is what really ran at once)
        ok = f"{fmt(b.get('completed'), '{:d}', '0')}/{r.get('num_prompts') or '-'}"
        if r["status"] != "ok":
            ok = r["status"]
        h2d = m.get("h2d_bytes_per_step")
        rows.append([",".join(r["sweeps"]), r["mode"], str(r["input_len"]), str(r["output_len"]), conc,
                     fmt(r.get("topk"), "{}"), fmt(r.get("fetch_ratio"), "{:g}"), ok, fmt(thr),
                     fmt(roof.get("tok_s"), "{:.0f}"),
                     fmt(thr / roof["tok_s"] if thr and roof.get("tok_s") else None, "{:.2f}"), ratio or "-",
                     fmt(b.get("median_ttft_ms"), "{:.0f}"), fmt(b.get("median_tpot_ms"), "{:.2f}"),
                     fmt(b.get("median_itl_ms"), "{:.2f}"), fmt(m.get("decode_step_ms"), "{:.2f}"),
                     fmt(m.get("decode_model_step_ms"), "{:.2f}"), fmt(roof.get("step_ms"), "{:.2f}"),
                     fmt(dec.get("decode_tok_s"), "{:.0f}"), fmt(dec.get("roof_frac_itl"), "{:.2f}"),
                     fmt(dec.get("roof_frac_step"), "{:.2f}"), dratio or "-",
                     fmt(m.get("hit_rate"), "{:.3f}"), fmt(m.get("blocks_fetched_per_step"), "{:.0f}"),
                     fmt(h2d / 1e6 if h2d is not None else None, "{:.2f}"),
                     fmt(m.get("pcie_gbps_itl") or (h2d / (b["median_itl_ms"] * 1e-3) / 1e9
                                                    if h2d and b.get("median_itl_ms") else None), "{:.2f}"),
                     fmt(m.get("transfer_wait_ms_per_step"), "{:.2f}"),
                     fmt(dec.get("roof_pcie_ms"), "{:.2f}"),
                     fmt(dec.get("roof_pcie_frac_step") or dec.get("roof_pcie_frac"), "{:.2f}"),
                     fmt(pk.get("held"), "{:.0f}"), fmt(m.get("preemptions"), "{:.0f}"),
                     (f"{pk.get('hbm_requests', 0):.0f}/{pk.get('host_requests', 0):.0f}"
                      if r["mode"] == "sparse" and pk else "-"),
                     fmt(m.get("sparse_switches"), "{:.0f}") if r["mode"] == "sparse" else "-",
                     (f"{m.get('moves_done') or 0:.0f}/{m.get('moves_begun') or 0:.0f}"
                      if r["mode"] == "sparse" and m else "-"),
                     fmt(m.get("move_bytes") / 1e9 if m.get("move_bytes") else None, "{:.2f}")])
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c) for i, c in enumerate(cols)]
    line = lambda cells: "  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    print(line(cols), file=out)
    for row in rows:
        print(line(row), file=out)
    print("tok/s: output tokens/s (oasis-bench, prefill included); roof: decode-step roofline B / step time at "
          f"{HBM_READ_GBPS / 1000:g} TB/s (DESIGN §5; roofTPOT = step time, ms); frac = tok/s / roof; sp/dense "
          "at equal concurrency (m: max vs max); conc* = the server's max, N>M: only M fit at once. Decode "
          "phase: ITL = median inter-token latency (one step with every request decoding), dec tok/s = "
          "admitted / ITL, dfrac = roofTPOT / ITL; step / model ms = the server's decode-only steps (wall, and "
          "forward + sampling), sfrac = roofTPOT / step ms; dec sp/d = sparse/dense decode tok/s. hit / blk/step / "
          f"H2D: sparse metrics over the run; PCIe GB/s = H2D bytes per step / ITL; wait = the step end's wait for "
          f"the side streams per sparse step; floor = max(roofTPOT, H2D bytes per step at {PCIE_GBPS:g} GB/s), "
          "pfrac = floor / step ms (or / ITL). held: the most requests running at once (/metrics, every 0.5 s); "
          "preempt: preemptions; hbm/host: the most sparse requests at once whose KV lived in the GPU pool / the "
          "host store; switch: dense -> sparse switches; moves: GPU pool -> host moves done/begun, move GB their "
          "bytes", file=out)


# ---------------------------------------------------------------- running

class Driver:
    def __init__(self, a):
        self.a = a
        self.t0 = time.time()
        self.deadline = self.t0 + a.budget_s if a.budget_s > 0 else None
        unpack_bundle(a.bin_dir)
        self.server_bin = a.server_bin or find_binary(a.bin_dir, "oasis-server", ("src/server",))
        self.bench_bin = a.bench_bin or find_binary(a.bin_dir, "oasis-bench", ("tools/loadgen",))
        self.env = binary_env(os.path.dirname(self.server_bin) if a.server_bin else a.bin_dir)
        with open(a.model_config) as f:
            self.cfg = json.load(f)
        self.shape = shape_of(self.cfg, a.draft_vocab_size)
        self.shape["tp"] = tensor_parallel_size(" ".join([a.server_args, a.dense_server_args, a.sparse_server_args]))
        self.vocab = a.vocab_size or self.cfg["vocab_size"]
        os.makedirs(os.path.join(a.out_dir, "runs"), exist_ok=True)
        self.model_dir = tempfile.mkdtemp(prefix="oasis-lc-model-")
        shutil.copy(a.model_config, os.path.join(self.model_dir, "config.json"))
        self.records, self.servers, self.live = [], 0, None  # live: the running Server, stopped on exit

    def remaining(self):
        return None if self.deadline is None else self.deadline - time.time()

    def save(self):
        write_json(os.path.join(self.a.out_dir, "summary.json"), {
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:],
            "model_config": self.a.model_config, "shape": self.shape, "hbm_read_gbps": HBM_READ_GBPS,
            "pcie_gbps": PCIE_GBPS, "elapsed_s": time.time() - self.t0, "runs": self.records})

    def record(self, run, conc, rid, status, full=None, **kw):
        rec = flat_record(run, conc, rid, status, **kw)
        self.records.append(rec)
        if full is not None:
            full.update(record=rec)
            write_json(os.path.join(self.a.out_dir, "runs", rid + ".json"), full)
        self.save()
        bench = rec.get("bench") or {}
        print(f"[{time.time() - self.t0:7.1f}s] {rid}: {status}"
              + (f", {bench.get('output_throughput') or 0:.1f} tok/s, TPOT {bench.get('median_tpot_ms') or 0:.2f} ms"
                 if bench else "")
              + (f", held {rec['peaks'].get('held', 0):.0f}" if rec.get("peaks") else "")
              + (f", preempted {rec['derived'].get('preemptions') or 0:.0f}" if rec.get("derived") else "") + (f" ({kw['error']})" if kw.get("error") else ""), flush=True)

    def start_server(self, args):
        self.servers += 1
        log = os.path.join(self.a.out_dir, f"server-{self.servers}.log")
        with open(log, "w") as f:
            f.write("# " + " ".join([self.server_bin] + args) + "\n")
        server = self.live = Server(self.server_bin, args, self.env, log)
        limit = self.a.startup_timeout
        if self.remaining() is not None:
            limit = min(limit, max(1.0, self.remaining()))
        print(f"[{time.time() - self.t0:7.1f}s] server {self.servers}: {' '.join(args)}", flush=True)
        err = server.start(limit)
        if err:
            server.stop(10)
            tail = [l for l in server.log_tail(6).splitlines() if not l.startswith("# ")]
            return None, f"{err}; log {log}: " + " | ".join(tail)
        print(f"[{time.time() - self.t0:7.1f}s] server {self.servers} ready in {server.startup_s:.1f} s at "
              f"{server.base}", flush=True)
        if not self.a.no_warmup:  # one short request: lazy initialisation stays out of the first run
            body = json.dumps({"model": "m", "prompt": list(range(1, 17)), "max_tokens": 4}).encode()
            try:
                urllib.request.urlopen(urllib.request.Request(server.base + "/v1/completions", body, {
                    "Content-Type": "application/json"}), timeout=120).read()
            except (OSError, urllib.error.URLError) as e:
                print(f"warm-up request failed: {e}", flush=True)
        return server, None

    def run_group(self, runs, max_model_len):
        args = server_args(self.a, runs[0], self.model_dir, max_model_len)
        server, measured, capacity, start_error = None, {}, {}, None
        out_of_time = lambda: self.remaining() is not None and self.remaining() < self.a.min_run_s
        for run in runs:
            conc = run["concurrency"]
            if out_of_time():
                self.record(run, conc, run_id(run, conc), "skipped", error="--budget-s spent")
                continue
            if start_error:  # a server that failed to start once is not tried again for this group
                self.record(run, conc, run_id(run, conc), "server-failed", error=start_error, server_args=args)
                continue
            if server is None or not server.alive():
                if server is not None:
                    server.stop(10)
                server, start_error = self.start_server(args)
                if server is None:
                    self.record(run, conc, run_id(run, conc), "server-failed", error=start_error, server_args=args)
                    continue
                capacity = server.quiet_metrics(5.0)
                if out_of_time():
                    self.record(run, conc, run_id(run, conc), "skipped", error="--budget-s spent")
                    continue
            cap, limits = max_concurrency(self.shape, run["mode"], run["input_len"], run["output_len"],
                                          run["topk"] or 0, capacity, self.a.max_num_seqs,
                                          kv_home_of(self.a.sparse_server_args + " " + self.a.server_args))
            if conc == "max":
                conc = self.a.max_concurrency or cap
                if not conc:
                    self.record(run, 0, run_id(run, 0), "failed",
                                error="max concurrency unknown: /metrics has no pool sizes; pass --max-concurrency")
                    continue
            nprompts = run["num_prompts"] or conc * self.a.prompts_per_concurrency
            rid = run_id(run, conc)
            same = measured.get((run["input_len"], run["output_len"], conc, nprompts))
            if same is not None:  # "max" resolved to a concurrency already measured on this server
                self.record(run, conc, rid, same["status"], **{k: v for k, v in same.items() if k not in (
                    "id", "status", "sweeps", "concurrency_label", "concurrency")})
                continue
            server, rec = self.measure(server, run, conc, nprompts, rid, args, cap, limits)
            measured[(run["input_len"], run["output_len"], conc, nprompts)] = rec
        if server is not None:
            rc = server.stop()
            if rc not in (0, None):
                print(f"server exited with {rc}: {server.log_tail(5)}", flush=True)

    def measure(self, server, run, conc, nprompts, rid, args, cap, limits):
        a = self.a
        timeout = a.run_timeout  # with --budget-s: cut at the budget (5 s left to stop the server)
        if self.remaining() is not None:
            timeout = max(1.0, min(timeout, self.remaining() - 5))
        bench_json = os.path.join(a.out_dir, "runs", rid + ".bench.json")
        argv = ["--base-url", server.base, "--model", "m", "--dataset", "random", "--random-input-len",
                str(run["input_len"]), "--random-output-len", str(run["output_len"]), "--random-vocab-size",
                str(self.vocab), "--num-prompts", str(nprompts), "--max-concurrency", str(conc), "--seed",
                str(a.seed), "--request-timeout", str(int(timeout) + 1), "--label", rid, "--no-progress",
                "--result-file", bench_json]
        admitted = min(conc, cap) if cap else conc
        roof = roofline(self.shape, run["mode"], run["input_len"], run["output_len"], admitted, run["topk"] or 0,
                        a.threshold, a.dtype_bytes)
        common = dict(num_prompts=nprompts, admitted=admitted, max_concurrency=cap, capacity=limits, roofline=roof,
                      server_args=args, server_startup_s=server.startup_s, server_log=server.log_path)
        try:
            before = server.metrics()
        except (OSError, urllib.error.URLError) as e:
            self.record(run, conc, rid, "failed", error=f"/metrics before the run: {e}", **common)
            return server, self.records[-1]
        poller = PeakPoller(server)
        poller.start()
        rc, secs = run_bench(self.bench_bin, self.env, argv, os.path.join(a.out_dir, "runs", rid + ".bench.txt"),
                             timeout)
        peaks = poller.finish()
        common["peaks"] = peaks
        if peaks.get("held"):  # what really ran at once (`admitted`, the capacity estimate, is a bound)
            admitted = common["held"] = int(min(conc, peaks["held"]))
            roof = common["roofline"] = roofline(self.shape, run["mode"], run["input_len"], run["output_len"],
                                                 admitted, run["topk"] or 0, a.threshold, a.dtype_bytes)
        result = {}
        if os.path.exists(bench_json):
            with open(bench_json) as f:
                result = json.load(f)
            os.remove(bench_json)
        bench = summarize_bench(result) if result else None
        full = {"bench_argv": [self.bench_bin] + argv, "server_argv": [self.server_bin] + args, "bench": result}
        if rc is None or not server.alive():
            status = "timeout" if rc is None else "server-died"
            cut = " (cut at --budget-s)" if timeout < a.run_timeout else ""
            error = (f"oasis-bench killed after {secs:.0f} s{cut}" if rc is None else
                     f"server exited with {server.proc.returncode}: {server.log_tail(8)}")
            try:
                full["metrics_after"] = server.metrics() if server.alive() else None
            except (OSError, urllib.error.URLError):
                pass
            server.stop(30)  # busy with the killed run's requests, or dead: a fresh one for the next run
            self.record(run, conc, rid, status, full, error=error, bench=bench, **common)
            return None, self.records[-1]
        try:
            after = server.quiet_metrics()
        except (OSError, urllib.error.URLError) as e:
            server.stop(30)
            self.record(run, conc, rid, "server-died", full, error=f"/metrics after the run: {e}: "
                        f"{server.log_tail(5)}", bench=bench, **common)
            return None, self.records[-1]
        delta, derived = derive(before, after, (bench or {}).get("duration"), (bench or {}).get("median_tpot_ms"),
                                (bench or {}).get("median_itl_ms"))
        derived.update(decode_phase(bench, roof, derived, admitted))
        wanted = re.compile(r"oasis:(sparse_|spec_decode_|num_|host_kv|kv_cache)")
        keep = lambda m: {k: v for k, v in m.items() if wanted.match(k)}
        full.update(metrics_before=keep(before), metrics_after=keep(after), metrics_delta=delta)
        status = "ok" if bench and bench.get("completed") else "failed"
        err = None if status == "ok" else (f"oasis-bench exit {rc}: " + "; ".join((bench or {}).get("failures") or [])
                                           or open(os.path.join(a.out_dir, "runs", rid + ".bench.txt")).read()[-300:])
        self.record(run, conc, rid, status, full, bench=bench, derived=derived, bench_seconds=secs, error=err,
                    **common)
        return server, self.records[-1]

    def run(self, runs):
        groups = {}
        for run in runs:
            groups.setdefault(server_key(run), []).append(run)
        longest = max(r["input_len"] + r["output_len"] for r in runs) + 64
        max_model_len = min(self.cfg.get("max_position_embeddings", longest), longest)
        if max_model_len < longest:
            print(f"warning: input + output + 64 = {longest} exceeds the config's max_position_embeddings "
                  f"{max_model_len}: the longest requests will be refused", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # -> finally: stop the server
        try:
            for group in groups.values():
                self.run_group(group, max_model_len)
        finally:
            if self.live is not None:
                self.live.stop(30)
            shutil.rmtree(self.model_dir, ignore_errors=True)
            self.save()


def pack(out_dir):
    """runs/ and server-*.log -> runs.tar.xz (summary.json stays beside it, unpacked)."""
    import tarfile
    names = ["runs"] + sorted(os.path.basename(p) for p in glob.glob(os.path.join(out_dir, "server-*.log")))
    with tarfile.open(os.path.join(out_dir, "runs.tar.xz"), "w:xz") as t:
        for n in names:
            t.add(os.path.join(out_dir, n), arcname=n)
    shutil.rmtree(os.path.join(out_dir, "runs"), ignore_errors=True)
    for n in names[1:]:
        os.remove(os.path.join(out_dir, n))


def load_summaries(paths):
    records = []
    for p in paths:
        path = os.path.join(p, "summary.json") if os.path.isdir(p) else p
        with open(path) as f:
            records += json.load(f)["runs"]
    return records


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", action="append", choices=SWEEPS, help="fig11, fetch, topk, latency (repeatable; "
                    "default fig11)")
    ap.add_argument("--modes", default="dense,sparse", help="which servers to run: dense, sparse or both")
    ap.add_argument("--out-dir", default=os.path.join(os.environ.get("OUT", "/tmp"), "long-context"))
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, ".bundle/bin"),
                    help="oasis-server and oasis-bench (a bundle's bin/ or a build directory)")
    ap.add_argument("--server-bin", help="oasis-server (default: found under --bin-dir)")
    ap.add_argument("--bench-bin", help="oasis-bench (default: found under --bin-dir)")
    ap.add_argument("--model-config", default=os.path.join(ROOT, "tools/bench/model_configs/qwen3-8b.json"),
                    help="HF config.json of the dummy-weight model")
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, ".cache/test-data/qwen3"),
                    help="tokenizer directory ('' = none: token ids only)")
    ap.add_argument("--vocab-size", type=int, default=0, help="random prompt ids below this (0 = the config's)")
    ap.add_argument("--inputs", type=ints, help="input lengths of every sweep (default: fig11/latency "
                    "16384,32768; fetch/topk 16384)")
    ap.add_argument("--output-len", type=int, default=1024)
    ap.add_argument("--concurrencies", type=concurrencies, default=concurrencies("1,8,16,32,max"),
                    help="fig11's concurrencies ('max' = the server's capacity)")
    ap.add_argument("--sweep-concurrency", type=int, default=32, help="concurrency of the fetch and topk sweeps")
    ap.add_argument("--prompts-per-concurrency", type=int, default=1, help="prompts per run = concurrency x this")
    ap.add_argument("--latency-prompts", type=int, default=4, help="requests (one at a time) per latency run")
    ap.add_argument("--max-concurrency", type=int, default=0, help="'max' when set (else from /metrics)")
    ap.add_argument("--max-num-seqs", type=int, default=64, help="server --max-num-seqs (caps 'max')")
    ap.add_argument("--topk", type=int, default=128, help="K of fig11, fetch and latency")
    ap.add_argument("--topks", type=ints, default=[64, 128, 192], help="K of the topk sweep")
    ap.add_argument("--fetch-ratio", type=float, default=0.05, help="fetch ratio of fig11, topk and latency")
    ap.add_argument("--fetch-ratios", type=floats, default=[0.01, 0.02, 0.05, 0.1, 0.2, 1.0])
    ap.add_argument("--threshold", type=int, default=4096, help="server --sparse-threshold")
    ap.add_argument("--host-kv-gib", type=float, default=80, help="server --host-kv-gib")
    ap.add_argument("--draft-vocab-size", type=int, default=32000, help="dummy head's draft vocabulary")
    ap.add_argument("--server-args", default="", help="extra oasis-server flags for every server")
    ap.add_argument("--dense-server-args", default="", help="extra flags for dense servers")
    ap.add_argument("--sparse-server-args", default="", help="extra flags for sparse servers")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--run-timeout", type=float, default=600, help="seconds one oasis-bench run may take")
    ap.add_argument("--startup-timeout", type=float, default=600, help="seconds a server may take to be healthy")
    ap.add_argument("--budget-s", type=float, default=0, help="stop starting runs after this many seconds in all "
                    "(0 = no limit); a running one is cut at the budget")
    ap.add_argument("--min-run-s", type=float, default=30, help="with --budget-s: start no run with less left")
    ap.add_argument("--dtype-bytes", type=int, default=2, help="bytes per weight/KV element in the roofline")
    ap.add_argument("--no-warmup", action="store_true", help="no short request after each server start")
    ap.add_argument("--dry-run", action="store_true", help="print the runs and exit")
    ap.add_argument("--report", nargs="+", metavar="DIR", help="print the table of earlier summary.json files")
    ap.add_argument("--ok-only", action="store_true", help="with --report: only the runs that completed")
    ap.add_argument("--pack", action="store_true", help="at the end, pack runs/ and the server logs into "
                    "runs.tar.xz beside summary.json (the device tool brings back only so many files)")
    a = ap.parse_args(argv)
    a.sweep = a.sweep or ["fig11"]
    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not a.modes or any(m not in ("dense", "sparse") for m in a.modes):
        ap.error("--modes takes dense, sparse or dense,sparse")
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.report:
        records = load_summaries(a.report)
        print_table([r for r in records if r["status"] == "ok"] if a.ok_only else records)
        return 0
    runs = plan_runs(a)
    if not runs:
        print("bench_long_context: nothing to run (check --sweep and --modes)", file=sys.stderr)
        return 1
    if a.dry_run:
        for r in runs:
            print(json.dumps(r))
        return 0
    driver = Driver(a)
    print(f"bench_long_context: {len(runs)} runs, results in {a.out_dir}", flush=True)
    driver.run(runs)
    print()
    print_table(driver.records)
    if a.pack:
        pack(a.out_dir)
    return 0 if any(r["status"] == "ok" for r in driver.records) else 1


if __name__ == "__main__":
    sys.exit(main())
