#!/usr/bin/env bash
# CPU smoke test of the training pipeline (docs/trained_model.md, "Testing without a GPU"):
# the device driver with --smoke settings in a scratch TRAIN_DIR, the embedded model's
# tokenizer (byte fallback when HF `tokenizers` is missing), then unpack + a cold resume, and,
# when built, our C++ engine loading the exported model (oasis-generate) and the head
# (oasis-server --draft-model, one completion). Needs a python with torch + numpy:
#
#   PYTHON=/usr/bin/python3 tools/train/smoke_cpu.sh      # a few minutes on one core
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
"$PY" -c "import torch, numpy" 2>/dev/null || { echo "smoke_cpu: $PY has no torch/numpy" >&2; exit 2; }
[ -f .cache/train/corpus/train.txt.xz ] || { echo "smoke_cpu: run make_corpus.py first" >&2; exit 2; }
S="$(mktemp -d /tmp/oasis-train-smoke.XXXXXX)"
trap 'rm -rf "$S"' EXIT
mkdir -p "$S/t/state/tokenizer"
ln -s "$ROOT/.cache/train/corpus" "$S/t/corpus"
cp models/embedded/tokenizer.json models/embedded/tokenizer_config.json "$S/t/state/tokenizer/"
export TRAIN_DIR="$S/t" PYTHON="$PY" TRAIN_SMOKE=1 TRAIN_CALL_BUDGET_S=300 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

echo "== call 1: model eagle"
OUT="$S/out1" tools/train/run_on_gpu.sh model eagle > "$S/call1.log" 2>&1 || { tail -20 "$S/call1.log"; exit 1; }
grep -E "^train_(model|eagle3): (done|.*params)" "$S/call1.log"
rm -rf "$S/t/state" "$S/t/work"                      # a cold machine: only what came back
tools/train/unpack_out.sh "$S/out1" > /dev/null
echo "== call 2 (cold): resume eagle"
OUT="$S/out2" TRAIN_EXTRA_ARGS_MODEL="--total-tokens 61440" TRAIN_EXTRA_ARGS_EAGLE="--total-tokens 40960" \
  tools/train/run_on_gpu.sh resume eagle > "$S/call2.log" 2>&1 || { tail -20 "$S/call2.log"; exit 1; }
grep -E "resumed from|^train_(model|eagle3): done" "$S/call2.log"
grep -q "portable checkpoint" "$S/call2.log" || { echo "smoke_cpu: the cold resume did not use the portable checkpoint" >&2; exit 1; }
tools/train/unpack_out.sh "$S/out2" > /dev/null

GEN="$(ls -t build*/tools/oasis-generate 2>/dev/null | head -1 || true)"
if [ -n "$GEN" ]; then
  echo "== $GEN loads the exported model"
  "$GEN" --model "$S/t/state/model" --prompt "In the beginning" --max-tokens 8 --threads 1 | grep -E "^output 0 ids"
fi
SERVER=""
for b in $(ls -t build*/src/server/oasis-server 2>/dev/null); do
  "$b" --help 2>&1 | grep -q -- --draft-model && { SERVER="$b"; break; }
done
if [ -n "$SERVER" ]; then
  echo "== $SERVER serves the model with the exported EAGLE-3 head (--lookahead speculate)"
  PORT=$(( 20000 + RANDOM % 20000 ))
  "$SERVER" --model "$S/t/state/model" --draft-model "$S/t/state/eagle" --lookahead speculate --backend cpu \
    --threads 1 --host 127.0.0.1 --port "$PORT" --log-level warn > "$S/server.log" 2>&1 &
  SPID=$!
  ok=0
  for _ in $(seq 1 60); do curl -sf "127.0.0.1:$PORT/health" > /dev/null 2>&1 && { ok=1; break; }; sleep 0.5; done
  if [ "$ok" = 1 ]; then
    curl -sf "127.0.0.1:$PORT/v1/completions" -H 'content-type: application/json' \
      -d '{"prompt": "In the beginning", "max_tokens": 16, "temperature": 0}' > /dev/null
    curl -sf "127.0.0.1:$PORT/metrics" | grep -E "^oasis:spec_decode_num_(draft|accepted)_tokens_total"
  fi
  kill "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null || true
  [ "$ok" = 1 ] || { cat "$S/server.log"; echo "smoke_cpu: the server did not come up with the head" >&2; exit 1; }
fi
echo "smoke_cpu: ok"
