#!/usr/bin/env bash
# RoPE scaling through oasis-server (CPU backend): each checkpoint of tests/fixtures/rope
# (tools/gen_rope_fixtures.py: yarn, linear, dynamic over 64 original positions) is served with
# the context vLLM derives (256 = 64 × 4: --check-config and /v1/models say so), and the greedy
# continuation of its 100-token prompt (positions up to 131) equals the reference's tokens.
# Usage: test_server_rope.sh <oasis-server> <repo root>
set -uo pipefail
SERVER=$1
ROOT=$2
cd "$ROOT"
source "$ROOT/tests/e2e/server_lib.sh"
server_test_init
FIX=$ROOT/tests/fixtures/rope
[[ -f $FIX/manifest.json ]] || { echo "FAILED: no $FIX: run python3 tools/gen_rope_fixtures.py --out tests/fixtures/rope on the GPU machine"; exit 1; }

# A tensor of a safetensors file as a JSON list (int64 or float32; no numpy needed).
tensor() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    meta = header[sys.argv[2]]
    f.seek(8 + n + meta["data_offsets"][0])
    raw = f.read(meta["data_offsets"][1] - meta["data_offsets"][0])
fmt = {"I64": "q", "F32": "f"}[meta["dtype"]]
print(json.dumps(list(struct.unpack("<%d%s" % (len(raw) // struct.calcsize(fmt), fmt), raw))))
PY
}

for name in qwen3-yarn llama-yarn-options llama-linear qwen3-dynamic; do
  dir=$FIX/$name
  out=$("$SERVER" --check-config --backend cpu --model "$dir" 2>&1)
  want_type=${name#*-}; want_type=${want_type%-options}
  if python3 -c '
import json, sys
text = sys.argv[1]
r = json.loads(text[text.index("{"):text.rindex("}") + 1])["resolved"]
assert r["max_model_len"] == 256 and r["rope_type"] == sys.argv[2], r' "$out" "$want_type"; then
    ok "$name: --check-config: rope_type $want_type, max_model_len 256"
  else bad "$name --check-config" "$out"; fi
  start_server "$TMP/$name.log" --backend cpu --model "$dir" || { fail=1; continue; }
  len=$(curl -s "$BASE/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["max_model_len"])')
  [[ $len == 256 ]] && ok "$name: /v1/models max_model_len 256" || bad "$name: /v1/models max_model_len $len"
  prompt=$(tensor "$dir/reference.safetensors" prompt2.ids)
  want=$(tensor "$dir/reference.safetensors" prompt2.greedy)
  r=$(post /v1/completions "{\"prompt\": $prompt, \"max_tokens\": 32, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": 0, \"return_tokens_as_token_ids\": true}")
  got=$(python3 -c 'import json,sys; print(json.dumps([int(t.split(":")[1]) for t in json.loads(sys.argv[1])["choices"][0]["logprobs"]["tokens"]]))' "$r" 2>/dev/null)
  [[ -n $got && $got == "$want" ]] && ok "$name: 100-token prompt + 32 greedy tokens = transformers' (positions past 64)" ||
    bad "$name: greedy tokens" "got $got want $want $r"
  stop_server || fail=1
done
exit $fail
