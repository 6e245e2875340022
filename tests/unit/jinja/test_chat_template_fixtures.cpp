// Byte-identical rendering of real chat templates against Python Jinja2 reference renderings
// (tests/fixtures/chat_templates/*.jsonl, made by tools/gen_chat_template_cases.py).
// The templates themselves are read from ../shared or the test-data cache: when absent the test
// warns and skips; when present every fixture case must match.
#include <catch2/catch.hpp>

#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "test_support.h"
#include "tokenizer/jinja/chat_template.h"

using oasis::ChatTemplate;
using oasis::ChatTemplateFiles;
namespace fs = std::filesystem;

namespace {

std::optional<std::string> TemplateFromShared(const std::string& file) {
  auto shared = oasis::testing::SharedDir();
  if (!shared) return std::nullopt;
  fs::path p = *shared / "data" / "chat_templates" / file;
  if (!fs::exists(p)) return std::nullopt;
  return oasis::testing::ReadFileOrFail(p);
}

std::optional<std::string> TemplateFromCache(const std::string& dir) {
  fs::path p = oasis::testing::CacheDir() / dir / "tokenizer_config.json";
  if (!fs::exists(p)) return std::nullopt;
  auto files = ChatTemplate::LoadFromTokenizerConfig(p);
  REQUIRE(files.ok());
  return files->chat_template;
}

struct Counts {
  int rendered = 0;
  int errors = 0;
};

Counts RunFixture(const std::string& fixture, const std::string& source) {
  auto tmpl = ChatTemplate::Parse(source);
  INFO(tmpl.status().ToString());
  REQUIRE(tmpl.ok());
  std::ifstream in(oasis::testing::FixturePath("chat_templates/" + fixture));
  REQUIRE(in.good());
  Counts counts;
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    auto record = nlohmann::ordered_json::parse(line);
    if (header) {
      header = false;
      REQUIRE(record.contains("template"));
      continue;
    }
    const std::string name = record["name"].get<std::string>();
    INFO("case " << name);
    auto out = tmpl->Render(record["context"]);
    if (record.contains("output")) {
      INFO(out.status().ToString());
      REQUIRE(out.ok());
      CHECK(*out == record["output"].get<std::string>());
      ++counts.rendered;
    } else {
      REQUIRE_FALSE(out.ok());
      INFO("our error: " << out.status().message());
      if (record["error_type"] == "TemplateError") {  // raise_exception: same message text
        const std::string expected = ": " + record["error"].get<std::string>();
        const std::string& got = out.status().message();
        CHECK(got.size() >= expected.size());
        CHECK(got.compare(got.size() - std::min(got.size(), expected.size()), expected.size(), expected) == 0);
      }
      ++counts.errors;
    }
  }
  return counts;
}

}  // namespace

TEST_CASE("Qwen3 chat template matches Python Jinja2", "[jinja][fixtures]") {
  auto source = TemplateFromShared("Qwen-Qwen3-0.6B.jinja");
  if (!source) source = TemplateFromCache("qwen3");
  if (!source) {
    WARN("Qwen3 chat template not found (../shared or tools/fetch_test_data.sh); skipping");
    return;
  }
  Counts c = RunFixture("qwen3.jsonl", *source);
  CHECK(c.rendered >= 30);
  CHECK(c.errors >= 1);
}

TEST_CASE("Qwen3 template from the npm tokenizer_config.json matches too", "[jinja][fixtures]") {
  auto source = TemplateFromCache("qwen3");
  if (!source) {
    WARN("qwen3 tokenizer_config.json not in the cache (tools/fetch_test_data.sh); skipping");
    return;
  }
  Counts c = RunFixture("qwen3.jsonl", *source);
  CHECK(c.rendered >= 30);
}

TEST_CASE("Llama-3.1 chat template matches Python Jinja2", "[jinja][fixtures]") {
  auto source = TemplateFromShared("meta-llama-Llama-3.1-8B-Instruct.jinja");
  if (!source) {
    WARN("Llama-3.1 chat template not found in ../shared; skipping");
    return;
  }
  Counts c = RunFixture("llama3_1.jsonl", *source);
  CHECK(c.rendered >= 30);
  CHECK(c.errors >= 2);
}

TEST_CASE("Llama-3 (npm tokenizer_config.json) chat template matches Python Jinja2", "[jinja][fixtures]") {
  auto source = TemplateFromCache("llama3_1");
  if (!source) {
    WARN("llama3_1 tokenizer_config.json not in the cache (tools/fetch_test_data.sh); skipping");
    return;
  }
  Counts c = RunFixture("llama3.jsonl", *source);
  CHECK(c.rendered >= 30);
}

TEST_CASE("LoadFromTokenizerConfig reads string and list templates and token objects", "[jinja]") {
  nlohmann::ordered_json config = {
      {"chat_template", nlohmann::ordered_json::array(
                            {{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}})},
      {"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
      {"eos_token", "</s>"}};
  auto files = ChatTemplate::FromTokenizerConfig(config);
  REQUIRE(files.ok());
  CHECK(files->chat_template == "D");
  CHECK(files->bos_token == std::optional<std::string>("<s>"));
  CHECK(files->eos_token == std::optional<std::string>("</s>"));

  config = {{"chat_template", "X"}, {"bos_token", nullptr}};
  files = ChatTemplate::FromTokenizerConfig(config);
  REQUIRE(files.ok());
  CHECK(files->chat_template == "X");
  CHECK_FALSE(files->bos_token.has_value());

  CHECK(ChatTemplate::FromTokenizerConfig({{"eos_token", "x"}}).status().code() == oasis::StatusCode::kNotFound);
  CHECK_FALSE(ChatTemplate::FromTokenizerConfig({{"chat_template", 3}}).ok());
  CHECK_FALSE(ChatTemplate::FromTokenizerConfig({{"chat_template", "x"}, {"bos_token", 1}}).ok());

  fs::path dir = oasis::testing::MakeTempDir("jinja-config");
  {
    std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<e>"})";
    std::ofstream(dir / "chat_template.jinja") << "{{ eos_token }}";
  }
  files = ChatTemplate::LoadFromTokenizerConfig(dir / "tokenizer_config.json");
  REQUIRE(files.ok());
  CHECK(files->chat_template == "{{ eos_token }}");
  CHECK(ChatTemplate::LoadFromTokenizerConfig(dir / "missing.json").status().code() ==
        oasis::StatusCode::kNotFound);
  fs::remove_all(dir);
}
