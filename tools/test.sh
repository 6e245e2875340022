#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs the Debian packages, fetches the
# real tokenizer files, configures and builds (build/), runs every CTest test (GPU tests
# are skipped when no GPU is present), then runs each libFuzzer target for a bounded time.
# First it checks the layers' include order (tools/check_layers.sh) and the formatting
# (tools/check_format.sh, .clang-format).
#   OASIS_FUZZ_SECONDS=0 skips the fuzzers.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/install_deps.sh
./tools/fetch_test_data.sh
./tools/check_layers.sh
./tools/check_format.sh
# ctest hands a test name to Catch as its filter: a name starting with "-" reads as a flag.
if grep -rnE 'TEST_CASE\("-' tests; then
  echo "test.sh: a TEST_CASE name starts with '-' (ctest would pass it to Catch as a flag)" >&2
  exit 1
fi
cmake -S . -B build -G Ninja
cmake --build build
ctest --test-dir build --output-on-failure -j "$(nproc)"
if [[ ${OASIS_FUZZ_SECONDS:-30} != 0 ]]; then
  ./tools/run_fuzzers.sh
fi
