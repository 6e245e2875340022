// Tool-call (hermes, llama3_json) and reasoning (qwen3, deepseek_r1) parsing of generated text:
// whole outputs, and the same outputs streamed in every split (two pieces at every byte, and
// byte by byte), which must give the same calls and content as the whole output.
#include <catch2/catch.hpp>

#include <climits>
#include <functional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/chat_output.h"
#include "server/json_scanner.h"
#include "server/reasoning_parser.h"
#include "server/tool_parser.h"

using namespace oasis::server;

namespace {

// A stream's deltas put together: the calls (announcement + fragments) and the content.
struct Collected {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> calls;
  std::vector<std::string> content_pieces;
};

void Collect(const ChatDelta& d, Collected* c) {
  c->reasoning += d.reasoning;
  c->content += d.content;
  if (!d.content.empty()) c->content_pieces.push_back(d.content);
  for (const ToolCallDelta& t : d.tool_calls) {
    if (t.announce) {
      REQUIRE(t.index == static_cast<int>(c->calls.size()));
      c->calls.push_back(ToolCall{t.id, t.name, ""});
    } else {
      REQUIRE(t.id.empty());
      REQUIRE(t.name.empty());
    }
    REQUIRE(t.index < static_cast<int>(c->calls.size()));
    c->calls[static_cast<size_t>(t.index)].arguments += t.arguments;
  }
}

Collected Stream(const OutputParsing& p, const std::vector<std::string>& pieces) {
  ChatOutputParser parser(p);
  Collected c;
  for (const std::string& piece : pieces) Collect(parser.Feed(piece), &c);
  Collect(parser.Finish(), &c);
  REQUIRE(parser.tool_calls() == static_cast<int>(c.calls.size()));
  return c;
}

OutputParsing Tools(ToolParserKind kind, int max_calls = INT_MAX) {
  OutputParsing p;
  p.tools = kind;
  p.max_tool_calls = max_calls;
  return p;
}

// Every split of `text` into two pieces, and byte by byte, streams to the whole-output result.
void CheckEverySplit(const OutputParsing& p, const std::string& text) {
  const ChatMessageParts whole = ParseChatOutput(p, text);
  auto same = [&](const Collected& c) {
    REQUIRE(c.content == whole.content.value_or(""));
    REQUIRE(c.reasoning == whole.reasoning.value_or(""));
    REQUIRE(c.calls.size() == whole.tool_calls.size());
    for (size_t i = 0; i < c.calls.size(); ++i) {
      REQUIRE(c.calls[i].name == whole.tool_calls[i].name);
      REQUIRE(c.calls[i].arguments == whole.tool_calls[i].arguments);
    }
  };
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    INFO("split at " << cut);
    same(Stream(p, {text.substr(0, cut), text.substr(cut)}));
  }
  std::vector<std::string> bytes;
  for (char ch : text) bytes.emplace_back(1, ch);
  same(Stream(p, bytes));
}

const char* kTwoCalls =
    "I will look both up.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
    "\"Paris\", \"days\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
    "\"arguments\": {\"zone\": \"Europe/Paris\", \"fmt\": [1, 2.5e3, true, null]}}\n</tool_call>"
    "\nDone.";

}  // namespace

TEST_CASE("JsonObjectScanner validates incrementally and locates top-level members", "[tools]") {
  JsonObjectScanner s;
  const std::string text =
      R"({"name": "f", "arguments": {"a": [1, {"b": "}"}]}, "n": -0.5e+2} tail)";
  const size_t used = s.Feed(text);
  REQUIRE(s.state() == JsonObjectScanner::State::kComplete);
  REQUIRE(text.substr(used) == " tail");
  const auto* args = s.Find("arguments");
  REQUIRE(args != nullptr);
  REQUIRE(text.substr(args->begin, args->end - args->begin) == R"({"a": [1, {"b": "}"}]})");
  const auto* n = s.Find("n");
  REQUIRE(text.substr(n->begin, n->end - n->begin) == "-0.5e+2");
  for (const char* bad : {"[1]", "{\"a\": 01}", "{\"a\": tru}", "{\"a\" 1}", "{\"a\": 1,}",
                          "{'a': 1}", "{\"a\": \"\\x\"}", "{\"a\": \"\x01\"}", "{\"a\": 1]"}) {
    JsonObjectScanner b;
    b.Feed(bad);
    INFO(bad);
    REQUIRE(b.state() == JsonObjectScanner::State::kError);
  }
  JsonObjectScanner partial;
  partial.Feed(R"({"name": "f", "arguments": {"a": "x)");
  REQUIRE(partial.state() == JsonObjectScanner::State::kIncomplete);
  REQUIRE(partial.Find("arguments")->end == JsonObjectScanner::kOpen);
  REQUIRE(IsJsonNumber("0"));
  REQUIRE(IsJsonNumber("-12.5E-3"));
  REQUIRE_FALSE(IsJsonNumber("1."));
  REQUIRE_FALSE(IsJsonNumber("-"));
  REQUIRE_FALSE(IsJsonNumber("+1"));
}

TEST_CASE("hermes: several calls with text before, between and after", "[tools]") {
  const ChatMessageParts m = ParseChatOutput(Tools(ToolParserKind::kHermes), kTwoCalls);
  REQUIRE(m.tool_calls.size() == 2);
  REQUIRE(m.tool_calls[0].name == "get_weather");
  REQUIRE(m.tool_calls[0].arguments == R"({"city": "Paris", "days": 3})");
  REQUIRE(m.tool_calls[1].name == "get_time");
  REQUIRE(m.tool_calls[1].arguments ==
          R"({"zone": "Europe/Paris", "fmt": [1, 2.5e3, true, null]})");
  REQUIRE(m.content == std::optional<std::string>("I will look both up.\nDone."));
  REQUIRE_FALSE(m.reasoning.has_value());
  const std::regex id("chatcmpl-tool-[0-9a-f]{32}");
  REQUIRE(std::regex_match(m.tool_calls[0].id, id));
  REQUIRE(m.tool_calls[0].id != m.tool_calls[1].id);
  CheckEverySplit(Tools(ToolParserKind::kHermes), kTwoCalls);
}

TEST_CASE("hermes: only calls gives null content; parallel_tool_calls=false keeps the first",
          "[tools]") {
  const std::string text =
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": 1}}\n</tool_call>\n";
  ChatMessageParts m = ParseChatOutput(Tools(ToolParserKind::kHermes), text);
  REQUIRE_FALSE(m.content.has_value());
  REQUIRE(m.tool_calls.size() == 2);
  REQUIRE(m.tool_calls[0].arguments == "{}");
  m = ParseChatOutput(Tools(ToolParserKind::kHermes, 1), text);
  REQUIRE(m.tool_calls.size() == 1);
  REQUIRE(m.tool_calls[0].name == "a");
  REQUIRE_FALSE(m.content.has_value());
  CheckEverySplit(Tools(ToolParserKind::kHermes, 1), text);
}

TEST_CASE("hermes: a call whose JSON is no call stays text", "[tools]") {
  // (Streamed, a call is text only while it breaks before it was announced — before its name
  // and the start of its arguments are both known; the first two break after that.)
  const std::vector<std::pair<std::string, bool>> calls = {
      {"{\"name\": \"f\", \"arguments\": {bad}}", false},
      {"{\"name\": \"f\", \"arguments\": {\"a\": 1}", false},
      {"{\"name\": \"f\", \"arguments\": {}} x", false},
      {"{\"name\": \"f\"}", true},
      {"{\"arguments\": {}}", true},
      {"{\"name\": 3, \"arguments\": {}}", true},
      {"not json at all", true},
      {"{\"name\": \"f\" \"arguments\": {}}", true},
      {"[{\"name\": \"f\", \"arguments\": {}}]", true}};
  for (const auto& [call, streamed_as_text] : calls) {
    const std::string text = "Before\n<tool_call>\n" + call + "\n</tool_call>\nafter";
    INFO(text);
    const ChatMessageParts m = ParseChatOutput(Tools(ToolParserKind::kHermes), text);
    REQUIRE(m.tool_calls.empty());
    REQUIRE(m.content == std::optional<std::string>(text));
    if (streamed_as_text) CheckEverySplit(Tools(ToolParserKind::kHermes), text);
  }
  // A good call after a bad one is still a call.
  const std::string mixed =
      "<tool_call>{oops}</tool_call> then <tool_call>{\"name\": \"g\", \"arguments\": {}}"
      "</tool_call>";
  const ChatMessageParts m = ParseChatOutput(Tools(ToolParserKind::kHermes), mixed);
  REQUIRE(m.tool_calls.size() == 1);
  REQUIRE(m.content == std::optional<std::string>("<tool_call>{oops}</tool_call> then"));
  CheckEverySplit(Tools(ToolParserKind::kHermes), mixed);
}

TEST_CASE("hermes: an unclosed last call counts when its JSON is complete", "[tools]") {
  const std::string text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}\n</tool";
  const ChatMessageParts m = ParseChatOutput(Tools(ToolParserKind::kHermes), text);
  REQUIRE(m.tool_calls.size() == 1);
  REQUIRE(m.tool_calls[0].arguments == R"({"q": "x"})");
  REQUIRE_FALSE(m.content.has_value());
  CheckEverySplit(Tools(ToolParserKind::kHermes), text);
  const std::string cut = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"x";
  const ChatMessageParts c = ParseChatOutput(Tools(ToolParserKind::kHermes), cut);
  REQUIRE(c.tool_calls.empty());
  REQUIRE(c.content == std::optional<std::string>(cut));
}

TEST_CASE("hermes: unicode and escapes in arguments pass through byte for byte", "[tools]") {
  const std::string args =
      "{\"city\": \"Z\xC3\xBCrich \xE6\x9D\xB1\xE4\xBA\xAC \xF0\x9F\x9A\x80\", "
      "\"note\": \"caf\\u00e9 \\\"q\\\" \\\\ \\n\"}";
  const std::string text =
      "\xC3\x89t\xC3\xA9 <tool_call>{\"name\": \"m\xC3\xA9t\xC3\xA9o\", \"arguments\": " + args +
      "}</tool_call>";
  const ChatMessageParts m = ParseChatOutput(Tools(ToolParserKind::kHermes), text);
  REQUIRE(m.tool_calls.size() == 1);
  REQUIRE(m.tool_calls[0].name == "m\xC3\xA9t\xC3\xA9o");
  REQUIRE(m.tool_calls[0].arguments == args);
  REQUIRE(nlohmann::json::parse(m.tool_calls[0].arguments)["note"] == "caf\xC3\xA9 \"q\" \\ \n");
  REQUIRE(m.content == std::optional<std::string>("\xC3\x89t\xC3\xA9"));
  CheckEverySplit(Tools(ToolParserKind::kHermes), text);
}

TEST_CASE("hermes streaming: announcement, then argument fragments; tags held back", "[tools]") {
  ToolCallParser p(ToolParserKind::kHermes, INT_MAX);
  ToolStreamDelta d = p.Feed("Sure. <tool_");
  REQUIRE(d.content == "Sure.");  // the space and the partial tag wait
  REQUIRE(d.calls.empty());
  d = p.Feed("call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci");
  REQUIRE(d.content.empty());
  REQUIRE(d.calls.size() == 1);
  REQUIRE(d.calls[0].announce);
  REQUIRE(d.calls[0].index == 0);
  REQUIRE(d.calls[0].name == "get_weather");
  REQUIRE(d.calls[0].arguments == "{\"ci");
  d = p.Feed("ty\": \"Paris\"}}\n</tool_call>");
  REQUIRE(d.calls.size() == 1);
  REQUIRE_FALSE(d.calls[0].announce);
  REQUIRE(d.calls[0].arguments == "ty\": \"Paris\"}");
  d = p.Feed("\n");
  REQUIRE(d.empty());
  d = p.Finish();
  REQUIRE(d.empty());
  REQUIRE(p.calls() == 1);
}

TEST_CASE("hermes streaming: a call that breaks after its announcement ends there", "[tools]") {
  ToolCallParser p(ToolParserKind::kHermes, INT_MAX);
  ToolStreamDelta d = p.Feed("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1");
  REQUIRE(d.calls.size() == 1);
  d = p.Feed("]] junk</tool_call> and then text");
  REQUIRE(d.calls.empty());
  REQUIRE(d.content == "and then text");
  REQUIRE(p.Finish().empty());
  REQUIRE(p.calls() == 1);
}

TEST_CASE("llama3_json: calls at the start, after <|python_tag|>, separated by ';'", "[tools]") {
  const std::string text =
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", "
      "\"arguments\": {\"y\": \"\xE2\x82\xAC\"}}";
  const OutputParsing p = Tools(ToolParserKind::kLlama3Json);
  ChatMessageParts m = ParseChatOutput(p, text);
  REQUIRE(m.tool_calls.size() == 2);
  REQUIRE(m.tool_calls[0].name == "a");
  REQUIRE(m.tool_calls[0].arguments == R"({"x": 1})");
  REQUIRE(m.tool_calls[1].arguments == "{\"y\": \"\xE2\x82\xAC\"}");
  REQUIRE_FALSE(m.content.has_value());
  CheckEverySplit(p, text);
  // Without the tag (skip_special_tokens drops it) and with leading whitespace.
  m = ParseChatOutput(p, "  {\"name\": \"a\", \"parameters\": {}}");
  REQUIRE(m.tool_calls.size() == 1);
  // Not at the start, not a call object, or malformed: text (streamed too, as long as the JSON
  // breaks before the call was announced: "{]" after '"parameters": {' is announced first).
  for (const std::string plain :
       {"The answer is {\"name\": \"a\", \"parameters\": {}}", "{\"answer\": 42}",
        "{\"name\": \"a\", \"parameters\": {]}", "<|python_tag|>print(1)", "<|python", "{",
        "{\"name\": \"a\" \"parameters\": {}}"}) {
    INFO(plain);
    m = ParseChatOutput(p, plain);
    REQUIRE(m.tool_calls.empty());
    REQUIRE(m.content == std::optional<std::string>(plain));
    if (plain.find("{]") == std::string::npos) CheckEverySplit(p, plain);
  }
  // Text after the calls is content.
  m = ParseChatOutput(p, "{\"name\": \"a\", \"parameters\": {}}\nThat is all.");
  REQUIRE(m.tool_calls.size() == 1);
  REQUIRE(m.content == std::optional<std::string>("That is all."));
}

TEST_CASE("no tool parser: text passes through", "[tools]") {
  const ChatMessageParts m = ParseChatOutput(OutputParsing{}, kTwoCalls);
  REQUIRE(m.tool_calls.empty());
  REQUIRE(m.content == std::optional<std::string>(kTwoCalls));
  REQUIRE_FALSE(ParseToolParserKind("mistral").ok());
  REQUIRE(*ParseToolParserKind("") == ToolParserKind::kNone);
}

TEST_CASE("reasoning qwen3: <think> block split out, every split", "[reasoning]") {
  OutputParsing p;
  p.reasoning = ReasoningParserKind::kQwen3;
  const std::string text = "<think>\nLet me think \xE2\x80\x94 2+2.\n</think>\n\nIt is 4.";
  ChatMessageParts m = ParseChatOutput(p, text);
  REQUIRE(m.reasoning == std::optional<std::string>("\nLet me think \xE2\x80\x94 2+2.\n"));
  REQUIRE(m.content == std::optional<std::string>("\n\nIt is 4."));
  CheckEverySplit(p, text);
  // No <think>: content (unless the prompt opened the block).
  m = ParseChatOutput(p, "Just 4. </think> stays");
  REQUIRE_FALSE(m.reasoning.has_value());
  REQUIRE(m.content == std::optional<std::string>("Just 4. </think> stays"));
  p.reasoning_open_at_start = true;
  m = ParseChatOutput(p, "hmm</think>4");
  REQUIRE(m.reasoning == std::optional<std::string>("hmm"));
  REQUIRE(m.content == std::optional<std::string>("4"));
  CheckEverySplit(p, "hmm</think>4");
  // Cut short while thinking: all reasoning, no content.
  m = ParseChatOutput(p, "still thinking </thi");
  REQUIRE(m.reasoning == std::optional<std::string>("still thinking </thi"));
  REQUIRE_FALSE(m.content.has_value());
}

TEST_CASE("reasoning deepseek_r1: reasoning until </think> even without <think>", "[reasoning]") {
  OutputParsing p;
  p.reasoning = ReasoningParserKind::kDeepSeekR1;
  ChatMessageParts m = ParseChatOutput(p, "a</think>b");
  REQUIRE(m.reasoning == std::optional<std::string>("a"));
  REQUIRE(m.content == std::optional<std::string>("b"));
  m = ParseChatOutput(p, "no end");
  REQUIRE(m.reasoning == std::optional<std::string>("no end"));
  REQUIRE_FALSE(m.content.has_value());
  REQUIRE(PromptOpensThinking("<|im_start|>assistant\n<think>\n"));
  REQUIRE_FALSE(PromptOpensThinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  REQUIRE_FALSE(PromptOpensThinking("<|im_start|>assistant\n"));
  // A <think> in the conversation is no open block.
  REQUIRE_FALSE(PromptOpensThinking(
      "<|im_start|>user\nWhat does <think> do?<|im_end|>\n<|im_start|>assistant\n"));
  REQUIRE_FALSE(ParseReasoningParserKind("granite").ok());
}

TEST_CASE("reasoning then tool calls in the content", "[reasoning][tools]") {
  OutputParsing p = Tools(ToolParserKind::kHermes);
  p.reasoning = ReasoningParserKind::kQwen3;
  const std::string text =
      "<think>\nI need <tool_call> weather.\n</think>\n\n<tool_call>\n{\"name\": \"w\", "
      "\"arguments\": {\"c\": \"Oslo\"}}\n</tool_call>";
  const ChatMessageParts m = ParseChatOutput(p, text);
  REQUIRE(m.reasoning == std::optional<std::string>("\nI need <tool_call> weather.\n"));
  REQUIRE(m.tool_calls.size() == 1);
  REQUIRE(m.tool_calls[0].arguments == R"({"c": "Oslo"})");
  REQUIRE_FALSE(m.content.has_value());
  CheckEverySplit(p, text);
}

TEST_CASE("random well-formed calls amid text: streamed in random pieces = whole", "[tools]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  auto pick = [&](std::initializer_list<const char*> from) {
    return std::string(*(from.begin() + rng() % from.size()));
  };
  // A random JSON value (strings with unicode and escapes), depth-limited.
  std::function<nlohmann::ordered_json(int)> value = [&](int depth) -> nlohmann::ordered_json {
    switch (rng() % (depth > 2 ? 4 : 6)) {
      case 0:
        return static_cast<int64_t>(rng() % 2000) - 1000;
      case 1:
        return pick({"x", "caf\xC3\xA9", "\xF0\x9F\x9A\x80 }{", "a\"b\\c\n", "</tool_call>?", ""});
      case 2:
        return rng() % 2 == 0;
      case 3:
        return nullptr;
      case 4: {
        nlohmann::ordered_json a = nlohmann::ordered_json::array();
        for (int i = static_cast<int>(rng() % 3); i > 0; --i) a.push_back(value(depth + 1));
        return a;
      }
      default: {
        nlohmann::ordered_json o = nlohmann::ordered_json::object();
        for (int i = static_cast<int>(rng() % 3); i > 0; --i)
          o["k" + std::to_string(rng() % 9)] = value(depth + 1);
        return o;
      }
    }
  };
  for (int round = 0; round < 200; ++round) {
    std::string text;
    std::vector<std::pair<std::string, std::string>> expected;  // name, arguments
    const int n = static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i) {
      text += pick({"", "Hi.", "Let me see: ", "\xE4\xBD\xA0\xE5\xA5\xBD ", "a < b"});
      text += pick({"", "\n", " "});
      nlohmann::ordered_json args = nlohmann::ordered_json::object();
      for (int k = static_cast<int>(rng() % 3); k > 0; --k)
        args["p" + std::to_string(k)] = value(1);
      const std::string args_text = args.dump(rng() % 2 == 0 ? -1 : 1);
      const std::string name = pick({"f", "get_weather", "n\xC3\xA4me"});
      text += "<tool_call>" + pick({"", "\n"}) + "{\"name\": \"" + name +
              "\", \"arguments\": " + args_text + "}" + pick({"", "\n"}) + "</tool_call>";
      expected.emplace_back(name, args_text);
    }
    text += pick({"", "\nDone.", " bye"});
    INFO(text);
    const OutputParsing p = Tools(ToolParserKind::kHermes);
    const ChatMessageParts whole = ParseChatOutput(p, text);
    REQUIRE(whole.tool_calls.size() == expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      REQUIRE(whole.tool_calls[i].name == expected[i].first);
      REQUIRE(whole.tool_calls[i].arguments == expected[i].second);
    }
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size();) {
      const size_t len = std::min<size_t>(1 + rng() % 7, text.size() - at);
      pieces.push_back(text.substr(at, len));
      at += len;
    }
    const Collected c = Stream(p, pieces);
    REQUIRE(c.content == whole.content.value_or(""));
    REQUIRE(c.calls.size() == expected.size());
    for (size_t i = 0; i < expected.size(); ++i)
      REQUIRE(c.calls[i].arguments == expected[i].second);
  }
}
