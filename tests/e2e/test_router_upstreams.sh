#!/usr/bin/env bash
# oasis-router against dead and stalled upstreams, end to end on the CPU backend: real
# oasis-server prefill and decode instances and a real oasis-router on loopback, the decode
# instance SIGSTOPped and SIGKILLed mid-stream (docs/disaggregation.md, "Failures"). Checks:
#   - a stream whose decode instance is stopped ends after --upstream-idle-timeout-s with an
#     error event (504) and [DONE], not a silent stall;
#   - while it is stopped, /health says 503 and new requests get 503 + Retry-After at once
#     (streamed or not), nothing staged on the prefill instance for them;
#   - after SIGCONT: healthy again, requests complete, the staging pool holds nothing;
#   - a stream whose decode instance is killed ends at once with an error event (502) and
#     [DONE]; new requests then fail fast;
#   - an instance that closes the connection before answering (a hostile peer in Python): the
#     request goes to the next decode instance, and the client never sees the failure;
#   - the router's failure metrics count all of it.
# Usage: test_router_upstreams.sh OASIS_SERVER OASIS_ROUTER SOURCE_DIR
set -uo pipefail
SERVER=$1
ROUTER=$2
SRC=$3
# shellcheck source=server_lib.sh
source "$SRC/tests/e2e/server_lib.sh"
TMP=$(mktemp -d)
PIDS=()
STOPPED=()
cleanup() {
  for p in "${STOPPED[@]}"; do kill -CONT "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
FAIL=0
ok() { echo "ok: $*"; }
bad() { echo "FAILED: $1"; [[ -n ${2:-} ]] && echo "  got: ${2:0:800}"; FAIL=1; }
now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$1" "$(now)"; }
lt() { [[ $(python3 -c "import sys; print(float(sys.argv[1]) < float(sys.argv[2]))" "$1" "$2") == True ]]; }

COMMON=(--backend cpu --threads 2 --host-kv-gib 0.25 --topk-blocks 64 --max-num-seqs 16)
IDLE=3  # the router's idle timeout here (seconds)

rmetric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v k="$2" '$1 == k { print $2 }'; }
# The last two SSE events of a stream file, as "<first event json> | <last event>" checks.
sse_check() {  # file -> prints: events=N error_code=C done_last=True/False first_data=True/False
  python3 - "$1" <<'PY'
import json, sys
events = [l[6:] for l in open(sys.argv[1], errors="replace").read().splitlines() if l.startswith("data: ")]
err = None
usage = None
for e in events:
    if e == "[DONE]":
        continue
    try:
        d = json.loads(e)
    except Exception:
        print("unparsable event:", e[:200]); sys.exit(0)
    if "error" in d:
        err = d["error"].get("code")
    if d.get("usage"):
        usage = d["usage"].get("completion_tokens")
print(f"events={len(events)} error_code={err} done_last={bool(events) and events[-1] == '[DONE]'} "
      f"dones={events.count('[DONE]')} tokens={sum(1 for e in events if e != '[DONE]' and 'choices' in e)} "
      f"usage={usage}")
PY
}
prompt_text() { python3 -c "
import random, sys
r = random.Random(int(sys.argv[1]))
words = 'river market city north stone bread light harbour winter garden people music road tower'.split()
print(' '.join(r.choice(words) for _ in range(int(sys.argv[2]))))" "$1" "$2"; }
long=$(python3 -c "import json,sys; print(json.dumps({'prompt': sys.argv[1], 'max_tokens': 3300, 'temperature': 0, 'ignore_eos': True, 'stream': True}))" "$(prompt_text 3 150)")
# Past the prefill instance's first tokens (ignore_eos): these reach a decode instance.
short='{"prompt": "river market city", "max_tokens": 8, "temperature": 0, "ignore_eos": true}'
short_stream='{"prompt": "river market city", "max_tokens": 8, "temperature": 0, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}}'
# stream_until_first <port> <file>: a long streamed request in the background (CURL=its pid),
# returns once its first token event arrived.
stream_until_first() {
  curl -s -N --max-time 60 "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' -d "$long" >"$2" 2>/dev/null &
  CURL=$!
  for _ in $(seq 1 400); do grep -q '^data: {"id"' "$2" && return 0; sleep 0.05; done
  return 1
}
# code_and_time <port> <body> <headers file>: "HTTP_CODE SECONDS" of a POST (15 s at most).
code_and_time() {
  curl -s -o "$TMP/body" -D "$3" -m 15 -w '%{http_code} %{time_total}' "http://127.0.0.1:$1/v1/completions" \
    -H 'Content-Type: application/json' -d "$2"
}

start prefill --role prefill --staging-listen 127.0.0.1:0 --staging-pool-gib 0.25 --staging-lease-ttl-ms 3000 || exit 1
start decode --role decode || exit 1
start_router router --prefill "127.0.0.1:$prefill_PORT" --decode "127.0.0.1:$decode_PORT" \
  --upstream-idle-timeout-s "$IDLE" --upstream-first-byte-timeout-s 60 --timeout-s 60 || exit 1
ok "prefill, decode and router (idle timeout ${IDLE} s) up"
r=$(code_and_time "$router_PORT" "$short" "$TMP/h")
[[ ${r%% *} == 200 ]] && ok "a request through the router: 200" || bad "first request" "$r $(cat "$TMP/body")"

# ---- the decode instance SIGSTOPped mid-stream ------------------------------------------------
if stream_until_first "$router_PORT" "$TMP/stopped"; then
  kill -STOP "$decode_PID"
  STOPPED+=("$decode_PID")
  t0=$(now)
  wait "$CURL"
  took=$(elapsed "$t0")
  res=$(sse_check "$TMP/stopped")
  if [[ $res == *"error_code=504"* && $res == *"done_last=True"* && $res == *"dones=1"* ]] && lt "$took" 12; then
    ok "stopped decode instance: the stream ended after ${took} s (idle timeout ${IDLE} s) with an error event 504 and [DONE] ($res)"
  else
    bad "stopped decode instance: stream after ${took} s: $res" "$(tail -c 400 "$TMP/stopped")"
  fi
  lt "$(python3 -c "print($IDLE - 1.5)")" "$took" || bad "the stream ended before the idle timeout (${took} s)"
else
  bad "the long stream did not start" "$(head -c 300 "$TMP/stopped")"
fi

# While stopped: /health 503, new requests 503 + Retry-After at once, nothing staged.
t0=$(now)
wait_health "$router_PORT" 503 && ok "router /health is 503 $(elapsed "$t0") s after the stream ended" ||
  bad "router /health still not 503" "$(curl -s "http://127.0.0.1:$router_PORT/health")"
held0=$(pmetric "$prefill_PORT" oasis:staging_pool_requests_held)
handoffs0=$(pmetric "$prefill_PORT" oasis:handoffs_total)
for body in "$short" "$short_stream"; do
  r=$(code_and_time "$router_PORT" "$body" "$TMP/h")
  if [[ ${r%% *} == 503 ]] && lt "${r#* }" 2 && grep -qi '^Retry-After: [1-9]' "$TMP/h" &&
     [[ $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['error']['code'])" "$TMP/body" 2>&1) == 503 ]]; then
    ok "new request while the decode instance is stopped: 503 + Retry-After in ${r#* } s"
  else
    bad "new request while stopped: $r" "$(cat "$TMP/h" "$TMP/body")"
  fi
done
[[ $(pmetric "$prefill_PORT" oasis:handoffs_total) == "$handoffs0" ]] &&
  ok "no prefill for the refused requests (handoffs stay $handoffs0; $held0 leases held)" ||
  bad "the refused requests were prefilled" "$handoffs0 -> $(pmetric "$prefill_PORT" oasis:handoffs_total)"

# SIGCONT: healthy again, requests complete, every lease ends.
kill -CONT "$decode_PID"
STOPPED=()
t0=$(now)
wait_health "$router_PORT" 200 && ok "router /health 200 again $(elapsed "$t0") s after SIGCONT" || bad "router not healthy after SIGCONT"
r=$(code_and_time "$router_PORT" "$short" "$TMP/h")
[[ ${r%% *} == 200 ]] && ok "a request after SIGCONT: 200" || bad "request after SIGCONT" "$r $(cat "$TMP/body")"
curl -s -N -m 30 "http://127.0.0.1:$router_PORT/v1/completions" -H 'Content-Type: application/json' -d "$short_stream" >"$TMP/after"
res=$(sse_check "$TMP/after")
# The whole answer arrived: its usage counts the 8 tokens (an engine that runs ahead of its
# reader merges queued tokens into one event, so the number of events is not checked).
[[ $res == *"error_code=None"* && $res == *"done_last=True"* && $res == *"usage=8"* ]] &&
  ok "a stream after SIGCONT completes ($res)" || bad "stream after SIGCONT: $res"
v=$(for _ in $(seq 1 3); do pwait "$prefill_PORT" oasis:staging_pool_requests_held "v == 0" && break; done) &&
  ok "staging pool empty after the stall (the stalled request's lease ended)" || bad "staging leases still held" "$v"

# ---- the decode instance SIGKILLed mid-stream --------------------------------------------------
if stream_until_first "$router_PORT" "$TMP/killed"; then
  kill -9 "$decode_PID"
  t0=$(now)
  wait "$CURL"
  { wait "$decode_PID"; } 2>/dev/null
  took=$(elapsed "$t0")
  res=$(sse_check "$TMP/killed")
  [[ $res == *"error_code=502"* && $res == *"done_last=True"* && $res == *"dones=1"* ]] && lt "$took" 3 &&
    ok "killed decode instance: the stream ended ${took} s after with an error event 502 and [DONE] ($res)" ||
    bad "killed decode instance: stream after ${took} s: $res" "$(tail -c 400 "$TMP/killed")"
else
  bad "the long stream did not start (kill)" "$(head -c 300 "$TMP/killed")"
fi
for body in "$short" "$short_stream"; do
  r=$(code_and_time "$router_PORT" "$body" "$TMP/h")
  [[ ${r%% *} == 503 ]] && lt "${r#* }" 2 && grep -qi '^Retry-After: [1-9]' "$TMP/h" &&
    ok "new request with the decode instance dead: 503 + Retry-After in ${r#* } s" || bad "new request, decode dead: $r" "$(cat "$TMP/h" "$TMP/body")"
done

# ---- an instance that closes the connection before answering: the next one takes it ----------
start decode2 --role decode || exit 1
python3 - >"$TMP/hostile.port" 2>"$TMP/hostile.log" <<'PY' &
# A hostile peer: GET /health is 200 (the router counts it healthy); every POST is read, then
# the connection is closed without a byte of answer.
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"{}")
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        sys.stderr.write("post\n"); sys.stderr.flush()
        self.close_connection = True  # no status line, nothing
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
PY
PIDS+=("$!")
for _ in $(seq 1 100); do [[ -s $TMP/hostile.port ]] && break; sleep 0.05; done
hport=$(cat "$TMP/hostile.port")
start_router router2 --prefill "127.0.0.1:$prefill_PORT" --decode "127.0.0.1:$hport,127.0.0.1:$decode2_PORT" \
  --upstream-idle-timeout-s "$IDLE" || exit 1
good=0
for i in 1 2 3; do
  curl -s -N -m 30 "http://127.0.0.1:$router2_PORT/v1/completions" -H 'Content-Type: application/json' -d "$short_stream" >"$TMP/retry$i"
  res=$(sse_check "$TMP/retry$i")
  [[ $res == *"error_code=None"* && $res == *"done_last=True"* && $res != *"tokens=0"* ]] && good=$((good + 1)) || bad "stream $i past the hostile instance: $res"
done
posts=$(grep -c post "$TMP/hostile.log")
[[ $good == 3 && $posts -ge 1 ]] &&
  ok "3 streams through a router whose first decode instance hangs up before answering: all complete ($posts went to it first)" ||
  bad "retry before the first byte: $good of 3 complete, $posts to the hostile instance"
retries=$(rmetric "$router2_PORT" 'oasis:router_upstream_retries_total{role="decode"}')
[[ ${retries:-0} -ge 1 ]] && ok "router2 counted $retries decode retries" || bad "no decode retry counted" "$retries"

# ---- metrics -----------------------------------------------------------------------------------
m=$(curl -s "http://127.0.0.1:$router_PORT/metrics")
idle=$(sed -n 's/^oasis:router_upstream_failures_total{role="decode",reason="idle_timeout"} \(.*\)$/\1/p' <<<"$m")
closed=$(sed -n 's/^oasis:router_upstream_failures_total{role="decode",reason="closed"} \(.*\)$/\1/p' <<<"$m")
nohealthy=$(sed -n 's/^oasis:router_no_healthy_instance_total{role="decode"} \(.*\)$/\1/p' <<<"$m")
errors=$(sed -n 's/^oasis:router_stream_errors_total \(.*\)$/\1/p' <<<"$m")
[[ $idle == 1 && ${closed:-0} -ge 1 && ${nohealthy:-0} -ge 4 && $errors == 2 ]] &&
  ok "router metrics: idle timeouts $idle, closed $closed, refused for want of a healthy decode instance $nohealthy, stream errors $errors" ||
  bad "router metrics: idle '$idle' closed '$closed' no_healthy '$nohealthy' stream errors '$errors'"

[[ $FAIL == 0 ]] && echo "PASSED: oasis-router against stopped, killed and hostile upstreams" || echo "FAILED: oasis-router upstream failures"
exit $FAIL
