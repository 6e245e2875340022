#!/usr/bin/env bash
# The main job, from a fresh machine: installs the Debian packages, configures and builds
# OasisKV (build/), starts oasis-server on the embedded default model (a small Qwen3 trained
# for the project on public text from Debian packages, docs/trained_model.md; CPU backend
# here), shows it answering — /health, /v1/models, a chat completion and a streamed
# completion, printed — then keeps serving in the foreground (Ctrl-C stops it).
#   OASIS_RUN_DEMO_ONLY=1 ./tools/run.sh   stops after the demo instead of serving on
#   OASIS_BUILD_DIR=dir ./tools/run.sh      builds in (and runs from) another build directory
#   ./tools/run.sh --port 9000 --model DIR  extra arguments go to oasis-server
# The embedded model is small (6 layers, 256 wide): its text reads like its training corpus,
# not like a large model's answers.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/install_deps.sh >&2
BUILD=${OASIS_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja >&2
cmake --build "$BUILD" --target oasis-server >&2
SERVER=./$BUILD/src/server/oasis-server
PORT=8000
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [[ ${args[i]} == --port ]] && PORT=${args[i + 1]}
  [[ ${args[i]} == --port=* ]] && PORT=${args[i]#--port=}
done
BASE=http://127.0.0.1:$PORT
"$SERVER" --port "$PORT" "$@" &
PID=$!
trap 'kill -TERM $PID 2>/dev/null; wait $PID 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 600); do
  [[ $(curl -s -o /dev/null -w '%{http_code}' "$BASE/health") == 200 ]] && break
  kill -0 $PID 2>/dev/null || { echo "oasis-server exited" >&2; exit 1; }
  sleep 0.2
done
MODEL=$(curl -s "$BASE/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
echo "== GET $BASE/v1/models -> $MODEL"
echo "== POST /v1/chat/completions"
curl -s "$BASE/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$MODEL\", \"messages\": [{\"role\": \"user\", \"content\": \"Who was Moses?\"}], \"max_tokens\": 40, \"temperature\": 0.7, \"seed\": 1}" |
  python3 -m json.tool
echo "== POST /v1/completions (stream: true)"
curl -sN "$BASE/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$MODEL\", \"prompt\": \"And the LORD said unto Moses,\", \"max_tokens\": 48, \"temperature\": 0.7, \"seed\": 3, \"stream\": true, \"stream_options\": {\"include_usage\": true}}"
echo
if [[ ${OASIS_RUN_DEMO_ONLY:-0} == 1 ]]; then exit 0; fi
echo "== serving $MODEL on $BASE (OpenAI API; Ctrl-C to stop)"
wait $PID
