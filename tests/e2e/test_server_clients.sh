#!/usr/bin/env bash
# oasis-server with real client libraries: the official `openai` npm package and
# @grpc/grpc-js + @grpc/proto-loader, installed at test time into .cache/e2e-node
# (skipped, exit 77, only when npm cannot reach the registry). See server_clients.mjs.
# Usage: test_server_clients.sh <oasis-server> <repo root>
set -uo pipefail
SERVER=$1
ROOT=$2
cd "$ROOT"
source "$ROOT/tests/e2e/server_lib.sh"
NODE_DIR=${OASIS_E2E_NODE_DIR:-$ROOT/.cache/e2e-node}
PACKAGES=(openai@5.23.2 @grpc/grpc-js@1.14.0 @grpc/proto-loader@0.8.0)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "skipping: node/npm not installed"; exit 77
fi
if [[ ! -f $NODE_DIR/.installed-v1 ]]; then
  mkdir -p "$NODE_DIR"
  if ! npm install --prefix "$NODE_DIR" --no-audit --no-fund --silent "${PACKAGES[@]}" >"$NODE_DIR/npm.log" 2>&1; then
    if grep -qiE "ENOTFOUND|ECONNREFUSED|ETIMEDOUT|EAI_AGAIN|network" "$NODE_DIR/npm.log"; then
      echo "skipping: npm cannot reach the registry"; tail -5 "$NODE_DIR/npm.log"; exit 77
    fi
    echo "FAILED: npm install"; cat "$NODE_DIR/npm.log"; exit 1
  fi
  touch "$NODE_DIR/.installed-v1"
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
TMP=$(mktemp -d)
AUTH_PID=""
trap 'stop_server >/dev/null; [[ -n $AUTH_PID ]] && kill -TERM $AUTH_PID 2>/dev/null; rm -rf "$TMP"' EXIT

# A second server with an API key, for the gRPC authentication checks.
AUTH_GRPC=$(free_port)
"$SERVER" --port 0 --grpc-port "$AUTH_GRPC" --api-key s3cret --backend cpu --log-level warn >"$TMP/auth.log" 2>&1 &
AUTH_PID=$!

start_server "$TMP/server.log" --backend cpu --grpc-port "$(free_port)" || exit 1
[[ -n $GRPC_PORT ]] || { echo "FAILED: no gRPC port"; cat "$TMP/server.log"; exit 1; }
for _ in $(seq 1 100); do grep -q ready "$TMP/auth.log" && break; sleep 0.1; done
node "$ROOT/tests/e2e/server_clients.mjs" "$BASE" "$GRPC_PORT" "$ROOT/proto/oasis.proto" "$NODE_DIR/node_modules" "$AUTH_GRPC"
rc=$?
stop_server || rc=1
kill -TERM $AUTH_PID; wait $AUTH_PID || rc=1
AUTH_PID=""

# gRPC bounds: --grpc-max-concurrent-calls 2, the standard health service, and SIGTERM with
# live streams (the server must exit 0 within its 10 s shutdown timeout, plus margin).
start_server "$TMP/bounds.log" --backend cpu --grpc-port "$(free_port)" --grpc-max-concurrent-calls 2 || exit 1
BOUNDS_PID=$SERVER_PID
SERVER_PID=""  # the script stops it
t0=$(date +%s)
node "$ROOT/tests/e2e/server_grpc_bounds.mjs" "$GRPC_PORT" "$ROOT" "$NODE_DIR/node_modules" "$BOUNDS_PID" || rc=1
kill -TERM "$BOUNDS_PID" 2>/dev/null  # (node sent it already, unless it failed before)
if wait "$BOUNDS_PID"; then
  took=$(($(date +%s) - t0))
  if ((took <= 15)); then echo "ok: SIGTERM with live gRPC streams: exit 0 in ${took}s"; else echo "FAILED: shutdown took ${took}s"; rc=1; fi
else
  echo "FAILED: the server exited with $? after SIGTERM with live gRPC streams"; cat "$TMP/bounds.log"; rc=1
fi
exit $rc
