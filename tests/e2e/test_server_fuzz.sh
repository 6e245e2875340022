#!/usr/bin/env bash
# Structure-aware fuzzing of every POST route's handler over real HTTP
# (tests/e2e/fuzz_requests.py): mutated bodies (every JSON type and edge, deep nesting around
# the limit, cut or flipped bytes) must get a 2xx or a 4xx/429/503 with OpenAI error JSON,
# never a 5xx or a dead server. A fixed budget: OASIS_FUZZ_REQUESTS_SECONDS (default 45).
# Usage: test_server_fuzz.sh <oasis-server> <repo root>
set -uo pipefail
SERVER=$1
ROOT=$2
cd "$ROOT"
source "$ROOT/tests/e2e/server_lib.sh"
server_test_init
start_server "$TMP/fuzz.log" --backend cpu --max-model-len 512 --max-num-seqs 8 || exit 1
python3 "$ROOT/tests/e2e/fuzz_requests.py" "$PORT" "${OASIS_FUZZ_REQUESTS_SECONDS:-45}" 1 || fail=1
stop_server || fail=1
exit $fail
