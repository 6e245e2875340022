#!/usr/bin/env bash
# Long-context serving, dense vs sparse, on the GPU machine from the bundle (tools/gpu_suite.sh
# --bundle): oasis-server on dummy Qwen3-8B weights (plus a dummy EAGLE-3 head for sparse), then
# oasis-bench at each concurrency in CONCS with INPUT-token prompts and OUTPUT-token answers;
# prints throughput, TTFT, TPOT and the sparse metrics. The first version of the long-context
# benchmark driver (issue 10 extends it to sweeps, JSON and plots).
#   device run: command "tools/bench_long_context.sh", carry [".bundle-pack", ".cache/test-data/qwen3"]
#   INPUT=16000 OUTPUT=256 CONCS="8 32" tools/bench_long_context.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp}
[[ -d .bundle ]] || python3 -c "import tarfile; tarfile.open('.bundle-pack/bundle.tar.xz').extractall()"
export LD_LIBRARY_PATH=".bundle/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib"
MODEL=$(mktemp -d); cp tools/bench/model_configs/qwen3-8b.json "$MODEL/config.json"
run() {
  local name=$1; shift
  .bundle/bin/oasis-server --model "$MODEL" --load-format dummy --tokenizer .cache/test-data/qwen3 \
    --served-model-name m --port 8124 --max-model-len $((${INPUT:-16000} + ${OUTPUT:-256} + 64)) --max-num-seqs 64 "$@" > $OUT/server-$name.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 400); do [[ $(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8124/health) == 200 ]] && break; kill -0 $pid 2>/dev/null || break; sleep 0.5; done
  for conc in ${CONCS:-32}; do
    echo "=== $name concurrency $conc"
    timeout ${BENCH_TIMEOUT:-240} .bundle/bin/oasis-bench --base-url http://127.0.0.1:8124 --model m --dataset random --random-input-len ${INPUT:-16000} \
      --random-output-len ${OUTPUT:-256} --random-vocab-size 151936 --num-prompts $conc --max-concurrency $conc --seed 1 2>/dev/null \
      | grep -E "Successful|Failed req|Output token throughput|Median TTFT|Median TPOT"
  done
  curl -s http://127.0.0.1:8124/metrics | grep -E "^oasis:(sparse_hit_rate|sparse_blocks_fetched_per_step|sparse_h2d_bytes_per_step|sparse_topk_agreement |sparse_switches_total|spec_decode_draft_acceptance)" | head
  kill -TERM $pid; wait $pid
}
run dense
run sparse --draft-load-format dummy --lookahead reject --sparse on --sparse-threshold 4096 --host-kv-gib ${HOST_KV_GIB:-80}
