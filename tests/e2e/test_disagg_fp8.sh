#!/usr/bin/env bash
# Disaggregated prefill/decode with an FP8 KV cache (--kv-cache-dtype fp8) end to end on the CPU
# backend with the embedded model (docs/disaggregation.md, "FP8 KV cache"): a prefill instance,
# decode instances with remote partial fetch and --rpf off, a single FP8 sparse instance and
# oasis-router, all separate processes on loopback. Checks:
#   - the staging pool's slots are e4m3 head-blocks (16 x head_dim x 1 byte);
#   - every instance calibrates the same scales (the same model and built-in text): the
#     imports are bit-exact, so greedy completions (several prompts, chat, SSE) through the
#     router equal the single FP8 instance in text and log-probabilities; no request was
#     requantized (no "scales differ" warning);
#   - every lease ends and the staging pool empties;
#   - a pair with different KV dtypes (prefill fp8 / decode auto and the other way round) is
#     refused with an error naming the dtypes (400 relayed by the router), and every
#     instance stays up and keeps serving.
# Usage: test_disagg_fp8.sh OASIS_SERVER OASIS_ROUTER SOURCE_DIR
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
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
FAIL=0
ok() { echo "ok: $*"; }
bad() { echo "FAILED: $1"; [[ -n ${2:-} ]] && echo "  got: ${2:0:800}"; FAIL=1; }
py() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); print($2)" "$1"; }
post() { curl -s "http://127.0.0.1:$1$2" -H 'Content-Type: application/json' -d "$3"; }

# K 64 blocks >= the longest request here (prompt + output < 64 x 16 tokens): sparse == dense.
COMMON=(--backend cpu --threads 2 --host-kv-gib 0.25 --topk-blocks 64 --max-num-seqs 16)
FP8=(--kv-cache-dtype fp8)

start one "${FP8[@]}" --sparse on --sparse-switch threshold || exit 1
start prefill "${FP8[@]}" --role prefill --staging-listen 127.0.0.1:0 --staging-pool-gib 0.25 --log-level info || exit 1
start decode "${FP8[@]}" --role decode --log-level info || exit 1
start full "${FP8[@]}" --role decode --rpf off --log-level info || exit 1
start_router router --prefill "127.0.0.1:$prefill_PORT" --decode "127.0.0.1:$decode_PORT,127.0.0.1:$full_PORT" || exit 1
ok "FP8: single instance, prefill, decode (rpf on and off) and router up"

# ---- the staging pool holds e4m3 head-blocks ----------------------------------------------------
model_dir=${OASIS_EMBEDDED_MODEL:-$SRC/models/embedded}
head_dim=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["head_dim"])' "$model_dir/config.json" 2>/dev/null)
line=$(grep -o 'staging pool .* head-blocks of [0-9]* B' "$TMP/prefill.log" | head -1)
if [[ -n $head_dim && $line == *"head-blocks of $((16 * head_dim)) B"* ]]; then
  ok "prefill: $line (16 x head_dim $head_dim x 1 byte)"
else
  bad "staging pool slots are not e4m3 head-blocks (head_dim '$head_dim')" "$line"
fi
# The same calibrated scales everywhere (the imports then move bytes unchanged).
scales() { grep -o 'max |K|.*' "$TMP/$1.log" | head -1; }
[[ -n $(scales prefill) && $(scales prefill) == "$(scales decode)" && $(scales prefill) == "$(scales full)" ]] &&
  ok "prefill and decode instances calibrated the same scales ($(scales prefill))" ||
  bad "calibrations differ" "prefill: $(scales prefill) | decode: $(scales decode) | full: $(scales full)"

# ---- the same greedy outputs as one FP8 instance --------------------------------------------
router_equals_one "FP8 " 100 35

# Both decode modes took requests, nothing was requantized, every lease ended.
for d in decode full; do
  port_var="${d}_PORT"
  n=$(pmetric "${!port_var}" oasis:rpf_imports_total)
  [[ ${n%.*} -ge 1 ]] && ok "$d instance imported ${n%.*} FP8 requests" || bad "$d instance imported nothing" "$n"
done
grep -q "scales differ" "$TMP/decode.log" "$TMP/full.log" && bad "imports were requantized (the scales differ)" "$(grep -h 'scales differ' "$TMP"/decode.log "$TMP"/full.log)"
v=$(pwait "$prefill_PORT" oasis:staging_pool_requests_held "v == 0") && ok "staging pool empty after the requests ($v held)" || bad "staging leases still held" "$v"

# ---- pairs of different KV dtypes are refused, nothing crashes ---------------------------------
start prefill_auto --role prefill --staging-listen 127.0.0.1:0 --staging-pool-gib 0.25 || exit 1
start decode_auto --role decode || exit 1
start_router mixed1 --prefill "127.0.0.1:$prefill_auto_PORT" --decode "127.0.0.1:$decode_PORT" || exit 1
start_router mixed2 --prefill "127.0.0.1:$prefill_PORT" --decode "127.0.0.1:$decode_auto_PORT" || exit 1
body='{"prompt": "river market city north stone bread light harbour winter garden", "max_tokens": 8, "temperature": 0}'
for r in mixed1 mixed2; do
  port_var="${r}_PORT"
  code=$(curl -s -o "$TMP/e" -w '%{http_code}' "http://127.0.0.1:${!port_var}/v1/completions" -H 'Content-Type: application/json' -d "$body")
  msg=$(py "$(cat "$TMP/e")" "d['error']['message']" 2>/dev/null)
  if [[ $r == mixed1 ]]; then want_msg="KV cache dtype differs (ticket f32, this instance fp8_e4m3)"; else want_msg="KV cache dtype differs (ticket fp8_e4m3, this instance f32)"; fi
  [[ $code == 400 && $msg == *"$want_msg"* && $msg == *"--kv-cache-dtype"* ]] &&
    ok "$r (prefill $([[ $r == mixed1 ]] && echo auto || echo fp8), decode $([[ $r == mixed1 ]] && echo fp8 || echo auto)): 400, \"$want_msg\"" ||
    bad "$r: a pair of different KV dtypes: $code" "$(cat "$TMP/e")"
done
for p in one prefill decode full prefill_auto decode_auto; do
  port_var="${p}_PORT"
  pid_var="${p}_PID"
  kill -0 "${!pid_var}" 2>/dev/null && [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${!port_var}/health") == 200 ]] ||
    bad "instance $p is down after the refusals" "$(tail -5 "$TMP/$p.log")"
done
# The refused requests' leases end (aborted by the decode instance), and the FP8 pair still serves.
v=$(pwait "$prefill_PORT" oasis:staging_pool_requests_held "v == 0") && ok "fp8 staging pool empty after the refusal ($v held)" || bad "fp8 staging leases held after the refusal" "$v"
v=$(pwait "$prefill_auto_PORT" oasis:staging_pool_requests_held "v == 0") && ok "auto staging pool empty after the refusal ($v held)" || bad "auto staging leases held after the refusal" "$v"
body=$(python3 -c "import json,sys; print(json.dumps({'prompt': sys.argv[1], 'max_tokens': 20, 'temperature': 0}))" "$(prompt_text 77 90)")
want=$(post "$one_PORT" /v1/completions "$body")
got=$(post "$router_PORT" /v1/completions "$body")
[[ $(py "$got" "d['choices'][0]['text']") == $(py "$want" "d['choices'][0]['text']") ]] &&
  ok "the FP8 pair still serves after the refusals, as one FP8 instance" || bad "FP8 pair after the refusals" "$got | want $want"

exit $FAIL
