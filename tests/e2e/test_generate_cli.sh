#!/usr/bin/env bash
# oasis-generate end to end: token ids in and out on a committed fixture model; text and
# chat prompts through the real Qwen3 tokenizer and chat template (dummy weights at a
# small shape with the real vocabulary); clear errors for bad input.
# Usage: test_generate_cli.sh <oasis-generate> <repo root>. Exit 77 = skipped.
set -uo pipefail
GEN=$1
ROOT=$2
CACHE=${OASIS_TEST_CACHE:-$ROOT/.cache/test-data}
fail=0
check() {  # check <description> <command output> <pattern>
  if grep -qE -- "$3" <<<"$2"; then echo "ok: $1"; else echo "FAILED: $1"; echo "$2" | head -20; fail=1; fi
}

out=$("$GEN" --model "$ROOT/tests/fixtures/models/llama-tiny-rope-scaling" --prompt-ids 1,17,42 --max-tokens 5 2>&1)
check "ids in, 5 ids out" "$out" "^output 0 ids: [0-9]+(,[0-9]+){4}$"
out=$("$GEN" --model "$ROOT/tests/fixtures/models/qwen3-tiny" --prompt-ids 1,2 --n 2 --temperature 0.9 --seed 4 2>&1)
check "n=2 gives two outputs" "$out" "^output 1 ids:"
out=$("$GEN" --model "$ROOT/tests/fixtures/models/qwen3-tiny" --prompt-ids 1,999 2>&1)
check "out-of-vocabulary id is an error" "$out" "INVALID_ARGUMENT.*outside the vocabulary"
out=$("$GEN" --model "$ROOT/tests/fixtures/models/qwen3-tiny" --prompt-ids 1 --top-p 0 --temperature 1 2>&1)
check "bad top_p is an error" "$out" "INVALID_ARGUMENT.*top_p"
# Ranges are checked before anything is sized from them (a huge --n threw std::length_error;
# a huge --max-tokens wrapped past the context check).
for bad in "--n 0" "--n 1025" "--n 9223372036854775807" "--max-tokens 0" "--max-tokens 9223372036854775807" \
           "--threads -1" "--threads 4294967297"; do
  out=$("$GEN" --model "$ROOT/tests/fixtures/models/qwen3-tiny" --prompt-ids 1,2 $bad 2>&1)
  check "$bad is refused" "$out" "INVALID_ARGUMENT.*${bad%% *}"
done
out=$("$GEN" --model "$ROOT/tests/fixtures/models/qwen3-tiny/config.json" --prompt-ids 1 2>&1)
check "--model naming a file is refused as such" "$out" "INVALID_ARGUMENT.*is a file"
out=$("$GEN" --model /nonexistent --prompt-ids 1 2>&1)
check "missing model is an error" "$out" "NOT_FOUND"
out=$("$GEN" --model "$ROOT/tests/fixtures/models/qwen3-tiny" --prompt "hi" 2>&1)
check "text without a tokenizer is an error" "$out" "NOT_FOUND.*tokenizer.json"

# QA round 3: every bad input is an error exit (rc 1), never an abort, a hang or a wrap.
TINY=$ROOT/tests/fixtures/tiny-default  # has tokenizer.json and a chat template
qa=$(mktemp -d)
trap 'rm -rf "$qa"' EXIT
gen() { timeout 60 "$GEN" "$@" 2>&1; echo "rc=$?"; }
out=$(gen --model "$TINY" --prompt-ids 1,2,3 --max-tokens 500000000)
check "--max-tokens past the context: OUT_OF_RANGE before the KV pool is sized (was SIGABRT)" "$out" \
  "OUT_OF_RANGE: prompt \(3 tokens\) \+ max_tokens \(500000000\) exceeds the context length"
out=$(gen --model "$TINY" --prompt-ids 1 --top-k 4294967297)
check "--top-k past int32 is refused (wrapped to 1)" "$out" "INVALID_ARGUMENT: --top-k must be in \[-1"
out=$(gen --model "$TINY" --prompt-ids 1 --top-k -2)
check "--top-k -2 is refused" "$out" "INVALID_ARGUMENT: --top-k"
out=$(gen --model "$TINY" --prompt-ids 1,2 --seed 9223372036854775807 --n 2 --temperature 1 --max-tokens 2)
check "--seed INT64_MAX with --n 2 runs (seed + i modulo 2^64)" "$out" "^output 1 ids:"
for ids in "1,2," ",1" "1,,2"; do
  out=$(gen --model "$TINY" --prompt-ids "$ids")
  check "--prompt-ids '$ids' (empty item) is refused" "$out" "INVALID_ARGUMENT: --prompt-ids.*empty item"
done
out=$(gen --model "$TINY" --prompt-ids 1 --tokenizer /nonexistent)
check "--tokenizer that does not exist is an error with --prompt-ids too" "$out" "NOT_FOUND: --tokenizer: no /nonexistent"
out=$(gen --model "$TINY" --prompt hello --tokenizer "$TINY" --max-tokens 2)
check "--tokenizer DIR means DIR/tokenizer.json (as oasis-server)" "$out" "^output 0 ids:"
mkdir "$qa/tpl_dir"; : > "$qa/empty.jinja"
out=$(gen --model "$TINY" --chat hi --chat-template "$qa/tpl_dir")
check "--chat-template DIR is refused as a directory" "$out" "INVALID_ARGUMENT: --chat-template .* is a directory"
out=$(gen --model "$TINY" --chat hi --chat-template "$qa/empty.jinja")
check "--chat-template of an empty file is refused as empty" "$out" "INVALID_ARGUMENT: --chat-template .* is empty"
for kind in zero fifo dir tokzero; do
  mkdir "$qa/$kind"; cp "$TINY"/* "$qa/$kind/"
done
ln -sf /dev/zero "$qa/zero/config.json"
rm "$qa/fifo/config.json"; mkfifo "$qa/fifo/config.json"
rm "$qa/dir/config.json"; mkdir "$qa/dir/config.json"
ln -sf /dev/zero "$qa/tokzero/tokenizer.json"
out=$(gen --model "$qa/zero" --prompt-ids 1)
check "config.json -> /dev/zero is refused (was bad_alloc)" "$out" "INVALID_ARGUMENT: .*config.json: model config is not a regular file"
out=$(gen --model "$qa/fifo" --prompt-ids 1)
check "config.json as a FIFO is refused (hung)" "$out" "INVALID_ARGUMENT: .*config.json: model config is not a regular file"
out=$(gen --model "$qa/dir" --prompt-ids 1)
check "config.json as a directory says so" "$out" "INVALID_ARGUMENT: .*config.json: model config is a directory"
out=$(gen --model "$qa/tokzero" --prompt-ids 1)
check "tokenizer.json -> /dev/zero is refused (was bad_alloc)" "$out" "INVALID_ARGUMENT: .*tokenizer.json: tokenizer is not a regular file"
mkdir "$qa/big"
python3 - "$TINY/config.json" "$qa/big/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c.update(vocab_size=2147483647, hidden_size=16777216)
json.dump(c, open(sys.argv[2], "w"))
PY
out=$(gen --model "$qa/big" --load-format dummy --prompt-ids 1)
check "dummy weights larger than the machine's memory: RESOURCE_EXHAUSTED (was SIGABRT)" "$out" \
  "RESOURCE_EXHAUSTED: the model's weights need .* GiB of host memory"
mkdir "$qa/hd2"; cp "$TINY"/* "$qa/hd2/"
python3 - "$TINY/config.json" "$qa/hd2/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c.update(head_dim=2, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
json.dump(c, open(sys.argv[2], "w"))
PY
out=$(gen --model "$qa/hd2" --prompt-ids 1)
check "dynamic RoPE with head_dim 2 is a config error (was a CHECK abort)" "$out" \
  "INVALID_ARGUMENT: .*config.json: dynamic RoPE scaling needs head_dim > 2"

if [[ ! -f $CACHE/qwen3/tokenizer.json ]]; then
  echo "skipping text/chat checks: no $CACHE/qwen3 (run tools/fetch_test_data.sh)"
  [[ $fail == 0 ]] && exit 77 || exit 1
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir" "$qa"' EXIT
cp "$CACHE/qwen3/tokenizer.json" "$CACHE/qwen3/tokenizer_config.json" "$dir/"
cat > "$dir/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
 "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 151936,
 "max_position_embeddings": 512, "rope_theta": 1000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
 "eos_token_id": 151645, "torch_dtype": "bfloat16"}
JSON
out=$("$GEN" --model "$dir" --load-format dummy --chat "Hello there" --max-tokens 3 2>&1)
# <|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n
check "chat prompt rendered by the Qwen3 template" "$out" "^prompt ids: 151644,872,198,9707,1052,151645,198,151644,77091,198$"
check "chat output decoded to text" "$out" "^output 0 text: "
out=$("$GEN" --model "$dir" --load-format dummy --prompt "Hello world" --max-tokens 2 2>&1)
check "text prompt encoded" "$out" "^prompt ids: 9707,1879$"
out=$("$GEN" --model "$dir" --load-format dummy --chat "x" --chat-template /nonexistent 2>&1)
check "missing chat template file is an error" "$out" "NOT_FOUND.*chat-template"
echo "{% if true %}{{ raise_exception('no system role') }}{% endif %}" > "$dir/bad.jinja"
out=$("$GEN" --model "$dir" --load-format dummy --chat "x" --chat-template "$dir/bad.jinja" 2>&1)
check "raise_exception in a template is a clear error" "$out" "INVALID_ARGUMENT.*no system role"
exit $fail
