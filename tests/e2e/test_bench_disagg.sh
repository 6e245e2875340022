#!/usr/bin/env bash
# tools/bench_disagg.py as the two-GPU runs use it, on the CPU: it starts a real prefill
# instance, decode instances with --rpf on and off and oasis-router (the embedded model's
# shapes, dummy weights and draft head), drives them with the real oasis-bench at one request
# rate, and must leave a summary whose runs all completed, with every request handed off and
# imported, partial admission below full admission, and every lease ended; then --pack. With
# a shared 256-token prefix (--prefix-lens) the decode instance's prefix cache holds it for the
# later requests: fewer admission bytes per request than without, tokens held reported.
# Usage: test_bench_disagg.sh <oasis-server> <oasis-router> <oasis-bench> <repo root>
set -uo pipefail
SERVER=$1
ROUTER=$2
BENCH=$3
ROOT=$4
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 "$ROOT/tools/bench_disagg.py" --server-bin "$SERVER" --router-bin "$ROUTER" --bench-bin "$BENCH" \
  --model-config "$ROOT/tests/fixtures/tiny-default/config.json" --tokenizer "$ROOT/tests/fixtures/tiny-default" --inputs 400 \
  --output-len 16 --rates 2 --num-prompts 4 --prefix-lens 0,256 --fetch-ratios 0.25 --topk 4 --modes rpf,full --max-num-seqs 8 \
  --host-kv-gib 0.05 --prefill-host-kv-gib 0.05 --staging-pool-gib 0.05 --prefill-gpu -1 --decode-gpu -1 \
  --server-args "--backend cpu --threads 1" --run-timeout 120 --startup-timeout 120 --out-dir "$TMP/d" \
  --pack >"$TMP/driver.out" 2>&1
rc=$?
tail -12 "$TMP/driver.out"
fail=0
[[ $rc -eq 0 ]] || { echo "FAILED: driver exit $rc"; fail=1; }
[[ -f $TMP/d/runs.tar.xz && ! -d $TMP/d/runs ]] || { echo "FAILED: --pack left no runs.tar.xz"; fail=1; }
python3 - "$TMP/d/summary.json" <<'PY' || fail=1
import json, sys
all_runs = json.load(open(sys.argv[1]))["runs"]
runs = {r["mode"]: r for r in all_runs if r.get("prefix_len") == 0}
shared = {r["mode"]: r for r in all_runs if r.get("prefix_len") == 256}
ok = True
def check(cond, msg):
    global ok
    print(("ok: " if cond else "FAILED: ") + msg)
    ok = ok and cond
for mode, r in [(m, runs.get(m, {})) for m in ("rpf", "full")] + [(m + " prefix 256", shared.get(m, {})) for m in ("rpf", "full")]:
    b = r.get("bench") or {}
    check(r.get("status") == "ok" and b.get("completed") == 4, f"{mode}: 4 requests completed ({r.get('status')}, {r.get('error')})")
    check(r.get("handoffs") == 4 and r.get("imports") == 4, f"{mode}: 4 handoffs, 4 imports ({r.get('handoffs')}, {r.get('imports')})")
    check(r.get("leases_ended") == 4 and r.get("leases_held_after") == 0, f"{mode}: every lease ended ({r.get('leases_ended')})")
    check((r.get("admission_gib_per_request") or 0) > 0 and (r.get("staged_gib_per_request") or 0) > 0, f"{mode}: bytes staged and read")
if "rpf" in runs and "full" in runs:
    a, f = runs["rpf"]["admission_gib_per_request"] or 0, runs["full"]["admission_gib_per_request"] or 0
    check(0 < a < f, f"partial admission {a:.6f} GiB < full {f:.6f} GiB per request")
    check(abs(f - runs["full"]["staged_gib_per_request"]) < 1e-9, "full transfer reads everything staged")
for mode in ("rpf", "full"):
    r, s = runs.get(mode, {}), shared.get(mode, {})
    a0, a1 = r.get("admission_gib_per_request") or 0, s.get("admission_gib_per_request") or 0
    held = s.get("decode_cached_tokens_per_request") or 0
    check(held > 0 and (r.get("decode_cached_tokens_per_request") or 0) == 0,
          f"{mode}: the shared prefix held by the decode instance ({held:.0f} tokens per request)")
    check(0 < a1 < a0, f"{mode}: admission with the shared prefix {a1:.6f} GiB < without {a0:.6f} GiB per request")
sys.exit(0 if ok else 1)
PY
[[ $fail == 0 ]] && echo "PASSED: bench_disagg.py on the CPU" || echo "FAILED: bench_disagg.py on the CPU"
exit $fail
