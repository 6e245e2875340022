#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_server_requests (tests/fuzz/corpus/server_requests/).

Each seed is one byte choosing the route (its index in fuzz_server_requests.cpp's kRoutes;
len(kRoutes) = raw bytes on the socket) followed by the body. Run from anywhere:
    tests/fuzz/make_server_requests_corpus.py
"""
import json
import pathlib

OUT = pathlib.Path(__file__).resolve().parent / "corpus" / "server_requests"
COMPLETIONS, CHAT, TOKENIZE, DETOKENIZE, MODELS, HEALTH, METRICS, RAW = range(8)

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}

SEEDS = {
    "completion": (COMPLETIONS, {"prompt": "once upon a time", "max_tokens": 4}),
    "completion_ids_n_logprobs": (COMPLETIONS, {"prompt": [5, 6, 7, 8], "max_tokens": 3, "n": 2,
                                               "logprobs": 2, "seed": 7, "temperature": 0.8}),
    "completion_stream_usage": (COMPLETIONS, {"prompt": ["a", "b"], "max_tokens": 3, "stream": True,
                                              "stream_options": {"include_usage": True,
                                                                 "continuous_usage_stats": True}}),
    "completion_echo_stop": (COMPLETIONS, {"prompt": "the cat", "max_tokens": 5, "echo": True,
                                           "stop": ["\n", "dog"], "include_stop_str_in_output": True}),
    "completion_penalties": (COMPLETIONS, {"prompt": "hello", "max_tokens": 4, "presence_penalty": 0.5,
                                           "frequency_penalty": 0.3, "repetition_penalty": 1.2,
                                           "logit_bias": {"5": -100}, "min_tokens": 2,
                                           "bad_words": ["the"], "allowed_token_ids": [5, 6, 7, 8, 9]}),
    "completion_truncate": (COMPLETIONS, {"prompt": "a b c d e f", "max_tokens": 2,
                                          "truncate_prompt_tokens": 3, "top_k": 5, "top_p": 0.9,
                                          "min_p": 0.1, "skip_special_tokens": False}),
    "chat": (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    "chat_stream_tools": (CHAT, {"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "weather in Paris?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
        "tools": [TOOL], "tool_choice": "auto", "max_tokens": 4, "stream": True,
        "chat_template_kwargs": {"enable_thinking": True}}),
    "chat_logprobs": (CHAT, {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 3,
                             "logprobs": True, "top_logprobs": 3, "n": 2, "model": "oasis-embedded"}),
    "chat_template_prompt_logprobs": (CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
        "chat_template": "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}",
        "prompt_logprobs": 2, "spaces_between_special_tokens": False, "skip_special_tokens": False}),
    "completion_echo_logprobs": (COMPLETIONS, {"prompt": "the cat", "max_tokens": 2, "echo": True,
                                               "logprobs": 1, "prompt_logprobs": 1}),
    "chat_json_schema": (CHAT, {"messages": [{"role": "user", "content": "a person"}], "max_tokens": 12,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
            "type": "object", "properties": {"name": {"type": "string", "maxLength": 4},
                                             "tags": {"type": "array", "items": {"enum": ["a", 1, None]}},
                                             "n": {"anyOf": [{"type": "integer"}, {"$ref": "#"}]}},
            "required": ["name"]}}}}),
    "completion_guided": (COMPLETIONS, {"prompt": "yes or no", "max_tokens": 3, "n": 2,
                                        "guided_choice": ["yes", "no"], "temperature": 1.0}),
    "completion_structured_outputs": (COMPLETIONS, {"prompt": "{", "max_tokens": 6, "stream": True,
        "structured_outputs": {"json_object": True, "disable_any_whitespace": True}}),
    "chat_bad_model": (CHAT, {"messages": [{"role": "user", "content": "x"}], "model": "nope"}),
    "tokenize": (TOKENIZE, {"prompt": "hello world", "return_token_strs": True}),
    "tokenize_chat": (TOKENIZE, {"messages": [{"role": "user", "content": "hi"}],
                                 "add_generation_prompt": True}),
    "detokenize": (DETOKENIZE, {"tokens": [5, 6, 7, 8191]}),
    "models": (MODELS, None),
    "health": (HEALTH, None),
    "metrics": (METRICS, None),
}

RAW_SEEDS = {
    "raw_chunked": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                   b"Content-Type: application/json\r\n\r\n"
                   b"1c\r\n{\"prompt\":\"a\",\"max_tokens\":1}\r\n0\r\n\r\n",
    "raw_two_lengths": b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 16\r\n"
                       b"Content-Length: 17\r\n\r\n{\"prompt\":\"abc\"}",
    "raw_pipelined": b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"POST /detokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 14\r\n"
                     b"Connection: close\r\n\r\n{\"tokens\":[5]}",
    "raw_http10": b"GET /v1/models HTTP/1.0\r\n\r\n",
}


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (route, body) in SEEDS.items():
        data = b"" if body is None else json.dumps(body).encode()
        (OUT / name).write_bytes(bytes([route]) + data)
    for name, data in RAW_SEEDS.items():
        (OUT / name).write_bytes(bytes([RAW]) + data)
    print(f"wrote {len(SEEDS) + len(RAW_SEEDS)} seeds to {OUT}")


if __name__ == "__main__":
    main()
