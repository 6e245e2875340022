#!/usr/bin/env bash
# Disaggregated prefill/decode end to end on the CPU backend (docs/disaggregation.md): a prefill
# instance (--role prefill, its UCX staging pool), decode instances (--role decode, remote
# partial fetch and --rpf off), oasis-router in front, all separate processes on loopback; then
# the prefill instance in another network namespace joined by veth (skipped with a message
# when namespaces cannot be made here). Checks, against a single sparse instance with the same
# K (K >= every request's blocks, so sparse equals dense exactly):
#   - greedy completions and chat through the router equal the single instance (text and
#     log-probabilities), JSON and SSE, with both decode modes;
#   - every staging lease ends (completed) and the pool holds nothing after;
#   - a client that disconnects mid-stream: its lease is aborted;
#   - a decode instance killed mid-request: the prefill instance frees the lease by TTL;
#   - errors: n > 1, a decode instance called without a ticket, a bad ticket; stream_options
#     without stream refused before any prefill;
#   - streams that finish on the prefill instance equal one instance's, event by event;
#   - a decode side that refuses after the handoff: the lease is aborted at once;
#   - instances of the wrong role: unhealthy with the reason in /health, clients get 503;
#   - the staging secret: a listener beyond loopback without one is refused at start; decode
#     instances with a wrong or no secret are refused, with the right one they serve.
# Usage: test_disagg.sh OASIS_SERVER OASIS_ROUTER SOURCE_DIR
set -uo pipefail
SERVER=$1
ROUTER=$2
SRC=$3
# shellcheck source=server_lib.sh
source "$SRC/tests/e2e/server_lib.sh"
# shellcheck source=disagg_lib.sh
source "$SRC/tests/e2e/disagg_lib.sh"
TMP=$(mktemp -d)
PIDS=()
NETNS=""
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  if [[ -n $NETNS ]]; then ip netns del "$NETNS" 2>/dev/null; ip link del "${NETNS}h" 2>/dev/null; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
FAIL=0
ok() { echo "ok: $*"; }
bad() { echo "FAILED: $1"; [[ -n ${2:-} ]] && echo "  got: ${2:0:800}"; FAIL=1; }
py() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); print($2)" "$1"; }

# K 64 blocks >= the longest request here (prompt + output < 64 x 16 tokens).
COMMON=(--backend cpu --threads 2 --host-kv-gib 0.25 --topk-blocks 64 --max-num-seqs 16)

post() { curl -s "http://127.0.0.1:$1$2" -H 'Content-Type: application/json' -d "$3"; }

start one --sparse on --sparse-switch threshold || exit 1
start prefill --role prefill --staging-listen 127.0.0.1:0 --staging-pool-gib 0.25 --staging-lease-ttl-ms 4000 || exit 1
start decode --role decode || exit 1
start full --role decode --rpf off || exit 1
start_router router --prefill "127.0.0.1:$prefill_PORT" --decode "127.0.0.1:$decode_PORT,127.0.0.1:$full_PORT" || exit 1
ok "single instance, prefill, decode (rpf on and off) and router up"

# ---- the same greedy outputs as one instance ------------------------------------------------
router_equals_one "" 0 25

# ---- prefix caching on the decode side: a prompt sent again fetches only what it lacks -----------
# The router alternates between the two decode instances, so sends 3 and 4 meet a prompt each
# instance imported before: they take its blocks from the host store (usage says so, metrics
# count it) and answer as one instance does.
rbody=$(python3 -c "import json,sys; print(json.dumps({'prompt': sys.argv[1], 'max_tokens': 16, 'temperature': 0}))" "$(prompt_text 31 150)")
want=$(post "$one_PORT" /v1/completions "$rbody")
hits0=$(( $(pmetric "$decode_PORT" oasis:rpf_prefix_cache_hit_tokens_total | cut -d. -f1) + $(pmetric "$full_PORT" oasis:rpf_prefix_cache_hit_tokens_total | cut -d. -f1) ))
cached=()
for i in 1 2 3 4; do
  got=$(post "$router_PORT" /v1/completions "$rbody")
  [[ $(py "$got" "d['choices'][0]['text']") == $(py "$want" "d['choices'][0]['text']") ]] || bad "repeat $i through the router differs from one instance" "$got | want $want"
  cached+=("$(py "$got" "(d['usage'].get('prompt_tokens_details') or {}).get('cached_tokens', 0)")")
done
ptok=$(py "$want" "d['usage']['prompt_tokens']")
hits=$(( $(pmetric "$decode_PORT" oasis:rpf_prefix_cache_hit_tokens_total | cut -d. -f1) + $(pmetric "$full_PORT" oasis:rpf_prefix_cache_hit_tokens_total | cut -d. -f1) ))
[[ ${cached[2]} == $((ptok / 16 * 16)) && ${cached[3]} == $((ptok / 16 * 16)) && $((hits - hits0)) -ge $((2 * (ptok / 16 * 16))) ]] &&
  ok "decode-side prefix cache: repeats 3 and 4 took ${cached[2]} and ${cached[3]} of $ptok prompt tokens from the host store (metrics +$((hits - hits0)))" ||
  bad "decode-side prefix cache: cached ${cached[*]} of $ptok, metric +$((hits - hits0))"

# ---- leases end; both decode modes ran ---------------------------------------------------------
v=$(pwait "$prefill_PORT" oasis:staging_pool_requests_held "v == 0") && ok "staging pool empty after the requests ($v held)" || bad "staging leases still held" "$v"
completed=$(curl -s "http://127.0.0.1:$prefill_PORT/metrics" | sed -n 's/^oasis:staging_pool_leases_total{.*end="completed"} \(.*\)$/\1/p')
handoffs=$(pmetric "$prefill_PORT" oasis:handoffs_total)
[[ -n $handoffs && $handoffs == "$completed" && $(python3 -c "print($handoffs >= 8)") == True ]] &&
  ok "every handoff's lease completed ($completed of $handoffs)" || bad "leases completed $completed, handoffs $handoffs"
pa=$(pmetric "$decode_PORT" oasis:rpf_admission_bytes_total); fa=$(pmetric "$full_PORT" oasis:rpf_admission_bytes_total)
[[ $(python3 -c "print(${pa:-0} > 0 and ${fa:-0} > 0)") == True ]] && ok "both decode instances imported (partial $pa B, full $fa B)" ||
  bad "admission bytes: partial '$pa', full '$fa'"
# Host KV per request on the decode side: both report it; only --rpf on has summary-only rows.
rows=$(pmetric "$decode_PORT" oasis:num_summary_rows); frows=$(pmetric "$full_PORT" oasis:num_summary_rows)
ph=$(pmetric "$decode_PORT" oasis:rpf_host_kv_bytes_finished_total); pn=$(pmetric "$decode_PORT" oasis:rpf_imports_finished_total)
fh=$(pmetric "$full_PORT" oasis:rpf_host_kv_bytes_finished_total)
[[ $(python3 -c "print(${rows:-0} > 0 and ${frows:-1} == 0 and ${ph:-0} > 0 and ${pn:-0} >= 1 and ${fh:-0} > 0)") == True ]] &&
  ok "decode host KV per request reported ($ph B over $pn requests; $rows summary-only rows, none with --rpf off)" ||
  bad "host KV metrics: rows '$rows' / '$frows', bytes '$ph' / '$fh', finished '$pn'"

# ---- errors ------------------------------------------------------------------------------------
code=$(curl -s -o "$TMP/e" -w '%{http_code}' "http://127.0.0.1:$router_PORT/v1/completions" -H 'Content-Type: application/json' -d '{"prompt": "x", "n": 2}')
[[ $code == 400 ]] && ok "n = 2 through the router: 400" || bad "n = 2: $code" "$(cat "$TMP/e")"
code=$(curl -s -o "$TMP/e" -w '%{http_code}' "http://127.0.0.1:$decode_PORT/v1/completions" -H 'Content-Type: application/json' -d '{"prompt": "x", "max_tokens": 4}')
[[ $code == 400 && $(py "$(cat "$TMP/e")" "'oasis-router' in d['error']['message']") == True ]] && ok "a decode instance without a ticket: 400 naming the router" || bad "decode without ticket: $code" "$(cat "$TMP/e")"
code=$(curl -s -o "$TMP/e" -w '%{http_code}' "http://127.0.0.1:$decode_PORT/v1/completions" -H 'Content-Type: application/json' -d '{"prompt": "x", "max_tokens": 4, "oasis_ticket": "T0tIVA=="}')
[[ $code == 400 && $(py "$(cat "$TMP/e")" "'oasis_ticket' in d['error']['message']") == True ]] && ok "a truncated ticket: 400" || bad "bad ticket: $code" "$(cat "$TMP/e")"
code=$(curl -s -o "$TMP/e" -w '%{http_code}' "http://127.0.0.1:$prefill_PORT/v1/completions" -H 'Content-Type: application/json' -d '{"prompt": "x", "max_tokens": 4, "stream": true}')
[[ $code == 400 ]] && ok "a prefill instance refuses stream=true" || bad "prefill stream: $code" "$(cat "$TMP/e")"

# ---- a request the decode side would refuse is refused before the prefill ---------------------
h0=$(pmetric "$prefill_PORT" oasis:handoffs_total)
for mt in 8 2; do
  code=$(curl -s -o "$TMP/e" -w '%{http_code}' "http://127.0.0.1:$router_PORT/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\":\"Hello there\",\"max_tokens\":$mt,\"temperature\":0,\"stream_options\":{\"include_usage\":true}}")
  [[ $code == 400 ]] && grep -q "only allowed with stream=true" "$TMP/e" && ok "stream_options without stream (max_tokens $mt): 400 as one instance says" || bad "stream_options without stream (max_tokens $mt): $code" "$(cat "$TMP/e")"
done
[[ $(pmetric "$prefill_PORT" oasis:handoffs_total) == "$h0" ]] && ok "nothing staged for the refused requests" || bad "the refused requests were prefilled"

# ---- streams finished on the prefill instance equal one instance's, event by event ----------
# (ids and created ignored). max_tokens 1 and a stop string within the first two tokens finish
# on the prefill instance; with include_usage and continuous_usage_stats, completions and chat.
python3 - "$one_PORT" "$router_PORT" "$(prompt_text 5 40)" > "$TMP/cmp" 2>&1 <<'PY'
import json, sys, urllib.request
one, router, prompt = sys.argv[1], sys.argv[2], sys.argv[3]
def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=60).read().decode()
def events(port, path, body):
    out = []
    for line in post(port, path, body).split("\n"):
        if line.startswith("data: "):
            e = line[6:]
            if e == "[DONE]":
                out.append(e)
                continue
            j = json.loads(e)
            j.pop("id", None); j.pop("created", None)
            out.append(j)
    return out
two = json.loads(post(one, "/v1/completions", {"prompt": prompt, "max_tokens": 2, "temperature": 0}))["choices"][0]["text"]
cases = []
for opts in ({}, {"include_usage": True}, {"include_usage": True, "continuous_usage_stats": True}):
    for path, base in (("/v1/completions", {"prompt": prompt}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]})):
        b = dict(base, max_tokens=1, temperature=0, stream=True)
        if opts: b["stream_options"] = opts
        cases.append((path, b))
if len(two.strip()) >= 2:
    cases.append(("/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True,
                                      "stop": [two[:2]], "stream_options": {"include_usage": True}}))
bad = 0
for path, body in cases:
    want, got = events(one, path, body), events(router, path, body)
    if want != got:
        bad += 1
        print("DIFFERS", path, json.dumps(body)[:120])
        for i in range(max(len(want), len(got))):
            w = want[i] if i < len(want) else None
            g = got[i] if i < len(got) else None
            if w != g:
                print(f" event {i}: one    {json.dumps(w)[:1500]}")
                print(f" event {i}: router {json.dumps(g)[:1500]}")
print(f"{len(cases) - bad} of {len(cases)} equal")
sys.exit(1 if bad else 0)
PY
[[ $? == 0 ]] && ok "streams finished on the prefill instance equal one instance's ($(tail -1 "$TMP/cmp"))" || bad "synthesized streams differ from one instance's" "$(cat "$TMP/cmp")"

# ---- a decode side that refuses after the handoff: the staged lease is aborted at once ----------
cat > "$TMP/refuse.py" <<'PY'
import sys
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def reply(self, code, body):
        self.send_response(code); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self): self.reply(200, b'{"role":"decode"}')
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.reply(400, b'{"error":{"message":"refused by the test","type":"invalid_request_error","param":null,"code":null}}')
s = ThreadingHTTPServer(("127.0.0.1", 0), H); print(s.server_address[1], flush=True); s.serve_forever()
PY
python3 "$TMP/refuse.py" > "$TMP/refuse.port" 2>&1 &
PIDS+=("$!")
for _ in $(seq 1 100); do [[ -s $TMP/refuse.port ]] && break; sleep 0.05; done
start_router rrouter --prefill "127.0.0.1:$prefill_PORT" --decode "127.0.0.1:$(head -1 "$TMP/refuse.port")" || exit 1
leases() { curl -s "http://127.0.0.1:$prefill_PORT/metrics" | sed -n "s/^oasis:staging_pool_leases_total{.*end=\"$1\"} \(.*\)\$/\1/p"; }
ab0=$(leases aborted); ex0=$(leases expired)
code=$(curl -s -o "$TMP/e" -w '%{http_code}' "http://127.0.0.1:$rrouter_PORT/v1/completions" -H 'Content-Type: application/json' \
  -d "$(python3 -c "import json,sys; print(json.dumps({'prompt': sys.argv[1], 'max_tokens': 8, 'temperature': 0}))" "$(prompt_text 9 60)")")
[[ $code == 400 ]] && grep -q "refused by the test" "$TMP/e" && ok "the decode side's refusal relayed (400)" || bad "decode refusal: $code" "$(cat "$TMP/e")"
# Well within the lease's TTL (4 s): aborted, not expired.
v=$(BASE="http://127.0.0.1:$prefill_PORT" wait_metric oasis:staging_pool_requests_held "v == 0" 2>/dev/null) || v=$(pmetric "$prefill_PORT" oasis:staging_pool_requests_held)
ab=$(leases aborted); ex=$(leases expired)
[[ $v == 0 && $(python3 -c "print(${ab:-0} == ${ab0:-0} + 1 and ${ex:-0} == ${ex0:-0})") == True ]] &&
  ok "refused after the handoff: the lease was aborted at once (aborted $ab0 -> $ab, none expired)" || bad "lease after a decode refusal: held $v, aborted $ab0 -> $ab, expired $ex0 -> $ex"
grep -q '^oasis:router_leases_aborted_total 1$' <(curl -s "http://127.0.0.1:$rrouter_PORT/metrics") && ok "the router counts the abort" || bad "router abort metric" "$(curl -s "http://127.0.0.1:$rrouter_PORT/metrics" | grep lease)"

# ---- instances of the wrong role: unhealthy, saying why; clients get 503, not 400 ---------------
# (Not start_router: it waits for a healthy router.)
"$ROUTER" --port 0 --log-level warn --prefill "127.0.0.1:$decode_PORT" --decode "127.0.0.1:$one_PORT" > "$TMP/wrong.log" 2>&1 &
PIDS+=("$!")
wrong_PORT=""
for _ in $(seq 1 200); do
  wrong_PORT=$(sed -n 's|^oasis-router listening on http://[^:]*:\([0-9]*\)$|\1|p' "$TMP/wrong.log" | head -1)
  [[ -n $wrong_PORT ]] && break
  sleep 0.05
done
for _ in $(seq 1 60); do [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$wrong_PORT/health") == 503 ]] && break; sleep 0.1; done
grep -q "role 'decode', but it is listed as a prefill instance" "$TMP/wrong.log" && ok "the wrong role is logged" || bad "wrong role not logged" "$(cat "$TMP/wrong.log")"
hb=$(curl -s "http://127.0.0.1:$wrong_PORT/health")
[[ $(py "$hb" "'role \'decode\'' in d['prefill'][0].get('reason', '') and 'role \'both\'' in d['decode'][0].get('reason', '')") == True ]] &&
  ok "a decode instance as --prefill and a --role both server as --decode: unhealthy, /health says why" || bad "wrong roles: /health" "$hb"
code=$(curl -s -o "$TMP/e" -w '%{http_code}' "http://127.0.0.1:$wrong_PORT/v1/completions" -H 'Content-Type: application/json' -d '{"prompt":"x","max_tokens":4}')
[[ $code == 503 ]] && ok "wrong roles: requests get 503 (the router's fault, not the client's)" || bad "wrong roles: $code" "$(cat "$TMP/e")"

# ---- a client that disconnects mid-stream: the lease is aborted --------------------------------
aborted0=$(curl -s "http://127.0.0.1:$prefill_PORT/metrics" | sed -n 's/^oasis:staging_pool_leases_total{.*end="aborted"} \(.*\)$/\1/p')
long=$(python3 -c "import json,sys; print(json.dumps({'prompt': sys.argv[1], 'max_tokens': 3300, 'temperature': 0, 'ignore_eos': True, 'stream': True}))" "$(prompt_text 3 150)")
# Read the stream's first event, then close the connection (the request has ~3,000 tokens left).
first_event() {
  python3 - "$1" "$2" <<'PY'
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=30)
c.request("POST", "/v1/completions", sys.argv[2], {"Content-Type": "application/json"})
r = c.getresponse()
line = b""
while not line.startswith(b"data: {"):
    line = r.fp.readline()
    if not line:
        break
print(line.decode()[:80])
c.sock.close()
PY
}
first_event "$router_PORT" "$long" > "$TMP/partial" 2>&1
grep -q '^data: {' "$TMP/partial" && ok "the aborted stream had started" || bad "no stream before the abort" "$(head -c 300 "$TMP/partial")"
for _ in $(seq 1 100); do
  a=$(curl -s "http://127.0.0.1:$prefill_PORT/metrics" | sed -n 's/^oasis:staging_pool_leases_total{.*end="aborted"} \(.*\)$/\1/p')
  [[ $(python3 -c "print(${a:-0} > ${aborted0:-0})") == True ]] && break
  sleep 0.1
done
[[ $(python3 -c "print(${a:-0} > ${aborted0:-0})") == True ]] && ok "client disconnect: the lease was aborted ($aborted0 -> $a)" || bad "no lease aborted after the disconnect ($aborted0 -> $a)"
v=$(pwait "$prefill_PORT" oasis:staging_pool_requests_held "v == 0") && ok "staging pool empty after the abort" || bad "lease held after abort" "$v"

# ---- a decode instance killed mid-request: its lease expires on the prefill side ---------------
start victim --role decode || exit 1
start_router router2 --prefill "127.0.0.1:$prefill_PORT" --decode "127.0.0.1:$victim_PORT" || exit 1
expired0=$(curl -s "http://127.0.0.1:$prefill_PORT/metrics" | sed -n 's/^oasis:staging_pool_leases_total{.*end="expired"} \(.*\)$/\1/p')
curl -s -N --max-time 20 "http://127.0.0.1:$router2_PORT/v1/completions" -H 'Content-Type: application/json' -d "$long" > "$TMP/killed" 2>/dev/null &
CURL=$!
for _ in $(seq 1 100); do grep -q '^data: {' "$TMP/killed" && break; sleep 0.05; done
kill -9 "$victim_PID"
wait "$CURL" 2>/dev/null
held=$(pmetric "$prefill_PORT" oasis:staging_pool_requests_held)
[[ $held == 1 ]] && ok "the killed decode instance's lease is still held right after ($held)" || echo "note: $held leases held right after the kill"
v=$(BASE="http://127.0.0.1:$prefill_PORT"; for _ in $(seq 1 150); do
  e=$(curl -s "$BASE/metrics" | sed -n 's/^oasis:staging_pool_leases_total{.*end="expired"} \(.*\)$/\1/p')
  [[ $(python3 -c "print(${e:-0} > ${expired0:-0})") == True ]] && { echo "$e"; break; }
  sleep 0.1
done)
[[ -n $v ]] && ok "killed decode instance: the lease expired after its TTL ($expired0 -> $v)" || bad "no lease expired after the decode instance died"
v=$(pwait "$prefill_PORT" oasis:staging_pool_requests_held "v == 0") && ok "staging pool empty after the expiry" || bad "lease held after the kill" "$v"

# ---- the staging listener's secret ------------------------------------------------------------
# Beyond loopback without a secret: refused at start, before anything listens.
out=$("$SERVER" --port 0 --log-level warn "${COMMON[@]}" --role prefill --host 0.0.0.0 2>&1)
rc=$?
[[ $rc == 2 ]] && grep -q "which other machines can reach, without a secret" <<<"$out" &&
  ok "prefill with --host 0.0.0.0 and no staging secret: refused at start (exit 2)" || bad "insecure staging listener: exit $rc" "$out"
out=$(OASIS_STAGING_SECRET="" "$SERVER" --port 0 --log-level warn "${COMMON[@]}" --role prefill --staging-listen 0.0.0.0:0 2>&1)
rc=$?
[[ $rc == 2 ]] && grep -q "0.0.0.0:0" <<<"$out" && ok "prefill with --staging-listen 0.0.0.0:0 and no secret: exit 2" || bad "--staging-listen 0.0.0.0:0: exit $rc" "$out"
# A prefill instance asking a secret (from a file); decode instances with it (from the
# environment), with a wrong one, and with none (the first decode instance).
printf 'e2e staging secret\n' > "$TMP/staging-secret"
start sprefill --role prefill --staging-listen 127.0.0.1:0 --staging-secret-file "$TMP/staging-secret" \
  --staging-pool-gib 0.25 --staging-lease-ttl-ms 2000 || exit 1
export OASIS_STAGING_SECRET="e2e staging secret"
start sdecode --role decode || exit 1
unset OASIS_STAGING_SECRET
start wdecode --role decode --staging-secret "e2e staging secreT" || exit 1
start_router srouter --prefill "127.0.0.1:$sprefill_PORT" --decode "127.0.0.1:$sdecode_PORT" || exit 1
start_router wrouter --prefill "127.0.0.1:$sprefill_PORT" --decode "127.0.0.1:$wdecode_PORT" || exit 1
start_router nrouter --prefill "127.0.0.1:$sprefill_PORT" --decode "127.0.0.1:$decode_PORT" || exit 1
body=$(python3 -c "import json,sys; print(json.dumps({'prompt': sys.argv[1], 'max_tokens': 12, 'temperature': 0}))" "$(prompt_text 31 90)")
want=$(post "$one_PORT" /v1/completions "$body")
got=$(post "$srouter_PORT" /v1/completions "$body")
[[ $(py "$got" "d['choices'][0]['text']") == $(py "$want" "d['choices'][0]['text']") && -n $(py "$want" "d['choices'][0]['text']") ]] &&
  ok "the right staging secret: the same completion as one instance" || bad "right secret" "$got | want $want"
for r in wrouter nrouter; do
  port_var="${r}_PORT"
  code=$(curl -s -o "$TMP/e" -w '%{http_code}' "http://127.0.0.1:${!port_var}/v1/completions" -H 'Content-Type: application/json' -d "$body")
  [[ $code != 200 ]] && grep -q "wrong or missing staging secret" "$TMP/e" &&
    ok "$([[ $r == wrouter ]] && echo "a wrong" || echo "no") staging secret: refused ($code, the error says why)" || bad "$r: $code" "$(cat "$TMP/e")"
done
v=$(pwait "$sprefill_PORT" oasis:staging_pool_requests_held "v == 0") && ok "the refused requests' leases ended too" || bad "leases held after refusals" "$v"

# ---- across two network namespaces joined by veth ----------------------------------------------
if [[ $(id -u) != 0 ]] || ! command -v ip >/dev/null; then
  echo "SKIPPED (netns part): needs root and iproute2 to make a network namespace"
else
  NETNS="odg$$"
  if ip netns add "$NETNS" 2>/dev/null && ip link add "${NETNS}h" type veth peer name "${NETNS}n" &&
     ip link set "${NETNS}n" netns "$NETNS" && ip addr add 10.213.7.1/30 dev "${NETNS}h" && ip link set "${NETNS}h" up &&
     ip netns exec "$NETNS" ip addr add 10.213.7.2/30 dev "${NETNS}n" && ip netns exec "$NETNS" ip link set "${NETNS}n" up &&
     ip netns exec "$NETNS" ip link set lo up && ip netns exec "$NETNS" true; then
    # The prefill instance inside: HTTP and staging on 10.213.7.2 (not loopback: with a secret).
    ip netns exec "$NETNS" "$SERVER" --port 0 --log-level warn "${COMMON[@]}" --host 10.213.7.2 --role prefill \
      --staging-listen 10.213.7.2:0 --staging-pool-gib 0.25 --staging-secret-file "$TMP/staging-secret" > "$TMP/nsprefill.log" 2>&1 &
    PIDS+=("$!")
    nsport=""
    for _ in $(seq 1 300); do
      nsport=$(sed -n 's|^oasis-server: listening on http://[^:]*:\([0-9]*\)$|\1|p' "$TMP/nsprefill.log" | head -1)
      [[ -n $nsport ]] && break
      sleep 0.05
    done
    for _ in $(seq 1 300); do
      [[ $(curl -s -o /dev/null -w '%{http_code}' "http://10.213.7.2:$nsport/health") == 200 ]] && break
      sleep 0.05
    done
    # A decode instance started now: UCX picks its network interfaces when it starts, and the
    # veth end did not exist when the others did.
    start nsdecode --role decode --staging-secret-file "$TMP/staging-secret" || exit 1
    start_router router3 --prefill "10.213.7.2:$nsport" --decode "127.0.0.1:$nsdecode_PORT" || exit 1
    body=$(python3 -c "import json,sys; print(json.dumps({'prompt': sys.argv[1], 'max_tokens': 30, 'temperature': 0}))" "$(prompt_text 21 160)")
    want=$(post "$one_PORT" /v1/completions "$body")
    got=$(post "$router3_PORT" /v1/completions "$body")
    [[ $(py "$got" "d['choices'][0]['text']") == $(py "$want" "d['choices'][0]['text']") && -n $(py "$want" "d['choices'][0]['text']") ]] &&
      ok "prefill in another network namespace (veth): same completion" || bad "netns completion differs" "$got | want $want"
    v=$(BASE="http://10.213.7.2:$nsport" wait_metric oasis:staging_pool_requests_held "v == 0") &&
      ok "netns: staging pool empty after the request" || bad "netns lease held" "$v"
  else
    echo "SKIPPED (netns part): cannot make a network namespace joined by veth here"
    ip netns del "$NETNS" 2>/dev/null
    NETNS=""
  fi
fi

[[ $FAIL == 0 ]] && echo "PASSED: disaggregated prefill/decode end to end" || echo "FAILED: disaggregation end to end"
exit $FAIL
