#!/usr/bin/env bash
# bench_tokenizer's command line: --help, argument errors (they were ignored: --reps 0/-1/abc ran
# once, --mode foo printed nothing and exited 0, unknown flags passed), a directory or an empty
# file as the text, and a real run.
# Usage: test_bench_tokenizer_cli.sh <bench_tokenizer> <repo root>
set -uo pipefail
BIN=$1
ROOT=$2
TOK=$ROOT/tests/fixtures/tiny-default/tokenizer.json
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'Hello world.\n\nA second document.\n' >"$tmp/text.txt"
: >"$tmp/empty.txt"
expect() {  # expect <description> <exit code> <pattern> <args...>
  local desc=$1 code=$2 pattern=$3 out rc
  shift 3
  out=$(timeout 60 "$BIN" "$@" 2>&1)
  rc=$?
  if [[ $rc == "$code" ]] && grep -qE -- "$pattern" <<<"$out"; then
    echo "ok: $desc"
  else
    echo "FAILED: $desc (exit $rc)"; echo "$out" | head -10; fail=1
  fi
}
expect "--help prints usage, exit 0" 0 "^usage: bench_tokenizer" --help
expect "--reps 0 is refused" 2 "--reps must be an integer in \[1, 1000000\], got '0'" "$TOK" "$tmp/text.txt" --reps 0
expect "--reps -1 is refused" 2 "--reps must be an integer" "$TOK" "$tmp/text.txt" --reps -1
expect "--reps abc is refused" 2 "--reps must be an integer" "$TOK" "$tmp/text.txt" --reps abc
expect "--mode foo is refused" 2 "--mode must be whole, docs or both, got 'foo'" "$TOK" "$tmp/text.txt" --mode foo
expect "an unknown flag is refused" 2 "unknown flag --bogus" "$TOK" "$tmp/text.txt" --bogus 1
expect "a flag without its value is refused" 2 "--reps needs a value" "$TOK" "$tmp/text.txt" --reps
expect "one argument is refused" 2 "expected 2 arguments" "$TOK"
expect "a directory as the text is refused" 1 "is a directory, not a text file" "$TOK" "$tmp"
expect "an empty text file is refused" 1 "is empty: nothing to encode" "$TOK" "$tmp/empty.txt"
expect "a run: docs mode" 0 "^oasis docs .* MB/s median of 2 .* 2 docs" "$TOK" "$tmp/text.txt" --reps 2 --mode docs
expect "a run: --reps=N form, whole mode" 0 "^oasis whole .* median of 3" "$TOK" "$tmp/text.txt" --reps=3 --mode=whole
exit $fail
