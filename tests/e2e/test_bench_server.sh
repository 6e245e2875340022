#!/usr/bin/env bash
# oasis-bench against the real oasis-server (CPU backend, the embedded default model): short
# runs whose request and token counts must equal the deltas of the server's own /metrics
# counters (oasis:request_success_total, oasis:prompt_tokens_total,
# oasis:generation_tokens_total), warm-ups included; forced output lengths (ignore_eos +
# min_tokens); the chat endpoint; a JSONL workload; rejected requests and a dead server
# counted as failures with their reasons and a non-zero exit; PNG plots from the results
# when gnuplot is installed.
# Usage: test_bench_server.sh <oasis-bench> <oasis-server> <repo root>
set -uo pipefail
BENCH=$1
SERVER=$2
ROOT=$3
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAILED: $1"; [[ $# -gt 1 ]] && echo "$2" | head -c 3000 && echo; fail=1; }
# A missing binary is a failure, not a skip: CTest registers this test only when both exist.
[[ -x $BENCH ]] || { echo "FAILED: no oasis-bench at $BENCH"; exit 1; }
[[ -x $SERVER ]] || { echo "FAILED: no oasis-server at $SERVER"; exit 1; }

TMP=$(mktemp -d)
SERVER_PID=""
cleanup() {
  [[ -n $SERVER_PID ]] && kill -TERM "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT

# ---- start the server on a free loopback port (--port 0: the kernel picks, the log says) ----
"$SERVER" --host 127.0.0.1 --port 0 --backend cpu --log-level warn >"$TMP/server.log" 2>&1 &
SERVER_PID=$!
PORT=""
for _ in $(seq 1 600); do
  PORT=$(sed -n 's|^oasis-server: listening on http://[^:]*:\([0-9]*\)$|\1|p' "$TMP/server.log" | head -1)
  [[ -n $PORT ]] && break
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
[[ -n $PORT ]] || { echo "FAILED: oasis-server did not start"; cat "$TMP/server.log"; exit 1; }
BASE="http://127.0.0.1:$PORT"
for _ in $(seq 1 600); do
  [[ $(curl -s -o /dev/null -w '%{http_code}' "$BASE/health") == 200 ]] && break
  sleep 0.1
done
[[ $(curl -s -o /dev/null -w '%{http_code}' "$BASE/health") == 200 ]] ||
  { echo "FAILED: oasis-server not healthy"; cat "$TMP/server.log"; exit 1; }
ok "oasis-server on port $PORT"
# The embedded model's vocabulary bounds the random token ids.
VOCAB=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$ROOT/tests/fixtures/tiny-default/config.json")

# counters: "requests prompt_tokens generation_tokens preemptions", each summed over its labels.
counters() {
  curl -s "$BASE/metrics" | python3 -c '
import sys
want = ["oasis:request_success_total", "oasis:prompt_tokens_total", "oasis:generation_tokens_total",
        "oasis:num_preemptions_total"]
sums = dict.fromkeys(want, 0.0)
for line in sys.stdin:
    if line.startswith("#") or not line.strip():
        continue
    name = line.split("{")[0].split()[0]
    if name in sums:
        sums[name] += float(line.split()[-1])
print(" ".join(str(int(sums[n])) for n in want))'
}
# json_get <file> <python expression over d>
json_get() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2" 2>&1; }

# check_against_metrics <description> <result file> <counters before>: the server's counter
# deltas must equal the result's measured + warm-up totals (polled briefly: the server may
# update its counters just after the last byte of a stream).
check_against_metrics() {
  local desc=$1 result=$2 before=$3
  local expected
  expected=$(json_get "$result" "'%d %d %d' % (d['summary']['completed'] + d['warmup']['completed'], d['summary']['total_input_tokens'] + d['warmup']['prompt_tokens'], d['summary']['total_output_tokens'] + d['warmup']['output_tokens'])")
  local delta=""
  for _ in $(seq 1 50); do
    read -r r0 p0 g0 x0 <<<"$before"
    read -r r1 p1 g1 x1 <<<"$(counters)"
    delta="$((r1 - r0)) $((p1 - p0)) $((g1 - g0))"
    [[ $delta == "$expected" ]] && break
    sleep 0.1
  done
  if [[ $delta == "$expected" ]]; then
    ok "$desc: /metrics deltas (requests, prompt tokens, generated tokens) = result: $delta"
  elif [[ $((x1 - x0)) -gt 0 ]]; then
    bad "$desc: /metrics deltas $delta != result $expected with $((x1 - x0)) preemptions (recomputed prefills count twice); give the server more KV"
  else
    bad "$desc: /metrics deltas $delta != result $expected"
  fi
}

# ---- 1. random token-id prompts, forced output lengths, concurrency 4, warm-ups ------------
before=$(counters)
out=$("$BENCH" --base-url "$BASE" --num-prompts 16 --random-input-len 32 --random-output-len 16 \
  --max-concurrency 4 --num-warmups 2 --seed 1 --random-vocab-size "$VOCAB" \
  --percentiles 50,90,99 --result-file "$TMP/random.json" 2>"$TMP/random.err")
rc=$?
[[ $rc == 0 ]] && ok "random run exits 0" || bad "random run exit status $rc" "$out$(cat "$TMP/random.err")"
grep -q "^Successful requests: *16 *$" <<<"$out" && ok "summary: 16 successful" || bad "summary lacks 16 successful requests" "$out"
for line in "Failed requests: *0 *$" "Total input tokens: *512 *$" "Total generated tokens: *256 *$" \
            "Request throughput \(req/s\):" "Output token throughput \(tok/s\):" "Total Token throughput \(tok/s\):" \
            "Mean TTFT \(ms\):" "Median TPOT \(ms\):" "P90 ITL \(ms\):" "P99 E2EL \(ms\):"; do
  grep -qE "^$line" <<<"$out" && ok "summary has '$line'" || bad "summary lacks '$line'" "$out"
done
[[ $(json_get "$TMP/random.json" "d['summary']['completed'] == 16 and d['summary']['failed'] == 0 and d['failures'] == [] and len(d['requests']) == 16") == True ]] &&
  ok "result JSON: 16 completed, no failures, 16 records" || bad "result JSON counts" "$(head -c 2000 "$TMP/random.json")"
[[ $(json_get "$TMP/random.json" "all(r['success'] and r['usage_reported'] and r['prompt_tokens'] == 32 and r['output_tokens'] == 16 and r['finish_reason'] == 'length' for r in d['requests'])") == True ]] &&
  ok "every request: usage 32 prompt tokens, exactly 16 output tokens (ignore_eos + min_tokens), finish length" ||
  bad "per-request token counts" "$(json_get "$TMP/random.json" "[(r['prompt_tokens'], r['output_tokens'], r['finish_reason'], r.get('error')) for r in d['requests']]")"
# A server may put several tokens in one chunk, so a request has at most 15 gaps, not exactly 15.
[[ $(json_get "$TMP/random.json" "all(0 < r['ttft_ms'] <= r['e2el_ms'] and len(r['itl_ms']) <= 15 and min(r['itl_ms'] + [0]) >= 0 and abs(r['tpot_ms'] * 15 - (r['e2el_ms'] - r['ttft_ms'])) < 1e-6 for r in d['requests']) and sum(len(r['itl_ms']) for r in d['requests']) > 0") == True ]] &&
  ok "every request: 0 < TTFT <= E2EL, ITL gaps >= 0, TPOT = (E2EL - TTFT) / 15" || bad "per-request latencies" "$(head -c 3000 "$TMP/random.json")"
[[ $(json_get "$TMP/random.json" "d['warmup'] == {'requests': 2, 'completed': 2, 'failed': 0, 'prompt_tokens': 64, 'output_tokens': 32}") == True ]] &&
  ok "warm-up totals recorded" || bad "warm-up totals" "$(json_get "$TMP/random.json" "d['warmup']")"
[[ $(json_get "$TMP/random.json" "d['summary']['max_concurrent_requests'] <= 4 and d['config']['max_concurrency'] == 4") == True ]] &&
  ok "never more than 4 requests in flight" || bad "concurrency" "$(json_get "$TMP/random.json" "d['summary']")"
check_against_metrics "random run" "$TMP/random.json" "$before"

# ---- 2. the same workload again: the seed reproduces the prompts, so the counts repeat -------
before=$(counters)
"$BENCH" --base-url "$BASE" --num-prompts 16 --random-input-len 32 --random-output-len 16 --max-concurrency 8 \
  --seed 1 --random-vocab-size "$VOCAB" --random-range-ratio 0.5 --random-prefix-len 8 --request-rate 50 \
  --result-file "$TMP/paced.json" >"$TMP/paced.out" 2>&1 ||
  bad "paced run with range ratio and prefix failed" "$(cat "$TMP/paced.out")"
[[ $(json_get "$TMP/paced.json" "all(8 + 16 <= r['prompt_tokens'] <= 8 + 48 and 8 <= r['output_tokens'] <= 24 and r['output_tokens'] == r['expected_output_tokens'] for r in d['requests']) and d['summary']['completed'] == 16") == True ]] &&
  ok "range ratio 0.5 + prefix 8: lengths within bounds, each output length as asked" ||
  bad "range-ratio lengths" "$(json_get "$TMP/paced.json" "[(r['prompt_tokens'], r['output_tokens'], r['expected_output_tokens']) for r in d['requests']]")"
check_against_metrics "paced run (Poisson 50 req/s)" "$TMP/paced.json" "$before"

# ---- 3. chat endpoint with random text -------------------------------------------------------
before=$(counters)
"$BENCH" --base-url "$BASE" --endpoint-type chat --num-prompts 6 --random-input-len 12 --random-output-len 5 \
  --max-concurrency 3 --result-file "$TMP/chat.json" >"$TMP/chat.out" 2>&1 || bad "chat run failed" "$(cat "$TMP/chat.out")"
[[ $(json_get "$TMP/chat.json" "d['config']['endpoint'] == '/v1/chat/completions' and d['summary']['completed'] == 6 and all(r['output_tokens'] == 5 and r['prompt_tokens'] > 12 for r in d['requests'])") == True ]] &&
  ok "chat: 6 completed, 5 tokens each, prompt includes the template" || bad "chat result" "$(head -c 3000 "$TMP/chat.json")"
check_against_metrics "chat run" "$TMP/chat.json" "$before"

# ---- 4. JSONL workload (text and id prompts, per-line output lengths) -----------------------
printf '%s\n' '{"prompt": "Hello there, how are you today?", "output_len": 3}' '{"prompt": [1, 2, 3, 4, 5], "output_len": 6}' \
  '{"prompt": "Tell me a story."}' >"$TMP/prompts.jsonl"
before=$(counters)
"$BENCH" --base-url "$BASE" --dataset jsonl --dataset-path "$TMP/prompts.jsonl" --num-prompts 6 --output-len 4 \
  --ignore-eos --result-file "$TMP/jsonl.json" >"$TMP/jsonl.out" 2>&1 || bad "jsonl run failed" "$(cat "$TMP/jsonl.out")"
[[ $(json_get "$TMP/jsonl.json" "[r['output_tokens'] for r in d['requests']] == [3, 6, 4, 3, 6, 4] and d['requests'][1]['prompt_tokens'] == 5") == True ]] &&
  ok "jsonl: lines reused in order, per-line output lengths" ||
  bad "jsonl result" "$(json_get "$TMP/jsonl.json" "[(r['prompt_tokens'], r['output_tokens'], r.get('error')) for r in d['requests']]")"
check_against_metrics "jsonl run" "$TMP/jsonl.json" "$before"

# ---- 5. rejected requests: counted with the server's reason, exit status 1 ------------------
before=$(counters)
out=$("$BENCH" --base-url "$BASE" --num-prompts 4 --random-input-len 32 --random-output-len 4 \
  --random-vocab-size 100000000 --result-file "$TMP/rejected.json" 2>&1)
rc=$?
[[ $rc == 1 ]] && ok "all requests rejected -> exit status 1" || bad "exit status $rc when all failed" "$out"
grep -qE "^ +4 x HTTP 400: " <<<"$out" && ok "summary lists 4 x HTTP 400 with the reason" || bad "failure reasons missing" "$out"
[[ $(json_get "$TMP/rejected.json" "d['summary']['completed'] == 0 and d['summary']['failed'] == 4 and all(r['http_status'] == 400 and r['failure'] == 'http_status' and len(r['error']) > 0 for r in d['requests'])") == True ]] &&
  ok "result JSON: 4 failures with status and message" || bad "rejected result" "$(head -c 2000 "$TMP/rejected.json")"
read -r r0 _ <<<"$before"
read -r r1 _ <<<"$(counters)"
[[ $r1 == "$r0" ]] && ok "rejected requests are not server successes" || bad "request_success_total moved by $((r1 - r0))"

# ---- 6. plots from the results ---------------------------------------------------------------
if command -v gnuplot >/dev/null; then
  if python3 "$ROOT/tools/plot_bench.py" --out-dir "$TMP/plots" "$TMP/random.json" "$TMP/paced.json" "$TMP/chat.json" >"$TMP/plot.out" 2>&1; then
    for png in throughput_vs_concurrency latency_vs_concurrency latency_percentiles; do
      if [[ -s $TMP/plots/$png.png && $(head -c 4 "$TMP/plots/$png.png" | od -An -c | tr -d ' ') == '211PNG' ]]; then
        ok "plot $png.png"
      else
        bad "plot $png.png missing or not a PNG" "$(cat "$TMP/plot.out")"
      fi
    done
  else
    bad "plot_bench.py failed" "$(cat "$TMP/plot.out")"
  fi
else
  echo "note: gnuplot not installed, plots not checked (apt-get install gnuplot-nox)"
fi

# ---- 6b. a burst of 64 connections at once: none reset, every request reaches the engine -----
# httplib 0.11 listens with a backlog of 5; oasis-server re-listens with a real one. With 5, a
# burst of connects overflowed into SYN cookies and the kernel reset some connections right
# after the client had sent its request ("connection closed or read failed mid-response",
# nothing in /metrics). The listening socket's backlog (ss: Send-Q) is checked first.
if command -v ss >/dev/null; then
  backlog=$(ss -Hltn "sport = :$PORT" 2>/dev/null | awk 'NR == 1 {print $3}')
  [[ -n $backlog && $backlog -ge 128 ]] && ok "listen backlog $backlog (>= 128)" || bad "listen backlog '$backlog' < 128" "$(ss -ltn)"
fi
before=$(counters)
out=$("$BENCH" --base-url "$BASE" --num-prompts 128 --random-input-len 128 --random-output-len 2 \
  --max-concurrency 64 --seed 6 --random-vocab-size "$VOCAB" --no-progress --result-file "$TMP/burst.json" 2>&1)
rc=$?
[[ $rc == 0 && $(json_get "$TMP/burst.json" "d['summary']['completed'] == 128 and d['summary']['failed'] == 0") == True ]] &&
  ok "64 connections at once: 128 of 128 requests succeed" ||
  bad "burst of 64 connections: exit $rc" "$(grep -E "requests:| x " <<<"$out")"
check_against_metrics "burst of 64 connections" "$TMP/burst.json" "$before"

# ---- 6b. default flags: the model and the vocabulary come from /v1/models --------------------
out=$("$BENCH" --base-url "$BASE" --num-prompts 8 --random-input-len 16 --random-output-len 4 \
  --no-progress --result-file "$TMP/defaults.json" 2>&1)
rc=$?
[[ $rc == 0 ]] && python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
s = r["summary"]
assert s["completed"] == 8 and s["failed"] == 0, s
assert r["config"]["random_vocab_size"] == int(sys.argv[2]), r["config"]
' "$TMP/defaults.json" "$VOCAB" && ! grep -q "does not report its vocab_size" <<<"$out" &&
  ok "default flags: 8/8 completed, ids within the vocabulary the server reports ($VOCAB)" ||
  bad "oasis-bench with default flags: exit $rc" "$out"

# ---- 7. a dead server: connection errors, exit status 1 ---------------------------------------
kill -TERM "$SERVER_PID" && wait "$SERVER_PID"
SERVER_PID=""
out=$("$BENCH" --base-url "$BASE" --model oasis-embedded --num-prompts 3 --random-input-len 4 --random-output-len 2 \
  --random-vocab-size "$VOCAB" --no-progress 2>&1)
rc=$?
[[ $rc == 1 ]] && grep -qE "^ +3 x connection error: cannot connect" <<<"$out" &&
  ok "server gone: 3 connection errors, exit status 1" || bad "dead server: exit $rc" "$out"
out=$("$BENCH" --base-url "$BASE" --num-prompts 1 2>&1)
rc=$?
[[ $rc == 2 ]] && grep -q "pass --model" <<<"$out" && ok "no server to ask for the model: exit 2 with a hint" ||
  bad "model discovery without a server: exit $rc" "$out"

exit $fail
