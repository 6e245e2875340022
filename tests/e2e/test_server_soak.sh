#!/usr/bin/env bash
# A bounded soak (~2 minutes): mixed hostile traffic (tests/e2e/hostile_client.py soak: normal
# requests streamed or not, short and sparse-length prompts, 10% aborted by close or reset,
# slow bodies, idle connections, malformed bodies, /health and /metrics) against a sparse KV
# server with a small host store and queue. Afterwards: nothing running or waiting, every KV
# block, working set and host slot free, RSS growth bounded, no 5xx anywhere.
#   OASIS_SOAK_SECONDS (default 90), OASIS_SOAK_CLIENTS (default 24); for other servers (the
#   H200 soak, tools/gpu_soak.sh): OASIS_SOAK_SERVER_ARGS replaces the CPU model's flags,
#   OASIS_SOAK_LENGTHS the prompt lengths (hostile_client.py), OASIS_SOAK_RSS_MIB the RSS bound.
# Usage: test_server_soak.sh <oasis-server> <repo root>
set -uo pipefail
SERVER=$1
ROOT=$2
cd "$ROOT"
source "$ROOT/tests/e2e/server_lib.sh"
server_test_init
SECONDS_TOTAL=${OASIS_SOAK_SECONDS:-90}
CLIENTS=${OASIS_SOAK_CLIENTS:-24}

rss_kib() { sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB$/\1/p' "/proc/$SERVER_PID/status"; }
RSS_BOUND=${OASIS_SOAK_RSS_MIB:-64}
# shellcheck disable=SC2206
MODEL_ARGS=(${OASIS_SOAK_SERVER_ARGS:---backend cpu --sparse-threshold 64 --sparse-switch threshold --topk-blocks 32 --fetch-ratio 0.05 --host-kv-gib 0.05 --max-num-seqs 12 --max-waiting 48})
start_server "$TMP/soak.log" "${MODEL_ARGS[@]}" --max-connections 256 \
  --header-timeout-s 3 --keep-alive-timeout-s 2 || exit 1
echo "server: ${MODEL_ARGS[*]}"
# 5xx answered so far (the start-up's /health polls got 503 "loading", as documented): the
# soak must add none.
count_5xx() {
  curl -s "$BASE/metrics" | grep -E '^oasis:http_requests_total\{.*status="5[0-9][0-9]"\}' | awk '{s += $2} END {print s + 0}'
}
fivexx0=$(count_5xx)
# Warm up (first allocations), then take the baseline.
python3 "$ROOT/tests/e2e/hostile_client.py" "$PORT" soak 5 8 7 >/dev/null 2>&1
rss0=$(rss_kib)
python3 "$ROOT/tests/e2e/hostile_client.py" "$PORT" soak "$SECONDS_TOTAL" "$CLIENTS" 1 || fail=1
for m in oasis:num_requests_running oasis:num_requests_waiting oasis:kv_cache_usage_perc \
         oasis:host_kv_usage oasis:sparse_requests oasis:sparse_gpu_kv_blocks; do
  v=$(wait_metric "$m" 'v == 0') && ok "after the soak: $m = 0" || bad "after the soak: $m = $v"
done
m=$(curl -s "$BASE/metrics")
fivexx=$(( $(count_5xx) - fivexx0 ))
[[ $fivexx == 0 ]] && ok "no 5xx answered ($fivexx0 before, while loading)" || bad "5xx answered: $fivexx" "$(grep -E 'status="5' <<<"$m")"
served=$(grep -E '^oasis:http_requests_total\{.*handler="/v1/completions",status="200"\}' <<<"$m" | awk '{s += $2} END {print s + 0}')
[[ $served -ge 200 ]] && ok "$served completions answered 200" || bad "only $served completions answered"
switches=$(sed -n 's/^oasis:sparse_switches_total{.*} \(.*\)$/\1/p' <<<"$m")
[[ ${switches:-0} -ge 10 ]] && ok "$switches requests went sparse (host store in use)" || bad "sparse switches: ${switches:-none}"
aborts=$(sed -n 's/^oasis:client_disconnects_total{.*} \(.*\)$/\1/p' <<<"$m")
[[ ${aborts:-0} -ge 1 ]] && ok "client disconnects counted ($aborts)" || bad "no client disconnect counted"
rss1=$(rss_kib)
growth=$(( (rss1 - rss0) / 1024 ))
[[ $growth -lt $RSS_BOUND ]] && ok "RSS ${rss0} -> ${rss1} KiB (+${growth} MiB, bound $RSS_BOUND)" || bad "RSS grew ${growth} MiB (${rss0} -> ${rss1} KiB)"
stop_server || fail=1
exit $fail
