// Behaviour of each supported component on small inline tokenizer.json documents.
#include <catch2/catch.hpp>

#include <algorithm>

#include "inline_tokenizers.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace oasis::tokenizer {
namespace {

using testing::AddedTokenJson;
using testing::ByteLevelTokenizerJson;
using testing::Json;
using testing::SplitStage;

std::unique_ptr<Tokenizer> Load(const Json& json) {
  auto t = Tokenizer::FromJson(json.dump(), "inline");
  if (!t.ok()) FAIL(t.status().ToString());
  return std::move(t).value();
}

// The id of a raw-byte string in a byte-level tokenizer.
int32_t Id(const Tokenizer& t, const std::string& raw) {
  auto id = t.TokenToId(BytesToByteLevel(raw));
  if (!id) FAIL("no token for \"" << raw << "\"");
  return *id;
}

std::vector<int32_t> Encode(const Tokenizer& t, std::string_view text) {
  return t.Encode(text, AddSpecialTokens::kNo);
}

const testing::RawMerges kHelloMerges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"},
                                         {" ", "w"}, {"o", "r"}, {" w", "or"}, {"a", "-"},
                                         {"-", "b"}, {"-", "-"}};

TEST_CASE("byte-level BPE merges by rank inside pre-tokenized words", "[tokenizer][inline]") {
  auto t = Load(ByteLevelTokenizerJson(kHelloMerges));
  CHECK(Encode(*t, "hello") == std::vector<int32_t>{Id(*t, "hello")});
  CHECK(Encode(*t, "hello world") ==
        std::vector<int32_t>{Id(*t, "hello"), Id(*t, " wor"), Id(*t, "l"), Id(*t, "d")});
  CHECK(Encode(*t, "").empty());
  CHECK(t->Decode(Encode(*t, "hello world"), SkipSpecialTokens::kNo) == "hello world");
  CHECK(t->vocab_size() == 256 + 10);
}

TEST_CASE("ignore_merges takes whole words straight from the vocabulary", "[tokenizer][inline]") {
  Json json = ByteLevelTokenizerJson({{"a", "b"}});
  json["model"]["vocab"]["abc"] = 300;
  CHECK(Load(json)->Encode("abc", AddSpecialTokens::kNo) == std::vector<int32_t>{256, 'c'});
  json["model"]["ignore_merges"] = true;
  CHECK(Load(json)->Encode("abc", AddSpecialTokens::kNo) == std::vector<int32_t>{300});
}

TEST_CASE("added tokens honour their flags", "[tokenizer][inline]") {
  Json json = ByteLevelTokenizerJson({});
  json["added_tokens"] = Json::array({
      AddedTokenJson(300, "<sep>", true),
      AddedTokenJson(301, "<ls>", true, /*lstrip=*/true),
      AddedTokenJson(302, "<rs>", true, false, /*rstrip=*/true),
      AddedTokenJson(303, "<sw>", false, false, false, /*single_word=*/true),
      AddedTokenJson(304, "<x>", false),
      AddedTokenJson(305, "<x>y", false),
  });
  auto t = Load(json);
  const int32_t a = 'a', b = 'b', sp = Id(*t, " ");
  CHECK(Encode(*t, "a<sep>b") == std::vector<int32_t>{a, 300, b});
  CHECK(Encode(*t, "<sep><sep>") == std::vector<int32_t>{300, 300});
  SECTION("lstrip swallows whitespace on the left") {
    CHECK(Encode(*t, "a  <ls>b") == std::vector<int32_t>{a, 301, b});
  }
  SECTION("rstrip swallows whitespace on the right") {
    CHECK(Encode(*t, "a<rs>  b") == std::vector<int32_t>{a, 302, b});
  }
  SECTION("single_word matches only between non-word characters") {
    CHECK(Encode(*t, "a <sw> b") == std::vector<int32_t>{a, sp, 303, sp, b});
    const auto inside = Encode(*t, "a<sw>b");
    CHECK(std::find(inside.begin(), inside.end(), 303) == inside.end());
  }
  SECTION("the longest token wins at the leftmost position") {
    CHECK(Encode(*t, "<x>yz") == std::vector<int32_t>{305, 'z'});
    CHECK(Encode(*t, "<x>z") == std::vector<int32_t>{304, 'z'});
  }
  SECTION("special tokens are skipped on request, others are not") {
    const std::vector<int32_t> ids{a, 300, 304, b};
    CHECK(t->Decode(ids, SkipSpecialTokens::kNo) == "a<sep><x>b");
    CHECK(t->Decode(ids, SkipSpecialTokens::kYes) == "a<x>b");
    CHECK(t->IsSpecial(300));
    CHECK_FALSE(t->IsSpecial(304));
    CHECK(t->TokenToId("<sep>") == 300);
    CHECK(t->IdToToken(305) == "<x>y");
  }
}

TEST_CASE("added-token flags on HF's own examples", "[tokenizer][inline]") {
  Json json = ByteLevelTokenizerJson({});
  json["added_tokens"] = Json::array({AddedTokenJson(300, "<mask>", false, true, true, true)});
  auto t = Load(json);
  auto enc = [&](std::string_view s) { return Encode(*t, s); };
  // tokenizers' test_lstrip_unicode_space: a space taken by one match's rstrip is not taken
  // again by the next match's lstrip.
  std::vector<int32_t> expected = enc("Hi");
  expected.push_back(300);
  for (int32_t id : enc("there")) expected.push_back(id);
  expected.push_back(300);
  expected.push_back(300);
  CHECK(enc("Hi <mask> there\t<mask>\t<mask>\xE2\x80\x80") == expected);

  json["added_tokens"] = Json::array({AddedTokenJson(300, "<mask>", false, false, false, true)});
  t = Load(json);
  // tokenizers' test_single_word_is_correct / _is_unicode_correct.
  const auto ids = enc("<mask> My name <mask> A<mask> <mask>ony <mask>");
  CHECK(std::count(ids.begin(), ids.end(), 300) == 3);
  const auto unicode = enc("<mask>, <mask>- \xE2\x97\x8C\xCC\xB0<mask>");  // "- ◌̰<mask>": a mark is \w
  CHECK(std::count(unicode.begin(), unicode.end(), 300) == 2);
  CHECK(enc("_<mask>") == std::vector<int32_t>{'_', '<', 'm', 'a', 's', 'k', '>'});
}

TEST_CASE("normalized added tokens match the normalized text", "[tokenizer][inline]") {
  Json json = ByteLevelTokenizerJson({});
  json["normalizer"] = {{"type", "NFC"}};
  json["added_tokens"] = Json::array({AddedTokenJson(300, "\xC3\xA9", false, false, false, false,
                                                     /*normalized=*/true)});
  auto t = Load(json);
  // e + COMBINING ACUTE is NFC-normalized to é, which then matches the added token.
  CHECK(Encode(*t, "e\xCC\x81!") == std::vector<int32_t>{300, '!'});
}

TEST_CASE("TemplateProcessing adds its special tokens only on request", "[tokenizer][inline]") {
  Json json = ByteLevelTokenizerJson({});
  json["added_tokens"] = Json::array({AddedTokenJson(300, "<s>", true), AddedTokenJson(301, "</s>", true)});
  json["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       Json::array({{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
                    {{"type", "TemplateProcessing"},
                     {"single", Json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                             {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}})},
                     {"pair", Json::array()},
                     {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {300}}, {"tokens", {"<s>"}}}},
                                         {"</s>", {{"id", "</s>"}, {"ids", {301}}, {"tokens", {"</s>"}}}}}}}})}};
  auto t = Load(json);
  CHECK(t->Encode("a", AddSpecialTokens::kYes) == std::vector<int32_t>{300, 'a', 301});
  CHECK(t->Encode("a", AddSpecialTokens::kNo) == std::vector<int32_t>{'a'});
  CHECK(t->Encode("", AddSpecialTokens::kYes) == std::vector<int32_t>{300, 301});
}

TEST_CASE("Split behaviours and invert", "[tokenizer][inline]") {
  Json json = ByteLevelTokenizerJson(kHelloMerges);
  auto with_split = [&](const std::string& behavior, bool invert) {
    Json j = json;
    j["pre_tokenizer"]["pretokenizers"][0] = SplitStage({{"String", "-"}}, behavior, invert);
    return Load(j);
  };
  const int32_t a = 'a', b = 'b', dash = '-';
  auto isolated = with_split("Isolated", false);
  CHECK(Encode(*isolated, "a-b") == std::vector<int32_t>{a, dash, b});
  auto removed = with_split("Removed", false);
  CHECK(Encode(*removed, "a-b") == std::vector<int32_t>{a, b});
  auto previous = with_split("MergedWithPrevious", false);
  CHECK(Encode(*previous, "a-b") == std::vector<int32_t>{Id(*previous, "a-"), b});
  auto next = with_split("MergedWithNext", false);
  CHECK(Encode(*next, "a-b") == std::vector<int32_t>{a, Id(*next, "-b")});
  auto contiguous = with_split("Contiguous", false);
  CHECK(Encode(*contiguous, "a--b") == std::vector<int32_t>{a, Id(*contiguous, "--"), b});
  auto inverted = with_split("Removed", true);
  CHECK(Encode(*inverted, "a-b") == std::vector<int32_t>{dash});
}

TEST_CASE("ByteLevel pre-tokenizer with add_prefix_space and GPT-2's regex", "[tokenizer][inline]") {
  Json json = ByteLevelTokenizerJson(kHelloMerges);
  json["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                           {"use_regex", true}};
  auto t = Load(json);
  const auto ids = Encode(*t, "hello");
  CHECK(ids.front() == Id(*t, " "));
  CHECK(t->Decode(ids, SkipSpecialTokens::kNo) == " hello");
}

TEST_CASE("character-mode BPE with byte fallback and unk", "[tokenizer][inline]") {
  Json json = {
      {"normalizer", nullptr},
      {"pre_tokenizer", nullptr},
      {"decoder", nullptr},
      {"model",
       {{"type", "BPE"}, {"unk_token", "<unk>"}, {"fuse_unk", true}, {"byte_fallback", true},
        {"vocab", {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}, {"<0x41>", 4}, {"\xC3\xA9", 5}}},
        {"merges", Json::array({Json::array({"a", "b"})})}}},
  };
  auto t = Load(json);
  CHECK(Encode(*t, "abA\xC3\xA9") == std::vector<int32_t>{3, 4, 5});
  CHECK(Encode(*t, "azz") == std::vector<int32_t>{1, 0});  // z has no byte token: fused unk
  json["model"]["fuse_unk"] = false;
  CHECK(Load(json)->Encode("azz", AddSpecialTokens::kNo) == std::vector<int32_t>{1, 0, 0});
  // No decoder: tokens are joined with spaces (HF's behaviour).
  CHECK(t->Decode(std::vector<int32_t>{3, 4, 99}, SkipSpecialTokens::kNo) == "ab <0x41>");
}

}  // namespace
}  // namespace oasis::tokenizer
