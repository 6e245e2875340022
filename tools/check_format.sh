#!/usr/bin/env bash
# Checks that every C++/CUDA source under src/ kernels/ models/ tools/ and include/
# is formatted as .clang-format says (clang-format from Debian's package). Exits non-zero and
# lists the files that are not; `tools/check_format.sh --fix` formats them in place.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "check_format: clang-format is missing (tools/install_deps.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files -- src kernels models tools include |
                     grep -E '\.(h|hpp|cc|cpp|cu|cuh)$' | grep -v '^tests/fixtures/')
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "check_format: ${#bad[@]} file(s) differ from .clang-format (tools/check_format.sh --fix):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
