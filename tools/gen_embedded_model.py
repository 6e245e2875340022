#!/usr/bin/env python3
"""Writes tests/fixtures/tiny-default/: the tiny random model the CPU end-to-end tests serve as
oasis-server's default (through $OASIS_EMBEDDED_MODEL; tests/CMakeLists.txt). It was the
embedded default until the trained model (models/embedded, docs/trained_model.md) replaced it.

A Qwen3ForCausalLM with seeded random bf16 weights (hidden 64, 2 layers, 4 query heads,
2 KV heads, head_dim 16, context 4096), a byte-level BPE tokenizer in HF `tokenizers`
format (256 byte tokens + 253 merges learned on the text below + the ChatML special tokens
<|endoftext|>, <|im_start|>, <|im_end|>: 512 ids), a ChatML chat template and a generation
config. Random weights: the text it writes is gibberish (the tests compare engines, not text).

Standard library only (no numpy/torch), deterministic: running it again rewrites the same
bytes.  Usage: python3 tools/gen_embedded_model.py [OUT_DIR]  (default tests/fixtures/tiny-default)
"""
import collections
import json
import os
import random
import re
import struct
import sys

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 64, 2, 4, 2, 16, 192
NUM_MERGES = 253
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 256 + NUM_MERGES + len(SPECIALS)  # 512
MAX_POSITIONS = 4096
SEED = 20251201
WEIGHT_STD = 0.08

# The merges are learned on this text (so common English pieces become single tokens).
CORPUS = """
OasisKV is a standalone inference server for large language models. It loads weights from
safetensors files, schedules requests with continuous batching, and serves an OpenAI compatible
HTTP API and a gRPC API. The server streams tokens as they are generated, reports usage and
log probabilities, and exposes Prometheus metrics. This tiny model has random weights: what it
writes is not meant to make sense. Hello, world! What is the capital of France? The quick brown
fox jumps over the lazy dog. In the beginning there was the word, and the word was with the
model. Please answer the question in one sentence. You are a helpful assistant. The user asks
a question and the assistant answers it. Thank you for your help; have a nice day.
def main(): return 0  # numbers 0 1 2 3 4 5 6 7 8 9 10 100 2024
"""

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# An ASCII approximation of QWEN_PATTERN for splitting the training text (Python's re has no \p{L}).
TRAIN_PATTERN = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*"
                           r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def learn_merges(text, num_merges, alphabet):
    words = collections.Counter(tuple(alphabet[b] for b in w.encode("utf-8")) for w in TRAIN_PATTERN.findall(text))
    merges = []
    for _ in range(num_merges):
        pairs = collections.Counter()
        for word, count in words.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += count
        if not pairs:
            break
        # Most frequent pair; ties broken by the pair itself so the result is deterministic.
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merges.append(best)
        merged = {}
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + count
        words = merged
    return merges


def tokenizer_json():
    alphabet = bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    merges = learn_merges(CORPUS * 3, NUM_MERGES, alphabet)
    # A short corpus may run out of pairs: pad with merges of frequent letters so the vocabulary
    # always has exactly VOCAB ids.
    filler = iter([(alphabet[a], alphabet[b]) for a in b"etaoinsrhl" for b in b"etaoinsrhl "])
    while len(merges) < NUM_MERGES:
        pair = next(filler)
        if pair not in merges and pair[0] + pair[1] not in vocab:
            merges.append(pair)
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    assert len(vocab) == 256 + NUM_MERGES, len(vocab)
    added = [{"id": len(vocab) + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(SPECIALS)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_PATTERN}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [a + " " + b for a, b in merges]},
    }


def bf16_bytes(values):
    """float -> bf16 (round to nearest even), little endian."""
    out = bytearray()
    for v in values:
        bits = struct.unpack("<I", struct.pack("<f", v))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        out += struct.pack("<H", bits)
    return bytes(out)


def weights():
    rng = random.Random(SEED)
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    specs = [("model.embed_tokens.weight", [VOCAB, HIDDEN], "normal")]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        specs += [(p + "input_layernorm.weight", [HIDDEN], "ones"),
                  (p + "self_attn.q_proj.weight", [q, HIDDEN], "normal"),
                  (p + "self_attn.k_proj.weight", [kv, HIDDEN], "normal"),
                  (p + "self_attn.v_proj.weight", [kv, HIDDEN], "normal"),
                  (p + "self_attn.o_proj.weight", [HIDDEN, q], "normal"),
                  (p + "self_attn.q_norm.weight", [HEAD_DIM], "ones"),
                  (p + "self_attn.k_norm.weight", [HEAD_DIM], "ones"),
                  (p + "post_attention_layernorm.weight", [HIDDEN], "ones"),
                  (p + "mlp.gate_proj.weight", [INTERMEDIATE, HIDDEN], "normal"),
                  (p + "mlp.up_proj.weight", [INTERMEDIATE, HIDDEN], "normal"),
                  (p + "mlp.down_proj.weight", [HIDDEN, INTERMEDIATE], "normal")]
    specs.append(("model.norm.weight", [HIDDEN], "ones"))
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape, init in specs:
        n = 1
        for d in shape:
            n *= d
        if init == "ones":
            values = [1.0 + rng.gauss(0.0, 0.05) for _ in range(n)]
        else:
            values = [rng.gauss(0.0, WEIGHT_STD) for _ in range(n)]
        blob = bf16_bytes(values)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * ((8 - len(head) % 8) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "tiny-default")
    os.makedirs(out_dir, exist_ok=True)
    endoftext, im_start, im_end = 256 + NUM_MERGES, 256 + NUM_MERGES + 1, 256 + NUM_MERGES + 2
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITIONS, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "attention_bias": False, "hidden_act": "silu",
        "bos_token_id": endoftext, "eos_token_id": [im_end, endoftext], "torch_dtype": "bfloat16",
    }
    generation = {"bos_token_id": endoftext, "eos_token_id": [im_end, endoftext], "temperature": 0.7,
                  "top_p": 0.8, "top_k": 20}
    tok_config = {
        "model_max_length": MAX_POSITIONS, "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE, "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": {str(256 + NUM_MERGES + i): {"content": s, "special": True}
                                 for i, s in enumerate(SPECIALS)},
    }
    files = {
        "config.json": json.dumps(config, indent=2) + "\n",
        "generation_config.json": json.dumps(generation, indent=2) + "\n",
        "tokenizer.json": json.dumps(tokenizer_json(), ensure_ascii=False, indent=1) + "\n",
        "tokenizer_config.json": json.dumps(tok_config, indent=2) + "\n",
    }
    for name, text in files.items():
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            f.write(text)
    with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
        f.write(weights())
    print(f"wrote {out_dir}: {', '.join(sorted(list(files) + ['model.safetensors']))}")


if __name__ == "__main__":
    main()
