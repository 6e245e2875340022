// Request bodies and StreamAccumulator: timing from byte arrival times, usage vs counted
// tokens, error events, missing [DONE], chat role chunks.
#include <catch2/catch.hpp>

#include <string>

#include "tools/loadgen/openai_stream.h"

using namespace oasis::loadgen;
using nlohmann::json;

namespace {

std::string Chunk(const json& j) { return "data: " + j.dump() + "\n\n"; }
std::string TextChunk(const std::string& text, const char* finish = nullptr) {
  json choice = {{"index", 0}, {"text", text}, {"finish_reason", nullptr}};
  if (finish) choice["finish_reason"] = finish;
  return Chunk({{"choices", json::array({choice})}});
}
std::string UsageChunk(int prompt, int completion) {
  return Chunk({{"choices", json::array()},
                {"usage",
                 {{"prompt_tokens", prompt},
                  {"completion_tokens", completion},
                  {"total_tokens", prompt + completion}}}});
}
Prompt IdsPrompt(int n, int out) {
  Prompt p;
  for (int i = 0; i < n; ++i) p.token_ids.push_back(i);
  p.prompt_len = n;
  p.output_len = out;
  return p;
}

}  // namespace

TEST_CASE("request body: completions with ids, forcing the output length") {
  RequestOptions o;
  o.model = "m";
  o.ignore_eos = true;
  o.force_min_tokens = true;
  o.extra_body = {{"top_k", 5}, {"max_tokens", 3}};
  auto body = BuildRequestBody(o, IdsPrompt(3, 7));
  REQUIRE(body.ok());
  CHECK((*body)["prompt"] == json::array({0, 1, 2}));
  CHECK((*body)["model"] == "m");
  CHECK((*body)["stream"] == true);
  CHECK((*body)["stream_options"]["include_usage"] == true);
  CHECK((*body)["ignore_eos"] == true);
  CHECK((*body)["min_tokens"] == 7);
  CHECK((*body)["top_k"] == 5);
  CHECK((*body)["max_tokens"] == 3);  // --extra-body wins
  CHECK_FALSE(body->contains("temperature"));
}

TEST_CASE("request body: chat takes text, rejects ids") {
  RequestOptions o;
  o.type = EndpointType::kChat;
  o.temperature = 0.0;
  Prompt p;
  p.text = "hello";
  p.output_len = 4;
  auto body = BuildRequestBody(o, p);
  REQUIRE(body.ok());
  CHECK((*body)["messages"] == json::array({{{"role", "user"}, {"content", "hello"}}}));
  CHECK_FALSE(body->contains("prompt"));
  CHECK_FALSE(body->contains("ignore_eos"));
  CHECK((*body)["temperature"] == 0.0);
  CHECK_FALSE(BuildRequestBody(o, IdsPrompt(2, 2)).ok());
}

TEST_CASE("request body: chat messages go out in order, not on completions") {
  RequestOptions o;
  o.type = EndpointType::kChat;
  Prompt p;
  p.messages = {{"system", "be brief"}, {"user", "hi"}, {"assistant", "hello"}, {"user", "and"}};
  p.output_len = 3;
  auto body = BuildRequestBody(o, p);
  REQUIRE(body.ok());
  CHECK((*body)["messages"] == json::array({{{"role", "system"}, {"content", "be brief"}},
                                            {{"role", "user"}, {"content", "hi"}},
                                            {{"role", "assistant"}, {"content", "hello"}},
                                            {{"role", "user"}, {"content", "and"}}}));
  CHECK((*body)["stream_options"]["include_usage"] == true);  // usage carries cached_tokens
  o.type = EndpointType::kCompletions;
  CHECK_FALSE(BuildRequestBody(o, p).ok());
}

TEST_CASE("stream: cached prompt tokens from usage.prompt_tokens_details, absent = 0") {
  const auto run = [](const json& usage) {
    StreamAccumulator acc(EndpointType::kCompletions, IdsPrompt(40, 2), 0.0, false);
    acc.OnBytes(TextChunk("a") + TextChunk("b", "length"), 0.1);
    acc.OnBytes(Chunk({{"choices", json::array()}, {"usage", usage}}) + "data: [DONE]\n\n", 0.2);
    return acc.Finish(0.3);
  };
  const json base = {{"prompt_tokens", 40}, {"completion_tokens", 2}, {"total_tokens", 42}};
  json with = base;
  with["prompt_tokens_details"] = {{"cached_tokens", 32}};
  const RequestRecord hit = run(with);
  REQUIRE(hit.success);
  CHECK(hit.cached_tokens == 32);
  CHECK(hit.prompt_tokens == 40);
  CHECK(run(base).cached_tokens == 0);  // oasis-server omits the details when nothing was cached
  json null_details = base;
  null_details["prompt_tokens_details"] = nullptr;  // some servers send null
  CHECK(run(null_details).cached_tokens == 0);
  json zero = base;
  zero["prompt_tokens_details"] = {{"cached_tokens", 0}};
  CHECK(run(zero).cached_tokens == 0);
}

TEST_CASE("stream: TTFT, ITL, E2EL from arrival times, usage wins over counted tokens") {
  StreamAccumulator acc(EndpointType::kCompletions, IdsPrompt(5, 4), /*start_s=*/10.0, true);
  acc.OnBytes(TextChunk("a"), 10.5);
  acc.OnBytes(TextChunk("") + TextChunk("b"), 10.7);  // two tokens in one read: gap 0
  acc.OnBytes(TextChunk("c", "length"), 11.0);
  acc.OnBytes(UsageChunk(6, 4) + "data: [DONE]\n\n", 11.1);
  const RequestRecord r = acc.Finish(11.2);
  REQUIRE(r.success);
  CHECK(r.ttft_s == Approx(0.5));
  REQUIRE(r.itl_s.size() == 3);
  CHECK(r.itl_s[0] == Approx(0.2));
  CHECK(r.itl_s[1] == Approx(0.0));
  CHECK(r.itl_s[2] == Approx(0.3));
  CHECK(r.e2el_s == Approx(1.2));
  CHECK(r.usage_reported);
  CHECK(r.prompt_tokens == 6);
  CHECK(r.output_tokens == 4);
  CHECK(r.finish_reason == "length");
  CHECK(r.generated_text == "abc");
}

TEST_CASE("stream: without usage, tokens are counted and the prompt length is the prompt's") {
  StreamAccumulator acc(EndpointType::kCompletions, IdsPrompt(5, 3), 0.0, false);
  const std::string all = TextChunk("x") + TextChunk("y") + TextChunk("z") +
                          TextChunk("", "length") + "data: [DONE]\n\n";
  // Split mid-chunk at odd places.
  acc.OnBytes(all.substr(0, 7), 0.1);
  acc.OnBytes(all.substr(7, 40), 0.2);
  acc.OnBytes(all.substr(47), 0.3);
  const RequestRecord r = acc.Finish(0.4);
  REQUIRE(r.success);
  CHECK_FALSE(r.usage_reported);
  CHECK(r.output_tokens == 3);  // the empty finish-only chunk is not a token
  CHECK(r.prompt_tokens == 5);
  CHECK(r.generated_text.empty());  // not saved
}

TEST_CASE("stream: chat role chunk is not the first token") {
  Prompt p;
  p.text = "hi";
  p.prompt_len = 1;
  p.output_len = 2;
  StreamAccumulator acc(EndpointType::kChat, p, 0.0, true);
  json role = {{"choices", json::array({{{"index", 0},
                                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"finish_reason", nullptr}}})}};
  acc.OnBytes(Chunk(role), 0.1);
  json tok = {{"choices", json::array({{{"index", 0}, {"delta", {{"content", "Hi"}}}}})}};
  json reason = {
      {"choices", json::array({{{"index", 0}, {"delta", {{"reasoning_content", "think"}}}}})}};
  acc.OnBytes(Chunk(reason), 0.3);
  acc.OnBytes(Chunk(tok), 0.4);
  acc.OnBytes("data: [DONE]\n\n", 0.5);
  const RequestRecord r = acc.Finish(0.5);
  REQUIRE(r.success);
  CHECK(r.ttft_s == Approx(0.3));
  CHECK(r.output_tokens == 2);
  CHECK(r.generated_text == "thinkHi");
}

TEST_CASE(
    "stream: tokens whose text is empty count by the usage; the finishing chunk is the first") {
  // Two special tokens (text skipped) merged into the finishing chunk: a success, not "no token".
  StreamAccumulator acc(EndpointType::kCompletions, IdsPrompt(3, 2), /*start_s=*/1.0, false);
  acc.OnBytes(TextChunk("", "length"), 1.4);
  acc.OnBytes(UsageChunk(3, 2) + "data: [DONE]\n\n", 1.5);
  const RequestRecord r = acc.Finish(1.6);
  REQUIRE(r.success);
  CHECK(r.output_tokens == 2);
  CHECK(r.ttft_s == Approx(0.4));
  CHECK(r.itl_s.empty());
}

TEST_CASE("stream: error event, malformed chunk, missing [DONE], no tokens are failures") {
  Prompt p = IdsPrompt(2, 2);
  {
    StreamAccumulator acc(EndpointType::kCompletions, p, 0.0, false);
    acc.OnBytes(TextChunk("a"), 0.1);
    acc.OnBytes(Chunk({{"error", {{"message", "KV cache exhausted"}, {"code", 503}}}}), 0.2);
    CHECK(acc.failed());
    const RequestRecord r = acc.Finish(0.3);
    CHECK_FALSE(r.success);
    CHECK(r.failure == FailureKind::kStreamError);
    CHECK(r.error == "KV cache exhausted");
    CHECK(FailureReason(r) == "stream error: KV cache exhausted");
  }
  {
    StreamAccumulator acc(EndpointType::kCompletions, p, 0.0, false);
    acc.OnBytes("data: {not json\n\n", 0.1);
    const RequestRecord r = acc.Finish(0.2);
    CHECK_FALSE(r.success);
    CHECK(r.error.find("malformed chunk") != std::string::npos);
  }
  {
    StreamAccumulator acc(EndpointType::kCompletions, p, 0.0, false);
    acc.OnBytes(TextChunk("a") + TextChunk("b"), 0.1);
    const RequestRecord r = acc.Finish(0.2);
    CHECK_FALSE(r.success);
    CHECK(r.error.find("[DONE]") != std::string::npos);
  }
  {
    StreamAccumulator acc(EndpointType::kCompletions, p, 0.0, false);
    acc.OnBytes(UsageChunk(2, 0) + "data: [DONE]\n\n", 0.1);
    const RequestRecord r = acc.Finish(0.2);
    CHECK_FALSE(r.success);
    CHECK(r.error == "no token in the stream");
  }
}

TEST_CASE("error bodies: OpenAI, FastAPI, plain") {
  CHECK(ErrorMessageFromBody(
            R"({"error":{"message":"bad top_p","type":"invalid_request_error"}})") == "bad top_p");
  CHECK(ErrorMessageFromBody(R"({"detail":"Not Found"})") == "Not Found");
  CHECK(ErrorMessageFromBody(R"({"error":"overloaded"})") == "overloaded");
  CHECK(ErrorMessageFromBody("Internal Server Error") == "Internal Server Error");
  CHECK(ErrorMessageFromBody("") == "(empty body)");
  CHECK(ErrorMessageFromBody(std::string(500, 'x')).size() == 203);
}
