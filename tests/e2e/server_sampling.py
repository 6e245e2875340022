"""Logits processing over real HTTP (test_server_sampling.sh): penalties, logit_bias,
allowed_token_ids, bad_words and min_tokens change what the server generates as documented
(docs/server.md), and bad values are 400s naming the field. Exits 1 on any failed check.
Usage: server_sampling.py <base url>"""
import json
import sys
import urllib.error
import urllib.request
from collections import Counter

BASE = sys.argv[1]
failed = False


def check(what, cond, detail=""):
    global failed
    print(("ok: " if cond else "FAILED: ") + what)
    if not cond:
        failed = True
        if detail:
            print(str(detail)[:2000])


def post(path, body):
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def stream(body):
    req = urllib.request.Request(BASE + "/v1/completions", data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    ids = []
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    ids += [int(t.split(":")[1]) for t in (c.get("logprobs") or {}).get("tokens", [])]
    return ids


PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"
N = 32


def complete(**extra):
    """Greedy token ids of a completion (ids read from the logprobs' token_id:<id> names)."""
    body = {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "ignore_eos": True, "logprobs": 0,
            "return_tokens_as_token_ids": True}
    body.update(extra)
    status, d = post("/v1/completions", body)
    assert status == 200, (status, d)
    return [int(t.split(":")[1]) for t in d["choices"][0]["logprobs"]["tokens"]], d


def tokenize(text):
    return post("/tokenize", {"prompt": text, "add_special_tokens": False})[1]["tokens"]


vocab = post("/tokenize", {"prompt": "x"})  # (warm-up; the vocabulary comes from /v1/models)
with urllib.request.urlopen(BASE + "/v1/models") as r:
    vocab = json.loads(r.read())["data"][0]["vocab_size"]

base, base_d = complete()
check(f"greedy baseline: {N} tokens", len(base) == N, base_d)
counts = Counter(base)
common, common_n = counts.most_common(1)[0]

# logit_bias forces a token: +100 on a token the baseline never produced.
forced = next(t for t in range(3, vocab) if t not in counts)
ids, d = complete(logit_bias={str(forced): 100})
check(f"logit_bias +100 on token {forced}: every token is it", ids == [forced] * N, ids)
# ... and its logprobs stay the model's raw ones: at the first position (the baseline's context)
# the forced token is not the model's argmax, so its raw probability is <= 1/2, while the
# processed one would be ~1.
lps = d["choices"][0]["logprobs"]["token_logprobs"]
check("logit_bias leaves the reported logprobs raw (first < -0.69)", lps[0] < -0.69, lps)
ids, _ = complete(logit_bias={str(common): -100})
check(f"logit_bias -100 on the baseline's most common token {common}: never produced", common not in ids, ids)

# allowed_token_ids restricts the output.
allowed = sorted(set(tokenize(" dog fox cat")))
ids, _ = complete(allowed_token_ids=allowed)
check(f"allowed_token_ids {allowed}: only those", len(ids) == N and set(ids) <= set(allowed), ids)

# bad_words: a word the model is pushed to (logit_bias) is never produced once banned. (Works
# with any model: the embedded default, or the byte-level fixture under ctest.)
word = next((w for w in ["the", "a", "fox", "e"] if len(tokenize(w)) == 1), None)
if word is None:
    check("a one-token word for the bad_words check", False, [tokenize(w) for w in ["the", "a", "fox", "e"]])
else:
    variants = [tokenize(word), tokenize(" " + word)]
    single = [v[0] for v in variants if len(v) == 1]
    pushed = {str(t): 30 for t in single}
    ids, _ = complete(logit_bias=pushed)
    check(f"logit_bias +30 on {single} ({word!r}) makes them appear", bool(set(ids) & set(single)), ids)
    ids, _ = complete(logit_bias=pushed, bad_words=[word])
    check(f"bad_words [{word!r}]: none of {single} produced even so", not set(single) & set(ids), (variants, ids))
# A multi-token bad word: take two consecutive baseline tokens as the word; its second token never
# follows its first.
pair = next(((a, b) for a, b in zip(base, base[1:]) if a != b), None)
if pair:
    pair_text = post("/detokenize", {"tokens": list(pair)})[1]["prompt"]
    toks = tokenize(pair_text.lstrip())
    if len(toks) == 2:
        ids, _ = complete(bad_words=[pair_text])
        followed = any(x == toks[0] and y == toks[1] for x, y in zip(ids, ids[1:]))
        check(f"bad_words [{pair_text!r}] ({toks}): never produced in sequence", not followed, ids)
    else:
        print(f"note: {pair_text!r} does not re-tokenize to 2 tokens ({toks}); multi-token bad word check skipped")

# Penalties change greedy decoding.
for name, value in [("frequency_penalty", 2.0), ("presence_penalty", 2.0), ("repetition_penalty", 2.0)]:
    ids, _ = complete(**{name: value})
    check(f"{name}={value} changes the greedy output", ids != base and len(ids) == N, (base, ids))
ids, _ = complete(frequency_penalty=2.0)
check("frequency_penalty=2 repeats the most common token less",
      Counter(ids).most_common(1)[0][1] < common_n, (base, ids))
ids, _ = complete(repetition_penalty=1.0, presence_penalty=0, frequency_penalty=0)
check("neutral values give the baseline", ids == base, ids)
# The repetition penalty reads the prompt: the prompt's tokens are penalised from the first step.
ids, _ = complete(repetition_penalty=2.0, max_tokens=1)
first_prompt = tokenize(PROMPT)
check("repetition_penalty=2 moves the first token when the baseline's is in the prompt",
      base[0] not in first_prompt or ids[0] != base[0], (base[0], ids))

# Streaming gives the same tokens as the whole answer; seeded sampling repeats.
ids = stream({"prompt": PROMPT, "max_tokens": N, "temperature": 0, "ignore_eos": True, "logprobs": 0,
              "return_tokens_as_token_ids": True, "frequency_penalty": 1.0, "logit_bias": {str(forced): 5}})
ref, _ = complete(frequency_penalty=1.0, logit_bias={str(forced): 5})
check("streamed = non-streamed with penalties and a bias", ids == ref, (ids, ref))
a, _ = complete(temperature=0.9, seed=11, presence_penalty=1.0, bad_words=["fox"])
b, _ = complete(temperature=0.9, seed=11, presence_penalty=1.0, bad_words=["fox"])
check("seeded sampling with penalties repeats", a == b, (a, b))

# min_tokens masks the stop token until then: the baseline's second token as a stop id.
stop_id = base[1]
ids, d = complete(stop_token_ids=[stop_id], min_tokens=10, ignore_eos=False)
check(f"min_tokens=10 with stop id {stop_id}: >= 10 tokens, the stop id not among the first 10",
      len(ids) >= 10 and stop_id not in ids[:10], ids)

# Chat takes them too.
status, d = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                                          "temperature": 0, "logit_bias": {str(forced): 100},
                                          "logprobs": True, "return_tokens_as_token_ids": True})
chat_ids = [int(c["token"].split(":")[1]) for c in d["choices"][0]["logprobs"]["content"]] if status == 200 else []
check("chat: logit_bias forces the token", status == 200 and chat_ids == [forced] * 6, d)

# Bad values: 400 naming the field.
bad_cases = [
    ("presence_penalty", {"presence_penalty": 3}),
    ("frequency_penalty", {"frequency_penalty": "a"}),
    ("repetition_penalty", {"repetition_penalty": 0}),
    ("logit_bias", {"logit_bias": {str(vocab): 1}}),
    ("logit_bias", {"logit_bias": {"x": 1}}),
    ("logit_bias", {"logit_bias": {"5": 101}}),
    ("allowed_token_ids", {"allowed_token_ids": [1, vocab]}),
    ("allowed_token_ids", {"allowed_token_ids": []}),
    ("bad_words", {"bad_words": "fox"}),
    ("bad_words", {"bad_words": [7]}),
]
for param, extra in bad_cases:
    status, d = post("/v1/completions", dict({"prompt": "x", "max_tokens": 2}, **extra))
    err = d.get("error", {})
    check(f"400 naming {param}: {json.dumps(extra)}", status == 400 and err.get("param") == param, (status, d))
status, d = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logit_bias": {str(vocab + 5): 1}})
check("chat: 400 naming logit_bias (outside the vocabulary)",
      status == 400 and d["error"]["param"] == "logit_bias" and "vocabulary" in d["error"]["message"], d)

sys.exit(1 if failed else 0)
