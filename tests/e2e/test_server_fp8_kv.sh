#!/usr/bin/env bash
# oasis-server with an FP8 KV cache (--kv-cache-dtype fp8, docs/fp8.md), CPU backend, the
# embedded model: the scales are calibrated at start-up (logged); /metrics and --check-config
# name the dtype; the FP8 answers are close to the f32 cache's (teacher-forced log-probs of the
# f32 server's greedy text: top-1 agreement and mean |difference|); sparse KV with K >= every
# request's blocks (host home: e4m3 blocks and summaries through the host store; HBM home: in
# place) answers exactly as dense FP8; prefix-cache hits answer as misses; bad values are
# refused with exit 2.
# Usage: test_server_fp8_kv.sh <oasis-server> <repo root>
set -uo pipefail
SERVER=$1
ROOT=$2
cd "$ROOT"
source "$ROOT/tests/e2e/server_lib.sh"
server_test_init

# ---- refused settings (exit 2, a message naming the flag)
for bad_args in "--kv-cache-dtype fp8_e5m2" "--kv-cache-dtype int8"; do
  # shellcheck disable=SC2086
  out=$("$SERVER" --backend cpu $bad_args --check-config 2>&1)
  rc=$?
  if [[ $rc == 2 && $out == *kv-cache-dtype* ]]; then ok "refused ($bad_args): exit 2"; else bad "$bad_args: rc $rc" "$out"; fi
done
cfg=$("$SERVER" --backend cpu --kv-cache-dtype fp8_e4m3 --check-config 2>/dev/null)
[[ $cfg == *'"kv_cache_dtype": "fp8_e4m3"'* ]] && ok "--check-config: kv_cache_dtype fp8_e4m3" || bad "--check-config" "$cfg"
cfg=$("$SERVER" --backend cpu --check-config 2>/dev/null)
[[ $cfg == *'"kv_cache_dtype": "float32"'* ]] && ok "--check-config: kv_cache_dtype float32 by default" || bad "--check-config default" "$cfg"

TEXTS=(
  "The history of the lighthouse begins in the winter of 1854, when a storm"
  "In the beginning God created the heaven and the earth. And the earth was"
  "def fibonacci(n):\n    if n < 2:\n        return n\n"
  "A dictionary is a book that lists the words of a language"
)
strip() { python3 -c 'import json,sys; d=json.load(sys.stdin); d.pop("id",None); d.pop("created",None); d.get("usage",{}).pop("prompt_tokens_details",None); print(json.dumps(d, sort_keys=True))'; }
BODIES=(
  "{\"prompt\": $(ids 180 1), \"max_tokens\": 40, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": 2}"
  "{\"prompt\": $(ids 300 2), \"max_tokens\": 50, \"temperature\": 0, \"ignore_eos\": true}"
  "{\"prompt\": $(ids 100 3), \"max_tokens\": 40, \"temperature\": 1.2, \"seed\": 7, \"ignore_eos\": true, \"logprobs\": 1}"
  "{\"prompt\": $(ids 180 1), \"max_tokens\": 40, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": 2}"
)
run_bodies() {  # run_bodies <tag>: each body's stripped answer into $TMP/<tag>.<i>
  local i=0
  for b in "${BODIES[@]}"; do
    post /v1/completions "$b" | strip >"$TMP/$1.$i"
    i=$((i + 1))
  done
}

# ---- f32 reference: greedy continuations of the texts (token ids)
start_server "$TMP/f32.log" --backend cpu || exit 1
: >"$TMP/greedy.jsonl"
for t in "${TEXTS[@]}"; do
  post /v1/completions "{\"prompt\": \"$t\", \"max_tokens\": 48, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": 1, \"return_tokens_as_token_ids\": true}" >>"$TMP/greedy.jsonl"
  echo >>"$TMP/greedy.jsonl"
done
stop_server || fail=1

# ---- FP8 dense
start_server "$TMP/fp8.log" --backend cpu --kv-cache-dtype fp8 --log-level info || exit 1
if grep -q "fp8 e4m3, per-KV-head scales from [0-9]* calibration tokens (the built-in text)" "$TMP/fp8.log"; then
  ok "start-up calibration: $(grep -o 'max |K|.*' "$TMP/fp8.log" | head -1)"
else
  bad "no calibration line" "$(cat "$TMP/fp8.log")"
fi
[[ $(curl -s "$BASE/metrics" | grep -c '^oasis:kv_cache_dtype_info{.*dtype="fp8_e4m3"} 1') == 1 ]] &&
  ok "/metrics: oasis:kv_cache_dtype_info{dtype=\"fp8_e4m3\"} 1" || bad "kv_cache_dtype_info" "$(curl -s "$BASE/metrics" | grep kv_cache_dtype)"
# Teacher-forced: the f32 server's greedy tokens forced through the FP8 server.
i=0
: >"$TMP/forced.jsonl"
for t in "${TEXTS[@]}"; do
  forced=$(sed -n "$((i + 1))p" "$TMP/greedy.jsonl" | python3 -c 'import json,sys; lp=json.load(sys.stdin)["choices"][0]["logprobs"]; print(json.dumps([int(x.split(":")[1]) for x in lp["tokens"]]))')
  post /v1/completions "{\"prompt\": \"$t\", \"forced_output_ids\": $forced, \"max_tokens\": 48, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": 1, \"return_tokens_as_token_ids\": true}" >>"$TMP/forced.jsonl"
  echo >>"$TMP/forced.jsonl"
  i=$((i + 1))
done
verdict=$(python3 - "$TMP/greedy.jsonl" "$TMP/forced.jsonl" <<'PY'
import json, sys
ref = [json.loads(l)["choices"][0]["logprobs"] for l in open(sys.argv[1]) if l.strip()]
got = [json.loads(l)["choices"][0]["logprobs"] for l in open(sys.argv[2]) if l.strip()]
n = 0
diff = 0.0
for r, g in zip(ref, got):
    assert r["tokens"] == g["tokens"], "forced tokens differ"
    for rl, gl in zip(r["token_logprobs"], g["token_logprobs"]):
        n += 1
        diff += abs(rl - gl)
# top-1: the FP8 server's most likely token equals the forced (f32 greedy) token
n2 = a2 = 0
for r, g in zip(ref, got):
    for tok, top in zip(r["tokens"], g["top_logprobs"]):
        n2 += 1
        a2 += max(top.items(), key=lambda kv: kv[1])[0] == tok
print(f"{n} {a2 / n2:.4f} {diff / n:.4f}")
PY
)
read -r ntok agree mdiff <<<"$verdict"
if [[ -n $ntok ]] && python3 -c "import sys; sys.exit(0 if $ntok >= 150 and $agree >= 0.85 and $mdiff <= 0.15 else 1)"; then
  ok "FP8 vs f32 KV, $ntok teacher-forced tokens: top-1 agreement $agree, mean |log-prob difference| $mdiff"
else
  bad "FP8 vs f32 accuracy: $verdict" "$(head -c 600 "$TMP/forced.jsonl")"
fi
run_bodies dense
grep -q '"error"' "$TMP"/dense.* && bad "FP8 dense answered with errors" "$(cat "$TMP"/dense.*)"
cmp -s "$TMP/dense.0" "$TMP/dense.3" && ok "a prefix-cache hit (the same prompt again) answers as the miss" || bad "prefix-cache hit differs" "$(cat "$TMP/dense.0" "$TMP/dense.3")"
hits=$(metric 'oasis:prefix_cache_hits_total')
[[ ${hits%.*} -gt 0 ]] && ok "prefix cache hits with FP8 blocks: $hits tokens" || bad "no prefix-cache hits" "$hits"
stop_server || fail=1

# ---- FP8 sparse, K >= every request's blocks: exactly the dense FP8 answers
for home in host hbm; do
  start_server "$TMP/sparse-$home.log" --backend cpu --kv-cache-dtype fp8 --sparse-threshold 64 --sparse-switch threshold \
    --topk-blocks 32 --fetch-ratio 0.05 --host-kv-gib 0.05 --kv-home "$home" || exit 1
  run_bodies "sparse-$home"
  same=1
  for i in 0 1 2 3; do
    cmp -s "$TMP/dense.$i" "$TMP/sparse-$home.$i" || { same=0; bad "sparse ($home) answer $i differs from dense FP8" "$(cat "$TMP/dense.$i" "$TMP/sparse-$home.$i")"; }
  done
  switches=$(wait_metric 'oasis:sparse_switches_total' 'v >= 3')
  [[ $same == 1 && ${switches%.*} -ge 3 ]] && ok "sparse FP8 ($home home, $switches switches): every answer equals dense FP8"
  if [[ $home == host ]]; then
    fetched=$(metric 'oasis:sparse_blocks_fetched_total')
    bytes=$(metric 'oasis:sparse_h2d_bytes_total')
    # One fetched block of one layer: K and V x 16 tokens x head_dim x 1 byte.
    model_dir=${OASIS_EMBEDDED_MODEL:-$ROOT/models/embedded}
    per=$((2 * 16 * $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["head_dim"])' "$model_dir/config.json")))
    [[ ${fetched%.*} -gt 0 && ${bytes%.*} == $((${fetched%.*} * per)) ]] &&
      ok "host home: $fetched e4m3 blocks fetched, $bytes bytes ($per per block-layer: 1 byte a value)" || bad "fetch bytes: $fetched blocks, $bytes bytes (expected $per per block)"
  fi
  stop_server || fail=1
done
exit $fail
