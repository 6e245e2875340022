// Tool calling and reasoning at the API: tool_choice / parallel_tool_calls validation against the
// server's flags, the history round trip (assistant tool_calls with null content, tool messages)
// rendered by the real Qwen3 and Llama 3.1 templates, and the answers' JSON (message.tool_calls,
// reasoning_content, finish_reason "tool_calls", streamed deltas).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>

#include "server/openai_protocol.h"
#include "server/openai_response.h"
#include "test_support.h"
#include "tokenizer/jinja/chat_template.h"
#include "tokenizer/structured/grammar.h"

using namespace oasis;
using namespace oasis::server;

namespace {

ProtocolLimits ToolLimits(bool auto_choice, ToolParserKind parser,
                          ReasoningParserKind reasoning = ReasoningParserKind::kNone) {
  ProtocolLimits l;
  l.max_model_len = 4096;
  l.enable_auto_tool_choice = auto_choice;
  l.tool_parser = parser;
  l.reasoning_parser = reasoning;
  return l;
}

const char* kTools =
    R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}}}}])";

std::string ChatBody(const std::string& extra) {
  return R"({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": )" +
         std::string(kTools) + (extra.empty() ? "" : ", " + extra) + "}";
}

std::optional<GenerateSpec> Parse(const std::string& body, const ProtocolLimits& l, ApiError* err) {
  return ParseChatRequest(Json::parse(body), l, err);
}

void ExpectBad(const std::string& body, const ProtocolLimits& l, const std::string& param,
               const std::string& words) {
  ApiError err;
  INFO(body);
  REQUIRE_FALSE(Parse(body, l, &err).has_value());
  CHECK(err.http_status == 400);
  CHECK(err.param == param);
  INFO(err.message);
  CHECK(err.message.find(words) != std::string::npos);
}

// The real template, from ../shared/data/chat_templates or the test-data cache; nullopt if absent.
std::optional<ChatTemplate> RealTemplate(const std::string& shared_file,
                                         const std::string& cache_dir) {
  std::string source;
  if (auto shared = oasis::testing::SharedDir();
      shared && std::filesystem::exists(*shared / "data/chat_templates" / shared_file)) {
    source = oasis::testing::ReadFileOrFail(*shared / "data/chat_templates" / shared_file);
  } else if (auto p = oasis::testing::CacheDir() / cache_dir / "tokenizer_config.json";
             !cache_dir.empty() && std::filesystem::exists(p)) {
    auto files = ChatTemplate::LoadFromTokenizerConfig(p);
    REQUIRE(files.ok());
    source = files->chat_template;
  } else {
    return std::nullopt;
  }
  auto t = ChatTemplate::Parse(source);
  REQUIRE(t.ok());
  return std::move(t).value();
}

// A conversation with a tool round trip, as the openai client sends it back.
const char* kRoundTrip = R"({"messages": [
  {"role": "user", "content": "Weather in Paris?"},
  {"role": "assistant", "content": null, "tool_calls": [{"id": "chatcmpl-tool-1", "type": "function",
    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"°C\"}"}}]},
  {"role": "tool", "tool_call_id": "chatcmpl-tool-1", "content": "18 degrees"}],
  "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]})";

Json RenderContext(const GenerateSpec& spec) {
  Json ctx = Json::object();
  ctx["messages"] = spec.messages;
  ctx["tools"] = spec.tools;
  ctx["add_generation_prompt"] = true;
  ctx["bos_token"] = "<|begin_of_text|>";
  return ctx;
}

}  // namespace

TEST_CASE("tool_choice against the server's flags", "[tools]") {
  const ProtocolLimits on = ToolLimits(true, ToolParserKind::kHermes);
  const ProtocolLimits parser_only = ToolLimits(false, ToolParserKind::kHermes);
  const ProtocolLimits off = ToolLimits(false, ToolParserKind::kNone);
  ApiError err;
  // Absent: "auto" when enabled, else the tools are only rendered (as before).
  REQUIRE(Parse(ChatBody(""), on, &err)->output.tools == ToolParserKind::kHermes);
  REQUIRE(Parse(ChatBody(""), off, &err)->output.tools == ToolParserKind::kNone);
  REQUIRE(Parse(ChatBody(""), parser_only, &err)->output.tools == ToolParserKind::kNone);
  REQUIRE(Parse(ChatBody(R"("tool_choice": "auto")"), on, &err)->output.tools ==
          ToolParserKind::kHermes);
  // "none": rendered, not parsed.
  auto none = Parse(ChatBody(R"("tool_choice": "none")"), on, &err);
  REQUIRE(none->output.tools == ToolParserKind::kNone);
  REQUIRE(none->tools.size() == 1);
  REQUIRE(Parse(ChatBody(R"("tool_choice": "none")"), off, &err).has_value());
  // No tools in the request: nothing to parse.
  REQUIRE(Parse(R"({"messages": [{"role": "user", "content": "x"}]})", on, &err)->output.tools ==
          ToolParserKind::kNone);
  // "auto" without the flags: vLLM's 400.
  for (const ProtocolLimits& l : {off, parser_only}) {
    ExpectBad(ChatBody(R"("tool_choice": "auto")"), l, "tool_choice",
              "requires --enable-auto-tool-choice and --tool-call-parser");
  }
  // Forced calls ("required", a named function): by constrained decoding, with or without the
  // flags; the answer is parsed as llama3_json calls (the format the grammar generates).
  for (const ProtocolLimits& l : {on, off}) {
    auto required = Parse(ChatBody(R"("tool_choice": "required")"), l, &err);
    INFO(err.message);
    REQUIRE(required);
    CHECK(required->grammar != nullptr);
    CHECK(required->grammar_param == "tool_choice");
    CHECK(required->output.tools == ToolParserKind::kLlama3Json);
    CHECK(required->output.max_tool_calls > 1);
    auto named = Parse(
        ChatBody(R"("tool_choice": {"type": "function", "function": {"name": "get_weather"}})"), l,
        &err);
    REQUIRE(named);
    CHECK(named->grammar != nullptr);
    CHECK(named->output.max_tool_calls == 1);
    CHECK(Parse(ChatBody(R"("tool_choice": "required", "parallel_tool_calls": false)"), l, &err)
              ->output.max_tool_calls == 1);
    ExpectBad(ChatBody(R"("tool_choice": {"type": "function", "function": {"name": "other"}})"), l,
              "tool_choice", "not among 'tools'");
    ExpectBad(ChatBody(R"("tool_choice": {"type": "function", "function": {}})"), l, "tool_choice",
              "naming a function");
    ExpectBad(ChatBody(R"("tool_choice": "required", "response_format": {"type": "json_object"})"),
              l, "tool_choice", "cannot be combined");
    ExpectBad(ChatBody(R"("tool_choice": "required", "ignore_eos": true)"), l, "ignore_eos",
              "cannot be combined with 'tool_choice'");
    ExpectBad(
        R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required", "tools": [{"type": "function",
            "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string", "pattern": "[z-a]"}}}}}]})",
        l, "tool_choice",
        "tool 'f': JSON schema at #/properties/a/pattern: regex: bad character range");
  }
  ExpectBad(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"})", on,
            "tool_choice", "needs 'tools'");
  ExpectBad(ChatBody(R"("tool_choice": "sometimes")"), on, "tool_choice", "must be");
  ExpectBad(ChatBody(R"("tool_choice": 3)"), on, "tool_choice", "must be");
  // parallel_tool_calls=false keeps the first call.
  REQUIRE(Parse(ChatBody(R"("parallel_tool_calls": false)"), on, &err)->output.max_tool_calls == 1);
  REQUIRE(Parse(ChatBody(""), on, &err)->output.max_tool_calls > 1);
  ExpectBad(ChatBody(R"("parallel_tool_calls": "no")"), on, "parallel_tool_calls", "boolean");
  // Tools themselves.
  ExpectBad(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})",
            on, "tools[0].function", "'name'");
  ExpectBad(
      R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "code", "function": {"name": "f"}}]})",
      on, "tools[0].type", "function");
}

TEST_CASE("reasoning parser per request: off with enable_thinking false", "[reasoning]") {
  const ProtocolLimits l = ToolLimits(false, ToolParserKind::kNone, ReasoningParserKind::kQwen3);
  ApiError err;
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  REQUIRE(Parse("{" + msgs + "}", l, &err)->output.reasoning == ReasoningParserKind::kQwen3);
  REQUIRE(Parse("{" + msgs + R"(, "chat_template_kwargs": {"enable_thinking": false}})", l, &err)
              ->output.reasoning == ReasoningParserKind::kNone);
  REQUIRE(Parse("{" + msgs + R"(, "chat_template_kwargs": {"enable_thinking": true}})", l, &err)
              ->output.reasoning == ReasoningParserKind::kQwen3);
}

TEST_CASE("history: null content and tool_calls normalised as vLLM does", "[tools]") {
  ApiError err;
  auto spec = Parse(kRoundTrip, ToolLimits(true, ToolParserKind::kHermes), &err);
  INFO(err.message);
  REQUIRE(spec.has_value());
  const Json& assistant = spec->messages[1];
  REQUIRE(assistant["content"] == "");
  const Json& args = assistant["tool_calls"][0]["function"]["arguments"];
  REQUIRE(args.is_object());
  REQUIRE(args.dump() == "{\"city\":\"Paris\",\"unit\":\"°C\"}");  // order kept
  REQUIRE(spec->messages[2]["tool_call_id"] == "chatcmpl-tool-1");
  // Absent content too; tool_calls: null is dropped (templates test `'tool_calls' in message`).
  spec = Parse(R"({"messages": [{"role": "user", "content": null},
      {"role": "assistant", "tool_calls": null}]})",
               ToolLimits(false, ToolParserKind::kNone), &err);
  REQUIRE(spec->messages[0]["content"] == "");
  REQUIRE(spec->messages[1]["content"] == "");
  REQUIRE_FALSE(spec->messages[1].contains("tool_calls"));
  const ProtocolLimits l = ToolLimits(false, ToolParserKind::kNone);
  auto bad_call = [&](const std::string& call, const std::string& param, const std::string& words) {
    ExpectBad(
        R"({"messages": [{"role": "assistant", "content": null, "tool_calls": [)" + call + "]}]}",
        l, "messages[0].tool_calls[0]" + param, words);
  };
  bad_call(R"({"type": "function", "function": {"name": "f", "arguments": "{not json"}})",
           ".function.arguments", "JSON");
  bad_call(R"({"type": "function", "function": {"arguments": "{}"}})", ".function.name", "name");
  bad_call(R"({"type": "function"})", ".function", "function");
  bad_call(R"({"type": "code", "function": {"name": "f"}})", ".type", "function");
  bad_call(R"({"function": {"name": "f", "arguments": 7}})", ".function.arguments", "object");
  ExpectBad(R"({"messages": [{"role": "assistant", "tool_calls": {}}]})", l,
            "messages[0].tool_calls", "list");
  ExpectBad(R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})", l,
            "messages[0].tool_calls", "assistant");
  ExpectBad(R"({"messages": [{"role": "tool", "content": "x", "tool_call_id": 5}]})", l,
            "messages[0].tool_call_id", "string");
}

TEST_CASE("history round trip renders with the real Qwen3 and Llama 3.1 templates", "[tools]") {
  ApiError err;
  auto spec = Parse(kRoundTrip, ToolLimits(true, ToolParserKind::kHermes), &err);
  REQUIRE(spec.has_value());
  int rendered = 0;
  if (auto qwen3 = RealTemplate("Qwen-Qwen3-0.6B.jinja", "qwen3")) {
    auto text = qwen3->Render(RenderContext(*spec));
    INFO(text.status().ToString());
    REQUIRE(text.ok());
    // Python's json.dumps of the parsed arguments, as transformers renders it.
    CHECK(text->find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", "
                     "\"arguments\": {\"city\": \"Paris\", \"unit\": \"°C\"}}\n</tool_call>"
                     "<|im_end|>\n<|im_start|>user\n<tool_response>\n18 degrees\n"
                     "</tool_response><|im_end|>\n<|im_start|>assistant\n") != std::string::npos);
    ++rendered;
  }
  // (Jinja2 finds a string `iterable`: Llama 3.1's template writes the tool result as JSON.)
  if (auto llama = RealTemplate("meta-llama-Llama-3.1-8B-Instruct.jinja", "")) {
    auto text = llama->Render(RenderContext(*spec));
    INFO(text.status().ToString());
    REQUIRE(text.ok());
    CHECK(text->find("<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": "
                     "\"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"°C\"}}"
                     "<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n\"18 degrees\""
                     "<|eot_id|>") != std::string::npos);
    ++rendered;
  }
  if (rendered == 0)
    WARN("no real chat template found (../shared or the test-data cache): skipped");
}

TEST_CASE("answers: message.tool_calls, reasoning_content, finish_reason tool_calls",
          "[tools][reasoning]") {
  GenerateSpec spec;
  spec.endpoint = Endpoint::kChatCompletions;
  spec.output.tools = ToolParserKind::kHermes;
  spec.output.reasoning = ReasoningParserKind::kQwen3;
  ResponseBuilder b(spec, "chatcmpl-1", "m", 1, nullptr);
  ChoiceState c;
  c.text =
      "<think>\nweather\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\"}}\n</tool_call>";
  c.finished = true;
  c.finish_reason = FinishReasonKind::kStop;
  Json j = Json::parse(DumpJson(b.Final({c}, Usage{3, 9}, {})));
  const Json& m = j["choices"][0]["message"];
  REQUIRE(m["content"].is_null());
  REQUIRE(m["reasoning_content"] == "\nweather\n");
  REQUIRE(m["tool_calls"].size() == 1);
  REQUIRE(m["tool_calls"][0]["type"] == "function");
  REQUIRE(std::regex_match(m["tool_calls"][0]["id"].get<std::string>(),
                           std::regex("chatcmpl-tool-[0-9a-f]{32}")));
  REQUIRE(m["tool_calls"][0]["function"]["name"] == "get_weather");
  REQUIRE(m["tool_calls"][0]["function"]["arguments"] == "{\"city\": \"Paris\"}");
  REQUIRE(j["choices"][0]["finish_reason"] == "tool_calls");
  // No call: content, "stop", tool_calls [].
  c.text = "Sunny.";
  j = Json::parse(DumpJson(b.Final({c}, Usage{3, 2}, {})));
  REQUIRE(j["choices"][0]["message"]["content"] == "Sunny.");
  REQUIRE(j["choices"][0]["message"]["tool_calls"].empty());
  REQUIRE(j["choices"][0]["message"]["reasoning_content"].is_null());
  REQUIRE(j["choices"][0]["finish_reason"] == "stop");
}

TEST_CASE("streamed answers: reasoning, content and tool-call deltas", "[tools][reasoning]") {
  GenerateSpec spec;
  spec.endpoint = Endpoint::kChatCompletions;
  spec.output.tools = ToolParserKind::kHermes;
  spec.output.reasoning = ReasoningParserKind::kQwen3;
  ResponseBuilder b(spec, "chatcmpl-2", "m", 1, nullptr);
  ChoiceState state;
  auto chunk = [&](const std::string& text, bool finished) {
    RequestOutput out;
    out.text = text;
    out.finished = finished;
    out.finish_reason = finished ? FinishReasonKind::kStop : FinishReasonKind::kNone;
    state.Add(out);
    return b.Chunk(state, out, "");
  };
  REQUIRE(chunk("<thi", false).is_null());  // held back: nothing to send
  Json j = chunk("nk>hm", false);
  REQUIRE(j["choices"][0]["delta"] == Json{{"reasoning_content", "hm"}});
  j = chunk("</think>OK <tool_call>{\"name\": \"f\", \"arguments\": {\"a\"", false);
  REQUIRE(j["choices"][0]["delta"]["content"] == "OK");
  const Json& call = j["choices"][0]["delta"]["tool_calls"][0];
  REQUIRE(call["index"] == 0);
  REQUIRE(call["type"] == "function");
  REQUIRE(call["function"]["name"] == "f");
  REQUIRE(call["function"]["arguments"] == "{\"a\"");
  REQUIRE(j["choices"][0]["finish_reason"].is_null());
  j = chunk(": 1}}</tool_call>", true);
  REQUIRE(j["choices"][0]["delta"]["tool_calls"][0] ==
          Json{{"index", 0}, {"function", {{"arguments", ": 1}"}}}});
  REQUIRE_FALSE(j["choices"][0]["delta"]["tool_calls"][0].contains("id"));
  REQUIRE(j["choices"][0]["finish_reason"] == "tool_calls");
}

TEST_CASE("hermes parsing keeps special tokens in the text (vLLM's adjust_request)", "[tools]") {
  ApiError err;
  const ProtocolLimits on = ToolLimits(true, ToolParserKind::kHermes);
  CHECK_FALSE(Parse(ChatBody(""), on, &err)->skip_special_tokens);
  CHECK(Parse(ChatBody(R"("tool_choice": "none")"), on, &err)->skip_special_tokens);
  CHECK(Parse(ChatBody(""), ToolLimits(true, ToolParserKind::kLlama3Json), &err)
            ->skip_special_tokens);
}

TEST_CASE("forced tool calls: the grammar's text comes back as tool_calls", "[tools][structured]") {
  ApiError err;
  auto spec = Parse(ChatBody(R"("tool_choice": "required")"),
                    ToolLimits(false, ToolParserKind::kNone), &err);
  REQUIRE(spec);
  structured::GrammarMatcher m(spec->grammar);
  const std::string two =
      R"({"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_weather", "parameters": {}})";
  const int32_t s = m.Next(m.start(), two);
  REQUIRE(s >= 0);
  CHECK(m.Accepting(s));
  CHECK(m.Next(m.start(), std::string(R"({"name": "other", )")) < 0);
  CHECK(m.Next(m.start(), std::string(" {")) < 0);  // the call comes first
  ResponseBuilder b(*spec, "chatcmpl-3", "m", 1, nullptr);
  ChoiceState c;
  c.text = two;
  c.finished = true;
  c.finish_reason = FinishReasonKind::kStop;
  Json j = Json::parse(DumpJson(b.Final({c}, Usage{3, 9}, {})));
  const Json& msg = j["choices"][0]["message"];
  CHECK(msg["content"].is_null());
  REQUIRE(msg["tool_calls"].size() == 2);
  CHECK(msg["tool_calls"][0]["function"]["name"] == "get_weather");
  CHECK(msg["tool_calls"][0]["function"]["arguments"] == R"({"city": "Paris"})");
  CHECK(msg["tool_calls"][1]["function"]["arguments"] == "{}");
  CHECK(j["choices"][0]["finish_reason"] == "tool_calls");
  // A named function: exactly one call of it.
  auto named =
      Parse(ChatBody(R"("tool_choice": {"type": "function", "function": {"name": "get_weather"}})"),
            ToolLimits(false, ToolParserKind::kNone), &err);
  REQUIRE(named);
  structured::GrammarMatcher n(named->grammar);
  const std::string one = R"({"name": "get_weather", "parameters": {"city": "Rome"}})";
  CHECK(n.Accepting(n.Next(n.start(), one)));
  CHECK(n.Next(n.start(), one + ";") < 0);
}
