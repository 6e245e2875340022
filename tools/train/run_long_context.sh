#!/usr/bin/env bash
# The 16K-context variant of the trained default (docs/trained_model.md, "A 16K-context variant"):
# trains a small Qwen3 model + EAGLE-3 head at windows up to 16,384 tokens on the long-document
# corpus and measures top-K agreement (draft vs previous-query) and acceptance at 1K-16K with
# tools/eval_trained_model.py. Everything lives under TRAIN_DIR (default .cache/train16k).
#
#   tools/train/run_long_context.sh pack     dev machine: a server-only bundle of
#                                            build/src/server/oasis-server (OASIS_SERVER=...) ->
#                                            .cache/bundle16k/bundle.tar.xz (~9.2 MiB)
#   tools/train/run_long_context.sh unpack   device call A (carry .cache/bundle16k): unpacks it
#                                            there and checks that the server starts (~20 s)
#   tools/train/run_long_context.sh run      device call B, right after A while the machine is
#                                            warm (carry .cache/train16k/corpus): run_on_gpu.sh
#                                            model eagle, then the eval; writes into $OUT
#
# Why two calls: the tree (~54 MiB) + the CUDA server bundle (~9.2 MiB) + the corpus (~1.5 MiB)
# are over the 64 MiB a call carries, and so are tree + bundle + the trained model; a warm
# machine keeps the unpacked bundle (ignored paths stay between calls), so call B finds it.
# Without it call B still trains (the state comes back) and says the eval was skipped.
#
# $OUT gets (at most 8 files): state.tar.part00, state.tar.sha256, log.txt, summary.txt (from
# run_on_gpu.sh), eval16k.json, eval16k.log. Install with tools/train/unpack_out.sh (TRAIN_DIR=...)
# and tools/train/install_long_context.sh.
#
# Environment: LC_CALL_BUDGET_S (540: the whole call), LC_TRAIN_BUDGET_S (300: run_on_gpu.sh's
# part, packing included), LC_MODEL_S / LC_EAGLE_S (170 / 80: the training phases),
# LC_CONTEXTS (1024,4096,8192,16384), LC_WINDOWS (8), LC_FORCED (256), LC_TOPKS (16,32,64),
# LC_PREDICTORS (draft,previous-query), LC_BACKEND (cuda), LC_BIN_DIR (.cache/bundle16k/bin),
# LC_MODEL_ARGS / LC_EAGLE_ARGS (replace the shapes/windows below), LC_SMOKE=1 (the whole chain
# scaled down on the CPU: 1K windows, the dev build's server; tools/train/smoke_cpu.sh's python).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
export TRAIN_DIR="${TRAIN_DIR:-.cache/train16k}"
T=$TRAIN_DIR
B=.cache/bundle16k
PY="${PYTHON:-python3}"
die() { echo "run_long_context: error: $*" >&2; exit 2; }
SMOKE="${LC_SMOKE:-0}"

# The proposed shapes (docs/trained_model.md): 4 layers, hidden 128, 4 query / 2 KV heads of 64,
# MLP 256, RoPE theta 1e6, 20,480 positions; curriculum 4K then 16K windows; the head at 16K.
MODEL_ARGS="--layers 4 --hidden 128 --heads 4 --kv-heads 2 --head-dim 64 --intermediate 256 --rope-theta 1e6
  --max-positions 20480 --curriculum 4096@0,16384@0.5 --tokens-per-step 131072 --eval-every-s 10 --max-mb 8"
EAGLE_ARGS="--seq-len 16384 --tokens-per-step 65536 --draft-vocab 2048 --eval-every-s 10"
CONTEXTS="${LC_CONTEXTS:-1024,4096,8192,16384}"
WINDOWS="${LC_WINDOWS:-8}"
FORCED="${LC_FORCED:-256}"
THRESHOLD=256
TOPKS="${LC_TOPKS:-16,32,64}"
BACKEND="${LC_BACKEND:-cuda}"
BIN_DIR="${LC_BIN_DIR:-$B/bin}"
if [ "$SMOKE" = 1 ]; then  # the same flags at 1K windows, sized for 2 CPU cores
  MODEL_ARGS="--layers 4 --hidden 128 --heads 4 --kv-heads 2 --head-dim 64 --intermediate 256 --rope-theta 1e6
    --max-positions 1280 --curriculum 256@0,1024@0.5 --tokens-per-step 4096 --total-tokens 40960 --eval-tokens 4096 --max-mb 8"
  EAGLE_ARGS="--seq-len 1024 --tokens-per-step 4096 --total-tokens 16384 --eval-tokens 4096 --draft-vocab 2048"
  CONTEXTS="${LC_CONTEXTS:-512,1024}"; WINDOWS="${LC_WINDOWS:-2}"; FORCED="${LC_FORCED:-32}"; THRESHOLD=128
  TOPKS="${LC_TOPKS:-4,8}"; BACKEND="${LC_BACKEND:-cpu}"; BIN_DIR="${LC_BIN_DIR:-build/src/server}"
  MAX_MODEL_LEN=1024
  export TRAIN_SMOKE=1
fi
MODEL_ARGS="${LC_MODEL_ARGS:-$MODEL_ARGS}"
EAGLE_ARGS="${LC_EAGLE_ARGS:-$EAGLE_ARGS}"

case "${1:-run}" in
  pack)
    SERVER="${OASIS_SERVER:-build/src/server/oasis-server}"
    [ -x "$SERVER" ] || die "$SERVER is not built"
    rm -rf "$B" && mkdir -p "$B/pack/bin" "$B/pack/lib" || exit 1
    cp "$SERVER" "$B/pack/bin/" && strip --strip-all "$B/pack/bin/oasis-server" || exit 1
    ldd "$SERVER" | awk '/=> \// {print $3}' | while read -r lib; do   # as tools/make_bundle.sh
      case "$(basename "$lib")" in
        libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
        libcuda.so*|libcudart.so*|libcublas*|libnccl*|libnvidia*) ;;
        libssl.so.3|libcrypto.so.3) ;;  # OpenSSL 3: the GPU machine's own (5.4 MB less; not in .bundle-pack either)
        *) cp -n "$lib" "$B/pack/lib/" ;;
      esac
    done
    tar -C "$B/pack" -cf - bin lib | xz -T2 -9e > "$B/bundle.tar.xz" && rm -rf "$B/pack" || exit 1
    tree=$(git ls-files -z | xargs -0 stat -c %s | awk '{s+=$1} END {print s}')
    extra=$(git ls-files -z --others --exclude-standard | xargs -0 -r stat -c %s | awk '{s+=$1} END {print s+0}')
    a=$(( tree + extra + $(stat -c %s "$B/bundle.tar.xz") ))
    b=$(( tree + extra + $(du -sb "$T/corpus" 2>/dev/null | cut -f1) ))
    echo "run_long_context: $B/bundle.tar.xz $(stat -c %s "$B/bundle.tar.xz") bytes; tree $tree + untracked $extra bytes;" \
         "call A carries $a bytes, call B $b bytes, of 67108864 (64 MiB)"
    [ "$a" -le 67108864 ] || die "call A would carry $a bytes, over 64 MiB: the bundle or the tree must shrink"
    exit 0 ;;
  unpack)
    [ -f "$B/bundle.tar.xz" ] || die "no $B/bundle.tar.xz: carry $B (made by '$0 pack')"
    rm -rf "$B/bin" "$B/lib" && tar -C "$B" -xJf "$B/bundle.tar.xz" || die "unpacking failed"
    CUDA_LIB=$(dirname "$(ls /usr/local/cuda*/targets/x86_64-linux/lib/libcublas.so.* 2>/dev/null | head -1)")
    LD_LIBRARY_PATH="$PWD/$B/lib:$CUDA_LIB:${LD_LIBRARY_PATH:-}" "$B/bin/oasis-server" --help > /tmp/lc-help.txt 2>&1 ||
      { head -5 /tmp/lc-help.txt; die "the bundled server does not start"; }
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
    echo "run_long_context: $B/bin ready; now, within 30 s, call B: tools/train/run_long_context.sh run"
    exit 0 ;;
  run) ;;
  *) die "usage: $0 [pack|unpack|run]" ;;
esac

START=$(date +%s)
CALL_S="${LC_CALL_BUDGET_S:-540}"
OUT="${OUT:-$T/out}"
mkdir -p "$OUT" "$T/state/tokenizer"
ls "$T"/corpus/train.txt* > /dev/null 2>&1 ||
  die "no corpus in $T/corpus: make_corpus.py --kjv-max-doc-chars 240000 --kjv-book-runs --out-dir .cache/corpus/out16k --carry-dir $T/corpus, and carry it"
# The embedded default's tokenizer (8,192 ids): in the tree, nothing to carry.
cp models/embedded/tokenizer.json models/embedded/tokenizer_config.json "$T/state/tokenizer/"
echo "run_long_context: $(date -u +%FT%TZ); model: $(echo $MODEL_ARGS); head: $EAGLE_ARGS"
# shellcheck disable=SC2086
TRAIN_FRESH=1 TRAIN_CALL_BUDGET_S="${LC_TRAIN_BUDGET_S:-300}" \
  TRAIN_BUDGET_S_MODEL="${LC_MODEL_S:-170}" TRAIN_BUDGET_S_EAGLE="${LC_EAGLE_S:-80}" \
  TRAIN_EXTRA_ARGS_MODEL="$MODEL_ARGS ${TRAIN_EXTRA_ARGS_MODEL:-}" TRAIN_EXTRA_ARGS_EAGLE="$EAGLE_ARGS ${TRAIN_EXTRA_ARGS_EAGLE:-}" \
  OUT="$OUT" tools/train/run_on_gpu.sh model eagle
rc=$?
[ "$rc" = 0 ] || die "training failed (exit status $rc; $OUT/log.txt)"
[ -x "$BIN_DIR/oasis-server" ] ||
  die "no $BIN_DIR/oasis-server: the eval is skipped (run call A, '$0 unpack' with .cache/bundle16k carried, just before)"
left=$(( CALL_S - ($(date +%s) - START) ))
budget=$(( left - 70 ))   # the eval stops starting sparse servers then; one in flight and the copy follow
[ "$budget" -ge 30 ] || die "only ${left}s left for the eval"
echo "run_long_context: eval, ${left}s left (--budget-s $budget)"
"$PY" tools/eval_trained_model.py --bin-dir "$BIN_DIR" --backend "$BACKEND" --model "$T/state/model" \
  --draft-model "$T/state/eagle" --text "$T/corpus/val.txt.xz" --out-dir "$T/eval" --contexts "$CONTEXTS" \
  --windows "$WINDOWS" --forced "$FORCED" --threshold "$THRESHOLD" --topks "$TOPKS" \
  --predictors "${LC_PREDICTORS:-draft,previous-query}" --fetch-ratios 0.05 --budget-s "$budget" \
  --max-model-len "${MAX_MODEL_LEN:-0}" \
  > "$OUT/eval16k.log" 2>&1
rc=$?
tail -40 "$OUT/eval16k.log"
cp "$T/eval/eval.json" "$OUT/eval16k.json" 2>/dev/null
echo "run_long_context: eval exit status $rc; $(( $(date +%s) - START ))s in all"
exit $rc
