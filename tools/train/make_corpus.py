#!/usr/bin/env python3
"""Turns the Debian text packages fetched by fetch_corpus.sh into the training corpus.

Reads .cache/corpus/pkgs/ (and .cache/corpus/raw/kjv.txt, the KJV dumped by the package's own
reader) and writes
  .cache/corpus/out/{train,val}.txt      plain UTF-8 (NFC); documents separated by a line
                                         holding only <|endoftext|>
  .cache/corpus/out/manifest.json        sizes per source, seed, package versions, hashes
  .cache/train/corpus/{train,val}.txt.xz the same text, compressed: what the GPU runs carry
                                         (docs/trained_model.md)

Units and documents, per source:
  kjv      a chapter ("Genesis 1", then one numbered verse a line); a document is a run of
           consecutive chapters of one book, at most --max-doc-chars (--kjv-max-doc-chars);
           with --kjv-book-runs, a run of whole consecutive books up to that size (a longer
           book is split into chapter runs of at most that size), for long-context training.
  gcide    a dictionary entry: pronunciations (\\Co*ag"u*late\\), source tags ([1913 Webster],
  jargon   [WordNet 1.5], [PJC], ...) and cross-reference braces ({Cogent}) stripped, GCIDE's
  devil    character codes ([ae], ['e], [=a], ...) mapped to Unicode, hard-wrapped prose
           re-flowed into one line a paragraph (verse and tables keep their lines); a document
           is a run of consecutive entries (dictionary order), at most --max-doc-chars.
  fortunes a fortune cookie; a document is a run of consecutive cookies of one file, "%"
           lines between them, at most --max-doc-chars / 2. ascii-art is skipped.
Units are deduplicated (whitespace-normalised, case-folded text) within and across sources,
then documents are shuffled with --seed and split per source into train / val
(--val-fraction of each source's documents, at least one). Standard library only.

Usage: python3 tools/train/make_corpus.py [--sources kjv,jargon,devil]   (the default: public domain
       only; gcide (GPL-2+) and fortunes (no public-domain statement) on request)
  The long-document corpus of the 16K-context variant (docs/trained_model.md):
       python3 tools/train/make_corpus.py --kjv-max-doc-chars 240000 --kjv-book-runs \
           --out-dir .cache/corpus/out16k --carry-dir .cache/train16k/corpus
"""
import argparse
import base64
import gzip
import hashlib
import json
import lzma
import os
import random
import re
import sys
import unicodedata

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SEPARATOR = "\n<|endoftext|>\n"
SPECIAL_STRINGS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ALL_SOURCES = ["kjv", "gcide", "jargon", "devil", "fortunes"]
# The default: only texts whose Debian copyright files say public domain. GCIDE is GPL-2+ and
# the fortune cookies carry no public-domain statement; the weights we commit as the embedded
# default are trained on what anyone may use (docs/trained_model.md, "Licences").
PUBLIC_DOMAIN_SOURCES = ["kjv", "jargon", "devil"]

# The 66 books in order, with the BRS reader's abbreviations.
BOOKS = [
    ("Ge", "Genesis"), ("Exo", "Exodus"), ("Lev", "Leviticus"), ("Num", "Numbers"),
    ("Deu", "Deuteronomy"), ("Josh", "Joshua"), ("Jdgs", "Judges"), ("Ruth", "Ruth"),
    ("1Sm", "1 Samuel"), ("2Sm", "2 Samuel"), ("1Ki", "1 Kings"), ("2Ki", "2 Kings"),
    ("1Chr", "1 Chronicles"), ("2Chr", "2 Chronicles"), ("Ezra", "Ezra"), ("Neh", "Nehemiah"),
    ("Est", "Esther"), ("Job", "Job"), ("Psa", "Psalms"), ("Prv", "Proverbs"),
    ("Eccl", "Ecclesiastes"), ("SSol", "Song of Solomon"), ("Isa", "Isaiah"), ("Jer", "Jeremiah"),
    ("Lam", "Lamentations"), ("Eze", "Ezekiel"), ("Dan", "Daniel"), ("Hos", "Hosea"),
    ("Joel", "Joel"), ("Amos", "Amos"), ("Obad", "Obadiah"), ("Jonah", "Jonah"), ("Mic", "Micah"),
    ("Nahum", "Nahum"), ("Hab", "Habakkuk"), ("Zep", "Zephaniah"), ("Hag", "Haggai"),
    ("Zec", "Zechariah"), ("Mal", "Malachi"), ("Mat", "Matthew"), ("Mark", "Mark"),
    ("Luke", "Luke"), ("John", "John"), ("Acts", "Acts"), ("Rom", "Romans"),
    ("1Cor", "1 Corinthians"), ("2Cor", "2 Corinthians"), ("Gal", "Galatians"),
    ("Eph", "Ephesians"), ("Phi", "Philippians"), ("Col", "Colossians"),
    ("1Th", "1 Thessalonians"), ("2Th", "2 Thessalonians"), ("1Tim", "1 Timothy"),
    ("2Tim", "2 Timothy"), ("Titus", "Titus"), ("Phmn", "Philemon"), ("Heb", "Hebrews"),
    ("Jas", "James"), ("1Pet", "1 Peter"), ("2Pet", "2 Peter"), ("1Jn", "1 John"),
    ("2Jn", "2 John"), ("3Jn", "3 John"), ("Jude", "Jude"), ("Rev", "Revelation"),
]

# GCIDE's ASCII codes for letters and symbols (the common ones; others are left as they are).
GCIDE_CHARS = {
    "ae": "æ", "AE": "Æ", "oe": "œ", "OE": "Œ", "eth": "ð", "thorn": "þ", "yogh": "ȝ", "ng": "ŋ",
    "imac": "ī", "aum": "ä", "add": "ȧ", "asl": "â", "udd": "ü", "root": "√", "deg": "°",
    "sect": "§", "pounds": "£", "flat": "♭", "sharp": "♯", "th": "th", "dsdot": "ḍ", ",c": "ç",
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "Delta": "Δ", "theta": "θ",
    "iota": "ι", "pi": "π", "tau": "τ", "phi": "φ", "Upsilon": "Υ", "bprime": "″", "oo^": "o͝o",
    "=oo": "ōō", "=ae": "ǣ",
}
for _v in "aeiouy":
    GCIDE_CHARS[_v + "^"] = unicodedata.normalize("NFC", _v + "\u0306")   # breve
    GCIDE_CHARS["=" + _v] = unicodedata.normalize("NFC", _v + "\u0304")   # macron
    GCIDE_CHARS["'" + _v] = unicodedata.normalize("NFC", _v + "\u0301")   # acute
    GCIDE_CHARS["`" + _v] = unicodedata.normalize("NFC", _v + "\u0300")   # grave
    GCIDE_CHARS["^" + _v] = unicodedata.normalize("NFC", _v + "\u0302")   # circumflex
    GCIDE_CHARS['"' + _v] = unicodedata.normalize("NFC", _v + "\u0308")   # diaeresis
    GCIDE_CHARS["~" + _v] = unicodedata.normalize("NFC", _v + "\u0303")   # tilde
    GCIDE_CHARS["-" + _v] = _v
GCIDE_CHARS["~n"] = "ñ"
GCIDE_CHAR_RE = re.compile(r"\[(" + "|".join(re.escape(k) for k in sorted(GCIDE_CHARS, key=len, reverse=True)) + r")\]")
SOURCE_TAG_RE = re.compile(r"\[[^\]\n]*(?:Webster|WordNet|PJC|Century Dict|RHUD|RDH)[^\]\n]*\]")
TAG_LINE_RE = re.compile(r"^[ \t]*\[[^\]\n]*\][ \t]*$", re.M)


def die(msg):
    sys.exit(f"make_corpus: {msg}")


def decode(raw):
    """UTF-8, falling back to cp1252 per line for the odd stray byte (GCIDE has three)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        out = []
        for line in raw.split(b"\n"):
            try:
                out.append(line.decode("utf-8"))
            except UnicodeDecodeError:
                out.append(line.decode("cp1252", errors="replace"))
        return "\n".join(out)


def norm_text(text):
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


def reflow(text, wrap_min):
    """Joins hard-wrapped prose paragraphs into one line each; keeps short-line blocks."""
    out = []
    for par in re.split(r"\n[ \t]*\n", text):
        lines = [l.rstrip() for l in par.split("\n") if l.strip()]
        if not lines:
            continue
        long_lines = sum(1 for l in lines[:-1] if len(l.expandtabs()) >= wrap_min)
        if len(lines) == 1 or long_lines * 2 >= len(lines) - 1:
            out.append(" ".join(l.strip() for l in lines))
        else:
            indent = min(len(l) - len(l.lstrip()) for l in lines)
            out.append("\n".join(l[indent:] for l in lines))
    return re.sub(r"[ \t]{2,}", lambda m: "  " if m.group(0).startswith("  ") else " ", "\n\n".join(out))


# ---- sources ------------------------------------------------------------------------------

def dict_entries(pkg_dir, name):
    """Entries of a dictd database in file order, skipping the 00-database-* metadata."""
    base = os.path.join(pkg_dir, f"dict-{name}", "usr", "share", "dictd", name)
    if not os.path.exists(base + ".index"):
        die(f"{base}.index missing: run tools/train/fetch_corpus.sh first")
    with gzip.open(base + ".dict.dz") as f:  # dictzip is gzip-compatible
        data = f.read()
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def b64(s):
        n = 0
        for ch in s:
            n = n * 64 + alphabet.index(ch)
        return n

    spans = set()
    with open(base + ".index", encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3 or parts[0].startswith("00"):
                continue
            spans.add((b64(parts[1]), b64(parts[2])))
    for off, length in sorted(spans):
        yield decode(data[off:off + length])


def clean_gcide(entry):
    t = re.sub(r"\\[^\\\n]*\\", "", entry)               # pronunciations \Co*ag"u*late\
    t = TAG_LINE_RE.sub("", t)                          # [1913 Webster] alone on a line
    t = SOURCE_TAG_RE.sub("", t)                        # ... and inline
    t = re.sub(r"\{([^{}]*)\}", r"\1", t)              # {Cogent} cross references
    t = GCIDE_CHAR_RE.sub(lambda m: GCIDE_CHARS[m.group(1)], t)
    t = re.sub(r" +([,.;:])", r"\1", t)
    return reflow(t, 50)


def clean_jargon(entry):
    t = re.sub(r"^[ \t]*//,?[ \t]*", "", entry, flags=re.M)  # empty pronunciations
    t = re.sub(r"\{([^{}]*)\}", r"\1", t)
    return reflow(t, 55)


def clean_devil(entry):
    t = re.sub(r"_([^_\n]+)_", r"\1", entry)            # _italics_
    return reflow(t, 50)


def kjv_chapters(raw_dir):
    path = os.path.join(raw_dir, "kjv.txt")
    if not os.path.exists(path):
        die(f"{path} missing: run tools/train/fetch_corpus.sh first")
    names = dict(BOOKS)
    order = {abbr: i for i, (abbr, _) in enumerate(BOOKS)}
    chapters = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$", line.rstrip("\n"))
            if not m:
                die(f"unexpected KJV line: {line[:80]!r}")
            abbr, ch, verse, text = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
            if abbr not in names:
                die(f"unknown KJV book abbreviation {abbr!r}")
            chapters.setdefault((order[abbr], ch), []).append(f"{verse} {text.strip()}")
    for (book, ch), verses in sorted(chapters.items()):
        yield BOOKS[book][0], f"{BOOKS[book][1]} {ch}\n\n" + "\n".join(verses)


def fortune_files(pkg_dir):
    d = os.path.join(pkg_dir, "fortunes", "usr", "share", "games", "fortunes")
    if not os.path.isdir(d):
        die(f"{d} missing: run tools/train/fetch_corpus.sh first")
    for name in sorted(os.listdir(d)):
        path = os.path.join(d, name)
        if name.endswith((".dat", ".u8")) or name == "ascii-art" or not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, "rb") as f:
            text = decode(f.read()).expandtabs(8)
        cookies = [c.strip("\n") for c in re.split(r"^%[ \t]*$", text, flags=re.M)]
        yield name, [c for c in cookies if c.strip()]


# ---- documents ----------------------------------------------------------------------------

class Dedup:
    def __init__(self):
        self.seen = set()
        self.dropped = 0

    def keep(self, text):
        key = hashlib.sha1(" ".join(text.lower().split()).encode()).digest()
        if key in self.seen:
            self.dropped += 1
            return False
        self.seen.add(key)
        return True


def group(units, max_chars, sep):
    """Consecutive units into documents of at most max_chars (a longer unit stands alone)."""
    doc, size = [], 0
    for u in units:
        if doc and size + len(sep) + len(u) > max_chars:
            yield sep.join(doc)
            doc, size = [], 0
        doc.append(u)
        size += len(u) + (len(sep) if len(doc) > 1 else 0)
    if doc:
        yield sep.join(doc)


def build_documents(args):
    pkg_dir = os.path.join(args.cache, "pkgs")
    raw_dir = os.path.join(args.cache, "raw")
    dedup = Dedup()
    docs, stats = [], {}
    for source in args.sources:
        dropped_before = dedup.dropped
        units_kept = 0
        source_docs = []
        if source == "kjv":
            by_book = {}
            for book, chapter in kjv_chapters(raw_dir):
                chapter = norm_text(chapter)
                if dedup.keep(chapter):
                    by_book.setdefault(book, []).append(chapter)
                    units_kept += 1
            limit = args.kjv_max_doc_chars or args.max_doc_chars
            if args.kjv_book_runs:  # whole books (a longer one in chapter runs), then runs of books
                pieces = [p for book in by_book for p in group(by_book[book], limit, "\n\n")]
                source_docs += group(pieces, limit, "\n\n")
            else:
                for book in by_book:
                    source_docs += group(by_book[book], limit, "\n\n")
        elif source in ("gcide", "jargon", "devil"):
            clean = {"gcide": clean_gcide, "jargon": clean_jargon, "devil": clean_devil}[source]
            units = []
            for entry in dict_entries(pkg_dir, source):
                text = norm_text(clean(entry))
                if len(text) >= 8 and dedup.keep(text):
                    units.append(text)
            units_kept = len(units)
            source_docs = list(group(units, args.max_doc_chars, "\n\n"))
        elif source == "fortunes":
            for _, cookies in fortune_files(pkg_dir):
                kept = [norm_text(c) for c in cookies]
                kept = [c for c in kept if c and dedup.keep(c)]
                units_kept += len(kept)
                source_docs += group(kept, args.max_doc_chars // 2, "\n%\n")
        else:
            die(f"unknown source {source!r} (known: {', '.join(ALL_SOURCES)})")
        for d in source_docs:
            for s in SPECIAL_STRINGS:
                if s in d:
                    die(f"{source}: a document contains the special token text {s!r}")
        docs += [(source, d) for d in source_docs]
        stats[source] = {"units": units_kept, "duplicates_dropped": dedup.dropped - dropped_before,
                         "documents": len(source_docs), "chars": sum(len(d) for d in source_docs),
                         "bytes": sum(len(d.encode()) for d in source_docs)}
        print(f"  {source:9s} {units_kept:7d} units ({stats[source]['duplicates_dropped']} duplicates dropped), "
              f"{len(source_docs):5d} documents, {stats[source]['bytes'] / 1e6:6.2f} MB", flush=True)
    return docs, stats


def write_text(path, docs):
    text = SEPARATOR.join(docs) + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return text.encode()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=os.path.join(ROOT, ".cache", "corpus"))
    ap.add_argument("--carry-dir", default=os.path.join(ROOT, ".cache", "train", "corpus"),
                    help="where the compressed copy for the GPU runs goes ('' = none)")
    ap.add_argument("--sources", default=",".join(PUBLIC_DOMAIN_SOURCES),
                    help=f"comma-separated, of {','.join(ALL_SOURCES)} (default: the public-domain ones)")
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--val-fraction", type=float, default=0.02)
    ap.add_argument("--max-doc-chars", type=int, default=24000)
    ap.add_argument("--kjv-max-doc-chars", type=int, default=0,
                    help="the KJV's documents at most this long (0 = --max-doc-chars); e.g. 240000 for 16K-token windows")
    ap.add_argument("--kjv-book-runs", action="store_true",
                    help="a KJV document may hold several consecutive whole books (default: one book's chapters)")
    ap.add_argument("--out-dir", default="", help="where train.txt, val.txt, manifest.json go (default: CACHE/out)")
    ap.add_argument("--xz-preset", type=int, default=6)
    args = ap.parse_args()
    args.sources = [s for s in args.sources.split(",") if s]

    print(f"make_corpus: sources {', '.join(args.sources)}")
    docs, stats = build_documents(args)
    rng = random.Random(args.seed)
    rng.shuffle(docs)
    train, val = [], []
    val_quota = {s: max(1, round(args.val_fraction * st["documents"])) for s, st in stats.items()}
    for source, d in docs:
        if val_quota[source] > 0:
            val.append(d)
            val_quota[source] -= 1
        else:
            train.append(d)

    out_dir = args.out_dir or os.path.join(args.cache, "out")
    os.makedirs(out_dir, exist_ok=True)
    manifest = {"seed": args.seed, "val_fraction": args.val_fraction, "max_doc_chars": args.max_doc_chars,
                "separator": "a line holding only <|endoftext|>", "sources": stats, "files": {}}
    if args.kjv_max_doc_chars or args.kjv_book_runs:  # only then: the default manifest stays as it was
        manifest["kjv_max_doc_chars"] = args.kjv_max_doc_chars or args.max_doc_chars
        manifest["kjv_book_runs"] = args.kjv_book_runs
    versions = os.path.join(args.cache, "debs", "VERSIONS")
    if os.path.exists(versions):
        with open(versions) as f:
            manifest["packages"] = dict(line.split(" ", 1) for line in f.read().strip().split("\n"))
            manifest["packages"] = {k: v.strip() for k, v in manifest["packages"].items()}
    carry = args.carry_dir
    if carry:
        os.makedirs(carry, exist_ok=True)
    for name, part in (("train", train), ("val", val)):
        data = write_text(os.path.join(out_dir, f"{name}.txt"), part)
        entry = {"documents": len(part), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        if carry:
            packed = lzma.compress(data, preset=args.xz_preset)
            with open(os.path.join(carry, f"{name}.txt.xz"), "wb") as f:
                f.write(packed)
            entry["xz_bytes"] = len(packed)
        manifest["files"][name] = entry
    total = sum(e["bytes"] for e in manifest["files"].values())
    manifest["total_bytes"] = total
    for path in [os.path.join(out_dir, "manifest.json")] + ([os.path.join(carry, "manifest.json")] if carry else []):
        with open(path, "w") as f:
            json.dump(manifest, f, indent=2)
            f.write("\n")
    print(f"make_corpus: {len(train)} train / {len(val)} val documents; "
          f"train {manifest['files']['train']['bytes'] / 1e6:.2f} MB, val {manifest['files']['val']['bytes'] / 1e6:.2f} MB "
          f"(~{total / 4.2e6:.1f}M tokens at ~4.2 bytes/token) -> {out_dir}")
    if carry:
        xz = sum(e["xz_bytes"] for e in manifest["files"].values())
        print(f"make_corpus: compressed for the GPU runs: {xz / 2**20:.2f} MiB in {carry}")


if __name__ == "__main__":
    main()
