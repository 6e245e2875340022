#!/usr/bin/env bash
# Runs every GPU test (and, as they land, GPU benchmarks) on the GPU machine from a bundle
# made here, and prints a short table last.
#
# Here:   cmake --build build && tools/gpu_suite.sh --bundle    (packs .bundle/)
# There:  tools/gpu_suite.sh                                     (runs from .bundle/)
#   device run: command "tools/gpu_suite.sh", carry [".bundle"]
set -uo pipefail
cd "$(dirname "$0")/.."
GPU_TESTS=(test_gpu_runtime test_gpu_ops test_gpu_models)
BENCHMARKS=()

if [[ ${1:-} == --bundle ]]; then
  exes=()
  for t in "${GPU_TESTS[@]}"; do exes+=("build/tests/kernels/$t"); done
  for b in "${BENCHMARKS[@]}"; do exes+=("build/tools/$b"); done
  exec tools/make_bundle.sh "${exes[@]}"
fi

CUDA_LIB=$(dirname "$(ls /usr/local/cuda*/targets/x86_64-linux/lib/libcublas.so.* 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=".bundle/lib:${CUDA_LIB}:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
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
for b in "${BENCHMARKS[@]}"; do
  echo "=== $b"
  ".bundle/bin/$b" 2>&1 | tee "/tmp/$b.out" | tail -30
  rows+=("$(printf '%-20s %s' "$b" "$(grep -E '^RESULT' "/tmp/$b.out" | tail -1)")")
done
echo
echo "---------------- GPU suite summary ----------------"
printf '%s\n' "${rows[@]}"
exit $status
