#!/usr/bin/env bash
# The server on the GPU machine, from the bundle (tools/gpu_suite.sh --bundle): oasis-server
# with the CUDA backend on a Qwen3-8B-shaped model with dummy weights and the real Qwen3
# tokenizer; curl, the Python `openai` client (when installed there) and a short oasis-bench
# run against it. Prints what each returned. OASIS_SERVER_ARGS adds server flags (e.g.
# "--draft-load-format dummy --lookahead reject").
#   device run: command "tools/gpu_server_smoke.sh", carry [".bundle-pack" (bundle + tokenizers),
#   ".cache/e2e-node/node_modules/openai"] (the npm client as tests/e2e installs it here). The GPU
#   machine has no node: carry one (e.g. packed with the rest) and put it on PATH first.
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/bundle_env.sh
MODEL=$(mktemp -d)
cp tools/bench/model_configs/qwen3-8b.json "$MODEL/config.json"
PORT=${PORT:-8123}
LOG=${OUT:-/tmp}/server.log
.bundle/bin/oasis-server --model "$MODEL" --load-format dummy --tokenizer .cache/test-data/qwen3 \
  --served-model-name qwen3-8b-dummy --port "$PORT" --max-model-len 8192 ${OASIS_SERVER_ARGS:-} > "$LOG" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")
  [[ $code == 200 ]] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.5
done
echo "=== health: $code"; grep -E "KV|load|graph|backend" "$LOG" | head -8
B="http://127.0.0.1:$PORT"
echo "=== /v1/models"; curl -s $B/v1/models; echo
echo "=== completion (curl)"
curl -s $B/v1/completions -H 'Content-Type: application/json' \
  -d '{"model":"qwen3-8b-dummy","prompt":"The capital of France is","max_tokens":8,"temperature":0,"logprobs":2}' | head -c 900; echo
echo "=== chat, streamed (curl)"
curl -sN $B/v1/chat/completions -H 'Content-Type: application/json' \
  -d '{"model":"qwen3-8b-dummy","messages":[{"role":"user","content":"Hi"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}' | tail -4
echo "=== bad input (curl): temperature -1"
curl -s $B/v1/completions -H 'Content-Type: application/json' -d '{"model":"qwen3-8b-dummy","prompt":"x","temperature":-1}'; echo
echo "=== structured output: json_schema, tool_choice required, guided_choice (the CUDA logits processor masks)"
python3 - "$B" <<'PY'
import json, sys, time, urllib.request
from concurrent.futures import ThreadPoolExecutor
B = sys.argv[1]
def post(body):
    req = urllib.request.Request(B + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.load(r)
msgs = [{"role": "user", "content": "Describe a person as JSON."}]
schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
          "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}}, "required": ["name", "age"]}
def structured(i):
    return post({"model": "qwen3-8b-dummy", "messages": msgs, "max_tokens": 256, "temperature": 1.0, "seed": i,
                 "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}})
def plain(i):
    return post({"model": "qwen3-8b-dummy", "messages": msgs, "max_tokens": 64, "temperature": 1.0, "seed": i, "ignore_eos": True})
for name, fn in (("plain", plain), ("json_schema", structured)):
    for conc in (1, 8):
        t = time.perf_counter()
        with ThreadPoolExecutor(conc) as ex:
            res = list(ex.map(fn, range(conc)))
        wall = time.perf_counter() - t
        toks = sum(r["usage"]["completion_tokens"] for r in res)
        ok = stop = 0
        for r in res:
            c = r["choices"][0]
            if name == "json_schema" and c["finish_reason"] == "stop":
                stop += 1
                v = json.loads(c["message"]["content"])
                ok += isinstance(v, dict) and "name" in v and "age" in v
        extra = f" finished {stop}/{conc}, valid {ok}/{stop}" if name == "json_schema" else ""
        print(f"{name} x{conc}: {toks} tokens in {wall:.2f} s, {1000 * wall / max(1, toks / conc):.2f} ms a token a request{extra}")
print("sample:", res[0]["choices"][0]["message"]["content"][:200])
tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
          "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]}}}]
r = post({"model": "qwen3-8b-dummy", "messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 200,
          "tools": tools, "tool_choice": "required", "seed": 3})
c = r["choices"][0]
print("tool_choice required:", c["finish_reason"], json.dumps(c["message"].get("tool_calls"))[:300])
r = post({"model": "qwen3-8b-dummy", "messages": msgs, "max_tokens": 20, "guided_choice": ["yes", "no", "maybe"]})
print("guided_choice:", repr(r["choices"][0]["message"]["content"]), r["choices"][0]["finish_reason"])
PY
if python3 -c "import openai" 2>/dev/null; then
  echo "=== openai python client"
  python3 - "$B" <<'PY'
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none")
r = c.completions.create(model="qwen3-8b-dummy", prompt="Hello", max_tokens=6, temperature=0)
print("completion:", repr(r.choices[0].text), r.usage)
r = c.chat.completions.create(model="qwen3-8b-dummy", messages=[{"role": "user", "content": "Hi"}], max_tokens=6)
print("chat:", repr(r.choices[0].message.content), r.choices[0].finish_reason)
s = c.chat.completions.create(model="qwen3-8b-dummy", messages=[{"role": "user", "content": "Hi"}], max_tokens=6, stream=True)
print("stream chunks:", sum(1 for _ in s))
PY
else
  echo "=== openai python client: not installed on this machine"
fi
OPENAI_NPM=.cache/e2e-node/node_modules/openai
if command -v node >/dev/null && [[ -d $OPENAI_NPM ]]; then
  echo "=== openai npm client (node $(node --version))"
  cat > /tmp/oasis_openai_smoke.mjs <<'JS'
const { default: OpenAI } = await import(process.argv[3]);
const c = new OpenAI({ baseURL: process.argv[2] + "/v1", apiKey: "none" });
const r = await c.completions.create({ model: "qwen3-8b-dummy", prompt: "Hello", max_tokens: 6, temperature: 0 });
console.log("completion:", JSON.stringify(r.choices[0].text), JSON.stringify(r.usage));
const ch = await c.chat.completions.create({ model: "qwen3-8b-dummy", messages: [{ role: "user", content: "Hi" }], max_tokens: 6 });
console.log("chat:", JSON.stringify(ch.choices[0].message.content), ch.choices[0].finish_reason);
let n = 0;
for await (const _ of await c.chat.completions.create({ model: "qwen3-8b-dummy", messages: [{ role: "user", content: "Hi" }], max_tokens: 6, stream: true })) n++;
console.log("stream chunks:", n);
JS
  node /tmp/oasis_openai_smoke.mjs "$B" "$(realpath $OPENAI_NPM)/index.mjs"
else
  echo "=== openai npm client: node or $OPENAI_NPM missing on this machine"
fi
for conc in 1 16 64; do
  echo "=== oasis-bench concurrency $conc"
  .bundle/bin/oasis-bench --base-url "$B" --model qwen3-8b-dummy --dataset random --random-input-len 1024 \
    --random-output-len 128 --random-vocab-size 151936 --num-prompts $((conc * 4 > 16 ? conc * 4 : 16)) \
    --max-concurrency $conc --seed 1 2>/dev/null | grep -E -A3 "Successful|Failed|Output token throughput|Total token|Median TTFT|Median TPOT|Median ITL|Failure reasons" | grep -vE "^--|Maximum|Request rate|Benchmark dur|Peak"
done
curl -s $B/metrics | grep -E "^oasis:(generation_tokens_total|prompt_tokens_total|request_success_total|spec_decode)" | head -12
kill -TERM $pid; wait $pid; echo "server exit $?"
rm -rf "$MODEL"
