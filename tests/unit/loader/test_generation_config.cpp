// generation_config.json → GenerationConfig: the fields vLLM reads, ints and lists of EOS ids,
// nulls, the rest ignored; a missing file, malformed JSON and bad values are clear errors.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "loader/generation_config.h"
#include "test_support.h"

using namespace oasis;
using Catch::Matchers::Contains;

namespace {

GenerationConfig ParseOk(const std::string& text) {
  auto g = ParseGenerationConfig(text, "generation_config.json");
  INFO(g.status().ToString());
  REQUIRE(g.ok());
  return *g;
}

void ExpectError(const std::string& text, const std::string& fragment) {
  auto g = ParseGenerationConfig(text, "/m/generation_config.json");
  REQUIRE_FALSE(g.ok());
  INFO(g.status().ToString());
  CHECK(g.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(g.status().message(), Contains("/m/generation_config.json"));
  CHECK_THAT(g.status().message(), Contains(fragment));
}

}  // namespace

TEST_CASE("generation config: Qwen3's file", "[loader][generation]") {
  // As published for Qwen/Qwen3-8B.
  const GenerationConfig g = ParseOk(R"({
    "bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
    "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
    "transformers_version": "4.51.0"})");
  CHECK(g.temperature == 0.6);
  CHECK(g.top_p == 0.95);
  CHECK(g.top_k == 20);
  CHECK_FALSE(g.min_p);
  CHECK_FALSE(g.repetition_penalty);
  CHECK_FALSE(g.max_new_tokens);
  CHECK(g.eos_token_ids == std::vector<int64_t>{151645, 151643});
  CHECK(g.has_sampling_defaults());
}

TEST_CASE("generation config: int EOS, every field, nulls and an empty file", "[loader][generation]") {
  GenerationConfig g = ParseOk(R"({"eos_token_id": 128009, "temperature": 0, "top_p": 1,
    "top_k": -1, "min_p": 0.05, "repetition_penalty": 1.1, "max_new_tokens": 512})");
  CHECK(g.eos_token_ids == std::vector<int64_t>{128009});
  CHECK(g.temperature == 0.0);
  CHECK(g.top_p == 1.0);
  CHECK(g.top_k == -1);
  CHECK(g.min_p == 0.05);
  CHECK(g.repetition_penalty == 1.1);
  CHECK(g.max_new_tokens == 512);
  g = ParseOk(R"({"temperature": null, "eos_token_id": null, "top_k": null})");
  CHECK_FALSE(g.temperature);
  CHECK_FALSE(g.top_k);
  CHECK(g.eos_token_ids.empty());
  CHECK_FALSE(g.has_sampling_defaults());
  g = ParseOk("{}");
  CHECK_FALSE(g.has_sampling_defaults());
  CHECK(g.eos_token_ids.empty());
  CHECK(ParseOk(R"({"max_new_tokens": 8})").has_sampling_defaults());
}

TEST_CASE("generation config: malformed JSON and bad values name the file and field", "[loader][generation]") {
  ExpectError("{\"temperature\": 0.6,", "not valid JSON");
  ExpectError("[1, 2]", "not a JSON object");
  ExpectError(R"({"temperature": -0.1})", "'temperature' must be in [0, inf)");
  ExpectError(R"({"temperature": "hot"})", "'temperature' must be a number");
  ExpectError(R"({"top_p": 0})", "'top_p' must be in (0, 1]");
  ExpectError(R"({"top_p": 1.5})", "'top_p'");
  ExpectError(R"({"top_k": 2.5})", "'top_k' must be an integer");
  ExpectError(R"({"top_k": -2})", "'top_k' must be >= -1");
  ExpectError(R"({"min_p": 2})", "'min_p'");
  ExpectError(R"({"repetition_penalty": 0})", "'repetition_penalty'");
  ExpectError(R"({"max_new_tokens": 0})", "'max_new_tokens' must be >= 1");
  ExpectError(R"({"eos_token_id": [1, "two"]})", "'eos_token_id' must be a token id");
  ExpectError(R"({"eos_token_id": -1})", "'eos_token_id'");
}

TEST_CASE("generation config: files on disk", "[loader][generation]") {
  const auto dir = testing::MakeTempDir("generation-config");
  SECTION("a missing file is no config") {
    auto g = LoadGenerationConfig(dir);
    REQUIRE(g.ok());
    CHECK_FALSE(g->has_value());
  }
  SECTION("a malformed file is an error naming it") {
    std::ofstream(dir / "generation_config.json") << "{ not json";
    auto g = LoadGenerationConfig(dir);
    REQUIRE_FALSE(g.ok());
    CHECK_THAT(g.status().message(), Contains((dir / "generation_config.json").string()));
  }
  SECTION("/dev/zero or a directory is an error, not an endless read") {
    std::filesystem::create_symlink("/dev/zero", dir / "generation_config.json");
    auto g = LoadGenerationConfig(dir);
    REQUIRE_FALSE(g.ok());
    CHECK_THAT(g.status().message(), Contains("is not a regular file"));
    std::filesystem::remove(dir / "generation_config.json");
    std::filesystem::create_directory(dir / "generation_config.json");
    auto d = LoadGenerationConfig(dir);
    REQUIRE_FALSE(d.ok());
    CHECK_THAT(d.status().message(), Contains("is a directory"));
  }
  SECTION("the committed files: the embedded default and a transformers fixture") {
    auto embedded = LoadGenerationConfig(testing::SourceDir() / "models" / "embedded");
    REQUIRE(embedded.ok());
    REQUIRE(embedded->has_value());
    CHECK((*embedded)->temperature == 0.7);
    CHECK((*embedded)->top_p == 0.8);
    CHECK((*embedded)->top_k == 20);
    CHECK((*embedded)->eos_token_ids == std::vector<int64_t>{8191, 8189});
    auto llama = LoadGenerationConfig(testing::FixturePath("models/llama-tiny-rope-scaling"));
    REQUIRE(llama.ok());
    REQUIRE(llama->has_value());
    CHECK_FALSE((*llama)->has_sampling_defaults());
    CHECK((*llama)->eos_token_ids == std::vector<int64_t>{2, 3});
  }
}
