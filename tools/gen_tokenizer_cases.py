#!/usr/bin/env python3
"""Generates the tokenizer exactness cases: tests/fixtures/tokenizer/{qwen3,llama3_1}.jsonl, and
tests/fixtures/trained/trained.jsonl for the trained embedded default (--trained
models/embedded/tokenizer.json --out-dir tests/fixtures/trained).

Runs on the GPU machine (Python 3.12 + HF `tokenizers`; no network needed):

    python3 tools/gen_tokenizer_cases.py \
        --qwen3 .cache/test-data/qwen3/tokenizer.json \
        --llama3_1 .cache/test-data/llama3_1/tokenizer.json \
        --out-dir tests/fixtures/tokenizer

`--dry-run` only builds the texts and prints statistics (no `tokenizers` needed).

The texts are built deterministically from SEED with the Python standard library only (the same
texts for both tokenizers). Each output line is one case:

    {"text": ..., "ids": [...], "add_special_tokens": false}
    {"text": ..., "ids": [...], "add_special_tokens": true, "decoded": ...}

"ids" is `Tokenizer.encode(text, add_special_tokens=...).ids` from HF `tokenizers` (about 1 case in
10 uses add_special_tokens=True, which adds Llama-3's BOS; Qwen3 adds nothing). "decoded" is
`Tokenizer.decode(ids, skip_special_tokens=False)`, written only when it differs from "text" (e.g.
Qwen3's NFC normalizer changes NFD input). tests/unit/tokenizer/test_fixture_cases.cpp requires
every case to match exactly. A <name>.meta.json beside each file records the provenance.
"""

import argparse
import hashlib
import json
import os
import random
import sys
import unicodedata

SEED = 20261129
NUM_CASES = 2400          # per tokenizer (the same texts for both)
MAX_FILE_BYTES = 1_900_000  # the longest cases are dropped until the file fits
MIN_CASES = 2000

# ---------------------------------------------------------------------------------------------
# Text material (short, hand-written; correctness of the prose does not matter, variety does).
SENTENCES = {
    "en": ["The quick brown fox jumps over the lazy dog.", "I can't believe it's already 2026!",
           "She said: \"We'll see what happens tomorrow.\"", "It's a well-known fact, isn't it?",
           "Numbers like 3.14159 and 2,718,281 appear everywhere.", "e-mail me at a.b@example.com"],
    "de": ["Äpfel und Birnen schmecken im Herbst besonders gut.", "Die Straße ist überfüllt, oder?",
           "Fußgängerübergänge sind in Großstädten wichtig."],
    "fr": ["L'été dernier, nous sommes allés à la plage.", "Ça va très bien, merci beaucoup !",
           "Où est la bibliothèque ? C'est à côté de l'hôpital."],
    "es": ["¿Dónde está la estación de tren?", "¡Qué día tan bonito hace hoy!", "El niño comió piña."],
    "ru": ["Привет, как дела? Всё хорошо.", "Москва — столица России.", "Съешь же ещё этих мягких французских булок."],
    "uk": ["Їжак їсть яблука в саду.", "Ґанок біля хати зроблений з дерева."],
    "el": ["Καλημέρα σε όλους! Τι κάνετε;", "Η Ακρόπολη βρίσκεται στην Αθήνα.", "ΑΒΓΔ αβγδ ςσ"],
    "he": ["שלום עולם, מה שלומך?", "ירושלים היא עיר עתיקה.", "אני אוהב ללמוד שפות חדשות."],
    "ar": ["مرحبا بالعالم، كيف حالك؟", "اللغة العربية جميلة جداً.", "القاهرة عاصمة مصر ١٢٣٤٥."],
    "hi": ["नमस्ते दुनिया, आप कैसे हैं?", "भारत एक विशाल देश है।", "मुझे हिंदी सीखना पसंद है।"],
    "th": ["สวัสดีครับ ยินดีที่ได้รู้จัก", "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ", "กรุงเทพมหานคร"],
    "zh": ["我想在园子里吃苹果。", "今天天气很好，我们去公园散步吧！", "人工智能正在改变世界。", "繁體中文與简体中文"],
    "ja": ["こんにちは、世界！元気ですか？", "東京は日本の首都です。", "カタカナとひらがなと漢字"],
    "ko": ["안녕하세요, 만나서 반갑습니다.", "서울은 대한민국의 수도입니다.", "한국어를 공부하고 있어요."],
    "vi": ["Tiếng Việt có nhiều dấu thanh điệu.", "Hà Nội là thủ đô của Việt Nam."],
    "tr": ["İstanbul'da güzel bir gün geçirdik.", "Işık ılık süt içti."],
    "pl": ["Zażółć gęślą jaźń.", "Łódź jest dużym miastem w Polsce."],
    "am": ["ሰላም ለዓለም", "አዲስ አበባ"],
    "ta": ["வணக்கம் உலகம்", "தமிழ் ஒரு பழமையான மொழி"],
}

CODE = [
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "#include <vector>\nstd::vector<int32_t> ids{1, 2, 3};\nauto it = std::find(ids.begin(), ids.end(), 2);\n",
    "const add = (a, b) => a + b;\nconsole.log(`sum: ${add(1, 2)}`);\n",
    "fn main() {\n    let v: Vec<u8> = vec![0xFF, 0x10];\n    println!(\"{:?}\", v);\n}\n",
    "func main() {\n\tfmt.Println(\"hello, 世界\")\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;\n",
    "<div class=\"note\"><p>Hello &amp; welcome</p></div>\n",
    "{\"key\": [1, 2.5e-3, true, null], \"nested\": {\"a\": \"b\"}}\n",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done\n",
    "    if (x != y && !flag) return -1;  // early exit\n",
    "import numpy as np\narr = np.zeros((3, 4), dtype=np.float32)\nprint(arr.shape)\n",
    "\\begin{equation} E = mc^2 \\end{equation}\n",
    "x = [i**2 for i in range(10) if i % 2 == 0]\n",
    "class Foo:\n    def __init__(self):\n        self._cache = {}\n\n\n    def get(self, k):\n        return self._cache.get(k)\n",
]

EMOJI = [
    "😀", "😂", "🥲", "❤️", "👍", "👍🏽", "👋🏿", "🧑🏻‍💻", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🏴‍☠️", "🇺🇸", "🇯🇵",
    "🇩🇪", "🇧🇷", "1️⃣", "#️⃣", "✅", "🚀", "🦀", "🐍", "☕", "⚡", "🤷‍♀️", "🙇🏾‍♂️", "👁️‍🗨️", "🫶🏼",
    "✌🏻", "🏄‍♀️", "😶‍🌫️", "❤️‍🔥",
]

SPECIAL = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|vision_start|>", "<|object_ref_start|>",
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
    "<|eom_id|>", "<|python_tag|>", "<|reserved_special_token_5|>", "<|finetune_right_pad_id|>",
    # near misses
    "<|im_start", "im_end|>", "<|im_start|>>", "<<|im_end|>", "<think", "</ think>", "<|begin_of_text|",
    "<|reserved_special_token_999|>", "<|IM_START|>",
]

CONTRACTIONS = [
    "don't", "DON'T", "I'm", "I'M", "you're", "YOU'RE", "we've", "they'll", "she'd", "it's", "IT'S",
    "y'all", "rock 'n' roll", "'s", "''", "'''", "o'clock", "don’t", "it’s", "’tis", "l'homme",
    "aujourd'hui", "Ma'am", "'ll 'LL 'Ll", "'d've", "can't've", "'S'T'RE'VE'M'LL'D",
]

ODD = [
    "e\u0301", "a\u0300\u0301\u0302\u0303", "Z\u0351\u0346\u0334\u0353", "\u200b", "\u200c", "\u200d",
    "\u2060", "\ufeff", "\u00a0", "\u2028", "\u2029", "\u0085", "\u3000", "\u202f", "\u180e",
    "\ufb01", "\u2460", "\uff21\uff22", "\u2126", "\u212b", "\u1e9b\u0323", "\U0001d400\U0001d401",
    "\U00020000", "\U0002a6d6", "\U00010348", "\U0001f9d1", "\u0627\u0644\u0644\u0647", "\u202e",
    "\u200f", "\u0000", "\u0007", "\u001b[31m", "\x7f", "\ud7a3", "\U000e0041", "\ufe0f", "\u0e33",
    "\u0915\u094d\u0937", "\u1100\u1161\u11a8", "\u00c5", "A\u030a", "\u2163", "\u3231", "\u33a1",
]

WORDS = ["hello", "world", "token", "Tokenizer", "BPE", "merge", "the", "of", "and", "inference",
         "server", "GPU", "cache", "KV", "attention", "Qwen3", "Llama-3.1", "HTTP/1.1", "a", "I"]


class Gen:
    """All random choices go through one random.Random(SEED): the output is deterministic."""

    def __init__(self, seed):
        self.r = random.Random(seed)

    def pick(self, seq):
        return seq[self.r.randrange(len(seq))]

    def sentence(self):
        return self.pick(self.pick(list(SENTENCES.values())))

    def whitespace(self):
        kinds = [" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n", "\t\t", "   \n\n  ", "\u3000", "\u00a0"]
        n = self.r.choice([1, 1, 2, 3, 5, 8, 17, 40, 100])
        if self.r.random() < 0.5:
            return self.pick(kinds) * n
        return "".join(self.pick(kinds) for _ in range(n))

    def number(self):
        forms = [
            lambda: str(self.r.randrange(10)),
            lambda: str(self.r.randrange(10 ** self.r.randrange(1, 8))),
            lambda: "".join(self.pick("0123456789") for _ in range(self.r.randrange(10, 70))),
            lambda: f"{self.r.uniform(-1e6, 1e6):.{self.r.randrange(0, 9)}f}",
            lambda: f"{self.r.randrange(10**9):,}",
            lambda: f"{self.r.random():.3e}",
            lambda: hex(self.r.getrandbits(64)),
            lambda: f"+1 ({self.r.randrange(100, 999)}) {self.r.randrange(100, 999)}-{self.r.randrange(1000, 9999)}",
            lambda: f"{self.r.randrange(1900, 2100)}-{self.r.randrange(1, 13):02d}-{self.r.randrange(1, 29):02d}",
            lambda: "١٢٣٤٥٦٧٨٩٠" if self.r.random() < 0.5 else "१२३४५६७८९०",
            lambda: "Ⅻ ⅻ ½ ¾ ² ³ ① ⑳",
        ]
        return self.pick(forms)()

    def emoji_run(self):
        n = self.r.randrange(1, 6)
        sep = self.pick(["", " ", "", "\u200d"])
        return sep.join(self.pick(EMOJI) for _ in range(n))

    def code(self):
        snippet = self.pick(CODE)
        if self.r.random() < 0.3:  # re-indent with tabs or 2/8 spaces
            indent = self.pick(["\t", "  ", "        "])
            snippet = snippet.replace("    ", indent)
        if self.r.random() < 0.3:  # a slice, possibly cut mid-line
            a = self.r.randrange(len(snippet))
            snippet = snippet[a:a + self.r.randrange(5, 80)]
        return snippet

    def odd(self):
        n = self.r.randrange(1, 5)
        parts = [self.pick(ODD) for _ in range(n)]
        if self.r.random() < 0.5:
            parts.insert(self.r.randrange(len(parts) + 1), self.pick(WORDS))
        return "".join(parts)

    def nfd(self):
        s = self.sentence()
        return unicodedata.normalize(self.pick(["NFD", "NFKD", "NFC", "NFKC"]), s)

    def random_bytes(self):
        data = bytes(self.r.randrange(256) for _ in range(self.r.randrange(1, 60)))
        return data.decode("utf-8", errors=self.pick(["replace", "ignore"]))

    def random_codepoints(self):
        out = []
        for _ in range(self.r.randrange(1, 30)):
            lo, hi = self.pick([(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF),
                                (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x3040, 0x30FF),
                                (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF),
                                (0x10000, 0x10FFFF), (0x0, 0x1F), (0x2000, 0x206F)])
            c = self.r.randrange(lo, hi + 1)
            if 0xD800 <= c <= 0xDFFF:  # no surrogates: the text must be valid UTF-8
                c = 0xFFFD
            out.append(chr(c))
        return "".join(out)

    def special_mix(self):
        parts = []
        for _ in range(self.r.randrange(1, 6)):
            parts.append(self.pick(SPECIAL) if self.r.random() < 0.5 else
                         self.pick([self.pick(WORDS), self.sentence(), "\n", " ", "user", "assistant"]))
        sep = self.pick(["", " ", "\n", ""])
        return sep.join(parts)

    def contraction_mix(self):
        return " ".join(self.pick(CONTRACTIONS + WORDS) for _ in range(self.r.randrange(1, 8)))

    def words(self):
        return " ".join(self.pick(WORDS) for _ in range(self.r.randrange(1, 12)))

    def document(self):
        parts = [self.fragment(simple=True) for _ in range(self.r.randrange(5, 25))]
        return "".join(p + self.pick([" ", "\n", "\n\n", "", "  ", "\t"]) for p in parts)

    def fragment(self, simple=False):
        makers = [self.sentence, self.whitespace, self.number, self.emoji_run, self.code, self.odd,
                  self.nfd, self.random_bytes, self.random_codepoints, self.special_mix,
                  self.contraction_mix, self.words]
        if not simple:
            makers += [self.sentence] * 3 + [self.code] * 2 + [self.document]
        return self.pick(makers)()

    def case(self):
        n = self.r.choice([1, 1, 1, 2, 2, 3])
        text = "".join(self.fragment() for _ in range(n))
        if self.r.random() < 0.15:  # leading/trailing whitespace
            text = self.whitespace() + text + self.whitespace()
        return text


def build_texts(seed=SEED, count=NUM_CASES):
    g = Gen(seed)
    texts = ["", " ", "\n", "a", "Hello world", " Hello world", "<|im_start|>", "<|begin_of_text|>"]
    seen = set(texts)
    while len(texts) < count:
        t = g.case()
        if t not in seen:
            seen.add(t)
            texts.append(t)
    # Deterministic choice of the cases encoded with add_special_tokens=True.
    flags = [i % 10 == 3 for i in range(len(texts))]
    return texts, flags


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_cases(name, tokenizer_path, texts, flags, out_dir):
    from tokenizers import Tokenizer  # imported here so --dry-run needs only the stdlib
    import tokenizers

    tok = Tokenizer.from_file(tokenizer_path)
    lines = []
    for text, add in zip(texts, flags):
        ids = tok.encode(text, add_special_tokens=add).ids
        case = {"text": text, "ids": ids, "add_special_tokens": add}
        decoded = tok.decode(ids, skip_special_tokens=False)
        if decoded != text:
            case["decoded"] = decoded
        lines.append(json.dumps(case, ensure_ascii=False) + "\n")
    # Keep the file small: drop the longest cases (never below MIN_CASES).
    total = sum(len(l.encode("utf-8")) for l in lines)
    order = sorted(range(len(lines)), key=lambda i: (-len(lines[i]), i))
    dropped = set()
    for i in order:
        if total <= MAX_FILE_BYTES or len(lines) - len(dropped) <= MIN_CASES:
            break
        dropped.add(i)
        total -= len(lines[i].encode("utf-8"))
    kept = [l for i, l in enumerate(lines) if i not in dropped]
    path = os.path.join(out_dir, f"{name}.jsonl")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(kept)
    meta = {
        "generator": "tools/gen_tokenizer_cases.py",
        "seed": SEED,
        "tokenizers_version": tokenizers.__version__,
        "tokenizer_json_sha256": sha256(tokenizer_path),
        "cases": len(kept),
        "cases_with_add_special_tokens": sum(1 for l in kept if '"add_special_tokens": true' in l),
        "cases_with_decoded": sum(1 for l in kept if '"decoded":' in l),
        "bytes": total,
    }
    with open(os.path.join(out_dir, f"{name}.meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(f"{path}: {json.dumps(meta)}")
    if len(kept) < MIN_CASES or total > MAX_FILE_BYTES * 1.1:
        sys.exit(f"{path}: {len(kept)} cases, {total} bytes: outside the limits")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qwen3", help="Qwen3 tokenizer.json")
    ap.add_argument("--llama3_1", help="Llama-3.1 tokenizer.json")
    ap.add_argument("--trained", help="the trained embedded default's tokenizer.json (models/embedded): writes "
                                      "trained.jsonl, for --out-dir tests/fixtures/trained")
    ap.add_argument("--out-dir", default="tests/fixtures/tokenizer")
    ap.add_argument("--dry-run", action="store_true", help="only build the texts and print statistics")
    args = ap.parse_args()

    texts, flags = build_texts()
    if args.dry_run:
        sizes = sorted(len(t.encode("utf-8")) for t in texts)
        print(f"{len(texts)} texts, {sum(sizes)} bytes, median {sizes[len(sizes)//2]}, max {sizes[-1]}, "
              f"{sum(flags)} with add_special_tokens")
        print("digest", hashlib.sha256("\x00".join(texts).encode("utf-8")).hexdigest())
        return
    if not (args.qwen3 or args.llama3_1 or args.trained):
        ap.error("name at least one of --qwen3, --llama3_1, --trained (or --dry-run)")
    os.makedirs(args.out_dir, exist_ok=True)
    for name, path in (("qwen3", args.qwen3), ("llama3_1", args.llama3_1), ("trained", args.trained)):
        if path:
            write_cases(name, path, texts, flags, args.out_dir)


if __name__ == "__main__":
    main()
