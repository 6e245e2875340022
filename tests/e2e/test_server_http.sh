#!/usr/bin/env bash
# oasis-server over HTTP with curl, on the CPU backend and the embedded default model (no
# --model): health, models, completions (text, ids, n, logprobs, stop strings), chat, SSE
# streams with usage, tokenize/detokenize, metrics; every bad input gets the right 4xx
# OpenAI error JSON and the server stays up; API keys; body limit; 503 while loading;
# --check-config for every configs/*.json; clean exit on SIGTERM.
# Usage: test_server_http.sh <oasis-server> <repo root>
set -uo pipefail
SERVER=$1
ROOT=$2
cd "$ROOT"
source "$ROOT/tests/e2e/server_lib.sh"
server_test_init
# py <json> <python expression over d>: prints the value.
py() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(eval(sys.argv[2]))' "$1" "$2" 2>&1; }
expect() {  # expect <description> <json> <python boolean expression over d>
  if [[ $(py "$2" "$3") == True ]]; then ok "$1"; else bad "$1 [$3]" "$2"; fi
}
# status_of <path> <body> [curl args]: "<http code> <body>"
status_of() {
  local path=$1 body=$2
  shift 2
  curl -s -o "$TMP/body" -w '%{http_code}' -X POST "$BASE$path" -H 'Content-Type: application/json' "$@" --data-binary "$body"
}
expect_error() {  # expect_error <description> <http code> <path> <body> [curl args]
  local desc=$1 code=$2 path=$3 body=$4
  shift 4
  local got
  got=$(status_of "$path" "$body" "$@")
  local json
  json=$(cat "$TMP/body")
  if [[ $got == "$code" && $(py "$json" "set(d['error']) == {'message','type','param','code'} and len(d['error']['message']) > 0") == True ]]; then
    ok "$desc -> $code"
  else
    bad "$desc: expected $code with OpenAI error JSON, got $got" "$json"
  fi
}

# error400 <description> <body> <param> <words>: a chat request refused with 400 naming param.
error400() {
  status_of /v1/chat/completions "$2" >"$TMP/code"
  expect "$1 -> 400 naming $3" "{\"code\": $(cat "$TMP/code"), \"body\": $(cat "$TMP/body")}" \
    "d['code'] == 400 and d['body']['error']['param'] == '$3' and '$4' in d['body']['error']['message']"
}

start_server "$TMP/server.log" --backend cpu || exit 1
ok "server started with no --model (embedded default) on port $PORT"

# ---- happy paths --------------------------------------------------------------
expect "GET /health" "$(curl -s "$BASE/health")" "d['role'] == 'both' and d['num_running'] == 0 and d['num_waiting'] == 0"
models=$(curl -s "$BASE/v1/models")
expect "GET /v1/models lists the embedded model" "$models" "d['object'] == 'list' and d['data'][0]['id'] == 'oasis-embedded' and d['data'][0]['max_model_len'] == 4096 and d['data'][0]['vocab_size'] == 512"
expect "GET /v1/models shows no filesystem path" "$models" "'/' not in json.dumps(d)"

r=$(post /v1/completions '{"prompt": "Hello, world", "max_tokens": 8, "temperature": 0, "ignore_eos": true}')
expect "completion: 8 tokens, length" "$r" "d['object'] == 'text_completion' and d['usage']['completion_tokens'] == 8 and d['choices'][0]['finish_reason'] == 'length' and d['usage']['total_tokens'] == d['usage']['prompt_tokens'] + 8"
text1=$(py "$r" "d['choices'][0]['text']")
r2=$(post /v1/completions '{"prompt": "Hello, world", "max_tokens": 8, "temperature": 0, "ignore_eos": true}')
[[ "$(py "$r2" "d['choices'][0]['text']")" == "$text1" ]] && ok "greedy is deterministic" || bad "greedy differs" "$r2"

r=$(post /v1/completions '{"prompt": [1, 2, 3, 4], "max_tokens": 3, "ignore_eos": true, "logprobs": 2}')
expect "token-id prompt with logprobs" "$r" "d['usage']['prompt_tokens'] == 4 and len(d['choices'][0]['logprobs']['tokens']) == 3 and len(d['choices'][0]['logprobs']['token_logprobs']) == 3 and all(lp <= 0 for lp in d['choices'][0]['logprobs']['token_logprobs']) and all(len(t) >= 2 for t in d['choices'][0]['logprobs']['top_logprobs'])"

r=$(post /v1/completions '{"prompt": ["one", "two"], "n": 2, "max_tokens": 4, "temperature": 1.0, "seed": 7, "ignore_eos": true}')
expect "two prompts x n=2 = four choices" "$r" "sorted(c['index'] for c in d['choices']) == [0,1,2,3] and d['usage']['completion_tokens'] == 16"
r2=$(post /v1/completions '{"prompt": ["one", "two"], "n": 2, "max_tokens": 4, "temperature": 1.0, "seed": 7, "ignore_eos": true}')
[[ "$(py "$r" "[c['text'] for c in d['choices']]")" == "$(py "$r2" "[c['text'] for c in d['choices']]")" ]] && ok "seeded sampling repeats" || bad "seeded sampling differs" "$r2"

# Stop strings: cut a greedy output at a piece of itself.
r=$(post /v1/completions '{"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0, "ignore_eos": true}')
# The first 2-character window of printable ASCII in the second half (random weights write
# control characters too, which do not survive shell variables).
stop=$(py "$r" "next((t[i:i+2] for t in [d['choices'][0]['text']] for i in range(len(t)//2, len(t)-1) if t[i:i+2].isprintable() and t[i:i+2].isascii() and t[i:i+2].strip() == t[i:i+2] and t[i:i+2] not in t[:i+1]), '')")
if [[ ${#stop} -eq 2 ]]; then
  body=$(python3 -c 'import json,sys; print(json.dumps({"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stop": [sys.argv[1]]}))' "$stop")
  cut=$(post /v1/completions "$body")
  expect "stop string ends the text before it" "{\"full\": $r, \"cut\": $cut, \"stop\": $(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$stop")}" \
    "d['cut']['choices'][0]['finish_reason'] == 'stop' and d['cut']['choices'][0]['stop_reason'] == d['stop'] and d['full']['choices'][0]['text'].startswith(d['cut']['choices'][0]['text'] + d['stop'])"
else
  echo "note: greedy output too short for the stop-string check"
fi

r=$(post /v1/chat/completions '{"messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 2}')
expect "chat completion" "$r" "d['object'] == 'chat.completion' and d['choices'][0]['message']['role'] == 'assistant' and d['usage']['completion_tokens'] <= 6 and d['choices'][0]['finish_reason'] in ('stop', 'length') and all(len(c['top_logprobs']) == 2 and isinstance(c['bytes'], list) for c in d['choices'][0]['logprobs']['content'])"
# The ChatML template: <|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n
tk=$(post /tokenize '{"messages": [{"role": "user", "content": "What is 2+2?"}]}')
expect "chat prompt tokens = usage.prompt_tokens" "$tk" "d['count'] == $(py "$r" "d['usage']['prompt_tokens']") and d['tokens'][0] == 510 and d['tokens'][-1] == 10"
tk2=$(post /tokenize '{"messages": [{"role": "user", "content": "What is 2+2?"}], "add_special_tokens": false, "return_token_strs": true}')
expect "tokenize messages with /tokenize's own fields" "$tk2" "d['tokens'] == $(py "$tk" "d['tokens']") and len(d['token_strs']) == d['count']"
# Parameters are honoured or refused by name, never silently ignored (vLLM's list walked in
# test_openai_protocol; here over HTTP).
expect_error "an unimplemented vLLM parameter" 400 /v1/completions '{"prompt": "x", "priority": 1}'
expect_error "an unknown parameter" 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "frobnicate": true}'
r=$(post /v1/completions '{"prompt": "x", "max_tokens": 2, "user": "user-1234"}')
expect "OpenAI's user field (no effect) is accepted" "$r" "d['object'] == 'text_completion'"

stream=$(curl -sN -X POST "$BASE/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Hello", "max_tokens": 6, "temperature": 0, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}}')
echo "$stream" > "$TMP/stream"
if [[ $(grep -c '^data: ' "$TMP/stream") -ge 3 && $(grep '^data: ' "$TMP/stream" | tail -1) == "data: [DONE]" ]]; then ok "SSE stream ends with [DONE]"; else bad "SSE stream" "$stream"; fi
usage=$(grep '^data: {' "$TMP/stream" | tail -1 | cut -c7-)
expect "stream usage chunk" "$usage" "d['choices'] == [] and d['usage']['completion_tokens'] == 6"
joined=$(grep '^data: {' "$TMP/stream" | cut -c7- | python3 -c 'import json,sys; print("".join(c["text"] for l in sys.stdin for c in json.loads(l)["choices"]))')
nonstream=$(post /v1/completions '{"prompt": "Hello", "max_tokens": 6, "temperature": 0, "ignore_eos": true}')
[[ "$joined" == "$(py "$nonstream" "d['choices'][0]['text']")" ]] && ok "streamed text = non-streamed text" || bad "streamed '$joined' vs non-streamed" "$nonstream"

# truncate_prompt_tokens (vLLM's): the prompt keeps its last N tokens.
r=$(post /v1/completions '{"prompt": [11, 12, 13, 14, 15, 16, 17, 18, 19, 20], "max_tokens": 2, "temperature": 0, "truncate_prompt_tokens": 4}')
expect "truncate_prompt_tokens keeps the last 4 tokens" "$r" "d['usage']['prompt_tokens'] == 4"
r4=$(post /v1/completions '{"prompt": [17, 18, 19, 20], "max_tokens": 2, "temperature": 0}')
[[ $(py "$r" "d['choices'][0]['text']") == $(py "$r4" "d['choices'][0]['text']") ]] \
  && ok "the truncated prompt answers as its last 4 tokens alone" || bad "truncated vs last 4 tokens" "$r / $r4"
r=$(post /v1/completions '{"prompt": "hello there", "max_tokens": 2, "truncate_prompt_tokens": -1}')
expect "truncate_prompt_tokens -1 (the context) leaves a short prompt whole" "$r" "d['usage']['prompt_tokens'] >= 2"
expect_error "truncate_prompt_tokens 0" 400 /v1/completions '{"prompt": "x", "truncate_prompt_tokens": 0}'

# stream_options.continuous_usage_stats: every chunk carries the usage so far (vLLM's).
cu=$(curl -sN -X POST "$BASE/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Hello", "max_tokens": 5, "temperature": 0, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true}}')
counts=$(grep '^data: {' <<<"$cu" | cut -c7- | python3 -c 'import json,sys; print(" ".join(str(json.loads(l)["usage"]["completion_tokens"]) for l in sys.stdin))')
last=$(awk '{print $NF}' <<<"$counts")
python3 -c 'import sys; c=[int(x) for x in sys.argv[1].split()]; sys.exit(0 if len(c) >= 1 and c == sorted(c) and c[-1] == 5 and c[0] >= 1 else 1)' "$counts" \
  && ok "continuous_usage_stats: usage in every chunk, growing to 5 ($counts)" || bad "continuous usage counts: '$counts' (last $last)" "$cu"

# ... and with n = 2 over two prompts, each chunk its own choice's: that prompt's tokens and that
# choice's completion tokens so far (vLLM's), ending at 3 for every choice.
cu=$(curl -sN -X POST "$BASE/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": ["In the beginning", "And"], "n": 2, "max_tokens": 3, "temperature": 0, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true}}')
pt0=$(py "$(post /tokenize '{"prompt": "In the beginning"}')" "d['count']")
pt1=$(py "$(post /tokenize '{"prompt": "And"}')" "d['count']")
grep '^data: {' <<<"$cu" | cut -c7- | python3 -c '
import json, sys
pt = [int(sys.argv[1])] * 2 + [int(sys.argv[2])] * 2
seen = {}
for line in sys.stdin:
    d = json.loads(line)
    if not d["choices"]:
        continue
    i, u = d["choices"][0]["index"], d["usage"]
    assert u["prompt_tokens"] == pt[i], (i, u)
    assert u["completion_tokens"] >= seen.get(i, 0), (i, u)
    seen[i] = u["completion_tokens"]
assert seen == {0: 3, 1: 3, 2: 3, 3: 3}, seen
' "$pt0" "$pt1" && ok "continuous_usage_stats per choice (n 2 x 2 prompts)" || bad "continuous usage per choice" "$cu"

cs=$(curl -sN -X POST "$BASE/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": true}')
first=$(echo "$cs" | grep '^data: {' | head -1 | cut -c7-)
expect "chat stream opens with the assistant role" "$first" "d['object'] == 'chat.completion.chunk' and d['choices'][0]['delta']['role'] == 'assistant'"
[[ $(echo "$cs" | grep '^data: ' | tail -1) == "data: [DONE]" ]] && ok "chat stream ends with [DONE]" || bad "chat stream end" "$cs"

# spaces_between_special_tokens (vLLM's): accepted on both routes, streamed and not. The
# byte-level decoder never joins tokens with spaces, so both values give the same text (the
# space-joining case is unit-tested in test_tokenizer); the forced special tokens are kept.
SPECIALS='"forced_output_ids": [510, 511, 510], "max_tokens": 3, "ignore_eos": true, "skip_special_tokens": false'
for sbst in true false; do
  r=$(post /v1/completions "{\"prompt\": \"Hi\", $SPECIALS, \"spaces_between_special_tokens\": $sbst}")
  expect "completion spaces_between_special_tokens=$sbst: specials joined without spaces" "$r" \
    "d['choices'][0]['text'] == '<|im_start|><|im_end|><|im_start|>'"
  st=$(curl -sN -X POST "$BASE/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stream\": true, $SPECIALS, \"spaces_between_special_tokens\": $sbst}")
  joined=$(grep '^data: {' <<<"$st" | cut -c7- | python3 -c 'import json,sys; print("".join(c["delta"].get("content") or "" for l in sys.stdin for c in json.loads(l)["choices"]))')
  [[ "$joined" == "<|im_start|><|im_end|><|im_start|>" ]] && ok "streamed chat spaces_between_special_tokens=$sbst" ||
    bad "streamed chat spaces_between_special_tokens=$sbst: '$joined'" "$st"
done
expect_error "spaces_between_special_tokens not a boolean" 400 /v1/completions '{"prompt": "x", "spaces_between_special_tokens": "no"}'

# A per-request chat_template (vLLM's) replaces the model's, on chat and on /tokenize.
TMPL='{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}'
TMPL_JSON=$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$TMPL")
want=$(post /tokenize '{"prompt": "[user]What is 2+2?[assistant]", "add_special_tokens": false}')
tk=$(post /tokenize "{\"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}], \"chat_template\": $TMPL_JSON}")
expect "tokenize with the request's chat_template" "$tk" "d['tokens'] == $(py "$want" "d['tokens']")"
r=$(post /v1/chat/completions "{\"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}], \"max_tokens\": 3, \"temperature\": 0, \"chat_template\": $TMPL_JSON}")
expect "chat with the request's chat_template: its prompt" "$r" "d['object'] == 'chat.completion' and d['usage']['prompt_tokens'] == $(py "$want" "d['count']")"
st=$(curl -sN -X POST "$BASE/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}], \"max_tokens\": 3, \"temperature\": 0, \"stream\": true, \"stream_options\": {\"include_usage\": true}, \"chat_template\": $TMPL_JSON}")
usage=$(grep '^data: {' <<<"$st" | tail -1 | cut -c7-)
expect "streamed chat with the request's chat_template: its prompt" "$usage" "d['usage']['prompt_tokens'] == $(py "$want" "d['count']")"
joined=$(grep '^data: {' <<<"$st" | cut -c7- | python3 -c 'import json,sys; print("".join(c["delta"].get("content") or "" for l in sys.stdin for c in json.loads(l)["choices"]))')
[[ "$joined" == "$(py "$r" "d['choices'][0]['message']['content']")" ]] && ok "streamed = non-streamed with a chat_template" || bad "chat_template stream '$joined'" "$r"
error400 "a chat_template with a syntax error" '{"messages": [{"role": "user", "content": "x"}], "chat_template": "{% if %}"}' chat_template "chat_template"
error400 "a chat_template that fails to render" '{"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ raise_exception(\"no way\") }}"}' chat_template "no way"
error400 "a chat_template that is no string" '{"messages": [{"role": "user", "content": "x"}], "chat_template": 3}' chat_template "string"
status_of /tokenize '{"messages": [{"role": "user", "content": "x"}], "chat_template": "{% for %}"}' >"$TMP/code"
expect "/tokenize with a bad chat_template -> 400 naming it" "{\"code\": $(cat "$TMP/code"), \"body\": $(cat "$TMP/body")}" \
  "d['code'] == 400 and d['body']['error']['param'] == 'chat_template'"
error400 "chat_template_kwargs still may not set messages with a chat_template" \
  "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template\": $TMPL_JSON, \"chat_template_kwargs\": {\"messages\": []}}" chat_template_kwargs "messages"
r=$(post /v1/chat/completions "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 2, \"chat_template\": \"{{ greeting }}{{ messages[0].content }}\", \"chat_template_kwargs\": {\"greeting\": \"Hello \"}}")
want=$(post /tokenize '{"prompt": "Hello x", "add_special_tokens": false}')
expect "chat_template_kwargs reach the request's chat_template" "$r" "d['usage']['prompt_tokens'] == $(py "$want" "d['count']")"

# prompt_logprobs (vLLM's): per choice on completions, once on a chat response; null for the
# first prompt token, then the prompt token and the top k with logprob, rank, decoded_token.
PLP_CHECK="len(L) == d['usage']['prompt_tokens'] and L[0] is None and all(str(t) in e and all(set(v) == {'logprob','rank','decoded_token'} and v['logprob'] <= 0 and v['rank'] >= 1 and isinstance(v['decoded_token'], str) for v in e.values()) and 2 <= len(e) <= 3 and sorted(v['rank'] for k, v in e.items() if k != str(t))[:2] in ([1, 2], [1], [2]) for t, e in zip(P[1:], L[1:]))"
r=$(post /v1/completions '{"prompt": [11, 12, 13, 14, 15, 16], "max_tokens": 2, "temperature": 0, "prompt_logprobs": 2}')
expect "completion prompt_logprobs: one entry per prompt token" "$r" \
  "(lambda L, P: $PLP_CHECK)(d['choices'][0]['prompt_logprobs'], [11, 12, 13, 14, 15, 16])"
# The prompt token's logprob at position 5 = the logprob of the same token forced as the first
# generated one after the first 5 (prefill rows vs a decode step).
f=$(post /v1/completions '{"prompt": [11, 12, 13, 14, 15], "max_tokens": 1, "forced_output_ids": [16], "logprobs": 0}')
expect "prompt logprob = forced token's logprob" "{\"p\": $r, \"f\": $f}" \
  "abs(d['p']['choices'][0]['prompt_logprobs'][5]['16']['logprob'] - d['f']['choices'][0]['logprobs']['token_logprobs'][0]) < 1e-3"
r0=$(post /v1/completions '{"prompt": [11, 12, 13, 14, 15, 16], "max_tokens": 2, "temperature": 0}')
[[ $(py "$r" "d['choices'][0]['text']") == $(py "$r0" "d['choices'][0]['text']") ]] && ok "prompt_logprobs leave the completion as it was" || bad "completion changed" "$r / $r0"
r=$(post /v1/completions '{"prompt": ["one two three", "four"], "n": 2, "max_tokens": 2, "prompt_logprobs": 0}')
expect "prompt_logprobs 0 on every choice of two prompts: the prompt token alone" "$r" \
  "len(d['choices']) == 4 and all(c['prompt_logprobs'][0] is None and all(len(e) == 1 for e in c['prompt_logprobs'][1:]) for c in d['choices']) and len(d['choices'][0]['prompt_logprobs']) != len(d['choices'][3]['prompt_logprobs'])"
r=$(post /v1/chat/completions '{"messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 3, "prompt_logprobs": 1}')
expect "chat prompt_logprobs: on the response, one entry per prompt token" "$r" \
  "len(d['prompt_logprobs']) == d['usage']['prompt_tokens'] and d['prompt_logprobs'][0] is None and all(1 <= len(e) <= 2 for e in d['prompt_logprobs'][1:]) and 'prompt_logprobs' not in d['choices'][0]"
tkc=$(post /tokenize '{"messages": [{"role": "user", "content": "What is 2+2?"}]}')
expect "chat prompt_logprobs name the prompt's tokens" "{\"r\": $r, \"t\": $tkc}" \
  "all(str(t) in e for t, e in zip(d['t']['tokens'][1:], d['r']['prompt_logprobs'][1:]))"
for route in completions chat/completions; do
  body='{"prompt": "x", "stream": true, "prompt_logprobs": 1}'
  [[ $route == chat/completions ]] && body='{"messages": [{"role": "user", "content": "x"}], "stream": true, "prompt_logprobs": 1}'
  status_of /v1/$route "$body" >"$TMP/code"
  expect "$route: prompt_logprobs with stream -> 400 naming it (as vLLM)" "{\"code\": $(cat "$TMP/code"), \"body\": $(cat "$TMP/body")}" \
    "d['code'] == 400 and d['body']['error']['param'] == 'prompt_logprobs'"
done
# echo with logprobs (vLLM's): the prompt's tokens lead the choice's logprobs, the first with
# null; streamed, in the first chunk.
r=$(post /v1/completions '{"prompt": [11, 12, 13, 14], "max_tokens": 3, "temperature": 0, "ignore_eos": true, "echo": true, "logprobs": 1}')
expect "echo + logprobs: prompt tokens then generated ones" "$r" \
  "(lambda lp: len(lp['tokens']) == 7 and lp['token_logprobs'][0] is None and lp['top_logprobs'][0] is None and all(x <= 0 for x in lp['token_logprobs'][1:]) and lp['text_offset'][0] == 0 and lp['text_offset'] == sorted(lp['text_offset']) and all(1 <= len(t) <= 2 for t in lp['top_logprobs'][1:]))(d['choices'][0]['logprobs'])"
p=$(post /v1/completions '{"prompt": [11, 12, 13, 14], "max_tokens": 3, "temperature": 0, "prompt_logprobs": 1}')
expect "echo + logprobs: the prompt part = prompt_logprobs" "{\"r\": $r, \"p\": $p}" \
  "all(abs(d['r']['choices'][0]['logprobs']['token_logprobs'][i] - d['p']['choices'][0]['prompt_logprobs'][i][str(t)]['logprob']) < 1e-6 for i, t in [(1, 12), (2, 13), (3, 14)])"
st=$(curl -sN -X POST "$BASE/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": [11, 12, 13, 14], "max_tokens": 3, "temperature": 0, "ignore_eos": true, "echo": true, "logprobs": 1, "stream": true}')
lps=$(grep '^data: {' <<<"$st" | cut -c7- | python3 -c 'import json,sys; print(json.dumps([x for l in sys.stdin for c in json.loads(l)["choices"] if c["logprobs"] for x in c["logprobs"]["token_logprobs"]]))')
expect "streamed echo + logprobs = non-streamed" "{\"s\": $lps, \"r\": $r}" \
  "d['s'][0] is None and len(d['s']) == 7 and all(abs(a - b) < 1e-6 for a, b in zip(d['s'][1:], d['r']['choices'][0]['logprobs']['token_logprobs'][1:]))"
expect_error "prompt_logprobs -1 (the whole vocabulary)" 400 /v1/completions '{"prompt": "x", "prompt_logprobs": -1}'
expect_error "prompt_logprobs above the limit" 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 21}'

tk=$(post /tokenize '{"prompt": "Hello world"}')
expect "tokenize" "$tk" "d['count'] == len(d['tokens']) > 0 and d['max_model_len'] == 4096"
ids=$(py "$tk" "json.dumps(d['tokens'])")
expect "detokenize round trip" "$(post /detokenize "{\"tokens\": $ids}")" "d['prompt'] == 'Hello world'"

metrics=$(curl -s "$BASE/metrics")
for name in 'oasis:num_requests_running{' 'oasis:num_requests_waiting{' 'oasis:kv_cache_usage_perc{' \
  'oasis:prompt_tokens_total{' 'oasis:generation_tokens_total{' 'oasis:request_success_total{model_name="oasis-embedded",finished_reason="length"}' \
  'oasis:time_to_first_token_seconds_bucket{' 'oasis:inter_token_latency_seconds_count{' 'oasis:e2e_request_latency_seconds_sum{' \
  'oasis:http_requests_total{method="POST",handler="/v1/completions",status="200"}'; do
  grep -qF "$name" <<<"$metrics" && ok "metric $name" || bad "metric $name missing" "$metrics"
done
# vLLM's per-request histograms, and le labels as written (0.005, not 0.0050000000000000001).
for name in 'oasis:request_queue_time_seconds_count{' 'oasis:request_prefill_time_seconds_sum{' \
  'oasis:request_decode_time_seconds_bucket{' 'oasis:request_inference_time_seconds_count{' \
  'oasis:request_prompt_tokens_bucket{model_name="oasis-embedded",le="2"}' \
  'oasis:request_generation_tokens_count{' 'oasis:time_to_first_token_seconds_bucket{model_name="oasis-embedded",le="0.005"}'; do
  grep -qF "$name" <<<"$metrics" && ok "metric $name" || bad "metric $name missing" "$metrics"
done
grep -qE 'le="[0-9.]*0000000' <<<"$metrics" && bad "a le label with float noise" "$(grep -E 'le="[0-9.]*0000000' <<<"$metrics" | head -3)" ||
  ok "le labels are the bounds as written"
# The Grafana dashboard in docs/ names only metrics this server exposes.
printf '%s\n' "$metrics" >"$TMP/metrics.txt"
out=$(python3 "$ROOT/tools/check_dashboard_metrics.py" "$ROOT/docs/grafana/oasiskv.json" "$TMP/metrics.txt") &&
  ok "docs/grafana/oasiskv.json: $out" || bad "docs/grafana/oasiskv.json" "$out"

# ---- bad input: the right 4xx, OpenAI error JSON, server stays up ------------------
expect_error "malformed JSON" 400 /v1/completions '{"prompt": "x",'
expect_error "body not an object" 400 /v1/completions '[1,2]'
expect_error "prompt of the wrong type" 400 /v1/completions '{"prompt": 5}'
expect_error "max_tokens of the wrong type" 400 /v1/completions '{"prompt": "x", "max_tokens": "ten"}'
expect_error "unknown model" 404 /v1/completions '{"model": "gpt-17", "prompt": "x"}'
expect_error "unknown model (chat)" 404 /v1/chat/completions '{"model": "gpt-17", "messages": [{"role": "user", "content": "x"}]}'
expect_error "negative max_tokens" 400 /v1/completions '{"prompt": "x", "max_tokens": -3}'
expect_error "huge max_tokens" 400 /v1/completions '{"prompt": "x", "max_tokens": 1000000000000}'
expect_error "max_tokens beyond int64" 400 /v1/completions '{"prompt": "x", "max_tokens": 99999999999999999999999}'
expect_error "temperature < 0" 400 /v1/completions '{"prompt": "x", "temperature": -0.5}'
expect_error "top_p = 0" 400 /v1/completions '{"prompt": "x", "top_p": 0}'
expect_error "top_p > 1" 400 /v1/completions '{"prompt": "x", "top_p": 1.01}'
expect_error "n = 0" 400 /v1/completions '{"prompt": "x", "n": 0}'
expect_error "token id outside the vocabulary" 400 /v1/completions '{"prompt": [1, 600], "max_tokens": 2}'
long=$(python3 -c 'print(list(range(1, 256)) * 20)')
expect_error "prompt longer than the context" 400 /v1/completions "{\"prompt\": $long}"
expect_error "prompt + max_tokens beyond the context" 400 /v1/completions '{"prompt": [1,2,3], "max_tokens": 4094}'
expect_error "chat without messages" 400 /v1/chat/completions '{"model": "oasis-embedded"}'
expect_error "chat message content of the wrong type" 400 /v1/chat/completions '{"messages": [{"role": "user", "content": 3}]}'
expect_error "unknown route" 404 /v1/nothing-here '{}'
# chat_template_kwargs may not replace a variable the server sets (here: a system turn that
# would bypass the messages' validation); the error names the key; other kwargs still work.
status_of /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "chat_template_kwargs": {"messages": [{"role": "system", "content": "obey"}]}}' >"$TMP/code"
expect "chat_template_kwargs setting 'messages' -> 400 naming it" "{\"code\": $(cat "$TMP/code"), \"body\": $(cat "$TMP/body")}" \
  "d['code'] == 400 and d['body']['error']['param'] == 'chat_template_kwargs' and \"'messages'\" in d['body']['error']['message']"
expect_error "chat_template_kwargs setting add_generation_prompt" 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"add_generation_prompt": false}}'
expect "chat with another chat_template_kwargs key still answers" \
  "$(post /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": false}}')" \
  "d['object'] == 'chat.completion' and d['usage']['completion_tokens'] >= 1"
expect_error "detokenize with a bad id" 400 /detokenize '{"tokens": [1, -5]}'
expect_error "detokenize: 2^32 + 5 does not wrap onto token 5" 400 /detokenize '{"tokens": [4294967301]}'
expect_error "detokenize: 2^64 - 1" 400 /detokenize '{"tokens": [18446744073709551615]}'
expect_error "detokenize: an unknown field" 400 /detokenize '{"tokens": [1], "skip_special_tokens": true}'
expect_error "tokenize: an unknown field" 400 /tokenize '{"prompt": "x", "foo": 1}'
expect_error "tokenize: a chat-only field with a prompt" 400 /tokenize '{"prompt": "x", "add_generation_prompt": false}'
expect_error "chat: a bad max_tokens beside max_completion_tokens" 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 2, "max_tokens": "abc"}'
expect_error "stop_token_ids outside the vocabulary" 400 /v1/completions '{"prompt": "x", "max_tokens": 2, "stop_token_ids": [99999]}'
# continue_final_message (HF's, as vLLM): the prompt ends right after the final message, also when
# the template trims it; a template that changes it is a 400 naming continue_final_message.
TRIM_JSON=$(python3 -c 'import json; print(json.dumps("{% for m in messages %}<|im_start|>{{m.role}}\n{{m.content|trim}}<|im_end|>\n{% endfor %}"))')
STORY='[{"role": "user", "content": "Tell a story"}, {"role": "assistant", "content": "Once upon a time "}]'
tk=$(post /tokenize "{\"messages\": $STORY, \"continue_final_message\": true, \"add_generation_prompt\": false, \"chat_template\": $TRIM_JSON}")
want=$(post /tokenize '{"prompt": "<|im_start|>user\nTell a story<|im_end|>\n<|im_start|>assistant\nOnce upon a time", "add_special_tokens": false}')
expect "continue_final_message with a trimming template: the prompt ends with the final message" "$tk" "d['tokens'] == $(py "$want" "d['tokens']")"
r=$(post /v1/chat/completions "{\"messages\": $STORY, \"continue_final_message\": true, \"add_generation_prompt\": false, \"chat_template\": $TRIM_JSON, \"max_tokens\": 1}")
expect "... and the chat route generates from that prompt" "$r" "d['usage']['prompt_tokens'] == $(py "$want" "d['count']")"
error400 "continue_final_message with a template that changes the final message" \
  "{\"messages\": $STORY, \"continue_final_message\": true, \"add_generation_prompt\": false, \"chat_template\": \"{% for m in messages %}{{ m.content | upper }}{% endfor %}\"}" \
  continue_final_message "does not appear in the rendered chat"
# Values that overflow (or underflow) the float the engine samples with are refused naming the
# field and the value sent, not as the engine's "param": "prompt" with "got inf".
error400 "temperature 1e39 (inf as a float)" '{"messages": [{"role": "user", "content": "Hi"}], "temperature": 1e39}' temperature "got 1e+39"
error400 "top_p 1e-46 (0 as a float)" '{"messages": [{"role": "user", "content": "Hi"}], "top_p": 1e-46}' top_p "got 1e-46"
error400 "repetition_penalty 1e-46 (0 as a float)" '{"messages": [{"role": "user", "content": "Hi"}], "repetition_penalty": 1e-46}' repetition_penalty "got 1e-46"
error400 "forced_output_ids outside the vocabulary" '{"messages": [{"role": "user", "content": "Hi"}], "forced_output_ids": [1, 99999]}' forced_output_ids "vocabulary"
# Numbers in messages are short (1e+300, not 300 digits).
status_of /v1/completions '{"prompt": "x", "logit_bias": {"1": 1e300}}' >"$TMP/code"
expect "logit_bias 1e300: a short message naming 1e+300" "{\"code\": $(cat "$TMP/code"), \"body\": $(cat "$TMP/body")}" \
  "d['code'] == 400 and d['body']['error']['message'] == \"'logit_bias' values must be in [-100, 100], got 1e+300 for token 1\""
status_of /v1/completions '{"prompt": "x", "presence_penalty": 1e308}' >"$TMP/code"
expect "presence_penalty 1e308: a short message" "{\"code\": $(cat "$TMP/code"), \"body\": $(cat "$TMP/body")}" \
  "d['code'] == 400 and d['body']['error']['message'].endswith('got 1e+308') and len(d['body']['error']['message']) < 80"
# min_tokens without max_tokens is held against the room the prompt leaves (vLLM's default
# max_tokens), on chat and on completions' explicit max_tokens alike.
error400 "chat min_tokens beyond the room left in the context" '{"messages": [{"role": "user", "content": "Hi"}], "min_tokens": 100000}' min_tokens "must be <= max_tokens"
expect_error "completions min_tokens above max_tokens" 400 /v1/completions '{"prompt": "x", "min_tokens": 20, "max_tokens": 10}'
# The context check names the field that was sent.
error400 "max_completion_tokens + prompt beyond the context" '{"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 4095}' max_completion_tokens "max_completion_tokens"
error400 "max_tokens + prompt beyond the context" '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4095}' max_tokens "max_tokens"
# /tokenize: a null field is an absent one.
tk=$(post /tokenize '{"messages": null, "prompt": "Hello world"}')
expect "tokenize: messages null with a prompt tokenizes the prompt" "$tk" "d['tokens'] == $(py "$(post /tokenize '{"prompt": "Hello world"}')" "d['tokens']")"
expect "tokenize: prompt null with messages tokenizes the messages" \
  "$(post /tokenize '{"messages": [{"role": "user", "content": "What is 2+2?"}], "prompt": null}')" "d['count'] > 5"
expect_error "tokenize: neither prompt nor messages" 400 /tokenize '{"messages": null, "prompt": null}'
# Token ids: exact integers, also written as floats (pydantic's lax mode, as vLLM), alike on
# /detokenize and the generation routes; fractions are 400s on both.
ids=$(py "$(post /tokenize '{"prompt": "Hello world", "add_special_tokens": false}')" "json.dumps(d['tokens'])")
fids=$(py "$ids" "json.dumps([float(t) for t in d])")
expect "detokenize takes ids written as floats ($fids)" "$(post /detokenize "{\"tokens\": $fids}")" "d['prompt'] == 'Hello world'"
expect_error "detokenize: a fractional id" 400 /detokenize '{"tokens": [1.5]}'
r=$(post /v1/completions "{\"prompt\": $fids, \"max_tokens\": 1, \"echo\": true}")
expect "completions take prompt ids written as floats" "$r" "d['choices'][0]['text'].startswith('Hello world') and d['usage']['prompt_tokens'] == len($ids)"
expect_error "completions: a fractional prompt id" 400 /v1/completions '{"prompt": [1, 2.5], "max_tokens": 1}'
status_of /v1/completions '{"prompt": [1, 2.5], "max_tokens": 1}' >"$TMP/code"
expect "... the message shows the value" "$(cat "$TMP/body")" "d['error']['param'] == 'prompt' and d['error']['message'].endswith('got 2.5')"
# add_special_tokens (vLLM's) is honoured on completions and chat; this tokenizer adds no
# special tokens, so the prompt is the same (a BOS tokenizer's is checked below).
r=$(post /v1/completions '{"prompt": "Hello world", "max_tokens": 1, "add_special_tokens": false}')
expect "completions: add_special_tokens false is accepted" "$r" "d['usage']['prompt_tokens'] == len($ids)"
expect_error "completions: add_special_tokens not a boolean" 400 /v1/completions '{"prompt": "x", "add_special_tokens": "no"}'
# ---- tools on a server without --tool-call-parser (vLLM's answers) ----------------------
TOOLS='[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]'
ASK='{"role": "user", "content": "Weather in Paris?"}'
error400 "tool_choice auto without --enable-auto-tool-choice" "{\"messages\": [$ASK], \"tools\": $TOOLS, \"tool_choice\": \"auto\"}" \
  tool_choice "requires --enable-auto-tool-choice and --tool-call-parser"
# Forced calls need no flags (constrained decoding, as vLLM): the answer is a call or, cut by
# max_tokens, its text so far.
forced=$(curl -s "$BASE/v1/chat/completions" -H 'Content-Type: application/json' -d "{\"messages\": [$ASK], \"tools\": $TOOLS, \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}, \"max_tokens\": 60}")
expect "tool_choice naming a function: the answer is its forced call (or the call's text so far)" "$forced" \
  "(d['choices'][0]['finish_reason'] == 'length' and d['choices'][0]['message']['content'].startswith('{\"name\": \"get_weather\", \"parameters\": ')) or (d['choices'][0]['finish_reason'] == 'tool_calls' and d['choices'][0]['message']['tool_calls'][0]['function']['name'] == 'get_weather')"
error400 "tool_choice naming a function not among the tools" "{\"messages\": [$ASK], \"tools\": $TOOLS, \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"nope\"}}}" \
  tool_choice "not among"
error400 "tool_choice without tools" "{\"messages\": [$ASK], \"tool_choice\": \"auto\"}" tool_choice "needs"
error400 "parallel_tool_calls not a boolean" "{\"messages\": [$ASK], \"tools\": $TOOLS, \"parallel_tool_calls\": 1}" parallel_tool_calls "boolean"
error400 "a tool call's arguments that are no JSON" "{\"messages\": [$ASK, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": \"{city: Paris\"}}]}]}" \
  "messages[1].tool_calls[0].function.arguments" "JSON"
expect "tools without tool_choice (no parser): rendered, the answer is text" \
  "$(post /v1/chat/completions "{\"messages\": [$ASK], \"tools\": $TOOLS, \"max_tokens\": 3}")" \
  "d['object'] == 'chat.completion' and isinstance(d['choices'][0]['message']['content'], str) and 'tool_calls' not in d['choices'][0]['message']"
expect "tool_choice none (no parser) answers" \
  "$(post /v1/chat/completions "{\"messages\": [$ASK], \"tools\": $TOOLS, \"tool_choice\": \"none\", \"max_tokens\": 3}")" \
  "d['object'] == 'chat.completion'"
expect "history: assistant content null + tool_calls, then a tool message -> 200" \
  "$(post /v1/chat/completions "{\"messages\": [$ASK, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"18 C\"}], \"tools\": $TOOLS, \"max_tokens\": 3}")" \
  "d['object'] == 'chat.completion' and d['usage']['completion_tokens'] >= 1"
# Deep nesting is refused before anything recursive sees it (a 60,000-deep array once crashed
# the server); fields of the wrong type are 400s, never 500s.
deep() {  # deep <n> <before> <after> <file>: writes before + n '[' + n ']' + after, prints @file
  python3 -c "import sys; n=int(sys.argv[1]); open(sys.argv[4], 'w').write(sys.argv[2] + '[' * n + ']' * n + sys.argv[3])" "$@"
  echo "@$4"
}
expect_error "detokenize: tokens nested 60,000 deep" 400 /detokenize "$(deep 60000 '{"tokens":' '}' "$TMP/deep1")"
expect_error "chat: tools nested 100,000 deep" 400 /v1/chat/completions \
  "$(deep 100000 '{"messages": [{"role": "user", "content": "x"}], "tools":' '}' "$TMP/deep2")"
expect_error "chat: content nested 100,000 deep" 400 /v1/chat/completions \
  "$(deep 100000 '{"messages": [{"role": "user", "content":' '}]}' "$TMP/deep3")"
expect_error "completions: prompt nested 257 deep" 400 /v1/completions "$(deep 256 '{"prompt":' '}' "$TMP/deep4")"
grep -q "deeper than 256" "$TMP/body" && ok "... named as too deep" || bad "257 deep: message" "$(cat "$TMP/body")"
expect_error "completions: prompt nested 256 deep is only a bad prompt" 400 /v1/completions "$(deep 255 '{"prompt":' '}' "$TMP/deep5")"
grep -q "deeper than" "$TMP/body" && bad "256 deep refused as too deep" "$(cat "$TMP/body")" || ok "... and not refused as too deep"
expect_error "tokenize: model a number" 400 /tokenize '{"model": 1, "prompt": "hi"}'
expect_error "tokenize: return_token_strs a string" 400 /tokenize '{"prompt": "hi", "return_token_strs": "yes"}'
expect_error "detokenize: model a list" 400 /detokenize '{"model": ["m"], "tokens": [1]}'
expect "tokenize: null model and return_token_strs are absent ones" \
  "$(post /tokenize '{"model": null, "prompt": "hi", "return_token_strs": null}')" "d['count'] > 0 and d['token_strs'] is None"
code=$(curl -s -o "$TMP/body" -w '%{http_code}' "$BASE/no/such/page")
[[ $code == 404 && $(py "$(cat "$TMP/body")" "d['error']['type']") == not_found_error ]] && ok "GET unknown route -> 404 JSON" || bad "GET unknown route: $code" "$(cat "$TMP/body")"
[[ $(curl -s -o /dev/null -w '%{http_code}' "$BASE/health") == 200 ]] && ok "server still healthy after bad input" || bad "server died"
grep -q 'oasis:http_requests_total{method="POST",handler="/v1/completions",status="400"}' <<<"$(curl -s "$BASE/metrics")" \
  && ok "400s are counted" || bad "400s not counted"
stop_server || fail=1

# ---- API key and body limit ---------------------------------------------------------
start_server "$TMP/auth.log" --backend cpu --api-key s3cret --max-body-bytes 4096 || exit 1
code=$(curl -s -o "$TMP/body" -w '%{http_code}' "$BASE/v1/models")
[[ $code == 401 && $(py "$(cat "$TMP/body")" "d['error']['type']") == authentication_error ]] && ok "no key -> 401 JSON" || bad "no key: $code" "$(cat "$TMP/body")"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer wrong' "$BASE/v1/models")
[[ $code == 401 ]] && ok "wrong key -> 401" || bad "wrong key: $code"
expect_error "completion without key" 401 /v1/completions '{"prompt": "x"}'
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer s3cret' "$BASE/v1/models")
[[ $code == 200 ]] && ok "right key -> 200" || bad "right key: $code"
[[ $(curl -s -o /dev/null -w '%{http_code}' "$BASE/health") == 200 ]] && ok "/health needs no key" || bad "/health with key"
big=$(python3 -c 'import json; print(json.dumps({"prompt": "x" * 10000}))')
expect_error "body over --max-body-bytes" 413 /v1/completions "$big" -H 'Authorization: Bearer s3cret'
r=$(curl -s -X POST "$BASE/v1/completions" -H 'Authorization: Bearer s3cret' -H 'Content-Type: application/json' -d '{"prompt": "hi", "max_tokens": 2}')
expect "with the key, completions work" "$r" "len(d['choices']) == 1"
stop_server || fail=1

# ---- a full queue: 429 -------------------------------------------------------------
# (Its --chat-template, the model's template here, recurses without end: a chat request gets 400,
# not a retryable 429.)
echo '{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}' >"$TMP/recursive.jinja"
start_server "$TMP/queue.log" --backend cpu --max-num-seqs 1 --max-waiting 1 --chat-template "$TMP/recursive.jinja" || exit 1
expect_error "the model's template recursing past its bound" 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}'
# More sequences (prompts x n) than the queue ever holds: a 400 saying so, not a 429 that a
# client (the openai SDK) would retry forever.
status_of /v1/completions '{"prompt": ["a", "b"], "max_tokens": 1}' -D "$TMP/h" >"$TMP/code"
expect "prompts x n beyond --max-waiting -> 400, never queued" "{\"code\": $(cat "$TMP/code"), \"body\": $(cat "$TMP/body")}" \
  "d['code'] == 400 and d['body']['error']['type'] == 'invalid_request_error' and d['body']['error']['param'] is None and 'can never be queued' in d['body']['error']['message']"
grep -qi '^Retry-After' "$TMP/h" && bad "a 400 with Retry-After" "$(cat "$TMP/h")" || ok "... without Retry-After"

long='{"prompt": "x", "max_tokens": 4000, "temperature": 0, "ignore_eos": true}'
curl -s -o /dev/null -X POST "$BASE/v1/completions" -d "$long" &
c1=$!
sleep 0.2
curl -s -o /dev/null -X POST "$BASE/v1/completions" -d "$long" &
c2=$!
sleep 0.3
expect_error "a request beyond --max-waiting" 429 /v1/completions "$long" -D "$TMP/h"
grep -qi '^Retry-After: 1' "$TMP/h" && ok "... with Retry-After: 1" || bad "429 without Retry-After" "$(cat "$TMP/h")"
kill $c1 $c2 2>/dev/null
wait $c1 $c2 2>/dev/null
stop_server || fail=1

# ---- a KV pool smaller than a request: 400 (it can never run), not 429 -----------------
# (A server that refuses such a pool at start, as too small for the context, never meets one.)
if "$SERVER" --backend cpu --num-kv-slots 2 --check-config >/dev/null 2>&1; then
start_server "$TMP/pool.log" --backend cpu --num-kv-slots 2 || exit 1
status_of /v1/completions '{"prompt": "hello", "max_tokens": 40}' -D "$TMP/h" >"$TMP/code"
expect "a request needing more KV than the whole pool -> 400 saying why" "{\"code\": $(cat "$TMP/code"), \"body\": $(cat "$TMP/body")}" \
  "d['code'] == 400 and d['body']['error']['type'] == 'invalid_request_error' and 'whole pool' in d['body']['error']['message'] and 'never run' in d['body']['error']['message']"
expect "a request within the pool still answers" "$(post /v1/completions '{"prompt": "hello", "max_tokens": 4}')" "d['usage']['completion_tokens'] >= 1"
stop_server || fail=1
else
  echo "note: --num-kv-slots 2 is refused at start here (smaller than the context): no request meets the pool bound"
fi

# ---- add_special_tokens with a tokenizer that adds a BOS (Llama 3's, from the test-data cache) --
CACHE=${OASIS_TEST_CACHE:-$ROOT/.cache/test-data}
if [[ -f $CACHE/llama3_1/tokenizer.json ]]; then
  mkdir -p "$TMP/llama"
  cp "$CACHE/llama3_1/tokenizer.json" "$CACHE/llama3_1/tokenizer_config.json" "$TMP/llama/"
  cat >"$TMP/llama/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
 "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 128256,
 "max_position_embeddings": 512, "rope_theta": 500000, "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
 "bos_token_id": 128000, "eos_token_id": 128009, "torch_dtype": "bfloat16"}
JSON
  start_server "$TMP/llama.log" --backend cpu --model "$TMP/llama" --load-format dummy || exit 1
  # "Hello world" is two tokens; the BOS makes three.
  expect "tokenize: the BOS by default" "$(post /tokenize '{"prompt": "Hello world"}')" "d['tokens'][0] == 128000 and d['count'] == 3"
  expect "completions add the BOS by default (as vLLM)" "$(post /v1/completions '{"prompt": "Hello world", "max_tokens": 1}')" \
    "d['usage']['prompt_tokens'] == 3"
  expect "completions with add_special_tokens false: no BOS" \
    "$(post /v1/completions '{"prompt": "Hello world", "max_tokens": 1, "add_special_tokens": false}')" "d['usage']['prompt_tokens'] == 2"
  expect "... the same prompt as /tokenize's add_special_tokens false" \
    "$(post /tokenize '{"prompt": "Hello world", "add_special_tokens": false}')" "d['tokens'][0] != 128000 and d['count'] == 2"
  chat=$(post /v1/chat/completions '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}')
  tkc=$(post /tokenize '{"messages": [{"role": "user", "content": "Hi"}]}')
  expect "chat: the template's BOS only (add_special_tokens false by default, as vLLM)" "{\"c\": $chat, \"t\": $tkc}" \
    "d['c']['usage']['prompt_tokens'] == d['t']['count'] and d['t']['tokens'][0] == 128000 and d['t']['tokens'][1] != 128000"
  chat=$(post /v1/chat/completions '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "add_special_tokens": true}')
  tkc2=$(post /tokenize '{"messages": [{"role": "user", "content": "Hi"}], "add_special_tokens": true}')
  expect "chat with add_special_tokens true: the tokenizer's BOS on top (chat and /tokenize alike)" "{\"c\": $chat, \"t\": $tkc, \"t2\": $tkc2}" \
    "d['c']['usage']['prompt_tokens'] == d['t']['count'] + 1 == d['t2']['count'] and d['t2']['tokens'][:2] == [128000, 128000]"
  stop_server || fail=1
else
  echo "note: no $CACHE/llama3_1 (tools/fetch_test_data.sh): the BOS checks of add_special_tokens are skipped"
fi

# ---- 503 while loading (dummy weights for a larger model take a moment on the CPU) -----
mkdir -p "$TMP/big"
cat > "$TMP/big/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 6,
 "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 32000,
 "max_position_embeddings": 2048, "rope_theta": 1000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
 "eos_token_id": 2, "torch_dtype": "bfloat16"}
JSON
"$SERVER" --port 0 --model "$TMP/big" --load-format dummy --backend cpu --log-level warn >"$TMP/big.log" 2>&1 &
SERVER_PID=$!
PORT=""
for _ in $(seq 1 300); do
  PORT=$(sed -n 's|^oasis-server: listening on http://[^:]*:\([0-9]*\)$|\1|p' "$TMP/big.log" | head -1)
  [[ -n $PORT ]] && break
  sleep 0.02
done
BASE="http://127.0.0.1:$PORT"
code=$(curl -s -o "$TMP/body" -w '%{http_code}' "$BASE/health")
if [[ $code == 503 && $(py "$(cat "$TMP/body")" "d['error']['type']") == service_unavailable_error ]]; then
  ok "/health is 503 while loading"
  expect_error "completions while loading" 503 /v1/completions '{"prompt": [1], "max_tokens": 1}'
elif grep -q "ready" "$TMP/big.log"; then
  echo "note: the model loaded before the first /health probe; 503 not observed"
else
  bad "/health while loading: $code" "$(cat "$TMP/body")"
fi
for _ in $(seq 1 1200); do
  [[ $(curl -s -o /dev/null -w '%{http_code}' "$BASE/health") == 200 ]] && break
  sleep 0.1
done
[[ $(curl -s -o /dev/null -w '%{http_code}' "$BASE/health") == 200 ]] && ok "/health is 200 once loaded" || bad "never became healthy" "$(cat "$TMP/big.log")"
# Served by its path: the name is the directory's, no field of /v1/models shows the path, and
# requests naming the path (as vLLM clients do) or the name both reach the model.
expect "a model given by path is listed by its directory's name, without the path" "$(curl -s "$BASE/v1/models")" \
  "d['data'][0]['id'] == 'big' and '$TMP' not in json.dumps(d)"
expect "a request naming the model's path is served (as 'big')" \
  "$(post /v1/completions "{\"model\": \"$TMP/big\", \"prompt\": [1, 2], \"max_tokens\": 1}")" "d['model'] == 'big' and len(d['choices']) == 1"
expect "a request naming 'big' is served" "$(post /v1/completions '{"model": "big", "prompt": [1, 2], "max_tokens": 1}')" "d['model'] == 'big'"
expect_error "another path is another model" 404 /v1/completions "{\"model\": \"$TMP/other/big\", \"prompt\": [1]}"
stop_server || fail=1

# ---- every example config loads (models absent here are replaced by the embedded one) -----
for cfg in "$ROOT"/configs/*.json; do
  model=$(py "$(cat "$cfg")" "d.get('model', '')")
  extra=()
  # (and a sparse config's host KV store shrunk to fit this machine's RAM)
  if [[ -n $model && ! -e $model ]]; then extra=(--model "$ROOT/tests/fixtures/tiny-default" --backend cpu --max-model-len 0 --host-kv-gib 0.01); fi
  # (and a sparse threshold below the fixture's context of 4096 tokens: one at or past the
  # context is refused with --sparse on)
  threshold=$(py "$(cat "$cfg")" "d.get('sparse_threshold', d.get('sparse-threshold', 0))")
  if [[ ${#extra[@]} -gt 0 && $threshold -ge 4096 ]]; then extra+=(--sparse-threshold 1024); fi
  out=$("$SERVER" --config "$cfg" --check-config "${extra[@]}" 2>&1)
  if grep -q "^config ok$" <<<"$out"; then ok "config $(basename "$cfg") ${extra:+(model replaced)}"; else bad "config $cfg" "$out"; fi
done
out=$("$SERVER" --config "$ROOT/configs/embedded-cpu.json" --max-num-seqs 0 2>&1)
[[ $? == 2 ]] && grep -q "max-num-seqs" <<<"$out" && ok "bad setting -> exit 2 naming it" || bad "bad setting accepted" "$out"
# --max-num-batched-tokens: auto (0, the default) is 2048 on the CPU; given values are kept.
for given in "" 0 4096; do
  out=$("$SERVER" --backend cpu --check-config ${given:+--max-num-batched-tokens $given} 2>/dev/null)
  want=${given:-0}; want=${want/#0/2048}
  got=$(python3 -c 'import json,sys; t=sys.stdin.read(); print(json.loads(t[:t.rindex("}") + 1])["resolved"]["max_num_batched_tokens"])' <<<"$out" 2>&1)
  [[ $got == "$want" ]] && ok "--max-num-batched-tokens '${given:-default}' resolves to $got" || bad "--max-num-batched-tokens '${given}' resolved to '$got', not $want" "$out"
done
# --enforce-eager: off by default, on when given (the CPU backend has no graphs: accepted as is).
for given in "" --enforce-eager --no-enforce-eager; do
  out=$("$SERVER" --backend cpu --check-config $given 2>/dev/null)
  want=False; [[ $given == --enforce-eager ]] && want=True
  got=$(python3 -c 'import json,sys; t=sys.stdin.read(); print(json.loads(t[:t.rindex("}") + 1])["resolved"]["enforce_eager"])' <<<"$out" 2>&1)
  [[ $got == "$want" ]] && ok "'${given:-no flag}': enforce_eager $got" || bad "'${given}': enforce_eager '$got', not $want" "$out"
done
out=$("$SERVER" --backend cpu --enforce-eager=maybe --check-config 2>&1)
[[ $? == 2 ]] && grep -q "enforce-eager" <<<"$out" && ok "--enforce-eager=maybe -> exit 2 naming it" || bad "--enforce-eager=maybe accepted" "$out"
out=$("$SERVER" --config "$ROOT/configs/embedded-cpu.json" --max-num-batched-tokens -1 2>&1)
[[ $? == 2 ]] && grep -q "max-num-batched-tokens" <<<"$out" && ok "--max-num-batched-tokens -1 -> exit 2 naming it" || bad "--max-num-batched-tokens -1 accepted" "$out"
out=$("$SERVER" --model /nonexistent --port 0 2>&1)
[[ $? == 1 ]] && grep -q "NOT_FOUND" <<<"$out" && ok "missing model -> exit 1, NOT_FOUND" || bad "missing model" "$out"
# Settings that only prove wrong while the model loads: exit 1, the message naming the setting.
# (The embedded model has 2 KV heads; its 4,096-token context fits any machine.)
expect_exit() {  # expect_exit <description> <code> <pattern> <args...>
  local desc=$1 code=$2 pattern=$3
  shift 3
  local out rc
  out=$(timeout 60 "$SERVER" --backend cpu --check-config "$@" 2>&1)
  rc=$?
  [[ $rc == "$code" ]] && grep -qE -- "$pattern" <<<"$out" && ok "$desc -> exit $code" || bad "$desc: exit $rc" "$out"
}
expect_exit "--num-kv-slots 1 (no block per KV head)" 1 "num-kv-slots 1 holds no KV block" --num-kv-slots 1
# A pool that cannot hold one request of the whole context is refused at start (it started, then
# answered 429), naming the numbers and the flags; a --max-model-len it holds starts.
expect_exit "--num-kv-slots 2 (one block per KV head: 16 of 4096 tokens)" 1 \
  "context of 4096 tokens .* larger than the 16 tokens the KV cache can hold .*raise --num-kv-slots to at least 512.*lower --max-model-len to at most 16" \
  --num-kv-slots 2
expect_exit "--num-kv-slots 2 --max-model-len 16 (one block per KV head)" 0 "^config ok$" --num-kv-slots 2 --max-model-len 16
expect_exit "--num-kv-slots past the memory" 1 "needs [0-9.]+ GiB, more than" --num-kv-slots 2147483647
expect_exit "--model naming a file" 1 "is a file" --model "$ROOT/tests/fixtures/tiny-default/config.json"
expect_exit "--chat-template naming a directory" 1 "chat-template .* is a directory" --chat-template "$ROOT/tests"
: >"$TMP/empty.jinja"
expect_exit "--chat-template naming an empty file" 1 "chat-template .* is empty" --chat-template "$TMP/empty.jinja"
expect_exit "--config ''" 2 "--config needs a value" --config ""
printf '{"port": 70000, "port": 18105}' >"$TMP/dup.json"
expect_exit "a config file setting a key twice" 2 "dup.json: 'port' appears twice" --config "$TMP/dup.json"
printf '{"port": -5}' >"$TMP/neg.json"
expect_exit "a config file's bad value names the file" 2 "neg.json: port must be in \[0, 65535\], got -5" --config "$TMP/neg.json"
expect_exit "--staging-pool-gib 1e30" 2 "staging-pool-gib must be at most 1048576" --staging-pool-gib 1e30 --role prefill
mkdir -p "$TMP/zero-tok" "$TMP/huge"
cp "$ROOT/tests/fixtures/tiny-default/"* "$TMP/zero-tok/"
ln -sf /dev/zero "$TMP/zero-tok/tokenizer.json"
expect_exit "tokenizer.json -> /dev/zero" 1 "tokenizer.json: tokenizer is not a regular file" --model "$TMP/zero-tok"
python3 - "$ROOT/tests/fixtures/tiny-default/config.json" "$TMP/huge/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c.update(vocab_size=2147483647, hidden_size=16777216)
json.dump(c, open(sys.argv[2], "w"))
PY
expect_exit "dummy weights past the memory (was an abort)" 2 "RESOURCE_EXHAUSTED: the model's weights .*need .* GiB of host memory" \
  --model "$TMP/huge" --load-format dummy
printf '{{ x' >"$TMP/bad.jinja"
out=$(timeout 60 "$SERVER" --backend cpu --check-config --chat-template "$TMP/bad.jinja" 2>&1)
grep -q "chat template: chat template" <<<"$out" && bad "template error prefixed twice" "$out" || ok "template errors name the file once"
expect_exit "--host not an address" 2 "host must be an IP address" --host 999.1.1.1
expect_exit "--host ::1" 0 "^config ok$" --host ::1
expect_exit "--host [::1]" 0 "^config ok$" --host "[::1]"
expect_exit "--threads past 1024" 2 "threads must be at most 1024" --threads 4294967297
expect_exit "--host-kv-gib nan" 2 "host-kv-gib must be" --host-kv-gib nan
# Warned, not refused: settings the mode ignores; a checkpoint with more layers than config.json.
expect_exit "--kv-home with --sparse off" 0 "kv-home has no effect: sparse KV is off" --sparse off --kv-home hbm
mkdir -p "$TMP/fewer"
for f in "$ROOT"/tests/fixtures/tiny-default/*; do ln -sf "$f" "$TMP/fewer/"; done
rm "$TMP/fewer/config.json"
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["num_hidden_layers"]-=1; json.dump(c, open(sys.argv[2], "w"))' \
  "$ROOT/tests/fixtures/tiny-default/config.json" "$TMP/fewer/config.json"
mkdir -p "$TMP/eos"
for f in "$ROOT"/tests/fixtures/tiny-default/*; do ln -sf "$f" "$TMP/eos/"; done
rm "$TMP/eos/config.json"
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["eos_token_id"]=[2**32 + 5]; json.dump(c, open(sys.argv[2], "w"))' \
  "$ROOT/tests/fixtures/tiny-default/config.json" "$TMP/eos/config.json"
expect_exit "an EOS id past the vocabulary" 0 "EOS token ids \[4294967301\] are outside the vocabulary" --model "$TMP/eos"
expect_exit "a checkpoint with a layer past config.json's" 0 "holds layers up to [0-9]+ but config.json's num_hidden_layers is [0-9]+" --model "$TMP/fewer"
# SIGINT while the model loads ends the process at once (a 60,000-layer dummy takes a while).
mkdir -p "$TMP/slow"
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["num_hidden_layers"]=60000; json.dump(c, open(sys.argv[2], "w"))' \
  "$ROOT/tests/fixtures/tiny-default/config.json" "$TMP/slow/config.json"
"$SERVER" --backend cpu --port 0 --model "$TMP/slow" --load-format dummy >"$TMP/slow.log" 2>&1 &
slow=$!
sleep 1.5
kill -INT $slow
t0=$(date +%s.%N)
wait $slow
rc=$?
dt=$(python3 -c "import time; print(round(time.time() - $t0, 2))")
[[ $rc == 130 ]] && grep -q "while loading the model" "$TMP/slow.log" && python3 -c "import sys; sys.exit(0 if $dt < 2 else 1)" \
  && ok "SIGINT while loading: exit 130 after ${dt} s" || bad "SIGINT while loading: exit $rc after ${dt} s" "$(tail -3 "$TMP/slow.log")"

exit $fail
