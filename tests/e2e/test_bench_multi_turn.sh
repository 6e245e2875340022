#!/usr/bin/env bash
# oasis-bench --dataset-name multi-turn against the real oasis-server with
# --enable-prefix-caching (CPU backend, the embedded default model): every turn resends the
# whole history, so turn 1 reports no cached prompt tokens and every later turn at least the
# previous turn's full blocks; the per-turn table and the cached-token ratio are in the
# summary and the result file, and the cached tokens add up to the server's
# oasis:prefix_cache_hits_total. Turns of a conversation never overlap; --max-concurrency
# holds. The chat endpoint with a shared system prompt; the shared-system-prompt workload
# (--dataset-name random --random-prefix-len); contradictory flags exit 2.
# Usage: test_bench_multi_turn.sh <oasis-bench> <oasis-server> <repo root>
set -uo pipefail
BENCH=$1
SERVER=$2
ROOT=$3
# A missing binary is a failure, not a skip: CTest registers this test only when both exist.
[[ -x $BENCH ]] || { echo "FAILED: no oasis-bench at $BENCH"; exit 1; }
[[ -x $SERVER ]] || { echo "FAILED: no oasis-server at $SERVER"; exit 1; }
source "$ROOT/tests/e2e/server_lib.sh"
server_test_init

start_server "$TMP/server.log" --host 127.0.0.1 --backend cpu --enable-prefix-caching || exit 1
ok "oasis-server --enable-prefix-caching on port $PORT"
VOCAB=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$ROOT/tests/fixtures/tiny-default/config.json")
# The server's prompt tokens found in its prefix cache so far.
hits() { metric 'oasis:prefix_cache_hits_total' | awk '{s += $1} END {printf "%d", s}'; }
# check <description> <python assertion script over d (the result)>: the script's output on failure.
check() {
  local desc=$1 file=$2 script=$3 out
  if out=$(python3 -c "import json,sys
d = json.load(open(sys.argv[1]))
$script" "$file" 2>&1); then ok "$desc"; else bad "$desc" "$out"; fi
}

# ---- 1. completions, token ids: 3 conversations x 3 turns, 2 at a time ---------------------
hits0=$(hits)
"$BENCH" --base-url "$BASE" --dataset-name multi-turn --multi-turn-conversations 3 \
  --multi-turn-turns 3 --multi-turn-first-len 64 --multi-turn-increment-len 32 --output-len 8 \
  --max-concurrency 2 --seed 3 --random-vocab-size "$VOCAB" --no-progress \
  --result-file "$TMP/mt.json" >"$TMP/mt.out" 2>&1
rc=$?
[[ $rc == 0 ]] && ok "multi-turn run exits 0" || bad "multi-turn run exit status $rc" "$(cat "$TMP/mt.out")"
check "9 requests, each turn's prompt = 64 + 32 (t - 1) tokens, 8 output tokens, records in order" "$TMP/mt.json" "
s, rs = d['summary'], d['requests']
assert s['completed'] == 9 and s['failed'] == 0, s
assert [(r['conversation'], r['turn']) for r in rs] == [(c, t) for c in range(3) for t in (1, 2, 3)], rs
for r in rs:
    assert r['prompt_tokens'] == 64 + 32 * (r['turn'] - 1) and r['output_tokens'] == 8, r
c = d['config']
assert (c['dataset'], c['num_prompts'], c['multi_turn_turns'], c['multi_turn_increment_len']) == ('multi-turn', 9, 3, 32), c"
check "turn 1 cold (0 cached), turn t > 1 cached >= turn t-1's full blocks and < its prompt" "$TMP/mt.json" "
for r in d['requests']:
    if r['turn'] == 1:
        assert r['cached_tokens'] == 0, r
    else:
        prev = 64 + 32 * (r['turn'] - 2)
        assert prev // 16 * 16 <= r['cached_tokens'] < r['prompt_tokens'], r"
check "per-turn summary in the result: turn 1 mean cached 0, later turns > 0; the ratio" "$TMP/mt.json" "
s = d['summary']
pt = s['per_turn']
assert [t['turn'] for t in pt] == [1, 2, 3] and all(t['completed'] == 3 and t['failed'] == 0 for t in pt), pt
assert pt[0]['mean_cached_tokens'] == 0 and pt[1]['mean_cached_tokens'] >= 64 and pt[2]['mean_cached_tokens'] >= 96, pt
assert all(0 < t['median_ttft_ms'] <= t['p90_ttft_ms'] for t in pt), pt
total = sum(r['cached_tokens'] for r in d['requests'])
assert s['total_cached_tokens'] == total > 0, s
assert abs(s['cached_token_ratio'] - total / s['total_input_tokens']) < 1e-9, s"
check "turns of a conversation never overlap; at most 2 requests in flight" "$TMP/mt.json" "
rs = d['requests']
for a, b in zip(rs, rs[1:]):
    if a['conversation'] == b['conversation']:
        assert b['start_s'] * 1e3 >= a['start_s'] * 1e3 + a['e2el_ms'] - 1e-6, (a, b)
assert d['summary']['max_concurrent_requests'] <= 2, d['summary']"
if grep -q "Per Turn (TTFT, cached prompt tokens)" "$TMP/mt.out" &&
   grep -qE "^1 +3 +0 +[0-9.]+ +[0-9.]+ +0\.0 +64\.0$" "$TMP/mt.out" &&
   grep -qE "^2 +3 +0 +[0-9.]+ +[0-9.]+ +(6[4-9]|[7-9][0-9])\.[0-9] +96\.0$" "$TMP/mt.out" &&
   grep -qE "^Cached / total prompt tokens: +0\.[0-9]*[1-9][0-9]* *$" "$TMP/mt.out"; then
  ok "the text summary has the per-turn table (turn 1: 0 cached) and the cached-token ratio"
else
  bad "text summary" "$(cat "$TMP/mt.out")"
fi
# The server counts the same hits (polled: it publishes counters after its step).
want=$(($(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["total_cached_tokens"])' "$TMP/mt.json") + hits0))
got=$(wait_metric 'oasis:prefix_cache_hits_total' "v == $want")
[[ $got == "$want" || ${got%.*} == "$want" ]] && ok "cached tokens = the server's prefix_cache_hits_total delta" ||
  bad "oasis:prefix_cache_hits_total is $got, expected $want"

# ---- 2. chat, a system prompt shared by every conversation, one conversation at a time -----
"$BENCH" --base-url "$BASE" --endpoint-type chat --dataset-name multi-turn \
  --multi-turn-conversations 3 --multi-turn-turns 2 --multi-turn-first-len 48 \
  --multi-turn-increment-len 24 --output-len 6 --prefix-len 32 --max-concurrency 1 \
  --multi-turn-think-ms 50 --seed 4 --no-progress --result-file "$TMP/chat.json" >"$TMP/chat.out" 2>&1 ||
  bad "chat multi-turn run failed" "$(cat "$TMP/chat.out")"
check "chat: the first conversation's turn 1 is cold, later conversations' turn 1 hit the system prompt, turn 2 hits more" "$TMP/chat.json" "
rs = d['requests']
assert d['summary']['completed'] == 6 and d['config']['endpoint'] == '/v1/chat/completions', d['summary']
assert rs[0]['turn'] == 1 and rs[0]['cached_tokens'] == 0, rs[0]
for r in rs[1:]:
    assert 16 <= r['cached_tokens'] < r['prompt_tokens'], r
for a, b in zip(rs, rs[1:]):
    if a['conversation'] == b['conversation']:
        assert b['cached_tokens'] > a['cached_tokens'], (a, b)
        assert b['start_s'] * 1e3 >= a['start_s'] * 1e3 + a['e2el_ms'] + 50 - 1e-6, (a, b)  # think time
assert d['config']['multi_turn_prefix_len'] == 32 and d['config']['multi_turn_think_ms'] == 50, d['config']"

# ---- 3. the shared-system-prompt workload: random prompts behind one shared prefix ---------
"$BENCH" --base-url "$BASE" --num-prompts 4 --random-prefix-len 64 --random-input-len 16 \
  --random-output-len 4 --max-concurrency 1 --seed 5 --random-vocab-size "$VOCAB" --no-progress \
  --result-file "$TMP/shared.json" >"$TMP/shared.out" 2>&1 || bad "shared-prefix run failed" "$(cat "$TMP/shared.out")"
check "shared system prompt: every prompt after the first finds the 64-token prefix cached; ratio reported, no per-turn part" "$TMP/shared.json" "
rs, s = d['requests'], d['summary']
assert rs[0]['cached_tokens'] == 0 and all(r['cached_tokens'] == 64 for r in rs[1:]), rs
assert s['total_cached_tokens'] == 192 and abs(s['cached_token_ratio'] - 192 / 320) < 1e-9, s
assert 'per_turn' not in s and 'turn' not in rs[0], s"
grep -qE "^Cached / total prompt tokens: +0\.6000 *$" "$TMP/shared.out" &&
  ok "shared system prompt: the text summary's ratio is 0.6000" || bad "shared-prefix summary" "$(cat "$TMP/shared.out")"

# ---- 4. contradictory or out-of-range flags: exit 2, naming the problem -------------------
refuse() {
  local want=$1
  shift
  local out rc
  out=$("$BENCH" --base-url "$BASE" --no-progress "$@" 2>&1)
  rc=$?
  [[ $rc == 2 ]] && grep -qF -- "$want" <<<"$out" && ok "refused (exit 2): $*" ||
    bad "expected exit 2 with '$want' for: $*; got $rc" "$out"
}
MT=(--dataset-name multi-turn --multi-turn-conversations 2 --multi-turn-turns 2 --multi-turn-first-len 32)
refuse "--multi-turn-increment-len 4 is less than the output length 8" "${MT[@]}" --multi-turn-increment-len 4 --output-len 8
refuse "--multi-turn-conversations must be positive" --dataset-name multi-turn --multi-turn-conversations 0
refuse "--multi-turn-turns must be positive" --dataset-name multi-turn --multi-turn-turns -2
refuse "--multi-turn-prefix-len (--prefix-len) 32 must be less than --multi-turn-first-len 32" "${MT[@]}" --prefix-len 32
refuse "--num-prompts does not apply to --dataset-name multi-turn" "${MT[@]}" --num-prompts 10
refuse "--multi-turn-turns applies to --dataset-name multi-turn only" --multi-turn-turns 3
refuse "--multi-turn-think-ms must be a finite number >= 0" "${MT[@]}" --multi-turn-think-ms -5
# Checked before the server is asked anything: no server needed to hear it.
BASE=http://127.0.0.1:9 refuse "--multi-turn-first-len must be positive" "${MT[@]}" --multi-turn-first-len 0

stop_server || fail=1
[[ $fail == 0 ]] && echo "PASSED" || echo "FAILED"
exit $fail
