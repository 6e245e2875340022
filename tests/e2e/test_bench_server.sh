#!/usr/bin/env bash
# oasis-bench against the real oasis-server (CPU backend, the embedded default model): short
# runs whose request and token counts must equal the deltas of the server's own /metrics
# counters (oasis:request_success_total, oasis:prompt_tokens_total,
# oasis:generation_tokens_total), warm-ups included; forced output lengths (ignore_eos +
# min_tokens); the chat endpoint; a JSONL workload; vLLM's flags with the committed ShareGPT and
# sonnet datasets (lengths checked against the server's /tokenize) and goodput; rejected
# requests and a dead server
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

# ---- 4b. vLLM's flags: ShareGPT and sonnet datasets (the committed offline files), goodput ----
SHAREGPT=$ROOT/tests/fixtures/bench/sharegpt.json
SONNET=$ROOT/tests/fixtures/bench/sonnet.txt
# tokenize_counts <file> <turn>: the server's token counts of turn 0 or 1 of every entry with
# two turns or more (what vLLM's loader reads), one a line.
tokenize_counts() {
  python3 - "$BASE" "$1" "$2" <<'PY'
import json, sys, urllib.request
base, path, turn = sys.argv[1], sys.argv[2], int(sys.argv[3])
for e in json.load(open(path, encoding="utf-8")):
    c = e.get("conversations", [])
    if len(c) >= 2:
        req = urllib.request.Request(base + "/tokenize", json.dumps({"prompt": c[turn]["value"]}).encode(),
                                     {"Content-Type": "application/json"})
        print(json.load(urllib.request.urlopen(req))["count"])
PY
}
prompt_counts=$(tokenize_counts "$SHAREGPT" 0)
completion_counts=$(tokenize_counts "$SHAREGPT" 1)
before=$(counters)
out=$("$BENCH" --base-url "$BASE" --dataset-name sharegpt --dataset-path "$SHAREGPT" --num-prompts 12 \
  --max-concurrency 4 --sharegpt-output-len 6 --ignore-eos --seed 2 --no-progress \
  --goodput ttft:60000 tpot:60000 e2el:60000 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 25,50,99 \
  --save-result --result-dir "$TMP/vllm" --result-filename sharegpt.json 2>&1)
rc=$?
[[ $rc == 0 && -f $TMP/vllm/sharegpt.json ]] && ok "sharegpt run exits 0, result saved in --result-dir/--result-filename" ||
  bad "sharegpt run: exit $rc" "$out"
grep -qE "^Request goodput \(req/s\): +[0-9.]+ *$" <<<"$out" && grep -qE "^P25 TTFT \(ms\):" <<<"$out" &&
  ok "summary: Request goodput and P25 lines" || bad "sharegpt summary lacks goodput / P25" "$out"
python3 - "$TMP/vllm/sharegpt.json" "$prompt_counts" <<'PY' && ok "sharegpt: 12 prompts of the file's first turns (lengths = the server's /tokenize, 4..1024), 6 tokens each, goodput = throughput under loose SLOs" || bad "sharegpt result" "$(head -c 3000 "$TMP/vllm/sharegpt.json")"
import json, sys
r = json.load(open(sys.argv[1]))
counts = {int(x) for x in sys.argv[2].split()}
c, s = r["config"], r["summary"]
assert c["dataset"] == "sharegpt" and c["token_count"] == "the server's /tokenize", c
assert c["sharegpt_output_len"] == 6 and c["goodput"] == {"ttft": 60000, "tpot": 60000, "e2el": 60000}, c
assert c["sharegpt_pruned"] <= 1 and c["sharegpt_usable"] == 12, c  # stops once it has 12
assert s["completed"] == 12 and s["good_completed"] == 12, s
assert abs(s["request_goodput"] - s["request_throughput"]) < 1e-9, s
assert "p25_ttft_ms" in s and "p99_e2el_ms" in s, s
for q in r["requests"]:
    assert q["output_tokens"] == 6 and q["finish_reason"] == "length", q
    assert 4 <= q["prompt_tokens"] <= 1024 and q["prompt_tokens"] in counts, q
PY
check_against_metrics "sharegpt run" "$TMP/vllm/sharegpt.json" "$before"
# Output lengths from the second turns (no --sharegpt-output-len), EOS allowed: max_tokens is
# the completion's token count, the order the seed's.
"$BENCH" --base-url "$BASE" --dataset-name sharegpt --dataset-path "$SHAREGPT" --num-prompts 10 --seed 3 \
  --max-concurrency 5 --no-progress --result-file "$TMP/sharegpt_turns.json" >"$TMP/sharegpt_turns.out" 2>&1 ||
  bad "sharegpt run with the second turns' lengths failed" "$(cat "$TMP/sharegpt_turns.out")"
python3 - "$TMP/sharegpt_turns.json" "$completion_counts" <<'PY' && ok "sharegpt: max_tokens = the second turn's token count (>= 4), ignore_eos off by default" || bad "sharegpt output lengths" "$(head -c 3000 "$TMP/sharegpt_turns.json")"
import json, sys
r = json.load(open(sys.argv[1]))
counts = {int(x) for x in sys.argv[2].split()}
assert r["config"]["ignore_eos"] is False and r["summary"]["completed"] == 10, r["config"]
for q in r["requests"]:
    assert q["expected_output_tokens"] in counts and q["expected_output_tokens"] >= 4, q
    assert 1 <= q["output_tokens"] <= q["expected_output_tokens"], q
PY

# Sonnet: vLLM's prompts on both endpoints. The same seed draws the same lines; on completions
# they go out rendered by the chat template, so both endpoints' usage counts must agree.
for backend in openai openai-chat; do
  before=$(counters)
  "$BENCH" --base-url "$BASE" --backend "$backend" --dataset-name sonnet --dataset-path "$SONNET" --num-prompts 6 \
    --sonnet-input-len 300 --sonnet-prefix-len 100 --sonnet-output-len 5 --ignore-eos --seed 4 --goodput ttft:0 \
    --max-concurrency 3 --no-progress --result-file "$TMP/sonnet_$backend.json" >"$TMP/sonnet_$backend.out" 2>&1 ||
    bad "sonnet run ($backend) failed" "$(cat "$TMP/sonnet_$backend.out")"
  check_against_metrics "sonnet run ($backend)" "$TMP/sonnet_$backend.json" "$before"
done
python3 - "$TMP/sonnet_openai.json" "$TMP/sonnet_openai-chat.json" <<'PY' && ok "sonnet: prompts <= 300 tokens with the shared prefix, rendered on completions, equal lengths on both endpoints, 5 tokens each; goodput 0 under a 0 ms TTFT SLO" || bad "sonnet results" "$(head -c 3000 "$TMP/sonnet_openai.json")"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ca, cb = a["config"], b["config"]
assert ca["endpoint"] == "/v1/completions" and cb["endpoint"] == "/v1/chat/completions", (ca, cb)
assert ca["sonnet_chat_rendered"] is True and cb["sonnet_chat_rendered"] is False, (ca, cb)
assert ca["sonnet_prefix_lines"] >= 1 and ca["sonnet_input_lines"] > ca["sonnet_prefix_lines"], ca
la = [q["prompt_tokens"] for q in a["requests"]]
lb = [q["prompt_tokens"] for q in b["requests"]]
assert la == lb and all(ca["sonnet_base_offset"] < n <= 300 for n in la), (la, lb)
for r in (a, b):
    assert r["summary"]["completed"] == 6 and r["summary"]["good_completed"] == 0, r["summary"]
    assert r["summary"]["request_goodput"] == 0, r["summary"]
    assert all(q["output_tokens"] == 5 for q in r["requests"]), r["requests"]
PY
# Approximate token counts (4 bytes a token) when asked: no rendering, said in the config.
"$BENCH" --base-url "$BASE" --dataset-name sonnet --dataset-path "$SONNET" --num-prompts 2 --token-count approx \
  --sonnet-output-len 2 --no-progress --result-file "$TMP/sonnet_approx.json" >"$TMP/sonnet_approx.out" 2>&1 &&
  [[ $(json_get "$TMP/sonnet_approx.json" "d['config']['token_count'].startswith('approximate') and d['config']['sonnet_chat_rendered'] is False and d['summary']['completed'] == 2") == True ]] &&
  ok "sonnet with --token-count approx" || bad "sonnet approx" "$(cat "$TMP/sonnet_approx.out")"
# vLLM flags oasis-bench lacks, and bad SLOs: exit 2 with the flag named, nothing sent.
out=$("$BENCH" --base-url "$BASE" --dataset-name sharegpt --dataset-path "$SHAREGPT" --tokenizer Qwen/Qwen3-8B 2>&1)
rc=$?
[[ $rc == 2 ]] && grep -q -- "--tokenizer is a vllm bench serve flag that oasis-bench does not implement" <<<"$out" &&
  ok "an unimplemented vLLM flag: exit 2 naming it" || bad "unimplemented vLLM flag: exit $rc" "$out"
out=$("$BENCH" --base-url "$BASE" --goodput ttft:100 itl:5 2>&1)
rc=$?
[[ $rc == 2 ]] && grep -q "unknown metric 'itl'" <<<"$out" && ok "a bad --goodput: exit 2 with the reason" ||
  bad "bad goodput: exit $rc" "$out"
# Sizes and durations that overflowed (std::bad_alloc, exit 134; a run that ended at once) and
# an unwritable result file (found only after the run): exit 2 naming them, nothing sent.
before=$(counters)
for args in "--num-prompts 99999999999999|--num-prompts" "--random-input-len 9999999999999|at most 2\\^28 tokens" \
            "--random-prefix-len 9999999999999|at most 2\\^28 tokens" "--num-warmups 99999999999|--num-warmups" \
            "--request-rate 1e-30|--request-rate must be at least 1e-06" \
            "--result-file $TMP/no/such/dir/r.json|cannot write the result to .*no directory"; do
  flags=${args%%|*}
  out=$(timeout 60 "$BENCH" --base-url "$BASE" --random-output-len 4 $flags 2>&1)
  rc=$?
  [[ $rc == 2 ]] && grep -qE -- "${args#*|}" <<<"$out" && ok "$flags: exit 2 naming it" || bad "$flags: exit $rc" "$out"
done
out=$(timeout 60 "$BENCH" --base-url "$BASE" --dataset-name multi-turn --multi-turn-think-ms 1e300 2>&1)
rc=$?
[[ $rc == 2 ]] && grep -q -- "--multi-turn-think-ms must be at most 3600000" <<<"$out" &&
  ok "--multi-turn-think-ms 1e300: exit 2" || bad "--multi-turn-think-ms 1e300: exit $rc" "$out"
[[ $(counters) == "$before" ]] && ok "refused runs sent nothing" || bad "a refused run sent requests"

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
