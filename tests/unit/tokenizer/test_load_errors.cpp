// Malformed and unsupported tokenizer.json documents give Status errors that name the problem.
#include <catch2/catch.hpp>

#include "inline_tokenizers.h"
#include "tokenizer/tokenizer.h"

namespace oasis::tokenizer {
namespace {

using testing::ByteLevelTokenizerJson;
using testing::Json;

Status LoadTextError(const std::string& text) {
  auto t = Tokenizer::FromJson(text, "test.json");
  REQUIRE_FALSE(t.ok());
  INFO(t.status().ToString());
  CHECK(t.status().message().find("test.json") != std::string::npos);
  return t.status();
}

Status LoadError(const Json& json) { return LoadTextError(json.dump()); }

void CheckError(const Status& s, StatusCode code, const std::string& needle) {
  INFO(s.ToString());
  CHECK(s.code() == code);
  CHECK(s.message().find(needle) != std::string::npos);
}

TEST_CASE("malformed documents are InvalidArgument", "[tokenizer][errors]") {
  CheckError(LoadTextError("{\"model\": "), StatusCode::kInvalidArgument, "not valid JSON");
  CheckError(LoadTextError("[1, 2]"), StatusCode::kInvalidArgument, "JSON object");
  CheckError(LoadTextError("{}"), StatusCode::kInvalidArgument, "model");

  Json j = ByteLevelTokenizerJson({{"a", "b"}});
  j["model"]["merges"][0] = "ab";
  CheckError(LoadError(j), StatusCode::kInvalidArgument, "model.merges[0]");
  j = ByteLevelTokenizerJson({});
  j["model"]["merges"] = Json::array({"x yz"});
  CheckError(LoadError(j), StatusCode::kInvalidArgument, "not in the vocabulary");
  j = ByteLevelTokenizerJson({});
  j["model"]["vocab"]["a"] = "one";
  CheckError(LoadError(j), StatusCode::kInvalidArgument, "integer id");
  j = ByteLevelTokenizerJson({});
  j["model"]["vocab"]["a"] = -5;
  CheckError(LoadError(j), StatusCode::kInvalidArgument, "out of range");
  j = ByteLevelTokenizerJson({});
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(unclosed"}};
  CheckError(LoadError(j), StatusCode::kInvalidArgument, "cannot compile regex");
  j = ByteLevelTokenizerJson({});
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  CheckError(LoadError(j), StatusCode::kInvalidArgument, "Sideways");
  j = ByteLevelTokenizerJson({});
  j["added_tokens"] = Json::array({{{"id", 3}}});
  CheckError(LoadError(j), StatusCode::kInvalidArgument, "added_tokens[0].content");
  j = ByteLevelTokenizerJson({});
  j["model"]["unk_token"] = "<nope>";
  CheckError(LoadError(j), StatusCode::kInvalidArgument, "<nope>");
  j = ByteLevelTokenizerJson({});
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", Json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                         {"special_tokens", Json::object()}};
  CheckError(LoadError(j), StatusCode::kInvalidArgument, "<s>");
}

TEST_CASE("unsupported components are Unimplemented and named", "[tokenizer][errors]") {
  struct Case {
    const char* key;
    Json value;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"normalizer", {{"type", "Lowercase"}}, "normalizer type \"Lowercase\""},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "Prepend"}, {"prepend", "_"}}}}},
       "normalizer type \"Prepend\""},
      {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "_"}}, "pre_tokenizer type \"Metaspace\""},
      {"pre_tokenizer", {{"type", "Whitespace"}}, "pre_tokenizer type \"Whitespace\""},
      {"post_processor", {{"type", "RobertaProcessing"}}, "post_processor type \"RobertaProcessing\""},
      {"decoder", {{"type", "WordPiece"}}, "decoder type \"WordPiece\""},
      {"decoder",
       {{"type", "Sequence"}, {"decoders", {{{"type", "Replace"}}, {{"type", "ByteFallback"}}}}},
       "decoder Sequence"},
  };
  for (const Case& c : cases) {
    Json j = ByteLevelTokenizerJson({});
    j[c.key] = c.value;
    CheckError(LoadError(j), StatusCode::kUnimplemented, c.needle);
  }
  Json j = ByteLevelTokenizerJson({});
  j["model"]["type"] = "WordPiece";
  CheckError(LoadError(j), StatusCode::kUnimplemented, "model type \"WordPiece\"");
  j = ByteLevelTokenizerJson({});
  j["model"]["type"] = "Unigram";
  CheckError(LoadError(j), StatusCode::kUnimplemented, "Unigram");
  j = ByteLevelTokenizerJson({});
  j["model"]["dropout"] = 0.1;
  CheckError(LoadError(j), StatusCode::kUnimplemented, "dropout");
  j = ByteLevelTokenizerJson({});
  j["model"]["continuing_subword_prefix"] = "##";
  CheckError(LoadError(j), StatusCode::kUnimplemented, "continuing_subword_prefix");
  j = ByteLevelTokenizerJson({});
  j["pre_tokenizer"]["pretokenizers"] = Json::array({j["pre_tokenizer"]["pretokenizers"][1],
                                                     j["pre_tokenizer"]["pretokenizers"][0]});
  CheckError(LoadError(j), StatusCode::kUnimplemented, "ByteLevel must come last");
}

TEST_CASE("a missing file is NotFound", "[tokenizer][errors]") {
  auto t = Tokenizer::FromFile("/nonexistent/dir/tokenizer.json");
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == StatusCode::kNotFound);
  CHECK(t.status().message().find("/nonexistent/dir/tokenizer.json") != std::string::npos);
}

}  // namespace
}  // namespace oasis::tokenizer
