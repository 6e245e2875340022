#!/usr/bin/env bash
# oasis-server with --tensor-parallel-size 2 on the CPU reference (two ranks as threads, the
# same TpModelRunner the GPUs use): greedy completions equal the single-rank server's (plain
# and with lookahead on a dummy EAGLE-3 head, which runs on rank 0 only); --check-config shows
# the per-rank KV heads; sizes that do not divide the heads fail with clear messages before
# anything loads. Sparse KV under TP (each rank's pipeline on its own KV heads and its share
# of the host store): with K >= every request's blocks, long prompts that switch to sparse get
# the single-rank dense server's completions, with lookahead (draft predictor) and without
# (previous-query), and the sparse metrics count both ranks' fetches.
# Usage: test_server_tp.sh <oasis-server> <repo root>
set -uo pipefail
SERVER=$1
ROOT=$2
cd "$ROOT"
source "$ROOT/tests/e2e/server_lib.sh"
server_test_init

BODIES=(
  '{"prompt": "Hello, world", "max_tokens": 24, "temperature": 0, "ignore_eos": true, "logprobs": 2}'
  '{"prompt": [5, 6, 7, 8, 9], "max_tokens": 30, "temperature": 0, "ignore_eos": true}'
  '{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "ignore_eos": true, "n": 2}'
)
# run_all <tag>: each body's answer into $TMP/<tag>.<i>.
run_all() {
  local i=0
  for b in "${BODIES[@]}"; do
    post /v1/completions "$b" >"$TMP/$1.$i"
    i=$((i + 1))
  done
}
# same_as <tag> <reference tag>: the same texts, log-probabilities within 1e-3 (two ranks'
# float sums differ from one rank's in the last bits).
same_as() {
  local f diff
  for f in "$TMP/$2".[0-9]*; do
    diff=$(python3 -c '
import json,sys
a=json.load(open(sys.argv[1]))["choices"]; b=json.load(open(sys.argv[2]))["choices"]
assert len(a) == len(b), "choices"
for x, y in zip(a, b):
    assert x["text"] == y["text"], (x["text"], y["text"])
    lx = (x.get("logprobs") or {}).get("token_logprobs", []); ly = (y.get("logprobs") or {}).get("token_logprobs", [])
    assert len(lx) == len(ly) and all(abs(p - q) < 1e-3 for p, q in zip(lx, ly)), (lx, ly)' "$f" "$TMP/$1.${f##*.}" 2>&1)
    if [[ -n $diff ]]; then
      bad "$1 differs from $2 (request ${f##*.})" "$diff"
      return
    fi
  done
  ok "$1 completions equal $2's"
}

start_server "$TMP/tp1.log" --backend cpu || exit 1
run_all tp1
stop_server || fail=1

start_server "$TMP/tp2.log" --backend cpu --tensor-parallel-size 2 || exit 1
run_all tp2
same_as tp2 tp1
stop_server || fail=1

start_server "$TMP/tp2-lookahead.log" --backend cpu --tensor-parallel-size 2 --draft-load-format dummy \
  --lookahead reject || exit 1
run_all tp2-lookahead
same_as tp2-lookahead tp1
stop_server || fail=1

out=$("$SERVER" --backend cpu --tensor-parallel-size 2 --check-config 2>&1)
if echo "$out" | grep -q '"tensor_parallel_size": 2' && echo "$out" | grep -q '"kv_heads_per_rank": 1'; then
  ok "--check-config shows 2 ranks with 1 KV head each"
else
  bad "--check-config under TP" "$out"
fi
out=$("$SERVER" --backend cpu --tensor-parallel-size 3 --check-config 2>&1)
rc=$?
if [[ $rc != 0 ]] && echo "$out" | grep -q 'num_attention_heads = 4 is not divisible by --tensor-parallel-size 3'; then
  ok "--tensor-parallel-size 3 refused (exit $rc)"
else
  bad "--tensor-parallel-size 3 (exit $rc)" "$out"
fi

# Sparse KV under TP: long prompts (token ids) past the threshold of 64 at once or while decoding.
BODIES=(
  "{\"prompt\": $(ids 180 1), \"max_tokens\": 40, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": 2}"
  "{\"prompt\": $(ids 300 2), \"max_tokens\": 50, \"temperature\": 0, \"ignore_eos\": true}"
  "{\"prompt\": $(ids 60 3), \"max_tokens\": 40, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": 1}"
)
start_server "$TMP/long-tp1.log" --backend cpu || exit 1
run_all long-tp1
stop_server || fail=1
SPARSE=(--backend cpu --tensor-parallel-size 2 --sparse-threshold 64 --sparse-switch threshold --topk-blocks 32 --fetch-ratio 0.05
  --host-kv-gib 0.05 --sparse-agreement-interval 2)
# The draft predictor with the KV in the host store (fetched over both ranks); previous-query
# with the default home, auto: the pool has room, so every request reads its KV in place.
for spec in "draft host" "previous-query auto"; do
  read -r predictor home <<<"$spec"
  tag=sparse-tp2-$predictor-$home
  extra=()
  [[ $predictor == draft ]] && extra=(--draft-load-format dummy --lookahead reject)
  start_server "$TMP/$tag.log" "${SPARSE[@]}" --sparse-predictor "$predictor" --kv-home "$home" "${extra[@]}" || exit 1
  run_all "$tag"
  same_as "$tag" long-tp1
  switches=$(wait_metric 'oasis:sparse_switches_total' 'v >= 3')
  if [[ $home == host ]]; then
    fetched=$(wait_metric 'oasis:sparse_blocks_fetched_total' 'v > 0')
  else
    fetched=$(wait_metric 'oasis:sparse_blocks_fetched_total' 'v >= 0')
  fi
  in_hbm=$(curl -s "$BASE/metrics" | sed -n 's/^oasis:kv_home_switches_total{.*home="hbm"} \(.*\)$/\1/p')
  held=$(wait_metric 'oasis:sparse_requests' 'v == 0')
  if python3 -c "import sys; s,f,m,h=map(float,sys.argv[2:]); host=sys.argv[1]=='host'; sys.exit(0 if s >= 3 and h == 0 and ((f > 0 and m == 0) if host else (f == 0 and m == s)) else 1)" \
      "$home" "${switches:-0}" "${fetched:-0}" "${in_hbm:--1}" "${held:--1}"; then
    ok "$tag: $switches requests went sparse ($in_hbm in place), $fetched blocks fetched over both ranks, none held after"
  else
    bad "$tag: sparse metrics (switches ${switches:-none}, in place ${in_hbm:-none}, fetched ${fetched:-none}, held ${held:-none})" \
      "$(tail -20 "$TMP/$tag.log")"
  fi
  stop_server || fail=1
done
out=$("$SERVER" --tensor-parallel-size 0 --check-config 2>&1)
rc=$?
if [[ $rc != 0 ]] && echo "$out" | grep -q 'tensor-parallel-size must be >= 1'; then
  ok "--tensor-parallel-size 0 refused (exit $rc)"
else
  bad "--tensor-parallel-size 0 (exit $rc)" "$out"
fi
exit $fail
