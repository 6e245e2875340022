#!/usr/bin/env python3
"""Trains the byte-level BPE tokenizer of the small model (docs/trained_model.md).

HF `tokenizers`, laid out like Qwen2/Qwen3's tokenizer.json: NFC normalizer; pre-tokenizer =
Split on the Qwen2 regex (isolated) + ByteLevel (no prefix space, no regex); ByteLevel
decoder and post-processor; BPE over the 256-byte alphabet with --vocab-size - 3 entries, then
the special tokens <|endoftext|>, <|im_start|>, <|im_end|> as the last three ids (as Qwen puts
<|endoftext|> right after its BPE vocabulary). Writes into --out:
  tokenizer.json, tokenizer_config.json (ChatML chat template: the same template the embedded
  model uses, which our Jinja engine renders; eos <|im_end|>, pad <|endoftext|>, no bos),
  tokenizer_summary.json (sizes, bytes/token on val, checks),
  tokenizer_cases.jsonl (text -> ids of ~200 val snippets, tests/fixtures/tokenizer's format).
Checks before it succeeds: vocabulary size and special ids; decode(encode(doc)) == doc on the
val documents; and, where transformers is installed, that AutoTokenizer loads the directory
with the same ids and renders the chat template like Python Jinja2 does.

Usage: python3 tools/train/train_tokenizer.py [--corpus .cache/train/corpus]
           [--out .cache/train/state/tokenizer] [--vocab-size 8192] [--max-train-mb 0]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import DEFAULT_CORPUS, DEFAULT_STATE, SPECIALS, die, read_docs, write_json  # noqa: E402

# The Qwen2/Qwen3 pre-tokenizer split (also in tools/gen_embedded_model.py).
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
MAX_POSITIONS = 4096  # trained to 4,096 tokens (train_model.py --max-positions)
CHECK_ERRORS = []  # what check_transformers found, kept in tokenizer_summary.json
CHECK_TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "Coagulate, v. t. To cause (a liquid) to change into a curdlike or semisolid state.",
    "  indented\tand tabbed\r\nlines 1234567 don't we'll; naïve café — “quotes” ½ 😀",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
]


def build(vocab_size, docs, min_frequency, path):
    """Trains, adds the special tokens, saves to `path` with the Qwen3 layout of the
    normalizer / pre-tokenizer / post-processor / decoder sections, and reloads it."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIALS), min_frequency=min_frequency,
                                  show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    bpe_size = tok.get_vocab_size()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False, lstrip=False, rstrip=False,
                                       single_word=False) for s in SPECIALS])
    tok.save(path)
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tj["normalizer"] = {"type": "NFC"}
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN_PATTERN}, "behavior": "Isolated", "invert": False}, byte_level]}
    tj["post_processor"] = dict(byte_level)
    tj["decoder"] = dict(byte_level)
    tj["model"].update({"dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "",
                        "fuse_unk": False, "byte_fallback": False, "ignore_merges": False})
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    return Tokenizer.from_file(path), bpe_size


def tokenizer_config(tok, tokenizer_class):
    return {
        "model_max_length": MAX_POSITIONS, "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE, "tokenizer_class": tokenizer_class,
        "clean_up_tokenization_spaces": False, "split_special_tokens": False,
        "added_tokens_decoder": {str(tok.token_to_id(s)): {"content": s, "special": True, "normalized": False,
                                                           "lstrip": False, "rstrip": False, "single_word": False}
                                 for s in SPECIALS},
    }


def check_transformers(out_dir, tok, texts):
    """AutoTokenizer must give the same ids and render the template like Jinja2; returns the
    tokenizer_class that works, or None when transformers is not installed."""
    try:
        import transformers
        from transformers import AutoTokenizer
    except ImportError:
        print("train_tokenizer: transformers not installed: AutoTokenizer check skipped", flush=True)
        return None
    import jinja2
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is a wedlock?"}]
    expected_chat = jinja2.Environment().from_string(CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=True)
    errors = []
    for cls in ("Qwen2Tokenizer", "PreTrainedTokenizerFast"):
        write_json(os.path.join(out_dir, "tokenizer_config.json"), tokenizer_config(tok, cls))
        try:
            hf = AutoTokenizer.from_pretrained(out_dir)
        except Exception as e:  # noqa: BLE001 - report and try the next class
            errors.append(f"{cls}: load failed: {e}")
            continue
        bad = [t for t in texts if hf.encode(t, add_special_tokens=False) != tok.encode(t, add_special_tokens=False).ids]
        chat = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if bad:
            errors.append(f"{cls}: ids differ from tokenizers' on {len(bad)} texts, e.g. {bad[0][:60]!r}")
        elif chat != expected_chat:
            errors.append(f"{cls}: chat template renders {chat!r}, Jinja2 {expected_chat!r}")
        elif hf.eos_token != "<|im_end|>":
            errors.append(f"{cls}: eos_token {hf.eos_token!r}")
        else:
            print(f"train_tokenizer: transformers {transformers.__version__} AutoTokenizer ({type(hf).__name__}, "
                  f"tokenizer_class {cls}) matches on {len(texts)} texts and the chat template", flush=True)
            return cls
    # Not fatal here: the model and head phases of the same call still run, and export_check.py
    # fails on the same load at the end, with the state of the training kept.
    print("train_tokenizer: WARNING: transformers' AutoTokenizer disagrees with the trained tokenizer:\n  "
          + "\n  ".join(errors), flush=True)
    CHECK_ERRORS.extend(errors)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=DEFAULT_CORPUS)
    ap.add_argument("--out", default=os.path.join(DEFAULT_STATE, "tokenizer"))
    ap.add_argument("--vocab-size", type=int, default=8192, help="total, including the 3 special tokens")
    ap.add_argument("--min-frequency", type=int, default=2)
    ap.add_argument("--max-train-mb", type=float, default=0, help="train on a slice (smoke tests); 0 = all")
    args = ap.parse_args()
    try:
        import tokenizers
    except ImportError:
        die("the python package 'tokenizers' is missing (it is on the GPU machine: run the 'tokenizer' phase there)")
    if not 300 <= args.vocab_size <= 65535:
        die("--vocab-size must be in [300, 65535] (uint16 token streams)")

    t0 = time.time()
    train = read_docs(args.corpus, "train", int(args.max_train_mb * 1e6))
    val = read_docs(args.corpus, "val")
    print(f"train_tokenizer: tokenizers {tokenizers.__version__}, {len(train)} train documents "
          f"({sum(len(d) for d in train) / 1e6:.1f}M chars), vocab {args.vocab_size}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    tok, bpe_size = build(args.vocab_size, train, args.min_frequency, os.path.join(args.out, "tokenizer.json"))
    if tok.get_vocab_size() != args.vocab_size:
        die(f"vocabulary has {tok.get_vocab_size()} ids, expected {args.vocab_size} "
            f"(BPE part {bpe_size}: the corpus slice may be too small for this many merges)")
    special = [tok.token_to_id(s) for s in SPECIALS]
    ids = special
    if ids != list(range(args.vocab_size - len(SPECIALS), args.vocab_size)):
        die(f"special token ids {ids}, expected the last {len(SPECIALS)} ids")

    # Round trip on the val documents and a few odd strings; bytes per token.
    encs = tok.encode_batch(val, add_special_tokens=False)
    for doc, enc in zip(val, encs):
        if tok.decode(enc.ids, skip_special_tokens=False) != doc:
            die(f"decode(encode(doc)) != doc for a val document starting {doc[:60]!r}")
    for text in CHECK_TEXTS:
        import unicodedata
        if tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False) != unicodedata.normalize("NFC", text):
            die(f"round trip failed on {text!r}")
    special_ids = tok.encode(CHECK_TEXTS[-1], add_special_tokens=False).ids
    if special_ids.count(ids[1]) != 2 or special_ids.count(ids[2]) != 1:
        die("special tokens are not matched as single ids in text")
    val_bytes = sum(len(d.encode()) for d in val)
    val_tokens = sum(len(e.ids) for e in encs)
    used = len({i for e in encs for i in e.ids})

    cls = check_transformers(args.out, tok, CHECK_TEXTS + val[:50]) or "Qwen2Tokenizer"
    write_json(os.path.join(args.out, "tokenizer_config.json"), tokenizer_config(tok, cls))
    # text -> ids cases in tests/fixtures/tokenizer's line format, for a C++ exactness test.
    cases = CHECK_TEXTS + [d[:400] for d in val[:200]]
    with open(os.path.join(args.out, "tokenizer_cases.jsonl"), "w", encoding="utf-8") as f:
        for text in cases:
            ids = tok.encode(text, add_special_tokens=False).ids
            case = {"text": text, "ids": ids, "add_special_tokens": False}
            decoded = tok.decode(ids, skip_special_tokens=False)
            if decoded != text:
                case["decoded"] = decoded
            f.write(json.dumps(case, ensure_ascii=False) + "\n")
    summary = {"tokenizers": tokenizers.__version__, "vocab_size": args.vocab_size, "bpe_size": bpe_size,
               "special_ids": dict(zip(SPECIALS, special)), "train_documents": len(train),
               "val_bytes": val_bytes, "val_tokens": val_tokens,
               "val_bytes_per_token": round(val_bytes / max(1, val_tokens), 3),
               "val_distinct_ids": used, "tokenizer_class": cls,
               "transformers_check_errors": CHECK_ERRORS, "seconds": round(time.time() - t0, 1)}
    write_json(os.path.join(args.out, "tokenizer_summary.json"), summary)
    print(f"train_tokenizer: wrote {args.out}: {json.dumps(summary)}", flush=True)


if __name__ == "__main__":
    main()
