#!/usr/bin/env bash
# Checks the dependency order of docs/architecture.md §1: each layer includes only headers of
# the layers below it (and its own). Exits non-zero and prints every include that breaks it.
#   common → loader / tokenizer / parallel → kernels → backend → kvcache → models → runner
#   → disagg (wire, staged KV) → engine → disagg (transport: kv_transfer.*) → server;
#   router → common, disagg (wire, tickets, UCX; never the staged KV or the transport)
set -euo pipefail
cd "$(dirname "$0")/.."
# layer folder | the include prefixes it may use
RULES=(
  "src/common|common oasis"
  "src/loader|common oasis loader"
  "src/tokenizer|common oasis tokenizer"
  "src/parallel|common oasis parallel"
  "kernels|common oasis kernels include"
  "src/backend|common oasis kernels backend"
  "src/kvcache|common oasis kernels backend kvcache"
  "models|common oasis loader parallel kernels backend kvcache models"
  "src/runner|common oasis loader parallel kernels backend kvcache models runner"
  "src/engine|common oasis loader tokenizer parallel kernels backend kvcache models runner disagg engine"
  "src/router|common oasis router disagg"
)
bad=0
check() {  # folder, allowed prefixes, files (optional: all C++/CUDA files under the folder)
  local dir=$1 allowed=" $2 "
  shift 2
  local files=("$@")
  ((${#files[@]})) || mapfile -t files < <(find "$dir" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \))
  local line prefix
  while IFS= read -r line; do
    prefix=$(sed -E 's/.*#include "([a-z_0-9]+)\/.*/\1/' <<<"${line#*:*:}")
    if [[ $allowed != *" $prefix "* ]]; then
      echo "check_layers: $line  ($dir may include only:$allowed)" >&2
      bad=1
    fi
  done < <(grep -HnE '^#include "[a-z_0-9]+/' "${files[@]}" || true)
}
for rule in "${RULES[@]}"; do check "${rule%%|*}" "${rule#*|}"; done
# src/disagg: the wire formats and staged KV sit below the engine; only the transport's
# implementation of the engine's interfaces (kv_transfer.*) sits above it.
mapfile -t lower < <(find src/disagg -type f \( -name '*.h' -o -name '*.cpp' \) ! -name 'kv_transfer.*')
check src/disagg "common oasis loader parallel kernels backend kvcache models runner disagg" "${lower[@]}"
check src/disagg "common oasis loader parallel kernels backend kvcache models runner disagg engine" src/disagg/kv_transfer.*
# The router: the disagg wire, tickets and UCX (oasis_disagg), never the staged KV or the
# transport (they sit on kvcache and the engine).
while IFS= read -r line; do
  echo "check_layers: $line  (src/router may include only disagg's wire, tickets and UCX)" >&2
  bad=1
done < <(grep -rHnE '^#include "disagg/(staged_kv|kv_import|kv_requantize|kv_transfer)\.h"' src/router || true)
if ((bad)); then exit 1; fi
echo "check_layers: the dependency order holds"
