#!/usr/bin/env bash
# tools/bench_long_context.py as the GPU runs use it, on the CPU: it starts the real oasis-server
# (the embedded model's shapes, dummy weights and draft head) dense and sparse, drives every
# sweep with the real oasis-bench, and must leave a summary whose runs all completed with the
# sparse counters the table reads; --pack, --report and the plots from that summary.
# Usage: test_long_context_driver.sh <oasis-server> <oasis-bench> <repo root>
set -uo pipefail
SERVER=$1
BENCH=$2
ROOT=$3
[[ -x $SERVER ]] || { echo "FAILED: no oasis-server at $SERVER"; exit 1; }
[[ -x $BENCH ]] || { echo "FAILED: no oasis-bench at $BENCH"; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
bad() { echo "FAILED: $1"; fail=1; }

python3 "$ROOT/tools/bench_long_context.py" --server-bin "$SERVER" --bench-bin "$BENCH" \
  --model-config "$ROOT/tests/fixtures/tiny-default/config.json" --tokenizer "$ROOT/tests/fixtures/tiny-default" \
  --sweep fig11 --sweep fetch --sweep topk --sweep latency --inputs 256 --output-len 16 \
  --concurrencies 1,2,max --sweep-concurrency 2 --topk 4 --topks 2,4 --fetch-ratios 0.25,1 \
  --threshold 64 --host-kv-gib 0.01 --max-num-seqs 4 --latency-prompts 2 --run-timeout 120 \
  --startup-timeout 120 --sparse-server-args "--kv-home host --sparse-switch threshold" --out-dir "$TMP/lc" --pack >"$TMP/driver.out" 2>&1
rc=$?
tail -20 "$TMP/driver.out"
[[ $rc -eq 0 ]] || bad "driver exit $rc"
[[ -f $TMP/lc/runs.tar.xz && ! -d $TMP/lc/runs ]] || bad "--pack left no runs.tar.xz (or kept runs/)"
python3 - "$TMP/lc/summary.json" <<'PY' || fail=1
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
problems = []
if len(runs) < 10:
    problems.append(f"only {len(runs)} runs")
for r in runs:
    b, d = r.get("bench") or {}, r.get("derived") or {}
    if r["status"] != "ok" or b.get("completed") != r["num_prompts"]:
        problems.append(f"{r['id']}: {r['status']} {r.get('error')}")
        continue
    # ITL can be 0 here (the tiny model's tokens may reach the client coalesced); the
    # server's own decode-step numbers cannot
    if b.get("median_itl_ms") and (not d.get("decode_tok_s") or d.get("roof_frac_itl") is None):
        problems.append(f"{r['id']}: no decode-phase numbers: {b.get('median_itl_ms')} {d.get('decode_tok_s')}")
    if not d.get("decode_step_tok_s"):
        problems.append(f"{r['id']}: no decode tok/s from the server's steps")
    # the server's decode-only steps: some ran, the model part within the whole step
    if not d.get("decode_steps") or not d.get("decode_step_ms") or d.get("roof_frac_step") is None:
        problems.append(f"{r['id']}: no server decode-step numbers: {d.get('decode_steps')} {d.get('decode_step_ms')}")
    elif not 0 < d["decode_model_step_ms"] <= d["decode_step_ms"]:
        problems.append(f"{r['id']}: model part {d['decode_model_step_ms']} vs step {d['decode_step_ms']}")
    if r["mode"] == "sparse":
        # every sparse run switched its requests to sparse and fetched over the (host) store
        if not d.get("sparse_switches") or not d.get("sparse_steps") or not d.get("h2d_bytes_per_step"):
            problems.append(f"{r['id']}: no sparse steps/transfers: {d}")
        if d.get("roof_pcie_ms") is None or d["roof_pcie_ms"] < r["roofline"]["step_ms"]:
            problems.append(f"{r['id']}: PCIe floor missing or below the HBM roofline")
    # held concurrency is measured (/metrics every 0.5 s during the run): at most the offered,
    # and at least 1 once a few scrapes fell inside the run
    pk = r.get("peaks") or {}
    if pk.get("held", 0) > r["concurrency"] or (pk.get("samples", 0) >= 4 and pk.get("held", 0) < 1):
        problems.append(f"{r['id']}: held {r.get('peaks')} vs offered {r['concurrency']}")
    if r["mode"] == "sparse" and any(k not in d for k in ("moves_done", "move_bytes", "pressure_switches")):
        problems.append(f"{r['id']}: no home/move counters: {d}")
    if r["concurrency_label"] == "max" and r["admitted"] != min(r["max_concurrency"], r["concurrency"]):
        problems.append(f"{r['id']}: admitted {r['admitted']} vs max {r['max_concurrency']}")
modes = {(r["mode"], s) for r in runs for s in r["sweeps"]}
for want in [("dense", "fig11"), ("sparse", "fig11"), ("sparse", "fetch"), ("sparse", "topk"),
             ("dense", "latency"), ("sparse", "latency")]:
    if want not in modes:
        problems.append(f"no {want} run")
for p in problems:
    print("FAILED:", p)
sys.exit(1 if problems else 0)
PY
report=$(python3 "$ROOT/tools/bench_long_context.py" --report "$TMP/lc" --ok-only)
echo "$report" | grep -q "dec sp/d" || bad "--report printed no table: $report"
[[ $(echo "$report" | grep -c "sparse") -ge 5 ]] || bad "--report lacks the sparse rows"
if command -v gnuplot >/dev/null; then
  python3 "$ROOT/tools/plot_long_context.py" --out-dir "$TMP/plots" "$TMP/lc" >/dev/null ||
    bad "plot_long_context failed"
  for png in throughput_vs_concurrency_in256.png fetch_ratio.png topk.png latency.png; do
    [[ -s $TMP/plots/$png ]] || bad "no $png"
  done
else
  echo "gnuplot not installed: plots not checked"
fi
[[ $fail -eq 0 ]] && echo "long-context driver: all checks passed"
exit $fail
