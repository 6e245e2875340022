#!/usr/bin/env python3
"""Makes oasis-bench's offline datasets from public-domain text (docs/loadgen.md, "Datasets"):

  tests/fixtures/bench/sharegpt.json  ShareGPT format (vLLM's --dataset-name sharegpt): a JSON
                                      list of {"id", "conversations": [{"from": "human"|"gpt",
                                      "value": text}, ...]}
  tests/fixtures/bench/sonnet.txt     sonnet style (vLLM's --dataset-name sonnet): one poem line
                                      a line

The text comes from the training corpus of the embedded model (docs/trained_model.md,
"Corpus"), public-domain sources only: the King James Bible (bible-kjv-text) and Ambrose
Bierce's The Devil's Dictionary (dict-devil). Fetch them first with the repository's own
script (two Debian packages, ~3 MB; git-ignored under .cache/corpus):

    PACKAGES="bible-kjv-text dict-devil" tools/train/fetch_corpus.sh
    python3 tools/loadgen/make_bench_datasets.py [--out-dir tests/fixtures/bench]

- sharegpt.json: Devil's Dictionary entries as answers to questions about the word (some
  conversations go on for two or three exchanges), KJV chapters as "continue this passage"
  exchanges, plus a few entries vLLM's loader skips or prunes (one turn, no turns, a prompt
  under 4 tokens), so that runs exercise the filters. The questions are written here; the
  answers and passages are the public-domain text, cleaned as make_corpus.py cleans it.
- sonnet.txt: the Psalms, each verse cut at its ';' and ':' into lines (the parallel halves of
  Hebrew verse), in order from Psalm 1, up to --sonnet-bytes.

Deterministic (--seed); standard library only.
"""
import argparse
import json
import os
import random
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "train"))
import make_corpus  # noqa: E402  (dict_entries, clean_devil, BOOKS)

QUESTIONS = [
    "What is {w}, according to The Devil's Dictionary?",
    "Define \"{W}\" the way Ambrose Bierce would.",
    "Give me the Devil's Dictionary entry for {W}.",
    "How does Bierce define the word {w}?",
    "I keep hearing the word “{w}”. What does it mean — in Bierce's words?",
]
FOLLOW_UPS = ["And {w}?", "What about {w}?", "Now do {w}, please."]
CONTINUE = [
    "Continue this passage from {ref}:\n{text}",
    "Here is the beginning of {ref}. What comes next?\n{text}",
]


def devil_entries(pkg_dir):
    out = []
    for raw in make_corpus.dict_entries(pkg_dir, "devil"):
        text = make_corpus.clean_devil(raw).strip()
        m = re.match(r"^([A-Z][A-Z' -]*[A-Z]),", text)
        if m:
            out.append((m.group(1), text))
    return out


def kjv_chapters(raw_dir):
    names = dict(make_corpus.BOOKS)
    chapters = {}
    with open(os.path.join(raw_dir, "kjv.txt"), encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$", line.rstrip("\n"))
            if m:
                key = (names[m.group(1)], int(m.group(2)))
                chapters.setdefault(key, []).append(m.group(4).strip())
    return chapters


def make_sharegpt(rng, entries, chapters, num_devil, num_kjv):
    convs = []
    picked = rng.sample([e for e in entries if 60 <= len(e[1]) <= 1200], num_devil)
    for i, (word, text) in enumerate(picked):
        turns = [{"from": "human", "value": rng.choice(QUESTIONS).format(w=word.lower(), W=word.title())},
                 {"from": "gpt", "value": text}]
        if i % 5 == 0:  # a longer conversation: one or two follow-ups
            for _ in range(rng.choice([1, 2])):
                w2, t2 = rng.choice(entries)
                turns += [{"from": "human", "value": rng.choice(FOLLOW_UPS).format(w=w2.lower())},
                          {"from": "gpt", "value": t2}]
        convs.append({"id": f"devil-{i}", "conversations": turns})
    keys = sorted(k for k, v in chapters.items() if len(v) >= 8)
    for i, (book, ch) in enumerate(rng.sample(keys, num_kjv)):
        verses = chapters[(book, ch)]
        k = rng.randint(1, 3)
        m = rng.randint(2, 6)
        prompt = " ".join(verses[:k])
        answer = " ".join(verses[k:k + m])
        convs.append({"id": f"kjv-{i}", "conversations": [
            {"from": "human", "value": rng.choice(CONTINUE).format(ref=f"{book} {ch}", text=prompt)},
            {"from": "gpt", "value": answer}]})
    rng.shuffle(convs)
    # Entries vLLM's ShareGPT loader skips (fewer than two turns) or prunes (prompt < 4 tokens).
    convs.insert(3, {"id": "edge-one-turn", "conversations": [
        {"from": "human", "value": "Is anyone there?"}]})
    convs.insert(7, {"id": "edge-no-turns", "conversations": []})
    convs.insert(11, {"id": "edge-short-prompt", "conversations": [
        {"from": "human", "value": "Hi"},
        {"from": "gpt", "value": entries[0][1]}]})
    return convs


def split_long(line, limit=80):
    """A line over `limit` characters is cut at the comma nearest its middle (recursively)."""
    line = line.strip()
    if len(line) <= limit:
        return [line]
    commas = [m.end() for m in re.finditer(r",\s", line)]
    if not commas:
        return [line]
    cut = min(commas, key=lambda c: abs(c - len(line) / 2))
    return split_long(line[:cut], limit) + split_long(line[cut:], limit)


def make_sonnet(chapters, max_bytes):
    lines, size = [], 0
    for ch in range(1, 151):
        for verse in chapters[("Psalms", ch)]:
            for part in (p for half in re.split(r"(?<=[;:])\s+", verse) for p in split_long(half)):
                if len(part) < 12 and lines:  # too short to stand alone: join the previous line
                    lines[-1] += " " + part
                    continue
                if size + len(part) + 1 > max_bytes:
                    return lines
                lines.append(part)
                size += len(part) + 1
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=os.path.join(ROOT, ".cache", "corpus"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "tests", "fixtures", "bench"))
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--devil", type=int, default=50, help="Devil's Dictionary conversations")
    ap.add_argument("--kjv", type=int, default=30, help="KJV conversations")
    ap.add_argument("--sonnet-bytes", type=int, default=20000)
    args = ap.parse_args()
    raw = os.path.join(args.corpus, "raw")
    if not os.path.exists(os.path.join(raw, "kjv.txt")):
        sys.exit("make_bench_datasets: no .cache/corpus/raw/kjv.txt: run "
                 "PACKAGES=\"bible-kjv-text dict-devil\" tools/train/fetch_corpus.sh first")
    rng = random.Random(args.seed)
    entries = devil_entries(os.path.join(args.corpus, "pkgs"))
    chapters = kjv_chapters(raw)
    os.makedirs(args.out_dir, exist_ok=True)
    convs = make_sharegpt(rng, entries, chapters, args.devil, args.kjv)
    with open(os.path.join(args.out_dir, "sharegpt.json"), "w", encoding="utf-8") as f:
        # One conversation a line: small diffs, still one JSON list.
        f.write("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in convs) + "\n]\n")
    lines = make_sonnet(chapters, args.sonnet_bytes)
    with open(os.path.join(args.out_dir, "sonnet.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    for name in ("sharegpt.json", "sonnet.txt"):
        path = os.path.join(args.out_dir, name)
        print(f"{path}: {os.path.getsize(path)} bytes")
    print(f"{len(convs)} conversations, {len(lines)} poem lines")


if __name__ == "__main__":
    main()
