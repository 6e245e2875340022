"""Shared pieces of the training scripts in tools/train/ (docs/trained_model.md).

Paths, fail-fast helpers, the wall-clock budget, corpus reading, tokenization (HF `tokenizers`,
or for CPU smoke tests without it a byte-level fallback that maps UTF-8 bytes to the single-byte
tokens every byte-level BPE vocabulary has), token-stream caching, the learning-rate schedule,
safetensors I/O (the `safetensors` package when present, else a small writer/reader of the same
format) and the JSONL log. Imports torch/numpy lazily so make_corpus-style tools need neither.
"""
import hashlib
import json
import lzma
import os
import struct
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TRAIN_DIR = os.path.join(ROOT, ".cache", "train")
DEFAULT_CORPUS = os.path.join(TRAIN_DIR, "corpus")
DEFAULT_STATE = os.path.join(TRAIN_DIR, "state")
DEFAULT_WORK = os.path.join(TRAIN_DIR, "work")
SEPARATOR = "\n<|endoftext|>\n"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def die(msg, tool=None):
    tool = tool or os.path.basename(sys.argv[0])
    sys.exit(f"{tool}: error: {msg}")


def given_dests(parser, argv=None):
    """The argparse dests named on the command line (e.g. {"hidden", "seq_len"}): --smoke fills in
    only the settings not given, so a scaled-down test of other shapes or windows can run."""
    argv = sys.argv[1:] if argv is None else argv
    named = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    return {act.dest for act in parser._actions if named.intersection(act.option_strings)}


def require_file(path, hint):
    if not os.path.exists(path):
        die(f"{path} not found ({hint})")
    return path


class Deadline:
    """A wall-clock budget: remaining() seconds from construction until `budget_s` is spent."""

    def __init__(self, budget_s):
        self.start = time.time()
        self.budget_s = float(budget_s)

    def elapsed(self):
        return time.time() - self.start

    def remaining(self):
        return self.budget_s - self.elapsed()


# ---- corpus -------------------------------------------------------------------------------

def corpus_file(corpus_dir, split):
    for name in (f"{split}.txt", f"{split}.txt.xz"):
        path = os.path.join(corpus_dir, name)
        if os.path.exists(path):
            return path
    die(f"no {split}.txt or {split}.txt.xz in {corpus_dir} (run tools/train/make_corpus.py on the dev "
        f"machine and carry .cache/train/corpus)")


def read_docs(corpus_dir, split, max_bytes=0):
    """Documents of a split (make_corpus.py's format), optionally only the first max_bytes."""
    path = corpus_file(corpus_dir, split)
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read(max_bytes) if max_bytes else f.read()
    docs = [d for d in text.rstrip("\n").split(SEPARATOR) if d.strip()]
    if max_bytes and len(docs) > 1:
        docs = docs[:-1]  # the last one may be cut
    if not docs:
        die(f"{path} holds no documents")
    return docs


# ---- tokenizers ---------------------------------------------------------------------------

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


class ByteFallbackTokenizer:
    """Encodes text as one single-byte token per UTF-8 byte of a byte-level BPE vocabulary.

    Decodes exactly like the real tokenizer (the segmentation is just not the merged one).
    Only for smoke tests where HF `tokenizers` is not installed.
    """

    def __init__(self, tokenizer_json):
        with open(tokenizer_json, encoding="utf-8") as f:
            tj = json.load(f)
        vocab = tj["model"]["vocab"]
        alphabet = bytes_to_unicode()
        self.byte_ids = [vocab[alphabet[b]] for b in range(256)]
        self.added = {t["content"]: t["id"] for t in tj.get("added_tokens", [])}
        self.size = max(list(vocab.values()) + list(self.added.values())) + 1
        inverse = {c: b for b, c in alphabet.items()}
        self.id_bytes = {i: bytes(inverse[ch] for ch in tokstr) for tokstr, i in vocab.items()}
        self.id_bytes.update({i: s.encode() for s, i in self.added.items()})

    def encode_ids(self, text):
        return [self.byte_ids[b] for b in text.encode("utf-8")]

    def decode(self, ids, skip_special_tokens=False):
        return b"".join(self.id_bytes[i] for i in ids).decode("utf-8", errors="replace")

    def token_to_id(self, token):
        return self.added.get(token)

    def get_vocab_size(self):
        return self.size


def load_tokenizer(tokenizer_dir, allow_fallback=False):
    path = require_file(os.path.join(tokenizer_dir, "tokenizer.json"),
                        "train it with tools/train/train_tokenizer.py, or run the 'tokenizer' phase")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        if not allow_fallback:
            die("the python package 'tokenizers' is missing (the GPU machine has it; --smoke allows a byte fallback)")
        print("common: 'tokenizers' missing: byte-level fallback encoding (smoke test only)", flush=True)
        return ByteFallbackTokenizer(path)
    return Tokenizer.from_file(path)


def encode_docs(tok, docs, eot_id):
    """One uint16 token stream: each document's ids followed by <|endoftext|>."""
    import numpy as np
    if isinstance(tok, ByteFallbackTokenizer):
        seqs = [tok.encode_ids(d) for d in docs]
    else:
        seqs = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
    if tok.get_vocab_size() > 65535:
        die("vocabulary too large for uint16 token streams")
    total = sum(len(s) + 1 for s in seqs)
    out = np.empty(total, dtype=np.uint16)
    pos = 0
    for s in seqs:
        out[pos:pos + len(s)] = s
        out[pos + len(s)] = eot_id
        pos += len(s) + 1
    return out


def token_stream(corpus_dir, tokenizer_dir, split, work_dir, allow_fallback=False, max_bytes=0):
    """The tokenized split, cached in work_dir keyed by the corpus file and tokenizer hashes."""
    import numpy as np
    tok = load_tokenizer(tokenizer_dir, allow_fallback)
    eot = tok.token_to_id("<|endoftext|>")
    if eot is None:
        die(f"{tokenizer_dir}/tokenizer.json has no <|endoftext|> token")
    h = hashlib.sha256()
    for path in (corpus_file(corpus_dir, split), os.path.join(tokenizer_dir, "tokenizer.json")):
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    h.update(f"{type(tok).__name__}:{max_bytes}".encode())
    cache = os.path.join(work_dir, f"tokens-{split}-{h.hexdigest()[:16]}.npy")
    if os.path.exists(cache):
        return np.load(cache), tok
    t0 = time.time()
    docs = read_docs(corpus_dir, split, max_bytes)
    ids = encode_docs(tok, docs, eot)
    os.makedirs(work_dir, exist_ok=True)
    np.save(cache + ".tmp.npy", ids)
    os.replace(cache + ".tmp.npy", cache)
    nbytes = sum(len(d.encode()) for d in docs)
    print(f"tokenized {split}: {len(docs)} documents, {nbytes / 1e6:.1f} MB -> {len(ids) / 1e6:.2f}M tokens "
          f"({nbytes / max(1, len(ids)):.2f} bytes/token) in {time.time() - t0:.1f}s", flush=True)
    return ids, tok


# ---- optimisation -------------------------------------------------------------------------

def lr_at(step, total_steps, peak, warmup, min_ratio, rewarm_start=None, rewarm_steps=0):
    """Linear warm-up, cosine decay to min_ratio * peak; a fresh optimiser (resumed from the
    portable checkpoint) ramps up again over rewarm_steps from rewarm_start."""
    import math
    if step < warmup:
        lr = peak * (step + 1) / warmup
    else:
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        lr = peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
    if rewarm_start is not None and rewarm_steps > 0 and step < rewarm_start + rewarm_steps:
        lr *= (step - rewarm_start + 1) / rewarm_steps
    return lr


class JsonlLog:
    """Appends one JSON object a line to `path` and prints a short form."""

    def __init__(self, path):
        self.path = path
        os.makedirs(os.path.dirname(path), exist_ok=True)

    def write(self, record, echo=None):
        record = {"time": round(time.time(), 1), **record}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(echo if echo is not None else json.dumps(record), flush=True)


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


# ---- safetensors --------------------------------------------------------------------------

_DTYPES = None


def _dtypes():
    global _DTYPES
    if _DTYPES is None:
        import torch
        _DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32",
                   torch.int64: "I64", torch.int32: "I32", torch.bool: "BOOL", torch.uint8: "U8"}
    return _DTYPES


def save_safetensors(tensors, path, metadata=None):
    """Writes {name: tensor} as safetensors (the package's writer when installed)."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    try:
        from safetensors.torch import save_file
        save_file(tensors, path, metadata=metadata or {"format": "pt"})
        return
    except ImportError:
        pass
    import torch
    header, blobs, offset = {"__metadata__": metadata or {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        header[name] = {"dtype": _dtypes()[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * ((8 - len(head) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    """{name: tensor} from one safetensors file (the package's reader when installed)."""
    try:
        from safetensors.torch import load_file
        return load_file(path)
    except ImportError:
        pass
    import torch
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    by_name = {v: k for k, v in _dtypes().items()}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        dtype = by_name[info["dtype"]]
        buf = bytearray(data[a:b])
        if dtype == torch.bool:
            t = torch.frombuffer(buf, dtype=torch.uint8).to(torch.bool) if buf else torch.empty(0, dtype=torch.bool)
        elif dtype == torch.bfloat16:
            t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16) if buf else torch.empty(0, dtype=dtype)
        else:
            t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"])
    return out


def load_model_weights(model_dir):
    """All tensors of the safetensors files in model_dir (single file or shards)."""
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        die(f"no .safetensors in {model_dir}")
    out = {}
    for f in files:
        out.update(load_safetensors(os.path.join(model_dir, f)))
    return out


class KeepBest:
    """The weights of the best evaluation so far (the small corpus is seen many times over, so
    a late evaluation can be worse than an earlier one); restore() loads them back at the end
    when the last evaluation is worse. Off (`enabled` False) it keeps nothing."""

    def __init__(self, enabled, higher_is_better):
        self.enabled, self.higher = enabled, higher_is_better
        self.score = self.step = self.weights = None
        self.extra = {}

    def better(self, a, b):
        return a > b if self.higher else a < b

    def observe(self, module, score, step, **extra):
        if self.enabled and (self.score is None or self.better(score, self.score)):
            self.score, self.step, self.extra = score, step, extra
            self.weights = {k: v.detach().clone() for k, v in module.state_dict().items()}

    def restore(self, module, last_score):
        """True when the kept weights were better than the last ones and are loaded back."""
        restored = self.weights is not None and self.better(self.score, last_score)
        if restored:
            module.load_state_dict(self.weights)
        self.weights = None
        return restored


class TokenPlan:
    """Fits the planned token count (the cosine schedule's length) to the time budget.

    With `auto`, after `fit_steps` steps of a phase (a run's start, or a new sequence length),
    planned = tokens so far + measured tokens/s x (seconds left - reserve) x margin; the margin
    covers evaluations and checkpoints. Call phase_started() when the sequence length changes
    and observe(state) after every step; it returns (planned, tokens/s) when it (re)plans.
    `cap_tokens` (non-zero) bounds the plan: --max-epochs x the training tokens.
    """

    def __init__(self, auto, deadline, reserve_s, tokens_per_step, margin=0.92, fit_steps=12, cap_tokens=0):
        self.auto, self.deadline, self.reserve_s, self.cap_tokens = auto, deadline, reserve_s, cap_tokens
        self.tokens_per_step, self.margin, self.fit_steps = tokens_per_step, margin, fit_steps
        self.hist = []

    def phase_started(self):
        self.hist = []

    def observe(self, state):
        if not self.auto:
            return None
        self.hist.append((time.time(), state["tokens"]))
        if len(self.hist) != self.fit_steps:
            return None
        (t1, k1), (t2, k2) = self.hist[1], self.hist[-1]  # the first step may hold compile time
        tps = (k2 - k1) / max(1e-9, t2 - t1)
        seconds = max(0.0, self.deadline.remaining() - self.reserve_s) * self.margin
        planned = state["tokens"] + int(tps * seconds)
        if self.cap_tokens:  # --max-epochs: a small corpus is not repeated without end
            planned = min(planned, self.cap_tokens)
        planned = planned // self.tokens_per_step * self.tokens_per_step
        state["total_tokens"] = max(state["tokens"] + self.tokens_per_step, planned)
        return state["total_tokens"], tps


def planned_tokens_arg(value, resume):
    """--total-tokens: '' (fresh: auto; resume: keep), 'auto', or a number -> (auto, number)."""
    if value in ("", "auto"):
        return (value == "auto" or not resume), None
    try:
        return False, int(float(value))
    except ValueError:
        die(f"--total-tokens must be a number or 'auto', got {value!r}")
