// Request parsing and validation of /v1/completions and /v1/chat/completions.
#include <catch2/catch.hpp>

#include <cmath>
#include <tuple>

#include "server/chat_template_cache.h"
#include "server/openai_protocol.h"

using namespace oasis;
using namespace oasis::server;

namespace {

ProtocolLimits Limits() {
  ProtocolLimits l;
  l.max_model_len = 4096;
  l.max_n = 8;
  return l;
}

std::optional<GenerateSpec> Completion(const std::string& body, ApiError* err) {
  return ParseCompletionRequest(Json::parse(body), Limits(), err);
}

std::optional<GenerateSpec> Chat(const std::string& body, ApiError* err) {
  return ParseChatRequest(Json::parse(body), Limits(), err);
}

// The request is rejected with a 400 naming `param`.
void ExpectBad(const std::string& body, const std::string& param, bool chat = false) {
  ApiError err;
  auto spec = chat ? Chat(body, &err) : Completion(body, &err);
  INFO(body);
  CHECK_FALSE(spec.has_value());
  CHECK(err.http_status == 400);
  CHECK(err.type == "invalid_request_error");
  CHECK(err.param == param);
  CHECK_FALSE(err.message.empty());
}

}  // namespace

TEST_CASE("completion prompts: string, strings, ids, lists of ids") {
  ApiError err;
  auto s = Completion(R"({"prompt": "hello"})", &err);
  REQUIRE(s);
  REQUIRE(s->prompts.size() == 1);
  CHECK(*s->prompts[0].text == "hello");
  CHECK(s->max_tokens == 16);  // the completions default
  CHECK(s->n == 1);
  CHECK_FALSE(s->stream);

  s = Completion(R"({"prompt": ["a", "b"]})", &err);
  REQUIRE(s);
  CHECK(s->prompts.size() == 2);

  s = Completion(R"({"prompt": [1, 2, 3]})", &err);
  REQUIRE(s);
  REQUIRE(s->prompts.size() == 1);
  CHECK_FALSE(s->prompts[0].text);
  CHECK(s->prompts[0].ids == std::vector<int32_t>{1, 2, 3});

  s = Completion(R"({"prompt": [[1, 2], [3]]})", &err);
  REQUIRE(s);
  REQUIRE(s->prompts.size() == 2);
  CHECK(s->prompts[1].ids == std::vector<int32_t>{3});
}

TEST_CASE("sampling and stop parameters are read") {
  ApiError err;
  auto s =
      Completion(R"({"prompt": "x", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
    "min_p": 0.1, "seed": 42, "n": 3, "stop": ["a", "bc"], "stop_token_ids": [5], "ignore_eos": true,
    "min_tokens": 2, "forced_output_ids": [9, 8, 7], "return_tokens_as_token_ids": true, "logprobs": 3, "stream": true, "stream_options": {"include_usage": true}})",
                 &err);
  REQUIRE(s);
  CHECK(s->max_tokens == 7);
  CHECK(s->sampling.temperature == Approx(0.5f));
  CHECK(s->sampling.top_p == Approx(0.9f));
  CHECK(s->sampling.top_k == 40);
  CHECK(s->sampling.min_p == Approx(0.1f));
  CHECK(s->sampling.seed == 42u);
  CHECK(s->n == 3);
  CHECK(s->stop == std::vector<std::string>{"a", "bc"});
  CHECK(s->stop_token_ids == std::vector<int32_t>{5});
  CHECK(s->forced_output_ids == std::vector<int32_t>{9, 8, 7});
  CHECK(s->return_tokens_as_token_ids);
  CHECK(s->ignore_eos);
  CHECK(s->min_tokens == 2);
  CHECK(s->logprobs);
  CHECK(s->top_logprobs == 3);
  CHECK(s->stream);
  CHECK(s->include_usage);

  s = Completion(R"({"prompt": "x", "stop": "END", "max_tokens": 3.0})", &err);
  REQUIRE(s);
  CHECK(s->stop == std::vector<std::string>{"END"});
  CHECK(s->max_tokens == 3);
}

TEST_CASE("bad completion requests are 400s naming the parameter") {
  ExpectBad(R"({})", "prompt");
  ExpectBad(R"({"prompt": 5})", "prompt");
  ExpectBad(R"({"prompt": []})", "prompt");
  ExpectBad(R"({"prompt": ""})", "prompt");
  ExpectBad(R"({"prompt": "x", "forced_output_ids": "ab"})", "forced_output_ids");
  ExpectBad(R"({"prompt": "x", "forced_output_ids": [1, -2]})", "forced_output_ids");
  ExpectBad(R"({"prompt": [1, -2]})", "prompt");
  ExpectBad(R"({"prompt": [1, "a"]})", "prompt");
  ExpectBad(R"({"prompt": "x", "max_tokens": -1})", "max_tokens");
  ExpectBad(R"({"prompt": "x", "max_tokens": 0})", "max_tokens");
  ExpectBad(R"({"prompt": "x", "max_tokens": 100000})", "max_tokens");
  ExpectBad(R"({"prompt": "x", "max_tokens": 1e30})", "max_tokens");
  ExpectBad(R"({"prompt": "x", "max_tokens": 18446744073709551615})", "max_tokens");
  ExpectBad(R"({"prompt": "x", "max_tokens": "ten"})", "max_tokens");
  ExpectBad(R"({"prompt": "x", "max_tokens": 2.5})", "max_tokens");
  ExpectBad(R"({"prompt": "x", "temperature": -0.1})", "temperature");
  ExpectBad(R"({"prompt": "x", "temperature": "hot"})", "temperature");
  ExpectBad(R"({"prompt": "x", "top_p": 0})", "top_p");
  ExpectBad(R"({"prompt": "x", "top_p": 1.5})", "top_p");
  ExpectBad(R"({"prompt": "x", "top_k": -2})", "top_k");
  ExpectBad(R"({"prompt": "x", "min_p": 2})", "min_p");
  ExpectBad(R"({"prompt": "x", "n": 0})", "n");
  ExpectBad(R"({"prompt": "x", "n": 9})", "n");
  ExpectBad(R"({"prompt": "x", "stop": 3})", "stop");
  ExpectBad(R"({"prompt": "x", "stop": [""]})", "stop");
  ExpectBad(R"({"prompt": "x", "stream": "yes"})", "stream");
  ExpectBad(R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options");
  ExpectBad(R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}})",
            "stream_options.include_usage");
  ExpectBad(R"({"prompt": "x", "stream": true, "stream_options": {"continuous_usage_stats": "y"}})",
            "stream_options.continuous_usage_stats");
  ExpectBad(
      R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": true, "every": 1}})",
      "stream_options.every");
  ExpectBad(R"({"prompt": "x", "logprobs": 21})", "logprobs");
  ExpectBad(R"({"prompt": "x", "model": 3})", "model");
  ExpectBad(R"({"prompt": "x", "presence_penalty": 2.5})", "presence_penalty");
  ExpectBad(R"({"prompt": "x", "min_tokens": 20, "max_tokens": 10})", "min_tokens");
  ExpectBad(R"({"prompt": "x", "min_tokens": -1})", "min_tokens");
  ExpectBad(R"({"prompt": "x", "seed": "s"})", "seed");
  ExpectBad(R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {}}})",
            "response_format");
  ExpectBad(R"({"prompt": "x", "response_format": "json"})", "response_format");
  ExpectBad(R"({"prompt": "x", "response_format": {"type": "structural_tag"}})", "response_format");
  ExpectBad(R"({"prompt": "x", "guided_json": 3})", "guided_json");
  ExpectBad(R"({"prompt": "x", "guided_json": "{\"type\": "})", "guided_json");
  ExpectBad(
      R"({"prompt": "x", "guided_json": {"type": "string", "format": "email", "pattern": "[z-a]"}})",
      "guided_json");
  ExpectBad(R"({"prompt": "x", "guided_choice": []})", "guided_choice");
  ExpectBad(R"({"prompt": "x", "guided_choice": ["a", 1]})", "guided_choice");
  ExpectBad(R"({"prompt": "x", "guided_choice": "a"})", "guided_choice");
  ExpectBad(R"({"prompt": "x", "guided_regex": "(a+"})", "guided_regex");
  ExpectBad(R"({"prompt": "x", "guided_regex": "(a)\\1"})", "guided_regex");
  ExpectBad(R"({"prompt": "x", "guided_regex": 5})", "guided_regex");
  ExpectBad(R"({"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]})", "guided_regex");
  ExpectBad(R"({"prompt": "x", "guided_grammar": "root ::= x"})", "guided_grammar");
  ExpectBad(R"({"prompt": "x", "guided_grammar": "?start: \"a\""})", "guided_grammar");
  ExpectBad(R"({"prompt": "x", "guided_grammar": ["root ::= \"a\""]})", "guided_grammar");
  ExpectBad(R"({"prompt": "x", "guided_whitespace_pattern": " "})", "guided_whitespace_pattern");
  ExpectBad(R"({"prompt": "x", "guided_choice": ["a"], "guided_whitespace_pattern": " "})",
            "guided_whitespace_pattern");
  ExpectBad(
      R"({"prompt": "x", "guided_json": {"type": "object"}, "guided_whitespace_pattern": "x*"})",
      "guided_json");
  ExpectBad(R"({"prompt": "x", "guided_json": {"type": "object"}, "guided_whitespace_pattern": 3})",
            "guided_whitespace_pattern");
  ExpectBad(
      R"({"prompt": "x", "guided_json": {"type": "object"}, "guided_whitespace_pattern": ""})",
      "guided_whitespace_pattern");
  ExpectBad(
      R"({"prompt": "x", "structured_outputs": {"json_object": true, "whitespace_pattern": " ",
               "disable_any_whitespace": true}})",
      "structured_outputs.whitespace_pattern");
  ExpectBad(
      R"({"prompt": "x", "structured_outputs": {"json_object": true, "whitespace_pattern": " "},
               "guided_whitespace_pattern": " "})",
      "guided_whitespace_pattern");
  ExpectBad(R"({"prompt": "x", "structured_outputs": {"regex": "[z-a]"}})",
            "structured_outputs.regex");
  ExpectBad(R"({"prompt": "x", "structured_outputs": {"grammar": "root ::= x"}})",
            "structured_outputs.grammar");
  ExpectBad(R"({"prompt": "x", "structured_outputs": {"json_object": 1}})",
            "structured_outputs.json_object");
  ExpectBad(
      R"({"prompt": "x", "structured_outputs": {"disable_any_whitespace": "yes", "json_object": true}})",
      "structured_outputs.disable_any_whitespace");
  ExpectBad(R"({"prompt": "x", "structured_outputs": []})", "structured_outputs");
  ExpectBad(
      R"({"prompt": "x", "structured_outputs": {"json": {"type": "object"}, "choice": ["a"]}})",
      "structured_outputs.choice");
  ExpectBad(
      R"({"prompt": "x", "response_format": {"type": "json_object"}, "guided_choice": ["a"]})",
      "guided_choice");
  ExpectBad(R"({"prompt": "x", "response_format": {"type": "json_object"}, "ignore_eos": true})",
            "ignore_eos");
  ExpectBad(R"({"prompt": "x", "guided_choice": ["a"], "min_tokens": 1})", "min_tokens");
  ExpectBad(R"({"prompt": "x", "guided_choice": ["a"], "forced_output_ids": [1]})",
            "forced_output_ids");
  ExpectBad(
      R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema",
               "json_schema": {"name": "n", "schema": {"type": "object", "minProperties": 1}}}})",
      "response_format", true);
  // A schema string nested past the JSON depth limit is refused before it is parsed.
  const std::string deep = std::string(300, '[') + std::string(300, ']');
  ExpectBad(Json{{"prompt", "x"}, {"guided_json", deep}}.dump(), "guided_json");
  // Plain text, and null structured-output fields, are what the server does anyway.
  ApiError err;
  auto plain = Completion(
      R"({"prompt": "x", "response_format": {"type": "text"}, "guided_json": null})", &err);
  REQUIRE(plain);
  CHECK(plain->grammar == nullptr);
  // The accepted forms each set a grammar, naming the parameter that asked for it.
  for (
      const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
          {R"({"prompt": "x", "response_format": {"type": "json_object"}})", "response_format"},
          {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
               "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}}})",
           "response_format"},
          {R"({"prompt": "x", "guided_json": {"type": "object"}})", "guided_json"},
          {R"({"prompt": "x", "guided_json": "{\"type\": \"array\"}"})", "guided_json"},
          {R"({"prompt": "x", "guided_choice": ["a", "b"]})", "guided_choice"},
          {R"({"prompt": "x", "structured_outputs": {"json": {"type": "integer"}, "disable_any_whitespace": true}})",
           "structured_outputs.json"},
          {R"({"prompt": "x", "structured_outputs": {"choice": ["x"], "disable_fallback": true}})",
           "structured_outputs.choice"},
          {R"({"prompt": "x", "structured_outputs": {"json_object": true}})",
           "structured_outputs.json_object"},
          {R"({"prompt": "x", "guided_regex": "^\\d{3}-[a-z]+$"})", "guided_regex"},
          {R"({"prompt": "x", "structured_outputs": {"regex": "(yes|no)!?"}})",
           "structured_outputs.regex"},
          {R"({"prompt": "x", "guided_json": {"type": "object"}, "guided_whitespace_pattern": "[ ]?"})",
           "guided_json"},
          {R"({"prompt": "x", "structured_outputs": {"json_object": true, "whitespace_pattern": "\n?"}})",
           "structured_outputs.json_object"},
          {R"({"prompt": "x", "guided_grammar": "root ::= \"a\" b*\nb ::= [0-9]"})",
           "guided_grammar"},
          {R"({"prompt": "x", "structured_outputs": {"grammar": "root ::= [a-z]+"}})",
           "structured_outputs.grammar"},
          {R"({"prompt": "x", "guided_json": {"type": "string", "pattern": "^[A-Z]{2}\\d+$"}})",
           "guided_json"}}) {
    INFO(body);
    auto spec = Completion(body, &err);
    INFO(err.message);
    REQUIRE(spec);
    CHECK(spec->grammar != nullptr);
    CHECK(spec->grammar_param == param);
  }
  auto compact = Completion(
      R"({"prompt": "x", "structured_outputs": {"json_object": true, "disable_any_whitespace": true}})",
      &err);
  REQUIRE(compact);
  CHECK(compact->grammar->compact);
  auto chat = Chat(
      R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})",
      &err);
  REQUIRE(chat);
  CHECK((chat->grammar != nullptr && !chat->grammar->compact));
}

TEST_CASE("an integer out of range names the side it left") {
  ApiError err;
  CHECK_FALSE(Completion(R"({"prompt": "x", "seed": 18446744073709551615})", &err));
  CHECK(err.param == "seed");
  CHECK(err.message == "'seed' must be in [-9223372036854775808, 9223372036854775807]");
  CHECK_FALSE(Completion(R"({"prompt": "x", "max_tokens": 18446744073709551615})", &err));
  CHECK(err.message.find("'max_tokens' must be in [1, ") == 0);
  CHECK_FALSE(Completion(R"({"prompt": "x", "max_tokens": -1})", &err));
  CHECK(err.message == "'max_tokens' must be >= 1");
}

TEST_CASE("chat requests: messages, content parts, max_completion_tokens, logprobs") {
  ApiError err;
  auto s = Chat(R"({"messages": [{"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}],
    "max_completion_tokens": 9, "max_tokens": 3, "logprobs": true, "top_logprobs": 2,
    "chat_template_kwargs": {"enable_thinking": false}})",
                &err);
  REQUIRE(s);
  REQUIRE(s->messages.size() == 2);
  CHECK(s->messages[1]["content"] == "hi \nthere");  // parts joined with "\n", as vLLM
  CHECK(s->max_tokens == 9);
  CHECK(s->logprobs);
  CHECK(s->top_logprobs == 2);
  CHECK(s->chat_template_kwargs["enable_thinking"] == false);
  CHECK(s->add_generation_prompt);

  s = Chat(R"({"messages": [{"role": "user", "content": "x"}]})", &err);
  REQUIRE(s);
  CHECK_FALSE(s->max_tokens.has_value());  // chat default: until the context is full
}

TEST_CASE("bad chat requests are 400s") {
  ExpectBad(R"({})", "messages", true);
  ExpectBad(R"({"messages": []})", "messages", true);
  ExpectBad(R"({"messages": "hi"})", "messages", true);
  ExpectBad(R"({"messages": [{"content": "x"}]})", "messages[0].role", true);
  ExpectBad(R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content", true);
  ExpectBad(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
            "messages[0].content", true);
  ExpectBad(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
            "top_logprobs", true);
  ExpectBad(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 1})", "logprobs", true);
  ExpectBad(R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -5})",
            "max_completion_tokens", true);
  // max_completion_tokens wins over max_tokens, but a bad max_tokens is still a 400.
  ExpectBad(
      R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 3, "max_tokens": "abc"})",
      "max_tokens", true);
  ExpectBad(
      R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 3, "max_tokens": -5})",
      "max_tokens", true);
}

TEST_CASE("chat_template_kwargs cannot set the template variables the server sets") {
  // Each key the server puts in the template context (serving.cpp, RenderChat) is refused with
  // a 400 naming it, even when the request does not use the field itself.
  const std::vector<std::string> reserved = {
      "messages",  "tools",    "add_generation_prompt", "continue_final_message",
      "bos_token", "eos_token"};
  CHECK(std::size(kServerChatTemplateKeys) == reserved.size());
  for (const std::string& key : reserved) {
    INFO(key);
    CHECK(IsServerChatTemplateKey(key));
    Json body = Json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})");
    body["chat_template_kwargs"] = {{"enable_thinking", false}, {key, nullptr}};
    body["chat_template_kwargs"][key] =
        key == "messages" ? Json::parse(R"([{"role": "system", "content": "obey"}])") : Json(true);
    ApiError err;
    CHECK_FALSE(ParseChatRequest(body, Limits(), &err).has_value());
    CHECK(err.http_status == 400);
    CHECK(err.param == "chat_template_kwargs");
    CHECK(err.message == "'chat_template_kwargs' may not set '" + key +
                             "': the server sets that template "
                             "variable itself");
  }
  // Other names pass, including near misses (Jinja names are case-sensitive) and the reserved
  // names nested inside a value.
  ApiError err;
  auto s = Chat(R"({"messages": [{"role": "user", "content": "hi"}],
    "chat_template_kwargs": {"Messages": 1, "messages_extra": 2, "tool": 3,
                             "opts": {"messages": [], "tools": []}, "enable_thinking": true}})",
                &err);
  REQUIRE(s);
  CHECK(s->chat_template_kwargs.size() == 5);
  CHECK(s->chat_template_kwargs["opts"]["messages"].is_array());
  CHECK_FALSE(IsServerChatTemplateKey("Messages"));
  CHECK_FALSE(IsServerChatTemplateKey(""));
  // An empty object is fine; a non-object is still the old error.
  CHECK(Chat(R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {}})",
             &err));
  ExpectBad(
      R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": ["messages"]})",
      "chat_template_kwargs", true);
}

TEST_CASE("bodies that are not JSON objects") {
  ApiError err;
  CHECK_FALSE(ParseJsonBody("{not json", &err));
  CHECK(err.http_status == 400);
  CHECK(err.message.find("malformed JSON") != std::string::npos);
  CHECK_FALSE(ParseJsonBody("[1, 2]", &err));
  CHECK(err.http_status == 400);
  CHECK(ParseJsonBody(R"({"a": 1})", &err));
}

TEST_CASE("error JSON and status mapping") {
  ApiError e = BadRequest("bad value", "top_p");
  Json j = Json::parse(e.Body());
  CHECK(j["error"]["message"] == "bad value");
  CHECK(j["error"]["type"] == "invalid_request_error");
  CHECK(j["error"]["param"] == "top_p");
  CHECK(j["error"]["code"] == 400);
  CHECK(Json::parse(BadRequest("x").Body())["error"]["param"].is_null());
  CHECK(FromStatus(OutOfRange("long")).http_status == 400);
  CHECK(FromStatus(NotFound("m")).http_status == 404);
  CHECK(FromStatus(ResourceExhausted("full")).http_status == 429);
  CHECK(FromStatus(Unavailable("loading")).http_status == 503);
  CHECK(FromStatus(Internal("bug")).http_status == 500);
}

// vLLM's and OpenAI's request parameters, walked: each is honoured (the request parses) or
// refused with a 400 naming it; an unknown field too. Never accepted and ignored.
TEST_CASE("every parameter is honoured or refused by name, never ignored") {
  struct Case {
    const char* field;  // JSON "name": value
    bool chat, ok;
  };
  const Case cases[] = {
      // honoured on both endpoints
      {R"("model": "m")", false, true},
      {R"("n": 2)", false, true},
      {R"("stream": true)", false, true},
      {R"("temperature": 0.5)", false, true},
      {R"("top_p": 0.9)", false, true},
      {R"("top_k": 5)", false, true},
      {R"("min_p": 0.1)", false, true},
      {R"("seed": 3)", false, true},
      {R"("stop": ["x"])", false, true},
      {R"("stop_token_ids": [3])", false, true},
      {R"("ignore_eos": true)", false, true},
      {R"("min_tokens": 2)", false, true},
      {R"("include_stop_str_in_output": true)", false, true},
      {R"("skip_special_tokens": false)", false, true},
      {R"("return_tokens_as_token_ids": true)", false, true},
      {R"("presence_penalty": 0)", false, true},
      {R"("frequency_penalty": 0)", false, true},
      {R"("repetition_penalty": 1)", false, true},
      {R"("logit_bias": {})", false, true},
      {R"("presence_penalty": 1.5)", true, true},
      {R"("frequency_penalty": -0.5)", false, true},
      {R"("repetition_penalty": 1.2)", true, true},
      {R"("logit_bias": {"5": -100})", true, true},
      {R"("allowed_token_ids": [1, 2])", false, true},
      {R"("bad_words": ["x"])", true, true},
      {R"("best_of": 1)", false, true},
      {R"("response_format": {"type": "text"})", false, true},
      {R"("user": "u-1")", false, true},
      {R"("user": "u-1")", true, true},
      {R"("unused": null)", false, true},
      {R"("stream": true, "stream_options": {"include_usage": true})", true, true},
      // endpoint-specific
      {R"("echo": true)", false, true},
      {R"("logprobs": 2)", false, true},
      {R"("suffix": "")", false, true},
      {R"("max_completion_tokens": 4)", true, true},
      {R"("max_tokens": 4, "max_completion_tokens": 5)", true, true},
      {R"("logprobs": true, "top_logprobs": 2)", true, true},
      {R"("add_generation_prompt": false)", true, true},
      {R"("chat_template_kwargs": {"enable_thinking": false})", true, true},
      {R"("spaces_between_special_tokens": false)", true, true},
      {R"("chat_template": "{{x}}")", true, true},
      {R"("chat_template": 5)", true, false},
      {R"("prompt_logprobs": 1)", false, true},
      {R"("prompt_logprobs": 0)", true, true},
      {R"("prompt_logprobs": 20)", true, true},
      {R"("prompt_logprobs": 21)", false, false},
      {R"("prompt_logprobs": -1)", true, false},
      {R"("prompt_logprobs": -2)", false, false},
      {R"("prompt_logprobs": "3")", false, false},
      {R"("prompt_logprobs": 2, "stream": true)", true, false},
      {R"("chat_template": "{{x}}")", false, false},
      {R"("spaces_between_special_tokens": true)", false, true},
      {R"("spaces_between_special_tokens": 1)", false, false},
      {R"("tools": [], "tool_choice": "none")", true, true},
      {R"("add_special_tokens": false)", false, true},
      {R"("add_special_tokens": true)", true, true},
      {R"("add_special_tokens": "no")", false, false},
      {R"("add_special_tokens": 1)", true, false},
      // the other endpoint's parameters
      {R"("echo": true)", true, false},
      {R"("suffix": "")", true, false},
      {R"("max_completion_tokens": 4)", false, false},
      {R"("top_logprobs": 2)", false, false},
      {R"("messages": [{"role": "user", "content": "x"}])", false, false},
      // vLLM / OpenAI parameters not implemented
      {R"("truncate_prompt_tokens": 0)", false, false},
      {R"("truncate_prompt_tokens": 5)", false, true},
      {R"("truncate_prompt_tokens": -1)", true, true},
      {R"("priority": 1)", false, false},
      {R"("use_beam_search": true)", false, false},
      {R"("documents": [])", true, false},
      {R"("reasoning_effort": "low")", true, false},
      {R"("store": true)", true, false},
      {R"("metadata": {})", true, false},
      {R"("functions": [])", true, false},
      {R"("user": 7)", false, false},
      {R"("frobnicate": 1)", false, false},
      {R"("frobnicate": 1)", true, false},
  };
  for (const Case& c : cases) {
    const std::string base =
        c.chat ? R"("messages": [{"role": "user", "content": "hi"}])" : R"("prompt": "hi")";
    const std::string body = "{" + base + ", " + c.field + "}";
    INFO((c.chat ? "chat " : "completions ") << body);
    ApiError err;
    auto spec = c.chat ? Chat(body, &err) : Completion(body, &err);
    CHECK(spec.has_value() == c.ok);
    if (!c.ok && !spec) {
      CHECK(err.http_status == 400);
      const std::string name = Json::parse("{" + std::string(c.field) + "}").begin().key();
      CHECK(err.param == name);
      CHECK(err.message.find("'" + name + "'") != std::string::npos);
    }
  }
  ApiError err;
  REQUIRE_FALSE(Completion(R"({"prompt": "x", "priority": 1})", &err));
  CHECK(err.message == "'priority' is not supported by this server (docs/server.md)");
  REQUIRE_FALSE(Chat(R"({"messages": [{"role": "user", "content": "x"}], "frobnicate": 1})", &err));
  CHECK(err.message == "unknown parameter 'frobnicate' for this endpoint");
}

// Penalties, logit_bias, allowed_token_ids and bad_words (docs/server.md): read into the
// sampling parameters; wrong types, ranges and ids outside the vocabulary are 400s naming the
// field.
TEST_CASE("logits processing parameters are read and checked") {
  ApiError err;
  auto s = Completion(
      R"({"prompt": "x", "presence_penalty": -2, "frequency_penalty": 2, "repetition_penalty": 1.3,
    "logit_bias": {"5": 100, "17": -2.5, "0": 0}, "allowed_token_ids": [3, 4, 5], "bad_words": ["foo", " bar baz"]})",
      &err);
  REQUIRE(s);
  CHECK(s->sampling.presence_penalty == -2.0f);
  CHECK(s->sampling.frequency_penalty == 2.0f);
  CHECK(s->sampling.repetition_penalty == 1.3f);
  CHECK(s->sampling.logit_bias ==
        std::vector<std::pair<int32_t, float>>{{5, 100.0f}, {17, -2.5f}, {0, 0.0f}});
  CHECK(s->sampling.allowed_token_ids == std::vector<int32_t>{3, 4, 5});
  CHECK(s->bad_words == std::vector<std::string>{"foo", " bar baz"});
  CHECK(s->sampling.bad_words_token_ids.empty());  // tokenized by the server (TokenizeBadWords)
  CHECK(s->sampling.processes_logits());
  s = Completion(R"({"prompt": "x"})", &err);
  REQUIRE(s);
  CHECK_FALSE(s->sampling.processes_logits());

  ExpectBad(R"({"prompt": "x", "presence_penalty": "high"})", "presence_penalty");
  ExpectBad(R"({"prompt": "x", "frequency_penalty": -2.01})", "frequency_penalty");
  ExpectBad(R"({"prompt": "x", "repetition_penalty": 0})", "repetition_penalty");
  ExpectBad(R"({"prompt": "x", "repetition_penalty": -1})", "repetition_penalty");
  ExpectBad(R"({"prompt": "x", "repetition_penalty": 2.5})", "repetition_penalty");
  ExpectBad(R"({"prompt": "x", "repetition_penalty": [1]})", "repetition_penalty");
  ExpectBad(R"({"prompt": "x", "logit_bias": [1, 2]})", "logit_bias");
  ExpectBad(R"({"prompt": "x", "logit_bias": {"a": 1}})", "logit_bias");
  ExpectBad(R"({"prompt": "x", "logit_bias": {"-3": 1}})", "logit_bias");
  ExpectBad(R"({"prompt": "x", "logit_bias": {"1.5": 1}})", "logit_bias");
  ExpectBad(R"({"prompt": "x", "logit_bias": {"99999999999": 1}})", "logit_bias");
  ExpectBad(R"({"prompt": "x", "logit_bias": {"5": "up"}})", "logit_bias");
  ExpectBad(R"({"prompt": "x", "logit_bias": {"5": 100.5}})", "logit_bias");
  ExpectBad(R"({"prompt": "x", "logit_bias": {"5": -101}})", "logit_bias");
  ExpectBad(R"({"prompt": "x", "allowed_token_ids": 5})", "allowed_token_ids");
  ExpectBad(R"({"prompt": "x", "allowed_token_ids": []})", "allowed_token_ids");
  ExpectBad(R"({"prompt": "x", "allowed_token_ids": [1, -1]})", "allowed_token_ids");
  ExpectBad(R"({"prompt": "x", "allowed_token_ids": ["1"]})", "allowed_token_ids");
  ExpectBad(R"({"prompt": "x", "bad_words": "foo"})", "bad_words");
  ExpectBad(R"({"prompt": "x", "bad_words": [3]})", "bad_words");
  ExpectBad(R"({"prompt": "x", "bad_words": ["  "]})", "bad_words");

  // Token ids past the served vocabulary, when the server knows it.
  ProtocolLimits l = Limits();
  l.vocab_size = 1000;
  auto bad_vocab = [&](const std::string& body, const std::string& param) {
    INFO(body);
    CHECK_FALSE(ParseCompletionRequest(Json::parse(body), l, &err));
    CHECK(err.param == param);
    CHECK(err.message.find("vocabulary") != std::string::npos);
  };
  bad_vocab(R"({"prompt": "x", "logit_bias": {"1000": 1}})", "logit_bias");
  bad_vocab(R"({"prompt": "x", "allowed_token_ids": [999, 1000]})", "allowed_token_ids");
  bad_vocab(R"({"prompt": "x", "stop_token_ids": [5, 1000]})", "stop_token_ids");
  bad_vocab(R"({"prompt": "x", "stop_token_ids": [2147483647]})", "stop_token_ids");
  // forced_output_ids too, at parse time (the engine would refuse them naming no field).
  bad_vocab(R"({"prompt": "x", "forced_output_ids": [5, 1000]})", "forced_output_ids");
  CHECK_FALSE(ParseChatRequest(
      Json::parse(
          R"({"messages": [{"role": "user", "content": "x"}], "forced_output_ids": [1000]})"),
      l, &err));
  CHECK(err.param == "forced_output_ids");
  CHECK(ParseCompletionRequest(
      Json::parse(
          R"({"prompt": "x", "logit_bias": {"999": 1}, "allowed_token_ids": [999], "stop_token_ids": [999]})"),
      l, &err));
}

// vLLM's per-request chat_template: a string, kept for the Service to parse; empty means the
// model's.
TEST_CASE("chat_template is read") {
  ApiError err;
  auto s = Chat(
      R"({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ messages[0].content }}"})",
      &err);
  REQUIRE(s);
  REQUIRE(s->chat_template);
  CHECK(*s->chat_template == "{{ messages[0].content }}");
  s = Chat(R"({"messages": [{"role": "user", "content": "x"}], "chat_template": ""})", &err);
  REQUIRE(s);
  CHECK_FALSE(s->chat_template);
  s = Chat(R"({"messages": [{"role": "user", "content": "x"}]})", &err);
  REQUIRE(s);
  CHECK_FALSE(s->chat_template);
  CHECK(s->spaces_between_special_tokens);
  ExpectBad(R"({"messages": [{"role": "user", "content": "x"}], "chat_template": ["a"]})",
            "chat_template", true);
  s = Completion(R"({"prompt": "x", "spaces_between_special_tokens": false})", &err);
  REQUIRE(s);
  CHECK_FALSE(s->spaces_between_special_tokens);
  ExpectBad(R"({"prompt": "x", "spaces_between_special_tokens": "no"})",
            "spaces_between_special_tokens");
}

TEST_CASE("ChatTemplateCache parses once, keeps a bounded number, refuses bad templates") {
  ChatTemplateCache cache(2);
  auto a = cache.Get("A{{ x }}");
  REQUIRE(a.ok());
  auto again = cache.Get("A{{ x }}");
  REQUIRE(again.ok());
  CHECK(a->get() == again->get());  // the same parsed template
  CHECK(*(*a)->Render(OrderedJson{{"x", 1}}) == "A1");
  REQUIRE(cache.Get("B").ok());
  REQUIRE(cache.Get("C").ok());  // evicts "A{{ x }}", the least recently used
  CHECK(cache.size() == 2);
  auto fresh = cache.Get("A{{ x }}");
  REQUIRE(fresh.ok());
  CHECK(fresh->get() != a->get());
  CHECK(*(*a)->Render(OrderedJson{{"x", 2}}) == "A2");  // an evicted template stays usable
  auto bad = cache.Get("{% if %}");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK(cache.size() == 2);
}

TEST_CASE("prompt_logprobs is read") {
  ApiError err;
  auto s = Completion(R"({"prompt": "x", "prompt_logprobs": 4})", &err);
  REQUIRE(s);
  CHECK(s->prompt_logprobs == 4);
  s = Chat(R"({"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 0})", &err);
  REQUIRE(s);
  CHECK(s->prompt_logprobs == 0);
  s = Completion(R"({"prompt": "x"})", &err);
  REQUIRE(s);
  CHECK_FALSE(s->prompt_logprobs);
  ExpectBad(R"({"prompt": "x", "prompt_logprobs": 1, "stream": true})", "prompt_logprobs");
  ExpectBad(R"({"prompt": "x", "prompt_logprobs": -1})", "prompt_logprobs");
  // echo with logprobs: the prompt's logprobs (k = logprobs unless prompt_logprobs says).
  s = Completion(R"({"prompt": "x", "echo": true, "logprobs": 2})", &err);
  REQUIRE(s);
  CHECK(s->prompt_logprobs == 2);
  s = Completion(R"({"prompt": "x", "echo": true, "logprobs": 2, "stream": true})", &err);
  REQUIRE(s);
  CHECK(s->prompt_logprobs == 2);
  s = Completion(R"({"prompt": "x", "echo": true, "logprobs": 2, "prompt_logprobs": 0})", &err);
  REQUIRE(s);
  CHECK(s->prompt_logprobs == 0);
}

TEST_CASE("cache_salt: a non-empty string, as vLLM's") {
  ApiError err;
  auto spec = Completion(R"({"prompt": "x", "cache_salt": "tenant-a"})", &err);
  REQUIRE(spec.has_value());
  CHECK(spec->cache_salt == "tenant-a");
  CHECK(Completion(R"({"prompt": "x"})", &err)->cache_salt.empty());
  ExpectBad(R"({"prompt": "x", "cache_salt": ""})", "cache_salt");
  ExpectBad(R"({"messages": [{"role": "user", "content": "x"}], "cache_salt": 3})", "cache_salt",
            true);
}

// Values range-checked as doubles reach the engine as floats: one that overflows the float
// (inf) or, where 0 is outside the range, underflows to 0 or a denormal is refused at parse time,
// naming its field and the value sent (the engine's own refusal named no field).
TEST_CASE("sampling values that do not survive narrowing to float are 400s naming the field") {
  for (const bool chat : {false, true}) {
    const std::string base =
        chat ? R"("messages": [{"role": "user", "content": "x"}])" : R"("prompt": "x")";
    for (const auto& [field, value, sent] :
         std::vector<std::tuple<std::string, std::string, std::string>>{
             {"temperature", "1e39", "got 1e+39"},
             {"temperature", "1e308", "got 1e+308"},
             {"top_p", "1e-46", "got 1e-46"},
             {"top_p", "1e-40", "got 1e-40"},  // a denormal float
             {"repetition_penalty", "1e-46", "got 1e-46"},
             {"repetition_penalty", "1e-39", "got 1e-39"}}) {
      const std::string body = "{" + base + ", \"" + field + "\": " + value + "}";
      INFO(body);
      ApiError err;
      auto spec = chat ? Chat(body, &err) : Completion(body, &err);
      CHECK_FALSE(spec.has_value());
      CHECK(err.http_status == 400);
      CHECK(err.param == field);
      CHECK(err.message.find(sent) != std::string::npos);
      CHECK(err.message.find("'" + field + "'") == 0);
    }
  }
  // Where 0 is in the range an underflow is that value; the largest float passes.
  ApiError err;
  auto s = Completion(
      R"({"prompt": "x", "temperature": 1e-46, "min_p": 1e-46, "presence_penalty": 1e-46,
          "logit_bias": {"3": 1e-46}})",
      &err);
  REQUIRE(s);
  CHECK(s->sampling.temperature == 0.0f);
  CHECK(s->sampling.min_p == 0.0f);
  CHECK(s->sampling.presence_penalty == 0.0f);
  s = Completion(R"({"prompt": "x", "temperature": 3.4e38, "top_p": 1.2e-38})", &err);
  REQUIRE(s);
  CHECK(std::isfinite(s->sampling.temperature));
  CHECK(s->sampling.top_p > 0.0f);
  CHECK(s->sampling.Validate().ok());
}

// Error messages write numbers as their shortest round-trip text (never 300 digits, never
// std::to_string's "0.000000").
TEST_CASE("numbers in error messages are written compactly") {
  CHECK(FormatNumber(1e300) == "1e+300");
  CHECK(FormatNumber(0.5) == "0.5");
  CHECK(FormatNumber(-2.01) == "-2.01");
  CHECK(FormatNumber(1e-46) == "1e-46");
  CHECK(FormatNumber(100) == "100");
  ApiError err;
  REQUIRE_FALSE(Completion(R"({"prompt": "x", "logit_bias": {"1": 1e300}})", &err));
  CHECK(err.message == "'logit_bias' values must be in [-100, 100], got 1e+300 for token 1");
  REQUIRE_FALSE(Completion(R"({"prompt": "x", "top_p": 1e308})", &err));
  CHECK(err.message == "'top_p' must be in (0, 1], got 1e+308");
  REQUIRE_FALSE(Completion(R"({"prompt": "x", "presence_penalty": 1e308})", &err));
  CHECK(err.message == "'presence_penalty' must be in [-2, 2], got 1e+308");
  REQUIRE_FALSE(Completion(R"({"prompt": "x", "frequency_penalty": -2.01})", &err));
  CHECK(err.message == "'frequency_penalty' must be in [-2, 2], got -2.01");
  REQUIRE_FALSE(Completion(R"({"prompt": "x", "repetition_penalty": 2.5})", &err));
  CHECK(err.message == "'repetition_penalty' must be in (0, 2], got 2.5");
  REQUIRE_FALSE(Completion(R"({"prompt": "x", "temperature": -0.1})", &err));
  CHECK(err.message == "'temperature' must be >= 0, got -0.1");
  REQUIRE_FALSE(Completion(R"({"prompt": "x", "min_p": 1e200})", &err));
  CHECK(err.message == "'min_p' must be in [0, 1], got 1e+200");
  REQUIRE_FALSE(Completion(R"({"prompt": "x", "temperature": 1e39})", &err));
  CHECK(err.message ==
        "'temperature' is too large: got 1e+39, the largest value is 3.4028235e+38 (a 32-bit "
        "float)");
}

// Every list of token ids reads its ids alike (JsonTokenId, also /detokenize's): an exact
// integer in [0, 2^31 - 1], written as an integer or as a float with no fraction (pydantic's lax
// mode, as vLLM); anything else is a 400 naming the list and showing the value.
TEST_CASE("token ids are exact integers, also when written as floats, in every list") {
  CHECK(JsonTokenId(Json(5)) == 5);
  CHECK(JsonTokenId(Json(5.0)) == 5);
  CHECK(JsonTokenId(Json::parse("1e3")) == 1000);
  CHECK(JsonTokenId(Json(-0.0)) == 0);
  CHECK(JsonTokenId(Json(2147483647.0)) == 2147483647);
  CHECK(JsonTokenId(Json::parse("2147483647")) == 2147483647);
  CHECK_FALSE(JsonTokenId(Json(1.5)));
  CHECK_FALSE(JsonTokenId(Json(-1)));
  CHECK_FALSE(JsonTokenId(Json(-1.0)));
  CHECK_FALSE(JsonTokenId(Json::parse("2147483648")));
  CHECK_FALSE(JsonTokenId(Json::parse("4294967301")));  // never wraps onto token 5
  CHECK_FALSE(JsonTokenId(Json::parse("18446744073709551615")));
  CHECK_FALSE(JsonTokenId(Json::parse("1e300")));
  CHECK_FALSE(JsonTokenId(Json("5")));
  CHECK_FALSE(JsonTokenId(Json(true)));
  CHECK_FALSE(JsonTokenId(Json(nullptr)));

  ApiError err;
  auto s = Completion(
      R"({"prompt": [1.0, 2e0, 3], "stop_token_ids": [5.0], "allowed_token_ids": [1e1],
          "forced_output_ids": [7.0, 8]})",
      &err);
  REQUIRE(s);
  CHECK(s->prompts[0].ids == std::vector<int32_t>{1, 2, 3});
  CHECK(s->stop_token_ids == std::vector<int32_t>{5});
  CHECK(s->sampling.allowed_token_ids == std::vector<int32_t>{10});
  CHECK(s->forced_output_ids == std::vector<int32_t>{7, 8});
  s = Completion(R"({"prompt": [[4.0], [5]]})", &err);
  REQUIRE(s);
  CHECK(s->prompts[0].ids == std::vector<int32_t>{4});
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt": [1.5]})", "prompt"},
           {R"({"prompt": [[1], [2.5]]})", "prompt"},
           {R"({"prompt": [4294967301]})", "prompt"},
           {R"({"prompt": "x", "stop_token_ids": [5.5]})", "stop_token_ids"},
           {R"({"prompt": "x", "allowed_token_ids": [1, 0.5]})", "allowed_token_ids"},
           {R"({"prompt": "x", "forced_output_ids": [-1.0]})", "forced_output_ids"},
           {R"({"prompt": "x", "forced_output_ids": [true]})", "forced_output_ids"}}) {
    INFO(body);
    ExpectBad(body, param);
    Completion(body, &err);
    CHECK(err.message.find("'" + param + "' token ids must be integers in [0, 2147483647], got ") ==
          0);
  }
  REQUIRE_FALSE(Completion(R"({"prompt": [1.5]})", &err));
  CHECK(err.message == "'prompt' token ids must be integers in [0, 2147483647], got 1.5");
}

// vLLM's add_special_tokens: read on both routes (left out: the endpoint's default, applied by
// the Service — completions add the tokenizer's special tokens, chat does not).
TEST_CASE("add_special_tokens is read on both routes") {
  ApiError err;
  auto s = Completion(R"({"prompt": "x"})", &err);
  REQUIRE(s);
  CHECK_FALSE(s->add_special_tokens.has_value());
  s = Completion(R"({"prompt": "x", "add_special_tokens": false})", &err);
  REQUIRE(s);
  CHECK(s->add_special_tokens == false);
  s = Completion(R"({"prompt": "x", "add_special_tokens": null})", &err);
  REQUIRE(s);
  CHECK_FALSE(s->add_special_tokens.has_value());
  s = Chat(R"({"messages": [{"role": "user", "content": "x"}], "add_special_tokens": true})", &err);
  REQUIRE(s);
  CHECK(s->add_special_tokens == true);
  ExpectBad(R"({"prompt": "x", "add_special_tokens": "no"})", "add_special_tokens");
  ExpectBad(R"({"messages": [{"role": "user", "content": "x"}], "add_special_tokens": 0})",
            "add_special_tokens", true);
}

// The field max_tokens came from, for the Service's errors about it (the prompt + max_tokens
// check, once the prompt is tokenized).
TEST_CASE("chat remembers whether max_tokens came from max_completion_tokens") {
  ApiError err;
  auto s =
      Chat(R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 9})", &err);
  REQUIRE(s);
  CHECK(s->max_tokens_param == "max_completion_tokens");
  s = Chat(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 9})", &err);
  REQUIRE(s);
  CHECK(s->max_tokens_param == "max_tokens");
  s = Chat(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
               "max_completion_tokens": 9})",
           &err);
  REQUIRE(s);
  CHECK(s->max_tokens == 9);
  CHECK(s->max_tokens_param == "max_completion_tokens");
  s = Completion(R"({"prompt": "x", "max_tokens": 9})", &err);
  REQUIRE(s);
  CHECK(s->max_tokens_param == "max_tokens");
}
