#!/usr/bin/env bash
# oasis-server against hostile clients on loopback (tests/e2e/hostile_client.py, raw sockets):
# conflicting framing, chunked bodies over the limit or never ending, oversized headers,
# slowloris, idle floods past --max-connections, a fast 503 when every connection is busy,
# slow request bodies filling --max-connections (the slowest is closed for /health),
# clients that reset their connection mid-generation (the request is aborted at once), a stream
# its client never reads (aborted past 8 MiB unsent), a flood
# of streams past --max-waiting (429s, /health answering throughout), and SIGTERM with a live
# stream and slow clients (the stream ends with "abort" and [DONE]; exit 0 within
# --shutdown-timeout-s). CPU backend, embedded model.
# Usage: test_server_hostile.sh <oasis-server> <repo root>
set -uo pipefail
SERVER=$1
ROOT=$2
cd "$ROOT"
source "$ROOT/tests/e2e/server_lib.sh"
server_test_init
HOSTILE="python3 $ROOT/tests/e2e/hostile_client.py"
probe() { $HOSTILE "$PORT" "$@" || fail=1; }

start_server "$TMP/hostile.log" --backend cpu --max-connections 48 --header-timeout-s 2 \
  --body-timeout-s 2 --keep-alive-timeout-s 60 --max-body-bytes 65536 --max-num-seqs 4 \
  --max-waiting 12 --shutdown-timeout-s 3 || exit 1
abort_total() { curl -s "$BASE/metrics" | sed -n 's/^oasis:request_success_total{.*finished_reason="abort"} \(.*\)$/\1/p'; }
probe framing 65536
probe slowloris 30 4
OASIS_SERVER_PID=$SERVER_PID probe pipeflood 2
wait_metric 'oasis:num_requests_running' 'v == 0' >/dev/null || bad "the flooding client's generation still runs"
probe idle 200 3 48
probe busy 48
sleep 2.5  # the busy probe's half requests time out (--header-timeout-s 2)
probe trickle 48
sleep 2.5  # the trickling bodies time out (--body-timeout-s 2)

# A client that resets its connection: the generation is aborted at once, not run to the end
# (4000 tokens take ~30 s here).
for stream in 0 1; do
  before=$(abort_total)
  probe reset "$stream" 4000
  if v=$(wait_metric 'oasis:num_requests_running' 'v == 0'); then
    ok "reset (stream=$stream): nothing left running"
  else
    bad "reset (stream=$stream): still running ($v)"
  fi
  after=$(abort_total)
  [[ $((after - ${before:-0})) == 1 ]] && ok "reset (stream=$stream): aborted (abort total $before -> $after)" \
    || bad "reset (stream=$stream): abort total $before -> $after"
done
d=$(curl -s "$BASE/metrics" | sed -n 's/^oasis:client_disconnects_total{.*} \(.*\)$/\1/p')
[[ $d -ge 2 ]] && ok "client disconnects counted ($d)" || bad "client disconnects: $d"

# A stream whose client never reads: past 8 MiB unsent the request is aborted (not generated
# to its end, 4 x 4000 tokens, and held in memory until the write timeout).
a0=$(abort_total)
NOREAD_HOLD_S=120 $HOSTILE "$PORT" noread 4000 >"$TMP/noread.out" 2>&1 &
noread=$!
for _ in $(seq 1 100); do grep -q streaming "$TMP/noread.out" && break; sleep 0.05; done
t0=$(date +%s)
sleep 1
for _ in $(seq 1 180); do
  [[ $(metric 'oasis:num_requests_running') == 0* ]] && break
  sleep 0.5
done
if v=$(wait_metric 'oasis:num_requests_running' 'v == 0'); then
  a1=$(abort_total)
  [[ $((a1 - a0)) == 4 ]] && ok "an unread stream: its 4 choices aborted after $(( $(date +%s) - t0 )) s" \
    || bad "an unread stream: abort total $a0 -> $a1"
else
  bad "an unread stream is still running ($v)"
fi
kill "$noread" 2>/dev/null
wait "$noread" 2>/dev/null

# 40 streams at once with 4 running and 12 waiting: the rest get 429, /health keeps answering.
probe flood 40 24

# SIGTERM with a live stream and slow clients: the stream ends with abort and [DONE], the
# slow clients are cut, and the server exits 0 within --shutdown-timeout-s (3 s) and a margin.
$HOSTILE "$PORT" stream_abort 4000 >"$TMP/stream.out" 2>&1 &
streamer=$!
$HOSTILE "$PORT" slowloris 5 30 >/dev/null 2>&1 &
slow=$!
for _ in $(seq 1 100); do grep -q streaming "$TMP/stream.out" && break; sleep 0.05; done
sleep 1
t0=$(date +%s.%N)
kill -TERM "$SERVER_PID"
rc=0
wait "$SERVER_PID" || rc=$?
SERVER_PID=""
dt=$(python3 -c "import time; print(round(time.time() - $t0, 2))")
[[ $rc == 0 ]] && ok "exit 0 after SIGTERM" || bad "exit $rc after SIGTERM"
python3 -c "import sys; sys.exit(0 if $dt < 6 else 1)" && ok "exited ${dt} s after SIGTERM (slow clients cut)" \
  || bad "exited ${dt} s after SIGTERM"
wait "$streamer" && ok "$(grep '^ok' "$TMP/stream.out" | tail -1)" || bad "stream at shutdown" "$(cat "$TMP/stream.out")"
kill "$slow" 2>/dev/null
wait "$slow" 2>/dev/null
exit $fail
