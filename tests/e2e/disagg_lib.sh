# shellcheck shell=bash
# Shared by the disaggregation e2e tests (test_disagg.sh, test_disagg_fp8.sh): the checks that
# completions, chat and SSE through the router (prefill -> decode) equal one instance's. Needs
# ok/bad (server_lib.sh), py and post (the tests' helpers) and one_PORT / router_PORT set.

# Deterministic prompt text: prompt_text SEED WORDS.
prompt_text() { python3 -c "
import random, sys
r = random.Random(int(sys.argv[1]))
words = 'river market city north stone bread light harbour winter garden people music road tower'.split()
print(' '.join(r.choice(words) for _ in range(int(sys.argv[2]))))" "$1" "$2"; }

# router_equals_one LABEL SEED0 STEP: 6 greedy completions with log-probs (prompt i: seed
# SEED0 + i, 40 + STEP * i words), a chat and an SSE stream through the router equal one
# instance's. LABEL prefixes the messages ("" or "FP8 ").
router_equals_one() {
  local label=$1 seed0=$2 step=$3 same=0 i body want got chat sbody nbody stream joined
  for i in 1 2 3 4 5 6; do
    body=$(python3 -c "import json,sys; print(json.dumps({'prompt': sys.argv[1], 'max_tokens': 24 + 4 * int(sys.argv[2]), 'temperature': 0, 'logprobs': 2}))" "$(prompt_text $((seed0 + i)) $((40 + step * i)))" "$i")
    want=$(post "$one_PORT" /v1/completions "$body")
    got=$(post "$router_PORT" /v1/completions "$body")
    if [[ $(python3 -c "
import json, sys
a = json.loads(sys.argv[1])['choices'][0]; b = json.loads(sys.argv[2])['choices'][0]
print(a['text'] == b['text'] and a['logprobs']['tokens'] == b['logprobs']['tokens'] and
      max(abs(x - y) for x, y in zip(a['logprobs']['token_logprobs'], b['logprobs']['token_logprobs'])) < 1e-4
      and a['finish_reason'] == b['finish_reason'])" "$want" "$got" 2>&1) == True ]]; then
      same=$((same + 1))
    else
      bad "${label}completion $i through the router differs from one ${label}instance" "$got | want $want"
    fi
  done
  [[ $same == 6 ]] && ok "6 greedy ${label}completions through prefill -> decode equal one ${label}instance (text, log-probs)"

  chat='{"messages": [{"role": "user", "content": "Tell me about the river market in winter, the harbour and the stone tower by the road."}], "max_tokens": 30, "temperature": 0}'
  want=$(post "$one_PORT" /v1/chat/completions "$chat")
  got=$(post "$router_PORT" /v1/chat/completions "$chat")
  [[ $(py "$got" "d['choices'][0]['message']['content']") == $(py "$want" "d['choices'][0]['message']['content']") && -n $(py "$want" "d['choices'][0]['message']['content']") ]] &&
    ok "${label}chat through the router equals one ${label}instance" || bad "${label}chat differs" "$got | want $want"

  # SSE: the streamed text joins to the same completion.
  sbody=$(python3 -c "import json,sys; print(json.dumps({'prompt': sys.argv[1], 'max_tokens': 40, 'temperature': 0, 'stream': True, 'stream_options': {'include_usage': True}}))" "$(prompt_text 9 120)")
  nbody=$(py "$sbody" "json.dumps({k: v for k, v in d.items() if k not in ('stream', 'stream_options')})")
  want=$(post "$one_PORT" /v1/completions "$nbody")
  stream=$(post "$router_PORT" /v1/completions "$sbody")
  joined=$(python3 -c "
import json, sys
text, usage, done = '', None, False
for line in sys.argv[1].splitlines():
    if not line.startswith('data: '): continue
    if line == 'data: [DONE]': done = True; continue
    d = json.loads(line[6:])
    for c in d.get('choices', []): text += c.get('text') or ''
    usage = d.get('usage') or usage
print(json.dumps({'text': text, 'done': done, 'completion_tokens': usage and usage['completion_tokens']}))" "$stream")
  [[ $(py "$joined" "d['done'] and d['completion_tokens'] == $(py "$want" "d['usage']['completion_tokens']")") == True && $(py "$joined" "d['text']") == $(py "$want" "d['choices'][0]['text']") ]] &&
    ok "${label}SSE through the router: same text, usage, [DONE]" || bad "${label}SSE through the router" "$joined | want $want"
}
