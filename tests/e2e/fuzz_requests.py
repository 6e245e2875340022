#!/usr/bin/env python3
"""Structure-aware fuzzing of oasis-server's request handlers over real HTTP (stdlib only).

    fuzz_requests.py PORT SECONDS [SEED]

Starts from valid bodies of every POST route (/v1/completions, /v1/chat/completions,
/tokenize, /detokenize) and mutates them: fields dropped, added, or replaced by values of every
JSON type and edge (null, booleans, 0, -1, 2^63, 1e308, NaN-like strings, empty and huge
strings, odd Unicode, arrays and objects nested up to and past the server's depth limit),
recursively inside messages, content parts, tools, stop lists, stream_options and
chat_template_kwargs; sometimes the body is cut or its bytes flipped. Every answer must be a
2xx, or a 4xx/429/503 with OpenAI error JSON ({"error": {"message", ...}}) — never a 5xx, a
broken response or a dead server. Deterministic for a seed; prints a summary and the first
failures (with the body that caused them) and exits 1 on any.
"""
import json
import random
import socket
import sys
import time

PORT = int(sys.argv[1])
SECONDS = float(sys.argv[2])
rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
sys.setrecursionlimit(50000)  # json.dumps of values nested 1,000 deep

VALID = {
    "/v1/completions": [
        {"prompt": "once upon a time", "max_tokens": 4},
        {"prompt": [5, 6, 7, 8], "max_tokens": 3, "n": 2, "logprobs": 2, "echo": True},
        {"prompt": ["a", "b"], "max_tokens": 2, "stream": True,
         "stream_options": {"include_usage": True}, "stop": ["\n", "the"], "seed": 3},
        {"prompt": "x", "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "top_k": 5,
         "min_p": 0.1, "ignore_eos": True, "min_tokens": 2, "stop_token_ids": [3]},
    ],
    "/v1/chat/completions": [
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        {"messages": [{"role": "system", "content": "be brief"},
                      {"role": "user", "content": [{"type": "text", "text": "hello"}]}],
         "max_completion_tokens": 3, "logprobs": True, "top_logprobs": 2, "stream": True},
        {"messages": [{"role": "user", "content": "weather?"}], "max_tokens": 2,
         "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
         "chat_template_kwargs": {"enable_thinking": False}, "add_generation_prompt": True},
    ],
    "/tokenize": [
        {"prompt": "hello world", "add_special_tokens": False, "return_token_strs": True},
        {"messages": [{"role": "user", "content": "hi"}]},
    ],
    "/detokenize": [{"tokens": [5, 6, 7]}, {"tokens": [], "model": "oasis-embedded"}],
}

STRINGS = ["", "x", "\u0000", "\ud7ff\ue000", "🤖" * 50, "a" * 20000, "NaN", "Infinity", "-1",
           "oasis-embedded", "user", "assistant", "system", "tool", "text", "function",
           "{{ messages }}", "{% for x in range(99999999) %}", "\\u0000", "<|im_start|>"]
NUMBERS = [0, 1, -1, 2, 3, 16, 4096, 4097, 2 ** 31, 2 ** 63, -2 ** 63, 2 ** 64, 1e308, -1e308,
           0.5, 1.0000001, 1e-320, 129, 21, 20]


def nested(depth, leaf):
    v = leaf
    for _ in range(depth):
        v = [v] if rng.random() < 0.5 else {"k": v}
    return v


def random_value(depth=0):
    r = rng.random()
    if r < 0.12:
        return None
    if r < 0.22:
        return rng.choice([True, False])
    if r < 0.45:
        return rng.choice(NUMBERS)
    if r < 0.65:
        return rng.choice(STRINGS)
    if r < 0.72:
        return nested(rng.choice([2, 50, 255, 256, 257, 1000]), rng.choice([1, "x"]))
    if depth > 3:
        return rng.choice(STRINGS)
    if r < 0.86:
        return [random_value(depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["role", "content", "type", "text", "name", "k", "include_usage"]):
            random_value(depth + 1) for _ in range(rng.randint(0, 3))}


def mutate(v, depth=0):
    """A mutated copy of v."""
    if isinstance(v, dict):
        out = dict(v)
        for _ in range(rng.randint(1, 3)):
            r = rng.random()
            keys = list(out)
            if r < 0.25 and keys:
                del out[rng.choice(keys)]
            elif r < 0.45:
                out[rng.choice(["model", "n", "best_of", "logit_bias", "response_format", "user",
                                "suffix", "presence_penalty", "guided_json", "tool_choice",
                                "parallel_tool_calls", "forced_output_ids", "unknown_field",
                                "return_tokens_as_token_ids", "continue_final_message",
                                "messages", "tools", "chat_template_kwargs", "bad_words",
                                "allowed_token_ids", "repetition_penalty", "frequency_penalty"])] = random_value()
            elif keys:
                k = rng.choice(keys)
                out[k] = mutate(out[k], depth + 1) if rng.random() < 0.5 else random_value()
        return out
    if isinstance(v, list):
        out = list(v)
        r = rng.random()
        if r < 0.3 and out:
            i = rng.randrange(len(out))
            out[i] = mutate(out[i], depth + 1)
        elif r < 0.5:
            out.append(random_value())
        elif r < 0.6 and out:
            out.pop(rng.randrange(len(out)))
        elif r < 0.7:
            out = out * rng.choice([2, 50])
        else:
            out = [mutate(x, depth + 1) for x in out]
        return out
    return random_value() if rng.random() < 0.7 else v


def body_bytes(obj):
    raw = json.dumps(obj).encode()
    r = rng.random()
    if r < 0.05 and raw:
        raw = raw[:rng.randrange(len(raw))]  # cut
    elif r < 0.10 and raw:
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        raw = bytes(b)
    return raw


def exchange(path, raw):
    s = socket.create_connection(("127.0.0.1", PORT), timeout=30)
    s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\nContent-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw)
    data = b""
    while True:
        c = s.recv(65536)
        if not c:
            break
        data += c
    s.close()
    return data


def check(data):
    """None when the answer is acceptable, else why not."""
    if not data.startswith(b"HTTP/1.1 "):
        return f"not an HTTP response: {data[:80]!r}"
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if status >= 500 and status != 503:
        return f"status {status}: {body[:300]!r}"
    if b"transfer-encoding: chunked" in head.lower():
        if not body.endswith(b"0\r\n\r\n"):
            return "a chunked answer that does not end"
        if status == 200 and b"data: [DONE]" not in body:
            return "a stream without [DONE]"
        return None
    if status >= 400:
        try:
            err = json.loads(body)["error"]
            if not err.get("message"):
                return f"status {status} with an empty error message"
        except (ValueError, KeyError, TypeError):
            return f"status {status} without OpenAI error JSON: {body[:200]!r}"
    return None


counts = {}
failures = []
end = time.monotonic() + SECONDS
n = 0
while time.monotonic() < end:
    path = rng.choice(list(VALID))
    obj = rng.choice(VALID[path])
    for _ in range(rng.randint(1, 3)):
        obj = mutate(obj)
    raw = body_bytes(obj)
    try:
        data = exchange(path, raw)
        why = check(data)
        if data.startswith(b"HTTP/1.1 "):
            st = data.split(b" ", 2)[1].decode()
            counts[st] = counts.get(st, 0) + 1
    except OSError as e:
        why = f"{type(e).__name__}: {e}"
    n += 1
    if why and len(failures) < 10:
        failures.append(f"{path} {why}; body {raw[:300]!r}")
# The server must still answer.
try:
    alive = exchange("/tokenize", b'{"prompt": "still alive"}').startswith(b"HTTP/1.1 200")
except OSError:
    alive = False
print(f"fuzz_requests: {n} requests in {SECONDS:.0f} s, statuses {dict(sorted(counts.items()))}")
for f in failures:
    print("FAILED: " + f)
if not alive:
    print("FAILED: the server does not answer after fuzzing")
if failures or not alive:
    sys.exit(1)
print("ok: every answer was a 2xx or a 4xx/429/503 with error JSON; the server is up")
