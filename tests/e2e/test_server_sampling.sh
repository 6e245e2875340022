#!/usr/bin/env bash
# Penalties, logit_bias, allowed_token_ids, bad_words and min_tokens end to end: oasis-server on
# the CPU backend with the embedded default model, over HTTP on loopback (server_sampling.py):
# their effect on greedy output, streaming and seeded sampling, and the 400s naming the field.
# Usage: test_server_sampling.sh <oasis-server> <repo root>
set -uo pipefail
SERVER=$1
ROOT=$2
cd "$ROOT"
source "$ROOT/tests/e2e/server_lib.sh"
server_test_init
start_server "$TMP/server.log" --backend cpu || exit 1
python3 "$ROOT/tests/e2e/server_sampling.py" "$BASE" || fail=1
stop_server || fail=1
[[ $fail == 0 ]] && echo "PASS" || { echo "FAIL"; tail -20 "$TMP/server.log"; }
exit $fail
