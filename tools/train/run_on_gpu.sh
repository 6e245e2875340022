#!/usr/bin/env bash
# Device-side driver of the small-model training (docs/trained_model.md has the exact device
# calls, their carry lists and what comes back). Runs in the repository root on the GPU machine:
#
#   tools/train/run_on_gpu.sh PHASE [PHASE ...]
#
# Phases, in order of use (several may share one call; each stays inside the call's budget):
#   check      environment only: python3, torch + CUDA, transformers, tokenizers, safetensors,
#              the carried corpus and state (always run first, whatever the phases)
#   tokenizer  train_tokenizer.py          -> .cache/train/state/tokenizer/
#   model      train_model.py --fresh      -> .cache/train/state/model/ (refuses to overwrite a
#              trained model unless TRAIN_FRESH=1)
#   resume     train_model.py --resume     (continues state/model/, or the exact full
#              checkpoint in .cache/train/work/ when the machine is still warm)
#   eagle      train_eagle3.py --fresh, or --resume when state/eagle/ exists
#   export     export_check.py             -> .cache/train/state/reference/
#
# Reads .cache/train/corpus/ (carried; made by make_corpus.py) and .cache/train/state/
# (carried from the previous call). Writes the whole state back through $OUT as
# state.tar.partNN (15 MiB pieces; tools/train/unpack_out.sh reassembles them here), with
# state.tar.sha256, log.txt (everything printed) and summary.txt.
#
# Environment: TRAIN_CALL_BUDGET_S (default 540: the whole call, well inside the 600 s device
# limit), TRAIN_EXTRA_ARGS_MODEL / TRAIN_EXTRA_ARGS_EAGLE (extra flags, e.g. "--compile" or
# "--total-tokens 2e8"), TRAIN_BUDGET_S_MODEL / TRAIN_BUDGET_S_EAGLE (a training phase's seconds
# instead of its equal share of what is left; model covers resume too), TRAIN_FRESH=1, PYTHON
# (default python3), TRAIN_SMOKE=1 (a CPU test of the driver itself: --smoke everywhere, only
# torch + numpy required; see docs/trained_model.md).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
T="${TRAIN_DIR:-.cache/train}"
STATE=$T/state
CORPUS=$T/corpus
WORK=$T/work
OUT="${OUT:-$T/out}"
BUDGET_S="${TRAIN_CALL_BUDGET_S:-540}"
START=$(date +%s)
PY="${PYTHON:-python3}"
SMOKE=""
[ "${TRAIN_SMOKE:-0}" = 1 ] && SMOKE=--smoke
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true TRAIN_SMOKE="${TRAIN_SMOKE:-0}"
mkdir -p "$OUT" "$STATE" "$WORK"
exec > >(tee -a "$OUT/log.txt") 2>&1
TEE_PID=$!

die() { echo "run_on_gpu: error: $*" >&2; exit 2; }
remaining() { echo $(( BUDGET_S - ($(date +%s) - START) )); }

pack() {
  local rc=$?
  echo "run_on_gpu: packing $STATE into $OUT (exit status $rc, $(( $(date +%s) - START ))s used)"
  rm -rf "$STATE"/*.tmp "$STATE"/*.old
  tar -C "$T" -cf "$WORK/state.tar" state
  local bytes; bytes=$(stat -c %s "$WORK/state.tar")
  if [ "$bytes" -gt $(( 60 * 1024 * 1024 )) ]; then
    echo "run_on_gpu: error: the state is $(( bytes / 1048576 )) MiB, over the 60 MiB that can come back; not returned"
  else
    split -b 15m -d -a 2 "$WORK/state.tar" "$OUT/state.tar.part"
    sha256sum "$WORK/state.tar" | cut -d' ' -f1 > "$OUT/state.tar.sha256"
  fi
  { echo "exit status $rc; phases: $PHASES; $(( $(date +%s) - START ))s"; echo; ls -la "$STATE" "$STATE"/*/ 2>/dev/null
    for f in "$STATE"/*_log.jsonl; do [ -f "$f" ] && { echo; echo "== tail $f"; tail -n 5 "$f"; }; done
  } > "$OUT/summary.txt" 2>&1
  rm -f "$WORK/state.tar"
  exec 1>&- 2>&-
  wait "$TEE_PID" 2>/dev/null
  exit $rc
}

PHASES="$*"
[ -n "$PHASES" ] || die "usage: tools/train/run_on_gpu.sh PHASE [PHASE ...] (check tokenizer model resume eagle export)"
for p in $PHASES; do
  case "$p" in check|tokenizer|model|resume|eagle|export) ;; *) die "unknown phase '$p'";; esac
done
trap pack EXIT

echo "run_on_gpu: phases: $PHASES; budget ${BUDGET_S}s; $(date -u +%FT%TZ)"
"$PY" - <<'EOF' || die "the python environment is not usable (see above)"
import os, sys
missing = []
smoke = os.environ.get("TRAIN_SMOKE") == "1"
for name in ("torch", "numpy") + (() if smoke else ("transformers", "tokenizers", "safetensors", "jinja2")):
    try:
        mod = __import__(name)
        print(f"  {name} {getattr(mod, '__version__', '?')}")
    except ImportError:
        missing.append(name)
if missing:
    sys.exit(f"missing python packages: {', '.join(missing)}")
import torch
if torch.cuda.is_available():
    print(f"  cuda: {torch.cuda.get_device_name(0)}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
elif not smoke:
    sys.exit("no CUDA device visible to torch")
EOF
needs_corpus=0
for p in $PHASES; do case "$p" in tokenizer|model|resume|eagle) needs_corpus=1;; esac; done
if [ "$needs_corpus" = 1 ]; then
  ls "$CORPUS"/train.txt* "$CORPUS"/val.txt* >/dev/null 2>&1 ||
    die "no corpus in $CORPUS: carry .cache/train/corpus (make it with tools/train/make_corpus.py)"
fi
echo "run_on_gpu: carried state:"; ls -la "$STATE" "$STATE"/*/ 2>/dev/null | sed 's/^/  /'

# Seconds for the training phase $1 of the remaining ones: an equal share of what is left,
# less the export (60 s) when it follows, less 25 s for packing.
share() {
  local left=0 after_export=0 seen=0 p
  for p in $PHASES; do
    [ "$p" = "$1" ] && seen=1
    [ "$seen" = 1 ] || continue
    case "$p" in model|resume|eagle) left=$((left + 1));; export) after_export=60;; tokenizer) after_export=$((after_export + 90));; esac
  done
  local s=$(( ($(remaining) - 25 - after_export) / (left > 0 ? left : 1) ))
  [ "$s" -ge 60 ] || die "only ${s}s left for phase $1: give it its own call"
  echo "$s"
}

run_phase() {
  local p=$1 budget
  echo; echo "run_on_gpu: === phase $p ($(remaining)s left) ==="
  case "$p" in
    check) ;;
    tokenizer)
      "$PY" tools/train/train_tokenizer.py --corpus "$CORPUS" --out "$STATE/tokenizer" ;;
    model)
      if [ -f "$STATE/model/trainer_state.json" ] && [ "${TRAIN_FRESH:-0}" != 1 ]; then
        die "$STATE/model holds a trained model: use phase 'resume', or TRAIN_FRESH=1 to start over"
      fi
      budget=${TRAIN_BUDGET_S_MODEL:-$(share model)} || exit 2
      "$PY" tools/train/train_model.py --fresh --corpus "$CORPUS" --tokenizer "$STATE/tokenizer" \
        --out "$STATE/model" --work "$WORK" --time-budget-s "$budget" $SMOKE ${TRAIN_EXTRA_ARGS_MODEL:-} ;;
    resume)
      budget=${TRAIN_BUDGET_S_MODEL:-$(share resume)} || exit 2
      "$PY" tools/train/train_model.py --resume --corpus "$CORPUS" --tokenizer "$STATE/tokenizer" \
        --out "$STATE/model" --work "$WORK" --time-budget-s "$budget" $SMOKE ${TRAIN_EXTRA_ARGS_MODEL:-} ;;
    eagle)
      budget=${TRAIN_BUDGET_S_EAGLE:-$(share eagle)} || exit 2
      local mode=--fresh
      [ -f "$STATE/eagle/trainer_state.json" ] && mode=--resume
      "$PY" tools/train/train_eagle3.py $mode --target "$STATE/model" --corpus "$CORPUS" \
        --out "$STATE/eagle" --work "$WORK" --time-budget-s "$budget" $SMOKE ${TRAIN_EXTRA_ARGS_EAGLE:-} ;;
    export)
      "$PY" tools/train/export_check.py --model "$STATE/model" --eagle "$STATE/eagle" --out "$STATE/reference" ;;
  esac
}

for p in $PHASES; do
  run_phase "$p" || die "phase $p failed (exit status $?)"
done
echo "run_on_gpu: all phases done in $(( $(date +%s) - START ))s"
