#!/usr/bin/env bash
# The long soak on the GPU machine (issue 29): tests/e2e/test_server_soak.sh's checks — mixed
# hostile traffic (normal, aborted, reset, slow, idle, malformed, probes), then nothing running
# or waiting, every KV block, working set and host slot free, RSS growth bounded, no 5xx —
# against oasis-server with the CUDA backend on a Qwen3-8B-shaped model with dummy weights and a
# dummy EAGLE-3 head, sparse on with the host store (prompts up to 6K tokens).
#   device run: command "tools/gpu_soak.sh", carry [".bundle-pack"] (tools/gpu_suite.sh --bundle)
#   OASIS_SOAK_SECONDS (default 600), OASIS_SOAK_CLIENTS (default 48), OASIS_SOAK_MEM (the
#   server's --gpu-memory-utilization, default 0.5: GPU tests may run alongside).
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/bundle_env.sh
MODEL=$(mktemp -d)
cp tools/bench/model_configs/qwen3-8b.json "$MODEL/config.json"
export OASIS_SOAK_SECONDS=${OASIS_SOAK_SECONDS:-600}
export OASIS_SOAK_CLIENTS=${OASIS_SOAK_CLIENTS:-48}
export OASIS_SOAK_LENGTHS=${OASIS_SOAK_LENGTHS:-4,16,120,300,1500,6000}
export OASIS_SOAK_RSS_MIB=${OASIS_SOAK_RSS_MIB:-256}
export OASIS_SOAK_SERVER_ARGS="--model $MODEL --load-format dummy --tokenizer .cache/test-data/qwen3
  --max-model-len 8192 --gpu-memory-utilization ${OASIS_SOAK_MEM:-0.5} --max-num-seqs 64
  --max-waiting 256 --draft-load-format dummy --draft-vocab-size 32000 --lookahead reject
  --sparse on --sparse-threshold 1024 --sparse-switch threshold --kv-home host --host-kv-gib 8 --topk-blocks 32
  --fetch-ratio 0.25"
start=$(date +%s)
bash tests/e2e/test_server_soak.sh "$PWD/.bundle/bin/oasis-server" "$PWD"
rc=$?
echo "gpu soak: rc=$rc after $(( $(date +%s) - start )) s ($OASIS_SOAK_SECONDS s of traffic, $OASIS_SOAK_CLIENTS clients)"
exit $rc
