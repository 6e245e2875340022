// --generation-config: which file is read in each mode, what becomes a request default, the
// max_tokens rules (vLLM's: default for chat requests without one, a cap in DIR mode), and
// request fields overriding the defaults in the protocol parser.
#include <catch2/catch.hpp>

#include <fstream>

#include "server/generation_defaults.h"
#include "server/openai_protocol.h"
#include "test_support.h"

using namespace oasis;
using namespace oasis::server;
using Catch::Matchers::Contains;

namespace {

std::filesystem::path ModelDirWith(const std::string& tag, const std::string& generation_config) {
  const auto dir = testing::MakeTempDir(tag);
  std::ofstream(dir / "generation_config.json") << generation_config;
  return dir;
}

const char* kQwen3Style =
    R"({"eos_token_id": [7, 9], "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.01,
        "max_new_tokens": 100, "repetition_penalty": 1.05, "do_sample": true})";

}  // namespace

TEST_CASE("generation defaults: auto takes the model's sampling defaults and EOS ids", "[generation]") {
  const auto dir = ModelDirWith("gen-auto", kQwen3Style);
  auto d = ResolveGenerationDefaults("auto", dir.string());
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  CHECK(d->source == (dir / "generation_config.json").string());
  CHECK(d->sampling.temperature == 0.6f);
  CHECK(d->sampling.top_p == 0.95f);
  CHECK(d->sampling.top_k == 20);
  CHECK(d->sampling.min_p == 0.01f);
  CHECK_FALSE(d->sampling.seed);
  CHECK(d->max_tokens == 100);
  CHECK_FALSE(d->max_tokens_is_cap);
  CHECK(d->sampling.repetition_penalty == 1.05f);
  CHECK(d->eos_token_ids == std::vector<int64_t>{7, 9});
  CHECK(d->applied == std::vector<std::string>{"temperature=0.6", "top_p=0.95", "top_k=20",
                                               "min_p=0.01", "max_tokens=100",
                                               "repetition_penalty=1.05"});
  const auto json = d->ToJson();
  CHECK(json["mode"] == "auto");
  CHECK(json["applied"].size() == 6);
  // max_tokens: the default for requests without one, at most the room left; theirs wins.
  CHECK(d->ResolveMaxTokens(std::nullopt, 10, 4096) == 100);
  CHECK(d->ResolveMaxTokens(std::nullopt, 4000, 4096) == 96);
  CHECK(d->ResolveMaxTokens(std::nullopt, 4096, 4096) == -1);
  CHECK(d->ResolveMaxTokens(500, 10, 4096) == 500);
}

TEST_CASE("generation defaults: vllm keeps neutral sampling but the file's EOS ids", "[generation]") {
  const auto dir = ModelDirWith("gen-vllm", kQwen3Style);
  auto d = ResolveGenerationDefaults("vllm", dir.string());
  REQUIRE(d.ok());
  const SamplingParams neutral;
  CHECK(d->sampling.temperature == neutral.temperature);
  CHECK(d->sampling.top_p == neutral.top_p);
  CHECK(d->sampling.top_k == neutral.top_k);
  CHECK(d->sampling.min_p == neutral.min_p);
  CHECK_FALSE(d->max_tokens);
  CHECK(d->sampling.repetition_penalty == neutral.repetition_penalty);
  CHECK(d->applied.empty());
  CHECK(d->eos_token_ids == std::vector<int64_t>{7, 9});
  CHECK(d->ResolveMaxTokens(std::nullopt, 10, 4096) == -1);
}

TEST_CASE("generation defaults: a directory's file, whose max_new_tokens also caps", "[generation]") {
  const auto model = ModelDirWith("gen-model", R"({"temperature": 0.1})");
  const auto other = ModelDirWith("gen-dir", R"({"top_k": 5, "max_new_tokens": 64, "eos_token_id": 3})");
  auto d = ResolveGenerationDefaults(other.string(), model.string());
  REQUIRE(d.ok());
  CHECK(d->mode == other.string());
  CHECK(d->sampling.temperature == 1.0f);  // the model's file is not read
  CHECK(d->sampling.top_k == 5);
  CHECK(d->eos_token_ids == std::vector<int64_t>{3});
  CHECK(d->max_tokens_is_cap);
  CHECK(d->ResolveMaxTokens(std::nullopt, 10, 4096) == 64);
  CHECK(d->ResolveMaxTokens(500, 10, 4096) == 64);
  CHECK(d->ResolveMaxTokens(16, 10, 4096) == 16);
  CHECK(d->applied == std::vector<std::string>{"top_k=5", "max_tokens<=64"});
}

TEST_CASE("generation defaults: missing and malformed files", "[generation]") {
  const auto empty = testing::MakeTempDir("gen-none");
  auto none = ResolveGenerationDefaults("auto", empty.string());
  REQUIRE(none.ok());  // auto without a file: the neutral defaults
  CHECK(none->source.empty());
  CHECK(none->applied.empty());
  CHECK(none->eos_token_ids.empty());
  auto dir = ResolveGenerationDefaults(empty.string(), "/nonexistent");
  REQUIRE_FALSE(dir.ok());  // an explicit directory must hold the file
  CHECK_THAT(dir.status().message(), Contains("--generation-config " + empty.string()));
  CHECK_THAT(dir.status().message(), Contains("no generation_config.json"));
  const auto bad = ModelDirWith("gen-bad", R"({"top_p": 7})");
  auto malformed = ResolveGenerationDefaults("auto", bad.string());
  REQUIRE_FALSE(malformed.ok());
  CHECK_THAT(malformed.status().message(), Contains("generation_config.json: field 'top_p'"));
  const auto broken = ModelDirWith("gen-broken", "{");
  CHECK_THAT(ResolveGenerationDefaults("vllm", broken.string()).status().message(),
             Contains("not valid JSON"));
}

TEST_CASE("generation defaults: EOS ids merge after config.json's, without duplicates", "[generation]") {
  CHECK(MergeTokenIds({2}, {2, 3}) == std::vector<int64_t>{2, 3});
  CHECK(MergeTokenIds({8191, 8189}, {8191, 8189}) == std::vector<int64_t>{8191, 8189});
  CHECK(MergeTokenIds({}, {5}) == std::vector<int64_t>{5});
}

TEST_CASE("request sampling fields override the generation defaults", "[generation][protocol]") {
  ProtocolLimits limits;
  limits.max_model_len = 4096;
  limits.default_sampling.temperature = 0.6f;
  limits.default_sampling.top_p = 0.95f;
  limits.default_sampling.top_k = 20;
  limits.default_sampling.min_p = 0.01f;
  ApiError err;
  auto s = ParseChatRequest(Json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})"),
                            limits, &err);
  REQUIRE(s);
  CHECK(s->sampling.temperature == 0.6f);
  CHECK(s->sampling.top_p == 0.95f);
  CHECK(s->sampling.top_k == 20);
  CHECK(s->sampling.min_p == 0.01f);
  CHECK_FALSE(s->max_tokens);
  s = ParseCompletionRequest(
      Json::parse(R"({"prompt": "x", "temperature": 0, "top_k": -1, "top_p": 1, "min_p": 0})"),
      limits, &err);
  REQUIRE(s);
  CHECK(s->sampling.temperature == 0.0f);
  CHECK(s->sampling.top_k == -1);
  CHECK(s->sampling.top_p == 1.0f);
  CHECK(s->sampling.min_p == 0.0f);
  s = ParseCompletionRequest(Json::parse(R"({"prompt": "x", "temperature": null, "top_k": 3})"),
                             limits, &err);
  REQUIRE(s);  // null = absent: the default
  CHECK(s->sampling.temperature == 0.6f);
  CHECK(s->sampling.top_k == 3);
  CHECK(s->sampling.top_p == 0.95f);
}
