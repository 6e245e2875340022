#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) in build-fuzz/ and runs each for a
# bounded time on its seed corpus (tests/fuzz/corpus/<name>/, copied so the repo stays clean).
#   OASIS_FUZZ_SECONDS  seconds per target (default 30)
# Exits non-zero when a target finds a crash, leak or timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${OASIS_FUZZ_SECONDS:-30}
ROOT=$(pwd)
BUILD=build-fuzz

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DOASIS_FUZZ=ON -DOASIS_CUDA=OFF -DOASIS_BUILD_TESTS=OFF >/dev/null
targets=$(ls tests/fuzz/fuzz_*.cpp 2>/dev/null | xargs -rn1 basename | sed 's/\.cpp$//')
if [[ -z "$targets" ]]; then echo "run_fuzzers: no fuzz targets"; exit 0; fi
cmake --build "$BUILD" --target $targets

status=0
for t in $targets; do
  name=${t#fuzz_}
  work=$(mktemp -d)
  if [[ -d tests/fuzz/corpus/$name ]]; then cp -r tests/fuzz/corpus/$name/. "$work/"; fi
  args=(-max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$work/")
  if [[ -f tests/fuzz/$name.dict ]]; then args+=(-dict="$ROOT/tests/fuzz/$name.dict"); fi
  echo "run_fuzzers: $t for ${SECONDS_PER_TARGET}s"
  if ! "$ROOT/$BUILD/tests/fuzz/$t" "${args[@]}" "$work" > "$work.log" 2>&1; then
    echo "run_fuzzers: $t FAILED"; tail -40 "$work.log"; status=1
  else
    grep -E "stat::number_of_executed_units|Done" "$work.log" | tail -2 || true
  fi
  rm -rf "$work" "$work.log"
done
exit $status
