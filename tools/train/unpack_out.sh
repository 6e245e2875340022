#!/usr/bin/env bash
# Dev machine: takes what a run_on_gpu.sh device call sent back (the files_at folder of the
# device tool's answer, holding state.tar.partNN, state.tar.sha256, log.txt, summary.txt),
# checks the checksum and replaces .cache/train/state with it (the previous one is kept as
# .cache/train/state.prev). The next device call carries .cache/train/state again.
#
#   tools/train/unpack_out.sh /work/.device/<...>/files_at
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SRC="${1:?usage: tools/train/unpack_out.sh FILES_AT_DIR}"
T="${TRAIN_DIR:-$ROOT/.cache/train}"
die() { echo "unpack_out: error: $*" >&2; exit 1; }

[ -f "$SRC/summary.txt" ] && { echo "== $SRC/summary.txt"; cat "$SRC/summary.txt"; echo; }
ls "$SRC"/state.tar.part* >/dev/null 2>&1 || die "no state.tar.part* in $SRC (see $SRC/log.txt)"
mkdir -p "$T"
tmp="$(mktemp -d "$T/unpack.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cat "$SRC"/state.tar.part* > "$tmp/state.tar"
if [ -f "$SRC/state.tar.sha256" ]; then
  [ "$(sha256sum "$tmp/state.tar" | cut -d' ' -f1)" = "$(cat "$SRC/state.tar.sha256")" ] ||
    die "checksum mismatch: the parts are incomplete or damaged"
fi
tar -C "$tmp" -xf "$tmp/state.tar"
[ -d "$tmp/state" ] || die "the archive holds no state/ folder"
rm -rf "$T/state.prev"
[ -d "$T/state" ] && mv "$T/state" "$T/state.prev"
mv "$tmp/state" "$T/state"
echo "unpack_out: $T/state:"
du -sh "$T/state"/* | sed 's/^/  /'
du -sh "$T/corpus" "$T/state" 2>/dev/null | sed 's/^/  carry: /'
