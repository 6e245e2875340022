#!/usr/bin/env bash
# Dev machine, after the device calls (docs/trained_model.md): installs the trained model as
# the embedded default and commits-ready fixtures, from .cache/train/state/ (unpack_out.sh):
#
#   models/embedded/          the served files of state/model (config.json,
#                             generation_config.json, model.safetensors, tokenizer.json,
#                             tokenizer_config.json): what oasis-server serves with no --model
#   models/embedded-eagle3/   state/eagle's config.json + model.safetensors (the EAGLE-3 head)
#   tests/fixtures/trained/   export_check.py's reference outputs (model_reference.safetensors,
#                             eagle_reference.safetensors, manifest.json, samples.txt) and
#                             train_tokenizer.py's tokenizer_cases.jsonl + tokenizer_summary.json
#   docs/data/trained_model/  the training logs (model_log.jsonl, eagle_log.jsonl) for the plots
#
#   tools/train/install_embedded.sh [STATE_DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
S="${1:-$ROOT/.cache/train/state}"
die() { echo "install_embedded: error: $*" >&2; exit 1; }
for f in model/config.json model/generation_config.json model/model.safetensors model/tokenizer.json \
         model/tokenizer_config.json eagle/config.json eagle/model.safetensors \
         reference/model_reference.safetensors reference/eagle_reference.safetensors reference/manifest.json \
         reference/samples.txt tokenizer/tokenizer_cases.jsonl tokenizer/tokenizer_summary.json \
         model_log.jsonl eagle_log.jsonl; do
  [ -f "$S/$f" ] || die "$S/$f is missing (run the device calls and tools/train/unpack_out.sh first)"
done
# The reference outputs must be those of these weights.
python3 - "$S" <<'PY' || die "reference/manifest.json does not describe these weights"
import json, os, sys
s = sys.argv[1]
m = json.load(open(os.path.join(s, "reference/manifest.json")))
assert m["model_safetensors_bytes"] == os.path.getsize(os.path.join(s, "model/model.safetensors"))
assert m["eagle"]["safetensors_bytes"] == os.path.getsize(os.path.join(s, "eagle/model.safetensors"))
PY
install_files() {  # DEST SRC_DIR FILE...
  local dest=$1 src=$2; shift 2
  rm -rf "$dest"; mkdir -p "$dest"
  for f in "$@"; do install -m 644 "$src/$f" "$dest/$f"; done
}
install_files "$ROOT/models/embedded" "$S/model" config.json generation_config.json model.safetensors \
  tokenizer.json tokenizer_config.json
install_files "$ROOT/models/embedded-eagle3" "$S/eagle" config.json model.safetensors
F="$ROOT/tests/fixtures/trained"  # kept: trained.jsonl (tools/gen_tokenizer_cases.py --trained)
mkdir -p "$F"
install -m 644 "$S/reference/eagle_reference.safetensors" "$S/reference/manifest.json" "$S/reference/samples.txt" \
  "$S/tokenizer/tokenizer_cases.jsonl" "$S/tokenizer/tokenizer_summary.json" "$F/"
# model_reference without the per-step greedy logits (no test reads them for this model; the
# device calls' working tree is limited to 64 MiB): the same tensors and bytes otherwise.
python3 - "$S/reference/model_reference.safetensors" "$F/model_reference.safetensors" <<'PY'
import json, struct, sys
src, dst = sys.argv[1:]
with open(src, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
out, blobs, off = {}, [], 0
for name, t in header.items():
    if name == "__metadata__":
        out[name] = dict(t, trimmed="greedy_logits dropped by tools/train/install_embedded.sh")
        continue
    if name.endswith(".greedy_logits"):
        continue
    a, b = t["data_offsets"]
    out[name] = dict(t, data_offsets=[off, off + b - a])
    blobs.append(data[a:b])
    off += b - a
head = json.dumps(out, separators=(",", ":")).encode()
head += b" " * (-len(head) % 8)
with open(dst, "wb") as f:
    f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))
PY
install_files "$ROOT/docs/data/trained_model" "$S" model_log.jsonl eagle_log.jsonl
du -sh "$ROOT/models/embedded" "$ROOT/models/embedded-eagle3" "$ROOT/tests/fixtures/trained" "$ROOT/docs/data/trained_model"
