#!/usr/bin/env bash
# Dev machine, after the 16K-context variant's device call (tools/train/run_long_context.sh;
# docs/trained_model.md, "A 16K-context variant"): installs it beside the embedded default,
# never over it, from the state unpacked by tools/train/unpack_out.sh. By default only the logs,
# configs and the eval JSON (~0.2 MB); LC_WEIGHTS=1 also the weights (~4.8 MB):
#
#   models/trained-16k/             the served files of state/model (config.json,
#                                   generation_config.json, model.safetensors, tokenizer files):
#                                   oasis-server --model models/trained-16k --max-model-len 16384
#   models/trained-16k-eagle3/      state/eagle's config.json + model.safetensors (its head)
#   docs/data/trained_model_16k/    model_log.jsonl, eagle_log.jsonl, model_config.json,
#                                   eagle_config.json and, when given, the eval JSON
#                                   (eval16k.json) that came back in the same call
#
#   TRAIN_DIR=.cache/train16k tools/train/unpack_out.sh <files_at>
#   tools/train/install_long_context.sh .cache/train16k/state [<files_at>/eval16k.json]
#
# Refuses weights over LC_MAX_MB (default 6) in all: every later device call carries them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
S="${1:-$ROOT/.cache/train16k/state}"
EVAL="${2:-}"
die() { echo "install_long_context: error: $*" >&2; exit 1; }
for f in model/config.json model/generation_config.json model/model.safetensors model/tokenizer.json \
         model/tokenizer_config.json eagle/config.json eagle/model.safetensors model_log.jsonl eagle_log.jsonl; do
  [ -f "$S/$f" ] || die "$S/$f is missing (run the device call and unpack_out.sh first)"
done
python3 - "$S" "${LC_MAX_MB:-6}" "${LC_MIN_POSITIONS:-16384}" <<'PY' || die "not the 16K variant, or too large"
import json, os, sys
s, max_mb, min_pos = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
c = json.load(open(os.path.join(s, "model/config.json")))
assert c["max_position_embeddings"] >= min_pos, f"max_position_embeddings {c['max_position_embeddings']} < {min_pos}"
h = json.load(open(os.path.join(s, "eagle/config.json")))
assert h["target_hidden_size"] == c["hidden_size"], "the head is not this model's"
mb = sum(os.path.getsize(os.path.join(s, f)) for f in ("model/model.safetensors", "eagle/model.safetensors")) / 1e6
assert mb <= max_mb, f"{mb:.2f} MB of weights, over {max_mb} MB"
print(f"install_long_context: {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, "
      f"{c['max_position_embeddings']} positions; {mb:.2f} MB of weights")
PY
install_files() {  # DEST SRC_DIR FILE...
  local dest=$1 src=$2; shift 2
  rm -rf "$dest"; mkdir -p "$dest"
  for f in "$@"; do install -m 644 "$src/$f" "$dest/$f"; done
}
D="$ROOT/docs/data/trained_model_16k"
install_files "$D" "$S" model_log.jsonl eagle_log.jsonl
install -m 644 "$S/model/config.json" "$D/model_config.json"
install -m 644 "$S/eagle/config.json" "$D/eagle_config.json"
[ -z "$EVAL" ] || install -m 644 "$EVAL" "$D/eval16k.json"
if [ "${LC_WEIGHTS:-0}" = 1 ]; then
  install_files "$ROOT/models/trained-16k" "$S/model" config.json generation_config.json model.safetensors \
    tokenizer.json tokenizer_config.json
  install_files "$ROOT/models/trained-16k-eagle3" "$S/eagle" config.json model.safetensors
  du -sh "$ROOT/models/trained-16k" "$ROOT/models/trained-16k-eagle3"
else
  echo "install_long_context: logs, configs and eval only (LC_WEIGHTS=1 adds models/trained-16k*: every later" \
       "device call then carries them, and tree + the CUDA server bundle no longer fit in 64 MiB)"
fi
du -sh "$D"
