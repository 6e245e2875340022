#!/usr/bin/env bash
# Fetches the text packages of the training corpus from Debian's mirrors (dev machine, apt)
# and extracts them under .cache/corpus/ (git-ignored; the text is not committed).
#
#   tools/train/fetch_corpus.sh            # then: python3 tools/train/make_corpus.py
#
# Packages (docs/trained_model.md, "Corpus", says what each holds and its licence):
#   bible-kjv-text  King James Bible, in the BRS compressed format (public domain text)
#   bible-kjv       the BRS reader: used HERE to dump the text (needs libreadline8)
#   dict-gcide      GNU Collaborative International Dictionary of English (GPL-2+ !)
#   dict-jargon     The Jargon File 4.4.7 (public domain)
#   dict-devil      Ambrose Bierce, The Devil's Dictionary (public domain)
#   fortunes        fortune cookie files (BSD-licensed collection of quotations)
# fortunes-min is not fetched: its copyright file is the same as fortunes' (no public-domain
# statement for the cookie files); fortunes-off does not exist in Debian 12.
# Override the list with PACKAGES="..." (bible-kjv is always added when bible-kjv-text is).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${CORPUS_CACHE:-$ROOT/.cache/corpus}"
PACKAGES="${PACKAGES:-bible-kjv-text dict-gcide dict-jargon dict-devil fortunes}"
case " $PACKAGES " in *" bible-kjv-text "*) PACKAGES="$PACKAGES bible-kjv" ;; esac

die() { echo "fetch_corpus: $*" >&2; exit 1; }
command -v apt-get >/dev/null || die "apt-get not found (this script runs on the Debian dev machine)"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found"

mkdir -p "$CACHE/debs" "$CACHE/pkgs" "$CACHE/raw" "$CACHE/licenses"
cd "$CACHE/debs"
rm -f ./*.deb
# As root, apt warns that its sandbox user cannot write here; download as root quietly.
download() { apt-get -q -o APT::Sandbox::User=root download $PACKAGES; }
if ! download; then
  echo "fetch_corpus: apt-get download failed; running apt-get update once and retrying" >&2
  apt-get -q update >/dev/null || die "apt-get update failed (no access to Debian's mirrors?)"
  download || die "apt-get download $PACKAGES failed"
fi

: > "$CACHE/debs/SHA256SUMS"
for deb in ./*.deb; do
  name="$(dpkg-deb -f "$deb" Package)"
  version="$(dpkg-deb -f "$deb" Version)"
  rm -rf "$CACHE/pkgs/$name"
  dpkg-deb -x "$deb" "$CACHE/pkgs/$name"
  sha256sum "$deb" >> "$CACHE/debs/SHA256SUMS"
  echo "$name $version" >> "$CACHE/debs/VERSIONS.tmp"
  [ -f "$CACHE/pkgs/$name/usr/share/doc/$name/copyright" ] &&
    cp "$CACHE/pkgs/$name/usr/share/doc/$name/copyright" "$CACHE/licenses/$name.copyright"
done
sort "$CACHE/debs/VERSIONS.tmp" > "$CACHE/debs/VERSIONS" && rm -f "$CACHE/debs/VERSIONS.tmp"

# The KJV text is stored in the BRS "EC02" compressed format; its own reader dumps it, one
# verse per line ("Ge1:1 In the beginning ..."), 31,102 verses.
if [ -d "$CACHE/pkgs/bible-kjv-text" ]; then
  BIBLE="$CACHE/pkgs/bible-kjv/usr/bin/bible"
  DATA="$CACHE/pkgs/bible-kjv-text/usr/lib"
  [ -x "$BIBLE" ] || die "bible reader missing at $BIBLE"
  "$BIBLE" -f -p "$DATA" Gen1:1-Rev22:21 </dev/null > "$CACHE/raw/kjv.txt" ||
    die "the bible reader failed (is libreadline8 installed?)"
  verses="$(wc -l < "$CACHE/raw/kjv.txt")"
  [ "$verses" -eq 31102 ] || die "expected 31102 KJV verses, got $verses"
fi

echo "fetch_corpus: packages in $CACHE/pkgs:"
sed 's/^/  /' "$CACHE/debs/VERSIONS"
du -sh "$CACHE/debs" | sed 's/^/  .deb files: /'
echo "next: python3 tools/train/make_corpus.py"
