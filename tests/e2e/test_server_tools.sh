#!/usr/bin/env bash
# Tool calling and reasoning end to end: oasis-server with --enable-auto-tool-choice
# --tool-call-parser hermes --reasoning-parser qwen3 on the CPU backend and the embedded default
# model, driven by the official `openai` npm client (server_tools.mjs: teacher-forced tool-call
# and <think> answers, streamed and not, the history round trip); then a server with
# --tool-call-parser llama3_json (curl), one whose chat template ends the prompt with <think>, and
# bad parser flags (exit 2). The client is installed
# like test_server_clients.sh does (.cache/e2e-node; skipped, exit 77, only when npm cannot reach
# the registry).
# Usage: test_server_tools.sh <oasis-server> <repo root>
set -uo pipefail
SERVER=$1
ROOT=$2
cd "$ROOT"
source "$ROOT/tests/e2e/server_lib.sh"
NODE_DIR=${OASIS_E2E_NODE_DIR:-$ROOT/.cache/e2e-node}
PACKAGES=(openai@5.23.2 @grpc/grpc-js@1.14.0 @grpc/proto-loader@0.8.0)  # as test_server_clients.sh
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
server_test_init

start_server "$TMP/server.log" --backend cpu --enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3 || exit 1
node "$ROOT/tests/e2e/server_tools.mjs" "$BASE" "$NODE_DIR/node_modules" || fail=1
stop_server || fail=1

# llama3_json: JSON objects at the start of the answer, ';'-separated (teacher-forced, curl).
start_server "$TMP/llama.log" --backend cpu --enable-auto-tool-choice --tool-call-parser llama3_json || exit 1
text='{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time", "arguments": {"zone": "CET"}}'
ids=$(post /tokenize "$(python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "add_special_tokens": False}))' "$text")" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
n=$(python3 -c 'import sys; print(len(eval(sys.argv[1])))' "$ids")
r=$(post /v1/chat/completions "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}, {\"type\": \"function\", \"function\": {\"name\": \"get_time\"}}], \"forced_output_ids\": $ids, \"max_tokens\": $n}")
if python3 -c '
import json, sys
d = json.loads(sys.argv[1]); m = d["choices"][0]["message"]; c = m["tool_calls"]
assert m["content"] is None and d["choices"][0]["finish_reason"] == "tool_calls"
assert [x["function"]["name"] for x in c] == ["get_weather", "get_time"]
assert json.loads(c[0]["function"]["arguments"]) == {"city": "Oslo"} and json.loads(c[1]["function"]["arguments"]) == {"zone": "CET"}
' "$r"; then ok "llama3_json: two ';'-separated calls (parameters and arguments)"; else bad "llama3_json calls" "$r"; fi
stop_server || fail=1

# A template that opens <think> in the generation prompt (as Qwen3-Thinking-2507's): the answer
# starts inside the block, so what precedes </think> is reasoning.
cat >"$TMP/think.jinja" <<'JINJA'
{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n<think>\n' }}{%- endif %}
JINJA
start_server "$TMP/think.log" --backend cpu --reasoning-parser qwen3 --chat-template "$TMP/think.jinja" || exit 1
ids=$(post /tokenize '{"prompt": "Two and two.\n</think>\n\nFour.", "add_special_tokens": false}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
n=$(python3 -c 'import sys; print(len(eval(sys.argv[1])))' "$ids")
r=$(post /v1/chat/completions "{\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"}], \"forced_output_ids\": $ids, \"max_tokens\": $n}")
if python3 -c '
import json, sys
m = json.loads(sys.argv[1])["choices"][0]["message"]
assert m["reasoning_content"] == "Two and two.\n" and m["content"] == "\n\nFour.", m
' "$r"; then ok "prompt ending in <think>: the text before </think> is reasoning"; else bad "prompt ending in <think>" "$r"; fi
stop_server || fail=1

# Bad parser flags: exit 2 naming the setting.
for flags in "--enable-auto-tool-choice" "--tool-call-parser mistral" "--reasoning-parser granite"; do
  # shellcheck disable=SC2086
  "$SERVER" --backend cpu --port 0 $flags >"$TMP/bad.log" 2>&1
  rc=$?
  if [[ $rc == 2 ]] && grep -qE -- "--(tool-call|reasoning)-parser" "$TMP/bad.log"; then ok "'$flags' -> exit 2 naming the setting"; else bad "'$flags': exit $rc" "$(cat "$TMP/bad.log")"; fi
done
exit $fail
