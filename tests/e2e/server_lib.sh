# Helpers for the oasis-server end-to-end tests (sourced). Each test starts its own server
# on 127.0.0.1 with --port 0 (a free port chosen by the kernel), reads the port from the
# server's "listening on" line, waits for /health, and stops it (SIGTERM) on exit.
#   start_server <log file> [flags...]   sets SERVER_PID, PORT, BASE (and GRPC_PORT with --grpc-port)
#   stop_server                          SIGTERM, wait; fails the test if the exit status is not 0
#   metric <name>                        a metric's value from /metrics (labels ignored)
#   wait_metric <name> <condition on v>  polls briefly until the condition holds (prints the value)
#   ids <n> <seed>                       a JSON list of n pseudo-random token ids in [3, 503)
#   server_test_init                     the usual start of a test: $TMP (removed on exit, the
#                                        server stopped), fail=0; with ok, bad and post below
#   ok <what> / bad <what> [detail]      a check's line; bad sets fail=1 (BAD_LIMIT: detail chars)
#   post <path> <json body>              POST to the started server
SERVER_PID=""
server_test_init() {
  TMP=$(mktemp -d)
  trap 'stop_server >/dev/null; rm -rf "$TMP"' EXIT
  fail=0
}
ok() { echo "ok: $1"; }
bad() { echo "FAILED: $1"; [[ $# -gt 1 ]] && echo "$2" | head -c "${BAD_LIMIT:-2000}" && echo; fail=1; }
post() { curl -s -X POST "$BASE$1" -H 'Content-Type: application/json' -d "$2"; }
start_server() {
  local log=$1
  shift
  "$SERVER" --port 0 --log-level warn "$@" >"$log" 2>&1 &
  SERVER_PID=$!
  PORT=""
  for _ in $(seq 1 600); do
    PORT=$(sed -n 's|^oasis-server: listening on http://[^:]*:\([0-9]*\)$|\1|p' "$log" | head -1)
    [[ -n $PORT ]] && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z $PORT ]]; then
    echo "FAILED: server did not start"; cat "$log"; return 1
  fi
  BASE="http://127.0.0.1:$PORT"
  local healthy=0
  for _ in $(seq 1 600); do
    if [[ $(curl -s -o /dev/null -w '%{http_code}' "$BASE/health") == 200 ]]; then healthy=1; break; fi
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  [[ $healthy == 1 ]] || { echo "FAILED: server not healthy"; cat "$log"; return 1; }
  # The gRPC line may follow the HTTP one by a moment (it was read too early once in CI).
  GRPC_PORT=""
  local want_grpc=0
  for a in "$@"; do [[ $a == --grpc-port* ]] && want_grpc=1; done
  for _ in $(seq 1 100); do
    GRPC_PORT=$(sed -n 's|^oasis-server: gRPC on [^:]*:\([0-9]*\)$|\1|p' "$log" | head -1)
    [[ -n $GRPC_PORT || $want_grpc == 0 ]] && break
    sleep 0.05
  done
  return 0
}
stop_server() {
  [[ -z $SERVER_PID ]] && return 0
  kill -TERM "$SERVER_PID" 2>/dev/null
  local rc=0
  wait "$SERVER_PID" || rc=$?
  SERVER_PID=""
  if [[ $rc != 0 ]]; then echo "FAILED: server exited with $rc after SIGTERM"; return 1; fi
  echo "ok: server shut down cleanly on SIGTERM"
}

metric() { curl -s "$BASE/metrics" | sed -n "s/^$1{[^}]*} \(.*\)$/\1/p"; }
# The engine publishes counters after the step that finished the last request: poll briefly.
wait_metric() {
  local v
  for _ in $(seq 1 100); do
    v=$(metric "$1")
    [[ -n $v ]] && [[ $(python3 -c "v=float('$v'); print($2)") == True ]] && { echo "$v"; return 0; }
    sleep 0.05
  done
  echo "${v:-missing}"
  return 1
}
ids() { python3 -c "import sys; n,s=int(sys.argv[1]),int(sys.argv[2]); print([(i*s*7919+s)%500+3 for i in range(n)])" "$1" "$2"; }

# Several instances in one test (test_disagg.sh, test_router_upstreams.sh). The caller defines
# COMMON=(flags for every server), PIDS=() (killed by its cleanup), ROUTER, bad and FAIL.
#   start <name> [flags...]         an oasis-server with COMMON + flags; sets <name>_PORT, <name>_PID
#   start_router <name> [flags...]  an oasis-router; sets <name>_PORT once its /health is 200
#   wait_health <port> <code>       polls /health (10 s at most) until it answers <code>
#   pmetric <port> <name>, pwait <port> <name> <condition>: metric / wait_metric on that port
start() {
  local name=$1
  shift
  start_server "$TMP/$name.log" "${COMMON[@]}" "$@" || { FAIL=1; return 1; }
  PIDS+=("$SERVER_PID")
  printf -v "${name}_PORT" '%s' "$PORT"
  printf -v "${name}_PID" '%s' "$SERVER_PID"
  SERVER_PID=""
}
start_router() {
  local name=$1
  shift
  "$ROUTER" --port 0 --log-level warn "$@" >"$TMP/$name.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  local port=""
  for _ in $(seq 1 300); do
    port=$(sed -n 's|^oasis-router listening on http://[^:]*:\([0-9]*\)$|\1|p' "$TMP/$name.log" | head -1)
    [[ -n $port ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  [[ -z $port ]] && { bad "router $name did not start" "$(cat "$TMP/$name.log")"; return 1; }
  printf -v "${name}_PORT" '%s' "$port"
  wait_health "$port" 200 || { bad "router $name not healthy" "$(curl -s "http://127.0.0.1:$port/health")"; return 1; }
}
wait_health() {
  for _ in $(seq 1 200); do
    [[ $(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$1/health") == "$2" ]] && return 0
    sleep 0.05
  done
  return 1
}
pmetric() { BASE="http://127.0.0.1:$1" metric "$2"; }
pwait() { BASE="http://127.0.0.1:$1" wait_metric "$2" "$3"; }
