#!/usr/bin/env bash
# Runs every GPU test (and, as they land, GPU benchmarks) on the GPU machine from a bundle
# made here, and prints a short table last.
#
# Here:   cmake --build build && tools/gpu_suite.sh --bundle    (packs .bundle/)
# There:  tools/gpu_suite.sh                                     (runs from .bundle/)
#   device run: command "tools/gpu_suite.sh", carry [".bundle-pack"] (the bundle and the test
#   tokenizers, packed); the same bundle serves tools/gpu_server_smoke.sh
# Parts: OASIS_GPU_TESTS="test_a test_b" runs only those tests; OASIS_BENCH=0 skips the
# benchmarks, the tokenizer speed and the PyTorch peers; OASIS_LOAD_BENCH=0 the checkpoint
# load; OASIS_SANITIZE=1 adds compute-sanitizer runs; OASIS_EVAL_TRAINED=1 adds the trained
# default's measurements (tools/eval_trained_model.py; carry .cache/train/corpus too);
# OASIS_SPECULATION_EVAL=1 speculation by k on it (tools/eval_speculation.py);
# OASIS_PREFIX_CACHE_BENCH=1 the multi-turn prefix-caching runs (tools/bench_prefix_cache.py);
# OASIS_DISAGG_PREFIX_BENCH=1 the decode side's prefix caching (tools/bench_disagg.py with
# shared prefixes: both instances on GPU 0 unless there are two GPUs); OASIS_FETCH_BUDGET_BENCH=1
# the adaptive fetch budget against the fixed one (16K/1K x 32, host home).
# OASIS_BASE_BUNDLE=FILE.tar.xz (a bundle of an earlier commit, packed by --bundle-base) runs
# every benchmark of that build right after ours, with the same arguments, and puts its RESULT
# line under ours in the table: a before/after comparison from one call. OASIS_BENCH_ONLY="a b"
# runs only the benchmarks whose binary is named (with OASIS_GPU_TESTS=" " for no tests).
set -uo pipefail
cd "$(dirname "$0")/.."
ALL_GPU_TESTS=(test_gpu_runtime test_gpu_pdl test_gpu_ops test_gpu_sampling test_attention_decode test_attention_prefill test_gpu_models test_gpu_graphs test_gpu_eagle3 test_gpu_sparse test_gpu_lookahead test_gpu_prefix_cache test_gpu_sparse_decode test_gpu_nccl test_gpu_tp test_gpu_shapes test_gpu_rope test_gpu_prompt_logprobs test_gpu_moe test_gpu_fp8_kv test_gpu_fp8_linear test_gpu_fp8_transformers test_gpu_server_speculate)
# shellcheck disable=SC2206
GPU_TESTS=(${OASIS_GPU_TESTS:-${ALL_GPU_TESTS[@]}})
# [VAR=value ...] name|arguments: each runs from the bundle (with those tuning knobs set, for
# A/Bs against the same line without them); its RESULT line goes into the table.
BENCHMARKS=(
  "bench_decode_attention|"
  "bench_decode_attention|--kv-dtype fp8"
  "bench_sparse_kv|"
  "bench_sparse_kv|--only gather --kv-dtype fp8"
  "bench_sparse_decode|--batch 16 --context 16384 --transfers both"
  "bench_sparse_decode|--batch 16 --context 16384 --kv-home hbm"
  "bench_sparse_decode|--batch 32 --context 16384 --transfers both --tensor-parallel-size 2"
  "bench_gemv|--rows 1"
  "bench_gemv|--rows 4"
  "bench_fp8_gemm|"
  "bench_prefill_attention|"
  "bench_decode|--batch 1 --context 128"
  "bench_decode|--batch 1 --context 128 --no-graphs --steps 10"
  "bench_decode|--batch 1 --context 128 --temperature 0.8 --top-p 0.95"
  "bench_decode|--batch 4 --context 2048"
  "bench_decode|--batch 64 --context 4096 --steps 20"
  "bench_decode|--batch 64 --context 4096 --steps 20 --queries 2 --capture"
  "bench_decode|--batch 1 --context 128 --tensor-parallel-size 2"
  "bench_decode|--batch 64 --context 4096 --steps 20 --tensor-parallel-size 2"
  "bench_decode|--prefill 8192 --steps 5 --warmup 1"
  "bench_decode|--config tools/bench/model_configs/qwen3-8b-fp8.json --batch 1 --context 128"
  "bench_decode|--config tools/bench/model_configs/qwen3-8b-fp8.json --prefill 8192 --steps 5 --warmup 1"
  "bench_decode|--config tools/bench/model_configs/qwen3-30b-a3b.json --batch 1 --context 128"
  "OASIS_GEMV_NARROW_NORM=0 bench_decode|--config tools/bench/model_configs/qwen3-30b-a3b.json --batch 1 --context 128"
  "OASIS_MOE_DOWN_ONE_WAVE=0 bench_decode|--config tools/bench/model_configs/qwen3-30b-a3b.json --batch 1 --context 128"
  "bench_decode|--config tools/bench/model_configs/qwen3-30b-a3b.json --batch 64 --context 4096 --steps 20"
  "bench_decode|--config tools/bench/model_configs/qwen3-30b-a3b.json --batch 64 --context 4096 --steps 20 --moe-path gemm"
  "bench_decode|--config tools/bench/model_configs/qwen3-30b-a3b.json --prefill 8192 --steps 5 --warmup 1"
  "bench_moe|"
  "bench_prefix_tier|"
  "bench_lookahead|--batch 1 --context 128 --tokens 128"
  "bench_lookahead|--batch 64 --context 4096 --tokens 128"
  "bench_lookahead|--batch 1 --context 128 --tokens 128 --repeat"
  "bench_lookahead|--head-only --batch 64 --context 4096 --tokens 20"
  "bench_lookahead|--batch 32 --context 16384 --tokens 256 --repeat --sparse --num-speculative-tokens 3"
  "bench_disagg_fetch|.bundle/bin/disagg_peer --tls default --batch 512 --seconds 2"
  "bench_disagg_fetch|.bundle/bin/disagg_peer --tls default --batch 512 --seconds 2 --spin-us 100000"
  "bench_disagg_fetch|.bundle/bin/disagg_peer --tls tcp --batch 4096 --seconds 2 --spin-us 100000"
)
# bench_decode_attention's peer (tools/bench/bench_decode_attention_torch.py) runs just before
# it, in the benchmark loop: its measured GB/s become bench_decode_attention's --torch-gbs.
DECODE_ATTENTION_PEER=tools/bench/bench_decode_attention_torch.py
PEERS=(
  "tools/bench/bench_transformers.py --prefill 8192"
  "tools/bench/bench_transformers.py --prefill 8192 --config tools/bench/model_configs/qwen3-30b-a3b.json"
  "tools/bench/bench_prefill_attention_torch.py --ours .bundle/bin/bench_prefill_attention"
)
[[ ${OASIS_SKIP_PEERS:-0} == 1 ]] && PEERS=() DECODE_ATTENTION_PEER=

if [[ ${1:-} == --bundle-base ]]; then
  # The benchmark binaries of this build, packed for OASIS_BASE_BUNDLE (as .bundle-base/, next
  # to a later build's .bundle/): tools/gpu_suite.sh --bundle-base OUT.tar.xz
  exes=(build/tests/unit/disagg/bench_disagg_fetch build/tests/unit/disagg/disagg_peer)
  for b in "${BENCHMARKS[@]}"; do
    name=${b%%|*}
    name=${name##* }  # (after any VAR=value words)
    [[ $name == bench_disagg_fetch ]] || exes+=("build/tools/bench/$name")
  done
  tools/make_bundle.sh $(printf '%s\n' "${exes[@]}" | sort -u)
  mkdir -p .bundle/lib/ucx && cp /usr/lib/x86_64-linux-gnu/ucx/*.so.0 .bundle/lib/ucx/
  rm -rf .bundle-base && mv .bundle .bundle-base
  tar cf - .bundle-base | xz -T2 --lzma2=preset=6,dict=256MiB > "${2:?the output .tar.xz}"
  rm -rf .bundle-base
  du -sh "$2"
  exit 0
fi
if [[ ${1:-} == --bundle ]]; then
  # OASIS_GPU_TESTS="a b" packs only those tests, OASIS_BENCH=0 no benchmark, server or tool
  # binaries, OASIS_BENCH_ONLY="a b" only those benchmarks: the device call's working tree
  # (~54 MiB tracked) and carry share 64 MiB, so the whole suite takes two packs and calls, e.g.
  #   OASIS_BENCH=0 OASIS_GPU_TESTS="test_gpu_moe ..." tools/gpu_suite.sh --bundle
  exes=()
  for t in "${GPU_TESTS[@]}"; do  # tests/kernels/, tests/models/ or tests/unit/server/
    [[ -n $t ]] || continue
    for d in kernels models unit/server; do  # (test_gpu_server_speculate: tests/unit/server)
      if [[ -x build/tests/$d/$t ]]; then exes+=("build/tests/$d/$t"); break; fi
    done
  done
  if [[ ${OASIS_BENCH:-1} == 1 ]]; then
    for b in "${BENCHMARKS[@]}"; do
      name=${b%%|*}
      name=${name##* }  # (after any VAR=value words)
      [[ -n ${OASIS_BENCH_ONLY:-} && " $OASIS_BENCH_ONLY " != *" $name "* ]] && continue
      [[ $name == bench_disagg_fetch ]] || exes+=("build/tools/bench/$name")
    done
    if [[ -z ${OASIS_BENCH_ONLY:-} ]]; then
      exes+=(build/tests/unit/disagg/bench_disagg_fetch build/tests/unit/disagg/disagg_peer)
      exes+=(build/tools/tokenizer/bench_tokenizer build/src/server/oasis-server build/src/router/oasis-router build/tools/loadgen/oasis-bench)
      exes+=(build/tools/bench/bench_structured)
    fi
  fi
  tools/make_bundle.sh $(printf '%s\n' "${exes[@]}" | sort -u)
  strip --strip-all .bundle/bin/*  # symbols are not needed there (~0.7 MB a binary)
  # OASIS_TRACE_LIB=1: the CUPTI kernel timeline (tools/profile/cupti_trace.cpp) and libcupti
  # (~1.5 MiB packed), for CUDA_INJECTION64_PATH=$PWD/.bundle/lib/liboasis_cupti_trace.so there.
  if [[ ${OASIS_TRACE_LIB:-0} == 1 && -f build/tools/liboasis_cupti_trace.so ]]; then
    cp build/tools/liboasis_cupti_trace.so .bundle/lib/
    cp -L "$(ldd build/tools/liboasis_cupti_trace.so | awk '/libcupti/ {print $3}')" .bundle/lib/
  fi
  # UCX loads its transports as plugins (ldd does not see them): UCX_MODULE_DIR points there.
  mkdir -p .bundle/lib/ucx && cp /usr/lib/x86_64-linux-gnu/ucx/*.so.0 .bundle/lib/ucx/
  # The kernels' fat binaries make .bundle large: carry it compressed (.bundle-pack, ignored).
  # Every binary holds the same kernels: a 512 MiB dictionary finds them across binaries (13
  # stripped GPU tests + bench_decode: 6.4 MiB; the default 8 MiB dictionary gave ~54 MB for
  # the suite).
  rm -rf .bundle-pack && mkdir -p .bundle-pack && tar cf - .bundle | xz -T1 --lzma2=preset=9e,dict=512MiB > .bundle-pack/bundle.tar.xz
  # The test tokenizers too (unpacked they would push the carry past its 64 MiB).
  # (the tokenizer speed and the server runs need them; not packed with OASIS_BENCH=0 or
  # OASIS_BENCH_ONLY)
  [[ -d .cache/test-data && ${OASIS_BENCH:-1} == 1 && -z ${OASIS_BENCH_ONLY:-} ]] &&
    tar cf - .cache/test-data | xz -6 -T2 > .bundle-pack/tok.tar.xz
  du -sh .bundle-pack/*
  tracked=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
  pack=$(cat .bundle-pack/* | wc -c)
  if (( tracked + pack > 63 * 1024 * 1024 )); then
    echo "gpu_suite: the tracked tree ($((tracked >> 20)) MiB) and the pack ($((pack >> 20)) MiB) pass the" \
      "device carry's 64 MiB: pack fewer tests or benchmarks (OASIS_GPU_TESTS, OASIS_BENCH=0," \
      "OASIS_BENCH_ONLY), or leave tok.tar.xz out" >&2
  fi
  exit 0
fi
source tools/bundle_env.sh
export UCX_MODULE_DIR=${UCX_MODULE_DIR:-$PWD/.bundle/lib/ucx}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
NUM_GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
declare -a rows
status=0
for t in "${GPU_TESTS[@]}"; do
  start=$(date +%s%N)
  out=$(".bundle/bin/$t" 2>&1)
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  echo "=== $t (rc $rc)"
  echo "$out" | tail -25
  summary=$(echo "$out" | grep -E "^(All tests passed|test cases:)" | tail -1)
  [[ $rc -eq 0 ]] && verdict=PASS || { verdict=FAIL; status=1; }
  rows+=("$(printf '%-20s %-5s %7d ms  %s' "$t" "$verdict" "$ms" "$summary")")
done
[[ ${OASIS_BENCH:-1} == 1 ]] || BENCHMARKS=() PEERS=() DECODE_ATTENTION_PEER=
for b in "${BENCHMARKS[@]}"; do
  name=${b%%|*}
  args=${b#*|}
  knobs=()  # leading VAR=value words of the name
  read -r -a words <<<"$name"
  for w in "${words[@]}"; do [[ $w == *=* ]] && knobs+=("$w") || name=$w; done
  if [[ $name == bench_decode_attention && -n $DECODE_ATTENTION_PEER ]]; then
    echo "=== $DECODE_ATTENTION_PEER"
    PYTHONUNBUFFERED=1 python3 $DECODE_ATTENTION_PEER > /tmp/peer.out 2>&1
    tail -12 /tmp/peer.out
    rows+=("$(printf '%-20s %s' "peer" "$(grep -E '^RESULT' /tmp/peer.out | tail -1 | cut -c8-)")")
    peer_gbs=$(grep -E '^PEER_GBS ' /tmp/peer.out | tail -1 | cut -d' ' -f2)
    [[ -n $peer_gbs ]] && args="$args --torch-gbs $peer_gbs"
  fi
  if [[ -n ${OASIS_BENCH_ONLY:-} && " $OASIS_BENCH_ONLY " != *" $name "* ]]; then continue; fi
  if [[ $args == *--tensor-parallel-size* && $NUM_GPUS -lt 2 ]]; then
    rows+=("$(printf '%-20s %s' "$name" "$args: skipped, one GPU")")
    continue
  fi
  echo "=== ${knobs[*]} $name $args"
  # shellcheck disable=SC2086
  env "${knobs[@]}" ".bundle/bin/$name" $args > /tmp/bench.out 2>&1
  cat /tmp/bench.out
  rows+=("$(printf '%-20s %s' "$name" "${knobs[*]:+${knobs[*]} }$(grep -E '^RESULT' /tmp/bench.out | tail -1 | cut -c8-)")")
  if [[ -n ${OASIS_BASE_BUNDLE:-} ]]; then
    [[ -d .bundle-base/bin ]] || python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall()" "$OASIS_BASE_BUNDLE"
    base_args=${b#*|}  # without --torch-gbs: an earlier build may not take it
    base_args=${base_args//.bundle\//.bundle-base/}
    echo "=== base: $name $base_args"
    # shellcheck disable=SC2086
    env "${knobs[@]}" LD_LIBRARY_PATH=".bundle-base/lib:${CUDA_LIB}" \
      UCX_MODULE_DIR=$PWD/.bundle-base/lib/ucx ".bundle-base/bin/$name" $base_args > /tmp/bench.out 2>&1
    cat /tmp/bench.out
    rows+=("$(printf '%-20s %s' "  base" "$(grep -E '^RESULT' /tmp/bench.out | tail -1 | cut -c8-)")")
  fi
done
# The sparse pipeline under compute-sanitizer (issue 8's stress run): memcheck over the sparse
# ops and the sparse decode (graphs and eager, several streams), racecheck over the kernels'
# shared memory. OASIS_SANITIZE=1 turns it on (slow: minutes).
SANITIZER=$(ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [[ ${OASIS_SANITIZE:-0} == 1 && -n $SANITIZER ]]; then
  for spec in "memcheck test_gpu_sparse" "memcheck test_gpu_sparse_decode" "racecheck test_gpu_sparse" \
              "synccheck test_gpu_sparse"; do
    read -r tool t <<<"$spec"
    echo "=== compute-sanitizer --tool $tool $t"
    "$SANITIZER" --tool "$tool" --error-exitcode 99 ".bundle/bin/$t" > /tmp/sanitize.out 2>&1
    rc=$?
    tail -6 /tmp/sanitize.out
    [[ $rc -eq 0 ]] && verdict=PASS || { verdict="FAIL (rc $rc)"; status=1; }
    rows+=("$(printf '%-20s %s %s' "sanitize $tool" "$t" "$verdict: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/sanitize.out | tail -1)")")
  done
fi

# Checkpoint loading: transformers writes a random Qwen3-8B-shaped checkpoint, we load it.
if [[ ${OASIS_LOAD_BENCH:-1} == 1 ]] && python3 tools/bench/make_checkpoint.py \
     --config tools/bench/model_configs/qwen3-8b.json --out /tmp/oasis-ckpt > /tmp/ckpt.out 2>&1; then
  echo "=== bench_decode --model /tmp/oasis-ckpt"
  .bundle/bin/bench_decode --model /tmp/oasis-ckpt --batch 1 --context 128 --steps 10 > /tmp/bench.out 2>&1
  tail -16 /tmp/bench.out
  rows+=("$(printf '%-20s %s' "load" "$(grep -E '^RESULT load' /tmp/bench.out | cut -c8-)")")
  rm -rf /tmp/oasis-ckpt
fi

# Tokenizer encode speed, ours vs HF tokenizers on the same text (needs .cache/test-data carried).
if [[ ${OASIS_BENCH:-1} == 1 && -f .cache/test-data/qwen3/tokenizer.json ]]; then
  python3 tools/bench_tokenizer.py --make-text /tmp/bench.txt --mb 8 > /dev/null
  for t in qwen3 llama3_1; do
    echo "=== tokenizer $t"
    hf=$(python3 tools/bench_tokenizer.py --tokenizer .cache/test-data/$t/tokenizer.json --text /tmp/bench.txt 2>&1)
    ours=$(.bundle/bin/bench_tokenizer .cache/test-data/$t/tokenizer.json /tmp/bench.txt 2>&1)
    echo "$hf"; echo "$ours"
    rows+=("$(printf '%-20s %s | %s' "tokenizer $t" "$(echo "$hf" | grep -E '^hf +whole' | head -1)" \
              "$(echo "$ours" | grep -E '^oasis +whole' | head -1)")")
  done
fi

# Structured rows' masks at a batch's step, on 1 and on 8 of the host's cores (RowEntriesOf, what
# the CUDA logits processor runs): 64 JSON-schema rows in lockstep.
if [[ ${OASIS_BENCH:-1} == 1 && -f .cache/test-data/qwen3/tokenizer.json && -x .bundle/bin/bench_structured ]]; then
  echo "=== bench_structured --rows 64 --threads 8"
  .bundle/bin/bench_structured --tokenizer .cache/test-data/qwen3/tokenizer.json --kind json \
    --rows 64 --threads 8 --steps 40 > /tmp/bench.out 2>&1
  cat /tmp/bench.out
  rows+=("$(printf '%-20s %s' "structured 64 rows" \
            "$(grep -E '^\| 64 \|' /tmp/bench.out | awk -F'|' '{printf "%s threads: %s ms; ", $3, $5}')")")
fi

# Peers on the same machine in the same run (PyTorch), for the ratios in docs/benchmarks.md.
for p in "${PEERS[@]}"; do
  echo "=== $p"
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 python3 $p > /tmp/peer.out 2>&1
  tail -30 /tmp/peer.out
  rows+=("$(printf '%-20s %s' "peer" "$(grep -E '^RESULT' /tmp/peer.out | tail -1 | cut -c8-)")")
done
# The trained embedded default (docs/trained_model.md): top-K agreement of the draft and
# previous-query predictors, sparse vs dense perplexity, the head's acceptance.
if [[ ${OASIS_EVAL_TRAINED:-0} == 1 ]]; then
  echo "=== tools/eval_trained_model.py"
  eval_out=${OUT:-/tmp}/eval-trained
  PYTHONUNBUFFERED=1 python3 tools/eval_trained_model.py --bin-dir .bundle/bin --backend cuda --windows 8 \
    --forced 256 --out-dir "$eval_out" --plot --budget-s "${OASIS_EVAL_BUDGET_S:-360}" > /tmp/eval.out 2>&1
  rc=$?
  cat /tmp/eval.out
  rows+=("$(printf '%-20s rc %s, %s' "eval trained" "$rc" \
            "$(grep -E '^ +4096 +(draft|previous-query) +16 +0.05 +[0-9]+ ' /tmp/eval.out | awk '{print $2 " dl " $5 " agree " $6 " ppl/dense " $(NF-2)}' | paste -sd';')")")
fi
# Speculation with real acceptance (issue 31): tokens per step, TPOT and first-draft acceptance by
# k on the trained default through oasis-server + oasis-bench (tools/eval_speculation.py; ~1
# minute). OASIS_SPECULATION_EVAL=1 turns it on; the held-out text as for OASIS_EVAL_TRAINED
# (.cache/train/corpus/val.txt.xz, or .bundle-pack/corpus/val.txt.xz when carried there).
if [[ ${OASIS_SPECULATION_EVAL:-0} == 1 ]]; then
  text=.cache/train/corpus/val.txt.xz
  [[ -f $text ]] || text=.bundle-pack/corpus/val.txt.xz
  echo "=== tools/eval_speculation.py ($text)"
  PYTHONUNBUFFERED=1 python3 tools/eval_speculation.py --bin-dir .bundle/bin --backend cuda --text "$text" \
    --prompts 8 --prompt-len 1024 --output-len 256 --concurrency 1 --temperatures 0 \
    --out-dir "${OUT:-/tmp}/speculation" > /tmp/spec.out 2>&1
  rc=$?
  tail -14 /tmp/spec.out
  rows+=("$(printf '%-20s rc %s, %s' "speculation" "$rc" "$(awk '$1 ~ /^(dense|sparse)$/ && NF >= 8 \
            {printf "%s k%s TPOT x%s tok/step %s accept %s; ", $1, $2, $5, $7, $8}' /tmp/spec.out)")")
fi
# Multi-turn serving with prefix caching on vs off (issue 33): two servers on dummy Qwen3-8B
# weights, one after the other in this call (about 3 minutes for both presets).
# OASIS_PREFIX_CACHE_BENCH=1 turns it on; OASIS_PREFIX_CACHE_WORKLOADS picks the presets.
if [[ ${OASIS_PREFIX_CACHE_BENCH:-0} == 1 ]]; then
  ws=()
  for w in ${OASIS_PREFIX_CACHE_WORKLOADS:-8k 24k}; do ws+=(--workload "$w"); done
  echo "=== tools/bench_prefix_cache.py ${ws[*]}"
  PYTHONUNBUFFERED=1 python3 tools/bench_prefix_cache.py "${ws[@]}" > /tmp/pc.out 2>&1
  tail -12 /tmp/pc.out
  while read -r line; do rows+=("$(printf '%-20s %s' "prefix cache" "${line#RESULT prefix_cache }")"); done \
    < <(grep -E '^RESULT prefix_cache' /tmp/pc.out)
fi
# Prefix caching on a disaggregated decode instance (issue 33): 16K prompts sharing a prefix of
# 0, 8K and 12K tokens; the admission bytes per request should fall in proportion (~3 minutes).
if [[ ${OASIS_DISAGG_PREFIX_BENCH:-0} == 1 ]]; then
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  dgpu=$((gpus > 1 ? 1 : 0))
  util=$([[ $dgpu == 1 ]] && echo 0.9 || echo 0.88)  # on one GPU it counts the prefill instance's
  echo "=== tools/bench_disagg.py --prefix-lens 0,8192,12288 (decode on GPU $dgpu)"
  PYTHONUNBUFFERED=1 python3 tools/bench_disagg.py --inputs 16384 --output-len 128 --rates 0.5 --num-prompts 8 \
    --prefix-lens 0,8192,12288 --modes full,rpf --fetch-ratios 0.05 --prefill-gpu 0 --decode-gpu "$dgpu" \
    --host-kv-gib 40 --prefill-host-kv-gib 8 --staging-pool-gib 24 --out-dir /tmp/disagg-prefix \
    --server-args "--gpu-memory-utilization $([[ $dgpu == 1 ]] && echo 0.9 || echo 0.42)" \
    --decode-server-args "--gpu-memory-utilization $util" > /tmp/dp.out 2>&1
  tail -9 /tmp/dp.out
  while read -r line; do rows+=("$(printf '%-20s %s' "disagg prefix" "$line")"); done < <(python3 - <<'PY'
import json
for r in json.load(open("/tmp/disagg-prefix/summary.json"))["runs"]:
    print(f"{r['mode']} prefix {r.get('prefix_len', 0)}: {r.get('status')}, admission "
          f"{r.get('admission_gib_per_request') or 0:.3f} GiB/req, held {r.get('decode_cached_tokens_per_request') or 0:.0f} tok/req")
PY
)
fi
# FP8 KV capacity (issue 34): --check-config of dummy Qwen3-8B with the KV cache in bf16 and
# in fp8, dense only (no draft head) and with sparse KV (the H200 box's 104 GiB host store):
# requests held at 16K and 32K (seconds each). OASIS_FP8_CAPACITY=1 turns it on.
if [[ ${OASIS_FP8_CAPACITY:-0} == 1 ]]; then
  mkdir -p /tmp/q8 && cp tools/bench/model_configs/qwen3-8b.json /tmp/q8/config.json
  cat > /tmp/cap.py <<'PY'
import json, sys
t = open(sys.argv[1]).read()
d = json.loads(t[:t.rindex("}") + 1])
print("; ".join(f"{c['tokens']} tok: dense {c['dense']}" + (f" sparse {c['sparse']} ({c['sparse_hbm']} + {c['sparse_host']})" if "sparse" in c else "")
                for c in d["resolved"]["capacity"]))
PY
  for mode in dense sparse; do
    for dtype in auto fp8; do
      extra=(--sparse off)
      [[ $mode == sparse ]] && extra=(--draft-load-format dummy --draft-vocab-size 32000 --lookahead reject --sparse on \
                                      --sparse-threshold 4096 --host-kv-gib 104)
      echo "=== oasis-server --check-config --kv-cache-dtype $dtype ($mode)"
      .bundle/bin/oasis-server --model /tmp/q8 --load-format dummy --backend cuda --max-model-len 40960 \
        --max-num-seqs 256 --kv-cache-dtype "$dtype" "${extra[@]}" --check-config > /tmp/cap.out 2>/tmp/cap.err
      rc=$?
      grep -E "KV cache|capacity|fp8|summaries" /tmp/cap.err | cut -c1-220
      rows+=("$(printf '%-20s %s' "fp8 capacity" "$mode kv $dtype (rc $rc): $(python3 /tmp/cap.py /tmp/cap.out 2>&1 | tail -1)")")
    done
  done
fi
# The adaptive fetch budget against the fixed one (issue 31, docs/sparse.md §13): 16K/1K x 32,
# every request sparse after 4K tokens (--sparse-switch threshold: under the pressure policy
# these requests fit the GPU pool and never switch) with its KV in the host store, so every
# admitted miss crosses PCIe. Reports tok/s, bytes per step, transfer waits, the caps and the
# fetched blocks' use at the end (~2 minutes). OASIS_FETCH_BUDGET_BENCH=1 turns it on.
if [[ ${OASIS_FETCH_BUDGET_BENCH:-0} == 1 ]]; then
  for budget in fixed adaptive; do
    echo "=== tools/bench_long_context.py 16K/1K x 32 sparse --sparse-budget $budget"
    PYTHONUNBUFFERED=1 python3 tools/bench_long_context.py --sweep fig11 --inputs 16384 --output-len 1024 \
      --modes sparse --concurrencies 32 --tokenizer "" --out-dir "/tmp/fb-$budget" \
      --server-args "--sparse-switch threshold --sparse-threshold 4096 --kv-home host --sparse-budget $budget" \
      > "/tmp/fb-$budget.out" 2>&1
    grep -E "^fig11" "/tmp/fb-$budget.out" | tail -1
    line=$(python3 - "/tmp/fb-$budget" <<'PY'
import glob, json, sys
r = json.load(open(sys.argv[1] + "/summary.json"))["runs"][0]
m, d = json.load(open(glob.glob(sys.argv[1] + "/runs/*.json")[0])).get("metrics_after") or {}, r.get("derived") or {}
caps = [int(v) for k, v in sorted(m.items()) if k.startswith("oasis:sparse_fetch_cap{")]
used = sum(v for k, v in m.items() if k.startswith("oasis:sparse_fetch_used_total{"))
sampled = sum(v for k, v in m.items() if k.startswith("oasis:sparse_fetch_sampled_total{"))
tok = (r.get("bench") or {}).get("output_throughput") or 0
print(f"{r['status']}, {tok:.1f} tok/s, H2D {(d.get('h2d_bytes_per_step') or 0) / 1e6:.1f} MB/step, "
      f"wait {d.get('transfer_wait_ms_per_step') or 0:.2f} ms/step, caps {min(caps or [0])}..{max(caps or [0])}, "
      f"backoffs {m.get('oasis:sparse_fetch_budget_backoffs_total', 0):.0f}, "
      f"fetched used {used / sampled if sampled else 0:.3f}")
PY
)
    rows+=("$(printf '%-20s %s' "fetch budget $budget" "$line")")
  done
fi
echo
echo "---------------- GPU suite summary ----------------"
printf '%s\n' "${rows[@]}"
exit $status
