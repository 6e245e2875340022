#!/usr/bin/env bash
# tools/bench_prefix_cache.py as the GPU runs use it, on the CPU: it starts the real oasis-server
# (the tiny default's shapes, dummy weights) with prefix caching on and off, drives the same
# multi-turn workload with the real oasis-bench against each, and must leave a summary whose
# runs all completed: caching on serves later turns' history from the cache (every earlier
# turn's whole blocks), caching off serves none; the RESULT line, --report and the pack.
# Usage: test_prefix_cache_driver.sh <oasis-server> <oasis-bench> <repo root>
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

python3 "$ROOT/tools/bench_prefix_cache.py" --server-bin "$SERVER" --bench-bin "$BENCH" \
  --model-config "$ROOT/tests/fixtures/tiny-default/config.json" --tokenizer "$ROOT/tests/fixtures/tiny-default" \
  --workload tiny:256:48:3:4:2 --output-len 16 --prefix-len 32 --max-model-len 1024 --max-num-seqs 8 \
  --run-timeout 120 --startup-timeout 120 --out-dir "$TMP/pc" >"$TMP/driver.out" 2>&1
rc=$?
tail -8 "$TMP/driver.out"
[[ $rc -eq 0 ]] || bad "driver exit $rc"
[[ -f $TMP/pc/runs.tar.xz ]] || bad "no runs.tar.xz"
tar tJf "$TMP/pc/runs.tar.xz" | grep -q '^tiny-on.result.json$' || bad "the pack lacks tiny-on.result.json"
grep -qE '^RESULT prefix_cache tiny: later-turn TTFT p50 [0-9]+ -> [0-9]+ ms' "$TMP/driver.out" || bad "no RESULT line"
python3 - "$TMP/pc/summary.json" <<'PY' || fail=1
import json, sys
runs = {r["caching"]: r for r in json.load(open(sys.argv[1]))["runs"]}
problems = []
for c in ("on", "off"):
    r = runs.get(c)
    if not r or r["status"] != "ok":
        problems.append(f"caching {c}: {r and r['status']} {r and r.get('error')}")
        continue
    s = r["summary"]
    if s["completed"] != 12 or s["failed"]:
        problems.append(f"caching {c}: {s['completed']} completed, {s['failed']} failed")
    turns = {t["turn"]: t for t in s["per_turn"] or []}
    if sorted(turns) != [1, 2, 3]:
        problems.append(f"caching {c}: turns {sorted(turns)}")
        continue
    if c == "off":
        if s["cached_tokens"] or s["hit_rate"] is not None:
            problems.append(f"caching off served {s['cached_tokens']} cached tokens, hit rate {s['hit_rate']}")
    else:
        # Turn 2 resends turn 1's 256 tokens (16 whole blocks), turn 3 turn 2's 304 (19 blocks).
        if turns[2]["mean_cached_tokens"] != 256 or turns[3]["mean_cached_tokens"] != 304:
            problems.append(f"caching on: cached per turn {turns[2]['mean_cached_tokens']}, "
                            f"{turns[3]['mean_cached_tokens']} (expected 256, 304)")
        if not s["hit_rate"] or s["hit_rate"] <= 0.5:
            problems.append(f"caching on: hit rate {s['hit_rate']}")
        if not s["later_ttft_p50_ms"]:
            problems.append("caching on: no later-turn TTFT")
if problems:
    print("FAILED: " + "; ".join(problems))
    sys.exit(1)
PY
python3 "$ROOT/tools/bench_prefix_cache.py" --report "$TMP/pc" >"$TMP/report.out" 2>&1 || bad "--report failed"
grep -q '^RESULT prefix_cache tiny' "$TMP/report.out" || bad "--report printed no RESULT line"

# The host tier: eight conversations with think time in a pool of 96 head-blocks (the
# histories of idle conversations do not fit; 96 blocks over the 2 KV heads hold one request of
# 768 tokens, the context the server must hold whole): caching with the tier serves more from cache
# than caching without, its reloads counted, and the host RESULT line.
python3 "$ROOT/tools/bench_prefix_cache.py" --server-bin "$SERVER" --bench-bin "$BENCH" \
  --model-config "$ROOT/tests/fixtures/tiny-default/config.json" --tokenizer "$ROOT/tests/fixtures/tiny-default" \
  --workload tiny:256:48:3:8:8 --output-len 16 --prefix-len 32 --max-model-len 768 --think-ms 200 \
  --modes on,host --host-tier-gib 0.01 --server-args "--num-kv-slots 96" \
  --run-timeout 120 --startup-timeout 120 --out-dir "$TMP/host" >"$TMP/host.out" 2>&1 || bad "host-tier driver exit $?"
tail -5 "$TMP/host.out"
grep -qE '^RESULT prefix_cache tiny host tier: later-turn TTFT p50' "$TMP/host.out" || bad "no host-tier RESULT line"
python3 - "$TMP/host/summary.json" <<'PY' || fail=1
import json, sys
runs = {r["caching"]: r for r in json.load(open(sys.argv[1]))["runs"]}
on, host = runs["on"]["summary"], runs["host"]["summary"]
problems = []
if runs["on"]["status"] != "ok" or runs["host"]["status"] != "ok" or on["completed"] != 24 or host["completed"] != 24:
    problems.append(f"runs: {runs['on']['status']} {runs['host']['status']}")
if on["host_hits"]:
    problems.append(f"caching without a tier reports {on['host_hits']} host hits")
if not host["host_hits"] or host["host_hits"] % 16:
    problems.append(f"host tier: {host['host_hits']} host hits (whole blocks expected)")
if not host["cached_ratio"] > on["cached_ratio"]:
    problems.append(f"cached share with the tier {host['cached_ratio']} vs without {on['cached_ratio']}")
if problems:
    print("FAILED: " + "; ".join(problems))
    sys.exit(1)
PY
[[ $fail -eq 0 ]] && echo "prefix cache driver: OK"
exit $fail
