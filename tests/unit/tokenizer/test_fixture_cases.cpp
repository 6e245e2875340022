// The committed HF `tokenizers` cases: tests/fixtures/tokenizer/<name>.jsonl, made by
// tools/gen_tokenizer_cases.py on the GPU machine, and tests/fixtures/trained's for the trained
// embedded default. One JSON object per line:
//   {"text": ..., "ids": [...], "add_special_tokens": false, "decoded": ...}
// "add_special_tokens" defaults to false; "decoded" (HF's decode without skipping special tokens)
// is present only where it differs from "text". Every case must match 100%.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <fstream>

#include "real_tokenizers.h"
#include "test_support.h"

namespace oasis::tokenizer {
namespace {

void CheckCases(const std::filesystem::path& path, const Tokenizer* tok, const std::string& name, size_t min_cases) {
  std::ifstream in(path);
  size_t cases = 0, id_mismatches = 0, decode_mismatches = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto c = nlohmann::json::parse(line);
    const std::string text = c.at("text").get<std::string>();
    const auto expected = c.at("ids").get<std::vector<int32_t>>();
    const bool add = c.value("add_special_tokens", false);
    const auto ids = tok->Encode(text, add ? AddSpecialTokens::kYes : AddSpecialTokens::kNo);
    ++cases;
    if (ids != expected && ++id_mismatches <= 10) {
      CHECK(testing::FormatIds(ids) == testing::FormatIds(expected));
      WARN("case " << cases << " text " << nlohmann::json(text).dump());
    }
    const std::string decoded = c.value("decoded", text);
    if (tok->Decode(expected, SkipSpecialTokens::kNo) != decoded && ++decode_mismatches <= 10) {
      CHECK(tok->Decode(expected, SkipSpecialTokens::kNo) == decoded);
    }
  }
  WARN(name << ".jsonl: " << cases - id_mismatches << " / " << cases << " cases identical");
  CHECK(cases >= min_cases);
  CHECK(id_mismatches == 0);
  CHECK(decode_mismatches == 0);
}

void CheckFixture(const std::string& name) {
  const auto path = oasis::testing::FixturePath("tokenizer/" + name + ".jsonl");
  if (!std::filesystem::exists(path)) {
    WARN("skipped: " << path.string() << " is absent (generate it with tools/gen_tokenizer_cases.py)");
    return;
  }
  const Tokenizer* tok = testing::RealTokenizer(name);
  if (tok == nullptr) return;
  CheckCases(path, tok, name, 2000);
}

TEST_CASE("HF tokenizers cases: Qwen3", "[tokenizer][fixtures]") { CheckFixture("qwen3"); }
TEST_CASE("HF tokenizers cases: Llama-3.1", "[tokenizer][fixtures]") { CheckFixture("llama3_1"); }

// The trained embedded default's own BPE (models/embedded/tokenizer.json), in
// tests/fixtures/trained: tools/gen_tokenizer_cases.py's 2,400 synthetic texts (trained.jsonl),
// and the held-out corpus documents and odd strings tools/train/train_tokenizer.py checked when
// it trained it (tokenizer_cases.jsonl).
TEST_CASE("HF tokenizers cases: the trained embedded default", "[tokenizer][fixtures]") {
  auto tok = Tokenizer::FromFile(oasis::testing::SourceDir() / "models" / "embedded" / "tokenizer.json");
  REQUIRE(tok.ok());
  CHECK((*tok)->vocab_size() == 8192);
  CheckCases(oasis::testing::FixturePath("trained/trained.jsonl"), tok->get(), "trained", 2000);
  CheckCases(oasis::testing::FixturePath("trained/tokenizer_cases.jsonl"), tok->get(), "tokenizer_cases", 10);
}

}  // namespace
}  // namespace oasis::tokenizer
