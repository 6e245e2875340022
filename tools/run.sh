#!/usr/bin/env bash
# The main job, from a fresh machine: installs the Debian packages, configures and builds
# OasisKV (build/), then generates from the small embedded default model and prints the
# result. Extra arguments go to oasis-generate (e.g. --prompt-ids 1,5,9 --temperature 0.8).
# Until the HTTP server lands, this runs offline generation on the CPU reference backend.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/install_deps.sh >&2
cmake -S . -B build -G Ninja >&2
cmake --build build --target oasis-generate >&2
MODEL=${OASIS_MODEL:-tests/fixtures/models/qwen3-tiny-untied}
if [[ $# -eq 0 ]]; then
  set -- --prompt-ids 1,17,42,99 --max-tokens 24 --temperature 0.8 --seed 1
fi
exec ./build/tools/oasis-generate --model "$MODEL" "$@"
