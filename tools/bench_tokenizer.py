#!/usr/bin/env python3
"""Encode throughput of HF `tokenizers`, single thread — the peer of tools/bench_tokenizer.cpp.

    python3 tools/bench_tokenizer.py --tokenizer T/tokenizer.json --text bench.txt [--reps 7] [--mode both]
    python3 tools/bench_tokenizer.py --make-text bench.txt [--mb 8]

Measures exactly what bench_tokenizer.cpp measures: "whole" encodes the file as one string,
"docs" splits it at blank lines ("\\n\\n") and encodes each document; one untimed warm-up pass, then
N timed passes; prints the median MB/s (10^6 bytes of UTF-8 input per second), the number of ids
and their FNV-1a 64 checksum (ids as little-endian uint32), which must equal the C++ tool's.
No special tokens are added. Rayon's thread pool is limited to one thread (set before importing
`tokenizers`), and `Tokenizer.encode` is used (not encode_batch), so HF runs single-threaded.

--make-text writes a deterministic benchmark text: documents alternating between Python standard
library sources (code + English comments, read from this interpreter's installation) and
multilingual paragraphs from tools/gen_tokenizer_cases.py's sentence bank.
"""

import argparse
import os
import statistics
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["RAYON_RS_NUM_CPUS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"


def fnv1a(h, ids):
    for v in ids:
        v &= 0xFFFFFFFF
        for k in range(4):
            h ^= (v >> (8 * k)) & 0xFF
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def run_pass(tok, docs):
    start = time.perf_counter()
    results = [tok.encode(d, add_special_tokens=False).ids for d in docs]
    seconds = time.perf_counter() - start
    h = 0xCBF29CE484222325
    n = 0
    for ids in results:
        n += len(ids)
        h = fnv1a(h, ids)
    return seconds, n, h


def bench(tok, mode, docs, nbytes, reps):
    run_pass(tok, docs)  # warm-up
    mbps, last = [], None
    for _ in range(reps):
        last = run_pass(tok, docs)
        mbps.append(nbytes / 1e6 / last[0])
    mbps.sort()
    print(f"hf    {mode:<5} {statistics.median(mbps):9.2f} MB/s median of {reps} (min {mbps[0]:.2f}, "
          f"max {mbps[-1]:.2f}); {len(docs)} docs, {nbytes} bytes, {last[1]} ids, checksum {last[2]:016x}")


def make_text(path, mb):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gen_tokenizer_cases as g

    gen = g.Gen(g.SEED)
    lib = os.path.dirname(os.__file__)
    sources = []
    for root, dirs, files in os.walk(lib):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages", "test", "tests", "__pycache__"))
        for f in sorted(files):
            if f.endswith(".py"):
                sources.append(os.path.join(root, f))
    target = int(mb * 1e6)
    out, size, i = [], 0, 0
    while size < target:
        if i % 2 == 0 and sources:
            with open(sources[(i // 2) % len(sources)], encoding="utf-8", errors="replace") as f:
                doc = f.read().strip("\n").replace("\n\n", "\n \n")
        else:
            doc = " ".join(gen.sentence() for _ in range(gen.r.randrange(3, 30)))
            if gen.r.random() < 0.2:
                doc += " " + gen.emoji_run() + " " + gen.number()
        out.append(doc)
        size += len(doc.encode("utf-8")) + 2
        i += 1
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n\n".join(out))
    print(f"wrote {path}: {size} bytes, {len(out)} documents")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer")
    ap.add_argument("--text")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--mode", choices=["whole", "docs", "both"], default="both")
    ap.add_argument("--make-text", metavar="PATH")
    ap.add_argument("--mb", type=float, default=8.0)
    args = ap.parse_args()
    if args.make_text:
        make_text(args.make_text, args.mb)
        return
    if not args.tokenizer or not args.text:
        ap.error("--tokenizer and --text are required (or --make-text)")

    from tokenizers import Tokenizer
    import tokenizers

    tok = Tokenizer.from_file(args.tokenizer)
    with open(args.text, "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8")
    print(f"tokenizers {tokenizers.__version__}, {args.tokenizer}")
    if args.mode in ("whole", "both"):
        bench(tok, "whole", [text], len(raw), args.reps)
    if args.mode in ("docs", "both"):
        bench(tok, "docs", text.split("\n\n"), len(raw), args.reps)


if __name__ == "__main__":
    main()
