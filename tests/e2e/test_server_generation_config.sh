#!/usr/bin/env bash
# --generation-config end to end over HTTP (curl, CPU backend, the tiny default model's weights
# and tokenizer in model directories of this test, each with its own generation_config.json):
#   - auto: top_k 1 from the file makes unseeded n=4 choices identical (the defaulted parameter
#     takes effect); a request's own top_k overrides it; --generation-config vllm ignores it
#   - max_new_tokens: the default max_tokens of chat requests without one; a request's wins;
#     with --generation-config DIR it also caps
#   - a second EOS id listed only in generation_config.json stops generation (finish "stop"),
#     in vllm mode too, but not with ignore_eos
#   - --check-config reports what was applied (the real embedded default's file included); a
#     DIR without the file and malformed JSON are start-up errors naming them
# Usage: test_server_generation_config.sh <oasis-server> <repo root>
set -uo pipefail
SERVER=$1
ROOT=$2
cd "$ROOT"
source "$ROOT/tests/e2e/server_lib.sh"
server_test_init
TINY=$ROOT/tests/fixtures/tiny-default

# A model directory: the tiny default's files, and generation_config.json = $2.
model_dir() {
  mkdir -p "$TMP/$1"
  for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do ln -sf "$TINY/$f" "$TMP/$1/$f"; done
  printf '%s\n' "$2" >"$TMP/$1/generation_config.json"
}
PROMPT='[1, 17, 42, 99, 250, 7, 300]'
# The generated token ids of a /v1/completions answer (return_tokens_as_token_ids), and its finish reason.
complete() { post /v1/completions "{\"prompt\": $PROMPT, \"logprobs\": 0, \"return_tokens_as_token_ids\": true, $1}"; }
token_ids() { python3 -c 'import json,sys; c=json.loads(sys.argv[1])["choices"][int(sys.argv[2]) if len(sys.argv)>2 else 0]; print(json.dumps([int(t.split(":")[1]) for t in c["logprobs"]["tokens"]]))' "$@"; }
finish() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])["choices"][0]["finish_reason"])' "$1"; }
distinct_choices() { python3 -c 'import json,sys; print(len({c["text"] for c in json.loads(sys.argv[1])["choices"]}))' "$1"; }

# ---- a defaulted sampling parameter takes effect; the request overrides it ----------------
model_dir greedy '{"eos_token_id": [511, 509], "top_k": 1, "temperature": 0.9}'
start_server "$TMP/greedy.log" --backend cpu --model "$TMP/greedy" || exit 1
if grep -q "Default sampling parameters have been overridden by the model's Hugging Face generation config" "$TMP/greedy.log" &&
  grep -q "top_k=1" "$TMP/greedy.log"; then ok "start-up notice names the applied defaults"
else bad "start-up notice" "$(cat "$TMP/greedy.log")"; fi
r=$(complete '"n": 4, "max_tokens": 12, "ignore_eos": true')
g=$(complete '"max_tokens": 12, "ignore_eos": true, "temperature": 0')
if [[ $(distinct_choices "$r") == 1 ]] && [[ $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["choices"][0]["text"] == json.loads(sys.argv[2])["choices"][0]["text"])' "$r" "$g") == True ]]; then
  ok "top_k 1 from generation_config.json: unseeded choices all equal the greedy answer"
else bad "defaulted top_k" "$r"; fi
r=$(complete '"n": 4, "max_tokens": 12, "ignore_eos": true, "top_k": -1, "temperature": 1.5')
if [[ $(distinct_choices "$r") -gt 1 ]]; then ok "the request's top_k overrides the default"; else bad "request top_k override" "$r"; fi
stop_server || fail=1
start_server "$TMP/vllm.log" --backend cpu --model "$TMP/greedy" --generation-config vllm || exit 1
if grep -q "overridden" "$TMP/vllm.log"; then bad "vllm mode logs an override" "$(cat "$TMP/vllm.log")"; else ok "vllm mode: no override notice"; fi
r=$(complete '"n": 4, "max_tokens": 12, "ignore_eos": true')
if [[ $(distinct_choices "$r") -gt 1 ]]; then ok "--generation-config vllm: neutral defaults (choices differ)"; else bad "vllm mode still defaults" "$r"; fi
stop_server || fail=1

# ---- max_new_tokens: the default max_tokens; a cap with --generation-config DIR ------------
chat() { post /v1/chat/completions "{\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"ignore_eos\": true $1}"; }
usage_tokens() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])["usage"]["completion_tokens"])' "$1"; }
model_dir short '{"eos_token_id": [511, 509], "max_new_tokens": 5}'
start_server "$TMP/short.log" --backend cpu --model "$TMP/short" || exit 1
r=$(chat '')
[[ $(usage_tokens "$r") == 5 && $(finish "$r") == length ]] && ok "max_new_tokens 5: the default max_tokens" || bad "max_new_tokens default" "$r"
r=$(chat ', "max_tokens": 9')
[[ $(usage_tokens "$r") == 9 ]] && ok "auto: a request's max_tokens wins over max_new_tokens" || bad "request max_tokens" "$r"
stop_server || fail=1
start_server "$TMP/dir.log" --backend cpu --model "$TMP/greedy" --generation-config "$TMP/short" || exit 1
r=$(chat ', "max_tokens": 9')
[[ $(usage_tokens "$r") == 5 ]] && ok "--generation-config DIR: max_new_tokens caps max_tokens" || bad "DIR cap" "$r"
r=$(complete '"n": 3, "max_tokens": 8, "ignore_eos": true')
[[ $(distinct_choices "$r") -gt 1 ]] && ok "DIR mode reads DIR's file, not the model's (no top_k 1)" || bad "DIR source" "$r"
stop_server || fail=1

# ---- a second EOS id from generation_config.json stops generation --------------------------
model_dir plain '{"eos_token_id": [511, 509]}'
start_server "$TMP/plain.log" --backend cpu --model "$TMP/plain" || exit 1
full=$(token_ids "$(complete '"max_tokens": 16, "ignore_eos": true, "temperature": 0')")
stop_server || fail=1
# The first generated token (from the third on) that is no EOS yet and has not appeared before.
read -r k eos < <(python3 -c '
import json, sys
t = json.loads(sys.argv[1])
k = next(i for i in range(2, len(t)) if t[i] not in (509, 511) and t[i] not in t[:i])
print(k, t[k])' "$full")
echo "greedy tokens $full; extra EOS $eos at step $k"
model_dir extra "{\"eos_token_id\": [511, 509, $eos]}"
for mode in auto vllm; do
  start_server "$TMP/extra-$mode.log" --backend cpu --model "$TMP/extra" --generation-config "$mode" || exit 1
  r=$(complete '"max_tokens": 16, "temperature": 0')
  got=$(token_ids "$r")
  if [[ $(finish "$r") == stop ]] && python3 -c '
import json, sys
full, got, k = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
assert got == full[:len(got)] and len(got) in (k, k + 1), (full, got, k)' "$full" "$got" "$k"; then
    ok "$mode: generation_config.json's extra EOS $eos stops at step $k"
  else bad "$mode: extra EOS did not stop" "$r"; fi
  r=$(complete '"max_tokens": 16, "temperature": 0, "ignore_eos": true')
  [[ $(token_ids "$r") == "$full" && $(finish "$r") == length ]] && ok "$mode: ignore_eos runs past it" || bad "$mode: ignore_eos" "$r"
  stop_server || fail=1
done

# ---- --check-config: what was applied; start-up errors --------------------------------------
out=$("$SERVER" --check-config --backend cpu --model "$TMP/extra" 2>&1)
if python3 -c '
import json, sys
text = sys.argv[1]
g = json.loads(text[text.index("{"):text.rindex("}") + 1])["resolved"]["generation_config"]
assert g["mode"] == "auto" and g["applied"] == [] and g["eos_token_ids"][-1] == int(sys.argv[2]), g' "$out" "$eos"; then
  ok "--check-config reports the generation config"
else bad "--check-config generation_config" "$out"; fi
out=$(env -u OASIS_EMBEDDED_MODEL "$SERVER" --check-config --backend cpu 2>&1)
if python3 -c '
import json, sys
text = sys.argv[1]
g = json.loads(text[text.index("{"):text.rindex("}") + 1])["resolved"]["generation_config"]
assert g["source"].endswith("models/embedded/generation_config.json"), g
assert g["applied"] == ["temperature=0.7", "top_p=0.8", "top_k=20"], g' "$out"; then
  ok "the embedded default's generation_config.json is honoured"
else bad "embedded default generation config" "$out"; fi
mkdir -p "$TMP/nothing"
out=$("$SERVER" --check-config --backend cpu --model "$TMP/plain" --generation-config "$TMP/nothing" 2>&1); rc=$?
[[ $rc != 0 && $out == *"--generation-config $TMP/nothing: no generation_config.json"* ]] && ok "DIR without the file: start-up error" || bad "DIR without file (rc $rc)" "$out"
model_dir broken '{"temperature": 0.7,'
out=$("$SERVER" --check-config --backend cpu --model "$TMP/broken" 2>&1); rc=$?
[[ $rc != 0 && $out == *"broken/generation_config.json: not valid JSON"* ]] && ok "malformed generation_config.json: start-up error naming it" || bad "malformed file (rc $rc)" "$out"
exit $fail
