// Response JSON: completions, chat, SSE chunks, usage, logprobs, stop reasons — with the tiny
// test model's real tokenizer (tests/fixtures/tiny-default) for token strings and bytes.
#include <catch2/catch.hpp>

#include "server/openai_response.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

using namespace oasis;
using namespace oasis::server;

namespace {

const tokenizer::Tokenizer& Tok() {
  static std::unique_ptr<tokenizer::Tokenizer> tok = [] {
    auto t = tokenizer::Tokenizer::FromFile(oasis::testing::SourceDir() / "tests/fixtures/tiny-default/tokenizer.json");
    REQUIRE(t.ok());
    return std::move(t).value();
  }();
  return *tok;
}

GeneratedToken Token(int32_t id, float lp, std::vector<TokenLogprob> top = {}) {
  GeneratedToken t;
  t.token = id;
  t.logprob = lp;
  t.top_logprobs = std::move(top);
  return t;
}

RequestOutput Event(std::vector<GeneratedToken> tokens, std::string text, int64_t prompt, int64_t completion) {
  RequestOutput o;
  o.tokens = std::move(tokens);
  o.text = std::move(text);
  o.prompt_tokens = prompt;
  o.completion_tokens = completion;
  return o;
}

// Completions with logprobs and one alternative per position.
GenerateSpec LogprobSpec() {
  GenerateSpec spec;
  spec.endpoint = Endpoint::kCompletions;
  spec.logprobs = true;
  spec.top_logprobs = 1;
  return spec;
}

// Choice 0: "H" (72) then "i" (105), each with "i" as the alternative, finished for `why`.
ChoiceState HiChoice(FinishReasonKind why) {
  ChoiceState c;
  c.index = 0;
  RequestOutput o = Event({Token(72, -0.25f, {{105, -0.1f}}), Token(105, -2.0f, {{105, -2.0f}})}, "Hi", 4, 2);
  o.finished = true;
  o.finish_reason = why;
  c.Add(o);
  return c;
}

}  // namespace

TEST_CASE("ChoiceState accumulates events and the finish") {
  ChoiceState c;
  c.Add(Event({Token(72, -0.5f)}, "H", 3, 1));
  RequestOutput last = Event({Token(105, -1.0f)}, "i", 3, 2);
  last.finished = true;
  last.finish_reason = FinishReasonKind::kLength;
  c.Add(last);
  CHECK(c.text == "Hi");
  CHECK(c.tokens.size() == 2);
  CHECK(c.finished);
  CHECK(c.completion_tokens == 2);
  CHECK(c.prompt_tokens == 3);
  CHECK(std::string(FinishReasonName(c.finish_reason)) == "length");
}

TEST_CASE("completion response with logprobs, usage and echo") {
  const GenerateSpec spec = LogprobSpec();
  ResponseBuilder b(spec, "cmpl-1", "m", 123, &Tok());
  const ChoiceState c = HiChoice(FinishReasonKind::kStop);
  Usage u{4, 2};
  Json j = Json::parse(DumpJson(b.Final({c}, u, {"echo:"})));
  CHECK(j["object"] == "text_completion");
  CHECK(j["id"] == "cmpl-1");
  CHECK(j["model"] == "m");
  CHECK(j["created"] == 123);
  CHECK(j["choices"][0]["text"] == "echo:Hi");
  CHECK(j["choices"][0]["finish_reason"] == "stop");
  CHECK(j["choices"][0]["stop_reason"].is_null());
  const Json& lp = j["choices"][0]["logprobs"];
  CHECK(lp["tokens"] == Json::array({"H", "i"}));
  CHECK(lp["token_logprobs"][0] == Approx(-0.25));
  CHECK(lp["text_offset"] == Json::array({5, 6}));  // after the echoed prefix
  CHECK(lp["top_logprobs"][0]["i"] == Approx(-0.1));
  CHECK(lp["top_logprobs"][0]["H"] == Approx(-0.25));  // the sampled token is included
  CHECK(j["usage"]["prompt_tokens"] == 4);
  CHECK(j["usage"]["completion_tokens"] == 2);
  CHECK(j["usage"]["total_tokens"] == 6);
}

TEST_CASE("completion logprobs=0: the sampled token alone; text_offset counts characters") {
  GenerateSpec spec = LogprobSpec();
  spec.top_logprobs = 0;
  ResponseBuilder b(spec, "cmpl-0", "m", 1, &Tok());
  const ChoiceState c = HiChoice(FinishReasonKind::kLength);
  // "\xc3\xa9" is two bytes, one character: "H" starts at character 5 of "caf\xc3\xa9:Hi" (byte 6).
  Json j = Json::parse(DumpJson(b.Final({c}, Usage{4, 2}, {"caf\xc3\xa9:"})));
  const Json& lp = j["choices"][0]["logprobs"];
  CHECK(lp["text_offset"] == Json::array({5, 6}));
  REQUIRE(lp["top_logprobs"].size() == 2);
  CHECK(lp["top_logprobs"][0] == Json{{"H", -0.25}});  // vLLM: {sampled: logprob}, not null
  CHECK(lp["top_logprobs"][1].size() == 1);
  CHECK(lp["top_logprobs"][1]["i"] == Approx(-2.0));
}

TEST_CASE("return_tokens_as_token_ids names tokens token_id:<id>; offsets stay the text's") {
  GenerateSpec spec = LogprobSpec();
  spec.return_tokens_as_token_ids = true;
  ResponseBuilder b(spec, "cmpl-2", "m", 1, &Tok());
  const ChoiceState c = HiChoice(FinishReasonKind::kLength);
  Json j = Json::parse(DumpJson(b.Final({c}, Usage{4, 2}, {""})));
  const Json& lp = j["choices"][0]["logprobs"];
  CHECK(lp["tokens"] == Json::array({"token_id:72", "token_id:105"}));
  CHECK(lp["text_offset"] == Json::array({0, 1}));
  CHECK(lp["top_logprobs"][0]["token_id:105"] == Approx(-0.1));
  CHECK(lp["top_logprobs"][0]["token_id:72"] == Approx(-0.25));
  spec.endpoint = Endpoint::kChatCompletions;
  ResponseBuilder chat(spec, "chat-2", "m", 1, &Tok());
  Json cj = Json::parse(DumpJson(chat.Final({c}, Usage{4, 2}, {""})));
  CHECK(cj["choices"][0]["logprobs"]["content"][1]["token"] == "token_id:105");
  CHECK(cj["choices"][0]["logprobs"]["content"][0]["top_logprobs"][0]["token"] == "token_id:105");
}

TEST_CASE("chat response and chunks, logprobs carry bytes") {
  GenerateSpec spec;
  spec.endpoint = Endpoint::kChatCompletions;
  spec.logprobs = true;
  spec.top_logprobs = 1;
  spec.include_usage = true;
  spec.stop = {"zz"};
  ResponseBuilder b(spec, "chatcmpl-1", "m", 1, &Tok());
  ChoiceState c;
  RequestOutput first = Event({Token(72, -0.5f, {{72, -0.5f}})}, "H", 2, 1);
  c.Add(first);
  Json chunk = Json::parse(DumpJson(b.Chunk(c, first, "")));
  CHECK(chunk["object"] == "chat.completion.chunk");
  CHECK(chunk["choices"][0]["delta"]["content"] == "H");
  CHECK(chunk["choices"][0]["finish_reason"].is_null());
  CHECK(chunk["usage"].is_null());
  CHECK(chunk.contains("usage"));
  const Json& content = chunk["choices"][0]["logprobs"]["content"];
  CHECK(content[0]["token"] == "H");
  CHECK(content[0]["bytes"] == Json::array({72}));
  CHECK(content[0]["top_logprobs"][0]["token"] == "H");

  RequestOutput last = Event({}, "", 2, 1);
  last.finished = true;
  last.finish_reason = FinishReasonKind::kStop;
  last.stop_reason = "zz";
  c.Add(last);
  Json end = Json::parse(DumpJson(b.Chunk(c, last, "")));
  CHECK(end["choices"][0]["delta"] == Json::object());
  CHECK(end["choices"][0]["finish_reason"] == "stop");
  CHECK(end["choices"][0]["stop_reason"] == "zz");

  Json role = Json::parse(DumpJson(b.RoleChunk(0)));
  CHECK(role["choices"][0]["delta"]["role"] == "assistant");
  Json usage = Json::parse(DumpJson(b.UsageChunk({2, 1})));
  CHECK(usage["choices"] == Json::array());
  CHECK(usage["usage"]["total_tokens"] == 3);

  Json full = Json::parse(DumpJson(b.Final({c}, {2, 1}, {})));
  CHECK(full["object"] == "chat.completion");
  CHECK(full["choices"][0]["message"]["role"] == "assistant");
  CHECK(full["choices"][0]["message"]["content"] == "H");
}

TEST_CASE("stop token ids are integers in stop_reason, empty events send nothing") {
  GenerateSpec spec;
  spec.stop_token_ids = {7};
  ResponseBuilder b(spec, "cmpl-2", "m", 1, &Tok());
  ChoiceState c;
  RequestOutput held = Event({Token(5, 0.0f)}, "", 1, 1);  // text held back (possible stop string)
  c.Add(held);
  CHECK(b.Chunk(c, held, "").is_null());
  RequestOutput last = Event({Token(7, 0.0f)}, "", 1, 2);
  last.finished = true;
  last.finish_reason = FinishReasonKind::kStop;
  last.stop_reason = "7";
  c.Add(last);
  Json j = Json::parse(DumpJson(b.Chunk(c, last, "")));
  CHECK(j["choices"][0]["stop_reason"] == 7);
  CHECK(j["choices"][0]["logprobs"].is_null());
}

TEST_CASE("invalid UTF-8 never breaks the JSON") {
  OrderedJson j = {{"text", std::string("a\xff\xfe")}};
  CHECK_NOTHROW(Json::parse(DumpJson(j)));
}

// vLLM's prompt_logprobs: completions put the list on each choice, chat once on the response;
// null for the first prompt token, then {"<id>": {logprob, rank, decoded_token}} with the
// prompt token first and the top ones ranked 1..k.
TEST_CASE("prompt_logprobs in completion and chat responses") {
  GenerateSpec spec;
  spec.endpoint = Endpoint::kCompletions;
  spec.prompt_logprobs = 1;
  ChoiceState c = HiChoice(FinishReasonKind::kLength);
  RequestOutput first = Event({}, "", 4, 0);
  first.prompt_logprobs = {PromptTokenLogprob{72, -3.5f, 7, {{105, -0.5f}}},
                           PromptTokenLogprob{105, -0.25f, 1, {{105, -0.25f}}}};
  c.Add(first);
  c.Add(Event({}, "", 4, 2));  // later events carry none: the list stays
  ResponseBuilder b(spec, "cmpl-3", "m", 1, &Tok());
  Json j = Json::parse(DumpJson(b.Final({c}, Usage{3, 2}, {""})));
  const Json& plp = j["choices"][0]["prompt_logprobs"];
  REQUIRE(plp.size() == 3);
  CHECK(plp[0].is_null());
  CHECK(plp[1]["72"]["logprob"] == Approx(-3.5));
  CHECK(plp[1]["72"]["rank"] == 7);
  CHECK(plp[1]["72"]["decoded_token"] == "H");
  CHECK(plp[1]["105"]["rank"] == 1);
  CHECK(plp[1]["105"]["decoded_token"] == "i");
  CHECK(plp[2].size() == 1);  // the prompt token was the top one
  CHECK(plp[2]["105"]["rank"] == 1);
  CHECK(j.find("prompt_logprobs") == j.end());
  spec.endpoint = Endpoint::kChatCompletions;
  ResponseBuilder chat(spec, "chat-3", "m", 1, &Tok());
  Json cj = Json::parse(DumpJson(chat.Final({c}, Usage{3, 2}, {""})));
  CHECK(cj["prompt_logprobs"] == plp);
  CHECK(cj["choices"][0].find("prompt_logprobs") == cj["choices"][0].end());
  // return_tokens_as_token_ids renames the logprobs' tokens, not decoded_token (as vLLM).
  spec.return_tokens_as_token_ids = true;
  ResponseBuilder ids(spec, "chat-5", "m", 1, &Tok());
  CHECK(Json::parse(DumpJson(ids.Final({c}, Usage{3, 2}, {""})))["prompt_logprobs"][1]["72"]["decoded_token"] == "H");
  spec.return_tokens_as_token_ids = false;
  // Not asked for: no field.
  spec.prompt_logprobs.reset();
  ResponseBuilder none(spec, "chat-4", "m", 1, &Tok());
  const Json nj = Json::parse(DumpJson(none.Final({c}, Usage{3, 2}, {""})));
  CHECK(nj.find("prompt_logprobs") == nj.end());
}

TEST_CASE("usage reports the prefix cache's tokens as prompt_tokens_details.cached_tokens") {
  CHECK_FALSE(Json::parse(DumpJson(Usage{4, 2}.ToJson())).contains("prompt_tokens_details"));
  const Json j = Json::parse(DumpJson(Usage{40, 2, 32}.ToJson()));
  CHECK(j["prompt_tokens"] == 40);
  CHECK(j["prompt_tokens_details"]["cached_tokens"] == 32);
}
