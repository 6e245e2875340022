// IncrementalDetokenizer: the concatenated stream equals Decode, and no Push ever returns part
// of a character.
#include <catch2/catch.hpp>

#include <random>

#include "inline_tokenizers.h"
#include "real_tokenizers.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/utf8.h"

namespace oasis::tokenizer {
namespace {

// Streams `ids` one by one (or in chunks) and checks the stream against Decode.
void CheckStream(const Tokenizer& t, const std::vector<int32_t>& ids, SkipSpecialTokens skip,
                 std::mt19937& rng) {
  IncrementalDetokenizer detok(t, skip);
  std::string streamed;
  std::uniform_int_distribution<size_t> chunk(1, 4);
  for (size_t i = 0; i < ids.size();) {
    const size_t n = (i % 3 == 0) ? 1 : std::min(chunk(rng), ids.size() - i);
    const std::string piece = n == 1 ? detok.Push(ids[i])
                                     : detok.Push(std::span<const int32_t>(ids.data() + i, n));
    REQUIRE(IsValidUtf8(piece));
    REQUIRE(detok.pending_bytes() <= 3);
    streamed += piece;
    i += n;
  }
  streamed += detok.Finish();
  REQUIRE(streamed == t.Decode(ids, skip));
}

TEST_CASE("detokenizer stream equals Decode on random ids", "[tokenizer][detokenizer]") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const char* name : {"qwen3", "llama3_1"}) {
    const Tokenizer* t = testing::RealTokenizer(name);
    if (t == nullptr) return;
    // Mostly ids of single bytes and short tokens (they split characters most often), plus any
    // id, specials and unknown ids.
    std::vector<int32_t> byte_ids;
    for (const auto& ch : ByteLevelAlphabet()) byte_ids.push_back(*t->TokenToId(ch));
    std::uniform_int_distribution<int32_t> any(-2, static_cast<int32_t>(t->vocab_size()) + 50);
    std::uniform_int_distribution<size_t> byte_pick(0, byte_ids.size() - 1);
    std::uniform_int_distribution<int> length(0, 64), kind(0, 2);
    for (int s = 0; s < 2000; ++s) {
      std::vector<int32_t> ids(length(rng));
      for (auto& id : ids) id = kind(rng) == 0 ? any(rng) : byte_ids[byte_pick(rng)];
      CheckStream(*t, ids, s % 2 ? SkipSpecialTokens::kYes : SkipSpecialTokens::kNo, rng);
    }
  }
}

TEST_CASE("a character split over byte tokens comes out whole", "[tokenizer][detokenizer]") {
  const Tokenizer* t = testing::RealTokenizer("qwen3");
  if (t == nullptr) return;
  auto byte_id = [&](unsigned char b) { return *t->TokenToId(ByteLevelAlphabet()[b]); };
  IncrementalDetokenizer detok(*t, SkipSpecialTokens::kNo);
  CHECK(detok.Push(byte_id(0xF0)).empty());
  CHECK(detok.Push(byte_id(0x9F)).empty());
  CHECK(detok.Push(byte_id(0x98)).empty());
  CHECK(detok.Push(byte_id(0x80)) == "\xF0\x9F\x98\x80");  // 😀
  CHECK(detok.Push(byte_id(0xE4)).empty());
  CHECK(detok.Push(byte_id('a')) == std::string(kReplacementChar) + "a");  // broken sequence
  CHECK(detok.Push(byte_id(0xE4)).empty());
  CHECK(detok.Finish() == std::string(kReplacementChar));
  // Real text: every streamed piece of an encoded emoji/CJK string is whole characters.
  const std::string text = "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB \xE4\xB8\xAD\xE6\x96\x87 ok";
  std::mt19937 rng(1);
  CheckStream(*t, t->Encode(text, AddSpecialTokens::kNo), SkipSpecialTokens::kNo, rng);
}

TEST_CASE("detokenizer with a space-joining decoder", "[tokenizer][detokenizer]") {
  testing::Json json = {
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}},
  };
  auto t = Tokenizer::FromJson(json.dump(), "inline");
  REQUIRE(t.ok());
  std::mt19937 rng(3);
  CheckStream(**t, {2, 0, 5, 1, 1}, SkipSpecialTokens::kNo, rng);
  CHECK((*t)->Decode(std::vector<int32_t>{2, 0, 1}, SkipSpecialTokens::kNo) == "ab a b");
}

// vLLM's spaces_between_special_tokens (FastIncrementalDetokenizer): with kNo an added token
// right after another added token comes without the joining space; nothing else changes, and
// skipping special tokens turns it off.
TEST_CASE("spaces between special tokens", "[tokenizer][detokenizer]") {
  testing::Json json = {
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}},
      {"added_tokens",
       {testing::AddedTokenJson(3, "<s>", true), testing::AddedTokenJson(4, "<t>", false)}},
  };
  auto t = Tokenizer::FromJson(json.dump(), "inline");
  REQUIRE(t.ok());
  REQUIRE((*t)->joins_with_space());
  CHECK((*t)->IsAdded(3));
  CHECK((*t)->IsAdded(4));
  CHECK_FALSE((*t)->IsAdded(2));
  const std::vector<int32_t> ids = {0, 3, 4, 3, 1, 4, 2};
  auto stream = [&](SkipSpecialTokens skip, SpacesBetweenSpecialTokens spaces) {
    IncrementalDetokenizer detok(**t, skip, spaces);
    std::string text;
    for (int32_t id : ids) text += detok.Push(id);
    return text + detok.Finish();
  };
  CHECK(stream(SkipSpecialTokens::kNo, SpacesBetweenSpecialTokens::kYes) ==
        "a <s> <t> <s> b <t> ab");
  CHECK(stream(SkipSpecialTokens::kNo, SpacesBetweenSpecialTokens::kYes) ==
        (*t)->Decode(ids, SkipSpecialTokens::kNo));
  CHECK(stream(SkipSpecialTokens::kNo, SpacesBetweenSpecialTokens::kNo) == "a <s><t><s> b <t> ab");
  CHECK(stream(SkipSpecialTokens::kYes, SpacesBetweenSpecialTokens::kNo) == "a <t> b <t> ab");
  // A byte-level decoder never joins with spaces: both settings decode alike.
  const Tokenizer* qwen = testing::RealTokenizer("qwen3");
  if (qwen == nullptr) return;
  const std::vector<int32_t> q = qwen->Encode("<|im_start|><|im_end|>hi<|im_end|>", AddSpecialTokens::kNo);
  for (auto spaces : {SpacesBetweenSpecialTokens::kYes, SpacesBetweenSpecialTokens::kNo}) {
    IncrementalDetokenizer detok(*qwen, SkipSpecialTokens::kNo, spaces);
    CHECK(detok.Push(q) + detok.Finish() == "<|im_start|><|im_end|>hi<|im_end|>");
  }
}

}  // namespace
}  // namespace oasis::tokenizer
