// The text -> ids vectors of ../shared/data/tokenizer_vectors/ (llama.cpp's test-tokenizer-0
// format): cases in <name>.inp separated by "\n__ggml_vocab_test__\n" (the file ends with the
// separator), one line of space-separated ids per case in <name>.out. The ids are encoded without
// special tokens (no BOS for Llama-3).
#include <catch2/catch.hpp>

#include <sstream>

#include "real_tokenizers.h"
#include "test_support.h"

namespace oasis::tokenizer {
namespace {

struct VectorCase {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<VectorCase> ReadVectors(const std::filesystem::path& inp, const std::filesystem::path& out) {
  const std::string in_text = oasis::testing::ReadFileOrFail(inp);
  const std::string out_text = oasis::testing::ReadFileOrFail(out);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  while (pos < in_text.size()) {
    size_t next = in_text.find(sep, pos);
    if (next == std::string::npos) next = in_text.size();
    texts.push_back(in_text.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<std::string> lines;
  std::istringstream lines_in(out_text);
  for (std::string line; std::getline(lines_in, line);) lines.push_back(line);
  REQUIRE(texts.size() == lines.size());
  std::vector<VectorCase> cases;
  for (size_t i = 0; i < texts.size(); ++i) {
    VectorCase c{texts[i], {}};
    std::istringstream ids(lines[i]);
    for (int64_t id; ids >> id;) c.ids.push_back(static_cast<int32_t>(id));
    cases.push_back(std::move(c));
  }
  return cases;
}

void CheckVectors(const std::string& tokenizer_name, const std::string& vector_name) {
  auto shared = oasis::testing::SharedDir();
  if (!shared) {
    WARN("skipped: ../shared is absent");
    return;
  }
  const auto dir = *shared / "data" / "tokenizer_vectors";
  if (!std::filesystem::exists(dir / (vector_name + ".inp"))) {
    WARN("skipped: " << (dir / (vector_name + ".inp")).string() << " is absent");
    return;
  }
  const Tokenizer* tok = testing::RealTokenizer(tokenizer_name);
  if (tok == nullptr) return;
  const auto cases = ReadVectors(dir / (vector_name + ".inp"), dir / (vector_name + ".out"));
  REQUIRE(cases.size() >= 40);
  int passed = 0;
  for (const VectorCase& c : cases) {
    const auto ids = tok->Encode(c.text, AddSpecialTokens::kNo);
    INFO("text: \"" << c.text << "\"");
    CHECK(testing::FormatIds(ids) == testing::FormatIds(c.ids));
    CHECK(tok->Decode(ids, SkipSpecialTokens::kNo) == c.text);
    passed += ids == c.ids;
  }
  WARN(vector_name << ": " << passed << " / " << cases.size() << " cases identical");
}

TEST_CASE("ggml vectors: Qwen2/3 BPE", "[tokenizer][vectors]") {
  CheckVectors("qwen3", "ggml-vocab-qwen2.gguf");
}

TEST_CASE("ggml vectors: Llama-3 BPE", "[tokenizer][vectors]") {
  CheckVectors("llama3_1", "ggml-vocab-llama-bpe.gguf");
}

}  // namespace
}  // namespace oasis::tokenizer
